//! Real clusters: the Elasticsearch sink over TLS with credentials, several nodes with
//! failover, a refused password, and secrets that never reach an output. Every server
//! is `lockgate testkit es` in its own process, on a free loopback port.

mod common;

use common::es::EsProcess;
use common::kafka::KafkaProcess;
use common::{bin, wait_timeout};
use lockgate::connectors::elasticsearch::Auth;
use lockgate::secret::Secret;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The password of the secured servers; no output may ever contain it.
const PASSWORD: &str = "Pw-7d41c0e9-never-printed";
const API_KEY: &str = "lockgate-key:Key-5f3a2b19-never-printed";

fn basic() -> Auth {
    Auth::Basic {
        username: "writer".into(),
        password: Secret::new(PASSWORD),
    }
}

/// A bounded `kafka -> elasticsearch` job with coordinate ids; `sink` holds the
/// connection keys.
fn kafka_job(dir: &Path, bootstrap: &str, parallelism: u16, sink: &str) -> PathBuf {
    let text = format!(
        "[job]\nname = \"secure\"\nparallelism = {parallelism}\n\n[checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 200\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\n\n\
         [sink.elasticsearch]\nindex = \"orders\"\nid = \"coordinates\"\nbulk_flush_interval_ms = 100\nretry_initial_ms = 20\nretry_max_ms = 500\nretry_max_attempts = 1000\n{sink}\n"
    );
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join("job.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// Runs `lockgate chaos` with 20 kills; returns its exit code, stdout, stderr and report.
fn chaos_20_kills(
    config: &Path,
    env: &[(&str, &str)],
    extra: &[&str],
) -> (Option<i32>, String, String, Value) {
    let dir = config.parent().unwrap();
    let report = dir.join("report.json");
    let mut child = Command::new(bin())
        .arg("chaos")
        .arg("--config")
        .arg(config)
        .arg("--report")
        .arg(&report)
        .args([
            "--kills",
            "20",
            "--seed",
            "12",
            // One source subtask, a batch (at most 1024 records) per 500 ms, a kill
            // at most 900 ms after each start: 20 runs hand over at most 40 batches
            // (40,960 records) of the 50,000, so the job cannot finish before its 20th
            // kill. The run after the last kill is not throttled.
            "--failpoints",
            "source-batch=sleep(500)",
            "--failpoint-runs",
            "20",
            "--kill-after-ms",
            "300..900",
        ])
        .args(extra)
        .envs(env.iter().copied())
        .env("LOCKGATE_LOG", "debug")
        .stdout(std::fs::File::create(dir.join("chaos.out")).unwrap())
        .stderr(std::fs::File::create(dir.join("chaos.err")).unwrap())
        .spawn()
        .unwrap();
    let status = wait_timeout(&mut child, Duration::from_secs(600));
    let out = std::fs::read_to_string(dir.join("chaos.out")).unwrap();
    let err = std::fs::read_to_string(dir.join("chaos.err")).unwrap();
    let r = std::fs::read_to_string(&report)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    (status.code(), out, err, r)
}

fn assert_exactly_once_after_20_kills(code: Option<i32>, out: &str, r: &Value) {
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(r["kills"], 20, "{out}");
    assert_eq!(r["verdict"]["inputs"], 50_000, "{out}");
    assert_eq!(r["verdict"]["documents"], 50_000, "{out}");
    for k in ["missing", "duplicated", "wrong"] {
        assert_eq!(r["verdict"][k], 0, "{k}: {out}");
    }
}

/// Every file under `dir` (recursively) as text, lossily.
fn all_text_under(dir: &Path) -> String {
    let mut s = String::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return s;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            s.push_str(&all_text_under(&p));
        } else if let Ok(bytes) = std::fs::read(&p) {
            s.push_str(&String::from_utf8_lossy(&bytes));
        }
    }
    s
}

