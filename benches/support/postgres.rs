//! The Postgres sink against a plain `COPY` loop into the same table of the same
//! server, in the same run; printed as JSON.
//!
//! A PostgreSQL server of its own (Debian's binaries, `fsync` on, as a real server
//! runs) and one table, `orders (order_id bigint, customer text, amount integer)`,
//! emptied (`TRUNCATE`) before each side of each round. Every side writes the same
//! `ROWS` records, made before the clock starts (`{"order": i, "user": "user-NNNN",
//! "amount": n}`, 50 bytes):
//!
//! - `copy`: the plain loop: the rows as `COPY ... FROM STDIN` text, one `COPY` of
//!   `CHUNK` rows per transaction (what a hand-written loader does);
//! - `two_phase`: the sink (`mode = "insert"`, `exactly_once = "two-phase"`, default
//!   `batch_max_rows`), driven as the runtime drives it: `invoke` with batches of
//!   1024 records, and a checkpoint every second (`snapshot`, which flushes and
//!   prepares, then `notify_checkpoint_complete`, which commits it), then a final one;
//! - `two_phase_one_checkpoint`: the same sink with one checkpoint at the end only,
//!   so that `ratio_checkpoints_1s_over_one` is what preparing and committing every
//!   second costs;
//! - `idempotent`: `mode = "upsert"` by `order_id` (a primary key on a table of its
//!   own), committed at each barrier, with checkpoints every second.
//!
//! Each side's rows are checked (a count) after it. Medians of `ROUNDS` rounds whose
//! order rotates. `sink_ratio` = two_phase / copy (the target: >= 0.8).
//!
//! `cargo bench --bench postgres_sink` (about 2 minutes on 2 cores);
//! `LOCKGATE_BENCH_ROWS` and `LOCKGATE_BENCH_ROUNDS` size it.

use super::{median, round3};
use lockgate::connector::{CheckpointId, Record, SinkRestore, SubtaskInfo};
use lockgate::testkit::postgres::{PgOptions, PgServer};
use serde_json::json;
use std::time::{Duration, Instant};

pub const ROWS: usize = 1_000_000;
pub const ROUNDS: usize = 3;
const BATCH: usize = 1024;
const CHUNK: usize = 5000;

fn records(n: usize) -> Vec<Record> {
    (0..n)
        .map(|i| {
            Record::from_value(
                format!(
                    "{{\"order\":{i},\"user\":\"user-{:04}\",\"amount\":{}}}",
                    (i * 7919) % 5000,
                    1 + (i * 31) % 500
                )
                .into_bytes(),
            )
        })
        .collect()
}

async fn copy_loop(url: &str, rows: &[Record]) -> Duration {
    use futures::SinkExt;
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    let start = Instant::now();
    for chunk in rows.chunks(CHUNK) {
        // The plain loop reads the same JSON records it writes.
        let mut text = String::with_capacity(chunk.len() * 32);
        for r in chunk {
            let v: serde_json::Value = serde_json::from_slice(&r.value).expect("JSON");
            text.push_str(&format!(
                "{}\t{}\t{}\n",
                v["order"],
                v["user"].as_str().expect("user"),
                v["amount"]
            ));
        }
        let sink = client
            .copy_in("COPY orders (order_id, customer, amount) FROM STDIN")
            .await
            .expect("COPY");
        futures::pin_mut!(sink);
        sink.send(bytes::Bytes::from(text))
            .await
            .expect("COPY data");
        sink.finish().await.expect("COPY end");
    }
    start.elapsed()
}

/// The sink of `settings` writing `rows`, a checkpoint every `interval` (None: one at
/// the end).
async fn sink_side(
    pg: &PgServer,
    settings: &str,
    rows: Vec<Record>,
    interval: Option<Duration>,
) -> Duration {
    let body = format!(
        "url = \"{}\"\nsslmode = \"disable\"\ncolumns = {{ order_id = \"/order\", customer = \"/user\", amount = \"/amount\" }}\n{settings}",
        pg.url("bench")
    );
    let spec = lockgate::testkit::conformance::sink_from_section(
        &lockgate::builtin::registry(),
        "postgres",
        &body,
        std::path::Path::new("/"),
    )
    .expect("the sink's section");
    let telemetry = lockgate::telemetry::Telemetry::default();
    let mut sink = (spec.factory)(0);
    let info = SubtaskInfo::new("bench", "sink-0", 0, 1).with_telemetry(telemetry.clone());
    sink.open(&info, &SinkRestore::default())
        .await
        .expect("open");
    let mut batches: Vec<Vec<Record>> = Vec::new();
    let mut rows = rows.into_iter().peekable();
    while rows.peek().is_some() {
        batches.push(rows.by_ref().take(BATCH).collect());
    }
    let start = Instant::now();
    let mut last = Instant::now();
    let mut id = 0;
    for b in batches {
        sink.invoke(b).await.expect("invoke");
        if interval.is_some_and(|i| last.elapsed() >= i) {
            id += 1;
            checkpoint(&mut sink, &telemetry, id).await;
            last = Instant::now();
        }
    }
    id += 1;
    checkpoint(&mut sink, &telemetry, id).await;
    let took = start.elapsed();
    sink.close().await.expect("close");
    took
}

