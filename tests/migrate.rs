//! `lockgate migrate kafka-connect`: real connector configurations (the Elasticsearch
//! sink's quickstart and documentation examples, Debezium's Elasticsearch tutorial)
//! translated by the binary, loaded by lockgate's loader (`--check`), each setting
//! without an equivalent reported with its reason; the README's table is the command's;
//! and a migrated job (Avro, two transforms, a dead-letter queue) continues from the
//! offset the connector's consumer group committed.

mod common;

use common::es::Es;
use common::kafka::KafkaProcess;
use common::{bin, tail, wait_timeout};
use std::path::Path;
use std::process::Command;

/// Runs the command on `config` (written to `dir`; the cluster `kafka-1:9092` unless
/// `extra` names one); returns the exit code, the job file and stderr.
fn migrate(dir: &Path, name: &str, config: &str, extra: &[&str]) -> (Option<i32>, String, String) {
    let input = dir.join(name);
    std::fs::write(&input, config).unwrap();
    let out = dir.join(format!("{name}.toml"));
    let _ = std::fs::remove_file(&out);
    let cluster: &[&str] = if extra.contains(&"--bootstrap-servers") {
        &[]
    } else {
        &["--bootstrap-servers", "kafka-1:9092"]
    };
    let o = Command::new(bin())
        .args(["migrate", "kafka-connect"])
        .arg(&input)
        .arg("--out")
        .arg(&out)
        .args(["--check", "--checkpoint-dir", "checkpoints"])
        .args(cluster)
        .args(extra)
        .output()
        .unwrap();
    let job = std::fs::read_to_string(&out).unwrap_or_default();
    (
        o.status.code(),
        job,
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The settings stderr reports as left out.
fn left_out(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("left out: "))
        .map(|l| l.split(": ").next().unwrap().to_string())
        .collect()
}

fn toml_of(job: &str) -> toml::Value {
    toml::from_str(job).unwrap()
}

/// Kafka Connect Elasticsearch's quickstart (`quickstart-elasticsearch.properties`).
const QUICKSTART: &str = "name=elasticsearch-sink
connector.class=io.confluent.connect.elasticsearch.ElasticsearchSinkConnector
tasks.max=1
topics=test-elasticsearch-sink
key.ignore=true
connection.url=http://localhost:9200
type.name=kafka-connect
";

/// The REST form that Kafka Connect tutorials post (verbatim), JSON values without
/// the worker's converter settings.
const TUTORIAL_REST: &str = r#"{"name":"elasticsearch-sink","config":{"connector.class":"io.confluent.connect.elasticsearch.ElasticsearchSinkConnector","tasks.max":"1","topics":"simple.elasticsearch.data","key.ignore":"true","schema.ignore":"true","connection.url":"http://elasticsearch:9200","type.name":"_doc","name":"elasticsearch-sink"}}"#;

/// A public MySQL CDC tutorial's sink (verbatim): Avro through the Schema Registry,
/// Debezium's unwrap with deletes rewritten.
const CDC_AVRO: &str = r#"{
  "name": "elasticsearch-users-cdc-sink",
  "config": {
    "connector.class": "io.confluent.connect.elasticsearch.ElasticsearchSinkConnector",
    "tasks.max": "1",
    "topics": "dbserver1.demo.users_os",
    "connection.url": "http://elasticsearch:9200",
    "type.name": "_doc",
    "schema.ignore": "true",
    "key.ignore": "true",
    "behavior.on.null.values": "ignore",
    "write.method": "insert",
    "max.in.flight.requests": "1",
    "key.converter": "io.confluent.connect.avro.AvroConverter",
    "key.converter.schema.registry.url": "http://schema-registry:8081",
    "value.converter": "io.confluent.connect.avro.AvroConverter",
    "value.converter.schema.registry.url": "http://schema-registry:8081",
    "transforms": "unwrap",
    "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
    "transforms.unwrap.drop.tombstones": "true",
    "transforms.unwrap.delete.handling.mode": "rewrite"
  }
}"#;

