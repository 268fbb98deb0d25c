//! The cost of decoding an Avro record to JSON against the JSON path's check of the
//! same record already in JSON, per record, in the same run (alternating rounds,
//! medians). The record: 10 fields with a decimal, a timestamp, a union, an enum, a
//! nested record, a map and an array, as Schema Registry producers write orders.
//! Printed as JSON. `cargo bench --bench avro_decode` (a few seconds).

mod support;

use apache_avro::types::Value;
use lockgate::formats::avro::{AvroDecoder, Temporal};
use std::time::Instant;

const RECORDS: usize = 200_000;
const ROUNDS: usize = 5;

const SCHEMA: &str = r#"{
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

fn order(i: usize) -> Value {
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
            if i % 2 == 0 {
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

fn main() {
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
    let (a, j) = (support::median(avro), support::median(json));
    let report = serde_json::json!({
        "benchmark": "Avro record (10 fields: decimal, timestamp, union, enum, record, map, array) decoded to JSON, against the JSON path's check of the same record",
        "records": RECORDS,
        "rounds": ROUNDS,
        "avro_datum_bytes_mean": datums.iter().map(Vec::len).sum::<usize>() / RECORDS,
        "json_bytes_mean": jsons.iter().map(Vec::len).sum::<usize>() / RECORDS,
        "avro_to_json_ns_per_record": a.round(),
        "json_check_ns_per_record": j.round(),
        "ratio_avro_over_json": (a / j * 100.0).round() / 100.0,
    });
    println!("{report}");
}
