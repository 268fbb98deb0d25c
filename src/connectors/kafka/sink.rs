//! The Kafka sink (`[sink.kafka]`): the upstream side of a repartition stage.
//!
//! Each record is written to one topic, keyed by the value at a JSON pointer of its
//! payload (so Kafka's partitioner puts every record of a key in one partition), with
//! its payload unchanged and its origin coordinates in the headers `lockgate.topic`,
//! `lockgate.partition` and `lockgate.offset`. A delete (a `debezium` transform's) is
//! written as a tombstone of its key, read from the image before the delete (or the
//! record's own key when it has none), so that a compacted topic forgets the row. The producer is idempotent
//! (`enable.idempotence = true`, `acks = all`), so each partition receives the records
//! of one run in the order they were sent, without gaps or duplicates of its own.
//!
//! A checkpoint waits, at its barrier, until every record sent before it is
//! acknowledged by the broker: a completed checkpoint never stands for a record that
//! could still be lost. After a crash the job replays from that checkpoint and writes
//! some records a second time; a downstream job reading the topic with
//! `origin_headers = true` drops them ([`super::upstream`]). The sink alone is
//! therefore at-least-once, and the pair is exactly-once, without Kafka transactions
//! (which librdkafka cannot resume after a crash).
//!
//! The sink picks each record's partition itself, by Java's hash of the key
//! (`murmur2`, as librdkafka's `murmur2` partitioner and Kafka's default one do) over
//! the topic's partition count at the stage's first start, which every checkpoint
//! keeps. Partitions added to the topic later stay unused by the stage: a key never
//! moves to another partition, neither for a replayed record (whose first copy the
//! job reading the topic knows by its partition's marks) nor for a new one (whose
//! key's state that job keeps per partition).

use super::sink_config::KafkaSinkConfig;
use crate::connector::{Sink, SinkRestore, SubtaskInfo};
use crate::dead_letter::{DeadLetter, DeadLetterWriter, OnError, Reason};
use crate::error::{JobError, Result};
use crate::record::{Batch, Record};
use async_trait::async_trait;
use lockgate_state::CheckpointId;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Message};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tracing::{info, warn};

/// The kind of the Kafka sink in a job graph: the folder's kind, which the source
/// shares.
pub const KIND: &str = super::KIND;

/// The reasons of the sink's dead letters (records whose key cannot be read).
pub(crate) const LETTERS: &[Reason] = &[Reason::InvalidDocument];

impl KafkaSink {
    /// The sink as the runtime takes it: at-least-once on its own (exactly-once with
    /// a downstream job reading `origin_headers`), fed in source order (no `key_by`
    /// before it), and run as members only with a fixed partition count. Its subtasks
    /// share the partition count the first of them reads.
    pub fn spec(cfg: Arc<KafkaSinkConfig>) -> crate::connector::SinkSpec {
        let one_process_only = cfg.partitions.is_none().then(|| {
            (
                "sink.kafka.partitions".to_string(),
                "a repartition stage run as several members needs partitions = N (how many of the topic's partitions it spreads keys over): each member would otherwise take the topic's count at its own first start, and a key would land in two partitions if they differ".to_string(),
            )
        });
        let first = Arc::new(std::sync::OnceLock::new());
        crate::connector::SinkSpec::new(KIND, move |_| {
            Box::new(KafkaSink::sharing(cfg.clone(), first.clone()))
        })
        .with_caps(crate::connector::SinkCaps {
            guarantee: crate::connector::Guarantee::AtLeastOnce,
            // Its deduplication downstream needs each source partition's records
            // written by one producer in the order read: a key_by would spread them.
            needs_source_order: Some("the Kafka sink takes the records of a source partition in the order read: no key_by before it (put keyed operators in the job that reads its topic)".into()),
            one_process_only,
            commits_are_final: false,
        })
    }
}

