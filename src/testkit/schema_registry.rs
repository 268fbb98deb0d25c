//! An in-memory Schema Registry serving the part of Confluent's REST API that the
//! serializers and lockgate use:
//!
//! | request | answer |
//! |---|---|
//! | `POST /subjects/{s}/versions` `{"schema", "schemaType"?, "references"?}` | `{"id"}`: the schema's id (the same schema text and type keep their id across subjects), registered as the subject's next version unless it is already one |
//! | `POST /subjects/{s}` (same body) | the subject's version of that schema: `{"subject", "id", "version", "schema", "schemaType"?, "references"?}`, or 404 (40403) |
//! | `GET /schemas/ids/{id}` | `{"schema", "schemaType"?, "references"?}`, or 404 (40403) |
//! | `GET /subjects` | the subjects, sorted |
//! | `GET /subjects/{s}/versions` | the subject's versions |
//! | `GET /subjects/{s}/versions/{v}` (`latest` or a number) | as `POST /subjects/{s}`, or 404 (40401 subject, 40402 version) |
//!
//! `schemaType` is omitted for Avro, as the registry does. No compatibility checks, no
//! deletes, no modes. Registrations are kept across restarts only in a state file
//! ([`SchemaRegistry::start_kept`]), as a registry keeps them in its `_schemas` topic. `GET /_lockgate/stats` counts the
//! schema lookups by id (what a client's cache saves).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// A registered schema: its text, type and references (as given).
#[derive(Debug, Clone, PartialEq)]
struct Stored {
    schema: String,
    schema_type: String,
    references: Value,
}

#[derive(Default)]
struct Registry {
    /// By id, from 1.
    schemas: Vec<Stored>,
    /// Per subject, its versions (from 1) as schema ids.
    subjects: BTreeMap<String, Vec<u32>>,
    lookups_by_id: u64,
    /// Where each registration is appended (one JSON line), if anywhere.
    kept: Option<std::path::PathBuf>,
}

type Shared = Arc<Mutex<Registry>>;

/// A running registry; stops when dropped.
pub struct SchemaRegistry {
    url: String,
    addr: SocketAddr,
    state: Shared,
    _shutdown: oneshot::Sender<()>,
}

impl SchemaRegistry {
    /// Starts serving on `addr` (port 0 picks a free port) on the current runtime.
    pub async fn start(addr: SocketAddr) -> std::io::Result<SchemaRegistry> {
        SchemaRegistry::start_kept(addr, None).await
    }

    /// [`SchemaRegistry::start`] with its registrations kept in `state` (a file of one
    /// JSON line per registration): what the file holds is served from the start.
    pub async fn start_kept(
        addr: SocketAddr,
        state: Option<std::path::PathBuf>,
    ) -> std::io::Result<SchemaRegistry> {
        let mut registry = Registry::default();
        if let Some(path) = &state {
            let text = match std::fs::read_to_string(path) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                Err(e) => return Err(e),
            };
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                let v: Value = serde_json::from_str(line).map_err(|e| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("{}: {e}", path.display()),
                    )
                })?;
                let stored = stored_of(&v).ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("{}: a line without a schema", path.display()),
                    )
                })?;
                registry.add(v["subject"].as_str().unwrap_or_default(), stored);
            }
        }
        registry.kept = state;
        let state: Shared = Arc::new(Mutex::new(registry));
        let app = Router::new()
            .route("/subjects", get(subjects))
            .route("/subjects/{subject}", post(lookup))
            .route("/subjects/{subject}/versions", get(versions).post(register))
            .route("/subjects/{subject}/versions/{version}", get(version))
            .route("/schemas/ids/{id}", get(by_id))
            .route("/_lockgate/stats", get(stats))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        Ok(SchemaRegistry {
            url: format!("http://{addr}"),
            addr,
            state,
            _shutdown: tx,
        })
    }

    /// `http://host:port`.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Registers `schema` (of `schema_type`: `AVRO`, `PROTOBUF` or `JSON`) under
    /// `subject`, as a serializer would; returns its id.
    pub fn register(&self, subject: &str, schema: &str, schema_type: &str) -> u32 {
        let stored = Stored {
            schema: schema.to_string(),
            schema_type: schema_type.to_string(),
            references: json!([]),
        };
        self.state.lock().expect("lock").register(subject, stored)
    }

    /// How many schemas were fetched by id.
    pub fn lookups_by_id(&self) -> u64 {
        self.state.lock().expect("lock").lookups_by_id
    }
}

