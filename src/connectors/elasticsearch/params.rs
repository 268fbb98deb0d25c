//! What an action carries besides its index, id and version: the ingest pipeline that
//! processes the document (`pipeline`), the value that places it on a shard
//! (`routing`), Elasticsearch's `require_alias` flag; and, for a data stream
//! (`data_stream`), the stream's name and the document's `@timestamp`.
//!
//! Each is read from the record the same way for every operation of its document: an
//! upsert and the delete that follows it carry the same routing, so they reach the
//! shard that holds the document. A record whose value cannot be read (a missing
//! routing field, a pipeline field that is not text, no timestamp) makes no action: it
//! follows `on_item_error`, as a document Elasticsearch refused would.

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::Value;

/// The parameters of one action line besides `_index`, `_id` and the version.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ActionParams {
    /// `routing`: which shard holds the document.
    pub routing: Option<String>,
    /// `pipeline`: the ingest pipeline run on the document (index and create only).
    pub pipeline: Option<String>,
    /// `require_alias`: the index must be an alias (no index is created).
    pub require_alias: bool,
}

/// A `pipeline` setting: a name, or a template of literal text and `{/pointer}`
/// fields of the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelineTemplate {
    parts: Vec<TextPart>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum TextPart {
    Literal(String),
    Field(String),
}

impl PipelineTemplate {
    /// Parses `text`: literal text and `{/json/pointer}` fields.
    pub fn parse(text: &str) -> Result<PipelineTemplate, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            match rest.find(['{', '}']) {
                None => {
                    parts.push(TextPart::Literal(rest.to_string()));
                    break;
                }
                Some(i) if rest.as_bytes()[i] == b'}' => {
                    return Err(format!("`{text}`: a `}}` without its `{{`"))
                }
                Some(i) => {
                    if i > 0 {
                        parts.push(TextPart::Literal(rest[..i].to_string()));
                    }
                    let body = &rest[i + 1..];
                    let end = body
                        .find('}')
                        .ok_or_else(|| format!("`{text}`: a `{{` without its `}}`"))?;
                    let inner = &body[..end];
                    if !inner.starts_with('/') {
                        return Err(format!(
                            "`{text}`: `{{{inner}}}` is not a field; a pipeline name takes {{/json/pointer}} fields only"
                        ));
                    }
                    parts.push(TextPart::Field(inner.to_string()));
                    rest = &body[end + 1..];
                }
            }
        }
        if parts.is_empty() {
            return Err("an empty pipeline name".into());
        }
        Ok(PipelineTemplate { parts })
    }

    /// Whether a record's fields are needed.
    pub fn reads_fields(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, TextPart::Field(_)))
    }

    /// The pipeline of a record whose parsed value is `doc`.
    pub fn render(&self, doc: Option<&Value>) -> Result<String, String> {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                TextPart::Literal(s) => out.push_str(s),
                TextPart::Field(ptr) => out.push_str(&text_of("pipeline", ptr, doc)?),
            }
        }
        if out.is_empty() {
            return Err("the pipeline name is empty".into());
        }
        Ok(out)
    }
}

/// The text of field `ptr` of `doc` (a string, a number or a boolean); `what` names the
/// setting in the error.
pub fn text_of(what: &str, ptr: &str, doc: Option<&Value>) -> Result<String, String> {
    match doc.and_then(|d| d.pointer(ptr)) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(n @ Value::Number(_)) => Ok(n.to_string()),
        Some(Value::Bool(b)) => Ok(b.to_string()),
        Some(other) => Err(format!(
            "{what} field {ptr} is not a string or number: {other}"
        )),
        None => Err(format!("{what} field {ptr} is missing")),
    }
}

/// The data stream a sink writes to (`data_stream = { type, dataset, namespace }`):
/// Elasticsearch's naming scheme `<type>-<dataset>-<namespace>`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataStream {
    /// `logs`, `metrics`, `traces` or `synthetics`.
    #[serde(rename = "type")]
    pub kind: String,
    /// What the data is (`orders`); may be `{topic}`.
    pub dataset: String,
    /// Whose it is; `default` when absent. May be `{topic}`.
    #[serde(default = "default_namespace")]
    pub namespace: String,
}

