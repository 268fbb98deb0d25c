//! The Elasticsearch side of the bulk kit ([`crate::kits::bulk`]): the bulk API as a
//! [`BulkTransport`] (the actions' encoding is `encode.rs`'s [`EsEncoder`]). A request
//! is the encoded lines of its actions, sent as one buffer to `/_bulk`; its response is
//! read as far as it matters ([`parse_response`]); each item result is classified by
//! Elasticsearch's rules (`item_result`); refused actions go to the job's
//! [`FailureHandler`], the hook of the kit's failure policy. Batching, the in-flight
//! limit, retries, the flush at the barrier, the byte bound, dead letters and the
//! metrics are the kit's.

use super::action::{BulkAction, OpType};
use super::config::EsSinkConfig;
use super::encode::{Encoder, EsEncoder, Item};
use super::item_result::{classify, classify_request};
use crate::clients::http::{
    auth_refusal, auth_refusal_message, error_chain, refusal_body, TlsVerify,
};
use crate::clients::sigv4::SignedNode;
use crate::dead_letter::{DeadLetterWriter, OnError, Reason};
use crate::kits::bulk::{
    self, BulkParts, BulkTransport, Decision, FailurePolicy, ItemLabel, Limits, Outcome,
    RequestOutcome, Sent,
};
use crate::secret::redact_url;
use crate::telemetry::metrics::Metrics;
use bytes::Bytes;
use elasticsearch::http::headers::HeaderMap;
use elasticsearch::http::Method;
use elasticsearch::Elasticsearch;
use serde::de::{Deserializer as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tracing::warn;

pub use crate::kits::bulk::{ItemFailure, Shared, INVALID_DOCUMENT};

/// What to do with an action Elasticsearch refused (Flink's
/// ActionRequestFailureHandler): the bulk kit's decision over bulk actions.
pub type FailureDecision = Decision<BulkAction>;

/// Decides what happens to actions Elasticsearch refused (mapping or parse errors,
/// missing documents). Transient failures are retried before this is asked.
pub trait FailureHandler: Send + Sync {
    fn on_failure(&self, action: &BulkAction, failure: &ItemFailure) -> FailureDecision;
}

/// The handler of the job file's `on_item_error`: the bulk kit's [`FailurePolicy`]
/// without a hook. [`OnError::Skip`], which the job file does not offer there, drops
/// the action (counted as `dropped`).
pub struct PolicyFailureHandler(pub OnError);

impl FailureHandler for PolicyFailureHandler {
    fn on_failure(&self, action: &BulkAction, failure: &ItemFailure) -> FailureDecision {
        FailurePolicy::new(self.0.clone()).decide(SYSTEM, action, BulkAction::describe, failure)
    }
}

/// The system the kit names in its messages ("Elasticsearch refused ...").
const SYSTEM: &str = "Elasticsearch";

/// The Elasticsearch bulk API, as the bulk kit's transport: one client per node.
pub(crate) struct EsTransport {
    /// One client per node, in `nodes` order.
    clients: Vec<Elasticsearch>,
    /// The nodes as they may be printed.
    nodes: Vec<String>,
    /// Bulk requests ask for a filtered response, until a server refuses it.
    filter: Arc<AtomicBool>,
    /// How requests to each node are signed (`aws_sigv4`), in `nodes` order.
    signing: Option<Vec<SignedNode>>,
}

impl BulkTransport<Item> for EsTransport {
    fn system(&self) -> &'static str {
        SYSTEM
    }

    fn nodes(&self) -> usize {
        self.clients.len()
    }

    /// Each body is built once, into one buffer, which the client sends as it is.
    fn send(
        &self,
        node: usize,
        items: &[&Item],
    ) -> (
        usize,
        impl std::future::Future<Output = Sent> + Send + 'static,
    ) {
        let mut body = Vec::with_capacity(items.iter().map(|i| i.lines.len()).sum());
        let mut deletes = 0;
        for i in items {
            body.extend_from_slice(&i.lines);
            deletes += usize::from(i.op == OpType::Delete);
        }
        let bytes = body.len();
        let client = self.clients[node].clone();
        let filter = self.filter.clone();
        let signing = self.signing.as_ref().map(|s| s[node].clone());
        (
            bytes,
            send_bulk(client, signing, Bytes::from(body), deletes, filter),
        )
    }

    fn classify(
        &self,
        item: &Item,
        status: u16,
        error_type: Option<&str>,
    ) -> (Outcome, Option<ItemLabel>) {
        let outcome = classify(item.op, item.version.is_some(), status, error_type);
        let label = item_label(item.op, status, &outcome);
        (outcome, label)
    }

    fn classify_request(&self, status: Option<u16>) -> RequestOutcome {
        classify_request(status)
    }

    /// Refused credentials, naming the node.
    fn unrecoverable(&self, node: usize, sent: &Sent) -> Option<String> {
        match sent {
            Sent::Written { .. } => None,
            Sent::Request(status, body) => auth_refusal(*status).map(|what| {
                auth_refusal_message(
                    what,
                    &self.nodes[node],
                    status.unwrap_or_default(),
                    body.as_bytes(),
                )
            }),
            Sent::Items(results) => results
                .iter()
                .find(|(s, _, _)| auth_refusal(Some(*s)).is_some())
                .map(|(status, ty, reason)| {
                    let body = serde_json::json!({"error": {"type": ty, "reason": reason}});
                    auth_refusal_message(
                        auth_refusal(Some(*status)).unwrap_or_default(),
                        &self.nodes[node],
                        *status,
                        body.to_string().as_bytes(),
                    )
                }),
        }
    }

    /// By Elasticsearch's error type ([`Reason::of_refusal`]).
    fn reason(&self, failure: &ItemFailure) -> Reason {
        Reason::of_refusal(&failure.error_type)
    }
}

