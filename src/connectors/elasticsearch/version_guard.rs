//! External versions are Kafka offsets, and offsets order the records of one partition
//! only. When a document's records come from two partitions (a topic pattern, or keys
//! that moved when partitions were added), a newer record can carry a smaller offset:
//! Elasticsearch would refuse it with 409, which reads as "already written", and the
//! newer write would be lost without a word.
//!
//! The guard stands in front of the sink, keyed by document id, and remembers which
//! partition writes each document (checkpointed keyed state). A record of that document
//! from another partition fails the job, naming the document and both partitions,
//! before anything of it is written: a document never silently keeps an older write.
//!
//! Only sources whose offsets are per partition need it (Kafka); the job file adds it
//! for `versioning = "external"` with `id = "key"` or `field:`.

use super::action::document_id;
use super::config::IdStrategy;
use crate::error::{JobError, Result};
use crate::kits::keyed::{KeyedFunction, KeyedState};
use crate::record::{Batch, Origin, Record};

/// The partition that writes a document.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Writer {
    pub stream: String,
    pub partition: i32,
}

/// Whether a record from `origin` may write a document that `known` writes: `Ok(Some)`
/// is the writer to remember (the first one), `Ok(None)` nothing to change, `Err` the
/// other partition's writer.
pub fn check_writer(known: Option<&Writer>, origin: &Origin) -> Result<Option<Writer>, Writer> {
    match known {
        None => Ok(Some(Writer {
            stream: origin.stream.to_string(),
            partition: origin.partition,
        })),
        Some(w) if *w.stream == *origin.stream && w.partition == origin.partition => Ok(None),
        Some(w) => Err(w.clone()),
    }
}

/// The key the guard is keyed by: the document id, or nothing (the record then goes
/// on unchecked, and the sink refuses it for want of an id).
pub fn guard_key(id: &IdStrategy, record: &Record) -> Vec<u8> {
    document_id(id, record, None)
        .map(String::into_bytes)
        .unwrap_or_default()
}

/// The keyed function of the guard (uid [`UID`]).
pub struct VersionGuard;

/// The guard's state name in checkpoints.
pub const UID: &str = "elasticsearch-external-versions";
const STATE: &str = "writer";

impl KeyedFunction for VersionGuard {
    fn process(
        &mut self,
        key: &[u8],
        record: Record,
        state: &mut KeyedState<'_>,
        out: &mut Batch,
    ) -> Result<()> {
        if let (false, Some(origin)) = (key.is_empty(), &record.origin) {
            let known = state.get::<Writer>(STATE)?;
            match check_writer(known.as_ref(), origin) {
                Ok(Some(first)) => state.put(STATE, &first)?,
                Ok(None) => {}
                Err(w) => {
                    return Err(JobError::Other(format!(
                        "document {:?} is written by {}/{} and now by record {}/{}@{}: \
                         versioning = \"external\" uses Kafka offsets as versions, which \
                         order the records of one partition only, so the newer record \
                         could be refused as already written; use versioning = \"none\", \
                         or ids that one partition writes",
                        String::from_utf8_lossy(key),
                        w.stream,
                        w.partition,
                        origin.stream,
                        origin.partition,
                        origin.offset
                    )))
                }
            }
        }
        out.push(record);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn at(stream: &str, partition: i32) -> Origin {
        Origin {
            stream: Arc::from(stream),
            partition,
            offset: 7,
        }
    }

    #[test]
    fn one_partition_writes_a_document() {
        let w = |s: &str, p| Writer {
            stream: s.into(),
            partition: p,
        };
        type Case = (Option<Writer>, Origin, Result<Option<Writer>, Writer>);
        let cases: &[Case] = &[
            (None, at("orders", 0), Ok(Some(w("orders", 0)))),
            (Some(w("orders", 0)), at("orders", 0), Ok(None)),
            (Some(w("orders", 0)), at("orders", 1), Err(w("orders", 0))),
            (
                Some(w("orders", 0)),
                at("orders-eu", 0),
                Err(w("orders", 0)),
            ),
        ];
        for (known, origin, want) in cases {
            assert_eq!(
                &check_writer(known.as_ref(), origin),
                want,
                "{known:?} {origin:?}"
            );
        }
    }
}
