//! Event time and windows through real processes: an out-of-order Kafka input over
//! four partitions (one of them idle), counted per user per minute by a tumbling
//! window into Elasticsearch (`id = "field:/window_id"`). Each result is compared
//! with what the test computes from the input itself, in a plain run, and under 20
//! SIGKILLs across a rescale of its members from 2 to 3 (`--rescale-from 2`). Then
//! an idle partition that holds windows back until `idle_timeout_ms` lets them go,
//! a late record under each `late` policy, and hopping windows and sessions emitted
//! on every change, each exact under ten SIGKILLs.

mod common;

use common::es::Es;
use common::kafka::{first_dead_letter, produce_raw, KafkaProcess};
use common::telemetry::{get_json, url_from_log, Scrape};
use common::{bin, run_config, sigkill, signal, tail, wait, wait_timeout};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOPIC: &str = "clicks";
/// Partitions of the topic; the last one never gets a record.
const PARTITIONS: i32 = 4;
const ACTIVE: i32 = 3;
/// 2026-01-01T00:00:00Z: windows of a minute start on the minute.
const T0: i64 = 1_767_225_600_000;
const MINUTE: i64 = 60_000;
/// How far out of order a partition's timestamps go (below the job's bound).
const DISORDER_MS: i64 = 4_000;

/// One input record.
#[derive(Debug, Clone)]
struct Click {
    partition: i32,
    user: String,
    amount: i64,
    ts: i64,
}

impl Click {
    fn payload(&self) -> Vec<u8> {
        serde_json::to_vec(&json!({"user": self.user, "amount": self.amount, "ts": self.ts}))
            .unwrap()
    }
}

/// `per_partition` clicks on each active partition, 100 ms apart from `from_ms` after
/// `T0` on, each up to `DISORDER_MS` early; users are partitioned (user `u<k>` only
/// ever on partition `k % ACTIVE`), as a co-partitioned job needs.
fn clicks(per_partition: i64, from_ms: i64, seed: u64) -> Vec<Click> {
    let mut next = seeded(seed);
    let mut out = Vec::new();
    for p in 0..ACTIVE {
        for j in 0..per_partition {
            let k = next(8) as i32 * ACTIVE + p;
            out.push(Click {
                partition: p,
                user: format!("u{k}"),
                amount: next(100) as i64,
                ts: T0 + from_ms + j * 100 - next(DISORDER_MS as u64) as i64,
            });
        }
    }
    out
}

/// A deterministic generator: `next(n)` is in `0..n` (a linear congruential one, so
/// that the same seed gives the same input and the same kill schedule).
fn seeded(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut state = seed;
    move |n| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % n
    }
}

fn produce(bootstrap: &str, clicks: &[Click]) {
    for p in 0..ACTIVE {
        let payloads: Vec<Vec<u8>> = clicks
            .iter()
            .filter(|c| c.partition == p)
            .map(Click::payload)
            .collect();
        let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
        produce_raw(bootstrap, TOPIC, p, &refs);
    }
}

/// The windows a plain computation gets: per user and minute, the clicks, the sum of
/// their amounts and the largest, keyed by `<user>@<window start>`. Windows that end
/// after `until` are left out (no watermark passes them).
fn expected(clicks: &[Click], until: i64) -> BTreeMap<String, Value> {
    let mut w: BTreeMap<(String, i64), (i64, i64, i64)> = BTreeMap::new();
    for c in clicks {
        let start = c.ts - c.ts.rem_euclid(MINUTE);
        let e = w.entry((c.user.clone(), start)).or_insert((0, 0, i64::MIN));
        e.0 += 1;
        e.1 += c.amount;
        e.2 = e.2.max(c.amount);
    }
    w.into_iter()
        .filter(|((_, start), _)| start + MINUTE <= until)
        .map(|((user, start), (n, sum, max))| {
            let id = format!("{user}@{start}");
            let doc = json!({"key": user, "window_start": start, "window_end": start + MINUTE,
                "window_id": id, "orders": n, "amount": sum, "biggest": max});
            (id, doc)
        })
        .collect()
}

