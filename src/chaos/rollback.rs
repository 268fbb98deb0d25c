//! The exactly-once file sink's roll-back, as the harness checks it on every restart.
//!
//! A part file is committed (`part-<subtask>-<id>`) only after checkpoint `id`, or a
//! later one, completed. A restore from checkpoint `K` keeps the committed parts of
//! checkpoints up to `K`, and moves every committed part of a checkpoint after `K` into
//! `.rolled-back/` (every committed part on a start without a checkpoint), because their
//! records are about to be written again; pending and in-progress files are never output
//! and are removed, not moved. Committed parts after `K` exist only when the killed
//! attempt committed them for a checkpoint that the next run does not restore (a
//! corrupted newest checkpoint, and aborted checkpoints before it whose parts its
//! completion committed): those, and only those, must move.
//!
//! The harness lists the sink's directory before and after each run; the check is a
//! plain function of the two listings and the run's restore decision. New parts never
//! take an old name (new checkpoint ids continue after every id present in the checkpoint
//! directory), so names identify parts across the two listings.

use super::outcome::Restored;
use crate::connectors::file_sink::{parse_part_name, rolled_back_part, PartName, ROLLED_BACK};
use crate::state::snapshot_dir::{parse_name, NameKind};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The file sink's directory at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SinkListing {
    /// Committed parts by name, with their checkpoint ids.
    pub committed: BTreeMap<String, u64>,
    /// The entries of `.rolled-back/`.
    pub rolled_back: BTreeSet<String>,
}

/// Lists the sink's directory `dir` (empty if it does not exist yet).
pub fn list(dir: &Path) -> std::io::Result<SinkListing> {
    let mut out = SinkListing::default();
    let names = |d: &Path| -> std::io::Result<Vec<String>> {
        match std::fs::read_dir(d) {
            Ok(rd) => rd
                .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    };
    for name in names(dir)? {
        if let Some(PartName::Committed { id, .. }) = parse_part_name(&name) {
            out.committed.insert(name, id.0);
        }
    }
    out.rolled_back = names(&dir.join(ROLLED_BACK))?.into_iter().collect();
    Ok(out)
}

/// The committed parts of checkpoints after `restored` (every one for `None`): what a
/// restore from `restored` moves into `.rolled-back/`.
pub fn parts_after(committed: &BTreeMap<String, u64>, restored: Option<u64>) -> Vec<String> {
    committed
        .iter()
        .filter(|(_, &id)| restored.is_none_or(|k| id > k))
        .map(|(name, _)| name.clone())
        .collect()
}

/// What one run's restore did to the committed parts it found, against what it had to
/// do. Lists are sorted part names.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RollBackCheck {
    /// The id of the checkpoint the run restored (None: it started without one, or
    /// ended before it decided).
    pub restored: Option<u64>,
    /// The committed parts, found before the run started, of checkpoints after the one
    /// it restored: what its restore had to move into `.rolled-back/`.
    pub expected: Vec<String>,
    /// The parts the run moved into `.rolled-back/`.
    pub moved: Vec<String>,
    /// Moved but not expected: one part too many (the restored checkpoint covers it, or
    /// it was not a committed part before the run).
    pub unexpected: Vec<String>,
    /// Expected and still in place after the run.
    pub left: Vec<String>,
    /// Expected, but neither moved nor in place: deleted.
    pub lost: Vec<String>,
    /// Whether the run got through its restore (completed a checkpoint, which every
    /// sink subtask acknowledged after opening, or finished). A run killed before that
    /// may leave expected parts in place; its successor restores the same checkpoint and
    /// must move them.
    pub restore_done: bool,
    /// Nothing unexpected moved, nothing lost, and after a restore that was done,
    /// nothing expected left: the run moved exactly the parts it had to.
    pub exact: bool,
}

