//! The snapshot-directory rules, proved against a local directory and against an
//! S3-compatible object store (moto's server, a real HTTP server speaking S3): publish,
//! restore the newest, skip a corrupt newest by name, continue ids, retention only after
//! a newer publish with garbage collection of unreferenced state files, and incremental
//! upload. Checkpoints hold real RocksDB files.

use lockgate::state::backend::{KeyedStateBackend, StateBatch};
use lockgate::state::keygroup::KeyGroupRange;
use lockgate::state::metadata::CheckpointMetadata;
use lockgate::state::snapshot_dir::SnapshotDir;
use lockgate::state::store::{CheckpointStore, StoreLocation};
use lockgate::state::{CheckpointId, KeyGroup, StateError, StateRestore};
use lockgate::testkit::checkpoint::{keyed_metadata, publish_keyed};
use lockgate::testkit::moto::MotoServer;
use object_store::ObjectStore;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

const GROUPS: KeyGroupRange = KeyGroupRange { start: 0, end: 127 };

/// One moto server for this test binary; each test has its own bucket.
fn moto() -> &'static MotoServer {
    static M: OnceLock<MotoServer> = OnceLock::new();
    M.get_or_init(|| MotoServer::start().expect("moto server"))
}

fn bucket() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let b = format!(
        "lockgate-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    moto().create_bucket(&b).unwrap();
    b
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Local,
    Store,
}

const KINDS: [Kind; 2] = [Kind::Local, Kind::Store];

/// A checkpoint line of one kind: the local directory alone, or a local staging
/// directory mirrored to a store prefix.
struct Line {
    kind: Kind,
    tmp: tempfile::TempDir,
    /// The local directory of the current "pod".
    local: PathBuf,
    location: Option<StoreLocation>,
    rt: tokio::runtime::Runtime,
}

/// What a start found.
struct Opened {
    dir: SnapshotDir,
    store: Option<Arc<CheckpointStore>>,
    restored: Option<(CheckpointId, PathBuf, CheckpointMetadata)>,
    skipped: Vec<String>,
    next_id: CheckpointId,
}

impl Line {
    fn new(kind: Kind) -> Line {
        let tmp = tempfile::tempdir().unwrap();
        let local = tmp.path().join("pod-0");
        let location = (kind == Kind::Store).then(|| moto().location(&bucket(), "jobs/orders"));
        Line {
            kind,
            tmp,
            local,
            location,
            rt: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap(),
        }
    }

    /// A new pod: the next start has an empty local directory (store lines only; a
    /// local line's directory is its only copy).
    fn new_pod(&mut self, n: usize) {
        if self.kind == Kind::Store {
            self.local = self.tmp.path().join(format!("pod-{n}"));
        }
    }

    fn open(&self) -> Opened {
        match &self.location {
            None => {
                let (dir, s) = SnapshotDir::open(&self.local).unwrap();
                Opened {
                    dir,
                    store: None,
                    restored: s.restored.map(|r| (r.metadata.id, r.path, r.metadata)),
                    skipped: s
                        .skipped
                        .iter()
                        .map(|(p, why)| format!("{}: {why}", p.display()))
                        .collect(),
                    next_id: s.next_id,
                }
            }
            Some(loc) => {
                let (dir, local_next) = SnapshotDir::open_staging(&self.local).unwrap();
                let store = Arc::new(CheckpointStore::new(loc).unwrap());
                let s = self.rt.block_on(store.start(&self.local)).unwrap();
                Opened {
                    dir,
                    store: Some(store),
                    restored: s.restored.map(|r| (r.metadata.id, r.path, r.metadata)),
                    skipped: s
                        .skipped
                        .iter()
                        .map(|(u, why)| format!("{u}: {why}"))
                        .collect(),
                    next_id: s.next_id.max(local_next),
                }
            }
        }
    }

    /// Checkpoints `db` as checkpoint `id` and publishes it (locally, then in the
    /// store), then applies retention. Returns the upload's (objects, bytes).
    fn publish(
        &self,
        o: &Opened,
        db: &mut KeyedStateBackend,
        id: u64,
        retain: usize,
    ) -> (u64, u64) {
        let path = publish_keyed(&o.dir, db, GROUPS, "orders", CheckpointId(id)).unwrap();
        let mut up = (0, 0);
        if let Some(store) = &o.store {
            let s = self.rt.block_on(store.publish(&path)).unwrap();
            up = (s.objects, s.bytes);
            self.rt.block_on(store.apply_retention(retain)).unwrap();
        }
        o.dir.apply_retention(retain).unwrap();
        up
    }

