//! Change events as Debezium's PostgreSQL connector writes them (JSON without the
//! schema envelope), made of a table's rows: the value
//! `{before, after, source, op, ts_ms}`, the key the primary key's columns as an
//! object.

use super::values;
use crate::record::{Op, Origin, Record};
use serde_json::{Map, Value};
use std::sync::Arc;

/// Debezium's text for a TOASTed value that an update did not change (the stream does
/// not send it again).
pub const UNAVAILABLE: &str = "__debezium_unavailable_value";

/// A column as the events need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub type_oid: u32,
    pub type_modifier: i32,
}

/// A table's shape: its columns in order and which of them make the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// `schema.table`: the records' stream.
    pub stream: Arc<str>,
    pub schema: String,
    pub table: String,
    pub columns: Vec<Column>,
    /// The positions of the primary key's columns, in the key's order.
    pub key: Vec<usize>,
}

/// One column's value in a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cell<'a> {
    Null,
    /// A TOASTed value the change left as it was.
    Unchanged,
    Text(&'a str),
}

/// Which operation an event reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Read,
    Create,
    Update,
    Delete,
    Truncate,
}

impl Kind {
    fn op(self) -> &'static str {
        match self {
            Kind::Read => "r",
            Kind::Create => "c",
            Kind::Update => "u",
            Kind::Delete => "d",
            Kind::Truncate => "t",
        }
    }
}

/// Where an event comes from, for its `source` block.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    pub db: &'a str,
    pub lsn: Option<u64>,
    pub tx_id: Option<u32>,
    /// The commit's time (a snapshot: the read's), in milliseconds since the epoch.
    pub ts_ms: i64,
    pub snapshot: bool,
}

