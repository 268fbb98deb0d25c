//! Dead letters of the Elasticsearch sink survive a crash, through real processes: the
//! embedded Kafka, the binary, and the project's Elasticsearch test server.
//!
//! With `versioning = "external"`, a replayed write that Elasticsearch answers with 409
//! counts as already written. That is only true if a later write of the same document
//! can never have been applied while an earlier one was refused and not yet
//! dead-lettered: the sink then never sends a later write of a document before the
//! earlier one is written or its dead letter is acknowledged. The job below is killed
//! after each bulk request in turn (the `bulk-response` failpoint: Elasticsearch
//! applied the request, its response is not read), and run again.

mod common;

use common::es::Es;
use common::kafka::{consumer, headers_of, watermarks, KafkaProcess};
use common::{bin, tail, wait_timeout};
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The three records of document `k`, in offset order: the middle one does not fit the
/// mapping (`n` is a `long`).
const RECORDS: [&str; 3] = [r#"{"n":1}"#, r#"{"n":"x"}"#, r#"{"n":2}"#];

/// A bounded job from `orders` to the index `docs`, one document per Kafka key,
/// versions by offset, every write sent (no coalescing), refused documents as
/// `on_item_error` says (`dead-letter:dlq` or `fail`). Nothing is sent before the end of the input (no flush
/// interval or checkpoint comes first): without the rule, one request would carry all
/// three writes of `k`.
fn job(dir: &Path, bootstrap: &str, es: &str, on_item_error: &str) -> std::path::PathBuf {
    let text = format!(
        "[job]\nname = \"dead-letters\"\nparallelism = 1\n\n\
         [checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 600000\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\n\n\
         [sink.elasticsearch]\nurl = \"{es}\"\nindex = \"docs\"\nid = \"key\"\n\
         operation = \"index\"\nversioning = \"external\"\ncoalesce = false\n\
         on_item_error = \"{on_item_error}\"\nbulk_flush_interval_ms = 600000\n"
    );
    let path = dir.join("job.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn produce(bootstrap: &str) {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    for value in RECORDS {
        p.send(
            BaseRecord::to("orders")
                .partition(0)
                .key("k")
                .payload(value),
        )
        .unwrap();
    }
    p.flush(Duration::from_secs(60)).unwrap();
}

/// Every letter of `dlq`: its origin offset and payload.
fn letters(bootstrap: &str) -> Vec<(String, String)> {
    let (_, high) = watermarks(bootstrap, "dlq", 0).unwrap();
    let c = consumer(bootstrap, "dlq-reader");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("dlq", 0, Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let start = std::time::Instant::now();
    while (out.len() as i64) < high {
        assert!(
            start.elapsed() < common::wait::DEADLINE,
            "{} of {high} letters read",
            out.len()
        );
        let Some(m) = c.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = m.unwrap();
        let h = headers_of(&m);
        assert_eq!(h["lockgate.id"], "k", "{h:?}");
        assert!(
            h["lockgate.error"].contains("document_parsing_exception"),
            "{h:?}"
        );
        let payload = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
        out.push((h["lockgate.offset"].clone(), payload));
    }
    out
}

/// Runs the job; `failpoints` arms `LOCKGATE_FAILPOINTS`. The exit status and the log.
fn run(config: &Path, failpoints: Option<&str>) -> (std::process::ExitStatus, String) {
    let log_path = config.with_extension(format!("{}.log", failpoints.map_or(1, |_| 0)));
    let mut cmd = Command::new(bin());
    cmd.args(["run", "--config"])
        .arg(config)
        .env("LOCKGATE_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap());
    match failpoints {
        Some(f) => cmd.env("LOCKGATE_FAILPOINTS", f),
        None => cmd.env_remove("LOCKGATE_FAILPOINTS"),
    };
    let status = wait_timeout(&mut cmd.spawn().unwrap(), common::wait::DEADLINE);
    (
        status,
        std::fs::read_to_string(&log_path).unwrap_or_default(),
    )
}

/// For each bulk request of the first run in turn: the run is aborted once
/// Elasticsearch applied that request, before its response is read (so before a dead
/// letter of its refused item is written), and run again to the end. The refused
/// record (offset 1) is dead-lettered exactly once, the index holds the last write,
/// and the first run sent each write of `k` in a request of its own.
#[test]
fn a_refused_write_is_dead_lettered_after_a_crash_whatever_request_it_hit() {
    for n in 1..=RECORDS.len() {
        let kafka = KafkaProcess::start(&[("orders", 1), ("dlq", 1)]);
        let es = Es::testkit();
        es.create_index("docs", &[("n", "long")]);
        produce(&kafka.bootstrap);
        let tmp = tempfile::tempdir().unwrap();
        let config = job(tmp.path(), &kafka.bootstrap, &es.url(), "dead-letter:dlq");
        // The n-th bulk response aborts the process.
        let spec = format!("bulk-response={}*off->exit", n - 1);
        let (status, log) = run(&config, Some(&spec));
        assert!(
            !status.success() && log.contains("failpoint bulk-response: exit"),
            "request {n}: the first run did not abort at its {n}th bulk response ({status}): {}",
            tail(&log, 20)
        );
        let (status, log) = run(&config, None);
        assert!(status.success(), "request {n}: {}", tail(&log, 30));
        let letters = letters(&kafka.bootstrap);
        assert_eq!(
            letters,
            vec![("1".to_string(), RECORDS[1].to_string())],
            "request {n}: the refused record is dead-lettered once ({} of 1 expected letters): {}",
            letters.len(),
            tail(&log, 30)
        );
        let docs = es.get_many("docs", &["k".to_string()]);
        let doc: Vec<(&Value, i64)> = docs.iter().map(|(_, s, v)| (s, *v)).collect();
        assert_eq!(
            doc,
            vec![(&json!({"n": 2}), 2)],
            "request {n}: the last write, at its version"
        );
    }
}

/// Under `on_item_error = "fail"` the same crash (after the first bulk request was
/// applied) must not let the next run go past the refused record: it fails on it,
/// naming it, as the first run would have.
#[test]
fn under_fail_the_run_after_a_crash_fails_on_the_refused_record_again() {
    let kafka = KafkaProcess::start(&[("orders", 1), ("dlq", 1)]);
    let es = Es::testkit();
    es.create_index("docs", &[("n", "long")]);
    produce(&kafka.bootstrap);
    let tmp = tempfile::tempdir().unwrap();
    let config = job(tmp.path(), &kafka.bootstrap, &es.url(), "fail");
    let (status, log) = run(&config, Some("bulk-response=exit"));
    assert!(
        !status.success() && log.contains("failpoint bulk-response: exit"),
        "the first run aborted at its first bulk response ({status}): {}",
        tail(&log, 20)
    );
    let (status, log) = run(&config, None);
    assert!(
        !status.success() && log.contains("document_parsing_exception"),
        "the next run fails on the refused record ({status}): {}",
        tail(&log, 30)
    );
    let docs = es.get_many("docs", &["k".to_string()]);
    let doc: Vec<(&Value, i64)> = docs.iter().map(|(_, s, v)| (s, *v)).collect();
    assert_eq!(
        doc,
        vec![(&json!({"n": 1}), 0)],
        "nothing after the refused record is written"
    );
}
