//! The transforms that add, keep, drop, rename, extract, flatten, mask and cast fields
//! of a record's value (Kafka Connect's `InsertField`, `ReplaceField`, `ExtractField`,
//! `Flatten`, `MaskField`, `Cast`, on schemaless values).

use super::shallow::Fields;
use super::{object, Meta, Parts, Smt, SmtConfig};
use crate::connector::{KeyError, SectionContext};
use crate::record::json_kind;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

/// `insert_field`: `static = { source = "kafka" }`, `topic_field`, `partition_field`,
/// `offset_field`, `timestamp_field` (RFC 3339 in UTC, milliseconds; `null` when the
/// record has no timestamp).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InsertField {
    #[serde(rename = "static", default)]
    pub fixed: BTreeMap<String, toml::Value>,
    pub topic_field: Option<String>,
    pub partition_field: Option<String>,
    pub offset_field: Option<String>,
    pub timestamp_field: Option<String>,
}

#[derive(Debug)]
struct Insert {
    fixed: Vec<(String, Value)>,
    /// `fixed`, each value as its JSON text.
    fixed_text: Vec<(String, String)>,
    topic: Option<String>,
    partition: Option<String>,
    offset: Option<String>,
    timestamp: Option<String>,
}

impl SmtConfig for InsertField {
    const KIND: &'static str = "insert_field";
    fn build(self, _: &SectionContext) -> Result<Arc<dyn Smt>, KeyError> {
        let fixed = self
            .fixed
            .into_iter()
            .map(|(k, v)| {
                serde_json::to_value(&v)
                    .map(|v| (k.clone(), v))
                    .map_err(|e| KeyError::new(format!("static.{k}"), e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if fixed.is_empty()
            && [
                &self.topic_field,
                &self.partition_field,
                &self.offset_field,
                &self.timestamp_field,
            ]
            .iter()
            .all(|f| f.is_none())
        {
            return Err(KeyError::section(
                "insert_field inserts nothing: give static, topic_field, partition_field, offset_field or timestamp_field",
            ));
        }
        let fixed_text = fixed
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string()))
            .collect();
        Ok(Arc::new(Insert {
            fixed,
            fixed_text,
            topic: self.topic_field,
            partition: self.partition_field,
            offset: self.offset_field,
            timestamp: self.timestamp_field,
        }))
    }
}

/// The text `timestamp_field` gets: RFC 3339 in UTC with milliseconds.
fn rfc3339_millis(ms: Option<i64>) -> Option<String> {
    ms.and_then(chrono::DateTime::from_timestamp_millis)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

/// [`rfc3339_millis`] as a JSON string's text (`null` without a time): written
/// digit by digit for years 0 to 9999 (RFC 3339 needs no escapes).
fn quoted_rfc3339_millis(ms: Option<i64>) -> String {
    use chrono::{Datelike, Timelike};
    let Some(t) = ms.and_then(chrono::DateTime::from_timestamp_millis) else {
        return "null".into();
    };
    if !(0..=9999).contains(&t.year()) {
        return format!(
            "\"{}\"",
            t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        );
    }
    let put = |out: &mut String, sep: char, n: u32, width: u32| {
        out.push(sep);
        for i in (0..width).rev() {
            out.push(char::from(b'0' + (n / 10u32.pow(i) % 10) as u8));
        }
    };
    let mut out = String::with_capacity(26);
    put(&mut out, '"', t.year() as u32, 4);
    put(&mut out, '-', t.month(), 2);
    put(&mut out, '-', t.day(), 2);
    put(&mut out, 'T', t.hour(), 2);
    put(&mut out, ':', t.minute(), 2);
    put(&mut out, ':', t.second(), 2);
    put(&mut out, '.', t.timestamp_subsec_millis() % 1000, 3);
    out.push_str("Z\"");
    out
}

/// `s` as a JSON string's text.
fn json_string(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// `v` as JSON text (`null` when absent).
fn json_int<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "null".into(), |v| v.to_string())
}

impl Smt for Insert {
    fn top_level(&self) -> bool {
        true
    }

    fn apply_fields<'a>(&'a self, o: &mut Fields<'a>, meta: &Meta) -> Option<Result<(), String>> {
        for (k, v) in &self.fixed_text {
            o.set(k, v.as_str());
        }
        if self.topic.is_none()
            && self.partition.is_none()
            && self.offset.is_none()
            && self.timestamp.is_none()
        {
            return Some(Ok(()));
        }
        let mut put = |field: &'a Option<String>, v: &dyn Fn() -> String| {
            if let Some(f) = field {
                o.set(f, v());
            }
        };
        put(&self.topic, &|| {
            meta.topic.map_or_else(|| "null".into(), json_string)
        });
        put(&self.partition, &|| json_int(meta.partition));
        put(&self.offset, &|| json_int(meta.offset));
        put(&self.timestamp, &|| quoted_rfc3339_millis(meta.timestamp));
        Some(Ok(()))
    }

