//! What an action does to its document, for the batcher's tests: the kinds of effect a
//! document store's writes have (a full write, a delete, a merge of fields, external
//! versions) and when a later one supersedes an earlier one, without naming a target.
//! The same table as the Elasticsearch sink's effects, so that the rules are checked
//! against the cases a real target has.

use super::Supersedes;
use std::collections::BTreeMap;

/// What an action does to its document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TestEffect {
    /// Replaces the whole document.
    Replace { version: Option<i64> },
    /// Deletes the document (a missing document counts as deleted).
    Delete { version: Option<i64> },
    /// Merges these fields into the document, creating it if absent.
    Merge(Shape),
    /// Anything else: never coalesced.
    Opaque,
}

/// The fields of a merged document: `Some(shape)` for an object (merged field by field),
/// `None` for any other value (replaced as a whole).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Shape(BTreeMap<String, Option<Shape>>);

impl Shape {
    fn of(v: &serde_json::Map<String, serde_json::Value>) -> Shape {
        Shape(
            v.iter()
                .map(|(k, v)| (k.clone(), v.as_object().map(Shape::of)))
                .collect(),
        )
    }

    /// Merging `self` after `older` leaves what merging `self` alone leaves.
    fn covers(&self, older: &Shape) -> bool {
        older.0.iter().all(|(k, old)| match self.0.get(k) {
            None => false,
            Some(None) => true,
            Some(Some(new)) => old.as_ref().is_some_and(|old| new.covers(old)),
        })
    }
}

impl TestEffect {
    /// A merge of the fields of `doc`, a JSON object (anything else is opaque).
    pub(crate) fn merge(doc: &str) -> TestEffect {
        serde_json::from_str::<serde_json::Value>(doc)
            .ok()
            .and_then(|v| v.as_object().map(Shape::of))
            .map_or(TestEffect::Opaque, TestEffect::Merge)
    }

    fn version(&self) -> Option<i64> {
        match self {
            TestEffect::Replace { version } | TestEffect::Delete { version } => *version,
            TestEffect::Merge(_) | TestEffect::Opaque => None,
        }
    }
}

impl Supersedes for TestEffect {
    fn supersedes(&self, older: &TestEffect) -> bool {
        // External versions: only a strictly newer version decides alone. Mixed is never
        // coalesced.
        let versions_allow = match (self.version(), older.version()) {
            (None, None) => true,
            (Some(new), Some(old)) => new > old,
            _ => false,
        };
        match self {
            TestEffect::Replace { .. } | TestEffect::Delete { .. } => versions_allow,
            TestEffect::Merge(new) => matches!(older, TestEffect::Merge(old) if new.covers(old)),
            TestEffect::Opaque => false,
        }
    }
}
