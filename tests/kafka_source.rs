//! The Kafka source against the embedded cluster in a separate process, with records
//! from a real producer (Flink's Kafka consumer acceptance cases).

mod common;

use common::kafka::*;
use common::wait::{self, DEADLINE};
use common::{bin, wait_timeout};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Runs `lockgate run` on `dir/job.toml` to its end; returns the status and its log.
fn run_job(dir: &Path, failpoints: Option<&str>, extra: &[&str]) -> (ExitStatus, String) {
    let log_path = dir.join(format!(
        "run-{}.log",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    let log = std::fs::File::create(&log_path).unwrap();
    let mut cmd = Command::new(bin());
    cmd.arg("run")
        .arg("--config")
        .arg(dir.join("job.toml"))
        .args(extra);
    cmd.env("LOCKGATE_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log);
    match failpoints {
        Some(f) => cmd.env("LOCKGATE_FAILPOINTS", f),
        None => cmd.env_remove("LOCKGATE_FAILPOINTS"),
    };
    let status = wait_timeout(&mut cmd.spawn().unwrap(), Duration::from_secs(120));
    (status, std::fs::read_to_string(&log_path).unwrap())
}

/// Starts `lockgate run` on `dir/job.toml` in the background, with failpoints (if
/// any), logging to `dir/<name>.log`; returns the child and the log's path.
fn spawn_job(
    dir: &Path,
    failpoints: Option<&str>,
    name: &str,
) -> (std::process::Child, std::path::PathBuf) {
    let log_path = dir.join(format!("{name}.log"));
    let mut cmd = Command::new(bin());
    cmd.args(["run", "--config"])
        .arg(dir.join("job.toml"))
        .env("LOCKGATE_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap());
    if let Some(f) = failpoints {
        cmd.env("LOCKGATE_FAILPOINTS", f);
    }
    (cmd.spawn().unwrap(), log_path)
}

/// Starts the job slowed down by a failpoint (every batch of at most 1024 records takes
/// at least 500 ms: the busiest subtask's records / 1024 * 0.5 s is a lower bound of the
/// run), waits for `n` complete checkpoints, and kills it with SIGKILL.
fn run_then_sigkill_after_checkpoints(dir: &Path, n: usize) {
    let (mut child, log) = spawn_job(dir, Some("source-batch=sleep(500)"), "killed");
    wait::while_running(
        &mut child,
        &log,
        &format!("{n} complete checkpoints"),
        DEADLINE,
        || {
            std::fs::read_dir(dir.join("checkpoints"))
                .map(|rd| {
                    rd.filter_map(|e| e.ok())
                        // Published checkpoints only: `chk-N.inprogress` may hold a
                        // `_metadata` before it is renamed into place.
                        .filter(|e| !e.file_name().to_string_lossy().contains('.'))
                        .filter(|e| e.path().join("_metadata").exists())
                        .count()
                })
                .unwrap_or(0)
                >= n
        },
    );
    assert!(common::sigkill(&mut child), "the job ended before the kill");
}

/// Flink's one-to-one / one-to-many / many-to-one exactly-once cases: a failure after
/// about a third of the records, an in-process restore from the last checkpoint, and a
/// validating read of the committed output.
fn exactly_once_with_one_failure(partitions: i32, parallelism: u16) {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", partitions)]);
    let per_partition = 3000;
    produce(&kafka.bootstrap, "orders", partitions, 0, per_partition);
    write_job(
        tmp.path(),
        &kafka.bootstrap,
        parallelism,
        "topics = [\"orders\"]",
        "bounded = \"latest\"",
    );
    // Each batch takes 20 ms; the panic comes once, after about a third of the batches.
    let batches = (partitions as usize * per_partition) / 1024 + 1;
    let fp = format!(
        "source-batch={}*sleep(20)->1*panic(injected failure)->sleep(20)",
        batches / 3
    );
    let (status, log) = run_job(tmp.path(), Some(&fp), &[]);
    assert!(status.success(), "{log}");
    assert!(
        log.contains("injected failure"),
        "the failure was injected:\n{log}"
    );
    assert!(
        log.contains("restarting from the last completed checkpoint"),
        "{log}"
    );
    assert_partitions_exact(
        &tmp.path().join("out"),
        "orders",
        partitions,
        0,
        per_partition as i64,
    );
}

#[test]
fn one_to_one_exactly_once_5_partitions_parallelism_5() {
    exactly_once_with_one_failure(5, 5);
}

#[test]
fn one_subtask_for_several_partitions_5_partitions_parallelism_2() {
    exactly_once_with_one_failure(5, 2);
}

#[test]
fn more_subtasks_than_partitions_5_partitions_parallelism_8() {
    exactly_once_with_one_failure(5, 8);
}

#[test]
fn sigkill_mid_run_and_restart_is_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 4)]);
    produce(&kafka.bootstrap, "orders", 4, 0, 20_000);
    write_job(
        tmp.path(),
        &kafka.bootstrap,
        2,
        "topics = [\"orders\"]",
        "bounded = \"latest\"",
    );
    // 40 000 records a subtask: the slowed run lasts 20 s or more; the kill comes two
    // checkpoints into it.
    run_then_sigkill_after_checkpoints(tmp.path(), 2);
    let (status, log) = run_job(tmp.path(), None, &[]);
    assert!(status.success(), "{log}");
    assert!(log.contains("restoring"), "{log}");
    assert_partitions_exact(&tmp.path().join("out"), "orders", 4, 0, 20_000);
}