/// `lockgate checkpoints inspect` of every complete checkpoint of `dir`.
fn inspect_all(checkpoints: &Path) -> String {
    let mut s = String::new();
    let mut n = 0;
    for e in std::fs::read_dir(checkpoints).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with("chk-") && !name.ends_with(".inprogress") {
            let o = Command::new(bin())
                .args(["checkpoints", "inspect"])
                .arg(e.path())
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            s.push_str(&String::from_utf8_lossy(&o.stdout));
            s.push_str(&String::from_utf8_lossy(&o.stderr));
            n += 1;
        }
    }
    assert!(
        n > 0,
        "no checkpoint to inspect in {}",
        checkpoints.display()
    );
    s
}

/// A test server over TLS that needs basic authentication as `writer` with
/// [`PASSWORD`], in `dir/es`; the test's own client authenticates that way.
fn tls_basic_auth_es(dir: &std::path::Path) -> EsProcess {
    EsProcess::start(
        &dir.join("es"),
        true,
        &["--basic-auth", &format!("writer:{PASSWORD}")],
        Some(basic()),
    )
}

fn assert_no_secret(what: &str, text: &str, secrets: &[&str]) {
    assert!(!text.is_empty(), "{what} is empty: nothing was checked");
    for s in secrets {
        assert!(!text.contains(s), "{what} contains a secret");
    }
}

#[test]
fn chaos_over_tls_with_basic_auth_is_exactly_once_and_never_prints_the_password() {
    let tmp = tempfile::tempdir().unwrap();
    let es = tls_basic_auth_es(tmp.path());
    assert!(es.url.starts_with("https://"), "{}", es.url);
    let kafka = KafkaProcess::start(&[("orders", 4)]);
    lockgate::testkit::kafka::produce_orders(&kafka.bootstrap, "orders", 0, 50_000, 500).unwrap();
    let sink = format!(
        "urls = [\"{}\"]\nusername = \"writer\"\npassword = \"${{LOCKGATE_TEST_ES_PASSWORD}}\"\nca_cert = \"{}\"\ntls_verify = \"full\"",
        es.url,
        es.ca_cert.as_ref().unwrap().display()
    );
    let job = tmp.path().join("job");
    let config = kafka_job(&job, &kafka.bootstrap, 1, &sink);
    let (code, out, err, r) =
        chaos_20_kills(&config, &[("LOCKGATE_TEST_ES_PASSWORD", PASSWORD)], &[]);
    assert_exactly_once_after_20_kills(code, &out, &r);
    // Every request of the job and of the verifier carried the credentials.
    assert_eq!(es.stats()["unauthorized_requests"], 0);
    assert!(es.stats()["bulk_requests"].as_u64().unwrap() > 0);

    // The password grep: stdout, stderr, the runs' log, the report, every file the
    // job wrote, and `checkpoints inspect`.
    let secrets = [PASSWORD];
    assert_no_secret("chaos stdout", &out, &secrets);
    assert_no_secret("chaos stderr and the runs' debug logs", &err, &secrets);
    assert_no_secret(
        "the report",
        &std::fs::read_to_string(job.join("report.json")).unwrap(),
        &secrets,
    );
    assert_no_secret("the job's directory", &all_text_under(&job), &secrets);
    assert_no_secret(
        "checkpoints inspect",
        &inspect_all(&job.join("checkpoints")),
        &secrets,
    );
}

