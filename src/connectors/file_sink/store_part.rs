//! A part of a sink into an object store, held in memory until it is put: JSON lines
//! appended as they come, Parquet rows encoded off the sink's task.
//!
//! Encoding Parquet is most of what writing a part costs, and it needs nothing but
//! the rows the sink's decoding made. So the rows of a Parquet part are gathered into
//! chunks of at least [`ENCODE_ROWS`] rows, and each chunk is encoded on the blocking
//! pool while the sink goes on taking and decoding records: one chunk of a part at a
//! time, in the order written, into the part's one Parquet writer, so that the file
//! holds the same rows in the same order as if encoded in place. A part's size and
//! memory count the rows not yet encoded by their Arrow size. Closing a part
//! ([`StorePart::finish`]) waits for its chunk and encodes the rest: what is put at a
//! barrier is every row written before it. An encoding that fails fails the next call
//! on the part (the attempt then restarts from the last checkpoint, as when a write
//! fails).

use super::part::{OpenPart, PartSize};
use super::section::FileFormat;
use crate::record::Record;
use arrow_array::RecordBatch;
use parquet::arrow::ArrowWriter;
use tokio::task::JoinHandle;

/// The rows a Parquet part gathers before they are encoded: Parquet writes a batch in
/// pieces of 1024 rows, so a chunk of many pieces spends its time encoding rather than
/// starting and ending small writes.
pub const ENCODE_ROWS: usize = 8192;

/// An open part of a sink into an object store.
pub enum StorePart {
    /// JSON lines, written in place (appending text costs next to nothing).
    Lines(OpenPart<Vec<u8>>),
    /// Parquet, encoded off the sink's task.
    Parquet(Encoding),
}

impl StorePart {
    /// An empty part of `format`.
    pub fn new(format: &FileFormat) -> Result<StorePart, String> {
        Ok(match format {
            FileFormat::Parquet(p) => StorePart::Parquet(Encoding::new(p.writer(Vec::new())?)),
            _ => StorePart::Lines(OpenPart::new(format, Vec::new())?),
        })
    }

    /// Writes `records` (`count` of them); a Parquet part takes their rows `decoded`
    /// and encodes them later (at the latest when closed).
    pub async fn write<'a>(
        &mut self,
        records: impl Iterator<Item = &'a Record>,
        count: usize,
        decoded: Option<&RecordBatch>,
    ) -> Result<(), String> {
        match self {
            StorePart::Lines(part) => part.write(records, count, decoded),
            StorePart::Parquet(e) => {
                let rows = decoded.map_or(0, |d| d.num_rows());
                if rows != count {
                    // The kit calls check_batch with each batch before its write.
                    return Err(format!("{rows} decoded rows for {count} records"));
                }
                match decoded {
                    Some(d) if rows > 0 => e.push(d.clone()).await,
                    _ => Ok(()),
                }
            }
        }
    }

    /// Encodes every row written so far and waits for it: [`PartSize::size`] is then
    /// the encoder's own figure.
    pub async fn settle(&mut self) -> Result<(), String> {
        match self {
            StorePart::Lines(_) => Ok(()),
            StorePart::Parquet(e) => e.settle().await.map(|_| ()),
        }
    }

    /// Encodes every row written so far and ends the Parquet row group.
    pub async fn flush_rows(&mut self) -> Result<(), String> {
        match self {
            StorePart::Lines(_) => Ok(()),
            StorePart::Parquet(e) => e.flush_rows().await,
        }
    }

    /// Ends the part (every row encoded, Parquet's footer) and returns its bytes.
    pub async fn finish(self) -> Result<Vec<u8>, String> {
        match self {
            StorePart::Lines(part) => part.finish(),
            StorePart::Parquet(e) => e.finish().await,
        }
    }
}

impl PartSize for StorePart {
    /// What was encoded, and the rows not yet encoded by their Arrow size.
    fn size(&self) -> u64 {
        match self {
            StorePart::Lines(part) => part.size(),
            StorePart::Parquet(e) => e.written + e.unwritten() as u64,
        }
    }

