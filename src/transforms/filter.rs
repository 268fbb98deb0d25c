//! `filter` (Kafka Connect's `Filter` with its predicates): drops the records that
//! match a predicate, or with `negate = true` keeps only those.

use super::jq::{meta_value, Limits, Program};
use super::{Meta, Parts, Smt, SmtConfig};
use crate::connector::{KeyError, SectionContext};
use std::sync::Arc;

/// `[[transform]] type = "filter"` with exactly one predicate:
///
/// | key | Kafka Connect predicate | matches a record |
/// |---|---|---|
/// | `topic_matches = "regex"` | `TopicNameMatches` | whose topic the regex matches in full |
/// | `has_header = "name"` | `HasHeaderKey` | with a header of that name |
/// | `is_tombstone = true` | `RecordIsTombstone` | without a value |
/// | `condition = "jq"` | | for which the jq program's first output is true |
///
/// A `condition` that fails on a record (or gives no output) fails the job naming
/// the record; so does `has_header` on a source whose records have no headers.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterConfig {
    pub topic_matches: Option<String>,
    pub has_header: Option<String>,
    pub is_tombstone: Option<bool>,
    pub condition: Option<String>,
    #[serde(default)]
    pub negate: bool,
}

/// A record predicate.
#[derive(Debug)]
pub enum Predicate {
    TopicMatches(regex::Regex),
    HasHeader(String),
    IsTombstone(bool),
    Condition(Program),
}

impl Predicate {
    /// Whether the record matches.
    pub fn matches(&self, parts: &Parts, meta: &Meta) -> Result<bool, String> {
        Ok(match self {
            Predicate::TopicMatches(re) => meta.topic.is_some_and(|t| re.is_match(t)),
            Predicate::HasHeader(name) => meta
                .headers
                .ok_or("has_header: the source gives its records no headers")?
                .iter()
                .any(|(n, _)| n == name),
            // A Kafka tombstone; a delete without a value (a debezium delete of its
            // key) is a delete, which a filter of tombstones must not drop.
            Predicate::IsTombstone(want) => {
                (parts.tombstone && parts.op == crate::record::Op::Upsert) == *want
            }
            // A tombstone has no value for a condition to read: it does not match.
            Predicate::Condition(_) if parts.tombstone => false,
            Predicate::Condition(p) => {
                // The first output decides; the rest are not computed.
                let mut first = None;
                let limits = Limits {
                    work: 100_000,
                    outputs: 1,
                };
                p.run(&parts.value, &meta_value(parts, meta), limits, |v| {
                    first = Some(v);
                    std::ops::ControlFlow::Break(())
                })?;
                match first {
                    Some(v) => {
                        !matches!(v, serde_json::Value::Null | serde_json::Value::Bool(false))
                    }
                    None => return Err("the condition has no output".into()),
                }
            }
        })
    }
}

/// The filter: drops a record when its predicate matches (keeps it, negated).
#[derive(Debug)]
pub struct Filter {
    pub predicate: Predicate,
    pub negate: bool,
}

impl SmtConfig for FilterConfig {
    const KIND: &'static str = "filter";

    fn build(self, _cx: &SectionContext) -> Result<Arc<dyn Smt>, KeyError> {
        let mut given = Vec::new();
        if let Some(re) = self.topic_matches {
            // Kafka Connect matches the whole topic name.
            let re = regex::Regex::new(&format!("^(?:{re})$"))
                .map_err(|e| KeyError::new("topic_matches", e.to_string()))?;
            given.push(Predicate::TopicMatches(re));
        }
        if let Some(h) = self.has_header {
            given.push(Predicate::HasHeader(h));
        }
        if let Some(t) = self.is_tombstone {
            given.push(Predicate::IsTombstone(t));
        }
        if let Some(c) = self.condition {
            given.push(Predicate::Condition(
                Program::compile(&c).map_err(|e| KeyError::new("condition", e))?,
            ));
        }
        let predicate = match <[Predicate; 1]>::try_from(given) {
            Ok([p]) => p,
            Err(given) => {
                return Err(KeyError::section(format!(
                "give one predicate (topic_matches, has_header, is_tombstone or condition), not {}",
                given.len()
            )))
            }
        };
        Ok(Arc::new(Filter {
            predicate,
            negate: self.negate,
        }))
    }
}

impl Smt for Filter {
    /// A filter does not change a record.
    fn apply(&self, _: &mut Parts, _: &Meta) -> Result<(), String> {
        Ok(())
    }

    fn expand(&self, parts: Parts, meta: &Meta, out: &mut Vec<Parts>) -> Result<(), String> {
        if self.predicate.matches(&parts, meta)? == self.negate {
            out.push(parts);
        }
        Ok(())
    }

