//! `[source.postgres_cdc]` through real processes: a PostgreSQL server with
//! `wal_level = logical` started from Debian's binaries, `lockgate run` killed with
//! SIGKILL while the initial snapshot is read and while a workload of multi-statement
//! transactions runs, and the result read back by the server itself (the copy table
//! of a second database) or by an independent Elasticsearch-API server.

mod common;

use common::es::Es;
use common::{bin, seed, tail};
use lockgate::testkit::postgres::{PgOptions, PgServer};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A logical server with the databases `shop` (the source) and `copy` (a sink).
fn server() -> PgServer {
    let s = PgServer::start(PgOptions::logical()).expect("a PostgreSQL server");
    s.create_database("shop").unwrap();
    s.create_database("copy").unwrap();
    s
}

const ACCOUNTS: &str = "CREATE TABLE accounts (id bigint PRIMARY KEY, name text NOT NULL, balance numeric(12,2), note text)";

/// `rows` accounts `1..=rows`.
fn fill(pg: &PgServer, rows: u64) {
    pg.query("shop", ACCOUNTS).unwrap();
    pg.query(
        "shop",
        &format!(
            "INSERT INTO accounts SELECT i, 'name ' || i, (i * 1.25)::numeric(12,2), CASE WHEN i % 3 = 0 THEN NULL ELSE 'n' || i END FROM generate_series(1, {rows}) i"
        ),
    )
    .unwrap();
}

/// A job of the source (`source` more keys) through `debezium` into `sink`.
fn job(dir: &Path, pg: &PgServer, source: &str, sink: &str) -> PathBuf {
    let text = format!(
        "[job]\nname = \"cdc\"\nparallelism = 2\n\n[checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 200\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [source.postgres_cdc]\nurl = \"{}\"\nsslmode = \"disable\"\ntables = [\"public.accounts\"]\nslot = \"lockgate_shop\"\npublication = \"lockgate_shop\"\n{source}\n\n\
         [[transform]]\ntype = \"debezium\"\n\n{sink}\n",
        pg.url("shop")
    );
    let path = dir.join("job.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn pg_sink(pg: &PgServer) -> String {
    format!(
        "[sink.postgres]\nurl = \"{}\"\nsslmode = \"disable\"\ntable = \"accounts\"\nmode = \"upsert\"\nkey = [\"id\"]",
        pg.url("copy")
    )
}

/// `lockgate run job` with its output appended to `log`.
fn spawn(job: &Path, log: &Path) -> Child {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Command::new(bin())
        .args(["run", "--config"])
        .arg(job)
        .current_dir(job.parent().unwrap())
        .env("RUST_LOG", "info,lockgate::connectors::postgres_cdc=debug")
        // Each poll of the source waits 40 ms: the initial snapshot lasts long enough
        // to be killed inside.
        .env("LOCKGATE_FAILPOINTS", "source-batch=sleep(40)")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap()
}

/// The rows of `accounts` in `db`, in key order, as text.
fn rows(pg: &PgServer, db: &str) -> Vec<Vec<String>> {
    pg.query(
        db,
        "SELECT id::text, name, balance::text, coalesce(note, '<null>') FROM accounts ORDER BY accounts.id",
    )
    .unwrap()
}

/// A workload of `n` multi-statement transactions on `accounts` (inserts above
/// `base`, updates, deletes, and a key changed), seeded; sets `done` at its end.
fn workload(pg: &PgServer, n: u64, base: u64, seed: u64, pause: Duration, done: Arc<AtomicBool>) {
    let mut x = seed | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..n {
        let id = base + 1 + i;
        let a = next() % base + 1;
        let b = next() % base + 1;
        let sql = format!(
            "BEGIN;\
             INSERT INTO accounts VALUES ({id}, 'new {id}', {i}.50, NULL);\
             UPDATE accounts SET balance = balance + 1, note = 'tx {i}' WHERE id = {a};\
             DELETE FROM accounts WHERE id = {b};\
             UPDATE accounts SET name = name || '!' WHERE id IN (SELECT id FROM accounts WHERE id % 97 = {} LIMIT 3);\
             {}\
             COMMIT;",
            i % 97,
            if i % 25 == 0 {
                // A key changed: the old row goes, a new one comes.
                format!("UPDATE accounts SET id = id + 1000000 WHERE id = {};", next() % base + 1)
            } else {
                String::new()
            }
        );
        pg.query("shop", &sql).unwrap();
        std::thread::sleep(pause);
    }
    done.store(true, Ordering::SeqCst);
}

/// The first rows where `a` and `b` differ.
fn diff(a: &[Vec<String>], b: &[Vec<String>]) -> String {
    let (sa, sb): (std::collections::BTreeSet<_>, std::collections::BTreeSet<_>) =
        (a.iter().collect(), b.iter().collect());
    let only_a: Vec<_> = sa.difference(&sb).take(5).collect();
    let only_b: Vec<_> = sb.difference(&sa).take(5).collect();
    let first = a.iter().zip(b).find(|(x, y)| x != y);
    format!(
        "{} and {} rows; only in the first: {only_a:?}; only in the second: {only_b:?}; first difference in order: {first:?}",
        a.len(),
        b.len()
    )
}

/// The slot's confirmed position, as an LSN's text.
fn confirmed(pg: &PgServer) -> String {
    pg.query(
        "shop",
        "SELECT coalesce(confirmed_flush_lsn::text, '') FROM pg_replication_slots WHERE slot_name = 'lockgate_shop'",
    )
    .unwrap()
    .first()
    .map(|r| r[0].clone())
    .unwrap_or_default()
}

fn lsn_ge(pg: &PgServer, a: &str, b: &str) -> bool {
    pg.query("shop", &format!("SELECT '{a}'::pg_lsn >= '{b}'::pg_lsn"))
        .unwrap()[0][0]
        == "t"
}

/// Kills `job`'s runs `kills` times at seeded moments while `workload` runs, then runs
/// it until `equal` holds. Returns the log.
fn chaos(
    job: &Path,
    kills: u32,
    seed: u64,
    equal: &mut dyn FnMut() -> bool,
    differs: &dyn Fn() -> String,
) -> String {
    let log = job.with_file_name("job.log");
    let mut x = seed | 1;
    for k in 0..kills {
        let mut child = spawn(job, &log);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // The first runs are short, so that kills fall inside the snapshot.
        let ms = if k < 8 { 250 + x % 500 } else { 400 + x % 1600 };
        std::thread::sleep(Duration::from_millis(ms));
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "run {k} ended by itself ({status}):\n{}",
                tail(&std::fs::read_to_string(&log).unwrap(), 60)
            );
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let mut child = spawn(job, &log);
    let start = Instant::now();
    while !equal() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "the last run ended ({status}):\n{}",
                tail(&std::fs::read_to_string(&log).unwrap(), 60)
            );
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "not equal within 120 s: {}\n{}",
            differs(),
            tail(&std::fs::read_to_string(&log).unwrap(), 20)
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // The slot's confirmed position follows the completed checkpoints.
    std::thread::sleep(Duration::from_millis(1500));
    child.kill().unwrap();
    child.wait().unwrap();
    std::fs::read_to_string(&log).unwrap()
}