    /// Everything a part of lines holds (it is all in memory, and put whole when
    /// closed); for Parquet, the row group not yet written out and the rows not yet
    /// encoded, which [`StorePart::flush_rows`] writes out.
    fn in_progress_size(&self) -> usize {
        match self {
            StorePart::Lines(part) => part.size() as usize,
            StorePart::Parquet(e) => e.unwritten(),
        }
    }
}

type Writer = Box<ArrowWriter<Vec<u8>>>;

/// The encoder of a Parquet part: the writer, here or encoding a chunk on the blocking
/// pool, and the rows gathered for the next chunk.
pub struct Encoding {
    writer: State,
    /// Rows written and not yet handed to the encoder, in order.
    gathered: Vec<RecordBatch>,
    gathered_rows: usize,
    gathered_bytes: usize,
    /// The Arrow size of the chunk being encoded.
    encoding_bytes: usize,
    /// The writer's bytes written out and its row group in memory, as last seen.
    written: u64,
    in_progress: usize,
}

enum State {
    Here(Writer),
    Encoding(JoinHandle<(Writer, Result<(), String>)>),
    /// An encoding failed (or panicked): every later call fails with it.
    Failed(String),
}

impl Encoding {
    fn new(writer: ArrowWriter<Vec<u8>>) -> Encoding {
        Encoding {
            writer: State::Here(Box::new(writer)),
            gathered: Vec::new(),
            gathered_rows: 0,
            gathered_bytes: 0,
            encoding_bytes: 0,
            written: 0,
            in_progress: 0,
        }
    }

    /// The bytes held and not written out: the row group, the chunk being encoded and
    /// the rows gathered.
    fn unwritten(&self) -> usize {
        self.in_progress + self.encoding_bytes + self.gathered_bytes
    }

    async fn push(&mut self, rows: RecordBatch) -> Result<(), String> {
        self.gathered_rows += rows.num_rows();
        self.gathered_bytes += rows.get_array_memory_size();
        self.gathered.push(rows);
        if self.gathered_rows >= ENCODE_ROWS {
            self.start().await?;
        }
        Ok(())
    }

    /// The writer, once its chunk (if any) is encoded.
    async fn here(&mut self) -> Result<&mut Writer, String> {
        if let State::Encoding(handle) = &mut self.writer {
            let done = handle.await;
            self.encoding_bytes = 0;
            self.writer = match done {
                Ok((w, Ok(()))) => {
                    self.written = w.bytes_written() as u64;
                    self.in_progress = w.in_progress_size();
                    State::Here(w)
                }
                Ok((_, Err(e))) => State::Failed(format!("encode Parquet: {e}")),
                Err(e) => State::Failed(format!("encode Parquet: {e}")),
            };
        }
        match &mut self.writer {
            State::Here(w) => Ok(w),
            State::Failed(e) => Err(e.clone()),
            State::Encoding(_) => unreachable!("awaited above"),
        }
    }

    /// Hands the gathered rows to the blocking pool, once the chunk before is done.
    async fn start(&mut self) -> Result<(), String> {
        self.here().await?;
        let State::Here(mut w) = std::mem::replace(&mut self.writer, State::Failed(String::new()))
        else {
            unreachable!("here() returned the writer");
        };
        let chunk = std::mem::take(&mut self.gathered);
        self.encoding_bytes = std::mem::take(&mut self.gathered_bytes);
        self.gathered_rows = 0;
        self.writer = State::Encoding(tokio::task::spawn_blocking(move || {
            let done = encode(&mut w, chunk);
            (w, done)
        }));
        Ok(())
    }

    /// Every row written so far encoded; the writer.
    async fn settle(&mut self) -> Result<&mut Writer, String> {
        if !self.gathered.is_empty() {
            self.start().await?;
        }
        self.here().await
    }

    async fn flush_rows(&mut self) -> Result<(), String> {
        let w = self.settle().await?;
        w.flush().map_err(|e| e.to_string())?;
        let (written, in_progress) = (w.bytes_written() as u64, w.in_progress_size());
        self.written = written;
        self.in_progress = in_progress;
        Ok(())
    }

