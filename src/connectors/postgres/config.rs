//! `[sink.postgres]`: the section as written, and the configuration the sink runs with.

use crate::clients::postgres::{Endpoint, EndpointKeys};
use crate::connector::{KeyError, PreparedSink, SinkContext, SinkSection};
use crate::dead_letter::{Allowed, OnError};
use crate::secret::UrlText;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// How the rows reach the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `INSERT ... ON CONFLICT (key) DO UPDATE`: each key's row becomes its last record.
    Upsert,
    /// `INSERT`: one row per record.
    Insert,
}

/// What a completed checkpoint guarantees about the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Each checkpoint's rows in one transaction, prepared at the barrier and committed
    /// (`COMMIT PREPARED`) once the checkpoint completes: every record exactly once.
    TwoPhase,
    /// Each checkpoint's rows committed at the barrier; a replay after a crash writes
    /// the same rows again (upsert only): the table's final state is exact.
    Idempotent,
}

/// Where a written column's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The value at a JSON pointer of the record (`""`: the whole record).
    Pointer(String),
    /// The whole record, as JSON (`jsonb_column`).
    Record,
}

/// The configuration of a Postgres sink.
#[derive(Debug, Clone)]
pub struct PgConfig {
    /// The server and how to log in.
    pub endpoint: Endpoint,
    /// The table as written (`user_totals`, `app.user_totals`, `"Mixed"`): resolved
    /// by the server's rules (`to_regclass`) at open.
    pub table: String,
    pub mode: Mode,
    /// The conflict columns (upsert) and the columns a delete matches.
    pub key: Vec<String>,
    /// The columns written and where each value comes from; `None`: every column of
    /// the table, from the record's top-level field of its name.
    pub columns: Option<Vec<(String, Source)>>,
    pub delivery: Delivery,
    pub batch_max_rows: usize,
    /// What a record that makes no change becomes (`on_item_error`).
    pub on_item_error: OnError,
    /// The source's Kafka cluster, where dead letters go (`None` unless
    /// `on_item_error` writes them).
    pub dead_letter_kafka: Option<(String, crate::secret::Properties)>,
    /// The job's name: prepared transactions are named after it.
    pub job: String,
    /// How long a statement may wait for a row lock (the job's checkpoint timeout: a
    /// lock held longer would time the checkpoint out anyway).
    pub lock_timeout_ms: u64,
    /// The first transform before the sink that keeps state per key (`rolling_sum`,
    /// `window`), if any: it keys records by their text, which an upsert's key column
    /// of a numeric type does not (see [`super::table::layout`]).
    pub keyed_before: Option<String>,
}

/// `[sink.postgres]` as written in a job file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgSection {
    url: UrlText,
    password_file: Option<PathBuf>,
    table: String,
    mode: Option<String>,
    #[serde(default)]
    key: Vec<String>,
    columns: Option<BTreeMap<String, String>>,
    jsonb_column: Option<String>,
    exactly_once: Option<String>,
    batch_max_rows: Option<usize>,
    sslmode: Option<String>,
    ca_cert: Option<PathBuf>,
    on_item_error: Option<String>,
    connect_timeout_ms: Option<u64>,
}

type KeyResult<T> = Result<T, KeyError>;

/// The longest job name whose transaction names fit PostgreSQL's 200 bytes
/// (`lockgate:<job>:<subtask>:<checkpoint>`, with room for both numbers).
pub const MAX_JOB_NAME: usize = 160;

