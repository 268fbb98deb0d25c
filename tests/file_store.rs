//! The file sink into an object store (moto's S3 server): a process aborted between
//! the copy of a staged part and the deletion of its staged object commits nothing
//! twice, a run leaves nothing staged behind, and a fresh start moves the earlier
//! run's parts aside instead of adding to them. Everything read back by pyarrow through
//! its own S3 client. The conformance suite (`tests/conformance.rs`, `store_file_sink`)
//! covers kills, restores and rescales in both formats.

mod common;

use lockgate::testkit::conformance::process::ProcessJob;
use lockgate::testkit::moto::MotoServer;
use std::collections::BTreeMap;

const SCHEMA: &str = r#"{"type":"record","name":"s","fields":[{"name":"seq","type":"long"},{"name":"key","type":"long"},{"name":"value","type":"long"}]}"#;

fn sections(
    moto: &MotoServer,
    url: &str,
    schema: &std::path::Path,
    to: i64,
    rate: u64,
) -> ((String, String), (String, String)) {
    (
        (
            "sequence".into(),
            format!("from = 1\nto = {to}\nkeys = 10\nrate_per_sec = {rate}"),
        ),
        (
            "file".into(),
            format!(
                "dir = {url:?}\nformat = \"parquet\"\nschema_file = {:?}\nendpoint = {:?}\nallow_http = true\nregion = \"us-east-1\"\naccess_key_id = \"testing\"\nsecret_access_key = \"testing\"",
                schema.display().to_string(),
                moto.endpoint()
            ),
        ),
    )
}

/// Each `seq` read back, with how many times.
fn counts(moto: &MotoServer, url: &str) -> BTreeMap<i64, u32> {
    let mut seen = BTreeMap::new();
    for r in common::lake::store_rows(url, &moto.env()).unwrap() {
        *seen.entry(r["row"]["seq"].as_i64().unwrap()).or_insert(0) += 1;
    }
    seen
}

/// The objects under `prefix` of bucket `lake`, by key below it.
fn objects(moto: &MotoServer, prefix: &str) -> Vec<String> {
    let (store, root) = moto.location("lake", prefix).open().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use futures::TryStreamExt;
        let all: Vec<_> = store.list(Some(&root)).try_collect().await.unwrap();
        let mut keys: Vec<String> = all
            .into_iter()
            .map(|m| m.location.as_ref()[root.as_ref().len() + 1..].to_string())
            .collect();
        keys.sort();
        keys
    })
}

#[test]
fn an_abort_between_the_copy_and_the_delete_of_a_commit_duplicates_nothing() {
    let moto = MotoServer::start().unwrap();
    moto.create_bucket("lake").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let schema = tmp.path().join("s.avsc");
    std::fs::write(&schema, SCHEMA).unwrap();
    let url = "s3://lake/orders";
    let job = ProcessJob::new(&common::bin(), &tmp.path().join("job")).unwrap();
    let (source, sink) = sections(&moto, url, &schema, 3000, 3000);
    job.write(&source, &sink).unwrap();
    job.abort_at("store-part-copied").unwrap();
    let copied_not_deleted: Vec<String> = objects(&moto, "orders")
        .into_iter()
        .filter(|k| k.starts_with("_staging/"))
        .collect();
    assert!(
        !copied_not_deleted.is_empty(),
        "the abort came between the copy and the delete"
    );
    let (source, sink) = sections(&moto, url, &schema, 3000, 0);
    job.write(&source, &sink).unwrap();
    job.run_to_end().unwrap();

    let seen = counts(&moto, url);
    assert_eq!(seen.len(), 3000, "every record");
    assert!(seen.values().all(|n| *n == 1), "each once");
    let left: Vec<String> = objects(&moto, "orders")
        .into_iter()
        .filter(|k| k.starts_with('_'))
        .collect();
    assert_eq!(left, Vec::<String>::new(), "nothing staged is left behind");
}

#[test]
fn a_fresh_start_moves_the_earlier_parts_aside() {
    let moto = MotoServer::start().unwrap();
    moto.create_bucket("lake").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let schema = tmp.path().join("s.avsc");
    std::fs::write(&schema, SCHEMA).unwrap();
    let url = "s3://lake/fresh";
    for run in ["first", "second"] {
        let job = ProcessJob::new(&common::bin(), &tmp.path().join(run)).unwrap();
        let (source, sink) = sections(&moto, url, &schema, 2000, 0);
        job.write(&source, &sink).unwrap();
        job.run_to_end().unwrap();
    }
    let seen = counts(&moto, url);
    assert_eq!(seen.len(), 2000);
    assert!(
        seen.values().all(|n| *n == 1),
        "the second run's output alone is visible"
    );
    let aside = objects(&moto, "fresh")
        .into_iter()
        .filter(|k| k.starts_with("_rolled-back/part-"))
        .count();
    assert!(
        aside > 0,
        "the first run's parts are kept aside, not deleted"
    );
}
