//! Pending and bookkeeping: what the batcher counts (pending, queued, in flight,
//! bytes), when it wakes, what a request holds, and that a resolved document leaves it.

use super::*;
use bytes::Bytes;

#[test]
fn a_documents_key_keeps_no_slice_of_the_buffer_it_came_from() {
    let mut b = Batcher::<i64>::new(limits(10, 1, false), 0);
    let buffer = Bytes::from(vec![b'k'; 4096]);
    // Two actions on one document: its group lives while either is live.
    b.add_doc(Some(DocKey::new(buffer.slice(0..8))), index(1), 64, 1);
    b.add_doc(Some(DocKey::new(buffer.slice(0..8))), index(2), 64, 2);
    assert_eq!(b.pending(), 2);
    assert!(
        buffer.is_unique(),
        "the batcher holds a slice of the batch buffer"
    );
}

#[test]
fn max_bytes_bounds_a_request_and_an_oversized_action_goes_alone() {
    let mut l = limits(1000, 4, false);
    l.max_bytes = 25;
    let mut b = Batcher::new(l, 0);
    for (doc, bytes, v) in [("a", 10, 1), ("b", 10, 2), ("c", 10, 3), ("d", 100, 4)] {
        b.add(Some(doc.into()), TestEffect::Opaque, bytes, v);
    }
    let mut got = vec![];
    while let Some((_, p)) = sent_with_id(&mut b, 0, true) {
        got.push(p);
    }
    assert_eq!(got, vec![vec![1, 2], vec![3], vec![4]]);
}

#[test]
fn an_unforced_batch_waits_for_its_trigger_and_the_wake_says_when() {
    let mut b = Batcher::new(limits(3, 1, false), 0);
    b.add(Some("a".into()), TestEffect::Opaque, 10, 1);
    assert!(
        sent_with_id(&mut b, 10, false).is_none(),
        "not due before the interval"
    );
    assert_eq!(b.next_wake_ms(), Some(1000));
    let (id, p) = sent_with_id(&mut b, 1000, false).expect("due at the interval");
    assert_eq!(p, vec![1]);
    assert_eq!(b.next_wake_ms(), None, "nothing sendable, nothing to retry");
    b.on_response(id, Response::Items(vec![too_many()]), 1005, 0.0);
    assert_eq!(b.next_wake_ms(), Some(1010), "the retry's due time");
    for v in 2..5 {
        b.add(Some(format!("k{v}")), TestEffect::Opaque, 10, v);
    }
    assert_eq!(
        sent_with_id(&mut b, 1006, false)
            .expect("max_actions queued")
            .1,
        vec![2, 3, 4]
    );
}

#[test]
fn clear_unsent_drops_everything_not_in_flight_and_frees_the_documents() {
    let mut b = Batcher::new(limits(1000, 2, false), 0);
    b.add(Some("d".into()), TestEffect::Opaque, 10, 1);
    b.add(Some("e".into()), TestEffect::Opaque, 10, 2);
    let (id, _) = sent_with_id(&mut b, 0, true).unwrap();
    b.on_response(id, Response::Items(vec![too_many(), ok()]), 1, 0.5);
    b.add(Some("d".into()), TestEffect::Opaque, 10, 3);
    b.add(Some("f".into()), TestEffect::Opaque, 10, 4);
    let (in_flight, p) = sent_with_id(&mut b, 1, true).unwrap();
    assert_eq!(p, vec![4]);
    b.add(Some("f".into()), TestEffect::Opaque, 10, 5);
    b.drain_resolved();
    assert_eq!(
        b.clear_unsent(),
        3,
        "1 (awaiting a retry), 3 and 5 (queued)"
    );
    assert_eq!((b.pending(), b.queued(), b.next_wake_ms()), (1, 0, None));
    assert_eq!(b.bytes(), 10, "only the request in flight is still held");
    b.on_response(in_flight, Response::Items(vec![ok()]), 2, 0.5);
    assert_eq!((b.pending(), b.bytes()), (0, 0));
    b.add(Some("d".into()), TestEffect::Opaque, 10, 6);
    assert_eq!(sent_with_id(&mut b, 3, true).expect("d is free").1, vec![6]);
}

/// `queued()` and `in_flight()` follow every action from queued to in flight to
/// answered; `requests` counts the requests sent.
#[test]
fn queued_and_in_flight_count_actions_and_requests() {
    let mut b = Batcher::new(limits(1, 2, false), 0);
    for (doc, v) in [("a", 1), ("b", 2), ("c", 3)] {
        b.add(Some(doc.into()), TestEffect::Opaque, 10, v);
    }
    assert_eq!((b.queued(), b.in_flight()), (3, 0));
    let (first, _) = b.next_request(0, true).unwrap();
    assert_eq!((b.queued(), b.in_flight()), (2, 1));
    let (second, _) = b.next_request(0, true).unwrap();
    assert_eq!((b.queued(), b.in_flight()), (1, 2));
    assert!(b.next_request(0, true).is_none(), "max_in_flight = 2");
    assert_eq!(b.counters().requests, 2);
    b.on_response(first, Response::Items(vec![ok()]), 1, 0.5);
    b.on_response(second, Response::Items(vec![ok()]), 1, 0.5);
    assert_eq!((b.queued(), b.in_flight(), b.pending()), (1, 0, 1));
}

