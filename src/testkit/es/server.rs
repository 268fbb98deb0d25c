//! The HTTP server (axum) and its fault controls.

use super::bulk;
use super::store::{request_error, Store};
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// The faults the server injects; all off by default.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Fraction (0..=1) of bulk items rejected with 429 `es_rejected_execution_exception`.
    pub reject_item_fraction: f64,
    /// Document ids rejected with 429 while listed.
    pub reject_ids: HashSet<String>,
    /// Status (429, 503, 500, ...) of whole bulk requests failed without applying them.
    pub fail_requests_status: u16,
    /// How many bulk requests fail that way (then the fault turns itself off).
    pub fail_requests: u32,
    /// Latency added to every bulk request, in milliseconds.
    pub latency_ms: u64,
    /// While true, bulk requests wait (and apply nothing) until it is cleared.
    pub stall: bool,
    /// How many bulk responses are cut off after the bulk was applied (the client sees
    /// a dropped connection although Elasticsearch accepted the items).
    pub drop_responses: u32,
    /// Bodies above this size are refused with 413 (0 = no limit).
    pub max_body_bytes: usize,
    /// Seed of the item-rejection draw.
    pub seed: u64,
    /// Refuse bulk requests that ask for `filter_path` with 400, as an
    /// Elasticsearch-compatible server that does not know the parameter does.
    pub refuse_filter_path: bool,
}

/// Counters of the server.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Stats {
    pub bulk_requests: u64,
    pub bulk_items: u64,
    pub rejected_items: u64,
    pub failed_requests: u64,
    pub dropped_responses: u64,
    pub too_large: u64,
    /// Requests refused with 401 (missing or wrong credentials).
    pub unauthorized_requests: u64,
    /// Requests whose body came gzip-compressed.
    pub gzip_requests: u64,
    /// Bulk requests that asked for a filtered response (`filter_path`).
    #[serde(default)]
    pub filtered_bulk_requests: u64,
    /// `PUT _index_template/<name>` requests.
    #[serde(default)]
    pub index_template_puts: u64,
}

/// How the server is secured; the default is plain HTTP that accepts every request.
#[derive(Clone, Default)]
pub struct ServerOptions {
    /// Serve HTTPS with this certificate.
    pub tls: Option<super::secure::TestCert>,
    /// `USER:PASS` pairs accepted as basic authentication.
    pub basic_auth: Vec<String>,
    /// `ID:KEY` API keys accepted (sent as `ApiKey base64(ID:KEY)`).
    pub api_keys: Vec<String>,
}

/// The server's state, shared by its handlers.
pub(crate) struct SharedState {
    store: Mutex<Store>,
    faults: Mutex<Faults>,
    pub(crate) stats: Mutex<Stats>,
    rng: Mutex<rand::rngs::SmallRng>,
    /// `Authorization` values accepted; empty: no authentication.
    pub(crate) accepted_auth: Vec<String>,
}

type Shared = SharedState;

/// A running test server; stops when dropped.
pub struct EsServer {
    url: String,
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
}

impl EsServer {
    /// Starts serving plain HTTP on `addr` (port 0 picks a free port) on the current
    /// tokio runtime; every request is accepted.
    pub async fn start(addr: SocketAddr) -> std::io::Result<EsServer> {
        EsServer::start_with(addr, ServerOptions::default()).await
    }

