//! Records as columns: JSON values decoded straight into Arrow arrays by an Arrow
//! schema (made from an Avro record schema), and written as Parquet. What the file
//! sink's Parquet parts and the Iceberg sink's data files are made of.
//!
//! - [`avro_arrow`]: an Avro record schema as the Arrow schema of the files.
//! - [`columns`]: each record's JSON text read once, into the column builders
//!   ([`json_text`] reads the text, [`values`] converts each value to its column's
//!   type, [`refusal`] says why a value does not fit).
//! - [`parquet`]: the Parquet format of a sink (columns and compression) and the
//!   decoding of a batch, with the records it refuses.

pub mod avro_arrow;
pub mod columns;
pub mod json_text;
pub mod parquet;
#[cfg(test)]
mod reference;
pub mod refusal;
pub mod values;
