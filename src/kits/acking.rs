//! Sources that acknowledge instead of seeking (a RabbitMQ queue, a Pub/Sub
//! subscription): exactly once without positions.
//!
//! The broker keeps a message until it is acknowledged and redelivers what was not.
//! Such a source has no position to restore, so the kit gets exactly-once the other
//! way round (Flink's `MessageAcknowledgingSourceBase`, without its stall):
//! - a delivery is acknowledged only after the first checkpoint taken after it
//!   completes, so the checkpoint holds its effects: a crash before that makes the
//!   broker redeliver it, and the restored job, which holds none of its effects, takes
//!   it as new;
//! - the id of every message whose effects the job holds, and whose acknowledgement is
//!   not known to have reached the broker long enough ago, is kept in each checkpoint
//!   (the source's own state, [`Source::snapshot_state`]): a redelivery of one of them
//!   (after a crash, after a lost or failed acknowledgement, or a broker's duplicate)
//!   is dropped, and acknowledged with the next completed checkpoint;
//! - a failed acknowledgement never stalls the job (FLINK-23183): the ids stay, and
//!   what the broker redelivers is dropped and acknowledged again (with several
//!   consumers it restarts the job, see "Parallelism").
//!
//! What a connector writes is [`Acknowledged`]: receive deliveries, acknowledge
//! handles. [`AckingSource`] is the [`Source`] around it; every decision is in
//! [`Ledger`], plain bookkeeping over data.
//!
//! **Ids.** Exactly-once needs each message to carry an id of its own that stays the
//! same on every redelivery (AMQP's `message_id`, Pub/Sub's message id). A delivery
//! without one is emitted and acknowledged the same way, but its redelivery is emitted
//! again: at-least-once for such messages (the kit warns once per subtask, and
//! [`AckingSource::without_id`] counts them). Two messages sent with one id are one
//! message to the kit: the second is dropped while the first's id is kept.
//!
//! **How long an id is kept.** From its delivery until `window` after the
//! acknowledgement of its last delivery was sent (whatever the broker answered), or
//! after the restore that brought it back. The window must exceed the time the broker
//! may take to redeliver a message whose acknowledgement it lost (for RabbitMQ, until
//! the channel that delivered it closes; for Pub/Sub, the acknowledgement deadline).
//! The ids held are about the message rate times (checkpoint interval + window).
//!
//! **Parallelism.** Several subtasks are competing consumers of one queue, each with
//! its own ids. After a crash every subtask restarts together and takes the ids of
//! every old subtask, so a redelivery is dropped whichever consumer it reaches, at any
//! new parallelism. While the job runs, a consumer knows only its own ids: a message
//! the broker hands back (a failed acknowledgement closed the channel) may go to
//! another consumer, which would take it as new. So with more than one subtask a
//! failed acknowledgement fails the attempt, and the restart restores every subtask
//! with every id; with one subtask the job goes on. Members (`--members`) are separate
//! processes that restart alone: a member's crash or failed acknowledgement hands its
//! messages to the others, which hold none of their ids, so across members such a
//! source is at-least-once for those messages (the kit says so at start).
//!
//! **Brokers that redeliver on a deadline** (Pub/Sub's acknowledgement deadline,
//! RabbitMQ's `consumer_timeout`) must not let it pass while a delivery waits for its
//! checkpoint: the connector extends the deadline of what it delivered and has not yet
//! been asked to acknowledge (it sees both), or the message may reach another
//! consumer.

use crate::connector::{Source, SourcePoll, SubtaskInfo};
use crate::error::{JobError, Result};
use crate::record::{Batch, Record};
use async_trait::async_trait;
use lockgate_state::{CheckpointId, SourcePosition};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// A message's own id, the same on each of its deliveries.
pub type MessageId = Box<[u8]>;

/// One delivery of a message, as the broker made it.
#[derive(Debug)]
pub struct Delivery<H> {
    /// What acknowledges this delivery (a delivery tag, an ack id): valid for this
    /// delivery only.
    pub handle: H,
    /// The message's own id; `None`: the message has none (at-least-once).
    pub id: Option<MessageId>,
    /// The record the message becomes.
    pub record: Record,
}

