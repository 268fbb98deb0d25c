//! Flink's Kafka example with a keyed rolling addition, in lockgate: read orders from
//! Kafka, key them by user, keep a running sum per user in RocksDB (keyed state), and
//! write every order with its user's running total to exactly-once files.
//!
//! ```sh
//! cargo run --release --example rolling_sum     # embedded Kafka with generated orders
//! ```

use lockgate::connectors::file_sink::{FileSink, FileSinkConfig};
use lockgate::connectors::kafka::{KafkaSource, KafkaSourceConfig, TopicSelector};
use lockgate::job::{CheckpointSettings, Job};
use lockgate::kits::keyed::KeyedState;
use lockgate::operators::rolling_sum::json_key;
use lockgate::record::{Batch, Record};
use lockgate::testkit::kafka::EmbeddedKafka;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::sync::Arc;
use std::time::Duration;

/// The keyed rolling addition, written against the keyed-state API.
fn rolling_addition(
    _key: &[u8],
    mut r: Record,
    state: &mut KeyedState<'_>,
    out: &mut Batch,
) -> lockgate::error::Result<()> {
    let mut order: serde_json::Value = serde_json::from_slice(&r.value)
        .map_err(|e| lockgate::error::JobError::Other(e.to_string()))?;
    let amount = order["amount"].as_i64().unwrap_or(0);
    let total = state.get::<i64>("total")?.unwrap_or(0) + amount;
    state.put("total", &total)?;
    order["total"] = total.into();
    r.value = serde_json::to_vec(&order).expect("JSON").into();
    out.push(r);
    Ok(())
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let kafka = EmbeddedKafka::start(3, &[("orders".into(), 4)])?;
    let p: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka.bootstrap_servers())
        .create()?;
    for i in 0..20_000u64 {
        let user = format!("user-{}", i % 50);
        let body = format!("{{\"user\":\"{user}\",\"amount\":{}}}", i % 100);
        while p
            .send(BaseRecord::to("orders").key(&user).payload(&body))
            .is_err()
        {
            p.poll(Duration::from_millis(5));
        }
    }
    p.flush(Duration::from_secs(30))?;

    let dir = std::env::temp_dir().join(format!("lockgate-rolling-sum-{}", std::process::id()));
    let mut source = KafkaSourceConfig::new(
        kafka.bootstrap_servers(),
        TopicSelector::List(vec!["orders".into()]),
        "rolling-sum",
    );
    source.bounded = true;
    let source = Arc::new(source);
    let out = FileSinkConfig::json(dir.join("out"));
    let job = Job::builder("rolling-sum")
        .parallelism(2)
        .checkpointing(CheckpointSettings::new(dir.join("checkpoints")))
        .source_spec(KafkaSource::spec(source))
        .key_by(|r| json_key(r, "/user"))
        .keyed("rolling_addition", "totals", |_| rolling_addition)
        .sink_spec(FileSink::spec(out))
        .build()?;
    lockgate::runtime::run(&job, Default::default()).await?;
    let mut lines = 0;
    for e in std::fs::read_dir(dir.join("out"))? {
        let e = e?;
        if e.file_name().to_string_lossy().starts_with("part-") {
            lines += std::fs::read_to_string(e.path())?.lines().count();
        }
    }
    println!(
        "{lines} orders with running totals committed under {}",
        dir.join("out").display()
    );
    Ok(())
}
