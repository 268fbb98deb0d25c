//! Named failpoints at every step of the checkpoint protocol, for the fault-injection
//! harness. Configured from `LOCKGATE_FAILPOINTS="name=action;..."`, where an action is
//! one of the `fail` crate's (`panic`, `sleep(ms)`, `off`, `N*action`, `P%action`, ...)
//! or `exit`: an immediate process abort, as if the process were killed at that point,
//! or `kill`: the process sends itself SIGKILL there (what an operator's `kill -9` or
//! the kernel's OOM killer does, at a moment of the protocol rather than of the clock).
//! `name@K=action` arms the point only once the process has completed K checkpoints that
//! hold records, so that an abort hits the window of a later checkpoint, with a
//! restorable one holding records behind it (a point that fires at the first checkpoint
//! proves only that an incomplete checkpoint is never restored). A checkpoint holds
//! records when a source emitted a batch after the previous such checkpoint's trigger
//! and before its own: on a slow start, checkpoint 1 may complete before any record,
//! and counting it would arm the point a checkpoint too early. Without the `failpoints`
//! feature every point compiles to nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::RwLock;

/// Whether any failpoint is configured: an unconfigured point costs one atomic load.
static ARMED: AtomicBool = AtomicBool::new(false);

/// Checkpoints holding records this process completed (published).
static COMPLETED: AtomicU64 = AtomicU64::new(0);

/// A source emitted a batch since the last checkpoint trigger.
static EMITTED: AtomicBool = AtomicBool::new(false);

/// The pending checkpoint holds records (at most one checkpoint is pending at a time).
static PENDING_HOLDS: AtomicBool = AtomicBool::new(false);

/// Points armed only after some completed checkpoints: name -> K.
static AFTER: RwLock<Option<HashMap<String, u64>>> = RwLock::new(None);

/// One item of `LOCKGATE_FAILPOINTS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arming {
    pub name: String,
    /// Armed once this many checkpoints completed (0: at once).
    pub after_checkpoints: u64,
    /// The `fail` crate's action, with `exit` for an abort and `kill` for SIGKILL.
    pub action: String,
}

/// Parses `LOCKGATE_FAILPOINTS`: `name[@K]=action` items separated by `;`. Unknown names
/// are an error, so that a typo does not silently test nothing.
pub fn parse(spec: &str) -> Result<Vec<Arming>, String> {
    let mut out = Vec::new();
    for item in spec.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        let (point, action) = item
            .split_once('=')
            .ok_or_else(|| format!("{ENV}: `{item}` is not name=action"))?;
        let (name, after) = match point.split_once('@') {
            Some((n, k)) => (
                n,
                k.parse::<u64>().map_err(|_| {
                    format!("{ENV}: `{point}`: after `@` comes a number of completed checkpoints")
                })?,
            ),
            None => (point, 0),
        };
        if !FAILPOINTS.iter().any(|(n, _)| *n == name) {
            return Err(format!(
                "{ENV}: unknown failpoint `{name}` (see `lockgate chaos --list-failpoints`)"
            ));
        }
        out.push(Arming {
            name: name.to_string(),
            after_checkpoints: after,
            action: action.to_string(),
        });
    }
    Ok(out)
}

/// A source subtask emitted a batch of records.
#[inline]
pub fn records_emitted() {
    if ARMED.load(Ordering::Relaxed) {
        EMITTED.store(true, Ordering::Relaxed);
    }
}

/// A checkpoint was triggered: it holds records if a batch was emitted since the last
/// trigger, or if the previous checkpoint, which held some, was aborted (its records
/// belong to this one now).
pub fn checkpoint_triggered() {
    let emitted = EMITTED.swap(false, Ordering::Relaxed);
    // Cleared only when a checkpoint holding records completes.
    if emitted {
        PENDING_HOLDS.store(true, Ordering::Relaxed);
    }
}

/// Counts a completed checkpoint that holds records (the executor calls it once the
/// checkpoint is published, before its subtasks are told: their commits of checkpoint K
/// see K completed).
pub fn checkpoint_completed() {
    if PENDING_HOLDS.swap(false, Ordering::Relaxed) {
        COMPLETED.fetch_add(1, Ordering::Relaxed);
    }
}

