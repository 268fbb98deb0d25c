//! The source cases ([`super::SOURCE_CASES`]): a source under test feeds the
//! exactly-once collecting sink ([`super::collect`]); every record written must be
//! collected exactly once, each split in the order written.

use super::collect::Store;
use super::process::{self, ProcessJob};
use super::{job_builder, runtime, same_multiset, CaseResult};
use crate::connector::SourceSpec;
use crate::error::Result as JobResult;
use crate::job::JobGraph;
use crate::record::Batch;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What a source's tests give the suite: a way to make data sets in its external
/// system.
pub trait SourceTestContext: Send + Sync {
    /// Creates a new, empty data set of `splits` splits (a topic of that many
    /// partitions, a directory of that many files), for one case only.
    fn create(&self, splits: u32) -> Result<Box<dyn SourceFixture>, String>;

    /// The program that runs job files naming this source (`<program> run --config`):
    /// `lockgate` for the built-in connectors, a program of one's own that registers
    /// the connector ([`crate::cli::main_with`]). The process-level cases need it.
    fn program(&self) -> Option<PathBuf> {
        None
    }
}

/// One data set of a case.
pub trait SourceFixture: Send {
    /// Appends `n` records to split `split` and returns their values, in order, as the
    /// source will emit them. Values must be unique within the data set.
    fn write(&mut self, split: u32, n: usize) -> Result<Vec<Vec<u8>>, String>;

    /// The source reading this data set. Bounded: a job of it finishes once it has
    /// read what was written before the job first started (and completes a final
    /// checkpoint). Unbounded: it runs until stopped and reads what is written later.
    fn spec(&self, bounded: bool) -> Result<SourceSpec, String>;

    /// Whether the source can run unbounded. A source that cannot (a generator) is
    /// given more records between two bounded runs instead, and must read them after
    /// a restore.
    fn unbounded(&self) -> bool {
        true
    }

    /// The source's job-file section reading this data set, as `(name, TOML body)`
    /// of `[source.<name>]`, for the process-level cases. A bounded-only source should
    /// pace itself here, so that a run lasts long enough to be killed mid-stream.
    fn section(&self, _bounded: bool) -> Result<(String, String), String> {
        Err("the fixture has no job-file section (SourceFixture::section)".into())
    }
}

/// The data a case wrote, per split, in order.
struct Written {
    splits: Vec<Vec<Vec<u8>>>,
}

impl Written {
    fn new(splits: u32) -> Written {
        Written {
            splits: vec![Vec::new(); splits as usize],
        }
    }

    fn write(&mut self, f: &mut dyn SourceFixture, per_split: usize) -> CaseResult {
        for (j, split) in self.splits.iter_mut().enumerate() {
            split.extend(f.write(j as u32, per_split)?);
        }
        Ok(())
    }

    fn total(&self) -> usize {
        self.splits.iter().map(Vec::len).sum()
    }

    /// Exactly once, and each split's records in the order written.
    fn check(&self, store: &Store) -> CaseResult {
        let collected: Vec<Vec<u8>> = store.committed().into_iter().map(|c| c.value).collect();
        self.check_values(&collected)
    }

    /// The same over values collected in order.
    fn check_values(&self, collected: &[Vec<u8>]) -> CaseResult {
        let all: Vec<Vec<u8>> = self.splits.iter().flatten().cloned().collect();
        same_multiset(&all, collected)?;
        for (j, split) in self.splits.iter().enumerate() {
            let members: std::collections::HashSet<&[u8]> =
                split.iter().map(Vec::as_slice).collect();
            let order: Vec<&[u8]> = collected
                .iter()
                .map(Vec::as_slice)
                .filter(|v| members.contains(v))
                .collect();
            if let Some(at) = order
                .iter()
                .zip(split)
                .position(|(a, b)| *a != b.as_slice())
            {
                return Err(format!(
                    "split {j}: records collected out of the order written: at {at}, {} where {} was written",
                    String::from_utf8_lossy(order[at]),
                    String::from_utf8_lossy(&split[at])
                ));
            }
        }
        Ok(())
    }
}

