//! `lockgate demo`: with nothing installed, starts an embedded Kafka (3 brokers, a topic
//! of 4 partitions) and the Elasticsearch test server, produces 100,000 JSON orders keyed
//! by user, and runs `Kafka -> rolling_sum by user -> Elasticsearch upsert by user` as a
//! child process with checkpoints every 500 ms. It kills the job twice with SIGKILL,
//! creates a second topic that the job's `topic_pattern` matches after the first kill
//! (its records are read from EARLIEST on restore), lets the job finish, and verifies
//! that every user's document holds the exact sum of that user's orders.

use super::EXIT_FAILURE;
use crate::chaos::{self, ChaosOptions};
use crate::testkit::es::EsServer;
use crate::testkit::kafka::EmbeddedKafka;
use std::path::PathBuf;

const ORDERS: u64 = 100_000;
const LATE_ORDERS: u64 = 10_000;
const USERS: u64 = 1_000;

fn produce(bootstrap: &str, topic: &str, from: u64, count: u64) -> Result<(), String> {
    crate::testkit::kafka::produce_orders(bootstrap, topic, from, count, USERS)
}

/// The port of the job's status page and metrics: Prometheus' customary 9464 when it
/// is free, another free one otherwise. The job binds it again at every restart, so the
/// URL stays the same through the kills.
fn metrics_port() -> u16 {
    let bind = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port));
    bind(9464)
        .or_else(|_| bind(0))
        .and_then(|l| l.local_addr())
        .map_or(9464, |a| a.port())
}

fn job_file(dir: &std::path::Path, bootstrap: &str, es: &str, metrics_port: u16) -> String {
    format!(
        r#"[job]
name = "orders-to-es"
parallelism = 2

[checkpoint]
dir = "{chk}"
interval_ms = 500

[restart]
strategy = "none"

[source.kafka]
bootstrap_servers = "{bootstrap}"
topic_pattern = "orders-.*"
group_id = "orders-to-es"
bounded = "latest"
partition_discovery_ms = 500

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
bulk_flush_interval_ms = 200

[metrics]
listen = "127.0.0.1:{metrics_port}"
"#,
        chk = dir.join("checkpoints").display()
    )
}

/// Runs the demo; returns the exit code.
pub fn demo(dir: Option<PathBuf>) -> i32 {
    match run(dir) {
        Ok(true) => 0,
        Ok(false) => EXIT_FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_FAILURE
        }
    }
}

fn run(dir: Option<PathBuf>) -> Result<bool, String> {
    let dir = dir.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("lockgate-demo-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    super::heap_trim::start();
    println!("lockgate demo: Kafka -> rolling_sum by user -> Elasticsearch (upsert by user)");
    let kafka = EmbeddedKafka::start(3, &[("orders-a".into(), 4)])?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let es = rt
        .block_on(EsServer::start("127.0.0.1:0".parse().expect("address")))
        .map_err(|e| format!("Elasticsearch test server: {e}"))?;
    println!(
        "  embedded Kafka:     {} (topic orders-a, 4 partitions)",
        kafka.bootstrap_servers()
    );
    println!("  Elasticsearch API:  {}", es.url());
    println!("  producing {ORDERS} orders of {USERS} users ...");
    produce(kafka.bootstrap_servers(), "orders-a", 0, ORDERS)?;
    let config = dir.join("job.toml");
    let port = metrics_port();
    std::fs::write(
        &config,
        job_file(&dir, kafka.bootstrap_servers(), es.url(), port),
    )
    .map_err(|e| e.to_string())?;
    println!("  job file: {}", config.display());
    println!(
        "  status page:        http://127.0.0.1:{port}/ (while the job runs; metrics: /metrics)"
    );
    println!(
        "  running the job; it is killed twice with SIGKILL and restarted with the same command"
    );
    let opts = ChaosOptions {
        config: config.clone(),
        kills: 2,
        seed: 2026,
        // Slows the job down so that the kills land mid-run.
        failpoints: Some("source-batch=sleep(40)".into()),
        failpoint_runs: None,
        kill_after_ms: (900, 1500),
        corrupt_latest: false,
        es_faults: false,
        max_runs: 20,
        log: dir.join("job.log"),
        progress: true,
        members: 1,
        upstream: None,
    };
    let mut created = Ok(());
    let report = chaos::run(&opts, |kill| {
        if kill == 1 {
            // A topic that appears while the job is down: the restored job discovers it
            // through topic_pattern and reads it from EARLIEST.
            created = kafka
                .create_topic("orders-b", 2)
                .and_then(|()| produce(kafka.bootstrap_servers(), "orders-b", ORDERS, LATE_ORDERS));
        }
    })?;
    created?;
    println!();
    print!("{}", report.table());
    for e in &report.verdict.examples {
        println!("  ! {e}");
    }
    let chk = dir.join("checkpoints");
    let complete = chaos::complete_checkpoints(&chk);
    println!();
    println!(
        "  orders: {ORDERS} in orders-a + {LATE_ORDERS} in orders-b (created after the first kill)"
    );
    println!("  checkpoints: {}", chk.display());
    if let Some(newest) = complete.last() {
        println!(
            "  inspect:     lockgate checkpoints inspect {}",
            newest.display()
        );
    }
    println!("  job log:     {}", dir.join("job.log").display());
    let ok = report.passed() && report.verdict.inputs == ORDERS + LATE_ORDERS;
    println!(
        "\n  exactly-once: {}",
        if ok { "verified" } else { "FAILED" }
    );
    drop(es);
    drop(rt);
    Ok(ok)
}
