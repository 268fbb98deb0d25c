//! `[sink.file]` as written in a job file, and the configuration it becomes.

use super::partition::PartitionTemplate;
use super::FileSink;
use crate::clients::kafka::KafkaCluster;
use crate::clients::store::S3Settings;
use crate::dead_letter::{Allowed, OnError};
use crate::error::Result;
use crate::formats::columnar::avro_arrow::arrow_schema_of_text;
use crate::formats::columnar::parquet::{compression, ParquetFormat, COMPRESSIONS};
use crate::secret::Secret;
use lockgate_state::store::{CheckpointLocation, StoreLocation};
use std::path::{Path, PathBuf};

/// Configuration of a file sink.
#[derive(Debug, Clone)]
pub struct FileSinkConfig {
    /// The local directory (for an object store, its URL as written).
    pub dir: PathBuf,
    /// The object store, when `dir` is a store URL (`s3://bucket/prefix`).
    pub store: Option<StoreLocation>,
    pub format: FileFormat,
    /// The folder of each record's part (`partition_by`); None: every part in `dir`.
    pub partition: Option<PartitionTemplate>,
    /// A part is also closed once it holds this many bytes (`roll_bytes`); always at
    /// each checkpoint's barrier. None: only at barriers.
    pub roll_bytes: Option<u64>,
    /// In an object store, where open parts are held in memory: once together they
    /// hold more than this, the largest are closed (put) until they hold at most half
    /// of it. [`STORE_MEMORY_BYTES`] from a job file.
    pub memory_bytes: u64,
    /// What a record the format cannot hold becomes (`on_item_error`): the job fails
    /// naming it (the default), or it is written to a dead-letter topic.
    pub on_item_error: OnError,
    /// The cluster of the dead letters (the source's), with a dead-letter policy.
    pub dead_letters: Option<KafkaCluster>,
}

impl FileSinkConfig {
    /// A sink of JSON lines into `dir`.
    pub fn json(dir: impl Into<PathBuf>) -> FileSinkConfig {
        FileSinkConfig {
            dir: dir.into(),
            store: None,
            format: FileFormat::Json,
            partition: None,
            roll_bytes: None,
            memory_bytes: STORE_MEMORY_BYTES,
            on_item_error: OnError::Fail,
            dead_letters: None,
        }
    }
}

/// The `roll_bytes` of a sink into an object store that sets none: a part is put
/// whole from memory, so memory holds at most this much per open part.
pub const STORE_ROLL_BYTES: u64 = 128 << 20;

/// What a subtask of a sink into an object store holds in memory in its open parts at
/// most (many `partition_by` folders open at once), past what one write adds.
pub const STORE_MEMORY_BYTES: u64 = 256 << 20;

/// The largest part an object store takes in one PUT and copies in one request (S3's
/// limit).
pub const STORE_MAX_PART: u64 = 5 << 30;

/// How records are written into a part file.
#[derive(Debug, Clone, PartialEq)]
pub enum FileFormat {
    /// One value per line; a delete as a line naming it ([`super::delete_line`]).
    Json,
    /// Columns by a schema, one Parquet file per part.
    Parquet(ParquetFormat),
}

impl FileFormat {
    /// The records of `batch` this format cannot hold, by index, with why, and the
    /// columns of the others (Parquet; none for JSON lines, which holds every record).
    pub fn decode(
        &self,
        batch: &crate::record::Batch,
    ) -> crate::formats::columnar::parquet::Decoded {
        match self {
            FileFormat::Json => crate::formats::columnar::parquet::Decoded::default(),
            FileFormat::Parquet(p) => p.decode(batch),
        }
    }

    /// Rows to decode one record at a time ([`super::parquet::ParquetFormat::rows`]);
    /// None for JSON lines, which holds every record as it is.
    pub fn rows(&self, capacity: usize) -> Option<super::parquet::Rows> {
        match self {
            FileFormat::Json => None,
            FileFormat::Parquet(p) => Some(p.rows(capacity)),
        }
    }

    /// The extension of the part files' names (empty for JSON lines, as before).
    pub fn extension(&self) -> &'static str {
        match self {
            FileFormat::Json => "",
            FileFormat::Parquet(_) => PARQUET_EXTENSION,
        }
    }
}

/// The extension of Parquet part files.
pub const PARQUET_EXTENSION: &str = ".parquet";

