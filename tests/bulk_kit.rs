//! A second bulk sink on the bulk kit, written against `lockgate::kits::bulk` alone:
//! documents as NDJSON lines posted to a small HTTP service that answers one status per
//! line. It shows what the kit gives such a sink for an encoder and a transport: a
//! partial failure retried (only the items that failed, until written), and a refused
//! document settled by the failure policy (the job failed with a message that names
//! it, or the hook's decision) while the rest is written.

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use bytes::Bytes;
use lockgate::kits::bulk::{
    bookkeeping_bytes, Added, BulkEncoder, BulkParts, BulkProcessor, BulkTransport, Decision,
    DocKey, Encoded, EncodedBatch, FailurePolicy, ItemLabel, LetterParts, Limits, OnError, Outcome,
    RequestOutcome, Sent, Supersedes,
};
use lockgate::telemetry::metrics::Metrics;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

/// One document write: the whole document `id` becomes `body` (one JSON line).
#[derive(Debug, Clone)]
struct Doc {
    id: String,
    body: Vec<u8>,
}

fn doc(id: &str, v: Value) -> Doc {
    Doc {
        id: id.into(),
        body: json!({ "id": id, "v": v }).to_string().into_bytes(),
    }
}

/// Every write replaces its document whole: a later one supersedes an earlier one.
#[derive(Debug, Clone, PartialEq)]
struct Replace;

impl Supersedes for Replace {
    fn supersedes(&self, _older: &Replace) -> bool {
        true
    }
}

struct NdjsonEncoder;

impl BulkEncoder for NdjsonEncoder {
    type Item = Doc;
    type Effect = Replace;
    type Action = Doc;

    fn encode(&self, actions: Vec<Doc>) -> EncodedBatch<Self> {
        let per_action = bookkeeping_bytes::<Doc, Replace>();
        let actions: Vec<Added<Self>> = actions
            .into_iter()
            .map(|d| {
                Added::Encoded(Encoded {
                    doc: Some(DocKey::from(d.id.clone())),
                    effect: Replace,
                    bytes: d.body.len() + 1,
                    item: d,
                })
            })
            .collect();
        let bytes = actions
            .iter()
            .map(|a| match a {
                Added::Encoded(e) => e.bytes + per_action,
                Added::Invalid(..) => 0,
            })
            .sum();
        EncodedBatch { actions, bytes }
    }

    fn action(&self, item: &Doc) -> Doc {
        item.clone()
    }

    fn describe(&self, action: &Doc) -> String {
        format!("document {}", action.id)
    }

    fn letter<'a>(&self, action: &'a Doc) -> LetterParts<'a> {
        LetterParts {
            payload: &action.body,
            target: Some(("docs", &action.id)),
            ..LetterParts::default()
        }
    }
}

/// Posts a request's lines to `{url}/bulk`; the answer is one `{"status", "error"}` per
/// line, in order.
struct NdjsonTransport {
    client: reqwest::Client,
    url: String,
}

impl BulkTransport<Doc> for NdjsonTransport {
    fn system(&self) -> &'static str {
        "the NDJSON service"
    }

    fn nodes(&self) -> usize {
        1
    }

    fn send(
        &self,
        _node: usize,
        items: &[&Doc],
    ) -> (usize, impl Future<Output = Sent> + Send + 'static) {
        let mut body = Vec::new();
        for d in items {
            body.extend_from_slice(&d.body);
            body.push(b'\n');
        }
        let bytes = body.len();
        let request = self.client.post(format!("{}/bulk", self.url)).body(body);
        (bytes, async move {
            let response = match request.send().await {
                Ok(r) => r,
                Err(e) => return Sent::Request(None, e.to_string()),
            };
            let status = response.status().as_u16();
            if status != 200 {
                return Sent::Request(Some(status), response.text().await.unwrap_or_default());
            }
            match response.json::<Vec<Value>>().await {
                Ok(items) => Sent::Items(
                    items
                        .iter()
                        .map(|i| {
                            let text = |k: &str| i[k].as_str().map(str::to_string);
                            (
                                i["status"].as_u64().unwrap_or(0) as u16,
                                text("error"),
                                text("reason"),
                            )
                        })
                        .collect(),
                ),
                Err(e) => Sent::Request(None, e.to_string()),
            }
        })
    }

    fn classify(
        &self,
        _item: &Doc,
        status: u16,
        _error_type: Option<&str>,
    ) -> (Outcome, Option<ItemLabel>) {
        match status {
            200 => (Outcome::Done, Some(ItemLabel::Updated)),
            429 | 500.. => (Outcome::Retry, Some(ItemLabel::Retried)),
            _ => (Outcome::Rejected, None),
        }
    }

    fn classify_request(&self, status: Option<u16>) -> RequestOutcome {
        match status {
            Some(413) => RequestOutcome::Split,
            Some(401 | 403) => RequestOutcome::Fatal,
            Some(400..=499) => RequestOutcome::Malformed,
            _ => RequestOutcome::Retry,
        }
    }
}

/// The service's documents, what it was sent, and the documents it answers 429 to
/// (once each) before taking them.
#[derive(Default)]
struct Service {
    stored: HashMap<String, Value>,
    received: Vec<String>,
    busy_once: Vec<String>,
}

