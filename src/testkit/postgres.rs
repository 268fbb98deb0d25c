//! A real PostgreSQL server for tests: a fresh cluster in a temporary directory, run from
//! the installed server binaries (Debian's `postgresql` package, or `LOCKGATE_PG_BIN`) on
//! a free loopback port, and stopped when dropped and when the process that started it
//! ends in any way.
//!
//! Run as root (a container), the server runs as the user `postgres` (else `nobody`)
//! through `setpriv`: initdb and postgres refuse to run as root. The temporary directory
//! must then be reachable by that user (the default, under `/tmp`, is).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// Where the server binaries are: `LOCKGATE_PG_BIN`, else the newest
/// `/usr/lib/postgresql/<version>/bin` with an `initdb`, else the directory of `initdb`
/// on `PATH` (the directory a symbolic link there points into when that is where
/// `postgres` is).
pub fn pg_bin_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("LOCKGATE_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    // Debian installs each major version side by side; a version that has only the
    // client (`postgresql-client`) has no initdb.
    let mut newest: Option<((u32, u32), PathBuf)> = None;
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(version) = name.to_str().and_then(parse_version) else {
                continue;
            };
            let bin = entry.path().join("bin");
            if bin.join("initdb").is_file() && newest.as_ref().is_none_or(|(v, _)| version > *v) {
                newest = Some((version, bin));
            }
        }
    }
    if let Some((_, bin)) = newest {
        return Ok(bin);
    }
    // `initdb` on PATH may be a symbolic link into the real directory, or Debian's
    // pg_wrapper, which has no `postgres` next to it: the directory that has both wins.
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let initdb = dir.join("initdb");
        if !initdb.is_file() {
            continue;
        }
        if let Some(real) = std::fs::canonicalize(&initdb)
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
        {
            if real.join("postgres").is_file() {
                return Ok(real);
            }
        }
        if dir.join("postgres").is_file() {
            return Ok(dir);
        }
    }
    Err(
        "no PostgreSQL server binaries found (install the postgresql package, or set \
         LOCKGATE_PG_BIN to the directory of initdb and postgres)"
            .into(),
    )
}

/// `15` as (15, 0), `9.6` as (9, 6): the names of Debian's version directories.
fn parse_version(name: &str) -> Option<(u32, u32)> {
    let (major, minor) = name.split_once('.').unwrap_or((name, "0"));
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The server's settings that tests choose.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// postgresql.conf `max_prepared_transactions` (0: the server refuses
    /// `PREPARE TRANSACTION`).
    pub max_prepared_transactions: u32,
    /// `fsync` on (the default, true): what a real server does. Off is faster and loses
    /// nothing unless the machine itself crashes.
    pub fsync: bool,
    /// The port to listen on (None: a free one).
    pub port: Option<u16>,
    /// More postgresql.conf settings, `(name, value)` (`wal_level = logical` for change
    /// data capture).
    pub settings: Vec<(String, String)>,
}

impl PgOptions {
    /// A server that decodes its WAL for logical replication (`wal_level = logical`,
    /// with room for 20 slots and senders).
    pub fn logical() -> PgOptions {
        PgOptions {
            settings: vec![
                ("wal_level".into(), "logical".into()),
                ("max_replication_slots".into(), "20".into()),
                ("max_wal_senders".into(), "20".into()),
            ],
            ..PgOptions::default()
        }
    }
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            max_prepared_transactions: 64,
            fsync: true,
            port: None,
            settings: Vec::new(),
        }
    }
}

/// A running PostgreSQL server with superuser `lockgate`, trust authentication (no
/// password) and the database `postgres`; stopped (a fast shutdown) when dropped, and when
/// the process that started it ends in any way (a server kept in a `static`, which is never
/// dropped, or a test process killed by SIGKILL, included). Its data directory is removed
/// when it is dropped.
pub struct PgServer {
    /// The directory of initdb, postgres, pg_isready and (usually) psql.
    bin: PathBuf,
    /// The user and group ids the server runs as (this process is root), or None: itself.
    run_as: Option<(u32, u32)>,
    opts: PgOptions,
    port: u16,
    /// `_dir`'s path without symbolic links: the directory of the server's Unix socket.
    root: PathBuf,
    /// `root/data`: the cluster.
    data: PathBuf,
    /// `root/postgres.log`: the server's standard output and error, over all its starts.
    log_path: PathBuf,
    /// A shell that runs the server and stops it once the pipe (`ChildStdin`) closes:
    /// postgres does not watch its standard input. None while stopped.
    running: Option<(Child, ChildStdin)>,
    /// The temporary directory, held to be removed last: once `drop` has stopped the
    /// server.
    _dir: tempfile::TempDir,
}

