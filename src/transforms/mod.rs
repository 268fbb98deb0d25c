//! Record transforms with the names and semantics of Kafka Connect's Single Message
//! Transforms, each an entry of the connector registry (`[[transform]] type = "..."`):
//!
//! | type | Kafka Connect | what it does |
//! |---|---|---|
//! | `insert_field` | `InsertField$Value` | adds static fields and the record's topic, partition, offset, timestamp |
//! | `replace_field` | `ReplaceField$Value` | keeps (`include`) or drops (`exclude`) fields, then renames them |
//! | `extract_field` | `ExtractField$Value` | the record becomes one field's value |
//! | `set_key` | `ValueToKey` + `ExtractField$Key` | the key becomes a field's value, or an object of several |
//! | `cast` | `Cast$Value` | fields to `int8` ... `int64`, `float32`, `float64`, `boolean`, `string` |
//! | `timestamp_converter` | `TimestampConverter$Value` | a time field between epoch ms / s, ISO 8601 and a format |
//! | `flatten` | `Flatten$Value` | nested objects become top-level fields joined by a delimiter |
//! | `mask_field` | `MaskField$Value` | fields replaced by a value, or their type's empty value |
//!
//! Each is a pure function over the record's JSON value and its metadata ([`Smt`]),
//! tested on its own; [`SmtSection`] makes one a stateless step of a job. A record
//! a transform cannot apply to (a value that is not a JSON object, a field that does
//! not cast) fails the job naming the record and the transform, as Kafka Connect's
//! `errors.tolerance = none` does.

#[cfg(test)]
mod chain_tests;
pub mod debezium;
#[cfg(test)]
mod exact_numbers;
pub mod fields;
pub mod filter;
pub mod jq;
pub mod jq_shape;
pub mod set_key;
pub mod shallow;
pub mod time;

use crate::connector::{KeyError, PreparedTransform, SectionContext, Step, TransformSection};
use crate::dead_letter::{Allowed, Letters, LettersOf, OnError, Reason, USE_FAIL_OR_SKIP};
use crate::error::JobError;
use crate::record::{describe, json_kind, Batch, Headers, Op, Record};
use bytes::Bytes;
use serde_json::Value;
use shallow::Fields;
use std::borrow::Cow;
use std::sync::Arc;

/// What a transform may read of a record besides its value.
#[derive(Debug, Clone, Copy, Default)]
pub struct Meta<'a> {
    pub topic: Option<&'a str>,
    pub partition: Option<i32>,
    pub offset: Option<i64>,
    /// Milliseconds since the epoch.
    pub timestamp: Option<i64>,
    /// The record's headers, when the job reads them.
    pub headers: Option<&'a Headers>,
}

impl<'a> Meta<'a> {
    /// The metadata of `record`.
    pub fn of(record: &'a Record) -> Meta<'a> {
        Meta {
            topic: record.origin.as_ref().map(|o| &*o.stream),
            partition: record.origin.as_ref().map(|o| o.partition),
            offset: record.origin.as_ref().map(|o| o.offset),
            timestamp: record.timestamp,
            headers: record.headers.as_deref(),
        }
    }
}

/// A record's value, key and operation as a transform changes them.
#[derive(Debug, Clone, PartialEq)]
pub struct Parts {
    /// The value (`null` for a tombstone).
    pub value: Value,
    /// The key's bytes (a string key is its text).
    pub key: Option<Vec<u8>>,
    /// The record has no value (a Kafka tombstone): transforms of the value pass it
    /// unchanged.
    pub tombstone: bool,
    pub op: Op,
}

impl Parts {
    /// An upsert of `value` without a key.
    pub fn of_value(value: Value) -> Parts {
        Parts {
            value,
            key: None,
            tombstone: false,
            op: Op::Upsert,
        }
    }
}

/// One transform: a pure function of a record's parts and metadata. An error says
/// why the record cannot be transformed.
pub trait Smt: Send + Sync + std::fmt::Debug + 'static {
    /// Changes the record (a transform of the value changes the value alone: the key,
    /// the operation and the headers travel with it).
    fn apply(&self, parts: &mut Parts, meta: &Meta) -> Result<(), String>;

    /// Whether it reads the record's headers ([`Meta::headers`]): the source copies
    /// them only for a job with such a transform.
    fn reads_headers(&self) -> bool {
        false
    }

