//! The I/O of checkpoints in an object store: upload of a published local checkpoint,
//! the start (list, choose, download, verify), retention and garbage collection. The
//! decisions are the pure functions of [`super::layout`] and [`crate::restore`].
//!
//! Guarantees:
//! - a checkpoint is complete in the store exactly when its `_metadata` is there, and
//!   `_metadata` is written after every file it lists is uploaded;
//! - a state file already in the store (same content name and size) is not uploaded
//!   again;
//! - a restore downloads into a fresh local directory and verifies every file's size
//!   and CRC32 before the checkpoint is used; a checkpoint that does not verify is
//!   named and skipped for an older one, but a store that cannot be reached fails the
//!   start instead of falling back;
//! - `_metadata` is created only if absent (`If-None-Match: *` on S3): of two writers
//!   of one checkpoint name, the second is refused ([`StateError::Fenced`]), and a
//!   retried write whose first attempt landed is recognised by its bytes;
//! - a checkpoint whose `_metadata` write failed is reported absent only once the
//!   store said so; when it cannot be asked, the error says the fate is unknown
//!   ([`StateError::FateUnknown`]);
//! - retention deletes a checkpoint's `_metadata` first, then the state files no
//!   `_metadata` in the store references (re-listed and read at every pass), and only
//!   after a newer checkpoint is published.
//!
//! One process works on one prefix at a time (the local staging directory's lock keeps
//! two on one machine apart). Across machines the store has no lock: a second writer
//! is detected when both publish a checkpoint of one id, not before; until then both
//! write checkpoints of their own ids into the line.

use super::layout::{
    abandoned_name, collectable, metadata_fate, metadata_key, parse_listing, stored_files,
    to_upload, MetadataFate, MetadataRead, MetadataWrite, StoreListing,
};
use super::location::StoreLocation;
use crate::durable;
use crate::error::{Result, StateError};
use crate::ids::CheckpointId;
use crate::metadata::{CheckpointMetadata, METADATA_FILE};
use crate::restore::{self, CheckpointEntry, EntryStatus};
use crate::snapshot_dir::{chk_name, Restored};
use crate::verify;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, PutMode, PutPayload};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::AsyncWriteExt;

/// Files uploaded or downloaded at once.
const CONCURRENCY: usize = 4;

/// What one upload did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UploadStats {
    /// Objects written, `_metadata` included.
    pub objects: u64,
    /// Bytes written, `_metadata` included.
    pub bytes: u64,
    /// State files already in the store, not uploaded again.
    pub reused: u64,
}

/// What a start found in the store.
#[derive(Debug)]
pub struct StoreStartup {
    /// The newest checkpoint that verified, downloaded into the local directory.
    pub restored: Option<Restored>,
    /// Complete checkpoints that did not verify (their URLs and why), newest first.
    pub skipped: Vec<(String, String)>,
    /// The id after every id present in the store.
    pub next_id: CheckpointId,
}

/// What a retention pass deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionOutcome {
    /// Checkpoint entries deleted.
    pub deleted: Vec<String>,
    /// Unreferenced state files deleted.
    pub collected: usize,
}

#[derive(Default)]
struct Known {
    entries: BTreeMap<String, CheckpointEntry>,
    shared: HashMap<String, u64>,
    /// Decoded `_metadata` of entries (`None`: does not decode).
    metas: HashMap<String, Option<CheckpointMetadata>>,
    corrupt: HashSet<CheckpointId>,
}

/// Checkpoints under one prefix of an object store.
pub struct CheckpointStore {
    location: StoreLocation,
    store: Arc<dyn ObjectStore>,
    prefix: StorePath,
    known: Mutex<Known>,
    bytes_up: AtomicU64,
    objects_up: AtomicU64,
}

impl std::fmt::Debug for CheckpointStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointStore")
            .field("location", &self.location)
            .finish()
    }
}

/// Why a checkpoint could not be fetched: it does not verify (skip it), or the store
/// or the local disk failed (fail the start).
enum FetchError {
    Corrupt(String),
    Failed(StateError),
}

