//! The watermark rules, as plain functions over data.
//!
//! A watermark `W` is a promise about the records still to come: every one of them
//! has an event time of at least `W` (milliseconds since the Unix epoch). A window
//! `[start, end)` is therefore complete once `W >= end`. A record whose time is below
//! the watermark it meets is late.
//!
//! Each split (Kafka partition) has its own watermark: the highest timestamp it has
//! shown minus the out-of-orderness bound ([`SplitWatermarks`]). A source subtask
//! emits the minimum over its active splits; a split that has shown nothing for the
//! idle timeout stops holding it back, and a subtask whose splits are all idle says
//! so ([`Watermark::Idle`]), so that it holds nothing back downstream either. An
//! operator with several inputs takes the minimum over its active inputs
//! ([`InputWatermarks`]). What a task emits never goes back ([`Emitter`]).

use std::collections::BTreeMap;

/// The event time a bounded input jumps to at its end, so that every window fires.
pub const END_OF_TIME: i64 = i64::MAX;

/// What a task says about event time between its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watermark {
    /// Every later record of this input has an event time of at least this.
    At(i64),
    /// This input has nothing to say for now (all its splits are idle): the
    /// receiver takes the minimum over its other inputs until it speaks again.
    Idle,
}

#[derive(Debug, Clone, Copy)]
struct Split {
    /// The highest event time the split has shown.
    max: Option<i64>,
    /// It showed a record since the last [`SplitWatermarks::current`].
    seen: bool,
    /// The first `current` (processing time, ms) that found it without a record since
    /// the one before: inactivity is measured between looks, never across a stretch in
    /// which nobody looked (a source task blocked by backpressure reads nothing, and
    /// its partitions are not idle for it).
    quiet_since: Option<u64>,
}

/// The per-split watermarks of one source subtask.
#[derive(Debug, Clone)]
pub struct SplitWatermarks<K: Ord> {
    bound_ms: i64,
    idle_ms: Option<u64>,
    splits: BTreeMap<K, Split>,
}

const FRESH: Split = Split {
    max: None,
    seen: false,
    quiet_since: None,
};

impl<K: Ord + Clone> SplitWatermarks<K> {
    /// Splits whose watermark trails their highest timestamp by `bound_ms`, and that
    /// turn idle after `idle_ms` without a record (`None`: never).
    pub fn new(bound_ms: u64, idle_ms: Option<u64>) -> Self {
        SplitWatermarks {
            bound_ms: i64::try_from(bound_ms).unwrap_or(i64::MAX),
            idle_ms,
            splits: BTreeMap::new(),
        }
    }

