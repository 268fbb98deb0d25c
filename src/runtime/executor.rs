//! Runs a job: opens the checkpoint directory, chooses what to restore, builds the
//! tasks and channels of one attempt, drives the checkpoint coordinator, and restarts
//! from the last completed checkpoint according to the restart policy.

use super::message::{Control, Report, TaskId};
use super::publish::{checkpoint_metadata, publish, spawn_retention};
use super::restart::{next_restart, Restart};
use super::start::{
    decide_from_store, own_restart, prepare, start_failure_is_retried, Prepared, RestoreSet,
    RunOptions, RunSummary,
};
use super::wiring::{fresh_work_dir, task_name, wire, Wiring};
use crate::checkpoint::{AbortCause, Action, Coordinator, CoordinatorConfig};
use crate::error::{JobError, Result};
use crate::job::JobGraph;
use crate::telemetry::status::{CheckpointStatus, JobState};
use crate::telemetry::Telemetry;
use lockgate_state::snapshot_dir::SnapshotDir;
use lockgate_state::store::CheckpointStore;
use lockgate_state::CheckpointId;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{error, info, warn};

/// Runs `job` to its end: a bounded job until its final checkpoint, an unbounded one
/// until stopped. Restarting after a crash is calling this again with the same job:
/// it resumes from the newest checkpoint that verifies.
pub async fn run(job: &JobGraph, opts: RunOptions) -> Result<RunSummary> {
    let telemetry = opts.telemetry.clone().unwrap_or_else(|| {
        Telemetry::new(
            &job.name,
            &job.describe(),
            job.parallelism,
            job.max_parallelism,
        )
    });
    let control = opts.control.clone();
    let result = run_with(job, opts, &telemetry).await;
    match &result {
        Ok(_) => telemetry.set_state(JobState::Finished),
        Err(e) => telemetry.failed(&e.to_string()),
    }
    if let Some(c) = control {
        c.ended(&match &result {
            Ok(_) => "the job finished before another checkpoint was triggered".to_string(),
            Err(e) => format!("the job failed: {e}"),
        });
    }
    result
}

