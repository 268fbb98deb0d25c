//! The file sink's writer on the two-phase kit: part files written in progress,
//! committed by rename.

use super::names::{
    committed_name, decode_staged, encode_staged, foreign_directory, parse_part_name, part_subtask,
    restore_action, writer_name, Named, Part, RestoreAction, Staged, StagedFile, MARKER,
    ROLLED_BACK,
};
use super::part::{parts_over_count, OpenPart, OpenParts, Opened, MAX_OPEN_FILES};
use super::placed::{records, Checked, Group};
use super::section::{FileSinkConfig, PARQUET_EXTENSION};
use super::store::StoreWriter;
use super::KIND;
use crate::connector::SubtaskInfo;
use crate::error::{JobError, Result};
use crate::kits::{TwoPhaseSink, TwoPhaseWriter};
use crate::record::Batch;
use async_trait::async_trait;
use lockgate_state::durable;
use lockgate_state::CheckpointId;
use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use tracing::warn;

/// The extensions a part file's name may end with, one per format.
pub(super) const FORMAT_EXTENSIONS: [&str; 2] = ["", PARQUET_EXTENSION];

/// The prefix of an in-progress file's name in a directory (then its token).
const IN_PROGRESS: &str = ".inprogress-";

/// The file sink: its writer on the two-phase-commit kit.
pub type FileSink = TwoPhaseSink<FileWriter>;