/// Checkpoint `id` as the runtime takes it: the sink's snapshot, the checkpoint
/// published, then the notification.
async fn checkpoint(
    sink: &mut Box<dyn lockgate::connector::Sink>,
    telemetry: &lockgate::telemetry::Telemetry,
    id: u64,
) {
    sink.snapshot(CheckpointId(id)).await.expect("snapshot");
    telemetry.checkpoint_completed(id, 0, 0, "bench");
    sink.notify_checkpoint_complete(CheckpointId(id))
        .await
        .expect("commit");
}

fn count(pg: &PgServer, table: &str) -> usize {
    pg.query("bench", &format!("SELECT count(*) FROM {table}"))
        .expect("count")[0][0]
        .parse()
        .expect("a count")
}

/// Runs every side `rounds` times over `rows` records; the JSON report.
pub fn measure_with(rows: usize, rounds: usize) -> serde_json::Value {
    let started = Instant::now();
    let pg = PgServer::start(PgOptions::default()).expect("a PostgreSQL server");
    pg.create_database("bench").expect("database");
    pg.query(
        "bench",
        "CREATE TABLE orders (order_id bigint, customer text, amount integer); \
         CREATE TABLE orders_by_id (order_id bigint PRIMARY KEY, customer text, amount integer)",
    )
    .expect("tables");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let input = records(rows);
    let sides = [
        "copy",
        "two_phase",
        "two_phase_one_checkpoint",
        "idempotent",
    ];
    let mut secs: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
    let url = pg.url("bench");
    for round in 0..rounds {
        for k in 0..sides.len() {
            let side = (round + k) % sides.len();
            let table = if sides[side] == "idempotent" {
                "orders_by_id"
            } else {
                "orders"
            };
            pg.query("bench", &format!("TRUNCATE {table}; CHECKPOINT"))
                .expect("truncate");
            let rows_in = input.clone();
            let took = rt.block_on(async {
                match sides[side] {
                    "copy" => copy_loop(&url, &rows_in).await,
                    "two_phase" => {
                        sink_side(
                            &pg,
                            "table = \"orders\"\nmode = \"insert\"",
                            rows_in,
                            Some(Duration::from_secs(1)),
                        )
                        .await
                    }
                    "two_phase_one_checkpoint" => {
                        sink_side(&pg, "table = \"orders\"\nmode = \"insert\"", rows_in, None)
                            .await
                    }
                    _ => {
                        sink_side(
                            &pg,
                            "table = \"orders_by_id\"\nmode = \"upsert\"\nkey = [\"order_id\"]\nexactly_once = \"idempotent\"",
                            rows_in,
                            Some(Duration::from_secs(1)),
                        )
                        .await
                    }
                }
            });
            assert_eq!(count(&pg, table), rows, "{} wrote every row", sides[side]);
            eprintln!(
                "round {round} {}: {:.0} rows/s",
                sides[side],
                rows as f64 / took.as_secs_f64()
            );
            secs[side].push(took.as_secs_f64());
        }
    }
    let rate = |s: &Vec<f64>| rows as f64 / median(s.clone());
    let rates: Vec<f64> = secs.iter().map(rate).collect();
    json!({
        "rows": rows,
        "rounds": rounds,
        "rows_per_sec": {
            "copy": rates[0].round(),
            "two_phase": rates[1].round(),
            "two_phase_one_checkpoint": rates[2].round(),
            "idempotent": rates[3].round(),
        },
        "sink_ratio": round3(rates[1] / rates[0]),
        "ratio_checkpoints_1s_over_one": round3(rates[1] / rates[2]),
        "idempotent_ratio": round3(rates[3] / rates[0]),
        "bench_seconds": started.elapsed().as_secs(),
    })
}

/// [`measure_with`] at the default size.
pub fn measure() -> serde_json::Value {
    measure_with(
        super::env_or("LOCKGATE_BENCH_ROWS", ROWS),
        super::env_or("LOCKGATE_BENCH_ROUNDS", ROUNDS),
    )
}
