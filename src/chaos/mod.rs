//! The fault-injection harness (`lockgate chaos`): runs a job as a child process, kills
//! it with SIGKILL at seeded random moments (and lets failpoints abort it), restarts it
//! with the same command until it finishes, optionally corrupts the newest checkpoint
//! between two runs, and then verifies the Elasticsearch index against the Kafka input.
//! The same seed replays the same kill schedule.

pub mod target;
pub mod verify;

use indicatif::{ProgressBar, ProgressStyle};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
pub use target::Target;
pub use verify::Verdict;

/// How to run the harness.
#[derive(Debug, Clone)]
pub struct ChaosOptions {
    pub config: PathBuf,
    pub kills: u32,
    pub seed: u64,
    /// `LOCKGATE_FAILPOINTS` of the runs.
    pub failpoints: Option<String>,
    /// Apply the failpoints to the first N runs only (None: every run).
    pub failpoint_runs: Option<u32>,
    /// Each kill comes this many milliseconds after its run started (uniform).
    pub kill_after_ms: (u64, u64),
    /// Flip a byte in, or truncate, the newest checkpoint after the first kill.
    pub corrupt_latest: bool,
    /// Give up after this many runs.
    pub max_runs: u32,
    /// Cycle Elasticsearch faults on the test server while the job runs.
    pub es_faults: bool,
    /// Where the runs' logs go.
    pub log: PathBuf,
    pub progress: bool,
}

/// What happened, and what verification found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub seed: u64,
    pub failpoints: Option<String>,
    pub kills: u32,
    pub failpoint_aborts: u32,
    pub job_failures: u32,
    pub restarts: u32,
    pub checkpoints_completed: u64,
    /// Per restart: process start to first record emitted, in milliseconds.
    pub recovery_ms: Vec<u64>,
    pub recovery_ms_p50: u64,
    pub recovery_ms_p99: u64,
    pub corrupted: Option<String>,
    pub corruption_detected: Option<bool>,
    /// Elasticsearch fault phases applied (with `es_faults`).
    pub network_faults: Vec<String>,
    /// The test server's counters at the end (with `es_faults`).
    pub es_stats: Option<serde_json::Value>,
    pub elapsed_s: f64,
    pub verdict: Verdict,
}

impl Report {
    /// Exact output and (when a checkpoint was corrupted) the corruption was reported.
    pub fn passed(&self) -> bool {
        self.verdict.exact() && self.corruption_detected != Some(false)
    }

    /// The report as a table.
    pub fn table(&self) -> String {
        let rows: Vec<(&str, String)> = vec![
            ("seed", self.seed.to_string()),
            ("SIGKILLs", self.kills.to_string()),
            ("failpoint aborts", self.failpoint_aborts.to_string()),
            ("job failures (exit 1)", self.job_failures.to_string()),
            ("restarts", self.restarts.to_string()),
            (
                "checkpoints completed",
                self.checkpoints_completed.to_string(),
            ),
            ("recovery p50 (ms)", self.recovery_ms_p50.to_string()),
            ("recovery p99 (ms)", self.recovery_ms_p99.to_string()),
            (
                "corrupted checkpoint",
                self.corrupted.clone().unwrap_or_else(|| "-".into()),
            ),
            (
                "corruption reported",
                self.corruption_detected
                    .map_or("-".into(), |d| d.to_string()),
            ),
            ("input records", self.verdict.inputs.to_string()),
            (
                "expected documents",
                self.verdict.expected_documents.to_string(),
            ),
            ("documents", self.verdict.documents.to_string()),
            ("missing", self.verdict.missing.to_string()),
            ("duplicated", self.verdict.duplicated.to_string()),
            ("wrong", self.verdict.wrong.to_string()),
            ("elapsed (s)", format!("{:.1}", self.elapsed_s)),
        ];
        let mut s = String::new();
        for (k, v) in rows {
            s.push_str(&format!("  {k:<24} {v:>14}\n"));
        }
        s
    }
}

/// The percentile `p` of `values` (nearest rank).
pub fn percentile(values: &[u64], p: f64) -> u64 {
    if values.is_empty() {
        return 0;
    }
    let mut v = values.to_vec();
    v.sort_unstable();
    v[(((v.len() as f64) * p).ceil() as usize).clamp(1, v.len()) - 1]
}

/// What one run's log said.
#[derive(Default)]
struct RunEvents {
    first_record: Option<Instant>,
    checkpoints: u64,
    lines: Vec<String>,
}

