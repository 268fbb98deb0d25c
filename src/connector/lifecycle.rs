//! The lifecycle a source and a sink share with the runtime (Flink's): opened with
//! what the restored checkpoint holds, driven per poll or batch, snapshotted at each
//! barrier, and told when a checkpoint completes or is aborted.
//!
//! What the runtime guarantees every source and sink:
//! - **One task, in order.** A subtask's methods are called from one task, one at a
//!   time, in this order: `open` once; then `poll` (source) or `invoke` (sink) and
//!   `snapshot` interleaved; `notify_checkpoint_complete` / `_aborted` after the
//!   snapshot of that checkpoint, in checkpoint order; `close` once, after the final
//!   checkpoint completed, only on a clean finish.
//! - **The barrier.** A source's `snapshot(N)` is called between two polls: the
//!   positions it returns split its records into those before barrier `N` and those
//!   after. A sink's `snapshot(N)` comes after `invoke` was called with every record
//!   before barrier `N` (from every input) and before any record after it.
//! - **Completion.** Checkpoint `N` completes once every subtask's snapshot is
//!   durable in the checkpoint directory (or the store); only then is
//!   `notify_checkpoint_complete(N)` called, and it may be lost in a crash (the next
//!   `open` restores `N` or a later checkpoint and must commit what it staged).
//! - **Errors.** An error from any method fails the attempt: every task is torn down
//!   and the job restarts from its last completed checkpoint, as the restart policy
//!   says. [`crate::error::JobError::Declined`] from a sink's `snapshot` declines only
//!   that checkpoint; [`crate::error::JobError::Unrecoverable`] fails the job without
//!   a restart (a restart cannot cure it: a foreign output directory, a fenced store).
//! - **Restore.** `open` receives everything the restored checkpoint holds for the
//!   source or sink (a union list over all its old subtasks, whatever the old
//!   parallelism or member count); each subtask keeps its own share. A source's own
//!   state ([`Source::restore_state`]) comes the same way, whole, before `open`.

use crate::error::Result;
use crate::record::Batch;
use async_trait::async_trait;
use lockgate_state::{CheckpointId, SourcePosition};

/// The operator id of the sink: its state in checkpoints and its metrics
/// (`operator="sink"`) are under it.
pub const SINK_UID: &str = "sink";

/// The operator id under which a source's own state ([`Source::snapshot_state`]) is kept
/// in checkpoints; no keyed operator may use it.
pub const SOURCE_UID: &str = "source";

/// Identity of one subtask, handed to every lifecycle call that needs it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SubtaskInfo {
    pub job: String,
    /// The vertex name and subtask index, for logs and errors (`sink-1`).
    pub name: String,
    pub index: u16,
    pub parallelism: u16,
    pub max_parallelism: u16,
    /// The job's metrics and status: where the subtask reports what it does.
    pub telemetry: crate::telemetry::Telemetry,
    /// The member of the job this subtask runs in (see [`SubtaskInfo::reads`]).
    pub member: crate::member::Member,
    /// The source's split assignment (its spec's), applied by [`SubtaskInfo::reads`].
    pub assignment: super::Assignment,
}

impl SubtaskInfo {
    /// Subtask `index` of `parallelism` of job `job`, named `name`, run as one process
    /// with the default assignment, 128 key groups and telemetry of its own: what a
    /// test of a connector opens it with.
    pub fn new(job: &str, name: &str, index: u16, parallelism: u16) -> SubtaskInfo {
        SubtaskInfo {
            job: job.to_string(),
            name: name.to_string(),
            index,
            parallelism,
            max_parallelism: 128,
            telemetry: Default::default(),
            member: crate::member::Member::SOLO,
            assignment: Default::default(),
        }
    }

    /// The same subtask in member `member`.
    pub fn with_member(mut self, member: crate::member::Member) -> SubtaskInfo {
        self.member = member;
        self
    }

    /// The same subtask reporting to `telemetry`.
    pub fn with_telemetry(mut self, telemetry: crate::telemetry::Telemetry) -> SubtaskInfo {
        self.telemetry = telemetry;
        self
    }

    /// The same subtask with `max_parallelism` key groups.
    pub fn with_max_parallelism(mut self, max_parallelism: u16) -> SubtaskInfo {
        self.max_parallelism = max_parallelism;
        self
    }

    /// The same subtask with the split assignment `assignment`.
    pub fn with_assignment(mut self, assignment: super::Assignment) -> SubtaskInfo {
        self.assignment = assignment;
        self
    }

