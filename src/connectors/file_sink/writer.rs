//! The file sink's writer on the two-phase kit: part files staged by rename, committed
//! by rename.

use super::names::{
    foreign_directory, parse_part_name, part_subtask, restore_action, Part, RestoreAction, MARKER,
    ROLLED_BACK,
};
use super::part::OpenPart;
use super::section::{FileSinkConfig, PARQUET_EXTENSION};
use super::store::StoreWriter;
use super::KIND;
use crate::connector::SubtaskInfo;
use crate::error::{JobError, Result};
use crate::kits::{TwoPhaseSink, TwoPhaseWriter};
use crate::record::Batch;
use arrow_array::RecordBatch;
use async_trait::async_trait;
use lockgate_state::durable;
use lockgate_state::CheckpointId;
use std::fs::{self, File, OpenOptions};
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use tracing::warn;

/// The extensions a part file's name may end with, one per format.
const FORMAT_EXTENSIONS: [&str; 2] = ["", PARQUET_EXTENSION];

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

/// The file sink's writer: part files staged by rename, committed by rename.
pub struct FileWriter {
    cfg: FileSinkConfig,
    index: u16,
    parallelism: u16,
    name: String,
    current: Option<(PathBuf, OpenPart<BufWriter<File>>)>,
    counter: u64,
    /// The rows [`TwoPhaseWriter::check_batch`] decoded for the `write` that follows
    /// (Parquet).
    decoded: Option<RecordBatch>,
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
            decoded: None,
        }
    }

    fn err(&self, what: &str, path: &Path, e: impl std::fmt::Display) -> JobError {
        JobError::task(&self.name, format!("{what} {}: {e}", path.display()))
    }

    /// Whether files of (old) subtask `subtask` are this subtask's to clean and commit.
    fn mine(&self, subtask: u16) -> bool {
        subtask % self.parallelism.max(1) == self.index
    }

    fn pending_path(&self, subtask: u16, id: CheckpointId) -> PathBuf {
        self.pending_path_as(subtask, id, self.cfg.format.extension())
    }

    fn committed_path_as(&self, subtask: u16, id: CheckpointId, ext: &str) -> PathBuf {
        self.cfg.dir.join(format!("part-{subtask}-{}{ext}", id.0))
    }

    fn pending_path_as(&self, subtask: u16, id: CheckpointId, ext: &str) -> PathBuf {
        self.cfg.dir.join(format!(".part-{subtask}-{}{ext}", id.0))
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

    fn check_batch(&mut self, batch: &Batch) -> Vec<(usize, String)> {
        let decoded = self.cfg.format.decode(batch);
        self.decoded = decoded.rows;
        decoded.refused
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
            let out = BufWriter::with_capacity(1 << 20, f);
            let part =
                OpenPart::new(&self.cfg.format, out).map_err(|e| self.err("create", &path, e))?;
            self.current = Some((path, part));
        }
        let decoded = self.decoded.take();
        let (path, part) = self.current.as_mut().expect("opened above");
        part.write(batch, decoded.as_ref())
            .map_err(|e| JobError::task(&self.name, format!("write {}: {e}", path.display())))
    }

    fn buffered_bytes(&self) -> usize {
        self.current
            .as_ref()
            .map_or(0, |(_, part)| part.in_progress_size())
    }

    /// Ends the Parquet row group held in memory (written into the in-progress file).
    async fn flush(&mut self) -> Result<()> {
        if let Some((path, part)) = &mut self.current {
            part.flush_rows().map_err(|e| {
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
            .finish()
            .and_then(|out| out.into_inner().map_err(|e| e.error().to_string()))
            .map_err(|e| self.err("flush", &path, e))?;
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
}
