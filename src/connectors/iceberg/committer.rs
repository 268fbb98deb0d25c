//! The Iceberg sink's committer: one per job, one snapshot per completed checkpoint
//! (see [`crate::connector::committer`] for when it is called).
//!
//! Each snapshot it makes carries `lockgate.job` and `lockgate.checkpoint` in its
//! summary. What is committed is read back from the table itself, never remembered:
//! the newest checkpoint of the job on the current snapshot's line of ancestors
//! ([`newest_committed`]). A checkpoint at or before it is committed already (the
//! crash came after the snapshot, before the checkpoint knew); the files a commit
//! adds are those staged after it ([`to_commit`]), so no file is ever in two
//! snapshots and no checkpoint has two.
//!
//! Why one committer and not every subtask: a checkpoint is then one snapshot, one
//! atomic step for readers, whatever the parallelism, and commits do not race one
//! another for the table's metadata (Flink's `IcebergFilesCommitter` and Iceberg's
//! Kafka Connect coordinator chose the same). The committables reach it inside the
//! published checkpoint, so nothing else can lose them. A rescale changes nothing
//! for it: it gets every old subtask's state.

use super::rollback::Plan;
use super::section::IcebergConfig;
use super::writer::StagedFiles;
use crate::connector::{JobCommitter, SinkRestore};
use crate::error::{JobError, Result};
use crate::kits::two_phase::decode_state;
use async_trait::async_trait;
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::Catalog;
use lockgate_state::CheckpointId;
use std::collections::HashMap;
use std::sync::Arc;

/// The snapshot summary's key for the job's name.
pub const JOB_PROPERTY: &str = "lockgate.job";
/// The snapshot summary's key for the checkpoint's id.
pub const CHECKPOINT_PROPERTY: &str = "lockgate.checkpoint";

/// How often a commit that lost a race for the table is tried again (each time from
/// the table as it is then, after Iceberg's own retries).
const COMMIT_ATTEMPTS: usize = 5;

/// One snapshot on the current snapshot's line of ancestors, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub snapshot: i64,
    /// `(job, checkpoint)` when lockgate made it.
    pub by: Option<(String, u64)>,
}

/// The current snapshot's line of ancestors, newest first.
pub fn history(table: &Table) -> Vec<Entry> {
    let metadata = table.metadata();
    let mut out = Vec::new();
    let mut at = metadata.current_snapshot();
    while let Some(s) = at {
        let p = &s.summary().additional_properties;
        let by = match (p.get(JOB_PROPERTY), p.get(CHECKPOINT_PROPERTY)) {
            (Some(job), Some(ck)) => ck.parse().ok().map(|ck| (job.clone(), ck)),
            _ => None,
        };
        out.push(Entry {
            snapshot: s.snapshot_id(),
            by,
        });
        at = s
            .parent_snapshot_id()
            .and_then(|p| metadata.snapshot_by_id(p));
    }
    out
}

/// The newest checkpoint of `job` the table holds (on the current line).
pub fn newest_committed(history: &[Entry], job: &str) -> Option<u64> {
    history
        .iter()
        .filter_map(|e| e.by.as_ref())
        .filter(|(j, _)| j == job)
        .map(|(_, ck)| *ck)
        .max()
}

/// The files a commit of checkpoint `id` adds: those of every subtask's staged
/// checkpoints after `committed` and at most `id` (a state may still hold files of
/// an earlier checkpoint the subtask had not heard was committed; they are out).
pub fn to_commit(staged: &[StagedFiles], committed: Option<u64>, id: u64) -> Vec<String> {
    staged
        .iter()
        .filter(|s| committed.is_none_or(|c| s.checkpoint > c) && s.checkpoint <= id)
        .flat_map(|s| s.files.iter().cloned())
        .collect()
}

/// The Iceberg sink's committer (see the module).
pub struct IcebergCommitter {
    cfg: Arc<IcebergConfig>,
    job: String,
    catalog: Option<Arc<dyn Catalog>>,
}

impl IcebergCommitter {
    pub fn new(cfg: Arc<IcebergConfig>, job: String) -> IcebergCommitter {
        IcebergCommitter {
            cfg,
            job,
            catalog: None,
        }
    }

    fn err(&self, e: impl std::fmt::Display) -> JobError {
        JobError::task(
            "iceberg-committer",
            format!("table {}: {e}", self.cfg.table),
        )
    }

    fn catalog(&self) -> Result<&Arc<dyn Catalog>> {
        self.catalog
            .as_ref()
            .ok_or_else(|| self.err("the committer is not open"))
    }

    fn staged(&self, states: &[(u16, Vec<u8>)]) -> Result<Vec<StagedFiles>> {
        let mut out = Vec::new();
        for (subtask, bytes) in states {
            let files: Vec<StagedFiles> = decode_state(bytes).map_err(|e| {
                self.err(format!(
                    "the state of sink subtask {subtask} cannot be read: {e}"
                ))
            })?;
            out.extend(files);
        }
        Ok(out)
    }

