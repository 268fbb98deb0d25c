//! A Kafka Connect Elasticsearch sink configuration to a lockgate job file: a plain
//! function over the settings ([`translate`]), which says for every setting what it
//! became or why it has no equivalent ([`Translation::left_out`]).

use super::input::ConnectorConfig;
use super::job_file::JobFile;
use super::settings::Settings;
use super::table::row_of;
use std::collections::{BTreeMap, BTreeSet};

/// What the translation made.
#[derive(Debug, Clone, PartialEq)]
pub struct Translation {
    pub job: JobFile,
    /// Settings with no equivalent: `(setting, why)`, by setting name.
    pub left_out: Vec<(String, String)>,
    /// Those of [`Translation::left_out`] that change what the job reads or writes
    /// ([`super::left_out::changes_records`]): the job file marks their places and
    /// lists them as `[job] left_out`, which `lockgate run` refuses without
    /// `--allow-left-out`.
    pub changes_records: Vec<String>,
    /// Semantics that differ, and what to set before starting (environment variables).
    pub notes: Vec<String>,
}

/// Choices the configuration does not hold.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The Kafka cluster (a worker setting, absent from a connector's configuration);
    /// `None`: not known, reported as left out (the file says `localhost:9092`).
    pub bootstrap_servers: Option<String>,
    /// Where the job keeps its checkpoints (default `/var/lib/lockgate/<name>`).
    pub checkpoint_dir: Option<String>,
}

/// The connector classes of Kafka Connect's Elasticsearch sink.
const SINK_CLASSES: [&str; 2] = [
    "io.confluent.connect.elasticsearch.ElasticsearchSinkConnector",
    "ElasticsearchSinkConnector",
];

/// Translates `cfg`. The error is a configuration that is not an Elasticsearch sink's.
pub fn translate(cfg: &ConnectorConfig, opts: &Options) -> Result<Translation, String> {
    let (resolved, unresolved) = providers(&cfg.config);
    let mut s = Settings {
        all: &resolved,
        used: BTreeSet::new(),
        left_out: Vec::new(),
    };
    for (k, why) in unresolved {
        s.used.insert(k.clone());
        s.left_out.push((k, why));
    }
    let mut notes = Vec::new();
    match s.get("connector.class") {
        Some(c) if SINK_CLASSES.contains(&c) => {}
        Some(c) => {
            return Err(format!(
                "connector.class = {c}: only Kafka Connect's Elasticsearch sink ({}) is translated",
                SINK_CLASSES[0]
            ))
        }
        None => {
            return Err("connector.class is missing: is this a connector's configuration?".into())
        }
    }
    let name = cfg
        .name
        .clone()
        .or_else(|| s.get("name").map(String::from))
        .unwrap_or_else(|| "elasticsearch-sink".into());
    s.get("name");
    let mut f = JobFile::default();

    // [job]
    let job = f.section("job");
    job.set("name", name.as_str(), &["name"]);
    if let Some(n) = s
        .get("tasks.max")
        .and_then(|v| v.trim().parse::<i64>().ok())
    {
        job.set("parallelism", n.max(1), &["tasks.max"]);
    }

    // [checkpoint]
    let dir = opts
        .checkpoint_dir
        .clone()
        .unwrap_or_else(|| format!("/var/lib/lockgate/{name}"));
    let chk = f.section("checkpoint");
    chk.set("dir", dir.as_str(), &[]).because(
        "lockgate keeps the consumed offsets here, in its checkpoints (not in the consumer group)",
    );
    if let Some(ms) = int(s.get("flush.timeout.ms")) {
        chk.set("timeout_ms", ms, &["flush.timeout.ms"]);
    }

    // [source.kafka]
    source(&mut s, &mut f, &name, opts, &mut notes);

    // [[transform]]s, and what they make of the index name.
    let routing = super::transforms::transforms(&mut s, &mut f, &mut notes);

    // [sink.elasticsearch]
    sink(&mut s, &mut f, routing, &mut notes);

    // What nothing above used.
    let unused: Vec<String> = cfg
        .config
        .keys()
        .filter(|k| !s.used.contains(*k))
        .cloned()
        .collect();
    for k in unused {
        if at_default(&k, &resolved[&k]) {
            continue;
        }
        let why = match row_of(&k) {
            Some(r) if r.needs_nothing() => continue,
            Some(r) if !r.translates() => r.note.to_string(),
            Some(_) => "not translated in this form".to_string(),
            None => "unknown to the translation (no lockgate equivalent)".to_string(),
        };
        s.left_out.push((k, why));
    }
    // A key's origin names the settings the configuration has; a key made of
    // Kafka Connect's defaults says so.
    for section in &mut f.sections {
        for e in &mut section.entries {
            if e.from.is_empty() {
                continue;
            }
            let given: Vec<String> = e
                .from
                .iter()
                .filter(|k| cfg.config.contains_key(*k) || *k == "name")
                .cloned()
                .collect();
            if given.is_empty() {
                let default = format!("Kafka Connect's default of {}", e.from.join(", "));
                e.why = Some(match e.why.take() {
                    Some(w) => format!("{default}: {w}"),
                    None => default,
                });
            }
            e.from = given;
        }
    }
    let mut left_out = s.left_out;
    left_out.sort_by_key(|(k, _)| cfg.config.keys().position(|c| c == k).unwrap_or(usize::MAX));
    let missing: Vec<(String, String)> = left_out
        .iter()
        .filter(|(k, _)| super::left_out::changes_records(k))
        .cloned()
        .collect();
    let chain: Vec<&str> = resolved
        .get("transforms")
        .map(|t| {
            t.split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .collect()
        })
        .unwrap_or_default();
    super::left_out::mark(&mut f, &chain, &missing);
    Ok(Translation {
        job: f,
        left_out,
        changes_records: missing.into_iter().map(|(k, _)| k).collect(),
        notes,
    })
}