    /// Whether it may make several records of one (a `jq` program).
    fn several(&self) -> bool {
        false
    }

    /// Whether it may turn a record into a delete (`debezium` with
    /// `delete_handling = "delete"`): a sink then checks that its deletes reach what
    /// its writes wrote.
    fn may_delete(&self) -> bool {
        false
    }

    /// Whether it reads tombstones (`filter` with `is_tombstone`): the source then
    /// passes them on even to a sink that does not say what they mean.
    fn reads_tombstones(&self) -> bool {
        false
    }

    /// What a record it fails on becomes: the job fails (the default, as Kafka
    /// Connect's `errors.tolerance = none`), or the record is skipped or dead-lettered.
    fn on_error(&self) -> &OnError {
        &FAIL
    }

    /// The records that follow from `parts`, into `out`: by default `parts` after
    /// [`Smt::apply`], and a tombstone unchanged (it has no value to change). A
    /// transform that drops records, makes several, or reads tombstones overrides it.
    fn expand(&self, mut parts: Parts, meta: &Meta, out: &mut Vec<Parts>) -> Result<(), String> {
        if !parts.tombstone {
            self.apply(&mut parts, meta)?;
        }
        out.push(parts);
        Ok(())
    }

    /// Whether it reads and changes only the top-level fields of an object value, and
    /// the key, operation and headers not at all: a chain then applies it with
    /// [`Smt::apply_fields`], without parsing the fields' values.
    fn top_level(&self) -> bool {
        false
    }

    /// [`Smt::apply`] on the top-level fields of an object value, with the same result
    /// (and the same errors); `None` when it has no such way ([`Smt::top_level`] is
    /// false).
    fn apply_fields<'a>(
        &'a self,
        _fields: &mut Fields<'a>,
        _meta: &Meta,
    ) -> Option<Result<(), String>> {
        None
    }

    /// Whether it reads a value's JSON text itself (a `jq` program, which has values of
    /// its own): a chain then hands it the text with [`Smt::expand_text`].
    fn textual(&self) -> bool {
        false
    }

    /// [`Smt::expand`] of a value that is not a tombstone, from its JSON text and the
    /// record's key, to the JSON text of each value that follows (each keeping the
    /// record's key, operation and headers); `None` when it has no such way
    /// ([`Smt::textual`] is false).
    fn expand_text(
        &self,
        _text: &[u8],
        _key: Option<&[u8]>,
        _meta: &Meta,
        _out: &mut dyn FnMut(Vec<u8>),
    ) -> Option<Result<(), String>> {
        None
    }
}

static FAIL: OnError = OnError::Fail;

/// The `on_error` key of a transform's section (absent: `fail`): `fail`, `skip` or
/// `dead-letter:<topic>`, as the source's `on_decode_error`.
pub(crate) fn on_error(key: Option<&str>, cx: &SectionContext) -> Result<OnError, KeyError> {
    cx.error_policy("on_error", key, Allowed::DECODE, USE_FAIL_OR_SKIP)
}

/// A chain of transforms, each named by its kind.
pub type Chain = [(String, Arc<dyn Smt>)];

/// What a chain may assume of the values it is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Values {
    /// Any bytes: a value that is not JSON fails the step that reads it first, as a
    /// parse says.
    Unchecked,
    /// JSON text that parses: the source checked it, or lockgate wrote it (the
    /// sources whose format is `json`). A step reads it by its structure alone.
    Checked,
}

/// Where a chain failed: the position of the transform and its message (naming it).
#[derive(Debug, Clone, PartialEq)]
pub struct StepError {
    pub step: usize,
    pub message: String,
}

/// The value of `v` as an object, or why a transform named `name` needs one.
pub(crate) fn object<'v>(
    v: &'v mut Value,
    name: &str,
) -> Result<&'v mut serde_json::Map<String, Value>, String> {
    let kind = json_kind(v);
    v.as_object_mut()
        .ok_or_else(|| format!("{name} needs a JSON object, the value is {kind}"))
}

/// A transform's job-file section: its options (`T`, which checks itself when it is
/// built) as a stateless step that applies it to every record.
pub trait SmtConfig: serde::de::DeserializeOwned + Send + Sync + 'static {
    /// The name a job file gives it.
    const KIND: &'static str;
    /// The transform, or the key (relative to the section) that is wrong and why.
    fn build(self, cx: &SectionContext) -> Result<Arc<dyn Smt>, KeyError>;
}

