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
//!
//! It reports in the job's metrics ([`SinkMetrics`]): the pending count (a gauge that
//! moves with it), requests and items by outcome, backoffs, request durations and
//! bytes sent. Items are counted where their results are read, from the decision
//! [`classify`] made, summed per response; the batcher only decides.

use super::action::{BulkAction, OpType};
pub use super::batcher::ItemFailure;
use super::batcher::{Batcher, ItemResult, Limits, Refusal, RequestId, Resolution, Response};
use super::config::{EsSinkConfig, ItemErrorPolicy};
use super::connection::{auth_refusal, auth_refusal_message, TlsVerify};
use super::encode::{Added, EncodedBatch, Encoder, Item};
use super::item_result::{classify, classify_request, Outcome, RequestOutcome};
use super::nodes::NodeSelector;
use crate::connectors::dead_letter::{DeadLetter, DeadLetterWriter, Reason};
use crate::secret::redact_url;
use crate::telemetry::metrics::Metrics;
use bytes::Bytes;
use elasticsearch::http::headers::HeaderMap;
use elasticsearch::http::Method;
use elasticsearch::Elasticsearch;
use prometheus::{Histogram, IntCounter, IntGauge};
use rand::{Rng, SeedableRng};
use serde::de::{Deserializer as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
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
pub struct Shared {
    pending: AtomicUsize,
    /// The subtask's metric handles; `pending` is mirrored in its gauge.
    metrics: SinkMetrics,
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
    fn new(metrics: SinkMetrics) -> Shared {
        Shared {
            pending: AtomicUsize::new(0),
            metrics,
            failure: Mutex::new(None),
            unrecoverable: Default::default(),
            bulks: AtomicUsize::new(0),
            coalesced: AtomicU64::new(0),
            superseded: AtomicU64::new(0),
            already_written: AtomicU64::new(0),
            held_bytes: AtomicUsize::new(0),
            transit_bytes: AtomicUsize::new(0),
            space: Default::default(),
            blocked: Default::default(),
            room_wanted: Default::default(),
        }
    }

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

    /// Counts `n` actions more pending; the gauge follows with an atomic add of its
    /// own, so that it is exact whenever the count stands still (0 after a flush).
    fn add_pending(&self, n: usize) {
        self.pending.fetch_add(n, Ordering::SeqCst);
        self.metrics.pending.add(n as i64);
    }

    fn resolve(&self, n: usize) {
        // The gauge first: a flush that sees the count reach 0 finds the gauge at 0
        // too, so a scrape after the checkpoint never shows what it flushed.
        self.metrics.pending.sub(n as i64);
        let before = self.pending.fetch_sub(n, Ordering::SeqCst);
        debug_assert!(before >= n, "pending went negative");
    }
}

impl Drop for Shared {
    /// The gauges are per subtask and outlive this sink instance: after a failed
    /// attempt, what it left pending or in flight is no longer anybody's (the next
    /// attempt's sink counts its own).
    fn drop(&mut self) {
        self.metrics
            .pending
            .sub(self.pending.load(Ordering::SeqCst) as i64);
        self.metrics
            .in_flight
            .sub(self.metrics.reported_in_flight.load(Ordering::SeqCst));
    }
}

/// The outcomes of `lockgate_sink_bulk_requests_total`, as indexes of
/// [`SinkMetrics::requests`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestLabel {
    /// Every item written (`errors: false`, or no item failed).
    Ok,
    /// Item results came back and some items were not written (each item is counted
    /// under its own outcome).
    ItemErrors,
    /// No usable item results (a connection error, 408, 429, 5xx, or item results that
    /// do not match the request): every action of it is retried after a backoff.
    Retried,
    /// 413: split into halves that are sent again (one action alone is refused).
    TooLarge,
    /// 401, 403 or another 4xx: the request is given up and the job fails.
    Failed,
}