/// The initial snapshot of 10,000 rows, then a workload of inserts, updates, deletes
/// and changed keys in multi-statement transactions, while the job is SIGKILLed 30
/// times, eight of them while the snapshot is read: the copy table equals the
/// source's, and the slot has released the WAL of the workload.
#[test]
fn snapshot_and_changes_into_postgres_through_30_kills() {
    let pg = Arc::new(server());
    fill(&pg, 10_000);
    pg.query("copy", ACCOUNTS).unwrap();
    let start_lsn = pg
        .query("shop", "SELECT pg_current_wal_lsn()::text")
        .unwrap()[0][0]
        .clone();
    let tmp = tempfile::tempdir().unwrap();
    let job = job(
        tmp.path(),
        &pg,
        "snapshot_chunk_rows = 250\nheartbeat_ms = 500",
        &pg_sink(&pg),
    );
    let done = Arc::new(AtomicBool::new(false));
    let s = seed(50);
    let w = {
        let (pg, done) = (pg.clone(), done.clone());
        std::thread::spawn(move || workload(&pg, 400, 10_000, s, Duration::from_millis(40), done))
    };
    let log = chaos(
        &job,
        30,
        s,
        &mut || done.load(Ordering::SeqCst) && rows(&pg, "shop") == rows(&pg, "copy"),
        &|| diff(&rows(&pg, "shop"), &rows(&pg, "copy")),
    );
    w.join().unwrap();
    assert_eq!(rows(&pg, "shop"), rows(&pg, "copy"));
    let pieces = log.matches("snapshot: reading").count();
    assert!(
        pieces >= 2,
        "a kill fell inside the snapshot: {pieces} pieces"
    );
    let c = confirmed(&pg);
    assert!(
        lsn_ge(&pg, &c, &start_lsn),
        "the slot's confirmed position {c} is past the workload's start {start_lsn}"
    );
}

