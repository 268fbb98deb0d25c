//! The keyed state backend: one RocksDB instance per stateful subtask.
//!
//! Keys are laid out as `[key group: u16 BE][state name length: u8][state name][user key]`,
//! so the state of a key-group range is one contiguous RocksDB range: a restore at
//! another parallelism copies exactly the groups a subtask now owns.
//!
//! Writes go to RocksDB's WAL without syncing it, and a checkpoint does not flush the
//! memtable: it links the SST files and copies the WAL written since the last flush
//! (RocksDB's checkpoint with flushing off), which RocksDB replays when a restored
//! instance opens. Memtables are flushed by RocksDB in the background when they reach
//! [`WRITE_BUFFER_BYTES`], off the record path and off the checkpoint path. A
//! checkpoint therefore costs what changed since the last one (the WAL tail, and the
//! SSTs created since), never a memtable flush and never the whole state, and the
//! number of SST files (hence compaction work) does not grow with the checkpoint rate.
//! Flushing at every checkpoint instead made a small L0 file per checkpoint, whose
//! compaction rewrote the state every few checkpoints. The working WAL is never synced:
//! after a crash the working instance is rebuilt from the restored checkpoint anyway.

use crate::durable;
use crate::error::{Result, StateError};
use crate::keygroup::{KeyGroup, KeyGroupRange};
use crate::metadata::{FileEntry, SubtaskSnapshot};
use crate::verify::file_crc32;
use rocksdb::{checkpoint::Checkpoint, IteratorMode, Options, WriteBatch, WriteOptions, DB};
use serde::{de::DeserializeOwned, Serialize};
use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use tracing::{debug, info};

/// Which user keys of a snapshot a restore keeps (see [`StateRestore::keep`]).
pub type KeyFilter = std::sync::Arc<dyn Fn(&[u8]) -> bool + Send + Sync>;

/// A subtask snapshot to restore from: the checkpoint directory and its entry.
#[derive(Clone)]
pub struct StateRestore {
    pub checkpoint_dir: PathBuf,
    pub snapshot: SubtaskSnapshot,
    /// When set, only the entries whose user key (the key after the key group and the
    /// state name) it accepts are restored: how a member takes its share of another
    /// member's state. The snapshot is then always copied, never linked.
    pub keep: Option<KeyFilter>,
}

impl std::fmt::Debug for StateRestore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateRestore")
            .field("checkpoint_dir", &self.checkpoint_dir)
            .field("snapshot", &self.snapshot)
            .field("keep", &self.keep.as_ref().map(|_| "filter"))
            .finish()
    }
}

impl StateRestore {
    /// All of `snapshot`'s state, from the checkpoint at `checkpoint_dir`.
    pub fn new(checkpoint_dir: PathBuf, snapshot: SubtaskSnapshot) -> StateRestore {
        StateRestore {
            checkpoint_dir,
            snapshot,
            keep: None,
        }
    }

    fn state_path(&self) -> Option<PathBuf> {
        self.snapshot
            .state_dir
            .as_ref()
            .map(|d| self.checkpoint_dir.join(d))
    }
}

/// A RocksDB instance holding the keyed state of one subtask.
pub struct KeyedStateBackend {
    db: DB,
    path: PathBuf,
    key_groups: KeyGroupRange,
    write_opts: WriteOptions,
    /// CRC of each SST file already part of a checkpoint: SSTs are immutable, so a
    /// checkpoint only reads the files created since the previous one.
    sst_crc: HashMap<String, (u64, u32)>,
}

