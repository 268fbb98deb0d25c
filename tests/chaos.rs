//! `lockgate chaos` end to end: the embedded Kafka in its own process, the Elasticsearch
//! test server (or osmem-server), the job killed with SIGKILL or aborted at failpoints,
//! and the index verified against the topic.

mod common;

use common::es::Es;
use common::kafka::KafkaProcess;
use common::lake;
use common::{bin, chaos, wait_timeout};
use lockgate::testkit::conformance::process::{self, KillAt, ProcessJob};
use lockgate::testkit::moto::MotoServer;
use rand::SeedableRng;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const USERS: u64 = 500;

/// Orders keyed by user: the producer's key partitioning puts a user in one partition.
fn produce_orders(bootstrap: &str, topic: &str, count: u64) {
    lockgate::testkit::kafka::produce_orders(bootstrap, topic, 0, count, USERS).unwrap();
}

fn job(dir: &Path, bootstrap: &str, es: &str, sink: &str) -> PathBuf {
    job_with_sink(
        dir,
        bootstrap,
        &format!(
            "[sink.elasticsearch]\nurl = \"{es}\"\nindex = \"orders\"\nbulk_flush_interval_ms = 100\nretry_initial_ms = 20\nretry_max_ms = 500\nretry_max_attempts = 1000\n{sink}\n"
        ),
    )
}

/// A `kafka -> rolling_sum -> <sink_section>` job file.
fn job_with_sink(dir: &Path, bootstrap: &str, sink_section: &str) -> PathBuf {
    let text = format!(
        "[job]\nname = \"chaos-test\"\nparallelism = 2\n\n[checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 200\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\n\n\
         [[transform]]\ntype = \"rolling_sum\"\nkey = \"/user\"\nfield = \"/amount\"\noutput = \"/total\"\n\n\
         {sink_section}"
    );
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join("job.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// Makes the job one subtask per member, co-partitioned: orders are keyed by user, so
/// partitioned by the rolling sum's key.
fn co_partitioned(config: &Path) {
    let text = std::fs::read_to_string(config).unwrap().replace(
        "parallelism = 2\n",
        "parallelism = 1\nco_partitioned = true\n",
    );
    std::fs::write(config, text).unwrap();
}

const UPSERT_BY_USER: &str = "id = \"field:/user\"\noperation = \"upsert\"";
const COORDINATES: &str = "id = \"coordinates\"";

fn assert_exact(code: Option<i32>, out: &str, r: &Value) {
    assert_eq!(code, Some(0), "{out}");
    for k in ["missing", "duplicated", "wrong"] {
        assert_eq!(r["verdict"][k], 0, "{k}: {out}");
    }
    assert!(r["verdict"]["inputs"].as_u64().unwrap() > 0, "{out}");
}

fn thirty_kills(sink: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 8)]);
    produce_orders(&kafka.bootstrap, "orders", 200_000);
    let es = Es::testkit();
    let config = job(tmp.path(), &kafka.bootstrap, &es.url(), sink);
    let (code, out, r) = chaos(
        &config,
        &[
            "--kills",
            "30",
            "--seed",
            "42",
            // The slower subtask owns at least 100k records, at least 98 batches:
            // 30 runs of at most 900 ms, throttled to a batch per 300 ms, read at most
            // 90 of them, so the job cannot finish before its 30th kill, however fast
            // the machine. The run after the last kill is not throttled.
            "--failpoints",
            "source-batch=sleep(300)",
            "--failpoint-runs",
            "30",
            "--kill-after-ms",
            "300..900",
        ],
    );
    assert_exact(code, &out, &r);
    assert_eq!(r["kills"], 30, "{out}");
    assert_eq!(r["job_failures"], 0, "{out}");
    assert_eq!(r["verdict"]["inputs"], 200_000);
    assert_every_run_after_a_checkpoint_restored_one(&r, &out);
    assert!(
        !r["recovery_ms"].as_array().unwrap().is_empty(),
        "a restarted run emitted records: {out}"
    );
}

/// No run that follows a completed checkpoint starts empty: it restores a checkpoint
/// (or was killed before it logged its decision).
fn assert_every_run_after_a_checkpoint_restored_one(r: &Value, out: &str) {
    let runs = r["runs"].as_array().unwrap();
    assert_eq!(
        runs.len() as u64,
        r["restarts"].as_u64().unwrap() + 1,
        "{out}"
    );
    let mut completed = 0;
    for (i, run) in runs.iter().enumerate() {
        if completed > 0 {
            assert_ne!(
                run["restored"], "empty",
                "run {i} started empty after {completed} checkpoints: {run}\n{out}"
            );
        }
        completed += run["checkpoints"].as_u64().unwrap();
    }
}

#[test]
fn thirty_sigkills_over_200k_records_with_rolling_sum_upserted_by_user() {
    thirty_kills(UPSERT_BY_USER);
}

#[test]
fn thirty_sigkills_over_200k_records_with_coordinates_ids() {
    thirty_kills(COORDINATES);
}

#[test]
fn three_members_killed_independently_are_exactly_once_together() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 8)]);
    produce_orders(&kafka.bootstrap, "orders", 60_000);
    let es = Es::testkit();
    let config = job(tmp.path(), &kafka.bootstrap, &es.url(), UPSERT_BY_USER);
    // Orders are keyed by user, so partitioned by the rolling sum's key.
    co_partitioned(&config);
    let (code, out, r) = chaos(
        &config,
        &[
            "--members",
            "3",
            "--kills",
            "4",
            "--seed",
            "7",
            // Each member owns at least 2 partitions (7,500 records each at least, over
            // 7 batches): 4 runs of at most 900 ms, throttled to a batch per 300 ms,
            // cannot finish a member before its 4th kill.
            "--failpoints",
            "source-batch=sleep(300)",
            "--failpoint-runs",
            "4",
            "--kill-after-ms",
            "300..900",
        ],
    );
    assert_exact(code, &out, &r);
    assert_eq!(r["kills"], 12, "{out}");
    assert_eq!(r["job_failures"], 0, "{out}");
    assert_eq!(r["verdict"]["inputs"], 60_000);
    let runs = r["runs"].as_array().unwrap();
    for m in 0..3u64 {
        let mine: Vec<&Value> = runs.iter().filter(|x| x["member"] == m).collect();
        assert_eq!(
            mine.len(),
            5,
            "member {m}: 4 kills and a finishing run: {out}"
        );
        assert_eq!(mine[4]["ended"], "finished", "{out}");
        // Every member resumed from its own line after a kill that followed one.
        for (i, run) in mine.iter().enumerate().skip(1) {
            if mine[i - 1]["newest_after"].is_string() {
                assert_eq!(
                    run["restored"]["checkpoint"],
                    mine[i - 1]["newest_after"],
                    "{out}"
                );
            }
        }
    }
    let lines: Vec<String> = std::fs::read_dir(tmp.path().join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("member-"))
        .collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
}

/// The `[checkpoint]` table of a job keeping its checkpoints in `moto`'s bucket under
/// `prefix`, with the client settings in the job file.
fn store_checkpoints(moto: &lockgate::testkit::moto::MotoServer, prefix: &str) -> String {
    format!(
        "[checkpoint]\ndir = \"s3://lockgate-chaos/{prefix}\"\nlocal_dir = \"staging-{prefix}\"\ninterval_ms = 200\n\
         endpoint = \"{}\"\nallow_http = true\nregion = \"us-east-1\"\naccess_key_id = \"testing\"\nsecret_access_key = \"testing\"\n",
        moto.endpoint()
    )
}

