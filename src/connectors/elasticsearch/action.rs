//! Records to bulk actions (Flink's ElasticsearchSinkFunction): the NDJSON lines of
//! one document operation.

use super::config::{EsSinkConfig, IdStrategy, Operation, Versioning};
use crate::error::{JobError, Result};
use crate::record::{Origin, Record};
use std::io::Write;

/// A bulk operation type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpType {
    Index,
    Create,
    Update,
    Delete,
}

impl OpType {
    /// The name used in the bulk API.
    pub fn name(self) -> &'static str {
        match self {
            OpType::Index => "index",
            OpType::Create => "create",
            OpType::Update => "update",
            OpType::Delete => "delete",
        }
    }
}

/// One bulk action: the action line and, except for delete, the source line.
#[derive(Debug, Clone, PartialEq)]
pub struct BulkAction {
    pub op: OpType,
    pub index: String,
    pub id: Option<String>,
    /// External version (`version_type = external`).
    pub version: Option<i64>,
    /// The document (index / create), or the update body (update).
    pub body: Option<Vec<u8>>,
    /// Where the record came from, for errors and dead letters.
    pub origin: Option<Origin>,
    /// The original record value, for dead letters.
    pub record: Option<Vec<u8>>,
}

impl BulkAction {
    /// An `index` of `doc`.
    pub fn index(index: &str, id: Option<String>, doc: Vec<u8>) -> BulkAction {
        BulkAction {
            op: OpType::Index,
            index: index.to_string(),
            id,
            version: None,
            body: Some(doc),
            origin: None,
            record: None,
        }
    }

    /// An `update` that merges `doc`, creating the document if absent.
    pub fn upsert(index: &str, id: String, doc: &[u8]) -> BulkAction {
        let mut body = Vec::with_capacity(doc.len() + 32);
        body.extend_from_slice(b"{\"doc\":");
        body.extend_from_slice(doc);
        body.extend_from_slice(b",\"doc_as_upsert\":true}");
        BulkAction {
            op: OpType::Update,
            index: index.to_string(),
            id: Some(id),
            version: None,
            body: Some(body),
            origin: None,
            record: None,
        }
    }

    /// Appends the action's NDJSON lines to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let _ = write!(out, "{{\"{}\":{{\"_index\":", self.op.name());
        json_string(out, &self.index);
        if let Some(id) = &self.id {
            out.extend_from_slice(b",\"_id\":");
            json_string(out, id);
        }
        if let Some(v) = self.version {
            let _ = write!(out, ",\"version\":{v},\"version_type\":\"external\"");
        }
        out.extend_from_slice(b"}}\n");
        if let Some(b) = &self.body {
            out.extend_from_slice(b);
            out.push(b'\n');
        }
    }

    /// Where the action comes from, for messages.
    pub fn describe(&self) -> String {
        let at = self.origin.as_ref().map_or(String::new(), |o| {
            format!(" (record {}/{}@{})", o.stream, o.partition, o.offset)
        });
        format!(
            "{} {}/{}{at}",
            self.op.name(),
            self.index,
            self.id.as_deref().unwrap_or("<auto id>")
        )
    }
}

/// Checks that a document body is one line of JSON whose top level is an object, as a
/// bulk request needs: a body with a line break (pretty-printed JSON) is re-serialized
/// on one line (`Ok(Some(compact))`), a valid one-line body is used as is (`Ok(None)`),
/// and anything else is refused with the reason, so that no record can break a bulk
/// request or add actions of its own.
pub fn frame(body: &[u8]) -> std::result::Result<Option<Vec<u8>>, String> {
    let starts_object = body
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|&b| b == b'{');
    if !starts_object {
        return Err("the document is not a JSON object".into());
    }
    if !body.iter().any(|&b| b == b'\n' || b == b'\r') {
        return serde_json::from_slice::<serde::de::IgnoredAny>(body)
            .map(|_| None)
            .map_err(|e| format!("the document is not JSON: {e}"));
    }
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("the document is not JSON: {e}"))?;
    serde_json::to_vec(&v)
        .map(Some)
        .map_err(|e| format!("the document cannot be written: {e}"))
}

fn json_string(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(out, s).expect("writing to a Vec cannot fail");
}

/// Turns a record into bulk actions (zero, one or several).
pub trait ActionBuilder: Send {
    fn build(&mut self, record: &Record, out: &mut Vec<BulkAction>) -> Result<()>;
}

