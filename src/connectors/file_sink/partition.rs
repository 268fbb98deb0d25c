//! `partition_by`: the Hive-style folder (`dt=2024-05-01/country=DE`) each record's
//! part file goes into, from the record's fields and times.
//!
//! A template is folders separated by `/`, each `name=value`: `name` is literal, and
//! `value` is literal text with placeholders:
//!
//! - `{/json/pointer}`: the field's text (a string as it is, a number exactly as
//!   written, `true`/`false`);
//! - `{/json/pointer:%Y-%m-%d}`: the field as a time, formatted by a `strftime`
//!   format in UTC: a whole number is a time since the epoch in the unit of the
//!   field's column (Parquet: `timestamp-*` or `date`), else in milliseconds; a text is
//!   RFC 3339 (with its offset), a local date and time, or a date;
//! - `{timestamp:%Y-%m-%d}`: the record's own timestamp (the source's) as a time.
//!
//! A field that is missing or null, or an empty value, gives Hive's default partition
//! `__HIVE_DEFAULT_PARTITION__`. Values are escaped as Hive escapes them (`%2F` for a
//! `/`, ...), so that a value never makes another folder. A record whose value cannot
//! name a folder (an object or array, a text that is not a time) is refused with why,
//! and follows the sink's item error policy. A delete is placed by its image before the
//! delete; one without (a tombstone) is refused when the template reads fields.
//!
//! Pointers in a template cannot contain `:` (it starts the time format).

use crate::record::{Op, Record};
use arrow_schema::{DataType, Schema, TimeUnit};
use chrono::format::{Item, StrftimeItems};
use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use serde_json::Value;
use std::borrow::Cow;

/// The value of a partition whose field is missing, null or empty (Hive's).
pub const DEFAULT_PARTITION: &str = "__HIVE_DEFAULT_PARTITION__";

/// The longest folder name a value may make, in bytes (a file name's limit on most
/// file systems).
const MAX_SEGMENT: usize = 255;

/// A parsed `partition_by`.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionTemplate {
    segments: Vec<Segment>,
    /// The top-level fields its pointers begin with, once each: all of a record's
    /// value that a folder needs.
    tops: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
struct Segment {
    name: String,
    value: Vec<Piece>,
}

#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Literal(String),
    Field { pointer: String },
    FieldTime { pointer: String, time: TimeFormat },
    Timestamp(String),
}

/// A `strftime` format and the unit a whole number of the field counts in.
#[derive(Debug, Clone, PartialEq)]
struct TimeFormat {
    format: String,
    unit: NumberUnit,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum NumberUnit {
    Days,
    Time(TimeUnit),
}

impl PartitionTemplate {
    /// Parses `text`; `schema` (Parquet's columns) gives the unit of a time field's
    /// numbers. The error says what is wrong.
    pub fn parse(text: &str, schema: Option<&Schema>) -> Result<PartitionTemplate, String> {
        let mut segments = Vec::new();
        for raw in split_segments(text)? {
            let (name, value) = raw
                .split_once('=')
                .ok_or_else(|| format!("`{raw}` is not `name=value` (Hive-style folders)"))?;
            if name.is_empty()
                || name.starts_with(['.', '_'])
                || escape(name) != name
                || name.contains('{')
            {
                return Err(format!(
                    "`{raw}`: the folder's name must be plain text not starting with `.` or `_` (readers skip such folders)"
                ));
            }
            if segments.iter().any(|s: &Segment| s.name == name) {
                return Err(format!(
                    "`{raw}`: the folder name `{name}` is given twice (a Hive reader takes each name as one column)"
                ));
            }
            let value = pieces(value, schema).map_err(|e| format!("`{raw}`: {e}"))?;
            if value.is_empty() {
                return Err(format!("`{raw}`: no value"));
            }
            segments.push(Segment {
                name: name.to_string(),
                value,
            });
        }
        if segments.is_empty() {
            return Err("no folder".into());
        }
        let mut tops: Vec<String> = Vec::new();
        for p in segments.iter().flat_map(|s| &s.value) {
            if let Piece::Field { pointer } | Piece::FieldTime { pointer, .. } = p {
                let (top, _) = split_pointer(pointer);
                if !tops.iter().any(|t| *t == top) {
                    tops.push(top.into_owned());
                }
            }
        }
        Ok(PartitionTemplate { segments, tops })
    }

