//! The sink cases ([`super::SINK_CASES`]): the sequence source (records
//! `{"seq": i, "key": i % 100, "value": i}`, `i` from 1) feeds the sink under test;
//! what the destination holds afterwards must be the input, as the sink's declared
//! guarantee says.

use super::process::{self, ProcessJob};
use super::source::{FailOnce, FailingOperator};
use super::{job_builder, runtime, same_as, CaseResult};
use crate::connector::{Guarantee, SinkSpec};
use crate::connectors::sequence::{SequenceConfig, SequenceSource};
use crate::job::JobGraph;
use crate::testkit::verdict::Expect;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a sink's tests give the suite: a way to make destinations in its external
/// system.
pub trait SinkTestContext: Send + Sync {
    /// Creates a new, empty destination (an index, a directory, a topic), for one
    /// case only.
    fn create(&self) -> Result<Box<dyn SinkFixture>, String>;

    /// The program that runs job files naming this sink (`<program> run --config`);
    /// the process-level cases need it (see [`super::source::SourceTestContext::program`]).
    fn program(&self) -> Option<PathBuf> {
        None
    }
}

/// One destination of a case.
pub trait SinkFixture: Send {
    /// The sink writing into this destination; its caps' guarantee is what the case
    /// checks.
    fn spec(&self) -> Result<SinkSpec, String>;

    /// What the destination holds now, as it is visible to its readers (committed
    /// output only): one JSON value per record or document. Called while a job runs,
    /// too (`visibility_at_checkpoints`), so it must not fail on work in progress.
    fn read(&self) -> Result<Vec<Value>, String>;

    /// After a finished run: `Err` when the destination holds work left half done
    /// (a prepared transaction, an unfinished upload), which [`check`] reports.
    fn settled(&self) -> Result<(), String> {
        Ok(())
    }

    /// The sink's job-file section writing into this destination, as `(name, TOML
    /// body)` of `[sink.<name>]`, for the process-level cases.
    fn section(&self) -> Result<(String, String), String> {
        Err("the fixture has no job-file section (SinkFixture::section)".into())
    }
}

/// The records of most cases.
const RECORDS: i64 = 4_000;
/// The input's pace in the cases that stop or fail mid-stream (records per second).
const PACE: u64 = 4_000;
/// The records of the cases that stop or fail mid-stream: five seconds at [`PACE`], so
/// that the stop after three checkpoints, or the failure after the first, comes long
/// before the end.
const STOP_RECORDS: i64 = 20_000;
/// The records of the SIGKILL case: fifteen seconds at [`PACE`]. Its three runs each
/// go on from the last one's checkpoint until a kill up to seven checkpoints or sixty
/// source batches in: on a busy machine checkpoints come later and batches hold more,
/// and five seconds of input ran out before the third kill.
const KILL_RECORDS: i64 = 60_000;

fn sequence(to: i64, rate_per_sec: u64) -> SequenceConfig {
    SequenceConfig {
        from: 1,
        to,
        keys: 100,
        rate_per_sec,
        splits: 16,
    }
}

/// The input, as the sink receives it.
pub fn expected(to: i64) -> Vec<Value> {
    (1..=to)
        .map(|i| {
            serde_json::from_slice(&crate::connectors::sequence::record_json(i, 100))
                .expect("the sequence writes JSON")
        })
        .collect()
}

/// A JSON value's text with every object's keys sorted: equal values, equal text.
pub fn canonical(v: &Value) -> Vec<u8> {
    fn sort(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let sorted: std::collections::BTreeMap<&String, Value> =
                    m.iter().map(|(k, v)| (k, sort(v))).collect();
                Value::Object(sorted.into_iter().map(|(k, v)| (k.clone(), v)).collect())
            }
            Value::Array(a) => Value::Array(a.iter().map(sort).collect()),
            other => other.clone(),
        }
    }
    serde_json::to_vec(&sort(v)).expect("JSON serializes")
}

/// Checks what `f` holds against `expected`, as `guarantee` promises.
pub fn check(f: &dyn SinkFixture, guarantee: Guarantee, expected: &[Value]) -> CaseResult {
    f.settled()?;
    let found: Vec<Vec<u8>> = f.read()?.iter().map(canonical).collect();
    let expected: Vec<Vec<u8>> = expected.iter().map(canonical).collect();
    let expect = match guarantee {
        Guarantee::ExactlyOnce | Guarantee::Idempotent => Expect::Exact,
        Guarantee::AtLeastOnce => Expect::AtLeastOnce,
    };
    same_as(&expected, &found, expect).map_err(|e| format!("{guarantee:?}: {e}"))
}

