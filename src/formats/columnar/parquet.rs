//! The Parquet format: records (JSON values) decoded by an Arrow schema into columns,
//! written as row groups of one Parquet file per part.
//!
//! A record the schema does not describe (a field it does not name, a value of the
//! wrong type, a missing required field, not one JSON object) is refused with the
//! reason, which names the field; the sink's item error policy decides what happens
//! to it. A delete has no row to be, so it is refused too.

use super::columns::Columns;
use crate::record::{Batch, Op, Record};
use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
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

    /// Decodes the values of `batch` into rows: each record's JSON text read once,
    /// straight into the columns ([`super::columns`]).
    pub fn decode(&self, batch: &Batch) -> Decoded {
        let mut rows = self.rows(batch.len());
        for (i, r) in batch.iter().enumerate() {
            rows.push(i, r);
        }
        rows.finish()
    }

    /// Rows to decode one record at a time, room made for `capacity`: for records of a
    /// batch that go to several parts, each part's rows decoded as they come.
    pub fn rows(&self, capacity: usize) -> Rows {
        Rows {
            columns: Columns::new(self.schema.clone(), capacity),
            rows: Vec::with_capacity(capacity),
            refused: Vec::new(),
        }
    }
}

/// Rows being decoded one record at a time ([`ParquetFormat::rows`]): what
/// [`ParquetFormat::decode`] gives for the records pushed, by the indices they were
/// pushed with.
pub struct Rows {
    /// Why there are none, when the schema has a column the sink does not write.
    columns: Result<Columns, String>,
    /// The indices of the records appended as rows, in order.
    rows: Vec<usize>,
    refused: Vec<(usize, String)>,
}

impl Rows {
    /// Decodes record `r`, known as `i` (indices pushed in increasing order), into a
    /// row, or keeps why it cannot be one.
    pub fn push(&mut self, i: usize, r: &Record) {
        let why = match &mut self.columns {
            Err(why) => Some(why.clone()),
            Ok(columns) => match row_refusal(r) {
                Some(why) => Some(why),
                None => columns.append(&r.value).err().map(|e| e.to_string()),
            },
        };
        match why {
            Some(why) => self.refused.push((i, why)),
            None => self.rows.push(i),
        }
    }

    /// The rows of the records pushed, and the records that are none.
    pub fn finish(self) -> Decoded {
        let Rows {
            columns,
            rows,
            mut refused,
        } = self;
        match columns.and_then(Columns::finish) {
            Ok(decoded) => Decoded {
                rows: decoded,
                refused,
            },
            // Columns that Arrow finds invalid would make the whole file unreadable:
            // their records are refused instead.
            Err(why) => {
                refused.extend(rows.into_iter().map(|i| (i, why.clone())));
                refused.sort_by_key(|(i, _)| *i);
                Decoded {
                    rows: None,
                    refused,
                }
            }
        }
    }
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
    use arrow_schema::{DataType, Field, Schema};
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
    fn values_arrow_would_misread_are_refused_and_bytes_are_base64() {
        let format = ParquetFormat {
            schema: Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int64, false),
                Field::new("raw", DataType::Binary, true),
                Field::new("hash", DataType::FixedSizeBinary(2), true),
                Field::new(
                    "attrs",
                    DataType::Map(
                        Arc::new(Field::new(
                            "entries",
                            DataType::Struct(
                                vec![
                                    Field::new("key", DataType::Utf8, false),
                                    Field::new("value", DataType::Int64, false),
                                ]
                                .into(),
                            ),
                            false,
                        )),
                        false,
                    ),
                    true,
                ),
            ])),
            compression: Compression::SNAPPY,
        };
        let d = format.decode(&batch(&[
            r#"{"id":1,"raw":"AAH/","hash":"q80=","attrs":{"a":1}}"#,
            r#"{"id":2,"hash":5}"#,
            r#"{"id":3,"hash":"AAAA"}"#,
            r#"{"id":4,"raw":"not base64!"}"#,
            r#"{"id":5,"attrs":{"a":null}}"#,
            r#"{"id":6,}"#,
            r#"{"id":7}"#,
        ]));
        let refused: Vec<usize> = d.refused.iter().map(|(i, _)| *i).collect();
        assert_eq!(refused, vec![1, 2, 3, 4, 5], "{:?}", d.refused);
        assert!(d.refused[0].1.contains("hash"), "{:?}", d.refused[0]);
        assert!(d.refused[1].1.contains("3 bytes for a fixed size of 2"));
        assert!(d.refused[2].1.starts_with("raw: not base64"));
        let rows = d.rows.unwrap();
        assert_eq!(rows.num_rows(), 2);
        assert_eq!(rows.column(1).as_binary::<i32>().value(0), &[0, 1, 255]);
        assert_eq!(
            rows.column(2).as_fixed_size_binary().value(0),
            &[0xab, 0xcd]
        );
    }

    #[test]
    fn an_object_left_open_for_the_next_record_is_refused() {
        let d = format().decode(&batch(&[
            r#"{"id":1,"amount":1,"note":"x","#,
            r#""extra":2}{"id":2,"amount":2}"#,
            r#"{"id":3,"amount":3}"#,
        ]));
        let refused: Vec<usize> = d.refused.iter().map(|(i, _)| *i).collect();
        assert_eq!(refused, vec![0, 1], "{:?}", d.refused);
        assert_eq!(d.rows.unwrap().num_rows(), 1);
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