/// The section of any [`SmtConfig`].
#[derive(serde::Deserialize)]
#[serde(transparent)]
pub struct SmtSection<T>(pub T);

impl<T: SmtConfig> TransformSection for SmtSection<T> {
    fn prepare(self, cx: &SectionContext, _index: usize) -> Result<PreparedTransform, KeyError> {
        let smt = self.0.build(cx)?;
        let step = chain_step(
            vec![(T::KIND.to_string(), smt.clone())],
            Values::Unchecked,
            cx.source_kafka.clone(),
        );
        Ok(PreparedTransform {
            steps: vec![step],
            config: Arc::new(Applied(smt)),
            facts: Default::default(),
        })
    }
}

/// The transform of a prepared section, for tools that apply a job's transforms
/// themselves (the chaos harness's verifier).
pub struct Applied(pub Arc<dyn Smt>);

/// Applies `smt` (named `kind`) alone to `record`, adding what follows to `out`.
pub fn transform(
    smt: &Arc<dyn Smt>,
    kind: &str,
    record: Record,
    out: &mut Batch,
) -> crate::error::Result<()> {
    transform_all(&[(kind.to_string(), smt.clone())], record, out)
}

/// Applies each transform of `chain` (named by its kind), in order, to `record`,
/// adding the records that follow to `out`: the value is parsed once and written
/// once, however long the chain. The records keep the source record's origin,
/// timestamp and headers; the outputs after the first of one record (a `jq` program
/// with several) are numbered ([`Record::output`]), so that ids made of coordinates
/// stay unique. Any error fails, whatever the transforms' `on_error`.
pub fn transform_all(chain: &Chain, record: Record, out: &mut Batch) -> crate::error::Result<()> {
    run_chain(chain, Values::Unchecked, record, out).map_err(|failed| {
        let (e, record) = *failed;
        JobError::Other(format!("{}: {}", describe(&record), e.message))
    })
}

/// A value on its way through a chain: its text as it came, its top-level fields, or
/// parsed whole; each transform takes it in the form it works on, so consecutive
/// transforms of top-level fields parse the value once, and it is written once.
enum Doc<'a> {
    Text(Cow<'a, [u8]>),
    Fields(Fields<'a>),
    Tree(Value),
}

/// The records one step makes of one (nearly always one, kept inline).
type Made<'a> = smallvec::SmallVec<[Staged<'a>; 1]>;

/// A record on its way through a chain.
struct Staged<'a> {
    /// The value, in the form the last step left it (the record's own text at first).
    doc: Doc<'a>,
    /// The key's bytes (a string key is its text).
    key: Option<Bytes>,
    /// The record has no value: `doc` is not read, and is written as no bytes.
    tombstone: bool,
    op: Op,
}

impl<'a> Doc<'a> {
    /// The value parsed whole, or why it is not JSON.
    fn into_tree(self) -> Result<Value, String> {
        match self {
            Doc::Text(t) => serde_json::from_slice(&t).map_err(|e| format!("not valid JSON: {e}")),
            Doc::Fields(f) => f.to_value().map_err(|e| format!("not valid JSON: {e}")),
            Doc::Tree(v) => Ok(v),
        }
    }

    /// The value's JSON text.
    fn into_text(self) -> Cow<'a, [u8]> {
        match self {
            Doc::Text(t) => t,
            Doc::Fields(f) => {
                let mut out = Vec::new();
                f.write(&mut out);
                Cow::Owned(out)
            }
            Doc::Tree(v) => Cow::Owned(serde_json::to_vec(&v).expect("a JSON value serializes")),
        }
    }
}

/// One transform applied to `s`, adding what follows to `out`: on its top-level
/// fields, on its text, or parsed whole, as the transform works.
fn step<'a>(
    smt: &'a dyn Smt,
    s: Staged<'a>,
    meta: &Meta,
    values: Values,
    out: &mut Made<'a>,
) -> Result<(), String> {
    if !s.tombstone && smt.top_level() {
        on_fields(smt, s, meta, values, out)
    } else if !s.tombstone && smt.textual() {
        on_text(smt, s, meta, values, out)
    } else {
        whole(smt, s, meta, out)
    }
}

