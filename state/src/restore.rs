//! The decisions that lose data when they are wrong, as plain functions over a listing:
//! which checkpoint to restore, which id comes next, and what retention may delete.
//! No function here touches the file system; [`crate::snapshot_dir`] does the I/O.

use crate::ids::CheckpointId;

/// What is known of one entry of a checkpoint directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryStatus {
    /// `chk-N/` with a `_metadata` file, not yet verified.
    Complete,
    /// `chk-N/` that failed verification (the reason names the file).
    Corrupt(String),
    /// `chk-N/` without `_metadata`: never completed, or damaged.
    MissingMetadata,
    /// `chk-N.inprogress/`: an unfinished checkpoint, never restored from.
    InProgress,
    /// `chk-N.abandoned/`: newer than a checkpoint the job was restored from; never
    /// restored from, kept until retention passes it.
    Abandoned,
}

/// One entry of a checkpoint directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointEntry {
    pub id: CheckpointId,
    /// The directory name (`chk-0000000042` or `chk-0000000042.inprogress`).
    pub name: String,
    pub status: EntryStatus,
}

/// What a start does with a checkpoint directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestorePlan {
    /// Complete checkpoints to try, newest first: the first that verifies is restored.
    pub candidates: Vec<CheckpointId>,
    /// Unfinished checkpoints to remove.
    pub remove: Vec<String>,
    /// The first id this run may use: after every id present, corrupt or unfinished
    /// ones included, so that no name is ever reused.
    pub next_id: CheckpointId,
}

/// Plans a start over a directory listing.
pub fn restore_plan(listing: &[CheckpointEntry]) -> RestorePlan {
    let mut candidates: Vec<CheckpointId> = listing
        .iter()
        .filter(|e| e.status == EntryStatus::Complete)
        .map(|e| e.id)
        .collect();
    candidates.sort_unstable_by(|a, b| b.cmp(a));
    candidates.dedup();
    let remove = listing
        .iter()
        .filter(|e| e.status == EntryStatus::InProgress)
        .map(|e| e.name.clone())
        .collect();
    let next_id = listing
        .iter()
        .map(|e| e.id.next())
        .max()
        .unwrap_or(CheckpointId(1));
    RestorePlan {
        candidates,
        remove,
        next_id,
    }
}

/// The outcome of trying the candidates in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice<T> {
    /// The checkpoint restored from and what verification returned, if any verified.
    pub chosen: Option<(CheckpointId, T)>,
    /// Every candidate skipped, with the reason, newest first.
    pub skipped: Vec<(CheckpointId, String)>,
}

/// Tries `candidates` newest first with `verify` and takes the first that verifies.
/// Older candidates are not verified at all: a start costs one verification when the
/// newest checkpoint is sound.
pub fn choose<T>(
    candidates: &[CheckpointId],
    mut verify: impl FnMut(CheckpointId) -> Result<T, String>,
) -> Choice<T> {
    let mut skipped = Vec::new();
    for &id in candidates {
        match verify(id) {
            Ok(v) => {
                return Choice {
                    chosen: Some((id, v)),
                    skipped,
                }
            }
            Err(reason) => skipped.push((id, reason)),
        }
    }
    Choice {
        chosen: None,
        skipped,
    }
}

