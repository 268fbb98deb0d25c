//! Kafka helpers: the embedded cluster as a separate process (`lockgate testkit kafka`),
//! a real producer, Kafka job files, and a validating reader of the committed output.

use super::bin;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

/// `lockgate testkit kafka` running in its own process.
pub struct KafkaProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pub bootstrap: String,
}

impl KafkaProcess {
    /// Starts 3 brokers with `topics` (name, partitions).
    pub fn start(topics: &[(&str, i32)]) -> KafkaProcess {
        KafkaProcess::start_with(topics, &[])
    }

    /// [`KafkaProcess::start`] with more arguments of `lockgate testkit kafka`
    /// (`--orders TOPIC:COUNT`, say).
    pub fn start_with(topics: &[(&str, i32)], args: &[&str]) -> KafkaProcess {
        let mut cmd = Command::new(bin());
        cmd.args(["testkit", "kafka", "--brokers", "3"]);
        for (t, p) in topics {
            cmd.arg("--topic").arg(format!("{t}:{p}"));
        }
        cmd.args(args);
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let bootstrap = line.trim().to_string();
        assert!(bootstrap.contains(':'), "bootstrap list: {bootstrap:?}");
        KafkaProcess {
            child,
            stdin,
            stdout,
            bootstrap,
        }
    }

    /// Sends a control line (`topic NAME:P`, `down ID`, `up ID`) and waits for `ok`.
    pub fn control(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
        let mut answer = String::new();
        self.stdout.read_line(&mut answer).unwrap();
        assert_eq!(answer.trim(), "ok", "control {line:?}");
    }
}

impl Drop for KafkaProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The payload of record `i` of a partition: it names itself, so that the output can
/// be checked per partition and in order.
pub fn payload(topic: &str, partition: i32, i: usize) -> String {
    format!("{{\"t\":\"{topic}\",\"p\":{partition},\"i\":{i}}}")
}

/// Produces `count` records (indices `from..from+count`) to each partition of a topic
/// and waits until the cluster acknowledged all of them.
pub fn produce(bootstrap: &str, topic: &str, partitions: i32, from: usize, count: usize) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("compression.type", "lz4")
        .create()
        .unwrap();
    for p in 0..partitions {
        for i in from..from + count {
            let body = payload(topic, p, i);
            let key = format!("k{i}");
            loop {
                match producer.send(BaseRecord::to(topic).partition(p).key(&key).payload(&body)) {
                    Ok(()) => break,
                    Err((_, _)) => {
                        producer.poll(Duration::from_millis(10));
                    }
                }
            }
        }
    }
    producer.flush(Duration::from_secs(60)).unwrap();
}

/// Produces raw payloads to one partition.
pub fn produce_raw(bootstrap: &str, topic: &str, partition: i32, payloads: &[&[u8]]) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    for p in payloads {
        producer
            .send(
                BaseRecord::<(), [u8]>::to(topic)
                    .partition(partition)
                    .payload(p),
            )
            .unwrap();
    }
    producer.flush(Duration::from_secs(60)).unwrap();
}

/// A consumer of the cluster (for watermarks and group offsets).
pub fn consumer(bootstrap: &str, group: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap()
}

/// The committed group offsets of a topic's partitions.
pub fn committed(bootstrap: &str, group: &str, topic: &str, partitions: i32) -> Vec<Option<i64>> {
    let c = consumer(bootstrap, group);
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let got = c.committed_offsets(tpl, Duration::from_secs(30)).unwrap();
    (0..partitions)
        .map(|p| match got.find_partition(topic, p).unwrap().offset() {
            Offset::Offset(o) => Some(o),
            _ => None,
        })
        .collect()
}

/// The error the cluster's metadata reports for `topic` (None: no error).
pub fn topic_metadata_error(bootstrap: &str, topic: &str) -> Option<String> {
    let md = consumer(bootstrap, "metadata-probe")
        .fetch_metadata(Some(topic), Duration::from_secs(30))
        .unwrap();
    let t = md.topics().iter().find(|t| t.name() == topic).unwrap();
    t.error().map(|e| format!("{e:?}"))
}

