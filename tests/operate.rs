//! Operating a running job through real processes (`lockgate run` against the
//! embedded Kafka process, into the exactly-once file sink): the control API (stop
//! with a final checkpoint, pause and resume, a checkpoint now, its token, off by
//! default) and `lockgate checkpoints alter` (skipping a record the job fails on).

mod common;

use common::kafka::{
    assert_partitions_exact, committed_output, produce, produce_raw, write_job, KafkaProcess,
};
use common::telemetry::{get, url_from_log, Scrape};
use common::wait::{self, DEADLINE};
use common::{bin, lockgate, signal, tail, wait_timeout};
use serde_json::Value;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "t0ken-of-the-operate-tests";

/// `lockgate run` of `dir/job.toml`, its log appended to `dir/run.log`.
fn spawn(dir: &Path, extra: &[&str]) -> Child {
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("run.log"))
        .unwrap();
    Command::new(bin())
        .arg("run")
        .arg("--config")
        .arg(dir.join("job.toml"))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// SIGTERM, then exit 0 (after the final checkpoint).
fn stop_with_sigterm(child: &mut Child, dir: &Path) {
    signal(child, libc::SIGTERM);
    assert_eq!(
        wait_timeout(child, DEADLINE).code(),
        Some(0),
        "{}",
        log(dir)
    );
}

fn log(dir: &Path) -> String {
    tail(
        &std::fs::read_to_string(dir.join("run.log")).unwrap_or_default(),
        40,
    )
}

/// A Kafka -> file job of `topic` with the listener on a free port and `control`
/// appended (a `[control]` section, or nothing).
fn job(dir: &Path, bootstrap: &str, topic: &str, parallelism: u16, control: &str) {
    write_job(
        dir,
        bootstrap,
        parallelism,
        &format!("topics = [\"{topic}\"]"),
        "",
    );
    let mut text = std::fs::read_to_string(dir.join("job.toml")).unwrap();
    text.push_str(&format!(
        "\n[metrics]\nlisten = \"127.0.0.1:0\"\n\n{control}\n"
    ));
    std::fs::write(dir.join("job.toml"), text).unwrap();
}

