//! The acknowledging-source kit through the runtime: a source over an in-memory queue
//! that redelivers as a broker does (`testkit::queue`), into the suite's exactly-once
//! collecting sink. Each case checks what the completed checkpoints hold against what
//! was published, and that the queue ends with every message acknowledged.

use lockgate::testkit::conformance::source::{FailOnce, FailingOperator};
use lockgate::testkit::conformance::{collect::Store, job_builder, run_and_stop, runtime, same_as};
use lockgate::testkit::queue::MemoryQueue;
use lockgate::testkit::verdict::Expect;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const WINDOW: Duration = Duration::from_secs(600);

fn publish(q: &MemoryQueue, n: usize, with_ids: bool) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let value = format!("{{\"n\":{i}}}").into_bytes();
            let id = format!("m-{i}");
            q.publish(with_ids.then_some(id.as_bytes()), &value);
            value
        })
        .collect()
}

fn job(
    name: &str,
    dir: &Path,
    parallelism: u16,
    source: lockgate::connector::SourceSpec,
    store: &Store,
    pace: u64,
    fail: Option<Arc<FailOnce>>,
) -> lockgate::job::JobGraph {
    let mut b = job_builder(name, dir, parallelism).source_spec(source);
    if let Some(f) = fail {
        b = b.operator("fail_once", move |_| {
            Box::new(FailingOperator::new(f.clone()))
        });
    }
    b.sink_spec(store.spec(pace))
        .build()
        .expect("the job builds")
}

fn values(store: &Store) -> Vec<Vec<u8>> {
    store.committed().into_iter().map(|c| c.value).collect()
}

/// Runs `g` until the store holds `total` records and the queue has nothing left to
/// deliver or acknowledge, then stops it.
fn run_to_drained(
    g: &lockgate::job::JobGraph,
    q: &MemoryQueue,
    store: &Store,
    total: usize,
) -> Result<lockgate::runtime::RunSummary, String> {
    let rt = runtime();
    run_and_stop(&rt, g, "every message committed and acknowledged", || {
        store.committed_len() >= total && q.ready() == 0 && q.unacked() == 0
    })
}

fn check_drained(q: &MemoryQueue) {
    assert_eq!(q.ready(), 0, "messages left in the queue");
    assert_eq!(q.unacked(), 0, "messages left unacknowledged");
}

#[test]
fn every_message_is_committed_once_and_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let q = MemoryQueue::new();
    let sent = publish(&q, 5_000, true);
    let store = Store::default();
    let g = job(
        "every_message",
        dir.path(),
        2,
        q.spec(200, WINDOW),
        &store,
        0,
        None,
    );
    run_to_drained(&g, &q, &store, sent.len()).unwrap();
    same_as(&sent, &values(&store), Expect::Exact).unwrap();
    check_drained(&q);
    assert_eq!(q.acked(), sent.len(), "each message acknowledged once");
}

#[test]
fn a_failure_mid_stream_neither_loses_nor_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let q = MemoryQueue::new();
    let sent = publish(&q, 4_000, true);
    let store = Store::default();
    let fail = FailOnce::new(1_000);
    let g = job(
        "failure",
        dir.path(),
        2,
        q.spec(300, WINDOW),
        &store,
        2_000,
        Some(fail.clone()),
    );
    run_to_drained(&g, &q, &store, sent.len()).unwrap();
    assert!(fail.fired(), "the injected failure happened");
    assert!(
        q.redelivered() > 0,
        "the torn-down consumers gave messages back to the queue"
    );
    same_as(&sent, &values(&store), Expect::Exact).unwrap();
    check_drained(&q);
}

#[test]
fn failed_acknowledgements_never_stall_the_job() {
    // FLINK-23183: after an acknowledgement failed, the broker redelivers messages the
    // job already holds; dropped and never acknowledged, they fill the prefetch
    // window and the job takes nothing more. Here the prefetch is small, so a stall
    // would stop the run short of the end. One consumer: the job goes on.
    let dir = tempfile::tempdir().unwrap();
    let q = MemoryQueue::new();
    let sent = publish(&q, 3_000, true);
    q.fail_acks(6);
    let store = Store::default();
    let g = job(
        "failed_acks",
        dir.path(),
        1,
        q.spec(40, WINDOW),
        &store,
        0,
        None,
    );
    run_to_drained(&g, &q, &store, sent.len()).unwrap();
    assert_eq!(q.failed_acks(), 6, "every asked-for failure happened");
    assert!(q.redelivered() > 0, "the failures made the queue redeliver");
    same_as(&sent, &values(&store), Expect::Exact).unwrap();
    check_drained(&q);
}

#[test]
fn with_several_consumers_a_failed_acknowledgement_restarts_the_job() {
    // The messages the failed channel gave back may reach the other consumer, which
    // does not hold their ids: only a restart, which gives every subtask every id,
    // keeps them from being taken as new.
    let dir = tempfile::tempdir().unwrap();
    let q = MemoryQueue::new();
    let sent = publish(&q, 3_000, true);
    q.fail_acks(1);
    let store = Store::default();
    let g = job(
        "failed_ack_restarts",
        dir.path(),
        2,
        q.spec(40, WINDOW),
        &store,
        0,
        None,
    );
    let summary = run_to_drained(&g, &q, &store, sent.len()).unwrap();
    assert_eq!(q.failed_acks(), 1);
    assert_eq!(
        summary.restarts, 1,
        "the failed acknowledgement restarted the job"
    );
    same_as(&sent, &values(&store), Expect::Exact).unwrap();
    check_drained(&q);
}

#[test]
fn a_rescale_keeps_every_id_not_known_acknowledged() {
    // The acknowledgements of the first run's last checkpoints are lost, so messages
    // it committed come again: the second run, at another parallelism, must drop each
    // of them, whichever old subtask had it.
    let dir = tempfile::tempdir().unwrap();
    let q = MemoryQueue::new();
    let sent = publish(&q, 4_000, true);
    let store = Store::default();
    let rt = runtime();
    let first = job(
        "rescale",
        dir.path(),
        3,
        q.spec(100, WINDOW),
        &store,
        3_000,
        None,
    );
    run_and_stop(&rt, &first, "half the messages committed", || {
        let half = store.committed_len() >= sent.len() / 2;
        if half {
            q.lose_acks(u32::MAX);
        }
        half
    })
    .unwrap();
    let committed = values(&store);
    assert!(
        committed.len() < sent.len(),
        "stopped mid-stream: {}",
        committed.len()
    );
    let again = q
        .ready_values()
        .iter()
        .filter(|v| committed.contains(v))
        .count();
    assert!(again > 0, "committed messages wait to be delivered again");
    q.lose_acks(0);
    let second = job(
        "rescale",
        dir.path(),
        2,
        q.spec(100, WINDOW),
        &store,
        0,
        None,
    );
    run_to_drained(&second, &q, &store, sent.len()).unwrap();
    same_as(&sent, &values(&store), Expect::Exact).unwrap();
    check_drained(&q);
}

#[test]
fn messages_without_ids_are_read_at_least_once() {
    let dir = tempfile::tempdir().unwrap();
    let q = MemoryQueue::new();
    let sent = publish(&q, 3_000, false);
    let store = Store::default();
    let fail = FailOnce::new(800);
    let g = job(
        "without_ids",
        dir.path(),
        1,
        q.spec(300, WINDOW),
        &store,
        2_000,
        Some(fail.clone()),
    );
    run_to_drained(&g, &q, &store, sent.len()).unwrap();
    assert!(fail.fired());
    same_as(&sent, &values(&store), Expect::AtLeastOnce).unwrap();
    check_drained(&q);
}