/// Takes each line unless its `v` is not a number (refused: 400 `bad_value`) or its
/// document is busy (429, once).
async fn bulk(State(service): State<Arc<Mutex<Service>>>, body: Bytes) -> Json<Vec<Value>> {
    let mut s = service.lock().unwrap();
    let mut answers = Vec::new();
    for line in body.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let d: Value = serde_json::from_slice(line).unwrap();
        let id = d["id"].as_str().unwrap().to_string();
        s.received.push(id.clone());
        if let Some(at) = s.busy_once.iter().position(|b| *b == id) {
            s.busy_once.remove(at);
            answers.push(json!({"status": 429, "error": "busy"}));
        } else if !d["v"].is_number() {
            answers
                .push(json!({"status": 400, "error": "bad_value", "reason": "v is not a number"}));
        } else {
            s.stored.insert(id, d["v"].clone());
            answers.push(json!({"status": 200}));
        }
    }
    Json(answers)
}

/// The service on a free loopback port: its state and its URL.
async fn serve(busy_once: &[&str]) -> (Arc<Mutex<Service>>, String) {
    let state = Arc::new(Mutex::new(Service {
        busy_once: busy_once.iter().map(|s| s.to_string()).collect(),
        ..Service::default()
    }));
    let app = Router::new()
        .route("/bulk", post(bulk))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (state, url)
}

fn limits() -> Limits {
    Limits {
        max_actions: 100,
        max_bytes: 1 << 20,
        max_in_flight: 1,
        flush_interval_ms: 60_000,
        coalesce: false,
        one_action_per_document: false,
        retry_max_attempts: 5,
        retry_initial_ms: 10,
        retry_max_ms: 50,
    }
}

/// Runs `docs` through a processor of the NDJSON sink with `policy`, flushes, and
/// returns the processor's failure, what the service holds and what it was sent.
async fn run(
    docs: Vec<Doc>,
    busy_once: &[&str],
    policy: FailurePolicy<Doc>,
) -> (Option<String>, HashMap<String, Value>, Vec<String>, usize) {
    let (service, url) = serve(busy_once).await;
    let metrics = Metrics::new("bulk-kit");
    let parts = BulkParts {
        encoder: NdjsonEncoder,
        transport: NdjsonTransport {
            client: reqwest::Client::new(),
            url,
        },
        policy,
        dead_letter: None,
    };
    let processor = BulkProcessor::spawn(parts, limits(), 1 << 20, (&metrics, 0), "ndjson".into());
    let batch = NdjsonEncoder.encode(docs);
    processor.add_with(batch.bytes, || batch).await.unwrap();
    processor.flush().await.unwrap();
    let shared = processor.shared();
    let s = service.lock().unwrap();
    (
        shared.failure(),
        s.stored.clone(),
        s.received.clone(),
        shared.pending(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_answered_busy_are_sent_again_alone_until_written() {
    let docs = vec![doc("a", json!(1)), doc("b", json!(2)), doc("c", json!(3))];
    let (failure, stored, received, pending) =
        run(docs, &["b"], FailurePolicy::new(OnError::Fail)).await;
    assert_eq!(failure, None);
    assert_eq!(pending, 0, "everything written at the flush");
    assert_eq!(received, ["a", "b", "c", "b"], "only b is sent again");
    assert_eq!(
        stored,
        HashMap::from([
            ("a".into(), json!(1)),
            ("b".into(), json!(2)),
            ("c".into(), json!(3))
        ])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_document_fails_the_job_under_on_error_fail() {
    let docs = vec![
        doc("a", json!(1)),
        doc("x", json!("oops")),
        doc("c", json!(3)),
    ];
    let (failure, stored, _, _) = run(docs, &[], FailurePolicy::new(OnError::Fail)).await;
    assert_eq!(
        failure.as_deref(),
        Some("the NDJSON service refused document x: 400 bad_value: v is not a number")
    );
    assert!(!stored.contains_key("x"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hook_decides_before_the_policy_and_the_rest_is_written() {
    // The hook replaces a refused document by one with the value 0; `skip` would drop
    // anything the hook leaves to the policy.
    let policy = FailurePolicy::new(OnError::Skip).with_hook(|d: &Doc, failure| {
        (failure.error_type == "bad_value").then(|| Decision::Requeue(vec![doc(&d.id, json!(0))]))
    });
    let docs = vec![
        doc("a", json!(1)),
        doc("x", json!("oops")),
        doc("c", json!(3)),
    ];
    let (failure, stored, received, pending) = run(docs, &["c"], policy).await;
    assert_eq!(failure, None);
    assert_eq!(pending, 0);
    assert_eq!(stored["x"], json!(0), "the hook's replacement is written");
    assert_eq!(stored.len(), 3);
    assert_eq!(received.iter().filter(|r| *r == "x").count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_document_is_dropped_under_skip_and_the_rest_is_written() {
    let docs = vec![
        doc("a", json!(1)),
        doc("x", json!("oops")),
        doc("c", json!(3)),
    ];
    let (failure, stored, received, pending) =
        run(docs, &[], FailurePolicy::new(OnError::Skip)).await;
    assert_eq!(failure, None);
    assert_eq!(pending, 0, "a dropped document is settled");
    assert_eq!(received, ["a", "x", "c"], "a refusal is not sent again");
    assert_eq!(
        stored,
        HashMap::from([("a".into(), json!(1)), ("c".into(), json!(3))])
    );
}
