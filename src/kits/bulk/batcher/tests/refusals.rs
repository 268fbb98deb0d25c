//! Refusals: a refused action keeps its document's place until the failure handler
//! settles it or replaces it, and a replacement never follows a later written action.

use super::*;

/// With one action per document (external versions), the chain goes one write per
/// request, and the write after a refused one is sent only once the failure
/// handler settled the refusal (its dead letter acknowledged); other documents
/// still share the request.
#[test]
fn with_one_action_per_document_a_refusal_is_settled_before_the_next_write_is_sent() {
    let l = Limits {
        one_action_per_document: true,
        ..limits(1000, 2, false)
    };
    let mut b = Batcher::new(l, 0);
    for v in 0..3 {
        b.add(Some("d".into()), index(v), 10, v);
    }
    b.add(Some("e".into()), index(9), 10, 9);
    let (id, payloads) = b.next_request(0, true).unwrap();
    assert_eq!(payloads, vec![&0, &9], "the first write of d, and e");
    assert!(
        b.next_request(0, true).is_none(),
        "d waits for its first write"
    );
    b.on_response(id, Response::Items(vec![refused(), ok()]), 1, 0.5);
    let mut resolved = b.drain_resolved();
    let refusal = match resolved.remove(0) {
        Resolution::Refused {
            refusal,
            payload: 0,
            ..
        } => refusal,
        other => panic!("{other:?}"),
    };
    assert!(matches!(resolved[..], [Resolution::Written(9)]));
    assert!(
        b.next_request(1, true).is_none(),
        "nothing of d is sent while the handler holds its refused write"
    );
    b.settle_refused(refusal);
    let (id, payloads) = b.next_request(1, true).unwrap();
    assert_eq!(payloads, vec![&1], "then the next write alone");
    b.on_response(id, Response::Items(vec![ok()]), 2, 0.5);
    let (_, payloads) = b.next_request(2, true).unwrap();
    assert_eq!(payloads, vec![&2]);
}

/// With one action per document and coalescing, a retried write is sent again, not
/// set aside by the queued write behind it: it may already have been refused, and
/// is resolved before anything later on its document is sent.
#[test]
fn with_one_action_per_document_a_retry_is_resent_not_set_aside() {
    let l = Limits {
        one_action_per_document: true,
        ..limits(1000, 1, true)
    };
    let mut b = Batcher::new(l, 0);
    b.add(Some("d".into()), index(0), 10, 0);
    let (id, _) = b.next_request(0, true).unwrap();
    b.add(Some("d".into()), index(1), 10, 1);
    b.on_response(id, Response::Items(vec![too_many()]), 1, 0.5);
    let (id, payloads) = b.next_request(10_000, true).unwrap();
    assert_eq!(payloads, vec![&0], "the retry, alone");
    b.on_response(id, Response::Items(vec![ok()]), 10_001, 0.5);
    let (_, payloads) = b.next_request(10_001, true).unwrap();
    assert_eq!(payloads, vec![&1]);
    assert_eq!(b.counters().superseded, 0);
}

#[test]
fn a_single_action_refused_as_too_large_goes_to_the_handler_and_then_releases_its_document() {
    let mut b = Batcher::new(limits(1000, 1, false), 0);
    b.add(Some("d".into()), TestEffect::Opaque, 10, 1);
    let (id, _) = sent_with_id(&mut b, 0, true).unwrap();
    b.add(Some("d".into()), TestEffect::Opaque, 10, 2);
    b.on_response(
        id,
        Response::Failed(RequestOutcome::Split, "413".into()),
        1,
        0.5,
    );
    let (r, payload, failure, attempts) = refusal_with_failure(&mut b);
    assert_eq!((payload, failure.status, attempts), (1, 413, 0));
    assert!(
        sent_with_id(&mut b, 1, true).is_none(),
        "d waits for the handler"
    );
    b.settle_refused(r);
    assert_eq!(b.pending(), 1);
    assert_eq!(
        sent_with_id(&mut b, 1, true).expect("d is free again").1,
        vec![2]
    );
}

#[test]
fn a_fatal_request_releases_its_documents() {
    let mut b = Batcher::new(limits(1000, 1, false), 0);
    b.add(Some("d".into()), TestEffect::Opaque, 10, 1);
    let (id, _) = sent_with_id(&mut b, 0, true).unwrap();
    b.add(Some("d".into()), TestEffect::Opaque, 10, 2);
    b.on_response(
        id,
        Response::Failed(RequestOutcome::Malformed, "400".into()),
        1,
        0.5,
    );
    assert!(matches!(
        b.drain_resolved().as_slice(),
        [Resolution::Fatal(1, _)]
    ));
    assert_eq!(sent_with_id(&mut b, 1, true).unwrap().1, vec![2]);
}

