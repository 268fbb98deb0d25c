//! The window operator: keyed window contents in RocksDB, timers in memory, fired by
//! the watermark.

use super::aggregate::Acc;
use super::assign::{merge, Arrival, Span};
use super::section::WindowSpec;
use crate::connector::{KafkaCluster, Operator, OperatorContext};
use crate::dead_letter::{Letters, LettersOf, OnError, Reason};
use crate::error::{JobError, Result};
use crate::kits::keyed::{partition_scope, scope_of};
use crate::record::describe;
use crate::record::{Batch, Op, Record};
use crate::telemetry::event_time::{seconds, EventTimeMetrics};
use lockgate_state::backend::{state_key, StateBatch};
use lockgate_state::keygroup::key_group_of;
use lockgate_state::{CheckpointId, KeyGroup, KeyedStateBackend, SubtaskSnapshot};
use prometheus::{Gauge, IntCounter, IntGauge};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

/// State name of a key's windows.
const WINDOWS: &str = "w";
/// State name of the watermark the operator had reached, per key group (empty key).
const REACHED: &str = "wm";

/// One window of one key, as kept in state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Win {
    span: Span,
    accs: Vec<Acc>,
    /// A result of it was emitted (it is emitted again when it changes, and retracted
    /// when a session merges it into one that starts elsewhere).
    emitted: bool,
    /// To be emitted at the end of the batch (never true in state).
    #[serde(skip)]
    due: bool,
}

fn codec() -> impl bincode::config::Config {
    bincode::config::standard()
}

fn decode(bytes: &[u8]) -> Result<Vec<Win>> {
    bincode::serde::decode_from_slice(bytes, codec())
        .map(|(v, _)| v)
        .map_err(|e| JobError::Other(format!("decoding window state: {e}")))
}

/// What became of a record.
enum Added {
    Yes,
    /// Every window of it is past its lateness.
    Late,
    /// It cannot be added (`on_error`): why.
    Refused(String),
}

/// A key's windows while a batch or a watermark works on them.
struct Entry {
    group: KeyGroup,
    wins: Vec<Win>,
    dirty: bool,
}

/// The metric handles of a subtask.
struct Meters {
    /// Created with the first watermark.
    watermark: Option<Gauge>,
    family: Arc<EventTimeMetrics>,
    job: String,
    open: IntGauge,
    fired: IntCounter,
    dropped: IntCounter,
    dead_lettered: IntCounter,
    updated: IntCounter,
}

/// The reasons of a window's dead letters: late records (`late`), records it cannot
/// read (`transform`).
pub(crate) const LETTERS: &[Reason] = &[Reason::Late, Reason::Transform];

/// Runs one subtask of a window transform.
pub struct WindowOperator {
    spec: Arc<WindowSpec>,
    kafka: Option<KafkaCluster>,
    backend: Option<KeyedStateBackend>,
    letters: Letters,
    uid: String,
    subtask: u16,
    max_parallelism: u16,
    name: String,
    /// The watermark received (the beginning of time until one comes).
    watermark: i64,
    /// The highest watermark received below the end of time: what a checkpoint keeps
    /// as reached (the end of a bounded input must not make every record of a later,
    /// live run late).
    finite: i64,
    /// The watermark each key group (and, in a co_partitioned job, each source
    /// partition's share of it) had reached in the restored checkpoint: lateness is
    /// decided against the higher of it and the watermark received, so that a record
    /// that was late before a restore is late after it (and never opens again a
    /// window that was emitted and purged).
    reached: HashMap<(u16, Vec<u8>), i64>,
    /// A co_partitioned job: state keys are the key after its source partition
    /// ([`partition_scope`]), so that a member takes the state of its partitions.
    scoped: bool,
    /// The partition scopes seen or restored (scoped only).
    scopes: BTreeSet<Vec<u8>>,
    /// `(when, key)`: something happens to a window of `key` at `when` (its final
    /// emission or its purge). A stale entry is harmless: the key is looked at and
    /// nothing is due.
    timers: BTreeSet<(i64, Vec<u8>)>,
    /// The keys a batch or a watermark touched, written at its end.
    cache: HashMap<Vec<u8>, Entry>,
    /// Emitted windows a session merged into one starting elsewhere: their results
    /// are deleted.
    retracted: Vec<(Vec<u8>, Span)>,
    open_windows: i64,
    meters: Option<Meters>,
    needs_value: bool,
}

impl WindowOperator {
    /// A subtask of `spec`; late records and records it fails on go to `kafka`'s
    /// dead-letter topics when a policy says so.
    pub fn new(spec: Arc<WindowSpec>, kafka: Option<KafkaCluster>) -> WindowOperator {
        WindowOperator {
            needs_value: spec.aggregates.iter().any(|(_, a)| a.field().is_some()),
            spec,
            kafka,
            backend: None,
            letters: Letters::default(),
            uid: String::new(),
            subtask: 0,
            max_parallelism: 1,
            name: String::new(),
            watermark: i64::MIN,
            finite: i64::MIN,
            reached: HashMap::new(),
            scoped: false,
            scopes: BTreeSet::new(),
            timers: BTreeSet::new(),
            cache: HashMap::new(),
            retracted: Vec::new(),
            open_windows: 0,
            meters: None,
        }
    }

