//! What the harness needs to know of a job file to verify it: the Kafka topics it
//! reads, what it writes (an Elasticsearch index and how ids are derived, or the file
//! sink's directory), and its rolling sum.

use crate::connectors::elasticsearch::{EsConnection, IdStrategy};
use crate::connectors::kafka::TopicSelector;
use std::path::Path;

/// Where a job writes, as the verifier reads it back.
#[derive(Debug, Clone)]
pub enum Output {
    /// An Elasticsearch index.
    Elasticsearch(Box<EsTarget>),
    /// The exactly-once file sink's directory: its committed `part-*` files.
    Files(std::path::PathBuf),
    /// A Kafka topic (`[sink.kafka]`): a repartition stage, verified through the job
    /// that reads the topic (`lockgate chaos --upstream`).
    Topic(String),
    /// A PostgreSQL table (`[sink.postgres]`).
    Postgres(Box<crate::connectors::postgres::PgConfig>),
}

/// An index and how to read it.
#[derive(Debug, Clone)]
pub struct EsTarget {
    /// How the job reaches Elasticsearch (nodes, credentials, TLS): the verifier reads
    /// the index the same way.
    pub es: EsConnection,
    pub index: String,
    pub id: IdStrategy,
    /// The dead-letter topic of `on_item_error`, if any: the inputs it names were
    /// refused, and are verified to be in no document.
    pub dead_letters: Option<String>,
    /// `on_null_value = "delete"`: a tombstone deletes the document its key names
    /// (otherwise a tombstone writes nothing).
    pub tombstones_delete: bool,
    /// The index is a data stream whose documents get an `@timestamp` from here; it is
    /// read by search (a data stream answers no get by id).
    pub data_stream: Option<crate::connectors::elasticsearch::TimestampSource>,
}

/// The verifiable shape of a `kafka -> [rolling_sum] -> elasticsearch | file` job.
#[derive(Debug, Clone)]
pub struct Target {
    pub bootstrap_servers: String,
    /// The job's `[source.kafka.properties]`: the verifier reaches the cluster the way
    /// the job does.
    pub kafka_properties: std::collections::BTreeMap<String, String>,
    /// The topics the job reads.
    pub topics: TopicSelector,
    pub output: Output,
    /// `(key pointer, field pointer, output pointer)` of a rolling_sum transform.
    pub rolling_sum: Option<(String, String, String)>,
    pub checkpoint_dir: std::path::PathBuf,
    /// The checkpoints are kept in this object store (`checkpoint_dir` is then the
    /// local staging directory).
    pub checkpoint_store: Option<String>,
    /// The job reads its topics' origin headers and drops replays of the upstream
    /// stage (`origin_headers = true`).
    pub origin_headers: bool,
    /// How the job decodes its input's values and keys: the verifier decodes them the
    /// same way.
    pub format: crate::formats::FormatRef,
    pub key_format: Option<crate::formats::FormatRef>,
    /// The job's record transforms (before its `rolling_sum`, if any), in order: the
    /// verifier applies them to the inputs as the job does.
    pub transforms: Vec<(String, std::sync::Arc<dyn crate::transforms::Smt>)>,
}

/// The directory of a file sink the harness verifies: JSON lines in a local directory,
/// without folders, which it reads part by part.
fn files_verified(
    f: &crate::connectors::file_sink::FileSinkConfig,
) -> Result<std::path::PathBuf, String> {
    use crate::connectors::file_sink::FileFormat;
    if f.store.is_some() {
        return Err(format!(
            "the chaos harness reads a file sink's parts from a local directory, not the object store {}",
            f.dir.display()
        ));
    }
    if f.format != FileFormat::Json {
        return Err("the chaos harness reads a file sink's JSON lines, not Parquet".into());
    }
    if f.partition.is_some() {
        return Err(
            "the chaos harness reads a file sink's parts from its directory, not from partition_by's folders"
                .into(),
        );
    }
    Ok(f.dir.clone())
}