impl RequestLabel {
    /// Every outcome, in discriminant order (each is its own index).
    pub const ALL: [RequestLabel; 5] = [
        RequestLabel::Ok,
        RequestLabel::ItemErrors,
        RequestLabel::Retried,
        RequestLabel::TooLarge,
        RequestLabel::Failed,
    ];

    /// The `outcome` label.
    pub fn label(self) -> &'static str {
        match self {
            RequestLabel::Ok => "ok",
            RequestLabel::ItemErrors => "item_errors",
            RequestLabel::Retried => "retried",
            RequestLabel::TooLarge => "too_large",
            RequestLabel::Failed => "failed",
        }
    }

    /// The outcome of a request that returned no item results.
    pub fn of_request(outcome: RequestOutcome) -> RequestLabel {
        match outcome {
            RequestOutcome::Retry => RequestLabel::Retried,
            RequestOutcome::Split => RequestLabel::TooLarge,
            RequestOutcome::Fatal | RequestOutcome::Malformed => RequestLabel::Failed,
        }
    }
}

/// The outcomes of `lockgate_sink_items_total`, as indexes of [`SinkMetrics::items`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemLabel {
    /// Written as a new document (201).
    Created,
    /// Written over an existing document (200 to an index, create or update).
    Updated,
    /// A delete that removed the document.
    Deleted,
    /// A delete of a document that was not there (written: nothing to remove).
    NotFound,
    /// 409 under `create` or external versions: written by an earlier attempt.
    ConflictAlreadyWritten,
    /// A transient failure of the item (429, 5xx, a concurrent update): sent again.
    Retried,
    /// Refused, and written to the dead-letter topic.
    DeadLettered,
    /// Refused, and given up by the failure handler on purpose.
    Dropped,
    /// Refused, and replaced by the failure handler's actions.
    Requeued,
    /// Failed the job: refused under `on_item_error = "fail"`, out of retries,
    /// unauthorized, or its dead letter could not be written.
    Failed,
}

impl ItemLabel {
    /// Every outcome, in discriminant order (each is its own index).
    pub const ALL: [ItemLabel; 10] = [
        ItemLabel::Created,
        ItemLabel::Updated,
        ItemLabel::Deleted,
        ItemLabel::NotFound,
        ItemLabel::ConflictAlreadyWritten,
        ItemLabel::Retried,
        ItemLabel::DeadLettered,
        ItemLabel::Dropped,
        ItemLabel::Requeued,
        ItemLabel::Failed,
    ];

