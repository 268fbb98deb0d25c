//! The Elasticsearch sink: a bulk processor that flushes at every checkpoint, with
//! deterministic ids (and optionally external versions) so that a replay after a crash
//! rewrites the same documents.
//!
//! Built on the bulk kit (`crate::kits::bulk`: batching, order per document,
//! retries, requests in flight, flush at the barrier, metrics). What is Elasticsearch's
//! has one file per role: what the user configures ([`config`]), how the cluster is
//! reached ([`connection`]), records to bulk actions ([`action`]) and to the lines of a
//! request ([`encode`]) with their routing, pipeline and data stream parameters
//! ([`params`]), what an action does to its document ([`coalesce`]), what an
//! item result means ([`item_result`]), the bulk API as the kit's target ([`bulk`]),
//! the kit's batcher over Elasticsearch actions and its tests ([`batcher`]), the sink lifecycle ([`sink`]) with the index template it puts at open ([`index_setup`]).
//!
//! This file is the folder's face: the rest of lockgate reaches the sink through what
//! it re-exports, never through the submodules (they stay public for programs built on
//! the library).

pub mod action;
pub mod batcher;
pub mod bulk;
pub mod coalesce;
pub mod config;
pub mod connection;
pub mod encode;
pub mod index_name;
pub mod index_setup;
pub mod item_result;
pub mod params;
pub mod sink;
pub mod version_guard;

/// The sink (`[sink.elasticsearch]`): its kind and section of the job file, its
/// configuration and the sink itself.
pub use config::{EsSection, EsSinkConfig, IdStrategy, NullValue, Operation, Versioning, KIND};
pub use sink::EsSink;

/// How the sink reaches the cluster: its nodes, credentials and TLS.
pub use crate::clients::http::{Auth, TlsVerify};
pub use connection::EsConnection;

/// What a program of its own builds a sink from: records as bulk actions, their lines,
/// and what happens to an action the cluster refuses.
pub use action::{ActionBuilder, BulkAction, ConfigActionBuilder, OpType};
pub use bulk::{FailureDecision, FailureHandler, ItemFailure, PolicyFailureHandler, Shared};
pub use encode::Encoder;

/// The `index` setting as the sink reads it, and the `@timestamp` it gives a data
/// stream document: what job-file migration and the chaos harness check against.
pub use index_name::IndexTemplate;
pub use params::{with_timestamp, TimestampSource};