impl<F> ActionBuilder for F
where
    F: FnMut(&Record, &mut Vec<BulkAction>) -> Result<()> + Send,
{
    fn build(&mut self, record: &Record, out: &mut Vec<BulkAction>) -> Result<()> {
        self(record, out)
    }
}

/// The action builder of the job file: one action per record, as configured.
pub struct ConfigActionBuilder {
    pub index: String,
    pub id: IdStrategy,
    pub operation: Operation,
    pub versioning: Versioning,
}

impl ConfigActionBuilder {
    /// The builder `cfg` describes.
    pub fn new(cfg: &EsSinkConfig) -> ConfigActionBuilder {
        ConfigActionBuilder {
            index: cfg.index.clone(),
            id: cfg.id.clone(),
            operation: cfg.operation,
            versioning: cfg.versioning,
        }
    }
}

/// The document id of a record under `strategy`.
pub fn document_id(strategy: &IdStrategy, record: &Record) -> Result<String> {
    let where_ = || match &record.origin {
        Some(o) => format!("record {}/{}@{}", o.stream, o.partition, o.offset),
        None => "record".into(),
    };
    match strategy {
        IdStrategy::Coordinates => record
            .origin
            .as_ref()
            .map(|o| format!("{}-{}-{}", o.stream, o.partition, o.offset))
            .ok_or_else(|| {
                JobError::Other(format!(
                    "{}: id = \"coordinates\" needs a record origin",
                    where_()
                ))
            }),
        IdStrategy::Key => {
            let k = record.key.as_ref().ok_or_else(|| {
                JobError::Other(format!("{} has no key (id = \"key\")", where_()))
            })?;
            String::from_utf8(k.clone()).map_err(|_| {
                JobError::Other(format!("{}: key is not UTF-8 (id = \"key\")", where_()))
            })
        }
        IdStrategy::Field(ptr) => {
            let v: serde_json::Value = serde_json::from_slice(&record.value)
                .map_err(|e| JobError::Other(format!("{} is not JSON: {e}", where_())))?;
            match v.pointer(ptr) {
                Some(serde_json::Value::String(s)) => Ok(s.clone()),
                Some(n @ serde_json::Value::Number(_)) => Ok(n.to_string()),
                other => Err(JobError::Other(format!(
                    "{}: id field {ptr} is {}",
                    where_(),
                    other.map_or("missing".to_string(), |v| format!(
                        "not a string or number: {v}"
                    ))
                ))),
            }
        }
    }
}

