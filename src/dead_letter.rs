//! Dead letters: records that cannot be decoded (the Kafka source), that a transform or
//! a window fails on or finds late, or that a sink's destination refuses go to a Kafka
//! topic instead of failing the job, with the same headers from all: `lockgate.error`,
//! and where known `lockgate.topic`, `lockgate.partition`, `lockgate.offset`,
//! `lockgate.index`, `lockgate.id`. Whether a record fails the job, is skipped or
//! becomes a letter is the one policy [`OnError`], whichever key of the job file says it.
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
//! consumer-only ones ([`crate::clients::kafka::applies_to`]), so that dead letters
//! reach the cluster the way the source does.

use crate::clients::kafka::{apply, ClientRole};
use crate::error::JobError;
use crate::record::Record;
use crate::telemetry::metrics::Metrics;
use prometheus::{IntCounter, IntCounterVec};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use std::sync::OnceLock;
use std::time::Duration;

/// How long a dead-letter write may wait for the broker.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// What becomes of a record a step cannot take: the one policy of every job-file key
/// that says so (`on_decode_error`, `on_error`, `on_item_error`, `on_invalid`, and the
/// window's `late`). Which spellings a key takes is its [`Allowed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnError {
    /// Fail the job, naming the record.
    Fail,
    /// Count and log the record, then go on (`skip`; the window's `late` spells it
    /// `drop`).
    Skip,
    /// Write the record, with the error in its headers, to this Kafka topic, then go
    /// on.
    DeadLetter(String),
}

/// The spellings one job-file key takes, in the order its error lists them:
/// `fail`, the word for [`OnError::Skip`], `dead-letter:<topic>`, then [`Allowed::also`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowed {
    /// `fail` is one.
    pub fail: bool,
    /// The word for [`OnError::Skip`] at this key (`skip`, `drop`), if it has one.
    pub skip: Option<&'static str>,
    /// Words the key's reader takes before [`OnError::parse`] (the window's `update`):
    /// only listed in the error.
    pub also: &'static [&'static str],
}

/// What a key with [`Allowed::DECODE`] should say instead of a dead-letter topic when
/// the source has no Kafka cluster to write dead letters to.
pub const USE_FAIL_OR_SKIP: &str = "this source has none: use fail or skip";

impl Allowed {
    /// `fail | skip | dead-letter:<topic>`: the Kafka source's `on_decode_error`, a
    /// transform's `on_error`.
    pub const DECODE: Allowed = Allowed {
        fail: true,
        skip: Some("skip"),
        also: &[],
    };
    /// `fail | dead-letter:<topic>`: a sink's `on_item_error`, the Kafka sink's
    /// `on_invalid` (a sink does not drop what it was given).
    pub const ITEM: Allowed = Allowed {
        fail: true,
        skip: None,
        also: &[],
    };
    /// `drop | dead-letter:<topic> | update`: the window's `late` (whose reader takes
    /// `update` itself).
    pub const LATE: Allowed = Allowed {
        fail: false,
        skip: Some("drop"),
        also: &["update"],
    };
}

impl OnError {
    /// Parses `s` as one of the spellings `allowed` takes; `dead-letter:` needs a
    /// topic. The error lists the spellings: "`{s}` is not one of fail, skip,
    /// dead-letter:<topic>".
    pub fn parse(s: &str, allowed: Allowed) -> Result<OnError, String> {
        if allowed.fail && s == "fail" {
            return Ok(OnError::Fail);
        }
        if allowed.skip == Some(s) {
            return Ok(OnError::Skip);
        }
        match s.strip_prefix("dead-letter:") {
            Some(t) if !t.is_empty() => Ok(OnError::DeadLetter(t.to_string())),
            _ => {
                let words: Vec<&str> = allowed
                    .fail
                    .then_some("fail")
                    .into_iter()
                    .chain(allowed.skip)
                    .chain(["dead-letter:<topic>"])
                    .chain(allowed.also.iter().copied())
                    .collect();
                Err(format!("`{s}` is not one of {}", words.join(", ")))
            }
        }
    }

    /// The dead-letter topic, if the policy writes dead letters.
    pub fn topic(&self) -> Option<&str> {
        match self {
            OnError::DeadLetter(t) => Some(t),
            _ => None,
        }
    }
}

/// Why a record became a dead letter, as the `reason` label of
/// `lockgate_dead_letters_total`: a short name that stays the same from one release to
/// the next (the full error goes into the letter's `lockgate.error` header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The source could not decode the record (`decode`).
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

