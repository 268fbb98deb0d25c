//! The table's columns and partition spec from the job file: an Avro record schema
//! as an Iceberg schema (through the Parquet columns the file sink writes it as), and
//! `partition_by` as a partition spec.
//!
//! Iceberg counts times in microseconds: Avro's millisecond times become microsecond
//! columns, and rows are converted on the way ([`to_table_rows`]), the same instants.

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Fields, Schema as ArrowSchema, SchemaRef, TimeUnit};
use iceberg::spec::{Schema, Transform, UnboundPartitionSpec};
use std::sync::Arc;

/// The Iceberg schema of a new table whose rows are `columns` (the Parquet columns
/// of its Avro schema), field ids assigned in order.
pub fn table_schema(columns: &ArrowSchema) -> Result<Schema, String> {
    let micro = ArrowSchema::new(
        columns
            .fields()
            .iter()
            .map(|f| Arc::new(in_micros(f)))
            .collect::<Fields>(),
    );
    iceberg::arrow::arrow_schema_to_schema_auto_assign_ids(&micro).map_err(|e| e.to_string())
}

/// `f` with millisecond times as microsecond ones (Iceberg has no millisecond time).
fn in_micros(f: &Field) -> Field {
    let t = match f.data_type() {
        DataType::Timestamp(TimeUnit::Millisecond, tz) => {
            DataType::Timestamp(TimeUnit::Microsecond, tz.clone())
        }
        DataType::Time32(TimeUnit::Millisecond) => DataType::Time64(TimeUnit::Microsecond),
        DataType::Struct(fields) => {
            DataType::Struct(fields.iter().map(|c| Arc::new(in_micros(c))).collect())
        }
        DataType::List(item) => DataType::List(Arc::new(in_micros(item))),
        DataType::Map(entries, sorted) => DataType::Map(Arc::new(in_micros(entries)), *sorted),
        other => other.clone(),
    };
    f.clone().with_data_type(t)
}

/// One folder level of `partition_by` as a partition field: its name, the column's
/// path (`a.b`) and the transform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionPart {
    pub name: String,
    pub column: String,
    pub transform: Transform,
}

/// What `partition_by` may say for a table: `name={/column}` (identity) or
/// `name={/column:FORMAT}` with FORMAT one of these, levels separated by `/`.
pub const TIME_FORMATS: &str = "%Y (year), %Y-%m (month), %Y-%m-%d (day), %Y-%m-%d-%H (hour)";

/// Reads `partition_by` as partition fields (see [`TIME_FORMATS`]).
pub fn partition_parts(text: &str) -> Result<Vec<PartitionPart>, String> {
    let mut parts: Vec<PartitionPart> = Vec::new();
    // Pointers contain `/`: a level is `name={...}` up to its closing brace.
    let mut rest = text.trim_matches('/');
    while !rest.is_empty() {
        let (name, after) = rest.split_once("={").ok_or_else(|| {
            format!("`{rest}`: each level is name={{/column}} or name={{/column:FORMAT}}")
        })?;
        let (inner, tail) = after
            .split_once('}')
            .ok_or_else(|| format!("`{rest}`: a `{{` without its `}}`"))?;
        if name.is_empty() || name.contains(['/', '=', '{', '}']) {
            return Err(format!("`{name}` is not a partition field name"));
        }
        let (pointer, format) = match inner.split_once(':') {
            Some((p, f)) => (p, Some(f)),
            None => (inner, None),
        };
        let column = pointer
            .strip_prefix('/')
            .filter(|c| !c.is_empty())
            .ok_or_else(|| format!("`{{{inner}}}`: a column is named by a JSON pointer (/column)"))?
            .replace('/', ".");
        let transform = match format {
            None => Transform::Identity,
            Some("%Y") => Transform::Year,
            Some("%Y-%m") => Transform::Month,
            Some("%Y-%m-%d") => Transform::Day,
            Some("%Y-%m-%d-%H") => Transform::Hour,
            Some(other) => {
                return Err(format!(
                    "`{other}`: a table's partition is by one of {TIME_FORMATS}"
                ))
            }
        };
        if parts.iter().any(|p| p.name == name) {
            return Err(format!("the partition field `{name}` is given twice"));
        }
        parts.push(PartitionPart {
            name: name.to_string(),
            column,
            transform,
        });
        rest = match tail {
            "" => "",
            t => t.strip_prefix('/').ok_or_else(|| {
                format!("`{t}`: after a level's `}}` comes `/` and the next level")
            })?,
        };
    }
    if parts.is_empty() {
        return Err("names no partition field".into());
    }
    Ok(parts)
}

/// The partition spec of `parts` over `schema`; an error names the column missing.
pub fn partition_spec(
    parts: &[PartitionPart],
    schema: &Schema,
) -> Result<UnboundPartitionSpec, String> {
    let mut spec = UnboundPartitionSpec::builder();
    for p in parts {
        let field = schema
            .field_by_name(&p.column)
            .ok_or_else(|| format!("`{}` is not a column of the table", p.column))?;
        spec = spec
            .add_partition_field(field.id, p.name.clone(), p.transform)
            .map_err(|e| e.to_string())?;
    }
    Ok(spec.build())
}