    fn client(&self) -> (Arc<dyn ObjectStore>, object_store::path::Path) {
        self.location.as_ref().unwrap().open().unwrap()
    }

    /// Every key under the store prefix, relative to it.
    fn keys(&self) -> Vec<String> {
        let (c, prefix) = self.client();
        let mut keys: Vec<String> = self.rt.block_on(async {
            use futures::TryStreamExt;
            c.list(Some(&prefix))
                .map_ok(|m| m.location.to_string()[prefix.as_ref().len() + 1..].to_string())
                .try_collect()
                .await
                .unwrap()
        });
        keys.sort();
        keys
    }

    /// Flips the last byte of checkpoint `id`'s `_metadata` where the line keeps it.
    fn corrupt_metadata(&self, id: u64) {
        let name = format!("chk-{id:010}/_metadata");
        match self.kind {
            Kind::Local => flip_last(&self.local.join(&name)),
            Kind::Store => {
                let (c, prefix) = self.client();
                let key = object_store::path::Path::from(format!("{prefix}/{name}"));
                self.rt.block_on(async {
                    let mut b = c.get(&key).await.unwrap().bytes().await.unwrap().to_vec();
                    let last = b.len() - 1;
                    b[last] ^= 0xff;
                    c.put(&key, b.into()).await.unwrap();
                });
            }
        }
    }
}

fn flip_last(p: &Path) {
    let mut b = std::fs::read(p).unwrap();
    let last = b.len() - 1;
    b[last] ^= 0xff;
    std::fs::write(p, b).unwrap();
}

fn put(db: &mut KeyedStateBackend, from: u64, to: u64, value: u64) {
    let mut batch = StateBatch::default();
    for k in from..to {
        batch
            .put(KeyGroup((k % 128) as u16), "sum", &k.to_be_bytes(), &value)
            .unwrap();
    }
    db.write(batch).unwrap();
}

fn get(db: &KeyedStateBackend, k: u64) -> Option<u64> {
    db.get(KeyGroup((k % 128) as u16), "sum", &k.to_be_bytes())
        .unwrap()
}

fn restore_db(work: &Path, o: &Opened) -> KeyedStateBackend {
    let (_, path, meta) = o.restored.as_ref().expect("a restored checkpoint");
    let restore: Vec<StateRestore> = meta
        .subtasks
        .iter()
        .map(|s| StateRestore {
            checkpoint_dir: path.clone(),
            snapshot: s.clone(),
            keep: None,
        })
        .collect();
    KeyedStateBackend::open(work, GROUPS, &restore).unwrap()
}

#[test]
fn publish_then_restore_the_newest_checkpoint_with_its_state() {
    for kind in KINDS {
        let mut line = Line::new(kind);
        let work = line.tmp.path().join("work");
        let o = line.open();
        assert!(o.restored.is_none(), "{kind:?}");
        assert_eq!(o.next_id, CheckpointId(1), "{kind:?}");
        let mut db = KeyedStateBackend::open(&work, GROUPS, &[]).unwrap();
        for id in 1..=3 {
            put(&mut db, 0, 1000, id);
            line.publish(&o, &mut db, id, 3);
        }
        drop((db, o));
        // A store line starts on a new pod: nothing local, everything from the store.
        line.new_pod(1);
        let o = line.open();
        let (id, path, _) = o.restored.as_ref().unwrap();
        assert_eq!(*id, CheckpointId(3), "{kind:?}");
        assert!(
            path.starts_with(&line.local),
            "{kind:?}: restored into {path:?}"
        );
        assert!(o.skipped.is_empty(), "{kind:?}: {:?}", o.skipped);
        assert_eq!(o.next_id, CheckpointId(4), "{kind:?}");
        let db = restore_db(&line.tmp.path().join("work2"), &o);
        assert_eq!(get(&db, 999), Some(3), "{kind:?}");
        assert_eq!(get(&db, 1000), None, "{kind:?}");
    }
}

