//! `lockgate run` with its checkpoints in an S3-compatible object store (moto's
//! server): the real binary on the embedded Kafka and the Elasticsearch test server,
//! killed with SIGKILL, its local staging directory deleted (a new machine), started
//! again: it restores from the store, and the index is exactly-once.

mod common;

use common::es::Es;
use common::kafka::KafkaProcess;
use common::wait::{self, DEADLINE};
use common::{bin, sigkill, tail, wait_timeout};
use lockgate::testkit::moto::MotoServer;
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A `kafka -> rolling_sum -> elasticsearch` job whose checkpoints live in
/// `s3://<bucket>/orders`; `store_keys` go into `[checkpoint]`.
fn job(dir: &Path, bootstrap: &str, es: &str, bucket: &str, store_keys: &str) -> PathBuf {
    let text = format!(
        "[job]\nname = \"store-test\"\nparallelism = 2\n\n\
         [checkpoint]\ndir = \"s3://{bucket}/jobs/orders\"\nlocal_dir = \"staging\"\ninterval_ms = 200\n{store_keys}\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\n\n\
         [[transform]]\ntype = \"rolling_sum\"\nkey = \"/user\"\nfield = \"/amount\"\noutput = \"/total\"\n\n\
         [sink.elasticsearch]\nurl = \"{es}\"\nindex = \"orders\"\nid = \"coordinates\"\nbulk_flush_interval_ms = 100\n\
         retry_initial_ms = 20\nretry_max_ms = 500\nretry_max_attempts = 1000\n"
    );
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join("job.toml");
    std::fs::write(&p, text).unwrap();
    p
}

fn spawn(config: &Path, env: &[(&str, String)], extra_env: &[(&str, &str)]) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(config.with_file_name("runs.log"))
        .unwrap();
    Command::new(bin())
        .args(["run", "--config"])
        .arg(config)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .envs(extra_env.iter().copied())
        .env("LOCKGATE_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// `lockgate run --config <config> <args>` with the store's environment, appending its
/// log to `runs.log` beside the job file.
fn spawn_args(config: &Path, env: &[(&str, String)], args: &[String]) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(config.with_file_name("runs.log"))
        .unwrap();
    Command::new(bin())
        .args(["run", "--config"])
        .arg(config)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("LOCKGATE_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

fn verify_exact(config: &Path) {
    let t = lockgate::chaos::Target::from_job_file(config).unwrap();
    let inputs = lockgate::chaos::verify::read_inputs(&t).unwrap();
    let v = lockgate::chaos::verify::verify(&t, &inputs).unwrap();
    let log = std::fs::read_to_string(config.with_file_name("runs.log")).unwrap_or_default();
    assert!(v.exact() && v.inputs > 0, "{v:?}\n{}", tail(&log, 40));
}

/// Kills the job `kills` times shortly after a checkpoint, deleting the staging
/// directory after every kill, then lets it finish; every restart restores from the
/// store.
fn kills_with_a_new_staging_directory_each_time(env: &[(&str, String)], store_keys: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let moto = MotoServer::start().unwrap();
    let bucket = "lockgate-run";
    moto.create_bucket(bucket).unwrap();
    let kafka = KafkaProcess::start(&[("orders", 4)]);
    lockgate::testkit::kafka::produce_orders(&kafka.bootstrap, "orders", 0, 30_000, 300).unwrap();
    let es = Es::testkit();
    let store_keys = store_keys.replace("ENDPOINT", moto.endpoint());
    let env: Vec<(&str, String)> = env
        .iter()
        .map(|(k, v)| (*k, v.replace("ENDPOINT", moto.endpoint())))
        .collect();
    std::fs::write(tmp.path().join("store-secret"), "testing\n").unwrap();
    let config = job(tmp.path(), &kafka.bootstrap, &es.url(), bucket, &store_keys);
    let log = config.with_file_name("runs.log");
    let mut rng = rand::rngs::SmallRng::seed_from_u64(common::seed(16));
    // Slow runs, so that each is killed long before its end.
    let slow = [("LOCKGATE_FAILPOINTS", "source-batch=sleep(200)")];
    for kill in 1..=3 {
        let uploaded = wait::count(&log, "checkpoint uploaded to the store");
        let mut child = spawn(&config, &env, &slow);
        wait::while_running(
            &mut child,
            &log,
            &format!("an upload of run {kill}"),
            DEADLINE,
            || wait::count(&log, "checkpoint uploaded to the store") > uploaded + 1,
        );
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..300)));
        assert!(sigkill(&mut child), "run {kill} ended before its kill");
        // A new machine: nothing local survives.
        std::fs::remove_dir_all(tmp.path().join("staging")).unwrap();
    }
    let status = wait_timeout(&mut spawn(&config, &env, &[]), DEADLINE);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{}", tail(&text, 40));
    let restored: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("restoring") && l.contains("checkpoint="))
        .collect();
    assert_eq!(
        restored.len(),
        3,
        "every run after a kill restored: {}",
        tail(&text, 40)
    );
    for l in &restored {
        assert!(
            l.contains("/staging/chk-"),
            "restored into the staging directory: {l}"
        );
    }
    verify_exact(&config);
}

