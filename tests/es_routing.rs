//! Routing through real processes: date-pattern and field indices, Kafka tombstones that
//! delete documents, external versions fed from two partitions, and the load-time checks
//! of the Elasticsearch section. The job is `lockgate run` against the embedded Kafka
//! (its own process) and the embedded Elasticsearch-API server.

mod common;

use common::es::Es;
use common::kafka::KafkaProcess;
use common::{bin, tail, wait_timeout};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

/// 2026-03-07T10:00:00Z and the day after, in ms.
const DAY_1: i64 = 1_772_877_600_000;
const DAY_2: i64 = DAY_1 + 86_400_000;

/// One record to produce: partition, key, value (`None`: a tombstone), timestamp.
type Rec<'a> = (i32, &'a str, Option<String>, i64);

fn produce(bootstrap: &str, topic: &str, records: &[Rec]) {
    let p: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    for (partition, key, value, ts) in records {
        let mut r = BaseRecord::<str, str>::to(topic)
            .partition(*partition)
            .key(*key)
            .timestamp(*ts);
        if let Some(v) = value {
            r = r.payload(v.as_str());
        }
        p.send(r).map_err(|(e, _)| e).unwrap();
    }
    p.flush(Duration::from_secs(60)).unwrap();
}

fn write_job(dir: &Path, bootstrap: &str, es: &str, sink_extra: &str) -> std::path::PathBuf {
    let text = format!(
        "[job]\nname = \"routing\"\nparallelism = 2\n\n\
         [checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 200\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"events\"]\n\
         bounded = \"latest\"\nconnect_timeout_ms = 10000\n\n\
         [sink.elasticsearch]\nurl = \"{es}\"\nbulk_flush_interval_ms = 100\n{sink_extra}\n"
    );
    let path = dir.join("job.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn run(job: &Path) -> (Option<i32>, String) {
    let log = job.with_file_name("job.log");
    let mut child = Command::new(bin())
        .args(["run", "--config"])
        .arg(job)
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::options().append(true).open(&log).unwrap())
        .spawn()
        .unwrap();
    let status = wait_timeout(&mut child, common::wait::DEADLINE);
    (status.code(), std::fs::read_to_string(&log).unwrap())
}

fn doc(es: &Es, index: &str, id: &str) -> Option<serde_json::Value> {
    es.get_many(index, &[id.to_string()])
        .into_iter()
        .next()
        .map(|(_, source, _)| source)
}

#[test]
fn date_pattern_indices_take_the_kafka_timestamp_and_tombstones_delete_by_key() {
    let kafka = KafkaProcess::start(&[("events", 2)]);
    let es = Es::testkit();
    let v = |n: i32| Some(format!("{{\"n\":{n}}}"));
    produce(
        &kafka.bootstrap,
        "events",
        &[
            (0, "a", v(1), DAY_1),
            (0, "b", v(2), DAY_1),
            (1, "c", v(3), DAY_2),
            (1, "d", v(4), DAY_2),
            (0, "a", v(5), DAY_1),
            // Tombstones: b goes on day 1, d on day 2; e never existed.
            (0, "b", None, DAY_1),
            (1, "d", None, DAY_2),
            (1, "e", None, DAY_2),
        ],
    );
    let tmp = tempfile::tempdir().unwrap();
    let job = write_job(
        tmp.path(),
        &kafka.bootstrap,
        &es.url(),
        "index = \"events-{yyyy.MM.dd}\"\nid = \"key\"\non_null_value = \"delete\"",
    );
    let (code, log) = run(&job);
    assert_eq!(code, Some(0), "{}", tail(&log, 30));
    assert_eq!(
        doc(&es, "events-2026.03.07", "a"),
        v(5).map(|s| serde_json::from_str(&s).unwrap())
    );
    assert_eq!(
        doc(&es, "events-2026.03.08", "c"),
        v(3).map(|s| serde_json::from_str(&s).unwrap())
    );
    assert_eq!(doc(&es, "events-2026.03.07", "b"), None, "b was deleted");
    assert_eq!(doc(&es, "events-2026.03.08", "d"), None, "d was deleted");
    assert_eq!(es.count("events-2026.03.07"), 1, "only a on day 1");
    assert_eq!(es.count("events-2026.03.08"), 1, "only c on day 2");
}

