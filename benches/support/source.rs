//! The Kafka source against plain rdkafka consumer loops, on the same topic of the
//! embedded cluster, in the same run; printed as one line of JSON on stdout.
//!
//! Each round measures, in this order: one raw consumer, lockgate at parallelism 1,
//! two raw consumers at once (each assigned the partitions that lockgate's subtask of
//! the same index owns), lockgate at parallelism 2. Every side starts from nothing
//! (consumer creation, metadata, assignment) and reads every record of the topic once,
//! with the client settings the source uses; lockgate runs the whole job (source ->
//! discarding sink, a checkpoint every second, final checkpoint included).
//!
//! Per record, the raw side calls `BaseConsumer::poll` (one event, and clock reads)
//! and adds the payload's length. Lockgate's poll thread takes records from
//! librdkafka in batch calls and copies each key and payload into its batch's buffer;
//! the source task checks each payload's JSON, makes a `Record` of slices of that
//! buffer, and moves the partition's position once per run of records.
//!
//! Two rates per side: `records_per_sec` over the steady state, from the first record
//! read (raw) or reaching the sink (lockgate) to the last; `wall_records_per_sec` from
//! the start to the last record (raw) or to the job's return (lockgate), which adds the
//! start-up (and lockgate's final checkpoint) to the hot path. The figures are medians
//! over the rounds; a ratio is median over median, and `round_ratio_median` is the
//! median of the rounds' own ratios (each measured side by side).
//!
//! `cargo bench --bench kafka_source` (and the report): producing the topic takes about 5 s and each
//! round about 15 s on 2 cores (about 80 s in all). The JSON fields are stable;
//! `KAFKA_SOURCE_BENCH_ONLY=raw` or `=lockgate` runs one side alone (for a profile),
//! and then prints no JSON.

use super::median;
use async_trait::async_trait;
use lockgate::connector::{SplitAssigner, StreamHashAssigner};
use lockgate::connectors::kafka::{KafkaSource, KafkaSourceConfig, TopicSelector};
use lockgate::connectors::{Sink, SinkRestore, SubtaskInfo};
use lockgate::formats::json::validate_json;
use lockgate::job::{CheckpointSettings, Job, RestartPolicy};
use lockgate::record::Batch;
use lockgate::state::CheckpointId;
use lockgate::testkit::kafka::EmbeddedKafka;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

const TOPIC: &str = "bench";
/// The embedded cluster keeps at most 100k messages (or 5 MiB) per partition, so four
/// million records need many partitions.
const PARTITIONS: i32 = 48;
const PER_PARTITION: usize = 84_000;
const TOTAL: u64 = PARTITIONS as u64 * PER_PARTITION as u64;
const RECORD_BYTES: usize = 100;
const ROUNDS: usize = 5;
/// The pause after each measurement.
const SETTLE: Duration = Duration::from_millis(500);

/// When records were first and last seen, relative to a start.
#[derive(Debug, Clone, Copy)]
struct Measured {
    first: Duration,
    last: Duration,
    /// The end of the whole run (the last record, or the job's return).
    end: Duration,
    /// CPU time of the whole process (consumers, librdkafka's threads, the embedded
    /// cluster serving them) from the start to `end`.
    cpu: Duration,
}

impl Measured {
    fn cpu_ns_per_record(&self) -> f64 {
        self.cpu.as_nanos() as f64 / TOTAL as f64
    }

    fn steady(&self) -> f64 {
        TOTAL as f64 / (self.last - self.first).as_secs_f64()
    }

    fn wall(&self) -> f64 {
        TOTAL as f64 / self.end.as_secs_f64()
    }
}

/// CPU time of this process so far (user and system, at the kernel's 100 Hz tick).
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let fields: Vec<&str> = stat[stat.rfind(')').expect("(comm)") + 2..]
        .split(' ')
        .collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    Duration::from_millis(ticks * 10)
}

/// What the discarding sinks of one job saw.
struct Progress {
    total: u64,
    count: AtomicU64,
    first: OnceLock<Instant>,
    last: OnceLock<Instant>,
}

struct Discard(Arc<Progress>);

