//! Job-file sections: how a connector's table (`[source.kafka]`, `[sink.file]`, a
//! `[[transform]]`) becomes its spec.
//!
//! A section is a serde type (`deny_unknown_fields`, its defaults in one place) that a
//! [`super::Registry`] deserializes from its table; `prepare` validates it and says
//! what the other sections need to know. The job file reads the source first, then
//! the transforms, then the sink (which sees the source's [`SourceFacts`]), and builds
//! the source last (it learns whether the sink reads tombstones).

use super::spec::{SinkSpec, SourceSpec, Step};
use crate::dead_letter::{Allowed, OnError};
use std::any::Any;
use std::path::{Path, PathBuf};
use std::sync::Arc;

// The contract carries the source's cluster to the other sections; the type is the
// Kafka client's, and stays reachable here for connectors written against the contract.
pub use crate::clients::kafka::KafkaCluster;

/// A section's error: the key it concerns and what is wrong. The key is relative to
/// the section (`topics`, `properties."client.id"`; empty: the section itself) unless
/// it is [`KeyError::absolute`], for errors about keys of two sections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    pub key: String,
    pub message: String,
    pub absolute: bool,
}

impl KeyError {
    /// An error about `key` of the section.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> KeyError {
        KeyError {
            key: key.into(),
            message: message.into(),
            absolute: false,
        }
    }

    /// An error about the section as a whole.
    pub fn section(message: impl Into<String>) -> KeyError {
        KeyError::new("", message)
    }

    /// An error naming keys in full (`source.kafka.format and sink.elasticsearch`).
    pub fn absolute(key: impl Into<String>, message: impl Into<String>) -> KeyError {
        KeyError {
            absolute: true,
            ..KeyError::new(key, message)
        }
    }

    /// The key in full, for a section at `section` (`sink.elasticsearch`). A relative
    /// key written `a and b` (or `a, b and c`) names each key in full.
    pub fn full_key(&self, section: &str) -> String {
        if self.absolute {
            return self.key.clone();
        }
        if self.key.is_empty() {
            return section.to_string();
        }
        let full = |k: &str| format!("{section}.{k}");
        self.key
            .split(" and ")
            .map(|part| part.split(", ").map(full).collect::<Vec<_>>().join(", "))
            .collect::<Vec<_>>()
            .join(" and ")
    }
}

impl From<(String, String)> for KeyError {
    /// The `(key, message)` pairs the sections' own validation returns.
    fn from((key, message): (String, String)) -> KeyError {
        KeyError::new(key, message)
    }
}

/// What every section is prepared with.
#[derive(Debug, Clone)]
pub struct SectionContext {
    pub job_name: String,
    /// The directory of the job file: relative paths are resolved against it.
    pub base_dir: PathBuf,
    pub parallelism: u16,
    pub max_parallelism: u16,
    /// How long a checkpoint may take (`checkpoint.timeout_ms`): a sink's flush at
    /// the barrier has at most this long.
    pub checkpoint_timeout_ms: u64,
    /// The formats a source section can name (`format`, `key_format`): the
    /// registry's list.
    pub formats: crate::formats::Formats,
    /// The Kafka cluster the source reads, for the transforms' dead letters (set once
    /// the source is prepared).
    pub source_kafka: Option<KafkaCluster>,
    /// The source gives records their event time and emits watermarks (set once the
    /// source is prepared).
    pub event_time: bool,
}

impl SectionContext {
    /// `p` resolved against the job file's directory (absolute paths stay).
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base_dir.join(p)
        }
    }

    /// The error policy `value` of `key` (absent: `fail`) within `allowed`, checked
    /// against the source's cluster as [`SectionContext::dead_letter_cluster`] does.
    pub fn error_policy(
        &self,
        key: &str,
        value: Option<&str>,
        allowed: Allowed,
        otherwise: &str,
    ) -> Result<OnError, KeyError> {
        let policy = match value {
            None => OnError::Fail,
            Some(s) => OnError::parse(s, allowed).map_err(|e| KeyError::new(key, e))?,
        };
        self.dead_letter_cluster(key, &policy, otherwise)?;
        Ok(policy)
    }

    /// Where the dead letters of `policy`, the value of `key`, go: the source's Kafka
    /// cluster when the policy writes dead letters, `None` when it does not. A policy
    /// that writes them while the source has no Kafka cluster is an error at `key`:
    /// "dead letters go to the source's Kafka cluster, and " then `otherwise` (what to
    /// write instead).
    pub fn dead_letter_cluster(
        &self,
        key: &str,
        policy: &OnError,
        otherwise: &str,
    ) -> Result<Option<&KafkaCluster>, KeyError> {
        if policy.topic().is_none() {
            return Ok(None);
        }
        match &self.source_kafka {
            Some(k) => Ok(Some(k)),
            None => Err(KeyError::new(
                key,
                format!("dead letters go to the source's Kafka cluster, and {otherwise}"),
            )),
        }
    }
}

