//! End-to-end benchmark of the `sequence -> rolling_sum -> file` job, printed as JSON.
//!
//! - throughput with checkpoints every second against checkpointing off (only the final
//!   checkpoint), measured in the same run, alternating, median of `ROUNDS`;
//! - `checkpoint_by_keys`: checkpoint duration (trigger to publish) p50 / p99 / max with
//!   10^4, 10^5, 10^6 and 10^7 keys in state, records flowing at full speed
//!   (`support::checkpoints`).
//!
//! `cargo bench --bench pipeline`. Environment: `LOCKGATE_BENCH_PARTS` (`throughput`,
//! `checkpoints`, or both, the default), `LOCKGATE_BENCH_RECORDS` (throughput records,
//! 2,000,000), `LOCKGATE_BENCH_KEYS` (comma-separated key counts),
//! `LOCKGATE_BENCH_CHECKPOINT_RECORDS` (records of each measured phase, 4,000,000),
//! `LOCKGATE_BENCH_CHECKPOINT_INTERVAL_MS` (250).

mod support;

use lockgate::runtime::{run, RunOptions, RunSummary};
use std::time::Instant;
use support::checkpoints::{checkpoint_by_keys, job, runtime};
use support::median;

const ROUNDS: usize = 5;

fn run_once(records: i64, keys: u32, interval_ms: u64) -> (f64, RunSummary) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let g = job(tmp.path(), 1, records, keys, interval_ms);
    let start = Instant::now();
    let summary = runtime()
        .block_on(run(&g, RunOptions::default()))
        .expect("job runs");
    let secs = start.elapsed().as_secs_f64();
    (records as f64 / secs, summary)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is accepted.
    let records: i64 = support::env_or("LOCKGATE_BENCH_RECORDS", 2_000_000);
    let parts =
        std::env::var("LOCKGATE_BENCH_PARTS").unwrap_or_else(|_| "throughput,checkpoints".into());
    let key_counts: Vec<u32> = std::env::var("LOCKGATE_BENCH_KEYS")
        .unwrap_or_else(|_| "10000,100000,1000000,10000000".into())
        .split(',')
        .map(|k| {
            k.trim()
                .parse()
                .expect("LOCKGATE_BENCH_KEYS: numbers separated by commas")
        })
        .collect();
    let measured_records: i64 = support::env_or("LOCKGATE_BENCH_CHECKPOINT_RECORDS", 4_000_000);
    let interval_ms: u64 = support::env_or("LOCKGATE_BENCH_CHECKPOINT_INTERVAL_MS", 250);

    let mut report = serde_json::json!({
        "benchmark": "sequence -> rolling_sum -> file, parallelism 2",
    });
    if parts.contains("throughput") {
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
        report["records"] = records.into();
        report["keys"] = 1000.into();
        report["rounds"] = ROUNDS.into();
        report["records_per_sec_checkpoints_off"] = off.round().into();
        report["records_per_sec_checkpoint_every_1s"] = on.round().into();
        report["checkpoints_in_run"] = checkpoints_with.into();
        report["ratio_on_over_off"] = ((on / off * 1000.0).round() / 1000.0).into();
    }
    if parts.contains("checkpoints") {
        report["checkpoint_by_keys"] =
            checkpoint_by_keys(&key_counts, measured_records, interval_ms);
    }
    println!("{report}");
}
