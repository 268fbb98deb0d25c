//! The bulk batcher: every decision of the bulk processor, without I/O. Its inputs are
//! actions, responses and the clock (milliseconds); its outputs are requests to send
//! and [`Resolution`]s. The processor task ([`super::bulk`]) only drives it.
//!
//! The rules, per document (actions without an id have no order to keep):
//! - **Coalescing** (`coalesce = true`): an unsent action that a newer action on the
//!   same document makes irrelevant ([`Effect::supersedes`]) is dropped, so a request
//!   carries the latest write of each hot document and a document's update rate is
//!   not bound by the round trip.
//! - **Order**: a document's actions are sent in the order they were added. A request
//!   carries a document's first unsent action plus the following ones while each
//!   supersedes the one before it (Elasticsearch applies the items of one document in
//!   request order); the rest wait until every action of that document in flight or
//!   awaiting a retry is settled.
//! - **Partial failure**: a retriable failure followed, in the same request, by a
//!   written action that supersedes it is not retried (it is [`Resolution::Superseded`]).
//!   Retried actions go back to the front of their document's queue, in order.
//! - **Pending** counts every action added and not yet resolved; it reaches 0 exactly
//!   when everything added is written, refused by policy or superseded by a write.
//!
//! Building a request costs what it carries: documents with something to send wait in a
//! ready queue, documents blocked by an action in flight are not scanned.

use super::coalesce::Effect;
use super::item_result::{Outcome, RequestOutcome};
use super::retry::backoff;
use std::collections::{HashMap, VecDeque};

/// The limits the batcher keeps.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_actions: usize,
    pub max_bytes: usize,
    pub max_in_flight: usize,
    pub flush_interval_ms: u64,
    pub coalesce: bool,
    pub retry_max_attempts: u32,
    pub retry_initial_ms: u64,
    pub retry_max_ms: u64,
}

/// Why Elasticsearch refused an action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemFailure {
    /// The item's (or the request's) HTTP status.
    pub status: u16,
    pub error_type: String,
    pub reason: String,
}

/// What became of an action: it leaves the batcher (and `pending`) with it.
#[derive(Debug)]
pub enum Resolution<T> {
    /// Written, or already written (a replay under external versions or `create`).
    Written(T),
    /// Dropped unsent: a newer action on its document made it irrelevant.
    Coalesced(T),
    /// Failed retriably, but a later action on its document that makes it irrelevant was
    /// written in the same request.
    Superseded(T),
    /// Refused for this document: the failure handler decides. `attempts` is how often
    /// it was sent.
    Refused(T, ItemFailure, u32),
    /// Still failing after `retry_max_attempts` retries: the job fails.
    Exhausted(T, String),
    /// The job cannot go on (authorization, or a request Elasticsearch cannot parse).
    Fatal(T, String),
}

/// One item's result, in request order.
#[derive(Debug, Clone)]
pub struct ItemResult {
    pub outcome: Outcome,
    pub failure: ItemFailure,
}

/// What came back for a request.
#[derive(Debug, Clone)]
pub enum Response {
    /// Item results by position.
    Items(Vec<ItemResult>),
    /// No item results: what the request's failure means, and why.
    Failed(RequestOutcome, String),
}

/// A request the caller sends: its id (for [`Batcher::on_response`]) and its actions.
pub type RequestId = u64;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Doc(String),
    /// An action without an id: nothing to order against.
    Alone(u64),
}

struct Entry<T> {
    key: Key,
    effect: Effect,
    bytes: usize,
    attempts: u32,
    payload: T,
}

#[derive(Default)]
struct Group {
    queued: VecDeque<usize>,
    /// Actions of this document in a request or awaiting a retry.
    outstanding: usize,
    in_ready: bool,
}

/// Counters of what the batcher did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    pub coalesced: u64,
    pub superseded: u64,
    pub retried: u64,
    pub requests: u64,
}

/// See the module documentation.
pub struct Batcher<T> {
    limits: Limits,
    entries: Vec<Option<Entry<T>>>,
    free: Vec<usize>,
    groups: HashMap<Key, Group>,
    /// Documents with queued actions and nothing outstanding, each once.
    ready: VecDeque<Key>,
    queued_actions: usize,
    queued_bytes: usize,
    in_flight: HashMap<RequestId, Vec<usize>>,
    /// Halves of a request refused as too large, sent before anything else.
    split: VecDeque<Vec<usize>>,
    /// Retries by due time (ms); each batch keeps its order.
    retries: Vec<(u64, Vec<usize>)>,
    resolved: Vec<Resolution<T>>,
    next_id: u64,
    last_send_ms: u64,
    pending: usize,
    counters: Counters,
}

