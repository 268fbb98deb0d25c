//! The source: one subtask reads the slot (its only split), first the initial
//! snapshot in pieces, then the change stream; the others read nothing and the job's
//! later steps spread the events.
//!
//! Why one reader: a logical slot has one consumer, and one slot's stream is the only
//! order in which transactions across tables are known. Spreading tables over
//! subtasks would need a slot per subtask (each decoding the whole WAL again, and a
//! snapshot per slot); decoding is the server's cost, the events' conversion is cheap,
//! and a `key_by` after the source spreads the work that is heavy.

use super::catalog::{self, Refusal, TableInfo};
use super::config::{CdcConfig, SnapshotMode};
use super::events::{Cell, Kind, Source as EventSource};
use super::position::{behind_slot, Confirmations, Resume};
use super::progress::{boundaries_sql, Decision, Progress, State, VERSION};
use super::snapshot::Piece;
use super::stream::{Assembler, Pending};
use crate::clients::postgres::{connect, describe};
use crate::connector::{
    split_start_as, JobError, Result, Source, SourceCaps, SourcePoll, SourceSpec, SplitPosition,
    SplitStartAs, SubtaskInfo,
};
use crate::record::Batch;
use async_trait::async_trait;
use lockgate_state::{CheckpointId, SourcePosition};
use pgwire_replication::{Lsn, ReplicationClient, ReplicationEvent};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_postgres::Client;

/// Records one poll passes on at most: a barrier waits for one poll's records.
const BATCH: usize = 512;

/// How long a poll waits for the stream.
const POLL_WAIT: Duration = Duration::from_millis(50);

/// How long a start waits for a slot still held by a session that is going away.
const SLOT_PATIENCE: Duration = Duration::from_secs(30);

/// An error of subtask `task` (a restart may cure it).
fn err(task: &str, message: impl std::fmt::Display) -> JobError {
    JobError::task(task, message)
}

