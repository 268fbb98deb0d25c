//! The bulk batcher: every decision of the bulk processor, without I/O. Its inputs are
//! actions, responses, the failure handler's answers and the clock (milliseconds); its
//! outputs are requests to send and [`Resolution`]s. The processor task
//! ([`super::bulk`]) only drives it.
//!
//! Each document keeps one ordered list of its live actions, whatever their state
//! (queued, in a request, awaiting a retry, refused and awaiting the failure handler):
//! that list is the document's order, and nothing ever reorders it. The rules
//! (actions without an id have no order to keep):
//! - **Coalescing** (`coalesce = true`): a queued action that a newer action on the
//!   same document makes irrelevant ([`Effect::supersedes`]) is not sent, so a request
//!   carries the latest write of each hot document and a document's update rate is
//!   not bound by the round trip. It is *set aside*, not dropped: the newer action
//!   keeps what it replaced (still pending, its bytes still held) until it is written
//!   ([`Resolution::Coalesced`] then). If the newer action is not written (refused and
//!   settled by the failure handler, or failed), what it replaced goes back in its
//!   place and is sent as it would have been without coalescing — so a refused
//!   successor never takes the write before it along. A chain (c over b over a; c
//!   refused) goes back whole, oldest first, and one request carries it (b supersedes
//!   a), so a document whose every write is refused costs a request per
//!   `max_actions` writes, not one per write; what went back is never set aside again.
//!   The document ends as it would have without coalescing, whatever the batch
//!   boundaries; only the replaced actions themselves are never sent once their
//!   successor is written (a replaced action Elasticsearch would have refused is not
//!   dead-lettered).
//! - **Intake**: set-aside actions count with queued ones toward the intake limit
//!   ([`Batcher::has_room`], [`INTAKE_REQUESTS`] × `max_actions`), since a refusal
//!   puts them back to be sent: a flush needs at most a few requests' worth.
//! - **Order**: a document is sent only when none of its actions is in a request,
//!   awaiting a retry or awaiting the failure handler. A request carries its first
//!   queued action plus the following ones while each supersedes the one before it
//!   (Elasticsearch applies the items of one document in request order).
//! - **Partial failure**: a retriable failure followed, in the same request, by a
//!   written action that supersedes it is not retried ([`Resolution::Superseded`]). A
//!   retried action keeps its place in the list; with coalescing, one that the queued
//!   action behind it supersedes is set aside by that action, as a queued one would be
//!   (resolved as superseded once that action is written).
//! - **Refusals**: a refused action keeps its place until the failure handler answers
//!   ([`Batcher::settle_refused`] or [`Batcher::requeue`]); replacements on the same
//!   document take exactly that place. What the refused action had set aside stays set
//!   aside under the first replacement on its document if that one supersedes it all
//!   (so it is never sent after a refused action that may already be applied); else it
//!   goes back, before the replacements. If a later action on the document was already
//!   written in the same request, a replacement it supersedes is superseded, and one it
//!   does not supersede cannot be applied in order: that fails the job
//!   ([`Resolution::Fatal`]) rather than reorder the document.
//! - **Pending** counts every action added and not yet resolved, set-aside actions
//!   included; it reaches 0 exactly when everything added is written, settled by the
//!   failure handler, or superseded by a write — never while a set-aside action may
//!   still have to be written.
//!
//! Building a request costs what it carries: documents with something to send wait in a
//! ready queue, documents blocked by an action in flight are not scanned.

use super::coalesce::Effect;
use super::item_result::{Outcome, RequestOutcome};
use crate::connector::kit::bulk::backoff;
use bytes::Bytes;
use std::collections::hash_map::Entry as MapEntry;
use std::collections::{HashMap, VecDeque};
use std::hash::Hasher as _;
use std::time::Duration;

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

pub use crate::connector::kit::bulk::ItemFailure;

/// A refused action's place in its document's order, held until the failure handler
/// answers with [`Batcher::settle_refused`] or [`Batcher::requeue`].
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal(usize);

/// What became of an action.
#[derive(Debug)]
pub enum Resolution<T> {
    /// Written, or already written (a replay under external versions or `create`).
    Written(T),
    /// Never sent: a newer action on its document made it irrelevant while it was
    /// queued, and that action (or a later one that supersedes it) was written.
    Coalesced(T),
    /// Not (re)sent: a later action on its document that makes it irrelevant was
    /// written.
    Superseded(T),
    /// Refused for this document: the failure handler decides, and answers with the
    /// [`Refusal`]. `attempts` is how often it was sent before.
    Refused {
        refusal: Refusal,
        payload: T,
        failure: ItemFailure,
        attempts: u32,
    },
    /// Still failing after `retry_max_attempts` retries: the job fails.
    Exhausted(T, String),
    /// The job cannot go on (authorization, a request Elasticsearch cannot parse, or a
    /// replacement that cannot keep its document's order).
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
    /// Every item was written: Elasticsearch answered `errors: false`, with this many
    /// item results (a count that differs from the request's retries it whole).
    Written(usize),
    /// Item results by position.
    Items(Vec<ItemResult>),
    /// No item results: what the request's failure means, and why.
    Failed(RequestOutcome, String),
}

/// A request's id, for [`Batcher::on_response`].
pub type RequestId = u64;

/// A document's identity (its index and id): two actions are on the same document
/// exactly when their keys are equal, so every key one batcher sees must come from the
/// same encoding. Cloning it costs a reference count, not a copy: the bulk processor's
/// keys are slices of the encoded action lines.
///
/// The key carries its hash, computed once while its bytes are fresh: when a document's
/// last action is resolved, its key leaves the batcher's map without its bytes (by
/// then cold, somewhere in an old batch's buffer) being read again.
#[derive(Debug, Clone)]
pub struct DocKey {
    hash: u64,
    bytes: Bytes,
}

impl DocKey {
    /// The key of these bytes.
    pub fn new(bytes: Bytes) -> DocKey {
        // A fixed hash function; the map hashes it again with its random state.
        let mut h = std::hash::DefaultHasher::new();
        h.write(&bytes);
        DocKey {
            hash: h.finish(),
            bytes,
        }
    }

