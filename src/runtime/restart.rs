//! Whether, and when, a failed job restarts: a plain function over the failure history,
//! with no clock and no randomness of its own (both are arguments), so that every
//! strategy is proved by a table test. The executor only drives it.
//!
//! The strategies are Flink's:
//! - `exponential-delay` (the default): the delay doubles (`multiplier`) from
//!   `initial_delay_ms` up to `max_delay_ms`, with `jitter`; a failure more than
//!   `reset_after_ms` after the previous one starts a new streak (the backoff resets).
//!   The job gives up after `attempts` restarts *in one streak*, so outages weeks apart
//!   never add up, while a job that can never start still ends.
//! - `failure-rate`: restarts after `delay_ms` until more than `max_failures` failures
//!   fall within `interval_ms`.
//! - `fixed-delay`: `attempts` restarts over the life of the process, `delay_ms` apart.
//! - `none`: the first failure fails the job.

use crate::job::{ExponentialDelay, RestartPolicy};
use std::time::Duration;

/// What to do after a failure.
#[derive(Debug, Clone, PartialEq)]
pub enum Restart {
    /// Restart from the last completed checkpoint after this delay.
    After(Duration),
    /// Fail the job; the reason names the strategy's limit that was reached.
    GiveUp(String),
}

/// The decision for the failure at `now_ms`, given the earlier failures of this run
/// (`history_ms`, oldest first, every one of them at or before `now_ms`; each was
/// followed by a restart, or the run would have ended). `unit` is a random number in
/// `[0, 1)` that only the jitter of `exponential-delay` uses; any clock works as long
/// as `history_ms` and `now_ms` use the same one.
pub fn next_restart(policy: &RestartPolicy, history_ms: &[u64], now_ms: u64, unit: f64) -> Restart {
    match *policy {
        RestartPolicy::None => Restart::GiveUp("the restart strategy is none".into()),
        RestartPolicy::FixedDelay { attempts, delay_ms } => {
            let restarts = history_ms.len() as u64;
            if restarts >= u64::from(attempts) {
                Restart::GiveUp(format!(
                    "fixed-delay: all {attempts} restart attempts of this process are used"
                ))
            } else {
                Restart::After(Duration::from_millis(delay_ms))
            }
        }
        RestartPolicy::FailureRate {
            max_failures,
            interval_ms,
            delay_ms,
        } => {
            let recent = history_ms
                .iter()
                .filter(|&&t| now_ms.saturating_sub(t) < interval_ms)
                .count() as u64
                + 1;
            if recent > u64::from(max_failures) {
                Restart::GiveUp(format!(
                    "failure-rate: {recent} failures within {interval_ms} ms (max_failures = {max_failures})"
                ))
            } else {
                Restart::After(Duration::from_millis(delay_ms))
            }
        }
        RestartPolicy::ExponentialDelay(e) => exponential(&e, history_ms, now_ms, unit),
    }
}

/// Failures in the current streak, the one at `now_ms` included: the run of failures,
/// back from `now_ms`, each less than `reset_after_ms` after the one before it.
pub fn streak(history_ms: &[u64], now_ms: u64, reset_after_ms: u64) -> u32 {
    let mut n = 1u32;
    let mut later = now_ms;
    for &t in history_ms.iter().rev() {
        if later.saturating_sub(t) >= reset_after_ms {
            break;
        }
        n = n.saturating_add(1);
        later = t;
    }
    n
}

