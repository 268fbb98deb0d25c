//! Crafted checkpoints: a `_metadata` with a valid CRC (the CRC is not a secret) whose
//! names climb out of the checkpoint, or a checkpoint holding symbolic links, given to
//! `lockgate run --restore` and to `lockgate checkpoints inspect|list`. Each is refused,
//! naming the checkpoint and the entry, and nothing outside the checkpoint is written.

mod common;

use common::*;
use lockgate_state::verify::file_crc32;
use lockgate_state::{CheckpointMetadata, FileEntry};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A real checkpoint with keyed state: a small bounded job run to its end.
fn real_checkpoint(tmp: &Path) -> (Spec, PathBuf) {
    let mut spec = Spec::new(3000);
    spec.parallelism = 1;
    let j = JobDir::new(&tmp.join("source-job"), spec.clone());
    assert!(j.run_to_end(&[]).success(), "{}", tail(&j.log_text(), 40));
    let chk = j.complete_checkpoints().pop().expect("a checkpoint");
    let meta = CheckpointMetadata::read(&chk).unwrap();
    assert!(
        meta.subtasks.iter().any(|s| s.state_dir.is_some()),
        "the checkpoint holds keyed state: {meta:?}"
    );
    (spec, chk)
}

/// Copies `chk` to `dest` and rewrites its `_metadata` with `edit`, with a valid CRC,
/// using the state crate's own writer.
fn craft(chk: &Path, dest: &Path, edit: impl FnOnce(&mut CheckpointMetadata)) {
    copy_dir(chk, dest);
    let mut meta = CheckpointMetadata::read(dest).unwrap();
    edit(&mut meta);
    std::fs::write(dest.join("_metadata"), meta.encode().unwrap()).unwrap();
}

/// Runs `lockgate <args>`; returns the exit code, stdout and stderr.
fn lockgate(args: &[&std::ffi::OsStr]) -> (Option<i32>, String, String) {
    let out = Command::new(bin())
        .args(args)
        .env("LOCKGATE_LOG", "info")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `lockgate run` of a fresh job like the one that wrote the checkpoint, restoring `chk`.
fn restore(job: &JobDir, chk: &Path) -> (Option<i32>, String) {
    let (code, _, err) = lockgate(&[
        "run".as_ref(),
        "--config".as_ref(),
        job.config().as_os_str(),
        "--restore".as_ref(),
        chk.as_os_str(),
    ]);
    (code, err)
}

fn no_output_committed(job: &JobDir) -> bool {
    std::fs::read_dir(job.out()).map_or(true, |rd| {
        rd.filter_map(|e| e.ok())
            .all(|e| !e.file_name().to_string_lossy().starts_with("part-"))
    })
}

#[test]
fn restore_refuses_a_state_file_name_climbing_out_of_the_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let (spec, chk) = real_checkpoint(tmp.path());
    let crafted = tmp.path().join("untrusted").join("chk-0000000099");
    let job = JobDir::new(&tmp.path().join("job"), spec);
    // The entry resolves, below the crafted checkpoint, to a real file with the size and
    // CRC it claims, so every other check passes: the restore would copy it from
    // `<tmp>/victim` to `<job>/victim` (the working directory is as deep as the
    // checkpoint's state directory).
    let payload = tmp.path().join("victim");
    std::fs::write(&payload, "written by a crafted checkpoint\n").unwrap();
    let (size, crc32) = file_crc32(&payload).unwrap();
    let entry = "../../../victim";
    craft(&chk, &crafted, |m| {
        let st = m
            .subtasks
            .iter_mut()
            .find(|s| s.state_dir.is_some())
            .unwrap();
        st.files.push(FileEntry {
            name: entry.into(),
            size,
            crc32,
        });
    });
    let target = job.root.join("victim");
    assert!(!target.exists());

    let (code, err) = restore(&job, &crafted);
    assert!(
        !target.exists(),
        "a file was written outside the checkpoint: {err}"
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&crafted.display().to_string()),
        "names the checkpoint: {err}"
    );
    assert!(
        err.contains(&format!("{entry:?}")),
        "names the entry: {err}"
    );
    assert!(err.contains("not one plain path component"), "{err}");
    assert!(
        !target.exists(),
        "a file was written outside the checkpoint"
    );
    assert!(no_output_committed(&job), "the job ran anyway");

    // `checkpoints inspect` refuses it too, without reading the entry.
    let (code, out, _) = lockgate(&[
        "checkpoints".as_ref(),
        "inspect".as_ref(),
        crafted.as_os_str(),
    ]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("CORRUPT") && out.contains(&format!("{entry:?}")),
        "{out}"
    );
    // And `checkpoints list` of the directory shows it as corrupt.
    let (code, out, _) = lockgate(&[
        "checkpoints".as_ref(),
        "list".as_ref(),
        crafted.parent().unwrap().as_os_str(),
    ]);
    assert_eq!(code, Some(0), "{out}");
    let line = out.lines().find(|l| l.contains("chk-0000000099")).unwrap();
    assert!(line.contains("CORRUPT"), "{out}");
}

