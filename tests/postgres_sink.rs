//! The Postgres sink through real processes: `lockgate run` and `lockgate chaos`
//! reading an embedded Kafka process and writing into a PostgreSQL server each test
//! starts from Debian's binaries (a temporary directory, a free port).

mod common;

use common::kafka::KafkaProcess;
use lockgate::testkit::postgres::{PgOptions, PgServer};
use std::path::{Path, PathBuf};

fn server() -> PgServer {
    let s = PgServer::start(PgOptions::default()).expect("a PostgreSQL server");
    s.create_database("app").unwrap();
    s
}

/// A bounded Kafka -> Postgres job file in `dir` at parallelism 2: `sink` follows
/// `url` and `table`.
fn job(dir: &Path, name: &str, kafka: &str, pg: &PgServer, table: &str, sink: &str) -> PathBuf {
    job_at(dir, name, 2, kafka, pg, table, sink)
}

fn job_at(
    dir: &Path,
    name: &str,
    parallelism: u16,
    kafka: &str,
    pg: &PgServer,
    table: &str,
    sink: &str,
) -> PathBuf {
    let text = format!(
        "[job]\nname = \"{name}\"\nparallelism = {parallelism}\n\n[checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 200\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{kafka}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\n\n\
         [sink.postgres]\nurl = \"{}\"\ntable = \"{table}\"\nsslmode = \"disable\"\n{sink}\n",
        pg.url("app")
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

fn one(pg: &PgServer, sql: &str) -> String {
    pg.query("app", sql).unwrap()[0][0].clone()
}

/// The windows of the checkpoint protocol after a completed checkpoint, the
/// two-phase kit's among them: `after-stage` (PREPARE TRANSACTION done, the
/// checkpoint not yet published) and `before-part-commit` (published, COMMIT PREPARED
/// not yet run).
const WINDOWS: [&str; 6] = [
    "after-stage",
    "after-sink-flush",
    "before-metadata",
    "after-publish",
    "before-part-commit",
    "after-part-commit",
];

/// For each of [`WINDOWS`], a fresh job and table (`create` makes the table of a
/// name): a first run aborted in the window after a completed checkpoint, then a
/// chaos run from there, SIGKILLed `kills` times at seeded moments and run to the end,
/// whose verifier finds the table exact and nothing of the job prepared. The reports.
fn chaos_in_every_window(
    kafka: &str,
    pg: &PgServer,
    parallelism: u16,
    create: &str,
    sink: &str,
    kills: u32,
) -> Vec<serde_json::Value> {
    let tmp = tempfile::tempdir().unwrap();
    let mut reports = Vec::new();
    // A batch (at most 1024 records) per source subtask per 500 ms: a run killed at
    // most 900 ms after its start hands over at most two batches a subtask, so the job
    // outlasts its kills.
    let slow = "source-batch=sleep(500)";
    for (i, window) in WINDOWS.iter().enumerate() {
        let table = format!("out_{i}");
        pg.query("app", &create.replace("{table}", &table)).unwrap();
        let dir = tmp.path().join(window);
        std::fs::create_dir_all(&dir).unwrap();
        let config = job_at(&dir, &format!("w{i}"), parallelism, kafka, pg, &table, sink);
        let log = dir.join("abort.log");
        let mut child = std::process::Command::new(common::bin())
            .args(["run", "--config"])
            .arg(&config)
            .env("LOCKGATE_FAILPOINTS", format!("{slow};{window}@1=exit"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let status = common::wait_timeout(&mut child, common::wait::DEADLINE);
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            !status.success() && text.contains(&format!("failpoint {window}: exit")),
            "{window}: the first run did not abort there ({status}): {}",
            common::tail(&text, 10)
        );
        let (code, out, r) = common::chaos(
            &config,
            &[
                "--kills",
                &kills.to_string(),
                "--seed",
                &(i + 1).to_string(),
                "--failpoints",
                slow,
                "--failpoint-runs",
                &kills.to_string(),
                "--kill-after-ms",
                "300..900",
            ],
        );
        assert_eq!(code, Some(0), "{window}: {out}");
        assert_eq!(r["kills"], kills, "{window}: {out}");
        for k in ["missing", "duplicated", "wrong"] {
            assert_eq!(r["verdict"][k], 0, "{window}: {k}: {out}");
        }
        reports.push(r);
    }
    reports
}

#[test]
fn inserts_under_thirty_kills_and_every_window_are_each_input_exactly_once() {
    let kafka = KafkaProcess::start(&[("orders", 2)]);
    lockgate::testkit::kafka::produce_orders(&kafka.bootstrap, "orders", 0, 20_000, 500).unwrap();
    let pg = server();
    let reports = chaos_in_every_window(
        &kafka.bootstrap,
        &pg,
        1,
        "CREATE TABLE {table} (\"order\" bigint NOT NULL, \"user\" text NOT NULL, amount integer NOT NULL)",
        "mode = \"insert\"",
        5,
    );
    for (i, r) in reports.iter().enumerate() {
        assert_eq!(r["verdict"]["documents"], 20_000, "{r}");
        let distinct = one(
            &pg,
            &format!("SELECT count(DISTINCT \"order\") FROM out_{i}"),
        );
        assert_eq!(distinct, "20000");
    }
    assert_eq!(one(&pg, "SELECT count(*) FROM pg_prepared_xacts"), "0");
}

#[test]
fn upserts_of_hot_keys_at_parallelism_two_under_kills_and_every_window_leave_each_keys_last_record()
{
    // 40 users over 40,000 orders: every epoch rewrites the keys of the one before. Two
    // subtasks, so that restores commit and roll back each old subtask's share.
    let kafka = KafkaProcess::start(&[("orders", 2)]);
    lockgate::testkit::kafka::produce_orders(&kafka.bootstrap, "orders", 0, 40_000, 40).unwrap();
    let pg = server();
    let reports = chaos_in_every_window(
        &kafka.bootstrap,
        &pg,
        2,
        "CREATE TABLE {table} (\"user\" text PRIMARY KEY, \"order\" bigint, amount numeric(12,2), seen timestamptz DEFAULT now())",
        "mode = \"upsert\"\nkey = [\"user\"]\ncolumns = { user = \"/user\", order = \"/order\", amount = \"/amount\" }",
        3,
    );
    for r in reports {
        assert_eq!(r["verdict"]["expected_documents"], 40, "{r}");
        assert_eq!(r["verdict"]["documents"], 40, "{r}");
    }
}

#[test]
fn a_server_restart_mid_run_is_ridden_out_exactly() {
    let kafka = KafkaProcess::start(&[("orders", 2)]);
    lockgate::testkit::kafka::produce_orders(&kafka.bootstrap, "orders", 0, 20_000, 500).unwrap();
    let mut pg = server();
    pg.query(
        "app",
        "CREATE TABLE orders (\"order\" bigint PRIMARY KEY, \"user\" text, amount integer)",
    )
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let config = job(
        tmp.path(),
        "restart",
        &kafka.bootstrap,
        &pg,
        "orders",
        "mode = \"insert\"\nconnect_timeout_ms = 60000",
    );
    // In-process restarts from the last checkpoint, while the server is away.
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "strategy = \"none\"",
        "strategy = \"fixed-delay\"\nattempts = 20\ndelay_ms = 500",
    );
    std::fs::write(&config, text).unwrap();
    let log = config.with_extension("log");
    let mut child = std::process::Command::new(common::bin())
        .args(["run", "--config"])
        .arg(&config)
        .env("LOCKGATE_FAILPOINTS", "source-batch=sleep(100)")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // Restart the server once rows are committed, mid-stream.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let n: i64 = one(&pg, "SELECT count(*) FROM orders").parse().unwrap();
        if n > 0 {
            assert!(n < 20_000, "the job wrote everything before the restart");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no rows committed");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    pg.restart().unwrap();
    let status = common::wait_timeout(&mut child, common::wait::DEADLINE);
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{}", common::tail(&log_text, 30));
    // A primary key on the order: a row written twice would have failed the job.
    assert_eq!(one(&pg, "SELECT count(*) FROM orders"), "20000");
    assert_eq!(one(&pg, "SELECT count(*) FROM pg_prepared_xacts"), "0");
}

/// Orders 0..10 with order 3's amount text and order 6's negative (refused by a CHECK
/// the database alone knows).
fn produce_bad_orders(kafka: &KafkaProcess) {
    let rows: Vec<String> = (0..10)
        .map(|i| {
            let amount = match i {
                3 => "\"lots\"".to_string(),
                6 => "-5".to_string(),
                _ => (i * 10).to_string(),
            };
            format!(
                "{{\"order\":{i},\"user\":\"user-{}\",\"amount\":{amount}}}",
                ["a", "b", "c"][i % 3]
            )
        })
        .collect();
    let payloads: Vec<&[u8]> = rows.iter().map(|r| r.as_bytes()).collect();
    common::kafka::produce_raw(&kafka.bootstrap, "orders", 0, &payloads);
}

#[test]
fn a_value_that_does_not_fit_fails_the_job_naming_the_record_and_the_column() {
    let kafka = KafkaProcess::start(&[("orders", 1)]);
    produce_bad_orders(&kafka);
    let pg = server();
    pg.query(
        "app",
        "CREATE TABLE orders (\"order\" bigint, \"user\" text, amount integer CHECK (amount >= 0))",
    )
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let config = job(
        tmp.path(),
        "fail",
        &kafka.bootstrap,
        &pg,
        "orders",
        "mode = \"insert\"",
    );
    let (code, log) = common::run_config(&config);
    assert_ne!(code, Some(0), "{log}");
    assert!(
        log.contains("orders/0@3") && log.contains("column `amount`") && log.contains("`lots`"),
        "{}",
        common::tail(&log, 20)
    );
    assert_eq!(
        one(&pg, "SELECT count(*) FROM orders"),
        "0",
        "nothing committed"
    );
}

#[test]
fn refused_rows_are_dead_lettered_with_the_reason_and_the_rest_is_written() {
    let kafka = KafkaProcess::start(&[("orders", 1), ("dlq", 1)]);
    produce_bad_orders(&kafka);
    let pg = server();
    pg.query(
        "app",
        "CREATE TABLE orders (\"order\" bigint PRIMARY KEY, \"user\" text, amount integer CHECK (amount >= 0))",
    )
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let config = job(
        tmp.path(),
        "dlq",
        &kafka.bootstrap,
        &pg,
        "orders",
        "mode = \"upsert\"\nkey = [\"order\"]\non_item_error = \"dead-letter:dlq\"",
    );
    let (code, log) = common::run_config(&config);
    assert_eq!(code, Some(0), "{}", common::tail(&log, 20));
    assert_eq!(
        one(
            &pg,
            "SELECT string_agg(\"order\"::text, ',' ORDER BY \"order\") FROM orders"
        ),
        "0,1,2,4,5,7,8,9"
    );
    // Two subtasks (records are keyed by order before the sink): in either order.
    let letters = dead_letters(&kafka.bootstrap, 2);
    let letter = |order: &str| {
        letters
            .iter()
            .find(|(p, _)| String::from_utf8_lossy(p).contains(&format!("\"order\":{order},")))
            .unwrap_or_else(|| panic!("no letter of order {order}: {letters:?}"))
    };
    let (_, headers) = letter("3");
    assert!(
        headers["lockgate.error"].contains("column `amount`"),
        "{headers:?}"
    );
    assert_eq!(headers["lockgate.offset"], "3");
    let (_, headers) = letter("6");
    // The database's own refusal, found by writing the statement's rows one at a time.
    assert!(
        headers["lockgate.error"].contains("check constraint"),
        "{headers:?}"
    );
}

/// The first `n` letters of the `dlq` topic: payloads and headers.
fn dead_letters(
    bootstrap: &str,
    n: usize,
) -> Vec<(Vec<u8>, std::collections::HashMap<String, String>)> {
    use rdkafka::consumer::Consumer;
    use rdkafka::message::Message;
    let c = common::kafka::consumer(bootstrap, "dlq-reader");
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset("dlq", 0, rdkafka::Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let start = std::time::Instant::now();
    let mut out = Vec::new();
    while out.len() < n {
        assert!(
            start.elapsed() < common::wait::DEADLINE,
            "{} letters",
            out.len()
        );
        if let Some(m) = c.poll(std::time::Duration::from_millis(200)) {
            let m = m.unwrap().detach();
            out.push((
                m.payload().unwrap_or_default().to_vec(),
                common::kafka::headers_of(&m),
            ));
        }
    }
    out
}

#[test]
fn tombstones_delete_the_committed_row_their_key_names() {
    let kafka = KafkaProcess::start(&[("orders", 1)]);
    let rows = [
        br#"{"order":1,"user":"user-a","amount":1}"#.as_slice(),
        br#"{"order":2,"user":"user-b","amount":2}"#.as_slice(),
        br#"{"order":3,"user":"user-c","amount":3}"#.as_slice(),
    ];
    common::kafka::produce_raw(&kafka.bootstrap, "orders", 0, &rows);
    let pg = server();
    pg.query(
        "app",
        "CREATE TABLE totals (\"user\" text PRIMARY KEY, amount integer)",
    )
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let config = job(
        tmp.path(),
        "deletes",
        &kafka.bootstrap,
        &pg,
        "totals",
        "mode = \"upsert\"\nkey = [\"user\"]\ncolumns = { user = \"/user\", amount = \"/amount\" }",
    );
    let (code, log) = common::run_config(&config);
    assert_eq!(code, Some(0), "{}", common::tail(&log, 20));
    assert_eq!(
        one(
            &pg,
            "SELECT string_agg(\"user\", ',' ORDER BY \"user\") FROM totals"
        ),
        "user-a,user-b,user-c"
    );
    // Two tombstones, one keyed by plain text, one by a JSON string (as a JSON
    // converter writes a string key), read by a run of its own (a bounded job stops
    // where the topic ended when it first started): the rows they delete are committed.
    produce_tombstone(&kafka.bootstrap, "orders", "user-b");
    produce_tombstone(&kafka.bootstrap, "orders", "\"user-c\"");
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("dir = \"checkpoints\"", "dir = \"checkpoints-2\"");
    std::fs::write(&config, text).unwrap();
    let (code, log) = common::run_config(&config);
    assert_eq!(code, Some(0), "{}", common::tail(&log, 20));
    assert_eq!(
        one(&pg, "SELECT string_agg(\"user\", ',') FROM totals"),
        "user-a"
    );
}

fn produce_tombstone(bootstrap: &str, topic: &str, key: &str) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let p: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    p.send(BaseRecord::<str, [u8]>::to(topic).key(key)).unwrap();
    p.flush(std::time::Duration::from_secs(30)).unwrap();
}

#[test]
fn what_the_sink_cannot_write_into_is_refused_at_open_naming_it() {
    let kafka = KafkaProcess::start(&[("orders", 1)]);
    produce_bad_orders(&kafka);
    let pg = server();
    pg.query(
        "app",
        "CREATE TABLE orders (\"order\" bigint, \"user\" text)",
    )
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        (
            "nosuch",
            "mode = \"insert\"",
            "table `nosuch` does not exist",
        ),
        (
            "orders",
            "mode = \"insert\"\ncolumns = { order = \"/order\", amount = \"/amount\" }",
            "has no column `amount`",
        ),
        (
            "orders",
            "mode = \"upsert\"\nkey = [\"order\"]",
            "needs a primary key or unique index on (order)",
        ),
    ];
    for (i, (table, sink, want)) in cases.iter().enumerate() {
        let config = job(
            tmp.path(),
            &format!("refused{i}"),
            &kafka.bootstrap,
            &pg,
            table,
            sink,
        );
        let (code, log) = common::run_config(&config);
        assert_ne!(code, Some(0), "{log}");
        assert!(log.contains(want), "{want}: {}", common::tail(&log, 10));
    }
    // A server that refuses prepared transactions: two-phase cannot run on it.
    let off = PgServer::start(PgOptions {
        max_prepared_transactions: 0,
        ..PgOptions::default()
    })
    .unwrap();
    off.create_database("app").unwrap();
    off.query(
        "app",
        "CREATE TABLE orders (\"order\" bigint, \"user\" text, amount integer)",
    )
    .unwrap();
    let config = job(
        tmp.path(),
        "noprepared",
        &kafka.bootstrap,
        &off,
        "orders",
        "mode = \"insert\"",
    );
    let (code, log) = common::run_config(&config);
    assert_ne!(code, Some(0), "{log}");
    assert!(
        log.contains("max_prepared_transactions = 0")
            && log.contains("set max_prepared_transactions"),
        "{}",
        common::tail(&log, 10)
    );
}

/// A prepared transaction keeps its row locks until COMMIT PREPARED, and the next
/// epoch may write the same key: its statement waits on a commit that the sink's own
/// task makes when its notification arrives, which it cannot read while it waits. The
/// writer watches the job's completed checkpoints and commits at once.
#[test]
fn a_write_waiting_on_the_previous_epochs_row_lock_commits_it_when_its_checkpoint_completes() {
    use lockgate::connector::{CheckpointId, Record, SinkRestore, SubtaskInfo};
    let pg = server();
    pg.query("app", "CREATE TABLE t (k text PRIMARY KEY, v integer)")
        .unwrap();
    let body = format!(
        "url = \"{}\"\ntable = \"t\"\nsslmode = \"disable\"\nmode = \"upsert\"\nkey = [\"k\"]\nbatch_max_rows = 1",
        pg.url("app")
    );
    let spec = lockgate::testkit::conformance::sink_from_section(
        &lockgate::builtin::registry(),
        "postgres",
        &body,
        Path::new("/"),
    )
    .unwrap();
    let telemetry = lockgate::telemetry::Telemetry::default();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut sink = (spec.factory)(0);
        let info = SubtaskInfo::new("j", "sink-0", 0, 1).with_telemetry(telemetry.clone());
        sink.open(&info, &SinkRestore::default()).await.unwrap();
        let rec = |v: i32| Record::from_value(format!("{{\"k\":\"a\",\"v\":{v}}}").into_bytes());
        sink.invoke(vec![rec(1)]).await.unwrap();
        sink.snapshot(CheckpointId(1)).await.unwrap();
        // Checkpoint 1 completes half a second later; its notification never comes
        // while the write below waits.
        let t = telemetry.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            t.checkpoint_completed(1, 0, 0, "chk-1");
        });
        tokio::time::timeout(
            std::time::Duration::from_secs(30),
            sink.invoke(vec![rec(2)]),
        )
        .await
        .expect("the write waited on the prepared transaction's lock for good")
        .unwrap();
        // The late notification finds checkpoint 1 committed.
        sink.notify_checkpoint_complete(CheckpointId(1))
            .await
            .unwrap();
        sink.snapshot(CheckpointId(2)).await.unwrap();
        sink.notify_checkpoint_complete(CheckpointId(2))
            .await
            .unwrap();
        sink.close().await.unwrap();
    });
    assert_eq!(one(&pg, "SELECT v FROM t WHERE k = 'a'"), "2");
    assert_eq!(one(&pg, "SELECT count(*) FROM pg_prepared_xacts"), "0");
}

