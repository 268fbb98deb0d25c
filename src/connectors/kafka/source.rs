//! The Kafka source subtask.

use super::config::{KafkaSourceConfig, TopicSelector};
use super::fetcher::{
    self, Fetched, FetchedBatch, HeaderAt, HeaderCopy, KafkaConsumer, LiveEnds, LogContext,
    OriginHeaders, Run,
};
use super::start_position::{check_in_range, resolve_timestamp, start_positions, Start};
use super::topic_ids::{self, topic_identity, Identity, RecreatedPolicy, TopicId};
use super::upstream::{self, Marks};
use super::{Tp, KIND};
use crate::clients::kafka::ClientRole;
use crate::connector::{Source, SourcePoll, SubtaskInfo};
use crate::dead_letter::{DeadLetter, DeadLetterWriter, OnError, Reason};
use crate::error::{JobError, Result};
use crate::formats::{self, Decoded, Failure, Reader};
use crate::kits::fetcher::{Fetcher, Handover};
use crate::record::{Batch, Origin, Record};
use crate::telemetry::{PartitionGauges, Telemetry};

/// librdkafka `queued.max.messages.kbytes` unless `[source.kafka.properties]` sets it:
/// 16 MiB of prefetched records per consumer (librdkafka's default is 64 MiB).
pub const QUEUED_MAX_KBYTES: &str = "16384";

/// librdkafka `queued.min.messages` unless set: the prefetch per partition, in records
/// (librdkafka's default is 100,000). librdkafka keeps about 250 bytes of bookkeeping per
/// queued record besides its payload, so with its default a consumer of small records
/// prefetches whole partitions: 200,000 records of 50 bytes cost 48 MiB, not the 10 MiB
/// of their payloads. 2,000 records per partition keep a fetch response or two queued,
/// which is enough to never wait on the broker.
pub const QUEUED_MIN_MESSAGES: &str = "2000";

/// librdkafka `fetch.max.bytes` unless set: 4 MiB per fetch response (librdkafka's
/// default is 50 MiB). The queue limit above is checked before each fetch, so the
/// prefetch may pass it by one response per broker; a record larger than this is
/// still fetched, alone.
pub const FETCH_MAX_BYTES: &str = "4194304";

/// librdkafka `statistics.interval.ms` unless set: how often the consumer reports
/// partition end offsets, from which the lag gauges are derived. `0` turns the
/// statistics off (the end and lag of unbounded partitions are then unknown).
pub const STATISTICS_INTERVAL_MS: &str = "1000";

/// The `operator` label of the source's metrics.
const OPERATOR: &str = "source";

/// The reasons of the source's dead letters (records it cannot decode).
pub(crate) const LETTERS: &[Reason] = &[Reason::Decode];
use async_trait::async_trait;
use bytes::Bytes;
use lockgate_state::{CheckpointId, NextOffset, SourcePosition};
use prometheus::{IntCounter, IntGauge};
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{info, warn};

/// Timeout of metadata and offset requests after the first contact.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A Kafka source subtask. Create one per subtask with [`KafkaSource::new`].
pub struct KafkaSource {
    cfg: Arc<KafkaSourceConfig>,
    name: String,
    /// The subtask, as opened: [`SubtaskInfo::reads`] says which partitions are its own.
    info: Option<SubtaskInfo>,
    consumer: Option<Arc<KafkaConsumer>>,
    fetcher: Option<Fetcher<FetchedBatch>>,
    /// Next offset to read of every owned partition.
    positions: BTreeMap<Tp, NextOffset>,
    /// Bounded mode: where each owned partition ends.
    ends: BTreeMap<Tp, NextOffset>,
    pending_commits: BTreeMap<CheckpointId, Vec<(Tp, NextOffset)>>,
    discovered: Option<mpsc::Receiver<Listing>>,
    dead_letter: Option<DeadLetterWriter>,
    skipped: u64,
    last_committed: Option<TopicPartitionList>,
    /// The restored positions (all partitions of the checkpoint), kept so that a
    /// partition found only after the start still resumes where it was.
    restored: Option<BTreeMap<Tp, NextOffset>>,
    /// Consecutive listings without a known partition.
    missing: BTreeMap<Tp, u32>,
    /// Owned partitions that no longer exist (dropped while running, or in the restored
    /// checkpoint but not listed at the start), with where their records stop and their
    /// upstream marks. Kept in every checkpoint, so that a partition that comes back
    /// resumes there ([`rediscovered_starts`]) instead of reading again what was read.
    parked: BTreeMap<Tp, (NextOffset, Vec<lockgate_state::UpstreamMark>)>,
    /// With `origin_headers`: the upstream marks of every owned partition.
    marks: BTreeMap<Tp, Marks>,
    /// With `origin_headers`: the marks of every partition of the restored checkpoint.
    restored_marks: BTreeMap<Tp, Vec<lockgate_state::UpstreamMark>>,
    /// Records dropped as already applied (replays of the upstream stage).
    replayed: u64,
    /// The topic id of every topic whose positions this subtask holds (read, parked,
    /// or restored and not found yet), when known: recorded with those positions in
    /// every checkpoint, and compared with the cluster's at each discovery.
    ids: BTreeMap<String, TopicId>,
    metrics: Option<SourceMetrics>,
    /// Decodes record values (`format`).
    values: Reader,
    /// Decodes record keys (`key_format`), if they are decoded.
    keys: Option<Reader>,
    /// `key_format` gives JSON as it is (`json`).
    key_is_json: bool,
    /// `[source.kafka.watermark]`: each record's event time and the watermarks.
    clock: Option<super::event_clock::EventClock>,
}

/// The source subtask's metric handles, taken at open.
struct SourceMetrics {
    telemetry: Telemetry,
    subtask: u16,
    bytes_read: IntCounter,
    assigned: IntGauge,
    discovered: IntCounter,
    restored: IntGauge,
    /// Gauges of every owned partition: the position is set on the record path.
    partitions: BTreeMap<Tp, PartitionGauges>,
    /// Owned partitions whose start came from the restored checkpoint.
    from_checkpoint: BTreeSet<Tp>,
    /// Shared with the consumer's context, which sets the ends of unbounded partitions.
    live_ends: Arc<LiveEnds>,
}

impl SourceMetrics {
    /// Partition `tp` is read from `next` on; its end is `end` when bounded, else it
    /// comes from the statistics.
    fn assigned(&mut self, tp: &Tp, next: NextOffset, end: Option<NextOffset>, restored: bool) {
        let g = self.telemetry.partition(
            &super::metrics::PARTITION_PROGRESS,
            OPERATOR,
            self.subtask,
            &tp.0,
            tp.1,
        );
        g.set_position(next.0);
        match end {
            Some(end) => g.set_end(end.0),
            None => self.live_ends.insert(tp.clone(), g.clone()),
        }
        self.partitions.insert(tp.clone(), g);
        if restored {
            self.from_checkpoint.insert(tp.clone());
        }
        self.counts();
    }