fn job(
    name: &str,
    dir: &Path,
    parallelism: u16,
    input: SequenceConfig,
    sink: SinkSpec,
    fail: Option<Arc<FailOnce>>,
) -> Result<JobGraph, String> {
    let mut b = job_builder(name, dir, parallelism).source_spec(SequenceSource::spec(input));
    if let Some(f) = fail {
        b = b.operator("fail_once", move |_| {
            Box::new(FailingOperator::new(f.clone()))
        });
    }
    b.sink_spec(sink)
        .build()
        .map_err(|e| format!("the job does not build: {e}"))
}

fn bounded(cx: &dyn SinkTestContext, dir: &Path, parallelism: u16) -> CaseResult {
    let f = cx.create()?;
    let spec = f.spec()?;
    let g = spec.caps.guarantee;
    super::run_to_end(
        &runtime(),
        &job(
            "bounded",
            dir,
            parallelism,
            sequence(RECORDS, 0),
            spec,
            None,
        )?,
        None,
    )?;
    check(f.as_ref(), g, &expected(RECORDS))
}

/// Case `single_subtask`.
pub fn single_subtask(cx: &dyn SinkTestContext, dir: &Path) -> CaseResult {
    bounded(cx, dir, 1)
}

/// Case `several_subtasks`.
pub fn several_subtasks(cx: &dyn SinkTestContext, dir: &Path) -> CaseResult {
    bounded(cx, dir, 3)
}

/// The first run of the cases that stop mid-stream: the paced input at `parallelism`,
/// stopped (a final checkpoint) after three checkpoints, long before its end.
fn first_run(
    rt: &tokio::runtime::Runtime,
    f: &dyn SinkFixture,
    dir: &Path,
    parallelism: u16,
) -> CaseResult {
    let g = job(
        "stop",
        dir,
        parallelism,
        sequence(STOP_RECORDS, PACE),
        f.spec()?,
        None,
    )?;
    super::run_and_stop(rt, &g, "three checkpoints", || {
        super::complete_checkpoints(dir).len() >= 3
    })?;
    if f.read()?.len() as i64 >= STOP_RECORDS {
        return Err("the first run wrote everything: no stop mid-stream".into());
    }
    Ok(())
}

/// The second: the rest of the input at full speed, at `parallelism`.
fn last_run(
    rt: &tokio::runtime::Runtime,
    f: &dyn SinkFixture,
    dir: &Path,
    parallelism: u16,
) -> Result<crate::runtime::RunSummary, String> {
    let g = job(
        "stop",
        dir,
        parallelism,
        sequence(STOP_RECORDS, 0),
        f.spec()?,
        None,
    )?;
    super::run_to_end(rt, &g, None)
}

/// Stops a paced run at `from` after a few checkpoints, then runs to the end at `to`.
fn stop_then_finish(cx: &dyn SinkTestContext, dir: &Path, from: u16, to: u16) -> CaseResult {
    let f = cx.create()?;
    let g = f.spec()?.caps.guarantee;
    let rt = runtime();
    first_run(&rt, f.as_ref(), dir, from)?;
    last_run(&rt, f.as_ref(), dir, to)?;
    check(f.as_ref(), g, &expected(STOP_RECORDS))
}

/// Case `stop_and_restart`.
pub fn stop_and_restart(cx: &dyn SinkTestContext, dir: &Path) -> CaseResult {
    stop_then_finish(cx, dir, 2, 2)
}

/// Case `rescale_up`: 2 -> 4.
pub fn rescale_up(cx: &dyn SinkTestContext, dir: &Path) -> CaseResult {
    stop_then_finish(cx, dir, 2, 4)
}

/// Case `rescale_down`: 4 -> 2.
pub fn rescale_down(cx: &dyn SinkTestContext, dir: &Path) -> CaseResult {
    stop_then_finish(cx, dir, 4, 2)
}

/// Case `metrics_count_records`.
pub fn metrics_count_records(cx: &dyn SinkTestContext, dir: &Path) -> CaseResult {
    let f = cx.create()?;
    let spec = f.spec()?;
    let g = spec.caps.guarantee;
    let graph = job("metrics", dir, 2, sequence(RECORDS, 0), spec, None)?;
    let telemetry = crate::telemetry::Telemetry::new(&graph.name, &graph.describe(), 2, 16);
    super::run_to_end(&runtime(), &graph, Some(telemetry.clone()))?;
    check(f.as_ref(), g, &expected(RECORDS))?;
    let counted = super::records_out(&telemetry, &graph.name, crate::connector::SINK_UID, 2);
    if counted != RECORDS as u64 {
        return Err(format!(
            "lockgate_records_out_total of the sink counts {counted}, {RECORDS} were written"
        ));
    }
    Ok(())
}

