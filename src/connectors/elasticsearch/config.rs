//! What the user configures for the Elasticsearch sink (`[sink.elasticsearch]`): the
//! job-file section, its defaults (one place: [`EsSinkConfig::new`]), its validation,
//! and the sink it builds. A new setting touches this file only.

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

/// What a Kafka tombstone (a record without a value) means to the sink
/// (`on_null_value`, Kafka Connect's `behavior.on.null.values`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NullValue {
    /// Delete the document with the record's id (`id = "key"`).
    Delete,
    /// Write nothing (counted and logged).
    Skip,
    /// Fail the job, naming the record.
    Fail,
}

impl NullValue {
    /// Parses `delete`, `skip` or `fail`.
    pub fn parse(s: &str) -> Result<NullValue, String> {
        match s {
            "delete" => Ok(NullValue::Delete),
            "skip" => Ok(NullValue::Skip),
            "fail" => Ok(NullValue::Fail),
            other => Err(format!("`{other}` is not one of delete, skip, fail")),
        }
    }
}

/// The sink's configuration; defaults as in the job file.
#[derive(Debug, Clone, PartialEq)]
pub struct EsSinkConfig {
    pub url: String,
    /// The index: a name, or a template with `{yyyy.MM.dd}` date patterns and
    /// `{/json/pointer}` fields ([`super::index_name`]).
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
    /// What a tombstone means. `None`: tombstones never reach the sink; the Kafka
    /// source treats them as records it cannot decode (`on_decode_error`).
    pub on_null_value: Option<NullValue>,
    /// The most bytes of actions the sink holds (buffered, in flight, awaiting a retry)
    /// before it stops taking records; one batch larger than this still passes alone.
    pub buffer_max_bytes: usize,
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
            on_null_value: None,
            buffer_max_bytes: 64 * 1024 * 1024,
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
        let template = super::index_name::IndexTemplate::parse(&self.index)
            .map_err(|e| ("index".to_string(), e))?;
        if self.on_null_value == Some(NullValue::Delete) {
            if self.id != IdStrategy::Key {
                return Err((
                    "on_null_value".into(),
                    "on_null_value = \"delete\" deletes the document with the record's key: it needs id = \"key\"".into(),
                ));
            }
            if template.reads_fields() {
                return Err((
                    "on_null_value".into(),
                    "on_null_value = \"delete\" with an index made of {/pointer} fields: a tombstone has no fields to choose the index".into(),
                ));
            }
        }
        for (key, value) in [
            ("bulk_max_actions", self.bulk_max_actions as u64),
            ("bulk_max_bytes", self.bulk_max_bytes as u64),
            ("max_in_flight", self.max_in_flight as u64),
            ("request_timeout_ms", self.request_timeout_ms),
            ("buffer_max_bytes", self.buffer_max_bytes as u64),
        ] {
            if value == 0 {
                return Err((key.into(), "must be positive".into()));
            }
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

/// `[sink.elasticsearch]` as written in a job file. A key that is absent takes
/// [`EsSinkConfig::new`]'s default, so the job file and the Rust API cannot disagree.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EsSection {
    pub url: String,
    pub index: String,
    id: Option<String>,
    operation: Option<String>,
    versioning: Option<String>,
    bulk_max_actions: Option<usize>,
    bulk_max_bytes: Option<usize>,
    bulk_flush_interval_ms: Option<u64>,
    max_in_flight: Option<usize>,
    retry_initial_ms: Option<u64>,
    retry_max_ms: Option<u64>,
    retry_max_attempts: Option<u32>,
    on_item_error: Option<String>,
    flush_on_checkpoint: Option<bool>,
    coalesce: Option<bool>,
    request_timeout_ms: Option<u64>,
    on_null_value: Option<String>,
    buffer_max_bytes: Option<usize>,
}

/// What the sink's section takes from the rest of the job file.
#[derive(Debug, Clone, Default)]
pub struct SinkContext {
    /// The Kafka cluster dead letters go to (the source's), with its librdkafka
    /// properties.
    pub dead_letter_kafka: Option<(String, std::collections::BTreeMap<String, String>)>,
    /// How long a checkpoint may wait for the flush.
    pub checkpoint_timeout_ms: u64,
    /// The source's offsets order the records of one partition only (Kafka), so
    /// external versions need the guard of [`super::version_guard`].
    pub offsets_per_partition: bool,
}

impl EsSection {
    /// Whether the section says what a tombstone means (`on_null_value`): only then do
    /// tombstones reach the sink as records.
    pub fn reads_tombstones(&self) -> bool {
        self.on_null_value.is_some()
    }

