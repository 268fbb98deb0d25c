//! The initial snapshot's progress, kept in every checkpoint until the stream has
//! passed everything it read, and the decision it makes for each change of the
//! stream.
//!
//! A table is read in key order, in chunks, by *pieces*: one piece per start of the
//! source, each under its own MVCC snapshot. A piece that a crash interrupts keeps the
//! key range it had passed on before the restored checkpoint; the next piece goes on
//! after it. Every piece's key range and snapshot are kept, so that the stream, which
//! replays every transaction committed since the slot's position, can tell for each
//! change whether the piece that read the row's key already saw it
//! ([`super::visibility`]).

use super::visibility::{replay, Replay, Snapshot};
use serde::{Deserialize, Serialize};

/// The state's version ([`State`] and [`Progress`]); a checkpoint of another
/// version is refused.
pub const VERSION: u32 = 1;

/// The source's state in a checkpoint, beside its position.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct State {
    pub version: u32,
    /// The snapshot's progress while the stream may still meet rows it read.
    pub progress: Option<Progress>,
    /// A bounded job's end: the WAL position when it first started.
    pub end: Option<u64>,
    /// Deletes held back until the stream passes what the snapshot saw.
    #[serde(default)]
    pub ghosts: super::ghosts::Ghosts,
}

/// What the snapshot has read so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub version: u32,
    pub tables: Vec<TableProgress>,
    /// The server's WAL insert position read right after the newest piece's snapshot
    /// was taken: no piece saw a transaction that committed past it, so once the
    /// stream is past it, every change is passed on and this state is no longer
    /// needed.
    pub horizon: u64,
}

/// One table's reading.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableProgress {
    /// `schema.table`.
    pub table: String,
    /// The key columns' types as SQL names them (`integer`, `text`), to compare keys
    /// in the server, where the key's order is defined.
    pub key_types: Vec<String>,
    /// In key order: piece `i` read the keys above piece `i - 1`'s `upper`, up to its
    /// own (inclusive; `None`: to the end).
    pub pieces: Vec<Piece>,
    pub read: Read,
    /// Rows passed on so far, over all pieces.
    pub rows: u64,
}

/// A piece of a table's reading.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Piece {
    pub snapshot: Snapshot,
    /// The last key read, each column's text; `None`: the piece read to the end.
    pub upper: Option<Vec<String>>,
}

/// How far a table's reading got.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Read {
    NotStarted,
    /// The last piece is reading; `after` is the last key passed on (over all
    /// pieces), from which the next chunk goes on.
    Reading {
        after: Option<Vec<String>>,
    },
    Done,
}

/// What the stream does with one change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Emit,
    Skip,
    /// The piece that read the row's key decides: ask the server where the key lies
    /// ([`boundaries_sql`]), then [`Progress::decide_in_piece`].
    ByKey,
}

impl Progress {
    /// Nothing read yet, for the tables `tables` (`schema.table`) with their key
    /// types.
    pub fn new(tables: Vec<(String, Vec<String>)>) -> Progress {
        Progress {
            version: VERSION,
            tables: tables
                .into_iter()
                .map(|(table, key_types)| TableProgress {
                    table,
                    key_types,
                    pieces: Vec::new(),
                    read: Read::NotStarted,
                    rows: 0,
                })
                .collect(),
            horizon: 0,
        }
    }

    /// The progress as a checkpoint held it, made ready for a new piece: a piece the
    /// restore interrupted ends at the last key the checkpoint holds (or is dropped
    /// when it passed on nothing).
    pub fn restored(mut self) -> Progress {
        for t in &mut self.tables {
            let Read::Reading { after } = &t.read else {
                continue;
            };
            let before = t
                .pieces
                .len()
                .checked_sub(2)
                .map(|i| t.pieces[i].upper.clone());
            match after {
                None => {
                    t.pieces.pop();
                }
                Some(k) if before.as_ref() == Some(&Some(k.clone())) => {
                    t.pieces.pop();
                }
                Some(k) => {
                    if let Some(last) = t.pieces.last_mut() {
                        last.upper = Some(k.clone());
                    }
                }
            }
        }
        self
    }

    /// Whether every table was read to its end.
    pub fn done(&self) -> bool {
        self.tables.iter().all(|t| t.read == Read::Done)
    }

