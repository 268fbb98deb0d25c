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

use crate::clients::kafka::{apply, ClientRole};
use crate::telemetry::metrics::Metrics;
use prometheus::{IntCounter, IntCounterVec};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use std::sync::OnceLock;
use std::time::Duration;

/// How long a dead-letter write may wait for the broker.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// What a sink does with a record it cannot write (`on_item_error`): a record the
/// Elasticsearch cluster refuses, a row a table cannot take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemErrorPolicy {
    /// Fail the job, naming the record.
    Fail,
    /// Write the original record and the error to this Kafka topic.
    DeadLetter(String),
}

impl ItemErrorPolicy {
    /// Parses `fail` or `dead-letter:<topic>`.
    pub fn parse(s: &str) -> Result<ItemErrorPolicy, String> {
        match s {
            "fail" => Ok(ItemErrorPolicy::Fail),
            _ => match s.strip_prefix("dead-letter:") {
                Some(t) if !t.is_empty() => Ok(ItemErrorPolicy::DeadLetter(t.to_string())),
                _ => Err(format!("`{s}` is not one of fail, dead-letter:<topic>")),
            },
        }
    }
}

/// Why a record became a dead letter, as the `reason` label of
/// `lockgate_dead_letters_total`: a short name that stays the same from one release to
/// the next (the full error goes into the letter's `lockgate.error` header).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reason {
    /// The source could not decode the record (`decode`).
    #[default]
    Decode,
    /// A transform of the job failed on the record (`transform`).
    Transform,
    /// The document does not fit the index mapping: a mapper or document parsing
    /// error, or a field strict mapping does not allow (`mapping`).
    Mapping,
    /// No valid bulk action can be made of the record: no usable id or index, or a
    /// body that is not one JSON object (`invalid_document`).
    InvalidDocument,
    /// A version conflict that does not mean "already written" (`version_conflict`).
    VersionConflict,
    /// An update of a document that does not exist (`document_missing`).
    DocumentMissing,
    /// One action larger than the cluster accepts in a request (`too_large`).
    TooLarge,
    /// Any other refusal by Elasticsearch (`rejected`).
    Rejected,
    /// The record came after its window had fired (`late`).
    Late,
}

impl Reason {
    /// Every reason, in label order of [`Reason::label`].
    pub const ALL: [Reason; 9] = [
        Reason::Decode,
        Reason::Transform,
        Reason::Mapping,
        Reason::InvalidDocument,
        Reason::VersionConflict,
        Reason::DocumentMissing,
        Reason::TooLarge,
        Reason::Rejected,
        Reason::Late,
    ];

    /// The reasons of the Elasticsearch sink's letters: every one but `decode`,
    /// `transform` and `late`.
    pub const REFUSALS: &[Reason] = Reason::ALL.split_at(2).1.split_at(6).0;

    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Reason::Decode => "decode",
            Reason::Transform => "transform",
            Reason::Mapping => "mapping",
            Reason::InvalidDocument => "invalid_document",
            Reason::VersionConflict => "version_conflict",
            Reason::DocumentMissing => "document_missing",
            Reason::TooLarge => "too_large",
            Reason::Rejected => "rejected",
            Reason::Late => "late",
        }
    }

    /// The reason of an action the Elasticsearch sink gave up, from the error type of
    /// its refusal (Elasticsearch's `error.type`, or the sink's own `invalid_document`
    /// and `content_too_long` for what it could not send).
    pub fn of_refusal(error_type: &str) -> Reason {
        match error_type {
            "mapper_parsing_exception"
            | "document_parsing_exception"
            | "strict_dynamic_mapping_exception" => Reason::Mapping,
            "invalid_document" => Reason::InvalidDocument,
            "version_conflict_engine_exception" => Reason::VersionConflict,
            "document_missing_exception" => Reason::DocumentMissing,
            "content_too_long" => Reason::TooLarge,
            _ => Reason::Rejected,
        }
    }
}

/// Where a dead letter came from and why it is one.
#[derive(Debug, Clone, Default)]
pub struct DeadLetter<'a> {
    pub error: &'a str,
    /// The `reason` label it is counted under (the source's letters: `decode`).
    pub reason: Reason,
    /// The source record's coordinates, if it came from Kafka.
    pub origin: Option<(&'a str, i32, i64)>,
    /// The Elasticsearch index and document id it was meant for.
    pub index: Option<&'a str>,
    pub id: Option<&'a str>,
    pub key: Option<&'a [u8]>,
    pub payload: &'a [u8],
    /// The writer schema id of a framed record that could not be decoded.
    pub schema_id: Option<u32>,
}

