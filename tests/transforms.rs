//! Kafka Connect's transforms in a job file, end to end: a stack of them between the
//! embedded Kafka and the Elasticsearch test server, checked document by document, and
//! the same stack under `lockgate chaos` (whose verifier applies the job's transforms
//! to its inputs).

mod common;

use common::es::Es;
use common::kafka::KafkaProcess;
use common::{run_config, tail};
use serde_json::json;
use std::path::Path;

const ORDERS: u64 = 3_000;
const USERS: u64 = 50;

/// The transforms: stamp, rename, cast, convert, and key by order number.
const STACK: &str = r#"
[[transform]]
type = "insert_field"
static = { source = "kafka" }
topic_field = "topic"
offset_field = "offset"

[[transform]]
type = "replace_field"
rename = { amount = "price" }

[[transform]]
type = "cast"
spec = { order = "string", price = "float64" }

[[transform]]
type = "timestamp_converter"
field = "offset"
from = "unix_s"
to = "%Y"

[[transform]]
type = "set_key"
field = "/order"
"#;

fn job(dir: &Path, bootstrap: &str, es: &str, id: &str) -> std::path::PathBuf {
    let text = format!(
        "[job]\nname = \"smt-test\"\nparallelism = 2\n\n[checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 200\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\n\
         {STACK}\n\
         [sink.elasticsearch]\nurl = \"{es}\"\nindex = \"orders\"\nid = \"{id}\"\n\
         bulk_flush_interval_ms = 100\nretry_initial_ms = 20\nretry_max_ms = 500\nretry_max_attempts = 1000\n"
    );
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join("job.toml");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn a_stack_of_transforms_shapes_every_document() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 4)]);
    lockgate::testkit::kafka::produce_orders(&kafka.bootstrap, "orders", 0, ORDERS, USERS).unwrap();
    let es = Es::testkit();
    let config = job(tmp.path(), &kafka.bootstrap, &es.url(), "key");
    let (code, log) = run_config(&config);
    assert_eq!(code, Some(0), "{}", tail(&log, 30));
    let ids: Vec<String> = (0..ORDERS).map(|i| i.to_string()).collect();
    let docs = es.get_many("orders", &ids);
    assert_eq!(docs.len() as u64, ORDERS);
    for (id, doc, _) in docs {
        let i: u64 = id.parse().unwrap();
        // produce_orders: {"order": i, "user": "user-NNNN", "amount": A}.
        let user = format!("user-{:04}", (i * 7919) % USERS);
        let amount = (1 + (i * 31) % 500) as f64;
        let offset = doc["offset"].as_str().unwrap().to_string();
        assert_eq!(
            doc,
            json!({"order": id, "user": user, "price": amount, "source": "kafka",
                   "topic": "orders", "offset": offset}),
        );
        // An offset read as seconds since the epoch: a year of the 1970s.
        assert!(offset.starts_with("197"), "{offset}");
    }
}

/// Runs `lockgate chaos` with 5 kills (seeded by `seed`) and asserts an exact verdict
/// over `expected` documents.
fn chaos_is_exact(config: &Path, seed: &str, expected: u64) {
    let (code, out, r) = common::chaos(
        config,
        &[
            "--kills",
            "5",
            "--seed",
            seed,
            "--failpoints",
            "source-batch=sleep(200)",
            "--failpoint-runs",
            "5",
            "--kill-after-ms",
            "300..700",
        ],
    );
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(r["verdict"]["inputs"], expected, "{out}");
    for k in ["missing", "duplicated", "wrong"] {
        assert_eq!(r["verdict"][k], 0, "{k}: {out}");
    }
    assert!(r["kills"].as_u64().unwrap() >= 1, "{out}");
}

#[test]
fn a_stack_of_transforms_under_chaos_is_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 4)]);
    lockgate::testkit::kafka::produce_orders(&kafka.bootstrap, "orders", 0, 40_000, USERS).unwrap();
    let es = Es::testkit();
    let config = job(tmp.path(), &kafka.bootstrap, &es.url(), "coordinates");
    chaos_is_exact(&config, "11", 40_000);
}