#[test]
fn chaos_with_an_api_key_gzip_and_es_faults_is_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let es = EsProcess::start(
        &tmp.path().join("es"),
        false,
        &["--api-key", API_KEY],
        Some(Auth::ApiKey(Secret::new(API_KEY))),
    );
    let kafka = KafkaProcess::start(&[("orders", 4)]);
    lockgate::testkit::kafka::produce_orders(&kafka.bootstrap, "orders", 0, 50_000, 500).unwrap();
    let job = tmp.path().join("job");
    std::fs::create_dir_all(&job).unwrap();
    // The key from a file, as a Kubernetes secret is mounted (with its newline).
    std::fs::write(job.join("api-key"), format!("{API_KEY}\n")).unwrap();
    let sink = format!(
        "url = \"{}\"\napi_key_file = \"api-key\"\ncompression = \"gzip\"\nheaders = {{ \"x-opaque-id\" = \"lockgate-test\" }}",
        es.url
    );
    let config = kafka_job(&job, &kafka.bootstrap, 1, &sink);
    // The harness's fault controls reach the secured server with the job's key too.
    let (code, out, err, r) = chaos_20_kills(&config, &[], &["--es-faults"]);
    assert_exactly_once_after_20_kills(code, &out, &r);
    assert!(
        !r["network_faults"].as_array().unwrap().is_empty(),
        "fault phases fired: {out}"
    );
    let stats = es.stats();
    assert_eq!(stats["unauthorized_requests"], 0);
    assert!(
        stats["gzip_requests"].as_u64().unwrap() >= stats["bulk_requests"].as_u64().unwrap(),
        "every bulk request was compressed: {stats}"
    );
    let secrets = [API_KEY, API_KEY.split(':').nth(1).unwrap()];
    assert_no_secret("chaos stdout", &out, &secrets);
    assert_no_secret("chaos stderr", &err, &secrets);
    assert_no_secret(
        "checkpoints inspect",
        &inspect_all(&job.join("checkpoints")),
        &secrets,
    );
}

