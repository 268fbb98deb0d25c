//! The Prometheus metrics of one job: a registry of its own (never the global one, so
//! that two jobs in one process, or two tests, never share a counter) and every
//! metric family, named after Prometheus conventions (base units, `_total` counters,
//! `_seconds` histograms). Every series carries the `job` label; per-task series also
//! `operator` and `subtask`.

use super::sink::SinkFamilies;
use prometheus::core::Collector;
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;

/// Buckets of the latency histograms: 1 ms to 2 min.
const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Every metric family of a job. Handles for one subtask are taken once (at open) and
/// are atomics from then on: updating a metric on the record path costs one atomic add
/// per batch.
pub struct Metrics {
    registry: Registry,
    job: String,
    // Tasks.
    pub records_in: IntCounterVec,
    pub records_out: IntCounterVec,
    /// Families a connector defines for itself ([`Metrics::extension`]), by type.
    extensions: std::sync::Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
    // Checkpoints.
    pub checkpoints: IntCounterVec,
    pub checkpoint_duration: Histogram,
    pub checkpoint_size: IntGauge,
    pub checkpoint_last_id: IntGauge,
    pub checkpoint_last_timestamp: prometheus::Gauge,
    pub checkpoint_last_age: prometheus::Gauge,
    pub checkpoint_alignment: HistogramVec,
    /// The bulk sinks' families (`lockgate_sink_*`).
    pub sink: SinkFamilies,
    /// Bytes waiting between the source and the sink, by [`Stage`].
    pub buffered_bytes: IntGaugeVec,
    buffered_parts: std::sync::Mutex<Vec<(Stage, std::sync::Weak<dyn Buffered>)>>,
    // Job.
    pub restarts: IntCounterVec,
    pub dead_letters: IntCounterVec,
    pub uptime: prometheus::Gauge,
}

/// Where records wait between the source and the sink (`lockgate_buffered_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Fetched by a source's client and handed over, not yet read by its task.
    Source,
    /// In the channels between tasks.
    Exchange,
    /// Taken by the sink and not yet acknowledged by the target.
    Sink,
}

impl Stage {
    pub const ALL: [Stage; 3] = [Stage::Source, Stage::Exchange, Stage::Sink];

    /// The `stage` label.
    pub fn label(self) -> &'static str {
        match self {
            Stage::Source => "source",
            Stage::Exchange => "exchange",
            Stage::Sink => "sink",
        }
    }
}

/// A part of a job where records wait (a channel, a sink's buffer), counted in
/// `lockgate_buffered_bytes` ([`Metrics::count_buffered`]).
pub trait Buffered: Send + Sync {
    /// The bytes it holds now.
    fn buffered_bytes(&self) -> usize;
}

