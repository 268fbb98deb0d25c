//! A connector's `transforms` chain to `[[transform]]` sections, and what the routers
//! (`RegexRouter`, `TimestampRouter`) make of the index name.

use super::job_file::{JobFile, Section};
use super::settings::Settings;
use super::translate::IndexRouting;
use std::collections::BTreeMap;

/// The class's name without its package (`Cast$Value`, `ExtractNewRecordState`).
fn short(class: &str) -> &str {
    class.rsplit('.').next().unwrap_or(class)
}

/// Translates the chain; returns the index routing its routers make.
pub fn transforms(s: &mut Settings<'_>, f: &mut JobFile, notes: &mut Vec<String>) -> IndexRouting {
    let mut routing = IndexRouting::default();
    let Some(list) = s.get("transforms") else {
        s.leave(
            "predicates",
            "no Filter names these predicates (there are no transforms)",
        );
        return routing;
    };
    let names: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect();
    let topics: Vec<String> = s
        .peek("topics")
        .map(|t| {
            t.split(',')
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let mut i = 0;
    while i < names.len() {
        let name = names[i];
        let prefix = format!("transforms.{name}.");
        let type_key = format!("{prefix}type");
        let Some(class) = s.get(&type_key) else {
            s.left_out.push((
                format!("transforms.{name}"),
                "the transform has no type".into(),
            ));
            i += 1;
            continue;
        };
        let opts: BTreeMap<String, String> = s
            .family(&prefix)
            .into_iter()
            .map(|(k, v)| (k[prefix.len()..].to_string(), v.to_string()))
            .filter(|(k, _)| k != "type")
            .collect();
        let opt = |k: &str| opts.get(k).map(String::as_str);
        let from = |k: &str| format!("{prefix}{k}");
        let leave = |why: String, s: &mut Settings<'_>| {
            s.left_out.push((
                type_key.clone(),
                format!("transform {name} ({class}): {why}"),
            ));
        };
        // A condition on a transform other than Filter has no equivalent.
        if opt("predicate").is_some() && short(class) != "Filter" {
            leave(
                "lockgate's transforms take no predicate (only filter is conditional)".into(),
                s,
            );
            i += 1;
            continue;
        }
        match short(class) {
            "InsertField$Value" => {
                let t = f.array_section("transform");
                t.set("type", "insert_field", &[type_key.as_str()]);
                if let (Some(field), Some(value)) = (opt("static.field"), opt("static.value")) {
                    let mut m = toml::map::Map::new();
                    m.insert(plain(field), toml::Value::String(value.into()));
                    t.set(
                        "static",
                        toml::Value::Table(m),
                        &[&from("static.field"), &from("static.value")],
                    );
                }
                for (c, l) in [
                    ("topic.field", "topic_field"),
                    ("partition.field", "partition_field"),
                    ("offset.field", "offset_field"),
                    ("timestamp.field", "timestamp_field"),
                ] {
                    if let Some(v) = opt(c) {
                        t.set(l, plain(v), &[&from(c)]);
                    }
                }
            }
            "ReplaceField$Value" => {
                let t = f.array_section("transform");
                t.set("type", "replace_field", &[type_key.as_str()]);
                for (c, l) in [
                    ("include", "include"),
                    ("whitelist", "include"),
                    ("exclude", "exclude"),
                    ("blacklist", "exclude"),
                ] {
                    if let Some(v) = opt(c) {
                        t.set(l, list_value(v), &[&from(c)]);
                    }
                }
                if let Some(r) = opt("renames") {
                    let mut m = toml::map::Map::new();
                    for pair in r.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                        if let Some((a, b)) = pair.split_once(':') {
                            m.insert(a.trim().into(), toml::Value::String(b.trim().into()));
                        }
                    }
                    t.set("rename", toml::Value::Table(m), &[&from("renames")]);
                }
            }
            "ExtractField$Value" => {
                let t = f.array_section("transform");
                t.set("type", "extract_field", &[type_key.as_str()]);
                if let Some(v) = opt("field") {
                    t.set("field", v, &[&from("field")]);
                }
            }
            "ValueToKey" => {
                let fields: Vec<String> = opt("fields")
                    .unwrap_or_default()
                    .split(',')
                    .map(|f| f.trim().to_string())
                    .filter(|f| !f.is_empty())
                    .collect();
                // With ExtractField$Key next, the key is one field's value.
                let next = names.get(i + 1).copied();
                let extract = next.and_then(|n| {
                    let class = s.peek(&format!("transforms.{n}.type"))?;
                    (short(class) == "ExtractField$Key").then_some(n)
                });
                let t = f.array_section("transform");
                t.set("type", "set_key", &[type_key.as_str()]);
                match extract {
                    Some(n) => {
                        let field_key = format!("transforms.{n}.field");
                        s.get(&format!("transforms.{n}.type"));
                        let field = s.get(&field_key).unwrap_or_default().trim().to_string();
                        t.set(
                            "field",
                            format!("/{field}"),
                            &[&from("fields"), field_key.as_str()],
                        );
                        i += 1;
                    }
                    None => {
                        let list = fields
                            .iter()
                            .map(|f| toml::Value::String(format!("/{f}")))
                            .collect();
                        t.set("fields", toml::Value::Array(list), &[&from("fields")]);
                    }
                }
            }
            "Cast$Value" => {
                let spec = opt("spec").unwrap_or_default();
                if !spec.contains(':') {
                    leave(
                        "a cast of the whole value has no equivalent (cast takes fields)".into(),
                        s,
                    );
                } else {
                    let mut m = toml::map::Map::new();
                    for pair in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                        if let Some((field, ty)) = pair.split_once(':') {
                            m.insert(
                                field.trim().into(),
                                toml::Value::String(ty.trim().to_ascii_lowercase()),
                            );
                        }
                    }
                    let t = f.array_section("transform");
                    t.set("type", "cast", &[type_key.as_str()]);
                    t.set("spec", toml::Value::Table(m), &[&from("spec")]);
                }
            }
            "TimestampConverter$Value" => match timestamp_converter(&opts) {
                Ok(pairs) => {
                    let t = f.array_section("transform");
                    t.set("type", "timestamp_converter", &[type_key.as_str()]);
                    for (k, v, c) in pairs {
                        t.set(k, v, &[&from(c)]);
                    }
                }
                Err(why) => leave(why, s),
            },
            "Flatten$Value" => {
                let t = f.array_section("transform");
                t.set("type", "flatten", &[type_key.as_str()]);
                if let Some(d) = opt("delimiter") {
                    t.set("delimiter", d, &[&from("delimiter")]);
                }
            }
            "MaskField$Value" => {
                let t = f.array_section("transform");
                t.set("type", "mask_field", &[type_key.as_str()]);
                if let Some(v) = opt("fields") {
                    t.set("fields", list_value(v), &[&from("fields")]);
                }
                if let Some(v) = opt("replacement") {
                    t.set("replacement", v, &[&from("replacement")]);
                }
            }
            "Filter" => match filter(s, &opts, &prefix) {
                Ok(section) => {
                    let t = f.array_section("transform");
                    t.set("type", "filter", &[type_key.as_str()]);
                    for e in section.entries {
                        t.entries.push(e);
                    }
                }
                Err(why) => leave(why, s),
            },
            "ExtractNewRecordState" => {
                let t = f.array_section("transform");
                t.set("type", "debezium", &[type_key.as_str()]);
                let mode = opt("delete.tombstone.handling.mode").or(opt("delete.handling.mode"));
                let (handling, keep_tombstones) = match mode.map(str::trim) {
                    Some("rewrite") => ("rewrite", false),
                    Some("rewrite-with-tombstone") => ("rewrite", true),
                    Some("none") | Some("tombstone") => ("delete", false),
                    _ => ("drop", false),
                };
                let mode_key = if opts.contains_key("delete.tombstone.handling.mode") {
                    "delete.tombstone.handling.mode"
                } else {
                    "delete.handling.mode"
                };
                t.set("delete_handling", handling, &[&from(mode_key)])
                    .because("Debezium's default drops deletes; `delete` deletes the document");
                let drop_tombstones =
                    !keep_tombstones && opt("drop.tombstones").is_none_or(|v| v.trim() != "false");
                t.set(
                    "drop_tombstones",
                    drop_tombstones,
                    &[&from("drop.tombstones")],
                );
                if let Some(v) = opt("add.fields") {
                    t.set("add_fields", list_value(v), &[&from("add.fields")]);
                }
                for k in opts.keys() {
                    let known = [
                        "delete.handling.mode",
                        "delete.tombstone.handling.mode",
                        "drop.tombstones",
                        "add.fields",
                    ];
                    if !known.contains(&k.as_str()) {
                        s.left_out.push((from(k), "an ExtractNewRecordState option lockgate's debezium transform does not take".to_string()));
                    }
                }
            }
            "ExtractField$Key" => {
                // The key becomes one field of the key (Debezium's `{"id": 7}` -> 7): the
                // sink reads that field, from the value or from a JSON key.
                match opt("field") {
                    Some(field) => {
                        routing.key_field = Some((
                            field.trim().to_string(),
                            vec![type_key.clone(), from("field")],
                        ));
                    }
                    None => leave("ExtractField$Key without a field".into(), s),
                }
            }
            "RegexRouter" => {
                let (Some(regex), Some(replacement)) = (opt("regex"), opt("replacement")) else {
                    leave("RegexRouter needs regex and replacement".into(), s);
                    i += 1;
                    continue;
                };
                let Ok(re) = regex::Regex::new(&format!("^(?:{regex})$")) else {
                    leave(format!("`{regex}` is not a regex lockgate reads"), s);
                    i += 1;
                    continue;
                };
                if topics.is_empty() {
                    leave("renames topics matched by topics.regex, which are not known in advance: give topic_to_index by hand".into(), s);
                } else {
                    // Java's `$1` is the regex crate's `${1}`.
                    let rust = java_replacement(replacement);
                    for t in &topics {
                        let renamed = re.replace(t, rust.as_str()).to_string();
                        if renamed != *t {
                            routing.renamed.insert(t.clone(), renamed.to_lowercase());
                        }
                    }
                    routing.renamed_from.push(type_key.clone());
                    routing.renamed_from.push(from("regex"));
                    routing.renamed_from.push(from("replacement"));
                }
            }
            "TimestampRouter" => {
                let format = opt("timestamp.format").unwrap_or("yyyyMMdd");
                let topic_format = opt("topic.format").unwrap_or("${topic}-${timestamp}");
                if supported_date(format) {
                    let index = topic_format
                        .replace("${topic}", "{topic}")
                        .replace("${timestamp}", &format!("{{{format}}}"));
                    routing.template = Some((
                        index,
                        vec![
                            type_key.clone(),
                            from("topic.format"),
                            from("timestamp.format"),
                        ],
                    ));
                } else {
                    leave(format!("timestamp.format `{format}`: lockgate's index dates take yyyy, yy, MM, dd, HH, mm, ss and . - _"), s);
                }
            }
            other => leave(format!("lockgate has no transform for {other}"), s),
        }
        i += 1;
    }
    // Predicates no Filter named.
    s.leave(
        "predicates",
        "no Filter names these predicates (lockgate's transforms take none)",
    );
    let unused: Vec<String> = s
        .all
        .keys()
        .filter(|k| k.starts_with("predicates.") && !s.used.contains(*k))
        .cloned()
        .collect();
    for k in unused {
        s.leave(&k, "a predicate no Filter names");
    }
    let _ = notes;
    routing
}

