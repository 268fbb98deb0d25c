//! Elasticsearch-API servers for tests: the project's test server (in this process,
//! reached over HTTP) and osmem-server (an independent OpenSearch-API server, PyPI
//! `osmem-server==0.1.6`, started as a process on a free port).

use lockgate::testkit::es::EsServer;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Starts a server.
pub type Starter = fn() -> Es;

/// A running server.
pub enum Es {
    Testkit {
        _rt: tokio::runtime::Runtime,
        server: EsServer,
    },
    Osmem {
        child: Child,
        url: String,
    },
}

impl Drop for Es {
    fn drop(&mut self) {
        if let Es::Osmem { child, .. } = self {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The osmem-server binary: `LOCKGATE_OSMEM_BIN`, or a virtual environment created
/// once under the target directory with `pip install osmem-server==0.1.6`.
pub fn osmem_binary() -> PathBuf {
    if let Ok(p) = std::env::var("LOCKGATE_OSMEM_BIN") {
        return PathBuf::from(p);
    }
    let venv = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("osmem-venv");
    let find = || -> Option<PathBuf> {
        let out = Command::new(venv.join("bin/python"))
            .args(["-c", "import osmem_server, os; print(os.path.join(os.path.dirname(osmem_server.__file__), 'bin', 'osmem-server'))"])
            .output()
            .ok()?;
        let p = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
        p.exists().then_some(p)
    };
    // Several test binaries may get here at once: one installs, the others wait.
    std::fs::create_dir_all(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let lock =
        std::fs::File::create(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("osmem-venv.lock"))
            .unwrap();
    // SAFETY: flock on a descriptor we own.
    unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) };
    if let Some(p) = find() {
        return p;
    }
    let ok = Command::new("python3")
        .arg("-m")
        .arg("venv")
        .arg(&venv)
        .status()
        .unwrap()
        .success()
        && Command::new(venv.join("bin/pip"))
            .args(["install", "-q", "osmem-server==0.1.6"])
            .status()
            .unwrap()
            .success();
    assert!(ok, "cannot install osmem-server==0.1.6 from PyPI (set LOCKGATE_OSMEM_BIN to an installed binary)");
    find().expect("osmem-server installed but its binary was not found")
}

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Es {
    /// The project's test server.
    pub fn testkit() -> Es {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let server = rt
            .block_on(EsServer::start("127.0.0.1:0".parse().unwrap()))
            .unwrap();
        Es::Testkit { _rt: rt, server }
    }

    /// osmem-server on a free loopback port.
    pub fn osmem() -> Es {
        let bin = osmem_binary();
        // One start at a time: two servers started at once on the same released port
        // would both see the winner answer, and one test would use the other's server.
        static STARTING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = STARTING.lock().unwrap_or_else(|e| e.into_inner());
        let port = free_port();
        let mut child = Command::new(bin)
            .args(["--addr", &format!("127.0.0.1:{port}"), "--no-stdin-watch"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let url = format!("http://127.0.0.1:{port}");
        let start = Instant::now();
        while reqwest::blocking::get(&url).is_err() {
            assert!(
                start.elapsed() < super::wait::DEADLINE,
                "osmem-server did not start"
            );
            assert!(
                matches!(child.try_wait(), Ok(None)),
                "osmem-server exited (port {port} taken meanwhile?)"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Es::Osmem { child, url }
    }

    /// Both servers, for tests that must hold on each.
    pub fn each() -> Vec<(&'static str, Starter)> {
        vec![
            ("testkit", Es::testkit as fn() -> Es),
            ("osmem", Es::osmem as fn() -> Es),
        ]
    }

    pub fn url(&self) -> String {
        match self {
            Es::Testkit { server, .. } => server.url().to_string(),
            Es::Osmem { url, .. } => url.clone(),
        }
    }

    /// Sets the test server's faults (only the test server has them).
    pub fn set_faults(&self, faults: Value) {
        let r = reqwest::blocking::Client::new()
            .post(format!("{}/_lockgate/faults", self.url()))
            .json(&faults)
            .send()
            .unwrap();
        assert!(r.status().is_success(), "{:?}", r.text());
    }

    /// An HTTP call returning (status, JSON body).
    pub fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let c = reqwest::blocking::Client::new();
        let url = format!("{}{path}", self.url());
        let mut req = c
            .request(method.parse().unwrap(), url)
            .header("content-type", "application/json");
        if let Some(b) = body {
            req = req.body(b.to_string());
        }
        let r = req.send().unwrap();
        let status = r.status().as_u16();
        let text = r.text().unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// Creates an index with a mapping of field -> type.
    pub fn create_index(&self, index: &str, fields: &[(&str, &str)]) {
        let props: serde_json::Map<String, Value> = fields
            .iter()
            .map(|(f, t)| (f.to_string(), json!({"type": t})))
            .collect();
        let (status, body) = self.call(
            "PUT",
            &format!("/{index}"),
            Some(&json!({"mappings": {"properties": props}}).to_string()),
        );
        assert_eq!(status, 200, "{body}");
    }

    /// Every document of `index` (after a refresh): id -> source; none when it does
    /// not exist.
    pub fn documents(&self, index: &str) -> std::collections::BTreeMap<String, Value> {
        all_documents(index, |method, path, body| {
            self.call(method, path, body.map(|b| b.to_string()).as_deref())
        })
    }

    /// The document count of an index (after a refresh).
    pub fn count(&self, index: &str) -> u64 {
        self.call("POST", &format!("/{index}/_refresh"), None);
        let (_, body) = self.call("GET", &format!("/{index}/_count"), None);
        body["count"].as_u64().unwrap_or(0)
    }

    /// Fetches documents by id with `_mget`: id -> (source, version) for those found.
    pub fn get_many(&self, index: &str, ids: &[String]) -> Vec<(String, Value, i64)> {
        let mut out = Vec::new();
        for chunk in ids.chunks(1000) {
            let body = json!({"ids": chunk}).to_string();
            let (status, v) = self.call("POST", &format!("/{index}/_mget"), Some(&body));
            assert_eq!(status, 200, "{v}");
            for d in v["docs"].as_array().unwrap() {
                if d["found"] == json!(true) {
                    out.push((
                        d["_id"].as_str().unwrap().to_string(),
                        d["_source"].clone(),
                        d["_version"].as_i64().unwrap_or(0),
                    ));
                }
            }
        }
        out
    }
}

/// The id a sequence record gets with `id = "coordinates"` (split = key % 128).
pub fn sequence_id(seq: i64, keys: u32) -> String {
    format!("sequence-{}-{seq}", (seq % i64::from(keys)) % 128)
}

/// A `sequence -> [rolling_sum] -> elasticsearch` job file; `sink_extra` goes into
/// `[sink.elasticsearch]`.
pub fn write_es_job(
    dir: &std::path::Path,
    url: &str,
    to: i64,
    keys: u32,
    rate: u64,
    rolling_sum: bool,
    sink_extra: &str,
) {
    let transform = if rolling_sum {
        "[[transform]]\ntype = \"rolling_sum\"\nkey = \"/key\"\nfield = \"/value\"\noutput = \"/total\"\n"
    } else {
        ""
    };
    let text = format!(
        "[job]\nname = \"es-test\"\nparallelism = 2\n\n[checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 200\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [source.sequence]\nfrom = 1\nto = {to}\nkeys = {keys}\nrate_per_sec = {rate}\n\n{transform}\n\
         [sink.elasticsearch]\nurl = \"{url}\"\nindex = \"seq\"\nbulk_flush_interval_ms = 100\nretry_initial_ms = 20\nretry_max_ms = 500\nretry_max_attempts = 1000\n{sink_extra}\n"
    );
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("job.toml"), text).unwrap();
}

/// `lockgate testkit es` in its own process (so a test can kill it), optionally with
/// TLS and required credentials.
pub struct EsProcess {
    child: Child,
    pub url: String,
    /// With `--tls`: the CA certificate the server wrote.
    pub ca_cert: Option<PathBuf>,
    /// The test's client: the server's CA and the first credentials it accepts.
    pub http: lockgate::chaos::es_http::EsHttp,
}

impl EsProcess {
    /// Starts a server on a free port. `args` are further options (`--basic-auth U:P`,
    /// `--api-key ID:KEY`); `tls` adds `--tls --cert-out <dir>/ca.pem`. `auth` is how the
    /// test itself authenticates.
    pub fn start(
        dir: &std::path::Path,
        tls: bool,
        args: &[&str],
        auth: Option<lockgate::connectors::elasticsearch::Auth>,
    ) -> EsProcess {
        EsProcess::start_on("127.0.0.1:0", dir, tls, args, auth)
    }

    /// [`EsProcess::start`] on another address (port 0: a free one). The test's own
    /// client checks the certificate's chain, not its names.
    pub fn start_on(
        listen: &str,
        dir: &std::path::Path,
        tls: bool,
        args: &[&str],
        auth: Option<lockgate::connectors::elasticsearch::Auth>,
    ) -> EsProcess {
        use std::io::BufRead;
        std::fs::create_dir_all(dir).unwrap();
        let mut cmd = Command::new(super::bin());
        cmd.args(["testkit", "es", "--listen", listen]).args(args);
        let cert = dir.join("ca.pem");
        if tls {
            cmd.arg("--tls").arg("--cert-out").arg(&cert);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let url = line.trim().to_string();
        assert!(url.starts_with("http"), "test server printed {url:?}");
        let ca_cert = tls.then(|| {
            let mut l = String::new();
            out.read_line(&mut l).unwrap();
            assert_eq!(PathBuf::from(l.trim()), cert);
            cert.clone()
        });
        let mut conn = lockgate::connectors::elasticsearch::EsConnection::single(url.clone());
        conn.auth = auth;
        if tls {
            conn.tls_verify = lockgate::connectors::elasticsearch::TlsVerify::Certificate;
        }
        conn.ca_cert = ca_cert
            .clone()
            .map(|p| lockgate::clients::http::CaCert::read(p).unwrap());
        let http = lockgate::chaos::es_http::EsHttp::new(&conn, Duration::from_secs(30)).unwrap();
        EsProcess {
            child,
            url,
            ca_cert,
            http,
        }
    }

    /// An HTTP call returning (status, JSON body).
    pub fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = self.http.request(method.parse().unwrap(), path);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().unwrap();
        let status = r.status().as_u16();
        (status, r.json().unwrap_or(Value::Null))
    }

    /// The server's counters.
    pub fn stats(&self) -> Value {
        let (status, v) = self.call("GET", "/_lockgate/stats", None);
        assert_eq!(status, 200, "{v}");
        v
    }

    /// Every document of `index`: id -> source.
    pub fn documents(&self, index: &str) -> std::collections::BTreeMap<String, Value> {
        all_documents(index, |method, path, body| self.call(method, path, body))
    }

    /// Kills the server (SIGKILL): what it held is gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for EsProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Every document of `index` through `call` (method, path, body -> status, body),
/// after a refresh: id -> source; none when the index does not exist.
fn all_documents(
    index: &str,
    call: impl Fn(&str, &str, Option<Value>) -> (u16, Value),
) -> std::collections::BTreeMap<String, Value> {
    call("POST", &format!("/{index}/_refresh"), None);
    let (status, v) = call(
        "POST",
        &format!("/{index}/_search"),
        Some(json!({"query": {"match_all": {}}, "size": 1_000_000})),
    );
    if status == 404 {
        return Default::default();
    }
    assert_eq!(status, 200, "{v}");
    v["hits"]["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h["_id"].as_str().unwrap().to_string(), h["_source"].clone()))
        .collect()
}