/// A production-shaped configuration (secured, Avro, a dead-letter queue, consumer
/// overrides, routers): written for this test, every setting one of the connector's.
const DOCS_AVRO: &str = r#"{
  "name": "orders-es",
  "config": {
    "connector.class": "io.confluent.connect.elasticsearch.ElasticsearchSinkConnector",
    "tasks.max": "4",
    "topics": "orders,returns",
    "connection.url": "https://es-1:9200,https://es-2:9200",
    "connection.username": "connect",
    "connection.password": "hunter2-never-copied",
    "key.ignore": "false",
    "write.method": "upsert",
    "behavior.on.null.values": "delete",
    "behavior.on.malformed.documents": "warn",
    "batch.size": "2000",
    "max.in.flight.requests": "5",
    "linger.ms": "50",
    "flush.timeout.ms": "180000",
    "max.retries": "8",
    "retry.backoff.ms": "250",
    "read.timeout.ms": "15000",
    "connection.timeout.ms": "5000",
    "errors.tolerance": "all",
    "errors.deadletterqueue.topic.name": "orders-dlq",
    "errors.deadletterqueue.context.headers.enable": "true",
    "key.converter": "org.apache.kafka.connect.storage.StringConverter",
    "value.converter": "io.confluent.connect.avro.AvroConverter",
    "value.converter.schema.registry.url": "https://registry:8081",
    "value.converter.basic.auth.credentials.source": "USER_INFO",
    "value.converter.basic.auth.user.info": "connect:registry-secret-never-copied",
    "consumer.override.max.poll.records": "500",
    "consumer.override.fetch.max.wait.ms": "200",
    "consumer.override.security.protocol": "SASL_SSL",
    "consumer.override.sasl.mechanism": "SCRAM-SHA-512",
    "consumer.override.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required username=\"connect\" password=\"kafka-secret-never-copied\";",
    "topic.to.external.resource.mapping": "returns:returns-v2",
    "transforms": "route,stamp",
    "transforms.route.type": "org.apache.kafka.connect.transforms.RegexRouter",
    "transforms.route.regex": "(.*)",
    "transforms.route.replacement": "shop-$1",
    "transforms.stamp.type": "org.apache.kafka.connect.transforms.InsertField$Value",
    "transforms.stamp.timestamp.field": "indexed_at",
    "transforms.stamp.static.field": "source",
    "transforms.stamp.static.value": "connect"
  }
}"#;

/// Debezium's Elasticsearch tutorial (`debezium-examples/unwrap-smt/es-sink.json`).
const DEBEZIUM: &str = r#"{
    "name": "elastic-sink",
    "config": {
        "connector.class": "io.confluent.connect.elasticsearch.ElasticsearchSinkConnector",
        "tasks.max": "1",
        "topics": "customers",
        "connection.url": "http://elastic:9200",
        "transforms": "unwrap,key",
        "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
        "transforms.unwrap.drop.tombstones": "false",
        "transforms.key.type": "org.apache.kafka.connect.transforms.ExtractField$Key",
        "transforms.key.field": "id",
        "key.ignore": "false",
        "type.name": "customer",
        "behavior.on.null.values": "delete"
    }
}"#;

/// A data stream, a time router and settings without an equivalent.
const DATA_STREAM: &str = r#"{
  "name": "logs-es",
  "config": {
    "connector.class": "io.confluent.connect.elasticsearch.ElasticsearchSinkConnector",
    "topics": "app-logs",
    "connection.url": "http://es:9200",
    "data.stream.type": "LOGS",
    "data.stream.dataset": "app",
    "data.stream.timestamp.field": "ts,time",
    "external.version.header": "version",
    "schema.ignore": "false",
    "elastic.https.ssl.truststore.location": "/etc/truststore.jks",
    "value.converter": "org.apache.kafka.connect.json.JsonConverter",
    "transforms": "only_errors",
    "transforms.only_errors.type": "org.apache.kafka.connect.transforms.Filter",
    "transforms.only_errors.predicate": "is_debug",
    "transforms.only_errors.negate": "false",
    "predicates": "is_debug",
    "predicates.is_debug.type": "org.apache.kafka.connect.transforms.predicates.HasHeaderKey",
    "predicates.is_debug.name": "debug"
  }
}"#;