/// The default of [`BackendOptions::write_buffer_bytes`]: the size at which a memtable
/// is flushed to an SST file, in the background. It bounds
/// what a checkpoint copies (the WAL since the last flush holds at most about two
/// memtables' worth of records, and is smaller than the memtables themselves) and the
/// memory a keyed subtask holds in memtables (at most two of this size). Larger values
/// mean fewer flushes and less compaction but more WAL copied per checkpoint; RocksDB's
/// default (64 MiB) made checkpoints copy up to tens of MiB. A memtable keeps every
/// write of a hot key until it is flushed, so its size, not the number of keys, is what
/// a `rolling_sum` over a few hot keys holds: at 8 MiB the demo's job grew 13 MiB
/// (two subtasks' memtables filling) between 10^5 and 10^6 records; at 2 MiB, 4 MiB.
pub const WRITE_BUFFER_BYTES: usize = 2 << 20;

/// The default of [`BackendOptions::block_cache_bytes`]: RocksDB's own default size.
pub const BLOCK_CACHE_BYTES: usize = 32 << 20;

/// The memory settings of one keyed subtask's RocksDB instance (the job file's
/// `[state]` table). A subtask holds at most about two memtables of
/// `write_buffer_bytes` plus `block_cache_bytes` of cached SST blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendOptions {
    /// See [`WRITE_BUFFER_BYTES`].
    pub write_buffer_bytes: usize,
    /// The LRU cache of uncompressed SST blocks read by lookups; 0 disables it.
    pub block_cache_bytes: usize,
}

impl Default for BackendOptions {
    fn default() -> BackendOptions {
        BackendOptions {
            write_buffer_bytes: WRITE_BUFFER_BYTES,
            block_cache_bytes: BLOCK_CACHE_BYTES,
        }
    }
}

fn db_options(opts: &BackendOptions) -> Options {
    let mut o = Options::default();
    o.set_write_buffer_size(opts.write_buffer_bytes);
    let mut table = rocksdb::BlockBasedOptions::default();
    if opts.block_cache_bytes == 0 {
        table.disable_cache();
    } else {
        table.set_block_cache(&rocksdb::Cache::new_lru_cache(opts.block_cache_bytes));
    }
    o.set_block_based_table_factory(&table);
    o.create_if_missing(true);
    o.set_compression_type(rocksdb::DBCompressionType::Lz4);
    o.set_max_background_jobs(2);
    o.set_keep_log_file_num(2);
    o
}

fn bincode_config() -> impl bincode::config::Config {
    bincode::config::standard()
}

/// The user key of a RocksDB key built by [`state_key`], or `None` for a key too short
/// to be one.
pub fn user_key_of(key: &[u8]) -> Option<&[u8]> {
    let name_len = usize::from(*key.get(2)?);
    key.get(3 + name_len..)
}

/// Builds the RocksDB key of `(group, state, user_key)`.
pub fn state_key(group: KeyGroup, state: &str, user_key: &[u8]) -> Vec<u8> {
    debug_assert!(state.len() <= u8::MAX as usize);
    let mut k = Vec::with_capacity(3 + state.len() + user_key.len());
    k.extend_from_slice(&group.0.to_be_bytes());
    k.push(state.len() as u8);
    k.extend_from_slice(state.as_bytes());
    k.extend_from_slice(user_key);
    k
}

/// Refuses a snapshot entry whose names are not plain path components, before any file
/// is written: restore input may come from anywhere (`--restore PATH`), and the names
/// are joined into paths below both the checkpoint and the working directory.
fn check_names(r: &StateRestore) -> Result<()> {
    crate::names::check_subtask(&r.snapshot).map_err(|detail| StateError::UnsafeName {
        checkpoint: r.checkpoint_dir.clone(),
        detail,
    })
}

