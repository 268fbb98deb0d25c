//! The exactly-once file sink (two-phase, like Flink's file sink).
//!
//! Each subtask appends records to an in-progress file. At barrier `N` the file is
//! fsynced and renamed to `.part-<subtask>-<N>` (pending), and the checkpoint records
//! every pending file. At `notify_checkpoint_complete(N)` pending files are renamed to
//! `part-<subtask>-<N>` (committed). On restore from checkpoint `K`:
//! - pending files named by `K` are committed (the notify may have been lost in a crash);
//! - committed files of checkpoints after `K` are moved into `.rolled-back/` because
//!   their records are about to be written again (nothing is deleted);
//! - uncommitted leftovers (in-progress files, pending files `K` does not name) are
//!   removed: they were never output.
//!
//! A restore into a directory that never held the sink's output (no [`MARKER`], no
//! part file: a new machine, when the checkpoints are in an object store) is refused,
//! naming what is missing: the committed output of the restored checkpoint is on the
//! disk that wrote it, and going on would end with it absent.
//!
//! A subtask cleans and commits the files of old subtask indices `j` with
//! `j % parallelism == index`, so restores at another parallelism leave nothing behind.
//!
//! The restored state holds only numbers (`(subtask, checkpoint id)`): every path a
//! restore touches is formed here, inside the configured directory, so a crafted
//! checkpoint cannot name a file elsewhere.

use crate::connector::SubtaskInfo;
use crate::error::{JobError, Result};
use crate::kits::{TwoPhaseSink, TwoPhaseWriter};
use crate::record::{Batch, Record};
use async_trait::async_trait;
use lockgate_state::durable;
use lockgate_state::CheckpointId;
use serde::{Deserialize, Serialize};
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use tracing::warn;

/// The sink kind of the file sink in a job graph.
pub const KIND: &str = "file";

/// The subdirectory that receives part files rolled back by a restore.
pub const ROLLED_BACK: &str = ".rolled-back";

/// Configuration of a file sink.
#[derive(Debug, Clone, PartialEq)]
pub struct FileSinkConfig {
    pub dir: PathBuf,
}

/// `[sink.file]` as written in a job file.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSection {
    dir: PathBuf,
    format: Option<String>,
}

impl FileSection {
    /// The sink's configuration, its directory resolved by `resolve` (against the job
    /// file's directory). An error is `(key, message)`.
    pub fn config(
        &self,
        resolve: &dyn Fn(&std::path::Path) -> PathBuf,
    ) -> Result<FileSinkConfig, (String, String)> {
        match self.format.as_deref().unwrap_or("json") {
            "json" => Ok(FileSinkConfig {
                dir: resolve(&self.dir),
            }),
            other => Err((
                "format".into(),
                format!("`{other}` is not supported (json)"),
            )),
        }
    }
}

impl crate::connector::SinkSection for FileSection {
    fn prepare(
        self,
        cx: &crate::connector::SinkContext<'_>,
    ) -> Result<crate::connector::PreparedSink, crate::connector::KeyError> {
        let cfg = self.config(&|p: &Path| cx.section.resolve(p))?;
        Ok(crate::connector::PreparedSink {
            spec: FileSink::spec(cfg.clone()),
            config: std::sync::Arc::new(cfg),
            reads_tombstones: false,
        })
    }
}

/// A file name the sink owns, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartName {
    /// `part-<subtask>-<id>`
    Committed { subtask: u16, id: CheckpointId },
    /// `.part-<subtask>-<id>`
    Pending { subtask: u16, id: CheckpointId },
    /// `.inprogress-<subtask>-<n>`
    InProgress { subtask: u16 },
}

/// The line a delete (or a tombstone) is written as:
/// `{"lockgate.delete":{"key":K,"before":V}}`, where `K` is the record's key as text
/// (base64 in `{"base64": ...}` when it is not UTF-8) or null, and `V` the image before
/// the delete or null.
pub fn delete_line(r: &Record) -> Vec<u8> {
    use base64::Engine;
    use serde_json::{json, Value};
    let key = match r.key.as_deref().map(std::str::from_utf8) {
        None => Value::Null,
        Some(Ok(k)) => Value::String(k.to_string()),
        Some(Err(_)) => json!({
            "base64": base64::engine::general_purpose::STANDARD.encode(r.key.as_deref().unwrap_or_default())
        }),
    };
    let before = if r.tombstone {
        Value::Null
    } else {
        serde_json::from_slice(&r.value)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&r.value).into_owned()))
    };
    serde_json::to_vec(&json!({ "lockgate.delete": { "key": key, "before": before } }))
        .expect("a JSON value serializes")
}

