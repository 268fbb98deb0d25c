//! The fault-injection harness (`lockgate chaos`): runs a job as a child process, kills
//! it with SIGKILL at seeded random moments (and lets failpoints abort it), restarts it
//! with the same command until it finishes, optionally corrupts the newest checkpoint
//! between two runs, and then verifies the Elasticsearch index, or the file sink's
//! committed parts, against the Kafka input. For the file sink it also checks, on every
//! restart, that the restore rolled back exactly the committed parts it had to
//! ([`rollback`]). The same seed replays the same kill schedule.

pub mod es_faults;
pub mod es_http;
pub mod outcome;
pub mod pg_verify;
pub mod rollback;
pub mod target;
pub mod verify;

use crate::member::Member;
use indicatif::{ProgressBar, ProgressStyle};
use outcome::{Restored, RunOutcome};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Flip a byte in, or truncate, the newest checkpoint once at least two complete
    /// checkpoints exist, so that the next run must fall back to the older one. For a
    /// file-sink job, also once parts after the older one were committed, so that the
    /// fallback must roll them back.
    pub corrupt_latest: bool,
    /// Give up after this many runs.
    pub max_runs: u32,
    /// Cycle Elasticsearch faults on the test server while the job runs.
    pub es_faults: bool,
    /// Where the runs' logs go.
    pub log: PathBuf,
    pub progress: bool,
    /// Run the job as this many members (`lockgate run --member I --members N`), each
    /// killed on its own seeded schedule (`kills` each) and restarted on its own; the
    /// output of all of them is verified together at the end.
    pub members: u16,
    /// A repartition stage (a job with `[sink.kafka]`) that writes the topic the job
    /// reads: it runs first, as many members as the job and killed the same way, until
    /// it finishes; then the job runs; and the job's output is verified against the
    /// repartition stage's input.
    pub upstream: Option<PathBuf>,
}

/// Which of the two jobs of a repartitioned run a lane runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// The repartition stage (`--upstream`).
    Upstream,
    /// The job of `--config`.
    Job,
}

/// The corruption of one checkpoint and what the next run made of it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Corruption {
    /// What was done to which file.
    pub what: String,
    /// The corrupted checkpoint (the newest complete one).
    pub checkpoint: String,
    /// The checkpoint the next run must fall back to (the second newest).
    pub fallback: String,
    /// Whether the next run logged that it skipped the corrupted checkpoint.
    pub reported: bool,
    /// What the next run restored.
    pub restored: Option<Restored>,
}

impl Corruption {
    /// The next run named the corrupted checkpoint and restored the one before it.
    pub fn fell_back(&self) -> bool {
        self.reported && self.restored == Some(Restored::Checkpoint(self.fallback.clone()))
    }
}

/// One run of the job, as the harness saw it.
#[derive(Debug, Clone, Serialize)]
pub struct RunRecord {
    /// The job that ran: `upstream` (the repartition stage) or `job`.
    pub stage: Stage,
    /// The member that ran (0 for a job run as one process).
    pub member: u16,
    /// `killed`, `finished`, `failpoint-abort`, or `failed: <error>`.
    pub ended: String,
    /// The checkpoint it restored.
    pub restored: Restored,
    /// Checkpoints it completed.
    pub checkpoints: u64,
    /// Process start to its first record, in milliseconds.
    pub first_record_ms: Option<u64>,
    /// The signal that ended it: `SIGKILL` (the harness) or `SIGABRT` (a failpoint).
    pub signal: Option<String>,
    /// The failpoint that aborted it, as the job printed it.
    pub failpoint: Option<String>,
    /// The newest complete checkpoint when it ended: what the next run must restore.
    pub newest_after: Option<String>,
    /// The sum of the next offsets of the checkpoint it restored: the records read
    /// before that checkpoint, for topics that start at offset 0.
    pub restored_offsets: Option<u64>,
    /// For a file-sink job: the committed parts its restore moved into `.rolled-back/`,
    /// against those it had to move.
    pub roll_back: Option<rollback::RollBackCheck>,
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
    /// Records the job dropped as already applied: replays of the repartition stage
    /// (reading with `origin_headers`), as its runs logged them.
    pub replays_dropped: u64,
    /// Every run, in order.
    pub runs: Vec<RunRecord>,
    /// Per restart: process start to first record emitted, in milliseconds.
    pub recovery_ms: Vec<u64>,
    pub recovery_ms_p50: u64,
    pub recovery_ms_p99: u64,
    /// `what` of [`Report::corruption`] (kept for scripts that read it).
    pub corrupted: Option<String>,
    /// `fell_back()` of [`Report::corruption`].
    pub corruption_detected: Option<bool>,
    pub corruption: Option<Corruption>,
    /// For a file-sink job: the parts moved into `.rolled-back/` over all runs.
    pub parts_rolled_back: Option<u64>,
    /// For a file-sink job: whether every run moved exactly the committed parts of
    /// checkpoints after the one it restored into `.rolled-back/` (see
    /// [`rollback`]).
    pub roll_back_exact: Option<bool>,
    /// Set when the harness stopped before the job finished: the reason, such as the
    /// error of a job that failed at start-up several times in a row. Nothing was
    /// verified then.
    pub stopped: Option<String>,
    /// Abort points of `failpoints` (an action with `exit`) that aborted no run: the
    /// window they guard was not exercised, so the run does not pass.
    pub failpoints_never_fired: Vec<String>,
    /// Elasticsearch fault phases that fired, in order (with `es_faults`).
    pub network_faults: Vec<es_faults::Fired>,
    /// The test server's counters at the end (with `es_faults`).
    pub es_stats: Option<serde_json::Value>,
    pub elapsed_s: f64,
    pub verdict: Verdict,
}