/// Case `failure_mid_stream`.
pub fn failure_mid_stream(cx: &dyn SinkTestContext, dir: &Path) -> CaseResult {
    let f = cx.create()?;
    let spec = f.spec()?;
    let g = spec.caps.guarantee;
    let fail = FailOnce::new(RECORDS as u64 / 8);
    // Five seconds of input: the failure waits for a completed checkpoint, which a busy
    // machine (or a sink whose checkpoint waits for a broker) may take a second to reach.
    let graph = job(
        "failure",
        dir,
        2,
        sequence(STOP_RECORDS, PACE),
        spec,
        Some(fail.clone()),
    )?;
    let summary = super::run_to_end(&runtime(), &graph, None)?;
    if !fail.fired() || summary.restarts == 0 {
        return Err(format!(
            "the injected failure did not happen mid-stream (fired: {}, restarts: {})",
            fail.fired(),
            summary.restarts
        ));
    }
    check(f.as_ref(), g, &expected(STOP_RECORDS))
}

/// Case `corrupt_newest_checkpoint`. A sink whose commits are final
/// ([`crate::connector::SinkCaps::commits_are_final`]) cannot take back what it
/// committed for the damaged checkpoint: nothing may be lost, and the records after
/// the restored checkpoint may be written twice.
pub fn corrupt_newest_checkpoint(cx: &dyn SinkTestContext, dir: &Path) -> CaseResult {
    let f = cx.create()?;
    let g = after_replay(&f.spec()?.caps);
    let rt = runtime();
    first_run(&rt, f.as_ref(), dir, 2)?;
    let corrupted = super::corrupt_newest(dir)?;
    let summary = last_run(&rt, f.as_ref(), dir, 2)?;
    super::fell_back(&summary, &corrupted)?;
    check(f.as_ref(), g, &expected(STOP_RECORDS))
}

/// What a case that replays committed input may find: a sink whose commits are final
/// ([`crate::connector::SinkCaps::commits_are_final`]) cannot take them back, so that
/// it is held to at-least-once there.
fn after_replay(caps: &crate::connector::SinkCaps) -> Guarantee {
    if caps.commits_are_final {
        Guarantee::AtLeastOnce
    } else {
        caps.guarantee
    }
}

/// Case `restore_older_by_path`: a run stopped after three checkpoints, then one started
/// from the second-newest checkpoint by path (`--restore`) and run to the end.
pub fn restore_older_by_path(cx: &dyn SinkTestContext, dir: &Path) -> CaseResult {
    let f = cx.create()?;
    let g = after_replay(&f.spec()?.caps);
    let rt = runtime();
    first_run(&rt, f.as_ref(), dir, 2)?;
    let all = super::complete_checkpoints(dir);
    let Some(older) = all.len().checked_sub(2).map(|i| all[i].clone()) else {
        return Err(format!(
            "{} complete checkpoint(s): an older one needs two",
            all.len()
        ));
    };
    let graph = job("stop", dir, 2, sequence(STOP_RECORDS, 0), f.spec()?, None)?;
    let summary = super::run_with(
        &rt,
        &graph,
        crate::runtime::RunOptions {
            restore: Some(older.clone()),
            ..Default::default()
        },
    )?;
    if summary.restored_from.as_deref() != Some(older.as_path()) {
        return Err(format!(
            "--restore {} restored {:?}",
            older.display(),
            summary.restored_from
        ));
    }
    check(f.as_ref(), g, &expected(STOP_RECORDS))
}

/// Case `fresh_start_over_output`: a paced bounded run to the end over many
/// checkpoints, its checkpoints removed, and the same job run again from nothing, unpaced
/// and so over fewer checkpoints, into the same destination. Checkpoint ids start again
/// at 1 on a fresh start: output named by them is overwritten only up to the fresh
/// run's last checkpoint, so whatever the first run committed after that must be taken
/// back by the sink, or it is there twice.
pub fn fresh_start_over_output(cx: &dyn SinkTestContext, dir: &Path) -> CaseResult {
    let f = cx.create()?;
    let g = after_replay(&f.spec()?.caps);
    let rt = runtime();
    let mut checkpoints = Vec::new();
    for (run, pace) in [("first", PACE), ("fresh", 0)] {
        let _ = std::fs::remove_dir_all(dir);
        let graph = job("fresh", dir, 2, sequence(RECORDS, pace), f.spec()?, None)?;
        let summary = super::run_to_end(&rt, &graph, None)?;
        if summary.restored_from.is_some() {
            return Err(format!(
                "the {run} run restored {:?}",
                summary.restored_from
            ));
        }
        checkpoints.push(summary.checkpoints);
    }
    if checkpoints[0] <= checkpoints[1] {
        return Err(format!(
            "the paced first run completed {} checkpoints and the fresh one {}: the case needs the first to have more",
            checkpoints[0], checkpoints[1]
        ));
    }
    check(f.as_ref(), g, &expected(RECORDS))
}

