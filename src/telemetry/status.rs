//! What the REST API reports about a job: its state and its checkpoint history, as
//! plain data, and the readiness decision over it.

use serde::Serialize;
use std::collections::VecDeque;

/// Checkpoints kept in the history (Flink's web UI keeps 10 by default; a day of
/// 1-second checkpoints would be 86,400).
pub const HISTORY: usize = 100;

/// Where the job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Opening the checkpoint directory and restoring state.
    Starting,
    /// Every task is running.
    Running,
    /// Running, with the sources paused by the control API: nothing is read, the
    /// records already read drain, checkpoints go on.
    Paused,
    /// A task failed; waiting to restart from the last completed checkpoint.
    Restarting,
    /// A stop was requested; the final checkpoint is being taken.
    Stopping,
    /// The final checkpoint is published.
    Finished,
    /// The job failed and will not restart.
    Failed,
}

/// `/api/v1/job`.
#[derive(Debug, Clone, Serialize)]
pub struct JobView {
    pub name: String,
    /// The one-line graph (`source:kafka > key_by > rolling_sum > sink:elasticsearch`).
    pub graph: String,
    pub state: JobState,
    /// When the process started the job, in milliseconds since the Unix epoch.
    pub started_at_ms: u64,
    pub uptime_seconds: f64,
    /// Bytes of records waiting between the source and the sink, by stage (`source`,
    /// `exchange`, `sink`): `lockgate_buffered_bytes`.
    pub buffered_bytes: std::collections::BTreeMap<String, u64>,
    pub parallelism: u16,
    pub max_parallelism: u16,
    /// Which member of the job this process is (`--member I --members N`; 0 of 1 for
    /// a job run as one process).
    pub member: u16,
    pub members: u16,
    /// The checkpoint the job started from, if any.
    pub restored_from: Option<String>,
    /// In-process restarts since the start.
    pub restarts: u32,
    /// The failure that caused the last restart, or that failed the job.
    pub last_failure: Option<String>,
    /// Checkpoints completed since the start.
    pub checkpoints_completed: u64,
    /// Checkpoints completed since the running attempt started (after an in-process
    /// restart, the new attempt has to prove itself again).
    pub checkpoints_since_restart: u64,
    /// The last completed checkpoint's id.
    pub last_checkpoint: Option<u64>,
    /// Periodic checkpoints are on (`checkpoint.interval_ms > 0`). Without them a job
    /// checkpoints only when it stops, so readiness cannot wait for one.
    pub periodic_checkpoints: bool,
    /// The sources are paused by the control API (the state then reads `paused`
    /// while the job runs).
    pub paused: bool,
    /// Tasks of the running attempt, and how many of them have opened (connected,
    /// restored their state); the count is unknown (`None`) until the attempt spawned
    /// them all.
    pub tasks: Option<usize>,
    pub tasks_open: usize,
}

/// The status of one checkpoint in the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointStatus {
    InProgress,
    Completed,
    /// A task declined it (for example a sink could not flush).
    Declined,
    /// Publishing it failed.
    Failed,
    /// It did not complete within the checkpoint timeout.
    TimedOut,
    /// The attempt that took it failed before it completed.
    Abandoned,
}

/// One task's acknowledgement of a checkpoint.
#[derive(Debug, Clone, Serialize)]
pub struct AckView {
    /// The task's name (`source-0`, `vertex1-1`).
    pub task: String,
    pub vertex: u16,
    pub subtask: u16,
    /// Milliseconds from the trigger to the acknowledgement.
    pub ack_ms: u64,
}

/// `/api/v1/checkpoints` history entry.
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointView {
    pub id: u64,
    pub status: CheckpointStatus,
    pub is_final: bool,
    /// Milliseconds since the Unix epoch.
    pub trigger_time_ms: u64,
    /// Trigger to publish (or to abort), once known.
    pub duration_ms: Option<u64>,
    /// Bytes of its state files and inline state, once completed.
    pub size_bytes: Option<u64>,
    pub acknowledgements: Vec<AckView>,
    pub failure_cause: Option<String>,
    /// The published directory.
    pub path: Option<String>,
}

/// Counts of `/api/v1/checkpoints`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CheckpointCounts {
    pub completed: u64,
    pub declined: u64,
    pub failed: u64,
    pub timed_out: u64,
    /// In progress when their attempt failed.
    pub abandoned: u64,
    pub in_progress: u64,
}

/// The mutable status of a job.
#[derive(Debug, Clone)]
pub struct Status {
    pub job: JobView,
    pub counts: CheckpointCounts,
    /// Oldest first, at most [`HISTORY`].
    pub history: VecDeque<CheckpointView>,
}

impl Status {
    /// The history entry of checkpoint `id`, if still kept.
    pub fn checkpoint_mut(&mut self, id: u64) -> Option<&mut CheckpointView> {
        self.history.iter_mut().rev().find(|c| c.id == id)
    }

    /// Appends a checkpoint, dropping the oldest beyond [`HISTORY`].
    pub fn push_checkpoint(&mut self, c: CheckpointView) {
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(c);
    }
}