    fn apply(&self, parts: &mut Parts, meta: &Meta) -> Result<(), String> {
        let o = object(&mut parts.value, "insert_field")?;
        for (k, v) in &self.fixed {
            o.insert(k.clone(), v.clone());
        }
        let mut put = |field: &Option<String>, v: Value| {
            if let Some(f) = field {
                o.insert(f.clone(), v);
            }
        };
        put(&self.topic, meta.topic.map_or(Value::Null, Value::from));
        put(
            &self.partition,
            meta.partition.map_or(Value::Null, Value::from),
        );
        put(&self.offset, meta.offset.map_or(Value::Null, Value::from));
        put(
            &self.timestamp,
            rfc3339_millis(meta.timestamp).map_or(Value::Null, Value::from),
        );
        Ok(())
    }
}

/// `replace_field`: `include` (keep only these), `exclude` (drop these), then
/// `rename = { old = "new" }`. Top-level fields, as Kafka Connect's.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplaceField {
    pub include: Option<Vec<String>>,
    #[serde(default)]
    pub exclude: Vec<String>,
    #[serde(default)]
    pub rename: BTreeMap<String, String>,
}

impl SmtConfig for ReplaceField {
    const KIND: &'static str = "replace_field";
    fn build(self, _: &SectionContext) -> Result<Arc<dyn Smt>, KeyError> {
        if self.include.is_none() && self.exclude.is_empty() && self.rename.is_empty() {
            return Err(KeyError::section(
                "replace_field changes nothing: give include, exclude or rename",
            ));
        }
        let mut targets: Vec<&String> = self.rename.values().collect();
        targets.sort();
        if let Some(w) = targets.windows(2).find(|w| w[0] == w[1]) {
            return Err(KeyError::new(
                "rename",
                format!("two fields are renamed to {:?}", w[0]),
            ));
        }
        Ok(Arc::new(self))
    }
}

impl ReplaceField {
    /// Whether the field named `k` stays: named by `include` when it is set, and not
    /// named by `exclude`.
    fn kept(&self, k: &str) -> bool {
        !(self
            .include
            .as_ref()
            .is_some_and(|i| !i.iter().any(|n| n == k))
            || self.exclude.iter().any(|n| n == k))
    }
}

impl Smt for ReplaceField {
    fn top_level(&self) -> bool {
        true
    }

    fn apply_fields<'a>(&'a self, o: &mut Fields<'a>, _: &Meta) -> Option<Result<(), String>> {
        o.retain_renamed(
            |k| self.kept(k),
            |k| self.rename.get(k).map(String::as_str),
            |k| self.rename.values().any(|t| t == k),
        );
        Some(Ok(()))
    }

    fn apply(&self, parts: &mut Parts, _: &Meta) -> Result<(), String> {
        let o = object(&mut parts.value, "replace_field")?;
        let old = std::mem::take(o);
        for (k, v) in old {
            if self.include.as_ref().is_some_and(|i| !i.contains(&k)) || self.exclude.contains(&k) {
                continue;
            }
            let name = self.rename.get(&k).cloned().unwrap_or(k);
            o.insert(name, v);
        }
        Ok(())
    }
}

/// `extract_field`: `field` (a top-level name, or a JSON pointer `/a/b`); the record's
/// value becomes that field's value (`null` when it is absent, as in Kafka Connect).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtractField {
    pub field: String,
}

impl SmtConfig for ExtractField {
    const KIND: &'static str = "extract_field";
    fn build(self, _: &SectionContext) -> Result<Arc<dyn Smt>, KeyError> {
        if self.field.is_empty() {
            return Err(KeyError::new("field", "names no field"));
        }
        Ok(Arc::new(self))
    }
}