/// Links the immutable SST files of a snapshot into `dst` and copies the rest (RocksDB
/// rewrites MANIFEST, OPTIONS and CURRENT, which must not be shared with a checkpoint).
/// A symbolic link in `src` (or `src` itself being one) is refused, never followed.
fn materialize(src: &Path, files: &[FileEntry], dst: &Path) -> Result<()> {
    let refuse = |p: &Path, e: std::io::Error| StateError::Io {
        op: "restore from",
        path: p.to_path_buf(),
        source: e,
    };
    crate::names::check_real_dir(src).map_err(|e| refuse(src, e))?;
    for f in files {
        let from = src.join(&f.name);
        // Checked before anything is written, so that a refusal leaves nothing behind.
        crate::names::open_no_follow(&from).map_err(|e| refuse(&from, e))?;
    }
    fs::create_dir_all(dst).map_err(StateError::io("create", dst))?;
    for f in files {
        let from = src.join(&f.name);
        let to = dst.join(&f.name);
        let linked = f.name.ends_with(".sst") && fs::hard_link(&from, &to).is_ok();
        if !linked {
            // A copy (another file system, or a mutable file) is a new inode that later
            // checkpoints link to: it must be durable before anything refers to it.
            fs::copy(&from, &to).map_err(StateError::io("copy", &from))?;
            durable::fsync_file(&to)?;
        }
    }
    durable::fsync_dir(dst)
}

impl KeyedStateBackend {
    /// Opens a fresh working instance at `work_dir` (anything there is discarded: the
    /// working state of a crashed run is ahead of its last checkpoint) and loads the
    /// groups of `key_groups` from `restore`.
    ///
    /// One snapshot with exactly the same key groups is linked in place (no copy);
    /// otherwise the overlapping range of each snapshot is copied in, which is how a
    /// checkpoint taken at one parallelism restores at another.
    ///
    /// A snapshot naming a state directory or file that is not one plain path component
    /// is [`StateError::UnsafeName`] before anything is written; a symbolic link in a
    /// snapshot is refused, not followed.
    pub fn open(
        work_dir: &Path,
        key_groups: KeyGroupRange,
        restore: &[StateRestore],
    ) -> Result<Self> {
        Self::open_with(work_dir, key_groups, restore, &BackendOptions::default())
    }

    /// [`KeyedStateBackend::open`] with the given memory settings.
    pub fn open_with(
        work_dir: &Path,
        key_groups: KeyGroupRange,
        restore: &[StateRestore],
        options: &BackendOptions,
    ) -> Result<Self> {
        restore.iter().try_for_each(check_names)?;
        if work_dir.exists() {
            fs::remove_dir_all(work_dir).map_err(StateError::io("remove", work_dir))?;
        }
        let relevant: Vec<&StateRestore> = restore
            .iter()
            .filter(|r| {
                r.snapshot
                    .key_groups
                    .is_none_or(|g| g.overlaps(&key_groups))
            })
            .collect();
        let mut sst_crc = HashMap::new();
        let exact = relevant.len() == 1
            && relevant[0].keep.is_none()
            && relevant[0].snapshot.key_groups == Some(key_groups);
        if exact {
            let r = relevant[0];
            if let Some(src) = r.state_path() {
                materialize(&src, &r.snapshot.files, work_dir)?;
                for f in &r.snapshot.files {
                    if f.name.ends_with(".sst") {
                        sst_crc.insert(f.name.clone(), (f.size, f.crc32));
                    }
                }
            }
        }
        let db = DB::open(&db_options(options), work_dir).map_err(StateError::rocks(work_dir))?;
        // The WAL is written (a checkpoint copies it instead of flushing the memtable)
        // but not synced: only checkpoints are durable.
        let write_opts = WriteOptions::default();
        let backend = KeyedStateBackend {
            db,
            path: work_dir.to_path_buf(),
            key_groups,
            write_opts,
            sst_crc,
        };
        if !exact {
            for (i, r) in relevant.iter().enumerate() {
                backend.import_range(r, i)?;
            }
        }
        info!(path = %work_dir.display(), ?key_groups, restored_from = relevant.len(), linked = exact, "keyed state opened");
        Ok(backend)
    }

