//! The Iceberg sink (`[sink.iceberg]`): records as rows of an Iceberg table, exactly
//! once, one snapshot per completed checkpoint.
//!
//! - Each subtask writes Parquet data files into the table's `data/` folder, one open
//!   file per partition, closed at each barrier and at `roll_bytes`
//!   ([`writer`]); its state at the barrier names them. Files no snapshot names are
//!   no part of the table, whatever a crash leaves.
//! - The job's one committer ([`committer`]) adds every subtask's files of a
//!   completed checkpoint to the table in one snapshot whose summary holds the job's
//!   name and the checkpoint's id; a restore commits the restored checkpoint's files
//!   unless the table shows them committed, after taking back the job's snapshots of
//!   later checkpoints ([`rollback`]).
//! - The table is found in a SQL catalog (the tables Java's `JdbcCatalog` and
//!   pyiceberg's `SqlCatalog` keep, in SQLite or PostgreSQL) or a REST catalog
//!   ([`catalog`]), and created from the sink's Avro schema and `partition_by` when
//!   missing ([`schema`]). Its files are reached through lockgate's own file access
//!   ([`storage`]): a local warehouse, S3, GCS or Azure.
//!
//! What iceberg-rust gives: the table format, the catalogs, Parquet writing with
//! column statistics, partition values, fast appends. What is written around it: the
//! file access, the Avro schema as a table schema, the committer's protocol.

pub mod catalog;
pub mod committer;
pub mod rollback;
pub mod schema;
pub mod section;
pub mod storage;
pub mod writer;

pub use committer::{IcebergCommitter, CHECKPOINT_PROPERTY, JOB_PROPERTY};
pub use section::{IcebergConfig, IcebergSection};
pub use writer::{IcebergWriter, StagedFiles};

use crate::kits::two_phase::TwoPhaseSink;
use std::sync::Arc;

/// The sink kind of the Iceberg sink in a job graph.
pub const KIND: &str = "iceberg";

/// A subtask holds its open data files in memory until they are closed: past this
/// many bytes together, the largest are closed early.
pub const MEMORY_BYTES: u64 = 256 * 1024 * 1024;

/// The sink as the runtime takes it: exactly-once, its subtasks on the two-phase kit
/// and one committer for the job.
pub fn spec(cfg: Arc<IcebergConfig>) -> crate::connector::SinkSpec {
    let writers = cfg.clone();
    crate::connector::SinkSpec::new(KIND, move |_| {
        Box::new(
            TwoPhaseSink::new(IcebergWriter::new(writers.clone()))
                .on_item_error(writers.on_item_error.clone(), writers.dead_letters.clone())
                .with_buffer_bound(MEMORY_BYTES as usize),
        )
    })
    .with_caps(crate::connector::SinkCaps {
        guarantee: crate::connector::Guarantee::ExactlyOnce,
        needs_source_order: None,
        one_process_only: Some((
            "sink.iceberg".into(),
            "the Iceberg sink's committer is one per job; {members} members would each commit their own snapshots".into(),
        )),
        commits_are_final: false,
    })
    .with_committer(Arc::new(move |info: &crate::connector::CommitterInfo| {
        Box::new(IcebergCommitter::new(cfg.clone(), info.job.clone()))
    }))
}