/// The broker side of an acknowledging source: what a connector implements.
#[async_trait]
pub trait Acknowledged: Send + 'static {
    /// What acknowledges one delivery. It must stay meaningful after a reconnect: a
    /// RabbitMQ delivery tag counts from 1 again on each channel, so a handle names its
    /// channel too, and `acknowledge` skips handles of a channel that closed (the broker
    /// gave their messages back; their redeliveries will be dropped and acknowledged).
    type Handle: Send + 'static;

    /// Connects and starts consuming (after the kit restored its ids).
    async fn open(&mut self, info: &SubtaskInfo) -> Result<()>;

    /// Appends the deliveries available now to `out`, waiting at most about 100 ms
    /// when there are none (barriers wait for `poll`). `Finished`: a bounded source
    /// will deliver nothing more.
    async fn receive(&mut self, out: &mut Vec<Delivery<Self::Handle>>) -> Result<SourcePoll>;

    /// Acknowledges the deliveries of `handles`, given in the order they were
    /// delivered. `Ok`: the acknowledgements were sent. `Err(why)`: they may not have
    /// reached the broker (a closed channel, an expired ack id); the messages may come
    /// again, and their redeliveries will be dropped and acknowledged. Retry what is
    /// worth retrying here; an error does not fail the job.
    async fn acknowledge(&mut self, handles: Vec<Self::Handle>) -> std::result::Result<(), String>;

    /// Stops consuming and releases the connection; called once, on a clean finish.
    async fn close(&mut self) -> Result<()> {
        Ok(())
    }
}

/// What the ledger keeps about one id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Kept {
    /// Deliveries of the message whose acknowledgement is not sent yet.
    unacknowledged: u32,
    /// When the last acknowledgement was sent, or the id restored: the window counts
    /// from here once nothing is unacknowledged.
    since: Option<Instant>,
}

/// The deliveries a completed checkpoint releases for acknowledgement.
#[derive(Debug)]
pub struct Release<H> {
    /// The handles to acknowledge, in delivery order.
    pub handles: Vec<H>,
    /// Their ids (one per delivery that had one), for [`Ledger::acknowledged`].
    pub ids: Vec<MessageId>,
}

/// The bookkeeping of an acknowledging source: which delivery to emit, which
/// handles a completed checkpoint releases, which ids a checkpoint keeps. Pure: time
/// is a parameter.
#[derive(Debug)]
pub struct Ledger<H> {
    /// Deliveries since the last checkpoint's barrier.
    open: Vec<(H, Option<MessageId>)>,
    /// Deliveries before each barrier whose checkpoint has not completed, by the
    /// checkpoint of that barrier.
    sealed: BTreeMap<CheckpointId, Vec<(H, Option<MessageId>)>>,
    ids: HashMap<MessageId, Kept>,
    window: Duration,
}

impl<H> Ledger<H> {
    /// An empty ledger keeping each id `window` after its acknowledgement.
    pub fn new(window: Duration) -> Ledger<H> {
        Ledger {
            open: Vec::new(),
            sealed: BTreeMap::new(),
            ids: HashMap::new(),
            window,
        }
    }

    /// Takes the ids of a restored checkpoint: their messages' effects are in it, and
    /// whether their acknowledgement reached the broker is unknown.
    pub fn restore(&mut self, ids: impl IntoIterator<Item = MessageId>, now: Instant) {
        for id in ids {
            self.ids.insert(
                id,
                Kept {
                    unacknowledged: 0,
                    since: Some(now),
                },
            );
        }
    }

    /// Books a delivery; `true`: emit its record. A message whose id the ledger holds
    /// is a redelivery (or a duplicate) of one the job has: not emitted, but its
    /// handle is acknowledged with the next completed checkpoint like any other.
    pub fn deliver(&mut self, handle: H, id: Option<MessageId>) -> bool {
        let emit = match &id {
            None => true,
            Some(id) => match self.ids.get_mut(id) {
                Some(kept) => {
                    kept.unacknowledged += 1;
                    false
                }
                None => {
                    self.ids.insert(
                        id.clone(),
                        Kept {
                            unacknowledged: 1,
                            since: None,
                        },
                    );
                    true
                }
            },
        };
        self.open.push((handle, id));
        emit
    }