/// A transform of top-level fields applied to `s`: the value's fields parsed once (if
/// the last step left its text), and parsed whole only when the transform cannot work
/// on them (or the value is not an object).
fn on_fields<'a>(
    smt: &'a dyn Smt,
    s: Staged<'a>,
    meta: &Meta,
    values: Values,
    out: &mut Made<'a>,
) -> Result<(), String> {
    let mut doc = match s.doc {
        // A checked text by its structure; any other (or one laid out otherwise) parsed.
        Doc::Text(Cow::Borrowed(t)) => match values
            .eq(&Values::Checked)
            .then(|| Fields::split(t))
            .flatten()
            .map_or_else(|| Fields::parse(t), |f| Ok(Some(f)))
        {
            Ok(Some(f)) => Doc::Fields(f),
            Ok(None) => Doc::Text(Cow::Borrowed(t)),
            Err(e) => return Err(format!("not valid JSON: {e}")),
        },
        other => other,
    };
    if let Doc::Fields(f) = &mut doc {
        if let Some(r) = smt.apply_fields(f, meta) {
            r?;
            out.push(Staged { doc, ..s });
            return Ok(());
        }
    }
    // A transform that also reads text (jq) takes it where its fields cannot.
    match smt.textual() {
        true => on_text(smt, Staged { doc, ..s }, meta, values, out),
        false => whole(smt, Staged { doc, ..s }, meta, out),
    }
}

/// A transform of text applied to `s` (jq): the value's text, checked as a parse
/// would check it when no step has parsed it yet.
fn on_text<'a>(
    smt: &dyn Smt,
    s: Staged<'a>,
    meta: &Meta,
    values: Values,
    out: &mut Made<'a>,
) -> Result<(), String> {
    if let (Doc::Text(Cow::Borrowed(t)), Values::Unchecked) = (&s.doc, values) {
        // Not yet parsed: what is not JSON fails as a parse would say.
        if let Err(e) = crate::formats::json::validate_json(t) {
            // The parser's words where it has some, as the other transforms say it.
            let e = serde_json::from_slice::<Value>(t)
                .err()
                .map_or(e, |e| e.to_string());
            return Err(format!("not valid JSON: {e}"));
        }
    }
    let text = s.doc.into_text();
    let (key, op) = (s.key, s.op);
    let mut made = Vec::new();
    if let Some(r) = smt.expand_text(&text, key.as_deref(), meta, &mut |v| made.push(v)) {
        r?;
        out.extend(made.into_iter().map(|v| Staged {
            doc: Doc::Text(Cow::Owned(v)),
            key: key.clone(),
            tombstone: false,
            op,
        }));
        return Ok(());
    }
    whole(
        smt,
        Staged {
            doc: Doc::Text(text),
            key,
            tombstone: false,
            op,
        },
        meta,
        out,
    )
}

/// One transform applied to `s` parsed whole.
fn whole<'a>(smt: &dyn Smt, s: Staged<'a>, meta: &Meta, out: &mut Made<'a>) -> Result<(), String> {
    let value = if s.tombstone {
        Value::Null
    } else {
        s.doc.into_tree()?
    };
    let parts = Parts {
        value,
        key: s.key.map(|k| k.to_vec()),
        tombstone: s.tombstone,
        op: s.op,
    };
    let mut made = Vec::with_capacity(1);
    smt.expand(parts, meta, &mut made)?;
    out.extend(made.into_iter().map(|p| Staged {
        doc: Doc::Tree(p.value),
        key: p.key.map(Bytes::from),
        tombstone: p.tombstone,
        op: p.op,
    }));
    Ok(())
}

