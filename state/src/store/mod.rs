//! Checkpoints in an object store (`checkpoint.dir = "s3://bucket/prefix"`).
//!
//! The local snapshot directory stays the working layer: a checkpoint is built and
//! published there exactly as without a store, then mirrored to the store
//! ([`CheckpointStore::publish`]); it counts as complete only once its `_metadata` is
//! in the store. A start lists the store, chooses with the same rules as a local
//! directory ([`crate::restore`]) and downloads the chosen checkpoint into the local
//! directory. [`location`] says where, [`layout`] how it is laid out and what to upload
//! or delete (pure functions), [`remote`] does the I/O.

pub mod layout;
pub mod location;
pub mod remote;

pub use location::{CheckpointLocation, StoreLocation};
pub use remote::{CheckpointStore, RetentionOutcome, StoreStartup, UploadStats};
