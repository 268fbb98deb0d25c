//! Watching a running job: its Prometheus metrics ([`metrics`]), its state and
//! checkpoint history ([`status`]), and (with the `harness` feature) the HTTP server
//! that serves them with health probes, a REST API and a status page ([`server`]).
//!
//! One [`Telemetry`] belongs to one job run. It is cheap to clone (one `Arc`); every
//! task gets it through [`crate::connector::SubtaskInfo`] and the executor reports
//! the job's life to it. Nothing here blocks the record path: counters are atomics,
//! the status is behind a mutex taken a few times per checkpoint.

#[cfg(feature = "harness")]
pub mod control_api;
pub mod event_time;
pub mod metrics;
#[cfg(feature = "harness")]
pub mod server;
pub mod sink;
pub mod status;

use metrics::Metrics;
use prometheus::core::Collector;
use serde::Serialize;
use status::{
    AckView, CheckpointCounts, CheckpointStatus, CheckpointView, JobState, JobView, Status,
};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

/// The telemetry of one job run (see the module documentation).
#[derive(Clone)]
pub struct Telemetry {
    inner: Arc<Inner>,
}

struct Inner {
    metrics: Metrics,
    started: Instant,
    status: Mutex<Status>,
    partitions: Mutex<BTreeMap<(String, i32), PartitionGauges>>,
    /// Split-progress families, by the name of their position gauge.
    split_families: Mutex<std::collections::HashMap<&'static str, Arc<SplitFamily>>>,
    /// The last checkpoint completed (0: none yet), for [`Telemetry::completions`].
    completed: tokio::sync::watch::Sender<u64>,
}

/// The names (and help texts) a source reports its splits' progress under: the
/// position of the next record, the split's end as last fetched, and the records
/// between (the Kafka source's are `lockgate_kafka_partition_position`,
/// `..._end_offset` and `..._lag`). Labels: [`metrics::SPLIT_LABELS`].
#[derive(Debug, Clone, Copy)]
pub struct SplitProgressNames {
    pub position: (&'static str, &'static str),
    pub end: (&'static str, &'static str),
    pub lag: (&'static str, &'static str),
}

/// The gauge families of one [`SplitProgressNames`].
struct SplitFamily {
    position: prometheus::IntGaugeVec,
    end: prometheus::IntGaugeVec,
    lag: prometheus::IntGaugeVec,
}

impl SplitFamily {
    fn new(m: &Metrics, names: &SplitProgressNames) -> SplitFamily {
        let gauge = |(name, help): (&str, &str)| {
            m.register(
                prometheus::IntGaugeVec::new(
                    prometheus::Opts::new(name, help),
                    metrics::SPLIT_LABELS,
                )
                .expect("valid metric"),
            )
        };
        SplitFamily {
            position: gauge(names.position),
            end: gauge(names.end),
            lag: gauge(names.lag),
        }
    }
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("job", &self.inner.metrics.job())
            .finish()
    }
}

