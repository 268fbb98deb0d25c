//! Durable writes, written once and used by everything that persists.
//!
//! The recipe is always: write a temporary file, fsync it, rename it into place, fsync
//! the directory. A reader therefore sees either no file or the whole file, and after
//! [`publish`] returns the file survives a power loss.

use crate::error::{Result, StateError};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::Path;

/// Fsyncs a directory so that renames and creations inside it are durable.
pub fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(StateError::io("fsync directory", dir))
}

/// Fsyncs a file's contents.
pub fn fsync_file(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(StateError::io("fsync", path))
}

/// Writes `bytes` as `dir/name` durably, refusing to overwrite an existing file (as
/// Flink refuses to overwrite `_metadata`): a published file is never replaced.
///
/// Steps: `name.tmp` is written and fsynced, renamed to `name`, and `dir` is fsynced.
pub fn publish(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    publish_with_midpoint(dir, name, bytes, || {})
}

/// [`publish`], calling `midpoint` when half of the temporary file is written (the
/// fault harness aborts there to prove a torn write is never taken for a whole one).
pub fn publish_with_midpoint(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    midpoint: impl FnOnce(),
) -> Result<()> {
    let target = dir.join(name);
    if target.exists() {
        return Err(StateError::AlreadyExists { path: target });
    }
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(StateError::io("create", &tmp))?;
    let half = bytes.len() / 2;
    f.write_all(&bytes[..half])
        .map_err(StateError::io("write", &tmp))?;
    midpoint();
    f.write_all(&bytes[half..])
        .map_err(StateError::io("write", &tmp))?;
    f.sync_all().map_err(StateError::io("fsync", &tmp))?;
    fs::rename(&tmp, &target).map_err(StateError::io("rename", &tmp))?;
    fsync_dir(dir)
}

/// Writes `bytes` to `path` (truncating) and fsyncs the file, not its directory.
pub fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(StateError::io("create", path))?;
    f.write_all(bytes).map_err(StateError::io("write", path))?;
    f.sync_all().map_err(StateError::io("fsync", path))
}

/// Renames `from` to `to` and fsyncs the parent directory of `to`.
pub fn rename_durable(from: &Path, to: &Path) -> Result<()> {
    rename_durable_with(from, to, || {})
}

/// [`rename_durable`], calling `between` after the rename and before the fsync (the
/// fault harness aborts there: the rename is visible, not yet durable).
pub fn rename_durable_with(from: &Path, to: &Path, between: impl FnOnce()) -> Result<()> {
    fs::rename(from, to).map_err(StateError::io("rename", from))?;
    between();
    if let Some(parent) = to.parent() {
        fsync_dir(parent)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_writes_whole_file_and_refuses_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        publish(dir.path(), "_metadata", b"one").unwrap();
        assert_eq!(fs::read(dir.path().join("_metadata")).unwrap(), b"one");
        assert!(!dir.path().join("_metadata.tmp").exists());
        let err = publish(dir.path(), "_metadata", b"two").unwrap_err();
        assert!(matches!(err, StateError::AlreadyExists { .. }));
        assert_eq!(fs::read(dir.path().join("_metadata")).unwrap(), b"one");
    }

    #[test]
    fn the_midpoint_sees_exactly_the_first_half_written() {
        let dir = tempfile::tempdir().unwrap();
        let tmp = dir.path().join("_metadata.tmp");
        let seen = std::cell::Cell::new(None);
        publish_with_midpoint(dir.path(), "_metadata", b"0123456789a", || {
            seen.set(Some(fs::read(&tmp).unwrap()));
        })
        .unwrap();
        assert_eq!(seen.take().unwrap(), b"01234");
        assert_eq!(
            fs::read(dir.path().join("_metadata")).unwrap(),
            b"0123456789a"
        );
    }

    #[test]
    fn write_synced_writes_and_truncates() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        write_synced(&p, b"long contents").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"long contents");
        write_synced(&p, b"short").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"short");
        assert!(write_synced(&dir.path().join("absent/f"), b"x").is_err());
    }

    #[test]
    fn rename_durable_moves_the_entry() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join("chk-1.inprogress");
        let to = dir.path().join("chk-1");
        fs::create_dir(&from).unwrap();
        rename_durable(&from, &to).unwrap();
        assert!(!from.exists());
        assert!(to.is_dir());
        let err = rename_durable(&from, &to).unwrap_err();
        assert!(
            matches!(err, StateError::Io { op: "rename", .. }),
            "{err:?}"
        );
    }

    #[test]
    fn fsync_of_a_missing_path_is_an_error_naming_it() {
        // Whether an fsync happened is visible only after a power loss; that a failed
        // one is reported is visible here.
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join("absent");
        let err = fsync_dir(&absent).unwrap_err();
        assert!(
            matches!(
                err,
                StateError::Io {
                    op: "fsync directory",
                    ..
                }
            ),
            "{err:?}"
        );
        let err = fsync_file(&absent).unwrap_err();
        assert!(matches!(err, StateError::Io { op: "fsync", .. }), "{err:?}");
        fsync_dir(dir.path()).unwrap();
    }
}