/// Every failpoint, with what it interrupts.
pub const FAILPOINTS: &[(&str, &str)] = &[
    (
        "source-batch",
        "a source subtask handed a batch of records downstream",
    ),
    (
        "before-source-ack",
        "a source subtask snapshotted its positions, before emitting the barrier and acknowledging",
    ),
    (
        "after-source-snapshot",
        "a source subtask acknowledged its snapshot and emitted the barrier",
    ),
    (
        "before-sink-flush",
        "a sink subtask reached a barrier, before flushing",
    ),
    (
        "after-sink-flush",
        "a sink subtask flushed (everything written), before acknowledging",
    ),
    (
        "before-state-listing",
        "a keyed subtask's RocksDB checkpoint exists, before its files are listed and checksummed",
    ),
    (
        "rocksdb-checkpoint",
        "a keyed subtask listed and checksummed its RocksDB checkpoint, before acknowledging",
    ),
    (
        "before-metadata",
        "every subtask acknowledged, before `_metadata` is written",
    ),
    ("mid-metadata", "half of `_metadata` is written"),
    (
        "publish-before-fsync",
        "the checkpoint directory was renamed to chk-N (published), before the snapshot directory is fsynced",
    ),
    (
        "after-publish",
        "checkpoint published, before subtasks are notified",
    ),
    (
        "after-job-commit",
        "a sink's committer for the whole job (the Iceberg sink's) committed a published checkpoint, before subtasks are notified",
    ),
    (
        "bulk-response",
        "Elasticsearch accepted a bulk request, its response not yet read",
    ),
    (
        "after-stage",
        "a two-phase sink staged a checkpoint's output (a prepared transaction, a pending part file), before acknowledging",
    ),
    (
        "before-part-commit",
        "a two-phase sink is about to commit one part of a completed checkpoint (COMMIT PREPARED, a rename)",
    ),
    (
        "store-part-copied",
        "the file sink copied a staged part to its final name in an object store, before deleting the staged object",
    ),
    (
        "between-file-commits",
        "the file sink committed one file of a checkpoint's part (several: rolled by roll_bytes, or one per partition folder), before the next",
    ),
    (
        "after-part-commit",
        "a two-phase sink (the file sink) committed one part of a completed checkpoint, before the next",
    ),
];

/// The environment variable that configures failpoints.
pub const ENV: &str = "LOCKGATE_FAILPOINTS";

/// Applies `LOCKGATE_FAILPOINTS` (see [`parse`]).
pub fn setup_from_env() -> Result<(), String> {
    let Ok(spec) = std::env::var(ENV) else {
        return Ok(());
    };
    let armings = parse(&spec)?;
    #[cfg(feature = "failpoints")]
    {
        let mut after = HashMap::new();
        for a in armings {
            // `exit` or `kill` anywhere in the action (`exit`, `20%exit`,
            // `3*off->kill`) ends the process.
            let action = ["exit", "kill"]
                .iter()
                .fold(a.action.clone(), |action, end| {
                    action
                        .replace(&format!("return({end})"), end)
                        .replace(end, &format!("return({end})"))
                });
            fail::cfg(&a.name, &action).map_err(|e| format!("{ENV}: {}: {e}", a.name))?;
            if a.after_checkpoints > 0 {
                after.insert(a.name, a.after_checkpoints);
            }
            ARMED.store(true, Ordering::Relaxed);
        }
        *AFTER.write().expect("lock") = Some(after);
    }
    #[cfg(not(feature = "failpoints"))]
    if !armings.is_empty() {
        return Err(format!(
            "{ENV} is set but this binary was built without the `failpoints` feature"
        ));
    }
    Ok(())
}

/// Whether `name` is past its `@K` (or has none).
fn due(name: &str) -> bool {
    let after = AFTER.read().expect("lock");
    match after.as_ref().and_then(|m| m.get(name)) {
        Some(&k) => COMPLETED.load(Ordering::Relaxed) >= k,
        None => true,
    }
}

/// Hits failpoint `name`; `exit` aborts the process at once. An armed point may sleep
/// or pause: it runs in `block_in_place` when called on a multi-threaded runtime, so
/// that the coordinator and other tasks keep running meanwhile.
#[inline]
pub fn hit(name: &str) {
    if !ARMED.load(Ordering::Relaxed) || !due(name) {
        return;
    }
    let on_runtime = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if on_runtime {
        tokio::task::block_in_place(|| eval(name));
    } else {
        eval(name);
    }
}

fn eval(name: &str) {
    #[cfg(feature = "failpoints")]
    fail::fail_point!(name, |arg: Option<String>| {
        match arg.as_deref() {
            Some("exit") => {
                eprintln!("failpoint {name}: exit");
                std::process::abort();
            }
            Some("kill") => {
                eprintln!("failpoint {name}: kill");
                // SAFETY: kill(2) on this process's own id.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
                // Not reached; should the signal be refused, the process still ends here.
                std::process::abort();
            }
            _ => {}
        }
    });
    let _ = name;
}

/// Between publishing and notifying subtasks.
pub fn after_publish() {
    hit("after-publish");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_name_points_their_arming_and_action() {
        let a = |name: &str, after, action: &str| Arming {
            name: name.into(),
            after_checkpoints: after,
            action: action.into(),
        };
        assert_eq!(
            parse("before-sink-flush@1=exit; source-batch=sleep(20) ;").unwrap(),
            vec![
                a("before-sink-flush", 1, "exit"),
                a("source-batch", 0, "sleep(20)")
            ]
        );
        assert_eq!(
            parse("mid-metadata@3=2*off->exit").unwrap(),
            vec![a("mid-metadata", 3, "2*off->exit")]
        );
        for (bad, why) in [
            ("nope=exit", "unknown failpoint `nope`"),
            ("before-sink-flush", "not name=action"),
            (
                "before-sink-flush@x=exit",
                "number of completed checkpoints",
            ),
            ("before-sink-flush@=exit", "number of completed checkpoints"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