#[test]
fn restore_skips_corrupt_newest_checkpoint_by_name_and_ids_continue() {
    for kind in KINDS {
        let mut line = Line::new(kind);
        let o = line.open();
        let mut db = KeyedStateBackend::open(&line.tmp.path().join("work"), GROUPS, &[]).unwrap();
        for id in 1..=2 {
            put(&mut db, 0, 100, id);
            line.publish(&o, &mut db, id, 3);
        }
        drop((db, o));
        line.corrupt_metadata(2);
        line.new_pod(1);
        let o = line.open();
        assert_eq!(o.restored.as_ref().unwrap().0, CheckpointId(1), "{kind:?}");
        assert_eq!(o.skipped.len(), 1, "{kind:?}: {:?}", o.skipped);
        assert!(
            o.skipped[0].contains("chk-0000000002"),
            "{kind:?}: {:?}",
            o.skipped
        );
        assert!(
            o.skipped[0].contains("CRC mismatch"),
            "{kind:?}: {:?}",
            o.skipped
        );
        if kind == Kind::Store {
            assert!(o.skipped[0].starts_with("s3://"), "{:?}", o.skipped);
        }
        // Ids continue after the corrupt one, which keeps its name for inspection.
        assert_eq!(o.next_id, CheckpointId(3), "{kind:?}");
        let mut db = restore_db(&line.tmp.path().join("work2"), &o);
        assert_eq!(get(&db, 5), Some(1), "{kind:?}");
        // Retention counts the corrupt one as unsound: 1 and 3 are the two sound ones.
        line.publish(&o, &mut db, 3, 2);
        if kind == Kind::Store {
            let keys = line.keys();
            assert!(
                keys.contains(&"chk-0000000001/_metadata".to_string()),
                "{keys:?}"
            );
            assert!(
                keys.contains(&"chk-0000000002/_metadata".to_string()),
                "{keys:?}"
            );
        }
    }
}

#[test]
fn a_state_file_missing_from_the_store_is_named_and_the_older_checkpoint_restored() {
    let mut line = Line::new(Kind::Store);
    let o = line.open();
    let mut db = KeyedStateBackend::open(&line.tmp.path().join("work"), GROUPS, &[]).unwrap();
    put(&mut db, 0, 100, 1);
    line.publish(&o, &mut db, 1, 3);
    let before: Vec<String> = line.keys();
    put(&mut db, 100, 200, 2);
    line.publish(&o, &mut db, 2, 3);
    drop((db, o));
    // Delete a state file only checkpoint 2 uses.
    let only_2 = line
        .keys()
        .into_iter()
        .find(|k| k.starts_with("shared/") && !before.contains(k))
        .unwrap();
    let (c, prefix) = line.client();
    line.rt
        .block_on(c.delete(&object_store::path::Path::from(format!(
            "{prefix}/{only_2}"
        ))))
        .unwrap();
    line.new_pod(1);
    let o = line.open();
    assert_eq!(o.restored.as_ref().unwrap().0, CheckpointId(1));
    assert!(
        o.skipped[0].contains("chk-0000000002") && o.skipped[0].contains("not found"),
        "{:?}",
        o.skipped
    );
    assert_eq!(o.next_id, CheckpointId(3));
}

#[test]
fn retention_deletes_only_after_a_newer_publish_and_collects_unreferenced_files() {
    for kind in KINDS {
        let line = Line::new(kind);
        let o = line.open();
        let mut db = KeyedStateBackend::open(&line.tmp.path().join("work"), GROUPS, &[]).unwrap();
        let ids = |line: &Line| -> Vec<u64> {
            match kind {
                Kind::Local => lockgate::state::snapshot_dir::list(&line.local)
                    .unwrap()
                    .into_iter()
                    .map(|e| e.id.0)
                    .collect(),
                Kind::Store => line
                    .keys()
                    .into_iter()
                    .filter_map(|k| {
                        k.strip_suffix("/_metadata")?
                            .strip_prefix("chk-")?
                            .parse()
                            .ok()
                    })
                    .collect(),
            }
        };
        for id in 1..=2 {
            // Enough distinct state per checkpoint that the files differ.
            put(&mut db, id * 1000, id * 1000 + 1000, id);
            line.publish(&o, &mut db, id, 2);
        }
        assert_eq!(
            ids(&line),
            vec![1, 2],
            "{kind:?}: nothing deleted before a newer publish"
        );
        put(&mut db, 3000, 4000, 3);
        line.publish(&o, &mut db, 3, 2);
        assert_eq!(ids(&line), vec![2, 3], "{kind:?}");
        if kind == Kind::Store {
            // Every state file in the store is referenced by a kept checkpoint, and
            // every file a kept checkpoint references is there.
            let keys = line.keys();
            let mut referenced = std::collections::BTreeSet::new();
            for id in [2u64, 3] {
                let m = lockgate::state::CheckpointMetadata::read(
                    &line.local.join(format!("chk-{id:010}")),
                )
                .unwrap();
                for f in lockgate::state::store::layout::stored_files(&m) {
                    assert!(keys.contains(&f.key), "{} missing", f.key);
                    referenced.insert(f.key);
                }
            }
            let shared: Vec<_> = keys.iter().filter(|k| k.starts_with("shared/")).collect();
            for k in &shared {
                assert!(referenced.contains(*k), "unreferenced {k} not collected");
            }
        }
    }
}

