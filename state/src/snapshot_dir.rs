//! The snapshot directory (the on-disk contract):
//!
//! ```text
//! <dir>/chk-0000000042/_metadata          written last; makes the checkpoint complete
//! <dir>/chk-0000000042/<op>-<subtask>/    RocksDB checkpoint of one subtask
//! <dir>/chk-0000000043.inprogress/        never restored from; removed on start
//! <dir>/LOCK                              flock held by the running process
//! ```
//!
//! [`SnapshotDir`] holds the lock for its lifetime; only one process works on a
//! directory at a time.

use crate::durable;
use crate::error::{Result, StateError};
use crate::ids::CheckpointId;
use crate::lock::DirLock;
use crate::metadata::{CheckpointMetadata, METADATA_FILE};
use crate::restore::{self, CheckpointEntry, EntryStatus};
use crate::verify;
use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

const PREFIX: &str = "chk-";
const IN_PROGRESS: &str = ".inprogress";
const ABANDONED: &str = ".abandoned";

/// The directory name of checkpoint `id`.
pub fn chk_name(id: CheckpointId) -> String {
    format!("{PREFIX}{:010}", id.0)
}

/// The directory an unfinished checkpoint `id` of `root` is written into.
pub fn in_progress_path(root: &Path, id: CheckpointId) -> PathBuf {
    root.join(format!("{}{IN_PROGRESS}", chk_name(id)))
}

/// The kind of a checkpoint directory name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameKind {
    /// `chk-N`
    Checkpoint,
    /// `chk-N.inprogress`
    InProgress,
    /// `chk-N.abandoned`
    Abandoned,
}

/// Parses `chk-N`, `chk-N.inprogress` or `chk-N.abandoned`.
pub fn parse_name(name: &str) -> Option<(CheckpointId, NameKind)> {
    let rest = name.strip_prefix(PREFIX)?;
    let (digits, kind) = if let Some(d) = rest.strip_suffix(IN_PROGRESS) {
        (d, NameKind::InProgress)
    } else if let Some(d) = rest.strip_suffix(ABANDONED) {
        (d, NameKind::Abandoned)
    } else {
        (rest, NameKind::Checkpoint)
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((CheckpointId(digits.parse().ok()?), kind))
}

/// Lists the checkpoint entries of `root` (without verifying them).
pub fn list(root: &Path) -> Result<Vec<CheckpointEntry>> {
    let mut out = Vec::new();
    let rd = match fs::read_dir(root) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => {
            return Err(StateError::Io {
                op: "list",
                path: root.into(),
                source: e,
            })
        }
    };
    for item in rd {
        let item = item.map_err(StateError::io("list", root))?;
        let name = item.file_name().to_string_lossy().into_owned();
        let Some((id, kind)) = parse_name(&name) else {
            continue;
        };
        let status = if kind == NameKind::InProgress {
            EntryStatus::InProgress
        } else if kind == NameKind::Abandoned {
            EntryStatus::Abandoned
        } else if item.path().join(METADATA_FILE).exists() {
            EntryStatus::Complete
        } else {
            EntryStatus::MissingMetadata
        };
        out.push(CheckpointEntry { id, name, status });
    }
    out.sort_by_key(|e| (e.id, e.name.clone()));
    Ok(out)
}

/// The result of choosing a checkpoint to restore.
#[derive(Debug, Clone)]
pub struct Restored {
    pub path: PathBuf,
    pub metadata: CheckpointMetadata,
}

/// What [`SnapshotDir::open`] found.
#[derive(Debug)]
pub struct Startup {
    /// The newest checkpoint that verified, if any.
    pub restored: Option<Restored>,
    /// Complete checkpoints that failed verification, with the reason naming the file.
    pub skipped: Vec<(PathBuf, String)>,
    /// The first id this run uses.
    pub next_id: CheckpointId,
}

/// An open, locked checkpoint directory.
#[derive(Debug)]
pub struct SnapshotDir {
    root: PathBuf,
    _lock: DirLock,
    /// Checkpoints known to be corrupt (skipped at restore): retention does not count
    /// them as sound, but keeps them for inspection until they are old enough.
    corrupt: HashSet<CheckpointId>,
}