fn job(
    name: &str,
    dir: &Path,
    parallelism: u16,
    source: SourceSpec,
    store: &Store,
    pace: u64,
    fail: Option<Arc<FailOnce>>,
) -> Result<JobGraph, String> {
    let mut b = job_builder(name, dir, parallelism).source_spec(source);
    if let Some(f) = fail {
        b = b.operator("fail_once", move |_| {
            Box::new(FailingOperator::new(f.clone()))
        });
    }
    b.sink_spec(store.spec(pace))
        .build()
        .map_err(|e| format!("the job does not build: {e}"))
}

/// A failure injected once per case: the first subtask that has passed `after`
/// records and seen a checkpoint complete fails.
pub struct FailOnce {
    after: u64,
    fired: AtomicBool,
}

impl FailOnce {
    /// Fails once, after `after` records and a completed checkpoint.
    pub fn new(after: u64) -> Arc<FailOnce> {
        Arc::new(FailOnce {
            after,
            fired: AtomicBool::new(false),
        })
    }

    /// Whether the failure happened.
    pub fn fired(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }
}

/// The operator that raises a [`FailOnce`].
pub struct FailingOperator {
    f: Arc<FailOnce>,
    seen: u64,
    checkpointed: bool,
}

impl FailingOperator {
    pub fn new(f: Arc<FailOnce>) -> FailingOperator {
        FailingOperator {
            f,
            seen: 0,
            checkpointed: false,
        }
    }
}

impl crate::connector::Operator for FailingOperator {
    fn process(&mut self, batch: Batch, out: &mut Batch) -> JobResult<()> {
        self.seen += batch.len() as u64;
        if self.checkpointed
            && self.seen >= self.f.after
            && !self.f.fired.swap(true, Ordering::SeqCst)
        {
            return Err(crate::error::JobError::task(
                "fail_once",
                "a failure injected by the conformance suite",
            ));
        }
        out.extend(batch);
        Ok(())
    }

    fn notify_checkpoint_complete(&mut self, _: lockgate_state::CheckpointId) -> JobResult<()> {
        self.checkpointed = true;
        Ok(())
    }
}

/// The records per split of most cases.
const PER_SPLIT: usize = 1_000;
/// The collecting sink's pace per subtask in the cases that stop or fail mid-stream.
const PACE: u64 = 1_000;

/// Case `single_split`.
pub fn single_split(cx: &dyn SourceTestContext, dir: &Path) -> CaseResult {
    let mut f = cx.create(1)?;
    let mut w = Written::new(1);
    w.write(f.as_mut(), PER_SPLIT)?;
    let store = Store::default();
    let rt = runtime();
    super::run_to_end(
        &rt,
        &job("single_split", dir, 1, f.spec(true)?, &store, 0, None)?,
        None,
    )?;
    w.check(&store)
}

/// Case `multiple_splits`.
pub fn multiple_splits(cx: &dyn SourceTestContext, dir: &Path) -> CaseResult {
    let mut f = cx.create(5)?;
    let mut w = Written::new(5);
    w.write(f.as_mut(), PER_SPLIT)?;
    let store = Store::default();
    let rt = runtime();
    super::run_to_end(
        &rt,
        &job("multiple_splits", dir, 2, f.spec(true)?, &store, 0, None)?,
        None,
    )?;
    w.check(&store)
}

/// Runs `g` until `done` holds, then stops it with a final checkpoint: unbounded runs
/// end so. A bounded run (`bounded`) runs to its end instead.
fn run_until(
    rt: &tokio::runtime::Runtime,
    g: &JobGraph,
    bounded: bool,
    what: &str,
    done: impl FnMut() -> bool,
) -> CaseResult {
    if bounded {
        super::run_to_end(rt, g, None).map(|_| ())
    } else {
        super::run_and_stop(rt, g, what, done).map(|_| ())
    }
}

