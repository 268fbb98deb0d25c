//! Arrow columns built straight from records' JSON text, by an Arrow schema (the one
//! [`super::avro_arrow`] makes): each value is read once, checked
//! ([`super::values`]) and appended to its column; a record that does not fit leaves
//! the columns as they were before it.
//!
//! What a record is: one JSON object (whitespace around it), whose keys are fields of
//! the schema. A field it does not have is null, which a field that takes no null
//! refuses. A key given twice is its last value, as a reader into a map of keys
//! takes it (the earlier value must still be JSON). A map's entries are in the order
//! of their keys (byte order), a key given twice being its last value: what lockgate
//! has always written for a map.

use super::json_text::Reader;
use super::refusal::Refusal;
use super::values;
use arrow_array::types::{
    Date32Type, Decimal128Type, Decimal256Type, Float32Type, Float64Type, Int32Type, Int64Type,
    Time32MillisecondType, Time32SecondType, Time64MicrosecondType, Time64NanosecondType,
    TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType,
};
use arrow_array::{
    timezone::Tz, ArrayRef, ArrowPrimitiveType, BinaryArray, BooleanArray, FixedSizeBinaryArray,
    ListArray, MapArray, NullArray, PrimitiveArray, RecordBatch, RecordBatchOptions, StringArray,
    StructArray,
};
use arrow_buffer::{
    i256, BooleanBufferBuilder, Buffer, NullBufferBuilder, OffsetBuffer, ScalarBuffer,
};
use arrow_schema::{DataType, FieldRef, Fields, SchemaRef, TimeUnit};
use std::collections::HashMap;
use std::sync::Arc;

/// The columns of a batch of records being built.
pub struct Columns {
    schema: SchemaRef,
    root: StructColumns,
    rows: usize,
}

impl Columns {
    /// Empty columns of `schema`, room made for `capacity` rows. An error names a
    /// column whose type the file sink does not write.
    pub fn new(schema: SchemaRef, capacity: usize) -> Result<Columns, String> {
        let root = StructColumns::new(schema.fields(), capacity)?;
        Ok(Columns {
            schema,
            root,
            rows: 0,
        })
    }

    /// The rows appended so far.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Appends the record `text` as a row; when it does not fit, why (naming the
    /// field), and the columns are as they were.
    pub fn append(&mut self, text: &[u8]) -> Result<(), Refusal> {
        let mut r = Reader::new(text)?;
        let read = match r.peek()? {
            b'{' => self.root.read_object(&mut r, self.rows).and_then(|_| {
                if r.at_end() {
                    Ok(())
                } else {
                    Err(r.syntax("more text after the object"))
                }
            }),
            _ => {
                // Not JSON at all is said so before not an object.
                r.skip_value()?;
                Err(Refusal::value("the value is not a JSON object"))
            }
        };
        match read {
            Ok(()) => {
                self.rows += 1;
                Ok(())
            }
            Err(e) => {
                self.root.truncate(self.rows);
                Err(e)
            }
        }
    }

    /// The rows appended (None when there are none).
    pub fn finish(self) -> Result<Option<RecordBatch>, String> {
        if self.rows == 0 {
            return Ok(None);
        }
        let columns = self
            .root
            .columns
            .into_iter()
            .map(Column::finish)
            .collect::<Result<Vec<_>, _>>()?;
        RecordBatch::try_new_with_options(
            self.schema,
            columns,
            &RecordBatchOptions::new().with_row_count(Some(self.rows)),
        )
        .map(Some)
        .map_err(|e| e.to_string())
    }
}

/// The fields of a struct (or of the record), with what finds them by name.
struct StructColumns {
    fields: Fields,
    names: Vec<Box<[u8]>>,
    /// Field indices by name, for wide structs whose keys come out of order.
    index: Option<HashMap<Box<[u8]>, usize>>,
    columns: Vec<Column>,
    /// Which fields the object being read has given.
    seen: Vec<bool>,
    /// Values that did not fit, each to be replaced by a later value of its key or
    /// to refuse the record.
    pending: Vec<(usize, Refusal)>,
}