/// A fault of the stream as the job's error: one no restart cures fails the job.
fn fault(task: &str, f: super::stream::Fault) -> JobError {
    if f.fatal {
        JobError::Unrecoverable {
            task: task.to_string(),
            message: f.message,
        }
    } else {
        JobError::task(task, f.message)
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The initial snapshot being read.
struct Reading {
    piece: Piece,
    /// The table being read (index into the progress and the piece's tables).
    table: usize,
    rows: VecDeque<Vec<Option<String>>>,
    /// The last chunk came back short: the table has no more rows.
    exhausted: bool,
}

/// The change stream being read.
struct Streaming {
    client: ReplicationClient,
    assembler: Assembler,
    /// The last time anything came from the server.
    heard: Instant,
    /// The last heartbeat written.
    beat: Instant,
}

enum Phase {
    /// This subtask does not read the slot, or has not opened.
    Idle,
    Snapshot(Box<Reading>),
    Stream(Box<Streaming>),
}

/// A subtask of `[source.postgres_cdc]`.
pub struct CdcSource {
    cfg: Arc<CdcConfig>,
    task: String,
    phase: Phase,
    /// Where the stream resumes: in every checkpoint.
    position: Resume,
    /// The snapshot's progress while the stream may still meet rows it read.
    progress: Option<Progress>,
    /// A bounded job's end (`bounded = "latest"`): the WAL position when it first
    /// started.
    end: Option<u64>,
    /// Reached `end`.
    finished: bool,
    /// Deletes held back while the stream may meet rows the snapshot read.
    ghosts: super::ghosts::Ghosts,
    restored: Option<State>,
    confirms: Confirmations,
    /// The LSN told to the server last (the slot's confirmed position).
    told: u64,
    /// The session for the catalog, the keys' places and the heartbeats.
    sql: Option<Client>,
    db: String,
    tables: Vec<TableInfo>,
    /// The replication session that exported the first piece's snapshot, held until
    /// the piece has imported it.
    exporter: Option<(ReplicationClient, String)>,
    metrics: Option<super::metrics::Lag>,
}

impl CdcSource {
    /// The source as the runtime takes it: one split (the slot), read by one subtask.
    pub fn spec(cfg: Arc<CdcConfig>) -> SourceSpec {
        let bounded = cfg.bounded;
        SourceSpec::new(super::KIND, move |_| {
            Box::new(CdcSource {
                cfg: cfg.clone(),
                task: String::new(),
                phase: Phase::Idle,
                position: Resume::default(),
                progress: None,
                end: None,
                finished: false,
                ghosts: Default::default(),
                restored: None,
                confirms: Confirmations::default(),
                told: 0,
                sql: None,
                db: String::new(),
                tables: Vec::new(),
                exporter: None,
                metrics: None,
            })
        })
        .with_caps(SourceCaps {
            bounded,
            discovers_splits: false,
        })
    }

    fn refused(&self, r: Refusal) -> JobError {
        if r.fatal {
            JobError::Unrecoverable {
                task: self.task.clone(),
                message: r.message,
            }
        } else {
            JobError::task(&self.task, r.message)
        }
    }

    fn fail(&self, message: impl std::fmt::Display) -> JobError {
        JobError::task(&self.task, message)
    }

    fn sql(&self) -> &Client {
        self.sql
            .as_ref()
            .expect("the session opens with the subtask")
    }

    /// A new session named after the job.
    async fn session(&self, what: &str) -> Result<Client> {
        connect(
            &self.cfg.endpoint,
            &format!("lockgate {} cdc {what}", self.cfg.job),
        )
        .await
        .map_err(|e| self.fail(e))
    }

    /// Begins the next piece of the snapshot, or the stream when the snapshot is done.
    async fn next_phase(&mut self) -> Result<()> {
        let next = self.progress.as_ref().and_then(Progress::next_table);
        let Some(table) = next else {
            return self.start_stream().await;
        };
        let client = self.session("snapshot").await?;
        let exported = self.exporter.as_ref().map(|(_, name)| name.clone());
        let piece = Piece::begin(client, &self.cfg, exported.as_deref())
            .await
            .map_err(|r| self.refused(r))?;
        // The piece holds the snapshot now: the exporting session may end.
        if let Some((mut c, _)) = self.exporter.take() {
            c.abort();
        }
        let progress = self.progress.as_mut().expect("a snapshot has progress");
        progress.begin_piece(table, piece.snapshot.clone(), piece.insert_lsn);
        tracing::info!(task = %self.task, table = %progress.table(table).table, snapshot = ?piece.snapshot, "snapshot: reading");
        self.phase = Phase::Snapshot(Box::new(Reading {
            piece,
            table,
            rows: VecDeque::new(),
            exhausted: false,
        }));
        Ok(())
    }

    async fn start_stream(&mut self) -> Result<()> {
        if let Phase::Snapshot(r) = std::mem::replace(&mut self.phase, Phase::Idle) {
            r.piece.end().await;
        }
        let client =
            super::replication::start(&self.cfg, self.position.lsn, self.told, SLOT_PATIENCE)
                .await
                .map_err(|r| self.refused(r))?;
        let keys: HashMap<String, Vec<String>> = self
            .tables
            .iter()
            .map(|t| {
                let names = t
                    .shape
                    .key
                    .iter()
                    .map(|&i| t.shape.columns[i].name.clone())
                    .collect();
                (t.shape.stream.to_string(), names)
            })
            .collect();
        tracing::info!(task = %self.task, slot = %self.cfg.slot, at = %super::lsn::format(self.position.lsn), skip = self.position.skip, "streaming changes");
        self.phase = Phase::Stream(Box::new(Streaming {
            client,
            assembler: Assembler::new(
                self.db.clone(),
                keys,
                self.tables
                    .iter()
                    .map(|t| (t.oid, t.shape.stream.to_string()))
                    .collect(),
                self.position.skip,
            ),
            heard: Instant::now(),
            beat: Instant::now(),
        }));
        Ok(())
    }

    /// One poll of the snapshot: the next rows of the table being read.
    async fn poll_snapshot(&mut self, out: &mut Batch) -> Result<SourcePoll> {
        let task = self.task.clone();
        let Phase::Snapshot(r) = &mut self.phase else {
            unreachable!("called in the snapshot phase")
        };
        let progress = self.progress.as_mut().expect("a snapshot has progress");
        let name = progress.table(r.table).table.clone();
        let Some(info) = r.piece.tables.iter().find(|t| *t.shape.stream == *name) else {
            return Err(err(
                &task,
                format!("table {name} is not among the tables read"),
            ));
        };
        if r.rows.is_empty() && !r.exhausted {
            let after = match &progress.table(r.table).read {
                super::progress::Read::Reading { after } => after.clone(),
                _ => None,
            };
            let rows = r
                .piece
                .chunk(info, after.as_deref(), self.cfg.snapshot_chunk_rows)
                .await
                .map_err(|e| {
                    if e.fatal {
                        JobError::Unrecoverable {
                            task: task.clone(),
                            message: e.message,
                        }
                    } else {
                        err(&task, e.message)
                    }
                })?;
            r.exhausted = (rows.len() as u64) < self.cfg.snapshot_chunk_rows;
            r.rows.extend(rows);
        }
        let now = now_ms();
        let source = EventSource {
            db: &self.db,
            lsn: Some(r.piece.insert_lsn),
            tx_id: None,
            ts_ms: now,
            snapshot: true,
        };
        while out.len() < BATCH {
            let Some(row) = r.rows.pop_front() else { break };
            let cells: Vec<Cell<'_>> = row
                .iter()
                .map(|c| c.as_deref().map_or(Cell::Null, Cell::Text))
                .collect();
            let shape = &info.shape;
            let made = shape.key_texts(&cells).and_then(|key| {
                let k = shape.key_object(&key)?;
                let after = shape.row(&cells)?;
                Ok((key, k, after))
            });
            let (key, k, after) = made.map_err(|e| err(&task, e))?;
            let offset = progress.table(r.table).rows as i64;
            out.push(shape.event(
                Kind::Read,
                Some(&k),
                None,
                Some(after),
                &source,
                offset,
                now,
            ));
            progress.passed(r.table, key);
        }
        if r.rows.is_empty() && r.exhausted {
            progress.finished(r.table);
            tracing::info!(task = %task, table = %progress.table(r.table).table, rows = progress.table(r.table).rows, "snapshot: table read");
            match progress.next_table() {
                Some(next) => {
                    progress.begin_piece(next, r.piece.snapshot.clone(), r.piece.insert_lsn);
                    r.table = next;
                    r.exhausted = false;
                }
                None => {
                    tracing::info!(task = %task, "snapshot: every table read; streaming the changes since");
                    self.start_stream().await?;
                }
            }
        }
        Ok(SourcePoll::Ready)
    }

    /// One poll of the stream: whole transactions, as many as come within the wait.
    async fn poll_stream(&mut self, out: &mut Batch) -> Result<SourcePoll> {
        let task = self.task.clone();
        let deadline = tokio::time::Instant::now() + POLL_WAIT;
        let before = out.len();
        loop {
            let Phase::Stream(s) = &mut self.phase else {
                unreachable!("called in the stream phase")
            };
            let event = match tokio::time::timeout_at(deadline, s.client.recv()).await {
                Err(_) => break,
                Ok(Ok(Some(e))) => e,
                Ok(Ok(None)) => return Err(err(&task, "the replication stream ended")),
                Ok(Err(e)) => return Err(err(&task, format!("the replication stream: {e}"))),
            };
            s.heard = Instant::now();
            match event {
                ReplicationEvent::Begin {
                    xid,
                    commit_time_micros,
                    ..
                } => s
                    .assembler
                    .begin(xid, commit_time_micros)
                    .map_err(|f| fault(&task, f))?,
                ReplicationEvent::XLogData {
                    wal_start, data, ..
                } => {
                    let msg = super::pgoutput::decode(&data).map_err(|e| err(&task, e))?;
                    s.assembler
                        .message(msg, wal_start.as_u64(), self.progress.as_ref(), now_ms())
                        .map_err(|f| fault(&task, f))?;
                    if s.assembler.pending_len() >= self.cfg.transaction_buffer_records {
                        // A transaction larger than the buffer: pass on what it has so
                        // far; a barrier may now fall inside it, and a restore drops
                        // the changes passed on before it.
                        let part = s.assembler.take();
                        let changes = s.assembler.changes();
                        self.pass_on(part, out).await?;
                        self.position.skip = changes;
                    }
                }
                ReplicationEvent::Commit {
                    end_lsn,
                    commit_time_micros,
                    ..
                } => {
                    let events = s.assembler.commit().map_err(|f| fault(&task, f))?;
                    self.pass_on(events, out).await?;
                    self.position = Resume {
                        lsn: end_lsn.as_u64().max(self.position.lsn),
                        skip: 0,
                    };
                    if let Some(m) = &self.metrics {
                        m.committed(super::events::pg_time_ms(commit_time_micros), now_ms());
                    }
                    self.forget_progress_if_passed(out);
                }
                ReplicationEvent::KeepAlive { wal_end, .. } => {
                    // Nothing open: every transaction that committed before the
                    // server's position was sent, so a restart there misses none.
                    // Not while a transaction passed on in part before the restore is
                    // still to come: its remaining changes are after the position.
                    let open = s.assembler.in_transaction() || s.assembler.skipping();
                    if !open && wal_end.as_u64() >= self.position.lsn {
                        if let Some(m) = &self.metrics {
                            m.caught_up();
                        }
                    }
                    if !open && self.position.skip == 0 && wal_end.as_u64() > self.position.lsn {
                        self.position = Resume {
                            lsn: wal_end.as_u64(),
                            skip: 0,
                        };
                        self.forget_progress_if_passed(out);
                    }
                }
                ReplicationEvent::Message { .. } => {}
                ReplicationEvent::StoppedAt { .. } => {
                    return Err(err(&task, "the replication stream stopped"))
                }
            }
            if out.len() - before >= BATCH {
                break;
            }
        }
        self.heartbeat().await;
        if let (Some(end), Phase::Stream(s)) = (self.end, &self.phase) {
            // Also past everything the snapshot's pieces saw (a piece taken after the
            // end, by a restore, saw later changes): the deletes held for rows an
            // interrupted snapshot left behind have gone out then, after every change
            // that could release them.
            if self.position.lsn >= end
                && self.progress.is_none()
                && !s.assembler.in_transaction()
                && !s.assembler.skipping()
            {
                tracing::info!(task = %task, end = %super::lsn::format(end), "read every change up to the position at the first start");
                self.finished = true;
            }
        }
        Ok(if out.len() > before {
            SourcePoll::Ready
        } else {
            SourcePoll::Idle
        })
    }

    /// Writes a heartbeat into the WAL when nothing came for `heartbeat_ms`, so that
    /// the position advances even where nothing else writes.
    async fn heartbeat(&mut self) {
        // The lag is measured at the heartbeat's interval, or every 10 s without one.
        let every = match self.cfg.heartbeat_ms {
            0 => 10_000,
            ms => ms,
        };
        let Phase::Stream(s) = &mut self.phase else {
            return;
        };
        if s.beat.elapsed() < Duration::from_millis(every) {
            return;
        }
        s.beat = Instant::now();
        let quiet = s.heard.elapsed() >= Duration::from_millis(every);
        let Some(sql) = &self.sql else { return };
        if quiet && self.cfg.heartbeat_ms > 0 {
            if let Err(e) = sql
                .batch_execute("SELECT pg_logical_emit_message(false, 'lockgate_heartbeat', '')")
                .await
            {
                tracing::warn!(task = %self.task, error = %describe(&e), "the heartbeat could not be written");
            }
        }
        if let (Some(m), Ok(current)) = (&self.metrics, catalog::current_lsn(sql).await) {
            m.behind(current.saturating_sub(self.position.lsn));
        }
    }

    fn forget_progress_if_passed(&mut self, out: &mut Batch) {
        if self
            .progress
            .as_ref()
            .is_some_and(|p| p.passed_by(self.position.lsn))
        {
            let held = self.ghosts.drain();
            tracing::info!(task = %self.task, at = %super::lsn::format(self.position.lsn), deletes = held.len(), "the stream passed everything the snapshot read");
            out.extend(held);
            self.progress = None;
        }
    }

    /// Passes on the events a change stream decided to keep, asking the server where
    /// the keys lie that only it can place.
    async fn pass_on(&mut self, events: Vec<Pending>, out: &mut Batch) -> Result<()> {
        let by_key: Vec<usize> = events
            .iter()
            .enumerate()
            .filter(|(_, p)| p.decision == Decision::ByKey)
            .map(|(i, _)| i)
            .collect();
        let mut decided: HashMap<usize, Decision> = HashMap::new();
        if !by_key.is_empty() {
            let progress = self.progress.as_ref().expect("ByKey comes of a progress");
            let mut tables: HashMap<&str, Vec<usize>> = HashMap::new();
            for &i in &by_key {
                tables.entry(&events[i].table).or_default().push(i);
            }
            for (table, idx) in tables {
                let t = progress
                    .tables
                    .iter()
                    .find(|t| t.table == table)
                    .expect("a table the progress decided");
                let keys: Vec<Vec<String>> = idx.iter().map(|&i| events[i].key.clone()).collect();
                tracing::debug!(task = %self.task, table, keys = keys.len(), "placing keys among the snapshot's pieces");
                let sql = boundaries_sql(&t.key_types, &progress.boundaries(table), &keys);
                let rows =
                    self.sql().query(sql.as_str(), &[]).await.map_err(|e| {
                        self.fail(format!("placing keys of {table}: {}", describe(&e)))
                    })?;
                for row in rows {
                    let (i, above): (i32, i32) = (row.get(0), row.get(1));
                    let at = idx[i as usize];
                    let xid = events[at].xid;
                    decided.insert(at, progress.decide_in_piece(table, above as usize, xid));
                }
            }
        }
        if let Some(i) = by_key.iter().find(|i| !decided.contains_key(i)) {
            return Err(self.fail(format!(
                "the server did not place key {:?} of {} among the snapshot's pieces",
                events[*i].key, events[*i].table
            )));
        }
        for (i, p) in events.into_iter().enumerate() {
            match decided.get(&i).copied().unwrap_or(p.decision) {
                Decision::Emit => {
                    if let Some(d) = self.ghosts.before(&p.table, &p.key) {
                        out.push(d);
                    }
                    out.push(p.record);
                }
                _ => self.ghosts.seen(&p.table, &p.key, &p.record),
            }
        }
        Ok(())
    }

    /// Opens the reading subtask: checks the server, the tables and the publication,
    /// finds or creates the slot, and decides where to start.
    async fn open_reader(&mut self, restored: Option<&[SourcePosition]>) -> Result<()> {
        let sql = self.session("catalog").await?;
        catalog::set_session(&sql)
            .await
            .map_err(|r| self.refused(r))?;
        let server = catalog::check_server(&sql)
            .await
            .map_err(|r| self.refused(r))?;
        self.db = server.database;
        self.tables = catalog::tables(&sql, &self.cfg)
            .await
            .map_err(|r| self.refused(r))?;
        catalog::ensure_publication(&sql, &self.cfg, server.version)
            .await
            .map_err(|r| self.refused(r))?;
        let slot = catalog::slot(&sql, &self.cfg.slot)
            .await
            .map_err(|r| self.refused(r))?;
        if let Some(s) = &slot {
            if let Some(why) = catalog::unusable(&self.cfg.slot, s, &self.db) {
                return Err(self.refused(Refusal::fatal(why)));
            }
        }
        let start =
            split_start_as::<Resume>(restored, &self.cfg.slot, 0).map_err(JobError::Restore)?;
        let initial = self.cfg.snapshot == SnapshotMode::Initial;
        let keyed = || {
            Progress::new(
                self.tables
                    .iter()
                    .map(|t| (t.shape.stream.to_string(), t.key_types.clone()))
                    .collect(),
            )
        };
        match start {
            SplitStartAs::Restored(p) => {
                let Some(s) = &slot else {
                    return Err(self.refused(Refusal::fatal(format!(
                        "replication slot {} (key slot) is gone: the changes since the checkpoint cannot be read. Start the job without a checkpoint (a new snapshot)",
                        self.cfg.slot
                    ))));
                };
                let confirmed = s.confirmed_flush.unwrap_or(0);
                if let Some(why) = behind_slot(p.lsn, confirmed) {
                    return Err(self.refused(Refusal::fatal(format!(
                        "replication slot {}: {why}",
                        self.cfg.slot
                    ))));
                }
                self.position = p;
                self.told = confirmed;
                self.confirms.restored(p.lsn);
                let state = self.restored.take().unwrap_or_default();
                if let Some(p) = state.progress.as_ref().filter(|p| !p.done()) {
                    let held: Vec<&str> = p.tables.iter().map(|t| t.table.as_str()).collect();
                    let named: Vec<String> = self.cfg.tables.iter().map(|t| t.stream()).collect();
                    if held != named {
                        return Err(self.refused(Refusal::fatal(format!(
                            "the tables changed while the initial snapshot was read (the checkpoint's: {held:?}; the job file's: {named:?}): restore with the checkpoint's tables, or start the job without a checkpoint"
                        ))));
                    }
                }
                self.progress = state.progress.map(Progress::restored);
                self.end = state.end;
                self.ghosts = state.ghosts;
            }
            SplitStartAs::Fresh => {
                match &slot {
                    Some(s) => {
                        self.position = Resume {
                            lsn: s.confirmed_flush.unwrap_or(0),
                            skip: 0,
                        };
                        self.told = self.position.lsn;
                        tracing::info!(task = %self.task, slot = %self.cfg.slot, at = %super::lsn::format(self.position.lsn), "using the existing replication slot");
                    }
                    None => {
                        let (point, exporter) = super::replication::create_slot(&self.cfg, initial)
                            .await
                            .map_err(|r| self.refused(r))?;
                        self.position = Resume {
                            lsn: point,
                            skip: 0,
                        };
                        self.told = point;
                        self.exporter = exporter;
                    }
                }
                self.progress = initial.then(keyed);
            }
            SplitStartAs::NotInCheckpoint => {
                return Err(JobError::Restore(format!(
                    "the checkpoint holds no position of replication slot {} (was the slot renamed?)",
                    self.cfg.slot
                )));
            }
        }
        if self.cfg.bounded && self.end.is_none() {
            let end = catalog::current_lsn(&sql)
                .await
                .map_err(|r| self.refused(r))?;
            tracing::info!(task = %self.task, end = %super::lsn::format(end), "bounded: reading the changes up to the WAL position now");
            self.end = Some(end);
        }
        self.sql = Some(sql);
        self.next_phase().await
    }
}

#[async_trait]
impl Source for CdcSource {
    async fn open(
        &mut self,
        info: &SubtaskInfo,
        restored: Option<&[SourcePosition]>,
    ) -> Result<()> {
        self.task = info.name.clone();
        if !info.reads(&self.cfg.slot, 0) {
            return Ok(());
        }
        self.metrics = Some(super::metrics::Lag::new(
            &info.telemetry,
            &info.job,
            &self.cfg.slot,
        ));
        self.open_reader(restored).await
    }

    async fn poll(&mut self, out: &mut Batch) -> Result<SourcePoll> {
        if self.finished || (self.cfg.bounded && matches!(self.phase, Phase::Idle)) {
            return Ok(SourcePoll::Finished);
        }
        match &self.phase {
            Phase::Idle => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok(SourcePoll::Idle)
            }
            Phase::Snapshot(_) => self.poll_snapshot(out).await,
            Phase::Stream(_) => self.poll_stream(out).await,
        }
    }

    fn snapshot(&mut self, id: CheckpointId) -> Result<Vec<SourcePosition>> {
        if self.sql.is_none() {
            return Ok(Vec::new());
        }
        self.confirms.taken(id, self.position.lsn);
        Ok(vec![self.position.to_position(&self.cfg.slot, 0)])
    }

    fn snapshot_state(&mut self, _id: CheckpointId) -> Result<Option<Vec<u8>>> {
        if self.sql.is_none() || (self.progress.is_none() && self.end.is_none()) {
            return Ok(None);
        }
        let state = State {
            version: VERSION,
            progress: self.progress.clone(),
            end: self.end,
            ghosts: self.ghosts.clone(),
        };
        Ok(Some(
            serde_json::to_vec(&state).expect("the state serializes"),
        ))
    }

    fn restore_state(&mut self, states: &[(u16, Vec<u8>)]) -> Result<()> {
        for (_, bytes) in states.iter().filter(|(_, b)| !b.is_empty()) {
            let s: State = serde_json::from_slice(bytes).map_err(|e| {
                JobError::Restore(format!(
                    "the change data capture source's state in the checkpoint: {e}"
                ))
            })?;
            if s.version != VERSION {
                return Err(JobError::Restore(format!(
                    "the change data capture source's state in the checkpoint is of version {}, this lockgate reads {VERSION}",
                    s.version
                )));
            }
            self.restored = Some(s);
        }
        Ok(())
    }

    async fn notify_checkpoint_complete(&mut self, id: CheckpointId) -> Result<()> {
        let Some(lsn) = self.confirms.completed(id) else {
            return Ok(());
        };
        if lsn > self.told {
            self.told = lsn;
            if let Phase::Stream(s) = &self.phase {
                s.client.update_applied_lsn(Lsn::from_u64(lsn));
            }
            tracing::debug!(task = %self.task, confirmed = %super::lsn::format(lsn), checkpoint = id.0, "told the slot");
        }
        Ok(())
    }

    async fn notify_checkpoint_aborted(&mut self, id: CheckpointId) -> Result<()> {
        self.confirms.aborted(id);
        Ok(())
    }

    async fn close(&mut self) -> Result<()> {
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Stream(mut s) => {
                let _ = s.client.shutdown().await;
            }
            Phase::Snapshot(r) => r.piece.end().await,
            Phase::Idle => {}
        }
        Ok(())
    }
}