/// Case `stop_write_more_restart`.
pub fn stop_write_more_restart(cx: &dyn SourceTestContext, dir: &Path) -> CaseResult {
    let mut f = cx.create(3)?;
    let mut w = Written::new(3);
    w.write(f.as_mut(), PER_SPLIT)?;
    let store = Store::default();
    let rt = runtime();
    let bounded = !f.unbounded();
    let name = "stop_write_more_restart";
    let total = w.total();
    let first = job(name, dir, 2, f.spec(bounded)?, &store, 0, None)?;
    run_until(&rt, &first, bounded, "every record was collected", || {
        store.committed_len() >= total
    })?;
    w.check(&store)
        .map_err(|e| format!("before the restart: {e}"))?;
    w.write(f.as_mut(), PER_SPLIT / 2)?;
    let total = w.total();
    let second = job(name, dir, 2, f.spec(bounded)?, &store, 0, None)?;
    run_until(
        &rt,
        &second,
        bounded,
        "the new records were collected",
        || store.committed_len() >= total,
    )?;
    w.check(&store)
}

/// The first run of a case that must stop mid-stream: read through the paced
/// collecting sink and stopped (a final checkpoint) once a checkpoint with records
/// completed and `ready` holds. A source that can run unbounded then gets a second
/// half written after the stop, so that every split continues from a restored
/// position however large its batches are; a bounded-only source must not have
/// reached its end.
fn first_half(
    f: &mut dyn SourceFixture,
    w: &mut Written,
    rt: &tokio::runtime::Runtime,
    make: &dyn Fn(SourceSpec, u64) -> Result<JobGraph, String>,
    store: &Store,
    mut ready: impl FnMut() -> bool,
) -> CaseResult {
    let unbounded = f.unbounded();
    w.write(f, PER_SPLIT * 3)?;
    super::run_and_stop(
        rt,
        &make(f.spec(!unbounded)?, PACE)?,
        "a checkpoint with records",
        || store.committed_len() > 0 && ready(),
    )?;
    if unbounded {
        w.write(f, PER_SPLIT)?;
    } else if store.committed_len() >= w.total() {
        return Err("the first run read everything: it was to be stopped mid-stream".into());
    }
    Ok(())
}

/// The second run of such a case, to the end of what was written.
fn second_half(
    f: &dyn SourceFixture,
    w: &Written,
    rt: &tokio::runtime::Runtime,
    make: &dyn Fn(SourceSpec, u64) -> Result<JobGraph, String>,
    store: &Store,
) -> Result<crate::runtime::RunSummary, String> {
    let total = w.total();
    if f.unbounded() {
        super::run_and_stop(
            rt,
            &make(f.spec(false)?, 0)?,
            "every record was collected",
            || store.committed_len() >= total,
        )
    } else {
        super::run_to_end(rt, &make(f.spec(true)?, 0)?, None)
    }
}

fn rescale(cx: &dyn SourceTestContext, dir: &Path, from: u16, to: u16) -> CaseResult {
    let mut f = cx.create(4)?;
    let mut w = Written::new(4);
    let store = Store::default();
    let rt = runtime();
    let before = |spec: SourceSpec, pace: u64| job("rescale", dir, from, spec, &store, pace, None);
    let after = |spec: SourceSpec, pace: u64| job("rescale", dir, to, spec, &store, pace, None);
    first_half(f.as_mut(), &mut w, &rt, &before, &store, || true)?;
    second_half(f.as_ref(), &w, &rt, &after, &store)?;
    w.check(&store)
}

/// Case `rescale_up`: 2 -> 4.
pub fn rescale_up(cx: &dyn SourceTestContext, dir: &Path) -> CaseResult {
    rescale(cx, dir, 2, 4)
}