#[test]
fn startup_earliest_reads_everything_and_commits_next_offsets_to_the_group() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 3)]);
    produce(&kafka.bootstrap, "orders", 3, 0, 500);
    write_job(
        tmp.path(),
        &kafka.bootstrap,
        2,
        "topics = [\"orders\"]",
        "bounded = \"latest\"\nstartup = \"earliest\"",
    );
    let (status, log) = run_job(tmp.path(), None, &[]);
    assert!(status.success(), "{log}");
    assert_partitions_exact(&tmp.path().join("out"), "orders", 3, 0, 500);
    // The group offset is the next offset to read: the end of each partition.
    assert_eq!(
        committed(&kafka.bootstrap, "kafka-test", "orders", 3),
        vec![Some(500); 3]
    );
}

#[test]
fn startup_group_offsets_starts_at_the_committed_offsets() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 2)]);
    produce(&kafka.bootstrap, "orders", 2, 0, 300);
    {
        let c = consumer(&kafka.bootstrap, "kafka-test");
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition_offset("orders", 0, rdkafka::Offset::Offset(120))
            .unwrap();
        tpl.add_partition_offset("orders", 1, rdkafka::Offset::Offset(250))
            .unwrap();
        rdkafka::consumer::Consumer::commit(&c, &tpl, rdkafka::consumer::CommitMode::Sync).unwrap();
    }
    write_job(
        tmp.path(),
        &kafka.bootstrap,
        1,
        "topics = [\"orders\"]",
        "bounded = \"latest\"\nstartup = \"group-offsets\"",
    );
    let (status, log) = run_job(tmp.path(), None, &[]);
    assert!(status.success(), "{log}");
    let got = committed_output(&tmp.path().join("out"));
    assert_eq!(
        got[&("orders".to_string(), 0)],
        (120..300).collect::<Vec<_>>()
    );
    assert_eq!(
        got[&("orders".to_string(), 1)],
        (250..300).collect::<Vec<_>>()
    );
}

#[test]
fn startup_latest_reads_only_records_produced_after_the_start() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 2)]);
    produce(&kafka.bootstrap, "orders", 2, 0, 200);
    write_job(
        tmp.path(),
        &kafka.bootstrap,
        1,
        "topics = [\"orders\"]",
        "startup = \"latest\"",
    );
    let (mut child, log_path) = spawn_job(tmp.path(), None, "latest");
    // Both partitions' start positions are resolved before anything new is produced.
    wait::for_log_while_running(&mut child, &log_path, "partition assigned", 2, DEADLINE);
    produce(&kafka.bootstrap, "orders", 2, 200, 100);
    // Wait until the new records are committed, then stop with a final checkpoint.
    let out = tmp.path().join("out");
    wait::while_running(
        &mut child,
        &log_path,
        "the 200 new records committed",
        DEADLINE,
        || out.exists() && committed_output(&out).values().map(Vec::len).sum::<usize>() >= 200,
    );
    common::signal(&child, libc::SIGTERM);
    assert!(wait_timeout(&mut child, DEADLINE).success());
    assert_partitions_exact(&out, "orders", 2, 200, 300);
}

#[test]
fn startup_timestamp_on_the_mock_cluster_starts_at_the_end() {
    // The mock cluster has no timestamp index and answers the end offset for every
    // time: as Kafka defines it, "no record at or after the time" starts at the end.
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 2)]);
    produce(&kafka.bootstrap, "orders", 2, 0, 100);
    write_job(
        tmp.path(),
        &kafka.bootstrap,
        1,
        "topics = [\"orders\"]",
        "bounded = \"latest\"\nstartup = \"timestamp:0\"",
    );
    let (status, log) = run_job(tmp.path(), None, &[]);
    assert!(status.success(), "{log}");
    assert!(committed_output(&tmp.path().join("out")).is_empty());
    assert!(
        log.contains("start=100"),
        "started at the end offset:\n{log}"
    );
}