/// What a job file adds to each section of the common one.
#[derive(Default)]
struct Extra<'a> {
    job: &'a str,
    source: &'a str,
    watermark: &'a str,
    window: &'a str,
    /// The window's kind and span (a tumbling minute when absent).
    kind: Option<&'a str>,
}

/// A `kafka -> window -> elasticsearch` job file at parallelism `p`.
fn job(dir: &Path, bootstrap: &str, es: &str, p: u16, x: &Extra) -> PathBuf {
    let text = format!(
        "[job]\nname = \"windows\"\nparallelism = {p}\n{}\n\n\
         [checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 200\n\n\
         [restart]\nstrategy = \"none\"\n\n[metrics]\nlisten = \"127.0.0.1:0\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"{TOPIC}\"]\n{}\n\n\
         [source.kafka.watermark]\ntimestamp = \"/ts\"\nmax_out_of_orderness_ms = 5000\n{}\n\n\
         [[transform]]\ntype = \"window\"\n{}\nkey = \"/user\"\n\
         aggregates = {{ orders = \"count\", amount = \"sum:/amount\", biggest = \"max:/amount\" }}\n{}\n\n\
         [sink.elasticsearch]\nurl = \"{es}\"\nindex = \"windows\"\nid = \"field:/window_id\"\n\
         bulk_flush_interval_ms = 100\nretry_initial_ms = 20\nretry_max_ms = 500\nretry_max_attempts = 1000\n",
        x.job,
        x.source,
        x.watermark,
        x.kind.unwrap_or("kind = \"tumbling\"\nsize_ms = 60000"),
        x.window
    );
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("job.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Waits until the index holds exactly `want`, or fails showing the difference.
fn wait_exact(es: &Es, want: &BTreeMap<String, Value>, what: &str, logs: &dyn Fn() -> String) {
    let deadline = Instant::now() + wait::DEADLINE;
    loop {
        let got = es.documents("windows");
        if &got == want {
            return;
        }
        if Instant::now() > deadline {
            let missing: Vec<&String> = want.keys().filter(|k| !got.contains_key(*k)).collect();
            let extra: Vec<&String> = got.keys().filter(|k| !want.contains_key(*k)).collect();
            let wrong: Vec<(&String, &Value, &Value)> = want
                .iter()
                .filter_map(|(k, v)| got.get(k).filter(|g| *g != v).map(|g| (k, v, g)))
                .take(5)
                .collect();
            panic!(
                "{what}: {} windows expected, {} found; missing {:?}, extra {:?}, wrong (want, got) {wrong:?}\n{}",
                want.len(),
                got.len(),
                &missing[..missing.len().min(5)],
                &extra[..extra.len().min(5)],
                logs()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn an_out_of_order_input_with_an_idle_partition_is_counted_per_user_per_minute_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[(TOPIC, PARTITIONS)]);
    let input = clicks(3_000, 0, 7);
    produce(&kafka.bootstrap, &input);
    let es = Es::testkit();
    let bounded = Extra {
        source: "bounded = \"latest\"",
        ..Extra::default()
    };
    let config = job(tmp.path(), &kafka.bootstrap, &es.url(), 2, &bounded);
    let (code, log) = run_config(&config);
    assert_eq!(code, Some(0), "{}", tail(&log, 30));
    // The end of the bounded input fires every window, the last ones included.
    let want = expected(&input, i64::MAX);
    assert!(want.len() > 100, "{} windows", want.len());
    assert_eq!(es.documents("windows"), want);
    // A second run from the final checkpoint (a bounded job stops at the ends it
    // captured at its first start) adds nothing and changes nothing.
    let (code, log) = run_config(&config);
    assert_eq!(code, Some(0), "{}", tail(&log, 30));
    assert_eq!(es.documents("windows"), want);
}

/// `lockgate run --config <config> <args>`, its stderr appended to `log`.
fn spawn_run(config: &Path, args: &[&str], log: &Path) -> Child {
    Command::new(bin())
        .args(["run", "--config"])
        .arg(config)
        .args(args)
        .stdout(Stdio::null())
        .stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .unwrap(),
        )
        .spawn()
        .unwrap()
}

/// SIGTERM: the run completes a final checkpoint and exits 0.
fn stop(mut run: Child, log: &Path) {
    signal(&run, libc::SIGTERM);
    let status = wait_timeout(&mut run, Duration::from_secs(60));
    assert!(
        status.success(),
        "{status}\n{}",
        tail(&std::fs::read_to_string(log).unwrap_or_default(), 30)
    );
}

/// One member process of `count`, logging beside the job file.
fn member(config: &Path, index: u16, count: u16, extra: &[&str]) -> Child {
    let log = config.with_file_name(format!("member-{index}-of-{count}.log"));
    let (i, n) = (index.to_string(), count.to_string());
    let mut args = vec!["--member", &i, "--members", &n];
    args.extend_from_slice(extra);
    spawn_run(config, &args, &log)
}

fn member_logs(config: &Path) -> String {
    let mut out = String::new();
    for entry in std::fs::read_dir(config.parent().unwrap()).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "log") {
            out.push_str(&format!(
                "--- {} ---\n{}\n",
                p.display(),
                tail(&std::fs::read_to_string(&p).unwrap_or_default(), 15)
            ));
        }
    }
    out
}

/// Kills a random member `kills` times, `300..1500` ms apart (seeded), starting it
/// again each time with the same arguments.
fn kill_members(
    config: &Path,
    members: &mut [Child],
    count: u16,
    extra: &[&str],
    kills: usize,
    seed: u64,
) {
    let mut next = seeded(seed);
    for _ in 0..kills {
        std::thread::sleep(Duration::from_millis(300 + next(1_200)));
        let i = next(u64::from(count)) as usize;
        sigkill(&mut members[i]);
        members[i] = member(config, i as u16, count, extra);
    }
}

/// SIGTERM: each member completes a final checkpoint and exits 0.
fn stop_members(config: &Path, members: Vec<Child>) {
    for m in &members {
        signal(m, libc::SIGTERM);
    }
    for mut m in members {
        let status = wait_timeout(&mut m, Duration::from_secs(60));
        assert!(status.success(), "{status}\n{}", member_logs(config));
    }
}

#[test]
fn windows_are_exact_under_twenty_kills_and_a_rescale_of_members_from_two_to_three() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[(TOPIC, PARTITIONS)]);
    let es = Es::testkit();
    let members = Extra {
        job: "co_partitioned = true",
        // Long enough that a partition being fetched again after a restart is not
        // taken for idle (its records would then be late).
        watermark: "idle_timeout_ms = 10000",
        ..Extra::default()
    };
    let config = job(tmp.path(), &kafka.bootstrap, &es.url(), 1, &members);
    // The first half of the input: 20 minutes of each partition, read by two members
    // under ten SIGKILLs, then stopped with final checkpoints (open windows kept).
    let first = clicks(12_000, 0, 11);
    produce(&kafka.bootstrap, &first);
    let mut two: Vec<Child> = (0..2).map(|i| member(&config, i, 2, &[])).collect();
    kill_members(&config, &mut two, 2, &[], 10, 3);
    std::thread::sleep(Duration::from_secs(3));
    stop_members(&config, two);
    // The second half, read by three members taking the state of both
    // (`--rescale-from 2`) under ten more SIGKILLs; then, the stream live, one record
    // per partition 40 minutes on passes the watermark beyond every window of the
    // input. (Watermarks start again from each partition's next record after a
    // restore: windows restored from a checkpoint fire when records come.)
    let second = clicks(12_000, 20 * MINUTE, 12);
    produce(&kafka.bootstrap, &second);
    let rescale = ["--rescale-from", "2"];
    let mut three: Vec<Child> = (0..3).map(|i| member(&config, i, 3, &rescale)).collect();
    kill_members(&config, &mut three, 3, &rescale, 10, 4);
    let far: Vec<Click> = (0..ACTIVE)
        .map(|p| Click {
            partition: p,
            user: format!("zz{p}"),
            amount: 0,
            ts: T0 + 60 * MINUTE,
        })
        .collect();
    produce(&kafka.bootstrap, &far);
    let all: Vec<Click> = first.iter().chain(&second).cloned().collect();
    let want = expected(&all, T0 + 60 * MINUTE - 5_000);
    assert!(want.len() > 500, "{} windows", want.len());
    wait_exact(
        &es,
        &want,
        "after 20 kills and a rescale from 2 to 3 members",
        &|| member_logs(&config),
    );
    stop_members(&config, three);
}