    /// Copies the keys of this subtask's key groups out of one snapshot.
    fn import_range(&self, r: &StateRestore, n: usize) -> Result<()> {
        let Some(src) = r.state_path() else {
            return Ok(());
        };
        let scratch = self.path.with_extension(format!("import-{n}"));
        if scratch.exists() {
            fs::remove_dir_all(&scratch).map_err(StateError::io("remove", &scratch))?;
        }
        materialize(&src, &r.snapshot.files, &scratch)?;
        {
            let other = DB::open(&db_options(&BackendOptions::default()), &scratch)
                .map_err(StateError::rocks(&scratch))?;
            let lo = self.key_groups.start.to_be_bytes();
            let hi = u32::from(self.key_groups.end) + 1;
            let mut batch = WriteBatch::default();
            let mut copied = 0u64;
            for item in other.iterator(IteratorMode::From(&lo, rocksdb::Direction::Forward)) {
                let (k, v) = item.map_err(StateError::rocks(&scratch))?;
                if k.len() < 2 || u32::from(u16::from_be_bytes([k[0], k[1]])) >= hi {
                    break;
                }
                if let Some(keep) = &r.keep {
                    if !user_key_of(&k).is_some_and(|u| keep(u)) {
                        continue;
                    }
                }
                batch.put(&k, &v);
                copied += 1;
                if batch.len() >= 10_000 {
                    self.db
                        .write_opt(std::mem::take(&mut batch), &self.write_opts)
                        .map_err(StateError::rocks(&self.path))?;
                }
            }
            self.db
                .write_opt(batch, &self.write_opts)
                .map_err(StateError::rocks(&self.path))?;
            debug!(from = %src.display(), copied, "imported key-group range");
        }
        fs::remove_dir_all(&scratch).map_err(StateError::io("remove", &scratch))?;
        Ok(())
    }

    /// Calls `f(group, user_key, value)` for every entry of state `state`, in key
    /// order (by key group first): how an operator rebuilds what it keeps in memory
    /// about its state (timers) after a restore. The first error of `f` stops it.
    pub fn for_each<E: From<StateError>>(
        &self,
        state: &str,
        mut f: impl FnMut(KeyGroup, &[u8], &[u8]) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        for item in self.db.iterator(IteratorMode::Start) {
            let (k, v) = item.map_err(StateError::rocks(&self.path))?;
            let Some(&len) = k.get(2) else { continue };
            let name_end = 3 + usize::from(len);
            if k.get(3..name_end) != Some(state.as_bytes()) {
                continue;
            }
            f(
                KeyGroup(u16::from_be_bytes([k[0], k[1]])),
                &k[name_end..],
                &v,
            )?;
        }
        Ok(())
    }

    /// The key groups this instance holds.
    pub fn key_groups(&self) -> KeyGroupRange {
        self.key_groups
    }

    /// Reads the value of `(state, key)` in `group`.
    pub fn get<T: DeserializeOwned>(
        &self,
        group: KeyGroup,
        state: &str,
        key: &[u8],
    ) -> Result<Option<T>> {
        debug_assert!(
            self.key_groups.contains(group),
            "key group {group:?} not owned"
        );
        let raw = self
            .db
            .get_pinned(state_key(group, state, key))
            .map_err(StateError::rocks(&self.path))?;
        match raw {
            None => Ok(None),
            Some(bytes) => bincode::serde::decode_from_slice(&bytes, bincode_config())
                .map(|(v, _)| Some(v))
                .map_err(|e| StateError::Corrupt {
                    path: self.path.clone(),
                    reason: format!("state {state}: {e}"),
                }),
        }
    }

    /// Reads the encoded value stored under a full key built by [`state_key`].
    pub fn get_raw(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.db.get(key).map_err(StateError::rocks(&self.path))
    }

    /// Writes a batch of updates atomically.
    pub fn write(&self, batch: StateBatch) -> Result<()> {
        self.db
            .write_opt(batch.0, &self.write_opts)
            .map_err(StateError::rocks(&self.path))
    }

    /// Takes a RocksDB checkpoint into `target` (which must not exist): SST files are
    /// hard links, the WAL since the last memtable flush and the small metadata files
    /// are copies. Everything in `target` is fsynced before this returns, and the file
    /// list comes with CRCs. SST CRCs are reused from earlier checkpoints; only new SSTs,
    /// the WAL copy and the metadata files are read. No memtable is flushed.
    pub fn checkpoint(&mut self, target: &Path) -> Result<Vec<FileEntry>> {
        self.checkpoint_with(target, || {})
    }