#[test]
fn a_second_checkpoint_of_an_unchanged_state_uploads_only_its_metadata() {
    let line = Line::new(Kind::Store);
    let o = line.open();
    let mut db = KeyedStateBackend::open(&line.tmp.path().join("work"), GROUPS, &[]).unwrap();
    put(&mut db, 0, 20_000, 1);
    let (objects1, bytes1) = line.publish(&o, &mut db, 1, 3);
    let (objects2, bytes2) = line.publish(&o, &mut db, 2, 3);
    let meta2 = std::fs::metadata(line.local.join("chk-0000000002/_metadata"))
        .unwrap()
        .len();
    assert!(
        objects1 > 1 && bytes1 > 100_000,
        "{objects1} objects, {bytes1} bytes"
    );
    assert_eq!((objects2, bytes2), (1, meta2), "only _metadata is uploaded");
    // A changed state uploads what changed (the WAL copy), not everything again.
    put(&mut db, 0, 10, 2);
    let (objects3, _) = line.publish(&o, &mut db, 3, 3);
    assert!(objects3 < objects1 + 1, "{objects3} objects");
}

#[test]
fn a_checkpoint_whose_upload_did_not_finish_is_never_restored() {
    let mut line = Line::new(Kind::Store);
    let o = line.open();
    let mut db = KeyedStateBackend::open(&line.tmp.path().join("work"), GROUPS, &[]).unwrap();
    put(&mut db, 0, 100, 1);
    line.publish(&o, &mut db, 1, 3);
    // Checkpoint 2 is published locally, but its upload never ran (the process died).
    put(&mut db, 0, 100, 2);
    let pending = o.dir.begin(CheckpointId(2)).unwrap();
    let files = db.checkpoint(&pending.join("sum-0")).unwrap();
    let mut meta = CheckpointMetadata::read(&line.local.join("chk-0000000001")).unwrap();
    meta.id = CheckpointId(2);
    meta.subtasks[0].files = files;
    o.dir.publish(&meta).unwrap();
    drop((db, o));
    // The same pod: the store decides, and ids continue after the local one too.
    let o = line.open();
    assert_eq!(o.restored.as_ref().unwrap().0, CheckpointId(1));
    assert_eq!(o.next_id, CheckpointId(3));
    drop(o);
    line.new_pod(1);
    let o = line.open();
    assert_eq!(o.restored.as_ref().unwrap().0, CheckpointId(1));
    assert_eq!(o.next_id, CheckpointId(2));
}

#[test]
fn abandoning_newer_checkpoints_in_the_store_keeps_them_out_of_later_starts() {
    let mut line = Line::new(Kind::Store);
    let o = line.open();
    let mut db = KeyedStateBackend::open(&line.tmp.path().join("work"), GROUPS, &[]).unwrap();
    for id in 1..=3 {
        put(&mut db, 0, 100, id);
        line.publish(&o, &mut db, id, 5);
    }
    let store = o.store.clone().unwrap();
    let abandoned = line
        .rt
        .block_on(store.abandon_newer(Some(CheckpointId(1))))
        .unwrap();
    assert_eq!(abandoned, vec!["chk-0000000002", "chk-0000000003"]);
    drop((db, o));
    line.new_pod(1);
    let o = line.open();
    assert_eq!(o.restored.as_ref().unwrap().0, CheckpointId(1));
    assert_eq!(o.next_id, CheckpointId(4), "abandoned ids are never reused");
    let keys = line.keys();
    assert!(
        keys.contains(&"chk-0000000003.abandoned/_metadata".to_string()),
        "{keys:?}"
    );
}

