//! A deterministic, checkpointable, bounded sequence source (Flink's generateSequence).
//!
//! Record `i` (for `from <= i <= to`) is `{"seq": i, "key": i % keys, "value": i}`.
//! The sequence is cut into `splits` splits by key: split `j` holds the records whose
//! key `k` has `k % splits == j`, in increasing order. All records of a key therefore
//! come from one split in order, which makes keyed results (running sums) identical in
//! every run, whatever the parallelism and whatever the failures. Split `j` is read by
//! subtask `j % parallelism`, so a checkpoint restores at any parallelism.

use crate::connector::{
    split_start, KeyError, ModuloAssigner, PreparedSource, SectionContext, Source, SourceCaps,
    SourceFacts, SourcePoll, SourceSpec, SplitStart, SubtaskInfo,
};
use crate::error::{JobError, Result};
use crate::record::{Batch, Origin, Record};
use async_trait::async_trait;
use lockgate_state::{CheckpointId, NextOffset, SourcePosition};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The source kind of the sequence source in a job graph.
pub const KIND: &str = "sequence";
/// The stream name under which sequence positions are checkpointed.
pub const STREAM: &str = "sequence";

/// Configuration of a sequence source.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceConfig {
    pub from: i64,
    /// Inclusive.
    pub to: i64,
    pub keys: u32,
    /// Records per second over all subtasks; 0 = as fast as possible.
    pub rate_per_sec: u64,
    /// Number of splits; fixed for the life of the job (the job's `max_parallelism`).
    pub splits: u16,
}

/// `[source.sequence]` as written in a job file.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SequenceSection {
    from: Option<i64>,
    to: i64,
    keys: Option<u32>,
    rate_per_sec: Option<u64>,
}

impl SequenceSection {
    /// The source's configuration (defaults: from 1, 1000 keys, as fast as possible)
    /// with `splits` splits. An error is `(key, message)`.
    pub fn config(&self, splits: u16) -> Result<SequenceConfig, (String, String)> {
        let from = self.from.unwrap_or(1);
        if self.to < from {
            return Err(("to".into(), format!("{} is below from ({from})", self.to)));
        }
        let keys = self.keys.unwrap_or(1000);
        if keys == 0 {
            return Err(("keys".into(), "must be at least 1".into()));
        }
        Ok(SequenceConfig {
            from,
            to: self.to,
            keys,
            rate_per_sec: self.rate_per_sec.unwrap_or(0),
            splits,
        })
    }
}

impl crate::connector::SourceSection for SequenceSection {
    fn prepare(self, cx: &SectionContext) -> Result<PreparedSource, KeyError> {
        let cfg = self.config(cx.max_parallelism)?;
        let mut facts = SourceFacts::json(KIND);
        facts.not_split_keyed = Some(format!(
            "the sequence source's keys span its splits: {}",
            crate::connector::section::CO_PARTITIONED_FIX
        ));
        Ok(PreparedSource {
            facts,
            config: Arc::new(cfg.clone()),
            build: Box::new(move |_| SequenceSource::spec(cfg)),
        })
    }
}

/// The JSON text of record `i`.
pub fn record_json(i: i64, keys: u32) -> Vec<u8> {
    format!(
        "{{\"seq\":{i},\"key\":{},\"value\":{i}}}",
        i.rem_euclid(i64::from(keys))
    )
    .into_bytes()
}

struct Split {
    id: u16,
    /// Number of splits: the key residues of this split are `id, id + n, id + 2n, ...`
    /// below `keys`, so a split needs no list of its keys (10^7 keys cost nothing).
    n: i64,
    next: i64,
}

impl Split {
    /// The first record `>= at` that belongs to this split, in O(1).
    fn seek(&self, at: i64, keys: i64) -> i64 {
        let first = i64::from(self.id);
        if first >= keys {
            return i64::MAX;
        }
        let base = at.div_euclid(keys);
        let r = at.rem_euclid(keys);
        // The smallest residue >= r that is congruent to `id` modulo n.
        let x = r + (first - r).rem_euclid(self.n);
        if x < keys {
            base * keys + x
        } else {
            (base + 1) * keys + first
        }
    }
}

