//! What the user configures for the Elasticsearch sink (`[sink.elasticsearch]`).

/// How document ids are derived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdStrategy {
    /// `{topic}-{partition}-{offset}`: every input record is one document.
    Coordinates,
    /// The record's key (UTF-8).
    Key,
    /// The value at a JSON pointer of the record.
    Field(String),
}

impl IdStrategy {
    /// Parses `coordinates`, `key` or `field:<json pointer>`.
    pub fn parse(s: &str) -> Result<IdStrategy, String> {
        match s {
            "coordinates" => Ok(IdStrategy::Coordinates),
            "key" => Ok(IdStrategy::Key),
            _ => match s.strip_prefix("field:") {
                Some(p) if p.starts_with('/') => Ok(IdStrategy::Field(p.to_string())),
                _ => Err(format!(
                    "`{s}` is not one of coordinates, key, field:<json pointer>"
                )),
            },
        }
    }
}

/// The bulk operation written per record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Index,
    Create,
    /// `update` with `doc_as_upsert`.
    Upsert,
}

/// Versioning of written documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Versioning {
    None,
    /// The version is the record's Kafka offset: a replay can never regress a newer
    /// document. Offsets compare only within one partition.
    External,
}

/// What happens to an item Elasticsearch refuses (mapping or parse errors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemErrorPolicy {
    Fail,
    /// Write the original record and the error to this Kafka topic.
    DeadLetter(String),
}

impl ItemErrorPolicy {
    /// Parses `fail` or `dead-letter:<topic>`.
    pub fn parse(s: &str) -> Result<ItemErrorPolicy, String> {
        match s {
            "fail" => Ok(ItemErrorPolicy::Fail),
            _ => match s.strip_prefix("dead-letter:") {
                Some(t) if !t.is_empty() => Ok(ItemErrorPolicy::DeadLetter(t.to_string())),
                _ => Err(format!("`{s}` is not one of fail, dead-letter:<topic>")),
            },
        }
    }
}

/// The sink's configuration; defaults as in the job file.
#[derive(Debug, Clone)]
pub struct EsSinkConfig {
    pub url: String,
    pub index: String,
    pub id: IdStrategy,
    pub operation: Operation,
    pub versioning: Versioning,
    pub bulk_max_actions: usize,
    pub bulk_max_bytes: usize,
    pub bulk_flush_interval_ms: u64,
    pub max_in_flight: usize,
    pub retry_initial_ms: u64,
    pub retry_max_ms: u64,
    pub retry_max_attempts: u32,
    pub on_item_error: ItemErrorPolicy,
    /// Kafka bootstrap servers of the dead-letter topic.
    pub dead_letter_bootstrap_servers: Option<String>,
    /// librdkafka properties of that cluster (its connection and security ones are used).
    pub dead_letter_properties: std::collections::BTreeMap<String, String>,
    /// Wait at each checkpoint until every action is written. Without it, a checkpoint
    /// guarantees nothing about Elasticsearch.
    pub flush_on_checkpoint: bool,
    /// How long a checkpoint may wait for the flush (the checkpoint timeout).
    pub flush_timeout_ms: u64,
    /// Timeout of one bulk request.
    pub request_timeout_ms: u64,
    /// Drop an unsent action when a newer action on the same document makes it
    /// irrelevant (an `index`, a delete, or an upsert that sets every field the older
    /// upsert set): each request carries the latest write per document.
    pub coalesce: bool,
}

impl EsSinkConfig {
    /// A configuration with the job file's defaults.
    pub fn new(url: impl Into<String>, index: impl Into<String>) -> EsSinkConfig {
        EsSinkConfig {
            url: url.into(),
            index: index.into(),
            id: IdStrategy::Coordinates,
            operation: Operation::Index,
            versioning: Versioning::None,
            bulk_max_actions: 1000,
            bulk_max_bytes: 5 * 1024 * 1024,
            bulk_flush_interval_ms: 1000,
            max_in_flight: 2,
            retry_initial_ms: 100,
            retry_max_ms: 10_000,
            retry_max_attempts: 10,
            on_item_error: ItemErrorPolicy::Fail,
            dead_letter_bootstrap_servers: None,
            dead_letter_properties: std::collections::BTreeMap::new(),
            flush_on_checkpoint: true,
            flush_timeout_ms: 60_000,
            request_timeout_ms: 30_000,
            coalesce: true,
        }
    }

    /// Checks combinations Elasticsearch refuses; the error names both keys.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.operation == Operation::Upsert && self.versioning == Versioning::External {
            return Err((
                "operation".into(),
                "operation = \"upsert\" with versioning = \"external\": Elasticsearch refuses versioned updates".into(),
            ));
        }
        if self.bulk_max_actions == 0 || self.max_in_flight == 0 || self.bulk_max_bytes == 0 {
            return Err((
                "bulk_max_actions".into(),
                "bulk_max_actions, bulk_max_bytes and max_in_flight must be positive".into(),
            ));
        }
        if matches!(self.on_item_error, ItemErrorPolicy::DeadLetter(_))
            && self.dead_letter_bootstrap_servers.is_none()
        {
            return Err((
                "on_item_error".into(),
                "dead-letter needs Kafka bootstrap servers (the job's Kafka source provides them)"
                    .into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upsert_with_external_versioning_is_refused() {
        let mut c = EsSinkConfig::new("http://x", "i");
        c.operation = Operation::Upsert;
        c.versioning = Versioning::External;
        let (key, msg) = c.validate().unwrap_err();
        assert_eq!(key, "operation");
        assert!(msg.contains("operation") && msg.contains("versioning"));
    }

    #[test]
    fn parses_ids_and_policies() {
        assert_eq!(
            IdStrategy::parse("field:/user/id"),
            Ok(IdStrategy::Field("/user/id".into()))
        );
        assert!(IdStrategy::parse("field:user").is_err());
        assert_eq!(
            ItemErrorPolicy::parse("dead-letter:dlq"),
            Ok(ItemErrorPolicy::DeadLetter("dlq".into()))
        );
        assert!(ItemErrorPolicy::parse("skip").is_err());
    }
}
