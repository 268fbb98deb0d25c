//! A chain: the operators a task runs in sequence, and where their output goes (an
//! exchange to the next vertex, or the sink).

use super::message::Message;
use crate::connector::KeyFn;
use crate::connector::{Operator, OperatorContext};
use crate::connector::{Sink, SinkRestore, SubtaskInfo};
use crate::error::{JobError, Result};
use crate::event_time::Watermark;
use crate::record::Batch;
use lockgate_state::keygroup::{key_group_of, subtask_for_group};
use lockgate_state::{CheckpointId, SubtaskSnapshot};
use prometheus::IntCounter;
use std::path::Path;
use tokio::sync::mpsc;

pub use crate::connector::SINK_UID;

/// Records per channel message on an exchange.
///
/// With [`EXCHANGE_CAPACITY`], this is what bounds the records queued in front of a
/// barrier (aligned checkpoints: a barrier waits behind every record sent before it).
/// Per keyed subtask, at most about parallelism × (capacity + 2) messages (the queued
/// ones, the one being sent, the sender's partial buffer) are ahead of a barrier, so
/// the time from trigger to snapshot is this many records' processing time. At 1024
/// records and 8 messages, 10^6 keys in state (about 30,000 records/s per keyed
/// subtask on 2 cores) made checkpoints wait 300-700 ms behind their queues; at 128 and
/// 2 the wait is tens of milliseconds, and throughput with 1000 keys was unchanged
/// (measured side by side by `cargo bench --bench pipeline`).
const EXCHANGE_BATCH: usize = 128;

/// Bytes ([`crate::record::Record::size_bytes`]) at which an exchange message is cut:
/// a message holds less than this plus one record. With [`EXCHANGE_CAPACITY`] messages
/// per channel, a channel holds less than 2 × (1 MiB + the largest record). Cutting
/// batches by bytes keeps the bound with no accounting on the receiving side (a byte
/// semaphore released by the receiver would be more exact, but must be shared per
/// channel anyway: one shared by a receiver's inputs deadlocks under barrier alignment,
/// which stops reading an input that already delivered its barrier).
///
/// The count is of the records' own bytes. Records from the Kafka source are slices of
/// their poll batch's buffer (at most about 1 MiB), which stays allocated while any of
/// them is buffered here: spread over `p` receivers, a message can keep up to about
/// `p` such buffers alive rather than the 1 MiB it counts.
pub const EXCHANGE_BATCH_BYTES: usize = 1 << 20;

/// Messages per exchange channel: the backpressure between tasks. Small, because a
/// barrier queues behind them (see [`EXCHANGE_BATCH`]).
pub const EXCHANGE_CAPACITY: usize = 2;

