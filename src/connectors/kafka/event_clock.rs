//! The Kafka source's event time: each record's time read as `[source.kafka.watermark]`
//! says, and a watermark per partition ([`SplitWatermarks`]) from which the subtask's
//! is made.
//!
//! Watermarks are not checkpointed here. After a restore each partition starts again
//! without one and holds the subtask's watermark back until its first record (or its
//! idle timeout), so a restored source never says more than its records show. What
//! must not change across a restore, which records are late, the window operator
//! keeps in its own state (see [`crate::operators::window`]).

use super::Tp;
use crate::event_time::{EventTime, SplitWatermarks, Watermark, END_OF_TIME};
use crate::telemetry::event_time::{seconds, EventTimeMetrics};
use prometheus::Gauge;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// The event time of one source subtask.
pub(super) struct EventClock {
    pub(super) settings: EventTime,
    splits: SplitWatermarks<Tp>,
    started: Instant,
    metrics: Option<(Arc<EventTimeMetrics>, String, u16)>,
    /// Gauges of the partitions that showed a time (a series appears with its first
    /// value, never as 0).
    gauges: BTreeMap<Tp, Gauge>,
    /// The subtask's gauge, once it has a value, and the highest value it showed.
    operator: Option<(Gauge, i64)>,
}

impl EventClock {
    pub(super) fn new(settings: EventTime) -> EventClock {
        EventClock {
            splits: SplitWatermarks::new(
                settings.max_out_of_orderness_ms,
                settings.idle_timeout_ms,
            ),
            settings,
            started: Instant::now(),
            metrics: None,
            gauges: BTreeMap::new(),
            operator: None,
        }
    }

    /// Reports to `telemetry`'s gauges as subtask `subtask`.
    pub(super) fn report_to(&mut self, telemetry: &crate::telemetry::Telemetry, subtask: u16) {
        let m = EventTimeMetrics::of(telemetry.metrics());
        let job = telemetry.metrics().job().to_string();
        self.metrics = Some((m, job, subtask));
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Partition `tp` showed a record of event time `ts`.
    pub(super) fn observe(&mut self, tp: &Tp, ts: i64) {
        self.splits.observe(tp, ts);
    }

    /// The subtask's watermark over the partitions `owned`; [`END_OF_TIME`] once a
    /// bounded source `finished`.
    /// A partition with a `backlog` is never taken for idle.
    pub(super) fn watermark<'a>(
        &mut self,
        owned: impl IntoIterator<Item = &'a Tp>,
        finished: bool,
        backlog: impl Fn(&Tp) -> bool,
    ) -> Watermark {
        let now = self.now_ms();
        self.splits.assign(owned);
        let current = self.splits.current(now, backlog);
        let w = if finished {
            Watermark::At(END_OF_TIME)
        } else {
            current
        };
        if let Some((m, job, subtask)) = &self.metrics {
            let mut seen = BTreeMap::new();
            for (tp, w) in self.splits.each() {
                let Some(s) = w.and_then(seconds) else {
                    continue;
                };
                let g = self
                    .gauges
                    .remove(tp)
                    .unwrap_or_else(|| m.partition_watermark(job, *subtask, &tp.0, tp.1));
                g.set(s);
                seen.insert(tp.clone(), g);
            }
            for (tp, _) in std::mem::replace(&mut self.gauges, seen) {
                let _ = m.watermark.remove_label_values(&[
                    job,
                    "source",
                    &subtask.to_string(),
                    &tp.0,
                    &tp.1.to_string(),
                ]);
            }
            // What the subtask sends never goes back; neither does its gauge.
            if let Watermark::At(t) = w {
                if let Some(s) = seconds(t) {
                    match &mut self.operator {
                        Some((g, high)) if t > *high => {
                            g.set(s);
                            *high = t;
                        }
                        Some(_) => {}
                        None => {
                            let g = m.operator_watermark(job, "source", *subtask);
                            g.set(s);
                            self.operator = Some((g, t));
                        }
                    }
                }
            }
        }
        w
    }
}