/// Orders keyed by order number (so a user's orders are in every partition) summed by
/// user across 3 members: a repartition stage writes them to a topic keyed by user, and
/// the job reads that topic co-partitioned. Both jobs keep their checkpoints in the
/// object store, and every member of each is killed on its own schedule. The
/// repartition stage's replays reach the topic again and must be dropped downstream.
#[test]
fn three_members_through_a_repartition_stage_with_checkpoints_in_the_store_are_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 8), ("orders-by-user", 8)]);
    lockgate::testkit::kafka::produce_orders_keyed(
        &kafka.bootstrap,
        "orders",
        0,
        80_000,
        USERS,
        lockgate::testkit::kafka::OrderKey::Order,
    )
    .unwrap();
    let es = Es::testkit();
    let moto = lockgate::testkit::moto::MotoServer::start().unwrap();
    moto.create_bucket("lockgate-chaos").unwrap();
    let bootstrap = &kafka.bootstrap;
    let upstream = tmp.path().join("repartition.toml");
    std::fs::write(
        &upstream,
        format!(
            "[job]\nname = \"repartition\"\nparallelism = 1\n\n{}\n\
             [restart]\nstrategy = \"none\"\n\n\
             [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\n\n\
             [sink.kafka]\ntopic = \"orders-by-user\"\nkey = \"/user\"\npartitions = 8\n",
            store_checkpoints(&moto, "repartition")
        ),
    )
    .unwrap();
    let job = |origin_headers: bool| {
        format!(
            "[job]\nname = \"totals\"\nparallelism = 1\nco_partitioned = true\n\n{}\n\
             [restart]\nstrategy = \"none\"\n\n\
             [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"orders-by-user\"]\nbounded = \"latest\"\norigin_headers = {origin_headers}\n\n\
             [[transform]]\ntype = \"rolling_sum\"\nkey = \"/user\"\nfield = \"/amount\"\noutput = \"/total\"\n\n\
             [sink.elasticsearch]\nurl = \"{}\"\nindex = \"orders\"\nbulk_flush_interval_ms = 100\nretry_initial_ms = 20\nretry_max_ms = 500\nretry_max_attempts = 1000\n{UPSERT_BY_USER}\n",
            store_checkpoints(&moto, "totals"),
            es.url()
        )
    };
    let config = tmp.path().join("job.toml");
    let up = upstream.to_str().unwrap();
    // Without origin_headers the replays would be applied twice: refused before any run.
    std::fs::write(&config, job(false)).unwrap();
    let refused = |args: &[&str]| {
        let out = Command::new(bin())
            .arg("chaos")
            .arg("--config")
            .arg(&config)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = refused(&["--upstream", up, "--members", "3"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("without origin_headers = true"), "{err}");
    // So is damaging a checkpoint in the store, which the harness does not do.
    std::fs::write(&config, job(true)).unwrap();
    let (code, err) = refused(&["--upstream", up, "--corrupt-latest"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("keeps them in s3://lockgate-chaos/"), "{err}");

    let (code, out, r) = chaos(
        &config,
        &[
            "--upstream",
            up,
            "--members",
            "3",
            "--kills",
            "2",
            "--seed",
            "11",
            // A member owns at least 2 partitions (at least 20,000 records, in at
            // least 20 batches): 2 runs of at most 2.5 s, throttled to a batch per
            // 300 ms (at most 9 batches each), cannot finish before the 2nd kill, and
            // a run lives long enough to upload checkpoints to the store before it is
            // killed.
            "--failpoints",
            "source-batch=sleep(300)",
            "--failpoint-runs",
            "2",
            "--kill-after-ms",
            "1200..2500",
        ],
    );
    assert_exact(code, &out, &r);
    assert_eq!(r["verdict"]["inputs"], 80_000, "{out}");
    assert_eq!(
        r["kills"], 12,
        "2 kills of each of 3 members of each stage: {out}"
    );
    assert_eq!(r["job_failures"], 0, "{out}");
    let runs = r["runs"].as_array().unwrap();
    for stage in ["upstream", "job"] {
        for m in 0..3u64 {
            let mine: Vec<&Value> = runs
                .iter()
                .filter(|x| x["stage"] == stage && x["member"] == m)
                .collect();
            assert_eq!(mine.len(), 3, "{stage} member {m}: {out}");
            assert_eq!(mine[2]["ended"], "finished", "{stage} member {m}: {out}");
            // A run after one that completed a checkpoint resumed from the store.
            for i in 1..3 {
                if mine[i - 1]["checkpoints"].as_u64() > Some(0) {
                    assert!(
                        mine[i]["restored"]["checkpoint"].is_string(),
                        "{stage} member {m} run {i}: {out}"
                    );
                }
            }
        }
    }
    // The repartition stage's kills left records after its checkpoints in the topic,
    // which its restarts wrote again: the job dropped those copies.
    assert!(r["replays_dropped"].as_u64().unwrap() > 0, "{out}");
    let written: i64 = (0..8)
        .map(|p| {
            let (lo, hi) = common::kafka::watermarks(bootstrap, "orders-by-user", p).unwrap();
            hi - lo
        })
        .sum();
    // Copies in the topic, each dropped by some run (a run killed after dropping some
    // drops them again after its restore, so the runs' count may be higher).
    let copies = written as u64 - 80_000;
    assert!(copies > 0, "{out}");
    assert!(
        r["replays_dropped"].as_u64().unwrap() >= copies,
        "{copies} copies: {out}"
    );
}

/// Sink settings under which only the checkpoint's flush writes: no size or interval
/// trigger, so that a sink acknowledging before its flush completed, or `_metadata`
/// published before the sink flushed, loses documents every time.
const BARRIER_FLUSH_ONLY: &str = "bulk_max_actions = 1000000\nbulk_max_bytes = 1073741824";

/// Switches the interval trigger of `job`'s sink off.
fn no_interval_flush(config: &Path) {
    let text = std::fs::read_to_string(config).unwrap();
    let text = text.replace(
        "bulk_flush_interval_ms = 100\n",
        "bulk_flush_interval_ms = 3600000\n",
    );
    assert!(text.contains("bulk_flush_interval_ms = 3600000"));
    std::fs::write(config, text).unwrap();
}

/// Aborts the first run at `failpoint` in the window of a checkpoint after the first
/// completed one, then lets the job finish: the next run must restore the newest
/// complete checkpoint, holding records, and the index must be exact.
fn abort_at(failpoint: &str) {
    abort_at_with(failpoint, COORDINATES);
}

/// [`abort_at`] with these sink settings; returns the job log of every run.
fn abort_at_with(failpoint: &str, sink: &str) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 4)]);
    produce_orders(&kafka.bootstrap, "orders", 40_000);
    let es = Es::testkit();
    let sink = format!("{sink}\n{BARRIER_FLUSH_ONLY}");
    let config = job(tmp.path(), &kafka.bootstrap, &es.url(), &sink);
    no_interval_flush(&config);
    // The slower subtask reads at least 20 batches at 100 ms each in the first run: it
    // lasts 2 s or more, ten checkpoint intervals. If checkpoint 1 still did not complete
    // in that time, the point never fires and the test fails below, saying so.
    let spec = format!("source-batch=sleep(100);{failpoint}@1=exit");
    let spec = if failpoint == "source-batch" {
        // Its own throttle: ten slow batches (at least 2 s), then the next one aborts;
        // both subtasks read at least 20 batches together.
        "source-batch=10*sleep(200)->exit".to_string()
    } else {
        spec
    };
    let (code, out, r) = chaos(
        &config,
        &[
            "--kills",
            "0",
            "--failpoints",
            &spec,
            "--failpoint-runs",
            "1",
        ],
    );
    assert_exact(code, &out, &r);
    assert_eq!(r["job_failures"], 0, "{out}");
    let runs = r["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "one aborted run, one that finished: {out}");
    let (aborted, next) = (&runs[0], &runs[1]);
    assert_eq!(aborted["ended"], "failpoint-abort", "{aborted}");
    assert_eq!(aborted["signal"], "SIGABRT", "{aborted}");
    assert_eq!(
        aborted["failpoint"], failpoint,
        "it died at {failpoint}: {aborted}"
    );
    assert!(
        aborted["checkpoints"].as_u64().unwrap() >= 1,
        "it aborted after a completed checkpoint: {aborted}"
    );
    assert!(
        aborted["newest_after"].is_string(),
        "a complete checkpoint was left: {aborted}"
    );
    assert_eq!(
        next["restored"]["checkpoint"], aborted["newest_after"],
        "the next run restored the newest complete checkpoint: {next}"
    );
    assert!(
        next["restored_offsets"].as_u64().unwrap() > 0,
        "the restored checkpoint held records: {next}"
    );
    assert_eq!(r["failpoint_aborts"], 1, "{out}");
    std::fs::read_to_string(config.with_extension("chaos.log")).unwrap()
}

/// With external versions, a bulk request applied whose response was lost is replayed
/// from the previous checkpoint: Elasticsearch answers 409 for every document of it,
/// which must count as already written (not fail the job), and the index is exact.
#[test]
fn a_lost_bulk_response_under_external_versions_is_replayed_as_already_written() {
    let log = abort_at_with(
        "bulk-response",
        &format!("{COORDINATES}\nversioning = \"external\""),
    );
    let already_written: u64 = log
        .lines()
        .filter(|l| l.contains("Elasticsearch sink closed"))
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("already_written="))
                .and_then(|n| n.parse::<u64>().ok())
        })
        .sum();
    assert!(
        already_written > 0,
        "the replay met documents the lost response had written: {}",
        common::tail(&log, 30)
    );
}

