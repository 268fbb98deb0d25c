//! The loader's combinations, walked: values that change silently lived where features
//! meet (a format's decimals through transforms, Debezium's times into Postgres,
//! window keys into ids), so each class of combination is tested end to end here or
//! where the table says, or refused at load.
//!
//! | source format | transforms | operator | sink | class | where |
//! |---|---|---|---|---|---|
//! | JSON | every SMT, `filter`, `jq`, `debezium` | none | file, ES (test server, osmem), Postgres upsert (`numeric`), Kafka | a number's text through transforms into each sink | `tests/exact_numbers.rs`, `src/transforms/exact_numbers.rs` |
//! | Avro (`schema_file`, decimals of scale 0, 2 and 21) | `insert_field` + `jq` | `window` (sum, min, max) by a key of mixed JSON types | file | a format's decimal through transforms into an operator's aggregates and ids | `avro_decimals_through_transforms_into_windows_keep_their_digits` |
//! | JSON with schemas (Connect `Decimal`) | `insert_field` + `jq` | `rolling_sum` | file | the same through a rolling sum | `connect_decimals_through_transforms_into_a_rolling_sum_keep_their_digits` |
//! | Avro, Protobuf, JSON Schema (Confluent's serializers) | none | none, `rolling_sum` | ES | a format's decimal (exact text, scale kept) into the index; the chaos run of a rolling sum over Avro | `tests/schema_registry_formats.rs` |
//! | JSON with schemas (Debezium's `io.debezium.time.*`, `VariableScaleDecimal`) | `debezium` | none | Postgres (`date`, `timestamp`, `numeric`), ES | Debezium's semantic types | `tests/cdc.rs`, `tests/postgres_sink.rs` |
//! | any | any | `window`, `rolling_sum` | ES by `field:/window_id` or `field:/<key>`, Postgres upsert by key, Kafka by key | a key is its text: one state, one id | `tests/windows.rs` (`keys_of_different_json_types_with_one_text_are_one_key`), `src/operators/rolling_sum.rs` |
//! | any | any | `window` | ES by coordinates, external versions | results have no source coordinates | refused at load (`tests/windows.rs`) |
//! | any | `jq` with several outputs | any | Kafka (a repartition stage) | outputs share their coordinates | refused at load unless `max_outputs = 1` |
//! | any | any | any | ES with `pipeline` and deletes (tombstones, CDC deletes, session deletes) | a rerouting pipeline makes a delete miss | refused at load unless the pipeline is declared not to reroute |
//! | Kafka `on_topic_recreated = "restart"` | any | any | ES data stream or ids by coordinates | offsets restart at 0 and collide with the old topic's documents | see the README (topic recreation) |
//!
//! A number becomes a double only where something computes one (`cast` to a float, jq
//! arithmetic, `avg`): the README lists each place.

mod common;

use common::kafka::{produce_raw, KafkaProcess};
use common::{run_config, tail};
use std::path::Path;

const BIG: &str = "12345678901234567890123456789012345678";
const TINY: &str = "-0.000000000000000000001";

/// The committed lines of a file sink's `out` directory.
fn committed(dir: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    for e in std::fs::read_dir(dir.join("out")).unwrap() {
        let e = e.unwrap();
        if e.file_name().to_string_lossy().starts_with("part-") {
            lines.extend(
                std::fs::read_to_string(e.path())
                    .unwrap()
                    .lines()
                    .map(String::from),
            );
        }
    }
    lines
}

fn run(dir: &Path, name: &str, source: &str, steps: &str) -> Vec<String> {
    let text = format!(
        "[job]\nname = \"{name}\"\nparallelism = 2\n\n[checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 200\n\n\
         [restart]\nstrategy = \"none\"\n\n{source}\n\n\
         [[transform]]\ntype = \"insert_field\"\noffset_field = \"offset\"\n\n\
         [[transform]]\ntype = \"jq\"\nfilter = \".\"\n\n{steps}\n\n[sink.file]\ndir = \"out\"\n"
    );
    let config = dir.join("job.toml");
    std::fs::write(&config, text).unwrap();
    let (code, log) = run_config(&config);
    assert_eq!(code, Some(0), "{}", tail(&log, 30));
    committed(dir)
}

/// A decimal's unscaled value as Avro's bytes (big-endian two's complement).
fn unscaled(v: i128) -> apache_avro::Decimal {
    apache_avro::Decimal::from(v.to_be_bytes().to_vec())
}

