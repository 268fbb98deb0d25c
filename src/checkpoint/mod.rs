//! Checkpoint coordination: when to trigger, when a checkpoint is complete, when it is
//! aborted, and when too many failures fail the job.
//!
//! [`coordinator::Coordinator`] is a pure state machine over a millisecond clock; the
//! runtime's driver performs the I/O its actions ask for.

pub mod alter;
pub mod coordinator;
pub mod line_plan;
pub mod lines;
pub mod start;

pub use coordinator::{AbortCause, Action, Coordinator, CoordinatorConfig};

use std::fmt;

/// Identity of a task: its vertex (0 = the source vertex) and subtask index. Defined
/// here, below the runtime, because the coordinator counts acknowledgements by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId {
    pub vertex: u16,
    pub subtask: u16,
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "vertex{}-{}", self.vertex, self.subtask)
    }
}
