//! What the user configures for the Elasticsearch sink (`[sink.elasticsearch]`): the
//! job-file section, its defaults (one place: [`EsSinkConfig::new`]), its validation,
//! and the sink it builds. A new setting touches this file only.
//!
//! How the cluster is reached (`url` / `urls` / `cloud_id`, credentials, TLS,
//! compression, headers) is read here into an [`EsConnection`]: URLs are parsed and
//! `ca_cert` and `*_file` secrets are read when the job file is loaded, so a mistake is a
//! configuration error naming its key, not a failure at the first request.

use super::connection::EsConnection;
pub use super::params::{DataStream, TimestampSource};
use crate::clients::http::{cloud_node, endpoint, Endpoint, EndpointKeys, Wording};
use crate::dead_letter::{Allowed, OnError};
use crate::secret::{Secret, UrlText};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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

/// The default of `buffer_max_bytes`, per subtask. Each action counts with its
/// bookkeeping (several hundred bytes), so the figure is the memory the sink holds, not
/// only its request lines. With small documents a request is full at
/// `bulk_max_actions` long before this: the demo's job (documents of about 100 bytes)
/// holds several requests' worth and wrote as fast with 4 MiB as with 64, which held
/// 150 MiB more (and 8 MiB peaked 8 MiB higher than 4 over 10^6 orders). With
/// documents of several KiB a request is cut at about this size and one is in flight at
/// a time; to keep `max_in_flight` full requests of `bulk_max_bytes` out, raise it to
/// about (`max_in_flight` + 1) × `bulk_max_bytes`.
pub const BUFFER_MAX_BYTES: usize = 4 << 20;

/// The sink's configuration; defaults as in the job file.
#[derive(Debug, Clone, PartialEq)]
pub struct EsSinkConfig {
    /// The nodes and how to reach them (credentials, TLS, compression, headers).
    pub connection: EsConnection,
    /// The index: a name, or a template with `{yyyy.MM.dd}` date patterns,
    /// `{/json/pointer}` fields, `{topic}` and `{partition}` ([`super::index_name`]).
    pub index: String,
    /// What `{topic}` stands for, by topic (`topic_to_index`).
    pub topic_to_index: BTreeMap<String, String>,
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
    /// What an item Elasticsearch refuses (mapping or parse errors) becomes
    /// (`on_item_error`).
    pub on_item_error: OnError,
    /// Kafka bootstrap servers of the dead-letter topic.
    pub dead_letter_bootstrap_servers: Option<String>,
    /// librdkafka properties of that cluster (its connection and security ones are used).
    /// (`Debug` hides secret properties such as `sasl.password`.)
    pub dead_letter_properties: crate::secret::Properties,
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
    /// The most bytes of actions the sink holds (buffered, in flight, awaiting a retry,
    /// set aside by coalescing), each counted with its bookkeeping, before it stops
    /// taking records; one batch larger than this still passes alone.
    pub buffer_max_bytes: usize,
    /// The ingest pipeline of each index or create action: a name, or a template with
    /// `{/pointer}` fields ([`super::params::PipelineTemplate`]).
    pub pipeline: Option<String>,
    /// A JSON pointer to the routing value of each action (`routing`).
    pub routing: Option<String>,
    /// Every write names an alias; a missing one fails the item instead of creating
    /// an index (Elasticsearch's `require_alias`).
    pub require_alias: bool,
    /// Write to this data stream (`index` is then its name, and every action a
    /// `create` with an `@timestamp`).
    pub data_stream: Option<DataStream>,
    /// Where a data stream document's `@timestamp` comes from.
    pub timestamp: TimestampSource,
    /// An index template put at open unless the cluster already has this one
    /// (`index_template_file`).
    pub index_template: Option<IndexTemplateFile>,
}

/// An index template read from `index_template_file`, put as `_index_template/<name>`.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexTemplateFile {
    /// The template's name (`index_template_name`, else the file's stem).
    pub name: String,
    /// The template as the file gives it (a JSON object with `index_patterns`).
    pub body: serde_json::Value,
}

impl EsSinkConfig {
    /// A configuration with the job file's defaults: one node at `url` (user info in it
    /// is taken as basic credentials, never sent in the URL), writing to `index`.
    pub fn new(url: impl Into<String>, index: impl Into<String>) -> EsSinkConfig {
        EsSinkConfig {
            connection: EsConnection::single(url),
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
            on_item_error: OnError::Fail,
            dead_letter_bootstrap_servers: None,
            dead_letter_properties: Default::default(),
            flush_on_checkpoint: true,
            flush_timeout_ms: 60_000,
            request_timeout_ms: 30_000,
            coalesce: true,
            on_null_value: None,
            buffer_max_bytes: BUFFER_MAX_BYTES,
            topic_to_index: BTreeMap::new(),
            pipeline: None,
            routing: None,
            require_alias: false,
            data_stream: None,
            timestamp: TimestampSource::Record,
            index_template: None,
        }
    }

    /// Whether unsent writes a newer one makes irrelevant are dropped: `coalesce`,
    /// except with an ingest pipeline (which may drop, reroute or rename a document,
    /// so a later write does not necessarily replace an earlier one) or with routing
    /// (the same id under another routing may be another document).
    pub fn coalesces(&self) -> bool {
        self.coalesce && self.pipeline.is_none() && self.routing.is_none()
    }