/// Parses a file name of the sink's directory.
pub fn parse_part_name(name: &str) -> Option<PartName> {
    let two = |rest: &str| -> Option<(u16, u64)> {
        let (a, b) = rest.split_once('-')?;
        Some((a.parse().ok()?, b.parse().ok()?))
    };
    if let Some(rest) = name.strip_prefix("part-") {
        let (subtask, id) = two(rest)?;
        return Some(PartName::Committed {
            subtask,
            id: CheckpointId(id),
        });
    }
    if let Some(rest) = name.strip_prefix(".part-") {
        let (subtask, id) = two(rest)?;
        return Some(PartName::Pending {
            subtask,
            id: CheckpointId(id),
        });
    }
    if let Some(rest) = name.strip_prefix(".inprogress-") {
        let (subtask, _) = two(rest)?;
        return Some(PartName::InProgress { subtask });
    }
    None
}

/// The committed part a `.rolled-back/` entry holds, by its name in the sink's
/// directory: a part moved there keeps its name, or gets `.<n>` appended when that name
/// is taken (see `FileSink::roll_back`). None for anything else.
pub fn rolled_back_part(entry: &str) -> Option<(&str, PartName)> {
    let base = match entry.rsplit_once('.') {
        Some((base, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => base,
        _ => entry,
    };
    match parse_part_name(base)? {
        part @ PartName::Committed { .. } => Some((base, part)),
        _ => None,
    }
}

/// The file in the sink's directory that says the sink has written there: created at
/// the first open, so that a restore into a directory that never held this output (a
/// new machine, when the checkpoints live in an object store) is told apart from one
/// whose part files were all moved away.
pub const MARKER: &str = ".lockgate-file-sink";

/// Whether restoring checkpoint `k` into the sink's directory must be refused: the
/// directory has no [`MARKER`] (`marked`) and no part file (`holds_parts`: a directory
/// of an older lockgate, before markers), so the output committed up to `k` (and the
/// pending part files `k` names, `named`) is not there: the checkpoint was taken on
/// another machine's disk. Starting anyway would end with that output missing.
pub fn foreign_directory(
    k: CheckpointId,
    marked: bool,
    holds_parts: bool,
    named: &[String],
) -> Option<String> {
    if marked || holds_parts {
        return None;
    }
    let pending = match named {
        [] => String::new(),
        files => format!(
            " and the pending part files it names ({})",
            files.join(", ")
        ),
    };
    Some(format!(
        "checkpoint {k} was written with another output directory: this one holds no {MARKER} and no part file, so the part files committed up to checkpoint {k}{pending} are missing (were the checkpoints restored on a new machine? the file sink's output stays on the disk that wrote it: move that directory here, or start the job without its checkpoints)"
    ))
}

/// What a restore does with one file: a plain function of the file, the restored
/// checkpoint and the pending files it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreAction {
    Keep,
    Commit,
    RollBack,
    Remove,
}

/// Decides the fate of one sink file on restore from `restored` (None: fresh start).
pub fn restore_action(
    file: PartName,
    restored: Option<CheckpointId>,
    pending: &[(u16, CheckpointId)],
) -> RestoreAction {
    match file {
        PartName::Committed { id, .. } => match restored {
            Some(k) if id <= k => RestoreAction::Keep,
            // Committed output of a checkpoint we are not restoring (or of any
            // checkpoint, on a fresh start) will be written again.
            _ => RestoreAction::RollBack,
        },
        PartName::Pending { subtask, id } => {
            if pending.contains(&(subtask, id)) {
                RestoreAction::Commit
            } else {
                RestoreAction::Remove
            }
        }
        PartName::InProgress { .. } => RestoreAction::Remove,
    }
}

fn part_subtask(p: PartName) -> u16 {
    match p {
        PartName::Committed { subtask, .. }
        | PartName::Pending { subtask, .. }
        | PartName::InProgress { subtask } => subtask,
    }
}

/// What one checkpoint of one subtask staged: the pending part file
/// `.part-<subtask>-<id>`. Its serde form, `(subtask, id)`, is in every checkpoint of
/// the file sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    pub subtask: u16,
    pub id: CheckpointId,
}