    /// Starts serving on `addr` as `options` say: HTTPS with a generated certificate,
    /// and credentials every request (the `/_lockgate` controls included) must carry.
    pub async fn start_with(addr: SocketAddr, options: ServerOptions) -> std::io::Result<EsServer> {
        use super::secure::{api_key_header, basic_header};
        let accepted_auth = options
            .basic_auth
            .iter()
            .map(|u| basic_header(u))
            .chain(options.api_keys.iter().map(|k| api_key_header(k)))
            .collect();
        let mut store = Store::default();
        store
            .templates
            .extend(super::resources::builtin_templates());
        let shared = Arc::new(Shared {
            store: Mutex::new(store),
            faults: Mutex::new(Faults::default()),
            stats: Mutex::new(Stats::default()),
            rng: Mutex::new(rand::rngs::SmallRng::seed_from_u64(0)),
            accepted_auth,
        });
        let app = Router::new()
            .route("/", get(|| async { Json(json!({"name": "lockgate-testkit", "version": {"number": "8.15.0"}, "tagline": "You Know, for Search"})) }))
            .route("/_bulk", post(bulk_root).put(bulk_root))
            .route("/_refresh", post(refresh).get(refresh))
            .route("/_mget", post(mget_root).get(mget_root))
            .route("/_lockgate/faults", get(get_faults).post(set_faults).delete(clear_faults))
            .route("/_lockgate/stats", get(get_stats))
            .route("/_ingest/pipeline/{id}", get(get_pipeline).put(put_pipeline).delete(delete_pipeline))
            .route("/_index_template/{name}", get(get_template).put(put_template).delete(delete_template))
            .route("/_aliases", post(post_aliases))
            .route("/_data_stream/{name}", get(get_data_stream))
            .route("/{index}", axum::routing::put(create_index).delete(delete_index).head(head_index).get(get_index))
            .route("/{index}/_bulk", post(bulk_in_index).put(bulk_in_index))
            .route("/{index}/_refresh", post(refresh).get(refresh))
            .route("/{index}/_count", get(count).post(count))
            .route("/{index}/_search", get(search).post(search))
            .route("/{index}/_mget", post(mget_in_index).get(mget_in_index))
            .route("/{index}/_doc/{id}", get(get_doc))
            .layer(axum::extract::DefaultBodyLimit::max(512 * 1024 * 1024))
            .layer(axum::middleware::map_response(product_header))
            // Outermost first: credentials are checked before anything is read.
            .layer(axum::middleware::from_fn_with_state(shared.clone(), super::secure::gunzip))
            .layer(axum::middleware::from_fn_with_state(shared.clone(), super::secure::require_auth))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (tx, rx) = oneshot::channel::<()>();
        let shutdown = async {
            let _ = rx.await;
        };
        let scheme = match &options.tls {
            Some(cert) => {
                let tls = super::secure::TlsListener::new(listener, cert)
                    .map_err(std::io::Error::other)?;
                tokio::spawn(async move {
                    let _ = axum::serve(tls, app).with_graceful_shutdown(shutdown).await;
                });
                "https"
            }
            None => {
                tokio::spawn(async move {
                    let _ = axum::serve(listener, app)
                        .with_graceful_shutdown(shutdown)
                        .await;
                });
                "http"
            }
        };
        Ok(EsServer {
            url: format!("{scheme}://{addr}"),
            addr,
            shared,
            shutdown: Some(tx),
        })
    }

    /// The base URL (`http://127.0.0.1:PORT`, or `https://` with TLS).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Replaces the faults.
    pub fn set_faults(&self, f: Faults) {
        *self.shared.rng.lock().expect("lock") = rand::rngs::SmallRng::seed_from_u64(f.seed);
        *self.shared.faults.lock().expect("lock") = f;
    }

    /// The counters so far.
    pub fn stats(&self) -> Stats {
        self.shared.stats.lock().expect("lock").clone()
    }

    /// Every document of `index`: id -> (source, version).
    pub fn documents(&self, index: &str) -> HashMap<String, (Value, i64)> {
        let store = self.shared.store.lock().expect("lock");
        store
            .hits(index)
            .into_iter()
            .map(|(id, d)| (id.clone(), (d.source.clone(), d.version)))
            .collect()
    }
}

impl Drop for EsServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

type S = State<Arc<Shared>>;

/// Marks every response as Elasticsearch's own, as Elasticsearch (7.14 and later) does:
/// Elastic's clients refuse a server whose responses lack the header.
async fn product_header(mut r: Response) -> Response {
    r.headers_mut().insert(
        "x-elastic-product",
        axum::http::HeaderValue::from_static("Elasticsearch"),
    );
    r
}

