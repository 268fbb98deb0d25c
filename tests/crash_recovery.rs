//! Process-level crash tests: the real binary, killed with SIGKILL, restarted with the
//! same command, must commit every record exactly once with the right running totals.

mod common;

use common::wait::{self, DEADLINE};
use common::*;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::time::Duration;

/// The id of a checkpoint directory (`chk-<id>`).
fn checkpoint_id(chk: &std::path::Path) -> u64 {
    chk.file_name()
        .unwrap()
        .to_string_lossy()
        .trim_start_matches("chk-")
        .parse()
        .unwrap()
}

/// The checkpoint ids of the committed part files (`part-<subtask>-<id>`).
fn committed_part_ids(j: &JobDir) -> Vec<u64> {
    let Ok(rd) = std::fs::read_dir(j.out()) else {
        return Vec::new();
    };
    rd.filter_map(|e| {
        let name = e.ok()?.file_name().to_string_lossy().to_string();
        name.strip_prefix("part-")?.split_once('-')?.1.parse().ok()
    })
    .collect()
}

/// The job file with the other settings of `spec` and `rate_per_sec = 0`: the run that
/// finishes a job after its kills need not be slow.
fn at_full_speed(j: &JobDir, spec: &Spec) {
    let mut s = spec.clone();
    s.rate_per_sec = 0;
    j.write_config(&s);
}

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
    // A run would last 100 s: each one is killed shortly after it published a
    // checkpoint, long before its end, however slowly the machine starts it.
    spec.rate_per_sec = 2_000;
    let j = JobDir::new(&tmp.path().join("job"), spec.clone());
    for kill in 1..=10 {
        let published = wait::count(&j.log(), "checkpoint completed");
        let mut child = j.spawn(&[]);
        // Each run publishes a checkpoint before its kill, so every later run resumes.
        wait::while_running(
            &mut child,
            &j.log(),
            &format!("a checkpoint of run {kill}"),
            DEADLINE,
            || wait::count(&j.log(), "checkpoint completed") > published,
        );
        // The seeded moment: somewhere after that checkpoint, records in flight.
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..600)));
        assert!(
            sigkill(&mut child),
            "run {kill} ended before its kill; log:\n{}",
            tail(&j.log_text(), 30)
        );
    }
    at_full_speed(&j, &spec);
    assert!(j.run_to_end(&[]).success(), "{}", tail(&j.log_text(), 40));
    assert_exact(&j);
    assert_eq!(
        j.committed_lines(),
        failure_free_lines(tmp.path(), &spec),
        "running totals differ from a run without kills"
    );
    let log = j.log_text();
    assert_eq!(
        log.matches("starting without a checkpoint").count(),
        1,
        "only the first run starts empty"
    );
    assert_eq!(
        log.matches("restoring").count(),
        10,
        "every run after a checkpoint resumes from one (nine restarts and the final run)"
    );
}

