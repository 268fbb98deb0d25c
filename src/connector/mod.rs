//! The connector contract: what a source, a sink or an operator implements, and what
//! the runtime guarantees it in return.
//!
//! Everything a connector needs is here; a connector written against this module
//! alone gets checkpoints, restore, rescale and members from the runtime.

pub mod kit;
mod lifecycle;
mod operator;

pub use lifecycle::{Sink, SinkRestore, Source, SourcePoll, SubtaskInfo};
pub use operator::{FnOperator, Operator, OperatorContext};
