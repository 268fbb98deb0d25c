//! Verifies a Postgres table against the inputs: with `mode = "insert"` every input is
//! one row, exactly once; with `upsert` every key's row is its last record in
//! partition order (absent when that is a delete). Nothing of the job may be left
//! prepared.
//!
//! The expected rows are made by the sink's own reading of a record
//! ([`crate::connectors::postgres::verify::change_of`]) and loaded into a temporary
//! table shaped like the target, so that the database compares values of one type
//! (a timestamp written as epoch milliseconds equals the same instant in RFC 3339):
//! the harness checks what the protocol delivers, not the conversion.

use super::verify::{Input, Verdict};
use crate::connectors::postgres::verify::{self as pg, Change};
use crate::connectors::postgres::{Mode, PgConfig};
use crate::record::Record;
use std::collections::HashMap;
use tokio_postgres::types::ToSql;

fn db(e: tokio_postgres::Error) -> String {
    pg::describe(&e)
}

/// The expected changes in the order the table receives them: partition order.
fn expected_changes(cfg: &PgConfig, layout: &pg::Layout, inputs: &[Input]) -> Vec<Change> {
    let mut order: Vec<&Input> = inputs.iter().collect();
    order.sort_by(|a, b| {
        (&a.topic, a.partition, a.offset, a.output).cmp(&(
            &b.topic,
            b.partition,
            b.offset,
            b.output,
        ))
    });
    let mut out = Vec::new();
    for i in order {
        let r = Record {
            key: i.key.clone().map(Into::into),
            value: if i.tombstone {
                Default::default()
            } else {
                serde_json::to_vec(&i.value).expect("JSON").into()
            },
            tombstone: i.tombstone,
            op: i.op,
            ..Record::default()
        };
        // A record the sink cannot write is failed or dead-lettered: in no row.
        if let Ok(c) = pg::change_of(layout, cfg.mode, &r) {
            out.push(c);
        }
    }
    out
}

/// The rows the table must hold in the end.
fn final_rows(mode: Mode, layout: &pg::Layout, changes: Vec<Change>) -> Vec<Vec<pg::Cell>> {
    match mode {
        Mode::Upsert => {
            // Each key's last change: its position, and its row (None: deleted).
            type Last = (usize, Option<Vec<pg::Cell>>);
            let mut last: HashMap<Vec<Option<String>>, Last> = HashMap::new();
            for (n, c) in changes.into_iter().enumerate() {
                let k = pg::key_of(&c, layout);
                let row = match c {
                    Change::Write(cells) => Some(cells),
                    Change::Delete(_) => None,
                };
                last.insert(k, (n, row));
            }
            let mut rows: Vec<(usize, Vec<pg::Cell>)> = last
                .into_values()
                .filter_map(|(n, r)| r.map(|r| (n, r)))
                .collect();
            rows.sort_by_key(|(n, _)| *n);
            rows.into_iter().map(|(_, r)| r).collect()
        }
        Mode::Insert => {
            let mut rows: Vec<Vec<pg::Cell>> = Vec::new();
            for c in changes {
                match c {
                    Change::Write(cells) => rows.push(cells),
                    Change::Delete(k) => {
                        let gone = pg::key_of(&Change::Delete(k), layout);
                        rows.retain(|cells| {
                            pg::key_of(&Change::Write(cells.clone()), layout) != gone
                        })
                    }
                }
            }
            rows
        }
    }
}