    /// Barrier `id`: the deliveries booked so far are the ones checkpoint `id` holds.
    pub fn seal(&mut self, id: CheckpointId) {
        if !self.open.is_empty() {
            let open = std::mem::take(&mut self.open);
            self.sealed.entry(id).or_default().extend(open);
        }
    }

    /// Checkpoint `id` completed: the deliveries before its barrier (and before any
    /// earlier one that never completed) are released for acknowledgement.
    pub fn complete(&mut self, id: CheckpointId) -> Release<H> {
        let later = self.sealed.split_off(&CheckpointId(id.0 + 1));
        let done = std::mem::replace(&mut self.sealed, later);
        let mut release = Release {
            handles: Vec::new(),
            ids: Vec::new(),
        };
        for (handle, mid) in done.into_values().flatten() {
            release.handles.push(handle);
            release.ids.extend(mid);
        }
        release
    }

    /// The acknowledgements of `ids` were sent (or failed) at `now`: each is kept
    /// `window` longer, for a redelivery the broker may still make.
    pub fn acknowledged(&mut self, ids: &[MessageId], now: Instant) {
        for id in ids {
            if let Some(kept) = self.ids.get_mut(id) {
                kept.unacknowledged = kept.unacknowledged.saturating_sub(1);
                kept.since = Some(now);
            }
        }
    }

    /// Forgets the ids whose window has passed at `now` and that have no delivery
    /// waiting for acknowledgement.
    pub fn expire(&mut self, now: Instant) {
        let window = self.window;
        self.ids.retain(|_, kept| {
            kept.unacknowledged > 0
                || kept
                    .since
                    .is_none_or(|since| now.saturating_duration_since(since) < window)
        });
    }

    /// The ids a checkpoint taken now keeps, sorted.
    pub fn kept_ids(&self) -> Vec<&MessageId> {
        let mut ids: Vec<&MessageId> = self.ids.keys().collect();
        ids.sort();
        ids
    }

    /// Deliveries not yet released for acknowledgement.
    pub fn unreleased(&self) -> usize {
        self.open.len() + self.sealed.values().map(Vec::len).sum::<usize>()
    }
}

/// The version of the state [`AckingSource`] keeps in checkpoints.
const STATE_VERSION: u8 = 1;

/// The source's state in a checkpoint: a version byte, then the ids (bincode,
/// standard configuration).
pub fn encode_state(ids: &[&MessageId]) -> Vec<u8> {
    let ids: Vec<&[u8]> = ids.iter().map(|id| &id[..]).collect();
    let mut out = vec![STATE_VERSION];
    out.extend(
        bincode::serde::encode_to_vec(&ids, bincode::config::standard())
            .expect("a list of byte strings always encodes"),
    );
    out
}

/// The ids of a state [`encode_state`] wrote.
pub fn decode_state(bytes: &[u8]) -> std::result::Result<Vec<MessageId>, String> {
    match bytes.split_first() {
        Some((&STATE_VERSION, rest)) => {
            let (ids, read): (Vec<Vec<u8>>, usize) =
                bincode::serde::decode_from_slice(rest, bincode::config::standard())
                    .map_err(|e| format!("its ids do not decode: {e}"))?;
            if read != rest.len() {
                return Err(format!("{} bytes follow its ids", rest.len() - read));
            }
            Ok(ids.into_iter().map(Vec::into_boxed_slice).collect())
        }
        Some((v, _)) => Err(format!(
            "it is of version {v}, which this lockgate does not know (it reads version {STATE_VERSION})"
        )),
        None => Err("it is empty".into()),
    }
}

/// How long [`AckingSource::new`] keeps an id after its acknowledgement: longer than
/// Pub/Sub's longest acknowledgement deadline (10 minutes).
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(15 * 60);

/// A [`Source`] over an [`Acknowledged`] broker client (see the module's doc for what
/// it guarantees).
pub struct AckingSource<A: Acknowledged> {
    broker: A,
    ledger: Ledger<A::Handle>,
    received: Vec<Delivery<A::Handle>>,
    name: String,
    /// Other consumers of the same queue run beside this one in the process.
    competing: bool,
    dropped: u64,
    without_id: u64,
}

