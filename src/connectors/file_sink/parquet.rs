//! The Parquet format: records (JSON values) decoded by an Arrow schema into columns,
//! written as row groups of one Parquet file per part.
//!
//! A record the schema does not describe (a field it does not name, a value of the
//! wrong type, a missing required field, not one JSON object) is refused with the
//! decoder's reason, which names the field; the sink's item error policy decides
//! what happens to it. A delete has no row to be, so it is refused too.

use crate::record::{Batch, Op, Record};
use arrow_array::RecordBatch;
use arrow_schema::{DataType, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, GzipLevel, ZstdLevel};
use parquet::file::properties::WriterProperties;
use std::io::Write;

/// The Parquet format of a file sink: the columns and the compression.
#[derive(Debug, Clone, PartialEq)]
pub struct ParquetFormat {
    pub schema: SchemaRef,
    pub compression: Compression,
}

/// The compressions `compression` accepts, by name.
pub const COMPRESSIONS: &str = "snappy | zstd | gzip | none";

/// The compression named `name` ([`COMPRESSIONS`]).
pub fn compression(name: &str) -> Option<Compression> {
    Some(match name {
        "snappy" => Compression::SNAPPY,
        "zstd" => Compression::ZSTD(ZstdLevel::default()),
        "gzip" => Compression::GZIP(GzipLevel::default()),
        "none" => Compression::UNCOMPRESSED,
        _ => return None,
    })
}

/// What decoding a batch gave: the rows of the records that fit, in order, and the
/// records that do not, by index in the batch, with why.
#[derive(Debug, Default)]
pub struct Decoded {
    pub rows: Option<RecordBatch>,
    pub refused: Vec<(usize, String)>,
}

impl ParquetFormat {
    /// A writer of one Parquet file into `out`.
    pub fn writer<W: Write + Send>(&self, out: W) -> Result<ArrowWriter<W>, String> {
        let props = WriterProperties::builder()
            .set_compression(self.compression)
            .build();
        ArrowWriter::try_new(out, self.schema.clone(), Some(props)).map_err(|e| e.to_string())
    }

    /// Decodes the values of `batch` into rows. The common case, every record fitting,
    /// is one pass; when one does not, each is tried alone to find which.
    pub fn decode(&self, batch: &Batch) -> Decoded {
        let mut refused = Vec::new();
        let mut rows: Vec<usize> = Vec::with_capacity(batch.len());
        let decimals = self
            .schema
            .fields()
            .iter()
            .any(|f| has_decimal(f.data_type()));
        for (i, r) in batch.iter().enumerate() {
            let why = row_refusal(r).or_else(|| {
                decimals
                    .then(|| decimal_refusal(&self.schema, &r.value))
                    .flatten()
            });
            match why {
                Some(why) => refused.push((i, why)),
                None => rows.push(i),
            }
        }
        match self.decode_rows(batch, &rows) {
            Ok(decoded) => Decoded {
                rows: decoded,
                refused,
            },
            Err(_) => {
                let mut fitting = Vec::with_capacity(rows.len());
                for i in rows {
                    match self.decode_rows(batch, &[i]) {
                        Ok(_) => fitting.push(i),
                        Err(why) => refused.push((i, why)),
                    }
                }
                refused.sort_by_key(|(i, _)| *i);
                let rows = self
                    .decode_rows(batch, &fitting)
                    .expect("records that decode alone decode together");
                Decoded { rows, refused }
            }
        }
    }

    /// The rows of `batch[i]` for each `i` of `which`, in order; an error when one
    /// does not fit (or is not exactly one JSON object).
    fn decode_rows(&self, batch: &Batch, which: &[usize]) -> Result<Option<RecordBatch>, String> {
        if which.is_empty() {
            return Ok(None);
        }
        let mut decoder = arrow_json::ReaderBuilder::new(self.schema.clone())
            .with_strict_mode(true)
            .with_batch_size(which.len())
            .build_decoder()
            .map_err(|e| e.to_string())?;
        for &i in which {
            let value = &batch[i].value;
            let read = decoder.decode(value).map_err(|e| e.to_string())?;
            if read != value.len() {
                return Err("the value is more than one JSON object".into());
            }
        }
        let rows = decoder.flush().map_err(|e| e.to_string())?;
        let n = rows.as_ref().map_or(0, |b| b.num_rows());
        if n != which.len() {
            return Err(format!(
                "{} values gave {n} rows: a value is not exactly one JSON object",
                which.len()
            ));
        }
        Ok(rows)
    }
}