fn reply(status: u16, body: Value) -> Response {
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        Json(body),
    )
        .into_response()
}

/// The query parameters of `_bulk` the server reads.
#[derive(serde::Deserialize)]
struct BulkParams {
    filter_path: Option<String>,
}

async fn bulk_root(State(s): S, Query(q): Query<BulkParams>, body: Bytes) -> Response {
    do_bulk(s, None, q, body).await
}

async fn bulk_in_index(
    State(s): S,
    Path(index): Path<String>,
    Query(q): Query<BulkParams>,
    body: Bytes,
) -> Response {
    do_bulk(s, Some(index), q, body).await
}

async fn do_bulk(s: Arc<Shared>, index: Option<String>, q: BulkParams, body: Bytes) -> Response {
    let faults = s.faults.lock().expect("lock").clone();
    {
        let mut st = s.stats.lock().expect("lock");
        st.bulk_requests += 1;
        st.filtered_bulk_requests += u64::from(q.filter_path.is_some());
    }
    if faults.latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(faults.latency_ms)).await;
    }
    while s.faults.lock().expect("lock").stall {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if faults.refuse_filter_path && q.filter_path.is_some() {
        return reply(
            400,
            request_error(
                400,
                "illegal_argument_exception",
                "request [/_bulk] contains unrecognized parameter: [filter_path]",
            ),
        );
    }
    if faults.max_body_bytes > 0 && body.len() > faults.max_body_bytes {
        s.stats.lock().expect("lock").too_large += 1;
        return reply(
            413,
            request_error(
                413,
                "content_too_long_exception",
                &format!(
                    "request body of {} bytes is larger than {}",
                    body.len(),
                    faults.max_body_bytes
                ),
            ),
        );
    }
    if faults.fail_requests > 0 {
        let status = {
            let mut f = s.faults.lock().expect("lock");
            if f.fail_requests > 0 {
                f.fail_requests -= 1;
                Some(f.fail_requests_status.max(400))
            } else {
                None
            }
        };
        if let Some(status) = status {
            s.stats.lock().expect("lock").failed_requests += 1;
            let kind = if status == 429 {
                "es_rejected_execution_exception"
            } else {
                "unavailable_shards_exception"
            };
            return reply(
                status,
                request_error(status, kind, "injected request failure"),
            );
        }
    }
    let items = match bulk::parse(&body, index.as_deref()) {
        Ok(i) => i,
        Err(e) => return reply(400, e),
    };
    let started = std::time::Instant::now();
    let mut results = Vec::with_capacity(items.len());
    let mut errors = false;
    let mut rejected = 0;
    let n = items.len() as u64;
    {
        let mut store = s.store.lock().expect("lock");
        let mut rng = s.rng.lock().expect("lock");
        for item in items {
            let by_id = item
                .id
                .as_ref()
                .is_some_and(|id| faults.reject_ids.contains(id));
            let by_draw = faults.reject_item_fraction > 0.0
                && rng.gen_bool(faults.reject_item_fraction.min(1.0));
            let r = if by_id || by_draw {
                rejected += 1;
                bulk::rejected(&item)
            } else {
                bulk::apply(&mut store, item)
            };
            let failed = r
                .as_object()
                .and_then(|o| o.values().next())
                .is_some_and(|v| v.get("error").is_some());
            errors |= failed;
            results.push(r);
        }
    }
    {
        let mut st = s.stats.lock().expect("lock");
        st.bulk_items += n;
        st.rejected_items += rejected;
    }
    let mut body =
        json!({"took": started.elapsed().as_millis() as u64, "errors": errors, "items": results});
    if let Some(filter) = &q.filter_path {
        body = super::filter_path::apply(&body, filter);
    }
    if faults.drop_responses > 0 {
        let drop_it = {
            let mut f = s.faults.lock().expect("lock");
            if f.drop_responses > 0 {
                f.drop_responses -= 1;
                true
            } else {
                false
            }
        };
        if drop_it {
            s.stats.lock().expect("lock").dropped_responses += 1;
            // Half the body, then an error: hyper aborts the connection mid-response.
            let bytes = serde_json::to_vec(&body).expect("json");
            let half = Bytes::from(bytes[..bytes.len() / 2].to_vec());
            let stream = futures::stream::iter(vec![
                Ok::<Bytes, std::io::Error>(half),
                Err(std::io::Error::other(
                    "connection dropped by fault injection",
                )),
            ]);
            return Response::builder()
                .status(200)
                .header("content-type", "application/json")
                .header("content-length", bytes.len().to_string())
                .body(Body::from_stream(stream))
                .expect("response");
        }
    }
    reply(200, body)
}