    /// [`checkpoint`](Self::checkpoint), calling `created` once RocksDB wrote the
    /// checkpoint and before its files are listed and checksummed (the fault harness
    /// aborts there).
    pub fn checkpoint_with(
        &mut self,
        target: &Path,
        created: impl FnOnce(),
    ) -> Result<Vec<FileEntry>> {
        // `u64::MAX`: never flush the memtable; the WAL written since the last flush is
        // copied (up to what was written at this call) and replayed on restore.
        Checkpoint::new(&self.db)
            .and_then(|c| c.create_checkpoint_with_log_size(target, u64::MAX))
            .map_err(StateError::rocks(target))?;
        created();
        let mut files = Vec::new();
        let mut live = HashMap::new();
        for item in fs::read_dir(target).map_err(StateError::io("list", target))? {
            let item = item.map_err(StateError::io("list", target))?;
            let name = item.file_name().to_string_lossy().into_owned();
            let path = item.path();
            let size = item
                .metadata()
                .map_err(StateError::io("stat", &path))?
                .len();
            let is_sst = name.ends_with(".sst");
            let crc = match self.sst_crc.get(&name) {
                Some(&(s, crc)) if is_sst && s == size => crc,
                _ => {
                    if !is_sst {
                        durable::fsync_file(&path)?;
                    }
                    file_crc32(&path).map_err(StateError::io("read", &path))?.1
                }
            };
            if is_sst {
                live.insert(name.clone(), (size, crc));
            }
            files.push(FileEntry {
                name,
                size,
                crc32: crc,
            });
        }
        // Forget compacted-away files so the cache stays the size of the live state.
        self.sst_crc = live;
        durable::fsync_dir(target)?;
        files.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(files)
    }
}

/// A set of state updates applied atomically by [`KeyedStateBackend::write`].
#[derive(Default)]
pub struct StateBatch(WriteBatch);

impl StateBatch {
    /// Sets `(state, key)` in `group` to `value`.
    pub fn put<T: Serialize>(
        &mut self,
        group: KeyGroup,
        state: &str,
        key: &[u8],
        value: &T,
    ) -> Result<()> {
        let bytes = bincode::serde::encode_to_vec(value, bincode_config())
            .map_err(|e| StateError::Encode(e.to_string()))?;
        self.0.put(state_key(group, state, key), bytes);
        Ok(())
    }

    /// Sets a full key built by [`state_key`] to already encoded bytes.
    pub fn put_raw(&mut self, key: &[u8], value: &[u8]) {
        self.0.put(key, value);
    }

    /// Removes `(state, key)` in `group`.
    pub fn delete(&mut self, group: KeyGroup, state: &str, key: &[u8]) {
        self.0.delete(state_key(group, state, key));
    }

    /// Number of updates in the batch.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the batch holds no update.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keygroup::{key_group_of, range_for_subtask};

    const MP: u16 = 16;

    fn snapshot(
        dir: &Path,
        name: &str,
        range: KeyGroupRange,
        files: Vec<FileEntry>,
    ) -> StateRestore {
        StateRestore::new(
            dir.to_path_buf(),
            SubtaskSnapshot {
                operator: "op".into(),
                subtask: 0,
                key_groups: Some(range),
                state_dir: Some(name.into()),
                files,
                inline_state: vec![],
            },
        )
    }

    fn fill(backend: &KeyedStateBackend, keys: std::ops::Range<u32>) {
        let mut b = StateBatch::default();
        for k in keys {
            let key = k.to_string();
            let g = key_group_of(key.as_bytes(), MP);
            if backend.key_groups().contains(g) {
                b.put(g, "sum", key.as_bytes(), &(k as i64)).unwrap();
            }
        }
        backend.write(b).unwrap();
    }

