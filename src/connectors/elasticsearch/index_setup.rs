//! The index template of `index_template_file`, put when the sink opens so that a
//! fresh cluster has the user's mappings (or data stream) before the first document.
//!
//! Putting it is idempotent, but not free of effects (a put template replaces one an
//! operator changed by hand, and every put is a cluster-state update): the template is
//! put with the checksum of the file in its `_meta`, and not put again while the
//! cluster holds a template of that name with that checksum. A changed file is put
//! once, at the next start.

use super::config::IndexTemplateFile;
use crate::clients::http::{auth_refusal, auth_refusal_message, refusal_body};
use crate::clients::sigv4::SignedNode;
use crate::secret::redact_url;
use elasticsearch::http::headers::HeaderMap;
use elasticsearch::http::Method;
use elasticsearch::Elasticsearch;
use serde_json::Value;

/// The `_meta` key holding the checksum of the template lockgate put.
pub const CHECKSUM_KEY: &str = "lockgate_template_checksum";

/// The checksum of a template's content (CRC-32 of its JSON with sorted keys, so that
/// a file only reformatted keeps its checksum).
pub fn checksum(body: &Value) -> String {
    let mut hasher = crc32fast::Hasher::new();
    canonical(body, &mut hasher);
    format!("{:08x}", hasher.finalize())
}

/// Feeds `v` to `h` with every object's keys in sorted order, whatever order the map
/// keeps them in.
fn canonical(v: &Value, h: &mut crc32fast::Hasher) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            h.update(b"{");
            for k in keys {
                h.update(serde_json::to_string(k).expect("JSON").as_bytes());
                h.update(b":");
                canonical(&m[k], h);
                h.update(b",");
            }
            h.update(b"}");
        }
        Value::Array(a) => {
            h.update(b"[");
            for x in a {
                canonical(x, h);
                h.update(b",");
            }
            h.update(b"]");
        }
        other => h.update(other.to_string().as_bytes()),
    }
}

/// The template as it is put: the file's, with the checksum in its `_meta`.
pub fn with_checksum(body: &Value) -> Value {
    let sum = checksum(body);
    let mut out = body.clone();
    let meta = out
        .as_object_mut()
        .expect("a checked template is an object")
        .entry("_meta")
        .or_insert_with(|| Value::Object(Default::default()));
    if let Some(m) = meta.as_object_mut() {
        m.insert(CHECKSUM_KEY.into(), Value::String(sum));
    }
    out
}

/// Whether `GET _index_template/<name>`'s answer holds the template `name` with
/// checksum `sum`.
pub fn is_current(response: &Value, name: &str, sum: &str) -> bool {
    response
        .get("index_templates")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|t| t.get("name").and_then(Value::as_str) == Some(name))
        .any(|t| {
            t.pointer(&format!("/index_template/_meta/{CHECKSUM_KEY}"))
                .and_then(Value::as_str)
                == Some(sum)
        })
}

/// What opening did about the template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The cluster already had it.
    Current,
    /// It was put.
    Put,
}