impl Registry {
    /// Registers `stored` under `subject` and appends the registration to the state
    /// file (replayed in order at start, it gives every schema its id again).
    fn register(&mut self, subject: &str, stored: Stored) -> u32 {
        if let Some(path) = &self.kept {
            use std::io::Write;
            let line = json!({"subject": subject, "schema": stored.schema,
                "schemaType": stored.schema_type, "references": stored.references});
            let appended = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut f| writeln!(f, "{line}").and_then(|_| f.sync_data()));
            if let Err(e) = appended {
                eprintln!(
                    "schema registry: cannot keep a registration in {}: {e}",
                    path.display()
                );
            }
        }
        self.add(subject, stored)
    }

    fn add(&mut self, subject: &str, stored: Stored) -> u32 {
        let id = match self.schemas.iter().position(|s| *s == stored) {
            Some(i) => i as u32 + 1,
            None => {
                self.schemas.push(stored);
                self.schemas.len() as u32
            }
        };
        let versions = self.subjects.entry(subject.to_string()).or_default();
        if !versions.contains(&id) {
            versions.push(id);
        }
        id
    }

    /// The answer naming schema `id` as `version` of `subject`.
    fn described(&self, subject: &str, version: usize, id: u32) -> Value {
        let mut v = self.body(id);
        v["subject"] = json!(subject);
        v["version"] = json!(version);
        v["id"] = json!(id);
        v
    }

    /// `{"schema", "schemaType"?, "references"?}` of schema `id`.
    fn body(&self, id: u32) -> Value {
        let s = &self.schemas[id as usize - 1];
        let mut v = json!({"schema": s.schema});
        if s.schema_type != "AVRO" {
            v["schemaType"] = json!(s.schema_type);
        }
        if s.references.as_array().is_some_and(|r| !r.is_empty()) {
            v["references"] = s.references.clone();
        }
        v
    }
}

fn error(status: StatusCode, code: u32, message: String) -> Response {
    (
        status,
        Json(json!({"error_code": code, "message": message})),
    )
        .into_response()
}

/// The schema of a registration or lookup body (`None`: it has none).
fn stored_of(body: &Value) -> Option<Stored> {
    let schema = body["schema"].as_str()?;
    Some(Stored {
        schema: schema.to_string(),
        schema_type: body["schemaType"].as_str().unwrap_or("AVRO").to_string(),
        references: body.get("references").cloned().unwrap_or(json!([])),
    })
}

fn no_subject(subject: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        40401,
        format!("Subject '{subject}' not found."),
    )
}

fn no_schema() -> Response {
    error(
        StatusCode::UNPROCESSABLE_ENTITY,
        42201,
        "the body has no schema".into(),
    )
}

async fn register(
    State(s): State<Shared>,
    Path(subject): Path<String>,
    Json(body): Json<Value>,
) -> Response {
    match stored_of(&body) {
        Some(stored) => {
            let id = s.lock().expect("lock").register(&subject, stored);
            Json(json!({"id": id})).into_response()
        }
        None => no_schema(),
    }
}

async fn lookup(
    State(s): State<Shared>,
    Path(subject): Path<String>,
    Json(body): Json<Value>,
) -> Response {
    let Some(stored) = stored_of(&body) else {
        return no_schema();
    };
    let r = s.lock().expect("lock");
    let Some(versions) = r.subjects.get(&subject) else {
        return no_subject(&subject);
    };
    for (i, &id) in versions.iter().enumerate() {
        if r.schemas[id as usize - 1] == stored {
            return Json(r.described(&subject, i + 1, id)).into_response();
        }
    }
    error(StatusCode::NOT_FOUND, 40403, "Schema not found".into())
}

async fn by_id(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    let mut r = s.lock().expect("lock");
    r.lookups_by_id += 1;
    match id.parse::<u32>() {
        Ok(n) if n >= 1 && n as usize <= r.schemas.len() => Json(r.body(n)).into_response(),
        _ => error(
            StatusCode::NOT_FOUND,
            40403,
            format!("Schema {id} not found"),
        ),
    }
}

async fn subjects(State(s): State<Shared>) -> Response {
    let r = s.lock().expect("lock");
    Json(r.subjects.keys().collect::<Vec<_>>()).into_response()
}