fn default_namespace() -> String {
    "default".into()
}

impl DataStream {
    /// The stream's name as an index template (`{topic}` may stand in the dataset or
    /// the namespace). The error is `(key, message)`, the key below `data_stream`.
    pub fn index(&self) -> Result<String, (String, String)> {
        const TYPES: [&str; 4] = ["logs", "metrics", "traces", "synthetics"];
        if !TYPES.contains(&self.kind.as_str()) {
            return Err((
                "type".into(),
                format!("`{}` is not one of {}", self.kind, TYPES.join(", ")),
            ));
        }
        for (key, part) in [("dataset", &self.dataset), ("namespace", &self.namespace)] {
            if part.is_empty() || part.contains('-') || part.len() > 100 {
                return Err((
                    key.into(),
                    format!("`{part}`: a data stream's {key} is 1 to 100 characters without `-`"),
                ));
            }
            if part.contains('{') && part != "{topic}" {
                return Err((
                    key.into(),
                    format!(
                        "`{part}`: the only placeholder a data stream's {key} takes is {{topic}}"
                    ),
                ));
            }
        }
        Ok(format!("{}-{}-{}", self.kind, self.dataset, self.namespace))
    }
}

/// Where a data stream document's `@timestamp` comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimestampSource {
    /// The record's (Kafka) timestamp, written as RFC 3339 in UTC with milliseconds.
    Record,
    /// A field of the record (`timestamp_field = "/ts"`), copied as it is (epoch
    /// milliseconds or a date string, which Elasticsearch's `date` type reads).
    Field(String),
}