impl<A: Acknowledged> AckingSource<A> {
    /// The source of `broker`, keeping ids [`DEFAULT_WINDOW`] after acknowledgement.
    pub fn new(broker: A) -> AckingSource<A> {
        AckingSource::with_window(broker, DEFAULT_WINDOW)
    }

    /// The source of `broker`, keeping ids `window` after acknowledgement.
    pub fn with_window(broker: A, window: Duration) -> AckingSource<A> {
        AckingSource {
            broker,
            ledger: Ledger::new(window),
            received: Vec::new(),
            name: String::new(),
            competing: false,
            dropped: 0,
            without_id: 0,
        }
    }

    /// Deliveries dropped as redeliveries of messages the job holds.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Deliveries that had no id (read at-least-once).
    pub fn without_id(&self) -> u64 {
        self.without_id
    }
}

#[async_trait]
impl<A: Acknowledged> Source for AckingSource<A> {
    async fn open(&mut self, info: &SubtaskInfo, _: Option<&[SourcePosition]>) -> Result<()> {
        self.name = info.name.clone();
        self.competing = info.parallelism > 1;
        if info.member.count > 1 && info.index == 0 {
            tracing::warn!(
                task = %self.name,
                members = info.member.count,
                "an acknowledging source run as several members: a member's crash or failed acknowledgement hands its messages to the other members, which hold none of their ids: at-least-once for those messages"
            );
        }
        self.broker.open(info).await
    }

    async fn poll(&mut self, out: &mut Batch) -> Result<SourcePoll> {
        let state = self.broker.receive(&mut self.received).await?;
        for d in self.received.drain(..) {
            if d.id.is_none() {
                if self.without_id == 0 {
                    tracing::warn!(
                        task = %self.name,
                        "a message without an id: such messages are read at-least-once (a redelivery cannot be told from a new message)"
                    );
                }
                self.without_id += 1;
            }
            if self.ledger.deliver(d.handle, d.id) {
                out.push(d.record);
            } else {
                self.dropped += 1;
            }
        }
        Ok(state)
    }

    fn snapshot(&mut self, id: CheckpointId) -> Result<Vec<SourcePosition>> {
        self.ledger.seal(id);
        Ok(Vec::new())
    }

    fn snapshot_state(&mut self, _: CheckpointId) -> Result<Option<Vec<u8>>> {
        self.ledger.expire(Instant::now());
        Ok(Some(encode_state(&self.ledger.kept_ids())))
    }

    fn restore_state(&mut self, states: &[(u16, Vec<u8>)]) -> Result<()> {
        let now = Instant::now();
        for (old, bytes) in states {
            let ids = decode_state(bytes).map_err(|why| {
                JobError::Restore(format!(
                    "the acknowledging source's state of old subtask {old} cannot be read: {why}"
                ))
            })?;
            self.ledger.restore(ids, now);
        }
        Ok(())
    }

    async fn notify_checkpoint_complete(&mut self, id: CheckpointId) -> Result<()> {
        let release = self.ledger.complete(id);
        if release.handles.is_empty() {
            return Ok(());
        }
        let n = release.handles.len();
        if let Err(why) = self.broker.acknowledge(release.handles).await {
            if self.competing {
                // Handed back, they may reach a consumer that does not hold their ids.
                return Err(JobError::task(
                    &self.name,
                    format!("acknowledging the deliveries of checkpoint {id} failed: {why}; another consumer could take their messages as new, so the job restarts from its checkpoint, which holds their ids"),
                ));
            }
            // The messages may come again: their ids stay, so they will be dropped.
            tracing::warn!(
                task = %self.name,
                checkpoint = id.0,
                deliveries = n,
                "acknowledging the deliveries of a completed checkpoint failed: {why}; their redeliveries will be dropped and acknowledged"
            );
        }
        self.ledger.acknowledged(&release.ids, Instant::now());
        Ok(())
    }

