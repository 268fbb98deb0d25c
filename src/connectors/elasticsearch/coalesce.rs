//! When a later write on a document makes an earlier one irrelevant: a plain function
//! over what each action does to its document, tested over every pair below.
//!
//! "Irrelevant" is exact: for every state the document may be in, applying the earlier
//! action and then the later one leaves the same document (and version) as applying the
//! later one alone. Only then may the earlier action be dropped unsent (coalescing), or
//! left unretried when the later one succeeded in the same request.

use super::action::{BulkAction, OpType};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What an action does to its document, as far as coalescing needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Replaces the whole document (`index`).
    Replace { version: Option<i64> },
    /// Deletes the document (`delete`; a missing document counts as deleted).
    Delete { version: Option<i64> },
    /// Merges these fields into the document, creating it if absent (an `update` with
    /// `{"doc": ..., "doc_as_upsert": true}` and nothing else). Shared: the actions
    /// of one sink mostly have a few shapes, and a held action then costs a pointer
    /// for its shape rather than a map of field names ([`Shapes`]).
    Merge(Arc<Shape>),
    /// Anything else (`create`, scripted or partial updates): never coalesced.
    Opaque,
}

/// The fields of a merged document: `Some(shape)` for an object (merged field by field
/// by Elasticsearch), `None` for any other value (replaced as a whole).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Shape(pub BTreeMap<String, Option<Shape>>);

impl Shape {
    fn of(v: &serde_json::Map<String, serde_json::Value>) -> Shape {
        Shape(
            v.iter()
                .map(|(k, v)| (k.clone(), v.as_object().map(Shape::of)))
                .collect(),
        )
    }

    /// Merging `self` after `older` leaves what merging `self` alone leaves: every field
    /// of `older` is set again by `self`, and where both are objects, recursively so.
    pub fn covers(&self, older: &Shape) -> bool {
        older.0.iter().all(|(k, old)| match self.0.get(k) {
            None => false,
            // A non-object value replaces whatever was there.
            Some(None) => true,
            Some(Some(new)) => old.as_ref().is_some_and(|old| new.covers(old)),
        })
    }
}

impl Effect {
    /// What `action` does to its document.
    pub fn of(action: &BulkAction) -> Effect {
        Effect::of_parts(action.op, action.version, action.body.as_deref())
    }

    /// What an action of type `op` with this version and body does to its document.
    pub fn of_parts(op: OpType, version: Option<i64>, body: Option<&[u8]>) -> Effect {
        Effect::of_shared(op, version, body, &mut Shapes::default())
    }

    /// [`Effect::of_parts`], with a merge's shape shared through `shapes`.
    pub fn of_shared(
        op: OpType,
        version: Option<i64>,
        body: Option<&[u8]>,
        shapes: &mut Shapes,
    ) -> Effect {
        match op {
            OpType::Index => Effect::Replace { version },
            OpType::Delete => Effect::Delete { version },
            OpType::Update if version.is_none() => body
                .and_then(upsert_shape)
                .map_or(Effect::Opaque, |s| Effect::Merge(shapes.share(s))),
            OpType::Update | OpType::Create => Effect::Opaque,
        }
    }

    fn version(&self) -> Option<i64> {
        match self {
            Effect::Replace { version } | Effect::Delete { version } => *version,
            Effect::Merge(_) | Effect::Opaque => None,
        }
    }

    /// Whether `self`, applied after `older` on the same document, makes `older`
    /// irrelevant. Transitive (tested below): what a write supersedes, together with
    /// everything that superseded in turn, is irrelevant once that write is applied —
    /// the batcher relies on it when a later write overtakes a chain of set-aside ones.
    pub fn supersedes(&self, older: &Effect) -> bool {
        // External versions: only a strictly newer version decides alone (an older or
        // equal one is refused where the earlier was applied). Mixed is never coalesced.
        let versions_allow = match (self.version(), older.version()) {
            (None, None) => true,
            (Some(new), Some(old)) => new > old,
            _ => false,
        };
        match self {
            Effect::Replace { .. } | Effect::Delete { .. } => versions_allow,
            Effect::Merge(new) => matches!(older, Effect::Merge(old) if new.covers(old)),
            Effect::Opaque => false,
        }
    }
}

impl crate::kits::bulk::Supersedes for Effect {
    fn supersedes(&self, older: &Effect) -> bool {
        Effect::supersedes(self, older)
    }
}

