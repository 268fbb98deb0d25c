//! Parsing and applying a `_bulk` body.

use super::store::{error_item, request_error, Store, Versioning};
use serde_json::{json, Value};

/// A parsed bulk item.
pub(crate) struct Item {
    pub op: String,
    pub index: String,
    pub id: Option<String>,
    pub versioning: Result<Versioning, String>,
    pub body: Option<Value>,
    pub routing: Option<String>,
    pub pipeline: Option<String>,
    pub require_alias: bool,
}

/// Parses a bulk body. A malformed body is a whole-request 400, as in Elasticsearch.
pub(crate) fn parse(body: &[u8], path_index: Option<&str>) -> Result<Vec<Item>, Value> {
    if body.is_empty() {
        return Err(request_error(
            400,
            "action_request_validation_exception",
            "Validation Failed: 1: no requests added;",
        ));
    }
    if !body.ends_with(b"\n") {
        return Err(request_error(
            400,
            "illegal_argument_exception",
            "The bulk request must be terminated by a newline [\\n]",
        ));
    }
    let text = std::str::from_utf8(body)
        .map_err(|e| request_error(400, "parse_exception", &e.to_string()))?;
    let mut lines = text.split('\n').filter(|l| !l.trim().is_empty());
    let mut items = Vec::new();
    while let Some(line) = lines.next() {
        let action: Value = serde_json::from_str(line).map_err(|e| {
            request_error(
                400,
                "x_content_parse_exception",
                &format!("malformed action line: {e}"),
            )
        })?;
        let Some((op, meta)) = action.as_object().and_then(|o| o.iter().next()) else {
            return Err(request_error(
                400,
                "illegal_argument_exception",
                "Malformed action/metadata line",
            ));
        };
        if !matches!(op.as_str(), "index" | "create" | "update" | "delete") {
            return Err(request_error(400, "illegal_argument_exception", &format!("Malformed action/metadata line, expected one of [create, delete, index, update] but found [{op}]")));
        }
        let index = meta
            .get("_index")
            .and_then(Value::as_str)
            .or(path_index)
            .ok_or_else(|| {
                request_error(
                    400,
                    "action_request_validation_exception",
                    "Validation Failed: 1: index is missing;",
                )
            })?
            .to_string();
        let id = meta.get("_id").and_then(|v| {
            v.as_str()
                .map(String::from)
                .or_else(|| v.as_i64().map(|n| n.to_string()))
        });
        let version = meta.get("version").and_then(Value::as_i64);
        let versioning = match (meta.get("version_type").and_then(Value::as_str), version) {
            (None | Some("internal"), None) => Ok(Versioning::Internal),
            (Some("external"), Some(v)) => Ok(Versioning::External(v)),
            (Some("external_gte"), Some(v)) => Ok(Versioning::ExternalGte(v)),
            (t, v) => Err(format!(
                "unsupported versioning: version_type {t:?} with version {v:?}"
            )),
        };
        let body = if op == "delete" {
            None
        } else {
            let line = lines.next().ok_or_else(|| {
                request_error(
                    400,
                    "illegal_argument_exception",
                    "The bulk request must be terminated by a newline [\\n]",
                )
            })?;
            Some(serde_json::from_str(line).map_err(|e| {
                request_error(
                    400,
                    "x_content_parse_exception",
                    &format!("malformed source line: {e}"),
                )
            })?)
        };
        let text = |k: &str| meta.get(k).and_then(Value::as_str).map(String::from);
        items.push(Item {
            op: op.clone(),
            index,
            id,
            versioning,
            body,
            routing: text("routing"),
            pipeline: text("pipeline"),
            require_alias: meta.get("require_alias").and_then(Value::as_bool) == Some(true),
        });
    }
    Ok(items)
}

/// Applies one item, returning its result wrapped in its operation name.
pub(crate) fn apply(store: &mut Store, item: Item) -> Value {
    let op = item.op.clone();
    match resolve(store, item) {
        Ok(item) => write(store, item),
        Err(e) => json!({ op: e }),
    }
}

