//! Building a job: a source, operators (stateless ones chained, keyed ones after a
//! `key_by` exchange), and a sink. The TOML job file is a thin layer over this API.

use crate::connector::FnOperator;
use crate::connector::{Operator, Sink, SinkSpec, Source, SourceSpec, Step};
use crate::control::ControlSettings;
use crate::error::{JobError, Result};
use crate::kits::keyed::KeyedFunction;
use crate::record::{Batch, Record};
use std::path::PathBuf;
use std::sync::Arc;

pub use crate::connector::{KeyFn, OperatorFactory, SinkFactory, SourceFactory};

/// Checkpoint settings (the `[checkpoint]` table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointSettings {
    /// The local snapshot directory. With [`CheckpointSettings::store`] set it is the
    /// local staging directory: checkpoints are built and published here, then uploaded,
    /// and a start downloads the checkpoint it restores into it.
    pub dir: PathBuf,
    /// The object-store prefix that holds the checkpoints (`checkpoint.dir =
    /// "s3://..."`); `None`: `dir` alone holds them. A checkpoint counts as complete
    /// only once its `_metadata` is in the store.
    pub store: Option<lockgate_state::store::StoreLocation>,
    /// 0 disables periodic checkpoints; the final checkpoint is always taken.
    pub interval_ms: u64,
    pub timeout_ms: u64,
    pub min_pause_ms: u64,
    /// Complete checkpoints kept (at least 2).
    pub retain: usize,
    pub tolerable_failures: u32,
}

impl CheckpointSettings {
    /// Defaults of the job file, with the given directory.
    pub fn new(dir: impl Into<PathBuf>) -> CheckpointSettings {
        CheckpointSettings {
            dir: dir.into(),
            store: None,
            interval_ms: 1000,
            timeout_ms: 60_000,
            min_pause_ms: 0,
            retain: 3,
            tolerable_failures: 0,
        }
    }
}

impl CheckpointSettings {
    /// The same settings one path segment further down, in the local directory and in
    /// the store alike (a member's own checkpoint line: `member-I-of-N`). `segment`
    /// must be one plain path component.
    pub fn join(&self, segment: &str) -> CheckpointSettings {
        CheckpointSettings {
            dir: self.dir.join(segment),
            store: self.store.as_ref().map(|s| s.join(segment)),
            ..self.clone()
        }
    }

    /// Where the checkpoints live: the store when there is one, else the directory.
    pub fn location(&self) -> lockgate_state::store::CheckpointLocation {
        match &self.store {
            Some(s) => lockgate_state::store::CheckpointLocation::Store(s.clone()),
            None => lockgate_state::store::CheckpointLocation::Local(self.dir.clone()),
        }
    }
}

/// What happens when a subtask fails: the job restarts in process from its last
/// completed checkpoint, or fails. [`crate::runtime::restart::next_restart`] is the
/// decision; the executor logs its reason when it gives up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RestartPolicy {
    /// Fail the job at the first failure.
    None,
    /// Restart up to `attempts` times over the life of the process, `delay_ms` apart.
    /// Failures weeks apart add up: prefer [`RestartPolicy::ExponentialDelay`] or
    /// [`RestartPolicy::FailureRate`] for jobs that run for long.
    FixedDelay { attempts: u32, delay_ms: u64 },
    /// The default: a backoff that grows while failures follow each other and resets
    /// after a quiet period (see [`ExponentialDelay`]).
    ExponentialDelay(ExponentialDelay),
    /// Restart after `delay_ms` unless this failure makes more than `max_failures`
    /// within the last `interval_ms`.
    FailureRate {
        max_failures: u32,
        interval_ms: u64,
        delay_ms: u64,
    },
}

