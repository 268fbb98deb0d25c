//! `[source.kafka.properties]`: the librdkafka properties of every Kafka client a job
//! makes (the source's consumer, which also serves its metadata requests, the
//! dead-letter producers of the source and of the Elasticsearch sink, and the chaos
//! harness's verifying consumer).
//!
//! One table for every client, so that a secured cluster is configured once. A
//! property that librdkafka documents as consumer-only (scope `C` in its
//! CONFIGURATION.md, [`CONSUMER_ONLY`]) is not given to producers, and a producer-only
//! one ([`PRODUCER_ONLY`]) is not given to the consumer: librdkafka would only warn
//! that the client ignores it. Everything else (connection, security, `client.id`,
//! `socket.*`, `retry.backoff.ms`, ...) applies to every client.
//!
//! The table is checked when the job file is loaded ([`check`]): each property is set
//! on a native librdkafka configuration, which validates the name and the value without
//! creating a client (creating one starts broker threads that connect). Conflicts
//! between properties that librdkafka only detects when a client is created surface at
//! the start of the job, naming the client.
//!
//! [`KafkaCluster`] is a cluster with its table: what the contract hands from the
//! source's section to the sections that write to the same cluster.

use rdkafka::ClientConfig;
use std::collections::BTreeMap;

/// A Kafka cluster as a source reaches it: the address and the client properties
/// (security settings) that every client of the job uses for it.
#[derive(Debug, Clone)]
pub struct KafkaCluster {
    pub bootstrap_servers: String,
    pub properties: crate::secret::Properties,
}

/// The kind of Kafka client a property may apply to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientRole {
    Consumer,
    Producer,
}

/// Consumer-only properties (librdkafka's scope `C`): never given to a producer.
pub const CONSUMER_ONLY: &[&str] = &[
    "group.id",
    "group.instance.id",
    "partition.assignment.strategy",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "group.protocol.type",
    "group.protocol",
    "group.remote.assignor",
    "coordinator.query.interval.ms",
    "max.poll.interval.ms",
    "enable.auto.commit",
    "auto.commit.enable",
    "auto.commit.interval.ms",
    "enable.auto.offset.store",
    "queued.min.messages",
    "queued.max.messages.kbytes",
    "fetch.wait.max.ms",
    "fetch.queue.backoff.ms",
    "fetch.message.max.bytes",
    "max.partition.fetch.bytes",
    "fetch.max.bytes",
    "fetch.min.bytes",
    "fetch.error.backoff.ms",
    "offset.store.method",
    "offset.store.path",
    "offset.store.sync.interval.ms",
    "isolation.level",
    "enable.partition.eof",
    "check.crcs",
    "auto.offset.reset",
    "consume.callback.max.messages",
];

/// Producer-only properties (librdkafka's scope `P`): never given to the consumer.
pub const PRODUCER_ONLY: &[&str] = &[
    "transactional.id",
    "transaction.timeout.ms",
    "enable.idempotence",
    "enable.gapless.guarantee",
    "queue.buffering.max.messages",
    "queue.buffering.max.kbytes",
    "queue.buffering.max.ms",
    "linger.ms",
    "message.send.max.retries",
    "retries",
    "queue.buffering.backpressure.threshold",
    "compression.codec",
    "compression.type",
    "compression.level",
    "batch.num.messages",
    "batch.size",
    "delivery.report.only.error",
    "sticky.partitioning.linger.ms",
    "request.required.acks",
    "acks",
    "request.timeout.ms",
    "message.timeout.ms",
    "delivery.timeout.ms",
    "queuing.strategy",
    "produce.offset.report",
    "partitioner",
];

/// Whether property `key` is given to a client of `role`.
pub fn applies_to(key: &str, role: ClientRole) -> bool {
    match role {
        ClientRole::Consumer => !PRODUCER_ONLY.contains(&key),
        ClientRole::Producer => !CONSUMER_ONLY.contains(&key),
    }
}

/// Sets on `c` every property of `properties` that applies to `role`.
pub fn apply<'a>(
    c: &mut ClientConfig,
    properties: impl IntoIterator<Item = (&'a String, &'a String)>,
    role: ClientRole,
) {
    for (k, v) in properties {
        if applies_to(k, role) {
            c.set(k, v);
        }
    }
}

