//! Helpers for process-level tests: job files, spawning the real binary, killing it,
//! and verifying what it committed.
#![allow(dead_code)]

pub mod confluent;
pub mod es;
pub mod kafka;
pub mod lake;
pub mod peak;
pub mod telemetry;
pub mod wait;

use lockgate::testkit::file_output::{self, Verification};
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The `lockgate` binary under test.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_lockgate"))
}

/// A `sequence -> [rolling_sum] -> file` job.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: String,
    pub parallelism: u16,
    pub to: i64,
    pub keys: u32,
    pub rate_per_sec: u64,
    pub interval_ms: u64,
    pub rolling_sum: bool,
    /// In-process restarts (fixed delay of 100 ms); 0 = strategy "none".
    pub restart_attempts: u32,
    /// More lines of `[sink.file]` (`roll_bytes = ...`).
    pub sink_keys: String,
}

impl Spec {
    pub fn new(to: i64) -> Spec {
        Spec {
            name: "test-job".into(),
            parallelism: 2,
            to,
            keys: 1000,
            rate_per_sec: 0,
            interval_ms: 200,
            rolling_sum: true,
            restart_attempts: 0,
            sink_keys: String::new(),
        }
    }
}

/// A job's directory: job file, checkpoints, output, and the log of every run.
pub struct JobDir {
    pub root: PathBuf,
    pub spec: Spec,
}

impl JobDir {
    pub fn new(root: &Path, spec: Spec) -> JobDir {
        std::fs::create_dir_all(root).unwrap();
        let j = JobDir {
            root: root.to_path_buf(),
            spec,
        };
        j.write_config(&j.spec.clone());
        j
    }

    pub fn config(&self) -> PathBuf {
        self.root.join("job.toml")
    }

    pub fn checkpoints(&self) -> PathBuf {
        self.root.join("checkpoints")
    }

    pub fn out(&self) -> PathBuf {
        self.root.join("out")
    }

    pub fn log(&self) -> PathBuf {
        self.root.join("runs.log")
    }

    /// Rewrites the job file (for example with another parallelism).
    pub fn write_config(&self, s: &Spec) {
        let transform = if s.rolling_sum {
            "[[transform]]\ntype = \"rolling_sum\"\nkey = \"/key\"\nfield = \"/value\"\noutput = \"/total\"\n"
        } else {
            ""
        };
        let restart = if s.restart_attempts == 0 {
            "strategy = \"none\"".to_string()
        } else {
            format!(
                "strategy = \"fixed-delay\"\nattempts = {}\ndelay_ms = 100",
                s.restart_attempts
            )
        };
        let text = format!(
            "[job]\nname = \"{}\"\nparallelism = {}\n\n[checkpoint]\ndir = \"checkpoints\"\ninterval_ms = {}\n\n\
             [restart]\n{restart}\n\n\
             [source.sequence]\nfrom = 1\nto = {}\nkeys = {}\nrate_per_sec = {}\n\n{transform}\n[sink.file]\ndir = \"out\"\n{}\n",
            s.name, s.parallelism, s.interval_ms, s.to, s.keys, s.rate_per_sec, s.sink_keys
        );
        std::fs::write(self.config(), text).unwrap();
    }

    /// Starts `lockgate run` on the job file; stderr is appended to the run log.
    pub fn spawn(&self, extra: &[&str]) -> Child {
        self.spawn_env(extra, &[])
    }

    /// [`JobDir::spawn`] with environment variables (for example failpoints).
    pub fn spawn_env(&self, extra: &[&str], env: &[(&str, &str)]) -> Child {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log())
            .unwrap();
        Command::new(bin())
            .envs(env.iter().copied())
            .arg("run")
            .arg("--config")
            .arg(self.config())
            .args(extra)
            .env("LOCKGATE_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    /// Runs the job to its end and returns the exit status.
    pub fn run_to_end(&self, extra: &[&str]) -> ExitStatus {
        wait_timeout(&mut self.spawn(extra), Duration::from_secs(120))
    }

    /// Everything the runs logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_default()
    }

    /// Checks the committed output against the sequence.
    pub fn verify(&self) -> Verification {
        let total = self.spec.rolling_sum.then_some("/total");
        file_output::verify(&self.out(), 1, self.spec.to, self.spec.keys, total).unwrap()
    }

    /// All committed lines, sorted (to compare two runs).
    pub fn committed_lines(&self) -> Vec<String> {
        let mut lines = committed_lines_in(&self.out());
        lines.sort();
        lines
    }

    /// Complete checkpoint directories, oldest first.
    pub fn complete_checkpoints(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(self.checkpoints())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                let n = p.file_name().unwrap().to_string_lossy().to_string();
                n.starts_with("chk-") && !n.ends_with(".inprogress") && p.join("_metadata").exists()
            })
            .collect();
        v.sort();
        v
    }

    /// Waits until at least `n` checkpoints are complete.
    pub fn wait_for_checkpoints(&self, n: usize, timeout: Duration) {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if self.checkpoints().exists() && self.complete_checkpoints().len() >= n {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "fewer than {n} checkpoints after {timeout:?}; log:\n{}",
            self.log_text()
        );
    }
}