/// What a request carries leaves the queued bytes; what stays queued still counts.
#[test]
fn sent_actions_no_longer_count_toward_the_byte_trigger() {
    let mut b = Batcher::new(bytes_25(false), 0);
    for (doc, v) in [("a", 1), ("b", 2), ("c", 3)] {
        b.add(Some(doc.into()), TestEffect::Opaque, 10, v);
    }
    assert_eq!(sent(&mut b, 1, false), Some(vec![1, 2]), "30 bytes queued");
    assert_eq!(
        sent(&mut b, 1, false),
        None,
        "c's 10 bytes queued, under 25"
    );
    b.add(Some("d".into()), TestEffect::Opaque, 15, 4);
    assert_eq!(
        sent(&mut b, 1, false),
        Some(vec![3, 4]),
        "c and d: 25 bytes queued"
    );
}

/// An action back from a retry counts toward the byte trigger again.
#[test]
fn a_retried_action_counts_toward_the_byte_trigger_again() {
    let mut b = Batcher::new(bytes_25(false), 0);
    b.add(Some("a".into()), TestEffect::Opaque, 20, 1);
    let (id, _) = b.next_request(0, true).unwrap();
    b.on_response(id, Response::Items(vec![too_many()]), 0, 0.0);
    // Due at 5 ms (half of retry_initial_ms with no jitter); the interval at 1000.
    assert_eq!(sent(&mut b, 500, false), None, "a's 20 bytes, under 25");
    assert_eq!(b.queued(), 1, "a is queued again");
    b.add(Some("b".into()), TestEffect::Opaque, 5, 2);
    assert_eq!(
        sent(&mut b, 500, false),
        Some(vec![1, 2]),
        "25 bytes queued"
    );
}

/// A document's superseding chain shares a request with what is already in it up
/// to exactly `max_actions` and `max_bytes`; the rest of the chain goes next.
#[test]
fn a_chain_fills_a_request_up_to_its_limits_and_the_rest_goes_next() {
    for (max_actions, max_bytes) in [(3, 1 << 20), (1000, 30)] {
        let l = Limits {
            max_bytes,
            ..limits(max_actions, 1, false)
        };
        let mut b = Batcher::new(l, 0);
        b.add(Some("e".into()), TestEffect::Opaque, 10, 0);
        for v in 1..=3 {
            b.add(Some("d".into()), REPLACE, 10, v);
        }
        let (id, p) = b.next_request(0, true).unwrap();
        assert_eq!(
            p,
            vec![&0, &1, &2],
            "{max_actions} actions, {max_bytes} bytes"
        );
        b.on_response(id, Response::Items(vec![ok(); 3]), 0, 0.5);
        assert_eq!(sent(&mut b, 0, true), Some(vec![3]));
    }
}

/// Every request in flight has its own id: answering one never answers another,
/// whatever else (actions without an id) drew from the same counter.
#[test]
fn requests_in_flight_have_distinct_ids() {
    let mut b = Batcher::new(limits(1000, 2, false), 0);
    b.add(Some("d".into()), TestEffect::Opaque, 10, 1);
    let (first, _) = b.next_request(0, true).unwrap();
    b.add(None, TestEffect::Opaque, 10, 2);
    let (second, _) = b.next_request(0, true).unwrap();
    assert_ne!(first, second);
    assert_eq!(b.in_flight(), 2);
    assert_eq!(b.in_flight_payloads(first), vec![&1]);
    b.on_response(first, Response::Items(vec![ok()]), 0, 0.5);
    b.on_response(second, Response::Items(vec![ok()]), 0, 0.5);
    assert_eq!((b.pending(), b.in_flight()), (0, 0));
}

/// With `max_in_flight` requests out, nothing can be sent: the wake is for a retry
/// or nothing, not the flush interval.
#[test]
fn no_flush_wake_while_max_in_flight_requests_are_out() {
    let mut b = Batcher::new(limits(1000, 1, false), 0);
    b.add(Some("a".into()), TestEffect::Opaque, 10, 1);
    let (id, _) = b.next_request(0, true).unwrap();
    b.add(Some("b".into()), TestEffect::Opaque, 10, 2);
    assert_eq!(
        b.next_wake_ms(),
        None,
        "b waits for the answer, not a timer"
    );
    b.on_response(id, Response::Items(vec![ok()]), 10, 0.5);
    assert_eq!(b.next_wake_ms(), Some(1000), "b is due at the interval");
}

