//! The Postgres sink's writer for the two-phase kit: one transaction per checkpoint
//! epoch, prepared at the barrier (`two-phase`) or committed there (`idempotent`).
//!
//! - **Writes.** Records become row changes as they arrive; every `batch_max_rows`
//!   and at the barrier the pending changes go out as statements inside the epoch's
//!   transaction (one per shape, values as text arrays, see [`super::rows`]). Each
//!   statement runs under a savepoint: when the database refuses one (a value it
//!   will not take, a constraint), the statement is rolled back and its rows are
//!   written one at a time, and each refused row follows `on_item_error`.
//! - **The barrier.** `PREPARE TRANSACTION 'lockgate:<job>:<subtask>:<checkpoint>'`;
//!   the committable names it and the transaction's id.
//! - **Commit.** `COMMIT PREPARED`, on a second connection (the first may be inside
//!   the next epoch's transaction). A name the server no longer knows is looked up by
//!   its transaction id: committed is a success, rolled back is lost data.
//! - **Rows locked by the previous epoch.** A prepared transaction keeps its row
//!   locks until it is committed, and the next epoch may write the same keys: its
//!   statement would wait for a commit that only this task can make. While a
//!   statement runs, the writer watches the job's completed checkpoints
//!   ([`crate::telemetry::Telemetry::completions`]) and commits what it staged for a
//!   completed one at once, on its second connection.
//! - **Restore.** The kit commits what the restored checkpoint names; then every
//!   prepared transaction of this job and subtask share that it does not name is
//!   rolled back (`ROLLBACK PREPARED`): its records are about to be written again.

use super::config::{Delivery, Mode, PgConfig};
use super::gid::{self, Staged};
use super::rows::{self, Change, Plan, Stmt};
use super::table::{self, quote_literal, Layout};
use crate::connector::SubtaskInfo;
use crate::dead_letter::{DeadLetter, DeadLetterWriter, OnError, Reason};
use crate::error::{JobError, Result};
use crate::kits::TwoPhaseWriter;
use crate::record::{Batch, Record};
use async_trait::async_trait;
use lockgate_state::CheckpointId;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement};

/// The reasons of the sink's dead letters: a value the column's type refuses
/// (`mapping`), a record that is no row (`invalid_document`), any other refusal of the
/// server (`rejected`).
pub(crate) const LETTERS: &[Reason] = &[Reason::Mapping, Reason::InvalidDocument, Reason::Rejected];

/// The second connection: commits and rollbacks of prepared transactions, and the
/// early commits of completed checkpoints.
struct Committer {
    client: Client,
    job: String,
    /// What this writer prepared and has not yet committed, in checkpoint order.
    staged: Vec<Staged>,
    /// Committed ahead of the kit's call (see the module docs).
    early: HashSet<(u16, CheckpointId)>,
    completions: tokio::sync::watch::Receiver<u64>,
}

