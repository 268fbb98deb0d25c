//! The process-level cases: the connector runs in a real `run --config` process of
//! the program its context names (built from a job file with the connector's section),
//! killed with SIGKILL at seeded moments of the checkpoint protocol or aborted at a
//! failpoint, and started again
//! with the same command, as an operator would.
//!
//! A source is paired with the file sink (exactly-once part files, read back in
//! checkpoint order); a sink with the sequence source.

use super::CaseResult;
use rand::{Rng, SeedableRng};
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The checkpoint-protocol windows every job passes through, each aborted once after
/// a completed checkpoint with records (`name@1=exit`): the restart must restore an
/// older checkpoint or the one just published, and lose nothing.
pub const WINDOWS: &[&str] = &[
    "after-source-snapshot",
    "before-sink-flush",
    "after-sink-flush",
    "before-metadata",
    "mid-metadata",
    "publish-before-fsync",
    "after-publish",
];

/// How long one run may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// The seed of the kill schedule: `LOCKGATE_TEST_SEED` or `default`; failures name it.
pub fn seed(default: u64) -> u64 {
    std::env::var("LOCKGATE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// A running `run` process, killed (SIGKILL) and reaped when dropped: no error path
/// or panic of a case leaves one behind.
pub struct Running(Child);

impl Running {
    /// Its exit status, if it ended.
    fn ended(&mut self) -> Result<Option<ExitStatus>, String> {
        self.0.try_wait().map_err(|e| e.to_string())
    }

    /// Sends `signal`.
    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on a child we spawned and have not reaped (Drop reaps it).
        unsafe { libc::kill(self.0.id() as i32, signal) };
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One job of a case: its job file, checkpoint directory and log, below `dir`.
pub struct ProcessJob {
    program: PathBuf,
    dir: PathBuf,
}

impl ProcessJob {
    /// A job of `program` in `dir` (created).
    pub fn new(program: &Path, dir: &Path) -> Result<ProcessJob, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(ProcessJob {
            program: program.to_path_buf(),
            dir: dir.to_path_buf(),
        })
    }

    /// The checkpoint directory.
    pub fn checkpoints(&self) -> PathBuf {
        self.dir.join("checkpoints")
    }

    /// The file sink's directory (the source cases' output).
    pub fn out(&self) -> PathBuf {
        self.dir.join("out")
    }

    fn config(&self) -> PathBuf {
        self.dir.join("job.toml")
    }

    fn log(&self) -> PathBuf {
        self.dir.join("job.log")
    }

    /// The last lines of the log, for failures.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(25)..].join("\n")
    }

    /// Writes the job file: `source` and `sink` are `(name, TOML body)` of
    /// `[source.<name>]` and `[sink.<name>]`; parallelism 2, a checkpoint every 100 ms,
    /// no in-process restarts (a failure ends the process, like a kill).
    pub fn write(&self, source: &(String, String), sink: &(String, String)) -> CaseResult {
        self.write_at(2, source, sink)
    }

    /// [`ProcessJob::write`] at `parallelism`.
    pub fn write_at(
        &self,
        parallelism: u16,
        source: &(String, String),
        sink: &(String, String),
    ) -> CaseResult {
        let text = format!(
            "[job]\nname = \"conformance\"\nparallelism = {parallelism}\nmax_parallelism = 16\n\n[checkpoint]\ndir = {:?}\ninterval_ms = 100\n\n[restart]\nstrategy = \"none\"\n\n[source.{}]\n{}\n\n[sink.{}]\n{}\n",
            self.checkpoints().display().to_string(),
            source.0,
            source.1,
            sink.0,
            sink.1
        );
        std::fs::write(self.config(), text).map_err(|e| format!("{}: {e}", self.config().display()))
    }

    /// Starts `run --config` with `env`, its log appended to the job's.
    pub fn spawn(&self, env: &[(&str, &str)]) -> Result<Running, String> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log())
            .map_err(|e| e.to_string())?;
        Command::new(&self.program)
            .arg("run")
            .arg("--config")
            .arg(self.config())
            .envs(env.iter().copied())
            .env("LOCKGATE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map(Running)
            .map_err(|e| format!("{}: {e}", self.program.display()))
    }

    /// The id of the newest complete checkpoint (0: none). Ids only grow, whatever
    /// retention removes.
    pub fn newest(&self) -> u64 {
        super::complete_checkpoints(&self.checkpoints())
            .last()
            .and_then(|p| {
                p.file_name()?
                    .to_string_lossy()
                    .strip_prefix("chk-")?
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    }

    /// Waits for the process to exit.
    pub fn wait(&self, child: &mut Running) -> Result<ExitStatus, String> {
        let deadline = Instant::now() + RUN_TIMEOUT;
        loop {
            if let Some(s) = child.ended()? {
                return Ok(s);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the run did not end within {RUN_TIMEOUT:?}: {}",
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs the job to its end, which must be a success.
    pub fn run_to_end(&self) -> CaseResult {
        let mut child = self.spawn(&[])?;
        let status = self.wait(&mut child)?;
        if !status.success() {
            return Err(format!(
                "the last run ended with {status}: {}",
                self.log_tail()
            ));
        }
        Ok(())
    }

    /// Runs the job until it completed a checkpoint of its own (it is up, its signal
    /// handler too) and `done` holds, then stops it with SIGTERM (a final checkpoint),
    /// which must end it with success. `progress` says how far it got, for failures.
    pub fn run_until_then_stop(
        &self,
        mut done: impl FnMut() -> bool,
        progress: impl Fn() -> String,
    ) -> CaseResult {
        let before = self.newest();
        let mut child = self.spawn(&[])?;
        let deadline = Instant::now() + RUN_TIMEOUT;
        while self.newest() <= before || !done() {
            if let Some(status) = child.ended()? {
                return Err(format!(
                    "the last run ended ({status}) before it read everything ({}): {}",
                    progress(),
                    self.log_tail()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the last run did not read everything within {RUN_TIMEOUT:?} ({}): {}",
                    progress(),
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.signal(libc::SIGTERM);
        let status = self.wait(&mut child)?;
        if !status.success() {
            return Err(format!(
                "the stopped run ended with {status}: {}",
                self.log_tail()
            ));
        }
        Ok(())
    }

    /// Runs the job until it kills itself with SIGKILL at `at` (a failpoint, so that
    /// the moment is one of the checkpoint protocol, the same for the same seed).
    /// Returns whether it was killed: a bounded job may end with success first (any
    /// other end is an error).
    pub fn kill_at(&self, at: KillAt) -> Result<bool, String> {
        use std::os::unix::process::ExitStatusExt;
        let spec = at.failpoints();
        // Only this run's part of the log (earlier runs append to the same file).
        let from = std::fs::metadata(self.log()).map_or(0, |m| m.len() as usize);
        let mut child = self.spawn(&[(crate::fault::ENV, &spec)])?;
        let status = self.wait(&mut child)?;
        if status.success() {
            return Ok(false);
        }
        let fired = format!("failpoint {}: kill", at.point);
        let this_run = std::fs::read(self.log())
            .ok()
            .and_then(|b| {
                b.get(from..)
                    .map(|b| String::from_utf8_lossy(b).contains(&fired))
            })
            .unwrap_or(false);
        if status.signal() == Some(libc::SIGKILL) && this_run {
            return Ok(true);
        }
        Err(format!(
            "the run with {spec} ended with {status} instead of its kill: {}",
            self.log_tail()
        ))
    }

    /// Runs the job with failpoint `name` set to abort the process after one
    /// completed checkpoint with records; the process must abort there.
    pub fn abort_at(&self, name: &str) -> CaseResult {
        let spec = format!("{name}@1=exit");
        let mut child = self.spawn(&[(crate::fault::ENV, &spec)])?;
        let status = self.wait(&mut child)?;
        use std::os::unix::process::ExitStatusExt;
        if status.signal() != Some(libc::SIGABRT) {
            return Err(format!(
                "the run with {spec} ended with {status} instead of aborting at the failpoint: {}",
                self.log_tail()
            ));
        }
        Ok(())
    }

    /// What the file sink committed, in checkpoint order (within one checkpoint, by
    /// subtask, then in the order each wrote its files): one value per line.
    pub fn committed_lines(&self) -> Result<Vec<Vec<u8>>, String> {
        use crate::connectors::file_sink::{parse_part_name, PartName};
        let mut parts = Vec::new();
        let rd = match std::fs::read_dir(self.out()) {
            Ok(rd) => rd,
            Err(_) => return Ok(Vec::new()),
        };
        for e in rd {
            let e = e.map_err(|e| e.to_string())?;
            if let Some(PartName::Committed { subtask, id, seq }) =
                parse_part_name(&e.file_name().to_string_lossy())
            {
                parts.push(((id, subtask, seq), e.path()));
            }
        }
        parts.sort();
        let mut lines = Vec::new();
        for (_, p) in parts {
            let bytes = std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            lines.extend(
                bytes
                    .split(|b| *b == b'\n')
                    .filter(|l| !l.is_empty())
                    .map(<[u8]>::to_vec),
            );
        }
        Ok(lines)
    }
}

/// The points a seeded kill may land at, each with the passes it may skip first:
/// each checkpoint passes the last three (with records or without), and a paced
/// source passes `source-batch` many times between two checkpoints.
pub const KILL_POINTS: &[(&str, std::ops::Range<u64>)] = &[
    ("source-batch", 5..60),
    ("after-source-snapshot", 1..6),
    ("before-sink-flush", 1..6),
    ("after-publish", 0..3),
];

/// The kill points of a job whose source may be idle (it read everything it was
/// given): those every checkpoint passes.
pub const CHECKPOINT_KILL_POINTS: &[(&str, std::ops::Range<u64>)] = &[
    ("after-source-snapshot", 1..6),
    ("before-sink-flush", 1..6),
    ("after-publish", 0..3),
];

/// Where a seeded kill lands: at the `hits + 1`-th pass of failpoint `point` (over
/// every subtask of the process) after the process completed a checkpoint holding
/// records, a moment of the checkpoint protocol that a seed names, whatever the
/// machine's speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KillAt {
    pub point: &'static str,
    pub hits: u64,
}

impl KillAt {
    /// `rounds` kills at `points` drawn from `rng`: what a seed replays.
    pub fn schedule(
        rng: &mut impl Rng,
        rounds: usize,
        points: &[(&'static str, std::ops::Range<u64>)],
    ) -> Vec<KillAt> {
        (0..rounds)
            .map(|_| {
                let (point, hits) = &points[rng.gen_range(0..points.len())];
                KillAt {
                    point,
                    hits: rng.gen_range(hits.clone()),
                }
            })
            .collect()
    }

    /// `LOCKGATE_FAILPOINTS` for this kill, armed once the process completed a
    /// checkpoint holding records (`@1`), so that every kill leaves one to restore.
    pub fn failpoints(&self) -> String {
        format!("{}@1={}*off->kill", self.point, self.hits)
    }
}

/// The kill schedule of a case (`rounds` kills at `points`) from its seed, and the
/// note that names the seed and the schedule in failures.
pub fn kill_schedule(
    default: u64,
    rounds: usize,
    points: &[(&'static str, std::ops::Range<u64>)],
) -> (Vec<KillAt>, String) {
    let s = seed(default);
    let schedule = KillAt::schedule(&mut rand::rngs::SmallRng::seed_from_u64(s), rounds, points);
    let moments: Vec<String> = schedule
        .iter()
        .map(|k| format!("{} pass {}", k.point, k.hits + 1))
        .collect();
    (
        schedule,
        format!(
            "(seed {s}: kills at {}; LOCKGATE_TEST_SEED={s} replays that schedule)",
            moments.join(", ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_names_one_kill_schedule() {
        let draw = |seed: u64| {
            KillAt::schedule(
                &mut rand::rngs::SmallRng::seed_from_u64(seed),
                3,
                KILL_POINTS,
            )
        };
        assert_eq!(draw(7), draw(7), "the same seed, the same moments");
        assert!(
            (0..20).any(|s| draw(s) != draw(7)),
            "other seeds, other moments"
        );
        for k in draw(7) {
            assert!(KILL_POINTS
                .iter()
                .any(|(p, hits)| *p == k.point && hits.contains(&k.hits)));
            let armed = crate::fault::parse(&k.failpoints()).unwrap();
            assert_eq!(armed.len(), 1);
            assert_eq!(armed[0].name, k.point);
            assert_eq!(armed[0].after_checkpoints, 1);
            assert_eq!(armed[0].action, format!("{}*off->kill", k.hits));
        }
    }
}
