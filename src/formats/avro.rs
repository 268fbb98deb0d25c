//! Avro binary values decoded straight to JSON text, driven by the writer schema (no
//! tree of values in between). The rules are what an Elasticsearch mapping sees:
//!
//! | Avro | JSON |
//! |---|---|
//! | record | an object, fields in schema order |
//! | union | the branch's value, no wrapper (`null` for the null branch) |
//! | enum | its symbol |
//! | `bytes`, `fixed` | base64 (standard alphabet, padded) |
//! | `decimal` | a number with exactly its digits and scale (`5094.61`, `1.50`) |
//! | `timestamp-millis`, `-micros`, `-nanos` | epoch milliseconds (floor), or RFC 3339 in UTC with `temporal = "iso8601"` |
//! | `local-timestamp-*` | epoch milliseconds, or RFC 3339 without an offset |
//! | `date` | `YYYY-MM-DD` |
//! | `time-millis`, `time-micros` | milliseconds after midnight, or `HH:MM:SS.fff` |
//! | `uuid` | its string |
//! | `duration` | `{"months": m, "days": d, "millis": ms}` |
//! | map | an object |
//! | `float`, `double` | a number; NaN and the infinities as the strings `"NaN"`, `"Infinity"`, `"-Infinity"` (Protobuf's JSON rule: JSON has no such numbers) |
//!
//! Debezium's semantic types (a primitive or record whose `connect.name` is
//! `io.debezium.time.Date`, `io.debezium.time.MicroTimestamp`,
//! `io.debezium.data.VariableScaleDecimal`, ...) are written as
//! [`super::debezium_types`] says, whatever `temporal` is.
//!
//! A value that does not match its schema (a truncated body, a union index out of range,
//! a string that is not UTF-8, bytes left over) is an error that says what and where.

use super::debezium_types::{self, Semantic};
use super::json_out::{base64, decimal, float, float32, number, string};
use apache_avro::schema::{Name, Schema};
use std::collections::HashMap;
use std::io::Write as _;

/// How time values are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Temporal {
    /// Epoch milliseconds (timestamps), milliseconds after midnight (times).
    #[default]
    EpochMillis,
    /// RFC 3339 strings (timestamps), `HH:MM:SS.fff` (times).
    Iso8601,
}

/// Decodes values of one writer schema.
#[derive(Debug, Clone)]
pub struct AvroDecoder {
    schema: Schema,
    /// The named types of the schema, for `Ref`s.
    names: HashMap<Name, Schema>,
    /// The schemas its named types come from: its references', then its own.
    roots: Vec<Schema>,
    temporal: Temporal,
    /// The Debezium semantic types of the schema's record fields.
    hints: Hints,
    /// The Debezium semantic type of the schema itself.
    root_hint: Option<Hint>,
}

/// Where a schema names a Debezium semantic type on a primitive: the `connect.name`
/// that Avro's parser does not keep, kept beside the schema, shaped as the type that
/// holds it.
#[derive(Debug, Clone, PartialEq)]
enum Hint {
    Semantic(Semantic),
    /// A union: the hint of each branch.
    Union(Vec<Option<Hint>>),
    Items(Box<Hint>),
    Values(Box<Hint>),
}

/// The hints of each record's fields (by field index), for records with any.
type Hints = HashMap<Name, Vec<Option<Hint>>>;

/// The hint of schema `v` (JSON) whose enclosing namespace is `namespace`, adding
/// those of the records it defines to `hints`.
fn find_hints(v: &serde_json::Value, namespace: Option<&str>, hints: &mut Hints) -> Option<Hint> {
    use serde_json::Value;
    match v {
        Value::Array(branches) => {
            let branches: Vec<Option<Hint>> = branches
                .iter()
                .map(|b| find_hints(b, namespace, hints))
                .collect();
            branches
                .iter()
                .any(Option::is_some)
                .then_some(Hint::Union(branches))
        }
        Value::Object(o) => {
            let ty = o.get("type");
            match ty.and_then(Value::as_str) {
                Some("record" | "error") => {
                    let name = o.get("name").and_then(Value::as_str)?;
                    let (full, inner_ns) = match (name.rsplit_once('.'), o.get("namespace")) {
                        (Some((ns, _)), _) => (name.to_string(), Some(ns.to_string())),
                        (None, Some(Value::String(ns))) if !ns.is_empty() => {
                            (format!("{ns}.{name}"), Some(ns.clone()))
                        }
                        (None, Some(Value::String(_))) => (name.to_string(), None),
                        _ => (
                            namespace.map_or_else(|| name.to_string(), |ns| format!("{ns}.{name}")),
                            namespace.map(String::from),
                        ),
                    };
                    let fields: Vec<Option<Hint>> = o
                        .get("fields")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .map(|f| {
                            f.get("type")
                                .and_then(|t| find_hints(t, inner_ns.as_deref(), hints))
                        })
                        .collect();
                    if fields.iter().any(Option::is_some) {
                        if let Ok(name) = Name::new(&full) {
                            hints.insert(name, fields);
                        }
                    }
                    None
                }
                Some("array") => o
                    .get("items")
                    .and_then(|i| find_hints(i, namespace, hints))
                    .map(|h| Hint::Items(Box::new(h))),
                Some("map") => o
                    .get("values")
                    .and_then(|i| find_hints(i, namespace, hints))
                    .map(|h| Hint::Values(Box::new(h))),
                Some("int" | "long") => o
                    .get("connect.name")
                    .and_then(Value::as_str)
                    .and_then(Semantic::named)
                    .filter(|s| *s != Semantic::VariableScaleDecimal)
                    .map(Hint::Semantic),
                Some(_) => None,
                None => ty.and_then(|t| find_hints(t, namespace, hints)),
            }
        }
        _ => None,
    }
}