impl Committer {
    /// Commits `s`; a transaction the server no longer has is a success when its id
    /// says it committed.
    async fn commit(&mut self, s: &Staged, task: &str) -> Result<()> {
        let g = gid::name(&self.job, s.subtask, s.checkpoint);
        let out = self
            .client
            .batch_execute(&format!("COMMIT PREPARED {}", quote_literal(&g)))
            .await;
        self.staged
            .retain(|x| !(x.subtask == s.subtask && x.checkpoint == s.checkpoint));
        match out {
            Ok(()) => Ok(()),
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_OBJECT) => {
                let status: Option<String> = match self
                    .client
                    .query_one("SELECT txid_status($1)", &[&s.xid])
                    .await
                {
                    Ok(row) => row.get(0),
                    // 22023: an id the server never issued.
                    Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::INVALID_PARAMETER_VALUE) => {
                        return Err(JobError::Unrecoverable {
                            task: task.to_string(),
                            message: format!(
                                "the server knows neither prepared transaction {g} nor its transaction id {} ({}): is this the server the job wrote to (a failover to a standby that missed it, a restored backup)? the rows of checkpoint {} are not on it",
                                s.xid,
                                crate::clients::postgres::describe(&e),
                                s.checkpoint
                            ),
                        })
                    }
                    Err(e) => return Err(JobError::task(task, crate::clients::postgres::describe(&e))),
                };
                match status.as_deref() {
                    Some("committed") => Ok(()),
                    Some("in progress") => Err(JobError::Unrecoverable {
                        task: task.to_string(),
                        message: format!(
                            "the transaction of checkpoint {} (id {}) is still open on the server, but not as {g}: was the job renamed? commit or roll it back by hand (pg_prepared_xacts lists it)",
                            s.checkpoint, s.xid
                        ),
                    }),
                    Some("aborted") => Err(JobError::Unrecoverable {
                        task: task.to_string(),
                        message: format!(
                            "prepared transaction {g} (checkpoint {}) was rolled back outside lockgate: the rows it held are lost; restore from a checkpoint before {} to write them again",
                            s.checkpoint, s.checkpoint
                        ),
                    }),
                    other => {
                        tracing::warn!(gid = %g, status = ?other, "prepared transaction gone, its outcome no longer known to the server: taken as committed");
                        Ok(())
                    }
                }
            }
            Err(e) => Err(JobError::task(
                task,
                format!(
                    "COMMIT PREPARED {g}: {}",
                    crate::clients::postgres::describe(&e)
                ),
            )),
        }
    }

    /// The next completed checkpoint that covers something staged (waits forever
    /// while nothing is staged).
    async fn next_completion(&mut self) -> u64 {
        let Some(oldest) = self.staged.first().map(|s| s.checkpoint.0) else {
            return std::future::pending().await;
        };
        let seen = self
            .completions
            .wait_for(|c| *c >= oldest)
            .await
            .map(|c| *c);
        match seen {
            Ok(c) => c,
            Err(_) => std::future::pending().await,
        }
    }

    /// Commits, in order, everything staged for checkpoints up to `completed`.
    async fn commit_completed(&mut self, completed: u64, task: &str) -> Result<()> {
        while let Some(s) = self.staged.first().cloned() {
            if s.checkpoint.0 > completed {
                break;
            }
            self.commit(&s, task).await?;
            self.early.insert((s.subtask, s.checkpoint));
            tracing::debug!(checkpoint = %s.checkpoint, "committed ahead of the notification: the next epoch waited on its rows");
        }
        Ok(())
    }
}

/// A change waiting to be written, with its record (for the record's error).
struct Pending {
    change: Change,
    record: Record,
}

/// The writer of one sink subtask.
pub struct PgWriter {
    cfg: Arc<PgConfig>,
    task: String,
    index: u16,
    parallelism: u16,
    client: Option<Client>,
    committer: Option<Committer>,
    layout: Option<Arc<Layout>>,
    statements: HashMap<Option<Vec<bool>>, Statement>,
    pending: Vec<Pending>,
    /// The epoch's transaction is open.
    in_txn: bool,
    letters: Option<DeadLetterWriter>,
}

impl PgWriter {
    /// A writer of `cfg`, connected at `open`.
    pub fn new(cfg: Arc<PgConfig>) -> PgWriter {
        PgWriter {
            cfg,
            task: String::new(),
            index: 0,
            parallelism: 1,
            client: None,
            committer: None,
            layout: None,
            statements: HashMap::new(),
            pending: Vec::new(),
            in_txn: false,
            letters: None,
        }
    }

    fn err(&self, message: impl std::fmt::Display) -> JobError {
        JobError::task(&self.task, message)
    }

    fn db_err(&self, what: &str, e: &tokio_postgres::Error) -> JobError {
        self.err(format!("{what}: {}", crate::clients::postgres::describe(e)))
    }

    fn unrecoverable(&self, message: String) -> JobError {
        JobError::Unrecoverable {
            task: self.task.clone(),
            message,
        }
    }

