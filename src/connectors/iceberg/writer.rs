//! A subtask of the Iceberg sink: rows into Parquet data files of the table, one open
//! file per partition, closed at each barrier (and at `roll_bytes`). A data file is
//! written whole into the table's `data/` folder when it is closed, and is invisible
//! until a snapshot names it: the subtask's state at barrier `N` names the files it
//! closed since the last barrier, and the job's committer ([`super::committer`])
//! adds them to the table once `N` completes. The subtask itself commits nothing.
//!
//! A data file's name holds a token drawn when the subtask opens, so files of an
//! attempt that crashed (never in a snapshot) are never overwritten by a later one.

use super::section::IcebergConfig;
use crate::connector::SubtaskInfo;
use crate::error::{JobError, Result};
use crate::kits::parts::parts_to_close;
use crate::kits::two_phase::TwoPhaseWriter;
use crate::record::Batch;
use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use async_trait::async_trait;
use iceberg::arrow::RecordBatchPartitionSplitter;
use iceberg::spec::{DataContentType, DataFile, PartitionKey, Struct};
use iceberg::table::Table;
use iceberg::writer::file_writer::{
    FileWriter, FileWriterBuilder, ParquetWriter, ParquetWriterBuilder,
};
use iceberg::writer::CurrentFileStatus;
use lockgate_state::CheckpointId;
use parquet::file::properties::WriterProperties;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// What a subtask staged at one barrier: its data files, each as Iceberg's JSON form
/// of a data file (path, partition, counts, column statistics).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedFiles {
    pub checkpoint: u64,
    pub subtask: u16,
    pub files: Vec<String>,
}

/// One open data file.
struct OpenFile {
    /// The partition's path (`dt=2024-05-01`), empty for an unpartitioned table.
    folder: String,
    key: Option<PartitionKey>,
    writer: ParquetWriter,
}

/// The writer of one subtask of the Iceberg sink (see the module).
pub struct IcebergWriter {
    cfg: Arc<IcebergConfig>,
    name: String,
    index: u16,
    table: Option<Table>,
    table_rows: Option<SchemaRef>,
    splitter: Option<RecordBatchPartitionSplitter>,
    /// The rows `check_batch` decoded for the `write` that follows.
    decoded: Option<RecordBatch>,
    open: Vec<OpenFile>,
    closed: Vec<DataFile>,
    token: String,
    seq: u64,
}

impl IcebergWriter {
    pub fn new(cfg: Arc<IcebergConfig>) -> IcebergWriter {
        IcebergWriter {
            cfg,
            name: String::new(),
            index: 0,
            table: None,
            table_rows: None,
            splitter: None,
            decoded: None,
            open: Vec::new(),
            closed: Vec::new(),
            token: String::new(),
            seq: 0,
        }
    }

    fn err(&self, e: impl std::fmt::Display) -> JobError {
        JobError::task(&self.name, format!("table {}: {e}", self.cfg.table))
    }

    fn table(&self) -> Result<&Table> {
        self.table
            .as_ref()
            .ok_or_else(|| self.err("the sink is not open"))
    }

    /// Opens a data file for `key`.
    async fn open_file(&mut self, folder: String, key: Option<PartitionKey>) -> Result<usize> {
        let seq = self.seq;
        self.seq += 1;
        let table = self.table()?;
        let location = table.metadata().location().trim_end_matches('/');
        let name = format!("lockgate-{}-{}-{seq}.parquet", self.index, self.token);
        let path = match folder.as_str() {
            "" => format!("{location}/data/{name}"),
            f => format!("{location}/data/{f}/{name}"),
        };
        let output = table.file_io().new_output(&path).map_err(|e| self.err(e))?;
        let props = WriterProperties::builder()
            .set_compression(self.cfg.columns.compression)
            .build();
        let schema = table.metadata().current_schema().clone();
        let writer = ParquetWriterBuilder::new(props, schema)
            .build(output)
            .await
            .map_err(|e| self.err(e))?;
        self.open.push(OpenFile {
            folder,
            key,
            writer,
        });
        Ok(self.open.len() - 1)
    }

    /// Closes the open file at `at` into the files of the next barrier.
    async fn close_file(&mut self, at: usize) -> Result<()> {
        let file = self.open.remove(at);
        let table = self.table()?;
        let spec_id = table.metadata().default_partition_spec_id();
        let builders = file.writer.close().await.map_err(|e| self.err(e))?;
        for mut b in builders {
            b.content(DataContentType::Data);
            match &file.key {
                Some(k) => b.partition(k.data().clone()),
                None => b.partition(Struct::empty()),
            };
            b.partition_spec_id(spec_id);
            let data_file = b.build().map_err(|e| self.err(e))?;
            self.closed.push(data_file);
        }
        Ok(())
    }

    async fn write_rows(
        &mut self,
        folder: String,
        key: Option<PartitionKey>,
        rows: &RecordBatch,
    ) -> Result<()> {
        let found = self.open.iter().position(|f| f.folder == folder);
        let at = match found {
            Some(at) => at,
            None => self.open_file(folder, key).await?,
        };
        let name = self.name.clone();
        let table = self.cfg.table.clone();
        let file = &mut self.open[at];
        file.writer
            .write(rows)
            .await
            .map_err(|e| JobError::task(&name, format!("table {table}: {e}")))?;
        if file.writer.current_written_size() as u64 >= self.cfg.roll_bytes {
            self.close_file(at).await?;
        }
        Ok(())
    }

