//! The poll loop (Flink's KafkaConsumerThread + Handover): a dedicated thread polls the
//! consumer and hands batches to the source through the fetcher kit's bounded
//! hand-over ([`crate::kits::fetcher`]), so that backpressure stops fetching instead
//! of growing memory. A batch is cut at [`BATCH`]
//! records or [`BATCH_BYTES`], so the hand-over holds less than
//! ([`QUEUED`] + 1) × (1 MiB + the largest record) beyond what the source is processing.
//!
//! The thread takes messages from librdkafka in batch calls (see [`super::queues`]):
//! a call takes no more records than fit in what is left of [`BATCH_BYTES`] at the
//! largest record size seen so far ([`take_at_most`]), so the bound above holds
//! while records are no larger than one seen before; a record larger than all
//! before it can carry its call past the bound, once, by the call's other records.

use super::queues::{Polled, Queues};
use super::Tp;
use crate::kits::fetcher::{Feed, Fetcher, Held};
use crate::telemetry::PartitionGauges;
use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::statistics::Statistics;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientContext;
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{debug, warn};

/// The consumer's context: forwards librdkafka's logs and errors to `tracing`, and
/// takes the end offset of the partitions in [`LiveEnds`] from librdkafka's statistics
/// (emitted every `statistics.interval.ms`, on the poll thread).
#[derive(Clone, Default)]
pub struct LogContext {
    ends: Arc<LiveEnds>,
}

impl LogContext {
    /// A context that reports the ends of the partitions registered in `ends`.
    pub fn new(ends: Arc<LiveEnds>) -> LogContext {
        LogContext { ends }
    }
}

/// The partitions whose end offset is taken from librdkafka's statistics: the source's
/// unbounded partitions (a bounded partition's end is fixed when it is assigned). The
/// source registers a partition when it assigns it and removes it when it drops it, so
/// the statistics never bring back the series of a dropped partition.
#[derive(Default)]
pub struct LiveEnds {
    read_committed: bool,
    partitions: Mutex<BTreeMap<Tp, PartitionGauges>>,
}

impl LiveEnds {
    /// Ends as a consumer with `isolation.level = read_committed` (`true`, librdkafka's
    /// default) or `read_uncommitted` sees them.
    pub fn new(read_committed: bool) -> LiveEnds {
        LiveEnds {
            read_committed,
            partitions: Mutex::new(BTreeMap::new()),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, BTreeMap<Tp, PartitionGauges>> {
        self.partitions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reports the end of `tp` to `gauges` from now on.
    pub fn insert(&self, tp: Tp, gauges: PartitionGauges) {
        self.table().insert(tp, gauges);
    }

    /// Stops reporting the end of `tp`.
    pub fn remove(&self, tp: &Tp) {
        self.table().remove(tp);
    }

    fn update(&self, stats: &Statistics) {
        for ((topic, partition), gauges) in self.table().iter() {
            if let Some(end) = end_offset(stats, topic, *partition, self.read_committed) {
                gauges.set_end(end);
            }
        }
    }
}

/// The end of a partition in one set of librdkafka statistics, as librdkafka's own
/// `consumer_lag` takes it: the last stable offset for a `read_committed` consumer
/// (records past it are not delivered yet), else the high watermark. `None` while the
/// consumer has not fetched the partition (librdkafka reports `-1`) or the statistics
/// do not hold it.
pub fn end_offset(
    stats: &Statistics,
    topic: &str,
    partition: i32,
    read_committed: bool,
) -> Option<i64> {
    let p = stats.topics.get(topic)?.partitions.get(&partition)?;
    let end = if read_committed {
        p.ls_offset
    } else {
        p.hi_offset
    };
    (end >= 0).then_some(end)
}

impl ClientContext for LogContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error => {
                warn!(facility = fac, "librdkafka: {log_message}")
            }
            L::Warning | L::Notice => debug!(facility = fac, "librdkafka: {log_message}"),
            _ => {}
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        debug!(%error, "librdkafka: {reason}");
    }

    fn stats(&self, statistics: Statistics) {
        self.ends.update(&statistics);
    }
}

impl ConsumerContext for LogContext {}

pub use super::queues::KafkaConsumer;

/// One fetched record: where its key and payload are in its batch's buffer.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub offset: i64,
    pub key: Option<Range<usize>>,
    pub payload: Option<Range<usize>>,
    /// Milliseconds since the epoch, if the broker gave one.
    pub timestamp: Option<i64>,
}

