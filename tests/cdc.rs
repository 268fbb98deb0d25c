//! Change data capture end to end: a table's changes (snapshot reads, inserts,
//! updates, deletes, each delete followed by Debezium's tombstone) as Debezium writes
//! them, in JSON without the schema envelope, in JSON with it (decimals as Connect's
//! base64 `Decimal`), and in Avro through the Schema Registry (Confluent's own
//! serializer), run through `debezium` into Elasticsearch with `id = "field:/id"`.
//! Afterwards the index is the table's final state, row for row; and so under
//! `lockgate chaos` with 20 kills.

mod common;

use common::confluent::{self, RegistryProcess};
use common::es::Es;
use common::kafka::KafkaProcess;
use common::{run_config, tail};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const TOPIC: &str = "dbserver1.inventory.products";
const PARTITIONS: i64 = 3;

/// A row of the `products` table; the price in cents (a DECIMAL(10,2)).
#[derive(Debug, Clone, PartialEq)]
struct Row {
    id: i64,
    name: String,
    cents: i64,
    note: Option<String>,
}

/// One message of the change topic: a change event, or a tombstone.
#[derive(Debug, Clone)]
struct Change {
    id: i64,
    op: &'static str,
    before: Option<Row>,
    after: Option<Row>,
}

impl Change {
    fn tombstone(&self) -> bool {
        self.op == "tombstone"
    }
}

/// A snapshot of half the rows, then `steps` random changes (deterministic in `seed`),
/// and the table's final state.
fn history(rows: i64, steps: usize, seed: u64) -> (Vec<Change>, BTreeMap<i64, Row>) {
    let mut state = seed;
    let mut next = move |n: u64| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % n
    };
    let mut table: BTreeMap<i64, Row> = BTreeMap::new();
    let mut out = Vec::new();
    let row = |id: i64, version: u64| Row {
        id,
        name: format!("product-{id}-v{version}"),
        // Negative, whole and fractional prices alike.
        cents: (id * 7919 + version as i64 * 131) % 100_000 - 500,
        note: version.is_multiple_of(3).then(|| format!("note {version}")),
    };
    for id in 0..rows / 2 {
        let r = row(id, 0);
        table.insert(id, r.clone());
        out.push(Change {
            id,
            op: "r",
            before: None,
            after: Some(r),
        });
    }
    for step in 0..steps {
        let id = next(rows as u64) as i64;
        match table.get(&id).cloned() {
            None => {
                let r = row(id, step as u64);
                table.insert(id, r.clone());
                out.push(Change {
                    id,
                    op: "c",
                    before: None,
                    after: Some(r),
                });
            }
            Some(old) if next(10) < 7 => {
                let r = row(id, step as u64);
                table.insert(id, r.clone());
                out.push(Change {
                    id,
                    op: "u",
                    before: Some(old),
                    after: Some(r),
                });
            }
            Some(old) => {
                table.remove(&id);
                // Some deletes carry no before image: the key names the row.
                let before = (next(4) != 0).then_some(old);
                out.push(Change {
                    id,
                    op: "d",
                    before,
                    after: None,
                });
                out.push(Change {
                    id,
                    op: "tombstone",
                    before: None,
                    after: None,
                });
            }
        }
    }
    (out, table)
}

fn price_text(cents: i64) -> String {
    let sign = if cents < 0 { "-" } else { "" };
    format!("{sign}{}.{:02}", cents.abs() / 100, cents.abs() % 100)
}

/// The document a row becomes: its columns, the price a number.
fn document(r: &Row) -> Value {
    let price: Value = serde_json::from_str(&price_text(r.cents)).unwrap();
    json!({"id": r.id, "name": r.name, "price": price, "note": r.note})
}

/// The unscaled price as Connect's `Decimal` writes it: big-endian two's complement,
/// as few bytes as keep the sign, in base64.
fn decimal_base64(cents: i64) -> String {
    use base64::Engine;
    let bytes = cents.to_be_bytes();
    let mut start = 0;
    while start < 7 {
        let (b, next) = (bytes[start], bytes[start + 1]);
        if (b == 0 && next & 0x80 == 0) || (b == 0xff && next & 0x80 != 0) {
            start += 1;
        } else {
            break;
        }
    }
    base64::engine::general_purpose::STANDARD.encode(&bytes[start..])
}