impl Buffered for std::sync::atomic::AtomicUsize {
    fn buffered_bytes(&self) -> usize {
        self.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Label names of per-task series.
const TASK: &[&str] = &["job", "operator", "subtask"];
/// Label names of per-task series, for the families connectors define.
pub const TASK_LABELS: &[&str] = TASK;
/// Label names of per-split series (split progress).
pub const SPLIT_LABELS: &[&str] = &["job", "operator", "subtask", "topic", "partition"];

impl Metrics {
    /// A fresh registry for job `job`, with the process collector (resident memory,
    /// CPU seconds, open files) where the platform has one.
    pub fn new(job: &str) -> Metrics {
        let registry = Registry::new();
        let reg = |c: Box<dyn Collector>| {
            registry
                .register(c)
                .expect("metric names are unique and valid");
        };
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            reg(Box::new(c.clone()));
            c
        };
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
            reg(Box::new(g.clone()));
            g
        };
        let histogram = |name: &str, help: &str, labels: &[&str]| {
            let h = HistogramVec::new(
                HistogramOpts::new(name, help).buckets(SECONDS_BUCKETS.to_vec()),
                labels,
            )
            .expect("valid metric");
            reg(Box::new(h.clone()));
            h
        };
        let float_gauge = |name: &str, help: &str| {
            let g =
                prometheus::GaugeVec::new(Opts::new(name, help), &["job"]).expect("valid metric");
            reg(Box::new(g.clone()));
            g.with_label_values(&[job])
        };
        let m = Metrics {
            extensions: Default::default(),
            records_in: counter(
                "lockgate_records_in_total",
                "Records that entered the operator.",
                TASK,
            ),
            records_out: counter(
                "lockgate_records_out_total",
                "Records the operator emitted (for the source: read; for the sink: written or dead-lettered).",
                TASK,
            ),
            checkpoints: counter(
                "lockgate_checkpoints_total",
                "Checkpoints by status: completed, declined, failed (publishing), timed_out, abandoned (its attempt failed).",
                &["job", "status"],
            ),
            checkpoint_duration: histogram(
                "lockgate_checkpoint_duration_seconds",
                "Time from a checkpoint's trigger to its publish.",
                &["job"],
            )
            .with_label_values(&[job]),
            checkpoint_size: gauge(
                "lockgate_checkpoint_size_bytes",
                "Bytes of the last completed checkpoint (state files and inline state).",
                &["job"],
            )
            .with_label_values(&[job]),
            checkpoint_last_id: gauge(
                "lockgate_checkpoint_last_completed_id",
                "The id of the last completed checkpoint.",
                &["job"],
            )
            .with_label_values(&[job]),
            checkpoint_last_timestamp: float_gauge(
                "lockgate_checkpoint_last_completed_timestamp_seconds",
                "When the last completed checkpoint was published (Unix time).",
            ),
            checkpoint_last_age: float_gauge(
                "lockgate_checkpoint_last_completed_age_seconds",
                "Seconds since the last completed checkpoint was published, or since the job started if none was (at scrape time).",
            ),
            checkpoint_alignment: histogram(
                "lockgate_checkpoint_alignment_seconds",
                "Time a subtask with several inputs waited from a checkpoint's first barrier to its last.",
                TASK,
            ),
            sink: SinkFamilies::register(&counter, &gauge, &histogram, TASK),
            buffered_bytes: gauge(
                "lockgate_buffered_bytes",
                "Bytes of records waiting between the source and the sink, by stage: source (fetched and handed over, not yet read by the source's task), exchange (in the channels between tasks), sink (actions taken by the sink and not yet acknowledged, their bookkeeping included). Each stage is bounded; a backlog makes the source wait.",
                &["job", "stage"],
            ),
            buffered_parts: Default::default(),
            restarts: counter(
                "lockgate_restarts_total",
                "In-process restarts of the job by cause.",
                &["job", "cause"],
            ),
            dead_letters: counter(
                "lockgate_dead_letters_total",
                "Records dead-lettered by reason.",
                &["job", "operator", "subtask", "reason"],
            ),
            uptime: float_gauge(
                "lockgate_job_uptime_seconds",
                "Seconds since the job started (at scrape time).",
            ),
            job: job.to_string(),
            registry,
        };
        #[cfg(target_os = "linux")]
        {
            let pc = prometheus::process_collector::ProcessCollector::for_self();
            let _ = m.registry.register(Box::new(pc));
        }
        // Every status of the counter exists from the start, so a query for failures
        // shows 0 rather than no data.
        for s in ["completed", "declined", "failed", "timed_out", "abandoned"] {
            m.checkpoints.with_label_values(&[job, s]);
        }
        m
    }

    /// The job label of every series.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// Counts what `part` holds at `stage` in `lockgate_buffered_bytes` for as long as
    /// `part` lives: the gauge is the sum over the live parts, taken when it is read
    /// ([`Metrics::refresh_buffered`]), so a part that goes away (a failed attempt's
    /// channels and sinks) takes its bytes with it.
    pub fn count_buffered(&self, stage: Stage, part: &Arc<dyn Buffered>) {
        let mut parts = self.buffered_parts.lock().expect("lock");
        parts.retain(|(_, p)| p.strong_count() > 0);
        parts.push((stage, Arc::downgrade(part)));
    }

    /// Sets `lockgate_buffered_bytes` from the live parts; returns the bytes by stage,
    /// in the order of [`Stage::ALL`].
    pub fn refresh_buffered(&self) -> [u64; 3] {
        let mut sums = [0u64; 3];
        let mut parts = self.buffered_parts.lock().expect("lock");
        parts.retain(|(stage, p)| match p.upgrade() {
            Some(p) => {
                let at = Stage::ALL.iter().position(|s| s == stage).expect("a stage");
                sums[at] += p.buffered_bytes() as u64;
                true
            }
            None => false,
        });
        for (stage, sum) in Stage::ALL.iter().zip(sums) {
            self.buffered_bytes
                .with_label_values(&[self.job.as_str(), stage.label()])
                .set(sum as i64);
        }
        sums
    }