    /// The same key in bytes of its own (not a slice of a larger buffer).
    pub fn owned(self) -> DocKey {
        DocKey {
            hash: self.hash,
            bytes: Bytes::copy_from_slice(&self.bytes),
        }
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl PartialEq for DocKey {
    fn eq(&self, other: &DocKey) -> bool {
        self.hash == other.hash
            && ((self.bytes.as_ptr() == other.bytes.as_ptr()
                && self.bytes.len() == other.bytes.len())
                || self.bytes == other.bytes)
    }
}

impl Eq for DocKey {}

impl std::hash::Hash for DocKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl From<String> for DocKey {
    fn from(s: String) -> DocKey {
        DocKey::new(Bytes::from(s))
    }
}

impl From<&str> for DocKey {
    fn from(s: &str) -> DocKey {
        DocKey::new(Bytes::copy_from_slice(s.as_bytes()))
    }
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    Queued,
    InFlight,
    Retrying,
    /// Refused, awaiting the failure handler. `overtaken`: the effect of a later action
    /// on the document written in the same request.
    Refused {
        overtaken: Option<Effect>,
    },
    /// Set aside by a newer action on the document that supersedes it (out of the
    /// document's list, reachable only from that action's `replaced`).
    Replaced,
}

/// The actions one action set aside, oldest first, linked through their `next`: a flat
/// list (what a set-aside action had set aside joins the list just before it), so that
/// putting them back is one step. The one exception: an action that may already be
/// applied (sent and retried, or the replacement of one that was) keeps what it had set
/// aside under it, since what is older must then not be sent after it.
#[derive(Debug, Clone, Copy)]
struct Chain {
    head: usize,
    tail: usize,
}

struct Entry<T> {
    /// The entry's document, an index into `groups`.
    group: usize,
    effect: Effect,
    bytes: usize,
    attempts: u32,
    state: State,
    /// It was refused with a retriable failure: set aside later, it is superseded, not
    /// coalesced.
    retried: bool,
    /// It may already be applied: it was sent and retried, or it replaces (requeued by
    /// the failure handler) one that was. What it set aside stays under it (see
    /// [`Chain`]), never flattened into the list of an action that sets it aside.
    possibly_applied: bool,
    /// Put back in its place after its successor was refused: it is sent, never set
    /// aside by a newer action again (else a document whose every write is refused
    /// would send one action per round trip).
    restored: bool,
    /// Taken while the failure handler holds it.
    payload: Option<T>,
    /// The actions this one set aside (and those they had set aside): resolved when
    /// this one is written, put back in its place if not.
    replaced: Option<Chain>,
    /// For a set-aside action: the next (newer) one in the same list.
    next: Option<usize>,
}

/// The live actions of one document, in order. Almost every document has one at a
/// time, held inline: the order check allocates only for a document with several.
#[derive(Debug, Default)]
enum Slots {
    #[default]
    Empty,
    One(usize),
    Many(Vec<usize>),
}

impl Slots {
    fn as_slice(&self) -> &[usize] {
        match self {
            Slots::Empty => &[],
            Slots::One(s) => std::slice::from_ref(s),
            Slots::Many(v) => v,
        }
    }

    fn len(&self) -> usize {
        self.as_slice().len()
    }

    fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    fn position(&self, slot: usize) -> Option<usize> {
        self.as_slice().iter().position(|&s| s == slot)
    }

    fn insert(&mut self, at: usize, slot: usize) {
        *self = match std::mem::take(self) {
            Slots::Empty => Slots::One(slot),
            Slots::One(s) => {
                let mut v = vec![s];
                v.insert(at, slot);
                Slots::Many(v)
            }
            Slots::Many(mut v) => {
                v.insert(at, slot);
                Slots::Many(v)
            }
        };
    }

    /// Inserts `slots`, in order, at `at`.
    fn insert_all(&mut self, at: usize, slots: &[usize]) {
        let mut v = match std::mem::take(self) {
            Slots::Empty => Vec::with_capacity(slots.len()),
            Slots::One(s) => vec![s],
            Slots::Many(v) => v,
        };
        v.splice(at..at, slots.iter().copied());
        *self = match v.as_slice() {
            [] => Slots::Empty,
            [s] => Slots::One(*s),
            _ => Slots::Many(v),
        };
    }

    fn push_back(&mut self, slot: usize) {
        self.insert(self.len(), slot);
    }

    /// Removes `slot` if it is there.
    fn remove_slot(&mut self, slot: usize) {
        match self {
            Slots::One(s) if *s == slot => *self = Slots::Empty,
            Slots::Many(v) => {
                if let Some(at) = v.iter().position(|&s| s == slot) {
                    v.remove(at);
                }
                if v.is_empty() {
                    *self = Slots::Empty;
                }
            }
            _ => {}
        }
    }
}

struct Group {
    /// The document's key in `Batcher::docs`; None for an action without an id,
    /// which has nothing to order against.
    key: Option<DocKey>,
    /// Every live action of the document, in order.
    items: Slots,
    /// How many of them are not queued.
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
    /// Documents with live actions, by slot; a slot is reused once its document has none.
    groups: Vec<Option<Group>>,
    free_groups: Vec<usize>,
    /// The group of each document with live actions.
    docs: HashMap<DocKey, usize>,
    /// Documents with queued actions and nothing outstanding, each once.
    ready: VecDeque<usize>,
    queued_actions: usize,
    queued_bytes: usize,
    /// Actions set aside (in some action's `replaced`).
    set_aside_actions: usize,
    in_flight: HashMap<RequestId, Vec<usize>>,
    /// Halves of a request refused as too large, sent before anything else.
    split: VecDeque<Vec<usize>>,
    /// Retries by due time (ms).
    retries: Vec<(u64, Vec<usize>)>,
    resolved: Vec<Resolution<T>>,
    next_id: u64,
    last_send_ms: u64,
    pending: usize,
    /// The `bytes` of every live action: queued, in flight, awaiting a retry or the
    /// failure handler, or set aside.
    held_bytes: usize,
    counters: Counters,
    /// Reused when set-aside actions go back (no allocation per fall-back).
    scratch: Vec<usize>,
}

/// The processor takes more actions while fewer than this many requests' worth
/// (`INTAKE_REQUESTS × max_actions`) are queued ([`Batcher::has_room`]).
pub const INTAKE_REQUESTS: usize = 4;

/// ... and fewer than this many requests' worth are set aside by coalescing. Set-aside
/// writes are sent only if their successor is refused, so they bound a flush in that
/// case only; the larger bound keeps a hot document's rate from being capped by the
/// round trip (at most `SET_ASIDE_REQUESTS × max_actions` writes per round trip).
pub const SET_ASIDE_REQUESTS: usize = 64;

impl Group {
    fn new(key: Option<DocKey>) -> Group {
        Group {
            key,
            items: Slots::Empty,
            outstanding: 0,
            in_ready: false,
        }
    }
}

/// Puts `value` in a free slot of `slab`, or a new one; returns the slot.
fn slab_insert<V>(slab: &mut Vec<Option<V>>, free: &mut Vec<usize>, value: V) -> usize {
    match free.pop() {
        Some(s) => {
            slab[s] = Some(value);
            s
        }
        None => {
            slab.push(Some(value));
            slab.len() - 1
        }
    }
}

impl<T> Batcher<T> {
    /// An empty batcher; `now_ms` starts the interval clock.
    pub fn new(limits: Limits, now_ms: u64) -> Batcher<T> {
        Batcher {
            limits,
            entries: Vec::new(),
            free: Vec::new(),
            groups: Vec::new(),
            free_groups: Vec::new(),
            docs: HashMap::new(),
            ready: VecDeque::new(),
            queued_actions: 0,
            queued_bytes: 0,
            set_aside_actions: 0,
            in_flight: HashMap::new(),
            split: VecDeque::new(),
            retries: Vec::new(),
            resolved: Vec::new(),
            next_id: 0,
            last_send_ms: now_ms,
            pending: 0,
            held_bytes: 0,
            counters: Counters::default(),
            scratch: Vec::new(),
        }
    }

    /// Actions added and not yet resolved.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// The sizes (as given to [`Batcher::add`]) of every action not yet resolved:
    /// queued, in flight, awaiting a retry or the failure handler, or set aside by a
    /// newer action until it is written. This is what the
    /// processor bounds with `buffer_max_bytes`; an action leaves it exactly when it is
    /// resolved (and then leaves `pending` too).
    pub fn bytes(&self) -> usize {
        self.held_bytes
    }

    /// Actions waiting to be sent (not in flight, not awaiting a retry or a handler).
    pub fn queued(&self) -> usize {
        self.queued_actions
    }

    /// Actions set aside by a newer action on their document until it is written (not
    /// queued, but sent in its place if it is refused).
    pub fn set_aside(&self) -> usize {
        self.set_aside_actions
    }

    /// Whether the processor should take more actions: fewer than
    /// [`INTAKE_REQUESTS`] × `max_actions` are queued and fewer than
    /// [`SET_ASIDE_REQUESTS`] × `max_actions` are set aside (sent only if their
    /// successor is refused, so they bound a flush in that case). While it is false, a
    /// request is due at once.
    pub fn has_room(&self) -> bool {
        let max = self.limits.max_actions.max(1);
        self.queued_actions < INTAKE_REQUESTS * max
            && self.set_aside_actions < SET_ASIDE_REQUESTS * max
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
            .map(|b| {
                b.iter()
                    .filter_map(|&s| self.entry(s).payload.as_ref())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Calls `f` on each action of request `id` while it is in flight, and on every
    /// action they set aside (the processor gives an action that will stay a while its
    /// own copy of its bytes).
    pub fn for_each_in_flight_mut(&mut self, id: RequestId, mut f: impl FnMut(&mut T)) {
        let Some(batch) = self.in_flight.get(&id) else {
            return;
        };
        let mut stack = std::mem::take(&mut self.scratch);
        stack.extend(batch.iter().rev());
        while let Some(s) = stack.pop() {
            let e = self.entries[s].as_mut().expect("a live entry");
            if let Some(p) = e.payload.as_mut() {
                f(p);
            }
            // A list's first; its `next` (only set aside ones have one) the rest.
            stack.extend(e.next);
            stack.extend(e.replaced.map(|c| c.head));
        }
        self.scratch = stack;
    }

    /// Takes what was resolved since the last call, in order.
    pub fn drain_resolved(&mut self) -> Vec<Resolution<T>> {
        std::mem::take(&mut self.resolved)
    }

    /// Moves what was resolved since the last call to the end of `out`, in order;
    /// `out` keeps its allocation from call to call.
    pub fn drain_resolved_into(&mut self, out: &mut Vec<Resolution<T>>) {
        out.append(&mut self.resolved);
    }

    fn entry(&self, slot: usize) -> &Entry<T> {
        self.entries[slot].as_ref().expect("a live entry")
    }

    fn entry_mut(&mut self, slot: usize) -> &mut Entry<T> {
        self.entries[slot].as_mut().expect("a live entry")
    }

    fn group(&self, g: usize) -> &Group {
        self.groups[g].as_ref().expect("a live group")
    }

    fn group_mut(&mut self, g: usize) -> &mut Group {
        self.groups[g].as_mut().expect("a live group")
    }

    fn insert(&mut self, e: Entry<T>) -> usize {
        self.pending += 1;
        self.held_bytes += e.bytes;
        slab_insert(&mut self.entries, &mut self.free, e)
    }

    /// Takes an entry out of its group and out of `pending`, leaving the group as it
    /// is (the caller calls `make_ready`); returns the entry.
    fn detach(&mut self, slot: usize) -> Entry<T> {
        let e = self.entries[slot].take().expect("a live entry");
        self.free.push(slot);
        self.pending -= 1;
        self.held_bytes -= e.bytes;
        let queued = e.state == State::Queued;
        let g = self.group_mut(e.group);
        g.items.remove_slot(slot);
        if !queued {
            g.outstanding -= 1;
        }
        if queued {
            self.queued_actions -= 1;
            self.queued_bytes -= e.bytes;
        }
        e
    }

    /// Removes an entry from its group and from `pending`; returns its payload. What it
    /// set aside must have been dealt with ([`Batcher::remove_written`],
    /// [`Batcher::remove_unwritten`]): they would be pending for ever.
    fn remove(&mut self, slot: usize) -> T {
        let e = self.detach(slot);
        assert!(e.replaced.is_none(), "set-aside actions left behind");
        self.make_ready(e.group);
        e.payload.expect("a payload not held by the handler")
    }

    /// Removes an entry that was written (or is moot: a later written action supersedes
    /// it), resolved `as_`; what it set aside is moot too.
    fn remove_written(&mut self, slot: usize, as_: fn(T) -> Resolution<T>) {
        let replaced = self.entry_mut(slot).replaced.take();
        let p = self.remove(slot);
        self.resolved.push(as_(p));
        self.resolve_replaced(replaced);
    }

    /// Removes an entry that was not written (it failed); what it set aside goes back
    /// in its place, or is moot if `later` (the effect of a later action on the document
    /// written in the same request) is given. Returns its payload.
    fn remove_unwritten(&mut self, slot: usize, later: Option<&Effect>) -> T {
        self.fall_back(slot, later);
        self.remove(slot)
    }

    /// Sets aside `slot` (queued or awaiting a retry): it leaves its document's list and
    /// the counts of what is queued or outstanding, and stays pending with its bytes
    /// held. The caller links it into the `replaced` list of the action that supersedes
    /// it.
    fn set_aside_one(&mut self, slot: usize) {
        let e = self.entry_mut(slot);
        let (g, bytes, was_queued) = (e.group, e.bytes, e.state == State::Queued);
        debug_assert!(was_queued || e.state == State::Retrying, "{:?}", e.state);
        e.state = State::Replaced;
        self.set_aside_actions += 1;
        let grp = self.group_mut(g);
        grp.items.remove_slot(slot);
        if was_queued {
            self.queued_actions -= 1;
            self.queued_bytes -= bytes;
        } else {
            grp.outstanding -= 1;
        }
    }

    /// Puts set-aside `slot` (and what it had set aside, just before it, unless it was
    /// sent: see [`Chain`]) in front of `list`, a list of actions newer than it;
    /// returns the list.
    fn prepend(&mut self, slot: usize, list: Option<Chain>) -> Chain {
        let own = if self.entry(slot).possibly_applied {
            None
        } else {
            self.entry_mut(slot).replaced.take()
        };
        self.entry_mut(slot).next = list.map(|c| c.head);
        let tail = list.map_or(slot, |c| c.tail);
        let head = match own {
            Some(c) => {
                self.entry_mut(c.tail).next = Some(slot);
                c.head
            }
            None => slot,
        };
        Chain { head, tail }
    }

    /// Takes set-aside `slot` out of the slab and out of `pending`; returns it.
    fn take_set_aside(&mut self, slot: usize) -> Entry<T> {
        let e = self.entries[slot].take().expect("a set-aside entry");
        debug_assert!(e.state == State::Replaced);
        debug_assert!(e.replaced.is_none() || e.possibly_applied);
        self.free.push(slot);
        self.pending -= 1;
        self.held_bytes -= e.bytes;
        self.set_aside_actions -= 1;
        e
    }

    /// Resolves the set-aside actions of `list` as moot: a write that supersedes them
    /// all was made.
    fn resolve_replaced(&mut self, list: Option<Chain>) {
        let mut stack = std::mem::take(&mut self.scratch);
        let mut next = list.map(|c| c.head);
        while let Some(s) = next.or_else(|| stack.pop()) {
            let e = self.take_set_aside(s);
            next = e.next;
            stack.extend(e.replaced.map(|c| c.head));
            let p = e.payload.expect("a set-aside payload");
            self.resolved.push(if e.retried {
                self.counters.superseded += 1;
                Resolution::Superseded(p)
            } else {
                self.counters.coalesced += 1;
                Resolution::Coalesced(p)
            });
        }
        self.scratch = stack;
    }

    /// Frees the set-aside actions of `list` without resolving them (the job is
    /// failing); returns how many.
    fn drop_replaced(&mut self, list: Option<Chain>) -> usize {
        let mut stack = std::mem::take(&mut self.scratch);
        let (mut next, mut n) = (list.map(|c| c.head), 0);
        while let Some(s) = next.or_else(|| stack.pop()) {
            let e = self.take_set_aside(s);
            next = e.next;
            stack.extend(e.replaced.map(|c| c.head));
            n += 1;
        }
        self.scratch = stack;
        n
    }

    /// Whether `later` supersedes every action of `list`.
    fn supersedes_list(&self, later: &Effect, list: Chain) -> bool {
        let mut next = Some(list.head);
        while let Some(r) = next {
            if !later.supersedes(&self.entry(r).effect) {
                return false;
            }
            next = self.entry(r).next;
        }
        true
    }

    /// `slot` will not be written: what it set aside goes back, queued, in its place
    /// (just before it), all of it at once and oldest first, so that one request can
    /// carry it (each supersedes the one before) and the same-request rules settle each
    /// action: a written one makes the earlier ones moot. What goes back is
    /// `restored`: never set aside again by a newer write. If `later`, the effect of a later action on
    /// the document written in the same request, is given, it supersedes `slot` and so
    /// what `slot` set aside ([`Effect::supersedes`] is transitive): that is moot
    /// instead.
    fn fall_back(&mut self, slot: usize, later: Option<&Effect>) {
        let Some(list) = self.entry_mut(slot).replaced.take() else {
            return;
        };
        if let Some(later) = later {
            debug_assert!(self.supersedes_list(later, list));
            self.resolve_replaced(Some(list));
            return;
        }
        let g = self.entry(slot).group;
        let mut back = std::mem::take(&mut self.scratch);
        let mut next = Some(list.head);
        while let Some(r) = next {
            let e = self.entry_mut(r);
            // One that was sent keeps what it set aside (see `Chain`).
            debug_assert!(e.replaced.is_none() || e.possibly_applied);
            next = e.next.take();
            e.state = State::Queued;
            e.restored = true;
            let bytes = e.bytes;
            self.queued_actions += 1;
            self.queued_bytes += bytes;
            self.set_aside_actions -= 1;
            back.push(r);
        }
        let at = self.group(g).items.position(slot).expect("a listed entry");
        self.group_mut(g).items.insert_all(at, &back);
        back.clear();
        self.scratch = back;
    }

    /// Sets an entry's state, keeping the counts of its group.
    fn set_state(&mut self, slot: usize, state: State) {
        let e = self.entry_mut(slot);
        let (g, bytes) = (e.group, e.bytes);
        let was_q = e.state == State::Queued;
        let is_q = state == State::Queued;
        e.state = state;
        if was_q && !is_q {
            self.group_mut(g).outstanding += 1;
            self.queued_actions -= 1;
            self.queued_bytes -= bytes;
        } else if !was_q && is_q {
            self.group_mut(g).outstanding -= 1;
            self.queued_actions += 1;
            self.queued_bytes += bytes;
        }
        self.make_ready(g);
    }

    /// Puts a document with queued actions and nothing outstanding in the ready queue,
    /// and frees the group of a document with no live action left.
    fn make_ready(&mut self, g: usize) {
        let grp = self.group_mut(g);
        if grp.outstanding == 0 && !grp.items.is_empty() && !grp.in_ready {
            grp.in_ready = true;
            self.ready.push_back(g);
        } else if grp.items.is_empty() && !grp.in_ready {
            if let Some(k) = self.groups[g].take().and_then(|grp| grp.key) {
                self.docs.remove(&k);
            }
            self.free_groups.push(g);
        }
    }

    /// The group of document `doc`, made if it has none (None: an action without an
    /// id, which gets a group of its own).
    fn group_of(&mut self, doc: Option<DocKey>) -> usize {
        let Some(doc) = doc else {
            return slab_insert(&mut self.groups, &mut self.free_groups, Group::new(None));
        };
        // The group keeps its key for as long as the document has a live action, which
        // for a hot document or a retried action is far longer than the batch buffer the
        // key was sliced from should live: it keeps a copy of its own.
        let doc = doc.owned();
        let key = doc.clone();
        match self.docs.entry(doc) {
            MapEntry::Occupied(o) => *o.get(),
            MapEntry::Vacant(v) => {
                let g = slab_insert(
                    &mut self.groups,
                    &mut self.free_groups,
                    Group::new(Some(key)),
                );
                v.insert(g);
                g
            }
        }
    }

    /// Adds an action on document `doc` (None: an action without an id). With
    /// coalescing, the queued actions it makes irrelevant are set aside: resolved as
    /// [`Resolution::Coalesced`] once it is written, put back in its place if it is not.
    pub fn add(&mut self, doc: Option<String>, effect: Effect, bytes: usize, payload: T) {
        self.add_doc(doc.map(DocKey::from), effect, bytes, payload);
    }

    /// [`Batcher::add`] with the document's key as the caller encodes it.
    pub fn add_doc(&mut self, doc: Option<DocKey>, effect: Effect, bytes: usize, payload: T) {
        let g = self.group_of(doc);
        let mut replaced = None;
        if self.limits.coalesce {
            // Only a queued tail is coalesced: an action that left the queue (in a
            // request, awaiting a retry or a handler) keeps its place.
            while let Some(&s) = self.group(g).items.as_slice().last() {
                let older = self.entry(s);
                if older.state != State::Queued
                    || older.restored
                    || !effect.supersedes(&older.effect)
                {
                    break;
                }
                // The group stays: the new action joins it below. Newest first, each
                // in front: the list is oldest first.
                self.set_aside_one(s);
                replaced = Some(self.prepend(s, replaced));
            }
        }
        self.append(g, effect, bytes, 0, payload, replaced);
    }

    fn append(
        &mut self,
        g: usize,
        effect: Effect,
        bytes: usize,
        attempts: u32,
        payload: T,
        replaced: Option<Chain>,
    ) {
        let slot = self.insert(Entry {
            group: g,
            effect,
            bytes,
            attempts,
            state: State::Queued,
            retried: false,
            possibly_applied: false,
            restored: false,
            payload: Some(payload),
            replaced,
            next: None,
        });
        self.group_mut(g).items.push_back(slot);
        self.queued_actions += 1;
        self.queued_bytes += bytes;
        self.make_ready(g);
    }

    /// The failure handler settled a refused action (dead-lettered, dropped, or the job
    /// fails): it leaves its document's order, and what it set aside takes its place.
    ///
    /// That holds too for an action that may already be applied (sent, its response
    /// lost, then refused on the retry): whether the lost attempt reached the server is
    /// unknown. If it did not, what it set aside was never written, and resolving that
    /// as moot would lose it. If it did, the document holds a write that is now
    /// dead-lettered, and writing what came before it puts the document where a
    /// dead-lettered write leaves it: as if that write was never made. Either way the
    /// document ends as the settled order says; only in the second case does it pass
    /// through the dead-lettered write's state first, as it would without coalescing.
    pub fn settle_refused(&mut self, refusal: Refusal) {
        let slot = refusal.0;
        if self.entry(slot).replaced.is_some() {
            let later = match &self.entry(slot).state {
                State::Refused { overtaken } => overtaken.clone(),
                _ => None,
            };
            self.fall_back(slot, later.as_ref());
        }
        let e = self.entries[slot].take().expect("a held refusal");
        self.free.push(slot);
        self.pending -= 1;
        self.held_bytes -= e.bytes;
        let g = self.group_mut(e.group);
        g.items.remove_slot(slot);
        g.outstanding -= 1;
        self.make_ready(e.group);
    }

    /// The failure handler's replacements for a refused action, each `(document,
    /// effect, size, payload)`. Those on the refused action's document take exactly its
    /// place (before anything later on that document; what the refused action had set
    /// aside stays set aside under the first of them if that one supersedes it all,
    /// else it goes back in its place, before them); those on other documents are
    /// added behind what those documents hold. They count the refused action's
    /// attempts plus one, and are never coalesced into what follows them.
    pub fn requeue(
        &mut self,
        refusal: Refusal,
        replacements: Vec<(Option<String>, Effect, usize, T)>,
    ) {
        let replacements = replacements
            .into_iter()
            .map(|(doc, effect, bytes, payload)| (doc.map(DocKey::from), effect, bytes, payload))
            .collect();
        self.requeue_docs(refusal, replacements);
    }

    /// [`Batcher::requeue`] with the documents' keys as the caller encodes them.
    pub fn requeue_docs(
        &mut self,
        refusal: Refusal,
        replacements: Vec<(Option<DocKey>, Effect, usize, T)>,
    ) {
        let slot = refusal.0;
        let (g, attempts, overtaken, possibly_applied) = {
            let e = self.entry(slot);
            let State::Refused { overtaken } = &e.state else {
                panic!("requeue of an action that is not refused");
            };
            (
                e.group,
                e.attempts + 1,
                overtaken.clone(),
                e.possibly_applied,
            )
        };
        // What the refused action set aside stays set aside under the first replacement
        // on its document if that one supersedes it all ([`Effect::supersedes`] is
        // transitive): it is moot once the replacement is written, and goes back in
        // its place if the replacement is not. Restoring it ahead of the replacement
        // instead would send older writes after the refused action, which may already
        // be applied (sent, its response lost), regressing the document.
        let first_same = replacements
            .iter()
            .position(|(doc, ..)| doc.as_ref().is_some_and(|d| self.docs.get(d) == Some(&g)));
        let mut kept = None;
        if let (None, Some(i), Some(list)) = (&overtaken, first_same, self.entry(slot).replaced) {
            if self.supersedes_list(&replacements[i].1, list) {
                kept = self.entry_mut(slot).replaced.take();
            }
        }
        // Otherwise what the refused action set aside comes first: it was before it.
        self.fall_back(slot, overtaken.as_ref());
        let mut at = self
            .group(g)
            .items
            .position(slot)
            .expect("the refusal's place");
        for (doc, effect, bytes, payload) in replacements {
            let same = doc.as_ref().is_some_and(|d| self.docs.get(d) == Some(&g));
            if !same {
                let other = self.group_of(doc);
                self.append(other, effect, bytes, attempts, payload, None);
                continue;
            }
            if let Some(later) = &overtaken {
                // A later action on the document is already written.
                if later.supersedes(&effect) {
                    self.counters.superseded += 1;
                    self.resolved.push(Resolution::Superseded(payload));
                } else {
                    self.resolved.push(Resolution::Fatal(
                        payload,
                        "a replacement for a refused action cannot be applied in order: a later action on the same document was already written".into(),
                    ));
                }
                continue;
            }
            let new = self.insert(Entry {
                group: g,
                effect,
                bytes,
                attempts,
                state: State::Queued,
                retried: false,
                // In the refused action's place, it holds the document where that one
                // may have left it.
                possibly_applied,
                restored: false,
                payload: Some(payload),
                replaced: kept.take(),
                next: None,
            });
            self.group_mut(g).items.insert(at, new);
            at += 1;
            self.queued_actions += 1;
            self.queued_bytes += bytes;
        }
        self.settle_refused(Refusal(slot));
    }

    /// Retries due at `now_ms` become queued again, in place. With coalescing, one that
    /// the queued action behind it makes irrelevant is set aside by that action instead
    /// (resolved as superseded once it is written, back in its place if not).
    fn promote_due(&mut self, now_ms: u64) {
        if self.retries.iter().all(|(due, _)| *due > now_ms) {
            return;
        }
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retries)
            .into_iter()
            .partition(|(t, _)| *t <= now_ms);
        self.retries = later;
        for slot in due.into_iter().flat_map(|(_, b)| b) {
            let items = self.group(self.entry(slot).group).items.as_slice();
            let behind = items
                .iter()
                .position(|&x| x == slot)
                .and_then(|at| items.get(at + 1).copied());
            let superseded = self.limits.coalesce
                && behind.is_some_and(|b| {
                    let b = self.entry(b);
                    b.state == State::Queued && b.effect.supersedes(&self.entry(slot).effect)
                });
            if let (true, Some(b)) = (superseded, behind) {
                // Older than everything `b` set aside: in front of its list.
                self.set_aside_one(slot);
                let list = self.entry_mut(b).replaced.take();
                let list = self.prepend(slot, list);
                self.entry_mut(b).replaced = Some(list);
                self.make_ready(self.entry(b).group);
            } else {
                self.set_state(slot, State::Queued);
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
                    || !self.has_room()
                    || self.queued_actions >= self.limits.max_actions
                    || self.queued_bytes >= self.limits.max_bytes
                    || now_ms.saturating_sub(self.last_send_ms) >= self.limits.flush_interval_ms;
                if !due || self.ready.is_empty() {
                    return None;
                }
                self.build()
            }
        };
        if batch.is_empty() {
            return None;
        }
        self.last_send_ms = now_ms;
        self.counters.requests += 1;
        self.next_id += 1;
        let id = self.next_id;
        self.in_flight.insert(id, batch);
        Some((id, self.in_flight_payloads(id)))
    }

    fn build(&mut self) -> Vec<usize> {
        let (max_actions, max_bytes) = (self.limits.max_actions.max(1), self.limits.max_bytes);
        let mut batch = Vec::with_capacity(max_actions.min(self.queued_actions));
        let mut bytes = 0;
        while let Some(g) = self.ready.pop_front() {
            let items = self.group(g).items.as_slice();
            // The first action, and those after it that each supersede the one before.
            let mut take = 1;
            let mut take_bytes = self.entry(items[0]).bytes;
            while take < items.len() {
                let (prev, next) = (self.entry(items[take - 1]), self.entry(items[take]));
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
                self.ready.push_front(g);
                break;
            }
            self.group_mut(g).in_ready = false;
            for i in 0..take {
                let s = self.group(g).items.as_slice()[i];
                self.set_state(s, State::InFlight);
                batch.push(s);
            }
            bytes += take_bytes;
        }
        batch
    }

    /// Applies the response to request `id`. `jitter` in `[0, 1)` spreads the backoff
    /// of what is retried. Returns the backoff it scheduled, if it retries anything.
    pub fn on_response(
        &mut self,
        id: RequestId,
        response: Response,
        now_ms: u64,
        jitter: f64,
    ) -> Option<Duration> {
        let Some(batch) = self.in_flight.remove(&id) else {
            debug_assert!(false, "a response to an unknown request");
            return None;
        };
        match response {
            Response::Written(n) if n == batch.len() => {
                self.resolved.reserve(n);
                for slot in batch {
                    self.remove_written(slot, Resolution::Written);
                }
                None
            }
            Response::Written(n) => {
                let why = format!("{n} item results for {} actions", batch.len());
                self.retry(batch, &why, now_ms, jitter)
            }
            Response::Items(items) if items.len() == batch.len() => {
                self.on_items(batch, items, now_ms, jitter)
            }
            Response::Items(items) => {
                let why = format!("{} item results for {} actions", items.len(), batch.len());
                self.retry(batch, &why, now_ms, jitter)
            }
            Response::Failed(RequestOutcome::Retry, why) => self.retry(batch, &why, now_ms, jitter),
            Response::Failed(RequestOutcome::Split, why) => {
                self.split(batch, why);
                None
            }
            Response::Failed(RequestOutcome::Fatal | RequestOutcome::Malformed, why) => {
                for slot in batch {
                    let p = self.remove_unwritten(slot, None);
                    self.resolved.push(Resolution::Fatal(p, why.clone()));
                }
                None
            }
        }
    }

    fn on_items(
        &mut self,
        batch: Vec<usize>,
        items: Vec<ItemResult>,
        now_ms: u64,
        jitter: f64,
    ) -> Option<Duration> {
        // A document's actions in a request are contiguous and each supersedes the one
        // before: what a later written action of its document supersedes is moot.
        let mut written_later: Vec<Option<Effect>> = vec![None; batch.len()];
        for i in (0..batch.len().saturating_sub(1)).rev() {
            if self.entry(batch[i]).group != self.entry(batch[i + 1]).group {
                continue;
            }
            written_later[i] = match items[i + 1].outcome {
                Outcome::Done | Outcome::AlreadyWritten => {
                    Some(self.entry(batch[i + 1]).effect.clone())
                }
                _ => written_later[i + 1].clone(),
            };
        }
        let mut retry = Vec::new();
        let mut why = String::new();
        for ((slot, item), later) in batch.into_iter().zip(items).zip(written_later) {
            match item.outcome {
                Outcome::Done | Outcome::AlreadyWritten => {
                    self.remove_written(slot, Resolution::Written);
                }
                Outcome::Retry if later.is_some() => {
                    self.counters.superseded += 1;
                    self.remove_written(slot, Resolution::Superseded);
                }
                Outcome::Retry => {
                    why = format!("{} {}", item.failure.status, item.failure.error_type);
                    retry.push(slot);
                }
                Outcome::Rejected => self.refuse(slot, item.failure, later),
                Outcome::Fatal => {
                    // What it set aside is moot if a later write overtook it, as for
                    // a refusal: it must not go back behind that write.
                    let p = self.remove_unwritten(slot, later.as_ref());
                    let why = format!(
                        "{} {}: {} (authorization)",
                        item.failure.status, item.failure.error_type, item.failure.reason
                    );
                    self.resolved.push(Resolution::Fatal(p, why));
                }
            }
        }
        if retry.is_empty() {
            return None;
        }
        self.retry(retry, &why, now_ms, jitter)
    }

    /// Hands a refused action to the failure handler; it keeps its place meanwhile.
    fn refuse(&mut self, slot: usize, failure: ItemFailure, overtaken: Option<Effect>) {
        self.set_state(slot, State::Refused { overtaken });
        let e = self.entry_mut(slot);
        let (payload, attempts) = (e.payload.take().expect("a payload"), e.attempts);
        self.resolved.push(Resolution::Refused {
            refusal: Refusal(slot),
            payload,
            failure,
            attempts,
        });
    }

    /// Schedules `batch` (in flight) for another attempt, or resolves what has no
    /// attempts left. Returns the backoff, if anything is retried.
    fn retry(
        &mut self,
        batch: Vec<usize>,
        why: &str,
        now_ms: u64,
        jitter: f64,
    ) -> Option<Duration> {
        let mut again = Vec::with_capacity(batch.len());
        let mut attempts = 0;
        let max = self.limits.retry_max_attempts;
        for slot in batch {
            let e = self.entry_mut(slot);
            e.attempts += 1;
            e.retried = true;
            e.possibly_applied = true;
            if e.attempts > max {
                let p = self.remove_unwritten(slot, None);
                self.resolved.push(Resolution::Exhausted(
                    p,
                    format!("still failing after {max} retries: {why}"),
                ));
            } else {
                attempts = attempts.max(e.attempts);
                self.set_state(slot, State::Retrying);
                again.push(slot);
            }
        }
        if again.is_empty() {
            return None;
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
        Some(delay)
    }

    /// A request refused as too large: its halves are sent separately. A document cut
    /// by the split keeps its order: its actions in the second half become queued
    /// again, behind the first half.
    fn split(&mut self, mut batch: Vec<usize>, why: String) {
        if batch.len() == 1 {
            self.refuse(
                batch[0],
                ItemFailure {
                    status: 413,
                    error_type: "content_too_long".into(),
                    reason: why,
                },
                None,
            );
            return;
        }
        let second = batch.split_off(batch.len() / 2);
        let cut = self.entry(*batch.last().expect("a first half")).group;
        let (back, second): (Vec<usize>, Vec<usize>) = second
            .into_iter()
            .partition(|&s| self.entry(s).group == cut);
        for slot in back {
            self.set_state(slot, State::Queued);
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

    /// Drops everything not in flight (the job is failing: nothing more is sent), refused
    /// actions still held by the handler and what the dropped actions set aside
    /// included. Returns how many actions were dropped; requests in flight still get
    /// their responses (and what their actions set aside goes back, to be dropped by
    /// the next call, if they are not written).
    pub fn clear_unsent(&mut self) -> usize {
        let held: Vec<usize> = self
            .retries
            .drain(..)
            .flat_map(|(_, b)| b)
            .chain(self.split.drain(..).flatten())
            .collect();
        for &s in &held {
            self.set_state(s, State::Queued);
        }
        let doomed: Vec<usize> = self
            .groups
            .iter()
            .flatten()
            .flat_map(|g| g.items.as_slice().iter().copied())
            .filter(|&s| self.entry(s).state != State::InFlight)
            .collect();
        let mut n = doomed.len();
        for s in doomed {
            // What it set aside goes with it.
            let replaced = self.entry_mut(s).replaced.take();
            n += self.drop_replaced(replaced);
            if matches!(self.entry(s).state, State::Refused { .. }) {
                self.settle_refused(Refusal(s));
            } else {
                self.remove(s);
            }
        }
        self.ready.clear();
        // Documents that were ready and are now empty are freed; the others (in flight)
        // become ready again when their requests are answered.
        for g in 0..self.groups.len() {
            if let Some(grp) = self.groups[g].as_mut() {
                grp.in_ready = false;
                self.make_ready(g);
            }
        }
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

    pub(super) fn limits(max_actions: usize, max_in_flight: usize, coalesce: bool) -> Limits {
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

    pub(super) fn ok() -> ItemResult {
        ItemResult {
            outcome: Outcome::Done,
            failure: ItemFailure {
                status: 200,
                error_type: String::new(),
                reason: String::new(),
            },
        }
    }

    pub(super) fn too_many() -> ItemResult {
        ItemResult {
            outcome: Outcome::Retry,
            failure: ItemFailure {
                status: 429,
                error_type: "es_rejected_execution_exception".into(),
                reason: "queue full".into(),
            },
        }
    }

    pub(super) fn refused() -> ItemResult {
        ItemResult {
            outcome: Outcome::Rejected,
            failure: ItemFailure {
                status: 400,
                error_type: "mapper_parsing_exception".into(),
                reason: "failed to parse".into(),
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
    fn a_request_written_whole_resolves_every_action_and_a_miscount_retries_it() {
        let mut b = Batcher::new(limits(1000, 2, false), 0);
        for v in 0..3 {
            b.add(Some(format!("d{v}")), Effect::Opaque, 10, v);
        }
        let (id, _) = b.next_request(0, true).unwrap();
        b.on_response(id, Response::Written(2), 1, 0.5);
        assert_eq!(
            (b.pending(), b.counters().retried),
            (3, 3),
            "2 results for 3"
        );
        assert!(b.drain_resolved().is_empty());
        let (id, payloads) = b.next_request(1000, true).unwrap();
        assert_eq!(payloads, vec![&0, &1, &2]);
        b.on_response(id, Response::Written(3), 1001, 0.5);
        assert_eq!((b.pending(), b.bytes()), (0, 0));
        let written: Vec<_> = b
            .drain_resolved()
            .into_iter()
            .map(|r| match r {
                Resolution::Written(v) => v,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(written, vec![0, 1, 2]);
    }

    /// Only the latest write of a hot document is sent; the ones it replaced stay
    /// pending (and held) until it is written, and are resolved as coalesced then.
    #[test]
    fn hot_document_writes_coalesce_to_the_latest() {
        let mut b = Batcher::new(limits(1000, 1, true), 0);
        for v in 0..100 {
            b.add(Some("d".into()), Effect::of(&index(v)), 10, v);
        }
        assert_eq!((b.queued(), b.pending(), b.bytes()), (1, 100, 1000));
        assert!(
            b.drain_resolved().is_empty(),
            "nothing resolved before a write"
        );
        let (id, payloads) = b.next_request(0, true).unwrap();
        assert_eq!(payloads, vec![&99]);
        assert_eq!(
            b.pending(),
            100,
            "in flight: the others may still be needed"
        );
        b.on_response(id, Response::Items(vec![ok()]), 1, 0.5);
        assert_eq!((b.pending(), b.bytes()), (0, 0));
        assert_eq!(b.counters().coalesced, 99);
        let (mut written, mut coalesced) = (vec![], vec![]);
        for r in b.drain_resolved() {
            match r {
                Resolution::Written(v) => written.push(v),
                Resolution::Coalesced(v) => coalesced.push(v),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(written, vec![99]);
        coalesced.sort();
        assert_eq!(coalesced, (0..99).collect::<Vec<_>>());
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
        /// A write the server always refuses (a mapping error): an index, or an upsert
        /// of these fields, whose values do not fit the mapping. The failure handler
        /// dead-letters it.
        Poison(Option<Vec<&'static str>>),
    }

    /// The value the model's mapping refuses.
    const POISON: &str = "not a number";

    fn is_poison(a: &BulkAction) -> bool {
        let Some(body) = a.body.as_ref() else {
            return false;
        };
        let v: Value = serde_json::from_slice(body).unwrap();
        let fields = if a.op == OpType::Update {
            v["doc"].clone()
        } else {
            v
        };
        fields
            .as_object()
            .unwrap()
            .values()
            .any(|x| x == &json!(POISON))
    }

    #[derive(Debug, Clone)]
    enum How {
        AllOk,
        /// Everything applied, answered as `errors: false` is: without item results,
        /// unless an item was a conflict (a 409 is an error, so the items are read).
        NoErrors,
        /// Item i is rejected with 429 where bit i % 8 is set.
        Reject429(u8),
        Whole503,
        /// Applied by the server, but the response is lost (a connection error).
        DroppedAfterApply,
        TooLarge,
        /// Item i is refused (400) where bit i % 8 is set; the failure handler requeues
        /// the same action, in its place (it dead-letters a poison one, as always).
        Refuse(u8),
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
        let poison_fields = prop::collection::vec(prop_oneof![Just("a"), Just("b")], 1..3);
        if versioned {
            prop_oneof![
                4 => (0i64..9).prop_map(Kind::Index),
                1 => Just(Kind::Delete),
                2 => Just(Kind::Poison(None)),
            ]
            .boxed()
        } else {
            prop_oneof![
                3 => (0i64..9).prop_map(Kind::Index),
                3 => fields.prop_map(Kind::Upsert),
                1 => Just(Kind::Delete),
                1 => Just(Kind::Poison(None)),
                1 => poison_fields.prop_map(|f| Kind::Poison(Some(f))),
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
                2 => Just(How::NoErrors),
                2 => any::<u8>().prop_map(How::Reject429),
                1 => Just(How::Whole503),
                1 => Just(How::DroppedAfterApply),
                1 => Just(How::TooLarge),
                1 => any::<u8>().prop_map(How::Refuse),
            ]).prop_map(|(i, h)| Step::Respond(i, h)),
            1 => (0u64..200).prop_map(Step::Tick),
        ]
    }

    type Store = HashMap<String, (Value, Option<i64>)>;

    /// The size the model gives action `seq`: sizes differ, so that [`Batcher::bytes`]
    /// is checked against a sum, not a count.
    fn size(seq: usize) -> usize {
        10 + (seq * 7) % 23
    }

    /// The server: applies one action, answering as Elasticsearch would (a document
    /// that does not fit the mapping is refused before its version is compared).
    fn apply(store: &mut Store, a: &BulkAction) -> ItemResult {
        if is_poison(a) {
            return refused();
        }
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

    /// What the server applied: the actions it ever applied, and the latest place (in
    /// its document's history) of what it applied on each document.
    #[derive(Default)]
    struct Applied {
        /// By the action each one is a copy of (itself, or what the handler requeued it
        /// for): a requeued copy of an action that was applied, its response lost, is a
        /// replay of that action.
        ever: std::collections::HashSet<usize>,
        /// The original of each action (see `ever`).
        roots: Vec<usize>,
        /// The places applied on each document.
        placed: HashMap<String, Vec<usize>>,
        /// Originals applied by a request whose response was lost and not applied
        /// again since: the batcher sends them again, so a document passing behind one
        /// of them for a while is repaired when it is (the final store check holds).
        lost: std::collections::HashSet<usize>,
    }

    /// [`apply`], checking that each document's applied order only moves forward: an
    /// action applied for the first time comes after everything applied on its
    /// document (applying one again, a request retried after its response was lost,
    /// is the one exception, which the README states).
    fn apply_in_order(
        store: &mut Store,
        applied: &mut Applied,
        order: &[usize],
        actions: &[BulkAction],
        s: usize,
        response_lost: bool,
    ) -> ItemResult {
        let r = apply(store, &actions[s]);
        if r.outcome == Outcome::Done {
            let doc = actions[s].id.clone().unwrap();
            let at = order.iter().position(|&x| x == s).expect("a placed action");
            let root = applied.roots[s];
            let placed = applied.placed.entry(doc.clone()).or_default();
            if applied.ever.insert(root) {
                // Everything applied later on the document is sent again.
                let behind = placed
                    .iter()
                    .find(|&&p| p > at && !applied.lost.contains(&applied.roots[order[p]]));
                assert!(
                    behind.is_none(),
                    "action {s} (place {at}) applied on {doc} after place {behind:?}"
                );
            }
            placed.push(at);
            if response_lost {
                applied.lost.insert(root);
            } else {
                applied.lost.remove(&root);
            }
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
            Kind::Poison(None) => BulkAction::index(
                "i",
                Some(id),
                json!({ "v": POISON }).to_string().into_bytes(),
            ),
            Kind::Poison(Some(fields)) => {
                let m: serde_json::Map<String, Value> = fields
                    .iter()
                    .map(|f| (f.to_string(), json!(POISON)))
                    .collect();
                BulkAction::upsert("i", id, Value::Object(m).to_string().as_bytes())
            }
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
        // The place of each action in its document's history: a requeued action takes
        // its refused predecessor's.
        let mut order: Vec<usize> = Vec::new();
        let mut applied = Applied::default();
        let drain = |b: &mut Batcher<usize>,
                     resolved: &mut Vec<bool>,
                     actions: &mut Vec<BulkAction>,
                     order: &mut Vec<usize>,
                     roots: &mut Vec<usize>|
         -> Result<(), TestCaseError> {
            loop {
                let batch = b.drain_resolved();
                if batch.is_empty() {
                    return Ok(());
                }
                for r in batch {
                    let seq = match r {
                        Resolution::Written(s) => {
                            prop_assert!(
                                !is_poison(&actions[s]),
                                "action {} is refused by the server, yet resolved as written",
                                s
                            );
                            s
                        }
                        Resolution::Coalesced(s) | Resolution::Superseded(s) => s,
                        Resolution::Refused {
                            refusal, payload, ..
                        } if is_poison(&actions[payload]) => {
                            // Dead-lettered: settled, the document as it was.
                            b.settle_refused(refusal);
                            payload
                        }
                        Resolution::Refused {
                            refusal, payload, ..
                        } => {
                            // The handler requeues the same action in its place.
                            let a = actions[payload].clone();
                            let new = actions.len();
                            actions.push(a.clone());
                            resolved.push(false);
                            roots.push(roots[payload]);
                            let at = order.iter().position(|&x| x == payload).unwrap();
                            order[at] = new;
                            b.requeue(
                                refusal,
                                vec![(a.id.clone(), Effect::of(&a), size(new), new)],
                            );
                            payload
                        }
                        other => return Err(TestCaseError::fail(format!("unexpected {other:?}"))),
                    };
                    prop_assert!(!resolved[seq], "action {} resolved twice", seq);
                    resolved[seq] = true;
                }
            }
        };
        let expected = |actions: &[BulkAction], order: &[usize]| {
            let mut s = Store::new();
            for &i in order {
                apply(&mut s, &actions[i]);
            }
            s
        };
        let respond = |b: &mut Batcher<usize>,
                       store: &mut Store,
                       applied: &mut Applied,
                       order: &[usize],
                       id: RequestId,
                       seqs: &[usize],
                       how: &How,
                       actions: &[BulkAction],
                       now: u64| {
            let mut apply = |store: &mut Store, s: usize, lost: bool| {
                apply_in_order(store, applied, order, actions, s, lost)
            };
            // Item i fails with `failure()` where bit i % 8 of `mask` is set; the others
            // are applied in order.
            let mut masked = |store: &mut Store, mask: u8, failure: fn() -> ItemResult| {
                Response::Items(
                    seqs.iter()
                        .enumerate()
                        .map(|(i, &s)| {
                            if mask & (1 << (i % 8)) != 0 {
                                failure()
                            } else {
                                apply(store, s, false)
                            }
                        })
                        .collect(),
                )
            };
            let response = match how {
                How::AllOk => {
                    Response::Items(seqs.iter().map(|&s| apply(store, s, false)).collect())
                }
                How::NoErrors => {
                    let items: Vec<ItemResult> =
                        seqs.iter().map(|&s| apply(store, s, false)).collect();
                    if items.iter().all(|i| i.outcome == Outcome::Done) {
                        Response::Written(items.len())
                    } else {
                        Response::Items(items)
                    }
                }
                How::Reject429(mask) => masked(store, *mask, too_many),
                How::Whole503 => Response::Failed(RequestOutcome::Retry, "503".into()),
                How::DroppedAfterApply => {
                    for &s in seqs {
                        apply(store, s, true);
                    }
                    Response::Failed(RequestOutcome::Retry, "connection closed".into())
                }
                How::TooLarge => Response::Failed(RequestOutcome::Split, "413".into()),
                How::Refuse(mask) => masked(store, *mask, refused),
            };
            b.on_response(id, response, now, 0.5);
        };
        for st in steps {
            match st {
                Step::Add(doc, k) => {
                    let seq = actions.len();
                    let a = action(doc, &k, versioned.then_some(seq as i64));
                    b.add(a.id.clone(), Effect::of(&a), size(seq), seq);
                    actions.push(a);
                    resolved.push(false);
                    applied.roots.push(seq);
                    order.push(seq);
                }
                Step::Send(force) => {
                    while let Some((id, p)) = b.next_request(now, force) {
                        let seqs = p.into_iter().copied().collect();
                        requests.push((id, seqs));
                    }
                }
                Step::Respond(i, how) if !requests.is_empty() => {
                    let (id, seqs) = requests.remove(i % requests.len());
                    respond(
                        &mut b,
                        &mut store,
                        &mut applied,
                        &order,
                        id,
                        &seqs,
                        &how,
                        &actions,
                        now,
                    );
                }
                Step::Respond(..) => {}
                Step::Tick(ms) => now += ms,
            }
            drain(
                &mut b,
                &mut resolved,
                &mut actions,
                &mut order,
                &mut applied.roots,
            )?;
            let open = resolved.iter().filter(|r| !**r).count();
            prop_assert_eq!(b.pending(), open);
            // What buffer_max_bytes bounds: exactly the sizes of the unresolved actions.
            let held: usize = (0..resolved.len())
                .filter(|&s| !resolved[s])
                .map(size)
                .sum();
            prop_assert_eq!(b.bytes(), held);
            if b.pending() == 0 {
                prop_assert_eq!(
                    &store,
                    &expected(&actions, &order),
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
                respond(
                    &mut b,
                    &mut store,
                    &mut applied,
                    &order,
                    id,
                    &seqs,
                    &How::AllOk,
                    &actions,
                    now,
                );
            }
            drain(
                &mut b,
                &mut resolved,
                &mut actions,
                &mut order,
                &mut applied.roots,
            )?;
        }
        prop_assert_eq!(b.pending(), 0);
        prop_assert_eq!(b.bytes(), 0, "nothing held once everything is resolved");
        prop_assert!(resolved.iter().all(|r| *r));
        prop_assert_eq!(
            &store,
            &expected(&actions, &order),
            "the last write per document wins"
        );
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// For any interleaving of adds, sends and responses (success, per-item 429,
        /// whole-request failure, a response lost after the bulk was applied, 413, and
        /// writes the server always refuses, dead-lettered), the final documents equal
        /// applying every action in order (a refused one changing nothing), and
        /// `pending` is 0 exactly when everything is acknowledged.
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

/// Cases found by review: each kills a mistake the model test did not see.
#[cfg(test)]
mod review_tests {
    use super::tests::{limits, ok, refused, too_many};
    use super::*;
    use crate::connectors::elasticsearch::action::BulkAction;
    use serde_json::json;

    fn index(v: i64) -> Effect {
        Effect::of(&BulkAction::index(
            "i",
            Some("d".into()),
            json!({ "v": v }).to_string().into_bytes(),
        ))
    }
    fn sent(b: &mut Batcher<i64>, now: u64, force: bool) -> Option<(RequestId, Vec<i64>)> {
        b.next_request(now, force)
            .map(|(id, p)| (id, p.into_iter().copied().collect()))
    }
    /// Takes the one refusal among the resolutions.
    fn refusal(b: &mut Batcher<i64>) -> (Refusal, i64, ItemFailure, u32) {
        let mut r = b.drain_resolved();
        let at = r
            .iter()
            .position(|x| matches!(x, Resolution::Refused { .. }))
            .unwrap_or_else(|| panic!("a refusal in {r:?}"));
        match r.remove(at) {
            Resolution::Refused {
                refusal,
                payload,
                failure,
                attempts,
            } => (refusal, payload, failure, attempts),
            _ => unreachable!(),
        }
    }
    /// Answers every request with success until nothing is pending; returns what was
    /// sent, in order, and what was superseded or coalesced.
    fn drain_all(b: &mut Batcher<i64>, mut now: u64) -> (Vec<i64>, Vec<i64>) {
        let (mut out, mut gone) = (vec![], vec![]);
        for _ in 0..100 {
            for r in b.drain_resolved() {
                if let Resolution::Superseded(v) | Resolution::Coalesced(v) = r {
                    gone.push(v)
                }
            }
            if b.pending() == 0 {
                break;
            }
            now += 1000;
            while let Some((id, p)) = sent(b, now, true) {
                out.extend(&p);
                b.on_response(id, Response::Items(vec![ok(); p.len()]), now, 0.5);
            }
        }
        (out, gone)
    }

    #[test]
    fn a_documents_key_keeps_no_slice_of_the_buffer_it_came_from() {
        let mut b = Batcher::<i64>::new(limits(10, 1, false), 0);
        let buffer = Bytes::from(vec![b'k'; 4096]);
        // Two actions on one document: its group lives while either is live.
        b.add_doc(Some(DocKey::new(buffer.slice(0..8))), index(1), 64, 1);
        b.add_doc(Some(DocKey::new(buffer.slice(0..8))), index(2), 64, 2);
        assert_eq!(b.pending(), 2);
        assert!(
            buffer.is_unique(),
            "the batcher holds a slice of the batch buffer"
        );
    }

    #[test]
    fn max_bytes_bounds_a_request_and_an_oversized_action_goes_alone() {
        let mut l = limits(1000, 4, false);
        l.max_bytes = 25;
        let mut b = Batcher::new(l, 0);
        for (doc, bytes, v) in [("a", 10, 1), ("b", 10, 2), ("c", 10, 3), ("d", 100, 4)] {
            b.add(Some(doc.into()), Effect::Opaque, bytes, v);
        }
        let mut got = vec![];
        while let Some((_, p)) = sent(&mut b, 0, true) {
            got.push(p);
        }
        assert_eq!(got, vec![vec![1, 2], vec![3], vec![4]]);
    }

    #[test]
    fn a_single_action_refused_as_too_large_goes_to_the_handler_and_then_releases_its_document() {
        let mut b = Batcher::new(limits(1000, 1, false), 0);
        b.add(Some("d".into()), Effect::Opaque, 10, 1);
        let (id, _) = sent(&mut b, 0, true).unwrap();
        b.add(Some("d".into()), Effect::Opaque, 10, 2);
        b.on_response(
            id,
            Response::Failed(RequestOutcome::Split, "413".into()),
            1,
            0.5,
        );
        let (r, payload, failure, attempts) = refusal(&mut b);
        assert_eq!((payload, failure.status, attempts), (1, 413, 0));
        assert!(sent(&mut b, 1, true).is_none(), "d waits for the handler");
        b.settle_refused(r);
        assert_eq!(b.pending(), 1);
        assert_eq!(sent(&mut b, 1, true).expect("d is free again").1, vec![2]);
    }

    #[test]
    fn an_unforced_batch_waits_for_its_trigger_and_the_wake_says_when() {
        let mut b = Batcher::new(limits(3, 1, false), 0);
        b.add(Some("a".into()), Effect::Opaque, 10, 1);
        assert!(
            sent(&mut b, 10, false).is_none(),
            "not due before the interval"
        );
        assert_eq!(b.next_wake_ms(), Some(1000));
        let (id, p) = sent(&mut b, 1000, false).expect("due at the interval");
        assert_eq!(p, vec![1]);
        assert_eq!(b.next_wake_ms(), None, "nothing sendable, nothing to retry");
        b.on_response(id, Response::Items(vec![too_many()]), 1005, 0.0);
        assert_eq!(b.next_wake_ms(), Some(1010), "the retry's due time");
        for v in 2..5 {
            b.add(Some(format!("k{v}")), Effect::Opaque, 10, v);
        }
        assert_eq!(
            sent(&mut b, 1006, false).expect("max_actions queued").1,
            vec![2, 3, 4]
        );
    }

    #[test]
    fn clear_unsent_drops_everything_not_in_flight_and_frees_the_documents() {
        let mut b = Batcher::new(limits(1000, 2, false), 0);
        b.add(Some("d".into()), Effect::Opaque, 10, 1);
        b.add(Some("e".into()), Effect::Opaque, 10, 2);
        let (id, _) = sent(&mut b, 0, true).unwrap();
        b.on_response(id, Response::Items(vec![too_many(), ok()]), 1, 0.5);
        b.add(Some("d".into()), Effect::Opaque, 10, 3);
        b.add(Some("f".into()), Effect::Opaque, 10, 4);
        let (in_flight, p) = sent(&mut b, 1, true).unwrap();
        assert_eq!(p, vec![4]);
        b.add(Some("f".into()), Effect::Opaque, 10, 5);
        b.drain_resolved();
        assert_eq!(
            b.clear_unsent(),
            3,
            "1 (awaiting a retry), 3 and 5 (queued)"
        );
        assert_eq!((b.pending(), b.queued(), b.next_wake_ms()), (1, 0, None));
        assert_eq!(b.bytes(), 10, "only the request in flight is still held");
        b.on_response(in_flight, Response::Items(vec![ok()]), 2, 0.5);
        assert_eq!((b.pending(), b.bytes()), (0, 0));
        b.add(Some("d".into()), Effect::Opaque, 10, 6);
        assert_eq!(sent(&mut b, 3, true).expect("d is free").1, vec![6]);
    }

    #[test]
    fn retries_are_bounded() {
        let mut l = limits(1000, 1, false);
        l.retry_max_attempts = 2;
        let mut b = Batcher::new(l, 0);
        b.add(Some("d".into()), Effect::Opaque, 10, 1);
        for now in [0, 1000, 2000] {
            assert!(b.drain_resolved().is_empty());
            let (id, _) = sent(&mut b, now, true).unwrap();
            b.on_response(id, Response::Items(vec![too_many()]), now, 0.5);
        }
        assert!(matches!(
            b.drain_resolved().as_slice(),
            [Resolution::Exhausted(1, _)]
        ));
        assert_eq!(b.pending(), 0);
    }

    #[test]
    fn a_requeued_action_goes_before_later_actions_and_is_not_coalesced_into_them() {
        for coalesce in [false, true] {
            let mut b = Batcher::new(limits(1000, 1, coalesce), 0);
            b.add(Some("d".into()), index(1), 10, 1);
            let (id, _) = sent(&mut b, 0, true).unwrap();
            b.add(Some("d".into()), index(2), 10, 2);
            b.on_response(id, Response::Items(vec![refused()]), 1, 0.5);
            let (r, payload, _, _) = refusal(&mut b);
            assert_eq!(payload, 1);
            b.requeue(r, vec![(Some("d".into()), index(11), 10, 11)]);
            assert_eq!(
                sent(&mut b, 1, true).unwrap().1,
                vec![11, 2],
                "coalesce={coalesce}"
            );
            assert!(b.drain_resolved().is_empty(), "nothing coalesced");
        }
    }

    #[test]
    fn a_fatal_request_releases_its_documents() {
        let mut b = Batcher::new(limits(1000, 1, false), 0);
        b.add(Some("d".into()), Effect::Opaque, 10, 1);
        let (id, _) = sent(&mut b, 0, true).unwrap();
        b.add(Some("d".into()), Effect::Opaque, 10, 2);
        b.on_response(
            id,
            Response::Failed(RequestOutcome::Malformed, "400".into()),
            1,
            0.5,
        );
        assert!(matches!(
            b.drain_resolved().as_slice(),
            [Resolution::Fatal(1, _)]
        ));
        assert_eq!(sent(&mut b, 1, true).unwrap().1, vec![2]);
    }

    #[test]
    fn a_retriable_failure_before_a_refused_action_is_retried() {
        let mut b = Batcher::new(limits(1000, 1, false), 0);
        b.add(Some("d".into()), index(1), 10, 1);
        b.add(Some("d".into()), index(2), 10, 2);
        let (id, p) = sent(&mut b, 0, true).unwrap();
        assert_eq!(p, vec![1, 2]);
        b.on_response(id, Response::Items(vec![too_many(), refused()]), 1, 0.5);
        let (r, payload, _, _) = refusal(&mut b);
        assert_eq!(payload, 2);
        b.settle_refused(r);
        assert_eq!(b.pending(), 1, "1 was not written: it awaits a retry");
    }

    /// [1 refused, 2 rejected with 429]: the handler's replacement for 1 keeps 1's place,
    /// before 2, with or without coalescing (2 is never superseded by it).
    #[test]
    fn a_replacement_stays_before_a_later_retried_action() {
        for coalesce in [false, true] {
            let mut b: Batcher<i64> = Batcher::new(limits(1000, 1, coalesce), 0);
            if coalesce {
                // With coalescing, the chain [r, 2] forms behind a requeued action.
                b.add(Some("d".into()), index(0), 10, 0);
                let (id, _) = sent(&mut b, 0, true).unwrap();
                b.add(Some("d".into()), index(2), 10, 2);
                b.on_response(id, Response::Items(vec![refused()]), 0, 0.5);
                let (r, _, _, _) = refusal(&mut b);
                b.requeue(r, vec![(Some("d".into()), index(1), 10, 1)]);
            } else {
                b.add(Some("d".into()), index(1), 10, 1);
                b.add(Some("d".into()), index(2), 10, 2);
            }
            let (id, p) = sent(&mut b, 0, true).unwrap();
            assert_eq!(p, vec![1, 2]);
            b.on_response(id, Response::Items(vec![refused(), too_many()]), 1, 0.5);
            let (r, payload, _, _) = refusal(&mut b);
            assert_eq!(payload, 1);
            b.requeue(r, vec![(Some("d".into()), index(11), 10, 11)]);
            let (out, gone) = drain_all(&mut b, 1);
            assert_eq!(out, vec![11, 2], "coalesce={coalesce}: 11 then 2");
            assert!(gone.is_empty(), "coalesce={coalesce}: {gone:?}");
        }
    }

    /// [1 refused, delete written]: a replacement for 1 would resurrect the document
    /// after the delete. One the written action supersedes is superseded; one it does
    /// not supersede fails the job instead of reordering the document.
    #[test]
    fn a_replacement_never_follows_a_later_written_action() {
        let delete = Effect::Delete { version: None };
        let mut b: Batcher<i64> = Batcher::new(limits(1000, 1, false), 0);
        b.add(Some("d".into()), index(1), 10, 1);
        b.add(Some("d".into()), delete.clone(), 10, 2);
        let (id, p) = sent(&mut b, 0, true).unwrap();
        assert_eq!(p, vec![1, 2]);
        b.on_response(id, Response::Items(vec![refused(), ok()]), 1, 0.5);
        let (r, _, _, _) = refusal(&mut b);
        b.requeue(r, vec![(Some("d".into()), index(11), 10, 11)]);
        let (out, gone) = drain_all(&mut b, 1);
        assert!(
            out.is_empty(),
            "nothing is written after the delete: {out:?}"
        );
        assert_eq!(gone, vec![11]);

        let upsert = |doc: &str| Effect::of(&BulkAction::upsert("i", "d".into(), doc.as_bytes()));
        let mut b: Batcher<i64> = Batcher::new(limits(1000, 1, false), 0);
        b.add(Some("d".into()), upsert(r#"{"a":1}"#), 10, 1);
        b.add(Some("d".into()), upsert(r#"{"a":2,"b":2}"#), 10, 2);
        let (id, _) = sent(&mut b, 0, true).unwrap();
        b.on_response(id, Response::Items(vec![refused(), ok()]), 1, 0.5);
        let (r, _, _, _) = refusal(&mut b);
        // A replacement that sets a field the written action does not: out of order.
        b.requeue(
            r,
            vec![(Some("d".into()), upsert(r#"{"a":1,"c":1}"#), 10, 11)],
        );
        assert!(matches!(
            b.drain_resolved().as_slice(),
            [Resolution::Fatal(11, _)]
        ));
        assert_eq!(b.pending(), 0);
    }
}

/// Cases that kill mutants the model test and the cases above did not: each asserts an
/// observable property of the batcher (what is sent and when, the counts it reports,
/// the resolutions).
#[cfg(test)]
mod mutation_tests {
    use super::tests::{limits, ok, refused, too_many};
    use super::*;

    const REPLACE: Effect = Effect::Replace { version: None };

    fn sent(b: &mut Batcher<i64>, now: u64, force: bool) -> Option<Vec<i64>> {
        b.next_request(now, force)
            .map(|(_, p)| p.into_iter().copied().collect())
    }

    /// Limits with a 25-byte trigger and no other trigger before 1000 ms.
    fn bytes_25(coalesce: bool) -> Limits {
        Limits {
            max_bytes: 25,
            ..limits(1000, 2, coalesce)
        }
    }

    /// `queued()` and `in_flight()` follow every action from queued to in flight to
    /// answered; `requests` counts the requests sent.
    #[test]
    fn queued_and_in_flight_count_actions_and_requests() {
        let mut b = Batcher::new(limits(1, 2, false), 0);
        for (doc, v) in [("a", 1), ("b", 2), ("c", 3)] {
            b.add(Some(doc.into()), Effect::Opaque, 10, v);
        }
        assert_eq!((b.queued(), b.in_flight()), (3, 0));
        let (first, _) = b.next_request(0, true).unwrap();
        assert_eq!((b.queued(), b.in_flight()), (2, 1));
        let (second, _) = b.next_request(0, true).unwrap();
        assert_eq!((b.queued(), b.in_flight()), (1, 2));
        assert!(b.next_request(0, true).is_none(), "max_in_flight = 2");
        assert_eq!(b.counters().requests, 2);
        b.on_response(first, Response::Items(vec![ok()]), 1, 0.5);
        b.on_response(second, Response::Items(vec![ok()]), 1, 0.5);
        assert_eq!((b.queued(), b.in_flight(), b.pending()), (1, 0, 1));
    }

    /// A coalesced action leaves the queued bytes: the byte trigger counts what is
    /// queued, not what was ever added.
    #[test]
    fn a_coalesced_action_no_longer_counts_toward_the_byte_trigger() {
        let mut b = Batcher::new(bytes_25(true), 0);
        b.add(Some("a".into()), REPLACE, 10, 1);
        b.add(Some("b".into()), REPLACE, 10, 2);
        b.add(Some("b".into()), REPLACE, 10, 3);
        assert_eq!(
            (b.queued(), b.bytes()),
            (2, 30),
            "2 is set aside, still held"
        );
        assert_eq!(sent(&mut b, 1, false), None, "20 bytes queued, under 25");
        b.add(Some("c".into()), REPLACE, 5, 4);
        assert_eq!(
            sent(&mut b, 1, false),
            Some(vec![1, 3, 4]),
            "25 bytes queued"
        );
    }

    /// What a request carries leaves the queued bytes; what stays queued still counts.
    #[test]
    fn sent_actions_no_longer_count_toward_the_byte_trigger() {
        let mut b = Batcher::new(bytes_25(false), 0);
        for (doc, v) in [("a", 1), ("b", 2), ("c", 3)] {
            b.add(Some(doc.into()), Effect::Opaque, 10, v);
        }
        assert_eq!(sent(&mut b, 1, false), Some(vec![1, 2]), "30 bytes queued");
        assert_eq!(
            sent(&mut b, 1, false),
            None,
            "c's 10 bytes queued, under 25"
        );
        b.add(Some("d".into()), Effect::Opaque, 15, 4);
        assert_eq!(
            sent(&mut b, 1, false),
            Some(vec![3, 4]),
            "c and d: 25 bytes queued"
        );
    }

    /// An action back from a retry counts toward the byte trigger again.
    #[test]
    fn a_retried_action_counts_toward_the_byte_trigger_again() {
        let mut b = Batcher::new(bytes_25(false), 0);
        b.add(Some("a".into()), Effect::Opaque, 20, 1);
        let (id, _) = b.next_request(0, true).unwrap();
        b.on_response(id, Response::Items(vec![too_many()]), 0, 0.0);
        // Due at 5 ms (half of retry_initial_ms with no jitter); the interval at 1000.
        assert_eq!(sent(&mut b, 500, false), None, "a's 20 bytes, under 25");
        assert_eq!(b.queued(), 1, "a is queued again");
        b.add(Some("b".into()), Effect::Opaque, 5, 2);
        assert_eq!(
            sent(&mut b, 500, false),
            Some(vec![1, 2]),
            "25 bytes queued"
        );
    }

    /// Actions without an id have no order to keep: none is coalesced into another,
    /// and none waits for another, queued together or one in flight.
    #[test]
    fn actions_without_an_id_never_wait_for_or_replace_each_other() {
        let mut b = Batcher::new(limits(1000, 2, true), 0);
        b.add(None, REPLACE, 10, 1);
        b.add(None, REPLACE, 10, 2);
        assert_eq!(b.counters().coalesced, 0);
        assert_eq!(sent(&mut b, 0, true), Some(vec![1, 2]), "one request");
        b.add(None, Effect::Opaque, 10, 3);
        assert_eq!(
            sent(&mut b, 0, true),
            Some(vec![3]),
            "sent while 1 and 2 are in flight"
        );
        assert_eq!(b.pending(), 3);
    }

    /// Takes the refusal among what was resolved: its handle, payload and attempts.
    fn refusal(b: &mut Batcher<i64>) -> (Refusal, i64, u32) {
        let r = b.drain_resolved();
        for x in r {
            if let Resolution::Refused {
                refusal,
                payload,
                attempts,
                ..
            } = x
            {
                return (refusal, payload, attempts);
            }
        }
        panic!("no refusal");
    }

    /// A replacement counts the attempts of the action it replaces plus one, so a
    /// document the handler keeps replacing reports how often it was tried.
    #[test]
    fn replacements_count_the_attempts_of_what_they_replace() {
        let mut b = Batcher::new(limits(1000, 1, false), 0);
        b.add(Some("d".into()), Effect::Opaque, 10, 1);
        let mut payload = 1;
        for want_attempts in 0..3 {
            let (id, p) = b.next_request(0, true).unwrap();
            assert_eq!(p, vec![&payload]);
            b.on_response(id, Response::Items(vec![refused()]), 0, 0.5);
            let (r, got, attempts) = refusal(&mut b);
            assert_eq!((got, attempts), (payload, want_attempts));
            payload += 1;
            b.requeue(r, vec![(Some("d".into()), Effect::Opaque, 10, payload)]);
        }
        assert_eq!(b.pending(), 1);
    }

    /// A replacement that a later written action supersedes is counted as superseded.
    #[test]
    fn a_superseded_replacement_is_counted() {
        let mut b = Batcher::new(limits(1000, 1, false), 0);
        b.add(Some("d".into()), REPLACE, 10, 1);
        b.add(Some("d".into()), REPLACE, 10, 2);
        let (id, _) = b.next_request(0, true).unwrap();
        b.on_response(id, Response::Items(vec![refused(), ok()]), 1, 0.5);
        let (r, _, _) = refusal(&mut b);
        assert_eq!(b.counters().superseded, 0);
        b.requeue(r, vec![(Some("d".into()), REPLACE, 10, 11)]);
        assert_eq!(b.counters().superseded, 1);
        assert!(matches!(
            b.drain_resolved().as_slice(),
            [Resolution::Superseded(11)]
        ));
        assert_eq!((b.pending(), b.bytes()), (0, 0));
    }

    /// Several replacements on the refused action's document take its place in the
    /// order given, and count as queued (actions and bytes) like any added action.
    #[test]
    fn replacements_keep_their_order_and_count_as_queued() {
        let mut b = Batcher::new(bytes_25(false), 0);
        b.add(Some("d".into()), Effect::Opaque, 1, 1);
        let (id, _) = b.next_request(0, true).unwrap();
        b.add(Some("d".into()), Effect::Opaque, 1, 2);
        b.on_response(id, Response::Items(vec![refused()]), 0, 0.5);
        let (r, _, _) = refusal(&mut b);
        assert_eq!(b.queued(), 1);
        b.requeue(
            r,
            vec![
                (Some("d".into()), Effect::Opaque, 10, 11),
                (Some("d".into()), Effect::Opaque, 10, 12),
            ],
        );
        assert_eq!((b.queued(), b.pending(), b.bytes()), (3, 3, 21));
        assert_eq!(sent(&mut b, 1, false), None, "21 bytes queued, under 25");
        b.add(Some("e".into()), Effect::Opaque, 4, 3);
        let (id, p) = b.next_request(1, false).expect("25 bytes queued");
        assert_eq!(p, vec![&11, &3]);
        b.on_response(id, Response::Items(vec![ok(), ok()]), 1, 0.5);
        let mut order = vec![];
        while let Some((id, p)) = b.next_request(1, true) {
            order.extend(p.iter().copied().copied());
            let n = p.len();
            b.on_response(id, Response::Items(vec![ok(); n]), 1, 0.5);
        }
        assert_eq!(order, vec![12, 2], "d: 11, 12, then 2");
    }

    /// A retry is due at exactly its due time (half of `retry_initial_ms` without
    /// jitter: 5 ms).
    #[test]
    fn a_retry_is_sent_at_its_due_time() {
        let mut b = Batcher::new(limits(1000, 1, false), 0);
        b.add(Some("d".into()), Effect::Opaque, 10, 1);
        let (id, _) = b.next_request(0, true).unwrap();
        let backoff = b.on_response(id, Response::Items(vec![too_many()]), 0, 0.0);
        assert_eq!(
            backoff,
            Some(Duration::from_millis(5)),
            "the backoff it reports"
        );
        assert_eq!(b.next_wake_ms(), Some(5));
        assert_eq!(sent(&mut b, 4, true), None, "not yet due");
        assert_eq!(sent(&mut b, 5, true), Some(vec![1]));
        // Written: nothing retried, no backoff.
        let mut b = Batcher::new(limits(1000, 1, false), 0);
        b.add(Some("d".into()), Effect::Opaque, 10, 1);
        let (id, _) = b.next_request(0, true).unwrap();
        assert_eq!(b.on_response(id, Response::Written(1), 0, 0.0), None);
    }

    /// With coalescing, a retry whose document has a newer superseding action queued
    /// behind it is not resent: only the newer action goes, and the retry is resolved
    /// as superseded once that is written.
    #[test]
    fn a_retry_that_the_queued_action_behind_it_supersedes_is_not_resent() {
        let mut b = Batcher::new(limits(1000, 1, true), 0);
        b.add(Some("d".into()), REPLACE, 10, 1);
        let (id, _) = b.next_request(0, true).unwrap();
        b.add(Some("d".into()), REPLACE, 10, 2);
        b.on_response(id, Response::Items(vec![too_many()]), 0, 0.0);
        let (id, p) = b.next_request(5, true).unwrap();
        assert_eq!(p, vec![&2]);
        assert!(b.drain_resolved().is_empty(), "not before 2 is written");
        assert_eq!(b.pending(), 2);
        b.on_response(id, Response::Items(vec![ok()]), 5, 0.0);
        assert_eq!(b.counters().superseded, 1);
        assert!(matches!(
            b.drain_resolved().as_slice(),
            [Resolution::Written(2), Resolution::Superseded(1)]
        ));
        assert_eq!((b.pending(), b.bytes()), (0, 0));
    }

    /// A document's superseding chain shares a request with what is already in it up
    /// to exactly `max_actions` and `max_bytes`; the rest of the chain goes next.
    #[test]
    fn a_chain_fills_a_request_up_to_its_limits_and_the_rest_goes_next() {
        for (max_actions, max_bytes) in [(3, 1 << 20), (1000, 30)] {
            let l = Limits {
                max_bytes,
                ..limits(max_actions, 1, false)
            };
            let mut b = Batcher::new(l, 0);
            b.add(Some("e".into()), Effect::Opaque, 10, 0);
            for v in 1..=3 {
                b.add(Some("d".into()), REPLACE, 10, v);
            }
            let (id, p) = b.next_request(0, true).unwrap();
            assert_eq!(
                p,
                vec![&0, &1, &2],
                "{max_actions} actions, {max_bytes} bytes"
            );
            b.on_response(id, Response::Items(vec![ok(); 3]), 0, 0.5);
            assert_eq!(sent(&mut b, 0, true), Some(vec![3]));
        }
    }

    /// Every request in flight has its own id: answering one never answers another,
    /// whatever else (actions without an id) drew from the same counter.
    #[test]
    fn requests_in_flight_have_distinct_ids() {
        let mut b = Batcher::new(limits(1000, 2, false), 0);
        b.add(Some("d".into()), Effect::Opaque, 10, 1);
        let (first, _) = b.next_request(0, true).unwrap();
        b.add(None, Effect::Opaque, 10, 2);
        let (second, _) = b.next_request(0, true).unwrap();
        assert_ne!(first, second);
        assert_eq!(b.in_flight(), 2);
        assert_eq!(b.in_flight_payloads(first), vec![&1]);
        b.on_response(first, Response::Items(vec![ok()]), 0, 0.5);
        b.on_response(second, Response::Items(vec![ok()]), 0, 0.5);
        assert_eq!((b.pending(), b.in_flight()), (0, 0));
    }

    /// A response whose item count does not match the request cannot be read by
    /// position: every action of the request is retried (and counted), none is taken
    /// as written.
    #[test]
    fn a_response_with_the_wrong_item_count_retries_the_whole_request() {
        let mut b = Batcher::new(limits(1000, 1, false), 0);
        b.add(Some("a".into()), Effect::Opaque, 10, 1);
        b.add(Some("b".into()), Effect::Opaque, 10, 2);
        let (id, _) = b.next_request(0, true).unwrap();
        b.on_response(id, Response::Items(vec![ok()]), 0, 0.0);
        assert!(b.drain_resolved().is_empty(), "nothing written");
        assert_eq!((b.pending(), b.counters().retried), (2, 2));
        assert_eq!(sent(&mut b, 5, true), Some(vec![1, 2]), "both retried");
    }

    /// With `max_in_flight` requests out, nothing can be sent: the wake is for a retry
    /// or nothing, not the flush interval.
    #[test]
    fn no_flush_wake_while_max_in_flight_requests_are_out() {
        let mut b = Batcher::new(limits(1000, 1, false), 0);
        b.add(Some("a".into()), Effect::Opaque, 10, 1);
        let (id, _) = b.next_request(0, true).unwrap();
        b.add(Some("b".into()), Effect::Opaque, 10, 2);
        assert_eq!(
            b.next_wake_ms(),
            None,
            "b waits for the answer, not a timer"
        );
        b.on_response(id, Response::Items(vec![ok()]), 10, 0.5);
        assert_eq!(b.next_wake_ms(), Some(1000), "b is due at the interval");
    }

    /// A key is its bytes: `as_bytes` gives back exactly what it was made of, and an
    /// owned copy is the same key.
    #[test]
    fn a_key_gives_back_its_bytes() {
        let buffer = Bytes::from_static(b"xx\"_index\":\"i\",\"_id\":\"d\"yy");
        let k = DocKey::new(buffer.slice(2..buffer.len() - 2));
        assert_eq!(k.as_bytes(), b"\"_index\":\"i\",\"_id\":\"d\"");
        assert_eq!(DocKey::from("d").as_bytes(), b"d");
        assert_eq!(DocKey::from(String::from("e")).as_bytes(), b"e");
        let owned = k.clone().owned();
        assert_eq!(owned.as_bytes(), k.as_bytes());
        assert_eq!(owned, k);
    }

    /// The stored hash only rules keys out: two keys whose hashes collide are equal
    /// exactly when their bytes are, whether they share a buffer (a key and its prefix,
    /// the same slice) or not.
    #[test]
    fn keys_whose_hashes_collide_are_told_apart_by_their_bytes() {
        let forged = |bytes: Bytes| DocKey { hash: 7, bytes };
        let buffer = Bytes::from_static(b"abcdabcd");
        let (whole, prefix) = (forged(buffer.clone()), forged(buffer.slice(0..4)));
        assert_ne!(whole, prefix, "same start, different lengths");
        assert_ne!(prefix, whole);
        assert_ne!(
            forged(buffer.slice(0..4)),
            forged(buffer.slice(1..5)),
            "same length, different bytes"
        );
        assert_eq!(
            forged(buffer.slice(0..4)),
            forged(buffer.slice(4..8)),
            "the same bytes at two places"
        );
        assert_eq!(forged(buffer.slice(0..4)), prefix, "the same slice");
        assert_ne!(
            forged(Bytes::from_static(b"abcd")),
            forged(Bytes::from_static(b"abce"))
        );
        // Equal bytes with different hashes cannot come from `new`; keys made by it are
        // equal exactly when their bytes are.
        assert_eq!(DocKey::from("abcd"), DocKey::new(buffer.slice(4..8)));
        assert_ne!(DocKey::from("abcd"), DocKey::from("abce"));
    }

    /// The map hashes a key by its stored hash, so distinct documents spread over the
    /// map rather than all landing in one bucket chain.
    #[test]
    fn distinct_keys_hash_apart_and_equal_keys_alike() {
        use std::hash::BuildHasher as _;
        let state = std::collections::hash_map::RandomState::new();
        let hashes: std::collections::HashSet<u64> = (0..1000)
            .map(|i| state.hash_one(DocKey::from(format!("doc-{i}"))))
            .collect();
        assert_eq!(hashes.len(), 1000);
        let buffer = Bytes::from_static(b"doc-1doc-1");
        assert_eq!(
            state.hash_one(DocKey::new(buffer.slice(0..5))),
            state.hash_one(DocKey::new(buffer.slice(5..10)))
        );
    }

    /// [1, 2 rejected with 429, 3 refused] in one request, 4 queued behind: the
    /// replacement for 3 takes exactly 3's place, after the retried 1 and 2 and before 4.
    #[test]
    fn a_replacement_takes_the_place_of_a_refused_action_behind_retried_ones() {
        let mut b = Batcher::new(limits(1000, 1, false), 0);
        for v in 1..=3 {
            b.add(Some("d".into()), REPLACE, 10, v);
        }
        let (id, p) = b.next_request(0, true).unwrap();
        assert_eq!(p, vec![&1, &2, &3]);
        b.add(Some("d".into()), REPLACE, 10, 4);
        b.on_response(
            id,
            Response::Items(vec![too_many(), too_many(), refused()]),
            0,
            0.0,
        );
        let (r, payload, _) = refusal(&mut b);
        assert_eq!(payload, 3);
        b.requeue(r, vec![(Some("d".into()), REPLACE, 10, 33)]);
        assert_eq!(sent(&mut b, 5, true), Some(vec![1, 2, 33, 4]));
    }

    /// `for_each_in_flight_mut` reaches exactly the actions of the request it names, in
    /// request order, and nothing for a request not in flight.
    #[test]
    fn for_each_in_flight_mut_reaches_the_actions_of_that_request() {
        let mut b = Batcher::new(limits(2, 2, false), 0);
        for (doc, v) in [("a", 1), ("b", 2), ("c", 3)] {
            b.add(Some(doc.into()), Effect::Opaque, 10, v);
        }
        let (id, _) = b.next_request(0, true).unwrap();
        let mut seen = vec![];
        b.for_each_in_flight_mut(id, |p| {
            seen.push(*p);
            *p *= 10;
        });
        assert_eq!(seen, vec![1, 2]);
        assert_eq!(b.in_flight_payloads(id), vec![&10, &20]);
        b.for_each_in_flight_mut(id + 1, |_| panic!("no such request"));
        assert_eq!(sent(&mut b, 0, true), Some(vec![3]), "c was not in it");
        b.on_response(id, Response::Items(vec![ok(), ok()]), 0, 0.5);
        let written: Vec<_> = b
            .drain_resolved()
            .into_iter()
            .map(|r| match r {
                Resolution::Written(v) => v,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            written,
            vec![10, 20],
            "what the processor changed is resolved"
        );
    }

    /// `drain_resolved_into` appends what was resolved, in order, behind what `out`
    /// already holds, and leaves nothing behind to be drained again.
    #[test]
    fn drain_resolved_into_appends_in_order_and_takes_everything() {
        let mut b = Batcher::new(limits(1000, 1, false), 0);
        b.add(Some("a".into()), Effect::Opaque, 10, 1);
        b.add(Some("b".into()), Effect::Opaque, 10, 2);
        let (id, _) = b.next_request(0, true).unwrap();
        b.on_response(id, Response::Written(2), 0, 0.5);
        let mut out = vec![Resolution::Written(0)];
        b.drain_resolved_into(&mut out);
        let got: Vec<_> = out
            .into_iter()
            .map(|r| match r {
                Resolution::Written(v) => v,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(got, vec![0, 1, 2]);
        assert!(b.drain_resolved().is_empty());
    }

    /// Whether the batcher holds no document: no key in its map, no live group.
    fn holds_no_document(b: &Batcher<i64>) -> bool {
        b.docs.is_empty() && b.groups.iter().all(Option::is_none)
    }

    /// A document whose last action is resolved leaves the batcher, whatever resolved
    /// it (written, coalesced then written, refused and settled, retried then written,
    /// failed, dropped by `clear_unsent`), so what it holds is bounded by its live
    /// actions, not by every document it ever saw.
    #[test]
    fn a_document_with_no_live_action_leaves_the_batcher() {
        let mut b = Batcher::new(limits(1000, 1, true), 0);
        let answer = |b: &mut Batcher<i64>, items: Vec<ItemResult>| {
            let (id, _) = b.next_request(10_000, true).unwrap();
            b.on_response(id, Response::Items(items), 0, 0.0);
        };
        b.add(Some("a".into()), REPLACE, 10, 1);
        b.add(None, REPLACE, 10, 2);
        b.add(Some("c".into()), REPLACE, 10, 3);
        b.add(Some("c".into()), REPLACE, 10, 4);
        answer(&mut b, vec![ok(); 3]);
        assert!(holds_no_document(&b), "written and coalesced");
        b.add(Some("d".into()), REPLACE, 10, 5);
        answer(&mut b, vec![refused()]);
        let (r, _, _) = refusal(&mut b);
        assert!(!holds_no_document(&b), "the refusal holds its place");
        b.settle_refused(r);
        assert!(holds_no_document(&b), "refused and settled");
        b.add(Some("e".into()), REPLACE, 10, 6);
        answer(&mut b, vec![too_many()]);
        answer(&mut b, vec![ok()]);
        assert!(holds_no_document(&b), "retried, then written");
        b.add(Some("f".into()), REPLACE, 10, 7);
        let (id, _) = b.next_request(20_000, true).unwrap();
        b.on_response(
            id,
            Response::Failed(RequestOutcome::Fatal, "401".into()),
            0,
            0.0,
        );
        assert!(holds_no_document(&b), "failed");
        b.add(Some("g".into()), REPLACE, 10, 8);
        b.add(None, REPLACE, 10, 9);
        assert_eq!(b.clear_unsent(), 2);
        assert!(holds_no_document(&b), "dropped");
        assert_eq!((b.pending(), b.bytes()), (0, 0));
    }
}

/// A refused write never takes what it coalesced along: what it set aside is written in
/// its place (or refused in turn), so the document ends as it would without coalescing.
#[cfg(test)]
mod fallback_tests {
    use super::tests::{limits, ok, refused, too_many};
    use super::*;
    use crate::connectors::elasticsearch::action::BulkAction;

    const REPLACE: Effect = Effect::Replace { version: None };

    fn upsert(doc: &str) -> Effect {
        Effect::of(&BulkAction::upsert("i", "d".into(), doc.as_bytes()))
    }

    /// Sends what is due (forced) and answers it with `items`; returns what was sent.
    fn round(b: &mut Batcher<i64>, now: u64, items: fn() -> ItemResult) -> Vec<i64> {
        let (id, p) = b.next_request(now, true).expect("a request");
        let p: Vec<i64> = p.into_iter().copied().collect();
        b.on_response(id, Response::Items(vec![items(); p.len()]), now, 0.0);
        p
    }

    /// Settles (dead-letters) every refusal among the resolutions; returns what was
    /// refused, written and coalesced or superseded, in that order.
    fn settle(b: &mut Batcher<i64>) -> (Vec<i64>, Vec<i64>, Vec<i64>) {
        let (mut refused, mut written, mut gone) = (vec![], vec![], vec![]);
        // Settling a refusal may resolve more: until nothing is left.
        loop {
            let batch = b.drain_resolved();
            if batch.is_empty() {
                break;
            }
            for r in batch {
                match r {
                    Resolution::Refused {
                        refusal, payload, ..
                    } => {
                        refused.push(payload);
                        b.settle_refused(refusal);
                    }
                    Resolution::Written(v) => written.push(v),
                    Resolution::Coalesced(v) | Resolution::Superseded(v) => gone.push(v),
                    other => panic!("{other:?}"),
                }
            }
        }
        (refused, written, gone)
    }

    /// The reviewer's case, for each kind of pair that coalesces (a full write over a
    /// full write, a covering merge, external versions, a delete, a write over a
    /// merge): the newer action is refused and dead-lettered; the older one is written
    /// then, and until it is, it is pending.
    #[test]
    fn a_refused_write_falls_back_to_the_write_it_coalesced() {
        let pairs = [
            (REPLACE, REPLACE),
            (upsert(r#"{"n":1}"#), upsert(r#"{"n":"x"}"#)),
            (
                Effect::Replace { version: Some(1) },
                Effect::Replace { version: Some(2) },
            ),
            (REPLACE, Effect::Delete { version: None }),
            (upsert(r#"{"n":1}"#), REPLACE),
        ];
        for (older, newer) in pairs {
            let what = format!("{newer:?} over {older:?}");
            assert!(newer.supersedes(&older), "{what}");
            let mut b = Batcher::new(limits(1000, 1, true), 0);
            b.add(Some("k".into()), older, 10, 1);
            b.add(Some("k".into()), newer, 10, 2);
            assert_eq!((b.queued(), b.pending(), b.bytes()), (1, 2, 20), "{what}");
            assert_eq!(round(&mut b, 0, refused), vec![2], "{what}");
            let (refused, written, gone) = settle(&mut b);
            assert_eq!(refused, vec![2], "{what}: the refused one is dead-lettered");
            assert!(written.is_empty() && gone.is_empty(), "{what}");
            assert_eq!(
                (b.pending(), b.bytes()),
                (1, 10),
                "{what}: 1 is still to write"
            );
            assert_eq!(
                round(&mut b, 0, ok),
                vec![1],
                "{what}: 1 is sent in 2's place"
            );
            assert_eq!(settle(&mut b), (vec![], vec![1], vec![]), "{what}");
            assert_eq!((b.pending(), b.bytes()), (0, 0), "{what}");
        }
    }

    /// c over b over a: c refused, b and a go back at once, in one request (b
    /// supersedes a). Each refusal reaches the failure handler (its dead letter is
    /// written), and pending stays above 0 until they are all settled; a written b
    /// does not make a refused a moot (as without coalescing, a is dead-lettered).
    #[test]
    fn a_refused_chain_goes_back_whole_in_one_request() {
        let mut b = Batcher::new(limits(1000, 1, true), 0);
        for v in 1..=3 {
            b.add(Some("k".into()), REPLACE, 10, v);
        }
        assert_eq!((b.queued(), b.set_aside()), (1, 2));
        assert_eq!(round(&mut b, 0, refused), vec![3]);
        assert_eq!(settle(&mut b).0, vec![3]);
        assert_eq!((b.queued(), b.set_aside(), b.pending()), (2, 0, 2));
        b.add(Some("k".into()), REPLACE, 10, 4);
        assert_eq!(
            (b.queued(), b.set_aside()),
            (3, 0),
            "what went back is not set aside again"
        );
        let (id, p) = b.next_request(0, true).unwrap();
        assert_eq!(p, vec![&1, &2, &4]);
        b.on_response(
            id,
            Response::Items(vec![refused(), ok(), refused()]),
            0,
            0.0,
        );
        assert_eq!(settle(&mut b), (vec![1, 4], vec![2], vec![]));
        assert_eq!((b.pending(), b.bytes()), (0, 0));
    }

    /// c over b over a, c written: b and a are coalesced, none of them sent.
    #[test]
    fn a_written_successor_resolves_its_whole_chain_as_coalesced() {
        let mut b = Batcher::new(limits(1000, 1, true), 0);
        for v in 1..=3 {
            b.add(Some("k".into()), REPLACE, 10, v);
        }
        assert_eq!(round(&mut b, 0, ok), vec![3]);
        let (refused, written, mut gone) = settle(&mut b);
        gone.sort();
        assert_eq!((refused, written, gone), (vec![], vec![3], vec![1, 2]));
        assert_eq!(b.counters().coalesced, 2);
        assert_eq!((b.pending(), b.bytes()), (0, 0));
    }

    /// Set aside actions that did not supersede each other (an upsert of a, then of b,
    /// both replaced by a full write) go back both, in their order.
    #[test]
    fn what_goes_back_keeps_its_order() {
        let mut b = Batcher::new(limits(1000, 1, true), 0);
        b.add(Some("k".into()), upsert(r#"{"a":1}"#), 10, 1);
        b.add(Some("k".into()), upsert(r#"{"b":1}"#), 10, 2);
        b.add(Some("k".into()), REPLACE, 10, 3);
        assert_eq!(b.queued(), 1);
        assert_eq!(round(&mut b, 0, refused), vec![3]);
        settle(&mut b);
        assert_eq!(
            round(&mut b, 0, ok),
            vec![1],
            "2 does not cover 1: two requests"
        );
        assert_eq!(round(&mut b, 0, ok), vec![2]);
        assert_eq!(b.pending(), 0);
    }

    /// A retry that the queued action behind it supersedes is set aside by it, not
    /// resolved: if that action is refused, the retry is sent after all.
    #[test]
    fn a_retry_set_aside_by_the_action_behind_it_is_sent_if_that_is_refused() {
        let mut b = Batcher::new(limits(1000, 1, true), 0);
        b.add(Some("k".into()), REPLACE, 10, 1);
        assert_eq!(round(&mut b, 0, too_many), vec![1]);
        b.add(Some("k".into()), REPLACE, 10, 2);
        assert_eq!(round(&mut b, 5, refused), vec![2], "1 is not resent");
        let (refused, written, gone) = settle(&mut b);
        assert_eq!((refused, written, gone), (vec![2], vec![], vec![]));
        assert_eq!(b.pending(), 1);
        assert_eq!(round(&mut b, 5, ok), vec![1], "1 is sent in 2's place");
        assert_eq!(settle(&mut b), (vec![], vec![1], vec![]));
        assert_eq!(b.pending(), 0);
    }

    /// A retry that came due and is queued again, then set aside by a newer write, is
    /// counted as superseded (it was sent), not as coalesced.
    #[test]
    fn a_former_retry_set_aside_later_is_counted_as_superseded() {
        let mut b = Batcher::new(limits(1000, 1, true), 0);
        b.add(Some("k".into()), REPLACE, 10, 1);
        assert_eq!(round(&mut b, 0, too_many), vec![1]);
        assert!(b.next_request(50, false).is_none(), "due, queued, not sent");
        assert_eq!(b.queued(), 1);
        b.add(Some("k".into()), REPLACE, 10, 2);
        assert_eq!(b.set_aside(), 1);
        assert_eq!(round(&mut b, 50, ok), vec![2]);
        assert_eq!(settle(&mut b), (vec![], vec![2], vec![1]));
        let c = b.counters();
        assert_eq!((c.superseded, c.coalesced), (1, 0));
    }

    /// The failure handler's replacement for a refused action goes after what that
    /// action had set aside, which goes back first, when it does not supersede it.
    #[test]
    fn a_replacement_goes_after_what_the_refused_action_set_aside() {
        let mut b = Batcher::new(limits(1000, 1, true), 0);
        b.add(Some("k".into()), REPLACE, 10, 1);
        b.add(Some("k".into()), REPLACE, 10, 2);
        assert_eq!(round(&mut b, 0, refused), vec![2]);
        let Some(Resolution::Refused { refusal, .. }) = b.drain_resolved().pop() else {
            panic!("a refusal");
        };
        b.requeue(refusal, vec![(Some("k".into()), Effect::Opaque, 10, 22)]);
        assert_eq!(b.set_aside(), 0);
        assert_eq!(round(&mut b, 0, ok), vec![1]);
        assert_eq!(round(&mut b, 0, ok), vec![22]);
        assert_eq!(b.pending(), 0);
    }

    /// A replacement that supersedes what the refused action had set aside keeps it set
    /// aside: moot once the replacement is written, back in its place if it is not.
    #[test]
    fn a_superseding_replacement_keeps_what_the_refused_action_set_aside() {
        for written in [true, false] {
            let mut b = Batcher::new(limits(1000, 1, true), 0);
            b.add(Some("k".into()), REPLACE, 10, 1);
            b.add(Some("k".into()), REPLACE, 10, 2);
            assert_eq!(round(&mut b, 0, refused), vec![2]);
            let Some(Resolution::Refused { refusal, .. }) = b.drain_resolved().pop() else {
                panic!("a refusal");
            };
            b.requeue(refusal, vec![(Some("k".into()), REPLACE, 10, 22)]);
            assert_eq!((b.set_aside(), b.pending()), (1, 2));
            if written {
                assert_eq!(round(&mut b, 0, ok), vec![22]);
                assert_eq!(settle(&mut b), (vec![], vec![22], vec![1]));
            } else {
                assert_eq!(round(&mut b, 0, refused), vec![22]);
                assert_eq!(settle(&mut b), (vec![22], vec![], vec![]));
                assert_eq!(round(&mut b, 0, ok), vec![1]);
                assert_eq!(settle(&mut b), (vec![], vec![1], vec![]));
            }
            assert_eq!(b.pending(), 0, "written={written}");
        }
    }

    /// 2 set aside 1, was sent, possibly applied (its response lost) and refused on the
    /// retry. Its replacement supersedes 1, which is not sent before it: 1 after a
    /// possibly applied 2 would regress the document. Should the replacement be
    /// dead-lettered, 1 goes back (see [`Batcher::settle_refused`]).
    #[test]
    fn what_a_possibly_applied_refused_action_set_aside_is_not_sent_before_its_replacement() {
        for written in [true, false] {
            let mut b = Batcher::new(limits(1000, 1, true), 0);
            b.add(Some("k".into()), REPLACE, 10, 1);
            b.add(Some("k".into()), REPLACE, 10, 2);
            let (id, p) = b.next_request(0, true).unwrap();
            assert_eq!(p, vec![&2]);
            b.on_response(
                id,
                Response::Failed(RequestOutcome::Retry, "connection closed".into()),
                0,
                0.0,
            );
            assert_eq!(round(&mut b, 100_000, refused), vec![2]);
            let Some(Resolution::Refused { refusal, .. }) = b.drain_resolved().pop() else {
                panic!("a refusal");
            };
            b.requeue(refusal, vec![(Some("k".into()), REPLACE, 10, 22)]);
            // A newer write setting the replacement aside keeps 1 under it.
            b.add(Some("k".into()), REPLACE, 10, 3);
            assert_eq!(b.set_aside(), 2);
            assert_eq!(round(&mut b, 100_000, refused), vec![3]);
            assert_eq!(settle(&mut b), (vec![3], vec![], vec![]));
            if written {
                assert_eq!(round(&mut b, 100_000, ok), vec![22]);
                assert_eq!(settle(&mut b), (vec![], vec![22], vec![1]));
            } else {
                assert_eq!(round(&mut b, 100_000, refused), vec![22]);
                assert_eq!(settle(&mut b), (vec![22], vec![], vec![]));
                assert_eq!(round(&mut b, 100_000, ok), vec![1]);
                assert_eq!(settle(&mut b), (vec![], vec![1], vec![]));
            }
            assert_eq!(b.pending(), 0, "written={written}");
        }
    }

    /// Builds, on document k, a request [4 (which set aside 3), 5] (5 supersedes 4 but
    /// was added while 4 was in flight, and 4 came back when a split cut its document),
    /// answers it with `first` for 4 and success for 5, and returns the batcher.
    fn overtaken(first: ItemResult) -> Batcher<i64> {
        let mut b = Batcher::new(limits(1000, 1, true), 0);
        b.add(Some("k".into()), REPLACE, 10, 1);
        b.add(Some("k".into()), REPLACE, 10, 2);
        assert_eq!(round(&mut b, 0, refused), vec![2]);
        settle(&mut b);
        // 1 went back: 3 and 4 queue behind it, 4 sets aside 3.
        b.add(Some("k".into()), REPLACE, 10, 3);
        b.add(Some("k".into()), REPLACE, 10, 4);
        let (id, p) = b.next_request(0, true).unwrap();
        assert_eq!(p, vec![&1, &4]);
        b.add(Some("k".into()), REPLACE, 10, 5);
        b.on_response(
            id,
            Response::Failed(RequestOutcome::Split, "413".into()),
            0,
            0.0,
        );
        assert_eq!(round(&mut b, 0, ok), vec![1]);
        assert_eq!(settle(&mut b).1, vec![1]);
        let (id, p) = b.next_request(0, true).unwrap();
        assert_eq!(p, vec![&4, &5]);
        b.on_response(id, Response::Items(vec![first, ok()]), 0, 0.0);
        b
    }

    /// [4 (which set aside 3), 5] in one request, 4 refused and 5 written: 5 supersedes
    /// 4 and so 3; 3 is moot, never sent.
    #[test]
    fn a_refusal_overtaken_by_a_later_write_leaves_what_it_set_aside_moot() {
        let mut b = overtaken(refused());
        let (refused, written, gone) = settle(&mut b);
        assert_eq!((refused, written, gone), (vec![4], vec![5], vec![3]));
        assert_eq!((b.pending(), b.bytes()), (0, 0));
        assert!(b.next_request(0, true).is_none(), "3 is never sent");
    }

    /// The same with 4 answered 403 (the job fails): 3 does not go back behind the
    /// written 5, where it would overwrite it.
    #[test]
    fn a_fatal_item_overtaken_by_a_later_write_leaves_what_it_set_aside_moot() {
        let forbidden = ItemResult {
            outcome: Outcome::Fatal,
            failure: ItemFailure {
                status: 403,
                error_type: "security_exception".into(),
                reason: "no".into(),
            },
        };
        let mut b = overtaken(forbidden);
        let r = b.drain_resolved();
        assert!(
            matches!(
                r.as_slice(),
                [
                    Resolution::Coalesced(3),
                    Resolution::Fatal(4, _),
                    Resolution::Written(5)
                ]
            ),
            "{r:?}"
        );
        assert_eq!(
            (b.pending(), b.queued()),
            (0, 0),
            "3 is not queued behind 5"
        );
    }

    /// A successor that fails the job (a fatal response, retries exhausted) puts what
    /// it set aside back; the failing processor's `clear_unsent` drops it and counts it,
    /// with what queued actions set aside. Nothing of it is resolved as written.
    #[test]
    fn set_aside_actions_of_a_failed_successor_are_dropped_not_written() {
        let mut b = Batcher::new(limits(1000, 1, true), 0);
        b.add(Some("k".into()), REPLACE, 10, 1);
        b.add(Some("k".into()), REPLACE, 10, 2);
        let (id, _) = b.next_request(0, true).unwrap();
        b.on_response(
            id,
            Response::Failed(RequestOutcome::Fatal, "401".into()),
            0,
            0.0,
        );
        assert!(matches!(
            b.drain_resolved().as_slice(),
            [Resolution::Fatal(2, _)]
        ));
        assert_eq!((b.queued(), b.pending()), (1, 1), "1 is back, queued");
        b.add(Some("j".into()), REPLACE, 10, 3);
        b.add(Some("j".into()), REPLACE, 10, 4);
        assert_eq!(b.clear_unsent(), 3, "1, 3 and 4 (set aside by 4)");
        assert!(b.drain_resolved().is_empty(), "none written");
        assert_eq!((b.pending(), b.bytes()), (0, 0));

        let mut l = limits(1000, 1, true);
        l.retry_max_attempts = 0;
        let mut b = Batcher::new(l, 0);
        b.add(Some("k".into()), REPLACE, 10, 1);
        b.add(Some("k".into()), REPLACE, 10, 2);
        assert_eq!(round(&mut b, 0, too_many), vec![2]);
        assert!(matches!(
            b.drain_resolved().as_slice(),
            [Resolution::Exhausted(2, _)]
        ));
        assert_eq!(b.pending(), 1);
        assert_eq!(b.clear_unsent(), 1);
        assert_eq!(b.pending(), 0);
    }

    /// What stays a while after a response that did not write everything is reached by
    /// `for_each_in_flight_mut` (the processor gives it bytes of its own): the set-aside
    /// actions too.
    #[test]
    fn for_each_in_flight_mut_reaches_what_the_actions_set_aside() {
        let mut b = Batcher::new(limits(1000, 1, true), 0);
        for v in 1..=3 {
            b.add(Some("k".into()), REPLACE, 10, v);
        }
        b.add(Some("j".into()), REPLACE, 10, 4);
        let (id, _) = b.next_request(0, true).unwrap();
        let mut seen = vec![];
        b.for_each_in_flight_mut(id, |p| seen.push(*p));
        seen.sort();
        assert_eq!(seen, vec![1, 2, 3, 4]);
    }
}

#[cfg(test)]
mod refused_hot_document_tests {
    use super::tests::{limits, refused};
    use super::*;

    const REPLACE: Effect = Effect::Replace { version: None };

    /// Whether the processor takes more actions (what `bulk.rs` asks before reading).
    fn intake_open(b: &Batcher<i64>) -> bool {
        b.has_room()
    }

    /// The reviewer's case: one document whose every write breaks the mapping, written
    /// 1000 times through a processor that takes actions while the intake limit allows.
    /// Every write is dead-lettered, within about as many requests as the writes fill
    /// (not one request per write), and what is queued or set aside never passes the
    /// intake limit.
    #[test]
    fn a_refused_hot_document_is_dead_lettered_in_few_requests_with_a_bounded_backlog() {
        const WRITES: i64 = 10_000;
        const MAX_ACTIONS: usize = 100;
        let mut b = Batcher::new(limits(MAX_ACTIONS, 1, true), 0);
        let (mut added, mut requests, mut dead, mut backlog) = (0, 0, 0, 0);
        for _ in 0..100_000 {
            while added < WRITES && intake_open(&b) {
                added += 1;
                b.add(Some("hot".into()), REPLACE, 10, added);
            }
            // Nothing in flight: what is pending is queued or set aside.
            backlog = backlog.max(b.pending());
            let force = added == WRITES;
            while let Some((id, p)) = b.next_request(0, force) {
                requests += 1;
                let n = p.len();
                b.on_response(id, Response::Items(vec![refused(); n]), 0, 0.0);
                for r in b.drain_resolved() {
                    match r {
                        Resolution::Refused { refusal, .. } => {
                            dead += 1;
                            b.settle_refused(refusal);
                        }
                        other => panic!("only refusals: {other:?}"),
                    }
                }
            }
            if added == WRITES && b.pending() == 0 {
                break;
            }
        }
        assert_eq!(
            (dead, b.pending()),
            (WRITES, 0),
            "every write dead-lettered"
        );
        let bound = WRITES as usize / MAX_ACTIONS + 3;
        let held = (INTAKE_REQUESTS + SET_ASIDE_REQUESTS) * MAX_ACTIONS;
        assert!(
            requests <= bound && backlog <= held,
            "{requests} requests for {WRITES} refused writes (at most {bound}); \
             {backlog} actions queued or set aside at most (at most {held})"
        );
    }
}