/// Flink's `exponential-delay`: the n-th failure of a streak waits
/// `min(initial_delay_ms * multiplier^(n-1), max_delay_ms)`, times a random factor in
/// `[1 - jitter, 1 + jitter)`. A failure `reset_after_ms` or more after the previous
/// one starts a new streak. More than `attempts` failures in one streak fail the job:
/// outages far apart never add up, and a job that can never start still ends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExponentialDelay {
    pub initial_delay_ms: u64,
    pub max_delay_ms: u64,
    pub multiplier: f64,
    /// A fraction of the delay, in `[0, 1)`.
    pub jitter: f64,
    pub reset_after_ms: u64,
    /// Restarts in one streak before the job fails (Flink's
    /// `attempts-before-reset-backoff`, unbounded there).
    pub attempts: u32,
}

impl Default for ExponentialDelay {
    /// Flink's defaults, except two bounds chosen for connector jobs: `max_delay_ms`
    /// is one minute (Flink: five), because after an outage a sink should catch up
    /// soon; `attempts` is 10 (Flink: unbounded), so a job that fails at every start
    /// ends after about five and a half minutes of trying (1+2+4+...+32 s, then four
    /// times 60 s) and whoever runs it sees the failure.
    fn default() -> ExponentialDelay {
        ExponentialDelay {
            initial_delay_ms: 1000,
            max_delay_ms: 60_000,
            multiplier: 2.0,
            jitter: 0.1,
            reset_after_ms: 3_600_000,
            attempts: 10,
        }
    }
}

impl ExponentialDelay {
    /// Why these settings cannot work, naming the field: the delay must be able to
    /// grow, and a restart delay alone must never look like a quiet period (or a job
    /// that can never start would never end).
    pub fn validate(&self) -> std::result::Result<(), (&'static str, String)> {
        if self.attempts == 0 {
            return Err(("attempts", "must be at least 1".into()));
        }
        if self.initial_delay_ms > self.max_delay_ms {
            return Err((
                "initial_delay_ms",
                format!("must not exceed max_delay_ms ({})", self.max_delay_ms),
            ));
        }
        if !(self.multiplier >= 1.0 && self.multiplier.is_finite()) {
            return Err(("multiplier", "must be at least 1.0".into()));
        }
        if !(0.0..1.0).contains(&self.jitter) {
            return Err(("jitter", "must be a fraction in [0, 1)".into()));
        }
        let longest = self.max_delay_ms as f64 * (1.0 + self.jitter);
        if (self.reset_after_ms as f64) <= longest {
            return Err((
                "reset_after_ms",
                format!(
                    "must exceed the longest delay, max_delay_ms * (1 + jitter) = {longest:.0} ms"
                ),
            ));
        }
        Ok(())
    }
}

impl RestartPolicy {
    /// Why this policy cannot work, naming the job file key (under `[restart]`).
    pub fn validate(&self) -> std::result::Result<(), (&'static str, String)> {
        match self {
            RestartPolicy::None | RestartPolicy::FixedDelay { .. } => Ok(()),
            RestartPolicy::ExponentialDelay(e) => e.validate(),
            RestartPolicy::FailureRate {
                max_failures,
                interval_ms,
                delay_ms,
            } => {
                if *max_failures == 0 {
                    return Err((
                        "max_failures",
                        "must be at least 1 (or use strategy = \"none\")".into(),
                    ));
                }
                // Failures come at most one delay apart when the job can never start:
                // with a delay as long as the interval, such a job would never end.
                if interval_ms <= delay_ms {
                    return Err(("interval_ms", format!("must exceed delay_ms ({delay_ms})")));
                }
                Ok(())
            }
        }
    }
}

impl Default for RestartPolicy {
    /// The job file's default: [`RestartPolicy::ExponentialDelay`] with
    /// [`ExponentialDelay::default`].
    fn default() -> RestartPolicy {
        RestartPolicy::ExponentialDelay(ExponentialDelay::default())
    }
}

/// One step between the source and the sink.
#[derive(Clone)]
pub(crate) enum Stage {
    Operator {
        kind: String,
        uid: Option<String>,
        factory: OperatorFactory,
    },
    KeyBy(KeyFn),
}

