//! `debezium` (Debezium's `ExtractNewRecordState`): a change event becomes the row
//! it leaves behind, and a delete a delete.
//!
//! | `op` | becomes |
//! |---|---|
//! | `c`, `r`, `u` (create, snapshot read, update) | the `after` image, an upsert |
//! | `d` (delete) | by `delete_handling`: a delete whose value is the `before` image (a tombstone of the key when there is none); nothing (`drop`); or the `before` image with `__deleted = "true"` (`rewrite`, where every other row gets `"false"`) |
//! | `t` (truncate) | an error (`on_error`): a table's truncate names no rows |
//! | a Kafka tombstone (Debezium's, after a delete) | nothing (`drop_tombstones = true`, the default), or the tombstone |
//!
//! The event is read as Debezium writes it with `JsonConverter` (with or without the
//! `{"schema", "payload"}` envelope, whose logical types are decoded: decimals become
//! numbers, Debezium's semantic types (`io.debezium.time.Date`, `MicroTimestamp`,
//! `io.debezium.data.VariableScaleDecimal`, ...) ISO 8601 text and exact numbers, as
//! [`crate::formats::debezium_types`] says, Kafka Connect's `Timestamp` and `Time` as
//! `temporal` says) or as the Avro format decodes it; a key in an envelope becomes its
//! payload, so that `id = "field:/id"` finds the id of a delete without a `before`.

use super::{Meta, Parts, Smt, SmtConfig};
use crate::connector::{KeyError, SectionContext};
use crate::dead_letter::OnError;
use crate::formats::avro::Temporal;
use crate::formats::connect_json;
use crate::record::Op;
use serde_json::{Map, Value};
use std::sync::Arc;

/// `[[transform]] type = "debezium"`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DebeziumConfig {
    /// `delete` (default), `drop` or `rewrite`.
    #[serde(default)]
    pub delete_handling: Option<String>,
    /// Drop Kafka tombstones (default true).
    #[serde(default = "yes")]
    pub drop_tombstones: bool,
    /// Fields of the event added to the row as `__<name>` (dots become `_`): `op`,
    /// `ts_ms` and other top-level fields by name, `source.<field>` by path, and a
    /// bare name of the `source` block (`table`, `lsn`) as Debezium's `add.fields`.
    #[serde(default)]
    pub add_fields: Vec<String>,
    /// `fail` (default), `skip` or `dead-letter:<topic>`: what an event that is not a
    /// change event becomes.
    #[serde(default)]
    pub on_error: Option<String>,
    /// `epoch-millis` (default) or `iso8601`: how Kafka Connect's own `Timestamp` and
    /// `Time` in an envelope are written (`time.precision.mode = connect`), as the
    /// source's `temporal`.
    #[serde(default)]
    pub temporal: Option<String>,
}

fn yes() -> bool {
    true
}

/// What a delete becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteHandling {
    Delete,
    Drop,
    Rewrite,
}

/// The transform.
#[derive(Debug)]
pub struct Debezium {
    pub deletes: DeleteHandling,
    pub drop_tombstones: bool,
    /// Each added field: its path in the event and its name in the row.
    pub add_fields: Vec<(Vec<String>, String)>,
    pub on_error: OnError,
    /// How Kafka Connect's `Timestamp` and `Time` in an envelope are written.
    pub temporal: Temporal,
}

impl SmtConfig for DebeziumConfig {
    const KIND: &'static str = "debezium";

    fn build(self, cx: &SectionContext) -> Result<Arc<dyn Smt>, KeyError> {
        let deletes = match self.delete_handling.as_deref() {
            None | Some("delete") => DeleteHandling::Delete,
            Some("drop") => DeleteHandling::Drop,
            Some("rewrite") => DeleteHandling::Rewrite,
            Some(other) => {
                return Err(KeyError::new(
                    "delete_handling",
                    format!("`{other}` is not one of delete, drop, rewrite"),
                ))
            }
        };
        let temporal = match self.temporal.as_deref() {
            None | Some("epoch-millis") => Temporal::EpochMillis,
            Some("iso8601") => Temporal::Iso8601,
            Some(other) => {
                return Err(KeyError::new(
                    "temporal",
                    format!("`{other}` is not one of epoch-millis, iso8601"),
                ))
            }
        };
        let mut add_fields = Vec::new();
        for f in self.add_fields {
            let path: Vec<String> = match f.split_once('.') {
                Some(_) => f.split('.').map(String::from).collect(),
                None if ["op", "ts_ms", "ts_us", "ts_ns"].contains(&f.as_str()) => vec![f.clone()],
                None => vec!["source".into(), f.clone()],
            };
            if f.is_empty() || path.iter().any(String::is_empty) {
                return Err(KeyError::new(
                    "add_fields",
                    format!("`{f}` is not a field name"),
                ));
            }
            add_fields.push((path, format!("__{}", f.replace('.', "_"))));
        }
        Ok(Arc::new(Debezium {
            deletes,
            drop_tombstones: self.drop_tombstones,
            add_fields,
            on_error: super::on_error(self.on_error.as_deref(), cx)?,
            temporal,
        }))
    }
}