impl StructColumns {
    fn new(fields: &Fields, capacity: usize) -> Result<StructColumns, String> {
        let columns = fields
            .iter()
            .map(|f| Column::new(f, capacity))
            .collect::<Result<Vec<_>, _>>()?;
        let names: Vec<Box<[u8]>> = fields.iter().map(|f| f.name().as_bytes().into()).collect();
        let index = (names.len() > 16).then(|| {
            names
                .iter()
                .cloned()
                .enumerate()
                .map(|(i, n)| (n, i))
                .rev()
                .collect()
        });
        Ok(StructColumns {
            fields: fields.clone(),
            seen: vec![false; names.len()],
            names,
            index,
            columns,
            pending: Vec::new(),
        })
    }

    /// The field named `key`; `next` is where it is first looked for (keys tend to
    /// come in the schema's order).
    #[inline(always)]
    fn find(&self, key: &[u8], next: usize) -> Option<usize> {
        if self.names.get(next).is_some_and(|n| **n == *key) {
            return Some(next);
        }
        match &self.index {
            Some(index) => index.get(key).copied(),
            None => self.names.iter().position(|n| **n == *key),
        }
    }

    fn truncate(&mut self, len: usize) {
        for c in &mut self.columns {
            c.truncate(len);
        }
    }

    /// Reads an object (its `{` peeked) into one more row of the columns, which hold
    /// `len` rows.
    fn read_object(&mut self, r: &mut Reader, len: usize) -> Result<(), Refusal> {
        r.i += 1;
        r.enter()?;
        self.seen.fill(false);
        self.pending.clear();
        let mut next = 0;
        if r.peek()? == b'}' {
            r.i += 1;
        } else {
            loop {
                if r.peek()? != b'"' {
                    return Err(r.syntax("an object's key is not a string"));
                }
                let key = r.string()?;
                let Some(idx) = self.find(key, next) else {
                    let key = String::from_utf8_lossy(key).into_owned();
                    return Err(Refusal::value("not a field of the schema").in_field(&key));
                };
                r.expect(b':', "expected ':' after an object's key")?;
                let column = &mut self.columns[idx];
                if self.seen[idx] {
                    // A key given again: its last value is the field's.
                    column.truncate(len);
                    self.pending.retain(|(k, _)| *k != idx);
                }
                self.seen[idx] = true;
                let (start, depth) = (r.i, r.depth());
                if let Err(e) = column.read(r) {
                    // Refused unless the key comes again; the value must be JSON.
                    column.truncate(len);
                    r.rewind(start, depth);
                    r.skip_value()?;
                    self.pending
                        .push((idx, e.in_field(self.fields[idx].name())));
                }
                next = idx + 1;
                match r.peek()? {
                    b',' => r.i += 1,
                    b'}' => {
                        r.i += 1;
                        break;
                    }
                    _ => return Err(r.syntax("expected ',' or '}' in an object")),
                }
            }
        }
        r.leave();
        if let Some((_, e)) = self.pending.drain(..).next() {
            return Err(e);
        }
        for (idx, column) in self.columns.iter_mut().enumerate() {
            if !self.seen[idx] && !column.append_null() {
                return Err(Refusal::value("missing, and the column takes no null")
                    .in_field(self.fields[idx].name()));
            }
        }
        Ok(())
    }

    /// Every column's value null under a null struct (Arrow's nulls, whatever the
    /// columns take: the struct's null hides them).
    fn append_hidden_nulls(&mut self) {
        for c in &mut self.columns {
            c.append_hidden_null();
        }
    }
}

/// A column being built: its values by kind, its nulls.
struct Column {
    field: FieldRef,
    kind: Kind,
    nulls: NullBufferBuilder,
    len: usize,
}

enum Kind {
    Null,
    Boolean(BooleanBufferBuilder),
    Int32(Vec<i32>),
    Int64(Vec<i64>),
    Float32(Vec<f32>),
    Float64(Vec<f64>),
    Date32(Vec<i32>),
    Time32(Vec<i32>, TimeUnit),
    Time64(Vec<i64>, TimeUnit),
    Timestamp {
        values: Vec<i64>,
        unit: TimeUnit,
        /// The column's zone (`timestamp-*`), None for local timestamps.
        tz: Option<Tz>,
    },
    Decimal128(Vec<i128>, u8, i8),
    Decimal256(Vec<i256>, u8, i8),
    Utf8 {
        offsets: Vec<i32>,
        data: Vec<u8>,
        /// An enum's symbols: the only values the column takes.
        symbols: Option<Vec<Box<[u8]>>>,
    },
    Binary {
        offsets: Vec<i32>,
        data: Vec<u8>,
    },
    FixedSizeBinary {
        size: usize,
        data: Vec<u8>,
    },
    Struct(Box<StructColumns>),
    List {
        offsets: Vec<i32>,
        items: Box<Column>,
    },
    Map {
        entries: FieldRef,
        offsets: Vec<i32>,
        keys: Box<Column>,
        values: Box<Column>,
    },
}

