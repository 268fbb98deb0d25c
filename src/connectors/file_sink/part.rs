//! A part file being written: its format's encoding (JSON lines or Parquet) over the
//! bytes of wherever the part goes (a local file, or memory for an object store).

use super::lines::delete_line;
use super::section::FileFormat;
use crate::record::{Batch, Op};
use arrow_array::RecordBatch;
use parquet::arrow::ArrowWriter;
use std::io::Write;

/// The part file being written since the last barrier.
pub enum OpenPart<W: Write + Send> {
    Lines(W),
    Parquet(Box<ArrowWriter<W>>),
}

impl<W: Write + Send> OpenPart<W> {
    /// A part of `format` written into `out`.
    pub fn new(format: &FileFormat, out: W) -> Result<OpenPart<W>, String> {
        Ok(match format {
            FileFormat::Json => OpenPart::Lines(out),
            FileFormat::Parquet(p) => OpenPart::Parquet(Box::new(p.writer(out)?)),
        })
    }

    /// Writes `batch`; a Parquet part takes the rows `decoded` from it
    /// ([`super::parquet::ParquetFormat::decode`] of the same records).
    pub fn write(&mut self, batch: &Batch, decoded: Option<&RecordBatch>) -> Result<(), String> {
        match self {
            OpenPart::Lines(w) => {
                for r in batch {
                    let line = if r.tombstone || r.op == Op::Delete {
                        std::borrow::Cow::Owned(delete_line(r))
                    } else {
                        std::borrow::Cow::Borrowed(&r.value[..])
                    };
                    w.write_all(&line)
                        .and_then(|_| w.write_all(b"\n"))
                        .map_err(|e| e.to_string())?;
                }
                Ok(())
            }
            OpenPart::Parquet(w) => {
                let rows = decoded.map_or(0, |d| d.num_rows());
                if rows != batch.len() {
                    // The kit calls check_batch with each batch before its write.
                    return Err(format!(
                        "{rows} decoded rows for a batch of {} records",
                        batch.len()
                    ));
                }
                match decoded {
                    Some(d) => w.write(d).map_err(|e| e.to_string()),
                    None => Ok(()),
                }
            }
        }
    }

    /// The bytes held in memory and not yet written out (a Parquet row group).
    pub fn in_progress_size(&self) -> usize {
        match self {
            OpenPart::Lines(_) => 0,
            OpenPart::Parquet(w) => w.in_progress_size(),
        }
    }

    /// Writes out what is held in memory (ends the Parquet row group).
    pub fn flush_rows(&mut self) -> Result<(), String> {
        match self {
            OpenPart::Lines(_) => Ok(()),
            OpenPart::Parquet(w) => w.flush().map_err(|e| e.to_string()),
        }
    }

    /// Ends the part (Parquet's footer) and returns where it went.
    pub fn finish(self) -> Result<W, String> {
        match self {
            OpenPart::Lines(w) => Ok(w),
            OpenPart::Parquet(w) => w.into_inner().map_err(|e| e.to_string()),
        }
    }
}