    async fn finish(mut self) -> Result<Vec<u8>, String> {
        self.settle().await?;
        match self.writer {
            State::Here(w) => w.into_inner().map_err(|e| e.to_string()),
            State::Failed(e) => Err(e),
            State::Encoding(_) => unreachable!("settled above"),
        }
    }
}

/// Writes `chunk` into `w`, as one batch when it is several (the same rows in the same
/// order).
fn encode(w: &mut ArrowWriter<Vec<u8>>, chunk: Vec<RecordBatch>) -> Result<(), String> {
    let rows = match chunk.as_slice() {
        [] => return Ok(()),
        [one] => one.clone(),
        [first, ..] => arrow_select::concat::concat_batches(&first.schema(), &chunk)
            .map_err(|e| e.to_string())?,
    };
    w.write(&rows).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::file_sink::parquet::ParquetFormat;
    use crate::record::Batch;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::basic::Compression;

    fn format() -> FileFormat {
        let schema = crate::connectors::file_sink::avro_arrow::arrow_schema_of_text(
            r#"{"type":"record","name":"r","fields":[{"name":"n","type":"long"}]}"#,
        )
        .unwrap();
        FileFormat::Parquet(ParquetFormat {
            schema: std::sync::Arc::new(schema),
            compression: Compression::SNAPPY,
        })
    }

    fn batch(from: i64, to: i64) -> Batch {
        (from..to)
            .map(|n| Record::from_value(format!(r#"{{"n":{n}}}"#).into_bytes()))
            .collect()
    }

    async fn write(part: &mut StorePart, format: &FileFormat, b: &Batch) {
        let FileFormat::Parquet(p) = format else {
            unreachable!()
        };
        let decoded = p.decode(b);
        assert!(decoded.refused.is_empty());
        part.write(b.iter(), b.len(), decoded.rows.as_ref())
            .await
            .unwrap();
    }

    fn read(bytes: Vec<u8>) -> Vec<i64> {
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(bytes))
            .unwrap()
            .build()
            .unwrap();
        let mut out = Vec::new();
        for b in reader {
            let b = b.unwrap();
            let col = b
                .column(0)
                .as_any()
                .downcast_ref::<arrow_array::Int64Array>()
                .unwrap();
            out.extend(col.values().iter().copied());
        }
        out
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_parquet_part_holds_every_row_in_order_however_its_chunks_fell() {
        let format = format();
        let mut part = StorePart::new(&format).unwrap();
        let mut next = 0;
        // Batches of uneven sizes: chunks start past ENCODE_ROWS, mid-batch.
        for size in [1, 300, ENCODE_ROWS, 7, ENCODE_ROWS * 2 + 5, 1000] {
            write(&mut part, &format, &batch(next, next + size as i64)).await;
            next += size as i64;
        }
        assert!(part.size() > 0, "counted before it is encoded");
        part.flush_rows().await.unwrap();
        write(&mut part, &format, &batch(next, next + 10)).await;
        next += 10;
        let bytes = part.finish().await.unwrap();
        assert_eq!(read(bytes), (0..next).collect::<Vec<_>>());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn rows_not_yet_encoded_are_counted_and_settling_encodes_them() {
        let format = format();
        let mut part = StorePart::new(&format).unwrap();
        write(&mut part, &format, &batch(0, 100)).await;
        let StorePart::Parquet(e) = &part else {
            unreachable!()
        };
        assert_eq!(e.written, 0, "nothing encoded below a chunk");
        assert!(part.in_progress_size() > 0, "the gathered rows are counted");
        part.settle().await.unwrap();
        let StorePart::Parquet(e) = &part else {
            unreachable!()
        };
        assert!(e.gathered.is_empty());
        assert_eq!(
            part.in_progress_size(),
            e.in_progress,
            "the row group alone"
        );
    }

    #[tokio::test]
    async fn a_part_of_lines_counts_everything_it_holds() {
        let mut part = StorePart::new(&FileFormat::Json).unwrap();
        let b = batch(0, 3);
        part.write(b.iter(), b.len(), None).await.unwrap();
        assert_eq!(part.in_progress_size() as u64, part.size());
        assert_eq!(
            part.size(),
            b.iter().map(|r| r.value.len() as u64 + 1).sum::<u64>()
        );
    }
}
