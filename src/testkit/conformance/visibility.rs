//! The sink case `visibility_at_checkpoints`: what the destination's readers see at
//! each moment of the checkpoint protocol, read through the fixture while the job runs.
//!
//! - An exactly-once sink: the records a subtask wrote since its last barrier are not
//!   visible once the next barrier has passed it, nor after that checkpoint is
//!   aborted; they are visible once a checkpoint that holds them completed. A sink that
//!   commits at the barrier (visible before the checkpoint is durable) fails here: a
//!   crash between the barrier and the checkpoint's completion would replay records
//!   its readers already saw.
//! - Any other sink: everything written before a barrier is visible once the barrier
//!   has passed the sink (it flushes at the barrier, as its snapshot promises).
//!
//! [`CommitAtBarrier`] is the mutation that proves the case: a sink whose commit runs
//! inside its snapshot.

use super::sink::{canonical, check, expected, SinkFixture, SinkTestContext};
use super::{job_builder, runtime, CaseResult};
use crate::connector::{Guarantee, Sink, SinkRestore, SinkSpec, SubtaskInfo};
use crate::connectors::sequence::{SequenceConfig, SequenceSource};
use crate::error::{JobError, Result};
use crate::record::Batch;
use async_trait::async_trait;
use lockgate_state::CheckpointId;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Records of the case: two seconds at the pace below, so that checkpoint 3 comes long
/// before the end even when each checkpoint waits for a slow destination.
const RECORDS: i64 = 8_000;
const PACE: u64 = 4_000;
/// The destination is read at checkpoints up to this id (each read is a full read).
const PROBED: u64 = 6;
/// The checkpoint the probe declines after the sink staged it, so that it is aborted.
const DECLINED: u64 = 3;
/// How long after `notify_checkpoint_complete` returns a commit may take to reach the
/// destination's readers.
const COMMIT_VISIBLE_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// What the probes of one run share.
struct Shared {
    fixture: Mutex<Box<dyn SinkFixture>>,
    guarantee: Guarantee,
    findings: Mutex<Vec<String>>,
    declined: AtomicBool,
    /// Barriers probed with records written before them, and completions probed with
    /// records they commit: a run that probed none proves nothing.
    probed_barriers: AtomicU64,
    probed_commits: AtomicU64,
}

impl Shared {
    /// What the destination's readers see now, each record's canonical text; `None`
    /// when it cannot be read (a finding: the sink itself is not failed for it).
    fn visible(&self) -> Option<HashSet<Vec<u8>>> {
        match tokio::task::block_in_place(|| self.fixture.lock().expect("the fixture").read()) {
            Ok(read) => Some(read.iter().map(canonical).collect()),
            Err(e) => {
                self.found(format!("reading the destination: {e}"));
                None
            }
        }
    }

    /// How many of `records` are still not visible after a bounded wait
    /// ([`COMMIT_VISIBLE_WITHIN`]), starting from `visible`.
    async fn missing_within(&self, records: &[Vec<u8>], mut visible: HashSet<Vec<u8>>) -> usize {
        let deadline = std::time::Instant::now() + COMMIT_VISIBLE_WITHIN;
        loop {
            let missing = Probe::count(records, &visible, false);
            if missing == 0 || std::time::Instant::now() > deadline {
                return missing;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            match self.visible() {
                Some(v) => visible = v,
                None => return missing,
            }
        }
    }

    fn found(&self, what: String) {
        self.findings.lock().expect("findings").push(what);
    }
}

/// A sink under test with a reader at its side.
struct Probe {
    inner: Box<dyn Sink>,
    shared: Arc<Shared>,
    subtask: u16,
    /// The records invoked since the last barrier.
    open: Vec<Vec<u8>>,
    /// The records of each checkpoint not yet complete (an exactly-once sink's staged
    /// output), by checkpoint id.
    staged: BTreeMap<u64, Vec<Vec<u8>>>,
}

impl Probe {
    /// How many of `records` are (`true`) or are not (`false`) in `visible`.
    fn count(records: &[Vec<u8>], visible: &HashSet<Vec<u8>>, seen: bool) -> usize {
        records
            .iter()
            .filter(|r| visible.contains(*r) == seen)
            .count()
    }

    /// Every record of the checkpoints not yet complete.
    fn pending(&self) -> Vec<Vec<u8>> {
        self.staged.values().flatten().cloned().collect()
    }
}

#[async_trait]
impl Sink for Probe {
    async fn open(&mut self, info: &SubtaskInfo, restored: &SinkRestore) -> Result<()> {
        self.subtask = info.index;
        self.inner.open(info, restored).await
    }