/// Where a dead letter came from and why it is one. Every letter names its
/// [`Reason`]: [`DeadLetter::new`] or [`DeadLetter::of`] takes it.
#[derive(Debug, Clone)]
pub struct DeadLetter<'a> {
    pub error: &'a str,
    /// The `reason` label it is counted under.
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
    /// The letter of `payload`, which failed with `error`, counted under `reason`;
    /// nothing else known of it yet.
    pub fn new(error: &'a str, reason: Reason, payload: &'a [u8]) -> DeadLetter<'a> {
        DeadLetter {
            error,
            reason,
            origin: None,
            index: None,
            id: None,
            key: None,
            payload,
            schema_id: None,
        }
    }

    /// The letter of a record of the job (its key, value and origin) that failed
    /// with `error`.
    pub fn of(record: &'a Record, error: &'a str, reason: Reason) -> DeadLetter<'a> {
        DeadLetter::new(error, reason, &record.value)
            .with_origin(
                record
                    .origin
                    .as_ref()
                    .map(|o| (&*o.stream, o.partition, o.offset)),
            )
            .with_key(record.key.as_deref())
    }

    /// With the source record's Kafka coordinates (topic, partition, offset).
    pub fn with_origin(mut self, origin: Option<(&'a str, i32, i64)>) -> DeadLetter<'a> {
        self.origin = origin;
        self
    }

    /// With the index and document id the record was meant for.
    pub fn with_target(mut self, index: &'a str, id: &'a str) -> DeadLetter<'a> {
        self.index = Some(index);
        self.id = Some(id);
        self
    }

    /// With the record's key.
    pub fn with_key(mut self, key: Option<&'a [u8]>) -> DeadLetter<'a> {
        self.key = key;
        self
    }

    /// With the writer schema id of a framed record.
    pub fn with_schema_id(mut self, schema_id: Option<u32>) -> DeadLetter<'a> {
        self.schema_id = schema_id;
        self
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
    /// producer ([`crate::clients::kafka::applies_to`]), then sets `enable.idempotence = true` and
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

/// The dead letters of an operator (a transform chain, a window), whose `process` is
/// not async: one writer for every policy of the operator, and the count of the
/// records it skipped.
#[derive(Default)]
pub struct Letters {
    writer: Option<DeadLetterWriter>,
    skipped: u64,
    task: String,
}

/// What [`Letters::open`] needs to know of the operator: its uid and subtask (the
/// labels its letters are counted under) and how its errors name it.
pub struct LettersOf<'a> {
    /// The operator's task name in logs (`window-1[0]`).
    pub task: String,
    /// What the operator is in an error (`a transform`, `a window`).
    pub what: &'a str,
    pub metrics: &'a Metrics,
    pub operator: &'a str,
    pub subtask: u16,
    /// The reasons its letters are counted under (their series exist at 0).
    pub reasons: &'a [Reason],
}

impl Letters {
    /// Made ready for `policies`: when one of them dead-letters, a writer to `cluster`
    /// (the source's Kafka cluster: its bootstrap servers and client properties),
    /// kept from an earlier open if there was one. No cluster while a policy
    /// dead-letters is an error naming the operator.
    pub fn open(
        &mut self,
        of: LettersOf<'_>,
        policies: &[&OnError],
        cluster: Option<(&str, &crate::secret::Properties)>,
    ) -> crate::error::Result<()> {
        self.task = of.task;
        if self.writer.is_some() || !policies.iter().any(|p| p.topic().is_some()) {
            return Ok(());
        }
        let (servers, properties) = cluster.ok_or_else(|| {
            JobError::Other(format!(
                "{} dead-letters, and the job has no Kafka cluster",
                of.what
            ))
        })?;
        let writer = DeadLetterWriter::new(servers, properties)
            .map_err(JobError::Other)?
            .counted(of.metrics, of.operator, of.subtask, of.reasons);
        self.writer = Some(writer);
        Ok(())
    }

    /// What `policy` makes of `record`, which failed with `why`: the job fails with
    /// `why`; or the record is counted and skipped (logged as `skipping` at the 1st,
    /// 2nd, 4th, ... skip); or it is written to the policy's topic under `reason`,
    /// and this returns once the broker acknowledged it.
    pub fn refuse(
        &mut self,
        policy: &OnError,
        record: &Record,
        why: String,
        reason: Reason,
        skipping: &str,
    ) -> crate::error::Result<()> {
        match policy {
            OnError::Fail => Err(JobError::Other(why)),
            OnError::Skip => {
                self.skipped += 1;
                if self.skipped.is_power_of_two() {
                    tracing::warn!(task = %self.task, error = %why, skipped = self.skipped, "{skipping}");
                }
                Ok(())
            }
            OnError::DeadLetter(topic) => self.write(topic, record, &why, reason),
        }
    }

    /// Writes `record`, which failed with `why`, to `topic` under `reason`, and
    /// returns once the broker acknowledged it: the letter is in its topic before the
    /// record counts as handled (and before the next barrier passes the operator).
    pub fn write(
        &self,
        topic: &str,
        record: &Record,
        why: &str,
        reason: Reason,
    ) -> crate::error::Result<()> {
        let writer = self
            .writer
            .as_ref()
            .ok_or_else(|| JobError::Other(format!("{why}: no dead-letter writer")))?;
        let letter = DeadLetter::of(record, why, reason);
        let handle = tokio::runtime::Handle::current();
        tokio::task::block_in_place(|| handle.block_on(writer.send(topic, &letter)))
            .map_err(JobError::Other)
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
        // `ALL` is in discriminant order: `LetterCounts` indexes it by `reason as usize`.
        for (i, r) in Reason::ALL.into_iter().enumerate() {
            assert_eq!(r as usize, i, "{r:?}");
        }
    }

    /// Each writer of dead letters and the `reason` labels its letters are counted
    /// under (each series exists at 0 from its start): the labels a dashboard queries.
    #[test]
    fn every_producer_names_its_reasons() {
        let labels = |rs: &[Reason]| rs.iter().map(|r| r.label()).collect::<Vec<_>>();
        let table: [(&str, &[Reason], &[&str]); 6] = [
            (
                "kafka source: a record it cannot decode",
                crate::connectors::kafka::source::LETTERS,
                &["decode"],
            ),
            (
                "kafka sink: a record whose key cannot be read",
                crate::connectors::kafka::sink::LETTERS,
                &["invalid_document"],
            ),
            (
                "elasticsearch sink: an action the cluster refused",
                Reason::REFUSALS,
                &[
                    "mapping",
                    "invalid_document",
                    "version_conflict",
                    "document_missing",
                    "too_large",
                    "rejected",
                ],
            ),
            (
                "postgres sink: a record the table cannot take",
                crate::connectors::postgres::writer::LETTERS,
                &["mapping", "invalid_document", "rejected"],
            ),
            (
                "a transform chain: a record a transform fails on",
                crate::transforms::LETTERS,
                &["transform"],
            ),
            (
                "a window: a late record, a record it cannot read",
                crate::operators::window::operator::LETTERS,
                &["late", "transform"],
            ),
        ];
        for (producer, reasons, want) in table {
            assert_eq!(labels(reasons), want, "{producer}");
        }
    }

    #[test]
    fn a_letter_carries_the_reason_it_was_made_with() {
        let record = crate::record::Record {
            key: Some(b"k".to_vec().into()),
            value: b"v".to_vec().into(),
            origin: Some(crate::record::Origin {
                stream: "t".into(),
                partition: 2,
                offset: 7,
            }),
            ..Default::default()
        };
        for r in Reason::ALL {
            let l = DeadLetter::of(&record, "e", r);
            assert_eq!(l.reason, r);
            assert_eq!(l.origin, Some(("t", 2, 7)));
            assert_eq!(l.key, Some(&b"k"[..]));
            assert_eq!(l.payload, &b"v"[..]);
            assert_eq!(DeadLetter::new("e", r, b"p").reason, r);
        }
        let l = DeadLetter::new("e", Reason::Decode, b"p")
            .with_target("i", "d")
            .with_schema_id(Some(3));
        assert_eq!(
            (l.index, l.id, l.schema_id),
            (Some("i"), Some("d"), Some(3))
        );
        assert_eq!((l.origin, l.key), (None, None));
    }

    #[test]
    fn each_key_takes_its_spellings_and_lists_them() {
        use OnError::{Fail, Skip};
        let dl = || OnError::DeadLetter("dlq".to_string());
        let table: [(Allowed, &str, Result<OnError, &str>); 14] = [
            (Allowed::DECODE, "fail", Ok(Fail)),
            (Allowed::DECODE, "skip", Ok(Skip)),
            (Allowed::DECODE, "dead-letter:dlq", Ok(dl())),
            (
                Allowed::DECODE,
                "drop",
                Err("`drop` is not one of fail, skip, dead-letter:<topic>"),
            ),
            (
                Allowed::DECODE,
                "dead-letter:",
                Err("`dead-letter:` is not one of fail, skip, dead-letter:<topic>"),
            ),
            (Allowed::ITEM, "fail", Ok(Fail)),
            (Allowed::ITEM, "dead-letter:dlq", Ok(dl())),
            (
                Allowed::ITEM,
                "skip",
                Err("`skip` is not one of fail, dead-letter:<topic>"),
            ),
            (
                Allowed::ITEM,
                "dead-letter",
                Err("`dead-letter` is not one of fail, dead-letter:<topic>"),
            ),
            (Allowed::LATE, "drop", Ok(Skip)),
            (Allowed::LATE, "dead-letter:dlq", Ok(dl())),
            (
                Allowed::LATE,
                "fail",
                Err("`fail` is not one of drop, dead-letter:<topic>, update"),
            ),
            (
                Allowed::LATE,
                "skip",
                Err("`skip` is not one of drop, dead-letter:<topic>, update"),
            ),
            (
                Allowed::LATE,
                "update",
                Err("`update` is not one of drop, dead-letter:<topic>, update"),
            ),
        ];
        for (allowed, s, want) in table {
            assert_eq!(
                OnError::parse(s, allowed),
                want.map_err(str::to_string),
                "{s} in {allowed:?}"
            );
        }
        assert_eq!(dl().topic(), Some("dlq"));
        assert_eq!((Fail.topic(), Skip.topic()), (None, None));
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
