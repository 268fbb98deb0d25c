//! The job's committer of a sink: one per job (per member's line of checkpoints), not
//! one per subtask, for destinations where what a checkpoint staged must become
//! visible in one step (one Iceberg snapshot per checkpoint, as Flink's
//! `IcebergFilesCommitter` and Iceberg's own Kafka Connect coordinator do).
//!
//! The sink's subtasks stage at each barrier and return, as their state, what they
//! staged. The runtime keeps those states in the checkpoint, as for every sink; once
//! the checkpoint is published, the committer gets every subtask's state of it, before
//! any task hears that the checkpoint completed. A restore gives it the restored
//! checkpoint's states first, before any task starts, whatever the parallelism was.
//! The checkpoint itself carries the committables to the committer: nothing else is
//! sent between the subtasks and it, so nothing else can be lost.

use crate::connector::SinkRestore;
use crate::error::Result;
use async_trait::async_trait;
use lockgate_state::CheckpointId;
use std::sync::Arc;

/// The committer of a sink for a whole job (see the module).
///
/// Calls come from the job's coordinator, in this order: `open` once per attempt,
/// before any task of it starts; then `commit` once per published checkpoint, in
/// checkpoint order. An error from either fails the attempt; the restart restores the
/// newest checkpoint and calls `open` with it, so `open` must finish what a failed
/// `commit` left.
#[async_trait]
pub trait JobCommitter: Send + 'static {
    /// The attempt restores `restored` (`checkpoint` None: a fresh start). Makes
    /// visible what its states name, unless it already is (the crash may have come
    /// after the commit), and takes back, or refuses to go on over, what was made
    /// visible for checkpoints after it: their records are about to be written again.
    async fn open(&mut self, restored: &SinkRestore) -> Result<()>;

    /// Checkpoint `id` is published: makes visible, in one step, what `states` (every
    /// sink subtask's state in it, `(subtask, state)`) name and no earlier checkpoint
    /// made visible. Idempotent: a checkpoint already made visible is a success.
    async fn commit(&mut self, id: CheckpointId, states: &[(u16, Vec<u8>)]) -> Result<()>;
}

/// Whose committer it is: the job, and the member whose line of checkpoints it
/// commits.
#[derive(Debug, Clone)]
pub struct CommitterInfo {
    pub job: String,
    pub member: crate::member::Member,
}

/// Makes the committer of a job's attempt.
pub type CommitterFactory = Arc<dyn Fn(&CommitterInfo) -> Box<dyn JobCommitter> + Send + Sync>;
