//! The bulk kit: what every batching sink reuses (Vector's `sinks/util`). So far the
//! meanings of a target's answers ([`outcome`]) and the retry backoff ([`retry`]);
//! the batcher and the request loop of the Elasticsearch sink move here next.

pub mod outcome;
pub mod retry;

pub use outcome::{ItemFailure, Outcome, RequestOutcome};
pub use retry::backoff;
