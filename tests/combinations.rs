//! The loader's combinations, walked: values that change silently lived where features
//! meet (a format's decimals through transforms, Debezium's times into Postgres,
//! window keys into ids), so each class of combination is tested end to end here or
//! where the table says, or refused at load.
//!
//! | source format | transforms | operator | sink | class | where |
//! |---|---|---|---|---|---|
//! | JSON | every SMT, `filter`, `jq`, `debezium` | none | file, ES (test server, osmem), Postgres upsert (`numeric`), Kafka | a number's text through transforms into each sink | `tests/exact_numbers.rs`, `src/transforms/exact_numbers.rs` |
//! | Avro (`schema_file`, decimals of scale 0, 2 and 21) | `insert_field` + `jq` | `window` (sum, min, max) by a key of mixed JSON types | file | a format's decimal through transforms into an operator's aggregates and ids | `avro_decimals_through_transforms_into_windows_keep_their_digits` |
//! | JSON with schemas (Connect `Decimal`) | `insert_field` + `jq` | `rolling_sum` | file | the same through a rolling sum | `connect_decimals_through_transforms_into_a_rolling_sum_keep_their_digits` |
//! | Avro, Protobuf, JSON Schema (Confluent's serializers) | none | none, `rolling_sum` | ES | a format's decimal (exact text, scale kept) into the index; the chaos run of a rolling sum over Avro | `tests/schema_registry_formats.rs` |
//! | JSON with schemas (Debezium's `io.debezium.time.*`, `VariableScaleDecimal`) | `debezium` | none | Postgres (`date`, `timestamp`, `numeric`), ES | Debezium's semantic types | `tests/cdc.rs`, `tests/postgres_sink.rs` |
//! | any | any | `window`, `rolling_sum` | ES by `field:/window_id` or `field:/<key>`, Kafka by key | a key is its text: one state, one id | `tests/windows.rs` (`keys_of_different_json_types_with_one_text_are_one_key`), the combined run below, `src/operators/rolling_sum.rs` |
//! | any | any | `window`, `rolling_sum` | Postgres upsert by a key column of a numeric type | the column compares by value (`1` and `1.0` one row), the key by text | refused when the sink opens (`connectors::postgres::table` tests) |
//! | any | any | any | ES `operation = "upsert"` | Elasticsearch rewrites a merged document's numbers itself | documented; `index` keeps them |
//! | any | any | `window` | ES by coordinates, external versions | results have no source coordinates | refused at load (`tests/windows.rs`) |
//! | any | `jq` with several outputs | any | Kafka (a repartition stage) | outputs share their coordinates | refused at load unless `max_outputs = 1` |
//! | any | any | any | ES with `pipeline` and deletes (tombstones, CDC deletes, session deletes) | a rerouting pipeline makes a delete miss | refused at load unless `pipeline_reroutes = false` (`tests/es_routing.rs`) |
//! | any | any | any | ES with external versions, a refused record and a later write of its document | a replayed 409 hid the refused record | one write per document per request (`tests/es_dead_letters.rs`) |
//! | Kafka `on_topic_recreated = "restart"` | any | any | ES data stream, ids by coordinates or external versions | offsets restart at 0 and collide with the old topic's documents | refused at load (`tests/es_routing.rs`) |
//!
//! A number becomes a double only where something computes one (`cast` to a float, jq
//! arithmetic, `avg`): the README lists each place.

mod common;

use common::kafka::{produce_raw, KafkaProcess};
use common::{run_config, tail};
use std::path::Path;

const BIG: &str = "12345678901234567890123456789012345678";
const TINY: &str = "-0.000000000000000000001";

fn run(dir: &Path, name: &str, source: &str, steps: &str) -> Vec<String> {
    let text = format!(
        "[job]\nname = \"{name}\"\nparallelism = 2\n\n[checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 200\n\n\
         [restart]\nstrategy = \"none\"\n\n{source}\n\n\
         [[transform]]\ntype = \"insert_field\"\noffset_field = \"offset\"\n\n\
         [[transform]]\ntype = \"jq\"\nfilter = \".\"\n\n{steps}\n\n[sink.file]\ndir = \"out\"\n"
    );
    let config = dir.join("job.toml");
    std::fs::write(&config, text).unwrap();
    let (code, log) = run_config(&config);
    assert_eq!(code, Some(0), "{}", tail(&log, 30));
    common::committed_lines_in(&dir.join("out"))
}