impl Shape {
    /// The row `cells` (in column order) as an object of converted values; an error
    /// names the column.
    pub fn row(&self, cells: &[Cell<'_>]) -> Result<Value, String> {
        if cells.len() != self.columns.len() {
            return Err(format!(
                "{}: a row of {} columns, the table has {}",
                self.stream,
                cells.len(),
                self.columns.len()
            ));
        }
        let mut m = Map::with_capacity(cells.len());
        for (c, cell) in self.columns.iter().zip(cells) {
            let v = match cell {
                Cell::Null => Value::Null,
                Cell::Unchanged => Value::String(UNAVAILABLE.into()),
                Cell::Text(t) => values::convert(c.type_oid, c.type_modifier, t)
                    .map_err(|e| format!("{}, column {}: {e}", self.stream, c.name))?,
            };
            m.insert(c.name.clone(), v);
        }
        Ok(Value::Object(m))
    }

    /// The row's key columns' texts, in the key's order.
    pub fn key_texts(&self, cells: &[Cell<'_>]) -> Result<Vec<String>, String> {
        self.key
            .iter()
            .map(|&i| match cells.get(i) {
                Some(Cell::Text(t)) => Ok(t.to_string()),
                _ => Err(format!(
                    "{}: key column {} has no value in the change (is the table's REPLICA IDENTITY its primary key or FULL?)",
                    self.stream,
                    self.columns.get(i).map_or("?", |c| c.name.as_str())
                )),
            })
            .collect()
    }

    /// The key object of the key texts `key`.
    pub fn key_object(&self, key: &[String]) -> Result<Value, String> {
        let mut m = Map::with_capacity(key.len());
        for (&i, text) in self.key.iter().zip(key) {
            let c = &self.columns[i];
            let v = values::convert(c.type_oid, c.type_modifier, text)
                .map_err(|e| format!("{}, key column {}: {e}", self.stream, c.name))?;
            m.insert(c.name.clone(), v);
        }
        Ok(Value::Object(m))
    }

    /// The image of a row of which only the key is known: the key's values, every
    /// other column null (Debezium's `before` of a delete under the default replica
    /// identity).
    pub fn key_only_row(&self, key: &[String]) -> Result<Value, String> {
        let Value::Object(k) = self.key_object(key)? else {
            unreachable!("key_object makes an object")
        };
        let mut m = Map::with_capacity(self.columns.len());
        for c in &self.columns {
            m.insert(
                c.name.clone(),
                k.get(&c.name).cloned().unwrap_or(Value::Null),
            );
        }
        Ok(Value::Object(m))
    }

    /// An event of this table. `key` is the key object (`None`: a truncate, which has
    /// none); `offset` is the record's place for its origin (the change's LSN, a
    /// snapshot row's number).
    #[allow(clippy::too_many_arguments)]
    pub fn event(
        &self,
        kind: Kind,
        key: Option<&Value>,
        before: Option<Value>,
        after: Option<Value>,
        source: &Source<'_>,
        offset: i64,
        now_ms: i64,
    ) -> Record {
        let mut src = Map::with_capacity(8);
        src.insert("connector".into(), "postgresql".into());
        src.insert("db".into(), source.db.into());
        src.insert("schema".into(), self.schema.as_str().into());
        src.insert("table".into(), self.table.as_str().into());
        src.insert("lsn".into(), source.lsn.map_or(Value::Null, Value::from));
        src.insert("txId".into(), source.tx_id.map_or(Value::Null, Value::from));
        src.insert("ts_ms".into(), source.ts_ms.into());
        src.insert(
            "snapshot".into(),
            if source.snapshot { "true" } else { "false" }.into(),
        );
        let mut v = Map::with_capacity(5);
        v.insert("before".into(), before.unwrap_or(Value::Null));
        v.insert("after".into(), after.unwrap_or(Value::Null));
        v.insert("source".into(), Value::Object(src));
        v.insert("op".into(), kind.op().into());
        v.insert("ts_ms".into(), now_ms.into());
        Record {
            key: key.map(|k| serde_json::to_vec(k).expect("JSON serializes").into()),
            value: serde_json::to_vec(&Value::Object(v))
                .expect("JSON serializes")
                .into(),
            origin: Some(Origin {
                stream: self.stream.clone(),
                partition: 0,
                offset,
            }),
            timestamp: Some(source.ts_ms),
            op: if kind == Kind::Delete {
                Op::Delete
            } else {
                Op::Upsert
            },
            ..Record::default()
        }
    }
}

/// Milliseconds since the Unix epoch of pgoutput's commit time (microseconds since
/// 2000-01-01 UTC).
pub fn pg_time_ms(pg_micros: i64) -> i64 {
    const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;
    (pg_micros + PG_EPOCH_MICROS).div_euclid(1000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn shape() -> Shape {
        let col = |name: &str, type_oid| Column {
            name: name.into(),
            type_oid,
            type_modifier: -1,
        };
        Shape {
            stream: Arc::from("public.accounts"),
            schema: "public".into(),
            table: "accounts".into(),
            columns: vec![col("id", 23), col("name", 25), col("balance", 1700)],
            key: vec![0],
        }
    }

    #[test]
    fn an_update_event_as_debezium_writes_it() {
        let s = shape();
        let cells = [Cell::Text("7"), Cell::Unchanged, Cell::Text("10.50")];
        let key = s.key_object(&s.key_texts(&cells).unwrap()).unwrap();
        let after = s.row(&cells).unwrap();
        let src = Source {
            db: "shop",
            lsn: Some(0x1_0000_0000),
            tx_id: Some(42),
            ts_ms: 1_700_000_000_000,
            snapshot: false,
        };
        let r = s.event(Kind::Update, Some(&key), None, Some(after), &src, 99, 5);
        assert_eq!(r.key.as_deref(), Some(&br#"{"id":7}"#[..]));
        let v: Value = serde_json::from_slice(&r.value).unwrap();
        assert_eq!(
            v,
            json!({
                "before": null,
                "after": {"id": 7, "name": UNAVAILABLE, "balance": serde_json::from_str::<Value>("10.50").unwrap()},
                "source": {"connector": "postgresql", "db": "shop", "schema": "public",
                    "table": "accounts", "lsn": 4294967296u64, "txId": 42,
                    "ts_ms": 1_700_000_000_000i64, "snapshot": "false"},
                "op": "u",
                "ts_ms": 5
            })
        );
        assert!(
            String::from_utf8_lossy(&r.value).contains("\"balance\":10.50"),
            "a numeric keeps its digits"
        );
        assert_eq!(r.op, Op::Upsert);
        assert_eq!(
            r.origin.as_ref().unwrap().stream.as_ref(),
            "public.accounts"
        );
    }

    #[test]
    fn a_delete_by_key_only_and_its_errors() {
        let s = shape();
        let before = s.key_only_row(&["3".into()]).unwrap();
        assert_eq!(before, json!({"id": 3, "name": null, "balance": null}));
        let src = Source {
            db: "d",
            lsn: None,
            tx_id: None,
            ts_ms: 0,
            snapshot: true,
        };
        let r = s.event(Kind::Delete, None, Some(before), None, &src, 0, 0);
        assert_eq!(r.op, Op::Delete);
        assert!(s
            .row(&[Cell::Null])
            .unwrap_err()
            .contains("a row of 1 columns"));
        assert!(s
            .key_texts(&[Cell::Null, Cell::Null, Cell::Null])
            .unwrap_err()
            .contains("key column id"));
        assert!(s
            .row(&[Cell::Text("x"), Cell::Null, Cell::Null])
            .unwrap_err()
            .contains("column id"));
    }

    #[test]
    fn commit_times_in_milliseconds() {
        assert_eq!(pg_time_ms(0), 946_684_800_000);
        assert_eq!(pg_time_ms(1_500), 946_684_800_001);
    }
}
