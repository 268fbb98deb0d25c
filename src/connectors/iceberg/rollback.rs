//! Taking back what the job committed after the checkpoint a start restores (or all
//! of it, on a start without a checkpoint): the records are about to be written
//! again. The table's `main` branch is set back to the snapshot before the job's
//! first one to take back, as Iceberg's `rollback_to_snapshot` does; the snapshots
//! taken back stay in the table's metadata (off the branch), with their files, until
//! snapshot expiry removes them, so nothing is deleted here.
//!
//! Only the job's own snapshots are taken back: when another writer committed in
//! between, setting the branch back would drop its data too, and the start is refused
//! naming that snapshot ([`plan`]).
//!
//! iceberg-rust 0.10 has no rollback action and keeps the commit of a hand-made table
//! update inside the crate, so the update is made here as its SQL catalog makes one:
//! the new metadata file written, then the catalog's row swapped from the current
//! metadata location to it in one `UPDATE ... WHERE metadata_location = current`. A
//! REST catalog's tables are refused instead (roll back by hand).

use super::committer::Entry;
use super::section::{CatalogKind, IcebergConfig};
use iceberg::spec::{SnapshotReference, SnapshotRetention, MAIN_BRANCH};
use iceberg::table::Table;
use iceberg::MetadataLocation;
use std::str::FromStr;

/// What a start takes back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Nothing of the job to take back.
    Nothing,
    /// Set `main` back to this snapshot (None: to no snapshot, an empty table), taking
    /// back `taken` (snapshot ids, newest first).
    To {
        snapshot: Option<i64>,
        taken: Vec<i64>,
    },
    /// Taking back would drop another writer's snapshot: why.
    Refuse(String),
}

/// What to take back of `job` from `history` (newest first): its snapshots of
/// checkpoints after `after` (None: all of them).
pub fn plan(history: &[Entry], job: &str, after: Option<u64>, table: &str) -> Plan {
    let mine_after =
        |e: &Entry| matches!(&e.by, Some((j, ck)) if j == job && after.is_none_or(|k| *ck > k));
    let taken: Vec<i64> = history
        .iter()
        .take_while(|e| mine_after(e))
        .map(|e| e.snapshot)
        .collect();
    let rest = &history[taken.len()..];
    if let Some(pos) = rest.iter().position(mine_after) {
        let foreign = &rest[..pos];
        let named: Vec<String> = foreign.iter().map(|e| e.snapshot.to_string()).collect();
        return Plan::Refuse(format!(
            "table {table} holds snapshots of job {job} to take back (its records are about to be written again) with other snapshots after them ({}): taking them back would drop those too. Roll the table back by hand, or restore the job's newest checkpoint",
            named.join(", ")
        ));
    }
    if taken.is_empty() {
        return Plan::Nothing;
    }
    Plan::To {
        snapshot: rest.first().map(|e| e.snapshot),
        taken,
    }
}

/// Why a table in a REST catalog is not set back to `snapshot` here, and what to do.
pub fn by_hand(cfg: &IcebergConfig, snapshot: Option<i64>) -> String {
    format!(
        "table {} is in a REST catalog, where lockgate does not set branches back: roll it back by hand (rollback_to_snapshot {})",
        cfg.table,
        snapshot.map_or("to before the job's first snapshot".to_string(), |s| s.to_string())
    )
}

