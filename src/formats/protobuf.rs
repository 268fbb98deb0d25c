//! The `protobuf` format: Protobuf messages decoded to JSON by Protobuf's JSON mapping,
//! with the choices an Elasticsearch mapping needs:
//!
//! | Protobuf | JSON |
//! |---|---|
//! | message | an object: every field under its name in the `.proto`, in field order; an unset field takes its default (`0`, `""`, `false`, `[]`, `{}`), an unset message, `optional` field or wrapper is `null`, an unset `oneof` member is left out |
//! | `int64`, `uint64`, `sint64`, `fixed64`, ... | a number (not a string) |
//! | `float`, `double` | a number; NaN and the infinities as `"NaN"`, `"Infinity"`, `"-Infinity"` |
//! | enum | its value's name (its number when the schema does not name it) |
//! | `bytes` | base64 |
//! | `map<K, V>` | an object, keys as strings, sorted |
//! | `google.protobuf.Timestamp` | epoch milliseconds (floor), or RFC 3339 in UTC with `temporal = "iso8601"` |
//! | `google.protobuf.Duration` | `"1.5s"` (Protobuf's JSON form) |
//! | wrappers (`Int64Value`, `StringValue`, ...) | the wrapped value |
//! | `Struct`, `Value`, `ListValue` | the JSON they hold |
//! | `google.type.Date` | `YYYY-MM-DD` (`YYYY`, `YYYY-MM` or `--MM-DD` when partial; `null` when empty) |
//! | `confluent.type.Decimal` | a number with exactly its digits and scale |
//! | a message named `VariableScaleDecimal` of an `int32 scale` and `bytes value` (Debezium's `io.debezium.data.VariableScaleDecimal`) | a number with exactly its digits and scale |
//!
//! Debezium's temporal types (`io.debezium.time.Date`, `MicroTimestamp`, ...) cannot be
//! known here: Confluent's ProtobufConverter writes a Connect schema's name into the
//! Protobuf schema only for its own logical types and for structs (as the message's
//! name), so such a field is a plain `int32` or `int64` and is written as the number.
//!
//! With a Schema Registry, a value's frame names its writer schema and, by message
//! indexes, the message of that schema's file it holds. The schema is a `.proto` text
//! (as Confluent's registry serves it) or a base64 `FileDescriptorProto` (as some
//! serializers register it); its references are the files it imports, and the files
//! Confluent's serializers do not register (`google/protobuf/*`, `google/type/*`,
//! `confluent/type/decimal.proto`, `confluent/meta.proto`) are built in. Without a
//! registry, `schema_file` (a `.proto` whose imports resolve beside it) and `message`
//! name the message of every unframed value.

use super::avro::Temporal;
use super::confluent;
use super::json_out::{base64, decimal, float, float32, number, string};
use super::registry::{RegistryClient, ResolvedSchema, SchemaType};
use super::schemas::{Codec, SchemaDecoder};
use super::{Decoder, Format, Output};
use base64::Engine as _;
use prost_reflect::prost::Message as _;
use prost_reflect::prost_types;
use prost_reflect::{
    DescriptorPool, DynamicMessage, FieldDescriptor, Kind, MapKey, MessageDescriptor,
    ReflectMessage, Value,
};
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};
use std::collections::HashMap;
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;

/// Files that schemas import without registering them as references (Confluent's
/// serializers skip `confluent/`, `google/protobuf/` and `google/type/` imports): the
/// `google/type` files as Google publishes them, and Confluent's.
const BUILT_IN: &[(&str, &str)] = &[
    (
        "confluent/type/decimal.proto",
        include_str!("proto/confluent/type/decimal.proto"),
    ),
    (
        "confluent/meta.proto",
        include_str!("proto/confluent/meta.proto"),
    ),
    (
        "google/type/calendar_period.proto",
        include_str!("proto/google/type/calendar_period.proto"),
    ),
    (
        "google/type/color.proto",
        include_str!("proto/google/type/color.proto"),
    ),
    (
        "google/type/date.proto",
        include_str!("proto/google/type/date.proto"),
    ),
    (
        "google/type/datetime.proto",
        include_str!("proto/google/type/datetime.proto"),
    ),
    (
        "google/type/dayofweek.proto",
        include_str!("proto/google/type/dayofweek.proto"),
    ),
    (
        "google/type/decimal.proto",
        include_str!("proto/google/type/decimal.proto"),
    ),
    (
        "google/type/expr.proto",
        include_str!("proto/google/type/expr.proto"),
    ),
    (
        "google/type/fraction.proto",
        include_str!("proto/google/type/fraction.proto"),
    ),
    (
        "google/type/interval.proto",
        include_str!("proto/google/type/interval.proto"),
    ),
    (
        "google/type/latlng.proto",
        include_str!("proto/google/type/latlng.proto"),
    ),
    (
        "google/type/localized_text.proto",
        include_str!("proto/google/type/localized_text.proto"),
    ),
    (
        "google/type/money.proto",
        include_str!("proto/google/type/money.proto"),
    ),
    (
        "google/type/month.proto",
        include_str!("proto/google/type/month.proto"),
    ),
    (
        "google/type/phone_number.proto",
        include_str!("proto/google/type/phone_number.proto"),
    ),
    (
        "google/type/postal_address.proto",
        include_str!("proto/google/type/postal_address.proto"),
    ),
    (
        "google/type/quaternion.proto",
        include_str!("proto/google/type/quaternion.proto"),
    ),
    (
        "google/type/timeofday.proto",
        include_str!("proto/google/type/timeofday.proto"),
    ),
];

