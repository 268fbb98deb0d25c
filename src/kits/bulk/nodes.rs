//! Which node the next bulk request goes to: round robin over the nodes, skipping a node
//! that failed to answer (connection refused, reset or timed out) until its quarantine
//! ends. A pure state machine over a millisecond clock, tested below.
//!
//! A retried request therefore goes to the next live node: with one of two nodes down,
//! every retry after the first connection error reaches the other one instead of
//! spending the retry budget on the dead node half of the time. When every node is in
//! quarantine the one whose quarantine ends first is tried (a request is never refused
//! for want of a node; the batcher's retry bound still applies).

/// The quarantine after a node's first failure; it doubles with every further failure
/// in a row, up to [`MAX_QUARANTINE_MS`].
pub const FIRST_QUARANTINE_MS: u64 = 1_000;
/// The longest quarantine.
pub const MAX_QUARANTINE_MS: u64 = 30_000;

/// Round robin with quarantine of failed nodes.
#[derive(Debug, Clone)]
pub struct NodeSelector {
    next: usize,
    /// Per node: failures in a row, and the end of its quarantine (ms).
    failures: Vec<u32>,
    quarantined_until: Vec<u64>,
}

impl NodeSelector {
    /// A selector over `nodes` nodes (at least one).
    pub fn new(nodes: usize) -> NodeSelector {
        assert!(nodes > 0, "a selector needs a node");
        NodeSelector {
            next: 0,
            failures: vec![0; nodes],
            quarantined_until: vec![0; nodes],
        }
    }

    /// The node of the next request at `now_ms`.
    pub fn pick(&mut self, now_ms: u64) -> usize {
        let n = self.failures.len();
        let live = (0..n)
            .map(|i| (self.next + i) % n)
            .find(|&k| self.quarantined_until[k] <= now_ms);
        let k = live.unwrap_or_else(|| {
            (0..n)
                .min_by_key(|&k| (self.quarantined_until[k], k))
                .expect("at least one node")
        });
        self.next = (k + 1) % n;
        k
    }

    /// Node `node` did not answer at `now_ms`: quarantine it.
    pub fn failed(&mut self, node: usize, now_ms: u64) {
        self.failures[node] = self.failures[node].saturating_add(1);
        let q = FIRST_QUARANTINE_MS
            .saturating_mul(1u64 << (self.failures[node] - 1).min(16))
            .min(MAX_QUARANTINE_MS);
        self.quarantined_until[node] = now_ms.saturating_add(q);
    }

    /// Node `node` answered (whatever the status): it is live again.
    pub fn answered(&mut self, node: usize) {
        self.failures[node] = 0;
        self.quarantined_until[node] = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    enum Step {
        /// pick at t, expect node
        Pick(u64, usize),
        Fail(usize, u64),
        Answer(usize),
    }
    use Step::*;

    fn run(nodes: usize, steps: &[Step]) {
        let mut s = NodeSelector::new(nodes);
        for (i, step) in steps.iter().enumerate() {
            match *step {
                Pick(t, want) => assert_eq!(s.pick(t), want, "step {i}"),
                Fail(n, t) => s.failed(n, t),
                Answer(n) => s.answered(n),
            }
        }
    }

    #[test]
    fn round_robin_when_all_answer() {
        run(3, &[Pick(0, 0), Pick(0, 1), Pick(0, 2), Pick(0, 0)]);
        run(1, &[Pick(0, 0), Pick(5, 0)]);
    }

    #[test]
    fn a_failed_node_is_skipped_until_its_quarantine_ends() {
        run(
            2,
            &[
                Pick(0, 0),
                Fail(0, 10),
                // The retry goes to the other node, and so does everything after it.
                Pick(10, 1),
                Pick(20, 1),
                Pick(1009, 1),
                // Quarantine over: back in the rotation.
                Pick(1010, 0),
                Pick(1010, 1),
            ],
        );
    }

    #[test]
    fn quarantine_doubles_while_failing_and_resets_on_an_answer() {
        run(
            2,
            &[
                Fail(0, 0),
                Fail(0, 1000),
                // Second failure in a row: 2 s from 1000.
                Pick(2999, 1),
                Pick(3000, 0),
                Answer(0),
                Fail(0, 3000),
                // Back to 1 s after an answer.
                Pick(3999, 1),
                Pick(4000, 0),
            ],
        );
    }

    #[test]
    fn with_every_node_quarantined_the_first_to_recover_is_tried() {
        run(
            3,
            &[
                Fail(0, 0),
                Fail(0, 1000), // node 0 until 3000
                Fail(1, 0),    // node 1 until 1000
                Fail(2, 500),  // node 2 until 1500
                Pick(600, 1),
                Pick(600, 1),
            ],
        );
    }

    #[test]
    fn quarantine_is_capped() {
        let mut s = NodeSelector::new(2);
        for t in 0..40 {
            s.failed(0, t);
        }
        assert_eq!(s.quarantined_until[0], 39 + MAX_QUARANTINE_MS);
    }
}