/// The settings with Kafka Connect's config-provider references resolved where lockgate
/// can: `${env:NAME}` becomes lockgate's `${NAME}`; any other provider (`${file:...}`,
/// `${vault:...}`) is left out, named, and its setting is not used (so that nothing of
/// it is copied). Secrets that lockgate writes as `${VAR}` anyway keep working.
fn providers(
    config: &BTreeMap<String, String>,
) -> (BTreeMap<String, String>, Vec<(String, String)>) {
    let secret = |k: &str| {
        k == "connection.password"
            || k.ends_with("basic.auth.user.info")
            || k.ends_with("sasl.jaas.config")
    };
    let mut resolved = BTreeMap::new();
    let mut left = Vec::new();
    for (k, v) in config {
        let mut out = String::new();
        let mut rest = v.as_str();
        let mut foreign = None;
        while let Some(i) = rest.find("${") {
            let Some(end) = rest[i..].find('}') else {
                break;
            };
            let inner = &rest[i + 2..i + end];
            out.push_str(&rest[..i]);
            match inner.split_once(':') {
                Some(("env", name)) if !name.contains(':') => {
                    out.push_str(&format!("${{{name}}}"));
                }
                Some((provider, _)) => {
                    foreign = Some(provider.to_string());
                    out.push_str(&rest[i..i + end + 1]);
                }
                None => out.push_str(&rest[i..i + end + 1]),
            }
            rest = &rest[i + end + 1..];
        }
        out.push_str(rest);
        match foreign {
            Some(p) if !secret(k) => left.push((
                k.clone(),
                format!("a `{p}` config provider reference: lockgate reads environment variables (${{NAME}}) only: give the value, or ${{env:NAME}}"),
            )),
            _ => {
                resolved.insert(k.clone(), out);
            }
        }
    }
    (resolved, left)
}

/// `url` without user info (which becomes credentials) and with a scheme (Connect
/// takes `host:port` as http): the URL, and the user if it had one.
fn node_url(url: &str) -> (String, Option<String>) {
    let with_scheme = if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    };
    match reqwest::Url::parse(&with_scheme) {
        Ok(mut u) if !u.username().is_empty() || u.password().is_some() => {
            let user = crate::clients::http::percent_decode(u.username());
            let _ = u.set_username("");
            let _ = u.set_password(None);
            (u.as_str().trim_end_matches('/').to_string(), Some(user))
        }
        _ => (with_scheme, None),
    }
}

/// Whether `key` is set to Kafka Connect's default, which lockgate also does.
fn at_default(key: &str, value: &str) -> bool {
    let v = value.trim().to_ascii_lowercase();
    match key {
        "use.autogenerated.ids" | "errors.log.include.messages" | "flush.synchronously" => {
            v == "false"
        }
        "proxy.host"
        | "proxy.username"
        | "proxy.password"
        | "topic.key.ignore"
        | "topic.schema.ignore"
        | "external.version.header" => v.is_empty(),
        "proxy.port" => v == "8080" || v.is_empty(),
        "errors.retry.timeout" | "errors.retry.delay.max.ms" => v == "0" || v == "60000",
        "compact.map.entries" => v == "true",
        _ => false,
    }
}

fn int(v: Option<&str>) -> Option<i64> {
    v.and_then(|v| v.trim().parse::<i64>().ok())
}

