//! The file sink's writer into an object store (`dir = "s3://bucket/prefix"`): the same
//! protocol as in a local directory, with objects for files.
//!
//! - A part is written in memory and put, whole, when it is closed (at the barrier,
//!   once it holds `roll_bytes`, or when the open parts of a subtask together pass
//!   their memory bound, largest first) under `<prefix>/_staging/` (readers skip folders
//!   that begin with `_`, as Spark and Hive do), as `inprogress-<token>[.ext]`: one
//!   PUT, so an object is there complete or not at all, and no upload is left half
//!   done by a crash. The checkpoint names the tokens of its parts.
//!   The parts closed at one barrier are put at once (a few at a time), and the
//!   checkpoint names them only once all are there. A Parquet part's rows are encoded
//!   off the sink's task while it takes the next records ([`super::store_part`]); the
//!   barrier waits for the last of them.
//! - The commit copies each to its final name `<prefix>/<folder>/part-<subtask>-<checkpoint>[-<n>][.ext]`
//!   and deletes the staged object, the files of one checkpoint 8 at a time after the
//!   first; a commit again after a crash copies again (the same bytes) or finds the
//!   final object there. It runs off the sink's task ([`TwoPhaseWriter::committer`]),
//!   while the next records are taken. The copy goes first, with no look-up
//!   ([`after_copy`]): a staged object that is not there any more fails it as missing,
//!   and only then is the final object looked for.
//! - A restore deletes the staged objects of this job's subtasks that the restored
//!   checkpoint does not name, and moves the final objects of checkpoints after it to
//!   `<prefix>/_rolled-back/` (their records are written again): nothing the job wrote
//!   is deleted before the output that replaces it is there.
//!
//! What a subtask holds in memory is bounded: its open parts together by
//! `memory_bytes` (the largest are put once they pass it), each by `roll_bytes` (128
//! MiB unless set). A part is closed after the write that brings its size to
//! `roll_bytes`, so it may pass it by what one batch adds to its folder (a source's
//! poll: 256 records of the sequence source, about 1 MiB from Kafka); a Parquet part
//! counts the rows it has not encoded yet by their Arrow size and, once that estimate
//! reaches `roll_bytes`, encodes them to decide on the writer's own figure (rows that
//! take more room encoded than in Arrow, which Parquet's encodings seldom do, may add
//! up to [`super::store_part::ENCODE_ROWS`] more). The sink reports as buffered
//! (`lockgate_buffered_bytes{stage="sink"}`) all of a part of lines, and of a Parquet
//! part its row group and the rows not yet encoded (which a flush writes out): the
//! row groups already written out stay until the part is put, within the bounds above.
//!
//! A record whose folder would make an object key longer than an object store takes
//! ([`STORE_MAX_KEY`], [`longest_key`]) is refused when its batch is checked: the item
//! error policy decides, as for a value the format cannot hold.
//!
//! The store itself is shared: a restore on another machine finds the output where the
//! job left it. The object `_lockgate-file-sink` under the prefix names the job that
//! writes there; another job's prefix is refused, as in a directory.

use super::names::{
    committed_name, decode_staged, encode_staged, parse_part_name, parse_staged_name, part_subtask,
    restore_action, writer_name, Named, Part, RestoreAction, Staged, StagedFile,
};
use super::part::{parts_to_close, OpenedOf, PartSize, PartsOf};
use super::placed::{records, Checked, Placed};
use super::section::FileSinkConfig;
use super::store_part::StorePart;
use super::writer::{partition_folder, FORMAT_EXTENSIONS};
use crate::connector::SubtaskInfo;
use crate::error::{JobError, Result};
use crate::kits::{Commit, TwoPhaseWriter};
use crate::record::Batch;
use async_trait::async_trait;
use futures_util::{StreamExt, TryStreamExt};
use lockgate_state::store::StoreLocation;
use lockgate_state::CheckpointId;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, PutPayload};
use std::sync::{Arc, Mutex};
use tracing::warn;

/// The folder under the prefix that holds staged parts.
pub const STAGING: &str = "_staging";

/// The folder under the prefix that receives parts rolled back by a restore.
pub const STORE_ROLLED_BACK: &str = "_rolled-back";

/// The object under the prefix that names the job writing there (readers skip names
/// that begin with `_`).
pub const STORE_MARKER: &str = "_lockgate-file-sink";

