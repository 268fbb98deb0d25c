//! A chain: the operators a task runs in sequence, and where their output goes (an
//! exchange to the next vertex, or the sink).

use super::message::Message;
use crate::connectors::{Sink, SinkRestore, SubtaskInfo};
use crate::error::{JobError, Result};
use crate::job::KeyFn;
use crate::operators::{Operator, OperatorContext};
use crate::record::Batch;
use lockgate_state::keygroup::{key_group_of, subtask_for_group};
use lockgate_state::{CheckpointId, SubtaskSnapshot};
use std::path::Path;
use tokio::sync::mpsc;

/// The id under which sink state is stored.
pub const SINK_UID: &str = "sink";

/// Records per channel message on an exchange.
const EXCHANGE_BATCH: usize = 1024;

/// Hash-partitions records by key group to the subtasks of the next vertex.
pub struct Exchange {
    pub senders: Vec<mpsc::Sender<Message>>,
    pub key_fn: KeyFn,
    pub max_parallelism: u16,
    pub buffers: Vec<Batch>,
}

impl Exchange {
    async fn send(&self, to: usize, msg: Message) -> Result<()> {
        self.senders[to]
            .send(msg)
            .await
            .map_err(|_| JobError::Other("downstream task stopped".into()))
    }

    async fn route(&mut self, batch: Batch) -> Result<()> {
        let p = self.senders.len() as u16;
        for mut r in batch {
            let key = (self.key_fn)(&r)?;
            let g = key_group_of(&key, self.max_parallelism);
            let to = usize::from(subtask_for_group(self.max_parallelism, p, g));
            r.route_key = Some(key);
            self.buffers[to].push(r);
            if self.buffers[to].len() >= EXCHANGE_BATCH {
                let full =
                    std::mem::replace(&mut self.buffers[to], Vec::with_capacity(EXCHANGE_BATCH));
                self.send(to, Message::Records(full)).await?;
            }
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<()> {
        for to in 0..self.buffers.len() {
            if !self.buffers[to].is_empty() {
                let b = std::mem::take(&mut self.buffers[to]);
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
}

impl Chain {
    /// Opens every operator, then the sink.
    pub async fn open(&mut self, sink_restore: &SinkRestore) -> Result<()> {
        for (op, ctx) in &mut self.ops {
            // RocksDB restore does blocking I/O.
            tokio::task::block_in_place(|| op.open(ctx))?;
        }
        if let Tail::Sink(s) = &mut self.tail {
            s.open(&self.info, sink_restore).await?;
        }
        Ok(())
    }

    /// Runs a batch through the operators and hands the result to the tail.
    pub async fn process(&mut self, mut batch: Batch) -> Result<()> {
        for (op, _) in &mut self.ops {
            let mut out = Vec::with_capacity(batch.len());
            op.process(batch, &mut out)?;
            batch = out;
        }
        if batch.is_empty() {
            return Ok(());
        }
        match &mut self.tail {
            Tail::Exchange(x) => x.route(batch).await,
            Tail::Sink(s) => s.invoke(batch).await,
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

    /// Checkpoint `id` completed.
    pub async fn notify_complete(&mut self, id: CheckpointId) -> Result<()> {
        for (op, _) in &mut self.ops {
            op.notify_checkpoint_complete(id)?;
        }
        if let Tail::Sink(s) = &mut self.tail {
            s.notify_checkpoint_complete(id).await?;
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
