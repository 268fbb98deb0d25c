//! The file sink's writer into an object store (`dir = "s3://bucket/prefix"`): the same
//! protocol as in a local directory, with objects for files.
//!
//! - A part is written in memory since the last barrier and put, whole, at the barrier
//!   under `<prefix>/_staging/` (readers skip folders that begin with `_`, as Spark and
//!   Hive do): one PUT, so an object is there complete or not at all, and no upload is
//!   left half done by a crash.
//! - The commit copies it to its final name `<prefix>/part-<subtask>-<checkpoint>[.ext]`
//!   and deletes the staged object; a commit again after a crash copies again (the same
//!   bytes) or finds the final object there.
//! - A restore deletes the staged objects of this job's subtasks that the restored
//!   checkpoint does not name, and moves the final objects of checkpoints after it to
//!   `<prefix>/_rolled-back/` (their records are written again): nothing the job wrote
//!   is deleted before the output that replaces it is there.
//!
//! The store itself is shared: a restore on another machine finds the output where the
//! job left it (no local marker is needed, unlike a directory).

use super::names::{parse_part_name, part_subtask, restore_action, Part, PartName, RestoreAction};
use super::part::OpenPart;
use super::section::{FileSinkConfig, PARQUET_EXTENSION};
use crate::connector::SubtaskInfo;
use crate::error::{JobError, Result};
use crate::kits::TwoPhaseWriter;
use crate::record::Batch;
use arrow_array::RecordBatch;
use async_trait::async_trait;
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

/// The extensions a part's name may end with, one per format.
const FORMAT_EXTENSIONS: [&str; 2] = ["", PARQUET_EXTENSION];

