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

/// How the create-if-absent write of a checkpoint's `_metadata` ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetadataWrite {
    /// The store created the object.
    Created,
    /// The store refused: an object of that name was there (HTTP 412 to
    /// `If-None-Match: *`, or 409 for a conditional write already in flight).
    Exists,
    /// The write reported an error: it may or may not have reached the store (a
    /// request that landed and whose response was lost looks the same).
    Failed(String),
}

/// What reading a checkpoint's `_metadata` back from the store found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetadataRead {
    Holds(Vec<u8>),
    Absent,
    /// The store could not be asked.
    Failed(String),
}

/// What the write of a checkpoint's `_metadata` means for the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetadataFate {
    /// Our `_metadata`, byte for byte, is in the store: the checkpoint is complete.
    Published,
    /// No `_metadata` is there: the checkpoint is not complete and may be abandoned.
    Absent(String),
    /// Another `_metadata` is there (or was, when we wrote): another writer works
    /// on this line.
    Fenced(String),
    /// It cannot be told: the checkpoint may be complete in the store, so nothing it
    /// references may be removed until a start has read the store.
    Unknown(String),
}

/// Decides what a `_metadata` write did, from how the write ended and (unless it
/// created the object) what reading it back found (`None`: not read). Only a
/// `_metadata` known to be absent makes a checkpoint abandonable; an object that
/// holds exactly `ours` is ours (a retried request whose first attempt landed).
pub fn metadata_fate(
    write: &MetadataWrite,
    read: Option<&MetadataRead>,
    ours: &[u8],
) -> MetadataFate {
    let wrote = match write {
        MetadataWrite::Created => return MetadataFate::Published,
        MetadataWrite::Exists => "the store refused to create it: it exists".to_string(),
        MetadataWrite::Failed(e) => format!("the write failed ({e})"),
    };
    match (write, read) {
        (_, Some(MetadataRead::Holds(b))) if b.as_slice() == ours => MetadataFate::Published,
        (_, Some(MetadataRead::Holds(b))) => MetadataFate::Fenced(format!(
            "{wrote}, and it holds another checkpoint's _metadata ({} bytes, ours {})",
            b.len(),
            ours.len()
        )),
        // It was there when we wrote and is gone now: nothing of ours deletes a
        // checkpoint while publishing it.
        (MetadataWrite::Exists, Some(MetadataRead::Absent)) => {
            MetadataFate::Fenced(format!("{wrote}, and it was deleted since"))
        }
        (_, Some(MetadataRead::Absent)) => {
            MetadataFate::Absent(format!("{wrote}, and it is not in the store"))
        }
        (_, Some(MetadataRead::Failed(e))) => {
            MetadataFate::Unknown(format!("{wrote}, and reading it back failed ({e})"))
        }
        (_, None) => MetadataFate::Unknown(format!("{wrote}, and it was not read back")),
    }
}

/// The state files a retention pass may delete: those it knows of (`candidates`: its
/// own uploads and what its start listed) that are still in the store (`listed`) and
/// that no `_metadata` present in the store references (`referenced_by`: every
/// decodable `_metadata` listed after the victims were deleted, other writers'
/// included). A file someone else uploaded and this pass never knew of is never
/// deleted: its checkpoint may be on its way.
pub fn collectable<'a>(
    candidates: impl IntoIterator<Item = &'a String>,
    listed: &HashMap<String, u64>,
    referenced_by: &[&CheckpointMetadata],
) -> Vec<String> {
    let present = candidates.into_iter().filter(|k| listed.contains_key(*k));
    unreferenced(present, referenced_by)
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
    fn a_metadata_write_is_complete_absent_fenced_or_unknown() {
        use MetadataFate as F;
        let ours = b"ours".to_vec();
        let failed = MetadataWrite::Failed("connection closed".into());
        let holds = |b: &[u8]| MetadataRead::Holds(b.to_vec());
        let unreadable = MetadataRead::Failed("HTTP 503".into());
        let fate = |w: &MetadataWrite, r: Option<&MetadataRead>| metadata_fate(w, r, &ours);
        let kind = |f: MetadataFate| match f {
            F::Published => "published",
            F::Absent(_) => "absent",
            F::Fenced(_) => "fenced",
            F::Unknown(_) => "unknown",
        };
        // (write, read back, fate): every case.
        let cases: [(&MetadataWrite, Option<&MetadataRead>, &str); 11] = [
            (&MetadataWrite::Created, None, "published"),
            // An ambiguous request retried by the client: its first attempt landed.
            (&MetadataWrite::Exists, Some(&holds(b"ours")), "published"),
            (&MetadataWrite::Exists, Some(&holds(b"theirs")), "fenced"),
            (
                &MetadataWrite::Exists,
                Some(&MetadataRead::Absent),
                "fenced",
            ),
            (&MetadataWrite::Exists, Some(&unreadable), "unknown"),
            (&MetadataWrite::Exists, None, "unknown"),
            // The write landed but reported an error.
            (&failed, Some(&holds(b"ours")), "published"),
            (&failed, Some(&holds(b"theirs")), "fenced"),
            (&failed, Some(&MetadataRead::Absent), "absent"),
            (&failed, Some(&unreadable), "unknown"),
            (&failed, None, "unknown"),
        ];
        for (w, r, want) in cases {
            assert_eq!(kind(fate(w, r)), want, "{w:?} then {r:?}");
        }
        // Reasons say what happened.
        assert_eq!(
            fate(&failed, Some(&unreadable)),
            F::Unknown(
                "the write failed (connection closed), and reading it back failed (HTTP 503)"
                    .into()
            )
        );
        // A prefix of ours is not ours.
        assert_eq!(kind(fate(&failed, Some(&holds(b"our")))), "fenced");
    }

    #[test]
    fn retention_collects_only_known_files_no_listed_metadata_references() {
        let old = with_files(1, &[("000009.sst", 10, 1)]);
        let ours = with_files(3, &[("000011.sst", 20, 3)]);
        // Another writer's newer checkpoint still uses the old file.
        let theirs = with_files(4, &[("000009.sst", 10, 1)]);
        let key = |m: &CheckpointMetadata| stored_files(m)[0].key.clone();
        let known = vec![
            key(&old),
            key(&ours),
            "shared/rolling_sum-0/gone.1.00000001".into(),
        ];
        let mut listed: HashMap<String, u64> =
            [(key(&old), 10), (key(&ours), 20)].into_iter().collect();
        // Uploaded by the other writer for a checkpoint whose _metadata is not written yet.
        listed.insert("shared/rolling_sum-0/000012.sst.7.00000004".into(), 7);
        assert_eq!(
            collectable(&known, &listed, &[&ours, &theirs]),
            Vec::<String>::new()
        );
        assert_eq!(collectable(&known, &listed, &[&ours]), vec![key(&old)]);
        assert_eq!(
            collectable(&known, &listed, &[]),
            vec![key(&old), key(&ours)]
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