/// Puts `template` unless the cluster already has it, through the first node of `conn`
/// that answers (a node that cannot be reached is passed over, as the bulk requests
/// pass it over).
pub async fn ensure_on(
    conn: &super::EsConnection,
    timeout: std::time::Duration,
    template: &IndexTemplateFile,
) -> Result<Applied, String> {
    let mut last = String::new();
    let signing = conn.signing()?;
    for (i, node) in conn.nodes.iter().enumerate() {
        let client = Elasticsearch::new(conn.transport(i, timeout)?);
        let signed = signing.as_ref().map(|s| &s[i]);
        match ensure(&client, signed, node, template).await {
            Ok(a) => return Ok(a),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Puts `template` through `client` (node `node`, for messages) unless the cluster
/// already has it.
pub async fn ensure(
    client: &Elasticsearch,
    signing: Option<&SignedNode>,
    node: &str,
    template: &IndexTemplateFile,
) -> Result<Applied, String> {
    let path = format!("/_index_template/{}", template.name);
    let sum = checksum(&template.body);
    let (status, body) = send(client, signing, node, Method::Get, &path, None).await?;
    match status {
        200 => {
            let v: Value = serde_json::from_slice(&body).unwrap_or_default();
            if is_current(&v, &template.name, &sum) {
                return Ok(Applied::Current);
            }
        }
        404 => {}
        s => return Err(refused("reading", template, node, s, &body)),
    }
    let put = serde_json::to_vec(&with_checksum(&template.body)).expect("JSON");
    let (status, body) = send(client, signing, node, Method::Put, &path, Some(put)).await?;
    if (200..300).contains(&status) {
        Ok(Applied::Put)
    } else {
        Err(refused("putting", template, node, status, &body))
    }
}

async fn send(
    client: &Elasticsearch,
    signing: Option<&SignedNode>,
    node: &str,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
) -> Result<(u16, Vec<u8>), String> {
    let (path, headers, body) = match signing {
        None => (path.to_string(), HeaderMap::new(), body),
        Some(s) => {
            let verb = match method {
                Method::Get => "GET",
                Method::Put => "PUT",
                Method::Post => "POST",
                Method::Delete => "DELETE",
                Method::Head => "HEAD",
            };
            let signed = s.sign(verb, path, &[], body.as_deref()).await?;
            (signed.path, signed.headers, signed.body)
        }
    };
    let path = path.as_str();
    let response = client
        .transport()
        .send(
            method,
            path,
            headers,
            None::<&()>,
            body.map(bytes::Bytes::from),
            None,
        )
        .await
        .map_err(|e| format!("index template: {path} at {}: {e}", redact_url(node)))?;
    let status = response.status_code().as_u16();
    let body = response
        .bytes()
        .await
        .map_err(|e| format!("index template: reading the answer to {path}: {e}"))?;
    Ok((status, body.to_vec()))
}

fn refused(what: &str, t: &IndexTemplateFile, node: &str, status: u16, body: &[u8]) -> String {
    if auth_refusal(Some(status)).is_some() {
        return auth_refusal_message(
            &format!("refused {what} index template {}", t.name),
            node,
            status,
            refusal_body(body).as_bytes(),
        );
    }
    let kept = refusal_body(body);
    let v: Value = serde_json::from_slice(kept.as_bytes()).unwrap_or_default();
    let reason = v
        .pointer("/error/reason")
        .or_else(|| v.pointer("/message"))
        .and_then(Value::as_str)
        .map_or(kept.clone(), String::from);
    format!(
        "{what} index template {} (index_template_file) at {}: {status} {reason}",
        t.name,
        redact_url(node)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_template_is_current_when_the_cluster_holds_its_checksum() {
        let file = json!({"index_patterns": ["orders-*"], "template": {"mappings": {}}});
        let sum = checksum(&file);
        let put = with_checksum(&file);
        assert_eq!(put["_meta"][CHECKSUM_KEY], json!(sum));
        assert_eq!(put["index_patterns"], file["index_patterns"]);
        let answer = |name: &str, t: &Value| json!({"index_templates": [{"name": name, "index_template": t}]});
        assert!(is_current(&answer("orders", &put), "orders", &sum));
        assert!(!is_current(&answer("other", &put), "orders", &sum));
        assert!(!is_current(&answer("orders", &file), "orders", &sum));
        let changed = json!({"index_patterns": ["orders-*"], "priority": 5});
        assert!(!is_current(
            &answer("orders", &put),
            "orders",
            &checksum(&changed)
        ));
        assert!(!is_current(&json!({}), "orders", &sum));
        // The user's own _meta is kept beside the checksum.
        let with_meta = json!({"index_patterns": ["o"], "_meta": {"owner": "team"}});
        assert_eq!(with_checksum(&with_meta)["_meta"]["owner"], json!("team"));
        // Reformatting the file (key order, spacing) keeps its checksum.
        let reordered: Value = serde_json::from_str(
            r#"{ "template": {"mappings": {}}, "index_patterns": ["orders-*"] }"#,
        )
        .unwrap();
        assert_eq!(checksum(&reordered), sum);
    }
}