/// Drives the sink of `body` (after its `url`) directly, as the runtime does: each
/// batch of JSON records, then a checkpoint (snapshot, completion, notification).
fn drive(pg: &PgServer, body: &str, batches: &[&[&str]]) {
    use lockgate::connector::{CheckpointId, Record, SinkRestore, SubtaskInfo};
    let body = format!("url = \"{}\"\nsslmode = \"disable\"\n{body}", pg.url("app"));
    let spec = lockgate::testkit::conformance::sink_from_section(
        &lockgate::builtin::registry(),
        "postgres",
        &body,
        Path::new("/"),
    )
    .unwrap();
    let telemetry = lockgate::telemetry::Telemetry::default();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut sink = (spec.factory)(0);
        let info = SubtaskInfo::new("j", "sink-0", 0, 1).with_telemetry(telemetry.clone());
        sink.open(&info, &SinkRestore::default()).await.unwrap();
        for (i, batch) in batches.iter().enumerate() {
            let records = batch
                .iter()
                .map(|r| Record::from_value(r.as_bytes().to_vec()))
                .collect();
            sink.invoke(records).await.unwrap();
            let id = CheckpointId(i as u64 + 1);
            sink.snapshot(id).await.unwrap();
            telemetry.checkpoint_completed(id.0, 0, 0, "chk");
            sink.notify_checkpoint_complete(id).await.unwrap();
        }
        sink.close().await.unwrap();
    });
}

