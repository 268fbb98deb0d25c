//! Elasticsearch's `filter_path` response filter, as far as clients use it: a comma-
//! separated list of dotted paths whose segments are names or `*` (any one name);
//! a successful response keeps exactly the fields some path reaches, with the objects
//! and arrays on the way (an array is filtered element by element). Error responses are
//! not filtered (Elasticsearch builds them without the filter). Exclusions (`-path`),
//! `**` and partial-name patterns (`st*`) are not supported: a path with the first two
//! is ignored, the third is matched as a name.

use serde_json::{Map, Value};

/// `value` filtered by `filter` (the query parameter's value): `{}` when no path
/// matches, as Elasticsearch answers; `value` itself when the filter holds no path this
/// filter supports (empty, or only exclusions and `**`), rather than a guess.
pub fn apply(value: &Value, filter: &str) -> Value {
    let paths: Vec<Vec<&str>> = filter
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty() && !p.starts_with('-') && !p.contains("**"))
        .map(|p| p.split('.').collect())
        .collect();
    if paths.is_empty() {
        return value.clone();
    }
    let refs: Vec<&[&str]> = paths.iter().map(Vec::as_slice).collect();
    keep(value, &refs).unwrap_or_else(|| Value::Object(Map::new()))
}

/// What of `value` the `paths` (each relative to it) reach.
fn keep(value: &Value, paths: &[&[&str]]) -> Option<Value> {
    if paths.iter().any(|p| p.is_empty()) {
        return Some(value.clone());
    }
    match value {
        Value::Object(fields) => {
            let mut out = Map::new();
            for (name, v) in fields {
                let rest: Vec<&[&str]> = paths
                    .iter()
                    .filter(|p| p[0] == "*" || p[0] == name)
                    .map(|p| &p[1..])
                    .collect();
                if rest.is_empty() {
                    continue;
                }
                if let Some(kept) = keep(v, &rest) {
                    out.insert(name.clone(), kept);
                }
            }
            (!out.is_empty()).then_some(Value::Object(out))
        }
        Value::Array(items) => {
            let kept: Vec<Value> = items.iter().filter_map(|v| keep(v, paths)).collect();
            (!kept.is_empty()).then_some(Value::Array(kept))
        }
        // A path goes on below a value that has no fields: nothing is reached.
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::apply;
    use serde_json::json;

    #[test]
    fn keeps_what_the_paths_reach_through_objects_arrays_and_wildcards() {
        let response = json!({
            "took": 3,
            "errors": true,
            "items": [
                {"index": {"_index": "i", "_id": "1", "status": 201, "_shards": {"total": 1}}},
                {"create": {"_index": "i", "status": 429, "error": {"type": "t", "reason": "r"}}},
                {"delete": {"_id": "2", "result": "not_found"}}
            ]
        });
        let f = "errors,items.*.status,items.*.error";
        assert_eq!(
            apply(&response, f),
            json!({"errors": true, "items": [
                {"index": {"status": 201}},
                {"create": {"status": 429, "error": {"type": "t", "reason": "r"}}}
            ]})
        );
        assert_eq!(apply(&response, "took"), json!({"took": 3}));
        assert_eq!(apply(&response, "nothing,took.x"), json!({}));
        assert_eq!(
            apply(&response, "items.*.error.type"),
            json!({"items": [{"create": {"error": {"type": "t"}}}]})
        );
        // Unsupported forms are ignored rather than misread.
        assert_eq!(
            apply(&response, "-took,**.status,errors"),
            json!({"errors": true})
        );
    }
}
