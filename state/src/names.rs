//! Names read back from a checkpoint, and files opened inside one.
//!
//! A checkpoint is data from disk, possibly from another machine: its CRC proves it is
//! intact, not that it is benign (the CRC is not a secret). Every name that a restore
//! joins into a path (a subtask's state directory, the files it lists) must therefore
//! be one plain path component, decided by [`check_component`]; and a file inside a
//! checkpoint is opened without following a symbolic link ([`open_no_follow`]), so a
//! restore reads and writes only inside the checkpoint and the job's own directories.
//!
//! This does not make a crafted checkpoint safe to restore: RocksDB is not hardened
//! against crafted SST files. Restore only checkpoints you trust.

use crate::metadata::{CheckpointMetadata, SubtaskSnapshot};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Why a name is not one plain path component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameProblem {
    Empty,
    /// `.` or `..`: names a directory other than a new entry.
    Dot,
    /// Holds `/` (an absolute path starts with one) or `\`.
    Separator,
    /// Holds a NUL byte, which no file name can.
    Nul,
}

impl std::fmt::Display for NameProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NameProblem::Empty => "empty",
            NameProblem::Dot => "`.` or `..`",
            NameProblem::Separator => "holds a path separator or is absolute",
            NameProblem::Nul => "holds a NUL byte",
        })
    }
}

/// Decides whether `name` is one plain path component: not empty, not `.` or `..`, no
/// `/` (so not absolute either), no `\` (a separator elsewhere, never written by
/// lockgate), no NUL. Joining such a name to a directory names an entry of that
/// directory and nothing else.
pub fn check_component(name: &str) -> Result<(), NameProblem> {
    if name.is_empty() {
        Err(NameProblem::Empty)
    } else if name == "." || name == ".." {
        Err(NameProblem::Dot)
    } else if name.contains(['/', '\\']) {
        Err(NameProblem::Separator)
    } else if name.contains('\0') {
        Err(NameProblem::Nul)
    } else {
        Ok(())
    }
}

/// A name of a checkpoint's metadata that is not one plain path component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsafeName {
    /// Which entry: `subtask <operator>-<n> state_dir` or `... file`.
    pub entry: String,
    /// The name as read (debug-quoted when shown).
    pub name: String,
    pub problem: NameProblem,
}

impl std::fmt::Display for UnsafeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {:?} is not one plain path component ({})",
            self.entry, self.name, self.problem
        )
    }
}

/// Checks every name of `meta` that a restore or a verification joins into a path:
/// each subtask's `state_dir` and each of its file names. Returns the first offender.
pub fn check_metadata(meta: &CheckpointMetadata) -> Result<(), UnsafeName> {
    meta.subtasks.iter().try_for_each(check_subtask)
}

/// [`check_metadata`] for one subtask's entry.
pub fn check_subtask(st: &SubtaskSnapshot) -> Result<(), UnsafeName> {
    let subtask = format!("subtask {}-{}", st.operator, st.subtask);
    if let Some(d) = &st.state_dir {
        check_component(d).map_err(|problem| UnsafeName {
            entry: format!("{subtask} state_dir"),
            name: d.clone(),
            problem,
        })?;
    }
    for f in &st.files {
        check_component(&f.name).map_err(|problem| UnsafeName {
            entry: format!("{subtask} file"),
            name: f.name.clone(),
            problem,
        })?;
    }
    Ok(())
}

/// Opens `path` for reading without following a symbolic link in its last component
/// (`O_NOFOLLOW`: a symlink fails with `ELOOP`), and refuses anything but a regular
/// file. The caller guarantees the directories above it are real ones.
pub fn open_no_follow(path: &Path) -> std::io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "is a symbolic link (refused, never followed inside a checkpoint)",
                )
            } else {
                e
            }
        })?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    Ok(f)
}

/// Checks that `dir` is a real directory, not a symbolic link to one.
pub fn check_real_dir(dir: &Path) -> std::io::Result<()> {
    let m = std::fs::symlink_metadata(dir)?;
    if m.file_type().is_symlink() {
        Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "is a symbolic link (refused, never followed inside a checkpoint)",
        ))
    } else if !m.is_dir() {
        Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a directory",
        ))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_components_pass() {
        let table: &[(&str, Result<(), NameProblem>)] = &[
            ("000009.sst", Ok(())),
            ("rolling_sum-0", Ok(())),
            ("MANIFEST-000005", Ok(())),
            (".hidden", Ok(())),
            ("..sst", Ok(())),
            ("a..b", Ok(())),
            ("", Err(NameProblem::Empty)),
            (".", Err(NameProblem::Dot)),
            ("..", Err(NameProblem::Dot)),
            ("../../outside-file", Err(NameProblem::Separator)),
            ("/etc/passwd", Err(NameProblem::Separator)),
            ("/", Err(NameProblem::Separator)),
            ("a/b", Err(NameProblem::Separator)),
            ("dir/", Err(NameProblem::Separator)),
            ("..\\x", Err(NameProblem::Separator)),
            ("C:\\x", Err(NameProblem::Separator)),
            ("a\0b", Err(NameProblem::Nul)),
        ];
        for (name, want) in table {
            assert_eq!(check_component(name), *want, "{name:?}");
        }
    }

    #[test]
    fn metadata_check_names_the_entry() {
        let mut m = crate::metadata::tests::sample(1);
        assert_eq!(check_metadata(&m), Ok(()));
        m.subtasks[0].files[0].name = "../../outside-file".into();
        let e = check_metadata(&m).unwrap_err();
        assert_eq!(e.entry, "subtask rolling_sum-0 file");
        assert!(e.to_string().contains("\"../../outside-file\""), "{e}");
        m.subtasks[0].state_dir = Some("/abs".into());
        assert_eq!(
            check_metadata(&m).unwrap_err().entry,
            "subtask rolling_sum-0 state_dir"
        );
    }

    #[test]
    fn symlinks_are_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        std::fs::write(&target, b"x").unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = open_no_follow(&link).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        open_no_follow(&target).unwrap();
        let dlink = tmp.path().join("dlink");
        std::os::unix::fs::symlink(tmp.path(), &dlink).unwrap();
        assert!(check_real_dir(&dlink).is_err());
        check_real_dir(tmp.path()).unwrap();
        assert!(check_real_dir(&target).is_err());
    }

    #[test]
    fn problems_are_described() {
        assert_eq!(NameProblem::Empty.to_string(), "empty");
        assert_eq!(NameProblem::Dot.to_string(), "`.` or `..`");
        assert_eq!(
            NameProblem::Separator.to_string(),
            "holds a path separator or is absolute"
        );
        assert_eq!(NameProblem::Nul.to_string(), "holds a NUL byte");
    }

    #[test]
    fn a_symlink_refusal_is_explained_and_other_open_errors_pass_through() {
        let tmp = tempfile::tempdir().unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(tmp.path().join("target"), &link).unwrap();
        let e = open_no_follow(&link).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("never followed"), "{e}");
        let e = open_no_follow(&tmp.path().join("absent")).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    }
}