/// `[sink.file]` as written in a job file.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSection {
    dir: PathBuf,
    format: Option<String>,
    /// An Avro record schema: the columns of Parquet files.
    schema_file: Option<PathBuf>,
    /// Parquet's compression ([`COMPRESSIONS`]); default snappy.
    compression: Option<String>,
    /// `fail` (the default) or `dead-letter:<topic>`.
    on_item_error: Option<String>,
    /// Hive-style folders from record fields and times ([`PartitionTemplate`]).
    partition_by: Option<String>,
    /// A part is also closed at this size.
    roll_bytes: Option<u64>,
    /// The source's Avro schema and the key naming it: Parquet's columns when
    /// `schema_file` is not given ([`FileSection::with_source_schema`]).
    #[serde(skip)]
    source_schema: Option<crate::connector::section::SourceSchema>,
    /// S3 client settings of a store `dir`; each wins over its `AWS_*` variable.
    endpoint: Option<String>,
    region: Option<String>,
    allow_http: Option<bool>,
    access_key_id: Option<String>,
    secret_access_key: Option<Secret>,
    secret_access_key_file: Option<PathBuf>,
}

impl FileSection {
    /// Parquet's columns come from `schema` (a path and the key in full naming it: the
    /// source's Avro schema) when the section gives no `schema_file`.
    pub fn with_source_schema(
        mut self,
        schema: Option<crate::connector::section::SourceSchema>,
    ) -> FileSection {
        self.source_schema = schema;
        self
    }

    /// The sink's configuration, its paths resolved by `resolve` (against the job
    /// file's directory). An error is `(key, message)`.
    pub fn config(
        &self,
        resolve: &dyn Fn(&std::path::Path) -> PathBuf,
    ) -> Result<FileSinkConfig, (String, String)> {
        let err = |k: &str, m: String| (k.to_string(), m);
        let format = match self.format.as_deref().unwrap_or("json") {
            "json" => {
                if self.compression.is_some() {
                    return Err(err(
                        "compression",
                        "applies to format = \"parquet\" only".into(),
                    ));
                }
                FileFormat::Json
            }
            "parquet" => {
                let (path, named_by, millis) = match (&self.schema_file, &self.source_schema) {
                    (Some(p), _) => (resolve(p), String::new(), false),
                    (None, Some(s)) => (
                        s.path.clone(),
                        format!("the source's schema ({}) ", s.key),
                        s.times_in_millis,
                    ),
                    (None, None) => return Err(err(
                        "schema_file",
                        "format = \"parquet\" needs an Avro record schema: its fields are the columns (a source reading Avro by one schema gives its own when no transform comes before the sink)".into(),
                    )),
                };
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    err("schema_file", format!("{named_by}{}: {e}", path.display()))
                })?;
                let schema = arrow_schema_of_text(&text).map_err(|m| {
                    err("schema_file", format!("{named_by}{}: {m}", path.display()))
                })?;
                // The source hands on times as milliseconds: so the columns count.
                let schema = match millis {
                    true => crate::formats::columnar::avro_arrow::with_millisecond_times(&schema),
                    false => schema,
                };
                let name = self.compression.as_deref().unwrap_or("snappy");
                let compression = compression(name).ok_or_else(|| {
                    err(
                        "compression",
                        format!("`{name}` is not one of {COMPRESSIONS}"),
                    )
                })?;
                FileFormat::Parquet(ParquetFormat {
                    schema: std::sync::Arc::new(schema),
                    compression,
                })
            }
            other => {
                return Err(err(
                    "format",
                    format!("`{other}` is not supported (json | parquet)"),
                ))
            }
        };
        let settings = S3Settings {
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            allow_http: self.allow_http,
            access_key_id: self.access_key_id.clone(),
            secret_access_key: self.secret_access_key.clone(),
            secret_access_key_file: self.secret_access_key_file.clone(),
        };
        let text = self.dir.to_string_lossy();
        if let Some((scheme, rest)) = text.split_once(":/") {
            let schemelike = !scheme.is_empty()
                && scheme
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'.');
            if schemelike && !rest.starts_with('/') {
                return Err(err(
                    "dir",
                    format!("{text:?} looks like a store URL missing a slash ({scheme}://...)"),
                ));
            }
        }
        let (dir, store) = match CheckpointLocation::parse(&text).map_err(|m| err("dir", m))? {
            CheckpointLocation::Local(p) => {
                if let Some(k) = settings.first_set() {
                    return Err(err(
                        k,
                        "applies only to an object-store dir (s3://bucket/prefix)".into(),
                    ));
                }
                (resolve(&p), None)
            }
            CheckpointLocation::Store(s) => (self.dir.clone(), Some(settings.apply(s, resolve)?)),
        };
        let schema = match &format {
            FileFormat::Parquet(p) => Some(p.schema.as_ref()),
            FileFormat::Json => None,
        };
        let partition = self
            .partition_by
            .as_deref()
            .map(|t| PartitionTemplate::parse(t, schema))
            .transpose()
            .map_err(|m| err("partition_by", m))?;
        let roll_bytes = match (self.roll_bytes, &store) {
            (Some(0), _) => return Err(err("roll_bytes", "must be at least 1".into())),
            (Some(n), Some(_)) if n > STORE_MAX_PART => {
                return Err(err(
                    "roll_bytes",
                    format!(
                    "{n} is more than an object store takes in one part ({STORE_MAX_PART} bytes)"
                ),
                ))
            }
            (None, Some(_)) => Some(STORE_ROLL_BYTES),
            (n, _) => n,
        };
        Ok(FileSinkConfig {
            dir,
            store,
            format,
            partition,
            roll_bytes,
            memory_bytes: STORE_MEMORY_BYTES,
            on_item_error: OnError::Fail,
            dead_letters: None,
        })
    }
}