/// Files by name: a schema's references and the built-in ones.
struct Named(HashMap<String, String>);

impl FileResolver for Named {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        let text = self
            .0
            .get(name)
            .map(String::as_str)
            .or_else(|| BUILT_IN.iter().find(|(n, _)| *n == name).map(|(_, t)| *t))
            .ok_or_else(|| protox::Error::file_not_found(name))?;
        match descriptor(text) {
            Some(proto) => Ok(File::from_file_descriptor_proto(proto)),
            None => File::from_source(name, text),
        }
    }
}

/// A schema given as a base64 `FileDescriptorProto` rather than `.proto` text.
fn descriptor(text: &str) -> Option<prost_types::FileDescriptorProto> {
    let t = text.trim();
    if t.is_empty() || t.contains(char::is_whitespace) || t.contains(';') {
        return None;
    }
    let bytes = base64::engine::general_purpose::STANDARD.decode(t).ok()?;
    prost_types::FileDescriptorProto::decode(bytes.as_slice()).ok()
}

/// Compiles the file `main` (named `name` unless it is a descriptor that names itself)
/// with the files it imports; returns the pool and the file's name in it.
fn compile(
    name: &str,
    main: &str,
    imports: HashMap<String, String>,
) -> Result<(DescriptorPool, String), String> {
    // The compiler files a descriptor under the name it asked for, and the pool under
    // the descriptor's own: they must agree.
    let name = match descriptor(main) {
        Some(d) if !d.name().is_empty() => d.name().to_string(),
        _ => name.to_string(),
    };
    let mut files = imports;
    files.insert(name.clone(), main.to_string());
    let mut chain = ChainFileResolver::new();
    chain.add(Named(files));
    chain.add(GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(chain);
    compiler.include_imports(true);
    compiler
        .open_file(&name)
        .map_err(|e| format!("the .proto does not compile: {e}"))?;
    Ok((compiler.descriptor_pool(), name))
}

/// A compiled schema: its file's messages.
#[derive(Debug)]
pub struct ProtoSchema {
    pool: DescriptorPool,
    file: String,
    /// The message of unframed values (`message`); framed ones name theirs.
    fixed: Option<MessageDescriptor>,
}

impl ProtoSchema {
    /// The message at the index path `indexes` of the file (`[0]`: its first message).
    fn message(&self, indexes: &[u32]) -> Result<MessageDescriptor, String> {
        let file = self
            .pool
            .get_file_by_name(&self.file)
            .ok_or_else(|| format!("the schema's file {} is gone", self.file))?;
        let (first, rest) = indexes.split_first().ok_or("an empty message-index path")?;
        // Confluent's indexes count the messages a .proto declares: the entry types
        // that map fields get are not among them.
        let mut m = file
            .messages()
            .filter(|m| !m.is_map_entry())
            .nth(*first as usize)
            .ok_or_else(|| format!("message index {first}: the schema has no such message"))?;
        for i in rest {
            let child = m
                .child_messages()
                .filter(|c| !c.is_map_entry())
                .nth(*i as usize)
                .ok_or_else(|| {
                    format!(
                        "message index {i} within {}: no such message",
                        m.full_name()
                    )
                })?;
            m = child;
        }
        Ok(m)
    }
}

/// How Protobuf schemas compile and messages decode.
#[derive(Debug)]
pub struct ProtobufCodec {
    temporal: Temporal,
}

impl Codec for ProtobufCodec {
    type Compiled = ProtoSchema;
    const SCHEMA_TYPE: SchemaType = SchemaType::Protobuf;
    const NAME: &'static str = "protobuf";

    fn compile(&self, s: &ResolvedSchema) -> Result<ProtoSchema, String> {
        let imports = s
            .references
            .iter()
            .map(|(name, r)| (name.clone(), r.schema.clone()))
            .collect();
        let (pool, file) = compile(
            &format!("schema-{}.proto", s.schema.id),
            &s.schema.schema,
            imports,
        )?;
        Ok(ProtoSchema {
            pool,
            file,
            fixed: None,
        })
    }

    fn decode(&self, schema: &ProtoSchema, body: &[u8], framed: bool) -> Result<Vec<u8>, String> {
        let (message, body) = match (&schema.fixed, framed) {
            (Some(m), false) => (m.clone(), body),
            _ => {
                let (indexes, rest) = confluent::message_indexes(body)?;
                (schema.message(&indexes)?, rest)
            }
        };
        let m = DynamicMessage::decode(message.clone(), body)
            .map_err(|e| format!("not a {} message: {e}", message.full_name()))?;
        let mut out = Vec::with_capacity(body.len() * 2 + 16);
        Writer::new(self.temporal).message(&m, &mut out)?;
        Ok(out)
    }
}

/// Writes messages as JSON by the module's table.
struct Writer {
    temporal: Temporal,
    /// How deep the JSON being written nests.
    depth: std::cell::Cell<u32>,
}

impl Writer {
    fn new(temporal: Temporal) -> Writer {
        Writer {
            temporal,
            depth: std::cell::Cell::new(0),
        }
    }

    /// Runs `write` one JSON level deeper; past [`super::json::MAX_DEPTH`] levels
    /// (a recursive message nests two per message with a repeated field) it is the
    /// record's error.
    fn nested(&self, write: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
        let depth = self.depth.get() + 1;
        if depth > super::json::MAX_DEPTH {
            return Err(format!(
                "the message nests deeper than {}",
                super::json::MAX_DEPTH
            ));
        }
        self.depth.set(depth);
        let written = write();
        self.depth.set(depth - 1);
        written
    }

    fn message(&self, m: &DynamicMessage, out: &mut Vec<u8>) -> Result<(), String> {
        self.nested(|| self.message_fields(m, out))
    }

    fn message_fields(&self, m: &DynamicMessage, out: &mut Vec<u8>) -> Result<(), String> {
        let desc = m.descriptor();
        match desc.full_name() {
            "google.protobuf.Timestamp" => return self.timestamp(m, out),
            "google.protobuf.Duration" => {
                let (s, n) = seconds_nanos(m);
                let sign = if s < 0 || n < 0 { "-" } else { "" };
                let (s, n) = (s.unsigned_abs(), n.unsigned_abs());
                let frac = match n {
                    0 => String::new(),
                    n if n % 1_000_000 == 0 => format!(".{:03}", n / 1_000_000),
                    n if n % 1_000 == 0 => format!(".{:06}", n / 1_000),
                    n => format!(".{n:09}"),
                };
                string(out, &format!("{sign}{s}{frac}s"));
                return Ok(());
            }
            "google.protobuf.DoubleValue"
            | "google.protobuf.FloatValue"
            | "google.protobuf.Int64Value"
            | "google.protobuf.UInt64Value"
            | "google.protobuf.Int32Value"
            | "google.protobuf.UInt32Value"
            | "google.protobuf.BoolValue"
            | "google.protobuf.StringValue"
            | "google.protobuf.BytesValue" => {
                let f = desc.get_field(1).ok_or("a wrapper without its value")?;
                return self.value(&f, &m.get_field(&f), out);
            }
            "google.protobuf.Struct" => {
                let f = desc.get_field(1).ok_or("a Struct without fields")?;
                return self.value(&f, &m.get_field(&f), out);
            }
            "google.protobuf.ListValue" => {
                let f = desc.get_field(1).ok_or("a ListValue without values")?;
                return self.value(&f, &m.get_field(&f), out);
            }
            "google.protobuf.Value" => {
                for f in desc.fields() {
                    if m.has_field(&f) {
                        return if f.name() == "null_value" {
                            out.extend_from_slice(b"null");
                            Ok(())
                        } else {
                            self.value(&f, &m.get_field(&f), out)
                        };
                    }
                }
                out.extend_from_slice(b"null");
                return Ok(());
            }
            "google.type.Date" => {
                let get = |n: u32| match desc.get_field(n).map(|f| m.get_field(&f).into_owned()) {
                    Some(Value::I32(v)) => v,
                    _ => 0,
                };
                // A Date may leave out its year, or its month and day.
                match (get(1), get(2), get(3)) {
                    (0, 0, 0) => out.extend_from_slice(b"null"),
                    (y, 0, _) => string(out, &format!("{y:04}")),
                    (y, m, 0) => string(out, &format!("{y:04}-{m:02}")),
                    (0, m, d) => string(out, &format!("--{m:02}-{d:02}")),
                    (y, m, d) => string(out, &format!("{y:04}-{m:02}-{d:02}")),
                }
                return Ok(());
            }
            "confluent.type.Decimal" => {
                let value = desc.get_field(1).map(|f| m.get_field(&f).into_owned());
                let scale = desc.get_field(3).map(|f| m.get_field(&f).into_owned());
                match (value, scale) {
                    (Some(Value::Bytes(b)), Some(Value::I32(s))) if s >= 0 => {
                        return decimal(out, &b, s as usize);
                    }
                    _ => return Err("a confluent.type.Decimal with a negative scale".into()),
                }
            }
            _ => {}
        }
        if let Some(text) = variable_scale_decimal(m) {
            out.extend_from_slice(text?.as_bytes());
            return Ok(());
        }
        out.push(b'{');
        let mut first = true;
        for f in desc.fields() {
            let set = m.has_field(&f);
            if f.containing_oneof().is_some_and(|o| !o.is_synthetic()) && !set {
                continue;
            }
            if !std::mem::take(&mut first) {
                out.push(b',');
            }
            string(out, f.name());
            out.push(b':');
            if !set && f.supports_presence() {
                out.extend_from_slice(b"null");
            } else {
                self.value(&f, &m.get_field(&f), out)?;
            }
        }
        out.push(b'}');
        Ok(())
    }

    fn timestamp(&self, m: &DynamicMessage, out: &mut Vec<u8>) -> Result<(), String> {
        let (s, n) = seconds_nanos(m);
        match self.temporal {
            Temporal::EpochMillis => {
                let ms = i128::from(s) * 1000 + i128::from(n).div_euclid(1_000_000);
                number(
                    out,
                    i64::try_from(ms).map_err(|_| format!("timestamp {s} s out of range"))?,
                );
            }
            Temporal::Iso8601 => {
                let t = chrono::DateTime::from_timestamp(s, n.max(0) as u32)
                    .ok_or_else(|| format!("timestamp {s} s out of range"))?;
                string(out, &t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true));
            }
        }
        Ok(())
    }

    /// The value `v` of field `f` (a list, a map, or one value).
    fn value(&self, f: &FieldDescriptor, v: &Value, out: &mut Vec<u8>) -> Result<(), String> {
        match v {
            Value::List(items) => self.nested(|| {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    self.single(&f.kind(), item, out)?;
                }
                out.push(b']');
                Ok(())
            })?,
            Value::Map(entries) => self.nested(|| {
                let value_kind = match f.kind() {
                    Kind::Message(entry) => entry.map_entry_value_field().kind(),
                    _ => return Err(format!("map field {} without an entry type", f.name())),
                };
                let mut keyed: Vec<(String, &Value)> =
                    entries.iter().map(|(k, v)| (map_key(k), v)).collect();
                keyed.sort_by(|a, b| a.0.cmp(&b.0));
                out.push(b'{');
                for (i, (k, v)) in keyed.into_iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    string(out, &k);
                    out.push(b':');
                    self.single(&value_kind, v, out)?;
                }
                out.push(b'}');
                Ok(())
            })?,
            v => self.single(&f.kind(), v, out)?,
        }
        Ok(())
    }

    /// One value of kind `kind`.
    fn single(&self, kind: &Kind, v: &Value, out: &mut Vec<u8>) -> Result<(), String> {
        match v {
            Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
            Value::I32(n) => number(out, i64::from(*n)),
            Value::I64(n) => number(out, *n),
            Value::U32(n) => number(out, i64::from(*n)),
            Value::U64(n) => {
                let _ = write!(out, "{n}");
            }
            Value::F32(x) => float32(out, *x),
            Value::F64(x) => float(out, *x),
            Value::String(s) => string(out, s),
            Value::Bytes(b) => base64(out, b),
            Value::EnumNumber(n) => match kind {
                Kind::Enum(e) if e.full_name() == "google.protobuf.NullValue" => {
                    out.extend_from_slice(b"null")
                }
                Kind::Enum(e) => match e.get_value(*n) {
                    Some(ev) => string(out, ev.name()),
                    None => number(out, i64::from(*n)),
                },
                _ => number(out, i64::from(*n)),
            },
            Value::Message(m) => self.message(m, out)?,
            Value::List(_) | Value::Map(_) => {
                return Err("a list or map nested without a field".into())
            }
        }
        Ok(())
    }
}

