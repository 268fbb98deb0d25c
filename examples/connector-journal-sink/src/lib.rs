//! A lockgate sink written only against the public connector contract and the
//! two-phase kit: records appended, exactly once, to one journaled file per subtask.
//!
//! ```toml
//! [sink.journal]
//! dir = "out"   # relative to the job file
//! ```
//!
//! Subtask `i` owns `out-<i>.jsonl` (one record value per line) and its journal
//! `out-<i>.journal`: one line `<checkpoint> <start> <end>` per committed checkpoint,
//! the byte range of the output that checkpoint appended. Readers see the output up to
//! the journal's last end ([`read_committed`]); bytes after it are an append that a
//! crash cut short, and the next commit replaces them.
//!
//! At barrier `N` the records since the last barrier are fsynced in a hidden staged
//! file, `.staged-<i>-<N>`, which the committable names. When checkpoint `N`
//! completes the kit commits it: the staged bytes go at the journal's end, the output
//! is fsynced, then the journal line, and the staged file is removed. A committable
//! whose line the journal holds already is committed, so nothing is appended twice.

use lockgate::connector::*;
use lockgate::kits::{TwoPhaseSink, TwoPhaseWriter};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The name of the sink in job files (`[sink.journal]`) and in the job graph.
pub const KIND: &str = "journal";

/// `[sink.journal]` as written in a job file.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournalSection {
    pub dir: PathBuf,
}

impl SinkSection for JournalSection {
    fn prepare(mut self, cx: &SinkContext<'_>) -> Result<PreparedSink, KeyError> {
        // Refused at load, not met at the first delete: an appending sink has no
        // meaning for one.
        if let Some(step) = &cx.deletes {
            let why = format!("the journal sink only appends records; {step} sends deletes");
            return Err(KeyError::section(why));
        }
        self.dir = cx.section.resolve(&self.dir);
        let dir = self.dir.clone();
        Ok(PreparedSink {
            spec: spec(dir),
            config: Arc::new(self),
            reads_tombstones: false,
        })
    }
}

/// The sink as the runtime takes it: exactly once, in one process (its files are
/// local to the machine).
pub fn spec(dir: PathBuf) -> SinkSpec {
    SinkSpec::new(KIND, move |_| {
        Box::new(TwoPhaseSink::new(Journal::new(dir.clone())))
    })
    .with_caps(SinkCaps {
        guarantee: Guarantee::ExactlyOnce,
        needs_source_order: None,
        one_process_only: Some((
            "sink.journal".into(),
            "the journal sink writes local files: it cannot run as {members} members".into(),
        )),
        commits_are_final: false,
    })
}

/// What one barrier staged: subtask `subtask`'s records of checkpoint `checkpoint`.
/// Its serde form is kept in checkpoints.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Staged {
    pub subtask: u16,
    pub checkpoint: u64,
}

/// The writer of one subtask. File work runs on the runtime's blocking threads, so
/// that an fsync never stalls the tasks of other subtasks.
pub struct Journal {
    dir: PathBuf,
    index: u16,
    parallelism: u16,
    /// Lines written since the last barrier, not yet in the file being written.
    buffer: Vec<u8>,
    /// Whether `.writing-<i>` holds lines of the current checkpoint.
    spilled: bool,
}

/// Lines kept in memory before they go to the file being written.
const BUFFER: usize = 1 << 20;

impl Journal {
    fn new(dir: PathBuf) -> Journal {
        let (index, parallelism, buffer, spilled) = (0, 1, Vec::new(), false);
        Journal {
            dir,
            index,
            parallelism,
            buffer,
            spilled,
        }
    }

    /// Appends the buffered lines to `.writing-<i>`, the file of the checkpoint being
    /// written (created afresh by its first spill).
    async fn spill(&mut self) -> Result<()> {
        let (path, lines) = (
            self.dir.join(format!(".writing-{}", self.index)),
            std::mem::take(&mut self.buffer),
        );
        let fresh = !std::mem::replace(&mut self.spilled, true);
        blocking(move || {
            let mut f = OpenOptions::new()
                .create(true)
                .write(true)
                .append(!fresh)
                .truncate(fresh)
                .open(&path)?;
            f.write_all(&lines)
        })
        .await
    }
}

