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

/// Members keep their lines under the store prefix (`member-I-of-N/`); a rescale on a
/// new machine (nothing local) reads every old member's final checkpoint from the store.
#[test]
fn members_keep_their_lines_in_the_store_and_a_rescale_on_a_new_machine_reads_them_there() {
    let tmp = tempfile::tempdir().unwrap();
    let moto = MotoServer::start().unwrap();
    moto.create_bucket("lockgate-members").unwrap();
    let kafka = KafkaProcess::start(&[("orders", 4)]);
    lockgate::testkit::kafka::produce_orders(&kafka.bootstrap, "orders", 0, 8_000, 100).unwrap();
    let es = Es::testkit();
    let env = moto.env();
    let config = job(
        tmp.path(),
        &kafka.bootstrap,
        &es.url(),
        "lockgate-members",
        "",
    );
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "parallelism = 2\n",
        "parallelism = 1\nco_partitioned = true\n",
    );
    std::fs::write(&config, text).unwrap();
    let run = |args: &[&str]| {
        let mut c = Command::new(bin());
        c.args(["run", "--config"])
            .arg(&config)
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("LOCKGATE_LOG", "info")
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(tmp.path().join("runs.log"))
                    .unwrap(),
            );
        c.spawn().unwrap()
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
    let moto = MotoServer::start().unwrap();
    moto.create_bucket("lockgate-together").unwrap();
    let kafka = KafkaProcess::start(&[("orders", 6)]);
    lockgate::testkit::kafka::produce_orders(&kafka.bootstrap, "orders", 0, 12_000, 100).unwrap();
    let es = Es::testkit();
    let env = moto.env();
    let config = job(
        tmp.path(),
        &kafka.bootstrap,
        &es.url(),
        "lockgate-together",
        "",
    );
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "parallelism = 2\n",
        "parallelism = 1\nco_partitioned = true\n",
    );
    std::fs::write(&config, text).unwrap();
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
                let mut c = Command::new(bin());
                c.args(["run", "--config"])
                    .arg(&config)
                    .args(&args)
                    .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
                    .env("LOCKGATE_LOG", "info")
                    .stdout(Stdio::null())
                    .stderr(
                        std::fs::OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(tmp.path().join("runs.log"))
                            .unwrap(),
                    );
                c.spawn().unwrap()
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
