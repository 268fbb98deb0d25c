//! Splits: the units a source's input is cut into (a Kafka partition, a sequence
//! split, a file), each checkpointed as one [`SourcePosition`], and who reads each.
//!
//! A source names its splits `(stream, split)` and declares, in its
//! [`super::SourceSpec`], the [`SplitAssigner`] that deals them out. The runtime
//! applies it, the same way for every source: splits go to members first, then to the
//! member's subtasks ([`split_reader`]), so that changing `job.parallelism` never moves
//! a split from one member to another. A source asks [`super::SubtaskInfo::reads`]
//! which splits are its own, and [`split_start`] where each starts.
//!
//! Restore works for any assignment: a checkpoint keeps the union of every subtask's
//! positions, and each subtask of the next run takes the ones it now reads. Rescaling
//! (another parallelism, another member count) is therefore the same code as a restart.

use crate::member::Member;
use lockgate_state::SourcePosition;
use std::fmt;
use std::sync::Arc;

/// Deals the splits of a source out over `n` readers. The rule must be a plain
/// function of its arguments (every subtask and every member computes it on its own,
/// and they must agree) and should spread a stream's splits evenly.
pub trait SplitAssigner: Send + Sync + 'static {
    /// The reader (below `n`, which is at least 1) of split `split` of `stream`.
    fn owner(&self, stream: &str, split: i32, n: u16) -> u16;

    /// The rule's name, in logs and debug output.
    fn name(&self) -> &'static str;
}

/// Split `j` goes to reader `j % n` (the sequence source's rule: its splits number
/// `0..max_parallelism`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ModuloAssigner;

impl SplitAssigner for ModuloAssigner {
    fn owner(&self, _stream: &str, split: i32, n: u16) -> u16 {
        split.rem_euclid(i32::from(n)) as u16
    }

    fn name(&self) -> &'static str {
        "modulo"
    }
}

/// Flink's `KafkaTopicPartitionAssigner`: the first reader of a stream comes from the
/// hash of its name, then its splits go round robin. Several streams of few splits
/// therefore do not all pile onto reader 0; the owners match a Flink job's.
#[derive(Debug, Clone, Copy, Default)]
pub struct StreamHashAssigner;

impl SplitAssigner for StreamHashAssigner {
    fn owner(&self, stream: &str, split: i32, n: u16) -> u16 {
        let p = i32::from(n);
        let start = (java_string_hash(stream).wrapping_mul(31) & 0x7FFF_FFFF) % p;
        ((start + split).rem_euclid(p)) as u16
    }

    fn name(&self) -> &'static str {
        "stream-hash"
    }
}

/// Java's `String.hashCode`, over UTF-16 code units (Flink's assigner uses it).
pub fn java_string_hash(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)))
}

/// The assignment rule of a job's source, shared by its subtasks.
#[derive(Clone)]
pub struct Assignment(Arc<dyn SplitAssigner>);

impl Assignment {
    /// The rule `a`.
    pub fn new(a: impl SplitAssigner) -> Assignment {
        Assignment(Arc::new(a))
    }

    /// The rule itself.
    pub fn assigner(&self) -> &dyn SplitAssigner {
        &*self.0
    }
}

impl Default for Assignment {
    /// [`StreamHashAssigner`], the rule of a source that declares none.
    fn default() -> Assignment {
        Assignment::new(StreamHashAssigner)
    }
}

impl fmt::Debug for Assignment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Assignment({})", self.0.name())
    }
}

/// Whether member `me` reads split `split` of `stream`: splits are dealt to members
/// first, over the member count, independently of each member's parallelism.
pub fn owns_split(me: Member, a: &dyn SplitAssigner, stream: &str, split: i32) -> bool {
    a.owner(stream, split, me.count) == me.index
}

/// The local subtask (of `parallelism`) of member `me` that reads split `split` of
/// `stream`, or `None` when another member reads it. Within a member, its splits are
/// spread over its subtasks by their rank among the member's splits
/// (`split / count`, consecutive for one member), so that they stay balanced; for a
/// job run as one process this is exactly `a.owner(stream, split, parallelism)`.
pub fn split_reader(
    me: Member,
    parallelism: u16,
    a: &dyn SplitAssigner,
    stream: &str,
    split: i32,
) -> Option<u16> {
    if !owns_split(me, a, stream, split) {
        return None;
    }
    let rank = split.div_euclid(i32::from(me.count));
    Some(a.owner(stream, rank, parallelism))
}

/// Where one split starts, from what was restored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitStart<'a> {
    /// The job starts without a checkpoint: the source's startup setting applies.
    Fresh,
    /// The restored checkpoint holds the split: continue exactly at this position.
    Restored(&'a SourcePosition),
    /// A checkpoint was restored but does not hold the split: it appeared since
    /// (a partition added to a topic, a file added to a directory) and starts at its
    /// beginning, whatever the startup setting says (Flink's rule), so that none of
    /// its records is skipped. A source whose splits are fixed for the life of the job
    /// treats this as an error instead (the checkpoint is of another split layout).
    NotInCheckpoint,
}

