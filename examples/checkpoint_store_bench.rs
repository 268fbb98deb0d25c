//! Checkpoints in an object store, measured against moto's S3 server on this machine:
//! upload time and bytes of the first checkpoint of a keyed state, of a second
//! checkpoint of the unchanged state (incremental: only `_metadata` is new), and the
//! time to restore the newest checkpoint from the store into an empty local directory
//! (a new machine). Prints JSON: every round's figures and their medians.
//!
//! ```sh
//! cargo run --release --example checkpoint_store_bench [-- KEYS [ROUNDS]]
//! ```
//! KEYS defaults to 100,000 and ROUNDS to 5. moto's server comes from
//! `LOCKGATE_MOTO_BIN`, or is installed once into a virtual environment.

use lockgate::state::backend::{KeyedStateBackend, StateBatch};
use lockgate::state::keygroup::KeyGroupRange;
use lockgate::state::snapshot_dir::SnapshotDir;
use lockgate::state::store::CheckpointStore;
use lockgate::state::{CheckpointId, CheckpointMetadata, KeyGroup};
use lockgate::testkit::checkpoint::publish_keyed;
use lockgate::testkit::moto::MotoServer;
use serde_json::json;
use std::path::Path;
use std::time::Instant;

const GROUPS: KeyGroupRange = KeyGroupRange { start: 0, end: 127 };

fn publish_local(dir: &SnapshotDir, db: &mut KeyedStateBackend, id: u64) -> std::path::PathBuf {
    publish_keyed(dir, db, GROUPS, "bench", CheckpointId(id)).unwrap()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn state_bytes(chk: &Path) -> u64 {
    CheckpointMetadata::read(chk)
        .unwrap()
        .subtasks
        .iter()
        .flat_map(|s| &s.files)
        .map(|f| f.size)
        .sum()
}

fn main() {
    let keys: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let rounds: usize = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let moto = MotoServer::start().expect("moto server");
    moto.create_bucket("bench").unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut rows = Vec::new();
    let (mut up1, mut up2, mut rest) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let tmp = tempfile::tempdir().unwrap();
        let loc = moto.location("bench", &format!("round-{round}"));
        let store = CheckpointStore::new(&loc).unwrap();
        let (dir, _) = SnapshotDir::open_staging(&tmp.path().join("pod-a")).unwrap();
        rt.block_on(store.start(&tmp.path().join("pod-a"))).unwrap();
        let mut db = KeyedStateBackend::open(&tmp.path().join("work"), GROUPS, &[]).unwrap();
        for chunk in (0..keys).collect::<Vec<_>>().chunks(10_000) {
            let mut batch = StateBatch::default();
            for &k in chunk {
                batch
                    .put(
                        KeyGroup((k % 128) as u16),
                        "sum",
                        &k.to_be_bytes(),
                        &(k * 3),
                    )
                    .unwrap();
            }
            db.write(batch).unwrap();
        }
        let first = publish_local(&dir, &mut db, 1);
        let t = Instant::now();
        let s1 = rt.block_on(store.publish(&first)).unwrap();
        let first_ms = t.elapsed().as_secs_f64() * 1e3;
        let second = publish_local(&dir, &mut db, 2);
        let t = Instant::now();
        let s2 = rt.block_on(store.publish(&second)).unwrap();
        let second_ms = t.elapsed().as_secs_f64() * 1e3;
        drop((db, dir));
        // A new machine: an empty local directory, everything from the store.
        let fresh = tmp.path().join("pod-b");
        let (_dir_b, _) = SnapshotDir::open_staging(&fresh).unwrap();
        let store_b = CheckpointStore::new(&loc).unwrap();
        let t = Instant::now();
        let found = rt.block_on(store_b.start(&fresh)).unwrap();
        let restore_ms = t.elapsed().as_secs_f64() * 1e3;
        let restored = found.restored.expect("a restored checkpoint");
        assert_eq!(restored.metadata.id, CheckpointId(2));
        up1.push(first_ms);
        up2.push(second_ms);
        rest.push(restore_ms);
        rows.push(json!({
            "round": round,
            "state_bytes": state_bytes(&second),
            "first": {"ms": first_ms, "objects": s1.objects, "bytes": s1.bytes, "reused": s1.reused},
            "second_unchanged": {"ms": second_ms, "objects": s2.objects, "bytes": s2.bytes, "reused": s2.reused},
            "restore_from_store_ms": restore_ms,
        }));
    }
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({
            "store": "moto_server (S3 API over HTTP on loopback)",
            "keys": keys,
            "rounds": rows,
            "median_ms": {
                "first_upload": median(&mut up1),
                "second_upload_unchanged": median(&mut up2),
                "restore_from_store": median(&mut rest),
            },
        }))
        .unwrap()
    );
}
