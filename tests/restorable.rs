//! `Sink::notify_restorable_from`: a sink learns the oldest checkpoint that can still
//! be restored (what retention keeps), so that it may forget what it kept for older
//! ones. Checked through a real run against the checkpoint directory itself.

use async_trait::async_trait;
use lockgate::connector::{Batch, CheckpointId, Result, Sink, SinkRestore, SubtaskInfo};
use lockgate::connectors::sequence::{SequenceConfig, SequenceSource};
use lockgate::job::{CheckpointSettings, Job};
use std::path::Path;
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone, PartialEq)]
enum Call {
    Complete(u64),
    RestorableFrom(u64, Vec<u64>),
}

/// A sink that records its notifications, and, with each `restorable_from`, the
/// complete checkpoints in the directory at that moment.
struct Recorder {
    calls: Arc<Mutex<Vec<Call>>>,
    dir: std::path::PathBuf,
}

fn complete_ids(dir: &Path) -> Vec<u64> {
    let mut ids: Vec<u64> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let name = e.file_name().into_string().ok()?;
            let id = name.strip_prefix("chk-")?.parse().ok()?;
            e.path().join("_metadata").exists().then_some(id)
        })
        .collect();
    ids.sort();
    ids
}

#[async_trait]
impl Sink for Recorder {
    async fn open(&mut self, _: &SubtaskInfo, _: &SinkRestore) -> Result<()> {
        Ok(())
    }
    async fn invoke(&mut self, _: Batch) -> Result<()> {
        Ok(())
    }
    async fn snapshot(&mut self, _: CheckpointId) -> Result<Vec<u8>> {
        Ok(Vec::new())
    }
    async fn notify_checkpoint_complete(&mut self, id: CheckpointId) -> Result<()> {
        self.calls.lock().unwrap().push(Call::Complete(id.0));
        Ok(())
    }
    async fn notify_restorable_from(&mut self, oldest: CheckpointId) -> Result<()> {
        let on_disk = complete_ids(&self.dir);
        self.calls
            .lock()
            .unwrap()
            .push(Call::RestorableFrom(oldest.0, on_disk));
        Ok(())
    }
}

#[test]
fn a_sink_is_told_the_oldest_checkpoint_retention_keeps() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("checkpoints");
    let calls = Arc::new(Mutex::new(Vec::new()));
    let mut checkpointing = CheckpointSettings::new(&dir);
    checkpointing.interval_ms = 30;
    checkpointing.retain = 2;
    let (c, d) = (calls.clone(), dir.clone());
    let job = Job::builder("restorable")
        .parallelism(1)
        .checkpointing(checkpointing)
        .source_spec(SequenceSource::spec(SequenceConfig {
            from: 1,
            to: 400,
            keys: 4,
            rate_per_sec: 1_000,
            splits: 1,
        }))
        .sink("recorder", move |_| {
            Box::new(Recorder {
                calls: c.clone(),
                dir: d.clone(),
            }) as Box<dyn Sink>
        })
        .build()
        .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(lockgate::runtime::run(&job, Default::default()))
        .unwrap();

    let calls = calls.lock().unwrap().clone();
    let completed: Vec<u64> = calls
        .iter()
        .filter_map(|c| match c {
            Call::Complete(id) => Some(*id),
            _ => None,
        })
        .collect();
    assert!(
        completed.len() >= 4,
        "a few checkpoints completed: {calls:?}"
    );
    // Each completion from the second on is followed by the second-newest completed
    // checkpoint; the first, when only one completed, by nothing.
    let mut expected = Vec::new();
    for (i, id) in completed.iter().enumerate() {
        expected.push(Call::Complete(*id));
        if i >= 1 {
            expected.push(Call::RestorableFrom(completed[i - 1], Vec::new()));
        }
    }
    let without_disk: Vec<Call> = calls
        .iter()
        .map(|c| match c {
            Call::RestorableFrom(o, _) => Call::RestorableFrom(*o, Vec::new()),
            c => c.clone(),
        })
        .collect();
    assert_eq!(without_disk, expected);
    // Never a checkpoint that is not on disk: the oldest restorable is complete there.
    for c in &calls {
        if let Call::RestorableFrom(oldest, on_disk) = c {
            assert!(
                on_disk.contains(oldest),
                "{oldest} not on disk: {on_disk:?}"
            );
        }
    }
}
