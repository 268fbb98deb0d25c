//! The Kafka source against a plain rdkafka consumer loop, on the same topic of the
//! embedded cluster, in the same run; printed as JSON.
//!
//! Both sides start from nothing (consumer creation, metadata, assignment) and read
//! every record of the topic once; lockgate runs the whole job (source -> discarding
//! sink, parallelism 1, a checkpoint every second, final checkpoint included).
//! `cargo bench --bench kafka_source`.

use async_trait::async_trait;
use lockgate::connectors::kafka::{KafkaSource, KafkaSourceConfig, TopicSelector};
use lockgate::connectors::{Sink, SinkRestore, SubtaskInfo};
use lockgate::job::{CheckpointSettings, Job, RestartPolicy};
use lockgate::record::Batch;
use lockgate::state::CheckpointId;
use lockgate::testkit::kafka::EmbeddedKafka;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOPIC: &str = "bench";
const PARTITIONS: i32 = 8;
const PER_PARTITION: usize = 80_000;
const ROUNDS: usize = 5;

struct Discard(Arc<AtomicU64>);

#[async_trait]
impl Sink for Discard {
    async fn open(&mut self, _: &SubtaskInfo, _: &SinkRestore) -> lockgate::error::Result<()> {
        Ok(())
    }
    async fn invoke(&mut self, batch: Batch) -> lockgate::error::Result<()> {
        self.0.fetch_add(batch.len() as u64, Ordering::Relaxed);
        Ok(())
    }
    async fn snapshot(&mut self, _: CheckpointId) -> lockgate::error::Result<Vec<u8>> {
        Ok(Vec::new())
    }
    async fn notify_checkpoint_complete(&mut self, _: CheckpointId) -> lockgate::error::Result<()> {
        Ok(())
    }
}

fn produce(bootstrap: &str) {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("compression.type", "lz4")
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .create()
        .expect("producer");
    // 100-byte JSON records.
    for part in 0..PARTITIONS {
        for i in 0..PER_PARTITION {
            let body = format!(
                "{{\"partition\":{part},\"i\":{i:>10},\"pad\":\"{}\"}}",
                "x".repeat(52)
            );
            debug_assert_eq!(body.len(), 100);
            while p
                .send(
                    BaseRecord::<(), _>::to(TOPIC)
                        .partition(part)
                        .payload(&body),
                )
                .is_err()
            {
                p.poll(Duration::from_millis(5));
            }
        }
    }
    p.flush(Duration::from_secs(120)).expect("flush");
}

fn raw_loop(bootstrap: &str) -> f64 {
    let start = Instant::now();
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "raw")
        .set("enable.auto.offset.store", "false")
        .set("enable.auto.commit", "false")
        .set("fetch.queue.backoff.ms", "10")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        // A concrete offset, as lockgate assigns: a logical one (Beginning) costs the raw
        // loop about half a second of offset lookups on the embedded cluster.
        tpl.add_partition_offset(TOPIC, p, Offset::Offset(0))
            .expect("tpl");
    }
    c.assign(&tpl).expect("assign");
    let total = (PARTITIONS as usize * PER_PARTITION) as u64;
    let mut n = 0u64;
    let mut bytes = 0u64;
    // The fastest plain loop: poll without waiting while messages are queued (a timed
    // poll costs a clock and condition-variable round trip per message), wait only
    // when the queue is empty.
    let mut wait = Duration::from_millis(100);
    while n < total {
        match c.poll(wait) {
            Some(Ok(m)) => {
                use rdkafka::Message;
                bytes += m.payload().map_or(0, |p| p.len() as u64);
                n += 1;
                wait = Duration::ZERO;
            }
            _ => wait = Duration::from_millis(100),
        }
    }
    assert!(bytes > 0);
    total as f64 / start.elapsed().as_secs_f64()
}

fn lockgate_job(bootstrap: &str, rt: &tokio::runtime::Runtime) -> f64 {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut cfg = KafkaSourceConfig::new(
        bootstrap,
        TopicSelector::List(vec![TOPIC.into()]),
        "bench-lockgate",
    );
    cfg.bounded = true;
    cfg.partition_discovery_ms = 0;
    let cfg = Arc::new(cfg);
    let count = Arc::new(AtomicU64::new(0));
    let c2 = count.clone();
    let job = Job::builder("kafka-bench")
        .parallelism(1)
        .restart(RestartPolicy::None)
        .checkpointing(CheckpointSettings::new(tmp.path().join("chk")))
        .source("kafka", move |_| Box::new(KafkaSource::new(cfg.clone())))
        .sink("discard", move |_| Box::new(Discard(c2.clone())))
        .build()
        .expect("job");
    let start = Instant::now();
    rt.block_on(lockgate::runtime::run(&job, Default::default()))
        .expect("job runs");
    let secs = start.elapsed().as_secs_f64();
    let total = (PARTITIONS as usize * PER_PARTITION) as u64;
    assert_eq!(
        count.load(Ordering::Relaxed),
        total,
        "every record reached the sink"
    );
    total as f64 / secs
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    v[v.len() / 2]
}

fn main() {
    let kafka =
        EmbeddedKafka::start(3, &[(TOPIC.to_string(), PARTITIONS)]).expect("embedded Kafka");
    produce(kafka.bootstrap_servers());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (mut raw, mut ours) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let r = raw_loop(kafka.bootstrap_servers());
        let l = lockgate_job(kafka.bootstrap_servers(), &rt);
        eprintln!("round {round}: raw rdkafka loop {r:.0} rec/s, lockgate source {l:.0} rec/s");
        raw.push(r);
        ours.push(l);
    }
    let (r, l) = (median(raw), median(ours));
    println!(
        "{}",
        serde_json::json!({
            "benchmark": "Kafka source into a discarding sink vs a plain rdkafka assign() loop",
            "records": PARTITIONS as usize * PER_PARTITION,
            "partitions": PARTITIONS,
            "record_bytes": 100,
            "rounds": ROUNDS,
            "raw_records_per_sec": r.round(),
            "lockgate_records_per_sec": l.round(),
            "ratio_lockgate_over_raw": (l / r * 1000.0).round() / 1000.0,
        })
    );
}