/// The file sink: its writer on the two-phase-commit kit.
pub type FileSink = TwoPhaseSink<FileWriter>;

impl FileSink {
    /// The sink as the runtime takes it: exactly-once, one process only (its part
    /// files are named per subtask of one process).
    pub fn spec(cfg: FileSinkConfig) -> crate::connector::SinkSpec {
        crate::connector::SinkSpec::new(KIND, move |_| {
            Box::new(TwoPhaseSink::new(FileWriter::new(cfg.clone())))
        })
        .with_caps(crate::connector::SinkCaps {
            guarantee: crate::connector::Guarantee::ExactlyOnce,
            needs_source_order: None,
            one_process_only: Some((
                "sink.file".into(),
                "the file sink runs as one process; {members} members need the Elasticsearch sink"
                    .into(),
            )),
            commits_are_final: false,
        })
    }
}

/// The file sink's writer: part files staged by rename, committed by rename.
pub struct FileWriter {
    cfg: FileSinkConfig,
    index: u16,
    parallelism: u16,
    name: String,
    current: Option<(PathBuf, BufWriter<File>)>,
    counter: u64,
}

impl FileWriter {
    /// A subtask's writer into `cfg.dir`.
    pub fn new(cfg: FileSinkConfig) -> FileWriter {
        FileWriter {
            cfg,
            index: 0,
            parallelism: 1,
            name: String::new(),
            current: None,
            counter: 0,
        }
    }

    fn err(&self, what: &str, path: &Path, e: impl std::fmt::Display) -> JobError {
        JobError::task(&self.name, format!("{what} {}: {e}", path.display()))
    }

    /// Whether files of (old) subtask `subtask` are this subtask's to clean and commit.
    fn mine(&self, subtask: u16) -> bool {
        subtask % self.parallelism.max(1) == self.index
    }

    fn committed_path(&self, subtask: u16, id: CheckpointId) -> PathBuf {
        self.cfg.dir.join(format!("part-{subtask}-{}", id.0))
    }

    fn pending_path(&self, subtask: u16, id: CheckpointId) -> PathBuf {
        self.cfg.dir.join(format!(".part-{subtask}-{}", id.0))
    }

    /// Creates the directory's marker (empty; its existence is what counts). Subtasks
    /// of one job may race here: the first creates it, the others find it.
    fn mark(&self) -> Result<()> {
        let marker = self.cfg.dir.join(MARKER);
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&marker)
        {
            Ok(f) => f.sync_all().map_err(|e| self.err("fsync", &marker, e))?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(self.err("create", &marker, e)),
        }
        durable::fsync_dir(&self.cfg.dir).map_err(|e| self.err("fsync", &self.cfg.dir, e))
    }

    fn roll_back(&self, name: &str) -> Result<()> {
        let aside = self.cfg.dir.join(ROLLED_BACK);
        fs::create_dir_all(&aside).map_err(|e| self.err("create", &aside, e))?;
        let mut target = aside.join(name);
        let mut n = 1;
        while target.exists() {
            target = aside.join(format!("{name}.{n}"));
            n += 1;
        }
        let from = self.cfg.dir.join(name);
        durable::rename_durable(&from, &target).map_err(|e| self.err("roll back", &from, e))?;
        warn!(file = %from.display(), moved_to = %target.display(), "rolled back part file committed after the restored checkpoint: its records are written again");
        Ok(())
    }
}

#[async_trait]
impl TwoPhaseWriter for FileWriter {
    type Committable = Part;