fn spawn(
    opts: &ChaosOptions,
    run: u32,
    log: &Arc<Mutex<std::fs::File>>,
) -> std::io::Result<(Child, Arc<Mutex<RunEvents>>)> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("run").arg("--config").arg(&opts.config);
    let armed = opts.failpoint_runs.is_none_or(|n| run <= n);
    match opts.failpoints.as_ref().filter(|_| armed) {
        Some(f) => cmd.env(crate::fault::ENV, f),
        None => cmd.env_remove(crate::fault::ENV),
    };
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn()?;
    let events = Arc::new(Mutex::new(RunEvents::default()));
    let stderr = child.stderr.take().expect("piped");
    let (ev, log) = (events.clone(), log.clone());
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let mut e = ev.lock().expect("lock");
            if e.first_record.is_none() && line.contains("first records emitted") {
                e.first_record = Some(Instant::now());
            }
            if line.contains("checkpoint completed") {
                e.checkpoints += 1;
            }
            if line.contains("skipping checkpoint")
                || line.contains("ERROR")
                || line.contains("error:")
            {
                e.lines.push(line.clone());
            }
            let _ = writeln!(log.lock().expect("lock"), "{line}");
        }
    });
    Ok((child, events))
}

/// Damages the newest complete checkpoint: a flipped byte or a truncation of its
/// `_metadata` or of one of its state files. Returns what was done.
pub fn corrupt_latest(checkpoint_dir: &Path, rng: &mut impl Rng) -> Option<String> {
    let mut chks: Vec<PathBuf> = std::fs::read_dir(checkpoint_dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.join("_metadata").exists()
                && p.file_name()
                    .is_some_and(|n| !n.to_string_lossy().contains('.'))
        })
        .collect();
    chks.sort();
    let newest = chks.pop()?;
    let mut files = vec![newest.join("_metadata")];
    if let Ok(rd) = std::fs::read_dir(&newest) {
        for d in rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_dir())
        {
            if let Ok(inner) = std::fs::read_dir(&d) {
                files.extend(
                    inner
                        .filter_map(|e| e.ok().map(|e| e.path()))
                        .filter(|p| p.extension().is_some_and(|x| x == "sst")),
                );
            }
        }
    }
    let file = files[rng.gen_range(0..files.len())].clone();
    let mut bytes = std::fs::read(&file).ok()?;
    let how = if rng.gen_bool(0.5) && bytes.len() > 1 {
        bytes.truncate(bytes.len() / 2);
        "truncated"
    } else {
        let i = rng.gen_range(0..bytes.len().max(1));
        if let Some(b) = bytes.get_mut(i) {
            *b ^= 0xff;
        }
        "flipped a byte of"
    };
    // A new inode: hard-linked state files stay intact in other checkpoints.
    let tmp = file.with_extension("corrupting");
    std::fs::write(&tmp, &bytes).ok()?;
    std::fs::rename(&tmp, &file).ok()?;
    Some(format!("{how} {}", file.display()))
}

/// The Elasticsearch fault phases the harness cycles through (test server only).
pub fn es_fault_phases() -> Vec<(&'static str, serde_json::Value)> {
    use serde_json::json;
    vec![
        (
            "30% of items rejected with 429",
            json!({"reject_item_fraction": 0.3, "seed": 1}),
        ),
        (
            "5 requests failed with 503",
            json!({"fail_requests_status": 503, "fail_requests": 5}),
        ),
        (
            "5 requests failed with 429",
            json!({"fail_requests_status": 429, "fail_requests": 5}),
        ),
        (
            "3 requests failed with 500",
            json!({"fail_requests_status": 500, "fail_requests": 3}),
        ),
        ("150 ms latency", json!({"latency_ms": 150})),
        (
            "3 responses dropped after the bulk was applied",
            json!({"drop_responses": 3}),
        ),
        ("no fault", json!({})),
    ]
}

fn set_es_faults(url: &str, faults: &serde_json::Value) -> Result<(), String> {
    let r = reqwest::blocking::Client::new()
        .post(format!("{url}/_lockgate/faults"))
        .json(faults)
        .send()
        .map_err(|e| format!("{url}/_lockgate/faults: {e}"))?;
    if r.status().is_success() {
        Ok(())
    } else {
        Err(format!("{url}/_lockgate/faults answered {}: Elasticsearch faults need the lockgate test server", r.status()))
    }
}

