//! The verdict of an exactly-once check: what a destination holds against what went
//! in, counted one way for `lockgate chaos` and for the conformance suite.
//!
//! Each check reads its own destination and builds its own expectation (the chaos
//! harness runs the job's chain over the inputs it reads back; a conformance case
//! knows the sequence it wrote); both then hand identities to [`compare`], which
//! counts what is missing, duplicated and wrong, and keeps the first few of each.

use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Display;

/// What a destination must hold relative to its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Exactly once (or idempotent): every expected item as many times as expected.
    Exact,
    /// At least once: every expected item at least once, and nothing that was not.
    AtLeastOnce,
}

/// The first problems a verdict describes.
const EXAMPLES: usize = 10;

/// What a check found. Its serde form is `lockgate chaos`'s JSON report.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Verdict {
    pub inputs: u64,
    pub expected_documents: u64,
    pub documents: u64,
    pub missing: u64,
    pub duplicated: u64,
    pub wrong: u64,
    /// Inputs the dead-letter topic names (each once), and so in no document.
    pub dead_lettered: u64,
    /// The first few problems, described.
    pub examples: Vec<String>,
}

impl Verdict {
    /// Nothing missing, duplicated or wrong.
    pub fn exact(&self) -> bool {
        self.missing == 0 && self.duplicated == 0 && self.wrong == 0
    }

    /// Describes one problem, if fewer than ten are described.
    pub fn note(&mut self, what: String) {
        if self.examples.len() < EXAMPLES {
            self.examples.push(what);
        }
    }

    /// The verdict as a case's result: `Ok` when exact, else the counts and the first
    /// problems in one line.
    pub fn case(&self) -> Result<(), String> {
        if self.exact() {
            return Ok(());
        }
        Err(format!(
            "expected {} records, found {}: {} missing, {} duplicated, {} wrong ({})",
            self.expected_documents,
            self.documents,
            self.missing,
            self.duplicated,
            self.wrong,
            self.examples.join("; ")
        ))
    }
}

/// Compares what a destination holds with what it should: `found` gives, for each
/// item read, its identity and what is wrong with its content, if anything (a wrong
/// total). An identity found that no input has is wrong ("not an input"); under
/// [`Expect::AtLeastOnce`] items found more often than expected are not duplicates.
pub fn compare<I: Ord + Display>(
    expected: impl IntoIterator<Item = I>,
    found: impl IntoIterator<Item = (I, Option<String>)>,
    expect: Expect,
) -> Verdict {
    let mut want: BTreeMap<I, u64> = BTreeMap::new();
    for id in expected {
        *want.entry(id).or_default() += 1;
    }
    let inputs = want.values().sum();
    let mut v = Verdict {
        inputs,
        expected_documents: inputs,
        ..Verdict::default()
    };
    let mut have: BTreeMap<I, u64> = BTreeMap::new();
    for (id, problem) in found {
        v.documents += 1;
        if let Some(p) = problem {
            v.wrong += 1;
            v.note(format!("{id}: {p}"));
        }
        *have.entry(id).or_default() += 1;
    }
    for (id, n) in &want {
        let got = have.remove(id).unwrap_or(0);
        if got < *n {
            v.missing += n - got;
            v.note(format!("missing {id} x{}", n - got));
        } else if got > *n && expect == Expect::Exact {
            v.duplicated += got - n;
            v.note(format!("{id} x{got}, expected x{n}"));
        }
    }
    for (id, n) in have {
        v.wrong += n;
        v.note(format!("not an input: {id} x{n}"));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn found(items: &[&str]) -> Vec<(String, Option<String>)> {
        items.iter().map(|s| (s.to_string(), None)).collect()
    }

    #[test]
    fn counts_missing_duplicated_and_foreign_items() {
        let v = compare(
            ["a", "b", "c"].map(String::from),
            found(&["a", "a", "c", "z"]),
            Expect::Exact,
        );
        assert_eq!((v.inputs, v.documents), (3, 4));
        assert_eq!((v.missing, v.duplicated, v.wrong), (1, 1, 1));
        assert_eq!(
            v.examples,
            ["a x2, expected x1", "missing b x1", "not an input: z x1"]
        );
        assert_eq!(
            v.case().unwrap_err(),
            "expected 3 records, found 4: 1 missing, 1 duplicated, 1 wrong (a x2, expected x1; missing b x1; not an input: z x1)"
        );
    }

    #[test]
    fn at_least_once_allows_repeats_but_not_gaps_or_strangers() {
        let ok = compare(
            ["a", "b"].map(String::from),
            found(&["a", "a", "b"]),
            Expect::AtLeastOnce,
        );
        assert_eq!(ok.case(), Ok(()));
        let gap = compare(
            ["a", "b"].map(String::from),
            found(&["a", "a"]),
            Expect::AtLeastOnce,
        );
        assert_eq!((gap.missing, gap.duplicated), (1, 0));
        let stranger = compare(
            ["a"].map(String::from),
            found(&["a", "q"]),
            Expect::AtLeastOnce,
        );
        assert_eq!(stranger.wrong, 1);
    }

    #[test]
    fn a_wrong_content_is_wrong_and_still_present() {
        let v = compare(
            ["a"].map(String::from),
            vec![("a".to_string(), Some("total 3, expected 4".to_string()))],
            Expect::Exact,
        );
        assert_eq!((v.missing, v.wrong), (0, 1));
        assert_eq!(v.examples, ["a: total 3, expected 4"]);
    }

    #[test]
    fn at_most_ten_problems_are_described() {
        let v = compare((0..50).map(|i| i.to_string()), found(&[]), Expect::Exact);
        assert_eq!(v.missing, 50);
        assert_eq!(v.examples.len(), 10);
    }

    proptest! {
        /// Exact means equal multisets, whatever the order.
        #[test]
        fn exact_if_and_only_if_the_multisets_are_equal(
            expected in proptest::collection::vec(0u8..6, 0..20),
            found_items in proptest::collection::vec(0u8..6, 0..20),
        ) {
            let count = |v: &[u8]| v.iter().fold(BTreeMap::new(), |mut m, x| { *m.entry(*x).or_insert(0) += 1; m });
            let v = compare(expected.iter().copied(), found_items.iter().map(|x| (*x, None)), Expect::Exact);
            prop_assert_eq!(v.exact(), count(&expected) == count(&found_items));
            let (e, f) = (expected.len() as u64, found_items.len() as u64);
            // Every found item is matched, duplicated or foreign; every expected one
            // matched or missing.
            prop_assert_eq!(f - v.duplicated - v.wrong, e - v.missing);
        }
    }
}