/// The sequence source subtask.
pub struct SequenceSource {
    cfg: SequenceConfig,
    splits: Vec<Split>,
    cursor: usize,
    stream: Arc<str>,
    rate_per_subtask: f64,
    started: Option<Instant>,
    emitted: u64,
}

impl SequenceSource {
    /// A subtask of a sequence source; splits are assigned in `open`.
    pub fn new(cfg: SequenceConfig) -> SequenceSource {
        SequenceSource {
            cfg,
            splits: Vec::new(),
            cursor: 0,
            stream: Arc::from(STREAM),
            rate_per_subtask: 0.0,
            started: None,
            emitted: 0,
        }
    }

    /// The source as the runtime takes it: bounded, split `j` read by subtask
    /// `j % parallelism` ([`ModuloAssigner`]).
    pub fn spec(cfg: SequenceConfig) -> SourceSpec {
        SourceSpec::new(KIND, move |_| Box::new(SequenceSource::new(cfg.clone())))
            .assigned_by(ModuloAssigner)
            .with_caps(SourceCaps {
                bounded: true,
                discovers_splits: false,
            })
    }

    fn end(&self) -> i64 {
        self.cfg.to.saturating_add(1)
    }
}

/// The batch size of one poll. A source task routes a whole poll before it looks at a
/// checkpoint trigger, so a poll is kept small: a trigger waits for at most this many
/// records to be routed downstream.
const BATCH: usize = 256;

#[async_trait]
impl Source for SequenceSource {
    async fn open(
        &mut self,
        info: &SubtaskInfo,
        restored: Option<&[SourcePosition]>,
    ) -> Result<()> {
        let keys = i64::from(self.cfg.keys.max(1));
        let n = self.cfg.splits.max(1);
        for j in (0..n).filter(|j| info.reads(STREAM, i32::from(*j))) {
            let mut split = Split {
                id: j,
                n: i64::from(n),
                next: 0,
            };
            // The splits are fixed: one missing from the checkpoint is of another layout.
            let start = match split_start(restored, STREAM, i32::from(j)) {
                SplitStart::Fresh => self.cfg.from,
                SplitStart::Restored(p) => p.next.0,
                SplitStart::NotInCheckpoint => {
                    return Err(JobError::Restore(format!(
                        "sequence split {j} is missing from the restored checkpoint (was `splits` changed?)"
                    )))
                }
            };
            split.next = split.seek(start, keys);
            self.splits.push(split);
        }
        if self.cfg.rate_per_sec > 0 {
            let subtasks = u32::from(info.parallelism) * u32::from(info.member.count);
            self.rate_per_subtask = self.cfg.rate_per_sec as f64 / f64::from(subtasks);
        }
        Ok(())
    }

    async fn poll(&mut self, out: &mut Batch) -> Result<SourcePoll> {
        let end = self.end();
        let keys = i64::from(self.cfg.keys.max(1));
        let mut budget = BATCH;
        if self.rate_per_subtask > 0.0 {
            let started = *self.started.get_or_insert_with(Instant::now);
            let allowed = (started.elapsed().as_secs_f64() * self.rate_per_subtask) as u64;
            if allowed <= self.emitted {
                tokio::time::sleep(Duration::from_millis(5)).await;
                return Ok(SourcePoll::Idle);
            }
            budget = budget.min((allowed - self.emitted) as usize);
        }
        let before = out.len();
        // Round-robin over splits so that every split advances.
        let n = self.splits.len();
        let mut idle_rounds = 0;
        while out.len() - before < budget && idle_rounds < n {
            let split = &mut self.splits[self.cursor];
            self.cursor = (self.cursor + 1) % n.max(1);
            if split.next >= end {
                idle_rounds += 1;
                continue;
            }
            idle_rounds = 0;
            let take = (budget - (out.len() - before)).min(64);
            for _ in 0..take {
                if split.next >= end {
                    break;
                }
                let i = split.next;
                out.push(Record {
                    key: None,
                    route_key: None,
                    value: record_json(i, self.cfg.keys).into(),
                    origin: Some(Origin {
                        stream: self.stream.clone(),
                        partition: i32::from(split.id),
                        offset: i,
                    }),
                    ..Default::default()
                });
                split.next = split.seek(i + 1, keys);
            }
        }
        self.emitted += (out.len() - before) as u64;
        if self.splits.iter().all(|s| s.next >= end) {
            Ok(SourcePoll::Finished)
        } else {
            Ok(SourcePoll::Ready)
        }
    }

