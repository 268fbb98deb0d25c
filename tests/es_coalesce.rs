//! Coalescing never loses a write, through real processes: the embedded Kafka, the
//! binary, and an Elasticsearch-API server (the project's test server and
//! osmem-server). A keyed document's newer write replaces an older one before either
//! is sent; when Elasticsearch refuses the newer one (a mapping error, dead-lettered),
//! the older one is written instead, so the index and the dead-letter topic end as
//! they would without coalescing.

mod common;

use common::es::{Es, Starter};
use common::kafka::{consumer, watermarks, KafkaProcess};
use common::{bin, tail, wait_timeout};
use rdkafka::consumer::Consumer;
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// A bounded job from `orders` to the index `docs`, one document per Kafka key, refused
/// documents dead-lettered to `dlq`. Nothing is sent before the end of the input (no
/// flush interval or checkpoint comes first), so every write of a key is coalesced
/// into its last one.
fn job(dir: &Path, bootstrap: &str, es: &str) {
    let text = format!(
        "[job]\nname = \"coalesce\"\nparallelism = 1\n\n\
         [checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 600000\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\n\n\
         [sink.elasticsearch]\nurl = \"{es}\"\nindex = \"docs\"\nid = \"key\"\noperation = \"index\"\n\
         on_item_error = \"dead-letter:dlq\"\nbulk_flush_interval_ms = 600000\n"
    );
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("job.toml"), text).unwrap();
}

/// Produces keyed records to partition 0 of `orders`, in order.
fn produce(bootstrap: &str, records: &[(&str, &str)]) {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    for (key, value) in records {
        p.send(
            BaseRecord::to("orders")
                .partition(0)
                .key(*key)
                .payload(*value),
        )
        .unwrap();
    }
    p.flush(Duration::from_secs(60)).unwrap();
}

/// Every record of `topic` (one partition): its payload and headers, in order.
fn all_records(bootstrap: &str, topic: &str) -> Vec<(String, HashMap<String, String>)> {
    let (_, high) = watermarks(bootstrap, topic, 0).unwrap();
    let c = consumer(bootstrap, "dlq-reader");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let start = std::time::Instant::now();
    while (out.len() as i64) < high {
        assert!(
            start.elapsed() < common::wait::DEADLINE,
            "{} of {high} records of {topic} read",
            out.len()
        );
        let Some(m) = c.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = m.unwrap();
        let headers = m
            .headers()
            .map(|hs| {
                hs.iter()
                    .map(|h| {
                        (
                            h.key.to_string(),
                            String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let payload = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
        out.push((payload, headers));
    }
    out
}

/// Runs the job over `records` on a fresh server; returns the server (to read the
/// index) and the dead letters as (offset, payload, error).
fn run(start: Starter, records: &[(&str, &str)]) -> (Es, Vec<(String, String, String)>) {
    let kafka = KafkaProcess::start(&[("orders", 1), ("dlq", 1)]);
    let es = start();
    es.create_index("docs", &[("n", "long")]);
    produce(&kafka.bootstrap, records);
    let tmp = tempfile::tempdir().unwrap();
    job(tmp.path(), &kafka.bootstrap, &es.url());
    let log_path = tmp.path().join("runs.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = Command::new(bin())
        .args(["run", "--config"])
        .arg(tmp.path().join("job.toml"))
        .env("LOCKGATE_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let status = wait_timeout(&mut child, common::wait::DEADLINE);
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(status.success(), "{}", tail(&log, 30));
    let letters = all_records(&kafka.bootstrap, "dlq")
        .into_iter()
        .map(|(payload, h)| {
            assert_eq!(h["lockgate.id"], "k", "{h:?}");
            let error = h["lockgate.error"].clone();
            assert!(
                error.contains("mapper_parsing_exception")
                    || error.contains("document_parsing_exception"),
                "{h:?}"
            );
            (h["lockgate.offset"].clone(), payload, error)
        })
        .collect();
    (es, letters)
}

/// The document `id` of `docs`, if it exists.
fn doc(es: &Es, id: &str) -> Option<Value> {
    es.get_many("docs", &[id.to_string()])
        .into_iter()
        .next()
        .map(|(_, source, _)| source)
}

/// The reviewer's case: `k:{"n":1}` then `k:{"n":"x"}` (refused by the mapping). Without
/// coalescing `k` is `{"n":1}` and the second record is dead-lettered; with it (the
/// default), the same.
fn a_refused_newer_write_leaves_the_older_one_written(start: Starter) {
    let (es, letters) = run(start, &[("k", r#"{"n":1}"#), ("k", r#"{"n":"x"}"#)]);
    let offsets: Vec<(&str, &str)> = letters
        .iter()
        .map(|(o, p, _)| (o.as_str(), p.as_str()))
        .collect();
    assert_eq!(
        offsets,
        vec![("1", r#"{"n":"x"}"#)],
        "exactly the second record is dead-lettered"
    );
    assert_eq!(doc(&es, "k"), Some(json!({"n": 1})), "the first is written");
}

#[test]
fn a_refused_newer_write_leaves_the_older_one_written_on_the_test_server() {
    a_refused_newer_write_leaves_the_older_one_written(Es::testkit);
}

#[test]
fn a_refused_newer_write_leaves_the_older_one_written_on_osmem() {
    a_refused_newer_write_leaves_the_older_one_written(Es::osmem);
}

/// A chain: `k` gets 1, then "x" and "y" (both refused): each refusal falls back one
/// write, down to 1, and both refused records are dead-lettered. `j` gets 1 then 2: the
/// written 2 makes 1 moot.
#[test]
fn a_chain_of_refused_writes_falls_back_to_the_last_one_accepted() {
    let (es, letters) = run(
        Es::testkit,
        &[
            ("k", r#"{"n":1}"#),
            ("j", r#"{"n":1}"#),
            ("k", r#"{"n":"x"}"#),
            ("j", r#"{"n":2}"#),
            ("k", r#"{"n":"y"}"#),
        ],
    );
    let mut offsets: Vec<(&str, &str)> = letters
        .iter()
        .map(|(o, p, _)| (o.as_str(), p.as_str()))
        .collect();
    offsets.sort();
    assert_eq!(offsets, vec![("2", r#"{"n":"x"}"#), ("4", r#"{"n":"y"}"#)]);
    assert_eq!(doc(&es, "k"), Some(json!({"n": 1})));
    assert_eq!(doc(&es, "j"), Some(json!({"n": 2})));
}