/// What the producer's delivery reports tell the sink.
#[derive(Default)]
struct Deliveries {
    /// Records sent and not yet acknowledged or failed.
    pending: AtomicU64,
    /// The first delivery failure: the job fails with it (and replays).
    failed: Mutex<Option<String>>,
    /// Set with `failed`: checked before every send, so that nothing is sent after a
    /// record that could not be written.
    any_failed: std::sync::atomic::AtomicBool,
    /// Woken when `pending` reaches 0 or a delivery fails.
    settled: Notify,
}

/// The producer's context: counts delivery reports.
struct Reports(Arc<Deliveries>);

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, m)) = result {
            let mut failed = self.0.failed.lock().expect("lock");
            if failed.is_none() {
                *failed = Some(format!(
                    "writing to {} failed: {e} (librdkafka gave up after its retries)",
                    m.topic()
                ));
            }
            self.0.any_failed.store(true, Ordering::Release);
        }
        if self.0.pending.fetch_sub(1, Ordering::AcqRel) == 1 || result.is_err() {
            self.0.settled.notify_waiters();
        }
    }
}

/// A Kafka sink subtask.
pub struct KafkaSink {
    cfg: Arc<KafkaSinkConfig>,
    name: String,
    producer: Option<Arc<ThreadedProducer<Reports>>>,
    /// The partition count the records are spread over: `partitions` of the job file,
    /// or the topic's at the stage's first start, kept in each checkpoint.
    partitions: u32,
    /// The count the first subtask to open in this process chose, shared by every
    /// subtask and attempt: a restart before the first checkpoint keeps it.
    first: Arc<std::sync::OnceLock<u32>>,
    deliveries: Arc<Deliveries>,
    dead_letter: Option<DeadLetterWriter>,
    written: u64,
    /// Records sent or dead-lettered (`lockgate_records_out_total` of the sink).
    records_out: Option<prometheus::IntCounter>,
}

impl KafkaSink {
    /// A sink subtask writing what `cfg` says.
    pub fn new(cfg: Arc<KafkaSinkConfig>) -> KafkaSink {
        KafkaSink::sharing(cfg, Arc::default())
    }

    /// A sink subtask that shares with the other subtasks and attempts of its job the
    /// partition count chosen first (without `partitions`): build every subtask of
    /// one job with one `first`.
    pub fn sharing(cfg: Arc<KafkaSinkConfig>, first: Arc<std::sync::OnceLock<u32>>) -> KafkaSink {
        KafkaSink {
            cfg,
            name: String::new(),
            producer: None,
            partitions: 0,
            first,
            deliveries: Arc::default(),
            dead_letter: None,
            written: 0,
            records_out: None,
        }
    }

    fn err(&self, message: impl std::fmt::Display) -> JobError {
        JobError::task(&self.name, message)
    }

    /// The first delivery failure so far, as the job's error.
    fn failure(&self) -> Result<()> {
        match self.deliveries.failed.lock().expect("lock").as_ref() {
            Some(e) => Err(self.err(e)),
            None => Ok(()),
        }
    }

