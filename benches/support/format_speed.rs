//! Formats and transforms against the JSON path, as jobs run them, in the same run
//! (alternating rounds, medians): `lockgate run` of a Kafka -> files job, in its own
//! process, over the same orders
//!
//! - in JSON, as they are (the JSON path: the baseline of every ratio);
//! - in Confluent-framed Avro, their schema from the Schema Registry test server;
//! - in JSON through three Kafka Connect transforms (`insert_field`, `replace_field`,
//!   `cast`);
//! - in JSON through a jq program (`. + {x: .a}`).
//!
//! Each side's rate is the orders over the job's time from spawn to exit, less the
//! median time of the same job over an empty topic (start-up, the first and the final
//! checkpoint), so that the ratios compare the work per record rather than the
//! process's fixed costs.
//!
//! `cargo bench --bench format_speed` prints it alone (about two minutes); the report
//! includes it. `FORMAT_SPEED_ONLY=json|avro|chain|jq` runs that side alone, three
//! times (for a profile), and prints nothing.

use super::{median, round3, run_job};
use std::path::Path;

/// Orders per topic, over `PARTITIONS` partitions (the embedded cluster keeps at most
/// 100k records or 5 MiB per partition: about 2.4 MiB of JSON each here).
const ORDERS: usize = 1_200_000;
const PARTITIONS: i32 = 96;
const ROUNDS: usize = 5;

/// The chain of Kafka Connect transforms.
pub const CHAIN: &str = r#"
[[transform]]
type = "insert_field"
static = { source = "kafka" }
topic_field = "topic"
timestamp_field = "@timestamp"
[[transform]]
type = "replace_field"
rename = { amount = "price" }
[[transform]]
type = "cast"
spec = { id = "string", paid = "int8" }
"#;

/// The jq program.
pub const JQ: &str = r#"
[[transform]]
type = "jq"
filter = '. + {x: .a}'
"#;

/// One job of the comparison.
struct Side {
    name: &'static str,
    topic: &'static str,
    source: String,
    transforms: &'static str,
}

fn job(dir: &Path, bootstrap: &str, side: &Side, topic: &str) -> std::path::PathBuf {
    let job = dir.join("job.toml");
    std::fs::write(
        &job,
        format!(
            "[job]\nname = \"speed\"\nparallelism = 1\n[checkpoint]\ndir = \"{chk}\"\ninterval_ms = 1000\n[restart]\nstrategy = \"none\"\n\
             [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"{topic}\"]\nbounded = \"latest\"\n{source}\n\
             {transforms}\n[sink.file]\ndir = \"{out}\"\n",
            chk = dir.join("checkpoints").display(),
            out = dir.join("out").display(),
            source = side.source,
            transforms = side.transforms,
        ),
    )
    .expect("job file");
    job
}

/// Runs the comparison and returns the JSON report.
pub fn measure() -> serde_json::Value {
    use super::avro::{order, produce_to, SCHEMA};
    use lockgate::formats::avro::{AvroDecoder, Temporal};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
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
            ("empty".into(), 1),
        ],
    )
    .expect("embedded Kafka");
    let bootstrap = kafka.bootstrap_servers().to_string();
    let schema = apache_avro::Schema::parse_str(SCHEMA).expect("schema");
    let decoder = AvroDecoder::parse(SCHEMA, Temporal::EpochMillis).expect("schema");
    let datum = |i: usize| apache_avro::to_avro_datum(&schema, order(i)).expect("encode");
    produce_to(
        &bootstrap,
        "orders-json",
        PARTITIONS,
        (0..ORDERS).map(|i| decoder.to_json(&datum(i)).expect("decode")),
    );
    produce_to(
        &bootstrap,
        "orders-avro",
        PARTITIONS,
        (0..ORDERS).map(|i| {
            let mut framed = vec![0];
            framed.extend_from_slice(&id.to_be_bytes());
            framed.extend(datum(i));
            framed
        }),
    );
    let avro_source = format!(
        "format = \"avro\"\ntemporal = \"epoch-millis\"\n[source.kafka.schema_registry]\nurl = \"{}\"",
        registry.url()
    );
    let sides = [
        Side {
            name: "json",
            topic: "orders-json",
            source: String::new(),
            transforms: "",
        },
        Side {
            name: "avro",
            topic: "orders-avro",
            source: avro_source,
            transforms: "",
        },
        Side {
            name: "chain",
            topic: "orders-json",
            source: String::new(),
            transforms: CHAIN,
        },
        Side {
            name: "jq",
            topic: "orders-json",
            source: String::new(),
            transforms: JQ,
        },
    ];
    let work = tempfile::tempdir().expect("tempdir");
    let mut n = 0;
    let mut run = |side: &Side, topic: &str| {
        n += 1;
        let dir = work.path().join(format!("run-{n}"));
        std::fs::create_dir_all(&dir).expect("run dir");
        let secs = run_job(&job(&dir, &bootstrap, side, topic)).secs;
        let written = if topic == "empty" {
            0
        } else {
            count_lines(&dir.join("out"))
        };
        let _ = std::fs::remove_dir_all(&dir);
        (secs, written)
    };
    if let Ok(only) = std::env::var("FORMAT_SPEED_ONLY") {
        let side = sides
            .iter()
            .find(|s| s.name == only)
            .unwrap_or_else(|| panic!("FORMAT_SPEED_ONLY={only}: not a side"));
        for _ in 0..3 {
            let (s, _) = run(side, side.topic);
            eprintln!("{only}: {s:.2} s");
        }
        return serde_json::Value::Null;
    }
    let mut empty = Vec::new();
    let mut secs: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
    for round in 0..ROUNDS {
        let mut order: Vec<usize> = (0..sides.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        empty.push(run(&sides[0], "empty").0);
        for i in order {
            let (s, written) = run(&sides[i], sides[i].topic);
            assert_eq!(written, ORDERS, "{}: every order written", sides[i].name);
            secs[i].push(s);
        }
        eprintln!(
            "round {round}: empty job {:.2} s, {}",
            empty[round],
            sides
                .iter()
                .zip(&secs)
                .map(|(s, v)| format!("{} {:.2} s", s.name, v[round]))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let fixed = median(empty);
    let rate = |v: &Vec<f64>| ORDERS as f64 / (median(v.clone()) - fixed).max(1e-3);
    let rates: Vec<f64> = secs.iter().map(rate).collect();
    let json = rates[0];
    serde_json::json!({
        "job": "Kafka -> files, parallelism 1, checkpoints every second, lockgate run in its own process; the same orders (10 fields) in JSON, in Avro, through a chain and through jq",
        "orders": ORDERS,
        "partitions": PARTITIONS,
        "rounds": ROUNDS,
        "fixed_secs": round3(fixed),
        "json_records_per_sec": json.round(),
        "avro_records_per_sec": rates[1].round(),
        "chain_records_per_sec": rates[2].round(),
        "jq_records_per_sec": rates[3].round(),
        "ratio_avro_over_json": round3(rates[1] / json),
        "ratio_chain_over_none": round3(rates[2] / json),
        "ratio_jq_over_none": round3(rates[3] / json),
        "chain": "insert_field (static, topic, timestamp), replace_field (rename), cast (two fields)",
        "jq_program": ". + {x: .a}",
    })
}

/// Lines in the committed part files under `dir`.
fn count_lines(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .expect("the sink's directory")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("part-"))
        .map(|e| {
            let bytes = std::fs::read(e.path()).expect("part file");
            bytes.iter().filter(|&&b| b == b'\n').count()
        })
        .sum()
}
