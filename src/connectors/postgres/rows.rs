//! Records as row changes, and a batch of changes as statements: plain functions over
//! data, so that what reaches the table is decided where it can be tested.
//!
//! - A record becomes a [`Change`]: a row to write (each written column's value as
//!   text, SQL NULL, or absent: the column's default), or the key of a row to delete.
//! - A batch becomes [`Stmt`]s. In upsert mode only each key's last change counts (the
//!   row becomes its last record), so a batch is one delete of the keys whose last
//!   change is a delete and one insert per set of present columns; `previous` links
//!   each change to the one before it of its key, so that when the database refuses a
//!   key's last change, the one before is tried, as writing them in turn would have
//!   left it. In insert mode the changes keep their order: runs of one shape each
//!   make a statement.

use super::config::{Mode, Source};
use super::table::{quote_ident, Layout};
use super::types::to_text;
use crate::columns::Fields;
use crate::record::{Op, Record};
use serde_json::value::RawValue;
use std::collections::HashMap;

/// One written column's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cell {
    /// The record has no such field: the column's default (NULL without one).
    Default,
    Null,
    Text(String),
}

/// What one record asks of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A row: one cell per written column.
    Write(Vec<Cell>),
    /// Delete the rows whose key columns hold these values.
    Delete(Vec<String>),
}

/// Why a record makes no change: the column it concerns, if one, and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowError {
    pub column: Option<String>,
    pub message: String,
    /// The record is not a row at all (not a JSON object, no key), rather than a
    /// value that does not fit.
    pub invalid: bool,
}

impl RowError {
    fn column(name: &str, message: impl Into<String>) -> RowError {
        RowError {
            column: Some(name.to_string()),
            message: message.into(),
            invalid: false,
        }
    }

    fn record(message: impl Into<String>) -> RowError {
        RowError {
            column: None,
            message: message.into(),
            invalid: true,
        }
    }
}

impl std::fmt::Display for RowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.column {
            Some(c) => write!(f, "column `{c}`: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// The change `r` asks for, under `layout` and `mode`.
pub fn change_of(layout: &Layout, mode: Mode, r: &Record) -> Result<Change, RowError> {
    if r.tombstone || r.op == Op::Delete {
        return delete_of(layout, r).map(Change::Delete);
    }
    let fields = Fields::of(&r.value)
        .filter(Fields::is_object)
        .ok_or_else(|| RowError::record("the record is not a JSON object"))?;
    let mut cells = Vec::with_capacity(layout.written.len());
    for (i, w) in layout.written.iter().enumerate() {
        let c = &w.column;
        let raw = match &w.source {
            Source::Record => Some(fields.root()),
            Source::Pointer(p) => fields.get(p),
        };
        let cell = match raw {
            None => Cell::Default,
            Some(v) => match to_text(&c.kind, v).map_err(|m| RowError::column(&c.name, m))? {
                None => Cell::Null,
                Some(t) => Cell::Text(t),
            },
        };
        let is_key = layout.key.contains(&i);
        match &cell {
            Cell::Default if is_key && mode == Mode::Upsert => {
                return Err(RowError::column(
                    &c.name,
                    "the key column has no value in the record",
                ))
            }
            Cell::Null if is_key && mode == Mode::Upsert => {
                return Err(RowError::column(&c.name, "the key column is null"))
            }
            Cell::Null if c.not_null => {
                return Err(RowError::column(&c.name, "null in a NOT NULL column"))
            }
            Cell::Default if c.not_null && !c.has_default => {
                return Err(RowError::column(
                    &c.name,
                    "the record has no value for this NOT NULL column, which has no default",
                ))
            }
            _ => {}
        }
        cells.push(cell);
    }
    if cells.iter().all(|c| *c == Cell::Default) {
        return Err(RowError::record(
            "the record has none of the columns the sink writes",
        ));
    }
    Ok(Change::Write(cells))
}

/// The key values of a delete: from the image before it (its value, when it has
/// one), else from the record's key: a JSON object read like a value, or, for a
/// one-column key, a scalar or plain text.
fn delete_of(layout: &Layout, r: &Record) -> Result<Vec<String>, RowError> {
    if layout.key.is_empty() {
        return Err(RowError::record(
            "a delete names its row by the key columns, and sink.postgres.key names none",
        ));
    }
    let from = |fields: &Fields<'_>| -> Result<Option<Vec<String>>, RowError> {
        let mut out = Vec::new();
        for &k in &layout.key {
            let w = &layout.written[k];
            let p = match &w.source {
                Source::Pointer(p) => p.as_str(),
                Source::Record => return Ok(None),
            };
            let Some(v) = fields.get(p) else {
                return Ok(None);
            };
            match to_text(&w.column.kind, v).map_err(|m| RowError::column(&w.column.name, m))? {
                Some(t) => out.push(t),
                None => return Ok(None),
            }
        }
        Ok(Some(out))
    };
    if !r.tombstone && !r.value.is_empty() {
        if let Some(f) = Fields::of(&r.value).filter(Fields::is_object) {
            if let Some(k) = from(&f)? {
                return Ok(k);
            }
        }
    }
    let key = r.key.as_deref().unwrap_or_default();
    if let Some(f) = Fields::of(key).filter(Fields::is_object) {
        if let Some(k) = from(&f)? {
            return Ok(k);
        }
    } else if layout.key.len() == 1 && !key.is_empty() {
        // A one-column key may be the record's key itself: a JSON scalar (a string or a
        // number, as JSON converters write keys) or plain text, read like a value.
        let w = &layout.written[layout.key[0]];
        if let Ok(text) = std::str::from_utf8(key) {
            let scalar = serde_json::from_str::<&RawValue>(text)
                .ok()
                .filter(|v| !v.get().starts_with(['{', '[']));
            let owned;
            let raw = match scalar {
                Some(v) => v,
                None => {
                    owned = serde_json::value::to_raw_value(text).expect("a string serializes");
                    &owned
                }
            };
            if let Some(t) =
                to_text(&w.column.kind, raw).map_err(|m| RowError::column(&w.column.name, m))?
            {
                return Ok(vec![t]);
            }
        }
    }
    Err(RowError::record(
        "the delete names no row: neither the image before it nor the record's key holds the key columns",
    ))
}

/// One statement of a batch: which changes (by index) it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stmt {
    /// Rows with the columns of `present` (`true`: the change has a cell for it).
    Write {
        present: Vec<bool>,
        rows: Vec<usize>,
    },
    Delete {
        rows: Vec<usize>,
    },
}

