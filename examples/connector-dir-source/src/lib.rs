//! A lockgate source written only against the public connector contract: a directory
//! of newline-delimited files. Each file is a split (stream = the file's name, split
//! 0), its position the byte offset of the next line; bounded, it reads the lines
//! each file had at the job's first start, otherwise it watches for lines and files.
//! Files are read on a thread of their own (the fetcher kit): `poll` never blocks.
//!
//! ```toml
//! [source.dir]
//! path = "in"           # relative to the job file
//! bounded = true        # default false: watch
//! discovery_ms = 1000   # how often a watching source looks for new files
//! ```

use lockgate::connector::*;
use lockgate::kits::fetcher::{Emitted, Fetcher, Handover, Positioned, Reader};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;

/// The name of the source in job files (`[source.dir]`) and in the job graph.
pub const KIND: &str = "dir";

/// `[source.dir]` as written in a job file, and the source's settings.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirSection {
    pub path: PathBuf,
    #[serde(default)]
    pub bounded: bool,
    #[serde(default = "default_discovery_ms")]
    pub discovery_ms: u64,
}

fn default_discovery_ms() -> u64 {
    1000
}

impl SourceSection for DirSection {
    fn prepare(mut self, cx: &SectionContext) -> Result<PreparedSource, KeyError> {
        if self.discovery_ms == 0 {
            return Err(KeyError::new("discovery_ms", "must be at least 1"));
        }
        self.path = cx.resolve(&self.path);
        let cfg = self.clone();
        Ok(PreparedSource {
            facts: SourceFacts::json(KIND),
            config: Arc::new(self),
            build: Box::new(move |_| DirSource::spec(cfg)),
        })
    }
}

/// One file being read.
struct FileSplit {
    name: String,
    reader: BufReader<std::fs::File>,
    /// The byte offset of the first line not yet read.
    next: u64,
    /// Bytes of a line whose end has not been written yet.
    partial: Vec<u8>,
    /// Bounded: after the file's last complete line at the job's first start.
    end: Option<u64>,
}

impl FileSplit {
    fn position(&self) -> SourcePosition {
        SourcePosition::new(&self.name, 0, NextOffset(self.next as i64))
            .with_end(self.end.map(|e| NextOffset(e as i64)))
    }
}

/// A subtask of the directory source. Files are read on a thread of their own (the
/// fetcher kit), so that `poll` never blocks on a disk: it takes what the thread read.
pub struct DirSource {
    cfg: DirSection,
    fetcher: Option<Fetcher<Positioned>>,
    /// The positions of the lines handed to the job: what a checkpoint holds.
    emitted: Emitted,
    finished: bool,
}

impl DirSource {
    /// The source as the runtime takes it: files are assigned by the default rule
    /// (a hash of the name), new files are discovered unless bounded.
    pub fn spec(cfg: DirSection) -> SourceSpec {
        let caps = SourceCaps {
            bounded: cfg.bounded,
            discovers_splits: !cfg.bounded,
        };
        SourceSpec::new(KIND, move |_| {
            Box::new(DirSource {
                cfg: cfg.clone(),
                fetcher: None,
                emitted: Emitted::default(),
                finished: false,
            })
        })
        .with_caps(caps)
    }
}

/// The reading side of a subtask: its files, read on the fetcher's thread.
struct DirReader {
    cfg: DirSection,
    info: SubtaskInfo,
    splits: Vec<FileSplit>,
    last_listing: std::time::Instant,
}

impl DirReader {
    /// Opens the files this subtask reads where each starts: restored, fresh, or new
    /// since the checkpoint (from its beginning, unless the job is bounded: a bounded
    /// job reads the files of its first start).
    fn open(
        cfg: DirSection,
        info: SubtaskInfo,
        restored: Option<&[SourcePosition]>,
    ) -> Result<DirReader> {
        let mut r = DirReader {
            cfg,
            info,
            splits: Vec::new(),
            last_listing: std::time::Instant::now(),
        };
        for name in r.list()? {
            if !r.info.reads(&name, 0) {
                continue;
            }
            match split_start(restored, &name, 0) {
                SplitStart::Restored(p) => {
                    r.add(&name, p.next.0 as u64, p.end.map(|e| e.0 as u64))?
                }
                SplitStart::NotInCheckpoint if r.cfg.bounded => {}
                SplitStart::Fresh | SplitStart::NotInCheckpoint => r.add(&name, 0, None)?,
            }
        }
        Ok(r)
    }

    /// The regular files of the directory that are not hidden, sorted.
    fn list(&self) -> Result<Vec<String>> {
        let rd = std::fs::read_dir(&self.cfg.path)
            .map_err(|e| JobError::Other(format!("{}: {e}", self.cfg.path.display())))?;
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        Ok(names)
    }

