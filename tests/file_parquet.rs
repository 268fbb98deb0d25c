//! The file sink's Parquet format, read back by pyarrow (an independent reader): Avro's
//! types as Parquet's logical types with exact values, the compression asked for, and
//! a record the schema does not describe failing the job by name. Exactly-once under
//! crashes, restores and rescales is the conformance suite's (`tests/conformance.rs`,
//! `parquet_file_sink`).

mod common;

use lockgate::connector::{Sink, SinkRestore, SubtaskInfo};
use lockgate::connectors::file_sink::{FileSection, FileSink, FileWriter};
use lockgate::record::{Batch, Record};
use lockgate_state::CheckpointId;
use serde_json::{json, Value};
use std::path::Path;

const ORDER: &str = r#"{"type":"record","name":"order","fields":[
    {"name":"id","type":"long"},
    {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":12,"scale":2}},
    {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}},
    {"name":"day","type":{"type":"int","logicalType":"date"}},
    {"name":"note","type":["null","string"],"default":null},
    {"name":"kind","type":{"type":"enum","name":"kind","symbols":["retail","wholesale"]}},
    {"name":"tags","type":{"type":"array","items":"string"}},
    {"name":"qty","type":{"type":"map","values":"int"}},
    {"name":"ship","type":{"type":"record","name":"ship","fields":[
        {"name":"city","type":"string"},
        {"name":"weight","type":"double"}]}},
    {"name":"hash","type":{"type":"fixed","name":"h4","size":4}}
]}"#;

fn section(dir: &Path, extra: &str) -> FileSection {
    std::fs::write(dir.join("order.avsc"), ORDER).unwrap();
    toml::from_str(&format!(
        "dir = \"out\"\nformat = \"parquet\"\nschema_file = \"order.avsc\"\n{extra}"
    ))
    .unwrap()
}

fn sink(dir: &Path, extra: &str) -> FileSink {
    let cfg = section(dir, extra).config(&|p| dir.join(p)).unwrap();
    FileSink::new(FileWriter::new(cfg))
}

fn batch(values: &[Value]) -> Batch {
    values
        .iter()
        .map(|v| Record::from_value(serde_json::to_vec(v).unwrap()))
        .collect()
}

fn fresh() -> SinkRestore {
    SinkRestore {
        checkpoint: None,
        states: vec![],
        parallelism: 1,
    }
}

