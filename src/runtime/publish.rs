//! Publishing a checkpoint once every subtask acknowledged it: its `_metadata` written
//! last in the local snapshot directory, then uploaded to the store if the job has one,
//! and retention afterwards, beside the job. The coordinator decided that the
//! checkpoint is complete; this does the I/O and says how it went.

use crate::error::{JobError, Result};
use crate::job::JobGraph;
use lockgate_state::snapshot_dir::SnapshotDir;
use lockgate_state::store::CheckpointStore;
use lockgate_state::{
    CheckpointId, CheckpointMetadata, SourcePosition, StateError, SubtaskSnapshot,
};
use std::sync::Arc;
use std::time::SystemTime;
use tracing::{error, info, warn};

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The `_metadata` of checkpoint `id` of `job`, and the bytes its state holds.
pub(super) fn checkpoint_metadata(
    job: &JobGraph,
    id: CheckpointId,
    is_final: bool,
    positions: Vec<SourcePosition>,
    snapshots: Vec<SubtaskSnapshot>,
) -> (CheckpointMetadata, u64) {
    let size_bytes: u64 = snapshots
        .iter()
        .map(|s| s.files.iter().map(|f| f.size).sum::<u64>() + s.inline_state.len() as u64)
        .sum();
    let meta = CheckpointMetadata {
        id,
        job_name: job.name.clone(),
        fingerprint: job.fingerprint(),
        created_ms: wall_ms(),
        parallelism: job.parallelism,
        max_parallelism: job.max_parallelism,
        is_final,
        subtasks: snapshots,
        positions,
    };
    (meta, size_bytes)
}

/// Publishes `meta`: `Ok(Ok(where))` when the checkpoint is complete (its local path, or
/// its store URL), `Ok(Err(_))` when the publish failed and the checkpoint is aborted
/// (the coordinator counts it against `tolerable_failures`), `Err(_)` when the attempt
/// must end.
///
/// With a store, the checkpoint is complete once its `_metadata` is there; a failed
/// upload is a failed publish, and the local copy is abandoned so that it is never
/// restored. Unless the store could not say whether `_metadata` landed: then the
/// checkpoint may be complete, nothing it references (a staged part file) may go, and
/// the restart reads the store. Another writer's `_metadata` under our name fails the
/// job.
pub(super) async fn publish(
    dir: &Arc<SnapshotDir>,
    store: Option<&Arc<CheckpointStore>>,
    meta: CheckpointMetadata,
) -> Result<std::result::Result<String, StateError>> {
    let id = meta.id;
    let d = dir.clone();
    let published = tokio::task::spawn_blocking(move || d.publish_with(&meta, &crate::fault::hit))
        .await
        .map_err(|e| JobError::Other(format!("publishing checkpoint {id} panicked: {e}")))?;
    Ok(match (published, store) {
        (Ok(path), Some(s)) => match s.publish(&path).await {
            Ok(up) => {
                info!(checkpoint = %id, objects = up.objects, bytes = up.bytes, reused = up.reused, "checkpoint uploaded to the store");
                Ok(s.url_of(&lockgate_state::snapshot_dir::chk_name(id)))
            }
            Err(e @ StateError::FateUnknown { .. }) => {
                error!(checkpoint = %id, error = %e, "checkpoint of unknown fate: the attempt ends, and the restart reads the store");
                return Err(JobError::CheckpointFateUnknown {
                    id,
                    reason: e.to_string(),
                });
            }
            Err(e @ StateError::Fenced { .. }) => {
                if let Err(a) = tokio::task::block_in_place(|| dir.abandon(id)) {
                    warn!(checkpoint = %id, error = %a, "cannot abandon the local copy of a checkpoint another writer owns");
                }
                return Err(JobError::Unrecoverable {
                    task: format!("checkpoint {id}"),
                    message: e.to_string(),
                });
            }
            Err(e) => {
                if let Err(a) = tokio::task::block_in_place(|| dir.abandon(id)) {
                    warn!(checkpoint = %id, error = %a, "cannot abandon the local copy of a checkpoint whose upload failed");
                }
                Err(e)
            }
        },
        (Ok(path), None) => Ok(path.display().to_string()),
        (Err(e), _) => Err(e),
    })
}

/// Retention after a publish, beside the job: the newest `retain` checkpoints stay
/// (locally and in the store); then the directories of the aborted checkpoints `done`
/// (older than the one just published) go, after retention, so that the two never
/// work on one directory at once. Failures are logged: they do not undo the publish.
pub(super) fn spawn_retention(
    dir: Arc<SnapshotDir>,
    store: Option<Arc<CheckpointStore>>,
    retain: usize,
    done: Vec<CheckpointId>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let _ = tokio::task::spawn_blocking(move || {
            if let Err(e) = dir.apply_retention(retain) {
                warn!(error = %e, "retention failed; older checkpoints stay");
            }
            for a in done {
                if let Err(e) = dir.discard(a) {
                    warn!(checkpoint = %a, error = %e, "cannot remove an aborted checkpoint's directory; the next start removes it");
                }
            }
        })
        .await;
        if let Some(s) = store {
            match s.apply_retention(retain).await {
                Ok(r) if !r.deleted.is_empty() || r.collected > 0 => {
                    tracing::debug!(deleted = ?r.deleted, collected = r.collected, "store retention");
                }
                Ok(_) => {}
                Err(e) => warn!(error = %e, "store retention failed; older checkpoints stay"),
            }
        }
    })
}