impl SnapshotDir {
    /// Creates `root` if needed, takes its lock, removes unfinished checkpoints, and
    /// finds the newest checkpoint that verifies.
    pub fn open(root: &Path) -> Result<(SnapshotDir, Startup)> {
        fs::create_dir_all(root).map_err(StateError::io("create", root))?;
        let lock = DirLock::acquire(root)?;
        let listing = list(root)?;
        let plan = restore::restore_plan(&listing);
        for name in &plan.remove {
            let p = root.join(name);
            fs::remove_dir_all(&p).map_err(StateError::io("remove", &p))?;
        }
        let choice = restore::choose(&plan.candidates, |id| {
            verify::verify_checkpoint(&root.join(chk_name(id)))
        });
        let corrupt: HashSet<_> = choice.skipped.iter().map(|(id, _)| *id).collect();
        let startup = Startup {
            restored: choice.chosen.map(|(id, metadata)| Restored {
                path: root.join(chk_name(id)),
                metadata,
            }),
            skipped: choice
                .skipped
                .into_iter()
                .map(|(id, why)| (root.join(chk_name(id)), why))
                .collect(),
            next_id: plan.next_id,
        };
        Ok((
            SnapshotDir {
                root: root.to_path_buf(),
                _lock: lock,
                corrupt,
            },
            startup,
        ))
    }

    /// Opens `root` as the local staging directory of an object store: creates it if
    /// needed, takes its lock and removes unfinished checkpoints, but chooses nothing
    /// (the store decides what is restored). Returns the id after every id present
    /// locally, so that a new checkpoint never reuses a local name either.
    pub fn open_staging(root: &Path) -> Result<(SnapshotDir, CheckpointId)> {
        fs::create_dir_all(root).map_err(StateError::io("create", root))?;
        let lock = DirLock::acquire(root)?;
        let plan = restore::restore_plan(&list(root)?);
        for name in &plan.remove {
            let p = root.join(name);
            fs::remove_dir_all(&p).map_err(StateError::io("remove", &p))?;
        }
        Ok((
            SnapshotDir {
                root: root.to_path_buf(),
                _lock: lock,
                corrupt: HashSet::new(),
            },
            plan.next_id,
        ))
    }

    /// Renames the published checkpoint `id` to `chk-N.abandoned` (its upload to the
    /// object store failed: it must never be restored from the staging directory).
    pub fn abandon(&self, id: CheckpointId) -> Result<()> {
        let from = self.completed_path(id);
        let to = self.root.join(format!("{}{ABANDONED}", chk_name(id)));
        durable::rename_durable(&from, &to)
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory an unfinished checkpoint is written into.
    pub fn in_progress_path(&self, id: CheckpointId) -> PathBuf {
        in_progress_path(&self.root, id)
    }

    /// The directory of a completed checkpoint.
    pub fn completed_path(&self, id: CheckpointId) -> PathBuf {
        self.root.join(chk_name(id))
    }

    /// Creates `chk-N.inprogress/` for subtasks to write into.
    pub fn begin(&self, id: CheckpointId) -> Result<PathBuf> {
        let p = self.in_progress_path(id);
        fs::create_dir(&p).map_err(StateError::io("create", &p))?;
        Ok(p)
    }

    /// Writes `_metadata` (fsynced, never overwriting), fsyncs the pending directory,
    /// then renames it to `chk-N` and fsyncs the root. Each subtask makes its own files
    /// and state directory durable before it acknowledges; the one fsync of the pending
    /// directory, after `_metadata` is in it, makes every entry in it durable before the
    /// rename to `chk-N` refers to them (a `.inprogress` directory is never restored).
    pub fn publish(&self, meta: &CheckpointMetadata) -> Result<PathBuf> {
        self.publish_with(meta, &|_| {})
    }

    /// [`SnapshotDir::publish`] calling `hook` at two named points: `before-metadata`
    /// (subtask directories synced, `_metadata` not yet written) and `mid-metadata`
    /// (half of `_metadata.tmp` written). The fault harness aborts there.
    pub fn publish_with(&self, meta: &CheckpointMetadata, hook: &dyn Fn(&str)) -> Result<PathBuf> {
        let pending = self.in_progress_path(meta.id);
        hook("before-metadata");
        durable::publish_with_midpoint(&pending, METADATA_FILE, &meta.encode()?, || {
            hook("mid-metadata")
        })?;
        let done = self.completed_path(meta.id);
        durable::rename_durable_with(&pending, &done, || hook("publish-before-fsync"))?;
        Ok(done)
    }

    /// Renames every sound complete checkpoint newer than `restored` (all of them when
    /// `restored` is `None`, a restore from another directory) to `chk-N.abandoned`:
    /// the job now continues from the restored checkpoint, and a later restart must
    /// never resume the abandoned line. Checkpoints known to be corrupt keep their
    /// names for inspection (they never verify, so they are never restored).
    pub fn abandon_newer(&self, restored: Option<CheckpointId>) -> Result<Vec<String>> {
        let mut abandoned = Vec::new();
        for e in list(&self.root)? {
            let newer = restored.is_none_or(|k| e.id > k);
            if e.status == EntryStatus::Complete && newer && !self.corrupt.contains(&e.id) {
                let from = self.root.join(&e.name);
                let to = self.root.join(format!("{}{ABANDONED}", e.name));
                fs::rename(&from, &to).map_err(StateError::io("rename", &from))?;
                abandoned.push(e.name);
            }
        }
        if !abandoned.is_empty() {
            durable::fsync_dir(&self.root)?;
        }
        Ok(abandoned)
    }

    /// Removes an aborted checkpoint's unfinished directory.
    pub fn discard(&self, id: CheckpointId) -> Result<()> {
        let p = self.in_progress_path(id);
        match fs::remove_dir_all(&p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StateError::Io {
                op: "remove",
                path: p,
                source: e,
            }),
        }
    }

