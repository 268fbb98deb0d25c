//! A lockgate source written only against the public connector contract: a directory
//! of newline-delimited files. Each file is a split (stream = the file's name, split
//! 0), its position the byte offset of the next line; bounded, it reads the lines
//! each file had at the job's first start, otherwise it watches for lines and files.
//!
//! ```toml
//! [source.dir]
//! path = "in"           # relative to the job file
//! bounded = true        # default false: watch
//! discovery_ms = 1000   # how often a watching source looks for new files
//! ```

use lockgate::connector::*;
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
    /// The byte offset of the first line not yet emitted.
    next: u64,
    /// Bytes of a line whose end has not been written yet.
    partial: Vec<u8>,
    /// Bounded: after the file's last complete line at the job's first start.
    end: Option<u64>,
}

/// A subtask of the directory source.
pub struct DirSource {
    cfg: DirSection,
    info: Option<SubtaskInfo>,
    splits: Vec<FileSplit>,
    last_listing: Option<std::time::Instant>,
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
                info: None,
                splits: Vec::new(),
                last_listing: None,
            })
        })
        .with_caps(caps)
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
        f.seek(SeekFrom::Start(next)).map_err(io)?;
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
        let info = self.info.clone().expect("opened");
        for name in self.list()? {
            if info.reads(&name, 0) && !self.splits.iter().any(|s| s.name == name) {
                self.add(&name, 0, None)?;
            }
        }
        self.last_listing = Some(std::time::Instant::now());
        Ok(())
    }
}

#[async_trait::async_trait]
impl Source for DirSource {
    async fn open(
        &mut self,
        info: &SubtaskInfo,
        restored: Option<&[SourcePosition]>,
    ) -> Result<()> {
        self.info = Some(info.clone());
        for name in self.list()? {
            if !info.reads(&name, 0) {
                continue;
            }
            match split_start(restored, &name, 0) {
                SplitStart::Restored(p) => {
                    self.add(&name, p.next.0 as u64, p.end.map(|e| e.0 as u64))?
                }
                // A bounded job reads the files of its first start.
                SplitStart::NotInCheckpoint if self.cfg.bounded => {}
                SplitStart::Fresh | SplitStart::NotInCheckpoint => self.add(&name, 0, None)?,
            }
        }
        self.last_listing = Some(std::time::Instant::now());
        Ok(())
    }

    async fn poll(&mut self, out: &mut Batch) -> Result<SourcePoll> {
        let every = std::time::Duration::from_millis(self.cfg.discovery_ms);
        if !self.cfg.bounded && self.last_listing.is_none_or(|t| t.elapsed() >= every) {
            self.discover()?;
        }
        let before = out.len();
        for s in &mut self.splits {
            // Up to 1024 lines of each file per poll: a long file starves no other.
            let mut budget = 1024;
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
                out.push(record);
                s.next += line.len() as u64;
            }
        }
        if self.cfg.bounded
            && self
                .splits
                .iter()
                .all(|s| s.end.is_some_and(|e| s.next >= e))
        {
            return Ok(SourcePoll::Finished);
        }
        if out.len() == before {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            return Ok(SourcePoll::Idle);
        }
        Ok(SourcePoll::Ready)
    }

    fn snapshot(&mut self, _id: CheckpointId) -> Result<Vec<SourcePosition>> {
        Ok(self
            .splits
            .iter()
            .map(|s| {
                SourcePosition::new(&s.name, 0, NextOffset(s.next as i64))
                    .with_end(s.end.map(|e| NextOffset(e as i64)))
            })
            .collect())
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