/// Case `rescale_down`: 4 -> 2.
pub fn rescale_down(cx: &dyn SourceTestContext, dir: &Path) -> CaseResult {
    rescale(cx, dir, 4, 2)
}

/// Case `metrics_count_records`.
pub fn metrics_count_records(cx: &dyn SourceTestContext, dir: &Path) -> CaseResult {
    let mut f = cx.create(3)?;
    let mut w = Written::new(3);
    w.write(f.as_mut(), PER_SPLIT)?;
    let store = Store::default();
    let rt = runtime();
    let g = job("metrics", dir, 2, f.spec(true)?, &store, 0, None)?;
    let telemetry = crate::telemetry::Telemetry::new(&g.name, &g.describe(), 2, 16);
    super::run_to_end(&rt, &g, Some(telemetry.clone()))?;
    w.check(&store)?;
    let counted = super::records_out(&telemetry, &g.name, "source", 2);
    if counted != w.total() as u64 {
        return Err(format!(
            "lockgate_records_out_total of the source counts {counted}, {} were read",
            w.total()
        ));
    }
    Ok(())
}

/// Case `idle_subtask`.
pub fn idle_subtask(cx: &dyn SourceTestContext, dir: &Path) -> CaseResult {
    let mut f = cx.create(1)?;
    let mut w = Written::new(1);
    w.write(f.as_mut(), PER_SPLIT)?;
    let store = Store::default();
    let rt = runtime();
    let g = job("idle_subtask", dir, 3, f.spec(true)?, &store, 0, None)?;
    let done = rt.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(120),
            crate::runtime::run(&g, Default::default()),
        )
        .await
    });
    match done {
        Err(_) => {
            return Err("the bounded job did not finish within 120 s with two idle subtasks".into())
        }
        Ok(r) => r.map_err(|e| format!("the run failed: {e}"))?,
    };
    w.check(&store)
}

/// Case `failure_mid_stream`.
pub fn failure_mid_stream(cx: &dyn SourceTestContext, dir: &Path) -> CaseResult {
    let mut f = cx.create(3)?;
    let mut w = Written::new(3);
    let store = Store::default();
    let rt = runtime();
    let fail = FailOnce::new(1);
    let summary = if f.unbounded() {
        // The failure comes with the first records after a completed checkpoint: the
        // second half, written once the first is committed.
        w.write(f.as_mut(), PER_SPLIT)?;
        let g = job(
            "failure",
            dir,
            2,
            f.spec(false)?,
            &store,
            0,
            Some(fail.clone()),
        )?;
        let (tx, rx) = tokio::sync::watch::channel(false);
        let run = {
            let g = g.clone();
            rt.spawn(async move {
                crate::runtime::run(
                    &g,
                    crate::runtime::RunOptions {
                        stop: Some(rx),
                        ..Default::default()
                    },
                )
                .await
            })
        };
        let half = w.total();
        super::wait_for(
            || store.committed_len() >= half,
            "the first half to be committed",
        )?;
        w.write(f.as_mut(), PER_SPLIT)?;
        let total = w.total();
        super::wait_for(
            || fail.fired() && store.committed_len() >= total,
            "the failure and every record after it",
        )?;
        let _ = tx.send(true);
        rt.block_on(run)
            .map_err(|e| format!("the run panicked: {e}"))?
            .map_err(|e| format!("the run failed: {e}"))?
    } else {
        w.write(f.as_mut(), PER_SPLIT * 3)?;
        let g = job(
            "failure",
            dir,
            2,
            f.spec(true)?,
            &store,
            PACE,
            Some(fail.clone()),
        )?;
        super::run_to_end(&rt, &g, None)?
    };
    if !fail.fired() || summary.restarts == 0 {
        return Err(format!(
            "the injected failure did not happen mid-stream (fired: {}, restarts: {})",
            fail.fired(),
            summary.restarts
        ));
    }
    w.check(&store)
}

