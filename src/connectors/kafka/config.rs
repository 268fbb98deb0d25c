//! What the user configures for the Kafka source (`[source.kafka]`).

use regex::Regex;
use std::collections::BTreeMap;

/// Which topics the source reads.
#[derive(Debug, Clone)]
pub enum TopicSelector {
    /// These topics (a topic added later to the list is discovered on restart).
    List(Vec<String>),
    /// Every topic whose whole name matches; topics created later are discovered.
    Pattern(Regex),
}

impl TopicSelector {
    /// Whether `topic` is selected.
    pub fn matches(&self, topic: &str) -> bool {
        match self {
            TopicSelector::List(l) => l.iter().any(|t| t == topic),
            TopicSelector::Pattern(r) => r
                .find(topic)
                .is_some_and(|m| m.start() == 0 && m.end() == topic.len()),
        }
    }
}

/// Where partitions start when no checkpoint is restored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Startup {
    Earliest,
    Latest,
    /// The group's committed offsets; partitions without one start at EARLIEST.
    GroupOffsets,
    /// The first offset whose timestamp is at or after the time (ms since the epoch);
    /// the end of the partition when there is none.
    Timestamp(i64),
    /// Explicit next offsets; partitions not listed start at EARLIEST (Rust API only).
    Offsets(BTreeMap<(String, i32), i64>),
}

impl Startup {
    /// Parses the job-file form: `earliest`, `latest`, `group-offsets`, `timestamp:<ms>`.
    pub fn parse(s: &str) -> Result<Startup, String> {
        match s {
            "earliest" => Ok(Startup::Earliest),
            "latest" => Ok(Startup::Latest),
            "group-offsets" => Ok(Startup::GroupOffsets),
            _ => match s.strip_prefix("timestamp:") {
                Some(ms) => ms
                    .parse()
                    .map(Startup::Timestamp)
                    .map_err(|_| format!("`{s}`: timestamp:<milliseconds since the epoch>")),
                None => Err(format!(
                    "`{s}` is not one of earliest, latest, group-offsets, timestamp:<ms>"
                )),
            },
        }
    }
}

/// How record payloads are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Text,
    Bytes,
}

/// What happens to a record that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeErrorPolicy {
    /// Fail the job, naming topic, partition and offset.
    Fail,
    /// Count and log the record, then go on.
    Skip,
    /// Write the original record, with the error in headers, to this topic.
    DeadLetter(String),
}

impl DecodeErrorPolicy {
    /// Parses `fail`, `skip` or `dead-letter:<topic>`.
    pub fn parse(s: &str) -> Result<DecodeErrorPolicy, String> {
        match s {
            "fail" => Ok(DecodeErrorPolicy::Fail),
            "skip" => Ok(DecodeErrorPolicy::Skip),
            _ => match s.strip_prefix("dead-letter:") {
                Some(t) if !t.is_empty() => Ok(DecodeErrorPolicy::DeadLetter(t.to_string())),
                _ => Err(format!(
                    "`{s}` is not one of fail, skip, dead-letter:<topic>"
                )),
            },
        }
    }
}

/// The Kafka source's configuration.
#[derive(Debug, Clone)]
pub struct KafkaSourceConfig {
    pub bootstrap_servers: String,
    pub topics: TopicSelector,
    /// Offsets are committed here after each checkpoint, for monitoring only.
    pub group_id: String,
    pub startup: Startup,
    /// 0 disables discovery.
    pub partition_discovery_ms: u64,
    /// Stop at the end offsets captured at the first start.
    pub bounded: bool,
    pub format: Format,
    pub on_decode_error: DecodeErrorPolicy,
    /// How long the first contact with the cluster may take before the job fails.
    pub connect_timeout_ms: u64,
    /// Passed to librdkafka unchanged (they override lockgate's defaults).
    pub properties: BTreeMap<String, String>,
}

impl KafkaSourceConfig {
    /// A configuration with the job file's defaults.
    pub fn new(
        bootstrap_servers: impl Into<String>,
        topics: TopicSelector,
        group_id: impl Into<String>,
    ) -> KafkaSourceConfig {
        KafkaSourceConfig {
            bootstrap_servers: bootstrap_servers.into(),
            topics,
            group_id: group_id.into(),
            startup: Startup::Earliest,
            partition_discovery_ms: 5000,
            bounded: false,
            format: Format::Json,
            on_decode_error: DecodeErrorPolicy::Fail,
            connect_timeout_ms: 30_000,
            properties: BTreeMap::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_startup_and_policies() {
        assert_eq!(
            Startup::parse("timestamp:1700000000000"),
            Ok(Startup::Timestamp(1_700_000_000_000))
        );
        assert!(Startup::parse("timestamp:x").is_err());
        assert!(Startup::parse("newest").is_err());
        assert_eq!(
            DecodeErrorPolicy::parse("dead-letter:dlq"),
            Ok(DecodeErrorPolicy::DeadLetter("dlq".into()))
        );
        assert!(DecodeErrorPolicy::parse("dead-letter:").is_err());
    }

    #[test]
    fn pattern_matches_whole_names_only() {
        let s = TopicSelector::Pattern(Regex::new("orders-.*").unwrap());
        assert!(s.matches("orders-eu"));
        assert!(!s.matches("old-orders-eu"));
    }
}