impl From<StateError> for FetchError {
    fn from(e: StateError) -> Self {
        FetchError::Failed(e)
    }
}

impl CheckpointStore {
    /// A client for `location` (no request is made yet).
    pub fn new(location: &StoreLocation) -> Result<CheckpointStore> {
        let (store, prefix) = location.open().map_err(|message| StateError::Store {
            op: "configure",
            key: location.to_string(),
            message,
        })?;
        Ok(CheckpointStore::with_client(
            location.clone(),
            store,
            prefix,
        ))
    }

    /// A store over a client built elsewhere (tests use an in-memory store).
    pub fn with_client(
        location: StoreLocation,
        store: Arc<dyn ObjectStore>,
        prefix: StorePath,
    ) -> CheckpointStore {
        CheckpointStore {
            location,
            store,
            prefix,
            known: Mutex::new(Known::default()),
            bytes_up: AtomicU64::new(0),
            objects_up: AtomicU64::new(0),
        }
    }

    /// The location.
    pub fn location(&self) -> &StoreLocation {
        &self.location
    }

    /// The URL of an entry (`s3://bucket/prefix/chk-0000000042`), for logs.
    pub fn url_of(&self, name: &str) -> String {
        self.location.join(name).to_string()
    }

    /// Bytes and objects written by this client so far.
    pub fn uploaded(&self) -> (u64, u64) {
        (
            self.bytes_up.load(Ordering::Relaxed),
            self.objects_up.load(Ordering::Relaxed),
        )
    }

    fn key(&self, rel: &str) -> StorePath {
        let mut parts: Vec<object_store::path::PathPart<'_>> = self.prefix.parts().collect();
        parts.extend(rel.split('/').map(object_store::path::PathPart::from));
        StorePath::from_iter(parts)
    }

    fn err(&self, op: &'static str, rel: &str) -> impl Fn(object_store::Error) -> StateError {
        let key = self.location.join(rel).to_string();
        move |e| StateError::Store {
            op,
            key: key.clone(),
            message: e.to_string(),
        }
    }

    /// Lists everything under the prefix and remembers it.
    pub async fn scan(&self) -> Result<StoreListing> {
        let listing = self.list_all().await?;
        let mut k = self.known.lock().expect("store state");
        k.entries = listing
            .entries
            .iter()
            .map(|e| (e.name.clone(), e.clone()))
            .collect();
        k.shared = listing.shared.clone();
        Ok(listing)
    }

    /// Lists everything under the prefix.
    async fn list_all(&self) -> Result<StoreListing> {
        let objects: Vec<_> = self
            .store
            .list(Some(&self.prefix))
            .map_err(self.err("list", ""))
            .try_collect()
            .await?;
        let listing = parse_listing(objects.into_iter().filter_map(|m| {
            let rel: Vec<String> = m
                .location
                .prefix_match(&self.prefix)?
                .map(|p| p.as_ref().to_string())
                .collect();
            Some((rel.join("/"), m.size))
        }));
        Ok(listing)
    }

    /// The checkpoint entries under the prefix, each with its decoded `_metadata` (or
    /// why it does not decode); for `lockgate checkpoints list`.
    pub async fn list(
        &self,
    ) -> Result<Vec<(CheckpointEntry, Option<Result<CheckpointMetadata, String>>)>> {
        let listing = self.scan().await?;
        let mut out = Vec::new();
        for e in listing.entries {
            let meta = match e.status {
                EntryStatus::Complete | EntryStatus::Abandoned => {
                    Some(match self.read_metadata(&e.name).await {
                        Ok(m) => Ok(m),
                        Err(FetchError::Corrupt(why)) => Err(why),
                        Err(FetchError::Failed(err)) => return Err(err),
                    })
                }
                _ => None,
            };
            out.push((e, meta));
        }
        Ok(out)
    }