/// The Elasticsearch sink's bulk processor: the kit's, over [`EsEncoder`] and
/// [`EsTransport`].
pub(crate) type BulkProcessor = bulk::BulkProcessor<EsEncoder>;

impl bulk::BulkProcessor<EsEncoder> {
    /// Starts the processor task of `cfg` on the current runtime; it reports in
    /// `metrics` as sink subtask `subtask`.
    pub fn start(
        cfg: Arc<EsSinkConfig>,
        handler: Arc<dyn FailureHandler>,
        name: String,
        metrics: &Metrics,
        subtask: u16,
    ) -> Result<BulkProcessor, String> {
        let conn = &cfg.connection;
        conn.validate().map_err(|(k, m)| format!("{k}: {m}"))?;
        let timeout = Duration::from_millis(cfg.request_timeout_ms);
        let clients = (0..conn.nodes.len())
            .map(|i| conn.transport(i, timeout).map(Elasticsearch::new))
            .collect::<Result<Vec<_>, _>>()?;
        if conn.tls_verify == TlsVerify::None {
            warn!(
                sink = %name,
                "tls_verify = \"none\": the Elasticsearch server's certificate is not checked; anyone on the network path can read and change every document"
            );
        }
        let dead_letter = match &cfg.dead_letter_bootstrap_servers {
            Some(servers) => Some(
                DeadLetterWriter::new(servers, &cfg.dead_letter_properties.0)?.counted(
                    metrics,
                    crate::connector::SINK_UID,
                    subtask,
                    Reason::REFUSALS,
                ),
            ),
            None => None,
        };
        let limits = Limits {
            max_actions: cfg.bulk_max_actions,
            max_bytes: cfg.bulk_max_bytes,
            max_in_flight: cfg.max_in_flight.max(1),
            flush_interval_ms: cfg.bulk_flush_interval_ms.max(1),
            coalesce: cfg.coalesces(),
            one_action_per_document: cfg.one_write_per_document(),
            retry_max_attempts: cfg.retry_max_attempts,
            retry_initial_ms: cfg.retry_initial_ms,
            retry_max_ms: cfg.retry_max_ms,
        };
        let transport = EsTransport {
            nodes: conn.nodes.iter().map(|n| redact_url(n)).collect(),
            clients,
            filter: Arc::new(AtomicBool::new(true)),
            signing: conn.signing()?,
        };
        // The handler decides every refusal: it is the policy's hook, and always has
        // something to say.
        let policy = FailurePolicy::new(OnError::Fail)
            .with_hook(move |action, failure| Some(handler.on_failure(action, failure)));
        let parts = BulkParts {
            encoder: EsEncoder,
            transport,
            policy,
            dead_letter,
        };
        Ok(BulkProcessor::spawn(
            parts,
            limits,
            cfg.buffer_max_bytes,
            (metrics, subtask),
            name,
        ))
    }

