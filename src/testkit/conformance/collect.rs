//! The exactly-once collecting sink that the source cases read a source through: a
//! [`TwoPhaseWriter`] into an in-memory store shared by every run of a case, so that
//! what it holds after crashes, restarts and rescales is what a perfect external
//! system would hold.
//!
//! It can pace itself (`records_per_sec` per subtask, by sleeping in `write`), so that
//! a case can stop or fail a job mid-stream without the source under test having to
//! slow down.

use crate::connector::{Guarantee, SinkCaps, SinkSpec, SubtaskInfo};
use crate::error::{JobError, Result};
use crate::kits::{TwoPhaseSink, TwoPhaseWriter};
use crate::record::{Batch, Record};
use async_trait::async_trait;
use lockgate_state::CheckpointId;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One collected record: the split it came from (when the source says) and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collected {
    pub stream: Option<String>,
    pub split: Option<i32>,
    pub value: Vec<u8>,
}

impl Collected {
    fn of(r: &Record) -> Collected {
        Collected {
            stream: r.origin.as_ref().map(|o| o.stream.to_string()),
            split: r.origin.as_ref().map(|o| o.partition),
            value: r.value.to_vec(),
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// `(subtask, checkpoint)` -> records staged, not yet committed.
    staged: BTreeMap<(u16, u64), Vec<Collected>>,
    /// `(checkpoint, subtask)` -> records committed, in commit order.
    committed: BTreeMap<(u64, u16), Vec<Collected>>,
    /// Committed and then taken back by a restore of an older checkpoint.
    rolled_back: usize,
}

/// The store every run of a case writes into.
#[derive(Debug, Clone, Default)]
pub struct Store(Arc<Mutex<Inner>>);

impl Store {
    /// What is committed, in checkpoint order (within one checkpoint, by subtask).
    pub fn committed(&self) -> Vec<Collected> {
        let inner = self.0.lock().expect("store lock");
        inner.committed.values().flatten().cloned().collect()
    }

    /// How many records checkpoint `id` committed (and still stand).
    pub fn committed_by(&self, id: u64) -> usize {
        let inner = self.0.lock().expect("store lock");
        inner
            .committed
            .range((id, 0)..=(id, u16::MAX))
            .map(|(_, v)| v.len())
            .sum()
    }

    /// How many records are committed.
    pub fn committed_len(&self) -> usize {
        let inner = self.0.lock().expect("store lock");
        inner.committed.values().map(Vec::len).sum()
    }

    /// How many committed records restores took back.
    pub fn rolled_back(&self) -> usize {
        self.0.lock().expect("store lock").rolled_back
    }

    /// The sink writing into this store, paced to `records_per_sec` per subtask
    /// (0: unpaced).
    pub fn spec(&self, records_per_sec: u64) -> SinkSpec {
        let store = self.clone();
        SinkSpec::new("collect", move |_| {
            Box::new(TwoPhaseSink::new(CollectWriter {
                store: store.clone(),
                index: 0,
                parallelism: 1,
                current: Vec::new(),
                pace: (records_per_sec > 0)
                    .then(|| Duration::from_secs_f64(1.0 / records_per_sec as f64)),
            }))
        })
        .with_caps(SinkCaps {
            guarantee: Guarantee::ExactlyOnce,
            ..Default::default()
        })
    }
}

struct CollectWriter {
    store: Store,
    index: u16,
    parallelism: u16,
    current: Vec<Collected>,
    pace: Option<Duration>,
}

#[async_trait]
impl TwoPhaseWriter for CollectWriter {
    type Committable = (u16, u64);

    async fn open(
        &mut self,
        info: &SubtaskInfo,
        _restored: Option<CheckpointId>,
        _to_commit: &[(u16, u64)],
    ) -> Result<()> {
        self.index = info.index;
        self.parallelism = info.parallelism;
        Ok(())
    }

    async fn write(&mut self, batch: &Batch) -> Result<()> {
        self.current.extend(batch.iter().map(Collected::of));
        if let Some(per_record) = self.pace {
            tokio::time::sleep(per_record * batch.len() as u32).await;
        }
        Ok(())
    }

    async fn prepare_commit(&mut self, id: CheckpointId) -> Result<Option<(u16, u64)>> {
        if self.current.is_empty() {
            return Ok(None);
        }
        let mut inner = self.store.0.lock().expect("store lock");
        inner
            .staged
            .insert((self.index, id.0), std::mem::take(&mut self.current));
        Ok(Some((self.index, id.0)))
    }

    async fn commit(&mut self, &(subtask, id): &(u16, u64)) -> Result<()> {
        let mut inner = self.store.0.lock().expect("store lock");
        if let Some(records) = inner.staged.remove(&(subtask, id)) {
            inner.committed.insert((id, subtask), records);
            Ok(())
        } else if inner.committed.contains_key(&(id, subtask)) {
            Ok(())
        } else {
            Err(JobError::task(
                "collect",
                format!("staged records of subtask {subtask}, checkpoint {id} are gone"),
            ))
        }
    }

    async fn abort_abandoned(
        &mut self,
        restored: Option<CheckpointId>,
        named: &[(u16, u64)],
    ) -> Result<()> {
        let (index, p) = (self.index, self.parallelism.max(1));
        let mut inner = self.store.0.lock().expect("store lock");
        inner
            .staged
            .retain(|&(s, id), _| s % p != index || named.contains(&(s, id)));
        let after: Vec<(u64, u16)> = inner
            .committed
            .keys()
            .filter(|&&(id, s)| s % p == index && restored.is_none_or(|k| id > k.0))
            .copied()
            .collect();
        for k in after {
            let n = inner.committed.remove(&k).map_or(0, |v| v.len());
            inner.rolled_back += n;
        }
        Ok(())
    }
}