/// `[source.kafka]`: topics, group, formats, registry, errors, consumer overrides.
fn source(
    s: &mut Settings<'_>,
    f: &mut JobFile,
    name: &str,
    opts: &Options,
    notes: &mut Vec<String>,
) {
    let src = f.section("source.kafka");
    match &opts.bootstrap_servers {
        Some(servers) => {
            src.set("bootstrap_servers", servers.as_str(), &[]).because(
                "the Kafka cluster of the Connect worker (bootstrap.servers of its configuration)",
            );
        }
        None => {
            src.set("bootstrap_servers", "localhost:9092", &[]);
            s.left_out.push((
                super::left_out::CLUSTER.into(),
                "a connector's configuration does not name its worker's Kafka cluster: give it with --bootstrap-servers (the file says localhost:9092)".into(),
            ));
        }
    }
    if let Some(t) = s.get("topics") {
        let topics: Vec<toml::Value> = t
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(|t| toml::Value::String(t.into()))
            .collect();
        src.set("topics", toml::Value::Array(topics), &["topics"]);
        s.leave(
            "topics.regex",
            "topics and topics.regex together (Kafka Connect refuses it): topics is used",
        );
    } else if let Some(r) = s.get("topics.regex") {
        src.set("topic_pattern", r, &["topics.regex"]);
    }
    src.set("group_id", format!("connect-{name}"), &["name"])
        .because("Kafka Connect's consumer group of this sink connector");
    src.set("startup", "group-offsets", &[]).because(
        "the first run starts where the connector's group stopped; later runs restore their checkpoints",
    );
    notes.push(format!(
        "lockgate keeps its offsets in its checkpoints, not in the consumer group: the first run starts at group connect-{name}'s committed offsets (stop the connector first), later runs from their checkpoints; the group's offsets are still committed for monitoring"
    ));

    // Converters. Keys are decoded only when they name documents (key.ignore = false,
    // Connect's default): a job that ignores them must not fail on one it cannot decode.
    let keys_used = !s
        .peek("key.ignore")
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        && s.peek("data.stream.type")
            .is_none_or(|t| t.trim().eq_ignore_ascii_case("none"));
    for (which, format_key, envelope_key, used) in [
        ("value.converter", "format", "connect_envelope", true),
        (
            "key.converter",
            "key_format",
            "key_connect_envelope",
            keys_used,
        ),
    ] {
        if !used {
            s.get(which);
            s.get(&format!("{which}.schemas.enable"));
            continue;
        }
        let (format, envelope) = converter(s, which, notes);
        let src = f.section("source.kafka");
        if let Some(fmt) = &format {
            src.set(format_key, fmt.as_str(), &[which]);
        }
        if envelope {
            src.set(
                envelope_key,
                true,
                &[format!("{which}.schemas.enable").as_str()],
            );
        }
    }
    registry(s, f, notes, keys_used);

    // Errors: what does not decode.
    let tolerate_all = s
        .get("errors.tolerance")
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("all"));
    let dlq = s
        .get("errors.deadletterqueue.topic.name")
        .map(str::trim)
        .filter(|t| !t.is_empty());
    // drop.invalid.message drops what cannot become a document (a null key, a
    // tombstone under fail), not what does not decode: lockgate fails or dead-letters
    // those by on_item_error and on_null_value.
    if s.flag("drop.invalid.message", false) {
        s.used.remove("drop.invalid.message");
        s.leave(
            "drop.invalid.message",
            "true: Connect drops records it cannot make a document of (a null key, a tombstone under behavior.on.null.values = fail); lockgate never drops one silently: they follow on_item_error and on_null_value",
        );
    }
    let on_decode = match (tolerate_all, dlq) {
        (true, Some(t)) => Some(format!("dead-letter:{t}")),
        (true, None) => Some("skip".to_string()),
        (false, _) => None,
    };
    if let Some(p) = on_decode {
        let mut from = vec!["errors.tolerance"];
        if dlq.is_some() {
            from.push("errors.deadletterqueue.topic.name");
        }
        f.section("source.kafka")
            .set("on_decode_error", p.as_str(), &from);
    }

    // Consumer overrides, in librdkafka's names.
    let overrides = s.family("consumer.override.");
    for (k, v) in overrides {
        let java = &k["consumer.override.".len()..];
        match consumer_property(java, v) {
            Property::Set(pairs) => {
                for (name, value) in pairs {
                    f.section("source.kafka.properties")
                        .set(&name, value.as_str(), &[k]);
                }
                if java == "sasl.jaas.config" {
                    notes.push("set KAFKA_PASSWORD: the SASL password of consumer.override.sasl.jaas.config".into());
                }
            }
            Property::Group(g) => {
                f.section("source.kafka").set("group_id", g.as_str(), &[k]);
            }
            Property::Leave(why) => s.left_out.push((k.to_string(), why)),
        }
    }
}

/// What a Java consumer property becomes.
enum Property {
    Set(Vec<(String, String)>),
    Group(String),
    Leave(String),
}