    /// Whether the record's fields are read (a `{/pointer}` placeholder).
    pub fn reads_fields(&self) -> bool {
        self.segments.iter().any(|s| {
            s.value
                .iter()
                .any(|p| matches!(p, Piece::Field { .. } | Piece::FieldTime { .. }))
        })
    }

    /// The top-level fields of the value its pointers begin with, once each.
    pub fn tops(&self) -> &[String] {
        &self.tops
    }

    /// Whether a folder reads the record's own timestamp (`{timestamp:...}`).
    pub fn reads_timestamp(&self) -> bool {
        self.segments
            .iter()
            .any(|s| s.value.iter().any(|p| matches!(p, Piece::Timestamp(_))))
    }

    /// The folder of `record`, relative to the sink's directory (`dt=.../country=...`),
    /// or why it has none.
    pub fn folder(&self, record: &Record) -> Result<String, String> {
        let doc = if self.reads_fields() {
            // A delete's value, when its source gives one, is the image before the
            // delete: its line goes to the folder of the row it deletes.
            let no_image = "partition_by: a delete without its image before the delete has no fields to name its folder";
            let delete = record.tombstone || record.op == Op::Delete;
            if record.tombstone || (delete && record.value.is_empty()) {
                return Err(no_image.into());
            }
            let doc = Fields::read(&record.value, &self.tops)
                .map_err(|e| format!("partition_by: the value is not JSON: {e}"))?;
            if delete && matches!(doc, Fields::Whole(Value::Null)) {
                return Err(no_image.into());
            }
            Some(doc)
        } else {
            None
        };
        let at = |pointer: &str| doc.as_ref().and_then(|d| d.pointer(&self.tops, pointer));
        let mut out = String::new();
        for (i, s) in self.segments.iter().enumerate() {
            if i > 0 {
                out.push('/');
            }
            let mut value = String::new();
            let mut default = false;
            for p in &s.value {
                let text = match p {
                    Piece::Literal(t) => Some(t.clone()),
                    Piece::Field { pointer } => field_text(at(pointer), pointer)?,
                    Piece::FieldTime { pointer, time } => match at(pointer) {
                        None | Some(Value::Null) => None,
                        Some(Value::String(t)) if t.is_empty() => None,
                        Some(v) => Some(time.render(&field_time(v, time.unit, pointer)?)),
                    },
                    Piece::Timestamp(format) => {
                        let ms = record
                            .timestamp
                            .ok_or("partition_by: the record has no timestamp for {timestamp}")?;
                        let t = DateTime::<Utc>::from_timestamp_millis(ms).ok_or_else(|| {
                            format!("partition_by: timestamp {ms} is out of range")
                        })?;
                        Some(t.naive_utc().format(format).to_string())
                    }
                };
                match text {
                    Some(t) => value.push_str(&t),
                    None => default = true,
                }
            }
            let value = if default || value.is_empty() {
                DEFAULT_PARTITION.to_string()
            } else {
                escape(&value)
            };
            let segment = format!("{}={value}", s.name);
            if segment.len() > MAX_SEGMENT {
                return Err(format!(
                    "partition_by: the folder `{}=...` would be {} bytes long, more than {MAX_SEGMENT}",
                    s.name,
                    segment.len()
                ));
            }
            out.push_str(&segment);
        }
        Ok(out)
    }
}

/// What a folder reads of a record's value.
enum Fields {
    /// The value of each top-level field a template names (by its place in the
    /// template's `tops`; None: the value has no such field): the value is an object.
    Top(Vec<Option<Value>>),
    /// The whole value, when it is not an object.
    Whole(Value),
}

impl Fields {
    /// Reads `text`: only the values of the fields `tops` when it is one JSON object
    /// (the rest checked, not kept), else the whole value; an error when it is not
    /// JSON. The strict reader takes what serde_json takes, so an object read either
    /// way gives the same fields; serde_json reads what the strict reader does not
    /// take, for its message.
    fn read(text: &[u8], tops: &[String]) -> Result<Fields, serde_json::Error> {
        if let Some(found) = crate::formats::columnar::json_text::top_level_values(text, tops) {
            let values: Result<Vec<Option<Value>>, _> = found
                .into_iter()
                .map(|t| t.map(serde_json::from_slice).transpose())
                .collect();
            if let Ok(values) = values {
                return Ok(Fields::Top(values));
            }
        }
        serde_json::from_slice(text).map(Fields::Whole)
    }

