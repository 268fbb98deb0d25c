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