    /// Partition `tp` no longer exists: its series go.
    fn dropped(&mut self, tp: &Tp) {
        self.live_ends.remove(tp);
        self.partitions.remove(tp);
        self.from_checkpoint.remove(tp);
        self.telemetry.remove_partition(&tp.0, tp.1);
        self.counts();
    }

    fn counts(&self) {
        self.assigned.set(self.partitions.len() as i64);
        self.restored.set(self.from_checkpoint.len() as i64);
    }
}

impl KafkaSource {
    /// The source as the runtime takes it: partitions assigned by Flink's rule
    /// ([`crate::connector::StreamHashAssigner`]), discovered while running, bounded
    /// with `bounded = "latest"`.
    pub fn spec(cfg: Arc<KafkaSourceConfig>) -> crate::connector::SourceSpec {
        let caps = crate::connector::SourceCaps {
            bounded: cfg.bounded,
            discovers_splits: true,
        };
        crate::connector::SourceSpec::new(KIND, move |_| Box::new(KafkaSource::new(cfg.clone())))
            .assigned_by(crate::connector::StreamHashAssigner)
            .with_caps(caps)
    }

    /// A source subtask reading what `cfg` selects.
    pub fn new(cfg: Arc<KafkaSourceConfig>) -> KafkaSource {
        KafkaSource {
            clock: cfg
                .event_time
                .clone()
                .map(super::event_clock::EventClock::new),
            values: Reader::new(cfg.format.clone()),
            keys: cfg.key_format.clone().map(Reader::new),
            key_is_json: cfg
                .key_format
                .as_ref()
                .is_some_and(|f| f.output() == formats::Output::Json),
            cfg,
            name: String::new(),
            info: None,
            consumer: None,
            fetcher: None,
            positions: BTreeMap::new(),
            ends: BTreeMap::new(),
            pending_commits: BTreeMap::new(),
            discovered: None,
            dead_letter: None,
            skipped: 0,
            last_committed: None,
            restored: None,
            missing: BTreeMap::new(),
            parked: BTreeMap::new(),
            marks: BTreeMap::new(),
            restored_marks: BTreeMap::new(),
            replayed: 0,
            ids: BTreeMap::new(),
            metrics: None,
        }
    }