/// Runs the harness. `after_kill(i)` runs after the `i`-th kill (the demo creates a
/// topic there).
pub fn run(opts: &ChaosOptions, mut after_kill: impl FnMut(u32)) -> Result<Report, String> {
    let target = Target::from_job_file(&opts.config)?;
    crate::config::load(&opts.config).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(opts.seed);
    let log = Arc::new(Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&opts.log)
            .map_err(|e| format!("{}: {e}", opts.log.display()))?,
    ));
    let mut report = Report {
        seed: opts.seed,
        failpoints: opts.failpoints.clone(),
        ..Default::default()
    };
    let bar = if opts.progress {
        ProgressBar::new(u64::from(opts.kills))
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("  {spinner} [{elapsed_precise}] kills {pos}/{len} {msg}")
            .expect("template"),
    );
    bar.enable_steady_tick(Duration::from_millis(100));
    let mut runs = 0;
    let mut expect_skip: Option<String> = None;
    let stop_faults = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Whatever way this function returns, the fault thread stops (and clears the
    // faults) instead of leaving them armed on the server.
    struct StopOnDrop(Arc<std::sync::atomic::AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let _stop_guard = StopOnDrop(stop_faults.clone());
    let fault_thread = if opts.es_faults {
        set_es_faults(&target.es_url, &serde_json::json!({}))?;
        let (url, stop) = (target.es_url.clone(), stop_faults.clone());
        Some(std::thread::spawn(move || {
            let mut applied = Vec::new();
            for (name, f) in es_fault_phases().into_iter().cycle() {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                if set_es_faults(&url, &f).is_ok() {
                    applied.push(name.to_string());
                }
                std::thread::sleep(Duration::from_millis(700));
            }
            let _ = set_es_faults(&url, &serde_json::json!({}));
            applied
        }))
    } else {
        None
    };
    loop {
        runs += 1;
        if runs > opts.max_runs {
            return Err(format!(
                "the job did not finish within {} runs",
                opts.max_runs
            ));
        }
        let spawned = Instant::now();
        let (mut child, events) =
            spawn(opts, runs, &log).map_err(|e| format!("cannot start the job: {e}"))?;
        let kill_at = (report.kills < opts.kills).then(|| {
            spawned
                + Duration::from_millis(rng.gen_range(opts.kill_after_ms.0..=opts.kill_after_ms.1))
        });
        let status = loop {
            if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
                break Some(s);
            }
            if kill_at.is_some_and(|t| Instant::now() >= t) {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        // Let the log reader drain the dead process's output.
        std::thread::sleep(Duration::from_millis(20));
        let ev = events.lock().expect("lock");
        report.checkpoints_completed += ev.checkpoints;
        if runs > 1 {
            if let Some(first) = ev.first_record {
                report
                    .recovery_ms
                    .push(first.duration_since(spawned).as_millis() as u64);
            }
        }
        if let Some(name) = expect_skip.take() {
            report.corruption_detected = Some(
                ev.lines
                    .iter()
                    .any(|l| l.contains("skipping checkpoint") && l.contains(&name)),
            );
        }
        drop(ev);
        match status {
            None => {
                report.kills += 1;
                bar.inc(1);
                bar.set_message(format!(
                    "runs {runs}, checkpoints {}",
                    report.checkpoints_completed
                ));
                after_kill(report.kills);
                if opts.corrupt_latest && report.corrupted.is_none() {
                    if let Some(what) = corrupt_latest(&target.checkpoint_dir, &mut rng) {
                        let chk = what
                            .split('/')
                            .find(|s| s.starts_with("chk-"))
                            .unwrap_or_default()
                            .to_string();
                        expect_skip = Some(chk);
                        report.corrupted = Some(what);
                    }
                }
            }
            Some(s) if s.success() => break,
            Some(s) if s.code() == Some(2) => {
                return Err(format!(
                    "the job refused its configuration (see {})",
                    opts.log.display()
                ))
            }
            Some(s) if std::os::unix::process::ExitStatusExt::signal(&s) == Some(libc::SIGABRT) => {
                report.failpoint_aborts += 1
            }
            // A job failure (exit 1), a panic or a crash: restarted, and counted.
            Some(_) => report.job_failures += 1,
        }
        report.restarts += 1;
    }
    bar.finish_and_clear();
    if let Some(t) = fault_thread {
        stop_faults.store(true, std::sync::atomic::Ordering::Relaxed);
        report.network_faults = t.join().unwrap_or_default();
        report.es_stats = reqwest::blocking::get(format!("{}/_lockgate/stats", target.es_url))
            .and_then(|r| r.json())
            .ok();
    }
    report.recovery_ms_p50 = percentile(&report.recovery_ms, 0.50);
    report.recovery_ms_p99 = percentile(&report.recovery_ms, 0.99);
    let inputs = verify::read_inputs(&target)?;
    report.verdict = verify::verify(&target, &inputs)?;
    report.elapsed_s = started.elapsed().as_secs_f64();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        assert_eq!(percentile(&[], 0.5), 0);
        assert_eq!(percentile(&[5], 0.99), 5);
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 50);
        assert_eq!(percentile(&v, 0.99), 99);
    }
}