    /// Adds actions. Waits (backpressure: the sink stops reading its input) while
    /// they would take the bytes held past `buffer_max_bytes`; when nothing is held,
    /// they are admitted whatever their size. Returns at once after a failure, which
    /// the sink then raises. Cancel safe until it hands the actions over.
    pub async fn add(&self, actions: Vec<BulkAction>) -> Result<(), String> {
        let mut encoder = Encoder::new();
        for a in actions {
            encoder.push(a);
        }
        self.add_encoded(&mut encoder).await
    }

    /// [`BulkProcessor::add`] of what `encoder` holds, which it takes. Cancel safe
    /// until it takes them: the encoder keeps them.
    pub async fn add_encoded(&self, encoder: &mut Encoder) -> Result<(), String> {
        if encoder.is_empty() {
            return Ok(());
        }
        self.add_with(encoder.bytes(), || encoder.take_batch())
            .await
    }
}

/// The outcome label of an item Elasticsearch answered, from the sink's decision about
/// it ([`classify`]); `None` for a refused or fatal one, which is counted once the
/// failure handler (or the job's failure) settles it.
pub fn item_label(op: OpType, status: u16, outcome: &Outcome) -> Option<ItemLabel> {
    match outcome {
        Outcome::Done => Some(match (op, status) {
            (OpType::Delete, 404) => ItemLabel::NotFound,
            (OpType::Delete, _) => ItemLabel::Deleted,
            (_, 201) => ItemLabel::Created,
            _ => ItemLabel::Updated,
        }),
        Outcome::AlreadyWritten => Some(ItemLabel::ConflictAlreadyWritten),
        Outcome::Retry => Some(ItemLabel::Retried),
        Outcome::Rejected | Outcome::Fatal => None,
    }
}

/// The written items of an `errors: false` response, whose results are only tallied
/// by status: `deletes` is how many of its actions were deletes.
fn written_labels(tally: &Tally, deletes: usize) -> [(ItemLabel, usize); 4] {
    // Every item was written: a delete answers 200 or 404, anything else 200 or 201.
    let rest = tally.items.saturating_sub(tally.created + tally.not_found);
    let deleted = deletes.saturating_sub(tally.not_found).min(rest);
    let updated = rest - deleted;
    [
        (ItemLabel::Created, tally.created),
        (ItemLabel::Updated, updated),
        (ItemLabel::Deleted, deleted),
        (ItemLabel::NotFound, tally.not_found),
    ]
}

/// The query of every bulk request, asking for only what the sink reads of each item (its status and
/// error): the response shrinks to a few bytes per item, which the cluster writes and
/// the sink reads that much faster. Error responses are not filtered by Elasticsearch;
/// a server that ignores the parameter answers in full, which reads the same.
pub const BULK_FILTER: &[(&str, &str)] = &[("filter_path", "errors,items.*.status,items.*.error")];

/// Posts one bulk body (with [`BULK_FILTER`] when `filtered`): the status and body of
/// the response, or what became of a request that got none.
async fn post(
    client: &Elasticsearch,
    signing: Option<&SignedNode>,
    body: Bytes,
    filtered: bool,
) -> Result<(u16, Bytes), Sent> {
    let sent = match signing {
        None => {
            client
                .transport()
                .send(
                    Method::Post,
                    "/_bulk",
                    HeaderMap::new(),
                    filtered.then_some(BULK_FILTER),
                    Some(body),
                    None,
                )
                .await
        }
        Some(node) => {
            let query = if filtered { BULK_FILTER } else { &[] };
            // Credentials that cannot be had now (STS or the instance not answering)
            // fail this attempt, which is retried; the node is not at fault.
            let signed = node
                .sign("POST", "/_bulk", query, Some(&body))
                .await
                .map_err(|e| Sent::Request(Some(429), e))?;
            client
                .transport()
                .send(
                    Method::Post,
                    &signed.path,
                    signed.headers,
                    None::<&()>,
                    signed.body.map(Bytes::from),
                    None,
                )
                .await
        }
    };
    let response = match sent {
        Ok(r) => r,
        Err(e) => {
            return Err(Sent::Request(
                e.status_code().map(|s| s.as_u16()),
                error_chain(&e),
            ))
        }
    };
    let status = response.status_code().as_u16();
    crate::fault::hit("bulk-response");
    match response.bytes().await {
        Ok(b) => Ok((status, b)),
        Err(e) => Err(Sent::Request(
            None,
            format!("reading the bulk response: {e}"),
        )),
    }
}

