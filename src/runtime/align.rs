//! Barrier alignment for a task with several inputs.
//!
//! An input that delivered `Barrier(N)` is blocked (not read) until every input has
//! delivered it, so that the snapshot at `N` reflects exactly the records before the
//! barrier on every input. A newer barrier during alignment aborts the older one. An
//! input that ended counts as having delivered every later barrier.

use lockgate_state::CheckpointId;

/// What one event did to the alignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlignEvent {
    /// Still waiting for other inputs (or nothing happened).
    Waiting,
    /// All inputs delivered the barrier: snapshot now, then unblock.
    Aligned(CheckpointId),
    /// A newer barrier arrived while aligning `aborted`; alignment of `started` began.
    Superseded {
        aborted: CheckpointId,
        started: CheckpointId,
    },
    /// A barrier of a checkpoint already aligned or aborted; ignored.
    Stale,
}

/// The alignment state machine (no I/O).
#[derive(Debug, Clone)]
pub struct Aligner {
    current: Option<CheckpointId>,
    arrived: Vec<bool>,
    ended: Vec<bool>,
    last_done: Option<CheckpointId>,
}

impl Aligner {
    /// An aligner over `inputs` inputs.
    pub fn new(inputs: usize) -> Aligner {
        Aligner {
            current: None,
            arrived: vec![false; inputs],
            ended: vec![false; inputs],
            last_done: None,
        }
    }

    /// Whether `input` must not be read now.
    pub fn is_blocked(&self, input: usize) -> bool {
        self.current.is_some() && self.arrived[input]
    }

    /// Whether every input ended.
    pub fn all_ended(&self) -> bool {
        self.ended.iter().all(|e| *e)
    }

    /// The checkpoint being aligned, if any.
    pub fn aligning(&self) -> Option<CheckpointId> {
        self.current
    }

    fn complete_if_aligned(&mut self) -> Option<CheckpointId> {
        let id = self.current?;
        let all = self.arrived.iter().zip(&self.ended).all(|(a, e)| *a || *e);
        if all {
            self.current = None;
            self.arrived.iter_mut().for_each(|a| *a = false);
            self.last_done = Some(id);
            Some(id)
        } else {
            None
        }
    }

    /// Input `input` delivered `Barrier(id)`.
    pub fn on_barrier(&mut self, input: usize, id: CheckpointId) -> AlignEvent {
        debug_assert!(!self.ended[input], "barrier after end of input");
        if self.last_done.is_some_and(|d| id <= d) {
            return AlignEvent::Stale;
        }
        match self.current {
            Some(cur) if id < cur => AlignEvent::Stale,
            Some(cur) if id == cur => {
                debug_assert!(!self.arrived[input], "an input delivered a barrier twice");
                self.arrived[input] = true;
                self.complete_if_aligned()
                    .map_or(AlignEvent::Waiting, AlignEvent::Aligned)
            }
            Some(cur) => {
                self.arrived.iter_mut().for_each(|a| *a = false);
                self.current = Some(id);
                self.arrived[input] = true;
                match self.complete_if_aligned() {
                    Some(done) => AlignEvent::Aligned(done),
                    None => AlignEvent::Superseded {
                        aborted: cur,
                        started: id,
                    },
                }
            }
            None => {
                self.current = Some(id);
                self.arrived[input] = true;
                self.complete_if_aligned()
                    .map_or(AlignEvent::Waiting, AlignEvent::Aligned)
            }
        }
    }

    /// Input `input` ended.
    pub fn on_end_of_input(&mut self, input: usize) -> AlignEvent {
        self.ended[input] = true;
        self.complete_if_aligned()
            .map_or(AlignEvent::Waiting, AlignEvent::Aligned)
    }