/// Case `crash_then_rescale`: a paced process at parallelism 2 killed with SIGKILL at a
/// seeded moment of the checkpoint protocol, then resumed at parallelism 3 to the end.
pub fn crash_then_rescale(cx: &dyn SinkTestContext, dir: &Path) -> CaseResult {
    let job = ProcessJob::new(&program(cx)?, dir)?;
    let f = cx.create()?;
    let g = f.spec()?.caps.guarantee;
    let (schedule, note) = process::kill_schedule(20261207, 1, process::KILL_POINTS);
    job.write_at(2, &sequence_section(STOP_RECORDS, PACE), &f.section()?)?;
    if !job
        .kill_at(schedule[0])
        .map_err(|e| format!("{e} {note}"))?
    {
        return Err(format!("the run ended before its kill {note}"));
    }
    job.write_at(3, &sequence_section(STOP_RECORDS, 0), &f.section()?)?;
    job.run_to_end().map_err(|e| format!("{e} {note}"))?;
    check(f.as_ref(), g, &expected(STOP_RECORDS)).map_err(|e| format!("{e} {note}"))
}

/// The sequence source of the process-level cases, `to` records at `rate_per_sec`.
fn sequence_section(to: i64, rate_per_sec: u64) -> (String, String) {
    (
        crate::connectors::sequence::KIND.into(),
        format!("from = 1\nto = {to}\nkeys = 100\nrate_per_sec = {rate_per_sec}"),
    )
}

fn program(cx: &dyn SinkTestContext) -> Result<PathBuf, String> {
    cx.program().ok_or_else(|| {
        "the context names no program for the process-level cases (SinkTestContext::program)".into()
    })
}

/// Case `sigkill_at_seeded_moments`: three paced runs, each killed with SIGKILL at a
/// seeded moment of the checkpoint protocol ([`process::KillAt`]), then a run to the
/// end.
pub fn sigkill_at_seeded_moments(cx: &dyn SinkTestContext, dir: &Path) -> CaseResult {
    let job = ProcessJob::new(&program(cx)?, dir)?;
    let f = cx.create()?;
    let g = f.spec()?.caps.guarantee;
    let (schedule, note) = process::kill_schedule(20261204, 3, process::KILL_POINTS);
    job.write(&sequence_section(KILL_RECORDS, PACE), &f.section()?)?;
    let mut kills = 0;
    for at in schedule {
        let killed = job.kill_at(at).map_err(|e| format!("{e} {note}"))?;
        kills += usize::from(killed);
    }
    if kills < 3 {
        return Err(format!(
            "{kills} of 3 runs were killed: the runs ended first {note}"
        ));
    }
    job.write(&sequence_section(KILL_RECORDS, 0), &f.section()?)?;
    job.run_to_end()?;
    check(f.as_ref(), g, &expected(KILL_RECORDS)).map_err(|e| format!("{e} {note}"))
}

/// Case `failpoint_windows`: for each window of the checkpoint protocol
/// ([`process::WINDOWS`], and for an exactly-once sink the two-phase kit's own:
/// `after-stage`, `before-part-commit` and `after-part-commit`), a paced run aborted
/// there after a completed checkpoint, then a run to the end.
pub fn failpoint_windows(cx: &dyn SinkTestContext, dir: &Path) -> CaseResult {
    let program = program(cx)?;
    let exactly_once = cx.create()?.spec()?.caps.guarantee == Guarantee::ExactlyOnce;
    // An exactly-once sink commits in two phases: also between two commits.
    let two_phase: &[&str] = if exactly_once {
        &["after-stage", "before-part-commit", "after-part-commit"]
    } else {
        &[]
    };
    super::every_window(
        process::WINDOWS.iter().chain(two_phase).copied(),
        |window| {
            let job = ProcessJob::new(&program, &dir.join(window))?;
            let f = cx.create()?;
            let g = f.spec()?.caps.guarantee;
            job.write(&sequence_section(RECORDS, PACE), &f.section()?)?;
            job.abort_at(window).map_err(|e| format!("{window}: {e}"))?;
            job.write(&sequence_section(RECORDS, 0), &f.section()?)?;
            job.run_to_end().map_err(|e| format!("{window}: {e}"))?;
            check(f.as_ref(), g, &expected(RECORDS))
                .map_err(|e| format!("after an abort at {window}: {e}"))
        },
    )
}

