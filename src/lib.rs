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
//!     .source_spec(SequenceSource::spec(seq))          // its splits and how they are assigned
//!     .key_by(|r| json_key(r, "/key"))
//!     .keyed("rolling_sum", "sum", |_| RollingSum { field: "/value".into(), output: "/total".into() })
//!     .sink_spec(FileSink::spec(FileSinkConfig::json("out")))
//!     .build()?;
//! lockgate::runtime::run(&job, Default::default()).await?;
//! # Ok(()) }
//! ```
//!
//! # Where things are
//!
//! | you look for | it is in |
//! |---|---|
//! | what a connector implements and what the runtime guarantees it | [`connector`] (the contract) |
//! | where a new connector goes | a folder under [`connectors`], one line in [`builtin`] |
//! | where a split is assigned (subtasks, members) | the source's spec names a [`connector::SplitAssigner`]; [`connector::splits`] applies it |
//! | what a job file means, its keys and defaults | [`config`] (dispatch through the registry), each connector's `config.rs` |
//! | `${NAME}` in job files | [`interpolate`] |
//! | secrets (`*_file`, redaction) | [`secret`] |
//! | how the sink reaches Elasticsearch (nodes, TLS, auth) | [`connectors::elasticsearch::connection`], on [`clients::http`] and [`clients::sigv4`] (shared with the schema registry) |
//! | which Kafka client takes which `properties` | [`clients::kafka`] |
//! | where a barrier is emitted | [`runtime`] `task.rs` (a source snapshots its positions, then emits) |
//! | where barriers are aligned | [`runtime`] `align.rs` (a pure state machine) |
//! | when a checkpoint is triggered, completes, expires | [`checkpoint::coordinator`] (pure) |
//! | where a snapshot is published | [`runtime`] `publish.rs` (the executor drives the coordinator; `wiring.rs` spawns an attempt's tasks), through `lockgate_state::snapshot_dir` |
//! | whether and when a failed job restarts | [`runtime::restart`] (pure) |
//! | what a start restores, abandons, refuses | [`checkpoint::start`] (pure), `lockgate_state::restore` (which checkpoint verifies) |
//! | where a Kafka partition starts | [`connectors::kafka::start_position`] (pure) |
//! | what one bulk item result means | [`connectors::elasticsearch::item_result`] (pure) |
//! | batching, order per document, coalescing, retries | [`kits::bulk::batcher`] (pure) |
//! | the sink's flush at a checkpoint | [`connectors::elasticsearch::sink`] |
//! | dead letters, and the one policy of `on_decode_error`, `on_error`, `on_item_error`, `on_invalid`, `late` | [`dead_letter`] |
//! | members: who a member is, its checkpoint line | [`member`]; its start and rescale rules: [`checkpoint::line_plan`] (pure) |
//! | keyed state per source partition (`co_partitioned`) | [`kits::keyed`] |
//! | a source that acknowledges instead of seeking: when to acknowledge, which redelivery to drop | [`kits::acking`] (`Ledger` is pure) |
//! | a record's JSON fields as a table's columns | [`columns`] |
//! | failpoints | [`fault`] |
//! | metrics, status, readiness, the HTTP listener and status page | [`telemetry`] (`status::readiness` is pure) |
//! | stop, pause, resume, checkpoint now (the control API) | [`control`] (the requests), `telemetry::control_api` (HTTP), [`checkpoint::coordinator`] (when a requested checkpoint triggers) |
//! | which offsets an altered checkpoint gets | [`checkpoint::alter`] (pure); `lockgate_state::rewrite` writes it |
//! | the command line, the chaos harness, the test servers | `cli`, `chaos`, `testkit` (feature `harness`, on by default) |

pub mod builtin;
#[cfg(feature = "harness")]
pub mod chaos;
pub mod checkpoint;
#[cfg(feature = "harness")]
pub mod cli;
pub mod clients;
pub mod columns;
pub mod config;
pub mod connector;
pub mod connectors;
pub mod control;
pub mod dead_letter;
pub mod error;
pub mod event_time;
pub mod fault;
pub mod formats;
pub mod interpolate;
pub mod job;
pub mod kits;
pub mod member;
pub mod migrate;
pub mod operators;
pub mod record;
pub mod runtime;
pub mod secret;
pub mod telemetry;
#[cfg(feature = "harness")]
pub mod testkit;
pub mod transforms;

pub use lockgate_state as state;