#[async_trait]
impl Sink for Discard {
    async fn open(&mut self, _: &SubtaskInfo, _: &SinkRestore) -> lockgate::error::Result<()> {
        Ok(())
    }
    async fn invoke(&mut self, batch: Batch) -> lockgate::error::Result<()> {
        let now = Instant::now();
        self.0.first.get_or_init(|| now);
        let n = batch.len() as u64;
        if self.0.count.fetch_add(n, Ordering::Relaxed) + n == self.0.total {
            self.0.last.get_or_init(|| now);
        }
        Ok(())
    }
    async fn snapshot(&mut self, _: CheckpointId) -> lockgate::error::Result<Vec<u8>> {
        Ok(Vec::new())
    }
    async fn notify_checkpoint_complete(&mut self, _: CheckpointId) -> lockgate::error::Result<()> {
        Ok(())
    }
}

/// The benchmark's record `i` of `partition`: 100 bytes of JSON.
fn body(out: &mut String, partition: i32, i: usize) {
    use std::fmt::Write;
    out.clear();
    write!(
        out,
        "{{\"partition\":{partition:>2},\"i\":{i:>10},\"pad\":\"{:x<60}\"}}",
        ""
    )
    .expect("a String");
    assert_eq!(out.len(), RECORD_BYTES);
}

/// Nanoseconds per record of the source's JSON check and of `serde_json` skipping the
/// value alone (what the check adds: the UTF-8 pass and the bracket count), over the
/// benchmark's records.
fn json_check_costs() -> (f64, f64) {
    let mut s = String::new();
    let bodies: Vec<Vec<u8>> = (0..200_000)
        .map(|i| {
            body(&mut s, (i % PARTITIONS as usize) as i32, i);
            s.clone().into_bytes()
        })
        .collect();
    let time = |f: &dyn Fn(&[u8]) -> bool| {
        let t = Instant::now();
        for b in &bodies {
            assert!(f(std::hint::black_box(b)));
        }
        t.elapsed().as_nanos() as f64 / bodies.len() as f64
    };
    // Alternating passes, the fastest of each: the machine is shared.
    let (mut ours, mut serde) = (f64::MAX, f64::MAX);
    for _ in 0..10 {
        ours = ours.min(time(&|b| validate_json(b).is_ok()));
        serde = serde.min(time(&|b| {
            serde_json::from_slice::<serde::de::IgnoredAny>(b).is_ok()
        }));
    }
    (ours, serde)
}

fn produce(bootstrap: &str) {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("compression.type", "lz4")
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .expect("producer");
    let mut text = String::with_capacity(RECORD_BYTES);
    for part in 0..PARTITIONS {
        for i in 0..PER_PARTITION {
            body(&mut text, part, i);
            while p
                .send(
                    BaseRecord::<(), _>::to(TOPIC)
                        .partition(part)
                        .payload(&text),
                )
                .is_err()
            {
                p.poll(Duration::from_millis(5));
            }
        }
    }
    p.flush(Duration::from_secs(300)).expect("flush");
}

/// The partitions lockgate's subtask `index` of `parallelism` owns.
fn owned(index: u16, parallelism: u16) -> Vec<i32> {
    (0..PARTITIONS)
        .filter(|p| StreamHashAssigner.owner(TOPIC, *p, parallelism) == index)
        .collect()
}

/// Reads `partitions` to their end with a plain consumer, configured as the source
/// configures its own; returns when, since `start`, it read its first and last record.
/// The consumer is destroyed after that, as lockgate's poll thread destroys its own
/// after the job returned.
fn raw_loop(bootstrap: &str, partitions: &[i32], start: Instant, cpu: Duration) -> Measured {
    // The source's own consumer settings, so that both sides fetch alike.
    let cfg = KafkaSourceConfig::new(bootstrap, TopicSelector::List(vec![TOPIC.into()]), "raw");
    let c: BaseConsumer = KafkaSource::new(Arc::new(cfg))
        .client_config()
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        // A concrete offset, as lockgate assigns: a logical one (Beginning) costs the raw
        // loop about half a second of offset lookups on the embedded cluster.
        tpl.add_partition_offset(TOPIC, *p, Offset::Offset(0))
            .expect("tpl");
    }
    c.assign(&tpl).expect("assign");
    let total = (partitions.len() * PER_PARTITION) as u64;
    let mut n = 0u64;
    let mut bytes = 0u64;
    // The fastest plain loop: poll without waiting while messages are queued (a timed
    // poll costs a clock and condition-variable round trip per message), wait only
    // when the queue is empty.
    let mut wait = Duration::from_millis(100);
    let mut first = None;
    while n < total {
        match c.poll(wait) {
            Some(Ok(m)) => {
                use rdkafka::Message;
                first.get_or_insert_with(|| start.elapsed());
                bytes += m.payload().map_or(0, |p| p.len() as u64);
                n += 1;
                wait = Duration::ZERO;
            }
            _ => wait = Duration::from_millis(100),
        }
    }
    let last = start.elapsed();
    let cpu = process_cpu() - cpu;
    assert_eq!(bytes, total * RECORD_BYTES as u64);
    Measured {
        first: first.expect("records"),
        last,
        end: last,
        cpu,
    }
}