/// The prefix of a staged object's name (then its token and extension).
const IN_PROGRESS: &str = "inprogress-";

/// The parts of one barrier put at once, and the files of one checkpoint committed at
/// once, at most.
const PUTS_AT_ONCE: usize = 8;

/// What a commit does once it tried to copy a staged part to its final name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterCopy {
    /// The final object is there: the staged one may go.
    DeleteStaged,
    /// No staged object: an earlier commit copied and deleted it (a crash came before
    /// the checkpoint knew), or it is lost; the final object tells which.
    LookForFinal,
    /// The store failed: the commit fails, and is tried again.
    Fail,
}

/// What follows the copy of a staged part to its final name: the copy goes first, with
/// no look-up before it, because the staged object is there in all but the rare commit
/// after a crash, and its absence is told by the copy itself.
pub fn after_copy(copied: &object_store::Result<()>) -> AfterCopy {
    match copied {
        Ok(()) => AfterCopy::DeleteStaged,
        Err(object_store::Error::NotFound { .. }) => AfterCopy::LookForFinal,
        Err(_) => AfterCopy::Fail,
    }
}

/// The file sink's writer into an object store.
pub struct StoreWriter {
    cfg: FileSinkConfig,
    location: StoreLocation,
    /// The store and prefix, once open.
    store: Option<Arc<Committing>>,
    index: u16,
    parallelism: u16,
    name: String,
    /// In a mutex only to make the writer `Sync` (a Parquet writer is not), so that
    /// `&self` may be held across the store's awaits; only `&mut self` uses it.
    parts: Mutex<PartsOf<StorePart>>,
    /// The parts put since the last barrier (by `roll_bytes`), in order.
    closed: Vec<StagedFile>,
    placed: Checked,
}

impl StoreWriter {
    /// A subtask's writer into `location` (the sink's `dir`).
    pub fn new(cfg: FileSinkConfig, location: StoreLocation) -> StoreWriter {
        StoreWriter {
            cfg,
            location,
            store: None,
            index: 0,
            parallelism: 1,
            name: String::new(),
            parts: Mutex::new(PartsOf::new(writer_name())),
            closed: Vec::new(),
            placed: Checked::default(),
        }
    }

    fn err(&self, what: &str, key: &StorePath, e: impl std::fmt::Display) -> JobError {
        JobError::task(
            &self.name,
            format!("{what} {}/{key}: {e}", self.location.bucket()),
        )
    }

    /// What commits this subtask's parts into `store` under `prefix`.
    fn committing_of(&self, store: Arc<dyn ObjectStore>, prefix: StorePath) -> Arc<Committing> {
        Arc::new(Committing {
            store,
            prefix,
            bucket: self.location.bucket().to_string(),
            name: self.name.clone(),
            ext: self.cfg.format.extension().to_string(),
        })
    }

    fn committing(&self) -> Result<&Arc<Committing>> {
        self.store
            .as_ref()
            .ok_or_else(|| JobError::task(&self.name, "the object store is not open"))
    }

    fn store(&self) -> Result<(&Arc<dyn ObjectStore>, &StorePath)> {
        self.committing().map(|c| (&c.store, &c.prefix))
    }

    fn mine(&self, subtask: u16) -> bool {
        subtask % self.parallelism.max(1) == self.index
    }

    fn parts(&mut self) -> &mut PartsOf<StorePart> {
        self.parts.get_mut().unwrap_or_else(|e| e.into_inner())
    }

    /// `<prefix>/<top>/<folder>/<name>`, each of `top` and `folder` when given.
    fn key(prefix: &StorePath, top: Option<&str>, folder: &str, name: &str) -> StorePath {
        let mut parts: Vec<object_store::path::PathPart<'_>> = prefix.parts().collect();
        if let Some(f) = top {
            parts.push(f.into());
        }
        parts.extend(folder_parts(folder));
        parts.push(name.into());
        StorePath::from_iter(parts)
    }

    fn staged_key(prefix: &StorePath, f: &StagedFile) -> StorePath {
        Self::key(
            prefix,
            Some(STAGING),
            &f.folder,
            &format!("{IN_PROGRESS}{}{}", f.token, f.ext),
        )
    }

    async fn exists(&self, key: &StorePath) -> Result<bool> {
        self.committing()?.exists(key).await
    }