    /// Deletes checkpoints older than the newest `retain` sound ones. Call only after a
    /// publish: the newest checkpoint is then durable, so deleting older ones is safe.
    pub fn apply_retention(&self, retain: usize) -> Result<Vec<String>> {
        let mut listing = list(&self.root)?;
        for e in &mut listing {
            if self.corrupt.contains(&e.id) {
                e.status = EntryStatus::Corrupt("skipped at restore".into());
            }
        }
        let victims = restore::retention_victims(&listing, retain);
        for name in &victims {
            let p = self.root.join(name);
            let Some((id, _)) = parse_name(name) else {
                continue;
            };
            // Renamed first: a crash halfway through the removal must not leave a
            // `chk-N` with `_metadata` but missing files; an unfinished name is
            // removed on the next start.
            let doomed = self.in_progress_path(id);
            fs::rename(&p, &doomed).map_err(StateError::io("rename", &p))?;
            fs::remove_dir_all(&doomed).map_err(StateError::io("remove", &doomed))?;
        }
        if !victims.is_empty() {
            durable::fsync_dir(&self.root)?;
        }
        Ok(victims)
    }
}

/// Resolves a `--restore PATH`: a `chk-N` directory is verified as is; a checkpoint
/// directory means its newest checkpoint that verifies (skipping corrupt ones).
pub fn resolve_restore_path(
    path: &Path,
) -> std::result::Result<(Restored, Vec<(PathBuf, String)>), String> {
    if path.join(METADATA_FILE).exists() {
        let metadata = verify::verify_checkpoint(path)?;
        return Ok((
            Restored {
                path: path.to_path_buf(),
                metadata,
            },
            Vec::new(),
        ));
    }
    let listing = list(path).map_err(|e| e.to_string())?;
    let plan = restore::restore_plan(&listing);
    if plan.candidates.is_empty() {
        return Err(format!(
            "{} is neither a checkpoint (no {METADATA_FILE}) nor a directory holding complete checkpoints",
            path.display()
        ));
    }
    let choice = restore::choose(&plan.candidates, |id| {
        verify::verify_checkpoint(&path.join(chk_name(id)))
    });
    let skipped: Vec<_> = choice
        .skipped
        .into_iter()
        .map(|(id, why)| (path.join(chk_name(id)), why))
        .collect();
    match choice.chosen {
        Some((id, metadata)) => Ok((
            Restored {
                path: path.join(chk_name(id)),
                metadata,
            },
            skipped,
        )),
        None => Err(format!(
            "no checkpoint in {} verifies: {}",
            path.display(),
            skipped
                .iter()
                .map(|(p, why)| format!("{}: {why}", p.display()))
                .collect::<Vec<_>>()
                .join("; ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::tests::sample;

    #[test]
    fn names_round_trip() {
        assert_eq!(chk_name(CheckpointId(42)), "chk-0000000042");
        assert_eq!(
            parse_name("chk-0000000042"),
            Some((CheckpointId(42), NameKind::Checkpoint))
        );
        assert_eq!(
            parse_name("chk-0000000043.inprogress"),
            Some((CheckpointId(43), NameKind::InProgress))
        );
        assert_eq!(parse_name("chk-"), None);
        assert_eq!(parse_name("LOCK"), None);
    }

    fn publish_empty(dir: &SnapshotDir, id: u64) {
        let mut m = sample(id);
        m.subtasks.clear();
        dir.begin(m.id).unwrap();
        dir.publish(&m).unwrap();
    }

    #[test]
    fn open_skips_corrupt_newest_and_removes_unfinished() {
        let tmp = tempfile::tempdir().unwrap();
        {
            let (dir, startup) = SnapshotDir::open(tmp.path()).unwrap();
            assert!(startup.restored.is_none());
            publish_empty(&dir, 1);
            publish_empty(&dir, 2);
            dir.begin(CheckpointId(3)).unwrap();
        }
        let meta = tmp.path().join("chk-0000000002/_metadata");
        let mut bytes = fs::read(&meta).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        fs::write(&meta, bytes).unwrap();

        let (_dir, startup) = SnapshotDir::open(tmp.path()).unwrap();
        assert_eq!(startup.restored.unwrap().metadata.id, CheckpointId(1));
        assert_eq!(startup.skipped.len(), 1);
        assert!(startup.skipped[0].0.ends_with("chk-0000000002"));
        assert!(
            startup.skipped[0].1.contains("CRC"),
            "{}",
            startup.skipped[0].1
        );
        assert_eq!(startup.next_id, CheckpointId(4));
        assert!(!tmp.path().join("chk-0000000003.inprogress").exists());
    }

    #[test]
    fn retention_keeps_newest_and_corrupt_stays_until_old() {
        let tmp = tempfile::tempdir().unwrap();
        let (dir, _) = SnapshotDir::open(tmp.path()).unwrap();
        for id in 1..=5 {
            publish_empty(&dir, id);
            dir.apply_retention(3).unwrap();
        }
        let names: Vec<_> = list(tmp.path())
            .unwrap()
            .into_iter()
            .map(|e| e.id.0)
            .collect();
        assert_eq!(names, vec![3, 4, 5]);
    }

    #[test]
    fn only_decimal_digits_name_a_checkpoint() {
        // `u64::from_str` would accept a sign; a directory name must not.
        for name in ["chk-+5", "chk-+5.inprogress", "chk-12a", "chk-.abandoned"] {
            assert_eq!(parse_name(name), None, "{name}");
        }
        assert_eq!(
            parse_name("chk-0000000007.abandoned"),
            Some((CheckpointId(7), NameKind::Abandoned))
        );
    }

    #[test]
    fn list_of_a_missing_directory_is_empty_but_other_errors_are_reported() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(list(&tmp.path().join("absent")).unwrap(), vec![]);
        let file = tmp.path().join("a-file");
        fs::write(&file, b"x").unwrap();
        let err = list(&file).unwrap_err();
        assert!(matches!(err, StateError::Io { op: "list", .. }), "{err:?}");
    }

    fn corrupt_metadata(root: &Path, id: u64) {
        let meta = root.join(chk_name(CheckpointId(id))).join(METADATA_FILE);
        let mut bytes = fs::read(&meta).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        fs::write(&meta, bytes).unwrap();
    }

    fn names(root: &Path) -> Vec<String> {
        list(root).unwrap().into_iter().map(|e| e.name).collect()
    }

    #[test]
    fn abandon_newer_renames_exactly_the_sound_complete_checkpoints_after_the_restored_one() {
        let tmp = tempfile::tempdir().unwrap();
        {
            let (dir, _) = SnapshotDir::open(tmp.path()).unwrap();
            for id in 1..=5 {
                publish_empty(&dir, id);
            }
        }
        corrupt_metadata(tmp.path(), 5);
        // Never completed: no `_metadata`.
        fs::create_dir(tmp.path().join(chk_name(CheckpointId(6)))).unwrap();
        let (dir, startup) = SnapshotDir::open(tmp.path()).unwrap();
        // 5 is skipped at restore: known to be corrupt.
        assert_eq!(startup.restored.unwrap().metadata.id, CheckpointId(4));

        let abandoned = dir.abandon_newer(Some(CheckpointId(2))).unwrap();
        assert_eq!(abandoned, vec!["chk-0000000003", "chk-0000000004"]);
        assert_eq!(
            names(tmp.path()),
            vec![
                "chk-0000000001",
                "chk-0000000002",
                "chk-0000000003.abandoned",
                "chk-0000000004.abandoned",
                // Corrupt: kept under its name for inspection.
                "chk-0000000005",
                "chk-0000000006",
            ]
        );
        // Nothing newer is left: a second call renames nothing.
        assert_eq!(
            dir.abandon_newer(Some(CheckpointId(2))).unwrap(),
            Vec::<String>::new()
        );
        // A restore from elsewhere abandons every sound complete checkpoint.
        assert_eq!(
            dir.abandon_newer(None).unwrap(),
            vec!["chk-0000000001", "chk-0000000002"]
        );
        assert!(tmp
            .path()
            .join("chk-0000000001.abandoned")
            .join(METADATA_FILE)
            .exists());
    }

    #[test]
    fn discard_removes_the_unfinished_directory_and_tolerates_its_absence() {
        let tmp = tempfile::tempdir().unwrap();
        let (dir, _) = SnapshotDir::open(tmp.path()).unwrap();
        let p = dir.begin(CheckpointId(7)).unwrap();
        fs::create_dir(p.join("rolling_sum-0")).unwrap();
        fs::write(p.join("rolling_sum-0/000009.sst"), b"x").unwrap();
        dir.discard(CheckpointId(7)).unwrap();
        assert!(!p.exists());
        dir.discard(CheckpointId(7)).unwrap();
        // Any other failure is reported: here the name is taken by a plain file.
        fs::write(dir.in_progress_path(CheckpointId(8)), b"x").unwrap();
        let err = dir.discard(CheckpointId(8)).unwrap_err();
        assert!(
            matches!(err, StateError::Io { op: "remove", .. }),
            "{err:?}"
        );
    }
}