    /// The librdkafka settings of this source's consumer: lockgate's defaults, then the
    /// job's `[source.kafka.properties]`. Benchmarks give a plain consumer the same.
    pub fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.cfg.bootstrap_servers)
            .set("group.id", &self.cfg.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "error")
            .set("enable.partition.eof", "false")
            // librdkafka's default (1000 ms) stalls the consumer whenever its queue fills.
            .set("fetch.queue.backoff.ms", "10")
            // librdkafka's prefetch queue, bounded in bytes (its defaults: 64 MiB queued,
            // 50 MiB per fetch response): memory stays near these however large the
            // records are.
            .set("queued.max.messages.kbytes", QUEUED_MAX_KBYTES)
            .set("queued.min.messages", QUEUED_MIN_MESSAGES)
            .set("fetch.max.bytes", FETCH_MAX_BYTES)
            .set("statistics.interval.ms", STATISTICS_INTERVAL_MS)
            .set("client.id", format!("lockgate-{}", self.name));
        crate::clients::kafka::apply(&mut c, &self.cfg.properties, ClientRole::Consumer);
        c
    }

    fn consumer(&self) -> Arc<KafkaConsumer> {
        self.consumer.clone().expect("opened")
    }

    fn owns(&self, tp: &Tp) -> bool {
        self.info.as_ref().expect("opened").reads(&tp.0, tp.1)
    }

    /// Resolves starts to concrete next offsets (blocking requests to the cluster).
    fn resolve(&self, starts: &BTreeMap<Tp, Start>) -> Result<BTreeMap<Tp, NextOffset>> {
        let c = self.consumer();
        let mut out = BTreeMap::new();
        for (tp, start) in starts {
            let (low, high) = c
                .fetch_watermarks(&tp.0, tp.1, REQUEST_TIMEOUT)
                .map_err(|e| self.err(format!("watermarks of {}/{}: {e}", tp.0, tp.1)))?;
            let next = match *start {
                Start::Offset(o) => {
                    check_in_range(tp, o, low, high).map_err(|e| self.err(e))?;
                    o
                }
                Start::Earliest => NextOffset(low),
                Start::Latest => NextOffset(high),
                Start::GroupOffset => {
                    let mut tpl = TopicPartitionList::new();
                    tpl.add_partition(&tp.0, tp.1);
                    let committed = c.committed_offsets(tpl, REQUEST_TIMEOUT).map_err(|e| {
                        self.err(format!("committed offsets of {}/{}: {e}", tp.0, tp.1))
                    })?;
                    match committed.find_partition(&tp.0, tp.1).map(|e| e.offset()) {
                        Some(Offset::Offset(o)) if o >= low && o <= high => NextOffset(o),
                        other => {
                            warn!(topic = %tp.0, partition = tp.1, committed = ?other, "no usable group offset; starting at earliest");
                            NextOffset(low)
                        }
                    }
                }
                Start::Timestamp(ms) => {
                    let mut tpl = TopicPartitionList::new();
                    tpl.add_partition_offset(&tp.0, tp.1, Offset::Offset(ms))
                        .map_err(|e| self.err(e.to_string()))?;
                    let answer = c.offsets_for_times(tpl, REQUEST_TIMEOUT).map_err(|e| {
                        self.err(format!("offsets for time {ms} of {}/{}: {e}", tp.0, tp.1))
                    })?;
                    let found = match answer.find_partition(&tp.0, tp.1).map(|e| e.offset()) {
                        Some(Offset::Offset(o)) => Some(o),
                        _ => None,
                    };
                    resolve_timestamp(found, high)
                }
            };
            out.insert(tp.clone(), next);
        }
        Ok(out)
    }

    fn err(&self, m: impl std::fmt::Display) -> JobError {
        JobError::task(
            &self.name,
            format!("Kafka ({}): {m}", self.cfg.bootstrap_servers),
        )
    }

    fn assign(&self, added: &BTreeMap<Tp, NextOffset>) -> Result<()> {
        let mut tpl = TopicPartitionList::new();
        for ((t, p), o) in added {
            tpl.add_partition_offset(t, *p, Offset::Offset(o.0))
                .map_err(|e| self.err(e.to_string()))?;
        }
        self.consumer()
            .incremental_assign(&tpl)
            .map_err(|e| self.err(format!("assign: {e}")))
    }

    /// Adds partitions discovered while running: they start at EARLIEST. A topic whose
    /// id changed since its positions were taken fails the attempt under either policy:
    /// records of the old topic may still be on their way, and the restart from the
    /// last completed checkpoint applies `on_topic_recreated` at open, where nothing of
    /// the old topic is in flight.
    async fn apply_discovery(&mut self, listing: Listing) -> Result<()> {
        for (topic, now) in &listing.ids {
            // Only a topic this subtask holds positions of can be read at wrong offsets;
            // the id of any other is just taken.
            let holds = self
                .positions
                .keys()
                .chain(self.parked.keys())
                .any(|tp| tp.0 == *topic);
            if !holds {
                self.ids.insert(topic.clone(), *now);
                continue;
            }
            match topic_identity(
                self.ids.get(topic).copied(),
                Some(*now),
                self.cfg.on_topic_recreated,
            ) {
                Identity::Same => {
                    self.ids.insert(topic.clone(), *now);
                }
                Identity::Recreated { was, now } => {
                    return Err(self.err(topic_ids::recreated_message(topic, was, now)));
                }
                Identity::StartOver { was, now } => {
                    return Err(self.err(format!(
                        "topic `{topic}` was recreated while the job ran (topic id {was}, now {now}): restarting from the last completed checkpoint, where on_topic_recreated = \"restart\" reads the new topic from EARLIEST"
                    )));
                }
            }
        }
        let listed: BTreeSet<Tp> = listing.partitions.iter().cloned().collect();
        // A partition is dropped only after three listings in a row without it and
        // without an error on its topic: a metadata hiccup during a broker bounce must
        // never reset a position (re-adding it would start it over at EARLIEST).
        let known: Vec<Tp> = self.positions.keys().cloned().collect();
        for tp in known {
            if listed.contains(&tp) {
                self.missing.remove(&tp);
                continue;
            }
            if listing.errored.contains(&tp.0) {
                continue;
            }
            let streak = self.missing.entry(tp.clone()).or_insert(0);
            *streak += 1;
            if *streak < 3 {
                continue;
            }
            warn!(topic = %tp.0, partition = tp.1, "partition no longer exists; dropped (its position is kept: if it comes back, it resumes there)");
            self.missing.remove(&tp);
            if let Some(next) = self.positions.remove(&tp) {
                let applied = self.marks.get(&tp).map(Marks::applied).unwrap_or_default();
                self.parked.insert(tp.clone(), (next, applied));
            }
            self.marks.remove(&tp);
            if let Some(m) = self.metrics.as_mut() {
                m.dropped(&tp);
            }
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&tp.0, tp.1);
            let _ = self.consumer().incremental_unassign(&tpl);
        }
        let listing = listing.partitions;
        let found: Vec<Tp> = listing
            .into_iter()
            .filter(|tp| self.owns(tp) && !self.positions.contains_key(tp))
            .collect();
        let parked: BTreeMap<Tp, NextOffset> = self
            .parked
            .iter()
            .map(|(tp, (n, _))| (tp.clone(), *n))
            .collect();
        let new = rediscovered_starts(found, &parked, self.restored.as_ref());
        if new.is_empty() {
            return Ok(());
        }
        let resolved = self.blocking(|s| s.resolve_with_ends(&new)).await?;
        for (tp, next) in &resolved {
            info!(topic = %tp.0, partition = tp.1, start = next.0, back = parked.contains_key(tp), "partition discovered");
        }
        self.assign(&resolved)?;
        self.track(&resolved);
        self.mark(&resolved);
        for tp in resolved.keys() {
            if let Some((_, applied)) = self.parked.remove(tp) {
                if self.cfg.origin_headers {
                    self.marks.insert(tp.clone(), Marks::from_applied(&applied));
                }
            }
        }
        if let Some(m) = &self.metrics {
            m.discovered.inc_by(resolved.len() as u64);
        }
        self.positions.extend(resolved);
        Ok(())
    }

    /// With origin headers read: the marks of newly assigned partitions, from the
    /// restored checkpoint where it holds them.
    fn mark(&mut self, resolved: &BTreeMap<Tp, NextOffset>) {
        if !self.cfg.origin_headers {
            return;
        }
        for tp in resolved.keys() {
            let applied = self
                .restored_marks
                .get(tp)
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            self.marks.insert(tp.clone(), Marks::from_applied(applied));
        }
    }

    /// Creates the series of newly assigned partitions, starting at `resolved`.
    fn track(&mut self, resolved: &BTreeMap<Tp, NextOffset>) {
        let restored = self.restored.as_ref();
        let Some(m) = self.metrics.as_mut() else {
            return;
        };
        for tp in resolved.keys() {
            // With a checkpoint, a partition it holds starts at its offset there.
            let from_checkpoint = restored.is_some_and(|r| r.contains_key(tp));
            m.assigned(
                tp,
                resolved[tp],
                self.ends.get(tp).copied(),
                from_checkpoint,
            );
        }
    }

    /// Resolves starts and, in bounded mode, captures the end of partitions without one.
    fn resolve_with_ends(
        &mut self,
        starts: &BTreeMap<Tp, Start>,
    ) -> Result<BTreeMap<Tp, NextOffset>> {
        let resolved = self.resolve(starts)?;
        if self.cfg.bounded {
            let c = self.consumer();
            for tp in resolved.keys() {
                if !self.ends.contains_key(tp) {
                    let (_, high) = c
                        .fetch_watermarks(&tp.0, tp.1, REQUEST_TIMEOUT)
                        .map_err(|e| self.err(format!("end offset of {}/{}: {e}", tp.0, tp.1)))?;
                    self.ends.insert(tp.clone(), NextOffset(high));
                }
            }
        }
        Ok(resolved)
    }

    /// Runs blocking client calls off the runtime threads.
    async fn blocking<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        tokio::task::block_in_place(|| f(self))
    }

    fn finished(&self) -> bool {
        self.cfg.bounded
            && self
                .positions
                .iter()
                .all(|(tp, next)| self.ends.get(tp).is_some_and(|end| next >= end))
    }

    /// The key and value of record `f` as the job sees them: decoded by `key_format`
    /// and `format` (a decoded key that is a JSON string becomes its text), or the
    /// bytes as they are, without a copy, where the format only checks them.
    async fn decode(
        &mut self,
        f: &Fetched,
        bytes: &Bytes,
        tombstone: bool,
    ) -> std::result::Result<(Option<Bytes>, Bytes), Failure> {
        let value = match &f.payload {
            _ if tombstone => Bytes::new(),
            None if self.cfg.format.output() == formats::Output::Bytes => Bytes::new(),
            None => {
                return Err(Failure::Record {
                    why: "null payload (tombstone)".into(),
                    schema_id: None,
                })
            }
            Some(r) => match self.values.decode(&bytes[r.clone()]).await? {
                Decoded::Unchanged => bytes.slice(r.clone()),
                Decoded::Replaced(v) => Bytes::from(v),
            },
        };
        let key = match (&f.key, self.keys.as_mut()) {
            (None, _) => None,
            (Some(r), None) => Some(bytes.slice(r.clone())),
            (Some(r), Some(keys)) => Some(match keys.decode(&bytes[r.clone()]).await {
                // A JSON key that is a string stands for its text, as decoded ones do.
                Ok(Decoded::Unchanged)
                    if self.key_is_json && bytes[r.clone()].first() == Some(&b'"') =>
                {
                    Bytes::from(formats::key_text(bytes[r.clone()].to_vec()))
                }
                Ok(Decoded::Unchanged) => bytes.slice(r.clone()),
                Ok(Decoded::Replaced(v)) => Bytes::from(formats::key_text(v)),
                Err(Failure::Record { why, schema_id }) => {
                    return Err(Failure::Record {
                        why: format!("key: {why}"),
                        schema_id,
                    })
                }
                Err(e) => return Err(e),
            }),
        };
        Ok((key, value))
    }

    /// A record that cannot be decoded: fails the job, or is skipped or dead-lettered,
    /// as `on_decode_error` says. It is never passed on.
    async fn on_decode_error(
        &mut self,
        run: &Run,
        f: &Fetched,
        bytes: &[u8],
        why: &str,
        schema_id: Option<u32>,
    ) -> Result<()> {
        match &self.cfg.on_decode_error {
            OnError::Fail => Err(self.err(format!(
                "record {}/{}@{} cannot be decoded: {why}",
                run.topic, run.partition, f.offset
            ))),
            OnError::Skip => {
                self.skipped += 1;
                warn!(topic = %run.topic, partition = run.partition, offset = f.offset, error = %why, skipped = self.skipped, "skipping a record that cannot be decoded");
                Ok(())
            }
            OnError::DeadLetter(topic) => {
                let writer = self.dead_letter.as_ref().expect("created in open");
                let payload = f.payload.clone().map_or(&[][..], |r| &bytes[r]);
                let letter = DeadLetter::new(why, Reason::Decode, payload)
                    .with_origin(Some((&run.topic, run.partition, f.offset)))
                    .with_key(f.key.clone().map(|r| &bytes[r]))
                    .with_schema_id(schema_id);
                // The position only moves past the record once the broker acknowledged
                // it in the dead-letter topic.
                writer.send(topic, &letter).await.map_err(|e| {
                    self.err(format!(
                        "{e} (record {}/{}@{})",
                        run.topic, run.partition, f.offset
                    ))
                })
            }
        }
    }
}

