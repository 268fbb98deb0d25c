//! Records: bytes until an operator needs their structure.
//!
//! A record's key and value are [`Bytes`]: the Kafka source copies each polled batch
//! into one buffer and its records hold slices of it, so a record costs no allocation
//! of its own. A slice keeps its whole buffer (at most about 1 MiB, see
//! [`crate::connectors::kafka::fetcher::BATCH_BYTES`]) alive: whatever keeps records
//! beyond the batch that carried them should copy the bytes it keeps
//! ([`Bytes::copy_from_slice`] or `to_vec`), as the built-in sinks do (the exchange
//! between tasks does not: see [`crate::runtime::chain::EXCHANGE_BATCH_BYTES`]).

use bytes::Bytes;
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
    /// same as an empty one. Only sinks that say what a tombstone means receive these
    /// (`on_null_value` of the Elasticsearch sink).
    pub tombstone: bool,
}

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
    }
}

/// Records travel in batches: one channel message carries many records.
pub type Batch = Vec<Record>;
