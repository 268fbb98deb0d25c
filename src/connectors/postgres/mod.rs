//! The PostgreSQL sink (`[sink.postgres]`): rows into a table, exactly once by
//! two-phase commit, built on the connector contract's two-phase kit
//! ([`crate::connector::kit::two_phase`]).
//!
//! - `exactly_once = "two-phase"` (the default): each subtask writes one checkpoint
//!   epoch's rows in one transaction and prepares it at the barrier
//!   (`PREPARE TRANSACTION 'lockgate:<job>:<subtask>:<checkpoint>'`); the checkpoint
//!   keeps its name, and `COMMIT PREPARED` runs once the checkpoint completes, again on
//!   a restore (a transaction already committed is a success). A restore rolls back
//!   what this job prepared and the restored checkpoint does not name. Every record
//!   is in the table exactly once; the server needs `max_prepared_transactions > 0`.
//! - `exactly_once = "idempotent"` (upsert only): each epoch's rows are committed at
//!   the barrier; a replay writes the same rows again, to the same final values.
//!
//! With `key`, records of one key reach one subtask (a `key_by` on the key columns
//! before the sink): one key's changes stay in order, and two subtasks never wait on
//! each other's locks.

pub mod config;
pub mod connect;
pub mod gid;
pub mod rows;
pub mod table;
pub mod types;
mod writer;

pub use config::{Delivery, Mode, PgConfig, PgSection};
pub use writer::PgWriter;

use crate::connector::kit::TwoPhaseSink;
use crate::connector::{Guarantee, SinkCaps, SinkSpec, Step};
use crate::record::Record;
use std::sync::Arc;

/// The sink kind of the Postgres sink in a job graph.
pub const KIND: &str = "postgres";

/// The bytes records are partitioned by: each key column's JSON text, from the
/// record's value (or, for a delete without one, its key), joined by a separator;
/// the record's key when none is found (the sink then reports the record).
fn key_bytes(pointers: &[String], r: &Record) -> Vec<u8> {
    let from = |bytes: &[u8]| -> Option<Vec<u8>> {
        let text = std::str::from_utf8(bytes).ok()?;
        let root: &serde_json::value::RawValue = serde_json::from_str(text).ok()?;
        let mut out = Vec::new();
        for p in pointers {
            let v = rows::raw_pointer(root, p)?;
            // A string and its value as a number are one key to the table, and so are
            // two spellings of one number (`7`, `7.0`).
            let t = serde_json::from_str::<String>(v.get()).unwrap_or_else(|_| {
                types::canonical_decimal(v.get()).unwrap_or_else(|| v.get().to_string())
            });
            out.extend_from_slice(t.as_bytes());
            out.push(0x1f);
        }
        Some(out)
    };
    let value = (!r.tombstone && !r.value.is_empty())
        .then(|| from(&r.value))
        .flatten();
    value
        .or_else(|| r.key.as_deref().and_then(from))
        .or_else(|| {
            // A one-column key may be the record key itself: a JSON scalar or text,
            // as the sink reads a delete's key.
            let key = r.key.as_deref()?;
            if pointers.len() != 1 {
                return Some(key.to_vec());
            }
            let text = std::str::from_utf8(key).ok()?;
            let mut out = serde_json::from_str::<serde_json::Value>(text)
                .ok()
                .filter(|v| !v.is_object() && !v.is_array())
                .map(|v| match v {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                })
                .unwrap_or_else(|| text.to_string())
                .into_bytes();
            out.push(0x1f);
            Some(out)
        })
        .or_else(|| r.key.as_deref().map(<[u8]>::to_vec))
        .unwrap_or_default()
}

/// The sink's spec: the two-phase kit over [`PgWriter`], exactly-once (two-phase) or
/// idempotent, after a `key_by` on the key columns when there are some.
pub fn spec(cfg: PgConfig) -> SinkSpec {
    let guarantee = match cfg.delivery {
        Delivery::TwoPhase => Guarantee::ExactlyOnce,
        Delivery::Idempotent => Guarantee::Idempotent,
    };
    let pointers: Vec<String> = cfg
        .key
        .iter()
        .map(|k| {
            cfg.columns
                .as_ref()
                .and_then(|cols| cols.iter().find(|(n, _)| n == k))
                .and_then(|(_, s)| match s {
                    config::Source::Pointer(p) => Some(p.clone()),
                    config::Source::Record => None,
                })
                .unwrap_or_else(|| format!("/{}", config::escape_pointer(k)))
        })
        .collect();
    let cfg = Arc::new(cfg);
    let mut spec = SinkSpec::new(KIND, move |_| {
        Box::new(TwoPhaseSink::new(PgWriter::new(cfg.clone())))
    })
    .with_caps(SinkCaps {
        guarantee,
        commits_are_final: true,
        one_process_only: Some((
            "sink.postgres".into(),
            "the Postgres sink runs as one process: its prepared transactions are named by job, subtask and checkpoint, which {members} members would share".into(),
        )),
        ..SinkCaps::default()
    });
    if !pointers.is_empty() {
        spec = spec.after_steps(vec![Step::KeyBy(Arc::new(move |r: &Record| {
            Ok(key_bytes(&pointers, r))
        }))]);
    }
    spec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_key_partitions_alike_from_a_value_a_delete_image_or_a_record_key() {
        let p = vec!["/user".to_string()];
        let v = key_bytes(&p, &Record::from_value(br#"{"user":"a","n":1}"#.to_vec()));
        let k = key_bytes(
            &p,
            &Record {
                tombstone: true,
                key: Some(bytes::Bytes::from_static(br#"{"user":"a"}"#)),
                ..Record::default()
            },
        );
        assert_eq!(v, k);
        assert_eq!(v, b"a\x1f");
        let plain = key_bytes(
            &p,
            &Record {
                tombstone: true,
                key: Some(bytes::Bytes::from_static(b"a")),
                ..Record::default()
            },
        );
        assert_eq!(plain, v, "a text key names the same row");
        let n = key_bytes(&p, &Record::from_value(br#"{"user":7}"#.to_vec()));
        let s = key_bytes(&p, &Record::from_value(br#"{"user":"7"}"#.to_vec()));
        let f = key_bytes(&p, &Record::from_value(br#"{"user":7.0}"#.to_vec()));
        assert_eq!(n, s);
        assert_eq!(n, f);
    }
}
