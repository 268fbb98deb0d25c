//! A number keeps its text from the source through a chain of transforms into every
//! sink: a 38-digit decimal, `1.50` and `-0.000000000000000000001`, read back by each
//! sink's own client (the file's bytes, Elasticsearch's `_source` text, `psql`, a
//! Kafka consumer), never rounded through a double.

mod common;

use common::es::Es;
use common::kafka::{produce_raw, KafkaProcess};
use common::{run_config, tail};
use lockgate::testkit::postgres::{PgOptions, PgServer};
use std::path::{Path, PathBuf};

const BIG: &str = "12345678901234567890123456789012345678";
const SCALED: &str = "1.50";
const TINY: &str = "-0.000000000000000000001";
const RECORDS: usize = 20;

/// Transforms that pass the numbers on (and a jq program that rebuilds the record).
const CHAIN: &str = r#"
[[transform]]
type = "insert_field"
offset_field = "offset"

[[transform]]
type = "replace_field"
rename = { cost = "price" }

[[transform]]
type = "jq"
filter = "{id, big, price, tiny, offset, nested: {big, price, tiny}}"
max_outputs = 1
"#;

fn input(i: usize) -> Vec<u8> {
    format!(r#"{{"id":"o-{i}","big":{BIG},"cost":{SCALED},"tiny":{TINY}}}"#).into_bytes()
}

fn job(dir: &Path, name: &str, bootstrap: &str, sink: &str) -> PathBuf {
    let text = format!(
        "[job]\nname = \"{name}\"\nparallelism = 1\n\n[checkpoint]\ndir = \"checkpoints-{name}\"\ninterval_ms = 200\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\n\
         {CHAIN}\n{sink}\n"
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

fn run(config: &Path) {
    let (code, log) = run_config(config);
    assert_eq!(code, Some(0), "{}", tail(&log, 30));
}

/// Asserts that the JSON object `text` (a document, or Elasticsearch's answer holding
/// it as `_source`) holds each number exactly as written, at the top level and nested.
fn assert_exact(what: &str, text: &str) {
    let v: serde_json::Value = serde_json::from_str(text).unwrap();
    let doc = v.get("_source").unwrap_or(&v);
    for at in ["", "/nested"] {
        for (field, n) in [("big", BIG), ("price", SCALED), ("tiny", TINY)] {
            let got = doc.pointer(&format!("{at}/{field}")).map(|x| x.to_string());
            assert_eq!(got.as_deref(), Some(n), "{what}: {at}/{field} in {text}");
        }
    }
}

#[test]
fn numbers_keep_their_text_into_every_sink() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 1), ("out", 1)]);
    let inputs: Vec<Vec<u8>> = (0..RECORDS).map(input).collect();
    let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    produce_raw(&kafka.bootstrap, "orders", 0, &refs);

    // Files: the committed lines as bytes.
    run(&job(
        tmp.path(),
        "to-files",
        &kafka.bootstrap,
        "[sink.file]\ndir = \"out\"\n",
    ));
    let lines = common::committed_lines_in(&tmp.path().join("out"));
    for line in &lines {
        assert_exact("file sink", line);
    }
    assert_eq!(lines.len(), RECORDS);

    // Elasticsearch: the documents' _source as the server returns it, as text.
    for (server, start) in Es::each() {
        let es = start();
        // A 38-digit integer is beyond a dynamically mapped `long`: a `double` field
        // indexes it (and `_source` keeps what was sent).
        let double = serde_json::json!({"type": "double"});
        let mapping = serde_json::json!({"mappings": {"properties": {
            "big": double, "nested": {"properties": {"big": double}}}}});
        let (status, body) = es.call("PUT", "/orders", Some(&mapping.to_string()));
        assert_eq!(status, 200, "{server}: {body}");
        run(&job(
            tmp.path(),
            &format!("to-es-{server}"),
            &kafka.bootstrap,
            &format!(
                "[sink.elasticsearch]\nurl = \"{}\"\nindex = \"orders\"\nid = \"field:/id\"\nbulk_flush_interval_ms = 100\n",
                es.url()
            ),
        ));
        for i in 0..RECORDS {
            let body = reqwest::blocking::get(format!("{}/orders/_doc/o-{i}", es.url()))
                .unwrap()
                .text()
                .unwrap();
            assert_exact(&format!("{server}: document o-{i}"), &body);
        }
    }

    // PostgreSQL: numeric columns without a scale keep every digit; read with psql.
    let pg = PgServer::start(PgOptions::default()).expect("a PostgreSQL server");
    pg.create_database("app").unwrap();
    pg.query(
        "app",
        "CREATE TABLE orders (id text PRIMARY KEY, big numeric, price numeric, tiny numeric, \"offset\" bigint)",
    )
    .unwrap();
    run(&job(
        tmp.path(),
        "to-postgres",
        &kafka.bootstrap,
        &format!(
            "[sink.postgres]\nurl = \"{}\"\ntable = \"orders\"\nsslmode = \"disable\"\nmode = \"upsert\"\nkey = [\"id\"]\n",
            pg.url("app")
        ),
    ));
    let rows = pg
        .query(
            "app",
            "SELECT big::text, price::text, tiny::text FROM orders ORDER BY id",
        )
        .unwrap();
    assert_eq!(rows.len(), RECORDS);
    for r in rows {
        assert_eq!(r, vec![BIG.to_string(), SCALED.into(), TINY.into()]);
    }

    // Kafka: the output topic's payloads.
    run(&job(
        tmp.path(),
        "to-kafka",
        &kafka.bootstrap,
        &format!(
            "[sink.kafka]\nbootstrap_servers = \"{}\"\ntopic = \"out\"\nkey = \"/id\"\n",
            kafka.bootstrap
        ),
    ));
    use rdkafka::consumer::Consumer;
    use rdkafka::message::Message;
    let c = common::kafka::consumer(&kafka.bootstrap, "numbers-reader");
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset("out", 0, rdkafka::Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let mut seen = 0;
    let deadline = std::time::Instant::now() + common::wait::DEADLINE;
    while seen < RECORDS {
        assert!(
            std::time::Instant::now() < deadline,
            "{seen} of {RECORDS} read back"
        );
        if let Some(m) = c.poll(std::time::Duration::from_millis(500)) {
            let m = m.unwrap();
            assert_exact(
                "kafka sink",
                std::str::from_utf8(m.payload().unwrap()).unwrap(),
            );
            seen += 1;
        }
    }
}