impl Debezium {
    /// The row of `event` (already out of its envelope) with the added fields and,
    /// under `rewrite`, `__deleted`.
    fn row(&self, event: &Map<String, Value>, image: &str, deleted: bool) -> Result<Value, String> {
        let mut row = match event.get(image) {
            Some(Value::Object(o)) => o.clone(),
            Some(Value::Null) | None => {
                return Err(format!("the event has no `{image}` image"));
            }
            Some(other) => return Err(format!("`{image}` is not an object: {other}")),
        };
        for (path, name) in &self.add_fields {
            let mut v = event.get(&path[0]);
            for p in &path[1..] {
                v = v.and_then(|v| v.get(p));
            }
            row.insert(name.clone(), v.cloned().unwrap_or(Value::Null));
        }
        if self.deletes == DeleteHandling::Rewrite {
            row.insert("__deleted".into(), Value::from(deleted.to_string()));
        }
        Ok(Value::Object(row))
    }
}

/// The key out of its envelope, if it is in one.
fn unwrapped_key(key: &mut Option<Vec<u8>>, temporal: Temporal) -> Result<(), String> {
    let Some(k) = key.as_ref() else {
        return Ok(());
    };
    match serde_json::from_slice::<Value>(k) {
        Ok(v) if connect_json::is_envelope(&v) => {
            let payload = connect_json::unwrap(v, temporal).map_err(|e| format!("the key: {e}"))?;
            *key = Some(match payload {
                Value::String(s) => s.into_bytes(),
                other => serde_json::to_vec(&other).expect("a JSON value serializes"),
            });
            Ok(())
        }
        _ => Ok(()),
    }
}

impl Smt for Debezium {
    fn may_delete(&self) -> bool {
        matches!(self.deletes, DeleteHandling::Delete)
    }

    fn apply(&self, parts: &mut Parts, meta: &Meta) -> Result<(), String> {
        let mut out = Vec::with_capacity(1);
        self.expand(parts.clone(), meta, &mut out)?;
        match <[Parts; 1]>::try_from(out) {
            Ok([one]) => {
                *parts = one;
                Ok(())
            }
            Err(out) => Err(format!("{} records where one was expected", out.len())),
        }
    }

    fn expand(&self, mut parts: Parts, _: &Meta, out: &mut Vec<Parts>) -> Result<(), String> {
        unwrapped_key(&mut parts.key, self.temporal)?;
        if parts.tombstone {
            if !self.drop_tombstones {
                out.push(parts);
            }
            return Ok(());
        }
        let value = std::mem::take(&mut parts.value);
        let event = if connect_json::is_envelope(&value) {
            connect_json::unwrap(value, self.temporal)?
        } else {
            value
        };
        let Value::Object(event) = event else {
            return Err(format!("a change event is an object, not {event}"));
        };
        let op = match event.get("op") {
            Some(Value::String(op)) => op.as_str(),
            _ => return Err("not a change event: no `op`".into()),
        };
        match op {
            "c" | "r" | "u" => {
                parts.value = self.row(&event, "after", false)?;
                parts.op = Op::Upsert;
            }
            "d" => match self.deletes {
                DeleteHandling::Drop => return Ok(()),
                DeleteHandling::Rewrite => {
                    parts.value = self.row(&event, "before", true)?;
                    parts.op = Op::Upsert;
                }
                DeleteHandling::Delete => {
                    parts.op = Op::Delete;
                    match event.get("before") {
                        // Without a before image (REPLICA IDENTITY DEFAULT lacks
                        // none; some connectors omit it) the key names the row.
                        None | Some(Value::Null) => {
                            parts.value = Value::Null;
                            parts.tombstone = true;
                        }
                        Some(_) => parts.value = self.row(&event, "before", true)?,
                    }
                }
            },
            "t" => return Err("a truncate event (op = t) names no rows to write or delete".into()),
            other => return Err(format!("unknown op `{other}`")),
        }
        out.push(parts);
        Ok(())
    }

    fn reads_tombstones(&self) -> bool {
        // Debezium's tombstones follow its deletes: this transform drops them (or
        // passes them on), so they need not be a record the source cannot decode.
        true
    }