/// The hints of the schema texts `texts`, and of the last one itself.
fn hints_of(texts: &[&str]) -> Result<(Hints, Option<Hint>), String> {
    let mut hints = Hints::new();
    let mut root = None;
    for text in texts {
        // Only a schema that names one has any.
        if !text.contains("io.debezium.") {
            root = None;
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("not a valid Avro schema: {e}"))?;
        root = find_hints(&v, None, &mut hints);
    }
    Ok((hints, root))
}

/// The deepest nesting of the JSON written (records, arrays, maps, durations): a recursive
/// schema lets a few bytes per level nest without end, and the JSON written must stay
/// within what the `json` format accepts.
pub const MAX_DEPTH: u32 = super::json::MAX_DEPTH;

/// The named types defined in `roots` (a schema and the schemas it references).
fn named_types(roots: &[Schema]) -> Result<HashMap<Name, Schema>, String> {
    Ok(
        apache_avro::schema::ResolvedSchema::try_from(roots.iter().collect::<Vec<_>>())
            .map_err(|e| format!("the schema's named types do not resolve: {e}"))?
            .get_names()
            .iter()
            .map(|(n, s)| (n.clone(), (*s).clone()))
            .collect(),
    )
}

/// The logical type a `fixed(16)` uuid is parsed with, so that its size is kept (the
/// parser would otherwise read it as a string uuid).
const FIXED_UUID: &str = "lockgate-fixed-uuid";

/// `json` with each `fixed` uuid's logical type renamed to [`FIXED_UUID`].
fn keep_fixed_uuids(json: &str) -> Result<std::borrow::Cow<'_, str>, String> {
    if !json.contains("uuid") {
        return Ok(std::borrow::Cow::Borrowed(json));
    }
    fn walk(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(o) => {
                // Other sizes keep their plain fixed reading, as the spec says.
                if o.get("type").and_then(|t| t.as_str()) == Some("fixed")
                    && o.get("logicalType").and_then(|t| t.as_str()) == Some("uuid")
                    && o.get("size").and_then(|n| n.as_u64()) == Some(16)
                {
                    o.insert("logicalType".into(), FIXED_UUID.into());
                }
                o.values_mut().for_each(walk);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(walk),
            _ => {}
        }
    }
    let mut v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("not a valid Avro schema: {e}"))?;
    walk(&mut v);
    Ok(std::borrow::Cow::Owned(v.to_string()))
}

impl AvroDecoder {
    /// A decoder of values written with `schema` (its named types resolved).
    pub fn new(schema: Schema, temporal: Temporal) -> Result<AvroDecoder, String> {
        let names = named_types(std::slice::from_ref(&schema))?;
        Ok(AvroDecoder {
            roots: vec![schema.clone()],
            schema,
            names,
            temporal,
            hints: Hints::new(),
            root_hint: None,
        })
    }

    /// A decoder of the schema in `json` (an `.avsc` file, a registry's answer).
    pub fn parse(json: &str, temporal: Temporal) -> Result<AvroDecoder, String> {
        let json = keep_fixed_uuids(json)?;
        let schema =
            Schema::parse_str(&json).map_err(|e| format!("not a valid Avro schema: {e}"))?;
        let (hints, root_hint) = hints_of(&[&json])?;
        Ok(AvroDecoder {
            hints,
            root_hint,
            ..AvroDecoder::new(schema, temporal)?
        })
    }

    /// A decoder of the schema in `json`, whose named types may be defined in the
    /// `references` (schemas a registry lists as its references).
    pub fn parse_with(
        json: &str,
        references: &[&str],
        temporal: Temporal,
    ) -> Result<AvroDecoder, String> {
        if references.is_empty() {
            return AvroDecoder::parse(json, temporal);
        }
        let json = keep_fixed_uuids(json)?;
        let references = references
            .iter()
            .map(|r| keep_fixed_uuids(r).map(|c| c.into_owned()))
            .collect::<Result<Vec<_>, _>>()?;
        let (schema, mut roots) = Schema::parse_str_with_list(&json, &references)
            .map_err(|e| format!("not a valid Avro schema with its references: {e}"))?;
        roots.push(schema.clone());
        let names = named_types(&roots)?;
        let mut texts: Vec<&str> = references.iter().map(String::as_str).collect();
        texts.push(&json);
        let (hints, root_hint) = hints_of(&texts)?;
        Ok(AvroDecoder {
            schema,
            names,
            roots,
            temporal,
            hints,
            root_hint,
        })
    }

    /// The schema it decodes.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The schemas its named types come from (its references', then its own): what
    /// resolving its values to a reader schema needs.
    pub fn roots(&self) -> impl Iterator<Item = &Schema> {
        self.roots.iter()
    }