/// A `sequence -> elasticsearch` job (coordinate ids) writing `to` records at `rate`/s.
fn sequence_job(dir: &Path, to: i64, rate: u64, restart: &str, sink: &str) -> PathBuf {
    let text = format!(
        "[job]\nname = \"nodes\"\nparallelism = 2\n\n[checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 200\n\n\
         [restart]\n{restart}\n\n\
         [source.sequence]\nfrom = 1\nto = {to}\nkeys = 100\nrate_per_sec = {rate}\n\n\
         [sink.elasticsearch]\nindex = \"seq\"\nid = \"coordinates\"\nbulk_flush_interval_ms = 50\nbulk_max_actions = 100\nretry_initial_ms = 20\nretry_max_ms = 200\n{sink}\n"
    );
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join("job.toml");
    std::fs::write(&p, text).unwrap();
    p
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < common::wait::DEADLINE,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Two nodes in `urls`; one is stopped mid-run (SIGKILL, after it applied writes and
/// while requests to it are in flight). The job completes, and every record is a
/// document on a node that acknowledged it.
///
/// The two test servers are separate stores (not one cluster), so the proof is: the
/// documents node A held when it died, together with node B's, are exactly the
/// expected set with the right content; node A is stalled before it is read and killed,
/// so its snapshot is everything it ever applied, and the requests it held are lost with
/// it and must be written again to B.
#[test]
fn a_node_stopped_mid_run_fails_over_to_the_other() {
    let tmp = tempfile::tempdir().unwrap();
    let mut a = EsProcess::start(&tmp.path().join("es-a"), false, &[], None);
    let b = EsProcess::start(&tmp.path().join("es-b"), false, &[], None);
    let to = 6000;
    let job = tmp.path().join("job");
    let config = sequence_job(
        &job,
        to,
        600,
        "strategy = \"none\"",
        &format!("urls = [\"{}\", \"{}\"]", a.url, b.url),
    );
    let log = job.join("run.log");
    let mut child = Command::new(bin())
        .args(["run", "--config"])
        .arg(&config)
        .env("LOCKGATE_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let items = |s: &EsProcess| s.stats()["bulk_items"].as_u64().unwrap();
    wait_until("both nodes to receive writes", || {
        items(&a) > 0 && items(&b) > 0
    });
    // Stall A, wait until a request hangs in it, read what it applied, kill it.
    a.call("POST", "/_lockgate/faults", Some(json!({"stall": true})));
    let stalled_at = a.stats()["bulk_requests"].as_u64().unwrap();
    wait_until("a request to stall in node A", || {
        a.stats()["bulk_requests"].as_u64().unwrap() > stalled_at
    });
    let on_a = a.documents("seq");
    a.kill();
    assert!(
        child.try_wait().unwrap().is_none(),
        "the job was still running when node A stopped"
    );
    let status = wait_timeout(&mut child, Duration::from_secs(300));
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(
        status.success(),
        "{status}\n{}",
        common::tail(&log_text, 30)
    );
    let on_b = b.documents("seq");
    assert!(!on_a.is_empty() && !on_b.is_empty());
    let mut union = on_a.clone();
    for (id, doc) in &on_b {
        if let Some(prev) = union.insert(id.clone(), doc.clone()) {
            assert_eq!(&prev, doc, "{id}: the two nodes hold different content");
        }
    }
    let expected: std::collections::BTreeMap<String, Value> = (1..=to)
        .map(|i| {
            (
                common::es::sequence_id(i, 100),
                json!({"seq": i, "key": i % 100, "value": i}),
            )
        })
        .collect();
    let missing: Vec<_> = expected
        .keys()
        .filter(|k| !union.contains_key(*k))
        .take(5)
        .collect();
    let extra: Vec<_> = union
        .keys()
        .filter(|k| !expected.contains_key(*k))
        .take(5)
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing {missing:?}, extra {extra:?}"
    );
    assert_eq!(union, expected);
}

#[test]
fn a_wrong_password_fails_the_job_at_once_naming_the_node() {
    let tmp = tempfile::tempdir().unwrap();
    let es = tls_basic_auth_es(tmp.path());
    let wrong = "Wrong-0b6f-password";
    let job = tmp.path().join("job");
    // The default restart policy (3 in-process restarts) applies: a refusal of the
    // credentials must not use it.
    let config = sequence_job(
        &job,
        100_000,
        0,
        "strategy = \"fixed-delay\"\nattempts = 3\ndelay_ms = 100",
        &format!(
            "url = \"{}\"\nusername = \"writer\"\npassword = \"${{LOCKGATE_TEST_ES_PASSWORD}}\"\nca_cert = \"{}\"",
            es.url,
            es.ca_cert.as_ref().unwrap().display()
        ),
    );
    let out = {
        let mut child = Command::new(bin())
            .args(["run", "--config"])
            .arg(&config)
            .env("LOCKGATE_TEST_ES_PASSWORD", wrong)
            .env("LOCKGATE_LOG", "debug")
            .stdout(std::fs::File::create(job.join("out")).unwrap())
            .stderr(std::fs::File::create(job.join("err")).unwrap())
            .spawn()
            .unwrap();
        let status = wait_timeout(&mut child, Duration::from_secs(120));
        assert_eq!(status.code(), Some(1));
        std::fs::read_to_string(job.join("out")).unwrap()
            + &std::fs::read_to_string(job.join("err")).unwrap()
    };
    let last = out
        .lines()
        .rfind(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line:\n{}", common::tail(&out, 20)));
    assert!(last.contains("authentication failed"), "{last}");
    assert!(last.contains(&es.url), "the error names the node: {last}");
    assert!(!out.contains("restarting"), "no in-process restart:\n{out}");
    // No retry storm: at most the requests in flight when the first 401 came back
    // (2 sink subtasks x max_in_flight 2), and none of them was applied.
    let stats = es.stats();
    let refused = stats["unauthorized_requests"].as_u64().unwrap();
    assert!(
        (1..=4).contains(&refused),
        "{refused} requests refused: {stats}"
    );
    assert_eq!(stats["bulk_requests"], 0, "{stats}");
    assert_no_secret("the run's output", &out, &[wrong, PASSWORD]);
}

#[test]
fn a_password_from_a_file_never_reaches_an_output() {
    let tmp = tempfile::tempdir().unwrap();
    let es = tls_basic_auth_es(tmp.path());
    let job = tmp.path().join("job");
    std::fs::create_dir_all(&job).unwrap();
    let secret_dir = tmp.path().join("secrets");
    std::fs::create_dir_all(&secret_dir).unwrap();
    std::fs::write(secret_dir.join("password"), format!("{PASSWORD}\n")).unwrap();
    let config = sequence_job(
        &job,
        3000,
        0,
        "strategy = \"none\"",
        &format!(
            "urls = [\"{}\"]\nusername = \"writer\"\npassword_file = \"{}\"\nca_cert = \"{}\"",
            es.url,
            secret_dir.join("password").display(),
            es.ca_cert.as_ref().unwrap().display()
        ),
    );
    let o = Command::new(bin())
        .args(["run", "--config"])
        .arg(&config)
        .env("LOCKGATE_LOG", "trace")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{}", common::tail(&stderr, 30));
    assert_eq!(es.documents("seq").len(), 3000);
    assert_no_secret(
        "stdout and stderr (trace logs)",
        &(String::from_utf8_lossy(&o.stdout).to_string() + &stderr),
        &[PASSWORD],
    );
    assert_no_secret("the job's directory", &all_text_under(&job), &[PASSWORD]);
    assert_no_secret(
        "checkpoints inspect",
        &inspect_all(&job.join("checkpoints")),
        &[PASSWORD],
    );
    // The same job with both forms of the password is refused at load, naming both keys.
    let both = std::fs::read_to_string(&config).unwrap().replace(
        "username = \"writer\"",
        "username = \"writer\"\npassword = \"x\"",
    );
    std::fs::write(&config, both).unwrap();
    let (code, err) = common::run_config(&config);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("sink.elasticsearch.password and sink.elasticsearch.password_file"),
        "{err}"
    );
}

#[test]
fn bad_urls_and_unreadable_files_are_refused_at_load_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        (
            "urls = [\"http://127.0.0.1:1\", \"127.0.0.1:2\"]",
            "sink.elasticsearch.urls[1]",
        ),
        (
            "url = \"http://127.0.0.1:1\"\nurls = [\"http://127.0.0.1:1\"]",
            "sink.elasticsearch.url and sink.elasticsearch.urls",
        ),
        (
            "url = \"https://127.0.0.1:1\"\nca_cert = \"absent.pem\"",
            "sink.elasticsearch.ca_cert",
        ),
        (
            "url = \"https://127.0.0.1:1\"\napi_key_file = \"absent\"",
            "sink.elasticsearch.api_key_file",
        ),
    ];
    for (i, (sink, key)) in cases.iter().enumerate() {
        let config = sequence_job(
            &tmp.path().join(format!("j{i}")),
            10,
            0,
            "strategy = \"none\"",
            sink,
        );
        let (code, err) = common::run_config(&config);
        assert_eq!(code, Some(2), "{sink}: {err}");
        assert!(
            err.contains(&format!("{}: {key}:", config.display())),
            "{sink}: {err}"
        );
    }
}

