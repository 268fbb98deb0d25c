//! The bulk processor: buffers actions, sends bulk requests (at most `max_in_flight` at
//! once) when `bulk_max_actions`, `bulk_max_bytes` or `bulk_flush_interval_ms` is
//! reached, retries what is transient, and counts `pending`: actions added and not yet
//! terminally resolved (a retried action stays pending).
//!
//! It runs as its own task, so that the interval flush and retries go on while the
//! sink waits for records. Failures are recorded and raised by the sink at the next
//! record, the next checkpoint, or close — never lost.

use super::action::BulkAction;
use super::config::{EsSinkConfig, ItemErrorPolicy};
use super::item_result::{classify, classify_request, Outcome, RequestOutcome};
use super::retry::backoff;
use bytes::Bytes;
use elasticsearch::http::transport::{SingleNodeConnectionPool, TransportBuilder};
use elasticsearch::{BulkParts, Elasticsearch};
use rand::{Rng, SeedableRng};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::Value;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tracing::{debug, warn};

/// Why Elasticsearch refused an action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemFailure {
    /// The item's (or the request's) HTTP status.
    pub status: u16,
    pub error_type: String,
    pub reason: String,
}

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
    bulks: AtomicUsize,
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

    fn fail(&self, message: String) {
        let mut f = self.failure.lock().expect("lock");
        if f.is_none() {
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
        let url = elasticsearch::http::Url::parse(&cfg.url)
            .map_err(|e| format!("url {}: {e}", cfg.url))?;
        let transport = TransportBuilder::new(SingleNodeConnectionPool::new(url))
            .timeout(Duration::from_millis(cfg.request_timeout_ms))
            .disable_proxy()
            .build()
            .map_err(|e| format!("Elasticsearch client: {e}"))?;
        let dead_letter = match &cfg.dead_letter_bootstrap_servers {
            Some(servers) => Some(
                rdkafka::ClientConfig::new()
                    .set("bootstrap.servers", servers)
                    .set("acks", "all")
                    .create::<FutureProducer>()
                    .map_err(|e| format!("dead-letter producer: {e}"))?,
            ),
            None => None,
        };
        let shared = Arc::new(Shared::default());
        let (tx, rx) = mpsc::channel(4);
        let service = Service {
            client: Elasticsearch::new(transport),
            cfg,
            shared: shared.clone(),
            handler,
            dead_letter,
            buffer: VecDeque::new(),
            buffer_bytes: 0,
            ready: VecDeque::new(),
            retries: Vec::new(),
            in_flight: JoinSet::new(),
            waiters: Vec::new(),
            last_send: Instant::now(),
            rng: rand::rngs::SmallRng::from_entropy(),
            name,
            busy: std::collections::HashMap::new(),
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
    attempts: u32,
    /// `index` and `id`: actions on one document are sent in order, never two at once.
    doc: Option<String>,
}

enum Sent {
    /// Per-item `(status, error type, reason)` in request order.
    Items(Vec<(u16, Option<String>, Option<String>)>),
    /// No item results: the status (None: connection error) and why.
    Request(Option<u16>, String),
}

struct Service {
    client: Elasticsearch,
    cfg: Arc<EsSinkConfig>,
    shared: Arc<Shared>,
    handler: Arc<dyn FailureHandler>,
    dead_letter: Option<FutureProducer>,
    buffer: VecDeque<Item>,
    buffer_bytes: usize,
    /// Batches to send as they are (halves of a request refused with 413).
    ready: VecDeque<Vec<Item>>,
    retries: Vec<(Instant, Item)>,
    in_flight: JoinSet<(Vec<Item>, Sent)>,
    waiters: Vec<oneshot::Sender<()>>,
    last_send: Instant,
    rng: rand::rngs::SmallRng,
    name: String,
    /// Per document: actions outside the buffer (in flight, awaiting a retry, or split
    /// for resending). A buffered action on a busy document waits: with several
    /// requests in flight, or a retry, a later update could otherwise be applied first
    /// and be overwritten by an earlier one.
    busy: std::collections::HashMap<String, usize>,
}

impl Service {
    async fn run(mut self, mut rx: mpsc::Receiver<Cmd>) {
        let mut closing: Option<oneshot::Sender<()>> = None;
        let interval = Duration::from_millis(self.cfg.bulk_flush_interval_ms.max(1));
        loop {
            let failed = self.shared.failure().is_some();
            if failed && !self.buffer.is_empty() {
                // The job is failing: nothing more is sent, so nothing is kept.
                self.buffer.clear();
                self.retries.clear();
                self.buffer_bytes = 0;
            }
            let accept =
                closing.is_none() && (failed || self.buffer.len() < 4 * self.cfg.bulk_max_actions);
            let wake = self.next_wake(interval);
            tokio::select! {
                cmd = rx.recv(), if accept => match cmd {
                    Some(Cmd::Add(actions)) => self.add(actions),
                    Some(Cmd::Flush(w)) => self.waiters.push(w),
                    Some(Cmd::Close(w)) => closing = Some(w),
                    None => return,
                },
                Some(done) = self.in_flight.join_next(), if !self.in_flight.is_empty() => match done {
                    Ok((items, sent)) => self.complete(items, sent).await,
                    Err(e) => self.shared.fail(format!("bulk request task failed: {e}")),
                },
                _ = tokio::time::sleep_until(wake.into()) => {}
            }
            let now = Instant::now();
            self.promote_due(now);
            let failed = self.shared.failure().is_some();
            if !failed {
                let force = !self.waiters.is_empty()
                    || closing.is_some()
                    || now.duration_since(self.last_send) >= interval;
                self.dispatch(force);
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

    fn next_wake(&self, interval: Duration) -> Instant {
        let far = Instant::now() + Duration::from_secs(3600);
        let retry = self.retries.iter().map(|(t, _)| *t).min().unwrap_or(far);
        // The interval flush only matters when something could be sent now: otherwise
        // the loop wakes on a completed request or a due retry (no busy waiting).
        let sendable = self.in_flight.len() < self.cfg.max_in_flight
            && self
                .buffer
                .iter()
                .any(|i| i.doc.as_ref().is_none_or(|d| !self.busy.contains_key(d)));
        let flush = if sendable {
            self.last_send + interval
        } else {
            far
        };
        retry.min(flush)
    }

    fn encode(&self, action: BulkAction) -> Item {
        let mut buf = Vec::with_capacity(action.body.as_ref().map_or(0, Vec::len) + 96);
        action.encode(&mut buf);
        let doc = action
            .id
            .as_ref()
            .map(|id| format!("{}\u{0}{id}", action.index));
        Item {
            action,
            bytes: Bytes::from(buf),
            attempts: 0,
            doc,
        }
    }

    fn add(&mut self, actions: Vec<BulkAction>) {
        for action in actions {
            let item = self.encode(action);
            self.buffer_bytes += item.bytes.len();
            self.buffer.push_back(item);
        }
        // The Nth action of `bulk_max_actions = N` sends a bulk.
        self.dispatch(false);
    }

    fn promote_due(&mut self, now: Instant) {
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retries)
            .into_iter()
            .partition(|(t, _)| *t <= now);
        self.retries = later;
        // Pushed to the front in reverse, so that they keep their order.
        for (_, item) in due.into_iter().rev() {
            self.release(&item);
            self.buffer_bytes += item.bytes.len();
            self.buffer.push_front(item);
        }
    }

    /// Sends full batches, and with `force` also a partial one, while in-flight slots
    /// are free.
    fn dispatch(&mut self, force: bool) {
        while self.in_flight.len() < self.cfg.max_in_flight {
            if let Some(batch) = self.ready.pop_front() {
                self.send(batch);
                continue;
            }
            let full = self.buffer.len() >= self.cfg.bulk_max_actions
                || self.buffer_bytes >= self.cfg.bulk_max_bytes;
            if self.buffer.is_empty() || !(full || force) {
                return;
            }
            let mut batch = Vec::new();
            let mut bytes = 0;
            let mut waiting = VecDeque::new();
            // One action per document per request: Elasticsearch may reject one item of
            // a request and apply a later one on the same document.
            let mut in_batch = std::collections::HashSet::new();
            while let Some(item) = self.buffer.pop_front() {
                let blocked = item
                    .doc
                    .as_ref()
                    .is_some_and(|d| self.busy.contains_key(d) || in_batch.contains(d));
                if blocked {
                    waiting.push_back(item);
                    continue;
                }
                if let Some(d) = &item.doc {
                    in_batch.insert(d.clone());
                }
                if !batch.is_empty()
                    && (batch.len() >= self.cfg.bulk_max_actions
                        || bytes + item.bytes.len() > self.cfg.bulk_max_bytes)
                {
                    self.buffer.push_front(item);
                    break;
                }
                bytes += item.bytes.len();
                batch.push(item);
            }
            // Skipped actions keep their order, ahead of the rest.
            while let Some(item) = waiting.pop_back() {
                self.buffer.push_front(item);
            }
            self.buffer_bytes -= bytes;
            if batch.is_empty() {
                return;
            }
            for item in &batch {
                self.hold(item);
            }
            self.send(batch);
        }
    }

    fn hold(&mut self, item: &Item) {
        if let Some(d) = &item.doc {
            *self.busy.entry(d.clone()).or_insert(0) += 1;
        }
    }

    fn release(&mut self, item: &Item) {
        if let Some(d) = &item.doc {
            if let Some(n) = self.busy.get_mut(d) {
                *n -= 1;
                if *n == 0 {
                    self.busy.remove(d);
                }
            }
        }
    }

    fn send(&mut self, batch: Vec<Item>) {
        self.last_send = Instant::now();
        self.shared.bulks.fetch_add(1, Ordering::SeqCst);
        let client = self.client.clone();
        let body: Vec<Bytes> = batch.iter().map(|i| i.bytes.clone()).collect();
        debug!(sink = %self.name, actions = batch.len(), "sending bulk request");
        self.in_flight.spawn(async move {
            let sent = send_bulk(&client, body).await;
            (batch, sent)
        });
    }

    async fn complete(&mut self, items: Vec<Item>, sent: Sent) {
        match sent {
            Sent::Items(results) if results.len() == items.len() => {
                for (item, (status, ty, reason)) in items.into_iter().zip(results) {
                    let external = item.action.version.is_some();
                    if classify(item.action.op, external, status, ty.as_deref()) != Outcome::Retry {
                        self.release(&item);
                    }
                    match classify(item.action.op, external, status, ty.as_deref()) {
                        Outcome::Done | Outcome::AlreadyWritten => self.shared.resolve(1),
                        Outcome::Retry => {
                            self.retry(item, &format!("{status} {}", ty.unwrap_or_default()))
                        }
                        Outcome::Rejected => {
                            let failure = ItemFailure {
                                status,
                                error_type: ty.unwrap_or_default(),
                                reason: reason.unwrap_or_default(),
                            };
                            self.refused(item, failure).await;
                        }
                        Outcome::Fatal => self.shared.fail(format!(
                            "Elasticsearch refused {}: {status} {}: {} (authorization)",
                            item.action.describe(),
                            ty.unwrap_or_default(),
                            reason.unwrap_or_default()
                        )),
                    }
                }
            }
            Sent::Items(results) => {
                let why = format!("{} item results for {} actions", results.len(), items.len());
                for item in items {
                    self.retry(item, &why);
                }
            }
            Sent::Request(status, why) => match classify_request(status) {
                RequestOutcome::Retry => {
                    for item in items {
                        self.retry(item, &why);
                    }
                }
                RequestOutcome::Split if items.len() > 1 => {
                    let mut first = items;
                    let second = first.split_off(first.len() / 2);
                    self.ready.push_back(first);
                    self.ready.push_back(second);
                }
                RequestOutcome::Split => {
                    let item = items.into_iter().next().expect("one item");
                    self.release(&item);
                    let failure = ItemFailure {
                        status: 413,
                        error_type: "content_too_long".into(),
                        reason: why,
                    };
                    self.refused(item, failure).await;
                }
                RequestOutcome::Fatal | RequestOutcome::Malformed => self.shared.fail(format!(
                    "bulk request refused with {}: {why}",
                    status.map_or("no status".to_string(), |s| s.to_string())
                )),
            },
        }
    }

    fn retry(&mut self, mut item: Item, why: &str) {
        item.attempts += 1;
        if item.attempts > self.cfg.retry_max_attempts {
            self.release(&item);
            self.shared.fail(format!(
                "{} still failing after {} retries: {why}",
                item.action.describe(),
                self.cfg.retry_max_attempts
            ));
            return;
        }
        let delay = backoff(
            item.attempts,
            self.cfg.retry_initial_ms,
            self.cfg.retry_max_ms,
            self.rng.gen(),
        );
        self.retries.push((Instant::now() + delay, item));
    }

    async fn refused(&mut self, item: Item, failure: ItemFailure) {
        match self.handler.on_failure(&item.action, &failure) {
            FailureDecision::Fail(message) => self.shared.fail(message),
            FailureDecision::Drop => {
                warn!(action = %item.action.describe(), error = %failure.reason, "refused action dropped by the failure handler");
                self.shared.resolve(1);
            }
            FailureDecision::Requeue(actions) => {
                // Requeued actions take the refused one's place: at the front, in order,
                // so that no later action on the same document overtakes them; and they
                // count its attempts, so that a handler requeuing forever fails the job.
                let attempts = item.attempts + 1;
                if attempts > self.cfg.retry_max_attempts {
                    self.shared.fail(format!(
                        "{} requeued {} times by the failure handler and still refused: {}",
                        item.action.describe(),
                        item.attempts,
                        failure.reason
                    ));
                    return;
                }
                self.shared
                    .pending
                    .fetch_add(actions.len(), Ordering::SeqCst);
                self.shared.resolve(1);
                for action in actions.into_iter().rev() {
                    let mut item = self.encode(action);
                    item.attempts = attempts;
                    self.buffer_bytes += item.bytes.len();
                    self.buffer.push_front(item);
                }
            }
            FailureDecision::DeadLetter(topic) => {
                match self.dead_letter(&item.action, &failure, &topic).await {
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
        let producer = self.dead_letter.as_ref().ok_or_else(|| {
            format!("dead-letter to {topic}: no Kafka bootstrap servers configured")
        })?;
        let reason = format!(
            "{} {}: {}",
            failure.status, failure.error_type, failure.reason
        );
        let id = action.id.clone().unwrap_or_default();
        let mut headers = OwnedHeaders::new()
            .insert(Header {
                key: "lockgate.error",
                value: Some(&reason),
            })
            .insert(Header {
                key: "lockgate.index",
                value: Some(&action.index),
            })
            .insert(Header {
                key: "lockgate.id",
                value: Some(&id),
            });
        let origin = action.origin.as_ref().map(|o| {
            (
                o.stream.to_string(),
                o.partition.to_string(),
                o.offset.to_string(),
            )
        });
        if let Some((t, p, o)) = &origin {
            headers = headers
                .insert(Header {
                    key: "lockgate.topic",
                    value: Some(t),
                })
                .insert(Header {
                    key: "lockgate.partition",
                    value: Some(p),
                })
                .insert(Header {
                    key: "lockgate.offset",
                    value: Some(o),
                });
        }
        let payload = action
            .record
            .clone()
            .or_else(|| action.body.clone())
            .unwrap_or_default();
        let record = FutureRecord::<[u8], [u8]>::to(topic)
            .payload(&payload)
            .headers(headers);
        producer
            .send(record, Duration::from_secs(30))
            .await
            .map(|_| ())
            .map_err(|(e, _)| {
                format!(
                    "dead-letter of {} to {topic} failed: {e}",
                    action.describe()
                )
            })
    }
}

async fn send_bulk(client: &Elasticsearch, body: Vec<Bytes>) -> Sent {
    let response = match client.bulk(BulkParts::None).body(body).send().await {
        Ok(r) => r,
        Err(e) => return Sent::Request(e.status_code().map(|s| s.as_u16()), e.to_string()),
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
