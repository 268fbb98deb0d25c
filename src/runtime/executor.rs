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
    let mut coord = Coordinator::new(cfg, all.clone(), sources.clone(), *next_id, 0);
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut triggered_at: Option<(CheckpointId, Instant)> = None;
    let since_trigger = |triggered_at: &Option<(CheckpointId, Instant)>, id: CheckpointId| {
        triggered_at
            .filter(|t| t.0 == id)
            .map_or(0, |t| t.1.elapsed().as_millis() as u64)
    };
    telemetry.set_state(JobState::Running);
    // Aborted checkpoints whose directories are not removed yet: a subtask may still be
    // writing its snapshot into one (an expired checkpoint's keyed subtask in the middle
    // of its RocksDB checkpoint). Subtasks take barriers in order, so once a later
    // checkpoint is published none of them touches an older one any more.
    let mut aborted: Vec<CheckpointId> = Vec::new();
    // The newest checkpoints this attempt published (at most as many as retention
    // keeps), oldest first: once there are that many, they are what retention keeps.
    let mut completed: Vec<CheckpointId> = Vec::new();
    let mut stop_seen = false;
    let mut retention: Option<tokio::task::JoinHandle<()>> = None;
    let mut running = all.len();
    let send_all = |msg: Control| {
        for (_, c) in &controls {
            let _ = c.send(msg.clone());
        }
    };
    let send_sources = |msg: Control| {
        for (t, c) in &controls {
            if t.vertex == 0 {
                let _ = c.send(msg.clone());
            }
        }
    };

    // The control API's requests are read with the coordinator's clock. A pause holds
    // across in-process restarts (`wire` queued `Pause` before a new attempt's sources
    // started); the job says paused once every source confirmed it. A checkpoint
    // asked for is triggered as soon as none is pending.
    let mut paused = start_paused;
    let mut paused_sources: HashSet<TaskId> = HashSet::new();
    let mut follow_control = |coord: &mut Coordinator| -> Option<bool> {
        let c = control?;
        let mut changed = None;
        if c.is_paused() != paused {
            paused = c.is_paused();
            send_sources(if paused {
                Control::Pause
            } else {
                Control::Resume
            });
            info!(job = %job.name, paused, "{} by the control API", if paused { "pause" } else { "resume" });
            changed = Some(paused);
        }
        if c.take_requests(coord.next_id()) {
            info!(job = %job.name, checkpoint = %coord.next_id(), "checkpoint asked for by the control API");
            coord.request_checkpoint();
        }
        changed
    };

    // Every return of the loop below leaves through here: a retention pass still
    // running ends before the attempt does, so that nothing of this attempt touches the
    // checkpoint directory afterwards.
    let outcome: Result<()> = async {
        loop {
            let mut actions = Vec::new();
            tokio::select! {
                _ = tick.tick() => {
                    if follow_control(&mut coord) == Some(false) {
                        paused_sources.clear();
                        telemetry.set_paused(false);
                    }
                    actions = coord.poll(now_ms(start))
                }
                r = report_rx.recv(), if running > 0 => match r {
                    Some(Report::Ack { id, task, positions, snapshots }) => {
                        telemetry.checkpoint_acked(id.0, task_name(task), task.vertex, task.subtask, since_trigger(&triggered_at, id));
                        actions = coord.on_ack(id, task, positions, snapshots)
                    }
                    Some(Report::Decline { id, task, reason }) => actions = coord.on_decline(id, task, &reason, now_ms(start)),
                    Some(Report::SourceFinished { task }) => coord.on_source_finished(task),
                    Some(Report::Paused { task }) => {
                        // A confirmation that raced a resume is stale.
                        let fresh = control.is_some_and(|c| c.is_paused()) && paused_sources.insert(task);
                        if fresh && paused_sources.len() == sources.len() {
                            telemetry.set_paused(true);
                            info!(job = %job.name, "every source paused: nothing is read until resumed");
                        }
                    }
                    None => {}
                },
                j = tasks.join_next() => match j {
                    Some(Ok((_, Ok(())))) => {
                        running -= 1;
                        if running == 0 {
                            if coord.is_finished() {
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
                    None => return if coord.is_finished() { Ok(()) } else { Err(JobError::Other("no tasks".into())) },
                },
                _ = stop_requested(stop), if !stop_seen => {
                    stop_seen = true;
                    info!(job = %job.name, "stop requested: finishing with a final checkpoint");
                    coord.on_stop();
                    telemetry.set_state(JobState::Stopping);
                    send_sources(Control::Stop);
                }
            }
            let mut queue: std::collections::VecDeque<Action> = actions.into();
            while let Some(action) = queue.pop_front() {
                match action {
                    Action::Trigger { id, is_final } => {
                        // The coordinator owns the sequence; the next attempt starts where
                        // it stands.
                        *next_id = coord.next_id();
                        if let Err(e) = tokio::task::block_in_place(|| dir.begin(id)) {
                            return fail_attempt(&mut tasks, e.into()).await;
                        }
                        triggered_at = Some((id, Instant::now()));
                        telemetry.checkpoint_triggered(id.0, is_final);
                        crate::fault::checkpoint_triggered();
                        tracing::debug!(checkpoint = %id, is_final, "checkpoint triggered");
                        send_sources(Control::Trigger { id, is_final });
                    }
                    Action::Publish {
                        id,
                        is_final,
                        positions,
                        snapshots,
                    } => {
                        let (meta, size_bytes) =
                            checkpoint_metadata(job, id, is_final, positions, snapshots);
                        // The previous retention pass ends before this publish: the two never
                        // list and rename in the checkpoint directory at the same time.
                        if let Some(r) = retention.take() {
                            let _ = r.await;
                        }
                        let published = match publish(dir, store, meta).await {
                            Ok(p) => p,
                            Err(e) => return fail_attempt(&mut tasks, e).await,
                        };
                        match published {
                            Ok(path) => {
                                coord.on_published(id, now_ms(start));
                                let took = since_trigger(&triggered_at, id);
                                telemetry.checkpoint_completed(id.0, took, size_bytes, &path);
                                summary.checkpoints += 1;
                                summary.last_checkpoint = Some(id);
                                summary.checkpoint_durations_ms.push(took);
                                info!(checkpoint = %id, path = %path, duration_ms = took, is_final, "checkpoint completed");
                                crate::fault::after_publish();
                                crate::fault::checkpoint_completed();
                                completed.push(id);
                                if completed.len() > job.checkpoint.retain.max(2) {
                                    completed.remove(0);
                                }
                                send_all(Control::Complete {
                                    id,
                                    is_final,
                                    restorable_from: oldest_retained(&completed, job.checkpoint.retain),
                                });
                                if let Some(c) = control {
                                    c.completed(id, &path.to_string());
                                }
                                // Retention is housekeeping after the publish (deleting an old
                                // checkpoint's files costs as much as it holds): it runs beside
                                // the job, and its failure does not undo the publish.
                                // The directories of aborted checkpoints older than this one go
                                // in the same task, after retention, so that the two never
                                // work on one directory at once (a checkpoint whose publish
                                // failed after its `_metadata` was renamed in can be both).
                                let (done, later): (Vec<_>, Vec<_>) =
                                    aborted.iter().partition(|a| **a < id);
                                aborted = later;
                                retention = Some(spawn_retention(
                                    dir.clone(),
                                    store.cloned(),
                                    job.checkpoint.retain,
                                    done,
                                ));
                            }
                            Err(e) => {
                                queue.extend(coord.on_publish_failed(id, e.to_string(), now_ms(start)))
                            }
                        }
                    }
                    Action::Abort { id, cause, reason } => {
                        warn!(checkpoint = %id, reason = %reason, "checkpoint aborted");
                        let status = match cause {
                            AbortCause::Declined => CheckpointStatus::Declined,
                            AbortCause::Expired => CheckpointStatus::TimedOut,
                            AbortCause::PublishFailed => CheckpointStatus::Failed,
                        };
                        telemetry.checkpoint_aborted(id.0, status, since_trigger(&triggered_at, id), &reason);
                        if let Some(c) = control {
                            c.aborted(id, &reason);
                        }
                        // Removed once a later checkpoint is published (or at the next start).
                        aborted.push(id);
                        send_all(Control::Aborted { id });
                    }
                    Action::Fail { failures, last } => {
                        return fail_attempt(
                            &mut tasks,
                            JobError::TooManyCheckpointFailures {
                                failures,
                                tolerable: job.checkpoint.tolerable_failures,
                                last,
                            },
                        )
                        .await;
                    }
                }
            }
        }
    }
    .await;
    if let Some(r) = retention.take() {
        let _ = r.await;
    }
    outcome
}

/// Ends a failed attempt: aborts every task and waits until all are gone, so that
/// no task of this attempt still touches the working state when the next one starts.
/// The oldest checkpoint retention keeps once the last of `completed` (this attempt's
/// published checkpoints, in order) is published: retention keeps the newest `retain`,
/// and never fewer than two (`lockgate_state::restore::retention_victims`). Known only
/// when this attempt published at least that many (older ones on disk may be kept
/// otherwise).
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
