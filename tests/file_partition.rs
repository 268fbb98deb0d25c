//! `partition_by` and `roll_bytes` of the file sink, in a local directory and in an
//! object store (moto's S3 server), through real processes killed with SIGKILL at
//! seeded moments of the checkpoint protocol and a rescale: every record once, each in
//! the folder its fields name, parts rolled by size. Read back by pyarrow, file by
//! file and as one dataset with Hive partitioning.

mod common;

use common::lake;
use lockgate::testkit::conformance::process::{seed, KillAt, ProcessJob, KILL_POINTS};
use lockgate::testkit::moto::MotoServer;
use rand::SeedableRng;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

const RECORDS: i64 = 6000;

/// The sink's keys: Parquet by the sequence's schema, a folder per key, parts rolled
/// at 2 KiB (several per checkpoint).
fn sink_keys(dir: &str, schema: &Path) -> String {
    format!(
        "dir = {dir:?}\nformat = \"parquet\"\nschema_file = {:?}\npartition_by = \"bucket={{/key}}\"\nroll_bytes = 2048\n",
        schema.display().to_string()
    )
}

/// Runs the job through five seeded kills at parallelism 2, then to its end at
/// parallelism 3.
fn run_with_kills(job: &ProcessJob, sink: &str) {
    let source = (
        "sequence".to_string(),
        format!("from = 1\nto = {RECORDS}\nkeys = 4\nrate_per_sec = 3000"),
    );
    let sink = ("file".to_string(), sink.to_string());
    job.write_at(2, &source, &sink).unwrap();
    let s = seed(11);
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
}

/// Every record once, each in the folder of its key, some checkpoint rolled into
/// several files; pyarrow's Hive reading gives each row the partition of its folder.
fn assert_partitioned(files: &[Value], hive: &[Value]) {
    let mut seen: BTreeMap<i64, u32> = BTreeMap::new();
    let mut rolled = false;
    for f in files {
        let (file, row) = (f["file"].as_str().unwrap(), &f["row"]);
        let key = row["key"].as_i64().unwrap();
        assert!(
            file.starts_with(&format!("bucket={key}/part-")),
            "{file} holds a row of key {key}"
        );
        let name = file.rsplit('/').next().unwrap();
        rolled |= name.trim_end_matches(".parquet").matches('-').count() == 3;
        *seen.entry(row["seq"].as_i64().unwrap()).or_insert(0) += 1;
    }
    assert_eq!(seen.len() as i64, RECORDS, "every record");
    assert!(seen.values().all(|n| *n == 1), "each once");
    assert!(rolled, "roll_bytes closed a part before its barrier");
    assert_eq!(hive.len() as i64, RECORDS);
    for r in hive {
        assert_eq!(
            r["row"]["bucket"].as_i64(),
            r["row"]["key"].as_i64(),
            "the folder's partition is the row's key: {r}"
        );
    }
}

#[test]
fn partitioned_rolled_parts_in_a_directory_through_kills_and_a_rescale() {
    let tmp = tempfile::tempdir().unwrap();
    let schema = tmp.path().join("s.avsc");
    std::fs::write(&schema, lake::SEQUENCE_SCHEMA).unwrap();
    let job = ProcessJob::new(&common::bin(), &tmp.path().join("job")).unwrap();
    let out = tmp.path().join("out");
    run_with_kills(&job, &sink_keys(&out.display().to_string(), &schema));
    let files = lake::rows(&out).unwrap();
    let hive = lake::hive_rows(&out.display().to_string(), &[]).unwrap();
    assert_partitioned(&files, &hive);
    let left: Vec<String> = walkdir(&out)
        .into_iter()
        .filter(|p| p.contains("/.inprogress-") || p.contains("/.part-"))
        .collect();
    assert_eq!(left, Vec::<String>::new(), "nothing in progress is left");
}

#[test]
fn partitioned_rolled_parts_in_an_object_store_through_kills_and_a_rescale() {
    let moto = MotoServer::start().unwrap();
    moto.create_bucket("lake").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let schema = tmp.path().join("s.avsc");
    std::fs::write(&schema, lake::SEQUENCE_SCHEMA).unwrap();
    let job = ProcessJob::new(&common::bin(), &tmp.path().join("job")).unwrap();
    let url = "s3://lake/parted";
    let (_, (_, store_keys)) = lake::store_job_sections(&moto, url, &schema, 1, 0);
    // The store's client keys, then the partitioned sink's (dir, format and schema
    // once, from sink_keys).
    let client: String = store_keys
        .lines()
        .filter(|l| {
            !["dir", "format", "schema_file"]
                .iter()
                .any(|k| l.starts_with(k))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    run_with_kills(&job, &format!("{}{client}", sink_keys(url, &schema)));
    let files = lake::store_rows(url, &moto.env()).unwrap();
    let hive = lake::hive_rows(url, &moto.env()).unwrap();
    assert_partitioned(&files, &hive);
    let staged: Vec<String> = lake::store_objects(&moto, "parted")
        .into_iter()
        .filter(|k| k.starts_with("_staging/"))
        .collect();
    assert_eq!(staged, Vec::<String>::new(), "nothing staged is left");
}

/// Every file under `dir`, as paths.
fn walkdir(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.display().to_string());
            }
        }
    }
    out
}
