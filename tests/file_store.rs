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
