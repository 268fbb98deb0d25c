//! The status page in a real browser: a Kafka -> rolling_sum -> Elasticsearch job runs
//! with `[metrics] listen`, headless Chromium renders `/`, and the rendered DOM must
//! agree with the REST API.
//!
//! Chromium is required (`.ci/run` installs Debian's `chromium`): without it the test
//! fails, it does not skip.

mod common;

use common::es::Es;
use common::kafka::{produce, KafkaProcess};
use common::wait::{self, DEADLINE};
use common::{bin, tail, wait_timeout};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const TOPIC: &str = "orders";
const PARTITIONS: i32 = 3;
const JOB: &str = "orders-to-es";

/// The browser: `$LOCKGATE_CHROMIUM`, else `chromium` or `chromium-headless-shell` on
/// the `PATH`.
fn browser() -> PathBuf {
    if let Some(p) = std::env::var_os("LOCKGATE_CHROMIUM") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "LOCKGATE_CHROMIUM={} is not a file: install Debian's `chromium` \
             (apt-get install chromium) or point it at a headless Chromium",
            p.display()
        );
        return p;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for name in ["chromium", "chromium-headless-shell"] {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!(
        "this test needs a headless Chromium: install Debian's `chromium` \
         (apt-get install chromium), or set LOCKGATE_CHROMIUM to the browser's path"
    );
}

/// Runs the browser on `url` with `args` and returns its stdout.
fn chromium(args: &[&str], url: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut out = Command::new(browser())
        .args([
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--no-first-run",
            "--hide-scrollbars",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the browser");
    // Read both pipes beside the wait, so that a full pipe cannot stall the browser,
    // and a hung browser fails the test instead of hanging it.
    let mut stdout = out.stdout.take().unwrap();
    let mut stderr = out.stderr.take().unwrap();
    let read_out = std::thread::spawn(move || {
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut b).unwrap();
        b
    });
    let read_err = std::thread::spawn(move || {
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut stderr, &mut b).unwrap();
        b
    });
    let status = wait_timeout(&mut out, DEADLINE);
    let (stdout, stderr) = (read_out.join().unwrap(), read_err.join().unwrap());
    assert!(
        status.success(),
        "the browser failed ({status}): {}",
        String::from_utf8_lossy(&stderr)
    );
    String::from_utf8(stdout).unwrap()
}

/// The attributes of every `<tr>` of `dom` that has attribute `name`, and its value.
fn rows_with<'a>(dom: &'a str, name: &str) -> Vec<(&'a str, String)> {
    let needle = format!("{name}=\"");
    dom.split("<tr")
        .skip(1)
        .filter_map(|rest| {
            let tag = &rest[..rest.find('>')?];
            let start = tag.find(&needle)? + needle.len();
            let value = &tag[start..start + tag[start..].find('"')?];
            Some((tag, value.to_string()))
        })
        .collect()
}

/// The start tag of the element with `id`.
fn tag_of<'a>(dom: &'a str, id: &str) -> &'a str {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no element #{id} in the page"));
    let start = dom[..at].rfind('<').unwrap();
    &dom[start..at + dom[at..].find('>').unwrap()]
}

/// The text of the element with `id` (up to its first child tag).
fn text_of<'a>(dom: &'a str, id: &str) -> &'a str {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no element #{id} in the page"));
    let rest = &dom[at..];
    let start = rest.find('>').unwrap() + 1;
    &rest[start..start + rest[start..].find('<').unwrap()]
}

fn get(url: &str) -> (u16, String) {
    match reqwest::blocking::Client::new()
        .get(url)
        .timeout(Duration::from_secs(10))
        .send()
    {
        Ok(r) => (r.status().as_u16(), r.text().unwrap_or_default()),
        Err(_) => (0, String::new()),
    }
}

