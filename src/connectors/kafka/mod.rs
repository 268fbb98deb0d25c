//! The Kafka source: partitions assigned with `assign()` (lockgate owns the offsets),
//! positions checkpointed as the next offset to read, restored offsets winning on
//! restart, and partitions discovered later starting at EARLIEST.
//!
//! This file is the folder's face: the rest of lockgate reaches the Kafka connectors
//! through what it re-exports, never through the submodules (they stay public for
//! programs built on the library).

pub mod config;
mod event_clock;
pub mod fetcher;
pub mod metrics;
pub mod offsets;
pub mod queues;
pub mod sink;
pub mod sink_config;
pub mod source;
pub mod start_position;
pub mod topic_ids;
pub mod upstream;

/// The source (`[source.kafka]`): its section of the job file, its configuration and the
/// source itself.
pub use config::{KafkaSection, KafkaSourceConfig, Startup, TopicPattern, TopicSelector};
pub use source::KafkaSource;

/// The sink (`[sink.kafka]`): its section of the job file and its configuration.
pub use sink_config::{KafkaSinkConfig, KafkaSinkSection};

/// What a checkpoint's Kafka positions are on a cluster, for the checkpoint commands:
/// a topic's id as Kafka spells it, and the offsets each partition holds now.
pub use offsets::ranges;
pub use topic_ids::TopicId;

/// The kind of the Kafka source and of the Kafka sink in a job graph (`[source.kafka]`,
/// `[sink.kafka]`).
pub const KIND: &str = "kafka";

/// A topic partition.
pub type Tp = (String, i32);