#[test]
fn an_idle_partition_holds_windows_back_until_its_idle_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[(TOPIC, PARTITIONS)]);
    let es = Es::testkit();
    let config = job(
        tmp.path(),
        &kafka.bootstrap,
        &es.url(),
        2,
        &Extra::default(),
    );
    // Five minutes on the active partitions, and one record each ten minutes on.
    let far = |minutes: i64| -> Vec<Click> {
        (0..ACTIVE)
            .map(|p| Click {
                partition: p,
                user: format!("zz{p}"),
                amount: 0,
                ts: T0 + minutes * MINUTE,
            })
            .collect()
    };
    let mut input = clicks(3_000, 0, 5);
    input.extend(far(10));
    produce(&kafka.bootstrap, &input);
    // Without an idle timeout, the partition without records holds every window.
    let log = config.with_file_name("run.log");
    let run = spawn_run(&config, &[], &log);
    // Every record read: the group offsets are committed after a checkpoint.
    wait::until("every record read", wait::DEADLINE, || {
        common::kafka::committed(&kafka.bootstrap, "lockgate-windows", TOPIC, ACTIVE)
            .iter()
            .all(|o| *o == Some(3_001))
    });
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(es.documents("windows").len(), 0, "no window fired");
    stop(run, &log);
    // With one, the windows fire once it passed: restored from the final checkpoint,
    // which holds every record in its windows, the watermark moves again with the
    // next records (one more per active partition, eleven minutes on).
    let idle = Extra {
        watermark: "idle_timeout_ms = 1000",
        ..Extra::default()
    };
    job(tmp.path(), &kafka.bootstrap, &es.url(), 2, &idle);
    let run = spawn_run(&config, &[], &log);
    let more = far(11);
    produce(&kafka.bootstrap, &more);
    input.extend(more);
    let want = expected(&input, T0 + 11 * MINUTE - 5_000);
    assert!(want.len() > 50, "{} windows", want.len());
    wait_exact(&es, &want, "after the idle timeout", &|| {
        tail(&std::fs::read_to_string(&log).unwrap_or_default(), 30)
    });
    stop(run, &log);
}