/// An offset into a column's children or bytes (Arrow's are 32-bit).
#[inline(always)]
fn offset(n: usize) -> Result<i32, Refusal> {
    i32::try_from(n).map_err(|_| Refusal::value("the batch's column holds more than 2 GiB"))
}

/// The refusal of a value of another kind than the column's.
#[cold]
fn expected(what: &str, r: &mut Reader) -> Refusal {
    Refusal::value(format!("expected {what}, found {}", r.kind_here()))
}

impl Column {
    fn new(field: &FieldRef, capacity: usize) -> Result<Column, String> {
        let unsupported = || {
            format!(
                "{}: the file sink writes no column of type {}",
                field.name(),
                field.data_type()
            )
        };
        let kind = match field.data_type() {
            DataType::Null => Kind::Null,
            DataType::Boolean => Kind::Boolean(BooleanBufferBuilder::new(capacity)),
            DataType::Int32 => Kind::Int32(Vec::with_capacity(capacity)),
            DataType::Int64 => Kind::Int64(Vec::with_capacity(capacity)),
            DataType::Float32 => Kind::Float32(Vec::with_capacity(capacity)),
            DataType::Float64 => Kind::Float64(Vec::with_capacity(capacity)),
            DataType::Date32 => Kind::Date32(Vec::with_capacity(capacity)),
            DataType::Time32(unit @ (TimeUnit::Second | TimeUnit::Millisecond)) => {
                Kind::Time32(Vec::with_capacity(capacity), *unit)
            }
            DataType::Time64(unit @ (TimeUnit::Microsecond | TimeUnit::Nanosecond)) => {
                Kind::Time64(Vec::with_capacity(capacity), *unit)
            }
            DataType::Timestamp(unit, tz) => Kind::Timestamp {
                values: Vec::with_capacity(capacity),
                unit: *unit,
                tz: match tz {
                    Some(tz) => Some(
                        tz.parse::<Tz>()
                            .map_err(|e| format!("{}: {e}", field.name()))?,
                    ),
                    None => None,
                },
            },
            DataType::Decimal128(p, s) => Kind::Decimal128(Vec::with_capacity(capacity), *p, *s),
            DataType::Decimal256(p, s) => Kind::Decimal256(Vec::with_capacity(capacity), *p, *s),
            DataType::Utf8 => Kind::Utf8 {
                offsets: offsets_with_capacity(capacity),
                data: Vec::new(),
                symbols: values::enum_symbols(field.metadata()),
            },
            DataType::Binary => Kind::Binary {
                offsets: offsets_with_capacity(capacity),
                data: Vec::new(),
            },
            DataType::FixedSizeBinary(size) => Kind::FixedSizeBinary {
                size: usize::try_from(*size).map_err(|_| unsupported())?,
                data: Vec::new(),
            },
            DataType::Struct(fields) => {
                Kind::Struct(Box::new(StructColumns::new(fields, capacity)?))
            }
            DataType::List(item) => Kind::List {
                offsets: offsets_with_capacity(capacity),
                items: Box::new(Column::new(item, 0)?),
            },
            DataType::Map(entries, false) => match entries.data_type() {
                DataType::Struct(kv) if kv.len() == 2 && kv[0].data_type() == &DataType::Utf8 => {
                    Kind::Map {
                        entries: entries.clone(),
                        offsets: offsets_with_capacity(capacity),
                        keys: Box::new(Column::new(&kv[0], 0)?),
                        values: Box::new(Column::new(&kv[1], 0)?),
                    }
                }
                _ => return Err(unsupported()),
            },
            _ => return Err(unsupported()),
        };
        Ok(Column {
            field: field.clone(),
            kind,
            nulls: NullBufferBuilder::new(capacity),
            len: 0,
        })
    }

