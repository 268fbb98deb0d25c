//! The Elasticsearch sink subtask.
//!
//! At `Barrier(N)` it flushes and waits until nothing is pending: an acknowledged
//! checkpoint means every record before it is in Elasticsearch. The wait is bounded by
//! the checkpoint timeout; a sink that cannot finish in time declines the checkpoint,
//! and a failure to write fails it. With `flush_on_checkpoint = false` the checkpoint
//! does not wait and guarantees nothing about Elasticsearch.

use super::action::ActionBuilder;
use super::bulk::{BulkProcessor, FailureHandler, Shared};
use super::config::EsSinkConfig;
use super::encode::Encoder;
use crate::connector::{Sink, SinkRestore, SubtaskInfo};
use crate::error::{JobError, Result};
use crate::record::Batch;
use async_trait::async_trait;
use lockgate_state::CheckpointId;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// An Elasticsearch sink subtask.
pub struct EsSink {
    cfg: Arc<EsSinkConfig>,
    builder: Box<dyn ActionBuilder>,
    handler: Arc<dyn FailureHandler>,
    processor: Option<BulkProcessor>,
    name: String,
    /// The actions of the batch being invoked, encoded into one buffer.
    encoder: Encoder,
}

impl EsSink {
    /// A sink subtask writing what `builder` makes of each record; `handler` decides
    /// about refused actions.
    pub fn new(
        cfg: Arc<EsSinkConfig>,
        builder: Box<dyn ActionBuilder>,
        handler: Arc<dyn FailureHandler>,
    ) -> EsSink {
        EsSink {
            cfg,
            builder,
            handler,
            processor: None,
            name: String::new(),
            encoder: Encoder::new(),
        }
    }

    fn processor(&self) -> &BulkProcessor {
        self.processor.as_ref().expect("opened")
    }

    /// Raises a recorded asynchronous failure.
    fn check(&self) -> Result<()> {
        let shared = self.processor().shared();
        match shared.failure() {
            Some(message) if shared.unrecoverable() => Err(JobError::Unrecoverable {
                task: self.name.clone(),
                message,
            }),
            Some(f) => Err(JobError::task(&self.name, f)),
            None => Ok(()),
        }
    }

    /// Actions added and not yet written (for tests and metrics).
    pub fn pending(&self) -> usize {
        self.processor().shared().pending()
    }

    /// The processor's counters, readable while the sink waits (after `open`).
    pub fn counters(&self) -> Arc<Shared> {
        self.processor().shared().clone()
    }
}

#[async_trait]
impl Sink for EsSink {
    async fn open(&mut self, info: &SubtaskInfo, _restored: &SinkRestore) -> Result<()> {
        self.name = info.name.clone();
        if let Some(t) = &self.cfg.index_template {
            let timeout = Duration::from_millis(self.cfg.request_timeout_ms);
            let applied = super::index_setup::ensure_on(&self.cfg.connection, timeout, t)
                .await
                .map_err(|e| JobError::task(&self.name, e))?;
            info!(sink = %self.name, template = %t.name, ?applied, "index template");
        }
        let p = BulkProcessor::start(
            self.cfg.clone(),
            self.handler.clone(),
            info.name.clone(),
            info.telemetry.metrics(),
            info.index,
        )
        .map_err(|e| JobError::task(&self.name, e))?;
        self.processor = Some(p);
        Ok(())
    }

    async fn invoke(&mut self, batch: Batch) -> Result<()> {
        self.check()?;
        for r in &batch {
            if let Err(e) = self.builder.encode(r, &mut self.encoder) {
                // Nothing of a failed batch is sent.
                let _ = self.encoder.take_batch();
                return Err(JobError::task(&self.name, e));
            }
        }
        let processor = self.processor.as_ref().expect("opened");
        processor
            .add_encoded(&mut self.encoder)
            .await
            .map_err(|e| JobError::task(&self.name, e))
    }

    async fn snapshot(&mut self, id: CheckpointId) -> Result<Vec<u8>> {
        self.check()?;
        if !self.cfg.flush_on_checkpoint {
            return Ok(Vec::new());
        }
        let wait = Duration::from_millis(self.cfg.flush_timeout_ms);
        let (started, pending_at_barrier) = (Instant::now(), self.pending());
        let flushed = tokio::time::timeout(wait, self.processor().flush()).await;
        let took = started.elapsed();
        if took * 2 >= wait {
            // Past half the timeout, the next larger backlog declines the checkpoint:
            // say so while there is time to act (fewer in-flight limits, a faster
            // cluster, a longer checkpoint timeout).
            warn!(
                sink = %self.name,
                checkpoint = %id,
                flush_ms = took.as_millis() as u64,
                timeout_ms = wait.as_millis() as u64,
                pending_at_barrier,
                "the checkpoint flush took more than half of the checkpoint timeout"
            );
        }
        let shared = self.processor().shared();
        debug!(
            sink = %self.name,
            checkpoint = %id,
            flush_ms = took.as_millis() as u64,
            pending_at_barrier,
            bulks = shared.bulks(),
            coalesced = shared.coalesced(),
            superseded = shared.superseded(),
            already_written = shared.already_written(),
            "flushed at checkpoint"
        );
        match flushed {
            Ok(r) => r.map_err(|e| JobError::task(&self.name, e))?,
            Err(_) => {
                return Err(JobError::Declined(format!(
                    "{}: {} actions still pending after {} ms at checkpoint {id}",
                    self.name,
                    self.pending(),
                    wait.as_millis()
                )))
            }
        }
        self.check()?;
        debug_assert_eq!(self.pending(), 0, "acknowledged with pending actions");
        Ok(Vec::new())
    }

    async fn notify_checkpoint_complete(&mut self, _id: CheckpointId) -> Result<()> {
        Ok(())
    }

    async fn close(&mut self) -> Result<()> {
        if let Some(p) = &self.processor {
            p.close().await.map_err(|e| JobError::task(&self.name, e))?;
            let shared = p.shared();
            info!(
                sink = %self.name,
                bulks = shared.bulks(),
                coalesced = shared.coalesced(),
                superseded = shared.superseded(),
                already_written = shared.already_written(),
                "Elasticsearch sink closed"
            );
        }
        self.check()
    }
}