    /// Sends one record, waiting while librdkafka's queue is full.
    async fn send(&mut self, r: &Record, key: &[u8]) -> Result<()> {
        let o = r.origin.as_ref().ok_or_else(|| JobError::Unrecoverable {
            task: self.name.clone(),
            message: "a record without origin coordinates reached [sink.kafka], which writes them into its headers".into(),
        })?;
        let (partition, offset) = (o.partition.to_string(), o.offset.to_string());
        let producer = self.producer.clone().expect("opened");
        loop {
            if self.deliveries.any_failed.load(Ordering::Acquire) {
                self.failure()?;
            }
            let headers = OwnedHeaders::new_with_capacity(3)
                .insert(Header {
                    key: super::upstream::TOPIC,
                    value: Some(o.stream.as_bytes()),
                })
                .insert(Header {
                    key: super::upstream::PARTITION,
                    value: Some(partition.as_bytes()),
                })
                .insert(Header {
                    key: super::upstream::OFFSET,
                    value: Some(offset.as_bytes()),
                });
            let mut record = BaseRecord::to(&self.cfg.topic)
                .partition(key_partition(key, self.partitions))
                .key(key)
                .headers(headers);
            // A delete (or a tombstone) is written as a tombstone: no value at all.
            if !(r.tombstone || r.op == crate::record::Op::Delete) {
                record = record.payload(&r.value[..]);
            }
            if let Some(ts) = r.timestamp {
                record = record.timestamp(ts);
            }
            // Counted before the send: the delivery report may come at once.
            self.deliveries.pending.fetch_add(1, Ordering::AcqRel);
            match producer.send(record) {
                Ok(()) => return Ok(()),
                Err((e, _)) => {
                    self.deliveries.pending.fetch_sub(1, Ordering::AcqRel);
                    match e {
                        KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull) => {
                            self.failure()?;
                            tokio::time::sleep(Duration::from_millis(2)).await;
                        }
                        e => {
                            return Err(self.err(format!("cannot write to {}: {e}", self.cfg.topic)))
                        }
                    }
                }
            }
        }
    }

    /// A record whose key cannot be read: failed or dead-lettered, by policy.
    async fn invalid(&self, r: &Record, why: &str) -> Result<()> {
        match &self.cfg.on_invalid {
            OnError::Fail => Err(self.err(why)),
            // Not a spelling of `on_invalid`; a program that sets it drops the record.
            OnError::Skip => {
                warn!(subtask = %self.name, error = %why, "skipping a record whose key cannot be read");
                Ok(())
            }
            OnError::DeadLetter(topic) => {
                let writer = self.dead_letter.as_ref().expect("created in open");
                let letter = DeadLetter::of(r, why, Reason::InvalidDocument);
                writer.send(topic, &letter).await.map_err(|e| self.err(e))
            }
        }
    }

    /// Waits until every record sent so far is acknowledged, or one failed.
    async fn settle(&self, within: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            // Made before the checks: `notify_waiters` reaches a `Notified` from its
            // creation on, so a report between the checks and the wait is not missed.
            let woken = self.deliveries.settled.notified();
            self.failure()?;
            let pending = self.deliveries.pending.load(Ordering::Acquire);
            if pending == 0 {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(JobError::Declined(format!(
                    "{}: {pending} records to {} not acknowledged within {} ms",
                    self.name,
                    self.cfg.topic,
                    within.as_millis()
                )));
            }
            let _ = tokio::time::timeout(left, woken).await;
        }
    }
}

/// The message key of a record: the value at `pointer` of its JSON payload, a string's
/// text as is and any other value as its JSON text.
pub fn message_key(payload: &[u8], pointer: &str) -> std::result::Result<Vec<u8>, String> {
    let v: serde_json::Value =
        serde_json::from_slice(payload).map_err(|e| format!("the payload is not JSON: {e}"))?;
    match v.pointer(pointer) {
        Some(serde_json::Value::String(s)) => Ok(s.clone().into_bytes()),
        Some(serde_json::Value::Null) | None => Err(format!("no key at {pointer}")),
        Some(other) => Ok(serde_json::to_vec(other).expect("a JSON value serializes")),
    }
}