    /// The coordinator aborted `id`: stop aligning it and unblock every input.
    pub fn cancel(&mut self, id: CheckpointId) {
        if self.current == Some(id) {
            self.current = None;
            self.arrived.iter_mut().for_each(|a| *a = false);
        }
        if self.last_done.is_none_or(|d| d < id) {
            self.last_done = Some(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn c(i: u64) -> CheckpointId {
        CheckpointId(i)
    }

    #[test]
    fn aligns_only_when_every_input_delivered() {
        let mut a = Aligner::new(3);
        assert_eq!(a.on_barrier(0, c(1)), AlignEvent::Waiting);
        assert!(a.is_blocked(0) && !a.is_blocked(1));
        assert_eq!(a.on_barrier(2, c(1)), AlignEvent::Waiting);
        assert_eq!(a.on_barrier(1, c(1)), AlignEvent::Aligned(c(1)));
        assert!(!a.is_blocked(0) && !a.is_blocked(2));
    }

    #[test]
    fn newer_barrier_supersedes_and_older_becomes_stale() {
        let mut a = Aligner::new(2);
        a.on_barrier(0, c(1));
        assert_eq!(
            a.on_barrier(1, c(2)),
            AlignEvent::Superseded {
                aborted: c(1),
                started: c(2)
            }
        );
        assert!(a.is_blocked(1) && !a.is_blocked(0));
        assert_eq!(a.on_barrier(0, c(2)), AlignEvent::Aligned(c(2)));
        assert_eq!(a.on_barrier(0, c(1)), AlignEvent::Stale);
    }

    #[test]
    fn ended_input_counts_as_delivered() {
        let mut a = Aligner::new(2);
        a.on_barrier(0, c(4));
        assert_eq!(a.on_end_of_input(1), AlignEvent::Aligned(c(4)));
        assert_eq!(a.on_barrier(0, c(5)), AlignEvent::Aligned(c(5)));
    }

    #[test]
    fn cancel_unblocks_and_makes_late_barriers_stale() {
        let mut a = Aligner::new(2);
        a.on_barrier(0, c(3));
        a.cancel(c(3));
        assert!(!a.is_blocked(0));
        assert_eq!(a.on_barrier(1, c(3)), AlignEvent::Stale);
        assert_eq!(a.on_barrier(1, c(4)), AlignEvent::Waiting);
    }

    #[test]
    fn aligning_and_all_ended_report_the_state() {
        let mut a = Aligner::new(2);
        assert_eq!(a.aligning(), None);
        assert!(!a.all_ended());
        a.on_barrier(0, c(1));
        assert_eq!(a.aligning(), Some(c(1)));
        a.on_end_of_input(1);
        assert_eq!(a.aligning(), None, "aligned by the end of input 1");
        assert!(!a.all_ended());
        a.on_end_of_input(0);
        assert!(a.all_ended());
    }

    #[test]
    fn cancel_never_lowers_the_last_finished_checkpoint() {
        let mut a = Aligner::new(2);
        a.on_barrier(0, c(5));
        assert_eq!(a.on_barrier(1, c(5)), AlignEvent::Aligned(c(5)));
        // A late abort of an older checkpoint: 4 stays stale.
        a.cancel(c(3));
        assert_eq!(a.on_barrier(0, c(4)), AlignEvent::Stale);
        // An abort of a checkpoint not yet seen here: its barriers are stale too.
        a.cancel(c(7));
        assert_eq!(a.on_barrier(0, c(7)), AlignEvent::Stale);
        assert_eq!(a.on_barrier(0, c(8)), AlignEvent::Waiting);
    }

    proptest! {
        /// Each input delivers increasing barrier ids (with gaps, as sources skip
        /// aborted checkpoints) interleaved at random. A checkpoint is aligned only
        /// when every input delivered it, at most once, in increasing order, and a
        /// blocked input is never asked to deliver.
        #[test]
        fn model(inputs in 1usize..5, schedule in proptest::collection::vec((0usize..5, 1u64..4), 0..80)) {
            let mut a = Aligner::new(inputs);
            let mut next: Vec<u64> = vec![0; inputs];
            let mut delivered: Vec<Vec<u64>> = vec![Vec::new(); inputs];
            let mut aligned: Vec<u64> = Vec::new();
            for (pick, step) in schedule {
                // Deliver on the first unblocked input at or after `pick`.
                let Some(i) = (0..inputs).map(|k| (pick + k) % inputs).find(|&i| !a.is_blocked(i)) else {
                    prop_assert!(false, "every input blocked: deadlock");
                    unreachable!()
                };
                next[i] += step;
                delivered[i].push(next[i]);
                match a.on_barrier(i, c(next[i])) {
                    AlignEvent::Aligned(id) => {
                        for d in &delivered { prop_assert!(d.contains(&id.0)); }
                        prop_assert!(aligned.last().is_none_or(|l| *l < id.0));
                        aligned.push(id.0);
                    }
                    AlignEvent::Superseded { aborted, started } => prop_assert!(aborted < started),
                    AlignEvent::Waiting | AlignEvent::Stale => {}
                }
            }
        }
    }
}
