//! Kafka -> Elasticsearch with the Rust API: a bounded Kafka source, a map that adds a
//! field, and the Elasticsearch sink with deterministic ids (`{topic}-{partition}-{offset}`),
//! checkpointed every 500 ms.
//!
//! ```sh
//! cargo run --release --example kafka_to_elasticsearch                 # embedded Kafka and test server
//! cargo run --release --example kafka_to_elasticsearch -- BOOTSTRAP URL   # your own
//! ```

use lockgate::connectors::elasticsearch::{
    ConfigActionBuilder, EsSink, EsSinkConfig, PolicyFailureHandler,
};
use lockgate::connectors::kafka::{KafkaSource, KafkaSourceConfig, TopicSelector};
use lockgate::job::{CheckpointSettings, Job};
use lockgate::testkit::{es::EsServer, kafka::EmbeddedKafka};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::sync::Arc;
use std::time::Duration;

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (_kafka, _es, bootstrap, url);
    if let [b, u] = args.as_slice() {
        (bootstrap, url) = (b.clone(), u.clone());
    } else {
        let k = EmbeddedKafka::start(3, &[("events".into(), 3)])?;
        let e = EsServer::start("127.0.0.1:0".parse()?).await?;
        (bootstrap, url) = (k.bootstrap_servers().to_string(), e.url().to_string());
        let p: BaseProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .create()?;
        for i in 0..10_000 {
            let body = format!("{{\"event\":{i},\"kind\":\"click\"}}");
            while p
                .send(BaseRecord::<(), _>::to("events").payload(&body))
                .is_err()
            {
                p.poll(Duration::from_millis(5));
            }
        }
        p.flush(Duration::from_secs(30))?;
        (_kafka, _es) = (Some(k), Some(e));
    }

    let mut source = KafkaSourceConfig::new(
        &bootstrap,
        TopicSelector::List(vec!["events".into()]),
        "example",
    );
    source.bounded = true; // read what is there now, then finish
    let source = Arc::new(source);
    let sink = Arc::new(EsSinkConfig::new(&url, "events"));
    let state = std::env::temp_dir().join(format!("lockgate-example-{}", std::process::id()));
    let mut checkpoints = CheckpointSettings::new(&state);
    checkpoints.interval_ms = 500;
    let job = Job::builder("kafka-to-elasticsearch")
        .parallelism(2)
        .checkpointing(checkpoints)
        .source_spec(KafkaSource::spec(source))
        .map(|mut r| {
            let mut v: serde_json::Value = serde_json::from_slice(&r.value)
                .map_err(|e| lockgate::error::JobError::Other(e.to_string()))?;
            v["processed_by"] = "lockgate".into();
            r.value = serde_json::to_vec(&v).expect("JSON").into();
            Ok(r)
        })
        .sink("elasticsearch", move |_| {
            Box::new(EsSink::new(
                sink.clone(),
                Box::new(ConfigActionBuilder::new(&sink)),
                Arc::new(PolicyFailureHandler(sink.on_item_error.clone())),
            ))
        })
        .build()?;
    let summary = lockgate::runtime::run(&job, Default::default()).await?;
    println!(
        "finished after {} checkpoints; state in {}",
        summary.checkpoints,
        state.display()
    );
    let client = elasticsearch::Elasticsearch::new(
        elasticsearch::http::transport::Transport::single_node(&url)?,
    );
    client
        .indices()
        .refresh(elasticsearch::indices::IndicesRefreshParts::Index(&[
            "events",
        ]))
        .send()
        .await?;
    let count: serde_json::Value = client
        .count(elasticsearch::CountParts::Index(&["events"]))
        .send()
        .await?
        .json()
        .await?;
    println!("events indexed: {}", count["count"]);
    Ok(())
}
