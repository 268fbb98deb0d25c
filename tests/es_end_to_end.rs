//! End to end: the real binary writes to an Elasticsearch-API server over HTTP, is
//! killed with SIGKILL, restarted, and the index is checked document by document
//! against the input — on the project's test server and on osmem-server.

mod common;

use common::es::*;
use common::wait::{self, DEADLINE};
use common::{bin, sigkill, tail, wait_timeout};
use lockgate::testkit::file_output::verify_records;
use rand::{Rng, SeedableRng};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn spawn(dir: &Path, extra: &[&str]) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("runs.log"))
        .unwrap();
    Command::new(bin())
        .args(["run", "--config"])
        .arg(dir.join("job.toml"))
        .args(extra)
        .env("LOCKGATE_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

fn log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("runs.log")).unwrap_or_default()
}

fn log_path(dir: &Path) -> std::path::PathBuf {
    dir.join("runs.log")
}

/// Every sequence record is one document with its content and running total.
fn assert_index_exact(es: &Es, dir: &Path, to: i64, keys: u32) {
    let ids: Vec<String> = (1..=to).map(|s| sequence_id(s, keys)).collect();
    let docs = es.get_many("seq", &ids);
    let count = es.count("seq");
    let v = verify_records(
        docs.into_iter().map(|(id, src, _)| (id, src.to_string())),
        1,
        to,
        keys,
        Some("/total"),
    );
    assert!(
        v.is_exact() && count == to as u64,
        "index not exact: count {count} of {to}, {v:?}\n{}",
        tail(&log(dir), 30)
    );
}

fn kills_then_finish(es: Es) {
    let tmp = tempfile::tempdir().unwrap();
    let (to, keys) = (30_000, 500);
    // A run would last 15 s: each one is killed shortly after it published a
    // checkpoint, long before its end.
    write_es_job(tmp.path(), &es.url(), to, keys, 2_000, true, "");
    let mut rng = rand::rngs::SmallRng::seed_from_u64(common::seed(7));
    let log_file = log_path(tmp.path());
    for kill in 1..=3 {
        let published = wait::count(&log_file, "checkpoint completed");
        let mut child = spawn(tmp.path(), &[]);
        wait::while_running(
            &mut child,
            &log_file,
            &format!("a checkpoint of run {kill}"),
            DEADLINE,
            || wait::count(&log_file, "checkpoint completed") > published,
        );
        // The seeded moment: bulks accepted after that checkpoint, before the next.
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..400)));
        assert!(
            sigkill(&mut child),
            "run {kill} ended before its kill; log:\n{}",
            tail(&log(tmp.path()), 30)
        );
    }
    // The last run need not be slow.
    write_es_job(tmp.path(), &es.url(), to, keys, 0, true, "");
    assert!(
        wait_timeout(&mut spawn(tmp.path(), &[]), DEADLINE).success(),
        "{}",
        tail(&log(tmp.path()), 30)
    );
    assert_eq!(
        log(tmp.path()).matches("restoring").count(),
        3,
        "every run after a kill resumed from a checkpoint"
    );
    assert_index_exact(&es, tmp.path(), to, keys);
}

#[test]
fn sigkills_between_accepted_bulks_and_checkpoints_replay_the_same_ids_on_the_test_server() {
    kills_then_finish(Es::testkit());
}

#[test]
fn sigkills_between_accepted_bulks_and_checkpoints_replay_the_same_ids_on_osmem() {
    kills_then_finish(Es::osmem());
}

#[test]
fn a_ten_second_storm_of_30_percent_item_rejections_loses_and_duplicates_nothing() {
    let es = Es::testkit();
    let tmp = tempfile::tempdir().unwrap();
    let (to, keys) = (100_000, 1000);
    write_es_job(tmp.path(), &es.url(), to, keys, 8_000, true, "");
    let stat = |name: &str| {
        es.call("GET", "/_lockgate/stats", None).1[name]
            .as_u64()
            .unwrap()
    };
    let mut child = spawn(tmp.path(), &[]);
    // The storm starts once the job is writing, and it lasts ten seconds and at least
    // until it rejected 10 000 items: the job has 100 000 to write, 30 % of which the
    // storm rejects while it lasts.
    wait::while_running(
        &mut child,
        &log_path(tmp.path()),
        "the first bulk",
        DEADLINE,
        || stat("bulk_requests") > 0,
    );
    es.set_faults(serde_json::json!({"reject_item_fraction": 0.3, "seed": 11}));
    std::thread::sleep(Duration::from_secs(10));
    wait::while_running(
        &mut child,
        &log_path(tmp.path()),
        "10 000 rejected items",
        DEADLINE,
        || stat("rejected_items") > 10_000,
    );
    es.set_faults(serde_json::json!({}));
    assert!(
        wait_timeout(&mut child, DEADLINE).success(),
        "{}",
        tail(&log(tmp.path()), 30)
    );
    let (_, stats) = es.call("GET", "/_lockgate/stats", None);
    assert!(
        stats["rejected_items"].as_u64().unwrap() > 10_000,
        "the storm rejected items: {stats}"
    );
    assert_index_exact(&es, tmp.path(), to, keys);
}