async fn run_with(job: &JobGraph, opts: RunOptions, telemetry: &Telemetry) -> Result<RunSummary> {
    job.check_members()
        .map_err(|(key, e)| JobError::Other(format!("job {}: {key}: {e}", job.name)))?;
    telemetry.member(job.member);
    telemetry.periodic_checkpoints(job.checkpoint.interval_ms > 0);
    // A start that fails on the store or the disk (a download cut short, a store that
    // does not answer) is retried by the restart strategy, as a failed attempt is;
    // a refusal (another job's checkpoint, a running old member) is not.
    let clock = Instant::now();
    let mut failures_ms: Vec<u64> = Vec::new();
    let mut stop = opts.stop.clone();
    let prepared = loop {
        match prepare(job, &opts, telemetry).await {
            Ok(p) => break p,
            Err(e) if !start_failure_is_retried(&e) => return Err(e),
            Err(e) => {
                let now_ms = clock.elapsed().as_millis() as u64;
                let delay = match next_restart(&job.restart, &failures_ms, now_ms, rand::random()) {
                    Restart::GiveUp(reason) => {
                        error!(job = %job.name, error = %e, %reason, "job failed to start; the restart strategy gives up");
                        return Err(e);
                    }
                    Restart::After(d) => d,
                };
                failures_ms.push(now_ms);
                // Not a restart of an attempt: the job stays Starting (and not ready).
                warn!(job = %job.name, error = %e, delay_ms = delay.as_millis() as u64, "job failed to start; starting again");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = stop_requested(&mut stop) => return Err(e),
                }
            }
        }
    };
    let Prepared {
        dir,
        root,
        store,
        mut restored,
        mut next_id,
        mut summary,
        source,
    } = prepared;
    // A checkpoint whose publish ended without the store saying whether it landed:
    // the next attempt starts only once the store has been read (and answered).
    let mut fate_unknown: Option<CheckpointId> = None;
    loop {
        let decided = match (fate_unknown, &store) {
            (Some(unknown), Some(s)) => {
                match decide_from_store(s, &dir, &root, unknown, &mut summary).await {
                    Ok(from_store) => {
                        fate_unknown = None;
                        let r = match from_store {
                            Some(r) => Some(r),
                            None => own_restart(&dir, summary.last_checkpoint, source)?,
                        };
                        if let Some(r) = r {
                            telemetry.restored(Some(&r.path));
                            restored = Some(RestoreSet::one(r));
                        }
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            _ => Ok(()),
        };
        let result = match decided {
            Err(e) => Err(e),
            Ok(()) => {
                match &restored {
                    Some(set) => {
                        info!(job = %job.name, checkpoint = %set.newest().path.display(), parts = set.parts.len(), first_new_checkpoint = %next_id, "restoring")
                    }
                    None => {
                        info!(job = %job.name, first_new_checkpoint = %next_id, "starting without a checkpoint")
                    }
                }
                run_attempt(
                    job,
                    &dir,
                    store.as_ref(),
                    restored.as_ref(),
                    &mut next_id,
                    (&mut stop, opts.control.as_ref()),
                    &mut summary,
                    telemetry,
                )
                .await
            }
        };
        match result {
            Ok(()) => return Ok(summary),
            Err(e) => {
                if matches!(e, JobError::Unrecoverable { .. }) {
                    error!(job = %job.name, error = %e, "job failed; a restart cannot cure this failure");
                    return Err(e);
                }
                if let JobError::CheckpointFateUnknown { id, .. } = &e {
                    fate_unknown = Some(*id);
                }
                // The decision is a plain function of the failure history
                // (runtime::restart); this is the clock and the dice around it.
                let now_ms = clock.elapsed().as_millis() as u64;
                let unit: f64 = rand::random();
                let delay = match next_restart(&job.restart, &failures_ms, now_ms, unit) {
                    Restart::GiveUp(reason) => {
                        error!(job = %job.name, error = %e, restarts = summary.restarts, %reason, "job failed; the restart strategy gives up");
                        return Err(e);
                    }
                    Restart::After(d) => d,
                };
                failures_ms.push(now_ms);
                summary.restarts += 1;
                // Every request the attempt took is answered (one of a checkpoint of
                // unknown fate too: it may have landed; asking again takes another).
                if let Some(c) = &opts.control {
                    c.attempt_failed(&e.to_string());
                }
                telemetry.restarting(e.cause(), &e.to_string());
                warn!(job = %job.name, error = %e, restart = summary.restarts, delay_ms = delay.as_millis() as u64, "job failed; restarting from the last completed checkpoint");
                // A stop (SIGTERM) during a backoff of up to minutes ends the run now:
                // no attempt is running, and the last completed checkpoint stands.
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = stop_requested(&mut stop) => {
                        warn!(job = %job.name, "stop requested while waiting to restart; the job ends failed, at its last completed checkpoint");
                        return Err(e);
                    }
                }
                // After a checkpoint of unknown fate the store decides (above, before
                // the next attempt).
                if fate_unknown.is_none() {
                    if let Some(r) = own_restart(&dir, summary.last_checkpoint, source)? {
                        telemetry.restored(Some(&r.path));
                        restored = Some(RestoreSet::one(r));
                    }
                }
            }
        }
    }
}

fn now_ms(start: Instant) -> u64 {
    start.elapsed().as_millis() as u64
}

async fn stop_requested(stop: &mut Option<watch::Receiver<bool>>) {
    match stop {
        Some(rx) => {
            if rx.wait_for(|s| *s).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
    }
}

/// Runs one attempt of the job, from `restored`.
#[allow(clippy::too_many_arguments)]
async fn run_attempt(
    job: &JobGraph,
    dir: &Arc<SnapshotDir>,
    store: Option<&Arc<CheckpointStore>>,
    restored: Option<&RestoreSet>,
    next_id: &mut CheckpointId,
    (stop, control): (
        &mut Option<watch::Receiver<bool>>,
        Option<&crate::control::JobControl>,
    ),
    summary: &mut RunSummary,
    telemetry: &Telemetry,
) -> Result<()> {
    telemetry.attempt_starts();
    let work = tokio::task::block_in_place(|| fresh_work_dir(dir.root()))?;
    // The job's committer finishes what the restored checkpoint staged (and takes back
    // what came after it) before any task starts writing again.
    let info = crate::connector::CommitterInfo {
        job: job.name.clone(),
        member: job.member,
    };
    let mut committer = job.sink.committer.as_ref().map(|make| make(&info));
    if let Some(c) = &mut committer {
        c.open(&super::start::sink_restore(restored)).await?;
    }
    // Read once: the pause queued before the sources start and the one followed
    // below must agree, or a resume in between is lost.
    let start_paused = control.is_some_and(|c| c.is_paused());
    let Wiring {
        controls,
        mut tasks,
        reports: mut report_rx,
    } = wire(job, dir.root(), restored, &work, telemetry, start_paused);

    // Controls are ordered downstream first: a Complete reaches sinks before sources.
    let all: Vec<TaskId> = controls.iter().map(|c| c.0).collect();
    telemetry.attempt_tasks(all.len());
    let sources: Vec<TaskId> = all.iter().copied().filter(|t| t.vertex == 0).collect();
    let cfg = CoordinatorConfig {
        interval_ms: job.checkpoint.interval_ms,
        timeout_ms: job.checkpoint.timeout_ms,
        min_pause_ms: job.checkpoint.min_pause_ms,
        tolerable_failures: job.checkpoint.tolerable_failures,
    };
    let start = Instant::now();
    let coord = Coordinator::new(cfg, all.clone(), sources.clone(), *next_id, 0);
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    telemetry.set_state(JobState::Running);
    let mut running = all.len();
    let mut stop_seen = false;
    let mut a = Attempt {
        job,
        dir,
        store,
        control,
        telemetry,
        controls,
        sources,
        coord,
        start,
        triggered_at: None,
        aborted: Vec::new(),
        completed: Vec::new(),
        retention: None,
        paused: start_paused,
        paused_sources: HashSet::new(),
        committer,
    };

    // Every return of the loop below leaves through here: a retention pass still
    // running ends before the attempt does, so that nothing of this attempt touches the
    // checkpoint directory afterwards.
    let outcome: Result<()> = async {
        loop {
            let mut actions = Vec::new();
            tokio::select! {
                _ = tick.tick() => actions = a.on_tick(),
                r = report_rx.recv(), if running > 0 => actions = a.on_report(r),
                j = tasks.join_next() => match j {
                    Some(Ok((_, Ok(())))) => {
                        running -= 1;
                        if running == 0 {
                            if a.coord.is_finished() {
                                return Ok(());
                            }
                            return Err(JobError::Other("every task ended before the final checkpoint".into()));
                        }
                    }
                    Some(Ok((task, Err(e)))) => {
                        error!(task = %task, error = %e, "task failed");
                        // Not ready from now on, while the other tasks are torn down.
                        telemetry.set_state(JobState::Restarting);
                        return fail_attempt(&mut tasks, e).await;
                    }
                    Some(Err(join)) => return fail_attempt(&mut tasks, JobError::Other(format!("task panicked: {join}"))).await,
                    None => return if a.coord.is_finished() { Ok(()) } else { Err(JobError::Other("no tasks".into())) },
                },
                _ = stop_requested(stop), if !stop_seen => {
                    stop_seen = true;
                    a.on_stop();
                }
            }
            let mut queue: std::collections::VecDeque<Action> = actions.into();
            while let Some(action) = queue.pop_front() {
                match a.act(action, next_id, summary).await {
                    Ok(more) => queue.extend(more),
                    Err(e) => return fail_attempt(&mut tasks, e).await,
                }
            }
        }
    }
    .await;
    if let Some(r) = a.retention.take() {
        let _ = r.await;
    }
    outcome
}

/// One attempt's side of the checkpoint protocol: the coordinator, the tasks' control
/// channels, and what the attempt remembers between the coordinator's actions.
struct Attempt<'a> {
    job: &'a JobGraph,
    dir: &'a Arc<SnapshotDir>,
    store: Option<&'a Arc<CheckpointStore>>,
    control: Option<&'a crate::control::JobControl>,
    telemetry: &'a Telemetry,
    /// One control channel per task, downstream first.
    controls: Vec<(TaskId, tokio::sync::mpsc::UnboundedSender<Control>)>,
    sources: Vec<TaskId>,
    coord: Coordinator,
    /// The coordinator's clock starts here.
    start: Instant,
    /// The newest checkpoint triggered, and when.
    triggered_at: Option<(CheckpointId, Instant)>,
    /// Aborted checkpoints whose directories are not removed yet: a subtask may still
    /// be writing its snapshot into one (an expired checkpoint's keyed subtask in the
    /// middle of its RocksDB checkpoint). Subtasks take barriers in order, so once a
    /// later checkpoint is published none of them touches an older one any more.
    aborted: Vec<CheckpointId>,
    /// The newest checkpoints this attempt published (at most as many as retention
    /// keeps), oldest first: once there are that many, they are what retention keeps.
    completed: Vec<CheckpointId>,
    /// The retention pass running beside the job, if any.
    retention: Option<tokio::task::JoinHandle<()>>,
    /// Whether the sources were told to pause (as the control API last said).
    paused: bool,
    /// The sources that confirmed the pause.
    paused_sources: HashSet<TaskId>,
    /// The sink's committer for the whole job, if it has one.
    committer: Option<Box<dyn crate::connector::JobCommitter>>,
}

impl Attempt<'_> {
    fn send_all(&self, msg: Control) {
        for (_, c) in &self.controls {
            let _ = c.send(msg.clone());
        }
    }

    fn send_sources(&self, msg: Control) {
        for (t, c) in &self.controls {
            if t.vertex == 0 {
                let _ = c.send(msg.clone());
            }
        }
    }

    /// Milliseconds since checkpoint `id` was triggered (0 if it is not the newest).
    fn since_trigger(&self, id: CheckpointId) -> u64 {
        self.triggered_at
            .filter(|t| t.0 == id)
            .map_or(0, |t| t.1.elapsed().as_millis() as u64)
    }

    /// The coordinator's clock ticks, after the control API's requests are followed.
    fn on_tick(&mut self) -> Vec<Action> {
        if self.follow_control() == Some(false) {
            self.paused_sources.clear();
            self.telemetry.set_paused(false);
        }
        self.coord.poll(now_ms(self.start))
    }

    /// Follows the control API's requests; returns the pause state if it changed.
    ///
    /// A pause holds across in-process restarts (`wire` queued `Pause` before a new
    /// attempt's sources started); the job says paused once every source confirmed
    /// it. A checkpoint asked for is triggered as soon as none is pending.
    fn follow_control(&mut self) -> Option<bool> {
        let c = self.control?;
        let mut changed = None;
        if c.is_paused() != self.paused {
            self.paused = c.is_paused();
            let paused = self.paused;
            self.send_sources(if paused {
                Control::Pause
            } else {
                Control::Resume
            });
            info!(job = %self.job.name, paused, "{} by the control API", if paused { "pause" } else { "resume" });
            changed = Some(paused);
        }
        if c.take_requests(self.coord.next_id()) {
            info!(job = %self.job.name, checkpoint = %self.coord.next_id(), "checkpoint asked for by the control API");
            self.coord.request_checkpoint();
        }
        changed
    }

    /// A task's report to the coordinator (or, for a pause, to the job's state).
    fn on_report(&mut self, report: Option<Report>) -> Vec<Action> {
        match report {
            Some(Report::Ack {
                id,
                task,
                positions,
                snapshots,
            }) => {
                self.telemetry.checkpoint_acked(
                    id.0,
                    task_name(task),
                    task.vertex,
                    task.subtask,
                    self.since_trigger(id),
                );
                self.coord.on_ack(id, task, positions, snapshots)
            }
            Some(Report::Decline { id, task, reason }) => {
                self.coord.on_decline(id, task, &reason, now_ms(self.start))
            }
            Some(Report::SourceFinished { task }) => {
                self.coord.on_source_finished(task);
                Vec::new()
            }
            Some(Report::Paused { task }) => {
                // A confirmation that raced a resume is stale.
                let fresh =
                    self.control.is_some_and(|c| c.is_paused()) && self.paused_sources.insert(task);
                if fresh && self.paused_sources.len() == self.sources.len() {
                    self.telemetry.set_paused(true);
                    info!(job = %self.job.name, "every source paused: nothing is read until resumed");
                }
                Vec::new()
            }
            None => Vec::new(),
        }
    }

    /// A stop (SIGTERM): the job finishes with a final checkpoint.
    fn on_stop(&mut self) {
        info!(job = %self.job.name, "stop requested: finishing with a final checkpoint");
        self.coord.on_stop();
        self.telemetry.set_state(JobState::Stopping);
        self.send_sources(Control::Stop);
    }

    /// Carries out one of the coordinator's actions; returns the actions that follow
    /// from it, or the error that fails the attempt.
    async fn act(
        &mut self,
        action: Action,
        next_id: &mut CheckpointId,
        summary: &mut RunSummary,
    ) -> Result<Vec<Action>> {
        match action {
            Action::Trigger { id, is_final } => {
                // The coordinator owns the sequence; the next attempt starts where it
                // stands.
                *next_id = self.coord.next_id();
                self.trigger(id, is_final)?;
            }
            Action::Publish {
                id,
                is_final,
                positions,
                snapshots,
            } => {
                let sink_states = match self.committer {
                    Some(_) => sink_states(&snapshots),
                    None => Vec::new(),
                };
                let (meta, size_bytes) =
                    checkpoint_metadata(self.job, id, is_final, positions, snapshots);
                // The previous retention pass ends before this publish: the two never
                // list and rename in the checkpoint directory at the same time.
                if let Some(r) = self.retention.take() {
                    let _ = r.await;
                }
                match publish(self.dir, self.store, meta).await? {
                    Ok(path) => {
                        self.published(id, is_final, path, size_bytes, summary, sink_states)
                            .await?
                    }
                    Err(e) => {
                        return Ok(self.coord.on_publish_failed(
                            id,
                            e.to_string(),
                            now_ms(self.start),
                        ))
                    }
                }
            }
            Action::Abort { id, cause, reason } => self.abort(id, cause, reason),
            Action::Fail { failures, last } => {
                return Err(JobError::TooManyCheckpointFailures {
                    failures,
                    tolerable: self.job.checkpoint.tolerable_failures,
                    last,
                })
            }
        }
        Ok(Vec::new())
    }

    /// Begins checkpoint `id`'s directory and sends the barrier to the sources.
    fn trigger(&mut self, id: CheckpointId, is_final: bool) -> Result<()> {
        tokio::task::block_in_place(|| self.dir.begin(id))?;
        self.triggered_at = Some((id, Instant::now()));
        self.telemetry.checkpoint_triggered(id.0, is_final);
        crate::fault::checkpoint_triggered();
        tracing::debug!(checkpoint = %id, is_final, "checkpoint triggered");
        self.send_sources(Control::Trigger { id, is_final });
        Ok(())
    }

    /// Checkpoint `id` is published (at `path`): it is counted and announced, every task
    /// is told it completed, and retention (with the removal of older aborted
    /// checkpoints) starts beside the job.
    ///
    /// The sink's committer, if any, commits the checkpoint before any task is told: a
    /// task that hears of it may take it as visible.
    async fn published(
        &mut self,
        id: CheckpointId,
        is_final: bool,
        path: String,
        size_bytes: u64,
        summary: &mut RunSummary,
        sink_states: Vec<(u16, Vec<u8>)>,
    ) -> Result<()> {
        self.coord.on_published(id, now_ms(self.start));
        let took = self.since_trigger(id);
        self.telemetry
            .checkpoint_completed(id.0, took, size_bytes, &path);
        summary.checkpoints += 1;
        summary.last_checkpoint = Some(id);
        summary.checkpoint_durations_ms.push(took);
        info!(checkpoint = %id, path = %path, duration_ms = took, is_final, "checkpoint completed");
        crate::fault::after_publish();
        crate::fault::checkpoint_completed();
        let retain = self.job.checkpoint.retain;
        self.completed.push(id);
        if self.completed.len() > retain.max(2) {
            self.completed.remove(0);
        }
        if let Some(c) = &mut self.committer {
            c.commit(id, &sink_states).await?;
            crate::fault::hit("after-job-commit");
        }
        self.send_all(Control::Complete {
            id,
            is_final,
            restorable_from: oldest_retained(&self.completed, retain),
        });
        if let Some(c) = self.control {
            c.completed(id, &path.to_string());
        }
        // Retention is housekeeping after the publish (deleting an old checkpoint's
        // files costs as much as it holds): it runs beside the job, and its failure does
        // not undo the publish. The directories of aborted checkpoints older than this
        // one go in the same task, after retention, so that the two never work on one
        // directory at once (a checkpoint whose publish failed after its `_metadata` was
        // renamed in can be both).
        let (done, later): (Vec<_>, Vec<_>) = self.aborted.iter().partition(|a| **a < id);
        self.aborted = later;
        self.retention = Some(spawn_retention(
            self.dir.clone(),
            self.store.cloned(),
            retain,
            done,
        ));
        Ok(())
    }

    /// Checkpoint `id` is aborted: reported, and its directory removed once a later
    /// checkpoint is published (or at the next start).
    fn abort(&mut self, id: CheckpointId, cause: AbortCause, reason: String) {
        warn!(checkpoint = %id, reason = %reason, "checkpoint aborted");
        let status = match cause {
            AbortCause::Declined => CheckpointStatus::Declined,
            AbortCause::Expired => CheckpointStatus::TimedOut,
            AbortCause::PublishFailed => CheckpointStatus::Failed,
        };
        self.telemetry
            .checkpoint_aborted(id.0, status, self.since_trigger(id), &reason);
        if let Some(c) = self.control {
            c.aborted(id, &reason);
        }
        self.aborted.push(id);
        self.send_all(Control::Aborted { id });
    }
}

