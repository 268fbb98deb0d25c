//! The connector conformance suite: the same cases for every source and every sink,
//! run from the connector's own tests (Flink's `SourceTestSuiteBase` and
//! `SinkTestSuiteBase`, plus lockgate's recovery cases).
//!
//! A connector supplies a context: a **source** creates data sets in its external
//! system and writes records into each split ([`source::SourceTestContext`]); a **sink**
//! creates empty destinations and reads back what they hold
//! ([`sink::SinkTestContext`]). The suite builds real jobs around it (a source under test
//! feeds an exactly-once collecting sink; a sink under test is fed by the sequence
//! source), runs them in process with checkpoints every 50 ms, stops, fails, rescales
//! and restores them, and checks the result against what the connector promises:
//!
//! - a source: every record written is collected exactly once, each split in the
//!   order written;
//! - a sink: what the destination holds equals the input exactly (as a multiset) when
//!   the sink's spec declares [`crate::connector::Guarantee::ExactlyOnce`] or
//!   [`crate::connector::Guarantee::Idempotent`]; for an at-least-once sink, every
//!   input is there and nothing else.
//!
//! One `#[test]` per case: [`source_conformance!`](crate::source_conformance) and
//! [`sink_conformance!`](crate::sink_conformance) expand into them, named as in
//! [`SOURCE_CASES`] and [`SINK_CASES`], so a failure names its case.

pub mod collect;
pub mod process;
pub mod sink;
pub mod source;
pub mod visibility;

use crate::job::{CheckpointSettings, JobBuilder, JobGraph, RestartPolicy};
use crate::runtime::{RunOptions, RunSummary};
use crate::telemetry::Telemetry;
use crate::testkit::verdict::{compare, Expect};
use std::path::Path;
use std::time::{Duration, Instant};

/// The source cases, by name, with what each proves.
pub const SOURCE_CASES: &[(&str, &str)] = &[
    (
        "single_split",
        "one split, read to its end by a bounded job",
    ),
    (
        "multiple_splits",
        "several splits over two subtasks, each in the order written",
    ),
    (
        "stop_write_more_restart",
        "stopped with a final checkpoint, more written, restarted: only the new records are read",
    ),
    (
        "rescale_up",
        "stopped at parallelism 2 mid-stream, resumed at 4 from the final checkpoint",
    ),
    (
        "rescale_down",
        "stopped at parallelism 4 mid-stream, resumed at 2 from the final checkpoint",
    ),
    (
        "metrics_count_records",
        "the source's lockgate_records_out_total counts every record read",
    ),
    (
        "idle_subtask",
        "a subtask without a split does not keep a bounded job from finishing",
    ),
    (
        "failure_mid_stream",
        "a task failure after a checkpoint restarts from it: nothing lost, nothing twice",
    ),
    (
        "corrupt_newest_checkpoint",
        "the newest checkpoint damaged between runs: the restore falls back to an older one",
    ),
    (
        "sigkill_at_seeded_moments",
        "a real process killed with SIGKILL three times at seeded moments after a checkpoint, then run to the end",
    ),
    (
        "failpoint_windows",
        "a real process aborted in each window of the checkpoint protocol after a completed checkpoint, then run to the end",
    ),
];