/// Case `corrupt_newest_checkpoint`.
pub fn corrupt_newest_checkpoint(cx: &dyn SourceTestContext, dir: &Path) -> CaseResult {
    let mut f = cx.create(3)?;
    let mut w = Written::new(3);
    let store = Store::default();
    let rt = runtime();
    let make = |spec: SourceSpec, pace: u64| job("corrupt", dir, 2, spec, &store, pace, None);
    // Two checkpoints before the stop's final one: the fallback passes committed output.
    first_half(f.as_mut(), &mut w, &rt, &make, &store, || {
        super::complete_checkpoints(dir).len() >= 2
    })?;
    let corrupted = super::corrupt_newest(dir)?;
    let in_corrupted = store.committed_by(super::checkpoint_id(&corrupted));
    let summary = second_half(f.as_ref(), &w, &rt, &make, &store)?;
    super::fell_back(&summary, &corrupted)?;
    // What the damaged checkpoint had committed is output of a checkpoint that no
    // longer counts: it must have been taken back (and read again).
    if store.rolled_back() < in_corrupted {
        return Err(format!(
            "{corrupted} had committed {in_corrupted} records; the fallback took back {}",
            store.rolled_back()
        ));
    }
    w.check(&store)
}

/// The file sink the process-level cases read a source through.
fn file_sink(job: &ProcessJob) -> (String, String) {
    (
        "file".into(),
        format!("dir = {:?}", job.out().display().to_string()),
    )
}

/// Runs an unbounded job until the file sink committed `total` records, then stops it.
fn read_all(job: &ProcessJob, total: usize) -> CaseResult {
    let committed = || job.committed_lines().map_or(0, |l| l.len());
    job.run_until_then_stop(
        || committed() >= total,
        || format!("{} of {total} records committed", committed()),
    )
}

fn program(cx: &dyn SourceTestContext) -> Result<PathBuf, String> {
    cx.program().ok_or_else(|| {
        "the context names no program for the process-level cases (SourceTestContext::program)"
            .into()
    })
}

/// Case `sigkill_at_seeded_moments`: three runs, each killed with SIGKILL at a seeded
/// moment of the checkpoint protocol ([`process::KillAt`]; a source that can run
/// unbounded gets more records before each), then a run to the end.
pub fn sigkill_at_seeded_moments(cx: &dyn SourceTestContext, dir: &Path) -> CaseResult {
    let job = ProcessJob::new(&program(cx)?, dir)?;
    let mut f = cx.create(3)?;
    let mut w = Written::new(3);
    let (schedule, note) = process::kill_schedule(20261204, 3, process::CHECKPOINT_KILL_POINTS);
    let unbounded = f.unbounded();
    if !unbounded {
        w.write(f.as_mut(), PER_SPLIT * 3)?;
    }
    let mut kills = 0;
    for at in schedule {
        if unbounded {
            w.write(f.as_mut(), PER_SPLIT)?;
        }
        job.write(&f.section(!unbounded)?, &file_sink(&job))?;
        let killed = job.kill_at(at).map_err(|e| format!("{e} {note}"))?;
        kills += usize::from(killed);
    }
    // A bounded run may end before its kill; the first one must not.
    if kills == 0 || (unbounded && kills < 3) {
        return Err(format!(
            "{kills} of 3 runs were killed: the runs ended first {note}"
        ));
    }
    let total = w.total();
    if unbounded {
        read_all(&job, total)?;
    } else {
        job.run_to_end()?;
    }
    w.check_values(&job.committed_lines()?)
        .map_err(|e| format!("{e} {note}"))
}

