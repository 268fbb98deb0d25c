//! Building a job: a source, operators (stateless ones chained, keyed ones after a
//! `key_by` exchange), and a sink. The TOML job file is a thin layer over this API.

use crate::connectors::{Sink, Source};
use crate::error::{JobError, Result};
use crate::operators::keyed::{KeyedFunction, KeyedOperator};
use crate::operators::{FnOperator, Operator};
use crate::record::{Batch, Record};
use std::path::PathBuf;
use std::sync::Arc;

/// Creates the source of subtask `i`.
pub type SourceFactory = Arc<dyn Fn(u16) -> Box<dyn Source> + Send + Sync>;
/// Creates the sink of subtask `i`.
pub type SinkFactory = Arc<dyn Fn(u16) -> Box<dyn Sink> + Send + Sync>;
/// Creates an operator of subtask `i`.
pub type OperatorFactory = Arc<dyn Fn(u16) -> Box<dyn Operator> + Send + Sync>;
/// Extracts the partitioning key of a record.
pub type KeyFn = Arc<dyn Fn(&Record) -> Result<Vec<u8>> + Send + Sync>;

/// Checkpoint settings (the `[checkpoint]` table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointSettings {
    pub dir: PathBuf,
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
            interval_ms: 1000,
            timeout_ms: 60_000,
            min_pause_ms: 0,
            retain: 3,
            tolerable_failures: 0,
        }
    }
}

/// What happens when a subtask fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    /// Fail the job at the first failure.
    None,
    /// Restart from the last completed checkpoint up to `attempts` times.
    FixedDelay { attempts: u32, delay_ms: u64 },
}

impl Default for RestartPolicy {
    /// The job file's default: three restarts, a second apart.
    fn default() -> RestartPolicy {
        RestartPolicy::FixedDelay {
            attempts: 3,
            delay_ms: 1000,
        }
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
    pub(crate) source: (String, SourceFactory),
    pub(crate) stages: Vec<Stage>,
    pub(crate) sink: (String, SinkFactory),
}

impl JobGraph {
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
        let mut parts = vec![format!("source:{}", self.source.0)];
        for s in &self.stages {
            parts.push(match s {
                Stage::Operator {
                    kind, uid: Some(u), ..
                } => format!("{kind}[{u}]"),
                Stage::Operator {
                    kind, uid: None, ..
                } => kind.clone(),
                Stage::KeyBy(_) => "key_by".into(),
            });
        }
        parts.push(format!("sink:{}", self.sink.0));
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
    source: Option<(String, SourceFactory)>,
    stages: Vec<Stage>,
    sink: Option<(String, SinkFactory)>,
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

    /// Checkpoint settings (required).
    pub fn checkpointing(mut self, c: CheckpointSettings) -> Self {
        self.checkpoint = Some(c);
        self
    }

    /// The restart policy.
    pub fn restart(mut self, r: RestartPolicy) -> Self {
        self.restart = r;
        self
    }

    /// The source, created once per subtask (and again on restart).
    pub fn source<F>(mut self, kind: &str, factory: F) -> Self
    where
        F: Fn(u16) -> Box<dyn Source> + Send + Sync + 'static,
    {
        self.source = Some((kind.to_string(), Arc::new(factory)));
        self
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
    pub fn keyed<K, F>(mut self, kind: &str, uid: &str, factory: F) -> Self
    where
        K: KeyedFunction + 'static,
        F: Fn(u16) -> K + Send + Sync + 'static,
    {
        self.stages.push(Stage::Operator {
            kind: kind.to_string(),
            uid: Some(uid.to_string()),
            factory: Arc::new(move |i| Box::new(KeyedOperator::new(factory(i)))),
        });
        self
    }

    /// The sink, created once per subtask (and again on restart).
    pub fn sink<F>(mut self, kind: &str, factory: F) -> Self
    where
        F: Fn(u16) -> Box<dyn Sink> + Send + Sync + 'static,
    {
        self.sink = Some((kind.to_string(), Arc::new(factory)));
        self
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
                    if !uids.insert(u.clone()) || u == "sink" {
                        return bad(&format!("operator uid {u} is used twice"));
                    }
                }
                Stage::Operator { .. } => {}
            }
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
        })
    }
}
