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

pub mod fields;
pub mod set_key;
pub mod time;

use crate::connector::{
    FnOperator, KeyError, PreparedTransform, SectionContext, Step, TransformSection,
};
use crate::error::JobError;
use crate::record::Record;
use serde_json::Value;
use std::sync::Arc;

/// What a transform may read of a record besides its value.
#[derive(Debug, Clone, Copy, Default)]
pub struct Meta<'a> {
    pub topic: Option<&'a str>,
    pub partition: Option<i32>,
    pub offset: Option<i64>,
    /// Milliseconds since the epoch.
    pub timestamp: Option<i64>,
}

impl<'a> Meta<'a> {
    /// The metadata of `record`.
    pub fn of(record: &'a Record) -> Meta<'a> {
        Meta {
            topic: record.origin.as_ref().map(|o| &*o.stream),
            partition: record.origin.as_ref().map(|o| o.partition),
            offset: record.origin.as_ref().map(|o| o.offset),
            timestamp: record.timestamp,
        }
    }
}

/// A record's value and key as a transform changes them.
#[derive(Debug, Clone, PartialEq)]
pub struct Parts {
    pub value: Value,
    /// The key's bytes (a string key is its text).
    pub key: Option<Vec<u8>>,
}

/// One transform: a pure function of a record's parts and metadata. An error says
/// why the record cannot be transformed.
pub trait Smt: Send + Sync + std::fmt::Debug + 'static {
    fn apply(&self, parts: &mut Parts, meta: &Meta) -> Result<(), String>;
}

/// The value of `v` as an object, or why a transform named `name` needs one.
pub(crate) fn object<'v>(
    v: &'v mut Value,
    name: &str,
) -> Result<&'v mut serde_json::Map<String, Value>, String> {
    let kind = kind(v);
    v.as_object_mut()
        .ok_or_else(|| format!("{name} needs a JSON object, the value is {kind}"))
}

/// What kind of JSON value `v` is, for messages.
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
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
        let step = chain_step(vec![(T::KIND.to_string(), smt.clone())]);
        Ok(PreparedTransform {
            steps: vec![step],
            config: Arc::new(Applied(smt)),
        })
    }
}

/// The transform of a prepared section, for tools that apply a job's transforms
/// themselves (the chaos harness's verifier).
pub struct Applied(pub Arc<dyn Smt>);

/// Applies `smt` (named `kind`) alone to `record`.
pub fn transform(smt: &Arc<dyn Smt>, kind: &str, record: Record) -> crate::error::Result<Record> {
    transform_all(&[(kind.to_string(), smt.clone())], record)
}

/// Applies each transform of `chain` (named by its kind), in order, to `record`: the
/// value is parsed once and written once, however long the chain.
pub fn transform_all(
    chain: &[(String, Arc<dyn Smt>)],
    mut record: Record,
) -> crate::error::Result<Record> {
    let what = || crate::operators::rolling_sum::describe(&record);
    let first = chain.first().map_or("transform", |(k, _)| k.as_str());
    let value: Value = serde_json::from_slice(&record.value)
        .map_err(|e| JobError::Other(format!("{}: {first}: not valid JSON: {e}", what())))?;
    let mut parts = Parts {
        value,
        key: record.key.as_ref().map(|k| k.to_vec()),
    };
    let meta = Meta::of(&record);
    for (kind, smt) in chain {
        smt.apply(&mut parts, &meta)
            .map_err(|e| JobError::Other(format!("{}: {kind}: {e}", what())))?;
    }
    record.value = serde_json::to_vec(&parts.value)
        .expect("a JSON value serializes")
        .into();
    record.key = parts.key.map(Into::into);
    Ok(record)
}

/// One stateless step that applies a chain of transforms (consecutive `[[transform]]`
/// sections), parsing each record once: what a job runs for them.
pub fn chain_step(chain: Vec<(String, Arc<dyn Smt>)>) -> Step {
    let kind = chain
        .iter()
        .map(|(k, _)| k.as_str())
        .collect::<Vec<_>>()
        .join("+");
    let chain = Arc::new(chain);
    Step::Operator {
        kind,
        factory: Arc::new(move |_| {
            let chain = chain.clone();
            Box::new(FnOperator(
                move |r: Record, out: &mut crate::record::Batch| {
                    out.push(transform_all(&chain, r)?);
                    Ok(())
                },
            ))
        }),
    }
}