/// The sink cases, by name, with what each proves.
pub const SINK_CASES: &[(&str, &str)] = &[
    ("single_subtask", "one subtask writes a bounded input"),
    ("several_subtasks", "three subtasks write a bounded input"),
    (
        "stop_and_restart",
        "stopped with a final checkpoint mid-stream, restarted: the rest is written",
    ),
    (
        "rescale_up",
        "stopped at parallelism 2 mid-stream, resumed at 4",
    ),
    (
        "rescale_down",
        "stopped at parallelism 4 mid-stream, resumed at 2",
    ),
    (
        "metrics_count_records",
        "the sink's lockgate_records_out_total counts every record written",
    ),
    (
        "failure_mid_stream",
        "a task failure after a checkpoint restarts from it",
    ),
    (
        "corrupt_newest_checkpoint",
        "the newest checkpoint damaged between runs: the restore falls back to an older one",
    ),
    (
        "sigkill_at_seeded_moments",
        "a real process killed with SIGKILL three times at seeded moments after a checkpoint, then run to the end",
    ),
    (
        "failpoint_windows",
        "a real process aborted in each window of the checkpoint protocol after a completed checkpoint, then run to the end",
    ),
    (
        "restore_older_by_path",
        "stopped mid-stream, then started from its second-newest checkpoint by path (--restore): the newer output is taken back, or kept as the sink's final commits allow",
    ),
    (
        "fresh_start_over_output",
        "run to the end, then again from no checkpoint into the same destination: what the sink does to its earlier output",
    ),
    (
        "crash_then_rescale",
        "a real process at parallelism 2 killed with SIGKILL at a seeded moment, resumed at parallelism 3",
    ),
    (
        "visibility_at_checkpoints",
        "read while the job runs: an exactly-once sink shows nothing of a checkpoint before it completes (nor after it is aborted), any other shows everything once the barrier passed it",
    ),
];

/// A case's failure: what was expected and what was found.
pub type CaseResult = Result<(), String>;

/// Runs `one` for every window and reports every window that failed, not only the
/// first: a sink that mishandles two windows says so in one run.
pub fn every_window<'a>(
    windows: impl IntoIterator<Item = &'a str>,
    mut one: impl FnMut(&'a str) -> CaseResult,
) -> CaseResult {
    let mut ran = 0;
    let failed: Vec<String> = windows
        .into_iter()
        .filter_map(|w| {
            ran += 1;
            one(w).err()
        })
        .collect();
    match failed.len() {
        0 => Ok(()),
        n => Err(format!(
            "{n} of {ran} windows failed: {}",
            failed.join(" | ")
        )),
    }
}

/// How often the suite's jobs checkpoint.
pub const CHECKPOINT_INTERVAL_MS: u64 = 50;

/// A job of the suite: checkpoints every [`CHECKPOINT_INTERVAL_MS`] into `dir`,
/// restarts in process (up to 3 times, 100 ms apart).
pub fn job_builder(name: &str, dir: &Path, parallelism: u16) -> JobBuilder {
    let mut c = CheckpointSettings::new(dir);
    c.interval_ms = CHECKPOINT_INTERVAL_MS;
    c.timeout_ms = 60_000;
    crate::job::Job::builder(name)
        .parallelism(parallelism)
        .max_parallelism(16)
        .checkpointing(c)
        .restart(RestartPolicy::FixedDelay {
            attempts: 3,
            delay_ms: 100,
        })
}

/// A runtime for one case: several workers, because the pacing operator sleeps on
/// the worker it runs on.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(6)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A run of `job` to its end (a bounded job) with `telemetry`.
pub fn run_to_end(
    rt: &tokio::runtime::Runtime,
    job: &JobGraph,
    telemetry: Option<Telemetry>,
) -> Result<RunSummary, String> {
    run_with(
        rt,
        job,
        RunOptions {
            telemetry,
            ..Default::default()
        },
    )
}

/// A run of `job` to its end started with `options` (`--restore`, say).
pub fn run_with(
    rt: &tokio::runtime::Runtime,
    job: &JobGraph,
    options: RunOptions,
) -> Result<RunSummary, String> {
    let run = crate::runtime::run(job, options);
    rt.block_on(async { tokio::time::timeout(RUN_TIMEOUT, run).await })
        .map_err(|_| format!("the bounded job did not finish within {RUN_TIMEOUT:?}"))?
        .map_err(|e| format!("the run failed: {e}"))
}