/// Hash-partitions records by key group to the subtasks of the next vertex.
pub struct Exchange {
    pub senders: Vec<mpsc::Sender<Message>>,
    pub key_fn: KeyFn,
    pub max_parallelism: u16,
    pub buffers: Vec<Batch>,
    /// The bytes of each buffer.
    pub buffer_bytes: Vec<usize>,
    /// The bytes of the records sent and not yet received, for
    /// `lockgate_buffered_bytes{stage="exchange"}`.
    pub in_channels: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Exchange {
    async fn send(&self, to: usize, msg: Message) -> Result<()> {
        self.senders[to]
            .send(msg)
            .await
            .map_err(|_| JobError::Other("downstream task stopped".into()))
    }

    /// Buffer `to` is being sent: its bytes move to the channels' count.
    fn count_sent(&mut self, to: usize) {
        let bytes = std::mem::take(&mut self.buffer_bytes[to]);
        self.in_channels
            .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    async fn route(&mut self, batch: Batch) -> Result<()> {
        let p = self.senders.len() as u16;
        for mut r in batch {
            let key = (self.key_fn)(&r)?;
            let g = key_group_of(&key, self.max_parallelism);
            let to = usize::from(subtask_for_group(self.max_parallelism, p, g));
            r.route_key = Some(key);
            self.buffer_bytes[to] += r.size_bytes();
            self.buffers[to].push(r);
            if self.buffers[to].len() >= EXCHANGE_BATCH
                || self.buffer_bytes[to] >= EXCHANGE_BATCH_BYTES
            {
                let full =
                    std::mem::replace(&mut self.buffers[to], Vec::with_capacity(EXCHANGE_BATCH));
                self.count_sent(to);
                self.send(to, Message::Records(full)).await?;
            }
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<()> {
        for to in 0..self.buffers.len() {
            if !self.buffers[to].is_empty() {
                let b = std::mem::take(&mut self.buffers[to]);
                self.count_sent(to);
                self.send(to, Message::Records(b)).await?;
            }
        }
        Ok(())
    }

    async fn broadcast(&mut self, make: impl Fn() -> Message) -> Result<()> {
        self.flush().await?;
        for to in 0..self.senders.len() {
            self.send(to, make()).await?;
        }
        Ok(())
    }
}

/// Where a chain's output goes.
pub enum Tail {
    Exchange(Exchange),
    Sink(Box<dyn Sink>),
}

/// The operators of one task and its tail.
pub struct Chain {
    pub info: SubtaskInfo,
    pub ops: Vec<(Box<dyn Operator>, OperatorContext)>,
    pub tail: Tail,
    /// Whether the sink of this chain has taken a record in this attempt.
    pub sink_written: bool,
    /// `records_in` / `records_out` of each operator, in the order of `ops`.
    pub op_counters: Vec<(IntCounter, IntCounter)>,
    /// `records_in` of the sink, if the tail is one.
    pub sink_in: Option<IntCounter>,
}

impl Chain {
    /// Opens every operator, then the sink.
    pub async fn open(&mut self, sink_restore: &SinkRestore) -> Result<()> {
        for (op, ctx) in &mut self.ops {
            // RocksDB restore does blocking I/O.
            tokio::task::block_in_place(|| op.open(ctx))?;
        }
        if let Tail::Sink(s) = &mut self.tail {
            // The sink is told its own name (`sink-0`), not its task's (`source-0` when
            // chained to the source): what it names in errors and logs is the sink.
            let info = SubtaskInfo {
                name: format!("{SINK_UID}-{}", self.info.index),
                ..self.info.clone()
            };
            s.open(&info, sink_restore).await?;
        }
        Ok(())
    }

    /// Runs a batch through the operators and hands the result to the tail.
    pub async fn process(&mut self, batch: Batch) -> Result<()> {
        self.process_from(0, batch).await
    }

    /// The watermark rose to `w` (or its input turned idle): each operator in order
    /// fires what it completes, which runs through the operators after it, and then
    /// the watermark goes downstream, behind every record sent before it.
    pub async fn watermark(&mut self, w: Watermark) -> Result<()> {
        if let Watermark::At(t) = w {
            for k in 0..self.ops.len() {
                let mut fired = Vec::new();
                self.ops[k].0.on_watermark(t, &mut fired)?;
                if !fired.is_empty() {
                    self.op_counters[k].1.inc_by(fired.len() as u64);
                    self.process_from(k + 1, fired).await?;
                }
            }
        }
        if let Tail::Exchange(x) = &mut self.tail {
            x.broadcast(|| Message::Watermark(w)).await?;
        }
        Ok(())
    }

    /// Runs a batch through the operators from the `first`, then the tail.
    async fn process_from(&mut self, first: usize, mut batch: Batch) -> Result<()> {
        for ((op, _), (records_in, records_out)) in
            self.ops[first..].iter_mut().zip(&self.op_counters[first..])
        {
            records_in.inc_by(batch.len() as u64);
            let mut out = Vec::with_capacity(batch.len());
            op.process(batch, &mut out)?;
            records_out.inc_by(out.len() as u64);
            batch = out;
        }
        if batch.is_empty() {
            return Ok(());
        }
        match &mut self.tail {
            Tail::Exchange(x) => x.route(batch).await,
            Tail::Sink(s) => {
                if let Some(c) = &self.sink_in {
                    c.inc_by(batch.len() as u64);
                }
                s.invoke(batch).await?;
                if !self.sink_written {
                    self.sink_written = true;
                    // Recovery time is measured up to this line (process start to the
                    // first record written by a sink): it comes after every operator of
                    // the path, keyed state included, was restored.
                    tracing::info!("first records written to the sink");
                }
                Ok(())
            }
        }
    }

    /// Barrier `id`: snapshots every operator into `pending_dir`, then forwards the
    /// barrier (after every buffered record) or snapshots the sink.
    pub async fn barrier(
        &mut self,
        id: CheckpointId,
        pending_dir: &Path,
    ) -> Result<Vec<SubtaskSnapshot>> {
        let mut snaps = Vec::new();
        for (op, _) in &mut self.ops {
            if let Some(s) = tokio::task::block_in_place(|| op.snapshot(id, pending_dir))? {
                snaps.push(s);
            }
        }
        match &mut self.tail {
            Tail::Exchange(x) => x.broadcast(|| Message::Barrier(id)).await?,
            Tail::Sink(s) => {
                crate::fault::hit("before-sink-flush");
                let state = s.snapshot(id).await?;
                crate::fault::hit("after-sink-flush");
                snaps.push(SubtaskSnapshot {
                    operator: SINK_UID.to_string(),
                    subtask: self.info.index,
                    key_groups: None,
                    state_dir: None,
                    files: Vec::new(),
                    inline_state: state,
                });
            }
        }
        Ok(snaps)
    }

    /// Checkpoint `id` completed; none older than `restorable_from` can be restored.
    pub async fn notify_complete(
        &mut self,
        id: CheckpointId,
        restorable_from: Option<CheckpointId>,
    ) -> Result<()> {
        for (op, _) in &mut self.ops {
            op.notify_checkpoint_complete(id)?;
        }
        if let Tail::Sink(s) = &mut self.tail {
            s.notify_checkpoint_complete(id).await?;
            if let Some(oldest) = restorable_from {
                s.notify_restorable_from(oldest).await?;
            }
        }
        Ok(())
    }

    /// Checkpoint `id` was aborted.
    pub async fn notify_aborted(&mut self, id: CheckpointId) -> Result<()> {
        if let Tail::Sink(s) = &mut self.tail {
            s.notify_checkpoint_aborted(id).await?;
        }
        Ok(())
    }

    /// The input ended: forward the end, or close the sink.
    pub async fn end(&mut self) -> Result<()> {
        match &mut self.tail {
            Tail::Exchange(x) => x.broadcast(|| Message::EndOfInput).await,
            Tail::Sink(s) => s.close().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Record;
    use std::sync::Arc;

    /// An exchange to one subtask, and the receiving end of its channel.
    fn exchange() -> (Exchange, mpsc::Receiver<Message>) {
        // Room for every message of a test: nothing drains the channel while it routes.
        let (tx, rx) = mpsc::channel(16);
        let x = Exchange {
            senders: vec![tx],
            key_fn: Arc::new(|_: &Record| Ok(b"k".to_vec())),
            max_parallelism: 128,
            buffers: vec![Vec::new()],
            buffer_bytes: vec![0],
            in_channels: Default::default(),
        };
        (x, rx)
    }

    fn records(n: usize, bytes: usize) -> Batch {
        (0..n)
            .map(|_| Record::from_value(vec![b'x'; bytes]))
            .collect()
    }

    fn received(rx: &mut mpsc::Receiver<Message>) -> Vec<Batch> {
        let mut out = Vec::new();
        while let Ok(m) = rx.try_recv() {
            if let Message::Records(b) = m {
                out.push(b);
            }
        }
        out
    }

    #[tokio::test]
    async fn exchange_messages_are_cut_by_bytes_and_a_large_record_goes_alone() {
        // 300 KiB records: a message is cut once it reaches 1 MiB (four records).
        let (mut x, mut rx) = exchange();
        x.route(records(7, 300 * 1024)).await.unwrap();
        x.flush().await.unwrap();
        let sizes: Vec<usize> = received(&mut rx).iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![4, 3]);

        // A record larger than the cut travels alone, and small records still batch
        // by count.
        let (mut x, mut rx) = exchange();
        let mut batch = records(1, 3 << 20);
        batch.extend(records(2, 10));
        x.route(batch).await.unwrap();
        x.route(records(EXCHANGE_BATCH, 10)).await.unwrap();
        x.flush().await.unwrap();
        let got = received(&mut rx);
        let sizes: Vec<usize> = got.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![1, EXCHANGE_BATCH, 2]);
        for b in &got {
            let bytes: usize = b.iter().map(Record::size_bytes).sum();
            let largest = b.iter().map(Record::size_bytes).max().unwrap();
            assert!(
                bytes < EXCHANGE_BATCH_BYTES + largest,
                "a message holds less than the cut plus one record: {bytes}"
            );
        }
    }
}
