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
    /// `part-<subtask>-<id>` (`seq` 0), `part-<subtask>-<id>-<seq>` (`seq` >= 1): the
    /// `seq`-th file subtask `subtask` wrote for checkpoint `id`.
    Committed {
        subtask: u16,
        id: CheckpointId,
        seq: u32,
    },
    /// `.part-<subtask>-<id>`: staged by a lockgate before partitions and rolls.
    Pending { subtask: u16, id: CheckpointId },
    /// `.inprogress-<subtask>-<...>` (in a directory), `inprogress-<subtask>-<...>`
    /// (under the store's staging folder): written, not yet committed.
    InProgress { subtask: u16 },
}

/// Parses a file name of the sink's directory.
pub fn parse_part_name(name: &str) -> Option<PartName> {
    // The format's extension (none for JSON lines) says nothing about the part.
    let name = name.strip_suffix(PARQUET_EXTENSION).unwrap_or(name);
    let two = |rest: &str| -> Option<(u16, u64)> {
        let (a, b) = rest.split_once('-')?;
        Some((number(a)?, number(b)?))
    };
    if let Some(rest) = name.strip_prefix("part-") {
        let (subtask, id, seq) = match rest.splitn(3, '-').collect::<Vec<_>>()[..] {
            [a, b] => (number(a)?, number(b)?, 0),
            [a, b, n] => (number(a)?, number(b)?, number(n).filter(|n| *n > 0)?),
            _ => return None,
        };
        return Some(PartName::Committed {
            subtask,
            id: CheckpointId(id),
            seq,
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
        return in_progress(rest);
    }
    None
}

/// Parses the name of an object under the store's staging folder: a part staged
/// before partitions and rolls (`part-<subtask>-<id>`, pending) or one in progress.
pub fn parse_staged_name(name: &str) -> Option<PartName> {
    let name = name.strip_suffix(PARQUET_EXTENSION).unwrap_or(name);
    if let Some(rest) = name.strip_prefix("inprogress-") {
        return in_progress(rest);
    }
    match parse_part_name(name)? {
        PartName::Committed {
            subtask,
            id,
            seq: 0,
        } => Some(PartName::Pending { subtask, id }),
        _ => None,
    }
}

fn in_progress(rest: &str) -> Option<PartName> {
    let (subtask, tail) = rest.split_once('-')?;
    (!tail.is_empty()).then_some(())?;
    Some(PartName::InProgress {
        subtask: number(subtask)?,
    })
}

/// A number as the sink writes it: digits only, no sign, no leading zero.
fn number<T: std::str::FromStr>(text: &str) -> Option<T> {
    let plain = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    plain.then(|| text.parse().ok()).flatten()
}

/// The committed name of the `seq`-th file subtask `subtask` wrote for checkpoint
/// `id`: `part-<subtask>-<id>` for the first (as before rolls), then
/// `part-<subtask>-<id>-<seq>`.
pub fn committed_name(subtask: u16, id: CheckpointId, seq: usize, ext: &str) -> String {
    match seq {
        0 => format!("part-{subtask}-{}{ext}", id.0),
        n => format!("part-{subtask}-{}-{n}{ext}", id.0),
    }
}

/// What names one in-progress file: `<subtask>-<writer>-<n>`, the writer's name
/// different at each open, so that a restarted subtask never reuses a name that a
/// checkpoint may still name.
pub fn in_progress_token(subtask: u16, writer: &str, n: u64) -> String {
    format!("{subtask}-{writer}-{n}")
}

/// Whether `token` is one [`in_progress_token`] makes for `subtask` (a checkpoint's
/// token is checked before it names a file).
pub fn valid_token(token: &str, subtask: u16) -> bool {
    let mut it = token.splitn(3, '-');
    let (Some(s), Some(w), Some(n)) = (it.next(), it.next(), it.next()) else {
        return false;
    };
    number::<u16>(s) == Some(subtask)
        && !w.is_empty()
        && w.bytes().all(|b| b.is_ascii_hexdigit())
        && number::<u64>(n).is_some()
}

pub use crate::kits::parts::writer_name;

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

/// Why a job named `job` must not write where the marker holding `marked` is (None: it
/// may): the marker names another job. Two jobs writing one place would make the same
/// part names and overwrite each other's output, and a fresh start of one would move
/// the other's parts aside. A marker of a lockgate before job names is empty: any job
/// may go on with it.
pub fn other_job(marked: &str, job: &str) -> Option<String> {
    let owner = marked.trim();
    (!owner.is_empty() && owner != job).then(|| {
        format!(
            "it holds the output of job `{owner}` (its {MARKER}), and this job is `{job}`: two jobs writing one place would overwrite each other's part files; give each job a dir of its own (or, if this job was renamed, write its new name into {MARKER})"
        )
    })
}

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

/// Decides the fate of one sink file on restore from `restored` (None: fresh start);
/// `named`: the restored checkpoint names the file (a staged or in-progress one).
pub fn restore_action(
    file: PartName,
    restored: Option<CheckpointId>,
    named: bool,
) -> RestoreAction {
    match file {
        PartName::Committed { id, .. } => match restored {
            Some(k) if id <= k => RestoreAction::Keep,
            // Committed output of a checkpoint we are not restoring (or of any
            // checkpoint, on a fresh start) will be written again.
            _ => RestoreAction::RollBack,
        },
        PartName::Pending { .. } | PartName::InProgress { .. } => {
            if named {
                RestoreAction::Commit
            } else {
                RestoreAction::Remove
            }
        }
    }
}

pub(super) fn part_subtask(p: PartName) -> u16 {
    match p {
        PartName::Committed { subtask, .. }
        | PartName::Pending { subtask, .. }
        | PartName::InProgress { subtask } => subtask,
    }
}

/// What one checkpoint of one subtask staged before partitions and rolls: the
/// pending part file `.part-<subtask>-<id>`. Its serde form, `(subtask, id)`, is in
/// every checkpoint of the file sink written before them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    pub subtask: u16,
    pub id: CheckpointId,
}

/// What one checkpoint of one subtask staged: the sink's committable, kept in
/// checkpoints (see [`encode_staged`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Staged {
    /// The one pending part of a checkpoint written before partitions and rolls.
    Part(Part),
    /// The files of a checkpoint, in the order written: the `n`-th is committed as
    /// [`committed_name`]`(subtask, id, n, ext)` in its folder.
    Files {
        subtask: u16,
        id: CheckpointId,
        files: Vec<StagedFile>,
    },
}

