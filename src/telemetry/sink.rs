//! The metric families of a bulk sink (`lockgate_sink_*`). They are registered with the
//! job's other families, because the status API reads them (`/api/v1/sinks`); the bulk
//! kit takes each subtask's handles from them (`kits::bulk::SinkMetrics`).

use prometheus::{HistogramVec, IntCounterVec, IntGaugeVec};

/// The bulk sink families of a job, by sink subtask (`operator`, `subtask`; requests
/// and items also by `outcome`).
pub struct SinkFamilies {
    pub pending: IntGaugeVec,
    pub in_flight: IntGaugeVec,
    pub requests: IntCounterVec,
    pub items: IntCounterVec,
    pub retry_backoff: HistogramVec,
    pub request_duration: HistogramVec,
    pub bytes_sent: IntCounterVec,
}

/// Registers a family of a kind in the job's registry: name, help, label names.
pub(super) type Register<'a, T> = &'a dyn Fn(&str, &str, &[&str]) -> T;

impl SinkFamilies {
    /// The families, registered with `counter`, `gauge` and `histogram`; per-task
    /// series carry the labels `task`.
    pub(super) fn register(
        counter: Register<IntCounterVec>,
        gauge: Register<IntGaugeVec>,
        histogram: Register<HistogramVec>,
        task: &[&str],
    ) -> SinkFamilies {
        let by_outcome = &["job", "operator", "subtask", "outcome"];
        SinkFamilies {
            pending: gauge(
                "lockgate_sink_pending_actions",
                "Bulk actions taken by the sink and not yet acknowledged by Elasticsearch.",
                task,
            ),
            in_flight: gauge(
                "lockgate_sink_in_flight_requests",
                "Bulk requests sent and not yet answered.",
                task,
            ),
            requests: counter(
                "lockgate_sink_bulk_requests_total",
                "Bulk requests by outcome: ok (every item written), item_errors (item results came back and some items were not written), retried (no usable item results: a connection error, 408, 429, 5xx; every action is sent again after a backoff), too_large (413: split in halves), failed (401, 403 or another 4xx: the job fails).",
                by_outcome,
            ),
            items: counter(
                "lockgate_sink_items_total",
                "Bulk items by outcome: created (201), updated (200), deleted, not_found (a delete of a missing document, counted as written), conflict_already_written (409 under create or external versions: written by an earlier attempt), retried (a transient item failure: 429, 5xx, a concurrent update), dead_lettered, dropped and requeued (by a failure handler), failed (the job fails: refused under on_item_error = fail, out of retries, unauthorized).",
                by_outcome,
            ),
            retry_backoff: histogram(
                "lockgate_sink_retry_backoff_seconds",
                "Backoff scheduled before a bulk retry (one per response that retries actions).",
                task,
            ),
            request_duration: histogram(
                "lockgate_sink_request_duration_seconds",
                "Time from sending a bulk request to its response.",
                task,
            ),
            bytes_sent: counter(
                "lockgate_sink_sent_bytes_total",
                "Bytes of bulk request bodies sent, before compression.",
                task,
            ),
        }
    }
}