    /// The JSON text of the value encoded in `datum`, which it must use whole.
    pub fn to_json(&self, datum: &[u8]) -> Result<Vec<u8>, String> {
        let mut out = Vec::with_capacity(datum.len() * 2 + 16);
        let mut r = Reader {
            b: datum,
            at: 0,
            depth: 0,
            items: datum.len() as u64 + MAX_EMPTY_ITEMS,
        };
        self.value(&self.schema, self.root_hint.as_ref(), &mut r, &mut out)?;
        if r.at != datum.len() {
            return Err(format!(
                "{} bytes left after the value (of {})",
                datum.len() - r.at,
                datum.len()
            ));
        }
        Ok(out)
    }

    fn value(
        &self,
        schema: &Schema,
        hint: Option<&Hint>,
        r: &mut Reader,
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        // What nests in the JSON nests here; a union or a named reference between two
        // levels adds a call, not a level.
        let nests = matches!(
            schema,
            Schema::Record(_) | Schema::Array(_) | Schema::Map(_)
        );
        if nests {
            r.depth += 1;
            if r.depth > MAX_DEPTH {
                return Err(r.error(&format!("values nest deeper than {MAX_DEPTH}")));
            }
        }
        self.inner(schema, hint, r, out)?;
        if nests {
            r.depth -= 1;
        }
        Ok(())
    }

