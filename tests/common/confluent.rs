//! Confluent's serializers as independent producers (`tests/confluent/produce.py` in a
//! virtual environment with `tests/confluent/requirements.txt`), and the Schema
//! Registry test server in its own process (so that a test can stop it).

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The Python of the environment with Confluent's serializers:
/// `LOCKGATE_CONFLUENT_PYTHON`, or a virtual environment created once under the target
/// directory from the pinned requirements.
pub fn python() -> PathBuf {
    super::venv_python(
        "LOCKGATE_CONFLUENT_PYTHON",
        "confluent-venv",
        "tests/confluent/requirements.txt",
        "confluent-kafka",
    )
}

/// Runs `produce.py` with `args`; returns what it printed.
pub fn script(args: &[&str]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/confluent/produce.py");
    let out = Command::new(python())
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "produce.py {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Produces records `from..from+count` of `format` (value schema version 1) with
/// Confluent's serializers, record i to partition i % `partitions`.
pub fn produce(
    bootstrap: &str,
    registry: &str,
    topic: &str,
    format: &str,
    from: usize,
    count: usize,
    partitions: i32,
) {
    let printed = script(&[
        "--bootstrap",
        bootstrap,
        "--registry",
        registry,
        "--topic",
        topic,
        "--format",
        format,
        "--from",
        &from.to_string(),
        "--count",
        &count.to_string(),
        "--partitions",
        &partitions.to_string(),
    ]);
    assert_eq!(printed, count.to_string());
}

/// `lockgate testkit schema-registry` in its own process.
pub struct RegistryProcess {
    child: Child,
    pub url: String,
}

impl RegistryProcess {
    /// Starts the registry on `listen` (port 0: a free one).
    pub fn start_on(listen: &str) -> RegistryProcess {
        RegistryProcess::start_kept(listen, None)
    }

    /// Starts the registry on `listen` keeping its registrations in `state` (a restart
    /// on the same file serves the same schemas, as a registry restarted on its
    /// `_schemas` topic does).
    pub fn start_kept(listen: &str, state: Option<&std::path::Path>) -> RegistryProcess {
        let mut command = Command::new(super::bin());
        command.args(["testkit", "schema-registry", "--listen", listen]);
        if let Some(state) = state {
            command.arg("--state").arg(state);
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line.trim().to_string();
        assert!(url.starts_with("http://"), "registry printed {url:?}");
        let start = Instant::now();
        while reqwest::blocking::get(format!("{url}/subjects")).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "registry did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        RegistryProcess { child, url }
    }

    /// Its `host:port`.
    pub fn addr(&self) -> &str {
        self.url.trim_start_matches("http://")
    }

    /// How many schema lookups by id it answered.
    pub fn lookups_by_id(&self) -> u64 {
        let v: serde_json::Value = reqwest::blocking::get(format!("{}/_lockgate/stats", self.url))
            .unwrap()
            .json()
            .unwrap();
        v["lookups_by_id"].as_u64().unwrap()
    }

    /// Stops it: what it held is gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RegistryProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