/// Lists the partitions of the selected topics.
/// A successful metadata listing of the selected topics.
#[derive(Debug, Clone, Default)]
struct Listing {
    partitions: Vec<Tp>,
    /// Selected topics the broker reported with an error: their partitions are unknown
    /// in this listing, not gone.
    errored: BTreeSet<String>,
    /// The topic id of each listed topic whose id the cluster reports.
    ids: BTreeMap<String, TopicId>,
}

/// Selected topics whose partitions a listing does not know: reported with an error,
/// or named in `topics` and absent.
fn unknown_topics(listing: &Listing, selector: &TopicSelector) -> BTreeSet<String> {
    let mut unknown = listing.errored.clone();
    if let TopicSelector::List(names) = selector {
        for n in names {
            if !listing.partitions.iter().any(|(t, _)| t == n) {
                unknown.insert(n.clone());
            }
        }
    }
    unknown
}

/// The longest wait for the topics' ids in one listing.
const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Lists the partitions of the selected topics (and their topic ids, where the
/// cluster tells them).
fn discover(
    consumer: &KafkaConsumer,
    cfg: &KafkaSourceConfig,
    timeout: Duration,
) -> std::result::Result<Listing, String> {
    let md = consumer
        .fetch_metadata(None, timeout)
        .map_err(|e| e.to_string())?;
    let mut out = Listing::default();
    for t in md.topics() {
        if !cfg.topics.matches(t.name()) {
            continue;
        }
        if t.error().is_some() {
            out.errored.insert(t.name().to_string());
            continue;
        }
        for p in t.partitions() {
            out.partitions.push((t.name().to_string(), p.id()));
        }
    }
    out.partitions.sort();
    let listed: Vec<String> = md
        .topics()
        .iter()
        .filter(|t| cfg.topics.matches(t.name()) && t.error().is_none())
        .map(|t| t.name().to_string())
        .collect();
    // The broker that answered, which is up: any broker answers the ids' request too.
    let broker = Some(md.orig_broker_id())
        .filter(|id| *id >= 0)
        .or_else(|| md.brokers().first().map(|b| b.id()));
    // Topic ids guard against a recreated topic; a cluster that cannot tell them (an
    // older broker, a Kafka-compatible server without DescribeTopics) leaves them
    // unknown, and the source reads as it did before it knew ids.
    match topic_ids::describe(
        consumer.client(),
        &listed,
        broker,
        timeout.min(DESCRIBE_TIMEOUT),
    ) {
        Ok(ids) => {
            out.ids = ids
                .into_iter()
                .filter_map(|(t, id)| Some((t, id?)))
                .collect()
        }
        Err(e) => {
            warn!(error = %e, "cannot read the topics' ids (DescribeTopics): a recreated topic is not detected in this listing")
        }
    }
    Ok(out)
}

/// The restored positions of the selected topics that apply to the topics the cluster
/// has now (`ids`, from the listing at open). A topic whose id changed fails the open
/// (`Err((topic, recorded id, id now))`) or, under `on_topic_recreated = "restart"`,
/// loses its positions, ends and marks (with a warning): it is then absent from the
/// checkpoint, so it starts at EARLIEST.
#[allow(clippy::type_complexity)]
fn check_restored_ids(
    restored: Option<&[SourcePosition]>,
    ids: &BTreeMap<String, TopicId>,
    cfg: &KafkaSourceConfig,
) -> std::result::Result<Option<Vec<SourcePosition>>, (String, TopicId, TopicId)> {
    let Some(restored) = restored else {
        return Ok(None);
    };
    // Per position, not per topic: after a rescale the positions come from several old
    // members, and one that already started the new topic over carries its id.
    let mut over: BTreeSet<(String, i32)> = BTreeSet::new();
    let mut warned = BTreeSet::new();
    for p in restored.iter().filter(|p| cfg.topics.matches(&p.stream)) {
        let recorded = p.stream_id.and_then(TopicId::from_bytes);
        match topic_identity(
            recorded,
            ids.get(&p.stream).copied(),
            cfg.on_topic_recreated,
        ) {
            Identity::Same => {}
            Identity::Recreated { was, now } => return Err((p.stream.clone(), was, now)),
            Identity::StartOver { was, now } => {
                over.insert((p.stream.clone(), p.partition));
                if warned.insert(p.stream.clone()) {
                    warn!(topic = %p.stream, checkpoint_id = %was, cluster_id = %now, "topic was recreated (its topic id differs from the checkpoint's); on_topic_recreated = \"restart\": its checkpointed positions are dropped and it is read from EARLIEST");
                }
            }
        }
    }
    debug_assert!(over.is_empty() || cfg.on_topic_recreated == RecreatedPolicy::Restart);
    Ok(Some(
        restored
            .iter()
            .filter(|p| {
                cfg.topics.matches(&p.stream) && !over.contains(&(p.stream.clone(), p.partition))
            })
            .cloned()
            .collect(),
    ))
}

/// A fetched record with its origin headers and its headers, when they are read.
type FetchedRecord = (Fetched, Option<OriginHeaders>, Option<Vec<HeaderAt>>);

impl KafkaSource {
    /// Registers the subtask's metrics (and the event clock's).
    fn register_metrics(&mut self, info: &SubtaskInfo, live_ends: Arc<LiveEnds>) {
        let telemetry = info.telemetry.clone();
        let m = telemetry.metrics();
        let k = super::metrics::KafkaMetrics::of(m);
        self.metrics = Some(SourceMetrics {
            subtask: info.index,
            bytes_read: m.task_counter(&k.bytes_read, OPERATOR, info.index),
            assigned: m.task_gauge(&k.partitions_assigned, OPERATOR, info.index),
            discovered: m.task_counter(&k.partitions_discovered, OPERATOR, info.index),
            restored: m.task_gauge(&k.partitions_restored, OPERATOR, info.index),
            partitions: BTreeMap::new(),
            from_checkpoint: BTreeSet::new(),
            live_ends,
            telemetry: telemetry.clone(),
        });
        if let Some(c) = self.clock.as_mut() {
            c.report_to(&telemetry, info.index);
        }
    }

    /// The listing the source opens with. A bounded job captures the end of every
    /// partition at its first start, so it waits (up to the connect timeout) until
    /// every selected topic's partitions are known: one whose are not would be read as
    /// empty. (`&mut self`: the subtask is `Send` but not `Sync`, and the future holds it
    /// across its awaits.)
    async fn first_listing(
        &mut self,
        consumer: &Arc<KafkaConsumer>,
        cfg: &KafkaSourceConfig,
    ) -> Result<Listing> {
        let timeout = Duration::from_millis(cfg.connect_timeout_ms);
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let listing = tokio::task::spawn_blocking({
                let consumer = consumer.clone();
                let cfg = cfg.clone();
                move || discover(&consumer, &cfg, timeout)
            })
            .await
            .map_err(|e| self.err(e))?
            .map_err(|e| {
                self.err(format!(
                    "no broker reachable within {} ms: {e}",
                    cfg.connect_timeout_ms
                ))
            })?;
            let unknown = unknown_topics(&listing, &cfg.topics);
            if !cfg.bounded || unknown.is_empty() {
                return Ok(listing);
            }
            if std::time::Instant::now() >= deadline {
                return Err(self.err(format!(
                    "bounded: the partitions of {} are unknown after {} ms (the topic does not exist or its metadata reports an error); refusing to read it as empty",
                    unknown.iter().cloned().collect::<Vec<_>>().join(", "),
                    cfg.connect_timeout_ms
                )));
            }
            warn!(subtask = %self.name, topics = ?unknown, "bounded: waiting for the partitions of these topics");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Takes over the restored positions (already checked against the topics' ids)
    /// that apply to the listing: the topics' ids, the bounded ends, the positions of
    /// partitions gone from the cluster (parked), the origin marks. Returns where each
    /// owned partition starts.
    fn adopt_restored(
        &mut self,
        restored: Option<&[SourcePosition]>,
        listing: Listing,
        cfg: &KafkaSourceConfig,
    ) -> BTreeMap<Tp, Start> {
        // Each topic's id: the cluster's where it reports one (the same as the
        // checkpoint's, or adopted), else the checkpoint's.
        self.ids = restored
            .unwrap_or_default()
            .iter()
            .filter_map(|p| Some((p.stream.clone(), TopicId::from_bytes(p.stream_id?)?)))
            .collect();
        self.ids.extend(listing.ids.clone());
        let listing = listing.partitions;
        if listing.is_empty() {
            warn!(subtask = %self.name, "no partition matches the configured topics (yet)");
        }

        let restored_map: Option<BTreeMap<Tp, NextOffset>> = restored.map(|ps| {
            ps.iter()
                .filter(|p| cfg.topics.matches(&p.stream))
                .map(|p| ((p.stream.clone(), p.partition), p.next))
                .collect()
        });
        if let Some(ps) = restored {
            for p in ps.iter().filter(|p| cfg.topics.matches(&p.stream)) {
                let tp = (p.stream.clone(), p.partition);
                if !self.owns(&tp) {
                    continue;
                }
                if let Some(end) = p.end {
                    self.ends.insert(tp.clone(), end);
                }
                if !listing.contains(&tp) {
                    warn!(topic = %tp.0, partition = tp.1, "partition in the checkpoint no longer exists; dropped (its position is kept: if it comes back, it resumes there)");
                    self.parked.insert(tp, (p.next, p.applied.clone()));
                }
            }
        }
        let owned: Vec<Tp> = listing.iter().filter(|tp| self.owns(tp)).cloned().collect();
        let starts = start_positions(restored_map.as_ref(), &owned, &cfg.startup);
        self.restored = restored_map;
        if cfg.origin_headers {
            self.restored_marks = restored
                .unwrap_or_default()
                .iter()
                .filter(|p| cfg.topics.matches(&p.stream) && !p.applied.is_empty())
                .map(|p| ((p.stream.clone(), p.partition), p.applied.clone()))
                .collect();
        }
        starts
    }

    /// Lists the partitions every `partition_discovery_ms`, in a task of its own, and
    /// hands each listing to `poll`.
    fn discover_periodically(&mut self, consumer: Arc<KafkaConsumer>, cfg: Arc<KafkaSourceConfig>) {
        let (tx, rx) = mpsc::channel(1);
        self.discovered = Some(rx);
        let every = Duration::from_millis(cfg.partition_discovery_ms);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let (c, cf) = (consumer.clone(), cfg.clone());
                let found =
                    tokio::task::spawn_blocking(move || discover(&c, &cf, REQUEST_TIMEOUT)).await;
                match found {
                    Ok(Ok(listing)) => {
                        if tx.send(listing).await.is_err() {
                            return; // the source is gone
                        }
                    }
                    Ok(Err(e)) => warn!(error = %e, "partition discovery failed; retrying"),
                    Err(_) => return,
                }
            }
        });
    }

    /// Turns a fetched batch into records, run by run, and counts what it read.
    async fn read_batch(&mut self, batch: FetchedBatch, out: &mut Batch) -> Result<()> {
        let FetchedBatch {
            bytes,
            records,
            runs,
            headers,
            all_headers,
        } = batch;
        // Records hold slices of the batch's buffer: it is shared from here on.
        let bytes = Bytes::from(bytes);
        out.reserve(records.len());
        let mut headers = headers.into_iter();
        let mut all_headers = all_headers.into_iter();
        let mut records = records.into_iter().map(|f| {
            let h = headers.next();
            let all = all_headers.next();
            (f, h, all)
        });
        let mut read_bytes = 0usize;
        let replayed_before = self.replayed;
        for run in runs {
            let run_records = records.by_ref().take(run.len);
            self.read_run(&run, run_records, &bytes, out, &mut read_bytes)
                .await?;
        }
        if let Some(m) = &self.metrics {
            m.bytes_read.inc_by(read_bytes as u64);
        }
        if self.replayed > replayed_before {
            info!(subtask = %self.name, dropped = self.replayed - replayed_before, total = self.replayed, "dropped records this job already applied (a replay of the upstream stage)");
        }
        Ok(())
    }

    /// Reads one run (records of one partition) from the partition's position: records
    /// before it were emitted already, records at or past a bounded end are not read.
    /// The position moves past every record read or passed over.
    async fn read_run(
        &mut self,
        run: &Run,
        records: impl Iterator<Item = FetchedRecord> + Send,
        bytes: &Bytes,
        out: &mut Batch,
        read_bytes: &mut usize,
    ) -> Result<()> {
        // A partition's position is looked up once per run, not once per record.
        let tp = (run.topic.to_string(), run.partition);
        let Some(mut next) = self.positions.get(&tp).copied() else {
            records.for_each(drop); // unassigned meanwhile
            return Ok(());
        };
        let end = self.ends.get(&tp).copied();
        // Every owned partition has marks when origin headers are read (empty for
        // one that starts fresh).
        let mut marks = self
            .cfg
            .origin_headers
            .then(|| self.marks.remove(&tp).unwrap_or_default());
        for (f, h, all) in records {
            if f.offset < next.0 {
                continue; // already emitted (a re-fetch)
            }
            if end.is_some_and(|end| f.offset >= end.0) {
                continue; // beyond a bounded end
            }
            match self
                .read_record(run, &tp, &f, h, all, bytes, marks.as_mut())
                .await
            {
                Ok(Some(record)) => {
                    *read_bytes += f.key.as_ref().map_or(0, |r| r.len())
                        + f.payload.as_ref().map_or(0, |r| r.len());
                    out.push(record);
                }
                Ok(None) => {}
                Err(e) => {
                    if let Some(m) = marks.take() {
                        self.marks.insert(tp, m);
                    }
                    return Err(e);
                }
            }
            next = NextOffset::after(f.offset);
        }
        if let Some(g) = self.metrics.as_ref().and_then(|m| m.partitions.get(&tp)) {
            g.set_position(next.0);
        }
        if let Some(m) = marks {
            self.marks.insert(tp.clone(), m);
        }
        self.positions.insert(tp, next);
        Ok(())
    }

    /// One fetched record as a record; none for one passed over: a duplicate of a
    /// record this job already applied (`marks`, with origin headers read), or one the
    /// decode-error policy skipped.
    #[allow(clippy::too_many_arguments)]
    async fn read_record(
        &mut self,
        run: &Run,
        tp: &Tp,
        f: &Fetched,
        h: Option<OriginHeaders>,
        all: Option<Vec<HeaderAt>>,
        bytes: &Bytes,
        marks: Option<&mut Marks>,
    ) -> Result<Option<Record>> {
        if let Some(marks) = marks {
            let h = h.unwrap_or_default();
            let at = |i: usize| h[i].clone().map(|r| &bytes[r]);
            match upstream::parse(at(0), at(1), at(2)) {
                // A duplicate is dropped before its payload is looked at: the first
                // copy already went through the decode policy.
                Ok(c) if !marks.admit(c) => {
                    self.replayed += 1;
                    return Ok(None);
                }
                Ok(_) => {}
                Err(why) => {
                    self.on_decode_error(run, f, bytes, &why, None).await?;
                    return Ok(None);
                }
            }
        }
        let tombstone = f.payload.is_none() && self.cfg.tombstones;
        let (key, value) = match self.decode(f, bytes, tombstone).await {
            Ok(kv) => kv,
            Err(Failure::Record { why, schema_id }) => {
                self.on_decode_error(run, f, bytes, &why, schema_id).await?;
                return Ok(None);
            }
            // Waited for with retries already: the job fails, and the record is read
            // again after the restart.
            Err(Failure::Registry(why)) => {
                return Err(self.err(format!(
                    "record {}/{}@{} needs its writer schema: {why}",
                    run.topic, run.partition, f.offset
                )))
            }
        };
        // The time read as configured, which moves the watermark.
        let mut observed = None;
        let timestamp = match self.clock.as_ref() {
            None => f.timestamp,
            Some(c) => match c
                .settings
                .read(f.timestamp, if tombstone { b"" } else { &value })
            {
                Ok(t) => {
                    observed = Some(t);
                    Some(t)
                }
                // A tombstone has no value to read a time from: it carries its Kafka
                // one, which says nothing about the field's times.
                Err(_) if tombstone && f.timestamp.is_some() => f.timestamp,
                Err(why) => {
                    self.on_decode_error(run, f, bytes, &why, None).await?;
                    return Ok(None);
                }
            },
        };
        if let (Some(c), Some(t)) = (self.clock.as_mut(), observed) {
            c.observe(tp, t);
        }
        Ok(Some(Record {
            key,
            route_key: None,
            value,
            origin: Some(Origin {
                stream: run.topic.clone(),
                partition: run.partition,
                offset: f.offset,
            }),
            timestamp,
            tombstone,
            op: crate::record::Op::Upsert,
            output: 0,
            headers: all.map(|all| {
                std::sync::Arc::new(
                    all.into_iter()
                        .map(|(name, value)| {
                            (
                                String::from_utf8_lossy(&bytes[name]).into_owned(),
                                value.map(|v| bytes.slice(v)),
                            )
                        })
                        .collect(),
                )
            }),
        }))
    }
}

