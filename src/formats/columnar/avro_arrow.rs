//! An Avro record schema as the Arrow schema of the Parquet files written by it.
//!
//! The mapping follows Avro's specification and what Parquet readers expect:
//! `int`/`long`/`float`/`double`/`boolean`/`string`/`bytes` as the like Arrow types,
//! `["null", T]` as a nullable `T`, records as structs, arrays as lists, maps as maps
//! with string keys, enums as strings (their symbols kept in the field's metadata, to be checked), `fixed` as fixed-size binary, and the logical
//! types as Parquet's: `decimal` as a decimal of its precision and scale, `date` as a
//! date, `time-millis`/`time-micros` as times, `timestamp-*` as UTC-adjusted timestamps (zone `+00:00`)
//! and `local-timestamp-*` as timestamps without a zone, `uuid` as a string.
//!
//! What Parquet has no column for is refused with the field's path, never written as
//! something else: unions of two or more non-null types, `duration`, and `decimal`s
//! without a fixed scale (`big-decimal`).

use super::values::ENUM_SYMBOLS;
use apache_avro::Schema as Avro;
use arrow_schema::{DataType, Field, Fields, Schema, TimeUnit};
use std::collections::HashMap;
use std::sync::Arc;

/// The Arrow schema of the records `avro` (a record schema) describes. An error names
/// the field whose type has no Parquet column.
pub fn arrow_schema(avro: &Avro) -> Result<Schema, String> {
    let mut named = HashMap::new();
    match avro {
        Avro::Record(r) => {
            named.insert(r.name.fullname(None), None);
            let fields = record_fields(&r.fields, "", &mut named)?;
            Ok(Schema::new(fields))
        }
        other => Err(format!(
            "the schema must be a record (one column per field), not {}",
            type_name(other)
        )),
    }
}

/// Parses `text` (an Avro schema in JSON) and maps it.
pub fn arrow_schema_of_text(text: &str) -> Result<Schema, String> {
    let avro = Avro::parse_str(text).map_err(|e| format!("not an Avro schema: {e}"))?;
    arrow_schema(&avro)
}

fn record_fields(
    fields: &[apache_avro::schema::RecordField],
    path: &str,
    named: &mut HashMap<String, Option<Avro>>,
) -> Result<Fields, String> {
    fields
        .iter()
        .map(|f| {
            let at = if path.is_empty() {
                f.name.clone()
            } else {
                format!("{path}.{}", f.name)
            };
            let (data_type, nullable) = column(&f.schema, &at, named)?;
            Ok(with_symbols(
                Field::new(&f.name, data_type, nullable),
                &f.schema,
                named,
            ))
        })
        .collect::<Result<Vec<_>, String>>()
        .map(Fields::from)
}

