//! The bulk kit: what every batching sink reuses (Vector's `sinks/util`).
//!
//! - [`outcome`]: what a target's answers mean (an item's, a whole request's).
//! - [`batcher`]: every batching decision, without I/O: batching by actions and bytes,
//!   the in-flight limit, per-document order, coalescing, retries, splits.
//! - [`target`]: what a sink supplies (a [`BulkTarget`]: encode, send, classify).
//! - [`processor`]: the task that drives the batcher for a target: requests in
//!   flight, flush at the barrier, the byte bound, the failure policy, dead letters.
//! - [`metrics`]: the sink metrics by outcome; [`nodes`]: which node a request goes
//!   to.
//!
//! A sink built on it: an encoder that turns records into [`Added`] actions, a
//! [`BulkTarget`], and a [`processor::BulkProcessor`] it adds to in `invoke` and
//! flushes in `snapshot` (the Elasticsearch sink, `connectors::elasticsearch`).

pub mod batcher;
pub mod metrics;
pub mod nodes;
pub mod outcome;
pub mod processor;
pub mod target;

pub use crate::clients::backoff::backoff;
pub use batcher::{bookkeeping_bytes, Batcher, DocKey, Limits, Supersedes};
pub use metrics::{ItemLabel, RequestLabel, SinkMetrics};
pub use outcome::{ItemFailure, Outcome, RequestOutcome};
pub use processor::{BulkProcessor, Shared, INVALID_DOCUMENT};
pub use target::{Added, BulkTarget, Decision, Encoded, EncodedBatch, Sent};
