//! The bulk processor: buffers a [`BulkEncoder`]'s actions, sends requests (at most
//! `max_in_flight` at once) when `max_actions`, `max_bytes` or the flush interval is
//! reached, retries what is transient, and counts `pending`: actions added and not yet
//! terminally resolved (a retried action stays pending).
//!
//! It runs as its own task, so that the interval flush and retries go on while the
//! sink waits for records. Failures are recorded and raised by the sink at the next
//! record, the next checkpoint, or close — never lost.
//!
//! Memory is bounded in bytes: [`BulkProcessor::add_with`] waits while the actions
//! handed over and not yet resolved (buffered, in flight, awaiting a retry) would pass
//! `buffer_max_bytes`. A batch larger than the limit is admitted alone, when nothing
//! else is held, so nothing can deadlock; while the sink waits for room, what is queued
//! is sent at once instead of waiting for a fuller request or the flush interval. A
//! checkpoint's flush does not pass through this gate: it only drains.
//!
//! It reports in the job's metrics ([`SinkMetrics`]): the pending count (a gauge that
//! moves with it), requests and items by outcome, backoffs, request durations and
//! bytes sent. Items are counted where their results are read, from the decision the
//! transport's `classify` made, summed per response; the batcher only decides.
//!
//! Every decision is the [`Batcher`]'s; this module only drives it, and it is generic
//! over the encoder and the transport: no call per item goes through a pointer.

use super::batcher::{Batcher, ItemResult, Limits, Refusal, RequestId, Resolution, Response};
use super::metrics::{ItemLabel, RequestLabel, SinkMetrics};
use super::nodes::NodeSelector;
use super::outcome::{ItemFailure, Outcome, RequestOutcome};
use super::policy::FailurePolicy;
use super::target::{Added, BulkEncoder, BulkTransport, Decision, EncodedBatch, Sent};
use crate::dead_letter::{DeadLetter, DeadLetterWriter};
use crate::telemetry::metrics::{Buffered, Metrics, Stage};
use rand::{Rng, SeedableRng};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

/// The `error_type` of an action that was never sent because no valid request could be
/// made of its record; the reason names the record and what is wrong with it.
pub const INVALID_DOCUMENT: &str = "invalid_document";

impl Buffered for Shared {
    fn buffered_bytes(&self) -> usize {
        Shared::buffered_bytes(self)
    }
}