/// Runs file work on a blocking thread; an error fails the attempt, which restarts
/// from the last checkpoint.
async fn blocking(work: impl FnOnce() -> io::Result<()> + Send + 'static) -> Result<()> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| JobError::Other(e.to_string()))?
        .map_err(|e| JobError::Other(format!("journal sink: {e}")))
}

/// The committed checkpoints of `journal`, `(checkpoint, start, end)` in order; a
/// last line without its newline (a crash cut its write short) is not one.
fn entries(journal: &Path) -> io::Result<Vec<(u64, u64, u64)>> {
    let text = match fs::read_to_string(journal) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        text => text?,
    };
    let complete = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
    complete
        .lines()
        .map(|l| {
            let n: Vec<u64> = l.split(' ').filter_map(|x| x.parse().ok()).collect();
            match n[..] {
                [c, s, e] if s <= e => Ok((c, s, e)),
                _ => Err(io::Error::other(format!(
                    "{}: bad line {l:?}",
                    journal.display()
                ))),
            }
        })
        .collect()
}

/// Writes `lines` as the whole journal, durably (a temporary file renamed over it).
fn rewrite(journal: &Path, lines: &[(u64, u64, u64)]) -> io::Result<()> {
    let tmp = journal.with_extension("journal.tmp");
    let text: String = lines
        .iter()
        .map(|(c, s, e)| format!("{c} {s} {e}\n"))
        .collect();
    let mut f = File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    fs::rename(&tmp, journal)?;
    File::open(journal.parent().expect("in a directory"))?.sync_all()
}

