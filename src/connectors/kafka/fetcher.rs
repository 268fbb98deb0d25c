//! The poll loop (Flink's KafkaConsumerThread + Handover): a dedicated thread polls the
//! consumer and hands batches to the source through a bounded channel, so that
//! backpressure stops fetching instead of growing memory. A batch is cut at [`BATCH`]
//! records or [`BATCH_BYTES`], so the hand-over holds less than
//! ([`QUEUED`] + 1) × (1 MiB + the largest record) beyond what the source is processing.

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientContext;
use std::collections::HashMap;
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

/// One fetched record, owned.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub topic: Arc<str>,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    /// Milliseconds since the epoch, if the broker gave one.
    pub timestamp: Option<i64>,
}

/// What the poll thread hands over.
#[derive(Debug)]
pub enum Handover {
    Batch(Vec<Fetched>),
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

fn poll_loop(consumer: &KafkaConsumer, tx: &mpsc::Sender<Handover>, stop: &AtomicBool) {
    let mut topics: HashMap<String, Arc<str>> = HashMap::new();
    let mut batch = Vec::with_capacity(BATCH);
    let mut batch_bytes = 0usize;
    let mut transient = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let wait = if batch.is_empty() {
            Duration::from_millis(100)
        } else {
            Duration::ZERO
        };
        match consumer.poll(wait) {
            Some(Ok(m)) => {
                let topic = match topics.get(m.topic()) {
                    Some(t) => t.clone(),
                    None => {
                        let t: Arc<str> = Arc::from(m.topic());
                        topics.insert(m.topic().to_string(), t.clone());
                        t
                    }
                };
                batch_bytes += m.key_len() + m.payload_len();
                batch.push(Fetched {
                    topic,
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().map(<[u8]>::to_vec),
                    payload: m.payload().map(<[u8]>::to_vec),
                    timestamp: m.timestamp().to_millis(),
                });
                if batch.len() < BATCH && batch_bytes < BATCH_BYTES {
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
        if !batch.is_empty() {
            let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
            batch_bytes = 0;
            if tx.blocking_send(Handover::Batch(full)).is_err() {
                return;
            }
        }
    }
    let _ = consumer.unassign();
}
