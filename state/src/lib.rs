//! `lockgate-state`: the RocksDB state backend and the on-disk snapshot format of lockgate.
//!
//! This crate knows nothing of Kafka or Elasticsearch. It guarantees:
//! - every file it persists is fsynced before anything refers to it ([`durable`]);
//! - a checkpoint is complete exactly when its `_metadata` exists, and `_metadata` is
//!   versioned and checksummed ([`metadata`]);
//! - restore picks the newest checkpoint that verifies, naming every one it skips
//!   ([`restore`], a pure decision over a listing);
//! - every name read back from a checkpoint is one plain path component, and no
//!   symbolic link inside a checkpoint is followed ([`names`]);
//! - nothing is deleted before a newer checkpoint is published ([`snapshot_dir`], and
//!   in an object store, [`store`]);
//! - each stateful subtask owns one RocksDB instance whose checkpoint is a set of hard
//!   links, and an SST file's CRC is computed once ([`backend`]).

pub mod backend;
pub mod durable;
pub mod error;
pub mod ids;
pub mod keygroup;
pub mod lock;
pub mod metadata;
pub mod names;
pub mod restore;
pub mod rewrite;
pub mod snapshot_dir;
pub mod store;
pub mod verify;

pub use backend::{BackendOptions, KeyedStateBackend, StateRestore};
pub use error::StateError;
pub use ids::{CheckpointId, NextOffset};
pub use keygroup::{KeyGroup, KeyGroupRange};
pub use metadata::{
    CheckpointMetadata, FileEntry, OpaquePosition, SourcePosition, SubtaskSnapshot, UpstreamMark,
};
pub use restore::{restore_plan, CheckpointEntry, EntryStatus, RestorePlan};
pub use snapshot_dir::SnapshotDir;