/// Debezium's `VariableScaleDecimal` as Confluent's ProtobufConverter writes it: a
/// message named by the struct's name without its namespace, `VariableScaleDecimal`, of
/// an `int32 scale` and the unscaled `bytes value`; its exact digits. None for any
/// other message.
fn variable_scale_decimal(m: &DynamicMessage) -> Option<Result<String, String>> {
    let desc = m.descriptor();
    if desc.name() != "VariableScaleDecimal" || desc.fields().len() != 2 {
        return None;
    }
    let scale = desc
        .get_field_by_name("scale")
        .filter(|f| matches!(f.kind(), Kind::Int32) && !f.is_list())?;
    let value = desc
        .get_field_by_name("value")
        .filter(|f| matches!(f.kind(), Kind::Bytes) && !f.is_list())?;
    let (Value::I32(scale), Value::Bytes(unscaled)) = (
        m.get_field(&scale).into_owned(),
        m.get_field(&value).into_owned(),
    ) else {
        return None;
    };
    Some(super::debezium_types::variable_scale_decimal(
        i64::from(scale),
        &unscaled,
    ))
}

fn seconds_nanos(m: &DynamicMessage) -> (i64, i32) {
    let s = match m.get_field_by_number(1).map(|v| v.into_owned()) {
        Some(Value::I64(s)) => s,
        _ => 0,
    };
    let n = match m.get_field_by_number(2).map(|v| v.into_owned()) {
        Some(Value::I32(n)) => n,
        _ => 0,
    };
    (s, n)
}