/// A built job, ready to run (and to run again after a failure).
#[derive(Clone)]
pub struct JobGraph {
    pub name: String,
    pub parallelism: u16,
    pub max_parallelism: u16,
    pub checkpoint: CheckpointSettings,
    pub restart: RestartPolicy,
    pub(crate) source: SourceSpec,
    pub(crate) stages: Vec<Stage>,
    pub(crate) sink: SinkSpec,
    /// Memory settings of each keyed subtask's RocksDB instance (`[state]`).
    pub state: lockgate_state::BackendOptions,
    /// Where `lockgate run` serves the job's metrics, health probes, REST API and
    /// status page (`[metrics] listen`); `None`: nowhere.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The control API on the metrics listener (`[control]`); `None`: off.
    pub control: Option<ControlSettings>,
    /// The Kafka cluster the source reads, when it reads one: `checkpoints alter`
    /// checks new offsets against its partitions.
    pub source_cluster: Option<crate::connector::section::KafkaCluster>,
    /// The source's partitions hold every record of a key (`[job] co_partitioned`):
    /// keyed state is then kept per source partition, so that it moves with its
    /// partition when the members of the job change.
    pub co_partitioned: bool,
    /// Steps of the configuration the job file was translated from that it does not
    /// do (`[job] left_out`): `lockgate run` refuses to run it unless told
    /// `--allow-left-out`.
    pub left_out: Vec<String>,
    /// Which member of the job this process is (`lockgate run --member I --members N`):
    /// it reads its share of the source's partitions and keeps its own checkpoint line.
    pub member: crate::member::Member,
    /// Uids of keyed operators whose state is a fact about the key across all
    /// partitions ([`JobBuilder::keyed_across_partitions`]): never scoped by partition.
    pub(crate) across_partitions: std::collections::BTreeSet<String>,
    /// Why the job runs as one process only, with the job-file key it concerns
    /// ([`JobBuilder::refuse_members`]).
    pub(crate) one_process_only: Option<(&'static str, String)>,
}

impl JobGraph {
    /// Whether the graph holds keyed state (an operator after a `key_by`).
    pub fn has_keyed_state(&self) -> bool {
        self.stages
            .iter()
            .any(|s| matches!(s, Stage::Operator { uid: Some(_), .. }))
    }

    /// Refuses to run as several members what would not stay exactly-once: keyed
    /// state unless the source is co-partitioned (records of one key could reach two
    /// members), and what the builder or the sink's capabilities refuse
    /// ([`JobBuilder::refuse_members`], [`crate::connector::SinkCaps::one_process_only`]).
    /// The error names the job-file key it concerns.
    pub fn check_members(&self) -> std::result::Result<(), (&str, String)> {
        if self.member.count == 1 {
            return Ok(());
        }
        if self.has_keyed_state() && !self.co_partitioned {
            return Err((
                "job.co_partitioned",
                format!(
                    "{} has keyed state, which is correct across {} members only when every record of a key is in one source partition: set co_partitioned = true if the topics are partitioned by the key of the key_by",
                    self.describe(),
                    self.member.count
                ),
            ));
        }
        if let Some((key, why)) = &self.one_process_only {
            return Err((key, why.clone()));
        }
        if let Some((key, why)) = &self.sink.caps.one_process_only {
            return Err((
                key,
                why.replace("{members}", &self.member.count.to_string()),
            ));
        }
        Ok(())
    }

    /// A fingerprint of the graph's shape: kinds and uids of its steps, not its
    /// parallelism (a checkpoint restores at another parallelism). Stable across
    /// releases: FNV-1a over a textual description.
    pub fn fingerprint(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.describe().bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h
    }

