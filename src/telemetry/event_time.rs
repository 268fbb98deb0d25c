//! The event-time metric families: watermarks of partitions and operators, windows
//! open and fired, late records.

use super::metrics::{Metrics, SPLIT_LABELS, TASK_LABELS};
use prometheus::{Gauge, GaugeVec, IntCounterVec, IntGaugeVec, Opts};
use std::sync::Arc;

/// The families, registered once per job ([`Metrics::extension`]).
pub struct EventTimeMetrics {
    /// `lockgate_watermark_timestamp_seconds`: per partition (`topic`, `partition`
    /// set) and per operator subtask (both empty).
    pub watermark: GaugeVec,
    pub windows_open: IntGaugeVec,
    pub windows_fired: IntCounterVec,
    pub late_records: IntCounterVec,
}

/// The gauge's name.
pub const WATERMARK: &str = "lockgate_watermark_timestamp_seconds";

impl EventTimeMetrics {
    /// The families of `m`'s job.
    pub fn of(m: &Metrics) -> Arc<EventTimeMetrics> {
        m.extension(|m| EventTimeMetrics {
            watermark: m.register(
                GaugeVec::new(
                    Opts::new(WATERMARK, "The event time a watermark has reached (Unix time): per source partition (topic and partition set) and per operator subtask (what it received; topic and partition empty)."),
                    SPLIT_LABELS,
                )
                .expect("valid metric"),
            ),
            windows_open: m.register(
                IntGaugeVec::new(
                    Opts::new("lockgate_windows_open", "Windows held in state, not yet past their lateness."),
                    TASK_LABELS,
                )
                .expect("valid metric"),
            ),
            windows_fired: m.register(
                IntCounterVec::new(
                    Opts::new("lockgate_windows_fired_total", "Window results emitted (a window emitted again by a late record or an update counts again)."),
                    TASK_LABELS,
                )
                .expect("valid metric"),
            ),
            late_records: m.register(
                IntCounterVec::new(
                    Opts::new("lockgate_late_records_total", "Records that came after their window had fired, by what became of them: dropped, dead_lettered, updated (added to a window kept for its lateness, which was emitted again)."),
                    &["job", "operator", "subtask", "outcome"],
                )
                .expect("valid metric"),
            ),
        })
    }

    /// The watermark gauge of operator `operator`'s subtask `subtask`.
    pub fn operator_watermark(&self, job: &str, operator: &str, subtask: u16) -> Gauge {
        self.watermark
            .with_label_values(&[job, operator, &subtask.to_string(), "", ""])
    }

    /// The watermark gauge of one partition read by a source subtask.
    pub fn partition_watermark(
        &self,
        job: &str,
        subtask: u16,
        topic: &str,
        partition: i32,
    ) -> Gauge {
        self.watermark.with_label_values(&[
            job,
            "source",
            &subtask.to_string(),
            topic,
            &partition.to_string(),
        ])
    }
}

/// Milliseconds since the epoch as the seconds a gauge shows (`None` for the
/// beginning or end of time, which no gauge should show).
pub fn seconds(ms: i64) -> Option<f64> {
    (ms != i64::MIN && ms != i64::MAX).then(|| ms as f64 / 1000.0)
}
