//! What the benchmarks share: medians, percentiles, the machine, and the test servers
//! and jobs run as separate processes of the `lockgate` binary (as users run them).
#![allow(dead_code)] // each benchmark uses part of it

pub mod ack_server;
pub mod avro;
pub mod checkpoints;
pub mod end_to_end;
pub mod file_sink;
pub mod format_speed;
pub mod postgres;
pub mod recovery;
pub mod sink;
pub mod source;
pub mod transforms;
pub mod windows;

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The value of the environment variable `name`, or `default` when it is unset; a value
/// that does not parse stops the benchmark rather than being measured as the default.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v}: not a valid value")),
        Err(_) => default,
    }
}

/// The `lockgate` binary cargo built for the benchmarks.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_lockgate")
}

/// The median of `v` (the upper one of an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    v[v.len() / 2]
}

/// The `p` quantile (0..=1) of sorted values, nearest rank; 0 when empty.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// `x` rounded to three decimals (ratios in reports).
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The machine the figures come from: logical cores and the CPU model.
pub fn machine() -> serde_json::Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, m)| m.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let mem_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .unwrap_or(0);
    serde_json::json!({
        "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "cpu_model": model,
        "memory_gib": (mem_kib as f64 / 1048576.0).round(),
        "os": std::env::consts::OS,
    })
}

/// A server process of `lockgate testkit`, killed when dropped.
pub struct Server {
    child: Child,
    /// The first line it printed: the bootstrap servers or the URL.
    pub address: String,
}

impl Server {
    /// `lockgate testkit kafka` with 3 brokers, `topic` of `partitions` partitions holding
    /// `orders` sample orders (`{"order","user","amount"}`, keyed by user, 1000 users).
    pub fn kafka(topic: &str, partitions: i32, orders: u64) -> Server {
        Server::start(&[
            "testkit",
            "kafka",
            "--brokers",
            "3",
            "--topic",
            &format!("{topic}:{partitions}"),
            "--orders",
            &format!("{topic}:{orders}"),
        ])
    }

    /// `lockgate testkit es` on a free port.
    pub fn elasticsearch() -> Server {
        Server::start(&["testkit", "es", "--listen", "127.0.0.1:0"])
    }

    fn start(args: &[&str]) -> Server {
        let mut child = Command::new(bin())
            .args(args)
            .stdin(Stdio::piped()) // the Kafka server serves until its stdin closes or it is killed
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a test server");
        let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        out.read_line(&mut line).expect("the server's first line");
        let address = line.trim().to_string();
        assert!(!address.is_empty(), "{args:?} printed nothing");
        // Keep reading its output so that it never blocks on a full pipe.
        std::thread::spawn(move || for _ in out.lines() {});
        Server { child, address }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How a job process ended: wall-clock seconds from spawn to exit, and its peak
/// resident memory (the kernel's `ru_maxrss`, exact: the peak, not a sample). Linux
/// counts in that peak the memory the child had before its exec, a copy of this
/// process: it is the job's own only while this process is smaller
/// (`spawner_rss_bytes`, this process's resident memory at the spawn).
pub struct JobRun {
    pub secs: f64,
    pub peak_rss_bytes: u64,
    pub spawner_rss_bytes: u64,
}

/// This process's resident memory now (`VmRSS`), in bytes.
pub fn own_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// Runs `lockgate run --config <config>` to its end; panics (with the log's tail) unless
/// it exits 0.
pub fn run_job(config: &Path) -> JobRun {
    let log = config.with_extension("log");
    let spawner_rss_bytes = own_rss_bytes();
    let start = Instant::now();
    let child = Command::new(bin())
        .args(["run", "--config"])
        .arg(config)
        .env("LOCKGATE_LOG", "info")
        .env_remove("LOCKGATE_FAILPOINTS")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("spawn lockgate run");
    let (status, usage) = wait4(child);
    let secs = start.elapsed().as_secs_f64();
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(20).collect();
        panic!(
            "{} ended with status {status}:\n{}",
            config.display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    JobRun {
        secs,
        peak_rss_bytes: usage.ru_maxrss as u64 * 1024, // KiB on Linux
        spawner_rss_bytes,
    }
}

/// Waits for `child` and returns its wait status and resource usage.
pub fn wait4(child: Child) -> (i32, libc::rusage) {
    let pid = child.id() as i32;
    let mut status = 0i32;
    // SAFETY: zeroed rusage is a valid out-parameter.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4(2) on our own child, which std's Child does not wait on afterwards.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(rc, pid, "wait4: {}", std::io::Error::last_os_error());
    drop(child);
    (status, usage)
}

/// Polls `f` every 50 ms until it returns `Some`, for at most `limit`.
pub fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
