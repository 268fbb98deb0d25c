//! Build facts for `lockgate --version`: the commit, the target, and the RocksDB
//! release the bundled `librocksdb-sys` builds (its crate version's `+` part).

use std::path::Path;

fn main() {
    let target = std::env::var("TARGET").unwrap_or_default();
    println!("cargo:rustc-env=LOCKGATE_TARGET={target}");
    println!("cargo:rerun-if-env-changed=LOCKGATE_COMMIT");
    let commit = std::env::var("LOCKGATE_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=LOCKGATE_COMMIT={commit}");
    println!("cargo:rerun-if-changed=Cargo.lock");
    let rocksdb = std::fs::read_to_string("Cargo.lock")
        .ok()
        .and_then(|lock| locked_version(&lock, "librocksdb-sys"))
        .and_then(|v| v.split_once('+').map(|(_, r)| r.to_string()))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=LOCKGATE_ROCKSDB_VERSION={rocksdb}");
}

/// The short commit of a git checkout (none outside one, as in a crate download),
/// rebuilt when HEAD moves.
fn git_commit() -> Option<String> {
    let git = Path::new(".git");
    if !git.is_dir() {
        return None;
    }
    println!("cargo:rerun-if-changed=.git/HEAD");
    if let Ok(head) = std::fs::read_to_string(git.join("HEAD")) {
        // Only files that exist: Cargo runs the script again on every build for a
        // path that does not. The reflog moves with every commit, whether the branch
        // is a loose ref or a packed one.
        if let Some(r) = head.trim().strip_prefix("ref: ") {
            for f in [r, "packed-refs", "logs/HEAD"] {
                if git.join(f).is_file() {
                    println!("cargo:rerun-if-changed=.git/{f}");
                }
            }
        }
    }
    let out = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|c| !c.is_empty())
}

/// The version Cargo.lock pins for `name` (the first entry of that name).
fn locked_version(lock: &str, name: &str) -> Option<String> {
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == format!("name = \"{name}\"") {
            let v = lines.next()?.trim().strip_prefix("version = \"")?;
            return Some(v.trim_end_matches('"').to_string());
        }
    }
    None
}
