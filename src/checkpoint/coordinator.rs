//! The checkpoint coordinator as a state machine (no I/O, no clock of its own).
//!
//! Guarantees, each tested below:
//! - at most one checkpoint is pending (`max_concurrent = 1`);
//! - a checkpoint starts no earlier than `interval_ms` after the previous trigger and
//!   `min_pause_ms` after the previous checkpoint ended;
//! - a checkpoint pending longer than `timeout_ms` is aborted, as is a declined one;
//! - more than `tolerable_failures` consecutive failures fail the job;
//! - ids strictly increase from the id given at start (the runtime passes one past the
//!   highest id present in the checkpoint directory);
//! - when every source finished, or a stop was requested, a final checkpoint is taken
//!   at once, retried if it fails, and the job finishes when it is published.

use super::TaskId;
use lockgate_state::{CheckpointId, SourcePosition, SubtaskSnapshot};
use std::collections::{BTreeMap, BTreeSet};

/// Timing and failure settings of the coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoordinatorConfig {
    /// 0 disables periodic checkpoints (the final checkpoint is still taken).
    pub interval_ms: u64,
    pub timeout_ms: u64,
    pub min_pause_ms: u64,
    pub tolerable_failures: u32,
}

/// What the driver must do.
#[derive(Debug, PartialEq)]
pub enum Action {
    /// Create the pending directory and send `Trigger` to every source task.
    Trigger { id: CheckpointId, is_final: bool },
    /// Every task acknowledged: publish the checkpoint, then call
    /// [`Coordinator::on_published`] (or [`Coordinator::on_publish_failed`]).
    Publish {
        id: CheckpointId,
        is_final: bool,
        positions: Vec<SourcePosition>,
        snapshots: Vec<SubtaskSnapshot>,
    },
    /// Discard the pending directory and send `Aborted` to every task.
    Abort {
        id: CheckpointId,
        cause: AbortCause,
        reason: String,
    },
    /// Fail the job.
    Fail { failures: u32, last: String },
}

/// Why a checkpoint was aborted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortCause {
    /// A task declined it.
    Declined,
    /// It was pending longer than `timeout_ms`.
    Expired,
    /// Publishing it failed.
    PublishFailed,
}

#[derive(Debug)]
struct Pending {
    id: CheckpointId,
    started_ms: u64,
    is_final: bool,
    acked: BTreeSet<TaskId>,
    positions: Vec<SourcePosition>,
    snapshots: BTreeMap<(String, u16), SubtaskSnapshot>,
    publishing: bool,
}

/// The coordinator state machine.
#[derive(Debug)]
pub struct Coordinator {
    cfg: CoordinatorConfig,
    tasks: BTreeSet<TaskId>,
    sources: BTreeSet<TaskId>,
    finished_sources: BTreeSet<TaskId>,
    next_id: CheckpointId,
    pending: Option<Pending>,
    last_trigger_ms: u64,
    last_end_ms: Option<u64>,
    consecutive_failures: u32,
    stop_requested: bool,
    /// A checkpoint was asked for (the control API): the next one is due at once.
    requested: bool,
    final_published: bool,
    completed: u64,
}

impl Coordinator {
    /// A coordinator for `tasks` (of which `sources` are source tasks), started at
    /// `now_ms`, whose first checkpoint will be `first_id`.
    pub fn new(
        cfg: CoordinatorConfig,
        tasks: impl IntoIterator<Item = TaskId>,
        sources: impl IntoIterator<Item = TaskId>,
        first_id: CheckpointId,
        now_ms: u64,
    ) -> Coordinator {
        Coordinator {
            cfg,
            tasks: tasks.into_iter().collect(),
            sources: sources.into_iter().collect(),
            finished_sources: BTreeSet::new(),
            next_id: first_id,
            pending: None,
            last_trigger_ms: now_ms,
            last_end_ms: None,
            consecutive_failures: 0,
            stop_requested: false,
            requested: false,
            final_published: false,
            completed: 0,
        }
    }

