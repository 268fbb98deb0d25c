//! Watching a running job: the real binary runs Kafka -> rolling_sum -> Elasticsearch
//! with `[metrics] listen`, and the test reads it from outside as Prometheus and a
//! Kubernetes probe would: `/metrics` through an independent text-format parser,
//! `/readyz`, `/healthz` and the REST API over HTTP.

mod common;

use common::es::EsProcess;
use common::kafka::KafkaProcess;
use common::telemetry::{get, get_json, url_from_log, Scrape};
use common::wait::{self, DEADLINE};
use common::{bin, tail, wait_timeout};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const PARTITIONS: i32 = 4;

/// The job's process, killed when a test fails half-way.
struct Kill(Child);

impl std::ops::Deref for Kill {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Kill {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(dir: &Path, env: &[(&str, &str)]) -> Kill {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("run.log"))
        .unwrap();
    Kill(
        Command::new(bin())
            .args(["run", "--config"])
            .arg(dir.join("job.toml"))
            .env("LOCKGATE_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

fn log(dir: &Path) -> String {
    tail(
        &std::fs::read_to_string(dir.join("run.log")).unwrap_or_default(),
        40,
    )
}

/// The orders job of the demo, unbounded, serving its telemetry on a free port.
fn write_orders_job(dir: &Path, bootstrap: &str, es: &str, interval_ms: u64) {
    let text = format!(
        r#"[job]
name = "orders-watched"
parallelism = 2

[checkpoint]
dir = "checkpoints"
interval_ms = {interval_ms}

[restart]
strategy = "none"

[source.kafka]
bootstrap_servers = "{bootstrap}"
topics = ["orders"]
group_id = "orders-watched"
connect_timeout_ms = 10000

[[transform]]
type = "rolling_sum"
key = "/user"
field = "/amount"
output = "/total"

[sink.elasticsearch]
url = "{es}"
index = "user-totals"
id = "field:/user"
operation = "upsert"
# Only a checkpoint sends what the sink holds: pending then falls to 0 at checkpoints
# and nowhere else.
bulk_flush_interval_ms = 600000
bulk_max_actions = 1000000

[metrics]
listen = "127.0.0.1:0"
"#
    );
    std::fs::write(dir.join("job.toml"), text).unwrap();
}

fn produce(bootstrap: &str, from: u64, count: u64) {
    lockgate::testkit::kafka::produce_orders(bootstrap, "orders", from, count, 100).unwrap();
}

/// Scrapes until `cond` holds for a scrape (the job keeps running meanwhile).
fn scrape_until(
    child: &mut Child,
    dir: &Path,
    base: &str,
    what: &str,
    mut cond: impl FnMut(&Scrape) -> bool,
) -> Scrape {
    let mut last = None;
    wait::while_running(child, &dir.join("run.log"), what, DEADLINE, || {
        let s = Scrape::take(base);
        let ok = cond(&s);
        last = Some(s);
        ok
    });
    last.unwrap()
}

fn completed(s: &Scrape) -> f64 {
    s.one(
        "lockgate_checkpoints_total",
        &[("job", "orders-watched"), ("status", "completed")],
    )
}

/// Records read so far, the rolling sum's input, and the sink's input.
fn records(s: &Scrape) -> (f64, f64, f64) {
    let rolling_in: f64 = s
        .series("lockgate_records_in_total", &[])
        .iter()
        .filter(|(labels, _)| labels.contains("operator=rolling_sum"))
        .map(|(_, v)| v)
        .sum();
    (
        s.sum("lockgate_records_out_total", &[("operator", "source")]),
        rolling_in,
        s.sum("lockgate_records_in_total", &[("operator", "sink")]),
    )
}

#[test]
fn metrics_follow_a_running_job_through_bursts_of_input() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let kafka = KafkaProcess::start(&[("orders", PARTITIONS)]);
    let es = EsProcess::start(&dir.join("es"), false, &[], None);
    write_orders_job(dir, &kafka.bootstrap, &es.url, 300);
    produce(&kafka.bootstrap, 0, 2_000);
    let mut child = spawn(dir, &[]);
    let base = url_from_log(&dir.join("run.log"));
    assert_eq!(get(&base, "/healthz").map(|r| r.0), Some(200));

    let mut produced = 2_000.0;
    // The most the pending gauge showed: it must have moved for its 0 to mean anything.
    let mut most_pending = 0.0f64;
    // The most each stage of `lockgate_buffered_bytes` showed.
    let mut most_buffered: BTreeMap<String, f64> = BTreeMap::new();
    let mut note_buffered = |s: &Scrape| {
        for stage in ["source", "exchange", "sink"] {
            let b = s.sum("lockgate_buffered_bytes", &[("stage", stage)]);
            let most = most_buffered.entry(stage.to_string()).or_default();
            *most = most.max(b);
        }
    };
    let mut checkpoints_seen = Vec::new();
    for burst in 0..3u64 {
        if burst > 0 {
            produce(&kafka.bootstrap, 2_000 + (burst - 1) * 1_500, 1_500);
            produced += 1_500.0;
        }
        // Everything produced so far is read, through the rolling sum, into the sink,
        // and every partition's lag is 0.
        let drained = scrape_until(&mut child, dir, &base, "the burst drained", |s| {
            most_pending = most_pending.max(s.sum("lockgate_sink_pending_actions", &[]));
            note_buffered(s);
            let lags = s.series("lockgate_kafka_partition_lag", &[]);
            records(s) == (produced, produced, produced)
                && lags.len() == PARTITIONS as usize
                && lags.values().all(|l| *l == 0.0)
        });
        for (labels, end) in drained.series("lockgate_kafka_partition_end_offset", &[]) {
            let pos = drained.series("lockgate_kafka_partition_position", &[]);
            assert_eq!(pos.get(&labels), Some(&end), "position = end of {labels}");
        }
        // The next checkpoint after that flushes the sink: pending is 0 once it is
        // published, and the checkpoint counter grew.
        let before = completed(&drained);
        let after = scrape_until(
            &mut child,
            dir,
            &base,
            "a checkpoint after the burst",
            |s| {
                most_pending = most_pending.max(s.sum("lockgate_sink_pending_actions", &[]));
                note_buffered(s);
                completed(s) >= before + 1.0
            },
        );
        // Drained and flushed: nothing waits anywhere.
        for stage in ["source", "exchange", "sink"] {
            let b = after.series("lockgate_buffered_bytes", &[("stage", stage)]);
            assert_eq!(b.len(), 1, "one series per stage: {b:?}");
            assert!(
                b.values().all(|v| *v == 0.0),
                "{stage} holds bytes after the burst drained and a checkpoint flushed: {b:?}"
            );
        }
        let pending = after.series("lockgate_sink_pending_actions", &[]);
        assert_eq!(pending.len(), 2, "one series per sink subtask: {pending:?}");
        assert!(
            pending.values().all(|p| *p == 0.0),
            "pending after checkpoint {}: {pending:?}\n{}",
            after.one("lockgate_checkpoint_last_completed_id", &[]),
            log(dir)
        );
        checkpoints_seen.push(completed(&after));
    }
    assert!(
        most_pending > 0.0,
        "the pending gauge never showed the actions the sink held between checkpoints"
    );
    // The sink's bytes moved with its actions, and stayed within both subtasks'
    // `buffer_max_bytes` (the default) plus one batch (under 1 MiB) each.
    let sink_most = most_buffered["sink"];
    let bound = lockgate::connectors::elasticsearch::config::BUFFER_MAX_BYTES + (1 << 20);
    assert!(
        sink_most > 0.0 && sink_most <= 2.0 * bound as f64,
        "{most_buffered:?}"
    );
    assert!(
        checkpoints_seen.windows(2).all(|w| w[1] > w[0]),
        "completed checkpoints grow between scrapes: {checkpoints_seen:?}"
    );

    // What the REST API and the probes say agrees with the metrics.
    let last = Scrape::take(&base);
    let last_id = last.one("lockgate_checkpoint_last_completed_id", &[]) as u64;
    let history = get_json(&base, "/api/v1/checkpoints");
    let completed_ids: Vec<u64> = history["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "completed")
        .map(|c| c["id"].as_u64().unwrap())
        .collect();
    assert!(
        completed_ids.iter().any(|id| *id >= last_id),
        "{last_id} in {history}"
    );
    let job = get_json(&base, "/api/v1/job");
    assert_eq!(job["name"], "orders-watched");
    assert_eq!(job["state"], "running");
    assert_eq!(job["parallelism"], 2);
    let stages: Vec<&String> = job["buffered_bytes"].as_object().unwrap().keys().collect();
    assert_eq!(stages, ["exchange", "sink", "source"], "{job}");
    let partitions = get_json(&base, "/api/v1/partitions");
    assert_eq!(partitions.as_array().unwrap().len(), PARTITIONS as usize);
    assert_eq!(get(&base, "/readyz").map(|r| r.0), Some(200));
    assert!(
        last.one("process_resident_memory_bytes", &[]) > 0.0,
        "the process collector is registered"
    );
    assert!(
        last.one("lockgate_checkpoint_duration_seconds_count", &[]) >= 3.0,
        "{}",
        last.text
    );

    // SIGTERM: a final checkpoint, exit 0.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = wait_timeout(&mut child, DEADLINE);
    assert!(status.success(), "{status}\n{}", log(dir));
}

#[test]
fn readyz_is_not_ready_until_the_first_checkpoint_completes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let kafka = KafkaProcess::start(&[("orders", PARTITIONS)]);
    let es = EsProcess::start(&dir.join("es"), false, &[], None);
    // The first checkpoint comes 8 s after the start: the listener is up long before,
    // even on a busy machine (and the test fails, rather than pass, if it was not).
    write_orders_job(dir, &kafka.bootstrap, &es.url, 8_000);
    produce(&kafka.bootstrap, 0, 100);
    let mut child = spawn(dir, &[]);
    let base = url_from_log(&dir.join("run.log"));
    let (status, body) = get(&base, "/readyz").expect("the listener answers");
    let checkpoints_logged = wait::count(&dir.join("run.log"), "checkpoint completed");
    assert_eq!(
        checkpoints_logged,
        0,
        "the first checkpoint completed before the first probe: the test proves nothing\n{}",
        log(dir)
    );
    assert_eq!(status, 503, "{body}");
    assert!(body.starts_with("not ready: "), "{body}");
    assert_eq!(get(&base, "/healthz").map(|r| r.0), Some(200));
    wait::while_running(
        &mut child,
        &dir.join("run.log"),
        "/readyz to answer 200",
        DEADLINE,
        || get(&base, "/readyz").is_some_and(|r| r.0 == 200),
    );
    // Ready only after a checkpoint (its log line follows the status update).
    wait::for_log(&dir.join("run.log"), "checkpoint completed", DEADLINE);
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(wait_timeout(&mut child, DEADLINE).success(), "{}", log(dir));
}

/// Without periodic checkpoints (`interval_ms = 0`) the only checkpoint is the final
/// one: a running job is ready once it runs (before, it never was, and a rolling update
/// waiting on it stalled).
#[test]
fn readyz_without_periodic_checkpoints_is_ready_once_running() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let kafka = KafkaProcess::start(&[("orders", PARTITIONS)]);
    let es = EsProcess::start(&dir.join("es"), false, &[], None);
    // Running, but its source cannot reach Kafka (it tries for 10 s): not ready.
    let unreachable = dir.join("unreachable");
    std::fs::create_dir_all(&unreachable).unwrap();
    write_orders_job(&unreachable, "127.0.0.1:1", &es.url, 0);
    let child = spawn(&unreachable, &[]);
    let base = url_from_log(&unreachable.join("run.log"));
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        let (status, body) = get(&base, "/readyz").expect("the listener answers");
        assert_eq!(status, 503, "{body}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, body) = get(&base, "/readyz").unwrap();
    assert!(body.contains("opening tasks"), "{body}");
    drop(child);
    write_orders_job(dir, &kafka.bootstrap, &es.url, 0);
    produce(&kafka.bootstrap, 0, 100);
    let mut child = spawn(dir, &[]);
    let base = url_from_log(&dir.join("run.log"));
    wait::while_running(
        &mut child,
        &dir.join("run.log"),
        "/readyz to answer 200",
        DEADLINE,
        || get(&base, "/readyz").is_some_and(|r| r.0 == 200),
    );
    assert_eq!(
        wait::count(&dir.join("run.log"), "checkpoint completed"),
        0,
        "ready without a checkpoint: {}",
        log(dir)
    );
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(wait_timeout(&mut child, DEADLINE).success(), "{}", log(dir));
    assert_eq!(
        wait::count(&dir.join("run.log"), "checkpoint completed"),
        1,
        "SIGTERM's final checkpoint: {}",
        log(dir)
    );
}

/// A sequence -> file job whose log goes to `stderr` in the given format.
fn run_sequence_job(dir: &Path, format: &str) -> (Option<i32>, String) {
    std::fs::write(
        dir.join("job.toml"),
        "[job]\nname = \"json-logs\"\n[checkpoint]\ndir = \"c\"\ninterval_ms = 100\n\
         [source.sequence]\nfrom = 1\nto = 2000\nkeys = 10\nrate_per_sec = 10000\n\
         [sink.file]\ndir = \"out\"\n",
    )
    .unwrap();
    let out = Command::new(bin())
        .args(["run", "--config"])
        .arg(dir.join("job.toml"))
        .env("LOCKGATE_LOG", "info")
        .env("LOCKGATE_LOG_FORMAT", format)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn json_logs_are_one_object_per_line_with_the_task_fields() {
    let tmp = tempfile::tempdir().unwrap();
    let (code, stderr) = run_sequence_job(tmp.path(), "json");
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(lines
        .iter()
        .all(|l| l["level"].is_string() && l["timestamp"].is_string() && l["message"].is_string()));
    let completed = lines
        .iter()
        .find(|l| l["message"] == "checkpoint completed")
        .expect("a checkpoint completed line");
    assert!(completed["checkpoint"].is_string() || completed["checkpoint"].is_number());
    assert!(completed["duration_ms"].is_number(), "{completed}");
    let task_line = lines
        .iter()
        .find(|l| l["span"]["task"].is_string())
        .expect("a line logged inside a task");
    assert_eq!(task_line["span"]["job"], "json-logs", "{task_line}");

    let (code, stderr) = run_sequence_job(tmp.path(), "xml");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("LOCKGATE_LOG_FORMAT"), "{stderr}");
}

#[test]
fn a_listener_that_cannot_bind_is_a_configuration_error() {
    let tmp = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    std::fs::write(
        tmp.path().join("job.toml"),
        format!(
            "[job]\nname = \"j\"\n[checkpoint]\ndir = \"c\"\n\
             [source.sequence]\nfrom = 1\nto = 10\nkeys = 1\n[sink.file]\ndir = \"out\"\n\
             [metrics]\nlisten = \"{addr}\"\n"
        ),
    )
    .unwrap();
    let (code, stderr) = common::run_config(&tmp.path().join("job.toml"));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("job.toml: metrics.listen: cannot listen on"),
        "{stderr}"
    );
    drop(taken);
}