#[test]
fn restore_after_a_new_topic_matched_the_pattern_reads_it_from_earliest() {
    let tmp = tempfile::tempdir().unwrap();
    let mut kafka = KafkaProcess::start(&[("orders-a", 3)]);
    // Up to 40 000 records a subtask: the slowed first run lasts 20 s or more.
    produce(&kafka.bootstrap, "orders-a", 3, 0, 20_000);
    write_job(
        tmp.path(),
        &kafka.bootstrap,
        2,
        "topic_pattern = \"orders-.*\"",
        "bounded = \"latest\"",
    );
    run_then_sigkill_after_checkpoints(tmp.path(), 1);
    // A topic that appears after the checkpoint, with records produced before the restore.
    kafka.control("topic orders-b:2");
    produce(&kafka.bootstrap, "orders-b", 2, 0, 700);
    let (status, log) = run_job(tmp.path(), None, &[]);
    assert!(status.success(), "{log}");
    assert!(log.contains("restoring"), "{log}");
    let out = tmp.path().join("out");
    assert_partitions_exact(&out, "orders-a", 3, 0, 20_000);
    assert_partitions_exact(&out, "orders-b", 2, 0, 700);
}

#[test]
fn topic_pattern_selects_topics_whose_whole_name_matches_an_alternative() {
    let tmp = tempfile::tempdir().unwrap();
    let topics = ["orders", "orders-eu", "orders-dlq", "xorders", "orders-eux"];
    let kafka = KafkaProcess::start(&topics.map(|t| (t, 1)));
    for t in topics {
        produce(&kafka.bootstrap, t, 1, 0, 30);
    }
    // Java's `Pattern.matches`: `orders-eu` is selected although the first alternative
    // matches a prefix of it; `orders-dlq`, `xorders` and `orders-eux` are not.
    write_job(
        tmp.path(),
        &kafka.bootstrap,
        2,
        "topic_pattern = \"orders|orders-eu\"",
        "bounded = \"latest\"",
    );
    let (status, log) = run_job(tmp.path(), None, &[]);
    assert!(status.success(), "{log}");
    let out = tmp.path().join("out");
    let read: std::collections::BTreeSet<String> =
        committed_output(&out).into_keys().map(|(t, _)| t).collect();
    assert_eq!(
        read,
        ["orders", "orders-eu"]
            .map(String::from)
            .into_iter()
            .collect()
    );
    assert_partitions_exact(&out, "orders", 1, 0, 30);
    assert_partitions_exact(&out, "orders-eu", 1, 0, 30);
}

#[test]
fn restore_after_a_topic_was_added_to_topics_reads_it_from_earliest() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("t1", 2), ("t2", 2)]);
    // 20 000 records a subtask: the slowed first run lasts 10 s or more.
    produce(&kafka.bootstrap, "t1", 2, 0, 20_000);
    produce(&kafka.bootstrap, "t2", 2, 0, 300);
    write_job(
        tmp.path(),
        &kafka.bootstrap,
        2,
        "topics = [\"t1\"]",
        "bounded = \"latest\"\nstartup = \"earliest\"",
    );
    run_then_sigkill_after_checkpoints(tmp.path(), 1);
    // After a restore, `startup` no longer applies: the new topic starts at EARLIEST
    // even though the job now says latest.
    write_job(
        tmp.path(),
        &kafka.bootstrap,
        2,
        "topics = [\"t1\", \"t2\"]",
        "bounded = \"latest\"\nstartup = \"latest\"",
    );
    let (status, log) = run_job(tmp.path(), None, &[]);
    assert!(status.success(), "{log}");
    assert!(log.contains("restoring"), "{log}");
    assert_partitions_exact(&tmp.path().join("out"), "t1", 2, 0, 20_000);
    assert_partitions_exact(&tmp.path().join("out"), "t2", 2, 0, 300);
}

#[test]
fn bounded_mode_stops_at_the_end_offsets_captured_at_first_start() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 2)]);
    produce(&kafka.bootstrap, "orders", 2, 0, 5000);
    write_job(
        tmp.path(),
        &kafka.bootstrap,
        1,
        "topics = [\"orders\"]",
        "bounded = \"latest\"",
    );
    // 10 000 records in batches of at most 1024, each taking 1 s: the run lasts 10 s or
    // more after its start.
    let (mut child, log_path) = spawn_job(tmp.path(), Some("source-batch=sleep(1000)"), "bounded");
    // The end offsets are captured with the start positions, before this line.
    wait::for_log_while_running(&mut child, &log_path, "partition assigned", 2, DEADLINE);
    produce(&kafka.bootstrap, "orders", 2, 5000, 500);
    assert!(
        wait::running(&mut child),
        "the job was still reading when the later records arrived"
    );
    let status = wait_timeout(&mut child, DEADLINE);
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(log.contains("is_final=true"), "{log}");
    assert_partitions_exact(&tmp.path().join("out"), "orders", 2, 0, 5000);
}