fn source() -> Value {
    json!({"connector": "postgresql", "table": "products", "lsn": 1234, "ts_ms": 1_700_000_000_000i64})
}

/// The event's payload, with rows written by `row`.
fn payload(c: &Change, row: impl Fn(&Row) -> Value) -> Value {
    json!({"before": c.before.as_ref().map(&row), "after": c.after.as_ref().map(&row),
           "source": source(), "op": c.op, "ts_ms": 1_700_000_000_500i64})
}

/// Debezium's JsonConverter without schemas (`decimal.handling.mode = double`).
fn plain_json(c: &Change) -> Message {
    let key = json!({"id": c.id}).to_string().into_bytes();
    let value = (!c.tombstone()).then(|| payload(c, document).to_string().into_bytes());
    (key, value)
}

/// Debezium's JsonConverter with schemas: the envelope, decimals as Connect's
/// `Decimal`.
fn enveloped_json(c: &Change) -> Message {
    let row_schema = json!({"type": "struct", "optional": true, "name": "dbserver1.inventory.products.Value", "fields": [
        {"field": "id", "type": "int64", "optional": false},
        {"field": "name", "type": "string", "optional": false},
        {"field": "price", "type": "bytes", "optional": false, "name": "org.apache.kafka.connect.data.Decimal",
         "version": 1, "parameters": {"scale": "2", "connect.decimal.precision": "10"}},
        {"field": "note", "type": "string", "optional": true}
    ]});
    let schema = json!({"type": "struct", "optional": false, "name": "dbserver1.inventory.products.Envelope", "fields": [
        as_field(&row_schema, "before"), as_field(&row_schema, "after"),
        {"field": "source", "type": "struct", "optional": false, "fields": [
            {"field": "connector", "type": "string"}, {"field": "table", "type": "string"},
            {"field": "lsn", "type": "int64", "optional": true}, {"field": "ts_ms", "type": "int64"}]},
        {"field": "op", "type": "string", "optional": false},
        {"field": "ts_ms", "type": "int64", "optional": true}
    ]});
    let row = |r: &Row| json!({"id": r.id, "name": r.name, "price": decimal_base64(r.cents), "note": r.note});
    let key = json!({"schema": {"type": "struct", "optional": false, "fields": [{"field": "id", "type": "int64"}]},
                     "payload": {"id": c.id}});
    let value = (!c.tombstone()).then(|| json!({"schema": schema, "payload": payload(c, row)}));
    (
        key.to_string().into_bytes(),
        value.map(|v| v.to_string().into_bytes()),
    )
}

fn as_field(schema: &Value, field: &str) -> Value {
    let mut s = schema.clone();
    s["field"] = json!(field);
    s
}

/// Produces the changes, each to the partition of its id.
/// A message's key and value (`None`: a tombstone).
type Message = (Vec<u8>, Option<Vec<u8>>);

fn produce(bootstrap: &str, changes: &[Change], encode: fn(&Change) -> Message) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .create()
        .unwrap();
    for c in changes {
        let (key, value) = encode(c);
        let mut r = BaseRecord::<[u8], [u8]>::to(TOPIC)
            .partition((c.id % PARTITIONS) as i32)
            .key(&key[..]);
        if let Some(v) = &value {
            r = r.payload(&v[..]);
        }
        loop {
            match producer.send(r) {
                Ok(()) => break,
                Err((_, back)) => {
                    producer.poll(std::time::Duration::from_millis(50));
                    r = back;
                }
            }
        }
    }
    producer.flush(std::time::Duration::from_secs(60)).unwrap();
}

/// Produces the changes as Debezium's Avro, with Confluent's serializer.
fn produce_avro(dir: &Path, bootstrap: &str, registry: &str, changes: &[Change]) {
    let file = dir.join("changes.jsonl");
    let row =
        |r: &Row| json!({"id": r.id, "name": r.name, "price": price_text(r.cents), "note": r.note});
    let lines: Vec<String> = changes
        .iter()
        .map(|c| {
            let value = (!c.tombstone()).then(|| payload(c, row));
            json!({"partition": c.id % PARTITIONS, "key": {"id": c.id}, "value": value}).to_string()
        })
        .collect();
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let printed = confluent::script(&[
        "--bootstrap",
        bootstrap,
        "--registry",
        registry,
        "--topic",
        TOPIC,
        "--format",
        "avro",
        "--changes",
        file.to_str().unwrap(),
    ]);
    assert_eq!(printed, changes.len().to_string());
}