    /// Back to `len` values, whatever was appended since (part of a value included).
    fn truncate(&mut self, len: usize) {
        self.len = len;
        self.nulls.truncate(len);
        match &mut self.kind {
            Kind::Null => {}
            Kind::Boolean(v) => v.truncate(len),
            Kind::Int32(v) | Kind::Date32(v) | Kind::Time32(v, _) => v.truncate(len),
            Kind::Int64(v) | Kind::Time64(v, _) | Kind::Timestamp { values: v, .. } => {
                v.truncate(len)
            }
            Kind::Float32(v) => v.truncate(len),
            Kind::Float64(v) => v.truncate(len),
            Kind::Decimal128(v, ..) => v.truncate(len),
            Kind::Decimal256(v, ..) => v.truncate(len),
            Kind::Utf8 { offsets, data, .. } | Kind::Binary { offsets, data } => {
                offsets.truncate(len + 1);
                data.truncate(offsets[len] as usize);
            }
            Kind::FixedSizeBinary { size, data } => data.truncate(len * *size),
            Kind::Struct(s) => s.truncate(len),
            Kind::List { offsets, items } => {
                offsets.truncate(len + 1);
                items.truncate(offsets[len] as usize);
            }
            Kind::Map {
                offsets,
                keys,
                values,
                ..
            } => {
                offsets.truncate(len + 1);
                keys.truncate(offsets[len] as usize);
                values.truncate(offsets[len] as usize);
            }
        }
    }

    /// A null, when the column takes one (false, nothing appended, when not).
    fn append_null(&mut self) -> bool {
        if !self.field.is_nullable() && !matches!(self.kind, Kind::Null) {
            return false;
        }
        self.append_hidden_null();
        true
    }

    /// A null whether the column takes one or not (a null struct's fields).
    fn append_hidden_null(&mut self) {
        self.len += 1;
        self.nulls.append_null();
        match &mut self.kind {
            Kind::Null => {}
            Kind::Boolean(v) => v.append(false),
            Kind::Int32(v) | Kind::Date32(v) | Kind::Time32(v, _) => v.push(0),
            Kind::Int64(v) | Kind::Time64(v, _) | Kind::Timestamp { values: v, .. } => v.push(0),
            Kind::Float32(v) => v.push(0.0),
            Kind::Float64(v) => v.push(0.0),
            Kind::Decimal128(v, ..) => v.push(0),
            Kind::Decimal256(v, ..) => v.push(i256::ZERO),
            Kind::Utf8 { offsets, .. }
            | Kind::Binary { offsets, .. }
            | Kind::List { offsets, .. }
            | Kind::Map { offsets, .. } => {
                let last = offsets[offsets.len() - 1];
                offsets.push(last);
            }
            Kind::FixedSizeBinary { size, data } => data.resize(data.len() + *size, 0),
            Kind::Struct(s) => s.append_hidden_nulls(),
        }
    }