/// `POST base + path` with the bearer `token`: (status, JSON body).
fn post(base: &str, path: &str, token: Option<&str>) -> (u16, Value) {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let mut r = client.post(format!("{base}{path}"));
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    let r = r.send().unwrap();
    let status = r.status().as_u16();
    let text = r.text().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// `GET base + path` with `Authorization: Bearer TOKEN` and `Host: host` (the
/// listener's own address when `None`): (status, body).
fn get_as(base: &str, path: &str, token: Option<&str>, host: Option<&str>) -> (u16, String) {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut r = client.get(format!("{base}{path}"));
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    if let Some(h) = host {
        r = r.header("host", h);
    }
    let r = r.send().unwrap();
    (r.status().as_u16(), r.text().unwrap_or_default())
}

/// `GET base + path` with the tests' token (answered alike without one configured), as
/// JSON, which must answer 200.
fn api_json(base: &str, path: &str) -> Value {
    let (status, body) = get_as(base, path, Some(TOKEN), None);
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

/// Records committed per partition of the output.
fn committed(dir: &Path) -> Vec<usize> {
    let out = dir.join("out");
    if !out.exists() {
        return Vec::new();
    }
    committed_output(&out).values().map(Vec::len).collect()
}

fn wait_committed(child: &mut Child, dir: &Path, want: &[usize]) {
    wait::while_running(
        child,
        &dir.join("run.log"),
        &format!("{want:?} records committed"),
        DEADLINE,
        || committed(dir) == want,
    );
}

fn completed_checkpoints(base: &str) -> u64 {
    api_json(base, "/api/v1/checkpoints")["counts"]["completed"]
        .as_u64()
        .unwrap()
}

fn newest_checkpoint(dir: &Path) -> PathBuf {
    let root = dir.join("checkpoints");
    let mut chks: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("_metadata").exists())
        .collect();
    chks.sort();
    chks.pop().expect("a complete checkpoint")
}

#[test]
fn stop_pause_resume_and_a_checkpoint_now_through_the_control_api() {
    let kafka = KafkaProcess::start(&[("orders", 2)]);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("token"), format!("{TOKEN}\n")).unwrap();
    job(
        dir,
        &kafka.bootstrap,
        "orders",
        2,
        "[control]\nenabled = true\ntoken_file = \"token\"",
    );
    produce(&kafka.bootstrap, "orders", 2, 0, 1000);
    let mut child = spawn(dir, &[]);
    let base = url_from_log(&dir.join("run.log"));

    // A missing or wrong token is refused, and does nothing.
    for token in [None, Some("wrong"), Some("")] {
        for path in [
            "/api/v1/job/stop",
            "/api/v1/job/pause",
            "/api/v1/checkpoints",
        ] {
            let (status, body) = post(&base, path, token);
            assert_eq!(status, 401, "{path} with {token:?}: {body}");
        }
    }
    wait_committed(&mut child, dir, &[1000, 1000]);
    assert!(
        child.try_wait().unwrap().is_none(),
        "still running after the refused stops"
    );

    // Paused: the source holds its position for 10 s while checkpoints go on.
    let (status, body) = post(&base, "/api/v1/job/pause", Some(TOKEN));
    assert_eq!(
        (status, body["paused"].as_bool()),
        (200, Some(true)),
        "{body}"
    );
    wait::until("the job to say paused", DEADLINE, || {
        api_json(&base, "/api/v1/job")["state"] == "paused"
    });
    // Still ready (a paused job stays reachable through a Service), and it says paused.
    let (status, ready) = get(&base, "/readyz").unwrap();
    assert_eq!(status, 200, "{ready}");
    assert!(ready.contains("paused"), "{ready}");
    produce(&kafka.bootstrap, "orders", 2, 1000, 1000);
    let before = completed_checkpoints(&base);
    let paused_at = Instant::now();
    while paused_at.elapsed() < Duration::from_secs(10) {
        assert_eq!(
            committed(dir),
            vec![1000, 1000],
            "nothing read while paused"
        );
        for p in api_json(&base, "/api/v1/partitions").as_array().unwrap() {
            assert_eq!(p["position"], 1000, "{p}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let during = completed_checkpoints(&base) - before;
    assert!(
        during >= 10,
        "checkpoints go on while paused: {during} in 10 s"
    );
    assert!(child.try_wait().unwrap().is_none());

    let (status, body) = post(&base, "/api/v1/job/resume", Some(TOKEN));
    assert_eq!(
        (status, body["changed"].as_bool()),
        (200, Some(true)),
        "{body}"
    );
    wait_committed(&mut child, dir, &[2000, 2000]);
    assert_eq!(api_json(&base, "/api/v1/job")["state"], "running");
    assert_eq!(get(&base, "/readyz").unwrap(), (200, "ready\n".to_string()));

    // A checkpoint now: its id, once it is published.
    // The newest checkpoint at the request, completed or in progress: the answer is
    // one triggered after it.
    let last = api_json(&base, "/api/v1/checkpoints")["history"][0]["id"]
        .as_u64()
        .unwrap();
    let (status, body) = post(&base, "/api/v1/checkpoints", Some(TOKEN));
    assert_eq!(status, 200, "{body}");
    let id = body["id"].as_u64().unwrap();
    assert!(
        id > last,
        "a checkpoint triggered after the request: {id} after {last}"
    );
    let path = PathBuf::from(body["path"].as_str().unwrap());
    assert!(path.join("_metadata").is_file(), "{body}");
    assert_eq!(
        lockgate::state::CheckpointMetadata::read(&path)
            .unwrap()
            .id
            .0,
        id
    );

    // Stop: a final checkpoint, then exit 0.
    let (status, body) = post(&base, "/api/v1/job/stop", Some(TOKEN));
    assert_eq!(status, 202, "{body}");
    let exit = wait_timeout(&mut child, DEADLINE);
    assert_eq!(exit.code(), Some(0), "{}", log(dir));
    let last = newest_checkpoint(dir);
    let meta = lockgate::state::CheckpointMetadata::read(&last).unwrap();
    assert!(meta.is_final, "{}: not final", last.display());
    assert!(
        meta.positions.iter().all(|p| p.next.0 == 2000),
        "{:?}",
        meta.positions
    );

    // The restart reads only what came after the final checkpoint.
    produce(&kafka.bootstrap, "orders", 2, 2000, 500);
    // A log of its own, so that the listener's address read is the new process's.
    std::fs::rename(dir.join("run.log"), dir.join("first-run.log")).unwrap();
    let mut child = spawn(dir, &[]);
    let base = url_from_log(&dir.join("run.log"));
    wait_committed(&mut child, dir, &[2500, 2500]);
    let read = Scrape::take(&base).sum("lockgate_records_out_total", &[("operator", "source")]);
    assert_eq!(
        read, 1000.0,
        "the restarted job read only the 2 x 500 new records"
    );
    stop_with_sigterm(&mut child, dir);
    assert_partitions_exact(&dir.join("out"), "orders", 2, 0, 2500);
}

/// The listener's reading paths are guarded as its control paths are: with a token
/// configured, job state, checkpoints, partitions, sink and operators answer only
/// with the token (the probes, /metrics and the page's file without); without one,
/// every path but /metrics and the page's file answers only requests addressed to an
/// IP address or localhost (DNS rebinding), the control API on or off.
#[test]
fn reading_the_job_takes_the_token_and_the_host_check() {
    let kafka = KafkaProcess::start(&[("orders", 1), ("events", 1)]);
    let api = [
        "/api/v1/job",
        "/api/v1/checkpoints",
        "/api/v1/partitions",
        "/api/v1/sink",
        "/api/v1/operators",
    ];
    // A token configured.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("token"), format!("{TOKEN}\n")).unwrap();
    job(
        dir,
        &kafka.bootstrap,
        "orders",
        1,
        "[control]\nenabled = true\ntoken_file = \"token\"",
    );
    produce(&kafka.bootstrap, "orders", 1, 0, 10);
    let mut child = spawn(dir, &[]);
    let base = url_from_log(&dir.join("run.log"));
    wait_committed(&mut child, dir, &[10]);
    for path in api {
        for (token, host) in [
            (None, None),
            (Some("wrong"), None),
            (None, Some("rebound.example:9464")),
        ] {
            let (status, body) = get_as(&base, path, token, host);
            assert_eq!(status, 401, "{path} {token:?} {host:?}: {body}");
            assert!(!body.contains("orders"), "{path}: {body}");
        }
        assert_eq!(get_as(&base, path, Some(TOKEN), None).0, 200, "{path}");
        // The token is what a rebinding page cannot have: with it, any host name.
        assert_eq!(
            get_as(&base, path, Some(TOKEN), Some("lockgate.internal:9464")).0,
            200,
            "{path}"
        );
    }
    for path in ["/healthz", "/readyz", "/metrics", "/"] {
        assert_eq!(get_as(&base, path, None, None).0, 200, "{path}");
    }
    assert_eq!(
        get_as(&base, "/readyz", None, Some("rebound.example")).0,
        403
    );
    assert_eq!(
        get_as(&base, "/metrics", None, Some("rebound.example")).0,
        200
    );
    stop_with_sigterm(&mut child, dir);

    // No token, the control API off: the host check on every path but /metrics and
    // the page's file.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    job(dir, &kafka.bootstrap, "events", 1, "");
    produce(&kafka.bootstrap, "events", 1, 0, 10);
    let mut child = spawn(dir, &[]);
    let base = url_from_log(&dir.join("run.log"));
    wait_committed(&mut child, dir, &[10]);
    let port = base.rsplit(':').next().unwrap().to_string();
    for path in api.iter().chain(&["/healthz", "/readyz"]) {
        let (status, body) = get_as(&base, path, None, Some(&format!("rebound.example:{port}")));
        assert_eq!(status, 403, "{path}: {body}");
        assert!(body.contains("DNS rebinding"), "{path}: {body}");
        for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
            assert_eq!(
                get_as(&base, path, None, Some(&host)).0,
                200,
                "{path} {host}"
            );
        }
    }
    for path in ["/metrics", "/"] {
        assert_eq!(
            get_as(&base, path, None, Some("rebound.example")).0,
            200,
            "{path}"
        );
    }
    stop_with_sigterm(&mut child, dir);
}

#[test]
fn the_control_api_is_off_by_default_and_its_settings_are_checked_at_load() {
    let kafka = KafkaProcess::start(&[("events", 1)]);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    job(dir, &kafka.bootstrap, "events", 1, "");
    produce(&kafka.bootstrap, "events", 1, 0, 100);
    let mut child = spawn(dir, &[]);
    let base = url_from_log(&dir.join("run.log"));
    wait_committed(&mut child, dir, &[100]);
    for path in [
        "/api/v1/job/stop",
        "/api/v1/job/pause",
        "/api/v1/checkpoints",
    ] {
        let (status, body) = post(&base, path, Some(TOKEN));
        assert_eq!(status, 404, "{path}: {body}");
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .contains("[control] enabled = true"),
            "{body}"
        );
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(child.try_wait().unwrap().is_none(), "the job runs on");
    assert_eq!(api_json(&base, "/api/v1/job")["state"], "running");
    stop_with_sigterm(&mut child, dir);

    // Refused at load, naming the file and the key.
    let cfg = dir.join("job.toml").display().to_string();
    let text = std::fs::read_to_string(dir.join("job.toml")).unwrap();
    std::fs::write(dir.join("empty-token"), "\n").unwrap();
    for (changed, key) in [
        (
            text.replace("[metrics]\nlisten = \"127.0.0.1:0\"\n", "")
                + "[control]\nenabled = true\n",
            "control.enabled",
        ),
        (
            text.clone() + "[control]\nenabled = true\ntoken_file = \"absent\"\n",
            "control.token_file",
        ),
        (
            text.clone() + "[control]\nenabled = true\ntoken_file = \"empty-token\"\n",
            "control.token_file",
        ),
        (
            text.clone() + "[control]\nenable = true\n",
            "control.enable",
        ),
    ] {
        std::fs::write(dir.join("job.toml"), changed).unwrap();
        let out = Command::new(bin())
            .args(["run", "--config", &cfg])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{key}: {err}");
        assert!(err.contains(&cfg) && err.contains(key), "{key}: {err}");
    }
}

#[test]
fn a_record_the_job_fails_on_is_skipped_by_an_altered_checkpoint_and_nothing_else_is() {
    let kafka = KafkaProcess::start(&[("payments", 1)]);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    job(dir, &kafka.bootstrap, "payments", 1, "");
    let cfg = dir.join("job.toml").display().to_string();
    // 500 records, all read and checkpointed, then one that is not JSON, then 500 more.
    produce(&kafka.bootstrap, "payments", 1, 0, 500);
    let mut child = spawn(dir, &[]);
    wait_committed(&mut child, dir, &[500]);
    produce_raw(&kafka.bootstrap, "payments", 0, &[b"{not json"]);
    produce(&kafka.bootstrap, "payments", 1, 500, 500);
    // The job fails on it, restart after restart, and gives up.
    let exit = wait_timeout(&mut child, DEADLINE);
    assert_eq!(exit.code(), Some(1), "{}", log(dir));
    assert!(
        log(dir).contains("payments/0@500"),
        "the failure names the record: {}",
        log(dir)
    );
    // And again when started again: it fails forever.
    let again = wait_timeout(&mut spawn(dir, &[]), DEADLINE);
    assert_eq!(again.code(), Some(1));
    assert_eq!(committed(dir), vec![500]);

    let chk = newest_checkpoint(dir);
    let chk_s = chk.display().to_string();
    let original = std::fs::read(chk.join("_metadata")).unwrap();
    let meta = lockgate::state::CheckpointMetadata::read(&chk).unwrap();
    assert_eq!(
        meta.positions[0].next.0, 500,
        "the checkpoint stands at the bad record"
    );
    let out_dir = dir.join("altered").display().to_string();

    // Beyond the partition's end (1001: 500 + 1 + 500 records), or not held: refused.
    for (set, says) in [
        ("payments:0=1002", "beyond the partition's end (1001"),
        ("payments:3=1", "holds no position of payments:3"),
        ("payments=1", "is not TOPIC:PARTITION=OFFSET"),
    ] {
        let (code, _, err) = lockgate(&[
            "checkpoints",
            "alter",
            &chk_s,
            "--set-offset",
            set,
            "--out",
            &out_dir,
            "--config",
            &cfg,
        ]);
        assert_eq!(code, Some(2), "{set}: {err}");
        assert!(err.contains(says), "{set}: {err}");
        assert!(!dir.join("altered").join(chk.file_name().unwrap()).exists());
    }

    let (code, out, err) = lockgate(&[
        "checkpoints",
        "alter",
        &chk_s,
        "--set-offset",
        "payments:0=501",
        "--out",
        &out_dir,
        "--config",
        &cfg,
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("payments:0 500 -> 501: skips 1 record (offsets 500..=500)"),
        "{out}"
    );
    let altered = dir.join("altered").join(chk.file_name().unwrap());
    assert_eq!(
        std::fs::read(chk.join("_metadata")).unwrap(),
        original,
        "the original is untouched"
    );
    let (code, inspected, _) =
        lockgate(&["checkpoints", "inspect", &altered.display().to_string()]);
    assert_eq!(code, Some(0), "{inspected}");
    assert!(inspected.contains("status:      verified"), "{inspected}");
    let row = inspected
        .lines()
        .find(|l| l.trim_start().starts_with("payments"))
        .unwrap();
    assert_eq!(row.split_whitespace().nth(2), Some("501"), "{row}");

    // From the altered checkpoint the job runs on; every other record exactly once.
    let mut child = spawn(dir, &["--restore", &altered.display().to_string()]);
    wait_committed(&mut child, dir, &[1000]);
    stop_with_sigterm(&mut child, dir);
    assert_partitions_exact(&dir.join("out"), "payments", 1, 0, 1000);
}