fn consumer_property(java: &str, v: &str) -> Property {
    let same = |name: &str| Property::Set(vec![(name.to_string(), v.to_string())]);
    match java {
        "group.id" => Property::Group(v.to_string()),
        "security.protocol" | "auto.offset.reset" | "session.timeout.ms"
        | "heartbeat.interval.ms" | "isolation.level" | "client.id" | "fetch.min.bytes"
        | "fetch.max.bytes" | "max.partition.fetch.bytes" | "socket.connection.setup.timeout.ms"
        | "reconnect.backoff.ms" | "reconnect.backoff.max.ms" | "request.timeout.ms"
        | "metadata.max.age.ms" | "client.rack" | "max.poll.interval.ms" => {
            let name = match java {
                "client.rack" => "client.rack",
                "request.timeout.ms" => "socket.timeout.ms",
                other => other,
            };
            same(name)
        }
        "sasl.mechanism" => same("sasl.mechanisms"),
        "fetch.max.wait.ms" => same("fetch.wait.max.ms"),
        // Java's empty value turns the host name check off.
        "ssl.endpoint.identification.algorithm" if v.trim().is_empty() => Property::Set(vec![(
            "ssl.endpoint.identification.algorithm".into(),
            "none".into(),
        )]),
        "ssl.endpoint.identification.algorithm" => same("ssl.endpoint.identification.algorithm"),
        "sasl.jaas.config" => match jaas_user(v) {
            Some(user) => Property::Set(vec![
                ("sasl.username".into(), user),
                ("sasl.password".into(), "${KAFKA_PASSWORD}".into()),
            ]),
            None => Property::Leave(
                "a JAAS configuration without username=\"...\" (Kerberos, OAuth): set librdkafka's sasl.* properties by hand".into(),
            ),
        },
        "ssl.truststore.location" | "ssl.keystore.location" | "ssl.truststore.password"
        | "ssl.keystore.password" | "ssl.key.password" | "ssl.truststore.type"
        | "ssl.keystore.type" => Property::Leave(
            "librdkafka reads PEM files (ssl.ca.location, ssl.certificate.location, ssl.key.location), not Java key stores".into(),
        ),
        "max.poll.records" => Property::Leave(
            "a Java consumer's batch size: lockgate's source batches by itself".into(),
        ),
        "key.deserializer" | "value.deserializer" => Property::Leave(
            "the converters (format, key_format) decode records".into(),
        ),
        "enable.auto.commit" | "auto.commit.interval.ms" => Property::Leave(
            "lockgate commits offsets at its checkpoints".into(),
        ),
        _ => Property::Leave("not a librdkafka property (or not known to the translation)".into()),
    }
}

/// The username of a PLAIN or SCRAM JAAS line.
fn jaas_user(jaas: &str) -> Option<String> {
    let i = jaas.find("username=")?;
    let rest = jaas[i + "username=".len()..].trim_start();
    let quoted = rest.strip_prefix('"')?;
    Some(quoted[..quoted.find('"')?].to_string())
}

/// What a converter makes: the format, and whether JSON values carry Connect's
/// schema envelope.
fn converter(s: &mut Settings<'_>, which: &str, notes: &mut Vec<String>) -> (Option<String>, bool) {
    let Some(class) = s.get(which) else {
        // Apache Kafka's worker default (connect-distributed.properties).
        notes.push(format!(
            "{which} is not set: the worker's applies; the job assumes Apache Kafka's default, JsonConverter with schemas.enable = true (check the worker's {which})"
        ));
        return (Some("json".to_string()), true);
    };
    let short = class.rsplit('.').next().unwrap_or(class);
    let schemas = s.flag(&format!("{which}.schemas.enable"), true);
    match short {
        "JsonConverter" => (Some("json".into()), schemas),
        "AvroConverter" => (Some("avro".into()), false),
        "ProtobufConverter" => (Some("protobuf".into()), false),
        "JsonSchemaConverter" => (Some("json-schema".into()), false),
        "StringConverter" if which == "key.converter" => (None, false),
        "StringConverter" => {
            s.used.remove(which);
            s.leave(
                which,
                "StringConverter values are text; the Elasticsearch sink takes JSON objects",
            );
            (None, false)
        }
        "ByteArrayConverter" if which == "key.converter" => (None, false),
        _ => {
            s.used.remove(which);
            s.leave(
                which,
                format!("{short} has no lockgate format (json, avro, protobuf, json-schema, text)"),
            );
            (None, false)
        }
    }
}

/// `[source.kafka.schema_registry]` from the converters' registry settings.
fn registry(s: &mut Settings<'_>, f: &mut JobFile, notes: &mut Vec<String>, keys_used: bool) {
    let mut chosen: Option<String> = None;
    for which in ["value.converter", "key.converter"] {
        let url_key = format!("{which}.schema.registry.url");
        if which == "key.converter" && !keys_used {
            // Keys are not decoded: their registry is not needed.
            s.get(&url_key);
            s.get(&format!("{which}.basic.auth.credentials.source"));
            s.get(&format!("{which}.basic.auth.user.info"));
            continue;
        }
        let Some(url) = s.get(&url_key) else {
            continue;
        };
        let mut url_user = None;
        let urls: Vec<String> = url
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(|u| {
                let (u, user) = node_url(u);
                url_user = url_user.take().or(user);
                u
            })
            .collect();
        let joined = urls.join(",");
        match &chosen {
            Some(c) if *c != joined => {
                s.left_out.push((
                    url_key.clone(),
                    "a second Schema Registry: lockgate reads keys and values through one".into(),
                ));
                continue;
            }
            Some(_) => {}
            None => {
                chosen = Some(joined);
                let reg = f.section("source.kafka.schema_registry");
                match urls.as_slice() {
                    [one] => {
                        reg.set("url", one.as_str(), &[url_key.as_str()]);
                    }
                    many => {
                        let list = many
                            .iter()
                            .map(|u| toml::Value::String(u.clone()))
                            .collect();
                        reg.set("urls", toml::Value::Array(list), &[url_key.as_str()]);
                    }
                }
            }
        }
        let source_key = format!("{which}.basic.auth.credentials.source");
        let info_key = format!("{which}.basic.auth.user.info");
        let source = s.get(&source_key).map(|v| v.trim().to_string());
        let info = s.get(&info_key);
        let user = match (source.as_deref(), info) {
            (Some("USER_INFO") | None, Some(info)) => Some((
                info.split(':').next().unwrap_or_default().to_string(),
                info_key.clone(),
            )),
            (Some("URL"), _) => url_user.clone().map(|u| (u, url_key.clone())),
            (Some(other), _) => {
                s.used.remove(&source_key);
                s.leave(
                    &source_key,
                    format!("{other}: lockgate's registry takes basic credentials (USER_INFO or URL) or a bearer token"),
                );
                None
            }
            (None, None) => url_user.clone().map(|u| (u, url_key.clone())),
        };
        if let Some((user, from)) = user {
            let reg = f.section("source.kafka.schema_registry");
            if reg.entries.iter().any(|e| e.key == "username") {
                continue;
            }
            reg.set("username", user.as_str(), &[from.as_str()]);
            reg.set("password", "${REGISTRY_PASSWORD}", &[from.as_str()])
                .because("never copied into the file: set REGISTRY_PASSWORD");
            notes.push("set REGISTRY_PASSWORD: the Schema Registry's password".into());
        }
    }
    // What else the converters were told.
    for which in ["value.converter.", "key.converter."] {
        for (k, _) in s.family(which) {
            let known = [
                "schemas.enable",
                "schema.registry.url",
                "basic.auth.credentials.source",
                "basic.auth.user.info",
            ];
            let rest = &k[which.len()..];
            if !known.contains(&rest) {
                s.left_out.push((
                    k.to_string(),
                    "a converter setting lockgate has no equivalent for".into(),
                ));
            }
        }
    }
    let _ = &notes;
}