/// The statements of a batch, and for each change the index of the previous change
/// of its key that the statements leave out (upsert mode), for [`Stmt`] fallbacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub stmts: Vec<Stmt>,
    pub previous: Vec<Option<usize>>,
}

fn present(cells: &[Cell]) -> Vec<bool> {
    cells.iter().map(|c| *c != Cell::Default).collect()
}

/// The key of change `c` (its key columns' values), for the upsert's reduction.
/// Its spelling is made canonical ([`super::types::canonical_key`]): `1.0` and `1`
/// name one row of a numeric key.
pub fn key_of(c: &Change, layout: &Layout) -> Vec<Option<String>> {
    let canonical = |n: usize, t: &str| {
        super::types::canonical_key(&layout.written[layout.key[n]].column.kind, t)
    };
    match c {
        Change::Delete(k) => k
            .iter()
            .enumerate()
            .map(|(n, t)| Some(canonical(n, t)))
            .collect(),
        Change::Write(cells) => layout
            .key
            .iter()
            .enumerate()
            .map(|(n, &i)| match &cells[i] {
                Cell::Text(t) => Some(canonical(n, t)),
                _ => None,
            })
            .collect(),
    }
}

/// The statements that apply `changes` in `mode` (see the module docs).
pub fn plan(changes: &[Change], mode: Mode, layout: &Layout) -> Plan {
    let mut previous = vec![None; changes.len()];
    let mut stmts: Vec<Stmt> = Vec::new();
    match mode {
        Mode::Upsert => {
            let mut last: HashMap<Vec<Option<String>>, usize> = HashMap::new();
            for (i, c) in changes.iter().enumerate() {
                if let Some(p) = last.insert(key_of(c, layout), i) {
                    previous[i] = Some(p);
                }
            }
            let mut survivors: Vec<usize> = last.into_values().collect();
            survivors.sort_unstable();
            let mut deletes = Vec::new();
            let mut writes: Vec<(Vec<bool>, Vec<usize>)> = Vec::new();
            for i in survivors {
                match &changes[i] {
                    Change::Delete(_) => deletes.push(i),
                    Change::Write(cells) => {
                        let p = present(cells);
                        match writes.iter_mut().find(|(q, _)| *q == p) {
                            Some((_, rows)) => rows.push(i),
                            None => writes.push((p, vec![i])),
                        }
                    }
                }
            }
            if !deletes.is_empty() {
                stmts.push(Stmt::Delete { rows: deletes });
            }
            stmts.extend(
                writes
                    .into_iter()
                    .map(|(present, rows)| Stmt::Write { present, rows }),
            );
        }
        Mode::Insert => {
            for (i, c) in changes.iter().enumerate() {
                let extended = match (stmts.last_mut(), c) {
                    (Some(Stmt::Delete { rows }), Change::Delete(_)) => {
                        rows.push(i);
                        true
                    }
                    (Some(Stmt::Write { present: p, rows }), Change::Write(cells))
                        if *p == present(cells) =>
                    {
                        rows.push(i);
                        true
                    }
                    _ => false,
                };
                if !extended {
                    stmts.push(match c {
                        Change::Delete(_) => Stmt::Delete { rows: vec![i] },
                        Change::Write(cells) => Stmt::Write {
                            present: present(cells),
                            rows: vec![i],
                        },
                    });
                }
            }
        }
    }
    Plan { stmts, previous }
}