async fn versions(State(s): State<Shared>, Path(subject): Path<String>) -> Response {
    let r = s.lock().expect("lock");
    match r.subjects.get(&subject) {
        Some(v) => Json((1..=v.len()).collect::<Vec<_>>()).into_response(),
        None => no_subject(&subject),
    }
}

async fn version(
    State(s): State<Shared>,
    Path((subject, version)): Path<(String, String)>,
) -> Response {
    let r = s.lock().expect("lock");
    let Some(versions) = r.subjects.get(&subject) else {
        return no_subject(&subject);
    };
    let n = match version.as_str() {
        "latest" | "-1" => versions.len(),
        v => v.parse().unwrap_or(0),
    };
    match versions.get(n.wrapping_sub(1)) {
        Some(&id) => Json(r.described(&subject, n, id)).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            40402,
            format!("Version {version} not found."),
        ),
    }
}

async fn stats(State(s): State<Shared>) -> Response {
    let r = s.lock().expect("lock");
    let counts: HashMap<&str, u64> = [
        ("schemas", r.schemas.len() as u64),
        ("subjects", r.subjects.len() as u64),
        ("lookups_by_id", r.lookups_by_id),
    ]
    .into_iter()
    .collect();
    Json(counts).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The REST answers a serializer reads, over HTTP.
    #[tokio::test]
    async fn registers_looks_up_and_serves_schemas_as_the_registry_does() {
        let reg = SchemaRegistry::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let c = reqwest::Client::new();
        let url = |p: &str| format!("{}{p}", reg.url());
        let avro = r#"{"type":"string"}"#;
        let post = |p: &'static str, body: Value| {
            let c = c.clone();
            let u = url(p);
            async move {
                let r = c.post(u).json(&body).send().await.unwrap();
                (r.status().as_u16(), r.json::<Value>().await.unwrap())
            }
        };
        let get = |p: &'static str| {
            let c = c.clone();
            let u = url(p);
            async move {
                let r = c.get(u).send().await.unwrap();
                (r.status().as_u16(), r.json::<Value>().await.unwrap())
            }
        };
        assert_eq!(
            post("/subjects/orders-value/versions", json!({"schema": avro})).await,
            (200, json!({"id": 1}))
        );
        // The same schema again, and under another subject: the same id.
        assert_eq!(
            post("/subjects/orders-value/versions", json!({"schema": avro})).await,
            (200, json!({"id": 1}))
        );
        assert_eq!(
            post("/subjects/other-value/versions", json!({"schema": avro})).await,
            (200, json!({"id": 1}))
        );
        let proto = "syntax = \"proto3\"; message M { int32 a = 1; }";
        assert_eq!(
            post(
                "/subjects/orders-value/versions",
                json!({"schema": proto, "schemaType": "PROTOBUF"})
            )
            .await,
            (200, json!({"id": 2}))
        );
        assert_eq!(get("/schemas/ids/1").await, (200, json!({"schema": avro})));
        assert_eq!(
            get("/schemas/ids/2").await,
            (200, json!({"schema": proto, "schemaType": "PROTOBUF"}))
        );
        let (status, body) = get("/schemas/ids/3").await;
        assert_eq!((status, &body["error_code"]), (404, &json!(40403)));
        assert_eq!(reg.lookups_by_id(), 3);
        assert_eq!(
            get("/subjects").await,
            (200, json!(["orders-value", "other-value"]))
        );
        assert_eq!(
            get("/subjects/orders-value/versions").await,
            (200, json!([1, 2]))
        );
        assert_eq!(
            get("/subjects/orders-value/versions/latest").await,
            (
                200,
                json!({"subject": "orders-value", "version": 2, "id": 2, "schema": proto, "schemaType": "PROTOBUF"})
            )
        );
        assert_eq!(
            post("/subjects/orders-value", json!({"schema": avro})).await,
            (
                200,
                json!({"subject": "orders-value", "version": 1, "id": 1, "schema": avro})
            )
        );
        let (status, body) = post("/subjects/orders-value", json!({"schema": "{}"})).await;
        assert_eq!((status, &body["error_code"]), (404, &json!(40403)));
        let (status, body) = get("/subjects/none/versions/1").await;
        assert_eq!((status, &body["error_code"]), (404, &json!(40401)));
        let (status, body) = get("/subjects/orders-value/versions/9").await;
        assert_eq!((status, &body["error_code"]), (404, &json!(40402)));
        assert_eq!(reg.register("direct", avro, "AVRO"), 1);
    }
}