/// A record of `user` at `ms` after `T0` on partition 0.
fn one(user: &str, ms: i64) -> Vec<u8> {
    serde_json::to_vec(&json!({"user": user, "amount": 1, "ts": T0 + ms})).unwrap()
}

/// Fires `a`'s first minute, sends a late record of it, then fires `b`'s second
/// minute (read after the late one): the document of `a`'s first minute afterwards,
/// and the job's metrics and operators then.
fn late_record(window: &str, bootstrap: &str, es: &Es, dir: &Path) -> (Value, Scrape, Value) {
    let x = Extra {
        window,
        ..Extra::default()
    };
    let config = job(dir, bootstrap, &es.url(), 1, &x);
    let log = config.with_file_name("run.log");
    let run = spawn_run(&config, &[], &log);
    produce_raw(
        bootstrap,
        TOPIC,
        0,
        &[&one("a", 1_000), &one("a", 2_000), &one("x", 70_000)],
    );
    let first = format!("a@{T0}");
    wait::until("a's first minute fired", wait::DEADLINE, || {
        es.documents("windows").contains_key(&first)
    });
    produce_raw(
        bootstrap,
        TOPIC,
        0,
        &[&one("a", 3_000), &one("b", 75_000), &one("y", 200_000)],
    );
    let second = format!("b@{}", T0 + MINUTE);
    wait::until("b's minute fired", wait::DEADLINE, || {
        es.documents("windows").contains_key(&second)
    });
    let base = url_from_log(&log);
    let scrape = Scrape::take(&base);
    let operators = get_json(&base, "/api/v1/operators");
    stop(run, &log);
    (es.documents("windows")[&first].clone(), scrape, operators)
}

