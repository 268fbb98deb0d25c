//! `[sink.iceberg]` as written in a job file, and the configuration it becomes.

use super::schema::{partition_parts, PartitionPart};
use crate::clients::kafka::KafkaCluster;
use crate::clients::store::S3Settings;
use crate::dead_letter::{Allowed, OnError};
use crate::formats::columnar::avro_arrow::{arrow_schema_of_text, with_millisecond_times};
use crate::formats::columnar::parquet::{compression, ParquetFormat, COMPRESSIONS};
use crate::secret::Secret;
use iceberg::{NamespaceIdent, TableIdent};
use lockgate_state::store::{CheckpointLocation, StoreLocation};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A data file is also closed at this size (and always at each barrier).
pub const ROLL_BYTES: u64 = 128 * 1024 * 1024;

/// The largest data file: each is written in one request (S3's limit for one PUT).
pub const MAX_FILE_BYTES: u64 = 5 * 1024 * 1024 * 1024;

/// Configuration of an Iceberg sink.
#[derive(Debug, Clone)]
pub struct IcebergConfig {
    pub catalog: CatalogConfig,
    pub table: TableIdent,
    /// The records' columns as the Avro schema gives them, and the compression.
    pub columns: ParquetFormat,
    /// The partition spec of a table the sink creates (`partition_by`).
    pub partition: Option<Vec<PartitionPart>>,
    /// A data file is also closed once it holds this many bytes.
    pub roll_bytes: u64,
    /// The object-store client settings of the table's files (None: the standard
    /// environment variables only, or a local warehouse).
    pub store: Option<StoreLocation>,
    pub on_item_error: OnError,
    pub dead_letters: Option<KafkaCluster>,
}

/// Which catalog keeps the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogConfig {
    pub kind: CatalogKind,
    /// The catalog's name (the SQL catalog keeps it in every row).
    pub name: String,
    /// Where new tables go (`s3://lake/warehouse`, a local directory as `file:///...`).
    pub warehouse: Option<String>,
}

/// The kinds of catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CatalogKind {
    /// The SQL catalog's tables in SQLite or PostgreSQL: `uri` as the database
    /// client takes it (see [`sql_uri`]).
    Sql { uri: String, postgres: bool },
    /// An Iceberg REST catalog at `uri`.
    Rest { uri: String },
}

/// `catalog = { ... }`.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogSection {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
    uri: String,
    warehouse: Option<String>,
}

/// `[sink.iceberg]` as written in a job file.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IcebergSection {
    catalog: CatalogSection,
    table: String,
    schema_file: Option<PathBuf>,
    partition_by: Option<String>,
    compression: Option<String>,
    roll_bytes: Option<u64>,
    on_item_error: Option<String>,
    #[serde(skip)]
    source_schema: Option<crate::connector::section::SourceSchema>,
    endpoint: Option<String>,
    region: Option<String>,
    allow_http: Option<bool>,
    access_key_id: Option<String>,
    secret_access_key: Option<Secret>,
    secret_access_key_file: Option<PathBuf>,
}

/// The database URL of the SQL catalog's `uri`, written as SQLAlchemy (and so
/// pyiceberg) writes it: `sqlite:////abs/path` (four slashes before an absolute path,
/// three before one relative to the job file), `postgresql[+driver]://...`. Returns
/// the URL and whether it is PostgreSQL.
pub fn sql_uri(uri: &str, resolve: &dyn Fn(&Path) -> PathBuf) -> Result<(String, bool), String> {
    if let Some(path) = uri.strip_prefix("sqlite:///") {
        if path.is_empty() || path == "/" {
            return Err("names no database file (sqlite:////absolute/path.db)".into());
        }
        let file = absolute(&resolve(Path::new(path)));
        // Created if missing: a new catalog starts empty.
        return Ok((format!("sqlite:{}?mode=rwc", file.display()), false));
    }
    if uri.starts_with("sqlite:") {
        return Err(format!(
            "`{uri}`: a SQLite catalog is sqlite:////absolute/path.db (or sqlite:///relative/path.db)"
        ));
    }
    let (scheme, rest) = uri.split_once("://").ok_or_else(|| {
        format!("`{uri}` is not a database URL (sqlite:////path.db, postgresql://...)")
    })?;
    match scheme.split('+').next() {
        Some("postgresql" | "postgres") => Ok((format!("postgresql://{rest}"), true)),
        _ => Err(format!(
            "`{scheme}://`: the SQL catalog is in SQLite or PostgreSQL"
        )),
    }
}

