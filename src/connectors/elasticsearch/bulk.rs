//! The bulk processor: buffers actions, sends bulk requests (at most `max_in_flight` at
//! once) when `bulk_max_actions`, `bulk_max_bytes` or `bulk_flush_interval_ms` is
//! reached, retries what is transient, and counts `pending`: actions added and not yet
//! terminally resolved (a retried action stays pending).
//!
//! It runs as its own task, so that the interval flush and retries go on while the
//! sink waits for records. Failures are recorded and raised by the sink at the next
//! record, the next checkpoint, or close — never lost.

use super::action::{frame, BulkAction};
pub use super::batcher::ItemFailure;
use super::batcher::{Batcher, ItemResult, Limits, Refusal, RequestId, Resolution, Response};
use super::coalesce::Effect;
use super::config::{EsSinkConfig, ItemErrorPolicy};
use super::connection::{auth_refusal, auth_refusal_message, TlsVerify};
use super::item_result::{classify, classify_request};
use super::nodes::NodeSelector;
use crate::connectors::dead_letter::{DeadLetter, DeadLetterWriter};
use crate::secret::redact_url;
use bytes::Bytes;
use elasticsearch::{BulkParts, Elasticsearch};
use rand::{Rng, SeedableRng};
use serde_json::Value;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tracing::{debug, warn};

/// What to do with a refused action (Flink's ActionRequestFailureHandler).
#[derive(Debug, Clone, PartialEq)]
pub enum FailureDecision {
    /// Send these actions instead (for example the document re-routed to another index).
    Requeue(Vec<BulkAction>),
    /// Write the original record and the error to this Kafka topic.
    DeadLetter(String),
    /// Fail the job with this message.
    Fail(String),
    /// Give the action up, deliberately (counted and logged at WARN).
    Drop,
}

/// Decides what happens to actions Elasticsearch refused (mapping or parse errors,
/// missing documents). Transient failures are retried before this is asked.
pub trait FailureHandler: Send + Sync {
    fn on_failure(&self, action: &BulkAction, failure: &ItemFailure) -> FailureDecision;
}

/// The handler of the job file's `on_item_error`.
pub struct PolicyFailureHandler(pub ItemErrorPolicy);

impl FailureHandler for PolicyFailureHandler {
    fn on_failure(&self, action: &BulkAction, failure: &ItemFailure) -> FailureDecision {
        match &self.0 {
            ItemErrorPolicy::Fail => FailureDecision::Fail(format!(
                "Elasticsearch refused {}: {} {}: {}",
                action.describe(),
                failure.status,
                failure.error_type,
                failure.reason
            )),
            ItemErrorPolicy::DeadLetter(t) => FailureDecision::DeadLetter(t.clone()),
        }
    }
}

/// State shared between the processor task and the sink.
#[derive(Default)]
pub struct Shared {
    pending: AtomicUsize,
    failure: Mutex<Option<String>>,
    /// The failure is one no restart can cure (the cluster refused the credentials).
    unrecoverable: std::sync::atomic::AtomicBool,
    bulks: AtomicUsize,
    coalesced: AtomicU64,
    superseded: AtomicU64,
}

impl Shared {
    /// Actions added and not yet terminally resolved.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::SeqCst)
    }

    /// The first recorded failure, if any.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().expect("lock").clone()
    }

    /// Bulk requests sent so far.
    pub fn bulks(&self) -> usize {
        self.bulks.load(Ordering::SeqCst)
    }

    /// Actions dropped unsent because a newer action on the same document made them
    /// irrelevant (coalescing).
    pub fn coalesced(&self) -> u64 {
        self.coalesced.load(Ordering::Relaxed)
    }

    /// Actions that failed retriably but were not retried, because a later action on
    /// the same document that makes them irrelevant was written.
    pub fn superseded(&self) -> u64 {
        self.superseded.load(Ordering::Relaxed)
    }

    /// Whether the recorded failure is one that no restart can cure (401 / 403): the
    /// job then fails without restarting.
    pub fn unrecoverable(&self) -> bool {
        self.unrecoverable.load(Ordering::SeqCst)
    }

    fn fail(&self, message: String) {
        let mut f = self.failure.lock().expect("lock");
        if f.is_none() {
            warn!(error = %message, "Elasticsearch sink failed");
            *f = Some(message);
        }
    }

    /// Records a failure that restarting cannot cure (it wins over any other).
    fn fail_unrecoverable(&self, message: String) {
        let mut f = self.failure.lock().expect("lock");
        if !self.unrecoverable.swap(true, Ordering::SeqCst) {
            warn!(error = %message, "Elasticsearch sink failed");
            *f = Some(message);
        }
    }

    fn resolve(&self, n: usize) {
        let before = self.pending.fetch_sub(n, Ordering::SeqCst);
        debug_assert!(before >= n, "pending went negative");
    }
}