    fn kind(&self) -> &'static str {
        "file sink"
    }

    /// A part is committed by the subtask its name gives (modulo the parallelism),
    /// whichever state named it.
    fn subtask_of(&self, p: &Part) -> Option<u16> {
        Some(p.subtask)
    }

    async fn open(
        &mut self,
        info: &SubtaskInfo,
        restored: Option<CheckpointId>,
        to_commit: &[Part],
    ) -> Result<()> {
        self.index = info.index;
        self.parallelism = info.parallelism;
        self.name = info.name.clone();
        fs::create_dir_all(&self.cfg.dir).map_err(|e| self.err("create", &self.cfg.dir, e))?;
        let marked = self.cfg.dir.join(MARKER).exists();
        if let Some(k) = restored {
            let holds_parts = fs::read_dir(&self.cfg.dir)
                .map_err(|e| self.err("list", &self.cfg.dir, e))?
                .filter_map(|e| e.ok())
                .any(|e| {
                    let n = e.file_name();
                    parse_part_name(&n.to_string_lossy()).is_some() || n == ROLLED_BACK
                });
            let named: Vec<String> = to_commit
                .iter()
                .map(|p| self.pending_path(p.subtask, p.id).display().to_string())
                .collect();
            if let Some(why) = foreign_directory(k, marked, holds_parts, &named) {
                return Err(JobError::Unrecoverable {
                    task: self.name.clone(),
                    message: format!("{}: {why}", self.cfg.dir.display()),
                });
            }
        }
        if !marked {
            self.mark()?;
        }
        Ok(())
    }

    async fn write(&mut self, batch: &Batch) -> Result<()> {
        if self.current.is_none() {
            self.counter += 1;
            let path = self
                .cfg
                .dir
                .join(format!(".inprogress-{}-{}", self.index, self.counter));
            let f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)
                .map_err(|e| self.err("create", &path, e))?;
            self.current = Some((path, BufWriter::with_capacity(1 << 20, f)));
        }
        let (path, w) = self.current.as_mut().expect("opened above");
        for r in batch {
            let line = if r.tombstone || r.op == crate::record::Op::Delete {
                std::borrow::Cow::Owned(delete_line(r))
            } else {
                std::borrow::Cow::Borrowed(&r.value[..])
            };
            w.write_all(&line)
                .and_then(|_| w.write_all(b"\n"))
                .map_err(|e| {
                    JobError::task(&self.name, format!("write {}: {e}", path.display()))
                })?;
        }
        Ok(())
    }

    async fn prepare_commit(&mut self, id: CheckpointId) -> Result<Option<Part>> {
        let Some((path, w)) = self.current.take() else {
            return Ok(None);
        };
        let f = w
            .into_inner()
            .map_err(|e| self.err("flush", &path, e.error()))?;
        f.sync_all().map_err(|e| self.err("fsync", &path, e))?;
        let pending = self.pending_path(self.index, id);
        // The rename and the directory fsync make the pending file durable before the
        // checkpoint that names it can complete.
        durable::rename_durable(&path, &pending).map_err(|e| self.err("stage", &path, e))?;
        Ok(Some(Part {
            subtask: self.index,
            id,
        }))
    }

    async fn commit(&mut self, p: &Part) -> Result<()> {
        let from = self.pending_path(p.subtask, p.id);
        let to = self.committed_path(p.subtask, p.id);
        if from.exists() {
            durable::rename_durable(&from, &to).map_err(|e| self.err("commit", &from, e))?;
        } else if !to.exists() {
            // A checkpoint named this file as durable: its absence is lost data.
            return Err(self.err(
                "commit",
                &from,
                "pending part file named by the checkpoint is missing (neither pending nor committed)",
            ));
        }
        Ok(())
    }

    async fn abort_abandoned(
        &mut self,
        restored: Option<CheckpointId>,
        named: &[Part],
    ) -> Result<()> {
        let pending: Vec<(u16, CheckpointId)> = named.iter().map(|p| (p.subtask, p.id)).collect();
        let rd = fs::read_dir(&self.cfg.dir).map_err(|e| self.err("list", &self.cfg.dir, e))?;
        for entry in rd {
            let entry = entry.map_err(|e| self.err("list", &self.cfg.dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(part) = parse_part_name(&name) else {
                continue;
            };
            if !self.mine(part_subtask(part)) {
                continue;
            }
            match restore_action(part, restored, &pending) {
                RestoreAction::Keep | RestoreAction::Commit => {}
                RestoreAction::RollBack => self.roll_back(&name)?,
                RestoreAction::Remove => {
                    let p = entry.path();
                    fs::remove_file(&p).map_err(|e| self.err("remove", &p, e))?;
                }
            }
        }
        durable::fsync_dir(&self.cfg.dir).map_err(|e| self.err("fsync", &self.cfg.dir, e))
    }

    async fn close(&mut self) -> Result<()> {
        if let Some((path, _)) = self.current.take() {
            // Records after the final checkpoint cannot exist; an empty leftover can.
            let _ = fs::remove_file(path);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connector::{Sink, SinkRestore};

    #[test]
    fn a_delete_is_a_line_naming_its_key_and_image() {
        use crate::record::Op;
        let line = |r: Record| String::from_utf8(delete_line(&r)).unwrap();
        let delete = Record {
            key: Some(b"u-1".to_vec().into()),
            value: br#"{"id":1}"#.to_vec().into(),
            op: Op::Delete,
            ..Record::default()
        };
        assert_eq!(
            line(delete.clone()),
            r#"{"lockgate.delete":{"before":{"id":1},"key":"u-1"}}"#
        );
        let tombstone = Record {
            key: Some(vec![0xff, 0x00].into()),
            value: Default::default(),
            tombstone: true,
            ..Record::default()
        };
        assert_eq!(
            line(tombstone),
            r#"{"lockgate.delete":{"before":null,"key":{"base64":"/wA="}}}"#
        );
    }

    #[test]
    fn names_parse() {
        assert_eq!(
            parse_part_name("part-2-17"),
            Some(PartName::Committed {
                subtask: 2,
                id: CheckpointId(17)
            })
        );
        assert_eq!(
            parse_part_name(".part-0-3"),
            Some(PartName::Pending {
                subtask: 0,
                id: CheckpointId(3)
            })
        );
        assert_eq!(
            parse_part_name(".inprogress-1-9"),
            Some(PartName::InProgress { subtask: 1 })
        );
        assert_eq!(parse_part_name("part-x-1"), None);
        assert_eq!(parse_part_name("notes.txt"), None);
    }

    #[test]
    fn rolled_back_entries_name_the_part_they_hold() {
        let part = |id| PartName::Committed {
            subtask: 1,
            id: CheckpointId(id),
        };
        assert_eq!(rolled_back_part("part-1-7"), Some(("part-1-7", part(7))));
        assert_eq!(rolled_back_part("part-1-7.2"), Some(("part-1-7", part(7))));
        assert_eq!(rolled_back_part("part-1-7.x"), None);
        assert_eq!(rolled_back_part("part-1-7."), None);
        assert_eq!(rolled_back_part(".part-1-7"), None, "never a pending file");
        assert_eq!(rolled_back_part("notes.1"), None);
    }

    #[test]
    fn a_restore_into_a_directory_that_never_held_the_output_is_refused() {
        let k = CheckpointId(7);
        let named = vec!["out/.part-0-7".to_string()];
        // (marked, holds part files, refused)
        for (marked, parts, refused) in [
            (true, true, false),
            (true, false, false), // every part file moved away downstream
            (false, true, false), // a directory of a lockgate before markers
            (false, false, true), // a new machine
        ] {
            assert_eq!(
                foreign_directory(k, marked, parts, &named).is_some(),
                refused,
                "{marked} {parts}"
            );
        }
        let why = foreign_directory(k, false, false, &named).unwrap();
        assert!(
            why.contains("out/.part-0-7") && why.contains("checkpoint 7"),
            "{why}"
        );
        let why = foreign_directory(k, false, false, &[]).unwrap();
        assert!(
            why.contains("committed up to checkpoint 7 are missing"),
            "{why}"
        );
    }

    #[test]
    fn restore_actions_cover_every_case() {
        let k = Some(CheckpointId(10));
        let pending = [(0u16, CheckpointId(10)), (1, CheckpointId(9))];
        let c = |s, id| PartName::Committed {
            subtask: s,
            id: CheckpointId(id),
        };
        let p = |s, id| PartName::Pending {
            subtask: s,
            id: CheckpointId(id),
        };
        assert_eq!(restore_action(c(0, 9), k, &pending), RestoreAction::Keep);
        assert_eq!(restore_action(c(0, 10), k, &pending), RestoreAction::Keep);
        assert_eq!(
            restore_action(c(0, 11), k, &pending),
            RestoreAction::RollBack
        );
        assert_eq!(restore_action(c(0, 1), None, &[]), RestoreAction::RollBack);
        assert_eq!(restore_action(p(0, 10), k, &pending), RestoreAction::Commit);
        assert_eq!(restore_action(p(1, 9), k, &pending), RestoreAction::Commit);
        assert_eq!(restore_action(p(1, 11), k, &pending), RestoreAction::Remove);
        assert_eq!(
            restore_action(PartName::InProgress { subtask: 0 }, k, &pending),
            RestoreAction::Remove
        );
    }

    fn info(index: u16, parallelism: u16) -> SubtaskInfo {
        SubtaskInfo::new("job", &format!("sink-{index}"), index, parallelism)
    }

    fn fresh() -> SinkRestore {
        SinkRestore {
            checkpoint: None,
            states: vec![],
            parallelism: 1,
        }
    }

    fn sink(dir: &Path) -> FileSink {
        FileSink::new(FileWriter::new(FileSinkConfig {
            dir: dir.to_path_buf(),
        }))
    }

    fn batch(values: &[&str]) -> Batch {
        values
            .iter()
            .map(|v| Record::from_value(v.as_bytes().to_vec()))
            .collect()
    }

    /// The sink's directory listing, sorted, `.rolled-back` entries as `.rolled-back/x`.
    fn listing(dir: &Path) -> Vec<String> {
        let mut out = Vec::new();
        for e in fs::read_dir(dir).unwrap() {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            if name == ROLLED_BACK {
                for r in fs::read_dir(dir.join(ROLLED_BACK)).unwrap() {
                    let r = r.unwrap().file_name().to_string_lossy().into_owned();
                    out.push(format!("{ROLLED_BACK}/{r}"));
                }
            } else if name != MARKER {
                out.push(name);
            }
        }
        out.sort();
        out
    }

    /// A checkpoint's state as the file sink wrote it before the two-phase kit: a
    /// bincode `{ pending: [(subtask, id), ...] }` (checkpoints of that format restore).
    fn state(pending: &[(u16, u64)]) -> Vec<u8> {
        #[derive(Serialize)]
        struct SinkState {
            pending: Vec<(u16, CheckpointId)>,
        }
        bincode::serde::encode_to_vec(
            SinkState {
                pending: pending
                    .iter()
                    .map(|&(s, id)| (s, CheckpointId(id)))
                    .collect(),
            },
            bincode::config::standard(),
        )
        .unwrap()
    }

    use crate::record::Record;

    #[tokio::test]
    async fn records_are_staged_at_the_barrier_and_committed_on_notify() {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = sink(tmp.path());
        s.open(&info(0, 1), &fresh()).await.unwrap();
        s.invoke(batch(&["a", "b"])).await.unwrap();
        assert_eq!(listing(tmp.path()), vec![".inprogress-0-1"]);
        s.snapshot(CheckpointId(1)).await.unwrap();
        assert_eq!(listing(tmp.path()), vec![".part-0-1"]);
        assert_eq!(fs::read(tmp.path().join(".part-0-1")).unwrap(), b"a\nb\n");
        s.invoke(batch(&["c"])).await.unwrap();
        assert_eq!(listing(tmp.path()), vec![".inprogress-0-2", ".part-0-1"]);
        s.snapshot(CheckpointId(2)).await.unwrap();
        s.invoke(batch(&["d"])).await.unwrap();
        s.snapshot(CheckpointId(3)).await.unwrap();
        // The notify of 1 was lost: 2 commits everything up to 2, nothing after.
        s.notify_checkpoint_complete(CheckpointId(2)).await.unwrap();
        assert_eq!(
            listing(tmp.path()),
            vec![".part-0-3", "part-0-1", "part-0-2"]
        );
        assert_eq!(fs::read(tmp.path().join("part-0-2")).unwrap(), b"c\n");
        s.notify_checkpoint_complete(CheckpointId(3)).await.unwrap();
        assert_eq!(
            listing(tmp.path()),
            vec!["part-0-1", "part-0-2", "part-0-3"]
        );
        // Records after the last checkpoint never become output.
        s.invoke(batch(&["e"])).await.unwrap();
        s.close().await.unwrap();
        assert_eq!(
            listing(tmp.path()),
            vec!["part-0-1", "part-0-2", "part-0-3"]
        );
    }

    #[tokio::test]
    async fn records_out_counts_the_records_written_by_each_subtask() {
        let tmp = tempfile::tempdir().unwrap();
        let telemetry = crate::telemetry::Telemetry::new("j", "", 2, 128);
        let mut sinks = Vec::new();
        for index in 0..2 {
            let mut s = sink(tmp.path());
            let info = info(index, 2).with_telemetry(telemetry.clone());
            s.open(&info, &fresh()).await.unwrap();
            sinks.push(s);
        }
        sinks[0].invoke(batch(&["a", "b"])).await.unwrap();
        sinks[1].invoke(batch(&["c"])).await.unwrap();
        sinks[0].invoke(batch(&["d"])).await.unwrap();
        let m = telemetry.metrics();
        let out = |subtask: &str| {
            m.records_out
                .with_label_values(&["j", "sink", subtask])
                .get()
        };
        assert_eq!((out("0"), out("1")), (3, 1));
    }

    #[tokio::test]
    async fn restore_commits_what_the_checkpoint_names_and_rolls_back_what_came_after() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        for name in [
            ".part-0-5",       // named by checkpoint 5: committed
            "part-0-4",        // committed before 5: kept
            "part-0-6",        // committed after 5: rolled back
            ".part-0-6",       // pending, not named: removed
            ".inprogress-0-3", // never output: removed
            ".inprogress-2-1", // old subtask 2 belongs to subtask 0 of 2: removed
            ".inprogress-1-1", // subtask 1's: untouched
            "part-1-9",        // subtask 1's: untouched
            "notes.txt",       // not the sink's: untouched
        ] {
            fs::write(d.join(name), name).unwrap();
        }
        fs::create_dir(d.join(ROLLED_BACK)).unwrap();
        fs::write(d.join(ROLLED_BACK).join("part-0-6"), "earlier").unwrap();
        fs::write(d.join(ROLLED_BACK).join("part-0-6.1"), "earlier").unwrap();
        let restored = SinkRestore {
            checkpoint: Some(CheckpointId(5)),
            states: vec![(0, state(&[(0, 5)])), (1, state(&[]))],
            parallelism: 2,
        };
        sink(d).open(&info(0, 2), &restored).await.unwrap();
        assert_eq!(
            listing(d),
            vec![
                ".inprogress-1-1",
                ".rolled-back/part-0-6",
                ".rolled-back/part-0-6.1",
                ".rolled-back/part-0-6.2",
                "notes.txt",
                "part-0-4",
                "part-0-5",
                "part-1-9",
            ]
        );
        assert_eq!(fs::read(d.join("part-0-5")).unwrap(), b".part-0-5");
        assert_eq!(
            fs::read(d.join(ROLLED_BACK).join("part-0-6.2")).unwrap(),
            b"part-0-6"
        );
    }

    #[tokio::test]
    async fn a_pending_file_named_by_the_checkpoint_must_exist_in_one_form() {
        let tmp = tempfile::tempdir().unwrap();
        let restored = SinkRestore {
            checkpoint: Some(CheckpointId(5)),
            states: vec![(0, state(&[(0, 5)]))],
            parallelism: 1,
        };
        // A directory that never held the output: refused, naming the part file.
        let err = sink(tmp.path())
            .open(&info(0, 1), &restored)
            .await
            .unwrap_err();
        assert!(err.to_string().contains(".part-0-5"), "{err}");
        assert!(
            !tmp.path().join(MARKER).exists(),
            "a refused open marks nothing"
        );
        // The sink's own directory, the part file gone: refused too.
        fs::write(tmp.path().join(MARKER), "").unwrap();
        let err = sink(tmp.path())
            .open(&info(0, 1), &restored)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("is missing"), "{err}");
        // Already committed (the crash came after the rename): fine.
        fs::write(tmp.path().join("part-0-5"), "x").unwrap();
        sink(tmp.path()).open(&info(0, 1), &restored).await.unwrap();
        assert_eq!(listing(tmp.path()), vec!["part-0-5"]);
    }

    #[test]
    fn only_json_is_a_supported_format() {
        let section = |format: Option<&str>| FileSection {
            dir: "out".into(),
            format: format.map(str::to_string),
        };
        let resolve = |p: &Path| Path::new("/jobs").join(p);
        assert_eq!(
            section(None).config(&resolve).unwrap().dir,
            Path::new("/jobs/out")
        );
        assert!(section(Some("json")).config(&resolve).is_ok());
        let (key, msg) = section(Some("csv")).config(&resolve).unwrap_err();
        assert_eq!(key, "format");
        assert!(msg.contains("`csv`"), "{msg}");
    }
}