#[test]
fn broker_down_for_ten_seconds_loses_and_duplicates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let mut kafka = KafkaProcess::start(&[("orders", 6)]);
    produce(&kafka.bootstrap, "orders", 6, 0, 8000);
    write_job(
        tmp.path(),
        &kafka.bootstrap,
        2,
        "topics = [\"orders\"]",
        "bounded = \"latest\"",
    );
    // 24 000 records a subtask in batches of at most 1024, each taking 500 ms: the run
    // lasts 12 s or more after its first records.
    let (mut child, log_path) = spawn_job(tmp.path(), Some("source-batch=sleep(500)"), "down");
    // Both subtasks are reading (past their start, which needs every leader).
    wait::for_log_while_running(&mut child, &log_path, "first records emitted", 2, DEADLINE);
    kafka.control("down 1");
    assert!(
        wait::running(&mut child),
        "the broker went down while the job was reading"
    );
    // The outage is visible to a client: broker 1 (the first bootstrap address)
    // refuses connections. (A probe of partition leaders was timing-dependent: under
    // load it could miss the window in which a leader did not answer.)
    let broker1 = kafka.bootstrap.split(',').next().unwrap().to_string();
    wait::until("broker 1 to refuse connections", DEADLINE, || {
        std::net::TcpStream::connect(&broker1).is_err()
    });
    // The outage itself.
    std::thread::sleep(Duration::from_secs(10));
    kafka.control("up 1");
    let status = wait_timeout(&mut child, DEADLINE);
    assert!(
        status.success(),
        "{}",
        std::fs::read_to_string(&log_path).unwrap()
    );
    assert_partitions_exact(&tmp.path().join("out"), "orders", 6, 0, 8000);
}

fn decode_error_case(
    policy: &str,
    extra_topics: &[(&str, i32)],
) -> (tempfile::TempDir, KafkaProcess, ExitStatus, String) {
    let tmp = tempfile::tempdir().unwrap();
    let mut topics = vec![("orders", 1)];
    topics.extend_from_slice(extra_topics);
    let kafka = KafkaProcess::start(&topics);
    let good0 = payload("orders", 0, 0);
    let good2 = payload("orders", 0, 2);
    produce_raw(
        &kafka.bootstrap,
        "orders",
        0,
        &[good0.as_bytes(), b"{not json", good2.as_bytes()],
    );
    write_job(
        tmp.path(),
        &kafka.bootstrap,
        1,
        "topics = [\"orders\"]",
        &format!("bounded = \"latest\"\non_decode_error = \"{policy}\""),
    );
    let (status, log) = run_job(tmp.path(), None, &[]);
    (tmp, kafka, status, log)
}

#[test]
fn invalid_json_under_fail_fails_the_job_naming_topic_partition_offset() {
    let (_tmp, _k, status, log) = decode_error_case("fail", &[]);
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("record orders/0@1 cannot be decoded"), "{log}");
}

#[test]
fn invalid_json_under_skip_is_counted_and_the_rest_is_committed() {
    let (tmp, _k, status, log) = decode_error_case("skip", &[]);
    assert!(status.success(), "{log}");
    assert!(
        log.contains("skipping a record that cannot be decoded"),
        "{log}"
    );
    let got = committed_output(&tmp.path().join("out"));
    assert_eq!(got[&("orders".to_string(), 0)], vec![0, 2]);
}

#[test]
fn invalid_json_under_dead_letter_reaches_the_dead_letter_topic_with_its_error() {
    let (tmp, kafka, status, log) =
        decode_error_case("dead-letter:orders-dlq", &[("orders-dlq", 1)]);
    assert!(status.success(), "{log}");
    let got = committed_output(&tmp.path().join("out"));
    assert_eq!(got[&("orders".to_string(), 0)], vec![0, 2]);
    let (payload, h) = first_dead_letter(&kafka.bootstrap, "orders-dlq");
    assert_eq!(payload, b"{not json");
    assert_eq!(h["lockgate.topic"], "orders");
    assert_eq!(h["lockgate.offset"], "1");
    assert!(h["lockgate.error"].contains("not valid JSON"), "{h:?}");
}

/// Upstream coordinates as a `[sink.kafka]` writes them: topic, partition, offset.
type Origin<'a> = (&'a str, i32, i64);

/// Writes `records` to partition 0 of `topic`: each a payload and, if given, the origin
/// headers a `[sink.kafka]` writes (upstream topic, partition, offset).
fn produce_with_origin(bootstrap: &str, topic: &str, records: &[(String, Option<Origin>)]) {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let p: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    for (payload, origin) in records {
        let mut r = BaseRecord::<(), _>::to(topic).partition(0).payload(payload);
        if let Some((t, part, off)) = origin {
            let (part, off) = (part.to_string(), off.to_string());
            r = r.headers(
                OwnedHeaders::new()
                    .insert(Header {
                        key: "lockgate.topic",
                        value: Some(*t),
                    })
                    .insert(Header {
                        key: "lockgate.partition",
                        value: Some(&part),
                    })
                    .insert(Header {
                        key: "lockgate.offset",
                        value: Some(&off),
                    }),
            );
        }
        p.send(r).unwrap();
    }
    p.flush(Duration::from_secs(30)).unwrap();
}

