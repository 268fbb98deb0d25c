//! Flink's Elasticsearch7SinkExample, in lockgate: a sequence source; per element an
//! index request and an upsert; every fifth index request goes to a deliberately
//! invalid index, and a failure handler re-routes those documents into the right one.
//!
//! Against the test server:
//! ```sh
//! lockgate testkit es --listen 127.0.0.1:9200 &
//! cargo run --release --example elasticsearch_failure_handler -- http://127.0.0.1:9200
//! ```
//! Without an argument the example starts its own test server.

use lockgate::connectors::elasticsearch::{
    BulkAction, EsSink, EsSinkConfig, FailureDecision, FailureHandler, ItemFailure,
};
use lockgate::connectors::sequence::{SequenceConfig, SequenceSource};
use lockgate::job::{CheckpointSettings, Job, RestartPolicy};
use lockgate::record::Record;
use std::sync::Arc;

const INDEX: &str = "my-index";
const UPSERTS: &str = "my-index-upserts";
const ELEMENTS: i64 = 100;

/// Re-routes documents refused for an invalid index name into the right index; any
/// other refusal fails the job.
struct RerouteInvalidIndex;

impl FailureHandler for RerouteInvalidIndex {
    fn on_failure(&self, action: &BulkAction, failure: &ItemFailure) -> FailureDecision {
        if failure.error_type == "invalid_index_name_exception" {
            let mut fixed = action.clone();
            fixed.index = INDEX.to_string();
            FailureDecision::Requeue(vec![fixed])
        } else {
            FailureDecision::Fail(format!("{}: {}", action.describe(), failure.reason))
        }
    }
}

/// One index request and one upsert per element.
fn actions(record: &Record, out: &mut Vec<BulkAction>) -> lockgate::error::Result<()> {
    let v: serde_json::Value =
        serde_json::from_slice(&record.value).expect("sequence records are JSON");
    let seq = v["seq"].as_i64().expect("seq");
    let doc = serde_json::json!({"data": format!("message #{seq}")})
        .to_string()
        .into_bytes();
    let index = if seq % 5 == 0 { "INVALID-index" } else { INDEX };
    out.push(BulkAction::index(index, Some(seq.to_string()), doc.clone()));
    out.push(BulkAction::upsert(UPSERTS, seq.to_string(), &doc));
    Ok(())
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let own_server;
    let url = match std::env::args().nth(1) {
        Some(u) => u,
        None => {
            own_server = lockgate::testkit::es::EsServer::start("127.0.0.1:0".parse()?).await?;
            own_server.url().to_string()
        }
    };
    let tmp = std::env::temp_dir().join(format!("lockgate-es-example-{}", std::process::id()));
    let mut cfg = EsSinkConfig::new(&url, INDEX);
    cfg.bulk_max_actions = 20;
    let cfg = Arc::new(cfg);
    let handler: Arc<dyn FailureHandler> = Arc::new(RerouteInvalidIndex);
    let seq = SequenceConfig {
        from: 1,
        to: ELEMENTS,
        keys: 10,
        rate_per_sec: 0,
        splits: 128,
    };
    let job = Job::builder("elasticsearch-failure-handler")
        .restart(RestartPolicy::None)
        .checkpointing(CheckpointSettings::new(tmp.join("checkpoints")))
        .source_spec(SequenceSource::spec(seq))
        .sink("elasticsearch", move |_| {
            Box::new(EsSink::new(cfg.clone(), Box::new(actions), handler.clone()))
        })
        .build()?;
    lockgate::runtime::run(&job, Default::default()).await?;

    let http = reqwest_free_get(&url, INDEX).await?;
    let upserts = reqwest_free_get(&url, UPSERTS).await?;
    println!("{INDEX}: {http} documents (every fifth re-routed from an invalid index)");
    println!("{UPSERTS}: {upserts} documents");
    let _ = std::fs::remove_dir_all(&tmp);
    assert_eq!((http, upserts), (ELEMENTS as u64, ELEMENTS as u64));
    Ok(())
}

/// `GET /{index}/_count` with the official client.
async fn reqwest_free_get(url: &str, index: &str) -> Result<u64, Box<dyn std::error::Error>> {
    let client = elasticsearch::Elasticsearch::new(
        elasticsearch::http::transport::Transport::single_node(url)?,
    );
    client
        .indices()
        .refresh(elasticsearch::indices::IndicesRefreshParts::Index(&[index]))
        .send()
        .await?;
    let r = client
        .count(elasticsearch::CountParts::Index(&[index]))
        .send()
        .await?;
    let v: serde_json::Value = r.json().await?;
    Ok(v["count"].as_u64().unwrap_or(0))
}
