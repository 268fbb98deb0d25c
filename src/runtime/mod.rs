//! The runtime: tasks joined by bounded channels (the backpressure), barrier
//! alignment, and the executor that drives checkpoints and restarts.

pub mod align;
pub mod chain;
pub mod executor;
pub mod message;
pub mod restart;
pub mod task;

pub use executor::{run, RunOptions, RunSummary};