/// The next `len` records of a batch, all of one partition (librdkafka delivers a
/// partition's records in runs): the source looks its position up once per run.
#[derive(Debug, Clone)]
pub struct Run {
    pub topic: Arc<str>,
    pub partition: i32,
    pub len: usize,
    /// librdkafka's handle of the topic: a message continues the run without its
    /// topic name being read.
    topic_id: usize,
}

/// Records in poll order, cut into runs of one partition, and one buffer holding all
/// their keys and payloads: a batch costs a few allocations, not two per record. The
/// poll thread only copies bytes; the source task turns the buffer into shared
/// [`bytes::Bytes`] and slices it, so the reference counts of a buffer are touched
/// by one thread only.
#[derive(Debug, Default)]
pub struct FetchedBatch {
    pub bytes: Vec<u8>,
    pub records: Vec<Fetched>,
    pub runs: Vec<Run>,
    /// With origin headers read: each record's [`ORIGIN_HEADERS`] values, in the
    /// buffer, one entry per record. Empty otherwise.
    pub headers: Vec<OriginHeaders>,
    /// With all headers read: each record's headers (name and value), in the buffer,
    /// one entry per record. Empty otherwise.
    pub all_headers: Vec<Vec<HeaderAt>>,
}

impl FetchedBatch {
    /// What the batch holds in memory: its buffer (as allocated: it is reserved at the
    /// previous batch's size) and its per-record entries.
    pub fn held_bytes(&self) -> usize {
        use std::mem::size_of;
        self.bytes.capacity()
            + self.records.len() * size_of::<Fetched>()
            + self.runs.len() * size_of::<Run>()
            + self.headers.len() * size_of::<OriginHeaders>()
            + self
                .all_headers
                .iter()
                .map(|h| size_of::<Vec<HeaderAt>>() + h.len() * size_of::<HeaderAt>())
                .sum::<usize>()
    }
}

/// Where one header's name and value (None: no value) are in its batch's buffer.
pub type HeaderAt = (Range<usize>, Option<Range<usize>>);

/// Which headers the poll thread copies with each record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeaderCopy {
    /// The repartition stage's [`ORIGIN_HEADERS`].
    pub origin: bool,
    /// Every header, for the steps of a job that read them.
    pub all: bool,
}

/// Where the values of a record's origin headers ([`ORIGIN_HEADERS`]) are in its
/// batch's buffer (None: the header is absent).
pub type OriginHeaders = [Option<Range<usize>>; 3];

/// The headers a repartition stage's records carry: topic, partition, offset
/// ([`super::upstream`]).
pub const ORIGIN_HEADERS: [&std::ffi::CStr; 3] =
    [c"lockgate.topic", c"lockgate.partition", c"lockgate.offset"];

impl Held for FetchedBatch {
    fn held_bytes(&self) -> usize {
        FetchedBatch::held_bytes(self)
    }
}

/// Records per handed-over batch.
pub const BATCH: usize = 1024;

/// Bytes (key and payload) at which a handed-over batch is cut: a batch holds less
/// than this plus one record.
pub const BATCH_BYTES: usize = 1 << 20;

/// Batches queued in the hand-over (the poll thread builds one more meanwhile).
pub const QUEUED: usize = 2;

/// Starts polling `consumer` on a thread of its own (`kafka-{name}`, through the
/// fetcher kit); each batch also carries the headers `copy` names.
pub fn start(
    consumer: Arc<KafkaConsumer>,
    name: &str,
    copy: HeaderCopy,
) -> std::io::Result<Fetcher<FetchedBatch>> {
    Fetcher::spawn(&format!("kafka-{name}"), QUEUED, move |feed| {
        poll_loop(&consumer, feed, copy)
    })
}

/// Builds one hand-over batch: records in runs of one partition, their keys and
/// payloads copied into one buffer.
struct BatchBuilder {
    batch: FetchedBatch,
    /// The largest record (key and payload) seen so far: before the first, a call
    /// takes one record.
    largest: Option<usize>,
    /// The bytes of the previous batch: the next buffer is reserved at that size, so
    /// that a batch fits in one allocation while record sizes stay alike.
    reserve: usize,
    /// The headers copied with each record.
    copied: HeaderCopy,
}