    /// Whether a bulk request carries at most one write per document, so that a later
    /// write of a document is sent only once the earlier one is resolved: written,
    /// dead-lettered (the broker acknowledged the letter), or failed on (the job stops
    /// sending). The batcher's [`Limits::one_action_per_document`].
    ///
    /// With external versions, a replayed write answered with 409 counts as already
    /// written ([`super::item_result::classify`]): the document holds that version or a
    /// newer one. If a newer write of the document could be applied while this one was
    /// refused and its refusal not yet acted on (one request carrying both), a crash
    /// in between would leave the refused record neither indexed nor dead-lettered,
    /// and a `fail` policy that failed the job on it would let the restarted job go on.
    /// Resolving each write before the next is sent makes the 409 mean "written,
    /// dead-lettered or failed on". It is needed whatever `on_item_error` (both
    /// account for every refused record) and whether or not writes are coalesced (a
    /// refused write's replaced writes go back and would share a request).
    ///
    /// Without versions a 409 means already written only for `create`, and what may
    /// follow a create in the same request is a delete, which leaves the document
    /// absent: the replayed create is judged again. So the answer is: with external
    /// versions. It bounds each document to one write per round trip when writes are
    /// not coalesced.
    ///
    /// [`Limits::one_action_per_document`]: crate::kits::bulk::Limits
    pub fn one_write_per_document(&self) -> bool {
        self.versioning == Versioning::External
    }

    /// Checks combinations Elasticsearch refuses; the error names both keys.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.operation == Operation::Upsert && self.versioning == Versioning::External {
            return Err((
                "operation and versioning".into(),
                "operation = \"upsert\" with versioning = \"external\": Elasticsearch refuses versioned updates".into(),
            ));
        }
        let template = super::index_name::IndexTemplate::parse(&self.index)
            .map_err(|e| ("index".to_string(), e))?;
        if !self.topic_to_index.is_empty() && !template.reads_origin() {
            return Err((
                "topic_to_index".into(),
                format!(
                    "renames what {{topic}} stands for, and index = {:?} has no {{topic}}",
                    self.index
                ),
            ));
        }
        let template = template
            .with_topics(self.topic_to_index.clone())
            .map_err(|(topic, e)| (format!("topic_to_index.{topic:?}"), e))?;
        if self.on_null_value == Some(NullValue::Delete) {
            if self.id == IdStrategy::Coordinates {
                return Err((
                    "on_null_value".into(),
                    "on_null_value = \"delete\" deletes the document the record's key names: it needs id = \"key\" (or \"field:/p\", read from a JSON key)".into(),
                ));
            }
            if template.reads_fields() {
                return Err((
                    "on_null_value".into(),
                    "on_null_value = \"delete\" with an index made of {/pointer} fields: a tombstone has no fields to choose the index".into(),
                ));
            }
        }
        self.validate_params()?;
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
        self.connection.validate()?;
        if matches!(self.on_item_error, OnError::DeadLetter(_))
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

impl EsSinkConfig {
    /// Checks `pipeline`, `routing`, `require_alias` and `data_stream` against the
    /// operation each goes with.
    fn validate_params(&self) -> Result<(), (String, String)> {
        if let Some(p) = &self.pipeline {
            super::params::PipelineTemplate::parse(p).map_err(|e| ("pipeline".to_string(), e))?;
            if self.operation == Operation::Upsert {
                return Err((
                    "pipeline".into(),
                    "Elasticsearch runs no ingest pipeline on an update, which operation = \"upsert\" writes: use operation = \"index\" or \"create\"".into(),
                ));
            }
        }
        if let Some(r) = &self.routing {
            if !r.starts_with('/') {
                return Err((
                    "routing".into(),
                    format!("`{r}` is not a JSON pointer (such as \"/tenant\")"),
                ));
            }
        }
        if self.data_stream.is_none() {
            if let TimestampSource::Field(_) = self.timestamp {
                return Err((
                    "timestamp_field".into(),
                    "sets a data stream's @timestamp: it needs data_stream".into(),
                ));
            }
            return Ok(());
        }
        // A data stream is append-only: Elasticsearch takes create actions only.
        let refusal = if self.on_null_value == Some(NullValue::Delete) {
            Some(("on_null_value", "a data stream takes no deletes"))
        } else if self.operation != Operation::Create {
            Some((
                "operation",
                "a data stream takes create actions only (no index, no upsert)",
            ))
        } else if self.id != IdStrategy::Coordinates {
            Some(("id", "a data stream keeps the first write of an id (a later create of it is refused as already written): use id = \"coordinates\", one document per record"))
        } else if self.versioning == Versioning::External {
            Some((
                "versioning",
                "a data stream takes no external versions (its documents are never replaced)",
            ))
        } else if self.require_alias {
            Some(("require_alias", "a data stream is not an alias"))
        } else if self.routing.is_some() {
            Some(("routing", "a data stream routes its documents itself; routing would need allow_custom_routing in its template"))
        } else {
            None
        };
        match refusal {
            Some((key, why)) => Err((key.into(), format!("{why} (data_stream)"))),
            None => Ok(()),
        }
    }
}

/// How the section words the errors it shares with the other HTTP sections: the chain's
/// CA (`tls_verify = "certificate"` without `ca_cert`) is checked by
/// [`EsConnection::validate`], after the section's own keys.
const WORDING: Wording = Wording {
    urls: "nodes' URLs",
    certificate_without_ca: None,
};