#[test]
fn real_configurations_translate_load_and_report_what_has_no_equivalent() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();

    let (code, job, err) = migrate(dir, "quickstart.properties", QUICKSTART, &[]);
    // The worker's JSON converter gives schemas, from which Connect maps the index.
    assert_eq!(code, Some(3), "{err}\n{job}");
    assert_eq!(left_out(&err), vec!["schema.ignore".to_string()], "{err}");
    assert!(err.contains("checked: the job file loads"), "{err}");
    let t = toml_of(&job);
    assert_eq!(t["job"]["name"].as_str(), Some("elasticsearch-sink"));
    assert_eq!(
        t["source"]["kafka"]["topics"][0].as_str(),
        Some("test-elasticsearch-sink")
    );
    assert_eq!(
        t["source"]["kafka"]["group_id"].as_str(),
        Some("connect-elasticsearch-sink")
    );
    assert_eq!(
        t["source"]["kafka"]["startup"].as_str(),
        Some("group-offsets")
    );
    assert_eq!(
        t["sink"]["elasticsearch"]["id"].as_str(),
        Some("coordinates")
    );
    assert_eq!(
        t["sink"]["elasticsearch"]["index"].as_str(),
        Some("{topic}")
    );
    assert!(
        job.contains("# from key.ignore\nid = \"coordinates\""),
        "{job}"
    );

    let (code, job, err) = migrate(dir, "tutorial.json", TUTORIAL_REST, &[]);
    assert_eq!(code, Some(0), "{err}\n{job}");
    let t = toml_of(&job);
    assert_eq!(t["source"]["kafka"]["format"].as_str(), Some("json"));
    assert_eq!(
        t["sink"]["elasticsearch"]["id"].as_str(),
        Some("coordinates")
    );

    let (code, job, err) = migrate(dir, "cdc.json", CDC_AVRO, &[]);
    assert_eq!(code, Some(0), "{err}\n{job}");
    let t = toml_of(&job);
    assert_eq!(t["source"]["kafka"]["format"].as_str(), Some("avro"));
    assert!(
        t["source"]["kafka"].get("key_format").is_none(),
        "keys are ignored"
    );
    assert_eq!(
        t["source"]["kafka"]["schema_registry"]["url"].as_str(),
        Some("http://schema-registry:8081")
    );
    assert_eq!(
        t["transform"][0]["delete_handling"].as_str(),
        Some("rewrite")
    );
    assert_eq!(
        t["sink"]["elasticsearch"]["on_null_value"].as_str(),
        Some("skip")
    );
    assert_eq!(
        t["sink"]["elasticsearch"]["max_in_flight"].as_integer(),
        Some(1)
    );

    let (code, job, err) = migrate(
        dir,
        "avro.json",
        DOCS_AVRO,
        &["--bootstrap-servers", "kafka-1:9093"],
    );
    assert_eq!(code, Some(3), "{err}\n{job}");
    let mut reported = left_out(&err);
    reported.sort();
    assert_eq!(
        reported,
        vec![
            "consumer.override.max.poll.records".to_string(),
            "schema.ignore".to_string()
        ],
        "{err}"
    );
    for secret in ["hunter2", "registry-secret", "kafka-secret"] {
        assert!(
            !job.contains(secret) && !err.contains(secret),
            "{secret} was copied"
        );
    }
    let t = toml_of(&job);
    let src = &t["source"]["kafka"];
    let es = &t["sink"]["elasticsearch"];
    assert_eq!(t["job"]["parallelism"].as_integer(), Some(4));
    assert_eq!(t["checkpoint"]["timeout_ms"].as_integer(), Some(180_000));
    assert_eq!(src["bootstrap_servers"].as_str(), Some("kafka-1:9093"));
    assert_eq!(src["format"].as_str(), Some("avro"));
    assert!(
        src.get("key_format").is_none(),
        "StringConverter keys pass as they are"
    );
    assert_eq!(
        src["on_decode_error"].as_str(),
        Some("dead-letter:orders-dlq")
    );
    assert_eq!(
        src["schema_registry"]["url"].as_str(),
        Some("https://registry:8081")
    );
    assert_eq!(src["schema_registry"]["username"].as_str(), Some("connect"));
    assert_eq!(
        src["schema_registry"]["password"].as_str(),
        Some("${REGISTRY_PASSWORD}")
    );
    let props = &src["properties"];
    assert_eq!(props["fetch.wait.max.ms"].as_str(), Some("200"));
    assert_eq!(props["sasl.mechanisms"].as_str(), Some("SCRAM-SHA-512"));
    assert_eq!(props["sasl.username"].as_str(), Some("connect"));
    assert_eq!(props["sasl.password"].as_str(), Some("${KAFKA_PASSWORD}"));
    assert_eq!(es["urls"].as_array().unwrap().len(), 2);
    assert_eq!(es["username"].as_str(), Some("connect"));
    assert_eq!(es["password"].as_str(), Some("${ES_PASSWORD}"));
    assert_eq!(es["id"].as_str(), Some("key"));
    assert_eq!(es["operation"].as_str(), Some("upsert"));
    assert!(es.get("versioning").is_none(), "upserts are not versioned");
    assert_eq!(es["on_null_value"].as_str(), Some("delete"));
    assert_eq!(es["on_item_error"].as_str(), Some("dead-letter:orders-dlq"));
    assert_eq!(es["bulk_max_actions"].as_integer(), Some(2000));
    assert_eq!(es["max_in_flight"].as_integer(), Some(5));
    assert_eq!(es["bulk_flush_interval_ms"].as_integer(), Some(50));
    assert_eq!(es["retry_max_attempts"].as_integer(), Some(8));
    assert_eq!(es["retry_initial_ms"].as_integer(), Some(250));
    assert_eq!(es["request_timeout_ms"].as_integer(), Some(15_000));
    // RegexRouter over the listed topics, then the explicit mapping.
    assert_eq!(es["index"].as_str(), Some("{topic}"));
    assert_eq!(es["topic_to_index"]["orders"].as_str(), Some("shop-orders"));
    assert_eq!(es["topic_to_index"]["returns"].as_str(), Some("returns-v2"));
    let transform = &t["transform"][0];
    assert_eq!(transform["type"].as_str(), Some("insert_field"));
    assert_eq!(transform["static"]["source"].as_str(), Some("connect"));
    assert_eq!(transform["timestamp_field"].as_str(), Some("indexed_at"));
    for var in ["ES_PASSWORD", "REGISTRY_PASSWORD", "KAFKA_PASSWORD"] {
        assert!(err.contains(&format!("note: set {var}")), "{var}: {err}");
    }
    assert!(err.contains("stop the connector first"), "{err}");

    let (code, job, err) = migrate(dir, "debezium.json", DEBEZIUM, &[]);
    assert_eq!(code, Some(3), "{err}\n{job}");
    assert_eq!(left_out(&err), vec!["schema.ignore".to_string()], "{err}");
    assert!(
        err.contains("Debezium 3.x turns them into tombstones"),
        "{err}"
    );
    let t = toml_of(&job);
    let d = &t["transform"][0];
    assert_eq!(d["type"].as_str(), Some("debezium"));
    assert_eq!(d["delete_handling"].as_str(), Some("drop"));
    assert_eq!(d["drop_tombstones"].as_bool(), Some(false));
    assert_eq!(t["sink"]["elasticsearch"]["id"].as_str(), Some("field:/id"));
    assert_eq!(
        t["sink"]["elasticsearch"]["on_null_value"].as_str(),
        Some("delete")
    );
    assert_eq!(
        t["transform"].as_array().unwrap().len(),
        1,
        "ExtractField$Key became the id"
    );

    let (code, job, err) = migrate(dir, "stream.json", DATA_STREAM, &[]);
    assert_eq!(code, Some(3), "{err}\n{job}");
    assert!(
        job.is_empty(),
        "settings that change records are left out: {job}"
    );
    let (code, job, err) = migrate(dir, "stream.json", DATA_STREAM, &["--allow-left-out"]);
    assert_eq!(code, Some(3), "{err}\n{job}");
    assert!(
        err.contains("checked: the job file loads with --allow-left-out"),
        "{err}"
    );
    let mut reported = left_out(&err);
    reported.sort();
    assert_eq!(
        reported,
        vec![
            "data.stream.timestamp.field",
            "elastic.https.ssl.truststore.location",
            "external.version.header",
            "key.ignore",
            "schema.ignore",
        ],
        "{err}"
    );
    assert!(err.contains("not by a header"), "{err}");
    assert!(err.contains("keytool"), "{err}");
    let t = toml_of(&job);
    let es = &t["sink"]["elasticsearch"];
    assert_eq!(es["data_stream"]["type"].as_str(), Some("logs"));
    assert_eq!(es["data_stream"]["namespace"].as_str(), Some("{topic}"));
    assert_eq!(es["timestamp_field"].as_str(), Some("/ts"));
    assert_eq!(
        t["source"]["kafka"]["connect_envelope"].as_bool(),
        Some(true)
    );
    let f = &t["transform"][0];
    assert_eq!(
        (f["type"].as_str(), f["has_header"].as_str()),
        (Some("filter"), Some("debug"))
    );
}