/// One file of [`Staged::Files`]: where it is while in progress, and its format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedFile {
    /// The partition's folder, relative to the sink's directory (empty: none).
    pub folder: String,
    /// Its [`in_progress_token`].
    pub token: String,
    /// The extension of its format (`""` for JSON lines, `.parquet`).
    pub ext: String,
}

impl Staged {
    /// The subtask that wrote it.
    pub fn subtask(&self) -> u16 {
        match self {
            Staged::Part(p) => p.subtask,
            Staged::Files { subtask, .. } => *subtask,
        }
    }

    /// Whether every name in it is one the sink makes (a crafted checkpoint cannot
    /// name a file outside the sink's directory).
    fn valid(&self) -> Result<(), String> {
        let Staged::Files { subtask, files, .. } = self else {
            return Ok(());
        };
        for f in files {
            if !super::partition::valid_folder(&f.folder) {
                return Err(format!(
                    "a staged file's folder {:?} is not one the sink makes",
                    f.folder
                ));
            }
            if !valid_token(&f.token, *subtask) {
                return Err(format!(
                    "a staged file's name {:?} is not one subtask {subtask} makes",
                    f.token
                ));
            }
            if !["", PARQUET_EXTENSION].contains(&f.ext.as_str()) {
                return Err(format!(
                    "a staged file's extension {:?} is not a format's",
                    f.ext
                ));
            }
        }
        Ok(())
    }
}

/// What a restored checkpoint names, for a restore's decisions
/// ([`restore_action`]'s `named`).
#[derive(Debug, Default)]
pub struct Named {
    parts: std::collections::HashSet<(u16, CheckpointId)>,
    files: std::collections::HashSet<(String, String)>,
}

impl Named {
    /// Everything `staged` names.
    pub fn of(staged: &[Staged]) -> Named {
        let mut named = Named::default();
        for s in staged {
            match s {
                Staged::Part(p) => {
                    named.parts.insert((p.subtask, p.id));
                }
                Staged::Files { files, .. } => {
                    for f in files {
                        named.files.insert((f.folder.clone(), f.token.clone()));
                    }
                }
            }
        }
        named
    }

    /// Whether the file `part`, in `folder` and named by `token` (in progress), is
    /// named.
    pub fn names(&self, folder: &str, part: PartName, token: Option<&str>) -> bool {
        match part {
            PartName::Pending { subtask, id } => self.parts.contains(&(subtask, id)),
            PartName::InProgress { .. } => {
                token.is_some_and(|t| self.files.contains(&(folder.to_string(), t.to_string())))
            }
            PartName::Committed { .. } => false,
        }
    }
}

/// The version of the file sink's state that [`encode_staged`] writes.
const STATE_VERSION: u8 = 1;

/// The file sink's state in a checkpoint: [`crate::kits::two_phase::VERSIONED`], the
/// version, then the kit's state of [`Staged`] committables.
pub fn encode_staged(pending: Vec<Staged>) -> Result<Vec<u8>, String> {
    crate::kits::two_phase::encode_versioned(STATE_VERSION, pending)
}

