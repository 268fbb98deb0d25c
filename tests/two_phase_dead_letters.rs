//! Dead letters of the two-phase kit: a record the writer's `check` refuses goes to the
//! dead-letter topic of a real Kafka cluster (the embedded one, in its own process),
//! read back by a plain consumer, and the rest of the batch is committed.

mod common;
use async_trait::async_trait;
use common::kafka::{consumer, headers_of, watermarks, KafkaProcess};
use lockgate::clients::kafka::KafkaCluster;
use lockgate::connector::{Batch, CheckpointId, Record, Result, Sink, SinkRestore, SubtaskInfo};
use lockgate::dead_letter::OnError;
use lockgate::kits::{TwoPhaseSink, TwoPhaseWriter};
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A writer whose destination refuses values that are not JSON objects; what it
/// committed, in order.
struct Objects {
    stage: Vec<String>,
    committed: Arc<Mutex<Vec<String>>>,
}

#[async_trait]
impl TwoPhaseWriter for Objects {
    type Committable = Vec<String>;

    fn kind(&self) -> &'static str {
        "objects sink"
    }
    async fn open(
        &mut self,
        _: &SubtaskInfo,
        _: Option<CheckpointId>,
        _: &[Vec<String>],
    ) -> Result<()> {
        Ok(())
    }
    fn check(&self, record: &Record) -> std::result::Result<(), String> {
        match record.value.first() {
            Some(b'{') => Ok(()),
            _ => Err("the value is not a JSON object".into()),
        }
    }
    async fn write(&mut self, batch: &Batch) -> Result<()> {
        self.stage.extend(
            batch
                .iter()
                .map(|r| String::from_utf8_lossy(&r.value).into_owned()),
        );
        Ok(())
    }
    async fn prepare_commit(&mut self, _: CheckpointId) -> Result<Option<Vec<String>>> {
        Ok(Some(std::mem::take(&mut self.stage)))
    }
    async fn commit(&mut self, c: &Vec<String>) -> Result<()> {
        self.committed.lock().unwrap().extend(c.iter().cloned());
        Ok(())
    }
    async fn abort_abandoned(&mut self, _: Option<CheckpointId>, _: &[Vec<String>]) -> Result<()> {
        Ok(())
    }
}

#[test]
fn a_record_the_writer_refuses_is_dead_lettered_and_the_rest_committed() {
    let kafka = KafkaProcess::start(&[("dlq", 1)]);
    let committed = Arc::new(Mutex::new(Vec::new()));
    let mut sink = TwoPhaseSink::new(Objects {
        stage: Vec::new(),
        committed: committed.clone(),
    })
    .on_item_error(
        OnError::DeadLetter("dlq".into()),
        Some(KafkaCluster {
            bootstrap_servers: kafka.bootstrap.clone(),
            properties: Default::default(),
        }),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let info = SubtaskInfo::new("dead-letters", "sink-0", 0, 1);
        sink.open(&info, &SinkRestore::default()).await.unwrap();
        let batch = [r#"{"n":1}"#, "not json", r#"{"n":2}"#, "[3]"]
            .iter()
            .map(|v| Record::from_value(v.as_bytes().to_vec()))
            .collect();
        sink.invoke(batch).await.unwrap();
        sink.snapshot(CheckpointId(1)).await.unwrap();
        sink.notify_checkpoint_complete(CheckpointId(1))
            .await
            .unwrap();
    });
    assert_eq!(*committed.lock().unwrap(), vec![r#"{"n":1}"#, r#"{"n":2}"#]);

    // The letters, read back by a plain consumer: each refused value, with why.
    let (_, high) = watermarks(&kafka.bootstrap, "dlq", 0).unwrap();
    assert_eq!(high, 2, "two letters");
    let c = consumer(&kafka.bootstrap, "dlq-reader");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("dlq", 0, Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let mut letters = Vec::new();
    while letters.len() < 2 {
        let Some(m) = c.poll(Duration::from_secs(5)) else {
            panic!("{} of 2 letters read", letters.len());
        };
        let m = m.unwrap();
        let payload = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
        letters.push((payload, headers_of(&m)));
    }
    assert_eq!(letters[0].0, "not json");
    assert_eq!(letters[1].0, "[3]");
    for (_, headers) in &letters {
        let error = headers
            .values()
            .find(|v| v.contains("cannot be written by the objects sink"));
        assert!(
            error.is_some_and(|e| e.contains("the value is not a JSON object")),
            "{headers:?}"
        );
    }
}