/// Whether the table's spec is `parts` (a table made elsewhere may be partitioned
/// otherwise: then `partition_by` must say so, or be left out).
pub fn same_partitioning(
    parts: &[PartitionPart],
    table: &iceberg::spec::PartitionSpec,
    schema: &Schema,
) -> bool {
    table.fields().len() == parts.len()
        && table.fields().iter().zip(parts).all(|(f, p)| {
            f.name == p.name
                && f.transform == p.transform
                && schema.field_by_name(&p.column).map(|c| c.id) == Some(f.source_id)
        })
}

/// `rows` (decoded by the sink's Avro columns) as rows of the table's Arrow schema
/// `table`: columns matched by name, each converted to the table's type (times to
/// microseconds, field ids in nested types). An error names the column.
pub fn to_table_rows(rows: &RecordBatch, table: &SchemaRef) -> Result<RecordBatch, String> {
    let columns = table
        .fields()
        .iter()
        .map(|f| {
            let column: ArrayRef = match rows.column_by_name(f.name()) {
                Some(c) => c.clone(),
                None if f.is_nullable() => {
                    arrow_array::new_null_array(f.data_type(), rows.num_rows())
                }
                None => {
                    return Err(format!(
                        "the table's required column `{}` is not in the schema",
                        f.name()
                    ))
                }
            };
            if column.data_type() == f.data_type() {
                return Ok(column);
            }
            // Not the lenient cast, which makes a value it cannot convert (a time
            // past the microseconds' range) a null without a word.
            let strict = arrow_cast::CastOptions {
                safe: false,
                ..Default::default()
            };
            arrow_cast::cast_with_options(&column, f.data_type(), &strict)
                .map_err(|e| format!("column `{}`: {e}", f.name()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(table.clone(), columns).map_err(|e| e.to_string())
}

/// [`to_table_rows`] of the rows that can be table rows, and the others by index in
/// `rows`, with why: one row the table cannot take refuses that row, not its batch.
/// No rows (None) when none can be.
pub fn to_table_rows_each(
    rows: &RecordBatch,
    table: &SchemaRef,
) -> (Option<RecordBatch>, Vec<(usize, String)>) {
    let whole = match to_table_rows(rows, table) {
        Ok(out) => return (Some(out), Vec::new()),
        Err(why) => why,
    };
    let mut refused = Vec::new();
    let keep: arrow_array::BooleanArray = (0..rows.num_rows())
        .map(|i| match to_table_rows(&rows.slice(i, 1), table) {
            Ok(_) => Some(true),
            Err(why) => {
                refused.push((i, why));
                Some(false)
            }
        })
        .collect();
    let kept = arrow_select::filter::filter_record_batch(rows, &keep)
        .map_err(|e| e.to_string())
        .and_then(|kept| to_table_rows(&kept, table));
    match kept {
        Ok(kept) if kept.num_rows() > 0 => (Some(kept), refused),
        Ok(_) => (None, refused),
        // The rows go one by one and not together: none is taken.
        Err(_) => (
            None,
            (0..rows.num_rows()).map(|i| (i, whole.clone())).collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::columnar::avro_arrow::arrow_schema_of_text;

    const ORDER: &str = r#"{"type":"record","name":"order","fields":[
        {"name":"id","type":"long"},
        {"name":"country","type":["null","string"]},
        {"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},
        {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":12,"scale":2}},
        {"name":"lines","type":{"type":"array","items":{"type":"record","name":"line","fields":[{"name":"sku","type":"string"},{"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}}]}}}]}"#;

    #[test]
    fn an_avro_schema_gives_a_table_in_microseconds_with_ids() {
        let columns = arrow_schema_of_text(ORDER).unwrap();
        let schema = table_schema(&columns).unwrap();
        let ts = schema.field_by_name("ts").unwrap();
        assert_eq!(ts.field_type.to_string(), "timestamptz");
        assert!(ts.required);
        assert!(!schema.field_by_name("country").unwrap().required);
        assert_eq!(
            schema
                .field_by_name("amount")
                .unwrap()
                .field_type
                .to_string(),
            "decimal(12, 2)"
        );
        assert_eq!(
            schema
                .field_by_name("lines.element.at")
                .unwrap()
                .field_type
                .to_string(),
            "timestamptz"
        );
        let ids: std::collections::BTreeSet<i32> =
            schema.field_id_to_name_map().keys().copied().collect();
        assert_eq!(
            ids.len(),
            schema.field_id_to_name_map().len(),
            "ids are distinct"
        );
    }

    #[test]
    fn partition_by_reads_as_identity_and_time_transforms() {
        let parts = partition_parts("dt={/ts:%Y-%m-%d}/country={/country}").unwrap();
        assert_eq!(
            parts,
            vec![
                PartitionPart {
                    name: "dt".into(),
                    column: "ts".into(),
                    transform: Transform::Day
                },
                PartitionPart {
                    name: "country".into(),
                    column: "country".into(),
                    transform: Transform::Identity
                },
            ]
        );
        let hour = &partition_parts("h={/a/b:%Y-%m-%d-%H}").unwrap()[0];
        assert_eq!(
            (hour.column.as_str(), hour.transform),
            ("a.b", Transform::Hour)
        );
        // Slashes around the levels, as in a folder template, are no level.
        assert_eq!(
            partition_parts("/dt={/ts:%Y-%m-%d}/").unwrap(),
            partition_parts("dt={/ts:%Y-%m-%d}").unwrap()
        );
        assert_eq!(
            partition_parts("m={/ts:%Y-%m}").unwrap()[0].transform,
            Transform::Month
        );
        assert_eq!(
            partition_parts("y={/ts:%Y}").unwrap()[0].transform,
            Transform::Year
        );
        for bad in [
            "dt={/ts:%d}",
            "dt=x{/ts}",
            "dt={ts}",
            "={/ts}",
            "a={/x}/a={/y}",
            "",
            "dt={/ts",
            "a/b={/x}",
            "dt={/}",
            "dt={/ts}x",
        ] {
            assert!(partition_parts(bad).is_err(), "{bad} is refused");
        }
    }

    #[test]
    fn the_spec_names_columns_of_the_table_and_is_compared_by_field() {
        let schema = table_schema(&arrow_schema_of_text(ORDER).unwrap()).unwrap();
        let parts = partition_parts("dt={/ts:%Y-%m-%d}/country={/country}").unwrap();
        let spec = partition_spec(&parts, &schema)
            .unwrap()
            .bind(schema.clone())
            .unwrap();
        assert!(same_partitioning(&parts, &spec, &schema));
        let other = partition_parts("dt={/ts:%Y-%m}/country={/country}").unwrap();
        assert!(!same_partitioning(&other, &spec, &schema));
        let missing = partition_parts("x={/nope}").unwrap();
        assert!(partition_spec(&missing, &schema)
            .unwrap_err()
            .contains("nope"));
    }

    #[test]
    fn rows_become_the_table_s_with_the_same_instants() {
        use arrow_array::cast::AsArray;
        use arrow_array::types::TimestampMicrosecondType;
        let avsc = r#"{"type":"record","name":"o","fields":[{"name":"id","type":"long"},{"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}}]}"#;
        let columns = Arc::new(arrow_schema_of_text(avsc).unwrap());
        let table = Arc::new(
            iceberg::arrow::schema_to_arrow_schema(&table_schema(&columns).unwrap()).unwrap(),
        );
        let format = crate::formats::columnar::parquet::ParquetFormat {
            schema: columns,
            compression: parquet::basic::Compression::UNCOMPRESSED,
        };
        let batch: crate::record::Batch = vec![crate::record::Record::from_value(
            &br#"{"id":1,"ts":1714564800123}"#[..],
        )];
        let rows = format.decode(&batch).rows.unwrap();
        let out = to_table_rows(&rows, &table).unwrap();
        let ts = out.column(1).as_primitive::<TimestampMicrosecondType>();
        assert_eq!(ts.value(0), 1_714_564_800_123_000);
        assert!(out
            .schema()
            .field(0)
            .metadata()
            .contains_key("PARQUET:field_id"));
    }

    #[test]
    fn a_time_past_the_microseconds_range_refuses_its_row_alone() {
        use arrow_array::cast::AsArray;
        use arrow_array::types::{Int64Type, TimestampMicrosecondType};
        use arrow_array::Array;
        let avsc = r#"{"type":"record","name":"o","fields":[{"name":"id","type":"long"},{"name":"ts","type":["null",{"type":"long","logicalType":"timestamp-millis"}]}]}"#;
        let columns = Arc::new(arrow_schema_of_text(avsc).unwrap());
        let table = Arc::new(
            iceberg::arrow::schema_to_arrow_schema(&table_schema(&columns).unwrap()).unwrap(),
        );
        let format = crate::formats::columnar::parquet::ParquetFormat {
            schema: columns,
            compression: parquet::basic::Compression::UNCOMPRESSED,
        };
        let batch: crate::record::Batch = [
            r#"{"id":1,"ts":1714564800123}"#,
            r#"{"id":2,"ts":9000000000000000000}"#,
            r#"{"id":3,"ts":null}"#,
        ]
        .iter()
        .map(|v| crate::record::Record::from_value(v.as_bytes().to_vec()))
        .collect();
        let rows = format.decode(&batch).rows.unwrap();
        assert!(
            to_table_rows(&rows, &table).is_err(),
            "never a null in its place"
        );
        let (out, refused) = to_table_rows_each(&rows, &table);
        let out = out.unwrap();
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].0, 1);
        assert!(refused[0].1.contains("`ts`"), "{}", refused[0].1);
        assert_eq!(
            out.column(0).as_primitive::<Int64Type>().values().to_vec(),
            vec![1, 3]
        );
        let ts = out.column(1).as_primitive::<TimestampMicrosecondType>();
        assert_eq!(ts.value(0), 1_714_564_800_123_000);
        assert!(ts.is_null(1), "a null stays a null");
    }
}