    /// Whether this subtask reads split `split` of `stream`: the runtime's rule for
    /// every source ([`super::split_reader`] over the source's assignment, its
    /// member and its parallelism). Exactly one subtask of one member reads each split.
    pub fn reads(&self, stream: &str, split: i32) -> bool {
        super::split_reader(
            self.member,
            self.parallelism,
            self.assignment.assigner(),
            stream,
            split,
        ) == Some(self.index)
    }
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
    /// that [`SubtaskInfo::reads`] gives it and starts each where
    /// [`super::split_start`] says.
    async fn open(&mut self, info: &SubtaskInfo, restored: Option<&[SourcePosition]>)
        -> Result<()>;

    /// Appends the next records to `out`. Must return within about 100 ms even when no
    /// data arrives, so that barriers are not delayed.
    async fn poll(&mut self, out: &mut Batch) -> Result<SourcePoll>;

    /// The position of every owned split: exactly the next record after the last one
    /// appended by `poll`. A split the subtask owns but does not read right now (a
    /// partition that disappeared) keeps its position here, or it would be lost.
    fn snapshot(&mut self, id: CheckpointId) -> Result<Vec<SourcePosition>>;

    /// State of this subtask kept in the checkpoint beside its positions (an
    /// acknowledging source's ids of messages that may be redelivered); `None`:
    /// positions only. Called right after `snapshot(id)`, between the same two polls.
    fn snapshot_state(&mut self, _id: CheckpointId) -> Result<Option<Vec<u8>>> {
        Ok(None)
    }

    /// Every source subtask's state in the restored checkpoint, `(old subtask, bytes)`:
    /// a union list, whatever the old parallelism or member count (old members'
    /// subtasks numbered one after the other), and empty when the checkpoint holds
    /// none. Called once before `open` on every restore; never on a fresh start.
    fn restore_state(&mut self, _states: &[(u16, Vec<u8>)]) -> Result<()> {
        Ok(())
    }

    /// Checkpoint `id` is durable.
    async fn notify_checkpoint_complete(&mut self, _id: CheckpointId) -> Result<()> {
        Ok(())
    }

    /// Checkpoint `id` was aborted.
    async fn notify_checkpoint_aborted(&mut self, _id: CheckpointId) -> Result<()> {
        Ok(())
    }

    /// The subtask's watermark now, covering every record `poll` appended so far
    /// (`None`: the source keeps no event time). A bounded source that finished says
    /// [`crate::event_time::END_OF_TIME`], so that every window fires before the
    /// final checkpoint. The runtime asks periodically and after the end.
    fn watermark(&mut self) -> Option<crate::event_time::Watermark> {
        None
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
    /// commit) and return the state to keep in the checkpoint.
    /// [`crate::error::JobError::Declined`] declines only this checkpoint (the job goes
    /// on, and the next barrier asks again); any other error fails the attempt, as
    /// from every method (see the module's "Errors").
    async fn snapshot(&mut self, id: CheckpointId) -> Result<Vec<u8>>;

    /// Checkpoint `id` is durable: commit what it staged. The commit may go on after
    /// this returns (off the sink's task), if the sink keeps what it commits in the
    /// state of every later checkpoint until it is done, and `close` waits for it.
    async fn notify_checkpoint_complete(&mut self, id: CheckpointId) -> Result<()>;

    /// Checkpoint `id` was aborted: its staged work stays pending for a later one.
    async fn notify_checkpoint_aborted(&mut self, _id: CheckpointId) -> Result<()> {
        Ok(())
    }

    /// No checkpoint older than `oldest` will be restored any more: retention keeps
    /// only `oldest` and newer ones in the checkpoint directory (or the store; it
    /// removes the older ones beside the job, right after this), so a sink may forget
    /// what it keeps to commit or take back the output of older ones (commit records)
    /// instead of keeping it forever. Called after `notify_checkpoint_complete`, once
    /// the attempt has published as many checkpoints as retention keeps
    /// (`checkpoint.retain`, at least 2), with `oldest` growing. A copy of an older
    /// checkpoint directory made by hand and restored by path may then write its
    /// records again.
    async fn notify_restorable_from(&mut self, _oldest: CheckpointId) -> Result<()> {
        Ok(())
    }

    /// Releases resources; called once, after the final checkpoint. Its output is
    /// visible when this returns (a commit still running is waited for).
    async fn close(&mut self) -> Result<()> {
        Ok(())
    }
}
