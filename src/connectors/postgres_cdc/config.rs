//! `[source.postgres_cdc]`: the section as written, and the configuration the source
//! runs with.

use crate::clients::postgres::{Endpoint, EndpointKeys};
use crate::connector::{KeyError, PreparedSource, SectionContext, SourceFacts, SourceSection};
use crate::secret::UrlText;
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::Arc;

/// Whether the tables' current rows come first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotMode {
    /// The tables' rows (op `r`), then the changes after them, with no gap and no
    /// overlap.
    Initial,
    /// Only the changes from the slot's position on.
    Never,
}

/// A table as the job file names it: `schema.table`, each part as stored in the
/// catalog (case kept, no quotes).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TableName {
    pub schema: String,
    pub name: String,
}

impl TableName {
    /// `schema.table`: the stream name of the table's records.
    pub fn stream(&self) -> String {
        format!("{}.{}", self.schema, self.name)
    }

    /// The table as SQL names it (both parts quoted).
    pub fn sql(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.name))
    }

    fn parse(text: &str) -> Result<TableName, String> {
        match text.split_once('.') {
            Some((schema, name)) if !schema.is_empty() && !name.is_empty() && !name.contains('.') => {
                Ok(TableName {
                    schema: schema.into(),
                    name: name.into(),
                })
            }
            _ => Err(format!(
                "`{text}` is not schema.table (write public.{text} for a table of the public schema)"
            )),
        }
    }
}

/// `name` as an SQL identifier, quoted.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `text` as an SQL string literal (`standard_conforming_strings` is on in every
/// session of the source).
pub fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// The configuration of a change data capture source.
#[derive(Debug, Clone)]
pub struct CdcConfig {
    pub endpoint: Endpoint,
    /// The tables, sorted and without repeats.
    pub tables: Vec<TableName>,
    pub slot: String,
    pub publication: String,
    pub snapshot: SnapshotMode,
    /// How often, while no change arrives, the source writes a heartbeat into the WAL
    /// so that its position (and the slot's) advances; 0: never.
    pub heartbeat_ms: u64,
    /// Rows per query of the initial snapshot.
    pub snapshot_chunk_rows: u64,
    /// A transaction of more changes than this is passed on in parts, so that a
    /// barrier may fall inside it; smaller ones are never split.
    pub transaction_buffer_records: usize,
    /// `bounded = "latest"`: read the changes committed before the job first
    /// started (and the snapshot), then finish.
    pub bounded: bool,
    /// The job's name: sessions are named after it.
    pub job: String,
}

/// `[source.postgres_cdc]` as written in a job file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CdcSection {
    url: UrlText,
    password_file: Option<PathBuf>,
    sslmode: Option<String>,
    ca_cert: Option<PathBuf>,
    connect_timeout_ms: Option<u64>,
    tables: Vec<String>,
    slot: String,
    publication: String,
    snapshot: Option<String>,
    heartbeat_ms: Option<u64>,
    snapshot_chunk_rows: Option<u64>,
    transaction_buffer_records: Option<usize>,
    bounded: Option<String>,
}

/// PostgreSQL's rule for a replication slot's name.
fn slot_name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

impl CdcSection {
    /// The source's configuration; an error names the key.
    pub fn config(&self, cx: &SectionContext) -> Result<CdcConfig, KeyError> {
        let endpoint = Endpoint::from_keys(
            EndpointKeys {
                url: &self.url.0,
                password_file: self.password_file.as_deref(),
                sslmode: self.sslmode.as_deref(),
                ca_cert: self.ca_cert.as_deref(),
                connect_timeout_ms: self.connect_timeout_ms,
            },
            |p| cx.resolve(p),
        )?;
        if self.tables.is_empty() {
            return Err(KeyError::new(
                "tables",
                "names no table: tables = [\"public.orders\"]",
            ));
        }
        let mut tables = self
            .tables
            .iter()
            .map(|t| TableName::parse(t))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| KeyError::new("tables", e))?;
        tables.sort();
        if let Some(w) = tables.windows(2).find(|w| w[0] == w[1]) {
            return Err(KeyError::new(
                "tables",
                format!("`{}` is named twice", w[0].stream()),
            ));
        }
        if !slot_name_ok(&self.slot) {
            return Err(KeyError::new(
                "slot",
                format!(
                    "`{}` is not a replication slot's name: at most 63 lower-case letters, digits and underscores",
                    self.slot
                ),
            ));
        }
        if self.publication.is_empty() || self.publication.len() > 63 {
            return Err(KeyError::new(
                "publication",
                "a publication's name has 1 to 63 bytes",
            ));
        }
        let snapshot = match self.snapshot.as_deref().unwrap_or("initial") {
            "initial" => SnapshotMode::Initial,
            "never" => SnapshotMode::Never,
            other => {
                return Err(KeyError::new(
                    "snapshot",
                    format!("`{other}` is not one of initial, never"),
                ))
            }
        };
        let snapshot_chunk_rows = self.snapshot_chunk_rows.unwrap_or(10_000);
        if snapshot_chunk_rows == 0 {
            return Err(KeyError::new("snapshot_chunk_rows", "must be at least 1"));
        }
        let transaction_buffer_records = self.transaction_buffer_records.unwrap_or(10_000);
        if transaction_buffer_records == 0 {
            return Err(KeyError::new(
                "transaction_buffer_records",
                "must be at least 1",
            ));
        }
        let bounded = match self.bounded.as_deref() {
            None => false,
            Some("latest") => true,
            Some(other) => {
                return Err(KeyError::new(
                    "bounded",
                    format!("`{other}` is not latest (the WAL position when the job first starts)"),
                ))
            }
        };
        Ok(CdcConfig {
            endpoint,
            bounded,
            tables,
            slot: self.slot.clone(),
            publication: self.publication.clone(),
            snapshot,
            heartbeat_ms: self.heartbeat_ms.unwrap_or(10_000),
            snapshot_chunk_rows,
            transaction_buffer_records,
            job: cx.job_name.clone(),
        })
    }
}