#[test]
fn origin_headers_drop_replays_keep_marks_and_treat_missing_headers_as_decode_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 1)]);
    let at = |i: usize, origin: Option<Origin<'static>>| (payload("orders", 0, i), origin);
    produce_with_origin(
        &kafka.bootstrap,
        "orders",
        &[
            at(0, Some(("raw", 0, 10))),
            at(1, Some(("raw", 0, 11))),
            at(2, Some(("raw", 0, 10))), // a replay of the upstream stage
            at(3, Some(("raw", 1, 10))), // another upstream partition has its own mark
            at(4, None),                 // not written by [sink.kafka]: a decode error
            at(5, Some(("raw", 0, 11))), // a replay again
            at(6, Some(("raw", 0, 12))),
        ],
    );
    write_job(
        tmp.path(),
        &kafka.bootstrap,
        1,
        "topics = [\"orders\"]",
        "bounded = \"latest\"\norigin_headers = true\non_decode_error = \"skip\"",
    );
    let (status, log) = run_job(tmp.path(), None, &[]);
    assert!(status.success(), "{log}");
    let got = committed_output(&tmp.path().join("out"));
    assert_eq!(got[&("orders".to_string(), 0)], vec![0, 1, 3, 6], "{log}");
    assert!(log.contains("no lockgate.topic header"), "{log}");
    assert!(log.contains("a replay of the upstream stage"), "{log}");
    // The marks are in the checkpoint, with the partition's position.
    let newest = std::fs::read_dir(tmp.path().join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("chk-") && !n.contains('.'))
        .max()
        .unwrap();
    let out = Command::new(bin())
        .args(["checkpoints", "inspect"])
        .arg(tmp.path().join("checkpoints").join(newest))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("applied from raw/0 up to offset 12"),
        "{text}"
    );
    assert!(
        text.contains("applied from raw/1 up to offset 10"),
        "{text}"
    );

    // Under `fail`, the record without headers fails the job, naming what is missing.
    write_job(
        &tmp.path().join("strict"),
        &kafka.bootstrap,
        1,
        "topics = [\"orders\"]",
        "bounded = \"latest\"\norigin_headers = true",
    );
    let (status, log) = run_job(&tmp.path().join("strict"), None, &[]);
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("record orders/0@4 cannot be decoded: no lockgate.topic header"),
        "{log}"
    );
}

#[test]
fn dead_letters_use_every_producer_property_of_the_source() {
    // `message.max.bytes` is neither a connection nor a security property: it reaches
    // the dead-letter producer only because the whole table applies to every client.
    // A 3000-byte dead letter under a 1000-byte limit fails the job, naming it.
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 1), ("orders-dlq", 1)]);
    let big = format!("{{not json {}", "x".repeat(3000));
    produce_raw(&kafka.bootstrap, "orders", 0, &[big.as_bytes()]);
    write_job(
        tmp.path(),
        &kafka.bootstrap,
        1,
        "topics = [\"orders\"]",
        "bounded = \"latest\"\non_decode_error = \"dead-letter:orders-dlq\"\n\
         [source.kafka.properties]\n\"message.max.bytes\" = \"1000\"",
    );
    let (status, log) = run_job(tmp.path(), None, &[]);
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("dead-letter to orders-dlq failed") && log.contains("too large"),
        "{log}"
    );
}

#[test]
fn a_table_of_consumer_and_producer_properties_serves_both_clients() {
    // Consumer-only (fetch.*) and producer-only (linger.ms, acks) properties in one
    // table: the consumer reads and the idempotent producer writes the dead letter (which
    // client gets which property is the unit table of `clients::kafka`).
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 1), ("orders-dlq", 1)]);
    let good0 = payload("orders", 0, 0);
    produce_raw(
        &kafka.bootstrap,
        "orders",
        0,
        &[good0.as_bytes(), b"{not json"],
    );
    write_job(
        tmp.path(),
        &kafka.bootstrap,
        1,
        "topics = [\"orders\"]",
        "bounded = \"latest\"\non_decode_error = \"dead-letter:orders-dlq\"\n\
         [source.kafka.properties]\n\"fetch.wait.max.ms\" = \"50\"\n\"fetch.max.bytes\" = \"1048576\"\n\
         \"linger.ms\" = \"1\"\n\"acks\" = \"all\"\n\"client.id\" = \"props-test\"",
    );
    let (status, log) = run_job(tmp.path(), None, &[]);
    assert!(status.success(), "{log}");
    let got = committed_output(&tmp.path().join("out"));
    assert_eq!(got[&("orders".to_string(), 0)], vec![0]);
    let (payload, h) = first_dead_letter(&kafka.bootstrap, "orders-dlq");
    assert_eq!(payload, b"{not json");
    assert_eq!(h["lockgate.offset"], "1");
}