    /// Reads one value into the column.
    #[inline]
    fn read(&mut self, r: &mut Reader) -> Result<(), Refusal> {
        if r.null()? {
            if self.append_null() {
                return Ok(());
            }
            return Err(Refusal::value("null, and the column takes no null"));
        }
        let c = r.peek()?;
        match &mut self.kind {
            Kind::Null => return Err(expected("null", r)),
            Kind::Boolean(v) => match r.boolean()? {
                Some(b) => v.append(b),
                None => return Err(expected("a boolean", r)),
            },
            Kind::Int64(v) => {
                let x = match c {
                    b'-' | b'0'..=b'9' => {
                        let n = r.number()?;
                        values::integer_of_number::<i64>(r.slice(n.start, n.end), n.whole)?
                    }
                    b'"' => values::int64_of_text(text(r.string()?))?,
                    _ => return Err(expected("an integer", r)),
                };
                v.push(x);
            }
            Kind::Int32(v) => {
                let x = match c {
                    b'-' | b'0'..=b'9' => {
                        let n = r.number()?;
                        values::integer_of_number::<i32>(r.slice(n.start, n.end), n.whole)?
                    }
                    b'"' => values::int32_of_text(text(r.string()?))?,
                    _ => return Err(expected("an integer", r)),
                };
                v.push(x);
            }
            Kind::Float64(v) => match c {
                b'-' | b'0'..=b'9' => {
                    let n = r.number()?;
                    v.push(values::float64(r.text(n.start, n.end))?);
                }
                b'"' => return Err(values::float_as_text(text(r.string()?))),
                _ => return Err(expected("a number", r)),
            },
            Kind::Float32(v) => match c {
                b'-' | b'0'..=b'9' => {
                    let n = r.number()?;
                    v.push(values::float32(r.text(n.start, n.end))?);
                }
                b'"' => return Err(values::float_as_text(text(r.string()?))),
                _ => return Err(expected("a number", r)),
            },
            Kind::Timestamp {
                values: v,
                unit,
                tz,
            } => {
                let x = match c {
                    b'-' | b'0'..=b'9' => {
                        let n = r.number()?;
                        values::timestamp_of_number(r.text(n.start, n.end), n.whole, *unit)?
                    }
                    b'"' => values::timestamp_of_text(text(r.string()?), *unit, tz.as_ref())?,
                    _ => return Err(expected("a timestamp", r)),
                };
                v.push(x);
            }
            Kind::Date32(v) => {
                let x = match c {
                    b'-' | b'0'..=b'9' => {
                        let n = r.number()?;
                        values::date_of_number(r.text(n.start, n.end), n.whole)?
                    }
                    b'"' => values::date_of_text(text(r.string()?))?,
                    _ => return Err(expected("a date", r)),
                };
                v.push(x);
            }
            Kind::Time32(v, unit) => {
                let x = match c {
                    b'-' | b'0'..=b'9' => {
                        let n = r.number()?;
                        values::time_of_number(r.text(n.start, n.end), n.whole, *unit)?
                    }
                    b'"' => values::time_of_text(text(r.string()?), *unit)?,
                    _ => return Err(expected("a time of day", r)),
                };
                // Below a day of seconds or milliseconds: a 32-bit number.
                v.push(x as i32);
            }
            Kind::Time64(v, unit) => {
                let x = match c {
                    b'-' | b'0'..=b'9' => {
                        let n = r.number()?;
                        values::time_of_number(r.text(n.start, n.end), n.whole, *unit)?
                    }
                    b'"' => values::time_of_text(text(r.string()?), *unit)?,
                    _ => return Err(expected("a time of day", r)),
                };
                v.push(x);
            }
            Kind::Decimal128(v, p, s) => {
                let x = match c {
                    b'-' | b'0'..=b'9' => {
                        let n = r.number()?;
                        values::decimal::<Decimal128Type>(r.text(n.start, n.end), *p, *s)?
                    }
                    b'"' => values::decimal::<Decimal128Type>(text(r.string()?), *p, *s)?,
                    _ => return Err(expected("a decimal", r)),
                };
                v.push(x);
            }
            Kind::Decimal256(v, p, s) => {
                let x = match c {
                    b'-' | b'0'..=b'9' => {
                        let n = r.number()?;
                        values::decimal::<Decimal256Type>(r.text(n.start, n.end), *p, *s)?
                    }
                    b'"' => values::decimal::<Decimal256Type>(text(r.string()?), *p, *s)?,
                    _ => return Err(expected("a decimal", r)),
                };
                v.push(x);
            }
            Kind::Utf8 {
                offsets,
                data,
                symbols,
            } => {
                if c != b'"' {
                    return Err(expected("a string", r));
                }
                let start = data.len();
                r.string_into(data)?;
                if let Some(symbols) = symbols {
                    let value = &data[start..];
                    if !symbols.iter().any(|s| **s == *value) {
                        return Err(values::not_a_symbol(value, symbols));
                    }
                }
                offsets.push(offset(data.len())?);
            }
            Kind::Binary { offsets, data } => {
                if c != b'"' {
                    return Err(Refusal::value("bytes are a base64 string"));
                }
                values::base64_into(r.string()?, data)?;
                offsets.push(offset(data.len())?);
            }
            Kind::FixedSizeBinary { size, data } => {
                if c != b'"' {
                    return Err(Refusal::value("bytes are a base64 string"));
                }
                let start = data.len();
                values::base64_into(r.string()?, data)?;
                let n = data.len() - start;
                if n != *size {
                    return Err(Refusal::value(format!(
                        "{n} bytes for a fixed size of {size}"
                    )));
                }
            }
            Kind::Struct(s) => {
                if c != b'{' {
                    return Err(expected("an object", r));
                }
                s.read_object(r, self.len)?;
            }
            Kind::List { offsets, items } => {
                if c != b'[' {
                    return Err(expected("an array", r));
                }
                r.i += 1;
                r.enter()?;
                if r.peek()? == b']' {
                    r.i += 1;
                } else {
                    loop {
                        items.read(r).map_err(Refusal::in_item)?;
                        match r.peek()? {
                            b',' => r.i += 1,
                            b']' => {
                                r.i += 1;
                                break;
                            }
                            _ => return Err(r.syntax("expected ',' or ']' in an array")),
                        }
                    }
                }
                r.leave();
                offsets.push(offset(items.len)?);
            }
            Kind::Map {
                offsets,
                keys,
                values,
                ..
            } => {
                if c != b'{' {
                    return Err(expected("an object", r));
                }
                read_map(r, offsets, keys, values)?;
            }
        }
        self.len += 1;
        self.nulls.append_non_null();
        Ok(())
    }

