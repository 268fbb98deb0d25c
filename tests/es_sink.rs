//! The Elasticsearch sink's checkpoint contract, over HTTP against the test server
//! (Flink's ElasticsearchSinkBase tests: failures rethrown on invoke, on checkpoint,
//! on checkpoint after a flush started; at-least-once flush).

use lockgate::connectors::elasticsearch::{
    ConfigActionBuilder, EsSink, EsSinkConfig, FailureHandler, IdStrategy, PolicyFailureHandler,
};
use lockgate::connectors::{Sink, SinkRestore, SubtaskInfo};
use lockgate::dead_letter::OnError;
use lockgate::record::{Origin, Record};
use lockgate::state::CheckpointId;
use lockgate::testkit::es::{EsServer, Faults};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn info() -> SubtaskInfo {
    SubtaskInfo::new("t", "sink-0", 0, 1)
}

fn rec(offset: i64, doc: &str) -> Record {
    Record {
        key: None,
        route_key: None,
        value: doc.as_bytes().to_vec().into(),
        origin: Some(Origin {
            stream: Arc::from("orders"),
            partition: 0,
            offset,
        }),
        ..Default::default()
    }
}

async fn server_with_mapping() -> EsServer {
    let s = EsServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let c = reqwest::Client::new();
    let r = c
        .put(format!("{}/orders", s.url()))
        .json(&serde_json::json!({"mappings": {"properties": {"amount": {"type": "long"}}}}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    s
}

fn config(s: &EsServer) -> EsSinkConfig {
    let mut c = EsSinkConfig::new(s.url(), "orders");
    c.id = IdStrategy::Coordinates;
    c.bulk_flush_interval_ms = 60_000;
    c.retry_initial_ms = 20;
    c.retry_max_ms = 100;
    c.flush_timeout_ms = 10_000;
    c
}

async fn sink(cfg: EsSinkConfig) -> EsSink {
    let cfg = Arc::new(cfg);
    let handler: Arc<dyn FailureHandler> = Arc::new(PolicyFailureHandler(OnError::Fail));
    let mut s = EsSink::new(
        cfg.clone(),
        Box::new(ConfigActionBuilder::new(&cfg)),
        handler,
    );
    s.open(&info(), &SinkRestore::default()).await.unwrap();
    s
}

/// Waits for a state of the sink or the server; the deadline is an upper bound only.
async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

const BAD: &str = r#"{"amount":"not a number"}"#;
const GOOD: &str = r#"{"amount":1}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn item_failure_is_rethrown_on_the_next_record() {
    let server = server_with_mapping().await;
    let mut cfg = config(&server);
    cfg.bulk_max_actions = 1;
    let mut s = sink(cfg).await;
    s.invoke(vec![rec(7, BAD)]).await.unwrap();
    let counters = s.counters();
    wait_until("the failure", || counters.failure().is_some()).await;
    let err = s.invoke(vec![rec(8, GOOD)]).await.unwrap_err().to_string();
    assert!(
        err.contains("orders-0-7") && err.contains("document_parsing_exception"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn item_failure_is_rethrown_on_the_next_checkpoint() {
    let server = server_with_mapping().await;
    let mut s = sink(config(&server)).await;
    s.invoke(vec![rec(1, GOOD), rec(2, BAD)]).await.unwrap();
    assert_eq!(
        server.stats().bulk_requests,
        0,
        "nothing sent before the checkpoint"
    );
    let err = s.snapshot(CheckpointId(1)).await.unwrap_err().to_string();
    assert!(
        err.contains("orders-0-2") && err.contains("failed to parse field [amount]"),
        "{err}"
    );
    // The request asked for a filtered response, and the item's error came through it.
    let stats = server.stats();
    assert!(stats.bulk_requests > 0);
    assert_eq!(stats.filtered_bulk_requests, stats.bulk_requests);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn item_failure_is_rethrown_on_a_checkpoint_after_the_flush_started() {
    let server = server_with_mapping().await;
    // The server holds the bulk until the stall is cleared.
    server.set_faults(Faults {
        stall: true,
        ..Default::default()
    });
    let mut cfg = config(&server);
    cfg.bulk_max_actions = 1;
    let mut s = sink(cfg).await;
    s.invoke(vec![rec(3, BAD)]).await.unwrap();
    wait_until("the bulk in flight", || server.stats().bulk_requests == 1).await;
    assert!(
        s.counters().failure().is_none(),
        "the response is not back yet"
    );
    // The checkpoint starts while the bulk is held; the response comes back after.
    let (r, ()) = tokio::join!(s.snapshot(CheckpointId(1)), async {
        server.set_faults(Faults::default());
    });
    let err = r.unwrap_err().to_string();
    assert!(err.contains("orders-0-3"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_bulk_failure_is_rethrown_on_the_next_record_and_checkpoint() {
    let server = server_with_mapping().await;
    server.set_faults(Faults {
        fail_requests_status: 403,
        fail_requests: 100,
        ..Default::default()
    });
    let mut cfg = config(&server);
    cfg.bulk_max_actions = 1;
    let mut s = sink(cfg).await;
    s.invoke(vec![rec(1, GOOD)]).await.unwrap();
    let counters = s.counters();
    wait_until("the failure", || counters.failure().is_some()).await;
    let err = s.invoke(vec![rec(2, GOOD)]).await.unwrap_err().to_string();
    assert!(err.contains("403"), "{err}");
    let err = s.snapshot(CheckpointId(1)).await.unwrap_err().to_string();
    assert!(err.contains("403"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_item_keeps_the_checkpoint_waiting_until_it_is_written() {
    let server = server_with_mapping().await;
    server.set_faults(Faults {
        reject_ids: ["orders-0-5".to_string()].into(),
        ..Default::default()
    });
    let mut cfg = config(&server);
    cfg.retry_max_attempts = 1000;
    let mut s = sink(cfg).await;
    s.invoke(vec![rec(4, GOOD), rec(5, GOOD)]).await.unwrap();
    let counters = s.counters();
    let snapshot = tokio::spawn(async move {
        let r = s.snapshot(CheckpointId(1)).await;
        (s, r)
    });
    // The first flush wrote one item; the rejected one stays pending and is retried.
    wait_until("a retry", || server.stats().bulk_requests >= 2).await;
    assert_eq!(counters.pending(), 1, "the retried item is still pending");
    assert!(!snapshot.is_finished(), "the checkpoint waits for it");
    assert_eq!(server.documents("orders").len(), 1);
    server.set_faults(Faults::default());
    let (_s, r) = snapshot.await.unwrap();
    r.unwrap();
    assert_eq!(counters.pending(), 0);
    assert_eq!(
        server.documents("orders").len(),
        2,
        "acknowledged means written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_flush_on_checkpoint_the_checkpoint_does_not_wait() {
    let server = server_with_mapping().await;
    server.set_faults(Faults {
        stall: true,
        ..Default::default()
    });
    let mut cfg = config(&server);
    cfg.flush_on_checkpoint = false;
    cfg.bulk_max_actions = 1;
    let mut s = sink(cfg).await;
    s.invoke(vec![rec(1, GOOD)]).await.unwrap();
    // The server holds every bulk until the stall is cleared, so a checkpoint that waited
    // for the action would never succeed (it would be declined after flush_timeout_ms).
    tokio::time::timeout(Duration::from_secs(60), s.snapshot(CheckpointId(1)))
        .await
        .expect("no wait")
        .unwrap();
    assert_eq!(s.pending(), 1, "acknowledged with the action still pending");
    server.set_faults(Faults::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_that_cannot_flush_in_time_is_declined() {
    let server = server_with_mapping().await;
    server.set_faults(Faults {
        stall: true,
        ..Default::default()
    });
    let mut cfg = config(&server);
    cfg.flush_timeout_ms = 300;
    let mut s = sink(cfg).await;
    s.invoke(vec![rec(1, GOOD)]).await.unwrap();
    let err = s.snapshot(CheckpointId(1)).await.unwrap_err();
    assert!(
        matches!(err, lockgate::error::JobError::Declined(_)),
        "{err}"
    );
    server.set_faults(Faults::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_sent_before_the_nth_action_of_bulk_max_actions() {
    let server = server_with_mapping().await;
    let mut cfg = config(&server);
    cfg.bulk_max_actions = 5;
    let mut s = sink(cfg).await;
    s.invoke((0..4).map(|i| rec(i, GOOD)).collect())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(server.stats().bulk_requests, 0, "four actions: no bulk yet");
    s.invoke(vec![rec(4, GOOD)]).await.unwrap();
    wait_until("the bulk", || server.stats().bulk_requests == 1).await;
    assert_eq!(server.stats().bulk_items, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flush_interval_sends_a_partial_bulk() {
    let server = server_with_mapping().await;
    let mut cfg = config(&server);
    cfg.bulk_flush_interval_ms = 100;
    let mut s = sink(cfg).await;
    s.invoke(vec![rec(1, GOOD)]).await.unwrap();
    wait_until("the interval flush", || server.stats().bulk_requests == 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_413_splits_the_bulk_and_a_dropped_response_is_retried_idempotently() {
    let server = server_with_mapping().await;
    server.set_faults(Faults {
        max_body_bytes: 200,
        drop_responses: 1,
        ..Default::default()
    });
    let mut s = sink(config(&server)).await;
    s.invoke((0..8).map(|i| rec(i, GOOD)).collect())
        .await
        .unwrap();
    s.snapshot(CheckpointId(1)).await.unwrap();
    let stats = server.stats();
    assert!(
        stats.too_large >= 1 && stats.dropped_responses == 1,
        "{stats:?}"
    );
    let docs = server.documents("orders");
    assert_eq!(docs.len(), 8);
    assert!(
        docs.values().any(|(_, v)| *v == 2),
        "the dropped response's items were written again, same ids"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_handler_can_requeue_a_refused_action_elsewhere() {
    use lockgate::connectors::elasticsearch::{BulkAction, FailureDecision, ItemFailure};
    struct Reroute;
    impl FailureHandler for Reroute {
        fn on_failure(&self, action: &BulkAction, failure: &ItemFailure) -> FailureDecision {
            assert_eq!(failure.error_type, "invalid_index_name_exception");
            let mut a = action.clone();
            a.index = "fixed".into();
            FailureDecision::Requeue(vec![a])
        }
    }
    let server = server_with_mapping().await;
    let cfg = Arc::new(config(&server));
    let builder = |r: &Record, out: &mut Vec<BulkAction>| {
        out.push(BulkAction::index(
            "BAD",
            Some(r.origin.as_ref().unwrap().offset.to_string()),
            r.value.to_vec(),
        ));
        Ok(())
    };
    let mut s = EsSink::new(cfg, Box::new(builder), Arc::new(Reroute));
    s.open(&info(), &SinkRestore::default()).await.unwrap();
    s.invoke(vec![rec(1, GOOD), rec(2, GOOD)]).await.unwrap();
    s.snapshot(CheckpointId(1)).await.unwrap();
    assert_eq!(s.pending(), 0);
    assert_eq!(server.documents("fixed").len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_update_never_overtakes_a_retried_one_on_the_same_document() {
    use lockgate::connectors::elasticsearch::Operation;
    let server = server_with_mapping().await;
    server.set_faults(Faults {
        reject_ids: ["u".to_string()].into(),
        ..Default::default()
    });
    let mut cfg = config(&server);
    cfg.bulk_max_actions = 1;
    cfg.max_in_flight = 2;
    // The first retry comes 1 to 2 s after the rejection: the second update is added
    // well within that window.
    cfg.retry_initial_ms = 2000;
    cfg.retry_max_ms = 2000;
    cfg.retry_max_attempts = 100;
    cfg.operation = Operation::Upsert;
    cfg.id = IdStrategy::Field("/id".into());
    let mut s = sink(cfg).await;
    s.invoke(vec![rec(1, r#"{"id":"u","total":1}"#)])
        .await
        .unwrap();
    wait_until("the first update rejected", || {
        server.stats().rejected_items >= 1
    })
    .await;
    // The first update now waits for its retry; the second must wait behind it.
    server.set_faults(Faults::default());
    s.invoke(vec![rec(2, r#"{"id":"u","total":2}"#)])
        .await
        .unwrap();
    s.snapshot(CheckpointId(1)).await.unwrap();
    let docs = server.documents("orders");
    assert_eq!(
        docs["u"].0["total"],
        serde_json::json!(2),
        "the newer update is the one that stays"
    );
}

/// A pretty-printed record (line breaks are legal JSON whitespace) is written on one
/// line; a record that would add bulk actions of its own never reaches a request: it
/// follows on_item_error (here fail, naming the record).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_can_never_break_or_extend_a_bulk_request() {
    let server = server_with_mapping().await;
    let mut s = sink(config(&server)).await;
    s.invoke(vec![rec(1, "{\n  \"amount\": 5,\n  \"user\": \"u1\"\n}\n")])
        .await
        .unwrap();
    s.snapshot(CheckpointId(1)).await.unwrap();
    let docs = server.documents("orders");
    assert_eq!(docs["orders-0-1"].0["amount"], 5, "{docs:?}");
    assert_eq!(server.stats().bulk_items, 1);

    let smuggler = "x\n{\"delete\":{\"_index\":\"orders\",\"_id\":\"orders-0-1\"}}";
    // It follows on_item_error (fail): raised at the next checkpoint at the latest.
    s.invoke(vec![rec(2, smuggler)]).await.unwrap();
    let err = s.snapshot(CheckpointId(2)).await.unwrap_err().to_string();
    assert!(
        err.contains("orders/0@2") && err.contains("not a JSON object"),
        "{err}"
    );
    assert_eq!(server.stats().bulk_items, 1, "nothing more was sent");
    assert!(server.documents("orders").contains_key("orders-0-1"));
}

/// `buffer_max_bytes`: the sink stops taking records while the actions it holds
/// (buffered and in flight) would pass the limit; an action larger than the limit is
/// admitted alone; with a buffer smaller than a bulk request and no interval flush in
/// sight, a full buffer is sent at once (nothing stalls); a checkpoint's flush drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sink_holds_at_most_buffer_max_bytes_and_a_larger_action_passes_alone() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const LIMIT: usize = 64 * 1024;
    const LARGE: usize = 200 * 1024;
    let server = server_with_mapping().await;
    server.set_faults(Faults {
        latency_ms: 50,
        ..Default::default()
    });
    let mut cfg = config(&server); // bulk_flush_interval_ms = 60 s
    cfg.buffer_max_bytes = LIMIT;
    let mut s = sink(cfg).await;
    let counters = s.counters();
    let (peak, stop) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let sampler = {
        let (peak, stop, counters) = (peak.clone(), stop.clone(), counters.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                peak.fetch_max(counters.buffered_bytes(), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let doc = |i: i64, pad: usize| format!(r#"{{"amount":{i},"pad":"{}"}}"#, "x".repeat(pad));
    let run = async {
        for i in 0..40 {
            s.invoke(vec![rec(i, &doc(i, 10 * 1024))]).await.unwrap();
        }
        s.invoke(vec![rec(40, &doc(40, LARGE))]).await.unwrap();
        s.invoke(vec![rec(41, &doc(41, 10))]).await.unwrap();
        s.snapshot(CheckpointId(1)).await.unwrap();
    };
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the sink stalled: a full buffer must be sent, a large action admitted");
    stop.store(true, Ordering::SeqCst);
    sampler.await.unwrap();
    let peak = peak.load(Ordering::SeqCst);
    // Each record is its own batch: held bytes never pass max(limit, one batch). A
    // batch counts its lines and the sink's bookkeeping for its action (under 2 KiB).
    let one_large = LARGE + 200 + 2048;
    assert!(peak <= one_large, "held {peak} bytes");
    assert!(
        peak >= LARGE,
        "the large action was admitted (and seen held): peak {peak}"
    );
    assert_eq!((s.pending(), counters.buffered_bytes()), (0, 0));
    assert_eq!(server.documents("orders").len(), 42, "everything written");
}

/// A sink of job `t` reporting in the returned telemetry, with `handler`.
async fn sink_reporting(
    cfg: EsSinkConfig,
    handler: Arc<dyn FailureHandler>,
) -> (EsSink, lockgate::telemetry::Telemetry) {
    let telemetry = lockgate::telemetry::Telemetry::new("t", "", 1, 128);
    let cfg = Arc::new(cfg);
    let mut s = EsSink::new(
        cfg.clone(),
        Box::new(ConfigActionBuilder::new(&cfg)),
        handler,
    );
    let info = info().with_telemetry(telemetry.clone());
    s.open(&info, &SinkRestore::default()).await.unwrap();
    (s, telemetry)
}

fn failing() -> Arc<dyn FailureHandler> {
    Arc::new(PolicyFailureHandler(OnError::Fail))
}

/// The sink subtask's series of one outcome of `vec`.
fn outcome(vec: &prometheus::IntCounterVec, outcome: &str) -> u64 {
    vec.with_label_values(&["t", "sink", "0", outcome]).get()
}

/// Every outcome of `vec` that is not 0, sorted.
fn outcomes(vec: &prometheus::IntCounterVec, all: &[&'static str]) -> Vec<(&'static str, u64)> {
    all.iter()
        .map(|o| (*o, outcome(vec, o)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

const REQUEST_OUTCOMES: &[&str] = &["ok", "item_errors", "retried", "too_large", "failed"];
const ITEM_OUTCOMES: &[&str] = &[
    "created",
    "updated",
    "deleted",
    "not_found",
    "conflict_already_written",
    "retried",
    "dead_lettered",
    "dropped",
    "requeued",
    "failed",
];

fn task_gauge(vec: &prometheus::IntGaugeVec) -> i64 {
    vec.with_label_values(&["t", "sink", "0"]).get()
}

fn task_count(vec: &prometheus::IntCounterVec) -> u64 {
    vec.with_label_values(&["t", "sink", "0"]).get()
}

fn samples(vec: &prometheus::HistogramVec) -> u64 {
    vec.with_label_values(&["t", "sink", "0"])
        .get_sample_count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_and_item_of_a_clean_run_is_counted_once() {
    let server = server_with_mapping().await;
    let mut cfg = config(&server);
    cfg.bulk_max_actions = 10;
    let (mut s, t) = sink_reporting(cfg, failing()).await;
    let m = t.metrics();
    // 35 new documents: 3 full requests, and the rest at the checkpoint.
    s.invoke((0..35).map(|i| rec(i, GOOD)).collect())
        .await
        .unwrap();
    s.snapshot(CheckpointId(1)).await.unwrap();
    assert_eq!(server.stats().bulk_requests, 4);
    assert_eq!(outcomes(&m.sink.requests, REQUEST_OUTCOMES), [("ok", 4)]);
    assert_eq!(outcomes(&m.sink.items, ITEM_OUTCOMES), [("created", 35)]);
    assert_eq!(task_count(&m.records_out), 35);
    assert_eq!(samples(&m.sink.request_duration), 4);
    assert_eq!(samples(&m.sink.retry_backoff), 0);
    assert!(task_count(&m.sink.bytes_sent) > 35 * GOOD.len() as u64);
    assert_eq!(task_gauge(&m.sink.pending), 0);
    assert_eq!(task_gauge(&m.sink.in_flight), 0);
    // The same records again: the same ids, so every document is updated.
    s.invoke((0..35).map(|i| rec(i, GOOD)).collect())
        .await
        .unwrap();
    s.snapshot(CheckpointId(2)).await.unwrap();
    assert_eq!(outcomes(&m.sink.requests, REQUEST_OUTCOMES), [("ok", 8)]);
    assert_eq!(
        outcomes(&m.sink.items, ITEM_OUTCOMES),
        [("created", 35), ("updated", 35)]
    );
    assert_eq!(task_count(&m.records_out), 70);
    // Every series of the sink is in the scrape, the ones still at 0 included.
    let text = t.scrape();
    for o in ITEM_OUTCOMES {
        assert!(
            text.contains(&format!(
                "lockgate_sink_items_total{{job=\"t\",operator=\"sink\",outcome=\"{o}\",subtask=\"0\"}}"
            )),
            "{o} in\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_rejected_item_and_failed_request_is_counted_as_retried_and_everything_ends_created() {
    let server = server_with_mapping().await;
    server.set_faults(Faults {
        reject_item_fraction: 0.3,
        seed: 7,
        fail_requests_status: 503,
        fail_requests: 2,
        ..Default::default()
    });
    let mut cfg = config(&server);
    cfg.bulk_max_actions = 50;
    cfg.retry_max_attempts = 1000;
    cfg.retry_initial_ms = 1;
    cfg.retry_max_ms = 5;
    let (mut s, t) = sink_reporting(cfg, failing()).await;
    let m = t.metrics();
    s.invoke((0..200).map(|i| rec(i, GOOD)).collect())
        .await
        .unwrap();
    s.snapshot(CheckpointId(1)).await.unwrap();
    let stats = server.stats();
    assert!(stats.rejected_items > 0, "{stats:?}");
    assert_eq!(server.documents("orders").len(), 200);
    // Rejected items, and every action of the two requests refused whole (the first
    // two requests, full at 50 actions).
    let retried = stats.rejected_items + 2 * 50;
    assert_eq!(outcome(&m.sink.items, "retried"), retried);
    assert_eq!(outcome(&m.sink.items, "created"), 200);
    assert_eq!(
        outcomes(&m.sink.items, ITEM_OUTCOMES),
        [("created", 200), ("retried", retried)]
    );
    assert_eq!(outcome(&m.sink.requests, "retried"), 2, "the two 503s");
    let item_errors = outcome(&m.sink.requests, "item_errors");
    assert!(item_errors > 0);
    assert_eq!(
        outcome(&m.sink.requests, "ok") + item_errors + 2,
        stats.bulk_requests,
        "every request counted once"
    );
    // One backoff for each response that retried something.
    assert_eq!(samples(&m.sink.retry_backoff), item_errors + 2);
    assert_eq!(samples(&m.sink.request_duration), stats.bulk_requests);
    assert_eq!(task_count(&m.records_out), 200);
    assert_eq!(task_gauge(&m.sink.pending), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pending_gauge_is_the_pending_count_and_0_after_each_checkpoint() {
    let server = server_with_mapping().await;
    server.set_faults(Faults {
        reject_ids: ["orders-0-5".to_string()].into(),
        ..Default::default()
    });
    let mut cfg = config(&server);
    cfg.retry_max_attempts = 1000;
    let (mut s, t) = sink_reporting(cfg, failing()).await;
    let pending = t
        .metrics()
        .sink
        .pending
        .with_label_values(&["t", "sink", "0"]);
    s.invoke(vec![rec(4, GOOD), rec(5, GOOD)]).await.unwrap();
    assert_eq!(pending.get(), 2, "buffered");
    let counters = s.counters();
    let snapshot = tokio::spawn(async move {
        let r = s.snapshot(CheckpointId(1)).await;
        (s, r)
    });
    wait_until("a retry", || server.stats().bulk_requests >= 2).await;
    assert_eq!(pending.get(), 1, "the retried item");
    assert_eq!(counters.pending(), 1);
    server.set_faults(Faults::default());
    let (mut s, r) = snapshot.await.unwrap();
    r.unwrap();
    assert_eq!(pending.get(), 0, "after the checkpoint's flush");
    s.invoke((10..13).map(|i| rec(i, GOOD)).collect())
        .await
        .unwrap();
    assert_eq!(pending.get(), 3);
    s.snapshot(CheckpointId(2)).await.unwrap();
    assert_eq!(pending.get(), 0, "after the second checkpoint's flush");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_too_large_is_counted_and_split() {
    let server = server_with_mapping().await;
    server.set_faults(Faults {
        max_body_bytes: 200,
        ..Default::default()
    });
    let (mut s, t) = sink_reporting(config(&server), failing()).await;
    let m = t.metrics();
    s.invoke((0..8).map(|i| rec(i, GOOD)).collect())
        .await
        .unwrap();
    s.snapshot(CheckpointId(1)).await.unwrap();
    let stats = server.stats();
    assert!(stats.too_large >= 1, "{stats:?}");
    assert_eq!(outcome(&m.sink.requests, "too_large"), stats.too_large);
    assert_eq!(
        outcome(&m.sink.requests, "ok") + stats.too_large,
        stats.bulk_requests
    );
    assert_eq!(outcomes(&m.sink.items, ITEM_OUTCOMES), [("created", 8)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_and_a_refused_item_are_counted_as_failed() {
    let server = server_with_mapping().await;
    server.set_faults(Faults {
        fail_requests_status: 403,
        fail_requests: 1,
        ..Default::default()
    });
    let mut cfg = config(&server);
    cfg.bulk_max_actions = 1;
    let (mut s, t) = sink_reporting(cfg.clone(), failing()).await;
    let m = t.metrics();
    s.invoke(vec![rec(1, GOOD)]).await.unwrap();
    let counters = s.counters();
    wait_until("the failure", || counters.failure().is_some()).await;
    assert_eq!(
        outcomes(&m.sink.requests, REQUEST_OUTCOMES),
        [("failed", 1)]
    );
    assert_eq!(outcomes(&m.sink.items, ITEM_OUTCOMES), [("failed", 1)]);
    assert_eq!(task_count(&m.records_out), 0);
    // A mapping refusal under on_item_error = "fail".
    let (mut s, t) = sink_reporting(cfg, failing()).await;
    let m = t.metrics();
    s.invoke(vec![rec(7, BAD)]).await.unwrap();
    let counters = s.counters();
    wait_until("the failure", || counters.failure().is_some()).await;
    assert_eq!(
        outcomes(&m.sink.requests, REQUEST_OUTCOMES),
        [("item_errors", 1)]
    );
    assert_eq!(outcomes(&m.sink.items, ITEM_OUTCOMES), [("failed", 1)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapping_refusal_is_dead_lettered_and_counted_under_its_reason() {
    let kafka = lockgate::testkit::kafka::EmbeddedKafka::start(1, &[("dlq".to_string(), 1)])
        .expect("embedded Kafka");
    let server = server_with_mapping().await;
    let mut cfg = config(&server);
    cfg.dead_letter_bootstrap_servers = Some(kafka.bootstrap_servers().to_string());
    let handler: Arc<dyn FailureHandler> =
        Arc::new(PolicyFailureHandler(OnError::DeadLetter("dlq".into())));
    let (mut s, t) = sink_reporting(cfg, handler).await;
    let m = t.metrics();
    s.invoke(vec![rec(1, GOOD), rec(2, BAD), rec(3, GOOD)])
        .await
        .unwrap();
    s.snapshot(CheckpointId(1)).await.unwrap();
    assert_eq!(server.documents("orders").len(), 2);
    assert_eq!(
        outcomes(&m.sink.requests, REQUEST_OUTCOMES),
        [("item_errors", 1)]
    );
    assert_eq!(
        outcomes(&m.sink.items, ITEM_OUTCOMES),
        [("created", 2), ("dead_lettered", 1)]
    );
    let reason = |r: &str| {
        m.dead_letters
            .with_label_values(&["t", "sink", "0", r])
            .get()
    };
    assert_eq!(reason("mapping"), 1);
    for r in [
        "invalid_document",
        "version_conflict",
        "document_missing",
        "too_large",
        "rejected",
    ] {
        assert_eq!(reason(r), 0, "{r}");
    }
    assert_eq!(task_count(&m.records_out), 3, "written or dead-lettered");
    assert_eq!(task_gauge(&m.sink.pending), 0);
    assert!(t
        .scrape()
        .contains("lockgate_dead_letters_total{job=\"t\",operator=\"sink\",reason=\"mapping\",subtask=\"0\"} 1"));
}

/// A failed attempt drops its sink with actions buffered and a request held by the
/// server: the subtask's gauges, shared with the next attempt's sink, give back what
/// the dropped one counted, and its processor stops sending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_sink_gives_back_its_pending_and_in_flight_and_stops_sending() {
    let server = server_with_mapping().await;
    server.set_faults(Faults {
        stall: true,
        ..Default::default()
    });
    let mut cfg = config(&server);
    cfg.bulk_max_actions = 2;
    cfg.max_in_flight = 1;
    let (mut s, t) = sink_reporting(cfg.clone(), failing()).await;
    let m = t.metrics();
    s.invoke((0..5).map(|i| rec(i, GOOD)).collect())
        .await
        .unwrap();
    wait_until("a bulk in flight", || server.stats().bulk_requests == 1).await;
    wait_until("the gauges", || {
        task_gauge(&m.sink.pending) == 5 && task_gauge(&m.sink.in_flight) == 1
    })
    .await;
    drop(s);
    wait_until("the dropped sink's share given back", || {
        task_gauge(&m.sink.pending) == 0 && task_gauge(&m.sink.in_flight) == 0
    })
    .await;
    // The next attempt's sink of the same subtask counts from 0.
    server.set_faults(Faults::default());
    let telemetry_info = info().with_telemetry(t.clone());
    let cfg = Arc::new(cfg);
    let mut next = EsSink::new(
        cfg.clone(),
        Box::new(ConfigActionBuilder::new(&cfg)),
        failing(),
    );
    next.open(&telemetry_info, &SinkRestore::default())
        .await
        .unwrap();
    next.invoke(vec![rec(10, GOOD)]).await.unwrap();
    assert_eq!(task_gauge(&m.sink.pending), 1);
    next.snapshot(CheckpointId(1)).await.unwrap();
    assert_eq!(task_gauge(&m.sink.pending), 0);
    // The dropped sink's processor sent nothing after the stall ended: only its one
    // request (answered late by the server) and the next sink's one.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(server.stats().bulk_requests, 2, "{:?}", server.stats());
}

/// Coalescing (the default) with a refused newer write: `k` gets 1, then a value the
/// mapping refuses. Under dead-letter, the refused one is dead-lettered and the older
/// one written in its place (counted once, as created); under fail, the job fails and
/// nothing is counted as written — the older write was never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_write_falls_back_to_the_one_it_coalesced_and_counts_only_what_was_written() {
    let records = || {
        vec![
            rec(1, r#"{"id":"k","amount":1}"#),
            rec(2, r#"{"id":"k","amount":"not a number"}"#),
        ]
    };
    let kafka = lockgate::testkit::kafka::EmbeddedKafka::start(1, &[("dlq".to_string(), 1)])
        .expect("embedded Kafka");
    let server = server_with_mapping().await;
    let mut cfg = config(&server);
    cfg.id = IdStrategy::Field("/id".into());
    assert!(cfg.coalesce, "coalescing is the default");
    cfg.dead_letter_bootstrap_servers = Some(kafka.bootstrap_servers().to_string());
    let handler: Arc<dyn FailureHandler> =
        Arc::new(PolicyFailureHandler(OnError::DeadLetter("dlq".into())));
    let (mut s, t) = sink_reporting(cfg.clone(), handler).await;
    let m = t.metrics();
    s.invoke(records()).await.unwrap();
    s.snapshot(CheckpointId(1)).await.unwrap();
    let docs = server.documents("orders");
    assert_eq!(
        docs.get("k").map(|d| &d.0),
        Some(&serde_json::json!({"id": "k", "amount": 1})),
        "the older write is in the index"
    );
    assert_eq!(
        outcomes(&m.sink.items, ITEM_OUTCOMES),
        [("created", 1), ("dead_lettered", 1)]
    );
    assert_eq!(task_count(&m.records_out), 2, "written or dead-lettered");
    assert_eq!(s.counters().coalesced(), 0, "the older write was not moot");
    assert_eq!(task_gauge(&m.sink.pending), 0);

    let server = server_with_mapping().await;
    let mut cfg = config(&server);
    cfg.id = IdStrategy::Field("/id".into());
    let (mut s, t) = sink_reporting(cfg, failing()).await;
    let m = t.metrics();
    s.invoke(records()).await.unwrap();
    let failed = s.snapshot(CheckpointId(1)).await.unwrap_err().to_string();
    assert!(failed.contains("orders/k"), "{failed}");
    let counters = s.counters();
    assert_eq!(outcomes(&m.sink.items, ITEM_OUTCOMES), [("failed", 1)]);
    assert_eq!(task_count(&m.records_out), 0, "nothing was written");
    assert_eq!(counters.coalesced(), 0);
    assert!(server.documents("orders").is_empty());
}

/// A server that implements the bulk API but refuses `filter_path` gets the request
/// again without it, and every later one without it: nothing is lost, nothing fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_refuses_filter_path_gets_unfiltered_requests() {
    let server = server_with_mapping().await;
    server.set_faults(Faults {
        refuse_filter_path: true,
        ..Default::default()
    });
    let mut cfg = config(&server);
    cfg.bulk_max_actions = 2;
    cfg.max_in_flight = 1;
    let mut s = sink(cfg).await;
    let records: Vec<Record> = (0..6).map(|i| rec(i, GOOD)).collect();
    s.invoke(records).await.unwrap();
    s.snapshot(CheckpointId(1)).await.unwrap();
    assert_eq!(server.documents("orders").len(), 6);
    let stats = server.stats();
    assert_eq!(
        stats.filtered_bulk_requests, 1,
        "only the first asked: {stats:?}"
    );
    assert_eq!(stats.bulk_requests, 4, "refused, then three of two actions");
    assert_eq!(stats.bulk_items, 6);
}

/// The test server answers as Elasticsearch does for the clients of other languages:
/// `_bulk` by `PUT` as by `POST`, and every response marked as Elasticsearch's (Elastic's
/// clients refuse a server without the mark).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_test_server_takes_bulk_by_put_and_marks_its_responses() {
    let server = server_with_mapping().await;
    let c = reqwest::Client::new();
    for (path, id) in [("/_bulk", "1"), ("/orders/_bulk", "2")] {
        let r = c
            .put(format!("{}{path}", server.url()))
            .header("content-type", "application/x-ndjson")
            .body(format!(
                "{{\"index\":{{\"_index\":\"orders\",\"_id\":\"{id}\"}}}}\n{{\"amount\":1}}\n"
            ))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{path}: {}", r.status());
        assert_eq!(r.headers()["x-elastic-product"], "Elasticsearch");
    }
    let root = c.get(server.url()).send().await.unwrap();
    assert_eq!(root.headers()["x-elastic-product"], "Elasticsearch");
    assert_eq!(server.documents("orders").len(), 2);
}
