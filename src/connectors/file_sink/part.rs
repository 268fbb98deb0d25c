//! A part file being written: its format's encoding (JSON lines or Parquet) over the
//! bytes of wherever the part goes (a local file, or memory for an object store).

use super::lines::delete_line;
use super::section::FileFormat;
use crate::record::{Op, Record};
use arrow_array::RecordBatch;
use parquet::arrow::ArrowWriter;
use std::io::Write;

/// The part file being written since the last barrier.
pub enum OpenPart<W: Write + Send> {
    /// JSON lines, and the bytes written.
    Lines(W, u64),
    Parquet(Box<ArrowWriter<W>>),
}

impl<W: Write + Send> OpenPart<W> {
    /// A part of `format` written into `out`.
    pub fn new(format: &FileFormat, out: W) -> Result<OpenPart<W>, String> {
        Ok(match format {
            FileFormat::Json => OpenPart::Lines(out, 0),
            FileFormat::Parquet(p) => OpenPart::Parquet(Box::new(p.writer(out)?)),
        })
    }

    /// Writes `records` (`count` of them); a Parquet part takes their rows `decoded`
    /// ([`crate::formats::columnar::parquet::ParquetFormat::decode`] of the same records).
    pub fn write<'a>(
        &mut self,
        records: impl Iterator<Item = &'a Record>,
        count: usize,
        decoded: Option<&RecordBatch>,
    ) -> Result<(), String> {
        match self {
            OpenPart::Lines(w, written) => {
                for r in records {
                    let line = if r.tombstone || r.op == Op::Delete {
                        std::borrow::Cow::Owned(delete_line(r))
                    } else {
                        std::borrow::Cow::Borrowed(&r.value[..])
                    };
                    w.write_all(&line)
                        .and_then(|_| w.write_all(b"\n"))
                        .map_err(|e| e.to_string())?;
                    *written += line.len() as u64 + 1;
                }
                Ok(())
            }
            OpenPart::Parquet(w) => {
                let rows = decoded.map_or(0, |d| d.num_rows());
                if rows != count {
                    // The kit calls check_batch with each batch before its write.
                    return Err(format!("{rows} decoded rows for {count} records"));
                }
                match decoded {
                    Some(d) => w.write(d).map_err(|e| e.to_string()),
                    None => Ok(()),
                }
            }
        }
    }

    /// The part's size so far: what was written out and what is held in memory.
    pub fn size(&self) -> u64 {
        match self {
            OpenPart::Lines(_, written) => *written,
            OpenPart::Parquet(w) => w.bytes_written() as u64 + w.in_progress_size() as u64,
        }
    }

    /// The bytes held in memory and not yet written out (a Parquet row group).
    pub fn in_progress_size(&self) -> usize {
        match self {
            OpenPart::Lines(..) => 0,
            OpenPart::Parquet(w) => w.in_progress_size(),
        }
    }

    /// Writes out what is held in memory (ends the Parquet row group).
    pub fn flush_rows(&mut self) -> Result<(), String> {
        match self {
            OpenPart::Lines(..) => Ok(()),
            OpenPart::Parquet(w) => w.flush().map_err(|e| e.to_string()),
        }
    }

    /// Ends the part (Parquet's footer) and returns where it went.
    pub fn finish(self) -> Result<W, String> {
        match self {
            OpenPart::Lines(w, _) => Ok(w),
            OpenPart::Parquet(w) => w.into_inner().map_err(|e| e.to_string()),
        }
    }
}

/// What [`PartsOf`] asks of a part: its size, for `roll_bytes` and the memory bound.
pub trait PartSize {
    /// The part's size so far (what `roll_bytes` is compared with).
    fn size(&self) -> u64;
    /// The bytes it holds in memory and has not written out yet.
    fn in_progress_size(&self) -> usize;
}

impl<W: Write + Send> PartSize for OpenPart<W> {
    fn size(&self) -> u64 {
        OpenPart::size(self)
    }
    fn in_progress_size(&self) -> usize {
        OpenPart::in_progress_size(self)
    }
}

/// The parts one subtask has open, one per folder, each with the token that names it
/// while in progress ([`super::names::in_progress_token`]).
pub type OpenParts<W> = PartsOf<OpenPart<W>>;

/// One open part.
pub type Opened<W> = OpenedOf<OpenPart<W>>;

/// The parts `P` one subtask has open, one per folder, each with the token that names
/// it while in progress ([`super::names::in_progress_token`]).
pub struct PartsOf<P> {
    open: Vec<OpenedOf<P>>,
    at: std::collections::HashMap<String, usize>,
    writer: String,
    counter: u64,
}

/// One open part `P`.
pub struct OpenedOf<P> {
    pub folder: String,
    pub token: String,
    pub part: P,
}

impl<P> PartsOf<P> {
    /// No part open; tokens name the writer `writer` ([`super::names::writer_name`]).
    pub fn new(writer: String) -> PartsOf<P> {
        PartsOf {
            open: Vec::new(),
            at: Default::default(),
            writer,
            counter: 0,
        }
    }

    /// The part open in `folder`, opened by `create(token)` if there is none.
    pub fn get_or_open(
        &mut self,
        folder: &str,
        subtask: u16,
        create: impl FnOnce(&str) -> Result<P, String>,
    ) -> Result<&mut OpenedOf<P>, String> {
        let i = match self.at.get(folder) {
            Some(i) => *i,
            None => {
                self.counter += 1;
                let token = super::names::in_progress_token(subtask, &self.writer, self.counter);
                let part = create(&token)?;
                self.open.push(OpenedOf {
                    folder: folder.to_string(),
                    token,
                    part,
                });
                self.at.insert(folder.to_string(), self.open.len() - 1);
                self.open.len() - 1
            }
        };
        Ok(&mut self.open[i])
    }

    /// The part open in `folder`, if any.
    pub fn get_mut(&mut self, folder: &str) -> Option<&mut OpenedOf<P>> {
        let i = *self.at.get(folder)?;
        Some(&mut self.open[i])
    }

    /// Takes the part of `folder` out (to close it).
    pub fn take(&mut self, folder: &str) -> Option<OpenedOf<P>> {
        let i = self.at.remove(folder)?;
        let opened = self.open.remove(i);
        for v in self.at.values_mut() {
            if *v > i {
                *v -= 1;
            }
        }
        Some(opened)
    }

    /// Takes every part out, in the order they were opened.
    pub fn take_all(&mut self) -> Vec<OpenedOf<P>> {
        self.at.clear();
        std::mem::take(&mut self.open)
    }

    /// The open parts.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut OpenedOf<P>> {
        self.open.iter_mut()
    }

    /// Whether no part is open.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

impl<P: PartSize> PartsOf<P> {
    /// The bytes the open parts hold in memory and have not written out.
    pub fn in_progress_size(&self) -> usize {
        self.open.iter().map(|o| o.part.in_progress_size()).sum()
    }

    /// The folders and sizes of the open parts ([`PartSize::size`]).
    pub fn sizes(&self) -> Vec<(String, u64)> {
        self.open
            .iter()
            .map(|o| (o.folder.clone(), o.part.size()))
            .collect()
    }
}

pub use crate::kits::parts::{parts_over_count, parts_to_close};

/// How many parts a subtask keeps open in a directory at most (one file each).
pub const MAX_OPEN_FILES: usize = 256;
