//! What a write meets before its document is stored: aliases (and `require_alias`),
//! composable index templates (mappings and data streams of an index created by its
//! first write), data streams (create only, `@timestamp` required) and ingest
//! pipelines (`set` and `fail` processors) — each answering as Elasticsearch does.

use super::store::{error_item, ItemResult, Store};
use serde_json::{json, Value};

/// The templates a fresh Elasticsearch 8 cluster has: `logs-*-*`, `metrics-*-*`,
/// `traces-*-*` and `synthetics-*-*` make data streams.
pub(crate) fn builtin_templates() -> Vec<(String, Value)> {
    ["logs", "metrics", "traces", "synthetics"]
        .into_iter()
        .map(|t| {
            (
                t.to_string(),
                json!({"index_patterns": [format!("{t}-*-*")], "data_stream": {}, "priority": 100,
                       "_meta": {"managed": true, "description": format!("default {t} template")}}),
            )
        })
        .collect()
}

/// Whether `name` matches an index pattern (`*` matches any run of characters).
pub(crate) fn matches(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            let Some(rest) = name.strip_prefix(head) else {
                return false;
            };
            (0..=rest.len())
                .filter(|&i| rest.is_char_boundary(i))
                .any(|i| matches(tail, &rest[i..]))
        }
    }
}

impl Store {
    /// The template an index named `name` is created from: the matching one of the
    /// highest priority.
    fn template_for(&self, name: &str) -> Option<&Value> {
        self.templates
            .iter()
            .filter(|(_, t)| {
                let patterns = match t.get("index_patterns") {
                    Some(Value::String(p)) => vec![p.as_str()],
                    Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
                    _ => vec![],
                };
                patterns.iter().any(|p| matches(p, name))
            })
            .max_by_key(|(_, t)| t.get("priority").and_then(Value::as_i64).unwrap_or(0))
            .map(|(_, t)| t)
    }

    /// The index a write to `target` goes to: an alias's write index, an existing
    /// index, or one its first write creates when it `creates` (an index or create) (from the matching template: a data
    /// stream, or an index with the template's mappings). The error is the item's.
    pub(crate) fn write_target(
        &mut self,
        target: &str,
        id: &str,
        require_alias: bool,
        creates: bool,
    ) -> Result<String, ItemResult> {
        if let Some(index) = self.aliases.get(target) {
            return Ok(index.clone());
        }
        if require_alias {
            return Err(error_item(
                target,
                id,
                404,
                "index_not_found_exception",
                &format!("no such index [{target}] and [require_alias] request flag is [true] and [{target}] is not an alias"),
            ));
        }
        if creates && !self.indices.contains_key(target) {
            let body = match self.template_for(target) {
                Some(t) => {
                    let mut body = t.get("template").cloned().unwrap_or(json!({}));
                    body["data_stream"] = json!(t.get("data_stream").is_some());
                    body
                }
                None => json!({}),
            };
            let data_stream = body["data_stream"] == json!(true);
            self.create_index(target, &body).map_err(|e| json!({"_index": target, "_id": id, "status": 400, "error": e["error"].clone()}))?;
            self.indices.get_mut(target).expect("created").data_stream = data_stream;
        }
        Ok(target.to_string())
    }

    /// Checks a write of `op` into `index` if it is a data stream.
    pub(crate) fn check_data_stream(
        &self,
        index: &str,
        id: &str,
        op: &str,
        body: Option<&Value>,
    ) -> Result<(), ItemResult> {
        if !self.indices.get(index).is_some_and(|i| i.data_stream) {
            return Ok(());
        }
        if op != "create" {
            return Err(error_item(
                index,
                id,
                400,
                "illegal_argument_exception",
                &format!("only write ops with an op_type of create are allowed in data streams (index [{index}], op [{op}])"),
            ));
        }
        if body.and_then(|b| b.get("@timestamp")).is_none() {
            return Err(error_item(
                index,
                id,
                400,
                "document_parsing_exception",
                "[1:1] failed to parse: data stream timestamp field [@timestamp] is missing",
            ));
        }
        Ok(())
    }

    /// Runs ingest pipeline `name` over `doc`.
    pub(crate) fn run_pipeline(
        &self,
        name: &str,
        index: &str,
        id: &str,
        doc: &mut Value,
    ) -> Result<(), ItemResult> {
        let Some(pipeline) = self.pipelines.get(name) else {
            return Err(error_item(
                index,
                id,
                400,
                "illegal_argument_exception",
                &format!("pipeline with id [{name}] does not exist"),
            ));
        };
        let processors = pipeline
            .get("processors")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for p in processors {
            if let Some(set) = p.get("set") {
                let field = set.get("field").and_then(Value::as_str).unwrap_or("");
                let value = match set.get("value") {
                    Some(Value::String(s)) => Value::String(fill(s, doc)),
                    Some(v) => v.clone(),
                    None => Value::Null,
                };
                if let Some(o) = doc.as_object_mut() {
                    o.insert(field.to_string(), value);
                }
            } else if let Some(fail) = p.get("fail") {
                let message = fail.get("message").and_then(Value::as_str).unwrap_or("");
                return Err(error_item(
                    index,
                    id,
                    500,
                    "fail_processor_exception",
                    &fill(message, doc),
                ));
            }
        }
        Ok(())
    }
}

/// `text` with each `{{field}}` replaced by the top-level field's value (Mustache, as
/// the ingest processors take it; `{{_ingest.pipeline}}` and the like are left).
fn fill(text: &str, doc: &Value) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find("}}") else {
            rest = &rest[start..];
            break;
        };
        let name = rest[start + 2..start + end].trim();
        match doc.get(name) {
            Some(Value::String(s)) => out.push_str(s),
            Some(v) => out.push_str(&v.to_string()),
            None => {}
        }
        rest = &rest[start + end + 2..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_as_index_patterns_do() {
        assert!(matches("logs-*-*", "logs-orders-prod"));
        assert!(!matches("logs-*-*", "logs-orders"));
        assert!(matches("orders*", "orders"));
        assert!(matches("orders", "orders"));
        assert!(!matches("orders", "orders2"));
        assert!(matches("*", "x"));
    }

    #[test]
    fn processors_set_and_fail() {
        let mut store = Store::default();
        store.pipelines.insert(
            "p".into(),
            json!({"processors": [{"set": {"field": "via", "value": "p-{{user}}"}}, {"set": {"field": "n", "value": 2}}]}),
        );
        store.pipelines.insert(
            "f".into(),
            json!({"processors": [{"fail": {"message": "no {{user}}"}}]}),
        );
        let mut doc = json!({"user": "u7"});
        store.run_pipeline("p", "i", "1", &mut doc).unwrap();
        assert_eq!(doc, json!({"user": "u7", "via": "p-u7", "n": 2}));
        let e = store.run_pipeline("f", "i", "1", &mut doc).unwrap_err();
        assert_eq!(
            (e["status"].clone(), e["error"]["reason"].clone()),
            (json!(500), json!("no u7"))
        );
        let e = store.run_pipeline("nope", "i", "1", &mut doc).unwrap_err();
        assert_eq!(e["status"], json!(400));
    }
}
