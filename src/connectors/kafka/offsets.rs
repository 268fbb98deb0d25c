//! The offsets a Kafka partition holds now, asked of the cluster with a job's own
//! connection settings (`checkpoints alter` checks new positions against them).

use super::properties::{apply, ClientRole};
use crate::checkpoint::alter::PartitionRange;
use crate::connector::section::KafkaCluster;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use std::collections::BTreeMap;
use std::time::Duration;

/// How long the cluster may take to answer for one partition.
const TIMEOUT: Duration = Duration::from_secs(15);

/// The earliest kept offset and the end of each of `partitions` on `cluster`. An error
/// names the partition and the cluster.
pub fn ranges(
    cluster: &KafkaCluster,
    partitions: &[(String, i32)],
) -> Result<BTreeMap<(String, i32), PartitionRange>, String> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &cluster.bootstrap_servers)
        .set("client.id", "lockgate-checkpoints-alter");
    apply(&mut config, &cluster.properties, ClientRole::Consumer);
    let consumer: BaseConsumer = config.create().map_err(|e| {
        format!(
            "cannot create a client of {}: {e}",
            cluster.bootstrap_servers
        )
    })?;
    let mut out = BTreeMap::new();
    for (topic, partition) in partitions {
        let (earliest, end) = consumer
            .fetch_watermarks(topic, *partition, TIMEOUT)
            .map_err(|e| {
                format!(
                    "cannot read the offsets of {topic}:{partition} from {}: {e}",
                    cluster.bootstrap_servers
                )
            })?;
        out.insert(
            (topic.clone(), *partition),
            PartitionRange { earliest, end },
        );
    }
    Ok(out)
}