impl crate::connector::SinkSection for FileSection {
    fn prepare(
        self,
        cx: &crate::connector::SinkContext<'_>,
    ) -> Result<crate::connector::PreparedSink, crate::connector::KeyError> {
        // The source's schema describes the sink's records only if nothing between
        // them changes their shape.
        let source_schema = (cx.transforms == 0)
            .then(|| cx.source.value_schema.clone())
            .flatten();
        let mut cfg = self
            .clone()
            .with_source_schema(source_schema)
            .config(&|p: &Path| cx.section.resolve(p))?;
        // Columns and folders are read from JSON values: text or bytes records would
        // all be refused, one by one.
        let reads = match (&cfg.format, &cfg.partition) {
            (FileFormat::Parquet(_), _) => Some("format = \"parquet\""),
            (_, Some(p)) if p.reads_fields() => Some("partition_by with a field"),
            _ => None,
        };
        if let (Some(what), false) = (reads, cx.source.format == "json") {
            return Err(crate::connector::KeyError::absolute(
                format!("{} and sink.file", cx.source.format_key),
                format!(
                    "{what} reads JSON values, and format = {:?} gives none; use format = \"json\" (or \"avro\", \"protobuf\")",
                    cx.source.format
                ),
            ));
        }
        cfg.on_item_error = cx.section.error_policy(
            "on_item_error",
            self.on_item_error.as_deref(),
            Allowed::ITEM,
            "this job's source is not Kafka",
        )?;
        cfg.dead_letters = cx
            .section
            .dead_letter_cluster(
                "on_item_error",
                &cfg.on_item_error,
                "this job's source is not Kafka",
            )?
            .cloned();
        Ok(crate::connector::PreparedSink {
            spec: FileSink::spec(cfg.clone()),
            config: std::sync::Arc::new(cfg),
            reads_tombstones: false,
        })
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_schema_with_microsecond_times_gives_columns_holding_the_same_instants() {
        use apache_avro::types::Value;
        use arrow_array::cast::AsArray;
        use arrow_array::types::{Time32MillisecondType, TimestampMillisecondType};
        let avsc = r#"{"type":"record","name":"o","fields":[{"name":"at","type":{"type":"long","logicalType":"timestamp-micros"}},{"name":"t","type":{"type":"long","logicalType":"time-micros"}},{"name":"n","type":{"type":"record","name":"n","fields":[{"name":"ns","type":{"type":"long","logicalType":"timestamp-nanos"}}]}}]}"#;
        let micros = 1_714_564_800_123_456_i64; // 2024-05-01T12:00:00.123456Z
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("o.avsc");
        std::fs::write(&path, avsc).unwrap();
        let section = FileSection {
            dir: "out".into(),
            format: Some("parquet".into()),
            ..FileSection::default()
        }
        .with_source_schema(Some(crate::connector::section::SourceSchema {
            path,
            key: "source.kafka.schema_file".into(),
            times_in_millis: true,
        }));
        let cfg = section.config(&|p: &Path| p.to_path_buf()).unwrap();
        let FileFormat::Parquet(format) = &cfg.format else {
            panic!("{cfg:?}")
        };
        let schema = apache_avro::Schema::parse_str(avsc).unwrap();
        let value = Value::Record(vec![
            ("at".into(), Value::TimestampMicros(micros)),
            ("t".into(), Value::TimeMicros(43_200_123_456)),
            (
                "n".into(),
                Value::Record(vec![("ns".into(), Value::TimestampNanos(micros * 1000))]),
            ),
        ]);
        let datum = apache_avro::to_avro_datum(&schema, value).unwrap();
        let decoder = crate::formats::avro::AvroDecoder::parse(avsc, Default::default()).unwrap();
        let json = decoder.to_json(&datum).unwrap();
        let decoded = format.decode(&vec![crate::record::Record::from_value(json)]);
        assert!(decoded.refused.is_empty(), "{:?}", decoded.refused);
        let rows = decoded.rows.unwrap();
        // The source keeps milliseconds: the instant, to the millisecond.
        let at = rows.column(0).as_primitive::<TimestampMillisecondType>();
        assert_eq!(at.value(0), micros / 1000);
        let t = rows.column(1).as_primitive::<Time32MillisecondType>();
        assert_eq!(t.value(0), 43_200_123);
        let ns = rows.column(2).as_struct().column(0);
        assert_eq!(
            ns.as_primitive::<TimestampMillisecondType>().value(0),
            micros / 1000
        );
    }

    #[test]
    fn json_and_parquet_are_the_formats() {
        let section = |format: Option<&str>| FileSection {
            dir: "out".into(),
            format: format.map(str::to_string),
            ..FileSection::default()
        };
        let resolve = |p: &Path| Path::new("/jobs").join(p);
        assert_eq!(
            section(None).config(&resolve).unwrap().dir,
            Path::new("/jobs/out")
        );
        assert!(section(Some("json")).config(&resolve).is_ok());
        let (key, msg) = section(Some("csv")).config(&resolve).unwrap_err();
        assert_eq!(key, "format");
        assert!(msg.contains("`csv`"), "{msg}");
    }

    #[test]
    fn parquet_needs_a_record_schema_and_names_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let resolve = |p: &Path| dir.path().join(p);
        std::fs::write(
            dir.path().join("order.avsc"),
            r#"{"type":"record","name":"o","fields":[{"name":"id","type":"long"}]}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("bad.avsc"), r#""string""#).unwrap();
        let section = |schema: Option<&str>, compression: Option<&str>| FileSection {
            dir: "out".into(),
            format: Some("parquet".into()),
            schema_file: schema.map(PathBuf::from),
            compression: compression.map(str::to_string),
            ..FileSection::default()
        };
        let cfg = section(Some("order.avsc"), Some("zstd"))
            .config(&resolve)
            .unwrap();
        let FileFormat::Parquet(p) = &cfg.format else {
            panic!("{cfg:?}")
        };
        assert_eq!(p.schema.fields().len(), 1);
        assert_eq!(cfg.format.extension(), ".parquet");
        let key = |s: FileSection| s.config(&resolve).unwrap_err();
        assert_eq!(key(section(None, None)).0, "schema_file");
        let (k, m) = key(section(Some("bad.avsc"), None));
        assert_eq!(k, "schema_file");
        assert!(m.contains("bad.avsc") && m.contains("record"), "{m}");
        let (k, m) = key(section(Some("missing.avsc"), None));
        assert_eq!(k, "schema_file");
        assert!(m.contains("missing.avsc"), "{m}");
        let (k, m) = key(section(Some("order.avsc"), Some("lz4")));
        assert_eq!(k, "compression");
        assert!(m.contains("`lz4`") && m.contains("zstd"), "{m}");
        let json_with_compression = FileSection {
            compression: Some("zstd".into()),
            ..section(None, None)
        };
        let json_with_compression = FileSection {
            format: None,
            ..json_with_compression
        };
        assert_eq!(key(json_with_compression).0, "compression");
        let typo = FileSection {
            dir: "s3:/lake/orders".into(),
            ..FileSection::default()
        };
        let (k, m) = key(typo);
        assert_eq!(k, "dir");
        assert!(m.contains("missing a slash"), "{m}");
    }

    #[test]
    fn partition_by_and_roll_bytes_are_checked_when_loaded() {
        let resolve = |p: &Path| Path::new("/jobs").join(p);
        let section = |dir: &str, partition: Option<&str>, roll: Option<u64>| FileSection {
            dir: dir.into(),
            partition_by: partition.map(str::to_string),
            roll_bytes: roll,
            ..FileSection::default()
        };
        let cfg = section("out", Some("dt={/ts:%Y-%m-%d}"), Some(1 << 20))
            .config(&resolve)
            .unwrap();
        assert!(cfg.partition.is_some());
        assert_eq!(cfg.roll_bytes, Some(1 << 20));
        assert_eq!(
            section("out", None, None)
                .config(&resolve)
                .unwrap()
                .roll_bytes,
            None
        );
        assert_eq!(
            section("s3://lake/o", None, None)
                .config(&resolve)
                .unwrap()
                .roll_bytes,
            Some(STORE_ROLL_BYTES),
            "a store part is held in memory: it is bounded by default"
        );
        let (k, m) = section("out", Some("{/c}"), None)
            .config(&resolve)
            .unwrap_err();
        assert_eq!(k, "partition_by");
        assert!(m.contains("name=value"), "{m}");
        assert_eq!(
            section("out", None, Some(0))
                .config(&resolve)
                .unwrap_err()
                .0,
            "roll_bytes"
        );
        let (k, m) = section("s3://lake/o", None, Some(6 << 30))
            .config(&resolve)
            .unwrap_err();
        assert_eq!(k, "roll_bytes");
        assert!(m.contains("one part"), "{m}");
        assert!(section("out", None, Some(6 << 30)).config(&resolve).is_ok());
    }
}
