//! Partial failure: what a request's failed items, a whole failed request and a wrong
//! count of results make of its actions (retried, superseded, exhausted).

use super::*;
use std::time::Duration;

#[test]
fn a_request_written_whole_resolves_every_action_and_a_miscount_retries_it() {
    let mut b = Batcher::new(limits(1000, 2, false), 0);
    for v in 0..3 {
        b.add(Some(format!("d{v}")), TestEffect::Opaque, 10, v);
    }
    let (id, _) = b.next_request(0, true).unwrap();
    b.on_response(id, Response::Written(2), 1, 0.5);
    assert_eq!(
        (b.pending(), b.counters().retried),
        (3, 3),
        "2 results for 3"
    );
    assert!(b.drain_resolved().is_empty());
    let (id, payloads) = b.next_request(1000, true).unwrap();
    assert_eq!(payloads, vec![&0, &1, &2]);
    b.on_response(id, Response::Written(3), 1001, 0.5);
    assert_eq!((b.pending(), b.bytes()), (0, 0));
    let written: Vec<_> = b
        .drain_resolved()
        .into_iter()
        .map(|r| match r {
            Resolution::Written(v) => v,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(written, vec![0, 1, 2]);
}

#[test]
fn retries_are_bounded() {
    let mut l = limits(1000, 1, false);
    l.retry_max_attempts = 2;
    let mut b = Batcher::new(l, 0);
    b.add(Some("d".into()), TestEffect::Opaque, 10, 1);
    for now in [0, 1000, 2000] {
        assert!(b.drain_resolved().is_empty());
        let (id, _) = sent_with_id(&mut b, now, true).unwrap();
        b.on_response(id, Response::Items(vec![too_many()]), now, 0.5);
    }
    assert!(matches!(
        b.drain_resolved().as_slice(),
        [Resolution::Exhausted(1, _)]
    ));
    assert_eq!(b.pending(), 0);
}

#[test]
fn a_retriable_failure_before_a_refused_action_is_retried() {
    let mut b = Batcher::new(limits(1000, 1, false), 0);
    b.add(Some("d".into()), index(1), 10, 1);
    b.add(Some("d".into()), index(2), 10, 2);
    let (id, p) = sent_with_id(&mut b, 0, true).unwrap();
    assert_eq!(p, vec![1, 2]);
    b.on_response(id, Response::Items(vec![too_many(), refused()]), 1, 0.5);
    let (r, payload, _, _) = refusal_with_failure(&mut b);
    assert_eq!(payload, 2);
    b.settle_refused(r);
    assert_eq!(b.pending(), 1, "1 was not written: it awaits a retry");
}

/// A retry is due at exactly its due time (half of `retry_initial_ms` without
/// jitter: 5 ms).
#[test]
fn a_retry_is_sent_at_its_due_time() {
    let mut b = Batcher::new(limits(1000, 1, false), 0);
    b.add(Some("d".into()), TestEffect::Opaque, 10, 1);
    let (id, _) = b.next_request(0, true).unwrap();
    let backoff = b.on_response(id, Response::Items(vec![too_many()]), 0, 0.0);
    assert_eq!(
        backoff,
        Some(Duration::from_millis(5)),
        "the backoff it reports"
    );
    assert_eq!(b.next_wake_ms(), Some(5));
    assert_eq!(sent(&mut b, 4, true), None, "not yet due");
    assert_eq!(sent(&mut b, 5, true), Some(vec![1]));
    // Written: nothing retried, no backoff.
    let mut b = Batcher::new(limits(1000, 1, false), 0);
    b.add(Some("d".into()), TestEffect::Opaque, 10, 1);
    let (id, _) = b.next_request(0, true).unwrap();
    assert_eq!(b.on_response(id, Response::Written(1), 0, 0.0), None);
}

/// A response whose item count does not match the request cannot be read by
/// position: every action of the request is retried (and counted), none is taken
/// as written.
#[test]
fn a_response_with_the_wrong_item_count_retries_the_whole_request() {
    let mut b = Batcher::new(limits(1000, 1, false), 0);
    b.add(Some("a".into()), TestEffect::Opaque, 10, 1);
    b.add(Some("b".into()), TestEffect::Opaque, 10, 2);
    let (id, _) = b.next_request(0, true).unwrap();
    b.on_response(id, Response::Items(vec![ok()]), 0, 0.0);
    assert!(b.drain_resolved().is_empty(), "nothing written");
    assert_eq!((b.pending(), b.counters().retried), (2, 2));
    assert_eq!(sent(&mut b, 5, true), Some(vec![1, 2]), "both retried");
}

/// A retry that the queued action behind it supersedes is set aside by it, not
/// resolved: if that action is refused, the retry is sent after all.
#[test]
fn a_retry_set_aside_by_the_action_behind_it_is_sent_if_that_is_refused() {
    let mut b = Batcher::new(limits(1000, 1, true), 0);
    b.add(Some("k".into()), REPLACE, 10, 1);
    assert_eq!(round(&mut b, 0, too_many), vec![1]);
    b.add(Some("k".into()), REPLACE, 10, 2);
    assert_eq!(round(&mut b, 5, refused), vec![2], "1 is not resent");
    let (refused, written, gone) = settle(&mut b);
    assert_eq!((refused, written, gone), (vec![2], vec![], vec![]));
    assert_eq!(b.pending(), 1);
    assert_eq!(round(&mut b, 5, ok), vec![1], "1 is sent in 2's place");
    assert_eq!(settle(&mut b), (vec![], vec![1], vec![]));
    assert_eq!(b.pending(), 0);
}