/// Case `failpoint_windows`: for each window of the checkpoint protocol
/// ([`process::WINDOWS`], and the two-phase commit of the file sink), a run aborted
/// there after a completed checkpoint, then a run to the end.
pub fn failpoint_windows(cx: &dyn SourceTestContext, dir: &Path) -> CaseResult {
    let program = program(cx)?;
    let windows = process::WINDOWS
        .iter()
        .copied()
        .chain(["after-part-commit"]);
    // A context that cannot make a fixture at all fails once, not in every window.
    drop(cx.create(3)?);
    super::every_window(windows, |window| {
        let job = ProcessJob::new(&program, &dir.join(window))?;
        let mut f = cx.create(3)?;
        let mut w = Written::new(3);
        let unbounded = f.unbounded();
        w.write(
            f.as_mut(),
            if unbounded { PER_SPLIT } else { PER_SPLIT * 3 },
        )?;
        job.write(&f.section(!unbounded)?, &file_sink(&job))?;
        job.abort_at(window).map_err(|e| format!("{window}: {e}"))?;
        if unbounded {
            w.write(f.as_mut(), PER_SPLIT)?;
            read_all(&job, w.total())
        } else {
            job.run_to_end()
        }
        .map_err(|e| format!("{window}: {e}"))?;
        w.check_values(&job.committed_lines()?)
            .map_err(|e| format!("after an abort at {window}: {e}"))
    })
}

/// Runs the source case `name` against `cx` in a fresh checkpoint directory below
/// `tmp`; `Err` says what went wrong.
pub fn run_case(name: &str, cx: &dyn SourceTestContext, tmp: &Path) -> CaseResult {
    let dir = tmp.join(name).join("checkpoints");
    let case: fn(&dyn SourceTestContext, &Path) -> CaseResult = match name {
        "single_split" => single_split,
        "multiple_splits" => multiple_splits,
        "stop_write_more_restart" => stop_write_more_restart,
        "rescale_up" => rescale_up,
        "rescale_down" => rescale_down,
        "metrics_count_records" => metrics_count_records,
        "idle_subtask" => idle_subtask,
        "failure_mid_stream" => failure_mid_stream,
        "corrupt_newest_checkpoint" => corrupt_newest_checkpoint,
        "sigkill_at_seeded_moments" => sigkill_at_seeded_moments,
        "failpoint_windows" => failpoint_windows,
        other => return Err(format!("no source case {other}")),
    };
    case(cx, &dir)
}

/// Runs source case `name` against the context `cx` and panics with the case's name
/// and what went wrong: what each generated test calls.
pub fn assert_case(name: &str, cx: &dyn SourceTestContext) {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    if let Err(e) = run_case(name, cx, tmp.path()) {
        panic!("source conformance case {name} failed: {e}");
    }
}

/// Expands into one `#[test]` per source case ([`crate::testkit::conformance::SOURCE_CASES`]),
/// each calling `$cx` for a fresh context:
///
/// ```ignore
/// lockgate::source_conformance!(my_context());
/// ```
#[macro_export]
macro_rules! source_conformance {
    ($cx:expr) => {
        $crate::source_conformance!(@cases $cx;
            single_split, multiple_splits, stop_write_more_restart, rescale_up,
            rescale_down, metrics_count_records, idle_subtask, failure_mid_stream,
            corrupt_newest_checkpoint, sigkill_at_seeded_moments, failpoint_windows);
    };
    (@cases $cx:expr; $($case:ident),*) => {
        $(
            #[test]
            fn $case() {
                let cx = $cx;
                $crate::testkit::conformance::source::assert_case(stringify!($case), &cx);
            }
        )*
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_listed_case_runs() {
        struct Nothing;
        impl super::SourceTestContext for Nothing {
            fn create(&self, _: u32) -> Result<Box<dyn super::SourceFixture>, String> {
                Err("no data".into())
            }
            fn program(&self) -> Option<std::path::PathBuf> {
                Some("/nonexistent".into())
            }
        }
        let tmp = tempfile::tempdir().unwrap();
        for (name, _) in super::super::SOURCE_CASES {
            let e = super::run_case(name, &Nothing, tmp.path()).unwrap_err();
            assert_eq!(e, "no data", "{name}");
        }
    }
}
