//! PostgreSQL change data capture by logical replication (`[source.postgres_cdc]`):
//! a database's changes as Debezium-shaped events, exactly once, without Kafka and
//! Debezium in between.
//!
//! - [`config`]: the section and its keys;
//! - [`catalog`]: what the source checks and reads before it starts (settings,
//!   privileges, tables, publication, slot);
//! - [`snapshot`] and [`copy_text`]: the initial snapshot, read in pieces and chunks;
//! - [`progress`]: the snapshot's progress, and the decision it makes for each change
//!   of the stream (with [`visibility`]); [`ghosts`]: the deletes that take out rows an
//!   interrupted snapshot left in a sink that writes at once;
//! - [`replication`], [`pgoutput`] and [`stream`]: the change stream, its messages
//!   and the events of each transaction;
//! - [`events`] and [`values`]: events and column values as Debezium writes them;
//! - [`position`] and [`lsn`]: where the stream resumes, and what the slot is told;
//! - [`source`]: the source itself; [`metrics`]: its replication lag.

pub mod catalog;
pub mod config;
pub mod copy_text;
pub mod events;
pub mod ghosts;
pub mod lsn;
pub mod metrics;
pub mod pgoutput;
pub mod position;
pub mod progress;
pub mod replication;
pub mod snapshot;
pub mod source;
pub mod stream;
pub mod values;
pub mod visibility;

/// The source's kind in a job graph and its section's name.
pub const KIND: &str = "postgres_cdc";

pub use config::{CdcConfig, CdcSection};
pub use source::CdcSource;
