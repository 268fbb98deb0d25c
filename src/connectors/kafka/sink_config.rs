//! What the user configures for the Kafka sink (`[sink.kafka]`): the job-file section,
//! its defaults and its validation.

use crate::clients::kafka::{apply, ClientRole};
use crate::dead_letter::{Allowed, OnError};
use crate::secret::Properties;
use rdkafka::ClientConfig;
use std::time::Duration;

/// The Kafka sink's configuration. Its `Debug` hides the values of secret properties.
#[derive(Debug, Clone, PartialEq)]
pub struct KafkaSinkConfig {
    pub bootstrap_servers: String,
    /// The topic every record is written to.
    pub topic: String,
    /// The JSON pointer of the message key in the payload.
    pub key: String,
    /// What a record whose key cannot be read becomes (`on_invalid`).
    pub on_invalid: OnError,
    /// How long a checkpoint's barrier (and the final flush) may wait for the broker to
    /// acknowledge what was sent before it.
    pub flush_timeout: Duration,
    /// The source's properties (those that apply to a producer), then the section's
    /// own, which win.
    pub properties: Properties,
    /// How many of the topic's partitions the stage spreads keys over
    /// (`partitions`): one count for every member and every start of the stage, so
    /// that a key never moves. `None`: the topic's count at the stage's first start,
    /// which only a job run as one process can keep (refused with members).
    pub partitions: Option<u32>,
}

impl KafkaSinkConfig {
    /// The producer's librdkafka settings: the properties, then lockgate's own
    /// ([`FORCED`]), which the job file may not set (refused at load).
    pub fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("linger.ms", "5");
        // The source's table (merged in) may set a forced setting under another name
        // (`delivery.timeout.ms`): left out, so that no alias competes with it.
        let own = self
            .properties
            .iter()
            .filter(|(k, _)| forced_key(k).is_none());
        apply(&mut c, own, ClientRole::Producer);
        c.set("bootstrap.servers", &self.bootstrap_servers);
        for (k, v) in FORCED {
            c.set(*k, *v);
        }
        c
    }
}

/// The producer settings the deduplication downstream relies on, set over whatever the
/// properties say:
/// - idempotence with `acks = all`: within a run, a partition receives each record once,
///   in the order sent;
/// - `enable.gapless.guarantee` and no message timeout: a record that cannot be
///   written is retried until the checkpoint's flush gives up, and librdkafka fails
///   the producer rather than write a later record after one it gave up (a later
///   record above the mark would make the replay of the earlier one a "duplicate");
/// - Java's partitioner: a replayed record goes to the partition of its first copy, in
///   this and any other Kafka client;
/// - a report for every delivery: the barrier counts them.
pub const FORCED: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    ("enable.gapless.guarantee", "true"),
    ("message.timeout.ms", "0"),
    ("partitioner", "murmur2_random"),
    ("delivery.report.only.error", "false"),
];

/// The names that set a [`FORCED`] setting (with librdkafka's aliases).
fn forced_key(key: &str) -> Option<&'static str> {
    let key = match key {
        "request.required.acks" => "acks",
        "delivery.timeout.ms" => "message.timeout.ms",
        k => k,
    };
    FORCED.iter().map(|(k, _)| *k).find(|k| *k == key)
}

impl KafkaSinkConfig {
    /// The properties of `properties` that the sink sets itself, named.
    fn refused(properties: &Properties) -> Option<(String, String)> {
        properties.keys().find_map(|k| {
            forced_key(k).map(|f| {
                (
                    format!("properties.{k:?}"),
                    format!(
                        "the Kafka sink sets {f} = {} itself (the deduplication downstream relies on it); remove the property",
                        FORCED.iter().find(|(n, _)| *n == f).map_or("", |(_, v)| v)
                    ),
                )
            })
        })
    }
}

/// `[sink.kafka]` as written in a job file.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSinkSection {
    topic: String,
    key: String,
    bootstrap_servers: Option<String>,
    on_invalid: Option<String>,
    flush_timeout_ms: Option<u64>,
    partitions: Option<u32>,
    #[serde(default)]
    properties: Properties,
}

