//! Exponential backoff with jitter, bounded.

use std::time::Duration;

/// The delay before attempt `attempt` (1 = the first retry): `initial * 2^(attempt-1)`
/// capped at `max`, of which a random half is kept ("equal jitter": never less than
/// half the exponential delay, so that retries spread without collapsing to zero).
/// `jitter` is a uniform draw in `[0, 1)`.
pub fn backoff(attempt: u32, initial_ms: u64, max_ms: u64, jitter: f64) -> Duration {
    let exp = initial_ms
        .saturating_mul(1u64 << attempt.saturating_sub(1).min(32))
        .min(max_ms);
    let half = exp / 2;
    Duration::from_millis(half + ((exp - half) as f64 * jitter.clamp(0.0, 1.0)) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn grows_and_caps() {
        assert_eq!(backoff(1, 100, 10_000, 1.0), Duration::from_millis(100));
        assert_eq!(backoff(2, 100, 10_000, 1.0), Duration::from_millis(200));
        assert_eq!(backoff(20, 100, 10_000, 1.0), Duration::from_millis(10_000));
        assert_eq!(backoff(3, 100, 10_000, 0.0), Duration::from_millis(200));
    }

    proptest! {
        #[test]
        fn within_half_and_full_of_the_capped_exponential(attempt in 1u32..80, initial in 1u64..1000, max in 1u64..100_000, j in 0.0f64..1.0) {
            let exp = initial.saturating_mul(1u64 << (attempt - 1).min(32)).min(max);
            let d = backoff(attempt, initial, max, j).as_millis() as u64;
            prop_assert!(d >= exp / 2 && d <= exp);
        }
    }
}
