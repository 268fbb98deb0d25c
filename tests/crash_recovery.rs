//! Process-level crash tests: the real binary, killed with SIGKILL, restarted with the
//! same command, must commit every record exactly once with the right running totals.

mod common;

use common::*;
use rand::{Rng, SeedableRng};
use std::time::Duration;

/// The output a failure-free run of the same job commits (the reference).
fn failure_free_lines(tmp: &std::path::Path, spec: &Spec) -> Vec<String> {
    let mut s = spec.clone();
    s.rate_per_sec = 0;
    let j = JobDir::new(&tmp.join("reference"), s);
    assert!(j.run_to_end(&[]).success(), "{}", j.log_text());
    assert_exact(&j);
    j.committed_lines()
}

#[test]
fn ten_sigkills_at_seeded_moments_commit_every_record_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed(20261202));
    let mut spec = Spec::new(200_000);
    // Slow enough that ten kills of at most 1.2 s each cannot outrun the job.
    spec.rate_per_sec = 15_000;
    let j = JobDir::new(&tmp.path().join("job"), spec.clone());
    let mut kills = 0;
    for _ in 0..10 {
        let mut child = j.spawn(&[]);
        std::thread::sleep(Duration::from_millis(rng.gen_range(300..1200)));
        assert!(
            sigkill(&mut child),
            "the job ended before its kill; log:\n{}",
            tail(&j.log_text(), 30)
        );
        kills += 1;
    }
    assert_eq!(kills, 10);
    assert!(j.run_to_end(&[]).success(), "{}", tail(&j.log_text(), 40));
    assert_exact(&j);
    assert_eq!(
        j.committed_lines(),
        failure_free_lines(tmp.path(), &spec),
        "running totals differ from a run without kills"
    );
    let restores = j.log_text().matches("restoring").count();
    assert!(
        restores >= 5,
        "most restarts resume from a checkpoint ({restores} did)"
    );
}

#[test]
fn checkpoint_taken_at_parallelism_2_restores_at_parallelism_3_with_the_same_output() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = Spec::new(100_000);
    spec.rate_per_sec = 40_000;
    let j = JobDir::new(&tmp.path().join("job"), spec.clone());
    let mut child = j.spawn(&[]);
    j.wait_for_checkpoints(2, Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(300));
    assert!(sigkill(&mut child));
    let mut rescaled = spec.clone();
    rescaled.parallelism = 3;
    rescaled.rate_per_sec = 0;
    j.write_config(&rescaled);
    assert!(j.run_to_end(&[]).success(), "{}", tail(&j.log_text(), 40));
    assert!(
        j.log_text().contains("restoring"),
        "the rescaled run restored a checkpoint"
    );
    assert_exact(&j);
    assert_eq!(j.committed_lines(), failure_free_lines(tmp.path(), &spec));
}

#[test]
fn sigterm_completes_a_final_checkpoint_and_the_next_run_replays_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = Spec::new(100_000);
    spec.rate_per_sec = 20_000;
    let j = JobDir::new(&tmp.path().join("job"), spec);
    let mut child = j.spawn(&[]);
    j.wait_for_checkpoints(1, Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(500));
    signal(&child, libc::SIGTERM);
    let status = wait_timeout(&mut child, Duration::from_secs(30));
    assert_eq!(
        status.code(),
        Some(0),
        "SIGTERM exits 0; log:\n{}",
        tail(&j.log_text(), 20)
    );
    let newest = j.complete_checkpoints().pop().unwrap();
    let meta = lockgate::state::CheckpointMetadata::read(&newest).unwrap();
    assert!(meta.is_final, "the newest checkpoint is the final one");
    let v = j.verify();
    assert!(
        v.committed > 0 && v.committed < v.expected,
        "stopped mid-run: {v:?}"
    );
    assert_eq!(v.duplicated_count, 0);
    // Everything before the final checkpoint is committed: exactly the records the
    // final positions say were read.
    let read: i64 = meta
        .positions
        .iter()
        .map(|p| {
            let seq: Vec<i64> = (1..=100_000)
                .filter(|i| (i % 1000) % 128 == i64::from(p.partition))
                .collect();
            seq.iter().filter(|&&i| i < p.next.0).count() as i64
        })
        .sum();
    assert_eq!(
        v.committed as i64, read,
        "committed output equals the final positions"
    );

    assert!(j.run_to_end(&[]).success(), "{}", tail(&j.log_text(), 40));
    assert_exact(&j);
    assert!(
        !j.out().join(".rolled-back").exists(),
        "nothing was committed twice and rolled back"
    );
}

