//! The cost of Avro against the JSON path, in the same run (alternating rounds,
//! medians):
//!
//! 1. per record: decoding an Avro record to JSON against the JSON path's check of
//!    the same record already in JSON;
//! 2. the Kafka source into a discarding sink: a topic of Confluent-framed Avro records
//!    (their schema from the Schema Registry test server) against a topic of the same
//!    records in JSON, records per second; and how many schema lookups each Avro job
//!    made (one per subtask: the cache makes the registry's cost per record zero after
//!    the first).
//!
//! The record: 10 fields with a decimal, a timestamp, a union, an enum, a nested record,
//! a map and an array, as Schema Registry producers write orders.
//! `cargo bench --bench avro_decode` prints it alone (about a minute); the report
//! includes it.

use apache_avro::types::Value;
use lockgate::formats::avro::{AvroDecoder, Temporal};
use std::time::Instant;

const RECORDS: usize = 200_000;
const ROUNDS: usize = 5;

pub const SCHEMA: &str = r#"{
  "type": "record", "name": "Order", "namespace": "shop",
  "fields": [
    {"name": "id", "type": "long"},
    {"name": "user", "type": "string"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "note", "type": ["null", "string"]},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
    {"name": "paid", "type": "boolean"},
    {"name": "address", "type": {"type": "record", "name": "Address", "fields": [
      {"name": "city", "type": "string"}, {"name": "zip", "type": "string"}]}},
    {"name": "tags", "type": {"type": "map", "values": "string"}},
    {"name": "items", "type": {"type": "array", "items": "long"}}
  ]
}"#;

pub fn order(i: usize) -> Value {
    Value::Record(vec![
        ("id".into(), Value::Long(i as i64)),
        ("user".into(), Value::String(format!("user-{}", i % 1000))),
        (
            "amount".into(),
            Value::Decimal(apache_avro::Decimal::from(
                (509_461 + i as i64).to_be_bytes().to_vec(),
            )),
        ),
        (
            "at".into(),
            Value::TimestampMillis(1_700_000_000_000 + i as i64),
        ),
        (
            "note".into(),
            if i.is_multiple_of(2) {
                Value::Union(0, Box::new(Value::Null))
            } else {
                Value::Union(1, Box::new(Value::String("leave at the door".into())))
            },
        ),
        ("status".into(), Value::Enum(1, "PAID".into())),
        ("paid".into(), Value::Boolean(true)),
        (
            "address".into(),
            Value::Record(vec![
                ("city".into(), Value::String("Lyon".into())),
                ("zip".into(), Value::String("69001".into())),
            ]),
        ),
        (
            "tags".into(),
            Value::Map(
                [("channel".to_string(), Value::String("web".into()))]
                    .into_iter()
                    .collect(),
            ),
        ),
        (
            "items".into(),
            Value::Array(vec![Value::Long(1), Value::Long(2), Value::Long(3)]),
        ),
    ])
}

/// Records per topic of the source comparison, over `PARTITIONS` partitions (the
/// embedded cluster keeps at most 100k records or 5 MiB per partition: about 2.7 MiB
/// of JSON each here).
const SOURCE_RECORDS: usize = 600_000;
const PARTITIONS: i32 = 48;

/// Produces `payloads` round robin over the partitions of `topic`.
fn produce(bootstrap: &str, topic: &str, payloads: impl Iterator<Item = Vec<u8>>) {
    produce_to(bootstrap, topic, PARTITIONS, payloads)
}

/// Produces `payloads` round robin over the `partitions` partitions of `topic`.
pub fn produce_to(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    payloads: impl Iterator<Item = Vec<u8>>,
) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let p: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .expect("producer");
    for (i, payload) in payloads.enumerate() {
        let part = (i % partitions as usize) as i32;
        while p
            .send(
                BaseRecord::<(), _>::to(topic)
                    .partition(part)
                    .payload(&payload),
            )
            .is_err()
        {
            p.poll(std::time::Duration::from_millis(5));
        }
    }
    p.flush(std::time::Duration::from_secs(300)).expect("flush");
}

