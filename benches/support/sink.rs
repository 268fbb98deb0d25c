//! The Elasticsearch sink against a minimal hand-written bulk loop, into the same
//! in-memory ES-compatible test server, in the same run; printed as JSON.
//!
//! Both sides write the same `DOCS` records (100-byte JSON documents, ids
//! `{stream}-{partition}-{offset}`) into a fresh index per round, so every item is a
//! create; each index is checked (count and last document) and dropped after its
//! round, so that the in-memory server holds one index at a time. The sink is measured
//! end to end: `invoke` with batches of 1024 records (as the runtime delivers them),
//! then one `snapshot`, which returns once everything is written; default bulk
//! settings (1000 actions per request, 2 requests in flight). The raw loop builds the
//! same NDJSON bytes into one buffer per request, 1000 actions per request, with 2
//! requests in flight, through a client built by the sink's own connection settings,
//! sends each body as one `Bytes` (the sink's call), and checks `errors == false` in
//! each response. Records are made before the clock starts, on both sides, and freed
//! on the clock, on both sides (the sink drops each batch it took, the raw loop each
//! record it wrote). Medians of
//! `ROUNDS` rounds whose order alternates (raw first in even rounds, the sink first in
//! odd ones).
//!
//! The test server runs on its own runtime and threads (`es-server`), the clients on
//! another (`es-client`): a profile (`perf record -g`, `perf report --sort comm`)
//! separates the server's share of the cores from the client's.
//!
//! Every document goes into a request as one line of a JSON object (`action::frame`):
//! a third side feeds the sink the same documents pretty-printed (113 bytes, over five
//! lines), which it must re-serialize on one line, and the framing pass alone is timed
//! over both forms (nanoseconds per document, one thread).
//!
//! `ratio_lockgate_over_raw` (= `sink_ratio`) is the ratio of the two medians;
//! `ratio_lockgate_over_raw_median_of_rounds` the median of each round's ratio.
//!
//! The test server parses and stores every document and takes most of the two cores
//! (a profile: about 85% of the samples), so that figure moves with how the server's
//! share is scheduled. The faster baseline runs both sides again against a server that
//! only acknowledges (`ack_server.rs`): there the client's own cost per document
//! decides, and `ack_server_sink_ratio` compares the sink with the raw loop on it.
//!
//! `cargo bench --bench es_sink`: about 1.5 minutes on 2 idle cores (three sides of a
//! million documents, five rounds), longer on a busy machine; `bench_seconds` in the
//! JSON says how long it took. `LOCKGATE_BENCH_DOCS` and `LOCKGATE_BENCH_ROUNDS`
//! override the size; `LOCKGATE_BENCH_ONLY=raw` or `=sink` runs one side alone (for a
//! profile) and prints no JSON, `=ack-raw` or `=ack-sink` one side against the
//! acknowledging server.

use super::ack_server::AckServer;
use super::median;
use bytes::Bytes;
use elasticsearch::http::headers::HeaderMap;
use elasticsearch::http::Method;
use elasticsearch::indices::IndicesDeleteParts;
use elasticsearch::{CountParts, Elasticsearch, GetParts};
use futures::StreamExt;
use lockgate::connectors::elasticsearch::action::frame;
use lockgate::connectors::elasticsearch::{
    ConfigActionBuilder, EsSink, EsSinkConfig, FailureHandler, PolicyFailureHandler,
};
use lockgate::connectors::{Sink, SinkRestore, SubtaskInfo};
use lockgate::dead_letter::OnError;
use lockgate::record::{Batch, Origin, Record};
use lockgate::state::CheckpointId;
use lockgate::testkit::es::EsServer;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const DOCS: usize = 1_000_000;
const BATCH: usize = 1024;
const BULK_ACTIONS: usize = 1000;
const IN_FLIGHT: usize = 2;
pub const ROUNDS: usize = 5;
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
fn batches_of(docs: usize, doc: fn(usize) -> Vec<u8>) -> Vec<Batch> {
    let stream: Arc<str> = Arc::from(STREAM);
    (0..docs)
        .step_by(BATCH)
        .map(|from| {
            (from..(from + BATCH).min(docs))
                .map(|i| Record {
                    value: doc(i).into(),
                    origin: Some(Origin {
                        stream: stream.clone(),
                        partition: 0,
                        offset: i as i64,
                    }),
                    ..Default::default()
                })
                .collect()
        })
        .collect()
}

