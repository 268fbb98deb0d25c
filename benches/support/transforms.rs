//! The cost of transforms, in the same run (alternating rounds, medians):
//!
//! 1. per record, as a job applies a chain (one step: the value parsed once, changed by
//!    each, written once), against the JSON check every record already costs:
//!    `insert_field`, `replace_field` and `cast` on orders (also step by step, parsed and
//!    written by each); the change-data-capture chain `debezium`, `replace_field`,
//!    `insert_field` on Debezium's change events; and a jq program on orders;
//! 2. end to end (`lockgate run`, the embedded Kafka, the Elasticsearch test server in
//!    its own process): Debezium's change events indexed through the CDC chain against
//!    the same events indexed as they are, records per second.
//!
//! `cargo bench --bench transform_chain` prints it alone (about a minute); the report
//! includes it.

use lockgate::record::{Origin, Record};
use lockgate::transforms::{transform, transform_all, Applied};
use std::sync::Arc;
use std::time::Instant;

const RECORDS: usize = 200_000;
const ROUNDS: usize = 5;

/// The transforms of a job file whose `[[transform]]` sections are `sections`.
fn chain_of(sections: &str) -> Vec<(String, Arc<dyn lockgate::transforms::Smt>)> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("chain.toml");
    let text = format!(
        "[job]\nname = \"chain\"\n[checkpoint]\ndir = \"checkpoints\"\n[source.sequence]\nto = 1\n{sections}\n[sink.file]\ndir = \"out\"\n"
    );
    std::fs::write(&path, text).expect("the chain's job file");
    let d = lockgate::config::describe(&path, &lockgate::builtin::registry())
        .expect("the chain's job file");
    d.transforms
        .iter()
        .map(|(kind, c)| {
            let a = c.downcast_ref::<Applied>().expect("a transform");
            (kind.clone(), a.0.clone())
        })
        .collect()
}

/// The `[[transform]]` sections of the orders chain.
const CHAIN: &str = r#"
[[transform]]
type = "insert_field"
static = { source = "kafka" }
topic_field = "topic"
timestamp_field = "@timestamp"
[[transform]]
type = "replace_field"
rename = { amount = "price" }
[[transform]]
type = "cast"
spec = { order = "string", price = "float64" }
"#;

/// The change-data-capture chain.
const CDC_CHAIN: &str = r#"
[[transform]]
type = "debezium"
[[transform]]
type = "replace_field"
exclude = ["note"]
[[transform]]
type = "insert_field"
timestamp_field = "@timestamp"
"#;

/// A jq program: a projection with a computed field and a condition.
const JQ: &str = r#"
[[transform]]
type = "jq"
filter = '{order, user, price: (.amount / 100), big: (.amount > 250), topic: $meta.topic}'
"#;

fn record(i: usize, value: String) -> Record {
    Record {
        value: value.into_bytes().into(),
        origin: Some(Origin {
            stream: "orders".into(),
            partition: 0,
            offset: i as i64,
        }),
        timestamp: Some(1_700_000_000_000 + i as i64),
        ..Record::default()
    }
}

fn order(i: usize) -> String {
    format!(
        "{{\"order\":{i},\"user\":\"user-{:04}\",\"amount\":{},\"note\":\"{:x<30}\"}}",
        i % 1000,
        1 + i % 500,
        ""
    )
}

/// A Debezium change event (JSON without the schema envelope) creating row `i`.
fn change_event(i: usize) -> String {
    serde_json::json!({
        "before": null,
        "after": {"id": i, "name": format!("product-{i}"), "price": (i % 50_000) as f64 / 100.0,
                  "note": "imported from the catalogue"},
        "source": {"connector": "postgresql", "table": "products", "lsn": i, "ts_ms": 1_700_000_000_000i64},
        "op": "c",
        "ts_ms": 1_700_000_000_500i64
    })
    .to_string()
}

