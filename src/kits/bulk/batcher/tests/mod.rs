//! The batcher's rules, one file each: [`order`], [`coalescing`], [`partial_failure`],
//! [`refusals`] and [`pending`] (with its bookkeeping); [`keys`] for the document key.
//! Actions are [`TestEffect`]s, so that the rules are checked without a target. The
//! Elasticsearch sink's model check (every decision against an in-memory Elasticsearch)
//! is beside that sink and uses the answers below.

use super::*;
use effect::TestEffect;

mod coalescing;
mod effect;
mod keys;
mod order;
mod partial_failure;
mod pending;
mod refusals;

/// The kit's batcher over test effects.
type Batcher<T> = super::Batcher<T, TestEffect>;

/// A full write of the document, without an external version: the value it writes
/// does not matter to the batcher, only that each one supersedes the one before.
const REPLACE: TestEffect = TestEffect::Replace { version: None };

pub(crate) fn limits(max_actions: usize, max_in_flight: usize, coalesce: bool) -> Limits {
    Limits {
        max_actions,
        max_bytes: 1 << 20,
        max_in_flight,
        flush_interval_ms: 1000,
        coalesce,
        one_action_per_document: false,
        retry_max_attempts: u32::MAX,
        retry_initial_ms: 10,
        retry_max_ms: 100,
    }
}

/// An item written.
pub(crate) fn ok() -> ItemResult {
    ItemResult {
        outcome: Outcome::Done,
        failure: ItemFailure {
            status: 200,
            error_type: String::new(),
            reason: String::new(),
        },
    }
}

/// An item rejected for now (retried).
pub(crate) fn too_many() -> ItemResult {
    ItemResult {
        outcome: Outcome::Retry,
        failure: ItemFailure {
            status: 429,
            error_type: "es_rejected_execution_exception".into(),
            reason: "queue full".into(),
        },
    }
}

/// An item refused for good (the failure handler decides).
pub(crate) fn refused() -> ItemResult {
    ItemResult {
        outcome: Outcome::Rejected,
        failure: ItemFailure {
            status: 400,
            error_type: "mapper_parsing_exception".into(),
            reason: "failed to parse".into(),
        },
    }
}

/// A full write of value `v` (see [`REPLACE`]: `v` only tells the payloads apart).
fn index(_v: i64) -> TestEffect {
    REPLACE
}

/// A merge of the fields of the JSON object `doc` into the document.
fn upsert(doc: &str) -> TestEffect {
    TestEffect::merge(doc)
}

/// The next request (forced or not), with its payloads.
fn sent(b: &mut Batcher<i64>, now: u64, force: bool) -> Option<Vec<i64>> {
    b.next_request(now, force)
        .map(|(_, p)| p.into_iter().copied().collect())
}

/// The next request (forced or not): its id and payloads.
fn sent_with_id(b: &mut Batcher<i64>, now: u64, force: bool) -> Option<(RequestId, Vec<i64>)> {
    b.next_request(now, force)
        .map(|(id, p)| (id, p.into_iter().copied().collect()))
}

/// Takes the refusal among what was resolved: its handle, payload and attempts.
fn refusal(b: &mut Batcher<i64>) -> (Refusal, i64, u32) {
    let r = b.drain_resolved();
    for x in r {
        if let Resolution::Refused {
            refusal,
            payload,
            attempts,
            ..
        } = x
        {
            return (refusal, payload, attempts);
        }
    }
    panic!("no refusal");
}

/// Takes the one refusal among the resolutions, with its failure.
fn refusal_with_failure(b: &mut Batcher<i64>) -> (Refusal, i64, ItemFailure, u32) {
    let mut r = b.drain_resolved();
    let at = r
        .iter()
        .position(|x| matches!(x, Resolution::Refused { .. }))
        .unwrap_or_else(|| panic!("a refusal in {r:?}"));
    match r.remove(at) {
        Resolution::Refused {
            refusal,
            payload,
            failure,
            attempts,
        } => (refusal, payload, failure, attempts),
        _ => unreachable!(),
    }
}

