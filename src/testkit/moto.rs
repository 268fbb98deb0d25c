//! moto's S3-compatible server as the object store of tests, examples and benchmarks:
//! a real HTTP server speaking the S3 protocol, started as a process on a free
//! loopback port and stopped when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `moto_server` binary: `LOCKGATE_MOTO_BIN`, or a virtual environment created once
/// (`pip install "moto[server]"`) under `CARGO_TARGET_DIR` (or the temporary directory).
pub fn moto_binary() -> Result<PathBuf, String> {
    if let Ok(p) = std::env::var("LOCKGATE_MOTO_BIN") {
        return Ok(PathBuf::from(p));
    }
    let base = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let venv = base.join("moto-venv");
    let bin = venv.join("bin/moto_server");
    std::fs::create_dir_all(&base).map_err(|e| format!("{}: {e}", base.display()))?;
    // Several test binaries may get here at once: one installs, the others wait.
    let lock = std::fs::File::create(base.join("moto-venv.lock"))
        .map_err(|e| format!("{}: {e}", base.display()))?;
    // SAFETY: flock on a descriptor we own; released when `lock` is dropped.
    unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) };
    if bin.exists() {
        return Ok(bin);
    }
    let ok = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .is_ok_and(|s| s.success())
        && Command::new(venv.join("bin/pip"))
            .args(["install", "-q", "moto[server]==5.2.5"])
            .status()
            .is_ok_and(|s| s.success());
    if ok && bin.exists() {
        Ok(bin)
    } else {
        Err(
            "cannot install moto[server] from PyPI (set LOCKGATE_MOTO_BIN to a moto_server binary)"
                .into(),
        )
    }
}

/// A running moto server; stopped when dropped, and when the process that started it
/// ends in any way (a server kept in a `static`, which is never dropped, included).
pub struct MotoServer {
    /// A shell that runs the server and stops it once this pipe closes (moto itself
    /// does not watch its standard input).
    child: Child,
    stdin: Option<std::process::ChildStdin>,
    endpoint: String,
}

/// Runs `$0 "$@"` (the server) and stops it when standard input closes; exits with it.
/// (A background command of a non-interactive shell reads `/dev/null` unless told
/// otherwise: the watcher reads the pipe through descriptor 3.)
const WATCH_STDIN: &str = r#"exec 3<&0; "$0" "$@" </dev/null & pid=$!; (cat <&3 >/dev/null; kill $pid 2>/dev/null) & wait $pid"#;

impl MotoServer {
    /// Starts moto on a free loopback port and waits until it answers.
    pub fn start() -> Result<MotoServer, String> {
        let bin = moto_binary()?;
        // One start at a time in this process: two servers started at once on the same
        // released port would both see the winner answer, and the loser's caller would
        // use the other's server, which goes away with its test.
        static STARTING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = STARTING.lock().unwrap_or_else(|e| e.into_inner());
        let mut last = String::new();
        // The free port is found by binding port 0 and releasing it: another process
        // may take it in between, so a server that exits at once is started again.
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map_err(|e| e.to_string())?
                .port();
            let mut child = Command::new("sh")
                .args(["-c", WATCH_STDIN])
                .arg(&bin)
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("{}: {e}", bin.display()))?;
            let stdin = child.stdin.take();
            let endpoint = format!("http://127.0.0.1:{port}");
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(60) {
                if let Ok(Some(status)) = child.try_wait() {
                    last = format!("moto_server exited with {status}");
                    break;
                }
                // The answer must be our server's: it is still running.
                if reqwest::blocking::get(format!("{endpoint}/")).is_ok()
                    && matches!(child.try_wait(), Ok(None))
                {
                    return Ok(MotoServer {
                        child,
                        stdin,
                        endpoint,
                    });
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            drop(stdin);
            let _ = child.wait();
            if last.is_empty() {
                last = "moto_server did not answer within 60 s".into();
            }
        }
        Err(last)
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Creates a bucket (moto accepts unsigned requests).
    pub fn create_bucket(&self, bucket: &str) -> Result<(), String> {
        let r = reqwest::blocking::Client::new()
            .put(format!("{}/{bucket}", self.endpoint))
            .send()
            .map_err(|e| e.to_string())?;
        if r.status().is_success() {
            Ok(())
        } else {
            Err(format!("creating bucket {bucket}: HTTP {}", r.status()))
        }
    }

    /// The environment a client of this server needs (`AWS_ENDPOINT_URL`,
    /// `AWS_ALLOW_HTTP`, a region and test credentials).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ACCESS_KEY_ID", "testing".into()),
            ("AWS_SECRET_ACCESS_KEY", "testing".into()),
        ]
    }

    /// A store location in `bucket` under `prefix` whose client settings point at this
    /// server (without relying on the environment).
    pub fn location(&self, bucket: &str, prefix: &str) -> lockgate_state::store::StoreLocation {
        lockgate_state::store::StoreLocation::parse(&format!("s3://{bucket}/{prefix}"))
            .expect("a valid URL")
            .with_option("aws_endpoint", &self.endpoint)
            .with_option("aws_allow_http", "true")
            .with_option("aws_region", "us-east-1")
            .with_option("aws_access_key_id", "testing")
            .with_option("aws_secret_access_key", "testing")
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        // Closing the pipe stops the server; the shell exits with it.
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}
