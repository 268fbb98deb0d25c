//! The source's one seam into librdkafka's C API: the consumer queue read in batches
//! (`rd_kafka_consume_batch_queue`), and the main queue (logs, statistics, global
//! errors) served beside it.
//!
//! Why: rdkafka's `BaseConsumer::poll` returns one message per call, and each call
//! reads the clock, sets up an event and counts a reference; with records of 100 bytes
//! that costs more than the record itself. One batch call returns up to a batch of
//! messages for one lock round trip per message and one clock read per call.
//!
//! What it keeps: the batch call serves the ops it pops with librdkafka's callback
//! semantics, and rdkafka installs no statistics or log callback (it takes both as
//! events), so statistics and logs reaching the consumer queue would be dropped
//! unseen. [`KafkaConsumer`] therefore undoes rdkafka's forwarding of
//! the main queue to the consumer queue: the consumer queue then holds fetched
//! messages and per-partition consumer errors only, both of which the batch call
//! returns as messages, and [`Queues::serve_events`] hands the main queue's logs,
//! statistics and errors to the consumer's context, as `BaseConsumer::poll` did.
//! Partitions are still assigned with `assign()`: no rebalance event exists.

use super::fetcher::LogContext;
use rdkafka::bindings as rd;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientContext;
use std::ffi::CStr;
use std::os::raw::c_int;
use std::time::Duration;

/// The source's consumer: an rdkafka `BaseConsumer` whose main queue (logs,
/// statistics, global errors, commit results) is a queue of its own instead of a part
/// of the consumer queue, so that reading the consumer queue in batches cannot
/// swallow them; [`Queues::serve_events`] serves it. Events wait on the main queue
/// until the poll thread serves them, as they waited on the consumer queue before.
/// Dropping it hands the main queue back to the consumer queue first, so that
/// rdkafka's close (which polls the consumer queue) finds the arrangement it made.
pub struct KafkaConsumer(BaseConsumer<LogContext>);

impl KafkaConsumer {
    /// Takes over `consumer`, which must not be assigned anything yet.
    pub fn new(consumer: BaseConsumer<LogContext>) -> KafkaConsumer {
        // SAFETY: the client pointer is valid while `consumer` lives. The handle from
        // `rd_kafka_queue_get_main` holds a reference released right after;
        // forwarding to null is librdkafka's documented way to stop forwarding.
        unsafe {
            let main = rd::rd_kafka_queue_get_main(consumer.client().native_ptr());
            rd::rd_kafka_queue_forward(main, std::ptr::null_mut());
            rd::rd_kafka_queue_destroy(main);
        }
        KafkaConsumer(consumer)
    }
}

impl std::ops::Deref for KafkaConsumer {
    type Target = BaseConsumer<LogContext>;

    fn deref(&self) -> &BaseConsumer<LogContext> {
        &self.0
    }
}

impl Drop for KafkaConsumer {
    fn drop(&mut self) {
        // Waiting events move to the consumer queue, where rdkafka's close serves
        // them: a consumer dropped with events left on a main queue of its own could
        // hang in its destruction.
        // SAFETY: the client is live until `self.0` drops, after this.
        unsafe { rd::rd_kafka_poll_set_consumer(self.0.client().native_ptr()) };
    }
}

/// The consumer queue and the main queue of one consumer, for the thread that polls
/// it (not `Send`: the handles are used by one thread, and released when it drops
/// this).
pub struct Queues<'c> {
    consumer: &'c KafkaConsumer,
    fetch: *mut rd::rd_kafka_queue_t,
    main: *mut rd::rd_kafka_queue_t,
    /// Where a batch call puts its messages; only `..n` of a call are live, and they
    /// are destroyed before the call returns.
    slots: Vec<*mut rd::rd_kafka_message_t>,
}

/// One message of a batch, borrowed until the batch call's closure returns.
pub struct Polled<'m> {
    m: &'m rd::rd_kafka_message_t,
}