/// A decimal's unscaled value as Avro's bytes (big-endian two's complement).
fn unscaled(v: i128) -> apache_avro::Decimal {
    apache_avro::Decimal::from(v.to_be_bytes().to_vec())
}

#[test]
fn avro_decimals_through_transforms_into_windows_keep_their_digits() {
    use apache_avro::types::Value as Avro;
    let tmp = tempfile::tempdir().unwrap();
    let schema_text = r#"{"type":"record","name":"Order","fields":[
        {"name":"user","type":["string","long"]},
        {"name":"ts","type":"long"},
        {"name":"big","type":{"type":"bytes","logicalType":"decimal","precision":38,"scale":0}},
        {"name":"price","type":{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}},
        {"name":"tiny","type":{"type":"bytes","logicalType":"decimal","precision":30,"scale":21}}]}"#;
    std::fs::write(tmp.path().join("order.avsc"), schema_text).unwrap();
    let schema = apache_avro::Schema::parse_str(schema_text).unwrap();
    let big: i128 = BIG.parse().unwrap();
    // User 1 as the string "1" twice and the number 1 once, in one minute.
    let users = [
        Avro::Union(0, Box::new(Avro::String("1".into()))),
        Avro::Union(1, Box::new(Avro::Long(1))),
        Avro::Union(0, Box::new(Avro::String("1".into()))),
    ];
    let payloads: Vec<Vec<u8>> = users
        .into_iter()
        .enumerate()
        .map(|(i, user)| {
            let v = Avro::Record(vec![
                ("user".into(), user),
                ("ts".into(), Avro::Long(1_767_225_600_000 + i as i64 * 1000)),
                ("big".into(), Avro::Decimal(unscaled(big - i as i128))),
                ("price".into(), Avro::Decimal(unscaled(150))),
                ("tiny".into(), Avro::Decimal(unscaled(-1))),
            ]);
            apache_avro::to_avro_datum(&schema, v).unwrap()
        })
        .collect();
    let kafka = KafkaProcess::start(&[("orders", 1)]);
    let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    produce_raw(&kafka.bootstrap, "orders", 0, &refs);
    let source = format!(
        "[source.kafka]\nbootstrap_servers = \"{}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\n\
         format = \"avro\"\nschema_file = \"order.avsc\"\n\n\
         [source.kafka.watermark]\ntimestamp = \"/ts\"\nmax_out_of_orderness_ms = 1000",
        kafka.bootstrap
    );
    let window = "[[transform]]\ntype = \"window\"\nkind = \"tumbling\"\nsize_ms = 60000\nkey = \"/user\"\n\
                  aggregates = { orders = \"count\", spent = \"sum:/price\", biggest = \"max:/big\", smallest = \"min:/big\", least = \"min:/tiny\" }";
    let lines = run(tmp.path(), "avro-windows", &source, window);
    assert_eq!(lines.len(), 1, "one window of one key: {lines:?}");
    let line = &lines[0];
    for want in [
        r#""key":"1""#.to_string(),
        r#""orders":3"#.to_string(),
        r#""spent":4.50"#.to_string(),
        format!(r#""biggest":{BIG}"#),
        format!(r#""smallest":{}"#, big - 2),
        format!(r#""least":{TINY}"#),
    ] {
        assert!(line.contains(&want), "{want} in {line}");
    }
}

#[test]
fn connect_decimals_through_transforms_into_a_rolling_sum_keep_their_digits() {
    use base64::Engine;
    let tmp = tempfile::tempdir().unwrap();
    let b64 = |v: i128| {
        let bytes = v.to_be_bytes();
        // The shortest two's complement, as Connect writes it.
        let skip = bytes
            .windows(2)
            .take_while(|w| (w[0] == 0 && w[1] & 0x80 == 0) || (w[0] == 0xff && w[1] & 0x80 != 0))
            .count();
        base64::engine::general_purpose::STANDARD.encode(&bytes[skip..])
    };
    let schema = r#"{"type":"struct","fields":[{"field":"user","type":"string"},{"field":"price","type":"bytes","name":"org.apache.kafka.connect.data.Decimal","parameters":{"scale":"2"}},{"field":"tiny","type":"bytes","name":"org.apache.kafka.connect.data.Decimal","parameters":{"scale":"21"}}]}"#;
    let envelope = |user: &str, cents: i128| {
        format!(
            r#"{{"schema":{schema},"payload":{{"user":{user},"price":"{}","tiny":"{}"}}}}"#,
            b64(cents),
            b64(-1)
        )
        .into_bytes()
    };
    let payloads = [
        envelope(r#""7""#, 150),
        envelope(r#""7""#, 225),
        envelope(r#""7""#, 1),
    ];
    let kafka = KafkaProcess::start(&[("orders", 1)]);
    let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    produce_raw(&kafka.bootstrap, "orders", 0, &refs);
    let source = format!(
        "[source.kafka]\nbootstrap_servers = \"{}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\n\
         format = \"json\"\nconnect_envelope = true",
        kafka.bootstrap
    );
    let sum = "[[transform]]\ntype = \"rolling_sum\"\nkey = \"/user\"\nfield = \"/price\"\noutput = \"/total\"";
    let mut lines = run(tmp.path(), "connect-sum", &source, sum);
    lines.sort_by_key(|l| {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        v["offset"].as_i64().unwrap()
    });
    let totals: Vec<String> = lines
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            assert!(l.contains(&format!(r#""tiny":{TINY}"#)), "{l}");
            v["total"].to_string()
        })
        .collect();
    // 1.50, then 1.50 + 2.25, then + 0.01: exact, with the inputs' scale.
    assert_eq!(totals, ["1.50", "3.75", "3.76"]);
}

/// 2026-01-01T00:00:00Z.
const T0: i64 = 1_767_225_600_000;
const EVENTS: i64 = 16_000;
const IDS: i64 = 600;
const PARTITIONS: i32 = 4;

/// Event `i`: a Debezium change of row `i % IDS` (on partition `id % PARTITIONS`)
/// with a `DATE` (days), a `timestamp(6)` (microseconds), a 38-digit decimal of scale
/// 2, and a user that is the number `i % 7` in even events and the string `"<i % 7>"`
/// in odd ones (two schemas of one table, as after an `ALTER COLUMN ... TYPE`).
struct Event {
    id: i64,
    day: i64,
    micros: i64,
    unscaled: i128,
    user: i64,
    user_is_text: bool,
}

impl Event {
    fn of(i: i64) -> Event {
        Event {
            id: i % IDS,
            // 2024-05-01 is day 19844; days before 1970 too (down to 1925).
            day: 19_844 - (i % 9_000) * 4,
            micros: 1_714_566_896_123_456 + i * 1_000_001 - 2_000_000_000_000_000 * (i % 2),
            unscaled: 12_345_678_901_234_567_890_123_456_789_012_345_678 - i128::from(i) * 7,
            user: i % 7,
            user_is_text: i % 2 == 1,
        }
    }

    fn partition(&self) -> i32 {
        (self.id % i64::from(PARTITIONS)) as i32
    }

    fn json(&self) -> Vec<u8> {
        use base64::Engine;
        let user_type = if self.user_is_text { "string" } else { "int64" };
        let user = if self.user_is_text {
            format!("\"{}\"", self.user)
        } else {
            self.user.to_string()
        };
        let row = format!(
            r#"{{"type":"struct","optional":true,"name":"shop.public.orders.Value","fields":[{{"field":"id","type":"int64"}},{{"field":"day","type":"int32","name":"io.debezium.time.Date","version":1}},{{"field":"at","type":"int64","name":"io.debezium.time.MicroTimestamp","version":1}},{{"field":"amount","type":"bytes","name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{{"scale":"2"}}}},{{"field":"user","type":"{user_type}"}}]}}"#
        );
        let schema = format!(
            r#"{{"type":"struct","name":"shop.public.orders.Envelope","fields":[{{"field":"before","type":"struct","optional":true,"fields":[]}},{{"field":"after",{}}},{{"field":"op","type":"string"}},{{"field":"ts_ms","type":"int64","optional":true}}]}}"#,
            &row[1..row.len() - 1]
        );
        let amount = base64::engine::general_purpose::STANDARD.encode(self.unscaled.to_be_bytes());
        format!(
            r#"{{"schema":{schema},"payload":{{"before":null,"after":{{"id":{},"day":{},"at":{},"amount":"{amount}","user":{user}}},"op":"c","ts_ms":1}}}}"#,
            self.id, self.day, self.micros
        )
        .into_bytes()
    }

    /// The row's cells as Postgres prints them: `date`, `timestamp(6)`, `numeric`.
    fn cells(&self) -> Vec<String> {
        let day = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).unwrap()
            + chrono::TimeDelta::days(self.day);
        let at = chrono::DateTime::from_timestamp_micros(self.micros)
            .unwrap()
            .naive_utc();
        let digits = self.unscaled.to_string();
        let (whole, cents) = digits.split_at(digits.len() - 2);
        vec![
            self.id.to_string(),
            day.format("%Y-%m-%d").to_string(),
            at.format("%Y-%m-%d %H:%M:%S.%6f").to_string(),
            format!("{whole}.{cents}"),
        ]
    }
}

fn produce_events(bootstrap: &str) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let p: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "20")
        .set("compression.type", "lz4")
        .create()
        .unwrap();
    for i in 0..EVENTS {
        let e = Event::of(i);
        let payload = e.json();
        let key = format!(r#"{{"id":{}}}"#, e.id);
        loop {
            let r = BaseRecord::to("cdc")
                .partition(e.partition())
                .key(&key)
                .payload(&payload)
                .timestamp(T0 + i * 50);
            match p.send(r) {
                Ok(()) => break,
                Err((_, _)) => {
                    p.poll(std::time::Duration::from_millis(50));
                }
            }
        }
        p.poll(std::time::Duration::ZERO);
    }
    p.flush(std::time::Duration::from_secs(60)).unwrap();
}

/// Starts `config` and SIGKILLs it `kills` times at seeded moments (each run after
/// the first resumes from its last checkpoint), then runs it to its end; asserts that
/// kills landed while the job ran.
fn run_under_kills(config: &Path, kills: usize, seed: u64) {
    use std::process::{Command, Stdio};
    let log = config.with_file_name("kills.log");
    let mut state = seed;
    let mut next = |n: u64| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % n
    };
    for _ in 0..kills {
        let mut run = Command::new(common::bin())
            .args(["run", "--config"])
            .arg(config)
            .env("LOCKGATE_FAILPOINTS", "source-batch=sleep(300)")
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .unwrap(),
            )
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200 + next(600)));
        common::sigkill(&mut run);
    }
    let (code, out) = run_config(config);
    assert_eq!(code, Some(0), "{}", tail(&out, 30));
    let text = std::fs::read_to_string(&log).unwrap();
    let before_end = text.split("job finished").next().unwrap_or_default();
    let landed = before_end.matches("job starting").count();
    assert!(
        landed >= 5,
        "the job finished after {landed} runs, before five kills landed (seed {seed}):\n{}",
        tail(&text, 20)
    );
}