    fn sizes(&self) -> Vec<(String, u64)> {
        self.open
            .iter()
            .map(|f| (f.folder.clone(), f.writer.current_written_size() as u64))
            .collect()
    }
}

/// A name for this open of the subtask: the time, in hexadecimal nanoseconds.
fn token() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{nanos:x}")
}

#[async_trait]
impl TwoPhaseWriter for IcebergWriter {
    type Committable = StagedFiles;

    fn kind(&self) -> &'static str {
        "Iceberg sink"
    }

    fn subtask_of(&self, c: &StagedFiles) -> Option<u16> {
        Some(c.subtask)
    }

    async fn open(
        &mut self,
        info: &SubtaskInfo,
        _restored: Option<CheckpointId>,
        _to_commit: &[StagedFiles],
    ) -> Result<()> {
        self.name = info.name.clone();
        self.index = info.index;
        self.token = token();
        let catalog = super::catalog::connect(&self.cfg)
            .await
            .map_err(|e| self.err(e))?;
        // The job's committer made the table before any subtask started.
        let table = catalog
            .load_table(&self.cfg.table)
            .await
            .map_err(|e| self.err(e))?;
        let schema = table.metadata().current_schema().clone();
        self.table_rows = Some(Arc::new(
            iceberg::arrow::schema_to_arrow_schema(&schema).map_err(|e| self.err(e))?,
        ));
        let spec = table.metadata().default_partition_spec().clone();
        if !spec.is_unpartitioned() {
            self.splitter = Some(
                RecordBatchPartitionSplitter::try_new_with_computed_values(schema, spec)
                    .map_err(|e| self.err(e))?,
            );
        }
        self.table = Some(table);
        Ok(())
    }

    fn check_batch(&mut self, batch: &Batch) -> Vec<(usize, String)> {
        let decoded = self.cfg.columns.decode(batch);
        let mut refused = decoded.refused;
        self.decoded = None;
        if let (Some(rows), Some(table)) = (decoded.rows, &self.table_rows) {
            match super::schema::to_table_rows(&rows, table) {
                Ok(rows) => self.decoded = Some(rows),
                Err(why) => {
                    let taken: std::collections::BTreeSet<usize> =
                        refused.iter().map(|(i, _)| *i).collect();
                    refused.extend(
                        (0..batch.len())
                            .filter(|i| !taken.contains(i))
                            .map(|i| (i, why.clone())),
                    );
                    refused.sort_by_key(|(i, _)| *i);
                }
            }
        }
        refused
    }

    async fn write(&mut self, batch: &Batch) -> Result<()> {
        let Some(rows) = self.decoded.take() else {
            return Ok(());
        };
        if rows.num_rows() != batch.len() {
            return Err(self.err(format!(
                "{} decoded rows for {} records",
                rows.num_rows(),
                batch.len()
            )));
        }
        let split = match &self.splitter {
            None => vec![(String::new(), None, rows)],
            Some(s) => {
                let table = self.table()?;
                let schema = table.metadata().current_schema().clone();
                s.split(&rows)
                    .map_err(|e| self.err(e))?
                    .into_iter()
                    .map(|(key, rows)| {
                        let folder = key.spec().partition_to_path(key.data(), schema.clone());
                        (folder, Some(key), rows)
                    })
                    .collect()
            }
        };
        for (folder, key, rows) in split {
            self.write_rows(folder, key, &rows).await?;
        }
        Ok(())
    }

    fn buffered_bytes(&self) -> usize {
        self.sizes().iter().map(|(_, n)| *n as usize).sum()
    }

    async fn flush(&mut self) -> Result<()> {
        // The open files are held in memory until closed: the largest go early.
        let closing = parts_to_close(&self.sizes(), self.cfg.roll_bytes.min(super::MEMORY_BYTES));
        for folder in closing {
            let found = self.open.iter().position(|f| f.folder == folder);
            if let Some(at) = found {
                self.close_file(at).await?;
            }
        }
        Ok(())
    }

    async fn prepare_commit(&mut self, id: CheckpointId) -> Result<Option<StagedFiles>> {
        while !self.open.is_empty() {
            self.close_file(0).await?;
        }
        if self.closed.is_empty() {
            return Ok(None);
        }
        let table = self.table()?;
        let metadata = table.metadata();
        let partition_type = metadata
            .default_partition_spec()
            .partition_type(metadata.current_schema())
            .map_err(|e| self.err(e))?;
        let version = metadata.format_version();
        let files = std::mem::take(&mut self.closed)
            .into_iter()
            .map(|f| iceberg::spec::serialize_data_file_to_json(f, &partition_type, version))
            .collect::<iceberg::Result<Vec<_>>>()
            .map_err(|e| self.err(e))?;
        Ok(Some(StagedFiles {
            checkpoint: id.0,
            subtask: self.index,
            files,
        }))
    }

    async fn commit(&mut self, _c: &StagedFiles) -> Result<()> {
        // The job's committer adds the files to the table, in one snapshot per
        // checkpoint, before the subtask hears that the checkpoint completed.
        Ok(())
    }

    async fn abort_abandoned(
        &mut self,
        _restored: Option<CheckpointId>,
        _named: &[StagedFiles],
    ) -> Result<()> {
        // Files no snapshot names are not part of the table: nothing to take back.
        Ok(())
    }
}