enum Cmd {
    Add(Vec<BulkAction>),
    Flush(oneshot::Sender<()>),
    Close(oneshot::Sender<()>),
}

/// The sink's handle on the processor task.
pub struct BulkProcessor {
    tx: mpsc::Sender<Cmd>,
    shared: Arc<Shared>,
}

impl BulkProcessor {
    /// Starts the processor task on the current runtime.
    pub fn start(
        cfg: Arc<EsSinkConfig>,
        handler: Arc<dyn FailureHandler>,
        name: String,
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
            Some(servers) => Some(DeadLetterWriter::new(
                servers,
                &cfg.dead_letter_properties.0,
            )?),
            None => None,
        };
        let shared = Arc::new(Shared::default());
        let (tx, rx) = mpsc::channel(4);
        let limits = Limits {
            max_actions: cfg.bulk_max_actions,
            max_bytes: cfg.bulk_max_bytes,
            max_in_flight: cfg.max_in_flight.max(1),
            flush_interval_ms: cfg.bulk_flush_interval_ms.max(1),
            coalesce: cfg.coalesce,
            retry_max_attempts: cfg.retry_max_attempts,
            retry_initial_ms: cfg.retry_initial_ms,
            retry_max_ms: cfg.retry_max_ms,
        };
        let service = Service {
            selector: NodeSelector::new(clients.len()),
            nodes: conn.nodes.iter().map(|n| redact_url(n)).collect(),
            clients,
            cfg,
            shared: shared.clone(),
            handler,
            dead_letter,
            batcher: Batcher::new(limits, 0),
            in_flight: JoinSet::new(),
            waiters: Vec::new(),
            epoch: Instant::now(),
            rng: rand::rngs::SmallRng::from_entropy(),
            name,
        };
        tokio::spawn(service.run(rx));
        Ok(BulkProcessor { tx, shared })
    }

    /// The shared counters and failure slot.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Adds actions (waits while the processor's buffer is full: backpressure).
    pub async fn add(&self, actions: Vec<BulkAction>) -> Result<(), String> {
        self.shared
            .pending
            .fetch_add(actions.len(), Ordering::SeqCst);
        self.tx
            .send(Cmd::Add(actions))
            .await
            .map_err(|_| "the bulk processor stopped".to_string())
    }

    /// Sends everything buffered and waits until nothing is pending (or a failure).
    pub async fn flush(&self) -> Result<(), String> {
        self.ask(Cmd::Flush).await
    }

    /// Flushes and stops the processor task.
    pub async fn close(&self) -> Result<(), String> {
        self.ask(Cmd::Close).await
    }

    /// Sends a command that answers when it is done.
    async fn ask(&self, cmd: fn(oneshot::Sender<()>) -> Cmd) -> Result<(), String> {
        let stopped = "the bulk processor stopped";
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(cmd(tx))
            .await
            .map_err(|_| stopped.to_string())?;
        rx.await.map_err(|_| stopped.to_string())
    }
}

struct Item {
    action: BulkAction,
    bytes: Bytes,
}

enum Sent {
    /// Per-item `(status, error type, reason)` in request order.
    Items(Vec<(u16, Option<String>, Option<String>)>),
    /// No item results: the status (None: connection error) and why.
    Request(Option<u16>, String),
}

struct Service {
    /// One client per node, in `nodes` order.
    clients: Vec<Elasticsearch>,
    /// The nodes as they may be printed.
    nodes: Vec<String>,
    /// Which node the next request goes to.
    selector: NodeSelector,
    cfg: Arc<EsSinkConfig>,
    shared: Arc<Shared>,
    handler: Arc<dyn FailureHandler>,
    dead_letter: Option<DeadLetterWriter>,
    /// Every batching decision (order per document, coalescing, retries, splits).
    batcher: Batcher<Item>,
    in_flight: JoinSet<(RequestId, usize, Sent)>,
    waiters: Vec<oneshot::Sender<()>>,
    /// The batcher's clock starts here.
    epoch: Instant,
    rng: rand::rngs::SmallRng,
    name: String,
}