impl<T> Batcher<T> {
    /// An empty batcher; `now_ms` starts the interval clock.
    pub fn new(limits: Limits, now_ms: u64) -> Batcher<T> {
        Batcher {
            limits,
            entries: Vec::new(),
            free: Vec::new(),
            groups: HashMap::new(),
            ready: VecDeque::new(),
            queued_actions: 0,
            queued_bytes: 0,
            in_flight: HashMap::new(),
            split: VecDeque::new(),
            retries: Vec::new(),
            resolved: Vec::new(),
            next_id: 0,
            last_send_ms: now_ms,
            pending: 0,
            counters: Counters::default(),
        }
    }

    /// Actions added and not yet resolved.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Actions waiting to be sent (not in flight, not awaiting a retry).
    pub fn queued(&self) -> usize {
        self.queued_actions
    }

    /// Requests sent and not answered.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The actions of request `id` while it is in flight, in request order.
    pub fn in_flight_payloads(&self, id: RequestId) -> Vec<&T> {
        self.in_flight
            .get(&id)
            .map(|b| b.iter().map(|&s| &self.entry(s).payload).collect())
            .unwrap_or_default()
    }

    /// Takes what was resolved since the last call, in order.
    pub fn drain_resolved(&mut self) -> Vec<Resolution<T>> {
        std::mem::take(&mut self.resolved)
    }

    fn entry(&self, slot: usize) -> &Entry<T> {
        self.entries[slot].as_ref().expect("a live entry")
    }

    fn insert(&mut self, e: Entry<T>) -> usize {
        match self.free.pop() {
            Some(s) => {
                self.entries[s] = Some(e);
                s
            }
            None => {
                self.entries.push(Some(e));
                self.entries.len() - 1
            }
        }
    }

    fn remove(&mut self, slot: usize) -> Entry<T> {
        let e = self.entries[slot].take().expect("a live entry");
        self.free.push(slot);
        self.pending -= 1;
        e
    }

    fn make_ready(&mut self, key: &Key) {
        if let Some(g) = self.groups.get_mut(key) {
            if g.outstanding == 0 && !g.queued.is_empty() && !g.in_ready {
                g.in_ready = true;
                self.ready.push_back(key.clone());
            }
            if g.outstanding == 0 && g.queued.is_empty() && !g.in_ready {
                self.groups.remove(key);
            }
        }
    }

    /// Adds an action on document `doc` (None: an action without an id). With
    /// coalescing, unsent actions it makes irrelevant are resolved as
    /// [`Resolution::Coalesced`].
    pub fn add(&mut self, doc: Option<String>, effect: Effect, bytes: usize, payload: T) {
        self.push(doc, effect, bytes, payload, 0, false);
    }

    /// Puts an action at the front of its document's queue (a failure handler's
    /// replacement for a refused action, which takes its place), counting `attempts`.
    pub fn requeue(
        &mut self,
        doc: Option<String>,
        effect: Effect,
        bytes: usize,
        payload: T,
        attempts: u32,
    ) {
        self.push(doc, effect, bytes, payload, attempts, true);
    }

    fn push(
        &mut self,
        doc: Option<String>,
        effect: Effect,
        bytes: usize,
        payload: T,
        attempts: u32,
        front: bool,
    ) {
        self.pending += 1;
        let key = match doc {
            Some(d) => Key::Doc(d),
            None => {
                self.next_id += 1;
                Key::Alone(self.next_id)
            }
        };
        if self.limits.coalesce && !front {
            let drop = self.groups.get(&key).map_or(0, |g| {
                g.queued
                    .iter()
                    .rev()
                    .take_while(|&&s| {
                        let older = self.entries[s].as_ref().expect("a live entry");
                        effect.supersedes(&older.effect)
                    })
                    .count()
            });
            for _ in 0..drop {
                let g = self.groups.get_mut(&key).expect("the group");
                let s = g.queued.pop_back().expect("a queued action");
                let e = self.remove(s);
                self.queued_actions -= 1;
                self.queued_bytes -= e.bytes;
                self.counters.coalesced += 1;
                self.resolved.push(Resolution::Coalesced(e.payload));
            }
        }
        let slot = self.insert(Entry {
            key: key.clone(),
            effect,
            bytes,
            attempts,
            payload,
        });
        let g = self.groups.entry(key.clone()).or_default();
        if front {
            g.queued.push_front(slot);
        } else {
            g.queued.push_back(slot);
        }
        self.queued_actions += 1;
        self.queued_bytes += bytes;
        self.make_ready(&key);
    }