/// Whether `t` holds a decimal anywhere.
fn has_decimal(t: &DataType) -> bool {
    match t {
        DataType::Decimal128(..) | DataType::Decimal256(..) => true,
        DataType::Struct(fields) => fields.iter().any(|f| has_decimal(f.data_type())),
        DataType::List(f) | DataType::Map(f, _) => has_decimal(f.data_type()),
        _ => false,
    }
}

/// Why a decimal of `value` cannot be held exactly by its column: Arrow's decoder
/// drops the digits past the column's scale, so a value with more (`12.345` for a
/// scale of 2) is refused here instead of written as another number. None when every
/// decimal fits, or when the value is not JSON (the decoder says why).
fn decimal_refusal(schema: &Schema, value: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(value).ok()?;
    let obj = v.as_object()?;
    schema.fields().iter().find_map(|f| {
        obj.get(f.name())
            .and_then(|x| decimal_misfit(f.data_type(), x, f.name()))
    })
}

fn decimal_misfit(t: &DataType, v: &serde_json::Value, path: &str) -> Option<String> {
    use serde_json::Value;
    match (t, v) {
        (DataType::Decimal128(_, scale) | DataType::Decimal256(_, scale), _) => {
            let text = match v {
                Value::Number(n) => n.to_string(),
                Value::String(s) => s.clone(),
                _ => return None,
            };
            let places = decimal_places(&text)?;
            (places > i64::from(*scale)).then(|| {
                format!("{path}: {text} has {places} decimal places, more than the column's scale {scale}")
            })
        }
        (DataType::Struct(fields), Value::Object(o)) => fields.iter().find_map(|f| {
            o.get(f.name())
                .and_then(|x| decimal_misfit(f.data_type(), x, &format!("{path}.{}", f.name())))
        }),
        (DataType::List(f), Value::Array(items)) => items
            .iter()
            .find_map(|x| decimal_misfit(f.data_type(), x, &format!("{path}[]"))),
        (DataType::Map(entries, _), Value::Object(o)) => match entries.data_type() {
            DataType::Struct(kv) if kv.len() == 2 => o
                .values()
                .find_map(|x| decimal_misfit(kv[1].data_type(), x, &format!("{path}{{}}"))),
            _ => None,
        },
        _ => None,
    }
}

/// The decimal places `text` (a decimal numeral, maybe with an exponent) needs, its
/// trailing zeros after the point not counted. None when it is not a numeral.
pub fn decimal_places(text: &str) -> Option<i64> {
    let (mantissa, exp) = match text.find(['e', 'E']) {
        Some(i) => (&text[..i], text[i + 1..].parse::<i64>().ok()?),
        None => (text, 0),
    };
    let mantissa = mantissa.trim_start_matches(['-', '+']);
    let fraction = match mantissa.split_once('.') {
        Some((int, frac)) => {
            if !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
                return None;
            }
            frac.trim_end_matches('0')
        }
        None => {
            if mantissa.is_empty() || !mantissa.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            ""
        }
    };
    let places = fraction.len() as i64 - exp;
    Some(places.max(0))
}

