//! Checkpoint directories in tests: a checkpoint of one keyed RocksDB state, published
//! as a job with one keyed operator would publish it (for the snapshot-directory and
//! object-store tests and benchmarks, which exercise the checkpoint files without
//! running a job), and the complete checkpoints a directory holds.

use crate::state::backend::KeyedStateBackend;
use crate::state::keygroup::KeyGroupRange;
use crate::state::metadata::{CheckpointMetadata, SubtaskSnapshot};
use crate::state::snapshot_dir::SnapshotDir;
use crate::state::{CheckpointId, FileEntry, StateError};
use std::path::{Path, PathBuf};

/// The complete checkpoints of `checkpoint_dir` (`chk-N` with a `_metadata`), oldest
/// first, as the snapshot directory lists them.
pub fn complete_checkpoints(checkpoint_dir: &Path) -> Vec<PathBuf> {
    use crate::state::restore::EntryStatus;
    crate::state::snapshot_dir::list(checkpoint_dir)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.status == EntryStatus::Complete)
        .map(|e| checkpoint_dir.join(e.name))
        .collect()
}

/// Checkpoints `db` (key groups `groups`) into `dir` as checkpoint `id` of the job
/// `job`: one subtask of the operator `sum`, whose state is `sum-0`. Returns the
/// published checkpoint's directory.
pub fn publish_keyed(
    dir: &SnapshotDir,
    db: &mut KeyedStateBackend,
    groups: KeyGroupRange,
    job: &str,
    id: CheckpointId,
) -> Result<PathBuf, StateError> {
    let pending = dir.begin(id)?;
    let files = db.checkpoint(&pending.join("sum-0"))?;
    dir.publish(&keyed_metadata(id, job, groups, files))
}

/// The metadata of checkpoint `id` of the job `job` whose one subtask of the operator
/// `sum` holds key groups `groups` in `files` of its state directory `sum-0`.
pub fn keyed_metadata(
    id: CheckpointId,
    job: &str,
    groups: KeyGroupRange,
    files: Vec<FileEntry>,
) -> CheckpointMetadata {
    CheckpointMetadata {
        id,
        job_name: job.into(),
        fingerprint: 7,
        created_ms: 1,
        parallelism: 1,
        max_parallelism: 128,
        is_final: false,
        subtasks: vec![SubtaskSnapshot {
            operator: "sum".into(),
            subtask: 0,
            key_groups: Some(groups),
            state_dir: Some("sum-0".into()),
            files,
            inline_state: Vec::new(),
        }],
        positions: Vec::new(),
    }
}