    /// The `outcome` label.
    pub fn label(self) -> &'static str {
        match self {
            ItemLabel::Created => "created",
            ItemLabel::Updated => "updated",
            ItemLabel::Deleted => "deleted",
            ItemLabel::NotFound => "not_found",
            ItemLabel::ConflictAlreadyWritten => "conflict_already_written",
            ItemLabel::Retried => "retried",
            ItemLabel::DeadLettered => "dead_lettered",
            ItemLabel::Dropped => "dropped",
            ItemLabel::Requeued => "requeued",
            ItemLabel::Failed => "failed",
        }
    }

    /// The outcome of an item Elasticsearch answered, from the sink's decision about
    /// it ([`classify`]); `None` for a refused or fatal one, which is counted once the
    /// failure handler (or the job's failure) settles it.
    pub fn of_item(op: OpType, status: u16, outcome: &Outcome) -> Option<ItemLabel> {
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

/// One sink subtask's metric handles, each looked up once when the sink opens: from
/// then on an update is an atomic add, made once per request or response (per-item
/// outcomes are summed first).
pub struct SinkMetrics {
    pending: IntGauge,
    in_flight: IntGauge,
    /// What this instance added to `in_flight`: the gauge is shared with the sink of a
    /// later attempt, so it moves by differences, never by `set`.
    reported_in_flight: std::sync::atomic::AtomicI64,
    requests: [IntCounter; RequestLabel::ALL.len()],
    items: [IntCounter; ItemLabel::ALL.len()],
    retry_backoff: Histogram,
    request_duration: Histogram,
    bytes_sent: IntCounter,
    /// Actions written (or made moot by a newer written one) or dead-lettered.
    records_out: IntCounter,
}

impl SinkMetrics {
    /// The handles of sink subtask `subtask` in `metrics` (operator label `sink`);
    /// every outcome's series exists from now on, at 0.
    pub fn new(metrics: &Metrics, subtask: u16) -> SinkMetrics {
        const OP: &str = crate::connector::SINK_UID;
        let sub = subtask.to_string();
        let labelled = |vec: &prometheus::IntCounterVec, outcome: &str| {
            vec.with_label_values(&[metrics.job(), OP, &sub, outcome])
        };
        SinkMetrics {
            pending: metrics.task_gauge(&metrics.sink_pending, OP, subtask),
            in_flight: metrics.task_gauge(&metrics.sink_in_flight, OP, subtask),
            reported_in_flight: Default::default(),
            requests: RequestLabel::ALL.map(|o| labelled(&metrics.sink_requests, o.label())),
            items: ItemLabel::ALL.map(|o| labelled(&metrics.sink_items, o.label())),
            retry_backoff: metrics.task_histogram(&metrics.sink_retry_backoff, OP, subtask),
            request_duration: metrics.task_histogram(&metrics.sink_request_duration, OP, subtask),
            bytes_sent: metrics.task_counter(&metrics.sink_bytes_sent, OP, subtask),
            records_out: metrics.task_counter(&metrics.records_out, OP, subtask),
        }
    }

    /// This instance has `n` requests out.
    fn report_in_flight(&self, n: usize) {
        let before = self.reported_in_flight.swap(n as i64, Ordering::SeqCst);
        self.in_flight.add(n as i64 - before);
    }

    fn request(&self, outcome: RequestLabel) {
        self.requests[outcome as usize].inc();
    }

    fn items(&self, outcome: ItemLabel, n: usize) {
        if n > 0 {
            self.items[outcome as usize].inc_by(n as u64);
        }
    }
}

enum Cmd {
    /// Encoded actions, with the bytes `add` counted for them in `transit_bytes`.
    Add(EncodedBatch),
    Flush(oneshot::Sender<()>),
    Close(oneshot::Sender<()>),
}

/// The sink's handle on the processor task.
pub struct BulkProcessor {
    tx: mpsc::Sender<Cmd>,
    shared: Arc<Shared>,
    buffer_max_bytes: usize,
    /// The processor task, aborted when the sink is dropped (a failed attempt): it must
    /// not go on sending the old attempt's requests while the next attempt replays the
    /// same documents, or an older write could land after a newer one.
    task: tokio::task::AbortHandle,
}

impl Drop for BulkProcessor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl BulkProcessor {
    /// Starts the processor task on the current runtime; it reports in `metrics` as
    /// sink subtask `subtask`.
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
        let shared = Arc::new(Shared::new(SinkMetrics::new(metrics, subtask)));
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
            in_flight: Vec::new(),
            waiters: Vec::new(),
            epoch: Instant::now(),
            rng: rand::rngs::SmallRng::from_entropy(),
            name,
            resolved: Vec::new(),
        };
        let task = tokio::spawn(service.run(rx)).abort_handle();
        Ok(BulkProcessor {
            tx,
            shared,
            buffer_max_bytes,
            task,
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
        let bytes = encoder.bytes();
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
        let batch = encoder.take_batch();
        debug_assert_eq!(batch.bytes, bytes);
        self.shared.add_pending(batch.actions.len());
        self.shared.transit_bytes.fetch_add(bytes, Ordering::SeqCst);
        self.tx
            .send(Cmd::Add(batch))
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

/// A request answered.
struct Answer {
    id: RequestId,
    /// The node it went to.
    node: usize,
    /// How many actions it carried, and how many of them were deletes.
    actions: usize,
    deletes: usize,
    /// From sending it to the end of its response.
    took: Duration,
    sent: Sent,
}

/// A request out.
type InFlight = Pin<Box<dyn Future<Output = Answer> + Send>>;

/// The first of `in_flight` to be answered (there are at most `max_in_flight`, so
/// polling each on a wake-up costs nothing). Cancel safe: the requests stay in the set.
fn next_answer(in_flight: &mut Vec<InFlight>) -> impl Future<Output = Answer> + '_ {
    std::future::poll_fn(move |cx| {
        for i in 0..in_flight.len() {
            if let Poll::Ready(answer) = in_flight[i].as_mut().poll(cx) {
                drop(in_flight.swap_remove(i));
                return Poll::Ready(answer);
            }
        }
        Poll::Pending
    })
}

enum Sent {
    /// `errors: false`: every item written; how many item results there were, by
    /// status.
    Written(Tally),
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
    /// The requests out, polled by this task itself: a response is acted on, and the
    /// next request sent, without a hand-off to another task and back.
    in_flight: Vec<InFlight>,
    waiters: Vec<oneshot::Sender<()>>,
    /// The batcher's clock starts here.
    epoch: Instant,
    rng: rand::rngs::SmallRng,
    name: String,
    /// Reused from one `settle` to the next.
    resolved: Vec<Resolution<Item>>,
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
            // At most about 4 × bulk_max_actions queued or set aside (coalesced, kept
            // until their successor is written): a flush sends a few requests' worth.
            let accept = closing.is_none() && (failed || self.batcher.has_room());
            let wake = self
                .batcher
                .next_wake_ms()
                .map_or(Instant::now() + Duration::from_secs(3600), |ms| {
                    self.epoch + Duration::from_millis(ms)
                });
            tokio::select! {
                cmd = rx.recv(), if accept => match cmd {
                    Some(Cmd::Add(batch)) => {
                        let bytes = batch.bytes;
                        self.add(batch).await;
                        // Held first, then out of transit: the sink never sees too few.
                        self.publish_bytes();
                        self.shared.transit_bytes.fetch_sub(bytes, Ordering::SeqCst);
                    }
                    Some(Cmd::Flush(w)) => self.waiters.push(w),
                    Some(Cmd::Close(w)) => closing = Some(w),
                    None => return,
                },
                answer = next_answer(&mut self.in_flight), if !self.in_flight.is_empty() => {
                    self.complete(answer)
                }
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

    async fn add(&mut self, batch: EncodedBatch) {
        for added in batch.actions {
            match added {
                Added::Encoded(e) => {
                    let bytes = e.item.lines.len();
                    self.batcher.add_doc(e.doc, e.effect, bytes, e.item);
                }
                Added::Invalid(action, why) => self.unwritable(action, why).await,
            }
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
        let m = &self.shared.metrics;
        match self.handler.on_failure(&action, &failure) {
            FailureDecision::Fail(message) => {
                m.items(ItemLabel::Failed, 1);
                self.shared.fail(message)
            }
            FailureDecision::Drop => {
                warn!(action = %action.describe(), error = %failure.reason, "invalid document dropped by the failure handler");
                m.items(ItemLabel::Dropped, 1);
                self.shared.resolve(1);
            }
            FailureDecision::DeadLetter(topic) => {
                match Self::dead_letter(self.dead_letter.as_ref(), &action, &failure, &topic).await
                {
                    Ok(()) => self.dead_lettered(),
                    Err(e) => {
                        self.shared.metrics.items(ItemLabel::Failed, 1);
                        self.shared.fail(e)
                    }
                }
            }
            FailureDecision::Requeue(_) => {
                m.items(ItemLabel::Failed, 1);
                self.shared.fail(format!(
                    "{}: {} (a replacement for a document that is not JSON is not accepted)",
                    action.describe(),
                    failure.reason
                ))
            }
        }
    }

    /// Sends every request the batcher has ready (`force`: a flush or close is waiting).
    /// Each body is built once, into one buffer, which the client sends as it is.
    fn dispatch(&mut self, force: bool) {
        let now = self.now_ms();
        while let Some((id, items)) = self.batcher.next_request(now, force) {
            let mut body = Vec::with_capacity(items.iter().map(|i| i.lines.len()).sum());
            let mut deletes = 0;
            for i in &items {
                body.extend_from_slice(&i.lines);
                deletes += usize::from(i.op == OpType::Delete);
            }
            let actions = items.len();
            self.shared.bulks.fetch_add(1, Ordering::Relaxed);
            self.shared.metrics.bytes_sent.inc_by(body.len() as u64);
            debug!(
                sink = %self.name,
                actions,
                queued = self.batcher.queued(),
                pending = self.shared.pending(),
                force,
                "sending bulk request"
            );
            let node = self.selector.pick(now);
            let client = self.clients[node].clone();
            let body = Bytes::from(body);
            self.in_flight.push(Box::pin(async move {
                // Started at the first poll, when the request is sent.
                let started = Instant::now();
                let sent = send_bulk(&client, body).await;
                Answer {
                    id,
                    node,
                    actions,
                    deletes,
                    took: started.elapsed(),
                    sent,
                }
            }));
        }
        self.shared.metrics.report_in_flight(self.in_flight.len());
    }

    /// Hands a response to the batcher, with what each item result means. A node that
    /// did not answer is quarantined; a refusal of the credentials fails the job for
    /// good, naming the node.
    fn complete(&mut self, answer: Answer) {
        let Answer {
            id,
            node,
            actions,
            deletes,
            took,
            sent,
        } = answer;
        let m = &self.shared.metrics;
        m.report_in_flight(self.in_flight.len());
        m.request_duration.observe(took.as_secs_f64());
        match &sent {
            Sent::Request(None, _) => self.selector.failed(node, self.now_ms()),
            _ => self.selector.answered(node),
        }
        if !matches!(&sent, Sent::Written(t) if t.items == actions) {
            // What is not written stays a while (a retry, the failure handler; a
            // response whose item count does not match is retried whole): it gets its
            // own bytes rather than keep its whole batch's buffer alive.
            self.batcher.for_each_in_flight_mut(id, Item::unpin);
        }
        match &sent {
            Sent::Written(_) => {}
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
            Sent::Written(tally) => {
                if tally.items == actions {
                    m.request(RequestLabel::Ok);
                    for (label, n) in written_labels(&tally, deletes) {
                        m.items(label, n);
                    }
                } else {
                    // Every action of a request retried whole is an item retried.
                    m.request(RequestLabel::Retried);
                    m.items(ItemLabel::Retried, actions);
                }
                Response::Written(tally.items)
            }
            Sent::Items(results) => {
                let items = self.batcher.in_flight_payloads(id);
                if items.len() != results.len() {
                    m.request(RequestLabel::Retried);
                    m.items(ItemLabel::Retried, actions);
                    // Not matched to actions: the batcher retries the whole request, and
                    // its reason names how many results came back.
                    Response::Items(
                        results
                            .into_iter()
                            .map(|(status, ty, reason)| ItemResult {
                                outcome: Outcome::Retry,
                                failure: ItemFailure {
                                    status,
                                    error_type: ty.unwrap_or_default(),
                                    reason: reason.unwrap_or_default(),
                                },
                            })
                            .collect(),
                    )
                } else {
                    // Summed here, added once per outcome.
                    let mut counts = [0usize; ItemLabel::ALL.len()];
                    let mut unwritten = false;
                    let response = Response::Items(
                        items
                            .iter()
                            .zip(results)
                            .map(|(item, (status, ty, reason))| {
                                let outcome = classify(
                                    item.op,
                                    item.version.is_some(),
                                    status,
                                    ty.as_deref(),
                                );
                                if outcome == Outcome::AlreadyWritten {
                                    already_written += 1;
                                }
                                match ItemLabel::of_item(item.op, status, &outcome) {
                                    Some(l) => counts[l as usize] += 1,
                                    None => unwritten = true,
                                }
                                unwritten |= outcome == Outcome::Retry;
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
                    );
                    m.request(if unwritten {
                        RequestLabel::ItemErrors
                    } else {
                        RequestLabel::Ok
                    });
                    for (label, n) in ItemLabel::ALL.into_iter().zip(counts) {
                        m.items(label, n);
                    }
                    response
                }
            }
            Sent::Request(status, why) => {
                let outcome = classify_request(status);
                m.request(RequestLabel::of_request(outcome));
                if outcome == RequestOutcome::Retry {
                    m.items(ItemLabel::Retried, actions);
                }
                Response::Failed(outcome, why)
            }
        };
        self.shared
            .already_written
            .fetch_add(already_written, Ordering::Relaxed);
        let (now, jitter) = (self.now_ms(), self.rng.gen());
        if let Some(backoff) = self.batcher.on_response(id, response, now, jitter) {
            self.shared
                .metrics
                .retry_backoff
                .observe(backoff.as_secs_f64());
        }
    }

    /// A refused action was written to the dead-letter topic: it is resolved.
    fn dead_lettered(&self) {
        let m = &self.shared.metrics;
        m.items(ItemLabel::DeadLettered, 1);
        m.records_out.inc();
        self.shared.resolve(1);
    }

    /// Acts on what the batcher resolved: counts, failure handler, dead letters.
    async fn settle(&mut self) {
        let mut resolved = std::mem::take(&mut self.resolved);
        loop {
            self.batcher.drain_resolved_into(&mut resolved);
            if resolved.is_empty() {
                break;
            }
            // Counted once per response, not once per item.
            let (mut done, mut coalesced, mut superseded) = (0, 0, 0);
            for r in resolved.drain(..) {
                match r {
                    Resolution::Written(_) => done += 1,
                    Resolution::Coalesced(_) => coalesced += 1,
                    Resolution::Superseded(_) => superseded += 1,
                    Resolution::Refused {
                        refusal,
                        payload,
                        failure,
                        attempts,
                    } => self.refused(refusal, payload, failure, attempts).await,
                    Resolution::Exhausted(item, why) => {
                        self.shared.metrics.items(ItemLabel::Failed, 1);
                        self.shared.fail(format!("{} {why}", item.describe()))
                    }
                    Resolution::Fatal(item, why) => {
                        self.shared.metrics.items(ItemLabel::Failed, 1);
                        self.shared
                            .fail(format!("Elasticsearch refused {}: {why}", item.describe()))
                    }
                }
            }
            self.shared
                .coalesced
                .fetch_add(coalesced as u64, Ordering::Relaxed);
            self.shared
                .superseded
                .fetch_add(superseded as u64, Ordering::Relaxed);
            self.shared.resolve(done + coalesced + superseded);
            // A coalesced or superseded action is as written as the newer one that
            // made it moot.
            self.shared
                .metrics
                .records_out
                .inc_by((done + coalesced + superseded) as u64);
        }
        self.resolved = resolved;
    }

    /// Asks the failure handler about a refused action; the batcher holds its place in
    /// its document's order until the answer.
    async fn refused(&mut self, refusal: Refusal, item: Item, failure: ItemFailure, attempts: u32) {
        let action = item.full_action();
        let m = &self.shared.metrics;
        match self.handler.on_failure(&action, &failure) {
            FailureDecision::Fail(message) => {
                m.items(ItemLabel::Failed, 1);
                self.batcher.settle_refused(refusal);
                self.shared.fail(message)
            }
            FailureDecision::Drop => {
                warn!(action = %action.describe(), error = %failure.reason, "refused action dropped by the failure handler");
                m.items(ItemLabel::Dropped, 1);
                self.batcher.settle_refused(refusal);
                self.shared.resolve(1);
            }
            FailureDecision::Requeue(actions) => {
                // Requeued actions take the refused one's place in its document's order,
                // and count its attempts, so that a handler requeuing forever fails the
                // job.
                if attempts + 1 > self.cfg.retry_max_attempts {
                    m.items(ItemLabel::Failed, 1);
                    self.batcher.settle_refused(refusal);
                    self.shared.fail(format!(
                        "{} requeued {attempts} times by the failure handler and still refused: {}",
                        action.describe(),
                        failure.reason
                    ));
                    return;
                }
                let mut encoder = Encoder::new();
                for a in actions {
                    encoder.push(a);
                }
                let batch = encoder.take_batch();
                m.items(ItemLabel::Requeued, 1);
                self.shared.add_pending(batch.actions.len());
                self.shared.resolve(1);
                let mut replacements = Vec::with_capacity(batch.actions.len());
                let mut invalid = Vec::new();
                for added in batch.actions {
                    match added {
                        Added::Encoded(e) => {
                            let bytes = e.item.lines.len();
                            replacements.push((e.doc, e.effect, bytes, e.item));
                        }
                        Added::Invalid(action, why) => invalid.push((action, why)),
                    }
                }
                self.batcher.requeue_docs(refusal, replacements);
                // A replacement that cannot go into a request follows the handler too.
                for (action, why) in invalid {
                    self.unwritable(action, why).await;
                }
            }
            FailureDecision::DeadLetter(topic) => {
                let written =
                    Self::dead_letter(self.dead_letter.as_ref(), &action, &failure, &topic).await;
                self.batcher.settle_refused(refusal);
                match written {
                    Ok(()) => self.dead_lettered(),
                    Err(e) => {
                        self.shared.metrics.items(ItemLabel::Failed, 1);
                        self.shared.fail(e)
                    }
                }
            }
        }
    }

    /// Writes the original record and the error to the dead-letter topic, waiting for
    /// the broker's acknowledgement: only then is the action resolved.
    /// (An associated function: what it holds across the wait is the writer, not the
    /// service, whose requests in flight are not `Sync`.)
    async fn dead_letter(
        writer: Option<&DeadLetterWriter>,
        action: &BulkAction,
        failure: &ItemFailure,
        topic: &str,
    ) -> Result<(), String> {
        let writer = writer.ok_or_else(|| {
            format!("dead-letter to {topic}: no Kafka bootstrap servers configured")
        })?;
        let error = format!(
            "{} {}: {}",
            failure.status, failure.error_type, failure.reason
        );
        let letter = DeadLetter {
            error: &error,
            reason: Reason::of_refusal(&failure.error_type),
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

/// Sends one bulk request. The body goes to the client as the one buffer it is (the
/// bulk API's builder would copy it into another).
async fn send_bulk(client: &Elasticsearch, body: Bytes) -> Sent {
    let sent = client
        .transport()
        .send(
            Method::Post,
            "/_bulk",
            HeaderMap::new(),
            None::<&()>,
            Some(body),
            None,
        )
        .await;
    let response = match sent {
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
    match parse_response(&bytes) {
        Ok(Parsed::Written(tally)) => Sent::Written(tally),
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
/// one, so only they allocate).
#[derive(Debug, PartialEq, serde::Deserialize)]
struct ItemReply {
    #[serde(default)]
    status: u16,
    #[serde(default)]
    error: Option<Value>,
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
                while map.next_key::<IgnoredAny>()?.is_some() {
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
    use super::{error_chain, parse_response, written_labels, ItemLabel, ItemReply, Parsed, Tally};
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
                ItemLabel::of_item(*op, *status, &outcome),
                *want,
                "{op:?} external={external} {status} {ty:?} ({outcome:?})"
            );
        }
        assert_eq!(
            ItemLabel::of_item(OpType::Delete, 404, &Outcome::Done),
            Some(NotFound)
        );
    }

    #[test]
    fn every_outcome_is_its_own_index() {
        for (i, o) in super::RequestLabel::ALL.into_iter().enumerate() {
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
