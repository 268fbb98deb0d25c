//! Operators: the functions between a source and a sink, and what the runtime opens
//! each subtask of one with.

use super::SubtaskInfo;
use crate::error::Result;
use crate::record::{Batch, Record};
use lockgate_state::{CheckpointId, StateRestore, SubtaskSnapshot};
use std::path::{Path, PathBuf};

/// What an operator subtask is opened with.
#[derive(Debug, Clone)]
pub struct OperatorContext {
    pub info: SubtaskInfo,
    /// The operator's stable id: names its state in checkpoints.
    pub uid: String,
    /// Where the subtask keeps its working state (rebuilt from the checkpoint on start).
    pub work_dir: PathBuf,
    /// Every snapshot of this operator in the restored checkpoint (all old subtasks:
    /// a keyed operator takes the key groups it now owns from each).
    pub restore: Vec<StateRestore>,
    /// The memory settings of keyed state (the job file's `[state]`).
    pub state_options: lockgate_state::BackendOptions,
    /// Keep keyed state per source partition (the job is `co_partitioned`).
    pub partition_scoped: bool,
}

/// An operator subtask in a chain.
pub trait Operator: Send {
    /// Opens the subtask, restoring its state.
    fn open(&mut self, _ctx: &OperatorContext) -> Result<()> {
        Ok(())
    }

    /// Processes a batch, appending results to `out`.
    fn process(&mut self, batch: Batch, out: &mut Batch) -> Result<()>;

    /// Snapshots state into `pending_dir` (the unfinished checkpoint directory) at
    /// barrier `id`. Stateless operators return `None`.
    fn snapshot(
        &mut self,
        _id: CheckpointId,
        _pending_dir: &Path,
    ) -> Result<Option<SubtaskSnapshot>> {
        Ok(None)
    }

    /// The watermark reached `watermark` (see [`crate::event_time::watermark`]): every
    /// later record has an event time of at least this. Records it completes (fired
    /// windows) go into `out`, ahead of the watermark downstream. Called when it rose,
    /// or when an input came back from idleness (the same value again).
    fn on_watermark(&mut self, _watermark: i64, _out: &mut Batch) -> Result<()> {
        Ok(())
    }

    /// Checkpoint `id` is durable.
    fn notify_checkpoint_complete(&mut self, _id: CheckpointId) -> Result<()> {
        Ok(())
    }
}

/// A stateless operator built from a closure over whole records.
pub struct FnOperator<F>(pub F);

impl<F> Operator for FnOperator<F>
where
    F: FnMut(Record, &mut Batch) -> Result<()> + Send,
{
    fn process(&mut self, batch: Batch, out: &mut Batch) -> Result<()> {
        for r in batch {
            (self.0)(r, out)?;
        }
        Ok(())
    }
}