    fn backend(&self) -> &KeyedStateBackend {
        self.backend.as_ref().expect("opened")
    }

    /// A state key's partition scope (empty unless scoped) and the key itself.
    fn split<'k>(&self, skey: &'k [u8]) -> (&'k [u8], &'k [u8]) {
        let key_len = if self.scoped {
            split_scoped(skey).len()
        } else {
            skey.len()
        };
        skey.split_at(skey.len() - key_len)
    }

    /// The key group of a state key (by the key, as the exchange routed it).
    fn group(&self, skey: &[u8]) -> KeyGroup {
        key_group_of(self.split(skey).1, self.max_parallelism)
    }

    /// The watermark lateness is decided against, for state key `skey`.
    fn late_watermark(&self, skey: &[u8]) -> i64 {
        let (scope, key) = self.split(skey);
        let group = key_group_of(key, self.max_parallelism);
        self.reached
            .get(&(group.0, scope.to_vec()))
            .map_or(self.watermark, |r| self.watermark.max(*r))
    }

    /// `key`'s windows, loaded into the cache.
    fn entry(&mut self, key: &[u8], group: KeyGroup) -> Result<&mut Entry> {
        if !self.cache.contains_key(key) {
            let wins = match self.backend().get_raw(&state_key(group, WINDOWS, key))? {
                Some(bytes) => decode(&bytes)?,
                None => Vec::new(),
            };
            self.cache.insert(
                key.to_vec(),
                Entry {
                    group,
                    wins,
                    dirty: false,
                },
            );
        }
        Ok(self.cache.get_mut(key).expect("inserted"))
    }

    /// The event time and aggregated fields of a record, or why it has none.
    fn read(&self, r: &Record) -> Result<(i64, Vec<Option<Value>>), String> {
        if r.tombstone || r.op == Op::Delete {
            return Err(format!(
                "a window aggregates records written, and this one is a {} (filter them out before the window)",
                if r.op == Op::Delete { "delete" } else { "tombstone" }
            ));
        }
        let t = r
            .timestamp
            .ok_or("the record has no event time (set [source.kafka.watermark])")?;
        if !self.needs_value {
            return Ok((t, vec![None; self.spec.aggregates.len()]));
        }
        let v: Value =
            serde_json::from_slice(&r.value).map_err(|e| format!("the value is not JSON: {e}"))?;
        let fields = self
            .spec
            .aggregates
            .iter()
            .map(|(_, a)| a.field().and_then(|p| v.pointer(p)).cloned())
            .collect();
        Ok((t, fields))
    }

    /// Adds a record of `key` at `t`: [`Added::Late`] when every window of it is past
    /// its lateness (nothing added), [`Added::Refused`] when it cannot be added
    /// (nothing changed either). A state error is the job's.
    fn add(&mut self, key: &[u8], t: i64, fields: &[Option<Value>]) -> Result<Added> {
        let group = self.group(key);
        let wm = self.late_watermark(key);
        let spec = self.spec.clone();
        let timing = spec.timing;
        let Some(spans) = spec.kind.spans(t) else {
            return Ok(Added::Refused(format!(
                "event time {t} is outside the range windows can hold"
            )));
        };
        let arrivals: Vec<(Span, Arrival)> = spans
            .into_iter()
            .map(|s| (s, timing.arrival(s.end, wm)))
            .filter(|(_, a)| *a != Arrival::TooLate)
            .collect();
        if arrivals.is_empty() {
            return Ok(Added::Late);
        }
        let mut accs = Vec::with_capacity(spec.aggregates.len());
        for ((name, a), v) in spec.aggregates.iter().zip(fields) {
            let mut acc = a.empty();
            if let Err(e) = acc.add(v.as_ref()) {
                return Ok(Added::Refused(format!("aggregate {name}: {e}")));
            }
            accs.push(acc);
        }
        let late = arrivals.iter().all(|(_, a)| *a == Arrival::Update);
        // Results of a session may have gone out under a start the merge drops: with
        // every change emitted, which starts did depends on how records were batched,
        // which a replay does not repeat, so each dropped start is deleted.
        let retract_all = !timing.emit_final || timing.late_updates;
        let entry = self.entry(key, group)?;
        // The windows after the record, built aside: a refusal changes nothing.
        let mut wins = entry.wins.clone();
        let mut timers = Vec::new();
        let mut stale = Vec::new();
        let mut retracted = Vec::new();
        for (span, _) in arrivals {
            let at = if spec.kind.merges() {
                let existing: Vec<Span> = wins.iter().map(|w| w.span).collect();
                let (joined, merged) = merge(&existing, span);
                let mut win = Win {
                    span: merged,
                    accs: accs.clone(),
                    emitted: false,
                    due: false,
                };
                for i in joined.iter().rev() {
                    let old = wins.remove(*i);
                    for (a, b) in win.accs.iter_mut().zip(&old.accs) {
                        if let Err(e) = a.merge(b) {
                            return Ok(Added::Refused(e));
                        }
                    }
                    win.emitted |= old.emitted;
                    stale.push(timing.next_event(old.span.end, old.emitted));
                    if old.span.start != merged.start && (old.emitted || retract_all) {
                        retracted.push(old.span);
                    }
                }
                if retract_all && span.start != merged.start {
                    retracted.push(span);
                }
                timers.push(timing.next_event(merged.end, win.emitted));
                let at = wins.partition_point(|w| w.span < merged);
                wins.insert(at, win);
                at
            } else {
                match wins.binary_search_by(|w| w.span.cmp(&span)) {
                    Ok(i) => {
                        let mut merged = wins[i].accs.clone();
                        for (a, b) in merged.iter_mut().zip(&accs) {
                            if let Err(e) = a.merge(b) {
                                return Ok(Added::Refused(e));
                            }
                        }
                        wins[i].accs = merged;
                        i
                    }
                    Err(i) => {
                        timers.push(timing.next_event(span.end, false));
                        wins.insert(
                            i,
                            Win {
                                span,
                                accs: accs.clone(),
                                emitted: false,
                                due: false,
                            },
                        );
                        i
                    }
                }
            };
            let w = &mut wins[at];
            // Emitted on every change; or again once emitted (a late update); or now,
            // when a late record opens a window already complete.
            w.due = !timing.emit_final || w.emitted || timing.complete_at(w.span.end) <= wm;
        }
        let created = wins.len() as i64 - entry.wins.len() as i64;
        // A merged session's timer goes, unless another window of the key still needs
        // that moment.
        stale.retain(|at| {
            !wins
                .iter()
                .any(|w| timing.next_event(w.span.end, w.emitted) == *at)
        });
        entry.wins = wins;
        entry.dirty = true;
        self.open_windows += created;
        for at in stale {
            self.timers.remove(&(at, key.to_vec()));
        }
        for at in timers {
            self.timers.insert((at, key.to_vec()));
        }
        self.retracted
            .extend(retracted.into_iter().map(|s| (key.to_vec(), s)));
        if late {
            if let Some(m) = &self.meters {
                m.updated.inc();
            }
        }
        Ok(Added::Yes)
    }

    /// Writes what the batch or watermark changed, and emits the windows due: the
    /// retractions first.
    fn flush(&mut self, out: &mut Batch) -> Result<()> {
        for (key, span) in std::mem::take(&mut self.retracted) {
            out.push(result(self.split(&key).1, span, None));
        }
        if self.cache.is_empty() {
            return Ok(());
        }
        let mut wb = StateBatch::default();
        let mut fired = 0u64;
        let scoped = self.scoped;
        for (key, mut e) in self.cache.drain() {
            let raw = if scoped { split_scoped(&key) } else { &key[..] };
            for w in e.wins.iter_mut().filter(|w| w.due) {
                out.push(result(raw, w.span, Some((&self.spec, &w.accs))));
                w.due = false;
                w.emitted = true;
                e.dirty = true;
                fired += 1;
            }
            if !e.dirty {
                continue;
            }
            if e.wins.is_empty() {
                wb.delete(e.group, WINDOWS, &key);
            } else {
                let bytes = bincode::serde::encode_to_vec(&e.wins, codec())
                    .map_err(|err| JobError::Other(format!("encoding window state: {err}")))?;
                wb.put_raw(&state_key(e.group, WINDOWS, &key), &bytes);
            }
        }
        if !wb.is_empty() {
            self.backend().write(wb)?;
        }
        if let Some(m) = &self.meters {
            m.fired.inc_by(fired);
            m.open.set(self.open_windows);
        }
        Ok(())
    }

    /// A record whose windows are all past their lateness.
    fn late(&mut self, r: Record, key: &[u8], t: i64) -> Result<()> {
        let why = format!(
            "{}: late: its event time {t} belongs to windows past their lateness at watermark {}",
            describe(&r),
            self.late_watermark(key)
        );
        match &self.spec.late {
            OnError::Skip => {
                if let Some(m) = &self.meters {
                    m.dropped.inc();
                    if m.dropped.get().is_power_of_two() {
                        tracing::warn!(task = %self.name, reason = %why, dropped = m.dropped.get(), "dropping late records");
                    }
                }
                Ok(())
            }
            OnError::DeadLetter(topic) => {
                self.letters.write(topic, &r, &why, Reason::Late)?;
                if let Some(m) = &self.meters {
                    m.dead_lettered.inc();
                }
                Ok(())
            }
            // Not a spelling of `late`: a program's own spec fails the job.
            OnError::Fail => Err(JobError::Other(why)),
        }
    }

    /// A record the window cannot read: as `on_error` says.
    fn failed(&mut self, r: Record, e: String) -> Result<()> {
        let why = format!("{}: window: {e}", describe(&r));
        self.letters.refuse(
            &self.spec.on_error,
            &r,
            why,
            Reason::Transform,
            "skipping records the window cannot read (on_error = \"skip\")",
        )
    }
}