#[test]
fn no_reachable_broker_fails_within_the_timeout_naming_the_servers() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let servers = format!("127.0.0.1:{port}");
    let tmp = tempfile::tempdir().unwrap();
    write_job(tmp.path(), &servers, 1, "topics = [\"orders\"]", "");
    let text = std::fs::read_to_string(tmp.path().join("job.toml"))
        .unwrap()
        .replace("connect_timeout_ms = 10000", "connect_timeout_ms = 2000")
        .replace(
            "strategy = \"fixed-delay\"\nattempts = 3\ndelay_ms = 100",
            "strategy = \"none\"",
        );
    std::fs::write(tmp.path().join("job.toml"), text).unwrap();
    let start = Instant::now();
    let (status, log) = run_job(tmp.path(), None, &[]);
    assert_eq!(status.code(), Some(1), "{log}");
    // It gives up after the configured timeout (the message names it) instead of
    // retrying forever; the bound only tells giving up from hanging.
    assert!(
        log.contains(&servers) && log.contains("no broker reachable within 2000 ms"),
        "{log}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn retriable_request_errors_lose_and_duplicate_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let mut kafka = KafkaProcess::start(&[("orders", 4)]);
    produce(&kafka.bootstrap, "orders", 4, 0, 10_000);
    write_job(
        tmp.path(),
        &kafka.bootstrap,
        2,
        "topics = [\"orders\"]",
        "bounded = \"latest\"",
    );
    // The first fetches of the job fail: the consumer must refresh and retry.
    kafka.control("errors fetch 30");
    // 20 000 records a subtask in batches of at most 1024, each taking 250 ms: the run
    // lasts 5 s or more after its first records.
    let (mut child, log_path) = spawn_job(tmp.path(), Some("source-batch=sleep(250)"), "errors");
    // More errors once both subtasks are reading, on fetches and on offset commits.
    wait::for_log_while_running(&mut child, &log_path, "first records emitted", 2, DEADLINE);
    kafka.control("errors fetch 30");
    kafka.control("errors offset-commit 5");
    assert!(
        wait::running(&mut child),
        "the errors were injected while the job was reading"
    );
    let status = wait_timeout(&mut child, DEADLINE);
    assert!(
        status.success(),
        "{}",
        std::fs::read_to_string(&log_path).unwrap()
    );
    assert_partitions_exact(&tmp.path().join("out"), "orders", 4, 0, 10_000);
}

#[test]
fn a_metadata_error_on_a_topic_never_resets_its_positions() {
    let tmp = tempfile::tempdir().unwrap();
    let mut kafka = KafkaProcess::start(&[("orders", 4)]);
    produce(&kafka.bootstrap, "orders", 4, 0, 15_000);
    write_job(
        tmp.path(),
        &kafka.bootstrap,
        2,
        "topic_pattern = \"orders\"",
        "bounded = \"latest\"",
    );
    // 30 000 records a subtask in batches of at most 1024, each taking 400 ms: the run
    // lasts 12 s or more after its first records.
    let (mut child, log_path) = spawn_job(tmp.path(), Some("source-batch=sleep(400)"), "hiccup");
    // Both subtasks have positions past their start when the error begins: a reset
    // would show. (A subtask still opening would list no partition at all.)
    wait::for_log_while_running(&mut child, &log_path, "first records emitted", 2, DEADLINE);
    kafka.control("topic-error orders");
    assert!(
        topic_metadata_error(&kafka.bootstrap, "orders").is_some(),
        "the cluster reports the topic with an error"
    );
    // Several discovery rounds (every 500 ms) see the topic only with an error.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        wait::running(&mut child),
        "the job was running through the discovery rounds that saw the error"
    );
    kafka.control("topic-error orders clear");
    let status = wait_timeout(&mut child, DEADLINE);
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(status.success(), "{log}");
    assert!(!log.contains("no longer exists"), "{log}");
    assert_partitions_exact(&tmp.path().join("out"), "orders", 4, 0, 15_000);
}

/// A bounded job that starts while its topic's metadata reports an error waits for the
/// partitions instead of reading the topic as empty (and exiting 0 with nothing read);
/// once the error clears it reads everything.
#[test]
fn a_bounded_job_started_during_a_metadata_error_waits_for_its_partitions() {
    let tmp = tempfile::tempdir().unwrap();
    let mut kafka = KafkaProcess::start(&[("orders", 4)]);
    produce(&kafka.bootstrap, "orders", 4, 0, 500);
    write_job(
        tmp.path(),
        &kafka.bootstrap,
        2,
        "topics = [\"orders\"]",
        "bounded = \"latest\"",
    );
    kafka.control("topic-error orders");
    assert!(topic_metadata_error(&kafka.bootstrap, "orders").is_some());
    let (mut child, log_path) = spawn_job(tmp.path(), None, "waits");
    wait::for_log_while_running(
        &mut child,
        &log_path,
        "bounded: waiting for the partitions",
        2,
        DEADLINE,
    );
    kafka.control("topic-error orders clear");
    let status = wait_timeout(&mut child, DEADLINE);
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(status.success(), "{log}");
    assert_partitions_exact(&tmp.path().join("out"), "orders", 4, 0, 500);
}