macro_rules! failpoint_tests {
    ($($name:ident => $fp:literal),* $(,)?) => {
        $(#[test] fn $name() { abort_at($fp); })*
    };
}

failpoint_tests! {
    abort_after_a_source_batch => "source-batch",
    abort_after_a_source_snapshot_before_its_ack => "before-source-ack",
    abort_after_a_source_snapshot => "after-source-snapshot",
    abort_before_the_sink_flush => "before-sink-flush",
    abort_after_the_sink_flush => "after-sink-flush",
    abort_before_the_rocksdb_checkpoint_is_listed => "before-state-listing",
    abort_during_the_rocksdb_checkpoint => "rocksdb-checkpoint",
    abort_after_the_last_ack_before_metadata => "before-metadata",
    abort_halfway_through_writing_metadata => "mid-metadata",
    abort_after_the_publishing_rename_before_its_fsync => "publish-before-fsync",
    abort_after_publish_before_notify => "after-publish",
    abort_after_a_bulk_was_accepted_before_its_response_was_read => "bulk-response",
}

/// The file sink's window between two part commits: the harness verifies
/// Elasticsearch, so this run is checked against the sequence directly. The first run
/// aborts after committing a part file of checkpoint 2; the next run
/// restores the newest complete checkpoint, commits what it staged, and the committed
/// output is exactly-once.
fn file_sink_abort_at(failpoint: &str) {
    file_sink_abort_at_with(failpoint, "");
}

/// [`file_sink_abort_at`] with more keys of `[sink.file]`.
fn file_sink_abort_at_with(failpoint: &str, sink_keys: &str) {
    use common::{JobDir, Spec};
    let tmp = tempfile::tempdir().unwrap();
    let j = JobDir::new(
        tmp.path(),
        Spec {
            rate_per_sec: 20_000,
            sink_keys: sink_keys.to_string(),
            ..Spec::new(40_000)
        },
    );
    // Parts are committed when their checkpoint completed: `@2` fires at the commits
    // of checkpoint 2.
    let spec = format!("{failpoint}@2=exit");
    let status = wait_timeout(
        &mut j.spawn_env(&[], &[(lockgate::fault::ENV, spec.as_str())]),
        Duration::from_secs(120),
    );
    let log = j.log_text();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGABRT),
        "the first run aborted: {}",
        common::tail(&log, 20)
    );
    assert!(
        log.contains(&format!("failpoint {failpoint}: exit")),
        "{log}"
    );
    let newest = j
        .complete_checkpoints()
        .pop()
        .expect("a complete checkpoint");
    let meta = lockgate::state::CheckpointMetadata::read(&newest).unwrap();
    assert!(
        meta.id.0 >= 2,
        "aborted after checkpoint 2 or later: {}",
        newest.display()
    );
    assert!(
        meta.positions.iter().any(|p| p.next.0 > 1),
        "it holds records"
    );
    assert!(
        j.run_to_end(&[]).success(),
        "{}",
        common::tail(&j.log_text(), 30)
    );
    let restored = format!("checkpoint={}", newest.display());
    assert!(
        j.log_text()
            .lines()
            .any(|l| l.contains(" restoring ") && l.contains(&restored)),
        "the next run restored {}: {}",
        newest.display(),
        common::tail(&j.log_text(), 30)
    );
    common::assert_exact(&j);
}

