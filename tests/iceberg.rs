//! The Iceberg sink through real processes, read back by pyiceberg through the same
//! SQL catalog: a warehouse in an object store (moto's S3 server) through SIGKILLs at
//! seeded moments of the checkpoint protocol and a rescale; the example job.

mod common;

use common::lake;
use lockgate::testkit::conformance::process::{seed, KillAt, ProcessJob, KILL_POINTS};
use lockgate::testkit::moto::MotoServer;
use rand::SeedableRng;
use std::path::Path;

const RECORDS: i64 = 6000;

#[test]
fn a_partitioned_table_in_an_object_store_through_kills_and_a_rescale() {
    let moto = MotoServer::start().unwrap();
    moto.create_bucket("lake").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let schema = tmp.path().join("s.avsc");
    std::fs::write(&schema, lake::SEQUENCE_SCHEMA).unwrap();
    let uri = format!("sqlite:///{}", tmp.path().join("catalog.db").display());
    let warehouse = "s3://lake/wh";
    let sink = (
        "iceberg".to_string(),
        format!(
            "catalog = {{ type = \"sql\", name = \"lake\", uri = {uri:?}, warehouse = {warehouse:?} }}\ntable = \"shop.seq\"\nschema_file = {:?}\npartition_by = \"key={{/key}}\"\nroll_bytes = 2048\nendpoint = {:?}\nallow_http = true\nregion = \"us-east-1\"\naccess_key_id = \"testing\"\nsecret_access_key = \"testing\"\n",
            schema.display().to_string(),
            moto.endpoint()
        ),
    );
    let job = ProcessJob::new(&common::bin(), &tmp.path().join("job")).unwrap();
    let source = (
        "sequence".to_string(),
        format!("from = 1\nto = {RECORDS}\nkeys = 4\nrate_per_sec = 3000"),
    );
    job.write_at(2, &source, &sink).unwrap();
    let s = seed(17);
    let mut rng = rand::rngs::StdRng::seed_from_u64(s);
    let mut kills = 0;
    for at in KillAt::schedule(&mut rng, 5, KILL_POINTS) {
        if job.kill_at(at).unwrap_or_else(|e| panic!("seed {s}: {e}")) {
            kills += 1;
        }
    }
    assert!(
        kills >= 3,
        "seed {s}: the kills landed before the end ({kills})"
    );
    let source = (
        source.0,
        format!("from = 1\nto = {RECORDS}\nkeys = 4\nrate_per_sec = 0"),
    );
    job.write_at(3, &source, &sink).unwrap();
    job.run_to_end().unwrap();

    let table = lake::iceberg_table(&uri, warehouse, "lake", "shop.seq", &moto.env()).unwrap();
    lake::one_snapshot_per_checkpoint(&table).unwrap();
    let mut seqs: Vec<i64> = table
        .rows
        .iter()
        .map(|r| r["seq"].as_i64().unwrap())
        .collect();
    seqs.sort();
    assert_eq!(
        seqs,
        (1..=RECORDS).collect::<Vec<_>>(),
        "seed {s}: every record once"
    );
    for r in &table.rows {
        assert_eq!(
            r["key"].as_i64().unwrap(),
            r["seq"].as_i64().unwrap() % 4,
            "{r}"
        );
    }
    // The data files are in the folders of their partitions, in the store, and some
    // checkpoint rolled several files of one partition.
    let line = table.line();
    let files: Vec<String> = line
        .iter()
        .flat_map(|s| s["added"].as_array().unwrap().iter())
        .map(|f| f.as_str().unwrap().to_string())
        .collect();
    assert!(
        files
            .iter()
            .all(|f| f.starts_with("s3://lake/wh/shop/seq/data/key=")),
        "{files:?}"
    );
    assert!(
        line.iter()
            .any(|s| s["added"].as_array().unwrap().len() > 4),
        "some checkpoint rolled files"
    );
    for s in &line {
        assert_eq!(s["summary"]["lockgate.job"], "conformance", "{s}");
        assert_eq!(s["operation"], "append", "{s}");
    }
    assert_eq!(lake::multipart_uploads(&moto, "lake"), Vec::<String>::new());
}