/// Tags a job-file section's error with its key (relative to the section), as the
/// sections' `config` functions return them: `(key, message)`.
pub(crate) fn at_key(key: &'static str) -> impl Fn(String) -> (String, String) {
    move |message| (key.to_string(), message)
}

/// What to do instead when `co_partitioned` meets a source whose keys span its splits
/// ([`SourceFacts::not_split_keyed`]).
pub const CO_PARTITIONED_FIX: &str = "co_partitioned needs a Kafka source that reads one topic partitioned by the key; to combine several topics, write them into one topic with a repartition stage ([sink.kafka]) and read that";

/// What a source tells the sink's section, for the rules between them.
#[derive(Debug, Clone)]
pub struct SourceFacts {
    /// The format of the records' values (`json`, `text`, `bytes`), and the key in
    /// full that sets it, for errors (`source.kafka.format`). `json` promises that
    /// every value (not a tombstone) is JSON text that parses: the transforms then
    /// read it by its structure without checking it again.
    pub format: String,
    pub format_key: String,
    /// Positions order the records of one split only (Kafka offsets): a sink that
    /// uses them as versions needs one split to write each document.
    pub offsets_per_split: bool,
    /// The Kafka cluster the source reads (dead letters and a repartition stage's
    /// topic go there by default).
    pub kafka: Option<KafkaCluster>,
    /// The source has records without a value (Kafka tombstones), which it skips
    /// unless the sink reads them ([`SourceWiring::tombstones`]).
    pub tombstones: bool,
    /// Records carry their event time and the source emits watermarks (windows need
    /// them).
    pub event_time: bool,
    /// Why keyed state kept per split (`job.co_partitioned`) would not be each key's
    /// whole state with this source; `None`: it would.
    pub not_split_keyed: Option<String>,
    /// The key in full that lets the source read a split again from its start after
    /// its positions were used (`source.kafka.on_topic_recreated`, a recreated topic
    /// read from EARLIEST): positions then name other records than before, so a sink
    /// must not make ids or versions of them. `None`: positions never go back.
    pub positions_restart: Option<String>,
    /// The records have no coordinates (stream, split, offset) that a replay gives
    /// again, as an acknowledging source's messages: what they are, for errors
    /// (`messages of a queue`). A sink then refuses ids, versions and marks made of
    /// coordinates, as for the records a window makes
    /// ([`SinkContext::records_without_coordinates`]). `None`: every record has them.
    pub without_coordinates: Option<String>,
    /// The Avro schema every value follows, when the source reads Avro by one fixed
    /// schema (a reader schema, or the schema of unframed values): a sink that writes
    /// columns may take its columns from it.
    pub value_schema: Option<SourceSchema>,
}

/// The Avro schema of a source's values ([`SourceFacts::value_schema`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SourceSchema {
    /// The schema file.
    pub path: std::path::PathBuf,
    /// The key in full that names it (`source.kafka.schema_file`).
    pub key: String,
    /// The source writes every time (`timestamp-*`, `time-*`) as a whole number of
    /// milliseconds, whatever its schema's unit: the columns then count milliseconds.
    pub times_in_millis: bool,
}

impl SourceFacts {
    /// Facts of a source of JSON records with no Kafka cluster and no per-split
    /// order, whose splits may hold records of one key.
    pub fn json(kind: &str) -> SourceFacts {
        SourceFacts {
            format: "json".into(),
            format_key: format!("source.{kind}.format"),
            offsets_per_split: false,
            kafka: None,
            tombstones: false,
            event_time: false,
            not_split_keyed: None,
            positions_restart: None,
            without_coordinates: None,
            value_schema: None,
        }
    }
}