/// `[sink.elasticsearch]` as written in a job file. A key that is absent takes
/// [`EsSinkConfig::new`]'s default, so the job file and the Rust API cannot disagree.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EsSection {
    /// One node; or `urls` (several), or `cloud_id`: exactly one of the three.
    url: Option<UrlText>,
    urls: Option<Vec<UrlText>>,
    cloud_id: Option<String>,
    username: Option<String>,
    password: Option<Secret>,
    password_file: Option<PathBuf>,
    api_key: Option<Secret>,
    api_key_file: Option<PathBuf>,
    bearer_token: Option<Secret>,
    bearer_token_file: Option<PathBuf>,
    ca_cert: Option<PathBuf>,
    tls_verify: Option<String>,
    compression: Option<String>,
    headers: Option<BTreeMap<String, Secret>>,
    aws_sigv4: Option<crate::clients::sigv4::AwsSigV4>,
    pub index: Option<String>,
    topic_to_index: Option<BTreeMap<String, String>>,
    pipeline: Option<String>,
    /// Whether `pipeline` may send a document elsewhere (set `_index` or `_id`, or
    /// `reroute`); `false` declares it does not, which deletes need.
    pipeline_reroutes: Option<bool>,
    routing: Option<String>,
    require_alias: Option<bool>,
    data_stream: Option<DataStream>,
    timestamp_field: Option<String>,
    index_template_file: Option<PathBuf>,
    index_template_name: Option<String>,
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
pub struct EsContext {
    /// The Kafka cluster dead letters go to (the source's), with its librdkafka
    /// properties.
    pub dead_letter_kafka: Option<(String, crate::secret::Properties)>,
    /// How long a checkpoint may wait for the flush.
    pub checkpoint_timeout_ms: u64,
    /// The source's offsets order the records of one partition only (Kafka), so
    /// external versions need the guard of [`super::version_guard`].
    pub offsets_per_partition: bool,
    /// The directory of the job file: relative `ca_cert` and `*_file` paths are
    /// resolved against it.
    pub base_dir: PathBuf,
}

impl EsSection {
    /// Why `pipeline` cannot go with the deletes this sink gets, if it cannot. A
    /// delete runs no ingest pipeline: it names the index and id the document would
    /// have had without one, so a pipeline that sends the document elsewhere (another
    /// index, another id) leaves it there, and the delete's 404 counts as done. Deletes
    /// come from tombstones (`on_null_value = "delete"`, when the source passes
    /// tombstones: `tombstones`) and from the steps before the sink (`deletes`, the
    /// first of them by key). `pipeline_reroutes = false` declares that the pipeline
    /// sends no document elsewhere.
    pub fn pipeline_deletes(
        &self,
        tombstones: bool,
        deletes: Option<&str>,
    ) -> Option<crate::connector::KeyError> {
        use crate::connector::KeyError;
        if self.pipeline.is_none() {
            return self.pipeline_reroutes.is_some().then(|| {
                KeyError::new(
                    "pipeline_reroutes",
                    "says what the ingest pipeline does, and there is no pipeline",
                )
            });
        }
        if self.pipeline_reroutes == Some(false) {
            return None;
        }
        let tombstone_deletes = tombstones && self.on_null_value.as_deref() == Some("delete");
        let from = match (tombstone_deletes, deletes) {
            (true, _) => "tombstones (on_null_value = \"delete\")".to_string(),
            (false, Some(step)) => step.to_string(),
            (false, None) => return None,
        };
        Some(KeyError::new(
            "pipeline",
            format!(
                "deletes from {from} run no ingest pipeline: they delete the index and id the document would have without one, so a pipeline that sends it elsewhere (sets _index or _id, or reroutes) leaves it in place while the delete's 404 counts as done; if the pipeline never does, say so with pipeline_reroutes = false, else remove the pipeline or what makes deletes"
            ),
        ))
    }

    /// Whether the section says what a tombstone means (`on_null_value`): only then do
    /// tombstones reach the sink as records.
    pub fn reads_tombstones(&self) -> bool {
        self.on_null_value.is_some()
    }

    /// The sink's configuration. An error is `(key, message)`, the key relative to the
    /// section.
    pub fn config(&self, ctx: &EsContext) -> Result<EsSinkConfig, (String, String)> {
        use crate::connector::section::at_key as at;
        let index = match (&self.index, &self.data_stream) {
            (Some(i), None) => i.clone(),
            (None, Some(ds)) => ds
                .index()
                .map_err(|(k, m)| (format!("data_stream.{k}"), m))?,
            (None, None) => {
                return Err((
                    "index".into(),
                    "where to write is required: index, or data_stream".into(),
                ))
            }
            (Some(_), Some(_)) => {
                return Err((
                    "index and data_stream".into(),
                    "give one: a data stream's name is its type, dataset and namespace".into(),
                ))
            }
        };
        let mut c = EsSinkConfig::new(String::new(), index);
        c.connection = self.connection(&ctx.base_dir)?;
        c.pipeline = self.pipeline.clone();
        c.routing = self.routing.clone();
        c.require_alias = self.require_alias.unwrap_or(false);
        if self.data_stream.is_some() {
            c.data_stream = self.data_stream.clone();
            c.operation = Operation::Create;
        }
        if let Some(ptr) = &self.timestamp_field {
            if !ptr.starts_with('/') {
                return Err((
                    "timestamp_field".into(),
                    format!("`{ptr}` is not a JSON pointer (such as \"/ts\")"),
                ));
            }
            c.timestamp = TimestampSource::Field(ptr.clone());
        }
        c.index_template = self.index_template(&ctx.base_dir)?;
        c.topic_to_index = self.topic_to_index.clone().unwrap_or_default();
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
            c.on_item_error = OnError::parse(p, Allowed::ITEM).map_err(at("on_item_error"))?;
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
        c.validate()?;
        Ok(c)
    }