    fn finish(self) -> Result<ArrayRef, String> {
        let Column {
            field,
            kind,
            mut nulls,
            len,
        } = self;
        let nulls = nulls.finish();
        let e = |e: arrow_schema::ArrowError| format!("{}: {e}", field.name());
        fn primitive<T: ArrowPrimitiveType>(
            values: Vec<T::Native>,
            nulls: Option<arrow_buffer::NullBuffer>,
        ) -> Result<PrimitiveArray<T>, arrow_schema::ArrowError> {
            PrimitiveArray::<T>::try_new(ScalarBuffer::from(values), nulls)
        }
        Ok(match kind {
            Kind::Null => Arc::new(NullArray::new(len)),
            Kind::Boolean(mut v) => Arc::new(BooleanArray::new(v.finish(), nulls)),
            Kind::Int32(v) => Arc::new(primitive::<Int32Type>(v, nulls).map_err(e)?),
            Kind::Int64(v) => Arc::new(primitive::<Int64Type>(v, nulls).map_err(e)?),
            Kind::Float32(v) => Arc::new(primitive::<Float32Type>(v, nulls).map_err(e)?),
            Kind::Float64(v) => Arc::new(primitive::<Float64Type>(v, nulls).map_err(e)?),
            Kind::Date32(v) => Arc::new(primitive::<Date32Type>(v, nulls).map_err(e)?),
            Kind::Time32(v, TimeUnit::Second) => {
                Arc::new(primitive::<Time32SecondType>(v, nulls).map_err(e)?)
            }
            Kind::Time32(v, _) => {
                Arc::new(primitive::<Time32MillisecondType>(v, nulls).map_err(e)?)
            }
            Kind::Time64(v, TimeUnit::Microsecond) => {
                Arc::new(primitive::<Time64MicrosecondType>(v, nulls).map_err(e)?)
            }
            Kind::Time64(v, _) => Arc::new(primitive::<Time64NanosecondType>(v, nulls).map_err(e)?),
            Kind::Timestamp { values, unit, .. } => {
                let tz = match field.data_type() {
                    DataType::Timestamp(_, tz) => tz.clone(),
                    _ => None,
                };
                match unit {
                    TimeUnit::Second => Arc::new(
                        primitive::<TimestampSecondType>(values, nulls)
                            .map_err(e)?
                            .with_timezone_opt(tz),
                    ),
                    TimeUnit::Millisecond => Arc::new(
                        primitive::<TimestampMillisecondType>(values, nulls)
                            .map_err(e)?
                            .with_timezone_opt(tz),
                    ),
                    TimeUnit::Microsecond => Arc::new(
                        primitive::<TimestampMicrosecondType>(values, nulls)
                            .map_err(e)?
                            .with_timezone_opt(tz),
                    ),
                    TimeUnit::Nanosecond => Arc::new(
                        primitive::<TimestampNanosecondType>(values, nulls)
                            .map_err(e)?
                            .with_timezone_opt(tz),
                    ),
                }
            }
            Kind::Decimal128(v, p, s) => Arc::new(
                primitive::<Decimal128Type>(v, nulls)
                    .and_then(|a| a.with_precision_and_scale(p, s))
                    .map_err(e)?,
            ),
            Kind::Decimal256(v, p, s) => Arc::new(
                primitive::<Decimal256Type>(v, nulls)
                    .and_then(|a| a.with_precision_and_scale(p, s))
                    .map_err(e)?,
            ),
            Kind::Utf8 { offsets, data, .. } => Arc::new(
                StringArray::try_new(
                    OffsetBuffer::new(ScalarBuffer::from(offsets)),
                    Buffer::from_vec(data),
                    nulls,
                )
                .map_err(e)?,
            ),
            Kind::Binary { offsets, data } => Arc::new(
                BinaryArray::try_new(
                    OffsetBuffer::new(ScalarBuffer::from(offsets)),
                    Buffer::from_vec(data),
                    nulls,
                )
                .map_err(e)?,
            ),
            Kind::FixedSizeBinary { size, data } => Arc::new(
                FixedSizeBinaryArray::try_new(size as i32, Buffer::from_vec(data), nulls)
                    .map_err(e)?,
            ),
            Kind::Struct(s) => {
                let StructColumns {
                    fields, columns, ..
                } = *s;
                let children = columns
                    .into_iter()
                    .map(Column::finish)
                    .collect::<Result<Vec<_>, _>>()?;
                if fields.is_empty() {
                    Arc::new(StructArray::new_empty_fields(len, nulls))
                } else {
                    Arc::new(StructArray::try_new(fields, children, nulls).map_err(e)?)
                }
            }
            Kind::List { offsets, items } => {
                let item = items.field.clone();
                Arc::new(
                    ListArray::try_new(
                        item,
                        OffsetBuffer::new(ScalarBuffer::from(offsets)),
                        items.finish()?,
                        nulls,
                    )
                    .map_err(e)?,
                )
            }
            Kind::Map {
                entries,
                offsets,
                keys,
                values,
            } => {
                let DataType::Struct(kv) = entries.data_type() else {
                    return Err(format!("{}: a map without entries", field.name()));
                };
                let pairs =
                    StructArray::try_new(kv.clone(), vec![keys.finish()?, values.finish()?], None)
                        .map_err(e)?;
                Arc::new(
                    MapArray::try_new(
                        entries.clone(),
                        OffsetBuffer::new(ScalarBuffer::from(offsets)),
                        pairs,
                        nulls,
                        false,
                    )
                    .map_err(e)?,
                )
            }
        })
    }
}