#[test]
fn fixed_length_keys_identity_columns_and_numeric_spellings_name_their_rows() {
    let pg = server();
    pg.query(
        "app",
        "CREATE TABLE t (id bigint GENERATED BY DEFAULT AS IDENTITY, code char(4) PRIMARY KEY, \
                         n numeric, flags bit(4)); \
         CREATE TABLE m (k numeric PRIMARY KEY, v integer)",
    )
    .unwrap();
    // A record without `id` takes the identity's next value; an upsert of the same code
    // keeps it (the INSERT draws a value before it finds the conflict: ids have gaps);
    // char(4) keeps its four characters, bit(4) its four bits.
    drive(
        &pg,
        "table = \"t\"\nmode = \"upsert\"\nkey = [\"code\"]",
        &[
            &[r#"{"code":"abcd","n":1.50,"flags":"1010"}"#],
            &[
                r#"{"code":"abcd","n":2,"flags":"0110"}"#,
                r#"{"code":"wxyz","n":3}"#,
            ],
        ],
    );
    assert_eq!(
        pg.query("app", "SELECT code, n, flags FROM t ORDER BY code")
            .unwrap(),
        vec![
            vec!["abcd".to_string(), "2".into(), "0110".into()],
            vec!["wxyz".to_string(), "3".into(), String::new()],
        ]
    );
    assert_eq!(one(&pg, "SELECT id FROM t WHERE code = 'abcd'"), "1");
    // `1.0` and `1` are one numeric key: a batch writing both leaves one row, the last
    // record's (in one statement they would be refused as one row written twice).
    drive(
        &pg,
        "table = \"m\"\nmode = \"upsert\"\nkey = [\"k\"]",
        &[&[r#"{"k":1.0,"v":1}"#, r#"{"k":1,"v":2}"#, r#"{"k":2,"v":3}"#]],
    );
    assert_eq!(
        pg.query("app", "SELECT k::text, v FROM m ORDER BY k")
            .unwrap(),
        vec![
            vec!["1".to_string(), "2".into()],
            vec!["2".to_string(), "3".into()]
        ]
    );
}

#[test]
fn jsonb_column_holds_the_whole_record_beside_its_key() {
    let pg = server();
    pg.query(
        "app",
        "CREATE TABLE docs (id text PRIMARY KEY, doc jsonb NOT NULL)",
    )
    .unwrap();
    drive(
        &pg,
        "table = \"docs\"\nmode = \"upsert\"\nkey = [\"id\"]\njsonb_column = \"doc\"",
        &[
            &[r#"{"id":"a","n":1,"big":123456789012345678901234567890}"#],
            &[r#"{"id":"a","n":2,"tags":["x","y"]}"#],
        ],
    );
    assert_eq!(
        one(&pg, "SELECT doc::text FROM docs WHERE id = 'a'"),
        r#"{"n": 2, "id": "a", "tags": ["x", "y"]}"#
    );
}

/// A Debezium change event as its JsonConverter writes it with schemas (the
/// PostgreSQL connector's default `time.precision.mode = adaptive`): a `date` column is
/// `io.debezium.time.Date` (days), a `timestamp(6)` a `MicroTimestamp`, a `numeric`
/// without scale a `VariableScaleDecimal`.
fn debezium_event(id: i64, days: i64, micros: i64, amount_b64: &str) -> String {
    let fields = serde_json::json!([
        {"field": "id", "type": "int64"},
        {"field": "day", "type": "int32", "optional": true, "name": "io.debezium.time.Date", "version": 1},
        {"field": "at", "type": "int64", "optional": true, "name": "io.debezium.time.MicroTimestamp", "version": 1},
        {"field": "amount", "type": "struct", "optional": true, "name": "io.debezium.data.VariableScaleDecimal",
         "version": 1, "fields": [{"field": "scale", "type": "int32"}, {"field": "value", "type": "bytes"}]}
    ]);
    serde_json::json!({
        "schema": {"type": "struct", "name": "db.public.orders.Envelope", "fields": [
            {"field": "before", "type": "struct", "optional": true, "fields": fields},
            {"field": "after", "type": "struct", "optional": true, "fields": fields},
            {"field": "op", "type": "string"}
        ]},
        "payload": {"before": null, "op": "c", "after": {
            "id": id, "day": days, "at": micros, "amount": {"scale": 2, "value": amount_b64}}}
    })
    .to_string()
}

/// Debezium's days and microseconds reach `date` and `timestamp(6)` columns as the
/// days and instants they count (19844 days is 2024-05-01, not 1970-01-01), before
/// 1970 too, and a VariableScaleDecimal its exact digits.
#[test]
fn debezium_dates_and_micro_timestamps_are_written_as_the_days_and_instants_they_count() {
    let kafka = KafkaProcess::start(&[("orders", 1)]);
    // 1230 (0x04CE) and -1230 (0xFB32) at scale 2.
    let events = [
        debezium_event(1, 19_844, 1_714_566_896_789_012, "BM4="),
        debezium_event(2, -3_653, -1, "+zI="),
    ];
    let payloads: Vec<&[u8]> = events.iter().map(|e| e.as_bytes()).collect();
    debezium_rows_are_the_days_and_instants(&kafka, &payloads, "debezium-times", "");
}

/// Produces `payloads` (the two events of the Debezium tests) to `orders`, runs
/// `kafka -> debezium -> postgres upsert` (`source_extra` added to the source, `sink_extra` to the
/// sink), and asserts the rows as `psql` prints them.
fn debezium_rows_are_the_days_and_instants(
    kafka: &KafkaProcess,
    payloads: &[&[u8]],
    name: &str,
    source_extra: &str,
) {
    common::kafka::produce_raw(&kafka.bootstrap, "orders", 0, payloads);
    let pg = server();
    pg.query(
        "app",
        "CREATE TABLE orders (id bigint PRIMARY KEY, day date, at timestamp(6), amount numeric)",
    )
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let config = job(
        tmp.path(),
        name,
        &kafka.bootstrap,
        &pg,
        "orders",
        "mode = \"upsert\"\nkey = [\"id\"]\n\n[[transform]]\ntype = \"debezium\"",
    );
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "bounded = \"latest\"\n",
        &format!("bounded = \"latest\"\n{source_extra}"),
    );
    std::fs::write(&config, text).unwrap();
    let (code, log) = common::run_config(&config);
    assert_eq!(code, Some(0), "{}", common::tail(&log, 20));
    let rows = pg
        .query(
            "app",
            "SELECT id::text, day::text, at::text, amount::text FROM orders ORDER BY orders.id",
        )
        .unwrap();
    assert_eq!(
        rows,
        vec![
            vec!["1", "2024-05-01", "2024-05-01 12:34:56.789012", "12.30"],
            vec!["2", "1960-01-01", "1969-12-31 23:59:59.999999", "-12.30"],
        ]
    );
}

/// A bare number for a `date` column is refused by the item error policy (here
/// dead-lettered with the reason), never written in a unit guessed for it.
#[test]
fn a_bare_number_for_a_date_column_is_dead_lettered_not_written() {
    let kafka = KafkaProcess::start(&[("orders", 1), ("dlq", 1)]);
    let rows = [
        br#"{"id":1,"day":19844}"#.as_slice(),
        br#"{"id":2,"day":"2024-05-01"}"#.as_slice(),
    ];
    common::kafka::produce_raw(&kafka.bootstrap, "orders", 0, &rows);
    let pg = server();
    pg.query("app", "CREATE TABLE days (id bigint PRIMARY KEY, day date)")
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let config = job(
        tmp.path(),
        "bare-number",
        &kafka.bootstrap,
        &pg,
        "days",
        "mode = \"insert\"\non_item_error = \"dead-letter:dlq\"",
    );
    let (code, log) = common::run_config(&config);
    assert_eq!(code, Some(0), "{}", common::tail(&log, 20));
    assert_eq!(
        pg.query("app", "SELECT id::text, day::text FROM days ORDER BY id")
            .unwrap(),
        vec![vec!["2", "2024-05-01"]]
    );
    let letters = dead_letters(&kafka.bootstrap, 1);
    assert_eq!(letters[0].0, rows[0]);
    let why = &letters[0].1["lockgate.error"];
    assert!(
        why.contains("column `day`") && why.contains("bare number"),
        "{why}"
    );
}

/// The same through Avro and the Schema Registry: Debezium's AvroConverter names each
/// type in its field's `connect.name`, and the rows hold the days, instants and digits.
#[test]
fn debezium_avro_dates_and_micro_timestamps_are_written_as_the_days_and_instants_they_count() {
    use apache_avro::types::Value as Avro;
    let kafka = KafkaProcess::start(&[("orders", 1)]);
    let registry = common::confluent::RegistryProcess::start_on("127.0.0.1:0");
    let schema = r#"{"type": "record", "name": "Envelope", "namespace": "db.public.orders",
      "connect.name": "db.public.orders.Envelope", "fields": [
        {"name": "before", "type": ["null", {"type": "record", "name": "Value", "fields": [
          {"name": "id", "type": "long"},
          {"name": "day", "type": ["null", {"type": "int", "connect.version": 1, "connect.name": "io.debezium.time.Date"}], "default": null},
          {"name": "at", "type": ["null", {"type": "long", "connect.version": 1, "connect.name": "io.debezium.time.MicroTimestamp"}], "default": null},
          {"name": "amount", "type": ["null", {"type": "record", "name": "VariableScaleDecimal", "namespace": "io.debezium.data",
            "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}],
            "connect.version": 1, "connect.name": "io.debezium.data.VariableScaleDecimal"}], "default": null}],
          "connect.name": "db.public.orders.Value"}], "default": null},
        {"name": "after", "type": ["null", "Value"], "default": null},
        {"name": "op", "type": "string"}]}"#;
    let registered: serde_json::Value = reqwest::blocking::Client::new()
        .post(format!("{}/subjects/orders-value/versions", registry.url))
        .header("Content-Type", "application/vnd.schemaregistry.v1+json")
        .json(&serde_json::json!({ "schema": schema }))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let id = registered["id"].as_u64().expect("a schema id") as u32;
    let parsed = apache_avro::Schema::parse_str(schema).unwrap();
    let event = |row: i64, days: i32, micros: i64, unscaled: &[u8]| {
        let after = Avro::Record(vec![
            ("id".into(), Avro::Long(row)),
            ("day".into(), Avro::Union(1, Box::new(Avro::Int(days)))),
            ("at".into(), Avro::Union(1, Box::new(Avro::Long(micros)))),
            (
                "amount".into(),
                Avro::Union(
                    1,
                    Box::new(Avro::Record(vec![
                        ("scale".into(), Avro::Int(2)),
                        ("value".into(), Avro::Bytes(unscaled.to_vec())),
                    ])),
                ),
            ),
        ]);
        let value = Avro::Record(vec![
            ("before".into(), Avro::Union(0, Box::new(Avro::Null))),
            ("after".into(), Avro::Union(1, Box::new(after))),
            ("op".into(), Avro::String("c".into())),
        ]);
        let mut framed = vec![0];
        framed.extend_from_slice(&id.to_be_bytes());
        framed.extend(apache_avro::to_avro_datum(&parsed, value).unwrap());
        framed
    };
    let events = [
        event(1, 19_844, 1_714_566_896_789_012, &[0x04, 0xce]),
        event(2, -3_653, -1, &[0xfb, 0x32]),
    ];
    let payloads: Vec<&[u8]> = events.iter().map(Vec::as_slice).collect();
    debezium_rows_are_the_days_and_instants(
        &kafka,
        &payloads,
        "debezium-avro-times",
        &format!(
            "format = \"avro\"\n\n[source.kafka.schema_registry]\nurl = \"{}\"\n",
            registry.url
        ),
    );
}