    /// Moves a final part aside under `_rolled-back/<folder>/` (a free name: `.1`,
    /// `.2`, ... appended when taken), copy first, so that it is never gone from both
    /// places.
    async fn roll_back(&self, key: &StorePath, folder: &str, name: &str) -> Result<()> {
        let (store, prefix) = self.store()?;
        let mut target = Self::key(prefix, Some(STORE_ROLLED_BACK), folder, name);
        let mut n = 1;
        while self.exists(&target).await? {
            target = Self::key(
                prefix,
                Some(STORE_ROLLED_BACK),
                folder,
                &format!("{name}.{n}"),
            );
            n += 1;
        }
        store
            .copy(key, &target)
            .await
            .map_err(|e| self.err("roll back", key, e))?;
        store
            .delete(key)
            .await
            .map_err(|e| self.err("roll back", key, e))?;
        warn!(object = %key, moved_to = %target, "rolled back part committed after the restored checkpoint: its records are written again");
        Ok(())
    }

    /// The objects under `top` (None: the prefix itself, without the sink's own
    /// folders) and its partition folders: `(key, folder, name)`.
    async fn objects_in(&self, top: Option<&str>) -> Result<Vec<(StorePath, String, String)>> {
        let (store, prefix) = self.store()?;
        let mut out = Vec::new();
        let mut folders = vec![String::new()];
        while let Some(folder) = folders.pop() {
            let mut parts: Vec<object_store::path::PathPart<'_>> = prefix.parts().collect();
            if let Some(t) = top {
                parts.push(t.into());
            }
            parts.extend(folder_parts(&folder));
            let at = StorePath::from_iter(parts);
            let listing = store
                .list_with_delimiter(Some(&at))
                .await
                .map_err(|e| self.err("list", &at, e))?;
            for p in listing.common_prefixes {
                let Some(sub) = p.filename().map(str::to_string) else {
                    continue;
                };
                if partition_folder(&sub) {
                    folders.push(match folder.as_str() {
                        "" => sub,
                        f => format!("{f}/{sub}"),
                    });
                }
            }
            for m in listing.objects {
                if let Some(name) = m.location.filename().map(str::to_string) {
                    out.push((m.location, folder.clone(), name));
                }
            }
        }
        Ok(out)
    }

    /// Checks the prefix's marker (`_lockgate-file-sink`, the job's name) and puts it
    /// when there is none: another job's output is refused, as in a directory.
    async fn mark(&self, job: &str) -> Result<()> {
        let (store, prefix) = self.store()?;
        let key = Self::key(prefix, None, "", STORE_MARKER);
        match store.get(&key).await {
            Ok(got) => {
                let bytes = got.bytes().await.map_err(|e| self.err("read", &key, e))?;
                let owner = String::from_utf8_lossy(&bytes);
                if let Some(why) = super::names::other_job(&owner, job) {
                    return Err(JobError::Unrecoverable {
                        task: self.name.clone(),
                        message: format!("{}/{key}: {why}", self.location.bucket()),
                    });
                }
                Ok(())
            }
            Err(object_store::Error::NotFound { .. }) => store
                .put(&key, PutPayload::from(job.as_bytes().to_vec()))
                .await
                .map(|_| ())
                .map_err(|e| self.err("mark", &key, e)),
            Err(e) => Err(self.err("read", &key, e)),
        }
    }

    /// Ends an open part (every row encoded): what it puts under the staging folder.
    async fn finish(&self, opened: OpenedOf<StorePart>) -> Result<(StagedFile, Vec<u8>)> {
        let bytes = opened
            .part
            .finish()
            .await
            .map_err(|e| JobError::task(&self.name, format!("end a part: {e}")))?;
        let f = StagedFile {
            folder: opened.folder,
            token: opened.token,
            ext: self.cfg.format.extension().to_string(),
        };
        Ok((f, bytes))
    }

    /// Puts a finished part under the staging folder: durable once the PUT returns.
    async fn stage(&self, f: &StagedFile, bytes: Vec<u8>) -> Result<()> {
        let (store, prefix) = self.store()?;
        let key = Self::staged_key(prefix, f);
        store
            .put(&key, PutPayload::from(bytes))
            .await
            .map(|_| ())
            .map_err(|e| self.err("stage", &key, e))
    }

    /// Ends an open part and puts it under the staging folder: durable once the PUT
    /// returns, named by the next barrier.
    async fn close(&mut self, opened: OpenedOf<StorePart>) -> Result<()> {
        let (f, bytes) = self.finish(opened).await?;
        self.stage(&f, bytes).await?;
        self.closed.push(f);
        Ok(())
    }
}