fn job(dir: &Path, bootstrap: &str, es: &str, source_extra: &str) -> PathBuf {
    let text = format!(
        "[job]\nname = \"cdc\"\nparallelism = 2\n\n[checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 200\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"{TOPIC}\"]\nbounded = \"latest\"\n{source_extra}\n\n\
         [[transform]]\ntype = \"debezium\"\n\n\
         [sink.elasticsearch]\nurl = \"{es}\"\nindex = \"products\"\nid = \"field:/id\"\n\
         bulk_flush_interval_ms = 100\nretry_initial_ms = 20\nretry_max_ms = 500\nretry_max_attempts = 1000\n"
    );
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join("job.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// The index holds exactly the table's rows.
fn assert_table(es: &Es, rows: i64, table: &BTreeMap<i64, Row>) {
    let ids: Vec<String> = (0..rows).map(|i| i.to_string()).collect();
    let docs = es.get_many("products", &ids);
    let found: Vec<i64> = docs.iter().map(|(id, _, _)| id.parse().unwrap()).collect();
    let want: Vec<i64> = table.keys().copied().collect();
    assert_eq!(found, want, "the rows present");
    for (id, doc, _) in &docs {
        let r = &table[&id.parse::<i64>().unwrap()];
        assert_eq!(*doc, document(r), "row {id}");
    }
    assert_eq!(
        es.count("products"),
        table.len() as u64,
        "no other documents"
    );
}

const ROWS: i64 = 300;

fn cdc(variant: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[(TOPIC, PARTITIONS as i32)]);
    let (changes, table) = history(ROWS, 2_000, 42);
    assert!(
        changes.iter().any(|c| c.op == "d" && c.before.is_none())
            && changes.iter().any(|c| c.op == "d" && c.before.is_some())
            && changes.iter().any(|c| c.op == "u"),
        "the history updates, and deletes with and without a before image"
    );
    let es = Es::testkit();
    let _registry;
    let extra = match variant {
        "json" => {
            produce(&kafka.bootstrap, &changes, plain_json);
            String::new()
        }
        "json-envelope" => {
            produce(&kafka.bootstrap, &changes, enveloped_json);
            "connect_envelope = true".to_string()
        }
        "avro" => {
            let registry = RegistryProcess::start_on("127.0.0.1:0");
            produce_avro(tmp.path(), &kafka.bootstrap, &registry.url, &changes);
            let extra = format!(
                "format = \"avro\"\nkey_format = \"avro\"\n[source.kafka.schema_registry]\nurl = \"{}\"",
                registry.url
            );
            _registry = registry;
            extra
        }
        other => unreachable!("{other}"),
    };
    let config = job(tmp.path(), &kafka.bootstrap, &es.url(), &extra);
    let (code, log) = run_config(&config);
    assert_eq!(code, Some(0), "{}", tail(&log, 30));
    assert_table(&es, ROWS, &table);
}

#[test]
fn debezium_json_changes_leave_the_tables_final_state() {
    cdc("json");
}

#[test]
fn debezium_json_changes_in_the_schema_envelope_leave_the_tables_final_state() {
    cdc("json-envelope");
}

#[test]
fn debezium_avro_changes_leave_the_tables_final_state() {
    cdc("avro");
}

#[test]
fn debezium_changes_under_chaos_leave_the_tables_final_state() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[(TOPIC, PARTITIONS as i32)]);
    // About 36,000 messages of some 300 bytes: within the 5 MiB that the embedded
    // cluster keeps of a partition (a larger history would lose its oldest changes to
    // retention, as a real topic would).
    let rows = 3_000;
    let (changes, table) = history(rows, 30_000, 7);
    produce(&kafka.bootstrap, &changes, plain_json);
    let es = Es::testkit();
    let config = job(tmp.path(), &kafka.bootstrap, &es.url(), "");
    let (code, out, r) = common::chaos(
        &config,
        &[
            "--kills",
            "20",
            "--seed",
            "3",
            // The subtask with two partitions owns about 24,000 messages, 24 batches
            // of 1,024: 20 runs of at most 500 ms, throttled to a batch per 300 ms,
            // read at most 20 of them, so the job cannot finish before its 20th kill.
            // The run after the last kill is not throttled.
            "--failpoints",
            "source-batch=sleep(300)",
            "--failpoint-runs",
            "20",
            "--kill-after-ms",
            "200..500",
        ],
    );
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(r["kills"], 20, "{out}");
    for k in ["missing", "duplicated", "wrong"] {
        assert_eq!(r["verdict"][k], 0, "{k}: {out}");
    }
    // Every change was read: all but the tombstones, which debezium drops, reached
    // the sink.
    let events = changes.iter().filter(|c| !c.tombstone()).count();
    assert_eq!(r["verdict"]["inputs"], events as u64, "{out}");
    assert_eq!(
        r["verdict"]["expected_documents"],
        table.len() as u64,
        "{out}"
    );
    // The verifier's expectation is the table, independently.
    assert_table(&es, rows, &table);
}