#[async_trait]
impl Source for KafkaSource {
    async fn open(
        &mut self,
        info: &SubtaskInfo,
        restored: Option<&[SourcePosition]>,
    ) -> Result<()> {
        self.name = info.name.clone();
        self.info = Some(info.clone());
        let config = self.client_config();
        let live_ends = Arc::new(LiveEnds::new(read_committed(&config)));
        self.register_metrics(info, live_ends.clone());
        let consumer = KafkaConsumer::new(
            config
                .create_with_context(LogContext::new(live_ends))
                .map_err(|e| self.err(format!("cannot create consumer: {e}")))?,
        );
        let consumer = Arc::new(consumer);
        self.consumer = Some(consumer.clone());
        let cfg = self.cfg.clone();
        let listing = self.first_listing(&consumer, &cfg).await?;
        let restored =
            check_restored_ids(restored, &listing.ids, &cfg).map_err(|(topic, was, now)| {
                self.err(topic_ids::recreated_message(&topic, was, now))
            })?;
        let starts = self.adopt_restored(restored.as_deref(), listing, &cfg);
        let resolved = self.blocking(|s| s.resolve_with_ends(&starts)).await?;
        for (tp, next) in &resolved {
            info!(subtask = %self.name, topic = %tp.0, partition = tp.1, start = next.0, how = ?starts[tp], end = ?self.ends.get(tp).map(|e| e.0), "partition assigned");
        }
        self.assign(&resolved)?;
        self.track(&resolved);
        self.mark(&resolved);
        self.positions = resolved;
        if let OnError::DeadLetter(_) = cfg.on_decode_error {
            self.dead_letter = Some(
                DeadLetterWriter::new(&cfg.bootstrap_servers, &cfg.properties)
                    .map_err(|e| self.err(e))?
                    .counted(info.telemetry.metrics(), OPERATOR, info.index, LETTERS),
            );
        }
        let fetcher = fetcher::start(
            consumer.clone(),
            &self.name,
            HeaderCopy {
                origin: cfg.origin_headers,
                all: cfg.headers,
            },
        )
        .map_err(|e| self.err(format!("cannot start the poll thread: {e}")))?;
        fetcher.report_to(info);
        self.fetcher = Some(fetcher);
        if cfg.partition_discovery_ms > 0 {
            self.discover_periodically(consumer, cfg);
        }
        Ok(())
    }