/// What a commit needs: the store and the prefix, and names for errors. The writer's
/// and its background commits' ([`TwoPhaseWriter::committer`]): a commit touches only
/// what earlier barriers staged.
struct Committing {
    store: Arc<dyn ObjectStore>,
    prefix: StorePath,
    bucket: String,
    name: String,
    /// The format's extension, for parts staged before partitions and rolls.
    ext: String,
}

impl Committing {
    fn err(&self, what: &str, key: &StorePath, e: impl std::fmt::Display) -> JobError {
        JobError::task(&self.name, format!("{what} {}/{key}: {e}", self.bucket))
    }

    async fn exists(&self, key: &StorePath) -> Result<bool> {
        match self.store.head(key).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.err("look up", key, e)),
        }
    }

    /// Copies `staged` to `to` and deletes it, or finds `to` there (committed before).
    /// `Ok(false)`: neither is there.
    async fn commit_object(&self, staged: &StorePath, to: &StorePath) -> Result<bool> {
        let store = &self.store;
        let copied = store.copy(staged, to).await;
        match after_copy(&copied) {
            AfterCopy::DeleteStaged => {
                crate::fault::hit("store-part-copied");
                match store.delete(staged).await {
                    // Another commit of the same part (an attempt's background commit
                    // and the next attempt's restore) deleted it first.
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(true),
                    Err(e) => Err(self.err("commit", staged, e)),
                }
            }
            AfterCopy::LookForFinal => self.exists(to).await,
            AfterCopy::Fail => Err(self.err("commit", staged, copied.expect_err("a failed copy"))),
        }
    }

    /// Commits one staged file to its final name; its absence from both is an error.
    async fn commit_file(&self, (staged, to): &(StorePath, StorePath)) -> Result<()> {
        if self.commit_object(staged, to).await? {
            return Ok(());
        }
        // A checkpoint named this part as durable: its absence is lost data.
        Err(self.err(
            "commit",
            staged,
            "the staged part named by the checkpoint is missing (neither staged nor committed)",
        ))
    }

    /// Commits a part staged before partitions and rolls (`_staging/part-<s>-<id>`).
    async fn commit_part(&self, p: &Part) -> Result<()> {
        let prefix = &self.prefix;
        for ext in FORMAT_EXTENSIONS {
            let name = committed_name(p.subtask, p.id, 0, ext);
            let staged = StoreWriter::key(prefix, Some(STAGING), "", &name);
            let to = StoreWriter::key(prefix, None, "", &name);
            if self.commit_object(&staged, &to).await? {
                return Ok(());
            }
        }
        // A checkpoint named this part as durable: its absence is lost data.
        let name = committed_name(p.subtask, p.id, 0, &self.ext);
        Err(self.err(
            "commit",
            &StoreWriter::key(prefix, Some(STAGING), "", &name),
            "the staged part named by the checkpoint is missing (neither staged nor committed)",
        ))
    }
}

#[async_trait]
impl Commit<Staged> for Committing {
    async fn commit(&self, s: &Staged) -> Result<()> {
        let (subtask, id, files) = match s {
            Staged::Part(p) => return self.commit_part(p).await,
            Staged::Files { subtask, id, files } => (*subtask, *id, files),
        };
        let prefix = &self.prefix;
        let keys: Vec<(StorePath, StorePath)> = files
            .iter()
            .enumerate()
            .map(|(n, f)| {
                let to = StoreWriter::key(
                    prefix,
                    None,
                    &f.folder,
                    &committed_name(subtask, id, n, &f.ext),
                );
                (StoreWriter::staged_key(prefix, f), to)
            })
            .collect();
        let Some((first, rest)) = keys.split_first() else {
            return Ok(());
        };
        // The first file alone, then the rest at once (a checkpoint of many folders
        // waits for its slowest copy rather than for their sum); a crash in between
        // leaves some committed, which a commit again finds.
        self.commit_file(first).await?;
        if rest.is_empty() {
            return Ok(());
        }
        crate::fault::hit("between-file-commits");
        let commits: Vec<_> = rest.iter().map(|k| self.commit_file(k)).collect();
        futures_util::stream::iter(commits)
            .buffer_unordered(PUTS_AT_ONCE)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }
}