/// The Kafka source over the Avro topic against the JSON topic: (JSON records/s, Avro
/// records/s, schema lookups of the last Avro job).
fn source_comparison(schema: &apache_avro::Schema, decoder: &AvroDecoder) -> (f64, f64, u64) {
    use lockgate::connectors::kafka::{KafkaSourceConfig, TopicSelector};
    use lockgate::formats::avro_format::{AvroCodec, AvroFormat};
    use lockgate::formats::registry::{RegistryClient, Retry};
    use lockgate::formats::FormatRef;
    use std::sync::Arc;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let registry = rt
        .block_on(lockgate::testkit::schema_registry::SchemaRegistry::start(
            "127.0.0.1:0".parse().expect("address"),
        ))
        .expect("registry");
    let id = registry.register("orders-avro-value", SCHEMA, "AVRO");
    let kafka = lockgate::testkit::kafka::EmbeddedKafka::start(
        3,
        &[
            ("orders-json".into(), PARTITIONS),
            ("orders-avro".into(), PARTITIONS),
        ],
    )
    .expect("embedded Kafka");
    let bootstrap = kafka.bootstrap_servers();
    let datum = |i: usize| apache_avro::to_avro_datum(schema, order(i)).expect("encode");
    produce(
        bootstrap,
        "orders-json",
        (0..SOURCE_RECORDS).map(|i| decoder.to_json(&datum(i)).expect("decode")),
    );
    produce(
        bootstrap,
        "orders-avro",
        (0..SOURCE_RECORDS).map(|i| {
            let mut framed = vec![0];
            framed.extend_from_slice(&id.to_be_bytes());
            framed.extend(datum(i));
            framed
        }),
    );
    let (mut json, mut avro) = (Vec::new(), Vec::new());
    let mut lookups = 0;
    for round in 0..ROUNDS {
        let cfg = |topic: &str| {
            KafkaSourceConfig::new(bootstrap, TopicSelector::List(vec![topic.into()]), "bench")
        };
        let json_rate =
            || super::source::source_rate(cfg("orders-json"), &rt, 1, SOURCE_RECORDS as u64);
        let mut avro_rate = || {
            let before = registry.lookups_by_id();
            let client = RegistryClient::new(
                reqwest::Client::new(),
                vec![registry.url().to_string()],
                Retry::default(),
            );
            let mut c = cfg("orders-avro");
            c.format = FormatRef::new(AvroFormat::framed(
                AvroCodec::new(Temporal::EpochMillis, None).expect("codec"),
                Arc::new(client),
            ));
            let rate = super::source::source_rate(c, &rt, 1, SOURCE_RECORDS as u64);
            lookups = registry.lookups_by_id() - before;
            rate
        };
        if round % 2 == 0 {
            json.push(json_rate());
            avro.push(avro_rate());
        } else {
            avro.push(avro_rate());
            json.push(json_rate());
        }
        eprintln!(
            "round {round}: Kafka source, JSON {:.0} records/s, Avro {:.0} records/s ({lookups} schema lookups)",
            json[round], avro[round]
        );
    }
    (super::median(json), super::median(avro), lookups)
}

/// Runs both comparisons and returns the JSON report.
pub fn measure() -> serde_json::Value {
    let decoder = AvroDecoder::parse(SCHEMA, Temporal::EpochMillis).expect("schema");
    let schema = apache_avro::Schema::parse_str(SCHEMA).expect("schema");
    let datums: Vec<Vec<u8>> = (0..RECORDS)
        .map(|i| apache_avro::to_avro_datum(&schema, order(i)).expect("encode"))
        .collect();
    // The same records as the JSON path receives them: what the decoder writes.
    let jsons: Vec<Vec<u8>> = datums
        .iter()
        .map(|d| decoder.to_json(d).expect("decode"))
        .collect();
    let (mut avro, mut json) = (Vec::new(), Vec::new());
    let time_avro = || {
        let start = Instant::now();
        let mut bytes = 0;
        for d in &datums {
            bytes += decoder.to_json(d).expect("decode").len();
        }
        std::hint::black_box(bytes);
        start.elapsed().as_nanos() as f64 / RECORDS as f64
    };
    let time_json = || {
        let start = Instant::now();
        for j in &jsons {
            lockgate::formats::json::validate_json(j).expect("valid JSON");
        }
        start.elapsed().as_nanos() as f64 / RECORDS as f64
    };
    for round in 0..ROUNDS {
        if round % 2 == 0 {
            avro.push(time_avro());
            json.push(time_json());
        } else {
            json.push(time_json());
            avro.push(time_avro());
        }
        eprintln!(
            "round {round}: Avro to JSON {:.0} ns/record, JSON check {:.0} ns/record",
            avro[round], json[round]
        );
    }
    let (a, j) = (super::median(avro), super::median(json));
    let (source_json, source_avro, lookups) = source_comparison(&schema, &decoder);
    let report = serde_json::json!({
        "benchmark": "Avro record (10 fields: decimal, timestamp, union, enum, record, map, array) decoded to JSON, against the JSON path's check of the same record",
        "records": RECORDS,
        "rounds": ROUNDS,
        "avro_datum_bytes_mean": datums.iter().map(Vec::len).sum::<usize>() / RECORDS,
        "json_bytes_mean": jsons.iter().map(Vec::len).sum::<usize>() / RECORDS,
        "avro_to_json_ns_per_record": a.round(),
        "json_check_ns_per_record": j.round(),
        "ratio_avro_over_json": (a / j * 100.0).round() / 100.0,
        "source_records": SOURCE_RECORDS,
        "source_json_records_per_sec": source_json.round(),
        "source_avro_records_per_sec": source_avro.round(),
        "source_ratio_avro_over_json": (source_avro / source_json * 1000.0).round() / 1000.0,
        "schema_lookups_per_avro_job": lookups,
    });
    report
}
