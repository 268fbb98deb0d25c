//! AWS Signature Version 4 (`aws_sigv4`), checked against botocore (AWS's Python SDK,
//! an independent implementation): lockgate's signatures equal botocore's for the
//! requests the sink sends, and jobs run through a proxy that verifies every request's
//! signature with botocore before it reaches the Elasticsearch-API test server
//! (`tests/sigv4/verify_proxy.py`), for Amazon OpenSearch Service (`es`) and
//! Serverless (`aoss`); a wrong secret is refused; credentials from a
//! `credential_process` that expire every few seconds are fetched again before any
//! request is signed with an expired one. botocore comes from the test virtual
//! environment that also holds moto (`LOCKGATE_MOTO_BIN`).

mod common;

use base64::Engine;
use common::es::Es;
use common::kafka::KafkaProcess;
use common::{bin, tail, wait_timeout};
use lockgate::clients::sigv4::sign_request;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, SystemTime};

const REGION: &str = "eu-west-1";
const SECRET: &str = "sEcReT-8c1f2e-never-printed";

/// The Python of the virtual environment holding botocore.
fn python() -> PathBuf {
    lockgate::testkit::moto::moto_binary()
        .expect("moto's virtual environment (botocore)")
        .with_file_name("python")
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/sigv4")
        .join(name)
}

/// What botocore signs for the request: its `authorization` header.
fn botocore_authorization(
    service: &str,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    token: Option<&str>,
    amz_date: &str,
) -> String {
    let input = json!({
        "method": method, "url": url,
        "headers": headers.iter().map(|(n, v)| json!([n, v])).collect::<Vec<_>>(),
        "body_base64": base64::engine::general_purpose::STANDARD.encode(body),
        "region": REGION, "service": service,
        "access_key_id": "AKIDLOCKGATE", "secret_access_key": SECRET,
        "session_token": token, "amz_date": amz_date,
    });
    let mut child = Command::new(python())
        .arg(script("sign.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "sign.py failed");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["authorization"].as_str().unwrap().to_string()
}

/// Service, method, URL, headers, body, session token.
type Case<'a> = (
    &'a str,
    &'a str,
    &'a str,
    Vec<(&'a str, &'a str)>,
    Vec<u8>,
    Option<&'a str>,
);

#[test]
fn lockgate_signs_what_botocore_signs() {
    use lockgate::clients::sigv4::body_as_sent;
    // 2026-03-07T09:05:02Z
    let time = SystemTime::UNIX_EPOCH + Duration::from_secs(1_772_874_302);
    let bulk =
        b"{\"index\":{\"_index\":\"orders\",\"_id\":\"orders-0-1\"}}\n{\"a\":\"\xc3\xa9\"}\n";
    let gzipped = body_as_sent(bulk, true).unwrap();
    let cases: Vec<Case> = vec![
        (
            "es",
            "POST",
            "https://search-orders.eu-west-1.es.amazonaws.com/_bulk?filter_path=errors%2Citems.*.status%2Citems.*.error",
            vec![("content-type", "application/json")],
            bulk.to_vec(),
            None,
        ),
        (
            "es",
            "POST",
            "https://search-orders.eu-west-1.es.amazonaws.com/prefix/_bulk",
            vec![("content-type", "application/json"), ("content-encoding", "gzip")],
            gzipped,
            Some("FQoGZXIvYXdzEBYaDtoken"),
        ),
        (
            "aoss",
            "PUT",
            "https://abc123.eu-west-1.aoss.amazonaws.com/_index_template/orders",
            vec![("content-type", "application/json")],
            br#"{"index_patterns":["orders-*"]}"#.to_vec(),
            Some("IQoJb3JpZ2luX2VjEtoken"),
        ),
        (
            "aoss",
            "GET",
            "https://abc123.eu-west-1.aoss.amazonaws.com/orders%20x/_count",
            vec![("content-type", "application/json")],
            Vec::new(),
            None,
        ),
    ];
    for (service, method, url, headers, body, token) in cases {
        let creds = aws_credential_types::Credentials::new(
            "AKIDLOCKGATE",
            SECRET,
            token.map(String::from),
            None,
            "test",
        );
        let ours =
            sign_request(&creds, REGION, service, method, url, &headers, &body, time).unwrap();
        let get = |n: &str| {
            ours.iter()
                .find(|h| h.name == n)
                .map(|h| h.value.clone())
                .unwrap()
        };
        // botocore signs x-amz-content-sha256 when it is among the headers given.
        let sha = get("x-amz-content-sha256");
        let mut theirs_headers = headers.clone();
        theirs_headers.push(("x-amz-content-sha256", &sha));
        let theirs = botocore_authorization(
            service,
            method,
            url,
            &theirs_headers,
            &body,
            token,
            &get("x-amz-date"),
        );
        assert_eq!(get("authorization"), theirs, "{service} {method} {url}");
    }
}

/// `verify_proxy.py` in front of `upstream`, accepting the keys of its credentials file.
struct Proxy {
    child: Child,
    _stdin: ChildStdin,
    url: String,
}

impl Proxy {
    fn start(upstream: &str, service: &str, credentials: &Path) -> Proxy {
        let mut child = Command::new(python())
            .arg(script("verify_proxy.py"))
            .args([
                "--upstream",
                upstream,
                "--region",
                REGION,
                "--service",
                service,
            ])
            .arg("--credentials")
            .arg(credentials)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("the proxy said {line:?}"))
            .to_string();
        Proxy {
            child,
            _stdin: stdin,
            url,
        }
    }

    fn stats(&self) -> Value {
        reqwest::blocking::get(format!("{}/_sigv4/stats", self.url))
            .unwrap()
            .json()
            .unwrap()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write_keys(path: &Path, keys: &Value) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, keys.to_string()).unwrap();
    std::fs::rename(tmp, path).unwrap();
}