impl Polled<'_> {
    /// The consumer error this message carries instead of a record (librdkafka returns
    /// per-partition errors, such as an offset out of range, in the message stream).
    pub fn error(&self) -> Option<RDKafkaErrorCode> {
        (self.m.err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR)
            .then(|| RDKafkaErrorCode::from(self.m.err))
    }

    /// The topic's handle: equal handles are one topic, without comparing names.
    pub fn topic_id(&self) -> usize {
        self.m.rkt as usize
    }

    /// The topic's name.
    pub fn topic(&self) -> &str {
        // SAFETY: a message of a topic holds a reference to its topic handle, whose
        // name is a NUL-terminated string that lives as long as the handle.
        let name = unsafe { CStr::from_ptr(rd::rd_kafka_topic_name(self.m.rkt)) };
        name.to_str().expect("Kafka topic names are ASCII")
    }

    pub fn partition(&self) -> i32 {
        self.m.partition
    }

    pub fn offset(&self) -> i64 {
        self.m.offset
    }

    pub fn key(&self) -> Option<&[u8]> {
        // SAFETY: librdkafka keeps `key_len` bytes at `key` while the message lives.
        unsafe { bytes(self.m.key as *const u8, self.m.key_len) }
    }

    pub fn payload(&self) -> Option<&[u8]> {
        // SAFETY: librdkafka keeps `len` bytes at `payload` while the message lives.
        unsafe { bytes(self.m.payload as *const u8, self.m.len) }
    }

    /// The message's headers, if it has any.
    fn headers(&self) -> Option<*mut rd::rd_kafka_headers_t> {
        let mut headers: *mut rd::rd_kafka_headers_t = std::ptr::null_mut();
        // SAFETY: the message is live; librdkafka parses its headers once and keeps
        // them with the message, returning a borrowed handle.
        let err = unsafe { rd::rd_kafka_message_headers(self.m, &mut headers) };
        (err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && !headers.is_null())
            .then_some(headers)
    }

    /// Calls `f` with each header's name and value (`None`: no value), in order.
    pub fn each_header(&self, mut f: impl FnMut(&[u8], Option<&[u8]>)) {
        let Some(headers) = self.headers() else {
            return;
        };
        for idx in 0.. {
            let mut name: *const std::ffi::c_char = std::ptr::null();
            let mut value: *const std::ffi::c_void = std::ptr::null();
            let mut size = 0usize;
            // SAFETY: `headers` belongs to the live message; librdkafka returns
            // pointers into it, valid while the message lives, or an error past the
            // last header.
            let err = unsafe {
                rd::rd_kafka_header_get_all(headers, idx, &mut name, &mut value, &mut size)
            };
            if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
                return;
            }
            // SAFETY: as above; a name is NUL-terminated.
            let name = unsafe { CStr::from_ptr(name) }.to_bytes();
            // SAFETY: as above; a null value (a header without one) is None.
            f(name, unsafe { bytes(value as *const u8, size) });
        }
    }

    /// The value of the last header named `name`, if the message has one.
    pub fn header(&self, name: &CStr) -> Option<&[u8]> {
        let headers = self.headers()?;
        let mut value: *const std::ffi::c_void = std::ptr::null();
        let mut size = 0usize;
        // SAFETY: `headers` belongs to the live message and `name` is NUL-terminated;
        // the value stays valid while the message lives.
        let err =
            unsafe { rd::rd_kafka_header_get_last(headers, name.as_ptr(), &mut value, &mut size) };
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return None;
        }
        // SAFETY: as above; a null value (a header without one) is None.
        unsafe { bytes(value as *const u8, size) }
    }

    /// Milliseconds since the epoch, if the broker gave a timestamp.
    pub fn timestamp(&self) -> Option<i64> {
        let mut kind = rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        // SAFETY: the message is live; librdkafka only reads it and writes `kind`.
        let ms = unsafe { rd::rd_kafka_message_timestamp(self.m, &mut kind) };
        (ms != -1 && kind != rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE)
            .then_some(ms)
    }
}

/// A slice of `len` bytes at `ptr`, `None` for a null pointer (no key, a tombstone).
///
/// # Safety
/// A non-null `ptr` must point to `len` readable bytes that outlive `'a`.
unsafe fn bytes<'a>(ptr: *const u8, len: usize) -> Option<&'a [u8]> {
    if ptr.is_null() {
        None
    } else if len == 0 {
        Some(&[])
    } else {
        Some(std::slice::from_raw_parts(ptr, len))
    }
}

/// Destroys the messages of one batch call when dropped, so that each is destroyed
/// exactly once even if the closure that reads them panics.
struct Destroy<'a>(&'a mut [*mut rd::rd_kafka_message_t]);

impl Drop for Destroy<'_> {
    fn drop(&mut self) {
        for m in self.0.iter_mut() {
            // SAFETY: each pointer was returned by one batch call and is destroyed
            // here once; it is nulled so that no second drop could see it.
            unsafe { rd::rd_kafka_message_destroy(*m) };
            *m = std::ptr::null_mut();
        }
    }
}

