//! Requests an operator makes of a running job: stop with a final checkpoint, pause
//! and resume the sources, take a checkpoint now (the control API of
//! [`crate::telemetry::server`], on `[control] enabled = true`).
//!
//! A [`JobControl`] is shared by whoever asks (the HTTP handlers, the SIGTERM handler)
//! and the run that answers ([`crate::runtime::run`] through
//! [`crate::runtime::RunOptions::control`]). Requests outlive an attempt: a pause holds
//! across in-process restarts, and a checkpoint asked for while the job restarts is
//! taken by the next attempt.

use lockgate_state::CheckpointId;
use std::sync::{Arc, Mutex};
use tokio::sync::{oneshot, watch};

/// `[control]` of a job file: the control API is served only when this is set.
#[derive(Debug, Clone, Default)]
pub struct ControlSettings {
    /// The bearer token every control request must carry (`token_file`); `None`: any
    /// client that reaches the listener may control the job.
    pub token: Option<crate::secret::Secret>,
}

/// A checkpoint taken on request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    pub id: u64,
    /// Where it was published (a `chk-N` directory or a store URL).
    pub path: String,
}

/// Why a requested checkpoint was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotTaken {
    /// The checkpoint that would have answered was aborted (declined, expired, its
    /// publish failed), or its attempt failed before it completed; asking again may
    /// succeed.
    Aborted(String),
    /// The job ended first.
    Ended(String),
}

impl std::fmt::Display for NotTaken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotTaken::Aborted(why) | NotTaken::Ended(why) => f.write_str(why),
        }
    }
}

/// One request for a checkpoint, answered by the first checkpoint triggered after it
/// was seen (`from`, set when the run takes the request).
struct Waiter {
    from: Option<CheckpointId>,
    reply: oneshot::Sender<Result<Taken, NotTaken>>,
}

struct Inner {
    stop: watch::Sender<bool>,
    paused: watch::Sender<bool>,
    waiters: Mutex<Vec<Waiter>>,
}

/// The handle both sides share (cheap to clone).
#[derive(Clone)]
pub struct JobControl {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for JobControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobControl")
            .field("stopping", &self.is_stopping())
            .field("paused", &self.is_paused())
            .finish_non_exhaustive()
    }
}

impl Default for JobControl {
    fn default() -> Self {
        JobControl::new()
    }
}