#[test]
fn sigkilled_runs_on_new_machines_restore_from_the_store_exactly_once_with_endpoint_from_the_environment(
) {
    kills_with_a_new_staging_directory_each_time(
        &[
            ("AWS_ENDPOINT_URL", "ENDPOINT".into()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ACCESS_KEY_ID", "testing".into()),
            ("AWS_SECRET_ACCESS_KEY", "testing".into()),
        ],
        "",
    );
}

#[test]
fn sigkilled_runs_on_new_machines_restore_from_the_store_exactly_once_with_endpoint_from_the_job_file(
) {
    // The secret is read from a file (a mounted secret), the key id through `${ENV}`;
    // nothing `AWS_*` is set for the process.
    kills_with_a_new_staging_directory_each_time(
        &[],
        "endpoint = \"ENDPOINT\"\nregion = \"us-east-1\"\nallow_http = true\naccess_key_id = \"${STORE_KEY_ID:-testing}\"\nsecret_access_key_file = \"store-secret\"",
    );
}

#[test]
fn checkpoints_list_and_restore_accept_a_store_url() {
    let tmp = tempfile::tempdir().unwrap();
    let moto = MotoServer::start().unwrap();
    moto.create_bucket("lockgate-cli").unwrap();
    let kafka = KafkaProcess::start(&[("orders", 2)]);
    lockgate::testkit::kafka::produce_orders(&kafka.bootstrap, "orders", 0, 5_000, 100).unwrap();
    let es = Es::testkit();
    let env = moto.env();
    let config = job(tmp.path(), &kafka.bootstrap, &es.url(), "lockgate-cli", "");
    let status = wait_timeout(&mut spawn(&config, &env, &[]), DEADLINE);
    let log = std::fs::read_to_string(config.with_file_name("runs.log")).unwrap();
    assert!(status.success(), "{}", tail(&log, 30));
    let url = "s3://lockgate-cli/jobs/orders";
    let out = Command::new(bin())
        .args(["checkpoints", "list", url])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{listed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let complete: Vec<&str> = listed.lines().filter(|l| l.contains("complete")).collect();
    assert!(!complete.is_empty(), "{listed}");
    let newest = complete
        .last()
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    assert!(newest.starts_with("chk-"), "{listed}");
    // The final checkpoint is listed as final.
    assert!(complete.last().unwrap().contains("true"), "{listed}");

    let out = Command::new(bin())
        .args(["checkpoints", "inspect", &format!("{url}/{newest}")])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    let inspected = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{inspected}");
    assert!(
        inspected.contains(&format!("checkpoint:  {url}/{newest}")),
        "{inspected}"
    );
    assert!(inspected.contains("status:      verified"), "{inspected}");

    // Another job (its own, empty store prefix and staging directory) restores the
    // newest checkpoint by URL: the bounded job is at its end, so it finishes at once
    // and writes nothing again.
    let other = tmp.path().join("other");
    let config2 = job(&other, &kafka.bootstrap, &es.url(), "lockgate-cli", "");
    let text = std::fs::read_to_string(&config2)
        .unwrap()
        .replace("jobs/orders", "jobs/other");
    std::fs::write(&config2, text).unwrap();
    let status = wait_timeout(
        &mut Command::new(bin())
            .args(["run", "--config"])
            .arg(&config2)
            .arg("--restore")
            .arg(format!("{url}/{newest}"))
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("LOCKGATE_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(other.join("runs.log")).unwrap())
            .spawn()
            .unwrap(),
        DEADLINE,
    );
    let log2 = std::fs::read_to_string(other.join("runs.log")).unwrap();
    assert!(status.success(), "{}", tail(&log2, 30));
    assert!(
        log2.lines()
            .any(|l| l.contains("restoring") && l.contains(&format!(".restore/{newest}"))),
        "{}",
        tail(&log2, 30)
    );
    verify_exact(&config);
}

/// The servers and the co-partitioned `kafka -> rolling_sum -> elasticsearch` job of
/// the members tests: `orders` orders on `partitions` partitions, checkpoints in moto's
/// `bucket`, one subtask per member.
fn members_job(
    dir: &Path,
    bucket: &str,
    partitions: i32,
    orders: u64,
) -> (
    MotoServer,
    KafkaProcess,
    Es,
    Vec<(&'static str, String)>,
    PathBuf,
) {
    let moto = MotoServer::start().unwrap();
    moto.create_bucket(bucket).unwrap();
    let kafka = KafkaProcess::start(&[("orders", partitions)]);
    lockgate::testkit::kafka::produce_orders(&kafka.bootstrap, "orders", 0, orders, 100).unwrap();
    let es = Es::testkit();
    let env = moto.env();
    let config = job(dir, &kafka.bootstrap, &es.url(), bucket, "");
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "parallelism = 2\n",
        "parallelism = 1\nco_partitioned = true\n",
    );
    std::fs::write(&config, text).unwrap();
    (moto, kafka, es, env, config)
}

/// Members keep their lines under the store prefix (`member-I-of-N/`); a rescale on a
/// new machine (nothing local) reads every old member's final checkpoint from the store.
#[test]
fn members_keep_their_lines_in_the_store_and_a_rescale_on_a_new_machine_reads_them_there() {
    let tmp = tempfile::tempdir().unwrap();
    let (_moto, _kafka, _es, env, config) = members_job(tmp.path(), "lockgate-members", 4, 8_000);
    let run = |args: &[&str]| {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        spawn_args(&config, &env, &args)
    };
    // Two members run the bounded job to its end, each with a final checkpoint.
    let mut members: Vec<Child> = (0..2)
        .map(|i| run(&["--member", &i.to_string(), "--members", "2"]))
        .collect();
    for m in &mut members {
        let status = wait_timeout(m, DEADLINE);
        let log = std::fs::read_to_string(tmp.path().join("runs.log")).unwrap();
        assert!(status.success(), "{}", tail(&log, 40));
    }
    std::fs::remove_dir_all(tmp.path().join("staging")).unwrap();
    // One process takes both lines' final checkpoints from the store.
    let status = wait_timeout(&mut run(&["--rescale-from", "2"]), DEADLINE);
    let log = std::fs::read_to_string(tmp.path().join("runs.log")).unwrap();
    assert!(status.success(), "{}", tail(&log, 40));
    assert!(log.contains("rescaling"), "{}", tail(&log, 40));
    assert!(
        log.contains("/staging/.rescale/member-"),
        "{}",
        tail(&log, 40)
    );
    verify_exact(&config);
}

/// New members started together on one machine with `--rescale-from` each download the
/// old members' final checkpoints into their own line's directory: before, they shared
/// `<local_dir>/.rescale/` and one start's download removed another's files midway
/// (`No such file or directory`, or a checkpoint reported as not verifying).
#[test]
fn members_rescaled_together_on_one_machine_never_share_a_download() {
    let tmp = tempfile::tempdir().unwrap();
    let (_moto, _kafka, _es, env, config) = members_job(tmp.path(), "lockgate-together", 6, 12_000);
    let log = || std::fs::read_to_string(tmp.path().join("runs.log")).unwrap_or_default();
    let members = |n: u16, rescale: Option<u16>| {
        let mut children: Vec<Child> = (0..n)
            .map(|i| {
                let mut args = vec![
                    "--member".to_string(),
                    i.to_string(),
                    "--members".into(),
                    n.to_string(),
                ];
                if let Some(k) = rescale {
                    args.extend(["--rescale-from".into(), k.to_string()]);
                }
                spawn_args(&config, &env, &args)
            })
            .collect();
        for c in &mut children {
            let status = wait_timeout(c, DEADLINE);
            assert!(status.success(), "{}", tail(&log(), 60));
        }
    };
    // 2 members to their end; then 2 -> 4 and 4 -> 3, each set started at once, all
    // on this machine's staging directory.
    members(2, None);
    members(4, Some(2));
    members(3, Some(4));
    let text = log();
    assert_eq!(text.matches("rescaling").count(), 7, "{}", tail(&text, 60));
    assert!(
        !text.contains("does not verify"),
        "a download was disturbed: {}",
        tail(&text, 60)
    );
    for line in ["member-0-of-4", "member-3-of-4", "member-2-of-3"] {
        assert!(
            text.contains(&format!("/staging/{line}/.rescale/member-")),
            "{line} downloads into its own line: {}",
            tail(&text, 60)
        );
    }
    verify_exact(&config);
}

/// A `sequence -> file` job (`common::JobDir`) whose checkpoints live in
/// `s3://<bucket>/jobs/seq`, its store client pointed at `endpoint` (moto, or a fault
/// proxy in front of it), staging in `<job>/staging`.
fn file_job(root: &Path, endpoint: &str, bucket: &str, restart_attempts: u32) -> common::JobDir {
    let mut spec = common::Spec::new(6_000);
    spec.parallelism = 1;
    spec.rolling_sum = false;
    spec.rate_per_sec = 2_000;
    spec.restart_attempts = restart_attempts;
    let j = common::JobDir::new(root, spec);
    let text = std::fs::read_to_string(j.config()).unwrap().replace(
        "dir = \"checkpoints\"\n",
        &format!(
            "dir = \"s3://{bucket}/jobs/seq\"\nlocal_dir = \"staging\"\nendpoint = \"{endpoint}\"\n\
             region = \"us-east-1\"\nallow_http = true\naccess_key_id = \"testing\"\nsecret_access_key = \"testing\"\n"
        ),
    );
    std::fs::write(j.config(), text).unwrap();
    j
}

/// `_metadata` PUTs of the store, in order.
fn is_metadata_put(r: &lockgate::testkit::fault_proxy::Request) -> bool {
    r.method == "PUT" && r.path().ends_with("/_metadata")
}

/// The second checkpoint's `_metadata` PUT reaches the store, but its answer is lost
/// and from then on the store cannot be reached at all: the job cannot tell whether
/// the checkpoint is complete. It must keep everything the checkpoint references
/// (the file sink's staged part file), so that the next run, with the store back,
/// restores that checkpoint and ends exactly-once. (Before the fix the job abandoned
/// it, the in-process restart deleted its part file, and every later run failed on
/// the missing part.)
#[test]
fn a_metadata_upload_of_unknown_fate_keeps_the_staged_part_file_and_the_next_run_restores_it() {
    use lockgate::testkit::fault_proxy::{Action, FaultProxy};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let tmp = tempfile::tempdir().unwrap();
    let moto = MotoServer::start().unwrap();
    moto.create_bucket("lockgate-unknown").unwrap();
    let puts = Arc::new(AtomicUsize::new(0));
    let outage = Arc::new(AtomicBool::new(false));
    let healed = Arc::new(AtomicBool::new(false));
    let (p, o, h) = (puts.clone(), outage.clone(), healed.clone());
    let proxy = FaultProxy::start(moto.endpoint(), move |r| {
        if h.load(Ordering::SeqCst) {
            return Action::Forward;
        }
        if o.load(Ordering::SeqCst) {
            return Action::Reply(503);
        }
        if is_metadata_put(r) && p.fetch_add(1, Ordering::SeqCst) == 1 {
            o.store(true, Ordering::SeqCst);
            return Action::ForwardThenDrop;
        }
        Action::Forward
    })
    .unwrap();
    let j = file_job(
        &tmp.path().join("job"),
        proxy.endpoint(),
        "lockgate-unknown",
        2,
    );
    let first = j.run_to_end(&[]);
    assert!(outage.load(Ordering::SeqCst), "{}", tail(&j.log_text(), 40));
    assert!(!first.success(), "{}", tail(&j.log_text(), 40));
    healed.store(true, Ordering::SeqCst);
    let second = j.run_to_end(&[]);
    let log = j.log_text();
    assert!(second.success(), "{}", tail(&log, 40));
    assert!(
        log.lines()
            .any(|l| l.contains("restoring") && l.contains("chk-0000000002")),
        "the second run restored the checkpoint whose upload was in doubt: {}",
        tail(&log, 40)
    );
    common::assert_exact(&j);
}

/// The second checkpoint's `_metadata` PUT reaches the store and answers 500, and
/// every later `_metadata` PUT fails, while reads work: the job reads the object back,
/// finds its own bytes and counts the checkpoint as published; a later checkpoint
/// the store does not hold is abandoned. The next run restores the second checkpoint
/// with its part file and ends exactly-once.
#[test]
fn a_metadata_upload_that_landed_but_failed_counts_as_published() {
    use lockgate::testkit::fault_proxy::{Action, FaultProxy};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let tmp = tempfile::tempdir().unwrap();
    let moto = MotoServer::start().unwrap();
    moto.create_bucket("lockgate-landed").unwrap();
    let puts = Arc::new(AtomicUsize::new(0));
    let healed = Arc::new(AtomicBool::new(false));
    let (p, h) = (puts.clone(), healed.clone());
    let proxy = FaultProxy::start(moto.endpoint(), move |r| {
        if h.load(Ordering::SeqCst) || !is_metadata_put(r) {
            return Action::Forward;
        }
        match p.fetch_add(1, Ordering::SeqCst) {
            0 => Action::Forward,
            1 => Action::ForwardThenReply(500),
            _ => Action::Reply(500),
        }
    })
    .unwrap();
    let j = file_job(
        &tmp.path().join("job"),
        proxy.endpoint(),
        "lockgate-landed",
        1,
    );
    let first = j.run_to_end(&[]);
    let log = j.log_text();
    assert!(puts.load(Ordering::SeqCst) > 2, "{}", tail(&log, 40));
    assert!(!first.success(), "{}", tail(&log, 40));
    healed.store(true, Ordering::SeqCst);
    let second = j.run_to_end(&[]);
    assert!(second.success(), "{}", tail(&j.log_text(), 40));
    common::assert_exact(&j);
    assert!(
        log.lines()
            .any(|l| l.contains("checkpoint completed") && l.contains("chk-0000000002")),
        "the first run counted checkpoint 2 as published: {}",
        tail(&log, 40)
    );
}

/// `[sink.file]` with checkpoints in the store, started on a new machine: the
/// restored checkpoint's output is on the old machine's disk. The start fails naming
/// the output directory and what is missing, instead of ending with exit 0 and the
/// output of every earlier checkpoint absent. (The third run restores a checkpoint
/// that names no pending part file: before the fix it exited 0 with an empty output.)
#[test]
fn a_file_sink_job_restored_from_the_store_on_a_new_machine_fails_naming_the_missing_output() {
    let tmp = tempfile::tempdir().unwrap();
    let moto = MotoServer::start().unwrap();
    moto.create_bucket("lockgate-newmachine").unwrap();
    let j = file_job(
        &tmp.path().join("job"),
        moto.endpoint(),
        "lockgate-newmachine",
        0,
    );
    assert!(j.run_to_end(&[]).success(), "{}", tail(&j.log_text(), 40));
    // Again on the same machine: at its end, it takes a final checkpoint whose sink
    // state names no pending part file.
    assert!(j.run_to_end(&[]).success(), "{}", tail(&j.log_text(), 40));
    assert!(j.verify().is_exact());
    // A new machine: neither the staging directory nor the output survives.
    std::fs::remove_dir_all(j.root.join("staging")).unwrap();
    std::fs::remove_dir_all(j.out()).unwrap();
    let before = j.log_text().len();
    let third = j.run_to_end(&[]);
    let log = j.log_text()[before..].to_string();
    assert!(!third.success(), "exit 0 with the output elsewhere: {log}");
    assert!(
        log.contains("part files committed up to checkpoint") && log.contains("/out"),
        "{log}"
    );
}
