//! The offsets a Kafka partition holds now, asked of the cluster with a job's own
//! connection settings (`checkpoints alter` checks new positions against them).

use crate::checkpoint::alter::PartitionRange;
use crate::clients::kafka::{apply, ClientRole, KafkaCluster};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use std::collections::BTreeMap;
use std::time::Duration;

/// How long the cluster may take to answer for one partition.
const TIMEOUT: Duration = Duration::from_secs(15);

/// The earliest kept offset, the end and the topic id of each of `partitions` on
/// `cluster`. An error names the partition and the cluster; a cluster that cannot tell
/// topic ids leaves them unknown.
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
    let mut topics: Vec<String> = partitions.iter().map(|(t, _)| t.clone()).collect();
    topics.sort();
    topics.dedup();
    let ids = topic_ids(&consumer, &topics);
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
        let topic_id = ids.get(topic).copied().flatten().map(|id| id.bytes());
        out.insert(
            (topic.clone(), *partition),
            PartitionRange {
                earliest,
                end,
                topic_id,
            },
        );
    }
    Ok(out)
}

/// The topics' ids, asked of the broker that answered a metadata request (as the
/// source asks them); none when the cluster cannot tell.
fn topic_ids(
    consumer: &BaseConsumer,
    topics: &[String],
) -> BTreeMap<String, Option<super::topic_ids::TopicId>> {
    let broker = consumer
        .fetch_metadata(topics.first().map(String::as_str), TIMEOUT)
        .ok()
        .and_then(|md| {
            Some(md.orig_broker_id())
                .filter(|id| *id >= 0)
                .or_else(|| md.brokers().first().map(|b| b.id()))
        });
    match super::topic_ids::describe(consumer.client(), topics, broker, TIMEOUT) {
        Ok(ids) => ids,
        Err(e) => {
            eprintln!("warning: cannot read the topics' ids (DescribeTopics): {e}");
            BTreeMap::new()
        }
    }
}