fn exponential(e: &ExponentialDelay, history_ms: &[u64], now_ms: u64, unit: f64) -> Restart {
    let n = streak(history_ms, now_ms, e.reset_after_ms);
    if n > e.attempts {
        return Restart::GiveUp(format!(
            "exponential-delay: {n} failures in a row, none of them {} ms after the previous one (attempts = {})",
            e.reset_after_ms, e.attempts
        ));
    }
    // Capped before it can overflow: multiplier^(n-1) only grows.
    let mut base = e.initial_delay_ms as f64;
    for _ in 1..n {
        base *= e.multiplier;
        if base >= e.max_delay_ms as f64 {
            break;
        }
    }
    let base = base.min(e.max_delay_ms as f64);
    // unit in [0, 1) -> a factor in [1 - jitter, 1 + jitter).
    let factor = 1.0 + e.jitter * (2.0 * unit.clamp(0.0, 1.0) - 1.0);
    Restart::After(Duration::from_millis(
        (base * factor).round().max(0.0) as u64
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1000;
    const MIN: u64 = 60 * S;
    const H: u64 = 60 * MIN;
    const DAY: u64 = 24 * H;

    fn exp() -> ExponentialDelay {
        ExponentialDelay {
            jitter: 0.0,
            ..ExponentialDelay::default()
        }
    }

    fn after(ms: u64) -> Restart {
        Restart::After(Duration::from_millis(ms))
    }

    fn gives_up(r: &Restart) -> bool {
        matches!(r, Restart::GiveUp(_))
    }

    /// What, policy, history, now, the expected delay (None: give up).
    type Case = (&'static str, RestartPolicy, Vec<u64>, u64, Option<u64>);

    /// Every strategy, case by case: (what, policy, history, now, expected; None = give
    /// up).
    #[test]
    fn restart_decisions() {
        let fixed = RestartPolicy::FixedDelay {
            attempts: 3,
            delay_ms: 100,
        };
        let rate = RestartPolicy::FailureRate {
            max_failures: 3,
            interval_ms: 10 * MIN,
            delay_ms: 500,
        };
        let e = RestartPolicy::ExponentialDelay(ExponentialDelay {
            attempts: 100,
            ..exp()
        });
        let e3 = RestartPolicy::ExponentialDelay(ExponentialDelay {
            attempts: 3,
            ..exp()
        });
        let weeks = [0, 14 * DAY, 28 * DAY];
        let table: Vec<Case> = vec![
            (
                "none gives up at once",
                RestartPolicy::None,
                vec![],
                0,
                None,
            ),
            ("fixed: first failure", fixed, vec![], 5, Some(100)),
            ("fixed: third failure", fixed, vec![1, 2], 5, Some(100)),
            (
                "fixed: fourth failure gives up",
                fixed,
                vec![1, 2, 3],
                5,
                None,
            ),
            (
                "fixed counts over the life of the process (weeks apart)",
                fixed,
                weeks.to_vec(),
                42 * DAY,
                None,
            ),
            ("rate: first failure", rate, vec![], 0, Some(500)),
            (
                "rate: third in the interval",
                rate,
                vec![MIN, 2 * MIN],
                3 * MIN,
                Some(500),
            ),
            (
                "rate: fourth in the interval gives up",
                rate,
                vec![MIN, 2 * MIN, 3 * MIN],
                4 * MIN,
                None,
            ),
            (
                "rate: failures that left the interval do not count",
                rate,
                vec![0, MIN, 2 * MIN],
                11 * MIN,
                Some(500),
            ),
            (
                "rate: three failures weeks apart do not kill the job",
                rate,
                weeks.to_vec(),
                42 * DAY,
                Some(500),
            ),
            (
                "exp: first failure waits initial_delay",
                e,
                vec![],
                0,
                Some(1000),
            ),
            (
                "exp: second in a row doubles",
                e,
                vec![0],
                2 * S,
                Some(2000),
            ),
            (
                "exp: third in a row doubles again",
                e,
                vec![0, 2 * S],
                5 * S,
                Some(4000),
            ),
            (
                "exp: the delay stops at max_delay",
                e,
                (0..9).map(|i| i * MIN).collect(),
                9 * MIN,
                Some(60_000),
            ),
            (
                "exp: a quiet period of reset_after resets the backoff",
                e,
                vec![0, 2 * S, 5 * S],
                5 * S + H,
                Some(1000),
            ),
            (
                "exp: just under reset_after does not reset",
                e,
                vec![0, 2 * S, 5 * S],
                5 * S + H - 1,
                Some(8000),
            ),
            (
                "exp: three failures weeks apart do not kill the job",
                e3,
                weeks.to_vec(),
                42 * DAY,
                Some(1000),
            ),
            (
                "exp: attempts restarts in one streak",
                e3,
                vec![0, 2 * S],
                5 * S,
                Some(4000),
            ),
            (
                "exp: one more in the streak gives up",
                e3,
                vec![0, 2 * S, 5 * S],
                10 * S,
                None,
            ),
            (
                "exp: the streak counts only after the last quiet period",
                e3,
                vec![0, 2 * S, 5 * S, DAY, DAY + 2 * S],
                DAY + 5 * S,
                Some(4000),
            ),
        ];
        for (what, policy, history, now, want) in table {
            let got = next_restart(&policy, &history, now, 0.5);
            match want {
                Some(ms) => assert_eq!(got, after(ms), "{what}"),
                None => assert!(gives_up(&got), "{what}: {got:?}"),
            }
        }
    }

    #[test]
    fn a_job_that_can_never_start_ends_under_the_default_strategy() {
        // Every attempt fails at once: the failures are the delays apart.
        let policy = RestartPolicy::default();
        let (mut history, mut now) = (Vec::new(), 0u64);
        loop {
            match next_restart(&policy, &history, now, 0.999) {
                Restart::After(d) => {
                    history.push(now);
                    now += d.as_millis() as u64;
                }
                Restart::GiveUp(why) => {
                    assert!(why.contains("exponential-delay"), "{why}");
                    break;
                }
            }
            assert!(history.len() < 1000, "never gave up");
        }
        let ExponentialDelay { attempts, .. } = ExponentialDelay::default();
        assert_eq!(
            history.len(),
            attempts as usize,
            "restarts before giving up"
        );
        assert!(now < H, "gave up after {now} ms, within an hour");
    }

    #[test]
    fn jitter_stays_within_its_bounds() {
        let e = ExponentialDelay {
            jitter: 0.1,
            attempts: 100,
            ..ExponentialDelay::default()
        };
        let policy = RestartPolicy::ExponentialDelay(e);
        // Fourth failure in a row: 8000 ms before jitter, so 7200..=8800 ms.
        let history = [0, 2 * S, 5 * S];
        let mut seen = Vec::new();
        for i in 0..=100 {
            let unit = f64::from(i) / 100.0;
            let Restart::After(d) = next_restart(&policy, &history, 10 * S, unit) else {
                panic!("gave up")
            };
            let ms = d.as_millis() as u64;
            assert!((7200..=8800).contains(&ms), "unit {unit}: {ms} ms");
            seen.push(ms);
        }
        assert_eq!(seen[0], 7200, "the low end");
        assert_eq!(seen[50], 8000, "the middle is the base delay");
        assert_eq!(seen[100], 8800, "the high end");
        // At max_delay the jitter still applies, on both sides.
        let long: Vec<u64> = (0..12).map(|i| i * MIN).collect();
        for (unit, want) in [(0.0, 54_000), (0.5, 60_000), (1.0, 66_000)] {
            assert_eq!(
                next_restart(&policy, &long, 12 * MIN, unit),
                after(want),
                "unit {unit}"
            );
        }
    }

    #[test]
    fn streaks_break_at_quiet_periods() {
        assert_eq!(streak(&[], 5, 10), 1);
        assert_eq!(streak(&[0, 5], 9, 10), 3);
        assert_eq!(
            streak(&[0, 10], 15, 10),
            2,
            "a gap of exactly reset_after resets"
        );
        assert_eq!(streak(&[0, 100, 105], 109, 10), 3);
    }
}