impl Default for Telemetry {
    /// The telemetry of an unnamed job that nobody serves (unit tests, benches).
    fn default() -> Telemetry {
        Telemetry::new("job", "", 1, 128)
    }
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Telemetry {
    /// The telemetry of job `name` (graph `graph`, as [`crate::job::JobGraph::describe`]
    /// gives it), in state [`JobState::Starting`].
    pub fn new(name: &str, graph: &str, parallelism: u16, max_parallelism: u16) -> Telemetry {
        let job = JobView {
            name: name.to_string(),
            graph: graph.to_string(),
            state: JobState::Starting,
            started_at_ms: wall_ms(),
            uptime_seconds: 0.0,
            buffered_bytes: Default::default(),
            parallelism,
            max_parallelism,
            member: 0,
            members: 1,
            restored_from: None,
            restarts: 0,
            last_failure: None,
            checkpoints_completed: 0,
            checkpoints_since_restart: 0,
            last_checkpoint: None,
            periodic_checkpoints: true,
            paused: false,
            tasks: None,
            tasks_open: 0,
        };
        Telemetry {
            inner: Arc::new(Inner {
                metrics: Metrics::new(name),
                started: Instant::now(),
                status: Mutex::new(Status {
                    job,
                    counts: CheckpointCounts::default(),
                    history: VecDeque::new(),
                }),
                partitions: Mutex::new(BTreeMap::new()),
                split_families: Default::default(),
                completed: tokio::sync::watch::Sender::new(0),
            }),
        }
    }

    /// Every metric family.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    fn status(&self) -> std::sync::MutexGuard<'_, Status> {
        // A panic while holding the lock leaves plain data behind: still readable.
        self.inner.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The metrics in the Prometheus text format, with the scrape-time gauges (ages,
    /// uptime, lag) brought up to date.
    pub fn scrape(&self) -> String {
        let m = &self.inner.metrics;
        m.uptime.set(self.inner.started.elapsed().as_secs_f64());
        let last = m.checkpoint_last_timestamp.get();
        // Before the first checkpoint, the age runs from the start: a job that never
        // completes one must trip an alert on the age as well.
        let age = if last > 0.0 {
            wall_ms() as f64 / 1000.0 - last
        } else {
            self.inner.started.elapsed().as_secs_f64()
        };
        m.checkpoint_last_age.set(age.max(0.0));
        m.refresh_buffered();
        self.export_partitions();
        m.encode()
    }

    // --- the job's life, reported by the executor ---

    /// The process runs as `member` of the job.
    pub fn member(&self, member: crate::member::Member) {
        let mut s = self.status();
        s.job.member = member.index;
        s.job.members = member.count;
    }

    /// Whether the job checkpoints periodically (`checkpoint.interval_ms > 0`): without
    /// it, readiness does not wait for a checkpoint ([`status::readiness`]).
    pub fn periodic_checkpoints(&self, on: bool) {
        self.status().job.periodic_checkpoints = on;
    }

    /// An attempt starts: its tasks are not open yet, and their number is unknown until
    /// [`Telemetry::attempt_tasks`].
    pub fn attempt_starts(&self) {
        let mut s = self.status();
        s.job.tasks = None;
        s.job.tasks_open = 0;
        // Paused again only once the new attempt's sources confirm it.
        s.job.paused = false;
    }

    /// The running attempt spawned `n` tasks.
    pub fn attempt_tasks(&self, n: usize) {
        self.status().job.tasks = Some(n);
    }

    /// A task of the running attempt opened (its connectors connected, its state
    /// restored).
    pub fn task_opened(&self) {
        self.status().job.tasks_open += 1;
    }

    /// The job restored checkpoint `path` (or started empty: `None`).
    pub fn restored(&self, path: Option<&std::path::Path>) {
        self.status().job.restored_from = path.map(|p| p.display().to_string());
    }

    /// The job restored checkpoint `id`, published at `created_ms` (Unix ms): until
    /// this process completes one, it is the last completed checkpoint, so that the
    /// age after a long outage says how old the job's state is.
    pub fn restored_checkpoint(&self, id: u64, created_ms: u64) {
        let m = &self.inner.metrics;
        if m.checkpoint_last_timestamp.get() == 0.0 {
            m.checkpoint_last_id.set(id as i64);
            m.checkpoint_last_timestamp.set(created_ms as f64 / 1000.0);
            self.status().job.last_checkpoint = Some(id);
        }
    }

    /// The job is in state `state`.
    pub fn set_state(&self, state: JobState) {
        self.status().job.state = state;
    }

    /// The job failed with `error` and restarts; `cause` is the label of
    /// `lockgate_restarts_total`.
    pub fn restarting(&self, cause: &str, error: &str) {
        let m = &self.inner.metrics;
        m.restarts.with_label_values(&[m.job(), cause]).inc();
        self.abandon_in_progress(&format!("the attempt failed: {error}"));
        let mut s = self.status();
        s.job.state = JobState::Restarting;
        s.job.restarts += 1;
        s.job.checkpoints_since_restart = 0;
        s.job.last_failure = Some(error.to_string());
    }

    /// Checkpoints in progress belong to a failed attempt: they are abandoned.
    fn abandon_in_progress(&self, cause: &str) {
        let m = &self.inner.metrics;
        let mut s = self.status();
        let mut n = 0;
        for c in s.history.iter_mut() {
            if c.status == CheckpointStatus::InProgress {
                c.status = CheckpointStatus::Abandoned;
                c.failure_cause = Some(cause.to_string());
                n += 1;
            }
        }
        s.counts.in_progress = 0;
        s.counts.abandoned += n;
        m.checkpoints
            .with_label_values(&[m.job(), "abandoned"])
            .inc_by(n);
    }

    /// The job failed for good with `error`.
    pub fn failed(&self, error: &str) {
        self.abandon_in_progress(&format!("the job failed: {error}"));
        let mut s = self.status();
        s.job.state = JobState::Failed;
        s.job.last_failure = Some(error.to_string());
    }

    /// Checkpoint `id` was triggered.
    pub fn checkpoint_triggered(&self, id: u64, is_final: bool) {
        let mut s = self.status();
        s.counts.in_progress += 1;
        s.push_checkpoint(CheckpointView {
            id,
            status: CheckpointStatus::InProgress,
            is_final,
            trigger_time_ms: wall_ms(),
            duration_ms: None,
            size_bytes: None,
            acknowledgements: Vec::new(),
            failure_cause: None,
            path: None,
        });
    }

    /// Task `task` (vertex, subtask) acknowledged checkpoint `id` `after_ms` after
    /// its trigger.
    pub fn checkpoint_acked(
        &self,
        id: u64,
        task: String,
        vertex: u16,
        subtask: u16,
        after_ms: u64,
    ) {
        if let Some(c) = self.status().checkpoint_mut(id) {
            c.acknowledgements.push(AckView {
                task,
                vertex,
                subtask,
                ack_ms: after_ms,
            });
        }
    }

    /// The id of the last checkpoint completed in this process (0: none yet), updated
    /// the moment it is published: before the notification reaches any subtask, whose
    /// task may be busy. A sink whose writes can wait on what it staged for a
    /// completed checkpoint (rows locked by a prepared transaction) watches it to
    /// commit that work without waiting for its own notification.
    pub fn completions(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.completed.subscribe()
    }

    /// Checkpoint `id` was published at `path`, `duration_ms` after its trigger.
    pub fn checkpoint_completed(&self, id: u64, duration_ms: u64, size_bytes: u64, path: &str) {
        self.inner.completed.send_if_modified(|c| {
            let newer = id > *c;
            if newer {
                *c = id;
            }
            newer
        });
        let m = &self.inner.metrics;
        m.checkpoints
            .with_label_values(&[m.job(), "completed"])
            .inc();
        m.checkpoint_duration.observe(duration_ms as f64 / 1000.0);
        m.checkpoint_size.set(size_bytes as i64);
        m.checkpoint_last_id.set(id as i64);
        m.checkpoint_last_timestamp.set(wall_ms() as f64 / 1000.0);
        let mut s = self.status();
        s.counts.completed += 1;
        s.counts.in_progress = s.counts.in_progress.saturating_sub(1);
        s.job.checkpoints_completed += 1;
        s.job.checkpoints_since_restart += 1;
        s.job.last_checkpoint = Some(id);
        if let Some(c) = s.checkpoint_mut(id) {
            c.status = CheckpointStatus::Completed;
            c.duration_ms = Some(duration_ms);
            c.size_bytes = Some(size_bytes);
            c.path = Some(path.to_string());
        }
    }

    /// Checkpoint `id` was aborted after `duration_ms`.
    pub fn checkpoint_aborted(
        &self,
        id: u64,
        status: CheckpointStatus,
        duration_ms: u64,
        cause: &str,
    ) {
        let label = match status {
            CheckpointStatus::Declined => "declined",
            CheckpointStatus::TimedOut => "timed_out",
            _ => "failed",
        };
        let m = &self.inner.metrics;
        m.checkpoints.with_label_values(&[m.job(), label]).inc();
        let mut s = self.status();
        match status {
            CheckpointStatus::Declined => s.counts.declined += 1,
            CheckpointStatus::TimedOut => s.counts.timed_out += 1,
            _ => s.counts.failed += 1,
        }
        s.counts.in_progress = s.counts.in_progress.saturating_sub(1);
        if let Some(c) = s.checkpoint_mut(id) {
            c.status = status;
            c.duration_ms = Some(duration_ms);
            c.failure_cause = Some(cause.to_string());
        }
    }

    // --- views of the REST API ---

    /// `/api/v1/job`.
    pub fn job(&self) -> JobView {
        let mut j = self.status().job.clone();
        j.uptime_seconds = self.inner.started.elapsed().as_secs_f64();
        let bytes = self.inner.metrics.refresh_buffered();
        j.buffered_bytes = metrics::Stage::ALL
            .iter()
            .zip(bytes)
            .map(|(s, b)| (s.label().to_string(), b))
            .collect();
        if j.paused && j.state == JobState::Running {
            j.state = JobState::Paused;
        }
        j
    }

    /// The sources were paused (`true`) or resumed by the control API.
    pub fn set_paused(&self, paused: bool) {
        self.status().job.paused = paused;
    }

    /// `/api/v1/checkpoints`: counts and the history, newest first.
    pub fn checkpoints(&self) -> CheckpointsView {
        let s = self.status();
        CheckpointsView {
            counts: s.counts.clone(),
            history: s.history.iter().rev().cloned().collect(),
        }
    }

    /// Whether the job is ready ([`status::readiness`]).
    pub fn readiness(&self) -> Result<(), String> {
        status::readiness(&self.job())
    }

    /// `/api/v1/sink`: one entry per sink subtask, read from the sink's metrics.
    pub fn sinks(&self) -> Vec<SinkView> {
        let m = &self.inner.metrics;
        let mut out: BTreeMap<(String, u16), SinkView> = BTreeMap::new();
        let mut each = |c: &dyn Collector, f: &dyn Fn(&mut SinkView, Option<&str>, u64)| {
            for s in task_series(c) {
                let view = out
                    .entry((s.operator.clone(), s.subtask))
                    .or_insert_with(|| SinkView {
                        operator: s.operator.clone(),
                        subtask: s.subtask,
                        ..SinkView::default()
                    });
                f(view, s.outcome.as_deref(), s.value as u64);
            }
        };
        each(&m.sink.pending, &|s, _, v| s.pending = v);
        each(&m.sink.in_flight, &|s, _, v| s.in_flight_requests = v);
        each(&m.sink.bytes_sent, &|s, _, v| s.bytes_sent = v);
        each(&m.sink.requests, &|s, o, v| {
            s.requests.insert(o.unwrap_or_default().to_string(), v);
        });
        each(&m.sink.items, &|s, o, v| {
            s.items.insert(o.unwrap_or_default().to_string(), v);
        });
        out.into_values().collect()
    }

    /// `/api/v1/operators`: records in and out of every operator subtask (the source
    /// counts what it read, the sink what it took), for throughput.
    pub fn operators(&self) -> Vec<OperatorView> {
        let m = &self.inner.metrics;
        let mut out: BTreeMap<(String, u16), OperatorView> = BTreeMap::new();
        for (c, is_in) in [(&m.records_in, true), (&m.records_out, false)] {
            for s in task_series(c) {
                let view = out
                    .entry((s.operator.clone(), s.subtask))
                    .or_insert_with(|| OperatorView {
                        operator: s.operator.clone(),
                        subtask: s.subtask,
                        records_in: 0,
                        records_out: 0,
                        watermark_ms: None,
                        watermark_lag_seconds: None,
                    });
                if is_in {
                    view.records_in = s.value as u64;
                } else {
                    view.records_out = s.value as u64;
                }
            }
        }
        // Watermarks of operator subtasks: the series without a partition.
        let now = wall_ms() as f64 / 1000.0;
        let event_time = m.existing_extension::<event_time::EventTimeMetrics>();
        for s in event_time.iter().flat_map(|e| task_series(&e.watermark)) {
            if s.topic.as_deref() != Some("") {
                continue;
            }
            if let Some(view) = out.get_mut(&(s.operator, s.subtask)) {
                view.watermark_ms = Some((s.value * 1000.0) as i64);
                view.watermark_lag_seconds = Some((now - s.value).max(0.0));
            }
        }
        out.into_values().collect()
    }

    // --- split progress, reported by sources that know their splits' ends ---

    fn partition_table(
        &self,
    ) -> std::sync::MutexGuard<'_, BTreeMap<(String, i32), PartitionGauges>> {
        self.inner
            .partitions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The gauges of split `partition` of stream `topic`, read by subtask `subtask` of
    /// `operator`, reported under `names`. Taking them again (after a restart) returns
    /// the same values.
    pub fn partition(
        &self,
        names: &SplitProgressNames,
        operator: &str,
        subtask: u16,
        topic: &str,
        partition: i32,
    ) -> PartitionGauges {
        let m = &self.inner.metrics;
        let family = self
            .inner
            .split_families
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(names.position.0)
            .or_insert_with(|| Arc::new(SplitFamily::new(m, names)))
            .clone();
        let mut t = self.partition_table();
        if let Some(g) = t.get(&(topic.to_string(), partition)) {
            if g.values.subtask == subtask && g.values.operator == operator {
                return g.clone();
            }
            // Another subtask read it before (an attempt at another parallelism):
            // its series would stand still forever.
            g.remove_series(m, topic, partition);
        }
        let g = PartitionGauges {
            values: Arc::new(PartitionValues {
                family,
                operator: operator.to_string(),
                subtask,
                position: AtomicI64::new(-1),
                end: AtomicI64::new(-1),
            }),
        };
        t.insert((topic.to_string(), partition), g.clone());
        g
    }

    /// Forgets a partition that no longer exists.
    pub fn remove_partition(&self, topic: &str, partition: i32) {
        if let Some(g) = self
            .partition_table()
            .remove(&(topic.to_string(), partition))
        {
            g.remove_series(&self.inner.metrics, topic, partition);
        }
    }

    /// Brings the partition series up to date: a series appears once its value is
    /// known (no made-up `-1` position, no lag of 0 before the end was ever fetched).
    fn export_partitions(&self) {
        let m = &self.inner.metrics;
        for ((topic, partition), g) in self.partition_table().iter() {
            let v = &g.values;
            let labels = [
                m.job(),
                v.operator.as_str(),
                &v.subtask.to_string(),
                topic.as_str(),
                &partition.to_string(),
            ];
            let (position, end) = g.known();
            let f = &v.family;
            if let Some(p) = position {
                f.position.with_label_values(&labels).set(p);
            }
            if let Some(e) = end {
                f.end.with_label_values(&labels).set(e);
            }
            if let Some(l) = g.lag() {
                f.lag.with_label_values(&labels).set(l);
            }
        }
    }

    /// `/api/v1/partitions`.
    pub fn partitions(&self) -> Vec<PartitionView> {
        self.partition_table()
            .iter()
            .map(|((topic, partition), g)| {
                let (position, end) = g.known();
                PartitionView {
                    topic: topic.clone(),
                    partition: *partition,
                    subtask: g.values.subtask,
                    position,
                    end,
                    lag: g.lag(),
                }
            })
            .collect()
    }
}

/// What the source reports about one Kafka partition. Setting a value is one atomic
/// store (the source does it once per run of records of the partition); the series are
/// brought up to date when `/metrics` or the REST API is read.
#[derive(Clone)]
pub struct PartitionGauges {
    values: Arc<PartitionValues>,
}

struct PartitionValues {
    family: Arc<SplitFamily>,
    operator: String,
    subtask: u16,
    /// `-1` until known.
    position: AtomicI64,
    end: AtomicI64,
}

impl PartitionGauges {
    /// The offset of the next record to read.
    pub fn set_position(&self, next: i64) {
        self.values.position.store(next, Ordering::Relaxed);
    }

    /// The position a source checkpoints for this split: its offset, or nothing for an
    /// opaque position (not an offset: the position, and so the lag, stay unknown).
    pub fn set_split_position(&self, p: &lockgate_state::SourcePosition) {
        if p.opaque.is_none() {
            self.set_position(p.next.0);
        }
    }

    /// The partition's end as last fetched.
    pub fn set_end(&self, end: i64) {
        self.values.end.store(end, Ordering::Relaxed);
    }

    /// Position and end, where known. An end behind the position (from a fetch older
    /// than the records read since) is raised to it: the partition reaches at least as
    /// far as the source has read.
    fn known(&self) -> (Option<i64>, Option<i64>) {
        let known = |v: &AtomicI64| Some(v.load(Ordering::Relaxed)).filter(|v| *v >= 0);
        let (position, end) = (known(&self.values.position), known(&self.values.end));
        (position, end.map(|e| position.map_or(e, |p| e.max(p))))
    }

    /// End minus position, once both are known: records the partition has that the
    /// source has not read yet (as of the last fetched end).
    pub fn lag(&self) -> Option<i64> {
        match self.known() {
            (Some(p), Some(e)) => Some((e - p).max(0)),
            _ => None,
        }
    }

    fn remove_series(&self, m: &Metrics, topic: &str, partition: i32) {
        let labels = [
            m.job(),
            self.values.operator.as_str(),
            &self.values.subtask.to_string(),
            topic,
            &partition.to_string(),
        ];
        let f = &self.values.family;
        let _ = f.position.remove_label_values(&labels);
        let _ = f.end.remove_label_values(&labels);
        let _ = f.lag.remove_label_values(&labels);
    }
}

/// `/api/v1/checkpoints`.
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointsView {
    pub counts: CheckpointCounts,
    /// Newest first.
    pub history: Vec<CheckpointView>,
}

/// One series of a per-task metric family.
struct TaskSeries {
    operator: String,
    subtask: u16,
    outcome: Option<String>,
    /// The `topic` label of per-partition families.
    topic: Option<String>,
    value: f64,
}

/// The series of a counter or gauge family with `operator` and `subtask` labels.
fn task_series(c: &dyn Collector) -> Vec<TaskSeries> {
    let mut out = Vec::new();
    for family in c.collect() {
        for metric in family.get_metric() {
            let label = |n: &str| {
                metric
                    .get_label()
                    .iter()
                    .find(|l| l.name() == n)
                    .map(|l| l.value().to_string())
            };
            let (Some(operator), Some(subtask)) = (label("operator"), label("subtask")) else {
                continue;
            };
            let Ok(subtask) = subtask.parse::<u16>() else {
                continue;
            };
            let value = match family.get_field_type() {
                prometheus::proto::MetricType::COUNTER => metric.get_counter().get_value(),
                _ => metric.get_gauge().get_value(),
            };
            out.push(TaskSeries {
                operator,
                subtask,
                outcome: label("outcome"),
                topic: label("topic"),
                value,
            });
        }
    }
    out
}

/// One operator subtask of `/api/v1/operators`.
#[derive(Debug, Clone, Serialize)]
pub struct OperatorView {
    /// `source`, an operator's uid, or `sink`.
    pub operator: String,
    pub subtask: u16,
    pub records_in: u64,
    pub records_out: u64,
    /// The event time its watermark reached, in milliseconds since the Unix epoch
    /// (sources and windows of a job with `[source.kafka.watermark]`; absent before
    /// the first watermark).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watermark_ms: Option<i64>,
    /// How far the watermark is behind the wall clock, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watermark_lag_seconds: Option<f64>,
}

/// One sink subtask of `/api/v1/sink`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SinkView {
    pub operator: String,
    pub subtask: u16,
    /// Actions taken and not yet acknowledged.
    pub pending: u64,
    pub in_flight_requests: u64,
    pub bytes_sent: u64,
    /// Bulk requests by outcome.
    pub requests: BTreeMap<String, u64>,
    /// Bulk items by outcome.
    pub items: BTreeMap<String, u64>,
}

/// One partition of `/api/v1/partitions`.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionView {
    pub topic: String,
    pub partition: i32,
    pub subtask: u16,
    /// The offset of the next record to read, once known.
    pub position: Option<i64>,
    /// The partition's end, once fetched.
    pub end: Option<i64>,
    pub lag: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Split progress under the names the Kafka source uses.
    const NAMES: SplitProgressNames = SplitProgressNames {
        position: ("lockgate_kafka_partition_position", "position"),
        end: ("lockgate_kafka_partition_end_offset", "end"),
        lag: ("lockgate_kafka_partition_lag", "lag"),
    };