/// The column type of `schema` at `path`, and whether it takes nulls.
fn column(
    schema: &Avro,
    path: &str,
    named: &mut HashMap<String, Option<Avro>>,
) -> Result<(DataType, bool), String> {
    let plain = |t: DataType| Ok((t, false));
    match schema {
        Avro::Null => Ok((DataType::Null, true)),
        Avro::Boolean => plain(DataType::Boolean),
        Avro::Int => plain(DataType::Int32),
        Avro::Long => plain(DataType::Int64),
        Avro::Float => plain(DataType::Float32),
        Avro::Double => plain(DataType::Float64),
        Avro::Bytes => plain(DataType::Binary),
        Avro::String | Avro::Uuid => plain(DataType::Utf8),
        Avro::Enum(e) => {
            named.insert(e.name.fullname(None), Some(schema.clone()));
            plain(DataType::Utf8)
        }
        Avro::Fixed(f) => {
            named.insert(f.name.fullname(None), Some(schema.clone()));
            let size = i32::try_from(f.size)
                .map_err(|_| format!("{path}: fixed of {} bytes is too large", f.size))?;
            plain(DataType::FixedSizeBinary(size))
        }
        Avro::Decimal(d) => {
            if let Avro::Fixed(f) = d.inner.as_ref() {
                // A named fixed under the logical type: later fields may name it.
                named.insert(f.name.fullname(None), Some(schema.clone()));
            }
            let (p, s) = (d.precision, d.scale);
            let precision = u8::try_from(p)
                .ok()
                .filter(|p| *p >= 1 && *p <= 76)
                .ok_or_else(|| format!("{path}: decimal precision {p} is outside 1..=76"))?;
            let scale = i8::try_from(s)
                .ok()
                .filter(|s| (*s as u8) <= precision)
                .ok_or_else(|| format!("{path}: decimal scale {s} exceeds its precision {p}"))?;
            if precision <= 38 {
                plain(DataType::Decimal128(precision, scale))
            } else {
                plain(DataType::Decimal256(precision, scale))
            }
        }
        Avro::BigDecimal => Err(format!(
            "{path}: a big-decimal has no fixed scale, which a Parquet decimal column needs (give it a decimal type with precision and scale)"
        )),
        Avro::Date => plain(DataType::Date32),
        Avro::TimeMillis => plain(DataType::Time32(TimeUnit::Millisecond)),
        Avro::TimeMicros => plain(DataType::Time64(TimeUnit::Microsecond)),
        Avro::TimestampMillis => plain(utc(TimeUnit::Millisecond)),
        Avro::TimestampMicros => plain(utc(TimeUnit::Microsecond)),
        Avro::TimestampNanos => plain(utc(TimeUnit::Nanosecond)),
        Avro::LocalTimestampMillis => plain(DataType::Timestamp(TimeUnit::Millisecond, None)),
        Avro::LocalTimestampMicros => plain(DataType::Timestamp(TimeUnit::Microsecond, None)),
        Avro::LocalTimestampNanos => plain(DataType::Timestamp(TimeUnit::Nanosecond, None)),
        Avro::Duration => Err(format!(
            "{path}: an Avro duration (months, days, milliseconds) has no Parquet column here"
        )),
        Avro::Array(a) => {
            let (item, nullable) = column(&a.items, &format!("{path}[]"), named)?;
            let item = with_symbols(Field::new("item", item, nullable), &a.items, named);
            plain(DataType::List(Arc::new(item)))
        }
        Avro::Map(m) => {
            let (value, nullable) = column(&m.types, &format!("{path}{{}}"), named)?;
            let entries = Field::new(
                "entries",
                DataType::Struct(Fields::from(vec![
                    Field::new("key", DataType::Utf8, false),
                    with_symbols(Field::new("value", value, nullable), &m.types, named),
                ])),
                false,
            );
            plain(DataType::Map(Arc::new(entries), false))
        }
        Avro::Record(r) => {
            // In progress (None) while its fields are mapped: a reference to it from
            // inside is a recursive type.
            let name = r.name.fullname(None);
            named.insert(name.clone(), None);
            let fields = record_fields(&r.fields, path, named)?;
            named.insert(name, Some(schema.clone()));
            plain(DataType::Struct(fields))
        }
        Avro::Union(u) => {
            let others: Vec<&Avro> = u
                .variants()
                .iter()
                .filter(|v| !matches!(v, Avro::Null))
                .collect();
            match others.as_slice() {
                [one] => column(one, path, named).map(|(t, _)| (t, true)),
                [] => Ok((DataType::Null, true)),
                _ => Err(format!(
                    "{path}: a union of {} types has no Parquet column (only [\"null\", T] does)",
                    others.len()
                )),
            }
        }
        Avro::Ref { name } => {
            let full = name.fullname(None);
            match named.get(&full).cloned() {
                Some(Some(t)) => column(&t, path, named),
                // A recursive record has no finite column.
                Some(None) => Err(format!(
                    "{path}: refers to the record {full} it is inside of (a recursive type has no Parquet column)"
                )),
                None => Err(format!(
                    "{path}: refers to {full}, which is not defined before"
                )),
            }
        }
    }
}

/// `field` with the symbols of the enum `schema` is, if it is one: the column is a
/// string, and its symbols go with it, to be checked.
fn with_symbols(field: Field, schema: &Avro, named: &HashMap<String, Option<Avro>>) -> Field {
    match enum_symbols(schema, named) {
        Some(symbols) => {
            field.with_metadata([(ENUM_SYMBOLS.to_string(), symbols.join(","))].into())
        }
        None => field,
    }
}