/// Produces `(key, value, headers)` records to partition 0 of `topic`; a `None` value
/// is a tombstone.
/// A record to produce: key, value (`None`: a tombstone) and headers.
type Produced<'a> = (String, Option<String>, Vec<(&'a str, &'a str)>);

fn produce(bootstrap: &str, topic: &str, records: &[Produced<'_>]) {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    for (key, value, headers) in records {
        let mut h = OwnedHeaders::new();
        for (k, v) in headers {
            h = h.insert(Header {
                key: k,
                value: Some(v.as_bytes()),
            });
        }
        let mut r = BaseRecord::<str, str>::to(topic)
            .partition(0)
            .key(key)
            .headers(h);
        if let Some(v) = value {
            r = r.payload(v);
        }
        producer.send(r).unwrap();
    }
    producer.flush(std::time::Duration::from_secs(60)).unwrap();
}

/// Every record of partition 0 of `topic`: offsets with the `lockgate.error` header.
fn dead_letters(bootstrap: &str, topic: &str) -> Vec<(String, String)> {
    use rdkafka::consumer::Consumer;
    let c = common::kafka::consumer(bootstrap, "dlq-reader");
    let (_, high) = c
        .fetch_watermarks(topic, 0, std::time::Duration::from_secs(10))
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, rdkafka::Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let start = std::time::Instant::now();
    while (out.len() as i64) < high {
        assert!(
            start.elapsed() < common::wait::DEADLINE,
            "{} of {high} letters read from {topic}",
            out.len()
        );
        if let Some(m) = c.poll(std::time::Duration::from_millis(200)) {
            let h = common::kafka::headers_of(&m.unwrap());
            out.push((h["lockgate.offset"].clone(), h["lockgate.error"].clone()));
        }
    }
    out
}

fn job_with(
    dir: &Path,
    bootstrap: &str,
    topic: &str,
    transforms: &str,
    sink: &str,
) -> std::path::PathBuf {
    let text = format!(
        "[job]\nname = \"smt-test\"\nparallelism = 1\n\n[checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 200\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"{topic}\"]\nbounded = \"latest\"\n\
         {transforms}\n\
         [sink.elasticsearch]\n{sink}\n\
         bulk_flush_interval_ms = 100\nretry_initial_ms = 20\nretry_max_ms = 500\nretry_max_attempts = 1000\n"
    );
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join("job.toml");
    std::fs::write(&p, text).unwrap();
    p
}

const ORDER_LINES: usize = 200;

/// Orders of two lines each; every tenth has a `test` header, and two have lines that
/// are not an array (a jq error).
fn order_lines(bootstrap: &str) {
    let records: Vec<_> = (0..ORDER_LINES)
        .map(|i| {
            let value = if i == 17 || i == 88 {
                json!({"order": i, "lines": "broken"})
            } else {
                json!({"order": i, "lines": [{"sku": "a", "qty": i}, {"sku": "b", "qty": 1}]})
            };
            let headers = if i % 10 == 3 {
                vec![("test", "yes")]
            } else {
                vec![]
            };
            (format!("o-{i}"), Some(value.to_string()), headers)
        })
        .collect();
    produce(bootstrap, "orders", &records);
}

const LINES: &str = r#"
[[transform]]
type = "filter"
has_header = "test"

[[transform]]
type = "jq"
filter = '.order as $o | .lines[] | {order: $o, sku, qty, key: $meta.key, topic: $meta.topic}'
on_error = "dead-letter:orders-dlq"
"#;

