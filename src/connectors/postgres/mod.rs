//! The PostgreSQL sink (`[sink.postgres]`): rows into a table, exactly once by
//! two-phase commit, built on the connector contract's two-phase kit
//! ([`crate::kits::two_phase`]).
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
//!
//! This file is the folder's face: the rest of lockgate reaches the sink through what
//! it re-exports and through [`verify`], never through the submodules (they stay public
//! for programs built on the library).

pub mod config;
pub mod gid;
pub mod rows;
pub mod table;
pub mod types;
pub(crate) mod writer;

/// The sink (`[sink.postgres]`): its section of the job file, its configuration and
/// the writer the two-phase kit drives.
pub use config::{Delivery, Mode, PgConfig, PgSection};
pub use writer::PgWriter;

/// What checking a table the sink wrote needs, read the way the sink reads it (the
/// chaos harness compares the table with what the sink would have written).
pub mod verify {
    // Paths from the crate root: the layout check reads `super::` in this file as the
    // folder's parent, not as this inline module's.
    /// How the sink connects to the server, and how it describes the server's errors.
    pub use crate::clients::postgres::{connect, describe};
    /// The prefix of the names of a job's prepared transactions.
    pub use crate::connectors::postgres::gid::prefix;
    /// The changes the sink makes of records and the statements it writes them with.
    pub use crate::connectors::postgres::rows::{
        change_of, key_of, params, plan, write_sql, Cell, Change, Stmt,
    };
    /// The target table and the layout of the columns the sink writes.
    pub use crate::connectors::postgres::table::{layout, load, quote_ident, Layout};
}

use crate::connector::{Guarantee, SinkCaps, SinkSpec, Step};
use crate::kits::TwoPhaseSink;
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
            let v = crate::columns::raw_pointer(root, p)?;
            let t = route_text(v.get());
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
            let scalar = serde_json::from_str::<&serde_json::value::RawValue>(text)
                .ok()
                .filter(|v| !v.get().starts_with(['{', '[']));
            let mut out = match scalar {
                Some(v) => route_text(v.get()),
                None => route_text(&serde_json::to_string(text).expect("a string serializes")),
            }
            .into_bytes();
            out.push(0x1f);
            Some(out)
        })
        .or_else(|| r.key.as_deref().map(<[u8]>::to_vec))
        .unwrap_or_default()
}

/// A key column's JSON value (`raw`) as records are routed by it: the types of the
/// columns are not known before the sink opens, so every spelling that one of the
/// common key types reads as one value routes alike (routing two keys together costs
/// nothing; routing one key apart makes two subtasks write one row). Numbers and
/// numeric strings by their canonical decimal, times (RFC 3339, local, a date) as epoch
/// milliseconds like the numbers they may be written as, and any other string trimmed
/// and in lower case (a UUID without its hyphens): case and padding may not matter to
/// the column.
fn route_text(raw: &str) -> String {
    let s = match serde_json::from_str::<String>(raw) {
        Ok(s) => s,
        Err(_) => return types::canonical_decimal(raw).unwrap_or_else(|| raw.to_string()),
    };
    let t = s.trim();
    if let Some(d) = types::canonical_decimal(t) {
        return d;
    }
    if let Some(ms) = types::epoch_millis(t) {
        return ms.to_string();
    }
    let lower = t.to_ascii_lowercase();
    let hex: String = lower.chars().filter(|c| *c != '-').collect();
    if hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return hex;
    }
    lower
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
        // Times and UUIDs in their several spellings route alike.
        let route = |v: &str| {
            key_bytes(
                &p,
                &Record::from_value(format!("{{\"user\":{v}}}").into_bytes()),
            )
        };
        assert_eq!(route("\"2024-05-01T12:00:00Z\""), route("1714564800000"));
        assert_eq!(route("\"2024-05-01 12:00:00\""), route("1714564800000"));
        assert_eq!(
            route("\"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11\""),
            route("\"a0eebc999c0b4ef8bb6d6bb9bd380a11\"")
        );
        assert_eq!(route("\" 07 \""), route("7"));
    }
}
