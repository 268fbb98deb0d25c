//! One job as several members (`lockgate run --member I --members N`): each member
//! reads its share of the partitions and keeps its own checkpoint line; the number of
//! members changes with final checkpoints between (`--rescale-from K`). Real
//! processes, the embedded Kafka (8 partitions), the Elasticsearch test server, and
//! the chaos harness's verifier.

mod common;

use common::es::Es;
use common::kafka::KafkaProcess;
use common::{bin, sigkill, signal, tail, wait_timeout};
use lockgate::chaos::target::Target;
use lockgate::chaos::verify::{read_inputs, verify};
use lockgate_state::snapshot_dir::{list, resolve_restore_path};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const USERS: u64 = 300;
const PARTITIONS: i32 = 8;

/// A `kafka -> rolling_sum by user -> elasticsearch upsert by user` job on a live
/// (unbounded) topic whose orders are keyed, so partitioned, by user.
fn job(dir: &Path, bootstrap: &str, es: &str, co_partitioned: bool) -> PathBuf {
    let text = format!(
        "[job]\nname = \"members-test\"\nparallelism = 1\nco_partitioned = {co_partitioned}\n\n\
         [checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 200\n\n\
         [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"orders\"]\n\
         partition_discovery_ms = 500\n\n\
         [[transform]]\ntype = \"rolling_sum\"\nkey = \"/user\"\nfield = \"/amount\"\noutput = \"/total\"\n\n\
         [sink.elasticsearch]\nurl = \"{es}\"\nindex = \"orders\"\nbulk_flush_interval_ms = 100\n\
         id = \"field:/user\"\noperation = \"upsert\"\n"
    );
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join("job.toml");
    std::fs::write(&p, text).unwrap();
    p
}

fn produce(bootstrap: &str, from: u64, count: u64) {
    lockgate::testkit::kafka::produce_orders(bootstrap, "orders", from, count, USERS).unwrap();
}

/// One member process, logging to `member-I-of-N.log` beside the job file.
struct MemberProcess {
    child: Child,
    log: PathBuf,
    line: PathBuf,
}

