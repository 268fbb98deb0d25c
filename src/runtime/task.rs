//! The two kinds of task: one headed by a source, one headed by input channels.

use super::align::{AlignEvent, Aligner};
use super::chain::Chain;
use super::message::{Control, Message, Report, TaskId};
use crate::connector::{SinkRestore, Source, SourcePoll};
use crate::error::{JobError, Result};
use crate::event_time::{Emitter, InputWatermarks};
use lockgate_state::{CheckpointId, SourcePosition, SubtaskSnapshot};
use std::future::poll_fn;
use std::path::PathBuf;
use std::task::Poll;
use tokio::sync::mpsc::{self, error::TryRecvError};
use tracing::{debug, info, Instrument};

/// How often a source task asks its source for its watermark.
const WATERMARK_INTERVAL: std::time::Duration = std::time::Duration::from_millis(200);

/// What every task shares with the coordinator.
pub struct TaskIo {
    pub id: TaskId,
    pub control: mpsc::UnboundedReceiver<Control>,
    pub reports: mpsc::Sender<Report>,
    /// The checkpoint directory (pending checkpoints are written under it).
    pub checkpoint_root: PathBuf,
    /// The bytes of records in the attempt's exchange channels (senders add what they
    /// send, the receiving task takes off what it receives).
    pub in_channels: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl TaskIo {
    fn pending_dir(&self, id: CheckpointId) -> PathBuf {
        lockgate_state::snapshot_dir::in_progress_path(&self.checkpoint_root, id)
    }

    async fn report(&self, r: Report) -> Result<()> {
        // A closed coordinator means the attempt is being torn down.
        let _ = self.reports.send(r).await;
        Ok(())
    }
}

/// Snapshots the chain at barrier `id` and acknowledges. A checkpoint the coordinator
/// already aborted (its pending directory is gone) is skipped. Any error of the
/// snapshot fails the task, even if the checkpoint was aborted meanwhile: a sink that
/// failed to stage its output must never go on as if nothing happened.
async fn snapshot_and_ack(
    io: &TaskIo,
    chain: &mut Chain,
    id: CheckpointId,
    positions: Vec<SourcePosition>,
    source_state: Option<Vec<u8>>,
) -> Result<()> {
    let pending = io.pending_dir(id);
    if !pending.is_dir() {
        debug!(checkpoint = %id, "checkpoint already aborted; barrier skipped");
        return Ok(());
    }
    let mut snapshots = match chain.barrier(id, &pending).await {
        Ok(s) => s,
        Err(JobError::Declined(reason)) => {
            tracing::warn!(checkpoint = %id, %reason, "declining checkpoint");
            return io
                .report(Report::Decline {
                    id,
                    task: io.id,
                    reason,
                })
                .await;
        }
        Err(e) => return Err(e),
    };
    debug!(checkpoint = %id, "snapshotted");
    snapshots.extend(source_state.map(|inline_state| SubtaskSnapshot {
        operator: crate::connector::SOURCE_UID.to_string(),
        subtask: io.id.subtask,
        key_groups: None,
        state_dir: None,
        files: Vec::new(),
        inline_state,
    }));
    io.report(Report::Ack {
        id,
        task: io.id,
        positions,
        snapshots,
    })
    .await
}

/// What a source subtask restores: the union list of positions and every old source
/// subtask's own state.
pub type SourceRestore = (Vec<SourcePosition>, Vec<(u16, Vec<u8>)>);

/// Runs a source task until the final checkpoint completes.
pub async fn run_source_task(
    mut io: TaskIo,
    mut source: Box<dyn Source>,
    restored: Option<SourceRestore>,
    mut chain: Chain,
    sink_restore: SinkRestore,
) -> Result<()> {
    let span = tracing::info_span!("task", job = %chain.info.job, task = %chain.info.name);
    async move {
        let positions = match restored {
            Some((positions, states)) => {
                source.restore_state(&states)?;
                Some(positions)
            }
            None => None,
        };
        source.open(&chain.info, positions.as_deref()).await?;
        chain.open(&sink_restore).await?;
        chain.info.telemetry.task_opened();
        let mut finished = false;
        let mut stopped = false;
        let mut paused = false;
        let mut emitted_any = false;
        let mut batch = Vec::with_capacity(1024);
        let m = chain.info.telemetry.metrics();
        let records_out = m.task_counter(&m.records_out, "source", chain.info.index);
        // Watermarks go out periodically (Flink's auto-watermark interval), not after
        // every poll: each one flushes the exchange's buffers.
        let mut watermarks = Emitter::default();
        let mut watermark_at = std::time::Instant::now();
        loop {
            loop {
                let msg = if finished || stopped || paused {
                    io.control.recv().await
                } else {
                    match io.control.try_recv() {
                        Ok(m) => Some(m),
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => None,
                    }
                };
                let Some(msg) = msg else { return Ok(()) };
                match msg {
                    Control::Trigger { id, .. } => {
                        let positions = source.snapshot(id)?;
                        let state = source.snapshot_state(id)?;
                        crate::fault::hit("before-source-ack");
                        snapshot_and_ack(&io, &mut chain, id, positions, state).await?;
                        crate::fault::hit("after-source-snapshot");
                    }
                    Control::Stop => {
                        info!("stopping input for a final checkpoint");
                        stopped = true;
                    }
                    Control::Pause => {
                        info!("input paused");
                        paused = true;
                        io.report(Report::Paused { task: io.id }).await?;
                    }
                    Control::Resume => {
                        if paused {
                            info!("input resumed");
                        }
                        paused = false;
                    }
                    Control::Complete {
                        id,
                        is_final,
                        restorable_from,
                    } => {
                        source.notify_checkpoint_complete(id).await?;
                        chain.notify_complete(id, restorable_from).await?;
                        if is_final {
                            chain.end().await?;
                            source.close().await?;
                            return Ok(());
                        }
                    }
                    Control::Aborted { id } => {
                        source.notify_checkpoint_aborted(id).await?;
                        chain.notify_aborted(id).await?;
                    }
                }
            }
            let mut ended = false;
            match source.poll(&mut batch).await? {
                SourcePoll::Ready => {}
                SourcePoll::Idle => {
                    if batch.is_empty() {
                        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                    }
                }
                SourcePoll::Finished => {
                    info!("source reached its end");
                    ended = true;
                }
            }
            if !batch.is_empty() {
                records_out.inc_by(batch.len() as u64);
                chain
                    .process(std::mem::replace(&mut batch, Vec::with_capacity(1024)))
                    .await?;
                if !emitted_any {
                    emitted_any = true;
                    // The fault harness measures recovery time up to this line.
                    info!("first records emitted");
                }
                crate::fault::records_emitted();
                crate::fault::hit("source-batch");
            }
            // After the records it covers; at the end before the source says it
            // finished, so that what the end fires is in the final checkpoint.
            if ended || watermark_at.elapsed() >= WATERMARK_INTERVAL {
                watermark_at = std::time::Instant::now();
                if let Some(w) = source.watermark().and_then(|w| watermarks.advance(w)) {
                    chain.watermark(w).await?;
                }
            }
            if ended {
                finished = true;
                io.report(Report::SourceFinished { task: io.id }).await?;
            }
        }
    }
    .instrument(span)
    .await
}

/// Receives from the first input, round robin, that is neither blocked nor ended.
async fn next_input(
    inputs: &mut [mpsc::Receiver<Message>],
    aligner: &Aligner,
    ended: &[bool],
    start: &mut usize,
) -> Option<(usize, Message)> {
    let n = inputs.len();
    poll_fn(|cx| {
        for k in 0..n {
            let i = (*start + k) % n;
            if ended[i] || aligner.is_blocked(i) {
                continue;
            }
            match inputs[i].poll_recv(cx) {
                Poll::Ready(Some(m)) => {
                    *start = (i + 1) % n;
                    return Poll::Ready(Some((i, m)));
                }
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => {}
            }
        }
        Poll::Pending
    })
    .await
}

/// Runs a task fed by channels until every input ended.
pub async fn run_input_task(
    mut io: TaskIo,
    mut inputs: Vec<mpsc::Receiver<Message>>,
    mut chain: Chain,
    sink_restore: SinkRestore,
) -> Result<()> {
    let span = tracing::info_span!("task", job = %chain.info.job, task = %chain.info.name);
    async move {
        chain.open(&sink_restore).await?;
        chain.info.telemetry.task_opened();
        let mut aligner = Aligner::new(inputs.len());
        let mut watermarks = InputWatermarks::new(inputs.len());
        let mut ended = vec![false; inputs.len()];
        let mut rr = 0usize;
        let m = chain.info.telemetry.metrics();
        let head = chain
            .ops
            .first()
            .map_or(super::chain::SINK_UID, |(_, ctx)| ctx.uid.as_str());
        let alignment = m.task_histogram(&m.checkpoint_alignment, head, chain.info.index);
        // The checkpoint being aligned and when its first barrier arrived.
        let mut aligning: Option<(CheckpointId, std::time::Instant)> = None;
        loop {
            tokio::select! {
                biased;
                c = io.control.recv() => match c {
                    None => return Ok(()),
                    Some(c) => handle_control(c, &mut chain, &mut aligner).await?,
                },
                m = next_input(&mut inputs, &aligner, &ended, &mut rr) => {
                    let Some((i, m)) = m else {
                        return Err(JobError::task(&chain.info.name, "an input closed before its end (upstream task failed)"));
                    };
                    let event = match m {
                        Message::Records(b) => {
                            let bytes = b.iter().map(crate::record::Record::size_bytes).sum();
                            io.in_channels.fetch_sub(bytes, std::sync::atomic::Ordering::Relaxed);
                            chain.process(b).await?;
                            AlignEvent::Waiting
                        }
                        Message::Watermark(w) => {
                            if let Some(w) = watermarks.on_watermark(i, w) {
                                chain.watermark(w).await?;
                            }
                            AlignEvent::Waiting
                        }
                        Message::Barrier(id) => {
                            if aligning.is_none_or(|a| a.0 != id) {
                                aligning = Some((id, std::time::Instant::now()));
                            }
                            aligner.on_barrier(i, id)
                        }
                        Message::EndOfInput => { ended[i] = true; aligner.on_end_of_input(i) }
                    };
                    match event {
                        AlignEvent::Aligned(id) => {
                            // One input has nothing to align: no sample.
                            if let Some((_, started)) = aligning.take().filter(|a| a.0 == id && inputs.len() > 1) {
                                alignment.observe(started.elapsed().as_secs_f64());
                            }
                            snapshot_and_ack(&io, &mut chain, id, Vec::new(), None).await?
                        }
                        AlignEvent::Superseded { aborted, .. } => {
                            io.report(Report::Decline { id: aborted, task: io.id, reason: "superseded by a newer barrier during alignment".into() }).await?;
                        }
                        AlignEvent::Waiting | AlignEvent::Stale => {}
                    }
                    if aligner.all_ended() {
                        // The final Complete was queued before any input could end.
                        while let Ok(c) = io.control.try_recv() {
                            handle_control(c, &mut chain, &mut aligner).await?;
                        }
                        chain.end().await?;
                        return Ok(());
                    }
                }
            }
        }
    }
    .instrument(span)
    .await
}

async fn handle_control(c: Control, chain: &mut Chain, aligner: &mut Aligner) -> Result<()> {
    match c {
        Control::Complete {
            id,
            restorable_from,
            ..
        } => chain.notify_complete(id, restorable_from).await,
        Control::Aborted { id } => {
            aligner.cancel(id);
            chain.notify_aborted(id).await
        }
        Control::Trigger { .. } | Control::Stop | Control::Pause | Control::Resume => Ok(()),
    }
}
