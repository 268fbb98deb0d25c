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
    // Routers change the topic that later steps (and the index name) see; lockgate
    // names indices from the original topic, so a router translates only as the last
    // step that reads the topic, and not into a data stream.
    let class_of = |s: &Settings<'_>, n: &str| {
        s.peek(&format!("transforms.{n}.type"))
            .map(short)
            .unwrap_or_default()
            .to_string()
    };
    let classes: Vec<String> = names.iter().map(|n| class_of(s, n)).collect();
    let routers: Vec<usize> = (0..names.len())
        .filter(|&i| matches!(classes[i].as_str(), "RegexRouter" | "TimestampRouter"))
        .collect();
    let reads_topic_after = |at: usize| {
        names[at + 1..]
            .iter()
            .zip(&classes[at + 1..])
            .any(|(n, c)| match c.as_str() {
                "InsertField$Value" => s.peek(&format!("transforms.{n}.topic.field")).is_some(),
                "Filter" => s
                    .peek(&format!("transforms.{n}.predicate"))
                    .and_then(|p| s.peek(&format!("predicates.{p}.type")))
                    .is_some_and(|t| short(t) == "TopicNameMatches"),
                _ => false,
            })
    };
    let data_stream = s
        .peek("data.stream.type")
        .is_some_and(|t| !t.trim().eq_ignore_ascii_case("none"));
    let router_problem = if routers.is_empty() {
        None
    } else if data_stream {
        Some("a router renames the topic a data stream's namespace is made of: lockgate names the stream from the original topic")
    } else if routers.len() > 2
        || (routers.len() == 2
            && !(classes[routers[0]] == "RegexRouter" && classes[routers[1]] == "TimestampRouter"))
    {
        Some("routers in this order: lockgate translates a RegexRouter, a TimestampRouter, or a RegexRouter then a TimestampRouter")
    } else if routers.iter().any(|&r| reads_topic_after(r)) {
        Some(
            "a later transform reads the renamed topic: lockgate's transforms see the original one",
        )
    } else {
        None
    };
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
        if let (Some(why), "RegexRouter" | "TimestampRouter") = (router_problem, short(class)) {
            for k in opts.keys() {
                s.used.insert(format!("{prefix}{k}"));
            }
            s.left_out.push((
                type_key.clone(),
                format!("transform {name} ({class}): {why}"),
            ));
            i += 1;
            continue;
        }
        let known: Option<&[&str]> = match short(class) {
            "InsertField$Value" => Some(&[
                "static.field",
                "static.value",
                "topic.field",
                "partition.field",
                "offset.field",
                "timestamp.field",
            ]),
            "ReplaceField$Value" => {
                Some(&["include", "whitelist", "exclude", "blacklist", "renames"])
            }
            "ExtractField$Value" | "ExtractField$Key" => Some(&["field"]),
            "ValueToKey" => Some(&["fields"]),
            "Cast$Value" => Some(&["spec"]),
            "TimestampConverter$Value" => {
                Some(&["field", "target.type", "format", "unix.precision"])
            }
            "Flatten$Value" => Some(&["delimiter"]),
            "MaskField$Value" => Some(&["fields", "replacement"]),
            "Filter" => Some(&[]),
            "RegexRouter" => Some(&["regex", "replacement"]),
            "TimestampRouter" => Some(&["topic.format", "timestamp.format"]),
            _ => None,
        };
        if let Some(known) = known {
            unknown_options(s, &prefix, &opts, known);
        }
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
                // Debezium 2.x: delete.handling.mode (drop, default | rewrite | none) and
                // drop.tombstones (default true); 3.x: delete.tombstone.handling.mode
                // (tombstone, default | drop | rewrite | rewrite-with-tombstone |
                // delete-to-tombstone). A delete that becomes a tombstone is then what
                // the sink's behavior.on.null.values says.
                let null_values = s
                    .peek("behavior.on.null.values")
                    .map(|v| v.trim().to_ascii_lowercase())
                    .unwrap_or_else(|| "fail".into());
                let new_mode = opt("delete.tombstone.handling.mode").map(str::trim);
                let (mode_key, mode) = match new_mode {
                    Some(m) => ("delete.tombstone.handling.mode", Some(m)),
                    None => (
                        "delete.handling.mode",
                        opt("delete.handling.mode").map(str::trim),
                    ),
                };
                // (delete_handling, tombstones kept, the delete becomes a tombstone)
                let chosen = match (mode_key, mode) {
                    (_, Some("rewrite")) => Some(("rewrite", false, false)),
                    (_, Some("rewrite-with-tombstone")) => Some(("rewrite", true, false)),
                    (_, Some("drop")) => Some(("drop", false, false)),
                    ("delete.handling.mode", None) => Some(("drop", false, false)),
                    ("delete.handling.mode", Some("none")) => Some(("delete", false, true)),
                    (_, Some("tombstone") | Some("delete-to-tombstone")) => {
                        Some(("delete", true, true))
                    }
                    _ => None,
                };
                let Some((handling, keep, as_tombstone)) = chosen else {
                    leave(
                        format!(
                            "{mode_key} = {} has no equivalent",
                            mode.unwrap_or_default()
                        ),
                        s,
                    );
                    i += 1;
                    continue;
                };
                // A delete become a tombstone deletes the document only where the sink
                // deletes on a tombstone.
                let handling = match (as_tombstone, null_values.as_str()) {
                    (true, "delete") | (false, _) => handling,
                    (true, "ignore") => "drop",
                    (true, _) => {
                        leave("a delete becomes a tombstone, on which Kafka Connect's sink fails (behavior.on.null.values = fail): set behavior.on.null.values".into(), s);
                        i += 1;
                        continue;
                    }
                };
                let t = f.array_section("transform");
                t.set("type", "debezium", &[type_key.as_str()]);
                t.set("delete_handling", handling, &[&from(mode_key)]).because(
                    "delete: the document is deleted; drop: nothing is written; rewrite: __deleted = \"true\"",
                );
                let drop_tombstones = if new_mode.is_some() {
                    !keep
                } else {
                    opt("drop.tombstones").is_none_or(|v| v.trim() != "false")
                };
                t.set(
                    "drop_tombstones",
                    drop_tombstones,
                    &[&from("drop.tombstones")],
                );
                if let Some(v) = opt("add.fields") {
                    if v.contains(':') {
                        s.left_out.push((from("add.fields"), "renamed fields (name:alias) have no equivalent: the fields are added as __name".into()));
                    }
                    let names = v
                        .split(',')
                        .map(|f| f.split(':').next().unwrap_or_default().trim().to_string())
                        .filter(|f| !f.is_empty())
                        .map(toml::Value::String)
                        .collect();
                    t.set(
                        "add_fields",
                        toml::Value::Array(names),
                        &[&from("add.fields")],
                    );
                }
                if new_mode.is_none() && opt("delete.handling.mode").is_none() {
                    notes.push(format!("transform {name}: no delete mode is set: Debezium 2.x drops deletes (translated so), Debezium 3.x turns them into tombstones: set delete.tombstone.handling.mode to say which"));
                }
                unknown_options(
                    s,
                    &prefix,
                    &opts,
                    &[
                        "delete.handling.mode",
                        "delete.tombstone.handling.mode",
                        "drop.tombstones",
                        "add.fields",
                    ],
                );
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
    routing
}