    /// Moves retries due at `now_ms` back to the front of their documents' queues, in
    /// order. With coalescing, one that the action behind it makes irrelevant is
    /// resolved as superseded instead.
    fn promote_due(&mut self, now_ms: u64) {
        if self.retries.iter().all(|(due, _)| *due > now_ms) {
            return;
        }
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retries)
            .into_iter()
            .partition(|(t, _)| *t <= now_ms);
        self.retries = later;
        for (_, batch) in due {
            for slot in batch.into_iter().rev() {
                let key = self.entry(slot).key.clone();
                let g = self.groups.get_mut(&key).expect("the group");
                g.outstanding -= 1;
                let behind = g.queued.front().copied();
                let superseded = self.limits.coalesce
                    && behind
                        .is_some_and(|b| self.entry(b).effect.supersedes(&self.entry(slot).effect));
                if superseded {
                    let e = self.remove(slot);
                    self.counters.superseded += 1;
                    self.resolved.push(Resolution::Superseded(e.payload));
                } else {
                    let bytes = self.entry(slot).bytes;
                    self.groups
                        .get_mut(&key)
                        .expect("the group")
                        .queued
                        .push_front(slot);
                    self.queued_actions += 1;
                    self.queued_bytes += bytes;
                }
                self.make_ready(&key);
            }
        }
    }

    /// The next request to send at `now_ms`, if one is due: a refused request's half,
    /// or a batch when `max_actions` or `max_bytes` is queued, the flush interval has
    /// passed, or `force` (a checkpoint flush or close) — while fewer than
    /// `max_in_flight` requests are out.
    pub fn next_request(&mut self, now_ms: u64, force: bool) -> Option<(RequestId, Vec<&T>)> {
        self.promote_due(now_ms);
        if self.in_flight.len() >= self.limits.max_in_flight {
            return None;
        }
        let batch = match self.split.pop_front() {
            Some(b) => b,
            None => {
                let due = force
                    || self.queued_actions >= self.limits.max_actions
                    || self.queued_bytes >= self.limits.max_bytes
                    || now_ms.saturating_sub(self.last_send_ms) >= self.limits.flush_interval_ms;
                if !due || self.ready.is_empty() {
                    return None;
                }
                self.build()
            }
        };
        self.last_send_ms = now_ms;
        self.counters.requests += 1;
        self.next_id += 1;
        let id = self.next_id;
        self.in_flight.insert(id, batch);
        let payloads = self.in_flight[&id]
            .iter()
            .map(|&s| &self.entry(s).payload)
            .collect();
        Some((id, payloads))
    }

    fn build(&mut self) -> Vec<usize> {
        let (max_actions, max_bytes) = (self.limits.max_actions.max(1), self.limits.max_bytes);
        let mut batch = Vec::new();
        let mut bytes = 0;
        while let Some(key) = self.ready.pop_front() {
            let g = self.groups.get(&key).expect("a ready group");
            // The first action, and those after it that each supersede the one before.
            let mut take = 1;
            let mut take_bytes = self.entry(g.queued[0]).bytes;
            while take < g.queued.len() {
                let (prev, next) = (self.entry(g.queued[take - 1]), self.entry(g.queued[take]));
                if !next.effect.supersedes(&prev.effect)
                    || batch.len() + take + 1 > max_actions
                    || bytes + take_bytes + next.bytes > max_bytes
                {
                    break;
                }
                take += 1;
                take_bytes += next.bytes;
            }
            let fits = batch.len() + take <= max_actions && bytes + take_bytes <= max_bytes;
            if !batch.is_empty() && !fits {
                self.ready.push_front(key);
                break;
            }
            let g = self.groups.get_mut(&key).expect("a ready group");
            g.in_ready = false;
            g.outstanding += take;
            batch.extend(g.queued.drain(..take));
            bytes += take_bytes;
            self.queued_actions -= take;
            self.queued_bytes -= take_bytes;
        }
        batch
    }

    /// Applies the response to request `id`. `jitter` in `[0, 1)` spreads the backoff
    /// of what is retried.
    pub fn on_response(&mut self, id: RequestId, response: Response, now_ms: u64, jitter: f64) {
        let Some(batch) = self.in_flight.remove(&id) else {
            debug_assert!(false, "a response to an unknown request");
            return;
        };
        match response {
            Response::Items(items) if items.len() == batch.len() => {
                self.on_items(batch, items, now_ms, jitter)
            }
            Response::Items(items) => {
                let why = format!("{} item results for {} actions", items.len(), batch.len());
                self.retry(batch, &why, now_ms, jitter)
            }
            Response::Failed(RequestOutcome::Retry, why) => self.retry(batch, &why, now_ms, jitter),
            Response::Failed(RequestOutcome::Split, why) => self.split(batch, why),
            Response::Failed(RequestOutcome::Fatal | RequestOutcome::Malformed, why) => {
                for slot in batch {
                    self.settle(slot);
                    let e = self.remove(slot);
                    self.resolved
                        .push(Resolution::Fatal(e.payload, why.clone()));
                    self.make_ready(&e.key);
                }
            }
        }
    }

    /// One fewer outstanding action on the slot's document.
    fn settle(&mut self, slot: usize) {
        let key = &self.entries[slot].as_ref().expect("a live entry").key;
        if let Some(g) = self.groups.get_mut(key) {
            g.outstanding -= 1;
        }
    }

    fn on_items(&mut self, batch: Vec<usize>, items: Vec<ItemResult>, now_ms: u64, jitter: f64) {
        // A document's actions in a request are contiguous and each supersedes the one
        // before: a retriable failure before a written action of its document is moot.
        let mut written_later = vec![false; batch.len()];
        for i in (0..batch.len().saturating_sub(1)).rev() {
            let same = self.entry(batch[i]).key == self.entry(batch[i + 1]).key;
            written_later[i] = same
                && (written_later[i + 1]
                    || matches!(
                        items[i + 1].outcome,
                        Outcome::Done | Outcome::AlreadyWritten
                    ));
        }
        let mut retry = Vec::new();
        let mut why = String::new();
        let mut touched = Vec::new();
        for ((slot, item), moot) in batch.into_iter().zip(items).zip(written_later) {
            self.settle(slot);
            touched.push(self.entry(slot).key.clone());
            match item.outcome {
                Outcome::Done | Outcome::AlreadyWritten => {
                    let e = self.remove(slot);
                    self.resolved.push(Resolution::Written(e.payload));
                }
                Outcome::Retry if moot => {
                    let e = self.remove(slot);
                    self.counters.superseded += 1;
                    self.resolved.push(Resolution::Superseded(e.payload));
                }
                Outcome::Retry => {
                    why = format!("{} {}", item.failure.status, item.failure.error_type);
                    retry.push(slot);
                }
                Outcome::Rejected => {
                    let e = self.remove(slot);
                    let attempts = e.attempts;
                    self.resolved
                        .push(Resolution::Refused(e.payload, item.failure, attempts));
                }
                Outcome::Fatal => {
                    let e = self.remove(slot);
                    let why = format!(
                        "{} {}: {} (authorization)",
                        item.failure.status, item.failure.error_type, item.failure.reason
                    );
                    self.resolved.push(Resolution::Fatal(e.payload, why));
                }
            }
        }
        if !retry.is_empty() {
            // Re-held: `retry` counts them outstanding again.
            for &s in &retry {
                let key = self.entry(s).key.clone();
                self.groups.get_mut(&key).expect("the group").outstanding += 1;
            }
            self.retry(retry, &why, now_ms, jitter);
        }
        for key in touched {
            self.make_ready(&key);
        }
    }

    /// Schedules `batch` (outstanding, in order) for another attempt, or resolves what
    /// has no attempts left.
    fn retry(&mut self, batch: Vec<usize>, why: &str, now_ms: u64, jitter: f64) {
        let mut again = Vec::with_capacity(batch.len());
        let mut attempts = 0;
        for slot in batch {
            let max = self.limits.retry_max_attempts;
            let e = self.entries[slot].as_mut().expect("a live entry");
            e.attempts += 1;
            if e.attempts > max {
                let key = e.key.clone();
                self.settle(slot);
                let e = self.remove(slot);
                self.resolved.push(Resolution::Exhausted(
                    e.payload,
                    format!("still failing after {max} retries: {why}"),
                ));
                self.make_ready(&key);
            } else {
                attempts = attempts.max(e.attempts);
                again.push(slot);
            }
        }
        if again.is_empty() {
            return;
        }
        self.counters.retried += again.len() as u64;
        let delay = backoff(
            attempts,
            self.limits.retry_initial_ms,
            self.limits.retry_max_ms,
            jitter,
        );
        self.retries
            .push((now_ms + delay.as_millis() as u64, again));
    }

    /// A request refused as too large: its halves are sent separately. A document cut
    /// by the split keeps its order: its actions in the second half go back to the front
    /// of its queue, behind the first half.
    fn split(&mut self, mut batch: Vec<usize>, why: String) {
        if batch.len() == 1 {
            let slot = batch[0];
            let key = self.entry(slot).key.clone();
            self.settle(slot);
            let e = self.remove(slot);
            let attempts = e.attempts;
            self.resolved.push(Resolution::Refused(
                e.payload,
                ItemFailure {
                    status: 413,
                    error_type: "content_too_long".into(),
                    reason: why,
                },
                attempts,
            ));
            self.make_ready(&key);
            return;
        }
        let second = batch.split_off(batch.len() / 2);
        let cut = self.entry(*batch.last().expect("a first half")).key.clone();
        let (back, second): (Vec<usize>, Vec<usize>) =
            second.into_iter().partition(|&s| self.entry(s).key == cut);
        for &slot in back.iter().rev() {
            self.settle(slot);
            let bytes = self.entry(slot).bytes;
            self.groups
                .get_mut(&cut)
                .expect("the group")
                .queued
                .push_front(slot);
            self.queued_actions += 1;
            self.queued_bytes += bytes;
        }
        self.split.push_back(batch);
        if !second.is_empty() {
            self.split.push_back(second);
        }
    }

    /// When the caller should next call [`Batcher::next_request`] without a new input:
    /// the earliest retry, or the flush interval when something could be sent.
    pub fn next_wake_ms(&self) -> Option<u64> {
        let retry = self.retries.iter().map(|(t, _)| *t).min();
        let sendable = self.in_flight.len() < self.limits.max_in_flight
            && (!self.ready.is_empty() || !self.split.is_empty());
        let flush = sendable.then(|| self.last_send_ms + self.limits.flush_interval_ms);
        match (retry, flush) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Drops everything not in flight (the job is failing: nothing more is sent).
    /// Returns how many actions were dropped; requests in flight still get their
    /// responses.
    pub fn clear_unsent(&mut self) -> usize {
        let mut slots: Vec<usize> = Vec::new();
        for g in self.groups.values_mut() {
            slots.extend(g.queued.drain(..));
            g.in_ready = false;
        }
        let held: Vec<usize> = self
            .retries
            .drain(..)
            .flat_map(|(_, b)| b)
            .chain(self.split.drain(..).flatten())
            .collect();
        for &s in &held {
            self.settle(s);
        }
        slots.extend(held);
        let n = slots.len();
        for s in slots {
            self.remove(s);
        }
        self.groups.retain(|_, g| g.outstanding > 0);
        self.ready.clear();
        self.queued_actions = 0;
        self.queued_bytes = 0;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::elasticsearch::action::{BulkAction, OpType};
    use proptest::prelude::*;
    use serde_json::{json, Value};
    use std::collections::HashMap;

    fn limits(max_actions: usize, max_in_flight: usize, coalesce: bool) -> Limits {
        Limits {
            max_actions,
            max_bytes: 1 << 20,
            max_in_flight,
            flush_interval_ms: 1000,
            coalesce,
            retry_max_attempts: u32::MAX,
            retry_initial_ms: 10,
            retry_max_ms: 100,
        }
    }

    fn ok() -> ItemResult {
        ItemResult {
            outcome: Outcome::Done,
            failure: ItemFailure {
                status: 200,
                error_type: String::new(),
                reason: String::new(),
            },
        }
    }

    fn too_many() -> ItemResult {
        ItemResult {
            outcome: Outcome::Retry,
            failure: ItemFailure {
                status: 429,
                error_type: "es_rejected_execution_exception".into(),
                reason: "queue full".into(),
            },
        }
    }

    fn index(v: i64) -> BulkAction {
        BulkAction::index(
            "i",
            Some("d".into()),
            json!({ "v": v }).to_string().into_bytes(),
        )
    }

    #[test]
    fn hot_document_writes_coalesce_to_the_latest() {
        let mut b = Batcher::new(limits(1000, 1, true), 0);
        for v in 0..100 {
            b.add(Some("d".into()), Effect::of(&index(v)), 10, v);
        }
        assert_eq!(b.pending(), 1);
        assert_eq!(b.counters().coalesced, 99);
        let (id, payloads) = b.next_request(0, true).unwrap();
        assert_eq!(payloads, vec![&99]);
        b.on_response(id, Response::Items(vec![ok()]), 1, 0.5);
        assert_eq!(b.pending(), 0);
        let written: Vec<_> = b
            .drain_resolved()
            .into_iter()
            .filter_map(|r| match r {
                Resolution::Written(v) => Some(v),
                _ => None,
            })
            .collect();
        assert_eq!(written, vec![99]);
    }

    #[test]
    fn without_coalescing_a_superseding_chain_shares_one_request() {
        let mut b = Batcher::new(limits(1000, 1, false), 0);
        for v in 0..5 {
            b.add(Some("d".into()), Effect::of(&index(v)), 10, v);
        }
        let (id, payloads) = b.next_request(0, true).unwrap();
        assert_eq!(
            payloads.len(),
            5,
            "one request carries the document's chain"
        );
        // The first three are rejected with 429, the last two written: nothing is retried.
        let items = vec![too_many(), too_many(), too_many(), ok(), too_many()];
        b.on_response(id, Response::Items(items), 1, 0.5);
        assert_eq!(b.counters().superseded, 3);
        assert_eq!(
            b.pending(),
            1,
            "the last one failed after the write: retried"
        );
    }

    #[test]
    fn an_action_waits_while_its_document_is_in_flight() {
        let mut b = Batcher::new(limits(1000, 2, true), 0);
        let scripted = |n| BulkAction {
            op: OpType::Update,
            body: Some(format!(r#"{{"script":"ctx._source.n += {n}"}}"#).into_bytes()),
            ..index(0)
        };
        b.add(Some("d".into()), Effect::of(&scripted(1)), 10, 1);
        let (first, _) = b.next_request(0, true).unwrap();
        b.add(Some("d".into()), Effect::of(&scripted(2)), 10, 2);
        b.add(Some("e".into()), Effect::of(&scripted(3)), 10, 3);
        let (_, payloads) = b.next_request(0, true).unwrap();
        assert_eq!(payloads, vec![&3], "d is in flight: only e is sent");
        b.on_response(first, Response::Items(vec![ok()]), 1, 0.5);
        let (_, payloads) = b.next_request(1, true).unwrap();
        assert_eq!(payloads, vec![&2]);
    }

    #[test]
    fn a_split_keeps_a_documents_actions_in_order() {
        let mut b = Batcher::new(limits(1000, 4, false), 0);
        for v in 0..4 {
            b.add(Some("d".into()), Effect::of(&index(v)), 10, v);
        }
        let (id, _) = b.next_request(0, true).unwrap();
        b.on_response(
            id,
            Response::Failed(RequestOutcome::Split, "413".into()),
            1,
            0.5,
        );
        let (a, first) = b.next_request(1, true).unwrap();
        assert_eq!(first, vec![&0, &1]);
        assert!(
            b.next_request(1, true).is_none(),
            "the rest of d waits for the first half"
        );
        b.on_response(a, Response::Items(vec![ok(), ok()]), 2, 0.5);
        let (_, rest) = b.next_request(2, true).unwrap();
        assert_eq!(rest, vec![&2, &3]);
    }

    /// One action of the model: what it does to document `doc`.
    #[derive(Debug, Clone)]
    enum Kind {
        Index(i64),
        Upsert(Vec<(&'static str, i64)>),
        Delete,
    }

    #[derive(Debug, Clone)]
    enum How {
        AllOk,
        /// Item i is rejected with 429 where bit i % 8 is set.
        Reject429(u8),
        Whole503,
        /// Applied by the server, but the response is lost (a connection error).
        DroppedAfterApply,
        TooLarge,
    }

    #[derive(Debug, Clone)]
    enum Step {
        Add(u8, Kind),
        Send(bool),
        Respond(usize, How),
        Tick(u64),
    }

    fn kind(versioned: bool) -> BoxedStrategy<Kind> {
        let fields = prop::collection::vec((prop_oneof![Just("a"), Just("b")], 0i64..9), 1..3);
        if versioned {
            prop_oneof![4 => (0i64..9).prop_map(Kind::Index), 1 => Just(Kind::Delete)].boxed()
        } else {
            prop_oneof![
                3 => (0i64..9).prop_map(Kind::Index),
                3 => fields.prop_map(Kind::Upsert),
                1 => Just(Kind::Delete),
            ]
            .boxed()
        }
    }

    fn step(versioned: bool) -> impl Strategy<Value = Step> {
        prop_oneof![
            5 => (0u8..4, kind(versioned)).prop_map(|(d, k)| Step::Add(d, k)),
            2 => any::<bool>().prop_map(Step::Send),
            3 => (0usize..4, prop_oneof![
                3 => Just(How::AllOk),
                2 => any::<u8>().prop_map(How::Reject429),
                1 => Just(How::Whole503),
                1 => Just(How::DroppedAfterApply),
                1 => Just(How::TooLarge),
            ]).prop_map(|(i, h)| Step::Respond(i, h)),
            1 => (0u64..200).prop_map(Step::Tick),
        ]
    }

    type Store = HashMap<String, (Value, Option<i64>)>;

    /// The server: applies one action, answering as Elasticsearch would.
    fn apply(store: &mut Store, a: &BulkAction) -> ItemResult {
        let doc = a.id.clone().unwrap();
        let body = || serde_json::from_slice::<Value>(a.body.as_ref().unwrap()).unwrap();
        let conflict = a.version.is_some_and(|v| {
            store
                .get(&doc)
                .is_some_and(|(_, cur)| cur.unwrap_or(-1) >= v)
        });
        let mut r = ok();
        if conflict {
            r.outcome = Outcome::AlreadyWritten;
            return r;
        }
        match a.op {
            OpType::Index => {
                store.insert(doc, (body(), a.version));
            }
            OpType::Delete => {
                store.remove(&doc);
            }
            OpType::Update => {
                let changes = body()["doc"].clone();
                let entry = store.entry(doc).or_insert((json!({}), None));
                for (k, v) in changes.as_object().unwrap() {
                    entry.0[k] = v.clone();
                }
            }
            OpType::Create => unreachable!(),
        }
        r
    }

    fn action(doc: u8, k: &Kind, version: Option<i64>) -> BulkAction {
        let id = format!("doc-{doc}");
        let mut a = match k {
            Kind::Index(v) => {
                BulkAction::index("i", Some(id), json!({ "v": v }).to_string().into_bytes())
            }
            Kind::Upsert(fields) => {
                let m: serde_json::Map<String, Value> = fields
                    .iter()
                    .map(|(f, v)| (f.to_string(), json!(v)))
                    .collect();
                BulkAction::upsert("i", id, Value::Object(m).to_string().as_bytes())
            }
            Kind::Delete => BulkAction {
                op: OpType::Delete,
                body: None,
                ..BulkAction::index("i", Some(id), Vec::new())
            },
        };
        a.version = version;
        a
    }

    fn run_model(
        steps: Vec<Step>,
        versioned: bool,
        max_actions: usize,
        max_in_flight: usize,
        coalesce: bool,
    ) -> Result<(), TestCaseError> {
        let mut b: Batcher<usize> = Batcher::new(limits(max_actions, max_in_flight, coalesce), 0);
        let mut actions: Vec<BulkAction> = Vec::new();
        let mut resolved: Vec<bool> = Vec::new();
        let mut store = Store::new();
        let mut requests: Vec<(RequestId, Vec<usize>)> = Vec::new();
        let mut now = 0;
        let drain =
            |b: &mut Batcher<usize>, resolved: &mut Vec<bool>| -> Result<(), TestCaseError> {
                for r in b.drain_resolved() {
                    let seq = match r {
                        Resolution::Written(s)
                        | Resolution::Coalesced(s)
                        | Resolution::Superseded(s) => s,
                        other => return Err(TestCaseError::fail(format!("unexpected {other:?}"))),
                    };
                    prop_assert!(!resolved[seq], "action {} resolved twice", seq);
                    resolved[seq] = true;
                }
                Ok(())
            };
        let expected = |actions: &[BulkAction]| {
            let mut s = Store::new();
            for a in actions {
                apply(&mut s, a);
            }
            s
        };
        let respond = |b: &mut Batcher<usize>,
                       store: &mut Store,
                       id: RequestId,
                       seqs: &[usize],
                       how: &How,
                       actions: &[BulkAction],
                       now: u64| {
            let response = match how {
                How::AllOk => {
                    Response::Items(seqs.iter().map(|&s| apply(store, &actions[s])).collect())
                }
                How::Reject429(mask) => Response::Items(
                    seqs.iter()
                        .enumerate()
                        .map(|(i, &s)| {
                            if mask & (1 << (i % 8)) != 0 {
                                too_many()
                            } else {
                                apply(store, &actions[s])
                            }
                        })
                        .collect(),
                ),
                How::Whole503 => Response::Failed(RequestOutcome::Retry, "503".into()),
                How::DroppedAfterApply => {
                    for &s in seqs {
                        apply(store, &actions[s]);
                    }
                    Response::Failed(RequestOutcome::Retry, "connection closed".into())
                }
                How::TooLarge if seqs.len() > 1 => {
                    Response::Failed(RequestOutcome::Split, "413".into())
                }
                How::TooLarge => {
                    Response::Items(seqs.iter().map(|&s| apply(store, &actions[s])).collect())
                }
            };
            b.on_response(id, response, now, 0.5);
        };
        for st in steps {
            match st {
                Step::Add(doc, k) => {
                    let seq = actions.len();
                    let a = action(doc, &k, versioned.then_some(seq as i64));
                    b.add(a.id.clone(), Effect::of(&a), 10, seq);
                    actions.push(a);
                    resolved.push(false);
                }
                Step::Send(force) => {
                    while let Some((id, p)) = b.next_request(now, force) {
                        let seqs = p.into_iter().copied().collect();
                        requests.push((id, seqs));
                    }
                }
                Step::Respond(i, how) if !requests.is_empty() => {
                    let (id, seqs) = requests.remove(i % requests.len());
                    respond(&mut b, &mut store, id, &seqs, &how, &actions, now);
                }
                Step::Respond(..) => {}
                Step::Tick(ms) => now += ms,
            }
            drain(&mut b, &mut resolved)?;
            let open = resolved.iter().filter(|r| !**r).count();
            prop_assert_eq!(b.pending(), open);
            if b.pending() == 0 {
                prop_assert_eq!(
                    &store,
                    &expected(&actions),
                    "pending is 0: everything is written"
                );
            }
        }
        // Quiesce: everything answered, retries come due.
        for _ in 0..10_000 {
            if b.pending() == 0 {
                break;
            }
            now += 1000;
            while let Some((id, p)) = b.next_request(now, true) {
                let seqs = p.into_iter().copied().collect();
                requests.push((id, seqs));
            }
            for (id, seqs) in std::mem::take(&mut requests) {
                respond(&mut b, &mut store, id, &seqs, &How::AllOk, &actions, now);
            }
            drain(&mut b, &mut resolved)?;
        }
        prop_assert_eq!(b.pending(), 0);
        prop_assert!(resolved.iter().all(|r| *r));
        prop_assert_eq!(
            &store,
            &expected(&actions),
            "the last write per document wins"
        );
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// For any interleaving of adds, sends and responses (success, per-item 429,
        /// whole-request failure, a response lost after the bulk was applied, 413), the
        /// final documents equal applying every action in order, and `pending` is 0
        /// exactly when everything is acknowledged.
        #[test]
        fn the_last_write_per_document_wins(
            steps in prop::collection::vec(step(false), 1..80),
            max_actions in 1usize..6,
            max_in_flight in 1usize..4,
            coalesce in any::<bool>(),
        ) {
            run_model(steps, false, max_actions, max_in_flight, coalesce)?;
        }

        /// The same with external versions (the record's offset).
        #[test]
        fn the_last_write_per_document_wins_with_external_versions(
            steps in prop::collection::vec(step(true), 1..80),
            max_actions in 1usize..6,
            max_in_flight in 1usize..4,
            coalesce in any::<bool>(),
        ) {
            run_model(steps, true, max_actions, max_in_flight, coalesce)?;
        }
    }
}