    #[test]
    fn the_write_buffer_setting_decides_when_memtables_become_sst_files() {
        let tmp = tempfile::tempdir().unwrap();
        let range = range_for_subtask(MP, 1, 0);
        let ssts = |opts: &BackendOptions, name: &str| {
            let mut b =
                KeyedStateBackend::open_with(&tmp.path().join(name), range, &[], opts).unwrap();
            // About 1.5 MiB of keys and values, written in batches.
            for chunk in 0..30u32 {
                fill(&b, chunk * 1000..(chunk + 1) * 1000);
            }
            let chk = tmp.path().join(format!("{name}-chk"));
            let files = b.checkpoint(&chk).unwrap();
            files.iter().filter(|f| f.name.ends_with(".sst")).count()
        };
        let small = BackendOptions {
            write_buffer_bytes: 64 << 10,
            block_cache_bytes: 0,
        };
        let large = BackendOptions {
            write_buffer_bytes: 8 << 20,
            block_cache_bytes: 0,
        };
        assert_eq!(ssts(&large, "large"), 0, "8 MiB: all in the memtable");
        assert!(
            ssts(&small, "small") >= 1,
            "64 KiB memtables are flushed to SST files"
        );
    }

    #[test]
    fn checkpoint_restores_in_place_and_rescaled() {
        let tmp = tempfile::tempdir().unwrap();
        let chk = tmp.path().join("chk");
        fs::create_dir(&chk).unwrap();
        // Two subtasks at parallelism 2 write their groups and checkpoint.
        let mut restores = Vec::new();
        for i in 0..2u16 {
            let range = range_for_subtask(MP, 2, i);
            let mut b =
                KeyedStateBackend::open(&tmp.path().join(format!("work{i}")), range, &[]).unwrap();
            // Half of the keys in SST files, half only in the memtable and its WAL:
            // the restore must bring back both.
            fill(&b, 0..500);
            b.db.flush().unwrap();
            fill(&b, 500..1000);
            let name = format!("op-{i}");
            let files = b.checkpoint(&chk.join(&name)).unwrap();
            assert!(files.iter().any(|f| f.name.ends_with(".sst")), "{files:?}");
            assert!(files.iter().any(|f| f.name.ends_with(".log")), "{files:?}");
            restores.push(snapshot(&chk, &name, range, files));
        }
        // Same parallelism: linked in place.
        let same = KeyedStateBackend::open(
            &tmp.path().join("same"),
            range_for_subtask(MP, 2, 0),
            &restores[..1],
        )
        .unwrap();
        // Parallelism 3: each subtask gathers its groups from both snapshots.
        let mut found = 0;
        for i in 0..3u16 {
            let range = range_for_subtask(MP, 3, i);
            let b = KeyedStateBackend::open(&tmp.path().join(format!("re{i}")), range, &restores)
                .unwrap();
            for k in 0..1000u32 {
                let key = k.to_string();
                let g = key_group_of(key.as_bytes(), MP);
                if range.contains(g) {
                    assert_eq!(
                        b.get::<i64>(g, "sum", key.as_bytes()).unwrap(),
                        Some(k as i64)
                    );
                    found += 1;
                }
                if same.key_groups().contains(g) && i == 0 {
                    assert_eq!(
                        same.get::<i64>(g, "sum", key.as_bytes()).unwrap(),
                        Some(k as i64)
                    );
                }
            }
        }
        assert_eq!(
            found, 1000,
            "every key restored exactly once across subtasks"
        );
    }