async fn create_index(State(s): S, Path(index): Path<String>, body: Bytes) -> Response {
    let body: Value = if body.is_empty() {
        json!({})
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => return reply(400, request_error(400, "parse_exception", &e.to_string())),
        }
    };
    match s.store.lock().expect("lock").create_index(&index, &body) {
        Ok(()) => reply(
            200,
            json!({"acknowledged": true, "shards_acknowledged": true, "index": index}),
        ),
        Err(e) => reply(400, e),
    }
}

async fn delete_index(State(s): S, Path(index): Path<String>) -> Response {
    match s.store.lock().expect("lock").indices.remove(&index) {
        Some(_) => reply(200, json!({"acknowledged": true})),
        None => index_missing(&index),
    }
}

async fn head_index(State(s): S, Path(index): Path<String>) -> StatusCode {
    if s.store.lock().expect("lock").indices.contains_key(&index) {
        StatusCode::OK
    } else {
        StatusCode::NOT_FOUND
    }
}

async fn get_index(State(s): S, Path(index): Path<String>) -> Response {
    if s.store.lock().expect("lock").indices.contains_key(&index) {
        reply(
            200,
            json!({ index.clone(): {"aliases": {}, "mappings": {}, "settings": {}} }),
        )
    } else {
        index_missing(&index)
    }
}

fn index_missing(index: &str) -> Response {
    let mut e = request_error(
        404,
        "index_not_found_exception",
        &format!("no such index [{index}]"),
    );
    e["error"]["index"] = json!(index);
    reply(404, e)
}

async fn refresh(State(s): S) -> Response {
    let n = s.store.lock().expect("lock").indices.len();
    reply(
        200,
        json!({"_shards": {"total": n * 2, "successful": n, "failed": 0}}),
    )
}

async fn count(State(s): S, Path(index): Path<String>) -> Response {
    let store = s.store.lock().expect("lock");
    match store.indices.get(&index) {
        Some(i) => reply(
            200,
            json!({"count": i.docs.len(), "_shards": {"total": 1, "successful": 1, "skipped": 0, "failed": 0}}),
        ),
        None => {
            drop(store);
            index_missing(&index)
        }
    }
}

#[derive(Deserialize, Default)]
struct Paging {
    size: Option<usize>,
    from: Option<usize>,
}

async fn search(
    State(s): S,
    Path(index): Path<String>,
    Query(q): Query<Paging>,
    body: Bytes,
) -> Response {
    let body: Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(&body).unwrap_or(json!({}))
    };
    // `match_all`, or `ids` (how a data stream's documents are found by id).
    let mut only: Option<HashSet<String>> = None;
    if let Some(query) = body.get("query") {
        if let Some(values) = query.pointer("/ids/values").and_then(Value::as_array) {
            only = Some(
                values
                    .iter()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect(),
            );
        } else if query.get("match_all").is_none() {
            return reply(
                400,
                request_error(
                    400,
                    "parsing_exception",
                    "the test server supports match_all and ids only",
                ),
            );
        }
    }
    let size = body
        .get("size")
        .and_then(Value::as_u64)
        .map(|v| v as usize)
        .or(q.size)
        .unwrap_or(10);
    let from = body
        .get("from")
        .and_then(Value::as_u64)
        .map(|v| v as usize)
        .or(q.from)
        .unwrap_or(0);
    let store = s.store.lock().expect("lock");
    if !store.indices.contains_key(&index) {
        drop(store);
        return index_missing(&index);
    }
    let mut all = store.hits(&index);
    if let Some(ids) = &only {
        all.retain(|(id, _)| ids.contains(*id));
    }
    let hits: Vec<Value> = all
        .iter()
        .skip(from)
        .take(size)
        .map(|(id, d)| json!({"_index": index, "_id": id, "_score": 1.0, "_source": d.source}))
        .collect();
    reply(
        200,
        json!({
            "took": 1, "timed_out": false,
            "_shards": {"total": 1, "successful": 1, "skipped": 0, "failed": 0},
            "hits": {"total": {"value": all.len(), "relation": "eq"}, "max_score": if all.is_empty() { Value::Null } else { json!(1.0) }, "hits": hits}
        }),
    )
}