/// A field name of Connect's `InsertField` without its `!` / `?` (required / optional).
fn plain(field: &str) -> String {
    field.trim().trim_end_matches(['!', '?']).to_string()
}

fn list_value(v: &str) -> toml::Value {
    toml::Value::Array(
        v.split(',')
            .map(str::trim)
            .filter(|x| !x.is_empty())
            .map(|x| toml::Value::String(x.into()))
            .collect(),
    )
}

/// Java's replacement (`$1`, `\$`) as the regex crate's (`${1}`, `$$`).
fn java_replacement(r: &str) -> String {
    let mut out = String::new();
    let mut chars = r.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('$') => out.push_str("$$"),
                Some(other) => out.push(other),
                None => {}
            },
            '$' => {
                let mut digits = String::new();
                while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                    digits.push(*d);
                    chars.next();
                }
                out.push_str(&format!("${{{digits}}}"));
            }
            other => out.push(other),
        }
    }
    out
}

/// Whether a Java date format is one lockgate's index templates read.
fn supported_date(format: &str) -> bool {
    crate::connectors::elasticsearch::index_name::IndexTemplate::parse(&format!("x-{{{format}}}"))
        .is_ok()
}

/// A Java `SimpleDateFormat` as strftime, if its letters are the common ones.
fn strftime(java: &str) -> Option<String> {
    const TOKENS: [(&str, &str); 9] = [
        ("yyyy", "%Y"),
        ("yy", "%y"),
        ("MM", "%m"),
        ("dd", "%d"),
        ("HH", "%H"),
        ("mm", "%M"),
        ("ss", "%S"),
        ("SSS", "%3f"),
        ("XXX", "%:z"),
    ];
    let mut out = String::new();
    let mut rest = java;
    let mut quoted = false;
    'next: while let Some(c) = rest.chars().next() {
        if c == '\'' {
            quoted = !quoted;
            rest = &rest[1..];
            continue;
        }
        if !quoted {
            for (j, s) in TOKENS {
                if let Some(r) = rest.strip_prefix(j) {
                    out.push_str(s);
                    rest = r;
                    continue 'next;
                }
            }
            if c.is_ascii_alphabetic() {
                return None;
            }
        }
        if c == '%' {
            out.push_str("%%");
        } else {
            out.push(c);
        }
        rest = &rest[c.len_utf8()..];
    }
    Some(out)
}

