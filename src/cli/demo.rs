//! `lockgate demo`: runs a checkpointed job as a child process, kills it with SIGKILL
//! twice, resumes it with the same command, and verifies the committed output.
//!
//! Until the Kafka source and the Elasticsearch sink land, the demo job is the built-in
//! `sequence -> rolling_sum -> file` pipeline; its guarantees are the same ones.

use super::{EXIT_FAILURE, EXIT_USAGE};
use crate::testkit::file_output;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const RECORDS: i64 = 200_000;
const KEYS: u32 = 1_000;

fn job_file(dir: &std::path::Path) -> String {
    format!(
        r#"[job]
name = "demo-rolling-sum"
parallelism = 2

[checkpoint]
dir = "{}"
interval_ms = 500

[source.sequence]
from = 1
to = {RECORDS}
keys = {KEYS}
rate_per_sec = 50000

[[transform]]
type = "rolling_sum"
key = "/key"
field = "/value"
output = "/total"

[sink.file]
dir = "{}"
"#,
        dir.join("checkpoints").display(),
        dir.join("out").display()
    )
}

fn spawn(config: &std::path::Path, log: &std::path::Path) -> std::io::Result<Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    Command::new(std::env::current_exe()?)
        .arg("run")
        .arg("--config")
        .arg(config)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
}

/// Runs the demo; returns the exit code.
pub fn demo(dir: Option<PathBuf>) -> i32 {
    let dir = dir.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("lockgate-demo-{}", std::process::id()))
    });
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("error: cannot create {}: {e}", dir.display());
        return EXIT_USAGE;
    }
    let config = dir.join("job.toml");
    let log = dir.join("job.log");
    if let Err(e) = std::fs::write(&config, job_file(&dir)) {
        eprintln!("error: cannot write {}: {e}", config.display());
        return EXIT_USAGE;
    }
    println!("lockgate demo: sequence(1..={RECORDS}, {KEYS} keys) -> rolling_sum by key -> exactly-once files");
    println!("  (the Kafka -> Elasticsearch demo arrives with those connectors)");
    println!(
        "  job file: {}\n  job log:  {}",
        config.display(),
        log.display()
    );
    let bar = ProgressBar::new(3);
    bar.set_style(
        ProgressStyle::with_template("  {spinner} [{elapsed_precise}] run {pos}/{len}: {msg}")
            .expect("template"),
    );
    bar.enable_steady_tick(Duration::from_millis(100));
    let started = Instant::now();
    let mut kills = 0;
    for (run, kill_after) in [(1, Some(1500)), (2, Some(1500)), (3, None)] {
        bar.set_position(run);
        let mut child = match spawn(&config, &log) {
            Ok(c) => c,
            Err(e) => {
                bar.abandon();
                eprintln!("error: cannot start the job: {e}");
                return EXIT_FAILURE;
            }
        };
        if let Some(ms) = kill_after {
            bar.set_message(format!("running, SIGKILL in {ms} ms"));
            std::thread::sleep(Duration::from_millis(ms));
            if child.try_wait().ok().flatten().is_none() {
                let _ = child.kill(); // SIGKILL
                kills += 1;
            }
            let _ = child.wait();
        } else {
            bar.set_message("resuming from the last checkpoint, running to the end");
            match child.wait() {
                Ok(s) if s.success() => {}
                other => {
                    bar.abandon();
                    eprintln!("error: the job failed ({other:?}); see {}", log.display());
                    return EXIT_FAILURE;
                }
            }
        }
    }
    bar.finish_and_clear();
    let v = match file_output::verify(&dir.join("out"), 1, RECORDS, KEYS, Some("/total")) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: cannot read the output: {e}");
            return EXIT_FAILURE;
        }
    };
    println!();
    println!("  {:<28} {:>10}", "records expected", v.expected);
    println!("  {:<28} {:>10}", "records committed", v.committed);
    println!("  {:<28} {:>10}", "SIGKILLs", kills);
    println!("  {:<28} {:>10}", "missing", v.missing_count);
    println!("  {:<28} {:>10}", "duplicated", v.duplicated_count);
    println!("  {:<28} {:>10}", "wrong running totals", v.wrong_count);
    println!(
        "  {:<28} {:>9.1}s",
        "wall time",
        started.elapsed().as_secs_f64()
    );
    println!();
    println!("  checkpoints: {}", dir.join("checkpoints").display());
    println!(
        "  inspect one: lockgate checkpoints list {}",
        dir.join("checkpoints").display()
    );
    if v.is_exact() {
        println!("\n  exactly-once: verified");
        0
    } else {
        println!("\n  exactly-once: FAILED {v:?}");
        EXIT_FAILURE
    }
}
