//! The cost of a chain of transforms per record: `insert_field`, `replace_field` and
//! `cast` as a job applies them (one step: the value parsed once, changed by each,
//! written once), and step by step (parsed and written by each), against the JSON check
//! every record already costs, on the same orders, in the same run (alternating
//! rounds, medians). `cargo bench --bench transform_chain`
//! prints it alone (a few seconds); the report includes it.

use lockgate::record::{Origin, Record};
use lockgate::transforms::{transform, transform_all, Applied};
use std::sync::Arc;
use std::time::Instant;

const RECORDS: usize = 200_000;
const ROUNDS: usize = 5;

const CHAIN: &str = r#"
[job]
name = "chain"
[checkpoint]
dir = "checkpoints"
[source.sequence]
to = 1
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
[sink.file]
dir = "out"
"#;

/// Runs both sides and returns the JSON report.
pub fn measure() -> serde_json::Value {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("chain.toml");
    std::fs::write(&path, CHAIN).expect("the chain's job file");
    let d = lockgate::config::describe(&path).expect("the chain's job file");
    let chain: Vec<(String, Arc<dyn lockgate::transforms::Smt>)> = d
        .transforms
        .iter()
        .map(|(kind, c)| {
            let a = c.downcast_ref::<Applied>().expect("a transform");
            (kind.clone(), a.0.clone())
        })
        .collect();
    let records: Vec<Record> = (0..RECORDS)
        .map(|i| Record {
            value: format!(
                "{{\"order\":{i},\"user\":\"user-{:04}\",\"amount\":{},\"note\":\"{:x<30}\"}}",
                i % 1000,
                1 + i % 500,
                ""
            )
            .into_bytes()
            .into(),
            origin: Some(Origin {
                stream: "orders".into(),
                partition: 0,
                offset: i as i64,
            }),
            timestamp: Some(1_700_000_000_000 + i as i64),
            ..Record::default()
        })
        .collect();
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
    let time_fused = || {
        let start = Instant::now();
        let mut bytes = 0;
        for r in &records {
            let mut out = Vec::with_capacity(1);
            transform_all(&chain, r.clone(), &mut out).expect("transformed");
            bytes += out[0].value.len();
        }
        std::hint::black_box(bytes);
        start.elapsed().as_nanos() as f64 / RECORDS as f64
    };
    let time_check = || {
        let start = Instant::now();
        for r in &records {
            lockgate::formats::json::validate_json(&r.value).expect("JSON");
        }
        start.elapsed().as_nanos() as f64 / RECORDS as f64
    };
    let (mut chained, mut fused, mut checked) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        if round % 2 == 0 {
            chained.push(time_chain());
            fused.push(time_fused());
            checked.push(time_check());
        } else {
            checked.push(time_check());
            fused.push(time_fused());
            chained.push(time_chain());
        }
        eprintln!(
            "round {round}: three transforms {:.0} ns/record step by step, {:.0} as one step, JSON check {:.0} ns/record",
            chained[round], fused[round], checked[round]
        );
    }
    let (c, f, j) = (
        super::median(chained),
        super::median(fused),
        super::median(checked),
    );
    serde_json::json!({
        "benchmark": "insert_field + replace_field + cast per record, as one step (parse once) and step by step, against the JSON check of the same record",
        "records": RECORDS,
        "rounds": ROUNDS,
        "record_bytes_mean": records.iter().map(|r| r.value.len()).sum::<usize>() / RECORDS,
        "step_by_step_ns_per_record": c.round(),
        "chain_ns_per_record": f.round(),
        "json_check_ns_per_record": j.round(),
        "ratio_chain_over_check": (f / j * 100.0).round() / 100.0,
    })
}
