//! A Kafka Connect connector configuration as users have it: the REST API's
//! `{"name": ..., "config": {...}}` (`GET /connectors/{name}`), a bare `config` object,
//! or a `.properties` file.

use std::collections::BTreeMap;

/// A connector's name and settings (every value as text, as Kafka Connect reads them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectorConfig {
    pub name: Option<String>,
    pub config: BTreeMap<String, String>,
}

/// Parses `text`: JSON when it starts with `{`, else Java properties.
pub fn parse(text: &str) -> Result<ConnectorConfig, String> {
    if text.trim_start().starts_with('{') {
        parse_json(text)
    } else {
        Ok(parse_properties(text))
    }
}

fn parse_json(text: &str) -> Result<ConnectorConfig, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let obj = v.as_object().ok_or("not a JSON object")?;
    let (name, config) = match obj.get("config") {
        Some(serde_json::Value::Object(c)) => (
            obj.get("name").and_then(|n| n.as_str()).map(String::from),
            c,
        ),
        Some(_) => return Err("`config` is not an object".into()),
        None => (None, obj),
    };
    let mut out = BTreeMap::new();
    for (k, v) in config {
        let text = match v {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Null => continue,
            other => other.to_string(),
        };
        out.insert(k.clone(), text);
    }
    let name = name.or_else(|| out.get("name").cloned());
    Ok(ConnectorConfig { name, config: out })
}

/// Java's `.properties` format: `key=value`, `key: value` or `key value`; `#` and `!`
/// comments; a line ending in an odd number of `\` continues on the next.
fn parse_properties(text: &str) -> ConnectorConfig {
    let mut config = BTreeMap::new();
    let mut logical = String::new();
    for raw in text.lines() {
        let line = raw.trim_start();
        if logical.is_empty() && (line.is_empty() || line.starts_with('#') || line.starts_with('!'))
        {
            continue;
        }
        let trailing = line.chars().rev().take_while(|c| *c == '\\').count();
        if trailing % 2 == 1 {
            logical.push_str(&line[..line.len() - 1]);
            continue;
        }
        logical.push_str(line);
        let entry = std::mem::take(&mut logical);
        // The first separator that is not escaped (`key\=x=v` is the key `key=x`).
        let mut escaped = false;
        let split = entry.char_indices().find(|(_, c)| {
            let sep = !escaped && (matches!(c, '=' | ':') || c.is_whitespace());
            escaped = !escaped && *c == '\\';
            sep
        });
        let (key, value) = match split {
            Some((i, _)) => {
                let rest = entry[i..].trim_start();
                let rest = rest.strip_prefix(['=', ':']).map_or(rest, str::trim_start);
                (entry[..i].to_string(), rest.to_string())
            }
            None => (entry.clone(), String::new()),
        };
        config.insert(unescape(&key), unescape(value.trim_end()));
    }
    let name = config.get("name").cloned();
    ConnectorConfig { name, config }
}

/// Java properties' escapes (`\t`, `\n`, `\\`, `\=`, `\:`, `\uXXXX`).
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                match u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32) {
                    Some(u) => out.push(u),
                    None => out.push_str(&hex),
                }
            }
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rest_api_form_a_bare_object_and_properties_read_alike() {
        let rest = r#"{"name": "es-sink", "config": {"connector.class": "io.confluent.connect.elasticsearch.ElasticsearchSinkConnector", "tasks.max": 2, "topics": "orders"}}"#;
        let bare = r#"{"name": "es-sink", "connector.class": "io.confluent.connect.elasticsearch.ElasticsearchSinkConnector", "tasks.max": "2", "topics": "orders"}"#;
        let props = "# a sink\nname=es-sink\nconnector.class = io.confluent.connect.elasticsearch.ElasticsearchSinkConnector\ntasks.max: 2\ntopics orders\n";
        let a = parse(rest).unwrap();
        let b = parse(bare).unwrap();
        let c = parse(props).unwrap();
        assert_eq!(a.name.as_deref(), Some("es-sink"));
        assert_eq!(a.config["tasks.max"], "2");
        assert_eq!(a.config["topics"], "orders");
        assert_eq!(b.name, a.name);
        assert_eq!(c.name, a.name);
        assert_eq!(c.config["tasks.max"], "2");
        assert_eq!(c.config["topics"], "orders");
        assert_eq!(
            c.config["connector.class"],
            "io.confluent.connect.elasticsearch.ElasticsearchSinkConnector"
        );
    }

    #[test]
    fn properties_continue_lines_and_unescape() {
        let c = parse("topics=a,\\\n    b\nkey\\=x=v\\u0041\n! comment\nempty=\n").unwrap();
        assert_eq!(c.config["topics"], "a,b");
        assert_eq!(c.config["key=x"], "vA");
        assert_eq!(c.config["empty"], "");
        assert!(parse("{\"config\": 3}").is_err());
        assert!(parse("{nope").is_err());
    }
}