impl<'c> Queues<'c> {
    /// The queues of `consumer`; batch calls return at most `max` messages.
    pub fn new(consumer: &'c KafkaConsumer, max: usize) -> Queues<'c> {
        let rk = consumer.client().native_ptr();
        // SAFETY: `rk` is valid while `consumer` lives, which outlives `Queues`. Each
        // handle holds a reference to its queue, released in `drop`.
        let (fetch, main) = unsafe {
            (
                rd::rd_kafka_queue_get_consumer(rk),
                rd::rd_kafka_queue_get_main(rk),
            )
        };
        assert!(
            !fetch.is_null(),
            "a consumer with a group.id has a consumer queue"
        );
        Queues {
            consumer,
            fetch,
            main,
            slots: vec![std::ptr::null_mut(); max.max(1)],
        }
    }

    /// Reads up to the batch size of messages (fewer if `room` is smaller), waiting
    /// at most `wait` for the first one; calls `each` on every message in queue order
    /// and returns how many there were. A wait returns as soon as one message is
    /// there (a batch call would otherwise wait until the batch is full).
    pub fn consume(
        &mut self,
        wait: Duration,
        room: usize,
        mut each: impl FnMut(&Polled<'_>),
    ) -> usize {
        let room = room.clamp(1, self.slots.len());
        let (timeout_ms, size) = if wait.is_zero() {
            (0, room)
        } else {
            (c_int::try_from(wait.as_millis()).unwrap_or(c_int::MAX), 1)
        };
        // SAFETY: `fetch` is a live queue handle and `slots` has room for `size`
        // pointers; librdkafka writes at most `size` and returns how many, or -1.
        let n = unsafe {
            rd::rd_kafka_consume_batch_queue(self.fetch, timeout_ms, self.slots.as_mut_ptr(), size)
        };
        let n = usize::try_from(n).unwrap_or(0);
        let batch = Destroy(&mut self.slots[..n]);
        for &m in batch.0.iter() {
            // SAFETY: the message lives until `batch` drops, after this loop.
            each(&Polled { m: unsafe { &*m } });
        }
        n
    }

    /// Serves every event waiting on the main queue without waiting: logs, statistics
    /// and global errors go to the consumer's context as rdkafka's own poll hands
    /// them over; each global error is also passed to `on_error`. Asynchronous commit
    /// results are dropped (the source's context ignores them, as rdkafka's default
    /// does).
    pub fn serve_events(&self, mut on_error: impl FnMut(KafkaError)) {
        let context: &LogContext = self.consumer.context();
        loop {
            // SAFETY: `main` is a live queue handle; a non-null event is ours until
            // `rd_kafka_event_destroy`, and the strings read from it live as long.
            unsafe {
                let ev = rd::rd_kafka_queue_poll(self.main, 0);
                if ev.is_null() {
                    return;
                }
                match rd::rd_kafka_event_type(ev) {
                    rd::RD_KAFKA_EVENT_LOG => {
                        let (mut fac, mut text, mut level) =
                            (std::ptr::null(), std::ptr::null(), 0);
                        if rd::rd_kafka_event_log(ev, &mut fac, &mut text, &mut level) == 0 {
                            context.log(
                                log_level(level),
                                CStr::from_ptr(fac).to_string_lossy().trim(),
                                CStr::from_ptr(text).to_string_lossy().trim(),
                            );
                        }
                    }
                    rd::RD_KAFKA_EVENT_STATS => {
                        context.stats_raw(CStr::from_ptr(rd::rd_kafka_event_stats(ev)).to_bytes());
                    }
                    rd::RD_KAFKA_EVENT_ERROR => {
                        let code = RDKafkaErrorCode::from(rd::rd_kafka_event_error(ev));
                        let reason = CStr::from_ptr(rd::rd_kafka_event_error_string(ev));
                        context.error(KafkaError::Global(code), reason.to_string_lossy().trim());
                        on_error(KafkaError::Global(code));
                    }
                    _ => {}
                }
                rd::rd_kafka_event_destroy(ev);
            }
        }
    }
}

impl Drop for Queues<'_> {
    fn drop(&mut self) {
        // SAFETY: both handles were obtained in `new` and are released once.
        unsafe {
            rd::rd_kafka_queue_destroy(self.fetch);
            rd::rd_kafka_queue_destroy(self.main);
        }
    }
}

/// librdkafka's syslog levels as rdkafka names them.
fn log_level(level: c_int) -> RDKafkaLogLevel {
    match level {
        0 => RDKafkaLogLevel::Emerg,
        1 => RDKafkaLogLevel::Alert,
        2 => RDKafkaLogLevel::Critical,
        3 => RDKafkaLogLevel::Error,
        4 => RDKafkaLogLevel::Warning,
        5 => RDKafkaLogLevel::Notice,
        6 => RDKafkaLogLevel::Info,
        _ => RDKafkaLogLevel::Debug,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::kafka::fetcher::LiveEnds;
    use crate::testkit::kafka::EmbeddedKafka;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};
    use std::sync::Arc;
    use std::time::Instant;

    fn queue_length(q: *mut rd::rd_kafka_queue_t) -> usize {
        // SAFETY: a live queue handle.
        unsafe { rd::rd_kafka_queue_length(q) }
    }

    /// Batch calls return every record once, in partition order, with its key,
    /// payload and timestamp; statistics and logs keep reaching the context; and the
    /// consumer is destroyed promptly afterwards (a message not destroyed keeps its
    /// partition, and so its broker thread, alive: destruction would hang).
    #[test]
    fn batches_return_every_record_once_and_events_reach_the_context() {
        let kafka = EmbeddedKafka::start(1, &[("t".into(), 2)]).unwrap();
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", kafka.bootstrap_servers())
            .create()
            .unwrap();
        const PER_PARTITION: i64 = 3000;
        for i in 0..PER_PARTITION {
            for p in 0..2 {
                let (key, value) = (format!("k{i}"), format!("{{\"p\":{p},\"i\":{i}}}"));
                let record = BaseRecord::to("t")
                    .partition(p)
                    .key(&key)
                    .payload(&value)
                    .timestamp(1_000 + i);
                producer.send(record).map_err(|(e, _)| e).unwrap();
            }
            producer.poll(Duration::ZERO);
        }
        producer.flush(Duration::from_secs(30)).unwrap();

        let ends = Arc::new(LiveEnds::new(true));
        let t = crate::telemetry::Telemetry::default();
        ends.insert(
            ("t".into(), 0),
            t.partition(
                &crate::connectors::kafka::metrics::PARTITION_PROGRESS,
                "source",
                0,
                "t",
                0,
            ),
        );
        let base: BaseConsumer<LogContext> = ClientConfig::new()
            .set("bootstrap.servers", kafka.bootstrap_servers())
            .set("group.id", "g")
            .set("enable.auto.commit", "false")
            .set("statistics.interval.ms", "100")
            .create_with_context(LogContext::new(ends))
            .unwrap();
        let consumer = KafkaConsumer::new(base);
        let mut tpl = TopicPartitionList::new();
        for p in 0..2 {
            tpl.add_partition_offset("t", p, Offset::Offset(0)).unwrap();
        }
        consumer.assign(&tpl).unwrap();

        let mut queues = Queues::new(&consumer, 256);
        let mut next = [0i64; 2];
        let (mut largest_call, mut n) = (0, 0);
        let deadline = Instant::now() + Duration::from_secs(30);
        while next != [PER_PARTITION; 2] {
            assert!(Instant::now() < deadline, "read {next:?}");
            queues.serve_events(|e| panic!("{e}"));
            // As the poll thread does: wait only when the last call found nothing.
            let wait = if n > 0 {
                Duration::ZERO
            } else {
                Duration::from_millis(100)
            };
            n = queues.consume(wait, 256, |m| {
                assert_eq!(m.error(), None);
                assert_eq!(m.topic(), "t");
                let (p, o) = (m.partition(), m.offset());
                assert_eq!(o, next[p as usize], "partition {p} in order, each once");
                next[p as usize] += 1;
                assert_eq!(m.key(), Some(format!("k{o}").as_bytes()));
                assert_eq!(
                    m.payload(),
                    Some(format!("{{\"p\":{p},\"i\":{o}}}").as_bytes())
                );
                assert_eq!(m.timestamp(), Some(1_000 + o));
            });
            assert!(n <= 256);
            largest_call = largest_call.max(n);
        }
        assert!(largest_call > 1, "batch calls return several messages");

        // Statistics arrive on the main queue and set the end of the registered
        // partition; serving leaves the main queue empty.
        let deadline = Instant::now() + Duration::from_secs(10);
        while t.partitions()[0].end != Some(PER_PARTITION) {
            assert!(Instant::now() < deadline, "{:?}", t.partitions());
            std::thread::sleep(Duration::from_millis(50));
            queues.serve_events(|e| panic!("{e}"));
        }
        assert_eq!(queue_length(queues.main), 0);
        // New events wait on the main queue; the consumer queue, read to its end,
        // receives none.
        let deadline = Instant::now() + Duration::from_secs(10);
        while queue_length(queues.main) == 0 {
            assert!(Instant::now() < deadline, "no statistics for 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(queue_length(queues.fetch), 0);

        drop(queues);
        let started = Instant::now();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(consumer);
            let _ = done_tx.send(());
        });
        assert!(
            done_rx.recv_timeout(Duration::from_secs(20)).is_ok(),
            "the consumer was not destroyed within 20 s"
        );
        assert!(started.elapsed() < Duration::from_secs(20));
    }
}