/// The SQL of a write of the columns of `present`: the values arrive as one text
/// array per column and are cast to the column's type; an upsert sets the columns
/// present and resets the absent ones to their defaults, so that the row is the
/// record whatever it was before.
pub fn write_sql(layout: &Layout, mode: Mode, present: &[bool]) -> String {
    let cols: Vec<&super::table::Written> = layout
        .written
        .iter()
        .zip(present)
        .filter(|(_, p)| **p)
        .map(|(w, _)| w)
        .collect();
    let names: Vec<String> = cols.iter().map(|w| quote_ident(&w.column.name)).collect();
    let casts: Vec<String> = cols
        .iter()
        .enumerate()
        .map(|(i, w)| format!("u.a{i}::{}", w.column.sql_type))
        .collect();
    let params: Vec<String> = (1..=cols.len()).map(|i| format!("${i}::text[]")).collect();
    let aliases: Vec<String> = (0..cols.len()).map(|i| format!("a{i}")).collect();
    let mut sql = format!(
        "INSERT INTO {} ({}) SELECT {} FROM unnest({}) AS u({})",
        layout.table,
        names.join(", "),
        casts.join(", "),
        params.join(", "),
        aliases.join(", ")
    );
    if mode == Mode::Upsert {
        let keys: Vec<String> = layout
            .key
            .iter()
            .map(|&k| quote_ident(&layout.written[k].column.name))
            .collect();
        let sets: Vec<String> = layout
            .written
            .iter()
            .enumerate()
            // A column the record leaves out goes back to its default, except one a
            // sequence fills (a surrogate id keeps its value).
            .filter(|(i, w)| !layout.key.contains(i) && (present[*i] || !w.column.sequence))
            .map(|(i, w)| {
                let c = quote_ident(&w.column.name);
                if present[i] {
                    format!("{c} = EXCLUDED.{c}")
                } else {
                    format!("{c} = DEFAULT")
                }
            })
            .collect();
        if sets.is_empty() {
            sql.push_str(&format!(" ON CONFLICT ({}) DO NOTHING", keys.join(", ")));
        } else {
            sql.push_str(&format!(
                " ON CONFLICT ({}) DO UPDATE SET {}",
                keys.join(", "),
                sets.join(", ")
            ));
        }
    }
    sql
}

/// The `COPY ... FROM STDIN` of an insert of the columns of `present` (text format:
/// each value is read by its type's input function, as a cast from text is).
pub fn copy_sql(layout: &Layout, present: &[bool]) -> String {
    let names: Vec<String> = layout
        .written
        .iter()
        .zip(present)
        .filter(|(_, p)| **p)
        .map(|(w, _)| quote_ident(&w.column.name))
        .collect();
    format!("COPY {} ({}) FROM STDIN", layout.table, names.join(", "))
}

/// The rows `stmt_rows` of `changes` (writes, of one shape) in `COPY`'s text format: a
/// line per row, the present cells separated by tabs, NULL as `\N`, and backslash,
/// tab, newline and carriage return escaped.
pub fn copy_text(changes: &[Change], stmt_rows: &[usize]) -> String {
    let mut out = String::with_capacity(stmt_rows.len() * 48);
    for &r in stmt_rows {
        let Change::Write(cells) = &changes[r] else {
            continue;
        };
        let mut first = true;
        for c in cells {
            let text = match c {
                Cell::Default => continue,
                Cell::Null => None,
                Cell::Text(t) => Some(t),
            };
            if !first {
                out.push('\t');
            }
            first = false;
            match text {
                None => out.push_str("\\N"),
                Some(t) if !t.contains(['\\', '\t', '\n', '\r']) => out.push_str(t),
                Some(t) => {
                    for ch in t.chars() {
                        match ch {
                            '\\' => out.push_str("\\\\"),
                            '\t' => out.push_str("\\t"),
                            '\n' => out.push_str("\\n"),
                            '\r' => out.push_str("\\r"),
                            other => out.push(other),
                        }
                    }
                }
            }
        }
        out.push('\n');
    }
    out
}