#[async_trait]
impl Sink for KafkaSink {
    async fn open(&mut self, info: &SubtaskInfo, restored: &SinkRestore) -> Result<()> {
        self.name = info.name.clone();
        let producer: ThreadedProducer<Reports> = self
            .cfg
            .client_config()
            .create_with_context(Reports(self.deliveries.clone()))
            .map_err(|e| self.err(format!("cannot create the producer: {e}")))?;
        let producer = Arc::new(producer);
        self.producer = Some(producer.clone());
        let topic = self.cfg.topic.clone();
        let now = tokio::task::spawn_blocking(move || partition_count(&producer, &topic))
            .await
            .map_err(|e| self.err(e))?
            .map_err(|e| self.err(e))?;
        let before = restored
            .states
            .iter()
            .map(|(_, s)| decode_state(s))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| JobError::Unrecoverable {
                task: self.name.clone(),
                message: format!("restored state: {e}"),
            })?;
        let recorded: Vec<u32> = before.into_iter().flatten().collect();
        let decided = PartitionFacts {
            topic: &self.cfg.topic,
            configured: self.cfg.partitions,
            recorded: &recorded,
            earlier: self.first.get().copied(),
            now,
        };
        self.partitions = partitions_to_use(&decided).map_err(|why| JobError::Unrecoverable {
            task: self.name.clone(),
            message: format!(
                "{why} (restored checkpoint {})",
                restored.checkpoint.map_or("-".into(), |c| c.to_string())
            ),
        })?;
        // Subtasks open concurrently: one of them decides first for the process.
        let first = *self.first.get_or_init(|| self.partitions);
        if first != self.partitions {
            // A restart finds `first` set and agrees with it.
            return Err(self.err(format!(
                "the subtasks of this stage saw `{}` with {first} and with {} partitions at their first start (partitions were being added); set sink.kafka.partitions",
                self.cfg.topic, self.partitions
            )));
        }
        if self.partitions < now {
            warn!(subtask = %self.name, topic = %self.cfg.topic, partitions = now, used = self.partitions, "the topic has more partitions than at this stage's first start: the stage keeps writing to the first ones, so that no key moves (a new stage with a new topic uses them all)");
        }
        let m = info.telemetry.metrics();
        self.records_out =
            Some(m.task_counter(&m.records_out, crate::connector::SINK_UID, info.index));
        if let OnError::DeadLetter(_) = self.cfg.on_invalid {
            self.dead_letter = Some(
                DeadLetterWriter::new(&self.cfg.bootstrap_servers, &self.cfg.properties)
                    .map_err(|e| self.err(e))?
                    .counted(info.telemetry.metrics(), "sink", info.index, LETTERS),
            );
        }
        Ok(())
    }

    async fn invoke(&mut self, batch: Batch) -> Result<()> {
        self.failure()?;
        for r in &batch {
            // A delete becomes a tombstone of its key: read from the image before the
            // delete when it has one, else the record's own key.
            // (a JSON key through the same pointer, as Debezium's `{"id": 7}`, so that
            // the tombstone has the key its rows were written with).
            let key = match (&r.key, r.tombstone) {
                (Some(k), true) => message_key(k, &self.cfg.key)
                    .map_err(|e| format!("a record without a value is keyed by its key: {e}")),
                (None, true) => Err("a record without a value has no key to write".into()),
                _ => message_key(&r.value, &self.cfg.key),
            };
            match key {
                Ok(key) => self.send(r, &key).await?,
                Err(why) => {
                    let why = format!("{}: {why}", crate::record::describe(r));
                    self.invalid(r, &why).await?
                }
            }
        }
        self.written += batch.len() as u64;
        if let Some(c) = &self.records_out {
            c.inc_by(batch.len() as u64);
        }
        Ok(())
    }

    async fn snapshot(&mut self, _id: CheckpointId) -> Result<Vec<u8>> {
        // What the barrier needs is that every record before it is in the topic; the
        // state only says how many partitions the records were spread over.
        self.settle(self.cfg.flush_timeout).await?;
        Ok(encode_state(self.partitions))
    }

    async fn notify_checkpoint_complete(&mut self, _id: CheckpointId) -> Result<()> {
        Ok(())
    }

    async fn close(&mut self) -> Result<()> {
        self.settle(self.cfg.flush_timeout).await?;
        info!(subtask = %self.name, records = self.written, topic = %self.cfg.topic, "kafka sink closed");
        Ok(())
    }
}

impl Drop for KafkaSink {
    fn drop(&mut self) {
        // Dropping a producer flushes and joins its thread (up to half a second): not on
        // a runtime worker.
        if let Some(p) = self.producer.take() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn_blocking(move || drop(p));
            }
        }
    }
}

/// The sink's state in a checkpoint: format version 1, then the topic's partition count
/// (u32 little endian).
fn encode_state(partitions: u32) -> Vec<u8> {
    let mut v = vec![1u8];
    v.extend_from_slice(&partitions.to_le_bytes());
    v
}