impl<'a> DeadLetter<'a> {
    /// The letter of a record of the job (its key, value and origin) that failed
    /// with `error`.
    pub fn of(record: &'a crate::record::Record, error: &'a str, reason: Reason) -> DeadLetter<'a> {
        DeadLetter {
            error,
            reason,
            origin: record
                .origin
                .as_ref()
                .map(|o| (&*o.stream, o.partition, o.offset)),
            key: record.key.as_deref(),
            payload: &record.value,
            ..DeadLetter::default()
        }
    }
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
    counts: Option<LetterCounts>,
}

/// The `lockgate_dead_letters_total` series of one subtask, one per reason, each
/// looked up once (the first letter of a reason not made at start).
struct LetterCounts {
    vec: IntCounterVec,
    labels: [String; 3],
    by_reason: [OnceLock<IntCounter>; Reason::ALL.len()],
}

impl LetterCounts {
    fn get(&self, reason: Reason) -> &IntCounter {
        self.by_reason[reason as usize].get_or_init(|| {
            let [job, operator, subtask] = &self.labels;
            self.vec
                .with_label_values(&[job.as_str(), operator, subtask, reason.label()])
        })
    }
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
        Ok(DeadLetterWriter {
            producer,
            counts: None,
        })
    }

    /// Counts every letter written in `lockgate_dead_letters_total` of `metrics`, under
    /// `operator` and `subtask`; the series of `reasons` exist (at 0) from now on, so
    /// that a query for them shows 0 rather than no data.
    pub fn counted(
        mut self,
        metrics: &Metrics,
        operator: &str,
        subtask: u16,
        reasons: &[Reason],
    ) -> DeadLetterWriter {
        let counts = LetterCounts {
            vec: metrics.dead_letters.clone(),
            labels: [
                metrics.job().to_string(),
                operator.to_string(),
                subtask.to_string(),
            ],
            by_reason: Default::default(),
        };
        for &r in reasons {
            counts.get(r);
        }
        self.counts = Some(counts);
        self
    }

    /// Writes one dead letter to `topic` and waits for the broker's acknowledgement;
    /// then, and only then, counts it under its reason.
    pub async fn send(&self, topic: &str, letter: &DeadLetter<'_>) -> Result<(), String> {
        let partition = letter.origin.map(|o| o.1.to_string());
        let offset = letter.origin.map(|o| o.2.to_string());
        let schema_id = letter.schema_id.map(|id| id.to_string());
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
            ("lockgate.schema.id", schema_id.as_deref()),
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
            .map_err(|(e, _)| format!("dead-letter to {topic} failed: {e}"))?;
        if let Some(c) = &self.counts {
            c.get(letter.reason).inc();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_refusal_has_a_stable_reason_label() {
        let cases = [
            ("mapper_parsing_exception", "mapping"),
            ("document_parsing_exception", "mapping"),
            ("strict_dynamic_mapping_exception", "mapping"),
            (
                crate::connectors::elasticsearch::bulk::INVALID_DOCUMENT,
                "invalid_document",
            ),
            ("version_conflict_engine_exception", "version_conflict"),
            ("document_missing_exception", "document_missing"),
            ("content_too_long", "too_large"),
            ("illegal_argument_exception", "rejected"),
            ("", "rejected"),
        ];
        for (error_type, label) in cases {
            assert_eq!(
                Reason::of_refusal(error_type).label(),
                label,
                "{error_type}"
            );
        }
        assert_eq!(DeadLetter::default().reason.label(), "decode");
        // `ALL` is in discriminant order: `LetterCounts` indexes it by `reason as usize`.
        for (i, r) in Reason::ALL.into_iter().enumerate() {
            assert_eq!(r as usize, i, "{r:?}");
        }
    }

    #[tokio::test]
    async fn the_reasons_given_exist_at_zero_before_any_letter() {
        let m = Metrics::new("j");
        let _w = DeadLetterWriter::new("127.0.0.1:1", &BTreeMap::new())
            .unwrap()
            .counted(&m, "sink", 3, Reason::REFUSALS);
        let text = m.encode();
        for r in Reason::REFUSALS {
            let series = format!(
                "lockgate_dead_letters_total{{job=\"j\",operator=\"sink\",reason=\"{}\",subtask=\"3\"}} 0",
                r.label()
            );
            assert!(text.contains(&series), "{series} in\n{text}");
        }
        assert!(!text.contains("reason=\"decode\""), "{text}");
    }

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