/// Reports the options of a transform that lockgate's does not take.
fn unknown_options(
    s: &mut Settings<'_>,
    prefix: &str,
    opts: &BTreeMap<String, String>,
    known: &[&str],
) {
    for k in opts.keys() {
        if !known.contains(&k.as_str()) && k != "predicate" && k != "negate" {
            s.left_out.push((
                format!("{prefix}{k}"),
                "an option of this transform lockgate's does not take".into(),
            ));
        }
    }
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
    crate::connectors::elasticsearch::IndexTemplate::parse(&format!("x-{{{format}}}")).is_ok()
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
    let unix = match opts.get("unix.precision").map(|p| p.trim()) {
        None | Some("milliseconds") => "unix_ms",
        Some("seconds") => "unix_s",
        Some(other) => {
            return Err(format!(
                "unix.precision = {other}: lockgate reads epoch seconds or milliseconds"
            ))
        }
    };
    let format = match opts.get("format") {
        Some(f) => Some(strftime(f).ok_or_else(|| {
            format!("format `{f}` has letters lockgate's strftime conversion does not know")
        })?),
        None => None,
    };
    let mut out = vec![("field", field.clone(), "field")];
    match target.as_str() {
        "string" => {
            out.push(("from", unix.to_string(), "unix.precision"));
            out.push((
                "to",
                format.unwrap_or_else(|| "iso8601".into()),
                "target.type",
            ));
        }
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
