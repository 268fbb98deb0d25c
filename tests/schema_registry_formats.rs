//! Schema Registry formats end to end: records written by Confluent's own serializers
//! (`tests/confluent/produce.py`) through the test registry into the embedded Kafka,
//! read by the real binary, and checked in the Elasticsearch index field by field; bad
//! input under each decode policy; a registry outage in the middle of a run; and
//! `lockgate chaos` over an Avro topic.

mod common;

use common::confluent::{self, RegistryProcess};
use common::es::{free_port, Es};
use common::kafka::{first_dead_letter, produce_raw, KafkaProcess};
use common::{bin, run_config, tail, wait_timeout};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const STATUS: [&str; 3] = ["NEW", "PAID", "SHIPPED"];

/// Record `i` as the documented mapping must index it (`produce.py`'s `order(i)`).
fn expected(format: &str, i: u64, version: u32) -> Value {
    let cents = i * 137 + 5;
    let mut v = json!({
        "id": i,
        "user": format!("user-{}", i % 7),
        // Avro's and Protobuf's decimal with its exact digits and scale (two), as
        // text: `0.05`, `1.40`; JSON Schema's producer writes a double's shortest text.
        "amount": if format == "json-schema" {
            json!(cents as f64 / 100.0)
        } else {
            Value::Number(format!("{}.{:02}", cents / 100, cents % 100).parse().unwrap())
        },
        "ts": 1_700_000_000_000u64 + i * 1000,
        "note": if i.is_multiple_of(3) { Value::Null } else { json!(format!("note {i}")) },
        "status": STATUS[(i % 3) as usize],
        "address": {"city": "Lyon", "zip": 69000 + i % 10},
        "tags": [format!("t{}", i % 2), "x"],
        "attrs": {"n": i, "m": -(i as i64)},
        "day": format!("2026-01-{:02}", 1 + i % 30),
    });
    if version == 2 {
        v["coupon"] = json!(format!("c{i}"));
    }
    v
}

/// Avro values and keys.
const AVRO: &str = "format = \"avro\"\nkey_format = \"avro\"";

/// A `kafka -> elasticsearch` job, documents by key, `source_extra` in the source.
fn job(dir: &Path, bootstrap: &str, registry: &str, es: &str, source_extra: &str) -> PathBuf {
    let text = format!(
        "[job]\nname = \"avro-test\"\nparallelism = 2\n\n\
         [checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 200\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"orders\"]\n\
         {source_extra}\n\n\
         [source.kafka.schema_registry]\nurl = \"{registry}\"\n\n\
         [sink.elasticsearch]\nurl = \"{es}\"\nindex = \"orders\"\nid = \"key\"\n\
         bulk_flush_interval_ms = 100\nretry_initial_ms = 20\nretry_max_ms = 500\n"
    );
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join("job.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// The document id of record `i`: its key decoded (a string key is its text, a
/// Protobuf key message its JSON).
fn key_id(format: &str, i: u64) -> String {
    match format {
        "protobuf" => format!(r#"{{"id":"order-{i}"}}"#),
        _ => format!("order-{i}"),
    }
}

/// The documents of records `ids` (read with `format`) are indexed as [`expected`]
/// says, and the index holds `count` documents.
fn assert_documents(
    es: &Es,
    format: &str,
    ids: impl IntoIterator<Item = u64>,
    count: u64,
    version_of: impl Fn(u64) -> u32,
) {
    let ids: Vec<u64> = ids.into_iter().collect();
    let names: Vec<String> = ids.iter().map(|i| key_id(format, *i)).collect();
    let docs: std::collections::HashMap<String, Value> = es
        .get_many("orders", &names)
        .into_iter()
        .map(|(id, source, _)| (id, source))
        .collect();
    assert_eq!(docs.len(), names.len(), "documents by key");
    for (i, name) in ids.iter().zip(&names) {
        let source = &docs[name];
        let want = expected(format, *i, version_of(*i));
        for (field, value) in want.as_object().unwrap() {
            assert_eq!(&source[field], value, "{format} {name}.{field}: {source}");
        }
        assert_eq!(source, &want, "{format} {name}: no other field");
    }
    assert_eq!(es.count("orders"), count);
}

/// Values and keys written by Confluent's serializer of `format`, indexed by key.
fn indexed_field_by_field(format: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 3)]);
    let registry = RegistryProcess::start_on("127.0.0.1:0");
    confluent::produce(&kafka.bootstrap, &registry.url, "orders", format, 0, 600, 3);
    let es = Es::testkit();
    let config = job(
        tmp.path(),
        &kafka.bootstrap,
        &registry.url,
        &es.url(),
        &format!("bounded = \"latest\"\nformat = \"{format}\"\nkey_format = \"{format}\""),
    );
    let (code, log) = run_config(&config);
    assert_eq!(code, Some(0), "{}", tail(&log, 30));
    assert_documents(&es, format, 0..600, 600, |_| 1);
    // The key's schema and the value's, each fetched once per subtask at most (two
    // subtasks).
    assert!(
        registry.lookups_by_id() <= 2 * 2,
        "{} lookups by id",
        registry.lookups_by_id()
    );
}