    /// The next table to read, if any.
    pub fn next_table(&self) -> Option<usize> {
        self.tables.iter().position(|t| t.read != Read::Done)
    }

    /// A new piece, under `snapshot` (taken before `insert_lsn` was read), begins
    /// reading table `i` where its reading stands.
    pub fn begin_piece(&mut self, i: usize, snapshot: Snapshot, insert_lsn: u64) {
        self.horizon = self.horizon.max(insert_lsn);
        let t = &mut self.tables[i];
        let after = match &t.read {
            Read::Reading { after } => after.clone(),
            _ => None,
        };
        t.pieces.push(Piece {
            snapshot,
            upper: None,
        });
        t.read = Read::Reading { after };
    }

    /// Table `i`'s row of key `key` was passed on.
    pub fn passed(&mut self, i: usize, key: Vec<String>) {
        let t = &mut self.tables[i];
        t.rows += 1;
        t.read = Read::Reading { after: Some(key) };
    }

    /// Table `i` was read to its end.
    pub fn finished(&mut self, i: usize) {
        self.tables[i].read = Read::Done;
    }

    /// What the stream does with a change of transaction `xid` to `table`.
    pub fn decide(&self, table: &str, xid: u32) -> Decision {
        let Some(t) = self.tables.iter().find(|t| t.table == table) else {
            return Decision::Emit;
        };
        let pieces: Vec<&Snapshot> = t.pieces.iter().map(|p| &p.snapshot).collect();
        match replay(&pieces, xid) {
            Replay::Emit => Decision::Emit,
            Replay::Skip => Decision::Skip,
            Replay::ByPiece => Decision::ByKey,
        }
    }

    /// [`Decision::ByKey`] resolved: the row's key is above `above` of the table's
    /// piece boundaries ([`boundaries_sql`]'s answer), so the piece of that index
    /// read it.
    pub fn decide_in_piece(&self, table: &str, above: usize, xid: u32) -> Decision {
        let Some(t) = self.tables.iter().find(|t| t.table == table) else {
            return Decision::Emit;
        };
        match t.pieces.get(above) {
            Some(p) if p.snapshot.sees(xid) => Decision::Skip,
            _ => Decision::Emit,
        }
    }

    /// The boundaries of `table`'s pieces (the `upper` of all but the last), in
    /// order.
    pub fn boundaries(&self, table: &str) -> Vec<&[String]> {
        self.tables
            .iter()
            .find(|t| t.table == table)
            .map(|t| t.pieces.iter().filter_map(|p| p.upper.as_deref()).collect())
            .unwrap_or_default()
    }

    /// Whether the stream at `lsn` has passed everything a piece may have seen, so
    /// that this state can be dropped.
    pub fn passed_by(&self, lsn: u64) -> bool {
        self.done() && lsn >= self.horizon
    }

    /// The table's progress.
    pub fn table(&self, i: usize) -> &TableProgress {
        &self.tables[i]
    }
}