/// Checks one run: `before` and `after` are the sink's directory when it started and
/// when it ended, `restored` its restore decision.
pub fn check(
    before: &SinkListing,
    after: &SinkListing,
    restored: &Restored,
    restore_done: bool,
) -> RollBackCheck {
    let (restored_id, expected) = match restored {
        Restored::Checkpoint(name) => match parse_name(name) {
            Some((id, NameKind::Checkpoint)) => {
                (Some(id.0), parts_after(&before.committed, Some(id.0)))
            }
            // Not a checkpoint name: nothing can be said to be due.
            _ => (None, Vec::new()),
        },
        Restored::Empty => (None, parts_after(&before.committed, None)),
        // The decision is logged before any task opens: no sink opened, nothing moves.
        Restored::Unknown => (None, Vec::new()),
    };
    let moved: BTreeSet<String> = after
        .rolled_back
        .difference(&before.rolled_back)
        .map(|entry| {
            rolled_back_part(entry).map_or_else(|| entry.clone(), |(name, _)| name.to_string())
        })
        .collect();
    let expected_set: BTreeSet<&String> = expected.iter().collect();
    let unexpected: Vec<String> = moved
        .iter()
        .filter(|m| !expected_set.contains(m))
        .cloned()
        .collect();
    let left: Vec<String> = expected
        .iter()
        .filter(|e| after.committed.contains_key(*e))
        .cloned()
        .collect();
    let lost: Vec<String> = expected
        .iter()
        .filter(|e| !moved.contains(*e) && !after.committed.contains_key(*e))
        .cloned()
        .collect();
    let exact = unexpected.is_empty() && lost.is_empty() && (left.is_empty() || !restore_done);
    RollBackCheck {
        restored: restored_id,
        expected,
        moved: moved.into_iter().collect(),
        unexpected,
        left,
        lost,
        restore_done,
        exact,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(committed: &[&str], rolled_back: &[&str]) -> SinkListing {
        SinkListing {
            committed: committed
                .iter()
                .map(|n| {
                    let Some(PartName::Committed { id, .. }) = parse_part_name(n) else {
                        panic!("{n} is not a committed part name")
                    };
                    (n.to_string(), id.0)
                })
                .collect(),
            rolled_back: rolled_back.iter().map(|n| n.to_string()).collect(),
        }
    }

    fn chk(id: u64) -> Restored {
        Restored::Checkpoint(crate::state::snapshot_dir::chk_name(
            crate::state::CheckpointId(id),
        ))
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|n| n.to_string()).collect()
    }

    /// Parts of checkpoints 3 and 4 were committed; 4 was corrupted and 3 restored.
    fn before() -> SinkListing {
        listing(
            &["part-0-3", "part-1-3", "part-0-4", "part-1-4"],
            &["part-0-2"],
        )
    }

    #[test]
    fn a_restore_moves_exactly_the_parts_after_its_checkpoint() {
        let after = listing(
            &["part-0-3", "part-1-3", "part-0-5"],
            &["part-0-2", "part-0-4", "part-1-4"],
        );
        let c = check(&before(), &after, &chk(3), true);
        assert_eq!(c.restored, Some(3));
        assert_eq!(c.expected, names(&["part-0-4", "part-1-4"]));
        assert_eq!(c.moved, c.expected);
        assert!(c.exact, "{c:?}");
        assert!(c.unexpected.is_empty() && c.left.is_empty() && c.lost.is_empty());
    }

    #[test]
    fn one_part_too_many_is_unexpected() {
        // part-1-3 belongs to the restored checkpoint: moving it loses its records.
        let after = listing(
            &["part-0-3"],
            &["part-0-2", "part-0-4", "part-1-4", "part-1-3"],
        );
        let c = check(&before(), &after, &chk(3), true);
        assert_eq!(c.unexpected, names(&["part-1-3"]));
        assert!(!c.exact);
        // Before the restore was done, too: a move is never allowed to overshoot.
        assert!(!check(&before(), &after, &chk(3), false).exact);
    }

    #[test]
    fn one_part_too_few_is_left_once_the_restore_is_done() {
        let after = listing(
            &["part-0-3", "part-1-3", "part-1-4"],
            &["part-0-2", "part-0-4"],
        );
        let c = check(&before(), &after, &chk(3), true);
        assert_eq!(c.left, names(&["part-1-4"]));
        assert!(!c.exact);
        // Killed before its restore was done: its successor must move part-1-4.
        let c = check(&before(), &after, &chk(3), false);
        assert!(c.exact, "{c:?}");
        assert_eq!(c.left, names(&["part-1-4"]));
    }

    #[test]
    fn a_part_deleted_instead_of_moved_is_lost() {
        let after = listing(&["part-0-3", "part-1-3"], &["part-0-2", "part-0-4"]);
        let c = check(&before(), &after, &chk(3), false);
        assert_eq!(c.lost, names(&["part-1-4"]));
        assert!(!c.exact);
    }

    #[test]
    fn a_taken_name_gets_a_suffix_and_still_counts_as_the_part() {
        let before = listing(&["part-0-2"], &["part-0-2"]);
        let after = listing(&[], &["part-0-2", "part-0-2.1"]);
        let c = check(&before, &after, &chk(1), true);
        assert_eq!(c.moved, names(&["part-0-2"]));
        assert!(c.exact, "{c:?}");
    }

    #[test]
    fn without_a_checkpoint_every_committed_part_moves_and_an_undecided_run_moves_none() {
        let after = listing(
            &[],
            &["part-0-2", "part-0-3", "part-1-3", "part-0-4", "part-1-4"],
        );
        let c = check(&before(), &after, &Restored::Empty, true);
        assert_eq!(c.restored, None);
        assert_eq!(c.expected.len(), 4);
        assert!(c.exact, "{c:?}");
        let c = check(&before(), &after, &Restored::Unknown, false);
        assert!(c.expected.is_empty());
        assert_eq!(c.unexpected.len(), 4);
        assert!(!c.exact);
        let unchanged = check(&before(), &before(), &Restored::Unknown, false);
        assert!(unchanged.exact && unchanged.moved.is_empty());
    }

    #[test]
    fn a_restore_of_the_newest_checkpoint_moves_nothing() {
        let after = listing(
            &["part-0-3", "part-1-3", "part-0-4", "part-1-4", "part-0-5"],
            &["part-0-2"],
        );
        let c = check(&before(), &after, &chk(4), true);
        assert!(
            c.expected.is_empty() && c.moved.is_empty() && c.exact,
            "{c:?}"
        );
    }

    #[test]
    fn the_listing_reads_committed_parts_and_the_roll_back_directory() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(
            list(&tmp.path().join("absent")).unwrap(),
            SinkListing::default()
        );
        for name in ["part-0-3", ".part-0-4", ".inprogress-0-1", "notes.txt"] {
            std::fs::write(tmp.path().join(name), name).unwrap();
        }
        std::fs::create_dir(tmp.path().join(ROLLED_BACK)).unwrap();
        std::fs::write(tmp.path().join(ROLLED_BACK).join("part-1-5"), "x").unwrap();
        assert_eq!(
            list(tmp.path()).unwrap(),
            listing(&["part-0-3"], &["part-1-5"])
        );
        assert_eq!(
            parts_after(&listing(&["part-0-3", "part-0-4"], &[]).committed, Some(3)),
            names(&["part-0-4"])
        );
    }
}
