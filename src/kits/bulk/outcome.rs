//! What a bulk target's answers mean to the kit: the outcome of one item, of a whole
//! request, and why an item was refused. A target classifies its own protocol's
//! statuses into these (the Elasticsearch sink: `item_result::classify`).

/// The meaning of one item result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Written (or, for a delete, already absent).
    Done,
    /// Already written by an earlier attempt or a replay (Elasticsearch: 409 under
    /// create or external versioning): counts as written.
    AlreadyWritten,
    /// Transient: retry this item (with backoff, bounded).
    Retry,
    /// Refused for this item (Elasticsearch: a mapping or parse error): the sink's
    /// failure policy decides (fail the job, or dead-letter the record).
    Rejected,
    /// The job cannot go on (refused credentials: HTTP 401 / 403).
    Fatal,
}

/// The meaning of a whole-request failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestOutcome {
    /// Retry every item of the request.
    Retry,
    /// Too large (HTTP 413): split the request and send the halves.
    Split,
    /// Refused credentials (HTTP 401 / 403): fail the job.
    Fatal,
    /// The request itself is malformed (HTTP 400 and other 4xx): fail the job.
    Malformed,
}

/// Why the target refused an item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemFailure {
    /// The item's (or the request's) status (HTTP for Elasticsearch).
    pub status: u16,
    pub error_type: String,
    pub reason: String,
}

impl ItemFailure {
    /// The `error_type` of [`ItemFailure::too_large`].
    pub const TOO_LARGE: &'static str = "content_too_long";

    /// Why a single action is refused when a request holding only it is still too large
    /// (HTTP 413): it cannot be split further.
    pub fn too_large(reason: String) -> ItemFailure {
        ItemFailure {
            status: 413,
            error_type: ItemFailure::TOO_LARGE.into(),
            reason,
        }
    }
}