    async fn poll(&mut self, out: &mut Batch) -> Result<SourcePoll> {
        if let Some(listing) = self.discovered.as_mut().and_then(|rx| rx.try_recv().ok()) {
            self.apply_discovery(listing).await?;
        }
        if self.finished() {
            return Ok(SourcePoll::Finished);
        }
        let Some(item) = self
            .fetcher
            .as_mut()
            .expect("opened")
            .next(Duration::from_millis(50))
            .await
        else {
            return Ok(SourcePoll::Idle);
        };
        let batch = match item {
            Handover::Batch(b) => b,
            Handover::Fatal(e) => return Err(self.err(e)),
            // The poll thread reads until the source goes away: it never finishes.
            Handover::Finished => return Err(self.err("the Kafka poll thread stopped")),
        };
        self.read_batch(batch, out).await?;
        Ok(if self.finished() {
            SourcePoll::Finished
        } else {
            SourcePoll::Ready
        })
    }

    fn watermark(&mut self) -> Option<crate::event_time::Watermark> {
        self.clock.as_ref()?;
        let finished = self.finished();
        // A partition with records left to read is being read, not idle, however long
        // the source spends elsewhere (backpressure, other partitions' batches).
        let metrics = self.metrics.as_ref();
        let backlog = |tp: &Tp| {
            metrics
                .and_then(|m| m.partitions.get(tp))
                .and_then(|g| g.lag())
                .is_some_and(|lag| lag > 0)
        };
        let clock = self.clock.as_mut()?;
        Some(clock.watermark(self.positions.keys(), finished, backlog))
    }