/// The longest object key a store takes, in bytes (S3's and Cloud Storage's limit).
pub const STORE_MAX_KEY: usize = 1024;

/// Room for the longest name the sink gives an object in a folder, its extension left
/// out: a staged part (`inprogress-` and a token of at most 59 characters) or a part
/// rolled back (`part-<subtask>-<checkpoint>-<n>` and `.<k>`, numbers of at most 20
/// digits).
const NAME_ROOM: usize = 80;

/// The longest key an object of `folder` can get under a prefix of `prefix` bytes:
/// staged, committed or rolled back. A record whose folder makes it pass
/// [`STORE_MAX_KEY`] is refused when its batch is checked (the item error policy
/// decides), rather than failing the PUT of a part that holds other records too.
pub fn longest_key(prefix: usize, folder: &str, ext: &str) -> usize {
    let top = STAGING.len().max(STORE_ROLLED_BACK.len());
    prefix + 1 + top + 1 + folder.len() + 1 + NAME_ROOM + ext.len()
}

/// Takes out of `placed` the groups whose folder `refuse` gives a reason for, adds
/// their records to `refused` (indices in the batch of `len` records, in order), and
/// renumbers the records left as positions in the batch `write` gets then.
fn refuse_folders(
    placed: &mut Placed,
    refused: &mut Vec<(usize, String)>,
    len: usize,
    refuse: impl Fn(&str) -> Option<String>,
) {
    let whys: Vec<Option<String>> = placed.groups.iter().map(|g| refuse(&g.folder)).collect();
    if whys.iter().all(Option::is_none) {
        return;
    }
    refused.sort_by_key(|(i, _)| *i);
    // The index in the batch of each position in the batch `write` would have got.
    let kept: Vec<usize> = {
        let mut gone = refused.iter().map(|(i, _)| *i).peekable();
        (0..len).filter(|i| gone.next_if_eq(i).is_none()).collect()
    };
    let mut left = Vec::new();
    for (g, why) in std::mem::take(&mut placed.groups).into_iter().zip(whys) {
        match why {
            Some(why) => refused.extend(g.records.iter().map(|&p| (kept[p], why.clone()))),
            None => left.push(g),
        }
    }
    refused.sort_by_key(|(i, _)| *i);
    let gone: Vec<usize> = refused.iter().map(|(i, _)| *i).collect();
    for g in &mut left {
        for p in &mut g.records {
            let i = kept[*p];
            *p = i - gone.partition_point(|&x| x < i);
        }
    }
    placed.groups = left;
}

/// The key's parts of a partition folder, named as in a directory. The folder is
/// already escaped as Hive escapes a value: encoding its `%` again would show readers
/// the escaped text as the value, and a restore, which lists folders by their names in
/// keys, would look under a third name and find nothing. No folder a checkpoint may
/// name (see `valid_folder`) holds a character a key's part refuses.
fn folder_parts(folder: &str) -> impl Iterator<Item = object_store::path::PathPart<'_>> {
    folder.split('/').filter(|s| !s.is_empty()).map(|s| {
        object_store::path::PathPart::parse(s)
            .unwrap_or_else(|_| object_store::path::PathPart::from(s))
    })
}

#[async_trait]
impl TwoPhaseWriter for StoreWriter {
    type Committable = Staged;