/// The key of a partition-scoped state key.
fn split_scoped(skey: &[u8]) -> &[u8] {
    scope_of(skey).map_or(skey, |(stream, _)| &skey[2 + stream.len() + 4..])
}

/// A key's text: a JSON string's own text, any other JSON value as written.
fn key_text(key: &[u8]) -> String {
    match serde_json::from_slice::<Value>(key) {
        Ok(Value::String(s)) => s,
        _ => String::from_utf8_lossy(key).into_owned(),
    }
}

/// The result of window `span` of `key`: `{key, window_start, window_end, window_id,
/// <aggregates>}` timed at the window's end; without aggregates, the delete of it.
fn result(key: &[u8], span: Span, aggregates: Option<(&WindowSpec, &[Acc])>) -> Record {
    let text = key_text(key);
    let mut doc = serde_json::Map::new();
    doc.insert(
        "window_id".into(),
        Value::from(format!("{text}@{}", span.start)),
    );
    doc.insert("window_start".into(), Value::from(span.start));
    doc.insert("window_end".into(), Value::from(span.end));
    if let Some((spec, accs)) = aggregates {
        for ((name, _), acc) in spec.aggregates.iter().zip(accs) {
            doc.insert(name.clone(), acc.json());
        }
    }
    doc.insert("key".into(), Value::String(text.clone()));
    Record {
        key: Some(text.into_bytes().into()),
        value: serde_json::to_vec(&doc)
            .expect("a JSON value serializes")
            .into(),
        timestamp: Some(span.end),
        op: if aggregates.is_some() {
            Op::Upsert
        } else {
            Op::Delete
        },
        ..Record::default()
    }
}

