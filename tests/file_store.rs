//! The file sink into an object store (moto's S3 server): a fresh start moves the
//! earlier run's parts aside instead of adding to them (an abort between the copy of a
//! staged part and the deletion of its staged object is `tests/chaos.rs`'s). Everything read back by pyarrow through
//! its own S3 client. The conformance suite (`tests/conformance.rs`, `store_file_sink`)
//! covers kills, restores and rescales in both formats.

mod common;

use common::lake::{
    store_counts as counts, store_job_sections as sections, store_objects as objects,
    SEQUENCE_SCHEMA as SCHEMA,
};
use lockgate::testkit::conformance::process::ProcessJob;
use lockgate::testkit::moto::MotoServer;

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

/// A prefix written by one job is refused to another (two jobs would make the same part
/// names and overwrite each other's output); the same job opens it again.
#[test]
fn a_prefix_another_job_writes_is_refused() {
    use lockgate::connector::{Sink, SinkRestore, SubtaskInfo};
    use lockgate::connectors::file_sink::{FileSection, StoreWriter};
    use lockgate::kits::TwoPhaseSink;
    let moto = MotoServer::start().unwrap();
    moto.create_bucket("lake").unwrap();
    let section: FileSection = toml::from_str(&format!(
        "dir = \"s3://lake/owned\"\nendpoint = {:?}\nallow_http = true\nregion = \"us-east-1\"\naccess_key_id = \"testing\"\nsecret_access_key = \"testing\"",
        moto.endpoint()
    ))
    .unwrap();
    let cfg = section.config(&|p| p.to_path_buf()).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let open = |job: &str| {
        let mut sink = TwoPhaseSink::new(StoreWriter::new(cfg.clone(), cfg.store.clone().unwrap()));
        let info = SubtaskInfo::new(job, "sink-0", 0, 1);
        let fresh = SinkRestore {
            checkpoint: None,
            states: vec![],
            parallelism: 1,
        };
        rt.block_on(async move { sink.open(&info, &fresh).await })
    };
    open("orders").unwrap();
    assert!(objects(&moto, "owned").contains(&"_lockgate-file-sink".to_string()));
    open("orders").unwrap();
    let err = open("billing").unwrap_err().to_string();
    assert!(
        err.contains("`orders`") && err.contains("`billing`"),
        "{err}"
    );
}

/// Parts into an object store are held in memory until put: with many `partition_by`
/// folders open at once, once together they pass the sink's memory bound the largest
/// are put early (as if rolled), and the checkpoint still commits every record once.
#[test]
fn open_parts_past_the_memory_bound_are_put_early() {
    use lockgate::connector::{CheckpointId, Record, Sink, SinkRestore, SubtaskInfo};
    use lockgate::connectors::file_sink::{FileSection, StoreWriter};
    use lockgate::kits::TwoPhaseSink;
    let moto = MotoServer::start().unwrap();
    moto.create_bucket("lake").unwrap();
    let url = "s3://lake/bounded";
    let section: FileSection = toml::from_str(&format!(
        "dir = {url:?}\npartition_by = \"c={{/c}}\"\nendpoint = {:?}\nallow_http = true\nregion = \"us-east-1\"\naccess_key_id = \"testing\"\nsecret_access_key = \"testing\"",
        moto.endpoint()
    ))
    .unwrap();
    let mut cfg = section.config(&|p| p.to_path_buf()).unwrap();
    cfg.memory_bytes = 8192;
    let location = cfg.store.clone().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut sink = TwoPhaseSink::new(StoreWriter::new(cfg, location));
        let fresh = SinkRestore {
            checkpoint: None,
            states: vec![],
            parallelism: 1,
        };
        sink.open(&SubtaskInfo::new("bounded", "sink-0", 0, 1), &fresh)
            .await
            .unwrap();
        // 20 folders, 100-byte records: 2,000 records are 200 KB, 25 times the bound.
        for b in 0..20 {
            let batch: Vec<Record> = (0..100)
                .map(|i| {
                    let seq = b * 100 + i;
                    Record::from_value(
                        format!(
                            r#"{{"c":"{}","seq":{seq},"pad":"{}"}}"#,
                            seq % 20,
                            "x".repeat(60)
                        )
                        .into_bytes(),
                    )
                })
                .collect();
            sink.invoke(batch).await.unwrap();
        }
        sink.snapshot(CheckpointId(1)).await.unwrap();
        sink.notify_checkpoint_complete(CheckpointId(1))
            .await
            .unwrap();
        // The commit runs off the sink's task: a close waits for it.
        sink.close().await.unwrap();
    });
    let rows = lockgate_rows(&moto, url);
    let mut seqs: Vec<i64> = rows
        .iter()
        .map(|(_, r)| r["seq"].as_i64().unwrap())
        .collect();
    seqs.sort();
    assert_eq!(seqs, (0..2000).collect::<Vec<_>>(), "every record once");
    for (file, r) in &rows {
        assert!(
            file.starts_with(&format!("c={}/", r["seq"].as_i64().unwrap() % 20)),
            "{file}"
        );
    }
    let rolled = rows
        .iter()
        .map(|(f, _)| f.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    assert!(
        rolled > 20,
        "parts were put before the barrier: {rolled} files for 20 folders"
    );
    assert!(
        objects(&moto, "bounded")
            .iter()
            .all(|k| !k.starts_with("_staging/")),
        "nothing staged is left"
    );
}

/// The rows of the committed parts under `url`, as pyarrow reads them: `(file, row)`.
fn lockgate_rows(moto: &MotoServer, url: &str) -> Vec<(String, serde_json::Value)> {
    common::lake::store_rows(url, &moto.env())
        .unwrap()
        .into_iter()
        .map(|mut r| (r["file"].as_str().unwrap().to_string(), r["row"].take()))
        .collect()
}