#[test]
fn a_late_record_is_dropped_dead_lettered_or_updates_its_window_per_policy() {
    let tmp = tempfile::tempdir().unwrap();
    // One partition each: the late record is read after the watermark passed.
    let topics = [(TOPIC, 1), ("late-clicks", 1)];
    for (policy, window, orders) in [
        ("drop", "late = \"drop\"", 2),
        ("dead-letter", "late = \"dead-letter:late-clicks\"", 2),
        (
            "update",
            "late = \"update\"\nallowed_lateness_ms = 600000",
            3,
        ),
    ] {
        let kafka = KafkaProcess::start(&topics);
        let es = Es::testkit();
        let (doc, metrics, operators) =
            late_record(window, &kafka.bootstrap, &es, &tmp.path().join(policy));
        assert_eq!(doc["orders"], json!(orders), "{policy}: {doc}");
        let outcome = match policy {
            "drop" => "dropped",
            "dead-letter" => "dead_lettered",
            _ => "updated",
        };
        let late = metrics.series("lockgate_late_records_total", &[("operator", "window-0")]);
        let counted: BTreeMap<String, f64> = late.into_iter().filter(|(_, v)| *v > 0.0).collect();
        assert_eq!(
            counted,
            BTreeMap::from([(format!("job=windows,outcome={outcome},subtask=0"), 1.0)]),
            "{policy}: the late record counted once, as {outcome}"
        );
        // y at 200 s passed the watermark to 195 s (its bound is 5 s), on the
        // partition and in the window operator.
        let at = (T0 + 195_000) as f64 / 1000.0;
        let marks = metrics.series("lockgate_watermark_timestamp_seconds", &[]);
        assert_eq!(
            marks.get(&format!(
                "job=windows,operator=source,partition=0,subtask=0,topic={TOPIC}"
            )),
            Some(&at),
            "{marks:?}"
        );
        assert_eq!(
            marks.get("job=windows,operator=window-0,partition=,subtask=0,topic="),
            Some(&at),
            "{marks:?}"
        );
        // a's, x's and b's minutes, and a's again when a late record updates it.
        let fired = if policy == "update" { 4.0 } else { 3.0 };
        assert_eq!(
            metrics.one("lockgate_windows_fired_total", &[("operator", "window-0")]),
            fired
        );
        // The status page's view: the window's watermark and its lag behind the
        // clock (the input is of January 2026: months).
        let window = operators
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["operator"] == "window-0")
            .unwrap_or_else(|| panic!("{operators}"));
        assert_eq!(window["watermark_ms"], json!(T0 + 195_000));
        assert!(
            window["watermark_lag_seconds"].as_f64().unwrap() > 86_400.0,
            "{window}"
        );
        if policy == "dead-letter" {
            let (payload, headers) = first_dead_letter(&kafka.bootstrap, "late-clicks");
            assert_eq!(payload, one("a", 3_000), "the late record itself");
            let error = &headers["lockgate.error"];
            assert!(error.contains("late: its event time"), "{error}");
        }
    }
}

#[test]
fn sessions_emitted_on_every_change_merge_and_leave_one_document_per_session() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[(TOPIC, 1)]);
    let es = Es::testkit();
    let x = Extra {
        kind: Some("kind = \"session\"\ngap_ms = 2000"),
        window: "emit = \"update\"",
        ..Extra::default()
    };
    let config = job(tmp.path(), &kafka.bootstrap, &es.url(), 1, &x);
    let log = config.with_file_name("run.log");
    let run = spawn_run(&config, &[], &log);
    let ids = |es: &Es| -> Vec<String> { es.documents("windows").into_keys().collect() };
    let id = |ms: i64| format!("a@{}", T0 + ms);
    // Two sessions, [1000, 3000) and [5000, 7000), each emitted as it changes.
    produce_raw(
        &kafka.bootstrap,
        TOPIC,
        0,
        &[&one("a", 1_000), &one("a", 5_000)],
    );
    wait::until("two sessions", wait::DEADLINE, || {
        ids(&es) == [id(1_000), id(5_000)]
    });
    // 3500 joins the second, which now starts at 3500: a@5000 is deleted.
    produce_raw(&kafka.bootstrap, TOPIC, 0, &[&one("a", 3_500)]);
    wait::until("the second session moved", wait::DEADLINE, || {
        ids(&es) == [id(1_000), id(3_500)]
    });
    // 2500 bridges both: one session [1000, 7000) of four records, under the first's id.
    produce_raw(&kafka.bootstrap, TOPIC, 0, &[&one("a", 2_500)]);
    wait::until("one session", wait::DEADLINE, || ids(&es) == [id(1_000)]);
    let doc = &es.documents("windows")[&id(1_000)];
    assert_eq!(doc["orders"], json!(4), "{doc}");
    assert_eq!(doc["window_end"], json!(T0 + 7_000), "{doc}");
    stop(run, &log);
}