/// If the partitions stay unknown past `connect_timeout_ms`, the bounded job fails and
/// names the topic.
#[test]
fn a_bounded_job_whose_topic_stays_unknown_fails_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 2)]);
    write_job(
        tmp.path(),
        &kafka.bootstrap,
        1,
        "topics = [\"orders\", \"missing-topic\"]",
        "bounded = \"latest\"",
    );
    let job = tmp.path().join("job.toml");
    let text = std::fs::read_to_string(&job)
        .unwrap()
        .replace("connect_timeout_ms = 10000", "connect_timeout_ms = 1500")
        .replace(
            "strategy = \"fixed-delay\"\nattempts = 3\ndelay_ms = 100",
            "strategy = \"none\"",
        );
    assert!(text.contains("connect_timeout_ms = 1500") && text.contains("\"none\""));
    std::fs::write(&job, text).unwrap();
    let (status, log) = run_job(tmp.path(), None, &[]);
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("missing-topic") && log.contains("refusing to read it as empty"),
        "{log}"
    );
}

// --- The source's metrics, read in-process from its telemetry ---

mod metrics {
    use super::common::kafka::{payload, produce, watermarks};
    use lockgate::connectors::kafka::{KafkaSource, KafkaSourceConfig, TopicSelector};
    use lockgate::connectors::{Source, SourcePoll, SubtaskInfo};
    use lockgate::state::{CheckpointId, SourcePosition};
    use lockgate::telemetry::{PartitionView, Telemetry};
    use lockgate::testkit::kafka::EmbeddedKafka;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn info(telemetry: &Telemetry) -> SubtaskInfo {
        SubtaskInfo::new("job", "source-0", 0, 1).with_telemetry(telemetry.clone())
    }

    fn config(bootstrap: &str, statistics_ms: &str) -> KafkaSourceConfig {
        let pattern = lockgate::connectors::kafka::TopicPattern::new("orders.*").unwrap();
        let mut cfg = KafkaSourceConfig::new(bootstrap, TopicSelector::Pattern(pattern), "g");
        cfg.partition_discovery_ms = 200;
        cfg.properties
            .insert("statistics.interval.ms".into(), statistics_ms.into());
        cfg
    }

    fn counter(t: &Telemetry, f: fn(&lockgate::telemetry::metrics::Metrics) -> i64) -> i64 {
        f(t.metrics())
    }

    fn bytes_read(t: &Telemetry) -> i64 {
        counter(t, |m| {
            lockgate::connectors::kafka::metrics::KafkaMetrics::of(m)
                .bytes_read
                .with_label_values(&["job", "source", "0"])
                .get() as i64
        })
    }

    fn assigned(t: &Telemetry) -> i64 {
        counter(t, |m| {
            lockgate::connectors::kafka::metrics::KafkaMetrics::of(m)
                .partitions_assigned
                .with_label_values(&["job", "source", "0"])
                .get()
        })
    }

    fn discovered(t: &Telemetry) -> i64 {
        counter(t, |m| {
            lockgate::connectors::kafka::metrics::KafkaMetrics::of(m)
                .partitions_discovered
                .with_label_values(&["job", "source", "0"])
                .get() as i64
        })
    }

    fn restored(t: &Telemetry) -> i64 {
        counter(t, |m| {
            lockgate::connectors::kafka::metrics::KafkaMetrics::of(m)
                .partitions_restored
                .with_label_values(&["job", "source", "0"])
                .get()
        })
    }

    /// Key and value bytes of what `produce` writes to each partition of `topic`.
    fn produced_bytes(topic: &str, partitions: i32, count: usize) -> i64 {
        let mut n = 0;
        for p in 0..partitions {
            for i in 0..count {
                n += format!("k{i}").len() + payload(topic, p, i).len();
            }
        }
        n as i64
    }

    /// Polls until `n` records in all were read (or fails after a minute).
    async fn read(source: &mut KafkaSource, n: usize) -> SourcePoll {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut got = 0;
        loop {
            let mut out = Vec::new();
            let r = source.poll(&mut out).await.unwrap();
            got += out.len();
            if got >= n || r == SourcePoll::Finished {
                assert_eq!(got, n);
                return r;
            }
            assert!(Instant::now() < deadline, "read {got} of {n} records");
        }
    }

