//! The job of `lockgate demo` (Kafka -> rolling_sum by user -> Elasticsearch upsert by
//! user) run as users run it: `lockgate run` in its own process, against the embedded
//! Kafka and the Elasticsearch test server in processes of their own.

use super::{median, round3, run_job, JobRun, Server};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Users of the sample orders (`lockgate testkit kafka --orders`).
const USERS: u64 = 1000;

/// Writes the orders job (parallelism 2) into `dir`; `interval_ms` 0 turns periodic
/// checkpoints off (the final one is still taken).
pub fn orders_job(dir: &Path, bootstrap: &str, es: &str, index: &str, interval_ms: u64) -> PathBuf {
    std::fs::create_dir_all(dir).expect("job dir");
    let path = dir.join("job.toml");
    let text = format!(
        r#"[job]
name = "orders-to-es"
parallelism = 2

[checkpoint]
dir = "{chk}"
interval_ms = {interval_ms}

[restart]
strategy = "none"

[source.kafka]
bootstrap_servers = "{bootstrap}"
topic_pattern = "orders.*"
group_id = "orders-to-es"
startup = "earliest"
bounded = "latest"

[[transform]]
type = "rolling_sum"
key = "/user"
field = "/amount"
output = "/total"

[sink.elasticsearch]
url = "{es}"
index = "{index}"
id = "field:/user"
operation = "upsert"
"#,
        chk = dir.join("checkpoints").display()
    );
    std::fs::write(&path, text).expect("write the job file");
    path
}

/// Each user's total over the first `orders` sample orders (the generator's formula).
fn expected_totals(orders: u64) -> BTreeMap<String, i64> {
    let mut totals = BTreeMap::new();
    for i in 0..orders {
        let user = format!("user-{:04}", (i * 7919) % USERS);
        *totals.entry(user).or_insert(0) += (1 + (i * 31) % 500) as i64;
    }
    totals
}

/// Checks that `index` holds exactly one document per user with the exact total.
fn verify(es: &str, index: &str, expected: &BTreeMap<String, i64>) {
    let ids: Vec<&String> = expected.keys().collect();
    let body = serde_json::json!({ "ids": ids });
    let r: serde_json::Value = reqwest::blocking::Client::new()
        .post(format!("{es}/{index}/_mget"))
        .json(&body)
        .send()
        .and_then(|r| r.json())
        .expect("_mget");
    let docs = r["docs"].as_array().expect("docs");
    assert_eq!(docs.len(), expected.len());
    for (d, (user, total)) in docs.iter().zip(expected) {
        assert_eq!(
            d["_source"]["total"].as_i64(),
            Some(*total),
            "{index}/{user}: {d}"
        );
    }
}

/// Runs the job once into a fresh index and checkpoint directory; verifies the index.
fn once(
    work: &Path,
    kafka: &Server,
    es: &Server,
    run: usize,
    interval_ms: u64,
    expected: &BTreeMap<String, i64>,
) -> JobRun {
    let index = format!("user-totals-{run}");
    let dir = work.join(format!("run-{run}"));
    let job = orders_job(&dir, &kafka.address, &es.address, &index, interval_ms);
    let r = run_job(&job);
    verify(&es.address, &index, expected);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

/// Throughput of the orders job with a checkpoint every second against checkpointing off,
/// alternating, median of `rounds`; every run's index is verified exactly.
pub fn checkpoint_overhead(orders: u64, partitions: i32, rounds: usize) -> serde_json::Value {
    let kafka = Server::kafka("orders", partitions, orders);
    let es = Server::elasticsearch();
    let work = tempfile::tempdir().expect("tempdir");
    let expected = expected_totals(orders);
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let a = once(work.path(), &kafka, &es, 2 * round, 0, &expected);
        let b = once(work.path(), &kafka, &es, 2 * round + 1, 1000, &expected);
        let (ra, rb) = (orders as f64 / a.secs, orders as f64 / b.secs);
        eprintln!(
            "end to end, round {round}: checkpoints off {ra:.0} rec/s, every 1 s {rb:.0} rec/s"
        );
        off.push(ra);
        on.push(rb);
    }
    let (off, on) = (median(off), median(on));
    serde_json::json!({
        "job": "Kafka -> rolling_sum by user -> Elasticsearch upsert, parallelism 2, separate processes",
        "records": orders,
        "partitions": partitions,
        "users": USERS,
        "rounds": rounds,
        "records_per_sec_checkpoints_off": off.round(),
        "records_per_sec_checkpoint_every_1s": on.round(),
        "ratio_on_over_off": round3(on / off),
    })
}