    /// The id the next trigger will use.
    pub fn next_id(&self) -> CheckpointId {
        self.next_id
    }

    /// Number of checkpoints published so far.
    pub fn completed(&self) -> u64 {
        self.completed
    }

    /// Whether the final checkpoint was published (the job is done).
    pub fn is_finished(&self) -> bool {
        self.final_published
    }

    /// The checkpoint pending now, if any.
    pub fn pending(&self) -> Option<CheckpointId> {
        self.pending.as_ref().map(|p| p.id)
    }

    fn wants_final(&self) -> bool {
        self.stop_requested || self.finished_sources.len() == self.sources.len()
    }

    /// Advances the clock: aborts an expired checkpoint or triggers a due one.
    pub fn poll(&mut self, now_ms: u64) -> Vec<Action> {
        if self.final_published {
            return Vec::new();
        }
        if let Some(p) = &self.pending {
            if !p.publishing && now_ms.saturating_sub(p.started_ms) >= self.cfg.timeout_ms {
                let reason = format!("expired after {} ms", self.cfg.timeout_ms);
                return self.fail_pending(AbortCause::Expired, reason, now_ms);
            }
            return Vec::new();
        }
        let is_final = self.wants_final();
        let due = if is_final || self.requested {
            true
        } else if self.cfg.interval_ms == 0 {
            false
        } else {
            let by_interval = self.last_trigger_ms + self.cfg.interval_ms;
            let by_pause = self.last_end_ms.map_or(0, |e| e + self.cfg.min_pause_ms);
            now_ms >= by_interval.max(by_pause)
        };
        if !due {
            return Vec::new();
        }
        let id = self.next_id;
        self.next_id = id.next();
        self.last_trigger_ms = now_ms;
        self.requested = false;
        self.pending = Some(Pending {
            id,
            started_ms: now_ms,
            is_final,
            acked: BTreeSet::new(),
            positions: Vec::new(),
            snapshots: BTreeMap::new(),
            publishing: false,
        });
        vec![Action::Trigger { id, is_final }]
    }

    /// A checkpoint is asked for now: the next one is triggered as soon as none is
    /// pending, whatever the interval and the minimum pause say (periodic checkpoints
    /// may even be off).
    pub fn request_checkpoint(&mut self) {
        self.requested = true;
    }

    /// A task acknowledged checkpoint `id` with its positions and snapshots.
    pub fn on_ack(
        &mut self,
        id: CheckpointId,
        task: TaskId,
        positions: Vec<SourcePosition>,
        snapshots: Vec<SubtaskSnapshot>,
    ) -> Vec<Action> {
        let Some(p) = self
            .pending
            .as_mut()
            .filter(|p| p.id == id && !p.publishing)
        else {
            return Vec::new(); // late ack of an aborted checkpoint
        };
        debug_assert!(self.tasks.contains(&task), "ack from unknown task {task}");
        let first = p.acked.insert(task);
        debug_assert!(first, "{task} acknowledged checkpoint {id} twice");
        p.positions.extend(positions);
        for s in snapshots {
            p.snapshots.insert((s.operator.clone(), s.subtask), s);
        }
        if p.acked.len() < self.tasks.len() {
            return Vec::new();
        }
        p.publishing = true;
        let mut positions = std::mem::take(&mut p.positions);
        positions.sort();
        vec![Action::Publish {
            id,
            is_final: p.is_final,
            positions,
            snapshots: std::mem::take(&mut p.snapshots).into_values().collect(),
        }]
    }

    /// A task declined checkpoint `id`.
    pub fn on_decline(
        &mut self,
        id: CheckpointId,
        task: TaskId,
        reason: &str,
        now_ms: u64,
    ) -> Vec<Action> {
        if self
            .pending
            .as_ref()
            .is_some_and(|p| p.id == id && !p.publishing)
        {
            return self.fail_pending(
                AbortCause::Declined,
                format!("declined by {task}: {reason}"),
                now_ms,
            );
        }
        Vec::new()
    }