#[test]
fn foreign_or_broken_configurations_exit_2_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let jdbc = r#"{"name": "jdbc", "config": {"connector.class": "io.confluent.connect.jdbc.JdbcSinkConnector", "topics": "x"}}"#;
    let (code, _, err) = migrate(tmp.path(), "jdbc.json", jdbc, &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("jdbc.json") && err.contains("JdbcSinkConnector"),
        "{err}"
    );
    let (code, _, err) = migrate(tmp.path(), "broken.json", "{\"name\": ", &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("broken.json") && err.contains("not JSON"),
        "{err}"
    );
}

#[test]
fn the_readmes_mapping_table_is_the_commands() {
    let o = Command::new(bin())
        .args(["migrate", "kafka-connect", "--table"])
        .output()
        .unwrap();
    assert!(o.status.success());
    let table = String::from_utf8(o.stdout).unwrap();
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let block = readme
        .split("<!-- kafka-connect-table -->\n")
        .nth(1)
        .and_then(|b| b.split("<!-- /kafka-connect-table -->").next())
        .expect("the README's kafka-connect-table block");
    assert_eq!(
        block, table,
        "regenerate with lockgate migrate kafka-connect --table"
    );
}

#[test]
fn a_migrated_job_continues_from_the_connectors_committed_offset() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Offset, TopicPartitionList};
    let kafka = KafkaProcess::start(&[("orders", 1), ("orders-dlq", 1)]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let registry = rt
        .block_on(lockgate::testkit::schema_registry::SchemaRegistry::start(
            "127.0.0.1:0".parse().unwrap(),
        ))
        .unwrap();
    lockgate::testkit::kafka::produce_orders_avro(
        &kafka.bootstrap,
        "orders",
        (0, 1_000, 50),
        lockgate::testkit::kafka::OrderKey::User,
        registry.url(),
    )
    .unwrap();
    // The connector's group stopped at offset 400.
    let c: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &kafka.bootstrap)
        .set("group.id", "connect-orders-es")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("orders", 0, Offset::Offset(400))
        .unwrap();
    c.commit(&tpl, rdkafka::consumer::CommitMode::Sync).unwrap();
    drop(c);
    let es = Es::testkit();
    let config = format!(
        r#"{{"name": "orders-es", "config": {{
            "connector.class": "io.confluent.connect.elasticsearch.ElasticsearchSinkConnector",
            "topics": "orders", "connection.url": "{}", "key.ignore": "true", "schema.ignore": "true",
            "key.converter": "io.confluent.connect.avro.AvroConverter",
            "key.converter.schema.registry.url": "{reg}",
            "value.converter": "io.confluent.connect.avro.AvroConverter",
            "value.converter.schema.registry.url": "{reg}",
            "errors.tolerance": "all", "errors.deadletterqueue.topic.name": "orders-dlq",
            "transforms": "stamp,wrapkey,trim",
            "transforms.stamp.type": "org.apache.kafka.connect.transforms.InsertField$Value",
            "transforms.stamp.static.field": "migrated", "transforms.stamp.static.value": "yes",
            "transforms.wrapkey.type": "org.apache.kafka.connect.transforms.HoistField$Key",
            "transforms.wrapkey.field": "k",
            "transforms.trim.type": "org.apache.kafka.connect.transforms.ReplaceField$Value",
            "transforms.trim.exclude": "ts"
        }}}}"#,
        es.url(),
        reg = registry.url()
    );
    let tmp = tempfile::tempdir().unwrap();
    // HoistField$Key has no lockgate transform; the keys are ignored here, so the
    // documents are the connector's, and the user says so twice: to migrate and to run.
    let (code, job, err) = migrate(
        tmp.path(),
        "orders-es.json",
        &config,
        &["--bootstrap-servers", &kafka.bootstrap, "--allow-left-out"],
    );
    assert_eq!(code, Some(3), "{err}\n{job}");
    assert_eq!(left_out(&err), vec!["transforms.wrapkey.type"], "{err}");
    // The connector runs forever; the test's job ends at the topic's end.
    let mut t = toml_of(&job);
    t["source"]["kafka"]
        .as_table_mut()
        .unwrap()
        .insert("bounded".into(), toml::Value::String("latest".into()));
    let path = tmp.path().join("job.toml");
    std::fs::write(&path, toml::to_string(&t).unwrap()).unwrap();
    let refused = Command::new(bin())
        .args(["run", "--config"])
        .arg(&path)
        .current_dir(tmp.path())
        .output()
        .unwrap();
    let refusal = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{refusal}");
    assert!(
        refusal.contains("job.left_out") && refusal.contains("transforms.wrapkey.type"),
        "{refusal}"
    );
    assert_eq!(es.count("orders"), 0, "a refused file writes nothing");
    let log = tmp.path().join("job.log");
    let mut child = Command::new(bin())
        .args(["run", "--allow-left-out", "--config"])
        .arg(&path)
        .current_dir(tmp.path())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::options().append(true).open(&log).unwrap())
        .spawn()
        .unwrap();
    let status = wait_timeout(&mut child, common::wait::DEADLINE);
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(0), "{}", tail(&text, 30));
    assert_eq!(
        es.count("orders"),
        600,
        "exactly the records after offset 400"
    );
    let ids: Vec<String> = (0..1_000).map(|o| format!("orders-0-{o}")).collect();
    let docs = es.get_many("orders", &ids);
    let offsets: Vec<i64> = docs
        .iter()
        .map(|(id, _, _)| id.rsplit('-').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(offsets.iter().min(), Some(&400));
    assert_eq!(offsets.iter().max(), Some(&999));
    for (_, doc, _) in &docs {
        assert_eq!(doc["migrated"], "yes", "{doc}");
        assert!(doc.get("ts").is_none(), "{doc}");
        assert!(doc.get("order").is_some(), "{doc}");
    }
}

