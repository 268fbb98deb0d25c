//! The mapping from Kafka Connect's Elasticsearch sink settings to lockgate's keys: the
//! table the translation follows (a setting it has no row for is reported as unknown,
//! one whose row has no lockgate key is reported with the row's reason) and the
//! README's "Coming from Kafka Connect" table (`lockgate migrate kafka-connect
//! --table` prints it; a test keeps the README equal to it).

/// One setting (or family of settings, ending in `*`) and what it becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// The Kafka Connect setting; `prefix.*` for a family.
    pub connect: &'static str,
    /// The lockgate key(s) it becomes; empty when it has no equivalent.
    pub lockgate: &'static str,
    /// How, or why not.
    pub note: &'static str,
}

impl Row {
    /// Whether `key` is this row's setting (or of its family).
    pub fn matches(&self, key: &str) -> bool {
        match self.connect.strip_suffix('*') {
            Some(prefix) => key.starts_with(prefix),
            None => key == self.connect,
        }
    }

    /// Whether the setting has a lockgate equivalent (or needs none).
    pub fn translates(&self) -> bool {
        !self.lockgate.is_empty()
    }

    /// Whether lockgate needs nothing for it (it does the same by itself).
    pub fn needs_nothing(&self) -> bool {
        self.lockgate == NOTHING
    }
}

/// The `lockgate` of a setting that needs no key: lockgate does the same by itself.
pub const NOTHING: &str = "(nothing needed)";

const fn row(connect: &'static str, lockgate: &'static str, note: &'static str) -> Row {
    Row {
        connect,
        lockgate,
        note,
    }
}