/// The query that tells, for each key in `keys` (each column's text), above how
/// many of `boundaries` it lies in the order of the key's types `types`: one row per
/// key, `(index in keys, count)`. The comparison is the server's own (a row
/// comparison of the typed values), the order the snapshot's `ORDER BY` read in.
pub fn boundaries_sql(types: &[String], boundaries: &[&[String]], keys: &[Vec<String>]) -> String {
    use super::config::quote_literal;
    let typed = |values: &[String], prefix: Option<&str>| {
        let cols: Vec<String> = values
            .iter()
            .zip(types)
            .enumerate()
            .map(|(c, (v, ty))| match prefix {
                Some(p) => format!("{p}.k{c}::{ty}"),
                None => format!("{}::{ty}", quote_literal(v)),
            })
            .collect();
        format!("ROW({})", cols.join(", "))
    };
    let key_row = typed(&vec![String::new(); types.len()], Some("v"));
    let count = if boundaries.is_empty() {
        "0".to_string()
    } else {
        boundaries
            .iter()
            .map(|b| format!("({key_row} > {})::int", typed(b, None)))
            .collect::<Vec<_>>()
            .join(" + ")
    };
    let rows: Vec<String> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let mut cells = vec![i.to_string()];
            cells.extend(k.iter().map(|v| format!("{}::text", quote_literal(v))));
            format!("({})", cells.join(", "))
        })
        .collect();
    let names: Vec<String> = (0..types.len()).map(|c| format!("k{c}")).collect();
    format!(
        "SELECT v.i, {count} FROM (VALUES {}) AS v(i, {})",
        rows.join(", "),
        names.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(text: &str) -> Snapshot {
        Snapshot::parse(text).unwrap()
    }

    fn one_table() -> Progress {
        Progress::new(vec![("public.t".into(), vec!["integer".into()])])
    }

    #[test]
    fn an_interrupted_piece_ends_at_the_checkpointed_key() {
        let mut p = one_table();
        p.begin_piece(0, snap("10:10:"), 500);
        p.passed(0, vec!["1".into()]);
        p.passed(0, vec!["2".into()]);
        let p = p.restored();
        assert_eq!(p.tables[0].pieces[0].upper, Some(vec!["2".to_string()]));
        let mut q = p.clone();
        q.begin_piece(0, snap("20:20:"), 700);
        assert_eq!(q.horizon, 700);
        assert_eq!(
            q.tables[0].read,
            Read::Reading {
                after: Some(vec!["2".into()])
            },
            "the next piece goes on after key 2"
        );
        // Interrupted again before passing anything on: the empty piece goes.
        let q = q.restored();
        assert_eq!(q.tables[0].pieces.len(), 1);
        // A piece that passed on nothing at all goes too.
        let mut r = one_table();
        r.begin_piece(0, snap("10:10:"), 1);
        assert!(r.restored().tables[0].pieces.is_empty());
    }

    #[test]
    fn changes_are_decided_by_the_pieces_that_read_them() {
        let mut p = one_table();
        p.begin_piece(0, snap("10:10:"), 500);
        p.passed(0, vec!["5".into()]);
        let mut p = p.restored();
        p.begin_piece(0, snap("20:20:"), 900);
        p.finished(0);
        assert!(p.done());
        // Seen by both, by neither, by the second only.
        assert_eq!(p.decide("public.t", 5), Decision::Skip);
        assert_eq!(p.decide("public.t", 25), Decision::Emit);
        assert_eq!(p.decide("public.t", 15), Decision::ByKey);
        assert_eq!(p.boundaries("public.t"), vec![&["5".to_string()][..]]);
        // A key at or below 5 was read by the first piece, which did not see 15.
        assert_eq!(p.decide_in_piece("public.t", 0, 15), Decision::Emit);
        assert_eq!(p.decide_in_piece("public.t", 1, 15), Decision::Skip);
        assert_eq!(p.decide("public.other", 5), Decision::Emit);
        assert!(!p.passed_by(899));
        assert!(p.passed_by(900));
    }

    #[test]
    fn the_boundary_query_compares_typed_rows() {
        let types = vec!["integer".to_string(), "text".to_string()];
        let b1 = vec!["5".to_string(), "it's".to_string()];
        let sql = boundaries_sql(&types, &[&b1], &[vec!["7".into(), "a".into()]]);
        assert_eq!(
            sql,
            "SELECT v.i, (ROW(v.k0::integer, v.k1::text) > ROW('5'::integer, 'it''s'::text))::int FROM (VALUES (0, '7'::text, 'a'::text)) AS v(i, k0, k1)"
        );
    }

    #[test]
    fn a_collated_key_compares_in_its_collation() {
        let types = vec!["text COLLATE \"pg_catalog\".\"C\"".to_string()];
        let b = vec!["a".to_string()];
        let sql = boundaries_sql(&types, &[&b], &[vec!["B".into()]]);
        assert!(
            sql.contains("ROW(v.k0::text COLLATE \"pg_catalog\".\"C\") > ROW('a'::text COLLATE \"pg_catalog\".\"C\")"),
            "{sql}"
        );
    }

    #[test]
    fn the_state_round_trips_through_json() {
        let mut p = one_table();
        p.begin_piece(0, snap("10:12:11"), 500);
        p.passed(0, vec!["x".into()]);
        let back: Progress = serde_json::from_slice(&serde_json::to_vec(&p).unwrap()).unwrap();
        assert_eq!(back, p);
    }
}