#[test]
fn tombstones_are_skipped_or_fail_the_job_naming_the_record() {
    let kafka = KafkaProcess::start(&[("events", 1)]);
    let es = Es::testkit();
    produce(
        &kafka.bootstrap,
        "events",
        &[
            (0, "a", Some("{\"n\":1}".into()), DAY_1),
            (0, "a", None, DAY_1),
            (0, "b", Some("{\"n\":2}".into()), DAY_1),
        ],
    );
    let tmp = tempfile::tempdir().unwrap();
    let job = write_job(
        tmp.path(),
        &kafka.bootstrap,
        &es.url(),
        "index = \"skip\"\nid = \"key\"\non_null_value = \"skip\"",
    );
    let (code, log) = run(&job);
    assert_eq!(code, Some(0), "{}", tail(&log, 30));
    assert!(
        doc(&es, "skip", "a").is_some(),
        "a skipped tombstone deletes nothing"
    );
    assert_eq!(es.count("skip"), 2);
    assert!(log.contains("skipping tombstones"), "{}", tail(&log, 30));

    let tmp = tempfile::tempdir().unwrap();
    let job = write_job(
        tmp.path(),
        &kafka.bootstrap,
        &es.url(),
        "index = \"fail\"\nid = \"key\"\non_null_value = \"fail\"",
    );
    let (code, log) = run(&job);
    assert_eq!(code, Some(1), "{}", tail(&log, 30));
    assert!(
        log.contains("events/0@1 is a tombstone"),
        "the error names the record:\n{}",
        tail(&log, 30)
    );
}

#[test]
fn a_field_index_that_a_record_cannot_fill_fails_the_job_naming_the_record() {
    let kafka = KafkaProcess::start(&[("events", 1)]);
    let es = Es::testkit();
    produce(
        &kafka.bootstrap,
        "events",
        &[
            (0, "a", Some("{\"tenant\":\"acme\"}".into()), DAY_1),
            (0, "b", Some("{\"tenant\":\"Big Corp\"}".into()), DAY_1),
        ],
    );
    let tmp = tempfile::tempdir().unwrap();
    let job = write_job(
        tmp.path(),
        &kafka.bootstrap,
        &es.url(),
        "index = \"{/tenant}-events\"\nid = \"key\"",
    );
    let (code, log) = run(&job);
    assert_eq!(code, Some(1), "{}", tail(&log, 30));
    assert!(
        log.contains("record events/0@1 cannot be written") && log.contains("lower case"),
        "{}",
        tail(&log, 30)
    );
}

#[test]
fn records_that_cannot_be_written_are_dead_lettered_by_policy_and_the_rest_go_on() {
    let kafka = KafkaProcess::start(&[("events", 1), ("dlq", 1)]);
    let es = Es::testkit();
    produce(
        &kafka.bootstrap,
        "events",
        &[
            (0, "a", Some("{\"tenant\":\"acme\"}".into()), DAY_1),
            (0, "b", Some("{\"tenant\":\"Big Corp\"}".into()), DAY_1),
            (0, "c", Some("{\"tenant\":\"acme\"}".into()), DAY_1),
        ],
    );
    let tmp = tempfile::tempdir().unwrap();
    let job = write_job(
        tmp.path(),
        &kafka.bootstrap,
        &es.url(),
        "index = \"{/tenant}-events\"\nid = \"key\"\noperation = \"upsert\"\non_item_error = \"dead-letter:dlq\"",
    );
    let (code, log) = run(&job);
    assert_eq!(code, Some(0), "{}", tail(&log, 30));
    assert_eq!(es.count("acme-events"), 2, "a and c were written");
    let (payload, headers) = common::kafka::first_dead_letter(&kafka.bootstrap, "dlq");
    assert_eq!(payload, b"{\"tenant\":\"Big Corp\"}");
    assert_eq!(
        headers.get("lockgate.offset").map(String::as_str),
        Some("1")
    );
    assert!(
        headers["lockgate.error"].contains("lower case"),
        "{headers:?}"
    );
}

