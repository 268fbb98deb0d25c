//! The bulk batcher of the Elasticsearch sink: the bulk kit's
//! ([`crate::kits::bulk::batcher`]) over what an Elasticsearch action does to
//! its document ([`Effect`]). The batcher's rules are tested in the kit; the model check
//! of every decision against an in-memory Elasticsearch is here, as it speaks of
//! Elasticsearch actions.

pub use super::coalesce::Effect;
pub use crate::kits::bulk::batcher::{
    DocKey, ItemFailure, ItemResult, Limits, Refusal, RequestId, Resolution, Response, Supersedes,
    INTAKE_REQUESTS, SET_ASIDE_REQUESTS,
};
#[cfg(test)]
use crate::kits::bulk::{Outcome, RequestOutcome};

/// The kit's batcher over Elasticsearch actions.
pub type Batcher<T> = crate::kits::bulk::batcher::Batcher<T, Effect>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::elasticsearch::action::{BulkAction, OpType};
    use crate::kits::bulk::batcher::tests::{limits, ok, refused, too_many};
    use proptest::prelude::*;
    use serde_json::{json, Value};
    use std::collections::HashMap;

    /// One action of the model: what it does to document `doc`.
    #[derive(Debug, Clone)]
    enum Kind {
        Index(i64),
        Upsert(Vec<(&'static str, i64)>),
        Delete,
        /// A write the server always refuses (a mapping error): an index, or an upsert
        /// of these fields, whose values do not fit the mapping. The failure handler
        /// dead-letters it.
        Poison(Option<Vec<&'static str>>),
    }

    /// The value the model's mapping refuses.
    const POISON: &str = "not a number";

    fn is_poison(a: &BulkAction) -> bool {
        let Some(body) = a.body.as_ref() else {
            return false;
        };
        let v: Value = serde_json::from_slice(body).unwrap();
        let fields = if a.op == OpType::Update {
            v["doc"].clone()
        } else {
            v
        };
        fields
            .as_object()
            .unwrap()
            .values()
            .any(|x| x == &json!(POISON))
    }

    #[derive(Debug, Clone)]
    enum How {
        AllOk,
        /// Everything applied, answered as `errors: false` is: without item results,
        /// unless an item was a conflict (a 409 is an error, so the items are read).
        NoErrors,
        /// Item i is rejected with 429 where bit i % 8 is set.
        Reject429(u8),
        Whole503,
        /// Applied by the server, but the response is lost (a connection error).
        DroppedAfterApply,
        TooLarge,
        /// Item i is refused (400) where bit i % 8 is set; the failure handler requeues
        /// the same action, in its place (it dead-letters a poison one, as always).
        Refuse(u8),
    }

    #[derive(Debug, Clone)]
    enum Step {
        Add(u8, Kind),
        Send(bool),
        Respond(usize, How),
        Tick(u64),
    }

    fn kind(versioned: bool) -> BoxedStrategy<Kind> {
        let fields = prop::collection::vec((prop_oneof![Just("a"), Just("b")], 0i64..9), 1..3);
        let poison_fields = prop::collection::vec(prop_oneof![Just("a"), Just("b")], 1..3);
        if versioned {
            prop_oneof![
                4 => (0i64..9).prop_map(Kind::Index),
                1 => Just(Kind::Delete),
                2 => Just(Kind::Poison(None)),
            ]
            .boxed()
        } else {
            prop_oneof![
                3 => (0i64..9).prop_map(Kind::Index),
                3 => fields.prop_map(Kind::Upsert),
                1 => Just(Kind::Delete),
                1 => Just(Kind::Poison(None)),
                1 => poison_fields.prop_map(|f| Kind::Poison(Some(f))),
            ]
            .boxed()
        }
    }

    fn step(versioned: bool) -> impl Strategy<Value = Step> {
        prop_oneof![
            5 => (0u8..4, kind(versioned)).prop_map(|(d, k)| Step::Add(d, k)),
            2 => any::<bool>().prop_map(Step::Send),
            3 => (0usize..4, prop_oneof![
                3 => Just(How::AllOk),
                2 => Just(How::NoErrors),
                2 => any::<u8>().prop_map(How::Reject429),
                1 => Just(How::Whole503),
                1 => Just(How::DroppedAfterApply),
                1 => Just(How::TooLarge),
                1 => any::<u8>().prop_map(How::Refuse),
            ]).prop_map(|(i, h)| Step::Respond(i, h)),
            1 => (0u64..200).prop_map(Step::Tick),
        ]
    }

    type Store = HashMap<String, (Value, Option<i64>)>;

    /// The size the model gives action `seq`: sizes differ, so that [`Batcher::bytes`]
    /// is checked against a sum, not a count.
    fn size(seq: usize) -> usize {
        10 + (seq * 7) % 23
    }

    /// The server: applies one action, answering as Elasticsearch would (a document
    /// that does not fit the mapping is refused before its version is compared).
    fn apply(store: &mut Store, a: &BulkAction) -> ItemResult {
        if is_poison(a) {
            return refused();
        }
        let doc = a.id.clone().unwrap();
        let body = || serde_json::from_slice::<Value>(a.body.as_ref().unwrap()).unwrap();
        let conflict = a.version.is_some_and(|v| {
            store
                .get(&doc)
                .is_some_and(|(_, cur)| cur.unwrap_or(-1) >= v)
        });
        let mut r = ok();
        if conflict {
            r.outcome = Outcome::AlreadyWritten;
            return r;
        }
        match a.op {
            OpType::Index => {
                store.insert(doc, (body(), a.version));
            }
            OpType::Delete => {
                store.remove(&doc);
            }
            OpType::Update => {
                let changes = body()["doc"].clone();
                let entry = store.entry(doc).or_insert((json!({}), None));
                for (k, v) in changes.as_object().unwrap() {
                    entry.0[k] = v.clone();
                }
            }
            OpType::Create => unreachable!(),
        }
        r
    }

    /// What the server applied: the actions it ever applied, and the latest place (in
    /// its document's history) of what it applied on each document.
    #[derive(Default)]
    struct Applied {
        /// By the action each one is a copy of (itself, or what the handler requeued it
        /// for): a requeued copy of an action that was applied, its response lost, is a
        /// replay of that action.
        ever: std::collections::HashSet<usize>,
        /// The original of each action (see `ever`).
        roots: Vec<usize>,
        /// The places applied on each document.
        placed: HashMap<String, Vec<usize>>,
        /// Originals applied by a request whose response was lost and not applied
        /// again since: the batcher sends them again, so a document passing behind one
        /// of them for a while is repaired when it is (the final store check holds).
        lost: std::collections::HashSet<usize>,
    }

    /// [`apply`], checking that each document's applied order only moves forward: an
    /// action applied for the first time comes after everything applied on its
    /// document (applying one again, a request retried after its response was lost,
    /// is the one exception, which the README states).
    fn apply_in_order(
        store: &mut Store,
        applied: &mut Applied,
        order: &[usize],
        actions: &[BulkAction],
        s: usize,
        response_lost: bool,
    ) -> ItemResult {
        let r = apply(store, &actions[s]);
        if r.outcome == Outcome::Done {
            let doc = actions[s].id.clone().unwrap();
            let at = order.iter().position(|&x| x == s).expect("a placed action");
            let root = applied.roots[s];
            let placed = applied.placed.entry(doc.clone()).or_default();
            if applied.ever.insert(root) {
                // Everything applied later on the document is sent again.
                let behind = placed
                    .iter()
                    .find(|&&p| p > at && !applied.lost.contains(&applied.roots[order[p]]));
                assert!(
                    behind.is_none(),
                    "action {s} (place {at}) applied on {doc} after place {behind:?}"
                );
            }
            placed.push(at);
            if response_lost {
                applied.lost.insert(root);
            } else {
                applied.lost.remove(&root);
            }
        }
        r
    }

    fn action(doc: u8, k: &Kind, version: Option<i64>) -> BulkAction {
        let id = format!("doc-{doc}");
        let mut a = match k {
            Kind::Index(v) => {
                BulkAction::index("i", Some(id), json!({ "v": v }).to_string().into_bytes())
            }
            Kind::Upsert(fields) => {
                let m: serde_json::Map<String, Value> = fields
                    .iter()
                    .map(|(f, v)| (f.to_string(), json!(v)))
                    .collect();
                BulkAction::upsert("i", id, Value::Object(m).to_string().as_bytes())
            }
            Kind::Delete => BulkAction {
                op: OpType::Delete,
                body: None,
                ..BulkAction::index("i", Some(id), Vec::new())
            },
            Kind::Poison(None) => BulkAction::index(
                "i",
                Some(id),
                json!({ "v": POISON }).to_string().into_bytes(),
            ),
            Kind::Poison(Some(fields)) => {
                let m: serde_json::Map<String, Value> = fields
                    .iter()
                    .map(|f| (f.to_string(), json!(POISON)))
                    .collect();
                BulkAction::upsert("i", id, Value::Object(m).to_string().as_bytes())
            }
        };
        a.version = version;
        a
    }

    fn run_model(
        steps: Vec<Step>,
        versioned: bool,
        max_actions: usize,
        max_in_flight: usize,
        coalesce: bool,
        one_per_document: bool,
    ) -> Result<(), TestCaseError> {
        let l = Limits {
            one_action_per_document: one_per_document,
            ..limits(max_actions, max_in_flight, coalesce)
        };
        let mut b: Batcher<usize> = Batcher::new(l, 0);
        // Each action ever sent (a requeued copy counts on its own).
        let mut sent: Vec<bool> = Vec::new();
        let mut actions: Vec<BulkAction> = Vec::new();
        let mut resolved: Vec<bool> = Vec::new();
        let mut store = Store::new();
        let mut requests: Vec<(RequestId, Vec<usize>)> = Vec::new();
        let mut now = 0;
        // The place of each action in its document's history: a requeued action takes
        // its refused predecessor's.
        let mut order: Vec<usize> = Vec::new();
        let mut applied = Applied::default();
        let drain = |b: &mut Batcher<usize>,
                     resolved: &mut Vec<bool>,
                     actions: &mut Vec<BulkAction>,
                     order: &mut Vec<usize>,
                     roots: &mut Vec<usize>|
         -> Result<(), TestCaseError> {
            loop {
                let batch = b.drain_resolved();
                if batch.is_empty() {
                    return Ok(());
                }
                for r in batch {
                    let seq = match r {
                        Resolution::Written(s) => {
                            prop_assert!(
                                !is_poison(&actions[s]),
                                "action {} is refused by the server, yet resolved as written",
                                s
                            );
                            s
                        }
                        Resolution::Coalesced(s) | Resolution::Superseded(s) => s,
                        Resolution::Refused {
                            refusal, payload, ..
                        } if is_poison(&actions[payload]) => {
                            // Dead-lettered: settled, the document as it was.
                            b.settle_refused(refusal);
                            payload
                        }
                        Resolution::Refused {
                            refusal, payload, ..
                        } => {
                            // The handler requeues the same action in its place.
                            let a = actions[payload].clone();
                            let new = actions.len();
                            actions.push(a.clone());
                            resolved.push(false);
                            roots.push(roots[payload]);
                            let at = order.iter().position(|&x| x == payload).unwrap();
                            order[at] = new;
                            b.requeue(
                                refusal,
                                vec![(a.id.clone(), Effect::of(&a), size(new), new)],
                            );
                            payload
                        }
                        other => return Err(TestCaseError::fail(format!("unexpected {other:?}"))),
                    };
                    prop_assert!(!resolved[seq], "action {} resolved twice", seq);
                    resolved[seq] = true;
                }
            }
        };
        // With one action per document, an action is sent only when every earlier
        // action of its document that was ever sent is resolved (written, or settled
        // by the handler: a dead letter acknowledged): a crash after the target applied
        // it can never leave an earlier refusal unacted on, so a 409 on the replay of
        // the earlier one truly means written or dead-lettered.
        let check_sent = |sent: &mut Vec<bool>,
                          resolved: &[bool],
                          actions: &[BulkAction],
                          order: &[usize],
                          seqs: &[usize]|
         -> Result<(), TestCaseError> {
            sent.resize(actions.len(), false);
            for &s in seqs {
                sent[s] = true;
            }
            if !one_per_document {
                return Ok(());
            }
            for &s in seqs {
                let at = order.iter().position(|&x| x == s).expect("a placed action");
                for &x in &order[..at] {
                    prop_assert!(
                        actions[x].id != actions[s].id || !sent[x] || resolved[x],
                        "action {} sent while the earlier action {} of its document was sent and not resolved",
                        s,
                        x
                    );
                }
            }
            Ok(())
        };
        let expected = |actions: &[BulkAction], order: &[usize]| {
            let mut s = Store::new();
            for &i in order {
                apply(&mut s, &actions[i]);
            }
            s
        };
        let respond = |b: &mut Batcher<usize>,
                       store: &mut Store,
                       applied: &mut Applied,
                       order: &[usize],
                       id: RequestId,
                       seqs: &[usize],
                       how: &How,
                       actions: &[BulkAction],
                       now: u64| {
            let mut apply = |store: &mut Store, s: usize, lost: bool| {
                apply_in_order(store, applied, order, actions, s, lost)
            };
            // Item i fails with `failure()` where bit i % 8 of `mask` is set; the others
            // are applied in order.
            let mut masked = |store: &mut Store, mask: u8, failure: fn() -> ItemResult| {
                Response::Items(
                    seqs.iter()
                        .enumerate()
                        .map(|(i, &s)| {
                            if mask & (1 << (i % 8)) != 0 {
                                failure()
                            } else {
                                apply(store, s, false)
                            }
                        })
                        .collect(),
                )
            };
            let response = match how {
                How::AllOk => {
                    Response::Items(seqs.iter().map(|&s| apply(store, s, false)).collect())
                }
                How::NoErrors => {
                    let items: Vec<ItemResult> =
                        seqs.iter().map(|&s| apply(store, s, false)).collect();
                    if items.iter().all(|i| i.outcome == Outcome::Done) {
                        Response::Written(items.len())
                    } else {
                        Response::Items(items)
                    }
                }
                How::Reject429(mask) => masked(store, *mask, too_many),
                How::Whole503 => Response::Failed(RequestOutcome::Retry, "503".into()),
                How::DroppedAfterApply => {
                    for &s in seqs {
                        apply(store, s, true);
                    }
                    Response::Failed(RequestOutcome::Retry, "connection closed".into())
                }
                How::TooLarge => Response::Failed(RequestOutcome::Split, "413".into()),
                How::Refuse(mask) => masked(store, *mask, refused),
            };
            b.on_response(id, response, now, 0.5);
        };
        for st in steps {
            match st {
                Step::Add(doc, k) => {
                    let seq = actions.len();
                    let a = action(doc, &k, versioned.then_some(seq as i64));
                    b.add(a.id.clone(), Effect::of(&a), size(seq), seq);
                    actions.push(a);
                    resolved.push(false);
                    applied.roots.push(seq);
                    order.push(seq);
                }
                Step::Send(force) => {
                    while let Some((id, p)) = b.next_request(now, force) {
                        let seqs: Vec<usize> = p.into_iter().copied().collect();
                        check_sent(&mut sent, &resolved, &actions, &order, &seqs)?;
                        requests.push((id, seqs));
                    }
                }
                Step::Respond(i, how) if !requests.is_empty() => {
                    let (id, seqs) = requests.remove(i % requests.len());
                    respond(
                        &mut b,
                        &mut store,
                        &mut applied,
                        &order,
                        id,
                        &seqs,
                        &how,
                        &actions,
                        now,
                    );
                }
                Step::Respond(..) => {}
                Step::Tick(ms) => now += ms,
            }
            drain(
                &mut b,
                &mut resolved,
                &mut actions,
                &mut order,
                &mut applied.roots,
            )?;
            let open = resolved.iter().filter(|r| !**r).count();
            prop_assert_eq!(b.pending(), open);
            // What buffer_max_bytes bounds: exactly the sizes of the unresolved actions.
            let held: usize = (0..resolved.len())
                .filter(|&s| !resolved[s])
                .map(size)
                .sum();
            prop_assert_eq!(b.bytes(), held);
            if b.pending() == 0 {
                prop_assert_eq!(
                    &store,
                    &expected(&actions, &order),
                    "pending is 0: everything is written"
                );
            }
        }
        // Quiesce: everything answered, retries come due.
        for _ in 0..10_000 {
            if b.pending() == 0 {
                break;
            }
            now += 1000;
            while let Some((id, p)) = b.next_request(now, true) {
                let seqs: Vec<usize> = p.into_iter().copied().collect();
                check_sent(&mut sent, &resolved, &actions, &order, &seqs)?;
                requests.push((id, seqs));
            }
            for (id, seqs) in std::mem::take(&mut requests) {
                respond(
                    &mut b,
                    &mut store,
                    &mut applied,
                    &order,
                    id,
                    &seqs,
                    &How::AllOk,
                    &actions,
                    now,
                );
            }
            drain(
                &mut b,
                &mut resolved,
                &mut actions,
                &mut order,
                &mut applied.roots,
            )?;
        }
        prop_assert_eq!(b.pending(), 0);
        prop_assert_eq!(b.bytes(), 0, "nothing held once everything is resolved");
        prop_assert!(resolved.iter().all(|r| *r));
        prop_assert_eq!(
            &store,
            &expected(&actions, &order),
            "the last write per document wins"
        );
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// For any interleaving of adds, sends and responses (success, per-item 429,
        /// whole-request failure, a response lost after the bulk was applied, 413, and
        /// writes the server always refuses, dead-lettered), with or without one action
        /// per document, the final documents equal applying every action in order (a
        /// refused one changing nothing), and `pending` is 0 exactly when everything is
        /// acknowledged.
        #[test]
        fn the_last_write_per_document_wins(
            steps in prop::collection::vec(step(false), 1..80),
            max_actions in 1usize..6,
            max_in_flight in 1usize..4,
            coalesce in any::<bool>(),
            one_per_document in any::<bool>(),
        ) {
            run_model(steps, false, max_actions, max_in_flight, coalesce, one_per_document)?;
        }

        /// The same with external versions (the record's offset), with and without one
        /// action per document (what the sink sets with external versions); with it,
        /// also: no action is sent while an earlier action of its document that was
        /// sent is unresolved.
        #[test]
        fn the_last_write_per_document_wins_with_external_versions(
            steps in prop::collection::vec(step(true), 1..80),
            max_actions in 1usize..6,
            max_in_flight in 1usize..4,
            coalesce in any::<bool>(),
            one_per_document in any::<bool>(),
        ) {
            run_model(steps, true, max_actions, max_in_flight, coalesce, one_per_document)?;
        }
    }
}
