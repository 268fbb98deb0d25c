//! End-to-end benchmark of the `sequence -> rolling_sum -> file` job, printed as JSON.
//!
//! - throughput with checkpoints every second against checkpointing off (only the final
//!   checkpoint), measured in the same run, alternating, median of `ROUNDS`;
//! - checkpoint duration (trigger to publish) p50 / p99 with 1,000,000 keys in state.
//!
//! `cargo bench --bench pipeline` (set `LOCKGATE_BENCH_RECORDS` to change the size).

use lockgate::connectors::file_sink::{FileSink, FileSinkConfig};
use lockgate::connectors::sequence::{SequenceConfig, SequenceSource};
use lockgate::job::{CheckpointSettings, Job, JobGraph, RestartPolicy};
use lockgate::operators::rolling_sum::{json_key, RollingSum};
use lockgate::runtime::{run, RunOptions, RunSummary};
use std::path::Path;
use std::time::Instant;

const ROUNDS: usize = 5;

fn job(dir: &Path, records: i64, keys: u32, interval_ms: u64) -> JobGraph {
    let seq = SequenceConfig {
        from: 1,
        to: records,
        keys,
        rate_per_sec: 0,
        splits: 128,
    };
    let out = FileSinkConfig {
        dir: dir.join("out"),
    };
    let mut chk = CheckpointSettings::new(dir.join("checkpoints"));
    chk.interval_ms = interval_ms;
    Job::builder("bench")
        .parallelism(2)
        .restart(RestartPolicy::None)
        .checkpointing(chk)
        .source("sequence", move |_| {
            Box::new(SequenceSource::new(seq.clone()))
        })
        .key_by(|r| json_key(r, "/key"))
        .keyed("rolling_sum", "sum", |_| RollingSum {
            field: "/value".into(),
            output: "/total".into(),
        })
        .sink("file", move |_| Box::new(FileSink::new(out.clone())))
        .build()
        .expect("valid job")
}

fn run_once(records: i64, keys: u32, interval_ms: u64) -> (f64, RunSummary) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let g = job(tmp.path(), records, keys, interval_ms);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let start = Instant::now();
    let summary = rt
        .block_on(run(&g, RunOptions::default()))
        .expect("job runs");
    let secs = start.elapsed().as_secs_f64();
    (records as f64 / secs, summary)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    v[v.len() / 2]
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is accepted.
    let records: i64 = std::env::var("LOCKGATE_BENCH_RECORDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000_000);

    let mut with = Vec::new();
    let mut without = Vec::new();
    let mut checkpoints_with = 0;
    for round in 0..ROUNDS {
        let (r_off, _) = run_once(records, 1000, 0);
        let (r_on, s_on) = run_once(records, 1000, 1000);
        eprintln!("round {round}: checkpoints off {r_off:.0} rec/s, every 1 s {r_on:.0} rec/s ({} checkpoints)", s_on.checkpoints);
        without.push(r_off);
        with.push(r_on);
        checkpoints_with = s_on.checkpoints;
    }
    let (off, on) = (median(without), median(with));

    // A million keys: state holds every key after the first million records.
    let big = 6_000_000;
    let (rate_big, s_big) = run_once(big, 1_000_000, 250);
    let durations = &s_big.checkpoint_durations_ms;
    let steady: Vec<u64> = {
        let mut v = durations[durations.len() / 3..].to_vec();
        v.sort_unstable();
        v
    };
    eprintln!(
        "1M keys: {} checkpoints, {rate_big:.0} rec/s, durations (ms) {:?}",
        durations.len(),
        durations
    );
    println!(
        "{}",
        serde_json::json!({
            "benchmark": "sequence -> rolling_sum -> file, parallelism 2",
            "records": records,
            "keys": 1000,
            "rounds": ROUNDS,
            "records_per_sec_checkpoints_off": off.round(),
            "records_per_sec_checkpoint_every_1s": on.round(),
            "checkpoints_in_run": checkpoints_with,
            "ratio_on_over_off": (on / off * 1000.0).round() / 1000.0,
            "state_1m_keys": {
                "records": big,
                "interval_ms": 250,
                "records_per_sec": rate_big.round(),
                "checkpoints": durations.len(),
                "measured_after_state_filled": steady.len(),
                "checkpoint_ms_p50": percentile(&steady, 0.50),
                "checkpoint_ms_p99": percentile(&steady, 0.99),
                "checkpoint_ms_max": steady.last().copied().unwrap_or(0),
            }
        })
    );
}
