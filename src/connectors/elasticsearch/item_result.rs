//! What a bulk item result means: a plain function over the operation, the versioning,
//! the status and the error type, with the whole table tested below.

use super::action::OpType;
pub use crate::kits::bulk::{Outcome, RequestOutcome};

/// Classifies one item result.
///
/// A 409 under `create` or external versions is already written: the document exists
/// (`create`) or holds this version or a newer one. For a replayed write refused the
/// first time (a mapping error) that is only so because the sink never lets a newer
/// write of the document be applied before the refusal was acted on
/// ([`super::config::EsSinkConfig::one_write_per_document`]): a newer version means the
/// earlier write was written, dead-lettered or failed on.
pub fn classify(
    op: OpType,
    external_version: bool,
    status: u16,
    error_type: Option<&str>,
) -> Outcome {
    match error_type {
        Some("es_rejected_execution_exception") => return Outcome::Retry,
        // An ingest pipeline's `fail` processor refuses the document on purpose, with a
        // 500: the same document fails again, so the policy decides (a retry would
        // fail the job, and the restarted job again, forever).
        Some("fail_processor_exception") => return Outcome::Rejected,
        _ => {}
    }
    match status {
        200..=299 => Outcome::Done,
        404 if op == OpType::Delete => Outcome::Done,
        409 if op == OpType::Create || external_version => Outcome::AlreadyWritten,
        // A concurrent update of the same document: trying again is safe.
        409 if op == OpType::Update => Outcome::Retry,
        401 | 403 => Outcome::Fatal,
        429 | 500..=599 => Outcome::Retry,
        _ => Outcome::Rejected,
    }
}

/// Classifies a request that did not return item results. `None` is a connection
/// error (no status).
pub fn classify_request(status: Option<u16>) -> RequestOutcome {
    match status {
        None | Some(429) | Some(500..=599) | Some(408) => RequestOutcome::Retry,
        Some(413) => RequestOutcome::Split,
        Some(401) | Some(403) => RequestOutcome::Fatal,
        Some(_) => RequestOutcome::Malformed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use OpType::*;

    #[test]
    fn item_table() {
        let rejected = Some("es_rejected_execution_exception");
        let cases: &[(OpType, bool, u16, Option<&str>, Outcome)] = &[
            (
                Index,
                false,
                500,
                Some("fail_processor_exception"),
                Outcome::Rejected,
            ),
            (
                Create,
                false,
                500,
                Some("illegal_state_exception"),
                Outcome::Retry,
            ),
            (Index, false, 201, None, Outcome::Done),
            (Index, false, 200, None, Outcome::Done),
            (Update, false, 200, None, Outcome::Done),
            (Delete, false, 200, None, Outcome::Done),
            (Delete, false, 404, None, Outcome::Done),
            (
                Create,
                false,
                409,
                Some("version_conflict_engine_exception"),
                Outcome::AlreadyWritten,
            ),
            (
                Index,
                true,
                409,
                Some("version_conflict_engine_exception"),
                Outcome::AlreadyWritten,
            ),
            (
                Delete,
                true,
                409,
                Some("version_conflict_engine_exception"),
                Outcome::AlreadyWritten,
            ),
            (
                Update,
                false,
                409,
                Some("version_conflict_engine_exception"),
                Outcome::Retry,
            ),
            (
                Index,
                false,
                409,
                Some("version_conflict_engine_exception"),
                Outcome::Rejected,
            ),
            (Index, false, 429, rejected, Outcome::Retry),
            (Create, true, 429, rejected, Outcome::Retry),
            (
                Index,
                false,
                503,
                Some("unavailable_shards_exception"),
                Outcome::Retry,
            ),
            (Index, false, 500, None, Outcome::Retry),
            (
                Index,
                false,
                400,
                Some("document_parsing_exception"),
                Outcome::Rejected,
            ),
            (
                Index,
                false,
                400,
                Some("mapper_parsing_exception"),
                Outcome::Rejected,
            ),
            (
                Update,
                false,
                404,
                Some("document_missing_exception"),
                Outcome::Rejected,
            ),
            (
                Index,
                false,
                401,
                Some("security_exception"),
                Outcome::Fatal,
            ),
            (
                Index,
                false,
                403,
                Some("security_exception"),
                Outcome::Fatal,
            ),
        ];
        for (op, ext, status, ty, want) in cases {
            assert_eq!(
                &classify(*op, *ext, *status, *ty),
                want,
                "{op:?} external={ext} {status} {ty:?}"
            );
        }
    }

    #[test]
    fn request_table() {
        assert_eq!(classify_request(None), RequestOutcome::Retry);
        assert_eq!(classify_request(Some(429)), RequestOutcome::Retry);
        assert_eq!(classify_request(Some(503)), RequestOutcome::Retry);
        assert_eq!(classify_request(Some(413)), RequestOutcome::Split);
        assert_eq!(classify_request(Some(401)), RequestOutcome::Fatal);
        assert_eq!(classify_request(Some(400)), RequestOutcome::Malformed);
        // Every arm, and both ends of the 5xx range.
        assert_eq!(classify_request(Some(408)), RequestOutcome::Retry);
        assert_eq!(classify_request(Some(500)), RequestOutcome::Retry);
        assert_eq!(classify_request(Some(599)), RequestOutcome::Retry);
        assert_eq!(classify_request(Some(403)), RequestOutcome::Fatal);
        assert_eq!(classify_request(Some(404)), RequestOutcome::Malformed);
    }
}
