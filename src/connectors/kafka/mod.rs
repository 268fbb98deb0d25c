//! The Kafka source: partitions assigned with `assign()` (lockgate owns the offsets),
//! positions checkpointed as the next offset to read, restored offsets winning on
//! restart, and partitions discovered later starting at EARLIEST.

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

pub use config::{KafkaSourceConfig, Startup, TopicPattern, TopicSelector};
pub use source::KafkaSource;

/// The source kind of the Kafka source in a job graph.
pub const KIND: &str = "kafka";

/// A topic partition.
pub type Tp = (String, i32);