/// The value at `field` (a JSON pointer when it starts with `/`, else a top-level name).
pub(crate) fn field_of<'v>(v: &'v Value, field: &str) -> Option<&'v Value> {
    if field.starts_with('/') {
        v.pointer(field)
    } else {
        v.get(field)
    }
}

impl Smt for ExtractField {
    fn apply(&self, parts: &mut Parts, _: &Meta) -> Result<(), String> {
        let kind = json_kind(&parts.value);
        if !parts.value.is_object() {
            return Err(format!(
                "extract_field needs a JSON object, the value is {kind}"
            ));
        }
        parts.value = field_of(&parts.value, &self.field)
            .cloned()
            .unwrap_or(Value::Null);
        Ok(())
    }
}

/// `flatten`: nested objects become top-level fields named by their path, joined by
/// `delimiter` (default `.`); arrays stay as they are, as in Kafka Connect's
/// schemaless `Flatten`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Flatten {
    #[serde(default = "dot")]
    pub delimiter: String,
}

fn dot() -> String {
    ".".into()
}

impl SmtConfig for Flatten {
    const KIND: &'static str = "flatten";
    fn build(self, _: &SectionContext) -> Result<Arc<dyn Smt>, KeyError> {
        Ok(Arc::new(self))
    }
}

impl Smt for Flatten {
    fn apply(&self, parts: &mut Parts, _: &Meta) -> Result<(), String> {
        let o = object(&mut parts.value, "flatten")?;
        let mut flat = Map::new();
        fn walk(
            prefix: &str,
            delimiter: &str,
            o: Map<String, Value>,
            flat: &mut Map<String, Value>,
        ) {
            for (k, v) in o {
                let name = if prefix.is_empty() {
                    k
                } else {
                    format!("{prefix}{delimiter}{k}")
                };
                match v {
                    Value::Object(inner) => walk(&name, delimiter, inner, flat),
                    v => {
                        flat.insert(name, v);
                    }
                }
            }
        }
        walk("", &self.delimiter, std::mem::take(o), &mut flat);
        *o = flat;
        Ok(())
    }
}

/// `mask_field`: `fields` (top-level names) replaced by `replacement`, or by their
/// type's empty value (`""`, `0`, `false`, `[]`, `{}`) when it is not given.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaskField {
    pub fields: Vec<String>,
    pub replacement: Option<toml::Value>,
}

#[derive(Debug)]
struct Mask {
    fields: Vec<String>,
    replacement: Option<Value>,
}

impl SmtConfig for MaskField {
    const KIND: &'static str = "mask_field";
    fn build(self, _: &SectionContext) -> Result<Arc<dyn Smt>, KeyError> {
        if self.fields.is_empty() {
            return Err(KeyError::new("fields", "names no field"));
        }
        let replacement = self
            .replacement
            .map(|r| {
                serde_json::to_value(r).map_err(|e| KeyError::new("replacement", e.to_string()))
            })
            .transpose()?;
        Ok(Arc::new(Mask {
            fields: self.fields,
            replacement,
        }))
    }
}

impl Smt for Mask {
    fn apply(&self, parts: &mut Parts, _: &Meta) -> Result<(), String> {
        let o = object(&mut parts.value, "mask_field")?;
        for f in &self.fields {
            if let Some(v) = o.get_mut(f) {
                *v = match (&self.replacement, &*v) {
                    (Some(r), _) => r.clone(),
                    (None, Value::String(_)) => Value::from(""),
                    (None, Value::Number(_)) => Value::from(0),
                    (None, Value::Bool(_)) => Value::from(false),
                    (None, Value::Array(_)) => Value::Array(vec![]),
                    (None, Value::Object(_)) => Value::Object(Map::new()),
                    (None, Value::Null) => Value::Null,
                };
            }
        }
        Ok(())
    }
}

/// The types `cast` converts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CastType {
    Int(u32),
    Float32,
    Float64,
    Boolean,
    String,
}

impl CastType {
    fn parse(s: &str) -> Result<CastType, String> {
        Ok(match s {
            "int8" => CastType::Int(8),
            "int16" => CastType::Int(16),
            "int32" => CastType::Int(32),
            "int64" => CastType::Int(64),
            "float32" => CastType::Float32,
            "float64" => CastType::Float64,
            "boolean" => CastType::Boolean,
            "string" => CastType::String,
            other => {
                return Err(format!(
                    "`{other}` is not one of int8, int16, int32, int64, float32, float64, boolean, string"
                ))
            }
        })
    }

