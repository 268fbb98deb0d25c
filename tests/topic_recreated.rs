//! A topic deleted and created again under the same name is another topic (a new topic
//! id, offsets that start over): a checkpoint of the old one must not be applied to it.
//! The embedded cluster cannot delete a topic, so the recreation is a second cluster
//! with a topic of the same name (another id), the job file pointed at it.

mod common;

use common::kafka::*;
use common::{bin, wait_timeout};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

/// Runs `lockgate run` on `dir/job.toml` to its end; returns the status and its log.
fn run_job(dir: &Path, name: &str) -> (ExitStatus, String) {
    let log_path = dir.join(format!("{name}.log"));
    let mut cmd = Command::new(bin());
    cmd.arg("run")
        .arg("--config")
        .arg(dir.join("job.toml"))
        .env("LOCKGATE_LOG", "info")
        .env_remove("LOCKGATE_FAILPOINTS")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap());
    let status = wait_timeout(&mut cmd.spawn().unwrap(), Duration::from_secs(120));
    (status, std::fs::read_to_string(&log_path).unwrap())
}

/// The newest complete checkpoint of `dir/checkpoints`.
fn newest_checkpoint(dir: &Path) -> PathBuf {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().to_string();
            n.starts_with("chk-") && !n.contains('.') && p.join("_metadata").exists()
        })
        .collect();
    v.sort();
    v.pop().expect("a complete checkpoint")
}

/// `lockgate checkpoints inspect` of the newest checkpoint: the rows of `topic`'s
/// positions, as (partition, next, topic id column if any).
fn inspected_positions(dir: &Path, topic: &str) -> Vec<(i32, i64, Option<String>)> {
    let out = Command::new(bin())
        .args(["checkpoints", "inspect"])
        .arg(newest_checkpoint(dir))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut rows: Vec<(i32, i64, Option<String>)> = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.first() == Some(&topic) && w.len() >= 4)
        .map(|w| {
            (
                w[1].parse().unwrap(),
                w[2].parse().unwrap(),
                w.get(4).map(|s| s.to_string()),
            )
        })
        .collect();
    rows.sort();
    rows
}

#[test]
fn a_recreated_topic_fails_the_restore_unless_the_job_says_to_start_it_over() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let out = dir.join("out");

    // Cluster A: a bounded run to its final checkpoint.
    let a = KafkaProcess::start(&[("orders", 2)]);
    produce(&a.bootstrap, "orders", 2, 0, 100);
    write_job(
        dir,
        &a.bootstrap,
        2,
        "topics = [\"orders\"]",
        "bounded = \"latest\"",
    );
    let (status, log) = run_job(dir, "a");
    assert_eq!(status.code(), Some(0), "{log}");
    assert_partitions_exact(&out, "orders", 2, 0, 100);
    drop(a);

    // Cluster B has another `orders`: more records, offsets from 0 again.
    let b = KafkaProcess::start(&[("orders", 2)]);
    produce(&b.bootstrap, "orders", 2, 0, 150);
    write_job(
        dir,
        &b.bootstrap,
        2,
        "topics = [\"orders\"]",
        "bounded = \"latest\"",
    );
    let (status, log) = run_job(dir, "b-fail");
    assert_eq!(
        status.code(),
        Some(1),
        "the checkpoint of the old topic was applied to the new one:\n{log}"
    );
    assert!(log.contains("topic `orders` was recreated"), "{log}");
    if let Some(line) = log.lines().rev().find(|l| l.starts_with("error:")) {
        eprintln!("the failed restore says: {line}");
    }
    assert!(log.contains("on_topic_recreated"), "{log}");
    // Nothing of B was committed.
    assert_partitions_exact(&out, "orders", 2, 0, 100);
    // The checkpoint holds A's topic id with every position, and the error names it.
    let before = inspected_positions(dir, "orders");
    assert_eq!(
        before,
        vec![(0, 100, before[0].2.clone()), (1, 100, before[0].2.clone())]
    );
    let id_a = before[0].2.clone().expect("a topic id column");
    assert_eq!(id_a.len(), 22, "Kafka's base64 spelling: {id_a}");
    assert!(log.contains(&format!("topic id {id_a}")), "{log}");

    // With the start-over policy: B's `orders` is read from EARLIEST, with a warning.
    write_job(
        dir,
        &b.bootstrap,
        2,
        "topics = [\"orders\"]",
        "bounded = \"latest\"\non_topic_recreated = \"restart\"",
    );
    let (status, log) = run_job(dir, "b-restart");
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(
        log.contains("topic was recreated") && log.contains("read from EARLIEST"),
        "{log}"
    );
    let got = committed_output(&out);
    let want: Vec<i64> = (0..100).chain(0..150).collect();
    for p in 0..2 {
        assert_eq!(
            got.get(&("orders".to_string(), p)),
            Some(&want),
            "orders/{p}: A's records once, then all of B's once"
        );
    }
    let after = inspected_positions(dir, "orders");
    let id_b = after[0].2.clone().expect("a topic id column");
    assert_ne!(id_a, id_b);
    assert_eq!(
        after,
        vec![(0, 150, Some(id_b.clone())), (1, 150, Some(id_b.clone()))]
    );
    // The failed run named B's id too.
    let failed = std::fs::read_to_string(dir.join("b-fail.log")).unwrap();
    assert!(failed.contains(&format!("topic id {id_b}")), "{failed}");

    // Restored again against B: the same topic, nothing more to read.
    let (status, log) = run_job(dir, "b-again");
    assert_eq!(status.code(), Some(0), "{log}");
    assert_eq!(committed_output(&out), got);
}