/// A replacement counts the attempts of the action it replaces plus one, so a
/// document the handler keeps replacing reports how often it was tried.
#[test]
fn replacements_count_the_attempts_of_what_they_replace() {
    let mut b = Batcher::new(limits(1000, 1, false), 0);
    b.add(Some("d".into()), TestEffect::Opaque, 10, 1);
    let mut payload = 1;
    for want_attempts in 0..3 {
        let (id, p) = b.next_request(0, true).unwrap();
        assert_eq!(p, vec![&payload]);
        b.on_response(id, Response::Items(vec![refused()]), 0, 0.5);
        let (r, got, attempts) = refusal(&mut b);
        assert_eq!((got, attempts), (payload, want_attempts));
        payload += 1;
        b.requeue(r, vec![(Some("d".into()), TestEffect::Opaque, 10, payload)]);
    }
    assert_eq!(b.pending(), 1);
}

/// A replacement that a later written action supersedes is counted as superseded.
#[test]
fn a_superseded_replacement_is_counted() {
    let mut b = Batcher::new(limits(1000, 1, false), 0);
    b.add(Some("d".into()), REPLACE, 10, 1);
    b.add(Some("d".into()), REPLACE, 10, 2);
    let (id, _) = b.next_request(0, true).unwrap();
    b.on_response(id, Response::Items(vec![refused(), ok()]), 1, 0.5);
    let (r, _, _) = refusal(&mut b);
    assert_eq!(b.counters().superseded, 0);
    b.requeue(r, vec![(Some("d".into()), REPLACE, 10, 11)]);
    assert_eq!(b.counters().superseded, 1);
    assert!(matches!(
        b.drain_resolved().as_slice(),
        [Resolution::Superseded(11)]
    ));
    assert_eq!((b.pending(), b.bytes()), (0, 0));
}

/// 2 set aside 1, was sent, possibly applied (its response lost) and refused on the
/// retry. Its replacement supersedes 1, which is not sent before it: 1 after a
/// possibly applied 2 would regress the document. Should the replacement be
/// dead-lettered, 1 goes back (see [`Batcher::settle_refused`]).
#[test]
fn what_a_possibly_applied_refused_action_set_aside_is_not_sent_before_its_replacement() {
    for written in [true, false] {
        let mut b = Batcher::new(limits(1000, 1, true), 0);
        b.add(Some("k".into()), REPLACE, 10, 1);
        b.add(Some("k".into()), REPLACE, 10, 2);
        let (id, p) = b.next_request(0, true).unwrap();
        assert_eq!(p, vec![&2]);
        b.on_response(
            id,
            Response::Failed(RequestOutcome::Retry, "connection closed".into()),
            0,
            0.0,
        );
        assert_eq!(round(&mut b, 100_000, refused), vec![2]);
        let Some(Resolution::Refused { refusal, .. }) = b.drain_resolved().pop() else {
            panic!("a refusal");
        };
        b.requeue(refusal, vec![(Some("k".into()), REPLACE, 10, 22)]);
        // A newer write setting the replacement aside keeps 1 under it.
        b.add(Some("k".into()), REPLACE, 10, 3);
        assert_eq!(b.set_aside(), 2);
        assert_eq!(round(&mut b, 100_000, refused), vec![3]);
        assert_eq!(settle(&mut b), (vec![3], vec![], vec![]));
        if written {
            assert_eq!(round(&mut b, 100_000, ok), vec![22]);
            assert_eq!(settle(&mut b), (vec![], vec![22], vec![1]));
        } else {
            assert_eq!(round(&mut b, 100_000, refused), vec![22]);
            assert_eq!(settle(&mut b), (vec![22], vec![], vec![]));
            assert_eq!(round(&mut b, 100_000, ok), vec![1]);
            assert_eq!(settle(&mut b), (vec![], vec![1], vec![]));
        }
        assert_eq!(b.pending(), 0, "written={written}");
    }
}

/// [4 (which set aside 3), 5] in one request, 4 refused and 5 written: 5 supersedes
/// 4 and so 3; 3 is moot, never sent.
#[test]
fn a_refusal_overtaken_by_a_later_write_leaves_what_it_set_aside_moot() {
    let mut b = overtaken(refused());
    let (refused, written, gone) = settle(&mut b);
    assert_eq!((refused, written, gone), (vec![4], vec![5], vec![3]));
    assert_eq!((b.pending(), b.bytes()), (0, 0));
    assert!(b.next_request(0, true).is_none(), "3 is never sent");
}

