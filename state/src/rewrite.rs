//! Writing a modified copy of a complete checkpoint (`lockgate checkpoints alter`): new
//! metadata over the same state files, published into another directory by the same
//! recipe as a checkpoint the job takes itself.
//!
//! The original is only read. Its files are verified first; the copy's state files are
//! hard links to them (copies, fsynced, where a link cannot be made, as across file
//! systems), which is safe because a checkpoint's files are never modified, only
//! unlinked. The copy is complete once its `_metadata` is renamed in, and is verified
//! again before it is reported written.

use crate::durable;
use crate::error::{Result, StateError};
use crate::lock::DirLock;
use crate::metadata::{CheckpointMetadata, METADATA_FILE};
use crate::names::check_metadata;
use crate::snapshot_dir::{chk_name, in_progress_path};
use crate::verify::{verify_checkpoint, verify_files};
use std::fs;
use std::path::{Path, PathBuf};

/// Writes `meta` (a changed copy of `source`'s metadata, with the same subtasks and
/// files) as checkpoint `meta.id` of the checkpoint directory `out_root`, holding
/// `out_root`'s lock while it writes. Refuses when `source` does not verify, when
/// `out_root` already holds that checkpoint, or when the files `meta` lists are not
/// `source`'s. Returns the new `chk-N` directory.
pub fn write_copy(source: &Path, meta: &CheckpointMetadata, out_root: &Path) -> Result<PathBuf> {
    let original = CheckpointMetadata::read(source)?;
    let problems = verify_files(source, &original);
    if let Some(p) = problems.first() {
        return Err(StateError::Corrupt {
            path: source.to_path_buf(),
            reason: p.to_string(),
        });
    }
    if original.subtasks != meta.subtasks {
        return Err(StateError::Refused(
            "a rewritten checkpoint keeps the original's subtasks and files".into(),
        ));
    }
    check_metadata(meta).map_err(|detail| StateError::UnsafeName {
        checkpoint: source.to_path_buf(),
        detail,
    })?;
    // Decided before anything is created: nothing may appear inside the original.
    if resolved(out_root)?.starts_with(resolved(source)?) {
        return Err(StateError::Refused(format!(
            "{} is inside the checkpoint {} it would copy, which is never modified",
            out_root.display(),
            source.display()
        )));
    }
    fs::create_dir_all(out_root).map_err(StateError::io("create", out_root))?;
    let parent = match out_root.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    durable::fsync_dir(parent)?;
    let _lock = DirLock::acquire(out_root)?;
    let done = out_root.join(chk_name(meta.id));
    if done.exists() {
        return Err(StateError::AlreadyExists { path: done });
    }
    let pending = in_progress_path(out_root, meta.id);
    if pending.exists() {
        fs::remove_dir_all(&pending).map_err(StateError::io("remove", &pending))?;
    }
    fs::create_dir(&pending).map_err(StateError::io("create", &pending))?;
    for s in &meta.subtasks {
        let Some(dir) = &s.state_dir else { continue };
        let (from, to) = (source.join(dir), pending.join(dir));
        fs::create_dir(&to).map_err(StateError::io("create", &to))?;
        for f in &s.files {
            link_or_copy(&from.join(&f.name), &to.join(&f.name))?;
        }
        durable::fsync_dir(&to)?;
    }
    durable::publish(&pending, METADATA_FILE, &meta.encode()?)?;
    durable::rename_durable(&pending, &done)?;
    verify_checkpoint(&done).map_err(|reason| StateError::Corrupt {
        path: done.clone(),
        reason,
    })?;
    Ok(done)
}

/// `path` made absolute with its symbolic links resolved, as far as it exists (the rest
/// appended as written).
fn resolved(path: &Path) -> Result<PathBuf> {
    let abs = std::path::absolute(path).map_err(StateError::io("resolve", path))?;
    let mut existing = abs.as_path();
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.parent(), existing.file_name()) {
            (Some(p), Some(name)) => {
                rest.push(name.to_os_string());
                existing = p;
            }
            _ => break,
        }
    }
    let mut out = existing
        .canonicalize()
        .map_err(StateError::io("resolve", existing))?;
    out.extend(rest.iter().rev());
    Ok(out)
}