/// The sink's configuration; the raw loop's client is built from it too.
fn config(url: &str, index: &str) -> EsSinkConfig {
    EsSinkConfig::new(url, index)
}

/// A client with the sink's connection settings (timeout, proxy, compression, headers).
fn client(url: &str) -> Elasticsearch {
    let cfg = config(url, "unused");
    let timeout = Duration::from_millis(cfg.request_timeout_ms);
    Elasticsearch::new(cfg.connection.transport(0, timeout).expect("transport"))
}

#[derive(serde::Deserialize)]
struct BulkResponse {
    errors: bool,
}

/// The request bodies of the raw loop, `BULK_ACTIONS` actions each, made as they are
/// needed; each record is dropped once written, as the sink drops each batch it took.
struct Bodies<'a> {
    index: &'a str,
    batches: std::vec::IntoIter<Batch>,
    records: std::vec::IntoIter<Record>,
}

impl Iterator for Bodies<'_> {
    type Item = Vec<u8>;

    fn next(&mut self) -> Option<Vec<u8>> {
        let mut body = Vec::with_capacity(BULK_ACTIONS * 192);
        let mut actions = 0;
        while actions < BULK_ACTIONS {
            let Some(r) = self.records.next() else {
                match self.batches.next() {
                    Some(b) => {
                        self.records = b.into_iter();
                        continue;
                    }
                    None => break,
                }
            };
            let o = r.origin.as_ref().expect("origin");
            let _ = writeln!(
                body,
                "{{\"index\":{{\"_index\":\"{}\",\"_id\":\"{}-{}-{}\"}}}}",
                self.index, o.stream, o.partition, o.offset
            );
            body.extend_from_slice(&r.value);
            body.push(b'\n');
            actions += 1;
        }
        (actions > 0).then_some(body)
    }
}

/// The baseline: NDJSON by hand, `BULK_ACTIONS` per request, `IN_FLIGHT` at once.
async fn raw_loop(url: &str, index: &str, input: Vec<Batch>) -> f64 {
    let docs: usize = input.iter().map(Vec::len).sum();
    // The client is made on the clock, as the sink makes its own in `open`.
    let start = Instant::now();
    let client = &client(url);
    let bodies = Bodies {
        index,
        batches: input.into_iter(),
        records: Vec::new().into_iter(),
    };
    let requests = bodies.map(|body| async move {
        let response = client
            .transport()
            .send(
                Method::Post,
                "/_bulk",
                HeaderMap::new(),
                None::<&()>,
                Some(Bytes::from(body)),
                None,
            )
            .await
            .expect("bulk request");
        assert_eq!(response.status_code().as_u16(), 200);
        let bytes = response.bytes().await.expect("bulk response");
        let r: BulkResponse = serde_json::from_slice(&bytes).expect("bulk response JSON");
        assert!(!r.errors, "bulk item errors");
    });
    futures::stream::iter(requests)
        .buffer_unordered(IN_FLIGHT)
        .collect::<()>()
        .await;
    docs as f64 / start.elapsed().as_secs_f64()
}

/// lockgate's sink, from `open` to a completed `snapshot`.
async fn lockgate_sink(url: &str, index: &str, input: Vec<Batch>) -> f64 {
    let docs: usize = input.iter().map(Vec::len).sum();
    let (secs, mut sink) = through_sink(Arc::new(config(url, index)), input).await;
    sink.close().await.expect("close");
    docs as f64 / secs
}

