//! The bulk batcher: every decision of the bulk processor, without I/O. Its inputs are
//! actions, responses, the failure handler's answers and the clock (milliseconds); its
//! outputs are requests to send and [`Resolution`]s. The processor task
//! ([`super::processor`]) only drives it.
//!
//! Each document keeps one ordered list of its live actions, whatever their state
//! (queued, in a request, awaiting a retry, refused and awaiting the failure handler):
//! that list is the document's order, and nothing ever reorders it. The rules
//! (actions without an id have no order to keep):
//! - **Coalescing** (`coalesce = true`): a queued action that a newer action on the
//!   same document makes irrelevant ([`Supersedes::supersedes`]) is not sent, so a request
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
//!   successor is written (a replaced action the target would have refused is not
//!   dead-lettered).
//! - **Intake**: set-aside actions count with queued ones toward the intake limit
//!   ([`Batcher::has_room`], [`INTAKE_REQUESTS`] × `max_actions`), since a refusal
//!   puts them back to be sent: a flush needs at most a few requests' worth.
//! - **Order**: a document is sent only when none of its actions is in a request,
//!   awaiting a retry or awaiting the failure handler. A request carries its first
//!   queued action plus the following ones while each supersedes the one before it
//!   (a target applies the items of one document in request order) — or only the
//!   first with [`Limits::one_action_per_document`], so that no later action of a
//!   document is applied while an earlier one may be refused and not yet settled.
//! - **Partial failure**: a retriable failure followed, in the same request, by a
//!   written action that supersedes it is not retried ([`Resolution::Superseded`]). A
//!   retried action keeps its place in the list; with coalescing, one that the queued
//!   action behind it supersedes is set aside by that action, as a queued one would be
//!   (resolved as superseded once that action is written) — except with one action
//!   per document, where every action sent is resolved before the next one of its
//!   document is sent (a retried action is then never set aside, by a retry coming
//!   due or by a newer action added).
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

use super::outcome::{Outcome, RequestOutcome};
use crate::clients::backoff::backoff;
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
    /// A request carries at most one action per document, so a later action on a
    /// document is sent only once every earlier one is resolved: written, or settled
    /// by the failure handler (a dead letter acknowledged). Needed where the target
    /// answers a replayed action by comparing it with the document's newest write
    /// (Elasticsearch's 409 under external versions): that answer then says the earlier
    /// action was written or settled, never that it was refused and the refusal lost.
    /// It bounds a document to one write per round trip when writes are not coalesced.
    pub one_action_per_document: bool,
    pub retry_max_attempts: u32,
    pub retry_initial_ms: u64,
    pub retry_max_ms: u64,
}

pub use super::outcome::ItemFailure;

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
    /// The job cannot go on (authorization, a request the target cannot parse, or a
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
    /// Every item was written (Elasticsearch: `errors: false`), with this many
    /// item results (a count that differs from the request's retries it whole).
    Written(usize),
    /// Item results by position.
    Items(Vec<ItemResult>),
    /// No item results: what the request's failure means, and why.
    Failed(RequestOutcome, String),
}