    fn reads_tombstones(&self) -> bool {
        matches!(self.predicate, Predicate::IsTombstone(_))
    }

    fn reads_headers(&self) -> bool {
        matches!(
            self.predicate,
            Predicate::HasHeader(_) | Predicate::Condition(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn filter(toml_text: &str) -> Result<Arc<dyn Smt>, String> {
        let c: FilterConfig = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        c.build(&crate::testkit::conformance::section_context(
            std::path::Path::new("."),
        ))
        .map_err(|e| format!("{}: {}", e.key, e.message))
    }

    fn kept(f: &Arc<dyn Smt>, parts: Parts, meta: &Meta) -> bool {
        let mut out = Vec::new();
        f.expand(parts, meta, &mut out).unwrap();
        !out.is_empty()
    }

    fn meta<'a>(topic: &'a str, headers: Option<&'a crate::record::Headers>) -> Meta<'a> {
        Meta {
            topic: Some(topic),
            headers,
            ..Meta::default()
        }
    }

    #[test]
    fn topic_matches_the_whole_name_and_negate_keeps_the_matches() {
        // Kafka Connect's example: drop the records of topics that match.
        let f = filter(r#"topic_matches = "foo.*""#).unwrap();
        let v = || Parts::of_value(json!({}));
        assert!(!kept(&f, v(), &meta("foo-1", None)));
        assert!(kept(&f, v(), &meta("bar", None)));
        assert!(
            kept(&f, v(), &meta("xfoo", None)),
            "the whole name must match"
        );
        let f = filter("topic_matches = \"foo.*\"\nnegate = true").unwrap();
        assert!(kept(&f, v(), &meta("foo-1", None)));
        assert!(!kept(&f, v(), &meta("bar", None)));
    }

    #[test]
    fn has_header_and_is_tombstone() {
        let headers = vec![("trace".to_string(), None)];
        let f = filter(r#"has_header = "trace""#).unwrap();
        assert!(f.reads_headers());
        let v = || Parts::of_value(json!({}));
        assert!(!kept(&f, v(), &meta("t", Some(&headers))));
        assert!(kept(&f, v(), &meta("t", Some(&Vec::new()))));
        let mut out = Vec::new();
        let e = f.expand(v(), &meta("t", None), &mut out).unwrap_err();
        assert!(e.contains("no headers"), "{e}");
        let f = filter("is_tombstone = true").unwrap();
        let tomb = Parts {
            tombstone: true,
            ..Parts::of_value(serde_json::Value::Null)
        };
        assert!(!kept(&f, tomb.clone(), &meta("t", None)));
        let delete = Parts {
            op: crate::record::Op::Delete,
            ..tomb
        };
        assert!(
            kept(&f, delete, &meta("t", None)),
            "a delete is not a tombstone"
        );
        assert!(kept(&f, v(), &meta("t", None)));
    }

    #[test]
    fn condition_is_a_jq_boolean() {
        let f = filter(r#"condition = ".amount < 10""#).unwrap();
        let m = meta("t", None);
        assert!(!kept(&f, Parts::of_value(json!({"amount": 5})), &m));
        assert!(kept(&f, Parts::of_value(json!({"amount": 50})), &m));
        let f = filter(r#"condition = '$meta.topic == "t" and .ok'"#).unwrap();
        assert!(!kept(&f, Parts::of_value(json!({"ok": true})), &m));
        assert!(kept(&f, Parts::of_value(json!({"ok": null})), &m));
        let f = filter(r#"condition = "empty""#).unwrap();
        let mut out = Vec::new();
        let e = f
            .expand(Parts::of_value(json!({})), &m, &mut out)
            .unwrap_err();
        assert!(e.contains("no output"), "{e}");
        // The first output decides, and the ones after it are never computed.
        let f = filter(r#"condition = "true, repeat(1)""#).unwrap();
        assert!(!kept(&f, Parts::of_value(json!({})), &m));
    }

    #[test]
    fn exactly_one_predicate() {
        let e = filter("negate = true").unwrap_err();
        assert!(e.contains("give one predicate"), "{e}");
        let e = filter("is_tombstone = true\nhas_header = \"x\"").unwrap_err();
        assert!(e.contains("not 2"), "{e}");
        let e = filter(r#"condition = ".a |""#).unwrap_err();
        assert!(
            e.starts_with("condition: ") && e.contains("line 1, column 5"),
            "{e}"
        );
        let e = filter(r#"topic_matches = "(""#).unwrap_err();
        assert!(e.starts_with("topic_matches: "), "{e}");
    }
}