#[test]
fn secrets_providers_deletes_versions_and_routers_are_never_translated_wrongly() {
    let tmp = tempfile::tempdir().unwrap();
    let config = r#"{"name": "edge", "config": {
        "connector.class": "io.confluent.connect.elasticsearch.ElasticsearchSinkConnector",
        "topics": "orders",
        "connection.url": "https://elastic:URLSECRET1@es-1:9200,es-2:9200",
        "schema.ignore": "true",
        "value.converter": "io.confluent.connect.avro.AvroConverter",
        "value.converter.schema.registry.url": "https://reg:REGSECRET2@registry:8081",
        "value.converter.basic.auth.credentials.source": "URL",
        "behavior.on.null.values": "ignore",
        "external.version.header": "version",
        "consumer.override.sasl.jaas.config": "${file:/etc/kafka/secrets.properties:jaas}",
        "consumer.override.client.id": "${env:CLIENT_ID}",
        "connection.username": "${file:/etc/es.properties:user}",
        "transforms": "unwrap,ts,route",
        "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
        "transforms.unwrap.delete.tombstone.handling.mode": "tombstone",
        "transforms.unwrap.field.syntax.version": "V2",
        "transforms.ts.type": "org.apache.kafka.connect.transforms.TimestampRouter",
        "transforms.route.type": "org.apache.kafka.connect.transforms.RegexRouter",
        "transforms.route.regex": "(.*)",
        "transforms.route.replacement": "x-$1"
    }}"#;
    let (code, job, err) = migrate(tmp.path(), "edge.json", config, &["--allow-left-out"]);
    assert_eq!(code, Some(3), "{err}\n{job}");
    for secret in [
        "URLSECRET1",
        "REGSECRET2",
        "secrets.properties",
        "es.properties",
    ] {
        assert!(
            !job.contains(secret) && !err.contains(secret),
            "{secret}: {job}{err}"
        );
    }
    let t = toml_of(&job);
    let es = &t["sink"]["elasticsearch"];
    assert_eq!(es["urls"][0].as_str(), Some("https://es-1:9200"));
    assert_eq!(
        es["urls"][1].as_str(),
        Some("http://es-2:9200"),
        "Connect's host:port is http"
    );
    assert_eq!(es["username"].as_str(), Some("elastic"));
    assert_eq!(es["password"].as_str(), Some("${ES_PASSWORD}"));
    let reg = &t["source"]["kafka"]["schema_registry"];
    assert_eq!(reg["url"].as_str(), Some("https://registry:8081"));
    assert_eq!(reg["username"].as_str(), Some("reg"));
    assert_eq!(reg["password"].as_str(), Some("${REGISTRY_PASSWORD}"));
    assert_eq!(
        t["source"]["kafka"]["properties"]["client.id"].as_str(),
        Some("${CLIENT_ID}"),
        "${{env:X}} is lockgate's ${{X}}"
    );
    // A header-versioned index is written without offset versions.
    assert!(es.get("versioning").is_none(), "{job}");
    // Deletes become tombstones, which behavior.on.null.values = ignore skips.
    assert_eq!(t["transform"][0]["delete_handling"].as_str(), Some("drop"));
    let mut reported = left_out(&err);
    reported.sort();
    assert_eq!(
        reported,
        vec![
            "connection.username",
            "consumer.override.sasl.jaas.config",
            "external.version.header",
            "transforms.route.type",
            "transforms.ts.type",
            "transforms.unwrap.field.syntax.version",
        ],
        "{err}"
    );
    assert!(err.contains("routers in this order"), "{err}");
    assert!(
        err.contains("connection.username: a `file` config provider reference"),
        "{err}"
    );
    assert!(err.contains("JAAS"), "{err}");
}

