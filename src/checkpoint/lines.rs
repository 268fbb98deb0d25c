//! The checkpoint lines of a checkpoint directory, read for a member's start: the
//! directory itself (the line of a job run as one process) and one `member-I-of-N/`
//! per member of a job run as several, in a local directory or under an object-store
//! prefix. Reading only; [`super::line_plan`] decides.

use super::line_plan::LineState;
use crate::member::Member;
use lockgate_state::restore::restore_plan;
use lockgate_state::snapshot_dir::{chk_name, list};
use lockgate_state::store::{CheckpointStore, StoreLocation};
use lockgate_state::{CheckpointId, CheckpointMetadata, StateError};
use std::path::{Path, PathBuf};

/// The directory of `member`'s line below the checkpoint directory `base`.
pub fn line_dir(base: &Path, member: Member) -> PathBuf {
    match member.line() {
        Some(l) => base.join(l),
        None => base.to_path_buf(),
    }
}

/// Every line under `base` that holds a checkpoint entry. A line's newest checkpoint
/// is the newest complete one whose `_metadata` reads (its files are verified only
/// when it is restored: reading every line's state at each start would cost as much
/// as the state).
pub fn scan(base: &Path) -> Result<Vec<LineState>, StateError> {
    let mut lines = vec![read_line(base, Member::SOLO)?];
    let rd = match std::fs::read_dir(base) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(lines),
        Err(e) => return Err(StateError::io("list", base)(e)),
    };
    for item in rd {
        let item = item.map_err(StateError::io("list", base))?;
        let name = item.file_name().to_string_lossy().into_owned();
        if let Some(m) = Member::parse_line(&name) {
            if item.file_type().is_ok_and(|t| t.is_dir()) {
                lines.push(read_line(&base.join(&name), m)?);
            }
        }
    }
    lines.sort_by_key(|l| l.member);
    Ok(lines)
}

/// [`scan`] of an object-store prefix: the prefix's own line and every
/// `member-I-of-N/` folder under it, each with its newest complete checkpoint whose
/// `_metadata` reads.
pub async fn scan_store(base: &StoreLocation) -> Result<Vec<LineState>, StateError> {
    let store = CheckpointStore::new(base)?;
    let (newest_valid, next_id) = store.newest_readable().await?;
    let mut lines = vec![LineState {
        member: Member::SOLO,
        newest_valid,
        next_id,
    }];
    for name in store.folders().await? {
        if let Some(member) = Member::parse_line(&name) {
            let (newest_valid, next_id) = CheckpointStore::new(&base.join(&name))?
                .newest_readable()
                .await?;
            lines.push(LineState {
                member,
                newest_valid,
                next_id,
            });
        }
    }
    lines.sort_by_key(|l| l.member);
    Ok(lines)
}

fn read_line(dir: &Path, member: Member) -> Result<LineState, StateError> {
    let plan = restore_plan(&list(dir)?);
    let newest_valid = plan.candidates.iter().find_map(|id: &CheckpointId| {
        CheckpointMetadata::read(&dir.join(chk_name(*id)))
            .ok()
            .map(|m| (*id, m.is_final))
    });
    Ok(LineState {
        member,
        newest_valid,
        next_id: plan.next_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_found_by_name_and_read_without_their_state() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path();
        let m = |i, n| Member::new(i, n).unwrap();
        assert_eq!(line_dir(base, Member::SOLO), base);
        assert_eq!(line_dir(base, m(1, 3)), base.join("member-1-of-3"));
        // A directory not made yet (a first start): the empty line of one process.
        assert_eq!(
            scan(&base.join("absent")).unwrap(),
            vec![LineState {
                member: Member::SOLO,
                newest_valid: None,
                next_id: CheckpointId(1),
            }]
        );
        // An empty directory: only the (empty) line of a single process.
        let lines = scan(base).unwrap();
        assert_eq!(
            lines,
            vec![LineState {
                member: Member::SOLO,
                newest_valid: None,
                next_id: CheckpointId(1),
            }]
        );
        let write = |dir: &Path, id: u64, is_final: bool| {
            let meta = CheckpointMetadata {
                id: CheckpointId(id),
                job_name: "j".into(),
                fingerprint: 1,
                created_ms: 0,
                parallelism: 1,
                max_parallelism: 128,
                is_final,
                subtasks: Vec::new(),
                positions: Vec::new(),
            };
            let chk = dir.join(chk_name(CheckpointId(id)));
            std::fs::create_dir_all(&chk).unwrap();
            std::fs::write(chk.join("_metadata"), meta.encode().unwrap()).unwrap();
        };
        write(base, 3, true);
        write(&base.join("member-0-of-2"), 4, false);
        write(&base.join("member-0-of-2"), 5, true);
        // A newest checkpoint whose metadata does not read: the one before counts.
        write(&base.join("member-1-of-2"), 6, false);
        let bad = base.join("member-1-of-2").join(chk_name(CheckpointId(7)));
        std::fs::create_dir_all(&bad).unwrap();
        std::fs::write(bad.join("_metadata"), b"garbage").unwrap();
        // Not lines.
        std::fs::create_dir_all(base.join("member-2-of-2")).unwrap();
        std::fs::write(base.join("member-0-of-3"), b"a file").unwrap();
        let lines = scan(base).unwrap();
        let got: Vec<_> = lines
            .iter()
            .map(|l| (l.member, l.newest_valid, l.next_id.0))
            .collect();
        assert_eq!(
            got,
            vec![
                (Member::SOLO, Some((CheckpointId(3), true)), 4),
                (m(0, 2), Some((CheckpointId(5), true)), 6),
                (m(1, 2), Some((CheckpointId(6), false)), 8),
            ]
        );
    }
}