    async fn invoke(&mut self, batch: Batch) -> Result<()> {
        for r in &batch {
            let v: serde_json::Value = serde_json::from_slice(&r.value)
                .map_err(|e| JobError::Other(format!("the probe reads JSON records: {e}")))?;
            self.open.push(canonical(&v));
        }
        self.inner.invoke(batch).await
    }

    async fn snapshot(&mut self, id: CheckpointId) -> Result<Vec<u8>> {
        let state = self.inner.snapshot(id).await?;
        let epoch = std::mem::take(&mut self.open);
        let s = self.shared.clone();
        if id.0 <= PROBED && !epoch.is_empty() {
            if let Some(visible) = s.visible() {
                s.probed_barriers.fetch_add(1, Ordering::Relaxed);
                let n = epoch.len();
                match s.guarantee {
                    Guarantee::ExactlyOnce => {
                        let early = Self::count(&epoch, &visible, true);
                        if early > 0 {
                            s.found(format!(
                                "checkpoint {id}, subtask {}: {early} of the {n} records written since the last barrier are visible before the checkpoint completed",
                                self.subtask
                            ));
                        }
                    }
                    Guarantee::Idempotent | Guarantee::AtLeastOnce => {
                        // Flushed is durable; a broker shows it to readers once its
                        // replicas caught up: a bounded wait, as for a commit.
                        let missing = s.missing_within(&epoch, visible).await;
                        if missing > 0 {
                            s.found(format!(
                                "checkpoint {id}, subtask {}: {missing} of the {n} records written before the barrier are not visible {COMMIT_VISIBLE_WITHIN:?} after the sink's snapshot (a sink without commits flushes at the barrier)",
                                self.subtask
                            ));
                        }
                    }
                }
            }
        }
        if s.guarantee == Guarantee::ExactlyOnce {
            self.staged.insert(id.0, epoch);
        }
        if id.0 == DECLINED && self.subtask == 0 && !s.declined.swap(true, Ordering::SeqCst) {
            return Err(JobError::Declined(format!(
                "the conformance probe declines checkpoint {id} after the sink staged it"
            )));
        }
        Ok(state)
    }

    async fn notify_checkpoint_complete(&mut self, id: CheckpointId) -> Result<()> {
        self.inner.notify_checkpoint_complete(id).await?;
        let done: Vec<u64> = self.staged.range(..=id.0).map(|(k, _)| *k).collect();
        let committed: Vec<Vec<u8>> = done
            .iter()
            .filter_map(|k| self.staged.remove(k))
            .flatten()
            .collect();
        if id.0 <= PROBED && !committed.is_empty() {
            // A commit may reach its readers a moment after it returns (a broker writes
            // its markers): a bounded wait, then what is still missing is a finding.
            if let Some(visible) = self.shared.visible() {
                let missing = self.shared.missing_within(&committed, visible).await;
                if missing == 0 {
                    self.shared.probed_commits.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.shared.found(format!(
                        "checkpoint {id}, subtask {}: completed, and {missing} of the {} records it commits are not visible {COMMIT_VISIBLE_WITHIN:?} later",
                        self.subtask,
                        committed.len()
                    ));
                }
            }
        }
        Ok(())
    }

    async fn notify_checkpoint_aborted(&mut self, id: CheckpointId) -> Result<()> {
        self.inner.notify_checkpoint_aborted(id).await?;
        let pending = self.pending();
        if self.shared.guarantee == Guarantee::ExactlyOnce && !pending.is_empty() {
            let Some(visible) = self.shared.visible() else {
                return Ok(());
            };
            let early = Self::count(&pending, &visible, true);
            if early > 0 {
                self.shared.found(format!(
                    "checkpoint {id}, subtask {}: aborted, and {early} records of checkpoints not complete are visible",
                    self.subtask
                ));
            }
        }
        Ok(())
    }