impl Operator for WindowOperator {
    fn open(&mut self, ctx: &OperatorContext) -> Result<()> {
        self.scoped = ctx.partition_scoped;
        let range = lockgate_state::keygroup::range_for_subtask(
            ctx.info.max_parallelism,
            ctx.info.parallelism,
            ctx.info.index,
        );
        let backend =
            KeyedStateBackend::open_with(&ctx.work_dir, range, &ctx.restore, &ctx.state_options)?;
        self.uid = ctx.uid.clone();
        self.subtask = ctx.info.index;
        self.max_parallelism = ctx.info.max_parallelism;
        self.name = format!("{}[{}]", ctx.uid, ctx.info.index);
        self.watermark = i64::MIN;
        self.finite = i64::MIN;
        self.cache.clear();
        self.retracted.clear();
        // What is kept in memory about the state is rebuilt from it.
        let (timing, mut timers, mut open) = (self.spec.timing, BTreeSet::new(), 0i64);
        let mut scopes = BTreeSet::new();
        let scoped = self.scoped;
        backend.for_each(WINDOWS, |_, key, bytes| -> Result<()> {
            if scoped {
                scopes.insert(key[..key.len() - split_scoped(key).len()].to_vec());
            }
            for w in decode(bytes)? {
                timers.insert((timing.next_event(w.span.end, w.emitted), key.to_vec()));
                open += 1;
            }
            Ok(())
        })?;
        let mut reached = HashMap::new();
        let fingerprint = self.spec.fingerprint();
        backend.for_each(REACHED, |group, scope, bytes| -> Result<()> {
            let (wm, made_by) = bytes.split_at_checked(8).ok_or_else(|| {
                JobError::Other("window state: a watermark of the wrong size".into())
            })?;
            // Window contents are kept in the order of their aggregates, and only a
            // window of the same kind and size means the same thing.
            if made_by != fingerprint.as_bytes() {
                return Err(JobError::Restore(format!(
                    "{}: the checkpoint's windows were made by another window definition ({}) than this job file's ({fingerprint}); start without its state, or keep the definition",
                    ctx.uid,
                    String::from_utf8_lossy(made_by)
                )));
            }
            let wm: [u8; 8] = wm.try_into().expect("split at 8");
            reached.insert((group.0, scope.to_vec()), i64::from_be_bytes(wm));
            if scoped {
                scopes.insert(scope.to_vec());
            }
            Ok(())
        })?;
        self.scopes = scopes;
        self.timers = timers;
        self.open_windows = open;
        self.reached = reached;
        self.backend = Some(backend);
        let m = ctx.info.telemetry.metrics();
        let e = EventTimeMetrics::of(m);
        let late = |outcome: &str| {
            e.late_records.with_label_values(&[
                m.job(),
                &ctx.uid,
                &ctx.info.index.to_string(),
                outcome,
            ])
        };
        self.meters = Some(Meters {
            watermark: None,
            family: e.clone(),
            job: m.job().to_string(),
            open: m.task_gauge(&e.windows_open, &ctx.uid, ctx.info.index),
            fired: m.task_counter(&e.windows_fired, &ctx.uid, ctx.info.index),
            dropped: late("dropped"),
            dead_lettered: late("dead_lettered"),
            updated: late("updated"),
        });
        if let Some(m) = &self.meters {
            m.open.set(open);
        }
        self.letters.open(
            LettersOf {
                task: self.name.clone(),
                what: "a window",
                metrics: m,
                operator: &ctx.uid,
                subtask: ctx.info.index,
                reasons: LETTERS,
            },
            &[&self.spec.late, &self.spec.on_error],
            self.kafka
                .as_ref()
                .map(|k| (k.bootstrap_servers.as_str(), &k.properties)),
        )?;
        tracing::info!(task = %self.name, windows = open, "window state opened");
        Ok(())
    }