    /// The sink's configuration. An error is `(key, message)`, the key relative to the
    /// section.
    pub fn config(&self, ctx: &SinkContext) -> Result<EsSinkConfig, (String, String)> {
        use crate::connectors::at_key as at;
        let mut c = EsSinkConfig::new(self.url.clone(), self.index.clone());
        if let Some(id) = &self.id {
            c.id = IdStrategy::parse(id).map_err(at("id"))?;
        }
        if let Some(op) = &self.operation {
            c.operation = Operation::parse(op).map_err(at("operation"))?;
        }
        if let Some(v) = &self.versioning {
            c.versioning = Versioning::parse(v).map_err(at("versioning"))?;
        }
        let set = |slot: &mut usize, v: Option<usize>| *slot = v.unwrap_or(*slot);
        set(&mut c.bulk_max_actions, self.bulk_max_actions);
        set(&mut c.bulk_max_bytes, self.bulk_max_bytes);
        set(&mut c.max_in_flight, self.max_in_flight);
        set(&mut c.buffer_max_bytes, self.buffer_max_bytes);
        c.bulk_flush_interval_ms = self
            .bulk_flush_interval_ms
            .unwrap_or(c.bulk_flush_interval_ms);
        c.retry_initial_ms = self.retry_initial_ms.unwrap_or(c.retry_initial_ms);
        c.retry_max_ms = self.retry_max_ms.unwrap_or(c.retry_max_ms);
        c.retry_max_attempts = self.retry_max_attempts.unwrap_or(c.retry_max_attempts);
        if let Some(p) = &self.on_item_error {
            c.on_item_error = ItemErrorPolicy::parse(p).map_err(at("on_item_error"))?;
        }
        c.flush_on_checkpoint = self.flush_on_checkpoint.unwrap_or(c.flush_on_checkpoint);
        c.coalesce = self.coalesce.unwrap_or(c.coalesce);
        c.request_timeout_ms = self.request_timeout_ms.unwrap_or(c.request_timeout_ms);
        if let Some(n) = &self.on_null_value {
            c.on_null_value = Some(NullValue::parse(n).map_err(at("on_null_value"))?);
        }
        if let Some((servers, properties)) = &ctx.dead_letter_kafka {
            c.dead_letter_bootstrap_servers = Some(servers.clone());
            c.dead_letter_properties = properties.clone();
        }
        c.flush_timeout_ms = ctx.checkpoint_timeout_ms;
        c.validate().map_err(|(k, m)| {
            let k = if k == "operation" {
                "operation and versioning".to_string()
            } else {
                k
            };
            (k, m)
        })?;
        Ok(c)
    }

