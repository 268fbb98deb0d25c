//! Rows an interrupted snapshot may have left in a sink that keeps what it was sent
//! (Elasticsearch), and the deletes that take them out.
//!
//! A run killed during the snapshot may have passed on rows after its last completed
//! checkpoint. A sink that commits with the checkpoint (two-phase) drops them; one that
//! writes at once keeps them, and counts on the replay to write the same documents
//! again. The replay reads the rest of the table under a new snapshot, though: a row
//! deleted in between is not read again, and nothing would delete its document.
//!
//! The stream holds those deletes: they are the changes the new piece already saw
//! (and so skips). For each key whose last change the piece saw is a delete (the key
//! did not exist when the piece read), the delete is passed on after all, once: before
//! the first change of the key the piece did not see, or, at the latest, when the
//! stream has passed everything the pieces saw. A key the piece read (its last seen
//! change an insert or update) gets no delete, so nothing the piece passed on is taken
//! back. Where no row was left behind, the delete deletes nothing.

use crate::record::{Op, Origin, Record};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A delete held back, as it will be passed on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub offset: i64,
    pub timestamp: Option<i64>,
}

/// The held deletes, by table and key (the key's texts as a JSON array: a JSON
/// object's names are strings).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ghosts {
    held: BTreeMap<String, BTreeMap<String, Held>>,
}

fn name(key: &[String]) -> String {
    serde_json::to_string(key).expect("strings serialize")
}

impl Ghosts {
    /// A change of `key` in `table` that the piece which read the key already saw
    /// (and that is not passed on): a delete (`record`) is held, anything else means
    /// the key existed when the piece read it, and releases what was held.
    pub fn seen(&mut self, table: &str, key: &[String], record: &Record) {
        if key.is_empty() {
            return;
        }
        if record.op == Op::Delete {
            let held = Held {
                key: record.key.as_deref().unwrap_or_default().to_vec(),
                value: record.value.to_vec(),
                offset: record.origin.as_ref().map_or(0, |o| o.offset),
                timestamp: record.timestamp,
            };
            self.held
                .entry(table.to_string())
                .or_default()
                .insert(name(key), held);
        } else if let Some(t) = self.held.get_mut(table) {
            t.remove(&name(key));
        }
    }

    /// A change of `key` in `table` that is passed on: the held delete of the key to
    /// pass on before it, if any.
    pub fn before(&mut self, table: &str, key: &[String]) -> Option<Record> {
        let t = self.held.get_mut(table)?;
        let held = t.remove(&name(key))?;
        Some(record(table, held))
    }

    /// The stream passed everything the pieces saw: every held delete, to pass on.
    pub fn drain(&mut self) -> Vec<Record> {
        std::mem::take(&mut self.held)
            .into_iter()
            .flat_map(|(table, keys)| {
                keys.into_values()
                    .map(move |h| record(&table, h))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Deletes held.
    pub fn len(&self) -> usize {
        self.held.values().map(BTreeMap::len).sum()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn record(table: &str, h: Held) -> Record {
    Record {
        key: Some(h.key.into()),
        value: h.value.into(),
        origin: Some(Origin {
            stream: Arc::from(table),
            partition: 0,
            offset: h.offset,
        }),
        timestamp: h.timestamp,
        op: Op::Delete,
        ..Record::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(op: Op, v: &str) -> Record {
        Record {
            key: Some(bytes::Bytes::from(format!("{{\"id\":\"{v}\"}}"))),
            value: bytes::Bytes::from(v.to_string()),
            op,
            ..Record::default()
        }
    }

    fn k(s: &str) -> Vec<String> {
        vec![s.to_string()]
    }

    #[test]
    fn a_key_whose_last_seen_change_is_a_delete_gets_it_once() {
        let mut g = Ghosts::default();
        g.seen("t", &k("1"), &rec(Op::Delete, "d1"));
        g.seen("t", &k("2"), &rec(Op::Delete, "d2"));
        // Key 2 was inserted again before the piece read: it existed, no delete.
        g.seen("t", &k("2"), &rec(Op::Upsert, "c2"));
        g.seen("t", &k("3"), &rec(Op::Upsert, "u3"));
        assert_eq!(g.len(), 1);
        // Before key 1's first change the piece did not see: its delete first.
        let d = g.before("t", &k("1")).unwrap();
        assert_eq!((d.op, &d.value[..]), (Op::Delete, &b"d1"[..]));
        assert!(g.before("t", &k("1")).is_none(), "once");
        assert!(g.before("t", &k("3")).is_none());
        g.seen("t", &k("4"), &rec(Op::Delete, "d4"));
        g.seen("u", &k("4"), &rec(Op::Delete, "e4"));
        let rest: Vec<_> = g.drain().into_iter().map(|r| r.value).collect();
        assert_eq!(rest, vec![&b"d4"[..], &b"e4"[..]]);
        assert!(g.is_empty());
    }

    #[test]
    fn the_held_deletes_round_trip_through_json() {
        let mut g = Ghosts::default();
        g.seen("t", &k("1"), &rec(Op::Delete, "d1"));
        let back: Ghosts = serde_json::from_slice(&serde_json::to_vec(&g).unwrap()).unwrap();
        assert_eq!(back, g);
    }
}