    /// `v` cast to this type, as Kafka Connect's `Cast` does: numbers truncate toward
    /// zero into integers (an error outside the type's range), booleans are 1 and 0,
    /// strings parse, and any value's string is its text (a JSON string's own text).
    pub fn cast(self, v: &Value) -> Result<Value, String> {
        let as_f64 = |v: &Value| -> Result<f64, String> {
            match v {
                Value::Number(n) => n.as_f64().ok_or_else(|| format!("{n} is not a number")),
                Value::Bool(b) => Ok(if *b { 1.0 } else { 0.0 }),
                Value::String(s) => s
                    .trim()
                    .parse::<f64>()
                    .map_err(|_| format!("{s:?} is not a number")),
                other => Err(format!("{} cannot be cast to a number", json_kind(other))),
            }
        };
        match self {
            CastType::Int(bits) => {
                let i = match v {
                    Value::Number(n) if n.is_i64() => n.as_i64().expect("i64"),
                    Value::String(s) if s.trim().parse::<i64>().is_ok() => {
                        s.trim().parse::<i64>().expect("checked")
                    }
                    v => {
                        let f = as_f64(v)?.trunc();
                        if !(i64::MIN as f64..=i64::MAX as f64).contains(&f) {
                            return Err(format!("{f} does not fit in int{bits}"));
                        }
                        f as i64
                    }
                };
                let (min, max) = match bits {
                    64 => (i64::MIN, i64::MAX),
                    b => (-(1i64 << (b - 1)), (1i64 << (b - 1)) - 1),
                };
                if !(min..=max).contains(&i) {
                    return Err(format!("{i} does not fit in int{bits}"));
                }
                Ok(Value::from(i))
            }
            CastType::Float32 => Ok(Value::from(as_f64(v)? as f32 as f64)),
            CastType::Float64 => Ok(Value::from(as_f64(v)?)),
            CastType::Boolean => match v {
                Value::Bool(b) => Ok(Value::from(*b)),
                Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
                    "true" => Ok(Value::from(true)),
                    "false" => Ok(Value::from(false)),
                    _ => Err(format!("{s:?} is not true or false")),
                },
                v => Ok(Value::from(as_f64(v)? != 0.0)),
            },
            CastType::String => Ok(Value::from(match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })),
        }
    }
}

/// `cast`: `spec = { amount = "float64", id = "string" }` (top-level fields; a field
/// that is absent or `null` stays so).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cast {
    pub spec: BTreeMap<String, String>,
}

#[derive(Debug)]
struct Casts(Vec<(String, CastType)>);

impl SmtConfig for Cast {
    const KIND: &'static str = "cast";
    fn build(self, _: &SectionContext) -> Result<Arc<dyn Smt>, KeyError> {
        if self.spec.is_empty() {
            return Err(KeyError::new("spec", "casts no field"));
        }
        let casts = self
            .spec
            .into_iter()
            .map(|(f, t)| {
                CastType::parse(&t)
                    .map(|t| (f.clone(), t))
                    .map_err(|m| KeyError::new(format!("spec.{f}"), m))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Arc::new(Casts(casts)))
    }
}

impl Smt for Casts {
    fn top_level(&self) -> bool {
        true
    }

    fn apply_fields<'a>(&'a self, o: &mut Fields<'a>, _: &Meta) -> Option<Result<(), String>> {
        for (f, t) in &self.0 {
            let Some(text) = o.get(f) else { continue };
            if text == "null" {
                continue;
            }
            // A boolean's casts to a boolean, an integer or a string, whose texts are
            // known (`None`: unchanged).
            let known = match (t, text) {
                (CastType::Boolean, "true" | "false") => Some(None),
                (CastType::Int(_), "true") => Some(Some("1")),
                (CastType::Int(_), "false") => Some(Some("0")),
                (CastType::String, "true") => Some(Some("\"true\"")),
                (CastType::String, "false") => Some(Some("\"false\"")),
                _ => None,
            };
            if let Some(known) = known {
                if let Some(new) = known {
                    o.set(f, new);
                }
                continue;
            }
            // A number's string is its text, which needs no escapes.
            if matches!(t, CastType::String)
                && text.starts_with(|c: char| c == '-' || c.is_ascii_digit())
            {
                let quoted = format!("\"{text}\"");
                o.set(f, quoted);
                continue;
            }
            let v: Value = match serde_json::from_str(text) {
                Ok(v) => v,
                Err(e) => return Some(Err(format!("field {f}: {e}"))),
            };
            match t.cast(&v) {
                Ok(c) => o.set(f, c.to_string()),
                Err(e) => return Some(Err(format!("field {f}: {e}"))),
            }
        }
        Some(Ok(()))
    }