impl Service {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Cmd>) {
        let mut closing: Option<oneshot::Sender<()>> = None;
        loop {
            let failed = self.shared.failure().is_some();
            if failed {
                // The job is failing: nothing more is sent, so nothing is kept.
                let dropped = self.batcher.clear_unsent();
                self.shared.resolve(dropped);
            }
            let accept = closing.is_none()
                && (failed || self.batcher.queued() < 4 * self.cfg.bulk_max_actions);
            let wake = self
                .batcher
                .next_wake_ms()
                .map_or(Instant::now() + Duration::from_secs(3600), |ms| {
                    self.epoch + Duration::from_millis(ms)
                });
            tokio::select! {
                cmd = rx.recv(), if accept => match cmd {
                    Some(Cmd::Add(actions)) => self.add(actions).await,
                    Some(Cmd::Flush(w)) => self.waiters.push(w),
                    Some(Cmd::Close(w)) => closing = Some(w),
                    None => return,
                },
                Some(done) = self.in_flight.join_next(), if !self.in_flight.is_empty() => match done {
                    Ok((id, node, sent)) => self.complete(id, node, sent),
                    Err(e) => self.shared.fail(format!("bulk request task failed: {e}")),
                },
                _ = tokio::time::sleep_until(wake.into()) => {}
            }
            self.settle().await;
            let failed = self.shared.failure().is_some();
            if !failed {
                self.dispatch(!self.waiters.is_empty() || closing.is_some());
                self.settle().await;
            }
            let idle = self.shared.pending() == 0 && self.in_flight.is_empty();
            if (idle || failed) && !self.waiters.is_empty() {
                for w in self.waiters.drain(..) {
                    let _ = w.send(());
                }
            }
            if (idle || failed) && closing.is_some() {
                if let Some(w) = closing.take() {
                    let _ = w.send(());
                }
                return;
            }
        }
    }

    async fn add(&mut self, actions: Vec<BulkAction>) {
        for mut action in actions {
            // Whatever built it, a body goes into a request only as one line of a JSON
            // object; anything else follows the failure handler, like a refused item.
            if let Some(body) = &action.body {
                match frame(body) {
                    Ok(None) => {}
                    Ok(Some(compact)) => action.body = Some(compact),
                    Err(why) => {
                        self.unframeable(action, why).await;
                        continue;
                    }
                }
            }
            let (doc, effect, bytes) = describe(&action);
            let item = encode(action);
            self.batcher
                .add(doc, effect, bytes.max(item.bytes.len()), item);
        }
    }

    /// An action whose body is not one JSON object: the failure handler decides, as for
    /// a document Elasticsearch refused.
    async fn unframeable(&mut self, action: BulkAction, why: String) {
        let failure = ItemFailure {
            status: 400,
            error_type: "invalid_document".into(),
            reason: why,
        };
        match self.handler.on_failure(&action, &failure) {
            FailureDecision::Fail(message) => self.shared.fail(message),
            FailureDecision::Drop => {
                warn!(action = %action.describe(), error = %failure.reason, "invalid document dropped by the failure handler");
                self.shared.resolve(1);
            }
            FailureDecision::DeadLetter(topic) => {
                match self.dead_letter(&action, &failure, &topic).await {
                    Ok(()) => self.shared.resolve(1),
                    Err(e) => self.shared.fail(e),
                }
            }
            FailureDecision::Requeue(_) => self.shared.fail(format!(
                "{}: {} (a replacement for a document that is not JSON is not accepted)",
                action.describe(),
                failure.reason
            )),
        }
    }

    /// Sends every request the batcher has ready (`force`: a flush or close is waiting).
    fn dispatch(&mut self, force: bool) {
        let now = self.now_ms();
        while let Some((id, items)) = self.batcher.next_request(now, force) {
            let body: Vec<Bytes> = items.iter().map(|i| i.bytes.clone()).collect();
            self.shared.bulks.fetch_add(1, Ordering::SeqCst);
            debug!(
                sink = %self.name,
                actions = body.len(),
                queued = self.batcher.queued(),
                pending = self.shared.pending(),
                force,
                "sending bulk request"
            );
            let node = self.selector.pick(now);
            let client = self.clients[node].clone();
            self.in_flight
                .spawn(async move { (id, node, send_bulk(&client, body).await) });
        }
    }

    /// Hands a response to the batcher, with what each item result means. A node that
    /// did not answer is quarantined; a refusal of the credentials fails the job for
    /// good, naming the node.
    fn complete(&mut self, id: RequestId, node: usize, sent: Sent) {
        match &sent {
            Sent::Request(None, _) => self.selector.failed(node, self.now_ms()),
            _ => self.selector.answered(node),
        }
        match &sent {
            Sent::Request(status, body) => {
                if let Some(what) = auth_refusal(*status) {
                    self.shared.fail_unrecoverable(auth_refusal_message(
                        what,
                        &self.nodes[node],
                        status.unwrap_or_default(),
                        body.as_bytes(),
                    ));
                }
            }
            Sent::Items(results) => {
                if let Some((status, ty, reason)) = results
                    .iter()
                    .find(|(s, _, _)| auth_refusal(Some(*s)).is_some())
                {
                    let body = serde_json::json!({"error": {"type": ty, "reason": reason}});
                    self.shared.fail_unrecoverable(auth_refusal_message(
                        auth_refusal(Some(*status)).unwrap_or_default(),
                        &self.nodes[node],
                        *status,
                        body.to_string().as_bytes(),
                    ));
                }
            }
        }
        let response = match sent {
            Sent::Items(results) => {
                let items = self.batcher.in_flight_payloads(id);
                if items.len() != results.len() {
                    Response::Items(Vec::new())
                } else {
                    Response::Items(
                        items
                            .iter()
                            .zip(results)
                            .map(|(item, (status, ty, reason))| {
                                let a = &item.action;
                                ItemResult {
                                    outcome: classify(
                                        a.op,
                                        a.version.is_some(),
                                        status,
                                        ty.as_deref(),
                                    ),
                                    failure: ItemFailure {
                                        status,
                                        error_type: ty.unwrap_or_default(),
                                        reason: reason.unwrap_or_default(),
                                    },
                                }
                            })
                            .collect(),
                    )
                }
            }
            Sent::Request(status, why) => Response::Failed(classify_request(status), why),
        };
        let (now, jitter) = (self.now_ms(), self.rng.gen());
        self.batcher.on_response(id, response, now, jitter);
    }

    /// Acts on what the batcher resolved: counts, failure handler, dead letters.
    async fn settle(&mut self) {
        loop {
            let resolved = self.batcher.drain_resolved();
            if resolved.is_empty() {
                return;
            }
            for r in resolved {
                match r {
                    Resolution::Written(_) => self.shared.resolve(1),
                    Resolution::Coalesced(_) => {
                        self.shared.coalesced.fetch_add(1, Ordering::Relaxed);
                        self.shared.resolve(1)
                    }
                    Resolution::Superseded(_) => {
                        self.shared.superseded.fetch_add(1, Ordering::Relaxed);
                        self.shared.resolve(1)
                    }
                    Resolution::Refused {
                        refusal,
                        payload,
                        failure,
                        attempts,
                    } => self.refused(refusal, payload, failure, attempts).await,
                    Resolution::Exhausted(item, why) => self
                        .shared
                        .fail(format!("{} {why}", item.action.describe())),
                    Resolution::Fatal(item, why) => self.shared.fail(format!(
                        "Elasticsearch refused {}: {why}",
                        item.action.describe()
                    )),
                }
            }
        }
    }

    /// Asks the failure handler about a refused action; the batcher holds its place in
    /// its document's order until the answer.
    async fn refused(&mut self, refusal: Refusal, item: Item, failure: ItemFailure, attempts: u32) {
        match self.handler.on_failure(&item.action, &failure) {
            FailureDecision::Fail(message) => {
                self.batcher.settle_refused(refusal);
                self.shared.fail(message)
            }
            FailureDecision::Drop => {
                warn!(action = %item.action.describe(), error = %failure.reason, "refused action dropped by the failure handler");
                self.batcher.settle_refused(refusal);
                self.shared.resolve(1);
            }
            FailureDecision::Requeue(actions) => {
                // Requeued actions take the refused one's place in its document's order,
                // and count its attempts, so that a handler requeuing forever fails the
                // job.
                if attempts + 1 > self.cfg.retry_max_attempts {
                    self.batcher.settle_refused(refusal);
                    self.shared.fail(format!(
                        "{} requeued {attempts} times by the failure handler and still refused: {}",
                        item.action.describe(),
                        failure.reason
                    ));
                    return;
                }
                self.shared
                    .pending
                    .fetch_add(actions.len(), Ordering::SeqCst);
                self.shared.resolve(1);
                let replacements = actions
                    .into_iter()
                    .map(|action| {
                        let (doc, effect, bytes) = describe(&action);
                        let item = encode(action);
                        let bytes = bytes.max(item.bytes.len());
                        (doc, effect, bytes, item)
                    })
                    .collect();
                self.batcher.requeue(refusal, replacements);
            }
            FailureDecision::DeadLetter(topic) => {
                let written = self.dead_letter(&item.action, &failure, &topic).await;
                self.batcher.settle_refused(refusal);
                match written {
                    Ok(()) => self.shared.resolve(1),
                    Err(e) => self.shared.fail(e),
                }
            }
        }
    }

    /// Writes the original record and the error to the dead-letter topic, waiting for
    /// the broker's acknowledgement: only then is the action resolved.
    async fn dead_letter(
        &self,
        action: &BulkAction,
        failure: &ItemFailure,
        topic: &str,
    ) -> Result<(), String> {
        let writer = self.dead_letter.as_ref().ok_or_else(|| {
            format!("dead-letter to {topic}: no Kafka bootstrap servers configured")
        })?;
        let error = format!(
            "{} {}: {}",
            failure.status, failure.error_type, failure.reason
        );
        let letter = DeadLetter {
            error: &error,
            origin: action
                .origin
                .as_ref()
                .map(|o| (&*o.stream, o.partition, o.offset)),
            index: Some(&action.index),
            id: Some(action.id.as_deref().unwrap_or_default()),
            key: None,
            payload: action
                .record
                .as_deref()
                .or(action.body.as_deref())
                .unwrap_or_default(),
        };
        writer
            .send(topic, &letter)
            .await
            .map_err(|e| format!("{e} ({})", action.describe()))
    }
}