/// Sets `table`'s `main` branch to `snapshot` (None: removes it) in its catalog, if
/// the table is still at the metadata it was loaded with. An error says why; a
/// conflict (another commit came first) is one, and the restart reads the table again.
pub async fn set_main(
    cfg: &IcebergConfig,
    table: &Table,
    snapshot: Option<i64>,
) -> Result<(), String> {
    let (uri, postgres) = match &cfg.catalog.kind {
        CatalogKind::Sql { uri, postgres } => (uri, *postgres),
        CatalogKind::Rest { .. } => return Err(by_hand(cfg, snapshot)),
    };
    let current = table
        .metadata_location_result()
        .map_err(|e| e.to_string())?
        .to_string();
    let builder = table.metadata().clone().into_builder(Some(current.clone()));
    let builder = match snapshot {
        Some(id) => builder
            .set_ref(
                MAIN_BRANCH,
                SnapshotReference::new(
                    id,
                    SnapshotRetention::Branch {
                        min_snapshots_to_keep: None,
                        max_snapshot_age_ms: None,
                        max_ref_age_ms: None,
                    },
                ),
            )
            .map_err(|e| e.to_string())?,
        None => builder.remove_ref(MAIN_BRANCH),
    };
    let metadata = builder.build().map_err(|e| e.to_string())?.metadata;
    let location = MetadataLocation::from_str(&current)
        .map_err(|e| e.to_string())?
        .with_next_version()
        .with_new_metadata(&metadata);
    metadata
        .write_to(table.file_io(), &location)
        .await
        .map_err(|e| format!("cannot write the table's metadata: {e}"))?;
    let next = location.to_string();
    sqlx::any::install_default_drivers();
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(1)
        .connect(uri)
        .await
        .map_err(|e| format!("cannot reach the SQL catalog: {e}"))?;
    let sql = match postgres {
        true => "UPDATE iceberg_tables SET metadata_location = $1, previous_metadata_location = $2 WHERE catalog_name = $3 AND table_namespace = $4 AND table_name = $5 AND metadata_location = $6",
        false => "UPDATE iceberg_tables SET metadata_location = ?, previous_metadata_location = ? WHERE catalog_name = ? AND table_namespace = ? AND table_name = ? AND metadata_location = ?",
    };
    let done = sqlx::query(sql)
        .bind(next.clone())
        .bind(current.clone())
        .bind(cfg.catalog.name.clone())
        .bind(cfg.table.namespace().join("."))
        .bind(cfg.table.name().to_string())
        .bind(current.clone())
        .execute(&pool)
        .await
        .map_err(|e| format!("cannot update the SQL catalog: {e}"))?;
    pool.close().await;
    if done.rows_affected() != 1 {
        return Err(format!(
            "table {} changed while its branch was set back (its metadata is no longer {current}); the next start reads it again",
            cfg.table
        ));
    }
    Ok(())
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

    #[test]
    fn the_job_s_snapshots_after_the_checkpoint_are_taken_back_to_the_one_before() {
        let h = vec![by("a", 9, 90), by("a", 8, 80), by("a", 7, 70), other(60)];
        assert_eq!(
            plan(&h, "a", Some(7), "t"),
            Plan::To {
                snapshot: Some(70),
                taken: vec![90, 80]
            }
        );
        assert_eq!(plan(&h, "a", Some(9), "t"), Plan::Nothing);
        assert_eq!(
            plan(&h, "a", None, "t"),
            Plan::To {
                snapshot: Some(60),
                taken: vec![90, 80, 70]
            }
        );
        assert_eq!(
            plan(&h[..3], "a", None, "t"),
            Plan::To {
                snapshot: None,
                taken: vec![90, 80, 70]
            }
        );
        assert_eq!(plan(&h, "b", None, "t"), Plan::Nothing);
    }

    #[test]
    fn another_writer_s_snapshot_in_between_is_never_taken_back() {
        let h = vec![by("a", 9, 90), other(85), by("a", 8, 80), by("a", 7, 70)];
        match plan(&h, "a", Some(7), "t") {
            Plan::Refuse(why) => assert!(why.contains("85"), "{why}"),
            p => panic!("{p:?}"),
        }
        // Another writer after the restored checkpoint's snapshot only: nothing of
        // the job's is above it, and nothing to take back.
        let h = vec![other(95), by("a", 7, 70)];
        assert_eq!(plan(&h, "a", Some(7), "t"), Plan::Nothing);
        // Another job's snapshots are another writer's.
        let h = vec![by("b", 3, 99), by("a", 8, 80), by("a", 7, 70)];
        assert!(matches!(plan(&h, "a", Some(7), "t"), Plan::Refuse(_)));
    }
}
