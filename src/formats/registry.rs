//! A Schema Registry client: the writer schema of a framed value, fetched by id once
//! (`GET /schemas/ids/{id}`) and kept for the life of the client.
//!
//! What an answer means is a plain function ([`meaning`]): 200 with a registry's
//! answer is the schema; 404 with the registry's own not-found code (40403, or
//! 40401/40402 for a reference) says the schema is unknown, which is the record's
//! problem (its decode policy decides); 401 and 403 say the credentials are refused,
//! which no retry cures; anything else (no answer, 5xx, a 404 or a 200 page from
//! something in front of the registry) is the registry being away: retried with backoff
//! over every URL until the lookup's time is up, and only then a failure of the job
//! (whose restart strategy applies). A registry outage therefore never skips or
//! dead-letters a record.

use crate::clients::backoff::backoff;
use crate::clients::http::error_chain;
use crate::secret::redact_url;
use rand::Rng as _;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A schema as the registry serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredSchema {
    pub id: u32,
    /// The schema's text (Avro JSON, a `.proto` file, a JSON Schema document).
    pub schema: String,
    pub schema_type: SchemaType,
    /// The schemas it imports, as `(name, subject, version)`.
    pub references: Vec<(String, String, u32)>,
}

/// The registry's `schemaType` (absent: Avro).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaType {
    Avro,
    Protobuf,
    Json,
}

/// Why a schema could not be had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchError {
    /// The registry says it does not know the schema (or serves one of a type lockgate
    /// does not read):
    /// the record follows `on_decode_error`.
    Unknown(String),
    /// The registry could not be asked (unreachable, 5xx, refused credentials) after
    /// every retry: the job fails.
    Unavailable(String),
}

/// What one answer of the registry means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Meaning {
    Schema(RegisteredSchema),
    Unknown(String),
    /// Retrying cannot help (refused credentials).
    Refused(String),
    /// Retry, perhaps at another URL.
    Retry(String),
}

/// What is asked of the registry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Lookup {
    /// `GET /schemas/ids/{id}`: a framed value's writer schema.
    Id(u32),
    /// `GET /subjects/{subject}/versions/{version}`: a schema's reference.
    Version { subject: String, version: u32 },
}

impl Lookup {
    /// The request's URL under `base` (path segments escaped: reference subjects are
    /// often file names such as `google/type/money.proto`).
    fn url(&self, base: &str) -> Result<reqwest::Url, String> {
        let mut url = reqwest::Url::parse(base).map_err(|e| format!("{base}: {e}"))?;
        {
            let mut path = url
                .path_segments_mut()
                .map_err(|_| format!("{base} cannot hold a path"))?;
            path.pop_if_empty();
            match self {
                Lookup::Id(id) => path.extend(["schemas", "ids", &id.to_string()]),
                Lookup::Version { subject, version } => {
                    path.extend(["subjects", subject, "versions", &version.to_string()])
                }
            };
        }
        // A reference names a version that a later soft delete does not take from the
        // schemas that use it.
        if matches!(self, Lookup::Version { .. }) {
            url.query_pairs_mut().append_pair("deleted", "true");
        }
        Ok(url)
    }
}

impl std::fmt::Display for Lookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lookup::Id(id) => write!(f, "schema id {id}"),
            Lookup::Version { subject, version } => {
                write!(f, "subject {subject:?} version {version}")
            }
        }
    }
}

/// The meaning of the registry's answer `status` / `body` to `lookup` (`status`
/// `None`: no answer).
pub fn meaning(lookup: &Lookup, status: Option<u16>, body: &[u8]) -> Meaning {
    let text = || String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
    match status {
        Some(200) => match parse(lookup, body) {
            Ok(Parsed::Schema(s)) => Meaning::Schema(s),
            Ok(Parsed::Unreadable(e)) => Meaning::Unknown(format!("{lookup}: {e}")),
            // A 200 that is not a registry's answer comes from something in front of it
            // (a proxy's maintenance page): the registry is away, not the schema.
            Err(e) => Meaning::Retry(format!("the answer is not a registry's: {e}: {}", text())),
        },
        // Only the registry's own "not found" codes are the schema's: a 404 from a
        // wrong path or a proxy while the registry moves is the registry being away.
        Some(404) if registry_error_code(body).is_some_and(|c| NOT_FOUND.contains(&c)) => {
            Meaning::Unknown(format!("{lookup} is unknown to the registry: {}", text()))
        }
        Some(s @ (401 | 403)) => Meaning::Refused(format!(
            "the registry refused the credentials ({s}): {}",
            text()
        )),
        Some(s) => Meaning::Retry(format!("the registry answered {s}: {}", text())),
        None => Meaning::Retry(text()),
    }
}

