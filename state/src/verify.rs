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
