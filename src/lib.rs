//! lockgate: connector jobs that neither lose nor duplicate data.
//!
//! A job is a source, operators and a sink, held consistent by barrier-driven
//! checkpoints stored in RocksDB ([`lockgate_state`]). A crashed job started again with
//! the same command resumes from its newest checkpoint that verifies.
//!
//! ```no_run
//! use lockgate::connectors::file_sink::{FileSink, FileSinkConfig};
//! use lockgate::connectors::sequence::{SequenceConfig, SequenceSource};
//! use lockgate::job::{CheckpointSettings, Job};
//! use lockgate::operators::rolling_sum::{json_key, RollingSum};
//!
//! # async fn example() -> lockgate::error::Result<()> {
//! let seq = SequenceConfig { from: 1, to: 1000, keys: 10, rate_per_sec: 0, splits: 128 };
//! let job = Job::builder("example")
//!     .parallelism(2)
//!     .checkpointing(CheckpointSettings::new("state/example"))
//!     .source("sequence", move |_| Box::new(SequenceSource::new(seq.clone())))
//!     .key_by(|r| json_key(r, "/key"))
//!     .keyed("rolling_sum", "sum", |_| RollingSum { field: "/value".into(), output: "/total".into() })
//!     .sink("file", |_| Box::new(FileSink::new(FileSinkConfig { dir: "out".into() })))
//!     .build()?;
//! lockgate::runtime::run(&job, Default::default()).await?;
//! # Ok(()) }
//! ```

pub mod chaos;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod connectors;
pub mod error;
pub mod fault;
pub mod interpolate;
pub mod job;
pub mod operators;
pub mod record;
pub mod runtime;
pub mod testkit;

pub use lockgate_state as state;