    /// Adds the sink this section describes to `b`.
    pub fn build(
        &self,
        b: crate::job::JobBuilder,
        ctx: &SinkContext,
    ) -> Result<crate::job::JobBuilder, (String, String)> {
        use super::{ConfigActionBuilder, EsSink, FailureHandler, PolicyFailureHandler};
        use std::sync::Arc;
        let c = Arc::new(self.config(ctx)?);
        let handler: Arc<dyn FailureHandler> =
            Arc::new(PolicyFailureHandler(c.on_item_error.clone()));
        // External versions are offsets: one partition must write each document.
        let b = if c.versioning == Versioning::External
            && c.id != IdStrategy::Coordinates
            && ctx.offsets_per_partition
        {
            use super::version_guard::{guard_key, VersionGuard, UID};
            let id = c.id.clone();
            b.key_by(move |r| Ok(guard_key(&id, r))).keyed(
                "elasticsearch_version_guard",
                UID,
                |_| VersionGuard,
            )
        } else {
            b
        };
        Ok(b.sink("elasticsearch", move |_| {
            Box::new(EsSink::new(
                c.clone(),
                Box::new(ConfigActionBuilder::new(&c)),
                handler.clone(),
            ))
        }))
    }
}

impl Operation {
    /// Parses `index`, `create` or `upsert`.
    pub fn parse(s: &str) -> Result<Operation, String> {
        match s {
            "index" => Ok(Operation::Index),
            "create" => Ok(Operation::Create),
            "upsert" => Ok(Operation::Upsert),
            other => Err(format!("`{other}` is not one of index, create, upsert")),
        }
    }
}

impl Versioning {
    /// Parses `none` or `external`.
    pub fn parse(s: &str) -> Result<Versioning, String> {
        match s {
            "none" => Ok(Versioning::None),
            "external" => Ok(Versioning::External),
            other => Err(format!("`{other}` is not one of none, external")),
        }
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

    #[test]
    fn the_job_file_defaults_are_the_rust_api_defaults() {
        let section: EsSection =
            toml::from_str("url = \"http://es:9200\"\nindex = \"orders\"").unwrap();
        let ctx = SinkContext {
            checkpoint_timeout_ms: 60_000,
            ..SinkContext::default()
        };
        assert_eq!(
            section.config(&ctx).unwrap(),
            EsSinkConfig::new("http://es:9200", "orders")
        );
    }

    #[test]
    fn every_key_of_the_section_is_applied_and_errors_name_the_key() {
        let text = r#"
url = "u"
index = "i"
id = "key"
operation = "create"
versioning = "external"
bulk_max_actions = 7
bulk_max_bytes = 8
bulk_flush_interval_ms = 9
max_in_flight = 3
retry_initial_ms = 11
retry_max_ms = 12
retry_max_attempts = 13
on_item_error = "dead-letter:dlq"
flush_on_checkpoint = false
coalesce = false
request_timeout_ms = 14
buffer_max_bytes = 15
"#;
        let section: EsSection = toml::from_str(text).unwrap();
        let ctx = SinkContext {
            dead_letter_kafka: Some(("k:9092".into(), Default::default())),
            checkpoint_timeout_ms: 5,
            offsets_per_partition: true,
        };
        let c = section.config(&ctx).unwrap();
        let mut want = EsSinkConfig::new("u", "i");
        want.id = IdStrategy::Key;
        want.operation = Operation::Create;
        want.versioning = Versioning::External;
        want.bulk_max_actions = 7;
        want.bulk_max_bytes = 8;
        want.bulk_flush_interval_ms = 9;
        want.max_in_flight = 3;
        want.retry_initial_ms = 11;
        want.retry_max_ms = 12;
        want.retry_max_attempts = 13;
        want.on_item_error = ItemErrorPolicy::DeadLetter("dlq".into());
        want.flush_on_checkpoint = false;
        want.coalesce = false;
        want.request_timeout_ms = 14;
        want.buffer_max_bytes = 15;
        want.flush_timeout_ms = 5;
        want.dead_letter_bootstrap_servers = Some("k:9092".into());
        assert_eq!(c, want);
        let bad: EsSection =
            toml::from_str("url = \"u\"\nindex = \"i\"\noperation = \"merge\"").unwrap();
        assert_eq!(
            bad.config(&SinkContext::default()).unwrap_err().0,
            "operation"
        );
        let zero: EsSection =
            toml::from_str("url = \"u\"\nindex = \"i\"\nbuffer_max_bytes = 0").unwrap();
        assert_eq!(
            zero.config(&SinkContext::default()).unwrap_err().0,
            "buffer_max_bytes"
        );
    }
}