    /// Polls the source until `done` holds of its partitions (or fails after a minute).
    async fn until(
        source: &mut KafkaSource,
        t: &Telemetry,
        what: &str,
        done: impl Fn(&[PartitionView]) -> bool,
    ) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done(&t.partitions()) {
            assert!(Instant::now() < deadline, "{what}: {:?}", t.partitions());
            let mut out = Vec::new();
            source.poll(&mut out).await.unwrap();
            assert!(out.is_empty(), "no record left to read");
        }
    }

    fn assert_at_end(bootstrap: &str, views: &[PartitionView]) {
        for v in views {
            let (_, high) = watermarks(bootstrap, &v.topic, v.partition).unwrap();
            assert_eq!(v.position, Some(high), "{v:?}");
            assert_eq!(v.end, Some(high), "{v:?}");
            assert_eq!(v.lag, Some(0), "{v:?}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bytes_positions_lag_to_zero_assigned_discovered_and_restored() {
        let kafka = EmbeddedKafka::start(3, &[("orders-a".into(), 3)]).unwrap();
        let bootstrap = kafka.bootstrap_servers().to_string();
        produce(&bootstrap, "orders-a", 3, 0, 400);
        let cfg = Arc::new(config(&bootstrap, "200"));
        let t = Telemetry::default();
        let mut source = KafkaSource::new(cfg.clone());
        source.open(&info(&t), None).await.unwrap();
        assert_eq!(assigned(&t), 3);
        assert_eq!(restored(&t), 0);
        // Positions are known from the assignment on.
        assert!(t.partitions().iter().all(|v| v.position == Some(0)));

        read(&mut source, 1200).await;
        assert_eq!(bytes_read(&t), produced_bytes("orders-a", 3, 400));
        // The ends come from librdkafka's statistics: the lag of every partition falls
        // to 0 within an interval or two of reading the last record.
        until(&mut source, &t, "lag 0 everywhere", |v| {
            v.len() == 3 && v.iter().all(|p| p.lag == Some(0))
        })
        .await;
        assert_at_end(&bootstrap, &t.partitions());
        let text = t.scrape();
        for p in 0..3 {
            let line = format!(
                r#"lockgate_kafka_partition_lag{{job="job",operator="source",partition="{p}",subtask="0",topic="orders-a"}} 0"#
            );
            assert!(text.contains(&line), "{line} in\n{text}");
        }

        // A topic that appears while running is discovered and read from EARLIEST.
        kafka.create_topic("orders-b", 2).unwrap();
        produce(&bootstrap, "orders-b", 2, 0, 50);
        read(&mut source, 100).await;
        assert_eq!(discovered(&t), 2);
        assert_eq!(assigned(&t), 5);
        assert_eq!(
            bytes_read(&t),
            produced_bytes("orders-a", 3, 400) + produced_bytes("orders-b", 2, 50)
        );
        until(&mut source, &t, "lag 0 everywhere", |v| {
            v.len() == 5 && v.iter().all(|p| p.lag == Some(0))
        })
        .await;
        assert_at_end(&bootstrap, &t.partitions());
        let checkpoint: Vec<SourcePosition> = source.snapshot(CheckpointId(1)).unwrap();
        source.close().await.unwrap();
        drop(source);

        // Restored from the checkpoint, with a third topic new since it: the five
        // partitions it holds are restored, the new one is not. Reading uncommitted,
        // the ends are the high watermarks (the mock cluster fills both offsets).
        kafka.create_topic("orders-c", 1).unwrap();
        produce(&bootstrap, "orders-c", 1, 0, 10);
        let t = Telemetry::default();
        let mut cfg = (*cfg).clone();
        cfg.properties
            .insert("isolation.level".into(), "read_uncommitted".into());
        // No discovery: its last metadata request would outlive the cluster.
        cfg.partition_discovery_ms = 0;
        let mut source = KafkaSource::new(Arc::new(cfg));
        source.open(&info(&t), Some(&checkpoint)).await.unwrap();
        assert_eq!(assigned(&t), 6);
        assert_eq!(restored(&t), 5);
        assert_eq!(discovered(&t), 0, "found at open, not by discovery");
        for p in &checkpoint {
            let v = t
                .partitions()
                .into_iter()
                .find(|v| v.topic == p.stream && v.partition == p.partition)
                .unwrap();
            assert_eq!(v.position, Some(p.next.0), "{v:?}");
        }
        read(&mut source, 10).await;
        assert_eq!(bytes_read(&t), produced_bytes("orders-c", 1, 10));
        until(&mut source, &t, "lag 0 everywhere", |v| {
            v.len() == 6 && v.iter().all(|p| p.lag == Some(0))
        })
        .await;
        assert_at_end(&bootstrap, &t.partitions());
        source.close().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_bounded_source_takes_its_ends_from_its_bounds() {
        let kafka = EmbeddedKafka::start(1, &[("orders-a".into(), 2)]).unwrap();
        let bootstrap = kafka.bootstrap_servers().to_string();
        produce(&bootstrap, "orders-a", 2, 0, 30);
        // Statistics off: the ends can only come from the bounds.
        let mut cfg = config(&bootstrap, "0");
        cfg.bounded = true;
        cfg.partition_discovery_ms = 0;
        let t = Telemetry::default();
        let mut source = KafkaSource::new(Arc::new(cfg));
        source.open(&info(&t), None).await.unwrap();
        let views = t.partitions();
        assert_eq!(views.len(), 2);
        assert!(views.iter().all(|v| v.end == Some(30) && v.lag == Some(30)));
        // Records produced after the start are beyond the bounds.
        produce(&bootstrap, "orders-a", 2, 30, 5);
        let mut r = read(&mut source, 60).await;
        while r != SourcePoll::Finished {
            let mut out = Vec::new();
            r = source.poll(&mut out).await.unwrap();
            assert!(out.is_empty(), "nothing beyond the bounds");
        }
        assert_eq!(bytes_read(&t), produced_bytes("orders-a", 2, 30));
        for v in t.partitions() {
            assert_eq!((v.position, v.end, v.lag), (Some(30), Some(30), Some(0)));
        }
        source.close().await.unwrap();
    }
}
