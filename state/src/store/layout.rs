//! The layout of checkpoints in an object store, and the decisions over it as plain
//! functions (no I/O): object keys, what a listing means, what to upload, what
//! retention and garbage collection delete.
//!
//! ```text
//! <prefix>/chk-0000000042/_metadata             written last: the checkpoint is complete
//! <prefix>/chk-0000000041.abandoned/_metadata   left by a restore of an older checkpoint
//! <prefix>/shared/<state dir>/<file>.<size>.<crc32>   every state file, content-named
//! ```
//!
//! `_metadata` is the same file as in a local snapshot directory, byte for byte, and
//! every state file's key follows from its entry in `_metadata` ([`shared_key`]): the
//! store needs no second manifest. Every state file is content-named, not only SST
//! files: the WAL copy and the small RocksDB files of an unchanged state are identical
//! from one checkpoint to the next too, so a checkpoint of an unchanged state uploads
//! `_metadata` alone. Within one RocksDB instance a name with a given size always has
//! the same content (SST files are immutable, the others grow only by appending); the
//! CRC32 in the key separates files of instances that reused a name.

use crate::ids::CheckpointId;
use crate::metadata::{CheckpointMetadata, FileEntry, METADATA_FILE};
use crate::restore::{CheckpointEntry, EntryStatus};
use crate::snapshot_dir::{parse_name, NameKind};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The folder of content-named state files under the prefix.
pub const SHARED: &str = "shared";

/// The key (relative to the prefix) of a state file: `shared/<state dir>/<name>.<size>.<crc32>`.
pub fn shared_key(state_dir: &str, f: &FileEntry) -> String {
    format!("{SHARED}/{state_dir}/{}.{}.{:08x}", f.name, f.size, f.crc32)
}

/// The key (relative to the prefix) of a checkpoint's `_metadata`; `name` is the
/// entry's name (`chk-0000000042` or `chk-0000000042.abandoned`).
pub fn metadata_key(name: &str) -> String {
    format!("{name}/{METADATA_FILE}")
}

/// One state file of a checkpoint and where it is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredFile {
    /// Path relative to the checkpoint directory: `<state dir>/<name>`.
    pub local: String,
    /// Key relative to the prefix.
    pub key: String,
    pub size: u64,
}

/// Every state file `meta` lists, with its key.
pub fn stored_files(meta: &CheckpointMetadata) -> Vec<StoredFile> {
    let mut out = Vec::new();
    for st in &meta.subtasks {
        let Some(dir) = &st.state_dir else { continue };
        for f in &st.files {
            out.push(StoredFile {
                local: format!("{dir}/{}", f.name),
                key: shared_key(dir, f),
                size: f.size,
            });
        }
    }
    out
}

/// What a recursive listing of the prefix holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreListing {
    /// Checkpoint entries: `chk-N/` with `_metadata` is complete; `chk-N/` without it
    /// is unfinished (an upload or a deletion was interrupted: `_metadata` is written
    /// last and deleted first), reported as [`EntryStatus::InProgress`];
    /// `chk-N.abandoned/` is abandoned.
    pub entries: Vec<CheckpointEntry>,
    /// Every object under each entry (keys relative to the prefix).
    pub entry_objects: BTreeMap<String, Vec<String>>,
    /// Content-named state files and their sizes.
    pub shared: HashMap<String, u64>,
    /// Objects that belong to nothing lockgate writes (left alone).
    pub foreign: Vec<String>,
}

/// Reads a listing of `(key relative to the prefix, size)`.
pub fn parse_listing(objects: impl IntoIterator<Item = (String, u64)>) -> StoreListing {
    let mut l = StoreListing::default();
    let mut has_meta: BTreeMap<String, bool> = BTreeMap::new();
    for (key, size) in objects {
        let Some((first, rest)) = key.split_once('/') else {
            l.foreign.push(key);
            continue;
        };
        if first == SHARED {
            l.shared.insert(key, size);
        } else if parse_name(first).is_some() {
            let m = has_meta.entry(first.to_string()).or_default();
            *m |= rest == METADATA_FILE;
            l.entry_objects
                .entry(first.to_string())
                .or_default()
                .push(key);
        } else {
            l.foreign.push(key);
        }
    }
    for (name, meta) in has_meta {
        let Some((id, kind)) = parse_name(&name) else {
            continue;
        };
        let status = match kind {
            NameKind::Abandoned => EntryStatus::Abandoned,
            NameKind::Checkpoint if meta => EntryStatus::Complete,
            // Nothing lockgate writes is called `chk-N.inprogress/` in a store; treat
            // one like a `chk-N/` without `_metadata`.
            NameKind::Checkpoint | NameKind::InProgress => EntryStatus::InProgress,
        };
        l.entries.push(CheckpointEntry { id, name, status });
    }
    l.entries.sort_by_key(|e| (e.id, e.name.clone()));
    l
}

/// The files of `meta` that are not in the store yet (by key and size), each once.
pub fn to_upload(meta: &CheckpointMetadata, present: &HashMap<String, u64>) -> Vec<StoredFile> {
    let mut seen = BTreeSet::new();
    stored_files(meta)
        .into_iter()
        .filter(|f| present.get(&f.key) != Some(&f.size))
        .filter(|f| seen.insert(f.key.clone()))
        .collect()
}