/// The README's production job file loads as written (its CA file and secrets
/// supplied), and means what the README says: three nodes, the API key from the
/// environment, TLS against the CA, gzip, a header.
#[test]
fn the_production_job_file_in_the_readme_loads() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let block = readme
        .split("<!-- production-job -->")
        .nth(1)
        .and_then(|b| b.split("<!-- /production-job -->").next())
        .expect("the production job block");
    let toml = block
        .trim()
        .strip_prefix("```toml")
        .and_then(|b| b.strip_suffix("```"))
        .expect("a toml code block");
    let tmp = tempfile::tempdir().unwrap();
    let ca = tmp.path().join("es-ca.pem");
    std::fs::write(
        &ca,
        lockgate::testkit::es::TestCert::generate().unwrap().ca_pem,
    )
    .unwrap();
    let text = toml.replace("/etc/lockgate/es-ca.pem", ca.to_str().unwrap());
    assert_ne!(text, toml, "the README's job names its CA file");
    let path = tmp.path().join("orders-to-es.toml");
    std::fs::write(&path, &text).unwrap();
    // Only this test reads these variables.
    std::env::set_var("ES_API_KEY", "readme-id:readme-key");
    std::env::set_var("KAFKA_PASSWORD", "readme-kafka-password");
    let d = lockgate::config::describe(&path, &lockgate::builtin::registry())
        .unwrap_or_else(|e| panic!("{e}"));
    let es = d
        .sink_config::<lockgate::connectors::elasticsearch::EsSinkConfig>()
        .unwrap()
        .clone();
    assert_eq!(es.connection.nodes.len(), 3);
    assert_eq!(
        es.connection.auth,
        Some(Auth::ApiKey(Secret::new("readme-id:readme-key")))
    );
    assert!(es.connection.ca_cert.is_some() && es.connection.gzip);
    assert_eq!(
        es.connection.tls_verify,
        lockgate::connectors::elasticsearch::TlsVerify::Full
    );
    assert!(es.connection.headers.contains_key("X-Opaque-Id"));
    let kafka = d
        .source_config::<lockgate::connectors::kafka::KafkaSourceConfig>()
        .unwrap()
        .clone();
    assert_eq!(kafka.properties["security.protocol"], "SASL_SSL");
    assert_eq!(kafka.properties["sasl.password"], "readme-kafka-password");
    // The configuration's Debug output shows neither secret.
    let debug = format!("{es:?}");
    assert!(!debug.contains("readme-key") && !debug.contains("readme-kafka-password"));
}