impl MemberProcess {
    fn start(config: &Path, index: u16, count: u16, extra: &[&str]) -> MemberProcess {
        let log = config.with_file_name(format!("member-{index}-of-{count}.log"));
        let child = Command::new(bin())
            .args(["run", "--config"])
            .arg(config)
            .args([
                "--member",
                &index.to_string(),
                "--members",
                &count.to_string(),
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let line = config.with_file_name("checkpoints").join(if count == 1 {
            String::new()
        } else {
            format!("member-{index}-of-{count}")
        });
        MemberProcess { child, log, line }
    }

    fn log_text(&self) -> String {
        tail(&std::fs::read_to_string(&self.log).unwrap_or_default(), 30)
    }

    /// Waits until the member's line holds a complete checkpoint numbered above `after`.
    fn wait_for_checkpoint_after(&mut self, after: u64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if newest_complete(&self.line).is_some_and(|id| id > after) {
                return;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "{} exited ({status}):\n{}",
                    self.line.display(),
                    self.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no checkpoint in {}:\n{}",
                self.line.display(),
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM: the member completes a final checkpoint and exits 0.
    fn stop(mut self) {
        signal(&self.child, libc::SIGTERM);
        let status = wait_timeout(&mut self.child, Duration::from_secs(60));
        assert!(status.success(), "{status}:\n{}", self.log_text());
    }
}

/// The embedded Kafka (8 partitions of `orders`), the Elasticsearch test server, and a
/// co-partitioned job file on them in `dir`.
fn servers(dir: &Path) -> (KafkaProcess, Es, PathBuf) {
    let kafka = KafkaProcess::start(&[("orders", PARTITIONS)]);
    let es = Es::testkit();
    let config = job(dir, &kafka.bootstrap, &es.url(), true);
    (kafka, es, config)
}

/// Starts all `count` members with `extra` arguments and waits until each completed a
/// checkpoint numbered above `after`.
fn start_members(config: &Path, count: u16, extra: &[&str], after: u64) -> Vec<MemberProcess> {
    let mut members: Vec<MemberProcess> = (0..count)
        .map(|i| MemberProcess::start(config, i, count, extra))
        .collect();
    for m in &mut members {
        m.wait_for_checkpoint_after(after);
    }
    members
}

/// `lockgate run` of `config` with `args`, to its end: the exit code and stderr.
fn run_once(config: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(bin())
        .args(["run", "--config"])
        .arg(config)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn newest_complete(line: &Path) -> Option<u64> {
    list(line)
        .unwrap()
        .iter()
        .filter(|e| e.status == lockgate_state::restore::EntryStatus::Complete)
        .map(|e| e.id.0)
        .max()
}

/// The partitions in the newest checkpoint of each of `count` members' lines, after
/// checking that each is final and that the members' shares are disjoint and cover
/// every partition.
fn assert_final_shares(config: &Path, count: u16) -> Vec<BTreeSet<i32>> {
    let base = config.with_file_name("checkpoints");
    let mut all = BTreeSet::new();
    let mut shares = Vec::new();
    for i in 0..count {
        let line = if count == 1 {
            base.clone()
        } else {
            base.join(format!("member-{i}-of-{count}"))
        };
        let (r, skipped) = resolve_restore_path(&line).unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        assert!(r.metadata.is_final, "{} is not final", r.path.display());
        let share: BTreeSet<i32> = r.metadata.positions.iter().map(|p| p.partition).collect();
        for p in &share {
            assert!(
                all.insert(*p),
                "partition {p} is in two members' checkpoints"
            );
        }
        shares.push(share);
    }
    assert_eq!(all, (0..PARTITIONS).collect(), "{shares:?}");
    shares
}

/// Waits until the index holds exactly what the topic implies (every user's total
/// over every order, each order applied once), or fails with the verdict.
fn wait_exact(config: &Path, members: &[MemberProcess]) {
    let target = Target::from_job_file(config).unwrap();
    let inputs = read_inputs(&target).unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let v = verify(&target, &inputs).unwrap();
        if v.exact() && v.documents == USERS {
            return;
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = members.iter().map(|m| m.log_text()).collect();
            panic!("not exact: {v:?}\n{}", logs.join("\n---\n"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn three_members_share_the_partitions_and_rescale_3_2_4_on_a_live_stream_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let (kafka, _es, config) = servers(tmp.path());
    produce(&kafka.bootstrap, 0, 6_000);

    // Three members: each reads its share and checkpoints in its own line.
    let three = start_members(&config, 3, &[], 0);
    produce(&kafka.bootstrap, 6_000, 3_000);
    wait_exact(&config, &three);
    for m in three {
        m.stop();
    }
    let shares = assert_final_shares(&config, 3);
    assert!(shares.iter().all(|s| !s.is_empty()), "{shares:?}");
    // `checkpoints list` of the shared directory names every member's line.
    let out = Command::new(bin())
        .args(["checkpoints", "list"])
        .arg(config.with_file_name("checkpoints"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for i in 0..3 {
        let row = text
            .lines()
            .find(|l| l.starts_with(&format!("member-{i}-of-3 ")))
            .unwrap_or_else(|| panic!("member-{i}-of-3 listed:\n{text}"));
        assert!(row.trim_end().ends_with("true"), "final: {row}");
    }

    // 3 -> 2 while orders keep arriving: records produced while no member runs are
    // read by the new members, from the positions of the old ones.
    produce(&kafka.bootstrap, 9_000, 2_000);
    let base = (0..3)
        .map(|i| {
            newest_complete(
                &config
                    .with_file_name("checkpoints")
                    .join(format!("member-{i}-of-3")),
            )
            .unwrap()
        })
        .max()
        .unwrap();
    // New ids continue after the old members' final checkpoints.
    let mut two = start_members(&config, 2, &["--rescale-from", "3"], base);
    produce(&kafka.bootstrap, 11_000, 3_000);
    wait_exact(&config, &two);
    // A member restarted with the same arguments resumes its own line, which is now
    // newer than the old members' final checkpoints (SIGKILL: no final checkpoint).
    let mut restarted = two.remove(1);
    sigkill(&mut restarted.child);
    let mut restarted = MemberProcess::start(&config, 1, 2, &["--rescale-from", "3"]);
    let before = newest_complete(&restarted.line).unwrap();
    restarted.wait_for_checkpoint_after(before);
    let log = std::fs::read_to_string(&restarted.log).unwrap();
    let restoring = log
        .lines()
        .find(|l| l.contains(" restoring "))
        .unwrap_or_else(|| panic!("a restore:\n{}", restarted.log_text()));
    assert!(
        restoring.contains("member-1-of-2/chk-") && restoring.contains("parts=1"),
        "restored from its own line: {restoring}"
    );
    assert!(!log.contains("rescaling"), "not rescaled again:\n{log}");
    two.push(restarted);
    produce(&kafka.bootstrap, 14_000, 2_000);
    wait_exact(&config, &two);
    for m in two {
        m.stop();
    }
    assert_final_shares(&config, 2);

    // 2 -> 4.
    let base = (0..2)
        .map(|i| {
            newest_complete(
                &config
                    .with_file_name("checkpoints")
                    .join(format!("member-{i}-of-2")),
            )
            .unwrap()
        })
        .max()
        .unwrap();
    let four = start_members(&config, 4, &["--rescale-from", "2"], base);
    produce(&kafka.bootstrap, 16_000, 4_000);
    wait_exact(&config, &four);
    for m in four {
        m.stop();
    }
    let shares = assert_final_shares(&config, 4);
    assert!(shares.iter().all(|s| !s.is_empty()), "{shares:?}");
}

#[test]
fn a_rescale_is_refused_when_a_member_was_killed_instead_of_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    let (kafka, _es, config) = servers(tmp.path());
    produce(&kafka.bootstrap, 0, 2_000);
    let mut two = start_members(&config, 2, &[], 0);
    let mut killed = two.pop().unwrap();
    sigkill(&mut killed.child);
    two.pop().unwrap().stop();

    let run = |args: &[&str]| run_once(&config, args);
    let (code, err) = run(&["--member", "0", "--members", "3", "--rescale-from", "2"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("member-1-of-2") && err.contains("is not a final one"),
        "{err}"
    );
    // Without --rescale-from, a new layout must not start over while the old one
    // holds checkpoints.
    let (code, err) = run(&["--member", "0", "--members", "3"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("start with --rescale-from 2"), "{err}");
    // Nor may the job start as one process.
    let (code, err) = run(&[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("start with --rescale-from 2"), "{err}");
    // The refusals wrote nothing: no new line was started.
    let lines: Vec<String> = std::fs::read_dir(config.with_file_name("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("member-"))
        .collect();
    let mut lines = lines;
    lines.sort();
    assert_eq!(lines, vec!["member-0-of-2", "member-1-of-2"]);
}

#[test]
fn members_refuse_keyed_state_unless_co_partitioned_and_bad_member_arguments() {
    let tmp = tempfile::tempdir().unwrap();
    // Nothing listens here: each refusal comes before the job touches a server.
    let config = job(tmp.path(), "127.0.0.1:1", "http://127.0.0.1:1", false);
    let run = |args: &[&str]| run_once(&config, args);
    let (code, err) = run(&["--member", "0", "--members", "2"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("job.toml: job.co_partitioned:") && err.contains("rolling_sum"),
        "{err}"
    );
    let (code, err) = run(&["--member", "2", "--members", "2"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--member 2 is not below --members 2"), "{err}");
    let (code, err) = run(&["--members", "2"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--members needs --member"), "{err}");
    let (code, err) = run(&["--member", "1"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--members"), "{err}");
    assert!(
        !config.with_file_name("checkpoints").exists(),
        "a refused start creates no checkpoint directory"
    );
}

#[test]
fn the_external_version_guard_still_sees_every_partition_of_a_co_partitioned_job() {
    // Document ids by field, external versions (offsets): a document written from two
    // partitions must fail the job, co_partitioned or not. The guard's state is about
    // the document across partitions, so it must not be scoped by partition.
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("orders", 2)]);
    let es = Es::testkit();
    let text = format!(
        "[job]\nname = \"guard\"\nco_partitioned = true\n\n\
         [checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 200\n\n[restart]\nstrategy = \"none\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\n\n\
         [sink.elasticsearch]\nurl = \"{}\"\nindex = \"orders\"\nid = \"field:/order\"\nversioning = \"external\"\n",
        kafka.bootstrap,
        es.url()
    );
    let config = tmp.path().join("job.toml");
    std::fs::write(&config, text).unwrap();
    common::kafka::produce_raw(&kafka.bootstrap, "orders", 0, &[br#"{"order":"o-1"}"#]);
    common::kafka::produce_raw(&kafka.bootstrap, "orders", 1, &[br#"{"order":"o-1"}"#]);
    let (code, err) = run_once(&config, &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("document \"o-1\" is written by orders/"),
        "{}",
        tail(&err, 20)
    );
}

/// The version guard sees only its own member's partitions: one document in two
/// topics owned by two members made both exit 0, the later record's 409 counted as
/// already written. Such a job is refused before it starts.
#[test]
fn external_versions_over_two_topics_as_members_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let text = "[job]\nname = \"guard\"\nco_partitioned = true\n\n\
         [checkpoint]\ndir = \"checkpoints\"\n\n\
         [source.kafka]\nbootstrap_servers = \"127.0.0.1:1\"\ntopics = [\"orders-eu\", \"orders-us\"]\n\n\
         [sink.elasticsearch]\nurl = \"http://127.0.0.1:1\"\nindex = \"orders\"\nid = \"key\"\nversioning = \"external\"\n";
    let config = tmp.path().join("job.toml");
    std::fs::write(&config, text).unwrap();
    for m in 0..2 {
        let (code, err) = run_once(&config, &["--member", &m.to_string(), "--members", "2"]);
        assert_eq!(code, Some(2), "{err}");
        assert!(
            err.contains("job.co_partitioned:")
                && err.contains("source.kafka.topics names 2 topics"),
            "{err}"
        );
    }
    assert!(!tmp.path().join("checkpoints").exists());
}

/// Two topics keyed by the same users, read co-partitioned: keyed state kept per
/// partition would give each user one total per topic (each a partial sum, exit 0).
/// Refused at load, before any server is touched, whichever way the topics are named
/// and whether the job runs as one process or as members.
#[test]
fn co_partitioned_refuses_a_source_of_several_topics() {
    let tmp = tempfile::tempdir().unwrap();
    let config = job(tmp.path(), "127.0.0.1:1", "http://127.0.0.1:1", true);
    let text = std::fs::read_to_string(&config).unwrap();
    let cases = [
        (
            "topic_pattern = \"orders-.*\"",
            "source.kafka.topic_pattern `orders-.*` can match several topics",
        ),
        (
            "topics = [\"orders-eu\", \"orders-us\"]",
            "source.kafka.topics names 2 topics",
        ),
    ];
    for (topics, says) in cases {
        let path = tmp.path().join("several.toml");
        std::fs::write(&path, text.replace("topics = [\"orders\"]", topics)).unwrap();
        for args in [&[][..], &["--member", "0", "--members", "2"][..]] {
            let (code, err) = run_once(&path, args);
            assert_eq!(code, Some(2), "{topics} {args:?}: {err}");
            assert!(
                err.contains("several.toml: job.co_partitioned:") && err.contains(says),
                "{err}"
            );
            assert!(err.contains("repartition stage"), "{err}");
        }
    }
    assert!(!tmp.path().join("checkpoints").exists());
}

#[test]
fn a_rescale_is_refused_while_an_old_member_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let (kafka, _es, config) = servers(tmp.path());
    produce(&kafka.bootstrap, 0, 1_000);
    for m in start_members(&config, 2, &[], 0) {
        m.stop();
    }
    // Member 0 of 2 is started again, with checkpoints a minute apart: its newest
    // checkpoint stays the final one while it runs.
    let slow = config.with_file_name("slow.toml");
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("interval_ms = 200", "interval_ms = 60000");
    std::fs::write(&slow, text).unwrap();
    let running = MemberProcess::start(&slow, 0, 2, &[]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&running.log)
        .unwrap_or_default()
        .contains(" restoring ")
    {
        assert!(Instant::now() < deadline, "{}", running.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
    let (code, err) = run_once(
        &config,
        &["--member", "0", "--members", "3", "--rescale-from", "2"],
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("member 0 of 2 still runs"), "{err}");
    running.stop();
}