/// The index the transforms route records to: a `RegexRouter`'s renaming, a
/// `TimestampRouter`'s date pattern.
#[derive(Debug, Clone, Default)]
pub struct IndexRouting {
    /// `index` template (`{topic}` and date patterns).
    pub template: Option<(String, Vec<String>)>,
    /// Renamed topics: topic -> index.
    pub renamed: BTreeMap<String, String>,
    pub renamed_from: Vec<String>,
    /// The key is this field of the key (`ExtractField$Key`), and where that was said.
    pub key_field: Option<(String, Vec<String>)>,
}

/// `on_null_value` from `behavior.on.null.values` (Connect's default: `fail`); a
/// `delete` the sink cannot do (`refused`, why) skips tombstones and is reported.
fn null_values(s: &mut Settings<'_>, f: &mut JobFile, refused: Option<&str>) {
    let from = ["behavior.on.null.values"];
    let es = f.section("sink.elasticsearch");
    match s
        .get("behavior.on.null.values")
        .map(|b| b.trim().to_ascii_lowercase())
        .as_deref()
    {
        Some("ignore") => {
            es.set("on_null_value", "skip", &from);
        }
        Some("delete") => match refused {
            Some(why) => {
                es.set("on_null_value", "skip", &from);
                s.left_out.push((
                    from[0].into(),
                    format!("delete: {why}; tombstones are skipped"),
                ));
            }
            None => {
                es.set("on_null_value", "delete", &from);
            }
        },
        _ => {
            es.set("on_null_value", "fail", &from)
                .because("Connect's default: a tombstone fails the task");
        }
    }
}

/// `[sink.elasticsearch]`.
fn sink(s: &mut Settings<'_>, f: &mut JobFile, routing: IndexRouting, notes: &mut Vec<String>) {
    connection(s, f, notes);
    // Where: a data stream, or an index named after the topic.
    let data_stream = match data_stream_type(s) {
        Some(kind) => {
            data_stream_target(s, f, kind);
            true
        }
        None => {
            index_target(s, f, &routing);
            false
        }
    };
    schema_mapping(s, data_stream);
    item_errors(s, f);
    batching_and_retries(s, f);
}

/// The cluster's URLs, credentials (the password never copied) and compression.
fn connection(s: &mut Settings<'_>, f: &mut JobFile, notes: &mut Vec<String>) {
    let es = f.section("sink.elasticsearch");
    let mut url_user = None;
    match s.get("connection.url").map(|u| {
        u.split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(|u| {
                let (url, user) = node_url(u);
                url_user = url_user.take().or(user);
                url
            })
            .collect::<Vec<_>>()
    }) {
        Some(urls) if urls.len() == 1 => {
            es.set("url", urls[0].as_str(), &["connection.url"]);
        }
        Some(urls) if !urls.is_empty() => {
            let list = urls.into_iter().map(toml::Value::String).collect();
            es.set("urls", toml::Value::Array(list), &["connection.url"]);
        }
        _ => {
            es.set("url", "http://localhost:9200", &[])
                .because("connection.url is missing: set the cluster's URL");
        }
    }
    let username = s
        .get("connection.username")
        .map(String::from)
        .or(url_user.clone());
    let password = s.get("connection.password").is_some() || url_user.is_some();
    match (&username, password) {
        (Some(u), true) => {
            es.set("username", u.as_str(), &["connection.username"]);
        }
        (Some(_), false) => {
            s.left_out.push((
                "connection.username".into(),
                "a username without connection.password: Kafka Connect refuses it too".into(),
            ));
        }
        (None, true) => {
            s.left_out.push((
                "connection.password".into(),
                "a password without connection.username: Kafka Connect refuses it too".into(),
            ));
        }
        (None, false) => {}
    }
    if password && username.is_some() {
        es.set("password", "${ES_PASSWORD}", &["connection.password"])
            .because("never copied into the file: set ES_PASSWORD");
        notes.push("set ES_PASSWORD: the Elasticsearch password of connection.password".into());
    }

    if s.flag("connection.compression", false) {
        f.section("sink.elasticsearch")
            .set("compression", "gzip", &["connection.compression"]);
    }
}