/// Runs `config` under `kills` SIGKILLs `100..700` ms apart (seeded), then to its end.
fn run_under_kills(config: &Path, kills: usize, seed: u64) {
    let log = config.with_file_name("kills.log");
    let mut next = seeded(seed);
    for _ in 0..kills {
        let mut run = spawn_run(config, &[], &log);
        std::thread::sleep(Duration::from_millis(100 + next(600)));
        sigkill(&mut run);
    }
    let (code, out) = run_config(config);
    assert_eq!(code, Some(0), "{}", tail(&out, 30));
    // The kills landed while the job ran: a run started again before any finished.
    let text = std::fs::read_to_string(&log).unwrap();
    let before_end = text.split("job finished").next().unwrap_or_default();
    assert!(
        before_end.matches("job starting").count() >= 2,
        "the first run finished before it was killed:\n{}",
        tail(&text, 20)
    );
}

/// Clicks on the three active partitions only (every partition moves the watermark,
/// so windows fire while the job runs and is killed).
fn active_topic() -> KafkaProcess {
    KafkaProcess::start(&[(TOPIC, ACTIVE)])
}

#[test]
fn hopping_windows_are_exact_under_ten_kills() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = active_topic();
    let input = clicks(60_000, 0, 21);
    produce(&kafka.bootstrap, &input);
    let es = Es::testkit();
    let x = Extra {
        source: "bounded = \"latest\"",
        kind: Some("kind = \"hopping\"\nsize_ms = 60000\nslide_ms = 20000"),
        ..Extra::default()
    };
    let config = job(tmp.path(), &kafka.bootstrap, &es.url(), 2, &x);
    run_under_kills(&config, 10, 5);
    // Per user, every window of a minute starting on each 20 s that holds a click.
    let mut w: BTreeMap<(String, i64), (i64, i64, i64)> = BTreeMap::new();
    for c in &input {
        let last = c.ts - c.ts.rem_euclid(20_000);
        for start in [last - 40_000, last - 20_000, last] {
            let e = w.entry((c.user.clone(), start)).or_insert((0, 0, i64::MIN));
            e.0 += 1;
            e.1 += c.amount;
            e.2 = e.2.max(c.amount);
        }
    }
    let want: BTreeMap<String, Value> = w
        .into_iter()
        .map(|((user, start), (n, sum, max))| {
            let id = format!("{user}@{start}");
            let doc = json!({"key": user, "window_start": start, "window_end": start + MINUTE,
                "window_id": id, "orders": n, "amount": sum, "biggest": max});
            (id, doc)
        })
        .collect();
    assert_eq!(es.documents("windows"), want);
}

