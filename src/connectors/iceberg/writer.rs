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
    /// The partition the file's rows are in (None: an unpartitioned table); what an
    /// open file is found by, and never its folder's name, which two partitions may
    /// share (a null and the text `null`).
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
        self.open.push(OpenFile { key, writer });
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
        let partition = key.as_ref().map(PartitionKey::data);
        let found = self
            .open
            .iter()
            .position(|f| f.key.as_ref().map(PartitionKey::data) == partition);
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

    /// Each open file's size, named by its place in `open` (folders may repeat).
    fn sizes(&self) -> Vec<(String, u64)> {
        self.open
            .iter()
            .enumerate()
            .map(|(at, f)| (at.to_string(), f.writer.current_written_size() as u64))
            .collect()
    }
}

/// The folder of a partition under `data/`: `name=value` levels as Iceberg's
/// `partitionToPath` writes them, names and values escaped as in a URL, so that a
/// value's `/`, `#`, `%` or `..` never makes another folder or another key.
pub fn partition_folder(
    spec: &iceberg::spec::PartitionSpec,
    data: &Struct,
    schema: &iceberg::spec::SchemaRef,
) -> Result<String> {
    let partition_type = spec
        .partition_type(schema)
        .map_err(|e| JobError::Other(e.to_string()))?;
    let types = partition_type.fields();
    Ok(spec
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let value = f
                .transform
                .to_human_string(&types[i].field_type, data[i].as_ref());
            format!("{}={}", escape(&f.name), escape(&value))
        })
        .collect::<Vec<_>>()
        .join("/"))
}

/// `text` with every byte but ASCII letters, digits, `-`, `_` and `.` as `%XX`.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
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
        self.token = crate::kits::parts::writer_name();
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
            let (rows, not_taken) = super::schema::to_table_rows_each(&rows, table);
            self.decoded = rows;
            if !not_taken.is_empty() {
                // The decoded rows are the records not refused yet, in order.
                let taken: std::collections::BTreeSet<usize> =
                    refused.iter().map(|(i, _)| *i).collect();
                let records: Vec<usize> = (0..batch.len()).filter(|i| !taken.contains(i)).collect();
                refused.extend(not_taken.into_iter().map(|(r, why)| (records[r], why)));
                refused.sort_by_key(|(i, _)| *i);
            }
        }
        refused
    }

    async fn write(&mut self, batch: &Batch) -> Result<()> {
        let Some(rows) = self.decoded.take() else {
            // Records `check_batch` did not decode are never dropped without a word.
            return match batch.is_empty() {
                true => Ok(()),
                false => Err(self.err(format!("{} records were not decoded", batch.len()))),
            };
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
                        let folder = partition_folder(key.spec(), key.data(), &schema)
                            .map_err(|e| self.err(e))?;
                        Ok((folder, Some(key), rows))
                    })
                    .collect::<Result<Vec<_>>>()?
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
        // Closed from the last place down: the places of the others stay.
        let mut places: Vec<usize> = closing.iter().filter_map(|at| at.parse().ok()).collect();
        places.sort_unstable();
        for at in places.into_iter().rev() {
            if at < self.open.len() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connector::{JobCommitter, SinkRestore};
    use crate::kits::two_phase::encode_state;
    use crate::record::Record;
    use futures_util::TryStreamExt;
    use iceberg::expr::Reference;
    use iceberg::spec::Datum;
    use std::path::Path;

    #[test]
    fn a_folder_escapes_what_would_make_another_folder_or_key() {
        assert_eq!(escape("2024-05-01"), "2024-05-01");
        assert_eq!(escape("a/../b#c"), "a%2F..%2Fb%23c");
        assert_eq!(escape("50% ~x"), "50%25%20%7Ex");
        assert_eq!(escape("é"), "%C3%A9");
    }

    /// The ids of the table's rows where `country` is `value` (None: null), as a
    /// reader finds them, partitions pruned by their values.
    async fn ids_where(table: &Table, value: Option<&str>) -> Vec<i64> {
        let country = Reference::new("country");
        let filter = match value {
            Some(v) => country.equal_to(Datum::string(v)),
            None => country.is_null(),
        };
        let batches: Vec<RecordBatch> = table
            .scan()
            .select(["id"])
            .with_filter(filter)
            .build()
            .unwrap()
            .to_arrow()
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        let mut ids: Vec<i64> = batches
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<arrow_array::Int64Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .collect();
        ids.sort();
        ids
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn rows_go_to_files_of_their_own_partitions_even_when_folder_names_meet() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        std::fs::write(
            dir.join("s.avsc"),
            r#"{"type":"record","name":"o","fields":[{"name":"id","type":"long"},{"name":"country","type":["null","string"]}]}"#,
        )
        .unwrap();
        let section: super::super::IcebergSection = toml::from_str(
            r#"
            table = "shop.orders"
            schema_file = "s.avsc"
            partition_by = "country={/country}"
            catalog = { type = "sql", uri = "sqlite:///c.db", warehouse = "wh" }
            "#,
        )
        .unwrap();
        let cfg = Arc::new(section.config(&|p: &Path| dir.join(p)).unwrap());
        let mut committer = super::super::IcebergCommitter::new(cfg.clone(), "j".into());
        committer.open(&SinkRestore::default()).await.unwrap();
        let mut w = IcebergWriter::new(cfg.clone());
        w.open(&SubtaskInfo::new("j", "sink-0", 0, 1), None, &[])
            .await
            .unwrap();
        let batch: Batch = [
            r#"{"id":1,"country":null}"#,
            r#"{"id":2,"country":"null"}"#,
            r#"{"id":3,"country":"a/../b#c"}"#,
            r#"{"id":4,"country":null}"#,
        ]
        .iter()
        .map(|v| Record::from_value(v.as_bytes().to_vec()))
        .collect();
        assert!(w.check_batch(&batch).is_empty());
        w.write(&batch).await.unwrap();
        let staged = w.prepare_commit(CheckpointId(1)).await.unwrap().unwrap();
        assert_eq!(staged.files.len(), 3, "one file per partition");
        assert!(
            staged
                .files
                .iter()
                .any(|f| f.contains("/data/country=a%2F..%2Fb%23c/lockgate-")),
            "{:?}",
            staged.files
        );
        committer
            .commit(CheckpointId(1), &[(0, encode_state(vec![staged]).unwrap())])
            .await
            .unwrap();
        let catalog = super::super::catalog::connect(&cfg).await.unwrap();
        let table = catalog.load_table(&cfg.table).await.unwrap();
        assert_eq!(ids_where(&table, None).await, vec![1, 4]);
        assert_eq!(ids_where(&table, Some("null")).await, vec![2]);
        assert_eq!(ids_where(&table, Some("a/../b#c")).await, vec![3]);
    }
}
