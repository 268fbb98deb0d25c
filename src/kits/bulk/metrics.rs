//! A bulk sink's metrics: the families every sink of the kit reports in, by outcome
//! (`lockgate_sink_bulk_requests_total`, `lockgate_sink_items_total`), and one sink
//! subtask's handles on them.

use super::outcome::RequestOutcome;
use crate::telemetry::metrics::Metrics;
use prometheus::{Histogram, IntCounter, IntGauge};
use std::sync::atomic::Ordering;

/// The outcomes of `lockgate_sink_bulk_requests_total`, as indexes of
/// [`SinkMetrics::requests`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestLabel {
    /// Every item written (`errors: false`, or no item failed).
    Ok,
    /// Item results came back and some items were not written (each item is counted
    /// under its own outcome).
    ItemErrors,
    /// No usable item results (a connection error, HTTP 408, 429, 5xx, or item results
    /// that do not match the request): every action of it is retried after a backoff.
    Retried,
    /// 413: split into halves that are sent again (one action alone is refused).
    TooLarge,
    /// 401, 403 or another 4xx: the request is given up and the job fails.
    Failed,
}

impl RequestLabel {
    /// Every outcome, in discriminant order (each is its own index).
    pub const ALL: [RequestLabel; 5] = [
        RequestLabel::Ok,
        RequestLabel::ItemErrors,
        RequestLabel::Retried,
        RequestLabel::TooLarge,
        RequestLabel::Failed,
    ];

    /// The `outcome` label.
    pub fn label(self) -> &'static str {
        match self {
            RequestLabel::Ok => "ok",
            RequestLabel::ItemErrors => "item_errors",
            RequestLabel::Retried => "retried",
            RequestLabel::TooLarge => "too_large",
            RequestLabel::Failed => "failed",
        }
    }

    /// The outcome of a request that returned no item results.
    pub fn of_request(outcome: RequestOutcome) -> RequestLabel {
        match outcome {
            RequestOutcome::Retry => RequestLabel::Retried,
            RequestOutcome::Split => RequestLabel::TooLarge,
            RequestOutcome::Fatal | RequestOutcome::Malformed => RequestLabel::Failed,
        }
    }
}

/// The outcomes of `lockgate_sink_items_total`, as indexes of [`SinkMetrics::items`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemLabel {
    /// Written as a new document.
    Created,
    /// Written over an existing document.
    Updated,
    /// A delete that removed the document.
    Deleted,
    /// A delete of a document that was not there (written: nothing to remove).
    NotFound,
    /// Written by an earlier attempt (Elasticsearch: 409 under `create` or external
    /// versions).
    ConflictAlreadyWritten,
    /// A transient failure of the item (Elasticsearch: 429, 5xx, a concurrent update):
    /// sent again.
    Retried,
    /// Refused, and written to the dead-letter topic.
    DeadLettered,
    /// Refused, and given up by the failure handler on purpose.
    Dropped,
    /// Refused, and replaced by the failure handler's actions.
    Requeued,
    /// Failed the job: refused under `on_item_error = "fail"`, out of retries,
    /// unauthorized, or its dead letter could not be written.
    Failed,
}

impl ItemLabel {
    /// Every outcome, in discriminant order (each is its own index).
    pub const ALL: [ItemLabel; 10] = [
        ItemLabel::Created,
        ItemLabel::Updated,
        ItemLabel::Deleted,
        ItemLabel::NotFound,
        ItemLabel::ConflictAlreadyWritten,
        ItemLabel::Retried,
        ItemLabel::DeadLettered,
        ItemLabel::Dropped,
        ItemLabel::Requeued,
        ItemLabel::Failed,
    ];

    /// The `outcome` label.
    pub fn label(self) -> &'static str {
        match self {
            ItemLabel::Created => "created",
            ItemLabel::Updated => "updated",
            ItemLabel::Deleted => "deleted",
            ItemLabel::NotFound => "not_found",
            ItemLabel::ConflictAlreadyWritten => "conflict_already_written",
            ItemLabel::Retried => "retried",
            ItemLabel::DeadLettered => "dead_lettered",
            ItemLabel::Dropped => "dropped",
            ItemLabel::Requeued => "requeued",
            ItemLabel::Failed => "failed",
        }
    }
}

/// One sink subtask's metric handles, each looked up once when the sink opens: from
/// then on an update is an atomic add, made once per request or response (per-item
/// outcomes are summed first).
pub struct SinkMetrics {
    pub(crate) pending: IntGauge,
    pub(crate) in_flight: IntGauge,
    /// What this instance added to `in_flight`: the gauge is shared with the sink of a
    /// later attempt, so it moves by differences, never by `set`.
    pub(crate) reported_in_flight: std::sync::atomic::AtomicI64,
    requests: [IntCounter; RequestLabel::ALL.len()],
    items: [IntCounter; ItemLabel::ALL.len()],
    pub(crate) retry_backoff: Histogram,
    pub(crate) request_duration: Histogram,
    pub(crate) bytes_sent: IntCounter,
    /// Actions written (or made moot by a newer written one) or dead-lettered.
    pub(crate) records_out: IntCounter,
}

impl SinkMetrics {
    /// The handles of sink subtask `subtask` in `metrics` (operator label `sink`);
    /// every outcome's series exists from now on, at 0.
    pub fn new(metrics: &Metrics, subtask: u16) -> SinkMetrics {
        const OP: &str = crate::connector::SINK_UID;
        let sub = subtask.to_string();
        let labelled = |vec: &prometheus::IntCounterVec, outcome: &str| {
            vec.with_label_values(&[metrics.job(), OP, &sub, outcome])
        };
        SinkMetrics {
            pending: metrics.task_gauge(&metrics.sink.pending, OP, subtask),
            in_flight: metrics.task_gauge(&metrics.sink.in_flight, OP, subtask),
            reported_in_flight: Default::default(),
            requests: RequestLabel::ALL.map(|o| labelled(&metrics.sink.requests, o.label())),
            items: ItemLabel::ALL.map(|o| labelled(&metrics.sink.items, o.label())),
            retry_backoff: metrics.task_histogram(&metrics.sink.retry_backoff, OP, subtask),
            request_duration: metrics.task_histogram(&metrics.sink.request_duration, OP, subtask),
            bytes_sent: metrics.task_counter(&metrics.sink.bytes_sent, OP, subtask),
            records_out: metrics.task_counter(&metrics.records_out, OP, subtask),
        }
    }

    /// This instance has `n` requests out.
    pub(crate) fn report_in_flight(&self, n: usize) {
        let before = self.reported_in_flight.swap(n as i64, Ordering::SeqCst);
        self.in_flight.add(n as i64 - before);
    }

    pub(crate) fn request(&self, outcome: RequestLabel) {
        self.requests[outcome as usize].inc();
    }

    pub(crate) fn items(&self, outcome: ItemLabel, n: usize) {
        if n > 0 {
            self.items[outcome as usize].inc_by(n as u64);
        }
    }
}