#[test]
fn sessions_emitted_on_every_change_are_exact_under_ten_kills() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = active_topic();
    // Clicks spread twice as far (a user every 1.6 s on average, up to 8 s out of
    // order, within the job's 10 s bound), so that sessions of a 2 s gap open, merge
    // and close all along.
    let mut input = clicks(40_000, 0, 31);
    for c in &mut input {
        c.ts = T0 + (c.ts - T0) * 2;
    }
    produce(&kafka.bootstrap, &input);
    let es = Es::testkit();
    let x = Extra {
        source: "bounded = \"latest\"",
        kind: Some("kind = \"session\"\ngap_ms = 2000"),
        window: "emit = \"update\"",
        ..Extra::default()
    };
    let config = job(tmp.path(), &kafka.bootstrap, &es.url(), 2, &x);
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "max_out_of_orderness_ms = 5000",
        "max_out_of_orderness_ms = 10000",
    );
    std::fs::write(&config, text).unwrap();
    run_under_kills(&config, 10, 6);
    // Per user, in time order: a click within the gap of a session's end extends it.
    let mut by_user: BTreeMap<String, Vec<&Click>> = BTreeMap::new();
    for c in &input {
        by_user.entry(c.user.clone()).or_default().push(c);
    }
    let mut want = BTreeMap::new();
    for (user, mut cs) in by_user {
        cs.sort_by_key(|c| c.ts);
        let mut sessions: Vec<(i64, i64, Vec<&Click>)> = Vec::new();
        for c in cs {
            match sessions.last_mut() {
                Some((_, end, members)) if c.ts <= *end => {
                    *end = (*end).max(c.ts + 2_000);
                    members.push(c);
                }
                _ => sessions.push((c.ts, c.ts + 2_000, vec![c])),
            }
        }
        for (start, end, members) in sessions {
            let id = format!("{user}@{start}");
            let doc = json!({"key": user, "window_start": start, "window_end": end, "window_id": id,
                "orders": members.len(), "amount": members.iter().map(|c| c.amount).sum::<i64>(),
                "biggest": members.iter().map(|c| c.amount).max()});
            want.insert(id, doc);
        }
    }
    assert!(want.len() > 1_000, "{} sessions", want.len());
    assert_eq!(es.documents("windows"), want);
}

#[test]
fn a_window_into_elasticsearch_without_ids_of_its_own_is_refused_at_load() {
    let tmp = tempfile::tempdir().unwrap();
    let config = job(
        tmp.path(),
        "127.0.0.1:9",
        "http://127.0.0.1:9",
        1,
        &Extra::default(),
    );
    for (from, to, key) in [
        ("id = \"field:/window_id\"\n", "", "sink.elasticsearch.id"),
        (
            "id = \"field:/window_id\"\n",
            "id = \"field:/window_id\"\nversioning = \"external\"\n",
            "sink.elasticsearch.versioning",
        ),
    ] {
        let text = std::fs::read_to_string(&config).unwrap().replace(from, to);
        let bad = tmp.path().join("bad.toml");
        std::fs::write(&bad, text).unwrap();
        let (code, out) = run_config(&bad);
        assert_eq!(code, Some(2), "{out}");
        assert!(out.contains(key) && out.contains("window"), "{key}: {out}");
    }
}

/// A key is its text: `"1"` twice and `1` once in one minute are one user's three
/// records, counted into one window whose document says 3 (keyed state by the key's
/// JSON bytes and ids by its text once kept two windows writing one document: 1).
#[test]
fn keys_of_different_json_types_with_one_text_are_one_key() {
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[(TOPIC, 1)]);
    let es = Es::testkit();
    let record = |user: Value, ms: i64| {
        format!(r#"{{"user":{user},"amount":1.50,"ts":{}}}"#, T0 + ms).into_bytes()
    };
    produce_raw(
        &kafka.bootstrap,
        TOPIC,
        0,
        &[
            &record(json!("1"), 1_000),
            &record(json!(1), 2_000),
            &record(json!("1"), 3_000),
            &record(json!("x"), 200_000),
        ],
    );
    let x = Extra {
        source: "bounded = \"latest\"",
        ..Extra::default()
    };
    let config = job(tmp.path(), &kafka.bootstrap, &es.url(), 1, &x);
    let (code, log) = run_config(&config);
    assert_eq!(code, Some(0), "{}", tail(&log, 30));
    let docs = es.documents("windows");
    let id = format!("1@{T0}");
    let doc = docs
        .get(&id)
        .unwrap_or_else(|| panic!("no window {id}: {docs:?}"));
    assert_eq!(doc["orders"], json!(3), "{doc}");
    assert_eq!(doc["key"], json!("1"), "{doc}");
    // The sum of three 1.50s is exact, with the inputs' scale.
    assert_eq!(doc["amount"].to_string(), "4.50", "{doc}");
    assert_eq!(doc["biggest"].to_string(), "1.50", "{doc}");
}
