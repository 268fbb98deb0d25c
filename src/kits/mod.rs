//! Kits a connector or an operator is built from, so that it gets lockgate's
//! guarantees without copying another one's machinery. A kit stands on the connector
//! contract and names no connector.
//!
//! - [`two_phase`]: stage at the barrier, commit when the checkpoint completes, commit
//!   again on restore, abort what an abandoned checkpoint staged (exactly-once output
//!   into a system with transactions or atomic renames: files, a database).
//! - [`bulk`]: what a batching sink reuses (batching by actions and bytes, the in-flight
//!   limit, per-document order, retries with backoff, flush at the barrier, the byte
//!   bound, metrics) behind a small target trait: encode a request, send it, classify
//!   each item.
//! - [`fetcher`]: a source's reading thread and bounded hand-over, so that no source
//!   blocks in `poll`, with the positions of what the job has taken.
//! - [`acking`]: a source that acknowledges instead of seeking (a queue, a
//!   subscription): acknowledged after the checkpoint completes, redeliveries of what
//!   the job holds dropped by message id, kept in the source's checkpointed state.
//! - [`parts`]: which of the parts a sink holds open (one per folder) to close
//!   early, under a bound on their memory or on their number.
//! - [`keyed`]: keyed state in RocksDB and the keyed operator that runs a
//!   [`keyed::KeyedFunction`] over it, snapshotted at each aligned barrier and split by
//!   key group on a rescale.

pub mod acking;
pub mod bulk;
pub mod fetcher;
pub mod keyed;
pub mod parts;
pub mod two_phase;

pub use two_phase::{Commit, TwoPhaseSink, TwoPhaseWriter};
