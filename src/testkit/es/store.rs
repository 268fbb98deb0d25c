//! The in-memory document store and the semantics of each write.

use serde_json::{json, Map, Value};
use std::collections::HashMap;

#[derive(Debug, Clone)]
pub(crate) struct Doc {
    pub id: String,
    /// The routing it was written with: the same id under another routing is another
    /// document, as on another shard of Elasticsearch.
    pub routing: Option<String>,
    pub source: Value,
    pub version: i64,
    pub seq_no: i64,
}

/// The type a field was first indexed with (dynamic mapping, top level only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FieldType {
    Long,
    Double,
    Text,
    Boolean,
    Object,
}

impl FieldType {
    fn name(self) -> &'static str {
        match self {
            FieldType::Long => "long",
            FieldType::Double => "float",
            FieldType::Text => "text",
            FieldType::Boolean => "boolean",
            FieldType::Object => "object",
        }
    }

    pub fn parse(es_type: &str) -> Option<FieldType> {
        Some(match es_type {
            "long" | "integer" | "short" | "byte" => FieldType::Long,
            "double" | "float" | "half_float" | "scaled_float" => FieldType::Double,
            "text" | "keyword" => FieldType::Text,
            "boolean" => FieldType::Boolean,
            "object" | "nested" => FieldType::Object,
            _ => return None,
        })
    }

    fn of(v: &Value) -> Option<FieldType> {
        match v {
            Value::Null => None,
            Value::Bool(_) => Some(FieldType::Boolean),
            Value::Number(n) if n.is_i64() || n.is_u64() => Some(FieldType::Long),
            Value::Number(_) => Some(FieldType::Double),
            Value::String(_) => Some(FieldType::Text),
            Value::Object(_) => Some(FieldType::Object),
            Value::Array(a) => a.iter().find_map(FieldType::of),
        }
    }

    /// Whether a value can be indexed into a field of this type (with Elasticsearch's
    /// coercion: numeric strings into numbers, scalars into text).
    fn accepts(self, v: &Value) -> bool {
        match (self, v) {
            (_, Value::Null) => true,
            (_, Value::Array(a)) => a.iter().all(|x| self.accepts(x)),
            (FieldType::Long, Value::Number(n)) => {
                n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
            }
            (FieldType::Long, Value::String(s)) => s.parse::<i64>().is_ok(),
            (FieldType::Double, Value::Number(_)) => true,
            (FieldType::Double, Value::String(s)) => s.parse::<f64>().is_ok(),
            (FieldType::Text, Value::Object(_)) => false,
            (FieldType::Text, _) => true,
            (FieldType::Boolean, Value::Bool(_)) => true,
            (FieldType::Boolean, Value::String(s)) => s == "true" || s == "false",
            (FieldType::Object, Value::Object(_)) => true,
            _ => false,
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Index {
    /// By [`doc_key`].
    pub docs: HashMap<String, Doc>,
    pub mapping: HashMap<String, FieldType>,
    /// A data stream: create only, every document with an `@timestamp`.
    pub data_stream: bool,
}

/// Where a document is kept: its id, and its routing if it has one.
pub(crate) fn doc_key(id: &str, routing: Option<&str>) -> String {
    match routing {
        None => id.to_string(),
        Some(r) => format!("{id}\u{0}{r}"),
    }
}

impl Index {
    /// Checks `source` against the mapping and extends it; the error is the
    /// `document_parsing_exception` reason.
    fn map(&mut self, id: &str, source: &Value) -> Result<(), String> {
        let Value::Object(fields) = source else {
            return Err(format!(
                "[1:1] failed to parse: document with id '{id}' is not an object"
            ));
        };
        for (k, v) in fields {
            if let Some(t) = self.mapping.get(k) {
                if !t.accepts(v) {
                    return Err(format!(
                        "[1:2] failed to parse field [{k}] of type [{}] in document with id '{id}'. Preview of field's value: '{}'",
                        t.name(),
                        v
                    ));
                }
            }
        }
        for (k, v) in fields {
            if let Some(t) = FieldType::of(v) {
                self.mapping.entry(k.clone()).or_insert(t);
            }
        }
        Ok(())
    }
}

/// The whole store.
#[derive(Debug, Default)]
pub(crate) struct Store {
    pub indices: HashMap<String, Index>,
    /// Ingest pipelines by id (`PUT _ingest/pipeline/<id>`).
    pub pipelines: HashMap<String, Value>,
    /// Composable index templates by name (`PUT _index_template/<name>`).
    pub templates: std::collections::BTreeMap<String, Value>,
    /// Aliases: alias -> its write index.
    pub aliases: HashMap<String, String>,
    seq_no: i64,
    auto_id: u64,
}

/// The outcome of one write, as a bulk item (without the operation wrapper).
pub(crate) type ItemResult = Value;

fn ok_item(
    index: &str,
    id: &str,
    doc_version: i64,
    seq_no: i64,
    result: &str,
    status: u16,
) -> ItemResult {
    json!({
        "_index": index, "_id": id, "_version": doc_version, "result": result,
        "_shards": {"total": 2, "successful": 1, "failed": 0},
        "_seq_no": seq_no, "_primary_term": 1, "status": status
    })
}

/// Stores a document and returns its `created` / `updated` item result.
#[allow(clippy::too_many_arguments)]
fn store_doc(
    idx: &mut Index,
    index: &str,
    (id, routing): (&str, Option<&str>),
    source: Value,
    version: i64,
    seq_no: i64,
    existed: bool,
) -> ItemResult {
    idx.docs.insert(
        doc_key(id, routing),
        Doc {
            id: id.to_string(),
            routing: routing.map(String::from),
            source,
            version,
            seq_no,
        },
    );
    let (result, status) = if existed {
        ("updated", 200)
    } else {
        ("created", 201)
    };
    ok_item(index, id, version, seq_no, result, status)
}

pub(crate) fn error_item(
    index: &str,
    id: &str,
    status: u16,
    kind: &str,
    reason: &str,
) -> ItemResult {
    json!({
        "_index": index, "_id": id, "status": status,
        "error": {"type": kind, "reason": reason, "index": index, "shard": "0", "index_uuid": "_na_"}
    })
}

/// How an item asks to be versioned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Versioning {
    Internal,
    External(i64),
    ExternalGte(i64),
}

fn deep_merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                match t.get_mut(k) {
                    Some(slot) if slot.is_object() && v.is_object() => deep_merge(slot, v),
                    _ => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

impl Store {
    pub fn create_index(&mut self, name: &str, body: &Value) -> Result<(), ItemResult> {
        if self.indices.contains_key(name) {
            return Err(
                json!({"error": {"type": "resource_already_exists_exception", "reason": format!("index [{name}/_na_] already exists"), "index": name}, "status": 400}),
            );
        }
        let mut index = Index::default();
        if let Some(Value::Object(props)) = body.pointer("/mappings/properties") {
            for (field, def) in props {
                if let Some(t) = def
                    .get("type")
                    .and_then(Value::as_str)
                    .and_then(FieldType::parse)
                {
                    index.mapping.insert(field.clone(), t);
                }
            }
        }
        self.indices.insert(name.to_string(), index);
        Ok(())
    }

    fn next_seq(&mut self) -> i64 {
        self.seq_no += 1;
        self.seq_no - 1
    }

    pub fn new_id(&mut self) -> String {
        self.auto_id += 1;
        format!("auto-{:012}", self.auto_id)
    }

    /// `index` (or `create` when `create_only`).
    pub fn index(
        &mut self,
        index: &str,
        (id, routing): (&str, Option<&str>),
        source: Value,
        v: Versioning,
        create_only: bool,
    ) -> ItemResult {
        let idx = self.indices.entry(index.to_string()).or_default();
        let existing = idx.docs.get(&doc_key(id, routing)).map(|d| d.version);
        if create_only && existing.is_some() {
            return error_item(
                index,
                id,
                409,
                "version_conflict_engine_exception",
                &format!(
                    "[{id}]: version conflict, document already exists (current version [{}])",
                    existing.unwrap_or(0)
                ),
            );
        }
        let version = match (v, existing) {
            (Versioning::Internal, e) => e.unwrap_or(0) + 1,
            (Versioning::External(n), Some(cur)) if cur >= n => {
                return error_item(index, id, 409, "version_conflict_engine_exception", &format!("[{id}]: version conflict, current version [{cur}] is higher or equal to the one provided [{n}]"));
            }
            (Versioning::ExternalGte(n), Some(cur)) if cur > n => {
                return error_item(index, id, 409, "version_conflict_engine_exception", &format!("[{id}]: version conflict, current version [{cur}] is higher than the one provided [{n}]"));
            }
            (Versioning::External(n) | Versioning::ExternalGte(n), _) => n,
        };
        if let Err(reason) = idx.map(id, &source) {
            return error_item(index, id, 400, "document_parsing_exception", &reason);
        }
        let seq_no = self.next_seq();
        let idx = self.indices.get_mut(index).expect("created above");
        store_doc(
            idx,
            index,
            (id, routing),
            source,
            version,
            seq_no,
            existing.is_some(),
        )
    }

    pub fn update(
        &mut self,
        index: &str,
        (id, routing): (&str, Option<&str>),
        body: &Value,
    ) -> ItemResult {
        let doc = body.get("doc");
        let upsert = body.get("upsert");
        let doc_as_upsert = body
            .get("doc_as_upsert")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if doc.is_none() && upsert.is_none() {
            return error_item(
                index,
                id,
                400,
                "action_request_validation_exception",
                "Validation Failed: 1: script or doc is missing;",
            );
        }
        let idx = self.indices.entry(index.to_string()).or_default();
        let (new_source, existing) = match idx.docs.get(&doc_key(id, routing)) {
            Some(d) => {
                let mut s = d.source.clone();
                if let Some(p) = doc {
                    deep_merge(&mut s, p);
                }
                if s == d.source {
                    return ok_item(index, id, d.version, d.seq_no, "noop", 200);
                }
                (s, Some(d.version))
            }
            None => match (upsert, doc_as_upsert, doc) {
                (Some(u), _, _) => (u.clone(), None),
                (None, true, Some(d)) => (d.clone(), None),
                _ => {
                    return error_item(
                        index,
                        id,
                        404,
                        "document_missing_exception",
                        &format!("[{id}]: document missing"),
                    );
                }
            },
        };
        if let Err(reason) = idx.map(id, &new_source) {
            return error_item(index, id, 400, "document_parsing_exception", &reason);
        }
        let version = existing.unwrap_or(0) + 1;
        let seq_no = self.next_seq();
        let idx = self.indices.get_mut(index).expect("present");
        store_doc(
            idx,
            index,
            (id, routing),
            new_source,
            version,
            seq_no,
            existing.is_some(),
        )
    }

    pub fn delete(
        &mut self,
        index: &str,
        (id, routing): (&str, Option<&str>),
        v: Versioning,
    ) -> ItemResult {
        let key = doc_key(id, routing);
        let existing = self
            .indices
            .get(index)
            .and_then(|i| i.docs.get(&key))
            .map(|d| d.version);
        match (v, existing) {
            (Versioning::External(n), Some(cur)) if cur >= n => {
                return error_item(index, id, 409, "version_conflict_engine_exception", &format!("[{id}]: version conflict, current version [{cur}] is higher or equal to the one provided [{n}]"));
            }
            (_, None) => {
                let seq_no = self.next_seq();
                return ok_item(index, id, 1, seq_no, "not_found", 404);
            }
            _ => {}
        }
        let seq_no = self.next_seq();
        let version = match v {
            Versioning::Internal => existing.unwrap_or(0) + 1,
            Versioning::External(n) | Versioning::ExternalGte(n) => n,
        };
        if let Some(i) = self.indices.get_mut(index) {
            i.docs.remove(&key);
        }
        ok_item(index, id, version, seq_no, "deleted", 200)
    }

    pub fn get(&self, index: &str, id: &str, routing: Option<&str>) -> Value {
        match self
            .indices
            .get(index)
            .and_then(|i| i.docs.get(&doc_key(id, routing)))
        {
            Some(d) => {
                let mut v = json!({"_index": index, "_id": id, "_version": d.version, "_seq_no": d.seq_no, "_primary_term": 1, "found": true, "_source": d.source});
                if let Some(r) = &d.routing {
                    v["_routing"] = json!(r);
                }
                v
            }
            None => json!({"_index": index, "_id": id, "found": false}),
        }
    }

    /// Documents of `index` in indexing order.
    pub fn hits(&self, index: &str) -> Vec<(&String, &Doc)> {
        let mut v: Vec<_> = self
            .indices
            .get(index)
            .map(|i| i.docs.values().map(|d| (&d.id, d)).collect())
            .unwrap_or_default();
        v.sort_by_key(|(_, d)| d.seq_no);
        v
    }
}

/// An `{"error": ...}` body of a whole-request failure.
pub(crate) fn request_error(status: u16, kind: &str, reason: &str) -> Value {
    let mut e = Map::new();
    e.insert("type".into(), kind.into());
    e.insert("reason".into(), reason.into());
    json!({"error": {"root_cause": [Value::Object(e.clone())], "type": kind, "reason": reason}, "status": status})
}