/// Where split `split` of `stream` starts, given the restored positions (`None`: no
/// checkpoint was restored; `Some` even when empty).
pub fn split_start<'a>(
    restored: Option<&'a [SourcePosition]>,
    stream: &str,
    split: i32,
) -> SplitStart<'a> {
    match restored {
        None => SplitStart::Fresh,
        Some(positions) => positions
            .iter()
            .find(|p| p.stream == stream && p.partition == split)
            .map_or(SplitStart::NotInCheckpoint, SplitStart::Restored),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockgate_state::NextOffset;
    use proptest::prelude::*;

    fn m(index: u16, count: u16) -> Member {
        Member::new(index, count).unwrap()
    }

    #[test]
    fn java_hash_matches_java() {
        // Values computed by java.lang.String#hashCode.
        assert_eq!(java_string_hash(""), 0);
        assert_eq!(java_string_hash("orders"), -1008770331);
        assert_eq!(java_string_hash("hello"), 99162322);
    }

    fn assigner(kind: &str) -> Assignment {
        match kind {
            "modulo" => Assignment::new(ModuloAssigner),
            _ => Assignment::new(StreamHashAssigner),
        }
    }

    proptest! {
        #[test]
        fn splits_of_a_stream_spread_evenly(kind in prop_oneof!["modulo", "stream-hash"], stream in "[a-z]{1,12}", parts in 1i32..200, p in 1u16..32) {
            let a = assigner(&kind);
            let mut counts = vec![0i32; usize::from(p)];
            for part in 0..parts {
                let o = a.assigner().owner(&stream, part, p);
                prop_assert!(o < p);
                counts[usize::from(o)] += 1;
            }
            let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            prop_assert!(max - min <= 1, "round robin: {:?}", counts);
        }

        /// Every split is read by exactly one subtask of one member; members split a
        /// stream's splits evenly and so do a member's subtasks; which member reads a
        /// split does not depend on the parallelism.
        #[test]
        fn each_split_has_exactly_one_reader(kind in prop_oneof!["modulo", "stream-hash"], topic in "[a-z]{1,10}", parts in 1i32..100, count in 1u16..6, p in 1u16..5, q in 1u16..5) {
            let a = assigner(&kind);
            let a = a.assigner();
            let mut per_subtask = vec![vec![0i32; usize::from(p)]; usize::from(count)];
            for part in 0..parts {
                let readers: Vec<(Member, u16)> = Member::all(count)
                    .filter_map(|me| split_reader(me, p, a, &topic, part).map(|j| (me, j)))
                    .collect();
                prop_assert_eq!(readers.len(), 1);
                let (me, j) = readers[0];
                prop_assert!(j < p);
                prop_assert!(owns_split(me, a, &topic, part));
                prop_assert!(split_reader(me, q, a, &topic, part).is_some(), "the member keeps it at parallelism {}", q);
                per_subtask[usize::from(me.index)][usize::from(j)] += 1;
            }
            let members: Vec<i32> = per_subtask.iter().map(|s| s.iter().sum()).collect();
            let (lo, hi) = (members.iter().min().unwrap(), members.iter().max().unwrap());
            prop_assert!(hi - lo <= 1, "members {:?}", members);
            for s in &per_subtask {
                let (lo, hi) = (s.iter().min().unwrap(), s.iter().max().unwrap());
                prop_assert!(hi - lo <= 1, "subtasks {:?}", per_subtask);
            }
        }
    }

    #[test]
    fn one_process_reads_splits_as_before_members_existed() {
        let (hash, modulo) = (StreamHashAssigner, ModuloAssigner);
        for part in 0..40 {
            assert_eq!(
                split_reader(Member::SOLO, 3, &hash, "orders", part),
                Some(hash.owner("orders", part, 3))
            );
            assert_eq!(
                split_reader(Member::SOLO, 3, &modulo, "sequence", part),
                Some((part % 3) as u16)
            );
        }
        // Flink's start index for "orders" over 3 readers:
        // ((hashCode("orders") * 31) & 0x7FFFFFFF) % 3, computed apart.
        assert_eq!(hash.owner("orders", 0, 3), 0);
        assert_eq!(hash.owner("orders", 1, 3), 1);
        // Member 1 of 2 reads the odd splits of the sequence, alternating subtasks.
        let read: Vec<(i32, u16)> = (0..8)
            .filter_map(|j| split_reader(m(1, 2), 2, &modulo, "sequence", j).map(|s| (j, s)))
            .collect();
        assert_eq!(read, vec![(1, 0), (3, 1), (5, 0), (7, 1)]);
    }

    #[test]
    fn a_split_starts_fresh_restored_or_at_its_beginning() {
        let at = |stream: &str, partition, next| SourcePosition {
            stream: stream.into(),
            partition,
            next: NextOffset(next),
            end: None,
            applied: Vec::new(),
            stream_id: None,
            opaque: None,
        };
        let restored = [at("a", 0, 7), at("b", 0, 9)];
        assert_eq!(split_start(None, "a", 0), SplitStart::Fresh);
        assert_eq!(
            split_start(Some(&restored), "a", 0),
            SplitStart::Restored(&restored[0])
        );
        assert_eq!(
            split_start(Some(&restored), "b", 0),
            SplitStart::Restored(&restored[1])
        );
        assert_eq!(
            split_start(Some(&restored), "a", 1),
            SplitStart::NotInCheckpoint
        );
        assert_eq!(split_start(Some(&[]), "a", 0), SplitStart::NotInCheckpoint);
    }
}