/// Peak resident memory of the demo's job (1 s checkpoints), `runs` times over `small`
/// orders and `runs` times over `large`, alternating; every run's index is verified
/// exactly. The ratio of the largest peaks says whether memory grows with the backlog.
pub fn demo_memory(small: u64, large: u64, runs: usize) -> serde_json::Value {
    let work = tempfile::tempdir().expect("tempdir");
    let servers = |orders| {
        (
            Server::kafka("orders", 4, orders),
            Server::elasticsearch(),
            expected_totals(orders),
        )
    };
    let (small_servers, large_servers) = (servers(small), servers(large));
    let (mut peaks_small, mut peaks_large) = (Vec::new(), Vec::new());
    let mut secs = Vec::new();
    let mut spawner = 0u64;
    for run in 0..runs {
        for (orders, (kafka, es, expected), peaks) in [
            (small, &small_servers, &mut peaks_small),
            (large, &large_servers, &mut peaks_large),
        ] {
            let r = once(work.path(), kafka, es, run, 1000, expected);
            eprintln!(
                "demo job, {orders} orders, run {run}: {:.2} s, peak RSS {:.1} MiB",
                r.secs,
                r.peak_rss_bytes as f64 / 1048576.0
            );
            assert!(
                r.spawner_rss_bytes < r.peak_rss_bytes / 2,
                "this process ({} bytes) is too large to measure the job's peak ({} bytes): \
                 run the memory measurement first",
                r.spawner_rss_bytes,
                r.peak_rss_bytes
            );
            spawner = spawner.max(r.spawner_rss_bytes);
            peaks.push(r.peak_rss_bytes as f64);
            if orders == large {
                secs.push(r.secs);
            }
        }
    }
    let mib = |b: f64| (b / 1048576.0 * 10.0).round() / 10.0;
    let max = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
    serde_json::json!({
        "job": "the demo's job: Kafka (4 partitions) -> rolling_sum by user -> Elasticsearch upsert, parallelism 2, 1 s checkpoints",
        "records": large,
        "runs": runs,
        "peak_rss_mib_median": mib(median(peaks_large.clone())),
        "peak_rss_mib_max": mib(max(&peaks_large)),
        "small_records": small,
        "small_peak_rss_mib_max": mib(max(&peaks_small)),
        "ratio_large_over_small": round3(max(&peaks_large) / max(&peaks_small)),
        "seconds_median": (median(secs) * 100.0).round() / 100.0,
        "spawner_rss_mib": mib(spawner as f64),
    })
}

/// Runs `count` members of `config` (`lockgate run --member I --members N`) at once and
/// waits for all; returns the seconds from the first spawn to the last exit.
fn run_members(config: &Path, count: u16) -> f64 {
    let start = std::time::Instant::now();
    let children: Vec<(std::process::Child, PathBuf)> = (0..count)
        .map(|i| {
            let log = config.with_extension(format!("member-{i}.log"));
            let mut cmd = std::process::Command::new(super::bin());
            cmd.args(["run", "--config"]).arg(config);
            if count > 1 {
                cmd.args(["--member", &i.to_string(), "--members", &count.to_string()]);
            }
            let child = cmd
                .env("LOCKGATE_LOG", "info")
                .env_remove("LOCKGATE_FAILPOINTS")
                .stdout(std::process::Stdio::null())
                .stderr(std::fs::File::create(&log).expect("log file"))
                .spawn()
                .expect("spawn lockgate run");
            (child, log)
        })
        .collect();
    for (child, log) in children {
        let (status, _) = super::wait4(child);
        if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("{} ended with status {status}:\n{text}", log.display());
        }
    }
    start.elapsed().as_secs_f64()
}

/// Throughput of the orders job run as each of `counts` members (parallelism 1 per
/// member, `co_partitioned`, 1 s checkpoints), from the first member's spawn to the last
/// one's exit; member counts alternate within each round, median of `rounds`; every
/// run's index is verified exactly. All members share this machine's cores.
pub fn members_throughput(
    orders: u64,
    partitions: i32,
    rounds: usize,
    counts: &[u16],
) -> serde_json::Value {
    let kafka = Server::kafka("orders", partitions, orders);
    let es = Server::elasticsearch();
    let work = tempfile::tempdir().expect("tempdir");
    let expected = expected_totals(orders);
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); counts.len()];
    let mut run = 0;
    for round in 0..rounds {
        for (k, &count) in counts.iter().enumerate() {
            let index = format!("members-{run}");
            let dir = work.path().join(format!("run-{run}"));
            let job = orders_job(&dir, &kafka.address, &es.address, &index, 1000);
            // co_partitioned reads one topic.
            let text = std::fs::read_to_string(&job)
                .expect("job file")
                .replace(
                    "parallelism = 2\n",
                    "parallelism = 1\nco_partitioned = true\n",
                )
                .replace("topic_pattern = \"orders.*\"", "topics = [\"orders\"]");
            std::fs::write(&job, text).expect("job file");
            let secs = run_members(&job, count);
            verify(&es.address, &index, &expected);
            let _ = std::fs::remove_dir_all(&dir);
            let rate = orders as f64 / secs;
            eprintln!("members, round {round}: {count} member(s): {rate:.0} rec/s ({secs:.2} s)");
            rates[k].push(rate);
            run += 1;
        }
    }
    let medians: Vec<f64> = rates.into_iter().map(median).collect();
    let rows: Vec<serde_json::Value> = counts
        .iter()
        .zip(&medians)
        .map(|(c, r)| {
            serde_json::json!({
                "members": c,
                "records_per_sec": r.round(),
                "ratio_to_one_member": round3(r / medians[0]),
            })
        })
        .collect();
    serde_json::json!({
        "job": "Kafka -> rolling_sum by user -> Elasticsearch upsert; each member a `lockgate run` process at parallelism 1, co_partitioned, 1 s checkpoints; all members, Kafka and the test server share this machine's cores",
        "records": orders,
        "partitions": partitions,
        "rounds": rounds,
        "by_members": rows,
    })
}