fn cdc_job(dir: &Path, name: &str, bootstrap: &str, rest: &str) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let text = format!(
        "[job]\nname = \"{name}\"\nparallelism = 2\n\n[checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 200\n\n\
         [restart]\nstrategy = \"none\"\n\n\
         [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"cdc\"]\nbounded = \"latest\"\n\
         format = \"json\"\nconnect_envelope = true\n\n\
         [[transform]]\ntype = \"debezium\"\n\n{rest}\n"
    );
    let path = dir.join("job.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Debezium JSON with schemas (dates, micro-timestamps, 38-digit decimals) ->
/// `debezium` -> `insert_field` -> Postgres upsert, and the same topic -> a window
/// count keyed by a field of mixed JSON types -> Elasticsearch, each through 20
/// SIGKILLs: the table and the index equal a plain computation of the input, read
/// back with `psql` and Elasticsearch's API.
#[test]
fn debezium_types_into_postgres_and_mixed_keys_into_windows_are_exact_under_twenty_kills() {
    use lockgate::testkit::postgres::{PgOptions, PgServer};
    let tmp = tempfile::tempdir().unwrap();
    let kafka = KafkaProcess::start(&[("cdc", PARTITIONS)]);
    produce_events(&kafka.bootstrap);

    // Into Postgres: each row its last event.
    let pg = PgServer::start(PgOptions::default()).expect("a PostgreSQL server");
    pg.create_database("app").unwrap();
    pg.query(
        "app",
        "CREATE TABLE orders (id bigint PRIMARY KEY, day date, at timestamp(6), amount numeric, \"user\" text, source text)",
    )
    .unwrap();
    let config = cdc_job(
        &tmp.path().join("pg"),
        "cdc-to-postgres",
        &kafka.bootstrap,
        &format!(
            "[[transform]]\ntype = \"insert_field\"\nstatic = {{ source = \"cdc\" }}\n\n\
             [sink.postgres]\nurl = \"{}\"\ntable = \"orders\"\nsslmode = \"disable\"\nmode = \"upsert\"\nkey = [\"id\"]\n",
            pg.url("app")
        ),
    );
    run_under_kills(&config, 20, 45);
    let mut want: std::collections::BTreeMap<i64, Vec<String>> = Default::default();
    for i in 0..EVENTS {
        let e = Event::of(i);
        let mut cells = e.cells();
        cells.push(e.user.to_string());
        cells.push("cdc".into());
        want.insert(e.id, cells);
    }
    let got = pg
        .query(
            "app",
            "SELECT id::text, day::text, to_char(at, 'YYYY-MM-DD HH24:MI:SS.US'), amount::text, \"user\", source FROM orders ORDER BY orders.id",
        )
        .unwrap();
    assert_eq!(got.len(), want.len(), "rows");
    for (row, (_, cells)) in got.iter().zip(&want) {
        assert_eq!(row, cells);
    }

    // Into Elasticsearch: orders per user per minute, "3" and 3 one user.
    let es = common::es::Es::testkit();
    let config = cdc_job(
        &tmp.path().join("es"),
        "cdc-windows",
        &kafka.bootstrap,
        &format!(
            "[[transform]]\ntype = \"window\"\nkind = \"tumbling\"\nsize_ms = 60000\nkey = \"/user\"\n\
             aggregates = {{ orders = \"count\", spent = \"sum:/amount\" }}\n\n\
             [sink.elasticsearch]\nurl = \"{}\"\nindex = \"windows\"\nid = \"field:/window_id\"\n\
             bulk_flush_interval_ms = 100\nretry_initial_ms = 20\nretry_max_ms = 500\nretry_max_attempts = 1000\n",
            es.url()
        ),
    );
    // Windows need event time: the Kafka timestamps.
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "connect_envelope = true\n",
        "connect_envelope = true\n\n[source.kafka.watermark]\nmax_out_of_orderness_ms = 1000\n",
    );
    std::fs::write(&config, text).unwrap();
    run_under_kills(&config, 20, 46);
    let mut windows: std::collections::BTreeMap<String, (u64, bigdecimal::BigDecimal)> =
        Default::default();
    for i in 0..EVENTS {
        let e = Event::of(i);
        let t = T0 + i * 50;
        let start = t - t.rem_euclid(60_000);
        let w = windows.entry(format!("{}@{start}", e.user)).or_default();
        w.0 += 1;
        w.1 += bigdecimal::BigDecimal::new(e.unscaled.into(), 2);
    }
    let docs = es.documents("windows");
    assert_eq!(docs.len(), windows.len(), "windows");
    for (id, (orders, spent)) in windows {
        let doc = docs.get(&id).unwrap_or_else(|| panic!("no window {id}"));
        assert_eq!(doc["orders"], serde_json::json!(orders), "{id}: {doc}");
        // Exact, with the amounts' scale (two).
        assert_eq!(
            doc["spent"].to_string(),
            spent.to_plain_string(),
            "{id}: {doc}"
        );
    }
}