/// Whether a response refuses the `filter_path` parameter itself (a server that
/// implements the bulk API and not that option): 400, naming the parameter.
fn refuses_filter(status: u16, body: &[u8]) -> bool {
    status == 400 && memchr::memmem::find(body, b"filter_path").is_some()
}

/// Sends one bulk request of which `deletes` actions are deletes. The body goes to the
/// client as the one buffer it is (the bulk API's builder would copy it into another).
/// While `filter` holds, the request asks for a filtered response; a server that
/// refuses the parameter gets the same request again without it, and `filter` is
/// cleared for the sink's later requests (nothing was applied: the request was refused
/// before its items were read, and a replay of written actions rewrites the same
/// documents anyway).
async fn send_bulk(
    client: Elasticsearch,
    signing: Option<SignedNode>,
    body: Bytes,
    deletes: usize,
    filter: Arc<AtomicBool>,
) -> Sent {
    let filtered = filter.load(Ordering::Relaxed);
    let signing = signing.as_ref();
    let (mut status, mut bytes) = match post(&client, signing, body.clone(), filtered).await {
        Ok(answer) => answer,
        Err(sent) => return sent,
    };
    if filtered && refuses_filter(status, &bytes) {
        if filter.swap(false, Ordering::Relaxed) {
            warn!("the Elasticsearch server refused filter_path: bulk requests go without it, and read whole responses");
        }
        (status, bytes) = match post(&client, signing, body, false).await {
            Ok(answer) => answer,
            Err(sent) => return sent,
        };
    }
    if status != 200 {
        let kept = refusal_body(&bytes);
        if let Some(node) = signing.filter(|_| status == 403 && aws_retriable(&kept)) {
            // Expired credentials or a signature AWS thinks stale: new credentials
            // and a new signature may pass, so this attempt is retried, not fatal.
            node.signer.invalidate();
            return Sent::Request(
                Some(429),
                format!("AWS refused the request as expired (403: {kept}); retried with credentials fetched again"),
            );
        }
        return Sent::Request(Some(status), kept);
    }
    match parse_response(&bytes) {
        Ok(Parsed::Written(tally)) => {
            let mut by_label = [0; ItemLabel::ALL.len()];
            for (label, n) in written_labels(&tally, deletes) {
                by_label[label as usize] += n;
            }
            Sent::Written {
                items: tally.items,
                by_label,
            }
        }
        Ok(Parsed::Items(items)) => Sent::Items(
            items
                .into_iter()
                .map(|i| {
                    let error = |k: &str| {
                        i.error
                            .as_ref()
                            .and_then(|e| e.get(k))
                            .and_then(Value::as_str)
                            .map(String::from)
                    };
                    (i.status, error("type"), error("reason"))
                })
                .collect(),
        ),
        Err(why) => Sent::Request(None, why),
    }
}

/// Whether AWS's 403 (its kept body) says the credentials or the signature expired,
/// which new credentials and a new signature fix; any other 403 is final.
fn aws_retriable(kept: &str) -> bool {
    let m = kept.to_ascii_lowercase();
    m.contains("security token included in the request is expired")
        || m.contains("signature expired")
        || m.contains("expiredtoken")
}

/// A bulk response, as far as the processor reads it.
#[derive(Debug, PartialEq)]
enum Parsed {
    /// `errors: false`: the item results, tallied by status (nothing else of them is
    /// kept).
    Written(Tally),
    /// The item results, in request order.
    Items(Vec<ItemReply>),
}

/// One item result: its status, and its error if it has one (only failed items have
/// one, so only they allocate). Every other key is skipped unread.
#[derive(Debug, PartialEq)]
struct ItemReply {
    status: u16,
    error: Option<Value>,
}

