//! The advisory lock that makes one process the owner of a checkpoint directory.
//!
//! `flock` is released by the kernel when its holder dies, so a SIGKILLed run never
//! blocks its own restart, while a second live process is refused.

use crate::error::{Result, StateError};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Opens (creating it if needed) the `LOCK` file at `path`. O_NOFOLLOW: a `LOCK` that
/// is a symbolic link is refused, so that taking the lock (which truncates the file and
/// writes the pid) never writes elsewhere.
fn open_lock_file(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| {
            let e = if e.raw_os_error() == Some(libc::ELOOP) {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "is a symbolic link; refusing to follow it (remove it: lockgate creates LOCK itself)",
                )
            } else {
                e
            };
            StateError::Io {
                op: "open",
                path: path.to_path_buf(),
                source: e,
            }
        })
}

/// Takes `mode` (`LOCK_EX` or `LOCK_SH`) on the open `LOCK` file of `dir` without
/// waiting. Held by another live process: [`StateError::Locked`], naming `dir` and the
/// pid the holder wrote into the file.
fn try_flock(file: &File, dir: &Path, path: &Path, mode: libc::c_int) -> Result<()> {
    // SAFETY: flock on a descriptor we own; no memory is shared with the call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), mode | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        let (mut holder, mut reader) = (String::new(), file);
        let _ = reader.read_to_string(&mut holder);
        return Err(StateError::Locked {
            path: dir.to_path_buf(),
            holder: holder.trim().to_string(),
        });
    }
    Err(StateError::Io {
        op: "flock",
        path: path.to_path_buf(),
        source: err,
    })
}

/// A held lock on `<dir>/LOCK`; released on drop (or by the kernel on death).
#[derive(Debug)]
pub struct DirLock {
    _file: File,
    path: PathBuf,
}

impl DirLock {
    /// Takes the lock without waiting. A lock held by another live process is
    /// [`StateError::Locked`], naming the directory and the holder's pid.
    pub fn acquire(dir: &Path) -> Result<DirLock> {
        let path = dir.join("LOCK");
        let mut file = open_lock_file(&path)?;
        try_flock(&file, dir, &path, libc::LOCK_EX)?;
        // The pid is informational only: the lock itself is the flock.
        file.set_len(0).map_err(StateError::io("truncate", &path))?;
        file.seek(SeekFrom::Start(0))
            .and_then(|_| writeln!(file, "{}", std::process::id()))
            .map_err(StateError::io("write", &path))?;
        Ok(DirLock { _file: file, path })
    }

    /// The path of the lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A shared hold on `<dir>/LOCK` for a process that only reads the directory (a
/// member reading an old member's line for a rescale): any number of readers at once,
/// but never while a process runs on the directory, and no process can start on it
/// while it is held. Released on drop.
#[derive(Debug)]
pub struct ReadLock {
    _file: File,
}

impl ReadLock {
    /// Takes the shared hold without waiting. A directory a live process holds is
    /// [`StateError::Locked`], naming it and the holder's pid. A directory without a
    /// `LOCK` file never had a process, and is held by creating one.
    pub fn acquire(dir: &Path) -> Result<ReadLock> {
        let path = dir.join("LOCK");
        let file = open_lock_file(&path)?;
        try_flock(&file, dir, &path, libc::LOCK_SH)?;
        Ok(ReadLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_is_refused_until_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path()).unwrap();
        let err = DirLock::acquire(dir.path()).unwrap_err();
        assert!(matches!(err, StateError::Locked { .. }), "{err}");
        assert!(err.to_string().contains(&std::process::id().to_string()));
        drop(first);
        DirLock::acquire(dir.path()).unwrap();
    }

    #[test]
    fn readers_share_a_directory_that_no_process_runs_on() {
        let dir = tempfile::tempdir().unwrap();
        let a = ReadLock::acquire(dir.path()).unwrap();
        let b = ReadLock::acquire(dir.path()).unwrap();
        // No process starts on a directory being read.
        let err = DirLock::acquire(dir.path()).unwrap_err();
        assert!(matches!(err, StateError::Locked { .. }), "{err}");
        drop((a, b));
        let running = DirLock::acquire(dir.path()).unwrap();
        // Nor is a directory read while a process runs on it.
        let err = ReadLock::acquire(dir.path()).unwrap_err();
        assert!(
            err.to_string().contains(&std::process::id().to_string()),
            "{err}"
        );
        drop(running);
        ReadLock::acquire(dir.path()).unwrap();
    }

    #[test]
    fn a_lock_file_that_is_a_symlink_is_refused_and_its_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("precious");
        std::fs::write(&target, "keep me").unwrap();
        let locked = dir.path().join("job");
        std::fs::create_dir(&locked).unwrap();
        std::os::unix::fs::symlink(&target, locked.join("LOCK")).unwrap();
        let err = DirLock::acquire(&locked).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
    }

    #[test]
    fn the_symlink_refusal_is_explained_and_other_open_errors_pass_through() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), dir.path().join("LOCK")).unwrap();
        let err = DirLock::acquire(dir.path()).unwrap_err();
        assert!(err.to_string().contains("refusing to follow it"), "{err}");
        let StateError::Io { source, .. } =
            DirLock::acquire(&dir.path().join("absent")).unwrap_err()
        else {
            panic!("not an I/O error");
        };
        assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
    }
}