/// A hard link to `from` at `to`, or a copy of it where no link can be made; either
/// way fsynced, since the original may itself never have been (a checkpoint copied
/// from a store with plain tools).
fn link_or_copy(from: &Path, to: &Path) -> Result<()> {
    if fs::hard_link(from, to).is_err() {
        fs::copy(from, to).map_err(StateError::io("copy", from))?;
    }
    durable::fsync_file(to)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::NextOffset;
    use crate::metadata::FileEntry;
    use std::os::unix::fs::MetadataExt;

    /// A published `chk-0000000007` under `root` with one state file.
    fn original(root: &Path) -> PathBuf {
        let chk = root.join(chk_name(crate::ids::CheckpointId(7)));
        fs::create_dir_all(chk.join("rolling_sum-0")).unwrap();
        let sst = chk.join("rolling_sum-0/000009.sst");
        fs::write(&sst, b"123456789").unwrap();
        let mut meta = crate::metadata::tests::sample(7);
        meta.subtasks[0].files = vec![FileEntry {
            name: "000009.sst".into(),
            size: 9,
            crc32: 0xcbf4_3926,
        }];
        durable::publish(&chk, METADATA_FILE, &meta.encode().unwrap()).unwrap();
        chk
    }

    #[test]
    fn a_copy_has_the_new_positions_links_the_files_and_leaves_the_original() {
        let tmp = tempfile::tempdir().unwrap();
        let chk = original(&tmp.path().join("job"));
        let before = fs::read(chk.join(METADATA_FILE)).unwrap();
        let mut meta = CheckpointMetadata::read(&chk).unwrap();
        meta.positions[0].next = NextOffset(18);
        let out = tmp.path().join("altered");
        let done = write_copy(&chk, &meta, &out).unwrap();
        assert_eq!(done, out.join("chk-0000000007"));
        assert_eq!(
            CheckpointMetadata::read(&done).unwrap().positions[0].next,
            NextOffset(18)
        );
        assert_eq!(
            fs::read(chk.join(METADATA_FILE)).unwrap(),
            before,
            "original untouched"
        );
        let ino = |p: &Path| {
            fs::metadata(p.join("rolling_sum-0/000009.sst"))
                .unwrap()
                .ino()
        };
        assert_eq!(ino(&chk), ino(&done), "a hard link, not a copy");
        assert!(!in_progress_path(&out, meta.id).exists());
        // Never over an existing checkpoint.
        let again = write_copy(&chk, &meta, &out).unwrap_err();
        assert!(matches!(again, StateError::AlreadyExists { .. }), "{again}");
        let inside = write_copy(&chk, &meta, &chk.join("copy/deeper")).unwrap_err();
        assert!(inside.to_string().contains("never modified"), "{inside}");
        assert!(
            !chk.join("copy").exists(),
            "nothing created inside the original"
        );
    }

    #[test]
    fn a_corrupt_original_or_other_files_are_refused_and_nothing_is_written() {
        let tmp = tempfile::tempdir().unwrap();
        let chk = original(&tmp.path().join("job"));
        let meta = CheckpointMetadata::read(&chk).unwrap();
        let mut other = meta.clone();
        other.subtasks[0].files[0].name = "000010.sst".into();
        let out = tmp.path().join("altered");
        let e = write_copy(&chk, &other, &out).unwrap_err();
        assert!(
            e.to_string().contains("keeps the original's subtasks"),
            "{e}"
        );
        fs::write(chk.join("rolling_sum-0/000009.sst"), b"123456780").unwrap();
        let e = write_copy(&chk, &meta, &out).unwrap_err();
        assert!(e.to_string().contains("000009.sst: CRC"), "{e}");
        assert!(!out.join("chk-0000000007").exists());
    }
}
