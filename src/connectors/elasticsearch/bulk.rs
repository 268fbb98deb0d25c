//! The bulk processor: buffers actions, sends bulk requests (at most `max_in_flight` at
//! once) when `bulk_max_actions`, `bulk_max_bytes` or `bulk_flush_interval_ms` is
//! reached, retries what is transient, and counts `pending`: actions added and not yet
//! terminally resolved (a retried action stays pending).
//!
//! It runs as its own task, so that the interval flush and retries go on while the
//! sink waits for records. Failures are recorded and raised by the sink at the next
//! record, the next checkpoint, or close — never lost.
//!
//! Memory is bounded in bytes: [`BulkProcessor::add`] waits while the actions handed
//! over and not yet resolved (buffered, in flight, awaiting a retry) would pass
//! `buffer_max_bytes`, counted as the size of their bulk request lines. A batch larger
//! than the limit is admitted alone, when nothing else is held, so nothing can
//! deadlock; while the sink waits for room, what is queued is sent at once instead of
//! waiting for a fuller request or the flush interval. A checkpoint's flush does not
//! pass through this gate: it only drains. The processor holds each document once (the
//! encoded lines; the action's body is restored from them when the failure handler
//! asks).

use super::action::{frame, BulkAction};
pub use super::batcher::ItemFailure;
use super::batcher::{Batcher, ItemResult, Limits, Refusal, RequestId, Resolution, Response};
use super::coalesce::Effect;
use super::config::{EsSinkConfig, ItemErrorPolicy};
use super::connection::{auth_refusal, auth_refusal_message, TlsVerify};
use super::item_result::{classify, classify_request, Outcome};
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

/// The `error_type` of an action lockgate did not send because no valid request could
/// be made of its record; the reason names the record and what is wrong with it.
pub const INVALID_DOCUMENT: &str = "invalid_document";

/// The handler of the job file's `on_item_error`.
pub struct PolicyFailureHandler(pub ItemErrorPolicy);

