//! Kits a sink is built from, so that it gets lockgate's guarantees without copying
//! another sink's machinery.
//!
//! - [`two_phase`]: stage at the barrier, commit when the checkpoint completes, commit
//!   again on restore, abort what an abandoned checkpoint staged (exactly-once output
//!   into a system with transactions or atomic renames: files, a database).
//! - [`bulk`]: what a batching sink reuses (batching by actions and bytes, the in-flight
//!   limit, per-document order, retries with backoff, flush at the barrier, the byte
//!   bound, metrics) behind a small target trait: encode a request, send it, classify
//!   each item.

pub mod bulk;
pub mod two_phase;

pub use two_phase::{TwoPhaseSink, TwoPhaseWriter};