impl Report {
    /// Adds one member's lane to the report.
    fn absorb(&mut self, lane: Report) {
        self.kills += lane.kills;
        self.failpoint_aborts += lane.failpoint_aborts;
        self.job_failures += lane.job_failures;
        self.restarts += lane.restarts;
        self.checkpoints_completed += lane.checkpoints_completed;
        self.replays_dropped += lane.replays_dropped;
        self.runs.extend(lane.runs);
        self.recovery_ms.extend(lane.recovery_ms);
        self.corrupted = self.corrupted.take().or(lane.corrupted);
        self.corruption_detected = match (self.corruption_detected, lane.corruption_detected) {
            (Some(a), Some(b)) => Some(a && b),
            (a, b) => a.or(b),
        };
        // The report keeps one corruption: a lane's that was not fallen back from wins,
        // so that `passed` fails when any lane's fallback failed.
        self.corruption = match (self.corruption.take(), lane.corruption) {
            (Some(a), Some(b)) if a.fell_back() && !b.fell_back() => Some(b),
            (a, b) => a.or(b),
        };
        self.stopped = match (self.stopped.take(), lane.stopped) {
            (Some(a), Some(b)) => Some(format!("{a}; {b}")),
            (a, b) => a.or(b),
        };
    }

    /// The job finished, its output is exact, a corrupted checkpoint (if any) was
    /// reported and fallen back from, and (file sink) every restore rolled back exactly
    /// the parts it had to.
    pub fn passed(&self) -> bool {
        self.stopped.is_none()
            && self.failpoints_never_fired.is_empty()
            && self.verdict.exact()
            && self.corruption.as_ref().is_none_or(Corruption::fell_back)
            && self.roll_back_exact != Some(false)
    }

    /// Each run whose roll-back was not exact, described.
    pub fn roll_back_problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (i, r) in self.runs.iter().enumerate() {
            let Some(c) = r.roll_back.as_ref().filter(|c| !c.exact) else {
                continue;
            };
            let mut what = Vec::new();
            if !c.unexpected.is_empty() {
                what.push(format!("moved {:?} too", c.unexpected));
            }
            if !c.left.is_empty() && c.restore_done {
                what.push(format!("left {:?} in place", c.left));
            }
            if !c.lost.is_empty() {
                what.push(format!("deleted {:?}", c.lost));
            }
            out.push(format!(
                "run {} (restored {}) had to roll back {:?}, but {}",
                i + 1,
                c.restored
                    .map_or("no checkpoint".into(), |k| format!("checkpoint {k}")),
                c.expected,
                what.join(", ")
            ));
        }
        out
    }

    /// The report as a table.
    pub fn table(&self) -> String {
        let c = self.corruption.as_ref();
        let mut rows: Vec<(&str, String)> = vec![
            ("seed", self.seed.to_string()),
            ("SIGKILLs", self.kills.to_string()),
            ("failpoint aborts", self.failpoint_aborts.to_string()),
            (
                "abort points never fired",
                if self.failpoints.is_none() {
                    "-".into()
                } else if self.failpoints_never_fired.is_empty() {
                    "none".into()
                } else {
                    self.failpoints_never_fired.join(", ")
                },
            ),
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
                c.map_or("-".into(), |c| c.checkpoint.clone()),
            ),
            (
                "corruption reported",
                c.map_or("-".into(), |c| c.reported.to_string()),
            ),
            (
                "restored instead",
                c.map_or("-".into(), |c| match &c.restored {
                    Some(Restored::Checkpoint(n)) => n.clone(),
                    Some(Restored::Empty) => "nothing".into(),
                    Some(Restored::Unknown) | None => "?".into(),
                }),
            ),
        ];
        // Only a run through a repartition stage can drop replays.
        if self.runs.iter().any(|r| r.stage == Stage::Upstream) {
            rows.push(("replays dropped", self.replays_dropped.to_string()));
        }
        if let Some(exact) = self.roll_back_exact {
            rows.extend([
                (
                    "parts rolled back",
                    self.parts_rolled_back.unwrap_or(0).to_string(),
                ),
                ("roll-back exact", exact.to_string()),
            ]);
        }
        if self.stopped.is_none() {
            rows.extend([
                ("input records", self.verdict.inputs.to_string()),
                (
                    "expected documents",
                    self.verdict.expected_documents.to_string(),
                ),
                ("documents", self.verdict.documents.to_string()),
                ("missing", self.verdict.missing.to_string()),
                ("duplicated", self.verdict.duplicated.to_string()),
                ("wrong", self.verdict.wrong.to_string()),
            ]);
            if self.verdict.dead_lettered > 0 {
                rows.push(("dead-lettered", self.verdict.dead_lettered.to_string()));
            }
        } else {
            rows.push(("verification", "not run".into()));
        }
        rows.push(("elapsed (s)", format!("{:.1}", self.elapsed_s)));
        let mut s = String::new();
        for (k, v) in rows {
            s.push_str(&format!("  {k:<24} {v:>14}\n"));
        }
        if let Some(why) = &self.stopped {
            s.push_str(&format!("  stopped: {why}\n"));
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
    restored: Option<Restored>,
    /// Names of checkpoints it skipped because they did not verify.
    skipped: Vec<String>,
    /// Its last `error:` line.
    error: Option<String>,
    /// The failpoint that aborted it.
    failpoint: Option<String>,
    /// Σ next offsets of the restored checkpoint (read when it was restored).
    restored_offsets: Option<u64>,
    /// Records dropped as replays of the upstream stage.
    replays_dropped: u64,
}

