//! The change stream made into events: pgoutput's messages of one transaction
//! gathered until its commit (so that a barrier never falls inside a transaction
//! smaller than the buffer), each change decided against the snapshot's progress.

use super::config::TableName;
use super::events::{Cell, Kind, Shape, Source};
use super::pgoutput::{Message, Old, Relation, Value};
use super::progress::{Decision, Progress};
use crate::record::Record;
use std::collections::HashMap;
use std::sync::Arc;

/// One event of the open transaction, with what decides whether it is passed on.
#[derive(Debug, Clone)]
pub struct Pending {
    /// `schema.table`.
    pub table: Arc<str>,
    /// The row's key texts (empty for a truncate).
    pub key: Vec<String>,
    /// The transaction's id.
    pub xid: u32,
    pub decision: Decision,
    pub record: Record,
}

/// A relation of the stream: its shape, or `None` when it is not one of the tables.
#[derive(Debug, Clone)]
struct Rel {
    shape: Option<Shape>,
}

/// The open transaction.
#[derive(Debug)]
struct Open {
    xid: u32,
    commit_ms: i64,
    /// Changes of the transaction seen so far (passed on, decided away, or not of the
    /// tables): the unit of [`super::position::Resume::skip`].
    changes: u64,
    pending: Vec<Pending>,
}

/// Why the stream cannot go on: `fatal` when no restart cures it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub fatal: bool,
    pub message: String,
}

impl Fault {
    fn fatal(message: String) -> Fault {
        Fault {
            fatal: true,
            message,
        }
    }
}

impl From<String> for Fault {
    fn from(message: String) -> Fault {
        Fault {
            fatal: false,
            message,
        }
    }
}

impl From<&str> for Fault {
    fn from(message: &str) -> Fault {
        Fault::from(message.to_string())
    }
}

/// Turns pgoutput's messages into events.
#[derive(Debug)]
pub struct Assembler {
    db: String,
    /// The primary key's columns of each table, by `schema.table`.
    keys: HashMap<String, Vec<String>>,
    /// The tables' oids when the source started (`schema.table` by oid).
    oids: HashMap<u32, String>,
    relations: HashMap<u32, Rel>,
    open: Option<Open>,
    /// Changes of the next transaction to drop (a restore inside a transaction).
    skip_first: u64,
}

impl Assembler {
    /// An assembler for database `db`'s tables with primary keys `keys`
    /// (`schema.table` -> the key's column names), dropping the first `skip` changes
    /// of the first transaction.
    pub fn new(
        db: String,
        keys: HashMap<String, Vec<String>>,
        oids: HashMap<u32, String>,
        skip: u64,
    ) -> Assembler {
        Assembler {
            db,
            keys,
            oids,
            relations: HashMap::new(),
            open: None,
            skip_first: skip,
        }
    }

    /// Whether changes of a transaction that was passed on in part before the restore
    /// are still to come (the position must not move past it).
    pub fn skipping(&self) -> bool {
        self.skip_first > 0
    }

    /// Whether a transaction is open.
    pub fn in_transaction(&self) -> bool {
        self.open.is_some()
    }

    /// Changes of the open transaction seen so far (0 when none is open).
    pub fn changes(&self) -> u64 {
        self.open.as_ref().map_or(0, |o| o.changes)
    }

    /// Events waiting in the open transaction.
    pub fn pending_len(&self) -> usize {
        self.open.as_ref().map_or(0, |o| o.pending.len())
    }

    /// A transaction begins.
    pub fn begin(&mut self, xid: u32, commit_time_pg_micros: i64) -> Result<(), Fault> {
        if self.open.is_some() {
            return Err("pgoutput: a transaction began inside another".into());
        }
        self.open = Some(Open {
            xid,
            commit_ms: super::events::pg_time_ms(commit_time_pg_micros),
            changes: 0,
            pending: Vec::new(),
        });
        Ok(())
    }

    /// The open transaction's events so far, taken out (to pass on in part, or at its
    /// commit).
    pub fn take(&mut self) -> Vec<Pending> {
        self.open
            .as_mut()
            .map(|o| std::mem::take(&mut o.pending))
            .unwrap_or_default()
    }

