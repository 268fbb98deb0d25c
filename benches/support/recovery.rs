//! Recovery time after a SIGKILL with a large keyed state, measured on the real
//! `lockgate` binary.
//!
//! The job is `sequence -> rolling_sum -> file sink`, parallelism 2, checkpoints every
//! second, `keys` keys. A first run is killed with SIGKILL once a completed checkpoint
//! holds every key (each split of the sequence is past record `keys`). Then, `rounds`
//! times: the same command is started again, and killed with SIGKILL as soon as it
//! logged `first records written to the sink`.
//!
//! Recovery time = from spawning the process to that log line, read from its stderr as
//! it comes: the first record that went through the whole job (source, restored keyed
//! state, sink) after the restart. Milestones of each restart, from the same logs, are
//! reported too: the restore decision, the keyed subtasks' state opened (those logged
//! before the first record reached a sink), the first records leaving a source.

use lockgate::state::snapshot_dir::list;
use lockgate::state::CheckpointMetadata;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Milestones of one run, in milliseconds after its spawn.
#[derive(Default, Debug)]
struct Milestones {
    restoring: Option<u64>,
    keyed_state_opened: Vec<u64>,
    linked: Vec<bool>,
    first_source_records: Option<u64>,
    first_sink_records: Option<u64>,
}

fn spawn(lockgate: &Path, job: &Path) -> (Child, mpsc::Receiver<(Instant, String)>) {
    let mut child = Command::new(lockgate)
        .arg("run")
        .arg("--config")
        .arg(job)
        .env("LOCKGATE_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lockgate");
    let stderr = child.stderr.take().expect("piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// Whether the newest complete checkpoint of `dir` holds every key: every split of the
/// sequence is past record `keys` (records `1..=keys` carry every key once).
fn state_filled(dir: &Path, keys: i64) -> Option<PathBuf> {
    let newest = list(dir)
        .ok()?
        .into_iter()
        .rev()
        .find(|e| e.status == lockgate::state::restore::EntryStatus::Complete)?;
    let path = dir.join(&newest.name);
    let meta = CheckpointMetadata::read(&path).ok()?;
    let min_next = meta.positions.iter().map(|p| p.next.0).min()?;
    (min_next > keys).then_some(path)
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| {
                    let m = e.metadata().expect("stat");
                    if m.is_dir() {
                        dir_bytes(&e.path())
                    } else {
                        m.len()
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

fn restart_once(lockgate: &Path, job: &Path) -> Milestones {
    let start = Instant::now();
    let (mut child, rx) = spawn(lockgate, job);
    let mut m = Milestones::default();
    let ms = |t: Instant| t.duration_since(start).as_millis() as u64;
    loop {
        let (t, line) = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(x) => x,
            Err(_) => {
                let _ = child.kill();
                panic!("the restarted job wrote no record to its sink within 120 s");
            }
        };
        if line.contains(" restoring") && m.restoring.is_none() {
            m.restoring = Some(ms(t));
        }
        if line.contains("keyed state opened") {
            m.keyed_state_opened.push(ms(t));
            m.linked.push(line.contains("linked=true"));
        }
        if line.contains("first records emitted") && m.first_source_records.is_none() {
            m.first_source_records = Some(ms(t));
        }
        if line.contains("first records written to the sink") {
            m.first_sink_records = Some(ms(t));
            break;
        }
        if line.contains("ERROR") {
            eprintln!("{line}");
        }
    }
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    m
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// Measures recovery with `keys` keys in state over `rounds` restarts of the binary
/// `lockgate`; the JSON report of [the module](self).
pub fn measure(lockgate: &Path, keys: i64, rounds: usize) -> serde_json::Value {
    let tmp = tempfile::tempdir().expect("tempdir");
    let job = tmp.path().join("job.toml");
    std::fs::write(
        &job,
        format!(
            "[job]\nname = \"recovery\"\nparallelism = 2\n\n\
             [checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 1000\n\n\
             [restart]\nstrategy = \"none\"\n\n\
             [source.sequence]\nfrom = 1\nto = {}\nkeys = {keys}\n\n\
             [[transform]]\ntype = \"rolling_sum\"\nkey = \"/key\"\nfield = \"/value\"\n\n\
             [sink.file]\ndir = \"out\"\n",
            keys * 1000
        ),
    )
    .expect("write job");
    let checkpoints = tmp.path().join("checkpoints");

    // Fill: run until a completed checkpoint holds every key, then SIGKILL.
    let fill_start = Instant::now();
    let (mut child, rx) = spawn(lockgate, &job);
    let drain = std::thread::spawn(move || while rx.recv().is_ok() {});
    let filled = loop {
        if let Some(p) = state_filled(&checkpoints, keys) {
            break p;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the fill run ended early: {status}");
        }
        assert!(
            fill_start.elapsed() < Duration::from_secs(1200),
            "the state took more than 20 minutes to fill"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    let _ = drain.join();
    let fill_secs = fill_start.elapsed().as_secs_f64();
    let state_bytes = dir_bytes(&filled);
    eprintln!(
        "filled {keys} keys in {fill_secs:.1} s; checkpoint {} holds {state_bytes} bytes",
        filled.display()
    );

    let mut runs = Vec::new();
    for round in 0..rounds {
        let m = restart_once(lockgate, &job);
        eprintln!("restart {round}: {m:?}");
        runs.push(m);
    }
    let recovery: Vec<u64> = runs.iter().filter_map(|m| m.first_sink_records).collect();
    serde_json::json!({
        "benchmark": "recovery after SIGKILL: process spawn to the first record written by the sink",
        "job": "sequence -> rolling_sum -> file sink, parallelism 2",
        "keys": keys,
        "state_bytes_in_checkpoint": state_bytes,
        "rounds": rounds,
        "recovery_ms": recovery,
        "recovery_ms_median": median(recovery.clone()),
        "recovery_ms_max": recovery.iter().max(),
        "restore_linked_sst_files": runs.iter().all(|m| !m.linked.is_empty() && m.linked.iter().all(|l| *l)),
        "milestones_ms_median": {
            "restoring_logged": median(runs.iter().filter_map(|m| m.restoring).collect()),
            "keyed_state_opened_last": median(runs.iter().filter_map(|m| m.keyed_state_opened.iter().max().copied()).collect()),
            "first_source_records": median(runs.iter().filter_map(|m| m.first_source_records).collect()),
            "first_sink_records": median(recovery),
        },
    })
}