impl JobControl {
    /// A handle with nothing requested: running, not paused.
    pub fn new() -> JobControl {
        JobControl {
            inner: Arc::new(Inner {
                stop: watch::channel(false).0,
                paused: watch::channel(false).0,
                waiters: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Asks the job to stop with a final checkpoint (what SIGTERM does).
    pub fn stop(&self) {
        self.inner.stop.send_replace(true);
    }

    /// Whether a stop was asked for.
    pub fn is_stopping(&self) -> bool {
        *self.inner.stop.borrow()
    }

    /// Becomes `true` when a stop is asked for ([`crate::runtime::RunOptions::stop`]).
    pub fn stop_signal(&self) -> watch::Receiver<bool> {
        self.inner.stop.subscribe()
    }

    /// Pauses (`true`) or resumes (`false`) the sources; returns whether that changed
    /// anything.
    pub fn set_paused(&self, paused: bool) -> bool {
        self.inner
            .paused
            .send_if_modified(|p| std::mem::replace(p, paused) != paused)
    }

    /// Whether the sources are paused.
    pub fn is_paused(&self) -> bool {
        *self.inner.paused.borrow()
    }

    /// Asks for a checkpoint and waits until the first checkpoint triggered after the
    /// run saw the request is published (its id and path) or aborted.
    pub async fn checkpoint(&self) -> Result<Taken, NotTaken> {
        let (reply, answer) = oneshot::channel();
        self.waiters().push(Waiter { from: None, reply });
        answer
            .await
            .unwrap_or_else(|_| Err(NotTaken::Ended("the job ended".into())))
    }

    fn waiters(&self) -> std::sync::MutexGuard<'_, Vec<Waiter>> {
        self.inner.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Run side (polled with the coordinator's clock): the requests not taken yet are answered by checkpoint `next` or a
    /// later one. Returns whether there were any (the run then triggers one).
    pub(crate) fn take_requests(&self, next: CheckpointId) -> bool {
        let mut any = false;
        for w in self.waiters().iter_mut().filter(|w| w.from.is_none()) {
            w.from = Some(next);
            any = true;
        }
        any
    }

    /// Run side: checkpoint `id` was published at `path`.
    pub(crate) fn completed(&self, id: CheckpointId, path: &str) {
        self.answer(
            |from| from.is_some_and(|f| f <= id),
            || {
                Ok(Taken {
                    id: id.0,
                    path: path.to_string(),
                })
            },
        );
    }

    /// Run side: checkpoint `id` was aborted.
    pub(crate) fn aborted(&self, id: CheckpointId, reason: &str) {
        self.answer(
            |from| from.is_some_and(|f| f <= id),
            || {
                Err(NotTaken::Aborted(format!(
                    "checkpoint {} aborted: {reason}",
                    id.0
                )))
            },
        );
    }

    /// Run side: the attempt failed; requests it had taken are answered, those it had
    /// not wait for the next attempt.
    pub(crate) fn attempt_failed(&self, error: &str) {
        self.answer(
            |from| from.is_some(),
            || {
                Err(NotTaken::Aborted(format!(
                    "the job failed before the checkpoint completed and restarts: {error}"
                )))
            },
        );
    }

    /// Run side: the run is over; every request still open is answered.
    pub(crate) fn ended(&self, how: &str) {
        self.answer(|_| true, || Err(NotTaken::Ended(how.to_string())));
    }

    fn answer(
        &self,
        which: impl Fn(Option<CheckpointId>) -> bool,
        result: impl Fn() -> Result<Taken, NotTaken>,
    ) {
        let mut waiters = self.waiters();
        let (now, later): (Vec<_>, Vec<_>) = waiters.drain(..).partition(|w| which(w.from));
        *waiters = later;
        for w in now {
            let _ = w.reply.send(result());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Until a request is waiting.
    async fn requested(c: &JobControl) {
        while c.waiters().iter().all(|w| w.from.is_some()) {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_request_is_answered_by_the_first_checkpoint_triggered_after_it() {
        let c = JobControl::new();
        let asked = {
            let c = c.clone();
            tokio::spawn(async move { c.checkpoint().await })
        };
        requested(&c).await;
        // Checkpoint 4 is pending when the run takes the request: it started before.
        assert!(c.take_requests(CheckpointId(5)));
        assert!(!c.take_requests(CheckpointId(6)), "taken once");
        c.completed(CheckpointId(4), "/c/chk-4");
        c.aborted(CheckpointId(4), "expired");
        assert!(!asked.is_finished());
        c.completed(CheckpointId(5), "/c/chk-5");
        assert_eq!(
            asked.await.unwrap(),
            Ok(Taken {
                id: 5,
                path: "/c/chk-5".into()
            })
        );
    }

    #[tokio::test]
    async fn aborts_failures_and_the_end_answer_with_the_reason() {
        let c = JobControl::new();
        let ask = || {
            let c = c.clone();
            tokio::spawn(async move { c.checkpoint().await })
        };
        let first = ask();
        requested(&c).await;
        c.take_requests(CheckpointId(2));
        c.aborted(CheckpointId(2), "declined by sink-0");
        let got = first.await.unwrap().unwrap_err();
        assert_eq!(
            got,
            NotTaken::Aborted("checkpoint 2 aborted: declined by sink-0".into())
        );

        let taken = ask();
        requested(&c).await;
        c.take_requests(CheckpointId(3));
        let waiting = ask();
        while c.waiters().len() < 2 {
            tokio::task::yield_now().await;
        }
        c.attempt_failed("sink-0: connection refused");
        assert!(
            matches!(taken.await.unwrap(), Err(NotTaken::Aborted(m)) if m.contains("connection refused"))
        );
        // The request the failed attempt never took waits for the next one, or the end.
        assert!(!waiting.is_finished());
        c.ended("the job finished");
        assert_eq!(
            waiting.await.unwrap(),
            Err(NotTaken::Ended("the job finished".into()))
        );
    }

    #[test]
    fn pausing_twice_changes_nothing_the_second_time() {
        let c = JobControl::new();
        assert!(c.set_paused(true));
        assert!(!c.set_paused(true));
        assert!(c.is_paused());
        assert!(c.set_paused(false));
        assert!(!c.is_stopping());
        c.stop();
        assert!(*c.stop_signal().borrow());
    }
}
