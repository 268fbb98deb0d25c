//! Dead letters: records that cannot be decoded (the Kafka source) or that Elasticsearch
//! refuses (the Elasticsearch sink) go to a Kafka topic instead of failing the job, with
//! the same headers from both: `lockgate.error`, and where known `lockgate.topic`,
//! `lockgate.partition`, `lockgate.offset`, `lockgate.index`, `lockgate.id`.
//!
//! A write returns only once the broker acknowledged it (`acks = all`): the caller moves
//! its position, or resolves the action, only after that, so a dead letter is never lost.
//! The producer is idempotent (`enable.idempotence = true`), so its own retries within
//! a run never write a letter twice.
//!
//! The dead-letter topic is **at-least-once**, not exactly-once: after a crash or an
//! in-process restart, the job replays from its last completed checkpoint, and a record
//! dead-lettered after that checkpoint is dead-lettered again (idempotence does not
//! span producers, and a letter is written when the record is seen, not when a
//! checkpoint completes). Each letter of a Kafka record carries its origin coordinates,
//! so a consumer of the dead-letter topic deduplicates on
//! (`lockgate.topic`, `lockgate.partition`, `lockgate.offset`), adding `lockgate.index`
//! and `lockgate.id` for the sink's letters (one record may become several documents).
//! Letters of records without Kafka coordinates (the sequence source) carry none.
//!
//! The producer takes the Kafka source's `[source.kafka.properties]`, except the
//! consumer-only ones ([`crate::connectors::kafka::properties`]), so that dead letters
//! reach the cluster the way the source does.

use crate::connectors::kafka::properties::{apply, ClientRole};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use std::time::Duration;

/// How long a dead-letter write may wait for the broker.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a dead letter came from and why it is one.
#[derive(Debug, Clone, Default)]
pub struct DeadLetter<'a> {
    pub error: &'a str,
    /// The source record's coordinates, if it came from Kafka.
    pub origin: Option<(&'a str, i32, i64)>,
    /// The Elasticsearch index and document id it was meant for.
    pub index: Option<&'a str>,
    pub id: Option<&'a str>,
    pub key: Option<&'a [u8]>,
    pub payload: &'a [u8],
}

/// The configuration of a dead-letter producer: the properties that apply to a
/// producer, then lockgate's own, which win.
fn producer_config<'a>(
    bootstrap_servers: &str,
    properties: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> ClientConfig {
    let mut c = ClientConfig::new();
    apply(&mut c, properties, ClientRole::Producer);
    c.set("bootstrap.servers", bootstrap_servers)
        .set("enable.idempotence", "true")
        .set("acks", "all");
    c
}

/// An idempotent producer of dead letters (one per subtask).
pub struct DeadLetterWriter {
    producer: FutureProducer,
}

impl DeadLetterWriter {
    /// A writer to the cluster at `bootstrap_servers`. It takes every property of
    /// `properties` (the Kafka source's librdkafka properties) that applies to a
    /// producer ([`crate::connectors::kafka::properties::applies_to`]), then sets `enable.idempotence = true` and
    /// `acks = all`, which the job file may not weaken (refused at load). Creating the
    /// producer does not wait for the cluster; an error means librdkafka refused the
    /// configuration.
    pub fn new<'a>(
        bootstrap_servers: &str,
        properties: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Result<DeadLetterWriter, String> {
        let producer = producer_config(bootstrap_servers, properties)
            .create()
            .map_err(|e| format!("dead-letter producer: {e}"))?;
        Ok(DeadLetterWriter { producer })
    }

    /// Writes one dead letter to `topic` and waits for the broker's acknowledgement.
    pub async fn send(&self, topic: &str, letter: &DeadLetter<'_>) -> Result<(), String> {
        let partition = letter.origin.map(|o| o.1.to_string());
        let offset = letter.origin.map(|o| o.2.to_string());
        let mut headers = OwnedHeaders::new().insert(Header {
            key: "lockgate.error",
            value: Some(letter.error),
        });
        let optional = [
            ("lockgate.topic", letter.origin.map(|o| o.0)),
            ("lockgate.partition", partition.as_deref()),
            ("lockgate.offset", offset.as_deref()),
            ("lockgate.index", letter.index),
            ("lockgate.id", letter.id),
        ];
        for (key, value) in optional {
            if let Some(v) = value {
                headers = headers.insert(Header {
                    key,
                    value: Some(v),
                });
            }
        }
        let mut record = FutureRecord::<[u8], [u8]>::to(topic)
            .payload(letter.payload)
            .headers(headers);
        if let Some(k) = letter.key {
            record = record.key(k);
        }
        self.producer
            .send(record, SEND_TIMEOUT)
            .await
            .map(|_| ())
            .map_err(|(e, _)| format!("dead-letter to {topic} failed: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn the_producer_is_idempotent_and_takes_every_producer_property() {
        let props: BTreeMap<String, String> = [
            ("security.protocol", "sasl_ssl"),
            ("message.max.bytes", "2000"),
            ("linger.ms", "7"),
            ("fetch.max.bytes", "1048576"),
            ("group.id", "g"),
            ("auto.offset.reset", "earliest"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let c = producer_config("k:9092", &props);
        assert_eq!(c.get("enable.idempotence"), Some("true"));
        assert_eq!(c.get("acks"), Some("all"));
        assert_eq!(c.get("bootstrap.servers"), Some("k:9092"));
        assert_eq!(c.get("security.protocol"), Some("sasl_ssl"));
        assert_eq!(c.get("message.max.bytes"), Some("2000"));
        assert_eq!(c.get("linger.ms"), Some("7"));
        for consumer_only in ["fetch.max.bytes", "group.id", "auto.offset.reset"] {
            assert_eq!(c.get(consumer_only), None, "{consumer_only}");
        }
    }
}