impl FileSink {
    /// The sink as the runtime takes it: exactly-once, one process only (its part
    /// files are named per subtask of one process).
    pub fn spec(cfg: FileSinkConfig) -> crate::connector::SinkSpec {
        crate::connector::SinkSpec::new(KIND, move |_| {
            let policy = (cfg.on_item_error.clone(), cfg.dead_letters.clone());
            match &cfg.store {
                Some(location) => Box::new(
                    TwoPhaseSink::new(StoreWriter::new(cfg.clone(), location.clone()))
                        .on_item_error(policy.0, policy.1),
                ),
                None => Box::new(
                    TwoPhaseSink::new(FileWriter::new(cfg.clone()))
                        .on_item_error(policy.0, policy.1),
                ),
            }
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

/// The folders of a directory that a restore looks into: partition folders
/// (`name=value`), not the sink's own (`.rolled-back`) nor anything readers skip.
pub(super) fn partition_folder(name: &str) -> bool {
    super::partition::valid_folder(name) && !name.is_empty()
}

/// The folder `folder` of the sink's directory `dir` (`dir` itself when empty).
fn folder_path(dir: &Path, folder: &str) -> PathBuf {
    match folder {
        "" => dir.to_path_buf(),
        f => dir.join(f),
    }
}

/// The in-progress file named by `token` in `folder` of the sink's directory `dir`.
fn in_progress_path(dir: &Path, folder: &str, token: &str) -> PathBuf {
    folder_path(dir, folder).join(format!("{IN_PROGRESS}{token}"))
}

/// Opens the in-progress file named by `token` in `folder` of the sink's directory
/// `dir`, creating the folder; the directories whose entries it changes go into
/// `dirty` (made durable at the barrier).
fn create(
    dir: &Path,
    dirty: &mut BTreeSet<PathBuf>,
    folder: &str,
    token: &str,
) -> std::result::Result<BufWriter<File>, String> {
    let at = folder_path(dir, folder);
    if !at.exists() {
        fs::create_dir_all(&at).map_err(|e| format!("create {}: {e}", at.display()))?;
    }
    // Also when the folder was there: another subtask may have created it and make
    // its entries durable only at its own barrier, after this one's checkpoint.
    let mut d = at.as_path();
    while let Some(parent) = d.parent().filter(|_| d != dir) {
        dirty.insert(parent.to_path_buf());
        d = parent;
    }
    dirty.insert(at);
    let path = in_progress_path(dir, folder, token);
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .map_err(|e| format!("create {}: {e}", path.display()))?;
    Ok(BufWriter::with_capacity(1 << 20, f))
}

/// The file sink's writer: part files written in progress, committed by rename.
pub struct FileWriter {
    cfg: FileSinkConfig,
    index: u16,
    parallelism: u16,
    name: String,
    parts: OpenParts<BufWriter<File>>,
    /// The files closed since the last barrier (by `roll_bytes`), in order.
    closed: Vec<StagedFile>,
    /// The directories whose entries changed since the last barrier: fsynced at it.
    dirty: BTreeSet<PathBuf>,
    /// Where [`TwoPhaseWriter::check_batch`] placed the batch `write` gets next.
    placed: Checked,
}

impl FileWriter {
    /// A subtask's writer into `cfg.dir`.
    pub fn new(cfg: FileSinkConfig) -> FileWriter {
        FileWriter {
            cfg,
            index: 0,
            parallelism: 1,
            name: String::new(),
            parts: OpenParts::new(writer_name()),
            closed: Vec::new(),
            dirty: BTreeSet::new(),
            placed: Checked::default(),
        }
    }

    fn err(&self, what: &str, path: &Path, e: impl std::fmt::Display) -> JobError {
        JobError::task(&self.name, format!("{what} {}: {e}", path.display()))
    }

    /// Whether files of (old) subtask `subtask` are this subtask's to clean and commit.
    fn mine(&self, subtask: u16) -> bool {
        subtask % self.parallelism.max(1) == self.index
    }

    fn folder_path(&self, folder: &str) -> PathBuf {
        folder_path(&self.cfg.dir, folder)
    }

    fn in_progress_path(&self, folder: &str, token: &str) -> PathBuf {
        in_progress_path(&self.cfg.dir, folder, token)
    }

    fn committed_path_as(&self, subtask: u16, id: CheckpointId, ext: &str) -> PathBuf {
        self.cfg.dir.join(committed_name(subtask, id, 0, ext))
    }

    fn pending_path_as(&self, subtask: u16, id: CheckpointId, ext: &str) -> PathBuf {
        self.cfg.dir.join(format!(".part-{subtask}-{}{ext}", id.0))
    }

    /// Creates the directory's marker, holding the job's name. Subtasks of one job may
    /// race here: the first creates it, the others find it.
    fn mark(&self, job: &str) -> Result<()> {
        let marker = self.cfg.dir.join(MARKER);
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&marker)
        {
            Ok(mut f) => {
                use std::io::Write;
                f.write_all(job.as_bytes())
                    .and_then(|_| f.sync_all())
                    .map_err(|e| self.err("write", &marker, e))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(self.err("create", &marker, e)),
        }
        durable::fsync_dir(&self.cfg.dir).map_err(|e| self.err("fsync", &self.cfg.dir, e))
    }

    /// Moves a committed part aside into `.rolled-back/` (its folder kept; `.<n>`
    /// appended when the name is taken).
    fn roll_back(&self, folder: &str, name: &str) -> Result<()> {
        let aside = match folder {
            "" => self.cfg.dir.join(ROLLED_BACK),
            f => self.cfg.dir.join(ROLLED_BACK).join(f),
        };
        if !aside.exists() {
            fs::create_dir_all(&aside).map_err(|e| self.err("create", &aside, e))?;
            // The new folders' entries are durable before a part is moved into them:
            // a power loss must not leave the moved part in no folder.
            let mut d = aside.as_path();
            while let Some(parent) = d.parent().filter(|_| d != self.cfg.dir) {
                durable::fsync_dir(parent).map_err(|e| self.err("fsync", parent, e))?;
                d = parent;
            }
        }
        let mut target = aside.join(name);
        let mut n = 1;
        while target.exists() {
            target = aside.join(format!("{name}.{n}"));
            n += 1;
        }
        let from = self.folder_path(folder).join(name);
        durable::rename_durable(&from, &target).map_err(|e| self.err("roll back", &from, e))?;
        warn!(file = %from.display(), moved_to = %target.display(), "rolled back part file committed after the restored checkpoint: its records are written again");
        Ok(())
    }

    /// Writes the records of group `g` of `batch` into the part open in its folder,
    /// opening one when there is none; whether that part is now full (`roll_bytes`).
    fn write_group(&mut self, batch: &Batch, g: &Group) -> Result<bool> {
        // The fields apart: the part is borrowed from `parts` while a new one's file
        // is made in `cfg.dir` and its folders noted in `dirty`.
        let FileWriter {
            cfg,
            index,
            name,
            parts,
            dirty,
            ..
        } = self;
        let (cfg, name) = (&*cfg, name.as_str());
        let o = parts
            .get_or_open(&g.folder, *index, |token| {
                OpenPart::new(&cfg.format, create(&cfg.dir, dirty, &g.folder, token)?)
            })
            .map_err(|e| JobError::task(name, e))?;
        o.part
            .write(records(batch, g), g.records.len(), g.rows.as_ref())
            .map_err(|e| {
                let path = in_progress_path(&cfg.dir, &o.folder, &o.token);
                JobError::task(name, format!("write {}: {e}", path.display()))
            })?;
        Ok(cfg.roll_bytes.is_some_and(|r| o.part.size() >= r))
    }

    /// Ends an open part: written out and fsynced, still in progress, named by the
    /// next barrier.
    fn close(&mut self, opened: Opened<BufWriter<File>>) -> Result<()> {
        let path = self.in_progress_path(&opened.folder, &opened.token);
        let f = opened
            .part
            .finish()
            .and_then(|out| out.into_inner().map_err(|e| e.error().to_string()))
            .map_err(|e| self.err("flush", &path, e))?;
        f.sync_all().map_err(|e| self.err("fsync", &path, e))?;
        self.closed.push(StagedFile {
            folder: opened.folder,
            token: opened.token,
            ext: self.cfg.format.extension().to_string(),
        });
        Ok(())
    }

    /// Commits a part staged before partitions and rolls (`.part-<subtask>-<id>`).
    fn commit_part(&self, p: &Part) -> Result<()> {
        // The part's format is the one its file has (a restore may come with another).
        let ext = FORMAT_EXTENSIONS
            .into_iter()
            .find(|ext| self.pending_path_as(p.subtask, p.id, ext).exists())
            .or_else(|| {
                FORMAT_EXTENSIONS
                    .into_iter()
                    .find(|ext| self.committed_path_as(p.subtask, p.id, ext).exists())
            })
            .unwrap_or(self.cfg.format.extension());
        let from = self.pending_path_as(p.subtask, p.id, ext);
        let to = self.committed_path_as(p.subtask, p.id, ext);
        self.commit_file(&from, &to)
    }

    /// Renames `from` (staged) to `to`, or finds `to` there (committed before).
    fn commit_file(&self, from: &Path, to: &Path) -> Result<()> {
        if from.exists() {
            durable::rename_durable(from, to).map_err(|e| self.err("commit", from, e))?;
        } else if !to.exists() {
            // A checkpoint named this file as durable: its absence is lost data.
            return Err(self.err(
                "commit",
                from,
                "the part file named by the checkpoint is missing (neither staged nor committed)",
            ));
        }
        Ok(())
    }

    /// The files of the sink's directory and its partition folders: `(folder, name)`.
    fn listing(&self) -> Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        let mut folders = vec![String::new()];
        while let Some(folder) = folders.pop() {
            let dir = self.folder_path(&folder);
            let rd = fs::read_dir(&dir).map_err(|e| self.err("list", &dir, e))?;
            for entry in rd {
                let entry = entry.map_err(|e| self.err("list", &dir, e))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
                if is_dir {
                    if partition_folder(&name) {
                        folders.push(match folder.as_str() {
                            "" => name,
                            f => format!("{f}/{name}"),
                        });
                    }
                } else {
                    out.push((folder.clone(), name));
                }
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl TwoPhaseWriter for FileWriter {
    type Committable = Staged;

    fn kind(&self) -> &'static str {
        "file sink"
    }

    /// A part is committed by the subtask that wrote it (modulo the parallelism),
    /// whichever state named it.
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
        restored: Option<CheckpointId>,
        to_commit: &[Staged],
    ) -> Result<()> {
        self.index = info.index;
        self.parallelism = info.parallelism;
        self.name = info.name.clone();
        self.parts = OpenParts::new(writer_name());
        fs::create_dir_all(&self.cfg.dir).map_err(|e| self.err("create", &self.cfg.dir, e))?;
        let marker = self.cfg.dir.join(MARKER);
        let marked = marker.exists();
        if marked {
            let owner = fs::read_to_string(&marker).map_err(|e| self.err("read", &marker, e))?;
            if let Some(why) = super::names::other_job(&owner, &info.job) {
                return Err(JobError::Unrecoverable {
                    task: self.name.clone(),
                    message: format!("{}: {why}", self.cfg.dir.display()),
                });
            }
        }
        if let Some(k) = restored {
            let holds_parts = fs::read_dir(&self.cfg.dir)
                .map_err(|e| self.err("list", &self.cfg.dir, e))?
                .filter_map(|e| e.ok())
                .any(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    parse_part_name(&n).is_some() || n == ROLLED_BACK || partition_folder(&n)
                });
            let named: Vec<String> = to_commit
                .iter()
                .flat_map(|s| match s {
                    Staged::Part(p) => vec![self
                        .pending_path_as(p.subtask, p.id, self.cfg.format.extension())
                        .display()
                        .to_string()],
                    Staged::Files { files, .. } => files
                        .iter()
                        .map(|f| {
                            self.in_progress_path(&f.folder, &f.token)
                                .display()
                                .to_string()
                        })
                        .collect(),
                })
                .collect();
            if let Some(why) = foreign_directory(k, marked, holds_parts, &named) {
                return Err(JobError::Unrecoverable {
                    task: self.name.clone(),
                    message: format!("{}: {why}", self.cfg.dir.display()),
                });
            }
        }
        if !marked {
            self.mark(&info.job)?;
        }
        Ok(())
    }

    fn check_batch(&mut self, batch: &Batch) -> Vec<(usize, String)> {
        self.placed.check(&self.cfg, batch)
    }

    async fn write(&mut self, batch: &Batch) -> Result<()> {
        let placed = self.placed.take(&self.cfg, batch);
        for g in &placed.groups {
            if self.write_group(batch, g)? {
                let opened = self.parts.take(&g.folder).expect("open above");
                self.close(opened)?;
            }
        }
        // Each open part is a file descriptor: many folders at once must not run out.
        for folder in parts_over_count(&self.parts.sizes(), MAX_OPEN_FILES) {
            let opened = self.parts.take(&folder).expect("listed above");
            self.close(opened)?;
        }
        Ok(())
    }

    fn buffered_bytes(&self) -> usize {
        self.parts.in_progress_size()
    }

    /// Ends the Parquet row groups held in memory (written into the in-progress files).
    async fn flush(&mut self) -> Result<()> {
        for o in self.parts.iter_mut() {
            o.part
                .flush_rows()
                .map_err(|e| JobError::task(&self.name, format!("write {}: {e}", o.token)))?;
        }
        Ok(())
    }

    async fn prepare_commit(&mut self, id: CheckpointId) -> Result<Option<Staged>> {
        for opened in self.parts.take_all() {
            self.close(opened)?;
        }
        // The files' entries (and new folders') are durable before the checkpoint that
        // names them can complete.
        for dir in std::mem::take(&mut self.dirty).into_iter().rev() {
            durable::fsync_dir(&dir).map_err(|e| self.err("fsync", &dir, e))?;
        }
        let files = std::mem::take(&mut self.closed);
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
        let (subtask, id, files) = match s {
            Staged::Part(p) => return self.commit_part(p),
            Staged::Files { subtask, id, files } => (*subtask, *id, files),
        };
        for (n, f) in files.iter().enumerate() {
            if n > 0 {
                crate::fault::hit("between-file-commits");
            }
            let from = self.in_progress_path(&f.folder, &f.token);
            let to = self
                .folder_path(&f.folder)
                .join(committed_name(subtask, id, n, &f.ext));
            self.commit_file(&from, &to)?;
        }
        Ok(())
    }

    async fn abort_abandoned(
        &mut self,
        restored: Option<CheckpointId>,
        named: &[Staged],
    ) -> Result<()> {
        let named = Named::of(named);
        let mut touched = BTreeSet::new();
        for (folder, name) in self.listing()? {
            let Some(part) = parse_part_name(&name) else {
                continue;
            };
            if !self.mine(part_subtask(part)) {
                continue;
            }
            let is_named = named.names(&folder, part, name.strip_prefix(IN_PROGRESS));
            match restore_action(part, restored, is_named) {
                RestoreAction::Keep | RestoreAction::Commit => {}
                RestoreAction::RollBack => self.roll_back(&folder, &name)?,
                RestoreAction::Remove => {
                    let p = self.folder_path(&folder).join(&name);
                    fs::remove_file(&p).map_err(|e| self.err("remove", &p, e))?;
                }
            }
            touched.insert(self.folder_path(&folder));
        }
        touched.insert(self.cfg.dir.clone());
        for dir in touched {
            durable::fsync_dir(&dir).map_err(|e| self.err("fsync", &dir, e))?;
        }
        Ok(())
    }

    async fn close(&mut self) -> Result<()> {
        // Records after the final checkpoint cannot exist; an empty leftover can.
        for opened in self.parts.take_all() {
            let _ = fs::remove_file(self.in_progress_path(&opened.folder, &opened.token));
        }
        for f in std::mem::take(&mut self.closed) {
            let _ = fs::remove_file(self.in_progress_path(&f.folder, &f.token));
        }
        Ok(())
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::connector::{Sink, SinkRestore};
    use serde::Serialize;

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
        FileSink::new(FileWriter::new(FileSinkConfig::json(dir.to_path_buf())))
    }

    fn batch(values: &[&str]) -> Batch {
        values
            .iter()
            .map(|v| Record::from_value(v.as_bytes().to_vec()))
            .collect()
    }

    /// The sink's directory listing, sorted, with the files of folders and
    /// `.rolled-back` as `folder/x`, and in-progress names without their writer
    /// (`.inprogress-<subtask>-<n>`).
    fn listing(dir: &Path) -> Vec<String> {
        fn walk(dir: &Path, at: &str, out: &mut Vec<String>) {
            for e in fs::read_dir(dir).unwrap() {
                let e = e.unwrap();
                let name = e.file_name().to_string_lossy().into_owned();
                let shown = match name.strip_prefix(IN_PROGRESS) {
                    Some(token) => match token.splitn(3, '-').collect::<Vec<_>>()[..] {
                        [s, _, n] => format!("{IN_PROGRESS}{s}-{n}"),
                        _ => name.clone(),
                    },
                    None => name.clone(),
                };
                let path = format!("{at}{shown}");
                if e.file_type().unwrap().is_dir() {
                    walk(&e.path(), &format!("{path}/"), out);
                } else if name != MARKER {
                    out.push(path);
                }
            }
        }
        let mut out = Vec::new();
        walk(dir, "", &mut out);
        out.sort();
        out
    }

    /// The file at `listed` (a [`listing`] name: an in-progress one found by its
    /// subtask and number).
    fn read(dir: &Path, listed: &str) -> String {
        let (folder, name) = listed.rsplit_once('/').unwrap_or(("", listed));
        let d = dir.join(folder);
        let path = match name.strip_prefix(IN_PROGRESS) {
            Some(sn) => {
                let (s, n) = sn.split_once('-').unwrap();
                fs::read_dir(&d)
                    .unwrap()
                    .map(|e| e.unwrap().path())
                    .find(|p| {
                        let f = p.file_name().unwrap().to_string_lossy().into_owned();
                        f.starts_with(&format!("{IN_PROGRESS}{s}-"))
                            && f.ends_with(&format!("-{n}"))
                    })
                    .unwrap()
            }
            None => d.join(name),
        };
        fs::read_to_string(path).unwrap()
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
        assert_eq!(listing(tmp.path()), vec![".inprogress-0-1"]);
        assert_eq!(read(tmp.path(), ".inprogress-0-1"), "a\nb\n");
        s.invoke(batch(&["c"])).await.unwrap();
        assert_eq!(
            listing(tmp.path()),
            vec![".inprogress-0-1", ".inprogress-0-2"]
        );
        s.snapshot(CheckpointId(2)).await.unwrap();
        s.invoke(batch(&["d"])).await.unwrap();
        s.snapshot(CheckpointId(3)).await.unwrap();
        // The notify of 1 was lost: 2 commits everything up to 2, nothing after.
        s.notify_checkpoint_complete(CheckpointId(2)).await.unwrap();
        assert_eq!(
            listing(tmp.path()),
            vec![".inprogress-0-3", "part-0-1", "part-0-2"]
        );
        assert_eq!(read(tmp.path(), "part-0-2"), "c\n");
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

    fn partitioned(dir: &Path, template: &str, roll: Option<u64>) -> FileSink {
        let mut cfg = FileSinkConfig::json(dir.to_path_buf());
        cfg.partition =
            Some(super::super::partition::PartitionTemplate::parse(template, None).unwrap());
        cfg.roll_bytes = roll;
        FileSink::new(FileWriter::new(cfg))
    }

    #[tokio::test]
    async fn a_part_rolls_at_roll_bytes_and_its_files_commit_in_order() {
        let tmp = tempfile::tempdir().unwrap();
        let mut cfg = FileSinkConfig::json(tmp.path().to_path_buf());
        cfg.roll_bytes = Some(4);
        let mut s = FileSink::new(FileWriter::new(cfg));
        s.open(&info(0, 1), &fresh()).await.unwrap();
        // "ab\n" is 3 bytes: the part rolls after the second batch.
        s.invoke(batch(&["ab"])).await.unwrap();
        s.invoke(batch(&["cd"])).await.unwrap();
        s.invoke(batch(&["ef"])).await.unwrap();
        assert_eq!(
            listing(tmp.path()),
            vec![".inprogress-0-1", ".inprogress-0-2"]
        );
        s.snapshot(CheckpointId(7)).await.unwrap();
        s.notify_checkpoint_complete(CheckpointId(7)).await.unwrap();
        assert_eq!(listing(tmp.path()), vec!["part-0-7", "part-0-7-1"]);
        assert_eq!(read(tmp.path(), "part-0-7"), "ab\ncd\n");
        assert_eq!(read(tmp.path(), "part-0-7-1"), "ef\n");
    }

    #[tokio::test]
    async fn records_go_to_their_partition_folders() {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = partitioned(tmp.path(), "c={/c}/k={/k}", None);
        s.open(&info(0, 1), &fresh()).await.unwrap();
        s.invoke(batch(&[
            r#"{"c":"DE","k":1}"#,
            r#"{"c":"a/b","k":1}"#,
            r#"{"c":"DE","k":1}"#,
            r#"{"k":2}"#,
        ]))
        .await
        .unwrap();
        s.snapshot(CheckpointId(1)).await.unwrap();
        s.notify_checkpoint_complete(CheckpointId(1)).await.unwrap();
        assert_eq!(
            listing(tmp.path()),
            vec![
                "c=DE/k=1/part-0-1",
                "c=__HIVE_DEFAULT_PARTITION__/k=2/part-0-1-2",
                "c=a%2Fb/k=1/part-0-1-1",
            ]
        );
        assert_eq!(
            read(tmp.path(), "c=DE/k=1/part-0-1"),
            "{\"c\":\"DE\",\"k\":1}\n{\"c\":\"DE\",\"k\":1}\n"
        );
    }

    #[tokio::test]
    async fn a_restore_commits_named_files_in_folders_and_cleans_the_rest() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        // Checkpoint 1 committed; checkpoint 2 staged (named by the state taken at 2);
        // checkpoint 3 staged and then committed, but the restore is from 2; work
        // after 3 in progress.
        let mut s = partitioned(d, "c={/c}", Some(1 << 20));
        s.open(&info(0, 1), &fresh()).await.unwrap();
        s.invoke(batch(&[r#"{"c":"x","n":1}"#])).await.unwrap();
        s.snapshot(CheckpointId(1)).await.unwrap();
        s.notify_checkpoint_complete(CheckpointId(1)).await.unwrap();
        s.invoke(batch(&[r#"{"c":"x","n":2}"#, r#"{"c":"y","n":2}"#]))
            .await
            .unwrap();
        let at_2 = s.snapshot(CheckpointId(2)).await.unwrap();
        s.invoke(batch(&[r#"{"c":"y","n":3}"#])).await.unwrap();
        s.snapshot(CheckpointId(3)).await.unwrap();
        s.notify_checkpoint_complete(CheckpointId(3)).await.unwrap();
        s.invoke(batch(&[r#"{"c":"z","n":4}"#])).await.unwrap();
        assert_eq!(
            listing(d),
            vec![
                "c=x/part-0-1",
                "c=x/part-0-2",
                "c=y/part-0-2-1",
                "c=y/part-0-3",
                "c=z/.inprogress-0-5",
            ]
        );
        drop(s);
        // Restore from 2 as if 3's commits had not happened yet for checkpoint 2:
        // take checkpoint 2's files back to in progress first.
        let restored = SinkRestore {
            checkpoint: Some(CheckpointId(2)),
            states: vec![(0, at_2)],
            parallelism: 1,
        };
        let mut s = partitioned(d, "c={/c}", Some(1 << 20));
        s.open(&info(0, 1), &restored).await.unwrap();
        assert_eq!(
            listing(d),
            vec![
                ".rolled-back/c=y/part-0-3",
                "c=x/part-0-1",
                "c=x/part-0-2",
                "c=y/part-0-2-1",
            ],
            "2's files committed (again: found committed), 3's rolled back, 4's removed"
        );
        assert_eq!(read(d, "c=y/part-0-2-1"), "{\"c\":\"y\",\"n\":2}\n");
    }

    #[tokio::test]
    async fn many_folders_at_once_keep_at_most_the_open_file_bound() {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = partitioned(tmp.path(), "c={/c}", None);
        s.open(&info(0, 1), &fresh()).await.unwrap();
        let n = MAX_OPEN_FILES + 10;
        let values: Vec<String> = (0..n).map(|i| format!(r#"{{"c":{i}}}"#)).collect();
        let refs: Vec<&str> = values.iter().map(String::as_str).collect();
        s.invoke(batch(&refs)).await.unwrap();
        assert!(s.writer().parts.sizes().len() <= MAX_OPEN_FILES);
        s.invoke(batch(&refs)).await.unwrap();
        s.snapshot(CheckpointId(1)).await.unwrap();
        s.notify_checkpoint_complete(CheckpointId(1)).await.unwrap();
        let files = listing(tmp.path());
        assert!(
            files.len() > n,
            "closed early, reopened later: {} files",
            files.len()
        );
        let lines: usize = files
            .iter()
            .map(|f| read(tmp.path(), f).lines().count())
            .sum();
        assert_eq!(lines, 2 * n, "every record once");
    }

    #[tokio::test]
    async fn a_restore_commits_in_progress_files_its_checkpoint_names() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let mut s = partitioned(d, "c={/c}", None);
        s.open(&info(0, 1), &fresh()).await.unwrap();
        s.invoke(batch(&[r#"{"c":"x"}"#, r#"{"c":"y"}"#]))
            .await
            .unwrap();
        let at_1 = s.snapshot(CheckpointId(1)).await.unwrap();
        s.invoke(batch(&[r#"{"c":"x"}"#])).await.unwrap();
        s.snapshot(CheckpointId(2)).await.unwrap();
        // A crash before either notify.
        drop(s);
        let restored = SinkRestore {
            checkpoint: Some(CheckpointId(1)),
            states: vec![(0, at_1)],
            parallelism: 1,
        };
        partitioned(d, "c={/c}", None)
            .open(&info(0, 1), &restored)
            .await
            .unwrap();
        assert_eq!(listing(d), vec!["c=x/part-0-1", "c=y/part-0-1-1"]);
    }

    #[tokio::test]
    async fn a_directory_another_job_writes_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let open = |job: &str| {
            let info = SubtaskInfo::new(job, "sink-0", 0, 1);
            let mut s = sink(tmp.path());
            async move { s.open(&info, &fresh()).await }
        };
        open("orders").await.unwrap();
        assert_eq!(
            fs::read_to_string(tmp.path().join(MARKER)).unwrap(),
            "orders"
        );
        open("orders").await.unwrap();
        let err = open("billing").await.unwrap_err().to_string();
        assert!(
            err.contains("`orders`") && err.contains("`billing`"),
            "{err}"
        );
        // A marker of a lockgate before job names is empty: any job goes on.
        fs::write(tmp.path().join(MARKER), "").unwrap();
        open("billing").await.unwrap();
    }

    #[tokio::test]
    async fn a_checkpoint_naming_a_folder_of_any_value_restores() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let mut s = partitioned(d, "c={/c}", None);
        s.open(&info(0, 1), &fresh()).await.unwrap();
        // U+0085 (a control beyond ASCII) is no character Hive escapes.
        s.invoke(batch(&["{\"c\":\"a\\u0085b\"}"])).await.unwrap();
        let at_1 = s.snapshot(CheckpointId(1)).await.unwrap();
        drop(s);
        let restored = SinkRestore {
            checkpoint: Some(CheckpointId(1)),
            states: vec![(0, at_1)],
            parallelism: 1,
        };
        partitioned(d, "c={/c}", None)
            .open(&info(0, 1), &restored)
            .await
            .unwrap();
        assert_eq!(listing(d), vec!["c=a\u{85}b/part-0-1"]);
    }

    #[tokio::test]
    async fn a_folder_another_subtask_created_is_made_durable_by_each_writer_in_it() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let mut sinks = Vec::new();
        for index in 0..2 {
            let mut s = partitioned(d, "c={/c}/k={/k}", None);
            s.open(&info(index, 2), &fresh()).await.unwrap();
            sinks.push(s);
        }
        // Subtask 0 creates the folders (and will fsync their entries at its barrier,
        // which may come after subtask 1's); subtask 1 finds them there.
        sinks[0]
            .invoke(batch(&[r#"{"c":"x","k":1}"#]))
            .await
            .unwrap();
        sinks[1]
            .invoke(batch(&[r#"{"c":"x","k":1}"#]))
            .await
            .unwrap();
        let dirty = &sinks[1].writer().dirty;
        for dir in [d.to_path_buf(), d.join("c=x"), d.join("c=x/k=1")] {
            assert!(dirty.contains(&dir), "{} in {dirty:?}", dir.display());
        }
    }

    #[tokio::test]
    async fn a_crafted_state_cannot_name_a_file_outside_the_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let bad = super::super::names::encode_staged(vec![Staged::Files {
            subtask: 0,
            id: CheckpointId(1),
            files: vec![StagedFile {
                folder: "../elsewhere".into(),
                token: "0-ab-1".into(),
                ext: String::new(),
            }],
        }])
        .unwrap();
        let restored = SinkRestore {
            checkpoint: Some(CheckpointId(1)),
            states: vec![(0, bad)],
            parallelism: 1,
        };
        let err = sink(tmp.path())
            .open(&info(0, 1), &restored)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("not one the sink makes"), "{err}");
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
}