    fn inner(
        &self,
        schema: &Schema,
        hint: Option<&Hint>,
        r: &mut Reader,
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        match schema {
            Schema::Int | Schema::Long if hint.is_some() => {
                let at = r.at;
                let n = r.long()?;
                match hint {
                    Some(Hint::Semantic(s)) => {
                        string(out, &s.integer(n).map_err(|e| format!("{e} at byte {at}"))?)
                    }
                    _ => number(out, n),
                }
            }
            Schema::Null => out.extend_from_slice(b"null"),
            Schema::Boolean => match r.byte()? {
                0 => out.extend_from_slice(b"false"),
                1 => out.extend_from_slice(b"true"),
                b => return Err(r.error(&format!("boolean byte {b}"))),
            },
            Schema::Int | Schema::Long => number(out, r.long()?),
            Schema::Float => float32(out, f32::from_le_bytes(r.array::<4>()?)),
            Schema::Double => float(out, f64::from_le_bytes(r.array::<8>()?)),
            Schema::Bytes => base64(out, r.bytes()?),
            Schema::String => string(out, r.str()?),
            Schema::Uuid => string(out, r.str()?),
            Schema::Fixed(f)
                if f.attributes.get("logicalType").and_then(|t| t.as_str()) == Some(FIXED_UUID) =>
            {
                let b: [u8; 16] = r
                    .take(f.size)?
                    .try_into()
                    .map_err(|_| r.error("a uuid of other than 16 bytes"))?;
                string(out, &uuid_text(&b));
            }
            Schema::Fixed(f) => base64(out, r.take(f.size)?),
            Schema::Enum(e) => {
                let symbol = r.index("enum", &e.symbols)?;
                string(out, symbol);
            }
            Schema::Union(u) => {
                let (i, branch) = r.indexed("union", u.variants())?;
                let hint = match hint {
                    Some(Hint::Union(branches)) => branches.get(i).and_then(Option::as_ref),
                    _ => None,
                };
                self.value(branch, hint, r, out)?;
            }
            Schema::Array(a) => {
                let items = match hint {
                    Some(Hint::Items(h)) => Some(&**h),
                    _ => None,
                };
                out.push(b'[');
                self.blocks(r, out, |d, r, out| d.value(&a.items, items, r, out))?;
                out.push(b']');
            }
            Schema::Map(m) => {
                let values = match hint {
                    Some(Hint::Values(h)) => Some(&**h),
                    _ => None,
                };
                out.push(b'{');
                self.blocks(r, out, |d, r, out| {
                    string(out, r.str()?);
                    out.push(b':');
                    d.value(&m.types, values, r, out)
                })?;
                out.push(b'}');
            }
            Schema::Record(rec) if is_variable_scale_decimal(rec) => {
                let at = r.at;
                let scale = r.long()?;
                let unscaled = r.bytes()?;
                let text = debezium_types::variable_scale_decimal(scale, unscaled)
                    .map_err(|e| format!("{e} at byte {at}"))?;
                out.extend_from_slice(text.as_bytes());
            }
            Schema::Record(rec) => {
                let hints = self.hints.get(&rec.name);
                out.push(b'{');
                for (i, field) in rec.fields.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    string(out, &field.name);
                    out.push(b':');
                    let hint = hints.and_then(|h| h.get(i)).and_then(Option::as_ref);
                    self.value(&field.schema, hint, r, out)?;
                }
                out.push(b'}');
            }
            Schema::Decimal(d) => {
                let unscaled = match &*d.inner {
                    Schema::Fixed(f) => r.take(f.size)?,
                    _ => r.bytes()?,
                };
                decimal(out, unscaled, d.scale).map_err(|e| r.error(&e))?;
            }
            Schema::Date => {
                let days = r.long()?;
                let date = chrono::NaiveDate::from_ymd_opt(1970, 1, 1)
                    .and_then(|e| e.checked_add_signed(chrono::TimeDelta::try_days(days)?))
                    .ok_or_else(|| r.error(&format!("date {days} days from the epoch")))?;
                string(out, &date.format("%Y-%m-%d").to_string());
            }
            Schema::TimeMillis => self.time(out, r.long()?.saturating_mul(1_000), r)?,
            Schema::TimeMicros => self.time(out, r.long()?, r)?,
            Schema::TimestampMillis => self.timestamp(out, r.long()?, 1_000_000, true, r)?,
            Schema::TimestampMicros => self.timestamp(out, r.long()?, 1_000, true, r)?,
            Schema::TimestampNanos => self.timestamp(out, r.long()?, 1, true, r)?,
            Schema::LocalTimestampMillis => self.timestamp(out, r.long()?, 1_000_000, false, r)?,
            Schema::LocalTimestampMicros => self.timestamp(out, r.long()?, 1_000, false, r)?,
            Schema::LocalTimestampNanos => self.timestamp(out, r.long()?, 1, false, r)?,
            Schema::Duration => {
                let b = r.array::<12>()?;
                let part = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
                let _ = write!(
                    out,
                    r#"{{"months":{},"days":{},"millis":{}}}"#,
                    part(0),
                    part(4),
                    part(8)
                );
            }
            Schema::BigDecimal => {
                return Err("the big-decimal logical type is not supported".into())
            }
            Schema::Ref { name } => {
                let named = self
                    .names
                    .get(name)
                    .ok_or_else(|| format!("the schema names {name:?} without defining it"))?;
                self.value(named, hint, r, out)?;
            }
        }
        Ok(())
    }

    /// The items of an array or map, block by block, comma-separated; `item` writes one.
    fn blocks(
        &self,
        r: &mut Reader,
        out: &mut Vec<u8>,
        item: impl Fn(&Self, &mut Reader, &mut Vec<u8>) -> Result<(), String>,
    ) -> Result<(), String> {
        let mut first = true;
        while let Some(n) = r.block()? {
            for _ in 0..n {
                if !std::mem::take(&mut first) {
                    out.push(b',');
                }
                item(self, r, out)?;
            }
        }
        Ok(())
    }

    /// A timestamp of `n` units of `unit_ns` nanoseconds; `utc`: with the `Z` offset.
    fn timestamp(
        &self,
        out: &mut Vec<u8>,
        n: i64,
        unit_ns: i64,
        utc: bool,
        r: &Reader,
    ) -> Result<(), String> {
        let per_ms = 1_000_000 / unit_ns;
        match self.temporal {
            Temporal::EpochMillis => number(out, n.div_euclid(per_ms)),
            Temporal::Iso8601 => {
                // By unit, so that milliseconds and microseconds reach years that
                // nanoseconds in an i64 do not (9999-12-31 as a "never" sentinel).
                let (t, format) = match unit_ns {
                    1_000_000 => (chrono::DateTime::from_timestamp_millis(n), ISO_MILLIS),
                    1_000 => (chrono::DateTime::from_timestamp_micros(n), ISO_MICROS),
                    _ => (Some(chrono::DateTime::from_timestamp_nanos(n)), ISO_NANOS),
                };
                let t = t.ok_or_else(|| r.error(&format!("timestamp {n} out of range")))?;
                let text = t.format(format).to_string();
                string(out, &if utc { text + "Z" } else { text });
            }
        }
        Ok(())
    }

    /// A time of day, `micros` after midnight.
    fn time(&self, out: &mut Vec<u8>, micros: i64, r: &Reader) -> Result<(), String> {
        match self.temporal {
            Temporal::EpochMillis => number(out, micros.div_euclid(1_000)),
            Temporal::Iso8601 => {
                let secs = u32::try_from(micros.div_euclid(1_000_000))
                    .map_err(|_| r.error(&format!("time of day {micros} µs")))?;
                let nanos = (micros.rem_euclid(1_000_000) * 1_000) as u32;
                let t = chrono::NaiveTime::from_num_seconds_from_midnight_opt(secs, nanos)
                    .ok_or_else(|| r.error(&format!("time of day {micros} µs")))?;
                string(out, &t.format("%H:%M:%S%.3f").to_string());
            }
        }
        Ok(())
    }
}

/// Whether `rec` is Debezium's `VariableScaleDecimal`: its name, an integer `scale`
/// and the unscaled `value` bytes.
fn is_variable_scale_decimal(rec: &apache_avro::schema::RecordSchema) -> bool {
    rec.name.name == "VariableScaleDecimal"
        && rec.name.namespace.as_deref() == Some("io.debezium.data")
        && matches!(
            rec.fields.as_slice(),
            [scale, value] if scale.name == "scale"
                && matches!(scale.schema, Schema::Int | Schema::Long)
                && value.name == "value"
                && matches!(value.schema, Schema::Bytes)
        )
}

/// RFC 3339 without the offset, with the unit's fractional digits.
const ISO_MILLIS: &str = "%Y-%m-%dT%H:%M:%S%.3f";
const ISO_MICROS: &str = "%Y-%m-%dT%H:%M:%S%.6f";
const ISO_NANOS: &str = "%Y-%m-%dT%H:%M:%S%.9f";

/// How many more array and map items than bytes a datum may count (items of no
/// bytes): a million `null`s, about 5 MiB of JSON.
const MAX_EMPTY_ITEMS: u64 = 1 << 20;

