//! What the harness needs to know of a job file to verify it: the Kafka topics it
//! reads, the index it writes, how ids are derived, and its rolling sum.

use crate::connectors::elasticsearch::{EsConnection, IdStrategy};
use crate::connectors::kafka::TopicSelector;
use std::path::Path;

/// The verifiable shape of a `kafka -> [rolling_sum] -> elasticsearch` job.
#[derive(Debug, Clone)]
pub struct Target {
    pub bootstrap_servers: String,
    /// The job's `[source.kafka.properties]`: the verifier reaches the cluster the way
    /// the job does.
    pub kafka_properties: std::collections::BTreeMap<String, String>,
    /// The topics the job reads.
    pub topics: TopicSelector,
    /// How the job reaches Elasticsearch (nodes, credentials, TLS): the verifier reads
    /// the index the same way.
    pub es: EsConnection,
    pub index: String,
    pub id: IdStrategy,
    /// `(key pointer, field pointer, output pointer)` of a rolling_sum transform.
    pub rolling_sum: Option<(String, String, String)>,
    pub checkpoint_dir: std::path::PathBuf,
}

impl Target {
    /// The parts of the job file the harness verifies, read with the job file's own
    /// parser ([`crate::config::describe`]): the same defaults, no second reading.
    pub fn from_job_file(path: &Path) -> Result<Target, String> {
        let d = crate::config::describe(path).map_err(|e| e.to_string())?;
        let k = d
            .kafka
            .ok_or("the chaos harness verifies [source.kafka] jobs")?;
        let e = d
            .elasticsearch
            .ok_or("the chaos harness verifies [sink.elasticsearch] jobs")?;
        Ok(Target {
            bootstrap_servers: k.bootstrap_servers,
            kafka_properties: k.properties,
            topics: k.topics,
            es: e.connection,
            index: e.index,
            id: e.id,
            rolling_sum: d.rolling_sums.into_iter().next(),
            checkpoint_dir: d.checkpoint_dir,
        })
    }

    /// Whether the job reads `topic`.
    pub fn selects(&self, topic: &str) -> bool {
        self.topics.matches(topic)
    }
}