/// A key of a bulk response's item, read as raw bytes: no UTF-8 check and no
/// allocation for the keys lockgate skips (a response has several per item, and reading
/// them was most of the cost of a response).
enum ItemKey {
    Status,
    Error,
    Other,
}

impl<'de> serde::Deserialize<'de> for ItemKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ItemKey, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ItemKey;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a key")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<ItemKey, E> {
                Ok(match v {
                    b"status" => ItemKey::Status,
                    b"error" => ItemKey::Error,
                    _ => ItemKey::Other,
                })
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ItemKey, E> {
                self.visit_bytes(v.as_bytes())
            }
        }
        d.deserialize_bytes(V)
    }
}

impl<'de> serde::Deserialize<'de> for ItemReply {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ItemReply, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ItemReply;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a bulk item result")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ItemReply, A::Error> {
                use serde::de::Error as _;
                let (mut status, mut error) = (None, None);
                while let Some(key) = map.next_key::<ItemKey>()? {
                    match key {
                        ItemKey::Status if status.is_some() => {
                            return Err(A::Error::duplicate_field("status"))
                        }
                        ItemKey::Status => status = Some(map.next_value::<u16>()?),
                        ItemKey::Error if error.is_some() => {
                            return Err(A::Error::duplicate_field("error"))
                        }
                        ItemKey::Error => error = Some(map.next_value::<Option<Value>>()?),
                        ItemKey::Other => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(ItemReply {
                    status: status.unwrap_or_default(),
                    error: error.flatten(),
                })
            }
        }
        d.deserialize_map(V)
    }
}

/// Reads a bulk response without building a tree of it. Elasticsearch writes `errors`
/// before `items`: when it is false, the items are only tallied by status (every one
/// was written); otherwise, or when a server writes them in the other order, each item's
/// status and error are read.
fn parse_response(body: &[u8]) -> Result<Parsed, String> {
    struct Top;
    impl<'de> Visitor<'de> for Top {
        type Value = Result<Parsed, String>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a bulk response object")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut errors = None;
            let mut items = None;
            while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                match &*key {
                    "errors" => errors = Some(map.next_value::<bool>()?),
                    "items" if errors == Some(false) => {
                        items = Some(Parsed::Written(map.next_value::<Tally>()?))
                    }
                    "items" => {
                        let all = map.next_value::<Vec<Envelope>>()?;
                        items = Some(Parsed::Items(all.into_iter().map(|e| e.0).collect()))
                    }
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            Ok(items.ok_or_else(|| "bulk response without items".to_string()))
        }
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed = de
        .deserialize_map(Top)
        .and_then(|p| de.end().map(|()| p))
        .map_err(|e| format!("unreadable bulk response: {e}"))?;
    parsed
}

/// The item results of an `errors: false` response, counted by status without being
/// kept: how many, how many created a document (201), how many deletes found none
/// (404). The rest answered 200: updated, or deleted.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    items: usize,
    created: usize,
    not_found: usize,
}

impl<'de> serde::Deserialize<'de> for Tally {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Tally, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Tally;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Tally, S::Error> {
                let mut t = Tally::default();
                while let Some(Envelope(reply)) = seq.next_element::<Envelope>()? {
                    t.items += 1;
                    match reply.status {
                        201 => t.created += 1,
                        404 => t.not_found += 1,
                        _ => {}
                    }
                }
                Ok(t)
            }
        }
        d.deserialize_seq(V)
    }
}

/// An item of `items`: `{"<operation>": {...}}`, of which the first value is the
/// result (anything else reads as an empty result: status 0, no error).
struct Envelope(ItemReply);

impl<'de> serde::Deserialize<'de> for Envelope {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Envelope, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Envelope;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a bulk item")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Envelope, A::Error> {
                let mut reply = None;
                while map.next_key::<ItemKey>()?.is_some() {
                    if reply.is_none() {
                        reply = Some(map.next_value::<ItemReply>()?);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(Envelope(reply.unwrap_or(ItemReply {
                    status: 0,
                    error: None,
                })))
            }
        }
        d.deserialize_map(V)
    }
}

#[cfg(test)]
mod tests {
    use super::{item_label, parse_response, written_labels, ItemLabel, ItemReply, Parsed, Tally};