/// The SQL of a delete by the key columns, whose values arrive as one text array per
/// key column.
pub fn delete_sql(layout: &Layout) -> String {
    let n = layout.key.len();
    let params: Vec<String> = (1..=n).map(|i| format!("${i}::text[]")).collect();
    let aliases: Vec<String> = (0..n).map(|i| format!("a{i}")).collect();
    let conds: Vec<String> = layout
        .key
        .iter()
        .enumerate()
        .map(|(i, &k)| {
            let c = &layout.written[k].column;
            format!("t.{} = u.a{i}::{}", quote_ident(&c.name), c.sql_type)
        })
        .collect();
    format!(
        "DELETE FROM {} AS t USING unnest({}) AS u({}) WHERE {}",
        layout.table,
        params.join(", "),
        aliases.join(", "),
        conds.join(" AND ")
    )
}

/// The parameters of a statement over `rows` of `changes`: one text array per
/// column of the statement.
pub fn params(
    changes: &[Change],
    stmt_rows: &[usize],
    layout: &Layout,
    stmt: &Stmt,
) -> Vec<Vec<Option<String>>> {
    match stmt {
        Stmt::Write { present, .. } => {
            let cols: Vec<usize> = (0..present.len()).filter(|i| present[*i]).collect();
            let mut out = vec![Vec::with_capacity(stmt_rows.len()); cols.len()];
            for &r in stmt_rows {
                let Change::Write(cells) = &changes[r] else {
                    continue;
                };
                for (o, &c) in out.iter_mut().zip(&cols) {
                    o.push(match &cells[c] {
                        Cell::Text(t) => Some(t.clone()),
                        _ => None,
                    });
                }
            }
            out
        }
        Stmt::Delete { .. } => {
            let mut out = vec![Vec::with_capacity(stmt_rows.len()); layout.key.len()];
            for &r in stmt_rows {
                if let Change::Delete(k) = &changes[r] {
                    for (o, v) in out.iter_mut().zip(k) {
                        o.push(Some(v.clone()));
                    }
                }
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::postgres::table::{layout, tests as t};

    fn rec(json: &str) -> Record {
        Record::from_value(json.as_bytes().to_vec())
    }

    fn upsert_layout() -> Layout {
        layout(&t::cfg(Mode::Upsert, &["user"], None), &t::table()).unwrap()
    }

    fn text(s: &str) -> Cell {
        Cell::Text(s.into())
    }

    #[test]
    fn a_record_is_a_row_of_its_fields_absent_ones_default() {
        let l = upsert_layout();
        assert_eq!(
            change_of(&l, Mode::Upsert, &rec(r#"{"user":"a","total":5,"x":1}"#)).unwrap(),
            Change::Write(vec![text("a"), text("5")])
        );
        assert_eq!(
            change_of(&l, Mode::Upsert, &rec(r#"{"user":"a"}"#)).unwrap(),
            Change::Write(vec![text("a"), Cell::Default])
        );
        assert_eq!(
            change_of(&l, Mode::Upsert, &rec(r#"{"user":"a","total":null}"#)).unwrap(),
            Change::Write(vec![text("a"), Cell::Null])
        );
        let e = change_of(&l, Mode::Upsert, &rec(r#"{"user":"a","total":"x"}"#)).unwrap_err();
        assert_eq!(e.column.as_deref(), Some("total"));
        let e = change_of(&l, Mode::Upsert, &rec(r#"{"total":1}"#)).unwrap_err();
        assert!(e
            .to_string()
            .contains("column `user`: the key column has no value"));
        assert!(
            change_of(&l, Mode::Upsert, &rec("[1]"))
                .unwrap_err()
                .invalid
        );
        assert!(
            change_of(&l, Mode::Upsert, &rec("nope"))
                .unwrap_err()
                .invalid
        );
    }

    #[test]
    fn a_delete_finds_its_key_in_the_image_or_the_record_key() {
        let l = upsert_layout();
        let mut r = rec(r#"{"user":"b","total":1}"#);
        r.op = Op::Delete;
        assert_eq!(
            change_of(&l, Mode::Upsert, &r).unwrap(),
            Change::Delete(vec!["b".into()])
        );
        let mut tomb = Record {
            tombstone: true,
            key: Some(bytes::Bytes::from_static(br#"{"user":"c"}"#)),
            ..Record::default()
        };
        assert_eq!(
            change_of(&l, Mode::Upsert, &tomb).unwrap(),
            Change::Delete(vec!["c".into()])
        );
        tomb.key = Some(bytes::Bytes::from_static(b"plain-key"));
        assert_eq!(
            change_of(&l, Mode::Upsert, &tomb).unwrap(),
            Change::Delete(vec!["plain-key".into()])
        );
        // A JSON string key, as a JSON converter writes one: its text, unquoted.
        tomb.key = Some(bytes::Bytes::from_static(br#""quoted""#));
        assert_eq!(
            change_of(&l, Mode::Upsert, &tomb).unwrap(),
            Change::Delete(vec!["quoted".into()])
        );
        tomb.key = None;
        assert!(change_of(&l, Mode::Upsert, &tomb).unwrap_err().invalid);
    }

    #[test]
    fn fields_with_escaped_names_are_found_too() {
        let l = upsert_layout();
        assert_eq!(
            change_of(&l, Mode::Upsert, &rec(r#"{"us\u0065r":"a","total":5}"#)).unwrap(),
            Change::Write(vec![text("a"), text("5")])
        );
    }

    #[test]
    fn an_upsert_batch_keeps_each_keys_last_change_and_remembers_the_one_before() {
        let w =
            |u: &str, t: Option<&str>| Change::Write(vec![text(u), t.map_or(Cell::Default, text)]);
        let changes = vec![
            w("a", Some("1")),
            w("b", Some("1")),
            w("a", Some("2")),
            Change::Delete(vec!["b".into()]),
            w("c", None),
        ];
        let p = plan(&changes, Mode::Upsert, &upsert_layout());
        assert_eq!(
            p.stmts,
            vec![
                Stmt::Delete { rows: vec![3] },
                Stmt::Write {
                    present: vec![true, true],
                    rows: vec![2]
                },
                Stmt::Write {
                    present: vec![true, false],
                    rows: vec![4]
                },
            ]
        );
        assert_eq!(p.previous, vec![None, None, Some(0), Some(1), None]);
    }

    #[test]
    fn an_insert_batch_keeps_its_order_in_runs_of_one_shape() {
        let w = |u: &str| Change::Write(vec![text(u), text("1")]);
        let changes = vec![w("a"), w("b"), Change::Delete(vec!["a".into()]), w("a")];
        let p = plan(&changes, Mode::Insert, &upsert_layout());
        assert_eq!(
            p.stmts,
            vec![
                Stmt::Write {
                    present: vec![true, true],
                    rows: vec![0, 1]
                },
                Stmt::Delete { rows: vec![2] },
                Stmt::Write {
                    present: vec![true, true],
                    rows: vec![3]
                },
            ]
        );
    }

    #[test]
    fn copy_text_escapes_what_its_format_reserves_and_skips_absent_cells() {
        let changes = vec![
            Change::Write(vec![text("a\tb\\c\nd\re"), Cell::Null]),
            Change::Write(vec![text("x"), Cell::Default]),
        ];
        assert_eq!(copy_text(&changes, &[0, 1]), "a\\tb\\\\c\\nd\\re\t\\N\nx\n");
        let l = upsert_layout();
        assert_eq!(
            copy_sql(&l, &[true, false]),
            "COPY public.t (\"user\") FROM STDIN"
        );
    }

    #[test]
    fn the_statements_cast_text_arrays_and_reset_absent_columns() {
        let l = upsert_layout();
        assert_eq!(
            write_sql(&l, Mode::Upsert, &[true, false]),
            "INSERT INTO public.t (\"user\") SELECT u.a0::text FROM unnest($1::text[]) AS u(a0) ON CONFLICT (\"user\") DO UPDATE SET \"total\" = DEFAULT"
        );
        assert_eq!(
            write_sql(&l, Mode::Insert, &[true, true]),
            "INSERT INTO public.t (\"user\", \"total\") SELECT u.a0::text, u.a1::int8 FROM unnest($1::text[], $2::text[]) AS u(a0, a1)"
        );
        assert_eq!(
            delete_sql(&l),
            "DELETE FROM public.t AS t USING unnest($1::text[]) AS u(a0) WHERE t.\"user\" = u.a0::text"
        );
    }
}
