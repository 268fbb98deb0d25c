//! The exactly-once file sink (two-phase, like Flink's file sink).
//!
//! Each subtask appends records to an in-progress file per folder (`partition_by`),
//! closed at each barrier and once it holds `roll_bytes`. At barrier `N` every open
//! file is fsynced (with its folder's entry) and the checkpoint names each file of the
//! subtask since the last barrier, in order. At `notify_checkpoint_complete(N)` the
//! `n`-th is renamed to `part-<subtask>-<N>` (`n` = 0) or `part-<subtask>-<N>-<n>` in its
//! folder (committed). On restore from checkpoint `K`:
//! - files named by `K` are committed (the notify may have been lost in a crash);
//! - committed files of checkpoints after `K` are moved into `.rolled-back/` because
//!   their records are about to be written again (nothing is deleted);
//! - uncommitted leftovers (in-progress files `K` does not name, pending files of
//!   earlier versions) are removed: they were never output.
//!
//! A restore into a directory that never held the sink's output (no [`MARKER`], no
//! part file: a new machine, when the checkpoints are in an object store) is refused,
//! naming what is missing: the committed output of the restored checkpoint is on the
//! disk that wrote it, and going on would end with it absent.
//!
//! A subtask cleans and commits the files of old subtask indices `j` with
//! `j % parallelism == index`, so restores at another parallelism leave nothing behind.
//!
//! The restored state holds numbers, folder names and in-progress names, each checked
//! to be one the sink makes ([`names::decode_staged`]): every path a restore touches
//! is formed here, inside the configured directory, so a crafted checkpoint cannot
//! name a file elsewhere.

pub mod folders;
pub mod lines;
pub mod names;
pub mod part;
pub mod partition;
pub mod placed;
pub mod section;
pub mod store;
pub mod store_part;
pub mod writer;

// The Parquet conversion moved to the formats floor; its paths stay here too.
pub use crate::formats::columnar::{avro_arrow, columns, parquet, refusal, values};

/// The sink kind of the file sink in a job graph.
pub const KIND: &str = "file";

pub use lines::delete_line;
pub use names::{
    committed_name, decode_staged, foreign_directory, parse_part_name, restore_action,
    rolled_back_part, Part, PartName, RestoreAction, Staged, StagedFile, MARKER, ROLLED_BACK,
};
pub use section::{FileFormat, FileSection, FileSinkConfig};
pub use store::StoreWriter;
pub use writer::{FileSink, FileWriter};