    /// The index template of `index_template_file`, read and checked now.
    fn index_template(&self, base: &Path) -> Result<Option<IndexTemplateFile>, (String, String)> {
        let Some(file) = &self.index_template_file else {
            if self.index_template_name.is_some() {
                return Err((
                    "index_template_name".into(),
                    "names the template of index_template_file, which is not set".into(),
                ));
            }
            return Ok(None);
        };
        let key = "index_template_file";
        let path = if file.is_absolute() {
            file.clone()
        } else {
            base.join(file)
        };
        let text = std::fs::read(&path).map_err(|e| {
            (
                key.to_string(),
                format!("cannot read {}: {e}", path.display()),
            )
        })?;
        let body: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
            (
                key.to_string(),
                format!("{} is not JSON: {e}", path.display()),
            )
        })?;
        let patterns = body.get("index_patterns");
        if !body.is_object()
            || !patterns
                .is_some_and(|p| p.is_string() || p.as_array().is_some_and(|a| !a.is_empty()))
        {
            return Err((
                key.into(),
                format!(
                    "{} is not an index template: a JSON object with index_patterns, as PUT _index_template takes",
                    path.display()
                ),
            ));
        }
        let name = match &self.index_template_name {
            Some(n) => n.clone(),
            None => path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default()
                .to_string(),
        };
        let name_key = if self.index_template_name.is_some() {
            "index_template_name"
        } else {
            key
        };
        super::index_name::check_index_name(&name).map_err(|e| {
            (
                name_key.to_string(),
                format!("`{name}` cannot name a template: {e}"),
            )
        })?;
        Ok(Some(IndexTemplateFile { name, body }))
    }

    /// The nodes, credentials, TLS, compression and headers of the section. Reads
    /// `ca_cert` and `*_file` secrets now; every error names its key.
    fn connection(&self, base: &Path) -> Result<EsConnection, (String, String)> {
        use crate::connector::section::at_key as at;
        let resolve = |p: &Path| {
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                base.join(p)
            }
        };
        let (urls, key): (Vec<String>, &str) = match (&self.url, &self.urls, &self.cloud_id) {
            (Some(u), None, None) => (vec![u.0.clone()], "url"),
            (None, Some(u), None) => (u.iter().map(|u| u.0.clone()).collect(), "urls"),
            (None, None, Some(id)) => (vec![cloud_node(id).map_err(at("cloud_id"))?], "cloud_id"),
            (None, None, None) => {
                return Err((
                    "url".into(),
                    "the cluster is required: url, urls or cloud_id".into(),
                ))
            }
            _ => {
                let given: Vec<&str> = [
                    self.url.as_ref().map(|_| "url"),
                    self.urls.as_ref().map(|_| "urls"),
                    self.cloud_id.as_ref().map(|_| "cloud_id"),
                ]
                .into_iter()
                .flatten()
                .collect();
                return Err((
                    given.join(" and "),
                    "give exactly one of url, urls, cloud_id".into(),
                ));
            }
        };
        if urls.is_empty() {
            return Err((key.into(), "at least one node URL is needed".into()));
        }
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let keys = EndpointKeys {
            nodes: &urls,
            key,
            username: self.username.as_deref(),
            password: (&self.password, &self.password_file),
            api_key: Some((&self.api_key, &self.api_key_file)),
            bearer_token: (&self.bearer_token, &self.bearer_token_file),
            ca_cert: self.ca_cert.as_deref(),
            tls_verify: self.tls_verify.as_deref(),
        };
        let Endpoint {
            nodes,
            auth,
            ca_cert,
            tls_verify,
        } = endpoint(keys, resolve, WORDING)?;
        let gzip = match self.compression.as_deref() {
            None | Some("none") => false,
            Some("gzip") => true,
            Some(other) => {
                return Err((
                    "compression".into(),
                    format!("`{other}` is not one of none, gzip"),
                ))
            }
        };
        let mut headers = BTreeMap::new();
        for (name, value) in self.headers.iter().flatten() {
            if name.eq_ignore_ascii_case("authorization") && auth.is_some() {
                return Err((
                    format!("headers.{name}"),
                    "an Authorization header and credentials: keep one".into(),
                ));
            }
            headers.insert(name.clone(), value.clone());
        }
        if let Some(aws) = &self.aws_sigv4 {
            aws.validate()
                .map_err(|(k, m)| (format!("aws_sigv4.{k}"), m))?;
            let other = if auth.is_some() {
                Some("username, api_key or bearer_token")
            } else if headers
                .keys()
                .any(|h| h.eq_ignore_ascii_case("authorization"))
            {
                Some("an Authorization header")
            } else {
                None
            };
            if let Some(other) = other {
                return Err((
                    "aws_sigv4".into(),
                    format!("signs every request with AWS credentials: remove {other}"),
                ));
            }
        }
        let c = EsConnection {
            nodes,
            auth,
            ca_cert,
            tls_verify,
            gzip,
            headers,
            aws_sigv4: self.aws_sigv4.clone(),
        };
        c.validate()
            .map_err(|(k, m)| match k.strip_prefix("urls") {
                Some(i) if key != "urls" => {
                    (format!("{key}{}", if i == "[0]" { "" } else { i }), m)
                }
                _ => (k, m),
            })?;
        Ok(c)
    }

    /// The sink this section describes, and the steps it needs before it: with
    /// external versions from per-partition offsets, the version guard (a `key_by` by
    /// document and a keyed operator), so that one partition writes each document.
    pub fn spec(
        &self,
        ctx: &EsContext,
    ) -> Result<(crate::connector::SinkSpec, std::sync::Arc<EsSinkConfig>), (String, String)> {
        use super::{ConfigActionBuilder, EsSink, FailureHandler, PolicyFailureHandler};
        use crate::connector::{Guarantee, SinkCaps, SinkSpec, Step};
        use std::sync::Arc;
        let c = Arc::new(self.config(ctx)?);
        let handler: Arc<dyn FailureHandler> =
            Arc::new(PolicyFailureHandler(c.on_item_error.clone()));
        let mut caps = SinkCaps {
            // Every action has an id: a replayed write replaces the same document.
            guarantee: Guarantee::Idempotent,
            ..SinkCaps::default()
        };
        let mut before = Vec::new();
        // External versions are offsets: one partition must write each document.
        if c.versioning == Versioning::External
            && c.id != IdStrategy::Coordinates
            && ctx.offsets_per_partition
        {
            use super::version_guard::{guard_key, VersionGuard, UID};
            let id = c.id.clone();
            // The guard of each member sees its own partitions only. With ids by key,
            // co_partitioned (required with members) declares that one partition holds
            // each Kafka key, so each document; a field says nothing about partitions.
            if matches!(c.id, IdStrategy::Field(_)) {
                caps.one_process_only = Some((
                    "sink.elasticsearch.id".into(),
                    "versioning = \"external\" with ids by field cannot be guarded across members (each member's guard sees its own partitions, and a document's records may be in partitions of two members): use id = \"key\" with records keyed by the document's id, or versioning = \"none\"".into(),
                ));
            }
            // Which partition writes a document is one fact for all partitions (and
            // all members): its state is never scoped by partition.
            before.push(Step::KeyBy(Arc::new(move |r| Ok(guard_key(&id, r)))));
            before.push(crate::kits::keyed::step(
                "elasticsearch_version_guard",
                UID,
                true,
                |_| VersionGuard,
            ));
        }
        let config = c.clone();
        let spec = SinkSpec::new(KIND, move |_| {
            Box::new(EsSink::new(
                c.clone(),
                // A job file's records differ in origin or output number (a jq
                // program's outputs of one input).
                Box::new(ConfigActionBuilder::new(&c).origins_unique()),
                handler.clone(),
            ))
        })
        .with_caps(caps)
        .after_steps(before);
        Ok((spec, config))
    }
}