/// Writes `input` through a new sink of `cfg` that fails on any refused document: `open`,
/// `invoke` per batch, one `snapshot` (which returns once everything is written).
/// Returns the seconds from `open` to the completed snapshot, and the open sink.
pub async fn through_sink(cfg: Arc<EsSinkConfig>, input: Vec<Batch>) -> (f64, EsSink) {
    let info = SubtaskInfo::new("es-bench", "sink-0", 0, 1);
    let handler: Arc<dyn FailureHandler> = Arc::new(PolicyFailureHandler(OnError::Fail));
    let start = Instant::now();
    let mut sink = EsSink::new(
        cfg.clone(),
        // Each record reaches the sink once, as in a job file.
        Box::new(ConfigActionBuilder::new(&cfg).origins_unique()),
        handler,
    );
    sink.open(&info, &SinkRestore::default())
        .await
        .expect("open");
    for batch in input {
        sink.invoke(batch).await.expect("invoke");
    }
    sink.snapshot(CheckpointId(1)).await.expect("snapshot");
    (start.elapsed().as_secs_f64(), sink)
}

/// Checks that `index` holds `docs` documents, the last one included, then drops it
/// (the store is in memory).
async fn check_and_drop(client: &Elasticsearch, index: &str, docs: usize) {
    let r = client
        .count(CountParts::Index(&[index]))
        .send()
        .await
        .expect("count");
    let count: serde_json::Value = r.json().await.expect("count JSON");
    assert_eq!(count["count"], docs as u64, "{index} holds every document");
    let last = format!("{STREAM}-0-{}", docs - 1);
    let r = client
        .get(GetParts::IndexId(index, &last))
        .send()
        .await
        .expect("get");
    assert!(r.status_code().is_success(), "{index} holds {last}");
    let r = client
        .indices()
        .delete(IndicesDeleteParts::Index(&[index]))
        .send()
        .await
        .expect("delete index");
    assert!(r.status_code().is_success());
}