    fn snapshot(&mut self, _id: CheckpointId) -> Result<Vec<SourcePosition>> {
        let end = self.end();
        Ok(self
            .splits
            .iter()
            .map(|s| SourcePosition {
                stream: STREAM.to_string(),
                partition: i32::from(s.id),
                next: NextOffset(s.next.min(end)),
                end: Some(NextOffset(end)),
                applied: Vec::new(),
                stream_id: None,
                opaque: None,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(index: u16, parallelism: u16) -> SubtaskInfo {
        SubtaskInfo::new("t", &format!("source-{index}"), index, parallelism)
            .with_max_parallelism(8)
            .with_assignment(crate::connector::Assignment::new(ModuloAssigner))
    }

    fn cfg() -> SequenceConfig {
        SequenceConfig {
            from: 1,
            to: 1000,
            keys: 13,
            rate_per_sec: 0,
            splits: 8,
        }
    }

    async fn drain(src: &mut SequenceSource, limit: usize) -> Vec<i64> {
        let mut out = Vec::new();
        let mut seen = Vec::new();
        loop {
            let r = src.poll(&mut out).await.unwrap();
            seen.extend(out.drain(..).map(|r| r.origin.unwrap().offset));
            if r == SourcePoll::Finished || seen.len() >= limit {
                return seen;
            }
        }
    }

    #[tokio::test]
    async fn subtasks_cover_the_sequence_exactly_once_in_key_order() {
        let mut all = Vec::new();
        for i in 0..3 {
            let mut s = SequenceSource::new(cfg());
            s.open(&info(i, 3), None).await.unwrap();
            let got = drain(&mut s, usize::MAX).await;
            // Within a key, records come in increasing order.
            for k in 0..13 {
                let of_key: Vec<_> = got.iter().filter(|v| *v % 13 == k).collect();
                assert!(of_key.windows(2).all(|w| w[0] < w[1]));
            }
            all.extend(got);
        }
        all.sort();
        assert_eq!(all, (1..=1000).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn snapshot_restores_at_another_parallelism_without_gap_or_repeat() {
        let mut seen = Vec::new();
        let mut positions = Vec::new();
        for i in 0..2 {
            let mut s = SequenceSource::new(cfg());
            s.open(&info(i, 2), None).await.unwrap();
            seen.extend(drain(&mut s, 300).await);
            positions.extend(s.snapshot(CheckpointId(1)).unwrap());
        }
        for i in 0..3 {
            let mut s = SequenceSource::new(cfg());
            s.open(&info(i, 3), Some(&positions)).await.unwrap();
            seen.extend(drain(&mut s, usize::MAX).await);
        }
        seen.sort();
        assert_eq!(seen, (1..=1000).collect::<Vec<_>>());
    }

    #[test]
    fn seek_finds_the_next_record_of_the_split_as_a_scan_would() {
        // The definition: the first i >= at whose key i % keys is congruent to the
        // split id modulo the number of splits.
        for (keys, n) in [(13i64, 8i64), (5, 8), (1, 3), (100, 7), (16, 4)] {
            for id in 0..n as u16 {
                let split = Split { id, n, next: 0 };
                for at in -30..300i64 {
                    let scan = (at..at + 10 * keys * n)
                        .find(|i| i.rem_euclid(keys) % n == i64::from(id))
                        .unwrap_or(i64::MAX);
                    assert_eq!(
                        split.seek(at, keys),
                        scan,
                        "keys {keys} n {n} split {id} at {at}"
                    );
                }
            }
        }
    }
}