/// Commits `c` into `dir`: appends its staged bytes at the journal's end, unless the
/// journal names it already.
fn commit(dir: &Path, c: &Staged) -> io::Result<()> {
    let (out, journal) = (
        output(dir, c.subtask),
        dir.join(format!("out-{}.journal", c.subtask)),
    );
    let done = entries(&journal)?;
    let staged = dir.join(format!(".staged-{}-{}", c.subtask, c.checkpoint));
    if done.iter().any(|(id, _, _)| *id == c.checkpoint) {
        // Committed already; a crash may have come before its staged file went.
        return match fs::remove_file(&staged) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    let bytes = fs::read(&staged).map_err(|e| {
        io::Error::other(format!(
            "{}: staged by a checkpoint, now {e}",
            staged.display()
        ))
    })?;
    let start = done.last().map_or(0, |(_, _, end)| *end);
    let mut f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .open(&out)?;
    f.set_len(start)?; // takes off an append that a crash cut short
    f.seek(SeekFrom::Start(start))?;
    f.write_all(&bytes)?;
    f.sync_all()?;
    let end = start + bytes.len() as u64;
    rewrite(&journal, &[done, vec![(c.checkpoint, start, end)]].concat())?;
    fs::remove_file(&staged)
}

fn output(dir: &Path, subtask: u16) -> PathBuf {
    dir.join(format!("out-{subtask}.jsonl"))
}

/// The subtasks whose files are in `dir` (every `out-<i>.journal` and staged file).
fn subtasks_in(dir: &Path) -> io::Result<Vec<u16>> {
    let mut found = Vec::new();
    for e in fs::read_dir(dir)? {
        let name = e?.file_name().to_string_lossy().into_owned();
        let i = name
            .strip_prefix("out-")
            .and_then(|r| r.strip_suffix(".journal"))
            .or_else(|| {
                name.strip_prefix(".staged-")
                    .and_then(|r| r.split('-').next())
            })
            .or_else(|| name.strip_prefix(".writing-"));
        found.extend(i.and_then(|i| i.parse::<u16>().ok()));
    }
    found.sort_unstable();
    found.dedup();
    Ok(found)
}

/// Takes back from the files of `subtask` in `dir` everything after `restored` (all
/// of it on a fresh start), and removes what it was writing and staged files `keep`
/// does not name.
fn take_back(dir: &Path, subtask: u16, restored: Option<u64>, keep: &[Staged]) -> io::Result<()> {
    let journal = dir.join(format!("out-{subtask}.journal"));
    let kept: Vec<_> = entries(&journal)?
        .into_iter()
        .filter(|(id, _, _)| restored.is_some_and(|k| *id <= k))
        .collect();
    rewrite(&journal, &kept)?;
    let end = kept.last().map_or(0, |(_, _, end)| *end);
    OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .open(output(dir, subtask))?
        .set_len(end)?;
    let _ = fs::remove_file(dir.join(format!(".writing-{subtask}")));
    let prefix = format!(".staged-{subtask}-");
    for e in fs::read_dir(dir)? {
        let name = e?.file_name().to_string_lossy().into_owned();
        let Some(id) = name.strip_prefix(&prefix).and_then(|i| i.parse().ok()) else {
            continue;
        };
        if !keep.contains(&Staged {
            subtask,
            checkpoint: id,
        }) {
            fs::remove_file(dir.join(&name))?;
        }
    }
    Ok(())
}

#[async_trait::async_trait]
impl TwoPhaseWriter for Journal {
    type Committable = Staged;

    fn kind(&self) -> &'static str {
        "journal sink"
    }

    /// A subtask's output stays in its own file: after a rescale, old subtask `j`'s
    /// committables are committed by subtask `j % parallelism`, the owner of its files.
    fn subtask_of(&self, c: &Staged) -> Option<u16> {
        Some(c.subtask)
    }

    async fn open(
        &mut self,
        info: &SubtaskInfo,
        _: Option<CheckpointId>,
        _: &[Staged],
    ) -> Result<()> {
        (self.index, self.parallelism) = (info.index, info.parallelism);
        let dir = self.dir.clone();
        blocking(move || fs::create_dir_all(&dir)).await
    }

    async fn write(&mut self, batch: &Batch) -> Result<()> {
        for r in batch {
            if r.tombstone || r.op == Op::Delete || r.value.contains(&b'\n') {
                let what = lockgate::record::describe(r);
                return Err(JobError::Other(format!(
                    "journal sink: {what} is not one line"
                )));
            }
            self.buffer.extend_from_slice(&r.value);
            self.buffer.push(b'\n');
        }
        if self.buffer.len() >= BUFFER {
            self.spill().await?;
        }
        Ok(())
    }

    /// Seals what was written since the last barrier: fsynced, renamed to its staged
    /// name, the directory fsynced, all before the checkpoint can complete.
    async fn prepare_commit(&mut self, id: CheckpointId) -> Result<Option<Staged>> {
        if self.buffer.is_empty() && !self.spilled {
            return Ok(None);
        }
        self.spill().await?;
        self.spilled = false;
        let c = Staged {
            subtask: self.index,
            checkpoint: id.0,
        };
        let (dir, i) = (self.dir.clone(), self.index);
        blocking(move || {
            let writing = dir.join(format!(".writing-{i}"));
            File::open(&writing)?.sync_all()?;
            fs::rename(&writing, dir.join(format!(".staged-{i}-{}", id.0)))?;
            File::open(&dir)?.sync_all()
        })
        .await?;
        Ok(Some(c))
    }

    async fn commit(&mut self, c: &Staged) -> Result<()> {
        let (dir, c) = (self.dir.clone(), c.clone());
        blocking(move || commit(&dir, &c)).await
    }

    /// Takes back what this subtask's files (and those of old subtasks it owns after a
    /// rescale) hold beyond `restored`: all of it on a fresh start, so that a fresh
    /// start over earlier output writes it once, not twice.
    async fn abort_abandoned(
        &mut self,
        restored: Option<CheckpointId>,
        named: &[Staged],
    ) -> Result<()> {
        let (dir, keep, me, n) = (
            self.dir.clone(),
            named.to_vec(),
            self.index,
            self.parallelism,
        );
        blocking(move || {
            for j in subtasks_in(&dir)?.into_iter().filter(|j| j % n == me) {
                take_back(&dir, j, restored.map(|k| k.0), &keep)?;
            }
            Ok(())
        })
        .await
    }
}

/// The committed records in `dir`, one value per line, as a reader sees them: each
/// subtask's output up to its journal's last end.
pub fn read_committed(dir: &Path) -> io::Result<Vec<Vec<u8>>> {
    let mut lines = Vec::new();
    for j in subtasks_in(dir)? {
        let end = entries(&dir.join(format!("out-{j}.journal")))?
            .last()
            .map_or(0, |e| e.2);
        if end == 0 {
            continue; // nothing committed yet (a subtask still writing its first checkpoint)
        }
        let mut text = Vec::new();
        File::open(output(dir, j))?
            .take(end)
            .read_to_end(&mut text)?;
        lines.extend(
            text.split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .map(<[u8]>::to_vec),
        );
    }
    Ok(lines)
}