    fn process(&mut self, batch: Batch, out: &mut Batch) -> Result<()> {
        for mut r in batch {
            let mut key = r.route_key.take().ok_or_else(|| {
                JobError::task(&self.name, "the window received a record without a key")
            })?;
            if self.scoped {
                // A restart cannot cure this: the same records come again.
                let o = r.origin.as_ref().ok_or_else(|| JobError::Unrecoverable {
                    task: self.name.clone(),
                    message:
                        "a co_partitioned job's window received a record without a source partition"
                            .into(),
                })?;
                let mut scoped = Vec::with_capacity(key.len() + o.stream.len() + 6);
                partition_scope(&mut scoped, &o.stream, o.partition);
                if !self.scopes.contains(&scoped) {
                    self.scopes.insert(scoped.clone());
                }
                scoped.extend_from_slice(&key);
                key = scoped;
            }
            match self.read(&r) {
                Ok((t, fields)) => match self.add(&key, t, &fields)? {
                    Added::Yes => {}
                    Added::Late => self.late(r, &key, t)?,
                    Added::Refused(e) => self.failed(r, e)?,
                },
                Err(e) => self.failed(r, e)?,
            }
        }
        self.flush(out)
    }

    fn on_watermark(&mut self, watermark: i64, out: &mut Batch) -> Result<()> {
        self.watermark = self.watermark.max(watermark);
        if watermark < crate::event_time::END_OF_TIME {
            self.finite = self.finite.max(watermark);
        }
        let wm = self.watermark;
        if let (Some(m), Some(s)) = (self.meters.as_mut(), seconds(wm)) {
            // The series appears with its first value, never as 0.
            m.watermark
                .get_or_insert_with(|| m.family.operator_watermark(&m.job, &self.uid, self.subtask))
                .set(s);
        }
        let timing = self.spec.timing;
        let spec = self.spec.clone();
        let fired = self.meters.as_ref().map(|m| m.fired.clone());
        // Below the end of time the two are one; at it, windows are kept per `finite`
        // (their timers come back from the state at the next open).
        let finite = if wm == crate::event_time::END_OF_TIME {
            self.finite
        } else {
            wm
        };
        while self.timers.first().is_some_and(|(at, _)| *at <= wm) {
            let (_, key) = self.timers.pop_first().expect("looked at");
            let group = self.group(&key);
            let raw = self.split(&key).1.to_vec();
            let entry = self.entry(&key, group)?;
            let before = entry.wins.len();
            let mut next = Vec::new();
            let mut emitted = false;
            entry.wins.retain_mut(|w| {
                if timing.emit_final && !w.emitted && timing.complete_at(w.span.end) <= wm {
                    out.push(result(&raw, w.span, Some((&spec, &w.accs))));
                    w.emitted = true;
                    emitted = true;
                    if let Some(c) = &fired {
                        c.inc();
                    }
                }
                // The end of a bounded input emits every window but deletes only
                // those past their lateness at the last real watermark: a later run
                // from this checkpoint adds to the others and emits them whole again,
                // rather than opening them empty under the same id.
                let keep = timing.purge_at(w.span.end) > finite;
                let at = timing.next_event(w.span.end, w.emitted);
                if keep && at > wm {
                    next.push(at);
                }
                keep
            });
            if emitted || entry.wins.len() != before {
                entry.dirty = true;
            }
            self.open_windows -= (before - entry.wins.len()) as i64;
            for at in next {
                self.timers.insert((at, key.clone()));
            }
        }
        self.flush(out)
    }

