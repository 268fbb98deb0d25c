//! The lifecycle a source and a sink share with the runtime (Flink's): opened with
//! what the restored checkpoint holds, driven per poll or batch, snapshotted at each
//! barrier, and told when a checkpoint completes or is aborted.

use crate::error::Result;
use crate::record::Batch;
use async_trait::async_trait;
use lockgate_state::{CheckpointId, SourcePosition};

/// Identity of one subtask, handed to every lifecycle call that needs it.
#[derive(Debug, Clone)]
pub struct SubtaskInfo {
    pub job: String,
    /// The vertex name and subtask index, for logs and errors (`sink-1`).
    pub name: String,
    pub index: u16,
    pub parallelism: u16,
    pub max_parallelism: u16,
    /// The job's metrics and status: where the subtask reports what it does.
    pub telemetry: crate::telemetry::Telemetry,
    /// The member of the job this subtask runs in: a source reads the share of its
    /// splits that global subtask `member.global_index(index, parallelism)` of
    /// `member.global_parallelism(parallelism)` owns.
    pub member: crate::member::Member,
}

/// What one [`Source::poll`] produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourcePoll {
    /// Records were appended (possibly none); poll again.
    Ready,
    /// Nothing is available right now; the runtime polls again soon.
    Idle,
    /// A bounded source reached its end: nothing more will ever be appended.
    Finished,
}

/// A checkpointed source subtask.
#[async_trait]
pub trait Source: Send + 'static {
    /// Opens the subtask. `restored` is the union list of every split position of the
    /// restored checkpoint (None when the job starts fresh); the source keeps the splits
    /// its deterministic assignment gives to `info.index`.
    async fn open(&mut self, info: &SubtaskInfo, restored: Option<&[SourcePosition]>)
        -> Result<()>;

    /// Appends the next records to `out`. Must return within about 100 ms even when no
    /// data arrives, so that barriers are not delayed.
    async fn poll(&mut self, out: &mut Batch) -> Result<SourcePoll>;

    /// The position of every owned split: exactly the next record after the last one
    /// appended by `poll`.
    fn snapshot(&mut self, id: CheckpointId) -> Result<Vec<SourcePosition>>;

    /// Checkpoint `id` is durable.
    async fn notify_checkpoint_complete(&mut self, _id: CheckpointId) -> Result<()> {
        Ok(())
    }

    /// Checkpoint `id` was aborted.
    async fn notify_checkpoint_aborted(&mut self, _id: CheckpointId) -> Result<()> {
        Ok(())
    }

    /// Releases resources; called once, on a clean finish.
    async fn close(&mut self) -> Result<()> {
        Ok(())
    }
}

/// The restored state of a sink: the inline states of every sink subtask of the
/// checkpoint (a union list), and the checkpoint's id.
#[derive(Debug, Clone, Default)]
pub struct SinkRestore {
    pub checkpoint: Option<CheckpointId>,
    /// `(old subtask index, state)` for every subtask of the restored checkpoint.
    pub states: Vec<(u16, Vec<u8>)>,
    /// The parallelism of the restored checkpoint.
    pub parallelism: u16,
}

/// A checkpointed sink subtask.
#[async_trait]
pub trait Sink: Send + 'static {
    /// Opens the subtask, committing what the restored checkpoint left pending.
    async fn open(&mut self, info: &SubtaskInfo, restored: &SinkRestore) -> Result<()>;

    /// Writes (or buffers) a batch. An asynchronous failure of earlier work may be
    /// raised here.
    async fn invoke(&mut self, batch: Batch) -> Result<()>;

    /// Called at barrier `id`: make everything invoked so far durable (or staged for
    /// commit) and return the state to keep in the checkpoint. An error declines the
    /// checkpoint.
    async fn snapshot(&mut self, id: CheckpointId) -> Result<Vec<u8>>;

    /// Checkpoint `id` is durable: commit what it staged.
    async fn notify_checkpoint_complete(&mut self, id: CheckpointId) -> Result<()>;

    /// Checkpoint `id` was aborted: its staged work stays pending for a later one.
    async fn notify_checkpoint_aborted(&mut self, _id: CheckpointId) -> Result<()> {
        Ok(())
    }

    /// Releases resources; called once, after the final checkpoint.
    async fn close(&mut self) -> Result<()> {
        Ok(())
    }
}
