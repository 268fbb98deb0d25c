//! Checkpoint latency (trigger to publish) by the number of keys in state, on the
//! `sequence -> rolling_sum -> file` job run in process.

use super::percentile;
use lockgate::connectors::file_sink::{FileSink, FileSinkConfig};
use lockgate::connectors::sequence::{SequenceConfig, SequenceSource};
use lockgate::job::{CheckpointSettings, Job, JobGraph, RestartPolicy};
use lockgate::operators::rolling_sum::{json_key, RollingSum};
use lockgate::runtime::{run, RunOptions};
use std::path::Path;
use std::time::Instant;

/// The job: records `from..=to` of a sequence over `keys` keys, a keyed running sum,
/// exactly-once files; parallelism 2; a checkpoint every `interval_ms` (0: only the
/// final one).
pub fn job(dir: &Path, from: i64, to: i64, keys: u32, interval_ms: u64) -> JobGraph {
    let seq = SequenceConfig {
        from,
        to,
        keys,
        rate_per_sec: 0,
        splits: 128,
    };
    let out = FileSinkConfig::json(dir.join("out"));
    let mut chk = CheckpointSettings::new(dir.join("checkpoints"));
    chk.interval_ms = interval_ms;
    Job::builder("bench")
        .parallelism(2)
        .restart(RestartPolicy::None)
        .checkpointing(chk)
        .source_spec(SequenceSource::spec(seq))
        .key_by(|r| json_key(r, "/key"))
        .keyed("rolling_sum", "sum", |_| RollingSum {
            field: "/value".into(),
            output: "/total".into(),
        })
        .sink_spec(FileSink::spec(out))
        .build()
        .expect("valid job")
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// [`checkpoint_latency`] for each of `key_counts`, as the report's `checkpoint_by_keys`.
/// It runs about `key_counts.len()` fill phases (10^7 keys: about a minute here) and as
/// many measured phases of `measured_records` records.
pub fn checkpoint_by_keys(
    key_counts: &[u32],
    measured_records: i64,
    interval_ms: u64,
) -> serde_json::Value {
    key_counts
        .iter()
        .map(|&k| checkpoint_latency(k, measured_records, interval_ms))
        .collect::<Vec<_>>()
        .into()
}

/// Checkpoint durations (trigger to publish) with `keys` keys in state.
///
/// A fill phase without periodic checkpoints writes every key once (records `1..=keys`,
/// ending with the final checkpoint); the measured phase restores it and runs
/// `measured_records` more records at full speed with a checkpoint every `interval_ms`,
/// so every measured checkpoint has the whole state behind it while records flow.
/// The first `WARMUP` checkpoints of the measured phase are left out (the restored
/// instance's first compactions); the rest give p50 / p99 / max.
pub fn checkpoint_latency(keys: u32, measured_records: i64, interval_ms: u64) -> serde_json::Value {
    const WARMUP: usize = 2;
    let tmp = tempfile::tempdir().expect("tempdir");
    let keys_i = i64::from(keys);
    let fill_start = Instant::now();
    runtime()
        .block_on(run(
            &job(tmp.path(), 1, keys_i, keys, 0),
            RunOptions::default(),
        ))
        .expect("fill phase runs");
    let fill_secs = fill_start.elapsed().as_secs_f64();
    let start = Instant::now();
    let g = job(tmp.path(), 1, keys_i + measured_records, keys, interval_ms);
    let summary = runtime()
        .block_on(run(&g, RunOptions::default()))
        .expect("measured phase runs");
    let secs = start.elapsed().as_secs_f64();
    let all = &summary.checkpoint_durations_ms;
    // The last one is the final checkpoint, taken when the input ended.
    let periodic = &all[..all.len().saturating_sub(1)];
    let mut measured = periodic[WARMUP.min(periodic.len())..].to_vec();
    measured.sort_unstable();
    eprintln!(
        "{keys} keys: fill {fill_secs:.1} s, measured phase {secs:.1} s ({:.0} rec/s), durations (ms) {all:?}",
        measured_records as f64 / secs
    );
    serde_json::json!({
        "keys": keys,
        "records_measured": measured_records,
        "records_per_sec": (measured_records as f64 / secs).round(),
        "interval_ms": interval_ms,
        "checkpoints": measured.len(),
        "p50_ms": percentile(&measured, 0.50),
        "p99_ms": percentile(&measured, 0.99),
        "max_ms": measured.last().copied().unwrap_or(0),
    })
}
