//! The Kafka source's own metric families, registered in the job's registry the first
//! time a subtask opens ([`crate::telemetry::Metrics::extension`]), and the names it
//! reports its partitions' progress under.

use crate::telemetry::metrics::{Metrics, TASK_LABELS};
use crate::telemetry::SplitProgressNames;
use prometheus::{IntCounterVec, IntGaugeVec, Opts};
use std::sync::Arc;

/// Per subtask: bytes read, partitions assigned, discovered and restored.
pub struct KafkaMetrics {
    pub bytes_read: IntCounterVec,
    pub partitions_assigned: IntGaugeVec,
    pub partitions_discovered: IntCounterVec,
    pub partitions_restored: IntGaugeVec,
}

impl KafkaMetrics {
    /// The families of the job of `m` (registered once).
    pub fn of(m: &Metrics) -> Arc<KafkaMetrics> {
        m.extension(|m| {
            let counter = |name: &str, help: &str| {
                m.register(IntCounterVec::new(Opts::new(name, help), TASK_LABELS).expect("valid"))
            };
            let gauge = |name: &str, help: &str| {
                m.register(IntGaugeVec::new(Opts::new(name, help), TASK_LABELS).expect("valid"))
            };
            KafkaMetrics {
                bytes_read: counter(
                    "lockgate_kafka_read_bytes_total",
                    "Bytes of keys and values read from Kafka.",
                ),
                partitions_assigned: gauge(
                    "lockgate_kafka_partitions_assigned",
                    "Partitions the source subtask reads.",
                ),
                partitions_discovered: counter(
                    "lockgate_kafka_partitions_discovered_total",
                    "Partitions found by discovery after the start (they start at EARLIEST).",
                ),
                partitions_restored: gauge(
                    "lockgate_kafka_partitions_restored",
                    "Partitions of the subtask whose position came from the restored checkpoint.",
                ),
            }
        })
    }
}

/// The names of the partitions' progress: position, end offset and lag.
pub const PARTITION_PROGRESS: SplitProgressNames = SplitProgressNames {
    position: (
        "lockgate_kafka_partition_position",
        "The offset of the next record the source will read from the partition.",
    ),
    end: (
        "lockgate_kafka_partition_end_offset",
        "The partition's end: its last stable offset (read_committed) or high watermark, as last fetched.",
    ),
    lag: (
        "lockgate_kafka_partition_lag",
        "Records between the partition's position and its end.",
    ),
};