    /// A one-line description: `source:sequence > key_by > rolling_sum[uid] > sink:file`.
    pub fn describe(&self) -> String {
        let mut parts = vec![format!("source:{}", self.source.kind)];
        for s in &self.stages {
            parts.push(match s {
                Stage::Operator {
                    kind, uid: Some(u), ..
                } => format!("{kind}[{u}]"),
                Stage::Operator {
                    kind, uid: None, ..
                } => kind.clone(),
                Stage::KeyBy(_) if self.co_partitioned => "key_by(co_partitioned)".into(),
                Stage::KeyBy(_) => "key_by".into(),
            });
        }
        parts.push(format!("sink:{}", self.sink.kind));
        format!("{}: {}", self.name, parts.join(" > "))
    }
}

/// Entry point of the Rust API.
pub struct Job;

impl Job {
    /// Starts building a job named `name`.
    pub fn builder(name: impl Into<String>) -> JobBuilder {
        JobBuilder {
            name: name.into(),
            parallelism: 1,
            max_parallelism: 128,
            checkpoint: None,
            restart: RestartPolicy::default(),
            source: None,
            stages: Vec::new(),
            sink: None,
            metrics_listen: None,
            control: None,
            source_cluster: None,
            co_partitioned: false,
            left_out: Vec::new(),
            member: crate::member::Member::SOLO,
            across_partitions: Default::default(),
            one_process_only: None,
            state: Default::default(),
        }
    }
}

/// Builds a [`JobGraph`].
pub struct JobBuilder {
    name: String,
    parallelism: u16,
    max_parallelism: u16,
    checkpoint: Option<CheckpointSettings>,
    restart: RestartPolicy,
    source: Option<SourceSpec>,
    stages: Vec<Stage>,
    sink: Option<SinkSpec>,
    metrics_listen: Option<std::net::SocketAddr>,
    control: Option<ControlSettings>,
    source_cluster: Option<crate::connector::section::KafkaCluster>,
    state: lockgate_state::BackendOptions,
    co_partitioned: bool,
    left_out: Vec<String>,
    member: crate::member::Member,
    across_partitions: std::collections::BTreeSet<String>,
    one_process_only: Option<(&'static str, String)>,
}

impl JobBuilder {
    /// Subtasks per stage.
    pub fn parallelism(mut self, p: u16) -> Self {
        self.parallelism = p;
        self
    }

    /// Key groups: the most subtasks keyed state can ever be split into.
    pub fn max_parallelism(mut self, p: u16) -> Self {
        self.max_parallelism = p;
        self
    }

    /// Serve metrics, probes, the REST API and the status page on `addr` when the job
    /// runs under `lockgate run` (see [`crate::telemetry`]).
    pub fn metrics_listen(mut self, addr: std::net::SocketAddr) -> Self {
        self.metrics_listen = Some(addr);
        self
    }

    /// Serve the control API (stop, pause, resume, checkpoint now) on the metrics
    /// listener; see [`crate::control`].
    pub fn control(mut self, settings: ControlSettings) -> Self {
        self.control = Some(settings);
        self
    }

    /// The Kafka cluster the source reads (`checkpoints alter` asks it for the
    /// partitions' offsets).
    pub fn source_cluster(
        mut self,
        cluster: Option<crate::connector::section::KafkaCluster>,
    ) -> Self {
        self.source_cluster = cluster;
        self
    }

    /// Declares that the source's partitions hold every record of a key (its topics are
    /// partitioned by the key of the `key_by`): keyed state is kept per source
    /// partition, which lets the job run as several members and change their number.
    /// Part of the graph's fingerprint.
    pub fn co_partitioned(mut self, yes: bool) -> Self {
        self.co_partitioned = yes;
        self
    }

    /// The steps the job file says it does not do (`[job] left_out`).
    pub fn left_out(mut self, steps: Vec<String>) -> Self {
        self.left_out = steps;
        self
    }

    /// Runs the job as `member` of several (default: [`crate::member::Member::SOLO`]).
    pub fn member(mut self, member: crate::member::Member) -> Self {
        self.member = member;
        self
    }

    /// Memory settings of keyed state (default: [`lockgate_state::BackendOptions::default`]).
    pub fn state_options(mut self, o: lockgate_state::BackendOptions) -> Self {
        self.state = o;
        self
    }

    /// Checkpoint settings (required).
    pub fn checkpointing(mut self, c: CheckpointSettings) -> Self {
        self.checkpoint = Some(c);
        self
    }

