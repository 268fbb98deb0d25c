//! Bulk actions to NDJSON, the way they are held until written: the lines of every
//! action of a batch of records go into one buffer, and each action keeps a slice of it
//! (a reference count, not a copy). A record thus costs no allocation of its own on its
//! way into a request: the bulk processor copies each action's lines once, into the
//! request's body, and hands the client that one buffer.
//!
//! The document key the batcher orders by is a slice of the action line too (its
//! `"_index":...,"_id":...`): JSON escaping is one-to-one, so two keys are equal exactly
//! when the index and the id are.
//!
//! Every body goes into a request only as one line of a JSON object ([`frame`]); an
//! action that cannot (an invalid record, a body that is not a JSON object) is kept
//! whole for the failure handler, as a document Elasticsearch refused would be.

use super::action::{frame, BulkAction, OpType};
use super::batcher::DocKey;
use super::coalesce::{Effect, Shapes};
use super::params::ActionParams;
use crate::error::Result;
use crate::kits::bulk::{BulkEncoder, LetterParts};
use crate::record::Origin;
use bytes::Bytes;
use std::ops::Range;

/// The smallest and the largest capacity a new batch buffer starts with (a batch larger
/// than the largest grows its buffer).
const MIN_BUFFER: usize = 4 << 10;
const MAX_BUFFER: usize = 1 << 20;

/// A document id as it is written into an action line.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Id<'a> {
    Str(&'a str),
    /// `{stream}-{partition}-{offset}`, written without being formatted first.
    Coordinates(&'a str, i32, i64),
}

impl Id<'_> {
    fn write(self, buf: &mut Vec<u8>) {
        match self {
            Id::Str(s) => json_string(buf, s),
            Id::Coordinates(stream, partition, offset) => {
                // The escaped stream without its closing quote; the rest needs no escape.
                json_string(buf, stream);
                buf.pop();
                buf.push(b'-');
                json_number(buf, partition);
                buf.push(b'-');
                json_number(buf, offset);
                buf.push(b'"');
            }
        }
    }
}

/// Writes an action line (`{"index":{"_index":...,"_id":...}}` and its newline) and
/// returns where the document's key is in `buf`, if the action has an id.
pub(crate) fn action_line(
    buf: &mut Vec<u8>,
    op: OpType,
    index: &str,
    id: Option<Id<'_>>,
    version: Option<i64>,
    params: &ActionParams,
) -> Option<Range<usize>> {
    buf.extend_from_slice(b"{\"");
    buf.extend_from_slice(op.name().as_bytes());
    buf.extend_from_slice(b"\":{");
    let key_start = buf.len();
    buf.extend_from_slice(b"\"_index\":");
    json_string(buf, index);
    let key = id.map(|id| {
        buf.extend_from_slice(b",\"_id\":");
        id.write(buf);
        key_start..buf.len()
    });
    // Not part of the key: the same id under two routings may be one document (one
    // shard), so its writes are ordered whatever their routing (and with routing, no
    // write is coalesced away: see `EsSinkConfig::coalesces`).
    if let Some(r) = &params.routing {
        buf.extend_from_slice(b",\"routing\":");
        json_string(buf, r);
    }
    if let Some(v) = version {
        buf.extend_from_slice(b",\"version\":");
        json_number(buf, v);
        buf.extend_from_slice(b",\"version_type\":\"external\"");
    }
    if let Some(p) = &params.pipeline {
        buf.extend_from_slice(b",\"pipeline\":");
        json_string(buf, p);
    }
    if params.require_alias {
        buf.extend_from_slice(b",\"require_alias\":true");
    }
    buf.extend_from_slice(b"}}\n");
    key
}

/// The body of an upsert of `doc` (`{"doc":...,"doc_as_upsert":true}`), as
/// [`BulkAction::upsert`] makes it; returns where `doc` is in `buf`.
pub(crate) fn upsert_body(buf: &mut Vec<u8>, doc: &[u8]) -> Range<usize> {
    buf.extend_from_slice(UPSERT_PREFIX);
    let start = buf.len();
    buf.extend_from_slice(doc);
    let end = buf.len();
    buf.extend_from_slice(UPSERT_SUFFIX);
    start..end
}

const UPSERT_PREFIX: &[u8] = b"{\"doc\":";
const UPSERT_SUFFIX: &[u8] = b",\"doc_as_upsert\":true}";

/// The `doc` of a body [`upsert_body`] wrote, if `body` is one.
fn upsert_doc(body: &[u8]) -> Option<&[u8]> {
    body.strip_prefix(UPSERT_PREFIX)?
        .strip_suffix(UPSERT_SUFFIX)
}