    /// A statement waited for a row lock longer than a checkpoint may take: the lock
    /// is another subtask's prepared transaction (two records of one row on two
    /// subtasks) or another client's.
    fn lock_wait(&self, e: &tokio_postgres::Error) -> JobError {
        self.err(format!(
            "waited {} ms for a row lock of {} ({}): another client holds it, or another subtask of this job does in a prepared transaction, when two subtasks write one row (give sink.postgres.key the table's unique columns, so that one subtask writes each row)",
            self.cfg.lock_timeout_ms,
            self.cfg.table,
            crate::clients::postgres::describe(e)
        ))
    }

    /// Checks what the sink needs of the server before it writes.
    async fn check_server(&self, client: &Client, parallelism: u16) -> Result<()> {
        if self.cfg.delivery != Delivery::TwoPhase {
            return Ok(());
        }
        let row = client
            .query_one("SHOW max_prepared_transactions", &[])
            .await
            .map_err(|e| self.db_err("SHOW max_prepared_transactions", &e))?;
        let max: u32 = row.get::<_, String>(0).parse().unwrap_or(0);
        if max == 0 {
            return Err(self.unrecoverable(
                "sink.postgres.exactly_once = \"two-phase\" prepares a transaction at every checkpoint, and this server has max_prepared_transactions = 0, which refuses them: set max_prepared_transactions in postgresql.conf (at least twice the sink's parallelism, and at least max_connections where other clients prepare too) and restart the server, or use exactly_once = \"idempotent\" with mode = \"upsert\"".to_string(),
            ));
        }
        if u32::from(parallelism) * 2 > max {
            tracing::warn!(max_prepared_transactions = max, parallelism, "each Postgres sink subtask may hold two prepared transactions at once (a checkpoint's, until the next one's): raise max_prepared_transactions");
        }
        Ok(())
    }

    /// Handles a record that makes no change: fails the job naming it, or writes it
    /// to the dead-letter topic and goes on.
    async fn item_error(&self, record: &Record, message: &str, reason: Reason) -> Result<()> {
        match &self.cfg.on_item_error {
            OnError::Fail => {
                let at = match &record.origin {
                    Some(o) => format!(" {}/{}@{}", o.stream, o.partition, o.offset),
                    None => String::new(),
                };
                Err(self.err(format!(
                    "record{at} cannot be written to {}: {message} (on_item_error = \"fail\"; dead-letter:<topic> writes such records aside)",
                    self.cfg.table
                )))
            }
            // Not a spelling of `on_item_error`; a program that sets it drops the row.
            OnError::Skip => {
                tracing::warn!(table = %self.cfg.table, error = %message, "skipping a record the table cannot take");
                Ok(())
            }
            OnError::DeadLetter(topic) => {
                let letters = self
                    .letters
                    .as_ref()
                    .ok_or_else(|| self.err("the dead-letter producer is missing"))?;
                let error = format!("{}: {message}", self.cfg.table);
                letters
                    .send(topic, &DeadLetter::of(record, &error, reason))
                    .await
                    .map_err(|e| self.err(e))
            }
        }
    }