/// The file sink's writer into an object store.
pub struct StoreWriter {
    cfg: FileSinkConfig,
    location: StoreLocation,
    store: Option<(Arc<dyn ObjectStore>, StorePath)>,
    index: u16,
    parallelism: u16,
    name: String,
    /// In a mutex only to make the writer `Sync` (a Parquet writer is not), so that
    /// `&self` may be held across the store's awaits; only `&mut self` uses it.
    current: Mutex<Option<OpenPart<Vec<u8>>>>,
    decoded: Option<RecordBatch>,
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
            current: Mutex::new(None),
            decoded: None,
        }
    }

    fn err(&self, what: &str, key: &StorePath, e: impl std::fmt::Display) -> JobError {
        JobError::task(
            &self.name,
            format!("{what} {}/{key}: {e}", self.location.bucket()),
        )
    }

    fn store(&self) -> Result<(&Arc<dyn ObjectStore>, &StorePath)> {
        self.store
            .as_ref()
            .map(|(s, p)| (s, p))
            .ok_or_else(|| JobError::task(&self.name, "the object store is not open"))
    }

    fn mine(&self, subtask: u16) -> bool {
        subtask % self.parallelism.max(1) == self.index
    }

    fn key(prefix: &StorePath, folder: Option<&str>, name: &str) -> StorePath {
        let mut parts: Vec<object_store::path::PathPart<'_>> = prefix.parts().collect();
        if let Some(f) = folder {
            parts.push(f.into());
        }
        parts.push(name.into());
        StorePath::from_iter(parts)
    }

    fn final_key(prefix: &StorePath, p: &Part, ext: &str) -> StorePath {
        Self::key(prefix, None, &format!("part-{}-{}{ext}", p.subtask, p.id.0))
    }

    fn staged_key(prefix: &StorePath, p: &Part, ext: &str) -> StorePath {
        Self::key(
            prefix,
            Some(STAGING),
            &format!("part-{}-{}{ext}", p.subtask, p.id.0),
        )
    }

    async fn exists(&self, key: &StorePath) -> Result<bool> {
        let (store, _) = self.store()?;
        match store.head(key).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.err("look up", key, e)),
        }
    }

    /// Moves a final part aside under `_rolled-back/` (a free name: `.1`, `.2`, ...
    /// appended when taken), copy first, so that it is never gone from both places.
    async fn roll_back(&self, key: &StorePath, name: &str) -> Result<()> {
        let (store, prefix) = self.store()?;
        let mut target = Self::key(prefix, Some(STORE_ROLLED_BACK), name);
        let mut n = 1;
        while self.exists(&target).await? {
            target = Self::key(prefix, Some(STORE_ROLLED_BACK), &format!("{name}.{n}"));
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

    /// The objects directly in `folder` under the prefix (None: the prefix itself),
    /// with their names.
    async fn objects_in(&self, folder: Option<&str>) -> Result<Vec<(StorePath, String)>> {
        let (store, prefix) = self.store()?;
        let at = match folder {
            Some(f) => Self::key(prefix, None, f),
            None => prefix.clone(),
        };
        let listing = store
            .list_with_delimiter(Some(&at))
            .await
            .map_err(|e| self.err("list", &at, e))?;
        Ok(listing
            .objects
            .into_iter()
            .filter_map(|m| {
                let name = m.location.filename()?.to_string();
                Some((m.location, name))
            })
            .collect())
    }
}

#[async_trait]
impl TwoPhaseWriter for StoreWriter {
    type Committable = Part;

    fn kind(&self) -> &'static str {
        "file sink"
    }

    fn subtask_of(&self, p: &Part) -> Option<u16> {
        Some(p.subtask)
    }

    async fn open(
        &mut self,
        info: &SubtaskInfo,
        _restored: Option<CheckpointId>,
        _to_commit: &[Part],
    ) -> Result<()> {
        self.index = info.index;
        self.parallelism = info.parallelism;
        self.name = info.name.clone();
        let opened = self
            .location
            .open()
            .map_err(|e| JobError::task(&self.name, e))?;
        self.store = Some(opened);
        Ok(())
    }

    fn check_batch(&mut self, batch: &Batch) -> Vec<(usize, String)> {
        let decoded = self.cfg.format.decode(batch);
        self.decoded = decoded.rows;
        decoded.refused
    }

    async fn write(&mut self, batch: &Batch) -> Result<()> {
        let current = self.current.get_mut().unwrap_or_else(|e| e.into_inner());
        if current.is_none() {
            let part = OpenPart::new(&self.cfg.format, Vec::new())
                .map_err(|e| JobError::task(&self.name, e))?;
            *current = Some(part);
        }
        let decoded = self.decoded.take();
        let part = current.as_mut().expect("opened above");
        part.write(batch, decoded.as_ref())
            .map_err(|e| JobError::task(&self.name, format!("write a part: {e}")))
    }

    fn buffered_bytes(&self) -> usize {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(0, |p| p.in_progress_size())
    }

    async fn flush(&mut self) -> Result<()> {
        if let Some(part) = self.current.get_mut().unwrap_or_else(|e| e.into_inner()) {
            part.flush_rows()
                .map_err(|e| JobError::task(&self.name, format!("write a part: {e}")))?;
        }
        Ok(())
    }

    async fn prepare_commit(&mut self, id: CheckpointId) -> Result<Option<Part>> {
        let Some(part) = self
            .current
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return Ok(None);
        };
        let bytes = part
            .finish()
            .map_err(|e| JobError::task(&self.name, format!("end a part: {e}")))?;
        let p = Part {
            subtask: self.index,
            id,
        };
        let (store, prefix) = self.store()?;
        let key = Self::staged_key(prefix, &p, self.cfg.format.extension());
        // Durable once the PUT returns: the checkpoint that names it may complete.
        store
            .put(&key, PutPayload::from(bytes))
            .await
            .map_err(|e| self.err("stage", &key, e))?;
        Ok(Some(p))
    }

    async fn commit(&mut self, p: &Part) -> Result<()> {
        let prefix = self.store()?.1.clone();
        for ext in FORMAT_EXTENSIONS {
            let staged = Self::staged_key(&prefix, p, ext);
            if self.exists(&staged).await? {
                let (store, _) = self.store()?;
                let to = Self::final_key(&prefix, p, ext);
                store
                    .copy(&staged, &to)
                    .await
                    .map_err(|e| self.err("commit", &staged, e))?;
                crate::fault::hit("store-part-copied");
                store
                    .delete(&staged)
                    .await
                    .map_err(|e| self.err("commit", &staged, e))?;
                return Ok(());
            }
        }
        for ext in FORMAT_EXTENSIONS {
            if self.exists(&Self::final_key(&prefix, p, ext)).await? {
                return Ok(());
            }
        }
        // A checkpoint named this part as durable: its absence is lost data.
        let staged = Self::staged_key(&prefix, p, self.cfg.format.extension());
        Err(self.err(
            "commit",
            &staged,
            "the staged part named by the checkpoint is missing (neither staged nor committed)",
        ))
    }

    async fn abort_abandoned(
        &mut self,
        restored: Option<CheckpointId>,
        named: &[Part],
    ) -> Result<()> {
        let pending: Vec<(u16, CheckpointId)> = named.iter().map(|p| (p.subtask, p.id)).collect();
        let store = self.store()?.0.clone();
        for (key, name) in self.objects_in(Some(STAGING)).await? {
            // A staged part is a pending one, whatever its name says.
            let Some(PartName::Committed { subtask, id }) = parse_part_name(&name) else {
                continue;
            };
            if !self.mine(subtask) {
                continue;
            }
            let part = PartName::Pending { subtask, id };
            if restore_action(part, restored, &pending) == RestoreAction::Remove {
                store
                    .delete(&key)
                    .await
                    .map_err(|e| self.err("remove", &key, e))?;
            }
        }
        for (key, name) in self.objects_in(None).await? {
            let Some(part) = parse_part_name(&name) else {
                continue;
            };
            if !self.mine(part_subtask(part)) {
                continue;
            }
            if restore_action(part, restored, &pending) == RestoreAction::RollBack {
                self.roll_back(&key, &name).await?;
            }
        }
        Ok(())
    }

    async fn close(&mut self) -> Result<()> {
        // Records after the final checkpoint cannot exist; an empty part can.
        *self.current.get_mut().unwrap_or_else(|e| e.into_inner()) = None;
        Ok(())
    }
}