/// Whether the job should receive traffic (Kubernetes `readyz`): it is running and
/// its running attempt has completed a checkpoint, so a restarted pod, or a job
/// restarted in process after a failure, is not ready until it has proved it can
/// checkpoint. A job without periodic checkpoints (`interval_ms = 0`) takes its only
/// checkpoint when it stops: it is ready once it runs and every task of the attempt
/// has opened (connected and restored its state). `Err` says why not.
pub fn readiness(job: &JobView) -> Result<(), String> {
    match job.state {
        JobState::Running | JobState::Stopping if job.checkpoints_since_restart > 0 => Ok(()),
        JobState::Running | JobState::Stopping if !job.periodic_checkpoints => match job.tasks {
            Some(n) if job.tasks_open >= n => Ok(()),
            n => Err(format!(
                "opening tasks: {} of {} open (checkpoints are not periodic, so an open job is ready)",
                job.tasks_open,
                n.map_or("?".into(), |n| n.to_string())
            )),
        },
        JobState::Running | JobState::Stopping if job.restarts > 0 => Err(format!(
            "no checkpoint completed since restart {} (after: {})",
            job.restarts,
            job.last_failure.as_deref().unwrap_or("unknown")
        )),
        JobState::Running | JobState::Stopping => Err(format!(
            "no checkpoint completed since the start{}",
            match &job.restored_from {
                Some(p) => format!(" (restored from {p})"),
                None => String::new(),
            }
        )),
        // Paused is still ready: a job taken out of a Service could not be resumed
        // through it. `/readyz` says paused in its body.
        JobState::Paused => readiness(&JobView {
            state: JobState::Running,
            ..job.clone()
        }),
        JobState::Starting => Err("starting: restoring state".into()),
        JobState::Restarting => Err(format!(
            "restarting after a failure: {}",
            job.last_failure.as_deref().unwrap_or("unknown")
        )),
        JobState::Finished => Err("finished: the final checkpoint is published".into()),
        JobState::Failed => Err(format!(
            "failed: {}",
            job.last_failure.as_deref().unwrap_or("unknown")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(state: JobState, completed: u64) -> JobView {
        JobView {
            name: "j".into(),
            graph: "j: source:sequence > sink:file".into(),
            state,
            started_at_ms: 0,
            uptime_seconds: 0.0,
            buffered_bytes: Default::default(),
            parallelism: 1,
            max_parallelism: 128,
            member: 0,
            members: 1,
            restored_from: Some("/c/chk-4".into()),
            restarts: 0,
            last_failure: Some("boom".into()),
            checkpoints_completed: completed,
            checkpoints_since_restart: completed,
            last_checkpoint: None,
            periodic_checkpoints: true,
            paused: false,
            tasks: Some(3),
            tasks_open: 3,
        }
    }

    #[test]
    fn a_paused_job_is_ready_as_the_running_job_would_be() {
        assert_eq!(readiness(&job(JobState::Paused, 5)), Ok(()));
        assert!(readiness(&job(JobState::Paused, 0)).is_err());
    }

    #[test]
    fn without_periodic_checkpoints_a_running_job_is_ready() {
        let mut j = job(JobState::Running, 0);
        j.periodic_checkpoints = false;
        assert_eq!(readiness(&j), Ok(()));
        // Not before every task opened (a source still connecting).
        j.tasks_open = 2;
        let not = readiness(&j).unwrap_err();
        assert!(not.contains("2 of 3 open"), "{not}");
        j.tasks = None;
        assert!(
            readiness(&j).is_err(),
            "the attempt is still spawning tasks"
        );
        j.tasks = Some(3);
        j.tasks_open = 3;
        j.restarts = 2;
        assert_eq!(readiness(&j), Ok(()), "a restarted attempt that runs again");
        for s in [JobState::Starting, JobState::Restarting, JobState::Failed] {
            j.state = s;
            assert!(readiness(&j).is_err(), "{s:?} is not ready");
        }
    }

    #[test]
    fn ready_only_when_running_with_a_checkpoint_since_the_start() {
        assert_eq!(readiness(&job(JobState::Running, 1)), Ok(()));
        assert_eq!(readiness(&job(JobState::Stopping, 3)), Ok(()));
        let not = readiness(&job(JobState::Running, 0)).unwrap_err();
        assert!(not.contains("no checkpoint completed"), "{not}");
        assert!(
            not.contains("/c/chk-4"),
            "names the restored checkpoint: {not}"
        );
        for s in [
            JobState::Starting,
            JobState::Restarting,
            JobState::Finished,
            JobState::Failed,
        ] {
            assert!(readiness(&job(s, 5)).is_err(), "{s:?} is not ready");
        }
        assert!(readiness(&job(JobState::Restarting, 5))
            .unwrap_err()
            .contains("boom"));
        // Restarted in process: checkpoints of the failed attempt do not count.
        let mut restarted = job(JobState::Running, 5);
        restarted.restarts = 1;
        restarted.checkpoints_since_restart = 0;
        let not = readiness(&restarted).unwrap_err();
        assert!(
            not.contains("since restart 1") && not.contains("boom"),
            "{not}"
        );
        restarted.checkpoints_since_restart = 1;
        assert_eq!(readiness(&restarted), Ok(()));
    }

    #[test]
    fn history_keeps_the_newest_entries() {
        let mut s = Status {
            job: job(JobState::Running, 0),
            counts: CheckpointCounts::default(),
            history: VecDeque::new(),
        };
        for id in 1..=(HISTORY as u64 + 5) {
            s.push_checkpoint(CheckpointView {
                id,
                status: CheckpointStatus::Completed,
                is_final: false,
                trigger_time_ms: 0,
                duration_ms: None,
                size_bytes: None,
                acknowledgements: Vec::new(),
                failure_cause: None,
                path: None,
            });
        }
        assert_eq!(s.history.len(), HISTORY);
        assert_eq!(s.history.front().unwrap().id, 6);
        assert!(s.checkpoint_mut(5).is_none());
        assert!(s.checkpoint_mut(HISTORY as u64 + 5).is_some());
    }
}