/// Answers every request with success until nothing is pending; returns what was
/// sent, in order, and what was superseded or coalesced.
fn drain_all(b: &mut Batcher<i64>, mut now: u64) -> (Vec<i64>, Vec<i64>) {
    let (mut out, mut gone) = (vec![], vec![]);
    for _ in 0..100 {
        for r in b.drain_resolved() {
            if let Resolution::Superseded(v) | Resolution::Coalesced(v) = r {
                gone.push(v)
            }
        }
        if b.pending() == 0 {
            break;
        }
        now += 1000;
        while let Some((id, p)) = sent_with_id(b, now, true) {
            out.extend(&p);
            b.on_response(id, Response::Items(vec![ok(); p.len()]), now, 0.5);
        }
    }
    (out, gone)
}

/// Limits with a 25-byte trigger and no other trigger before 1000 ms.
fn bytes_25(coalesce: bool) -> Limits {
    Limits {
        max_bytes: 25,
        ..limits(1000, 2, coalesce)
    }
}

/// Whether the batcher holds no document: no key in its map, no live group.
fn holds_no_document(b: &Batcher<i64>) -> bool {
    b.holds_no_document()
}

/// Whether the processor takes more actions (what a processor asks before reading).
fn intake_open(b: &Batcher<i64>) -> bool {
    b.has_room()
}

/// Sends what is due (forced) and answers it with `items`; returns what was sent.
fn round(b: &mut Batcher<i64>, now: u64, items: fn() -> ItemResult) -> Vec<i64> {
    let (id, p) = b.next_request(now, true).expect("a request");
    let p: Vec<i64> = p.into_iter().copied().collect();
    b.on_response(id, Response::Items(vec![items(); p.len()]), now, 0.0);
    p
}

/// Settles (dead-letters) every refusal among the resolutions; returns what was
/// refused, written and coalesced or superseded, in that order.
fn settle(b: &mut Batcher<i64>) -> (Vec<i64>, Vec<i64>, Vec<i64>) {
    let (mut refused, mut written, mut gone) = (vec![], vec![], vec![]);
    // Settling a refusal may resolve more: until nothing is left.
    loop {
        let batch = b.drain_resolved();
        if batch.is_empty() {
            break;
        }
        for r in batch {
            match r {
                Resolution::Refused {
                    refusal, payload, ..
                } => {
                    refused.push(payload);
                    b.settle_refused(refusal);
                }
                Resolution::Written(v) => written.push(v),
                Resolution::Coalesced(v) | Resolution::Superseded(v) => gone.push(v),
                other => panic!("{other:?}"),
            }
        }
    }
    (refused, written, gone)
}

/// Builds, on document k, a request [4 (which set aside 3), 5] (5 supersedes 4 but
/// was added while 4 was in flight, and 4 came back when a split cut its document),
/// answers it with `first` for 4 and success for 5, and returns the batcher.
fn overtaken(first: ItemResult) -> Batcher<i64> {
    let mut b = Batcher::new(limits(1000, 1, true), 0);
    b.add(Some("k".into()), REPLACE, 10, 1);
    b.add(Some("k".into()), REPLACE, 10, 2);
    assert_eq!(round(&mut b, 0, refused), vec![2]);
    settle(&mut b);
    // 1 went back: 3 and 4 queue behind it, 4 sets aside 3.
    b.add(Some("k".into()), REPLACE, 10, 3);
    b.add(Some("k".into()), REPLACE, 10, 4);
    let (id, p) = b.next_request(0, true).unwrap();
    assert_eq!(p, vec![&1, &4]);
    b.add(Some("k".into()), REPLACE, 10, 5);
    b.on_response(
        id,
        Response::Failed(RequestOutcome::Split, "413".into()),
        0,
        0.0,
    );
    assert_eq!(round(&mut b, 0, ok), vec![1]);
    assert_eq!(settle(&mut b).1, vec![1]);
    let (id, p) = b.next_request(0, true).unwrap();
    assert_eq!(p, vec![&4, &5]);
    b.on_response(id, Response::Items(vec![first, ok()]), 0, 0.0);
    b
}
