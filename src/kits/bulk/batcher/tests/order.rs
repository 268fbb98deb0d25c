//! Order: a document's actions reach the target in the order they were added, whatever
//! is in flight, retried, split, refused or replaced.

use super::*;

#[test]
fn an_action_waits_while_its_document_is_in_flight() {
    let mut b = Batcher::new(limits(1000, 2, true), 0);
    b.add(Some("d".into()), TestEffect::Opaque, 10, 1);
    let (first, _) = b.next_request(0, true).unwrap();
    b.add(Some("d".into()), TestEffect::Opaque, 10, 2);
    b.add(Some("e".into()), TestEffect::Opaque, 10, 3);
    let (_, payloads) = b.next_request(0, true).unwrap();
    assert_eq!(payloads, vec![&3], "d is in flight: only e is sent");
    b.on_response(first, Response::Items(vec![ok()]), 1, 0.5);
    let (_, payloads) = b.next_request(1, true).unwrap();
    assert_eq!(payloads, vec![&2]);
}

#[test]
fn a_split_keeps_a_documents_actions_in_order() {
    let mut b = Batcher::new(limits(1000, 4, false), 0);
    for v in 0..4 {
        b.add(Some("d".into()), index(v), 10, v);
    }
    let (id, _) = b.next_request(0, true).unwrap();
    b.on_response(
        id,
        Response::Failed(RequestOutcome::Split, "413".into()),
        1,
        0.5,
    );
    let (a, first) = b.next_request(1, true).unwrap();
    assert_eq!(first, vec![&0, &1]);
    assert!(
        b.next_request(1, true).is_none(),
        "the rest of d waits for the first half"
    );
    b.on_response(a, Response::Items(vec![ok(), ok()]), 2, 0.5);
    let (_, rest) = b.next_request(2, true).unwrap();
    assert_eq!(rest, vec![&2, &3]);
}

#[test]
fn a_requeued_action_goes_before_later_actions_and_is_not_coalesced_into_them() {
    for coalesce in [false, true] {
        let mut b = Batcher::new(limits(1000, 1, coalesce), 0);
        b.add(Some("d".into()), index(1), 10, 1);
        let (id, _) = sent_with_id(&mut b, 0, true).unwrap();
        b.add(Some("d".into()), index(2), 10, 2);
        b.on_response(id, Response::Items(vec![refused()]), 1, 0.5);
        let (r, payload, _, _) = refusal_with_failure(&mut b);
        assert_eq!(payload, 1);
        b.requeue(r, vec![(Some("d".into()), index(11), 10, 11)]);
        assert_eq!(
            sent_with_id(&mut b, 1, true).unwrap().1,
            vec![11, 2],
            "coalesce={coalesce}"
        );
        assert!(b.drain_resolved().is_empty(), "nothing coalesced");
    }
}

/// [1 refused, 2 rejected with 429]: the handler's replacement for 1 keeps 1's place,
/// before 2, with or without coalescing (2 is never superseded by it).
#[test]
fn a_replacement_stays_before_a_later_retried_action() {
    for coalesce in [false, true] {
        let mut b: Batcher<i64> = Batcher::new(limits(1000, 1, coalesce), 0);
        if coalesce {
            // With coalescing, the chain [r, 2] forms behind a requeued action.
            b.add(Some("d".into()), index(0), 10, 0);
            let (id, _) = sent_with_id(&mut b, 0, true).unwrap();
            b.add(Some("d".into()), index(2), 10, 2);
            b.on_response(id, Response::Items(vec![refused()]), 0, 0.5);
            let (r, _, _, _) = refusal_with_failure(&mut b);
            b.requeue(r, vec![(Some("d".into()), index(1), 10, 1)]);
        } else {
            b.add(Some("d".into()), index(1), 10, 1);
            b.add(Some("d".into()), index(2), 10, 2);
        }
        let (id, p) = sent_with_id(&mut b, 0, true).unwrap();
        assert_eq!(p, vec![1, 2]);
        b.on_response(id, Response::Items(vec![refused(), too_many()]), 1, 0.5);
        let (r, payload, _, _) = refusal_with_failure(&mut b);
        assert_eq!(payload, 1);
        b.requeue(r, vec![(Some("d".into()), index(11), 10, 11)]);
        let (out, gone) = drain_all(&mut b, 1);
        assert_eq!(out, vec![11, 2], "coalesce={coalesce}: 11 then 2");
        assert!(gone.is_empty(), "coalesce={coalesce}: {gone:?}");
    }
}