/// The entries retention deletes after a publish: everything older than the newest
/// `retain` checkpoints that are not known to be corrupt. `retain` is raised to 2, so
/// that the previous checkpoint stays while the newest is the only other one; a listing
/// with fewer sound checkpoints than `retain` loses nothing. Unfinished entries are
/// never chosen here (they belong to a running checkpoint or to start-up cleanup).
pub fn retention_victims(listing: &[CheckpointEntry], retain: usize) -> Vec<String> {
    let retain = retain.max(2);
    let mut sound: Vec<CheckpointId> = listing
        .iter()
        .filter(|e| e.status == EntryStatus::Complete)
        .map(|e| e.id)
        .collect();
    sound.sort_unstable_by(|a, b| b.cmp(a));
    let Some(&oldest_kept) = sound.get(retain - 1) else {
        return Vec::new();
    };
    listing
        .iter()
        .filter(|e| e.status != EntryStatus::InProgress && e.id < oldest_kept)
        .map(|e| e.name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry(id: u64, status: EntryStatus) -> CheckpointEntry {
        let name = match status {
            EntryStatus::InProgress => format!("chk-{id:010}.inprogress"),
            _ => format!("chk-{id:010}"),
        };
        CheckpointEntry {
            id: CheckpointId(id),
            name,
            status,
        }
    }

    #[test]
    fn empty_directory_starts_at_one_with_nothing_to_restore() {
        let plan = restore_plan(&[]);
        assert!(plan.candidates.is_empty());
        assert_eq!(plan.next_id, CheckpointId(1));
    }

    #[test]
    fn newest_first_and_ids_continue_after_corrupt_and_unfinished() {
        let listing = vec![
            entry(3, EntryStatus::Complete),
            entry(5, EntryStatus::Complete),
            entry(6, EntryStatus::MissingMetadata),
            entry(7, EntryStatus::InProgress),
        ];
        let plan = restore_plan(&listing);
        assert_eq!(plan.candidates, vec![CheckpointId(5), CheckpointId(3)]);
        assert_eq!(plan.remove, vec!["chk-0000000007.inprogress".to_string()]);
        assert_eq!(plan.next_id, CheckpointId(8));
    }

    #[test]
    fn corrupt_newest_is_skipped_by_name_for_older_valid() {
        let c = choose(&[CheckpointId(9), CheckpointId(8)], |id| {
            if id.0 == 9 {
                Err("_metadata: CRC mismatch".into())
            } else {
                Ok(())
            }
        });
        assert_eq!(c.chosen, Some((CheckpointId(8), ())));
        assert_eq!(
            c.skipped,
            vec![(CheckpointId(9), "_metadata: CRC mismatch".into())]
        );
    }

    #[test]
    fn no_valid_checkpoint_reports_every_skip() {
        let c: Choice<()> = choose(&[CheckpointId(2), CheckpointId(1)], |_| Err("bad".into()));
        assert!(c.chosen.is_none());
        assert_eq!(c.skipped.len(), 2);
    }

    fn status_strategy() -> impl Strategy<Value = EntryStatus> {
        prop_oneof![
            4 => Just(EntryStatus::Complete),
            1 => Just(EntryStatus::Corrupt("x".into())),
            1 => Just(EntryStatus::MissingMetadata),
            1 => Just(EntryStatus::InProgress),
            1 => Just(EntryStatus::Abandoned),
        ]
    }

    proptest! {
        #[test]
        fn retention_keeps_newest_sound_checkpoints_and_never_reuses_ids(
            statuses in proptest::collection::vec(status_strategy(), 0..20),
            retain in 0usize..6,
        ) {
            let listing: Vec<_> = statuses.into_iter().enumerate()
                .map(|(i, s)| entry(i as u64 + 1, s)).collect();
            let victims = retention_victims(&listing, retain);
            let mut sound: Vec<_> = listing.iter()
                .filter(|e| e.status == EntryStatus::Complete).map(|e| e.id).collect();
            sound.sort();
            let keep = sound.len().min(retain.max(2));
            // The newest `max(retain, 2)` sound checkpoints survive, the newest above all.
            for id in &sound[sound.len() - keep..] {
                let name = format!("chk-{:010}", id.0);
                prop_assert!(!victims.contains(&name), "deleted kept checkpoint {}", name);
            }
            // Nothing unfinished is deleted and nothing newer than a kept one is deleted.
            for e in &listing {
                if victims.contains(&e.name) {
                    prop_assert!(e.status != EntryStatus::InProgress);
                    prop_assert!(sound.len() >= retain.max(2));
                }
            }
            let plan = restore_plan(&listing);
            for e in &listing {
                prop_assert!(plan.next_id > e.id);
            }
        }
    }
}