    /// The subtask owns exactly `owned` now: a new split starts without a timestamp
    /// (holding the watermark back until its first record or its idle timeout), a
    /// split no longer owned is forgotten.
    pub fn assign<'a>(&mut self, owned: impl IntoIterator<Item = &'a K>)
    where
        K: 'a,
    {
        let mut kept = BTreeMap::new();
        for k in owned {
            let s = self.splits.remove(k).unwrap_or(FRESH);
            kept.insert(k.clone(), s);
        }
        self.splits = kept;
    }

    /// Split `split` showed a record of event time `ts`.
    pub fn observe(&mut self, split: &K, ts: i64) {
        let s = match self.splits.get_mut(split) {
            Some(s) => s,
            None => self.splits.entry(split.clone()).or_insert(FRESH),
        };
        s.max = Some(s.max.map_or(ts, |m| m.max(ts)));
        s.seen = true;
    }

    /// The watermark of split `split` (its highest timestamp minus the bound), if it
    /// showed any.
    pub fn of(&self, split: &K) -> Option<i64> {
        self.splits
            .get(split)?
            .max
            .map(|m| m.saturating_sub(self.bound_ms))
    }

    /// Each split with its watermark (`None`: nothing shown yet), as of the last
    /// [`SplitWatermarks::current`].
    pub fn each(&self) -> impl Iterator<Item = (&K, Option<i64>)> {
        self.splits
            .iter()
            .map(move |(k, s)| (k, s.max.map(|m| m.saturating_sub(self.bound_ms))))
    }

    /// The subtask's watermark at `now_ms`: the minimum over its active splits (a
    /// split without a record yet counts as the beginning of time), or
    /// [`Watermark::Idle`] when no split is active (or it owns none). A split is idle
    /// once looks at least `idle_ms` apart found no record of it in between, unless
    /// `backlog` says it has records left to read (then it is being read, slowly).
    pub fn current(&mut self, now_ms: u64, backlog: impl Fn(&K) -> bool) -> Watermark {
        let (bound, idle_ms) = (self.bound_ms, self.idle_ms);
        let mut min: Option<i64> = None;
        for (k, s) in self.splits.iter_mut() {
            if std::mem::take(&mut s.seen) || backlog(k) {
                s.quiet_since = None;
            } else if s.quiet_since.is_none() {
                s.quiet_since = Some(now_ms);
            }
            let idle = idle_ms.is_some_and(|idle| {
                s.quiet_since
                    .is_some_and(|q| now_ms.saturating_sub(q) >= idle)
            });
            if !idle {
                let w = s.max.map_or(i64::MIN, |m| m.saturating_sub(bound));
                min = Some(min.map_or(w, |m| m.min(w)));
            }
        }
        min.map_or(Watermark::Idle, Watermark::At)
    }
}

/// What a task has emitted: a watermark never goes back, and an idle input that
/// speaks again resumes at no less than it had reached.
#[derive(Debug, Clone, Copy)]
pub struct Emitter {
    value: i64,
    idle: bool,
}

impl Default for Emitter {
    fn default() -> Self {
        Emitter {
            value: i64::MIN,
            idle: false,
        }
    }
}

impl Emitter {
    /// The watermark to send for `w`, or `None` when it says nothing new.
    pub fn advance(&mut self, w: Watermark) -> Option<Watermark> {
        match w {
            Watermark::At(v) if v > self.value => {
                self.value = v;
                self.idle = false;
                Some(Watermark::At(v))
            }
            Watermark::At(_) if self.idle => {
                self.idle = false;
                Some(Watermark::At(self.value))
            }
            Watermark::At(_) => None,
            Watermark::Idle if self.idle => None,
            Watermark::Idle => {
                self.idle = true;
                Some(Watermark::Idle)
            }
        }
    }

    /// The highest watermark emitted (`i64::MIN`: none yet).
    pub fn value(&self) -> i64 {
        self.value
    }
}

#[derive(Debug, Clone, Copy)]
struct Input {
    value: i64,
    idle: bool,
}

/// The watermark of a task with several inputs: the minimum over the inputs that are
/// not idle. (An input ends only after the final checkpoint, when nothing may fire
/// any more: a bounded source says [`END_OF_TIME`] before it.)
#[derive(Debug, Clone)]
pub struct InputWatermarks {
    inputs: Vec<Input>,
    out: Emitter,
}

impl InputWatermarks {
    /// `n` inputs, none of which has said anything yet (each holds the watermark at
    /// the beginning of time until it does).
    pub fn new(n: usize) -> Self {
        InputWatermarks {
            inputs: vec![
                Input {
                    value: i64::MIN,
                    idle: false,
                };
                n
            ],
            out: Emitter::default(),
        }
    }

    /// Input `i` sent `w`; the watermark to pass on, if it changed.
    pub fn on_watermark(&mut self, i: usize, w: Watermark) -> Option<Watermark> {
        let input = &mut self.inputs[i];
        match w {
            Watermark::At(v) => {
                input.value = input.value.max(v);
                input.idle = false;
            }
            Watermark::Idle => input.idle = true,
        }
        self.out.advance(self.combined())
    }