/// The same into Elasticsearch (an independent server), documents by primary key.
#[test]
fn snapshot_and_changes_into_elasticsearch_through_30_kills() {
    let pg = Arc::new(server());
    fill(&pg, 10_000);
    let es = Es::osmem();
    // More than 10,000 documents are read back in one search.
    let (status, body) = es.call(
        "PUT",
        "/accounts",
        Some(r#"{"settings": {"index": {"max_result_window": 2000000}}}"#),
    );
    assert_eq!(status, 200, "{body}");
    let tmp = tempfile::tempdir().unwrap();
    let sink = format!(
        "[sink.elasticsearch]\nurl = \"{}\"\nindex = \"accounts\"\nid = \"field:/id\"",
        es.url()
    );
    let job = job(tmp.path(), &pg, "snapshot_chunk_rows = 250", &sink);
    let done = Arc::new(AtomicBool::new(false));
    let s = seed(51);
    let w = {
        let (pg, done) = (pg.clone(), done.clone());
        std::thread::spawn(move || workload(&pg, 400, 10_000, s, Duration::from_millis(40), done))
    };
    let index = |es: &Es| -> Vec<Vec<String>> {
        let docs = es.documents("accounts");
        let mut out: Vec<(i64, Vec<String>)> = docs
            .values()
            .map(|d| {
                let text = |v: &serde_json::Value| match v {
                    serde_json::Value::Null => "<null>".to_string(),
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                let id = d["id"].as_i64().unwrap();
                (
                    id,
                    vec![
                        id.to_string(),
                        text(&d["name"]),
                        text(&d["balance"]),
                        text(&d["note"]),
                    ],
                )
            })
            .collect();
        out.sort();
        out.into_iter().map(|(_, r)| r).collect()
    };
    let log = chaos(
        &job,
        30,
        s,
        &mut || {
            done.load(Ordering::SeqCst) && {
                es.call("POST", "/accounts/_refresh", None);
                rows(&pg, "shop") == index(&es)
            }
        },
        &|| {
            format!(
                "workload done: {}; {}",
                done.load(Ordering::SeqCst),
                diff(&rows(&pg, "shop"), &index(&es))
            )
        },
    );
    w.join().unwrap();
    assert_eq!(rows(&pg, "shop"), index(&es));
    assert!(log.matches("snapshot: reading").count() >= 2);
}

/// What a DBA must fix is named at start, and the job fails without restarts.
#[test]
fn a_server_without_logical_decoding_a_role_without_replication_or_a_table_without_a_key_is_refused(
) {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("job.log");
    let refused = |pg: &PgServer, want: &str| {
        let job = job(tmp.path(), pg, "", "[sink.file]\ndir = \"out\"");
        let mut child = spawn(&job, &log);
        let status = common::wait_timeout(&mut child, Duration::from_secs(60));
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(!status.success(), "{}", tail(&text, 20));
        assert!(text.contains(want), "{want}:\n{}", tail(&text, 20));
    };
    let plain = PgServer::start(PgOptions::default()).unwrap();
    plain.create_database("shop").unwrap();
    plain.create_database("copy").unwrap();
    fill(&plain, 1);
    refused(&plain, "wal_level = logical");
    let pg = server();
    pg.query("shop", "CREATE TABLE accounts (id bigint, name text)")
        .unwrap();
    refused(&pg, "table public.accounts has no primary key");
    pg.query(
        "shop",
        "CREATE ROLE app LOGIN; GRANT ALL ON accounts TO app",
    )
    .unwrap();
    let tmp2 = tempfile::tempdir().unwrap();
    let url = pg.url("shop").replace("lockgate@", "app@");
    std::fs::write(
        tmp2.path().join("job.toml"),
        format!(
            "[job]\nname = \"cdc\"\n[checkpoint]\ndir = \"c\"\n[restart]\nstrategy = \"none\"\n\
             [source.postgres_cdc]\nurl = \"{url}\"\nsslmode = \"disable\"\ntables = [\"public.accounts\"]\nslot = \"s\"\npublication = \"p\"\n\
             [sink.file]\ndir = \"out\"\n"
        ),
    )
    .unwrap();
    let log2 = tmp2.path().join("job.log");
    let mut child = spawn(&tmp2.path().join("job.toml"), &log2);
    let status = common::wait_timeout(&mut child, Duration::from_secs(60));
    let text = std::fs::read_to_string(&log2).unwrap();
    assert!(!status.success());
    assert!(
        text.contains("ALTER ROLE \"app\" REPLICATION"),
        "{}",
        tail(&text, 20)
    );
}

/// A job of the source (`source` more keys, `tables`) straight into `[sink.file]`: its
/// lines are the events (deletes as `lockgate.delete` lines).
fn file_job(dir: &Path, pg: &PgServer, tables: &str, source: &str) -> PathBuf {
    let text = format!(
        "[job]\nname = \"cdc-files\"\nparallelism = 1\n\n[checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 200\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [source.postgres_cdc]\nurl = \"{}\"\nsslmode = \"disable\"\ntables = [{tables}]\nslot = \"files\"\npublication = \"files\"\n{source}\n\n\
         [sink.file]\ndir = \"out\"\n",
        pg.url("shop")
    );
    let path = dir.join("job.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The events the file sink committed, parsed.
fn events(job: &Path) -> Vec<serde_json::Value> {
    let out = job.with_file_name("out");
    if !out.is_dir() {
        return Vec::new();
    }
    common::committed_lines_in(&out)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Waits until `job`'s committed events satisfy `done`, failing with the log after
/// 60 s or when the run ends.
fn until(child: &mut Child, job: &Path, what: &str, done: impl Fn(&[serde_json::Value]) -> bool) {
    let log = job.with_file_name("job.log");
    let start = Instant::now();
    loop {
        let e = events(job);
        if done(&e) {
            return;
        }
        let ended = child.try_wait().unwrap();
        assert!(
            ended.is_none() && start.elapsed() < Duration::from_secs(60),
            "{what} (run ended: {ended:?}); events: {e:?}\n{}",
            tail(&std::fs::read_to_string(&log).unwrap_or_default(), 30)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn after_of(events: &[serde_json::Value], op: &str, id: i64) -> Option<serde_json::Value> {
    events
        .iter()
        .find(|e| e["op"] == op && e["after"]["id"] == id)
        .map(|e| e["after"].clone())
}

/// Every column type the README lists, as Debezium's connector writes it, in a
/// snapshot read and in a change.
#[test]
fn values_as_debezium_writes_them() {
    let pg = server();
    pg.query(
        "shop",
        "CREATE TABLE kinds (id int PRIMARY KEY, b boolean, n numeric(10,3), f float8, d date, t time, \
         ts timestamp, ts3 timestamp(3), tz timestamptz, j jsonb, by bytea, arr int[], u uuid, tx text, nan numeric)",
    )
    .unwrap();
    let row = |id: i32| {
        format!(
            "INSERT INTO kinds VALUES ({id}, true, 12.500, 1.5, '2024-03-01', '12:34:56.789', '2024-03-01 12:00:00.123456', \
             '2024-03-01 12:00:00.123', '2024-03-01 12:00:00.5+02', '{{\"a\": [1, 2]}}', '\\xdeadbeef', '{{1,NULL,3}}', \
             'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', E'tab\\there', 'NaN')"
        )
    };
    pg.query("shop", &row(1)).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let job = file_job(tmp.path(), &pg, "\"public.kinds\"", "");
    let mut child = spawn(&job, &tmp.path().join("job.log"));
    until(&mut child, &job, "the snapshot read", |e| {
        after_of(e, "r", 1).is_some()
    });
    pg.query("shop", &row(2)).unwrap();
    until(&mut child, &job, "the insert", |e| {
        after_of(e, "c", 2).is_some()
    });
    child.kill().unwrap();
    child.wait().unwrap();
    let e = events(&job);
    let want = |id: i64| {
        serde_json::from_str::<serde_json::Value>(&format!(
            r#"{{"id":{id},"b":true,"n":12.500,"f":1.5,"d":19783,"t":45296789000,"ts":1709294400123456,"ts3":1709294400123,"tz":"2024-03-01T10:00:00.500000Z","j":"{{\"a\": [1, 2]}}","by":"3q2+7w==","arr":[1,null,3],"u":"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11","tx":"tab\there","nan":"NaN"}}"#
        ))
        .unwrap()
    };
    assert_eq!(after_of(&e, "r", 1).unwrap(), want(1));
    assert_eq!(after_of(&e, "c", 2).unwrap(), want(2));
    let c = e.iter().find(|e| e["op"] == "c").unwrap();
    assert_eq!(c["source"]["connector"], "postgresql");
    assert_eq!(c["source"]["table"], "kinds");
    assert_eq!(c["source"]["snapshot"], "false");
    assert!(
        c["source"]["txId"].is_u64() && c["source"]["lsn"].is_u64(),
        "{c}"
    );
}

/// A column added and one dropped reach the events with the next change, without a
/// restart; a TOASTed value an update left alone is Debezium's placeholder, and the
/// old row's value under REPLICA IDENTITY FULL.
#[test]
fn schema_changes_and_toast_flow_through_without_a_restart() {
    let pg = server();
    pg.query(
        "shop",
        "CREATE TABLE t (id int PRIMARY KEY, note text, big text, n int); \
         INSERT INTO t VALUES (1, 'a', 'small', 0)",
    )
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let job = file_job(tmp.path(), &pg, "\"public.t\"", "");
    let log = tmp.path().join("job.log");
    let mut child = spawn(&job, &log);
    until(&mut child, &job, "the snapshot", |e| {
        after_of(e, "r", 1).is_some()
    });
    pg.query(
        "shop",
        "ALTER TABLE t ADD COLUMN extra text DEFAULT 'x'; INSERT INTO t (id, note, extra) VALUES (2, 'b', 'y'); \
         ALTER TABLE t DROP COLUMN note; INSERT INTO t (id) VALUES (3)",
    )
    .unwrap();
    until(&mut child, &job, "the changes", |e| {
        after_of(e, "c", 3).is_some()
    });
    // About 10 kB that compression cannot bring below the TOAST threshold.
    pg.query(
        "shop",
        "UPDATE t SET big = (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 300)) WHERE id = 1; \
         UPDATE t SET n = 1 WHERE id = 1",
    )
    .unwrap();
    until(&mut child, &job, "the update of n", |e| {
        e.iter().any(|e| e["op"] == "u" && e["after"]["n"] == 1)
    });
    pg.query(
        "shop",
        "ALTER TABLE t REPLICA IDENTITY FULL; UPDATE t SET n = 2 WHERE id = 1",
    )
    .unwrap();
    until(&mut child, &job, "the update under FULL", |e| {
        e.iter().any(|e| e["op"] == "u" && e["after"]["n"] == 2)
    });
    child.kill().unwrap();
    child.wait().unwrap();
    let e = events(&job);
    assert_eq!(after_of(&e, "r", 1).unwrap()["note"], "a");
    let two = after_of(&e, "c", 2).unwrap();
    assert_eq!(
        (two["note"].as_str(), two["extra"].as_str()),
        (Some("b"), Some("y"))
    );
    let three = after_of(&e, "c", 3).unwrap();
    assert!(three.get("note").is_none(), "dropped: {three}");
    assert_eq!(three["extra"], "x");
    let big = pg.query("shop", "SELECT big FROM t WHERE id = 1").unwrap()[0][0].clone();
    let update = |n: i64| {
        e.iter()
            .find(|e| e["op"] == "u" && e["after"]["n"] == n)
            .unwrap()
            .clone()
    };
    assert_eq!(update(1)["after"]["big"], "__debezium_unavailable_value");
    assert_eq!(update(2)["after"]["big"], big.as_str());
    assert_eq!(update(2)["before"]["n"], 1, "FULL: the old row");
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.matches("job starting").count(), 1, "no restart");
}

/// While the captured table is quiet and another table of the database is busy, the
/// slot's confirmed position still moves past the other table's WAL.
#[test]
fn a_quiet_table_still_releases_the_wal_of_busy_others() {
    let pg = server();
    pg.query(
        "shop",
        "CREATE TABLE quiet (id int PRIMARY KEY); INSERT INTO quiet VALUES (1); CREATE TABLE busy (id int, pad text)",
    )
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let job = file_job(tmp.path(), &pg, "\"public.quiet\"", "heartbeat_ms = 200");
    let log = tmp.path().join("job.log");
    let mut child = spawn(&job, &log);
    until(&mut child, &job, "the snapshot", |e| {
        after_of(e, "r", 1).is_some()
    });
    for _ in 0..20 {
        pg.query(
            "shop",
            "INSERT INTO busy SELECT i, repeat('x', 200) FROM generate_series(1, 2000) i",
        )
        .unwrap();
    }
    let past = pg
        .query("shop", "SELECT pg_current_wal_lsn()::text")
        .unwrap()[0][0]
        .clone();
    let start = Instant::now();
    let confirmed = |pg: &PgServer| {
        pg.query(
            "shop",
            "SELECT coalesce(confirmed_flush_lsn::text, '0/0') FROM pg_replication_slots WHERE slot_name = 'files'",
        )
        .unwrap()[0][0]
            .clone()
    };
    while !lsn_ge(&pg, &confirmed(&pg), &past) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the slot stays at {} behind {past}:\n{}",
            confirmed(&pg),
            tail(&std::fs::read_to_string(&log).unwrap(), 20)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(events(&job).len(), 1, "nothing of the busy table");
}