#[derive(Deserialize, Default)]
struct Routing {
    routing: Option<String>,
}

async fn get_doc(
    State(s): S,
    Path((index, id)): Path<(String, String)>,
    Query(q): Query<Routing>,
) -> Response {
    let store = s.store.lock().expect("lock");
    if !store.indices.contains_key(&index) {
        drop(store);
        return index_missing(&index);
    }
    let v = store.get(&index, &id, q.routing.as_deref());
    let status = if v["found"] == json!(true) { 200 } else { 404 };
    reply(status, v)
}

async fn mget_root(State(s): S, body: Bytes) -> Response {
    mget(s, None, body)
}

async fn mget_in_index(State(s): S, Path(index): Path<String>, body: Bytes) -> Response {
    mget(s, Some(index), body)
}

fn mget(s: Arc<Shared>, index: Option<String>, body: Bytes) -> Response {
    let body: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return reply(400, request_error(400, "parse_exception", &e.to_string())),
    };
    let mut wanted: Vec<(String, String)> = Vec::new();
    if let Some(docs) = body.get("docs").and_then(Value::as_array) {
        for d in docs {
            let i = d
                .get("_index")
                .and_then(Value::as_str)
                .map(String::from)
                .or_else(|| index.clone());
            let id = d.get("_id").and_then(Value::as_str);
            match (i, id) {
                (Some(i), Some(id)) => wanted.push((i, id.to_string())),
                _ => {
                    return reply(
                        400,
                        request_error(
                            400,
                            "action_request_validation_exception",
                            "Validation Failed: 1: index is missing for doc 0;",
                        ),
                    )
                }
            }
        }
    } else if let (Some(ids), Some(i)) = (body.get("ids").and_then(Value::as_array), &index) {
        for id in ids {
            wanted.push((
                i.clone(),
                id.as_str()
                    .map(String::from)
                    .unwrap_or_else(|| id.to_string()),
            ));
        }
    } else {
        return reply(
            400,
            request_error(
                400,
                "action_request_validation_exception",
                "Validation Failed: 1: no documents to get;",
            ),
        );
    }
    let store = s.store.lock().expect("lock");
    let docs: Vec<Value> = wanted
        .iter()
        .map(|(i, id)| {
            if store.indices.contains_key(i) {
                store.get(i, id, None)
            } else {
                json!({"_index": i, "_id": id, "error": {"type": "index_not_found_exception", "reason": format!("no such index [{i}]")}})
            }
        })
        .collect();
    reply(200, json!({"docs": docs}))
}

async fn get_faults(State(s): S) -> Json<Faults> {
    Json(s.faults.lock().expect("lock").clone())
}

async fn set_faults(State(s): S, Json(f): Json<Faults>) -> Json<Value> {
    *s.rng.lock().expect("lock") = rand::rngs::SmallRng::seed_from_u64(f.seed);
    *s.faults.lock().expect("lock") = f;
    Json(json!({"acknowledged": true}))
}

async fn clear_faults(State(s): S) -> Json<Value> {
    *s.faults.lock().expect("lock") = Faults::default();
    Json(json!({"acknowledged": true}))
}