/// The data stream's type, if the records go to one: a type without a dataset is
/// reported, and the records go to an index.
fn data_stream_type(s: &mut Settings<'_>) -> Option<String> {
    let ds_type = s
        .get("data.stream.type")
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| t != "none" && !t.is_empty());
    if ds_type.is_some()
        && s.peek("data.stream.dataset")
            .is_none_or(|d| d.trim().is_empty())
    {
        s.left_out.push((
            "data.stream.type".into(),
            "a data stream without data.stream.dataset (Kafka Connect refuses it too): written to an index instead".into(),
        ));
        return None;
    }
    ds_type
}

/// A data stream of type `kind`: its name, timestamp field, one document per record,
/// no deletes.
fn data_stream_target(s: &mut Settings<'_>, f: &mut JobFile, kind: String) {
    let dataset = s
        .get("data.stream.dataset")
        .unwrap_or_default()
        .trim()
        .to_string();
    let namespace = s
        .get("data.stream.namespace")
        .unwrap_or("${topic}")
        .trim()
        .replace("${topic}", "{topic}");
    let mut t = toml::map::Map::new();
    t.insert("type".into(), toml::Value::String(kind));
    t.insert("dataset".into(), toml::Value::String(dataset));
    t.insert("namespace".into(), toml::Value::String(namespace));
    let es = f.section("sink.elasticsearch");
    es.set(
        "data_stream",
        toml::Value::Table(t),
        &[
            "data.stream.type",
            "data.stream.dataset",
            "data.stream.namespace",
        ],
    );
    if let Some(fields) = s.get("data.stream.timestamp.field") {
        let mut all = fields.split(',').map(str::trim).filter(|f| !f.is_empty());
        if let Some(first) = all.next() {
            // Connect reads a top-level field of that very name (`a.b` after a
            // Flatten): one JSON pointer step, escaped.
            es.set(
                "timestamp_field",
                format!("/{}", first.replace('~', "~0").replace('/', "~1")),
                &["data.stream.timestamp.field"],
            );
        }
        let rest: Vec<&str> = all.collect();
        if !rest.is_empty() {
            s.left_out.push((
                "data.stream.timestamp.field".into(),
                format!(
                    "lockgate takes one timestamp field: {} not used",
                    rest.join(", ")
                ),
            ));
        }
    }
    es.set("id", "coordinates", &[]).because(
        "a data stream takes create actions, one document per record (Connect's topic+partition+offset)",
    );
    // Connect writes a data stream's documents with the key as id when keys are
    // not ignored: the first write of a key stays, later ones are skipped.
    if !s.flag("key.ignore", false) {
        s.left_out.push((
            "key.ignore".into(),
            "false (Kafka Connect's default) into a data stream: Connect keeps the first record of each key; lockgate writes one document per record (id = coordinates)".into(),
        ));
    }
    s.get("write.method");
    null_values(s, f, Some("a data stream takes no deletes"));
}

/// An index named after the topic (as the routers and the mapping rename it): its
/// name, the documents' ids and the write, and whether it is an alias.
fn index_target(s: &mut Settings<'_>, f: &mut JobFile, routing: &IndexRouting) {
    s.get("data.stream.dataset");
    s.get("data.stream.namespace");
    s.get("data.stream.timestamp.field");
    index_names(s, f, routing);
    document_ids_and_write(s, f, routing);
    match s
        .get("external.resource.usage")
        .map(|u| u.trim().to_ascii_uppercase())
        .as_deref()
    {
        None | Some("INDEX") | Some("") => {}
        Some("ALIAS_INDEX") => {
            f.section("sink.elasticsearch").set(
                "require_alias",
                true,
                &["external.resource.usage"],
            );
        }
        Some(other) => s.left_out.push((
            "external.resource.usage".into(),
            format!(
                "{other}: mapped data streams have no equivalent (give data_stream, one per job)"
            ),
        )),
    }
}