/// `parallelism` raw consumers at once, each on its own thread and on the partitions
/// lockgate's subtask of the same index reads: from the first record any of them read
/// to the last.
fn raw(bootstrap: &str, parallelism: u16) -> Measured {
    let start = Instant::now();
    let cpu = process_cpu();
    let each: Vec<Measured> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..parallelism)
            .map(|i| {
                std::thread::Builder::new()
                    .name(format!("raw-consumer-{i}"))
                    .spawn_scoped(s, move || {
                        raw_loop(bootstrap, &owned(i, parallelism), start, cpu)
                    })
                    .expect("spawn")
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("raw"))
            .collect()
    });
    let first = each.iter().map(|m| m.first).min().expect("a consumer");
    let last = each.iter().map(|m| m.last).max().expect("a consumer");
    // Each consumer read the process's CPU time at its last record: the later one
    // covers the whole measurement.
    let cpu = each.iter().map(|m| m.cpu).max().expect("a consumer");
    Measured {
        first,
        last,
        end: last,
        cpu,
    }
}

fn lockgate_job(bootstrap: &str, rt: &tokio::runtime::Runtime, parallelism: u16) -> Measured {
    let cfg = KafkaSourceConfig::new(
        bootstrap,
        TopicSelector::List(vec![TOPIC.into()]),
        "bench-lockgate",
    );
    run_source(cfg, rt, parallelism, TOTAL)
}

/// Runs a job of the Kafka source of `cfg` (made bounded, without discovery) into a
/// discarding sink, and checks that `total` records reached it.
fn run_source(
    mut cfg: KafkaSourceConfig,
    rt: &tokio::runtime::Runtime,
    parallelism: u16,
    total: u64,
) -> Measured {
    let tmp = tempfile::tempdir().expect("tempdir");
    cfg.bounded = true;
    cfg.partition_discovery_ms = 0;
    let cfg = Arc::new(cfg);
    let progress = Arc::new(Progress {
        total,
        count: AtomicU64::new(0),
        first: OnceLock::new(),
        last: OnceLock::new(),
    });
    let p2 = progress.clone();
    let job = Job::builder("kafka-bench")
        .parallelism(parallelism)
        .restart(RestartPolicy::None)
        .checkpointing(CheckpointSettings::new(tmp.path().join("chk")))
        .source_spec(KafkaSource::spec(cfg))
        .sink("discard", move |_| Box::new(Discard(p2.clone())))
        .build()
        .expect("job");
    let start = Instant::now();
    let cpu = process_cpu();
    rt.block_on(lockgate::runtime::run(&job, Default::default()))
        .expect("job runs");
    let end = start.elapsed();
    let cpu = process_cpu() - cpu;
    assert_eq!(
        progress.count.load(Ordering::Relaxed),
        total,
        "every record reached the sink"
    );
    let at = |t: &OnceLock<Instant>| *t.get().expect("records") - start;
    Measured {
        first: at(&progress.first),
        last: at(&progress.last),
        end,
        cpu,
    }
}

/// Records per second of the Kafka source of `cfg` into a discarding sink, from the
/// first record at the sink to the last (`total` records), at `parallelism`.
pub fn source_rate(
    cfg: KafkaSourceConfig,
    rt: &tokio::runtime::Runtime,
    parallelism: u16,
    total: u64,
) -> f64 {
    let m = run_source(cfg, rt, parallelism, total);
    total as f64 / (m.last - m.first).as_secs_f64()
}

fn ratio(a: f64, b: f64) -> f64 {
    (a / b * 1000.0).round() / 1000.0
}

/// The rounds of one parallelism.
#[derive(Default)]
struct Side {
    raw: Vec<Measured>,
    lockgate: Vec<Measured>,
}