    async fn close(&mut self) -> Result<()> {
        self.broker.close().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> Option<MessageId> {
        Some(s.as_bytes().into())
    }

    fn ledger() -> Ledger<u32> {
        Ledger::new(Duration::from_secs(60))
    }

    #[test]
    fn new_messages_are_emitted_and_redeliveries_dropped() {
        let mut l = ledger();
        assert!(l.deliver(1, id("a")));
        assert!(l.deliver(2, id("b")));
        assert!(!l.deliver(3, id("a")), "a redelivery of a is dropped");
        assert!(
            l.deliver(4, None),
            "without an id, every delivery is emitted"
        );
        assert!(l.deliver(5, None));
    }

    #[test]
    fn a_completed_checkpoint_releases_the_deliveries_before_its_barrier_only() {
        let mut l = ledger();
        l.deliver(1, id("a"));
        l.seal(CheckpointId(1));
        l.deliver(2, id("b"));
        let r = l.complete(CheckpointId(1));
        assert_eq!(r.handles, vec![1]);
        assert_eq!(r.ids, vec![MessageId::from(&b"a"[..])]);
        assert_eq!(l.unreleased(), 1, "b waits for the next checkpoint");
        assert!(l.complete(CheckpointId(1)).handles.is_empty());
    }

    #[test]
    fn an_aborted_checkpoint_is_released_by_the_next_completed_one() {
        let mut l = ledger();
        l.deliver(1, id("a"));
        l.seal(CheckpointId(1)); // aborted: never completes
        l.deliver(2, id("b"));
        l.seal(CheckpointId(2));
        l.deliver(3, id("c"));
        l.seal(CheckpointId(3));
        let r = l.complete(CheckpointId(2));
        assert_eq!(r.handles, vec![1, 2], "in delivery order, 3 not yet");
        assert_eq!(l.complete(CheckpointId(3)).handles, vec![3]);
    }

    #[test]
    fn a_dropped_redelivery_is_acknowledged_with_the_next_completed_checkpoint() {
        // FLINK-23183: redeliveries that are dropped and never acknowledged fill the
        // prefetch window and stall the job for good.
        let mut l = ledger();
        let t0 = Instant::now();
        l.deliver(1, id("a"));
        l.seal(CheckpointId(1));
        let r = l.complete(CheckpointId(1));
        l.acknowledged(&r.ids, t0); // the acknowledgement was lost
        assert!(!l.deliver(7, id("a")), "the broker's redelivery is dropped");
        l.seal(CheckpointId(2));
        assert_eq!(l.complete(CheckpointId(2)).handles, vec![7]);
    }

    #[test]
    fn ids_are_kept_the_window_after_their_last_acknowledgement_then_forgotten() {
        let mut l = ledger();
        let t0 = Instant::now();
        l.deliver(1, id("a"));
        l.deliver(2, id("b"));
        l.seal(CheckpointId(1));
        l.expire(t0 + Duration::from_secs(3600));
        assert_eq!(l.kept_ids().len(), 2, "unacknowledged ids never expire");
        let r = l.complete(CheckpointId(1));
        l.acknowledged(&r.ids, t0);
        l.expire(t0 + Duration::from_secs(59));
        assert_eq!(l.kept_ids().len(), 2);
        l.expire(t0 + Duration::from_secs(60));
        assert!(l.kept_ids().is_empty());
        assert!(
            l.deliver(3, id("a")),
            "after the window a message is new again"
        );
    }

    #[test]
    fn an_id_with_a_redelivery_waiting_is_kept_until_that_one_is_acknowledged() {
        let mut l = ledger();
        let t0 = Instant::now();
        l.deliver(1, id("a"));
        l.seal(CheckpointId(1));
        assert!(!l.deliver(2, id("a")));
        let r = l.complete(CheckpointId(1));
        l.acknowledged(&r.ids, t0);
        l.expire(t0 + Duration::from_secs(3600));
        assert_eq!(l.kept_ids().len(), 1, "delivery 2 is not acknowledged yet");
        l.seal(CheckpointId(2));
        let r = l.complete(CheckpointId(2));
        let t1 = t0 + Duration::from_secs(3600);
        l.acknowledged(&r.ids, t1);
        l.expire(t1 + Duration::from_secs(59));
        assert_eq!(l.kept_ids().len(), 1, "the window counts from the last one");
        l.expire(t1 + Duration::from_secs(60));
        assert!(l.kept_ids().is_empty());
    }

    #[test]
    fn restored_ids_drop_redeliveries_and_expire_after_the_window() {
        let mut l = ledger();
        let t0 = Instant::now();
        l.restore([MessageId::from(&b"a"[..])], t0);
        assert!(!l.deliver(1, id("a")));
        assert!(l.deliver(2, id("b")));
        let mut other = ledger();
        other.restore([MessageId::from(&b"a"[..])], t0);
        other.expire(t0 + Duration::from_secs(60));
        assert!(other.kept_ids().is_empty());
    }

    #[test]
    fn a_checkpoint_keeps_every_id_the_job_holds() {
        let mut l = ledger();
        l.restore([MessageId::from(&b"r"[..])], Instant::now());
        l.deliver(1, id("b"));
        l.seal(CheckpointId(4));
        l.deliver(2, id("a"));
        let kept: Vec<&[u8]> = l.kept_ids().into_iter().map(|i| &i[..]).collect();
        assert_eq!(kept, vec![&b"a"[..], b"b", b"r"]);
    }

    #[test]
    fn the_state_round_trips_and_refuses_what_it_cannot_read() {
        let a: MessageId = b"a".to_vec().into();
        let long: MessageId = vec![0u8; 300].into();
        let bytes = encode_state(&[&a, &long]);
        assert_eq!(decode_state(&bytes).unwrap(), vec![a, long]);
        assert!(decode_state(&[]).unwrap_err().contains("empty"));
        assert!(decode_state(&[9, 0]).unwrap_err().contains("version 9"));
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert!(decode_state(&trailing).unwrap_err().contains("follow"));
        assert!(decode_state(&bytes[..bytes.len() - 1]).is_err());
    }

    mod model {
        use super::*;
        use proptest::prelude::*;

        /// What a run does, one step at a time.
        #[derive(Debug, Clone)]
        enum Step {
            /// The broker delivers the next message (or one it gave back).
            Deliver,
            /// A barrier: the source seals what it delivered into the next checkpoint.
            Barrier,
            /// The oldest sealed checkpoint completes; `told`: the source is notified
            /// (a notification may be lost in a crash).
            Complete { told: bool },
            /// The oldest sealed checkpoint is aborted: it never completes.
            Abort,
            /// The broker loses the acknowledgements it got: it gives their messages back.
            LoseAcks,
            /// The job crashes and restores its last completed checkpoint.
            Crash,
        }

        fn step() -> impl Strategy<Value = Step> {
            prop_oneof![
                8 => Just(Step::Deliver),
                3 => Just(Step::Barrier),
                2 => Just(Step::Complete { told: true }),
                1 => Just(Step::Complete { told: false }),
                1 => Just(Step::Abort),
                1 => Just(Step::LoseAcks),
                1 => Just(Step::Crash),
            ]
        }

        /// A broker that keeps every message until it is acknowledged, and one job
        /// (one consumer) on the kit's ledger, with checkpoints that hold the records
        /// emitted before their barrier.
        struct World {
            next_message: u32,
            queue: Vec<u32>,
            /// Delivered, not acknowledged: (handle, message).
            unacked: Vec<(u32, u32)>,
            next_handle: u32,
            /// Acknowledged since the broker last lost acknowledgements.
            acked: Vec<u32>,
            ledger: Ledger<u32>,
            /// Emitted since the last restore, with the checkpoint whose barrier follows.
            emitted: Vec<(u64, u32)>,
            /// What the restored checkpoint held.
            base: Vec<u32>,
            /// Sealed checkpoints not completed or aborted: id -> (state, output).
            sealed: BTreeMap<u64, (Vec<u8>, Vec<u32>)>,
            /// The last completed checkpoint's state and output.
            completed: Option<(Vec<u8>, Vec<u32>)>,
            next_barrier: u64,
            now: Instant,
        }

        impl World {
            fn new() -> World {
                World {
                    next_message: 0,
                    queue: Vec::new(),
                    unacked: Vec::new(),
                    next_handle: 0,
                    acked: Vec::new(),
                    ledger: Ledger::new(Duration::from_secs(3600)),
                    emitted: Vec::new(),
                    base: Vec::new(),
                    sealed: BTreeMap::new(),
                    completed: None,
                    next_barrier: 1,
                    now: Instant::now(),
                }
            }

            fn apply(&mut self, s: Step) {
                match s {
                    Step::Deliver => {
                        let m = if self.queue.is_empty() {
                            self.next_message += 1;
                            self.next_message
                        } else {
                            self.queue.remove(0)
                        };
                        self.next_handle += 1;
                        self.unacked.push((self.next_handle, m));
                        if self
                            .ledger
                            .deliver(self.next_handle, Some(m.to_be_bytes().to_vec().into()))
                        {
                            self.emitted.push((self.next_barrier, m));
                        }
                    }
                    Step::Barrier => {
                        let id = self.next_barrier;
                        self.next_barrier += 1;
                        self.ledger.seal(CheckpointId(id));
                        let state = encode_state(&self.ledger.kept_ids());
                        let mut output = self.base.clone();
                        output.extend(
                            self.emitted
                                .iter()
                                .filter(|(e, _)| *e <= id)
                                .map(|(_, m)| m),
                        );
                        self.sealed.insert(id, (state, output));
                    }
                    Step::Complete { told } => {
                        let Some((id, done)) = self.sealed.pop_first() else {
                            return;
                        };
                        self.completed = Some(done);
                        if told {
                            let r = self.ledger.complete(CheckpointId(id));
                            for h in &r.handles {
                                if let Some(at) = self.unacked.iter().position(|(u, _)| u == h) {
                                    let (_, m) = self.unacked.remove(at);
                                    self.acked.push(m);
                                }
                            }
                            self.ledger.acknowledged(&r.ids, self.now);
                        }
                    }
                    Step::Abort => {
                        self.sealed.pop_first();
                    }
                    Step::LoseAcks => {
                        let lost: Vec<u32> = self.acked.drain(..).collect();
                        self.queue.extend(lost);
                    }
                    Step::Crash => {
                        // What the consumer had not acknowledged comes again.
                        self.queue.extend(self.unacked.drain(..).map(|(_, m)| m));
                        self.ledger = Ledger::new(Duration::from_secs(3600));
                        self.emitted.clear();
                        self.sealed.clear();
                        self.base = match &self.completed {
                            Some((state, output)) => {
                                self.ledger.restore(decode_state(state).unwrap(), self.now);
                                output.clone()
                            }
                            None => Vec::new(),
                        };
                    }
                }
            }

            fn committed(&self) -> Vec<u32> {
                self.completed
                    .as_ref()
                    .map(|(_, o)| o.clone())
                    .unwrap_or_default()
            }
        }

        proptest! {
            /// Whatever the broker and the checkpoints do: what the completed checkpoint
            /// holds has each message at most once; every message the broker deleted
            /// (acknowledged) is in it; and once the faults stop, the job drains the
            /// queue with each message exactly once.
            #[test]
            fn each_message_once_whatever_the_order(steps in proptest::collection::vec(step(), 1..160)) {
                let mut w = World::new();
                for s in steps {
                    w.apply(s);
                    let committed = w.committed();
                    let mut sorted = committed.clone();
                    sorted.sort();
                    sorted.dedup();
                    prop_assert_eq!(sorted.len(), committed.len(), "a message committed twice: {:?}", committed);
                    for m in &w.acked {
                        prop_assert!(committed.contains(m), "message {} acknowledged, not committed", m);
                    }
                }
                // No more faults: deliver what is left, checkpoint, complete.
                let total = w.next_message;
                for _ in 0..(4 * total + 8) {
                    if w.queue.is_empty() && w.unacked.is_empty() && w.sealed.is_empty() {
                        break;
                    }
                    for _ in 0..w.queue.len() {
                        w.apply(Step::Deliver);
                    }
                    w.apply(Step::Barrier);
                    w.apply(Step::Complete { told: true });
                }
                prop_assert!(w.queue.is_empty() && w.unacked.is_empty(), "the job did not drain the queue");
                let mut committed = w.committed();
                committed.sort();
                prop_assert_eq!(committed, (1..=total).collect::<Vec<u32>>());
            }
        }
    }
}