fn map_key(k: &MapKey) -> String {
    match k {
        MapKey::Bool(b) => b.to_string(),
        MapKey::I32(n) => n.to_string(),
        MapKey::I64(n) => n.to_string(),
        MapKey::U32(n) => n.to_string(),
        MapKey::U64(n) => n.to_string(),
        MapKey::String(s) => s.clone(),
    }
}

/// The `protobuf` format as a job file configured it.
#[derive(Debug)]
pub struct ProtobufFormat {
    codec: Arc<ProtobufCodec>,
    registry: Option<Arc<RegistryClient>>,
    fixed: Option<Arc<ProtoSchema>>,
}

impl ProtobufFormat {
    /// Framed values, their schemas from `registry`.
    pub fn framed(temporal: Temporal, registry: Arc<RegistryClient>) -> ProtobufFormat {
        ProtobufFormat {
            codec: Arc::new(ProtobufCodec { temporal }),
            registry: Some(registry),
            fixed: None,
        }
    }

    /// Unframed values, each a `message` of the `.proto` file at `path` (its imports
    /// resolved beside it).
    pub fn fixed(
        temporal: Temporal,
        path: &Path,
        message: &str,
    ) -> Result<ProtobufFormat, (&'static str, String)> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let name = path.file_name().and_then(|n| n.to_str()).ok_or((
            "schema_file",
            format!("{} is not a file name", path.display()),
        ))?;
        let mut chain = ChainFileResolver::new();
        chain.add(protox::file::IncludeFileResolver::new(dir.to_path_buf()));
        chain.add(Named(HashMap::new()));
        chain.add(GoogleFileResolver::new());
        let mut compiler = protox::Compiler::with_file_resolver(chain);
        compiler.include_imports(true);
        compiler
            .open_file(name)
            .map_err(|e| ("schema_file", format!("{}: {e}", path.display())))?;
        let pool = compiler.descriptor_pool();
        let m = pool.get_message_by_name(message).ok_or_else(|| {
            let known: Vec<String> = pool
                .all_messages()
                .map(|m| m.full_name().to_string())
                .collect();
            (
                "message",
                format!(
                    "`{message}` is not a message of {} (it has {})",
                    path.display(),
                    known.join(", ")
                ),
            )
        })?;
        Ok(ProtobufFormat {
            codec: Arc::new(ProtobufCodec { temporal }),
            registry: None,
            fixed: Some(Arc::new(ProtoSchema {
                file: name.to_string(),
                pool,
                fixed: Some(m),
            })),
        })
    }
}