/// `TimestampConverter$Value`'s options as lockgate's (`field`, `from`, `to`).
fn timestamp_converter(
    opts: &BTreeMap<String, String>,
) -> Result<Vec<(&'static str, String, &'static str)>, String> {
    let field = opts
        .get("field")
        .ok_or("no field (a whole-value conversion has no equivalent)")?;
    let target = opts
        .get("target.type")
        .map(|t| t.trim().to_ascii_lowercase())
        .unwrap_or_default();
    let seconds = opts
        .get("unix.precision")
        .is_some_and(|p| p.trim() == "seconds");
    let unix = if seconds { "unix_s" } else { "unix_ms" };
    let format = match opts.get("format") {
        Some(f) => Some(strftime(f).ok_or_else(|| {
            format!("format `{f}` has letters lockgate's strftime conversion does not know")
        })?),
        None => None,
    };
    let mut out = vec![("field", field.clone(), "field")];
    match target.as_str() {
        "string" => out.push((
            "to",
            format.unwrap_or_else(|| "iso8601".into()),
            "target.type",
        )),
        "unix" | "timestamp" => {
            if let Some(f) = format {
                out.push(("from", f, "format"));
            }
            out.push(("to", unix.to_string(), "target.type"));
        }
        other => {
            return Err(format!(
                "target.type `{other}`: lockgate converts to string or unix (epoch) only"
            ))
        }
    }
    Ok(out)
}

