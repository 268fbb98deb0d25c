//! What one run of the job under the harness did, read from its exit status and its log,
//! and the harness's decisions over those outcomes: plain functions over data.

use serde::Serialize;

/// How many consecutive start-up failures with the same error make the harness stop:
/// a run that cannot start will not start on the next attempt either...
pub const HOPELESS_AFTER: usize = 3;

/// ...once those failures span this long. A fault that passes (a broker down for a few
/// seconds) fails a few quick starts too; with [`failure_backoff_ms`] between them, a
/// streak that lasts this long is not such a fault.
pub const HOPELESS_SPAN_MS: u64 = 5_000;

/// How long the harness waits before restarting after the `streak`-th failure in a row:
/// 1 s, 2 s, then 4 s.
pub fn failure_backoff_ms(streak: usize) -> u64 {
    1000u64 << streak.saturating_sub(1).min(2)
}

/// How a run of the job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutcome {
    /// SIGKILLed by the harness.
    Killed,
    /// Aborted at a failpoint (`exit` aborts the process).
    FailpointAbort,
    /// Exited 0: the bounded job reached its end.
    Finished,
    /// Exited with a failure. `started` is whether it got past start-up (emitted records
    /// or completed a checkpoint); `error` is its last `error:` line.
    Failed { error: String, started: bool },
}

/// Which checkpoint a run restored, from its log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Restored {
    /// The name of the checkpoint directory it restored (`chk-0000000042`).
    Checkpoint(String),
    /// It started without a checkpoint.
    Empty,
    /// It ended before it logged its restore decision.
    Unknown,
}

/// The restore decision in one line of a run's log, if the line is one: `restoring ...
/// checkpoint=<path>` or `starting without a checkpoint`.
pub fn restore_decision(line: &str) -> Option<Restored> {
    if line.contains("starting without a checkpoint") {
        return Some(Restored::Empty);
    }
    if !line.contains(" restoring ") && !line.ends_with(" restoring") {
        return None;
    }
    Some(Restored::Checkpoint(checkpoint_name(line)?.to_string()))
}

/// The failpoint that aborted a run, from the line the job prints as it aborts
/// (`failpoint <name>: exit`).
pub fn failpoint_fired(line: &str) -> Option<&str> {
    line.strip_prefix("failpoint ")?.strip_suffix(": exit")
}

/// The checkpoint path of a log line's `checkpoint=<path>` field.
pub fn checkpoint_path(line: &str) -> Option<&str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("checkpoint="))
}

/// The checkpoint directory name of a log line's `checkpoint=<path>` field.
pub fn checkpoint_name(line: &str) -> Option<&str> {
    let path = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("checkpoint="))?;
    path.trim_end_matches('/').rsplit('/').next()
}

/// The error that makes further runs pointless: the last [`HOPELESS_AFTER`] runs (each
/// with the millisecond it ended) all failed at start-up with the same error, over at
/// least [`HOPELESS_SPAN_MS`]. A run that got past start-up, was killed or finished
/// breaks the streak.
pub fn hopeless(outcomes: &[(RunOutcome, u64)]) -> Option<&str> {
    let last = outcomes.get(outcomes.len().checked_sub(HOPELESS_AFTER)?..)?;
    let span = last.last()?.1.saturating_sub(last.first()?.1);
    if span < HOPELESS_SPAN_MS {
        return None;
    }
    let mut errors = last.iter().map(|(o, _)| match o {
        RunOutcome::Failed {
            error,
            started: false,
        } => Some(error.as_str()),
        _ => None,
    });
    let first = errors.next()??;
    errors.all(|e| e == Some(first)).then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(e: &str, started: bool) -> RunOutcome {
        RunOutcome::Failed {
            error: e.into(),
            started,
        }
    }

    /// Outcomes ending 3 s apart.
    fn timed(outcomes: Vec<RunOutcome>) -> Vec<(RunOutcome, u64)> {
        outcomes.into_iter().zip((0..).map(|i| i * 3000)).collect()
    }

    #[test]
    fn a_quick_streak_is_not_hopeless_yet() {
        let a = failed("error: broker down", false);
        let quick = vec![(a.clone(), 0), (a.clone(), 1000), (a.clone(), 3000)];
        assert_eq!(hopeless(&quick), None, "a few seconds of a passing fault");
        let slow = vec![(a.clone(), 0), (a.clone(), 2000), (a.clone(), 6000)];
        assert_eq!(hopeless(&slow), Some("error: broker down"));
        assert_eq!(
            (1..=5).map(failure_backoff_ms).collect::<Vec<_>>(),
            vec![1000, 2000, 4000, 4000, 4000]
        );
    }

    #[test]
    fn three_identical_start_up_failures_in_a_row_are_hopeless() {
        let a = failed("error: none verifies", false);
        let cases: Vec<(Vec<RunOutcome>, Option<&str>)> = vec![
            (vec![], None),
            (vec![a.clone(), a.clone()], None),
            (
                vec![a.clone(), a.clone(), a.clone()],
                Some("error: none verifies"),
            ),
            (
                vec![RunOutcome::Killed, a.clone(), a.clone(), a.clone()],
                Some("error: none verifies"),
            ),
            // A kill, a finish or a run that started breaks the streak.
            (
                vec![a.clone(), RunOutcome::Killed, a.clone(), a.clone()],
                None,
            ),
            (vec![a.clone(), a.clone(), RunOutcome::FailpointAbort], None),
            (
                vec![a.clone(), failed("error: none verifies", true), a.clone()],
                None,
            ),
            // Different errors are not one hopeless error.
            (
                vec![a.clone(), failed("error: other", false), a.clone()],
                None,
            ),
            (
                vec![
                    RunOutcome::Finished,
                    RunOutcome::Finished,
                    RunOutcome::Finished,
                ],
                None,
            ),
        ];
        for (outcomes, want) in cases {
            assert_eq!(hopeless(&timed(outcomes.clone())), want, "{outcomes:?}");
        }
    }

    #[test]
    fn the_aborting_failpoint_is_read_from_its_line() {
        assert_eq!(
            failpoint_fired("failpoint mid-metadata: exit"),
            Some("mid-metadata")
        );
        assert_eq!(failpoint_fired("INFO failpoint mid-metadata: exit"), None);
        assert_eq!(failpoint_fired("failpoint mid-metadata: sleep"), None);
    }

    #[test]
    fn restore_decisions_are_read_from_log_lines() {
        let cases = [
            (
                "2026-12-03T01:02:03Z  INFO restoring job=j checkpoint=/tmp/x/checkpoints/chk-0000000004 first_new_checkpoint=6",
                Some(Restored::Checkpoint("chk-0000000004".into())),
            ),
            (
                "2026-12-03T01:02:03Z  INFO starting without a checkpoint job=j first_new_checkpoint=1",
                Some(Restored::Empty),
            ),
            (
                "2026-12-03T01:02:03Z  WARN skipping checkpoint that does not verify checkpoint=/x/chk-0000000005",
                None,
            ),
            ("INFO checkpoint completed checkpoint=3", None),
        ];
        for (line, want) in cases {
            assert_eq!(restore_decision(line), want, "{line}");
        }
    }
}