#[test]
fn jq_outputs_become_documents_of_their_own_and_failures_dead_letters() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 1), ("orders-dlq", 1)]);
    order_lines(&kafka.bootstrap);
    let es = Es::testkit();
    let sink = format!(
        "url = \"{}\"\nindex = \"lines\"\nid = \"coordinates\"",
        es.url()
    );
    let config = job_with(tmp.path(), &kafka.bootstrap, "orders", LINES, &sink);
    let (code, log) = run_config(&config);
    assert_eq!(code, Some(0), "{}", tail(&log, 30));
    let kept: Vec<usize> = (0..ORDER_LINES)
        .filter(|i| i % 10 != 3 && *i != 17 && *i != 88)
        .collect();
    let ids: Vec<String> = kept
        .iter()
        .flat_map(|i| [format!("orders-0-{i}"), format!("orders-0-{i}-1")])
        .collect();
    let docs = es.get_many("lines", &ids);
    assert_eq!(docs.len(), ids.len());
    assert_eq!(es.count("lines"), ids.len() as u64, "no other documents");
    for (id, doc, _) in docs {
        let i: usize = id.split('-').nth(2).unwrap().parse().unwrap();
        let (sku, qty) = if id.ends_with(&format!("-{i}-1")) {
            ("b", 1)
        } else {
            ("a", i)
        };
        assert_eq!(
            doc,
            json!({"order": i, "sku": sku, "qty": qty, "key": format!("o-{i}"), "topic": "orders"}),
            "{id}"
        );
    }
    let letters = dead_letters(&kafka.bootstrap, "orders-dlq");
    let offsets: Vec<&str> = letters.iter().map(|(o, _)| o.as_str()).collect();
    assert_eq!(offsets, ["17", "88"]);
    for (_, error) in &letters {
        assert!(
            error.contains("jq: ") && error.contains("orders/0@"),
            "{error}"
        );
    }
}

#[test]
fn a_record_jq_fails_on_is_skipped_or_fails_the_job_as_on_error_says() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 1)]);
    order_lines(&kafka.bootstrap);
    let es = Es::testkit();
    let run = |policy: &str, index: &str| {
        let sink = format!(
            "url = \"{}\"\nindex = \"{index}\"\nid = \"coordinates\"",
            es.url()
        );
        let transforms = LINES.replace("dead-letter:orders-dlq", policy);
        run_config(&job_with(
            &tmp.path().join(index),
            &kafka.bootstrap,
            "orders",
            &transforms,
            &sink,
        ))
    };
    // skip: every other record is indexed, the two the program fails on are not.
    let (code, log) = run("skip", "skipped");
    assert_eq!(code, Some(0), "{}", tail(&log, 30));
    let kept = (0..ORDER_LINES)
        .filter(|i| i % 10 != 3 && *i != 17 && *i != 88)
        .count();
    assert_eq!(es.count("skipped"), 2 * kept as u64);
    assert!(
        log.contains("on_error = \"skip\""),
        "the skip is logged: {}",
        tail(&log, 30)
    );
    // fail: the job stops at the first, naming the record and the transform.
    let (code, log) = run("fail", "failed");
    assert_eq!(code, Some(1), "{}", tail(&log, 30));
    assert!(
        log.contains("orders/0@17") && log.contains("jq: "),
        "{}",
        tail(&log, 30)
    );
}

#[test]
fn jq_outputs_under_chaos_are_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 1), ("orders-dlq", 1)]);
    // Enough records for the kills to land mid-run; every thousandth one the program
    // fails on.
    let records: Vec<_> = (0..20_000)
        .map(|i| {
            let lines = if i % 1000 == 999 {
                json!("broken")
            } else {
                json!([{"sku": "a", "qty": i}, {"sku": "b", "qty": 1}])
            };
            let value = json!({"order": i, "lines": lines});
            (format!("o-{i}"), Some(value.to_string()), vec![])
        })
        .collect();
    produce(&kafka.bootstrap, "orders", &records);
    let es = Es::testkit();
    // The sink's dead letters share the program's topic, which the verifier reads.
    let sink = format!(
        "url = \"{}\"\nindex = \"lines\"\nid = \"coordinates\"\non_item_error = \"dead-letter:orders-dlq\"",
        es.url()
    );
    let config = job_with(tmp.path(), &kafka.bootstrap, "orders", LINES, &sink);
    // Two documents of each record, each verified by its own id; none of the 20 the
    // program dead-letters.
    chaos_is_exact(&config, "7", 2 * (20_000 - 20));
    let letters = dead_letters(&kafka.bootstrap, "orders-dlq");
    assert!(letters.len() >= 20, "{}", letters.len());
}