/// How many records the next batch call may take into a batch that holds `records`
/// records of `bytes` bytes, when no record seen so far was larger than `largest`
/// bytes: as many as fit under [`BATCH_BYTES`] at that size, and at least one (a batch
/// that is not full takes one more record, as a batch cut by bytes always did).
pub fn take_at_most(records: usize, bytes: usize, largest: usize) -> usize {
    let fit = BATCH_BYTES.saturating_sub(bytes) / largest.max(1);
    fit.min(BATCH.saturating_sub(records)).max(1)
}

/// The smallest buffer reserved for a batch.
const MIN_RESERVE: usize = 16 << 10;

impl BatchBuilder {
    fn new(copy: HeaderCopy) -> BatchBuilder {
        BatchBuilder {
            batch: FetchedBatch::default(),
            largest: None,
            reserve: MIN_RESERVE,
            copied: copy,
        }
    }

    fn is_empty(&self) -> bool {
        self.batch.records.is_empty()
    }

    /// How many records the next batch call may take.
    fn room(&self) -> usize {
        take_at_most(
            self.batch.records.len(),
            self.batch.bytes.len(),
            self.largest.unwrap_or(BATCH_BYTES),
        )
    }

    fn is_full(&self) -> bool {
        self.batch.records.len() >= BATCH || self.batch.bytes.len() >= BATCH_BYTES
    }

    fn copy(&mut self, bytes: Option<&[u8]>) -> Option<Range<usize>> {
        let b = bytes?;
        let start = self.batch.bytes.len();
        self.batch.bytes.extend_from_slice(b);
        Some(start..self.batch.bytes.len())
    }

    fn push(&mut self, m: &Polled<'_>) {
        if self.is_empty() {
            self.batch.bytes.reserve(self.reserve);
            self.batch.records.reserve(BATCH);
        }
        let (partition, topic_id) = (m.partition(), m.topic_id());
        match self.batch.runs.last_mut() {
            Some(r) if r.partition == partition && r.topic_id == topic_id => r.len += 1,
            _ => {
                let topic = match self.batch.runs.iter().find(|r| r.topic_id == topic_id) {
                    Some(r) => r.topic.clone(),
                    None => Arc::from(m.topic()),
                };
                self.batch.runs.push(Run {
                    topic,
                    partition,
                    len: 1,
                    topic_id,
                });
            }
        }
        let start = self.batch.bytes.len();
        let key = self.copy(m.key());
        let payload = self.copy(m.payload());
        if self.copied.origin {
            let h = ORIGIN_HEADERS.map(|name| self.copy(m.header(name)));
            self.batch.headers.push(h);
        }
        if self.copied.all {
            let mut all = Vec::new();
            m.each_header(|name, value| {
                let name = self.copy(Some(name)).expect("a name");
                all.push((name, self.copy(value)));
            });
            self.batch.all_headers.push(all);
        }
        let size = self.batch.bytes.len() - start;
        self.largest = Some(self.largest.map_or(size, |l| l.max(size)));
        self.batch.records.push(Fetched {
            offset: m.offset(),
            key,
            payload,
            timestamp: m.timestamp(),
        });
    }

    fn take(&mut self) -> FetchedBatch {
        self.reserve = self.batch.bytes.len().clamp(MIN_RESERVE, BATCH_BYTES);
        std::mem::take(&mut self.batch)
    }
}

