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
