//! Which windows a record belongs to, how sessions merge, and what a record's
//! arrival means at a given watermark: plain functions over data.
//!
//! Windows are `[start, end)` in epoch milliseconds, aligned to the epoch (a tumbling
//! minute starts on the minute). A watermark `W` completes every window with
//! `end <= W` (see [`crate::event_time::watermark`]).

use serde::{Deserialize, Serialize};

/// The kinds of window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowKind {
    /// Fixed, non-overlapping windows of `size` ms.
    Tumbling { size: i64 },
    /// Windows of `size` ms starting every `slide` ms: a record belongs to
    /// `ceil(size / slide)` of them (or fewer, where slide does not divide size).
    Hopping { size: i64, slide: i64 },
    /// A record opens `[t, t + gap)`; windows that overlap or touch merge.
    Session { gap: i64 },
}

/// A window's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Span {
    pub start: i64,
    pub end: i64,
}

impl Span {
    /// Whether the two overlap or touch (sessions that do are one).
    pub fn joins(&self, other: &Span) -> bool {
        self.start <= other.end && other.start <= self.end
    }
}

impl WindowKind {
    /// The windows of a record at event time `t`, oldest first (a session: the one the
    /// record opens, before merging); `None` when a window of it would start or end
    /// beyond what an `i64` of milliseconds holds (its end must stay below
    /// [`crate::event_time::END_OF_TIME`], which completes every window).
    pub fn spans(&self, t: i64) -> Option<Vec<Span>> {
        let span = |start: i64, len: i64| {
            start
                .checked_add(len)
                .filter(|end| *end < crate::event_time::END_OF_TIME)
                .map(|end| Span { start, end })
        };
        match *self {
            WindowKind::Tumbling { size } => {
                Some(vec![span(t.checked_sub(t.rem_euclid(size))?, size)?])
            }
            WindowKind::Hopping { size, slide } => {
                let mut start = t.checked_sub(t.rem_euclid(slide))?;
                let mut out = Vec::new();
                while start.checked_add(size)? > t {
                    out.push(span(start, size)?);
                    start = start.checked_sub(slide)?;
                }
                out.reverse();
                Some(out)
            }
            WindowKind::Session { gap } => Some(vec![span(t, gap)?]),
        }
    }

    /// Whether windows of this kind merge.
    pub fn merges(&self) -> bool {
        matches!(self, WindowKind::Session { .. })
    }
}

/// The sessions of `existing` that `new` joins, by index, and the merged span: the
/// smallest span covering `new` and each of them. Joining is transitive through
/// `new` only: existing sessions never join one another (they were merged when they
/// did).
pub fn merge(existing: &[Span], new: Span) -> (Vec<usize>, Span) {
    let mut merged = new;
    let mut joined = Vec::new();
    for (i, s) in existing.iter().enumerate() {
        if s.joins(&new) {
            joined.push(i);
            merged.start = merged.start.min(s.start);
            merged.end = merged.end.max(s.end);
        }
    }
    (joined, merged)
}

/// When a window is emitted, and when it may still change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// `allowed_lateness_ms`.
    pub lateness: i64,
    /// `emit = "final"` (else `update`: on every change).
    pub emit_final: bool,
    /// `late = "update"`: a window is emitted when the watermark passes its end, kept
    /// for the lateness, and emitted again with each late record.
    pub late_updates: bool,
}

/// What a record means for one of its windows, at the watermark it meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// The window has not been emitted as complete: the record is added.
    OnTime,
    /// The window is complete and still kept (within its lateness): the record is
    /// added and the window emitted again. A late record.
    Update,
    /// The window is past its lateness (its state gone): the record is late and
    /// follows `late`.
    TooLate,
}

impl Timing {
    /// When a window ending at `end` is past its lateness: its state is deleted.
    pub fn purge_at(&self, end: i64) -> i64 {
        end.saturating_add(self.lateness)
    }

    /// When a window ending at `end` counts as complete: emitted once under `emit =
    /// "final"` (at its end plus the lateness, or at its end when late records update
    /// it), and from then on a record of it is late.
    pub fn complete_at(&self, end: i64) -> i64 {
        if self.late_updates || !self.emit_final {
            end
        } else {
            self.purge_at(end)
        }
    }

    /// The record's arrival in the window ending at `end`, at watermark `wm`.
    pub fn arrival(&self, end: i64, wm: i64) -> Arrival {
        if self.purge_at(end) <= wm {
            Arrival::TooLate
        } else if self.complete_at(end) <= wm {
            Arrival::Update
        } else {
            Arrival::OnTime
        }
    }