    /// Runs one statement over `rows` of `changes`, committing completed checkpoints'
    /// staged work while it waits. The outer error fails the attempt; the inner one
    /// is the database's answer to the statement.
    async fn execute(
        &mut self,
        stmt: &Stmt,
        rows_of: &[usize],
        changes: &[Change],
    ) -> Result<std::result::Result<u64, tokio_postgres::Error>> {
        let layout = self.layout.clone().expect("opened");
        // Inserts of several rows go by COPY, the fastest way into a table; an upsert
        // or a delete (and a row alone, retried after a refusal) by a statement.
        let copy = match stmt {
            Stmt::Write { present, .. }
                if self.cfg.mode == Mode::Insert && layout.copy && rows_of.len() > 1 =>
            {
                Some((
                    rows::copy_sql(&layout, present),
                    bytes::Bytes::from(rows::copy_text(changes, rows_of)),
                ))
            }
            _ => None,
        };
        // A statement is prepared inside the wait below: preparing takes a lock on the
        // table, which may queue behind a DDL that itself waits on this sink's prepared
        // transaction.
        let shape = match stmt {
            Stmt::Write { present, .. } => Some(present.clone()),
            Stmt::Delete { .. } => None,
        };
        let cached = self.statements.get(&shape).cloned();
        let sql = match (&copy, &cached, &shape) {
            (None, None, Some(p)) => rows::write_sql(&layout, self.cfg.mode, p),
            (None, None, None) => rows::delete_sql(&layout),
            _ => String::new(),
        };
        let params = match copy {
            Some(_) => Vec::new(),
            None => rows::params(changes, rows_of, &layout, stmt),
        };
        let refs: Vec<&(dyn ToSql + Sync)> =
            params.iter().map(|p| p as &(dyn ToSql + Sync)).collect();
        let client = self.client.as_ref().expect("opened");
        let committer = self.committer.as_mut().expect("opened");
        let run = async {
            match &copy {
                Some((copy_sql, text)) => {
                    use futures_util::SinkExt;
                    let sink = client.copy_in(copy_sql.as_str()).await?;
                    futures_util::pin_mut!(sink);
                    sink.send(text.clone()).await?;
                    Ok((sink.finish().await?, None))
                }
                None => {
                    let p = match cached {
                        Some(p) => p,
                        None => client.prepare(&sql).await?,
                    };
                    let n = client.execute(&p, &refs).await?;
                    Ok::<_, tokio_postgres::Error>((n, Some(p)))
                }
            }
        };
        tokio::pin!(run);
        let out = loop {
            tokio::select! {
                r = &mut run => break r,
                c = committer.next_completion() => {
                    if let Err(e) = committer.commit_completed(c, &self.task).await {
                        tracing::warn!(error = %e, "early commit failed: the notification commits it");
                    }
                }
            }
        };
        Ok(out.map(|(n, prepared)| {
            if let Some(p) = prepared {
                self.statements.entry(shape).or_insert(p);
            }
            n
        }))
    }

    async fn batch(&self, sql: &str) -> Result<()> {
        self.client
            .as_ref()
            .expect("opened")
            .batch_execute(sql)
            .await
            .map_err(|e| self.db_err(sql, &e))
    }

    /// Writes every pending change into the epoch's transaction.
    async fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let pending = std::mem::take(&mut self.pending);
        let (changes, records): (Vec<Change>, Vec<Record>) =
            pending.into_iter().map(|p| (p.change, p.record)).unzip();
        let layout = self.layout.clone().expect("opened");
        let plan = rows::plan(&changes, self.cfg.mode, &layout);
        if !self.in_txn {
            self.batch("BEGIN").await?;
            self.in_txn = true;
        }
        for stmt in &plan.stmts {
            let rows_of = match stmt {
                Stmt::Write { rows, .. } | Stmt::Delete { rows } => rows.clone(),
            };
            self.batch("SAVEPOINT lockgate_batch").await?;
            match self.execute(stmt, &rows_of, &changes).await? {
                Ok(_) => self.batch("RELEASE SAVEPOINT lockgate_batch").await?,
                Err(e) if refuses_rows(&e) => {
                    self.batch(
                        "ROLLBACK TO SAVEPOINT lockgate_batch; RELEASE SAVEPOINT lockgate_batch",
                    )
                    .await?;
                    tracing::debug!(error = %crate::clients::postgres::describe(&e), rows = rows_of.len(), "a statement was refused: writing its rows one at a time");
                    self.one_at_a_time(&rows_of, &changes, &records, &plan)
                        .await?;
                }
                Err(e)
                    if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) =>
                {
                    return Err(self.lock_wait(&e))
                }
                Err(e) => return Err(self.db_err("writing rows", &e)),
            }
        }
        Ok(())
    }

    /// Writes each row of a refused statement alone; a refused row follows
    /// `on_item_error`, and in upsert mode the change before it of its key is tried
    /// in its place.
    async fn one_at_a_time(
        &mut self,
        rows_of: &[usize],
        changes: &[Change],
        records: &[Record],
        plan: &Plan,
    ) -> Result<()> {
        for &first in rows_of {
            let mut at = Some(first);
            while let Some(i) = at {
                let stmt = match &changes[i] {
                    Change::Write(cells) => Stmt::Write {
                        present: cells.iter().map(|c| *c != rows::Cell::Default).collect(),
                        rows: vec![i],
                    },
                    Change::Delete(_) => Stmt::Delete { rows: vec![i] },
                };
                self.batch("SAVEPOINT lockgate_row").await?;
                match self.execute(&stmt, &[i], changes).await? {
                    Ok(_) => {
                        self.batch("RELEASE SAVEPOINT lockgate_row").await?;
                        at = None;
                    }
                    Err(e) if refuses_rows(&e) => {
                        self.batch(
                            "ROLLBACK TO SAVEPOINT lockgate_row; RELEASE SAVEPOINT lockgate_row",
                        )
                        .await?;
                        let reason = if e.code().is_some_and(|c| c.code().starts_with("22")) {
                            Reason::Mapping
                        } else {
                            Reason::Rejected
                        };
                        let message = crate::clients::postgres::describe(&e);
                        self.item_error(&records[i], &message, reason).await?;
                        at = plan.previous[i];
                    }
                    Err(e)
                        if e.code()
                            == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) =>
                    {
                        return Err(self.lock_wait(&e))
                    }
                    Err(e) => return Err(self.db_err("writing a row", &e)),
                }
            }
        }
        Ok(())
    }
}