pub(crate) fn json_string(buf: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(buf, s).expect("writing to a Vec cannot fail");
}

fn json_number(buf: &mut Vec<u8>, n: impl serde::Serialize) {
    serde_json::to_writer(buf, &n).expect("writing to a Vec cannot fail");
}

/// What a failure handler and a dead letter get as the record, besides the body.
#[derive(Debug, Clone, PartialEq)]
enum Original {
    /// Nothing besides the body: the body is the record, or the action was built
    /// without one.
    None,
    /// At this range of the lines (the `doc` of an upsert).
    At(Range<usize>),
    /// Its own copy (the record was re-serialized on one line).
    Copy(Bytes),
}

/// One encoded action, held by the bulk processor until it is resolved.
#[derive(Debug)]
pub(crate) struct Item {
    /// The action's NDJSON lines.
    pub lines: Bytes,
    /// Where the body is in `lines`.
    body: Option<Range<usize>>,
    original: Original,
    pub op: OpType,
    pub version: Option<i64>,
    pub origin: Option<Origin>,
    /// Its lines are still a slice of its batch's buffer.
    pinned: bool,
}

impl Item {
    /// Gives the item its own copy of its lines, so that it no longer keeps the
    /// buffer of its whole batch alive (an action that stays: retried, refused).
    /// Copies once: an item already unpinned is left as it is.
    pub fn unpin(&mut self) {
        if !self.pinned {
            return;
        }
        self.pinned = false;
        self.lines = Bytes::copy_from_slice(&self.lines);
        if let Original::Copy(b) = &mut self.original {
            *b = Bytes::copy_from_slice(b);
        }
    }

    /// The action as it was built, body included (for the failure handler and dead
    /// letters; a rare path, so the index and id are read back from the action line).
    pub fn full_action(&self) -> BulkAction {
        let end = self
            .lines
            .iter()
            .position(|&b| b == b'\n')
            .unwrap_or(self.lines.len());
        let line: serde_json::Value = serde_json::from_slice(&self.lines[..end])
            .expect("an action line lockgate wrote is JSON");
        let meta = line.as_object().and_then(|o| o.values().next());
        let field = |k: &str| {
            meta.and_then(|m| m.get(k))
                .and_then(serde_json::Value::as_str)
                .map(String::from)
        };
        BulkAction {
            op: self.op,
            index: field("_index").unwrap_or_default(),
            id: field("_id"),
            version: self.version,
            body: self.body.clone().map(|r| self.lines[r].to_vec()),
            origin: self.origin.clone(),
            record: match &self.original {
                Original::None => None,
                Original::At(r) => Some(self.lines[r.clone()].to_vec()),
                Original::Copy(b) => Some(b.to_vec()),
            },
            invalid: None,
            params: ActionParams {
                routing: field("routing"),
                pipeline: field("pipeline"),
                require_alias: meta
                    .and_then(|m| m.get("require_alias"))
                    .and_then(serde_json::Value::as_bool)
                    .unwrap_or(false),
            },
        }
    }
}

/// An action ready for the batcher: the item, its document, its effect on it.
pub(crate) type Encoded = crate::kits::bulk::Encoded<EsEncoder>;

/// What the encoder made of one action (an invalid one: the failure handler decides).
pub(crate) type Added = crate::kits::bulk::Added<EsEncoder>;

/// The actions of one batch of records, for the bulk processor; `bytes` is what
/// `buffer_max_bytes` counts for them: for each encoded one its lines, its own copy of
/// its record and the processor's bookkeeping; an estimate for the others.
pub(crate) type EncodedBatch = crate::kits::bulk::EncodedBatch<EsEncoder>;

/// Bulk actions as the bulk kit's encoder: an [`Encoder`] per batch of actions, and an
/// action back from what the batcher holds of it.
pub(crate) struct EsEncoder;

impl BulkEncoder for EsEncoder {
    type Item = Item;
    type Effect = Effect;
    type Action = BulkAction;

    fn encode(&self, actions: Vec<BulkAction>) -> EncodedBatch {
        let mut encoder = Encoder::new();
        for a in actions {
            encoder.push(a);
        }
        encoder.take_batch()
    }

    fn action(&self, item: &Item) -> BulkAction {
        item.full_action()
    }

    fn describe(&self, action: &BulkAction) -> String {
        action.describe()
    }

    fn unpin(&self, item: &mut Item) {
        item.unpin()
    }

