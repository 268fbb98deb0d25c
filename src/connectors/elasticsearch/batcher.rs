//! The bulk batcher of the Elasticsearch sink: the bulk kit's
//! ([`crate::kits::bulk::batcher`]) over what an Elasticsearch action does to
//! its document ([`Effect`]). Its tests, and the model check of every decision against
//! an in-memory Elasticsearch, are here: they speak of Elasticsearch actions.

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
    use proptest::prelude::*;
    use serde_json::{json, Value};
    use std::collections::HashMap;

    pub(super) fn limits(max_actions: usize, max_in_flight: usize, coalesce: bool) -> Limits {
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

    pub(super) fn ok() -> ItemResult {
        ItemResult {
            outcome: Outcome::Done,
            failure: ItemFailure {
                status: 200,
                error_type: String::new(),
                reason: String::new(),
            },
        }
    }

    pub(super) fn too_many() -> ItemResult {
        ItemResult {
            outcome: Outcome::Retry,
            failure: ItemFailure {
                status: 429,
                error_type: "es_rejected_execution_exception".into(),
                reason: "queue full".into(),
            },
        }
    }

    pub(super) fn refused() -> ItemResult {
        ItemResult {
            outcome: Outcome::Rejected,
            failure: ItemFailure {
                status: 400,
                error_type: "mapper_parsing_exception".into(),
                reason: "failed to parse".into(),
            },
        }
    }

    fn index(v: i64) -> BulkAction {
        BulkAction::index(
            "i",
            Some("d".into()),
            json!({ "v": v }).to_string().into_bytes(),
        )
    }

    #[test]
    fn a_request_written_whole_resolves_every_action_and_a_miscount_retries_it() {
        let mut b = Batcher::new(limits(1000, 2, false), 0);
        for v in 0..3 {
            b.add(Some(format!("d{v}")), Effect::Opaque, 10, v);
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

    /// Only the latest write of a hot document is sent; the ones it replaced stay
    /// pending (and held) until it is written, and are resolved as coalesced then.
    #[test]
    fn hot_document_writes_coalesce_to_the_latest() {
        let mut b = Batcher::new(limits(1000, 1, true), 0);
        for v in 0..100 {
            b.add(Some("d".into()), Effect::of(&index(v)), 10, v);
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
            b.add(Some("d".into()), Effect::of(&index(v)), 10, v);
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
            b.add(Some("d".into()), Effect::of(&index(v)), 10, v);
        }
        b.add(Some("e".into()), Effect::of(&index(9)), 10, 9);
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
        b.add(Some("d".into()), Effect::of(&index(0)), 10, 0);
        let (id, _) = b.next_request(0, true).unwrap();
        b.add(Some("d".into()), Effect::of(&index(1)), 10, 1);
        b.on_response(id, Response::Items(vec![too_many()]), 1, 0.5);
        let (id, payloads) = b.next_request(10_000, true).unwrap();
        assert_eq!(payloads, vec![&0], "the retry, alone");
        b.on_response(id, Response::Items(vec![ok()]), 10_001, 0.5);
        let (_, payloads) = b.next_request(10_001, true).unwrap();
        assert_eq!(payloads, vec![&1]);
        assert_eq!(b.counters().superseded, 0);
    }

    #[test]
    fn an_action_waits_while_its_document_is_in_flight() {
        let mut b = Batcher::new(limits(1000, 2, true), 0);
        let scripted = |n| BulkAction {
            op: OpType::Update,
            body: Some(format!(r#"{{"script":"ctx._source.n += {n}"}}"#).into_bytes()),
            ..index(0)
        };
        b.add(Some("d".into()), Effect::of(&scripted(1)), 10, 1);
        let (first, _) = b.next_request(0, true).unwrap();
        b.add(Some("d".into()), Effect::of(&scripted(2)), 10, 2);
        b.add(Some("e".into()), Effect::of(&scripted(3)), 10, 3);
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
            b.add(Some("d".into()), Effect::of(&index(v)), 10, v);
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

/// Cases found by review: each kills a mistake the model test did not see.
#[cfg(test)]
mod review_tests {
    use super::tests::{limits, ok, refused, too_many};
    use super::*;
    use crate::connectors::elasticsearch::action::BulkAction;
    use bytes::Bytes;
    use serde_json::json;

    fn index(v: i64) -> Effect {
        Effect::of(&BulkAction::index(
            "i",
            Some("d".into()),
            json!({ "v": v }).to_string().into_bytes(),
        ))
    }
    fn sent(b: &mut Batcher<i64>, now: u64, force: bool) -> Option<(RequestId, Vec<i64>)> {
        b.next_request(now, force)
            .map(|(id, p)| (id, p.into_iter().copied().collect()))
    }
    /// Takes the one refusal among the resolutions.
    fn refusal(b: &mut Batcher<i64>) -> (Refusal, i64, ItemFailure, u32) {
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
            while let Some((id, p)) = sent(b, now, true) {
                out.extend(&p);
                b.on_response(id, Response::Items(vec![ok(); p.len()]), now, 0.5);
            }
        }
        (out, gone)
    }

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
            b.add(Some(doc.into()), Effect::Opaque, bytes, v);
        }
        let mut got = vec![];
        while let Some((_, p)) = sent(&mut b, 0, true) {
            got.push(p);
        }
        assert_eq!(got, vec![vec![1, 2], vec![3], vec![4]]);
    }

    #[test]
    fn a_single_action_refused_as_too_large_goes_to_the_handler_and_then_releases_its_document() {
        let mut b = Batcher::new(limits(1000, 1, false), 0);
        b.add(Some("d".into()), Effect::Opaque, 10, 1);
        let (id, _) = sent(&mut b, 0, true).unwrap();
        b.add(Some("d".into()), Effect::Opaque, 10, 2);
        b.on_response(
            id,
            Response::Failed(RequestOutcome::Split, "413".into()),
            1,
            0.5,
        );
        let (r, payload, failure, attempts) = refusal(&mut b);
        assert_eq!((payload, failure.status, attempts), (1, 413, 0));
        assert!(sent(&mut b, 1, true).is_none(), "d waits for the handler");
        b.settle_refused(r);
        assert_eq!(b.pending(), 1);
        assert_eq!(sent(&mut b, 1, true).expect("d is free again").1, vec![2]);
    }

    #[test]
    fn an_unforced_batch_waits_for_its_trigger_and_the_wake_says_when() {
        let mut b = Batcher::new(limits(3, 1, false), 0);
        b.add(Some("a".into()), Effect::Opaque, 10, 1);
        assert!(
            sent(&mut b, 10, false).is_none(),
            "not due before the interval"
        );
        assert_eq!(b.next_wake_ms(), Some(1000));
        let (id, p) = sent(&mut b, 1000, false).expect("due at the interval");
        assert_eq!(p, vec![1]);
        assert_eq!(b.next_wake_ms(), None, "nothing sendable, nothing to retry");
        b.on_response(id, Response::Items(vec![too_many()]), 1005, 0.0);
        assert_eq!(b.next_wake_ms(), Some(1010), "the retry's due time");
        for v in 2..5 {
            b.add(Some(format!("k{v}")), Effect::Opaque, 10, v);
        }
        assert_eq!(
            sent(&mut b, 1006, false).expect("max_actions queued").1,
            vec![2, 3, 4]
        );
    }

    #[test]
    fn clear_unsent_drops_everything_not_in_flight_and_frees_the_documents() {
        let mut b = Batcher::new(limits(1000, 2, false), 0);
        b.add(Some("d".into()), Effect::Opaque, 10, 1);
        b.add(Some("e".into()), Effect::Opaque, 10, 2);
        let (id, _) = sent(&mut b, 0, true).unwrap();
        b.on_response(id, Response::Items(vec![too_many(), ok()]), 1, 0.5);
        b.add(Some("d".into()), Effect::Opaque, 10, 3);
        b.add(Some("f".into()), Effect::Opaque, 10, 4);
        let (in_flight, p) = sent(&mut b, 1, true).unwrap();
        assert_eq!(p, vec![4]);
        b.add(Some("f".into()), Effect::Opaque, 10, 5);
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
        b.add(Some("d".into()), Effect::Opaque, 10, 6);
        assert_eq!(sent(&mut b, 3, true).expect("d is free").1, vec![6]);
    }

    #[test]
    fn retries_are_bounded() {
        let mut l = limits(1000, 1, false);
        l.retry_max_attempts = 2;
        let mut b = Batcher::new(l, 0);
        b.add(Some("d".into()), Effect::Opaque, 10, 1);
        for now in [0, 1000, 2000] {
            assert!(b.drain_resolved().is_empty());
            let (id, _) = sent(&mut b, now, true).unwrap();
            b.on_response(id, Response::Items(vec![too_many()]), now, 0.5);
        }
        assert!(matches!(
            b.drain_resolved().as_slice(),
            [Resolution::Exhausted(1, _)]
        ));
        assert_eq!(b.pending(), 0);
    }

    #[test]
    fn a_requeued_action_goes_before_later_actions_and_is_not_coalesced_into_them() {
        for coalesce in [false, true] {
            let mut b = Batcher::new(limits(1000, 1, coalesce), 0);
            b.add(Some("d".into()), index(1), 10, 1);
            let (id, _) = sent(&mut b, 0, true).unwrap();
            b.add(Some("d".into()), index(2), 10, 2);
            b.on_response(id, Response::Items(vec![refused()]), 1, 0.5);
            let (r, payload, _, _) = refusal(&mut b);
            assert_eq!(payload, 1);
            b.requeue(r, vec![(Some("d".into()), index(11), 10, 11)]);
            assert_eq!(
                sent(&mut b, 1, true).unwrap().1,
                vec![11, 2],
                "coalesce={coalesce}"
            );
            assert!(b.drain_resolved().is_empty(), "nothing coalesced");
        }
    }

    #[test]
    fn a_fatal_request_releases_its_documents() {
        let mut b = Batcher::new(limits(1000, 1, false), 0);
        b.add(Some("d".into()), Effect::Opaque, 10, 1);
        let (id, _) = sent(&mut b, 0, true).unwrap();
        b.add(Some("d".into()), Effect::Opaque, 10, 2);
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
        assert_eq!(sent(&mut b, 1, true).unwrap().1, vec![2]);
    }

    #[test]
    fn a_retriable_failure_before_a_refused_action_is_retried() {
        let mut b = Batcher::new(limits(1000, 1, false), 0);
        b.add(Some("d".into()), index(1), 10, 1);
        b.add(Some("d".into()), index(2), 10, 2);
        let (id, p) = sent(&mut b, 0, true).unwrap();
        assert_eq!(p, vec![1, 2]);
        b.on_response(id, Response::Items(vec![too_many(), refused()]), 1, 0.5);
        let (r, payload, _, _) = refusal(&mut b);
        assert_eq!(payload, 2);
        b.settle_refused(r);
        assert_eq!(b.pending(), 1, "1 was not written: it awaits a retry");
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
                let (id, _) = sent(&mut b, 0, true).unwrap();
                b.add(Some("d".into()), index(2), 10, 2);
                b.on_response(id, Response::Items(vec![refused()]), 0, 0.5);
                let (r, _, _, _) = refusal(&mut b);
                b.requeue(r, vec![(Some("d".into()), index(1), 10, 1)]);
            } else {
                b.add(Some("d".into()), index(1), 10, 1);
                b.add(Some("d".into()), index(2), 10, 2);
            }
            let (id, p) = sent(&mut b, 0, true).unwrap();
            assert_eq!(p, vec![1, 2]);
            b.on_response(id, Response::Items(vec![refused(), too_many()]), 1, 0.5);
            let (r, payload, _, _) = refusal(&mut b);
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
        let delete = Effect::Delete { version: None };
        let mut b: Batcher<i64> = Batcher::new(limits(1000, 1, false), 0);
        b.add(Some("d".into()), index(1), 10, 1);
        b.add(Some("d".into()), delete.clone(), 10, 2);
        let (id, p) = sent(&mut b, 0, true).unwrap();
        assert_eq!(p, vec![1, 2]);
        b.on_response(id, Response::Items(vec![refused(), ok()]), 1, 0.5);
        let (r, _, _, _) = refusal(&mut b);
        b.requeue(r, vec![(Some("d".into()), index(11), 10, 11)]);
        let (out, gone) = drain_all(&mut b, 1);
        assert!(
            out.is_empty(),
            "nothing is written after the delete: {out:?}"
        );
        assert_eq!(gone, vec![11]);

        let upsert = |doc: &str| Effect::of(&BulkAction::upsert("i", "d".into(), doc.as_bytes()));
        let mut b: Batcher<i64> = Batcher::new(limits(1000, 1, false), 0);
        b.add(Some("d".into()), upsert(r#"{"a":1}"#), 10, 1);
        b.add(Some("d".into()), upsert(r#"{"a":2,"b":2}"#), 10, 2);
        let (id, _) = sent(&mut b, 0, true).unwrap();
        b.on_response(id, Response::Items(vec![refused(), ok()]), 1, 0.5);
        let (r, _, _, _) = refusal(&mut b);
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
}

/// Cases that kill mutants the model test and the cases above did not: each asserts an
/// observable property of the batcher (what is sent and when, the counts it reports,
/// the resolutions).
#[cfg(test)]
mod mutation_tests {
    use super::tests::{limits, ok, refused, too_many};
    use super::*;
    use std::time::Duration;

    const REPLACE: Effect = Effect::Replace { version: None };

    fn sent(b: &mut Batcher<i64>, now: u64, force: bool) -> Option<Vec<i64>> {
        b.next_request(now, force)
            .map(|(_, p)| p.into_iter().copied().collect())
    }

    /// Limits with a 25-byte trigger and no other trigger before 1000 ms.
    fn bytes_25(coalesce: bool) -> Limits {
        Limits {
            max_bytes: 25,
            ..limits(1000, 2, coalesce)
        }
    }

    /// `queued()` and `in_flight()` follow every action from queued to in flight to
    /// answered; `requests` counts the requests sent.
    #[test]
    fn queued_and_in_flight_count_actions_and_requests() {
        let mut b = Batcher::new(limits(1, 2, false), 0);
        for (doc, v) in [("a", 1), ("b", 2), ("c", 3)] {
            b.add(Some(doc.into()), Effect::Opaque, 10, v);
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

    /// What a request carries leaves the queued bytes; what stays queued still counts.
    #[test]
    fn sent_actions_no_longer_count_toward_the_byte_trigger() {
        let mut b = Batcher::new(bytes_25(false), 0);
        for (doc, v) in [("a", 1), ("b", 2), ("c", 3)] {
            b.add(Some(doc.into()), Effect::Opaque, 10, v);
        }
        assert_eq!(sent(&mut b, 1, false), Some(vec![1, 2]), "30 bytes queued");
        assert_eq!(
            sent(&mut b, 1, false),
            None,
            "c's 10 bytes queued, under 25"
        );
        b.add(Some("d".into()), Effect::Opaque, 15, 4);
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
        b.add(Some("a".into()), Effect::Opaque, 20, 1);
        let (id, _) = b.next_request(0, true).unwrap();
        b.on_response(id, Response::Items(vec![too_many()]), 0, 0.0);
        // Due at 5 ms (half of retry_initial_ms with no jitter); the interval at 1000.
        assert_eq!(sent(&mut b, 500, false), None, "a's 20 bytes, under 25");
        assert_eq!(b.queued(), 1, "a is queued again");
        b.add(Some("b".into()), Effect::Opaque, 5, 2);
        assert_eq!(
            sent(&mut b, 500, false),
            Some(vec![1, 2]),
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
        b.add(None, Effect::Opaque, 10, 3);
        assert_eq!(
            sent(&mut b, 0, true),
            Some(vec![3]),
            "sent while 1 and 2 are in flight"
        );
        assert_eq!(b.pending(), 3);
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

    /// A replacement counts the attempts of the action it replaces plus one, so a
    /// document the handler keeps replacing reports how often it was tried.
    #[test]
    fn replacements_count_the_attempts_of_what_they_replace() {
        let mut b = Batcher::new(limits(1000, 1, false), 0);
        b.add(Some("d".into()), Effect::Opaque, 10, 1);
        let mut payload = 1;
        for want_attempts in 0..3 {
            let (id, p) = b.next_request(0, true).unwrap();
            assert_eq!(p, vec![&payload]);
            b.on_response(id, Response::Items(vec![refused()]), 0, 0.5);
            let (r, got, attempts) = refusal(&mut b);
            assert_eq!((got, attempts), (payload, want_attempts));
            payload += 1;
            b.requeue(r, vec![(Some("d".into()), Effect::Opaque, 10, payload)]);
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

    /// Several replacements on the refused action's document take its place in the
    /// order given, and count as queued (actions and bytes) like any added action.
    #[test]
    fn replacements_keep_their_order_and_count_as_queued() {
        let mut b = Batcher::new(bytes_25(false), 0);
        b.add(Some("d".into()), Effect::Opaque, 1, 1);
        let (id, _) = b.next_request(0, true).unwrap();
        b.add(Some("d".into()), Effect::Opaque, 1, 2);
        b.on_response(id, Response::Items(vec![refused()]), 0, 0.5);
        let (r, _, _) = refusal(&mut b);
        assert_eq!(b.queued(), 1);
        b.requeue(
            r,
            vec![
                (Some("d".into()), Effect::Opaque, 10, 11),
                (Some("d".into()), Effect::Opaque, 10, 12),
            ],
        );
        assert_eq!((b.queued(), b.pending(), b.bytes()), (3, 3, 21));
        assert_eq!(sent(&mut b, 1, false), None, "21 bytes queued, under 25");
        b.add(Some("e".into()), Effect::Opaque, 4, 3);
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

    /// A retry is due at exactly its due time (half of `retry_initial_ms` without
    /// jitter: 5 ms).
    #[test]
    fn a_retry_is_sent_at_its_due_time() {
        let mut b = Batcher::new(limits(1000, 1, false), 0);
        b.add(Some("d".into()), Effect::Opaque, 10, 1);
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
        b.add(Some("d".into()), Effect::Opaque, 10, 1);
        let (id, _) = b.next_request(0, true).unwrap();
        assert_eq!(b.on_response(id, Response::Written(1), 0, 0.0), None);
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
            b.add(Some("e".into()), Effect::Opaque, 10, 0);
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
        b.add(Some("d".into()), Effect::Opaque, 10, 1);
        let (first, _) = b.next_request(0, true).unwrap();
        b.add(None, Effect::Opaque, 10, 2);
        let (second, _) = b.next_request(0, true).unwrap();
        assert_ne!(first, second);
        assert_eq!(b.in_flight(), 2);
        assert_eq!(b.in_flight_payloads(first), vec![&1]);
        b.on_response(first, Response::Items(vec![ok()]), 0, 0.5);
        b.on_response(second, Response::Items(vec![ok()]), 0, 0.5);
        assert_eq!((b.pending(), b.in_flight()), (0, 0));
    }

    /// A response whose item count does not match the request cannot be read by
    /// position: every action of the request is retried (and counted), none is taken
    /// as written.
    #[test]
    fn a_response_with_the_wrong_item_count_retries_the_whole_request() {
        let mut b = Batcher::new(limits(1000, 1, false), 0);
        b.add(Some("a".into()), Effect::Opaque, 10, 1);
        b.add(Some("b".into()), Effect::Opaque, 10, 2);
        let (id, _) = b.next_request(0, true).unwrap();
        b.on_response(id, Response::Items(vec![ok()]), 0, 0.0);
        assert!(b.drain_resolved().is_empty(), "nothing written");
        assert_eq!((b.pending(), b.counters().retried), (2, 2));
        assert_eq!(sent(&mut b, 5, true), Some(vec![1, 2]), "both retried");
    }

    /// With `max_in_flight` requests out, nothing can be sent: the wake is for a retry
    /// or nothing, not the flush interval.
    #[test]
    fn no_flush_wake_while_max_in_flight_requests_are_out() {
        let mut b = Batcher::new(limits(1000, 1, false), 0);
        b.add(Some("a".into()), Effect::Opaque, 10, 1);
        let (id, _) = b.next_request(0, true).unwrap();
        b.add(Some("b".into()), Effect::Opaque, 10, 2);
        assert_eq!(
            b.next_wake_ms(),
            None,
            "b waits for the answer, not a timer"
        );
        b.on_response(id, Response::Items(vec![ok()]), 10, 0.5);
        assert_eq!(b.next_wake_ms(), Some(1000), "b is due at the interval");
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

    /// `for_each_in_flight_mut` reaches exactly the actions of the request it names, in
    /// request order, and nothing for a request not in flight.
    #[test]
    fn for_each_in_flight_mut_reaches_the_actions_of_that_request() {
        let mut b = Batcher::new(limits(2, 2, false), 0);
        for (doc, v) in [("a", 1), ("b", 2), ("c", 3)] {
            b.add(Some(doc.into()), Effect::Opaque, 10, v);
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
        b.add(Some("a".into()), Effect::Opaque, 10, 1);
        b.add(Some("b".into()), Effect::Opaque, 10, 2);
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

    /// Whether the batcher holds no document: no key in its map, no live group.
    fn holds_no_document(b: &Batcher<i64>) -> bool {
        b.holds_no_document()
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
}

/// A refused write never takes what it coalesced along: what it set aside is written in
/// its place (or refused in turn), so the document ends as it would without coalescing.
#[cfg(test)]
mod fallback_tests {
    use super::tests::{limits, ok, refused, too_many};
    use super::*;
    use crate::connectors::elasticsearch::action::BulkAction;

    const REPLACE: Effect = Effect::Replace { version: None };

    fn upsert(doc: &str) -> Effect {
        Effect::of(&BulkAction::upsert("i", "d".into(), doc.as_bytes()))
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
                Effect::Replace { version: Some(1) },
                Effect::Replace { version: Some(2) },
            ),
            (REPLACE, Effect::Delete { version: None }),
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
        b.requeue(refusal, vec![(Some("k".into()), Effect::Opaque, 10, 22)]);
        assert_eq!(b.set_aside(), 0);
        assert_eq!(round(&mut b, 0, ok), vec![1]);
        assert_eq!(round(&mut b, 0, ok), vec![22]);
        assert_eq!(b.pending(), 0);
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
}

#[cfg(test)]
mod refused_hot_document_tests {
    use super::tests::{limits, refused};
    use super::*;

    const REPLACE: Effect = Effect::Replace { version: None };

    /// Whether the processor takes more actions (what `bulk.rs` asks before reading).
    fn intake_open(b: &Batcher<i64>) -> bool {
        b.has_room()
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
}