impl Target {
    /// The parts of the job file the harness verifies, read with the job file's own
    /// parser ([`crate::config::describe`]): the same defaults, no second reading.
    pub fn from_job_file(path: &Path) -> Result<Target, String> {
        let d = crate::config::describe(path, &crate::builtin::registry())
            .map_err(|e| e.to_string())?;
        use crate::connectors::elasticsearch::{EsSinkConfig, IndexTemplate, NullValue};
        use crate::connectors::file_sink::FileSinkConfig;
        use crate::connectors::kafka::KafkaSinkConfig;
        let k = d
            .source_config::<crate::connectors::kafka::KafkaSourceConfig>()
            .ok_or("the chaos harness verifies [source.kafka] jobs")?
            .clone();
        let postgres = d
            .sink_config::<crate::connectors::postgres::PgConfig>()
            .cloned();
        let output = match (
            d.sink_config::<EsSinkConfig>().cloned(),
            d.sink_config::<FileSinkConfig>()
                .map(files_verified)
                .transpose()?,
            d.sink_config::<KafkaSinkConfig>(),
        ) {
            (_, _, Some(k)) => Output::Topic(k.topic.clone()),
            (Some(e), _, None) => {
                if IndexTemplate::parse(&e.index).map_or(true, |t| t.fixed().is_none()) {
                    return Err(format!(
                        "the chaos harness verifies one index, not the template `{}`",
                        e.index
                    ));
                }
                if e.pipeline.is_some() || e.routing.is_some() {
                    return Err(
                        "the chaos harness reads documents back by id and compares them with their records: it verifies no job with an ingest pipeline (which changes them) or routing"
                            .into(),
                    );
                }
                if e.data_stream.is_some() && e.id != IdStrategy::Coordinates {
                    return Err(
                        "the chaos harness verifies a data stream written with id = \"coordinates\" (a data stream keeps the first write of an id, not the last)"
                            .into(),
                    );
                }
                let dead_letters = e.on_item_error.topic().map(str::to_string);
                Output::Elasticsearch(Box::new(EsTarget {
                    es: e.connection,
                    index: e.index,
                    id: e.id,
                    dead_letters,
                    tombstones_delete: e.on_null_value
                        == Some(NullValue::Delete),
                    data_stream: e.data_stream.as_ref().map(|_| e.timestamp.clone()),
                }))
            }
            (None, Some(dir), None) => Output::Files(dir),
            (None, None, None) => match postgres {
                Some(p) => Output::Postgres(Box::new(p)),
                None => return Err(
                    "the chaos harness verifies [sink.elasticsearch], [sink.file], [sink.postgres] or [sink.kafka] jobs"
                        .into(),
                ),
            },
        };
        if matches!(output, Output::Postgres(_))
            && !d.transform_configs::<(String, String, String)>().is_empty()
        {
            return Err(
                "the chaos harness verifies a Postgres table written by records as they are, or by transforms of one record: not by a rolling_sum, whose rows depend on the order of partitions"
                    .into(),
            );
        }
        let mut transforms = Vec::new();
        let mut after_sum = false;
        for (kind, config) in &d.transforms {
            match config.downcast_ref::<crate::transforms::Applied>() {
                Some(_) if after_sum => {
                    return Err(format!(
                        "the chaos harness verifies transforms before rolling_sum; `{kind}` comes after it"
                    ))
                }
                Some(a) => transforms.push((kind.clone(), a.0.clone())),
                None if config.downcast_ref::<(String, String, String)>().is_some() => {
                    after_sum = true
                }
                None => {
                    return Err(format!(
                        "the chaos harness cannot verify the transform `{kind}`"
                    ))
                }
            }
        }
        Ok(Target {
            transforms,
            format: k.format.clone(),
            key_format: k.key_format.clone(),
            origin_headers: k.origin_headers,
            checkpoint_store: d.checkpoint_store.clone(),
            bootstrap_servers: k.bootstrap_servers,
            kafka_properties: k.properties.0,
            topics: k.topics,
            output,
            rolling_sum: d
                .transform_configs::<(String, String, String)>()
                .first()
                .map(|t| (*t).clone()),
            checkpoint_dir: d.checkpoint_dir.clone(),
        })
    }