impl Side {
    fn json(&self) -> serde_json::Value {
        let rates = |v: &[Measured], f: fn(&Measured) -> f64| median(v.iter().map(f).collect());
        let (r, l) = (
            rates(&self.raw, Measured::steady),
            rates(&self.lockgate, Measured::steady),
        );
        let (rw, lw) = (
            rates(&self.raw, Measured::wall),
            rates(&self.lockgate, Measured::wall),
        );
        let (rc, lc) = (
            rates(&self.raw, Measured::cpu_ns_per_record),
            rates(&self.lockgate, Measured::cpu_ns_per_record),
        );
        let rounds = self.raw.iter().zip(&self.lockgate);
        let round_ratio = median(rounds.map(|(r, l)| l.steady() / r.steady()).collect());
        serde_json::json!({
            "raw_records_per_sec": r.round(),
            "lockgate_records_per_sec": l.round(),
            "ratio_lockgate_over_raw": ratio(l, r),
            "round_ratio_median": ratio(round_ratio, 1.0),
            "raw_wall_records_per_sec": rw.round(),
            "lockgate_wall_records_per_sec": lw.round(),
            "wall_ratio_lockgate_over_raw": ratio(lw, rw),
            "raw_cpu_ns_per_record": rc.round(),
            "lockgate_cpu_ns_per_record": lc.round(),
            "cpu_ratio_lockgate_over_raw": ratio(lc, rc),
        })
    }
}

/// Runs the rounds and returns the JSON report; `only` (`raw` or `lockgate`) runs one
/// side alone, for a profile, and returns nothing.
pub fn measure(only: Option<&str>) -> Option<serde_json::Value> {
    let began = Instant::now();
    let (run_raw, run_lockgate) = match only {
        None => (true, true),
        Some("raw") => (true, false),
        Some("lockgate") => (false, true),
        Some(other) => panic!("KAFKA_SOURCE_BENCH_ONLY={other}: raw or lockgate"),
    };
    let kafka =
        EmbeddedKafka::start(3, &[(TOPIC.to_string(), PARTITIONS)]).expect("embedded Kafka");
    let t = Instant::now();
    produce(kafka.bootstrap_servers());
    let produce_secs = t.elapsed().as_secs_f64();
    eprintln!("produced {TOTAL} records in {produce_secs:.1} s");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let bootstrap = kafka.bootstrap_servers();
    let (mut p1, mut p2) = (Side::default(), Side::default());
    for round in 0..ROUNDS {
        for (parallelism, side) in [(1u16, &mut p1), (2, &mut p2)] {
            // Consumers are destroyed in the background: each measurement starts on a
            // quiet cluster.
            let idle = Measured {
                first: Duration::ZERO,
                last: Duration::from_secs(1),
                end: Duration::from_secs(1),
                cpu: Duration::from_secs(1),
            };
            let r = if run_raw {
                raw(bootstrap, parallelism)
            } else {
                idle
            };
            std::thread::sleep(SETTLE);
            let l = if run_lockgate {
                lockgate_job(bootstrap, &rt, parallelism)
            } else {
                idle
            };
            std::thread::sleep(SETTLE);
            eprintln!(
                "round {round}, parallelism {parallelism}: raw rdkafka {:.0} rec/s ({:.0} wall, {:.0} ns CPU/record), lockgate {:.0} rec/s ({:.0} wall, {:.0} ns CPU/record)",
                r.steady(), r.wall(), r.cpu_ns_per_record(), l.steady(), l.wall(), l.cpu_ns_per_record()
            );
            side.raw.push(r);
            side.lockgate.push(l);
        }
    }
    if only.is_some() {
        return None;
    }
    let (json_check, serde_check) = json_check_costs();
    let (one, two) = (p1.json(), p2.json());
    Some(serde_json::json!({
        "benchmark": "Kafka source into a discarding sink vs plain rdkafka assign() loops",
        "records": TOTAL,
        "partitions": PARTITIONS,
        "record_bytes": RECORD_BYTES,
        "rounds": ROUNDS,
        "raw_records_per_sec": one["raw_records_per_sec"],
        "lockgate_records_per_sec": one["lockgate_records_per_sec"],
        "ratio_lockgate_over_raw": one["ratio_lockgate_over_raw"],
        "source_ratio": one["ratio_lockgate_over_raw"],
        "source_ratio_p2": two["ratio_lockgate_over_raw"],
        "parallelism_1": one,
        "parallelism_2": two,
        "json_check_ns_per_record": (json_check * 10.0).round() / 10.0,
        "serde_json_check_ns_per_record": (serde_check * 10.0).round() / 10.0,
        "produce_seconds": (produce_secs * 10.0).round() / 10.0,
        "seconds": (began.elapsed().as_secs_f64() * 10.0).round() / 10.0,
    }))
}
