//! Kafka Connect's transforms in a job file, end to end: a stack of them between the
//! embedded Kafka and the Elasticsearch test server, checked document by document, and
//! the same stack under `lockgate chaos` (whose verifier applies the job's transforms
//! to its inputs).

mod common;

use common::es::Es;
use common::kafka::KafkaProcess;
use common::{run_config, tail};
use serde_json::json;
use std::path::Path;

const ORDERS: u64 = 3_000;
const USERS: u64 = 50;

/// The transforms: stamp, rename, cast, convert, and key by order number.
const STACK: &str = r#"
[[transform]]
type = "insert_field"
static = { source = "kafka" }
topic_field = "topic"
offset_field = "offset"

[[transform]]
type = "replace_field"
rename = { amount = "price" }

[[transform]]
type = "cast"
spec = { order = "string", price = "float64" }

[[transform]]
type = "timestamp_converter"
field = "offset"
from = "unix_s"
to = "%Y"

[[transform]]
type = "set_key"
field = "/order"
"#;

fn job(dir: &Path, bootstrap: &str, es: &str, id: &str) -> std::path::PathBuf {
    let text = format!(
        "[job]\nname = \"smt-test\"\nparallelism = 2\n\n[checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 200\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\n\
         {STACK}\n\
         [sink.elasticsearch]\nurl = \"{es}\"\nindex = \"orders\"\nid = \"{id}\"\n\
         bulk_flush_interval_ms = 100\nretry_initial_ms = 20\nretry_max_ms = 500\nretry_max_attempts = 1000\n"
    );
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join("job.toml");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn a_stack_of_transforms_shapes_every_document() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 4)]);
    lockgate::testkit::kafka::produce_orders(&kafka.bootstrap, "orders", 0, ORDERS, USERS).unwrap();
    let es = Es::testkit();
    let config = job(tmp.path(), &kafka.bootstrap, &es.url(), "key");
    let (code, log) = run_config(&config);
    assert_eq!(code, Some(0), "{}", tail(&log, 30));
    let ids: Vec<String> = (0..ORDERS).map(|i| i.to_string()).collect();
    let docs = es.get_many("orders", &ids);
    assert_eq!(docs.len() as u64, ORDERS);
    for (id, doc, _) in docs {
        let i: u64 = id.parse().unwrap();
        // produce_orders: {"order": i, "user": "user-NNNN", "amount": A}.
        let user = format!("user-{:04}", (i * 7919) % USERS);
        let amount = (1 + (i * 31) % 500) as f64;
        let offset = doc["offset"].as_str().unwrap().to_string();
        assert_eq!(
            doc,
            json!({"order": id, "user": user, "price": amount, "source": "kafka",
                   "topic": "orders", "offset": offset}),
        );
        // An offset read as seconds since the epoch: a year of the 1970s.
        assert!(offset.starts_with("197"), "{offset}");
    }
}

#[test]
fn a_stack_of_transforms_under_chaos_is_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 4)]);
    lockgate::testkit::kafka::produce_orders(&kafka.bootstrap, "orders", 0, 40_000, USERS).unwrap();
    let es = Es::testkit();
    let config = job(tmp.path(), &kafka.bootstrap, &es.url(), "coordinates");
    let (code, out, r) = common::chaos(
        &config,
        &[
            "--kills",
            "5",
            "--seed",
            "11",
            "--failpoints",
            "source-batch=sleep(200)",
            "--failpoint-runs",
            "5",
            "--kill-after-ms",
            "300..700",
        ],
    );
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(r["verdict"]["inputs"], 40_000, "{out}");
    for k in ["missing", "duplicated", "wrong"] {
        assert_eq!(r["verdict"][k], 0, "{k}: {out}");
    }
    assert!(r["kills"].as_u64().unwrap() >= 1, "{out}");
}
