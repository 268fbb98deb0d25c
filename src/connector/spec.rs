//! Specs: a source, a sink or a step as the runtime takes it, with what it declares
//! about itself (its split assignment, its capabilities) as data.

use super::splits::{Assignment, SplitAssigner};
use super::{Operator, Sink, Source};
use crate::error::Result;
use crate::record::Record;
use std::sync::Arc;

/// Creates the source of subtask `i`.
pub type SourceFactory = Arc<dyn Fn(u16) -> Box<dyn Source> + Send + Sync>;
/// Creates the sink of subtask `i`.
pub type SinkFactory = Arc<dyn Fn(u16) -> Box<dyn Sink> + Send + Sync>;
/// Creates an operator of subtask `i`.
pub type OperatorFactory = Arc<dyn Fn(u16) -> Box<dyn Operator> + Send + Sync>;
/// Extracts the partitioning key of a record.
pub type KeyFn = Arc<dyn Fn(&Record) -> Result<Vec<u8>> + Send + Sync>;

/// What a source declares about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SourceCaps {
    /// The input ends by itself: a job of this source finishes with a final
    /// checkpoint once every split is read.
    pub bounded: bool,
    /// Splits may appear while the job runs (partitions added to a topic): one absent
    /// from a restored checkpoint starts at its beginning. Without discovery the
    /// splits are fixed, and one missing from a checkpoint is an error.
    pub discovers_splits: bool,
}

/// A source as the runtime takes it: a factory of subtasks, and how its splits are
/// assigned to subtasks and members.
#[derive(Clone)]
pub struct SourceSpec {
    /// The kind, in the job's description and fingerprint (`kafka`): changing it makes
    /// checkpoints of the job another graph's.
    pub kind: String,
    pub factory: SourceFactory,
    pub assignment: Assignment,
    pub caps: SourceCaps,
}

impl SourceSpec {
    /// A source of kind `kind` whose splits are assigned by [`Assignment::default`]
    /// (Flink's stream-hash rule).
    pub fn new<F>(kind: &str, factory: F) -> SourceSpec
    where
        F: Fn(u16) -> Box<dyn Source> + Send + Sync + 'static,
    {
        SourceSpec {
            kind: kind.to_string(),
            factory: Arc::new(factory),
            assignment: Assignment::default(),
            caps: SourceCaps::default(),
        }
    }

    /// Assigns the splits by `a` instead.
    pub fn assigned_by(mut self, a: impl SplitAssigner) -> SourceSpec {
        self.assignment = Assignment::new(a);
        self
    }

    /// Declares the source's capabilities.
    pub fn with_caps(mut self, caps: SourceCaps) -> SourceSpec {
        self.caps = caps;
        self
    }
}

/// What a sink promises about the records it receives, once a checkpoint completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Guarantee {
    /// Every record is in the external system exactly once (two-phase commit, or
    /// writes the system deduplicates, such as the Kafka sink's).
    ExactlyOnce,
    /// Records may be written again after a restore, but each write replaces the
    /// same document: the final state is exact (Elasticsearch with ids).
    Idempotent,
    /// Records may be written again after a restore, and each write adds one.
    #[default]
    AtLeastOnce,
}

/// What a sink declares about itself.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SinkCaps {
    pub guarantee: Guarantee,
    /// The sink takes the records of each source split in the order read, through one
    /// subtask (the Kafka sink's downstream deduplication relies on it): no `key_by`
    /// may come before it. The message says so to whoever puts one there.
    pub needs_source_order: Option<String>,
    /// `Some((key, message))`: the sink cannot run as several members (`--members`).
    /// `key` is the job-file key the refusal concerns, in full (`sink.file`); the
    /// message says why and what to use instead, `{members}` standing for the member
    /// count asked for. A job asked to run as members is refused at start with both,
    /// exit code 2.
    pub one_process_only: Option<(String, String)>,
    /// What the sink committed for a checkpoint cannot be taken back (a database
    /// transaction, once committed, stays): a restore from a checkpoint older than the
    /// newest completed one (the newest found damaged, or an older one chosen by
    /// path) writes the records between them again. Its guarantee holds for every
    /// restore of the newest completed checkpoint, which is what a crash or a restart
    /// restores.
    pub commits_are_final: bool,
}

/// A sink as the runtime takes it.
#[derive(Clone)]
pub struct SinkSpec {
    /// The kind, in the job's description and fingerprint (`elasticsearch`).
    pub kind: String,
    pub factory: SinkFactory,
    pub caps: SinkCaps,
    /// Steps the sink needs right before it (the Elasticsearch sink's version guard:
    /// a `key_by` and a keyed operator), added after the job's own steps.
    pub before: Vec<Step>,
    /// The job's committer, for a sink whose checkpoints become visible in one step
    /// ([`crate::connector::committer`]); None: each subtask commits its own share.
    pub committer: Option<crate::connector::CommitterFactory>,
}

impl SinkSpec {
    /// A sink of kind `kind` with [`SinkCaps::default`] (at-least-once, nothing
    /// refused).
    pub fn new<F>(kind: &str, factory: F) -> SinkSpec
    where
        F: Fn(u16) -> Box<dyn Sink> + Send + Sync + 'static,
    {
        SinkSpec {
            kind: kind.to_string(),
            factory: Arc::new(factory),
            caps: SinkCaps::default(),
            before: Vec::new(),
            committer: None,
        }
    }

    /// Declares the sink's capabilities.
    pub fn with_caps(mut self, caps: SinkCaps) -> SinkSpec {
        self.caps = caps;
        self
    }

    /// Gives the sink a committer for the whole job
    /// ([`crate::connector::committer`]).
    pub fn with_committer(mut self, committer: crate::connector::CommitterFactory) -> SinkSpec {
        self.committer = Some(committer);
        self
    }

    /// Adds steps the sink needs right before it.
    pub fn after_steps(mut self, steps: Vec<Step>) -> SinkSpec {
        self.before.extend(steps);
        self
    }
}

/// One step between the source and the sink.
#[derive(Clone)]
pub enum Step {
    /// A stateless operator, chained into the task before it.
    Operator {
        kind: String,
        factory: OperatorFactory,
    },
    /// Partitions records by key: every record of a key reaches the same subtask of
    /// the keyed steps after it.
    KeyBy(KeyFn),
    /// A keyed operator with state in RocksDB (see `kits::keyed::step`). `uid`
    /// names its state in checkpoints and must stay the same across versions of the
    /// job. With `across_partitions`, its state is a fact about the key across every
    /// source partition: in a `co_partitioned` job it is not scoped by partition.
    Keyed {
        kind: String,
        uid: String,
        factory: OperatorFactory,
        across_partitions: bool,
    },
}
