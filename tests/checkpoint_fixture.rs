//! Checkpoints written by an earlier release, kept under `tests/fixtures/checkpoints/`,
//! restored by this one: the on-disk contract (`_metadata`'s format, the state's
//! layout, each source's positions, the file sink's pending commits) holds across
//! releases, so that an upgrade resumes a job where it stopped.
//!
//! Each fixture is the job directory of a run as it was left: its job file, its
//! checkpoints and its output. `LOCKGATE_WRITE_FIXTURES=1 cargo test --release --test
//! checkpoint_fixture -- --ignored` writes them anew with this release (only when the
//! contract changes on purpose: the old fixtures then stay, and a new one is added).

mod common;

use common::kafka::{assert_partitions_exact, produce, write_job, KafkaProcess};
use common::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The release whose checkpoints the fixtures hold.
const WRITTEN_BY: &str = "0.1.0";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/checkpoints")
        .join(WRITTEN_BY)
}

/// The sequence job of the fixture: keyed state (`rolling_sum` over 100 keys) at
/// parallelism 2, slow enough to be stopped half way.
fn sequence_spec() -> Spec {
    let mut spec = Spec::new(6000);
    spec.name = "fixture-sequence".into();
    spec.keys = 100;
    spec.rate_per_sec = 2000;
    spec
}

/// The checkpoint id in the log's `restoring` line.
fn restored_from(log: &str) -> Option<String> {
    log.lines()
        .find(|l| l.contains("restoring"))
        .and_then(|l| l.split("chk-").nth(1))
        .map(|rest| format!("chk-{}", &rest[..10]))
}

/// A job killed by SIGKILL half way through, after its newest checkpoint completed and
/// before that checkpoint's part files were committed (they wait in the output as
/// `.part-*`): the restore commits them from the checkpoint's sink state, and the job
/// runs on to the end, every record once, every running total right.
#[test]
fn a_sequence_job_killed_by_an_earlier_release_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("job");
    copy_dir(&fixtures().join("sequence"), &root);
    let j = JobDir {
        root: root.clone(),
        spec: sequence_spec(),
    };
    let newest = j
        .complete_checkpoints()
        .pop()
        .expect("the fixture holds complete checkpoints");
    let id = newest.file_name().unwrap().to_string_lossy()["chk-".len()..]
        .parse::<u64>()
        .unwrap();
    let pending: Vec<String> = std::fs::read_dir(j.out())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".part-") && n.ends_with(&format!("-{id}")))
        .collect();
    assert!(
        !pending.is_empty(),
        "the fixture holds the newest checkpoint's parts uncommitted"
    );
    let before = committed_lines_in(&j.out()).len();
    assert!(
        before > 0 && before < 6000,
        "the fixture stopped half way: {before} lines committed"
    );

    assert!(j.run_to_end(&[]).success(), "{}", tail(&j.log_text(), 40));
    let log = j.log_text();
    assert_eq!(
        restored_from(&log).as_deref(),
        newest.file_name().and_then(|n| n.to_str()),
        "restored from the fixture's newest checkpoint:\n{}",
        tail(&log, 40)
    );
    assert_exact(&j);
}

/// Kafka positions in an earlier release's checkpoint are read as they were written:
/// `checkpoints inspect` shows each partition's next offset and the topic's id, and a
/// restore against a cluster whose `orders` is another topic (a new cluster: another
/// topic id) is refused, naming the checkpoint's topic id, and writes nothing. (A
/// restore that continues from the offsets needs the topic the checkpoint read, which
/// an embedded cluster started anew cannot be: its topic ids are its own.)
#[test]
fn a_kafka_checkpoint_of_an_earlier_release_is_read_as_written() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("job");
    copy_dir(&fixtures().join("kafka"), &root);
    let chk = JobDir {
        root: root.clone(),
        spec: Spec::new(0),
    }
    .complete_checkpoints()
    .pop()
    .expect("the fixture holds a checkpoint");

    let (code, out, err) = lockgate(&["checkpoints", "inspect", chk.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{out}{err}");
    let positions: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.first() == Some(&"orders"))
        .collect();
    assert_eq!(positions.len(), 2, "{out}");
    let topic_id = positions[0][4];
    for (p, w) in positions.iter().enumerate() {
        assert_eq!(w[1..4], [p.to_string().as_str(), "200", "200"], "{out}");
        assert_eq!(w[4], topic_id, "{out}");
    }
    assert_eq!(topic_id.len(), 22, "a topic id as Kafka spells it: {out}");

    let kafka = KafkaProcess::start(&[("orders", 3)]);
    produce(&kafka.bootstrap, "orders", 3, 0, 300);
    let config = root.join("job.toml");
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .lines()
        .map(|l| match l.starts_with("bootstrap_servers") {
            true => format!("bootstrap_servers = \"{}\"", kafka.bootstrap),
            false => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&config, text).unwrap();
    let before = committed_lines_in(&root.join("out"));
    assert_eq!(before.len(), 400, "the fixture committed 2 x 200 records");

    let (code, log) = run_config(&config);
    assert_eq!(code, Some(1), "{}", tail(&log, 40));
    assert!(
        log.contains("was recreated") && log.contains(topic_id),
        "{}",
        tail(&log, 40)
    );
    assert_eq!(
        committed_lines_in(&root.join("out")),
        before,
        "nothing written"
    );
}

/// Writes the fixtures with this release (see the module's comment).
#[test]
#[ignore]
fn write_the_fixtures() {
    if std::env::var_os("LOCKGATE_WRITE_FIXTURES").is_none() {
        return;
    }
    let dest = fixtures();
    let _ = std::fs::remove_dir_all(&dest);
    let tmp = tempfile::tempdir().unwrap();

    // The sequence job, killed by SIGKILL when its third checkpoint holding records
    // completed and its parts are not yet committed.
    let j = JobDir::new(&tmp.path().join("sequence"), sequence_spec());
    let mut child = j.spawn_env(&[], &[("LOCKGATE_FAILPOINTS", "before-part-commit@3=kill")]);
    let status = wait_timeout(&mut child, Duration::from_secs(60));
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{}", j.log_text());
    let committed = committed_lines_in(&j.out()).len();
    assert!(committed > 0 && committed < 6000, "{committed}");
    let _ = std::fs::remove_file(j.root.join("runs.log"));
    copy_dir(&j.root, &dest.join("sequence"));

    // The Kafka job: 2 partitions of 200 records, read to the end.
    let kafka = KafkaProcess::start(&[("orders", 2)]);
    produce(&kafka.bootstrap, "orders", 2, 0, 200);
    let root = tmp.path().join("kafka");
    write_job(
        &root,
        &kafka.bootstrap,
        1,
        "topics = [\"orders\"]",
        "bounded = \"latest\"",
    );
    let (code, log) = run_config(&root.join("job.toml"));
    assert_eq!(code, Some(0), "{}", tail(&log, 40));
    assert_partitions_exact(&root.join("out"), "orders", 2, 0, 200);
    let _ = std::fs::remove_file(root.join("job.log"));
    copy_dir(&root, &dest.join("kafka"));
}
