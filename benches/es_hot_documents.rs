//! Hot documents against a slow cluster: `RECORDS` running totals of `USERS` users (as
//! `rolling_sum` emits them: the whole record, `id = "field:/user"`), written by the
//! Elasticsearch sink to the in-memory test server while it delays every response by
//! `LATENCY_MS`. Measured: actions per second from the first record to a completed
//! checkpoint flush (everything written), for each way of writing a hot document, in
//! the same run. Every user's final total is checked. Printed as JSON.
//! `cargo bench --bench es_hot_documents`.

mod support;

use lockgate::connectors::elasticsearch::{EsSinkConfig, IdStrategy, Operation, Versioning};
use lockgate::connectors::Sink;
use lockgate::record::{Batch, Origin, Record};
use lockgate::testkit::es::{EsServer, Faults};
use std::sync::Arc;

const RECORDS: usize = 20_000;
const USERS: usize = 100;
const BATCH: usize = 1024;
const LATENCY_MS: u64 = 100;

/// The running totals, in runtime-sized batches; offsets are the record's position.
fn batches() -> Vec<Batch> {
    let stream: Arc<str> = Arc::from("orders");
    let mut totals = vec![0u64; USERS];
    let records: Vec<Record> = (0..RECORDS)
        .map(|i| {
            let user = (i * 7) % USERS;
            totals[user] += 1 + (i as u64 % 5);
            Record {
                key: None,
                route_key: None,
                value: format!(
                    "{{\"user\":\"user-{user:03}\",\"amount\":{},\"total\":{}}}",
                    1 + i % 5,
                    totals[user]
                )
                .into_bytes()
                .into(),
                origin: Some(Origin {
                    stream: stream.clone(),
                    partition: 0,
                    offset: i as i64,
                }),
                ..Default::default()
            }
        })
        .collect();
    records.chunks(BATCH).map(<[Record]>::to_vec).collect()
}

fn expected_totals() -> Vec<u64> {
    let mut totals = vec![0u64; USERS];
    for i in 0..RECORDS {
        totals[(i * 7) % USERS] += 1 + (i as u64 % 5);
    }
    totals
}

/// The sink from `open` to a completed checkpoint flush; actions per second.
async fn run(url: &str, cfg: EsSinkConfig) -> f64 {
    let cfg = Arc::new(EsSinkConfig {
        connection: lockgate::connectors::elasticsearch::EsConnection::single(url),
        ..cfg
    });
    let (secs, mut sink) = support::sink::through_sink(cfg.clone(), batches()).await;
    let counters = sink.counters();
    eprintln!(
        "  {:<40} {:>9.0} actions/s, {} bulk requests, {} coalesced",
        cfg.index,
        RECORDS as f64 / secs,
        counters.bulks(),
        counters.coalesced()
    );
    sink.close().await.expect("close");
    RECORDS as f64 / secs
}

fn check(server: &EsServer, index: &str) {
    let docs = server.documents(index);
    assert_eq!(docs.len(), USERS, "{index}: one document per user");
    for (user, want) in expected_totals().into_iter().enumerate() {
        let (doc, _) = &docs[&format!("user-{user:03}")];
        assert_eq!(doc["total"], want, "{index}: user-{user:03}");
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let server = rt
        .block_on(EsServer::start("127.0.0.1:0".parse().expect("addr")))
        .expect("test server");
    server.set_faults(Faults {
        latency_ms: LATENCY_MS,
        ..Faults::default()
    });
    let base = |index: &str| {
        let mut c = EsSinkConfig::new("", index);
        c.id = IdStrategy::Field("/user".into());
        c.operation = Operation::Upsert;
        c
    };
    let variants: Vec<(&str, EsSinkConfig)> = vec![
        ("upsert-coalesced", base("upsert-coalesced")),
        (
            "upsert-not-coalesced",
            EsSinkConfig {
                coalesce: false,
                ..base("upsert-not-coalesced")
            },
        ),
        (
            "index-external-versions-coalesced",
            EsSinkConfig {
                operation: Operation::Index,
                versioning: Versioning::External,
                ..base("index-external-versions-coalesced")
            },
        ),
        (
            "index-external-versions-not-coalesced",
            EsSinkConfig {
                operation: Operation::Index,
                versioning: Versioning::External,
                coalesce: false,
                ..base("index-external-versions-not-coalesced")
            },
        ),
    ];
    eprintln!("{RECORDS} records, {USERS} documents, {LATENCY_MS} ms per response:");
    let mut results = serde_json::Map::new();
    for (name, cfg) in variants {
        let rate = rt.block_on(run(server.url(), cfg));
        check(&server, name);
        results.insert(format!("{name}_actions_per_sec"), rate.round().into());
    }
    println!(
        "{}",
        serde_json::json!({
            "benchmark": "hot documents: running totals upserted by user against a slow test server",
            "records": RECORDS,
            "documents": USERS,
            "response_latency_ms": LATENCY_MS,
            "results": results,
        })
    );
}
