//! The Kafka sink (`[sink.kafka]`), the upstream side of a repartition stage, against
//! the embedded Kafka cluster in its own process: what it writes (key, payload, origin
//! headers, partitioning, order) and how it fails.

mod common;

use common::kafka::{consumer, produce_raw, KafkaProcess};
use common::{bin, tail, wait_timeout};
use rdkafka::consumer::Consumer;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

/// A `kafka -> kafka` repartition job file in `dir`; `sink_extra` is appended to
/// `[sink.kafka]`.
fn write_job(dir: &Path, bootstrap: &str, sink_extra: &str) {
    let text = format!(
        "[job]\nname = \"repartition\"\nparallelism = 2\n\n\
         [checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 100\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\n\n\
         [sink.kafka]\ntopic = \"orders-by-user\"\nkey = \"/user\"\n{sink_extra}\n"
    );
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("job.toml"), text).unwrap();
}

fn run_job(dir: &Path) -> (ExitStatus, String) {
    let log_path = dir.join("run.log");
    let mut child = Command::new(bin())
        .arg("run")
        .arg("--config")
        .arg(dir.join("job.toml"))
        .env("LOCKGATE_LOG", "info")
        .env_remove("LOCKGATE_FAILPOINTS")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let status = wait_timeout(&mut child, Duration::from_secs(120));
    (status, std::fs::read_to_string(&log_path).unwrap())
}

/// One record of the repartitioned topic.
struct Written {
    partition: i32,
    key: Option<String>,
    payload: serde_json::Value,
    headers: BTreeMap<String, String>,
}

/// Every record of `topic` (`partitions` partitions), in partition and offset order.
fn read_all(bootstrap: &str, topic: &str, partitions: i32) -> Vec<Written> {
    let c = consumer(bootstrap, "kafka-sink-test");
    let mut ends = BTreeMap::new();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        let (_, hi) = c
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .unwrap();
        ends.insert(p, hi);
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    let total: i64 = ends.values().sum();
    let mut out = Vec::new();
    while (out.len() as i64) < total {
        let m = c
            .poll(Duration::from_secs(10))
            .expect("a record before the end")
            .unwrap();
        let mut headers = BTreeMap::new();
        if let Some(h) = m.headers() {
            for i in 0..h.count() {
                let h = h.get(i);
                headers.insert(
                    h.key.to_string(),
                    String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                );
            }
        }
        out.push(Written {
            partition: m.partition(),
            key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
            payload: serde_json::from_slice(m.payload().unwrap()).unwrap(),
            headers,
        });
    }
    out
}

#[test]
fn each_record_is_written_keyed_by_the_field_with_its_origin_in_headers_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 4), ("orders-by-user", 3)]);
    lockgate::testkit::kafka::produce_orders_keyed(
        &kafka.bootstrap,
        "orders",
        0,
        3_000,
        50,
        lockgate::testkit::kafka::OrderKey::Order,
    )
    .unwrap();
    write_job(tmp.path(), &kafka.bootstrap, "");
    let (status, log) = run_job(tmp.path());
    assert!(status.success(), "{log}");
    let written = read_all(&kafka.bootstrap, "orders-by-user", 3);
    assert_eq!(written.len(), 3_000, "each record once: {log}");
    let mut partition_of_user: BTreeMap<String, i32> = BTreeMap::new();
    // (target partition, origin partition) -> the last origin offset seen.
    let mut last: BTreeMap<(i32, String), i64> = BTreeMap::new();
    let mut orders = std::collections::BTreeSet::new();
    for w in &written {
        let user = w.payload["user"].as_str().unwrap();
        assert_eq!(w.key.as_deref(), Some(user), "keyed by /user");
        // Every record of a user is in one partition.
        let p = *partition_of_user
            .entry(user.to_string())
            .or_insert(w.partition);
        assert_eq!(p, w.partition, "{user}");
        // ... Kafka's default partitioner's, over the topic's 3 partitions.
        assert_eq!(
            w.partition,
            lockgate::connectors::kafka::sink::key_partition(user.as_bytes(), 3),
            "{user}"
        );
        assert_eq!(w.headers["lockgate.topic"], "orders");
        let origin = w.headers["lockgate.partition"].clone();
        let offset: i64 = w.headers["lockgate.offset"].parse().unwrap();
        // Within a partition, one origin partition's records come in the order read.
        if let Some(prev) = last.insert((w.partition, origin.clone()), offset) {
            assert!(offset > prev, "{origin}@{offset} after @{prev}");
        }
        orders.insert(w.payload["order"].as_u64().unwrap());
    }
    assert_eq!(orders.len(), 3_000);
    assert!(
        partition_of_user
            .values()
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            > 1
    );
}