    #[test]
    fn a_key_filter_restores_only_the_keys_it_keeps_even_at_the_same_key_groups() {
        let tmp = tempfile::tempdir().unwrap();
        let chk = tmp.path().join("chk");
        fs::create_dir(&chk).unwrap();
        let range = range_for_subtask(MP, 1, 0);
        let mut b = KeyedStateBackend::open(&tmp.path().join("work"), range, &[]).unwrap();
        fill(&b, 0..1000);
        let files = b.checkpoint(&chk.join("op-0")).unwrap();
        let mut r = snapshot(&chk, "op-0", range, files);
        // Keep the even keys only: the same key groups would otherwise be linked whole.
        r.keep = Some(std::sync::Arc::new(|k: &[u8]| {
            std::str::from_utf8(k).unwrap().parse::<u32>().unwrap() % 2 == 0
        }));
        let re = KeyedStateBackend::open(&tmp.path().join("re"), range, &[r]).unwrap();
        for k in 0..1000u32 {
            let key = k.to_string();
            let g = key_group_of(key.as_bytes(), MP);
            let want = (k % 2 == 0).then_some(k as i64);
            assert_eq!(
                re.get::<i64>(g, "sum", key.as_bytes()).unwrap(),
                want,
                "{k}"
            );
        }
        assert_eq!(
            user_key_of(&state_key(KeyGroup(3), "sum", b"abc")),
            Some(&b"abc"[..])
        );
        assert_eq!(user_key_of(&[0, 1]), None);
        assert_eq!(user_key_of(&[0, 1, 5, b's']), None);
    }

    #[test]
    fn a_snapshot_naming_paths_outside_or_symlinks_is_refused_before_any_write() {
        let tmp = tempfile::tempdir().unwrap();
        let chk = tmp.path().join("chk");
        fs::create_dir(&chk).unwrap();
        let range = range_for_subtask(MP, 1, 0);
        let mut b = KeyedStateBackend::open(&tmp.path().join("w"), range, &[]).unwrap();
        fill(&b, 0..100);
        let files = b.checkpoint(&chk.join("op-0")).unwrap();
        drop(b);
        let work = tmp.path().join("restored");
        // A file name that climbs out of the state directory.
        let mut evil = files.clone();
        evil[0].name = "../../escaped".into();
        let err = KeyedStateBackend::open(&work, range, &[snapshot(&chk, "op-0", range, evil)])
            .err()
            .expect("refused");
        assert!(matches!(err, StateError::UnsafeName { .. }), "{err}");
        assert!(err.to_string().contains("../../escaped"), "{err}");
        assert!(!work.exists(), "nothing written");
        assert!(!tmp.path().join("escaped").exists());
        // An absolute state directory.
        let err = KeyedStateBackend::open(
            &work,
            range,
            &[snapshot(&chk, "/abs", range, files.clone())],
        )
        .err()
        .expect("refused");
        assert!(err.to_string().contains("state_dir \"/abs\""), "{err}");
        // A listed file replaced by a symbolic link to a file outside.
        let outside = tmp.path().join("outside");
        let victim = chk.join("op-0").join(&files[0].name);
        fs::copy(&victim, &outside).unwrap();
        fs::remove_file(&victim).unwrap();
        std::os::unix::fs::symlink(&outside, &victim).unwrap();
        let err = KeyedStateBackend::open(
            &work,
            range,
            &[snapshot(&chk, "op-0", range, files.clone())],
        )
        .err()
        .expect("refused");
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert!(!work.exists(), "nothing written");
    }

    #[test]
    fn second_checkpoint_reuses_crcs_of_unchanged_ssts() {
        let tmp = tempfile::tempdir().unwrap();
        let range = range_for_subtask(MP, 1, 0);
        let mut b = KeyedStateBackend::open(&tmp.path().join("w"), range, &[]).unwrap();
        fill(&b, 0..100);
        b.db.flush().unwrap();
        let first = b.checkpoint(&tmp.path().join("c1")).unwrap();
        fill(&b, 100..200);
        b.db.flush().unwrap();
        let second = b.checkpoint(&tmp.path().join("c2")).unwrap();
        let old: Vec<_> = first.iter().filter(|f| f.name.ends_with(".sst")).collect();
        for f in old {
            // The cached CRC must equal the real one for files carried over.
            if let Some(g) = second.iter().find(|g| g.name == f.name) {
                assert_eq!(
                    g.crc32,
                    file_crc32(&tmp.path().join("c2").join(&g.name)).unwrap().1
                );
            }
        }
        assert!(second.iter().filter(|f| f.name.ends_with(".sst")).count() >= 1);
    }