    fn on_error(&self) -> &OnError {
        &self.on_error
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn debezium(toml_text: &str) -> Arc<dyn Smt> {
        let c: DebeziumConfig = toml::from_str(toml_text).unwrap();
        c.build(&crate::testkit::conformance::section_context(
            std::path::Path::new("."),
        ))
        .unwrap()
    }

    fn run(smt: &Arc<dyn Smt>, value: Value, key: Option<&str>) -> Result<Vec<Parts>, String> {
        let parts = Parts {
            key: key.map(|k| k.as_bytes().to_vec()),
            tombstone: value.is_null(),
            ..Parts::of_value(value)
        };
        let mut out = Vec::new();
        smt.expand(parts, &Meta::default(), &mut out)?;
        Ok(out)
    }

    /// Debezium's PostgreSQL events for a row of `customers` (from its tutorial).
    fn event(op: &str, before: Value, after: Value) -> Value {
        json!({"before": before, "after": after, "op": op, "ts_ms": 1_700_000_000_500i64,
               "source": {"connector": "postgresql", "table": "customers", "lsn": 33_227_720,
                          "ts_ms": 1_700_000_000_000i64}})
    }

    #[test]
    fn creates_reads_and_updates_become_the_after_image() {
        let d = debezium("");
        let row = json!({"id": 1004, "first_name": "Anne", "email": "annek@noanswer.org"});
        for op in ["c", "r", "u"] {
            let out = run(
                &d,
                event(op, Value::Null, row.clone()),
                Some(r#"{"id":1004}"#),
            )
            .unwrap();
            assert_eq!(out.len(), 1);
            assert_eq!(out[0].value, row);
            assert_eq!(out[0].op, Op::Upsert);
            assert_eq!(out[0].key.as_deref(), Some(&br#"{"id":1004}"#[..]));
        }
    }

    #[test]
    fn a_delete_is_a_delete_of_the_before_image_or_of_the_key() {
        let d = debezium("");
        let before = json!({"id": 1004, "first_name": "Anne"});
        let out = run(&d, event("d", before.clone(), Value::Null), Some("k")).unwrap();
        assert_eq!(out[0].op, Op::Delete);
        assert_eq!(out[0].value, before);
        assert!(!out[0].tombstone);
        let out = run(&d, event("d", Value::Null, Value::Null), Some("k")).unwrap();
        assert_eq!(out[0].op, Op::Delete);
        assert!(out[0].tombstone, "the key names the row");
        // Debezium's tombstone after the delete: dropped by default.
        assert!(run(&d, Value::Null, Some("k")).unwrap().is_empty());
        let keep = debezium("drop_tombstones = false");
        let out = run(&keep, Value::Null, Some("k")).unwrap();
        assert!(out[0].tombstone && out[0].op == Op::Upsert);
    }

    #[test]
    fn delete_handling_drop_and_rewrite() {
        let before = json!({"id": 1});
        let drop = debezium("delete_handling = \"drop\"");
        assert!(run(&drop, event("d", before.clone(), Value::Null), None)
            .unwrap()
            .is_empty());
        let rewrite = debezium("delete_handling = \"rewrite\"");
        let out = run(&rewrite, event("d", before, Value::Null), None).unwrap();
        assert_eq!(out[0].value, json!({"id": 1, "__deleted": "true"}));
        assert_eq!(out[0].op, Op::Upsert);
        let out = run(&rewrite, event("c", Value::Null, json!({"id": 2})), None).unwrap();
        assert_eq!(out[0].value, json!({"id": 2, "__deleted": "false"}));
    }

    #[test]
    fn add_fields_as_debezium_names_them() {
        let d = debezium(r#"add_fields = ["op", "table", "lsn", "source.ts_ms", "ts_ms"]"#);
        let out = run(&d, event("u", Value::Null, json!({"id": 1})), None).unwrap();
        assert_eq!(
            out[0].value,
            json!({"id": 1, "__op": "u", "__table": "customers", "__lsn": 33_227_720,
                   "__source_ts_ms": 1_700_000_000_000i64, "__ts_ms": 1_700_000_000_500i64})
        );
    }

    #[test]
    fn the_envelope_of_value_and_key_is_unwrapped_with_its_decimals() {
        let d = debezium("");
        let value = json!({
            "schema": {"type": "struct", "fields": [
                {"field": "before", "type": "struct", "optional": true, "fields": []},
                {"field": "after", "type": "struct", "optional": true, "fields": [
                    {"field": "id", "type": "int32"},
                    {"field": "price", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                     "parameters": {"scale": "2"}}
                ]},
                {"field": "op", "type": "string"}
            ]},
            "payload": {"before": null, "after": {"id": 7, "price": "B8YV"}, "op": "c"}
        });
        let key = r#"{"schema":{"type":"struct","fields":[{"field":"id","type":"int32"}]},"payload":{"id":7}}"#;
        let out = run(&d, value, Some(key)).unwrap();
        assert_eq!(out[0].value, json!({"id": 7, "price": 5094.61}));
        assert_eq!(out[0].key.as_deref(), Some(&br#"{"id":7}"#[..]));
    }

    /// Debezium's PostgreSQL connector with its default `time.precision.mode =
    /// adaptive`: a `date` is `io.debezium.time.Date` (days), a `timestamp(6)` a
    /// `MicroTimestamp`, a `numeric` without scale a `VariableScaleDecimal`; each
    /// reaches the row as ISO 8601 text or its exact digits, never the bare number.
    #[test]
    fn debezium_semantic_types_in_the_envelope_are_decoded() {
        let field = |name: &str, ty: &str, semantic: &str| json!({"field": name, "type": ty, "optional": true, "name": semantic, "version": 1});
        let row = json!({"type": "struct", "optional": true, "name": "db.public.orders.Value", "fields": [
            {"field": "id", "type": "int32"},
            field("day", "int32", "io.debezium.time.Date"),
            field("old_day", "int32", "io.debezium.time.Date"),
            field("at", "int64", "io.debezium.time.MicroTimestamp"),
            field("at_ms", "int64", "io.debezium.time.Timestamp"),
            field("t", "int64", "io.debezium.time.MicroTime"),
            field("zoned", "string", "io.debezium.time.ZonedTimestamp"),
            field("year", "int32", "io.debezium.time.Year"),
            {"field": "amount", "type": "struct", "optional": true,
             "name": "io.debezium.data.VariableScaleDecimal", "version": 1, "fields": [
                {"field": "scale", "type": "int32"}, {"field": "value", "type": "bytes"}]},
            {"field": "connect_at", "type": "int64", "optional": true,
             "name": "org.apache.kafka.connect.data.Timestamp", "version": 1}
        ]});
        let value = json!({
            "schema": {"type": "struct", "fields": [
                {"field": "before", "type": "struct", "optional": true, "fields": row["fields"].clone()},
                {"field": "after", "type": "struct", "optional": true, "fields": row["fields"].clone()},
                {"field": "op", "type": "string"}
            ]},
            "payload": {"before": null, "op": "c", "after": {
                "id": 7, "day": 19_844, "old_day": -3_653, "at": 1_714_566_896_789_012i64,
                "at_ms": -1, "t": 45_296_789_012i64, "zoned": "2024-05-01T10:34:56.789012Z",
                "year": 2024, "amount": {"scale": 2, "value": "BM4="},
                "connect_at": 1_714_566_896_789i64}}
        });
        let out = run(&debezium(""), value.clone(), None).unwrap();
        let amount: Value = serde_json::from_str("12.30").unwrap();
        assert_eq!(
            out[0].value,
            json!({"id": 7, "day": "2024-05-01", "old_day": "1960-01-01",
                   "at": "2024-05-01T12:34:56.789012", "at_ms": "1969-12-31T23:59:59.999",
                   "t": "12:34:56.789012", "zoned": "2024-05-01T10:34:56.789012Z",
                   "year": 2024, "amount": amount, "connect_at": 1_714_566_896_789i64})
        );
        // The decimal keeps its text.
        assert_eq!(out[0].value["amount"].to_string(), "12.30");
        // Connect's own Timestamp as `temporal` says.
        let out = run(&debezium("temporal = \"iso8601\""), value, None).unwrap();
        assert_eq!(out[0].value["connect_at"], "2024-05-01T12:34:56.789Z");
        assert_eq!(out[0].value["day"], "2024-05-01");
        let c: DebeziumConfig = toml::from_str("temporal = \"unix\"").unwrap();
        let e = c
            .build(&crate::testkit::conformance::section_context(
                std::path::Path::new("."),
            ))
            .unwrap_err();
        assert_eq!(e.key, "temporal");
    }

    #[test]
    fn what_is_not_a_change_event_is_an_error() {
        let d = debezium("");
        for (v, why) in [
            (json!({"after": {}}), "no `op`"),
            (json!([1]), "an object"),
            (event("t", Value::Null, Value::Null), "truncate"),
            (event("x", Value::Null, json!({})), "unknown op"),
            (event("c", Value::Null, Value::Null), "no `after`"),
        ] {
            let e = run(&d, v, None).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
        let c: DebeziumConfig = toml::from_str("delete_handling = \"none\"").unwrap();
        let e = c
            .build(&crate::testkit::conformance::section_context(
                std::path::Path::new("."),
            ))
            .unwrap_err();
        assert_eq!(e.key, "delete_handling");
    }
}
