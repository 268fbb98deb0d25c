//! A lockgate source written only against the public connector contract: a directory
//! of newline-delimited files. Each file is a split (stream = the file's name, split
//! 0), its position the byte offset of the next line; bounded, it reads each file up
//! to its length at the job's first start, otherwise it watches for new lines and new
//! files.
//!
//! ```toml
//! [source.dir]
//! path = "in"           # relative to the job file
//! bounded = true        # default false: watch
//! discovery_ms = 1000   # how often a watching source looks for new files
//! ```

use lockgate::connector::*;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
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
    /// Bounded: where the file ended at the job's first start.
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
        let open = |p: &Path| -> std::io::Result<BufReader<std::fs::File>> {
            let mut f = std::fs::File::open(p)?;
            f.seek(SeekFrom::Start(next))?;
            Ok(BufReader::new(f))
        };
        let reader =
            open(&path).map_err(|e| JobError::Other(format!("{}: {e}", path.display())))?;
        self.splits.push(FileSplit {
            name: name.to_string(),
            reader,
            next,
            partial: Vec::new(),
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
            let len = std::fs::metadata(self.cfg.path.join(&name)).map_or(0, |m| m.len());
            match split_start(restored, &name, 0) {
                SplitStart::Restored(p) => {
                    let end = p.end.map(|e| e.0 as u64);
                    self.add(&name, p.next.0 as u64, end)?
                }
                // A bounded job reads the files of its first start, up to their length then.
                SplitStart::NotInCheckpoint if self.cfg.bounded => {}
                SplitStart::Fresh | SplitStart::NotInCheckpoint => {
                    self.add(&name, 0, self.cfg.bounded.then_some(len))?
                }
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
            while out.len() - before < 1024 && s.end.is_none_or(|e| s.next < e) {
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