fn poll_loop(consumer: &KafkaConsumer, feed: Feed<FetchedBatch>, copy: HeaderCopy) {
    let mut queues = Queues::new(consumer, BATCH);
    let mut batch = BatchBuilder::new(copy);
    let mut transient = 0u64;
    let mut transient_error = |e: KafkaError| {
        // Broker and transport errors are retried by librdkafka.
        transient += 1;
        if transient.is_power_of_two() {
            warn!(error = %e, occurrences = transient, "Kafka consumer error (retrying)");
        }
    };
    while !feed.stopped() {
        queues.serve_events(&mut transient_error);
        let wait = if batch.is_empty() {
            Duration::from_millis(100)
        } else {
            Duration::ZERO
        };
        let mut fatal = None;
        let n =
            queues.consume(wait, batch.room(), |m| match m.error() {
                None => batch.push(m),
                Some(RDKafkaErrorCode::PartitionEOF) => {}
                Some(RDKafkaErrorCode::OffsetOutOfRange) => fatal = Some(
                    "offset out of range: records this job has not read were deleted by retention",
                ),
                Some(code) => transient_error(KafkaError::MessageConsumption(code)),
            });
        if let Some(why) = fatal {
            feed.fail(why.into());
            return;
        }
        // Hand the batch over when it is full or the queue ran dry: a partial batch
        // waits for nothing.
        if n > 0 && !batch.is_full() {
            continue;
        }
        if !batch.is_empty() && !feed.send(batch.take()) {
            return;
        }
    }
    drop(queues);
    let _ = consumer.unassign();
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::statistics::{Partition, Topic};

    fn stats(partitions: &[(i32, i64, i64)]) -> Statistics {
        let mut topic = Topic {
            topic: "orders".into(),
            ..Topic::default()
        };
        for &(partition, hi_offset, ls_offset) in partitions {
            topic.partitions.insert(
                partition,
                Partition {
                    partition,
                    hi_offset,
                    ls_offset,
                    ..Partition::default()
                },
            );
        }
        let mut s = Statistics::default();
        s.topics.insert("orders".into(), topic);
        s
    }

    #[test]
    fn a_batch_call_takes_what_fits_under_the_byte_bound_at_the_largest_size_seen() {
        // Small records: the record count bounds the call.
        assert_eq!(take_at_most(0, 0, 100), BATCH);
        assert_eq!(take_at_most(1000, 100_000, 100), BATCH - 1000);
        // Large records: the bytes left bound it, at the largest size seen.
        assert_eq!(take_at_most(0, 0, 300 << 10), 3);
        assert_eq!(take_at_most(3, 900 << 10, 100 << 10), 1);
        // Whatever fits, a batch that is not full takes one more record, as a batch
        // cut by bytes always did: it ends under the bound plus one record.
        assert_eq!(take_at_most(0, 0, BATCH_BYTES), 1);
        assert_eq!(take_at_most(0, 0, 4 * BATCH_BYTES), 1);
        assert_eq!(take_at_most(1, BATCH_BYTES - 1, 10), 1);
        assert_eq!(take_at_most(BATCH, BATCH_BYTES, 10), 1);
        assert_eq!(take_at_most(0, 0, 0), BATCH, "empty records");
        // With records no larger than the largest seen, a call of more than one record
        // never carries a batch past the bound.
        for largest in [1, 100, 4096, 333_333, BATCH_BYTES, 3 * BATCH_BYTES] {
            for bytes in [0, 1, BATCH_BYTES / 2, BATCH_BYTES - 1] {
                let n = take_at_most(0, bytes, largest);
                assert!(n == 1 || bytes + n * largest <= BATCH_BYTES);
            }
        }
    }

    #[test]
    fn the_end_is_the_last_stable_offset_when_reading_committed_else_the_high_watermark() {
        // An open transaction holds the last stable offset back from the high watermark.
        let s = stats(&[(0, 120, 100), (1, 7, 7)]);
        assert_eq!(end_offset(&s, "orders", 0, true), Some(100));
        assert_eq!(end_offset(&s, "orders", 0, false), Some(120));
        assert_eq!(end_offset(&s, "orders", 1, true), Some(7));
    }

    #[test]
    fn an_end_not_fetched_yet_or_not_in_the_statistics_is_unknown() {
        // librdkafka reports -1 until the first fetch response of the partition.
        let s = stats(&[(0, -1, -1), (1, 5, -1)]);
        assert_eq!(end_offset(&s, "orders", 0, true), None);
        assert_eq!(end_offset(&s, "orders", 0, false), None);
        assert_eq!(end_offset(&s, "orders", 1, true), None);
        assert_eq!(end_offset(&s, "orders", 1, false), Some(5));
        assert_eq!(end_offset(&s, "orders", 2, false), None);
        assert_eq!(end_offset(&s, "payments", 0, false), None);
    }

    #[test]
    fn statistics_set_the_ends_of_registered_partitions_only() {
        let t = crate::telemetry::Telemetry::default();
        let ends = LiveEnds::new(true);
        let g = t.partition(
            &crate::connectors::kafka::metrics::PARTITION_PROGRESS,
            "source",
            0,
            "orders",
            0,
        );
        g.set_position(90);
        ends.insert(("orders".into(), 0), g);
        let other = t.partition(
            &crate::connectors::kafka::metrics::PARTITION_PROGRESS,
            "source",
            0,
            "orders",
            1,
        );
        LogContext::new(Arc::new(ends)).stats(stats(&[(0, 120, 100), (1, 7, 7)]));
        let views = t.partitions();
        assert_eq!((views[0].end, views[0].lag), (Some(100), Some(10)));
        assert_eq!(views[1].end, None, "not registered");
        drop(other);
    }
}