/// Nanoseconds per record of `chain` over `records`, as one step.
fn time_fused(chain: &[(String, Arc<dyn lockgate::transforms::Smt>)], records: &[Record]) -> f64 {
    let start = Instant::now();
    let mut bytes = 0;
    let mut out = Vec::with_capacity(1);
    for r in records {
        out.clear();
        transform_all(chain, r.clone(), &mut out).expect("transformed");
        bytes += out.iter().map(|r| r.value.len()).sum::<usize>();
    }
    std::hint::black_box(bytes);
    start.elapsed().as_nanos() as f64 / records.len() as f64
}

/// Nanoseconds per record of the JSON check over `records`.
fn time_check(records: &[Record]) -> f64 {
    let start = Instant::now();
    for r in records {
        lockgate::formats::json::validate_json(&r.value).expect("JSON");
    }
    start.elapsed().as_nanos() as f64 / records.len() as f64
}

/// Runs every side and returns the JSON report.
pub fn measure() -> serde_json::Value {
    let chain = chain_of(CHAIN);
    let cdc = chain_of(CDC_CHAIN);
    let jq = chain_of(JQ);
    let records: Vec<Record> = (0..RECORDS).map(|i| record(i, order(i))).collect();
    let events: Vec<Record> = (0..RECORDS).map(|i| record(i, change_event(i))).collect();
    let time_chain = || {
        let start = Instant::now();
        let mut bytes = 0;
        for r in &records {
            let mut r = r.clone();
            for (kind, smt) in &chain {
                let mut out = Vec::with_capacity(1);
                transform(smt, kind, r, &mut out).expect("transformed");
                r = out.pop().expect("one record");
            }
            bytes += r.value.len();
        }
        std::hint::black_box(bytes);
        start.elapsed().as_nanos() as f64 / RECORDS as f64
    };
    // Each round measures every side, in an order that alternates.
    let mut sides: Vec<(&str, Vec<f64>)> = vec![
        ("step_by_step", Vec::new()),
        ("chain", Vec::new()),
        ("check", Vec::new()),
        ("cdc_chain", Vec::new()),
        ("event_check", Vec::new()),
        ("jq", Vec::new()),
    ];
    for round in 0..ROUNDS {
        let mut order: Vec<usize> = (0..sides.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let ns = match sides[i].0 {
                "step_by_step" => time_chain(),
                "chain" => time_fused(&chain, &records),
                "check" => time_check(&records),
                "cdc_chain" => time_fused(&cdc, &events),
                "event_check" => time_check(&events),
                _ => time_fused(&jq, &records),
            };
            sides[i].1.push(ns);
        }
        eprintln!(
            "round {round}: {}",
            sides
                .iter()
                .map(|(name, v)| format!("{name} {:.0} ns/record", v[round]))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let m: std::collections::BTreeMap<&str, f64> = sides
        .into_iter()
        .map(|(name, v)| (name, super::median(v)))
        .collect();
    let mean = |rs: &[Record]| rs.iter().map(|r| r.value.len()).sum::<usize>() / rs.len();
    let ratio = |a: f64, b: f64| (a / b * 100.0).round() / 100.0;
    serde_json::json!({
        "benchmark": "transforms per record, as a job applies them (one step: parsed once), against the JSON check of the same record",
        "records": RECORDS,
        "rounds": ROUNDS,
        "record_bytes_mean": mean(&records),
        "step_by_step_ns_per_record": m["step_by_step"].round(),
        "chain_ns_per_record": m["chain"].round(),
        "json_check_ns_per_record": m["check"].round(),
        "ratio_chain_over_check": ratio(m["chain"], m["check"]),
        "cdc_event_bytes_mean": mean(&events),
        "cdc_chain_ns_per_record": m["cdc_chain"].round(),
        "cdc_event_check_ns_per_record": m["event_check"].round(),
        "jq_ns_per_record": m["jq"].round(),
        "jq_program": JQ.lines().find(|l| l.starts_with("filter")).unwrap_or_default(),
        "end_to_end": cdc_end_to_end(E2E_EVENTS, E2E_ROUNDS),
    })
}

const E2E_EVENTS: usize = 300_000;
const E2E_ROUNDS: usize = 3;
/// Enough partitions that the embedded cluster keeps every event (5 MiB each).
const E2E_PARTITIONS: i32 = 24;

/// Debezium's change events through `lockgate run` into Elasticsearch, with the CDC
/// chain (documents by row id) against without (documents by coordinates, the events
/// as they are); each run's index is counted.
fn cdc_end_to_end(events: usize, rounds: usize) -> serde_json::Value {
    use super::{median, round3, run_job, Server};
    let kafka =
        lockgate::testkit::kafka::EmbeddedKafka::start(3, &[("cdc".into(), E2E_PARTITIONS)])
            .expect("embedded Kafka");
    let bootstrap = kafka.bootstrap_servers().to_string();
    {
        use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
        let p: BaseProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("linger.ms", "20")
            .set("batch.num.messages", "10000")
            .set("queue.buffering.max.messages", "1000000")
            .create()
            .expect("producer");
        for i in 0..events {
            let key = format!("{{\"id\":{i}}}");
            let value = change_event(i);
            let part = (i % E2E_PARTITIONS as usize) as i32;
            while p
                .send(
                    BaseRecord::to("cdc")
                        .partition(part)
                        .key(&key)
                        .payload(&value),
                )
                .is_err()
            {
                p.poll(std::time::Duration::from_millis(5));
            }
        }
        p.flush(std::time::Duration::from_secs(300)).expect("flush");
    }
    let es = Server::elasticsearch();
    let work = tempfile::tempdir().expect("tempdir");
    let run = |n: usize, transforms: &str, id: &str| {
        let dir = work.path().join(format!("run-{n}"));
        std::fs::create_dir_all(&dir).expect("run dir");
        let index = format!("cdc-{n}");
        let job = dir.join("job.toml");
        std::fs::write(
            &job,
            format!(
                "[job]\nname = \"cdc\"\nparallelism = 2\n[checkpoint]\ndir = \"{chk}\"\ninterval_ms = 1000\n[restart]\nstrategy = \"none\"\n\
                 [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"cdc\"]\nbounded = \"latest\"\n\
                 {transforms}\n[sink.elasticsearch]\nurl = \"{es}\"\nindex = \"{index}\"\nid = \"{id}\"\n",
                chk = dir.join("checkpoints").display(),
                es = es.address,
            ),
        )
        .expect("job file");
        let r = run_job(&job);
        let count: serde_json::Value =
            reqwest::blocking::get(format!("{}/{index}/_count", es.address))
                .and_then(|r| r.json())
                .expect("_count");
        assert_eq!(
            count["count"].as_u64(),
            Some(events as u64),
            "{index}: {count}"
        );
        let _ = std::fs::remove_dir_all(&dir);
        events as f64 / r.secs
    };
    let (mut plain, mut chained) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let (a, b) = if round % 2 == 0 {
            let a = run(2 * round, "", "coordinates");
            (a, run(2 * round + 1, CDC_CHAIN, "field:/id"))
        } else {
            let b = run(2 * round, CDC_CHAIN, "field:/id");
            (run(2 * round + 1, "", "coordinates"), b)
        };
        eprintln!("end to end, round {round}: events as they are {a:.0} rec/s, through the CDC chain {b:.0} rec/s");
        plain.push(a);
        chained.push(b);
    }
    let (a, b) = (median(plain), median(chained));
    serde_json::json!({
        "job": "Kafka (Debezium JSON change events) -> Elasticsearch, parallelism 2, checkpoints every second, lockgate run in its own process",
        "events": events,
        "partitions": E2E_PARTITIONS,
        "rounds": rounds,
        "records_per_sec_no_transform": a.round(),
        "records_per_sec_cdc_chain": b.round(),
        "ratio_chain_over_none": round3(b / a),
    })
}
