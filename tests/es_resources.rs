//! Elasticsearch's resources through real processes (`lockgate run` against the
//! embedded Kafka, its own process, and the embedded Elasticsearch-API server): ingest
//! pipelines per action, routing kept on every action of a document, data streams with
//! `@timestamp` from a field or the Kafka timestamp (and replayed without duplicates),
//! `require_alias`, an index template put once across restarts, and the load-time
//! refusals of combinations Elasticsearch does not accept.

mod common;

use common::es::Es;
use common::kafka::{first_dead_letter, KafkaProcess};
use common::{run_config, tail};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// 2026-03-07T10:00:00Z in ms.
const TS: i64 = 1_772_877_600_000;

/// Produces (key, value) records to partition 0 (`None`: a tombstone), timestamps
/// `TS`, `TS + 1`, ...
fn produce(bootstrap: &str, topic: &str, records: &[(&str, Option<Value>)]) {
    let p: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    for (i, (key, value)) in records.iter().enumerate() {
        let text = value.as_ref().map(Value::to_string);
        let mut r = BaseRecord::<str, str>::to(topic)
            .partition(0)
            .key(*key)
            .timestamp(TS + i as i64);
        if let Some(v) = &text {
            r = r.payload(v.as_str());
        }
        p.send(r).map_err(|(e, _)| e).unwrap();
    }
    p.flush(Duration::from_secs(60)).unwrap();
}