#[test]
fn avro_values_and_keys_written_by_confluents_serializer_are_indexed_field_by_field() {
    indexed_field_by_field("avro");
}

#[test]
fn protobuf_values_and_keys_written_by_confluents_serializer_are_indexed_field_by_field() {
    indexed_field_by_field("protobuf");
}

#[test]
fn json_schema_values_and_keys_written_by_confluents_serializer_are_indexed_field_by_field() {
    indexed_field_by_field("json-schema");
}

/// `key_format = "json"`: a key that is a JSON string is its text, as a decoded one
/// is; any other JSON key is its JSON.
#[test]
fn a_json_key_that_is_a_string_is_the_document_id() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 1)]);
    let records: Vec<(i32, Vec<u8>, Vec<u8>)> = [
        (br#""order-1""#.to_vec(), br#"{"n":1}"#.to_vec()),
        (br#"{"a":2}"#.to_vec(), br#"{"n":2}"#.to_vec()),
    ]
    .into_iter()
    .map(|(k, v)| (0, k, v))
    .collect();
    produce_keyed(&kafka.bootstrap, &records);
    let es = Es::testkit();
    let text = format!(
        "[job]\nname = \"json-keys\"\n\n[checkpoint]\ndir = \"checkpoints\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\nkey_format = \"json\"\n\n\
         [sink.elasticsearch]\nurl = \"{}\"\nindex = \"orders\"\nid = \"key\"\n",
        kafka.bootstrap,
        es.url()
    );
    let config = tmp.path().join("job.toml");
    std::fs::write(&config, text).unwrap();
    let (code, log) = run_config(&config);
    assert_eq!(code, Some(0), "{}", tail(&log, 20));
    let docs = es.get_many("orders", &["order-1".into(), r#"{"a":2}"#.into()]);
    assert_eq!(docs.len(), 2, "{docs:?}");
    assert_eq!(es.count("orders"), 2);
}

/// Without a registry, `schema_file` decodes unframed Avro values (and a reader schema
/// gives them a field the writer lacks); `temporal = "iso8601"` writes RFC 3339.
#[test]
fn a_schema_file_decodes_unframed_avro_without_a_registry() {
    use apache_avro::types::Value as Avro;
    let tmp = tempfile::tempdir().unwrap();
    let writer = r#"{"type":"record","name":"Order","fields":[{"name":"id","type":"long"},{"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}}]}"#;
    let reader = r#"{"type":"record","name":"Order","fields":[{"name":"id","type":"long"},{"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}},{"name":"region","type":"string","default":"eu"}]}"#;
    std::fs::write(tmp.path().join("order.avsc"), writer).unwrap();
    std::fs::write(tmp.path().join("order-v2.avsc"), reader).unwrap();
    let schema = apache_avro::Schema::parse_str(writer).unwrap();
    let kafka = KafkaProcess::start(&[("orders", 1)]);
    let records: Vec<(i32, Vec<u8>, Vec<u8>)> = (0..3i64)
        .map(|i| {
            let value = Avro::Record(vec![
                ("id".into(), Avro::Long(i)),
                ("at".into(), Avro::TimestampMillis(1_700_000_000_000 + i)),
            ]);
            let datum = apache_avro::to_avro_datum(&schema, value).unwrap();
            (0, format!("k{i}").into_bytes(), datum)
        })
        .collect();
    produce_keyed(&kafka.bootstrap, &records);
    let es = Es::testkit();
    let text = format!(
        "[job]\nname = \"avro-file\"\n\n[checkpoint]\ndir = \"checkpoints\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\n\
         format = \"avro\"\nschema_file = \"order.avsc\"\nreader_schema_file = \"order-v2.avsc\"\ntemporal = \"iso8601\"\n\n\
         [sink.elasticsearch]\nurl = \"{}\"\nindex = \"orders\"\nid = \"key\"\n",
        kafka.bootstrap,
        es.url()
    );
    let config = tmp.path().join("job.toml");
    std::fs::write(&config, text).unwrap();
    let (code, log) = run_config(&config);
    assert_eq!(code, Some(0), "{}", tail(&log, 20));
    let docs = es.get_many("orders", &["k0".into(), "k2".into()]);
    assert_eq!(
        docs.iter().map(|d| d.1.clone()).collect::<Vec<_>>(),
        vec![
            json!({"id": 0, "at": "2023-11-14T22:13:20.000Z", "region": "eu"}),
            json!({"id": 2, "at": "2023-11-14T22:13:20.002Z", "region": "eu"}),
        ]
    );
    assert_eq!(es.count("orders"), 3);
}

/// A fixed framed value: schema `id`, then `body`.
fn framed(id: u32, body: &[u8]) -> Vec<u8> {
    let mut v = vec![0];
    v.extend_from_slice(&id.to_be_bytes());
    v.extend_from_slice(body);
    v
}

/// The bad inputs of the error table, each after one good record: (payload, what the
/// error must say, the schema id it must name).
fn bad_inputs(good_id: u32) -> Vec<(Vec<u8>, &'static str, Option<u32>)> {
    vec![
        (b"{\"id\":1}".to_vec(), "magic byte 123", None),
        (vec![0, 0, 1], "too short", None),
        (framed(99, b"\x02"), "schema id 99 is unknown", Some(99)),
        (framed(good_id, b"\x02"), "schema id", Some(good_id)),
    ]
}

/// Produces one good record (through the serializers: it registers the schemas) to
/// partition 0 and returns the value schema's id.
fn one_good_record(kafka: &KafkaProcess, registry: &RegistryProcess) -> u32 {
    confluent::produce(&kafka.bootstrap, &registry.url, "orders", "avro", 0, 1, 1);
    let v: Value = reqwest::blocking::get(format!(
        "{}/subjects/orders-value/versions/latest",
        registry.url
    ))
    .unwrap()
    .json()
    .unwrap();
    v["id"].as_u64().unwrap() as u32
}

#[test]
fn each_bad_input_fails_the_job_naming_the_record_and_the_schema_id() {
    for (n, (payload, says, id)) in bad_inputs(2).into_iter().enumerate() {
        let tmp = tempfile::tempdir().unwrap();
        let kafka = KafkaProcess::start(&[("orders", 1)]);
        let registry = RegistryProcess::start_on("127.0.0.1:0");
        let good = one_good_record(&kafka, &registry);
        assert_eq!(good, 2, "the key schema registers first");
        produce_raw(&kafka.bootstrap, "orders", 0, &[&payload]);
        let es = Es::testkit();
        let config = job(
            tmp.path(),
            &kafka.bootstrap,
            &registry.url,
            &es.url(),
            &format!("bounded = \"latest\"\non_decode_error = \"fail\"\n{AVRO}"),
        );
        let (code, log) = run_config(&config);
        assert_ne!(code, Some(0), "case {n}: {}", tail(&log, 20));
        assert!(
            log.contains("record orders/0@1 cannot be decoded") && log.contains(says),
            "case {n} ({says}): {}",
            tail(&log, 20)
        );
        if let Some(id) = id {
            assert!(
                log.contains(&format!("schema id {id}")),
                "case {n}: {}",
                tail(&log, 20)
            );
        }
    }
}

#[test]
fn each_bad_input_is_dead_lettered_with_its_original_bytes_and_schema_id() {
    for (n, (payload, says, id)) in bad_inputs(2).into_iter().enumerate() {
        let tmp = tempfile::tempdir().unwrap();
        let kafka = KafkaProcess::start(&[("orders", 1), ("dlq", 1)]);
        let registry = RegistryProcess::start_on("127.0.0.1:0");
        one_good_record(&kafka, &registry);
        produce_raw(&kafka.bootstrap, "orders", 0, &[&payload]);
        confluent::produce(&kafka.bootstrap, &registry.url, "orders", "avro", 2, 1, 1);
        let es = Es::testkit();
        let config = job(
            tmp.path(),
            &kafka.bootstrap,
            &registry.url,
            &es.url(),
            &format!("bounded = \"latest\"\non_decode_error = \"dead-letter:dlq\"\n{AVRO}"),
        );
        let (code, log) = run_config(&config);
        assert_eq!(code, Some(0), "case {n}: {}", tail(&log, 20));
        let (letter, headers) = first_dead_letter(&kafka.bootstrap, "dlq");
        assert_eq!(letter, payload, "case {n}: the original bytes");
        assert!(
            headers["lockgate.error"].contains(says),
            "case {n}: {headers:?}"
        );
        assert_eq!(headers["lockgate.offset"], "1", "case {n}");
        assert_eq!(
            headers.get("lockgate.schema.id"),
            id.map(|i| i.to_string()).as_ref(),
            "case {n}"
        );
        // The records around it are indexed.
        assert_documents(&es, "avro", [0, 2], 2, |_| 1);
    }
}

/// The registry stops for 10 s while the job needs a schema it has not fetched yet
/// (version 2 of the value schema, first seen after the outage began): the job waits,
/// nothing is skipped or dead-lettered, and the index is exact.
#[test]
fn a_registry_outage_mid_run_skips_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 2), ("dlq", 1)]);
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    // The registry keeps its schemas across its restart, as a registry does in its
    // `_schemas` topic (one that came back empty would answer "unknown" for schemas
    // it is about to learn again, and those records would be dead-lettered).
    let kept = tmp.path().join("schemas.jsonl");
    let mut registry = RegistryProcess::start_kept(&listen, Some(&kept));
    confluent::produce(&kafka.bootstrap, &registry.url, "orders", "avro", 0, 300, 2);
    // Version 2's records, serialized now (registering version 2), produced later.
    let later = tmp.path().join("v2.hex");
    let url = registry.url.clone();
    confluent::script(&[
        "--bootstrap",
        &kafka.bootstrap,
        "--registry",
        &url,
        "--topic",
        "orders",
        "--format",
        "avro",
        "--from",
        "300",
        "--count",
        "300",
        "--schema-version",
        "2",
        "--out",
        later.to_str().unwrap(),
    ]);
    let es = Es::testkit();
    let config = job(
        tmp.path(),
        &kafka.bootstrap,
        &url,
        &es.url(),
        &format!("on_decode_error = \"dead-letter:dlq\"\n{AVRO}"),
    );
    // The outage (10 s, then a restart and registering again, slower on a busy machine)
    // must end within the lookup's retry time: the longest a 60 s checkpoint allows.
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "[source.kafka.schema_registry]\n",
        "[source.kafka.schema_registry]\nretry_timeout_ms = 29000\n",
    );
    std::fs::write(&config, text).unwrap();
    let log_path = tmp.path().join("run.log");
    let mut child = Command::new(bin())
        .args(["run", "--config"])
        .arg(&config)
        .env("LOCKGATE_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    // Waits as long as the job makes progress: documents arrive, or it retries the
    // registry (a slow machine makes both slower).
    let wait_for = |n: u64, what: &str| {
        common::wait::progressing(
            what,
            common::wait::DEADLINE,
            || (es.count("orders"), log().matches("retrying").count()),
            || es.count("orders") >= n,
            &|| tail(&log(), 30),
        );
    };
    wait_for(300, "the first 300 documents");
    registry.kill();
    let outage = Instant::now();
    let records: Vec<(i32, Vec<u8>, Vec<u8>)> = std::fs::read_to_string(&later)
        .unwrap()
        .lines()
        .enumerate()
        .map(|(i, line)| {
            let (k, v) = line.split_once('\t').unwrap();
            (((300 + i) % 2) as i32, hex(k), hex(v))
        })
        .collect();
    produce_keyed(&kafka.bootstrap, &records);
    std::thread::sleep(Duration::from_secs(10).saturating_sub(outage.elapsed()));
    assert_eq!(
        es.count("orders"),
        300,
        "nothing of version 2 without its schema"
    );
    // The registry comes back with its schemas.
    let _registry = RegistryProcess::start_kept(&listen, Some(&kept));
    wait_for(600, "the 300 documents of version 2");
    common::signal(&child, libc::SIGTERM);
    let status = wait_timeout(&mut child, Duration::from_secs(60));
    assert!(status.success(), "{}", tail(&log(), 30));
    assert_documents(&es, "avro", 0..600, 600, |i| if i < 300 { 1 } else { 2 });
    let text = log();
    assert!(
        text.contains("the Schema Registry did not answer; retrying"),
        "{}",
        tail(&text, 30)
    );
    assert!(!text.contains("skipping"), "{}", tail(&text, 30));
    assert_eq!(
        common::kafka::watermarks(&kafka.bootstrap, "dlq", 0)
            .unwrap()
            .1,
        0,
        "no dead letter"
    );
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Produces `(partition, key, value)` records to `orders`, in order.
fn produce_keyed(bootstrap: &str, records: &[(i32, Vec<u8>, Vec<u8>)]) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let p: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    for (partition, key, value) in records {
        p.send(
            BaseRecord::to("orders")
                .partition(*partition)
                .key(key)
                .payload(value),
        )
        .unwrap();
    }
    p.flush(Duration::from_secs(30)).unwrap();
}