#[test]
fn restore_refuses_an_absolute_state_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let (spec, chk) = real_checkpoint(tmp.path());
    let crafted = tmp.path().join("untrusted").join("chk-0000000099");
    let job = JobDir::new(&tmp.path().join("job"), spec);
    // A real state directory, outside the checkpoint, that every file CRC matches.
    let elsewhere = tmp.path().join("elsewhere");
    let mut abs = String::new();
    craft(&chk, &crafted, |m| {
        let st = m
            .subtasks
            .iter_mut()
            .find(|s| s.state_dir.is_some())
            .unwrap();
        copy_dir(&chk.join(st.state_dir.as_ref().unwrap()), &elsewhere);
        abs = elsewhere.display().to_string();
        st.state_dir = Some(abs.clone());
    });
    let (code, err) = restore(&job, &crafted);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(&crafted.display().to_string()), "{err}");
    assert!(err.contains(&format!("state_dir {abs:?}")), "{err}");
    assert!(no_output_committed(&job), "the job ran anyway");
}

#[test]
fn restore_and_inspect_refuse_a_symlink_inside_the_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let (spec, chk) = real_checkpoint(tmp.path());
    let crafted = tmp.path().join("untrusted").join("chk-0000000099");
    let job = JobDir::new(&tmp.path().join("job"), spec);
    craft(&chk, &crafted, |_| {});
    // Replace one listed state file by a link to an identical file outside: size and CRC
    // match, so only the link itself can be refused.
    let meta = CheckpointMetadata::read(&crafted).unwrap();
    let st = meta
        .subtasks
        .iter()
        .find(|s| s.state_dir.is_some())
        .unwrap();
    let name = &st.files[0].name;
    let inside = crafted.join(st.state_dir.as_ref().unwrap()).join(name);
    let outside = tmp.path().join("outside-file");
    std::fs::copy(&inside, &outside).unwrap();
    let before = std::fs::read(&outside).unwrap();
    std::fs::remove_file(&inside).unwrap();
    std::os::unix::fs::symlink(&outside, &inside).unwrap();

    let (code, err) = restore(&job, &crafted);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(&crafted.display().to_string()), "{err}");
    assert!(err.contains(name.as_str()), "names the file: {err}");
    assert!(err.contains("symbolic link"), "{err}");
    assert_eq!(std::fs::read(&outside).unwrap(), before);
    assert!(no_output_committed(&job), "the job ran anyway");

    let (code, out, _) = lockgate(&[
        "checkpoints".as_ref(),
        "inspect".as_ref(),
        crafted.as_os_str(),
    ]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("symbolic link"), "{out}");

    // A `_metadata` that is itself a link to a valid one is refused as well.
    let linked = tmp.path().join("untrusted").join("chk-0000000100");
    copy_dir(&chk, &linked);
    std::fs::remove_file(linked.join("_metadata")).unwrap();
    std::os::unix::fs::symlink(chk.join("_metadata"), linked.join("_metadata")).unwrap();
    let (code, err) = restore(&job, &linked);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("_metadata") && err.contains("symbolic link"),
        "{err}"
    );
}

#[test]
fn a_lock_file_that_is_a_symlink_is_refused_and_its_target_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    let job = JobDir::new(&tmp.path().join("job"), Spec::new(100));
    let precious = tmp.path().join("precious");
    std::fs::write(&precious, "keep me\n").unwrap();
    std::fs::create_dir_all(job.checkpoints()).unwrap();
    std::os::unix::fs::symlink(&precious, job.checkpoints().join("LOCK")).unwrap();
    let (code, _, err) = lockgate(&[
        "run".as_ref(),
        "--config".as_ref(),
        job.config().as_os_str(),
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("LOCK") && err.contains("symbolic link"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep me\n");
    assert!(no_output_committed(&job), "the job ran anyway");
}

#[test]
fn an_operator_uid_that_is_not_one_path_component_is_refused_when_the_job_is_built() {
    use lockgate::connectors::file_sink::{FileSink, FileSinkConfig};
    use lockgate::connectors::sequence::{SequenceConfig, SequenceSource};
    use lockgate::job::{CheckpointSettings, Job};
    use lockgate::operators::rolling_sum::{json_key, RollingSum};
    // The uid names the operator's state directory inside every checkpoint, which a
    // restore would refuse: the job is refused before it writes one.
    for (uid, ok) in [
        ("sum", true),
        ("../sum", false),
        ("a/b", false),
        ("..", false),
    ] {
        let seq = SequenceConfig {
            from: 1,
            to: 10,
            keys: 2,
            rate_per_sec: 0,
            splits: 1,
        };
        let built = Job::builder("uids")
            .checkpointing(CheckpointSettings::new("never-written"))
            .source_spec(SequenceSource::spec(seq))
            .key_by(|r| json_key(r, "/key"))
            .keyed("rolling_sum", uid, |_| RollingSum {
                field: "/value".into(),
                output: "/total".into(),
            })
            .sink_spec(FileSink::spec(FileSinkConfig::json("out")))
            .build();
        match built {
            Ok(_) => assert!(ok, "{uid:?} accepted"),
            Err(e) => {
                assert!(!ok, "{uid:?} refused: {e}");
                assert!(e.to_string().contains("one plain path component"), "{e}");
            }
        }
    }
}