#[test]
fn checkpoint_taken_at_parallelism_2_restores_at_parallelism_3_with_the_same_output() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = Spec::new(100_000);
    // A run would last 50 s: the kill comes long before its end.
    spec.rate_per_sec = 2_000;
    let j = JobDir::new(&tmp.path().join("job"), spec.clone());
    let mut child = j.spawn(&[]);
    j.wait_for_checkpoints(2, DEADLINE);
    assert!(sigkill(&mut child), "the job ended before its kill");
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
    // A run would last 50 s: the stop comes long before its end.
    spec.rate_per_sec = 2_000;
    let j = JobDir::new(&tmp.path().join("job"), spec.clone());
    let mut child = j.spawn(&[]);
    // Records were emitted and a checkpoint completed: the stop is mid-run.
    wait::for_log_while_running(&mut child, &j.log(), "first records emitted", 1, DEADLINE);
    j.wait_for_checkpoints(1, DEADLINE);
    assert!(wait::running(&mut child), "the job ended before its stop");
    signal(&child, libc::SIGTERM);
    let status = wait_timeout(&mut child, DEADLINE);
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

    at_full_speed(&j, &spec);
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
    j.wait_for_checkpoints(1, DEADLINE);
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
    // Restoring comes after taking the lock: the restart got past it.
    wait::for_log_while_running(&mut again, &j.log(), "restoring", 1, DEADLINE);
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
    // The first checkpoint comes 2 s after the start, when records have long been
    // flowing: it has part files to stage.
    spec.interval_ms = 2_000;
    let j = JobDir::new(&tmp.path().join("job"), spec);
    // The process aborts right after publishing its first checkpoint: the sink never
    // heard that it completed, so its part files are still staged.
    let status = wait_timeout(
        &mut j.spawn_env(&[], &[("LOCKGATE_FAILPOINTS", "after-publish=exit")]),
        DEADLINE,
    );
    assert!(!status.success(), "aborted at the failpoint");
    let log = j.log_text();
    assert!(
        matches!(
            (log.find("first records emitted"), log.find("checkpoint completed")),
            (Some(emitted), Some(published)) if emitted < published
        ),
        "records were emitted before the checkpoint:\n{}",
        tail(&log, 30)
    );
    // The files the published checkpoint names (its sink subtasks' states) are there,
    // still in progress: staged, not committed.
    let newest = j
        .complete_checkpoints()
        .pop()
        .expect("the published checkpoint");
    let meta = lockgate::state::CheckpointMetadata::read(&newest).unwrap();
    let mut staged = 0;
    for s in meta
        .subtasks
        .iter()
        .filter(|s| s.operator == lockgate::connector::SINK_UID)
    {
        for c in lockgate::connectors::file_sink::decode_staged(&s.inline_state).unwrap() {
            let lockgate::connectors::file_sink::Staged::Files { files, .. } = c else {
                panic!("a state of this version names files: {c:?}");
            };
            for f in files {
                let path = j
                    .out()
                    .join(&f.folder)
                    .join(format!(".inprogress-{}", f.token));
                assert!(path.exists(), "{} is staged", path.display());
                staged += 1;
            }
        }
    }
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
    let mut spec = Spec::new(1_000_000);
    spec.rate_per_sec = 2_000;
    let j = JobDir::new(&tmp.path().join("job"), spec);
    let mut child = j.spawn(&[]);
    // More checkpoints than retained, then a stop with a final one.
    wait::for_log_while_running(&mut child, &j.log(), "checkpoint completed", 5, DEADLINE);
    signal(&child, libc::SIGTERM);
    let status = wait_timeout(&mut child, DEADLINE);
    assert!(status.success(), "{}", tail(&j.log_text(), 20));
    let mut published: Vec<u64> = j
        .log_text()
        .lines()
        .filter(|l| l.contains("checkpoint completed"))
        .map(|l| {
            l.split("checkpoint=")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(published.len() > 3, "the run published {published:?}");
    published.sort_unstable();
    let kept: Vec<u64> = j
        .complete_checkpoints()
        .iter()
        .map(|c| checkpoint_id(c))
        .collect();
    assert_eq!(
        kept,
        published[published.len() - 3..],
        "retain = 3 (the default) keeps the newest three"
    );
}

#[test]
fn restoring_an_older_checkpoint_abandons_newer_ones_even_across_in_process_restarts() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = Spec::new(60_000);
    // A run would last 30 s: the kill comes long before its end.
    spec.rate_per_sec = 2_000;
    spec.restart_attempts = 3;
    let j = JobDir::new(&tmp.path().join("job"), spec.clone());
    // Nothing is retired meanwhile: the checkpoint chosen below still exists at the kill.
    keep_all_checkpoints(&j);
    let mut child = j.spawn(&[]);
    // An older checkpoint with two newer ones, and output committed after it.
    let mut older = PathBuf::new();
    wait::while_running(
        &mut child,
        &j.log(),
        "two checkpoints after one, with output committed after it",
        DEADLINE,
        || {
            if !j.checkpoints().exists() {
                return false;
            }
            let chks = j.complete_checkpoints();
            if chks.len() < 3 {
                return false;
            }
            older = chks[chks.len() - 3].clone();
            let id = checkpoint_id(&older);
            committed_part_ids(&j).iter().any(|&p| p > id)
        },
    );
    assert!(sigkill(&mut child), "the job ended before its kill");
    let older_s = older.display().to_string();
    at_full_speed(&j, &spec);
    // One in-process restart happens after the restore, before anything new is published.
    let status = wait_timeout(
        &mut j.spawn_env(
            &["--restore", &older_s],
            &[("LOCKGATE_FAILPOINTS", "before-metadata=1*panic")],
        ),
        DEADLINE,
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

/// Sets `retain = 100` in the job file.
fn keep_all_checkpoints(j: &JobDir) {
    let text = std::fs::read_to_string(j.config()).unwrap();
    assert!(text.contains("\ninterval_ms = "), "{text}");
    std::fs::write(
        j.config(),
        text.replacen("\ninterval_ms = ", "\nretain = 100\ninterval_ms = ", 1),
    )
    .unwrap();
}

/// A checkpoint that times out while a keyed subtask is still writing its RocksDB
/// checkpoint into `chk-N.inprogress` is aborted; its directory must not be removed
/// under that subtask, which would fail the subtask and restart the job although the
/// failure is tolerable.
#[test]
fn a_checkpoint_aborted_while_a_keyed_task_writes_into_it_is_tolerated_without_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = Spec {
        rate_per_sec: 10_000,
        ..Spec::new(20_000)
    };
    let j = JobDir::new(tmp.path(), spec);
    let text = std::fs::read_to_string(j.config()).unwrap();
    std::fs::write(
        j.config(),
        text.replacen(
            "\ninterval_ms = ",
            "\ntimeout_ms = 300\ntolerable_failures = 10\ninterval_ms = ",
            1,
        ),
    )
    .unwrap();
    // The first two keyed snapshots (both subtasks of the first checkpoint) stall for
    // 1 s after RocksDB wrote them and before their files are listed: the checkpoint
    // expires meanwhile.
    let mut child = j.spawn_env(
        &[],
        &[(lockgate::fault::ENV, "before-state-listing=2*sleep(1000)")],
    );
    let status = wait_timeout(&mut child, DEADLINE);
    let log = j.log_text();
    assert!(
        log.contains("checkpoint aborted"),
        "the first checkpoint expired: {}",
        tail(&log, 30)
    );
    assert!(status.success(), "{}", tail(&log, 40));
    for bad in ["task failed", "restarting", "job failed"] {
        assert!(!log.contains(bad), "{bad}: {}", tail(&log, 40));
    }
    assert_exact(&j);
    let leftovers: Vec<_> = std::fs::read_dir(j.checkpoints())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".inprogress"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "aborted checkpoints are removed once a later one is published: {leftovers:?}"
    );
}