#[test]
fn external_versions_from_two_partitions_of_one_document_fail_before_a_newer_write_is_lost() {
    let kafka = KafkaProcess::start(&[("events", 2)]);
    let es = Es::testkit();
    // Document k gets offset 2 of partition 0, then, newer, offset 0 of partition 1: as
    // a version, the newer write is the smaller one.
    produce(
        &kafka.bootstrap,
        "events",
        &[
            (0, "x", Some("{\"n\":0}".into()), DAY_1),
            (0, "y", Some("{\"n\":0}".into()), DAY_1),
            (0, "k", Some("{\"n\":1}".into()), DAY_1),
        ],
    );
    let tmp = tempfile::tempdir().unwrap();
    let job = write_job(
        tmp.path(),
        &kafka.bootstrap,
        &es.url(),
        "index = \"versions\"\nid = \"key\"\nversioning = \"external\"",
    );
    let (code, log) = run(&job);
    assert_eq!(
        code,
        Some(0),
        "one partition per document is fine:\n{}",
        tail(&log, 30)
    );
    assert_eq!(doc(&es, "versions", "k"), Some(serde_json::json!({"n": 1})));
    // The newer write arrives on the other partition; a new run (its own checkpoints)
    // reads both.
    produce(
        &kafka.bootstrap,
        "events",
        &[(1, "k", Some("{\"n\":2}".into()), DAY_1)],
    );
    let tmp = tempfile::tempdir().unwrap();
    let job = write_job(
        tmp.path(),
        &kafka.bootstrap,
        &es.url(),
        "index = \"versions\"\nid = \"key\"\nversioning = \"external\"",
    );
    let (code, log) = run(&job);
    assert_eq!(code, Some(1), "{}", tail(&log, 30));
    assert!(
        log.contains("document \"k\" is written by events/")
            && log.contains("events/0")
            && log.contains("events/1"),
        "the error names the document and both partitions:\n{}",
        tail(&log, 30)
    );
    // What the index holds is the last write that was made, never a newer write
    // counted as written and lost: the job stopped instead.
    assert_eq!(doc(&es, "versions", "k"), Some(serde_json::json!({"n": 1})));
}

#[test]
fn topic_indices_from_a_topic_pattern_job_over_two_topics() {
    let kafka = KafkaProcess::start(&[("events", 1), ("Events-EU", 2)]);
    let es = Es::testkit();
    let v = |n: i32| Some(format!("{{\"n\":{n}}}"));
    produce(
        &kafka.bootstrap,
        "events",
        &[(0, "a", v(1), DAY_1), (0, "b", v(2), DAY_1)],
    );
    produce(
        &kafka.bootstrap,
        "Events-EU",
        &[(0, "c", v(3), DAY_2), (1, "d", v(4), DAY_2)],
    );
    let tmp = tempfile::tempdir().unwrap();
    let job = write_job(
        tmp.path(),
        &kafka.bootstrap,
        &es.url(),
        "index = \"{topic}-{yyyy.MM}\"\nid = \"key\"\ntopic_to_index = { \"events\" = \"events-v2\" }",
    );
    // Both topics, through a pattern.
    let text = std::fs::read_to_string(&job)
        .unwrap()
        .replace("topics = [\"events\"]", "topic_pattern = \"(?i)events.*\"");
    std::fs::write(&job, text).unwrap();
    let (code, log) = run(&job);
    assert_eq!(code, Some(0), "{}", tail(&log, 30));
    // Renamed by topic_to_index; lower-cased, as Kafka Connect names an index.
    assert_eq!(doc(&es, "events-v2-2026.03", "a").unwrap()["n"], 1);
    assert_eq!(doc(&es, "events-v2-2026.03", "b").unwrap()["n"], 2);
    assert_eq!(doc(&es, "events-eu-2026.03", "c").unwrap()["n"], 3);
    assert_eq!(doc(&es, "events-eu-2026.03", "d").unwrap()["n"], 4);
    assert_eq!(
        es.count("events-v2-2026.03") + es.count("events-eu-2026.03"),
        4
    );
}

fn load_error(sink_extra: &str) -> Output {
    let tmp = tempfile::tempdir().unwrap();
    // Nothing listens at these addresses: the job must fail at load, before connecting.
    let job = write_job(tmp.path(), "127.0.0.1:1", "http://127.0.0.1:1", sink_extra);
    Command::new(bin())
        .args(["run", "--config"])
        .arg(&job)
        .output()
        .unwrap()
}

#[test]
fn invalid_index_and_tombstone_settings_are_refused_at_load_naming_the_key() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "index = \"Events\"",
            "sink.elasticsearch.index",
            "lower case",
        ),
        (
            "index = \"events-{yyyy/MM}\"",
            "sink.elasticsearch.index",
            "not understood",
        ),
        (
            "index = \"_events\"",
            "sink.elasticsearch.index",
            "cannot start with `_`",
        ),
        (
            "index = \"e\"\non_null_value = \"delete\"",
            "sink.elasticsearch.on_null_value",
            "needs id = \"key\"",
        ),
        (
            "index = \"e\"\nid = \"key\"\non_null_value = \"purge\"",
            "sink.elasticsearch.on_null_value",
            "not one of delete, skip, fail",
        ),
        (
            "index = \"e\"\ntopic_to_index = { \"events\" = \"v2\" }",
            "sink.elasticsearch.topic_to_index",
            "has no {topic}",
        ),
        (
            "index = \"{topic}\"\ntopic_to_index = { \"events\" = \"V2\" }",
            "sink.elasticsearch.topic_to_index.\"events\"",
            "lower case",
        ),
        (
            "index = \"{topics}\"",
            "sink.elasticsearch.index",
            "not understood",
        ),
    ];
    for (extra, key, why) in cases {
        let out = load_error(extra);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra}: {stderr}");
        assert!(
            stderr.contains("job.toml") && stderr.contains(key) && stderr.contains(why),
            "{extra}: {stderr}"
        );
    }
}

