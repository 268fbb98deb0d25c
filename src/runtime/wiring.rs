//! Wiring an attempt: its working directory, one task per subtask of every vertex,
//! the exchanges between vertices, and each operator's share of the restored state.
//! Nothing here decides anything about checkpoints: the driver in
//! [`super::executor`] runs the coordinator over what this wires.

use super::chain::{Chain, Exchange, Tail, EXCHANGE_CAPACITY, SINK_UID};
use super::message::{Control, Report, TaskId};
use super::start::{sink_restore, source_restore, RestoreSet};
use super::task::{run_input_task, run_source_task, TaskIo};
use crate::connector::{Operator, OperatorContext, SubtaskInfo};
use crate::error::Result;
use crate::job::{JobGraph, KeyFn, OperatorFactory, Stage};
use crate::telemetry::metrics::{Buffered, Stage as BufferStage};
use crate::telemetry::Telemetry;
use lockgate_state::StateRestore;
use prometheus::IntCounter;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::warn;

/// The tasks of an attempt and how the driver talks to them.
pub(super) struct Wiring {
    /// One control channel per task, downstream vertices first (a `Complete` reaches
    /// sinks before sources).
    pub controls: Vec<(TaskId, mpsc::UnboundedSender<Control>)>,
    pub tasks: JoinSet<(TaskId, Result<()>)>,
    /// Acks, declines and finished sources, from every task.
    pub reports: mpsc::Receiver<Report>,
}

/// A vertex: a chain of operators after a source or after an exchange.
struct Vertex {
    ops: Vec<(String, Option<String>, OperatorFactory)>,
    /// The key function of the exchange that feeds the *next* vertex.
    out_key: Option<KeyFn>,
}

fn vertices(job: &JobGraph) -> Vec<Vertex> {
    let mut vs = vec![Vertex {
        ops: Vec::new(),
        out_key: None,
    }];
    for s in &job.stages {
        match s {
            Stage::Operator { kind, uid, factory } => vs
                .last_mut()
                .expect("one vertex")
                .ops
                .push((kind.clone(), uid.clone(), factory.clone())),
            Stage::KeyBy(k) => {
                vs.last_mut().expect("one vertex").out_key = Some(k.clone());
                vs.push(Vertex {
                    ops: Vec::new(),
                    out_key: None,
                });
            }
        }
    }
    vs
}

/// The name of a task in logs and the REST API: `source-0`, `vertex1-1`.
pub(super) fn task_name(t: TaskId) -> String {
    if t.vertex == 0 {
        format!("source-{}", t.subtask)
    } else {
        format!("vertex{}-{}", t.vertex, t.subtask)
    }
}

/// Empties the attempt's working directory, `.work/` of the checkpoint directory:
/// operators rebuild their working state there from the checkpoint.
pub(super) fn fresh_work_dir(root: &Path) -> Result<PathBuf> {
    let work = root.join(".work");
    if work.exists() {
        std::fs::remove_dir_all(&work).map_err(lockgate_state::StateError::io("remove", &work))?;
    }
    std::fs::create_dir_all(&work).map_err(lockgate_state::StateError::io("create", &work))?;
    Ok(work)
}

/// Warns about restored state that no operator of the job takes (an operator removed
/// from the job, restored with `--allow-non-restored-state`).
fn warn_unrestored(vs: &[Vertex], restored: Option<&RestoreSet>) {
    let known: HashSet<String> = vs
        .iter()
        .flat_map(|v| v.ops.iter().filter_map(|o| o.1.clone()))
        .collect();
    for r in restored.iter().flat_map(|set| &set.parts) {
        for s in &r.metadata.subtasks {
            if s.operator != SINK_UID
                && s.operator != crate::connector::SOURCE_UID
                && !known.contains(&s.operator)
            {
                warn!(operator = %s.operator, subtask = s.subtask, "state of an operator the job no longer has is not restored");
            }
        }
    }
}

type Senders = Vec<Vec<Vec<mpsc::Sender<super::message::Message>>>>;
type Receivers = Vec<Vec<Vec<mpsc::Receiver<super::message::Message>>>>;

/// The channels of each exchange: `senders[v][i]` go from subtask `i` of vertex `v` to
/// every subtask of vertex `v + 1`; `receivers[v][j]` are the inputs of subtask `j` of
/// vertex `v` (none for the sources).
fn exchanges(vertices: usize, p: u16) -> (Senders, Receivers) {
    let mut senders: Senders = Vec::new();
    let mut receivers: Receivers = vec![Vec::new()];
    for _ in 1..vertices {
        let mut to: Vec<Vec<mpsc::Sender<_>>> = (0..p).map(|_| Vec::new()).collect();
        let mut from: Vec<Vec<mpsc::Receiver<_>>> = (0..p).map(|_| Vec::new()).collect();
        for s in to.iter_mut() {
            for r in from.iter_mut() {
                let (tx, rx) = mpsc::channel(EXCHANGE_CAPACITY);
                s.push(tx);
                r.push(rx);
            }
        }
        senders.push(to);
        receivers.push(from);
    }
    senders.push(Vec::new());
    (senders, receivers)
}

type ChainOps = (
    Vec<(Box<dyn Operator>, OperatorContext)>,
    Vec<(IntCounter, IntCounter)>,
);