/// The `dropped=N` of a source's log line about replays of the upstream stage.
fn replays_dropped(line: &str) -> Option<u64> {
    if !line.contains("a replay of the upstream stage") {
        return None;
    }
    let rest = &line[line.find(" dropped=")? + " dropped=".len()..];
    let digits = rest.split(|c: char| !c.is_ascii_digit()).next()?;
    digits.parse().ok()
}

fn spawn(
    opts: &ChaosOptions,
    (config, stage): (&Path, Stage),
    member: Member,
    run: u32,
    log: &Arc<Mutex<std::fs::File>>,
) -> std::io::Result<(Child, Arc<Mutex<RunEvents>>, std::thread::JoinHandle<()>)> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("run").arg("--config").arg(config);
    if member.count > 1 {
        cmd.arg("--member")
            .arg(member.index.to_string())
            .arg("--members")
            .arg(member.count.to_string());
    }
    let armed = opts.failpoint_runs.is_none_or(|n| run <= n);
    match opts.failpoints.as_ref().filter(|_| armed) {
        Some(f) => cmd.env(crate::fault::ENV, f),
        None => cmd.env_remove(crate::fault::ENV),
    };
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn()?;
    let events = Arc::new(Mutex::new(RunEvents::default()));
    let stderr = child.stderr.take().expect("piped");
    let (ev, log) = (events.clone(), log.clone());
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let mut e = ev.lock().expect("lock");
            if e.first_record.is_none() && line.contains("first records emitted") {
                e.first_record = Some(Instant::now());
            }
            if line.contains("checkpoint completed") {
                e.checkpoints += 1;
            }
            if e.restored.is_none() {
                e.restored = outcome::restore_decision(&line);
                if let (Some(Restored::Checkpoint(_)), Some(path)) =
                    (&e.restored, outcome::checkpoint_path(&line))
                {
                    // Read now: retention may remove it later in the run.
                    e.restored_offsets = crate::state::CheckpointMetadata::read(Path::new(path))
                        .ok()
                        .map(|m| m.positions.iter().map(|p| p.next.0.max(0) as u64).sum());
                }
            }
            if let Some(name) = outcome::failpoint_fired(&line) {
                e.failpoint = Some(name.to_string());
            }
            if line.contains("skipping checkpoint") {
                if let Some(name) = outcome::checkpoint_name(&line) {
                    e.skipped.push(name.to_string());
                }
            }
            if let Some(err) = line.strip_prefix("error: ") {
                e.error = Some(err.to_string());
            }
            e.replays_dropped += replays_dropped(&line).unwrap_or(0);
            let stage = match stage {
                Stage::Upstream => "upstream ",
                Stage::Job => "",
            };
            let _ = match member.line() {
                Some(l) => writeln!(log.lock().expect("lock"), "[{stage}{l}] {line}"),
                None if !stage.is_empty() => {
                    writeln!(log.lock().expect("lock"), "[upstream] {line}")
                }
                None => writeln!(log.lock().expect("lock"), "{line}"),
            };
        }
    });
    Ok((child, events, reader))
}