    /// What happens when a subtask fails (default: [`RestartPolicy::default`],
    /// exponential delay). Every restart resumes from the last completed checkpoint of
    /// this run (before the first one, from where the run started), so a restart
    /// neither loses nor duplicates what the sink made durable.
    pub fn restart(mut self, r: RestartPolicy) -> Self {
        self.restart = r;
        self
    }

    /// The source, created once per subtask (and again on restart), with the default
    /// split assignment and capabilities ([`SourceSpec::new`]).
    pub fn source<F>(self, kind: &str, factory: F) -> Self
    where
        F: Fn(u16) -> Box<dyn Source> + Send + Sync + 'static,
    {
        self.source_spec(SourceSpec::new(kind, factory))
    }

    /// The source as its spec declares it (its split assignment, its capabilities).
    pub fn source_spec(mut self, spec: SourceSpec) -> Self {
        self.source = Some(spec);
        self
    }

    /// Adds a step (what the job file's transforms are made of).
    pub fn step(mut self, step: Step) -> Self {
        match step {
            Step::Operator { kind, factory } => self.stages.push(Stage::Operator {
                kind,
                uid: None,
                factory,
            }),
            Step::KeyBy(k) => self.stages.push(Stage::KeyBy(k)),
            Step::Keyed {
                kind,
                uid,
                factory,
                across_partitions,
            } => {
                if across_partitions {
                    self.across_partitions.insert(uid.clone());
                }
                self.stages.push(Stage::Operator {
                    kind,
                    uid: Some(uid),
                    factory,
                });
            }
        }
        self
    }

    /// Adds steps in order.
    pub fn steps(self, steps: impl IntoIterator<Item = Step>) -> Self {
        steps.into_iter().fold(self, JobBuilder::step)
    }

    /// A stateless operator, created once per subtask.
    pub fn operator<F>(mut self, kind: &str, factory: F) -> Self
    where
        F: Fn(u16) -> Box<dyn Operator> + Send + Sync + 'static,
    {
        self.stages.push(Stage::Operator {
            kind: kind.to_string(),
            uid: None,
            factory: Arc::new(factory),
        });
        self
    }

    /// Transforms each record.
    pub fn map<F>(self, f: F) -> Self
    where
        F: Fn(Record) -> Result<Record> + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        self.operator("map", move |_| {
            let f = f.clone();
            Box::new(FnOperator(move |r: Record, out: &mut Batch| {
                out.push(f(r)?);
                Ok(())
            }))
        })
    }

    /// Keeps the records for which `f` is true.
    pub fn filter<F>(self, f: F) -> Self
    where
        F: Fn(&Record) -> bool + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        self.operator("filter", move |_| {
            let f = f.clone();
            Box::new(FnOperator(move |r: Record, out: &mut Batch| {
                if f(&r) {
                    out.push(r);
                }
                Ok(())
            }))
        })
    }