/// The operators of subtask `i` of vertex `v`, each with its share of the restored
/// state and its record counters.
fn chain_ops(
    job: &JobGraph,
    (v, vertex): (usize, &Vertex),
    info: &SubtaskInfo,
    restored: Option<&RestoreSet>,
    work: &Path,
    telemetry: &Telemetry,
) -> ChainOps {
    let i = info.index;
    let m = telemetry.metrics();
    let mut ops = Vec::new();
    let mut op_counters = Vec::new();
    for (k, (kind, uid, factory)) in vertex.ops.iter().enumerate() {
        let across = uid
            .as_ref()
            .is_some_and(|u| job.across_partitions.contains(u));
        let restore = match (uid, restored) {
            (Some(u), Some(set)) => set
                .parts
                .iter()
                .flat_map(|r| {
                    r.metadata
                        .subtasks
                        .iter()
                        .filter(|s| &s.operator == u)
                        .map(|s| StateRestore {
                            checkpoint_dir: r.path.clone(),
                            snapshot: s.clone(),
                            keep: set.keep.clone().filter(|_| !across),
                        })
                })
                .collect(),
            _ => Vec::new(),
        };
        // Stateless operators have no uid: their position names their series, so that
        // two `map`s of one job are never counted as one.
        let label = uid.clone().unwrap_or_else(|| format!("{kind}-{v}.{k}"));
        let uid = uid.clone().unwrap_or_else(|| kind.clone());
        op_counters.push((
            m.task_counter(&m.records_in, &label, i),
            m.task_counter(&m.records_out, &label, i),
        ));
        let ctx = OperatorContext {
            info: info.clone(),
            work_dir: work.join(format!("{uid}-{i}")),
            uid,
            restore,
            state_options: job.state,
            partition_scoped: job.co_partitioned && !across,
        };
        ops.push((factory(i), ctx));
    }
    (ops, op_counters)
}

/// Spawns one task per subtask of every vertex of `job`, restoring `restored`, with
/// its working state below `work`.
pub(super) fn wire(
    job: &JobGraph,
    checkpoint_root: &Path,
    restored: Option<&RestoreSet>,
    work: &Path,
    telemetry: &Telemetry,
    start_paused: bool,
) -> Wiring {
    let p = job.parallelism;
    let vs = vertices(job);
    warn_unrestored(&vs, restored);
    let (report_tx, reports) = mpsc::channel::<Report>(1024);
    let mut controls = Vec::new();
    let mut tasks = JoinSet::new();
    let sink_restore = sink_restore(restored);
    let source_states = source_restore(restored);
    let (mut senders, mut receivers) = exchanges(vs.len(), p);
    // The bytes in this attempt's exchange channels; they leave the gauge with the
    // attempt.
    let in_channels = Arc::new(AtomicUsize::new(0));
    let part: Arc<dyn Buffered> = in_channels.clone();
    telemetry
        .metrics()
        .count_buffered(BufferStage::Exchange, &part);
    for (v, vertex) in vs.iter().enumerate().rev() {
        for i in 0..p {
            let id = TaskId {
                vertex: v as u16,
                subtask: i,
            };
            let info = SubtaskInfo {
                job: job.name.clone(),
                name: task_name(id),
                index: i,
                parallelism: p,
                max_parallelism: job.max_parallelism,
                telemetry: telemetry.clone(),
                member: job.member,
                assignment: job.source.assignment.clone(),
            };
            let (ops, op_counters) = chain_ops(job, (v, vertex), &info, restored, work, telemetry);
            let tail = match &vertex.out_key {
                Some(k) => Tail::Exchange(Exchange {
                    senders: std::mem::take(&mut senders[v][usize::from(i)]),
                    key_fn: k.clone(),
                    max_parallelism: job.max_parallelism,
                    buffers: (0..p).map(|_| Vec::new()).collect(),
                    buffer_bytes: vec![0; usize::from(p)],
                    in_channels: in_channels.clone(),
                }),
                None => Tail::Sink((job.sink.factory)(i)),
            };
            let m = telemetry.metrics();
            let sink_in =
                matches!(tail, Tail::Sink(_)).then(|| m.task_counter(&m.records_in, SINK_UID, i));
            let chain = Chain {
                info,
                ops,
                tail,
                sink_written: false,
                op_counters,
                sink_in,
            };
            let (ctl_tx, ctl_rx) = mpsc::unbounded_channel();
            if v == 0 && start_paused {
                // Read before the source's first poll.
                let _ = ctl_tx.send(Control::Pause);
            }
            controls.push((id, ctl_tx));
            let io = TaskIo {
                id,
                control: ctl_rx,
                reports: report_tx.clone(),
                checkpoint_root: checkpoint_root.to_path_buf(),
                in_channels: in_channels.clone(),
            };
            let sr = sink_restore.clone();
            if v == 0 {
                let source = (job.source.factory)(i);
                let restore = restored
                    .map(RestoreSet::positions)
                    .map(|positions| (positions, source_states.clone().unwrap_or_default()));
                tasks.spawn(
                    async move { (id, run_source_task(io, source, restore, chain, sr).await) },
                );
            } else {
                let inputs = std::mem::take(&mut receivers[v][usize::from(i)]);
                tasks.spawn(async move { (id, run_input_task(io, inputs, chain, sr).await) });
            }
        }
    }
    Wiring {
        controls,
        tasks,
        reports,
    }
}