async fn verify_async(cfg: &PgConfig, inputs: &[Input]) -> Result<Verdict, String> {
    let client = pg::connect(&cfg.endpoint, "lockgate chaos verify").await?;
    let t = pg::load(&client, &cfg.table).await?;
    let layout = pg::layout(cfg, &t)?;
    let expected = final_rows(cfg.mode, &layout, expected_changes(cfg, &layout, inputs));
    let mut verdict = Verdict {
        inputs: inputs.len() as u64,
        expected_documents: expected.len() as u64,
        ..Verdict::default()
    };
    client
        .batch_execute(&format!(
            "CREATE TEMP TABLE lockgate_expected (LIKE {} INCLUDING DEFAULTS)",
            t.qualified
        ))
        .await
        .map_err(db)?;
    let scratch = pg::Layout {
        table: "pg_temp.lockgate_expected".into(),
        ..layout.clone()
    };
    let changes: Vec<Change> = expected.into_iter().map(Change::Write).collect();
    let plan = pg::plan(&changes, Mode::Insert, &scratch);
    for stmt in &plan.stmts {
        let pg::Stmt::Write { present, rows: at } = stmt else {
            continue;
        };
        let sql = pg::write_sql(&scratch, Mode::Insert, present);
        let params = pg::params(&changes, at, &scratch, stmt);
        let refs: Vec<&(dyn ToSql + Sync)> =
            params.iter().map(|p| p as &(dyn ToSql + Sync)).collect();
        client.execute(&sql, &refs).await.map_err(db)?;
    }
    let cols: Vec<String> = layout
        .written
        .iter()
        .map(|w| format!("{}::text", pg::quote_ident(&w.column.name)))
        .collect();
    let cols = cols.join(", ");
    let count = |sql: String| {
        let client = &client;
        async move {
            client
                .query_one(&sql, &[])
                .await
                .map(|r| r.get::<_, i64>(0) as u64)
                .map_err(db)
        }
    };
    verdict.documents = count(format!("SELECT count(*) FROM {}", t.qualified)).await?;
    let absent = count(format!(
        "SELECT count(*) FROM (SELECT {cols} FROM pg_temp.lockgate_expected EXCEPT ALL SELECT {cols} FROM {}) d",
        t.qualified
    ))
    .await?;
    let extra = count(format!(
        "SELECT count(*) FROM (SELECT {cols} FROM {} EXCEPT ALL SELECT {cols} FROM pg_temp.lockgate_expected) d",
        t.qualified
    ))
    .await?;
    match cfg.mode {
        Mode::Insert => {
            // A row written twice is extra with nothing absent; a wrong row is both.
            let wrong = absent.min(extra);
            verdict.wrong = wrong;
            verdict.missing = absent - wrong;
            verdict.duplicated = extra - wrong;
        }
        Mode::Upsert => {
            let keys: Vec<String> = layout
                .key
                .iter()
                .map(|&k| pg::quote_ident(&layout.written[k].column.name))
                .collect();
            let keys = keys.join(", ");
            let missing_keys = count(format!(
                "SELECT count(*) FROM (SELECT {keys} FROM pg_temp.lockgate_expected EXCEPT SELECT {keys} FROM {}) d",
                t.qualified
            ))
            .await?;
            verdict.missing = missing_keys;
            // Rows of keys that should not be there, and rows with wrong values.
            verdict.wrong = extra;
        }
    }
    if !verdict.exact() {
        let sample = client
            .query(
                &format!(
                    "SELECT row_to_json(d)::text FROM (SELECT {cols} FROM {} EXCEPT ALL SELECT {cols} FROM pg_temp.lockgate_expected LIMIT 5) d",
                    t.qualified
                ),
                &[],
            )
            .await
            .map_err(db)?;
        for r in sample {
            verdict.note(format!("unexpected row {}", r.get::<_, String>(0)));
        }
        let sample = client
            .query(
                &format!(
                    "SELECT row_to_json(d)::text FROM (SELECT {cols} FROM pg_temp.lockgate_expected EXCEPT ALL SELECT {cols} FROM {} LIMIT 5) d",
                    t.qualified
                ),
                &[],
            )
            .await
            .map_err(db)?;
        for r in sample {
            verdict.note(format!("expected row not found {}", r.get::<_, String>(0)));
        }
    }
    let left = client
        .query(
            "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, $1)",
            &[&pg::prefix(&cfg.job)],
        )
        .await
        .map_err(db)?;
    if !left.is_empty() {
        verdict.wrong += left.len() as u64;
        let names: Vec<String> = left.iter().map(|r| r.get(0)).collect();
        verdict.note(format!(
            "prepared transactions left after the last run: {}",
            names.join(", ")
        ));
    }
    Ok(verdict)
}

/// Verifies the table of `cfg` against `inputs` (see the module docs).
pub fn verify_table(cfg: &PgConfig, inputs: &[Input]) -> Result<Verdict, String> {
    // A runtime of its own, on a thread of its own: the caller may be on one.
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?
                .block_on(verify_async(cfg, inputs))
        })
        .join()
        .map_err(|_| "the Postgres verifier panicked".to_string())?
    })
}