/// The item as it is written: its index resolved (alias, template, data stream) and
/// its document through its ingest pipeline.
fn resolve(store: &mut Store, mut item: Item) -> Result<Item, Value> {
    let id = item.id.clone().unwrap_or_default();
    if valid_index_name(&item.index).is_err() {
        return Ok(item);
    }
    // A delete makes no index (or data stream) that is not there; the other
    // operations do (an update through its upsert).
    let creates = item.op != "delete";
    item.index = store.write_target(&item.index, &id, item.require_alias, creates)?;
    if let (Some(p), Some(body), "index" | "create") =
        (&item.pipeline, &mut item.body, item.op.as_str())
    {
        store.run_pipeline(p, &item.index, &id, body)?;
    }
    store.check_data_stream(&item.index, &id, &item.op, item.body.as_ref())?;
    Ok(item)
}

fn write(store: &mut Store, item: Item) -> Value {
    let id = match (&item.id, item.op.as_str()) {
        (Some(id), _) => id.clone(),
        (None, "index" | "create") => store.new_id(),
        (None, _) => {
            return json!({ item.op.clone(): error_item(&item.index, "", 400, "action_request_validation_exception", "Validation Failed: 1: id is missing;") });
        }
    };
    if let Err(reason) = valid_index_name(&item.index) {
        return json!({ item.op.clone(): error_item(&item.index, &id, 400, "invalid_index_name_exception", &reason) });
    }
    let result = match (&item.versioning, item.op.as_str()) {
        (Err(e), _) => error_item(
            &item.index,
            &id,
            400,
            "action_request_validation_exception",
            e,
        ),
        (Ok(v), "update") if *v != Versioning::Internal => error_item(
            &item.index,
            &id,
            400,
            "action_request_validation_exception",
            "Validation Failed: 1: can't provide version in update requests;",
        ),
        (Ok(v), "index") => store.index(
            &item.index,
            (&id, item.routing.as_deref()),
            item.body.unwrap_or(Value::Null),
            *v,
            false,
        ),
        (Ok(v), "create") => store.index(
            &item.index,
            (&id, item.routing.as_deref()),
            item.body.unwrap_or(Value::Null),
            *v,
            true,
        ),
        (Ok(_), "update") => store.update(
            &item.index,
            (&id, item.routing.as_deref()),
            item.body.as_ref().unwrap_or(&Value::Null),
        ),
        (Ok(v), _) => store.delete(&item.index, (&id, item.routing.as_deref()), *v),
    };
    json!({ item.op: result })
}

/// The item result of a rejected (not applied) item.
pub(crate) fn rejected(item: &Item) -> Value {
    json!({ item.op.clone(): error_item(
        &item.index,
        item.id.as_deref().unwrap_or(""),
        429,
        "es_rejected_execution_exception",
        "rejected execution of coordinating operation [coordinating_and_primary_bytes=0, replica_bytes=0, all_bytes=0, coordinating_operation_bytes=0, max_coordinating_and_primary_bytes=0]",
    )})
}

/// Elasticsearch's index name rules (lowercase, no special characters, no leading
/// `-`, `_` or `+`).
pub(crate) fn valid_index_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name == "." || name == ".." {
        return Err(format!(
            "Invalid index name [{name}], must not be empty, '.' or '..'"
        ));
    }
    if name.chars().any(|c| c.is_uppercase()) {
        return Err(format!("Invalid index name [{name}], must be lowercase"));
    }
    if name.starts_with(['-', '_', '+']) {
        return Err(format!(
            "Invalid index name [{name}], must not start with '_', '-', or '+'"
        ));
    }
    if let Some(c) = name.chars().find(|c| "\\/*?\"<>| ,#:".contains(*c)) {
        return Err(format!(
            "Invalid index name [{name}], must not contain '{c}'"
        ));
    }
    Ok(())
}