/// Which key of `c` names documents or versions by Kafka coordinates, and what that
/// does when a partition's offsets start again at 0 (a recreated topic), if any.
pub fn restarted_positions_collide(c: &EsSinkConfig) -> Option<(&'static str, &'static str)> {
    if c.id == IdStrategy::Coordinates {
        return Some((
            "id",
            "ids made of topic, partition and offset (id = \"coordinates\", a data stream's) repeat the old topic's documents' ids: a create answers 409, counted as already written, and an index overwrites the old document",
        ));
    }
    if c.versioning == Versioning::External {
        return Some((
            "versioning",
            "versions made of offsets (versioning = \"external\") go back below those of the documents written from the old topic: Elasticsearch refuses the writes as stale (409), counted as already written",
        ));
    }
    None
}

/// The sink kind of the Elasticsearch sink in a job graph.
pub const KIND: &str = "elasticsearch";

impl crate::connector::SinkSection for EsSection {
    fn prepare(
        self,
        cx: &crate::connector::SinkContext<'_>,
    ) -> Result<crate::connector::PreparedSink, crate::connector::KeyError> {
        use crate::connector::KeyError;
        if let Some(why) = self.pipeline_deletes(cx.source.tombstones, cx.deletes.as_deref()) {
            return Err(why);
        }
        // Tombstones pass record transforms unchanged; a keyed one sums values, and a
        // record without a value has none.
        if let Some(kind) = cx.stateful_transforms.first() {
            if self.reads_tombstones() && cx.source.tombstones {
                return Err(KeyError::new(
                    "on_null_value",
                    format!("tombstones cannot pass the {kind} transform, which reads every record's value: remove on_null_value, or the {kind} section"),
                ));
            }
        }
        // Records a step made (a window's results) were not read from a source: they
        // have no coordinates to make ids or versions of.
        if let Some(made) = &cx.records_without_coordinates {
            let id = self.id.as_deref().unwrap_or("coordinates");
            if id == "coordinates" {
                return Err(KeyError::new(
                    "id",
                    format!("{made} have no source coordinates to make ids of: use id = \"field:/<pointer>\", a field that names each document (a window's /window_id: each window one document, rewritten by a replay)"),
                ));
            }
            if self.versioning.as_deref() == Some("external") {
                return Err(KeyError::new(
                    "versioning",
                    format!("versioning = \"external\" uses Kafka offsets, and {made} have none: remove versioning"),
                ));
            }
        }
        // Several records of one input share its offset: as versions, all but the
        // first would be refused as already written.
        if cx.several_outputs && self.versioning.as_deref() == Some("external") {
            return Err(KeyError::new(
                "versioning",
                "versioning = \"external\" uses the Kafka offset, which the records a jq program makes of one input share: remove versioning, or give the program one output (max_outputs = 1)",
            ));
        }
        // Elasticsearch takes JSON objects: a text or bytes record would reach it as
        // is, and no transform of the job file makes JSON of it.
        if cx.source.format != "json" {
            return Err(KeyError::absolute(
                format!("{} and sink.elasticsearch", cx.source.format_key),
                format!(
                    "format = {:?} cannot feed the Elasticsearch sink, which writes JSON objects; use format = \"json\"",
                    cx.source.format
                ),
            ));
        }
        // Dead letters go to the source's Kafka cluster, reached the way the source
        // reaches it.
        let ctx = EsContext {
            dead_letter_kafka: cx
                .source
                .kafka
                .as_ref()
                .map(|k| (k.bootstrap_servers.clone(), k.properties.clone())),
            checkpoint_timeout_ms: cx.section.checkpoint_timeout_ms,
            offsets_per_partition: cx.source.offsets_per_split,
            base_dir: cx.section.base_dir.clone(),
        };
        let (spec, config) = self.spec(&ctx)?;
        if let Some(key) = &cx.source.positions_restart {
            if let Some((ours, why)) = restarted_positions_collide(&config) {
                return Err(KeyError::absolute(
                    format!("{key} and sink.elasticsearch.{ours}"),
                    format!("a recreated topic is read again from offset 0 (on_topic_recreated = \"restart\"), and {why}: the new topic's records would be taken for the old topic's and not written; give documents ids of their own (id = \"key\" or \"field:/p\", without versioning = \"external\"), or set on_topic_recreated = \"fail\""),
                ));
            }
        }
        Ok(crate::connector::PreparedSink {
            spec,
            config,
            reads_tombstones: self.reads_tombstones() && cx.source.tombstones,
        })
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
    use crate::clients::http::{Auth, CaCert, TlsVerify};

    /// When a request may carry several writes of one document: never where a 409 on a
    /// replay counts as already written and a newer write in the same request could
    /// hide a refusal (external versions), whatever the policy, coalescing or
    /// pipeline; always otherwise.
    #[test]
    fn one_write_per_document_table() {
        use OnError::{DeadLetter, Fail};
        use Operation::*;
        let dlq = || DeadLetter("dlq".into());
        let cases: &[(Versioning, Operation, OnError, bool, bool, bool)] = &[
            // versioning, operation, on_item_error, coalesce, pipeline, one per request
            (Versioning::External, Index, dlq(), false, false, true),
            (Versioning::External, Index, dlq(), true, false, true),
            (Versioning::External, Index, Fail, false, false, true),
            (Versioning::External, Index, Fail, true, false, true),
            (Versioning::External, Index, dlq(), true, true, true),
            (Versioning::External, Create, dlq(), false, false, true),
            (Versioning::External, Create, Fail, true, false, true),
            (Versioning::None, Index, dlq(), false, false, false),
            (Versioning::None, Index, Fail, true, false, false),
            (Versioning::None, Create, dlq(), false, false, false),
            (Versioning::None, Create, Fail, true, true, false),
            (Versioning::None, Upsert, dlq(), false, false, false),
            (Versioning::None, Upsert, Fail, true, false, false),
        ];
        for (versioning, operation, policy, coalesce, pipeline, want) in cases {
            let mut c = EsSinkConfig::new("http://localhost:9200", "i");
            c.versioning = *versioning;
            c.operation = *operation;
            c.on_item_error = policy.clone();
            c.coalesce = *coalesce;
            c.pipeline = pipeline.then(|| "p".to_string());
            assert_eq!(
                c.one_write_per_document(),
                *want,
                "{versioning:?} {operation:?} {policy:?} coalesce={coalesce} pipeline={pipeline}"
            );
        }
    }

    #[test]
    fn aws_sigv4_is_checked_and_takes_no_other_credentials() {
        let ctx = EsContext::default();
        let load = |extra: &str| {
            let text = format!(
                "url = \"https://search-x.eu-west-1.es.amazonaws.com\"\nindex = \"i\"\n{extra}"
            );
            toml::from_str::<EsSection>(&text).unwrap().config(&ctx)
        };
        let c = load("aws_sigv4 = { region = \"eu-west-1\" }").unwrap();
        let aws = c.connection.aws_sigv4.clone().unwrap();
        assert_eq!(
            (aws.region.as_str(), aws.service.as_str()),
            ("eu-west-1", "es")
        );
        assert!(c.connection.signing().unwrap().is_some());
        for (extra, key) in [
            (
                "aws_sigv4 = { region = \"eu-west-1\", service = \"s3\" }",
                "aws_sigv4.service",
            ),
            ("aws_sigv4 = { region = \"EU west\" }", "aws_sigv4.region"),
            (
                "aws_sigv4 = { region = \"eu-west-1\" }\napi_key = \"k\"",
                "aws_sigv4",
            ),
            (
                "aws_sigv4 = { region = \"eu-west-1\" }\nheaders = { Authorization = \"x\" }",
                "aws_sigv4",
            ),
        ] {
            assert_eq!(load(extra).unwrap_err().0, key, "{extra}");
        }
        assert!(
            toml::from_str::<EsSection>("index = \"i\"\naws_sigv4 = { regio = \"x\" }").is_err()
        );
    }

    #[test]
    fn upsert_with_external_versioning_is_refused() {
        let mut c = EsSinkConfig::new("http://x", "i");
        c.operation = Operation::Upsert;
        c.versioning = Versioning::External;
        let (key, msg) = c.validate().unwrap_err();
        assert_eq!(key, "operation and versioning");
        assert!(msg.contains("operation") && msg.contains("versioning"));
    }

    #[test]
    fn parses_ids_and_policies() {
        assert_eq!(
            IdStrategy::parse("field:/user/id"),
            Ok(IdStrategy::Field("/user/id".into()))
        );
        assert!(IdStrategy::parse("field:user").is_err());
    }

    #[test]
    fn the_job_file_defaults_are_the_rust_api_defaults() {
        let section: EsSection =
            toml::from_str("url = \"http://es:9200\"\nindex = \"orders\"").unwrap();
        let ctx = EsContext {
            checkpoint_timeout_ms: 60_000,
            ..EsContext::default()
        };
        assert_eq!(
            section.config(&ctx).unwrap(),
            EsSinkConfig::new("http://es:9200", "orders")
        );
    }

    #[test]
    fn a_pipeline_goes_with_deletes_only_when_declared_not_to_reroute() {
        let section = |extra: &str| -> EsSection {
            toml::from_str(&format!(
                "url = \"http://es:9200\"\nindex = \"i\"\nid = \"key\"\n{extra}"
            ))
            .unwrap()
        };
        let session = Some("transform.0 (window, session)");
        // (keys, the source passes tombstones, a step's deletes) -> the refused key
        let table: [(&str, bool, Option<&str>, Option<&str>); 10] = [
            (
                "pipeline = \"p\"\non_null_value = \"delete\"",
                true,
                None,
                Some("pipeline"),
            ),
            (
                "pipeline = \"p\"\non_null_value = \"delete\"",
                false,
                None,
                None,
            ),
            (
                "pipeline = \"p\"\non_null_value = \"skip\"",
                true,
                None,
                None,
            ),
            ("pipeline = \"p\"", true, session, Some("pipeline")),
            (
                "pipeline = \"p\"\npipeline_reroutes = true",
                true,
                session,
                Some("pipeline"),
            ),
            (
                "pipeline = \"p\"\npipeline_reroutes = false\non_null_value = \"delete\"",
                true,
                session,
                None,
            ),
            ("pipeline = \"p\"", true, None, None),
            ("on_null_value = \"delete\"", true, session, None),
            (
                "pipeline_reroutes = false",
                true,
                None,
                Some("pipeline_reroutes"),
            ),
            (
                "pipeline_reroutes = false\non_null_value = \"delete\"",
                true,
                None,
                Some("pipeline_reroutes"),
            ),
        ];
        for (keys, tombstones, deletes, refused) in table {
            let got = section(keys).pipeline_deletes(tombstones, deletes);
            assert_eq!(
                got.as_ref().map(|e| e.key.as_str()),
                refused,
                "{keys} {tombstones} {deletes:?}"
            );
            if let Some(e) = got.filter(|e| e.key == "pipeline") {
                assert!(
                    e.message.contains("pipeline_reroutes = false"),
                    "{}",
                    e.message
                );
            }
        }
    }

    /// A self-signed CA certificate (PEM) for the `ca_cert` tests.
    const CA_PEM: &str = include_str!("testdata/ca.pem");

    fn ctx_in(dir: &std::path::Path) -> EsContext {
        EsContext {
            dead_letter_kafka: None,
            checkpoint_timeout_ms: 60_000,
            base_dir: dir.to_path_buf(),
            offsets_per_partition: false,
        }
    }

    #[test]
    fn every_key_of_the_section_is_applied_and_errors_name_the_key() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), CA_PEM).unwrap();
        std::fs::write(dir.path().join("pw"), "s3cret\n").unwrap();
        let text = r#"