    #[test]
    fn an_expired_aws_credential_is_retried_and_a_wrong_signature_is_not() {
        use super::{aws_retriable, refusal_body};
        let kept =
            |m: &str| refusal_body(serde_json::json!({ "message": m }).to_string().as_bytes());
        assert!(aws_retriable(&kept(
            "The security token included in the request is expired"
        )));
        assert!(aws_retriable(&kept(
            "Signature expired: 20260305T093000Z is now earlier than 20260305T093500Z"
        )));
        assert!(!aws_retriable(&kept(
            "The request signature we calculated does not match the signature you provided."
        )));
        assert!(!aws_retriable(&kept(
            "The security token included in the request is invalid."
        )));
        assert!(!aws_retriable(
            r#"{"error":{"type":"security_exception","reason":"no permissions"}}"#
        ));
    }
    use crate::connectors::elasticsearch::action::OpType;
    use crate::connectors::elasticsearch::item_result::{classify, Outcome};
    use serde_json::json;

    #[test]
    fn a_bulk_response_is_read_as_far_as_it_matters() {
        let created = r#"{"index":{"_index":"i","_id":"1","_version":1,"result":"created","_shards":{"total":1,"successful":1,"failed":0},"_seq_no":0,"_primary_term":1,"status":201}}"#;
        let rejected = r#"{"create":{"_index":"i","_id":"2","status":429,"error":{"type":"es_rejected_execution_exception","reason":"queue \"full\""}}}"#;
        let updated =
            r#"{"index":{"_index":"i","_id":"1","_version":2,"result":"updated","status":200}}"#;
        let deleted =
            r#"{"delete":{"_index":"i","_id":"1","_version":3,"result":"deleted","status":200}}"#;
        let missing =
            r#"{"delete":{"_index":"i","_id":"9","_version":1,"result":"not_found","status":404}}"#;
        let reply = |status, error| ItemReply { status, error };
        let tally = |items, created, not_found| Tally {
            items,
            created,
            not_found,
        };
        let cases: Vec<(String, Result<Parsed, &str>)> = vec![
            // errors: false (Elasticsearch writes it first): only counted.
            (
                format!(r#"{{"errors":false,"took":3,"items":[{created},{created}]}}"#),
                Ok(Parsed::Written(tally(2, 2, 0))),
            ),
            (
                format!(
                    r#"{{"errors":false,"took":3,"items":[{created},{updated},{deleted},{missing}]}}"#
                ),
                Ok(Parsed::Written(tally(4, 1, 1))),
            ),
            (
                r#"{"errors":false,"took":3,"items":[]}"#.into(),
                Ok(Parsed::Written(tally(0, 0, 0))),
            ),
            // errors: true: every item's status and error, in order.
            (
                format!(r#"{{"took":3,"errors":true,"items":[{created},{rejected}]}}"#),
                Ok(Parsed::Items(vec![
                    reply(201, None),
                    reply(
                        429,
                        Some(
                            json!({"type": "es_rejected_execution_exception", "reason": "queue \"full\""}),
                        ),
                    ),
                ])),
            ),
            // items before errors, or no errors at all: the items are read.
            (
                format!(r#"{{"items":[{created}],"errors":false}}"#),
                Ok(Parsed::Items(vec![reply(201, None)])),
            ),
            (
                format!(r#"{{"items":[{created}]}}"#),
                Ok(Parsed::Items(vec![reply(201, None)])),
            ),
            // An item that is not a result reads as one without a status.
            (
                r#"{"errors":true,"items":[{}]}"#.into(),
                Ok(Parsed::Items(vec![reply(0, None)])),
            ),
            // Keys are compared after unescaping; `"error": null` is no error; a key
            // given twice or a status that is not a number is unreadable.
            (
                r#"{"errors":true,"items":[{"index":{"st\u0061tus":409,"error":null,"_id":"a\"b"}}]}"#
                    .into(),
                Ok(Parsed::Items(vec![reply(409, None)])),
            ),
            (
                r#"{"errors":false,"items":[{"index":{"status":201,"status":201}}]}"#.into(),
                Err("duplicate field `status`"),
            ),
            (
                r#"{"errors":true,"items":[{"index":{"status":"201"}}]}"#.into(),
                Err("unreadable"),
            ),
            (r#"{"errors":false,"took":3}"#.into(), Err("without items")),
            (r#"{"errors":false,"items":[{}"#.into(), Err("unreadable")),
            (r#"{"errors":false,"items":[]} x"#.into(), Err("unreadable")),
            ("[]".into(), Err("unreadable")),
        ];
        for (body, want) in cases {
            match (parse_response(body.as_bytes()), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{body}"),
                (Err(e), Err(w)) => assert!(e.contains(w), "{body}: {e}"),
                (got, want) => panic!("{body}: got {got:?}, want {want:?}"),
            }
        }
    }

    /// An item's outcome label follows the sink's own decision about it.
    #[test]
    fn an_item_is_counted_under_the_outcome_the_sink_decided() {
        use ItemLabel::*;
        let rejected = Some("es_rejected_execution_exception");
        let conflict = Some("version_conflict_engine_exception");
        /// Operation, external versions, status, error type, and the label.
        type Case<'a> = (OpType, bool, u16, Option<&'a str>, Option<ItemLabel>);
        let cases: &[Case] = &[
            (OpType::Index, false, 201, None, Some(Created)),
            (OpType::Create, false, 201, None, Some(Created)),
            (OpType::Update, false, 201, None, Some(Created)),
            (OpType::Index, false, 200, None, Some(Updated)),
            (OpType::Update, false, 200, None, Some(Updated)),
            (OpType::Delete, false, 200, None, Some(Deleted)),
            (OpType::Delete, false, 404, None, Some(NotFound)),
            (
                OpType::Create,
                false,
                409,
                conflict,
                Some(ConflictAlreadyWritten),
            ),
            (
                OpType::Index,
                true,
                409,
                conflict,
                Some(ConflictAlreadyWritten),
            ),
            (OpType::Update, false, 409, conflict, Some(Retried)),
            (OpType::Index, false, 429, rejected, Some(Retried)),
            (OpType::Index, false, 503, None, Some(Retried)),
            // Refused or fatal: counted when settled (dead-lettered, failed, ...).
            (OpType::Index, false, 409, conflict, None),
            (
                OpType::Index,
                false,
                400,
                Some("document_parsing_exception"),
                None,
            ),
            (OpType::Index, false, 403, Some("security_exception"), None),
        ];
        for (op, external, status, ty, want) in cases {
            let outcome = classify(*op, *external, *status, *ty);
            assert_eq!(
                item_label(*op, *status, &outcome),
                *want,
                "{op:?} external={external} {status} {ty:?} ({outcome:?})"
            );
        }
        assert_eq!(
            item_label(OpType::Delete, 404, &Outcome::Done),
            Some(NotFound)
        );
    }

    #[test]
    fn every_outcome_is_its_own_index() {
        for (i, o) in crate::kits::bulk::RequestLabel::ALL.into_iter().enumerate() {
            assert_eq!(o as usize, i, "{o:?}");
        }
        for (i, o) in ItemLabel::ALL.into_iter().enumerate() {
            assert_eq!(o as usize, i, "{o:?}");
        }
    }

    /// An `errors: false` response is tallied by status only: the deletes of the
    /// request tell deleted from updated among its 200s.
    #[test]
    fn a_written_response_is_counted_by_status_and_deletes() {
        let t = |items, created, not_found| Tally {
            items,
            created,
            not_found,
        };
        let counts = |tally: Tally, deletes| {
            written_labels(&tally, deletes)
                .iter()
                .map(|(l, n)| (l.label(), *n))
                .collect::<Vec<_>>()
        };
        // 3 created, 2 updated, 4 deletes of which 1 found nothing.
        assert_eq!(
            counts(t(9, 3, 1), 4),
            [
                ("created", 3),
                ("updated", 2),
                ("deleted", 3),
                ("not_found", 1)
            ]
        );
        assert_eq!(
            counts(t(5, 5, 0), 0),
            [
                ("created", 5),
                ("updated", 0),
                ("deleted", 0),
                ("not_found", 0)
            ]
        );
        // Never more deleted than 200s, whatever the server says.
        assert_eq!(
            counts(t(2, 2, 0), 2),
            [
                ("created", 2),
                ("updated", 0),
                ("deleted", 0),
                ("not_found", 0)
            ]
        );
    }
}
