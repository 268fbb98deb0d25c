//! The names of the sink's files and what a restore does with each: plain functions
//! over names and checkpoint ids, so that the protocol's decisions are tested alone.

use super::section::PARQUET_EXTENSION;
use lockgate_state::CheckpointId;
use serde::{Deserialize, Serialize};

/// The subdirectory that receives part files rolled back by a restore.
pub const ROLLED_BACK: &str = ".rolled-back";

/// A file name the sink owns, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartName {
    /// `part-<subtask>-<id>`
    Committed { subtask: u16, id: CheckpointId },
    /// `.part-<subtask>-<id>`
    Pending { subtask: u16, id: CheckpointId },
    /// `.inprogress-<subtask>-<n>`
    InProgress { subtask: u16 },
}

/// Parses a file name of the sink's directory.
pub fn parse_part_name(name: &str) -> Option<PartName> {
    // The format's extension (none for JSON lines) says nothing about the part.
    let name = name.strip_suffix(PARQUET_EXTENSION).unwrap_or(name);
    // Numbers as the sink writes them: digits only, no sign, no leading zero.
    fn number<T: std::str::FromStr>(text: &str) -> Option<T> {
        let plain = !text.is_empty()
            && text.bytes().all(|b| b.is_ascii_digit())
            && (text == "0" || !text.starts_with('0'));
        plain.then(|| text.parse().ok()).flatten()
    }
    let two = |rest: &str| -> Option<(u16, u64)> {
        let (a, b) = rest.split_once('-')?;
        Some((number(a)?, number(b)?))
    };
    if let Some(rest) = name.strip_prefix("part-") {
        let (subtask, id) = two(rest)?;
        return Some(PartName::Committed {
            subtask,
            id: CheckpointId(id),
        });
    }
    if let Some(rest) = name.strip_prefix(".part-") {
        let (subtask, id) = two(rest)?;
        return Some(PartName::Pending {
            subtask,
            id: CheckpointId(id),
        });
    }
    if let Some(rest) = name.strip_prefix(".inprogress-") {
        let (subtask, _) = two(rest)?;
        return Some(PartName::InProgress { subtask });
    }
    None
}