    async fn close(&mut self) -> Result<()> {
        self.inner.close().await
    }
}

/// Case `visibility_at_checkpoints`, at parallelism 1 and then 2, each into a
/// destination of its own.
pub fn visibility_at_checkpoints(cx: &dyn SinkTestContext, dir: &Path) -> CaseResult {
    for parallelism in [1, 2] {
        let f = cx.create()?;
        let spec = f.spec()?;
        let guarantee = spec.caps.guarantee;
        let shared = Arc::new(Shared {
            fixture: Mutex::new(f),
            guarantee,
            findings: Mutex::new(Vec::new()),
            declined: AtomicBool::new(false),
            probed_barriers: AtomicU64::new(0),
            probed_commits: AtomicU64::new(0),
        });
        let probed = probed(spec, &shared);
        let input = SequenceConfig {
            from: 1,
            to: RECORDS,
            keys: 100,
            rate_per_sec: PACE,
            splits: 16,
        };
        let g = job_builder(
            "visibility",
            &dir.join(parallelism.to_string()),
            parallelism,
        )
        .source_spec(SequenceSource::spec(input))
        .sink_spec(probed)
        .build()
        .map_err(|e| format!("the job does not build: {e}"))?;
        super::run_to_end(&runtime(), &g, None)?;
        let findings = shared.findings.lock().expect("findings").clone();
        if !findings.is_empty() {
            return Err(format!(
                "parallelism {parallelism}: {}",
                findings.join("; ")
            ));
        }
        if !shared.declined.load(Ordering::SeqCst) {
            return Err(format!(
                "parallelism {parallelism}: the run ended before checkpoint {DECLINED}: nothing was probed"
            ));
        }
        let barriers = shared.probed_barriers.load(Ordering::Relaxed);
        let commits = shared.probed_commits.load(Ordering::Relaxed);
        if barriers == 0 || (guarantee == Guarantee::ExactlyOnce && commits == 0) {
            return Err(format!(
                "parallelism {parallelism}: {barriers} barriers and {commits} commits probed with records: the case proved nothing"
            ));
        }
        let f = shared.fixture.lock().expect("the fixture");
        check(f.as_ref(), guarantee, &expected(RECORDS))
            .map_err(|e| format!("parallelism {parallelism}: {e}"))?;
    }
    Ok(())
}

/// `spec` with each of its sinks behind a probe.
fn probed(spec: SinkSpec, shared: &Arc<Shared>) -> SinkSpec {
    let inner = spec.factory.clone();
    let shared = shared.clone();
    SinkSpec {
        factory: Arc::new(move |i| {
            Box::new(Probe {
                inner: inner(i),
                shared: shared.clone(),
                subtask: i,
                open: Vec::new(),
                staged: BTreeMap::new(),
            })
        }),
        ..spec
    }
}

/// A mutation of `C`'s sinks for the suite's own tests: each commits inside its
/// snapshot, at the barrier, before the checkpoint is durable. Such a sink passes every
/// case that looks only at the final output; `visibility_at_checkpoints` fails it.
pub struct CommitAtBarrier<C>(pub C);

impl<C: SinkTestContext> SinkTestContext for CommitAtBarrier<C> {
    fn create(&self) -> std::result::Result<Box<dyn SinkFixture>, String> {
        Ok(Box::new(Mutated(self.0.create()?)))
    }
}

struct Mutated(Box<dyn SinkFixture>);

impl SinkFixture for Mutated {
    fn spec(&self) -> std::result::Result<SinkSpec, String> {
        let spec = self.0.spec()?;
        let inner = spec.factory.clone();
        Ok(SinkSpec {
            factory: Arc::new(move |i| Box::new(CommitsNow(inner(i)))),
            ..spec
        })
    }

    fn read(&self) -> std::result::Result<Vec<serde_json::Value>, String> {
        self.0.read()
    }

    fn settled(&self) -> std::result::Result<(), String> {
        self.0.settled()
    }
}

struct CommitsNow(Box<dyn Sink>);

#[async_trait]
impl Sink for CommitsNow {
    async fn open(&mut self, info: &SubtaskInfo, restored: &SinkRestore) -> Result<()> {
        self.0.open(info, restored).await
    }

    async fn invoke(&mut self, batch: Batch) -> Result<()> {
        self.0.invoke(batch).await
    }

    async fn snapshot(&mut self, id: CheckpointId) -> Result<Vec<u8>> {
        let state = self.0.snapshot(id).await?;
        self.0.notify_checkpoint_complete(id).await?;
        Ok(state)
    }

    async fn notify_checkpoint_complete(&mut self, id: CheckpointId) -> Result<()> {
        self.0.notify_checkpoint_complete(id).await
    }

    async fn notify_checkpoint_aborted(&mut self, id: CheckpointId) -> Result<()> {
        self.0.notify_checkpoint_aborted(id).await
    }

    async fn close(&mut self) -> Result<()> {
        self.0.close().await
    }
}