/// Nanoseconds per document of the framing pass over `doc`'s documents.
fn framing_ns(docs: usize, doc: fn(usize) -> Vec<u8>) -> f64 {
    let docs: Vec<Vec<u8>> = (0..docs).map(doc).collect();
    let start = Instant::now();
    let mut rewritten = 0usize;
    for d in &docs {
        if frame(d).expect("a JSON object").is_some() {
            rewritten += 1;
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / docs.len() as f64;
    std::hint::black_box(rewritten);
    ns
}

/// The measurement with its defaults, or the sizes of `LOCKGATE_BENCH_DOCS` and
/// `LOCKGATE_BENCH_ROUNDS`: the JSON report.
pub fn measure() -> serde_json::Value {
    measure_with(
        super::env_or("LOCKGATE_BENCH_DOCS", DOCS),
        super::env_or("LOCKGATE_BENCH_ROUNDS", ROUNDS),
        None,
    )
    .expect("both sides ran")
}

/// Runs `rounds` alternating rounds of `docs` documents and returns the JSON report;
/// `only` (`raw` or `sink`) runs one side alone, for a profile, and returns nothing.
pub fn measure_with(docs: usize, rounds: usize, only: Option<&str>) -> Option<serde_json::Value> {
    let started = Instant::now();
    let (run_raw, run_sink, ack_only) = match only {
        None => (true, true, false),
        Some("raw") => (true, false, false),
        Some("sink") => (false, true, false),
        Some("ack-raw") => (true, false, true),
        Some("ack-sink") => (false, true, true),
        Some(other) => panic!("LOCKGATE_BENCH_ONLY={other}: raw, sink, ack-raw or ack-sink"),
    };
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .thread_name("es-server")
        .enable_all()
        .build()
        .expect("server runtime");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .thread_name("es-client")
        .enable_all()
        .build()
        .expect("client runtime");
    let server = server_rt
        .block_on(EsServer::start("127.0.0.1:0".parse().expect("addr")))
        .expect("test server");
    let es = client(server.url());
    assert_eq!((compact(0).len(), pretty(0).len()), (100, 113));
    let (mut raw, mut ours, mut ours_pretty) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..if ack_only { 0 } else { rounds } {
        let mut line = format!("round {round}:");
        let mut run_raw_side = |line: &mut String| {
            let index = format!("raw-{round}");
            let r = rt.block_on(raw_loop(server.url(), &index, batches_of(docs, compact)));
            rt.block_on(check_and_drop(&es, &index, docs));
            line.push_str(&format!(" raw bulk loop {r:.0} docs/s,"));
            raw.push(r);
        };
        let mut run_sink_side = |line: &mut String| {
            let index = format!("sink-{round}");
            let l = rt.block_on(lockgate_sink(
                server.url(),
                &index,
                batches_of(docs, compact),
            ));
            rt.block_on(check_and_drop(&es, &index, docs));
            line.push_str(&format!(" lockgate sink {l:.0} docs/s,"));
            ours.push(l);
        };
        if round % 2 == 0 {
            if run_raw {
                run_raw_side(&mut line);
            }
            if run_sink {
                run_sink_side(&mut line);
            }
        } else {
            if run_sink {
                run_sink_side(&mut line);
            }
            if run_raw {
                run_raw_side(&mut line);
            }
        }
        if only.is_none() {
            let index = format!("pretty-{round}");
            let p = rt.block_on(lockgate_sink(
                server.url(),
                &index,
                batches_of(docs, pretty),
            ));
            rt.block_on(check_and_drop(&es, &index, docs));
            line.push_str(&format!(" pretty-printed input {p:.0} docs/s"));
            ours_pretty.push(p);
        }
        eprintln!("{}", line.trim_end_matches(','));
    }
    if only.is_some() && !ack_only {
        return None;
    }
    // The faster baseline: both sides again, against a server that only acknowledges,
    // so that the client's own cost decides (the test server takes most of the cores).
    let ack = server_rt.block_on(AckServer::start());
    let (mut ack_raw, mut ack_ours) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let raw_first = round % 2 == 0;
        for raw_side in [raw_first, !raw_first] {
            if raw_side && run_raw {
                let r = rt.block_on(raw_loop(ack.url(), "ack", batches_of(docs, compact)));
                ack_raw.push(r);
            } else if !raw_side && run_sink {
                let l = rt.block_on(lockgate_sink(ack.url(), "ack", batches_of(docs, compact)));
                ack_ours.push(l);
            }
        }
        eprintln!(
            "ack-only server, round {round}: raw bulk loop {:.0} docs/s, lockgate sink {:.0} docs/s",
            ack_raw.get(round).unwrap_or(&0.0),
            ack_ours.get(round).unwrap_or(&0.0)
        );
    }
    if only.is_some() {
        return None;
    }
    assert_eq!(
        ack.items(),
        (2 * rounds * docs) as u64,
        "every action acknowledged"
    );
    let (ack_r, ack_l) = (median(ack_raw), median(ack_ours));
    let stats = server.stats();
    assert_eq!(stats.bulk_items, (3 * rounds * docs) as u64);
    // Each round's two sides ran back to back: their ratio is the side-by-side figure
    // least moved by load that changes between rounds.
    let round_ratios: Vec<f64> = raw.iter().zip(&ours).map(|(r, l)| l / r).collect();
    let round_ratio = median(round_ratios);
    let (r, l, p) = (median(raw), median(ours), median(ours_pretty));
    let (frame_compact, frame_pretty) = (framing_ns(docs, compact), framing_ns(docs, pretty));
    Some(serde_json::json!({
        "benchmark": "Elasticsearch sink vs a hand-written bulk loop, in-memory test server",
        "documents": docs,
        "document_bytes": 100,
        "batch_records": BATCH,
        "bulk_max_actions": BULK_ACTIONS,
        "max_in_flight": IN_FLIGHT,
        "rounds": rounds,
        "raw_docs_per_sec": r.round(),
        "lockgate_docs_per_sec": l.round(),
        "ratio_lockgate_over_raw": (l / r * 1000.0).round() / 1000.0,
        "sink_ratio": (l / r * 1000.0).round() / 1000.0,
        "ratio_lockgate_over_raw_median_of_rounds": (round_ratio * 1000.0).round() / 1000.0,
        "lockgate_pretty_printed_docs_per_sec": p.round(),
        "ratio_pretty_printed_over_compact": (p / l * 1000.0).round() / 1000.0,
        "framing_ns_per_compact_doc": frame_compact.round(),
        "framing_ns_per_pretty_printed_doc": frame_pretty.round(),
        "ack_server_raw_docs_per_sec": ack_r.round(),
        "ack_server_lockgate_docs_per_sec": ack_l.round(),
        "ack_server_sink_ratio": (ack_l / ack_r * 1000.0).round() / 1000.0,
        "bench_seconds": started.elapsed().as_secs(),
    }))
}