    /// The transaction committed: its remaining events. The next transaction is
    /// whole.
    pub fn commit(&mut self) -> Result<Vec<Pending>, Fault> {
        let open = self
            .open
            .take()
            .ok_or("pgoutput: a commit without a transaction")?;
        self.skip_first = 0;
        Ok(open.pending)
    }

    /// One message of the stream (not Begin or Commit, which the replication client
    /// reports itself). `lsn` is the message's place in the WAL; `progress` the
    /// snapshot's, when the stream may still meet rows it read.
    pub fn message(
        &mut self,
        msg: Message,
        lsn: u64,
        progress: Option<&Progress>,
        now_ms: i64,
    ) -> Result<(), Fault> {
        let (relation, change) = match msg {
            Message::Relation(r) => return self.relation(r),
            Message::Insert { relation, new } => (relation, Change::Insert(new)),
            Message::Update { relation, old, new } => (relation, Change::Update(old, new)),
            Message::Delete { relation, old } => (relation, Change::Delete(old)),
            Message::Truncate { relations, .. } => {
                return self.truncate(&relations, lsn, progress, now_ms)
            }
            _ => return Ok(()),
        };
        let db = self.db.clone();
        let open = self
            .open
            .as_mut()
            .ok_or("pgoutput: a change outside a transaction")?;
        open.changes += 1;
        if open.changes <= self.skip_first {
            return Ok(());
        }
        let shape = match self.relations.get(&relation) {
            Some(Rel { shape: Some(s) }) => s,
            Some(Rel { shape: None }) => return Ok(()),
            None => {
                return Err(Fault::from(format!(
                    "pgoutput: a change of relation {relation}, which the stream has not described"
                )))
            }
        };
        let source = Source {
            db: &db,
            lsn: Some(lsn),
            tx_id: Some(open.xid),
            ts_ms: open.commit_ms,
            snapshot: false,
        };
        let offset = i64::try_from(lsn).unwrap_or(i64::MAX);
        // Whether a piece of the snapshot saw the transaction; for some pieces but
        // not others, the key decides later (Decision::ByKey).
        let decision = progress.map_or(Decision::Emit, |p| p.decide(&shape.stream, open.xid));
        let mut out = Vec::with_capacity(1);
        match change {
            Change::Insert(new) => {
                let cells = cells(&new)?;
                let key = key_of(shape, &cells)?;
                let after = shape.row(&cells)?;
                let k = shape.key_object(&key)?;
                out.push((key, Kind::Create, Some(k), None, Some(after)));
            }
            Change::Update(old, new) => {
                let mut new_cells = cells(&new)?;
                // REPLICA IDENTITY FULL logs the whole old row: a TOASTed value the
                // update left as it was is taken from it.
                // The key logged in the old tuple fills a TOASTed key value the
                // update left as it was, too.
                if let Some(Old::Full(t) | Old::Key(t)) = &old {
                    for (n, o) in new_cells.iter_mut().zip(cells(t)?) {
                        if *n == Cell::Unchanged && o != Cell::Null {
                            *n = o;
                        }
                    }
                }
                let key = key_of(shape, &new_cells)?;
                let after = shape.row(&new_cells)?;
                let (old_key, before) = match &old {
                    None => (key.clone(), None),
                    Some(Old::Key(t)) => {
                        let c = cells(t)?;
                        let k = key_of(shape, &c)?;
                        let b = shape.key_only_row(&k)?;
                        (k, Some(b))
                    }
                    Some(Old::Full(t)) => {
                        let c = cells(t)?;
                        (key_of(shape, &c)?, Some(shape.row(&c)?))
                    }
                };
                if old_key != key {
                    // A changed key: the old row goes and a new one comes (Debezium's
                    // delete and create), each decided by its own key.
                    let before = match before {
                        Some(b) => b,
                        None => shape.key_only_row(&old_key)?,
                    };
                    let ok = shape.key_object(&old_key)?;
                    out.push((old_key, Kind::Delete, Some(ok), Some(before), None));
                    let k = shape.key_object(&key)?;
                    out.push((key, Kind::Create, Some(k), None, Some(after)));
                } else {
                    let k = shape.key_object(&key)?;
                    out.push((key, Kind::Update, Some(k), before, Some(after)));
                }
            }
            Change::Delete(old) => {
                let (key, before) = match &old {
                    Old::Key(t) => {
                        let k = key_of(shape, &cells(t)?)?;
                        let b = shape.key_only_row(&k)?;
                        (k, b)
                    }
                    Old::Full(t) => {
                        let c = cells(t)?;
                        (key_of(shape, &c)?, shape.row(&c)?)
                    }
                };
                let k = shape.key_object(&key)?;
                out.push((key, Kind::Delete, Some(k), Some(before), None));
            }
        }
        let made: Vec<Pending> = out
            .into_iter()
            .map(|(key, kind, k, before, after)| Pending {
                table: shape.stream.clone(),
                xid: open.xid,
                decision,
                record: shape.event(kind, k.as_ref(), before, after, &source, offset, now_ms),
                key,
            })
            .collect();
        open.pending.extend(made);
        Ok(())
    }

