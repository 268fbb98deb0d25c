//! What flows between subtasks and between subtasks and the coordinator.

use crate::record::Batch;
use lockgate_state::{CheckpointId, SourcePosition, SubtaskSnapshot};

/// A message on a data channel. A barrier cuts the stream: every record before
/// `Barrier(N)` belongs to checkpoint `N`, every record after it to a later one.
#[derive(Debug)]
pub enum Message {
    Records(Batch),
    Barrier(CheckpointId),
    /// Event time: every later record of this input has a time of at least this (or
    /// the input is idle). Not aligned: it passes barriers as records do.
    Watermark(crate::event_time::Watermark),
    EndOfInput,
}

pub use crate::checkpoint::TaskId;

/// Coordinator -> task.
#[derive(Debug, Clone)]
pub enum Control {
    /// Sources only: take checkpoint `id` and emit its barrier.
    Trigger { id: CheckpointId, is_final: bool },
    /// Sources only: stop reading input (stop-with-savepoint); a final checkpoint follows.
    Stop,
    /// Sources only: read nothing until `Resume`; checkpoints go on.
    Pause,
    /// Sources only: read again after a `Pause`.
    Resume,
    /// Checkpoint `id` is published. After the final one, tasks finish.
    /// `restorable_from`: the oldest checkpoint retention keeps once this one is
    /// published, when the run knows it (see [`crate::connector::Sink::notify_restorable_from`]).
    Complete {
        id: CheckpointId,
        is_final: bool,
        restorable_from: Option<CheckpointId>,
    },
    /// Checkpoint `id` was aborted.
    Aborted { id: CheckpointId },
}

/// Task -> coordinator.
#[derive(Debug)]
pub enum Report {
    /// The task snapshotted checkpoint `id`.
    Ack {
        id: CheckpointId,
        task: TaskId,
        positions: Vec<SourcePosition>,
        snapshots: Vec<SubtaskSnapshot>,
    },
    /// The task cannot take checkpoint `id`.
    Decline {
        id: CheckpointId,
        task: TaskId,
        reason: String,
    },
    /// A bounded source subtask reached its end.
    SourceFinished { task: TaskId },
    /// A source subtask took `Control::Pause`: it reads nothing until resumed.
    Paused { task: TaskId },
}