/// The NDJSON lines of an action.
fn encode(action: BulkAction) -> Item {
    let mut buf = Vec::with_capacity(action.body.as_ref().map_or(0, Vec::len) + 96);
    action.encode(&mut buf);
    Item {
        action,
        bytes: Bytes::from(buf),
    }
}

/// What the batcher needs of an action: its document (index and id), its effect on
/// that document, and an estimate of its size.
fn describe(action: &BulkAction) -> (Option<String>, Effect, usize) {
    let doc = action
        .id
        .as_ref()
        .map(|id| format!("{}\u{0}{id}", action.index));
    let size = action.body.as_ref().map_or(0, Vec::len) + 64;
    (doc, Effect::of(action), size)
}

/// An error with its causes (`error sending request: ...: certificate verify failed`):
/// the HTTP client's own message names only the URL, the cause is what a person needs.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cause = c.source();
    }
    s
}

async fn send_bulk(client: &Elasticsearch, body: Vec<Bytes>) -> Sent {
    let response = match client.bulk(BulkParts::None).body(body).send().await {
        Ok(r) => r,
        Err(e) => return Sent::Request(e.status_code().map(|s| s.as_u16()), error_chain(&e)),
    };
    let status = response.status_code().as_u16();
    crate::fault::hit("bulk-response");
    let bytes = match response.bytes().await {
        Ok(b) => b,
        Err(e) => return Sent::Request(None, format!("reading the bulk response: {e}")),
    };
    if status != 200 {
        return Sent::Request(
            Some(status),
            String::from_utf8_lossy(&bytes[..bytes.len().min(500)]).into_owned(),
        );
    }
    let v: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => return Sent::Request(None, format!("unreadable bulk response: {e}")),
    };
    let Some(items) = v.get("items").and_then(Value::as_array) else {
        return Sent::Request(None, "bulk response without items".into());
    };
    Sent::Items(
        items
            .iter()
            .map(|item| {
                let r = item
                    .as_object()
                    .and_then(|o| o.values().next())
                    .cloned()
                    .unwrap_or(Value::Null);
                let status = r.get("status").and_then(Value::as_u64).unwrap_or(0) as u16;
                let ty = r
                    .pointer("/error/type")
                    .and_then(Value::as_str)
                    .map(String::from);
                let reason = r
                    .pointer("/error/reason")
                    .and_then(Value::as_str)
                    .map(String::from);
                (status, ty, reason)
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[derive(Debug)]
    struct E(&'static str, Option<Box<E>>);
    impl std::fmt::Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for E {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn an_error_names_its_causes_once() {
        let e = E(
            "error sending request",
            Some(Box::new(E(
                "client error (Connect)",
                Some(Box::new(E("certificate verify failed", None))),
            ))),
        );
        assert_eq!(
            error_chain(&e),
            "error sending request: client error (Connect): certificate verify failed"
        );
        // A cause its parent already repeats is not repeated.
        let e = E(
            "timed out: operation timed out",
            Some(Box::new(E("operation timed out", None))),
        );
        assert_eq!(error_chain(&e), "timed out: operation timed out");
    }
}
