//! The job-level error type.

use lockgate_state::{CheckpointId, StateError};

/// Why a job (or one of its subtasks) failed. Every variant names what a person needs
/// to act on: the subtask, the checkpoint, the file.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error("{task}: {message}")]
    Task { task: String, message: String },
    #[error("checkpoint {id} failed: {reason}")]
    Checkpoint { id: CheckpointId, reason: String },
    #[error(
        "too many failed checkpoints in a row ({failures}, tolerable {tolerable}); last: {last}"
    )]
    TooManyCheckpointFailures {
        failures: u32,
        tolerable: u32,
        last: String,
    },
    /// A subtask cannot take this checkpoint now (for example a sink that could not
    /// finish its writes in time); the checkpoint is aborted, the job goes on.
    #[error("checkpoint declined: {0}")]
    Declined(String),
    /// A failure no restart can cure (the cluster refused the credentials): the job
    /// fails at once, without the in-process restarts of its restart policy.
    #[error("{task}: {message}")]
    Unrecoverable { task: String, message: String },
    #[error("cannot restore: {0}")]
    Restore(String),
    /// Publishing checkpoint `id` to the store failed and the store could not be asked
    /// whether its `_metadata` landed: the attempt ends without removing anything the
    /// checkpoint references, and the restart reads the store to decide.
    #[error("checkpoint {id}: {reason}")]
    CheckpointFateUnknown { id: CheckpointId, reason: String },
    #[error("{0}")]
    Other(String),
}

impl JobError {
    /// An error raised by the named subtask.
    pub fn task(task: impl std::fmt::Display, message: impl std::fmt::Display) -> JobError {
        JobError::Task {
            task: task.to_string(),
            message: message.to_string(),
        }
    }
}

impl JobError {
    /// The failure's kind, as the `cause` label of `lockgate_restarts_total`.
    pub fn cause(&self) -> &'static str {
        match self {
            JobError::State(_) => "state",
            JobError::Task { .. } => "task_failed",
            JobError::Checkpoint { .. } => "checkpoint",
            JobError::TooManyCheckpointFailures { .. } => "checkpoint_failures",
            JobError::Declined(_) => "declined",
            JobError::Unrecoverable { .. } => "unrecoverable",
            JobError::Restore(_) => "restore",
            JobError::CheckpointFateUnknown { .. } => "checkpoint_fate_unknown",
            JobError::Other(_) => "other",
        }
    }
}

/// Result alias of the runtime.
pub type Result<T, E = JobError> = std::result::Result<T, E>;