/// `p` from the root (a job file named by a relative path resolves relative paths
/// relative to the working directory): the catalog keeps the path for every process.
fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// A warehouse location: a store URL as written, a local directory as `file:///...`.
fn warehouse(text: &str, resolve: &dyn Fn(&Path) -> PathBuf) -> Result<String, String> {
    if let Some(p) = super::storage::local_path(text) {
        // `file:wh` is as relative as `wh`.
        return Ok(format!("file://{}", absolute(&resolve(&p)).display()));
    }
    match CheckpointLocation::parse(text)? {
        CheckpointLocation::Local(p) => Ok(format!("file://{}", absolute(&resolve(&p)).display())),
        CheckpointLocation::Store(_) => Ok(text.trim_end_matches('/').to_string()),
    }
}

impl IcebergSection {
    /// The sink's configuration, its paths resolved by `resolve`. An error is
    /// `(key, message)`.
    pub fn config(
        &self,
        resolve: &dyn Fn(&Path) -> PathBuf,
    ) -> Result<IcebergConfig, (String, String)> {
        let err = |k: &str, m: String| (k.to_string(), m);
        let c = &self.catalog;
        let name = c.name.clone().unwrap_or_else(|| "default".into());
        let kind = match c.kind.as_str() {
            "sql" => {
                let (uri, postgres) =
                    sql_uri(&c.uri, resolve).map_err(|m| err("catalog.uri", m))?;
                if c.warehouse.is_none() {
                    return Err(err("catalog.warehouse", "the SQL catalog needs a warehouse: where new tables go (s3://bucket/prefix, or a directory)".into()));
                }
                CatalogKind::Sql { uri, postgres }
            }
            "rest" => {
                if !(c.uri.starts_with("http://") || c.uri.starts_with("https://")) {
                    return Err(err(
                        "catalog.uri",
                        format!(
                            "`{}`: a REST catalog is reached by http:// or https://",
                            c.uri
                        ),
                    ));
                }
                CatalogKind::Rest { uri: c.uri.clone() }
            }
            other => {
                return Err(err(
                    "catalog.type",
                    format!("`{other}` is not a catalog (sql | rest)"),
                ))
            }
        };
        let warehouse = c
            .warehouse
            .as_deref()
            .map(|w| warehouse(w, resolve))
            .transpose()
            .map_err(|m| err("catalog.warehouse", m))?;
        let (namespace, table) = self
            .table
            .rsplit_once('.')
            .filter(|(n, t)| !n.is_empty() && !t.is_empty())
            .ok_or_else(|| err("table", format!("`{}` is not namespace.table", self.table)))?;
        let namespace = NamespaceIdent::from_strs(namespace.split('.'))
            .map_err(|e| err("table", e.to_string()))?;
        let (path, named_by, millis) = match (&self.schema_file, &self.source_schema) {
            (Some(p), _) => (resolve(p), String::new(), false),
            (None, Some(s)) => (s.path.clone(), format!("the source's schema ({}) ", s.key), s.times_in_millis),
            (None, None) => return Err(err(
                "schema_file",
                "the sink needs an Avro record schema: its fields are the table's columns (a source reading Avro by one schema gives its own when no transform comes before the sink)".into(),
            )),
        };
        let text = std::fs::read_to_string(&path)
            .map_err(|e| err("schema_file", format!("{named_by}{}: {e}", path.display())))?;
        let schema = arrow_schema_of_text(&text)
            .map_err(|m| err("schema_file", format!("{named_by}{}: {m}", path.display())))?;
        let schema = match millis {
            true => with_millisecond_times(&schema),
            false => schema,
        };
        // The table's schema must exist for these columns: checked here, not at start.
        super::schema::table_schema(&schema)
            .map_err(|m| err("schema_file", format!("{named_by}{}: {m}", path.display())))?;
        let codec = self.compression.as_deref().unwrap_or("zstd");
        let compression = compression(codec).ok_or_else(|| {
            err(
                "compression",
                format!("`{codec}` is not one of {COMPRESSIONS}"),
            )
        })?;
        let partition = self
            .partition_by
            .as_deref()
            .map(partition_parts)
            .transpose()
            .map_err(|m| err("partition_by", m))?;
        let roll_bytes = match self.roll_bytes {
            Some(0) => return Err(err("roll_bytes", "must be at least 1".into())),
            Some(n) if n > MAX_FILE_BYTES => {
                return Err(err(
                    "roll_bytes",
                    format!("{n} is more than one data file may hold ({MAX_FILE_BYTES} bytes: each is written in one request)"),
                ))
            }
            Some(n) => n,
            None => ROLL_BYTES,
        };
        let settings = S3Settings {
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            allow_http: self.allow_http,
            access_key_id: self.access_key_id.clone(),
            secret_access_key: self.secret_access_key.clone(),
            secret_access_key_file: self.secret_access_key_file.clone(),
        };
        let store = match warehouse.as_deref() {
            Some(w) if !w.starts_with("file://") => {
                let location = StoreLocation::parse(w).map_err(|m| err("catalog.warehouse", m))?;
                Some(settings.apply(location, resolve)?)
            }
            _ if settings.first_set().is_some() => {
                // A REST catalog's tables may be in a store it names: the settings
                // reach that store (S3 only).
                let location = StoreLocation::parse("s3://lockgate").expect("a store URL");
                Some(settings.apply(location, resolve)?)
            }
            _ => None,
        };
        Ok(IcebergConfig {
            catalog: CatalogConfig {
                kind,
                name,
                warehouse,
            },
            table: TableIdent::new(namespace, table.to_string()),
            columns: ParquetFormat {
                schema: Arc::new(schema),
                compression,
            },
            partition,
            roll_bytes,
            store,
            on_item_error: OnError::Fail,
            dead_letters: None,
        })
    }
}