    fn relation(&mut self, r: Relation) -> Result<(), Fault> {
        let name = TableName {
            schema: if r.namespace.is_empty() {
                "pg_catalog".into()
            } else {
                r.namespace.clone()
            },
            name: r.name.clone(),
        };
        let stream = name.stream();
        if let Some(was) = self.oids.get(&r.oid) {
            if *was != stream {
                return Err(Fault::fatal(format!(
                    "table {was} was renamed to {stream} while the job ran: name the new table in tables and start the job without a checkpoint"
                )));
            }
        }
        let Some(pk) = self.keys.get(&stream) else {
            self.relations.insert(r.oid, Rel { shape: None });
            return Ok(());
        };
        let columns: Vec<super::events::Column> = r
            .columns
            .iter()
            .map(|c| super::events::Column {
                name: c.name.clone(),
                type_oid: c.type_oid,
                type_modifier: c.type_modifier,
            })
            .collect();
        // Under the default replica identity the stream's key flags are the primary
        // key as it is now; otherwise the key read at start names the columns.
        let flagged: Vec<usize> = if r.replica_identity == b'd' {
            r.columns
                .iter()
                .enumerate()
                .filter(|(_, c)| c.key)
                .map(|(i, _)| i)
                .collect()
        } else {
            Vec::new()
        };
        let key = if flagged.is_empty() {
            pk.iter()
                .map(|k| {
                    r.columns.iter().position(|c| &c.name == k).ok_or_else(|| {
                        format!("{stream}: the stream's columns lack primary key column {k}")
                    })
                })
                .collect::<Result<Vec<_>, _>>()?
        } else {
            // The flags come in column order; the key's own order is the primary key's.
            let mut f = flagged;
            f.sort_by_key(|i| {
                pk.iter()
                    .position(|k| *k == r.columns[*i].name)
                    .unwrap_or(usize::MAX)
            });
            f
        };
        self.relations.insert(
            r.oid,
            Rel {
                shape: Some(Shape {
                    stream: Arc::from(stream.as_str()),
                    schema: name.schema,
                    table: name.name,
                    columns,
                    key,
                }),
            },
        );
        Ok(())
    }

    fn truncate(
        &mut self,
        relations: &[u32],
        lsn: u64,
        progress: Option<&Progress>,
        now_ms: i64,
    ) -> Result<(), Fault> {
        let open = self
            .open
            .as_mut()
            .ok_or("pgoutput: a truncate outside a transaction")?;
        open.changes += 1;
        if open.changes <= self.skip_first {
            return Ok(());
        }
        for oid in relations {
            let Some(Rel { shape: Some(shape) }) = self.relations.get(oid) else {
                continue;
            };
            let decision = progress.map_or(Decision::Emit, |p| p.decide(&shape.stream, open.xid));
            if decision == Decision::ByKey {
                return Err(Fault::fatal(format!(
                    "table {} was truncated while its initial snapshot was read in pieces (transaction {}), and a truncate names no key to tell which piece saw it: take the snapshot again (start the job without a checkpoint)",
                    shape.stream, open.xid
                )));
            }
            let source = Source {
                db: &self.db,
                lsn: Some(lsn),
                tx_id: Some(open.xid),
                ts_ms: open.commit_ms,
                snapshot: false,
            };
            let offset = i64::try_from(lsn).unwrap_or(i64::MAX);
            let record = shape.event(Kind::Truncate, None, None, None, &source, offset, now_ms);
            open.pending.push(Pending {
                table: shape.stream.clone(),
                key: Vec::new(),
                xid: open.xid,
                decision,
                record,
            });
        }
        Ok(())
    }
}