/// What the source learns from the sink before it is built.
#[derive(Debug, Clone, Copy, Default)]
pub struct SourceWiring {
    /// The sink says what a tombstone (a record without a value) means: tombstones
    /// reach it as records instead of being skipped.
    pub tombstones: bool,
    /// A step of the job reads the records' headers: the source gives each record
    /// its headers ([`crate::record::Record::headers`]).
    pub headers: bool,
}

/// A resolved configuration kept for tools that reason about a job (the chaos
/// harness): downcast it to the connector's configuration type.
pub type AnyConfig = Arc<dyn Any + Send + Sync>;

/// A validated source section.
pub struct PreparedSource {
    pub facts: SourceFacts,
    pub config: AnyConfig,
    /// Builds the spec once the sink is known.
    pub build: Box<dyn FnOnce(SourceWiring) -> SourceSpec + Send>,
}

/// A source's job-file section (`[source.<name>]`).
pub trait SourceSection: serde::de::DeserializeOwned + 'static {
    /// Validates the section.
    fn prepare(self, cx: &SectionContext) -> Result<PreparedSource, KeyError>;
}

/// What a sink's section is prepared with.
pub struct SinkContext<'a> {
    pub section: &'a SectionContext,
    pub source: &'a SourceFacts,
    /// How many `[[transform]]` sections come before the sink.
    pub transforms: usize,
    /// The kinds of those that keep state per key (`rolling_sum`): they read every
    /// record's value, and take no tombstones.
    pub stateful_transforms: Vec<String>,
    /// A transform before the sink may make several records of one (`jq`): they share
    /// the input's key and coordinates, told apart by [`crate::record::Record::output`].
    pub several_outputs: bool,
    /// The first step before the sink that may send it deletes besides tombstones
    /// (`transform.N (debezium)`, a session window retracting a merged session), by
    /// its job-file key.
    pub deletes: Option<String>,
    /// What records reach the sink without source coordinates to make ids or
    /// versions of, if some do: the source's ([`SourceFacts::without_coordinates`]) or
    /// those a step before the sink makes of its own (`a window's results`).
    pub records_without_coordinates: Option<String>,
}

/// A validated sink section.
pub struct PreparedSink {
    pub spec: SinkSpec,
    pub config: AnyConfig,
    /// The sink says what a tombstone means (see [`SourceWiring::tombstones`]).
    pub reads_tombstones: bool,
}

/// A sink's job-file section (`[sink.<name>]`).
pub trait SinkSection: serde::de::DeserializeOwned + 'static {
    /// Validates the section against the source's facts.
    fn prepare(self, cx: &SinkContext<'_>) -> Result<PreparedSink, KeyError>;
}

/// A validated `[[transform]]`.
pub struct PreparedTransform {
    pub steps: Vec<Step>,
    pub config: AnyConfig,
    /// What the steps tell the sink's section about the records they send on.
    pub facts: TransformFacts,
}

/// What a transform's steps tell the sink's section, so that a sink refuses what it
/// cannot write without knowing which transform it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TransformFacts {
    /// Why the steps may send the sink deletes besides tombstones, if they may
    /// (`session windows, which delete the result of a session merged into another`).
    pub deletes: Option<String>,
    /// The steps make records of their own, which have no source coordinates: what
    /// they are, for errors (`a window's results`).
    pub makes_records: Option<String>,
}

/// A transform's job-file section (`[[transform]]` with `type = "<name>"`).
pub trait TransformSection: serde::de::DeserializeOwned + 'static {
    /// Validates the section; `index` is its position among the transforms (uids
    /// of its keyed steps are made from it, so that they stay stable).
    fn prepare(self, cx: &SectionContext, index: usize) -> Result<PreparedTransform, KeyError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_named_in_full() {
        let s = "sink.elasticsearch";
        assert_eq!(
            KeyError::new("index", "x").full_key(s),
            "sink.elasticsearch.index"
        );
        assert_eq!(KeyError::section("x").full_key(s), "sink.elasticsearch");
        assert_eq!(
            KeyError::new("operation and versioning", "x").full_key(s),
            "sink.elasticsearch.operation and sink.elasticsearch.versioning"
        );
        assert_eq!(
            KeyError::new("a, b and c", "x").full_key(s),
            "sink.elasticsearch.a, sink.elasticsearch.b and sink.elasticsearch.c"
        );
        assert_eq!(
            KeyError::absolute("source.kafka.format and sink.elasticsearch", "x").full_key(s),
            "source.kafka.format and sink.elasticsearch"
        );
    }
}
