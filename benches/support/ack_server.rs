//! A bulk endpoint that only acknowledges: it counts the actions of each request (two
//! lines each) and answers every one as created, without parsing or storing anything.
//! It honours `filter_path` as Elasticsearch does (the item it repeats is filtered once
//! per filter).
//! Against it the client's own cost decides the throughput, where the in-memory test
//! server (which parses and stores every document) takes most of the cores.

use axum::extract::{Query, State};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::oneshot;

/// One item result, as Elasticsearch writes it for a created document.
const ITEM: &str = r#"{"index":{"_index":"bench","_version":1,"result":"created","_shards":{"total":1,"successful":1,"failed":0},"_seq_no":0,"_primary_term":1,"status":201}}"#;

/// A running acknowledging server; stops when dropped.
pub struct AckServer {
    url: String,
    items: Arc<AtomicU64>,
    _shutdown: oneshot::Sender<()>,
}

impl AckServer {
    /// Starts on a free loopback port, on the current runtime.
    pub async fn start() -> AckServer {
        let items = Arc::new(AtomicU64::new(0));
        let app = Router::new()
            .route("/_bulk", post(bulk))
            .layer(axum::extract::DefaultBodyLimit::max(512 * 1024 * 1024))
            .with_state(items.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        AckServer {
            url,
            items,
            _shutdown: tx,
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Actions acknowledged so far.
    pub fn items(&self) -> u64 {
        self.items.load(Ordering::Relaxed)
    }
}

#[derive(serde::Deserialize)]
struct Params {
    filter_path: Option<String>,
}

/// The start of a response and its repeated item, as `filter` leaves them (computed
/// once per filter, by the test server's own filter).
fn filtered(filter: &str) -> (String, String) {
    type Cached = Option<(String, (String, String))>;
    static CACHE: std::sync::Mutex<Cached> = std::sync::Mutex::new(None);
    let mut cache = CACHE.lock().expect("lock");
    if let Some((f, parts)) = &*cache {
        if f == filter {
            return parts.clone();
        }
    }
    let response: serde_json::Value =
        serde_json::from_str(&format!(r#"{{"took":1,"errors":false,"items":[{ITEM}]}}"#))
            .expect("item");
    let kept = lockgate::testkit::es::filter_path::apply(&response, filter);
    let item = kept["items"][0].to_string();
    let mut head = kept.as_object().expect("an object").clone();
    head.remove("items");
    let head = serde_json::Value::Object(head).to_string();
    let start = format!(r#"{},"items":["#, head.trim_end_matches('}'));
    let parts = (start.replacen("{,", "{", 1), item);
    *cache = Some((filter.to_string(), parts.clone()));
    parts
}

async fn bulk(
    State(items): State<Arc<AtomicU64>>,
    Query(q): Query<Params>,
    body: Bytes,
) -> axum::response::Response {
    let n = body.iter().filter(|&&b| b == b'\n').count() / 2;
    items.fetch_add(n as u64, Ordering::Relaxed);
    let (start, item) = match &q.filter_path {
        Some(f) => filtered(f),
        None => (r#"{"took":1,"errors":false,"items":["#.into(), ITEM.into()),
    };
    let mut out = String::with_capacity(48 + n * (item.len() + 1));
    out.push_str(&start);
    for i in 0..n {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&item);
    }
    out.push_str("]}");
    axum::response::Response::builder()
        .header("content-type", "application/json")
        .body(axum::body::Body::from(out))
        .expect("response")
}