    /// The newest complete checkpoint whose `_metadata` reads, and whether it is a
    /// final one (its state files are not read: that costs as much as the state); and
    /// the id after every id present.
    pub async fn newest_readable(&self) -> Result<(Option<(CheckpointId, bool)>, CheckpointId)> {
        let listing = self.scan().await?;
        let plan = restore::restore_plan(&listing.entries);
        for &id in &plan.candidates {
            match self.read_metadata(&chk_name(id)).await {
                Ok(m) => return Ok((Some((id, m.is_final)), plan.next_id)),
                Err(FetchError::Corrupt(_)) => continue,
                Err(FetchError::Failed(e)) => return Err(e),
            }
        }
        Ok((None, plan.next_id))
    }

    /// The names of the folders directly under the prefix (`chk-N`, `shared`, and any
    /// other, such as a member's line).
    pub async fn folders(&self) -> Result<Vec<String>> {
        let listed = self
            .store
            .list_with_delimiter(Some(&self.prefix))
            .await
            .map_err(self.err("list", ""))?;
        Ok(listed
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_string))
            .collect())
    }

    async fn read_metadata_bytes(&self, name: &str) -> std::result::Result<Vec<u8>, FetchError> {
        let rel = metadata_key(name);
        match self.store.get(&self.key(&rel)).await {
            Ok(r) => Ok(r.bytes().await.map_err(self.err("read", &rel))?.to_vec()),
            Err(object_store::Error::NotFound { .. }) => Err(FetchError::Corrupt(format!(
                "{}: not found",
                self.url_of(&rel)
            ))),
            Err(e) => Err(FetchError::Failed(self.err("read", &rel)(e))),
        }
    }

    async fn read_metadata(
        &self,
        name: &str,
    ) -> std::result::Result<CheckpointMetadata, FetchError> {
        let bytes = self.read_metadata_bytes(name).await?;
        let path = PathBuf::from(self.url_of(&metadata_key(name)));
        let meta = CheckpointMetadata::decode(&bytes, &path)
            .map_err(|e| FetchError::Corrupt(e.to_string()));
        self.known
            .lock()
            .expect("store state")
            .metas
            .insert(name.to_string(), meta.as_ref().ok().cloned());
        meta
    }

    /// Starts from the store: lists it, removes unfinished entries, and downloads the
    /// newest checkpoint that verifies into `local_root/chk-N` (reusing a local copy
    /// whose `_metadata` is byte-identical and whose files verify). A checkpoint that
    /// does not verify is named in `skipped` and remembered as corrupt (retention does
    /// not count it as sound); a failure of the store or of the local disk is an error.
    pub async fn start(&self, local_root: &Path) -> Result<StoreStartup> {
        self.choose(local_root, true).await
    }

    /// Downloads the newest checkpoint of the store that verifies into `local_root`
    /// (for `--restore` of a store prefix), changing nothing in the store.
    pub async fn newest(&self, local_root: &Path) -> Result<StoreStartup> {
        self.choose(local_root, false).await
    }

    async fn choose(&self, local_root: &Path, remove_unfinished: bool) -> Result<StoreStartup> {
        let listing = self.scan().await?;
        let plan = restore::restore_plan(&listing.entries);
        for name in plan.remove.iter().filter(|_| remove_unfinished) {
            for key in listing.entry_objects.get(name).into_iter().flatten() {
                self.delete(key).await?;
            }
            self.known.lock().expect("store state").entries.remove(name);
        }
        let mut skipped = Vec::new();
        let mut restored = None;
        for &id in &plan.candidates {
            match self.fetch(&chk_name(id), local_root).await {
                Ok(r) => {
                    restored = Some(r);
                    break;
                }
                Err(FetchError::Corrupt(why)) => {
                    self.known.lock().expect("store state").corrupt.insert(id);
                    skipped.push((self.url_of(&chk_name(id)), why));
                }
                Err(FetchError::Failed(e)) => return Err(e),
            }
        }
        Ok(StoreStartup {
            restored,
            skipped,
            next_id: plan.next_id,
        })
    }

    /// Downloads and verifies checkpoint `name` of the store into `local_root/name`
    /// (for `--restore` of one named checkpoint). `Ok(Err(why))`: it does not verify.
    pub async fn download(
        &self,
        name: &str,
        local_root: &Path,
    ) -> Result<std::result::Result<Restored, String>> {
        match self.fetch(name, local_root).await {
            Ok(r) => Ok(Ok(r)),
            Err(FetchError::Corrupt(why)) => Ok(Err(why)),
            Err(FetchError::Failed(e)) => Err(e),
        }
    }

    async fn fetch(
        &self,
        name: &str,
        local_root: &Path,
    ) -> std::result::Result<Restored, FetchError> {
        let bytes = self.read_metadata_bytes(name).await?;
        let url_meta = PathBuf::from(self.url_of(&metadata_key(name)));
        let meta = CheckpointMetadata::decode(&bytes, &url_meta)
            .map_err(|e| FetchError::Corrupt(e.to_string()))?;
        self.known
            .lock()
            .expect("store state")
            .metas
            .insert(name.to_string(), Some(meta.clone()));
        let target = local_root.join(name);
        // A local copy of the same checkpoint (the same `_metadata`, byte for byte, and
        // ids are never reused) that verifies spares the download.
        let local_meta = target.join(METADATA_FILE);
        if tokio::fs::read(&local_meta).await.ok().as_deref() == Some(&bytes[..]) {
            let t = target.clone();
            if let Ok(Ok(m)) =
                tokio::task::spawn_blocking(move || verify::verify_checkpoint(&t)).await
            {
                return Ok(Restored {
                    path: target,
                    metadata: m,
                });
            }
        }
        let staging = local_root.join(format!("{name}.inprogress"));
        remove_dir_if_present(&staging).await?;
        tokio::fs::create_dir_all(&staging)
            .await
            .map_err(StateError::io("create", &staging))?;
        for st in &meta.subtasks {
            if let Some(dir) = &st.state_dir {
                let d = staging.join(dir);
                tokio::fs::create_dir_all(&d)
                    .await
                    .map_err(StateError::io("create", &d))?;
            }
        }
        let files = stored_files(&meta);
        futures::stream::iter(files.into_iter().map(|f| {
            let to = staging.join(&f.local);
            async move { self.download_file(&f.key, &to).await }
        }))
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
        for st in &meta.subtasks {
            if let Some(dir) = &st.state_dir {
                durable::fsync_dir(&staging.join(dir))?;
            }
        }
        durable::publish(&staging, METADATA_FILE, &bytes)?;
        let s = staging.clone();
        let checked = tokio::task::spawn_blocking(move || verify::verify_checkpoint(&s))
            .await
            .map_err(|e| StateError::Encode(format!("verification panicked: {e}")))?;
        let metadata = match checked {
            Ok(m) => m,
            Err(why) => {
                remove_dir_if_present(&staging).await?;
                return Err(FetchError::Corrupt(format!(
                    "{} (downloaded: {why})",
                    self.url_of(name)
                )));
            }
        };
        remove_dir_if_present(&target).await?;
        durable::rename_durable(&staging, &target)?;
        Ok(Restored {
            path: target,
            metadata,
        })
    }

    async fn download_file(&self, rel: &str, to: &Path) -> std::result::Result<(), FetchError> {
        let got = match self.store.get(&self.key(rel)).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(FetchError::Corrupt(format!(
                    "{}: not found",
                    self.url_of(rel)
                )))
            }
            Err(e) => return Err(FetchError::Failed(self.err("read", rel)(e))),
        };
        let mut file = tokio::fs::File::create(to)
            .await
            .map_err(StateError::io("create", to))?;
        let mut stream = got.into_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(self.err("read", rel))?;
            file.write_all(&chunk)
                .await
                .map_err(StateError::io("write", to))?;
        }
        file.sync_all().await.map_err(StateError::io("fsync", to))?;
        Ok(())
    }

    /// Uploads the published local checkpoint `local_chk` (`.../chk-N`): every state
    /// file the store does not hold yet, then `_metadata` (the same bytes as the local
    /// one), created only if absent. When this returns `Ok` the checkpoint is complete
    /// in the store (also when an earlier attempt of the same write landed). After an
    /// error:
    /// - [`StateError::Fenced`]: another writer's `_metadata` has this name; another
    ///   process publishes to this line;
    /// - [`StateError::FateUnknown`]: the `_metadata` write failed and the store could
    ///   not be asked whether it landed: the checkpoint may be complete, so nothing it
    ///   references may be removed before a start has read the store;
    /// - any other: the checkpoint is not in the store, and what was uploaded of it is
    ///   collected by a later retention pass.
    pub async fn publish(&self, local_chk: &Path) -> Result<UploadStats> {
        let meta_path = local_chk.join(METADATA_FILE);
        let bytes = tokio::fs::read(&meta_path)
            .await
            .map_err(StateError::io("read", &meta_path))?;
        let meta = CheckpointMetadata::decode(&bytes, &meta_path)?;
        let name = chk_name(meta.id);
        let present = self.known.lock().expect("store state").shared.clone();
        let files = to_upload(&meta, &present);
        let reused = stored_files(&meta).len() as u64 - files.len() as u64;
        let mut stats = UploadStats {
            reused,
            ..UploadStats::default()
        };
        let done: Vec<(String, u64)> = futures::stream::iter(files.into_iter().map(|f| {
            let from = local_chk.join(&f.local);
            async move {
                self.upload_file(&from, &f.key).await?;
                Ok::<_, StateError>((f.key, f.size))
            }
        }))
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await?;
        {
            let mut k = self.known.lock().expect("store state");
            for (key, size) in &done {
                k.shared.insert(key.clone(), *size);
                stats.objects += 1;
                stats.bytes += size;
            }
        }
        let rel = metadata_key(&name);
        let len = bytes.len() as u64;
        let written = self.create_metadata(&rel, &bytes).await;
        let read = match written {
            MetadataWrite::Created => None,
            _ => Some(self.read_back(&rel).await),
        };
        let mut fate = metadata_fate(&written, read.as_ref(), &bytes);
        if let (MetadataWrite::Failed(_), MetadataFate::Absent(why)) = (&written, &fate) {
            // A write that failed may still land (a request the store processes after
            // its answer was lost, or late): "absent" now is not final. Write again:
            // its answer is conclusive unless it fails too, and then the fate is
            // unknown (the restart reads the store) rather than abandonable.
            let again = self.create_metadata(&rel, &bytes).await;
            let read = match again {
                MetadataWrite::Created => None,
                _ => Some(self.read_back(&rel).await),
            };
            fate = match metadata_fate(&again, read.as_ref(), &bytes) {
                MetadataFate::Absent(w) => {
                    MetadataFate::Unknown(format!("{why}; written again: {w}"))
                }
                f => f,
            };
        }
        match fate {
            MetadataFate::Published => {}
            MetadataFate::Absent(why) => {
                return Err(StateError::Store {
                    op: "write",
                    key: self.url_of(&rel),
                    message: why,
                })
            }
            MetadataFate::Fenced(reason) => {
                return Err(StateError::Fenced {
                    url: self.url_of(&name),
                    reason,
                })
            }
            MetadataFate::Unknown(reason) => {
                return Err(StateError::FateUnknown {
                    url: self.url_of(&name),
                    reason,
                })
            }
        }
        self.count_up(len);
        stats.objects += 1;
        stats.bytes += len;
        let mut k = self.known.lock().expect("store state");
        k.entries.insert(
            name.clone(),
            CheckpointEntry {
                id: meta.id,
                name: name.clone(),
                status: EntryStatus::Complete,
            },
        );
        k.metas.insert(name, Some(meta));
        Ok(stats)
    }

    /// Writes `_metadata` only if no object of its name exists (`If-None-Match: *` on
    /// S3): of two writers of one name, one is refused. A store without conditional
    /// writes (`http://`, or `aws_conditional_put = "disabled"`) gets a look, then a
    /// plain write, and no fencing.
    async fn create_metadata(&self, rel: &str, bytes: &[u8]) -> MetadataWrite {
        let key = self.key(rel);
        let payload = || PutPayload::from(bytes.to_vec());
        match self
            .store
            .put_opts(&key, payload(), PutMode::Create.into())
            .await
        {
            Ok(_) => MetadataWrite::Created,
            Err(object_store::Error::AlreadyExists { .. }) => MetadataWrite::Exists,
            Err(object_store::Error::NotImplemented) => {
                tracing::warn!(checkpoint = %self.url_of(rel), "the store cannot create an object only if it is absent: two writers of this checkpoint line would not be told apart");
                match self.store.head(&key).await {
                    Ok(_) => MetadataWrite::Exists,
                    Err(object_store::Error::NotFound { .. }) => {
                        match self.store.put(&key, payload()).await {
                            Ok(_) => MetadataWrite::Created,
                            Err(e) => MetadataWrite::Failed(e.to_string()),
                        }
                    }
                    Err(e) => MetadataWrite::Failed(e.to_string()),
                }
            }
            Err(e) => MetadataWrite::Failed(e.to_string()),
        }
    }

    /// Reads `_metadata` back after a write that did not plainly create it.
    async fn read_back(&self, rel: &str) -> MetadataRead {
        match self.store.get(&self.key(rel)).await {
            Ok(r) => match r.bytes().await {
                Ok(b) => MetadataRead::Holds(b.to_vec()),
                Err(e) => MetadataRead::Failed(e.to_string()),
            },
            Err(object_store::Error::NotFound { .. }) => MetadataRead::Absent,
            Err(e) => MetadataRead::Failed(e.to_string()),
        }
    }

    fn count_up(&self, bytes: u64) {
        self.bytes_up.fetch_add(bytes, Ordering::Relaxed);
        self.objects_up.fetch_add(1, Ordering::Relaxed);
    }

    async fn upload_file(&self, from: &Path, rel: &str) -> Result<()> {
        let mut file = tokio::fs::File::open(from)
            .await
            .map_err(StateError::io("read", from))?;
        let mut w = object_store::buffered::BufWriter::new(self.store.clone(), self.key(rel));
        let copied = tokio::io::copy(&mut file, &mut w).await;
        let n = match copied {
            Ok(n) => n,
            Err(e) => {
                let _ = w.abort().await;
                return Err(StateError::Store {
                    op: "upload",
                    key: self.url_of(rel),
                    message: format!("{}: {e}", from.display()),
                });
            }
        };
        w.shutdown().await.map_err(|e| StateError::Store {
            op: "upload",
            key: self.url_of(rel),
            message: e.to_string(),
        })?;
        self.count_up(n);
        Ok(())
    }

    async fn delete(&self, rel: &str) -> Result<()> {
        match self.store.delete(&self.key(rel)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.err("delete", rel)(e)),
        }
    }

    /// Deletes checkpoints older than the newest `retain` sound ones (the rule of
    /// [`restore::retention_victims`]; checkpoints skipped at start count as corrupt),
    /// `_metadata` first, then the state files that no `_metadata` in the store
    /// references. The store is listed again first, and every `_metadata` it holds is
    /// read, another writer's included: a file a newer checkpoint of someone else
    /// references is never deleted, and only files this client uploaded or listed at
    /// its start are candidates (one another writer just uploaded for a checkpoint
    /// whose `_metadata` is still on its way is not). Call only after a publish.
    pub async fn apply_retention(&self, retain: usize) -> Result<RetentionOutcome> {
        let listing = self.list_all().await?;
        let corrupt = {
            let mut k = self.known.lock().expect("store state");
            // A complete checkpoint this client neither listed at its start nor
            // published: another writer shares the line, and its ids would count toward
            // `retain` (deleting ours). Nothing is deleted while that is so.
            if let Some(e) = listing
                .entries
                .iter()
                .find(|e| e.status == EntryStatus::Complete && !k.entries.contains_key(&e.name))
            {
                return Err(StateError::Fenced {
                    url: self.url_of(&e.name),
                    reason: "another writer published it since this process listed the line; retention deletes nothing while two writers share it".into(),
                });
            }
            k.entries = listing
                .entries
                .iter()
                .map(|e| (e.name.clone(), e.clone()))
                .collect();
            let listed = &listing.shared;
            k.shared.retain(|key, _| listed.contains_key(key));
            k.corrupt.clone()
        };
        let entries: Vec<_> = listing
            .entries
            .iter()
            .cloned()
            .map(|mut e| {
                if corrupt.contains(&e.id) {
                    e.status = EntryStatus::Corrupt("skipped at restore".into());
                }
                e
            })
            .collect();
        let victims = restore::retention_victims(&entries, retain);
        for name in &victims {
            self.delete(&metadata_key(name)).await?;
            let mut k = self.known.lock().expect("store state");
            k.entries.remove(name);
            k.metas.remove(name);
        }
        // What stays references its state files; a `_metadata` that does not decode
        // references nothing (it can never be restored).
        let remaining: Vec<String> = listing
            .entries
            .iter()
            .filter(|e| e.status != EntryStatus::InProgress && !victims.contains(&e.name))
            .map(|e| e.name.clone())
            .collect();
        let mut kept = Vec::new();
        // A `_metadata` of a format this release does not read (a newer release writing
        // the same store, in a rolling upgrade) references files this pass cannot see:
        // nothing is collected then. One that is damaged references nothing.
        let mut unreadable = false;
        for name in remaining {
            let cached = self
                .known
                .lock()
                .expect("store state")
                .metas
                .get(&name)
                .cloned();
            let meta = match cached {
                Some(m) => m,
                None => match self.read_metadata(&name).await {
                    Ok(m) => Some(m),
                    Err(FetchError::Corrupt(why)) => {
                        unreadable |= why.contains("format version");
                        None
                    }
                    Err(FetchError::Failed(e)) => return Err(e),
                },
            };
            kept.extend(meta);
        }
        if unreadable {
            return Ok(RetentionOutcome {
                deleted: victims,
                collected: 0,
            });
        }
        let garbage = {
            let k = self.known.lock().expect("store state");
            collectable(
                k.shared.keys(),
                &listing.shared,
                &kept.iter().collect::<Vec<_>>(),
            )
        };
        for key in &garbage {
            self.delete(key).await?;
            self.known.lock().expect("store state").shared.remove(key);
        }
        Ok(RetentionOutcome {
            deleted: victims,
            collected: garbage.len(),
        })
    }

    /// Renames (copies, then deletes) the `_metadata` of every sound complete checkpoint
    /// newer than `restored` (all of them when `None`) to `chk-N.abandoned/`: a later
    /// start must never resume the line the job left. Checkpoints skipped at start keep
    /// their names for inspection.
    pub async fn abandon_newer(&self, restored: Option<CheckpointId>) -> Result<Vec<String>> {
        let (entries, corrupt) = {
            let k = self.known.lock().expect("store state");
            (
                k.entries.values().cloned().collect::<Vec<_>>(),
                k.corrupt.clone(),
            )
        };
        let mut out = Vec::new();
        for e in entries {
            let newer = restored.is_none_or(|k| e.id > k);
            if e.status != EntryStatus::Complete || !newer || corrupt.contains(&e.id) {
                continue;
            }
            let to = abandoned_name(e.id);
            let (from_key, to_key) = (metadata_key(&e.name), metadata_key(&to));
            self.store
                .copy(&self.key(&from_key), &self.key(&to_key))
                .await
                .map_err(self.err("copy", &from_key))?;
            self.delete(&from_key).await?;
            let mut k = self.known.lock().expect("store state");
            k.entries.remove(&e.name);
            let meta = k.metas.remove(&e.name);
            k.entries.insert(
                to.clone(),
                CheckpointEntry {
                    id: e.id,
                    name: to.clone(),
                    status: EntryStatus::Abandoned,
                },
            );
            if let Some(m) = meta {
                k.metas.insert(to, m);
            }
            out.push(e.name);
        }
        Ok(out)
    }
}

async fn remove_dir_if_present(p: &Path) -> Result<()> {
    match tokio::fs::remove_dir_all(p).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StateError::Io {
            op: "remove",
            path: p.to_path_buf(),
            source: e,
        }),
    }
}
