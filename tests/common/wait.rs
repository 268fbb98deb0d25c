//! Waiting for a moment instead of assuming it: process-level tests poll for the state
//! they depend on (a log line, a checkpoint count, a fault that fired) with a generous
//! deadline, so that a loaded machine makes them slower, never wrong.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

/// The deadline of a wait for a moment of a job: an upper bound only, generous enough
/// for a busy machine.
pub const DEADLINE: Duration = Duration::from_secs(120);

/// The CPU time (clock ticks, user and system, its own and its waited-for children's)
/// process `pid` has spent so far; 0 when it cannot be read.
pub fn cpu_ticks(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // The command name (field 2) may hold spaces: fields are counted after its `)`.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    rest.split_whitespace()
        .skip(11) // fields 3..=13
        .take(4) // utime, stime, cutime, cstime
        .filter_map(|f| f.parse::<u64>().ok())
        .sum()
}

/// The longest a [`progressing`] wait goes on, progress or not.
pub const PROGRESS_CAP: Duration = Duration::from_secs(360);

/// Polls `cond` every 20 ms until it holds; panics with `what` after `timeout`.
pub fn until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `done` every 100 ms until it holds, for as long as `progress` keeps changing:
/// fails (with `what` and `context()`) when `progress` stood still for `stall`, or
/// after [`PROGRESS_CAP`] whatever it does. A loaded machine makes the wait longer,
/// never the test wrong; a job that is stuck fails it after `stall`.
pub fn progressing<P: PartialEq + std::fmt::Debug>(
    what: &str,
    stall: Duration,
    mut progress: impl FnMut() -> P,
    mut done: impl FnMut() -> bool,
    context: &dyn Fn() -> String,
) {
    let mut last = progress();
    let mut since = Instant::now();
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < PROGRESS_CAP,
            "{what}: not done after {PROGRESS_CAP:?} (last {last:?})\n{}",
            context()
        );
        let now = progress();
        if now != last {
            last = now;
            since = Instant::now();
        }
        assert!(
            since.elapsed() < stall,
            "{what}: no progress for {stall:?} (last {last:?})\n{}",
            context()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until the file at `path` contains `needle` (a log line, usually).
pub fn for_log(path: &Path, needle: &str, timeout: Duration) {
    until(
        &format!("{needle:?} in {}", path.display()),
        timeout,
        || std::fs::read_to_string(path).is_ok_and(|t| t.contains(needle)),
    );
}

/// How many times `needle` occurs in the file at `path` (0 while it does not exist).
pub fn count(path: &Path, needle: &str) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.matches(needle).count())
}

/// Polls `cond` every 20 ms until it holds while `child` keeps running. Fails at once,
/// with the tail of `log`, if the child exits before `cond` holds, and once the child
/// spent no CPU time for `timeout` (a loaded machine slows it, not fails it), or after
/// three times `timeout`.
pub fn while_running(
    child: &mut Child,
    log: &Path,
    what: &str,
    timeout: Duration,
    mut cond: impl FnMut() -> bool,
) {
    let start = Instant::now();
    let mut since = Instant::now();
    let mut cpu = cpu_ticks(child.id());
    let log_tail = || super::tail(&std::fs::read_to_string(log).unwrap_or_default(), 40);
    loop {
        if cond() {
            return;
        }
        if let Some(status) = child.try_wait().unwrap() {
            if cond() {
                return;
            }
            panic!(
                "the process ended ({status}) before {what}; log tail:\n{}",
                log_tail()
            );
        }
        let now = cpu_ticks(child.id());
        if now > cpu {
            cpu = now;
            since = Instant::now();
        }
        if since.elapsed() > timeout || start.elapsed() > timeout * 3 {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "timed out after {timeout:?} waiting for {what}; log tail:\n{}",
                log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits, while `child` runs, until `needle` occurs at least `n` times in `log`.
pub fn for_log_while_running(
    child: &mut Child,
    log: &Path,
    needle: &str,
    n: usize,
    timeout: Duration,
) {
    while_running(
        child,
        log,
        &format!("{n} x {needle:?} in {}", log.display()),
        timeout,
        || count(log, needle) >= n,
    );
}

/// Whether `child` is still running.
pub fn running(child: &mut Child) -> bool {
    child.try_wait().unwrap().is_none()
}