fn api(base: &str, path: &str) -> Value {
    let (status, body) = get(&format!("{base}{path}"));
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

fn write_job(dir: &Path, bootstrap: &str, es: &str) {
    let text = format!(
        "[job]\nname = \"{JOB}\"\nparallelism = 2\n\n\
         [checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 1000\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [metrics]\nlisten = \"127.0.0.1:0\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"{TOPIC}\"]\ngroup_id = \"page\"\n\n\
         [[transform]]\ntype = \"rolling_sum\"\nkey = \"/p\"\nfield = \"/i\"\noutput = \"/total\"\n\n\
         [sink.elasticsearch]\nurl = \"{es}\"\nindex = \"{TOPIC}\"\nbulk_flush_interval_ms = 100\n"
    );
    std::fs::write(dir.join("job.toml"), text).unwrap();
}

fn spawn(dir: &Path) -> Child {
    let log = std::fs::File::create(dir.join("run.log")).unwrap();
    Command::new(bin())
        .args(["run", "--config"])
        .arg(dir.join("job.toml"))
        .env("LOCKGATE_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// Where the screenshot goes: cargo's scratch directory for integration tests, under
/// the target directory.
fn screenshot_path() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("status-page.png")
}

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_status_page_in_a_real_browser_shows_the_job_its_checkpoints_and_one_row_per_partition() {
    // Fails at once, before anything starts, when the browser is missing.
    browser();
    let kafka = KafkaProcess::start(&[(TOPIC, PARTITIONS)]);
    let es = Es::testkit();
    produce(&kafka.bootstrap, TOPIC, PARTITIONS, 0, 2_000);
    let tmp = tempfile::tempdir().unwrap();
    write_job(tmp.path(), &kafka.bootstrap, &es.url());
    let log = tmp.path().join("run.log");
    let mut job = Kill(spawn(tmp.path()));
    // The listener binds a free port (`listen = "127.0.0.1:0"`) and logs it. `/readyz`
    // before the first checkpoint is tested in `tests/observability.rs`.
    let base = common::telemetry::url_from_log(&log);
    assert_eq!(get(&format!("{base}/healthz")).0, 200);

    // Ready once a checkpoint completed; then a few more, for the history.
    wait::while_running(&mut job.0, &log, "/readyz 200", DEADLINE, || {
        get(&format!("{base}/readyz")).0 == 200
    });
    let completed = |v: &Value| -> Vec<u64> {
        v["history"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["status"] == "completed")
            .map(|c| c["id"].as_u64().unwrap())
            .collect()
    };
    wait::while_running(&mut job.0, &log, "three checkpoints", DEADLINE, || {
        completed(&api(&base, "/api/v1/checkpoints")).len() >= 3
    });
    // The source reports its partitions once they are assigned.
    wait::while_running(
        &mut job.0,
        &log,
        "/api/v1/partitions to list every partition of the topic",
        DEADLINE,
        || api(&base, "/api/v1/partitions").as_array().unwrap().len() == PARTITIONS as usize,
    );

    let dom = chromium(&["--dump-dom"], &format!("{base}/"));
    let checkpoints = api(&base, "/api/v1/checkpoints");
    let partitions = api(&base, "/api/v1/partitions");

    assert_eq!(text_of(&dom, "job-name"), JOB, "the job's name");
    assert_eq!(text_of(&dom, "job-state"), "running");
    assert!(
        tag_of(&dom, "error").contains(" hidden"),
        "the error banner stays hidden when every fetch succeeds:\n{dom}"
    );

    let api_completed = completed(&checkpoints);
    let page_completed: Vec<u64> = rows_with(&dom, "data-checkpoint-id")
        .into_iter()
        .filter(|(tag, _)| tag.contains("data-status=\"completed\""))
        .map(|(_, id)| id.parse().unwrap())
        .collect();
    assert!(
        page_completed.iter().any(|id| api_completed.contains(id)),
        "a completed checkpoint of the page ({page_completed:?}) is one the REST API \
         reports completed ({api_completed:?})"
    );

    let mut api_rows: Vec<String> = partitions
        .as_array()
        .unwrap()
        .iter()
        .map(|p| format!("{}/{}", p["topic"].as_str().unwrap(), p["partition"]))
        .collect();
    let mut page_rows: Vec<String> = rows_with(&dom, "data-partition")
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    api_rows.sort();
    page_rows.sort();
    assert!(
        !api_rows.is_empty(),
        "the job reads partitions: {partitions}"
    );
    assert_eq!(page_rows, api_rows, "one row per partition of the REST API");

    let sinks = api(&base, "/api/v1/sink");
    let mut api_sinks: Vec<String> = sinks
        .as_array()
        .unwrap()
        .iter()
        .map(|s| format!("{}/{}", s["operator"].as_str().unwrap(), s["subtask"]))
        .collect();
    let mut page_sinks: Vec<String> = rows_with(&dom, "data-sink")
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(api_sinks.len(), 2, "one sink per subtask: {sinks}");
    api_sinks.sort();
    page_sinks.sort();
    assert_eq!(
        page_sinks, api_sinks,
        "one row per sink subtask of the REST API"
    );

    // The screenshot, for a person to look at, taken while records flow so that it
    // shows throughput and lag.
    let png = screenshot_path();
    let _ = std::fs::remove_file(&png);
    let flowing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let producer = {
        let (bootstrap, flowing) = (kafka.bootstrap.clone(), flowing.clone());
        std::thread::spawn(move || {
            let mut from = 2_000;
            while flowing.load(std::sync::atomic::Ordering::Relaxed) {
                produce(&bootstrap, TOPIC, PARTITIONS, from, 300);
                from += 300;
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let read = || -> u64 {
        api(&base, "/api/v1/operators")
            .as_array()
            .unwrap()
            .iter()
            .filter(|o| o["operator"] == "source")
            .map(|o| o["records_out"].as_u64().unwrap())
            .sum()
    };
    let before = read();
    wait::while_running(&mut job.0, &log, "new records", DEADLINE, || {
        read() > before
    });
    chromium(
        &[
            &format!("--screenshot={}", png.display()),
            "--window-size=1280,1400",
        ],
        &format!("{base}/"),
    );
    flowing.store(false, std::sync::atomic::Ordering::Relaxed);
    producer.join().unwrap();
    let image = std::fs::read(&png).unwrap_or_else(|e| panic!("{}: {e}", png.display()));
    assert!(image.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG file");
    assert!(
        image.len() > 20_000,
        "a rendered page, not a blank one: {} bytes",
        image.len()
    );
    eprintln!("screenshot of the status page: {}", png.display());

    // The job is still running: the page watched it, it did not stop it.
    assert!(
        wait::running(&mut job.0),
        "{}",
        tail(&std::fs::read_to_string(&log).unwrap(), 30)
    );
    common::signal(&job.0, libc::SIGTERM);
    assert!(
        wait_timeout(&mut job.0, DEADLINE).success(),
        "{}",
        tail(&std::fs::read_to_string(&log).unwrap(), 30)
    );
    drop(kafka);
}
