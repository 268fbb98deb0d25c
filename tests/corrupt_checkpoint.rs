//! Storage faults: the newest checkpoint's `_metadata` or one of its state files is
//! corrupted (a flipped byte) or truncated between two runs. The restart must name the
//! broken checkpoint, fall back to the previous one, and still commit exact output.

mod common;

use common::wait::{self, DEADLINE};
use common::*;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy)]
enum Damage {
    FlipByte,
    Truncate,
}

fn damage(file: &Path, how: Damage) {
    let mut bytes = std::fs::read(file).unwrap();
    assert!(!bytes.is_empty(), "{} is empty", file.display());
    match how {
        Damage::FlipByte => {
            let i = bytes.len() / 2;
            bytes[i] ^= 0x5a;
        }
        Damage::Truncate => bytes.truncate(bytes.len() / 2),
    }
    // Replace rather than write in place: state files are hard links shared with the
    // working instance and older checkpoints of an SST's lifetime, exactly as a disk
    // fault in that inode would be; here we damage only this checkpoint's copy.
    let tmp = file.with_extension("damaged");
    std::fs::write(&tmp, &bytes).unwrap();
    std::fs::rename(&tmp, file).unwrap();
}

fn newest_state_file(chk: &Path) -> PathBuf {
    find_newest_state_file(chk)
        .unwrap_or_else(|| panic!("no keyed state file in {}", chk.display()))
}

/// The newest SST file of the keyed state in `chk`, or, while the state is small enough
/// to live in the memtable only, the copy of the WAL that holds it.
fn find_newest_state_file(chk: &Path) -> Option<PathBuf> {
    for d in std::fs::read_dir(chk).ok()? {
        let d = d.unwrap().path();
        if d.is_dir()
            && d.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("rolling_sum")
        {
            let files: Vec<PathBuf> = std::fs::read_dir(&d)
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 0))
                .collect();
            for ext in ["sst", "log"] {
                let mut of: Vec<&PathBuf> = files
                    .iter()
                    .filter(|p| p.extension().is_some_and(|e| e == ext))
                    .collect();
                of.sort();
                if let Some(p) = of.pop() {
                    return Some(p.clone());
                }
            }
        }
    }
    None
}

/// A job that would run for 30 s: killed long before its end.
fn slow_spec() -> Spec {
    let mut spec = Spec::new(60_000);
    spec.rate_per_sec = 2_000;
    spec
}

/// Runs the job until a few checkpoints exist, the newest with keyed state, kills it,
/// damages the newest checkpoint, and checks the restart falls back and stays exact.
fn fall_back_past(target: fn(&Path) -> PathBuf, how: Damage) {
    let tmp = tempfile::tempdir().unwrap();
    let spec = slow_spec();
    let j = JobDir::new(&tmp.path().join("job"), spec.clone());
    let mut child = j.spawn(&[]);
    // Keyed state only grows: once the newest checkpoint holds it in a file (an SST, or
    // the WAL copy), every later one does too.
    wait::while_running(
        &mut child,
        &j.log(),
        "3 checkpoints, the newest with keyed state",
        DEADLINE,
        || {
            let chks = j.checkpoints().exists().then(|| j.complete_checkpoints());
            chks.is_some_and(|c| {
                c.len() >= 3 && find_newest_state_file(c.last().unwrap()).is_some()
            })
        },
    );
    assert!(sigkill(&mut child), "the job ended before its kill");
    let chks = j.complete_checkpoints();
    let newest = chks.last().unwrap().clone();
    let previous = chks[chks.len() - 2].clone();
    let newest_name = newest.file_name().unwrap().to_string_lossy().to_string();
    let newest_id: u64 = newest_name.trim_start_matches("chk-").parse().unwrap();
    let file = target(&newest);
    damage(&file, how);

    let before = j.log_text().len();
    // The restart need not be slow.
    let mut fast = spec.clone();
    fast.rate_per_sec = 0;
    j.write_config(&fast);
    assert!(j.run_to_end(&[]).success(), "{}", tail(&j.log_text(), 40));
    let log = j.log_text()[before..].to_string();
    let skip_line = log
        .lines()
        .find(|l| l.contains("skipping checkpoint"))
        .unwrap_or_else(|| panic!("no skip reported:\n{log}"));
    assert!(
        skip_line.contains(&newest_name),
        "names the broken checkpoint: {skip_line}"
    );
    let broken_file = file.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        skip_line.contains(&broken_file),
        "names the broken file {broken_file}: {skip_line}"
    );
    assert!(
        log.contains(&format!("checkpoint={}", previous.display()))
            || log.contains(&previous.display().to_string()),
        "restored the previous checkpoint {}:\n{}",
        previous.display(),
        tail(&log, 20)
    );
    // New checkpoints never reuse the skipped checkpoint's id.
    for l in log.lines().filter(|l| l.contains("checkpoint completed")) {
        let id: u64 = l
            .split("checkpoint=")
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            id > newest_id,
            "checkpoint {id} reused an id at or below the skipped {newest_id}"
        );
    }
    assert_exact(&j);
}

#[test]
fn restore_skips_newest_checkpoint_with_flipped_metadata_byte() {
    fall_back_past(|c| c.join("_metadata"), Damage::FlipByte);
}

#[test]
fn restore_skips_newest_checkpoint_with_truncated_metadata() {
    fall_back_past(|c| c.join("_metadata"), Damage::Truncate);
}

#[test]
fn restore_skips_newest_checkpoint_with_flipped_state_file_byte() {
    fall_back_past(newest_state_file, Damage::FlipByte);
}

#[test]
fn restore_skips_newest_checkpoint_with_truncated_state_file() {
    fall_back_past(newest_state_file, Damage::Truncate);
}

#[test]
fn checkpoints_existing_but_none_valid_refuses_to_start_empty() {
    let tmp = tempfile::tempdir().unwrap();
    let j = JobDir::new(&tmp.path().join("job"), slow_spec());
    let mut child = j.spawn(&[]);
    j.wait_for_checkpoints(2, DEADLINE);
    assert!(sigkill(&mut child), "the job ended before its kill");
    for c in j.complete_checkpoints() {
        damage(&c.join("_metadata"), Damage::FlipByte);
    }
    let out = std::process::Command::new(bin())
        .args(["run", "--config"])
        .arg(j.config())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("none verifies") && err.contains("refusing to start empty"),
        "{err}"
    );
}
