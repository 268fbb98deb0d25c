//! Which index a record goes to: the configured `index`, with `{yyyy.MM.dd}`-style date
//! patterns (from the record's timestamp, in UTC), `{/json/pointer}` fields from the
//! record (as Logstash's `%{+YYYY.MM.dd}`, Vector's templates and Flink's `{ts|yyyy}`
//! offer), and the record's `{topic}` (lower-cased, as Kafka Connect names an index
//! after a topic, or renamed by `topic_to_index`) and `{partition}`, checked against
//! Elasticsearch's rules for index names.
//!
//! A template is parsed and checked once, when the job file is loaded; what a record
//! fills in is checked again for each record, so that a field value that makes an
//! invalid name fails (or dead-letters) that record instead of a whole bulk request.

use chrono::{DateTime, Datelike, Timelike, Utc};
use serde_json::Value;

/// A parsed `index` setting.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexTemplate {
    parts: Vec<Part>,
    /// What `{topic}` stands for, for the topics named (`topic_to_index`).
    topics: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Literal(String),
    Date(Vec<DateToken>),
    Field(String),
    Topic,
    Partition,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum DateToken {
    Year,
    YearOfCentury,
    Month,
    Day,
    Hour,
    Minute,
    Second,
    Text(char),
}

impl IndexTemplate {
    /// Parses `text`: literal text, `{/json/pointer}` fields and `{...}` date patterns
    /// made of `yyyy` (or `YYYY`), `yy`, `MM`, `dd`, `HH`, `mm`, `ss` and the separators
    /// `.`, `-`, `_`. The literal parts must be valid in an index name, and so must the
    /// name a typical record makes of it.
    pub fn parse(text: &str) -> Result<IndexTemplate, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            match rest.find(['{', '}']) {
                None => {
                    parts.push(Part::Literal(rest.to_string()));
                    break;
                }
                Some(i) if rest.as_bytes()[i] == b'}' => {
                    return Err(format!("`{text}`: a `}}` without its `{{`"));
                }
                Some(i) => {
                    if i > 0 {
                        parts.push(Part::Literal(rest[..i].to_string()));
                    }
                    let body = &rest[i + 1..];
                    let end = body
                        .find('}')
                        .ok_or_else(|| format!("`{text}`: a `{{` without its `}}`"))?;
                    let inner = &body[..end];
                    if inner.contains('{') {
                        return Err(format!("`{text}`: nested `{{`"));
                    }
                    parts.push(if inner.starts_with('/') {
                        Part::Field(inner.to_string())
                    } else if inner == "topic" {
                        Part::Topic
                    } else if inner == "partition" {
                        Part::Partition
                    } else {
                        Part::Date(date_tokens(inner).map_err(|e| format!("`{text}`: {e}"))?)
                    });
                    rest = &body[end + 1..];
                }
            }
        }
        let t = IndexTemplate {
            parts,
            topics: Default::default(),
        };
        // The placeholders filled with plain values: what remains wrong is the
        // template's own text (upper case, a forbidden character, a bad start).
        let sample = t.fill(0, Some(("x", 0)), &mut |_| Ok("x".to_string()))?;
        check_index_name(&sample).map_err(|e| format!("`{text}`: {e}"))?;
        Ok(t)
    }

    /// `{topic}` stands for `index` for each `topic` of `topics` (Kafka Connect's
    /// `topic.to.external.resource.mapping`); each name must be a valid index name.
    pub fn with_topics(
        mut self,
        topics: std::collections::BTreeMap<String, String>,
    ) -> Result<IndexTemplate, (String, String)> {
        for (topic, index) in &topics {
            check_index_name(index).map_err(|e| (topic.clone(), format!("`{index}`: {e}")))?;
        }
        self.topics = topics;
        Ok(self)
    }

    /// Whether the record's topic or partition is needed (`{topic}`, `{partition}`).
    pub fn reads_origin(&self) -> bool {
        self.parts
            .iter()
            .any(|p| matches!(p, Part::Topic | Part::Partition))
    }

    /// The name, if the template has no placeholder.
    pub fn fixed(&self) -> Option<&str> {
        match self.parts.as_slice() {
            [Part::Literal(s)] => Some(s),
            _ => None,
        }
    }

    /// Whether a record's fields are needed (a `{/pointer}` placeholder).
    pub fn reads_fields(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Field(_)))
    }

    /// Whether the record's timestamp is needed (a date pattern).
    pub fn reads_timestamp(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Date(_)))
    }

    /// The index of a record with this `timestamp` (ms since the epoch), `origin`
    /// (topic and partition) and document (parsed only if
    /// [`reads_fields`](Self::reads_fields)). The error says what is missing or why the
    /// name is invalid.
    pub fn render(
        &self,
        timestamp: Option<i64>,
        origin: Option<(&str, i32)>,
        doc: Option<&Value>,
    ) -> Result<String, String> {
        if let Some(f) = self.fixed() {
            return Ok(f.to_string());
        }
        let ts = match (self.reads_timestamp(), timestamp) {
            (true, None) => {
                return Err("the record has no timestamp for the index's date pattern".into())
            }
            (_, t) => t.unwrap_or(0),
        };
        if self.reads_origin() && origin.is_none() {
            return Err(
                "the record has no topic and partition for the index's {topic} or {partition}"
                    .into(),
            );
        }
        let name = self.fill(
            ts,
            origin,
            &mut |pointer| match doc.and_then(|d| d.pointer(pointer)) {
                Some(Value::String(s)) => Ok(s.clone()),
                Some(n @ Value::Number(_)) => Ok(n.to_string()),
                Some(Value::Bool(b)) => Ok(b.to_string()),
                Some(other) => Err(format!(
                    "index field {pointer} is not a string or number: {other}"
                )),
                None => Err(format!("index field {pointer} is missing")),
            },
        )?;
        check_index_name(&name).map_err(|e| format!("index `{name}`: {e}"))?;
        Ok(name)
    }

    fn fill(
        &self,
        timestamp: i64,
        origin: Option<(&str, i32)>,
        field: &mut dyn FnMut(&str) -> Result<String, String>,
    ) -> Result<String, String> {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Literal(s) => out.push_str(s),
                Part::Topic => {
                    let topic = origin.map_or("", |o| o.0);
                    match self.topics.get(topic) {
                        Some(index) => out.push_str(index),
                        None => out.push_str(&topic.to_lowercase()),
                    }
                }
                Part::Partition => out.push_str(&origin.map_or(0, |o| o.1).to_string()),
                Part::Field(pointer) => out.push_str(&field(pointer)?),
                Part::Date(tokens) => {
                    let t = DateTime::<Utc>::from_timestamp_millis(timestamp)
                        .ok_or_else(|| format!("timestamp {timestamp} is out of range"))?;
                    for token in tokens {
                        match token {
                            DateToken::Year => out.push_str(&format!("{:04}", t.year())),
                            DateToken::YearOfCentury => {
                                out.push_str(&format!("{:02}", t.year().rem_euclid(100)))
                            }
                            DateToken::Month => out.push_str(&format!("{:02}", t.month())),
                            DateToken::Day => out.push_str(&format!("{:02}", t.day())),
                            DateToken::Hour => out.push_str(&format!("{:02}", t.hour())),
                            DateToken::Minute => out.push_str(&format!("{:02}", t.minute())),
                            DateToken::Second => out.push_str(&format!("{:02}", t.second())),
                            DateToken::Text(c) => out.push(*c),
                        }
                    }
                }
            }
        }
        Ok(out)
    }
}