/// Reads [`encode_staged`]'s state, or a state written before versions (pending
/// [`Part`]s), checking every name in it.
pub fn decode_staged(bytes: &[u8]) -> Result<Vec<Staged>, String> {
    let staged = match crate::kits::two_phase::versioned(bytes) {
        Some((STATE_VERSION, rest)) => crate::kits::two_phase::decode_state::<Staged>(rest)?,
        Some((v, _)) => {
            return Err(format!(
                "version {v} of the file sink's state is newer than this lockgate reads ({STATE_VERSION})"
            ))
        }
        None => crate::kits::two_phase::decode_state::<Part>(bytes)?
            .into_iter()
            .map(Staged::Part)
            .collect(),
    };
    for s in &staged {
        s.valid()?;
    }
    Ok(staged)
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
                id: CheckpointId(17),
                seq: 0,
            })
        );
        assert_eq!(
            parse_part_name("part-2-17-3.parquet"),
            Some(PartName::Committed {
                subtask: 2,
                id: CheckpointId(17),
                seq: 3,
            })
        );
        for (seq, name) in [(0, "part-2-17"), (1, "part-2-17-1"), (12, "part-2-17-12")] {
            assert_eq!(committed_name(2, CheckpointId(17), seq, ""), name);
        }
        assert_eq!(
            parse_part_name("part-2-17-0"),
            None,
            "the first file has no number"
        );
        assert_eq!(parse_part_name("part-2-17-01"), None);
        assert_eq!(parse_part_name("part-2-17-1-1"), None);
        assert_eq!(
            parse_part_name(".inprogress-1-17c3a9f0-4"),
            Some(PartName::InProgress { subtask: 1 })
        );
        assert_eq!(parse_part_name(".inprogress-1-"), None);
        assert_eq!(
            parse_staged_name("inprogress-3-ab-1.parquet"),
            Some(PartName::InProgress { subtask: 3 })
        );
        assert_eq!(
            parse_staged_name("part-3-7.parquet"),
            Some(PartName::Pending {
                subtask: 3,
                id: CheckpointId(7)
            }),
            "a staged part of a lockgate before rolls is a pending one"
        );
        assert_eq!(parse_staged_name("part-3-7-1"), None);
        assert_eq!(parse_staged_name(".inprogress-3-ab-1"), None);
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
            seq: 0,
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
        let c = |s, id| PartName::Committed {
            subtask: s,
            id: CheckpointId(id),
            seq: 1,
        };
        let p = |s, id| PartName::Pending {
            subtask: s,
            id: CheckpointId(id),
        };
        let i = PartName::InProgress { subtask: 0 };
        assert_eq!(restore_action(c(0, 9), k, false), RestoreAction::Keep);
        assert_eq!(restore_action(c(0, 10), k, false), RestoreAction::Keep);
        assert_eq!(restore_action(c(0, 11), k, false), RestoreAction::RollBack);
        assert_eq!(
            restore_action(c(0, 1), None, false),
            RestoreAction::RollBack
        );
        assert_eq!(restore_action(p(0, 10), k, true), RestoreAction::Commit);
        assert_eq!(restore_action(p(1, 11), k, false), RestoreAction::Remove);
        assert_eq!(restore_action(i, k, true), RestoreAction::Commit);
        assert_eq!(restore_action(i, k, false), RestoreAction::Remove);
        assert_eq!(restore_action(i, None, false), RestoreAction::Remove);
    }

    #[test]
    fn a_marker_of_another_job_is_refused() {
        assert_eq!(other_job("", "orders"), None, "a marker before job names");
        assert_eq!(other_job("orders\n", "orders"), None);
        let why = other_job("billing", "orders").unwrap();
        assert!(
            why.contains("`billing`") && why.contains("`orders`"),
            "{why}"
        );
    }

    #[test]
    fn tokens_are_checked_against_their_subtask() {
        let t = in_progress_token(3, &writer_name(), 7);
        assert!(valid_token(&t, 3), "{t}");
        assert!(!valid_token(&t, 4));
        for bad in [
            "3-ab",
            "3--1",
            "3-xy-1",
            "3-ab-01",
            "3-ab-1/../x",
            "03-ab-1",
        ] {
            assert!(!valid_token(bad, 3), "{bad}");
        }
    }

    #[test]
    fn states_before_versions_read_as_single_parts_and_names_are_checked() {
        let old = crate::kits::two_phase::encode_state(vec![Part {
            subtask: 1,
            id: CheckpointId(4),
        }])
        .unwrap();
        assert_eq!(
            decode_staged(&old).unwrap(),
            vec![Staged::Part(Part {
                subtask: 1,
                id: CheckpointId(4)
            })]
        );
        let files = |folder: &str, token: &str, ext: &str| Staged::Files {
            subtask: 1,
            id: CheckpointId(5),
            files: vec![StagedFile {
                folder: folder.into(),
                token: token.into(),
                ext: ext.into(),
            }],
        };
        let good = files("dt=1", "1-ab-2", ".parquet");
        let bytes = encode_staged(vec![good.clone()]).unwrap();
        assert_eq!(bytes[0], 0xFF);
        assert_eq!(decode_staged(&bytes).unwrap(), vec![good]);
        for bad in [
            files("../x", "1-ab-2", ""),
            files("", "2-ab-2", ""),
            files("", "1-ab-2/../../x", ""),
            files("", "1-ab-2", ".csv"),
        ] {
            let bytes = encode_staged(vec![bad.clone()]).unwrap();
            assert!(decode_staged(&bytes).is_err(), "{bad:?}");
        }
        let mut newer = encode_staged(vec![]).unwrap();
        newer[1] = 9;
        assert!(decode_staged(&newer).unwrap_err().contains("version 9"));
    }
}