macro_rules! file_sink_failpoint_tests {
    ($($name:ident => $fp:literal),* $(,)?) => {
        $(#[test] fn $name() { file_sink_abort_at($fp); })*
    };
}

file_sink_failpoint_tests! {
    abort_after_the_file_sink_staged_a_part => "after-stage",
    abort_before_a_part_commit_of_the_file_sink => "before-part-commit",
    abort_between_two_part_commits_of_the_file_sink => "after-part-commit",
}

/// Parts rolled at 4 KiB: each checkpoint of each subtask commits several files, and
/// the abort comes between two of them; the restart commits the rest, exactly once.
macro_rules! rolled_file_sink_failpoint_tests {
    ($($name:ident => $fp:literal),* $(,)?) => {
        $(#[test] fn $name() { file_sink_abort_at_with($fp, "roll_bytes = 4096"); })*
    };
}

rolled_file_sink_failpoint_tests! {
    abort_between_two_files_of_one_part_commit => "between-file-commits",
}

macro_rules! store_file_sink_failpoint_tests {
    ($($name:ident => $fp:literal),* $(,)?) => {
        $(#[test] fn $name() { store_file_sink_abort_at($fp); })*
    };
}

// Every window of an object store commit, at parallelism 2 (a checkpoint commits two
// parts, one per subtask): after a part was staged, after the checkpoint was published
// and before any of its parts is visible, before one part's commit, between the copy
// and the delete of one, and between the two parts of one checkpoint.
store_file_sink_failpoint_tests! {
    abort_after_a_part_was_staged_in_the_store => "after-stage",
    abort_after_publish_before_the_store_parts_are_visible => "after-publish",
    abort_before_a_part_commit_into_the_store => "before-part-commit",
    abort_between_the_copy_and_the_delete_of_a_store_commit => "store-part-copied",
    abort_between_the_two_parts_of_one_store_commit => "after-part-commit",
}

/// The bucket and prefix of the object store tests' output.
const LAKE_PREFIX: &str = "orders";
const LAKE_URL: &str = "s3://lake/orders";

/// The prefix and suffix of a staged object's key under [`LAKE_PREFIX`], around its
/// token.
const STAGED_KEY: (&str, &str) = ("_staging/inprogress-", ".parquet");

/// What the store held under [`LAKE_PREFIX`] at one moment.
#[derive(Debug, Default)]
struct StoreParts {
    /// Under `_staging/`: written, not visible, by token, with their ETags (the MD5 of
    /// the bytes of an object put whole, which a copy keeps).
    staged: std::collections::BTreeMap<String, String>,
    /// Under the prefix itself: visible, as `(subtask, checkpoint id, file number)`,
    /// with their keys and ETags.
    visible: std::collections::BTreeMap<(u16, u64, u32), (String, String)>,
    /// Keys under `_rolled-back/`.
    rolled_back: Vec<String>,
    /// Any other key: the sink writes none.
    other: Vec<String>,
}

impl StoreParts {
    fn list(moto: &MotoServer) -> StoreParts {
        use lockgate::connectors::file_sink::store::STORE_ROLLED_BACK;
        use lockgate::connectors::file_sink::{parse_part_name, PartName};
        let mut parts = StoreParts::default();
        for (key, etag) in lake::store_objects_with_etags(moto, LAKE_PREFIX) {
            let (folder, name) = key.rsplit_once('/').unwrap_or(("", &key));
            let parquet = name.ends_with(".parquet");
            let token = key
                .strip_prefix(STAGED_KEY.0)
                .and_then(|t| t.strip_suffix(STAGED_KEY.1))
                .filter(|t| !t.contains('/'));
            match (folder, parse_part_name(name)) {
                ("", Some(PartName::Committed { subtask, id, seq })) if parquet => {
                    parts.visible.insert((subtask, id.0, seq), (key, etag));
                }
                _ if token.is_some() => {
                    parts.staged.insert(token.unwrap().to_string(), etag);
                }
                (f, _) if f == STORE_ROLLED_BACK => parts.rolled_back.push(key),
                ("", _) if name == lockgate::connectors::file_sink::store::STORE_MARKER => {}
                _ => parts.other.push(key),
            }
        }
        parts
    }

    /// Where `f` is: an error when it is in neither place (a checkpoint named it as
    /// durable: its absence is lost data) or when its visible part holds other bytes
    /// than its staged object.
    fn state(&self, f: &NamedFile) -> Result<FileState, String> {
        let staged = self.staged.get(&f.token);
        let visible = self.visible.get(&(f.subtask, f.id, f.n)).map(|(_, e)| e);
        match (staged, visible) {
            (Some(_), None) => Ok(FileState::Staged),
            (Some(s), Some(v)) if s == v => Ok(FileState::Copied),
            (None, Some(_)) => Ok(FileState::Committed),
            (Some(_), Some(_)) => Err(format!(
                "{f:?} is staged and visible with other bytes (ETags differ)"
            )),
            (None, None) => Err(format!("{f:?} is neither staged nor visible")),
        }
    }

    /// Whether every file of a committable is in `want`.
    fn all_in(&self, files: &[NamedFile], want: FileState) -> bool {
        files.iter().all(|f| self.state(f) == Ok(want))
    }
}

/// One file the file sink's state in a checkpoint names: the `n`-th file of
/// `subtask`'s part of checkpoint `id`, staged under `token` until its commit makes it
/// visible as `part-<subtask>-<id>[-<n>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NamedFile {
    subtask: u16,
    id: u64,
    n: u32,
    token: String,
}

/// Where a file a checkpoint names is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileState {
    /// Staged, not visible: its commit has not begun.
    Staged,
    /// Copied to its final name, its staged object not yet deleted.
    Copied,
    /// Visible, its staged object gone.
    Committed,
}

/// What a complete checkpoint names: its id and every committable its sink subtasks'
/// states hold (the parts staged and not yet known to be committed when it was taken,
/// its own and any earlier ones whose commit had not come yet), each a list of files.
#[derive(Debug)]
struct Named {
    id: u64,
    committables: Vec<Vec<NamedFile>>,
}

impl Named {
    /// What the complete checkpoint at `path` names, read from its metadata as a
    /// restore reads it.
    fn read(path: &Path) -> Named {
        use lockgate::connectors::file_sink::{decode_staged, Staged};
        let meta = lockgate::state::CheckpointMetadata::read(path).unwrap();
        let mut committables = Vec::new();
        for s in meta
            .subtasks
            .iter()
            .filter(|s| s.operator == lockgate::connector::SINK_UID)
        {
            for c in decode_staged(&s.inline_state).unwrap() {
                let Staged::Files { subtask, id, files } = c else {
                    panic!("a state of this version names files: {c:?}");
                };
                committables.push(
                    files
                        .into_iter()
                        .enumerate()
                        .map(|(n, f)| NamedFile {
                            subtask,
                            id: id.0,
                            n: n as u32,
                            token: f.token,
                        })
                        .collect(),
                );
            }
        }
        Named {
            id: meta.id.0,
            committables,
        }
    }

    /// What the newest complete checkpoint under `checkpoints` names.
    fn newest(checkpoints: &Path) -> Named {
        let path = lockgate::chaos::complete_checkpoints(checkpoints)
            .pop()
            .expect("a complete checkpoint");
        Named::read(&path)
    }

    fn files(&self) -> impl Iterator<Item = &NamedFile> {
        self.committables.iter().flatten()
    }

    fn names(&self, token: &str) -> bool {
        self.files().any(|f| f.token == token)
    }
}

/// Whether the store at the moment of an abort or kill at `point` shows that the
/// process died inside that point's window, `named` being what the newest complete
/// checkpoint names (None: not a point of the store commit). Each window, from the two
/// phase kit and the store writer:
/// - `after-stage`: a subtask put its part of the checkpoint being taken, which cannot
///   complete before that subtask acknowledges it: an object is staged that the newest
///   complete checkpoint does not name;
/// - `after-publish`: the checkpoint just published is the newest, and no subtask has
///   heard of it: every file of its own parts is staged and none visible, and nothing
///   else is staged than what it names (the next checkpoint is not triggered yet);
/// - `before-part-commit`: a subtask is about to commit the oldest part it holds, which
///   every later checkpoint names until its commit: a named part is staged, none of its
///   files visible;
/// - `store-part-copied`: a named file is visible and still staged, the same bytes;
/// - `after-part-commit`: a named part is visible, none of its files still staged.
fn in_window(point: &str, at: &StoreParts, named: &Named) -> Option<bool> {
    let any_part = |want| named.committables.iter().any(|c| at.all_in(c, want));
    Some(match point {
        "after-stage" => at.staged.keys().any(|t| !named.names(t)),
        "after-publish" => {
            let own: Vec<NamedFile> = named
                .files()
                .filter(|f| f.id == named.id)
                .cloned()
                .collect();
            !own.is_empty()
                && at.all_in(&own, FileState::Staged)
                && at.staged.keys().all(|t| named.names(t))
        }
        "before-part-commit" => any_part(FileState::Staged),
        "store-part-copied" => named.files().any(|f| at.state(f) == Ok(FileState::Copied)),
        "after-part-commit" => any_part(FileState::Committed),
        _ => return None,
    })
}

/// What a reader of the store sees, read back by pyarrow (its own S3 client), which
/// must hold at any moment the job is down, `named` being what its newest complete
/// checkpoint names: every visible object is a part of a checkpoint up to that one
/// (what a restore keeps), which pyarrow reads whole (no partial file), and no record
/// is in two of them; and every file the checkpoint names is staged or visible (a
/// restore commits it), the same bytes when both. Parts under `_rolled-back/` are not
/// output (readers skip `_` folders) and are not counted. Returns what the store holds
/// and each record seen (its `seq`).
fn assert_visible_once(
    moto: &MotoServer,
    named: &Named,
    note: &str,
) -> (StoreParts, std::collections::BTreeSet<i64>) {
    let newest = named.id;
    let parts = StoreParts::list(moto);
    assert_eq!(parts.other, Vec::<String>::new(), "only parts: {note}");
    for f in named.files() {
        if let Err(e) = parts.state(f) {
            panic!("checkpoint {newest} names a file that a restore cannot commit: {e} {note}");
        }
    }
    let early: Vec<_> = parts.visible.keys().filter(|p| p.1 > newest).collect();
    assert!(
        early.is_empty(),
        "parts of checkpoints after {newest} are visible: {early:?} {note}"
    );
    let rows = lake::store_rows(LAKE_URL, &moto.env())
        .unwrap_or_else(|e| panic!("pyarrow reads every visible part: {e} {note}"));
    let mut read = std::collections::BTreeSet::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut duplicated = Vec::new();
    for r in &rows {
        let file = r["file"].as_str().unwrap();
        read.insert(file.to_string());
        let seq = r["row"]["seq"].as_i64().unwrap();
        if !seen.insert(seq) {
            duplicated.push((seq, file.to_string()));
        }
    }
    let visible: std::collections::BTreeSet<String> =
        parts.visible.values().map(|(k, _)| k.clone()).collect();
    assert_eq!(
        read, visible,
        "pyarrow read rows from every visible part {note}"
    );
    assert!(duplicated.is_empty(), "duplicated: {duplicated:?} {note}");
    (parts, seen)
}

/// The final state of a Parquet file sink's output of the sequence `1..=to` in the
/// store after the job's last run (`named` what its final checkpoint names): what
/// [`assert_visible_once`] checks, every record there, nothing left under
/// `_staging/`, and no multipart upload left open in the bucket. Returns what the
/// store holds.
fn assert_exact_store_output(moto: &MotoServer, named: &Named, to: i64, note: &str) -> StoreParts {
    let (parts, seen) = assert_visible_once(moto, named, note);
    assert_eq!(
        parts.staged,
        Default::default(),
        "nothing staged is left behind {note}"
    );
    let missing: Vec<i64> = (1..=to).filter(|s| !seen.contains(s)).collect();
    assert!(
        missing.is_empty(),
        "{} missing, the first {:?} {note}",
        missing.len(),
        &missing[..missing.len().min(20)]
    );
    assert_eq!(seen.len() as i64, to, "nothing else {note}");
    assert_eq!(
        lake::multipart_uploads(moto, "lake"),
        Vec::<String>::new(),
        "no multipart upload left open {note}"
    );
    parts
}

/// Moto with the bucket `lake`, where a multipart upload left open is seen (so that
/// the check for none can fail): one is begun and left in a bucket of its own.
fn lake_store() -> MotoServer {
    let moto = MotoServer::start().unwrap();
    moto.create_bucket("lake").unwrap();
    moto.create_bucket("control").unwrap();
    lake::begin_multipart_upload(&moto, "control", "left/open");
    assert_eq!(
        lake::multipart_uploads(&moto, "control"),
        vec!["left/open".to_string()]
    );
    moto
}

/// A job writing a paced sequence as Parquet into an object store (moto, bucket
/// `lake`) at parallelism 2, its job file and checkpoints in a temporary directory.
struct StoreJob {
    moto: MotoServer,
    job: ProcessJob,
    schema: PathBuf,
    _tmp: tempfile::TempDir,
}

/// The records of the object store abort tests: a second at their pace.
const STORE_RECORDS: i64 = 3000;

impl StoreJob {
    fn new() -> StoreJob {
        let moto = lake_store();
        let tmp = tempfile::tempdir().unwrap();
        let schema = tmp.path().join("s.avsc");
        std::fs::write(&schema, lake::SEQUENCE_SCHEMA).unwrap();
        let job = ProcessJob::new(&common::bin(), &tmp.path().join("job")).unwrap();
        StoreJob {
            moto,
            job,
            schema,
            _tmp: tmp,
        }
    }

    /// Writes the job file: the sequence up to `to` at `rate` records per second.
    fn write(&self, to: i64, rate: u64) {
        let (source, sink) = lake::store_job_sections(&self.moto, LAKE_URL, &self.schema, to, rate);
        self.job.write(&source, &sink).unwrap();
    }

    /// Runs the job with failpoints `spec`, which must abort it at `fp`.
    fn abort(&self, spec: &str, fp: &str) {
        use std::os::unix::process::ExitStatusExt;
        let mut run = self.job.spawn(&[(lockgate::fault::ENV, spec)]).unwrap();
        let status = self.job.wait(&mut run).unwrap();
        drop(run);
        let tail = self.job.log_tail();
        assert_eq!(
            status.signal(),
            Some(libc::SIGABRT),
            "the run with {spec} aborted: {tail}"
        );
        assert!(
            tail.contains(&format!("failpoint {fp}: exit")),
            "it aborted at {fp}: {tail}"
        );
    }

    /// Runs the job to the end, unpaced, which must restore the checkpoint at
    /// `restored`, and checks its output ([`assert_exact_store_output`]): nothing was
    /// visible after that checkpoint, so nothing is rolled back.
    fn run_to_end_from(&self, restored: &Path, note: &str) {
        self.write(STORE_RECORDS, 0);
        self.job.run_to_end().unwrap();
        let log =
            std::fs::read_to_string(self.job.checkpoints().with_file_name("job.log")).unwrap();
        let restored = format!("checkpoint={} ", restored.display());
        assert!(
            log.lines()
                .any(|l| l.contains(" restoring ") && l.contains(&restored)),
            "the next run restored {restored} {note}: {}",
            self.job.log_tail()
        );
        let end = assert_exact_store_output(
            &self.moto,
            &Named::newest(&self.job.checkpoints()),
            STORE_RECORDS,
            note,
        );
        assert!(
            end.rolled_back.is_empty(),
            "nothing visible came after the restored checkpoint {note}"
        );
    }

    /// The newest complete checkpoint: what it names and its directory.
    fn newest(&self) -> (Named, PathBuf) {
        let path = lockgate::chaos::complete_checkpoints(&self.job.checkpoints())
            .pop()
            .expect("a complete checkpoint");
        (Named::read(&path), path)
    }
}

/// A run of a Parquet file sink into an object store (moto), parallelism 2, aborted at
/// failpoint `fp` at a checkpoint after the second one holding records (both subtasks
/// write by then, so a checkpoint commits two parts), then run to the end. The store at
/// the abort must show the window as the newest checkpoint's names place it
/// ([`in_window`]; at `after-part-commit` also a named part still wholly staged: the
/// other subtask's), and the final output must be exact ([`assert_exact_store_output`]).
fn store_file_sink_abort_at(fp: &str) {
    let j = StoreJob::new();
    j.write(STORE_RECORDS, STORE_RECORDS as u64);
    let spec = match fp {
        // The first subtask to reach a commit once armed goes on, commits its part and
        // aborts the process; any later commit pauses until then. The other subtask's
        // part of that checkpoint is staged before the checkpoint completes and cannot
        // be committed: one part is visible and the other staged, whichever subtask
        // comes first, and however long each takes.
        "after-part-commit" => {
            "before-part-commit@2=1*off->pause;after-part-commit@2=exit".to_string()
        }
        _ => format!("{fp}@2=exit"),
    };
    j.abort(&spec, fp);
    let (named, newest_path) = j.newest();
    let newest = named.id;
    assert!(newest >= 2, "two checkpoints completed before the abort");
    let at = StoreParts::list(&j.moto);
    let note = format!(
        "(abort at {fp} after checkpoint {newest}, which names {named:?}; the store then: {at:?})"
    );
    assert_eq!(
        in_window(fp, &at, &named),
        Some(true),
        "the store shows the window {note}"
    );
    if fp == "after-part-commit" {
        assert!(
            named
                .committables
                .iter()
                .any(|c| at.all_in(c, FileState::Staged)),
            "the other subtask's part is still staged {note}"
        );
    }
    assert!(at.rolled_back.is_empty(), "{note}");
    assert_visible_once(&j.moto, &named, &note);
    j.run_to_end_from(&newest_path, &note);
}

/// A restore commits the parts its checkpoint names again (their completion may not
/// have been acted on): a run aborted before a part's commit, then a run aborted
/// between the copy and the delete of that commit on its restore (its first commit,
/// before any checkpoint of its own), then a run to the end.
#[test]
fn abort_between_the_copy_and_the_delete_of_a_store_commit_on_restore() {
    let j = StoreJob::new();
    j.write(STORE_RECORDS, STORE_RECORDS as u64);
    j.abort("before-part-commit@2=exit", "before-part-commit");
    let (named, newest_path) = j.newest();
    let at = StoreParts::list(&j.moto);
    let note = format!(
        "(the store after the first abort, at checkpoint {}, which names {named:?}: {at:?})",
        named.id
    );
    assert_eq!(
        in_window("before-part-commit", &at, &named),
        Some(true),
        "{note}"
    );
    // Armed at once: the first copy is the restore's, of a part the restored
    // checkpoint names.
    j.abort("store-part-copied=exit", "store-part-copied");
    let at = StoreParts::list(&j.moto);
    let note = format!("(the store after the abort on restore: {at:?})");
    assert_eq!(
        j.newest().1,
        newest_path,
        "the second run completed no checkpoint: it died restoring {note}"
    );
    assert_eq!(
        in_window("store-part-copied", &at, &named),
        Some(true),
        "{note}"
    );
    assert_visible_once(&j.moto, &named, &note);
    j.run_to_end_from(&newest_path, &note);
}

/// Where the SIGKILLs of a file sink into an object store land: the checkpoint
/// protocol's moments ([`process::KILL_POINTS`]) and every window of the store
/// commit.
fn store_kill_points() -> Vec<(&'static str, std::ops::Range<u64>)> {
    process::KILL_POINTS
        .iter()
        .cloned()
        .chain([
            ("after-stage", 0..6),
            ("before-part-commit", 0..6),
            ("store-part-copied", 0..6),
            ("after-part-commit", 0..6),
        ])
        .collect()
}

/// `kills` SIGKILL moments at `points` from `seed`: each point once, then the rest
/// drawn among them ([`KillAt::schedule`]), in a seeded order; and the note that names
/// the seed and the moments in failures.
fn kill_schedule_over_every_point(
    seed: u64,
    kills: usize,
    points: &[(&'static str, std::ops::Range<u64>)],
) -> (Vec<KillAt>, String) {
    use rand::seq::SliceRandom;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut schedule: Vec<KillAt> = points
        .iter()
        .flat_map(|p| KillAt::schedule(&mut rng, 1, std::slice::from_ref(p)))
        .collect();
    schedule.extend(KillAt::schedule(&mut rng, kills - points.len(), points));
    schedule.shuffle(&mut rng);
    let moments: Vec<String> = schedule
        .iter()
        .map(|k| format!("{} pass {}", k.point, k.hits + 1))
        .collect();
    let note = format!(
        "(seed {seed}: kills at {}; LOCKGATE_TEST_SEED={seed} replays that schedule)",
        moments.join(", ")
    );
    (schedule, note)
}

/// Thirty SIGKILLs of a job writing Parquet into an object store (moto) at parallelism
/// 2, each at a seeded moment of the checkpoint protocol or of the store commit
/// ([`store_kill_points`], each at least once) after the run completed a checkpoint
/// holding records, then a run to the end. After every kill the store shows no partial
/// part, no duplicated record and nothing of a checkpoint after the newest complete one
/// ([`assert_visible_once`]), and a kill in a window of the store commit left what that
/// window leaves, as the newest checkpoint's names place it ([`in_window`]); at the end
/// the output is exact ([`assert_exact_store_output`]).
#[test]
fn thirty_sigkills_of_a_parquet_file_sink_into_an_object_store() {
    // Paced: a run lives at most a few checkpoints past its first one before its kill,
    // well under a second here; 60 s of input cannot run out in 30 such runs.
    const TO: i64 = 120_000;
    const RATE: u64 = 2_000;
    let started = std::time::Instant::now();
    let j = StoreJob::new();
    let (schedule, note) =
        kill_schedule_over_every_point(process::seed(20261207), 30, &store_kill_points());
    j.write(TO, RATE);
    let (mut shown, mut visible_after_the_kills) = (0, 0);
    for (i, at) in schedule.iter().enumerate() {
        let killed = j
            .job
            .kill_at(*at)
            .unwrap_or_else(|e| panic!("kill {i}: {e} {note}"));
        assert!(killed, "run {i} ended before its kill at {at:?} {note}");
        let named = Named::newest(&j.job.checkpoints());
        let (parts, seen) = assert_visible_once(&j.moto, &named, &format!("after kill {i} {note}"));
        if let Some(window) = in_window(at.point, &parts, &named) {
            assert!(
                window,
                "kill {i} at {at:?} after checkpoint {}, which names {named:?}, left {parts:?} {note}",
                named.id
            );
            shown += 1;
        }
        visible_after_the_kills = seen.len();
    }
    j.write(TO, 0);
    j.job
        .run_to_end()
        .unwrap_or_else(|e| panic!("the last run: {e} {note}"));
    let end = assert_exact_store_output(&j.moto, &Named::newest(&j.job.checkpoints()), TO, &note);
    eprintln!(
        "30 kills ({shown} checked in a store window, {visible_after_the_kills} of {TO} records visible after them) in {:?}: {} visible parts, {} rolled back {note}",
        started.elapsed(),
        end.visible.len(),
        end.rolled_back.len()
    );
}

/// The roll-back the harness checked on every restart of a file-sink job: each run
/// moved exactly the committed parts of checkpoints after the one it restored (none
/// more, none fewer, none deleted), the run after the corruption moved at least one,
/// and `.rolled-back/` on disk holds exactly what the runs moved.
fn assert_exact_roll_backs(r: &Value, out: &str, sink_dir: &Path) {
    assert_eq!(r["roll_back_exact"], true, "{out}");
    let names = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap().to_string())
            .collect()
    };
    let fallback = r["corruption"]["fallback"].as_str().unwrap();
    let fallback_id: u64 = fallback.trim_start_matches("chk-").parse().unwrap();
    let mut moved_by_runs = std::collections::BTreeSet::new();
    let mut fell_back_with_parts = false;
    for (i, run) in r["runs"].as_array().unwrap().iter().enumerate() {
        let c = &run["roll_back"];
        assert_eq!(c["exact"], true, "run {i}: {c}\n{out}");
        for k in ["unexpected", "lost"] {
            assert!(names(&c[k]).is_empty(), "run {i} {k}: {c}\n{out}");
        }
        let (expected, moved) = (names(&c["expected"]), names(&c["moved"]));
        if c["restore_done"] == true {
            assert_eq!(moved, expected, "run {i}: {c}\n{out}");
        }
        if c["restored"] == fallback_id && !moved.is_empty() {
            fell_back_with_parts = true;
        }
        moved_by_runs.extend(moved);
    }
    assert!(
        fell_back_with_parts,
        "a run restored {fallback} and rolled back the parts committed after it\n{out}"
    );
    assert_eq!(
        r["parts_rolled_back"].as_u64().unwrap(),
        moved_by_runs.len() as u64,
        "{out}"
    );
    let on_disk: std::collections::BTreeSet<String> =
        std::fs::read_dir(sink_dir.join(lockgate::connectors::file_sink::ROLLED_BACK))
            .unwrap()
            .map(|e| {
                let entry = e.unwrap().file_name().to_string_lossy().into_owned();
                lockgate::connectors::file_sink::rolled_back_part(&entry)
                    .map_or(entry.clone(), |(name, _)| name.to_string())
            })
            .collect();
    assert_eq!(on_disk, moved_by_runs, "{out}");
    for name in &on_disk {
        assert!(
            !sink_dir.join(name).exists(),
            "{name} was rolled back, yet a committed part of that name is in place"
        );
    }
}

/// The harness verifies the file sink's committed part files against the topic: ten
/// SIGKILLs and a corrupted newest checkpoint, after which the parts committed past
/// the fallback must move to `.rolled-back/`: left in place, they would count twice,
/// and the verdict counts every committed line. The harness checks each restart's
/// roll-back against the parts committed before it (exactly those after the restored
/// checkpoint), and waits with the kill before the corruption until the fallback has
/// parts to roll back.
#[test]
fn the_file_sink_under_kills_and_a_corrupted_checkpoint_is_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 4)]);
    produce_orders(&kafka.bootstrap, "orders", 100_000);
    let config = job_with_sink(tmp.path(), &kafka.bootstrap, "[sink.file]\ndir = \"out\"\n");
    let (code, out, r) = chaos(
        &config,
        &[
            "--kills",
            "10",
            "--seed",
            "5",
            // The slower subtask owns at least 50,000 records, at least 49 batches:
            // 10 runs of at most 900 ms, a batch per 300 ms, read at most 30 of them,
            // so the job cannot finish before its 10th kill.
            "--failpoints",
            "source-batch=sleep(300)",
            "--failpoint-runs",
            "10",
            "--kill-after-ms",
            "300..900",
            "--corrupt-latest",
        ],
    );
    assert_exact_roll_backs(&r, &out, &tmp.path().join("out"));
    assert_exact(code, &out, &r);
    assert_eq!(r["kills"], 10, "{out}");
    assert_eq!(r["job_failures"], 0, "{out}");
    assert_eq!(r["verdict"]["inputs"], 100_000);
    assert_eq!(
        r["verdict"]["documents"], 100_000,
        "one committed line per input"
    );
    assert_eq!(r["corruption_detected"], true, "{out}");
    assert_every_run_after_a_checkpoint_restored_one(&r, &out);
}