/// Runs `$0 "$@"` (the server) and stops it with SIGINT (postgres' fast shutdown) when
/// standard input closes; waits for the server and exits with its status, so that waiting
/// for the shell is waiting for the shutdown to end. (A background command of a
/// non-interactive shell reads `/dev/null` unless told otherwise: the watcher reads the
/// pipe through descriptor 3, which the server does not need to hold.)
const WATCH_PIPE: &str = r#"exec 3<&0; "$0" "$@" </dev/null 3<&- & pid=$!; (cat <&3 >/dev/null; kill -INT $pid 2>/dev/null) & wait $pid"#;

/// How long a start may take before it is an error, and a fast shutdown before it is made
/// an immediate one.
const PATIENCE: Duration = Duration::from_secs(60);

/// Why a server did not come up.
enum Launch {
    /// It exited before accepting connections (its port was taken, say): another port
    /// may do.
    Exited(String),
    /// Anything else.
    Failed(String),
}

impl PgServer {
    /// Starts a server: a new cluster (initdb: superuser `lockgate`, trust authentication
    /// on loopback and the Unix socket, UTF8, locale C), then `postgres` listening on
    /// 127.0.0.1 only, at a free port, with its Unix socket in its temporary directory,
    /// `max_connections` = 200 and `opts`. Returns once the server accepts connections
    /// (within 60 s, else an error that ends with the server's log).
    pub fn start(opts: PgOptions) -> Result<PgServer, String> {
        let bin = pg_bin_dir()?;
        let run_as = unprivileged_ids()?;
        let dir = tempfile::Builder::new()
            .prefix("lockgate-pg-")
            .tempdir()
            .map_err(|e| format!("creating a temporary directory: {e}"))?;
        // postgres reports its data directory as it was given: an absolute path without
        // symbolic links, which `is_ours` compares with what the server answers.
        let root = std::fs::canonicalize(dir.path())
            .map_err(|e| format!("{}: {e}", dir.path().display()))?;
        if let Some((uid, gid)) = run_as {
            // initdb creates the data directory in it, postgres its socket and lock file.
            std::os::unix::fs::chown(&root, Some(uid), Some(gid))
                .map_err(|e| format!("chown {}: {e}", root.display()))?;
        }
        let mut server = PgServer {
            bin,
            run_as,
            opts,
            port: 0,
            data: root.join("data"),
            log_path: root.join("postgres.log"),
            root,
            running: None,
            _dir: dir,
        };
        server.initdb()?;
        if let Some(port) = server.opts.port {
            server.port = port;
            return match server.launch() {
                Ok(()) => Ok(server),
                Err(Launch::Exited(e) | Launch::Failed(e)) => Err(e),
            };
        }
        let mut last = String::new();
        // The free port is found by binding port 0 and releasing it: another process may
        // take it in between, and then the server exits at once; a new port is tried.
        for _ in 0..5 {
            server.port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map_err(|e| format!("finding a free port: {e}"))?
                .port();
            match server.launch() {
                Ok(()) => return Ok(server),
                Err(Launch::Exited(e)) => last = e,
                Err(Launch::Failed(e)) => return Err(e),
            }
        }
        Err(last)
    }