/// The same with 4 answered 403 (the job fails): 3 does not go back behind the
/// written 5, where it would overwrite it.
#[test]
fn a_fatal_item_overtaken_by_a_later_write_leaves_what_it_set_aside_moot() {
    let forbidden = ItemResult {
        outcome: Outcome::Fatal,
        failure: ItemFailure {
            status: 403,
            error_type: "security_exception".into(),
            reason: "no".into(),
        },
    };
    let mut b = overtaken(forbidden);
    let r = b.drain_resolved();
    assert!(
        matches!(
            r.as_slice(),
            [
                Resolution::Coalesced(3),
                Resolution::Fatal(4, _),
                Resolution::Written(5)
            ]
        ),
        "{r:?}"
    );
    assert_eq!(
        (b.pending(), b.queued()),
        (0, 0),
        "3 is not queued behind 5"
    );
}

/// A successor that fails the job (a fatal response, retries exhausted) puts what
/// it set aside back; the failing processor's `clear_unsent` drops it and counts it,
/// with what queued actions set aside. Nothing of it is resolved as written.
#[test]
fn set_aside_actions_of_a_failed_successor_are_dropped_not_written() {
    let mut b = Batcher::new(limits(1000, 1, true), 0);
    b.add(Some("k".into()), REPLACE, 10, 1);
    b.add(Some("k".into()), REPLACE, 10, 2);
    let (id, _) = b.next_request(0, true).unwrap();
    b.on_response(
        id,
        Response::Failed(RequestOutcome::Fatal, "401".into()),
        0,
        0.0,
    );
    assert!(matches!(
        b.drain_resolved().as_slice(),
        [Resolution::Fatal(2, _)]
    ));
    assert_eq!((b.queued(), b.pending()), (1, 1), "1 is back, queued");
    b.add(Some("j".into()), REPLACE, 10, 3);
    b.add(Some("j".into()), REPLACE, 10, 4);
    assert_eq!(b.clear_unsent(), 3, "1, 3 and 4 (set aside by 4)");
    assert!(b.drain_resolved().is_empty(), "none written");
    assert_eq!((b.pending(), b.bytes()), (0, 0));

    let mut l = limits(1000, 1, true);
    l.retry_max_attempts = 0;
    let mut b = Batcher::new(l, 0);
    b.add(Some("k".into()), REPLACE, 10, 1);
    b.add(Some("k".into()), REPLACE, 10, 2);
    assert_eq!(round(&mut b, 0, too_many), vec![2]);
    assert!(matches!(
        b.drain_resolved().as_slice(),
        [Resolution::Exhausted(2, _)]
    ));
    assert_eq!(b.pending(), 1);
    assert_eq!(b.clear_unsent(), 1);
    assert_eq!(b.pending(), 0);
}

/// The reviewer's case: one document whose every write breaks the mapping, written
/// 1000 times through a processor that takes actions while the intake limit allows.
/// Every write is dead-lettered, within about as many requests as the writes fill
/// (not one request per write), and what is queued or set aside never passes the
/// intake limit.
#[test]
fn a_refused_hot_document_is_dead_lettered_in_few_requests_with_a_bounded_backlog() {
    const WRITES: i64 = 10_000;
    const MAX_ACTIONS: usize = 100;
    let mut b = Batcher::new(limits(MAX_ACTIONS, 1, true), 0);
    let (mut added, mut requests, mut dead, mut backlog) = (0, 0, 0, 0);
    for _ in 0..100_000 {
        while added < WRITES && intake_open(&b) {
            added += 1;
            b.add(Some("hot".into()), REPLACE, 10, added);
        }
        // Nothing in flight: what is pending is queued or set aside.
        backlog = backlog.max(b.pending());
        let force = added == WRITES;
        while let Some((id, p)) = b.next_request(0, force) {
            requests += 1;
            let n = p.len();
            b.on_response(id, Response::Items(vec![refused(); n]), 0, 0.0);
            for r in b.drain_resolved() {
                match r {
                    Resolution::Refused { refusal, .. } => {
                        dead += 1;
                        b.settle_refused(refusal);
                    }
                    other => panic!("only refusals: {other:?}"),
                }
            }
        }
        if added == WRITES && b.pending() == 0 {
            break;
        }
    }
    assert_eq!(
        (dead, b.pending()),
        (WRITES, 0),
        "every write dead-lettered"
    );
    let bound = WRITES as usize / MAX_ACTIONS + 3;
    let held = (INTAKE_REQUESTS + SET_ASIDE_REQUESTS) * MAX_ACTIONS;
    assert!(
        requests <= bound && backlog <= held,
        "{requests} requests for {WRITES} refused writes (at most {bound}); \
             {backlog} actions queued or set aside at most (at most {held})"
    );
}