#[test]
fn every_failpoint_is_listed_and_tested() {
    let out = Command::new(bin())
        .args(["chaos", "--list-failpoints"])
        .output()
        .unwrap();
    let listed = String::from_utf8(out.stdout).unwrap();
    let tested = include_str!("chaos.rs");
    for (name, _) in lockgate::fault::FAILPOINTS {
        assert!(
            listed.lines().any(|l| l.starts_with(name)),
            "{name} not listed"
        );
        assert!(
            tested.contains(&format!("=> \"{name}\"")),
            "{name} has no abort test"
        );
    }
}

#[test]
fn a_corrupted_newest_checkpoint_is_reported_and_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 4)]);
    produce_orders(&kafka.bootstrap, "orders", 40_000);
    let es = Es::testkit();
    let config = job(tmp.path(), &kafka.bootstrap, &es.url(), COORDINATES);
    let (code, out, r) = chaos(
        &config,
        &[
            "--kills",
            "3",
            "--seed",
            "5",
            "--corrupt-latest",
            // Slow enough that two checkpoints complete while the first run lives (the
            // harness waits for them before the kill that precedes the corruption).
            "--failpoints",
            "source-batch=sleep(200)",
            "--failpoint-runs",
            "3",
            "--kill-after-ms",
            "600..900",
        ],
    );
    assert_exact(code, &out, &r);
    assert_eq!(r["job_failures"], 0, "{out}");
    let c = &r["corruption"];
    let (broken, fallback) = (
        c["checkpoint"].as_str().unwrap(),
        c["fallback"].as_str().unwrap(),
    );
    assert!(
        fallback < broken,
        "the fallback is older than the corrupted checkpoint: {c}"
    );
    assert_eq!(c["reported"], true, "the run named {broken}: {out}");
    assert_eq!(
        c["restored"]["checkpoint"], fallback,
        "the run after the corruption restored {fallback}: {out}"
    );
    assert_eq!(r["corruption_detected"], true, "{out}");
}