/// The symbols of the enum `schema` is (or `["null", enum]`, or a name of one).
fn enum_symbols(schema: &Avro, named: &HashMap<String, Option<Avro>>) -> Option<Vec<String>> {
    match schema {
        Avro::Enum(e) => Some(e.symbols.clone()),
        Avro::Union(u) => match u.variants() {
            [Avro::Null, one] | [one, Avro::Null] => enum_symbols(one, named),
            _ => None,
        },
        Avro::Ref { name } => match named.get(&name.fullname(None)) {
            Some(Some(t)) => enum_symbols(t, named),
            _ => None,
        },
        _ => None,
    }
}

/// `schema` with every timestamp and time counting milliseconds (a source that gives
/// every time as milliseconds, whatever the Avro schema's unit), nested ones too.
pub fn with_millisecond_times(schema: &Schema) -> Schema {
    fn field(f: &arrow_schema::FieldRef) -> arrow_schema::FieldRef {
        std::sync::Arc::new(f.as_ref().clone().with_data_type(data_type(f.data_type())))
    }
    fn data_type(t: &DataType) -> DataType {
        match t {
            DataType::Timestamp(_, zone) => {
                DataType::Timestamp(TimeUnit::Millisecond, zone.clone())
            }
            DataType::Time32(_) | DataType::Time64(_) => DataType::Time32(TimeUnit::Millisecond),
            DataType::Struct(fields) => DataType::Struct(fields.iter().map(field).collect()),
            DataType::List(f) => DataType::List(field(f)),
            DataType::LargeList(f) => DataType::LargeList(field(f)),
            DataType::Map(f, sorted) => DataType::Map(field(f), *sorted),
            other => other.clone(),
        }
    }
    Schema::new_with_metadata(
        schema.fields().iter().map(field).collect::<Fields>(),
        schema.metadata().clone(),
    )
}

fn utc(unit: TimeUnit) -> DataType {
    DataType::Timestamp(unit, Some("+00:00".into()))
}