/// Ends a failed attempt: aborts every task and waits until all are gone, so that
/// no task of this attempt still touches the working state when the next one starts.
/// The oldest checkpoint retention keeps once the last of `completed` (this attempt's
/// published checkpoints, in order) is published: retention keeps the newest `retain`,
/// and never fewer than two (`lockgate_state::restore::retention_victims`). Known only
/// when this attempt published at least that many (older ones on disk may be kept
/// otherwise).
/// Every sink subtask's state among `snapshots`, `(subtask, state)`.
fn sink_states(snapshots: &[lockgate_state::SubtaskSnapshot]) -> Vec<(u16, Vec<u8>)> {
    snapshots
        .iter()
        .filter(|s| s.operator == crate::connector::SINK_UID)
        .map(|s| (s.subtask, s.inline_state.clone()))
        .collect()
}

fn oldest_retained(completed: &[CheckpointId], retain: usize) -> Option<CheckpointId> {
    let retain = retain.max(2);
    if completed.len() < retain {
        return None;
    }
    Some(completed[completed.len() - retain])
}

async fn fail_attempt(tasks: &mut JoinSet<(TaskId, Result<()>)>, e: JobError) -> Result<()> {
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    Err(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_restorable_checkpoint_is_known_once_retention_keeps_only_this_attempt_s() {
        let ids: Vec<CheckpointId> = (4..=8).map(CheckpointId).collect();
        assert_eq!(
            oldest_retained(&ids[..1], 3),
            None,
            "older ones on disk are kept"
        );
        assert_eq!(oldest_retained(&ids[..2], 3), None);
        assert_eq!(oldest_retained(&ids[..3], 3), Some(CheckpointId(4)));
        assert_eq!(oldest_retained(&ids[2..5], 3), Some(CheckpointId(6)));
        // Retention never keeps fewer than two.
        assert_eq!(oldest_retained(&ids[4..5], 1), None);
        assert_eq!(oldest_retained(&ids[3..5], 1), Some(CheckpointId(7)));
        assert_eq!(oldest_retained(&ids[3..5], 0), Some(CheckpointId(7)));
    }
}
