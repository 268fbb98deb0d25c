//! Named failpoints at every step of the checkpoint protocol, for the fault-injection
//! harness. Configured from `LOCKGATE_FAILPOINTS="name=action;..."`, where an action is
//! one of the `fail` crate's (`panic`, `sleep(ms)`, `off`, `N*action`, `P%action`, ...)
//! or `exit`: an immediate process abort, as if the process were killed at that point.
//! Without the `failpoints` feature every point compiles to nothing.

use std::sync::atomic::{AtomicBool, Ordering};

/// Whether any failpoint is configured: an unconfigured point costs one atomic load.
static ARMED: AtomicBool = AtomicBool::new(false);

/// Every failpoint, with what it interrupts.
pub const FAILPOINTS: &[(&str, &str)] = &[
    (
        "source-batch",
        "a source subtask handed a batch of records downstream",
    ),
    (
        "after-source-snapshot",
        "a source subtask snapshotted its positions and emitted the barrier",
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
        "rocksdb-checkpoint",
        "a keyed subtask took its RocksDB checkpoint, before listing its files",
    ),
    (
        "before-metadata",
        "every subtask acknowledged, before `_metadata` is written",
    ),
    ("mid-metadata", "half of `_metadata` is written"),
    (
        "after-publish",
        "checkpoint published, before subtasks are notified",
    ),
    (
        "bulk-response",
        "Elasticsearch accepted a bulk request, its response not yet read",
    ),
];

/// The environment variable that configures failpoints.
pub const ENV: &str = "LOCKGATE_FAILPOINTS";

/// Applies `LOCKGATE_FAILPOINTS`. Unknown names are an error, so that a typo does not
/// silently test nothing.
pub fn setup_from_env() -> Result<(), String> {
    let Ok(spec) = std::env::var(ENV) else {
        return Ok(());
    };
    for item in spec.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, action) = item
            .split_once('=')
            .ok_or_else(|| format!("{ENV}: `{item}` is not name=action"))?;
        if !FAILPOINTS.iter().any(|(n, _)| *n == name) {
            return Err(format!(
                "{ENV}: unknown failpoint `{name}` (see `lockgate chaos --list-failpoints`)"
            ));
        }
        #[cfg(feature = "failpoints")]
        {
            // `exit` anywhere in the action (`exit`, `20%exit`, `3*off->exit`) aborts.
            let action = action
                .replace("return(exit)", "exit")
                .replace("exit", "return(exit)");
            let action = action.as_str();
            fail::cfg(name, action).map_err(|e| format!("{ENV}: {name}: {e}"))?;
            ARMED.store(true, Ordering::Relaxed);
        }
        #[cfg(not(feature = "failpoints"))]
        {
            let _ = action;
            return Err(format!(
                "{ENV} is set but this binary was built without the `failpoints` feature"
            ));
        }
    }
    Ok(())
}

/// Hits failpoint `name`; `exit` aborts the process at once. An armed point may sleep
/// or pause: it runs in `block_in_place` when called on a multi-threaded runtime, so
/// that the coordinator and other tasks keep running meanwhile.
#[inline]
pub fn hit(name: &str) {
    if !ARMED.load(Ordering::Relaxed) {
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
        if arg.as_deref() == Some("exit") {
            eprintln!("failpoint {name}: exit");
            std::process::abort();
        }
    });
    let _ = name;
}

/// Between publishing and notifying subtasks.
pub fn after_publish() {
    hit("after-publish");
}
