//! The demo's job holds memory that does not grow with the backlog.
//!
//! `examples/jobs/orders-to-es.toml` (Kafka, 4 partitions -> `rolling_sum` by user ->
//! Elasticsearch upsert by user, parallelism 2, bounded), run as users run it: `lockgate
//! run` in its own process, against the embedded Kafka and the Elasticsearch test
//! server in processes of their own. Its peak resident memory (the kernel's
//! `ru_maxrss` of the child, exact) over 1,000,000 orders may exceed its peak over
//! 100,000 by at most [`MAX_RATIO`]: every place records wait is bounded in bytes, so
//! ten times the backlog makes the source wait, not the heap grow. A ratio, not an
//! absolute figure, so that it holds on a busy machine; the bench report measures the
//! absolute value (`demo_memory`).
//!
//! Before the sink counted each action's bookkeeping and the process gave freed pages
//! back, the same runs peaked at about 150 and 440 MiB.

mod common;

use common::es::Es;
use common::kafka::KafkaProcess;
use common::peak::run_to_end;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const MAX_RATIO: f64 = 1.25;

/// Users of the sample orders (`lockgate testkit kafka --orders`).
const USERS: u64 = 1000;

/// Each user's total over the first `orders` sample orders (the generator's formula).
fn expected_totals(orders: u64) -> BTreeMap<String, i64> {
    let mut totals = BTreeMap::new();
    for i in 0..orders {
        let user = format!("user-{:04}", (i * 7919) % USERS);
        *totals.entry(user).or_insert(0) += (1 + (i * 31) % 500) as i64;
    }
    totals
}

/// Runs the demo's job over `orders` fresh orders into a fresh test server; checks
/// that every user's document holds the exact total; returns the job's peak RSS.
fn demo_job_peak(root: &Path, orders: u64) -> u64 {
    let dir = root.join(format!("orders-{orders}"));
    std::fs::create_dir_all(&dir).unwrap();
    let kafka =
        KafkaProcess::start_with(&[("orders", 4)], &["--orders", &format!("orders:{orders}")]);
    let es = Es::testkit();
    let job = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/jobs/orders-to-es.toml");
    let mut cmd = Command::new(common::bin());
    cmd.args(["run", "--config"])
        .arg(&job)
        .env("LOCKGATE_KAFKA", &kafka.bootstrap)
        .env("LOCKGATE_ES", es.url())
        .env("LOCKGATE_DATA", &dir)
        .env("LOCKGATE_LOG", "info")
        .env_remove("LOCKGATE_FAILPOINTS");
    let peak = run_to_end(cmd, &dir.join("run.log"), Duration::from_secs(900));

    let expected = expected_totals(orders);
    let ids: Vec<String> = expected.keys().cloned().collect();
    let got = es.get_many("user-totals", &ids);
    assert_eq!(got.len(), expected.len(), "one document per user");
    for ((id, source, _), (user, total)) in got.iter().zip(&expected) {
        assert_eq!(id, user);
        assert_eq!(source["total"].as_i64(), Some(*total), "{user}: {source}");
    }
    peak
}

#[test]
fn ten_times_the_backlog_does_not_grow_the_demo_jobs_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let small = demo_job_peak(tmp.path(), 100_000);
    let large = demo_job_peak(tmp.path(), 1_000_000);
    let mib = |b: u64| b as f64 / 1048576.0;
    let ratio = large as f64 / small as f64;
    eprintln!(
        "peak RSS: 100,000 orders {:.1} MiB, 1,000,000 orders {:.1} MiB, ratio {ratio:.3}",
        mib(small),
        mib(large)
    );
    assert!(
        ratio <= MAX_RATIO,
        "the demo's job peaked at {:.1} MiB over 1,000,000 orders against {:.1} MiB over 100,000: {ratio:.2} times, more than {MAX_RATIO}",
        mib(large),
        mib(small)
    );
}