impl FailureHandler for PolicyFailureHandler {
    fn on_failure(&self, action: &BulkAction, failure: &ItemFailure) -> FailureDecision {
        match &self.0 {
            ItemErrorPolicy::Fail if failure.error_type == INVALID_DOCUMENT => {
                FailureDecision::Fail(failure.reason.clone())
            }
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
    already_written: AtomicU64,
    /// Bytes of the actions the processor task holds (its batcher's total).
    held_bytes: AtomicUsize,
    /// Bytes of actions handed to the processor task and not yet in its batcher.
    transit_bytes: AtomicUsize,
    /// Woken when held bytes fall or the processor fails.
    space: tokio::sync::Notify,
    /// The sink waits for room: the processor sends what it holds at once.
    blocked: std::sync::atomic::AtomicBool,
    /// Wakes the processor task when the sink starts waiting for room.
    room_wanted: tokio::sync::Notify,
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

    /// Items Elasticsearch answered with 409 under `create` or external versioning:
    /// written by an earlier attempt (a replay), counted as written.
    pub fn already_written(&self) -> u64 {
        self.already_written.load(Ordering::Relaxed)
    }

    /// Bytes of the actions added and not yet resolved: what `buffer_max_bytes`
    /// bounds (each action counted as the size of its bulk request lines).
    pub fn buffered_bytes(&self) -> usize {
        self.held_bytes.load(Ordering::SeqCst) + self.transit_bytes.load(Ordering::SeqCst)
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
        drop(f);
        // A sink waiting for room must wake to raise the failure.
        self.space.notify_waiters();
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
    /// Actions, and the bytes `add` counted for them in `transit_bytes`.
    Add(Vec<BulkAction>, usize),
    Flush(oneshot::Sender<()>),
    Close(oneshot::Sender<()>),
}

/// The sink's handle on the processor task.
pub struct BulkProcessor {
    tx: mpsc::Sender<Cmd>,
    shared: Arc<Shared>,
    buffer_max_bytes: usize,
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
        let buffer_max_bytes = cfg.buffer_max_bytes.max(1);
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
        Ok(BulkProcessor {
            tx,
            shared,
            buffer_max_bytes,
        })
    }

    /// The shared counters and failure slot.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Adds actions. Waits (backpressure: the sink stops reading its input) while
    /// they would take the bytes held past `buffer_max_bytes`; when nothing is held,
    /// they are admitted whatever their size. Returns at once after a failure, which
    /// the sink then raises. Cancel safe until it hands the actions over.
    pub async fn add(&self, actions: Vec<BulkAction>) -> Result<(), String> {
        let bytes: usize = actions.iter().map(request_bytes).sum();
        loop {
            // Registered before the check, so that a wake-up between the two is kept.
            let room = self.shared.space.notified();
            let held = self.shared.buffered_bytes();
            if held == 0
                || held + bytes <= self.buffer_max_bytes
                || self.shared.failure().is_some()
                || self.tx.is_closed()
            {
                break;
            }
            if !self.shared.blocked.swap(true, Ordering::SeqCst) {
                // A stored permit if the processor is busy: the wake-up is not lost.
                self.shared.room_wanted.notify_one();
            }
            // The re-check bounds the wait should a wake-up be missed (the processor
            // task gone); it costs nothing while room comes.
            let _ = tokio::time::timeout(Duration::from_millis(100), room).await;
        }
        self.shared.blocked.store(false, Ordering::SeqCst);
        self.shared
            .pending
            .fetch_add(actions.len(), Ordering::SeqCst);
        self.shared.transit_bytes.fetch_add(bytes, Ordering::SeqCst);
        self.tx
            .send(Cmd::Add(actions, bytes))
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
    /// The action without its body, which is in `bytes`: a document is held once.
    action: BulkAction,
    /// The action's NDJSON lines.
    bytes: Bytes,
    /// Where the body is in `bytes`.
    body: Option<std::ops::Range<usize>>,
}

impl Item {
    /// The action as it was built, body included (for the failure handler and dead
    /// letters; a rare path, so the copy is made only here).
    fn full_action(&self) -> BulkAction {
        let mut a = self.action.clone();
        a.body = self.body.clone().map(|r| self.bytes[r].to_vec());
        a
    }
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

    /// Publishes the bytes the batcher holds, and wakes a sink waiting for room.
    fn publish_bytes(&self) {
        let now = self.batcher.bytes();
        let before = self.shared.held_bytes.swap(now, Ordering::SeqCst);
        if now < before {
            self.shared.space.notify_waiters();
        }
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
                    Some(Cmd::Add(actions, bytes)) => {
                        self.add(actions).await;
                        // Held first, then out of transit: the sink never sees too few.
                        self.publish_bytes();
                        self.shared.transit_bytes.fetch_sub(bytes, Ordering::SeqCst);
                    }
                    Some(Cmd::Flush(w)) => self.waiters.push(w),
                    Some(Cmd::Close(w)) => closing = Some(w),
                    None => return,
                },
                Some(done) = self.in_flight.join_next(), if !self.in_flight.is_empty() => match done {
                    Ok((id, node, sent)) => self.complete(id, node, sent),
                    Err(e) => self.shared.fail(format!("bulk request task failed: {e}")),
                },
                _ = tokio::time::sleep_until(wake.into()) => {}
                _ = self.shared.room_wanted.notified() => {}
            }
            self.settle().await;
            let failed = self.shared.failure().is_some();
            if !failed {
                // A full buffer sends what it has: the sink cannot add more until
                // something is resolved, so waiting for a fuller request only stalls.
                let full = self.shared.blocked.load(Ordering::SeqCst);
                self.dispatch(!self.waiters.is_empty() || closing.is_some() || full);
                self.settle().await;
            }
            self.publish_bytes();
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
            if let Some(why) = action.invalid.take() {
                self.unwritable(action, why).await;
                continue;
            }
            // Whatever built it, a body goes into a request only as one line of a JSON
            // object; anything else follows the failure handler, like a refused item.
            if let Some(body) = &action.body {
                match frame(body) {
                    Ok(None) => {}
                    Ok(Some(compact)) => action.body = Some(compact),
                    Err(why) => {
                        let why = format!("{}: {why}", action.describe());
                        self.unwritable(action, why).await;
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

    /// An action that cannot go into a request (its record has no valid id or index, or
    /// its body is not one JSON object): the failure handler decides, as for a document
    /// Elasticsearch refused.
    async fn unwritable(&mut self, action: BulkAction, why: String) {
        let failure = ItemFailure {
            status: 400,
            error_type: INVALID_DOCUMENT.into(),
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
        let mut already_written = 0;
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
                                let outcome =
                                    classify(a.op, a.version.is_some(), status, ty.as_deref());
                                if outcome == Outcome::AlreadyWritten {
                                    already_written += 1;
                                }
                                ItemResult {
                                    outcome,
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
        self.shared
            .already_written
            .fetch_add(already_written, Ordering::Relaxed);
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
        let action = item.full_action();
        match self.handler.on_failure(&action, &failure) {
            FailureDecision::Fail(message) => {
                self.batcher.settle_refused(refusal);
                self.shared.fail(message)
            }
            FailureDecision::Drop => {
                warn!(action = %action.describe(), error = %failure.reason, "refused action dropped by the failure handler");
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
                        action.describe(),
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
                let written = self.dead_letter(&action, &failure, &topic).await;
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

/// The NDJSON lines of an action; the item keeps the action without its body (the
/// lines hold it), and without the original record when that is the body itself.
fn encode(mut action: BulkAction) -> Item {
    let mut buf = Vec::with_capacity(action.body.as_ref().map_or(0, Vec::len) + 96);
    action.encode(&mut buf);
    // The body is the last line, before its newline.
    let body = action.body.take().map(|b| {
        let end = buf.len() - 1;
        end - b.len()..end
    });
    if let (Some(record), Some(r)) = (&action.record, &body) {
        if record[..] == buf[r.clone()] {
            // Dead letters fall back to the body, which is the same bytes.
            action.record = None;
        }
    }
    Item {
        action,
        bytes: Bytes::from(buf),
        body,
    }
}

/// What `buffer_max_bytes` counts for an action before it is encoded: the same
/// estimate the batcher is given ([`describe`]).
fn request_bytes(action: &BulkAction) -> usize {
    action.body.as_ref().map_or(0, Vec::len) + 64
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