    fn ssts(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".sst"))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_checkpoint_flushes_no_memtable_and_the_wal_copy_restores_it() {
        let tmp = tempfile::tempdir().unwrap();
        let range = range_for_subtask(MP, 1, 0);
        let work = tmp.path().join("w");
        let mut b = KeyedStateBackend::open(&work, range, &[]).unwrap();
        fill(&b, 0..1000);
        let files = b.checkpoint(&tmp.path().join("c1")).unwrap();
        assert_eq!(ssts(&work), Vec::<String>::new(), "no memtable flush");
        assert!(files.iter().all(|f| !f.name.ends_with(".sst")), "{files:?}");
        // Written after the checkpoint: must not be restored.
        fill(&b, 1000..1100);
        drop(b);
        let restored = KeyedStateBackend::open(
            &tmp.path().join("r"),
            range,
            &[snapshot(tmp.path(), "c1", range, files)],
        )
        .unwrap();
        for k in 0..1100u32 {
            let key = k.to_string();
            let g = key_group_of(key.as_bytes(), MP);
            let expect = (k < 1000).then_some(k as i64);
            assert_eq!(
                restored.get::<i64>(g, "sum", key.as_bytes()).unwrap(),
                expect,
                "key {k}"
            );
        }
    }

    #[test]
    fn restore_hard_links_the_checkpoint_ssts_and_copies_the_mutable_files() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let range = range_for_subtask(MP, 1, 0);
        let mut b = KeyedStateBackend::open(&tmp.path().join("w"), range, &[]).unwrap();
        fill(&b, 0..1000);
        b.db.flush().unwrap();
        fill(&b, 1000..1200);
        let chk = tmp.path().join("c1");
        let files = b.checkpoint(&chk).unwrap();
        drop(b);
        let work = tmp.path().join("restored");
        let _r = KeyedStateBackend::open(
            &work,
            range,
            &[snapshot(tmp.path(), "c1", range, files.clone())],
        )
        .unwrap();
        let mut linked = 0;
        for f in &files {
            let theirs = fs::metadata(chk.join(&f.name)).unwrap();
            let ours = fs::symlink_metadata(work.join(&f.name));
            if f.name.ends_with(".sst") {
                // The same inode: a hard link, no bytes copied.
                let ours = ours.unwrap();
                assert_eq!(
                    (ours.dev(), ours.ino()),
                    (theirs.dev(), theirs.ino()),
                    "{}",
                    f.name
                );
                assert!(ours.nlink() >= 2, "{}", f.name);
                linked += 1;
            } else if let Ok(ours) = ours {
                // MANIFEST, CURRENT, OPTIONS and the WAL are rewritten by RocksDB: never
                // shared with the checkpoint.
                assert_ne!(ours.ino(), theirs.ino(), "{} must be a copy", f.name);
            }
        }
        assert!(linked >= 1, "{files:?}");
        // RocksDB deletes the replayed WAL and rewrites CURRENT at open, so the check
        // above cannot see them: what restore itself lays down is checked before any open.
        let laid = tmp.path().join("laid");
        fs::create_dir_all(&laid).unwrap();
        materialize(&chk, &files, &laid).unwrap();
        for f in &files {
            let theirs = fs::metadata(chk.join(&f.name)).unwrap();
            let ours = fs::symlink_metadata(laid.join(&f.name)).unwrap();
            let shared = (ours.dev(), ours.ino()) == (theirs.dev(), theirs.ino());
            assert_eq!(
                shared,
                f.name.ends_with(".sst"),
                "{}: linked = {shared}",
                f.name
            );
        }
        assert!(files.iter().any(|f| f.name.ends_with(".log")), "{files:?}");
    }
}