#[test]
fn avro_decimals_through_transforms_into_windows_keep_their_digits() {
    use apache_avro::types::Value as Avro;
    let tmp = tempfile::tempdir().unwrap();
    let schema_text = r#"{"type":"record","name":"Order","fields":[
        {"name":"user","type":["string","long"]},
        {"name":"ts","type":"long"},
        {"name":"big","type":{"type":"bytes","logicalType":"decimal","precision":38,"scale":0}},
        {"name":"price","type":{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}},
        {"name":"tiny","type":{"type":"bytes","logicalType":"decimal","precision":30,"scale":21}}]}"#;
    std::fs::write(tmp.path().join("order.avsc"), schema_text).unwrap();
    let schema = apache_avro::Schema::parse_str(schema_text).unwrap();
    let big: i128 = BIG.parse().unwrap();
    // User 1 as the string "1" twice and the number 1 once, in one minute.
    let users = [
        Avro::Union(0, Box::new(Avro::String("1".into()))),
        Avro::Union(1, Box::new(Avro::Long(1))),
        Avro::Union(0, Box::new(Avro::String("1".into()))),
    ];
    let payloads: Vec<Vec<u8>> = users
        .into_iter()
        .enumerate()
        .map(|(i, user)| {
            let v = Avro::Record(vec![
                ("user".into(), user),
                ("ts".into(), Avro::Long(1_767_225_600_000 + i as i64 * 1000)),
                ("big".into(), Avro::Decimal(unscaled(big - i as i128))),
                ("price".into(), Avro::Decimal(unscaled(150))),
                ("tiny".into(), Avro::Decimal(unscaled(-1))),
            ]);
            apache_avro::to_avro_datum(&schema, v).unwrap()
        })
        .collect();
    let kafka = KafkaProcess::start(&[("orders", 1)]);
    let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    produce_raw(&kafka.bootstrap, "orders", 0, &refs);
    let source = format!(
        "[source.kafka]\nbootstrap_servers = \"{}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\n\
         format = \"avro\"\nschema_file = \"order.avsc\"\n\n\
         [source.kafka.watermark]\ntimestamp = \"/ts\"\nmax_out_of_orderness_ms = 1000",
        kafka.bootstrap
    );
    let window = "[[transform]]\ntype = \"window\"\nkind = \"tumbling\"\nsize_ms = 60000\nkey = \"/user\"\n\
                  aggregates = { orders = \"count\", spent = \"sum:/price\", biggest = \"max:/big\", smallest = \"min:/big\", least = \"min:/tiny\" }";
    let lines = run(tmp.path(), "avro-windows", &source, window);
    assert_eq!(lines.len(), 1, "one window of one key: {lines:?}");
    let line = &lines[0];
    for want in [
        r#""key":"1""#.to_string(),
        r#""orders":3"#.to_string(),
        r#""spent":4.50"#.to_string(),
        format!(r#""biggest":{BIG}"#),
        format!(r#""smallest":{}"#, big - 2),
        format!(r#""least":{TINY}"#),
    ] {
        assert!(line.contains(&want), "{want} in {line}");
    }
}

#[test]
fn connect_decimals_through_transforms_into_a_rolling_sum_keep_their_digits() {
    use base64::Engine;
    let tmp = tempfile::tempdir().unwrap();
    let b64 = |v: i128| {
        let bytes = v.to_be_bytes();
        // The shortest two's complement, as Connect writes it.
        let skip = bytes
            .windows(2)
            .take_while(|w| (w[0] == 0 && w[1] & 0x80 == 0) || (w[0] == 0xff && w[1] & 0x80 != 0))
            .count();
        base64::engine::general_purpose::STANDARD.encode(&bytes[skip..])
    };
    let schema = r#"{"type":"struct","fields":[{"field":"user","type":"string"},{"field":"price","type":"bytes","name":"org.apache.kafka.connect.data.Decimal","parameters":{"scale":"2"}},{"field":"tiny","type":"bytes","name":"org.apache.kafka.connect.data.Decimal","parameters":{"scale":"21"}}]}"#;
    let envelope = |user: &str, cents: i128| {
        format!(
            r#"{{"schema":{schema},"payload":{{"user":{user},"price":"{}","tiny":"{}"}}}}"#,
            b64(cents),
            b64(-1)
        )
        .into_bytes()
    };
    let payloads = [
        envelope(r#""7""#, 150),
        envelope(r#""7""#, 225),
        envelope(r#""7""#, 1),
    ];
    let kafka = KafkaProcess::start(&[("orders", 1)]);
    let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    produce_raw(&kafka.bootstrap, "orders", 0, &refs);
    let source = format!(
        "[source.kafka]\nbootstrap_servers = \"{}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\n\
         format = \"json\"\nconnect_envelope = true",
        kafka.bootstrap
    );
    let sum = "[[transform]]\ntype = \"rolling_sum\"\nkey = \"/user\"\nfield = \"/price\"\noutput = \"/total\"";
    let mut lines = run(tmp.path(), "connect-sum", &source, sum);
    lines.sort_by_key(|l| {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        v["offset"].as_i64().unwrap()
    });
    let totals: Vec<String> = lines
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            assert!(l.contains(&format!(r#""tiny":{TINY}"#)), "{l}");
            v["total"].to_string()
        })
        .collect();
    // 1.50, then 1.50 + 2.25, then + 0.01: exact, with the inputs' scale.
    assert_eq!(totals, ["1.50", "3.75", "3.76"]);
}