fn order(id: i64, amount: Value, at: Value) -> Value {
    json!({
        "id": id, "amount": amount, "at": at, "day": "2024-05-01", "note": null,
        "kind": "retail", "tags": ["a", "b"], "qty": {"x": 2},
        "ship": {"city": "Lyon", "weight": 1.5}, "hash": "3q2+7w=="
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn avro_types_reach_parquet_as_its_logical_types_with_exact_values() {
    let tmp = tempfile::tempdir().unwrap();
    let mut s = sink(tmp.path(), "compression = \"zstd\"");
    s.open(&SubtaskInfo::new("job", "sink-0", 0, 1), &fresh())
        .await
        .unwrap();
    s.invoke(batch(&[
        order(1, json!(12.34), json!("2024-05-01T12:00:00Z")),
        order(2, json!("99999999.99"), json!(1714564800123_i64)),
    ]))
    .await
    .unwrap();
    s.snapshot(CheckpointId(1)).await.unwrap();
    let out = tmp.path().join("out");
    assert!(
        common::lake::rows(&out).unwrap().is_empty(),
        "nothing is visible before the checkpoint completes"
    );
    s.notify_checkpoint_complete(CheckpointId(1)).await.unwrap();

    let rows = common::lake::rows(&out).unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0]["file"], "part-0-1.parquet");
    let r = &rows[0]["row"];
    assert_eq!(r["id"], 1);
    assert_eq!(r["amount"], "12.34", "a decimal keeps its digits");
    assert_eq!(r["at"], "2024-05-01T12:00:00+00:00");
    assert_eq!(r["day"], "2024-05-01");
    assert_eq!(r["note"], Value::Null);
    assert_eq!(r["kind"], "retail");
    assert_eq!(r["tags"], json!(["a", "b"]));
    assert_eq!(r["qty"], json!([["x", 2]]));
    assert_eq!(r["ship"], json!({"city": "Lyon", "weight": 1.5}));
    assert_eq!(r["hash"], "deadbeef");
    let r = &rows[1]["row"];
    assert_eq!(r["amount"], "99999999.99");
    assert_eq!(r["at"], "2024-05-01T12:00:00.123000+00:00");

    let schemas = common::lake::schemas(&out).unwrap();
    let s0 = &schemas[0];
    assert_eq!(s0["compression"], "ZSTD");
    let ty = |name: &str| {
        s0["schema"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {s0}"))
            .clone()
    };
    assert_eq!(ty("amount")["type"], "decimal128(12, 2)");
    assert_eq!(ty("at")["type"], "timestamp[ms, tz=+00:00]");
    assert_eq!(ty("day")["type"], "date32[day]");
    assert_eq!(ty("note")["nullable"], true);
    assert_eq!(ty("id")["nullable"], false);
    assert_eq!(ty("hash")["type"], "fixed_size_binary[4]");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_record_the_schema_does_not_describe_fails_the_job_naming_its_field() {
    let tmp = tempfile::tempdir().unwrap();
    let mut s = sink(tmp.path(), "");
    s.open(&SubtaskInfo::new("job", "sink-0", 0, 1), &fresh())
        .await
        .unwrap();
    let mut wrong = order(2, json!(1), json!(0));
    wrong["ship"]["weight"] = json!("heavy");
    let err = s
        .invoke(batch(&[order(1, json!(1), json!(0)), wrong]))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("weight"), "{err}");
    assert!(err.contains("file sink"), "{err}");
}

#[test]
fn a_job_writes_parquet_that_pyarrow_reads_whole() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("seq.avsc"),
        r#"{"type":"record","name":"s","fields":[{"name":"seq","type":"long"},{"name":"key","type":"long"},{"name":"value","type":"long"}]}"#,
    )
    .unwrap();
    let job = tmp.path().join("job.toml");
    std::fs::write(
        &job,
        "[job]\nname = \"parquet\"\nparallelism = 2\n\n[checkpoint]\ndir = \"chk\"\ninterval_ms = 200\n\n[source.sequence]\nfrom = 1\nto = 20000\nkeys = 10\nrate_per_sec = 20000\n\n[sink.file]\ndir = \"out\"\nformat = \"parquet\"\nschema_file = \"seq.avsc\"\ncompression = \"gzip\"\n",
    )
    .unwrap();
    let status = std::process::Command::new(common::bin())
        .args(["run", "--config"])
        .arg(&job)
        .status()
        .unwrap();
    assert!(status.success());
    let rows = common::lake::rows(&tmp.path().join("out")).unwrap();
    let mut seqs: Vec<i64> = rows
        .iter()
        .map(|r| {
            let row = &r["row"];
            assert_eq!(row["value"], row["seq"]);
            assert_eq!(
                row["key"].as_i64().unwrap(),
                row["seq"].as_i64().unwrap() % 10
            );
            row["seq"].as_i64().unwrap()
        })
        .collect();
    seqs.sort();
    assert_eq!(seqs, (1..=20000).collect::<Vec<_>>(), "every record once");
    for s in common::lake::schemas(&tmp.path().join("out")).unwrap() {
        assert_eq!(s["compression"], "GZIP", "{s}");
    }
}

#[test]
fn the_example_job_writes_every_running_total_once() {
    let tmp = tempfile::tempdir().unwrap();
    let example =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/jobs/sequence-to-parquet.toml");
    let status = std::process::Command::new(common::bin())
        .args(["run", "--config"])
        .arg(&example)
        .env("LOCKGATE_DATA", tmp.path())
        .status()
        .unwrap();
    assert!(status.success());
    let out = tmp.path().join("sequence-to-parquet/out");
    let records = common::lake::rows(&out)
        .unwrap()
        .into_iter()
        .map(|r| (r["file"].to_string(), r["row"].to_string()));
    let v =
        lockgate::testkit::file_output::verify_records(records, 1, 200_000, 1000, Some("/total"));
    assert!(v.is_exact(), "{v:?}");
    assert_eq!(v.committed, 200_000);
}