/// The committed part a `.rolled-back/` entry holds, by its name in the sink's
/// directory: a part moved there keeps its name, or gets `.<n>` appended when that name
/// is taken (see `FileSink::roll_back`). None for anything else.
pub fn rolled_back_part(entry: &str) -> Option<(&str, PartName)> {
    let base = match entry.rsplit_once('.') {
        Some((base, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => base,
        _ => entry,
    };
    match parse_part_name(base)? {
        part @ PartName::Committed { .. } => Some((base, part)),
        _ => None,
    }
}

/// The file in the sink's directory that says the sink has written there: created at
/// the first open, so that a restore into a directory that never held this output (a
/// new machine, when the checkpoints live in an object store) is told apart from one
/// whose part files were all moved away.
pub const MARKER: &str = ".lockgate-file-sink";

/// Whether restoring checkpoint `k` into the sink's directory must be refused: the
/// directory has no [`MARKER`] (`marked`) and no part file (`holds_parts`: a directory
/// of an older lockgate, before markers), so the output committed up to `k` (and the
/// pending part files `k` names, `named`) is not there: the checkpoint was taken on
/// another machine's disk. Starting anyway would end with that output missing.
pub fn foreign_directory(
    k: CheckpointId,
    marked: bool,
    holds_parts: bool,
    named: &[String],
) -> Option<String> {
    if marked || holds_parts {
        return None;
    }
    let pending = match named {
        [] => String::new(),
        files => format!(
            " and the pending part files it names ({})",
            files.join(", ")
        ),
    };
    Some(format!(
        "checkpoint {k} was written with another output directory: this one holds no {MARKER} and no part file, so the part files committed up to checkpoint {k}{pending} are missing (were the checkpoints restored on a new machine? the file sink's output stays on the disk that wrote it: move that directory here, or start the job without its checkpoints)"
    ))
}

/// What a restore does with one file: a plain function of the file, the restored
/// checkpoint and the pending files it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreAction {
    Keep,
    Commit,
    RollBack,
    Remove,
}

/// Decides the fate of one sink file on restore from `restored` (None: fresh start).
pub fn restore_action(
    file: PartName,
    restored: Option<CheckpointId>,
    pending: &[(u16, CheckpointId)],
) -> RestoreAction {
    match file {
        PartName::Committed { id, .. } => match restored {
            Some(k) if id <= k => RestoreAction::Keep,
            // Committed output of a checkpoint we are not restoring (or of any
            // checkpoint, on a fresh start) will be written again.
            _ => RestoreAction::RollBack,
        },
        PartName::Pending { subtask, id } => {
            if pending.contains(&(subtask, id)) {
                RestoreAction::Commit
            } else {
                RestoreAction::Remove
            }
        }
        PartName::InProgress { .. } => RestoreAction::Remove,
    }
}

pub(super) fn part_subtask(p: PartName) -> u16 {
    match p {
        PartName::Committed { subtask, .. }
        | PartName::Pending { subtask, .. }
        | PartName::InProgress { subtask } => subtask,
    }
}

/// What one checkpoint of one subtask staged: the pending part file
/// `.part-<subtask>-<id>`. Its serde form, `(subtask, id)`, is in every checkpoint of
/// the file sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    pub subtask: u16,
    pub id: CheckpointId,
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse() {
        assert_eq!(
            parse_part_name("part-2-17"),
            Some(PartName::Committed {
                subtask: 2,
                id: CheckpointId(17)
            })
        );
        assert_eq!(
            parse_part_name(".part-0-3"),
            Some(PartName::Pending {
                subtask: 0,
                id: CheckpointId(3)
            })
        );
        assert_eq!(
            parse_part_name(".inprogress-1-9"),
            Some(PartName::InProgress { subtask: 1 })
        );
        assert_eq!(
            parse_part_name("part-2-17.parquet"),
            parse_part_name("part-2-17"),
            "a Parquet part is the same part"
        );
        assert_eq!(
            parse_part_name(".part-0-3.parquet"),
            parse_part_name(".part-0-3")
        );
        assert_eq!(parse_part_name("part-2-17.json"), None);
        assert_eq!(parse_part_name("part-x-1"), None);
        assert_eq!(
            parse_part_name("part-00-5"),
            None,
            "not a name the sink writes"
        );
        assert_eq!(parse_part_name("part-+0-+5"), None);
        assert!(parse_part_name("part-0-0").is_some());
        assert_eq!(parse_part_name("notes.txt"), None);
    }

    #[test]
    fn rolled_back_entries_name_the_part_they_hold() {
        let part = |id| PartName::Committed {
            subtask: 1,
            id: CheckpointId(id),
        };
        assert_eq!(rolled_back_part("part-1-7"), Some(("part-1-7", part(7))));
        assert_eq!(rolled_back_part("part-1-7.2"), Some(("part-1-7", part(7))));
        assert_eq!(rolled_back_part("part-1-7.x"), None);
        assert_eq!(rolled_back_part("part-1-7."), None);
        assert_eq!(rolled_back_part(".part-1-7"), None, "never a pending file");
        assert_eq!(rolled_back_part("notes.1"), None);
    }

    #[test]
    fn a_restore_into_a_directory_that_never_held_the_output_is_refused() {
        let k = CheckpointId(7);
        let named = vec!["out/.part-0-7".to_string()];
        // (marked, holds part files, refused)
        for (marked, parts, refused) in [
            (true, true, false),
            (true, false, false), // every part file moved away downstream
            (false, true, false), // a directory of a lockgate before markers
            (false, false, true), // a new machine
        ] {
            assert_eq!(
                foreign_directory(k, marked, parts, &named).is_some(),
                refused,
                "{marked} {parts}"
            );
        }
        let why = foreign_directory(k, false, false, &named).unwrap();
        assert!(
            why.contains("out/.part-0-7") && why.contains("checkpoint 7"),
            "{why}"
        );
        let why = foreign_directory(k, false, false, &[]).unwrap();
        assert!(
            why.contains("committed up to checkpoint 7 are missing"),
            "{why}"
        );
    }

    #[test]
    fn restore_actions_cover_every_case() {
        let k = Some(CheckpointId(10));
        let pending = [(0u16, CheckpointId(10)), (1, CheckpointId(9))];
        let c = |s, id| PartName::Committed {
            subtask: s,
            id: CheckpointId(id),
        };
        let p = |s, id| PartName::Pending {
            subtask: s,
            id: CheckpointId(id),
        };
        assert_eq!(restore_action(c(0, 9), k, &pending), RestoreAction::Keep);
        assert_eq!(restore_action(c(0, 10), k, &pending), RestoreAction::Keep);
        assert_eq!(
            restore_action(c(0, 11), k, &pending),
            RestoreAction::RollBack
        );
        assert_eq!(restore_action(c(0, 1), None, &[]), RestoreAction::RollBack);
        assert_eq!(restore_action(p(0, 10), k, &pending), RestoreAction::Commit);
        assert_eq!(restore_action(p(1, 9), k, &pending), RestoreAction::Commit);
        assert_eq!(restore_action(p(1, 11), k, &pending), RestoreAction::Remove);
        assert_eq!(
            restore_action(PartName::InProgress { subtask: 0 }, k, &pending),
            RestoreAction::Remove
        );
    }
}