fn date_tokens(pattern: &str) -> Result<Vec<DateToken>, String> {
    const TOKENS: &[(&str, DateToken)] = &[
        ("yyyy", DateToken::Year),
        ("YYYY", DateToken::Year),
        ("yy", DateToken::YearOfCentury),
        ("YY", DateToken::YearOfCentury),
        ("MM", DateToken::Month),
        ("dd", DateToken::Day),
        ("HH", DateToken::Hour),
        ("mm", DateToken::Minute),
        ("ss", DateToken::Second),
    ];
    if pattern.is_empty() {
        return Err("an empty `{}`".into());
    }
    let mut out = Vec::new();
    let mut rest = pattern;
    'next: while let Some(c) = rest.chars().next() {
        for (text, token) in TOKENS {
            if let Some(r) = rest.strip_prefix(text) {
                out.push(*token);
                rest = r;
                continue 'next;
            }
        }
        if matches!(c, '.' | '-' | '_') {
            out.push(DateToken::Text(c));
            rest = &rest[1..];
            continue;
        }
        return Err(format!(
            "`{{{pattern}}}` is neither a {{/json/pointer}} nor a date pattern \
             (yyyy, yy, MM, dd, HH, mm, ss and . - _): `{c}` is not understood"
        ));
    }
    Ok(out)
}

