//! The connector contract: what a source, a sink or an operator implements, what it
//! declares about itself, and what the runtime guarantees it in return.
//!
//! | you write | you implement | the runtime gives you |
//! |---|---|---|
//! | a source | [`Source`], and a [`SourceSpec`] naming its [`SplitAssigner`] | which splits are yours ([`SubtaskInfo::reads`]), where each starts ([`split_start`], typed: [`split_start_as`]), restore, rescale and members |
//! | a sink | [`Sink`] (or a kit in `lockgate::kits`), and a [`SinkSpec`] with its [`SinkCaps`] | the barrier: everything before it is in `snapshot`, nothing after it |
//! | an operator | [`Operator`] (keyed: `lockgate::kits::keyed::KeyedFunction`) | its state restored, rescaled by key group |
//! | a job-file section | [`SourceSection`], [`SinkSection`] or [`TransformSection`], and one line in a [`Registry`] | the job file's errors (file and key), `${ENV}`, path resolution |
//!
//! No generic part of lockgate names a connector: everything the runtime, the job
//! builder and the job file need to know about one is in its spec and its facts.

pub mod committer;
mod lifecycle;
mod operator;
pub mod position;
pub mod registry;
pub mod section;
pub mod spec;
pub mod splits;

pub use committer::{CommitterFactory, CommitterInfo, JobCommitter};
pub use lifecycle::{Sink, SinkRestore, Source, SourcePoll, SubtaskInfo, SINK_UID, SOURCE_UID};

/// The types a connector speaks in, so that one `use lockgate::connector::*` is its
/// whole import: records and batches, errors, checkpoint ids and split positions.
pub use crate::error::{JobError, Result};
pub use crate::record::{Batch, Op, Origin, Record};
pub use lockgate_state::{CheckpointId, NextOffset, OpaquePosition, SourcePosition};
pub use operator::{FnOperator, Operator, OperatorContext};
pub use position::{split_start_as, SplitPosition, SplitStartAs};
pub use registry::Registry;
pub use section::{
    AnyConfig, KafkaCluster, KeyError, PreparedSink, PreparedSource, PreparedTransform,
    SectionContext, SinkContext, SinkSection, SourceFacts, SourceSection, SourceWiring,
    TransformFacts, TransformSection,
};
pub use spec::{
    Guarantee, KeyFn, OperatorFactory, SinkCaps, SinkFactory, SinkSpec, SourceCaps, SourceFactory,
    SourceSpec, Step,
};
pub use splits::{
    split_reader, split_start, Assignment, ModuloAssigner, SplitAssigner, SplitStart,
    StreamHashAssigner,
};