#[test]
fn the_example_job_writes_every_running_total_once() {
    let tmp = tempfile::tempdir().unwrap();
    let example =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/jobs/sequence-to-iceberg.toml");
    let status = std::process::Command::new(common::bin())
        .args(["run", "--config"])
        .arg(&example)
        .env("LOCKGATE_DATA", tmp.path())
        .status()
        .unwrap();
    assert!(status.success());
    let root = tmp.path().join("sequence-to-iceberg");
    let table = lake::iceberg_table(
        &format!("sqlite:///{}", root.join("catalog.db").display()),
        &format!("file://{}", root.join("warehouse").display()),
        "lake",
        "demo.totals",
        &[],
    )
    .unwrap();
    lake::one_snapshot_per_checkpoint(&table).unwrap();
    let records = table
        .rows
        .iter()
        .map(|r| ("table".to_string(), r.to_string()));
    let v =
        lockgate::testkit::file_output::verify_records(records, 1, 200_000, 1000, Some("/total"));
    assert!(v.is_exact(), "{v:?}");
    assert_eq!(v.committed, 200_000);
}

/// A job file of the sequence `1..=to` into `table` of the SQL catalog at `uri`.
fn sequence_job(root: &Path, uri: &str, warehouse: &str, to: i64, rate: u64) -> std::path::PathBuf {
    let schema = root.join("s.avsc");
    std::fs::write(&schema, lake::SEQUENCE_SCHEMA).unwrap();
    let job = root.join("job.toml");
    std::fs::write(
        &job,
        format!(
            "[job]\nname = \"pg-catalog\"\nparallelism = 2\n\n[checkpoint]\ndir = {:?}\ninterval_ms = 150\nretain = 20\n\n[source.sequence]\nfrom = 1\nto = {to}\nkeys = 4\nrate_per_sec = {rate}\n\n[sink.iceberg]\ncatalog = {{ type = \"sql\", name = \"lake\", uri = {uri:?}, warehouse = {warehouse:?} }}\ntable = \"shop.seq\"\nschema_file = {:?}\n",
            root.join("chk").display().to_string(),
            schema.display().to_string()
        ),
    )
    .unwrap();
    job
}

fn run(job: &Path, extra: &[&str]) -> std::process::Output {
    std::process::Command::new(common::bin())
        .args(["run", "--config"])
        .arg(job)
        .args(extra)
        .output()
        .unwrap()
}

/// The complete checkpoints of `chk`, oldest first.
fn checkpoints(chk: &Path) -> Vec<std::path::PathBuf> {
    let mut all: Vec<(u64, std::path::PathBuf)> = std::fs::read_dir(chk)
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let id = e
                .file_name()
                .to_string_lossy()
                .strip_prefix("chk-")?
                .parse()
                .ok()?;
            Some((id, e.path()))
        })
        .collect();
    all.sort();
    all.into_iter().map(|(_, p)| p).collect()
}

/// The SQL catalog in PostgreSQL: a run to the end, then a restore of an older
/// checkpoint by path takes back the job's later snapshots (the branch set back in
/// PostgreSQL's catalog rows) and writes their records again, once; after another
/// writer appended a row, a restore of an older checkpoint is refused, naming that
/// writer's snapshot, and the table is left as it was.
#[test]
fn a_catalog_in_postgresql_takes_back_later_snapshots_on_an_older_restore() {
    use lockgate::testkit::postgres::{PgOptions, PgServer};
    let pg = PgServer::start(PgOptions::default()).unwrap();
    pg.create_database("catalog").unwrap();
    // SQLAlchemy's form, with its driver, as pyiceberg takes it too.
    let uri = pg
        .url("catalog")
        .replacen("postgresql://", "postgresql+psycopg2://", 1);
    let tmp = tempfile::tempdir().unwrap();
    let warehouse = format!("file://{}", tmp.path().join("wh").display());
    let job = sequence_job(tmp.path(), &uri, &warehouse, 20_000, 10_000);
    let out = run(&job, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read = || lake::iceberg_table(&uri, &warehouse, "lake", "shop.seq", &[]).unwrap();
    let first = read();
    let line = first.line().len();
    assert!(line >= 4, "several checkpoints made snapshots: {line}");

    let all = checkpoints(&tmp.path().join("chk"));
    let older = &all[all.len() / 2];
    let out = run(&job, &["--restore", older.to_str().unwrap()]);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("taken_back"), "{log}");
    let again = read();
    lake::one_snapshot_per_checkpoint(&again).unwrap();
    let mut seqs: Vec<i64> = again
        .rows
        .iter()
        .map(|r| r["seq"].as_i64().unwrap())
        .collect();
    seqs.sort();
    assert_eq!(seqs, (1..=20_000).collect::<Vec<_>>(), "every record once");
    assert!(
        again.snapshots.len() > again.line().len(),
        "the taken back stay in the metadata"
    );

    let row = serde_json::json!({"seq": -1, "key": 0, "value": 0});
    lake::iceberg_append(&uri, &warehouse, "lake", "shop.seq", &row).unwrap();
    let before = read();
    let foreign = before.current.unwrap();
    let all = checkpoints(&tmp.path().join("chk"));
    let out = run(&job, &["--restore", all[0].to_str().unwrap()]);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{log}");
    assert!(
        log.contains(&foreign.to_string()),
        "the refusal names the other writer's snapshot: {log}"
    );
    let after = read();
    assert_eq!(after.current, before.current, "the table is as it was");
    assert_eq!(after.rows.len(), 20_001);
}