#[test]
fn a_corrupted_only_checkpoint_refuses_the_start_and_stops_the_harness() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 2)]);
    produce_orders(&kafka.bootstrap, "orders", 5_000);
    let es = Es::testkit();
    let config = job(tmp.path(), &kafka.bootstrap, &es.url(), COORDINATES);
    // The first run dies right after publishing its first checkpoint: exactly one.
    let first = Command::new(bin())
        .args(["run", "--config"])
        .arg(&config)
        .env("LOCKGATE_FAILPOINTS", "after-publish=exit")
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!first.success(), "the first run aborted at after-publish");
    let checkpoints = tmp.path().join("checkpoints");
    assert_eq!(lockgate::chaos::complete_checkpoints(&checkpoints).len(), 1);
    let mut rng = rand::rngs::SmallRng::seed_from_u64(common::seed(3));
    let (only, what) = lockgate::chaos::corrupt_latest(&checkpoints, &mut rng).unwrap();
    let only = only.file_name().unwrap().to_string_lossy().to_string();

    let (code, out, r) = chaos(&config, &["--kills", "0"]);
    assert_eq!(code, Some(1), "{out}");
    let stopped = r["stopped"].as_str().unwrap_or_else(|| panic!("{out}"));
    assert!(
        stopped.contains("none verifies") && stopped.contains(&only),
        "the report names the refusal and {only} ({what}): {stopped}"
    );
    assert!(out.contains(&only) && out.contains("stopped:"), "{out}");
    // Three failures in a row over five seconds or more (the harness backs off 1, 2, 4 s).
    let failures = r["job_failures"].as_u64().unwrap();
    assert!((3..=4).contains(&failures), "{out}");
    assert_eq!(r["restarts"].as_u64().unwrap(), failures - 1, "{out}");
    for run in r["runs"].as_array().unwrap() {
        assert!(
            run["ended"].as_str().unwrap().contains(&only),
            "each run refused, naming {only}: {run}"
        );
    }
    assert!(out.contains("exactly-once: FAILED"), "{out}");
}