    /// The metric families a connector defines for itself: `make` registers them in
    /// this job's registry (with [`Metrics::register`]) the first time a subtask asks,
    /// and every later call, from any subtask or attempt, returns the same ones.
    pub fn extension<T: Any + Send + Sync>(&self, make: impl FnOnce(&Metrics) -> T) -> Arc<T> {
        let mut ext = self.extensions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = ext.get(&TypeId::of::<T>()) {
            return found.clone().downcast().expect("stored under its own type");
        }
        let made = Arc::new(make(self));
        ext.insert(TypeId::of::<T>(), made.clone());
        made
    }

    /// The families of type `T` if a subtask made them ([`Metrics::extension`]);
    /// reading never registers them.
    pub fn existing_extension<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        let ext = self.extensions.lock().unwrap_or_else(|e| e.into_inner());
        ext.get(&TypeId::of::<T>())
            .map(|found| found.clone().downcast().expect("stored under its own type"))
    }

    /// Registers a family `collector` (built with `labels` starting with `job`) in this
    /// job's registry; for [`Metrics::extension`]. A name registered twice panics.
    pub fn register<C: Collector + Clone + 'static>(&self, collector: C) -> C {
        self.registry
            .register(Box::new(collector.clone()))
            .expect("metric names are unique and valid");
        collector
    }

    /// The registry, for exporters.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The counter of one subtask of one operator.
    pub fn task_counter(&self, vec: &IntCounterVec, operator: &str, subtask: u16) -> IntCounter {
        vec.with_label_values(&[self.job.as_str(), operator, &subtask.to_string()])
    }

    /// The gauge of one subtask of one operator.
    pub fn task_gauge(&self, vec: &IntGaugeVec, operator: &str, subtask: u16) -> IntGauge {
        vec.with_label_values(&[self.job.as_str(), operator, &subtask.to_string()])
    }

    /// The histogram of one subtask of one operator.
    pub fn task_histogram(&self, vec: &HistogramVec, operator: &str, subtask: u16) -> Histogram {
        vec.with_label_values(&[self.job.as_str(), operator, &subtask.to_string()])
    }

    /// The Prometheus text format of every metric.
    pub fn encode(&self) -> String {
        let families = self.registry.gather();
        let mut out = String::new();
        prometheus::TextEncoder::new()
            .encode_utf8(&families, &mut out)
            .expect("text encoding of gathered metrics");
        out
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").field("job", &self.job).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The gauge of a stage is the sum over its live parts; a part that goes away
    /// (a failed attempt's channels) takes its bytes with it.
    #[test]
    fn buffered_bytes_sum_the_live_parts_of_each_stage() {
        let m = Metrics::new("j");
        let a = Arc::new(AtomicUsize::new(5));
        let b = Arc::new(AtomicUsize::new(7));
        let c = Arc::new(AtomicUsize::new(11));
        for (stage, part) in [(Stage::Sink, &a), (Stage::Sink, &b), (Stage::Exchange, &c)] {
            let part: Arc<dyn Buffered> = part.clone();
            m.count_buffered(stage, &part);
        }
        assert_eq!(m.refresh_buffered(), [0, 11, 12]);
        let gauge = |stage: Stage| {
            m.buffered_bytes
                .with_label_values(&["j", stage.label()])
                .get()
        };
        assert_eq!((gauge(Stage::Source), gauge(Stage::Sink)), (0, 12));
        b.store(1, Ordering::Relaxed);
        drop(c);
        assert_eq!(m.refresh_buffered(), [0, 0, 6]);
        assert_eq!((gauge(Stage::Exchange), gauge(Stage::Sink)), (0, 6));
        drop((a, b));
        assert_eq!(m.refresh_buffered(), [0, 0, 0]);
        assert!(
            m.buffered_parts.lock().unwrap().is_empty(),
            "dead parts are pruned"
        );
    }
}
