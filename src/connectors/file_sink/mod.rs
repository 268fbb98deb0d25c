//! The exactly-once file sink (two-phase, like Flink's file sink).
//!
//! Each subtask appends records to an in-progress file. At barrier `N` the file is
//! fsynced and renamed to `.part-<subtask>-<N>` (pending), and the checkpoint records
//! every pending file. At `notify_checkpoint_complete(N)` pending files are renamed to
//! `part-<subtask>-<N>` (committed). On restore from checkpoint `K`:
//! - pending files named by `K` are committed (the notify may have been lost in a crash);
//! - committed files of checkpoints after `K` are moved into `.rolled-back/` because
//!   their records are about to be written again (nothing is deleted);
//! - uncommitted leftovers (in-progress files, pending files `K` does not name) are
//!   removed: they were never output.
//!
//! A restore into a directory that never held the sink's output (no [`MARKER`], no
//! part file: a new machine, when the checkpoints are in an object store) is refused,
//! naming what is missing: the committed output of the restored checkpoint is on the
//! disk that wrote it, and going on would end with it absent.
//!
//! A subtask cleans and commits the files of old subtask indices `j` with
//! `j % parallelism == index`, so restores at another parallelism leave nothing behind.
//!
//! The restored state holds only numbers (`(subtask, checkpoint id)`): every path a
//! restore touches is formed here, inside the configured directory, so a crafted
//! checkpoint cannot name a file elsewhere.

pub mod avro_arrow;
pub mod columns;
mod json_text;
pub mod lines;
pub mod names;
pub mod parquet;
pub mod part;
#[cfg(test)]
mod reference;
pub mod refusal;
pub mod section;
pub mod store;
pub mod values;
pub mod writer;

/// The sink kind of the file sink in a job graph.
pub const KIND: &str = "file";

pub use lines::delete_line;
pub use names::{
    foreign_directory, parse_part_name, restore_action, rolled_back_part, Part, PartName,
    RestoreAction, MARKER, ROLLED_BACK,
};
pub use section::{FileSection, FileSinkConfig};
pub use store::StoreWriter;
pub use writer::{FileSink, FileWriter};