/// Runs the sink case `name` against `cx` in a fresh checkpoint directory below
/// `tmp`; `Err` says what went wrong.
pub fn run_case(name: &str, cx: &dyn SinkTestContext, tmp: &Path) -> CaseResult {
    let dir = tmp.join(name).join("checkpoints");
    let case: fn(&dyn SinkTestContext, &Path) -> CaseResult = match name {
        "single_subtask" => single_subtask,
        "several_subtasks" => several_subtasks,
        "stop_and_restart" => stop_and_restart,
        "rescale_up" => rescale_up,
        "rescale_down" => rescale_down,
        "metrics_count_records" => metrics_count_records,
        "failure_mid_stream" => failure_mid_stream,
        "corrupt_newest_checkpoint" => corrupt_newest_checkpoint,
        "sigkill_at_seeded_moments" => sigkill_at_seeded_moments,
        "failpoint_windows" => failpoint_windows,
        "restore_older_by_path" => restore_older_by_path,
        "fresh_start_over_output" => fresh_start_over_output,
        "crash_then_rescale" => crash_then_rescale,
        "visibility_at_checkpoints" => super::visibility::visibility_at_checkpoints,
        other => return Err(format!("no sink case {other}")),
    };
    case(cx, &dir)
}

/// Runs sink case `name` against the context `cx` and panics with the case's name and
/// what went wrong: what each generated test calls.
pub fn assert_case(name: &str, cx: &dyn SinkTestContext) {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    if let Err(e) = run_case(name, cx, tmp.path()) {
        panic!("sink conformance case {name} failed: {e}");
    }
}

/// Expands into one `#[test]` per sink case ([`crate::testkit::conformance::SINK_CASES`]),
/// each calling `$cx` for a fresh context:
///
/// ```ignore
/// lockgate::sink_conformance!(my_context());
/// ```
#[macro_export]
macro_rules! sink_conformance {
    ($cx:expr) => {
        $crate::sink_conformance!(@cases $cx;
            single_subtask, several_subtasks, stop_and_restart, rescale_up, rescale_down,
            metrics_count_records, failure_mid_stream, corrupt_newest_checkpoint,
            sigkill_at_seeded_moments, failpoint_windows, restore_older_by_path,
            fresh_start_over_output, crash_then_rescale, visibility_at_checkpoints);
    };
    (@cases $cx:expr; $($case:ident),*) => {
        $(
            #[test]
            fn $case() {
                let cx = $cx;
                $crate::testkit::conformance::sink::assert_case(stringify!($case), &cx);
            }
        )*
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_case_runs() {
        struct Nothing;
        impl SinkTestContext for Nothing {
            fn create(&self) -> Result<Box<dyn SinkFixture>, String> {
                Err("no destination".into())
            }
            fn program(&self) -> Option<std::path::PathBuf> {
                Some("/nonexistent".into())
            }
        }
        let tmp = tempfile::tempdir().unwrap();
        for (name, _) in super::super::SINK_CASES {
            let e = run_case(name, &Nothing, tmp.path()).unwrap_err();
            assert_eq!(e, "no destination", "{name}");
        }
    }

    #[test]
    fn canonical_text_ignores_key_order() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":{"d":2,"c":3}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"c":3,"d":2},"b":1}"#).unwrap();
        assert_eq!(canonical(&a), canonical(&b));
    }

    #[test]
    fn guarantees_are_checked_as_declared() {
        struct Holds(Vec<Value>);
        impl SinkFixture for Holds {
            fn spec(&self) -> Result<SinkSpec, String> {
                unreachable!()
            }
            fn read(&self) -> Result<Vec<Value>, String> {
                Ok(self.0.clone())
            }
        }
        let input = expected(3);
        let twice = Holds(input.iter().chain(&input[..1]).cloned().collect());
        assert!(check(&twice, Guarantee::ExactlyOnce, &input).is_err());
        assert!(check(&twice, Guarantee::AtLeastOnce, &input).is_ok());
        let short = Holds(input[..2].to_vec());
        assert!(check(&short, Guarantee::AtLeastOnce, &input).is_err());
        assert!(check(&Holds(input.clone()), Guarantee::Idempotent, &input).is_ok());
    }
}
