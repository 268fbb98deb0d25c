//! Dead letters: records that cannot be decoded (the Kafka source) or that Elasticsearch
//! refuses (the Elasticsearch sink) go to a Kafka topic instead of failing the job, with
//! the same headers from both: `lockgate.error`, and where known `lockgate.topic`,
//! `lockgate.partition`, `lockgate.offset`, `lockgate.index`, `lockgate.id`.
//!
//! A write returns only once the broker acknowledged it (`acks = all`): the caller moves
//! its position, or resolves the action, only after that, so a dead letter is never lost.

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

/// A producer of dead letters (one per subtask).
pub struct DeadLetterWriter {
    producer: FutureProducer,
}

impl DeadLetterWriter {
    /// A writer to the cluster at `bootstrap_servers`. Of `properties` (the Kafka
    /// source's librdkafka properties) it takes the connection and security ones
    /// (`security.*`, `sasl.*`, `ssl.*`, `socket.*`, `client.*`, `broker.*`), so that
    /// dead letters reach a secured cluster the way the source does.
    pub fn new<'a>(
        bootstrap_servers: &str,
        properties: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Result<DeadLetterWriter, String> {
        let mut c = ClientConfig::new();
        let shared = [
            "security.",
            "sasl.",
            "ssl.",
            "socket.",
            "client.",
            "broker.",
        ];
        for (k, v) in properties {
            if shared.iter().any(|p| k.starts_with(p)) {
                c.set(k, v);
            }
        }
        c.set("bootstrap.servers", bootstrap_servers)
            .set("acks", "all");
        let producer = c
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
