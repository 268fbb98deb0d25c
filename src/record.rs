//! Records: bytes until an operator needs their structure.
//!
//! A record's key and value are [`Bytes`]: the Kafka source copies each polled batch
//! into one buffer and its records hold slices of it, so a record costs no allocation
//! of its own. A slice keeps its whole buffer (at most about 1 MiB, see
//! [`crate::connectors::kafka::fetcher::BATCH_BYTES`]) alive: whatever keeps records
//! beyond the batch that carried them should copy the bytes it keeps
//! ([`Bytes::copy_from_slice`] or `to_vec`), as the built-in sinks do (the exchange
//! between tasks does not: see [`crate::runtime::chain::EXCHANGE_BATCH_BYTES`]).

use crate::error::{JobError, Result};
use bytes::Bytes;
use serde_json::Value;
use std::sync::Arc;

/// Where a record came from: its stream (topic), partition and offset. Sinks derive
/// deterministic ids from it, so a replay rewrites the same documents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub stream: Arc<str>,
    pub partition: i32,
    pub offset: i64,
}

/// One record flowing through a job.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    /// The source's key (the Kafka message key); `id = "key"` of the Elasticsearch
    /// sink uses it.
    pub key: Option<Bytes>,
    /// The key of the last `key_by`, set by the exchange: keyed operators keep their
    /// state under it.
    pub route_key: Option<Vec<u8>>,
    /// The payload, as bytes (JSON for the built-in formats). Empty for a tombstone.
    pub value: Bytes,
    pub origin: Option<Origin>,
    /// The source's timestamp, in milliseconds since the Unix epoch (the Kafka record's
    /// CreateTime or LogAppendTime); date patterns of an Elasticsearch index use it.
    pub timestamp: Option<i64>,
    /// The source record had no value at all (a Kafka tombstone), which is not the
    /// same as an empty one. A sink says what a tombstone means (`on_null_value` of
    /// the Elasticsearch sink); sources skip them for sinks that do not.
    pub tombstone: bool,
    /// What the record asks of the sink: write it, or delete what its key or id
    /// names. A delete's value, if it has one, is the image before the delete (a
    /// Debezium `before`), which the sink may read the document id from.
    pub op: Op,
    /// The source record's headers, when a step of the job reads them (the Kafka
    /// source reads them only then: they cost a copy per record).
    pub headers: Option<Arc<Headers>>,
    /// Which output of its source record this is, when a transform makes several of
    /// one (a `jq` program): 0 for the first (and for most records). Ids made of
    /// coordinates append it when it is not 0, so that each output is its own
    /// document, the same one on a replay.
    pub output: u32,
}

/// What a record asks of the sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Op {
    /// Write the record (index, create or update, as the sink is configured).
    #[default]
    Upsert,
    /// Delete the document, row or key the record identifies: the Elasticsearch sink
    /// deletes by id, the Kafka sink writes a tombstone, the file sink a delete line.
    Delete,
}

/// A record's headers in their order, names with their values (`None`: a header
/// without a value). Names may repeat, as in Kafka.
pub type Headers = Vec<(String, Option<Bytes>)>;

impl Record {
    /// A record with only a value (a `Vec<u8>` becomes [`Bytes`] without a copy).
    pub fn from_value(value: impl Into<Bytes>) -> Record {
        Record {
            value: value.into(),
            ..Record::default()
        }
    }
}

impl Record {
    /// What byte budgets count for this record: its heap bytes (value, keys) plus its
    /// own size. An estimate of its memory, not of its encoding.
    pub fn size_bytes(&self) -> usize {
        std::mem::size_of::<Record>()
            + self.value.len()
            + self.key.as_ref().map_or(0, Bytes::len)
            + self.route_key.as_ref().map_or(0, Vec::len)
            + self.headers.as_ref().map_or(0, |h| {
                h.iter()
                    .map(|(n, v)| n.len() + v.as_ref().map_or(0, Bytes::len))
                    .sum()
            })
    }
}

/// Records travel in batches: one channel message carries many records.
pub type Batch = Vec<Record>;

/// Where a record came from, for error messages.
pub fn describe(record: &Record) -> String {
    match &record.origin {
        Some(o) => format!("record {}/{}@{}", o.stream, o.partition, o.offset),
        None => "record".to_string(),
    }
}

/// Extracts the key at JSON pointer `pointer` as its canonical form: the key's text
/// (a JSON string's own text; any other value's compact JSON, a number exactly as
/// written) encoded as a JSON string. A key is its text, as a document id or a table's
/// key column sees it: `"1"` and `1` are one key, so that keyed state and the id of a
/// result never disagree (two states writing one document).
pub fn json_key(record: &Record, pointer: &str) -> Result<Vec<u8>> {
    let v: Value = serde_json::from_slice(&record.value)
        .map_err(|e| JobError::Other(format!("{} is not valid JSON: {e}", describe(record))))?;
    let k = v
        .pointer(pointer)
        .ok_or_else(|| JobError::Other(format!("{} has no key at {pointer}", describe(record))))?;
    Ok(canonical_key(k))
}

/// The canonical form of a key's value (see [`json_key`]).
pub fn canonical_key(k: &Value) -> Vec<u8> {
    let text = key_text(k);
    serde_json::to_vec(&Value::String(text)).expect("a JSON string serializes")
}

/// A key's text: a JSON string's own text, any other value's compact JSON.
pub fn key_text(k: &Value) -> String {
    match k {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Sets the value at JSON pointer `pointer`, creating the last member if absent.
pub fn set_pointer(doc: &mut Value, pointer: &str, value: Value) -> bool {
    if let Some(slot) = doc.pointer_mut(pointer) {
        *slot = value;
        return true;
    }
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return false;
    };
    let last = last.replace("~1", "/").replace("~0", "~");
    match doc.pointer_mut(parent) {
        Some(Value::Object(map)) => {
            map.insert(last, value);
            true
        }
        _ => false,
    }
}

/// What kind of JSON value `v` is, for messages ("a string", "an object").
pub fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