/// State shared between the processor task and the sink.
pub struct Shared {
    /// The target's name, for messages.
    system: &'static str,
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
    fn new(system: &'static str, metrics: SinkMetrics) -> Shared {
        Shared {
            system,
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

    /// Items the target answered as written by an earlier attempt (a replay;
    /// Elasticsearch: 409 under `create` or external versioning), counted as written.
    pub fn already_written(&self) -> u64 {
        self.already_written.load(Ordering::Relaxed)
    }

    /// Bytes of the actions added and not yet resolved: what `buffer_max_bytes`
    /// bounds (each action counted as its target counts it: its request lines, its
    /// own copies, and the bookkeeping held for it).
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
            warn!(error = %message, "{} sink failed", self.system);
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
            warn!(error = %message, "{} sink failed", self.system);
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

enum Cmd<E: BulkEncoder> {
    /// Encoded actions, with the bytes `add` counted for them in `transit_bytes`.
    Add(EncodedBatch<E>),
    Flush(oneshot::Sender<()>),
    Close(oneshot::Sender<()>),
}

/// What a bulk sink is made of: its encoder, its transport, and what becomes of the
/// actions its target refuses (the policy, and the writer of the dead letters it
/// decides on).
pub struct BulkParts<E: BulkEncoder, T> {
    pub encoder: E,
    pub transport: T,
    pub policy: FailurePolicy<E::Action>,
    pub dead_letter: Option<DeadLetterWriter>,
}

/// The sink's handle on the processor task.
pub struct BulkProcessor<E: BulkEncoder> {
    tx: mpsc::Sender<Cmd<E>>,
    shared: Arc<Shared>,
    buffer_max_bytes: usize,
    /// The processor task, aborted when the sink is dropped (a failed attempt): it must
    /// not go on sending the old attempt's requests while the next attempt replays the
    /// same documents, or an older write could land after a newer one.
    task: tokio::task::AbortHandle,
}

impl<E: BulkEncoder> Drop for BulkProcessor<E> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<E: BulkEncoder> BulkProcessor<E> {
    /// Starts the processor task of a sink made of `parts` on the current runtime.
    /// `name` names the sink in logs; it reports in `metrics` as subtask `subtask` of
    /// the sink.
    pub fn spawn<T: BulkTransport<E::Item>>(
        parts: BulkParts<E, T>,
        limits: Limits,
        buffer_max_bytes: usize,
        (metrics, subtask): (&Metrics, u16),
        name: String,
    ) -> BulkProcessor<E> {
        let BulkParts {
            encoder,
            transport,
            policy,
            dead_letter,
        } = parts;
        let shared = Arc::new(Shared::new(
            transport.system(),
            SinkMetrics::new(metrics, subtask),
        ));
        // What the sink holds counts in `lockgate_buffered_bytes{stage="sink"}` for as
        // long as it lives.
        let part: Arc<dyn Buffered> = shared.clone();
        metrics.count_buffered(Stage::Sink, &part);
        let (tx, rx) = mpsc::channel(4);
        let service = Service {
            selector: NodeSelector::new(transport.nodes().max(1)),
            retry_max_attempts: limits.retry_max_attempts,
            encoder,
            transport,
            policy,
            shared: shared.clone(),
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
        BulkProcessor {
            tx,
            shared,
            buffer_max_bytes: buffer_max_bytes.max(1),
            task,
        }
    }

    /// The shared counters and failure slot.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Adds the actions `take` gives, which `buffer_max_bytes` counts as `bytes`. Waits
    /// (backpressure: the sink stops reading its input) while they would take the bytes
    /// held past `buffer_max_bytes`; when nothing is held, they are admitted whatever
    /// their size. Returns at once after a failure, which the sink then raises. Cancel
    /// safe until it calls `take`: whatever `take` takes from is left as it was.
    pub async fn add_with(
        &self,
        bytes: usize,
        take: impl FnOnce() -> EncodedBatch<E>,
    ) -> Result<(), String> {
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
        let batch = take();
        debug_assert_eq!(batch.bytes, bytes);
        self.shared.add_pending(batch.actions.len());
        self.shared
            .transit_bytes
            .fetch_add(batch.bytes, Ordering::SeqCst);
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
    async fn ask(&self, cmd: fn(oneshot::Sender<()>) -> Cmd<E>) -> Result<(), String> {
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
    /// How many actions it carried.
    actions: usize,
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

struct Service<E: BulkEncoder, T> {
    encoder: E,
    transport: T,
    policy: FailurePolicy<E::Action>,
    /// Which node the next request goes to.
    selector: NodeSelector,
    retry_max_attempts: u32,
    shared: Arc<Shared>,
    dead_letter: Option<DeadLetterWriter>,
    /// Every batching decision (order per document, coalescing, retries, splits).
    batcher: Batcher<E::Item, E::Effect>,
    /// The requests out, polled by this task itself: a response is acted on, and the
    /// next request sent, without a hand-off to another task and back.
    in_flight: Vec<InFlight>,
    waiters: Vec<oneshot::Sender<()>>,
    /// The batcher's clock starts here.
    epoch: Instant,
    rng: rand::rngs::SmallRng,
    name: String,
    /// Reused from one `settle` to the next.
    resolved: Vec<Resolution<E::Item>>,
}
impl<E: BulkEncoder, T: BulkTransport<E::Item>> Service<E, T> {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Publishes the bytes the batcher holds, and wakes a sink waiting for room.
    fn publish_bytes(&self) {
        // The batcher counts what the target gave for each action; the bookkeeping it
        // holds for each is added here, as the target counted it for the transit.
        let now = self.batcher.bytes()
            + self.batcher.pending() * super::batcher::bookkeeping_bytes::<E::Item, E::Effect>();
        let before = self.shared.held_bytes.swap(now, Ordering::SeqCst);
        if now < before {
            self.shared.space.notify_waiters();
        }
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Cmd<E>>) {
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

    async fn add(&mut self, batch: EncodedBatch<E>) {
        for added in batch.actions {
            match added {
                Added::Encoded(e) => self.batcher.add_doc(e.doc, e.effect, e.bytes, e.item),
                Added::Invalid(action, why) => self.unwritable(action, why).await,
            }
        }
    }

    /// What the failure policy makes of `action`, which failed with `failure`.
    fn decide(&self, action: &E::Action, failure: &ItemFailure) -> Decision<E::Action> {
        let encoder = &self.encoder;
        self.policy.decide(
            self.transport.system(),
            action,
            |a| encoder.describe(a),
            failure,
        )
    }

    /// An action that cannot go into a request (its record has no valid id, say): the
    /// failure policy decides, as for a document the target refused.
    async fn unwritable(&mut self, action: E::Action, why: String) {
        let failure = ItemFailure {
            status: 400,
            error_type: INVALID_DOCUMENT.into(),
            reason: why,
        };
        let m = &self.shared.metrics;
        match self.decide(&action, &failure) {
            Decision::Fail(message) => {
                m.items(ItemLabel::Failed, 1);
                self.shared.fail(message)
            }
            Decision::Drop => {
                warn!(action = %self.encoder.describe(&action), error = %failure.reason, "invalid document dropped by the failure handler");
                m.items(ItemLabel::Dropped, 1);
                self.shared.resolve(1);
            }
            Decision::DeadLetter(topic) => {
                match Self::dead_letter(
                    (&self.encoder, &self.transport),
                    self.dead_letter.as_ref(),
                    &action,
                    &failure,
                    &topic,
                )
                .await
                {
                    Ok(()) => self.dead_lettered(),
                    Err(e) => {
                        self.shared.metrics.items(ItemLabel::Failed, 1);
                        self.shared.fail(e)
                    }
                }
            }
            Decision::Requeue(_) => {
                m.items(ItemLabel::Failed, 1);
                self.shared.fail(format!(
                    "{}: {} (a replacement for a document that is not JSON is not accepted)",
                    self.encoder.describe(&action),
                    failure.reason
                ))
            }
        }
    }

    /// Sends every request the batcher has ready (`force`: a flush or close is waiting).
    fn dispatch(&mut self, force: bool) {
        let now = self.now_ms();
        while let Some((id, items)) = self.batcher.next_request(now, force) {
            let actions = items.len();
            let node = self.selector.pick(now);
            let (bytes, response) = self.transport.send(node, &items);
            self.shared.bulks.fetch_add(1, Ordering::Relaxed);
            self.shared.metrics.bytes_sent.inc_by(bytes as u64);
            debug!(
                sink = %self.name,
                actions,
                queued = self.batcher.queued(),
                pending = self.shared.pending(),
                force,
                "sending bulk request"
            );
            self.in_flight.push(Box::pin(async move {
                // Started at the first poll, when the request is sent.
                let started = Instant::now();
                let sent = response.await;
                Answer {
                    id,
                    node,
                    actions,
                    took: started.elapsed(),
                    sent,
                }
            }));
        }
        self.shared.metrics.report_in_flight(self.in_flight.len());
    }

    /// Hands a response to the batcher, with what each item result means. A node that
    /// did not answer is set aside a while; a refusal no restart cures fails the job
    /// for good.
    fn complete(&mut self, answer: Answer) {
        let Answer {
            id,
            node,
            actions,
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
        if !matches!(&sent, Sent::Written { items, .. } if *items == actions) {
            // What is not written stays a while (a retry, the failure handler; a
            // response whose item count does not match is retried whole): it gets its
            // own bytes rather than keep its whole batch's buffer alive.
            let encoder = &self.encoder;
            self.batcher
                .for_each_in_flight_mut(id, |item| encoder.unpin(item));
        }
        if let Some(message) = self.transport.unrecoverable(node, &sent) {
            self.shared.fail_unrecoverable(message);
        }
        let mut already_written = 0;
        let response = match sent {
            Sent::Written { items, by_label } => {
                if items == actions {
                    m.request(RequestLabel::Ok);
                    for (label, n) in ItemLabel::ALL.into_iter().zip(by_label) {
                        m.items(label, n);
                    }
                } else {
                    // Every action of a request retried whole is an item retried.
                    m.request(RequestLabel::Retried);
                    m.items(ItemLabel::Retried, actions);
                }
                Response::Written(items)
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
                    let transport = &self.transport;
                    let response = Response::Items(
                        items
                            .iter()
                            .zip(results)
                            .map(|(item, (status, ty, reason))| {
                                let (outcome, label) =
                                    transport.classify(item, status, ty.as_deref());
                                if outcome == Outcome::AlreadyWritten {
                                    already_written += 1;
                                }
                                match label {
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
                let outcome = self.transport.classify_request(status);
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
                        let what = self.encoder.describe(&self.encoder.action(&item));
                        self.shared.fail(format!("{what} {why}"))
                    }
                    Resolution::Fatal(item, why) => {
                        self.shared.metrics.items(ItemLabel::Failed, 1);
                        let what = self.encoder.describe(&self.encoder.action(&item));
                        let system = self.transport.system();
                        self.shared.fail(format!("{system} refused {what}: {why}"))
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
    async fn refused(
        &mut self,
        refusal: Refusal,
        item: E::Item,
        failure: ItemFailure,
        attempts: u32,
    ) {
        let action = self.encoder.action(&item);
        let m = &self.shared.metrics;
        match self.decide(&action, &failure) {
            Decision::Fail(message) => {
                m.items(ItemLabel::Failed, 1);
                self.batcher.settle_refused(refusal);
                self.shared.fail(message)
            }
            Decision::Drop => {
                warn!(action = %self.encoder.describe(&action), error = %failure.reason, "refused action dropped by the failure handler");
                m.items(ItemLabel::Dropped, 1);
                self.batcher.settle_refused(refusal);
                self.shared.resolve(1);
            }
            Decision::Requeue(actions) => {
                // Requeued actions take the refused one's place in its document's order,
                // and count its attempts, so that a handler requeuing forever fails the
                // job.
                if attempts + 1 > self.retry_max_attempts {
                    m.items(ItemLabel::Failed, 1);
                    self.batcher.settle_refused(refusal);
                    self.shared.fail(format!(
                        "{} requeued {attempts} times by the failure handler and still refused: {}",
                        self.encoder.describe(&action),
                        failure.reason
                    ));
                    return;
                }
                let batch = self.encoder.encode(actions);
                m.items(ItemLabel::Requeued, 1);
                self.shared.add_pending(batch.actions.len());
                self.shared.resolve(1);
                let mut replacements = Vec::with_capacity(batch.actions.len());
                let mut invalid = Vec::new();
                for added in batch.actions {
                    match added {
                        Added::Encoded(e) => replacements.push((e.doc, e.effect, e.bytes, e.item)),
                        Added::Invalid(action, why) => invalid.push((action, why)),
                    }
                }
                self.batcher.requeue_docs(refusal, replacements);
                // A replacement that cannot go into a request follows the handler too.
                for (action, why) in invalid {
                    self.unwritable(action, why).await;
                }
            }
            Decision::DeadLetter(topic) => {
                let written = Self::dead_letter(
                    (&self.encoder, &self.transport),
                    self.dead_letter.as_ref(),
                    &action,
                    &failure,
                    &topic,
                )
                .await;
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
    /// (An associated function: what it holds across the wait is the encoder, the
    /// transport and the writer, not the service, whose requests in flight are not
    /// `Sync`.)
    async fn dead_letter(
        (encoder, transport): (&E, &T),
        writer: Option<&DeadLetterWriter>,
        action: &E::Action,
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
        let parts = encoder.letter(action);
        let mut letter = DeadLetter::new(&error, transport.reason(failure), parts.payload)
            .with_origin(parts.origin)
            .with_key(parts.key);
        if let Some((index, id)) = parts.target {
            letter = letter.with_target(index, id);
        }
        writer
            .send(topic, &letter)
            .await
            .map_err(|e| format!("{e} ({})", encoder.describe(action)))
    }
}