/// The registry's error codes that say a schema, subject or version does not exist
/// (40403 schema, 40401 subject, 40402 version).
const NOT_FOUND: [u64; 3] = [40401, 40402, 40403];

/// The `error_code` of a registry's error answer.
fn registry_error_code(body: &[u8]) -> Option<u64> {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()?
        .get("error_code")?
        .as_u64()
}

/// A registry's answer with a schema: one lockgate reads, or one it cannot (of a type
/// it does not know).
enum Parsed {
    Schema(RegisteredSchema),
    Unreadable(String),
}

fn parse(lookup: &Lookup, body: &[u8]) -> Result<Parsed, String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Answer {
        #[serde(default)]
        id: Option<u32>,
        schema: String,
        #[serde(default)]
        schema_type: Option<String>,
        #[serde(default)]
        references: Vec<Reference>,
    }
    #[derive(serde::Deserialize)]
    struct Reference {
        name: String,
        subject: String,
        version: u32,
    }
    let a: Answer =
        serde_json::from_slice(body).map_err(|e| format!("not a registry answer: {e}"))?;
    let schema_type = match a.schema_type.as_deref() {
        None | Some("AVRO") => SchemaType::Avro,
        Some("PROTOBUF") => SchemaType::Protobuf,
        Some("JSON") => SchemaType::Json,
        Some(other) => {
            return Ok(Parsed::Unreadable(format!(
                "schema type {other} is not one lockgate reads"
            )))
        }
    };
    let id = match lookup {
        Lookup::Id(id) => *id,
        Lookup::Version { .. } => a.id.unwrap_or(0),
    };
    Ok(Parsed::Schema(RegisteredSchema {
        id,
        schema: a.schema,
        schema_type,
        references: a
            .references
            .into_iter()
            .map(|r| (r.name, r.subject, r.version))
            .collect(),
    }))
}

/// A writer schema with every schema it references, directly or not, each under the
/// name it is imported by, dependencies before what depends on them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedSchema {
    pub schema: Arc<RegisteredSchema>,
    pub references: Vec<(String, Arc<RegisteredSchema>)>,
}

/// How deep references may nest before the schema is refused (a cycle, or a registry
/// gone wrong).
const MAX_REFERENCE_DEPTH: usize = 32;

/// How the client retries a registry that is away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// How long one lookup may go on retrying, over all URLs, before the job fails:
    /// the subtask waits meanwhile, so it should end well within a checkpoint's
    /// timeout.
    pub timeout: Duration,
    pub initial_ms: u64,
    pub max_ms: u64,
}

impl Default for Retry {
    /// 30 s of retries, 200 ms doubling to 5 s apart.
    fn default() -> Retry {
        Retry {
            timeout: Duration::from_secs(30),
            initial_ms: 200,
            max_ms: 5_000,
        }
    }
}

/// Fetches schemas by id (and their references by subject and version), each once.
pub struct RegistryClient {
    http: reqwest::Client,
    urls: Vec<String>,
    retry: Retry,
    /// One request's timeout (within what is left of the lookup's time).
    request_timeout: Duration,
    cache: Mutex<HashMap<Lookup, Arc<RegisteredSchema>>>,
}

