//! A source's own state in checkpoints (`Source::snapshot_state` / `restore_state`),
//! through the public contract: kept under `SOURCE_UID` beside the positions, handed
//! back on restore (every old subtask's state to each new subtask, whatever the new
//! parallelism) before `open`, and never on a fresh start.

use async_trait::async_trait;
use lockgate::connector::{
    Batch, CheckpointId, NextOffset, Record, Result, Source, SourcePoll, SourcePosition,
    SubtaskInfo, SOURCE_UID,
};
use lockgate::connectors::file_sink::{FileSink, FileSinkConfig};
use lockgate::job::{CheckpointSettings, Job, JobGraph};
use lockgate::state::CheckpointMetadata;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the sources of one run were told, subtask by subtask, in order.
type Calls = Arc<Mutex<Vec<(u16, Call)>>>;

#[derive(Debug, Clone, PartialEq)]
enum Call {
    Restore(Vec<(u16, Vec<u8>)>),
    Open,
}

/// An unbounded source whose state is the ids it emitted (one per poll), as text:
/// `"<subtask>:<id>,<id>,..."`.
struct Counter {
    index: u16,
    ids: Vec<u64>,
    calls: Calls,
}

#[async_trait]
impl Source for Counter {
    async fn open(&mut self, info: &SubtaskInfo, _: Option<&[SourcePosition]>) -> Result<()> {
        self.index = info.index;
        self.calls.lock().unwrap().push((self.index, Call::Open));
        Ok(())
    }

    async fn poll(&mut self, out: &mut Batch) -> Result<SourcePoll> {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let id = self.ids.len() as u64;
        self.ids.push(id);
        out.push(Record::from_value(format!("{{\"id\":{id}}}").into_bytes()));
        Ok(SourcePoll::Ready)
    }

    fn snapshot(&mut self, _: CheckpointId) -> Result<Vec<SourcePosition>> {
        Ok(vec![SourcePosition::new(
            "counter",
            i32::from(self.index),
            NextOffset(self.ids.len() as i64),
        )])
    }

    fn snapshot_state(&mut self, _: CheckpointId) -> Result<Option<Vec<u8>>> {
        let ids: Vec<String> = self.ids.iter().map(u64::to_string).collect();
        Ok(Some(
            format!("{}:{}", self.index, ids.join(",")).into_bytes(),
        ))
    }

    fn restore_state(&mut self, states: &[(u16, Vec<u8>)]) -> Result<()> {
        // Open has not told the subtask its index yet: the factory's is kept.
        self.calls
            .lock()
            .unwrap()
            .push((self.index, Call::Restore(states.to_vec())));
        Ok(())
    }
}

fn job(dir: &Path, parallelism: u16, calls: &Calls) -> JobGraph {
    let calls = calls.clone();
    let mut checkpointing = CheckpointSettings::new(dir.join("checkpoints"));
    checkpointing.interval_ms = 100;
    Job::builder("source-state")
        .parallelism(parallelism)
        .checkpointing(checkpointing)
        .source("counter", move |index| {
            Box::new(Counter {
                index,
                ids: Vec::new(),
                calls: calls.clone(),
            }) as Box<dyn Source>
        })
        .sink_spec(FileSink::spec(FileSinkConfig::json(dir.join("out"))))
        .build()
        .unwrap()
}

fn complete_checkpoints(dir: &Path) -> Vec<PathBuf> {
    let mut chks: Vec<PathBuf> = std::fs::read_dir(dir.join("checkpoints"))
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("chk-") && !n.contains('.'))
                        && p.join("_metadata").exists()
                })
                .collect()
        })
        .unwrap_or_default();
    chks.sort();
    chks
}