/// `index` (the routers' template, or the topic) and `topic_to_index` (the renamed
/// topics and Connect's mapping).
fn index_names(s: &mut Settings<'_>, f: &mut JobFile, routing: &IndexRouting) {
    let (index, from) = match &routing.template {
        Some((t, from)) => (t.clone(), from.clone()),
        None => ("{topic}".to_string(), Vec::new()),
    };
    let from_refs: Vec<&str> = from.iter().map(String::as_str).collect();
    f.section("sink.elasticsearch")
        .set("index", index.as_str(), &from_refs)
        .because("Connect names the index after the topic, in lower case");
    let mut mapping: BTreeMap<String, String> = routing.renamed.clone();
    let mut mapping_from: Vec<String> = routing.renamed_from.clone();
    if let Some(m) = s.get("topic.to.external.resource.mapping") {
        for pair in m.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if let Some((topic, index)) = pair.split_once(':') {
                mapping.insert(topic.trim().into(), index.trim().into());
            }
        }
        mapping_from.push("topic.to.external.resource.mapping".into());
    }
    if !mapping.is_empty() {
        let t = mapping
            .into_iter()
            .map(|(k, v)| (k, toml::Value::String(v)))
            .collect();
        let from: Vec<&str> = mapping_from.iter().map(String::as_str).collect();
        f.section("sink.elasticsearch")
            .set("topic_to_index", toml::Value::Table(t), &from);
    }
}

/// `id`, `operation`, `versioning` and `on_null_value` of an index's documents.
fn document_ids_and_write(s: &mut Settings<'_>, f: &mut JobFile, routing: &IndexRouting) {
    let key_ignore = s.flag("key.ignore", false);
    let upsert = s
        .get("write.method")
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("upsert"));
    let es = f.section("sink.elasticsearch");
    if key_ignore {
        es.set("id", "coordinates", &["key.ignore"]);
    } else if let Some((field, from)) = &routing.key_field {
        let mut from: Vec<&str> = from.iter().map(String::as_str).collect();
        from.insert(0, "key.ignore");
        es.set("id", format!("field:/{field}"), &from).because(
            "the key's field names the document: read from the value, or from a JSON key (a delete)",
        );
    } else {
        es.set("id", "key", &["key.ignore"])
            .because("key.ignore = false (Connect's default): the record's key is the document id");
    }
    if upsert {
        es.set("operation", "upsert", &["write.method"]);
    } else {
        es.set("operation", "index", &["write.method"]);
        if !key_ignore
            && s.peek("external.version.header")
                .is_none_or(|h| h.trim().is_empty())
        {
            es.set("versioning", "external", &["key.ignore", "write.method"])
                .because("Connect versions keyed documents by the record's offset, so a replay never regresses one");
        }
    }
    null_values(
        s,
        f,
        key_ignore.then_some("with key.ignore = true no key names the document to delete"),
    );
}

/// Whether the value converter gives records a schema (Connect's JsonConverter does
/// unless `schemas.enable` is false).
fn converter_gives_schemas(s: &Settings<'_>) -> bool {
    let value = s
        .peek("value.converter")
        .map(|c| c.rsplit('.').next().unwrap_or(c));
    match value {
        Some("JsonConverter") | None => s
            .peek("value.converter.schemas.enable")
            .is_none_or(|v| v.trim().eq_ignore_ascii_case("true")),
        Some("AvroConverter" | "ProtobufConverter" | "JsonSchemaConverter") => true,
        _ => false,
    }
}

/// Reports the index mapping Connect makes from the record's schema, which lockgate
/// does not.
fn schema_mapping(s: &mut Settings<'_>, data_stream: bool) {
    // Connect's default (schema.ignore = false) maps the index from the record's
    // schema, when the converter gives one.
    let schemas = converter_gives_schemas(s);
    if s.peek("schema.ignore").is_none() && schemas && !data_stream {
        s.left_out.push((
            "schema.ignore".into(),
            "Kafka Connect's default (false) makes the index mapping from the record's schema; lockgate does not: give it with index_template_file (or set schema.ignore = true)".into(),
        ));
    }
    if s.get("schema.ignore")
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("false"))
    {
        s.left_out.push((
            "schema.ignore".into(),
            "false: Connect makes the index mapping from the record's schema; lockgate does not (give it with index_template_file)".into(),
        ));
    }
}

/// `on_item_error` from `behavior.on.malformed.documents` and the dead-letter topic.
fn item_errors(s: &mut Settings<'_>, f: &mut JobFile) {
    let dlq = s
        .peek("errors.deadletterqueue.topic.name")
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let malformed = s
        .get("behavior.on.malformed.documents")
        .map(|b| b.trim().to_ascii_lowercase());
    let es = f.section("sink.elasticsearch");
    match (malformed.as_deref(), dlq) {
        (Some("warn" | "ignore"), Some(t)) => {
            es.set(
                "on_item_error",
                format!("dead-letter:{t}"),
                &[
                    "behavior.on.malformed.documents",
                    "errors.deadletterqueue.topic.name",
                ],
            )
            .because("Connect drops a document Elasticsearch refuses; lockgate dead-letters it");
        }
        (Some(m @ ("warn" | "ignore")), None) => {
            s.left_out.push((
                "behavior.on.malformed.documents".into(),
                format!("{m}: Connect drops a document Elasticsearch refuses; lockgate never drops one silently: set errors.deadletterqueue.topic.name (on_item_error = \"dead-letter:<topic>\") or keep fail"),
            ));
        }
        // Connect fails the task on a malformed document under `fail`, whatever
        // errors.tolerance says (it also reports it to the DLQ).
        _ => {
            es.set(
                "on_item_error",
                "fail",
                &["behavior.on.malformed.documents"],
            );
        }
    }
}

