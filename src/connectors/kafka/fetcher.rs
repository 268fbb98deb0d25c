//! The poll loop (Flink's KafkaConsumerThread + Handover): a dedicated thread polls the
//! consumer and hands batches to the source through a bounded channel, so that
//! backpressure stops fetching instead of growing memory. A batch is cut at [`BATCH`]
//! records or [`BATCH_BYTES`], so the hand-over holds less than
//! ([`QUEUED`] + 1) × (1 MiB + the largest record) beyond what the source is processing.

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientContext;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// Forwards librdkafka's logs and errors to `tracing`.
#[derive(Debug, Clone, Default)]
pub struct LogContext;

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
}

impl ConsumerContext for LogContext {}

/// The consumer type of the source.
pub type KafkaConsumer = BaseConsumer<LogContext>;

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
}

/// What the poll thread hands over.
#[derive(Debug)]
pub enum Handover {
    Batch(FetchedBatch),
    /// An error the job cannot continue past.
    Fatal(String),
}

/// Records per handed-over batch.
pub const BATCH: usize = 1024;

/// Bytes (key and payload) at which a handed-over batch is cut: a batch holds less
/// than this plus one record.
pub const BATCH_BYTES: usize = 1 << 20;

/// Batches queued in the hand-over (the poll thread builds one more meanwhile).
pub const QUEUED: usize = 2;

/// The poll thread and the receiving end of its handover channel.
pub struct Fetcher {
    rx: mpsc::Receiver<Handover>,
    stop: Arc<AtomicBool>,
}

impl Fetcher {
    /// Starts polling `consumer` on a dedicated thread.
    pub fn start(consumer: Arc<KafkaConsumer>, name: String) -> Fetcher {
        let (tx, rx) = mpsc::channel(QUEUED);
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        std::thread::Builder::new()
            .name(format!("kafka-{name}"))
            .spawn(move || poll_loop(&consumer, &tx, &flag))
            .expect("spawn the Kafka poll thread");
        Fetcher { rx, stop }
    }

    /// The next handed-over item, waiting at most `wait`.
    pub async fn next(&mut self, wait: Duration) -> Option<Handover> {
        match tokio::time::timeout(wait, self.rx.recv()).await {
            Ok(Some(h)) => Some(h),
            Ok(None) => Some(Handover::Fatal("the Kafka poll thread stopped".into())),
            Err(_) => None,
        }
    }
}

impl Drop for Fetcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Builds one hand-over batch: records in runs of one partition, their keys and
/// payloads copied into one buffer.
struct BatchBuilder {
    batch: FetchedBatch,
    /// The bytes of the previous batch: the next buffer is reserved at that size, so
    /// that a batch fits in one allocation while record sizes stay alike.
    reserve: usize,
}

/// The smallest buffer reserved for a batch.
const MIN_RESERVE: usize = 16 << 10;

impl BatchBuilder {
    fn new() -> BatchBuilder {
        BatchBuilder {
            batch: FetchedBatch::default(),
            reserve: MIN_RESERVE,
        }
    }

    fn is_empty(&self) -> bool {
        self.batch.records.is_empty()
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

    fn push(&mut self, m: &BorrowedMessage<'_>) {
        if self.is_empty() {
            self.batch.bytes.reserve(self.reserve);
            self.batch.records.reserve(BATCH);
        }
        let partition = m.partition();
        let topic = m.topic();
        match self.batch.runs.last_mut() {
            Some(r) if r.partition == partition && *r.topic == *topic => r.len += 1,
            _ => {
                let topic = match self.batch.runs.iter().find(|r| *r.topic == *topic) {
                    Some(r) => r.topic.clone(),
                    None => Arc::from(topic),
                };
                self.batch.runs.push(Run {
                    topic,
                    partition,
                    len: 1,
                });
            }
        }
        let key = self.copy(m.key());
        let payload = self.copy(m.payload());
        self.batch.records.push(Fetched {
            offset: m.offset(),
            key,
            payload,
            timestamp: m.timestamp().to_millis(),
        });
    }

    fn take(&mut self) -> FetchedBatch {
        self.reserve = self.batch.bytes.len().clamp(MIN_RESERVE, BATCH_BYTES);
        std::mem::take(&mut self.batch)
    }
}

fn poll_loop(consumer: &KafkaConsumer, tx: &mpsc::Sender<Handover>, stop: &AtomicBool) {
    let mut batch = BatchBuilder::new();
    let mut transient = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let wait = if batch.is_empty() {
            Duration::from_millis(100)
        } else {
            Duration::ZERO
        };
        match consumer.poll(wait) {
            Some(Ok(m)) => {
                batch.push(&m);
                if !batch.is_full() {
                    continue;
                }
            }
            Some(Err(KafkaError::MessageConsumption(RDKafkaErrorCode::OffsetOutOfRange))) => {
                let _ = tx.blocking_send(Handover::Fatal(
                    "offset out of range: records this job has not read were deleted by retention"
                        .into(),
                ));
                return;
            }
            Some(Err(e)) => {
                // Broker and transport errors are retried by librdkafka.
                transient += 1;
                if transient.is_power_of_two() {
                    warn!(error = %e, occurrences = transient, "Kafka consumer error (retrying)");
                }
            }
            None => {}
        }
        if !batch.is_empty() && tx.blocking_send(Handover::Batch(batch.take())).is_err() {
            return;
        }
    }
    let _ = consumer.unassign();
}