/// What an action does to its document, as far as the batcher needs to know (the
/// Elasticsearch sink: `coalesce::Effect`).
pub trait Supersedes: Clone + PartialEq + std::fmt::Debug {
    /// Whether `self`, applied after `older` on the same document, makes `older`
    /// irrelevant: for every state of the document, applying both leaves what applying
    /// `self` alone leaves. Must be transitive: the batcher relies on it when a later
    /// action overtakes a chain of set-aside ones. `false` is always safe (nothing is
    /// coalesced).
    fn supersedes(&self, older: &Self) -> bool;
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
enum State<E> {
    Queued,
    InFlight,
    Retrying,
    /// Refused, awaiting the failure handler. `overtaken`: the effect of a later action
    /// on the document written in the same request.
    Refused {
        overtaken: Option<E>,
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

struct Entry<T, E> {
    /// The entry's document, an index into `groups`.
    group: usize,
    effect: E,
    bytes: usize,
    attempts: u32,
    state: State<E>,
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
pub struct Batcher<T, E> {
    limits: Limits,
    entries: Vec<Option<Entry<T, E>>>,
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

/// What the batcher and the processor hold for one action besides the bytes the target
/// encodes (its entry, with the item inline; its place in its document's list; the
/// document's group and key; its resolution once resolved): a target adds it per action
/// to a batch's `bytes`, and the processor to what the batcher holds, so that
/// `buffer_max_bytes` bounds the memory actions take, not only their request lines,
/// while a request's `max_bytes` still counts its lines. A small action's bookkeeping
/// is as large as its lines. (A slice of a batch's buffer keeps that whole buffer
/// alive until its last action is resolved; the count is of the slices.)
pub fn bookkeeping_bytes<T, E>() -> usize {
    use std::mem::size_of;
    size_of::<Option<Entry<T, E>>>()
        + size_of::<Resolution<T>>()
        + size_of::<Option<Group>>()
        // The document map's entry (key, group, and the map's control byte and slack).
        + 2 * size_of::<(DocKey, usize)>()
        // Free lists, the ready queue, a request's slot list.
        + 4 * size_of::<usize>()
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

impl<T, E: Supersedes> Batcher<T, E> {
    /// An empty batcher; `now_ms` starts the interval clock.
    pub fn new(limits: Limits, now_ms: u64) -> Batcher<T, E> {
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

    /// Whether no document is known any more (every action resolved and forgotten).
    #[doc(hidden)]
    pub fn holds_no_document(&self) -> bool {
        self.docs.is_empty() && self.groups.iter().all(Option::is_none)
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

    fn entry(&self, slot: usize) -> &Entry<T, E> {
        self.entries[slot].as_ref().expect("a live entry")
    }

    fn entry_mut(&mut self, slot: usize) -> &mut Entry<T, E> {
        self.entries[slot].as_mut().expect("a live entry")
    }

    fn group(&self, g: usize) -> &Group {
        self.groups[g].as_ref().expect("a live group")
    }

    fn group_mut(&mut self, g: usize) -> &mut Group {
        self.groups[g].as_mut().expect("a live group")
    }

    fn insert(&mut self, e: Entry<T, E>) -> usize {
        self.pending += 1;
        self.held_bytes += e.bytes;
        slab_insert(&mut self.entries, &mut self.free, e)
    }

    /// Takes an entry out of its group and out of `pending`, leaving the group as it
    /// is (the caller calls `make_ready`); returns the entry.
    fn detach(&mut self, slot: usize) -> Entry<T, E> {
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
    fn remove_unwritten(&mut self, slot: usize, later: Option<&E>) -> T {
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
    fn take_set_aside(&mut self, slot: usize) -> Entry<T, E> {
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
    fn supersedes_list(&self, later: &E, list: Chain) -> bool {
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
    /// what `slot` set aside ([`Supersedes::supersedes`] is transitive): that is moot
    /// instead.
    fn fall_back(&mut self, slot: usize, later: Option<&E>) {
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
    fn set_state(&mut self, slot: usize, state: State<E>) {
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
    pub fn add(&mut self, doc: Option<String>, effect: E, bytes: usize, payload: T) {
        self.add_doc(doc.map(DocKey::from), effect, bytes, payload);
    }

    /// [`Batcher::add`] with the document's key as the caller encodes it.
    pub fn add_doc(&mut self, doc: Option<DocKey>, effect: E, bytes: usize, payload: T) {
        let g = self.group_of(doc);
        let mut replaced = None;
        if self.limits.coalesce {
            // Only a queued tail is coalesced: an action that left the queue (in a
            // request, awaiting a retry or a handler) keeps its place.
            while let Some(&s) = self.group(g).items.as_slice().last() {
                let older = self.entry(s);
                // With one action per document, a retried action (sent, so perhaps
                // already refused) is resolved before anything later is sent.
                if older.state != State::Queued
                    || older.restored
                    || (older.retried && self.limits.one_action_per_document)
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
        effect: E,
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
    pub fn requeue(&mut self, refusal: Refusal, replacements: Vec<(Option<String>, E, usize, T)>) {
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
        replacements: Vec<(Option<DocKey>, E, usize, T)>,
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
        // on its document if that one supersedes it all ([`Supersedes::supersedes`] is
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

    /// Retries due at `now_ms` become queued again, in place. With coalescing (and not
    /// [`Limits::one_action_per_document`]), one that the queued action behind it makes
    /// irrelevant is set aside by that action instead (resolved as superseded once it
    /// is written, back in its place if not).
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
            // A retry may already be applied or refused: with one action per document
            // it is resolved before anything later on its document is sent, so it is
            // sent again rather than set aside.
            let superseded = self.limits.coalesce
                && !self.limits.one_action_per_document
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
            // The first action, and those after it that each supersede the one before
            // (unless the target needs an action settled before the next is sent).
            let mut take = 1;
            let mut take_bytes = self.entry(items[0]).bytes;
            while !self.limits.one_action_per_document && take < items.len() {
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
        let mut written_later: Vec<Option<E>> = vec![None; batch.len()];
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
    fn refuse(&mut self, slot: usize, failure: ItemFailure, overtaken: Option<E>) {
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
            self.refuse(batch[0], ItemFailure::too_large(why), None);
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
pub(crate) mod tests;