/// `doc` with `@timestamp` set as `source` says (Kafka Connect's rule: the record's
/// timestamp unless a field is named; an `@timestamp` already in the document is
/// replaced). The error says what is missing.
pub fn with_timestamp(
    doc: &[u8],
    source: &TimestampSource,
    record_timestamp: Option<i64>,
) -> Result<Vec<u8>, String> {
    let ts = match source {
        TimestampSource::Field(ptr) => {
            let v: Value =
                serde_json::from_slice(doc).map_err(|e| format!("the record is not JSON: {e}"))?;
            match v.pointer(ptr) {
                Some(t @ (Value::String(_) | Value::Number(_))) => t.clone(),
                Some(other) => {
                    return Err(format!(
                        "timestamp field {ptr} is not a date string or epoch milliseconds: {other}"
                    ))
                }
                None => return Err(format!("timestamp field {ptr} is missing")),
            }
        }
        TimestampSource::Record => {
            let ms = record_timestamp
                .ok_or("the record has no timestamp for the data stream's @timestamp")?;
            let t = DateTime::<Utc>::from_timestamp_millis(ms)
                .ok_or_else(|| format!("timestamp {ms} is out of range"))?;
            Value::String(t.to_rfc3339_opts(SecondsFormat::Millis, true))
        }
    };
    // The other fields are kept as their bytes: a number too large or too precise
    // for a float (a decimal) reaches Elasticsearch as the record wrote it.
    let mut fields: std::collections::BTreeMap<String, Box<serde_json::value::RawValue>> =
        serde_json::from_slice(doc).map_err(|e| {
            if doc.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{') {
                format!("the record is not JSON: {e}")
            } else {
                "the document is not a JSON object".to_string()
            }
        })?;
    let raw = serde_json::value::to_raw_value(&ts).expect("a JSON value serializes");
    fields.insert("@timestamp".into(), raw);
    serde_json::to_vec(&fields).map_err(|e| format!("the document cannot be written: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pipeline_is_a_name_or_a_template_of_fields() {
        let fixed = PipelineTemplate::parse("enrich").unwrap();
        assert!(!fixed.reads_fields());
        assert_eq!(fixed.render(None).unwrap(), "enrich");
        let t = PipelineTemplate::parse("enrich-{/kind}").unwrap();
        assert!(t.reads_fields());
        assert_eq!(
            t.render(Some(&json!({"kind": "b2b"}))).unwrap(),
            "enrich-b2b"
        );
        assert_eq!(t.render(Some(&json!({"kind": 7}))).unwrap(), "enrich-7");
        let e = t.render(Some(&json!({}))).unwrap_err();
        assert!(e.contains("pipeline field /kind is missing"), "{e}");
        let e = t.render(Some(&json!({"kind": {"a": 1}}))).unwrap_err();
        assert!(e.contains("not a string or number"), "{e}");
        assert!(PipelineTemplate::parse("{/p}")
            .unwrap()
            .render(Some(&json!({"p": ""})))
            .is_err());
        for bad in ["", "a-{yyyy}", "a{", "a}", "{topic}"] {
            assert!(PipelineTemplate::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_data_stream_is_named_type_dataset_namespace() {
        let ds = |kind: &str, dataset: &str, namespace: &str| {
            DataStream {
                kind: kind.into(),
                dataset: dataset.into(),
                namespace: namespace.into(),
            }
            .index()
        };
        assert_eq!(ds("logs", "orders", "prod").unwrap(), "logs-orders-prod");
        assert_eq!(
            ds("metrics", "{topic}", "default").unwrap(),
            "metrics-{topic}-default"
        );
        assert_eq!(ds("log", "orders", "prod").unwrap_err().0, "type");
        assert_eq!(ds("logs", "or-ders", "prod").unwrap_err().0, "dataset");
        assert_eq!(ds("logs", "orders", "").unwrap_err().0, "namespace");
        assert_eq!(ds("logs", "{/x}", "prod").unwrap_err().0, "dataset");
        let parsed: DataStream = toml::from_str("type = \"logs\"\ndataset = \"o\"").unwrap();
        assert_eq!(parsed.namespace, "default");
    }

    #[test]
    fn timestamp_comes_from_the_field_or_the_record() {
        let doc = br#"{"ts":1772874302123,"@timestamp":"old","n":1}"#;
        let from_field = with_timestamp(doc, &TimestampSource::Field("/ts".into()), None).unwrap();
        let v: Value = serde_json::from_slice(&from_field).unwrap();
        assert_eq!(v["@timestamp"], json!(1772874302123_i64));
        assert_eq!(v["n"], json!(1));
        let from_record =
            with_timestamp(doc, &TimestampSource::Record, Some(1_772_874_302_123)).unwrap();
        let v: Value = serde_json::from_slice(&from_record).unwrap();
        assert_eq!(v["@timestamp"], json!("2026-03-07T09:05:02.123Z"));
        let e = with_timestamp(doc, &TimestampSource::Record, None).unwrap_err();
        assert!(e.contains("no timestamp"), "{e}");
        let e = with_timestamp(b"{}", &TimestampSource::Field("/ts".into()), Some(1)).unwrap_err();
        assert!(e.contains("timestamp field /ts is missing"), "{e}");
        let e = with_timestamp(
            br#"{"ts":[1]}"#,
            &TimestampSource::Field("/ts".into()),
            None,
        )
        .unwrap_err();
        assert!(e.contains("not a date"), "{e}");
        assert!(with_timestamp(b"[1]", &TimestampSource::Record, Some(1)).is_err());
        // Numbers keep their text, however large or precise.
        let exact = with_timestamp(
            br#"{"big":123456789012345678901234567890,"d":0.12345678901234567890123}"#,
            &TimestampSource::Record,
            Some(0),
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(exact).unwrap(),
            r#"{"@timestamp":"1970-01-01T00:00:00.000Z","big":123456789012345678901234567890,"d":0.12345678901234567890123}"#
        );
        assert!(with_timestamp(b"nope", &TimestampSource::Record, Some(1)).is_err());
    }
}