    /// Turns each record into zero or more records.
    pub fn flat_map<F>(self, f: F) -> Self
    where
        F: Fn(Record, &mut Batch) -> Result<()> + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        self.operator("flat_map", move |_| {
            let f = f.clone();
            Box::new(FnOperator(move |r: Record, out: &mut Batch| f(r, out)))
        })
    }

    /// Partitions records by key: every record of a key reaches the same subtask of
    /// the following keyed operator.
    pub fn key_by<F>(mut self, f: F) -> Self
    where
        F: Fn(&Record) -> Result<Vec<u8>> + Send + Sync + 'static,
    {
        self.stages.push(Stage::KeyBy(Arc::new(f)));
        self
    }

    /// A keyed operator with state in RocksDB. `uid` names its state in checkpoints
    /// and must stay the same across versions of the job.
    pub fn keyed<K, F>(self, kind: &str, uid: &str, factory: F) -> Self
    where
        K: KeyedFunction + 'static,
        F: Fn(u16) -> K + Send + Sync + 'static,
    {
        self.step(crate::kits::keyed::step(kind, uid, false, factory))
    }

    /// A keyed operator whose state is a fact about the key across every partition
    /// (such as which partition writes a document): in a `co_partitioned` job its state
    /// is not scoped by source partition, and a rescale gives every member all of it.
    pub fn keyed_across_partitions<K, F>(self, kind: &str, uid: &str, factory: F) -> Self
    where
        K: KeyedFunction + 'static,
        F: Fn(u16) -> K + Send + Sync + 'static,
    {
        self.step(crate::kits::keyed::step(kind, uid, true, factory))
    }

    /// The job runs as one process only: `--members N` is refused, naming `key` (the
    /// job-file key that would allow it) and saying `why`.
    pub fn refuse_members(mut self, key: &'static str, why: String) -> Self {
        self.one_process_only = Some((key, why));
        self
    }

    /// The sink, created once per subtask (and again on restart), with the default
    /// capabilities ([`SinkSpec::new`]).
    pub fn sink<F>(self, kind: &str, factory: F) -> Self
    where
        F: Fn(u16) -> Box<dyn Sink> + Send + Sync + 'static,
    {
        self.sink_spec(SinkSpec::new(kind, factory))
    }

    /// The sink as its spec declares it; the steps it needs before it
    /// ([`SinkSpec::before`]) are added after the steps so far.
    pub fn sink_spec(mut self, mut spec: SinkSpec) -> Self {
        let before = std::mem::take(&mut spec.before);
        self.sink = Some(spec);
        self.steps(before)
    }

    /// Validates and builds the job.
    pub fn build(self) -> Result<JobGraph> {
        let bad = |m: &str| Err(JobError::Other(format!("job {}: {m}", self.name)));
        if self.parallelism == 0 || self.parallelism > self.max_parallelism {
            return bad("parallelism must be between 1 and max_parallelism");
        }
        if self.max_parallelism == 0 || self.max_parallelism > 32768 {
            return bad("max_parallelism must be between 1 and 32768");
        }
        let mut keyed_input = false;
        let mut uids = std::collections::HashSet::new();
        for s in &self.stages {
            match s {
                Stage::KeyBy(_) => keyed_input = true,
                Stage::Operator {
                    uid: Some(u), kind, ..
                } => {
                    if !keyed_input {
                        return bad(&format!("keyed operator {kind} must follow key_by"));
                    }
                    // The uid names the operator's state directory in checkpoints,
                    // and a restore refuses any name that is not one plain component.
                    if let Err(e) = lockgate_state::names::check_component(u) {
                        return bad(&format!(
                            "operator uid {u:?} names a checkpoint directory and must be one plain path component ({e})"
                        ));
                    }
                    // The sink's and the source's own states are kept under these.
                    if !uids.insert(u.clone())
                        || u == crate::connector::SINK_UID
                        || u == crate::connector::SOURCE_UID
                    {
                        return bad(&format!("operator uid {u} is used twice"));
                    }
                }
                Stage::Operator { .. } => {}
            }
        }
        if let Some(why) = self
            .sink
            .as_ref()
            .and_then(|s| s.caps.needs_source_order.as_ref())
        {
            if keyed_input {
                return bad(why);
            }
        }
        if let Err((key, why)) = self.restart.validate() {
            return bad(&format!("restart {key} {why}"));
        }
        let Some(checkpoint) = self.checkpoint else {
            return bad("checkpointing(...) is required");
        };
        let Some(source) = self.source else {
            return bad("a source is required");
        };
        let Some(sink) = self.sink else {
            return bad("a sink is required");
        };
        Ok(JobGraph {
            name: self.name,
            parallelism: self.parallelism,
            max_parallelism: self.max_parallelism,
            checkpoint,
            restart: self.restart,
            source,
            stages: self.stages,
            sink,
            metrics_listen: self.metrics_listen,
            control: self.control,
            source_cluster: self.source_cluster,
            state: self.state,
            co_partitioned: self.co_partitioned,
            left_out: self.left_out,
            member: self.member,
            across_partitions: self.across_partitions,
            one_process_only: self.one_process_only,
        })
    }
}