    fn snapshot(
        &mut self,
        _id: CheckpointId,
        pending_dir: &Path,
    ) -> Result<Option<SubtaskSnapshot>> {
        let range = self.backend().key_groups();
        let fingerprint = self.spec.fingerprint();
        let mut wb = StateBatch::default();
        let unscoped = [Vec::new()];
        let scopes: Vec<&Vec<u8>> = if self.scoped {
            self.scopes.iter().collect()
        } else {
            unscoped.iter().collect()
        };
        for g in range.start..=range.end {
            for scope in &scopes {
                let reached = self
                    .reached
                    .get(&(g, scope.to_vec()))
                    .map_or(self.finite, |r| self.finite.max(*r));
                let mut value = reached.to_be_bytes().to_vec();
                value.extend_from_slice(fingerprint.as_bytes());
                wb.put_raw(&state_key(KeyGroup(g), REACHED, scope), &value);
            }
        }
        let backend = self.backend.as_mut().expect("opened");
        if !wb.is_empty() {
            backend.write(wb)?;
        }
        crate::kits::keyed::snapshot_backend(backend, &self.uid, self.subtask, pending_dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::window::section::WindowSection;
    use serde_json::json;
    use std::path::PathBuf;

    fn spec(toml_text: &str) -> Arc<WindowSpec> {
        let s: WindowSection = toml::from_str(toml_text).unwrap();
        let cx = crate::connector::SectionContext {
            job_name: "j".into(),
            base_dir: ".".into(),
            parallelism: 1,
            max_parallelism: 8,
            checkpoint_timeout_ms: 1000,
            formats: crate::formats::Formats::builtin(),
            source_kafka: None,
            event_time: true,
        };
        Arc::new(s.spec(&cx).unwrap())
    }

    /// Subtask 0 of 1 of `spec`, working in `work_dir`, restored from `restore`.
    fn try_open(
        spec: &Arc<WindowSpec>,
        work_dir: PathBuf,
        restore: Vec<lockgate_state::StateRestore>,
    ) -> Result<WindowOperator> {
        let mut op = WindowOperator::new(spec.clone(), None);
        let ctx = OperatorContext {
            info: crate::connector::SubtaskInfo::new("j", "window-0", 0, 1)
                .with_max_parallelism(8)
                .with_telemetry(crate::telemetry::Telemetry::new("j", "g", 1, 8)),
            uid: "window-0".into(),
            work_dir,
            restore,
            state_options: lockgate_state::BackendOptions::default(),
            partition_scoped: false,
        };
        op.open(&ctx).map(|()| op)
    }

    fn open(
        spec: &Arc<WindowSpec>,
        dir: &Path,
        restore: Vec<lockgate_state::StateRestore>,
    ) -> WindowOperator {
        try_open(spec, dir.join("work"), restore).unwrap()
    }

    fn rec(user: &str, t: i64, amount: i64) -> Record {
        let mut r = Record::from_value(
            serde_json::to_vec(&json!({"user": user, "amount": amount})).unwrap(),
        );
        r.route_key = Some(serde_json::to_vec(&json!(user)).unwrap());
        r.timestamp = Some(t);
        r
    }

    fn docs(out: &Batch) -> Vec<(Op, Value)> {
        let mut v: Vec<(Op, Value)> = out
            .iter()
            .map(|r| (r.op, serde_json::from_slice(&r.value).unwrap()))
            .collect();
        v.sort_by_key(|(_, d)| d["window_id"].as_str().unwrap().to_string());
        v
    }

    const TUMBLING: &str = r#"
        kind = "tumbling"
        size_ms = 60000
        key = "/user"
        aggregates = { orders = "count", amount = "sum:/amount", biggest = "max:/amount" }
    "#;

    #[test]
    fn a_tumbling_window_fires_once_when_the_watermark_passes_its_end() {
        let tmp = tempfile::tempdir().unwrap();
        let s = spec(TUMBLING);
        let mut op = open(&s, tmp.path(), Vec::new());
        let mut out = Vec::new();
        op.process(
            vec![rec("a", 1_000, 5), rec("a", 59_999, 7), rec("b", 60_000, 1)],
            &mut out,
        )
        .unwrap();
        assert!(out.is_empty(), "nothing before the watermark");
        op.on_watermark(59_999, &mut out).unwrap();
        assert!(
            out.is_empty(),
            "the end is exclusive: 59,999 does not complete [0, 60000)"
        );
        op.on_watermark(60_000, &mut out).unwrap();
        assert_eq!(
            docs(&out),
            vec![(
                Op::Upsert,
                json!({"key": "a", "window_start": 0, "window_end": 60000, "window_id": "a@0", "orders": 2, "amount": 12, "biggest": 7})
            )]
        );
        assert_eq!(out[0].timestamp, Some(60_000));
        out.clear();
        // A record of the fired window is late: dropped, nothing emitted.
        op.process(vec![rec("a", 30_000, 100)], &mut out).unwrap();
        op.on_watermark(200_000, &mut out).unwrap();
        assert_eq!(docs(&out).len(), 1);
        assert_eq!(docs(&out)[0].1["window_id"], "b@60000");
        assert_eq!(op.meters.as_ref().unwrap().dropped.get(), 1);
        assert_eq!(op.open_windows, 0, "fired windows are deleted");
    }

    #[test]
    fn late_updates_reemit_within_the_lateness_and_drop_after_it() {
        let tmp = tempfile::tempdir().unwrap();
        let s = spec(&format!(
            "{TUMBLING}\nallowed_lateness_ms = 10000\nlate = \"update\""
        ));
        let mut op = open(&s, tmp.path(), Vec::new());
        let mut out = Vec::new();
        op.process(vec![rec("a", 1_000, 5)], &mut out).unwrap();
        op.on_watermark(60_000, &mut out).unwrap();
        assert_eq!(docs(&out)[0].1["orders"], 1, "emitted at its end");
        out.clear();
        op.process(vec![rec("a", 2_000, 5)], &mut out).unwrap();
        assert_eq!(
            docs(&out)[0].1["orders"],
            2,
            "emitted again with the late record"
        );
        assert_eq!(op.meters.as_ref().unwrap().updated.get(), 1);
        out.clear();
        op.on_watermark(70_000, &mut out).unwrap();
        assert!(out.is_empty(), "a purge emits nothing");
        op.process(vec![rec("a", 3_000, 5)], &mut out).unwrap();
        assert!(out.is_empty());
        assert_eq!(op.meters.as_ref().unwrap().dropped.get(), 1);
    }

    #[test]
    fn sessions_merge_and_an_emitted_session_merged_away_is_retracted() {
        let tmp = tempfile::tempdir().unwrap();
        let s = spec(
            r#"
            kind = "session"
            gap_ms = 100
            key = "/user"
            emit = "update"
            aggregates = { n = "count" }
            "#,
        );
        let mut op = open(&s, tmp.path(), Vec::new());
        let mut out = Vec::new();
        op.process(vec![rec("a", 0, 1), rec("a", 500, 1)], &mut out)
            .unwrap();
        assert_eq!(docs(&out).len(), 2, "two sessions, each emitted on change");
        out.clear();
        // [300, 400) joins neither; [420, 520) joins [500, 600) only, which was
        // emitted as a@500: the merged session is a@420, and a@500 is deleted.
        op.process(vec![rec("a", 300, 1)], &mut out).unwrap();
        out.clear();
        op.process(vec![rec("a", 420, 1)], &mut out).unwrap();
        let d = docs(&out);
        assert_eq!(d.len(), 2, "{d:?}");
        assert_eq!(
            d[0],
            (
                Op::Upsert,
                json!({"key": "a", "window_start": 420, "window_end": 600, "window_id": "a@420", "n": 2})
            )
        );
        assert_eq!(d[1].0, Op::Delete);
        assert_eq!(d[1].1["window_id"], "a@500");
    }

    #[test]
    fn a_restored_operator_keeps_its_windows_and_what_was_late() {
        let tmp = tempfile::tempdir().unwrap();
        let s = spec(TUMBLING);
        let mut op = open(&s, tmp.path(), Vec::new());
        let mut out = Vec::new();
        op.process(vec![rec("a", 1_000, 5), rec("b", 61_000, 2)], &mut out)
            .unwrap();
        op.on_watermark(60_000, &mut out).unwrap();
        assert_eq!(docs(&out).len(), 1);
        out.clear();
        let pending = tmp.path().join("chk");
        std::fs::create_dir_all(&pending).unwrap();
        let snap = op.snapshot(CheckpointId(1), &pending).unwrap().unwrap();
        drop(op);
        let restore = vec![lockgate_state::StateRestore::new(pending.clone(), snap)];
        let mut op = open(&s, tmp.path(), restore);
        assert_eq!(op.open_windows, 1);
        // The restored operator has received no watermark yet, and a record of the
        // window fired before the checkpoint is still late.
        op.process(vec![rec("a", 2_000, 5)], &mut out).unwrap();
        assert_eq!(op.meters.as_ref().unwrap().dropped.get(), 1);
        op.on_watermark(120_000, &mut out).unwrap();
        assert_eq!(
            docs(&out),
            vec![(
                Op::Upsert,
                json!({"key": "b", "window_start": 60000, "window_end": 120000, "window_id": "b@60000", "orders": 1, "amount": 2, "biggest": 2})
            )]
        );
    }

    #[test]
    fn a_record_the_window_cannot_read_fails_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let s = spec(TUMBLING);
        let mut op = open(&s, tmp.path(), Vec::new());
        let mut r = rec("a", 1, 1);
        r.value = br#"{"user": "a", "amount": "12"}"#.to_vec().into();
        let e = op
            .process(vec![r], &mut Vec::new())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("aggregate amount") && e.contains("a string"),
            "{e}"
        );
        let mut r = rec("a", 1, 1);
        r.timestamp = None;
        let e = op
            .process(vec![r], &mut Vec::new())
            .unwrap_err()
            .to_string();
        assert!(e.contains("no event time"), "{e}");
    }

