//! Coalescing: a queued action a newer one supersedes is set aside, not sent, and is
//! resolved when its successor is written; a refused successor gives back what it set
//! aside.

use super::*;

/// Only the latest write of a hot document is sent; the ones it replaced stay
/// pending (and held) until it is written, and are resolved as coalesced then.
#[test]
fn hot_document_writes_coalesce_to_the_latest() {
    let mut b = Batcher::new(limits(1000, 1, true), 0);
    for v in 0..100 {
        b.add(Some("d".into()), index(v), 10, v);
    }
    assert_eq!((b.queued(), b.pending(), b.bytes()), (1, 100, 1000));
    assert!(
        b.drain_resolved().is_empty(),
        "nothing resolved before a write"
    );
    let (id, payloads) = b.next_request(0, true).unwrap();
    assert_eq!(payloads, vec![&99]);
    assert_eq!(
        b.pending(),
        100,
        "in flight: the others may still be needed"
    );
    b.on_response(id, Response::Items(vec![ok()]), 1, 0.5);
    assert_eq!((b.pending(), b.bytes()), (0, 0));
    assert_eq!(b.counters().coalesced, 99);
    let (mut written, mut coalesced) = (vec![], vec![]);
    for r in b.drain_resolved() {
        match r {
            Resolution::Written(v) => written.push(v),
            Resolution::Coalesced(v) => coalesced.push(v),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(written, vec![99]);
    coalesced.sort();
    assert_eq!(coalesced, (0..99).collect::<Vec<_>>());
}

#[test]
fn without_coalescing_a_superseding_chain_shares_one_request() {
    let mut b = Batcher::new(limits(1000, 1, false), 0);
    for v in 0..5 {
        b.add(Some("d".into()), index(v), 10, v);
    }
    let (id, payloads) = b.next_request(0, true).unwrap();
    assert_eq!(
        payloads.len(),
        5,
        "one request carries the document's chain"
    );
    // The first three are rejected with 429, the last two written: nothing is retried.
    let items = vec![too_many(), too_many(), too_many(), ok(), too_many()];
    b.on_response(id, Response::Items(items), 1, 0.5);
    assert_eq!(b.counters().superseded, 3);
    assert_eq!(
        b.pending(),
        1,
        "the last one failed after the write: retried"
    );
}

/// A coalesced action leaves the queued bytes: the byte trigger counts what is
/// queued, not what was ever added.
#[test]
fn a_coalesced_action_no_longer_counts_toward_the_byte_trigger() {
    let mut b = Batcher::new(bytes_25(true), 0);
    b.add(Some("a".into()), REPLACE, 10, 1);
    b.add(Some("b".into()), REPLACE, 10, 2);
    b.add(Some("b".into()), REPLACE, 10, 3);
    assert_eq!(
        (b.queued(), b.bytes()),
        (2, 30),
        "2 is set aside, still held"
    );
    assert_eq!(sent(&mut b, 1, false), None, "20 bytes queued, under 25");
    b.add(Some("c".into()), REPLACE, 5, 4);
    assert_eq!(
        sent(&mut b, 1, false),
        Some(vec![1, 3, 4]),
        "25 bytes queued"
    );
}

/// Actions without an id have no order to keep: none is coalesced into another,
/// and none waits for another, queued together or one in flight.
#[test]
fn actions_without_an_id_never_wait_for_or_replace_each_other() {
    let mut b = Batcher::new(limits(1000, 2, true), 0);
    b.add(None, REPLACE, 10, 1);
    b.add(None, REPLACE, 10, 2);
    assert_eq!(b.counters().coalesced, 0);
    assert_eq!(sent(&mut b, 0, true), Some(vec![1, 2]), "one request");
    b.add(None, TestEffect::Opaque, 10, 3);
    assert_eq!(
        sent(&mut b, 0, true),
        Some(vec![3]),
        "sent while 1 and 2 are in flight"
    );
    assert_eq!(b.pending(), 3);
}

/// With coalescing, a retry whose document has a newer superseding action queued
/// behind it is not resent: only the newer action goes, and the retry is resolved
/// as superseded once that is written.
#[test]
fn a_retry_that_the_queued_action_behind_it_supersedes_is_not_resent() {
    let mut b = Batcher::new(limits(1000, 1, true), 0);
    b.add(Some("d".into()), REPLACE, 10, 1);
    let (id, _) = b.next_request(0, true).unwrap();
    b.add(Some("d".into()), REPLACE, 10, 2);
    b.on_response(id, Response::Items(vec![too_many()]), 0, 0.0);
    let (id, p) = b.next_request(5, true).unwrap();
    assert_eq!(p, vec![&2]);
    assert!(b.drain_resolved().is_empty(), "not before 2 is written");
    assert_eq!(b.pending(), 2);
    b.on_response(id, Response::Items(vec![ok()]), 5, 0.0);
    assert_eq!(b.counters().superseded, 1);
    assert!(matches!(
        b.drain_resolved().as_slice(),
        [Resolution::Written(2), Resolution::Superseded(1)]
    ));
    assert_eq!((b.pending(), b.bytes()), (0, 0));
}

/// The reviewer's case, for each kind of pair that coalesces (a full write over a
/// full write, a covering merge, external versions, a delete, a write over a
/// merge): the newer action is refused and dead-lettered; the older one is written
/// then, and until it is, it is pending.
#[test]
fn a_refused_write_falls_back_to_the_write_it_coalesced() {
    let pairs = [
        (REPLACE, REPLACE),
        (upsert(r#"{"n":1}"#), upsert(r#"{"n":"x"}"#)),
        (
            TestEffect::Replace { version: Some(1) },
            TestEffect::Replace { version: Some(2) },
        ),
        (REPLACE, TestEffect::Delete { version: None }),
        (upsert(r#"{"n":1}"#), REPLACE),
    ];
    for (older, newer) in pairs {
        let what = format!("{newer:?} over {older:?}");
        assert!(newer.supersedes(&older), "{what}");
        let mut b = Batcher::new(limits(1000, 1, true), 0);
        b.add(Some("k".into()), older, 10, 1);
        b.add(Some("k".into()), newer, 10, 2);
        assert_eq!((b.queued(), b.pending(), b.bytes()), (1, 2, 20), "{what}");
        assert_eq!(round(&mut b, 0, refused), vec![2], "{what}");
        let (refused, written, gone) = settle(&mut b);
        assert_eq!(refused, vec![2], "{what}: the refused one is dead-lettered");
        assert!(written.is_empty() && gone.is_empty(), "{what}");
        assert_eq!(
            (b.pending(), b.bytes()),
            (1, 10),
            "{what}: 1 is still to write"
        );
        assert_eq!(
            round(&mut b, 0, ok),
            vec![1],
            "{what}: 1 is sent in 2's place"
        );
        assert_eq!(settle(&mut b), (vec![], vec![1], vec![]), "{what}");
        assert_eq!((b.pending(), b.bytes()), (0, 0), "{what}");
    }
}

/// c over b over a: c refused, b and a go back at once, in one request (b
/// supersedes a). Each refusal reaches the failure handler (its dead letter is
/// written), and pending stays above 0 until they are all settled; a written b
/// does not make a refused a moot (as without coalescing, a is dead-lettered).
#[test]
fn a_refused_chain_goes_back_whole_in_one_request() {
    let mut b = Batcher::new(limits(1000, 1, true), 0);
    for v in 1..=3 {
        b.add(Some("k".into()), REPLACE, 10, v);
    }
    assert_eq!((b.queued(), b.set_aside()), (1, 2));
    assert_eq!(round(&mut b, 0, refused), vec![3]);
    assert_eq!(settle(&mut b).0, vec![3]);
    assert_eq!((b.queued(), b.set_aside(), b.pending()), (2, 0, 2));
    b.add(Some("k".into()), REPLACE, 10, 4);
    assert_eq!(
        (b.queued(), b.set_aside()),
        (3, 0),
        "what went back is not set aside again"
    );
    let (id, p) = b.next_request(0, true).unwrap();
    assert_eq!(p, vec![&1, &2, &4]);
    b.on_response(
        id,
        Response::Items(vec![refused(), ok(), refused()]),
        0,
        0.0,
    );
    assert_eq!(settle(&mut b), (vec![1, 4], vec![2], vec![]));
    assert_eq!((b.pending(), b.bytes()), (0, 0));
}

/// c over b over a, c written: b and a are coalesced, none of them sent.
#[test]
fn a_written_successor_resolves_its_whole_chain_as_coalesced() {
    let mut b = Batcher::new(limits(1000, 1, true), 0);
    for v in 1..=3 {
        b.add(Some("k".into()), REPLACE, 10, v);
    }
    assert_eq!(round(&mut b, 0, ok), vec![3]);
    let (refused, written, mut gone) = settle(&mut b);
    gone.sort();
    assert_eq!((refused, written, gone), (vec![], vec![3], vec![1, 2]));
    assert_eq!(b.counters().coalesced, 2);
    assert_eq!((b.pending(), b.bytes()), (0, 0));
}

/// A retry that came due and is queued again, then set aside by a newer write, is
/// counted as superseded (it was sent), not as coalesced.
#[test]
fn a_former_retry_set_aside_later_is_counted_as_superseded() {
    let mut b = Batcher::new(limits(1000, 1, true), 0);
    b.add(Some("k".into()), REPLACE, 10, 1);
    assert_eq!(round(&mut b, 0, too_many), vec![1]);
    assert!(b.next_request(50, false).is_none(), "due, queued, not sent");
    assert_eq!(b.queued(), 1);
    b.add(Some("k".into()), REPLACE, 10, 2);
    assert_eq!(b.set_aside(), 1);
    assert_eq!(round(&mut b, 50, ok), vec![2]);
    assert_eq!(settle(&mut b), (vec![], vec![2], vec![1]));
    let c = b.counters();
    assert_eq!((c.superseded, c.coalesced), (1, 0));
}

/// A replacement that supersedes what the refused action had set aside keeps it set
/// aside: moot once the replacement is written, back in its place if it is not.
#[test]
fn a_superseding_replacement_keeps_what_the_refused_action_set_aside() {
    for written in [true, false] {
        let mut b = Batcher::new(limits(1000, 1, true), 0);
        b.add(Some("k".into()), REPLACE, 10, 1);
        b.add(Some("k".into()), REPLACE, 10, 2);
        assert_eq!(round(&mut b, 0, refused), vec![2]);
        let Some(Resolution::Refused { refusal, .. }) = b.drain_resolved().pop() else {
            panic!("a refusal");
        };
        b.requeue(refusal, vec![(Some("k".into()), REPLACE, 10, 22)]);
        assert_eq!((b.set_aside(), b.pending()), (1, 2));
        if written {
            assert_eq!(round(&mut b, 0, ok), vec![22]);
            assert_eq!(settle(&mut b), (vec![], vec![22], vec![1]));
        } else {
            assert_eq!(round(&mut b, 0, refused), vec![22]);
            assert_eq!(settle(&mut b), (vec![22], vec![], vec![]));
            assert_eq!(round(&mut b, 0, ok), vec![1]);
            assert_eq!(settle(&mut b), (vec![], vec![1], vec![]));
        }
        assert_eq!(b.pending(), 0, "written={written}");
    }
}