/// Every setting the translation knows, in the README's order.
pub const ROWS: &[Row] = &[
    row("name", "job.name, source.kafka.group_id", "the group is Kafka Connect's: `connect-<name>`, read with `startup = \"group-offsets\"`, so the job continues where the connector stopped"),
    row("connector.class", "", "must be the Elasticsearch sink (`io.confluent.connect.elasticsearch.ElasticsearchSinkConnector`); anything else is refused"),
    row("tasks.max", "job.parallelism", ""),
    row("topics", "source.kafka.topics", ""),
    row("topics.regex", "source.kafka.topic_pattern", "Java and lockgate both match the whole topic name"),
    row("connection.url", "sink.elasticsearch.url / urls", "several, comma-separated, become `urls`"),
    row("connection.username", "sink.elasticsearch.username", ""),
    row("connection.password", "sink.elasticsearch.password", "written as `${ES_PASSWORD}`, never copied into the file"),
    row("key.ignore", "sink.elasticsearch.id", "`true`: `coordinates` (`topic-partition-offset`, Connect's `topic+partition+offset`); `false` (Connect's default): `key`"),
    row("schema.ignore", "", "lockgate makes no mapping from a record's schema: `true` needs nothing; `false` is reported (give the mapping with `index_template_file`)"),
    row("compact.map.entries", "", "`true` (Connect's default) needs nothing: lockgate writes maps as JSON objects; `false` (maps as arrays of key and value) is reported"),
    row("write.method", "sink.elasticsearch.operation", "`insert`: `index` (with `versioning = \"external\"` when ids are keys, as Connect versions by offset); `upsert`: `upsert`"),
    row("behavior.on.null.values", "sink.elasticsearch.on_null_value", "`ignore`: `skip`, `delete`: `delete`, `fail`: `fail`"),
    row("behavior.on.malformed.documents", "sink.elasticsearch.on_item_error", "`fail`: `fail`; `warn` and `ignore` drop the document in Connect: lockgate dead-letters it to the DLQ topic, or reports the key when there is none (it never drops a record silently)"),
    row("drop.invalid.message", "", "`true` drops records that cannot become a document (a null key, a tombstone under `fail`); lockgate fails or dead-letters them by `on_item_error` and `on_null_value`: reported"),
    row("batch.size", "sink.elasticsearch.bulk_max_actions", ""),
    row("bulk.size.bytes", "sink.elasticsearch.bulk_max_bytes", ""),
    row("max.in.flight.requests", "sink.elasticsearch.max_in_flight", ""),
    row("max.buffered.records", "sink.elasticsearch.buffer_max_bytes", "records become bytes: 1 KiB each is assumed"),
    row("linger.ms", "sink.elasticsearch.bulk_flush_interval_ms", ""),
    row("flush.timeout.ms", "checkpoint.timeout_ms", "lockgate flushes at each checkpoint, which waits this long"),
    row("flush.synchronously", NOTHING, "lockgate's flush is the checkpoint's: nothing to set"),
    row("max.retries", "sink.elasticsearch.retry_max_attempts", ""),
    row("retry.backoff.ms", "sink.elasticsearch.retry_initial_ms", "the first backoff; it doubles with jitter up to `retry_max_ms`"),
    row("connection.compression", "sink.elasticsearch.compression", "`true`: `gzip`"),
    row("external.resource.usage", "sink.elasticsearch.require_alias", "`INDEX`: nothing; `ALIAS_INDEX`: `require_alias = true`; `DATASTREAM` and `ALIAS_DATASTREAM` are reported (give `data_stream`)"),
    row("read.timeout.ms", "sink.elasticsearch.request_timeout_ms", "one request's timeout"),
    row("connection.timeout.ms", "sink.elasticsearch.request_timeout_ms", "folded into the request timeout (the larger of the two)"),
    row("errors.tolerance", "source.kafka.on_decode_error", "`all` with a DLQ topic: `dead-letter:<topic>` for records that do not decode; `all` without one: `skip`; `none`: `fail` (malformed documents follow `behavior.on.malformed.documents`, as in Connect)"),
    row("errors.deadletterqueue.topic.name", "source.kafka.on_decode_error, sink.elasticsearch.on_item_error", "the dead-letter topic, on the source's cluster (as Connect's)"),
    row("errors.deadletterqueue.context.headers.enable", NOTHING, "lockgate's dead letters always carry their origin and error in headers (`lockgate.*`)"),
    row("errors.deadletterqueue.topic.replication.factor", "", "lockgate creates no topic: create the DLQ topic beforehand"),
    row("errors.log.enable", NOTHING, "lockgate logs every failure"),
    row("errors.log.include.messages", "", "lockgate never logs record contents"),
    row("errors.retry.timeout", "", "Connect retries conversions; lockgate retries Elasticsearch and the registry by its own settings"),
    row("errors.retry.delay.max.ms", "", "as errors.retry.timeout"),
    row("data.stream.type", "sink.elasticsearch.data_stream.type", "`LOGS` / `METRICS` in lower case; `NONE`: no data stream"),
    row("data.stream.dataset", "sink.elasticsearch.data_stream.dataset", ""),
    row("data.stream.namespace", "sink.elasticsearch.data_stream.namespace", "`${topic}` becomes `{topic}`"),
    row("data.stream.timestamp.field", "sink.elasticsearch.timestamp_field", "the first field (a JSON pointer); further fields are reported"),
    row("external.version.header", "", "lockgate versions by the Kafka offset, not by a header: the job writes without versions (offsets as versions would refuse every update of a document the header versioned)"),
    row("topic.to.external.resource.mapping", "sink.elasticsearch.topic_to_index", "`topic:index` pairs; `index` becomes `{topic}`"),
    row("topic.key.ignore", "", "per-topic ids: lockgate has one `id` per job"),
    row("topic.schema.ignore", "", "as schema.ignore"),
    row("type.name", NOTHING, "mapping types were removed in Elasticsearch 7: nothing to set"),
    row("use.autogenerated.ids", "", "lockgate always names documents (exactly once needs it)"),
    row("proxy.host", "", "lockgate connects directly (set the node URLs)"),
    row("proxy.port", "", "as proxy.host"),
    row("elastic.security.protocol", NOTHING, "the URL's scheme says it: `https://`"),
    row("elastic.https.ssl.truststore.location", "", "lockgate reads a PEM CA file (`ca_cert`), not a JKS or PKCS#12 store: export it (`keytool -exportcert -rfc`)"),
    row("elastic.https.ssl.*", "", "lockgate reads a PEM CA file (`ca_cert`) and `tls_verify`"),
    row("key.converter", "source.kafka.key_format", "`StringConverter`: keys as they are; `JsonConverter`: `json` (with `key_connect_envelope` when `schemas.enable`); Avro, Protobuf, JSON Schema: `avro`, `protobuf`, `json-schema`"),
    row("value.converter", "source.kafka.format", "`JsonConverter`: `json`, with `connect_envelope = true` when `schemas.enable` (Connect's default); `AvroConverter`: `avro`; `ProtobufConverter`: `protobuf`; `JsonSchemaConverter`: `json-schema`"),
    row("key.converter.*", "source.kafka.schema_registry", "`schemas.enable`, `schema.registry.url` and basic auth (`USER_INFO`); the password as `${REGISTRY_PASSWORD}`"),
    row("value.converter.*", "source.kafka.schema_registry", "`schemas.enable`, `schema.registry.url` and basic auth (`USER_INFO`); the password as `${REGISTRY_PASSWORD}`"),
    row("consumer.override.*", "source.kafka.properties", "librdkafka's names (`sasl.mechanism` -> `sasl.mechanisms`, `fetch.max.wait.ms` -> `fetch.wait.max.ms`; `sasl.jaas.config` -> `sasl.username` and `${KAFKA_PASSWORD}`); Java-only settings (`max.poll.records`, JKS stores) are reported"),
    row("transforms", "[[transform]]", "each in order, by class (below); a transform with a `predicate` other than `Filter` is reported"),
    row("transforms.*", "[[transform]]", "`InsertField$Value`, `ReplaceField$Value`, `ExtractField$Value`, `ValueToKey` (+ `ExtractField$Key`), `ExtractField$Key` alone (`id = \"field:/<field>\"`), `Cast$Value`, `TimestampConverter$Value`, `Flatten$Value`, `MaskField$Value`, `Filter` (with `TopicNameMatches`, `HasHeaderKey`, `RecordIsTombstone`), Debezium's `ExtractNewRecordState`; `RegexRouter` and `TimestampRouter` become the index name"),
    row("predicates", "[[transform]] type = \"filter\"", "with the `Filter` that names them"),
    row("predicates.*", "[[transform]] type = \"filter\"", "`TopicNameMatches` (`pattern`), `HasHeaderKey` (`name`), `RecordIsTombstone`"),
];

/// The row of `key`, if any.
pub fn row_of(key: &str) -> Option<&'static Row> {
    // An exact row before a family (`key.converter` before `key.converter.*`).
    ROWS.iter()
        .find(|r| r.connect == key)
        .or_else(|| ROWS.iter().find(|r| r.matches(key)))
}

/// The table as Markdown (the README's).
pub fn markdown() -> String {
    let mut out = String::from("| Kafka Connect | lockgate | how |\n|---|---|---|\n");
    for r in ROWS {
        let lockgate = if r.needs_nothing() {
            r.lockgate.to_string()
        } else if r.translates() {
            format!("`{}`", r.lockgate)
        } else {
            "(none)".to_string()
        };
        out.push_str(&format!(
            "| `{}` | {} | {} |\n",
            r.connect,
            lockgate,
            r.note.replace('|', "\\|")
        ));
    }
    out
}