#[test]
fn a_record_without_the_key_or_one_the_client_refuses_fails_the_job_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 1), ("orders-by-user", 1)]);
    produce_raw(
        &kafka.bootstrap,
        "orders",
        0,
        &[br#"{"user":"u-1","amount":1}"#, br#"{"amount":2}"#],
    );
    write_job(tmp.path(), &kafka.bootstrap, "");
    let (status, log) = run_job(tmp.path());
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("record orders/0@1: no key at /user"), "{log}");

    // A record larger than the producer may send is refused by the client: the job
    // fails naming the topic, rather than skip it.
    let big = format!(r#"{{"user":"u-2","pad":"{}"}}"#, "x".repeat(3000));
    let kafka = KafkaProcess::start(&[("orders", 1), ("orders-by-user", 1)]);
    produce_raw(&kafka.bootstrap, "orders", 0, &[big.as_bytes()]);
    let dir = tmp.path().join("big");
    write_job(
        &dir,
        &kafka.bootstrap,
        "[sink.kafka.properties]\n\"message.max.bytes\" = \"1000\"",
    );
    let (status, log) = run_job(&dir);
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("cannot write to orders-by-user"), "{log}");
}

#[test]
fn a_record_without_the_key_is_dead_lettered_by_policy_with_its_origin_and_error() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 1), ("orders-by-user", 1), ("orders-dlq", 1)]);
    produce_raw(
        &kafka.bootstrap,
        "orders",
        0,
        &[
            br#"{"user":"u-1","amount":1}"#,
            br#"{"amount":2}"#,
            br#"{"user":"u-3","amount":3}"#,
        ],
    );
    write_job(
        tmp.path(),
        &kafka.bootstrap,
        "on_invalid = \"dead-letter:orders-dlq\"",
    );
    let (status, log) = run_job(tmp.path());
    assert!(status.success(), "{log}");
    let written = read_all(&kafka.bootstrap, "orders-by-user", 1);
    let users: Vec<_> = written.iter().map(|w| w.key.clone().unwrap()).collect();
    assert_eq!(users, ["u-1", "u-3"], "the others are written");
    let letters = read_all(&kafka.bootstrap, "orders-dlq", 1);
    assert_eq!(letters.len(), 1, "{log}");
    let l = &letters[0];
    assert_eq!(l.payload, serde_json::json!({"amount": 2}));
    assert_eq!(l.key, None);
    assert_eq!(l.headers["lockgate.topic"], "orders");
    assert_eq!(l.headers["lockgate.partition"], "0");
    assert_eq!(l.headers["lockgate.offset"], "1");
    assert!(
        l.headers["lockgate.error"].contains("no key at /user"),
        "{:?}",
        l.headers
    );
}

/// `partitions = N` is one count for every member and start of the stage: records go
/// to Kafka's partition of their key over N partitions (not over the topic's 4), a
/// topic with fewer partitions is refused naming the key, and without the key a stage
/// run as members is refused before it starts (each member would take the topic's
/// count at its own first start).
#[test]
fn partitions_fixes_the_count_for_every_member_and_is_required_to_run_as_members() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 2), ("orders-by-user", 4)]);
    lockgate::testkit::kafka::produce_orders_keyed(
        &kafka.bootstrap,
        "orders",
        0,
        1_000,
        50,
        lockgate::testkit::kafka::OrderKey::Order,
    )
    .unwrap();
    write_job(tmp.path(), &kafka.bootstrap, "partitions = 3");
    let (status, log) = run_job(tmp.path());
    assert!(status.success(), "{log}");
    let written = read_all(&kafka.bootstrap, "orders-by-user", 4);
    assert_eq!(written.len(), 1_000, "{log}");
    for w in &written {
        let user = w.payload["user"].as_str().unwrap();
        assert_eq!(
            w.partition,
            lockgate::connectors::kafka::sink::key_partition(user.as_bytes(), 3),
            "{user} over the configured 3 partitions"
        );
    }
    // More partitions than the topic has.
    let more = tmp.path().join("more");
    write_job(&more, &kafka.bootstrap, "partitions = 5");
    let (status, log) = run_job(&more);
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("has 4 partitions, fewer than the 5") && log.contains("sink.kafka.partitions"),
        "{}",
        tail(&log, 20)
    );
    // As members, without the key: refused at load.
    let members = tmp.path().join("members");
    write_job(&members, &kafka.bootstrap, "");
    let out = Command::new(bin())
        .args(["run", "--config"])
        .arg(members.join("job.toml"))
        .args(["--member", "0", "--members", "2"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("job.toml: sink.kafka.partitions:"), "{err}");
    assert!(!members.join("checkpoints").exists());
}