    fn add(&mut self, name: &str, next: u64, end: Option<u64>) -> Result<()> {
        let path = self.cfg.path.join(name);
        let io = |e: std::io::Error| JobError::Other(format!("{}: {e}", path.display()));
        let mut f = std::fs::File::open(&path).map_err(io)?;
        let len = f.metadata().map_err(io)?.len();
        if len < next {
            return Err(JobError::Other(format!(
                "{} has {len} bytes, less than its position {next}: truncated or replaced",
                path.display()
            )));
        }
        // A bounded split ends after the last complete line it had at the first start.
        let end = match end {
            None if self.cfg.bounded => Some(last_line_end(&mut f, len).map_err(io)?),
            end => end,
        };
        f.seek(SeekFrom::Start(next)).map_err(io)?;
        let (name, reader, partial) = (name.to_string(), BufReader::new(f), Vec::new());
        self.splits.push(FileSplit {
            name,
            reader,
            next,
            partial,
            end,
        });
        Ok(())
    }

    /// Adds the files of the directory this subtask reads and does not read yet: a
    /// file absent from the restored checkpoint starts at its beginning.
    fn discover(&mut self) -> Result<()> {
        for name in self.list()? {
            if self.info.reads(&name, 0) && !self.splits.iter().any(|s| s.name == name) {
                self.add(&name, 0, None)?;
            }
        }
        self.last_listing = std::time::Instant::now();
        Ok(())
    }

    fn read_lines(&mut self) -> Result<Positioned> {
        let every = std::time::Duration::from_millis(self.cfg.discovery_ms);
        if !self.cfg.bounded && self.last_listing.elapsed() >= every {
            self.discover()?;
        }
        let mut batch = Positioned::default();
        for s in &mut self.splits {
            // Up to 1024 lines of each file per batch: a long file starves no other.
            let (mut budget, before) = (1024, s.next);
            while budget > 0 && s.end.is_none_or(|e| s.next < e) {
                budget -= 1;
                let n = s
                    .reader
                    .read_until(b'\n', &mut s.partial)
                    .map_err(|e| JobError::Other(format!("{}: {e}", s.name)))?;
                if n == 0 || s.partial.last() != Some(&b'\n') {
                    break; // the end of what is written so far
                }
                let line = std::mem::take(&mut s.partial);
                let mut record = Record::from_value(line[..line.len() - 1].to_vec());
                record.origin = Some(Origin {
                    stream: s.name.as_str().into(),
                    partition: 0,
                    offset: s.next as i64,
                });
                batch.records.push(record);
                batch.bytes += line.len();
                s.next += line.len() as u64;
            }
            if s.next > before {
                batch.positions.push(s.position());
            }
        }
        Ok(batch)
    }
}

impl Reader for DirReader {
    type Batch = Positioned;

    fn read(
        &mut self,
        wait: std::time::Duration,
    ) -> std::result::Result<Option<Positioned>, String> {
        let batch = self.read_lines().map_err(|e| e.to_string())?;
        if batch.records.is_empty() {
            std::thread::sleep(wait.min(std::time::Duration::from_millis(20)));
            return Ok(None);
        }
        Ok(Some(batch))
    }

    fn finished(&self) -> bool {
        self.cfg.bounded
            && self
                .splits
                .iter()
                .all(|s| s.end.is_some_and(|e| s.next >= e))
    }
}

#[async_trait::async_trait]
impl Source for DirSource {
    async fn open(
        &mut self,
        info: &SubtaskInfo,
        restored: Option<&[SourcePosition]>,
    ) -> Result<()> {
        // Listing and opening files blocks: done on a thread the runtime keeps for that.
        let (cfg, sub, restored) = (self.cfg.clone(), info.clone(), restored.map(<[_]>::to_vec));
        let reader =
            tokio::task::spawn_blocking(move || DirReader::open(cfg, sub, restored.as_deref()))
                .await
                .map_err(|e| JobError::Other(format!("opening the files: {e}")))??;
        self.emitted = Emitted::new(reader.splits.iter().map(FileSplit::position));
        let fetcher = Fetcher::start(&format!("dir-{}", info.index), 2, reader)
            .map_err(|e| JobError::Other(format!("cannot start the reading thread: {e}")))?;
        fetcher.report_to(info);
        self.fetcher = Some(fetcher);
        Ok(())
    }

    async fn poll(&mut self, out: &mut Batch) -> Result<SourcePoll> {
        if self.finished {
            return Ok(SourcePoll::Finished);
        }
        let fetcher = self.fetcher.as_mut().expect("opened");
        match fetcher.next(std::time::Duration::from_millis(50)).await {
            None => Ok(SourcePoll::Idle),
            Some(Handover::Batch(batch)) => {
                self.emitted.take(batch, out);
                Ok(SourcePoll::Ready)
            }
            Some(Handover::Finished) => {
                self.finished = true;
                Ok(SourcePoll::Finished)
            }
            Some(Handover::Fatal(e)) => Err(JobError::Other(e)),
        }
    }

    fn snapshot(&mut self, _id: CheckpointId) -> Result<Vec<SourcePosition>> {
        Ok(self.emitted.snapshot())
    }
}

/// The offset after the last newline in the first `len` bytes of `f`.
fn last_line_end(f: &mut std::fs::File, len: u64) -> std::io::Result<u64> {
    let (mut end, mut buf) = (len, vec![0u8; 4096]);
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        f.seek(SeekFrom::Start(start))?;
        let chunk = &mut buf[..(end - start) as usize];
        f.read_exact(chunk)?;
        if let Some(i) = chunk.iter().rposition(|b| *b == b'\n') {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}