/// [`transform_all`], handing back the record with the error and which transform
/// failed (whose `on_error` then decides): the one way a chain is applied, by a job
/// and by what checks a job's results. `values` says what the values are known to be;
/// for a value that is [`Values::Checked`] the result is the same either way.
pub fn run_chain(
    chain: &Chain,
    values: Values,
    mut record: Record,
    out: &mut Batch,
) -> Result<(), Box<(StepError, Record)>> {
    // Taken, not shared: the record has it back if the chain fails.
    let source = std::mem::take(&mut record.value);
    let meta = Meta::of(&record);
    let mut staged: Made = smallvec::smallvec![Staged {
        doc: if record.tombstone {
            Doc::Tree(Value::Null)
        } else {
            Doc::Text(Cow::Borrowed(&source))
        },
        key: record.key.clone(),
        tombstone: record.tombstone,
        op: record.op,
    }];
    let mut failed = None;
    'chain: for (i, (kind, smt)) in chain.iter().enumerate() {
        let mut next = Made::with_capacity(staged.len());
        for s in staged.drain(..) {
            if let Err(e) = step(&**smt, s, &meta, values, &mut next) {
                failed = Some(StepError {
                    step: i,
                    message: format!("{kind}: {e}"),
                });
                break 'chain;
            }
        }
        staged = next;
    }
    if let Some(e) = failed {
        drop(staged);
        record.value = source;
        return Err(Box::new((e, record)));
    }
    out.reserve(staged.len());
    for (i, s) in staged.into_iter().enumerate() {
        let value = if s.tombstone {
            Bytes::new()
        } else {
            match s.doc.into_text() {
                // Unchanged: the record's own bytes.
                Cow::Borrowed(_) => source.clone(),
                Cow::Owned(v) => v.into(),
            }
        };
        out.push(Record {
            key: s.key,
            route_key: record.route_key.clone(),
            value,
            origin: record.origin.clone(),
            timestamp: record.timestamp,
            tombstone: s.tombstone,
            op: s.op,
            headers: record.headers.clone(),
            output: record.output + i as u32,
        });
    }
    Ok(())
}

/// The reason of a chain's dead letters (records a transform fails on).
pub(crate) const LETTERS: &[Reason] = &[Reason::Transform];

/// The operator of a chain: each record through [`run_chain`], and one that fails
/// as the failing transform's `on_error` says.
struct ChainOperator {
    chain: Arc<Vec<(String, Arc<dyn Smt>)>>,
    values: Values,
    kafka: Option<crate::connector::KafkaCluster>,
    letters: Letters,
}

impl ChainOperator {
    fn failed(&mut self, e: StepError, record: Record) -> crate::error::Result<()> {
        let why = format!("{}: {}", describe(&record), e.message);
        self.letters.refuse(
            self.chain[e.step].1.on_error(),
            &record,
            why,
            Reason::Transform,
            "skipping records a transform fails on (on_error = \"skip\")",
        )
    }
}

impl crate::connector::Operator for ChainOperator {
    fn open(&mut self, ctx: &crate::connector::OperatorContext) -> crate::error::Result<()> {
        let policies: Vec<&OnError> = self.chain.iter().map(|(_, s)| s.on_error()).collect();
        self.letters.open(
            LettersOf {
                task: format!("{}[{}]", ctx.uid, ctx.info.index),
                what: "a transform",
                metrics: ctx.info.telemetry.metrics(),
                operator: &ctx.uid,
                subtask: ctx.info.index,
                reasons: LETTERS,
            },
            &policies,
            self.kafka
                .as_ref()
                .map(|k| (k.bootstrap_servers.as_str(), &k.properties)),
        )
    }

    fn process(&mut self, batch: Batch, out: &mut Batch) -> crate::error::Result<()> {
        for r in batch {
            if let Err(failed) = run_chain(&self.chain, self.values, r, out) {
                let (e, record) = *failed;
                self.failed(e, record)?;
            }
        }
        Ok(())
    }
}

/// One stateless step that applies a chain of transforms (consecutive `[[transform]]`
/// sections), parsing each record once: what a job runs for them. `values` is what the
/// source's values are known to be; `kafka` is where records a transform dead-letters
/// go (the source's cluster).
pub fn chain_step(
    chain: Vec<(String, Arc<dyn Smt>)>,
    values: Values,
    kafka: Option<crate::connector::KafkaCluster>,
) -> Step {
    let kind = chain
        .iter()
        .map(|(k, _)| k.as_str())
        .collect::<Vec<_>>()
        .join("+");
    let chain = Arc::new(chain);
    Step::Operator {
        kind,
        factory: Arc::new(move |_| {
            Box::new(ChainOperator {
                chain: chain.clone(),
                values,
                kafka: kafka.clone(),
                letters: Letters::default(),
            })
        }),
    }
}

/// The transform a `[[transform]]` section's `toml_text` configures, built with paths
/// relative to the working directory; for tests.
#[cfg(test)]
pub(crate) fn built<T: SmtConfig>(toml_text: &str) -> Arc<dyn Smt> {
    let c: T = toml::from_str(toml_text).unwrap();
    c.build(&crate::testkit::conformance::section_context(
        std::path::Path::new("."),
    ))
    .map_err(|e| format!("{}: {}", e.key, e.message))
    .unwrap()
}