#[test]
fn network_faults_on_both_sides_lose_and_duplicate_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let mut kafka = KafkaProcess::start(&[("orders", 6)]);
    produce_orders(&kafka.bootstrap, "orders", 60_000);
    let es = Es::testkit();
    let config = job(tmp.path(), &kafka.bootstrap, &es.url(), UPSERT_BY_USER);
    let config2 = config.clone();
    // Elasticsearch faults come from the harness itself (--es-faults); Kafka faults from
    // the embedded cluster's controls, meanwhile.
    let runner = std::thread::spawn(move || {
        chaos(
            &config2,
            &[
                "--kills",
                "5",
                "--seed",
                "9",
                "--es-faults",
                "--failpoints",
                "source-batch=sleep(60)",
                "--kill-after-ms",
                "800..1500",
            ],
        )
    });
    // The broker goes down while the job reads, not before it started.
    common::wait::for_log(
        &config.with_extension("chaos.log"),
        "first records emitted",
        Duration::from_secs(120),
    );
    kafka.control("down 1");
    std::thread::sleep(Duration::from_secs(3));
    kafka.control("up 1");
    kafka.control("errors fetch 20");
    let (code, out, r) = runner.join().unwrap();
    assert_exact(code, &out, &r);
    let stats = &r["es_stats"];
    // A phase is reported once its fault fired: item rejections, then failed requests.
    let fired = r["network_faults"].as_array().unwrap();
    assert!(fired.len() >= 3, "{out}");
    assert!(
        fired.iter().all(|f| f["count"].as_u64().unwrap() > 0),
        "{out}"
    );
    assert!(
        fired[0]["phase"]
            .as_str()
            .unwrap()
            .contains("items rejected"),
        "{out}"
    );
    assert!(fired[1]["phase"].as_str().unwrap().contains("503"), "{out}");
    assert!(stats["rejected_items"].as_u64().unwrap() > 0, "{out}");
    assert!(stats["failed_requests"].as_u64().unwrap() > 0, "{out}");
}

#[test]
fn ten_sigkills_against_osmem_server() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 4)]);
    produce_orders(&kafka.bootstrap, "orders", 40_000);
    let es = Es::osmem();
    let config = job(tmp.path(), &kafka.bootstrap, &es.url(), UPSERT_BY_USER);
    let (code, out, r) = chaos(
        &config,
        &[
            "--kills",
            "10",
            "--seed",
            "77",
            // The slower subtask has at least 20 batches; 10 runs of at most 800 ms at
            // a batch per 500 ms read at most 16: ten kills land before the end.
            "--failpoints",
            "source-batch=sleep(500)",
            "--failpoint-runs",
            "10",
            "--kill-after-ms",
            "300..800",
        ],
    );
    assert_exact(code, &out, &r);
    assert_eq!(r["kills"], 10, "{out}");
}

/// An abort point that no armed run reached leaves its window unexercised: the
/// harness names it in the table and the report and exits 1, even though the output
/// it did produce is exact.
#[test]
fn an_abort_point_that_never_fired_fails_the_run_and_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 2)]);
    produce_orders(&kafka.bootstrap, "orders", 2_000);
    let es = Es::testkit();
    let config = job(tmp.path(), &kafka.bootstrap, &es.url(), COORDINATES);
    // Armed after a thousand completed checkpoints: this short job never gets there.
    let (code, out, r) = chaos(
        &config,
        &["--kills", "0", "--failpoints", "after-publish@1000=exit"],
    );
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("abort points never fired") && out.contains("after-publish"),
        "{out}"
    );
    assert!(out.contains("exactly-once: FAILED"), "{out}");
    assert_eq!(r["failpoints_never_fired"][0], "after-publish", "{r}");
    assert_eq!(
        r["verdict"]["missing"], 0,
        "the output itself is exact: {r}"
    );
}

/// Orders keyed by user where every 40th carries a string `order` that the index's
/// mapping (`order: long`) refuses: Elasticsearch dead-letters those.
fn produce_orders_some_refused(bootstrap: &str, topic: &str, count: u64) -> u64 {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let p: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "20")
        .set("compression.type", "lz4")
        .create()
        .unwrap();
    let mut refused = 0;
    for i in 0..count {
        let user = format!("user-{:04}", (i * 7919) % USERS);
        let order = if i % 40 == 7 {
            refused += 1;
            format!("\"bad-{i}\"")
        } else {
            i.to_string()
        };
        let body = format!(
            "{{\"order\":{order},\"user\":\"{user}\",\"amount\":{}}}",
            1 + (i * 31) % 500
        );
        while p
            .send(BaseRecord::to(topic).key(&user).payload(&body))
            .is_err()
        {
            p.poll(Duration::from_millis(5));
        }
    }
    p.flush(Duration::from_secs(60)).unwrap();
    refused
}

/// Members killed independently, co-partitioned over one topic, upserts by user
/// coalesced in the sink (the default), and a record Elasticsearch refuses now and
/// then, dead-lettered: every user's document carries the total of their last order
/// that was not refused, every refused order is in the dead-letter topic, and nothing
/// else is. A write that coalescing dropped for a refused successor shows as wrong.
#[test]
fn members_co_partitioned_with_coalescing_and_dead_letters_are_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 6), ("orders-dlq", 1)]);
    let refused = produce_orders_some_refused(&kafka.bootstrap, "orders", 40_000);
    let es = Es::testkit();
    es.create_index("orders", &[("order", "long")]);
    let config = job(
        tmp.path(),
        &kafka.bootstrap,
        &es.url(),
        &format!("{UPSERT_BY_USER}\non_item_error = \"dead-letter:orders-dlq\""),
    );
    co_partitioned(&config);
    let (code, out, r) = chaos(
        &config,
        &[
            "--members",
            "2",
            "--kills",
            "3",
            "--seed",
            "11",
            // Each member owns 3 partitions (over 6,000 records, 6 batches at least):
            // 3 runs of at most 900 ms, a batch per 300 ms, cannot finish a member
            // before its 3rd kill.
            "--failpoints",
            "source-batch=sleep(300)",
            "--failpoint-runs",
            "3",
            "--kill-after-ms",
            "300..900",
        ],
    );
    assert_exact(code, &out, &r);
    assert_eq!(r["kills"], 6, "{out}");
    assert_eq!(r["job_failures"], 0, "{out}");
    assert_eq!(r["verdict"]["inputs"], 40_000);
    // Only orders the mapping refuses are dead letters. A refused order that a later
    // order of its user replaced while both were unsent is never sent (coalescing), so
    // not every refused order need be a letter; the last one of a user always is.
    let lettered = r["verdict"]["dead_lettered"].as_u64().unwrap();
    assert!(
        lettered > 0 && lettered <= refused,
        "{lettered} of {refused}: {out}"
    );
    let t = lockgate::chaos::Target::from_job_file(&config).unwrap();
    let inputs = lockgate::chaos::verify::read_inputs(&t).unwrap();
    let letters = lockgate::chaos::verify::dead_lettered(&t, "orders-dlq").unwrap();
    for r in &inputs.records {
        if letters.contains(&(r.topic.clone(), r.partition, r.offset)) {
            assert!(
                r.value["order"].is_string(),
                "a valid order was dead-lettered: {r:?}"
            );
        }
    }
    assert_eq!(r["verdict"]["expected_documents"], USERS, "{out}");
    let coalesced: u64 = std::fs::read_to_string(config.with_extension("chaos.log"))
        .unwrap()
        .lines()
        .filter(|l| l.contains("Elasticsearch sink closed"))
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("coalesced="))
                .and_then(|n| n.parse::<u64>().ok())
        })
        .sum();
    assert!(coalesced > 0, "upserts were coalesced: {out}");
}