    /// The index, if the job writes to Elasticsearch.
    pub fn elasticsearch(&self) -> Option<&EsTarget> {
        match &self.output {
            Output::Elasticsearch(e) => Some(e),
            Output::Files(_) | Output::Topic(_) | Output::Postgres(_) => None,
        }
    }

    /// The target that verifies this job's output against the input of `upstream`,
    /// the repartition stage that writes the topic this job reads: the records of
    /// `upstream`'s topics, each applied once, make this job's output.
    pub fn through(&self, upstream: &Target) -> Result<Target, String> {
        let Output::Topic(topic) = &upstream.output else {
            return Err("--upstream names a job that writes to Elasticsearch or files; it must write to a topic ([sink.kafka]) that this job reads".into());
        };
        if matches!(self.output, Output::Topic(_)) {
            return Err(
                "--config names a repartition stage too: give the job that reads it".into(),
            );
        }
        if !self.selects(topic) {
            return Err(format!(
                "this job does not read `{topic}`, the topic the --upstream job writes"
            ));
        }
        let es = match &self.output {
            Output::Elasticsearch(e) => Some(&**e),
            _ => None,
        };
        if let Some(dl) = es.and_then(|e| e.dead_letters.as_ref()) {
            return Err(format!(
                "this job dead-letters into `{dl}` records whose origin is `{topic}`, not the records the --upstream job read: verify dead letters without a repartition stage"
            ));
        }
        if es.is_some_and(|e| e.id == IdStrategy::Coordinates) {
            return Err(format!(
                "this job's documents are named by the coordinates in `{topic}`, not by those of the records the --upstream job read: verify a repartitioned job by key or field ids"
            ));
        }
        if !self.origin_headers {
            return Err(format!(
                "this job reads `{topic}` without origin_headers = true: replays of the upstream stage would be applied twice"
            ));
        }
        if es.is_some_and(|e| e.id == IdStrategy::Key) && self.rolling_sum.is_none() {
            return Err(format!(
                "this job's documents are named by the keys the --upstream job wrote into `{topic}`, not by those of the records it read: verify a repartitioned job by field ids"
            ));
        }
        if let Some((kind, _)) = upstream.transforms.first() {
            return Err(format!(
                "the --upstream job transforms its records ({kind}): the harness verifies a repartition stage that writes them as it reads them"
            ));
        }
        Ok(Target {
            bootstrap_servers: upstream.bootstrap_servers.clone(),
            kafka_properties: upstream.kafka_properties.clone(),
            topics: upstream.topics.clone(),
            format: upstream.format.clone(),
            key_format: upstream.key_format.clone(),
            ..self.clone()
        })
    }

    /// Whether the job reads `topic`.
    pub fn selects(&self, topic: &str) -> bool {
        self.topics.matches(topic)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job file of a Kafka source into `[sink.file]` with `sink_keys`.
    fn target(sink_keys: &str) -> Result<Target, String> {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("s.avsc"),
            r#"{"type":"record","name":"s","fields":[{"name":"id","type":"long"}]}"#,
        )
        .unwrap();
        let path = tmp.path().join("job.toml");
        std::fs::write(
            &path,
            format!("[job]\nname = \"t\"\n[checkpoint]\ndir = \"c\"\n[source.kafka]\nbootstrap_servers = \"k:9092\"\ntopics = [\"t\"]\n[sink.file]\n{sink_keys}\n"),
        )
        .unwrap();
        Target::from_job_file(&path)
    }

    #[test]
    fn file_sinks_the_harness_cannot_read_back_are_refused() {
        assert!(target("dir = \"out\"\nroll_bytes = 4096").is_ok());
        for (keys, says) in [
            ("dir = \"s3://lake/out\"", "object store"),
            (
                "dir = \"out\"\nformat = \"parquet\"\nschema_file = \"s.avsc\"",
                "Parquet",
            ),
            ("dir = \"out\"\npartition_by = \"d={/id}\"", "partition_by"),
        ] {
            let e = target(keys)
                .err()
                .unwrap_or_else(|| panic!("{keys} accepted"));
            assert!(e.contains(says), "{keys}: {e}");
        }
    }
}