/// `tls_verify` does what it says against a server whose certificate names
/// `localhost` and `127.0.0.1` but is reached at `127.0.0.2`: `full` refuses it (the
/// name does not match), with or without `ca_cert`; `certificate` accepts it (the chain
/// goes up to `ca_cert`); `none` accepts it and warns.
#[test]
fn tls_verify_modes_are_enforced() {
    let tmp = tempfile::tempdir().unwrap();
    let es = EsProcess::start_on("127.0.0.2:0", &tmp.path().join("es"), true, &[], None);
    assert!(es.url.starts_with("https://127.0.0.2:"), "{}", es.url);
    let ca = es.ca_cert.clone().unwrap();
    let cases = [
        (
            format!("ca_cert = \"{}\"\ntls_verify = \"full\"", ca.display()),
            false,
        ),
        ("tls_verify = \"full\"".to_string(), false),
        (
            format!(
                "ca_cert = \"{}\"\ntls_verify = \"certificate\"",
                ca.display()
            ),
            true,
        ),
        ("tls_verify = \"none\"".to_string(), true),
    ];
    for (i, (tls, accepted)) in cases.iter().enumerate() {
        let dir = tmp.path().join(format!("job{i}"));
        let config = sequence_job(
            &dir,
            200,
            0,
            "strategy = \"none\"",
            &format!("url = \"{}\"\n{tls}\nretry_max_attempts = 2", es.url),
        );
        let (code, err) = common::run_config(&config);
        if *accepted {
            assert_eq!(code, Some(0), "{tls}: {}", common::tail(&err, 20));
        } else {
            assert_eq!(code, Some(1), "{tls}: {}", common::tail(&err, 20));
            let last = err
                .lines()
                .rfind(|l| l.starts_with("error: "))
                .unwrap_or_default();
            assert!(last.contains("certificate"), "the error says why: {last}");
        }
        assert_eq!(
            err.contains("tls_verify = \"none\""),
            tls.contains("none"),
            "{tls}: the warning appears exactly with none"
        );
    }
    // Only the accepted runs wrote: 2 x 200 documents over the same ids.
    assert_eq!(es.documents("seq").len(), 200);
}