fn job(dir: &Path, bootstrap: &str, url: &str, service: &str, extra: &str) -> PathBuf {
    let text = format!(
        "[job]\nname = \"sigv4\"\nparallelism = 1\n\n[checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 500\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\n\n\
         [sink.elasticsearch]\nurl = \"{url}\"\nindex = \"orders\"\nbulk_flush_interval_ms = 100\nretry_max_attempts = 3\n\
         aws_sigv4 = {{ region = \"{REGION}\", service = \"{service}\" }}\n{extra}\n"
    );
    let p = dir.join("job.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// Runs the job with `env` (and no AWS configuration of the machine's own).
fn run(job: &Path, env: &[(&str, String)]) -> (Option<i32>, String) {
    let dir = job.parent().unwrap();
    let log = dir.join("job.log");
    let mut child = Command::new(bin())
        .args(["run", "--config"])
        .arg(job)
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("AWS_PROFILE")
        .env("AWS_CONFIG_FILE", dir.join("no-aws-config"))
        .env(
            "AWS_SHARED_CREDENTIALS_FILE",
            dir.join("no-aws-credentials"),
        )
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::options().append(true).open(&log).unwrap())
        .spawn()
        .unwrap();
    let status = wait_timeout(&mut child, common::wait::DEADLINE);
    (status.code(), std::fs::read_to_string(&log).unwrap())
}

#[test]
fn jobs_through_a_verifying_proxy_are_signed_for_es_and_aoss_and_a_wrong_secret_is_refused() {
    let kafka = KafkaProcess::start(&[("orders", 1)]);
    lockgate::testkit::kafka::produce_orders(&kafka.bootstrap, "orders", 0, 2_000, 50).unwrap();
    for (service, token, extra) in [
        ("es", None, "compression = \"gzip\""),
        (
            "aoss",
            Some("IQoJb3JpZ2luX2VjEtoken-never-printed"),
            "index_template_file = \"orders.json\"",
        ),
    ] {
        let es = Es::testkit();
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("orders.json"),
            r#"{"index_patterns":["orders*"],"template":{"mappings":{"properties":{"amount":{"type":"long"}}}}}"#,
        )
        .unwrap();
        let keys = tmp.path().join("keys.json");
        write_keys(
            &keys,
            &json!([{"access_key_id": "AKIDLOCKGATE", "secret_access_key": SECRET, "session_token": token, "not_after": null}]),
        );
        let proxy = Proxy::start(&es.url(), service, &keys);
        let config = job(tmp.path(), &kafka.bootstrap, &proxy.url, service, extra);
        let mut env = vec![
            ("AWS_ACCESS_KEY_ID", "AKIDLOCKGATE".to_string()),
            ("AWS_SECRET_ACCESS_KEY", SECRET.to_string()),
        ];
        if let Some(t) = token {
            env.push(("AWS_SESSION_TOKEN", t.to_string()));
        }
        let (code, log) = run(&config, &env);
        assert_eq!(code, Some(0), "{service}: {}", tail(&log, 30));
        assert_eq!(es.count("orders"), 2_000, "{service}");
        let stats = proxy.stats();
        assert_eq!(stats["refused"], 0, "{service}: {stats}");
        assert!(
            stats["accepted"].as_u64().unwrap() >= 2,
            "{service}: {stats}"
        );
        assert!(
            !log.contains(SECRET),
            "{service}: the secret is never logged"
        );
        if let Some(t) = token {
            assert!(!log.contains(t), "{service}: the token is never logged");
            let (_, v) = es.call("GET", "/_index_template/orders", None);
            assert!(
                v["index_templates"][0]["name"] == "orders",
                "signed template put: {v}"
            );
        }

        // The same job with a wrong secret: the proxy refuses every request (403), and
        // the job fails at once naming the refusal.
        let again = tmp.path().join("wrong");
        std::fs::create_dir(&again).unwrap();
        std::fs::copy(tmp.path().join("orders.json"), again.join("orders.json")).unwrap();
        let config = job(&again, &kafka.bootstrap, &proxy.url, service, extra);
        env[1].1 = "not-the-secret".into();
        let (code, log) = run(&config, &env);
        assert_eq!(code, Some(1), "{service}: {}", tail(&log, 30));
        assert!(
            log.contains("403") && log.contains("signature"),
            "{service}: {}",
            tail(&log, 30)
        );
        assert!(proxy.stats()["refused"].as_u64().unwrap() >= 1);
    }
}