/// A delete runs no ingest pipeline: with a pipeline that may send documents elsewhere,
/// deletes (tombstones under on_null_value = "delete", a debezium transform's deletes)
/// would miss them and count the 404 as done. Refused at load naming the keys and the
/// file, unless the pipeline is declared not to reroute.
#[test]
fn a_pipeline_with_deletes_is_refused_at_load_unless_declared_not_to_reroute() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "index = \"e\"\nid = \"key\"\npipeline = \"enrich\"\non_null_value = \"delete\"",
            "sink.elasticsearch.pipeline",
            "on_null_value = \"delete\"",
        ),
        (
            "index = \"e\"\nid = \"key\"\npipeline = \"enrich\"\npipeline_reroutes = true\non_null_value = \"delete\"",
            "sink.elasticsearch.pipeline",
            "pipeline_reroutes = false",
        ),
        (
            "index = \"e\"\nid = \"key\"\npipeline = \"enrich\"\n\n[[transform]]\ntype = \"debezium\"\n",
            "sink.elasticsearch.pipeline",
            "transform",
        ),
        (
            "index = \"e\"\nid = \"key\"\npipeline_reroutes = false\non_null_value = \"delete\"",
            "sink.elasticsearch.pipeline_reroutes",
            "there is no pipeline",
        ),
    ];
    for (extra, key, why) in cases {
        let out = load_error(extra);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra}: {stderr}");
        assert!(
            stderr.contains("job.toml") && stderr.contains(key) && stderr.contains(why),
            "{extra}: {stderr}"
        );
    }
    // Declared not to reroute, or with deletes dropped: past the sink's checks (the
    // job then fails to reach Kafka, at 127.0.0.1:1).
    for extra in [
        "index = \"e\"\nid = \"key\"\npipeline = \"enrich\"\npipeline_reroutes = false\non_null_value = \"delete\"",
        "index = \"e\"\nid = \"key\"\npipeline = \"enrich\"\n\n[[transform]]\ntype = \"debezium\"\ndelete_handling = \"drop\"\n",
    ] {
        let out = load_error(extra);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("sink.elasticsearch.pipeline"),
            "{extra}: {stderr}"
        );
    }
}

/// Under on_topic_recreated = "restart" a recreated topic's offsets start at 0 again:
/// ids or versions made of them would take the new records for written ones (409).
/// Refused at load, naming both keys and the file.
#[test]
fn ids_or_versions_of_offsets_are_refused_with_a_topic_read_again_from_0() {
    let cases: &[(&str, &str)] = &[
        (
            "data_stream = { type = \"logs\", dataset = \"app\", namespace = \"default\" }",
            "sink.elasticsearch.id",
        ),
        (
            "index = \"e\"\nid = \"coordinates\"",
            "sink.elasticsearch.id",
        ),
        (
            "index = \"e\"\nid = \"key\"\nversioning = \"external\"",
            "sink.elasticsearch.versioning",
        ),
    ];
    for (extra, key) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let job = write_job(tmp.path(), "127.0.0.1:1", "http://127.0.0.1:1", extra);
        let text = std::fs::read_to_string(&job).unwrap().replace(
            "bounded = \"latest\"",
            "bounded = \"latest\"\non_topic_recreated = \"restart\"",
        );
        std::fs::write(&job, &text).unwrap();
        let out = Command::new(bin())
            .args(["run", "--config"])
            .arg(&job)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra}: {stderr}");
        assert!(
            stderr.contains("job.toml")
                && stderr.contains("source.kafka.on_topic_recreated")
                && stderr.contains(key)
                && stderr.contains("409"),
            "{extra}: {stderr}"
        );
        // The same sink with the topic's recreation failing the job loads.
        std::fs::write(&job, text.replace("\"restart\"", "\"fail\"")).unwrap();
        let out = Command::new(bin())
            .args(["run", "--config"])
            .arg(&job)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("on_topic_recreated"), "{extra}: {stderr}");
    }
}