/// The low and high watermarks of a partition (an error while its leader is down).
pub fn watermarks(bootstrap: &str, topic: &str, partition: i32) -> Result<(i64, i64), String> {
    consumer(bootstrap, "watermark-probe")
        .fetch_watermarks(topic, partition, Duration::from_secs(10))
        .map_err(|e| e.to_string())
}

/// A Kafka -> file job file. `source_extra` is appended to `[source.kafka]`.
pub fn write_job(dir: &Path, bootstrap: &str, parallelism: u16, topics: &str, source_extra: &str) {
    let text = format!(
        "[job]\nname = \"kafka-test\"\nparallelism = {parallelism}\n\n\
         [checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 100\n\n\
         [restart]\nstrategy = \"fixed-delay\"\nattempts = 3\ndelay_ms = 100\n\n\
         [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\n{topics}\ngroup_id = \"kafka-test\"\n\
         partition_discovery_ms = 500\nconnect_timeout_ms = 10000\n{source_extra}\n\n\
         [sink.file]\ndir = \"out\"\n"
    );
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("job.toml"), text).unwrap();
}

/// What the committed output holds, per (topic, partition): the record indices in the
/// order they were committed (part files by checkpoint id, then subtask).
pub fn committed_output(out: &Path) -> BTreeMap<(String, i64), Vec<i64>> {
    let mut files: Vec<(u64, u64, std::path::PathBuf)> = Vec::new();
    for e in std::fs::read_dir(out).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().to_string();
        if let Some(rest) = name.strip_prefix("part-") {
            let (s, id) = rest.split_once('-').unwrap();
            files.push((id.parse().unwrap(), s.parse().unwrap(), e.path()));
        }
    }
    files.sort();
    let mut by_tp: BTreeMap<(String, i64), Vec<i64>> = BTreeMap::new();
    for (_, _, path) in files {
        for line in std::fs::read_to_string(path).unwrap().lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let tp = (
                v["t"].as_str().unwrap().to_string(),
                v["p"].as_i64().unwrap(),
            );
            by_tp.entry(tp).or_default().push(v["i"].as_i64().unwrap());
        }
    }
    by_tp
}

/// Asserts that every partition of `topic` holds exactly `from..to` once, in order.
pub fn assert_partitions_exact(out: &Path, topic: &str, partitions: i32, from: i64, to: i64) {
    let got = committed_output(out);
    for p in 0..partitions {
        let seen = got
            .get(&(topic.to_string(), i64::from(p)))
            .cloned()
            .unwrap_or_default();
        let want: Vec<i64> = (from..to).collect();
        if seen != want {
            let dup = seen.len() as i64
                - seen.iter().collect::<std::collections::BTreeSet<_>>().len() as i64;
            panic!(
                "{topic}/{p}: {} records committed, {} expected, {dup} duplicates, first {:?}, in order: {}",
                seen.len(),
                want.len(),
                seen.first(),
                seen.windows(2).all(|w| w[0] < w[1])
            );
        }
    }
}

/// The first record of a dead-letter topic: its payload and its headers.
pub fn first_dead_letter(
    bootstrap: &str,
    topic: &str,
) -> (Vec<u8>, std::collections::HashMap<String, String>) {
    use rdkafka::message::Message;
    let c = consumer(bootstrap, "dlq-reader");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let start = std::time::Instant::now();
    let m = loop {
        if let Some(r) = c.poll(Duration::from_millis(200)) {
            break r.unwrap().detach();
        }
        assert!(
            start.elapsed() < super::wait::DEADLINE,
            "nothing in {topic}"
        );
    };
    let headers = headers_of(&m);
    (m.payload().unwrap_or_default().to_vec(), headers)
}

/// A record's headers as text (the last value of each name).
pub fn headers_of(m: &impl rdkafka::message::Message) -> std::collections::HashMap<String, String> {
    use rdkafka::message::Headers;
    m.headers()
        .map(|hs| {
            hs.iter()
                .map(|h| {
                    (
                        h.key.to_string(),
                        String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}