impl KafkaSinkSection {
    /// The sink's configuration. It reaches the source's cluster the way the source does
    /// unless it names its own `bootstrap_servers`; its `properties` add to (and win
    /// over) the source's. The flush timeout defaults to the checkpoint timeout. An
    /// error is `(key, message)`, the key relative to the section.
    pub fn config(
        &self,
        source: Option<&crate::connector::KafkaCluster>,
        checkpoint_timeout_ms: u64,
    ) -> Result<KafkaSinkConfig, (String, String)> {
        use crate::connector::section::at_key as at;
        if self.topic.is_empty() {
            return Err(at("topic")("must name a topic".into()));
        }
        if !(self.key.is_empty() || self.key.starts_with('/')) || self.key == "/" {
            return Err(at("key")(format!(
                "`{}` is not a JSON pointer to a field such as /user",
                self.key
            )));
        }
        if self.key.is_empty() {
            return Err(at("key")(
                "a JSON pointer to the field the records are keyed by, such as /user".into(),
            ));
        }
        let on_invalid = match self.on_invalid.as_deref() {
            None => OnError::Fail,
            Some(p) => OnError::parse(p, Allowed::ITEM).map_err(at("on_invalid"))?,
        };
        let flush_timeout_ms = self.flush_timeout_ms.unwrap_or(checkpoint_timeout_ms);
        if flush_timeout_ms == 0 {
            return Err(at("flush_timeout_ms")("must be positive".into()));
        }
        let bootstrap_servers = match (&self.bootstrap_servers, source) {
            (Some(b), _) => b.clone(),
            (None, Some(s)) => s.bootstrap_servers.clone(),
            (None, None) => {
                return Err(at("bootstrap_servers")(
                    "required without a [source.kafka] to take it from".into(),
                ))
            }
        };
        if self.partitions == Some(0) {
            return Err(at("partitions")("must be positive".into()));
        }
        if let Some(e) = KafkaSinkConfig::refused(&self.properties) {
            return Err(e);
        }
        crate::clients::kafka::check(&self.properties)
            .map_err(|(k, m)| (format!("properties.{k:?}"), m))?;
        let mut properties = source.map(|s| s.properties.clone()).unwrap_or_default();
        // The source's table applies to every client of the job; a setting the sink
        // forces is overridden there, not refused (the consumer may need it).
        properties.extend(self.properties.0.clone());
        Ok(KafkaSinkConfig {
            bootstrap_servers,
            topic: self.topic.clone(),
            key: self.key.clone(),
            on_invalid,
            flush_timeout: Duration::from_millis(flush_timeout_ms),
            properties,
            partitions: self.partitions,
        })
    }
}

