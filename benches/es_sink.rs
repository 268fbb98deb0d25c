//! The Elasticsearch sink against a minimal hand-written bulk loop, into the same
//! in-memory ES-compatible test server, in the same run; printed as JSON.
//!
//! Both sides write the same `DOCS` records (100-byte JSON documents, ids
//! `{stream}-{partition}-{offset}`) into a fresh index per round, so every item is a
//! create. The sink is measured end to end: `invoke` with batches of 1024 records (as
//! the runtime delivers them), then one `snapshot`, which returns once everything is
//! written; default bulk settings (1000 actions per request, 2 requests in flight). The
//! raw loop builds the same NDJSON, 1000 actions per request, with 2 requests in flight,
//! and checks `errors == false` in each response. Records are made before the clock
//! starts, on both sides. Medians of `ROUNDS` alternating rounds.
//!
//! Every document goes into a request as one line of a JSON object (`action::frame`):
//! a third side feeds the sink the same documents pretty-printed (113 bytes, over five
//! lines), which it must re-serialize on one line, and the framing pass alone is timed
//! over both forms (nanoseconds per document, one thread).
//! `cargo bench --bench es_sink`.

use bytes::Bytes;
use elasticsearch::http::transport::{SingleNodeConnectionPool, TransportBuilder};
use elasticsearch::http::Url;
use elasticsearch::indices::IndicesDeleteParts;
use elasticsearch::{BulkParts, Elasticsearch};
use futures::StreamExt;
use lockgate::connectors::elasticsearch::action::frame;
use lockgate::connectors::elasticsearch::{
    ConfigActionBuilder, EsSink, EsSinkConfig, FailureHandler, ItemErrorPolicy,
    PolicyFailureHandler,
};
use lockgate::connectors::{Sink, SinkRestore, SubtaskInfo};
use lockgate::record::{Batch, Origin, Record};
use lockgate::state::CheckpointId;
use lockgate::testkit::es::EsServer;
use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

const DOCS: usize = 200_000;
const BATCH: usize = 1024;
const BULK_ACTIONS: usize = 1000;
const IN_FLIGHT: usize = 2;
const ROUNDS: usize = 5;
const STREAM: &str = "bench";

/// A document as the raw loop and the compact side send it (100 bytes).
fn compact(i: usize) -> Vec<u8> {
    format!(
        "{{\"partition\":0,\"i\":{i:>10},\"pad\":\"{}\"}}",
        "x".repeat(61)
    )
    .into_bytes()
}

/// The same document pretty-printed, as some producers write it.
fn pretty(i: usize) -> Vec<u8> {
    format!(
        "{{\n  \"partition\": 0,\n  \"i\": {i:>10},\n  \"pad\": \"{}\"\n}}",
        "x".repeat(61)
    )
    .into_bytes()
}

/// The records of one round, in runtime-sized batches.
fn batches() -> Vec<Batch> {
    batches_of(compact)
}

