//! Peak resident memory of a child process, exact: the kernel's `ru_maxrss` of the
//! child from wait4(2), not a sampled figure.

use super::tail;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs `cmd` (stderr to `log`) until it exits, killing it after `limit`; asserts that
/// it exited 0 and returns its peak resident memory in bytes.
pub fn run_to_end(mut cmd: Command, log: &Path, limit: Duration) -> u64 {
    let child = cmd
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    // A watchdog: a job that hangs is killed, and the assertion below fails.
    let done = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let done = done.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            while !done.load(Ordering::SeqCst) {
                if start.elapsed() > limit {
                    // SAFETY: kill(2) on our child, not yet reaped (done is false).
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let mut status = 0i32;
    // SAFETY: zeroed rusage is a valid out-parameter.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4(2) on our own child; std's Child is not waited on afterwards.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    done.store(true, Ordering::SeqCst);
    watchdog.join().unwrap();
    drop(child);
    assert_eq!(rc, pid);
    let text = std::fs::read_to_string(log).unwrap_or_default();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{} did not end with exit 0 (status {status}):\n{}",
        log.display(),
        tail(&text, 30)
    );
    // Linux reports ru_maxrss in KiB.
    usage.ru_maxrss as u64 * 1024
}