impl PgSection {
    /// The sink's configuration for job `job`, paths resolved against `base`.
    pub fn config(&self, cx: &SinkContext<'_>) -> KeyResult<PgConfig> {
        let mode = match self.mode.as_deref().unwrap_or("insert") {
            "upsert" => Mode::Upsert,
            "insert" => Mode::Insert,
            other => {
                return Err(KeyError::new(
                    "mode",
                    format!("`{other}` is not one of upsert, insert"),
                ))
            }
        };
        let delivery = match self.exactly_once.as_deref().unwrap_or("two-phase") {
            "two-phase" => Delivery::TwoPhase,
            "idempotent" => Delivery::Idempotent,
            other => {
                return Err(KeyError::new(
                    "exactly_once",
                    format!("`{other}` is not one of two-phase, idempotent"),
                ))
            }
        };
        if mode == Mode::Upsert && self.key.is_empty() {
            return Err(KeyError::new(
                "key",
                "mode = \"upsert\" needs the conflict columns: key = [\"id\"]",
            ));
        }
        if delivery == Delivery::Idempotent && mode != Mode::Upsert {
            return Err(KeyError::new(
                "exactly_once and mode",
                "exactly_once = \"idempotent\" rewrites the same rows on a replay, which only mode = \"upsert\" does (an insert would add them again): use mode = \"upsert\" with a key, or exactly_once = \"two-phase\"",
            ));
        }
        if let Some(dup) = self
            .key
            .iter()
            .enumerate()
            .find_map(|(i, k)| self.key[..i].contains(k).then_some(k))
        {
            return Err(KeyError::new("key", format!("`{dup}` is named twice")));
        }
        let columns = self.columns(&self.key)?;
        let endpoint = Endpoint::from_keys(
            EndpointKeys {
                url: &self.url.0,
                password_file: self.password_file.as_deref(),
                sslmode: self.sslmode.as_deref(),
                ca_cert: self.ca_cert.as_deref(),
                connect_timeout_ms: self.connect_timeout_ms,
            },
            |p| cx.section.resolve(p),
        )?;
        let on_item_error = match &self.on_item_error {
            Some(p) => {
                OnError::parse(p, Allowed::ITEM).map_err(|e| KeyError::new("on_item_error", e))?
            }
            None => OnError::Fail,
        };
        let dead_letter_kafka = cx
            .section
            .dead_letter_cluster(
                "on_item_error",
                &on_item_error,
                "this job's source is not Kafka",
            )?
            .map(|k| (k.bootstrap_servers.clone(), k.properties.clone()));
        let job = &cx.section.job_name;
        if job.len() > MAX_JOB_NAME {
            return Err(KeyError::absolute(
                "job.name",
                format!(
                    "the Postgres sink names its prepared transactions after the job, and PostgreSQL takes names of 200 bytes: use a job name of at most {MAX_JOB_NAME} bytes"
                ),
            ));
        }
        let batch_max_rows = self.batch_max_rows.unwrap_or(5000);
        if batch_max_rows == 0 {
            return Err(KeyError::new("batch_max_rows", "must be at least 1"));
        }
        if cx.source.format != "json" {
            return Err(KeyError::absolute(
                format!("{} and sink.postgres", cx.source.format_key),
                format!(
                    "format = {:?} cannot feed the Postgres sink, which reads columns from JSON objects; use format = \"json\"",
                    cx.source.format
                ),
            ));
        }
        Ok(PgConfig {
            endpoint,
            table: self.table.clone(),
            mode,
            key: self.key.clone(),
            columns,
            delivery,
            batch_max_rows,
            on_item_error,
            dead_letter_kafka,
            job: job.clone(),
            lock_timeout_ms: cx.section.checkpoint_timeout_ms.max(1000),
            keyed_before: cx.stateful_transforms.first().cloned(),
        })
    }

    /// The written columns: `columns` (each a JSON pointer), with `jsonb_column`
    /// taking the whole record; `jsonb_column` alone writes the key columns from the
    /// fields of their names beside it; neither: `None` (every column of the table).
    fn columns(&self, key: &[String]) -> KeyResult<Option<Vec<(String, Source)>>> {
        let mut out: Vec<(String, Source)> = Vec::new();
        if let Some(cols) = &self.columns {
            if cols.is_empty() {
                return Err(KeyError::new(
                    "columns",
                    "names no column: leave it out to write every column of the table",
                ));
            }
            for (name, p) in cols {
                if !p.is_empty() && !p.starts_with('/') {
                    return Err(KeyError::new(
                        format!("columns.{name}"),
                        format!("`{p}` is not a JSON pointer (such as \"/{p}\")"),
                    ));
                }
                out.push((name.clone(), Source::Pointer(p.clone())));
            }
        }
        if let Some(j) = &self.jsonb_column {
            if out.iter().any(|(n, _)| n == j) {
                return Err(KeyError::new(
                    "jsonb_column and columns",
                    format!("`{j}` is in both"),
                ));
            }
            if self.columns.is_none() {
                for k in key {
                    out.push((
                        k.clone(),
                        Source::Pointer(format!("/{}", escape_pointer(k))),
                    ));
                }
            }
            out.push((j.clone(), Source::Record));
        }
        if out.is_empty() {
            return Ok(None);
        }
        if let Some(k) = key.iter().find(|k| !out.iter().any(|(n, _)| n == *k)) {
            return Err(KeyError::new(
                "key and columns",
                format!("key column `{k}` is not among the written columns"),
            ));
        }
        Ok(Some(out))
    }
}

/// A field name as one JSON pointer token (`~` and `/` escaped).
pub fn escape_pointer(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

impl SinkSection for PgSection {
    fn prepare(self, cx: &SinkContext<'_>) -> Result<PreparedSink, KeyError> {
        let cfg = self.config(cx)?;
        // A delete needs the key columns to find its row; without a key the sink
        // writes rows only, and Kafka tombstones are skipped by the source.
        let reads_tombstones = !cfg.key.is_empty();
        Ok(PreparedSink {
            spec: super::spec(cfg.clone()),
            config: std::sync::Arc::new(cfg),
            reads_tombstones,
        })
    }
}