impl Format for ProtobufFormat {
    fn name(&self) -> &'static str {
        "protobuf"
    }

    fn output(&self) -> Output {
        Output::Json
    }

    fn decoder(&self) -> Box<dyn Decoder> {
        match &self.fixed {
            Some(s) => Box::new(SchemaDecoder::fixed(self.codec.clone(), s.clone())),
            None => Box::new(SchemaDecoder::framed(self.codec.clone())),
        }
    }

    fn registry(&self) -> Option<&Arc<RegistryClient>> {
        self.registry.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::registry::RegisteredSchema;

    const ADDRESS: &str = "syntax = \"proto3\";\npackage shop;\nmessage Address { string city = 1; int32 zip = 2; }\n";
    const ORDER: &str = r#"syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/struct.proto";
import "confluent/type/decimal.proto";
import "shop/address.proto";
message Key { string id = 1; }
message Order {
  enum Status { NEW = 0; PAID = 1; }
  message Line { string sku = 1; uint64 qty = 2; }
  int64 id = 1;
  confluent.type.Decimal amount = 2;
  google.protobuf.Timestamp ts = 3;
  google.protobuf.StringValue note = 4;
  Status status = 5;
  shop.Address address = 6;
  repeated Line lines = 7;
  map<string, int64> attrs = 8;
  bytes raw = 9;
  oneof pay { string card = 10; string iban = 11; }
  optional double score = 12;
  google.protobuf.Struct extra = 13;
  Line first = 14;
}
"#;

    fn schema() -> ResolvedSchema {
        let registered = |id, schema: &str| {
            Arc::new(RegisteredSchema {
                id,
                schema: schema.into(),
                schema_type: SchemaType::Protobuf,
                references: vec![],
            })
        };
        ResolvedSchema {
            schema: registered(7, ORDER),
            references: vec![("shop/address.proto".into(), registered(6, ADDRESS))],
        }
    }

    /// Order 5, encoded, behind the message indexes of `Order` (the file's second
    /// message).
    fn order_body(pool: &DescriptorPool) -> Vec<u8> {
        let order = pool.get_message_by_name("shop.Order").unwrap();
        let msg = |name: &str| DynamicMessage::new(pool.get_message_by_name(name).unwrap());
        let mut m = DynamicMessage::new(order.clone());
        m.set_field_by_name("id", Value::I64(9_007_199_254_740_993));
        let mut amount = msg("confluent.type.Decimal");
        amount.set_field_by_name(
            "value",
            Value::Bytes(509461i32.to_be_bytes().to_vec().into()),
        );
        amount.set_field_by_name("scale", Value::I32(2));
        m.set_field_by_name("amount", Value::Message(amount));
        let mut ts = msg("google.protobuf.Timestamp");
        ts.set_field_by_name("seconds", Value::I64(1_700_000_000));
        ts.set_field_by_name("nanos", Value::I32(123_456_789));
        m.set_field_by_name("ts", Value::Message(ts));
        m.set_field_by_name("status", Value::EnumNumber(1));
        let mut address = msg("shop.Address");
        address.set_field_by_name("city", Value::String("Lyon".into()));
        m.set_field_by_name("address", Value::Message(address));
        let mut line = msg("shop.Order.Line");
        line.set_field_by_name("sku", Value::String("a".into()));
        line.set_field_by_name("qty", Value::U64(u64::MAX));
        m.set_field_by_name("lines", Value::List(vec![Value::Message(line)]));
        let mut attrs = HashMap::new();
        attrs.insert(MapKey::String("z".into()), Value::I64(-1));
        attrs.insert(MapKey::String("a".into()), Value::I64(2));
        m.set_field_by_name("attrs", Value::Map(attrs));
        m.set_field_by_name("raw", Value::Bytes(vec![0xff, 0].into()));
        m.set_field_by_name("iban", Value::String("FR76".into()));
        let mut body = vec![2, 2]; // one index: 1 (zigzag), the second message
        body.extend(m.encode_to_vec());
        body
    }

    #[test]
    fn a_message_is_written_by_the_documented_mapping() {
        let codec = ProtobufCodec {
            temporal: Temporal::EpochMillis,
        };
        let compiled = codec.compile(&schema()).unwrap();
        let body = order_body(&compiled.pool);
        let json = String::from_utf8(codec.decode(&compiled, &body, true).unwrap()).unwrap();
        assert_eq!(
            json,
            concat!(
                r#"{"id":9007199254740993,"amount":5094.61,"ts":1700000000123,"note":null,"#,
                r#""status":"PAID","address":{"city":"Lyon","zip":0},"#,
                r#""lines":[{"sku":"a","qty":18446744073709551615}],"attrs":{"a":2,"z":-1},"#,
                r#""raw":"/wA=","iban":"FR76","score":null,"extra":null,"first":null}"#
            )
        );
        let iso = ProtobufCodec {
            temporal: Temporal::Iso8601,
        };
        let json = String::from_utf8(iso.decode(&compiled, &body, true).unwrap()).unwrap();
        assert!(
            json.contains(r#""ts":"2023-11-14T22:13:20.123456789Z""#),
            "{json}"
        );
    }

    #[test]
    fn the_message_indexes_pick_the_message_and_bad_bodies_say_why() {
        let codec = ProtobufCodec {
            temporal: Temporal::EpochMillis,
        };
        let compiled = codec.compile(&schema()).unwrap();
        // [0]: the first message, Key.
        let mut key = DynamicMessage::new(compiled.pool.get_message_by_name("shop.Key").unwrap());
        key.set_field_by_name("id", Value::String("order-5".into()));
        let mut body = vec![0];
        body.extend(key.encode_to_vec());
        assert_eq!(
            codec.decode(&compiled, &body, true).unwrap(),
            br#"{"id":"order-5"}"#
        );
        // [1, 0]: Order's first nested message, Line.
        assert_eq!(
            codec.decode(&compiled, &[4, 2, 0], true).unwrap(),
            br#"{"sku":"","qty":0}"#
        );
        for (bad, says) in [
            (&[2u8, 8][..], "message index 4"),
            (&[2, 2, 0xff][..], "not a shop.Order message"),
            (&[3][..], "message-index count"),
        ] {
            let e = codec.decode(&compiled, bad, true).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        // A schema whose import is not among its references does not compile.
        let mut missing = schema();
        missing.references.clear();
        let e = codec.compile(&missing).unwrap_err();
        assert!(e.contains("shop/address.proto"), "{e}");
    }

    #[test]
    fn a_schema_registered_as_a_descriptor_compiles_too() {
        let codec = ProtobufCodec {
            temporal: Temporal::EpochMillis,
        };
        let text = codec.compile(&schema()).unwrap();
        let file = text.pool.get_file_by_name(&text.file).unwrap();
        let mut proto = file.file_descriptor_proto().clone();
        proto.name = Some("shop/order.proto".into());
        let mut as_descriptor = schema();
        as_descriptor.schema = Arc::new(RegisteredSchema {
            schema: base64::engine::general_purpose::STANDARD.encode(proto.encode_to_vec()),
            ..(*as_descriptor.schema).clone()
        });
        let compiled = codec.compile(&as_descriptor).unwrap();
        let body = order_body(&compiled.pool);
        assert_eq!(
            codec.decode(&compiled, &body, true).unwrap(),
            codec.decode(&text, &body, true).unwrap()
        );
    }

    #[test]
    fn a_fixed_schema_file_and_message_decode_unframed_values() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("shop")).unwrap();
        std::fs::write(dir.path().join("shop/address.proto"), ADDRESS).unwrap();
        std::fs::write(dir.path().join("order.proto"), ORDER).unwrap();
        let path = dir.path().join("order.proto");
        let f = ProtobufFormat::fixed(Temporal::EpochMillis, &path, "shop.Key").unwrap();
        let mut key = DynamicMessage::new(
            f.fixed
                .as_ref()
                .unwrap()
                .pool
                .get_message_by_name("shop.Key")
                .unwrap(),
        );
        key.set_field_by_name("id", Value::String("k".into()));
        let mut d = f.decoder();
        assert_eq!(
            d.decode(&key.encode_to_vec()),
            Ok(crate::formats::Decoded::Replaced(br#"{"id":"k"}"#.to_vec()))
        );
        let e = ProtobufFormat::fixed(Temporal::EpochMillis, &path, "shop.Nope").unwrap_err();
        assert_eq!(e.0, "message");
        assert!(e.1.contains("shop.Order"), "{}", e.1);
        let e = ProtobufFormat::fixed(Temporal::EpochMillis, &dir.path().join("no.proto"), "a.B")
            .unwrap_err();
        assert_eq!(e.0, "schema_file");
    }

    /// Confluent's message indexes count declared messages: the entry type of a map
    /// field before a nested message does not shift its index.
    #[test]
    fn message_indexes_do_not_count_map_entries() {
        let text = "syntax = \"proto3\";\npackage p;\nmessage Outer {\n  map<string, string> tags = 1;\n  message Inner { string a = 1; }\n}\n";
        let schema = ResolvedSchema {
            schema: Arc::new(RegisteredSchema {
                id: 1,
                schema: text.into(),
                schema_type: SchemaType::Protobuf,
                references: vec![],
            }),
            references: vec![],
        };
        let codec = ProtobufCodec {
            temporal: Temporal::EpochMillis,
        };
        let compiled = codec.compile(&schema).unwrap();
        let mut inner =
            DynamicMessage::new(compiled.pool.get_message_by_name("p.Outer.Inner").unwrap());
        inner.set_field_by_name("a", Value::String("x".into()));
        // [0, 0]: Outer's first declared message.
        let mut body = vec![4, 0, 0];
        body.extend(inner.encode_to_vec());
        assert_eq!(
            codec.decode(&compiled, &body, true).unwrap(),
            br#"{"a":"x"}"#
        );
    }

    /// Debezium's VariableScaleDecimal as Confluent's ProtobufConverter writes it (a
    /// nested message of the struct's short name) is its exact digits; its temporal
    /// types are plain integers in Protobuf and stay numbers.
    #[test]
    fn a_variable_scale_decimal_message_is_its_digits() {
        let text = "syntax = \"proto3\";\npackage db.inventory.orders;\nmessage Value {\n  int32 day = 1;\n  VariableScaleDecimal amount = 2;\n  message VariableScaleDecimal {\n    int32 scale = 1;\n    bytes value = 2;\n  }\n}\n";
        let schema = ResolvedSchema {
            schema: Arc::new(RegisteredSchema {
                id: 1,
                schema: text.into(),
                schema_type: SchemaType::Protobuf,
                references: vec![],
            }),
            references: vec![],
        };
        let codec = ProtobufCodec {
            temporal: Temporal::Iso8601,
        };
        let compiled = codec.compile(&schema).unwrap();
        let message = |scale: i32, bytes: &[u8]| {
            let pool = &compiled.pool;
            let mut amount = DynamicMessage::new(
                pool.get_message_by_name("db.inventory.orders.Value.VariableScaleDecimal")
                    .unwrap(),
            );
            amount.set_field_by_name("scale", Value::I32(scale));
            amount.set_field_by_name("value", Value::Bytes(bytes.to_vec().into()));
            let mut row = DynamicMessage::new(
                pool.get_message_by_name("db.inventory.orders.Value")
                    .unwrap(),
            );
            row.set_field_by_name("day", Value::I32(19_844));
            row.set_field_by_name("amount", Value::Message(amount));
            let mut body = vec![0];
            body.extend(row.encode_to_vec());
            String::from_utf8(codec.decode(&compiled, &body, true).unwrap()).unwrap()
        };
        for (scale, bytes, want) in [
            (2, &[0x04, 0xce][..], "12.30"),
            (2, &[0xfb, 0x32][..], "-12.30"),
            (21, &[0xff][..], "-0.000000000000000000001"),
            (0, &[][..], "0"),
        ] {
            assert_eq!(
                message(scale, bytes),
                format!(r#"{{"day":19844,"amount":{want}}}"#)
            );
        }
    }

    /// Every built-in file compiles, so a schema that imports any of them does.
    #[test]
    fn every_built_in_import_compiles() {
        let imports: String = BUILT_IN
            .iter()
            .map(|(name, _)| format!("import \"{name}\";\n"))
            .collect();
        let text = format!("syntax = \"proto3\";\npackage p;\n{imports}message M {{ google.type.Money price = 1; google.type.Date day = 2; }}\n");
        let names: Vec<&str> = BUILT_IN.iter().map(|(n, _)| *n).collect();
        for want in [
            "confluent/type/decimal.proto",
            "confluent/meta.proto",
            "google/type/calendar_period.proto",
            "google/type/color.proto",
            "google/type/date.proto",
            "google/type/datetime.proto",
            "google/type/dayofweek.proto",
            "google/type/decimal.proto",
            "google/type/expr.proto",
            "google/type/fraction.proto",
            "google/type/interval.proto",
            "google/type/latlng.proto",
            "google/type/localized_text.proto",
            "google/type/money.proto",
            "google/type/month.proto",
            "google/type/phone_number.proto",
            "google/type/postal_address.proto",
            "google/type/quaternion.proto",
            "google/type/timeofday.proto",
        ] {
            assert!(names.contains(&want), "{want} is not built in");
        }
        let (pool, file) = compile("m.proto", &text, HashMap::new()).unwrap();
        assert!(pool.get_file_by_name(&file).is_some());
        assert!(pool.get_message_by_name("google.type.LatLng").is_some());
        let codec = ProtobufCodec {
            temporal: Temporal::EpochMillis,
        };
        let compiled = ProtoSchema {
            fixed: pool.get_message_by_name("p.M"),
            pool,
            file,
        };
        // An empty day is null, not "0000-00-00".
        let mut m = DynamicMessage::new(compiled.pool.get_message_by_name("p.M").unwrap());
        let day = DynamicMessage::new(
            compiled
                .pool
                .get_message_by_name("google.type.Date")
                .unwrap(),
        );
        m.set_field_by_name("day", Value::Message(day));
        let json = codec.decode(&compiled, &m.encode_to_vec(), false).unwrap();
        assert_eq!(json, br#"{"price":null,"day":null}"#);
    }

    fn fixed(text: &str, message: &str) -> (ProtobufCodec, ProtoSchema) {
        let (pool, file) = compile("t.proto", text, HashMap::new()).unwrap();
        let schema = ProtoSchema {
            fixed: pool.get_message_by_name(message),
            pool,
            file,
        };
        let codec = ProtobufCodec {
            temporal: Temporal::EpochMillis,
        };
        (codec, schema)
    }

    #[test]
    fn floats_partial_dates_and_deep_messages() {
        let (codec, schema) = fixed(
            "syntax = \"proto3\";\npackage p;\nimport \"google/type/date.proto\";\nmessage M { float f = 1; google.type.Date d = 2; repeated M c = 3; }\n",
            "p.M",
        );
        let desc = schema.fixed.clone().unwrap();
        let date = |y, m, d| {
            let mut v =
                DynamicMessage::new(schema.pool.get_message_by_name("google.type.Date").unwrap());
            v.set_field_by_name("year", Value::I32(y));
            v.set_field_by_name("month", Value::I32(m));
            v.set_field_by_name("day", Value::I32(d));
            Value::Message(v)
        };
        for (d, want) in [
            (date(2026, 5, 0), r#""2026-05""#),
            (date(2026, 0, 0), r#""2026""#),
            (date(0, 5, 17), r#""--05-17""#),
        ] {
            let mut m = DynamicMessage::new(desc.clone());
            m.set_field_by_name("f", Value::F32(0.1));
            m.set_field_by_name("d", d);
            let json = String::from_utf8(codec.decode(&schema, &m.encode_to_vec(), false).unwrap())
                .unwrap();
            assert_eq!(json, format!(r#"{{"f":0.1,"d":{want},"c":[]}}"#));
        }
        // Each level of M is an object and an array: 63 levels fit, 64 do not.
        let deep = |levels: usize| {
            let mut m = DynamicMessage::new(desc.clone());
            for _ in 1..levels {
                let mut parent = DynamicMessage::new(desc.clone());
                parent.set_field_by_name("c", Value::List(vec![Value::Message(m)]));
                m = parent;
            }
            m.encode_to_vec()
        };
        assert!(codec.decode(&schema, &deep(63), false).is_ok());
        let e = codec.decode(&schema, &deep(64), false).unwrap_err();
        assert!(e.contains("nests deeper"), "{e}");
    }
}