urls = ["https://es-1:9200", "https://es-2:9201/"]
username = "writer"
password_file = "pw"
ca_cert = "ca.pem"
tls_verify = "certificate"
compression = "gzip"
headers = { "x-tenant" = "blue" }
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
        let ctx = EsContext {
            dead_letter_kafka: Some(("k:9092".into(), Default::default())),
            checkpoint_timeout_ms: 5,
            offsets_per_partition: true,
            base_dir: dir.path().to_path_buf(),
        };
        let c = section.config(&ctx).unwrap();
        let mut want = EsSinkConfig::new("", "i");
        want.connection = EsConnection {
            nodes: vec!["https://es-1:9200".into(), "https://es-2:9201".into()],
            auth: Some(Auth::Basic {
                username: "writer".into(),
                password: Secret::new("s3cret"),
            }),
            ca_cert: Some(CaCert {
                path: dir.path().join("ca.pem"),
                pem: CA_PEM.as_bytes().to_vec(),
            }),
            tls_verify: TlsVerify::Certificate,
            aws_sigv4: None,
            gzip: true,
            headers: [("x-tenant".to_string(), Secret::new("blue"))].into(),
        };
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
        want.on_item_error = OnError::DeadLetter("dlq".into());
        want.flush_on_checkpoint = false;
        want.coalesce = false;
        want.request_timeout_ms = 14;
        want.buffer_max_bytes = 15;
        want.flush_timeout_ms = 5;
        want.dead_letter_bootstrap_servers = Some("k:9092".into());
        assert_eq!(c, want);
        let bad: EsSection =
            toml::from_str("url = \"http://u\"\nindex = \"i\"\noperation = \"merge\"").unwrap();
        assert_eq!(
            bad.config(&EsContext::default()).unwrap_err().0,
            "operation"
        );
        let zero: EsSection =
            toml::from_str("url = \"http://u\"\nindex = \"i\"\nbuffer_max_bytes = 0").unwrap();
        assert_eq!(
            zero.config(&EsContext::default()).unwrap_err().0,
            "buffer_max_bytes"
        );
    }

    #[test]
    fn the_other_ways_to_authenticate() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("key"), "id:k3y\n").unwrap();
        std::fs::write(dir.path().join("token"), "t0k\r\n").unwrap();
        let cases: &[(&str, Option<Auth>)] = &[
            (
                "api_key = \"id:k3y\"",
                Some(Auth::ApiKey(Secret::new("id:k3y"))),
            ),
            (
                "api_key_file = \"key\"",
                Some(Auth::ApiKey(Secret::new("id:k3y"))),
            ),
            (
                "bearer_token = \"t0k\"",
                Some(Auth::Bearer(Secret::new("t0k"))),
            ),
            (
                "bearer_token_file = \"token\"",
                Some(Auth::Bearer(Secret::new("t0k"))),
            ),
            ("", None),
        ];
        for (extra, want) in cases {
            let text = format!("url = \"https://es:9200\"\nindex = \"i\"\n{extra}");
            let section: EsSection = toml::from_str(&text).unwrap();
            let c = section.config(&ctx_in(dir.path())).unwrap();
            assert_eq!(&c.connection.auth, want, "{extra}");
        }
        // User info in the URL is basic auth, and is never kept in the node's URL.
        let section: EsSection =
            toml::from_str("url = \"https://u:p%40w@es:9200\"\nindex = \"i\"").unwrap();
        let c = section.config(&ctx_in(dir.path())).unwrap();
        assert_eq!(c.connection.nodes, vec!["https://es:9200".to_string()]);
        assert_eq!(
            c.connection.auth,
            Some(Auth::Basic {
                username: "u".into(),
                password: Secret::new("p@w")
            })
        );
        assert!(!format!("{c:?}").contains("p@w"));
        // The section's own Debug shows no secret either.
        let section: EsSection = toml::from_str(
            "urls = [\"https://u:pw1@es:9200\"]\nindex = \"i\"\napi_key = \"k3y\"\nheaders = { x = \"h3ader\" }",
        )
        .unwrap();
        let d = format!("{section:?}");
        assert!(d.contains("https://u:***@es:9200"), "{d}");
        assert!(
            !d.contains("pw1") && !d.contains("k3y") && !d.contains("h3ader"),
            "{d}"
        );
        // A cloud id names its node.
        let id = format!(
            "name:{}",
            base64::Engine::encode(
                &base64::engine::general_purpose::STANDARD,
                "cloud.example.com$abc$def"
            )
        );
        let section: EsSection =
            toml::from_str(&format!("cloud_id = \"{id}\"\nindex = \"i\"")).unwrap();
        let c = section.config(&ctx_in(dir.path())).unwrap();
        assert_eq!(
            c.connection.nodes,
            vec!["https://abc.cloud.example.com".to_string()]
        );
    }

    #[test]
    fn credential_and_tls_errors_keep_their_texts() {
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join("absent");
        let unreadable = format!(
            "cannot read {}: No such file or directory (os error 2)",
            absent.display()
        );
        let one_way = "give one way to authenticate: username + password, api_key or bearer_token";
        let cases: &[(&str, &str, &str)] = &[
            (
                "url = \"https://u:p@es\"\nusername = \"x\"",
                "password",
                "username needs a password (or password_file)",
            ),
            (
                "url = \"https://u:p@es\"\nusername = \"x\"\npassword = \"y\"",
                "url",
                "credentials in a URL and in the section's keys: keep one",
            ),
            (
                "urls = [\"https://u:p@es-1\", \"https://u:q@es-2\"]",
                "urls[1]",
                "the nodes' URLs carry different credentials",
            ),
            (
                "url = \"https://es\"\napi_key = \"k\"\nbearer_token = \"t\"",
                "username, api_key and bearer_token",
                one_way,
            ),
            (
                "url = \"https://es\"\nusername = \"u\"\npassword = \"p\"\nbearer_token = \"t\"",
                "username, api_key and bearer_token",
                one_way,
            ),
            (
                "url = \"https://es\"\ntls_verify = \"certificate\"",
                "tls_verify",
                "tls_verify = \"certificate\" checks the chain up to ca_cert: set ca_cert",
            ),
            // The section's own keys are checked before the chain is.
            (
                "url = \"https://es\"\ntls_verify = \"certificate\"\ncompression = \"zstd\"",
                "compression",
                "`zstd` is not one of none, gzip",
            ),
            (
                "url = \"https://es\"\nusername = \"u\"\npassword_file = \"absent\"",
                "password_file",
                unreadable.as_str(),
            ),
        ];
        for (extra, key, message) in cases {
            let section: EsSection = toml::from_str(&format!("index = \"i\"\n{extra}")).unwrap();
            let got = section.config(&ctx_in(dir.path())).unwrap_err();
            assert_eq!(got, (key.to_string(), message.to_string()), "{extra}");
        }
    }

    #[test]
    fn connection_errors_name_their_key() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pw"), "pw\n").unwrap();
        std::fs::write(dir.path().join("not-a-cert.pem"), "hello").unwrap();
        let cases: &[(&str, &str)] = &[
            ("urls = [\"https://es-1:9200\", \"es-2:9200\"]", "urls[1]"),
            ("urls = []", "urls"),
            ("url = \"ftp://es\"", "url"),
            (
                "url = \"https://es\"\nurls = [\"https://es\"]",
                "url and urls",
            ),
            ("index = \"x\"", "url"),
            ("cloud_id = \"nonsense\"", "cloud_id"),
            ("url = \"https://es\"\nusername = \"u\"", "password"),
            ("url = \"https://es\"\npassword = \"p\"", "username"),
            (
                "url = \"https://es\"\nusername = \"u\"\npassword = \"p\"\npassword_file = \"pw\"",
                "password and password_file",
            ),
            (
                "url = \"https://es\"\napi_key_file = \"absent\"",
                "api_key_file",
            ),
            (
                "url = \"https://es\"\nbearer_token = \"t\"\nbearer_token_file = \"pw\"",
                "bearer_token and bearer_token_file",
            ),
            (
                "url = \"https://es\"\napi_key = \"k\"\nbearer_token = \"t\"",
                "username, api_key and bearer_token",
            ),
            ("url = \"https://u:p@es\"\napi_key = \"k\"", "url"),
            ("url = \"https://es\"\nca_cert = \"absent.pem\"", "ca_cert"),
            (
                "url = \"https://es\"\nca_cert = \"not-a-cert.pem\"",
                "ca_cert",
            ),
            ("url = \"https://es\"\ntls_verify = \"some\"", "tls_verify"),
            (
                "url = \"https://es\"\ntls_verify = \"certificate\"",
                "tls_verify",
            ),
            (
                "url = \"https://es\"\ncompression = \"zstd\"",
                "compression",
            ),
            (
                "url = \"https://es\"\nheaders = { \"bad name\" = \"v\" }",
                "headers",
            ),
            (
                "url = \"https://es\"\napi_key = \"k\"\nheaders = { \"Authorization\" = \"v\" }",
                "headers.Authorization",
            ),
        ];
        for (extra, key) in cases {
            let text = if extra.starts_with("index") {
                extra.to_string()
            } else {
                format!("index = \"i\"\n{extra}")
            };
            let section: EsSection = toml::from_str(&text).unwrap();
            let (k, m) = section.config(&ctx_in(dir.path())).unwrap_err();
            assert_eq!(&k, key, "{extra}: {m}");
        }
        // A password never appears in an error, even in a URL that does not parse.
        let section: EsSection =
            toml::from_str("index = \"i\"\nurls = [\"https://u:hunter2@es:99999\"]").unwrap();
        let (k, m) = section.config(&ctx_in(dir.path())).unwrap_err();
        assert_eq!(k, "urls[0]");
        assert!(!m.contains("hunter2"), "{m}");
    }
}