    /// The server's TCP port on 127.0.0.1; the same across `restart` and `start_again`.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgresql://lockgate@127.0.0.1:<port>/<db>` (no password needed).
    pub fn url(&self, db: &str) -> String {
        format!("postgresql://lockgate@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates the database `db` (its name taken as is: quoted, so case matters), owned by
    /// `lockgate`.
    pub fn create_database(&self, db: &str) -> Result<(), String> {
        self.query(
            "postgres",
            &format!("CREATE DATABASE \"{}\"", db.replace('"', "\"\"")),
        )
        .map(|_| ())
    }

    /// Runs `sql` (one or several statements) in the database `db` with psql, and returns
    /// the rows of the last statement's output, each as its columns' text (NULL as the
    /// empty string); a statement without output gives no rows. An SQL error is an `Err`
    /// carrying psql's standard error.
    ///
    /// The text is sent as one query (`psql -c`): its statements run in one transaction
    /// unless they contain `BEGIN`/`COMMIT` themselves, an error stops them all, and a
    /// statement that cannot run in a transaction block (`CREATE DATABASE`, `VACUUM`) must
    /// be sent alone. Being a command-line argument, it is limited to about 128 KiB.
    pub fn query(&self, db: &str, sql: &str) -> Result<Vec<Vec<String>>, String> {
        let psql = self.tool("psql");
        let out = Command::new(&psql)
            // No ~/.psqlrc; no command tags; unaligned rows without headers, fields
            // separated by the unit separator and rows by the record separator (bytes
            // that text hardly holds); stop at the first error; only the last result
            // printed (psql 15 prints every statement's result by default).
            .args(["-X", "-q", "-A", "-t", "-F", "\x1f", "-R", "\x1e"])
            .args(["-v", "ON_ERROR_STOP=1", "-v", "SHOW_ALL_RESULTS=off"])
            .args(["-h", "127.0.0.1", "-p"])
            .arg(self.port.to_string())
            .args(["-U", "lockgate", "-d", db, "-c", sql])
            .env("PGCONNECT_TIMEOUT", "10")
            .env("PGCLIENTENCODING", "UTF8")
            // Settings of the caller's environment that would change the connection.
            .env_remove("PGSERVICE")
            .env_remove("PGOPTIONS")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{}: {e}", psql.display()))?;
        if !out.status.success() {
            return Err(format!(
                "psql ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim_end()
            ));
        }
        let text = String::from_utf8(out.stdout).map_err(|e| format!("psql's output: {e}"))?;
        Ok(parse_rows(&text))
    }

    /// Restarts the server on the same port and data directory: a fast shutdown, then a
    /// start (what `pg_ctl restart -m fast` does), returning once it accepts connections
    /// again. Committed data and prepared transactions survive it (they are on disk);
    /// sessions and open transactions do not.
    pub fn restart(&mut self) -> Result<(), String> {
        self.stop()?;
        self.start_again()
    }

    /// Stops the server (a fast shutdown: sessions are ended, open transactions rolled
    /// back, prepared ones kept) and returns once it has exited; `start_again` brings it
    /// back. Stopping a stopped server does nothing. An error says the server had exited
    /// with a failure (it had crashed, say); it is stopped all the same.
    pub fn stop(&mut self) -> Result<(), String> {
        let Some((mut child, stdin)) = self.running.take() else {
            return Ok(());
        };
        // The watcher sends SIGINT once the pipe closes, and exits when postgres does.
        drop(stdin);
        let deadline = Instant::now() + PATIENCE;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) => {
                    // A fast shutdown that does not end (a stuck session, say): an
                    // immediate one (SIGQUIT) does; the next start recovers from the WAL.
                    self.signal_postmaster(libc::SIGQUIT);
                    break child
                        .wait()
                        .map_err(|e| format!("waiting for postgres: {e}"))?;
                }
                Err(e) => return Err(format!("waiting for postgres: {e}")),
            }
        };
        if status.success() {
            Ok(())
        } else {
            Err(format!(
                "postgres exited with {status}; {}",
                self.log_tail()
            ))
        }
    }

    /// Starts the stopped server again on the same port and data directory, returning once
    /// it accepts connections (within 60 s, else an error that ends with the server's log;
    /// an error too if another process took the port meanwhile, or if it is running).
    pub fn start_again(&mut self) -> Result<(), String> {
        match self.launch() {
            Ok(()) => Ok(()),
            Err(Launch::Exited(e) | Launch::Failed(e)) => Err(e),
        }
    }

    /// The server's log (its standard output and error over all its starts), for test
    /// failure messages.
    pub fn log(&self) -> String {
        std::fs::read(&self.log_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The cluster: owned by the server's user, with trust authentication and the C locale.
    fn initdb(&self) -> Result<(), String> {
        let argv = self.as_server_user(&self.bin.join("initdb"));
        let out = Command::new(&argv[0])
            .args(&argv[1..])
            .arg("-D")
            .arg(&self.data)
            .args(["-U", "lockgate", "-A", "trust", "-E", "UTF8", "--locale=C"])
            // Not syncing the new cluster to disk saves seconds; it lives in a temporary
            // directory that a crash of the machine makes worthless anyway. The server's
            // own writes follow `PgOptions::fsync`.
            .args(["--no-instructions", "--no-sync"])
            // The server's user may not be able to enter the caller's directory.
            .current_dir(&self.root)
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{}: {e}", argv[0].to_string_lossy()))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "initdb ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// Runs postgres in the foreground under the watcher shell (a child that can be
    /// stopped, unlike a server that `pg_ctl` daemonizes) and waits until it accepts
    /// connections.
    fn launch(&mut self) -> Result<(), Launch> {
        if self.running.is_some() {
            return Err(Launch::Failed("the PostgreSQL server is running".into()));
        }
        // Opened here, the log is writable by the server whatever user it runs as.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .and_then(|f| Ok((f.try_clone()?, f)))
            .map_err(|e| Launch::Failed(format!("{}: {e}", self.log_path.display())))?;
        let mut socket_dir = OsString::from("unix_socket_directories=");
        socket_dir.push(&self.root);
        let fsync = if self.opts.fsync { "on" } else { "off" };
        let mut child = Command::new("sh")
            .args(["-c", WATCH_PIPE])
            .args(self.as_server_user(&self.bin.join("postgres")))
            .arg("-D")
            .arg(&self.data)
            .args(["-c", "listen_addresses=127.0.0.1", "-c"])
            .arg(format!("port={}", self.port))
            .arg("-c")
            .arg(socket_dir)
            .args(["-c", "max_connections=200", "-c"])
            .arg(format!(
                "max_prepared_transactions={}",
                self.opts.max_prepared_transactions
            ))
            .arg("-c")
            .arg(format!("fsync={fsync}"))
            .args(
                self.opts
                    .settings
                    .iter()
                    .flat_map(|(k, v)| ["-c".to_string(), format!("{k}={v}")]),
            )
            // The log goes to standard error, which is the log file.
            .args(["-c", "logging_collector=off"])
            .current_dir(&self.root)
            .env("LC_ALL", "C")
            .stdin(Stdio::piped())
            .stdout(log.0)
            .stderr(log.1)
            .spawn()
            .map_err(|e| Launch::Failed(format!("sh: {e}")))?;
        let stdin = child.stdin.take().expect("stdin is piped");
        let started = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    drop(stdin);
                    return Err(Launch::Exited(format!(
                        "postgres exited with {status} before accepting connections on port \
                         {}; {}",
                        self.port,
                        self.log_tail()
                    )));
                }
                Ok(None) => {}
                Err(e) => {
                    self.running = Some((child, stdin));
                    let _ = self.stop();
                    return Err(Launch::Failed(format!("waiting for postgres: {e}")));
                }
            }
            if self.is_ready() && self.is_ours() {
                self.running = Some((child, stdin));
                return Ok(());
            }
            if started.elapsed() > PATIENCE {
                self.running = Some((child, stdin));
                let _ = self.stop();
                return Err(Launch::Failed(format!(
                    "postgres did not accept connections on port {} within {} s; {}",
                    self.port,
                    PATIENCE.as_secs(),
                    self.log_tail()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A server accepts connections on the port.
    fn is_ready(&self) -> bool {
        Command::new(self.tool("pg_isready"))
            .args(["-q", "-h", "127.0.0.1", "-p"])
            .arg(self.port.to_string())
            .args(["-U", "lockgate", "-d", "postgres", "-t", "2"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// The server on the port is this one, not another that took the port first (this
    /// one then exits): two servers started at once on the same released port would both
    /// see the winner answer, and the loser's caller would use the other's server.
    fn is_ours(&self) -> bool {
        self.query("postgres", "SHOW data_directory")
            .is_ok_and(|rows| rows == [[self.data.to_string_lossy().into_owned()]])
    }

    /// `program`'s command line as the server's user: through `setpriv`, which changes
    /// user and executes `program` in its place, so that the process the watcher signals
    /// is postgres itself (`runuser` would stay in between, as postgres' parent).
    fn as_server_user(&self, program: &Path) -> Vec<OsString> {
        let mut argv: Vec<OsString> = match self.run_as {
            Some((uid, gid)) => vec![
                "setpriv".into(),
                format!("--reuid={uid}").into(),
                format!("--regid={gid}").into(),
                "--clear-groups".into(),
                "--".into(),
            ],
            None => Vec::new(),
        };
        argv.push(program.as_os_str().to_os_string());
        argv
    }

    /// A client program: the server's version from its directory, else from `PATH`.
    fn tool(&self, name: &str) -> PathBuf {
        let path = self.bin.join(name);
        if path.is_file() {
            path
        } else {
            PathBuf::from(name)
        }
    }

    /// Sends `signal` to the running postmaster, whose process id is the first line of
    /// `postmaster.pid`.
    fn signal_postmaster(&self, signal: libc::c_int) {
        let pid = std::fs::read_to_string(self.data.join("postmaster.pid"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .next()
                    .and_then(|l| l.trim().parse::<libc::pid_t>().ok())
            });
        if let Some(pid) = pid.filter(|&p| p > 0) {
            // SAFETY: kill only sends a signal; the file is current, as the server runs.
            unsafe { libc::kill(pid, signal) };
        }
    }

    /// The end of the log, for error messages.
    fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        format!(
            "end of the server's log:\n{}",
            lines[lines.len().saturating_sub(30)..].join("\n")
        )
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // A fast shutdown, waited for; the temporary directory goes after it.
        let _ = self.stop();
    }
}

/// psql's unaligned output as rows of fields: nothing when there are no rows, else rows
/// separated by the record separator and ended by a newline (in place of a last one).
fn parse_rows(text: &str) -> Vec<Vec<String>> {
    if text.is_empty() {
        return Vec::new();
    }
    let rows = text.strip_suffix('\n').unwrap_or(text);
    rows.split('\x1e')
        .map(|row| row.split('\x1f').map(str::to_owned).collect())
        .collect()
}

/// The user and group ids the server runs as when this process is root (initdb and
/// postgres refuse to run as root): `postgres`'s if that user exists, else `nobody`'s.
/// None when this process is not root.
fn unprivileged_ids() -> Result<Option<(u32, u32)>, String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    ["postgres", "nobody"]
        .into_iter()
        .find_map(user_ids)
        .map(Some)
        .ok_or_else(|| {
            "running as root, with neither a user postgres nor nobody to run \
                        PostgreSQL as (it refuses to run as root)"
                .into()
        })
}

/// A user's user and group ids, from the password database.
fn user_ids(name: &str) -> Option<(u32, u32)> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: all zeroes is a valid `passwd` (null pointers, zero ids).
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf: Vec<libc::c_char> = vec![0; 16 * 1024];
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // The reentrant variant: tests start servers from several threads at once.
    // SAFETY: the pointers are to live values that outlive the call, `buf.len()` is the
    // size of `buf`; getpwnam_r sets `found` to `&mut pwd` or to null.
    let rc = unsafe {
        libc::getpwnam_r(
            name.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        )
    };
    (rc == 0 && !found.is_null()).then_some((pwd.pw_uid, pwd.pw_gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows of `sql` in `db`, or a panic that shows the error and the server's log.
    fn q(pg: &PgServer, db: &str, sql: &str) -> Vec<Vec<String>> {
        pg.query(db, sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}\n{}", pg.log()))
    }

    #[test]
    fn a_server_starts_answers_restarts_and_keeps_prepared_transactions() {
        let mut pg = PgServer::start(PgOptions::default()).unwrap_or_else(|e| panic!("{e}"));
        assert!(pg
            .url("t")
            .ends_with(&format!("@127.0.0.1:{}/t", pg.port())));
        pg.create_database("t").unwrap_or_else(|e| panic!("{e}"));
        q(&pg, "t", "CREATE TABLE k (v int, s text)");
        q(
            &pg,
            "t",
            "BEGIN; INSERT INTO k VALUES (1, 'a' || chr(10) || 'b'); PREPARE TRANSACTION 'x';",
        );
        assert_eq!(q(&pg, "t", "SELECT gid FROM pg_prepared_xacts"), [["x"]]);
        pg.restart().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(q(&pg, "t", "SELECT gid FROM pg_prepared_xacts"), [["x"]]);
        q(&pg, "t", "COMMIT PREPARED 'x'");
        // Fields, rows, a newline inside a value, NULL, and no rows at all.
        assert_eq!(q(&pg, "t", "SELECT v, s, NULL FROM k"), [["1", "a\nb", ""]]);
        assert_eq!(q(&pg, "t", "SELECT generate_series(1, 2)"), [["1"], ["2"]]);
        assert!(q(&pg, "t", "SELECT 1 WHERE false").is_empty());
        let err = pg.query("t", "SELECT nosuch").unwrap_err();
        assert!(err.contains("nosuch"), "{err}");
    }

    #[test]
    fn no_max_prepared_transactions_makes_prepare_transaction_fail() {
        let pg = PgServer::start(PgOptions {
            max_prepared_transactions: 0,
            fsync: false,
            ..PgOptions::default()
        })
        .unwrap_or_else(|e| panic!("{e}"));
        q(&pg, "postgres", "CREATE TABLE k (v int)");
        let err = pg
            .query(
                "postgres",
                "BEGIN; INSERT INTO k VALUES (1); PREPARE TRANSACTION 'y';",
            )
            .unwrap_err();
        assert!(err.contains("prepared transactions are disabled"), "{err}");
        assert!(q(&pg, "postgres", "SELECT gid FROM pg_prepared_xacts").is_empty());
    }
}