/// Every kind of Avro field (a decimal, a timestamp in milliseconds also inside a list
/// of records, a date, a nullable string, an enum, a list, a map, a record, a fixed),
/// read from a Kafka topic of Avro values by the source's own schema (no
/// `schema_file`), into a table partitioned by the day of a timestamp: pyiceberg
/// reads every value exact (the milliseconds as the same instants in Iceberg's
/// microseconds, a time zone: `timestamptz`), each file in its day's partition.
#[test]
fn an_avro_topic_becomes_a_table_with_exact_values_by_its_own_schema() {
    use apache_avro::types::Value as Avro;
    use common::kafka::{produce_raw, KafkaProcess};
    use serde_json::json;
    const ORDER: &str = r#"{"type":"record","name":"order","fields":[
        {"name":"id","type":"long"},
        {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":12,"scale":2}},
        {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}},
        {"name":"day","type":{"type":"int","logicalType":"date"}},
        {"name":"note","type":["null","string"],"default":null},
        {"name":"kind","type":{"type":"enum","name":"kind","symbols":["retail","wholesale"]}},
        {"name":"tags","type":{"type":"array","items":"string"}},
        {"name":"qty","type":{"type":"map","values":"int"}},
        {"name":"ship","type":{"type":"record","name":"ship","fields":[
            {"name":"city","type":"string"},
            {"name":"weight","type":"double"}]}},
        {"name":"events","type":{"type":"array","items":{"type":"record","name":"event","fields":[
            {"name":"what","type":"string"},
            {"name":"when","type":{"type":"long","logicalType":"timestamp-millis"}}]}}},
        {"name":"hash","type":{"type":"fixed","name":"h4","size":4}}
    ]}"#;
    let kafka = KafkaProcess::start(&[("orders", 2)]);
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("order.avsc"), ORDER).unwrap();
    let schema = apache_avro::Schema::parse_str(ORDER).unwrap();
    const N: i64 = 300;
    let payloads: Vec<Vec<u8>> = (0..N)
        .map(|i| {
            let record = Avro::Record(vec![
                ("id".into(), Avro::Long(i)),
                (
                    "amount".into(),
                    Avro::Decimal(apache_avro::Decimal::from(
                        (1_000_000_007i64 + i).to_be_bytes().to_vec(),
                    )),
                ),
                (
                    "at".into(),
                    Avro::TimestampMillis(1_714_564_800_123 + (i % 3) * 86_400_000),
                ),
                ("day".into(), Avro::Date(19_844)),
                (
                    "note".into(),
                    match i % 2 {
                        0 => Avro::Union(0, Box::new(Avro::Null)),
                        _ => Avro::Union(1, Box::new(Avro::String("gift".into()))),
                    },
                ),
                ("kind".into(), Avro::Enum(1, "wholesale".into())),
                (
                    "tags".into(),
                    Avro::Array(vec![Avro::String("a".into()), Avro::String("b".into())]),
                ),
                (
                    "qty".into(),
                    Avro::Map([("x".to_string(), Avro::Int(3))].into_iter().collect()),
                ),
                (
                    "ship".into(),
                    Avro::Record(vec![
                        ("city".into(), Avro::String("Zürich".into())),
                        ("weight".into(), Avro::Double(0.1)),
                    ]),
                ),
                (
                    "events".into(),
                    Avro::Array(vec![Avro::Record(vec![
                        ("what".into(), Avro::String("paid".into())),
                        ("when".into(), Avro::TimestampMillis(1_714_564_800_456)),
                    ])]),
                ),
                ("hash".into(), Avro::Fixed(4, vec![0xde, 0xad, 0xbe, 0xef])),
            ]);
            apache_avro::to_avro_datum(&schema, record).unwrap()
        })
        .collect();
    for (p, half) in payloads.chunks(N as usize / 2).enumerate() {
        let refs: Vec<&[u8]> = half.iter().map(Vec::as_slice).collect();
        produce_raw(&kafka.bootstrap, "orders", p as i32, &refs);
    }
    let uri = format!("sqlite:///{}", tmp.path().join("catalog.db").display());
    let warehouse = format!("file://{}", tmp.path().join("wh").display());
    let job = tmp.path().join("job.toml");
    std::fs::write(
        &job,
        format!(
            "[job]\nname = \"avro-iceberg\"\nparallelism = 2\n\n[checkpoint]\ndir = \"chk\"\ninterval_ms = 200\n\n\
             [source.kafka]\nbootstrap_servers = \"{}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\nformat = \"avro\"\nschema_file = \"order.avsc\"\n\n\
             [sink.iceberg]\ncatalog = {{ type = \"sql\", name = \"lake\", uri = {uri:?}, warehouse = {warehouse:?} }}\ntable = \"shop.orders\"\npartition_by = \"at_day={{/at:%Y-%m-%d}}\"\n",
            kafka.bootstrap
        ),
    )
    .unwrap();
    let out = run(&job, &[]);
    assert!(
        out.status.success(),
        "{}",
        common::tail(&String::from_utf8_lossy(&out.stderr), 30)
    );
    let table = lake::iceberg_table(&uri, &warehouse, "lake", "shop.orders", &[]).unwrap();
    lake::one_snapshot_per_checkpoint(&table).unwrap();
    let mut ids: Vec<i64> = Vec::new();
    for row in &table.rows {
        let i = row["id"].as_i64().unwrap();
        ids.push(i);
        let cents = 1_000_000_007 + i;
        assert_eq!(
            row["amount"],
            json!(format!("{}.{:02}", cents / 100, cents % 100)),
            "{row}"
        );
        let at = [
            "2024-05-01T12:00:00.123000+00:00",
            "2024-05-02T12:00:00.123000+00:00",
            "2024-05-03T12:00:00.123000+00:00",
        ];
        assert_eq!(row["at"], json!(at[(i % 3) as usize]), "{row}");
        assert_eq!(row["day"], json!("2024-05-01"));
        assert_eq!(
            row["note"],
            if i % 2 == 0 {
                json!(null)
            } else {
                json!("gift")
            }
        );
        assert_eq!(row["kind"], json!("wholesale"));
        assert_eq!(row["tags"], json!(["a", "b"]));
        assert_eq!(row["qty"], json!([["x", 3]]));
        assert_eq!(row["ship"], json!({"city": "Zürich", "weight": 0.1}));
        assert_eq!(
            row["events"],
            json!([{"what": "paid", "when": "2024-05-01T12:00:00.456000+00:00"}])
        );
        assert_eq!(row["hash"], json!("deadbeef"));
    }
    ids.sort();
    assert_eq!(ids, (0..N).collect::<Vec<_>>(), "every record once");
    let added: Vec<String> = table
        .line()
        .iter()
        .flat_map(|s| s["added"].as_array().unwrap().iter())
        .map(|f| f.as_str().unwrap().to_string())
        .collect();
    for day in ["2024-05-01", "2024-05-02", "2024-05-03"] {
        assert!(
            added
                .iter()
                .any(|f| f.contains(&format!("/data/at_day={day}/"))),
            "a file in the partition of {day}: {added:?}"
        );
    }
}