#[test]
fn deletes_and_tombstones_pass_the_transforms_into_elasticsearch() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("users", 1)]);
    let mut records: Vec<_> = (0..50)
        .map(|i| {
            let v = json!({"id": format!("u-{i}"), "n": i, "secret": "s"});
            (format!("u-{i}"), Some(v.to_string()), vec![])
        })
        .collect();
    // Tombstones for the first ten, then a newer value for u-20.
    records.extend((0..10).map(|i| (format!("u-{i}"), None, vec![])));
    records.push((
        "u-20".into(),
        Some(json!({"id": "u-20", "n": 100, "secret": "s"}).to_string()),
        vec![],
    ));
    produce(&kafka.bootstrap, "users", &records);
    let es = Es::testkit();
    let transforms = r#"
[[transform]]
type = "replace_field"
exclude = ["secret"]

[[transform]]
type = "jq"
filter = '. + {seen: true}'
"#;
    let sink = format!(
        "url = \"{}\"\nindex = \"users\"\nid = \"key\"\non_null_value = \"delete\"",
        es.url()
    );
    let config = job_with(tmp.path(), &kafka.bootstrap, "users", transforms, &sink);
    let (code, log) = run_config(&config);
    assert_eq!(code, Some(0), "{}", tail(&log, 30));
    let ids: Vec<String> = (0..50).map(|i| format!("u-{i}")).collect();
    let docs = es.get_many("users", &ids);
    let found: Vec<&str> = docs.iter().map(|(id, _, _)| id.as_str()).collect();
    let want: Vec<String> = (10..50).map(|i| format!("u-{i}")).collect();
    assert_eq!(found, want, "deleted users are absent, the rest present");
    for (id, doc, _) in &docs {
        let i: u64 = id[2..].parse().unwrap();
        let n = if i == 20 { 100 } else { i };
        assert_eq!(*doc, json!({"id": id, "n": n, "seen": true}), "{id}");
    }
}

#[test]
fn a_jq_program_that_does_not_compile_is_a_configuration_error() {
    let tmp = tempfile::tempdir().unwrap();
    let transforms = "[[transform]]\ntype = \"jq\"\nfilter = '''\n.a\n| foo(1)\n'''\n";
    let config = job_with(
        tmp.path(),
        "127.0.0.1:9",
        "t",
        transforms,
        "url = \"http://127.0.0.1:9\"\nindex = \"i\"",
    );
    let (code, log) = run_config(&config);
    assert_eq!(code, Some(2), "{log}");
    assert!(
        log.contains("transform[0].filter")
            && log.contains("undefined filter `foo` at line 2, column 3"),
        "{log}"
    );
    assert!(log.contains("job.toml"), "names the file: {log}");
}

#[test]
fn a_filter_drops_tombstones_the_sink_does_not_read() {
    // Kafka Connect's usual pair: Filter with RecordIsTombstone. Without it, a
    // tombstone is a record the source cannot decode (the job would fail on it).
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("users", 1)]);
    let mut records: Vec<_> = (0..20)
        .map(|i| (format!("u-{i}"), Some(json!({"n": i}).to_string()), vec![]))
        .collect();
    records.extend((0..5).map(|i| (format!("u-{i}"), None, vec![])));
    produce(&kafka.bootstrap, "users", &records);
    let es = Es::testkit();
    let sink = format!("url = \"{}\"\nindex = \"users\"\nid = \"key\"", es.url());
    let filter = "[[transform]]\ntype = \"filter\"\nis_tombstone = true\n";
    let config = job_with(tmp.path(), &kafka.bootstrap, "users", filter, &sink);
    let (code, log) = run_config(&config);
    assert_eq!(code, Some(0), "{}", tail(&log, 30));
    assert_eq!(es.count("users"), 20);
    let without = job_with(
        &tmp.path().join("without"),
        &kafka.bootstrap,
        "users",
        "",
        &sink,
    );
    let (code, log) = run_config(&without);
    assert_eq!(
        code,
        Some(1),
        "a tombstone fails the job without the filter: {log}"
    );
    assert!(log.contains("tombstone"), "{log}");
}