/// A transform in the middle of a chain that lockgate does not have, and a cluster the
/// connector's configuration cannot name, make no job file (stdout or `--out`) unless
/// `--allow-left-out` is given; then the file marks the missing step between its
/// neighbours and lists it under `[job] left_out`, and `lockgate run` refuses that
/// file (exit 2, naming the file, the key and the steps) unless told the same.
#[test]
fn a_step_left_out_of_the_chain_writes_no_runnable_job_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let config = r#"{"name": "orders-es", "config": {
        "connector.class": "io.confluent.connect.elasticsearch.ElasticsearchSinkConnector",
        "topics": "orders", "connection.url": "http://es:9200",
        "key.ignore": "true", "schema.ignore": "true",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "false",
        "transforms": "stamp,wrap,trim",
        "transforms.stamp.type": "org.apache.kafka.connect.transforms.InsertField$Value",
        "transforms.stamp.static.field": "migrated", "transforms.stamp.static.value": "yes",
        "transforms.wrap.type": "org.apache.kafka.connect.transforms.HoistField$Value",
        "transforms.wrap.field": "order",
        "transforms.trim.type": "org.apache.kafka.connect.transforms.ReplaceField$Value",
        "transforms.trim.exclude": "ts"
    }}"#;
    // Without the opt-in: no file, exit 3, and stderr says why.
    let (code, job, err) = migrate(dir, "chain.json", config, &[]);
    assert_eq!(code, Some(3), "{err}");
    assert!(job.is_empty(), "{job}");
    assert!(!dir.join("chain.json.toml").exists());
    assert!(
        err.contains("no job file written") && err.contains("transforms.wrap.type"),
        "{err}"
    );
    // Nor on stdout.
    let o = Command::new(bin())
        .args(["migrate", "kafka-connect"])
        .arg(dir.join("chain.json"))
        .args(["--bootstrap-servers", "kafka-1:9092"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3));
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );

    // The cluster: without --bootstrap-servers it is left out too.
    let full = config.replace("stamp,wrap,trim", "stamp,trim").replace(
        "\"transforms.wrap.type\": \"org.apache.kafka.connect.transforms.HoistField$Value\",\n        \"transforms.wrap.field\": \"order\",\n",
        "",
    );
    assert!(!full.contains("wrap"), "{full}");
    let o = Command::new(bin())
        .args(["migrate", "kafka-connect"])
        .arg({
            std::fs::write(dir.join("full.json"), &full).unwrap();
            dir.join("full.json")
        })
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert_eq!(left_out(&err), vec!["bootstrap.servers"], "{err}");
    let (code, _, err) = migrate(dir, "full.json", &full, &[]);
    assert_eq!(
        code,
        Some(0),
        "with --bootstrap-servers everything translates: {err}"
    );

    // With the opt-in: the file, the mark in the chain's place, the list.
    let (code, job, err) = migrate(dir, "chain.json", config, &["--allow-left-out"]);
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("checked: the job file loads with --allow-left-out"),
        "{err}"
    );
    let stamp = job.find("\"insert_field\"").expect("insert_field");
    let mark = job
        .find("# LEFT OUT: transforms.wrap.type: transform wrap (org.apache.kafka.connect.transforms.HoistField$Value)")
        .unwrap_or_else(|| panic!("the mark: {job}"));
    let trim = job.find("\"replace_field\"").expect("replace_field");
    assert!(stamp < mark && mark < trim, "{job}");
    let t = toml_of(&job);
    assert_eq!(
        t["job"]["left_out"],
        toml::Value::Array(vec!["transforms.wrap.type".into()])
    );
    // lockgate run refuses it before anything starts.
    let path = dir.join("chain.json.toml");
    let o = Command::new(bin())
        .args(["run", "--config"])
        .arg(&path)
        .current_dir(dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&path.display().to_string())
            && err.contains("job.left_out")
            && err.contains("transforms.wrap.type")
            && err.contains("--allow-left-out"),
        "{err}"
    );
}