/// Runs `lockgate args` to its end: (exit code, stdout, stderr).
pub fn lockgate(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(bin()).args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `lockgate run --config <config>` to its end (failing the test past
/// [`wait::DEADLINE`]): its exit code and its stderr, where the job logs. The log is
/// also kept beside the job file (`<config>.log`).
pub fn run_config(config: &Path) -> (Option<i32>, String) {
    let log = config.with_extension("log");
    let mut child = Command::new(bin())
        .args(["run", "--config"])
        .arg(config)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("the log file"))
        .spawn()
        .expect("run lockgate");
    let status = wait_timeout(&mut child, wait::DEADLINE);
    (
        status.code(),
        std::fs::read_to_string(&log).unwrap_or_default(),
    )
}

/// The lines of the committed part files of a file sink's directory `out`.
pub fn committed_lines_in(out: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    for e in std::fs::read_dir(out).unwrap() {
        let e = e.unwrap();
        if e.file_name().to_string_lossy().starts_with("part-") {
            lines.extend(
                std::fs::read_to_string(e.path())
                    .unwrap()
                    .lines()
                    .map(String::from),
            );
        }
    }
    lines
}

/// Waits for a child, killing it (and failing) once it made no progress for
/// `timeout`: progress is CPU time the child spends, so a loaded machine that runs it
/// slowly extends the wait, and a child that is stuck (or waits forever) fails it.
/// Three times `timeout` bounds the wait whatever the child does.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> ExitStatus {
    let start = Instant::now();
    let mut since = Instant::now();
    let mut cpu = wait::cpu_ticks(child.id());
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        let now = wait::cpu_ticks(child.id());
        if now > cpu {
            cpu = now;
            since = Instant::now();
        }
        if since.elapsed() > timeout || start.elapsed() > timeout * 3 {
            let _ = child.kill();
            panic!(
                "process made no progress for {timeout:?} (or ran past {:?})",
                timeout * 3
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Sends SIGKILL if the child is still running; returns whether it was.
pub fn sigkill(child: &mut Child) -> bool {
    let alive = child.try_wait().unwrap().is_none();
    if alive {
        child.kill().unwrap();
    }
    child.wait().unwrap();
    alive
}

/// Sends a signal to the child.
pub fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on a pid we spawned and have not reaped.
    let rc = unsafe { libc::kill(child.id() as i32, sig) };
    assert_eq!(rc, 0);
}

/// The seed of a randomised test: `LOCKGATE_TEST_SEED` or the given default, printed
/// so that a failure replays.
pub fn seed(default: u64) -> u64 {
    let s = std::env::var("LOCKGATE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    eprintln!("seed = {s} (set LOCKGATE_TEST_SEED to replay)");
    s
}

/// Asserts exactly-once output, printing the verification and the log otherwise.
pub fn assert_exact(j: &JobDir) {
    let v = j.verify();
    assert!(
        v.is_exact() && v.committed == v.expected,
        "output not exact: {v:?}\nlog tail:\n{}",
        tail(&j.log_text(), 40)
    );
}

pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Runs `lockgate chaos` and returns its exit code, stdout and JSON report.
pub fn chaos(config: &Path, args: &[&str]) -> (Option<i32>, String, serde_json::Value) {
    let report = config.with_file_name("report.json");
    let mut child = Command::new(bin())
        .arg("chaos")
        .arg("--config")
        .arg(config)
        .arg("--report")
        .arg(&report)
        .args(args)
        .stdout(std::fs::File::create(config.with_file_name("chaos.out")).unwrap())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let status = wait_timeout(&mut child, Duration::from_secs(900));
    let mut out = std::fs::read_to_string(config.with_file_name("chaos.out")).unwrap();
    if status.code() != Some(0) {
        // The runs' own log says why.
        let log = std::fs::read_to_string(config.with_extension("chaos.log")).unwrap_or_default();
        out.push_str(&format!("\n--- job log ---\n{}", tail(&log, 40)));
    }
    let r = std::fs::read_to_string(&report)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(serde_json::Value::Null);
    (status.code(), out, r)
}

/// Copies the directory tree `from` to `to` (files and folders, as they are).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// The Python of a virtual environment of pinned requirements: the one `var` names if
/// set, or `<name>` created once under the target directory from `requirements` (a
/// path under the repository); `what` says what it must have, for the error.
pub fn venv_python(var: &str, name: &str, requirements: &str, what: &str) -> PathBuf {
    if let Ok(p) = std::env::var(var) {
        return PathBuf::from(p);
    }
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let venv = tmp.join(name);
    let python = venv.join("bin/python");
    let ready = venv.join("installed");
    std::fs::create_dir_all(&tmp).unwrap();
    let lock = std::fs::File::create(tmp.join(format!("{name}.lock"))).unwrap();
    // SAFETY: flock on a descriptor we own.
    unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) };
    if ready.exists() {
        return python;
    }
    let requirements = Path::new(env!("CARGO_MANIFEST_DIR")).join(requirements);
    let ok = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .unwrap()
        .success()
        && Command::new(venv.join("bin/pip"))
            .args(["install", "-q", "-r"])
            .arg(&requirements)
            .status()
            .unwrap()
            .success();
    assert!(
        ok,
        "cannot install {} from PyPI (set {var} to a Python that has {what})",
        requirements.display()
    );
    std::fs::write(&ready, b"").unwrap();
    python
}