fn write_job(dir: &Path, bootstrap: &str, es: &str, sink: &str) -> PathBuf {
    let text = format!(
        "[job]\nname = \"resources\"\nparallelism = 1\n\n\
         [checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 200\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"events\"]\n\
         bounded = \"latest\"\nconnect_timeout_ms = 10000\n\n\
         [sink.elasticsearch]\nurl = \"{es}\"\nbulk_flush_interval_ms = 100\n{sink}\n"
    );
    let path = dir.join("job.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Runs the job to its end, asserting it succeeded.
fn run_ok(job: &Path) -> String {
    let (code, log) = run_config(job);
    assert_eq!(code, Some(0), "{}", tail(&log, 30));
    log
}

/// The source of `id` under `routing`, if the index holds it.
fn get(es: &Es, index: &str, id: &str, routing: Option<&str>) -> Option<Value> {
    let path = match routing {
        Some(r) => format!("/{index}/_doc/{id}?routing={r}"),
        None => format!("/{index}/_doc/{id}"),
    };
    let (status, v) = es.call("GET", &path, None);
    (status == 200).then(|| v["_source"].clone())
}

#[test]
fn each_document_goes_through_the_pipeline_its_field_names_and_a_missing_one_is_dead_lettered() {
    let kafka = KafkaProcess::start(&[("events", 1), ("dlq", 1)]);
    let es = Es::testkit();
    let (status, body) = es.call(
        "PUT",
        "/_ingest/pipeline/enrich-web",
        Some(r#"{"processors":[{"set":{"field":"channel","value":"web via {{user}}"}}]}"#),
    );
    assert_eq!(status, 200, "{body}");
    produce(
        &kafka.bootstrap,
        "events",
        &[
            ("a", Some(json!({"user": "a", "kind": "web"}))),
            ("b", Some(json!({"user": "b", "kind": "shop"}))),
            ("c", Some(json!({"user": "c", "kind": "web"}))),
        ],
    );
    let tmp = tempfile::tempdir().unwrap();
    let job = write_job(
        tmp.path(),
        &kafka.bootstrap,
        &es.url(),
        "index = \"events\"\nid = \"key\"\npipeline = \"enrich-{/kind}\"\non_item_error = \"dead-letter:dlq\"",
    );
    run_ok(&job);
    assert_eq!(
        get(&es, "events", "a", None),
        Some(json!({"user": "a", "kind": "web", "channel": "web via a"}))
    );
    assert_eq!(
        get(&es, "events", "c", None).unwrap()["channel"],
        json!("web via c")
    );
    // Elasticsearch refuses the item whose pipeline does not exist (400): the policy
    // dead-letters it with the cluster's reason.
    assert_eq!(get(&es, "events", "b", None), None);
    let (payload, headers) = first_dead_letter(&kafka.bootstrap, "dlq");
    assert_eq!(
        serde_json::from_slice::<Value>(&payload).unwrap(),
        json!({"user": "b", "kind": "shop"})
    );
    let error = &headers["lockgate.error"];
    assert!(
        error.contains("pipeline with id [enrich-shop] does not exist"),
        "{error}"
    );
}

#[test]
fn an_upsert_and_the_delete_of_its_document_carry_the_same_routing() {
    let kafka = KafkaProcess::start(&[("events", 1)]);
    let es = Es::testkit();
    let key = |id: u32, tenant: &str| json!({"id": id, "tenant": tenant}).to_string();
    let (k1, k2) = (key(1, "t1"), key(2, "t2"));
    produce(
        &kafka.bootstrap,
        "events",
        &[
            (&k1, Some(json!({"id": 1, "tenant": "t1", "n": 1}))),
            (&k2, Some(json!({"id": 2, "tenant": "t2", "n": 1}))),
            (&k1, Some(json!({"id": 1, "tenant": "t1", "m": 2}))),
            (&k2, Some(json!({"id": 2, "tenant": "t2", "n": 3}))),
            // The delete of 1 has only its key: its routing comes from there too.
            (&k1, None),
        ],
    );
    let tmp = tempfile::tempdir().unwrap();
    let job = write_job(
        tmp.path(),
        &kafka.bootstrap,
        &es.url(),
        "index = \"tenants\"\nid = \"field:/id\"\noperation = \"upsert\"\nrouting = \"/tenant\"\non_null_value = \"delete\"",
    );
    run_ok(&job);
    // The test server keeps a document per id and routing, as shards would: an
    // action without the routing (or with another) would miss the document.
    assert_eq!(get(&es, "tenants", "1", Some("t1")), None, "deleted");
    assert_eq!(
        get(&es, "tenants", "2", Some("t2")),
        Some(json!({"id": 2, "tenant": "t2", "n": 3})),
        "both upserts of 2 reached one document"
    );
    assert_eq!(
        get(&es, "tenants", "2", None),
        None,
        "written with its routing"
    );
    let (_, v) = es.call("GET", "/tenants/_doc/2?routing=t2", None);
    assert_eq!(v["_routing"], json!("t2"));
    assert_eq!(es.count("tenants"), 1, "no copy without routing was left");
}

#[test]
fn a_data_stream_takes_its_timestamp_from_a_field_or_from_kafka_and_a_replay_adds_nothing() {
    let kafka = KafkaProcess::start(&[("events", 1)]);
    let es = Es::testkit();
    produce(
        &kafka.bootstrap,
        "events",
        &[
            ("a", Some(json!({"n": 1, "ts": "2026-01-02T03:04:05Z"}))),
            ("b", Some(json!({"n": 2, "ts": 1_767_323_045_000_i64}))),
        ],
    );
    let tmp = tempfile::tempdir().unwrap();
    // A fresh Elasticsearch has the logs-*-* template, which makes a data stream.
    let from_field = write_job(
        tmp.path(),
        &kafka.bootstrap,
        &es.url(),
        "data_stream = { type = \"logs\", dataset = \"orders\", namespace = \"field\" }\ntimestamp_field = \"/ts\"",
    );
    run_ok(&from_field);
    let docs = |stream: &str| {
        let (status, v) = es.call("GET", &format!("/{stream}/_search?size=100"), None);
        assert_eq!(status, 200, "{v}");
        let mut out: Vec<(String, Value)> = v["hits"]["hits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| (h["_id"].as_str().unwrap().to_string(), h["_source"].clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    };
    let (status, v) = es.call("GET", "/_data_stream/logs-orders-field", None);
    assert_eq!(status, 200, "a data stream was written: {v}");
    assert_eq!(
        docs("logs-orders-field"),
        vec![
            (
                "events-0-0".to_string(),
                json!({"n": 1, "ts": "2026-01-02T03:04:05Z", "@timestamp": "2026-01-02T03:04:05Z"})
            ),
            (
                "events-0-1".to_string(),
                json!({"n": 2, "ts": 1_767_323_045_000_i64, "@timestamp": 1_767_323_045_000_i64})
            ),
        ]
    );

    let kafka_ts = tmp.path().join("kafka-ts");
    std::fs::create_dir(&kafka_ts).unwrap();
    let from_kafka = write_job(
        &kafka_ts,
        &kafka.bootstrap,
        &es.url(),
        "data_stream = { type = \"logs\", dataset = \"orders\" }",
    );
    run_ok(&from_kafka);
    let written = docs("logs-orders-default");
    assert_eq!(
        written
            .iter()
            .map(|(_, d)| d["@timestamp"].clone())
            .collect::<Vec<_>>(),
        vec![
            json!("2026-03-07T10:00:00.000Z"),
            json!("2026-03-07T10:00:00.001Z")
        ],
        "the Kafka timestamps"
    );
    // A run from the start again (no checkpoint) writes every record again: each
    // create meets its document (409) and counts as already written.
    std::fs::remove_dir_all(kafka_ts.join("checkpoints")).unwrap();
    let log = run_ok(&from_kafka);
    assert_eq!(docs("logs-orders-default"), written, "{}", tail(&log, 20));
}

#[test]
fn require_alias_refuses_a_missing_alias_and_writes_through_one() {
    let kafka = KafkaProcess::start(&[("events", 1)]);
    let es = Es::testkit();
    produce(&kafka.bootstrap, "events", &[("a", Some(json!({"n": 1})))]);
    let tmp = tempfile::tempdir().unwrap();
    let job = write_job(
        tmp.path(),
        &kafka.bootstrap,
        &es.url(),
        "index = \"orders-write\"\nid = \"key\"\nrequire_alias = true",
    );
    let (code, log) = run_config(&job);
    assert_eq!(code, Some(1), "{}", tail(&log, 30));
    assert!(
        log.contains("[orders-write] is not an alias"),
        "{}",
        tail(&log, 30)
    );
    let (status, _) = es.call("GET", "/orders-write", None);
    assert_eq!(status, 404, "no index was created in the alias's place");

    es.create_index("orders-000001", &[]);
    let (status, body) = es.call(
        "POST",
        "/_aliases",
        Some(r#"{"actions":[{"add":{"index":"orders-000001","alias":"orders-write","is_write_index":true}}]}"#),
    );
    assert_eq!(status, 200, "{body}");
    std::fs::remove_dir_all(tmp.path().join("checkpoints")).ok();
    run_ok(&job);
    assert_eq!(get(&es, "orders-000001", "a", None), Some(json!({"n": 1})));
}

#[test]
fn an_index_template_is_put_once_across_restarts_and_again_when_it_changes() {
    let kafka = KafkaProcess::start(&[("events", 1)]);
    let es = Es::testkit();
    produce(
        &kafka.bootstrap,
        "events",
        &[("a", Some(json!({"n": "7"})))],
    );
    let tmp = tempfile::tempdir().unwrap();
    let template = |priority: u32| {
        json!({"index_patterns": ["typed-*"], "priority": priority,
               "template": {"mappings": {"properties": {"n": {"type": "long"}}}}})
        .to_string()
    };
    std::fs::write(tmp.path().join("typed.json"), template(10)).unwrap();
    let job = write_job(
        tmp.path(),
        &kafka.bootstrap,
        &es.url(),
        "index = \"typed-orders\"\nid = \"key\"\nindex_template_file = \"typed.json\"",
    );
    let puts = || {
        let (_, v) = es.call("GET", "/_lockgate/stats", None);
        v["index_template_puts"].as_u64().unwrap()
    };
    run_ok(&job);
    assert_eq!(puts(), 1);
    let (status, v) = es.call("GET", "/_index_template/typed", None);
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["index_templates"][0]["index_template"]["template"]["mappings"]["properties"]["n"],
        json!({"type": "long"})
    );
    // The template was there before the first document: "7" was mapped as a long,
    // and a text value is now refused (the test server checks types as mapped).
    let (status, v) = es.call(
        "POST",
        "/_bulk",
        Some("{\"index\":{\"_index\":\"typed-orders\",\"_id\":\"x\"}}\n{\"n\":\"seven\"}\n"),
    );
    assert_eq!(status, 200);
    assert_eq!(v["items"][0]["index"]["status"], json!(400), "{v}");
    for _ in 0..2 {
        std::fs::remove_dir_all(tmp.path().join("checkpoints")).ok();
        run_ok(&job);
    }
    assert_eq!(puts(), 1, "restarts find the template in place");
    std::fs::write(tmp.path().join("typed.json"), template(20)).unwrap();
    run_ok(&job);
    assert_eq!(puts(), 2, "a changed file is put once");
    let (_, v) = es.call("GET", "/_index_template/typed", None);
    assert_eq!(
        v["index_templates"][0]["index_template"]["priority"],
        json!(20)
    );
}

#[test]
fn combinations_elasticsearch_refuses_are_refused_at_load_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str)] = &[
        (
            "data_stream = { type = \"logs\", dataset = \"o\" }\noperation = \"upsert\"",
            "sink.elasticsearch.operation",
        ),
        (
            "data_stream = { type = \"logs\", dataset = \"o\" }\nid = \"key\"\non_null_value = \"delete\"",
            "sink.elasticsearch.on_null_value",
        ),
        (
            "data_stream = { type = \"logs\", dataset = \"o\" }\nindex = \"x\"",
            "sink.elasticsearch.index and sink.elasticsearch.data_stream",
        ),
        (
            "data_stream = { type = \"log\", dataset = \"o\" }",
            "sink.elasticsearch.data_stream.type",
        ),
        (
            "data_stream = { type = \"logs\", dataset = \"a-b\" }",
            "sink.elasticsearch.data_stream.dataset",
        ),
        (
            "index = \"x\"\ntimestamp_field = \"/ts\"",
            "sink.elasticsearch.timestamp_field",
        ),
        (
            "index = \"x\"\noperation = \"upsert\"\nid = \"key\"\npipeline = \"p\"",
            "sink.elasticsearch.pipeline",
        ),
        ("index = \"x\"\nrouting = \"tenant\"", "sink.elasticsearch.routing"),
        (
            "index = \"x\"\nindex_template_file = \"missing.json\"",
            "sink.elasticsearch.index_template_file",
        ),
        (
            "data_stream = { type = \"logs\", dataset = \"o\" }\nid = \"key\"",
            "sink.elasticsearch.id",
        ),
        (
            "index = \"x\"\noperation = \"upsert\"\nversioning = \"external\"",
            "sink.elasticsearch.operation and sink.elasticsearch.versioning",
        ),
        ("url2 = 1", "sink.elasticsearch"),
    ];
    for (sink, key) in cases {
        let job = write_job(tmp.path(), "127.0.0.1:9", "http://127.0.0.1:9", sink);
        let (code, log) = run_config(&job);
        assert_eq!(code, Some(2), "{sink}: {}", tail(&log, 10));
        assert!(
            log.contains(key),
            "{sink}: wanted {key} in {}",
            tail(&log, 10)
        );
        assert!(
            log.contains("job.toml"),
            "{sink}: the file is named: {}",
            tail(&log, 10)
        );
    }
}

#[test]
fn a_data_stream_under_twenty_kills_is_written_exactly_once() {
    let kafka = KafkaProcess::start(&[("orders", 2)]);
    lockgate::testkit::kafka::produce_orders(&kafka.bootstrap, "orders", 0, 50_000, 500).unwrap();
    let es = Es::testkit();
    let tmp = tempfile::tempdir().unwrap();
    let text = format!(
        "[job]\nname = \"stream\"\nparallelism = 1\n\n[checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 200\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\n\n\
         [sink.elasticsearch]\nurl = \"{}\"\ndata_stream = {{ type = \"logs\", dataset = \"orders\", namespace = \"chaos\" }}\n\
         bulk_flush_interval_ms = 100\nretry_initial_ms = 20\nretry_max_ms = 500\nretry_max_attempts = 1000\n",
        kafka.bootstrap,
        es.url()
    );
    let config = tmp.path().join("job.toml");
    std::fs::write(&config, text).unwrap();
    let (code, out, r) = common::chaos(
        &config,
        &[
            "--kills",
            "20",
            "--seed",
            "29",
            // One source subtask, a batch (at most 1024 records) per 500 ms, a kill at
            // most 900 ms after each start: 20 runs hand over at most 40 batches of the
            // 50,000 records, so the job cannot finish before its 20th kill.
            "--failpoints",
            "source-batch=sleep(500)",
            "--failpoint-runs",
            "20",
            "--kill-after-ms",
            "300..900",
        ],
    );
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(r["kills"], 20, "{out}");
    assert_eq!(r["verdict"]["inputs"], 50_000, "{out}");
    assert_eq!(r["verdict"]["documents"], 50_000, "{out}");
    for k in ["missing", "duplicated", "wrong"] {
        assert_eq!(r["verdict"][k], 0, "{k}: {out}");
    }
    // The verifier compared every document with its record and the record's Kafka
    // timestamp as @timestamp; the stream is a data stream, written by creates only.
    let (status, v) = es.call("GET", "/_data_stream/logs-orders-chaos", None);
    assert_eq!(status, 200, "{v}");
}