impl ActionBuilder for ConfigActionBuilder {
    fn build(&mut self, record: &Record, out: &mut Vec<BulkAction>) -> Result<()> {
        let id = document_id(&self.id, record)?;
        let version = match self.versioning {
            Versioning::None => None,
            Versioning::External => {
                Some(record.origin.as_ref().map(|o| o.offset).ok_or_else(|| {
                    JobError::Other("versioning = \"external\" needs a record origin".into())
                })?)
            }
        };
        let mut action = match self.operation {
            // The bulk processor checks the body, which is the record: one that is not
            // one JSON object follows `on_item_error`.
            Operation::Index => BulkAction::index(&self.index, Some(id), record.value.clone()),
            Operation::Create => BulkAction {
                op: OpType::Create,
                ..BulkAction::index(&self.index, Some(id), record.value.clone())
            },
            // An upsert embeds the record in its body, where a crafted record could add
            // keys (a script) that still make one JSON object: it is checked here.
            Operation::Upsert => {
                let framed = frame(&record.value).map_err(|why| {
                    let at = record.origin.as_ref().map_or(String::new(), |o| {
                        format!(" {}/{}@{}", o.stream, o.partition, o.offset)
                    });
                    JobError::Other(format!(
                        "record{at} cannot be written to Elasticsearch: {why}"
                    ))
                })?;
                let doc = framed.as_deref().unwrap_or(&record.value);
                BulkAction::upsert(&self.index, id, doc)
            }
        };
        action.version = version;
        action.origin = record.origin.clone();
        action.record = Some(record.value.clone());
        out.push(action);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn rec() -> Record {
        Record {
            key: Some(b"user-7".to_vec()),
            route_key: None,
            value: br#"{"user":"u7","n":3}"#.to_vec(),
            origin: Some(Origin {
                stream: Arc::from("orders"),
                partition: 2,
                offset: 41,
            }),
        }
    }

    #[test]
    fn every_body_is_one_line_of_a_json_object() {
        let cases: &[(&str, Result<Option<&str>, &str>)] = &[
            (r#"{"a":1}"#, Ok(None)),
            ("  {\"a\": [1, 2]}  ", Ok(None)),
            (
                "{\n  \"a\": 1,\n  \"b\": \"x\"\n}\n",
                Ok(Some(r#"{"a":1,"b":"x"}"#)),
            ),
            ("{\"a\":1}\r\n", Ok(Some(r#"{"a":1}"#))),
            // A text record that would add its own bulk action.
            (
                "x\n{\"delete\":{\"_index\":\"orders\",\"_id\":\"1\"}}",
                Err("not a JSON object"),
            ),
            (
                "{\"a\":1}\n{\"delete\":{\"_index\":\"orders\",\"_id\":\"1\"}}",
                Err("not JSON"),
            ),
            ("{\"a\":1} {\"b\":2}", Err("not JSON")),
            ("[1,2]", Err("not a JSON object")),
            ("\"text\"", Err("not a JSON object")),
            ("", Err("not a JSON object")),
            ("{\"a\":", Err("not JSON")),
        ];
        for (input, want) in cases {
            let got = frame(input.as_bytes());
            match (got, want) {
                (Ok(None), Ok(None)) => {}
                (Ok(Some(g)), Ok(Some(w))) => assert_eq!(String::from_utf8(g).unwrap(), *w),
                (Err(e), Err(w)) => assert!(e.contains(w), "{input:?}: {e}"),
                (g, w) => panic!("{input:?}: got {g:?}, want {w:?}"),
            }
        }
    }

    #[test]
    fn a_record_that_is_not_one_json_object_is_refused_naming_it() {
        let cfg = EsSinkConfig {
            operation: Operation::Upsert,
            ..EsSinkConfig::new("http://x", "idx")
        };
        let mut b = ConfigActionBuilder::new(&cfg);
        let mut smuggler = rec();
        smuggler.value =
            br#"{"user":"u7"},"script":{"source":"ctx._source.n = 0"},"x":{"a":1}"#.to_vec();
        let e = b.build(&smuggler, &mut Vec::new()).unwrap_err().to_string();
        assert!(e.contains("orders/2@41") && e.contains("not JSON"), "{e}");
        let mut pretty = rec();
        pretty.value = b"{\n  \"user\": \"u7\",\n  \"n\": 3\n}".to_vec();
        let mut out = Vec::new();
        b.build(&pretty, &mut out).unwrap();
        let mut bytes = Vec::new();
        out[0].encode(&mut bytes);
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            "{\"update\":{\"_index\":\"idx\",\"_id\":\"orders-2-41\"}}\n{\"doc\":{\"n\":3,\"user\":\"u7\"},\"doc_as_upsert\":true}\n"
        );
    }

    #[test]
    fn ids() {
        assert_eq!(
            document_id(&IdStrategy::Coordinates, &rec()).unwrap(),
            "orders-2-41"
        );
        assert_eq!(document_id(&IdStrategy::Key, &rec()).unwrap(), "user-7");
        assert_eq!(
            document_id(&IdStrategy::Field("/user".into()), &rec()).unwrap(),
            "u7"
        );
        assert_eq!(
            document_id(&IdStrategy::Field("/n".into()), &rec()).unwrap(),
            "3"
        );
        assert!(document_id(&IdStrategy::Field("/missing".into()), &rec()).is_err());
    }

    #[test]
    fn encodes_ndjson_with_external_version_and_upsert() {
        let mut cfg = EsSinkConfig::new("http://x", "idx");
        cfg.versioning = Versioning::External;
        let mut b = ConfigActionBuilder::new(&cfg);
        let mut out = Vec::new();
        b.build(&rec(), &mut out).unwrap();
        let mut bytes = Vec::new();
        out[0].encode(&mut bytes);
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            "{\"index\":{\"_index\":\"idx\",\"_id\":\"orders-2-41\",\"version\":41,\"version_type\":\"external\"}}\n{\"user\":\"u7\",\"n\":3}\n"
        );
        let mut bytes = Vec::new();
        BulkAction::upsert("idx", "u7".into(), br#"{"n":3}"#).encode(&mut bytes);
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            "{\"update\":{\"_index\":\"idx\",\"_id\":\"u7\"}}\n{\"doc\":{\"n\":3},\"doc_as_upsert\":true}\n"
        );
    }
}