async fn get_stats(State(s): S) -> Json<Stats> {
    Json(s.stats.lock().expect("lock").clone())
}

fn parse_body(body: &Bytes) -> Result<Value, Box<Response>> {
    serde_json::from_slice(body).map_err(|e| {
        Box::new(reply(
            400,
            request_error(400, "parse_exception", &e.to_string()),
        ))
    })
}

fn missing(kind: &str, name: &str) -> Response {
    reply(
        404,
        request_error(
            404,
            "resource_not_found_exception",
            &format!("{kind} [{name}] missing"),
        ),
    )
}

async fn get_pipeline(State(s): S, Path(id): Path<String>) -> Response {
    match s.store.lock().expect("lock").pipelines.get(&id) {
        Some(p) => reply(200, json!({ id.clone(): p })),
        None => reply(404, json!({})),
    }
}

async fn put_pipeline(State(s): S, Path(id): Path<String>, body: Bytes) -> Response {
    let body = match parse_body(&body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    if !body.get("processors").is_some_and(Value::is_array) {
        return reply(
            400,
            request_error(
                400,
                "parse_exception",
                "[processors] required property is missing",
            ),
        );
    }
    s.store.lock().expect("lock").pipelines.insert(id, body);
    reply(200, json!({"acknowledged": true}))
}

async fn delete_pipeline(State(s): S, Path(id): Path<String>) -> Response {
    match s.store.lock().expect("lock").pipelines.remove(&id) {
        Some(_) => reply(200, json!({"acknowledged": true})),
        None => missing("pipeline", &id),
    }
}

async fn get_template(State(s): S, Path(name): Path<String>) -> Response {
    match s.store.lock().expect("lock").templates.get(&name) {
        Some(t) => reply(
            200,
            json!({"index_templates": [{"name": name, "index_template": t}]}),
        ),
        None => missing("index template matching", &name),
    }
}

async fn put_template(State(s): S, Path(name): Path<String>, body: Bytes) -> Response {
    let body = match parse_body(&body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    if body.get("index_patterns").is_none() {
        return reply(
            400,
            request_error(
                400,
                "action_request_validation_exception",
                "Validation Failed: 1: index patterns are missing;",
            ),
        );
    }
    s.stats.lock().expect("lock").index_template_puts += 1;
    s.store.lock().expect("lock").templates.insert(name, body);
    reply(200, json!({"acknowledged": true}))
}

async fn delete_template(State(s): S, Path(name): Path<String>) -> Response {
    match s.store.lock().expect("lock").templates.remove(&name) {
        Some(_) => reply(200, json!({"acknowledged": true})),
        None => missing("index_template", &name),
    }
}

/// `POST _aliases` with `add` actions (`index`, `alias`): writes to the alias go to
/// its index.
async fn post_aliases(State(s): S, body: Bytes) -> Response {
    let body = match parse_body(&body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let mut store = s.store.lock().expect("lock");
    for action in body
        .get("actions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(add) = action.get("add") else {
            continue;
        };
        let (Some(index), Some(alias)) = (
            add.get("index").and_then(Value::as_str),
            add.get("alias").and_then(Value::as_str),
        ) else {
            continue;
        };
        if !store.indices.contains_key(index) {
            drop(store);
            return index_missing(index);
        }
        store.aliases.insert(alias.to_string(), index.to_string());
    }
    reply(200, json!({"acknowledged": true}))
}

async fn get_data_stream(State(s): S, Path(name): Path<String>) -> Response {
    let store = s.store.lock().expect("lock");
    match store.indices.get(&name) {
        Some(i) if i.data_stream => reply(
            200,
            json!({"data_streams": [{"name": name, "timestamp_field": {"name": "@timestamp"},
                   "indices": [{"index_name": format!(".ds-{name}-000001")}], "generation": 1, "status": "GREEN"}]}),
        ),
        _ => {
            drop(store);
            index_missing(&name)
        }
    }
}