    fn combined(&self) -> Watermark {
        let active = self
            .inputs
            .iter()
            .filter(|i| !i.idle)
            .map(|i| i.value)
            .min();
        match active {
            // The end of time is a promise about every input: an idle one may still
            // have records, so it passes only once every input made it.
            Some(END_OF_TIME) => Watermark::At(
                self.inputs
                    .iter()
                    .map(|i| i.value)
                    .min()
                    .unwrap_or(END_OF_TIME),
            ),
            Some(v) => Watermark::At(v),
            None => Watermark::Idle,
        }
    }

    /// The highest watermark passed on.
    pub fn value(&self) -> i64 {
        self.out.value()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn out_of_order_records_within_the_bound_never_move_a_split_back() {
        let mut w = SplitWatermarks::new(5_000, None);
        w.assign([&0]);
        w.observe(&0, 100_000);
        w.observe(&0, 97_000); // out of order, within the bound
        assert_eq!(w.of(&0), Some(95_000));
        assert_eq!(w.current(3, |_| false), Watermark::At(95_000));
        w.observe(&0, 104_000);
        assert_eq!(w.current(5, |_| false), Watermark::At(99_000));
    }

    #[test]
    fn the_slowest_active_split_holds_the_subtask_back_and_an_idle_one_does_not() {
        let mut w = SplitWatermarks::new(0, Some(30_000));
        w.assign([&0, &1, &2]);
        w.observe(&0, 60_000);
        w.observe(&1, 50_000);
        // Split 2 has shown nothing: it holds everything at the beginning of time,
        // and its quiet time starts at this first look.
        assert_eq!(w.current(100, |_| false), Watermark::At(i64::MIN));
        w.observe(&0, 61_000);
        w.observe(&1, 55_000);
        assert_eq!(w.current(30_099, |_| false), Watermark::At(i64::MIN));
        w.observe(&0, 62_000);
        w.observe(&1, 56_000);
        assert_eq!(w.current(30_100, |_| false), Watermark::At(56_000));
        // A split that speaks again holds the watermark back again.
        w.observe(&2, 40_000);
        assert_eq!(w.current(30_101, |_| false), Watermark::At(40_000));
        // Every split quiet from one look to a look 30 s later: the subtask is idle.
        assert_eq!(w.current(30_102, |_| false), Watermark::At(40_000));
        assert_eq!(w.current(60_102, |_| false), Watermark::Idle);
    }

    #[test]
    fn time_nobody_looked_is_not_idleness() {
        // A source task blocked for a minute (backpressure) looks again: a split
        // that was busy before is not idle, its quiet time starts now.
        let mut w = SplitWatermarks::new(0, Some(30_000));
        w.assign([&0, &1]);
        w.observe(&0, 10);
        w.observe(&1, 5);
        assert_eq!(w.current(0, |_| false), Watermark::At(5));
        w.observe(&0, 20);
        assert_eq!(
            w.current(60_000, |_| false),
            Watermark::At(5),
            "split 1 not idle yet"
        );
        w.observe(&0, 30);
        assert_eq!(w.current(89_999, |_| false), Watermark::At(5));
        w.observe(&0, 40);
        assert_eq!(
            w.current(90_000, |_| false),
            Watermark::At(40),
            "quiet from 60 s to 90 s"
        );
    }

    #[test]
    fn a_split_with_records_left_to_read_is_never_idle() {
        let mut w = SplitWatermarks::new(0, Some(1_000));
        w.assign([&0, &1]);
        w.observe(&0, 10);
        w.observe(&1, 5);
        assert_eq!(w.current(0, |_| false), Watermark::At(5));
        // Batches of split 0 only, for a long while: split 1 has a backlog.
        for now in [500, 1_000, 5_000] {
            w.observe(&0, now as i64);
            assert_eq!(w.current(now, |k| *k == 1), Watermark::At(5));
        }
        // Once it has nothing left, it may turn idle.
        w.observe(&0, 6_000);
        assert_eq!(w.current(6_000, |_| false), Watermark::At(5));
        w.observe(&0, 7_000);
        assert_eq!(w.current(7_000, |_| false), Watermark::At(7_000));
    }

    #[test]
    fn a_subtask_without_splits_is_idle_and_a_split_given_away_is_forgotten() {
        let mut w: SplitWatermarks<i32> = SplitWatermarks::new(0, None);
        assert_eq!(w.current(0, |_| false), Watermark::Idle);
        w.assign([&0, &1]);
        w.observe(&0, 10);
        w.observe(&1, 5);
        assert_eq!(w.current(0, |_| false), Watermark::At(5));
        w.assign([&0]);
        assert_eq!(w.current(1, |_| false), Watermark::At(10));
        assert_eq!(w.of(&1), None);
    }

    #[test]
    fn several_inputs_take_the_minimum_over_active_ones() {
        let mut w = InputWatermarks::new(3);
        // The others have said nothing: they hold it at the beginning of time.
        assert_eq!(w.on_watermark(0, Watermark::At(100)), None);
        assert_eq!(w.on_watermark(1, Watermark::At(50)), None);
        assert_eq!(
            w.on_watermark(2, Watermark::At(70)),
            Some(Watermark::At(50))
        );
        // An idle input is left out; when it speaks again, lower, the output stays.
        assert_eq!(w.on_watermark(1, Watermark::Idle), Some(Watermark::At(70)));
        assert_eq!(w.on_watermark(1, Watermark::At(60)), None);
        assert_eq!(w.value(), 70);
        assert_eq!(w.on_watermark(1, Watermark::At(90)), None);
        assert_eq!(
            w.on_watermark(2, Watermark::At(95)),
            Some(Watermark::At(90))
        );
        // Every input idle: idle.
        for i in 0..3 {
            w.on_watermark(i, Watermark::Idle);
        }
        assert_eq!(w.on_watermark(0, Watermark::Idle), None);
        // One input speaks: it alone decides.
        assert_eq!(
            w.on_watermark(0, Watermark::At(200)),
            Some(Watermark::At(200))
        );
        // The end of time of the active inputs does not pass an idle one, which may
        // still have records: the end passes once every input said it.
        assert_eq!(w.on_watermark(1, Watermark::At(END_OF_TIME)), None);
        assert_eq!(w.on_watermark(0, Watermark::At(END_OF_TIME)), None);
        assert_eq!(w.value(), 200);
        assert_eq!(
            w.on_watermark(2, Watermark::At(END_OF_TIME)),
            Some(Watermark::At(END_OF_TIME))
        );
    }

    #[test]
    fn the_end_of_a_bounded_input_fires_everything() {
        let mut e = Emitter::default();
        assert_eq!(e.advance(Watermark::At(10)), Some(Watermark::At(10)));
        assert_eq!(
            e.advance(Watermark::At(END_OF_TIME)),
            Some(Watermark::At(END_OF_TIME))
        );
        assert_eq!(e.advance(Watermark::At(20)), None);
    }

    proptest! {
        /// Whatever the inputs say, in whatever order, what is passed on never goes
        /// back and never passes an active input.
        #[test]
        fn what_is_passed_on_never_goes_back(events in proptest::collection::vec((0usize..3, proptest::option::of(-1000i64..1000)), 0..60)) {
            let mut w = InputWatermarks::new(3);
            let mut last = i64::MIN;
            let mut seen = [i64::MIN; 3];
            let mut idle = [false; 3];
            for (i, v) in events {
                let out = match v {
                    Some(v) => { seen[i] = seen[i].max(v); idle[i] = false; w.on_watermark(i, Watermark::At(v)) }
                    None => { idle[i] = true; w.on_watermark(i, Watermark::Idle) }
                };
                if let Some(Watermark::At(o)) = out {
                    prop_assert!(o >= last, "went back from {last} to {o}");
                    if o > last {
                        // A rise never passes an active input.
                        let active = (0..3).filter(|&k| !idle[k]).map(|k| seen[k]).min();
                        prop_assert!(active.is_some_and(|m| o <= m), "{o} passes an active input");
                    }
                    last = o;
                }
                prop_assert!(w.value() >= last);
            }
        }
    }
}
