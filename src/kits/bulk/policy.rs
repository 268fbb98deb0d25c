//! What becomes of an action the target refused, or that could not be encoded: the
//! job's error policy ([`OnError`], `on_item_error` in a job file), with an optional
//! hook that decides first (Flink's ActionRequestFailureHandler; the Elasticsearch
//! sink's `FailureHandler`). Transient failures are retried before it is asked.

use super::outcome::ItemFailure;
use super::processor::INVALID_DOCUMENT;
use super::target::Decision;
use crate::dead_letter::OnError;
use std::sync::Arc;

/// A hook of the failure policy: its decision about an action, or `None` to leave it
/// to the policy's [`OnError`].
pub type FailureHook<A> = Arc<dyn Fn(&A, &ItemFailure) -> Option<Decision<A>> + Send + Sync>;

/// The failure policy of a bulk sink: `hook` decides first; where it has nothing to say
/// (or there is none), `on_error` does: [`OnError::Fail`] fails the job with a message
/// naming the system, the action and its refusal; [`OnError::Skip`] drops the action
/// (counted as `dropped`); [`OnError::DeadLetter`] writes it to that topic.
pub struct FailurePolicy<A> {
    pub on_error: OnError,
    pub hook: Option<FailureHook<A>>,
}

impl<A> Clone for FailurePolicy<A> {
    fn clone(&self) -> Self {
        FailurePolicy {
            on_error: self.on_error.clone(),
            hook: self.hook.clone(),
        }
    }
}

impl<A> FailurePolicy<A> {
    /// The policy `on_error`, without a hook.
    pub fn new(on_error: OnError) -> FailurePolicy<A> {
        FailurePolicy {
            on_error,
            hook: None,
        }
    }

    /// With `hook` deciding first.
    pub fn with_hook(
        mut self,
        hook: impl Fn(&A, &ItemFailure) -> Option<Decision<A>> + Send + Sync + 'static,
    ) -> FailurePolicy<A> {
        self.hook = Some(Arc::new(hook));
        self
    }

    /// What becomes of `action`, which `system` refused with `failure` (`what` names
    /// the action in the message of a failed job). An action that could not be encoded
    /// ([`INVALID_DOCUMENT`]) fails the job with its reason alone, which names the
    /// record.
    pub fn decide(
        &self,
        system: &str,
        action: &A,
        what: impl FnOnce(&A) -> String,
        failure: &ItemFailure,
    ) -> Decision<A> {
        if let Some(decision) = self.hook.as_ref().and_then(|h| h(action, failure)) {
            return decision;
        }
        match &self.on_error {
            OnError::Fail if failure.error_type == INVALID_DOCUMENT => {
                Decision::Fail(failure.reason.clone())
            }
            OnError::Fail => Decision::Fail(format!(
                "{system} refused {}: {} {}: {}",
                what(action),
                failure.status,
                failure.error_type,
                failure.reason
            )),
            OnError::Skip => Decision::Drop,
            OnError::DeadLetter(topic) => Decision::DeadLetter(topic.clone()),
        }
    }
}