fn batches_of(doc: fn(usize) -> Vec<u8>) -> Vec<Batch> {
    let stream: Arc<str> = Arc::from(STREAM);
    let records: Vec<Record> = (0..DOCS)
        .map(|i| {
            let value = doc(i);
            Record {
                key: None,
                route_key: None,
                value: value.into(),
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

fn client(url: &str) -> Elasticsearch {
    let pool = SingleNodeConnectionPool::new(Url::parse(url).expect("url"));
    let transport = TransportBuilder::new(pool)
        .disable_proxy()
        .build()
        .expect("transport");
    Elasticsearch::new(transport)
}

#[derive(serde::Deserialize)]
struct BulkResponse {
    errors: bool,
}

/// The baseline: NDJSON by hand, `BULK_ACTIONS` per request, `IN_FLIGHT` at once.
async fn raw_loop(url: &str, index: &str, input: Vec<Batch>) -> f64 {
    let records: Vec<Record> = input.into_iter().flatten().collect();
    // The client is made on the clock, as the sink makes its own in `open`.
    let start = Instant::now();
    let client = &client(url);
    let requests = records.chunks(BULK_ACTIONS).map(|chunk| {
        let mut body = Vec::with_capacity(chunk.len() * 180);
        for r in chunk {
            let o = r.origin.as_ref().expect("origin");
            let _ = writeln!(
                body,
                "{{\"index\":{{\"_index\":\"{index}\",\"_id\":\"{}-{}-{}\"}}}}",
                o.stream, o.partition, o.offset
            );
            body.extend_from_slice(&r.value);
            body.push(b'\n');
        }
        async move {
            let response = client
                .bulk(BulkParts::None)
                .body(vec![Bytes::from(body)])
                .send()
                .await
                .expect("bulk request");
            assert_eq!(response.status_code().as_u16(), 200);
            let bytes = response.bytes().await.expect("bulk response");
            let r: BulkResponse = serde_json::from_slice(&bytes).expect("bulk response JSON");
            assert!(!r.errors, "bulk item errors");
        }
    });
    futures::stream::iter(requests)
        .buffer_unordered(IN_FLIGHT)
        .collect::<()>()
        .await;
    DOCS as f64 / start.elapsed().as_secs_f64()
}

/// lockgate's sink, from `open` to a completed `snapshot`.
async fn lockgate_sink(url: &str, index: &str, input: Vec<Batch>) -> f64 {
    let info = SubtaskInfo {
        job: "es-bench".into(),
        name: "sink-0".into(),
        index: 0,
        parallelism: 1,
        max_parallelism: 128,
    };
    let cfg = Arc::new(EsSinkConfig::new(url, index));
    let handler: Arc<dyn FailureHandler> = Arc::new(PolicyFailureHandler(ItemErrorPolicy::Fail));
    let start = Instant::now();
    let mut sink = EsSink::new(
        cfg.clone(),
        Box::new(ConfigActionBuilder::new(&cfg)),
        handler,
    );
    sink.open(&info, &SinkRestore::default())
        .await
        .expect("open");
    for batch in input {
        sink.invoke(batch).await.expect("invoke");
    }
    sink.snapshot(CheckpointId(1)).await.expect("snapshot");
    let secs = start.elapsed().as_secs_f64();
    sink.close().await.expect("close");
    DOCS as f64 / secs
}

/// Checks that `index` holds every document, then drops it (the store is in memory).
async fn check_and_drop(server: &EsServer, client: &Elasticsearch, index: &str) {
    let docs = server.documents(index);
    assert_eq!(docs.len(), DOCS, "{index} holds every document");
    assert!(docs.contains_key(&format!("{STREAM}-0-{}", DOCS - 1)));
    let r = client
        .indices()
        .delete(IndicesDeleteParts::Index(&[index]))
        .send()
        .await
        .expect("delete index");
    assert!(r.status_code().is_success());
}

/// Nanoseconds per document of the framing pass over `doc`'s documents.
fn framing_ns(doc: fn(usize) -> Vec<u8>) -> f64 {
    let docs: Vec<Vec<u8>> = (0..DOCS).map(doc).collect();
    let start = Instant::now();
    let mut rewritten = 0usize;
    for d in &docs {
        if frame(d).expect("a JSON object").is_some() {
            rewritten += 1;
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / DOCS as f64;
    std::hint::black_box(rewritten);
    ns
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    v[v.len() / 2]
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let server = rt
        .block_on(EsServer::start("127.0.0.1:0".parse().expect("addr")))
        .expect("test server");
    let es = client(server.url());
    assert_eq!((compact(0).len(), pretty(0).len()), (100, 113));
    let (mut raw, mut ours, mut ours_pretty) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let (raw_index, sink_index) = (format!("raw-{round}"), format!("sink-{round}"));
        let input = batches();
        let r = rt.block_on(raw_loop(server.url(), &raw_index, input));
        rt.block_on(check_and_drop(&server, &es, &raw_index));
        let input = batches();
        let l = rt.block_on(lockgate_sink(server.url(), &sink_index, input));
        rt.block_on(check_and_drop(&server, &es, &sink_index));
        let pretty_index = format!("pretty-{round}");
        let p = rt.block_on(lockgate_sink(
            server.url(),
            &pretty_index,
            batches_of(pretty),
        ));
        rt.block_on(check_and_drop(&server, &es, &pretty_index));
        eprintln!(
            "round {round}: raw bulk loop {r:.0} docs/s, lockgate sink {l:.0} docs/s, \
             pretty-printed input {p:.0} docs/s"
        );
        raw.push(r);
        ours.push(l);
        ours_pretty.push(p);
    }
    let stats = server.stats();
    assert_eq!(stats.bulk_items, (3 * ROUNDS * DOCS) as u64);
    let (r, l, p) = (median(raw), median(ours), median(ours_pretty));
    let (frame_compact, frame_pretty) = (framing_ns(compact), framing_ns(pretty));
    println!(
        "{}",
        serde_json::json!({
            "benchmark": "Elasticsearch sink vs a hand-written bulk loop, in-memory test server",
            "documents": DOCS,
            "document_bytes": 100,
            "batch_records": BATCH,
            "bulk_max_actions": BULK_ACTIONS,
            "max_in_flight": IN_FLIGHT,
            "rounds": ROUNDS,
            "raw_docs_per_sec": r.round(),
            "lockgate_docs_per_sec": l.round(),
            "ratio_lockgate_over_raw": (l / r * 1000.0).round() / 1000.0,
            "lockgate_pretty_printed_docs_per_sec": p.round(),
            "ratio_pretty_printed_over_compact": (p / l * 1000.0).round() / 1000.0,
            "framing_ns_per_compact_doc": frame_compact.round(),
            "framing_ns_per_pretty_printed_doc": frame_pretty.round(),
        })
    );
}
