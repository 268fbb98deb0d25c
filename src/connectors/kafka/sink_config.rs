//! What the user configures for the Kafka sink (`[sink.kafka]`): the job-file section,
//! its defaults and its validation.

use super::properties::{apply, ClientRole};
use super::KafkaSourceConfig;
use crate::secret::Properties;
use rdkafka::ClientConfig;
use std::time::Duration;

/// What happens to a record whose key cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InvalidPolicy {
    /// Fail the job, naming the record.
    Fail,
    /// Write the record, with the error in headers, to this topic.
    DeadLetter(String),
}

/// The Kafka sink's configuration. Its `Debug` hides the values of secret properties.
#[derive(Debug, Clone, PartialEq)]
pub struct KafkaSinkConfig {
    pub bootstrap_servers: String,
    /// The topic every record is written to.
    pub topic: String,
    /// The JSON pointer of the message key in the payload.
    pub key: String,
    pub on_invalid: InvalidPolicy,
    /// How long a checkpoint's barrier (and the final flush) may wait for the broker to
    /// acknowledge what was sent before it.
    pub flush_timeout: Duration,
    /// The source's properties (those that apply to a producer), then the section's
    /// own, which win.
    pub properties: Properties,
}

impl KafkaSinkConfig {
    /// The producer's librdkafka settings: the properties, then lockgate's own, which
    /// the job file may not weaken (refused at load): idempotence and `acks = all`
    /// keep a partition's records in order without gaps or duplicates within a run.
    pub fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("linger.ms", "5").set("partitioner", "murmur2_random");
        apply(&mut c, &self.properties, ClientRole::Producer);
        c.set("bootstrap.servers", &self.bootstrap_servers)
            .set("enable.idempotence", "true")
            .set("acks", "all");
        c
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
        source: Option<&KafkaSourceConfig>,
        checkpoint_timeout_ms: u64,
    ) -> Result<KafkaSinkConfig, (String, String)> {
        use crate::connectors::at_key as at;
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
            None | Some("fail") => InvalidPolicy::Fail,
            Some(p) => match p.strip_prefix("dead-letter:") {
                Some(t) if !t.is_empty() => InvalidPolicy::DeadLetter(t.to_string()),
                _ => {
                    return Err(at("on_invalid")(format!(
                        "`{p}` is not one of fail, dead-letter:<topic>"
                    )))
                }
            },
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
        super::properties::check(&self.properties)
            .map_err(|(k, m)| (format!("properties.{k:?}"), m))?;
        let mut properties = source.map(|s| s.properties.clone()).unwrap_or_default();
        properties.extend(self.properties.0.clone());
        Ok(KafkaSinkConfig {
            bootstrap_servers,
            topic: self.topic.clone(),
            key: self.key.clone(),
            on_invalid,
            flush_timeout: Duration::from_millis(flush_timeout_ms),
            properties,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            .config(Some(&source), 60_000)
            .unwrap();
        assert_eq!(c.bootstrap_servers, "k:9092");
        assert_eq!(c.properties.get("client.id").unwrap(), "sink");
        assert_eq!(c.properties.get("security.protocol").unwrap(), "sasl_ssl");
        assert_eq!(c.flush_timeout, Duration::from_secs(60));
        assert_eq!(c.on_invalid, InvalidPolicy::Fail);
        let native = c.client_config();
        assert_eq!(native.get("enable.idempotence"), Some("true"));
        assert_eq!(native.get("acks"), Some("all"));
        assert_eq!(native.get("client.id"), Some("sink"));
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            ("topic = \"\"\nkey = \"/u\"", "topic"),
            ("topic = \"t\"\nkey = \"user\"", "key"),
            ("topic = \"t\"\nkey = \"\"", "key"),
            ("topic = \"t\"\nkey = \"/u\"\non_invalid = \"skip\"", "on_invalid"),
            ("topic = \"t\"\nkey = \"/u\"\nflush_timeout_ms = 0", "flush_timeout_ms"),
            ("topic = \"t\"\nkey = \"/u\"", "bootstrap_servers"),
            (
                "topic = \"t\"\nkey = \"/u\"\nbootstrap_servers = \"k\"\n[properties]\nacks = \"1\"",
                "properties.\"acks\"",
            ),
        ];
        for (text, key) in cases {
            let (k, m) = section(text).config(None, 1000).unwrap_err();
            assert_eq!(k, key, "{text}: {m}");
        }
        let c = section("topic = \"t\"\nkey = \"/u\"\nbootstrap_servers = \"k\"\non_invalid = \"dead-letter:bad\"")
            .config(None, 1000)
            .unwrap();
        assert_eq!(c.on_invalid, InvalidPolicy::DeadLetter("bad".into()));
    }
}