/// `for_each_in_flight_mut` reaches exactly the actions of the request it names, in
/// request order, and nothing for a request not in flight.
#[test]
fn for_each_in_flight_mut_reaches_the_actions_of_that_request() {
    let mut b = Batcher::new(limits(2, 2, false), 0);
    for (doc, v) in [("a", 1), ("b", 2), ("c", 3)] {
        b.add(Some(doc.into()), TestEffect::Opaque, 10, v);
    }
    let (id, _) = b.next_request(0, true).unwrap();
    let mut seen = vec![];
    b.for_each_in_flight_mut(id, |p| {
        seen.push(*p);
        *p *= 10;
    });
    assert_eq!(seen, vec![1, 2]);
    assert_eq!(b.in_flight_payloads(id), vec![&10, &20]);
    b.for_each_in_flight_mut(id + 1, |_| panic!("no such request"));
    assert_eq!(sent(&mut b, 0, true), Some(vec![3]), "c was not in it");
    b.on_response(id, Response::Items(vec![ok(), ok()]), 0, 0.5);
    let written: Vec<_> = b
        .drain_resolved()
        .into_iter()
        .map(|r| match r {
            Resolution::Written(v) => v,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        written,
        vec![10, 20],
        "what the processor changed is resolved"
    );
}

/// `drain_resolved_into` appends what was resolved, in order, behind what `out`
/// already holds, and leaves nothing behind to be drained again.
#[test]
fn drain_resolved_into_appends_in_order_and_takes_everything() {
    let mut b = Batcher::new(limits(1000, 1, false), 0);
    b.add(Some("a".into()), TestEffect::Opaque, 10, 1);
    b.add(Some("b".into()), TestEffect::Opaque, 10, 2);
    let (id, _) = b.next_request(0, true).unwrap();
    b.on_response(id, Response::Written(2), 0, 0.5);
    let mut out = vec![Resolution::Written(0)];
    b.drain_resolved_into(&mut out);
    let got: Vec<_> = out
        .into_iter()
        .map(|r| match r {
            Resolution::Written(v) => v,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(got, vec![0, 1, 2]);
    assert!(b.drain_resolved().is_empty());
}

/// A document whose last action is resolved leaves the batcher, whatever resolved
/// it (written, coalesced then written, refused and settled, retried then written,
/// failed, dropped by `clear_unsent`), so what it holds is bounded by its live
/// actions, not by every document it ever saw.
#[test]
fn a_document_with_no_live_action_leaves_the_batcher() {
    let mut b = Batcher::new(limits(1000, 1, true), 0);
    let answer = |b: &mut Batcher<i64>, items: Vec<ItemResult>| {
        let (id, _) = b.next_request(10_000, true).unwrap();
        b.on_response(id, Response::Items(items), 0, 0.0);
    };
    b.add(Some("a".into()), REPLACE, 10, 1);
    b.add(None, REPLACE, 10, 2);
    b.add(Some("c".into()), REPLACE, 10, 3);
    b.add(Some("c".into()), REPLACE, 10, 4);
    answer(&mut b, vec![ok(); 3]);
    assert!(holds_no_document(&b), "written and coalesced");
    b.add(Some("d".into()), REPLACE, 10, 5);
    answer(&mut b, vec![refused()]);
    let (r, _, _) = refusal(&mut b);
    assert!(!holds_no_document(&b), "the refusal holds its place");
    b.settle_refused(r);
    assert!(holds_no_document(&b), "refused and settled");
    b.add(Some("e".into()), REPLACE, 10, 6);
    answer(&mut b, vec![too_many()]);
    answer(&mut b, vec![ok()]);
    assert!(holds_no_document(&b), "retried, then written");
    b.add(Some("f".into()), REPLACE, 10, 7);
    let (id, _) = b.next_request(20_000, true).unwrap();
    b.on_response(
        id,
        Response::Failed(RequestOutcome::Fatal, "401".into()),
        0,
        0.0,
    );
    assert!(holds_no_document(&b), "failed");
    b.add(Some("g".into()), REPLACE, 10, 8);
    b.add(None, REPLACE, 10, 9);
    assert_eq!(b.clear_unsent(), 2);
    assert!(holds_no_document(&b), "dropped");
    assert_eq!((b.pending(), b.bytes()), (0, 0));
}

/// What stays a while after a response that did not write everything is reached by
/// `for_each_in_flight_mut` (the processor gives it bytes of its own): the set-aside
/// actions too.
#[test]
fn for_each_in_flight_mut_reaches_what_the_actions_set_aside() {
    let mut b = Batcher::new(limits(1000, 1, true), 0);
    for v in 1..=3 {
        b.add(Some("k".into()), REPLACE, 10, v);
    }
    b.add(Some("j".into()), REPLACE, 10, 4);
    let (id, _) = b.next_request(0, true).unwrap();
    let mut seen = vec![];
    b.for_each_in_flight_mut(id, |p| seen.push(*p));
    seen.sort();
    assert_eq!(seen, vec![1, 2, 3, 4]);
}