    fn apply(&self, parts: &mut Parts, _: &Meta) -> Result<(), String> {
        let o = object(&mut parts.value, "cast")?;
        for (f, t) in &self.0 {
            if let Some(v) = o.get_mut(f) {
                if !v.is_null() {
                    *v = t.cast(v).map_err(|e| format!("field {f}: {e}"))?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cx() -> SectionContext {
        crate::testkit::conformance::section_context(std::path::Path::new("."))
    }

    /// Builds the transform of `T` from TOML and applies it to `value`.
    fn run<T: SmtConfig>(toml_text: &str, value: Value, meta: &Meta) -> Result<Value, String> {
        let c: T = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        let smt = c
            .build(&cx())
            .map_err(|e| format!("{}: {}", e.key, e.message))?;
        let mut parts = Parts::of_value(value);
        smt.apply(&mut parts, meta)?;
        Ok(parts.value)
    }

    fn meta() -> Meta<'static> {
        Meta {
            topic: Some("orders"),
            partition: Some(2),
            offset: Some(42),
            timestamp: Some(1_700_000_000_123),
            headers: None,
        }
    }

    #[test]
    fn timestamps_written_digit_by_digit_as_chrono_writes_them() {
        for ms in [
            0,
            1,
            -1,
            1_700_000_000_123,
            951_782_400_999,
            -62_135_596_800_000,
            253_402_300_799_999,
            253_402_300_800_000,
            -62_135_596_800_001,
            i64::MAX,
        ] {
            let want = rfc3339_millis(Some(ms)).map_or("null".into(), |t| format!("\"{t}\""));
            assert_eq!(quoted_rfc3339_millis(Some(ms)), want, "{ms}");
        }
        assert_eq!(quoted_rfc3339_millis(None), "null");
    }

    /// Each transform of top-level fields gives the same value (numbers' text
    /// included) and the same error on its fields as on the parsed value.
    #[test]
    fn on_top_level_fields_as_on_the_parsed_value() {
        type Build = fn(&str) -> Arc<dyn Smt>;
        let transforms: &[(&str, Build)] = &[
            ("static = { source = \"k\", n = 1.5 }\ntopic_field = \"t\"\npartition_field = \"p\"\noffset_field = \"o\"\ntimestamp_field = \"@ts\"", |t| toml::from_str::<InsertField>(t).unwrap().build(&cx()).unwrap()),
            ("static = { a = \"replaced\" }", |t| toml::from_str::<InsertField>(t).unwrap().build(&cx()).unwrap()),
            ("rename = { a = \"b\" }", |t| toml::from_str::<ReplaceField>(t).unwrap().build(&cx()).unwrap()),
            ("rename = { b = \"a\", a = \"z\" }", |t| toml::from_str::<ReplaceField>(t).unwrap().build(&cx()).unwrap()),
            ("include = [\"a\", \"n\"]\nrename = { n = \"a\" }", |t| toml::from_str::<ReplaceField>(t).unwrap().build(&cx()).unwrap()),
            ("exclude = [\"s\"]", |t| toml::from_str::<ReplaceField>(t).unwrap().build(&cx()).unwrap()),
            ("spec = { a = \"string\", n = \"string\", big = \"string\", neg = \"string\" }", |t| toml::from_str::<Cast>(t).unwrap().build(&cx()).unwrap()),
            ("spec = { a = \"float64\", t = \"int8\", s = \"boolean\", f = \"int32\" }", |t| toml::from_str::<Cast>(t).unwrap().build(&cx()).unwrap()),
            ("spec = { s = \"int64\" }", |t| toml::from_str::<Cast>(t).unwrap().build(&cx()).unwrap()),
            ("spec = { o = \"string\", arr = \"string\", nul = \"int8\" }", |t| toml::from_str::<Cast>(t).unwrap().build(&cx()).unwrap()),
        ];
        let values = [
            r#"{"a":1.50,"b":"x","n":7,"big":12345678901234567890123456789012345678,"neg":-0.000000000000000000001,"t":true,"s":"true","f":2.9e0,"o":{"z":1.50, "a" : [1, 2]},"arr":[1.0,"\u00e9"],"nul":null}"#,
            r#"{"b":2,"a":1}"#,
            r#"{"a\"q":1,"a":"x\n"}"#,
            r#"{}"#,
        ];
        for (config, build) in transforms {
            let smt = build(config);
            for value in values {
                let mut parts = Parts::of_value(serde_json::from_str(value).unwrap());
                let whole = smt.apply(&mut parts, &meta()).map(|()| parts.value);
                let mut fields = Fields::parse(value.as_bytes()).unwrap().unwrap();
                let shallow = smt
                    .apply_fields(&mut fields, &meta())
                    .expect("a transform of top-level fields")
                    .map(|()| {
                        let mut text = Vec::new();
                        fields.write(&mut text);
                        serde_json::from_slice::<Value>(&text).unwrap()
                    });
                assert_eq!(shallow, whole, "{config} on {value}");
            }
        }
    }

    /// Kafka Connect's InsertField example: `static.field=MessageSource`,
    /// `static.value=Kafka Connect framework`, plus the record's coordinates.
    #[test]
    fn insert_field() {
        let got = run::<InsertField>(
            "static = { MessageSource = \"Kafka Connect framework\" }\ntopic_field = \"topic\"\npartition_field = \"p\"\noffset_field = \"o\"\ntimestamp_field = \"@timestamp\"",
            json!({"id": 1}),
            &meta(),
        );
        assert_eq!(
            got,
            Ok(
                json!({"id": 1, "MessageSource": "Kafka Connect framework", "topic": "orders",
                      "p": 2, "o": 42, "@timestamp": "2023-11-14T22:13:20.123Z"})
            )
        );
        let none = run::<InsertField>("timestamp_field = \"ts\"", json!({}), &Meta::default());
        assert_eq!(none, Ok(json!({"ts": null})));
        assert!(
            run::<InsertField>("topic_field = \"t\"", json!([1]), &meta())
                .unwrap_err()
                .contains("needs a JSON object, the value is an array")
        );
        assert!(run::<InsertField>("", json!({}), &meta()).is_err());
    }

    /// Kafka Connect's ReplaceField examples: exclude `c`, include `c` and `d`,
    /// rename `foo:c,bar:d`.
    #[test]
    fn replace_field() {
        let v = || json!({"a": 1, "b": 2, "c": 3, "foo": 4, "bar": 5});
        assert_eq!(
            run::<ReplaceField>("exclude = [\"c\"]", v(), &meta()),
            Ok(json!({"a": 1, "b": 2, "foo": 4, "bar": 5}))
        );
        assert_eq!(
            run::<ReplaceField>("include = [\"c\", \"d\"]", v(), &meta()),
            Ok(json!({"c": 3}))
        );
        assert_eq!(
            run::<ReplaceField>("rename = { foo = \"c2\", bar = \"d\" }", v(), &meta()),
            Ok(json!({"a": 1, "b": 2, "c": 3, "c2": 4, "d": 5}))
        );
        // Filtering first, then renaming.
        assert_eq!(
            run::<ReplaceField>(
                "include = [\"foo\"]\nrename = { foo = \"f\" }",
                v(),
                &meta()
            ),
            Ok(json!({"f": 4}))
        );
        assert!(run::<ReplaceField>("rename = { a = \"x\", b = \"x\" }", v(), &meta()).is_err());
        assert!(run::<ReplaceField>("", v(), &meta()).is_err());
    }

    /// Kafka Connect's ExtractField example: `field=id` on `{"id": 42, "cost": 4000}`.
    #[test]
    fn extract_field() {
        let v = json!({"id": 42, "cost": 4000, "user": {"name": "ann"}});
        assert_eq!(
            run::<ExtractField>("field = \"id\"", v.clone(), &meta()),
            Ok(json!(42))
        );
        assert_eq!(
            run::<ExtractField>("field = \"/user/name\"", v.clone(), &meta()),
            Ok(json!("ann"))
        );
        assert_eq!(
            run::<ExtractField>("field = \"nope\"", v, &meta()),
            Ok(Value::Null)
        );
        assert!(run::<ExtractField>("field = \"id\"", json!(3), &meta()).is_err());
    }

    /// Kafka Connect's Flatten example: `{"content": {"id": 42, "name": {"first":
    /// "David", "middle": null, "last": "Wong"}}}` with delimiter `_`.
    #[test]
    fn flatten() {
        let v = json!({"content": {"id": 42, "name": {"first": "David", "middle": null, "last": "Wong"}}, "tags": [{"a": 1}]});
        assert_eq!(
            run::<Flatten>("delimiter = \"_\"", v.clone(), &meta()),
            Ok(
                json!({"content_id": 42, "content_name_first": "David", "content_name_middle": null,
                      "content_name_last": "Wong", "tags": [{"a": 1}]})
            )
        );
        assert_eq!(
            run::<Flatten>("", json!({"a": {"b": 1}}), &meta()),
            Ok(json!({"a.b": 1}))
        );
    }

    /// Kafka Connect's MaskField examples: `fields=ssn` with the type's empty value,
    /// and with `replacement=xxx-xx-xxxx`.
    #[test]
    fn mask_field() {
        let v =
            || json!({"ssn": "123-45-6789", "salary": 10000, "ok": true, "tags": [1], "n": null});
        assert_eq!(
            run::<MaskField>(
                "fields = [\"ssn\", \"salary\", \"ok\", \"tags\", \"n\", \"absent\"]",
                v(),
                &meta()
            ),
            Ok(json!({"ssn": "", "salary": 0, "ok": false, "tags": [], "n": null}))
        );
        assert_eq!(
            run::<MaskField>(
                "fields = [\"ssn\"]\nreplacement = \"xxx-xx-xxxx\"",
                v(),
                &meta()
            ),
            Ok(json!({"ssn": "xxx-xx-xxxx", "salary": 10000, "ok": true, "tags": [1], "n": null}))
        );
    }

    /// Kafka Connect's Cast example: `spec=price:float64,id:string` and a whole table
    /// of conversions.
    #[test]
    fn cast() {
        assert_eq!(
            run::<Cast>(
                "spec = { price = \"float64\", id = \"string\", gone = \"int8\" }",
                json!({"price": 10, "id": 42, "gone": null}),
                &meta()
            ),
            Ok(json!({"price": 10.0, "id": "42", "gone": null}))
        );
        let table: &[(&str, Value, Result<Value, ()>)] = &[
            ("int8", json!(127), Ok(json!(127))),
            ("int8", json!(128), Err(())),
            ("int16", json!(-32768), Ok(json!(-32768))),
            ("int32", json!(3.99), Ok(json!(3))),
            ("int32", json!(-3.99), Ok(json!(-3))),
            (
                "int64",
                json!("9007199254740993"),
                Ok(json!(9_007_199_254_740_993i64)),
            ),
            ("int64", json!(true), Ok(json!(1))),
            ("int32", json!("x"), Err(())),
            ("int32", json!([1]), Err(())),
            ("float32", json!(0.1), Ok(json!(0.1f32 as f64))),
            ("float64", json!("2.5"), Ok(json!(2.5))),
            ("boolean", json!(0), Ok(json!(false))),
            ("boolean", json!(2.5), Ok(json!(true))),
            ("boolean", json!("TRUE"), Ok(json!(true))),
            ("boolean", json!("yes"), Err(())),
            ("string", json!(1.5), Ok(json!("1.5"))),
            ("string", json!(false), Ok(json!("false"))),
            ("string", json!("s"), Ok(json!("s"))),
            ("string", json!({"a": 1}), Ok(json!("{\"a\":1}"))),
        ];
        for (t, v, want) in table {
            let got = CastType::parse(t).unwrap().cast(v).map_err(|_| ());
            assert_eq!(&got, want, "{v} to {t}");
        }
        let e: Cast = toml::from_str("spec = { a = \"decimal\" }").unwrap();
        assert_eq!(e.build(&cx()).err().unwrap().key, "spec.a");
    }
}
