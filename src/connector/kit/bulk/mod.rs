//! The bulk kit: what every batching sink reuses (Vector's `sinks/util`).
//!
//! - [`outcome`]: what a target's answers mean (an item's, a whole request's).
//! - [`retry`]: exponential backoff with jitter.
//! - [`batcher`]: every batching decision, without I/O: batching by actions and bytes,
//!   the in-flight limit, per-document order, coalescing, retries, splits.

pub mod batcher;
pub mod outcome;
pub mod retry;

pub use batcher::{Batcher, DocKey, Limits, Supersedes};
pub use outcome::{ItemFailure, Outcome, RequestOutcome};
pub use retry::backoff;
