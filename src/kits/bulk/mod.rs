//! The bulk kit: what every batching sink reuses (Vector's `sinks/util`).
//!
//! - [`outcome`]: what a target's answers mean (an item's, a whole request's).
//! - [`batcher`]: every batching decision, without I/O: batching by actions and bytes,
//!   the in-flight limit, per-document order, coalescing, retries, splits.
//! - [`target`]: what a sink supplies: a [`BulkEncoder`] (records to actions, an action
//!   to what its dead letter carries) and a [`BulkTransport`] (send a request, classify
//!   each item).
//! - [`policy`]: what becomes of a refused action ([`FailurePolicy`]: the job's
//!   [`OnError`] and an optional hook).
//! - [`processor`]: the task that drives the batcher for a sink: requests in flight,
//!   flush at the barrier, the byte bound, the failure policy, dead letters.
//! - [`metrics`]: the sink metrics by outcome; [`nodes`]: which node a request goes
//!   to.
//!
//! A sink built on it: a [`BulkEncoder`] whose batches it hands to a
//! [`BulkProcessor`] in `invoke` ([`BulkProcessor::add_with`]), a [`BulkTransport`],
//! and a flush in `snapshot` (the Elasticsearch sink, `connectors::elasticsearch`).

pub mod batcher;
pub mod metrics;
pub mod nodes;
pub mod outcome;
pub mod policy;
pub mod processor;
pub mod target;

pub use crate::clients::backoff::backoff;
pub use crate::dead_letter::{DeadLetterWriter, OnError, Reason};
pub use batcher::{bookkeeping_bytes, Batcher, DocKey, Limits, Supersedes};
pub use metrics::{ItemLabel, RequestLabel, SinkMetrics};
pub use outcome::{ItemFailure, Outcome, RequestOutcome};
pub use policy::{FailureHook, FailurePolicy};
pub use processor::{BulkParts, BulkProcessor, Shared, INVALID_DOCUMENT};
pub use target::{
    Added, BulkEncoder, BulkTransport, Decision, Encoded, EncodedBatch, LetterParts, Sent,
};