/// Where the decoder is in a datum.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
    /// How deep the value being read nests.
    depth: u32,
    /// How many more array and map items the datum may count.
    items: u64,
}

/// The canonical text of a uuid's 16 bytes.
fn uuid_text(b: &[u8; 16]) -> String {
    let h = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "{}-{}-{}-{}-{}",
        h(0..4),
        h(4..6),
        h(6..8),
        h(8..10),
        h(10..16)
    )
}

impl<'a> Reader<'a> {
    fn error(&self, what: &str) -> String {
        format!("{what} at byte {}", self.at)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| {
                self.error(&format!(
                    "{n} bytes wanted, {} left",
                    self.b.len() - self.at
                ))
            })?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let s = self.take(N)?;
        Ok(s.try_into().expect("N bytes"))
    }

    fn byte(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    /// A zigzag varint (`int` and `long` alike).
    fn long(&mut self) -> Result<i64, String> {
        if self.at >= self.b.len() {
            return Err(self.error("the value ends where a number was wanted"));
        }
        let (v, rest) =
            super::confluent::zigzag_varint(&self.b[self.at..]).map_err(|e| self.error(&e))?;
        self.at = self.b.len() - rest.len();
        Ok(v)
    }

    /// The element of `of` that the next number indexes (an enum's symbol, a union's
    /// branch), `what` naming it in the error.
    fn index<'s, T>(&mut self, what: &str, of: &'s [T]) -> Result<&'s T, String> {
        self.indexed(what, of).map(|(_, t)| t)
    }

    /// [`Reader::index`] with the index.
    fn indexed<'s, T>(&mut self, what: &str, of: &'s [T]) -> Result<(usize, &'s T), String> {
        let i = self.long()?;
        usize::try_from(i)
            .ok()
            .and_then(|i| Some((i, of.get(i)?)))
            .ok_or_else(|| self.error(&format!("{what} index {i} of {}", of.len())))
    }

    /// Length-prefixed bytes.
    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.long()?;
        let n = usize::try_from(n).map_err(|_| self.error(&format!("a length of {n}")))?;
        self.take(n)
    }

    fn str(&mut self) -> Result<&'a str, String> {
        let at = self.at;
        let b = self.bytes()?;
        std::str::from_utf8(b).map_err(|e| format!("a string that is not UTF-8 ({e}) at byte {at}"))
    }

    /// The item count of the next block of an array or map; `None` at its end. A
    /// negative count is followed by the block's size in bytes, which is not needed.
    /// Items may take no bytes (`null`, an empty record), so counts are not bounded by
    /// what is left: all the blocks of a datum together may count [`MAX_EMPTY_ITEMS`]
    /// more items than it has bytes, which keeps forged counts from writing without
    /// end.
    fn block(&mut self) -> Result<Option<u64>, String> {
        let n = match self.long()? {
            0 => return Ok(None),
            n if n < 0 => {
                self.long()?;
                n.unsigned_abs()
            }
            n => n as u64,
        };
        match self.items.checked_sub(n) {
            Some(rest) => self.items = rest,
            None => {
                return Err(self.error(&format!(
                    "{n} more items than the {}-byte datum can hold",
                    self.b.len()
                )))
            }
        }
        Ok(Some(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apache_avro::types::Value;
    use serde_json::json;

    fn decode(schema: &str, value: Value, temporal: Temporal) -> serde_json::Value {
        let d = AvroDecoder::parse(schema, temporal).unwrap();
        let datum = apache_avro::to_avro_datum(&d.schema, value).unwrap();
        let text = d.to_json(&datum).unwrap();
        serde_json::from_slice(&text)
            .unwrap_or_else(|e| panic!("{}: {e}", String::from_utf8_lossy(&text)))
    }

    fn decimal_text(unscaled: &[u8], scale: usize) -> String {
        let mut out = Vec::new();
        decimal(&mut out, unscaled, scale).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_decimal_is_its_exact_digits_and_scale() {
        let cases: &[(&[u8], usize, &str)] = &[
            (&509461i64.to_be_bytes(), 2, "5094.61"),
            (&150i32.to_be_bytes(), 2, "1.50"),
            (&[0x05], 3, "0.005"),
            (&[0x00], 2, "0.00"),
            (&[], 0, "0"),
            (&(-509461i64).to_be_bytes(), 2, "-5094.61"),
            (&[0xff], 1, "-0.1"),
            (&[0x80], 0, "-128"),
            (
                &i128::MAX.to_be_bytes(),
                10,
                "17014118346046923173168730371.5884105727",
            ),
            (
                &i128::MIN.to_be_bytes(),
                0,
                "-170141183460469231731687303715884105728",
            ),
        ];
        for (bytes, scale, want) in cases {
            assert_eq!(
                decimal_text(bytes, *scale),
                *want,
                "{bytes:?} scale {scale}"
            );
        }
    }

    #[test]
    fn every_type_decodes_by_the_documented_rule() {
        let schema = r#"{
          "type": "record", "name": "Order", "namespace": "shop",
          "fields": [
            {"name": "id", "type": "long"},
            {"name": "paid", "type": "boolean"},
            {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 8, "scale": 2}},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "day", "type": {"type": "int", "logicalType": "date"}},
            {"name": "note", "type": ["null", "string"]},
            {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
            {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
              {"name": "name", "type": "string"}, {"name": "score", "type": "double"}]}},
            {"name": "tags", "type": {"type": "map", "values": "int"}},
            {"name": "lines", "type": {"type": "array", "items": "Customer"}},
            {"name": "raw", "type": "bytes"},
            {"name": "key", "type": {"type": "string", "logicalType": "uuid"}},
            {"name": "ratio", "type": "float"}
          ]
        }"#;
        let customer = |name: &str, score: f64| {
            Value::Record(vec![
                ("name".into(), Value::String(name.into())),
                ("score".into(), Value::Double(score)),
            ])
        };
        let value = Value::Record(vec![
            ("id".into(), Value::Long(42)),
            ("paid".into(), Value::Boolean(true)),
            (
                "amount".into(),
                Value::Decimal(apache_avro::Decimal::from(509461i64.to_be_bytes().to_vec())),
            ),
            ("at".into(), Value::TimestampMillis(1_700_000_000_123)),
            ("day".into(), Value::Date(19_000)),
            (
                "note".into(),
                Value::Union(1, Box::new(Value::String("rush".into()))),
            ),
            ("status".into(), Value::Enum(1, "PAID".into())),
            ("customer".into(), customer("ada", 9.5)),
            (
                "tags".into(),
                Value::Map([("a".to_string(), Value::Int(1))].into_iter().collect()),
            ),
            (
                "lines".into(),
                Value::Array(vec![customer("b", 1.0), customer("c", -2.25)]),
            ),
            ("raw".into(), Value::Bytes(vec![0, 1, 2, 250])),
            (
                "key".into(),
                Value::Uuid("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11".parse().unwrap()),
            ),
            ("ratio".into(), Value::Float(f32::NAN)),
        ]);
        let got = decode(schema, value.clone(), Temporal::EpochMillis);
        assert_eq!(
            got,
            json!({
                "id": 42, "paid": true, "amount": 5094.61, "at": 1_700_000_000_123i64,
                "day": "2022-01-08", "note": "rush", "status": "PAID",
                "customer": {"name": "ada", "score": 9.5}, "tags": {"a": 1},
                "lines": [{"name": "b", "score": 1.0}, {"name": "c", "score": -2.25}],
                "raw": "AAEC+g==", "key": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
                "ratio": "NaN"
            })
        );
        let iso = decode(schema, value, Temporal::Iso8601);
        assert_eq!(iso["at"], "2023-11-14T22:13:20.123Z");
        assert_eq!(iso["day"], "2022-01-08");
    }

    #[test]
    fn a_decimal_keeps_its_digits_in_the_json_text() {
        let schema = r#"{"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 2}"#;
        let d = AvroDecoder::parse(schema, Temporal::EpochMillis).unwrap();
        let datum = apache_avro::to_avro_datum(
            &d.schema,
            Value::Decimal(apache_avro::Decimal::from(vec![0x00, 0x96])),
        )
        .unwrap();
        assert_eq!(d.to_json(&datum).unwrap(), b"1.50");
    }

    #[test]
    fn times_and_timestamps_in_both_forms() {
        let cases: &[(&str, Value, serde_json::Value, serde_json::Value)] = &[
            (
                r#"{"type": "long", "logicalType": "timestamp-micros"}"#,
                Value::TimestampMicros(-1),
                json!(-1),
                json!("1969-12-31T23:59:59.999999Z"),
            ),
            (
                r#"{"type": "long", "logicalType": "local-timestamp-millis"}"#,
                Value::LocalTimestampMillis(86_400_000),
                json!(86_400_000),
                json!("1970-01-02T00:00:00.000"),
            ),
            (
                r#"{"type": "int", "logicalType": "time-millis"}"#,
                Value::TimeMillis(3_723_004),
                json!(3_723_004),
                json!("01:02:03.004"),
            ),
            (
                r#"{"type": "int", "logicalType": "date"}"#,
                Value::Date(-1),
                json!("1969-12-31"),
                json!("1969-12-31"),
            ),
        ];
        for (schema, value, epoch, iso) in cases {
            assert_eq!(
                &decode(schema, value.clone(), Temporal::EpochMillis),
                epoch,
                "{schema}"
            );
            assert_eq!(
                &decode(schema, value.clone(), Temporal::Iso8601),
                iso,
                "{schema}"
            );
        }
    }

    #[test]
    fn a_value_that_does_not_match_its_schema_says_what_and_where() {
        let d = AvroDecoder::parse(r#"["null", "string"]"#, Temporal::EpochMillis).unwrap();
        let cases: &[(&[u8], &str)] = &[
            (&[], "ends where a number was wanted at byte 0"),
            (&[4], "union index 2 of 2 at byte 1"),
            (&[2, 6, b'a'], "3 bytes wanted, 1 left at byte 2"),
            (&[2, 2, 0xff], "not UTF-8"),
            (&[0, 0], "1 bytes left after the value"),
            (&[0x80], "a varint that does not end"),
        ];
        for (datum, want) in cases {
            let e = d.to_json(datum).unwrap_err();
            assert!(e.contains(want), "{datum:?}: {e}");
        }
        assert!(AvroDecoder::parse("{\"type\": \"nope\"}", Temporal::EpochMillis).is_err());
    }

    /// Inputs a writer could forge: each is a record error, never a crash, a stall or
    /// unbounded memory.
    #[test]
    fn forged_values_are_errors_not_crashes() {
        // A recursive schema, a few bytes per level.
        let d = AvroDecoder::parse(
            r#"{"type":"record","name":"Node","fields":[{"name":"next","type":["null","Node"]}]}"#,
            Temporal::EpochMillis,
        )
        .unwrap();
        let mut deep = vec![2u8; 100_000];
        deep.push(0);
        let e = d.to_json(&deep).unwrap_err();
        assert!(e.contains("nest deeper"), "{e}");
        // The deepest JSON the json format accepts is written; one level more is not.
        let nested = |levels: usize| {
            let mut b = vec![2u8; levels - 1];
            b.push(0);
            b
        };
        assert!(d.to_json(&nested(MAX_DEPTH as usize)).is_ok());
        assert!(d.to_json(&nested(MAX_DEPTH as usize + 1)).is_err());
        // A block count of i64::MAX items of no bytes.
        let d = AvroDecoder::parse(r#"{"type":"array","items":"null"}"#, Temporal::EpochMillis)
            .unwrap();
        let mut huge = vec![0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        huge.push(0);
        let e = d.to_json(&huge).unwrap_err();
        assert!(e.contains("more items than"), "{e}");
        // Nulls that take no bytes are still read, up to a bound over all the blocks
        // of the datum, not per block.
        assert_eq!(d.to_json(&[6, 0]).unwrap(), b"[null,null,null]");
        let block = [0x80, 0x80, 0x40]; // 2^19 items, zigzag
        let mut blocks: Vec<u8> = block.repeat(2);
        blocks.push(0);
        assert!(d.to_json(&blocks).is_ok(), "2^20 items in all");
        let mut blocks: Vec<u8> = block.repeat(4);
        blocks.push(0);
        let e = d.to_json(&blocks).unwrap_err();
        assert!(e.contains("more items than"), "{e}");
        // A decimal of a megabyte.
        let d = AvroDecoder::parse(
            r#"{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}"#,
            Temporal::EpochMillis,
        )
        .unwrap();
        let mut big = vec![0x80, 0x80, 0x80, 0x01]; // length 2^21, zigzag
        big.extend(vec![1u8; 1 << 20]);
        assert!(d.to_json(&big).unwrap_err().contains("decimal"));
    }

    #[test]
    fn a_fixed_uuid_is_its_text_and_timestamps_reach_year_9999() {
        let d = AvroDecoder::parse(
            r#"{"type":"fixed","name":"Id","size":16,"logicalType":"uuid"}"#,
            Temporal::EpochMillis,
        )
        .unwrap();
        let bytes: Vec<u8> = (0u8..16).collect();
        assert_eq!(
            d.to_json(&bytes).unwrap(),
            br#""00010203-0405-0607-0809-0a0b0c0d0e0f""#
        );
        let d = AvroDecoder::parse(
            r#"{"type":"string","logicalType":"uuid"}"#,
            Temporal::EpochMillis,
        )
        .unwrap();
        let text = "6ba7b810-9dad-11d1-80b4-00c04fd430c8";
        let mut datum = vec![(text.len() * 2) as u8];
        datum.extend_from_slice(text.as_bytes());
        assert_eq!(d.to_json(&datum).unwrap(), format!("\"{text}\"").as_bytes());
        // 9999-12-31T23:59:59.999 in milliseconds and microseconds.
        let never = decode(
            r#"{"type":"long","logicalType":"timestamp-millis"}"#,
            Value::TimestampMillis(253_402_300_799_999),
            Temporal::Iso8601,
        );
        assert_eq!(never, json!("9999-12-31T23:59:59.999Z"));
        let never = decode(
            r#"{"type":"long","logicalType":"timestamp-micros"}"#,
            Value::TimestampMicros(253_402_300_799_999_999),
            Temporal::Iso8601,
        );
        assert_eq!(never, json!("9999-12-31T23:59:59.999999Z"));
    }

    /// Debezium's semantic types as Confluent's AvroConverter names them
    /// (`connect.name`): each written the one way `debezium_types` says, under either
    /// `temporal`.
    #[test]
    fn debezium_semantic_types_are_decoded() {
        let vsd = r#"{"type":"record","name":"VariableScaleDecimal","namespace":"io.debezium.data",
            "fields":[{"name":"scale","type":"int"},{"name":"value","type":"bytes"}],
            "connect.name":"io.debezium.data.VariableScaleDecimal"}"#;
        let named = |ty: &str, name: &str| {
            format!(r#"{{"type":"{ty}","connect.version":1,"connect.name":"io.debezium.{name}"}}"#)
        };
        let decimal = |scale: i32, bytes: &[u8]| {
            Value::Record(vec![
                ("scale".into(), Value::Int(scale)),
                ("value".into(), Value::Bytes(bytes.to_vec())),
            ])
        };
        let cases: Vec<(String, Value, &str)> = vec![
            (
                named("int", "time.Date"),
                Value::Int(19_844),
                r#""2024-05-01""#,
            ),
            (named("int", "time.Date"), Value::Int(-1), r#""1969-12-31""#),
            (
                named("int", "time.Time"),
                Value::Int(45_296_789),
                r#""12:34:56.789""#,
            ),
            (
                named("long", "time.MicroTime"),
                Value::Long(45_296_789_012),
                r#""12:34:56.789012""#,
            ),
            (
                named("long", "time.NanoTime"),
                Value::Long(45_296_789_012_345),
                r#""12:34:56.789012345""#,
            ),
            (
                named("long", "time.Timestamp"),
                Value::Long(-1),
                r#""1969-12-31T23:59:59.999""#,
            ),
            (
                named("long", "time.MicroTimestamp"),
                Value::Long(1_714_566_896_789_012),
                r#""2024-05-01T12:34:56.789012""#,
            ),
            (
                named("long", "time.MicroTimestamp"),
                Value::Long(-1_000_001),
                r#""1969-12-31T23:59:58.999999""#,
            ),
            (
                named("long", "time.NanoTimestamp"),
                Value::Long(-1),
                r#""1969-12-31T23:59:59.999999999""#,
            ),
            (
                named("string", "time.ZonedTimestamp"),
                Value::String("2024-05-01T12:00:00Z".into()),
                r#""2024-05-01T12:00:00Z""#,
            ),
            (named("int", "time.Year"), Value::Int(2024), "2024"),
            (vsd.to_string(), decimal(2, &[0x04, 0xce]), "12.30"),
            (vsd.to_string(), decimal(2, &[0xfb, 0x32]), "-12.30"),
            // In a union, an array and a map.
            (
                format!(r#"["null",{}]"#, named("long", "time.MicroTimestamp")),
                Value::Union(1, Box::new(Value::Long(0))),
                r#""1970-01-01T00:00:00.000000""#,
            ),
            (
                format!(
                    r#"{{"type":"array","items":{}}}"#,
                    named("int", "time.Date")
                ),
                Value::Array(vec![Value::Int(19_844), Value::Int(0)]),
                r#"["2024-05-01","1970-01-01"]"#,
            ),
            (
                format!(
                    r#"{{"type":"map","values":["null",{}]}}"#,
                    named("int", "time.Date")
                ),
                Value::Map(
                    [(
                        "a".to_string(),
                        Value::Union(1, Box::new(Value::Int(19_844))),
                    )]
                    .into_iter()
                    .collect(),
                ),
                r#"{"a":"2024-05-01"}"#,
            ),
            // A plain long is a number.
            (r#""long""#.into(), Value::Long(19_844), "19844"),
        ];
        for (ty, value, want) in cases {
            let schema = format!(
                r#"{{"type":"record","name":"Value","namespace":"db.inventory.orders","fields":[{{"name":"v","type":{ty}}}]}}"#
            );
            for temporal in [Temporal::EpochMillis, Temporal::Iso8601] {
                let d = AvroDecoder::parse(&schema, temporal).unwrap();
                let datum = apache_avro::to_avro_datum(
                    &d.schema,
                    Value::Record(vec![("v".into(), value.clone())]),
                )
                .unwrap();
                let got = String::from_utf8(d.to_json(&datum).unwrap()).unwrap();
                assert_eq!(got, format!(r#"{{"v":{want}}}"#), "{ty}");
            }
        }
        // A record defined once and referred to by name keeps its fields' types; the
        // top-level schema may be one itself.
        let schema = format!(
            r#"{{"type":"record","name":"Row","fields":[
                {{"name":"a","type":{{"type":"record","name":"Inner","fields":[{{"name":"d","type":{}}}]}}}},
                {{"name":"b","type":"Inner"}}]}}"#,
            named("int", "time.Date")
        );
        let d = AvroDecoder::parse(&schema, Temporal::EpochMillis).unwrap();
        let inner = |n| Value::Record(vec![("d".into(), Value::Int(n))]);
        let datum = apache_avro::to_avro_datum(
            &d.schema,
            Value::Record(vec![("a".into(), inner(0)), ("b".into(), inner(19_844))]),
        )
        .unwrap();
        assert_eq!(
            d.to_json(&datum).unwrap(),
            br#"{"a":{"d":"1970-01-01"},"b":{"d":"2024-05-01"}}"#
        );
        let d = AvroDecoder::parse(&named("int", "time.Date"), Temporal::EpochMillis).unwrap();
        assert_eq!(d.to_json(&[0x88, 0xb6, 0x02]).unwrap(), br#""2024-05-01""#);
        // A time of day out of the day is the record's error.
        let d =
            AvroDecoder::parse(&named("long", "time.MicroTime"), Temporal::EpochMillis).unwrap();
        let e = d.to_json(&[0x01]).unwrap_err();
        assert!(
            e.contains("io.debezium.time.MicroTime") && e.contains("byte 0"),
            "{e}"
        );
    }

    #[test]
    fn a_float_is_written_with_its_own_shortest_digits() {
        let d = AvroDecoder::parse(r#""float""#, Temporal::EpochMillis).unwrap();
        assert_eq!(d.to_json(&0.1f32.to_le_bytes()).unwrap(), b"0.1");
        assert_eq!(d.to_json(&f32::NAN.to_le_bytes()).unwrap(), br#""NaN""#);
    }
}