/// The Iceberg sink aborted at `failpoint` once checkpoint 2 completed, then run to the
/// end: what pyiceberg reads of the table at the abort is what the window says (the
/// newest checkpoint's snapshot committed, or not yet), and at the end every record is
/// in the table once, each checkpoint in at most one snapshot.
fn iceberg_abort_at(failpoint: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    std::fs::write(
        root.join("seq.avsc"),
        r#"{"type":"record","name":"s","fields":[{"name":"seq","type":"long"},{"name":"key","type":"long"},{"name":"value","type":"long"}]}"#,
    )
    .unwrap();
    let uri = format!("sqlite:///{}", root.join("catalog.db").display());
    let warehouse = format!("file://{}", root.join("wh").display());
    let job = root.join("job.toml");
    std::fs::write(
        &job,
        format!(
            "[job]\nname = \"ice\"\nparallelism = 2\n\n[checkpoint]\ndir = {:?}\ninterval_ms = 200\n\n[source.sequence]\nfrom = 1\nto = 40000\nkeys = 10\nrate_per_sec = 20000\n\n[sink.iceberg]\ncatalog = {{ type = \"sql\", name = \"lake\", uri = {uri:?}, warehouse = {warehouse:?} }}\ntable = \"shop.seq\"\nschema_file = {:?}\npartition_by = \"key={{/key}}\"\n",
            root.join("chk").display().to_string(),
            root.join("seq.avsc").display().to_string(),
        ),
    )
    .unwrap();
    let spec = format!("{failpoint}@2=exit");
    let out = Command::new(bin())
        .args(["run", "--config"])
        .arg(&job)
        .env(lockgate::fault::ENV, &spec)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(libc::SIGABRT),
        "the first run aborted: {}",
        common::tail(&log, 20)
    );
    assert!(
        log.contains(&format!("failpoint {failpoint}: exit")),
        "{log}"
    );
    let newest: u64 = std::fs::read_dir(root.join("chk"))
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().to_string_lossy().into_owned();
            name.strip_prefix("chk-")?.parse().ok()
        })
        .max()
        .expect("a complete checkpoint");
    let table = common::lake::iceberg_table(&uri, &warehouse, "lake", "shop.seq", &[]).unwrap();
    let committed: Vec<u64> = table
        .line()
        .iter()
        .filter_map(|s| s["summary"]["lockgate.checkpoint"].as_str()?.parse().ok())
        .collect();
    let newest_committed = committed.iter().max().copied();
    match failpoint {
        // Committed before any subtask heard of it: the table has the checkpoint.
        "after-job-commit" => assert_eq!(newest_committed, Some(newest), "{committed:?}"),
        // Published and not committed yet: the restart commits it.
        "after-publish" => assert!(newest_committed < Some(newest), "{committed:?} {newest}"),
        // Staged at a barrier of a checkpoint not yet complete: nothing of it.
        _ => assert!(newest_committed <= Some(newest), "{committed:?} {newest}"),
    }
    let out = Command::new(bin())
        .args(["run", "--config"])
        .arg(&job)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        common::tail(&String::from_utf8_lossy(&out.stderr), 30)
    );
    let table = common::lake::iceberg_table(&uri, &warehouse, "lake", "shop.seq", &[]).unwrap();
    common::lake::one_snapshot_per_checkpoint(&table).unwrap();
    let mut seqs: Vec<i64> = table
        .rows
        .iter()
        .map(|r| r["seq"].as_i64().unwrap())
        .collect();
    seqs.sort();
    assert_eq!(seqs.len(), 40_000, "every record once");
    assert_eq!(seqs, (1..=40_000).collect::<Vec<_>>(), "every record once");
}

macro_rules! iceberg_failpoint_tests {
    ($($name:ident => $fp:literal),* $(,)?) => {
        $(#[test] fn $name() { iceberg_abort_at($fp); })*
    };
}

iceberg_failpoint_tests! {
    abort_after_the_iceberg_committer_committed => "after-job-commit",
    abort_after_publish_before_the_iceberg_commit => "after-publish",
    abort_after_the_iceberg_sink_staged_its_files => "after-stage",
}

/// The Iceberg sink with its warehouse in an object store (moto's S3), killed with
/// SIGKILL thirty times at seeded moments over every point of the checkpoint
/// protocol (the staging at a barrier and the committer's snapshot included), then run
/// to the end at another parallelism. After each kill pyiceberg reads the table: no row
/// twice, no checkpoint in two snapshots, no file in two, and no snapshot of a
/// checkpoint that is not published. At the end: every record once, and no multipart
/// upload left in the bucket.
#[test]
fn thirty_sigkills_of_an_iceberg_sink_into_an_object_store() {
    const TO: i64 = 120_000;
    const RATE: u64 = 2_000;
    let moto = MotoServer::start().unwrap();
    moto.create_bucket("lake").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let schema = tmp.path().join("s.avsc");
    std::fs::write(&schema, lake::SEQUENCE_SCHEMA).unwrap();
    let uri = format!("sqlite:///{}", tmp.path().join("catalog.db").display());
    let warehouse = "s3://lake/wh";
    let sink = (
        "iceberg".to_string(),
        format!(
            "catalog = {{ type = \"sql\", name = \"lake\", uri = {uri:?}, warehouse = {warehouse:?} }}\ntable = \"shop.seq\"\nschema_file = {:?}\npartition_by = \"key={{/key}}\"\nroll_bytes = 4096\nendpoint = {:?}\nallow_http = true\nregion = \"us-east-1\"\naccess_key_id = \"testing\"\nsecret_access_key = \"testing\"\n",
            schema.display().to_string(),
            moto.endpoint()
        ),
    );
    let job = ProcessJob::new(&bin(), &tmp.path().join("job")).unwrap();
    let source = |rate: u64| {
        (
            "sequence".to_string(),
            format!("from = 1\nto = {TO}\nkeys = 4\nrate_per_sec = {rate}"),
        )
    };
    let points: Vec<(&'static str, std::ops::Range<u64>)> = process::KILL_POINTS
        .iter()
        .cloned()
        .chain([("after-stage", 0..6), ("after-job-commit", 0..6)])
        .collect();
    let (schedule, note) = kill_schedule_over_every_point(process::seed(20261208), 30, &points);
    job.write_at(2, &source(RATE), &sink).unwrap();
    let mut reader = lake::IcebergReader::start(&moto.env()).unwrap();
    let mut seen = 0;
    for (i, at) in schedule.iter().enumerate() {
        let killed = job
            .kill_at(*at)
            .unwrap_or_else(|e| panic!("kill {i}: {e} {note}"));
        assert!(killed, "run {i} ended before its kill at {at:?} {note}");
        let table = reader.read(&uri, warehouse, "lake", "shop.seq").unwrap();
        lake::one_snapshot_per_checkpoint(&table)
            .unwrap_or_else(|e| panic!("after kill {i} at {at:?}: {e} {note}"));
        let mut seqs: Vec<i64> = table
            .rows
            .iter()
            .map(|r| r["seq"].as_i64().unwrap())
            .collect();
        seqs.sort();
        let rows = seqs.len();
        seqs.dedup();
        assert_eq!(
            seqs.len(),
            rows,
            "after kill {i} at {at:?}: a row twice {note}"
        );
        let published = job.newest();
        for s in table.line() {
            let ck: u64 = s["summary"]["lockgate.checkpoint"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!(
                ck <= published,
                "after kill {i} at {at:?}: a snapshot of checkpoint {ck}, newer than the published {published} {note}"
            );
        }
        seen = rows;
    }
    job.write_at(3, &source(0), &sink).unwrap();
    job.run_to_end()
        .unwrap_or_else(|e| panic!("the last run: {e} {note}"));
    let table = reader.read(&uri, warehouse, "lake", "shop.seq").unwrap();
    lake::one_snapshot_per_checkpoint(&table).unwrap();
    let mut seqs: Vec<i64> = table
        .rows
        .iter()
        .map(|r| r["seq"].as_i64().unwrap())
        .collect();
    seqs.sort();
    assert_eq!(
        seqs,
        (1..=TO).collect::<Vec<_>>(),
        "every record once {note}"
    );
    assert_eq!(lake::multipart_uploads(&moto, "lake"), Vec::<String>::new());
    eprintln!("30 kills ({seen} of {TO} rows visible after them) {note}");
}