#[test]
fn a_second_run_on_a_held_checkpoint_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = Spec::new(1_000_000);
    spec.rate_per_sec = 1_000;
    let j = JobDir::new(&tmp.path().join("job"), spec);
    let mut first = j.spawn(&[]);
    j.wait_for_checkpoints(1, Duration::from_secs(30));
    let second = std::process::Command::new(bin())
        .args(["run", "--config"])
        .arg(j.config())
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(1));
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        err.contains("locked by another running lockgate process"),
        "{err}"
    );
    assert!(
        err.contains(&first.id().to_string()),
        "names the holder's pid: {err}"
    );
    assert!(sigkill(&mut first));
    // The kernel released the dead holder's lock: the same command resumes.
    let mut again = j.spawn(&[]);
    std::thread::sleep(Duration::from_millis(500));
    assert!(sigkill(&mut again), "the restart was not refused");
    assert_eq!(
        j.log_text().matches("locked by another").count(),
        0,
        "only the live holder refuses"
    );
}

#[test]
fn crash_between_publish_and_notify_commits_the_staged_files_on_restore() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = Spec::new(50_000);
    spec.rate_per_sec = 20_000;
    let j = JobDir::new(&tmp.path().join("job"), spec);
    // The process aborts right after publishing its first checkpoint: the sink never
    // heard that it completed, so its part files are still staged.
    let status = wait_timeout(
        &mut j.spawn_env(&[], &[("LOCKGATE_FAILPOINTS", "after-publish=exit")]),
        Duration::from_secs(30),
    );
    assert!(!status.success(), "aborted at the failpoint");
    let staged = std::fs::read_dir(j.out())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(".part-")
        })
        .count();
    assert!(
        staged > 0,
        "the published checkpoint left staged part files"
    );
    assert!(j.run_to_end(&[]).success(), "{}", tail(&j.log_text(), 30));
    assert_exact(&j);
}

#[test]
fn retention_keeps_the_newest_three_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = Spec::new(40_000);
    spec.rate_per_sec = 20_000;
    let j = JobDir::new(&tmp.path().join("job"), spec);
    assert!(j.run_to_end(&[]).success());
    let published = j.log_text().matches("checkpoint completed").count();
    assert!(published > 3, "the run published {published} checkpoints");
    assert_eq!(
        j.complete_checkpoints().len(),
        3,
        "retain = 3 (the default)"
    );
}

#[test]
fn restoring_an_older_checkpoint_abandons_newer_ones_even_across_in_process_restarts() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = Spec::new(60_000);
    spec.rate_per_sec = 20_000;
    spec.restart_attempts = 3;
    let j = JobDir::new(&tmp.path().join("job"), spec);
    let mut child = j.spawn(&[]);
    j.wait_for_checkpoints(3, Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(250));
    assert!(sigkill(&mut child));
    let chks = j.complete_checkpoints();
    let older = chks[chks.len() - 3].clone();
    let older_s = older.display().to_string();
    // One in-process restart happens after the restore, before anything new is published.
    let status = wait_timeout(
        &mut j.spawn_env(
            &["--restore", &older_s],
            &[("LOCKGATE_FAILPOINTS", "before-metadata=1*panic")],
        ),
        Duration::from_secs(60),
    );
    let log = j.log_text();
    assert!(status.success(), "{}", tail(&log, 40));
    assert!(
        log.contains("newer checkpoint abandoned"),
        "{}",
        tail(&log, 40)
    );
    assert!(
        log.contains("restarting from the last completed checkpoint"),
        "the failpoint forced a restart"
    );
    assert!(
        j.out().join(".rolled-back").is_dir(),
        "output committed after the restored checkpoint was moved aside"
    );
    assert_exact(&j);
}