/// The complete checkpoints of a checkpoint directory, oldest first.
pub use crate::testkit::checkpoint::complete_checkpoints;

/// Damages the newest complete checkpoint: a flipped byte or a truncation of its
/// `_metadata` or of one of its keyed state files (SSTs and WAL copies). Returns the checkpoint's directory and what
/// was done.
pub fn corrupt_latest(checkpoint_dir: &Path, rng: &mut impl Rng) -> Option<(PathBuf, String)> {
    let newest = complete_checkpoints(checkpoint_dir).pop()?;
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
                        // SST files, and the WAL copy that holds what is not
                        // flushed yet (all of a small state).
                        .filter(|p| p.extension().is_some_and(|x| x == "sst" || x == "log"))
                        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 0)),
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
    Some((newest, format!("{how} {}", file.display())))
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Whether falling back from the newest of the complete checkpoints `chks` (oldest
/// first) to the one before it leaves committed parts to roll back: for a file-sink job,
/// a corruption meant to prove the roll-back waits for that. Always true for an
/// Elasticsearch job, and false with fewer than two checkpoints.
fn fallback_rolls_back(target: &Target, chks: &[PathBuf]) -> bool {
    let Some(fallback) = chks.len().checked_sub(2).map(|i| file_name(&chks[i])) else {
        return false;
    };
    let target::Output::Files(dir) = &target.output else {
        return true;
    };
    let Some((k, _)) = crate::state::snapshot_dir::parse_name(&fallback) else {
        return false;
    };
    rollback::list(dir).is_ok_and(|l| !rollback::parts_after(&l.committed, Some(k.0)).is_empty())
}

/// Waits for `child`; kills it at `kill_at`, but not before `may_kill()` holds (the
/// moment a kill is meant to hit). Returns the exit status, or None if it was killed.
fn supervise(
    child: &mut Child,
    kill_at: Option<Instant>,
    mut may_kill: impl FnMut() -> bool,
) -> Result<Option<ExitStatus>, String> {
    loop {
        if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
            return Ok(Some(s));
        }
        if kill_at.is_some_and(|t| Instant::now() >= t) && may_kill() {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs the harness. `after_kill(i)` runs after the `i`-th kill (the demo creates a
/// topic there).
///
/// The harness never assumes a timing: a kill meant to leave a checkpoint to corrupt
/// waits until two complete checkpoints exist, the run after a corruption is not killed
/// before it logged its restore decision, a file-sink job's kill meant to leave a
/// checkpoint to corrupt also waits until the fallback has committed parts to roll back,
/// and a job that fails at start-up with the same
/// error [`outcome::HOPELESS_AFTER`] times in a row, backing off between them, over at
/// least [`outcome::HOPELESS_SPAN_MS`], stops the harness with that error in
/// the report (`stopped`) instead of being restarted again and again.
pub fn run(opts: &ChaosOptions, mut after_kill: impl FnMut(u32) + Send) -> Result<Report, String> {
    let (target, upstream, verified) = read_targets(opts)?;
    let started = Instant::now();
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
    let bar = progress_bar(opts, upstream.is_some());
    let stop_faults = Arc::new(AtomicBool::new(false));
    // Whatever way this function returns, the fault thread stops (and clears the
    // faults) instead of leaving them armed on the server.
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let _stop_guard = StopOnDrop(stop_faults.clone());
    let es = match target.elasticsearch() {
        Some(e) => Some(es_http::EsHttp::new(&e.es, Duration::from_secs(10))?),
        None if opts.es_faults => {
            return Err("--es-faults needs a job that writes to Elasticsearch".into())
        }
        None => None,
    };
    let fault_thread = if let (true, Some(es)) = (opts.es_faults, &es) {
        es_faults::set(es, &serde_json::json!({}))?;
        Some(es_faults::cycle(es.clone(), stop_faults.clone()))
    } else {
        None
    };
    if opts.members == 0 {
        return Err("--members must be at least 1".into());
    }
    let after_kill = Mutex::new(&mut after_kill);
    let kills_total = std::sync::atomic::AtomicU32::new(0);
    // The repartition stage runs to its end first: the job's bounded source then reads
    // everything it wrote, replays included.
    let stages = upstream
        .iter()
        .map(|(p, t)| (Stage::Upstream, *p, t))
        .chain([(Stage::Job, opts.config.as_path(), &target)]);
    for (stage, config, target) in stages {
        let ctx = Lane {
            opts,
            stage,
            config,
            target,
            log: &log,
            bar: &bar,
            after_kill: &after_kill,
            kills_total: &kills_total,
        };
        for lane in ctx.run_members() {
            report.absorb(lane?);
        }
        if report.stopped.is_some() {
            break;
        }
    }
    bar.finish_and_clear();
    if let Some(t) = fault_thread {
        stop_faults.store(true, Ordering::Relaxed);
        report.network_faults = t.join().unwrap_or_default();
        report.es_stats = es.as_ref().and_then(es_faults::stats);
    }
    summarize(&mut report, opts, &target)?;
    if report.stopped.is_none() {
        let inputs = verify::read_inputs(&verified)?;
        report.verdict = match &verified.output {
            target::Output::Postgres(cfg) => pg_verify::verify_table(cfg, &inputs.records)?,
            _ => verify::verify(&verified, &inputs)?,
        };
    }
    report.elapsed_s = started.elapsed().as_secs_f64();
    Ok(report)
}

/// The job (`--config`), its repartition stage (`--upstream`, with its path) if any,
/// and what the output is verified against: the repartition stage's input, if any.
/// Each job file is read with the job's own parser, validating all of it.
#[allow(clippy::type_complexity)]
fn read_targets(opts: &ChaosOptions) -> Result<(Target, Option<(&Path, Target)>, Target), String> {
    let target = Target::from_job_file(&opts.config)?;
    let upstream = match &opts.upstream {
        Some(p) => Some((
            p.as_path(),
            Target::from_job_file(p).map_err(|e| format!("--upstream {}: {e}", p.display()))?,
        )),
        None => None,
    };
    let verified = match &upstream {
        Some((_, up)) => target.through(up)?,
        None => {
            if let target::Output::Topic(topic) = &target.output {
                return Err(format!(
                    "this job writes the topic `{topic}`: give the job that reads it as --config and this one as --upstream"
                ));
            }
            target.clone()
        }
    };
    if opts.corrupt_latest {
        let stores = std::iter::once(&target).chain(upstream.as_ref().map(|(_, t)| t));
        if let Some(store) = stores.filter_map(|t| t.checkpoint_store.as_ref()).next() {
            return Err(format!(
                "--corrupt-latest damages checkpoints in a local directory; this job keeps them in {store}"
            ));
        }
    }
    Ok((target, upstream, verified))
}

/// The kills bar (hidden without `--progress`): one kill per member and stage.
fn progress_bar(opts: &ChaosOptions, with_upstream: bool) -> ProgressBar {
    let bar = if opts.progress {
        ProgressBar::new(
            u64::from(opts.kills) * u64::from(opts.members.max(1)) * (1 + u64::from(with_upstream)),
        )
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("  {spinner} [{elapsed_precise}] kills {pos}/{len} {msg}")
            .expect("template"),
    );
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

/// The report's totals over the runs: the file sink's roll-backs, the abort points that
/// never fired, the recovery percentiles.
fn summarize(report: &mut Report, opts: &ChaosOptions, target: &Target) -> Result<(), String> {
    if target.elasticsearch().is_none() {
        let checks = report.runs.iter().filter_map(|r| r.roll_back.as_ref());
        report.parts_rolled_back = Some(checks.clone().map(|c| c.moved.len() as u64).sum());
        report.roll_back_exact = Some(checks.clone().all(|c| c.exact));
    }
    if let Some(spec) = &opts.failpoints {
        let fired: Vec<&str> = report
            .runs
            .iter()
            .filter_map(|r| r.failpoint.as_deref())
            .collect();
        report.failpoints_never_fired = never_fired(spec, &fired)?;
    }
    report.recovery_ms_p50 = percentile(&report.recovery_ms, 0.50);
    report.recovery_ms_p99 = percentile(&report.recovery_ms, 0.99);
    Ok(())
}

/// The abort points of `spec` (items whose action holds `exit`) that no run reports
/// as fired, in the spec's order. Points that only sleep or pause leave no trace and
/// are not counted.
pub fn never_fired(spec: &str, fired: &[&str]) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for a in crate::fault::parse(spec)? {
        if a.action.contains("exit") && !fired.contains(&a.name.as_str()) && !out.contains(&a.name)
        {
            out.push(a.name);
        }
    }
    Ok(out)
}

/// What every member's lane of the harness shares.
struct Lane<'a, F: FnMut(u32) + Send> {
    opts: &'a ChaosOptions,
    stage: Stage,
    /// The job file this lane runs.
    config: &'a Path,
    target: &'a Target,
    log: &'a Arc<Mutex<std::fs::File>>,
    bar: &'a ProgressBar,
    after_kill: &'a Mutex<&'a mut F>,
    /// Kills over all lanes: what `after_kill` is told.
    kills_total: &'a std::sync::atomic::AtomicU32,
}

/// `"member-I-of-N: "` before a message about one member of several, and
/// `"upstream "` before one about the repartition stage.
fn who(stage: Stage, member: Member) -> String {
    let stage = match stage {
        Stage::Upstream => "upstream ",
        Stage::Job => "",
    };
    match member.line() {
        Some(l) => format!("{stage}{l}: "),
        None if !stage.is_empty() => "upstream: ".into(),
        None => String::new(),
    }
}

impl<F: FnMut(u32) + Send> Lane<'_, F> {
    /// Runs every member's lane of this stage (in threads of their own when there are
    /// several); returns their reports in member order.
    fn run_members(&self) -> Vec<Result<Report, String>> {
        if self.opts.members == 1 {
            return vec![self.run(Member::SOLO)];
        }
        std::thread::scope(|scope| {
            let handles: Vec<_> = Member::all(self.opts.members)
                .map(|m| scope.spawn(move || self.run(m)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("a member's lane panicked".into()))
                })
                .collect()
        })
    }

    /// The member's kill schedule: each member has its own, seeded from `--seed`;
    /// member 0's is the single process's. The repartition stage's members have theirs
    /// too.
    fn schedule(&self, member: Member) -> rand::rngs::SmallRng {
        let salt = match self.stage {
            Stage::Upstream => 0x5DEE_CE66_D000,
            Stage::Job => 0,
        };
        rand::rngs::SmallRng::seed_from_u64(
            self.opts
                .seed
                .wrapping_add(u64::from(member.index).wrapping_mul(0x9E37_79B9))
                .wrapping_add(salt),
        )
    }

    /// Runs one member until it finishes: killed on its own seeded schedule, restarted
    /// with the same command. Returns the lane's part of the report (no verdict).
    fn run(&self, member: Member) -> Result<Report, String> {
        let (opts, target) = (self.opts, self.target);
        let line = crate::checkpoint::lines::line_dir(&target.checkpoint_dir, member);
        let mut rng = self.schedule(member);
        let started = Instant::now();
        let mut report = Report::default();
        let mut outcomes: Vec<(RunOutcome, u64)> = Vec::new();
        let mut failure_streak = 0;
        let mut checking: Option<Corruption> = None;
        let mut runs = 0;
        loop {
            runs += 1;
            if runs > opts.max_runs {
                report.stopped = Some(format!(
                    "{}the job did not finish within {} runs",
                    who(self.stage, member),
                    opts.max_runs
                ));
                break;
            }
            let sink_dir = match &target.output {
                target::Output::Files(dir) => Some(dir.as_path()),
                target::Output::Elasticsearch(_)
                | target::Output::Topic(_)
                | target::Output::Postgres(_) => None,
            };
            let sink_before = sink_dir
                .map(rollback::list)
                .transpose()
                .map_err(|e| format!("listing the file sink's directory: {e}"))?;
            let corrupt_next = opts.corrupt_latest && report.corruption.is_none();
            let kill = report.kills < opts.kills;
            let (status, ev, spawned) = self.supervised_run(
                member,
                runs,
                &line,
                &mut rng,
                (kill, corrupt_next, checking.is_some()),
            )?;
            report.checkpoints_completed += ev.checkpoints;
            report.replays_dropped += ev.replays_dropped;
            let first_record_ms = ev
                .first_record
                .map(|t| t.duration_since(spawned).as_millis() as u64);
            if runs > 1 {
                report.recovery_ms.extend(first_record_ms);
            }
            if let Some(mut c) = checking.take() {
                c.reported = ev.skipped.contains(&c.checkpoint);
                c.restored = ev.restored.clone();
                report.corruption_detected = Some(c.fell_back());
                report.corruption = Some(c);
            }
            let Some(outcome) = run_outcome(status, &ev) else {
                return Err(format!(
                    "{}the job refused its configuration (see {})",
                    who(self.stage, member),
                    opts.log.display()
                ));
            };
            let roll_back = match (sink_dir, &sink_before) {
                (Some(dir), Some(before)) => Some(roll_back_check(dir, before, &ev, &outcome)?),
                _ => None,
            };
            report.runs.push(RunRecord {
                stage: self.stage,
                member: member.index,
                ended: ended(&outcome),
                restored: ev.restored.clone().unwrap_or(Restored::Unknown),
                checkpoints: ev.checkpoints,
                first_record_ms,
                signal: match &outcome {
                    RunOutcome::Killed => Some("SIGKILL".into()),
                    RunOutcome::FailpointAbort => Some("SIGABRT".into()),
                    _ => None,
                },
                failpoint: ev.failpoint.clone(),
                restored_offsets: ev.restored_offsets,
                roll_back,
                newest_after: complete_checkpoints(&line).last().map(|p| file_name(p)),
            });
            outcomes.push((outcome.clone(), started.elapsed().as_millis() as u64));
            match outcome {
                RunOutcome::Finished => break,
                RunOutcome::Killed => {
                    report.kills += 1;
                    self.count_kill(runs, &report);
                    if corrupt_next {
                        if let Some(c) = corrupt_for_next_run(target, &line, &mut rng, &mut report)
                        {
                            checking = Some(c);
                        }
                    }
                }
                RunOutcome::FailpointAbort => report.failpoint_aborts += 1,
                RunOutcome::Failed { .. } => {
                    report.job_failures += 1;
                    if let Some(error) = outcome::hopeless(&outcomes) {
                        report.stopped = Some(format!(
                            "{}the job failed at start-up {} times in a row over {} s or more: {error}",
                            who(self.stage, member),
                            outcome::HOPELESS_AFTER,
                            outcome::HOPELESS_SPAN_MS / 1000
                        ));
                        break;
                    }
                    failure_streak += 1;
                    std::thread::sleep(Duration::from_millis(outcome::failure_backoff_ms(
                        failure_streak,
                    )));
                }
            }
            if !matches!(outcome, RunOutcome::Failed { .. }) {
                failure_streak = 0;
            }
            report.restarts += 1;
        }
        Ok(report)
    }

    /// Starts run `runs` of the member and waits until it ends; returns its exit status
    /// (none: killed), what its log said, and when it started. With a kill left
    /// (`kill`), it is killed at a time drawn from the schedule, but not before the
    /// fallback of the checkpoint to corrupt has something to roll back
    /// (`corrupt_next`), nor, after a corruption (`checking`), before the run logged
    /// its restore decision.
    fn supervised_run(
        &self,
        member: Member,
        runs: u32,
        line: &Path,
        rng: &mut rand::rngs::SmallRng,
        (kill, corrupt_next, checking): (bool, bool, bool),
    ) -> Result<(Option<ExitStatus>, RunEvents, Instant), String> {
        let (opts, target) = (self.opts, self.target);
        let spawned = Instant::now();
        let (mut child, events, reader) =
            spawn(opts, (self.config, self.stage), member, runs, self.log)
                .map_err(|e| format!("cannot start the job: {e}"))?;
        let kill_at = kill.then(|| {
            spawned
                + Duration::from_millis(rng.gen_range(opts.kill_after_ms.0..=opts.kill_after_ms.1))
        });
        let status = supervise(&mut child, kill_at, || {
            let decided = events.lock().expect("lock").restored.is_some();
            let enough = !corrupt_next || fallback_rolls_back(target, &complete_checkpoints(line));
            (!checking || decided) && enough
        })?;
        // The process is gone: its log ends.
        let _ = reader.join();
        let ev = std::mem::take(&mut *events.lock().expect("lock"));
        Ok((status, ev, spawned))
    }

    /// Counts a kill over all lanes, shows it, and runs `after_kill` with the total.
    fn count_kill(&self, runs: u32, report: &Report) {
        let total = self.kills_total.fetch_add(1, Ordering::Relaxed) + 1;
        self.bar.inc(1);
        self.bar.set_message(format!(
            "runs {runs}, checkpoints {}",
            report.checkpoints_completed
        ));
        (self.after_kill.lock().expect("lock"))(total);
    }
}

/// How a run ended, from its exit status (none: SIGKILLed by the harness) and what its
/// log said; none for a job that refused its configuration (exit 2), which no restart
/// cures.
fn run_outcome(status: Option<ExitStatus>, ev: &RunEvents) -> Option<RunOutcome> {
    Some(match status {
        None => RunOutcome::Killed,
        Some(s) if s.success() => RunOutcome::Finished,
        Some(s) if s.code() == Some(2) => return None,
        Some(s) if std::os::unix::process::ExitStatusExt::signal(&s) == Some(libc::SIGABRT) => {
            RunOutcome::FailpointAbort
        }
        // A job failure (exit 1), a panic or a crash: restarted, and counted.
        Some(s) => RunOutcome::Failed {
            error: ev.error.clone().unwrap_or_else(|| format!("{s}")),
            started: ev.first_record.is_some() || ev.checkpoints > 0,
        },
    })
}

/// How a run ended, as the report's table says it.
fn ended(outcome: &RunOutcome) -> String {
    match outcome {
        RunOutcome::Killed => "killed".into(),
        RunOutcome::Finished => "finished".into(),
        RunOutcome::FailpointAbort => "failpoint-abort".into(),
        RunOutcome::Failed { error, .. } => format!("failed: {error}"),
    }
}

/// What a run did to the file sink's directory (`before` it started): whether its
/// restore rolled back exactly the parts committed after the restored checkpoint.
fn roll_back_check(
    dir: &Path,
    before: &rollback::SinkListing,
    ev: &RunEvents,
    outcome: &RunOutcome,
) -> Result<rollback::RollBackCheck, String> {
    let after =
        rollback::list(dir).map_err(|e| format!("listing the file sink's directory: {e}"))?;
    let restore_done = ev.checkpoints > 0 || *outcome == RunOutcome::Finished;
    Ok(rollback::check(
        before,
        &after,
        ev.restored.as_ref().unwrap_or(&Restored::Unknown),
        restore_done,
    ))
}

/// After a kill meant to leave a checkpoint to corrupt: damages the newest complete
/// checkpoint, if its fallback rolls back (and one could be damaged), and records it in
/// the report; returns it, for the next run to complete.
fn corrupt_for_next_run(
    target: &Target,
    line: &Path,
    rng: &mut rand::rngs::SmallRng,
    report: &mut Report,
) -> Option<Corruption> {
    let chks = complete_checkpoints(line);
    if !fallback_rolls_back(target, &chks) {
        return None;
    }
    let fallback = file_name(&chks[chks.len() - 2]);
    let (chk, what) = corrupt_latest(line, rng)?;
    report.corrupted = Some(what.clone());
    let checking = Corruption {
        what,
        checkpoint: file_name(&chk),
        fallback,
        ..Default::default()
    };
    // Recorded now, completed by the next run.
    report.corruption = Some(checking.clone());
    Some(checking)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abort_points_that_never_fired_are_named_and_fail_the_run() {
        let spec = "before-sink-flush@1=exit; source-batch=sleep(20); after-publish=20%exit";
        assert_eq!(
            never_fired(spec, &["before-sink-flush"]).unwrap(),
            vec!["after-publish".to_string()]
        );
        assert!(never_fired(spec, &["after-publish", "before-sink-flush"])
            .unwrap()
            .is_empty());
        // A point that only sleeps is never required to fire.
        assert!(never_fired("source-batch=sleep(20)", &[])
            .unwrap()
            .is_empty());
        let mut r = Report {
            failpoints: Some(spec.into()),
            failpoints_never_fired: vec!["after-publish".into()],
            ..Default::default()
        };
        assert!(
            !r.passed(),
            "a window that was not exercised is not verified"
        );
        assert!(r.table().contains("after-publish"), "{}", r.table());
        r.failpoints_never_fired.clear();
        assert!(r.passed());
    }

    #[test]
    fn the_table_counts_dropped_replays_only_for_a_run_through_a_repartition_stage() {
        let run = |stage| RunRecord {
            stage,
            member: 0,
            ended: "finished".into(),
            restored: Restored::Empty,
            checkpoints: 1,
            first_record_ms: None,
            signal: None,
            failpoint: None,
            newest_after: None,
            restored_offsets: None,
            roll_back: None,
        };
        let mut r = Report {
            runs: vec![run(Stage::Job)],
            ..Default::default()
        };
        assert!(!r.table().contains("replays dropped"), "{}", r.table());
        r.runs.insert(0, run(Stage::Upstream));
        r.replays_dropped = 17;
        assert!(
            r.table()
                .lines()
                .any(|l| l.contains("replays dropped") && l.ends_with(" 17")),
            "{}",
            r.table()
        );
    }

    #[test]
    fn how_a_run_ended_from_its_exit_status() {
        use std::os::unix::process::ExitStatusExt;
        let ev = RunEvents::default();
        assert_eq!(run_outcome(None, &ev), Some(RunOutcome::Killed));
        let exited = |code: i32| Some(ExitStatus::from_raw(code << 8));
        assert_eq!(run_outcome(exited(0), &ev), Some(RunOutcome::Finished));
        assert_eq!(run_outcome(exited(2), &ev), None, "a refused configuration");
        let aborted = Some(ExitStatus::from_raw(libc::SIGABRT));
        assert_eq!(run_outcome(aborted, &ev), Some(RunOutcome::FailpointAbort));
        let failed = RunEvents {
            error: Some("error: no broker".into()),
            checkpoints: 1,
            ..Default::default()
        };
        assert_eq!(
            run_outcome(exited(1), &failed),
            Some(RunOutcome::Failed {
                error: "error: no broker".into(),
                started: true
            })
        );
        assert!(matches!(
            run_outcome(exited(1), &ev),
            Some(RunOutcome::Failed { started: false, .. })
        ));
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        assert_eq!(percentile(&[], 0.5), 0);
        assert_eq!(percentile(&[5], 0.99), 5);
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 50);
        assert_eq!(percentile(&v, 0.99), 99);
    }
}