/// How long one run of a case may take.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// A run of `job` stopped (as by SIGTERM: a final checkpoint) once `ready` holds,
/// checked every 10 ms. Fails when the job ends by itself first: the case would not
/// test a stop mid-stream.
pub fn run_and_stop(
    rt: &tokio::runtime::Runtime,
    job: &JobGraph,
    what: &str,
    mut ready: impl FnMut() -> bool,
) -> Result<RunSummary, String> {
    let (tx, rx) = tokio::sync::watch::channel(false);
    let job = job.clone();
    let handle = rt.spawn(async move {
        crate::runtime::run(
            &job,
            RunOptions {
                stop: Some(rx),
                ..Default::default()
            },
        )
        .await
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ready() {
        if handle.is_finished() {
            let ended = match rt.block_on(handle) {
                Ok(Ok(_)) => "with success".to_string(),
                Ok(Err(e)) => format!("with {e}"),
                Err(e) => format!("with a panic: {e}"),
            };
            return Err(format!(
                "the job ended ({ended}) before {what}: it was to be stopped mid-stream"
            ));
        }
        if Instant::now() > deadline {
            let _ = tx.send(true);
            return Err(format!("no {what} within 120 s"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = tx.send(true);
    rt.block_on(handle)
        .map_err(|e| format!("the run panicked: {e}"))?
        .map_err(|e| format!("the stopped run failed: {e}"))
}

/// Waits (up to 120 s, checking every 10 ms) until `done` holds.
pub fn wait_for(mut done: impl FnMut() -> bool, what: &str) -> CaseResult {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done() {
        if Instant::now() > deadline {
            return Err(format!("waited 120 s for {what}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// The complete checkpoints of a checkpoint directory, oldest first.
pub use crate::testkit::checkpoint::complete_checkpoints;

/// Damages the newest complete checkpoint of `dir` (flips a byte in the middle of its
/// `_metadata`) and returns its name; the next start must report it and restore the
/// one before.
pub fn corrupt_newest(dir: &Path) -> Result<String, String> {
    let all = complete_checkpoints(dir);
    if all.len() < 2 {
        return Err(format!(
            "{} complete checkpoint(s): a fallback needs two",
            all.len()
        ));
    }
    let newest = all.last().expect("two checkpoints");
    let meta = newest.join("_metadata");
    let mut bytes = std::fs::read(&meta).map_err(|e| format!("{}: {e}", meta.display()))?;
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xFF;
    std::fs::write(&meta, bytes).map_err(|e| format!("{}: {e}", meta.display()))?;
    Ok(newest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default())
}

/// The id of checkpoint directory name `chk-N` (0 for anything else).
pub fn checkpoint_id(name: &str) -> u64 {
    name.strip_prefix("chk-")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Checks that a run skipped `corrupted` and restored an older checkpoint.
pub fn fell_back(summary: &RunSummary, corrupted: &str) -> CaseResult {
    if !summary.skipped.iter().any(|(p, _)| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy() == corrupted)
    }) {
        return Err(format!(
            "the restore did not report the damaged {corrupted} (skipped: {:?})",
            summary.skipped
        ));
    }
    match &summary.restored_from {
        Some(p)
            if p.file_name()
                .is_some_and(|n| n.to_string_lossy() != corrupted) =>
        {
            Ok(())
        }
        other => Err(format!(
            "expected a restore from a checkpoint older than {corrupted}, got {other:?}"
        )),
    }
}

/// Compares two multisets of values: `Ok` when equal, otherwise the verdict (what is
/// missing, duplicated and foreign, the first few of each).
pub fn same_multiset(expected: &[Vec<u8>], found: &[Vec<u8>]) -> CaseResult {
    same_as(expected, found, Expect::Exact)
}

/// Compares the values `found` with `expected` as `expect` requires, through the one
/// verdict of every exactly-once check ([`crate::testkit::verdict`]).
pub fn same_as(expected: &[Vec<u8>], found: &[Vec<u8>], expect: Expect) -> CaseResult {
    let text = |v: &Vec<u8>| String::from_utf8_lossy(v).into_owned();
    compare(
        expected.iter().map(text),
        found.iter().map(|f| (text(f), None)),
        expect,
    )
    .case()
}

/// The sum of `lockgate_records_out_total` of operator `operator` over its subtasks.
pub fn records_out(telemetry: &Telemetry, job: &str, operator: &str, parallelism: u16) -> u64 {
    let m = telemetry.metrics();
    (0..parallelism)
        .map(|i| {
            m.records_out
                .with_label_values(&[job, operator, &i.to_string()])
                .get()
        })
        .sum()
}

/// What a connector's section is prepared with in the suite: job `conformance`, the
/// suite's `max_parallelism` (16), paths relative to `base_dir`.
pub fn section_context(base_dir: &Path) -> crate::connector::SectionContext {
    crate::connector::SectionContext {
        job_name: "conformance".into(),
        base_dir: base_dir.to_path_buf(),
        parallelism: 1,
        max_parallelism: 16,
        checkpoint_timeout_ms: 60_000,
        formats: crate::formats::Formats::builtin(),
        source_kafka: None,
        event_time: false,
    }
}

fn table(text: &str) -> Result<toml::Value, String> {
    toml::from_str::<toml::Table>(text)
        .map(toml::Value::Table)
        .map_err(|e| format!("the section does not parse: {e}"))
}

/// The source `[source.<name>]` of `registry`, read from the section's TOML text
/// through the same path as a job file: a context whose connector has a job-file
/// section tests that too.
pub fn source_from_section(
    registry: &crate::connector::Registry,
    name: &str,
    text: &str,
    base_dir: &Path,
) -> Result<crate::connector::SourceSpec, String> {
    let prepared = registry
        .prepare_source(name, table(text)?, &section_context(base_dir))
        .ok_or_else(|| format!("no source `{name}` in the registry"))?
        .map_err(|e| format!("{}: {}", e.full_key(&format!("source.{name}")), e.message))?;
    Ok((prepared.build)(crate::connector::SourceWiring::default()))
}

/// The sink `[sink.<name>]` of `registry`, read from the section's TOML text as a job
/// file would be, fed by the suite's sequence source (JSON objects).
pub fn sink_from_section(
    registry: &crate::connector::Registry,
    name: &str,
    text: &str,
    base_dir: &Path,
) -> Result<crate::connector::SinkSpec, String> {
    let cx = section_context(base_dir);
    let facts = crate::connector::SourceFacts::json(crate::connectors::sequence::KIND);
    let sink_cx = crate::connector::SinkContext {
        section: &cx,
        source: &facts,
        transforms: 0,
        stateful_transforms: Vec::new(),
        several_outputs: false,
        records_without_coordinates: None,
        deletes: None,
    };
    let prepared = registry
        .prepare_sink(name, table(text)?, &sink_cx)
        .ok_or_else(|| format!("no sink `{name}` in the registry"))?
        .map_err(|e| format!("{}: {}", e.full_key(&format!("sink.{name}")), e.message))?;
    Ok(prepared.spec)
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_window_runs_and_every_failure_is_reported() {
        let mut seen = Vec::new();
        let r = super::every_window(["a", "b", "c"], |w| {
            seen.push(w);
            match w {
                "b" => Ok(()),
                other => Err(format!("{other}: broken")),
            }
        });
        assert_eq!(seen, ["a", "b", "c"]);
        assert_eq!(
            r.unwrap_err(),
            "2 of 3 windows failed: a: broken | c: broken"
        );
        assert_eq!(super::every_window(["a"], |_| Ok(())), Ok(()));
    }

    use super::*;

    #[test]
    fn multisets_compare_counts() {
        let v = |s: &[&str]| s.iter().map(|x| x.as_bytes().to_vec()).collect::<Vec<_>>();
        assert!(same_multiset(&v(&["a", "b", "a"]), &v(&["a", "a", "b"])).is_ok());
        let e = same_multiset(&v(&["a", "b"]), &v(&["a", "a"])).unwrap_err();
        assert_eq!(
            e,
            "expected 2 records, found 2: 1 missing, 1 duplicated, 0 wrong (a x2, expected x1; missing b x1)"
        );
        assert!(same_multiset(&v(&["a"]), &v(&[])).is_err());
    }
}