impl SourceSection for CdcSection {
    fn prepare(self, cx: &SectionContext) -> Result<PreparedSource, KeyError> {
        let cfg = self.config(cx)?;
        let mut facts = SourceFacts::json(super::KIND);
        facts.format_key = "source.postgres_cdc".into();
        // A snapshot read again after a restore reads the rows as they are then: the
        // n-th row of a replay need not be the n-th of the first reading, so a
        // position names no record that a replay gives again. Records are named by
        // their key instead.
        facts.without_coordinates =
            Some("change events of PostgreSQL tables (ids by key: id = \"key\")".into());
        facts.not_split_keyed = Some(format!(
            "the PostgreSQL change data capture source reads every table through one slot: {}",
            crate::connector::section::CO_PARTITIONED_FIX
        ));
        Ok(PreparedSource {
            facts,
            config: Arc::new(cfg.clone()),
            build: Box::new(move |_| super::source::CdcSource::spec(Arc::new(cfg))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cx() -> SectionContext {
        SectionContext {
            job_name: "j".into(),
            base_dir: PathBuf::from("/jobs"),
            parallelism: 1,
            max_parallelism: 128,
            checkpoint_timeout_ms: 60_000,
            formats: Default::default(),
            source_kafka: None,
            event_time: false,
        }
    }

    fn section(extra: &str) -> Result<CdcConfig, KeyError> {
        let text = format!(
            "url = \"postgresql://u@h/db\"\ntables = [\"public.b\", \"public.a\"]\nslot = \"s\"\npublication = \"p\"\n{extra}"
        );
        toml::from_str::<CdcSection>(&text).unwrap().config(&cx())
    }

    #[test]
    fn defaults_and_sorted_tables() {
        let c = section("").unwrap();
        assert_eq!(c.snapshot, SnapshotMode::Initial);
        assert_eq!(c.heartbeat_ms, 10_000);
        assert_eq!(
            c.tables.iter().map(TableName::stream).collect::<Vec<_>>(),
            ["public.a", "public.b"]
        );
        assert_eq!(c.tables[0].sql(), "\"public\".\"a\"");
    }

    #[test]
    fn each_bad_key_is_named() {
        let key = |extra: &str, text: &str| {
            let e = toml::from_str::<CdcSection>(&format!(
                "url = \"postgresql://u@h/db\"\nslot = \"s\"\npublication = \"p\"\n{extra}{text}"
            ))
            .unwrap()
            .config(&cx())
            .unwrap_err();
            (e.key, e.message)
        };
        let t = "tables = [\"public.a\"]\n";
        assert_eq!(key("tables = [\"a\"]\n", "").0, "tables");
        assert!(key("tables = [\"a\"]\n", "").1.contains("public.a"));
        assert_eq!(
            key("tables = [\"public.a\", \"public.a\"]\n", "").0,
            "tables"
        );
        assert_eq!(key("tables = []\n", "").0, "tables");
        assert_eq!(key(t, "snapshot = \"sometimes\"").0, "snapshot");
        assert_eq!(key(t, "snapshot_chunk_rows = 0").0, "snapshot_chunk_rows");
        assert_eq!(
            key(t, "transaction_buffer_records = 0").0,
            "transaction_buffer_records"
        );
        assert_eq!(key(t, "sslmode = \"always\"").0, "sslmode");
        assert_eq!(key(t, "bounded = \"earliest\"").0, "bounded");
        let e = toml::from_str::<CdcSection>(
            "url = \"postgresql://u@h/db\"\nslot = \"Bad-Slot\"\npublication = \"p\"\ntables = [\"public.a\"]",
        )
        .unwrap()
        .config(&cx())
        .unwrap_err();
        assert_eq!(e.key, "slot");
    }

    #[test]
    fn quoting() {
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
    }
}