/// The shapes seen last, so that actions of the same shape share one: without it, each
/// held upsert kept its own map of field names, several times the size of its request
/// lines, outside what `buffer_max_bytes` counts.
#[derive(Debug, Default)]
pub struct Shapes {
    recent: Vec<Arc<Shape>>,
}

/// Distinct shapes [`Shapes`] keeps (a sink's actions mostly have one or two).
const RECENT_SHAPES: usize = 8;

impl Shapes {
    /// `shape`, or an equal one seen recently.
    pub fn share(&mut self, shape: Shape) -> Arc<Shape> {
        if let Some(at) = self.recent.iter().position(|s| **s == shape) {
            // Most recent last: a steady shape is found at the first comparison.
            let s = self.recent.remove(at);
            self.recent.push(s.clone());
            return s;
        }
        if self.recent.len() == RECENT_SHAPES {
            self.recent.remove(0);
        }
        let s = Arc::new(shape);
        self.recent.push(s.clone());
        s
    }
}

/// The shape of `{"doc": {...}, "doc_as_upsert": true}`, the only update body that is
/// a plain merge.
fn upsert_shape(body: &[u8]) -> Option<Shape> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let o = v.as_object()?;
    if o.len() != 2 || o.get("doc_as_upsert") != Some(&serde_json::Value::Bool(true)) {
        return None;
    }
    o.get("doc")?.as_object().map(Shape::of)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn upsert(doc: &str) -> Effect {
        Effect::of(&BulkAction::upsert("i", "d".into(), doc.as_bytes()))
    }

    fn replace(v: Option<i64>) -> Effect {
        Effect::Replace { version: v }
    }

    fn delete(v: Option<i64>) -> Effect {
        Effect::Delete { version: v }
    }

    #[test]
    fn effects_of_actions() {
        let idx = BulkAction::index("i", Some("d".into()), b"{}".to_vec());
        assert_eq!(Effect::of(&idx), replace(None));
        let create = BulkAction {
            op: OpType::Create,
            ..idx.clone()
        };
        assert_eq!(Effect::of(&create), Effect::Opaque);
        let scripted = BulkAction {
            op: OpType::Update,
            body: Some(br#"{"script":{"source":"ctx._source.n++"}}"#.to_vec()),
            ..idx.clone()
        };
        assert_eq!(Effect::of(&scripted), Effect::Opaque);
        let partial = BulkAction {
            op: OpType::Update,
            body: Some(br#"{"doc":{"n":1}}"#.to_vec()),
            ..idx.clone()
        };
        assert_eq!(
            Effect::of(&partial),
            Effect::Opaque,
            "no upsert: 404 if absent"
        );
        assert!(matches!(upsert(r#"{"n":1}"#), Effect::Merge(_)));
        // Equal shapes are one allocation; another shape is its own.
        let mut shapes = Shapes::default();
        let mut merge = |doc: &str| match Effect::of_shared(
            OpType::Update,
            None,
            Some(format!(r#"{{"doc":{doc},"doc_as_upsert":true}}"#).as_bytes()),
            &mut shapes,
        ) {
            Effect::Merge(s) => s,
            e => panic!("{e:?}"),
        };
        let (a, b, c) = (
            merge(r#"{"n":1}"#),
            merge(r#"{"n":2}"#),
            merge(r#"{"m":1}"#),
        );
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(*a, *b);
        for body in [
            r#"{"doc":{"n":1},"doc_as_upsert":false}"#,
            r#"{"doc":{"n":1},"doc_as_upsert":true,"detect_noop":false}"#,
        ] {
            let a = BulkAction {
                op: OpType::Update,
                body: Some(body.into()),
                ..idx.clone()
            };
            assert_eq!(Effect::of(&a), Effect::Opaque, "{body}");
        }
        let versioned = BulkAction {
            version: Some(3),
            ..BulkAction::upsert("i", "d".into(), br#"{"n":1}"#)
        };
        assert_eq!(Effect::of(&versioned), Effect::Opaque, "a versioned update");
    }

    #[test]
    fn supersede_table() {
        let cases: Vec<(Effect, Effect, bool)> = vec![
            // (newer, older, supersedes)
            (replace(None), replace(None), true),
            (replace(None), delete(None), true),
            (replace(None), upsert(r#"{"a":1}"#), true),
            (replace(None), Effect::Opaque, true),
            (delete(None), replace(None), true),
            (delete(None), upsert(r#"{"a":1}"#), true),
            (replace(Some(5)), replace(Some(4)), true),
            (replace(Some(4)), replace(Some(4)), false),
            (replace(Some(3)), replace(Some(4)), false),
            (delete(Some(9)), replace(Some(4)), true),
            (replace(Some(5)), replace(None), false),
            (replace(None), replace(Some(5)), false),
            (upsert(r#"{"a":1,"b":2}"#), upsert(r#"{"a":0,"b":0}"#), true),
            (upsert(r#"{"a":1,"b":2}"#), upsert(r#"{"a":0}"#), true),
            (upsert(r#"{"a":1}"#), upsert(r#"{"a":0,"b":0}"#), false),
            (
                upsert(r#"{"a":{"x":1,"y":1}}"#),
                upsert(r#"{"a":{"x":0}}"#),
                true,
            ),
            (
                upsert(r#"{"a":{"x":1}}"#),
                upsert(r#"{"a":{"x":0,"y":0}}"#),
                false,
            ),
            // A scalar replaces an object; an object merges into whatever object is there.
            (upsert(r#"{"a":1}"#), upsert(r#"{"a":{"x":0}}"#), true),
            (upsert(r#"{"a":{"x":1}}"#), upsert(r#"{"a":1}"#), false),
            (upsert(r#"{"a":[1]}"#), upsert(r#"{"a":[0,0]}"#), true),
            (delete(Some(3)), replace(Some(4)), false),
            (delete(None), replace(Some(4)), false),
            (delete(Some(4)), delete(Some(4)), false),
            (upsert(r#"{"a":1}"#), Effect::Opaque, false),
            (upsert(r#"{"a":1}"#), replace(None), false),
            (upsert(r#"{"a":1}"#), delete(None), false),
            (Effect::Opaque, replace(None), false),
            (Effect::Opaque, Effect::Opaque, false),
        ];
        for (new, old, want) in cases {
            assert_eq!(new.supersedes(&old), want, "{new:?} over {old:?}");
        }
    }

    /// Elasticsearch's merge of a partial document (`doc_as_upsert`).
    fn es_merge(doc: &mut Value, changes: &Value) {
        match (doc, changes) {
            (Value::Object(d), Value::Object(c)) => {
                for (k, v) in c {
                    match d.get_mut(k) {
                        Some(old) if old.is_object() && v.is_object() => es_merge(old, v),
                        _ => {
                            d.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
            (d, c) => *d = c.clone(),
        }
    }

    fn apply(doc: Option<Value>, body: &Value) -> Option<Value> {
        let mut d = doc.unwrap_or(json!({}));
        es_merge(&mut d, body);
        Some(d)
    }

    fn small_doc() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![Just(json!(1)), Just(json!("s")), Just(json!([2]))];
        let field = prop_oneof![
            leaf.clone(),
            prop::collection::btree_map("[xy]", leaf, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ];
        prop::collection::btree_map("[abc]", field, 0..4)
            .prop_map(|m| Value::Object(m.into_iter().collect()))
    }

    fn effect() -> impl Strategy<Value = Effect> {
        let version = proptest::option::of(0i64..4);
        prop_oneof![
            version.clone().prop_map(replace),
            version.prop_map(delete),
            small_doc().prop_map(|d| upsert(&d.to_string())),
            Just(Effect::Opaque),
        ]
    }

    proptest! {
        /// c over b and b over a: c over a.
        #[test]
        fn supersedes_is_transitive(a in effect(), b in effect(), c in effect()) {
            if c.supersedes(&b) && b.supersedes(&a) {
                prop_assert!(c.supersedes(&a), "{:?} over {:?} over {:?}", c, b, a);
            }
        }

        /// Where `covers` says so, merging the older and then the newer document equals
        /// merging the newer alone, from any starting document.
        #[test]
        fn covered_merges_are_irrelevant(start in proptest::option::of(small_doc()), old in small_doc(), new in small_doc()) {
            let (Effect::Merge(n), Effect::Merge(o)) = (
                upsert(&new.to_string()),
                upsert(&old.to_string()),
            ) else { unreachable!() };
            if n.covers(&o) {
                let both = apply(apply(start.clone(), &old), &new);
                let alone = apply(start, &new);
                prop_assert_eq!(both, alone);
            }
        }
    }
}
