//! Records to bulk actions (Flink's ElasticsearchSinkFunction): the NDJSON lines of
//! one document operation.

use super::config::{EsSinkConfig, IdStrategy, NullValue, Operation, Versioning};
use super::encode::{action_line, Body, Encoder, Id};
use super::index_name::IndexTemplate;
use super::params::{text_of, with_timestamp, ActionParams, PipelineTemplate, TimestampSource};
use crate::error::{JobError, Result};
use crate::record::{describe, Op, Origin, Record};
use tracing::warn;

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
    /// Why no valid action could be made of the record (its id, its index or its body):
    /// such an action never goes into a request, it follows the failure handler
    /// (`on_item_error`) as a document Elasticsearch refused would.
    pub invalid: Option<String>,
    /// Routing, ingest pipeline and `require_alias`.
    pub params: ActionParams,
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
            invalid: None,
            params: ActionParams::default(),
        }
    }

    /// A `delete` of the document `id`.
    pub fn delete(index: &str, id: String) -> BulkAction {
        BulkAction {
            op: OpType::Delete,
            body: None,
            ..BulkAction::index(index, Some(id), Vec::new())
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
            invalid: None,
            params: ActionParams::default(),
        }
    }

    /// Appends the action's NDJSON lines to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        action_line(
            out,
            self.op,
            &self.index,
            self.id.as_deref().map(Id::Str),
            self.version,
            &self.params,
        );
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
    if memchr::memchr2(b'\n', b'\r', body).is_none() {
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

/// Turns a record into bulk actions (zero, one or several).
pub trait ActionBuilder: Send {
    fn build(&mut self, record: &Record, out: &mut Vec<BulkAction>) -> Result<()>;

    /// Appends the record's actions to `out`, encoded as bulk request lines: the same
    /// actions [`ActionBuilder::build`] makes, which is what the default does. A builder
    /// may write them straight into the encoder's buffer instead, saving the
    /// allocations of a [`BulkAction`] per record ([`ConfigActionBuilder`] does).
    fn encode(&mut self, record: &Record, out: &mut Encoder) -> Result<()> {
        out.push_built(|actions| self.build(record, actions))
    }
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
///
/// What makes a record unwritable (no key for `id = "key"`, a missing index field, a
/// body that is not one JSON object) is the record's problem, not the job's: the
/// builder makes an [`invalid`](BulkAction::invalid) action of it, which the failure
/// handler fails or dead-letters by `on_item_error`.
pub struct ConfigActionBuilder {
    pub index: IndexTemplate,
    pub id: IdStrategy,
    pub operation: Operation,
    pub versioning: Versioning,
    pub on_null_value: Option<NullValue>,
    /// Tombstones skipped (`on_null_value = "skip"`).
    pub skipped_tombstones: u64,
    /// No two records reaching the sink share an origin (see
    /// [`ConfigActionBuilder::origins_unique`]).
    pub origins_unique: bool,
    pub pipeline: Option<PipelineTemplate>,
    /// A JSON pointer to each action's routing value.
    pub routing: Option<String>,
    pub require_alias: bool,
    /// The index is a data stream: every document gets an `@timestamp` from here.
    pub data_stream: Option<TimestampSource>,
}

impl ConfigActionBuilder {
    /// The builder `cfg` describes.
    ///
    /// # Panics
    /// If `cfg.index` is not a valid template: [`EsSinkConfig::validate`] refuses it.
    pub fn new(cfg: &EsSinkConfig) -> ConfigActionBuilder {
        ConfigActionBuilder {
            index: IndexTemplate::parse(&cfg.index)
                .and_then(|t| {
                    t.with_topics(cfg.topic_to_index.clone())
                        .map_err(|(topic, e)| format!("topic_to_index {topic}: {e}"))
                })
                .unwrap_or_else(|e| panic!("index {e} (validate the configuration first)")),
            id: cfg.id.clone(),
            operation: cfg.operation,
            versioning: cfg.versioning,
            on_null_value: cfg.on_null_value,
            skipped_tombstones: 0,
            origins_unique: false,
            pipeline: cfg.pipeline.as_deref().map(|p| {
                PipelineTemplate::parse(p)
                    .unwrap_or_else(|e| panic!("pipeline {e} (validate the configuration first)"))
            }),
            routing: cfg.routing.clone(),
            require_alias: cfg.require_alias,
            data_stream: cfg.data_stream.as_ref().map(|_| cfg.timestamp.clone()),
        }
    }

    /// Whether actions carry more than an index, an id and a version.
    fn has_params(&self) -> bool {
        self.pipeline.is_some()
            || self.routing.is_some()
            || self.require_alias
            || self.data_stream.is_some()
    }

    /// The parameters of an action of `op` on the document whose fields `source` holds
    /// (its value, or for a delete without one its JSON key).
    fn params(
        &self,
        op: OpType,
        source: Option<&serde_json::Value>,
    ) -> std::result::Result<ActionParams, String> {
        Ok(ActionParams {
            routing: match &self.routing {
                Some(ptr) => Some(text_of("routing", ptr, source)?),
                None => None,
            },
            pipeline: match (&self.pipeline, op) {
                (Some(p), OpType::Index | OpType::Create) => Some(p.render(source)?),
                _ => None,
            },
            require_alias: self.require_alias && op != OpType::Delete,
        })
    }

    /// Promises that no two records reaching the sink share an origin and output
    /// number ([`Record::output`]), and that nothing else writes to the sink's
    /// documents through it: true of a job file, whose source reads each offset once
    /// per run and whose transforms number the outputs of one input. An action whose id is its record's coordinates then names a
    /// document no other action of the sink's life names, and skips the batcher's
    /// per-document bookkeeping. Not for a job whose operators may emit several
    /// records of one input (a `flat_map`), or for a builder that wraps this one and
    /// adds actions of its own.
    pub fn origins_unique(mut self) -> ConfigActionBuilder {
        self.origins_unique = true;
        self
    }

    /// The record parsed, when its id or index reads its fields and it has a value.
    fn doc(&self, record: &Record) -> std::result::Result<Option<serde_json::Value>, String> {
        let needs_doc = self.index.reads_fields()
            || matches!(self.id, IdStrategy::Field(_))
            || self.routing.is_some()
            || self
                .pipeline
                .as_ref()
                .is_some_and(PipelineTemplate::reads_fields);
        if !needs_doc || record.tombstone {
            return Ok(None);
        }
        serde_json::from_slice(&record.value)
            .map(Some)
            .map_err(|e| format!("the record is not JSON: {e}"))
    }

    /// The action of a record with a value; the error says why there can be none.
    fn action(&self, record: &Record) -> std::result::Result<BulkAction, String> {
        let doc = self.doc(record)?;
        let id = document_id(&self.id, record, doc.as_ref())?;
        let origin = record.origin.as_ref().map(|o| (&*o.stream, o.partition));
        let index = self.index.render(record.timestamp, origin, doc.as_ref())?;
        let mut action = match self.operation {
            // The bulk processor checks the body, which is the record: one that is not
            // one JSON object follows `on_item_error`.
            Operation::Index => BulkAction::index(&index, Some(id), record.value.to_vec()),
            Operation::Create => {
                let body = match &self.data_stream {
                    Some(ts) => with_timestamp(&record.value, ts, record.timestamp)?,
                    None => record.value.to_vec(),
                };
                BulkAction {
                    op: OpType::Create,
                    ..BulkAction::index(&index, Some(id), body)
                }
            }
            // An upsert embeds the record in its body, where a crafted record could add
            // keys (a script) that still make one JSON object: it is checked here.
            Operation::Upsert => {
                let framed = frame(&record.value)?;
                let doc = framed.as_deref().unwrap_or(&record.value);
                BulkAction::upsert(&index, id, doc)
            }
        };
        action.params = self.params(action.op, doc.as_ref())?;
        Ok(action)
    }

    /// The action of a tombstone, if any.
    fn tombstone(
        &mut self,
        record: &Record,
    ) -> Result<std::result::Result<Option<BulkAction>, String>> {
        Ok(Ok(match self.on_null_value {
            None => {
                return Ok(Err(
                    "the record is a tombstone (no value) and on_null_value is not set".into(),
                ))
            }
            Some(NullValue::Fail) => {
                return Err(JobError::Other(format!(
                    "{} is a tombstone (no value) and on_null_value = \"fail\"",
                    describe(record)
                )))
            }
            Some(NullValue::Skip) => {
                self.skipped_tombstones += 1;
                if self.skipped_tombstones.is_power_of_two() {
                    warn!(record = %describe(record), skipped = self.skipped_tombstones, "skipping tombstones (on_null_value = \"skip\")");
                }
                None
            }
            Some(NullValue::Delete) => match self.delete(record) {
                Ok(a) => Some(a),
                Err(why) => return Ok(Err(why)),
            },
        }))
    }

    /// The action of a delete: the document its id names, read from the value (the
    /// image before the delete) when it has one, else from the key (`id = "field:/p"`
    /// reads the pointer from a JSON key, as a Debezium key `{"id": 7}`).
    fn delete(&self, record: &Record) -> std::result::Result<BulkAction, String> {
        if self.data_stream.is_some() {
            return Err("a data stream takes no deletes".into());
        }
        let doc = self.doc(record)?;
        let id = match (&self.id, &doc) {
            (IdStrategy::Coordinates, _) => {
                return Err(
                    "a delete names its document by key or field, not by its own coordinates (id = \"coordinates\")"
                        .into(),
                )
            }
            (IdStrategy::Field(ptr), None) => {
                let key = json_key(record).map_err(|why| {
                    format!("a delete without a value takes id field {ptr} from its key, {why}")
                })?;
                field_id(ptr, Some(&key))?
            }
            _ => document_id(&self.id, record, doc.as_ref())?,
        };
        let origin = record.origin.as_ref().map(|o| (&*o.stream, o.partition));
        let index = self.index.render(record.timestamp, origin, doc.as_ref())?;
        let mut action = BulkAction::delete(&index, id);
        // Without the image before the delete, the document's routing is read from
        // its key, as its id is; so it is when the image lacks the field (Debezium's
        // default replica identity gives the key's columns only).
        let key_doc = match (&self.routing, &doc) {
            (Some(ptr), None) => Some(json_key(record).map_err(|why| {
                format!("a delete without a value takes routing field {ptr} from its key, {why}")
            })?),
            (Some(ptr), Some(d)) if d.pointer(ptr).is_none() => json_key(record).ok(),
            _ => None,
        };
        action.params = self.params(OpType::Delete, key_doc.as_ref().or(doc.as_ref()))?;
        Ok(action)
    }
}

/// The record's key parsed as JSON; the error ends a sentence about it.
fn json_key(record: &Record) -> std::result::Result<serde_json::Value, &'static str> {
    let key = record.key.as_ref().ok_or("and it has none")?;
    serde_json::from_slice(key).map_err(|_| "which is not JSON")
}

/// The document id of a record under `strategy`; `doc` is the parsed record, if the
/// caller has it (`field:` parses the record otherwise).
pub fn document_id(
    strategy: &IdStrategy,
    record: &Record,
    doc: Option<&serde_json::Value>,
) -> std::result::Result<String, String> {
    match strategy {
        IdStrategy::Coordinates => record
            .origin
            .as_ref()
            .map(|o| match record.output {
                0 => format!("{}-{}-{}", o.stream, o.partition, o.offset),
                n => format!("{}-{}-{}-{n}", o.stream, o.partition, o.offset),
            })
            .ok_or_else(|| "id = \"coordinates\" needs a record origin".to_string()),
        IdStrategy::Key => {
            let k = record
                .key
                .as_ref()
                .ok_or_else(|| "the record has no key (id = \"key\")".to_string())?;
            String::from_utf8(k.to_vec())
                .map_err(|_| "the record's key is not UTF-8 (id = \"key\")".to_string())
        }
        IdStrategy::Field(ptr) => {
            let parsed;
            let v = match doc {
                Some(v) => v,
                None => {
                    parsed = serde_json::from_slice::<serde_json::Value>(&record.value)
                        .map_err(|e| format!("the record is not JSON: {e}"))?;
                    &parsed
                }
            };
            field_id(ptr, Some(v))
        }
    }
}

/// The id that field `ptr` of `doc` gives: a string's text or a number's digits.
fn field_id(ptr: &str, doc: Option<&serde_json::Value>) -> std::result::Result<String, String> {
    match doc.and_then(|d| d.pointer(ptr)) {
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(n @ serde_json::Value::Number(_)) => Ok(n.to_string()),
        other => Err(format!(
            "id field {ptr} is {}",
            other.map_or("missing".to_string(), |v| format!(
                "not a string or number: {v}"
            ))
        )),
    }
}

impl ConfigActionBuilder {
    /// Writes the record's action straight into `out` when it is the common case (a
    /// fixed index, an id from the coordinates or a UTF-8 key, a body that frames);
    /// returns false, having written nothing, for anything else, which
    /// [`ActionBuilder::build`] then makes. Both write the same lines.
    pub(crate) fn encode_direct(&self, record: &Record, out: &mut Encoder) -> bool {
        if record.tombstone || record.op == Op::Delete || record.output != 0 || self.has_params() {
            return false;
        }
        let Some(index) = self.index.fixed() else {
            return false;
        };
        let version = match (self.versioning, &record.origin) {
            (Versioning::None, _) => None,
            (Versioning::External, Some(o)) => Some(o.offset),
            (Versioning::External, None) => return false,
        };
        let id = match (&self.id, &record.origin, &record.key) {
            (IdStrategy::Coordinates, Some(o), _) => {
                Id::Coordinates(&o.stream, o.partition, o.offset)
            }
            (IdStrategy::Key, _, Some(k)) => match std::str::from_utf8(k) {
                Ok(k) => Id::Str(k),
                Err(_) => return false,
            },
            _ => return false,
        };
        let value: &[u8] = &record.value;
        let Ok(reframed) = frame(value) else {
            return false;
        };
        let (op, body) = match self.operation {
            Operation::Index => (OpType::Index, Body::Record(value)),
            Operation::Create => (OpType::Create, Body::Record(value)),
            Operation::Upsert => (OpType::Update, Body::UpsertOf(value)),
        };
        let keyless = self.origins_unique && matches!(id, Id::Coordinates(..));
        out.push_lines(
            op,
            index,
            (id, keyless),
            version,
            body,
            reframed,
            record.origin.clone(),
        );
        true
    }
}

impl ActionBuilder for ConfigActionBuilder {
    fn encode(&mut self, record: &Record, out: &mut Encoder) -> Result<()> {
        if self.encode_direct(record, out) {
            return Ok(());
        }
        out.push_built(|actions| self.build(record, actions))
    }

    fn build(&mut self, record: &Record, out: &mut Vec<BulkAction>) -> Result<()> {
        let made = if record.op == Op::Delete {
            self.delete(record)
        } else if record.tombstone {
            match self.tombstone(record)? {
                Ok(None) => return Ok(()),
                Ok(Some(a)) => Ok(a),
                Err(why) => Err(why),
            }
        } else {
            self.action(record)
        };
        let mut action = match made {
            Ok(a) => a,
            Err(why) => BulkAction {
                op: match self.operation {
                    Operation::Index => OpType::Index,
                    Operation::Create => OpType::Create,
                    Operation::Upsert => OpType::Update,
                },
                index: self.index.fixed().unwrap_or("<index>").to_string(),
                id: None,
                version: None,
                body: None,
                origin: None,
                record: None,
                invalid: Some(format!(
                    "{} cannot be written to Elasticsearch: {why}",
                    describe(record)
                )),
                params: ActionParams::default(),
            },
        };
        if self.versioning == Versioning::External && action.invalid.is_none() {
            match record.origin.as_ref() {
                Some(o) => action.version = Some(o.offset),
                None => {
                    action.invalid = Some(format!(
                        "{}: versioning = \"external\" needs a record origin",
                        describe(record)
                    ))
                }
            }
        }
        action.origin = record.origin.clone();
        action.record = Some(record.value.to_vec());
        out.push(action);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::elasticsearch::params::DataStream;
    use std::sync::Arc;

    fn rec() -> Record {
        Record {
            key: Some(b"user-7".to_vec().into()),
            route_key: None,
            value: br#"{"user":"u7","n":3}"#.to_vec().into(),
            origin: Some(Origin {
                stream: Arc::from("orders"),
                partition: 2,
                offset: 41,
            }),
            ..Default::default()
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
        smuggler.value = br#"{"user":"u7"},"script":{"source":"ctx._source.n = 0"},"x":{"a":1}"#
            .to_vec()
            .into();
        let mut out = Vec::new();
        b.build(&smuggler, &mut out).unwrap();
        let why = out[0].invalid.as_deref().expect("refused");
        assert!(
            why.contains("orders/2@41") && why.contains("not JSON"),
            "{why}"
        );
        assert_eq!(out[0].body, None, "nothing of it can reach a request");
        assert_eq!(
            out[0].record.as_deref(),
            Some(&smuggler.value[..]),
            "kept for a dead letter"
        );
        let mut pretty = rec();
        pretty.value = b"{\n  \"user\": \"u7\",\n  \"n\": 3\n}".to_vec().into();
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
    fn records_go_to_the_index_their_timestamp_and_fields_name() {
        let cfg = EsSinkConfig {
            id: IdStrategy::Key,
            ..EsSinkConfig::new("http://x", "{/user}-{yyyy.MM.dd}")
        };
        let mut b = ConfigActionBuilder::new(&cfg);
        let mut r = rec();
        r.timestamp = Some(1_772_874_302_123); // 2026-03-07
        let mut out = Vec::new();
        b.build(&r, &mut out).unwrap();
        assert_eq!(
            (out[0].index.as_str(), out[0].invalid.as_deref()),
            ("u7-2026.03.07", None)
        );
        r.value = br#"{"user":"U7"}"#.to_vec().into();
        b.build(&r, &mut out).unwrap();
        let why = out[1].invalid.as_deref().unwrap();
        assert!(
            why.contains("orders/2@41") && why.contains("lower case"),
            "{why}"
        );
        r.value = br#"{"user":"u7"}"#.to_vec().into();
        r.timestamp = None;
        b.build(&r, &mut out).unwrap();
        assert!(out[2].invalid.as_deref().unwrap().contains("no timestamp"));
        r.key = None;
        b.build(&r, &mut out).unwrap();
        assert!(out[3].invalid.as_deref().unwrap().contains("no key"));
    }

    #[test]
    fn tombstones_do_what_on_null_value_says() {
        let tombstone = Record {
            value: Default::default(),
            tombstone: true,
            timestamp: Some(0),
            ..rec()
        };
        let with = |policy| {
            let cfg = EsSinkConfig {
                id: IdStrategy::Key,
                on_null_value: policy,
                versioning: Versioning::External,
                ..EsSinkConfig::new("http://x", "idx-{yyyy}")
            };
            let mut b = ConfigActionBuilder::new(&cfg);
            let mut out = Vec::new();
            let r = b.build(&tombstone, &mut out);
            (r, out, b.skipped_tombstones)
        };
        let (r, out, _) = with(Some(NullValue::Delete));
        r.unwrap();
        let mut bytes = Vec::new();
        out[0].encode(&mut bytes);
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            "{\"delete\":{\"_index\":\"idx-1970\",\"_id\":\"user-7\",\"version\":41,\"version_type\":\"external\"}}\n"
        );
        let (r, out, skipped) = with(Some(NullValue::Skip));
        assert!(r.is_ok() && out.is_empty() && skipped == 1);
        let (r, out, _) = with(Some(NullValue::Fail));
        let e = r.unwrap_err().to_string();
        assert!(
            out.is_empty() && e.contains("orders/2@41") && e.contains("tombstone"),
            "{e}"
        );
        let (r, out, _) = with(None);
        r.unwrap();
        assert!(out[0]
            .invalid
            .as_deref()
            .unwrap()
            .contains("on_null_value is not set"));
    }

    #[test]
    fn a_delete_deletes_the_document_its_image_or_key_names() {
        let build = |id: IdStrategy, r: &Record| {
            let cfg = EsSinkConfig {
                id,
                ..EsSinkConfig::new("http://x", "idx")
            };
            let mut out = Vec::new();
            ConfigActionBuilder::new(&cfg).build(r, &mut out).unwrap();
            let a = out.pop().unwrap();
            match a.invalid {
                Some(why) => Err(why),
                None => {
                    let mut bytes = Vec::new();
                    a.encode(&mut bytes);
                    Ok(String::from_utf8(bytes).unwrap())
                }
            }
        };
        let field = || IdStrategy::Field("/id".into());
        // The image before the delete names the document, and is not written.
        let with_image = Record {
            value: br#"{"id":7,"name":"x"}"#.to_vec().into(),
            op: Op::Delete,
            ..rec()
        };
        let delete_7 = "{\"delete\":{\"_index\":\"idx\",\"_id\":\"7\"}}\n";
        assert_eq!(build(field(), &with_image).unwrap(), delete_7);
        // Without one, the key does: a JSON key through the field's pointer.
        let keyed = Record {
            key: Some(br#"{"id":7}"#.to_vec().into()),
            value: Default::default(),
            tombstone: true,
            op: Op::Delete,
            ..rec()
        };
        assert_eq!(build(field(), &keyed).unwrap(), delete_7);
        assert_eq!(
            build(IdStrategy::Key, &keyed).unwrap(),
            "{\"delete\":{\"_index\":\"idx\",\"_id\":\"{\\\"id\\\":7}\"}}\n"
        );
        let plain_key = Record {
            key: Some(b"7".to_vec().into()),
            ..keyed.clone()
        };
        assert_eq!(build(IdStrategy::Key, &plain_key).unwrap(), delete_7);
        let e = build(
            field(),
            &Record {
                key: Some(b"u-7".to_vec().into()),
                ..keyed.clone()
            },
        )
        .unwrap_err();
        assert!(e.contains("not JSON"), "{e}");
        let e = build(
            field(),
            &Record {
                key: None,
                ..keyed.clone()
            },
        )
        .unwrap_err();
        assert!(e.contains("has none"), "{e}");
        // A delete's own coordinates name no document it could mean.
        let e = build(IdStrategy::Coordinates, &with_image).unwrap_err();
        assert!(e.contains("coordinates"), "{e}");
        // A delete needs no on_null_value, and takes the direct path never.
        let cfg = EsSinkConfig {
            id: field(),
            ..EsSinkConfig::new("http://x", "idx")
        };
        assert!(!ConfigActionBuilder::new(&cfg).encode_direct(&with_image, &mut Encoder::default()));
    }

    /// The encoded lines of what `cfg` makes of `r`, or why it makes nothing.
    fn lines(cfg: &EsSinkConfig, r: &Record) -> std::result::Result<String, String> {
        let mut out = Vec::new();
        ConfigActionBuilder::new(cfg).build(r, &mut out).unwrap();
        let a = out.pop().unwrap();
        match a.invalid {
            Some(why) => Err(why),
            None => {
                let mut bytes = Vec::new();
                a.encode(&mut bytes);
                Ok(String::from_utf8(bytes).unwrap())
            }
        }
    }

    #[test]
    fn every_action_of_a_document_carries_its_routing() {
        let cfg = EsSinkConfig {
            id: IdStrategy::Field("/id".into()),
            operation: Operation::Upsert,
            routing: Some("/tenant".into()),
            require_alias: true,
            on_null_value: Some(NullValue::Delete),
            ..EsSinkConfig::new("http://x", "idx")
        };
        let upsert = Record {
            value: br#"{"id":7,"tenant":"t1"}"#.to_vec().into(),
            ..rec()
        };
        assert_eq!(
            lines(&cfg, &upsert).unwrap(),
            "{\"update\":{\"_index\":\"idx\",\"_id\":\"7\",\"routing\":\"t1\",\"require_alias\":true}}\n{\"doc\":{\"id\":7,\"tenant\":\"t1\"},\"doc_as_upsert\":true}\n"
        );
        // A delete without a value reads its routing from its JSON key, as its id.
        let delete = Record {
            key: Some(br#"{"id":7,"tenant":"t1"}"#.to_vec().into()),
            value: Default::default(),
            tombstone: true,
            ..rec()
        };
        assert_eq!(
            lines(&cfg, &delete).unwrap(),
            "{\"delete\":{\"_index\":\"idx\",\"_id\":\"7\",\"routing\":\"t1\"}}\n"
        );
        let with_image = Record {
            op: Op::Delete,
            ..upsert.clone()
        };
        assert_eq!(lines(&cfg, &with_image), lines(&cfg, &delete));
        let image_without_routing = Record {
            value: br#"{"id":7}"#.to_vec().into(),
            key: Some(br#"{"id":7,"tenant":"t1"}"#.to_vec().into()),
            op: Op::Delete,
            ..rec()
        };
        assert_eq!(lines(&cfg, &image_without_routing), lines(&cfg, &delete));
        let unrouted = Record {
            value: br#"{"id":7}"#.to_vec().into(),
            ..rec()
        };
        let why = lines(&cfg, &unrouted).unwrap_err();
        assert!(
            why.contains("routing field /tenant is missing") && why.contains("orders/2@41"),
            "{why}"
        );
        let by_key = EsSinkConfig {
            id: IdStrategy::Key,
            ..cfg.clone()
        };
        let plain_key = Record {
            key: Some(b"u-7".to_vec().into()),
            ..delete.clone()
        };
        let e = lines(&by_key, &plain_key).unwrap_err();
        assert!(
            e.contains("routing field /tenant from its key, which is not JSON"),
            "{e}"
        );
        let e = lines(&cfg, &plain_key).unwrap_err();
        assert!(e.contains("which is not JSON"), "{e}");
        // The document's key is its index and id: its writes are ordered whatever
        // their routing, and none is coalesced away (routing turns coalescing off).
        let mut enc = Encoder::default();
        ConfigActionBuilder::new(&cfg)
            .encode(&upsert, &mut enc)
            .unwrap();
        let batch = enc.take_batch();
        let crate::kits::bulk::Added::Encoded(e) = &batch.actions[0] else {
            panic!("encoded")
        };
        let key = e.doc.as_ref().unwrap().as_bytes().to_vec();
        assert_eq!(
            String::from_utf8(key).unwrap(),
            "\"_index\":\"idx\",\"_id\":\"7\""
        );
        assert_eq!(e.item.full_action().params.routing.as_deref(), Some("t1"));
        assert!(e.item.full_action().params.require_alias);
        assert!(!cfg.coalesces());
    }

    #[test]
    fn a_pipeline_goes_with_index_and_create_actions() {
        let cfg = EsSinkConfig {
            pipeline: Some("enrich-{/user}".into()),
            ..EsSinkConfig::new("http://x", "idx")
        };
        assert_eq!(
            lines(&cfg, &rec()).unwrap(),
            "{\"index\":{\"_index\":\"idx\",\"_id\":\"orders-2-41\",\"pipeline\":\"enrich-u7\"}}\n{\"user\":\"u7\",\"n\":3}\n"
        );
        let e = lines(
            &cfg,
            &Record {
                value: br#"{"n":3}"#.to_vec().into(),
                ..rec()
            },
        )
        .unwrap_err();
        assert!(e.contains("pipeline field /user is missing"), "{e}");
        assert!(!ConfigActionBuilder::new(&cfg).encode_direct(&rec(), &mut Encoder::default()));
        let upsert = EsSinkConfig {
            operation: Operation::Upsert,
            ..cfg.clone()
        };
        assert!(upsert
            .validate()
            .unwrap_err()
            .1
            .contains("no ingest pipeline on an update"));
    }

    #[test]
    fn a_data_stream_gets_creates_with_a_timestamp_and_no_deletes() {
        let cfg = EsSinkConfig {
            operation: Operation::Create,
            data_stream: Some(DataStream {
                kind: "logs".into(),
                dataset: "orders".into(),
                namespace: "prod".into(),
            }),
            ..EsSinkConfig::new("http://x", "logs-orders-prod")
        };
        cfg.validate().unwrap();
        let r = Record {
            timestamp: Some(1_772_874_302_123),
            ..rec()
        };
        assert_eq!(
            lines(&cfg, &r).unwrap(),
            "{\"create\":{\"_index\":\"logs-orders-prod\",\"_id\":\"orders-2-41\"}}\n{\"@timestamp\":\"2026-03-07T09:05:02.123Z\",\"n\":3,\"user\":\"u7\"}\n"
        );
        let from_field = EsSinkConfig {
            timestamp: TimestampSource::Field("/n".into()),
            ..cfg.clone()
        };
        assert!(lines(&from_field, &r).unwrap().contains("\"@timestamp\":3"));
        let e = lines(
            &cfg,
            &Record {
                timestamp: None,
                ..rec()
            },
        )
        .unwrap_err();
        assert!(e.contains("no timestamp"), "{e}");
        let e = lines(
            &cfg,
            &Record {
                op: Op::Delete,
                ..r.clone()
            },
        )
        .unwrap_err();
        assert!(e.contains("a data stream takes no deletes"), "{e}");
        for (bad, key) in [
            (
                EsSinkConfig {
                    operation: Operation::Upsert,
                    ..cfg.clone()
                },
                "operation",
            ),
            (
                EsSinkConfig {
                    operation: Operation::Index,
                    ..cfg.clone()
                },
                "operation",
            ),
            (
                EsSinkConfig {
                    id: IdStrategy::Key,
                    on_null_value: Some(NullValue::Delete),
                    ..cfg.clone()
                },
                "on_null_value",
            ),
            (
                EsSinkConfig {
                    id: IdStrategy::Key,
                    ..cfg.clone()
                },
                "id",
            ),
            (
                EsSinkConfig {
                    versioning: Versioning::External,
                    ..cfg.clone()
                },
                "versioning",
            ),
            (
                EsSinkConfig {
                    require_alias: true,
                    ..cfg.clone()
                },
                "require_alias",
            ),
            (
                EsSinkConfig {
                    routing: Some("/t".into()),
                    ..cfg.clone()
                },
                "routing",
            ),
            (
                EsSinkConfig {
                    data_stream: None,
                    timestamp: TimestampSource::Field("/ts".into()),
                    ..cfg.clone()
                },
                "timestamp_field",
            ),
        ] {
            assert_eq!(bad.validate().unwrap_err().0, key);
        }
    }

    #[test]
    fn the_outputs_of_one_record_have_ids_of_their_own() {
        let second = Record { output: 2, ..rec() };
        assert_eq!(
            document_id(&IdStrategy::Coordinates, &second, None).unwrap(),
            "orders-2-41-2"
        );
        let cfg = EsSinkConfig::new("http://x", "idx");
        assert!(!ConfigActionBuilder::new(&cfg).encode_direct(&second, &mut Encoder::default()));
    }

    #[test]
    fn ids() {
        assert_eq!(
            document_id(&IdStrategy::Coordinates, &rec(), None).unwrap(),
            "orders-2-41"
        );
        assert_eq!(
            document_id(&IdStrategy::Key, &rec(), None).unwrap(),
            "user-7"
        );
        assert_eq!(
            document_id(&IdStrategy::Field("/user".into()), &rec(), None).unwrap(),
            "u7"
        );
        assert_eq!(
            document_id(&IdStrategy::Field("/n".into()), &rec(), None).unwrap(),
            "3"
        );
        assert!(document_id(&IdStrategy::Field("/missing".into()), &rec(), None).is_err());
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