/// The content-named objects that no kept checkpoint references: every shared key
/// known minus those of `kept` (the decodable `_metadata` of every entry that stays).
pub fn unreferenced<'a>(
    shared: impl IntoIterator<Item = &'a String>,
    kept: &[&CheckpointMetadata],
) -> Vec<String> {
    let referenced: BTreeSet<String> = kept
        .iter()
        .flat_map(|m| stored_files(m).into_iter().map(|f| f.key))
        .collect();
    let mut out: Vec<String> = shared
        .into_iter()
        .filter(|k| !referenced.contains(*k))
        .cloned()
        .collect();
    out.sort();
    out
}

/// The name an abandoned entry takes in the store.
pub fn abandoned_name(id: CheckpointId) -> String {
    format!("{}.abandoned", crate::snapshot_dir::chk_name(id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::tests::sample;

    fn with_files(id: u64, files: &[(&str, u64, u32)]) -> CheckpointMetadata {
        let mut m = sample(id);
        m.subtasks[0].files = files
            .iter()
            .map(|&(name, size, crc32)| FileEntry {
                name: name.into(),
                size,
                crc32,
            })
            .collect();
        m
    }

    #[test]
    fn keys_name_the_content_and_the_state_directory() {
        let f = FileEntry {
            name: "000009.sst".into(),
            size: 1234,
            crc32: 0xbeef,
        };
        assert_eq!(
            shared_key("rolling_sum-0", &f),
            "shared/rolling_sum-0/000009.sst.1234.0000beef"
        );
        assert_eq!(metadata_key("chk-0000000042"), "chk-0000000042/_metadata");
        let m = with_files(1, &[("CURRENT", 16, 1)]);
        assert_eq!(
            stored_files(&m),
            vec![StoredFile {
                local: "rolling_sum-0/CURRENT".into(),
                key: "shared/rolling_sum-0/CURRENT.16.00000001".into(),
                size: 16
            }]
        );
    }

    #[test]
    fn listing_tells_complete_unfinished_abandoned_and_shared_apart() {
        let l = parse_listing([
            ("chk-0000000001/_metadata".to_string(), 100),
            ("chk-0000000002.abandoned/_metadata".to_string(), 100),
            // An upload interrupted before `_metadata`, or a deletion after it.
            ("chk-0000000003/stray".to_string(), 1),
            ("shared/op-0/000009.sst.5.00000001".to_string(), 5),
            ("notes.txt".to_string(), 3),
            ("other/x".to_string(), 3),
        ]);
        let st: Vec<_> = l
            .entries
            .iter()
            .map(|e| (e.id.0, e.status.clone()))
            .collect();
        assert_eq!(
            st,
            vec![
                (1, EntryStatus::Complete),
                (2, EntryStatus::Abandoned),
                (3, EntryStatus::InProgress)
            ]
        );
        assert_eq!(l.shared.len(), 1);
        assert_eq!(l.foreign, vec!["notes.txt", "other/x"]);
        assert_eq!(
            l.entry_objects["chk-0000000003"],
            vec!["chk-0000000003/stray"]
        );
    }

    #[test]
    fn only_files_missing_or_of_another_size_are_uploaded_each_once() {
        let mut m = with_files(1, &[("000009.sst", 10, 1), ("CURRENT", 16, 2)]);
        let mut second = m.subtasks[0].clone();
        second.subtask = 1;
        second.state_dir = Some("rolling_sum-1".into());
        m.subtasks.push(second);
        // The same subtask listed twice uploads its files once.
        m.subtasks.push(m.subtasks[0].clone());
        let mut present = HashMap::new();
        let keys = |v: Vec<StoredFile>| v.into_iter().map(|f| f.key).collect::<Vec<_>>();
        assert_eq!(to_upload(&m, &present).len(), 4);
        present.insert(
            "shared/rolling_sum-0/000009.sst.10.00000001".to_string(),
            10,
        );
        // A truncated object (another size) is uploaded again.
        present.insert("shared/rolling_sum-0/CURRENT.16.00000002".to_string(), 3);
        assert_eq!(
            keys(to_upload(&m, &present)),
            vec![
                "shared/rolling_sum-0/CURRENT.16.00000002",
                "shared/rolling_sum-1/000009.sst.10.00000001",
                "shared/rolling_sum-1/CURRENT.16.00000002",
            ]
        );
    }

    #[test]
    fn garbage_is_what_no_kept_checkpoint_references() {
        let a = with_files(1, &[("000009.sst", 10, 1), ("CURRENT", 16, 2)]);
        let b = with_files(2, &[("000009.sst", 10, 1), ("000011.sst", 20, 3)]);
        let shared: Vec<String> = [&a, &b]
            .iter()
            .flat_map(|m| stored_files(m))
            .map(|f| f.key)
            .chain(["shared/rolling_sum-0/orphan.1.00000009".to_string()])
            .collect();
        assert_eq!(
            unreferenced(&shared, &[&b]),
            vec![
                "shared/rolling_sum-0/CURRENT.16.00000002",
                "shared/rolling_sum-0/orphan.1.00000009",
            ]
        );
        assert!(unreferenced(&shared, &[&a, &b]).len() == 1);
        assert_eq!(unreferenced(&shared, &[]).len(), shared.len());
    }
}