fn type_name(schema: &Avro) -> String {
    match schema {
        Avro::Record(_) => "a record".into(),
        Avro::Array(_) => "an array".into(),
        Avro::Map(_) => "a map".into(),
        Avro::Union(_) => "a union".into(),
        other => format!("{other:?}").to_lowercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(schema: &Schema, name: &str) -> (DataType, bool) {
        let f = schema.field_with_name(name).unwrap();
        (f.data_type().clone(), f.is_nullable())
    }

    #[test]
    fn every_avro_type_has_its_column() {
        let text = r#"{"type":"record","name":"order","fields":[
            {"name":"id","type":"long"},
            {"name":"n","type":"int"},
            {"name":"ok","type":"boolean"},
            {"name":"f","type":"float"},
            {"name":"d","type":"double"},
            {"name":"s","type":"string"},
            {"name":"b","type":"bytes"},
            {"name":"note","type":["null","string"]},
            {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":12,"scale":2}},
            {"name":"huge","type":{"type":"bytes","logicalType":"decimal","precision":50,"scale":10}},
            {"name":"day","type":{"type":"int","logicalType":"date"}},
            {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}},
            {"name":"at_us","type":{"type":"long","logicalType":"timestamp-micros"}},
            {"name":"local","type":{"type":"long","logicalType":"local-timestamp-millis"}},
            {"name":"tm","type":{"type":"int","logicalType":"time-millis"}},
            {"name":"uid","type":{"type":"string","logicalType":"uuid"}},
            {"name":"kind","type":{"type":"enum","name":"kind","symbols":["a","b"]}},
            {"name":"hash","type":{"type":"fixed","name":"h","size":4}},
            {"name":"tags","type":{"type":"array","items":"string"}},
            {"name":"attrs","type":{"type":"map","values":"long"}},
            {"name":"addr","type":{"type":"record","name":"addr","fields":[{"name":"city","type":"string"}]}},
            {"name":"billing","type":["null","addr"]},
            {"name":"price","type":{"type":"fixed","name":"money","size":8,"logicalType":"decimal","precision":18,"scale":4}},
            {"name":"old_price","type":["null","money"]}
        ]}"#;
        let s = arrow_schema_of_text(text).unwrap();
        assert_eq!(field(&s, "id"), (DataType::Int64, false));
        assert_eq!(field(&s, "n"), (DataType::Int32, false));
        assert_eq!(field(&s, "ok"), (DataType::Boolean, false));
        assert_eq!(field(&s, "f"), (DataType::Float32, false));
        assert_eq!(field(&s, "d"), (DataType::Float64, false));
        assert_eq!(field(&s, "s"), (DataType::Utf8, false));
        assert_eq!(field(&s, "b"), (DataType::Binary, false));
        assert_eq!(field(&s, "note"), (DataType::Utf8, true));
        assert_eq!(field(&s, "amount"), (DataType::Decimal128(12, 2), false));
        assert_eq!(field(&s, "huge"), (DataType::Decimal256(50, 10), false));
        assert_eq!(field(&s, "day"), (DataType::Date32, false));
        assert_eq!(field(&s, "at"), (utc(TimeUnit::Millisecond), false));
        assert_eq!(field(&s, "at_us"), (utc(TimeUnit::Microsecond), false));
        assert_eq!(
            field(&s, "local"),
            (DataType::Timestamp(TimeUnit::Millisecond, None), false)
        );
        assert_eq!(
            field(&s, "tm"),
            (DataType::Time32(TimeUnit::Millisecond), false)
        );
        assert_eq!(field(&s, "uid"), (DataType::Utf8, false));
        assert_eq!(field(&s, "kind"), (DataType::Utf8, false));
        assert_eq!(field(&s, "hash"), (DataType::FixedSizeBinary(4), false));
        assert!(
            matches!(field(&s, "tags").0, DataType::List(f) if f.data_type() == &DataType::Utf8)
        );
        assert!(matches!(field(&s, "attrs").0, DataType::Map(..)));
        let addr = DataType::Struct(Fields::from(vec![Field::new(
            "city",
            DataType::Utf8,
            false,
        )]));
        assert_eq!(field(&s, "addr"), (addr.clone(), false));
        assert_eq!(
            field(&s, "billing"),
            (addr, true),
            "a named type used again"
        );
        assert_eq!(field(&s, "price"), (DataType::Decimal128(18, 4), false));
        assert_eq!(
            field(&s, "old_price"),
            (DataType::Decimal128(18, 4), true),
            "a named fixed decimal used again"
        );
        assert_eq!(
            s.field_with_name("kind").unwrap().metadata()[ENUM_SYMBOLS],
            "a,b"
        );
        let kinds = arrow_schema_of_text(
            r#"{"type":"record","name":"r","fields":[{"name":"ks","type":{"type":"array","items":{"type":"enum","name":"k","symbols":["x","y"]}}}]}"#,
        )
        .unwrap();
        let DataType::List(item) = kinds.field(0).data_type() else {
            panic!()
        };
        assert_eq!(item.metadata()[ENUM_SYMBOLS], "x,y", "an enum in an array");
    }

    #[test]
    fn what_parquet_cannot_hold_is_refused_naming_the_field() {
        let one = |t: &str| {
            arrow_schema_of_text(&format!(
                r#"{{"type":"record","name":"r","fields":[{{"name":"outer","type":{{"type":"record","name":"in","fields":[{{"name":"x","type":{t}}}]}}}}]}}"#
            ))
            .unwrap_err()
        };
        let e = one(r#"["null","string","long"]"#);
        assert!(e.starts_with("outer.x: a union of 2 types"), "{e}");
        let e = one(r#"{"type":"fixed","name":"dur","size":12,"logicalType":"duration"}"#);
        assert!(e.starts_with("outer.x: an Avro duration"), "{e}");
        let e = one(r#"{"type":"bytes","logicalType":"big-decimal"}"#);
        assert!(e.starts_with("outer.x: a big-decimal"), "{e}");
        let e = arrow_schema_of_text(r#""string""#).unwrap_err();
        assert!(e.contains("must be a record"), "{e}");
        let e = arrow_schema_of_text("{").unwrap_err();
        assert!(e.starts_with("not an Avro schema"), "{e}");
        let e = arrow_schema_of_text(
            r#"{"type":"record","name":"node","fields":[{"name":"next","type":["null","node"]}]}"#,
        )
        .unwrap_err();
        assert!(e.contains("recursive"), "{e}");
    }
}
