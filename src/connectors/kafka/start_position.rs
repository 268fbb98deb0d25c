//! Where each partition starts: a plain function over what was restored, what was
//! discovered and the configured startup mode. The I/O that turns a [`Start`] into a
//! concrete offset lives in the source; a marker is never persisted.

use super::config::Startup;
use super::Tp;
use lockgate_state::NextOffset;
use std::collections::BTreeMap;

/// Where one partition starts, before resolution against the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    Offset(NextOffset),
    Earliest,
    Latest,
    GroupOffset,
    Timestamp(i64),
}

/// Decides the start of every discovered partition.
///
/// - With a restored checkpoint (`restored` is `Some`, even if empty): a partition it
///   holds continues from its checkpointed offset; a partition it does not hold is new
///   since the checkpoint and starts at EARLIEST (Flink's rule), whatever `startup` says.
/// - Without one: `startup` applies to every partition.
///
/// Restored partitions that were not discovered are not returned (the caller drops them
/// with a warning).
pub fn start_positions(
    restored: Option<&BTreeMap<Tp, NextOffset>>,
    discovered: &[Tp],
    startup: &Startup,
) -> BTreeMap<Tp, Start> {
    discovered
        .iter()
        .map(|tp| {
            let start = match restored {
                Some(r) => r.get(tp).map_or(Start::Earliest, |o| Start::Offset(*o)),
                None => match startup {
                    Startup::Earliest => Start::Earliest,
                    Startup::Latest => Start::Latest,
                    Startup::GroupOffsets => Start::GroupOffset,
                    Startup::Timestamp(ms) => Start::Timestamp(*ms),
                    Startup::Offsets(m) => m
                        .get(tp)
                        .map_or(Start::Earliest, |o| Start::Offset(NextOffset(*o))),
                },
            };
            (tp.clone(), start)
        })
        .collect()
}

/// Kafka's answer to "first offset at or after this time": an offset, or none (no
/// record that late: `-1` or the end). Without a record at or after the time, reading
/// starts at the end of the partition (the high watermark).
pub fn resolve_timestamp(answer: Option<i64>, high_watermark: i64) -> NextOffset {
    match answer {
        Some(o) if o >= 0 && o <= high_watermark => NextOffset(o),
        _ => NextOffset(high_watermark),
    }
}

/// Whether a restored or explicit offset is readable in `[low, high]`; an offset below
/// `low` was deleted by retention, one above `high` never existed.
pub fn check_in_range(tp: &Tp, next: NextOffset, low: i64, high: i64) -> Result<(), String> {
    if next.0 < low {
        Err(format!(
            "{}/{}: offset {} was deleted by retention (earliest available is {low}); records between were lost to this job",
            tp.0, tp.1, next.0
        ))
    } else if next.0 > high {
        Err(format!(
            "{}/{}: offset {} is beyond the end of the partition ({high}); was the topic recreated?",
            tp.0, tp.1, next.0
        ))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tp(t: &str, p: i32) -> Tp {
        (t.to_string(), p)
    }

    #[test]
    fn restored_offsets_win_and_new_partitions_start_at_earliest() {
        let restored: BTreeMap<Tp, NextOffset> = [(tp("a", 0), NextOffset(17))].into();
        let got = start_positions(
            Some(&restored),
            &[tp("a", 0), tp("a", 1), tp("b", 0)],
            &Startup::Latest,
        );
        assert_eq!(got[&tp("a", 0)], Start::Offset(NextOffset(17)));
        assert_eq!(
            got[&tp("a", 1)],
            Start::Earliest,
            "new partition of a restored topic"
        );
        assert_eq!(got[&tp("b", 0)], Start::Earliest, "new topic matched later");
    }

    #[test]
    fn an_empty_restored_checkpoint_still_means_earliest_for_everything() {
        let restored = BTreeMap::new();
        let got = start_positions(Some(&restored), &[tp("a", 0)], &Startup::Latest);
        assert_eq!(got[&tp("a", 0)], Start::Earliest);
    }

    #[test]
    fn without_checkpoint_startup_applies_to_all() {
        let d = [tp("a", 0), tp("a", 1)];
        for (s, want) in [
            (Startup::Earliest, Start::Earliest),
            (Startup::Latest, Start::Latest),
            (Startup::GroupOffsets, Start::GroupOffset),
            (Startup::Timestamp(5), Start::Timestamp(5)),
        ] {
            let got = start_positions(None, &d, &s);
            assert!(got.values().all(|v| *v == want), "{s:?}");
        }
        let explicit = Startup::Offsets([(tp("a", 1), 9)].into());
        let got = start_positions(None, &d, &explicit);
        assert_eq!(got[&tp("a", 0)], Start::Earliest);
        assert_eq!(got[&tp("a", 1)], Start::Offset(NextOffset(9)));
    }

    #[test]
    fn timestamp_without_a_later_record_starts_at_the_end() {
        assert_eq!(resolve_timestamp(Some(4), 10), NextOffset(4));
        assert_eq!(resolve_timestamp(Some(-1), 10), NextOffset(10));
        assert_eq!(resolve_timestamp(None, 10), NextOffset(10));
        assert_eq!(
            resolve_timestamp(Some(10), 10),
            NextOffset(10),
            "the mock cluster answers the end"
        );
        assert_eq!(
            resolve_timestamp(Some(0), 10),
            NextOffset(0),
            "offset 0 is a record"
        );
        assert_eq!(
            resolve_timestamp(Some(11), 10),
            NextOffset(10),
            "never beyond the end"
        );
    }

    #[test]
    fn out_of_range_offsets_name_the_partition() {
        assert!(check_in_range(&tp("a", 3), NextOffset(5), 0, 10).is_ok());
        assert!(check_in_range(&tp("a", 3), NextOffset(10), 0, 10).is_ok());
        let e = check_in_range(&tp("a", 3), NextOffset(2), 5, 10).unwrap_err();
        assert!(e.contains("a/3") && e.contains("retention"), "{e}");
        assert!(
            check_in_range(&tp("a", 3), NextOffset(5), 5, 10).is_ok(),
            "low is readable"
        );
        let e = check_in_range(&tp("a", 3), NextOffset(11), 5, 10).unwrap_err();
        assert!(e.contains("a/3: offset 11 is beyond the end"), "{e}");
    }

    proptest! {
        /// For any mix of partitions: every discovered partition gets exactly one start;
        /// with a checkpoint, it is the restored offset iff the checkpoint holds it, else
        /// EARLIEST; without one, startup never yields a restored offset.
        #[test]
        fn decision_table(parts in proptest::collection::btree_set((0u8..3, 0i32..6), 0..15),
                          restored_mask in proptest::collection::vec(any::<bool>(), 15),
                          with_checkpoint in any::<bool>()) {
            let discovered: Vec<Tp> = parts.iter().map(|(t, p)| (format!("t{t}"), *p)).collect();
            let restored: BTreeMap<Tp, NextOffset> = discovered.iter().zip(&restored_mask)
                .filter(|(_, keep)| **keep).map(|(tp, _)| (tp.clone(), NextOffset(42))).collect();
            let got = start_positions(with_checkpoint.then_some(&restored), &discovered, &Startup::Latest);
            prop_assert_eq!(got.len(), discovered.len());
            for tp in &discovered {
                let want = if !with_checkpoint { Start::Latest }
                    else if restored.contains_key(tp) { Start::Offset(NextOffset(42)) }
                    else { Start::Earliest };
                prop_assert_eq!(got[tp], want);
            }
        }
    }
}
