//! What the user configures for the Kafka source (`[source.kafka]`): the job-file
//! section, its defaults (one place: [`KafkaSourceConfig::new`]), its validation.

pub use super::topic_ids::RecreatedPolicy;
use crate::dead_letter::{Allowed, OnError};
use crate::formats::avro::Temporal;
use crate::formats::plain::Plain;
use crate::formats::registry_section::RegistrySection;
use crate::formats::{FormatOptions, FormatRef, Output};
use crate::secret::Properties;
use regex::Regex;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// A topic pattern that matches whole topic names only, as Java's `Pattern.matches`
/// does for Flink's `topic-pattern`: every alternative of an alternation must match the
/// whole name (`a|b` does not match `xa`, `orders` does not match `orders-dlq`, and
/// `orders|orders-eu` matches `orders-eu`).
#[derive(Debug, Clone)]
pub struct TopicPattern {
    /// What the user wrote (for messages and equality).
    source: String,
    /// `source` anchored at both ends of the text.
    whole: Regex,
}

impl TopicPattern {
    /// Compiles `pattern`, anchored so that it must match a whole topic name.
    pub fn new(pattern: &str) -> Result<TopicPattern, regex::Error> {
        // Compiled alone first: wrapping an unbalanced pattern such as `a)|(b` could
        // yield another valid regex with a different meaning.
        Regex::new(pattern)?;
        // `\A` and `\z` anchor at the ends of the text whatever flags the pattern sets.
        let whole = Regex::new(&format!(r"\A(?:{pattern})\z"))?;
        Ok(TopicPattern {
            source: pattern.to_string(),
            whole,
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether the pattern matches all of `topic`. The one place that decides it: the
    /// source, discovery and the chaos harness's verifier all call this.
    pub fn matches(&self, topic: &str) -> bool {
        self.whole.is_match(topic)
    }
}

/// Which topics the source reads.
#[derive(Debug, Clone)]
pub enum TopicSelector {
    /// These topics (a topic added later to the list is discovered on restart).
    List(Vec<String>),
    /// Every topic whose whole name matches; topics created later are discovered.
    Pattern(TopicPattern),
}

impl TopicSelector {
    /// Whether `topic` is selected: listed exactly, or wholly matched by the pattern.
    pub fn matches(&self, topic: &str) -> bool {
        match self {
            TopicSelector::List(l) => l.iter().any(|t| t == topic),
            TopicSelector::Pattern(p) => p.matches(topic),
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

/// The Kafka source's configuration. Its `Debug` hides the values of secret properties
/// (`sasl.password`, `ssl.key.password`, ...).
#[derive(Clone, PartialEq, Debug)]
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
    /// How record values are decoded (`format`): `json` by default.
    pub format: FormatRef,
    /// How record keys are decoded (`key_format`); `None`: keys are passed on as they
    /// are.
    pub key_format: Option<FormatRef>,
    /// What a record that cannot be decoded becomes (`on_decode_error`).
    pub on_decode_error: OnError,
    /// How long the first contact with the cluster may take before the job fails.
    pub connect_timeout_ms: u64,
    /// librdkafka properties of every Kafka client of the job (the consumer, dead-letter
    /// producers), each given to the clients it applies to
    /// ([`crate::clients::kafka::applies_to`]); on the consumer they override lockgate's
    /// defaults.
    pub properties: Properties,
    /// Records without a value (tombstones) are emitted as [`Record::tombstone`]
    /// records instead of following `on_decode_error`: set when the sink says what a
    /// tombstone means (the Elasticsearch sink's `on_null_value`).
    ///
    /// [`Record::tombstone`]: crate::record::Record::tombstone
    pub tombstones: bool,
    /// Each record carries its headers ([`Record::headers`]): set when a step of the
    /// job reads them (they cost a copy per record).
    ///
    /// [`Record::headers`]: crate::record::Record::headers
    pub headers: bool,
    /// The topics were written by a lockgate Kafka sink (a repartition stage): each
    /// record's origin headers are read, and a record the job has already applied (a
    /// replay of the upstream stage) is dropped. See [`super::upstream`].
    pub origin_headers: bool,
    /// What a topic whose id differs from the one its restored positions were recorded
    /// with means: fail the job (default), or start that topic over at EARLIEST. See
    /// [`super::topic_ids`].
    pub on_topic_recreated: RecreatedPolicy,
    /// `[source.kafka.watermark]`: each record's event time (its
    /// [`Record::timestamp`](crate::record::Record::timestamp) from then on) and the
    /// watermarks; `None`: the Kafka timestamp is passed on, and no watermarks.
    pub event_time: Option<crate::event_time::EventTime>,
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
            format: FormatRef::new(Plain(Output::Json)),
            key_format: None,
            on_decode_error: OnError::Fail,
            connect_timeout_ms: 30_000,
            properties: Properties::default(),
            tombstones: false,
            headers: false,
            origin_headers: false,
            on_topic_recreated: RecreatedPolicy::Fail,
            event_time: None,
        }
    }
}

impl PartialEq for TopicSelector {
    fn eq(&self, other: &TopicSelector) -> bool {
        match (self, other) {
            (TopicSelector::List(a), TopicSelector::List(b)) => a == b,
            (TopicSelector::Pattern(a), TopicSelector::Pattern(b)) => a.as_str() == b.as_str(),
            _ => false,
        }
    }
}

/// `[source.kafka]` as written in a job file. A key that is absent takes
/// [`KafkaSourceConfig::new`]'s default, so the job file and the Rust API cannot
/// disagree. Its `Debug` hides the values of secret properties.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSection {
    pub bootstrap_servers: String,
    topics: Option<Vec<String>>,
    topic_pattern: Option<String>,
    group_id: Option<String>,
    startup: Option<String>,
    partition_discovery_ms: Option<u64>,
    bounded: Option<String>,
    format: Option<String>,
    key_format: Option<String>,
    schema_file: Option<PathBuf>,
    reader_schema_file: Option<PathBuf>,
    message: Option<String>,
    key_schema_file: Option<PathBuf>,
    key_reader_schema_file: Option<PathBuf>,
    key_message: Option<String>,
    temporal: Option<String>,
    #[serde(default)]
    connect_envelope: bool,
    #[serde(default)]
    key_connect_envelope: bool,
    schema_registry: Option<RegistrySection>,
    on_decode_error: Option<String>,
    connect_timeout_ms: Option<u64>,
    origin_headers: Option<bool>,
    on_topic_recreated: Option<String>,
    watermark: Option<crate::event_time::WatermarkSection>,
    /// librdkafka properties of every Kafka client of the job, checked at load; which
    /// client gets which is decided by [`crate::clients::kafka::applies_to`].
    #[serde(default)]
    pub properties: Properties,
}

impl KafkaSection {
    /// Why this section does not read exactly one named topic (`Some((key, what))`), or
    /// `None` when it does: a `co_partitioned` job needs that, since its keyed state is
    /// kept per partition, and partition 0 of two topics holds different keys.
    pub fn not_one_topic(&self) -> Option<(&'static str, String)> {
        match (&self.topics, &self.topic_pattern) {
            (Some(t), None) if t.len() == 1 => None,
            (Some(t), _) => Some(("topics", format!("names {} topics", t.len()))),
            (None, Some(p)) => Some(("topic_pattern", format!("`{p}` can match several topics"))),
            (None, None) => Some(("topics", "names no topic".into())),
        }
    }

    /// The cluster as this section reaches it.
    pub fn cluster(&self) -> crate::connector::KafkaCluster {
        crate::connector::KafkaCluster {
            bootstrap_servers: self.bootstrap_servers.clone(),
            properties: self.properties.clone(),
        }
    }

    /// The source's configuration (`group_id` defaults to `lockgate-<job name>`; paths
    /// relative to the job file's directory; formats from the registry's list). An
    /// error is `(key, message)`, the key relative to the section.
    pub fn config(
        &self,
        cx: &crate::connector::SectionContext,
    ) -> Result<KafkaSourceConfig, (String, String)> {
        let job_name = cx.job_name.as_str();
        use crate::connector::section::at_key as at;
        let topics = match (&self.topics, &self.topic_pattern) {
            (Some(t), None) if !t.is_empty() => TopicSelector::List(t.clone()),
            (None, Some(p)) => TopicSelector::Pattern(
                TopicPattern::new(p)
                    .map_err(|e| at("topic_pattern")(format!("not a regex: {e}")))?,
            ),
            _ => {
                return Err(at("topics")(
                    "give exactly one of topics (non-empty) or topic_pattern".into(),
                ))
            }
        };
        let group = self
            .group_id
            .clone()
            .unwrap_or_else(|| format!("lockgate-{job_name}"));
        let mut c = KafkaSourceConfig::new(self.bootstrap_servers.clone(), topics, group);
        if let Some(s) = &self.startup {
            c.startup = Startup::parse(s).map_err(at("startup"))?;
        }
        c.partition_discovery_ms = self
            .partition_discovery_ms
            .unwrap_or(c.partition_discovery_ms);
        c.bounded = match self.bounded.as_deref() {
            None => false,
            Some("latest") => true,
            Some(other) => {
                return Err(at("bounded")(format!(
                    "`{other}` is not supported (latest)"
                )))
            }
        };
        self.formats(cx, &mut c)?;
        if let Some(p) = &self.on_decode_error {
            c.on_decode_error =
                OnError::parse(p, Allowed::DECODE).map_err(at("on_decode_error"))?;
        }
        c.connect_timeout_ms = self.connect_timeout_ms.unwrap_or(c.connect_timeout_ms);
        c.origin_headers = self.origin_headers.unwrap_or(c.origin_headers);
        if let Some(p) = &self.on_topic_recreated {
            c.on_topic_recreated = RecreatedPolicy::parse(p).map_err(at("on_topic_recreated"))?;
        }
        if let Some(w) = &self.watermark {
            c.event_time = Some(w.config().map_err(|(k, m)| (format!("watermark.{k}"), m))?);
        }
        if c.connect_timeout_ms == 0 {
            return Err(at("connect_timeout_ms")("must be positive".into()));
        }
        crate::clients::kafka::check(&self.properties)
            .map_err(|(k, m)| (format!("properties.{k:?}"), m))?;
        c.properties = self.properties.clone();
        Ok(c)
    }
}

impl KafkaSection {
    /// Builds `format` and `key_format` with their keys, through the Schema Registry
    /// of `schema_registry` if there is one.
    fn formats(
        &self,
        cx: &crate::connector::SectionContext,
        c: &mut KafkaSourceConfig,
    ) -> Result<(), (String, String)> {
        use crate::connector::section::at_key as at;
        let temporal = match self.temporal.as_deref() {
            None | Some("epoch-millis") => Temporal::EpochMillis,
            Some("iso8601") => Temporal::Iso8601,
            Some(other) => {
                return Err(at("temporal")(format!(
                    "`{other}` is not one of epoch-millis, iso8601"
                )))
            }
        };
        let registry = match &self.schema_registry {
            Some(r) => {
                let prefixed = |(k, m): (String, String)| match k.as_str() {
                    "" => ("schema_registry".to_string(), m),
                    _ => (format!("schema_registry.{k}"), m),
                };
                let checkpoint_timeout = std::time::Duration::from_millis(cx.checkpoint_timeout_ms);
                let settings = r
                    .settings(|p| cx.resolve(p), checkpoint_timeout)
                    .map_err(prefixed)?;
                let client = settings.client().map_err(prefixed)?;
                Some(Arc::new(client))
            }
            None => None,
        };
        let value = FormatOptions {
            prefix: "",
            registry: registry.clone(),
            schema_file: self.schema_file.as_deref().map(|p| cx.resolve(p)),
            reader_schema_file: self.reader_schema_file.as_deref().map(|p| cx.resolve(p)),
            message: self.message.clone(),
            temporal,
            connect_envelope: self.connect_envelope,
        };
        c.format = cx
            .formats
            .build("format", self.format.as_deref().unwrap_or("json"), &value)?;
        let key = FormatOptions {
            prefix: "key_",
            registry,
            schema_file: self.key_schema_file.as_deref().map(|p| cx.resolve(p)),
            reader_schema_file: self
                .key_reader_schema_file
                .as_deref()
                .map(|p| cx.resolve(p)),
            message: self.key_message.clone(),
            temporal,
            connect_envelope: self.key_connect_envelope,
        };
        c.key_format = match &self.key_format {
            Some(name) => Some(cx.formats.build("key_format", name, &key)?),
            None => {
                for (given, k) in [
                    (key.schema_file.is_some(), "key_schema_file"),
                    (key.reader_schema_file.is_some(), "key_reader_schema_file"),
                    (key.message.is_some(), "key_message"),
                    (key.connect_envelope, "key_connect_envelope"),
                ] {
                    if given {
                        return Err(at(k)("applies to key_format, which is not given".into()));
                    }
                }
                None
            }
        };
        if registry_unused(&self.schema_registry, &c.format, &c.key_format) {
            return Err(at("schema_registry")(format!(
                "neither format ({}) nor key_format reads framed values from a Schema Registry",
                c.format.name()
            )));
        }
        Ok(())
    }
}

/// A `schema_registry` that no format asks: a mistake the user should hear of.
fn registry_unused(
    section: &Option<RegistrySection>,
    format: &FormatRef,
    key_format: &Option<FormatRef>,
) -> bool {
    section.is_some()
        && format.registry().is_none()
        && key_format.as_ref().is_none_or(|k| k.registry().is_none())
}

impl KafkaSection {
    /// The one Avro schema of every value, when `format = "avro"` names one: the
    /// reader schema, or else the schema of unframed values (a registry's values
    /// have a schema per record).
    fn value_schema(
        &self,
        cx: &crate::connector::SectionContext,
    ) -> Option<crate::connector::section::SourceSchema> {
        if self.format.as_deref() != Some("avro") {
            return None;
        }
        let (path, key) = match (&self.reader_schema_file, &self.schema_file) {
            (Some(p), _) => (cx.resolve(p), "source.kafka.reader_schema_file"),
            (None, Some(p)) => (cx.resolve(p), "source.kafka.schema_file"),
            (None, None) => return None,
        };
        Some(crate::connector::section::SourceSchema {
            path,
            key: key.into(),
            // The formats' default: epoch milliseconds (see `formats`).
            times_in_millis: !matches!(self.temporal.as_deref(), Some("iso8601")),
        })
    }
}

/// What a job keyed per partition (`job.co_partitioned`) needs instead of a source
/// whose partitions do not hold every record of a key.
pub use crate::connector::section::CO_PARTITIONED_FIX;

impl crate::connector::SourceSection for KafkaSection {
    fn prepare(
        self,
        cx: &crate::connector::SectionContext,
    ) -> Result<crate::connector::PreparedSource, crate::connector::KeyError> {
        let cfg = self.config(cx)?;
        let facts = crate::connector::SourceFacts {
            format: cfg.format.output().name().to_string(),
            format_key: "source.kafka.format".into(),
            offsets_per_split: true,
            kafka: Some(self.cluster()),
            tombstones: true,
            event_time: cfg.event_time.is_some(),
            not_split_keyed: self.not_one_topic().map(|(key, what)| {
                format!("source.kafka.{key} {what}, and keyed state kept per partition would give a key of two topics two states: {CO_PARTITIONED_FIX}")
            }),
            positions_restart: (cfg.on_topic_recreated == RecreatedPolicy::Restart)
                .then(|| "source.kafka.on_topic_recreated".to_string()),
            without_coordinates: None,
            value_schema: self.value_schema(cx),
        };
        Ok(crate::connector::PreparedSource {
            facts,
            config: std::sync::Arc::new(cfg.clone()),
            build: Box::new(move |wiring| {
                let mut cfg = cfg;
                cfg.tombstones = wiring.tombstones;
                cfg.headers = wiring.headers;
                super::KafkaSource::spec(std::sync::Arc::new(cfg))
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cx(job: &str) -> crate::connector::SectionContext {
        crate::connector::SectionContext {
            job_name: job.into(),
            base_dir: ".".into(),
            parallelism: 1,
            max_parallelism: 16,
            checkpoint_timeout_ms: 60_000,
            formats: crate::formats::Formats::builtin(),
            source_kafka: None,
            event_time: false,
        }
    }

    #[test]
    fn debug_hides_secret_properties() {
        let section: KafkaSection = toml::from_str(
            "bootstrap_servers = \"k\"\ntopics = [\"a\"]\n[properties]\n\"sasl.password\" = \"kafka-pw\"\n\"sasl.username\" = \"writer\"",
        )
        .unwrap();
        let config = section.config(&cx("j")).unwrap();
        for shown in [format!("{section:?}"), format!("{config:?}")] {
            assert!(
                shown.contains("writer") && !shown.contains("kafka-pw"),
                "{shown}"
            );
        }
    }

    #[test]
    fn parses_startup_and_policies() {
        assert_eq!(
            Startup::parse("timestamp:1700000000000"),
            Ok(Startup::Timestamp(1_700_000_000_000))
        );
        assert!(Startup::parse("timestamp:x").is_err());
        assert!(Startup::parse("newest").is_err());
    }

    #[test]
    fn pattern_matches_whole_names_only() {
        // (pattern, topic, selected): Java's `Pattern.matches`.
        let table = [
            ("orders-.*", "orders-eu", true),
            ("orders-.*", "old-orders-eu", false),
            ("orders", "orders", true),
            ("orders", "orders-dlq", false),
            ("orders", "xorders", false),
            ("a|b", "a", true),
            ("a|b", "b", true),
            ("a|b", "xa", false),
            ("a|b", "ax", false),
            ("a|b", "ab", false),
            // The leftmost-first match of `orders` is not the whole name; the second
            // alternative is.
            ("orders|orders-eu", "orders-eu", true),
            ("a|ab", "ab", true),
            ("orders-(eu|us)", "orders-eu", true),
            ("orders-(eu|us)", "orders-eu-dlq", false),
            ("(?m)orders$", "orders\nx", false),
            ("(?i)Orders", "ORDERS", true),
            (".*", "", true),
            ("", "x", false),
        ];
        for (pattern, topic, want) in table {
            let s = TopicSelector::Pattern(TopicPattern::new(pattern).unwrap());
            assert_eq!(s.matches(topic), want, "{pattern:?} on {topic:?}");
        }
        // A pattern that only a wrapping would balance is refused.
        assert!(TopicPattern::new("a)|(b").is_err());
    }

    #[test]
    fn a_schema_registry_section_builds_the_formats_that_read_framed_values() {
        let section: KafkaSection = toml::from_str(
            "bootstrap_servers = \"k\"\ntopics = [\"a\"]\nformat = \"avro\"\nkey_format = \"protobuf\"\ntemporal = \"iso8601\"\n[schema_registry]\nurls = [\"http://reader:s3cret@r1:8081\", \"http://r2:8081\"]",
        )
        .unwrap();
        let c = section.config(&cx("job")).unwrap();
        assert_eq!(c.format.name(), "avro");
        assert_eq!(c.key_format.as_ref().map(|k| k.name()), Some("protobuf"));
        assert!(
            c.format.registry().is_some() && c.key_format.as_ref().unwrap().registry().is_some()
        );
        for shown in [format!("{section:?}"), format!("{c:?}")] {
            assert!(!shown.contains("s3cret"), "{shown}");
        }
    }

    #[test]
    fn the_job_file_defaults_are_the_rust_api_defaults() {
        let section: KafkaSection =
            toml::from_str("bootstrap_servers = \"k:9092\"\ntopics = [\"orders\"]").unwrap();
        assert_eq!(
            section.config(&cx("job")).unwrap(),
            KafkaSourceConfig::new(
                "k:9092",
                TopicSelector::List(vec!["orders".into()]),
                "lockgate-job"
            )
        );
    }

    #[test]
    fn every_key_of_the_section_is_applied_and_errors_name_the_key() {
        let text = r#"
bootstrap_servers = "k:9092"
topic_pattern = "orders-.*"
group_id = "g"
startup = "latest"
partition_discovery_ms = 7
bounded = "latest"
format = "text"
on_decode_error = "skip"
connect_timeout_ms = 9
on_topic_recreated = "restart"
[properties]
"fetch.wait.max.ms" = "5"
"#;
        let section: KafkaSection = toml::from_str(text).unwrap();
        let mut want = KafkaSourceConfig::new(
            "k:9092",
            TopicSelector::Pattern(TopicPattern::new("orders-.*").unwrap()),
            "g",
        );
        want.startup = Startup::Latest;
        want.partition_discovery_ms = 7;
        want.bounded = true;
        want.format = FormatRef::new(Plain(Output::Text));
        want.on_decode_error = OnError::Skip;
        want.connect_timeout_ms = 9;
        want.on_topic_recreated = RecreatedPolicy::Restart;
        want.properties
            .insert("fetch.wait.max.ms".into(), "5".into());
        assert_eq!(section.config(&cx("job")).unwrap(), want);
        for (bad, key) in [
            ("bootstrap_servers = \"k\"", "topics"),
            (
                "bootstrap_servers = \"k\"\ntopics = [\"a\"]\nformat = \"xml\"",
                "format",
            ),
            (
                "bootstrap_servers = \"k\"\ntopics = [\"a\"]\nconnect_timeout_ms = 0",
                "connect_timeout_ms",
            ),
            (
                "bootstrap_servers = \"k\"\ntopic_pattern = \"(\"",
                "topic_pattern",
            ),
            (
                "bootstrap_servers = \"k\"\ntopics = [\"a\"]\non_topic_recreated = \"earliest\"",
                "on_topic_recreated",
            ),
            (
                "bootstrap_servers = \"k\"\ntopics = [\"a\"]\n[properties]\n\"fetch.max.bytes\" = \"lots\"",
                "properties.\"fetch.max.bytes\"",
            ),
            (
                "bootstrap_servers = \"k\"\ntopics = [\"a\"]\n[properties]\n\"no.such.property\" = \"1\"",
                "properties.\"no.such.property\"",
            ),
            (
                "bootstrap_servers = \"k\"\ntopics = [\"a\"]\nformat = \"avro\"",
                "format",
            ),
            (
                "bootstrap_servers = \"k\"\ntopics = [\"a\"]\nformat = \"json-schema\"",
                "format",
            ),
            (
                "bootstrap_servers = \"k\"\ntopics = [\"a\"]\nkey_format = \"protobuf\"",
                "key_format",
            ),
            (
                "bootstrap_servers = \"k\"\ntopics = [\"a\"]\nformat = \"avro\"\nschema_file = \"/nonexistent/o.avsc\"",
                "schema_file",
            ),
            (
                "bootstrap_servers = \"k\"\ntopics = [\"a\"]\nformat = \"protobuf\"\nschema_file = \"/nonexistent/o.proto\"",
                "message",
            ),
            (
                "bootstrap_servers = \"k\"\ntopics = [\"a\"]\nformat = \"json\"\nschema_file = \"o.avsc\"",
                "schema_file",
            ),
            (
                "bootstrap_servers = \"k\"\ntopics = [\"a\"]\nkey_schema_file = \"k.avsc\"",
                "key_schema_file",
            ),
            (
                "bootstrap_servers = \"k\"\ntopics = [\"a\"]\ntemporal = \"rfc\"",
                "temporal",
            ),
            (
                "bootstrap_servers = \"k\"\ntopics = [\"a\"]\n[schema_registry]\nurl = \"http://r\"",
                "schema_registry",
            ),
            (
                "bootstrap_servers = \"k\"\ntopics = [\"a\"]\nformat = \"avro\"\n[schema_registry]\nurl = \"r:8081\"",
                "schema_registry.url",
            ),
            (
                "bootstrap_servers = \"k\"\ntopics = [\"a\"]\nformat = \"avro\"\nschema_file = \"o.avsc\"\n[schema_registry]\nurl = \"http://r\"",
                "schema_file",
            ),
            (
                "bootstrap_servers = \"k\"\ntopics = [\"a\"]\nformat = \"avro\"\n[schema_registry]\nurl = \"http://r\"\nusername = \"u\"",
                "schema_registry.password",
            ),
        ] {
            let s: KafkaSection = toml::from_str(bad).unwrap();
            match s.config(&cx("job")) {
                Err((k, m)) => assert_eq!(k, key, "{bad}: {m}"),
                Ok(c) => panic!("{bad}: accepted as {c:?}"),
            }
        }
    }
}