/// `lockgate chaos` with 20 kills over an Avro topic: the verifier decodes the topic
/// through the job's own format and finds every record indexed once, with its total.
#[test]
fn twenty_kills_over_an_avro_topic_are_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 8)]);
    let registry = RegistryProcess::start_on("127.0.0.1:0");
    confluent::produce(
        &kafka.bootstrap,
        &registry.url,
        "orders",
        "avro",
        0,
        100_000,
        8,
    );
    let es = Es::testkit();
    let text = format!(
        "[job]\nname = \"avro-chaos\"\nparallelism = 2\n\n[checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 200\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\n\
         format = \"avro\"\nkey_format = \"avro\"\n\n\
         [source.kafka.schema_registry]\nurl = \"{}\"\n\n\
         [[transform]]\ntype = \"rolling_sum\"\nkey = \"/user\"\nfield = \"/id\"\noutput = \"/total\"\n\n\
         [sink.elasticsearch]\nurl = \"{}\"\nindex = \"orders\"\nid = \"coordinates\"\n\
         bulk_flush_interval_ms = 100\nretry_initial_ms = 20\nretry_max_ms = 500\nretry_max_attempts = 1000\n",
        kafka.bootstrap,
        registry.url,
        es.url()
    );
    let config = tmp.path().join("job.toml");
    std::fs::write(&config, text).unwrap();
    // Each subtask owns about 50 fetched batches; runs of at most 600 ms throttled to
    // a batch per 300 ms read at most 40 of them before the 20th kill.
    let (code, out, r) = common::chaos(
        &config,
        &[
            "--kills",
            "20",
            "--seed",
            "27",
            "--failpoints",
            "source-batch=sleep(300)",
            "--failpoint-runs",
            "20",
            "--kill-after-ms",
            "300..600",
        ],
    );
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(r["kills"], 20, "{out}");
    assert_eq!(r["verdict"]["inputs"], 100_000, "{out}");
    for k in ["missing", "duplicated", "wrong"] {
        assert_eq!(r["verdict"][k], 0, "{k}: {out}");
    }
    // The verifier compared decoded values: a document holds the Avro record's fields.
    let any = es.get_many("orders", &["orders-0-0".into()]);
    assert_eq!(any[0].1["address"]["city"], "Lyon", "{:?}", any);
}