impl crate::connector::SinkSection for IcebergSection {
    fn prepare(
        mut self,
        cx: &crate::connector::SinkContext<'_>,
    ) -> Result<crate::connector::PreparedSink, crate::connector::KeyError> {
        self.source_schema = (cx.transforms == 0)
            .then(|| cx.source.value_schema.clone())
            .flatten();
        let mut cfg = self.config(&|p: &Path| cx.section.resolve(p))?;
        if cx.source.format != "json" {
            return Err(crate::connector::KeyError::absolute(
                format!("{} and sink.iceberg", cx.source.format_key),
                format!(
                    "the Iceberg sink reads JSON values, and format = {:?} gives none; use format = \"json\" (or \"avro\", \"protobuf\")",
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
        let cfg = Arc::new(cfg);
        Ok(crate::connector::PreparedSink {
            spec: super::spec(cfg.clone()),
            config: cfg,
            reads_tombstones: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(p: &Path) -> PathBuf {
        Path::new("/jobs").join(p)
    }

    #[test]
    fn sql_uris_are_read_as_sqlalchemy_writes_them() {
        assert_eq!(
            sql_uri("sqlite:////var/lib/c.db", &resolve).unwrap(),
            ("sqlite:/var/lib/c.db?mode=rwc".to_string(), false)
        );
        assert_eq!(
            sql_uri("sqlite:///c.db", &resolve).unwrap(),
            ("sqlite:/jobs/c.db?mode=rwc".to_string(), false)
        );
        assert_eq!(
            sql_uri("postgresql+psycopg2://u@db/shop", &resolve).unwrap(),
            ("postgresql://u@db/shop".to_string(), true)
        );
        assert_eq!(
            sql_uri("postgres://u@db/shop", &resolve).unwrap(),
            ("postgresql://u@db/shop".to_string(), true)
        );
        for bad in [
            "sqlite:///",
            "sqlite:////",
            "sqlite:c.db",
            "mysql://db/x",
            "c.db",
            "postgresqlx://db/x",
        ] {
            assert!(sql_uri(bad, &resolve).is_err(), "{bad}");
        }
    }

    #[test]
    fn warehouses_are_store_urls_or_absolute_directories() {
        assert_eq!(
            warehouse("s3://lake/wh/", &resolve).unwrap(),
            "s3://lake/wh"
        );
        assert_eq!(warehouse("/data/wh", &resolve).unwrap(), "file:///data/wh");
        assert_eq!(warehouse("wh", &resolve).unwrap(), "file:///jobs/wh");
        assert_eq!(
            warehouse("file:///data/wh", &resolve).unwrap(),
            "file:///data/wh"
        );
        assert_eq!(warehouse("file:wh", &resolve).unwrap(), "file:///jobs/wh");
        assert_eq!(
            warehouse("file:/data/wh", &resolve).unwrap(),
            "file:///data/wh"
        );
    }
}
