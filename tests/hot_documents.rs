//! Hot documents against a slow cluster, through real processes: the embedded Kafka,
//! the Elasticsearch test server answering every request 100 ms late, and the job
//! (Kafka -> rolling_sum by user -> Elasticsearch, one document per user) killed with
//! SIGKILL ten times while a live stream of 40,000 orders arrives at 5,000/s. The job
//! must catch up within 30 s of the input stopping, with no checkpoint aborted, and
//! every user's total exact.

mod common;

use common::es::Es;
use common::kafka::KafkaProcess;
use common::{bin, seed, sigkill, signal, tail, wait_timeout};
use rand::{Rng, SeedableRng};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const USERS: u64 = 100;
const ORDERS: u64 = 40_000;
const PER_SEC: u64 = 5_000;

fn user(i: u64) -> String {
    format!("user-{:03}", (i * 7919) % USERS)
}

fn amount(i: u64) -> u64 {
    1 + (i * 31) % 500
}

/// Every user's expected total.
fn totals() -> BTreeMap<String, u64> {
    let mut t = BTreeMap::new();
    for i in 0..ORDERS {
        *t.entry(user(i)).or_insert(0) += amount(i);
    }
    t
}

/// Produces the orders at `PER_SEC`, keyed by user (a user stays in one partition).
fn live_stream(bootstrap: String) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let p: BaseProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("linger.ms", "5")
            .create()
            .unwrap();
        let start = Instant::now();
        for i in 0..ORDERS {
            // Paced: order i is due at i / PER_SEC seconds.
            let due = Duration::from_micros(i * 1_000_000 / PER_SEC);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(wait);
            }
            let (key, body) = (
                user(i),
                json!({"order": i, "user": user(i), "amount": amount(i)}).to_string(),
            );
            while p
                .send(BaseRecord::to("orders").key(&key).payload(&body))
                .is_err()
            {
                p.poll(Duration::from_millis(5));
            }
            p.poll(Duration::ZERO);
        }
        p.flush(Duration::from_secs(60)).unwrap();
    })
}

fn job(dir: &Path, bootstrap: &str, es: &str, sink: &str) -> PathBuf {
    let text = format!(
        "[job]\nname = \"hot-documents\"\nparallelism = 2\n\n\
         [checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 500\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"orders\"]\n\n\
         [[transform]]\ntype = \"rolling_sum\"\nkey = \"/user\"\nfield = \"/amount\"\noutput = \"/total\"\n\n\
         [sink.elasticsearch]\nurl = \"{es}\"\nindex = \"totals\"\nid = \"field:/user\"\n{sink}\n"
    );
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join("job.toml");
    std::fs::write(&p, text).unwrap();
    p
}

fn spawn(config: &Path, log: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Command::new(bin())
        .args(["run", "--config"])
        .arg(config)
        .env("LOCKGATE_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// Every user's indexed total, for those indexed.
fn indexed(es: &Es) -> BTreeMap<String, u64> {
    let ids: Vec<String> = totals().into_keys().collect();
    es.get_many("totals", &ids)
        .into_iter()
        .filter_map(|(id, doc, _)| Some((id, doc["total"].as_u64()?)))
        .collect()
}

fn hot_documents_catch_up(sink: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 4)]);
    let es = Es::testkit();
    es.set_faults(json!({"latency_ms": 100}));
    let config = job(tmp.path(), &kafka.bootstrap, &es.url(), sink);
    let log = tmp.path().join("runs.log");
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed(10));
    let producer = live_stream(kafka.bootstrap.clone());
    // Ten SIGKILLs while the stream arrives: each run lives until its restore decision
    // is logged plus a random moment (the job is unbounded: it is alive to be killed).
    for kill in 0..10 {
        let mut child = spawn(&config, &log);
        let decisions =
            |t: &str| t.matches("restoring").count() + t.matches("starting without").count();
        common::wait::until("the run's restore decision", common::wait::DEADLINE, || {
            decisions(&std::fs::read_to_string(&log).unwrap_or_default()) > kill
        });
        std::thread::sleep(Duration::from_millis(rng.gen_range(200..900)));
        assert!(
            sigkill(&mut child),
            "run {kill} died by itself:\n{}",
            tail(&std::fs::read_to_string(&log).unwrap(), 30)
        );
    }
    let mut last = spawn(&config, &log);
    producer.join().unwrap();
    let stopped = Instant::now();
    let want = totals();
    // Catching up: within 30 s of the input stopping, every total is exact.
    while indexed(&es) != want {
        assert!(
            last.try_wait().unwrap().is_none(),
            "the job died:\n{}",
            tail(&std::fs::read_to_string(&log).unwrap(), 30)
        );
        assert!(
            stopped.elapsed() < Duration::from_secs(30),
            "not caught up 30 s after the input stopped: {} of {} users exact (e.g. {:?}, want {:?})\n{}",
            indexed(&es)
                .iter()
                .filter(|(u, t)| want.get(*u) == Some(t))
                .count(),
            want.len(),
            indexed(&es).into_iter().take(3).collect::<Vec<_>>(),
            want.iter().take(3).collect::<Vec<_>>(),
            tail(&std::fs::read_to_string(&log).unwrap(), 30)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    signal(&last, libc::SIGTERM);
    let status = wait_timeout(&mut last, Duration::from_secs(60));
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(0), "{}", tail(&text, 30));
    assert_eq!(indexed(&es), want, "the totals stayed exact");
    assert!(
        text.contains("checkpoint completed"),
        "checkpoints completed:\n{}",
        tail(&text, 30)
    );
    for bad in ["checkpoint aborted", "declined", "expired"] {
        assert!(
            !text.contains(bad),
            "every checkpoint completed within its timeout ({bad}):\n{}",
            tail(&text, 30)
        );
    }
    assert_eq!(es.count("totals"), USERS, "one document per user");
}

#[test]
fn hot_documents_upserted_by_key_catch_up_against_a_slow_cluster() {
    hot_documents_catch_up("operation = \"upsert\"");
}

#[test]
fn hot_documents_indexed_with_external_versions_catch_up_against_a_slow_cluster() {
    hot_documents_catch_up("operation = \"index\"\nversioning = \"external\"");
}