/// Runs `job` until `until` holds (checked every 20 ms, at most 60 s), then stops it
/// with a final checkpoint.
fn run_until(job: &JobGraph, until: impl Fn() -> bool) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let (tx, rx) = tokio::sync::watch::channel(false);
    let g = job.clone();
    let run = rt.spawn(async move {
        lockgate::runtime::run(
            &g,
            lockgate::runtime::RunOptions {
                stop: Some(rx),
                ..Default::default()
            },
        )
        .await
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while !until() {
        assert!(Instant::now() < deadline, "timed out");
        assert!(!run.is_finished(), "the job ended by itself");
        std::thread::sleep(Duration::from_millis(20));
    }
    tx.send(true).unwrap();
    rt.block_on(run).unwrap().unwrap();
}

/// The source states of the newest checkpoint, by subtask.
fn held_states(dir: &Path) -> Vec<(u16, Vec<u8>)> {
    let chk = complete_checkpoints(dir).pop().expect("a checkpoint");
    let meta = CheckpointMetadata::read(&chk).unwrap();
    let mut states: Vec<(u16, Vec<u8>)> = meta
        .subtasks
        .iter()
        .filter(|s| s.operator == SOURCE_UID)
        .map(|s| (s.subtask, s.inline_state.clone()))
        .collect();
    states.sort();
    states
}

#[test]
fn a_source_s_state_is_restored_to_every_subtask_at_any_parallelism_and_never_fresh() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();

    // A fresh start at parallelism 2: no restore_state; stopped after 2 checkpoints.
    let calls = Calls::default();
    run_until(&job(dir, 2, &calls), || {
        complete_checkpoints(dir).len() >= 2
    });
    assert_eq!(
        *calls
            .lock()
            .unwrap()
            .iter()
            .map(|(_, c)| c)
            .collect::<Vec<_>>(),
        [&Call::Open, &Call::Open],
        "a fresh start restores no state"
    );
    let held = held_states(dir);
    assert_eq!(
        held.iter().map(|s| s.0).collect::<Vec<_>>(),
        [0, 1],
        "one state per source subtask"
    );
    for (i, state) in &held {
        let text = String::from_utf8(state.clone()).unwrap();
        assert!(text.starts_with(&format!("{i}:0,1,")), "{text}");
    }

    // Restored at parallelism 3, then at 1: each new subtask gets every old subtask's
    // state, as the checkpoint holds them, once and before it opens.
    for p in [3u16, 1] {
        let held = held_states(dir);
        let calls = Calls::default();
        let opened = |calls: &Calls| {
            calls
                .lock()
                .unwrap()
                .iter()
                .filter(|(_, c)| *c == Call::Open)
                .count()
        };
        run_until(&job(dir, p, &calls), || opened(&calls) == usize::from(p));
        let calls = calls.lock().unwrap().clone();
        for i in 0..p {
            let mine: Vec<&Call> = calls
                .iter()
                .filter(|(j, _)| *j == i)
                .map(|(_, c)| c)
                .collect();
            assert_eq!(
                mine,
                [&Call::Restore(held.clone()), &Call::Open],
                "subtask {i} of {p}: the checkpoint's states, once, before open"
            );
        }
    }
    assert_eq!(held_states(dir).len(), 1, "the last run's one subtask");
}

#[test]
fn a_keyed_operator_may_not_take_the_source_s_uid() {
    use lockgate::operators::rolling_sum::{json_key, RollingSum};
    let built = Job::builder("uids")
        .checkpointing(CheckpointSettings::new("never-written"))
        .source("counter", |index| {
            Box::new(Counter {
                index,
                ids: Vec::new(),
                calls: Calls::default(),
            }) as Box<dyn Source>
        })
        .key_by(|r| json_key(r, "/id"))
        .keyed("rolling_sum", SOURCE_UID, |_| RollingSum {
            field: "/id".into(),
            output: "/total".into(),
        })
        .sink_spec(FileSink::spec(FileSinkConfig::json("out")))
        .build();
    let err = built.err().expect("refused").to_string();
    assert!(err.contains("operator uid source is used twice"), "{err}");
}