    /// Checkpoint `id` was published.
    pub fn on_published(&mut self, id: CheckpointId, now_ms: u64) {
        let p = self.pending.take().expect("published a pending checkpoint");
        debug_assert_eq!(p.id, id);
        self.consecutive_failures = 0;
        self.last_end_ms = Some(now_ms);
        self.completed += 1;
        if p.is_final {
            self.final_published = true;
        }
    }

    /// Publishing checkpoint `id` failed.
    pub fn on_publish_failed(
        &mut self,
        id: CheckpointId,
        reason: String,
        now_ms: u64,
    ) -> Vec<Action> {
        debug_assert_eq!(self.pending(), Some(id));
        self.fail_pending(
            AbortCause::PublishFailed,
            format!("publish failed: {reason}"),
            now_ms,
        )
    }

    /// A bounded source subtask reached its end.
    pub fn on_source_finished(&mut self, task: TaskId) {
        self.finished_sources.insert(task);
    }

    /// A stop was requested (SIGTERM): a final checkpoint follows at once.
    pub fn on_stop(&mut self) {
        self.stop_requested = true;
    }

    fn fail_pending(&mut self, cause: AbortCause, reason: String, now_ms: u64) -> Vec<Action> {
        let p = self.pending.take().expect("a pending checkpoint");
        self.last_end_ms = Some(now_ms);
        self.consecutive_failures += 1;
        let mut actions = vec![Action::Abort {
            id: p.id,
            cause,
            reason: reason.clone(),
        }];
        if self.consecutive_failures > self.cfg.tolerable_failures {
            actions.push(Action::Fail {
                failures: self.consecutive_failures,
                last: format!("checkpoint {} {reason}", p.id),
            });
        }
        actions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(v: u16, s: u16) -> TaskId {
        TaskId {
            vertex: v,
            subtask: s,
        }
    }

    fn cfg(
        interval_ms: u64,
        min_pause_ms: u64,
        timeout_ms: u64,
        tolerable: u32,
    ) -> CoordinatorConfig {
        CoordinatorConfig {
            interval_ms,
            timeout_ms,
            min_pause_ms,
            tolerable_failures: tolerable,
        }
    }

    fn coord(c: CoordinatorConfig) -> Coordinator {
        Coordinator::new(c, [t(0, 0), t(1, 0)], [t(0, 0)], CheckpointId(7), 0)
    }

    fn ack_all(c: &mut Coordinator, id: CheckpointId) -> Vec<Action> {
        let mut a = c.on_ack(id, t(0, 0), vec![], vec![]);
        a.extend(c.on_ack(id, t(1, 0), vec![], vec![]));
        a
    }

    #[test]
    fn triggers_on_interval_and_completes_after_every_ack() {
        let mut c = coord(cfg(100, 0, 1000, 0));
        assert!(c.poll(99).is_empty());
        assert_eq!(
            c.poll(100),
            vec![Action::Trigger {
                id: CheckpointId(7),
                is_final: false
            }]
        );
        assert!(c.poll(150).is_empty(), "one checkpoint at a time");
        assert!(c
            .on_ack(CheckpointId(7), t(0, 0), vec![], vec![])
            .is_empty());
        let a = c.on_ack(CheckpointId(7), t(1, 0), vec![], vec![]);
        assert!(matches!(
            a[0],
            Action::Publish {
                id: CheckpointId(7),
                ..
            }
        ));
        c.on_published(CheckpointId(7), 160);
        assert_eq!(
            c.poll(200),
            vec![Action::Trigger {
                id: CheckpointId(8),
                is_final: false
            }]
        );
    }

    #[test]
    fn a_requested_checkpoint_waits_for_the_pending_one_but_not_for_the_interval() {
        // Periodic checkpoints off, a long minimum pause: a request still triggers.
        let mut c = coord(cfg(0, 10_000, 1000, 0));
        assert!(c.poll(5).is_empty());
        c.request_checkpoint();
        let trigger = |id| {
            vec![Action::Trigger {
                id: CheckpointId(id),
                is_final: false,
            }]
        };
        assert_eq!(c.poll(6), trigger(7));
        // Asked again while 7 is pending: one at a time, then at once.
        c.request_checkpoint();
        assert!(c.poll(7).is_empty());
        ack_all(&mut c, CheckpointId(7));
        c.on_published(CheckpointId(7), 8);
        assert_eq!(
            c.poll(9),
            trigger(8),
            "the minimum pause does not hold a request"
        );
        ack_all(&mut c, CheckpointId(8));
        c.on_published(CheckpointId(8), 10);
        assert!(
            c.poll(20_000).is_empty(),
            "served once; no periodic checkpoints"
        );
    }

    #[test]
    fn timeout_aborts_and_fails_beyond_tolerance() {
        let mut c = coord(cfg(10, 0, 50, 1));
        c.poll(10);
        let a = c.poll(60);
        assert_eq!(a.len(), 1, "first failure is tolerated: {a:?}");
        assert!(
            matches!(&a[0], Action::Abort { id: CheckpointId(7), cause: AbortCause::Expired, reason } if reason.contains("expired"))
        );
        c.poll(70);
        let a = c.poll(120);
        assert!(
            matches!(a.last(), Some(Action::Fail { failures: 2, .. })),
            "{a:?}"
        );
    }

    #[test]
    fn declined_checkpoint_aborts_and_late_acks_are_ignored() {
        let mut c = coord(cfg(10, 0, 1000, 5));
        c.poll(10);
        let a = c.on_decline(CheckpointId(7), t(1, 0), "sink cannot flush", 12);
        assert!(
            matches!(&a[0], Action::Abort { reason, cause: AbortCause::Declined, .. } if reason.contains("sink cannot flush"))
        );
        assert!(ack_all(&mut c, CheckpointId(7)).is_empty());
        assert_eq!(c.pending(), None);
    }

    #[test]
    fn success_resets_consecutive_failures() {
        let mut c = coord(cfg(10, 0, 5, 1));
        c.poll(10);
        c.poll(15); // abort 1
        c.poll(25);
        ack_all(&mut c, CheckpointId(8));
        c.on_published(CheckpointId(8), 26);
        c.poll(40);
        let a = c.poll(45); // abort again: 1 consecutive, tolerated
        assert_eq!(a.len(), 1, "{a:?}");
    }

    #[test]
    fn final_checkpoint_when_sources_finish_then_job_finishes() {
        let mut c = coord(cfg(0, 0, 100, 0));
        assert!(
            c.poll(1_000_000).is_empty(),
            "interval 0: no periodic checkpoint"
        );
        c.on_source_finished(t(0, 0));
        assert_eq!(
            c.poll(1_000_001),
            vec![Action::Trigger {
                id: CheckpointId(7),
                is_final: true
            }]
        );
        ack_all(&mut c, CheckpointId(7));
        c.on_published(CheckpointId(7), 1_000_002);
        assert!(c.is_finished());
        assert!(c.poll(2_000_000).is_empty());
    }

    #[test]
    fn stop_waits_for_the_pending_checkpoint_then_takes_a_final_one() {
        let mut c = coord(cfg(10, 0, 100, 0));
        c.poll(10);
        c.on_stop();
        assert!(c.poll(11).is_empty());
        ack_all(&mut c, CheckpointId(7));
        c.on_published(CheckpointId(7), 12);
        assert_eq!(
            c.poll(12),
            vec![Action::Trigger {
                id: CheckpointId(8),
                is_final: true
            }]
        );
    }

    fn pos(partition: i32, next: i64) -> SourcePosition {
        SourcePosition {
            stream: "orders".into(),
            partition,
            next: lockgate_state::NextOffset(next),
            end: None,
            applied: Vec::new(),
            stream_id: None,
            opaque: None,
        }
    }

    fn snap(operator: &str, subtask: u16) -> SubtaskSnapshot {
        SubtaskSnapshot {
            operator: operator.into(),
            subtask,
            key_groups: None,
            state_dir: None,
            files: vec![],
            inline_state: vec![],
        }
    }

    #[test]
    fn accessors_follow_a_checkpoint_through_its_life() {
        let mut c = coord(cfg(10, 0, 100, 0));
        assert_eq!(c.next_id(), CheckpointId(7));
        assert_eq!(c.pending(), None);
        assert_eq!(c.completed(), 0);
        assert!(!c.is_finished());
        c.poll(10);
        assert_eq!(c.pending(), Some(CheckpointId(7)));
        assert_eq!(c.next_id(), CheckpointId(8));
        ack_all(&mut c, CheckpointId(7));
        c.on_published(CheckpointId(7), 11);
        assert_eq!(c.pending(), None);
        assert_eq!(c.completed(), 1);
        assert!(
            !c.is_finished(),
            "a periodic checkpoint does not finish the job"
        );
        c.poll(20);
        ack_all(&mut c, CheckpointId(8));
        c.on_published(CheckpointId(8), 21);
        assert_eq!(c.completed(), 2);
        c.on_stop();
        c.poll(21);
        ack_all(&mut c, CheckpointId(9));
        c.on_published(CheckpointId(9), 22);
        assert_eq!(c.completed(), 3);
        assert!(c.is_finished());
    }

    #[test]
    fn a_checkpoint_being_published_neither_expires_nor_takes_acks_or_declines() {
        let mut c = coord(cfg(10, 0, 50, 0));
        c.poll(10);
        assert!(matches!(
            ack_all(&mut c, CheckpointId(7)).as_slice(),
            [Action::Publish { .. }]
        ));
        assert!(c.poll(1_000).is_empty(), "publishing is not expiring");
        assert!(c
            .on_decline(CheckpointId(7), t(1, 0), "too late", 1_000)
            .is_empty());
        assert!(c
            .on_ack(CheckpointId(7), t(0, 0), vec![], vec![])
            .is_empty());
        assert_eq!(c.pending(), Some(CheckpointId(7)));
        c.on_published(CheckpointId(7), 1_001);
        assert_eq!(c.completed(), 1);
    }

    #[test]
    fn acks_and_declines_of_another_checkpoint_are_ignored() {
        let mut c = coord(cfg(10, 0, 1_000, 0));
        c.poll(10);
        assert!(c
            .on_decline(CheckpointId(6), t(1, 0), "stale", 11)
            .is_empty());
        assert!(ack_all(&mut c, CheckpointId(6)).is_empty());
        assert_eq!(c.pending(), Some(CheckpointId(7)));
        // Checkpoint 7 still needs both of its own acks.
        assert!(c
            .on_ack(CheckpointId(7), t(0, 0), vec![], vec![])
            .is_empty());
        assert_eq!(c.on_ack(CheckpointId(7), t(1, 0), vec![], vec![]).len(), 1);
    }

    #[test]
    fn publish_carries_sorted_positions_and_every_snapshot() {
        let mut c = Coordinator::new(
            cfg(10, 0, 1_000, 0),
            [t(0, 0), t(0, 1), t(1, 0)],
            [t(0, 0), t(0, 1)],
            CheckpointId(1),
            0,
        );
        c.poll(10);
        let id = CheckpointId(1);
        assert!(c.on_ack(id, t(0, 1), vec![pos(1, 5)], vec![]).is_empty());
        assert!(c.on_ack(id, t(0, 0), vec![pos(0, 9)], vec![]).is_empty());
        let a = c.on_ack(id, t(1, 0), vec![], vec![snap("sum", 1), snap("sum", 0)]);
        assert_eq!(
            a,
            vec![Action::Publish {
                id,
                is_final: false,
                positions: vec![pos(0, 9), pos(1, 5)],
                snapshots: vec![snap("sum", 0), snap("sum", 1)],
            }]
        );
    }

    #[test]
    fn the_pause_counts_from_the_end_of_the_previous_checkpoint() {
        let mut c = coord(cfg(10, 30, 1_000, 0));
        c.poll(10);
        ack_all(&mut c, CheckpointId(7));
        c.on_published(CheckpointId(7), 25);
        assert!(c.poll(54).is_empty(), "interval passed, pause not yet");
        assert_eq!(c.poll(55).len(), 1);
    }

    #[test]
    fn a_final_checkpoint_needs_every_source_finished() {
        let mut c = Coordinator::new(
            cfg(0, 0, 1_000, 0),
            [t(0, 0), t(0, 1), t(1, 0)],
            [t(0, 0), t(0, 1)],
            CheckpointId(1),
            0,
        );
        c.on_source_finished(t(0, 0));
        assert!(c.poll(10).is_empty());
        c.on_source_finished(t(0, 1));
        assert_eq!(
            c.poll(11),
            vec![Action::Trigger {
                id: CheckpointId(1),
                is_final: true
            }]
        );
    }

    #[test]
    fn a_failed_final_checkpoint_is_retried_and_publish_failures_count() {
        let mut c = coord(cfg(0, 0, 1_000, 1));
        c.on_stop();
        c.poll(1);
        ack_all(&mut c, CheckpointId(7));
        let a = c.on_publish_failed(CheckpointId(7), "disk full".into(), 2);
        assert!(
            matches!(a.as_slice(), [Action::Abort { id: CheckpointId(7), cause: AbortCause::PublishFailed, reason }] if reason.contains("publish failed: disk full")),
            "{a:?}"
        );
        assert_eq!(
            c.poll(3),
            vec![Action::Trigger {
                id: CheckpointId(8),
                is_final: true
            }]
        );
        ack_all(&mut c, CheckpointId(8));
        let a = c.on_publish_failed(CheckpointId(8), "disk full".into(), 4);
        assert!(
            matches!(a.last(), Some(Action::Fail { failures: 2, last }) if last.contains("checkpoint")),
            "{a:?}"
        );
    }

    proptest! {
        /// Whatever the interleaving of clock ticks, acks and declines: at most one
        /// checkpoint is pending, ids strictly increase, `min_pause` and `interval`
        /// separate triggers, and every trigger is after the start id.
        #[test]
        fn invariants(interval in 1u64..50, pause in 0u64..50, timeout in 1u64..100,
                      steps in proptest::collection::vec((1u64..40, 0u8..4), 1..200)) {
            let mut c = coord(cfg(interval, pause, timeout, u32::MAX));
            let mut now = 0;
            let mut last_trigger: Option<(CheckpointId, u64)> = None;
            let mut last_end: Option<u64> = None;
            for (dt, what) in steps {
                now += dt;
                for a in c.poll(now) {
                    match a {
                        Action::Trigger { id, .. } => {
                            prop_assert!(id >= CheckpointId(7));
                            if let Some((prev, at)) = last_trigger {
                                prop_assert!(id > prev);
                                prop_assert!(now >= at + interval);
                            }
                            if let Some(e) = last_end { prop_assert!(now >= e + pause); }
                            last_trigger = Some((id, now));
                        }
                        Action::Abort { .. } => last_end = Some(now),
                        _ => {}
                    }
                }
                if let Some(id) = c.pending() {
                    match what {
                        0 => {
                            let published = !ack_all(&mut c, id).is_empty();
                            if published { c.on_published(id, now); last_end = Some(now); }
                        }
                        1 => {
                            let aborted = !c.on_decline(id, t(1, 0), "x", now).is_empty();
                            if aborted { last_end = Some(now); }
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}