    /// Commits checkpoint `id` unless the table has it: one snapshot of the files
    /// staged after the newest committed checkpoint.
    async fn commit_files(&self, id: u64, staged: &[StagedFiles]) -> Result<()> {
        let catalog = self.catalog()?.clone();
        let mut last = String::new();
        for attempt in 0..COMMIT_ATTEMPTS {
            let table = catalog
                .load_table(&self.cfg.table)
                .await
                .map_err(|e| self.err(e))?;
            let committed = newest_committed(&history(&table), &self.job);
            if committed.is_some_and(|c| c >= id) {
                tracing::debug!(checkpoint = id, "the table has the checkpoint already");
                return Ok(());
            }
            let files = to_commit(staged, committed, id);
            if files.is_empty() {
                return Ok(());
            }
            let metadata = table.metadata();
            let spec = metadata.default_partition_spec();
            let schema = metadata.current_schema();
            let partition_type = spec.partition_type(schema).map_err(|e| self.err(e))?;
            let data_files = files
                .iter()
                .map(|f| {
                    iceberg::spec::deserialize_data_file_from_json(
                        f,
                        spec.spec_id(),
                        &partition_type,
                        schema,
                    )
                })
                .collect::<iceberg::Result<Vec<_>>>()
                .map_err(|e| self.err(format!("a staged data file cannot be read: {e}")))?;
            let count = data_files.len();
            let tx = Transaction::new(&table);
            let tx = tx
                .fast_append()
                .with_check_duplicate(false)
                .add_data_files(data_files)
                .set_snapshot_properties(HashMap::from([
                    (JOB_PROPERTY.to_string(), self.job.clone()),
                    (CHECKPOINT_PROPERTY.to_string(), id.to_string()),
                ]))
                .apply(tx)
                .map_err(|e| self.err(e))?;
            match tx.commit(catalog.as_ref()).await {
                Ok(_) => {
                    tracing::info!(
                        checkpoint = id,
                        files = count,
                        "committed the checkpoint's snapshot"
                    );
                    return Ok(());
                }
                Err(e) => {
                    // Another writer won the race (or the answer was lost): the
                    // table is read again, and may show the commit made.
                    tracing::warn!(checkpoint = id, attempt, error = %e, "the snapshot's commit failed");
                    last = e.to_string();
                }
            }
        }
        Err(self.err(format!(
            "checkpoint {id}'s snapshot could not be committed in {COMMIT_ATTEMPTS} attempts: {last}"
        )))
    }
}

#[async_trait]
impl JobCommitter for IcebergCommitter {
    async fn open(&mut self, restored: &SinkRestore) -> Result<()> {
        let catalog = super::catalog::connect(&self.cfg)
            .await
            .map_err(|e| self.err(e))?;
        let table = super::catalog::load_or_create(catalog.as_ref(), &self.cfg)
            .await
            .map_err(|e| self.err(e))?;
        self.catalog = Some(catalog);
        let k = restored.checkpoint.map(|c| c.0);
        let table_name = self.cfg.table.to_string();
        match super::rollback::plan(&history(&table), &self.job, k, &table_name) {
            Plan::Nothing => {}
            Plan::Refuse(why) => {
                return Err(JobError::Unrecoverable {
                    task: "iceberg-committer".into(),
                    message: why,
                })
            }
            Plan::To { snapshot, taken } => {
                tracing::warn!(
                    restored = ?k,
                    taken_back = ?taken,
                    to = ?snapshot,
                    "the table's main branch goes back to before the job's snapshots after the restored checkpoint: their records are written again"
                );
                if matches!(
                    self.cfg.catalog.kind,
                    super::section::CatalogKind::Rest { .. }
                ) {
                    // No restart can do it: the job fails for good, saying what to do.
                    return Err(JobError::Unrecoverable {
                        task: "iceberg-committer".into(),
                        message: super::rollback::by_hand(&self.cfg, snapshot),
                    });
                }
                super::rollback::set_main(&self.cfg, &table, snapshot)
                    .await
                    .map_err(|e| self.err(e))?;
            }
        }
        match k {
            Some(k) => {
                let staged = self.staged(&restored.states)?;
                self.commit_files(k, &staged).await
            }
            None => Ok(()),
        }
    }

    async fn commit(&mut self, id: CheckpointId, states: &[(u16, Vec<u8>)]) -> Result<()> {
        let staged = self.staged(states)?;
        self.commit_files(id.0, &staged).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn by(job: &str, ck: u64, snapshot: i64) -> Entry {
        Entry {
            snapshot,
            by: Some((job.into(), ck)),
        }
    }

    fn other(snapshot: i64) -> Entry {
        Entry { snapshot, by: None }
    }

    fn staged(checkpoint: u64, subtask: u16, files: &[&str]) -> StagedFiles {
        StagedFiles {
            checkpoint,
            subtask,
            files: files.iter().map(|f| f.to_string()).collect(),
        }
    }

    #[test]
    fn the_newest_committed_checkpoint_is_the_job_s_own() {
        let h = vec![
            other(9),
            by("b", 40, 8),
            by("a", 7, 7),
            by("a", 6, 6),
            other(5),
        ];
        assert_eq!(newest_committed(&h, "a"), Some(7));
        assert_eq!(newest_committed(&h, "b"), Some(40));
        assert_eq!(newest_committed(&h, "c"), None);
    }

    #[test]
    fn a_commit_takes_the_files_staged_after_the_newest_committed_up_to_its_checkpoint() {
        let s = vec![
            staged(4, 0, &["a4"]),
            staged(5, 0, &["a5"]),
            staged(5, 1, &["b5"]),
            staged(6, 1, &["b6"]),
        ];
        // 4 was committed; 5 aborted; 6 completes: 5's and 6's files, once each.
        assert_eq!(to_commit(&s, Some(4), 6), vec!["a5", "b5", "b6"]);
        assert_eq!(to_commit(&s, None, 5), vec!["a4", "a5", "b5"]);
        assert!(to_commit(&s, Some(6), 6).is_empty());
        // A restore of 5 never takes files staged after it.
        assert_eq!(to_commit(&s, Some(4), 5), vec!["a5", "b5"]);
    }
}