/// Checks a concrete index name against Elasticsearch's rules: not empty, at most 255
/// bytes, lower case, none of `\ / * ? " < > | , # :` or space, not starting with `-`,
/// `_` or `+`, and not `.` or `..`.
pub fn check_index_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("an index name cannot be empty".into());
    }
    if name.len() > 255 {
        return Err(format!(
            "an index name is at most 255 bytes, not {}",
            name.len()
        ));
    }
    if name == "." || name == ".." {
        return Err("an index name cannot be `.` or `..`".into());
    }
    if let Some(c) = name.chars().next().filter(|c| matches!(c, '-' | '_' | '+')) {
        return Err(format!("an index name cannot start with `{c}`"));
    }
    if let Some(c) = name.chars().find(|c| c.is_uppercase()) {
        return Err(format!("an index name must be lower case (`{c}`)"));
    }
    if let Some(c) = name.chars().find(|c| {
        matches!(
            c,
            '\\' | '/' | '*' | '?' | '"' | '<' | '>' | '|' | ',' | '#' | ':' | ' '
        ) || c.is_control()
    }) {
        return Err(format!("an index name cannot contain {c:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// 2026-03-07T09:05:02.123Z
    const TS: i64 = 1_772_874_302_123;

    #[test]
    fn templates_render_dates_in_utc_and_fields_from_the_record() {
        let doc = json!({"tenant": "acme", "n": 7, "deep": {"x": "y"}, "obj": {}, "Up": "ABC"});
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("orders", Ok("orders")),
            ("orders-{yyyy.MM.dd}", Ok("orders-2026.03.07")),
            ("orders-{YYYY.MM}", Ok("orders-2026.03")),
            ("logs-{yy-MM-dd_HH.mm.ss}", Ok("logs-26-03-07_09.05.02")),
            ("{/tenant}-orders", Ok("acme-orders")),
            ("t-{/n}-{/deep/x}-{yyyy}", Ok("t-7-y-2026")),
            ("t-{/missing}", Err("index field /missing is missing")),
            ("t-{/obj}", Err("not a string or number")),
            ("t-{/Up}", Err("must be lower case")),
            // Kafka Connect's rule: the topic, lower-cased.
            ("{topic}", Ok("orders.eu")),
            ("{topic}-{partition}-{yyyy}", Ok("orders.eu-3-2026")),
        ];
        for (text, want) in cases {
            let t = IndexTemplate::parse(text).unwrap();
            match (t.render(Some(TS), Some(("Orders.EU", 3)), Some(&doc)), want) {
                (Ok(g), Ok(w)) => assert_eq!(&g, w, "{text}"),
                (Err(e), Err(w)) => assert!(e.contains(w), "{text}: {e}"),
                (g, w) => panic!("{text}: got {g:?}, want {w:?}"),
            }
        }
    }

    #[test]
    fn a_date_pattern_needs_a_timestamp_and_a_fixed_name_needs_nothing() {
        let t = IndexTemplate::parse("o-{yyyy}").unwrap();
        assert!(t.reads_timestamp() && !t.reads_fields());
        assert!(t
            .render(None, None, None)
            .unwrap_err()
            .contains("no timestamp"));
        let fixed = IndexTemplate::parse("orders").unwrap();
        assert_eq!(fixed.fixed(), Some("orders"));
        assert_eq!(fixed.render(None, None, None).unwrap(), "orders");
        // Before 1970 too: the epoch is not a lower bound.
        assert_eq!(
            IndexTemplate::parse("o-{yyyy.MM.dd}")
                .unwrap()
                .render(Some(-86_400_000), None, None)
                .unwrap(),
            "o-1969.12.31"
        );
    }

    #[test]
    fn topic_to_index_renames_what_topic_stands_for() {
        let topics = [("orders".to_string(), "orders-v2".to_string())].into();
        let t = IndexTemplate::parse("{topic}-{yyyy}")
            .unwrap()
            .with_topics(topics)
            .unwrap();
        assert!(t.reads_origin() && t.fixed().is_none());
        assert_eq!(
            t.render(Some(TS), Some(("orders", 0)), None).unwrap(),
            "orders-v2-2026"
        );
        assert_eq!(
            t.render(Some(TS), Some(("Refunds", 0)), None).unwrap(),
            "refunds-2026"
        );
        // A topic that makes no valid name follows on_item_error, by record.
        let e = t
            .render(Some(TS), Some(("_internal", 0)), None)
            .unwrap_err();
        assert!(e.contains("cannot start with `_`"), "{e}");
        let e = t.render(Some(TS), None, None).unwrap_err();
        assert!(e.contains("no topic"), "{e}");
        let bad = [("orders".to_string(), "Orders".to_string())].into();
        let (key, e) = IndexTemplate::parse("{topic}")
            .unwrap()
            .with_topics(bad)
            .unwrap_err();
        assert!(key == "orders" && e.contains("lower case"), "{key}: {e}");
    }

    #[test]
    fn invalid_templates_are_refused_with_the_reason() {
        let cases: &[(&str, &str)] = &[
            ("Orders", "lower case"),
            ("orders-{yyyy", "without its `}`"),
            ("orders}", "without its `{`"),
            ("o-{}", "empty"),
            ("o-{yyyy/MM}", "not understood"),
            ("o-{DATE}", "not understood"),
            ("o-{a{b}}", "nested"),
            ("_orders", "cannot start with `_`"),
            ("-{yyyy}", "cannot start with `-`"),
            ("a b", "cannot contain ' '"),
            ("a,b", "cannot contain ','"),
            ("a*", "cannot contain '*'"),
            ("..", "cannot be `.` or `..`"),
            ("", "cannot be empty"),
        ];
        for (text, want) in cases {
            let e = IndexTemplate::parse(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        assert!(IndexTemplate::parse(&"a".repeat(256))
            .unwrap_err()
            .contains("255"));
        assert!(IndexTemplate::parse(&"a".repeat(255)).is_ok());
        assert!(IndexTemplate::parse(".kibana-ok").is_ok());
    }

    #[test]
    fn index_name_rules() {
        for ok in [
            "orders",
            "orders-2026.03.07",
            "a_b",
            "a+b",
            ".hidden",
            "ü-lower",
        ] {
            assert!(check_index_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", ".", "..", "-a", "_a", "+a", "A", "a/b", "a\\b", "a?", "a\"", "a<", "a>", "a|",
            "a#", "a:b", "a\nb",
        ] {
            assert!(check_index_name(bad).is_err(), "{bad:?}");
        }
    }
}
