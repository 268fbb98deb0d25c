//! `lockgate chaos`.

use super::{EXIT_FAILURE, EXIT_USAGE};
use crate::chaos::{self, ChaosOptions};
use std::path::PathBuf;

/// Prints every failpoint with what it interrupts.
pub fn list_failpoints() -> i32 {
    for (name, what) in crate::fault::FAILPOINTS {
        println!("{name:<24} {what}");
    }
    0
}

/// Parses `MIN..MAX`.
fn parse_range(s: &str) -> Option<(u64, u64)> {
    let (a, b) = s.split_once("..")?;
    let (a, b) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
    (a <= b).then_some((a, b))
}

/// Runs the harness and prints its report; exits 0 only when the output is exact.
pub fn chaos(
    (config, upstream): (PathBuf, Option<PathBuf>),
    (kills, members): (u32, u16),
    seed: u64,
    (failpoints, failpoint_runs): (Option<String>, Option<u32>),
    report: Option<PathBuf>,
    (corrupt_latest, es_faults): (bool, bool),
    kill_after_ms: &str,
) -> i32 {
    if members == 0 {
        eprintln!("error: --members must be at least 1");
        return EXIT_USAGE;
    }
    let Some(range) = parse_range(kill_after_ms) else {
        eprintln!("error: --kill-after-ms {kill_after_ms}: expected MIN..MAX milliseconds");
        return EXIT_USAGE;
    };
    for file in std::iter::once(&config).chain(&upstream) {
        match crate::config::load(file, &crate::builtin::registry()) {
            Err(e) => {
                eprintln!("error: {e}");
                return EXIT_USAGE;
            }
            Ok(mut job) => {
                job.member = crate::member::Member {
                    index: 0,
                    count: members,
                };
                if let Err((key, e)) = job.check_members() {
                    eprintln!("error: {}: {key}: {e}", file.display());
                    return EXIT_USAGE;
                }
            }
        }
    }
    let log = config.with_extension("chaos.log");
    let opts = ChaosOptions {
        config: config.clone(),
        kills,
        seed,
        failpoints,
        failpoint_runs,
        kill_after_ms: range,
        corrupt_latest,
        es_faults,
        max_runs: kills + 1000,
        log: log.clone(),
        progress: true,
        members,
        upstream: upstream.clone(),
    };
    if let Some(up) = &upstream {
        println!(
            "lockgate chaos: repartition stage {} first, then {}",
            up.display(),
            config.display()
        );
    }
    if members > 1 {
        println!(
            "lockgate chaos: {members} members, {kills} SIGKILLs each, seed {seed}; job log: {}",
            log.display()
        );
    } else {
        println!(
            "lockgate chaos: {kills} SIGKILLs, seed {seed}; job log: {}",
            log.display()
        );
    }
    let r = match chaos::run(&opts, |_| {}) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_FAILURE;
        }
    };
    print!("{}", r.table());
    for e in r.verdict.examples.iter().chain(&r.roll_back_problems()) {
        println!("  ! {e}");
    }
    if !r.failpoints_never_fired.is_empty() {
        println!(
            "  ! abort points that never fired in an armed run: {} (the windows they guard were not exercised; arm them earlier with @K or in more runs with --failpoint-runs)",
            r.failpoints_never_fired.join(", ")
        );
    }
    if let Some(path) = report {
        let json = serde_json::to_string_pretty(&r).expect("a report serializes");
        if let Err(e) = std::fs::write(&path, json) {
            eprintln!("error: cannot write {}: {e}", path.display());
            return EXIT_FAILURE;
        }
    }
    if r.passed() {
        println!("  exactly-once: verified");
        0
    } else {
        println!("  exactly-once: FAILED");
        EXIT_FAILURE
    }
}