    fn snapshot(&mut self, id: CheckpointId) -> Result<Vec<SourcePosition>> {
        self.pending_commits.insert(
            id,
            self.positions
                .iter()
                .map(|(tp, o)| (tp.clone(), *o))
                .collect(),
        );
        let read = self.positions.iter().map(|(tp, next)| SourcePosition {
            stream: tp.0.clone(),
            partition: tp.1,
            next: *next,
            end: self.ends.get(tp).copied(),
            applied: self.marks.get(tp).map(Marks::applied).unwrap_or_default(),
            stream_id: self.ids.get(&tp.0).map(TopicId::bytes),
            opaque: None,
        });
        let parked = self
            .parked
            .iter()
            .map(|(tp, (next, applied))| SourcePosition {
                stream: tp.0.clone(),
                partition: tp.1,
                next: *next,
                end: self.ends.get(tp).copied(),
                applied: applied.clone(),
                stream_id: self.ids.get(&tp.0).map(TopicId::bytes),
                opaque: None,
            });
        Ok(read.chain(parked).collect())
    }

    async fn notify_checkpoint_complete(&mut self, id: CheckpointId) -> Result<()> {
        let Some(offsets) = self.pending_commits.remove(&id) else {
            return Ok(());
        };
        self.pending_commits.retain(|k, _| *k > id);
        if offsets.is_empty() {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        for ((t, p), o) in &offsets {
            tpl.add_partition_offset(t, *p, Offset::Offset(o.0))
                .map_err(|e| self.err(e.to_string()))?;
        }
        // For monitoring only: never read back on restore, so a failure is a warning.
        if let Err(e) = self.consumer().commit(&tpl, CommitMode::Async) {
            warn!(checkpoint = %id, error = %e, "committing offsets to the group failed");
        }
        self.last_committed = Some(tpl);
        Ok(())
    }

    async fn close(&mut self) -> Result<()> {
        self.fetcher = None;
        self.discovered = None;
        // The last completed checkpoint's offsets, synchronously: an asynchronous
        // commit could still be in flight when the process exits.
        if let (Some(tpl), Some(c)) = (self.last_committed.take(), self.consumer.clone()) {
            let r = tokio::task::spawn_blocking(move || c.commit(&tpl, CommitMode::Sync)).await;
            if let Ok(Err(e)) = r {
                warn!(error = %e, "final offset commit to the group failed");
            }
        }
        Ok(())
    }
}

/// Whether a consumer with these settings reads committed records only (librdkafka's
/// default), which decides which end offset its lag is measured against.
fn read_committed(config: &ClientConfig) -> bool {
    config.get("isolation.level") != Some("read_uncommitted")
}

/// Where partitions found while running start: one that this attempt dropped (or that
/// the restored checkpoint held but the start did not list) resumes where its records
/// stop, since everything before was read and passed on; any other follows
/// [`PipeStarts::pipe_starts`]. Starting a returning partition over at the restored
/// checkpoint's offset, or at EARLIEST, would read again what the sink already holds.
pub(crate) fn rediscovered_starts(
    found: Vec<Tp>,
    parked: &BTreeMap<Tp, NextOffset>,
    restored: Option<&BTreeMap<Tp, NextOffset>>,
) -> BTreeMap<Tp, Start> {
    let (back, new): (Vec<Tp>, Vec<Tp>) = found.into_iter().partition(|tp| parked.contains_key(tp));
    let mut starts = new.pipe_starts(restored);
    starts.extend(back.into_iter().map(|tp| {
        let next = parked[&tp];
        (tp, Start::Offset(next))
    }));
    starts
}

trait PipeStarts {
    fn pipe_starts(self, restored: Option<&BTreeMap<Tp, NextOffset>>) -> BTreeMap<Tp, Start>;
}

impl PipeStarts for Vec<Tp> {
    /// A partition found while running starts at EARLIEST (it is new since the start or
    /// since the checkpoint), unless the restored checkpoint holds it (its topic was
    /// unavailable at the start): then it resumes at its checkpointed offset.
    fn pipe_starts(self, restored: Option<&BTreeMap<Tp, NextOffset>>) -> BTreeMap<Tp, Start> {
        let empty = BTreeMap::new();
        start_positions(
            Some(restored.unwrap_or(&empty)),
            &self,
            &super::Startup::Earliest,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_that_comes_back_resumes_where_its_records_stop() {
        let tp = |p: i32| ("orders".to_string(), p);
        // Partition 0 was dropped at offset 900 of a run that restored 100 for it;
        // partition 1 is new since the checkpoint; partition 2 is in the checkpoint only.
        let parked: BTreeMap<Tp, NextOffset> = [(tp(0), NextOffset(900))].into();
        let restored: BTreeMap<Tp, NextOffset> =
            [(tp(0), NextOffset(100)), (tp(2), NextOffset(50))].into();
        let starts = rediscovered_starts(vec![tp(0), tp(1), tp(2)], &parked, Some(&restored));
        assert_eq!(starts[&tp(0)], Start::Offset(NextOffset(900)));
        assert_eq!(starts[&tp(1)], Start::Earliest);
        assert_eq!(starts[&tp(2)], Start::Offset(NextOffset(50)));
        // Without a restored checkpoint, a returning partition still resumes.
        let starts = rediscovered_starts(vec![tp(0), tp(1)], &parked, None);
        assert_eq!(starts[&tp(0)], Start::Offset(NextOffset(900)));
        assert_eq!(starts[&tp(1)], Start::Earliest);
    }

    #[test]
    fn restored_positions_of_a_recreated_topic_fail_or_are_dropped_as_the_policy_says() {
        let id = |n: i64| TopicId::from_bits(n, n).unwrap();
        let pos = |t: &str, p: i32, stream_id: Option<TopicId>| SourcePosition {
            stream: t.into(),
            partition: p,
            next: NextOffset(10),
            end: Some(NextOffset(20)),
            applied: Vec::new(),
            stream_id: stream_id.map(|i| i.bytes()),
            opaque: None,
        };
        // a: the same topic; b: recreated; c: an older checkpoint without ids;
        // d: not reported now (deleted, or a broker without ids); x: not selected.
        let restored = vec![
            pos("a", 0, Some(id(1))),
            pos("b", 0, Some(id(2))),
            pos("b", 1, Some(id(2))),
            pos("c", 0, None),
            pos("d", 0, Some(id(4))),
            pos("x", 0, Some(id(5))),
        ];
        let now: BTreeMap<String, TopicId> = [
            ("a".to_string(), id(1)),
            ("b".to_string(), id(3)),
            ("c".to_string(), id(6)),
            ("x".to_string(), id(7)),
        ]
        .into();
        let topics = TopicSelector::List(["a", "b", "c", "d"].map(String::from).to_vec());
        let mut cfg = KafkaSourceConfig::new("k:9092", topics, "g");
        assert_eq!(
            check_restored_ids(Some(&restored), &now, &cfg),
            Err(("b".to_string(), id(2), id(3)))
        );
        assert_eq!(check_restored_ids(None, &now, &cfg), Ok(None));
        cfg.on_topic_recreated = RecreatedPolicy::Restart;
        let kept: Vec<(String, i32)> = check_restored_ids(Some(&restored), &now, &cfg)
            .unwrap()
            .unwrap()
            .into_iter()
            .map(|p| (p.stream, p.partition))
            .collect();
        let want: Vec<(String, i32)> = [("a", 0), ("c", 0), ("d", 0)]
            .map(|(t, p)| (t.to_string(), p))
            .to_vec();
        assert_eq!(kept, want);
        // Without a recreated topic, every selected position is kept.
        let same: BTreeMap<String, TopicId> = [("b".to_string(), id(2))].into();
        cfg.on_topic_recreated = RecreatedPolicy::Fail;
        assert_eq!(
            check_restored_ids(Some(&restored), &same, &cfg)
                .unwrap()
                .unwrap()
                .len(),
            5
        );
    }

    #[test]
    fn topics_with_unknown_partitions() {
        let listing = Listing {
            partitions: vec![("a".into(), 0), ("a".into(), 1)],
            errored: ["b".to_string()].into_iter().collect(),
            ids: BTreeMap::new(),
        };
        let list = TopicSelector::List(vec!["a".into(), "b".into(), "c".into()]);
        let unknown: Vec<String> = unknown_topics(&listing, &list).into_iter().collect();
        assert_eq!(unknown, vec!["b".to_string(), "c".to_string()]);
        // A pattern names no topic that must exist: only errors are unknown.
        let pattern =
            TopicSelector::Pattern(crate::connectors::kafka::TopicPattern::new("a|b|c").unwrap());
        let unknown: Vec<String> = unknown_topics(&listing, &pattern).into_iter().collect();
        assert_eq!(unknown, vec!["b".to_string()]);
        let clean = Listing {
            partitions: vec![("a".into(), 0)],
            errored: BTreeSet::new(),
            ids: BTreeMap::new(),
        };
        let only_a = TopicSelector::List(vec!["a".into()]);
        assert!(unknown_topics(&clean, &only_a).is_empty());
    }

    #[test]
    fn librdkafka_prefetch_and_statistics_defaults_apply_unless_the_job_file_says_otherwise() {
        let topics = TopicSelector::List(vec!["a".into()]);
        let cfg = KafkaSourceConfig::new("k:9092", topics.clone(), "g");
        let c = KafkaSource::new(Arc::new(cfg)).client_config();
        assert_eq!(c.get("queued.max.messages.kbytes"), Some(QUEUED_MAX_KBYTES));
        assert_eq!(c.get("fetch.max.bytes"), Some(FETCH_MAX_BYTES));
        assert_eq!(c.get("queued.min.messages"), Some(QUEUED_MIN_MESSAGES));
        assert_eq!(
            c.get("statistics.interval.ms"),
            Some(STATISTICS_INTERVAL_MS)
        );
        assert!(read_committed(&c), "librdkafka's default isolation level");
        let mut cfg = KafkaSourceConfig::new("k:9092", topics, "g");
        cfg.properties
            .insert("queued.max.messages.kbytes".into(), "1024".into());
        cfg.properties
            .insert("fetch.max.bytes".into(), "52428800".into());
        cfg.properties
            .insert("queued.min.messages".into(), "100000".into());
        cfg.properties
            .insert("statistics.interval.ms".into(), "5000".into());
        cfg.properties
            .insert("isolation.level".into(), "read_uncommitted".into());
        let c = KafkaSource::new(Arc::new(cfg)).client_config();
        assert_eq!(c.get("statistics.interval.ms"), Some("5000"));
        assert!(!read_committed(&c));
        assert_eq!(c.get("queued.max.messages.kbytes"), Some("1024"));
        assert_eq!(c.get("queued.min.messages"), Some("100000"));
        assert_eq!(c.get("fetch.max.bytes"), Some("52428800"));
    }
}