/// The partition count of a state [`encode_state`] wrote (None: an empty state, which
/// records none).
fn decode_state(s: &[u8]) -> std::result::Result<Option<u32>, String> {
    match s {
        [] => Ok(None),
        [1, a, b, c, d] => Ok(Some(u32::from_le_bytes([*a, *b, *c, *d]))),
        _ => Err(format!(
            "not a Kafka sink state of format 1 ({} bytes)",
            s.len()
        )),
    }
}

/// What decides the partition count of a repartition stage's sink subtask.
#[derive(Debug, Clone, Copy)]
pub struct PartitionFacts<'a> {
    pub topic: &'a str,
    /// `partitions` of the job file.
    pub configured: Option<u32>,
    /// The counts the restored checkpoint's sink subtasks recorded (none: no state).
    pub recorded: &'a [u32],
    /// The count an earlier subtask or attempt of this process chose.
    pub earlier: Option<u32>,
    /// The topic's partition count now.
    pub now: u32,
}

/// The partition count to spread records over: `partitions` of the job file, else the
/// one the restored checkpoint recorded, else the one this process chose first, else
/// the topic's now (the stage's first start). The count stays whatever the topic has
/// now, so that no key moves; it is refused when the recorded counts disagree with
/// each other or with `partitions` (keys would be in two partitions), or when the
/// topic has fewer partitions (it was recreated, or not grown yet).
pub fn partitions_to_use(f: &PartitionFacts<'_>) -> std::result::Result<u32, String> {
    let topic = f.topic;
    if let Some(&first) = f.recorded.first() {
        if let Some(other) = f.recorded.iter().find(|c| **c != first) {
            return Err(format!(
                "the restored checkpoint spread the records of `{topic}` over {first} partitions in one subtask and over {other} in another: keys were not kept in one partition; start the repartition stage and the job reading its topic over with a new topic"
            ));
        }
        if let Some(c) = f.configured.filter(|c| *c != first) {
            return Err(format!(
                "sink.kafka.partitions is {c}, but the restored checkpoint spread the records of `{topic}` over {first} partitions: changing it would move keys to other partitions; set it back to {first}, or start a new stage with a new topic"
            ));
        }
    }
    let count = f
        .configured
        .or(f.recorded.first().copied())
        .or(f.earlier)
        .unwrap_or(f.now);
    if count > f.now {
        return Err(format!(
            "the topic `{topic}` has {} partitions, fewer than the {count} this repartition stage writes to ({})",
            f.now,
            if f.configured.is_some() {
                "sink.kafka.partitions: add partitions to the topic, or lower it before the stage's first start"
            } else {
                "was it recreated?"
            }
        ));
    }
    Ok(count)
}