/// Replaces the job file's `[restart]` section body (`strategy = "none"`).
fn set_restart(j: &JobDir, section: &str) {
    let text = std::fs::read_to_string(j.config()).unwrap();
    assert!(text.contains("strategy = \"none\""), "{text}");
    std::fs::write(j.config(), text.replace("strategy = \"none\"", section)).unwrap();
}

#[test]
fn exponential_delay_restarts_in_process_and_gives_up_naming_its_limit() {
    let restart = "strategy = \"exponential-delay\"\ninitial_delay_ms = 10\nmax_delay_ms = 40\n\
                   reset_after_ms = 60000\nattempts = 3";
    // Two failures: two restarts, then the job ends exact.
    let tmp = tempfile::tempdir().unwrap();
    let j = JobDir::new(&tmp.path().join("twice"), Spec::new(5_000));
    set_restart(&j, restart);
    let status = wait_timeout(
        &mut j.spawn_env(&[], &[("LOCKGATE_FAILPOINTS", "before-metadata=2*panic")]),
        DEADLINE,
    );
    let log = j.log_text();
    assert!(status.success(), "{}", tail(&log, 40));
    assert_eq!(
        log.matches("restarting from the last completed checkpoint")
            .count(),
        2,
        "{}",
        tail(&log, 40)
    );
    assert_exact(&j);

    // A failure at every attempt: three restarts (attempts = 3), then exit 1 with the
    // strategy's reason in the log.
    let j = JobDir::new(&tmp.path().join("always"), Spec::new(5_000));
    set_restart(&j, restart);
    let status = wait_timeout(
        &mut j.spawn_env(&[], &[("LOCKGATE_FAILPOINTS", "before-metadata=panic")]),
        DEADLINE,
    );
    let log = j.log_text();
    assert_eq!(status.code(), Some(1), "{}", tail(&log, 40));
    assert_eq!(
        log.matches("restarting from the last completed checkpoint")
            .count(),
        3,
        "{}",
        tail(&log, 40)
    );
    assert!(
        log.contains("the restart strategy gives up")
            && log.contains("exponential-delay: 4 failures in a row"),
        "{}",
        tail(&log, 40)
    );
}
