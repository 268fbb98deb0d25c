//! An in-memory message queue that redelivers as a broker does (RabbitMQ's rules), for
//! the tests of the acknowledging-source kit and of sources built on it.
//!
//! Consumers take messages in order, at most `prefetch` unacknowledged each, on a
//! channel whose delivery tags count from 1 (as AMQP's do); a message is gone once
//! acknowledged. A consumer that is dropped (its job torn down)
//! or whose acknowledgement fails (its channel closed) gives every message it has not
//! acknowledged back to the head of the queue, in delivery order, where any consumer
//! takes it again. Faults are asked for: [`MemoryQueue::fail_acks`].

use crate::connector::{Record, SourcePoll, SourceSpec, SubtaskInfo};
use crate::error::Result;
use crate::kits::acking::{AckingSource, Acknowledged, Delivery, MessageId};
use async_trait::async_trait;
use bytes::Bytes;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone)]
struct Message {
    id: Option<MessageId>,
    value: Bytes,
}

#[derive(Debug, Default)]
struct Inner {
    ready: VecDeque<Message>,
    /// (channel, tag) -> message, unacknowledged.
    unacked: BTreeMap<(u64, u64), Message>,
    /// The last tag of each open channel.
    tags: BTreeMap<u64, u64>,
    next_channel: u64,
    acked: usize,
    redelivered: usize,
    failing_acks: u32,
    failed_acks: usize,
    losing_acks: u32,
}

impl Inner {
    fn channel(&mut self) -> u64 {
        self.next_channel += 1;
        self.tags.insert(self.next_channel, 0);
        self.next_channel
    }

    /// Channel `channel` closed: its unacknowledged messages go back to the head of
    /// the queue, in the order they were delivered.
    fn close(&mut self, channel: u64) {
        self.tags.remove(&channel);
        let back: Vec<(u64, u64)> = self
            .unacked
            .range((channel, 0)..=(channel, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in back.into_iter().rev() {
            let m = self.unacked.remove(&k).expect("listed above");
            self.redelivered += 1;
            self.ready.push_front(m);
        }
    }
}

/// A queue shared by a test and the consumers of its jobs.
#[derive(Debug, Clone, Default)]
pub struct MemoryQueue(Arc<Mutex<Inner>>);

impl MemoryQueue {
    /// An empty queue.
    pub fn new() -> MemoryQueue {
        MemoryQueue::default()
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().expect("the queue's lock")
    }

    /// Publishes a message with id `id` (or none) and value `value` at the tail.
    pub fn publish(&self, id: Option<&[u8]>, value: &[u8]) {
        self.inner().ready.push_back(Message {
            id: id.map(Into::into),
            value: Bytes::copy_from_slice(value),
        });
    }

    /// The next `n` acknowledgements fail: each closes the channel it was sent on, so
    /// the messages that channel has not acknowledged come again.
    pub fn fail_acks(&self, n: u32) {
        self.inner().failing_acks = n;
    }

    /// The next `n` acknowledgements are lost on their way: the consumer is told they
    /// were sent, the broker never sees them (the connection broke right after), so
    /// their messages come again once the channel closes.
    pub fn lose_acks(&self, n: u32) {
        self.inner().losing_acks = n;
    }

    /// Messages waiting for a consumer.
    pub fn ready(&self) -> usize {
        self.inner().ready.len()
    }

    /// The values of the messages waiting for a consumer, in order.
    pub fn ready_values(&self) -> Vec<Vec<u8>> {
        self.inner()
            .ready
            .iter()
            .map(|m| m.value.to_vec())
            .collect()
    }

    /// Messages delivered and not acknowledged.
    pub fn unacked(&self) -> usize {
        self.inner().unacked.len()
    }

    /// Messages acknowledged (each acknowledged delivery counts once).
    pub fn acked(&self) -> usize {
        self.inner().acked
    }

    /// Messages given back to the queue by a closed channel.
    pub fn redelivered(&self) -> usize {
        self.inner().redelivered
    }

    /// Acknowledgements that failed as asked by [`MemoryQueue::fail_acks`].
    pub fn failed_acks(&self) -> usize {
        self.inner().failed_acks
    }

    /// A consumer taking at most `prefetch` unacknowledged messages.
    pub fn consumer(&self, prefetch: usize) -> QueueConsumer {
        QueueConsumer {
            queue: self.clone(),
            channel: None,
            prefetch: prefetch.max(1),
        }
    }

    /// A source of kind `memory_queue` reading this queue: each subtask one consumer,
    /// on the acknowledging-source kit with ids kept `window` after acknowledgement.
    pub fn spec(&self, prefetch: usize, window: Duration) -> SourceSpec {
        let queue = self.clone();
        SourceSpec::new("memory_queue", move |_| {
            Box::new(AckingSource::with_window(queue.consumer(prefetch), window))
        })
    }
}

/// One consumer of a [`MemoryQueue`], on a channel of its own (a new one after its
/// channel closed). Its handles are `(channel, delivery tag)`.
pub struct QueueConsumer {
    queue: MemoryQueue,
    channel: Option<u64>,
    prefetch: usize,
}

impl Drop for QueueConsumer {
    fn drop(&mut self) {
        if let Some(c) = self.channel.take() {
            self.queue.inner().close(c);
        }
    }
}

#[async_trait]
impl Acknowledged for QueueConsumer {
    type Handle = (u64, u64);

    async fn open(&mut self, _: &SubtaskInfo) -> Result<()> {
        self.channel = Some(self.queue.inner().channel());
        Ok(())
    }

    async fn receive(&mut self, out: &mut Vec<Delivery<(u64, u64)>>) -> Result<SourcePoll> {
        {
            let mut q = self.queue.inner();
            let channel = match self.channel {
                Some(c) => c,
                None => {
                    let c = q.channel();
                    self.channel = Some(c);
                    c
                }
            };
            let mut held = q.unacked.range((channel, 0)..=(channel, u64::MAX)).count();
            while held < self.prefetch {
                let Some(m) = q.ready.pop_front() else { break };
                let tag = q.tags.get_mut(&channel).expect("an open channel");
                *tag += 1;
                let tag = *tag;
                out.push(Delivery {
                    handle: (channel, tag),
                    id: m.id.clone(),
                    record: Record {
                        value: m.value.clone(),
                        ..Default::default()
                    },
                });
                q.unacked.insert((channel, tag), m);
                held += 1;
            }
        }
        if out.is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
            return Ok(SourcePoll::Idle);
        }
        Ok(SourcePoll::Ready)
    }

    async fn acknowledge(&mut self, handles: Vec<(u64, u64)>) -> std::result::Result<(), String> {
        let mut q = self.queue.inner();
        let Some(channel) = self.channel else {
            // The channel closed: its messages were given back, nothing to acknowledge.
            return Ok(());
        };
        if q.failing_acks > 0 {
            q.failing_acks -= 1;
            q.failed_acks += 1;
            q.close(channel);
            self.channel = None;
            return Err("the channel closed (a failure the test asked for)".into());
        }
        if q.losing_acks > 0 {
            q.losing_acks -= 1;
            return Ok(());
        }
        // Handles of an earlier channel name deliveries the broker gave back when it
        // closed: their tags mean other deliveries on this one.
        for (c, tag) in handles.into_iter().filter(|(c, _)| *c == channel) {
            if q.unacked.remove(&(c, tag)).is_none() {
                // AMQP closes the channel on an unknown delivery tag.
                q.close(channel);
                self.channel = None;
                return Err(format!("unknown delivery tag {tag}: the channel closed"));
            }
            q.acked += 1;
        }
        Ok(())
    }
}