    /// The value at `pointer` (RFC 6901, as [`Value::pointer`] finds it).
    fn pointer(&self, tops: &[String], pointer: &str) -> Option<&Value> {
        match self {
            Fields::Whole(doc) => doc.pointer(pointer),
            Fields::Top(values) => {
                let (top, rest) = split_pointer(pointer);
                let i = tops.iter().position(|t| *t == top)?;
                values[i].as_ref()?.pointer(rest)
            }
        }
    }
}

/// A pointer's first step (unescaped: the key of a top-level field) and the rest, a
/// pointer into that field's value (empty: the value itself). `pointer` begins with
/// `/`.
fn split_pointer(pointer: &str) -> (Cow<'_, str>, &str) {
    let steps = pointer.strip_prefix('/').unwrap_or(pointer);
    let (first, rest) = match steps.find('/') {
        Some(i) => steps.split_at(i),
        None => (steps, ""),
    };
    let first = match first.contains('~') {
        true => Cow::Owned(first.replace("~1", "/").replace("~0", "~")),
        false => Cow::Borrowed(first),
    };
    (first, rest)
}

impl TimeFormat {
    fn render(&self, t: &NaiveDateTime) -> String {
        t.format(&self.format).to_string()
    }
}

/// Splits the template at the `/` outside placeholders.
fn split_segments(text: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let (mut start, mut depth) = (0, 0);
    for (i, c) in text.char_indices() {
        match c {
            '{' if depth > 0 => return Err(format!("`{text}`: nested `{{`")),
            '{' => depth = 1,
            '}' if depth == 0 => return Err(format!("`{text}`: a `}}` without its `{{`")),
            '}' => depth = 0,
            '/' if depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth > 0 {
        return Err(format!("`{text}`: a `{{` without its `}}`"));
    }
    out.push(&text[start..]);
    if let Some(empty) = out.iter().position(|s| s.is_empty()) {
        return Err(format!(
            "`{text}`: folder {} is empty (a `/` too many)",
            empty + 1
        ));
    }
    Ok(out)
}

/// The pieces of a folder's value.
fn pieces(value: &str, schema: Option<&Schema>) -> Result<Vec<Piece>, String> {
    let mut out = Vec::new();
    let mut rest = value;
    while !rest.is_empty() {
        let Some(open) = rest.find('{') else {
            out.push(literal(rest)?);
            break;
        };
        if open > 0 {
            out.push(literal(&rest[..open])?);
        }
        let close = rest[open..].find('}').expect("balanced by split_segments") + open;
        out.push(placeholder(&rest[open + 1..close], schema)?);
        rest = &rest[close + 1..];
    }
    Ok(out)
}

fn literal(text: &str) -> Result<Piece, String> {
    if escape(text) != text {
        return Err(format!(
            "`{text}` holds a character a folder name escapes; write it as a field's value"
        ));
    }
    Ok(Piece::Literal(text.to_string()))
}

fn placeholder(inner: &str, schema: Option<&Schema>) -> Result<Piece, String> {
    let (target, format) = match inner.split_once(':') {
        Some((t, f)) => (t, Some(f)),
        None => (inner, None),
    };
    if let Some(f) = format {
        check_format(f)?;
    }
    match (target, format) {
        ("timestamp", Some(f)) => Ok(Piece::Timestamp(f.to_string())),
        ("timestamp", None) => Err("{timestamp} needs a time format: {timestamp:%Y-%m-%d}".into()),
        (p, None) if p.starts_with('/') => Ok(Piece::Field {
            pointer: p.to_string(),
        }),
        (p, Some(f)) if p.starts_with('/') => Ok(Piece::FieldTime {
            pointer: p.to_string(),
            time: TimeFormat {
                format: f.to_string(),
                unit: schema.map_or(NumberUnit::Time(TimeUnit::Millisecond), |s| {
                    unit_at(s, p)
                }),
            },
        }),
        _ => Err(format!(
            "`{{{inner}}}` is neither a field (`{{/json/pointer}}`, `{{/json/pointer:%Y-%m-%d}}`) nor `{{timestamp:%Y-%m-%d}}`"
        )),
    }
}

fn check_format(format: &str) -> Result<(), String> {
    if !format.contains('%') {
        return Err(format!("`{format}` is not a strftime format (with %)"));
    }
    if StrftimeItems::new(format).any(|i| matches!(i, Item::Error)) {
        return Err(format!(
            "`{format}` is not a strftime format chrono understands"
        ));
    }
    // Formats of zones and offsets need a zoned time; folders are in UTC.
    let sample = NaiveDate::from_ymd_opt(2024, 5, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .expect("a valid date");
    use std::fmt::Write;
    let mut out = String::new();
    write!(out, "{}", sample.format(format))
        .map_err(|_| format!("`{format}` needs a time zone; folders are named in UTC"))
}

/// The unit of a whole number in the column at `pointer`: the column's, for a
/// timestamp or a date; milliseconds otherwise. A step goes into a struct by a field's
/// name, into a list by an index and into a map by a key.
fn unit_at(schema: &Schema, pointer: &str) -> NumberUnit {
    let mut at: Option<DataType> = None;
    for step in pointer.split('/').skip(1) {
        let name = step.replace("~1", "/").replace("~0", "~");
        let named = |fields: &arrow_schema::Fields| {
            fields
                .iter()
                .find(|f| f.name() == &name)
                .map(|f| f.data_type().clone())
        };
        let next = match &at {
            None => named(schema.fields()),
            Some(DataType::Struct(fields)) => named(fields),
            Some(
                DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _),
            ) if name.parse::<usize>().is_ok() => Some(item.data_type().clone()),
            Some(DataType::Map(entries, _)) => match entries.data_type() {
                DataType::Struct(kv) => kv.get(1).map(|v| v.data_type().clone()),
                _ => None,
            },
            _ => None,
        };
        match next {
            Some(t) => at = Some(t),
            None => return NumberUnit::Time(TimeUnit::Millisecond),
        }
    }
    match at {
        Some(DataType::Timestamp(u, _)) => NumberUnit::Time(u),
        Some(DataType::Date32) => NumberUnit::Days,
        _ => NumberUnit::Time(TimeUnit::Millisecond),
    }
}

/// A field's text for a folder (None: missing or null).
fn field_text(v: Option<&Value>, pointer: &str) -> Result<Option<String>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(n @ Value::Number(_)) => Ok(Some(n.to_string())),
        Some(Value::Bool(b)) => Ok(Some(b.to_string())),
        Some(other) => Err(format!(
            "partition_by: {pointer} is {}, not a string, number or boolean",
            if other.is_object() {
                "an object"
            } else {
                "an array"
            }
        )),
    }
}

/// A field as a time in UTC.
fn field_time(v: &Value, unit: NumberUnit, pointer: &str) -> Result<NaiveDateTime, String> {
    let bad = |what: String| format!("partition_by: {pointer}: {what}");
    match v {
        Value::Number(n) => {
            let text = n.to_string();
            let x: i64 = text
                .parse()
                .map_err(|_| bad(format!("{text} is not a whole number of its unit")))?;
            let t = match unit {
                NumberUnit::Days => NaiveDate::from_ymd_opt(1970, 1, 1)
                    .and_then(|d| d.checked_add_signed(chrono::TimeDelta::try_days(x)?))
                    .and_then(|d| d.and_hms_opt(0, 0, 0)),
                NumberUnit::Time(TimeUnit::Second) => {
                    DateTime::<Utc>::from_timestamp(x, 0).map(|t| t.naive_utc())
                }
                NumberUnit::Time(TimeUnit::Millisecond) => {
                    DateTime::<Utc>::from_timestamp_millis(x).map(|t| t.naive_utc())
                }
                NumberUnit::Time(TimeUnit::Microsecond) => {
                    DateTime::<Utc>::from_timestamp_micros(x).map(|t| t.naive_utc())
                }
                NumberUnit::Time(TimeUnit::Nanosecond) => {
                    Some(DateTime::<Utc>::from_timestamp_nanos(x).naive_utc())
                }
            };
            t.ok_or_else(|| bad(format!("{text} is out of range")))
        }
        Value::String(s) => {
            let text = s.replacen(' ', "T", 1);
            if let Ok(t) = DateTime::parse_from_rfc3339(&text) {
                return Ok(t.naive_utc());
            }
            if let Ok(t) = NaiveDateTime::parse_from_str(&text, "%Y-%m-%dT%H:%M:%S%.f") {
                return Ok(t);
            }
            NaiveDate::parse_from_str(s, "%Y-%m-%d")
                .ok()
                .and_then(|d| d.and_hms_opt(0, 0, 0))
                .ok_or_else(|| {
                    bad(format!(
                        "{s:?} is not a time (RFC 3339, a local date and time, or a date)"
                    ))
                })
        }
        other => Err(bad(format!("{other} is not a time"))),
    }
}

/// `text` with the characters Hive escapes in a partition's folder name written as
/// `%XX` (so `/` never makes another folder, and readers that unescape get the value
/// back).
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let escaped = matches!(
            c,
            '\u{01}'
                ..='\u{1F}'
                    | '"'
                    | '#'
                    | '%'
                    | '\''
                    | '*'
                    | '/'
                    | ':'
                    | '='
                    | '?'
                    | '\\'
                    | '\u{7F}'
                    | '{'
                    | '['
                    | ']'
                    | '^'
        ) || c == '\0';
        if escaped {
            out.push_str(&format!("%{:02X}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// Whether `folder` (from a checkpoint) is one a template can make: relative, inside
/// the sink's directory, no folder readers skip. A checkpoint naming another is
/// refused, so that a crafted one cannot reach a file elsewhere.
pub fn valid_folder(folder: &str) -> bool {
    folder.is_empty()
        || folder.split('/').all(|s| {
            !s.is_empty()
                && s.len() <= MAX_SEGMENT
                && s != "."
                && s != ".."
                && !s.starts_with(['.', '_'])
                && s.contains('=')
                && !s.contains(['\\', '\0'])
                // The controls `escape` writes as `%XX`; others (U+0080..U+009F) are
                // in a folder as a value holds them.
                && !s.chars().any(|c| c.is_ascii_control())
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_schema::Field;
    use bytes::Bytes;

    fn record(value: &str) -> Record {
        Record {
            value: Bytes::from(value.to_string()),
            timestamp: Some(1_714_564_800_000), // 2024-05-01T12:00:00Z
            ..Record::default()
        }
    }

    fn folder(template: &str, value: &str) -> Result<String, String> {
        PartitionTemplate::parse(template, None)
            .unwrap()
            .folder(&record(value))
    }

    #[test]
    fn reading_only_the_named_fields_finds_what_the_whole_value_holds() {
        let pointers = [
            "/a",
            "/b~1c/0",
            "/d/e",
            "/x",
            "/x/deep/1/y",
            "/m~0n",
            "/none/z",
        ];
        let t = PartitionTemplate::parse(
            &pointers
                .iter()
                .enumerate()
                .map(|(i, p)| format!("f{i}={{{p}}}"))
                .collect::<Vec<_>>()
                .join("/"),
            None,
        )
        .unwrap();
        assert_eq!(t.tops, ["a", "b/c", "d", "x", "m~n", "none"]);
        for value in [
            r#"{"a":"1","b/c":["p","q"],"d":{"e":"2024-05-01"},"x":1.50,"m~n":0}"#,
            r#"{"x":{"deep":[1,{"y":null}]},"a":true,"a":2,"z":[{},[]]}"#,
            r#"{"b\/c":[],"d":{"e":0},"a":null}"#,
            r#" { } "#,
            r#"{"a":12345678901234567890123,"x":"\u00e9\ud83d\ude00/"}"#,
        ] {
            let whole: Value = serde_json::from_str(value).unwrap();
            let read = Fields::read(value.as_bytes(), &t.tops).unwrap();
            assert!(matches!(read, Fields::Top(_)), "{value}");
            for p in pointers {
                assert_eq!(read.pointer(&t.tops, p), whole.pointer(p), "{value} {p}");
            }
        }
        // A value that is not one object is read whole; one that is not JSON is refused
        // with serde_json's words, as before.
        assert_eq!(folder("a={/0}", "[7]"), Ok("a=7".to_string()));
        for bad in [r#"{"a":1,}"#, r#"{"a":"\ud800"}"#, "[1", ""] {
            let e = folder("a={/a}", bad).unwrap_err();
            let serde = serde_json::from_str::<Value>(bad).unwrap_err();
            assert_eq!(
                e,
                format!("partition_by: the value is not JSON: {serde}"),
                "{bad}"
            );
        }
    }

    #[test]
    fn fields_and_times_name_hive_style_folders() {
        let t = "dt={/ts:%Y-%m-%d}/country={/country}";
        assert_eq!(
            folder(t, r#"{"ts": 1714564800000, "country": "DE"}"#).unwrap(),
            "dt=2024-05-01/country=DE"
        );
        assert_eq!(
            folder(t, r#"{"ts": "2024-05-01T23:30:00-02:00", "country": "DE"}"#).unwrap(),
            "dt=2024-05-02/country=DE",
            "a time with an offset is named in UTC"
        );
        assert_eq!(
            folder(t, r#"{"ts": "2024-05-01", "country": 49}"#).unwrap(),
            "dt=2024-05-01/country=49"
        );
        assert_eq!(
            folder("amount={/a}", r#"{"a": 1.50}"#).unwrap(),
            "amount=1.50",
            "a number keeps its text"
        );
        assert_eq!(
            folder("h={timestamp:%Y%m%d%H}", "{}").unwrap(),
            "h=2024050112"
        );
        assert_eq!(folder("y={/ts:%Y}-q", r#"{"ts": 0}"#).unwrap(), "y=1970-q");
    }

    #[test]
    fn missing_null_and_empty_values_go_to_the_default_partition() {
        let t = "country={/country}";
        for v in [r#"{}"#, r#"{"country": null}"#, r#"{"country": ""}"#] {
            assert_eq!(folder(t, v).unwrap(), "country=__HIVE_DEFAULT_PARTITION__");
        }
        assert_eq!(
            folder("dt={/ts:%Y}", "{}").unwrap(),
            "dt=__HIVE_DEFAULT_PARTITION__"
        );
    }

    #[test]
    fn an_empty_time_goes_to_the_default_partition() {
        for v in [r#"{"ts": ""}"#, r#"{"ts": null}"#] {
            assert_eq!(
                folder("dt={/ts:%Y}", v).unwrap(),
                "dt=__HIVE_DEFAULT_PARTITION__",
                "{v}"
            );
        }
    }

    #[test]
    fn values_are_escaped_so_that_they_never_make_another_folder() {
        let f = folder("c={/c}", r#"{"c": "../a/b=c%d:e"}"#).unwrap();
        assert_eq!(f, "c=..%2Fa%2Fb%3Dc%25d%3Ae");
        assert!(valid_folder(&f));
        assert_eq!(
            folder("c={/c}", r#"{"c": "Zürich ok"}"#).unwrap(),
            "c=Zürich ok"
        );
        assert_eq!(escape("\u{1}\u{7F}"), "%01%7F");
    }

    #[test]
    fn values_that_cannot_name_a_folder_are_refused_naming_the_field() {
        let e = folder("c={/c}", r#"{"c": {"x": 1}}"#).unwrap_err();
        assert!(e.contains("/c") && e.contains("object"), "{e}");
        let e = folder("dt={/ts:%Y}", r#"{"ts": "yesterday"}"#).unwrap_err();
        assert!(e.contains("/ts") && e.contains("not a time"), "{e}");
        let e = folder("dt={/ts:%Y}", r#"{"ts": 1.5}"#).unwrap_err();
        assert!(e.contains("whole number"), "{e}");
        let e = folder("c={/c}", "not json").unwrap_err();
        assert!(e.contains("not JSON"), "{e}");
        let long = format!(r#"{{"c": "{}"}}"#, "x".repeat(300));
        assert!(folder("c={/c}", &long).unwrap_err().contains("bytes long"));
        let mut delete = record("{}");
        delete.tombstone = true;
        let t = PartitionTemplate::parse("c={/c}", None).unwrap();
        assert!(t.folder(&delete).unwrap_err().contains("delete"));
        let t = PartitionTemplate::parse("h={timestamp:%H}", None).unwrap();
        assert_eq!(t.folder(&delete).unwrap(), "h=12", "no field is read");
    }

    #[test]
    fn numbers_count_in_the_unit_of_their_column() {
        let schema = Schema::new(vec![
            Field::new("d", DataType::Date32, false),
            Field::new(
                "us",
                DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
                false,
            ),
            Field::new(
                "o",
                DataType::Struct(
                    vec![Field::new(
                        "s",
                        DataType::Timestamp(TimeUnit::Second, None),
                        false,
                    )]
                    .into(),
                ),
                false,
            ),
        ]);
        let t = PartitionTemplate::parse(
            "d={/d:%Y-%m-%d}/us={/us:%Y-%m-%d}/s={/o/s:%Y-%m-%d}/ms={/x:%Y-%m-%d}",
            Some(&schema),
        )
        .unwrap();
        let r = record(
            r#"{"d": 19844, "us": 1714564800000000, "o": {"s": 1714564800}, "x": 1714564800000}"#,
        );
        assert_eq!(
            t.folder(&r).unwrap(),
            "d=2024-05-01/us=2024-05-01/s=2024-05-01/ms=2024-05-01"
        );
    }

    #[test]
    fn templates_are_checked_when_loaded() {
        for (bad, says) in [
            ("", "empty"),
            ("dt={/ts:%Y}/", "empty"),
            ("{/country}", "name=value"),
            ("_c={/c}", "`.` or `_`"),
            (".c={/c}", "`.` or `_`"),
            ("c=", "no value"),
            ("c={/c", "without its `}`"),
            ("c=/c}", "without its `{`"),
            ("c={{/c}}", "nested"),
            ("c={country}", "neither a field"),
            ("c={timestamp}", "needs a time format"),
            ("c={/ts:Y}", "not a strftime format"),
            ("c={/ts:%Q}", "chrono"),
            ("c={/ts:%Z}", "time zone"),
            ("c=a:b", "escapes"),
        ] {
            let e = PartitionTemplate::parse(bad, None).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }

    #[test]
    fn every_folder_a_template_makes_is_valid_in_a_checkpoint() {
        // Controls beyond ASCII (C1, U+0080..U+009F) are not among Hive's escapes: the
        // folder keeps them, and a checkpoint naming it must restore.
        for (template, value) in [
            ("c={/c}", r#"{"c": "a\u0085b"}"#),
            ("c={/c}", r#"{"c": "\u009f"}"#),
            ("c={/c}", r#"{"c": "\u2028 \ufeff"}"#),
        ] {
            let f = folder(template, value).unwrap();
            assert!(valid_folder(&f), "{f:?}");
        }
        let name = "k\u{85}";
        let t = PartitionTemplate::parse(&format!("{name}={{/c}}"), None).unwrap();
        let f = t.folder(&record(r#"{"c": "x"}"#)).unwrap();
        assert!(valid_folder(&f), "{f:?}");
    }

    #[test]
    fn a_folder_name_is_given_once() {
        let e = PartitionTemplate::parse("c={/a}/c={/b}", None).unwrap_err();
        assert!(e.contains("`c`") && e.contains("twice"), "{e}");
    }

    #[test]
    fn a_delete_with_its_image_goes_to_the_folder_of_that_image() {
        let t = PartitionTemplate::parse("c={/c}", None).unwrap();
        let mut delete = record(r#"{"c": "DE"}"#);
        delete.op = Op::Delete;
        assert_eq!(t.folder(&delete).unwrap(), "c=DE");
        for image in ["", "null"] {
            let mut without = record(image);
            without.op = Op::Delete;
            assert!(
                t.folder(&without).unwrap_err().contains("delete"),
                "{image:?}"
            );
        }
    }

    #[test]
    fn units_are_found_through_lists_and_maps_not_beside_them() {
        let at = |u| DataType::Timestamp(u, Some("+00:00".into()));
        let schema = Schema::new(vec![
            // A top-level column whose name a nested step repeats.
            Field::new("ts", at(TimeUnit::Second), false),
            Field::new(
                "m",
                DataType::Map(
                    Field::new(
                        "entries",
                        DataType::Struct(
                            vec![
                                Field::new("key", DataType::Utf8, false),
                                Field::new("value", DataType::Int64, true),
                            ]
                            .into(),
                        ),
                        false,
                    )
                    .into(),
                    false,
                ),
                false,
            ),
            Field::new(
                "items",
                DataType::List(
                    Field::new(
                        "item",
                        DataType::Struct(
                            vec![Field::new("at", at(TimeUnit::Microsecond), false)].into(),
                        ),
                        false,
                    )
                    .into(),
                ),
                false,
            ),
        ]);
        let t =
            PartitionTemplate::parse("m={/m/ts:%Y-%m-%d}/i={/items/0/at:%Y-%m-%d}", Some(&schema))
                .unwrap();
        let r = record(r#"{"m": {"ts": 1714564800000}, "items": [{"at": 1714564800000000}]}"#);
        assert_eq!(t.folder(&r).unwrap(), "m=2024-05-01/i=2024-05-01");
    }

    #[test]
    fn only_folders_a_template_can_make_are_valid_in_a_checkpoint() {
        for ok in ["", "a=1", "dt=2024-05-01/country=DE", "c=%2F..%2F"] {
            assert!(valid_folder(ok), "{ok}");
        }
        for bad in [
            "..",
            "a=1/..",
            "/a=1",
            "a=1/",
            "a=1//b=2",
            "_staging/a=1",
            ".rolled-back",
            "plain",
            "a=\u{1}",
            "a=1\\..",
        ] {
            assert!(!valid_folder(bad), "{bad:?}");
        }
    }
}