/// [1 refused, delete written]: a replacement for 1 would resurrect the document
/// after the delete. One the written action supersedes is superseded; one it does
/// not supersede fails the job instead of reordering the document.
#[test]
fn a_replacement_never_follows_a_later_written_action() {
    let delete = TestEffect::Delete { version: None };
    let mut b: Batcher<i64> = Batcher::new(limits(1000, 1, false), 0);
    b.add(Some("d".into()), index(1), 10, 1);
    b.add(Some("d".into()), delete.clone(), 10, 2);
    let (id, p) = sent_with_id(&mut b, 0, true).unwrap();
    assert_eq!(p, vec![1, 2]);
    b.on_response(id, Response::Items(vec![refused(), ok()]), 1, 0.5);
    let (r, _, _, _) = refusal_with_failure(&mut b);
    b.requeue(r, vec![(Some("d".into()), index(11), 10, 11)]);
    let (out, gone) = drain_all(&mut b, 1);
    assert!(
        out.is_empty(),
        "nothing is written after the delete: {out:?}"
    );
    assert_eq!(gone, vec![11]);

    let mut b: Batcher<i64> = Batcher::new(limits(1000, 1, false), 0);
    b.add(Some("d".into()), upsert(r#"{"a":1}"#), 10, 1);
    b.add(Some("d".into()), upsert(r#"{"a":2,"b":2}"#), 10, 2);
    let (id, _) = sent_with_id(&mut b, 0, true).unwrap();
    b.on_response(id, Response::Items(vec![refused(), ok()]), 1, 0.5);
    let (r, _, _, _) = refusal_with_failure(&mut b);
    // A replacement that sets a field the written action does not: out of order.
    b.requeue(
        r,
        vec![(Some("d".into()), upsert(r#"{"a":1,"c":1}"#), 10, 11)],
    );
    assert!(matches!(
        b.drain_resolved().as_slice(),
        [Resolution::Fatal(11, _)]
    ));
    assert_eq!(b.pending(), 0);
}

/// Several replacements on the refused action's document take its place in the
/// order given, and count as queued (actions and bytes) like any added action.
#[test]
fn replacements_keep_their_order_and_count_as_queued() {
    let mut b = Batcher::new(bytes_25(false), 0);
    b.add(Some("d".into()), TestEffect::Opaque, 1, 1);
    let (id, _) = b.next_request(0, true).unwrap();
    b.add(Some("d".into()), TestEffect::Opaque, 1, 2);
    b.on_response(id, Response::Items(vec![refused()]), 0, 0.5);
    let (r, _, _) = refusal(&mut b);
    assert_eq!(b.queued(), 1);
    b.requeue(
        r,
        vec![
            (Some("d".into()), TestEffect::Opaque, 10, 11),
            (Some("d".into()), TestEffect::Opaque, 10, 12),
        ],
    );
    assert_eq!((b.queued(), b.pending(), b.bytes()), (3, 3, 21));
    assert_eq!(sent(&mut b, 1, false), None, "21 bytes queued, under 25");
    b.add(Some("e".into()), TestEffect::Opaque, 4, 3);
    let (id, p) = b.next_request(1, false).expect("25 bytes queued");
    assert_eq!(p, vec![&11, &3]);
    b.on_response(id, Response::Items(vec![ok(), ok()]), 1, 0.5);
    let mut order = vec![];
    while let Some((id, p)) = b.next_request(1, true) {
        order.extend(p.iter().copied().copied());
        let n = p.len();
        b.on_response(id, Response::Items(vec![ok(); n]), 1, 0.5);
    }
    assert_eq!(order, vec![12, 2], "d: 11, 12, then 2");
}

/// [1, 2 rejected with 429, 3 refused] in one request, 4 queued behind: the
/// replacement for 3 takes exactly 3's place, after the retried 1 and 2 and before 4.
#[test]
fn a_replacement_takes_the_place_of_a_refused_action_behind_retried_ones() {
    let mut b = Batcher::new(limits(1000, 1, false), 0);
    for v in 1..=3 {
        b.add(Some("d".into()), REPLACE, 10, v);
    }
    let (id, p) = b.next_request(0, true).unwrap();
    assert_eq!(p, vec![&1, &2, &3]);
    b.add(Some("d".into()), REPLACE, 10, 4);
    b.on_response(
        id,
        Response::Items(vec![too_many(), too_many(), refused()]),
        0,
        0.0,
    );
    let (r, payload, _) = refusal(&mut b);
    assert_eq!(payload, 3);
    b.requeue(r, vec![(Some("d".into()), REPLACE, 10, 33)]);
    assert_eq!(sent(&mut b, 5, true), Some(vec![1, 2, 33, 4]));
}

/// Set aside actions that did not supersede each other (an upsert of a, then of b,
/// both replaced by a full write) go back both, in their order.
#[test]
fn what_goes_back_keeps_its_order() {
    let mut b = Batcher::new(limits(1000, 1, true), 0);
    b.add(Some("k".into()), upsert(r#"{"a":1}"#), 10, 1);
    b.add(Some("k".into()), upsert(r#"{"b":1}"#), 10, 2);
    b.add(Some("k".into()), REPLACE, 10, 3);
    assert_eq!(b.queued(), 1);
    assert_eq!(round(&mut b, 0, refused), vec![3]);
    settle(&mut b);
    assert_eq!(
        round(&mut b, 0, ok),
        vec![1],
        "2 does not cover 1: two requests"
    );
    assert_eq!(round(&mut b, 0, ok), vec![2]);
    assert_eq!(b.pending(), 0);
}

/// The failure handler's replacement for a refused action goes after what that
/// action had set aside, which goes back first, when it does not supersede it.
#[test]
fn a_replacement_goes_after_what_the_refused_action_set_aside() {
    let mut b = Batcher::new(limits(1000, 1, true), 0);
    b.add(Some("k".into()), REPLACE, 10, 1);
    b.add(Some("k".into()), REPLACE, 10, 2);
    assert_eq!(round(&mut b, 0, refused), vec![2]);
    let Some(Resolution::Refused { refusal, .. }) = b.drain_resolved().pop() else {
        panic!("a refusal");
    };
    b.requeue(
        refusal,
        vec![(Some("k".into()), TestEffect::Opaque, 10, 22)],
    );
    assert_eq!(b.set_aside(), 0);
    assert_eq!(round(&mut b, 0, ok), vec![1]);
    assert_eq!(round(&mut b, 0, ok), vec![22]);
    assert_eq!(b.pending(), 0);
}
