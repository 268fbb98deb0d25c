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
use rdkafka::message::Message;
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
/// into its last one. `sink` adds lines to the sink's section (the operation).
fn job(dir: &Path, bootstrap: &str, es: &str, sink: &str) {
    let text = format!(
        "[job]\nname = \"coalesce\"\nparallelism = 1\n\n\
         [checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 600000\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\n\n\
         [sink.elasticsearch]\nurl = \"{es}\"\nindex = \"docs\"\nid = \"key\"\n{sink}\n\
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
        let headers = common::kafka::headers_of(&m);
        let payload = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
        out.push((payload, headers));
    }
    out
}

/// What one run did: the server (to read the index), the dead letters as (offset,
/// payload, error), and the sink's counts from its close log line.
struct Run {
    es: Es,
    letters: Vec<(String, String, String)>,
    /// Bulk requests sent.
    bulks: u64,
    /// Writes coalesced (replaced, and never sent, since a newer write was written).
    coalesced: u64,
}

/// The number after `key=` on the sink's close log line.
fn closing_count(log: &str, key: &str) -> u64 {
    let line = log
        .lines()
        .find(|l| l.contains("Elasticsearch sink closed"))
        .unwrap_or_else(|| panic!("no close line in\n{}", tail(log, 30)));
    let at = line
        .find(&format!("{key}="))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
        + key.len()
        + 1;
    let digits: String = line[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap_or_else(|_| panic!("{key} in {line}"))
}

const INDEX: &str = "operation = \"index\"";

/// Runs the job (its sink given `sink`) over `records` on a fresh server.
fn run(start: Starter, sink: &str, records: &[(&str, &str)]) -> Run {
    let kafka = KafkaProcess::start(&[("orders", 1), ("dlq", 1)]);
    let es = start();
    es.create_index("docs", &[("n", "long")]);
    produce(&kafka.bootstrap, records);
    let tmp = tempfile::tempdir().unwrap();
    job(tmp.path(), &kafka.bootstrap, &es.url(), sink);
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
    Run {
        es,
        letters,
        bulks: closing_count(&log, "bulks"),
        coalesced: closing_count(&log, "coalesced"),
    }
}

/// The dead letters' (offset, payload), sorted.
fn offsets(letters: &[(String, String, String)]) -> Vec<(&str, &str)> {
    let mut o: Vec<(&str, &str)> = letters
        .iter()
        .map(|(o, p, _)| (o.as_str(), p.as_str()))
        .collect();
    o.sort();
    o
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
/// Coalescing happened: the first request carried only the newer write, the second
/// the older one, which is written, not coalesced.
fn a_refused_newer_write_leaves_the_older_one_written(start: Starter) {
    let r = run(start, INDEX, &[("k", r#"{"n":1}"#), ("k", r#"{"n":"x"}"#)]);
    assert_eq!(
        offsets(&r.letters),
        vec![("1", r#"{"n":"x"}"#)],
        "exactly the second record is dead-lettered"
    );
    assert_eq!(
        doc(&r.es, "k"),
        Some(json!({"n": 1})),
        "the first is written"
    );
    assert_eq!(
        (r.bulks, r.coalesced),
        (2, 0),
        "the newer write alone, then the older one"
    );
}

#[test]
fn a_refused_newer_write_leaves_the_older_one_written_on_the_test_server() {
    a_refused_newer_write_leaves_the_older_one_written(Es::testkit);
}

#[test]
fn a_refused_newer_write_leaves_the_older_one_written_on_osmem() {
    a_refused_newer_write_leaves_the_older_one_written(Es::osmem);
}

/// A chain: `k` gets 1, then "x" and "y" (both refused): the refused "y" puts 1 and "x"
/// back together, sent in one request, and both refused records are dead-lettered.
/// `j` gets 1 then 2: the written 2 makes 1 moot (coalesced). Two requests in all.
#[test]
fn a_chain_of_refused_writes_falls_back_to_the_last_one_accepted() {
    let r = run(
        Es::testkit,
        INDEX,
        &[
            ("k", r#"{"n":1}"#),
            ("j", r#"{"n":1}"#),
            ("k", r#"{"n":"x"}"#),
            ("j", r#"{"n":2}"#),
            ("k", r#"{"n":"y"}"#),
        ],
    );
    assert_eq!(
        offsets(&r.letters),
        vec![("2", r#"{"n":"x"}"#), ("4", r#"{"n":"y"}"#)]
    );
    assert_eq!(doc(&r.es, "k"), Some(json!({"n": 1})));
    assert_eq!(doc(&r.es, "j"), Some(json!({"n": 2})));
    assert_eq!(
        (r.bulks, r.coalesced),
        (2, 1),
        "[y, j:2], then [1, x] at once"
    );
}

/// The same with upserts (merges): `k`'s refused "x" covers 1 and falls back to it;
/// `j`'s 2 covers 1 (coalesced); `h`'s `{"n":2}` does not cover `{"n":1,"a":1}`, so
/// both are sent, in two requests, and merge.
#[test]
fn refused_upserts_fall_back_and_only_covering_merges_coalesce() {
    let r = run(
        Es::testkit,
        "operation = \"upsert\"",
        &[
            ("k", r#"{"n":1}"#),
            ("j", r#"{"n":1}"#),
            ("h", r#"{"n":1,"a":1}"#),
            ("k", r#"{"n":"x"}"#),
            ("j", r#"{"n":2}"#),
            ("h", r#"{"n":2}"#),
        ],
    );
    assert_eq!(offsets(&r.letters), vec![("3", r#"{"n":"x"}"#)]);
    assert_eq!(doc(&r.es, "k"), Some(json!({"n": 1})));
    assert_eq!(doc(&r.es, "j"), Some(json!({"n": 2})));
    assert_eq!(doc(&r.es, "h"), Some(json!({"n": 2, "a": 1})));
    assert_eq!(
        (r.bulks, r.coalesced),
        (2, 1),
        "[x, j:2, h:1], then [1, h:2]"
    );
}

/// The same with external versions (the offset): a strictly newer version replaces an
/// older one; the refused "x" (version 2) falls back to 1 (version 0), written.
#[test]
fn a_refused_newer_version_falls_back_to_the_older_one() {
    let r = run(
        Es::testkit,
        "operation = \"index\"\nversioning = \"external\"",
        &[
            ("k", r#"{"n":1}"#),
            ("j", r#"{"n":1}"#),
            ("k", r#"{"n":"x"}"#),
            ("j", r#"{"n":2}"#),
        ],
    );
    assert_eq!(offsets(&r.letters), vec![("2", r#"{"n":"x"}"#)]);
    assert_eq!(doc(&r.es, "k"), Some(json!({"n": 1})));
    assert_eq!(doc(&r.es, "j"), Some(json!({"n": 2})));
    assert_eq!((r.bulks, r.coalesced), (2, 1), "[x, j:2], then [1]");
}