/// Bulk sizes, in-flight requests, retries, the buffer bound and the request timeout.
fn batching_and_retries(s: &mut Settings<'_>, f: &mut JobFile) {
    let es = f.section("sink.elasticsearch");
    let pairs = [
        ("batch.size", "bulk_max_actions"),
        ("bulk.size.bytes", "bulk_max_bytes"),
        ("max.in.flight.requests", "max_in_flight"),
        ("linger.ms", "bulk_flush_interval_ms"),
        ("max.retries", "retry_max_attempts"),
        ("retry.backoff.ms", "retry_initial_ms"),
    ];
    for (connect, key) in pairs {
        if let Some(n) = int(s.get(connect)) {
            if n < 0 && key == "bulk_max_bytes" {
                // Connect's -1: no byte limit; lockgate keeps its default.
                continue;
            }
            let n = if key == "bulk_flush_interval_ms" {
                n.max(1)
            } else {
                n.max(if key == "retry_max_attempts" { 0 } else { 1 })
            };
            es.set(key, n, &[connect]);
        }
    }
    if let Some(n) = int(s.get("max.buffered.records")) {
        es.set(
            "buffer_max_bytes",
            (n.max(1)) * 1024,
            &["max.buffered.records"],
        )
        .because("records become bytes: 1 KiB each is assumed");
    }
    let read = int(s.get("read.timeout.ms"));
    let connect = int(s.get("connection.timeout.ms"));
    if let Some(t) = read.into_iter().chain(connect).max() {
        let mut from = Vec::new();
        if read.is_some() {
            from.push("read.timeout.ms");
        }
        if connect.is_some() {
            from.push("connection.timeout.ms");
        }
        es.set("request_timeout_ms", t.max(1), &from);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migrate::table::ROWS;

    fn base() -> BTreeMap<String, String> {
        [
            ("connector.class", SINK_CLASSES[0]),
            ("topics", "orders"),
            ("connection.url", "http://es:9200"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    #[test]
    fn which_converters_give_a_schema() {
        let gives = |pairs: &[(&str, &str)]| {
            let all: BTreeMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            converter_gives_schemas(&Settings {
                all: &all,
                used: BTreeSet::new(),
                left_out: Vec::new(),
            })
        };
        assert!(gives(&[]));
        assert!(!gives(&[("value.converter.schemas.enable", "false")]));
        let json = "org.apache.kafka.connect.json.JsonConverter";
        assert!(gives(&[("value.converter", json)]));
        assert!(gives(&[(
            "value.converter",
            "io.confluent.connect.avro.AvroConverter"
        )]));
        let string = "org.apache.kafka.connect.storage.StringConverter";
        assert!(!gives(&[("value.converter", string)]));
    }

    /// Every setting of the table is one the translation reads: none is reported as
    /// unknown, and one the table maps is never reported as untranslated.
    #[test]
    fn the_translation_follows_the_table() {
        let mut failures = Vec::new();
        for row in ROWS {
            let key = row.connect.replace('*', "x");
            let mut config = base();
            let value = match key.as_str() {
                "transforms" | "predicates" => "t",
                "value.converter" | "key.converter" => {
                    "org.apache.kafka.connect.json.JsonConverter"
                }
                "data.stream.type" => "logs",
                k if k.ends_with(".ms") || k.contains("size") || k.contains("max") => "100",
                _ => "true",
            };
            config.insert(key.clone(), value.into());
            if key == "transforms" {
                config.insert(
                    "transforms.t.type".into(),
                    "org.apache.kafka.connect.transforms.Flatten$Value".into(),
                );
            }
            let t = translate(
                &ConnectorConfig {
                    name: Some("c".into()),
                    config,
                },
                &Options::default(),
            );
            let Ok(t) = t else {
                assert_eq!(key, "connector.class", "{key}: {t:?}");
                continue;
            };
            for (k, why) in &t.left_out {
                if why.contains("unknown to the translation")
                    || (*k == key
                        && row.translates()
                        && !row.needs_nothing()
                        && !row.connect.ends_with('*')
                        && why.contains("not translated in this form"))
                {
                    failures.push(format!("{k}: {why}"));
                }
            }
        }
        assert!(failures.is_empty(), "{failures:#?}");
    }

    #[test]
    fn a_setting_no_row_knows_is_reported_and_secrets_are_never_copied() {
        let mut config = base();
        config.insert("connection.username".into(), "writer".into());
        config.insert("connection.password".into(), "s3cret".into());
        config.insert("schema.ignore".into(), "true".into());
        config.insert("made.up".into(), "1".into());
        let opts = Options {
            bootstrap_servers: Some("kafka:9092".into()),
            ..Options::default()
        };
        let t = translate(&ConnectorConfig { name: None, config }, &opts).unwrap();
        assert_eq!(
            t.left_out,
            vec![(
                "made.up".to_string(),
                "unknown to the translation (no lockgate equivalent)".to_string()
            )]
        );
        let text = t.job.render("");
        assert!(
            !text.contains("s3cret") && text.contains("${ES_PASSWORD}"),
            "{text}"
        );
    }
}
