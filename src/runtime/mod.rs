//! The runtime: tasks joined by bounded channels (the backpressure), barrier
//! alignment, and the executor that drives checkpoints and restarts.

pub mod align;
pub mod chain;
pub mod executor;
pub mod message;
mod publish;
pub mod restart;
mod start;
pub mod task;
mod wiring;

pub use executor::run;
pub use start::{RunOptions, RunSummary};