/// Whether the database refused the rows of a statement rather than failed: a data
/// exception (class 22: a value its type does not take), an integrity constraint
/// (class 23: NOT NULL, CHECK, a foreign or unique key), or a cardinality violation.
fn refuses_rows(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| {
        let c = c.code();
        // 21000: two rows of one statement name one row (two spellings of one key the
        // sink could not tell apart), which the same rows one at a time do not.
        c.starts_with("22") || c.starts_with("23") || c == "21000"
    })
}

#[async_trait]
impl TwoPhaseWriter for PgWriter {
    type Committable = Staged;

    fn kind(&self) -> &'static str {
        "Postgres sink"
    }

    fn subtask_of(&self, c: &Staged) -> Option<u16> {
        Some(c.subtask)
    }

    async fn open(
        &mut self,
        info: &SubtaskInfo,
        _restored: Option<CheckpointId>,
        _to_commit: &[Staged],
    ) -> Result<()> {
        self.task = info.name.clone();
        self.index = info.index;
        self.parallelism = info.parallelism;
        let app = format!("lockgate {} {}", self.cfg.job, info.name);
        let client = crate::clients::postgres::connect(&self.cfg.endpoint, &app)
            .await
            .map_err(|m| self.err(m))?;
        self.check_server(&client, info.parallelism).await?;
        client
            .batch_execute(&format!(
                "SET lock_timeout = {}",
                self.cfg.lock_timeout_ms.min(i32::MAX as u64)
            ))
            .await
            .map_err(|e| self.db_err("SET lock_timeout", &e))?;
        let t = table::load(&client, &self.cfg.table)
            .await
            .map_err(|m| self.unrecoverable(format!("sink.postgres.table: {m}")))?;
        let layout = table::layout(&self.cfg, &t)
            .map_err(|m| self.unrecoverable(format!("sink.postgres: {m}")))?;
        let committer_client =
            crate::clients::postgres::connect(&self.cfg.endpoint, &format!("{app} commits"))
                .await
                .map_err(|m| self.err(m))?;
        if let (OnError::DeadLetter(_), Some((servers, props))) =
            (&self.cfg.on_item_error, &self.cfg.dead_letter_kafka)
        {
            let m = info.telemetry.metrics();
            self.letters = Some(
                DeadLetterWriter::new(servers, &props.0)
                    .map_err(|e| self.err(e))?
                    .counted(m, crate::connector::SINK_UID, info.index, LETTERS),
            );
        }
        self.layout = Some(Arc::new(layout));
        self.client = Some(client);
        self.committer = Some(Committer {
            client: committer_client,
            job: self.cfg.job.clone(),
            staged: Vec::new(),
            early: HashSet::new(),
            completions: info.telemetry.completions(),
        });
        tracing::info!(subtask = %info.name, table = %t.qualified, mode = ?self.cfg.mode, delivery = ?self.cfg.delivery, "Postgres sink opened");
        Ok(())
    }

    async fn write(&mut self, batch: &Batch) -> Result<()> {
        let layout = self.layout.clone().expect("opened");
        for r in batch {
            match rows::change_of(&layout, self.cfg.mode, r) {
                Ok(change) => self.pending.push(Pending {
                    change,
                    record: r.clone(),
                }),
                Err(e) => {
                    let reason = if e.invalid {
                        Reason::InvalidDocument
                    } else {
                        Reason::Mapping
                    };
                    self.item_error(r, &e.to_string(), reason).await?;
                }
            }
        }
        if self.pending.len() >= self.cfg.batch_max_rows {
            self.flush().await?;
        }
        Ok(())
    }

    async fn prepare_commit(&mut self, id: CheckpointId) -> Result<Option<Staged>> {
        self.flush().await?;
        if !self.in_txn {
            return Ok(None);
        }
        self.in_txn = false;
        match self.cfg.delivery {
            Delivery::Idempotent => {
                self.batch("COMMIT").await?;
                Ok(None)
            }
            Delivery::TwoPhase => {
                let client = self.client.as_ref().expect("opened");
                let xid: i64 = client
                    .query_one("SELECT txid_current()", &[])
                    .await
                    .map_err(|e| self.db_err("txid_current()", &e))?
                    .get(0);
                let g = gid::name(&self.cfg.job, self.index, id);
                self.batch(&format!("PREPARE TRANSACTION {}", quote_literal(&g)))
                    .await?;
                let s = Staged {
                    subtask: self.index,
                    checkpoint: id,
                    xid,
                };
                self.committer
                    .as_mut()
                    .expect("opened")
                    .staged
                    .push(s.clone());
                Ok(Some(s))
            }
        }
    }

    async fn commit(&mut self, c: &Staged) -> Result<()> {
        let committer = self.committer.as_mut().expect("opened");
        if committer.early.remove(&(c.subtask, c.checkpoint)) {
            return Ok(());
        }
        committer.commit(c, &self.task).await
    }

    async fn abort_abandoned(
        &mut self,
        restored: Option<CheckpointId>,
        named: &[Staged],
    ) -> Result<()> {
        if self.cfg.delivery != Delivery::TwoPhase {
            return Ok(());
        }
        let committer = self.committer.as_ref().expect("opened");
        let rows = committer
            .client
            .query(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND starts_with(gid, $1)",
                &[&gid::prefix(&self.cfg.job)],
            )
            .await
            .map_err(|e| self.db_err("listing pg_prepared_xacts", &e))?;
        let gids: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        if restored.is_none() && !gids.is_empty() {
            tracing::warn!(prepared = ?gids, "starting without a checkpoint: rolling back what earlier runs of this job left prepared (their records are read again, or were never checkpointed)");
        }
        for g in gid::abandoned(&self.cfg.job, &gids, self.index, self.parallelism, named) {
            match committer
                .client
                .batch_execute(&format!("ROLLBACK PREPARED {}", quote_literal(&g)))
                .await
            {
                Ok(()) => {
                    tracing::info!(gid = %g, "rolled back a prepared transaction the restored checkpoint does not name: its records are written again")
                }
                // Another subtask's restore of an older attempt may race this one.
                Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_OBJECT) => {}
                Err(e) => return Err(self.db_err(&format!("ROLLBACK PREPARED {g}"), &e)),
            }
        }
        Ok(())
    }

    async fn close(&mut self) -> Result<()> {
        if self.in_txn {
            self.batch("ROLLBACK").await?;
            self.in_txn = false;
        }
        Ok(())
    }
}