#[test]
fn debezium_changes_into_a_kafka_topic_are_rows_and_tombstones() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[(TOPIC, PARTITIONS as i32), ("products", 2)]);
    let (changes, table) = history(ROWS, 2_000, 5);
    produce(&kafka.bootstrap, &changes, plain_json);
    let text = format!(
        "[job]\nname = \"cdc-topic\"\nparallelism = 2\n\n[checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 200\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{}\"\ntopics = [\"{TOPIC}\"]\nbounded = \"latest\"\n\n\
         [[transform]]\ntype = \"debezium\"\n\n\
         [sink.kafka]\ntopic = \"products\"\nkey = \"/id\"\n",
        kafka.bootstrap
    );
    let config = tmp.path().join("job.toml");
    std::fs::write(&config, text).unwrap();
    let (code, log) = run_config(&config);
    assert_eq!(code, Some(0), "{}", tail(&log, 30));
    // What a compacted topic would keep: the last message of each key.
    let c: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &kafka.bootstrap)
        .set("group.id", "reader")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "true")
        .create()
        .unwrap();
    c.subscribe(&["products"]).unwrap();
    let mut last: BTreeMap<i64, Option<Value>> = BTreeMap::new();
    let (mut eof, start) = (0, std::time::Instant::now());
    while eof < 2 {
        assert!(start.elapsed() < common::wait::DEADLINE, "reading products");
        match c.poll(std::time::Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let key: i64 = std::str::from_utf8(m.key().unwrap())
                    .unwrap()
                    .parse()
                    .unwrap();
                let value = m.payload().map(|p| serde_json::from_slice(p).unwrap());
                last.insert(key, value);
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => eof += 1,
            Some(Err(e)) => panic!("{e}"),
            None => {}
        }
    }
    let deleted = changes.iter().filter(|c| c.op == "d").count();
    assert!(deleted > 0);
    for (id, value) in &last {
        match (table.get(id), value) {
            (Some(row), Some(v)) => assert_eq!(*v, document(row), "row {id}"),
            (None, None) => {} // deleted: its last message is a tombstone
            (row, v) => panic!("row {id}: the table has {row:?}, the topic's last message {v:?}"),
        }
    }
    assert_eq!(
        last.values().filter(|v| v.is_some()).count(),
        table.len(),
        "every row of the table, as its key's last message"
    );
    // The harness does not apply an upstream stage's transforms: it says so instead of
    // verifying against untransformed inputs.
    let downstream = tmp.path().join("down.toml");
    std::fs::write(
        &downstream,
        format!(
            "[job]\nname = \"rows\"\n[checkpoint]\ndir = \"down\"\n\
             [source.kafka]\nbootstrap_servers = \"{}\"\ntopics = [\"products\"]\norigin_headers = true\n\
             [sink.elasticsearch]\nurl = \"http://127.0.0.1:9\"\nindex = \"rows\"\nid = \"field:/id\"\n",
            kafka.bootstrap
        ),
    )
    .unwrap();
    let up = lockgate::chaos::Target::from_job_file(&config).unwrap();
    let down = lockgate::chaos::Target::from_job_file(&downstream).unwrap();
    let e = down.through(&up).unwrap_err();
    assert!(e.contains("transforms its records (debezium)"), "{e}");
}