    fn kind(&self) -> &'static str {
        "file sink"
    }

    fn subtask_of(&self, s: &Staged) -> Option<u16> {
        Some(s.subtask())
    }

    fn encode_committables(&self, pending: Vec<Staged>) -> std::result::Result<Vec<u8>, String> {
        encode_staged(pending)
    }

    fn decode_committables(&self, bytes: &[u8]) -> std::result::Result<Vec<Staged>, String> {
        decode_staged(bytes)
    }

    async fn open(
        &mut self,
        info: &SubtaskInfo,
        _restored: Option<CheckpointId>,
        _to_commit: &[Staged],
    ) -> Result<()> {
        self.index = info.index;
        self.parallelism = info.parallelism;
        self.name = info.name.clone();
        *self.parts() = PartsOf::new(writer_name());
        let (store, prefix) = self
            .location
            .open()
            .map_err(|e| JobError::task(&self.name, e))?;
        self.store = Some(self.committing_of(store, prefix));
        self.mark(&info.job).await
    }

    fn check_batch(&mut self, batch: &Batch) -> Vec<(usize, String)> {
        let mut refused = self.placed.check(&self.cfg, batch);
        if let (Some(c), Some(placed)) = (&self.store, self.placed.placed_mut()) {
            let (prefix, ext) = (c.prefix.as_ref().len(), self.cfg.format.extension());
            refuse_folders(placed, &mut refused, batch.len(), |folder| {
                let longest = longest_key(prefix, folder, ext);
                (longest > STORE_MAX_KEY).then(|| {
                    format!(
                        "its folder {folder:?} makes object keys of up to {longest} bytes, \
                         more than the {STORE_MAX_KEY} an object store takes"
                    )
                })
            });
        }
        refused
    }

    async fn write(&mut self, batch: &Batch) -> Result<()> {
        let placed = self.placed.take(&self.cfg, batch);
        for g in &placed.groups {
            let (index, roll) = (self.index, self.cfg.roll_bytes);
            let full = {
                let (format, name) = (&self.cfg.format, &self.name);
                let parts = self.parts.get_mut().unwrap_or_else(|e| e.into_inner());
                let o = parts
                    .get_or_open(&g.folder, index, |_| StorePart::new(format))
                    .map_err(|e| JobError::task(name, e))?;
                let failed = |e: String| JobError::task(name, format!("write a part: {e}"));
                o.part
                    .write(records(batch, g), g.records.len(), g.rows.as_ref())
                    .await
                    .map_err(failed)?;
                match roll {
                    // Rows not yet encoded count by their Arrow size: the encoder's own
                    // figure decides.
                    Some(r) if o.part.size() >= r => {
                        o.part.settle().await.map_err(failed)?;
                        o.part.size() >= r
                    }
                    _ => false,
                }
            };
            if full {
                let opened = self.parts().take(&g.folder).expect("open above");
                self.close(opened).await?;
            }
        }
        // Parts are held in memory until put: many folders open at once must not
        // hold more than the bound.
        let sizes = self.parts().sizes();
        for folder in parts_to_close(&sizes, self.cfg.memory_bytes) {
            let opened = self.parts().take(&folder).expect("listed above");
            self.close(opened).await?;
        }
        Ok(())
    }

    fn buffered_bytes(&self) -> usize {
        self.parts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .in_progress_size()
    }

    async fn flush(&mut self) -> Result<()> {
        let name = self.name.clone();
        for o in self.parts().iter_mut() {
            o.part
                .flush_rows()
                .await
                .map_err(|e| JobError::task(&name, format!("write a part: {e}")))?;
        }
        Ok(())
    }

    async fn prepare_commit(&mut self, id: CheckpointId) -> Result<Option<Staged>> {
        let mut finished = Vec::new();
        for opened in self.parts().take_all() {
            finished.push(self.finish(opened).await?);
        }
        // The parts of several folders go at once: the barrier waits for the slowest
        // PUT rather than for their sum. Each is named below only once all are there.
        let files: Vec<StagedFile> = finished.iter().map(|(f, _)| f.clone()).collect();
        let this = &*self;
        futures_util::stream::iter(finished)
            .map(|(f, bytes)| async move { this.stage(&f, bytes).await })
            .buffer_unordered(PUTS_AT_ONCE)
            .try_collect::<Vec<()>>()
            .await?;
        let files: Vec<StagedFile> = std::mem::take(&mut self.closed)
            .into_iter()
            .chain(files)
            .collect();
        if files.is_empty() {
            return Ok(None);
        }
        Ok(Some(Staged::Files {
            subtask: self.index,
            id,
            files,
        }))
    }

    async fn commit(&mut self, s: &Staged) -> Result<()> {
        self.committing()?.commit(s).await
    }

    fn committer(&self) -> Option<Arc<dyn Commit<Staged>>> {
        self.store.clone().map(|c| c as Arc<dyn Commit<Staged>>)
    }

    async fn abort_abandoned(
        &mut self,
        restored: Option<CheckpointId>,
        named: &[Staged],
    ) -> Result<()> {
        let named = Named::of(named);
        let store = self.store()?.0.clone();
        // Both listings at once: a restore (and every start) waits for the slower.
        let (staged, committed) =
            futures_util::future::try_join(self.objects_in(Some(STAGING)), self.objects_in(None))
                .await?;
        for (key, folder, name) in staged {
            let Some(part) = parse_staged_name(&name) else {
                continue;
            };
            if !self.mine(part_subtask(part)) {
                continue;
            }
            let token = name.strip_prefix(IN_PROGRESS).map(|t| {
                FORMAT_EXTENSIONS
                    .iter()
                    .filter(|e| !e.is_empty())
                    .find_map(|e| t.strip_suffix(e))
                    .unwrap_or(t)
            });
            if restore_action(part, restored, named.names(&folder, part, token))
                == RestoreAction::Remove
            {
                store
                    .delete(&key)
                    .await
                    .map_err(|e| self.err("remove", &key, e))?;
            }
        }
        for (key, folder, name) in committed {
            let Some(part) = parse_part_name(&name) else {
                continue;
            };
            if !self.mine(part_subtask(part)) {
                continue;
            }
            if restore_action(part, restored, false) == RestoreAction::RollBack {
                self.roll_back(&key, &folder, &name).await?;
            }
        }
        Ok(())
    }

    async fn close(&mut self) -> Result<()> {
        // Records after the final checkpoint cannot exist; an empty part can.
        self.parts().take_all();
        Ok(())
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Record;
    use object_store::memory::InMemory;

    /// A writer of subtask 0 of 1 into an in-memory store under `out`, a folder per
    /// value of `c`.
    fn writer(store: &Arc<InMemory>) -> StoreWriter {
        let mut cfg = FileSinkConfig::json("s3://b/out");
        cfg.partition =
            Some(super::super::partition::PartitionTemplate::parse("c={/c}", None).unwrap());
        let location = StoreLocation::parse("s3://b/out").unwrap();
        let mut w = StoreWriter::new(cfg, location.clone());
        w.name = "sink-0".into();
        w.store = Some(w.committing_of(store.clone(), StorePath::from("out")));
        w
    }

    async fn keys(store: &InMemory) -> Vec<String> {
        use futures_util::StreamExt;
        let listed: Vec<_> = store.list(None).collect().await;
        let mut out: Vec<String> = listed
            .into_iter()
            .map(|m| m.unwrap().location.to_string())
            .collect();
        out.sort();
        out
    }

    async fn stage(w: &mut StoreWriter, value: &str, id: u64) -> Staged {
        let batch: Batch = vec![Record::from_value(value.as_bytes().to_vec())];
        assert!(w.check_batch(&batch).is_empty());
        w.write(&batch).await.unwrap();
        w.prepare_commit(CheckpointId(id)).await.unwrap().unwrap()
    }

    #[tokio::test]
    async fn an_escaped_folder_is_named_as_in_a_directory_and_a_restore_finds_it() {
        let store = Arc::new(InMemory::new());
        let mut w = writer(&store);
        let at_1 = stage(&mut w, r#"{"c":"a/b"}"#, 1).await;
        w.commit(&at_1).await.unwrap();
        let at_2 = stage(&mut w, r#"{"c":"a/b"}"#, 2).await;
        w.commit(&at_2).await.unwrap();
        assert_eq!(
            keys(&store).await,
            vec!["out/c=a%2Fb/part-0-1", "out/c=a%2Fb/part-0-2"],
            "the folder is the Hive-escaped value, as in a directory (escaped once)"
        );
        // A restore from 1: the part of 2 is rolled back, its records written again.
        let mut w = writer(&store);
        w.abort_abandoned(Some(CheckpointId(1)), &[at_1])
            .await
            .unwrap();
        assert_eq!(
            keys(&store).await,
            vec!["out/_rolled-back/c=a%2Fb/part-0-2", "out/c=a%2Fb/part-0-1"],
        );
    }

    #[tokio::test]
    async fn a_restore_removes_staged_parts_in_escaped_folders_it_does_not_name() {
        let store = Arc::new(InMemory::new());
        let mut w = writer(&store);
        stage(&mut w, r#"{"c":"x:y"}"#, 1).await;
        assert_eq!(keys(&store).await.len(), 1);
        let mut w = writer(&store);
        w.abort_abandoned(None, &[]).await.unwrap();
        assert_eq!(keys(&store).await, Vec::<String>::new());
    }

    #[test]
    fn a_copy_decides_what_a_commit_does_next() {
        assert_eq!(after_copy(&Ok(())), AfterCopy::DeleteStaged);
        let missing = object_store::Error::NotFound {
            path: "k".into(),
            source: "gone".into(),
        };
        assert_eq!(after_copy(&Err(missing)), AfterCopy::LookForFinal);
        let failed = object_store::Error::Generic {
            store: "S3",
            source: "timed out".into(),
        };
        assert_eq!(after_copy(&Err(failed)), AfterCopy::Fail);
    }

    #[tokio::test]
    async fn a_commit_again_finds_the_final_part_and_a_lost_part_is_an_error() {
        let store = Arc::new(InMemory::new());
        let mut w = writer(&store);
        let at_1 = stage(&mut w, r#"{"c":"a"}"#, 1).await;
        w.commit(&at_1).await.unwrap();
        // The notification came again after a crash: the staged part is gone, the
        // final one is there.
        w.commit(&at_1).await.unwrap();
        assert_eq!(keys(&store).await, vec!["out/c=a/part-0-1"]);
        let at_2 = stage(&mut w, r#"{"c":"a"}"#, 2).await;
        store
            .delete(&StorePath::from(keys(&store).await[0].as_str()))
            .await
            .unwrap();
        let e = w.commit(&at_2).await.unwrap_err().to_string();
        assert!(e.contains("neither staged nor committed"), "{e}");
    }

    #[test]
    fn refused_folders_take_their_records_out_and_the_rest_are_renumbered() {
        use super::super::placed::Group;
        let group = |folder: &str, records: Vec<usize>| Group {
            folder: folder.into(),
            records,
            rows: None,
        };
        // Five records, the second refused already: positions 0..4 are records 0, 2,
        // 3 and 4.
        let mut placed = Placed {
            groups: vec![group("ok", vec![0, 3]), group("long", vec![1, 2])],
        };
        let mut refused = vec![(1, "no folder".to_string())];
        refuse_folders(&mut placed, &mut refused, 5, |f| {
            (f == "long").then(|| "too long".to_string())
        });
        assert_eq!(
            refused,
            vec![
                (1, "no folder".to_string()),
                (2, "too long".to_string()),
                (3, "too long".to_string())
            ]
        );
        assert_eq!(placed.groups.len(), 1);
        assert_eq!(placed.groups[0].records, vec![0, 1], "records 0 and 4");
    }

    #[tokio::test]
    async fn a_record_whose_folder_makes_too_long_a_key_is_refused_when_checked() {
        let store = Arc::new(InMemory::new());
        let mut w = writer(&store);
        // A folder's name is at most 255 bytes: four of them make a key too long.
        w.cfg.partition = Some(
            super::super::partition::PartitionTemplate::parse("a={/a}/b={/b}/c={/c}/d={/d}", None)
                .unwrap(),
        );
        let value = |v: &str| format!(r#"{{"a":"{v}","b":"{v}","c":"{v}","d":"{v}"}}"#);
        let batch: Batch = [value("1"), value(&"x".repeat(250)), value("2")]
            .into_iter()
            .map(|v| Record::from_value(v.into_bytes()))
            .collect();
        let refused = w.check_batch(&batch);
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].0, 1);
        assert!(
            refused[0].1.contains("more than the 1024"),
            "{}",
            refused[0].1
        );
        let accepted: Batch = [batch[0].clone(), batch[2].clone()].into();
        w.write(&accepted).await.unwrap();
        let at_1 = w.prepare_commit(CheckpointId(1)).await.unwrap().unwrap();
        w.commit(&at_1).await.unwrap();
        assert_eq!(
            keys(&store).await,
            vec![
                "out/a=1/b=1/c=1/d=1/part-0-1",
                "out/a=2/b=2/c=2/d=2/part-0-1-1"
            ]
        );
        // The longest folder that fits is taken.
        let fits = STORE_MAX_KEY - longest_key("out".len(), "", "");
        assert_eq!(
            longest_key("out".len(), &"x".repeat(fits), ""),
            STORE_MAX_KEY
        );
    }

    #[tokio::test]
    async fn a_part_of_lines_counts_what_it_holds_as_buffered() {
        let store = Arc::new(InMemory::new());
        let mut w = writer(&store);
        let batch: Batch = vec![Record::from_value(br#"{"c":"a"}"#.to_vec())];
        assert!(w.check_batch(&batch).is_empty());
        w.write(&batch).await.unwrap();
        assert_eq!(w.buffered_bytes(), r#"{"c":"a"}"#.len() + 1);
        w.prepare_commit(CheckpointId(1)).await.unwrap();
        assert_eq!(w.buffered_bytes(), 0, "put at the barrier");
    }
}