fn offsets_with_capacity(capacity: usize) -> Vec<i32> {
    let mut v = Vec::with_capacity(capacity + 1);
    v.push(0);
    v
}

/// The text of a JSON string's content (UTF-8: the record's text is, and escapes
/// decode to UTF-8).
#[inline(always)]
fn text(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap_or_default()
}

/// Appends `key` to a map's key column (a string column taking no null).
fn push_key(keys: &mut Column, key: &[u8]) -> Result<(), Refusal> {
    let Kind::Utf8 { offsets, data, .. } = &mut keys.kind else {
        return Err(Refusal::value("a map's keys are strings"));
    };
    data.extend_from_slice(key);
    offsets.push(offset(data.len())?);
    keys.len += 1;
    keys.nulls.append_non_null();
    Ok(())
}

/// The last key of a map's key column.
fn last_key(keys: &Column) -> &[u8] {
    match &keys.kind {
        Kind::Utf8 { offsets, data, .. } => {
            let n = offsets.len();
            &data[offsets[n - 2] as usize..offsets[n - 1] as usize]
        }
        _ => &[],
    }
}

/// Reads a map (its `{` peeked) into one more entry list. Entries in key order, a key
/// given twice its last value: read as they come while they come so (the common
/// case), else read again in that order.
fn read_map(
    r: &mut Reader,
    offsets: &mut Vec<i32>,
    keys: &mut Box<Column>,
    values: &mut Box<Column>,
) -> Result<(), Refusal> {
    let (open, depth) = (r.i, r.depth());
    let first = keys.len;
    r.i += 1;
    r.enter()?;
    let in_order = (|| {
        if r.peek()? == b'}' {
            r.i += 1;
            return Ok(true);
        }
        loop {
            if r.peek()? != b'"' {
                return Err(r.syntax("an object's key is not a string"));
            }
            let key = r.string()?;
            if keys.len > first && *key <= *last_key(keys) {
                return Ok(false);
            }
            push_key(keys, key)?;
            r.expect(b':', "expected ':' after an object's key")?;
            if values.read(r).is_err() {
                // Maybe a key given again later replaces it: read them all again.
                return Ok(false);
            }
            match r.peek()? {
                b',' => r.i += 1,
                b'}' => {
                    r.i += 1;
                    return Ok(true);
                }
                _ => return Err(r.syntax("expected ',' or '}' in an object")),
            }
        }
    })()?;
    if !in_order {
        keys.truncate(first);
        values.truncate(first);
        r.rewind(open, depth);
        read_map_sorted(r, keys, values)?;
    } else {
        r.leave();
    }
    offsets.push(offset(keys.len)?);
    Ok(())
}