#[test]
fn a_state_file_larger_than_one_request_is_uploaded_in_parts_and_restored_whole() {
    let mut line = Line::new(Kind::Store);
    let o = line.open();
    // 23 MiB of incompressible bytes: more than one buffered request, so the upload
    // goes through a multipart upload.
    let pending = o.dir.begin(CheckpointId(1)).unwrap();
    std::fs::create_dir(pending.join("sum-0")).unwrap();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let big: Vec<u8> = (0..23 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(pending.join("sum-0/000042.sst"), &big).unwrap();
    let meta = keyed_metadata(
        CheckpointId(1),
        "orders",
        GROUPS,
        vec![lockgate::state::FileEntry {
            name: "000042.sst".into(),
            size: big.len() as u64,
            crc32: crc32fast::hash(&big),
        }],
    );
    let path = o.dir.publish(&meta).unwrap();
    let store = o.store.clone().unwrap();
    let up = line.rt.block_on(store.publish(&path)).unwrap();
    assert_eq!(up.objects, 2);
    drop(o);
    line.new_pod(1);
    let o = line.open();
    let (_, restored, _) = o.restored.as_ref().unwrap();
    assert_eq!(
        std::fs::read(restored.join("sum-0/000042.sst")).unwrap(),
        big
    );
}

/// moto honours `If-None-Match: *` on PUT, as S3 does: the create-if-absent write the
/// store publishes `_metadata` with refuses a second create of one key.
#[test]
fn the_store_refuses_a_second_create_of_one_key() {
    let line = Line::new(Kind::Store);
    let (c, prefix) = line.client();
    let key = object_store::path::Path::from(format!("{prefix}/chk-0000000001/_metadata"));
    line.rt.block_on(async {
        let create = || object_store::PutOptions::from(object_store::PutMode::Create);
        c.put_opts(&key, b"first".to_vec().into(), create())
            .await
            .unwrap();
        let second = c.put_opts(&key, b"second".to_vec().into(), create()).await;
        assert!(
            matches!(second, Err(object_store::Error::AlreadyExists { .. })),
            "{second:?}"
        );
        let kept = c.get(&key).await.unwrap().bytes().await.unwrap();
        assert_eq!(&kept[..], b"first");
    });
}

/// Two writers of one line (an old process still running on another machine): both
/// look for checkpoint 2's `_metadata` and find none, then both write it. The second
/// write is refused and fails naming the checkpoint and another writer; the first
/// writer's checkpoint stays as it wrote it. (Before the fix the second plain PUT
/// replaced it silently.)
#[test]
fn a_second_writer_of_one_checkpoint_is_fenced_even_when_both_looked_first() {
    use lockgate::testkit::fault_proxy::{Action, FaultProxy};
    use std::sync::mpsc;
    use std::sync::Mutex;
    let mut line = Line::new(Kind::Store);
    let a = line.open();
    let mut db_a = KeyedStateBackend::open(&line.tmp.path().join("work-a"), GROUPS, &[]).unwrap();
    put(&mut db_a, 0, 100, 1);
    line.publish(&a, &mut db_a, 1, 3);
    // Writer B: another pod, started from checkpoint 1, its store client behind a
    // proxy that holds its `_metadata` PUT until told.
    line.new_pod(1);
    let b = line.open();
    let (seen_tx, seen_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (seen_tx, go_rx) = (Mutex::new(seen_tx), Mutex::new(go_rx));
    let proxy = FaultProxy::start(moto().endpoint(), move |r| {
        if r.method == "PUT" && r.path().ends_with("/_metadata") {
            let _ = seen_tx.lock().unwrap().send(());
            let _ = go_rx.lock().unwrap().recv();
        }
        Action::Forward
    })
    .unwrap();
    let via_proxy = line
        .location
        .clone()
        .unwrap()
        .with_option("aws_endpoint", proxy.endpoint());
    let store_b = Arc::new(CheckpointStore::new(&via_proxy).unwrap());
    line.rt.block_on(store_b.scan()).unwrap();
    let mut db_b = KeyedStateBackend::open(&line.tmp.path().join("work-b"), GROUPS, &[]).unwrap();
    put(&mut db_b, 0, 100, 7);
    let path_b = publish_keyed(&b.dir, &mut db_b, GROUPS, "orders", CheckpointId(2)).unwrap();
    let sb = store_b.clone();
    let b_publish = line.rt.spawn(async move { sb.publish(&path_b).await });
    seen_rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("B's _metadata PUT reached the proxy");
    // Meanwhile writer A publishes its checkpoint 2.
    put(&mut db_a, 0, 100, 2);
    let path_a = publish_keyed(&a.dir, &mut db_a, GROUPS, "orders", CheckpointId(2)).unwrap();
    line.rt
        .block_on(a.store.as_ref().unwrap().publish(&path_a))
        .unwrap();
    go_tx.send(()).unwrap();
    drop(go_tx);
    let got = line.rt.block_on(b_publish).unwrap();
    let err = got.expect_err("the second writer of checkpoint 2 is refused");
    let text = err.to_string();
    assert!(
        text.contains("chk-0000000002") && text.contains("another writer"),
        "{text}"
    );
    // The store holds A's checkpoint 2, byte for byte.
    let (c, prefix) = line.client();
    let key = object_store::path::Path::from(format!("{prefix}/chk-0000000002/_metadata"));
    let held = line
        .rt
        .block_on(async { c.get(&key).await.unwrap().bytes().await.unwrap() });
    assert_eq!(
        &held[..],
        &std::fs::read(path_a.join("_metadata")).unwrap()[..]
    );
}

/// Two writers of one line: B, started from checkpoint 1, publishes checkpoint 4 from
/// that state (its state files are checkpoint 1's, already in the store); A, which
/// never saw checkpoint 4, publishes 2 and 3 and applies retention. A must not delete
/// the state files checkpoint 4 references. (Before the fix A's retention knew only
/// its own checkpoints and collected checkpoint 1's files, breaking checkpoint 4.)
#[test]
fn retention_keeps_the_state_files_of_another_writers_newer_checkpoint() {
    let mut line = Line::new(Kind::Store);
    let a = line.open();
    let mut db = KeyedStateBackend::open(&line.tmp.path().join("work-a"), GROUPS, &[]).unwrap();
    put(&mut db, 0, 1000, 1);
    line.publish(&a, &mut db, 1, 2);
    line.new_pod(1);
    let b = line.open();
    let (_, chk1_b, meta1) = b.restored.clone().expect("B restored checkpoint 1");
    // B publishes checkpoint 4 holding checkpoint 1's state.
    let pending = b.dir.begin(CheckpointId(4)).unwrap();
    for st in &meta1.subtasks {
        let Some(dir) = &st.state_dir else { continue };
        std::fs::create_dir_all(pending.join(dir)).unwrap();
        for f in &st.files {
            std::fs::copy(
                chk1_b.join(dir).join(&f.name),
                pending.join(dir).join(&f.name),
            )
            .unwrap();
        }
    }
    let mut meta4 = meta1.clone();
    meta4.id = CheckpointId(4);
    let path4 = b.dir.publish(&meta4).unwrap();
    let up = line
        .rt
        .block_on(b.store.as_ref().unwrap().publish(&path4))
        .unwrap();
    assert_eq!(
        up.objects, 1,
        "only _metadata: the state files are in the store"
    );
    // A goes on with other state, applying retention (retain 2) after each publish:
    // it sees B's checkpoint, which it did not write, and deletes nothing.
    let store_a = a.store.as_ref().unwrap();
    for id in 2..=3 {
        put(&mut db, id * 1000, id * 1000 + 1000, id);
        let path = publish_keyed(&a.dir, &mut db, GROUPS, "orders", CheckpointId(id)).unwrap();
        line.rt.block_on(store_a.publish(&path)).unwrap();
        let refused = line.rt.block_on(store_a.apply_retention(2)).unwrap_err();
        assert!(
            matches!(&refused, StateError::Fenced { url, .. } if url.ends_with("chk-0000000004")),
            "{refused}"
        );
    }
    // Checkpoint 4 still downloads and verifies on a new pod.
    line.new_pod(2);
    let fresh = CheckpointStore::new(line.location.as_ref().unwrap()).unwrap();
    line.rt.block_on(fresh.scan()).unwrap();
    let got = line
        .rt
        .block_on(fresh.download("chk-0000000004", &line.local))
        .unwrap();
    assert!(
        got.is_ok(),
        "checkpoint 4 broken by another writer's retention: {:?}",
        got.err()
    );
}