    /// The next moment something happens to a window ending at `end` that was
    /// `emitted` or not: its final emission, or its purge.
    pub fn next_event(&self, end: i64, emitted: bool) -> i64 {
        if self.emit_final && !emitted {
            self.complete_at(end)
        } else {
            self.purge_at(end)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(start: i64, end: i64) -> Span {
        Span { start, end }
    }

    #[test]
    fn tumbling_windows_are_aligned_to_the_epoch_and_end_exclusive() {
        let k = WindowKind::Tumbling { size: 60_000 };
        assert_eq!(k.spans(0), Some(vec![s(0, 60_000)]));
        assert_eq!(k.spans(59_999), Some(vec![s(0, 60_000)]));
        assert_eq!(k.spans(60_000), Some(vec![s(60_000, 120_000)]));
        // Before the epoch too.
        assert_eq!(k.spans(-1), Some(vec![s(-60_000, 0)]));
        // At the ends of time: no window, rather than one that wraps around.
        assert_eq!(k.spans(i64::MIN), None);
        assert_eq!(k.spans(i64::MAX - 1), None);
        assert_eq!(WindowKind::Session { gap: 10 }.spans(i64::MAX - 10), None);
        assert!(WindowKind::Session { gap: 10 }
            .spans(i64::MAX - 11)
            .is_some());
    }

    #[test]
    fn hopping_windows_overlap() {
        let k = WindowKind::Hopping {
            size: 60_000,
            slide: 20_000,
        };
        assert_eq!(
            k.spans(65_000).unwrap(),
            vec![s(20_000, 80_000), s(40_000, 100_000), s(60_000, 120_000)]
        );
        // On a boundary: the window starting there, and the two before it.
        assert_eq!(
            k.spans(60_000).unwrap(),
            vec![s(20_000, 80_000), s(40_000, 100_000), s(60_000, 120_000)]
        );
        // A slide that does not divide the size.
        let k = WindowKind::Hopping {
            size: 25,
            slide: 10,
        };
        assert_eq!(k.spans(24).unwrap(), vec![s(0, 25), s(10, 35), s(20, 45)]);
        assert_eq!(k.spans(25).unwrap(), vec![s(10, 35), s(20, 45)]);
        // Every window holds the record, and none that would is missing.
        for t in -50..50 {
            let got = k.spans(t).unwrap();
            assert!(got.iter().all(|w| w.start <= t && t < w.end));
            let all: Vec<Span> = (-10..10)
                .map(|i| s(i * 10, i * 10 + 25))
                .filter(|w| w.start <= t && t < w.end)
                .collect();
            assert_eq!(got, all, "at {t}");
        }
    }

    #[test]
    fn a_record_that_bridges_two_sessions_merges_them() {
        let k = WindowKind::Session { gap: 30 };
        let existing = [s(0, 40), s(100, 130)];
        // 70..100 touches the second; 20..50 overlaps the first.
        let (joined, merged) = merge(&existing, k.spans(70).unwrap()[0]);
        assert_eq!((joined, merged), (vec![1], s(70, 130)));
        let (joined, merged) = merge(&existing, k.spans(20).unwrap()[0]);
        assert_eq!((joined, merged), (vec![0], s(0, 50)));
        // 40..70 touches the first and not the second (70 < 100).
        assert_eq!(
            merge(&existing, k.spans(40).unwrap()[0]),
            (vec![0], s(0, 70))
        );
        // 60..90 joins neither; 40..105 joins both.
        assert_eq!(merge(&existing, s(60, 90)), (vec![], s(60, 90)));
        assert_eq!(merge(&existing, s(40, 105)), (vec![0, 1], s(0, 130)));
    }

    #[test]
    fn arrivals_follow_the_watermark_the_lateness_and_the_policy() {
        let drop = Timing {
            lateness: 10,
            emit_final: true,
            late_updates: false,
        };
        // Emitted once at end + lateness; before that every record counts.
        assert_eq!(drop.arrival(100, 99), Arrival::OnTime);
        assert_eq!(drop.arrival(100, 105), Arrival::OnTime);
        assert_eq!(drop.arrival(100, 110), Arrival::TooLate);
        assert_eq!(drop.next_event(100, false), 110);
        let update = Timing {
            late_updates: true,
            ..drop
        };
        // Emitted at its end, then updated by late records until end + lateness.
        assert_eq!(update.next_event(100, false), 100);
        assert_eq!(update.next_event(100, true), 110);
        assert_eq!(update.arrival(100, 99), Arrival::OnTime);
        assert_eq!(update.arrival(100, 100), Arrival::Update);
        assert_eq!(update.arrival(100, 109), Arrival::Update);
        assert_eq!(update.arrival(100, 110), Arrival::TooLate);
        let every_change = Timing {
            emit_final: false,
            ..drop
        };
        assert_eq!(every_change.next_event(100, false), 110);
        assert_eq!(every_change.arrival(100, 105), Arrival::Update);
        // No lateness: complete and gone at the end.
        let strict = Timing {
            lateness: 0,
            emit_final: true,
            late_updates: false,
        };
        assert_eq!(strict.arrival(100, 99), Arrival::OnTime);
        assert_eq!(strict.arrival(100, 100), Arrival::TooLate);
        assert_eq!(strict.next_event(100, false), 100);
    }
}