impl std::fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryClient")
            .field(
                "urls",
                &self.urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl RegistryClient {
    /// A client of the registry at `urls` (tried in turn), with `http` (its timeouts,
    /// TLS and credentials are the caller's).
    pub fn new(http: reqwest::Client, urls: Vec<String>, retry: Retry) -> RegistryClient {
        RegistryClient {
            http,
            urls: urls
                .into_iter()
                .map(|u| u.trim_end_matches('/').to_string())
                .collect(),
            retry,
            request_timeout: TIMEOUT,
            cache: Mutex::default(),
        }
    }

    /// The same client with requests that time out after `timeout`.
    pub fn with_request_timeout(mut self, timeout: Duration) -> RegistryClient {
        self.request_timeout = timeout;
        self
    }

    /// The schema of `id`: from the cache, or from the registry (then cached).
    pub async fn schema(&self, id: u32) -> Result<Arc<RegisteredSchema>, FetchError> {
        let deadline = tokio::time::Instant::now() + self.retry.timeout;
        self.get(&Lookup::Id(id), deadline).await
    }

    /// The schema of `id` with the schemas it references (each fetched once).
    /// The whole lookup, references included, retries within one `Retry::timeout`.
    pub async fn resolved(&self, id: u32) -> Result<ResolvedSchema, FetchError> {
        let deadline = tokio::time::Instant::now() + self.retry.timeout;
        let schema = self.get(&Lookup::Id(id), deadline).await?;
        let mut references = Vec::new();
        self.references(&schema, 0, deadline, &mut references)
            .await
            .map_err(|e| match e {
                FetchError::Unknown(why) => FetchError::Unknown(format!("schema id {id}: {why}")),
                other => other,
            })?;
        Ok(ResolvedSchema { schema, references })
    }

    /// Adds the references of `s` to `out`, each after its own references.
    fn references<'a>(
        &'a self,
        s: &'a RegisteredSchema,
        depth: usize,
        deadline: tokio::time::Instant,
        out: &'a mut Vec<(String, Arc<RegisteredSchema>)>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), FetchError>> + Send + 'a>>
    {
        Box::pin(async move {
            for (name, subject, version) in &s.references {
                if out.iter().any(|(n, _)| n == name) {
                    continue;
                }
                if depth >= MAX_REFERENCE_DEPTH {
                    return Err(FetchError::Unknown(format!(
                        "references nest deeper than {MAX_REFERENCE_DEPTH} (a cycle?)"
                    )));
                }
                let lookup = Lookup::Version {
                    subject: subject.clone(),
                    version: *version,
                };
                let r = self.get(&lookup, deadline).await?;
                self.references(&r, depth + 1, deadline, out).await?;
                out.push((name.clone(), r));
            }
            Ok(())
        })
    }

    /// `lookup` from the cache or the registry, retrying until `deadline`; no request
    /// runs past it.
    async fn get(
        &self,
        lookup: &Lookup,
        deadline: tokio::time::Instant,
    ) -> Result<Arc<RegisteredSchema>, FetchError> {
        if let Some(s) = self.cache.lock().expect("lock").get(lookup) {
            return Ok(s.clone());
        }
        let mut last = String::from("no registry URL");
        let mut attempt: u32 = 0;
        loop {
            if attempt > 0 {
                let jitter = rand::thread_rng().gen::<f64>();
                let wait = backoff(attempt, self.retry.initial_ms, self.retry.max_ms, jitter);
                if tokio::time::Instant::now() + wait >= deadline {
                    break;
                }
                tokio::time::sleep(wait).await;
            }
            let Some(left) = deadline.checked_duration_since(tokio::time::Instant::now()) else {
                break;
            };
            attempt += 1;
            let url = &self.urls[(attempt as usize - 1) % self.urls.len().max(1)];
            let request = match lookup.url(url) {
                Ok(u) => self.http.get(u).timeout(left.min(self.request_timeout)),
                Err(e) => return Err(FetchError::Unavailable(e)),
            };
            let (status, body) = match request.send().await {
                Ok(r) => {
                    let status = r.status().as_u16();
                    match r.bytes().await {
                        Ok(b) => (Some(status), b.to_vec()),
                        Err(e) => (None, error_chain(&e).into_bytes()),
                    }
                }
                Err(e) => (None, error_chain(&e).into_bytes()),
            };
            match meaning(lookup, status, &body) {
                Meaning::Schema(s) => {
                    let s = Arc::new(s);
                    self.cache
                        .lock()
                        .expect("lock")
                        .insert(lookup.clone(), s.clone());
                    return Ok(s);
                }
                Meaning::Unknown(why) => return Err(FetchError::Unknown(why)),
                Meaning::Refused(why) => {
                    return Err(FetchError::Unavailable(format!(
                        "{} {why}",
                        redact_url(url)
                    )))
                }
                Meaning::Retry(why) => {
                    tracing::warn!(registry = %redact_url(url), lookup = %lookup, attempt, error = %why, "the Schema Registry did not answer; retrying");
                    last = format!("{}: {why}", redact_url(url));
                }
            }
        }
        Err(FetchError::Unavailable(format!(
            "the Schema Registry did not answer for {lookup} within {} ms, {attempt} attempts ({last})",
            self.retry.timeout.as_millis()
        )))
    }
}

/// The default request timeout of a registry client.
pub const TIMEOUT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_each_answer_means() {
        let avro = br#"{"schema":"\"string\""}"#;
        assert_eq!(
            meaning(&Lookup::Id(7), Some(200), avro),
            Meaning::Schema(RegisteredSchema {
                id: 7,
                schema: "\"string\"".into(),
                schema_type: SchemaType::Avro,
                references: vec![],
            })
        );
        let proto = br#"{"schema":"syntax = \"proto3\";","schemaType":"PROTOBUF","references":[{"name":"a.proto","subject":"a","version":2}]}"#;
        match meaning(&Lookup::Id(8), Some(200), proto) {
            Meaning::Schema(s) => {
                assert_eq!(s.schema_type, SchemaType::Protobuf);
                assert_eq!(s.references, vec![("a.proto".into(), "a".into(), 2)]);
            }
            other => panic!("{other:?}"),
        }
        let cases: &[(Option<u16>, &[u8], &str)] = &[
            (Some(404), br#"{"error_code":40403}"#, "Unknown"),
            (
                Some(404),
                br#"{"error_code":40401,"message":"Subject not found"}"#,
                "Unknown",
            ),
            (Some(404), b"<html>Not Found</html>", "Retry"),
            (Some(404), br#"{"error_code":404}"#, "Retry"),
            (Some(200), b"<html>", "Retry"),
            (
                Some(200),
                br#"{"schema":"x","schemaType":"XML"}"#,
                "Unknown",
            ),
            (Some(401), b"", "Refused"),
            (Some(403), b"", "Refused"),
            (Some(500), b"", "Retry"),
            (Some(503), b"", "Retry"),
            (Some(429), b"", "Retry"),
            (None, b"connection refused", "Retry"),
        ];
        for (status, body, want) in cases {
            let got = format!("{:?}", meaning(&Lookup::Id(1), *status, body));
            assert!(got.starts_with(want), "{status:?}: {got}");
        }
        // A reference's answer names its own id.
        let reference = Lookup::Version {
            subject: "shop/address.proto".into(),
            version: 3,
        };
        match meaning(
            &reference,
            Some(200),
            br#"{"subject":"shop/address.proto","version":3,"id":12,"schema":"x","schemaType":"PROTOBUF"}"#,
        ) {
            Meaning::Schema(s) => assert_eq!((s.id, s.schema_type), (12, SchemaType::Protobuf)),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            reference.url("http://r:8081/base").unwrap().as_str(),
            "http://r:8081/base/subjects/shop%2Faddress.proto/versions/3?deleted=true"
        );
        assert_eq!(
            Lookup::Id(7).url("http://r:8081/").unwrap().as_str(),
            "http://r:8081/schemas/ids/7"
        );
    }

    fn client(urls: Vec<String>, timeout_ms: u64) -> RegistryClient {
        let retry = Retry {
            timeout: Duration::from_millis(timeout_ms),
            initial_ms: 50,
            max_ms: 200,
        };
        RegistryClient::new(reqwest::Client::new(), urls, retry)
    }

    #[tokio::test]
    async fn a_schema_is_fetched_once_and_an_unknown_id_is_the_records_problem() {
        let reg =
            crate::testkit::schema_registry::SchemaRegistry::start("127.0.0.1:0".parse().unwrap())
                .await
                .unwrap();
        let id = reg.register("orders-value", r#""string""#, "AVRO");
        let c = client(vec![format!("{}/", reg.url())], 1_000);
        for _ in 0..3 {
            assert_eq!(c.schema(id).await.unwrap().schema, r#""string""#);
        }
        assert_eq!(reg.lookups_by_id(), 1, "fetched once, then from the cache");
        match c.schema(99).await {
            Err(FetchError::Unknown(why)) => assert!(why.contains("schema id 99"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    /// A registry that is away is waited for, not skipped: the fetch succeeds once it
    /// is back, and fails the job (Unavailable) only when the retry time is over.
    #[tokio::test]
    async fn a_registry_outage_is_retried_then_fails_the_job() {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = free.local_addr().unwrap();
        drop(free);
        let url = format!("http://{addr}");
        let c = client(vec![url.clone()], 300);
        let started = std::time::Instant::now();
        match c.schema(1).await {
            Err(FetchError::Unavailable(why)) => {
                assert!(why.contains("did not answer for schema id 1"), "{why}")
            }
            other => panic!("{other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        let c = client(vec![url], 20_000);
        let later = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(400)).await;
            let reg = crate::testkit::schema_registry::SchemaRegistry::start(addr)
                .await
                .unwrap();
            reg.register("s", r#""long""#, "AVRO");
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(reg);
        });
        assert_eq!(c.schema(1).await.unwrap().schema, r#""long""#);
        later.abort();
    }
}