impl crate::connector::SinkSection for KafkaSinkSection {
    fn prepare(
        self,
        cx: &crate::connector::SinkContext<'_>,
    ) -> Result<crate::connector::PreparedSink, crate::connector::KeyError> {
        // The records of a source partition must reach the topic through one producer,
        // in the order they were read: the downstream stage's deduplication relies on
        // it. A keyed stage in between would spread them over several.
        // Record transforms run in the source's task, in order, one record out for one
        // in (or none): the order holds. A keyed one, or several records of one input
        // (which share its coordinates, and so the downstream marks), would not.
        if let Some(kind) = cx.stateful_transforms.first() {
            return Err(crate::connector::KeyError::section(format!(
                "a repartition stage writes records in the order it reads them, and {kind} reorders them by key: put it into the job that reads the topic (with origin_headers = true)"
            )));
        }
        if let Some(made) = &cx.records_without_coordinates {
            return Err(crate::connector::KeyError::section(format!(
                "a repartition stage marks each record by its source coordinates, and {made} have none: write them to a sink that does not need them"
            )));
        }
        if cx.several_outputs {
            return Err(crate::connector::KeyError::section(
                "a repartition stage marks each record by its source coordinates, which the records a jq program makes of one input share: give the program one output (max_outputs = 1), or put it into the job that reads the topic",
            ));
        }
        let cfg = std::sync::Arc::new(
            self.config(cx.source.kafka.as_ref(), cx.section.checkpoint_timeout_ms)?,
        );
        Ok(crate::connector::PreparedSink {
            spec: super::sink::KafkaSink::spec(cfg.clone()),
            config: cfg,
            reads_tombstones: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::kafka::KafkaSourceConfig;

    fn cluster(source: &KafkaSourceConfig) -> crate::connector::KafkaCluster {
        crate::connector::KafkaCluster {
            bootstrap_servers: source.bootstrap_servers.clone(),
            properties: source.properties.clone(),
        }
    }

    fn section(text: &str) -> KafkaSinkSection {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn takes_the_source_cluster_and_adds_its_own_properties() {
        let mut source = KafkaSourceConfig::new(
            "k:9092",
            super::super::TopicSelector::List(vec!["a".into()]),
            "g",
        );
        source
            .properties
            .insert("security.protocol".into(), "sasl_ssl".into());
        source.properties.insert("client.id".into(), "src".into());
        let c = section("topic = \"t\"\nkey = \"/user\"\n[properties]\n\"client.id\" = \"sink\"")
            .config(Some(&cluster(&source)), 60_000)
            .unwrap();
        assert_eq!(c.bootstrap_servers, "k:9092");
        assert_eq!(c.properties.get("client.id").unwrap(), "sink");
        assert_eq!(c.properties.get("security.protocol").unwrap(), "sasl_ssl");
        assert_eq!(c.flush_timeout, Duration::from_secs(60));
        assert_eq!(c.on_invalid, OnError::Fail);
        let native = c.client_config();
        for (k, v) in FORCED {
            assert_eq!(native.get(k), Some(*v), "{k}");
        }
        assert_eq!(native.get("client.id"), Some("sink"));
        // Forced over the source's table, which applies to every client.
        source
            .properties
            .insert("message.timeout.ms".into(), "10000".into());
        source
            .properties
            .insert("delivery.timeout.ms".into(), "10000".into());
        source
            .properties
            .insert("request.required.acks".into(), "1".into());
        let c = section("topic = \"t\"\nkey = \"/user\"")
            .config(Some(&cluster(&source)), 60_000)
            .unwrap();
        let native = c.client_config();
        assert_eq!(native.get("message.timeout.ms"), Some("0"));
        assert_eq!(native.get("acks"), Some("all"));
        for alias in ["delivery.timeout.ms", "request.required.acks"] {
            assert_eq!(
                native.get(alias),
                None,
                "{alias} would compete with its forced name"
            );
        }
        // librdkafka takes every forced setting.
        c.client_config().create_native_config().unwrap();
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            ("topic = \"\"\nkey = \"/u\"", "topic"),
            ("topic = \"t\"\nkey = \"user\"", "key"),
            ("topic = \"t\"\nkey = \"\"", "key"),
            ("topic = \"t\"\nkey = \"/u\"\non_invalid = \"skip\"", "on_invalid"),
            (
                "topic = \"t\"\nkey = \"/u\"\non_invalid = \"dead-letter:\"",
                "on_invalid",
            ),
            ("topic = \"t\"\nkey = \"/u\"\nflush_timeout_ms = 0", "flush_timeout_ms"),
            ("topic = \"t\"\nkey = \"/u\"", "bootstrap_servers"),
            (
                "topic = \"t\"\nkey = \"/u\"\nbootstrap_servers = \"k\"\n[properties]\nacks = \"1\"",
                "properties.\"acks\"",
            ),
            (
                "topic = \"t\"\nkey = \"/u\"\nbootstrap_servers = \"k\"\n[properties]\n\"message.timeout.ms\" = \"10000\"",
                "properties.\"message.timeout.ms\"",
            ),
            (
                "topic = \"t\"\nkey = \"/u\"\nbootstrap_servers = \"k\"\n[properties]\n\"delivery.timeout.ms\" = \"10000\"",
                "properties.\"delivery.timeout.ms\"",
            ),
            (
                "topic = \"t\"\nkey = \"/u\"\nbootstrap_servers = \"k\"\n[properties]\npartitioner = \"random\"",
                "properties.\"partitioner\"",
            ),
            (
                "topic = \"t\"\nkey = \"/u\"\nbootstrap_servers = \"k\"\n[properties]\n\"delivery.report.only.error\" = \"true\"",
                "properties.\"delivery.report.only.error\"",
            ),
        ];
        for (text, key) in cases {
            let (k, m) = section(text).config(None, 1000).unwrap_err();
            assert_eq!(k, key, "{text}: {m}");
        }
        let c = section("topic = \"t\"\nkey = \"/u\"\nbootstrap_servers = \"k\"\non_invalid = \"dead-letter:bad\"")
            .config(None, 1000)
            .unwrap();
        assert_eq!(c.on_invalid, OnError::DeadLetter("bad".into()));
    }
}