/// Why lockgate refuses a value that librdkafka would accept: dead-letter producers are
/// idempotent with `acks = all` (a dead letter is acknowledged by every in-sync replica
/// before the record's position moves), and a property that weakens that is an error
/// rather than silently overridden.
pub fn conflict(key: &str, value: &str) -> Option<String> {
    match key {
        "acks" | "request.required.acks" if !matches!(value, "all" | "-1") => Some(format!(
            "`{value}`: dead-letter producers write with acks = all; remove the property"
        )),
        "enable.idempotence" if value != "true" => Some(format!(
            "`{value}`: dead-letter producers are idempotent; remove the property"
        )),
        "transactional.id" => {
            Some("dead-letter producers are not transactional; remove the property".into())
        }
        _ => None,
    }
}

/// Checks every property: librdkafka must know the name and accept the value, and
/// [`conflict`] must not refuse it. No client is created and nothing connects. An
/// error is `(key, message)`, the key being the property name.
pub fn check(properties: &BTreeMap<String, String>) -> Result<(), (String, String)> {
    for (k, v) in properties {
        if let Some(why) = conflict(k, v) {
            return Err((k.clone(), why));
        }
        ClientConfig::new()
            .set(k, v)
            .create_native_config()
            .map_err(|e| (k.clone(), native_error(e, v)))?;
    }
    Ok(())
}

fn native_error(e: rdkafka::error::KafkaError, value: &str) -> String {
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaConfRes;
    match e {
        KafkaError::ClientConfig(RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN, desc, _, _) => {
            format!("not a librdkafka property ({desc})")
        }
        KafkaError::ClientConfig(_, desc, _, _) => {
            format!("librdkafka refuses the value `{value}` ({desc})")
        }
        other => format!("librdkafka refuses the value `{value}` ({other})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_client_gets_which_property() {
        use ClientRole::*;
        // (property, consumer, producer)
        let table = [
            ("security.protocol", true, true),
            ("sasl.mechanism", true, true),
            ("ssl.ca.location", true, true),
            ("client.id", true, true),
            ("socket.timeout.ms", true, true),
            ("retry.backoff.ms", true, true),
            ("statistics.interval.ms", true, true),
            ("fetch.max.bytes", true, false),
            ("fetch.wait.max.ms", true, false),
            ("group.id", true, false),
            ("auto.offset.reset", true, false),
            ("isolation.level", true, false),
            ("linger.ms", false, true),
            ("compression.type", false, true),
            ("acks", false, true),
            ("enable.idempotence", false, true),
        ];
        for (key, consumer, producer) in table {
            assert_eq!(applies_to(key, Consumer), consumer, "{key} on the consumer");
            assert_eq!(applies_to(key, Producer), producer, "{key} on a producer");
        }
    }

    #[test]
    fn names_and_values_are_checked_without_a_client() {
        let props = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        assert_eq!(check(&props("fetch.max.bytes", "1048576")), Ok(()));
        assert_eq!(check(&props("security.protocol", "plaintext")), Ok(()));
        assert_eq!(check(&props("acks", "all")), Ok(()));
        for (k, v, says) in [
            ("fetch.max.byte", "1", "not a librdkafka property"),
            ("fetch.max.bytes", "lots", "lots"),
            ("fetch.max.bytes", "-5", "fetch.max.bytes"),
            ("security.protocol", "carrier-pigeon", "carrier-pigeon"),
            ("acks", "1", "acks = all"),
            ("request.required.acks", "0", "acks = all"),
            ("enable.idempotence", "false", "idempotent"),
            ("transactional.id", "x", "transactional"),
        ] {
            let (key, message) = check(&props(k, v)).unwrap_err();
            assert_eq!(key, k);
            assert!(message.contains(says), "{k} = {v}: {message}");
        }
        // The first offending key is named, not a later one.
        let mut two = props("fetch.max.bytes", "1048576");
        two.insert("enable.partition.eof".into(), "maybe".into());
        assert_eq!(check(&two).unwrap_err().0, "enable.partition.eof");
    }
}
