//! Verification of a checkpoint directory against its `_metadata`.

use crate::error::Result;
use crate::metadata::CheckpointMetadata;
use crate::names::{check_component, check_real_dir, open_no_follow};
use std::io::Read;
use std::path::Path;

/// Computes the CRC32 of a regular file, streaming it. A symbolic link is an error,
/// never followed ([`crate::names::open_no_follow`]).
pub fn file_crc32(path: &Path) -> std::io::Result<(u64, u32)> {
    let mut f = open_no_follow(path)?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        size += n as u64;
        hasher.update(&buf[..n]);
    }
    Ok((size, hasher.finalize()))
}

/// A problem found by [`verify_files`], naming the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProblem {
    /// Path relative to the checkpoint directory.
    pub file: String,
    pub problem: String,
}

impl std::fmt::Display for FileProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.file, self.problem)
    }
}

/// Checks every state file listed in `meta` for presence, size and CRC32. Returns all
/// problems found (empty means the checkpoint verifies).
///
/// Nothing outside `chk_dir` is read: a name that is not one plain path component is a
/// problem (metadata from [`CheckpointMetadata::read`] never has one), a state
/// directory must be a real directory and a file a regular file, never a symbolic link.
pub fn verify_files(chk_dir: &Path, meta: &CheckpointMetadata) -> Vec<FileProblem> {
    let mut problems = Vec::new();
    for st in &meta.subtasks {
        let Some(dir) = &st.state_dir else { continue };
        if let Err(e) = check_component(dir) {
            problems.push(FileProblem {
                file: dir.clone(),
                problem: format!("state directory name {e}"),
            });
            continue;
        }
        if let Err(e) = check_real_dir(&chk_dir.join(dir)) {
            problems.push(FileProblem {
                file: dir.clone(),
                problem: format!("state directory {e}"),
            });
            continue;
        }
        for f in &st.files {
            let rel = format!("{dir}/{}", f.name);
            if let Err(e) = check_component(&f.name) {
                problems.push(FileProblem {
                    file: rel,
                    problem: format!("file name {e}"),
                });
                continue;
            }
            match file_crc32(&chk_dir.join(dir).join(&f.name)) {
                Err(e) => problems.push(FileProblem {
                    file: rel,
                    problem: format!("unreadable: {e}"),
                }),
                Ok((size, _)) if size != f.size => problems.push(FileProblem {
                    file: rel,
                    problem: format!("size {size}, expected {}", f.size),
                }),
                Ok((_, crc)) if crc != f.crc32 => problems.push(FileProblem {
                    file: rel,
                    problem: format!("CRC {crc:08x}, expected {:08x}", f.crc32),
                }),
                Ok(_) => {}
            }
        }
    }
    problems
}

/// Reads `_metadata` and verifies every file it lists. The error string names the
/// broken file, for logs and for `checkpoints inspect`.
pub fn verify_checkpoint(chk_dir: &Path) -> Result<CheckpointMetadata, String> {
    let meta = CheckpointMetadata::read(chk_dir).map_err(|e| e.to_string())?;
    let problems = verify_files(chk_dir, &meta);
    if let Some(first) = problems.first() {
        return Err(format!(
            "{}/{first}{}",
            chk_dir.display(),
            if problems.len() > 1 {
                format!(" (and {} more)", problems.len() - 1)
            } else {
                String::new()
            }
        ));
    }
    Ok(meta)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::FileEntry;
    use std::fs;

    /// A checkpoint directory holding `rolling_sum-0/000009.sst` with `content`, and
    /// metadata listing that file with `size` and `crc32`.
    fn checkpoint_with(
        content: &[u8],
        size: u64,
        crc32: u32,
    ) -> (tempfile::TempDir, CheckpointMetadata) {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir(tmp.path().join("rolling_sum-0")).unwrap();
        fs::write(tmp.path().join("rolling_sum-0/000009.sst"), content).unwrap();
        let mut meta = crate::metadata::tests::sample(1);
        meta.subtasks[0].files = vec![FileEntry {
            name: "000009.sst".into(),
            size,
            crc32,
        }];
        (tmp, meta)
    }

    #[test]
    fn file_crc32_reports_size_and_standard_crc() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("f");
        // The CRC-32 (IEEE) check value of "123456789" is cbf43926.
        fs::write(&p, b"123456789").unwrap();
        assert_eq!(file_crc32(&p).unwrap(), (9, 0xcbf4_3926));
        // Larger than one read buffer: sizes of all reads add up.
        let big: Vec<u8> = (0..600_000u32).map(|i| (i % 251) as u8).collect();
        fs::write(&p, &big).unwrap();
        assert_eq!(file_crc32(&p).unwrap(), (600_000, crc32fast::hash(&big)));
    }

    #[test]
    fn a_sound_file_verifies() {
        let (tmp, meta) = checkpoint_with(b"123456789", 9, 0xcbf4_3926);
        assert_eq!(verify_files(tmp.path(), &meta), vec![]);
    }

    #[test]
    fn a_wrong_size_is_reported_naming_the_file() {
        let (tmp, meta) = checkpoint_with(b"12345678", 9, 0xcbf4_3926);
        let problems = verify_files(tmp.path(), &meta);
        assert_eq!(
            problems,
            vec![FileProblem {
                file: "rolling_sum-0/000009.sst".into(),
                problem: "size 8, expected 9".into(),
            }]
        );
        assert_eq!(
            problems[0].to_string(),
            "rolling_sum-0/000009.sst: size 8, expected 9"
        );
    }

    #[test]
    fn a_wrong_crc_is_reported_naming_the_file() {
        // Same size, one byte flipped.
        let (tmp, meta) = checkpoint_with(b"123456780", 9, 0xcbf4_3926);
        let problems = verify_files(tmp.path(), &meta);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].file, "rolling_sum-0/000009.sst");
        assert!(
            problems[0].problem.starts_with("CRC ")
                && problems[0].problem.ends_with(", expected cbf43926"),
            "{}",
            problems[0]
        );
        let err = verify_checkpoint_files_message(tmp.path(), &meta);
        assert!(err.contains("rolling_sum-0/000009.sst: CRC"), "{err}");
    }

    #[test]
    fn a_missing_file_is_reported_naming_the_file() {
        let (tmp, meta) = checkpoint_with(b"", 0, 0);
        fs::remove_file(tmp.path().join("rolling_sum-0/000009.sst")).unwrap();
        let problems = verify_files(tmp.path(), &meta);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].file, "rolling_sum-0/000009.sst");
        assert!(
            problems[0].problem.starts_with("unreadable: "),
            "{}",
            problems[0]
        );
    }

    /// What [`verify_checkpoint`] reports for `meta` written as `_metadata` of `dir`.
    fn verify_checkpoint_files_message(dir: &Path, meta: &CheckpointMetadata) -> String {
        fs::write(dir.join("_metadata"), meta.encode().unwrap()).unwrap();
        verify_checkpoint(dir).unwrap_err()
    }
}
