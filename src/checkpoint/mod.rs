//! Checkpoint coordination: when to trigger, when a checkpoint is complete, when it is
//! aborted, and when too many failures fail the job.
//!
//! [`coordinator::Coordinator`] is a pure state machine over a millisecond clock; the
//! runtime's driver performs the I/O its actions ask for.

pub mod coordinator;
pub mod start;

pub use coordinator::{Action, Coordinator, CoordinatorConfig};