/// Why `r` cannot be a row at all, before its value is looked at.
fn row_refusal(r: &Record) -> Option<String> {
    if r.tombstone || r.op == Op::Delete {
        return Some("a delete has no row in a Parquet file".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Decimal128Type, Int64Type};
    use arrow_schema::Field;
    use std::sync::Arc;

    fn format() -> ParquetFormat {
        ParquetFormat {
            schema: Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int64, false),
                Field::new("amount", DataType::Decimal128(12, 2), false),
                Field::new("note", DataType::Utf8, true),
            ])),
            compression: Compression::SNAPPY,
        }
    }

    fn batch(values: &[&str]) -> Batch {
        values
            .iter()
            .map(|v| Record {
                value: v.as_bytes().to_vec().into(),
                ..Record::default()
            })
            .collect()
    }

    #[test]
    fn records_become_rows_with_exact_decimals() {
        let d = format().decode(&batch(&[
            r#"{"id":1,"amount":12.34,"note":"a"}"#,
            r#"{"id":2,"amount":"99999999.99"}"#,
        ]));
        assert!(d.refused.is_empty(), "{:?}", d.refused);
        let rows = d.rows.unwrap();
        assert_eq!(rows.num_rows(), 2);
        let ids = rows.column(0).as_primitive::<Int64Type>();
        assert_eq!(ids.values(), &[1, 2]);
        let amounts = rows.column(1).as_primitive::<Decimal128Type>();
        assert_eq!(amounts.value(0), 1234);
        assert_eq!(amounts.value(1), 9_999_999_999);
        assert!(rows.column(2).is_null(1));
    }

    #[test]
    fn a_record_that_does_not_fit_is_refused_naming_its_field_and_the_rest_are_kept() {
        let mut b = batch(&[
            r#"{"id":1,"amount":1}"#,
            r#"{"id":"two","amount":2}"#,
            r#"{"id":3,"amount":3,"extra":true}"#,
            r#"{"amount":4}"#,
            r#"{"id":5,"amount":5}{"id":6,"amount":6}"#,
            r#"7"#,
            r#"{"id":8,"amount":8}"#,
        ]);
        b.push(Record {
            op: Op::Delete,
            value: br#"{"id":9,"amount":9}"#.to_vec().into(),
            ..Record::default()
        });
        let d = format().decode(&b);
        let refused: Vec<usize> = d.refused.iter().map(|(i, _)| *i).collect();
        assert_eq!(refused, vec![1, 2, 3, 4, 5, 7], "{:?}", d.refused);
        let why = |i: usize| &d.refused.iter().find(|(j, _)| *j == i).unwrap().1;
        assert!(why(1).contains("id"), "{}", why(1));
        assert!(why(2).contains("extra"), "{}", why(2));
        assert!(why(3).contains("id"), "{}", why(3));
        assert!(why(7).contains("delete"), "{}", why(7));
        let rows = d.rows.unwrap();
        let ids = rows.column(0).as_primitive::<Int64Type>();
        assert_eq!(ids.values(), &[1, 8]);
    }

    #[test]
    fn a_decimal_with_more_places_than_its_scale_is_refused_not_truncated() {
        let d = format().decode(&batch(&[
            r#"{"id":1,"amount":12.345}"#,
            r#"{"id":2,"amount":"12.3400"}"#,
            r#"{"id":3,"amount":1.2345e2}"#,
            r#"{"id":4,"amount":1.23456e2}"#,
            r#"{"id":5,"amount":"-0.001"}"#,
        ]));
        let refused: Vec<usize> = d.refused.iter().map(|(i, _)| *i).collect();
        assert_eq!(refused, vec![0, 3, 4], "{:?}", d.refused);
        assert!(d.refused[0]
            .1
            .starts_with("amount: 12.345 has 3 decimal places"));
        let rows = d.rows.unwrap();
        let amounts = rows.column(1).as_primitive::<Decimal128Type>();
        assert_eq!(amounts.values(), &[1234, 12345]);
    }

    #[test]
    fn decimal_places_count_what_the_value_needs() {
        assert_eq!(decimal_places("12"), Some(0));
        assert_eq!(decimal_places("12.30"), Some(1));
        assert_eq!(decimal_places("-0.001"), Some(3));
        assert_eq!(decimal_places("1.5e3"), Some(0));
        assert_eq!(decimal_places("15E-3"), Some(3));
        assert_eq!(decimal_places("1.2.3"), None);
        assert_eq!(decimal_places("abc"), None);
        assert_eq!(decimal_places(""), None);
    }

    #[test]
    fn compressions_are_named() {
        for name in ["snappy", "zstd", "gzip", "none"] {
            assert!(compression(name).is_some(), "{name}");
            assert!(COMPRESSIONS.contains(name));
        }
        assert!(compression("lz4").is_none());
    }
}