    #[test]
    fn lag_is_end_minus_position_once_both_are_known() {
        let t = Telemetry::new("j", "g", 1, 128);
        let p = t.partition(&NAMES, "source", 0, "orders", 3);
        assert_eq!(t.partitions()[0].lag, None);
        assert!(
            !t.scrape().contains("lockgate_kafka_partition"),
            "no series before a value is known"
        );
        p.set_end(100);
        assert_eq!(t.partitions()[0].lag, None, "position unknown");
        let text = t.scrape();
        assert!(
            text.contains("lockgate_kafka_partition_end_offset{"),
            "{text}"
        );
        assert!(!text.contains("lockgate_kafka_partition_lag{"), "{text}");
        assert!(
            !text.contains("lockgate_kafka_partition_position{"),
            "{text}"
        );
        // An opaque position is not an offset: the position stays unknown.
        p.set_split_position(&lockgate_state::SourcePosition::opaque(
            "orders",
            3,
            lockgate_state::OpaquePosition::new(*b"40").unwrap(),
        ));
        assert_eq!(t.partitions()[0].position, None);
        p.set_split_position(&lockgate_state::SourcePosition::new(
            "orders",
            3,
            lockgate_state::NextOffset(40),
        ));
        assert_eq!(t.partitions()[0].lag, Some(60));
        assert!(t.scrape().contains(
            r#"lockgate_kafka_partition_lag{job="j",operator="source",partition="3",subtask="0",topic="orders"} 60"#
        ));
        p.set_position(100);
        assert_eq!(t.partitions()[0].lag, Some(0));
        // An end fetched before the last records were read is raised to the position.
        p.set_position(120);
        let v = &t.partitions()[0];
        assert_eq!((v.position, v.end, v.lag), (Some(120), Some(120), Some(0)));
        p.set_position(100);
        let text = t.scrape();
        assert!(
            text.contains(r#"lockgate_kafka_partition_lag{job="j",operator="source",partition="3",subtask="0",topic="orders"} 0"#),
            "{text}"
        );
        t.remove_partition("orders", 3);
        assert!(t.partitions().is_empty());
        assert!(!t.scrape().contains("lockgate_kafka_partition_lag{"));
    }

    /// Wall-clock seconds now.
    fn now_s() -> f64 {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    }

    #[test]
    fn times_sizes_and_durations_are_in_base_units() {
        let t = Telemetry::new("j", "g", 1, 128);
        let started = t.job().started_at_ms as f64 / 1000.0;
        assert!((now_s() - started).abs() < 60.0, "Unix ms: {started}");
        // Before any checkpoint the age is the time since the start.
        std::thread::sleep(std::time::Duration::from_millis(20));
        t.scrape();
        let age = t.metrics().checkpoint_last_age.get();
        assert!(
            (0.02..10.0).contains(&age),
            "age before any checkpoint: {age}"
        );
        t.checkpoint_triggered(7, false);
        t.checkpoint_completed(7, 1500, 4096, "/c/chk-7");
        let m = t.metrics();
        assert_eq!(m.checkpoint_duration.get_sample_count(), 1);
        assert!(
            (m.checkpoint_duration.get_sample_sum() - 1.5).abs() < 1e-9,
            "seconds"
        );
        let published = m.checkpoint_last_timestamp.get();
        assert!(
            (now_s() - published).abs() < 60.0,
            "Unix seconds: {published}"
        );
        // Published two seconds ago: the age at scrape time says so.
        m.checkpoint_last_timestamp.set(now_s() - 2.0);
        std::thread::sleep(std::time::Duration::from_millis(20));
        t.scrape();
        let age = m.checkpoint_last_age.get();
        assert!((2.0..10.0).contains(&age), "age {age}");
        assert!(m.uptime.get() >= 0.02, "uptime {}", m.uptime.get());
        assert_eq!(m.checkpoint_size.get(), 4096);
    }

    #[test]
    fn the_job_view_says_where_it_restored_from_and_why_it_failed() {
        let t = Telemetry::new("j", "g", 2, 64);
        t.restored(Some(std::path::Path::new("/c/chk-9")));
        let hour_ago = wall_ms() - 3_600_000;
        t.restored_checkpoint(9, hour_ago);
        assert_eq!(t.job().last_checkpoint, Some(9));
        t.scrape();
        let m = t.metrics();
        assert_eq!(m.checkpoint_last_id.get(), 9);
        let age = m.checkpoint_last_age.get();
        assert!(
            (3599.0..3700.0).contains(&age),
            "the restored state's age: {age}"
        );
        // A checkpoint of this process replaces it, and a later restore does not undo that.
        t.checkpoint_triggered(10, false);
        t.checkpoint_completed(10, 5, 1, "/c/chk-10");
        t.restored_checkpoint(9, hour_ago);
        assert_eq!(m.checkpoint_last_id.get(), 10);
        let j = t.job();
        assert_eq!(j.restored_from.as_deref(), Some("/c/chk-9"));
        assert_eq!((j.parallelism, j.max_parallelism), (2, 64));
        assert_eq!((j.member, j.members), (0, 1));
        t.member(crate::member::Member::new(2, 3).unwrap());
        assert_eq!((t.job().member, t.job().members), (2, 3));
        t.failed("disk full");
        let j = t.job();
        assert_eq!(j.state, JobState::Failed);
        assert_eq!(j.last_failure.as_deref(), Some("disk full"));
        assert!(format!("{t:?}").contains("\"j\""), "{t:?}");
    }

    #[test]
    fn every_abort_status_has_its_count_and_completions_count_once() {
        let t = Telemetry::new("j", "g", 1, 128);
        for (id, status) in [
            (1, CheckpointStatus::Declined),
            (2, CheckpointStatus::Declined),
            (3, CheckpointStatus::TimedOut),
            (4, CheckpointStatus::Failed),
        ] {
            t.checkpoint_triggered(id, false);
            t.checkpoint_aborted(id, status, 10, "why");
        }
        t.checkpoint_triggered(5, false);
        t.checkpoint_completed(5, 10, 1, "/c/chk-5");
        t.checkpoint_triggered(6, false);
        t.checkpoint_completed(6, 10, 1, "/c/chk-6");
        let c = t.checkpoints().counts;
        assert_eq!(
            (
                c.declined,
                c.timed_out,
                c.failed,
                c.completed,
                c.in_progress
            ),
            (2, 1, 1, 2, 0)
        );
        assert_eq!(t.job().checkpoints_completed, 2);
        assert_eq!(t.job().last_checkpoint, Some(6));
        let text = t.scrape();
        for line in [
            r#"lockgate_checkpoints_total{job="j",status="declined"} 2"#,
            r#"lockgate_checkpoints_total{job="j",status="failed"} 1"#,
        ] {
            assert!(text.contains(line), "{line}");
        }
        let h = t.checkpoints().history;
        assert_eq!(h[5].status, CheckpointStatus::Declined);
        assert_eq!(h[5].failure_cause.as_deref(), Some("why"));
    }

    #[test]
    fn sink_and_operator_views_are_read_from_the_metrics() {
        let t = Telemetry::new("j", "g", 2, 128);
        let m = t.metrics();
        m.task_gauge(&m.sink.pending, "sink", 1).set(7);
        m.task_gauge(&m.sink.in_flight, "sink", 1).set(2);
        m.task_counter(&m.sink.bytes_sent, "sink", 1).inc_by(300);
        m.sink
            .items
            .with_label_values(&["j", "sink", "1", "created"])
            .inc_by(5);
        m.sink
            .requests
            .with_label_values(&["j", "sink", "1", "ok"])
            .inc();
        m.task_gauge(&m.sink.pending, "sink", 0).set(0);
        let v = t.sinks();
        assert_eq!(v.len(), 2, "{v:?}");
        let s1 = &v[1];
        assert_eq!((s1.operator.as_str(), s1.subtask), ("sink", 1));
        assert_eq!(
            (s1.pending, s1.in_flight_requests, s1.bytes_sent),
            (7, 2, 300)
        );
        assert_eq!(s1.items.get("created"), Some(&5));
        assert_eq!(s1.requests.get("ok"), Some(&1));
        assert_eq!(v[0].subtask, 0);

        m.task_counter(&m.records_in, "rolling_sum-0", 0).inc_by(10);
        m.task_counter(&m.records_out, "rolling_sum-0", 0).inc_by(9);
        m.task_counter(&m.records_out, "source", 1).inc_by(4);
        let ops = t.operators();
        let find = |op: &str, sub: u16| {
            ops.iter()
                .find(|o| o.operator == op && o.subtask == sub)
                .map(|o| (o.records_in, o.records_out))
        };
        assert_eq!(find("rolling_sum-0", 0), Some((10, 9)));
        assert_eq!(find("source", 1), Some((0, 4)));
    }

    #[test]
    fn a_partition_keeps_its_series_and_is_unknown_until_reported() {
        let t = Telemetry::new("j", "g", 2, 128);
        let a = t.partition(&NAMES, "source", 1, "orders", 0);
        a.set_position(5);
        // Taken again by the same subtask (after a restart): the same series.
        let b = t.partition(&NAMES, "source", 1, "orders", 0);
        assert_eq!(b.known(), (Some(5), None));
        assert!(t.scrape().contains(r#"subtask="1""#));
        let v = t.partitions();
        assert_eq!((v[0].position, v[0].end), (Some(5), None));
        // Another subtask owns it now: its own series, unknown again.
        let c = t.partition(&NAMES, "source", 0, "orders", 0);
        assert_eq!(c.known(), (None, None));
        let v = t.partitions();
        assert_eq!((v[0].subtask, v[0].position, v[0].end), (0, None, None));
        let text = t.scrape();
        assert!(
            !text.contains(r#"subtask="1""#),
            "the old owner's series is gone: {text}"
        );
        c.set_end(0);
        c.set_position(0);
        let v = t.partitions();
        assert_eq!(
            (v[0].position, v[0].end, v[0].lag),
            (Some(0), Some(0), Some(0))
        );
    }

    #[test]
    fn checkpoint_history_and_counters_follow_the_checkpoints() {
        let t = Telemetry::new("j", "g", 1, 128);
        t.set_state(JobState::Running);
        assert!(t.readiness().is_err());
        t.checkpoint_triggered(1, false);
        t.checkpoint_acked(1, "source-0".into(), 0, 0, 3);
        t.checkpoint_completed(1, 12, 4096, "/c/chk-1");
        t.checkpoint_triggered(2, false);
        t.checkpoint_aborted(2, CheckpointStatus::TimedOut, 60_000, "expired");
        t.checkpoint_triggered(3, false);
        assert_eq!(t.readiness(), Ok(()));
        let v = t.checkpoints();
        assert_eq!(v.counts.completed, 1);
        assert_eq!(v.counts.timed_out, 1);
        assert_eq!(v.counts.in_progress, 1);
        let ids: Vec<u64> = v.history.iter().map(|c| c.id).collect();
        assert_eq!(ids, [3, 2, 1], "newest first");
        assert_eq!(v.history[2].acknowledgements[0].ack_ms, 3);
        assert_eq!(v.history[2].size_bytes, Some(4096));
        t.restarting("task_failed", "boom");
        let v = t.checkpoints();
        assert_eq!(v.history[0].status, CheckpointStatus::Abandoned);
        assert_eq!(v.counts.in_progress, 0);
        assert_eq!(t.job().restarts, 1);
        let text = t.scrape();
        for line in [
            r#"lockgate_checkpoints_total{job="j",status="completed"} 1"#,
            r#"lockgate_checkpoints_total{job="j",status="timed_out"} 1"#,
            r#"lockgate_checkpoints_total{job="j",status="declined"} 0"#,
            r#"lockgate_checkpoint_last_completed_id{job="j"} 1"#,
            r#"lockgate_restarts_total{cause="task_failed",job="j"} 1"#,
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
    }
}