    /// Snapshots `op` and opens `spec` again from it.
    fn reopen(
        op: &mut WindowOperator,
        spec: &Arc<WindowSpec>,
        dir: &Path,
        id: u64,
    ) -> Result<WindowOperator> {
        let pending = dir.join(format!("chk-{id}"));
        std::fs::create_dir_all(&pending).unwrap();
        let snap = op.snapshot(CheckpointId(id), &pending).unwrap().unwrap();
        let restore = vec![lockgate_state::StateRestore::new(pending, snap)];
        try_open(spec, dir.join(format!("work-{id}")), restore)
    }

    #[test]
    fn a_checkpoint_of_another_window_definition_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let s = spec(TUMBLING);
        let mut op = open(&s, tmp.path(), Vec::new());
        op.process(vec![rec("a", 1_000, 5)], &mut Vec::new())
            .unwrap();
        let other =
            spec(&TUMBLING.replace("biggest = \"max:/amount\"", "biggest = \"min:/amount\""));
        let e = reopen(&mut op, &other, tmp.path(), 1)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            e.contains("another window definition") && e.contains("biggest=max:/amount"),
            "{e}"
        );
        assert!(
            reopen(&mut op, &s, tmp.path(), 2).is_ok(),
            "the same definition restores"
        );
    }

    #[test]
    fn the_end_of_a_bounded_input_is_not_kept_as_the_watermark_reached() {
        let tmp = tempfile::tempdir().unwrap();
        let s = spec(TUMBLING);
        let mut op = open(&s, tmp.path(), Vec::new());
        let mut out = Vec::new();
        op.process(vec![rec("a", 1_000, 5)], &mut out).unwrap();
        op.on_watermark(60_000, &mut out).unwrap();
        op.on_watermark(crate::event_time::END_OF_TIME, &mut out)
            .unwrap();
        assert_eq!(docs(&out).len(), 1);
        // Restored and run live: lateness is judged by the last real watermark (60 s),
        // not by the end of the bounded input.
        let mut live = reopen(&mut op, &s, tmp.path(), 1).unwrap();
        out.clear();
        live.process(vec![rec("a", 70_000, 1), rec("b", 20_000, 1)], &mut out)
            .unwrap();
        assert_eq!(
            live.meters.as_ref().unwrap().dropped.get(),
            1,
            "b at 20 s is late after 60 s, a at 70 s is not"
        );
        live.on_watermark(120_000, &mut out).unwrap();
        assert_eq!(docs(&out).len(), 1);
        assert_eq!(docs(&out)[0].1["window_id"], "a@60000");
    }

    #[test]
    fn a_late_record_that_opens_a_complete_window_is_emitted_at_once() {
        let tmp = tempfile::tempdir().unwrap();
        let s = spec(&format!(
            "{TUMBLING}\nallowed_lateness_ms = 120000\nlate = \"update\""
        ));
        let mut op = open(&s, tmp.path(), Vec::new());
        let mut out = Vec::new();
        op.on_watermark(90_000, &mut out).unwrap();
        // b has no window [0, 60000) yet; it is complete, and within the lateness.
        op.process(vec![rec("b", 10_000, 3)], &mut out).unwrap();
        assert_eq!(
            docs(&out).len(),
            1,
            "emitted without waiting for the watermark"
        );
        assert_eq!(docs(&out)[0].1["orders"], 1);
    }

    #[test]
    fn a_record_refused_midway_changes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let s = spec(&format!("{TUMBLING}\non_error = \"skip\""));
        let mut op = open(&s, tmp.path(), Vec::new());
        let mut out = Vec::new();
        op.process(
            vec![rec("a", 1_000, i64::MAX), rec("a", 2_000, 1)],
            &mut out,
        )
        .unwrap();
        op.on_watermark(60_000, &mut out).unwrap();
        let d = docs(&out);
        assert_eq!(
            d[0].1["orders"], 1,
            "the overflowing record is not counted: {d:?}"
        );
        assert_eq!(d[0].1["amount"], json!(i64::MAX));
    }

    #[test]
    fn a_bounded_run_after_a_bounded_run_adds_to_the_windows_the_end_emitted() {
        let tmp = tempfile::tempdir().unwrap();
        let s = spec(TUMBLING);
        let mut op = open(&s, tmp.path(), Vec::new());
        let mut out = Vec::new();
        op.process(vec![rec("a", 1_000, 5), rec("a", 30_000, 2)], &mut out)
            .unwrap();
        op.on_watermark(25_000, &mut out).unwrap();
        op.on_watermark(crate::event_time::END_OF_TIME, &mut out)
            .unwrap();
        assert_eq!(docs(&out)[0].1["orders"], 2, "the end emits the window");
        // The next bounded run from this checkpoint reads one more record of it.
        let mut next = reopen(&mut op, &s, tmp.path(), 1).unwrap();
        out.clear();
        next.process(vec![rec("a", 40_000, 1)], &mut out).unwrap();
        next.on_watermark(crate::event_time::END_OF_TIME, &mut out)
            .unwrap();
        let d = docs(&out);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(
            d[0].1["orders"], 3,
            "the whole window again, not the new record alone"
        );
        assert_eq!(d[0].1["amount"], 8);
        // A live run from there: a real watermark past it deletes it, emitting nothing.
        let mut live = reopen(&mut next, &s, tmp.path(), 2).unwrap();
        assert_eq!(live.open_windows, 1);
        out.clear();
        live.on_watermark(60_000, &mut out).unwrap();
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(live.open_windows, 0);
    }

    #[test]
    fn the_watermark_gauge_appears_with_the_first_watermark() {
        let tmp = tempfile::tempdir().unwrap();
        let s = spec(TUMBLING);
        let mut op = open(&s, tmp.path(), Vec::new());
        assert!(op.meters.as_ref().unwrap().watermark.is_none());
        op.on_watermark(1_500, &mut Vec::new()).unwrap();
        let g = op
            .meters
            .as_ref()
            .unwrap()
            .watermark
            .as_ref()
            .unwrap()
            .get();
        assert_eq!(g, 1.5);
    }
}