    /// The record as it came (or, if the action kept none, its body), where it came
    /// from, and the index and id it was meant for.
    fn letter<'a>(&self, action: &'a BulkAction) -> LetterParts<'a> {
        LetterParts {
            payload: action
                .record
                .as_deref()
                .or(action.body.as_deref())
                .unwrap_or_default(),
            key: None,
            origin: action
                .origin
                .as_ref()
                .map(|o| (&*o.stream, o.partition, o.offset)),
            target: Some((&action.index, action.id.as_deref().unwrap_or_default())),
        }
    }
}

/// An encoded action before its batch's buffer is frozen: ranges of the buffer.
struct Pending {
    lines: Range<usize>,
    /// The rest are relative to `lines.start`.
    key: Option<Range<usize>>,
    body: Option<Range<usize>>,
    original: Original,
    op: OpType,
    version: Option<i64>,
    origin: Option<Origin>,
    effect: Effect,
}

enum Slot {
    Pending(Pending),
    Invalid(BulkAction, String),
}

/// The body of an action the fast path writes.
pub(crate) enum Body<'a> {
    /// The record, as it is (already one line of a JSON object).
    Record(&'a [u8]),
    /// An upsert whose `doc` is the record, as it is.
    UpsertOf(&'a [u8]),
}

/// Encodes the actions of a batch of records into one buffer (see the module
/// documentation). An [`ActionBuilder`](super::action::ActionBuilder) appends to it;
/// the sink hands what it holds to the bulk processor after each batch.
#[derive(Default)]
pub struct Encoder {
    buf: Vec<u8>,
    slots: Vec<Slot>,
    /// What `buffer_max_bytes` counts for the invalid actions held.
    invalid_bytes: usize,
    /// Encoded actions held, and the bytes of their own copies of their records.
    encoded: usize,
    copies: usize,
    /// Reused by builders that build [`BulkAction`]s first.
    scratch: Vec<BulkAction>,
    /// Upserts of one shape share it.
    shapes: Shapes,
}

/// What `buffer_max_bytes` counts for an encoded action beyond its own bytes: the bulk
/// processor's bookkeeping for it (its entry holds the item).
fn held_per_action() -> usize {
    crate::kits::bulk::bookkeeping_bytes::<Item, Effect>()
}

impl Encoder {
    /// An empty encoder.
    pub fn new() -> Encoder {
        Encoder::default()
    }

    /// Actions added since the last batch was taken.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no action was added since the last batch was taken.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// What `buffer_max_bytes` counts for the actions added since the last batch was
    /// taken: for an encoded one its lines, its own copy of its record and what the
    /// processor holds for it; an estimate for the others.
    pub fn bytes(&self) -> usize {
        self.buf.len() + self.copies + self.invalid_bytes + self.encoded * held_per_action()
    }

    fn push_invalid(&mut self, action: BulkAction, why: String) {
        self.invalid_bytes += request_bytes(&action);
        self.slots.push(Slot::Invalid(action, why));
    }

    /// Adds an action. One that cannot go into a request (it is
    /// [`invalid`](BulkAction::invalid), or its body is not a JSON object) is kept
    /// whole, for the failure handler; a pretty-printed body is re-serialized on one
    /// line.
    pub fn push(&mut self, mut action: BulkAction) {
        if let Some(why) = action.invalid.take() {
            self.push_invalid(action, why);
            return;
        }
        if let Some(body) = &action.body {
            match frame(body) {
                Ok(None) => {}
                Ok(Some(compact)) => action.body = Some(compact),
                Err(why) => {
                    let why = format!("{}: {why}", action.describe());
                    self.push_invalid(action, why);
                    return;
                }
            }
        }
        let effect = Effect::of_shared(
            action.op,
            action.version,
            action.body.as_deref(),
            &mut self.shapes,
        );
        let start = self.buf.len();
        let key = action_line(
            &mut self.buf,
            action.op,
            &action.index,
            action.id.as_deref().map(Id::Str),
            action.version,
            &action.params,
        );
        let body = action.body.as_ref().map(|b| {
            let at = self.buf.len();
            self.buf.extend_from_slice(b);
            self.buf.push(b'\n');
            at - start..at - start + b.len()
        });
        let original = match action.record {
            None => Original::None,
            Some(r)
                if body
                    .as_ref()
                    .is_some_and(|b| self.buf[start..][b.clone()] == r[..]) =>
            {
                // Dead letters fall back to the body, which is the same bytes.
                Original::None
            }
            // The `doc` of an upsert built around the record: where the direct path
            // points too, so the record is held once.
            Some(r)
                if body
                    .as_ref()
                    .is_some_and(|b| upsert_doc(&self.buf[start..][b.clone()]) == Some(&r[..])) =>
            {
                let b = body.clone().expect("a body");
                let at = b.start + UPSERT_PREFIX.len();
                Original::At(at..at + r.len())
            }
            Some(r) => Original::Copy(Bytes::from(r)),
        };
        if let Original::Copy(b) = &original {
            self.copies += b.len();
        }
        self.encoded += 1;
        self.slots.push(Slot::Pending(Pending {
            lines: start..self.buf.len(),
            key: key.map(|k| k.start - start..k.end - start),
            body,
            original,
            op: action.op,
            version: action.version,
            origin: action.origin,
            effect,
        }));
    }

    /// Adds the actions `build` makes (a builder's [`BulkAction`]s).
    pub fn push_built(
        &mut self,
        build: impl FnOnce(&mut Vec<BulkAction>) -> Result<()>,
    ) -> Result<()> {
        let mut actions = std::mem::take(&mut self.scratch);
        let built = build(&mut actions);
        for a in actions.drain(..) {
            self.push(a);
        }
        self.scratch = actions;
        built
    }

    /// Adds an action written straight into the buffer: the same lines [`push`]
    /// writes for the same action, without building it first. `reframed` is the
    /// record re-serialized on one line, when it was not ([`frame`]), which the
    /// request then carries in its place.
    ///
    /// With `keyless`, the action gets no document key: the caller knows that no other
    /// action of the sink's life names its document (a coordinates id when origins are
    /// unique, see [`ConfigActionBuilder::origins_unique`]), so the batcher has no order
    /// to keep for it and spares the per-document bookkeeping.
    ///
    /// [`ConfigActionBuilder::origins_unique`]: super::ConfigActionBuilder::origins_unique
    ///
    /// [`push`]: Encoder::push
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn push_lines(
        &mut self,
        op: OpType,
        index: &str,
        (id, keyless): (Id<'_>, bool),
        version: Option<i64>,
        body: Body<'_>,
        reframed: Option<Vec<u8>>,
        origin: Option<Origin>,
    ) {
        let start = self.buf.len();
        let (record, upsert) = match body {
            Body::Record(r) => (r, false),
            Body::UpsertOf(r) => (r, true),
        };
        let doc = reframed.as_deref().unwrap_or(record);
        self.buf.reserve(doc.len() + 128);
        let key = action_line(
            &mut self.buf,
            op,
            index,
            Some(id),
            version,
            &ActionParams::default(),
        )
        .filter(|_| !keyless);
        let at = self.buf.len();
        let doc_at = if upsert {
            upsert_body(&mut self.buf, doc)
        } else {
            self.buf.extend_from_slice(doc);
            at..self.buf.len()
        };
        let body = at - start..self.buf.len() - start;
        self.buf.push(b'\n');
        let effect = match op {
            OpType::Index => Effect::Replace { version },
            OpType::Delete => Effect::Delete { version },
            OpType::Update | OpType::Create => Effect::of_shared(
                op,
                version,
                Some(&self.buf[start..][body.clone()]),
                &mut self.shapes,
            ),
        };
        let original = match (reframed.is_some(), upsert) {
            (true, _) => Original::Copy(Bytes::copy_from_slice(record)),
            (false, true) => Original::At(doc_at.start - start..doc_at.end - start),
            (false, false) => Original::None,
        };
        if let Original::Copy(b) = &original {
            self.copies += b.len();
        }
        self.encoded += 1;
        self.slots.push(Slot::Pending(Pending {
            lines: start..self.buf.len(),
            key: key.map(|k| k.start - start..k.end - start),
            body: Some(body),
            original,
            op,
            version,
            origin,
            effect,
        }));
    }

    /// Takes what was added since the last call: the buffer is frozen once, and each
    /// action gets its slices of it.
    pub(crate) fn take_batch(&mut self) -> EncodedBatch {
        let bytes = self.bytes();
        self.invalid_bytes = 0;
        self.encoded = 0;
        self.copies = 0;
        // The frozen buffer lives as long as any of its actions, and the byte budget
        // counts what is written, not what is allocated: it is frozen without spare
        // capacity, and the next one is sized from this batch, not from the largest.
        let used = self.buf.len();
        if self.buf.capacity() > 2 * used.max(MIN_BUFFER) {
            self.buf.shrink_to_fit();
        }
        let next = Vec::with_capacity(used.clamp(MIN_BUFFER, MAX_BUFFER));
        let buf = Bytes::from(std::mem::replace(&mut self.buf, next));
        let actions = self
            .slots
            .drain(..)
            .map(|slot| match slot {
                Slot::Pending(p) => {
                    let lines = buf.slice(p.lines);
                    let copy = match &p.original {
                        Original::Copy(b) => b.len(),
                        Original::None | Original::At(_) => 0,
                    };
                    Added::Encoded(Encoded {
                        bytes: lines.len() + copy,
                        doc: p.key.map(|k| DocKey::new(lines.slice(k))),
                        item: Item {
                            lines,
                            body: p.body,
                            original: p.original,
                            op: p.op,
                            version: p.version,
                            origin: p.origin,
                            pinned: true,
                        },
                        effect: p.effect,
                    })
                }
                Slot::Invalid(action, why) => Added::Invalid(action, why),
            })
            .collect();
        EncodedBatch { actions, bytes }
    }
}

/// What `buffer_max_bytes` counts for an action that never goes into a request: its
/// body, its record, its index and id, and a fixed estimate for the rest.
fn request_bytes(action: &BulkAction) -> usize {
    action.body.as_ref().map_or(0, Vec::len)
        + action.record.as_ref().map_or(0, Vec::len)
        + action.index.len()
        + action.id.as_ref().map_or(0, String::len)
        + 64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::elasticsearch::action::{ActionBuilder, ConfigActionBuilder};
    use crate::connectors::elasticsearch::config::{
        EsSinkConfig, IdStrategy, NullValue, Operation, Versioning,
    };
    use crate::record::Record;
    use std::sync::Arc;

    /// What the bulk processor gets of an action, in a form tests compare.
    #[derive(Debug, PartialEq)]
    enum Seen {
        Encoded {
            lines: String,
            doc: Option<Vec<u8>>,
            effect: Effect,
            action: BulkAction,
        },
        Invalid(BulkAction, String),
    }

    fn seen(batch: EncodedBatch) -> (Vec<Seen>, usize) {
        let seen = batch
            .actions
            .into_iter()
            .map(|a| match a {
                Added::Encoded(e) => Seen::Encoded {
                    lines: String::from_utf8(e.item.lines.to_vec()).unwrap(),
                    doc: e.doc.map(|d| d.as_bytes().to_vec()),
                    effect: e.effect,
                    action: e.item.full_action(),
                },
                Added::Invalid(a, why) => Seen::Invalid(a, why),
            })
            .collect();
        (seen, batch.bytes)
    }

    /// [`seen`], without document keys when `keyless`: a built action keeps its key
    /// while a direct one with unique origins has none (see [`Encoder::push_lines`]);
    /// every other part must be the same.
    fn seen_as(keyless: bool, batch: EncodedBatch) -> (Vec<Seen>, usize) {
        let (mut v, bytes) = seen(batch);
        if keyless {
            for s in &mut v {
                if let Seen::Encoded { doc, .. } = s {
                    *doc = None;
                }
            }
        }
        (v, bytes)
    }

    fn records() -> Vec<Record> {
        let values: [&[u8]; 6] = [
            br#"{"user":"u7","n":3}"#,
            b"{\n  \"user\": \"u7\",\n  \"n\": 3\n}",
            br#"{"user":"u\"7\u00e9","deep":{"a":[1,2]}}"#,
            br#"{"user":"u7"},"script":{"source":"ctx._source.n = 0"},"x":{"a":1}"#,
            b"not json",
            b"",
        ];
        let keys: [Option<&[u8]>; 4] = [
            Some(b"user-7"),
            Some("qu\"o\\te\u{1}\u{e9}".as_bytes()),
            Some(&[0xff, 0xfe]),
            None,
        ];
        let origins = [
            Some(Origin {
                stream: Arc::from("orders"),
                partition: 2,
                offset: 41,
            }),
            Some(Origin {
                stream: Arc::from("we\"ird\\top\nic"),
                partition: -1,
                offset: -7,
            }),
            None,
        ];
        let mut out = Vec::new();
        for (i, v) in values.iter().enumerate() {
            for k in &keys {
                for o in &origins {
                    for tombstone in [false, true] {
                        if tombstone && i > 0 {
                            continue;
                        }
                        out.push(Record {
                            key: k.map(Bytes::copy_from_slice),
                            value: if tombstone {
                                Bytes::new()
                            } else {
                                Bytes::copy_from_slice(v)
                            },
                            origin: o.clone(),
                            timestamp: Some(1_772_874_302_123),
                            tombstone,
                            ..Default::default()
                        });
                    }
                }
            }
        }
        out
    }

    fn configs() -> Vec<EsSinkConfig> {
        let mut out = Vec::new();
        for id in [
            IdStrategy::Coordinates,
            IdStrategy::Key,
            IdStrategy::Field("/user".into()),
        ] {
            for operation in [Operation::Index, Operation::Create, Operation::Upsert] {
                for versioning in [Versioning::None, Versioning::External] {
                    for index in ["idx", "idx-{yyyy}"] {
                        out.push(EsSinkConfig {
                            id: id.clone(),
                            operation,
                            versioning,
                            on_null_value: Some(NullValue::Delete),
                            ..EsSinkConfig::new("http://x", index)
                        });
                    }
                }
            }
        }
        out
    }

    #[test]
    fn writing_an_action_directly_encodes_what_building_it_encodes() {
        let mut direct_cases = 0;
        for (cfg, unique) in configs()
            .into_iter()
            .flat_map(|c| [(c.clone(), false), (c, true)])
        {
            let keyless = unique && cfg.id == IdStrategy::Coordinates;
            for r in records() {
                let mut direct = ConfigActionBuilder::new(&cfg);
                direct.origins_unique = unique;
                let mut built = ConfigActionBuilder::new(&cfg);
                let (mut a, mut b) = (Encoder::new(), Encoder::new());
                if direct.encode_direct(&r, &mut Encoder::new()) {
                    direct_cases += 1;
                }
                let ra = direct.encode(&r, &mut a).map_err(|e| e.to_string());
                let rb = b
                    .push_built(|v| built.build(&r, v))
                    .map_err(|e| e.to_string());
                assert_eq!(ra, rb, "{cfg:?}\n{r:?}");
                assert_eq!(a.bytes(), b.bytes(), "{cfg:?}\n{r:?}");
                assert_eq!(
                    seen_as(keyless, a.take_batch()),
                    seen_as(keyless, b.take_batch()),
                    "{cfg:?}\n{r:?}"
                );
            }
        }
        assert!(
            direct_cases > 100,
            "the direct path was taken {direct_cases} times"
        );
    }

    #[test]
    fn an_item_gives_back_the_action_it_was_made_of() {
        let with_record = |mut a: BulkAction, record: &[u8]| {
            a.record = Some(record.to_vec());
            a
        };
        let doc = br#"{"n":3}"#;
        let cases = [
            // The record is the body: it is not kept twice.
            (
                with_record(BulkAction::index("i", Some("d".into()), doc.to_vec()), doc),
                None,
            ),
            (
                with_record(BulkAction::upsert("i", "d\"q".into(), doc), doc),
                Some(doc.to_vec()),
            ),
            (
                BulkAction {
                    version: Some(9),
                    ..BulkAction::delete("i", "d".into())
                },
                None,
            ),
            (BulkAction::index("i", None, doc.to_vec()), None),
        ];
        let mut e = Encoder::new();
        for (a, _) in &cases {
            e.push(a.clone());
        }
        let pretty = b"{\n \"n\": 3\n}";
        e.push(with_record(
            BulkAction::index("i", Some("d".into()), pretty.to_vec()),
            pretty,
        ));
        let batch = e.take_batch();
        assert_eq!(batch.actions.len(), 5);
        for (i, added) in batch.actions.into_iter().enumerate() {
            let Added::Encoded(mut enc) = added else {
                panic!("action {i} was not encoded")
            };
            let want = match cases.get(i) {
                Some((a, record)) => BulkAction {
                    record: record.clone(),
                    ..a.clone()
                },
                // Re-serialized on one line; the record as it came is kept.
                None => with_record(
                    BulkAction::index("i", Some("d".into()), doc.to_vec()),
                    pretty,
                ),
            };
            assert_eq!(enc.item.full_action(), want, "action {i}");
            let mut lines = Vec::new();
            want.encode(&mut lines);
            assert_eq!(enc.item.lines, lines, "action {i}");
            enc.item.unpin();
            assert_eq!(enc.item.full_action(), want, "action {i}, unpinned");
        }
    }

    #[test]
    fn a_batch_buffer_is_sized_from_the_last_batch_not_the_largest() {
        let mut e = Encoder::new();
        let big = vec![b'x'; 600 << 10];
        for _ in 0..4 {
            let doc = [b"{\"p\":\"".as_slice(), &big, b"\"}"].concat();
            e.push(BulkAction::index("i", Some("d".into()), doc));
        }
        let batch = e.take_batch();
        assert!(batch.bytes > 2 << 20);
        assert_eq!(
            e.buf.capacity(),
            MAX_BUFFER,
            "a large batch: the largest start"
        );
        e.push(BulkAction::index("i", Some("d".into()), b"{}".to_vec()));
        drop(e.take_batch());
        assert_eq!(
            e.buf.capacity(),
            MIN_BUFFER,
            "a tiny batch after a large one: a small buffer again"
        );
        drop(batch);
    }

    #[test]
    fn document_keys_are_equal_exactly_when_index_and_id_are() {
        let key = |index: &str, id: &str| {
            let mut e = Encoder::new();
            e.push(BulkAction::index(index, Some(id.into()), b"{}".to_vec()));
            match e.take_batch().actions.pop() {
                Some(Added::Encoded(enc)) => enc.doc.expect("a key"),
                _ => panic!("not encoded"),
            }
        };
        assert_eq!(key("i", "d"), key("i", "d"), "from two buffers");
        let direct = |id: Id<'_>, keyless: bool| {
            let mut e = Encoder::new();
            e.push_lines(
                OpType::Index,
                "i",
                (id, keyless),
                Some(5),
                Body::Record(b"{}"),
                None,
                None,
            );
            let Some(Added::Encoded(enc)) = e.take_batch().actions.pop() else {
                panic!("not encoded")
            };
            enc.doc
        };
        assert_eq!(
            direct(Id::Coordinates("s", 1, 2), false),
            Some(key("i", "s-1-2")),
            "version is not part of it"
        );
        assert_eq!(direct(Id::Coordinates("s", 1, 2), true), None, "keyless");
        let distinct = [
            ("i", "d"),
            ("i", "e"),
            ("j", "d"),
            ("i\",\"_id\":\"d", ""),
            ("i", "d\""),
        ];
        for (n, a) in distinct.iter().enumerate() {
            for b in &distinct[n + 1..] {
                assert_ne!(key(a.0, a.1), key(b.0, b.1), "{a:?} {b:?}");
            }
        }
    }

    /// An unpinned item holds its lines in bytes of its own: it no longer keeps its
    /// batch's buffer alive, and still gives back the same action.
    #[test]
    fn an_unpinned_item_no_longer_shares_its_batch_buffer_and_is_copied_once() {
        let mut e = Encoder::new();
        for id in ["a", "b"] {
            e.push(BulkAction::index("i", Some(id.into()), b"{}".to_vec()));
        }
        let mut items: Vec<Item> = e
            .take_batch()
            .actions
            .into_iter()
            .map(|a| match a {
                Added::Encoded(enc) => enc.item,
                Added::Invalid(..) => panic!("not encoded"),
            })
            .collect();
        let before = items[0].full_action();
        assert!(!items[0].lines.is_unique(), "a slice of the batch buffer");
        items[0].unpin();
        assert!(items[0].lines.is_unique(), "bytes of its own");
        assert_eq!(items[0].full_action(), before);
        let own = items[0].lines.as_ptr();
        items[0].unpin();
        assert_eq!(
            items[0].lines.as_ptr(),
            own,
            "unpinned once: not copied again"
        );
        assert!(
            items[1].lines.is_unique(),
            "the other item alone holds the batch buffer"
        );
    }

    /// `len` and `is_empty` count every action added since the last batch was taken,
    /// encoded or kept whole as invalid.
    #[test]
    fn the_encoder_counts_what_was_added_since_the_last_batch() {
        let mut e = Encoder::new();
        assert_eq!((e.len(), e.is_empty()), (0, true));
        e.push(BulkAction::index("i", Some("d".into()), b"{}".to_vec()));
        assert_eq!((e.len(), e.is_empty()), (1, false));
        e.push(BulkAction::index(
            "i",
            Some("d".into()),
            b"not json".to_vec(),
        ));
        e.push(BulkAction::index("i", None, b"{}".to_vec()));
        assert_eq!((e.len(), e.is_empty()), (3, false));
        assert_eq!(e.take_batch().actions.len(), 3);
        assert_eq!((e.len(), e.is_empty()), (0, true));
    }

    /// `bytes` counts an encoded action as its lines, its own copy of its record and
    /// the bookkeeping held for it, and for an action kept whole (which never goes
    /// into a request, but is held all the same) at least its body, within a bounded
    /// overhead; a batch taken carries that count, each action its share, and leaves
    /// the encoder at 0.
    #[test]
    fn bytes_count_what_each_action_holds() {
        let held = held_per_action();
        assert!(
            (64..2048).contains(&held),
            "bookkeeping of {held} bytes per action"
        );
        let mut e = Encoder::new();
        let valid = BulkAction::index("i", Some("d".into()), br#"{"n":1}"#.to_vec());
        let mut lines = Vec::new();
        valid.encode(&mut lines);
        e.push(valid);
        assert_eq!(e.bytes(), lines.len() + held);
        let body = vec![b'x'; 300];
        e.push(BulkAction::index("i", Some("d".into()), body.clone()));
        let invalid = e.bytes() - lines.len() - held;
        assert!(
            (body.len()..body.len() + 1024).contains(&invalid),
            "an invalid action counts {invalid} bytes"
        );
        e.push(BulkAction::index("i", Some("d".into()), body.clone()));
        assert_eq!(e.bytes(), lines.len() + held + 2 * invalid);
        let before = e.bytes();
        let batch = e.take_batch();
        assert_eq!(batch.bytes, before);
        let encoded: usize = batch
            .actions
            .iter()
            .map(|a| match a {
                Added::Encoded(e) => e.bytes,
                Added::Invalid(..) => 0,
            })
            .sum();
        assert_eq!(encoded, lines.len(), "the encoded action's own bytes");
        assert_eq!(e.bytes(), 0);
        e.push(BulkAction::index("i", Some("d".into()), body));
        assert_eq!(e.bytes(), invalid, "nothing of the last batch is counted");
        // A record re-serialized on one line is kept as its own copy: counted too.
        let mut e = Encoder::new();
        let record = b"{\n  \"n\": 1\n}".to_vec();
        let mut a = BulkAction::index("i", Some("d".into()), record.clone());
        a.record = Some(record.clone());
        e.push(a);
        let batch = e.take_batch();
        let Added::Encoded(enc) = &batch.actions[0] else {
            panic!("encoded")
        };
        assert_eq!(enc.bytes, enc.item.lines.len() + record.len());
        assert_eq!(batch.bytes, enc.bytes + held);
    }

    /// The actions of a batch share one buffer: written directly or built, each one
    /// after the first gives back the same lines, key, effect and action as when it is
    /// alone (its ranges are its own, not the buffer's).
    #[test]
    fn actions_sharing_a_buffer_give_back_what_building_them_gives() {
        for (cfg, unique) in configs()
            .into_iter()
            .flat_map(|c| [(c.clone(), false), (c, true)])
        {
            let keyless = unique && cfg.id == IdStrategy::Coordinates;
            let mut direct = ConfigActionBuilder::new(&cfg);
            direct.origins_unique = unique;
            let mut built = ConfigActionBuilder::new(&cfg);
            let (mut a, mut b) = (Encoder::new(), Encoder::new());
            for r in records() {
                let ra = direct.encode(&r, &mut a).map_err(|e| e.to_string());
                let rb = b
                    .push_built(|v| built.build(&r, v))
                    .map_err(|e| e.to_string());
                assert_eq!(ra, rb, "{cfg:?}\n{r:?}");
            }
            assert_eq!(a.bytes(), b.bytes(), "{cfg:?}");
            assert_eq!(
                seen_as(keyless, a.take_batch()),
                seen_as(keyless, b.take_batch()),
                "{cfg:?}"
            );
        }
    }

    /// A frozen batch buffer keeps no large spare capacity: a tiny batch after a large
    /// one does not pin a buffer sized for the large one while its actions live.
    #[test]
    fn a_frozen_buffer_keeps_no_large_spare_capacity() {
        let mut e = Encoder::new();
        let big = vec![b'x'; 600 << 10];
        for _ in 0..2 {
            let doc = [b"{\"p\":\"".as_slice(), &big, b"\"}"].concat();
            e.push(BulkAction::index("i", Some("d".into()), doc));
        }
        drop(e.take_batch());
        assert_eq!(e.buf.capacity(), MAX_BUFFER);
        e.push(BulkAction::index("i", None, b"{}".to_vec()));
        let Some(Added::Encoded(enc)) = e.take_batch().actions.pop() else {
            panic!("not encoded")
        };
        let len = enc.item.lines.len();
        // The item holds the whole buffer alone: taking it back reuses its allocation.
        let held = bytes::BytesMut::from(enc.item.lines);
        assert_eq!(held.len(), len);
        assert!(
            held.capacity() <= 2 * MIN_BUFFER,
            "{} bytes allocated for {len}",
            held.capacity()
        );
    }
}