/// A row's key texts; a row without them (the table's replica identity does not
/// log the key, a key value left out as unchanged) cannot be named, and no restart
/// changes that.
fn key_of(shape: &Shape, cells: &[Cell<'_>]) -> Result<Vec<String>, Fault> {
    shape.key_texts(cells).map_err(Fault::fatal)
}

enum Change {
    Insert(Vec<Value>),
    Update(Option<Old>, Vec<Value>),
    Delete(Old),
}

fn cells(tuple: &[Value]) -> Result<Vec<Cell<'_>>, Fault> {
    tuple
        .iter()
        .map(|v| match v {
            Value::Null => Ok(Cell::Null),
            Value::Unchanged => Ok(Cell::Unchanged),
            Value::Text(b) => std::str::from_utf8(b)
                .map(Cell::Text)
                .map_err(|e| Fault::from(format!("pgoutput: a value is not UTF-8: {e}"))),
            Value::Binary(_) => Err(Fault::from(
                "pgoutput: a binary value (the source asks for text)",
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Op;
    use bytes::Bytes;
    use serde_json::Value as J;

    fn rel() -> Message {
        let col = |name: &str, key, type_oid| super::super::pgoutput::Column {
            key,
            name: name.into(),
            type_oid,
            type_modifier: -1,
        };
        Message::Relation(Relation {
            oid: 7,
            namespace: "public".into(),
            name: "t".into(),
            replica_identity: b'd',
            columns: vec![col("id", true, 23), col("v", false, 25)],
        })
    }

    fn text(s: &str) -> Value {
        Value::Text(Bytes::from(s.to_string()))
    }

    fn assembler(skip: u64) -> Assembler {
        let keys = HashMap::from([("public.t".to_string(), vec!["id".to_string()])]);
        let mut a = Assembler::new(
            "db".into(),
            keys,
            HashMap::from([(7, "public.t".to_string())]),
            skip,
        );
        a.message(rel(), 0, None, 0).unwrap();
        a
    }

    fn value(p: &Pending) -> J {
        serde_json::from_slice(&p.record.value).unwrap()
    }

    #[test]
    fn a_transaction_becomes_its_events_at_commit() {
        let mut a = assembler(0);
        a.begin(9, 0).unwrap();
        a.message(
            Message::Insert {
                relation: 7,
                new: vec![text("1"), text("a")],
            },
            100,
            None,
            0,
        )
        .unwrap();
        a.message(
            Message::Update {
                relation: 7,
                old: None,
                new: vec![text("1"), Value::Unchanged],
            },
            101,
            None,
            0,
        )
        .unwrap();
        a.message(
            Message::Update {
                relation: 7,
                old: Some(Old::Key(vec![text("1"), Value::Null])),
                new: vec![text("2"), text("b")],
            },
            102,
            None,
            0,
        )
        .unwrap();
        a.message(
            Message::Delete {
                relation: 7,
                old: Old::Key(vec![text("2"), Value::Null]),
            },
            103,
            None,
            0,
        )
        .unwrap();
        assert_eq!(a.changes(), 4);
        let events = a.commit().unwrap();
        let ops: Vec<(String, Vec<String>, Op)> = events
            .iter()
            .map(|p| {
                (
                    value(p)["op"].as_str().unwrap().to_string(),
                    p.key.clone(),
                    p.record.op,
                )
            })
            .collect();
        let k = |s: &str| vec![s.to_string()];
        assert_eq!(
            ops,
            vec![
                ("c".into(), k("1"), Op::Upsert),
                ("u".into(), k("1"), Op::Upsert),
                ("d".into(), k("1"), Op::Delete),
                ("c".into(), k("2"), Op::Upsert),
                ("d".into(), k("2"), Op::Delete),
            ]
        );
        assert_eq!(
            value(&events[1])["after"]["v"],
            super::super::events::UNAVAILABLE
        );
        assert_eq!(
            value(&events[2])["before"],
            serde_json::json!({"id": 1, "v": null})
        );
        assert_eq!(value(&events[0])["source"]["txId"], 9);
        assert!(events.iter().all(|p| p.decision == Decision::Emit));
        assert!(!a.in_transaction());
    }

    #[test]
    fn a_restore_inside_a_transaction_drops_what_was_passed_on() {
        let mut a = assembler(2);
        a.begin(9, 0).unwrap();
        for i in 0..3 {
            a.message(
                Message::Insert {
                    relation: 7,
                    new: vec![text(&i.to_string()), Value::Null],
                },
                100 + i,
                None,
                0,
            )
            .unwrap();
        }
        let events = a.commit().unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].key, vec!["2".to_string()]);
        // The next transaction is whole.
        a.begin(10, 0).unwrap();
        a.message(
            Message::Insert {
                relation: 7,
                new: vec![text("5"), Value::Null],
            },
            200,
            None,
            0,
        )
        .unwrap();
        assert_eq!(a.commit().unwrap().len(), 1);
    }

    #[test]
    fn other_tables_are_left_out_and_unknown_relations_refused() {
        let mut a = assembler(0);
        let mut other = rel();
        if let Message::Relation(r) = &mut other {
            r.oid = 8;
            r.name = "other".into();
        }
        a.message(other, 0, None, 0).unwrap();
        a.begin(1, 0).unwrap();
        a.message(
            Message::Insert {
                relation: 8,
                new: vec![text("1"), Value::Null],
            },
            1,
            None,
            0,
        )
        .unwrap();
        assert_eq!(a.pending_len(), 0);
        assert_eq!(a.changes(), 1, "counted all the same");
        assert!(a
            .message(
                Message::Insert {
                    relation: 99,
                    new: vec![]
                },
                1,
                None,
                0
            )
            .unwrap_err()
            .message
            .contains("not described"));
    }

    #[test]
    fn a_truncate_is_an_event_without_a_key() {
        let mut a = assembler(0);
        a.begin(1, 0).unwrap();
        a.message(
            Message::Truncate {
                options: 0,
                relations: vec![7],
            },
            5,
            None,
            0,
        )
        .unwrap();
        let e = a.commit().unwrap();
        assert_eq!(value(&e[0])["op"], "t");
        assert!(e[0].record.key.is_none());
    }

    #[test]
    fn a_full_old_row_fills_what_toast_left_out() {
        let mut a = assembler(0);
        a.begin(1, 0).unwrap();
        a.message(
            Message::Update {
                relation: 7,
                old: Some(Old::Full(vec![text("1"), text("long")])),
                new: vec![text("1"), Value::Unchanged],
            },
            5,
            None,
            0,
        )
        .unwrap();
        let e = a.commit().unwrap();
        assert_eq!(value(&e[0])["after"]["v"], "long");
        assert_eq!(value(&e[0])["before"]["v"], "long");
    }

    #[test]
    fn what_no_restart_cures_is_fatal() {
        // A key the change does not carry.
        let mut a = assembler(0);
        a.begin(1, 0).unwrap();
        let f = a
            .message(
                Message::Delete {
                    relation: 7,
                    old: Old::Key(vec![Value::Null, Value::Null]),
                },
                1,
                None,
                0,
            )
            .unwrap_err();
        assert!(f.fatal && f.message.contains("key column id"), "{f:?}");
        // A table renamed while the job ran.
        let mut renamed = rel();
        if let Message::Relation(r) = &mut renamed {
            r.name = "t2".into();
        }
        let f = a.message(renamed, 0, None, 0).unwrap_err();
        assert!(
            f.fatal && f.message.contains("renamed to public.t2"),
            "{f:?}"
        );
        // A broken stream is worth a restart.
        assert!(!a.begin(2, 0).unwrap_err().fatal);
    }

    #[test]
    fn a_restore_inside_a_transaction_is_skipping_until_it_commits() {
        let mut a = assembler(1);
        assert!(a.skipping());
        a.begin(1, 0).unwrap();
        a.message(
            Message::Insert {
                relation: 7,
                new: vec![text("1"), Value::Null],
            },
            1,
            None,
            0,
        )
        .unwrap();
        assert!(a.skipping());
        a.commit().unwrap();
        assert!(!a.skipping());
    }
}