fn external_versions_never_regress(es: Es) {
    let tmp = tempfile::tempdir().unwrap();
    let (to, keys) = (40_000, 200);
    // One document per key, version = the record's offset (the sequence number). The
    // run lasts 10 s or more; every checkpoint is kept.
    write_es_job(
        tmp.path(),
        &es.url(),
        to,
        keys,
        4_000,
        false,
        "id = \"field:/key\"\nversioning = \"external\"",
    );
    let job = tmp.path().join("job.toml");
    let text = std::fs::read_to_string(&job).unwrap();
    std::fs::write(
        &job,
        text.replacen("\ninterval_ms = ", "\nretain = 100\ninterval_ms = ", 1),
    )
    .unwrap();
    let mut child = spawn(tmp.path(), &[]);
    // A checkpoint taken mid-run, to replay from below.
    wait::for_log_while_running(
        &mut child,
        &log_path(tmp.path()),
        "is_final=false",
        1,
        DEADLINE,
    );
    assert!(
        wait_timeout(&mut child, DEADLINE).success(),
        "{}",
        tail(&log(tmp.path()), 30)
    );
    let ids: Vec<String> = (0..keys).map(|k| k.to_string()).collect();
    let before = es.get_many("seq", &ids);
    assert_eq!(before.len(), keys as usize);
    for (id, src, version) in &before {
        let last = to - ((to - id.parse::<i64>().unwrap()) % i64::from(keys));
        assert_eq!(
            *version, last,
            "document {id} holds the newest record's version"
        );
        assert_eq!(src["seq"].as_i64(), Some(last));
    }
    // Replay from an older checkpoint: every rewrite is older than what is indexed.
    let mut chks: Vec<_> = std::fs::read_dir(tmp.path().join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !p.file_name().unwrap().to_string_lossy().contains('.'))
        .filter(|p| p.join("_metadata").exists())
        .collect();
    chks.sort();
    let oldest = chks.first().unwrap();
    let meta = lockgate::state::CheckpointMetadata::read(oldest).unwrap();
    assert!(!meta.is_final, "the oldest checkpoint was taken mid-run");
    let oldest = oldest.display().to_string();
    let emitted = wait::count(&log_path(tmp.path()), "first records emitted");
    assert!(
        wait_timeout(&mut spawn(tmp.path(), &["--restore", &oldest]), DEADLINE).success(),
        "{}",
        tail(&log(tmp.path()), 30)
    );
    assert!(
        wait::count(&log_path(tmp.path()), "first records emitted") > emitted,
        "the replay wrote records again"
    );
    let after = es.get_many("seq", &ids);
    let mut b = before.clone();
    let mut a = after.clone();
    b.sort_by(|x, y| x.0.cmp(&y.0));
    a.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(a, b, "an older replay overwrote a newer document");
}

#[test]
fn with_external_versioning_an_older_replay_never_overwrites_a_newer_document_on_the_test_server() {
    external_versions_never_regress(Es::testkit());
}

#[test]
fn with_external_versioning_an_older_replay_never_overwrites_a_newer_document_on_osmem() {
    external_versions_never_regress(Es::osmem());
}

mod kafka_to_es {
    use super::*;
    use common::kafka::*;

    fn job(dir: &Path, bootstrap: &str, es: &Es, on_item_error: &str) {
        let text = format!(
            "[job]\nname = \"k2es\"\nparallelism = 1\n\n[checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 200\n\n\
             [restart]\nstrategy = \"none\"\n\n\
             [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\n\n\
             [sink.elasticsearch]\nurl = \"{}\"\nindex = \"orders\"\non_item_error = \"{on_item_error}\"\nbulk_flush_interval_ms = 100\n",
            es.url()
        );
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("job.toml"), text).unwrap();
    }

    fn setup(topics: &[(&str, i32)]) -> (KafkaProcess, Es) {
        let kafka = KafkaProcess::start(topics);
        let es = Es::testkit();
        es.create_index("orders", &[("amount", "long")]);
        produce_raw(
            &kafka.bootstrap,
            "orders",
            0,
            &[
                br#"{"amount":1}"#,
                br#"{"amount":"lots"}"#,
                br#"{"amount":3}"#,
            ],
        );
        (kafka, es)
    }

    #[test]
    fn a_mapping_error_under_fail_fails_the_job_naming_the_document_and_the_reason() {
        let (kafka, es) = setup(&[("orders", 1)]);
        let tmp = tempfile::tempdir().unwrap();
        job(tmp.path(), &kafka.bootstrap, &es, "fail");
        let status = wait_timeout(&mut spawn(tmp.path(), &[]), DEADLINE);
        let l = log(tmp.path());
        assert_eq!(status.code(), Some(1), "{l}");
        assert!(
            l.contains("orders/orders-0-1") && l.contains("failed to parse field [amount]"),
            "{}",
            tail(&l, 20)
        );
    }

    #[test]
    fn a_mapping_error_under_dead_letter_reaches_the_dead_letter_topic_with_its_error() {
        let (kafka, es) = setup(&[("orders", 1), ("orders-dlq", 1)]);
        let tmp = tempfile::tempdir().unwrap();
        job(tmp.path(), &kafka.bootstrap, &es, "dead-letter:orders-dlq");
        let status = wait_timeout(&mut spawn(tmp.path(), &[]), DEADLINE);
        assert!(status.success(), "{}", tail(&log(tmp.path()), 20));
        assert_eq!(es.count("orders"), 2, "the two valid documents are indexed");
        let (payload, h) = first_dead_letter(&kafka.bootstrap, "orders-dlq");
        assert_eq!(payload, br#"{"amount":"lots"}"#);
        assert_eq!(h["lockgate.id"], "orders-0-1");
        assert!(
            h["lockgate.error"].contains("document_parsing_exception"),
            "{h:?}"
        );
    }
}