/// `Filter` with its predicate as a `filter` section's keys.
fn filter(
    s: &mut Settings<'_>,
    opts: &BTreeMap<String, String>,
    prefix: &str,
) -> Result<Section, String> {
    let p = opts
        .get("predicate")
        .ok_or("Filter without a predicate drops every record")?;
    let negate = opts.get("negate").is_some_and(|n| n.trim() == "true");
    let pprefix = format!("predicates.{p}.");
    let Some(class) = s.get(&format!("{pprefix}type")) else {
        return Err(format!("predicate {p} has no type"));
    };
    s.get("predicates");
    let popts: BTreeMap<String, String> = s
        .family(&pprefix)
        .into_iter()
        .map(|(k, v)| (k[pprefix.len()..].to_string(), v.to_string()))
        .collect();
    let mut t = Section::default();
    let pfrom = |k: &str| format!("{pprefix}{k}");
    match short(class) {
        "TopicNameMatches" => {
            let pattern = popts
                .get("pattern")
                .ok_or("TopicNameMatches without a pattern")?;
            t.set("topic_matches", pattern.as_str(), &[&pfrom("pattern")]);
        }
        "HasHeaderKey" => {
            let name = popts.get("name").ok_or("HasHeaderKey without a name")?;
            t.set("has_header", name.as_str(), &[&pfrom("name")]);
        }
        "RecordIsTombstone" => {
            t.set("is_tombstone", true, &[&pfrom("type")]);
        }
        other => return Err(format!("predicate {other} has no equivalent")),
    }
    if negate {
        t.set("negate", true, &[&format!("{prefix}negate")]);
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_patterns_and_replacements_translate() {
        assert_eq!(java_replacement("$1-es"), "${1}-es");
        assert_eq!(java_replacement("a\\$b$12"), "a$$b${12}");
        assert_eq!(
            strftime("yyyy-MM-dd'T'HH:mm:ss.SSSXXX").as_deref(),
            Some("%Y-%m-%dT%H:%M:%S.%3f%:z")
        );
        assert_eq!(strftime("EEE"), None);
        assert!(supported_date("yyyyMMdd"));
        assert!(supported_date("yyyy.MM.dd"));
        assert!(!supported_date("yyyy/MM/dd"));
        assert!(!supported_date("EEE"));
    }
}
