//! Sources and sinks, and the lifecycle they share with the runtime.
//!
//! The lifecycle follows Flink's: a source is opened with its restored positions,
//! polled, snapshotted at each barrier and notified when a checkpoint completes or is
//! aborted; a sink is opened with its restored state, invoked per batch, snapshotted at
//! each barrier (where it may wait for its pending work), and notified likewise.

pub mod elasticsearch;
pub mod file_sink;
pub mod iceberg;
pub mod kafka;
pub mod postgres;
pub mod postgres_cdc;
pub mod sequence;

pub use crate::connector::{Sink, SinkRestore, Source, SourcePoll, SubtaskInfo};