/// [`read_map`] when the keys do not come in order: where each value is, then the
/// values of the keys in order.
#[cold]
fn read_map_sorted(
    r: &mut Reader,
    keys: &mut Box<Column>,
    values: &mut Box<Column>,
) -> Result<(), Refusal> {
    r.i += 1;
    r.enter()?;
    let inside = r.depth();
    let mut entries: Vec<(Vec<u8>, usize)> = Vec::new();
    if r.peek()? == b'}' {
        r.i += 1;
    } else {
        loop {
            if r.peek()? != b'"' {
                return Err(r.syntax("an object's key is not a string"));
            }
            let key = r.string()?.to_vec();
            r.expect(b':', "expected ':' after an object's key")?;
            entries.push((key, r.i));
            r.skip_value()?;
            match r.peek()? {
                b',' => r.i += 1,
                b'}' => {
                    r.i += 1;
                    break;
                }
                _ => return Err(r.syntax("expected ',' or '}' in an object")),
            }
        }
    }
    r.leave();
    let (end, depth) = (r.i, r.depth());
    // Stable: a key's values stay in the order they came, and the last is kept.
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for (k, (key, at)) in entries.iter().enumerate() {
        if entries.get(k + 1).is_some_and(|next| next.0 == *key) {
            continue;
        }
        push_key(keys, key)?;
        r.rewind(*at, inside);
        values.read(r).map_err(Refusal::in_map_value)?;
    }
    r.rewind(end, depth);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Array;
    use arrow_schema::Field;

    fn field(name: &str, t: DataType, nullable: bool) -> Field {
        Field::new(name, t, nullable)
    }

    fn columns(fields: Vec<Field>) -> Columns {
        Columns::new(Arc::new(arrow_schema::Schema::new(fields)), 4).unwrap()
    }

    #[test]
    fn a_refused_record_leaves_no_trace() {
        let item = Arc::new(field("item", DataType::Int64, false));
        let mut c = columns(vec![
            field("id", DataType::Int64, false),
            field("tags", DataType::List(item), true),
            field("s", DataType::Utf8, true),
        ]);
        c.append(br#"{"id":1,"tags":[1,2],"s":"a"}"#).unwrap();
        assert!(c.append(br#"{"id":2,"tags":[3,4,"x"],"s":"b"}"#).is_err());
        assert!(c
            .append(br#"{"id":3,"s":"ccc","tags":[5],"zz":1}"#)
            .is_err());
        c.append(br#"{"id":4}"#).unwrap();
        let rows = c.finish().unwrap().unwrap();
        assert_eq!(rows.num_rows(), 2);
        let tags = rows.column(1).as_any().downcast_ref::<ListArray>().unwrap();
        assert_eq!(tags.values().len(), 2);
        assert!(tags.is_null(1));
        let s = rows
            .column(2)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        assert_eq!(s.value(0), "a");
        assert!(s.is_null(1));
    }

    #[test]
    fn a_key_given_twice_is_its_last_value() {
        let mut c = columns(vec![field("id", DataType::Int64, false)]);
        c.append(br#"{"id":"x","id":2}"#).unwrap();
        let e = c.append(br#"{"id":1,"id":"x"}"#).unwrap_err().to_string();
        assert!(e.starts_with("id: "), "{e}");
        let rows = c.finish().unwrap().unwrap();
        assert_eq!(rows.num_rows(), 1);
    }

    #[test]
    fn map_entries_are_in_key_order_each_key_once() {
        let entries = Arc::new(field(
            "entries",
            DataType::Struct(
                vec![
                    field("key", DataType::Utf8, false),
                    field("value", DataType::Int64, false),
                ]
                .into(),
            ),
            false,
        ));
        let mut c = columns(vec![field("m", DataType::Map(entries, false), false)]);
        c.append(br#"{"m":{"b":1,"a":"x","c":3,"a":2}}"#).unwrap();
        c.append(br#"{"m":{"a":1,"b":2}}"#).unwrap();
        assert!(c.append(br#"{"m":{"b":1,"a":"x"}}"#).is_err());
        let rows = c.finish().unwrap().unwrap();
        let m = rows.column(0).as_any().downcast_ref::<MapArray>().unwrap();
        let keys = m.keys().as_any().downcast_ref::<StringArray>().unwrap();
        let keys: Vec<&str> = keys.iter().flatten().collect();
        assert_eq!(keys, ["a", "b", "c", "a", "b"]);
        let values = m
            .values()
            .as_any()
            .downcast_ref::<arrow_array::Int64Array>()
            .unwrap();
        assert_eq!(values.values(), &[2, 1, 3, 1, 2]);
    }
}