/// A Kafka topic of unframed Avro values (the ORDER schema, every kind of field) into
/// Parquet files that take their columns from the source's own schema (no
/// `schema_file` in `[sink.file]`), in folders by a year read from a field: every value
/// exact in pyarrow's reading, and the records whose field is not a time are
/// dead-lettered to a topic of the source's cluster, while their batches' other
/// records are written.
#[test]
fn an_avro_topic_becomes_parquet_by_its_own_schema_with_refused_records_dead_lettered() {
    use apache_avro::types::Value as Avro;
    use common::kafka::{produce_raw, watermarks, KafkaProcess};
    let kafka = KafkaProcess::start(&[("orders", 2), ("bad-orders", 1)]);
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("order.avsc"), ORDER).unwrap();
    let schema = apache_avro::Schema::parse_str(ORDER).unwrap();
    const N: usize = 400;
    // Every tenth note is not a time: its record has no folder.
    let note = |i: usize| match i % 10 {
        0 => Some("soon".to_string()),
        1 => None,
        _ => Some(format!("{}-05-01", 2020 + i % 3)),
    };
    let payloads: Vec<Vec<u8>> = (0..N)
        .map(|i| {
            let record = Avro::Record(vec![
                ("id".into(), Avro::Long(i as i64)),
                (
                    "amount".into(),
                    Avro::Decimal(apache_avro::Decimal::from(
                        (1_000_000_007i64 + i as i64).to_be_bytes().to_vec(),
                    )),
                ),
                ("at".into(), Avro::TimestampMillis(1_714_564_800_123)),
                ("day".into(), Avro::Date(19_844)),
                (
                    "note".into(),
                    match note(i) {
                        Some(n) => Avro::Union(1, Box::new(Avro::String(n))),
                        None => Avro::Union(0, Box::new(Avro::Null)),
                    },
                ),
                ("kind".into(), Avro::Enum(1, "wholesale".into())),
                (
                    "tags".into(),
                    Avro::Array(vec![Avro::String("a".into()), Avro::String("b".into())]),
                ),
                (
                    "qty".into(),
                    Avro::Map([("x".to_string(), Avro::Int(3))].into_iter().collect()),
                ),
                (
                    "ship".into(),
                    Avro::Record(vec![
                        ("city".into(), Avro::String("Zürich".into())),
                        ("weight".into(), Avro::Double(0.1)),
                    ]),
                ),
                ("hash".into(), Avro::Fixed(4, vec![0xde, 0xad, 0xbe, 0xef])),
            ]);
            apache_avro::to_avro_datum(&schema, record).unwrap()
        })
        .collect();
    for (p, half) in payloads.chunks(N / 2).enumerate() {
        let refs: Vec<&[u8]> = half.iter().map(Vec::as_slice).collect();
        produce_raw(&kafka.bootstrap, "orders", p as i32, &refs);
    }
    let job = tmp.path().join("job.toml");
    std::fs::write(
        &job,
        format!(
            "[job]\nname = \"avro-parquet\"\nparallelism = 2\n\n[checkpoint]\ndir = \"chk\"\ninterval_ms = 200\n\n\
             [source.kafka]\nbootstrap_servers = \"{}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\nformat = \"avro\"\nschema_file = \"order.avsc\"\n\n\
             [sink.file]\ndir = \"out\"\nformat = \"parquet\"\npartition_by = \"y={{/note:%Y}}\"\non_item_error = \"dead-letter:bad-orders\"\n",
            kafka.bootstrap
        ),
    )
    .unwrap();
    let out = std::process::Command::new(common::bin())
        .args(["run", "--config"])
        .arg(&job)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        common::tail(&String::from_utf8_lossy(&out.stderr), 30)
    );
    let rows = common::lake::rows(&tmp.path().join("out")).unwrap();
    let mut ids: Vec<i64> = Vec::new();
    for r in &rows {
        let (file, row) = (r["file"].as_str().unwrap(), &r["row"]);
        let i = row["id"].as_i64().unwrap() as usize;
        ids.push(i as i64);
        let folder = match note(i) {
            Some(n) => format!("y={}/", &n[..4]),
            None => "y=__HIVE_DEFAULT_PARTITION__/".to_string(),
        };
        assert!(file.starts_with(&folder), "{file} holds record {i}");
        assert_eq!(
            row["amount"],
            json!(format!(
                "{}.{:02}",
                (1_000_000_007 + i) / 100,
                (1_000_000_007 + i) % 100
            )),
            "a decimal keeps its digits"
        );
        assert_eq!(row["at"], json!("2024-05-01T12:00:00.123000+00:00"));
        assert_eq!(row["day"], json!("2024-05-01"));
        assert_eq!(row["kind"], json!("wholesale"));
        assert_eq!(row["tags"], json!(["a", "b"]));
        assert_eq!(row["qty"], json!([["x", 3]]));
        assert_eq!(row["ship"], json!({"city": "Zürich", "weight": 0.1}));
        assert_eq!(row["hash"], json!("deadbeef"));
    }
    ids.sort();
    let expected: Vec<i64> = (0..N as i64).filter(|i| i % 10 != 0).collect();
    assert_eq!(ids, expected, "every record with a folder, once");
    let (low, high) = watermarks(&kafka.bootstrap, "bad-orders", 0).unwrap();
    assert_eq!(
        high - low,
        (N / 10) as i64,
        "each refused record dead-lettered once"
    );
}