#[test]
fn expiring_credentials_are_fetched_again_before_a_request_is_refused() {
    let kafka = KafkaProcess::start(&[("orders", 1)]);
    // A batch per second for about 30 s: longer than a credential's life.
    lockgate::testkit::kafka::produce_orders(&kafka.bootstrap, "orders", 0, 30_000, 50).unwrap();
    let es = Es::testkit();
    let tmp = tempfile::tempdir().unwrap();
    let keys = tmp.path().join("keys.json");
    write_keys(&keys, &json!([]));
    // credential_process: a new key valid for 20 s at each call, which the proxy accepts
    // until then (AWS's format: Version 1, Expiration in RFC 3339).
    let process = tmp.path().join("issue_key.py");
    std::fs::write(
        &process,
        format!(
            r#"import json, os, sys, time, datetime
keys = {keys:?}
issued = json.load(open(keys))
n = len(issued) + 1
not_after = time.time() + 20
key = {{"access_key_id": "AKIDROTATED%04d" % n, "secret_access_key": "rotated-secret-%d" % n,
       "session_token": "token-%d" % n, "not_after": not_after}}
issued.append(key)
tmp = keys + ".tmp"
json.dump(issued, open(tmp, "w"))
os.rename(tmp, keys)
expiration = datetime.datetime.fromtimestamp(not_after, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
print(json.dumps({{"Version": 1, "AccessKeyId": key["access_key_id"], "SecretAccessKey": key["secret_access_key"],
                  "SessionToken": key["session_token"], "Expiration": expiration}}))
"#,
            keys = keys.to_str().unwrap()
        ),
    )
    .unwrap();
    let aws_config = tmp.path().join("aws-config");
    std::fs::write(
        &aws_config,
        format!(
            "[default]\ncredential_process = {} {}\n",
            python().display(),
            process.display()
        ),
    )
    .unwrap();
    let proxy = Proxy::start(&es.url(), "es", &keys);
    let config = job(tmp.path(), &kafka.bootstrap, &proxy.url, "es", "");
    let (code, log) = run(
        &config,
        &[
            ("AWS_CONFIG_FILE", aws_config.display().to_string()),
            (
                "LOCKGATE_FAILPOINTS",
                "source-batch=sleep(1000)".to_string(),
            ),
        ],
    );
    assert_eq!(code, Some(0), "{}", tail(&log, 30));
    assert_eq!(es.count("orders"), 30_000);
    let stats = proxy.stats();
    assert_eq!(
        stats["refused"], 0,
        "no request was signed with an expired key: {stats}"
    );
    let used = stats["keys_used"].as_object().unwrap().len();
    assert!(
        used >= 2,
        "the key was fetched again as it expired: {stats}"
    );
    assert!(!log.contains("rotated-secret"), "secrets are never logged");
}

#[test]
fn lockgate_chaos_signs_its_reads_through_the_verifying_proxy() {
    let kafka = KafkaProcess::start(&[("orders", 1)]);
    lockgate::testkit::kafka::produce_orders(&kafka.bootstrap, "orders", 0, 20_000, 50).unwrap();
    let es = Es::testkit();
    let tmp = tempfile::tempdir().unwrap();
    let keys = tmp.path().join("keys.json");
    write_keys(
        &keys,
        &json!([{"access_key_id": "AKIDLOCKGATE", "secret_access_key": SECRET, "session_token": null, "not_after": null}]),
    );
    let proxy = Proxy::start(&es.url(), "es", &keys);
    let config = job(tmp.path(), &kafka.bootstrap, &proxy.url, "es", "");
    let report = tmp.path().join("report.json");
    let mut child = Command::new(bin())
        .arg("chaos")
        .arg("--config")
        .arg(&config)
        .arg("--report")
        .arg(&report)
        .args([
            "--kills",
            "3",
            "--seed",
            "7",
            "--failpoints",
            "source-batch=sleep(300)",
            "--failpoint-runs",
            "3",
            "--kill-after-ms",
            "300..900",
        ])
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_SESSION_TOKEN")
        .env("AWS_CONFIG_FILE", tmp.path().join("no-aws-config"))
        .env(
            "AWS_SHARED_CREDENTIALS_FILE",
            tmp.path().join("no-aws-credentials"),
        )
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_ACCESS_KEY_ID", "AKIDLOCKGATE")
        .env("AWS_SECRET_ACCESS_KEY", SECRET)
        .stdout(std::fs::File::create(tmp.path().join("chaos.out")).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let status = wait_timeout(&mut child, Duration::from_secs(600));
    let out = std::fs::read_to_string(tmp.path().join("chaos.out")).unwrap();
    assert_eq!(status.code(), Some(0), "{out}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(r["kills"], 3, "{out}");
    assert_eq!(r["verdict"]["documents"], 20_000, "{out}");
    for k in ["missing", "duplicated", "wrong"] {
        assert_eq!(r["verdict"][k], 0, "{k}: {out}");
    }
    let stats = proxy.stats();
    assert_eq!(
        stats["refused"], 0,
        "the verifier's reads were signed too: {stats}"
    );
    assert!(!out.contains(SECRET));
}