/// The partition of a record with `key` over `partitions` partitions: Java's
/// `murmur2(key) & 0x7fffffff % partitions`, as Kafka's default partitioner computes it.
pub fn key_partition(key: &[u8], partitions: u32) -> i32 {
    // SAFETY: a pure function of the key bytes and the count; it reads `key_len`
    // bytes at `key` and never touches the (null) topic or opaques.
    unsafe {
        rdkafka::bindings::rd_kafka_msg_partitioner_murmur2(
            std::ptr::null(),
            key.as_ptr().cast(),
            key.len(),
            partitions as i32,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    }
}

/// The partition count of `topic`, from the cluster's metadata.
fn partition_count(
    producer: &ThreadedProducer<Reports>,
    topic: &str,
) -> std::result::Result<u32, String> {
    use rdkafka::producer::Producer;
    let md = producer
        .client()
        .fetch_metadata(Some(topic), Duration::from_secs(30))
        .map_err(|e| format!("cannot read the metadata of `{topic}`: {e}"))?;
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .ok_or_else(|| format!("the cluster did not describe `{topic}`"))?;
    if let Some(e) = t.error() {
        return Err(format!(
            "the topic `{topic}` is not usable ({e:?}): create it before the repartition stage starts; its partition count bounds the parallelism of the job that reads it"
        ));
    }
    match t.partitions().len() {
        0 => Err(format!("the topic `{topic}` has no partitions")),
        n => Ok(n as u32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_by_before_the_kafka_sink_is_refused() {
        let section: crate::connectors::kafka::sink_config::KafkaSinkSection =
            toml::from_str("topic = \"t\"\nkey = \"/u\"\nbootstrap_servers = \"k\"").unwrap();
        let cfg = Arc::new(section.config(None, 1000).unwrap());
        let e = crate::job::Job::builder("j")
            .key_by(|_| Ok(Vec::new()))
            .sink_spec(KafkaSink::spec(cfg))
            .build()
            .err()
            .expect("refused");
        assert!(e.to_string().contains("no key_by before it"), "{e}");
    }

    #[test]
    fn the_partition_count_of_the_first_start_stays() {
        let facts = |configured, recorded: &'static [u32], earlier, now| PartitionFacts {
            topic: "t",
            configured,
            recorded,
            earlier,
            now,
        };
        let use_ = |c, r, e, n| partitions_to_use(&facts(c, r, e, n));
        assert_eq!(use_(None, &[], None, 8), Ok(8), "a first start");
        assert_eq!(use_(None, &[8, 8], None, 8), Ok(8));
        assert_eq!(use_(None, &[8, 8], None, 12), Ok(8), "partitions added");
        // A restart in process before the first checkpoint keeps the first count.
        assert_eq!(use_(None, &[], Some(8), 12), Ok(8));
        // The job file's count wins over the topic's, first start or not.
        assert_eq!(use_(Some(6), &[], None, 12), Ok(6));
        assert_eq!(use_(Some(6), &[], Some(12), 12), Ok(6));
        assert_eq!(use_(Some(6), &[6, 6], None, 12), Ok(6));
        let e = use_(Some(8), &[6], None, 12).unwrap_err();
        assert!(
            e.contains("sink.kafka.partitions is 8") && e.contains("over 6"),
            "{e}"
        );
        let e = use_(Some(8), &[], None, 6).unwrap_err();
        assert!(
            e.contains("has 6 partitions, fewer than the 8") && e.contains("sink.kafka.partitions"),
            "{e}"
        );
        let e = use_(None, &[12, 8, 12], None, 12).unwrap_err();
        assert!(
            e.contains("over 12 partitions") && e.contains("over 8"),
            "{e}"
        );
        let e = use_(None, &[8], None, 4).unwrap_err();
        assert!(e.contains("has 4 partitions, fewer than the 8"), "{e}");
        assert_eq!(decode_state(&encode_state(12)), Ok(Some(12)));
        assert_eq!(decode_state(&[]), Ok(None), "a state that records no count");
        assert!(decode_state(&[2, 0, 0, 0, 0]).is_err());
    }

    #[test]
    fn keys_are_partitioned_as_kafka_does() {
        // Kafka's `Utils.murmur2` of these keys (from Kafka's own tests), made
        // positive, modulo a count.
        for (key, hash) in [
            // librdkafka's test vectors of its Java-compatible murmur2.
            ("kafka", i64::from(0xd067_cf64u32 as i32)),
            ("giberish123456789", i64::from(0x8f55_2b0cu32 as i32)),
            ("21", -973_932_308i64),
            ("foobar", -790_332_482),
            ("a-little-bit-long-string", -985_981_536),
            ("a-little-bit-longer-string", -1_486_304_829),
        ] {
            for n in [1u32, 3, 8, 100] {
                let want = ((hash & 0x7fff_ffff) % i64::from(n)) as i32;
                assert_eq!(key_partition(key.as_bytes(), n), want, "{key} over {n}");
            }
        }
    }

    #[test]
    fn the_key_is_a_strings_text_or_a_values_json() {
        assert_eq!(message_key(br#"{"user":"u-1"}"#, "/user").unwrap(), b"u-1");
        assert_eq!(message_key(br#"{"n":{"id":7}}"#, "/n/id").unwrap(), b"7");
        assert_eq!(message_key(br#"{"n":[1,2]}"#, "/n").unwrap(), b"[1,2]");
        for (payload, want) in [
            (&br#"{"user":null}"#[..], "no key at /user"),
            (br#"{"other":1}"#, "no key at /user"),
            (b"not json", "not JSON"),
        ] {
            let e = message_key(payload, "/user").unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }
}
