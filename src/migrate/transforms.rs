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
    let Some(list) = s.get("transforms") else {
        s.leave(
            "predicates",
            "no Filter names these predicates (there are no transforms)",
        );
        return IndexRouting::default();
    };
    let names: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect();
    let topics = listed_topics(s);
    let router_problem = router_problem(s, &names);
    let mut chain = Chain {
        s,
        f,
        notes,
        routing: IndexRouting::default(),
        topics,
    };
    let mut i = 0;
    while i < names.len() {
        let Some(step) = read_step(chain.s, names[i]) else {
            i += 1;
            continue;
        };
        let took_next = translate_step(&mut chain, &step, router_problem, names.get(i + 1));
        i += if took_next { 2 } else { 1 };
    }
    leave_unnamed_predicates(chain.s);
    chain.routing
}

/// What the translation of a chain writes to, and what its steps share.
struct Chain<'c, 'a> {
    s: &'c mut Settings<'a>,
    f: &'c mut JobFile,
    notes: &'c mut Vec<String>,
    /// The index routing the routers (and `ExtractField$Key`) make.
    routing: IndexRouting,
    /// The connector's `topics` (empty when it reads `topics.regex`).
    topics: Vec<String>,
}

/// One transform of the chain: its name, class and options.
struct Step<'a> {
    name: &'a str,
    class: &'a str,
    /// `transforms.NAME.`
    prefix: String,
    /// `transforms.NAME.type`, where the transform's section comes from.
    type_key: String,
    /// The options without the prefix, `type` left out.
    opts: BTreeMap<String, String>,
}

impl Step<'_> {
    fn opt(&self, k: &str) -> Option<&str> {
        self.opts.get(k).map(String::as_str)
    }

    /// The setting an option comes from.
    fn from(&self, k: &str) -> String {
        format!("{}{k}", self.prefix)
    }

    /// Reports the transform as left out, for `why`.
    fn leave(&self, s: &mut Settings<'_>, why: String) {
        s.left_out.push((
            self.type_key.clone(),
            format!("transform {} ({}): {why}", self.name, self.class),
        ));
    }

    /// A new `[[transform]]` section of type `ty`.
    fn section<'f>(&self, f: &'f mut JobFile, ty: &str) -> &'f mut Section {
        let t = f.array_section("transform");
        t.set("type", ty, &[self.type_key.as_str()]);
        t
    }
}

/// The connector's `topics`, each trimmed.
fn listed_topics(s: &Settings<'_>) -> Vec<String> {
    s.peek("topics")
        .map(|t| {
            t.split(',')
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// Why the chain's routers cannot be translated, if they cannot.
///
/// Routers change the topic that later steps (and the index name) see; lockgate names
/// indices from the original topic, so a router translates only as the last step that
/// reads the topic, and not into a data stream.
fn router_problem(s: &Settings<'_>, names: &[&str]) -> Option<&'static str> {
    let classes: Vec<&str> = names
        .iter()
        .map(|n| {
            s.peek(&format!("transforms.{n}.type"))
                .map(short)
                .unwrap_or_default()
        })
        .collect();
    let routers: Vec<usize> = (0..names.len())
        .filter(|&i| matches!(classes[i], "RegexRouter" | "TimestampRouter"))
        .collect();
    let data_stream = s
        .peek("data.stream.type")
        .is_some_and(|t| !t.trim().eq_ignore_ascii_case("none"));
    if routers.is_empty() {
        None
    } else if data_stream {
        Some("a router renames the topic a data stream's namespace is made of: lockgate names the stream from the original topic")
    } else if routers.len() > 2
        || (routers.len() == 2
            && !(classes[routers[0]] == "RegexRouter" && classes[routers[1]] == "TimestampRouter"))
    {
        Some("routers in this order: lockgate translates a RegexRouter, a TimestampRouter, or a RegexRouter then a TimestampRouter")
    } else if routers
        .iter()
        .any(|&r| reads_topic(s, &names[r + 1..], &classes[r + 1..]))
    {
        Some(
            "a later transform reads the renamed topic: lockgate's transforms see the original one",
        )
    } else {
        None
    }
}

/// Whether one of these transforms (names and their classes) reads the record's topic.
fn reads_topic(s: &Settings<'_>, names: &[&str], classes: &[&str]) -> bool {
    names.iter().zip(classes).any(|(n, c)| match *c {
        "InsertField$Value" => s.peek(&format!("transforms.{n}.topic.field")).is_some(),
        "Filter" => s
            .peek(&format!("transforms.{n}.predicate"))
            .and_then(|p| s.peek(&format!("predicates.{p}.type")))
            .is_some_and(|t| short(t) == "TopicNameMatches"),
        _ => false,
    })
}

/// The transform `name`'s class and options (marked used); none, reported, without a type.
fn read_step<'a>(s: &mut Settings<'a>, name: &'a str) -> Option<Step<'a>> {
    let prefix = format!("transforms.{name}.");
    let type_key = format!("{prefix}type");
    let Some(class) = s.get(&type_key) else {
        s.left_out.push((
            format!("transforms.{name}"),
            "the transform has no type".into(),
        ));
        return None;
    };
    let opts: BTreeMap<String, String> = s
        .family(&prefix)
        .into_iter()
        .map(|(k, v)| (k[prefix.len()..].to_string(), v.to_string()))
        .filter(|(k, _)| k != "type")
        .collect();
    Some(Step {
        name,
        class,
        prefix,
        type_key,
        opts,
    })
}

/// The options lockgate's equivalent of a transform class takes; none for a class whose
/// translation checks its own (or that has no equivalent).
fn known_options(class: &str) -> Option<&'static [&'static str]> {
    match class {
        "InsertField$Value" => Some(&[
            "static.field",
            "static.value",
            "topic.field",
            "partition.field",
            "offset.field",
            "timestamp.field",
        ]),
        "ReplaceField$Value" => Some(&["include", "whitelist", "exclude", "blacklist", "renames"]),
        "ExtractField$Value" | "ExtractField$Key" => Some(&["field"]),
        "ValueToKey" => Some(&["fields"]),
        "Cast$Value" => Some(&["spec"]),
        "TimestampConverter$Value" => Some(&["field", "target.type", "format", "unix.precision"]),
        "Flatten$Value" => Some(&["delimiter"]),
        "MaskField$Value" => Some(&["fields", "replacement"]),
        "Filter" => Some(&[]),
        "RegexRouter" => Some(&["regex", "replacement"]),
        "TimestampRouter" => Some(&["topic.format", "timestamp.format"]),
        _ => None,
    }
}

/// Translates one transform (or reports it left out); returns whether it also took the
/// next one (`next`, its name), as `ValueToKey` takes an `ExtractField$Key` after it.
fn translate_step(
    c: &mut Chain<'_, '_>,
    t: &Step<'_>,
    router_problem: Option<&str>,
    next: Option<&&str>,
) -> bool {
    if let (Some(why), "RegexRouter" | "TimestampRouter") = (router_problem, short(t.class)) {
        for k in t.opts.keys() {
            c.s.used.insert(t.from(k));
        }
        t.leave(c.s, why.into());
        return false;
    }
    if let Some(known) = known_options(short(t.class)) {
        unknown_options(c.s, &t.prefix, &t.opts, known);
    }
    // A condition on a transform other than Filter has no equivalent.
    if t.opt("predicate").is_some() && short(t.class) != "Filter" {
        t.leave(
            c.s,
            "lockgate's transforms take no predicate (only filter is conditional)".into(),
        );
        return false;
    }
    match short(t.class) {
        "InsertField$Value" => insert_field(c, t),
        "ReplaceField$Value" => replace_field(c, t),
        "ExtractField$Value" => extract_field(c, t),
        "ValueToKey" => return value_to_key(c, t, next.copied()),
        "Cast$Value" => cast(c, t),
        "TimestampConverter$Value" => timestamp_converter_step(c, t),
        "Flatten$Value" => flatten(c, t),
        "MaskField$Value" => mask_field(c, t),
        "Filter" => filter_step(c, t),
        "ExtractNewRecordState" => extract_new_record_state(c, t),
        "ExtractField$Key" => key_field(c, t),
        "RegexRouter" => regex_router(c, t),
        "TimestampRouter" => timestamp_router(c, t),
        other => t.leave(c.s, format!("lockgate has no transform for {other}")),
    }
    false
}

/// `InsertField$Value` as `insert_field`.
fn insert_field(c: &mut Chain<'_, '_>, t: &Step<'_>) {
    let section = t.section(c.f, "insert_field");
    if let (Some(field), Some(value)) = (t.opt("static.field"), t.opt("static.value")) {
        let mut m = toml::map::Map::new();
        m.insert(plain(field), toml::Value::String(value.into()));
        section.set(
            "static",
            toml::Value::Table(m),
            &[&t.from("static.field"), &t.from("static.value")],
        );
    }
    for (connect, ours) in [
        ("topic.field", "topic_field"),
        ("partition.field", "partition_field"),
        ("offset.field", "offset_field"),
        ("timestamp.field", "timestamp_field"),
    ] {
        if let Some(v) = t.opt(connect) {
            section.set(ours, plain(v), &[&t.from(connect)]);
        }
    }
}

/// `ReplaceField$Value` as `replace_field`.
fn replace_field(c: &mut Chain<'_, '_>, t: &Step<'_>) {
    let section = t.section(c.f, "replace_field");
    for (connect, ours) in [
        ("include", "include"),
        ("whitelist", "include"),
        ("exclude", "exclude"),
        ("blacklist", "exclude"),
    ] {
        if let Some(v) = t.opt(connect) {
            section.set(ours, list_value(v), &[&t.from(connect)]);
        }
    }
    if let Some(r) = t.opt("renames") {
        let mut m = toml::map::Map::new();
        for pair in r.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if let Some((a, b)) = pair.split_once(':') {
                m.insert(a.trim().into(), toml::Value::String(b.trim().into()));
            }
        }
        section.set("rename", toml::Value::Table(m), &[&t.from("renames")]);
    }
}

/// `ExtractField$Value` as `extract_field`.
fn extract_field(c: &mut Chain<'_, '_>, t: &Step<'_>) {
    let section = t.section(c.f, "extract_field");
    if let Some(v) = t.opt("field") {
        section.set("field", v, &[&t.from("field")]);
    }
}

/// `ValueToKey` as `set_key`: with `ExtractField$Key` next (which it then takes, and
/// returns true), the key is one field's value; otherwise the listed fields.
fn value_to_key(c: &mut Chain<'_, '_>, t: &Step<'_>, next: Option<&str>) -> bool {
    let fields: Vec<String> = t
        .opt("fields")
        .unwrap_or_default()
        .split(',')
        .map(|f| f.trim().to_string())
        .filter(|f| !f.is_empty())
        .collect();
    let extract = next.and_then(|n| {
        let class = c.s.peek(&format!("transforms.{n}.type"))?;
        (short(class) == "ExtractField$Key").then_some(n)
    });
    let section = t.section(c.f, "set_key");
    match extract {
        Some(n) => {
            let field_key = format!("transforms.{n}.field");
            c.s.get(&format!("transforms.{n}.type"));
            let field = c.s.get(&field_key).unwrap_or_default().trim().to_string();
            section.set(
                "field",
                format!("/{field}"),
                &[&t.from("fields"), field_key.as_str()],
            );
            true
        }
        None => {
            let list = fields
                .iter()
                .map(|f| toml::Value::String(format!("/{f}")))
                .collect();
            section.set("fields", toml::Value::Array(list), &[&t.from("fields")]);
            false
        }
    }
}

/// `Cast$Value` of fields as `cast`; a cast of the whole value is left out.
fn cast(c: &mut Chain<'_, '_>, t: &Step<'_>) {
    let spec = t.opt("spec").unwrap_or_default();
    if !spec.contains(':') {
        t.leave(
            c.s,
            "a cast of the whole value has no equivalent (cast takes fields)".into(),
        );
        return;
    }
    let mut m = toml::map::Map::new();
    for pair in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some((field, ty)) = pair.split_once(':') {
            m.insert(
                field.trim().into(),
                toml::Value::String(ty.trim().to_ascii_lowercase()),
            );
        }
    }
    let section = t.section(c.f, "cast");
    section.set("spec", toml::Value::Table(m), &[&t.from("spec")]);
}

/// `TimestampConverter$Value` as `timestamp_converter`, if its options have an equivalent.
fn timestamp_converter_step(c: &mut Chain<'_, '_>, t: &Step<'_>) {
    match timestamp_converter(&t.opts) {
        Ok(pairs) => {
            let section = t.section(c.f, "timestamp_converter");
            for (k, v, connect) in pairs {
                section.set(k, v, &[&t.from(connect)]);
            }
        }
        Err(why) => t.leave(c.s, why),
    }
}

/// `Flatten$Value` as `flatten`.
fn flatten(c: &mut Chain<'_, '_>, t: &Step<'_>) {
    let section = t.section(c.f, "flatten");
    if let Some(d) = t.opt("delimiter") {
        section.set("delimiter", d, &[&t.from("delimiter")]);
    }
}

/// `MaskField$Value` as `mask_field`.
fn mask_field(c: &mut Chain<'_, '_>, t: &Step<'_>) {
    let section = t.section(c.f, "mask_field");
    if let Some(v) = t.opt("fields") {
        section.set("fields", list_value(v), &[&t.from("fields")]);
    }
    if let Some(v) = t.opt("replacement") {
        section.set("replacement", v, &[&t.from("replacement")]);
    }
}

/// `Filter` (with its predicate) as `filter`, if the predicate has an equivalent.
fn filter_step(c: &mut Chain<'_, '_>, t: &Step<'_>) {
    match filter(c.s, &t.opts, &t.prefix) {
        Ok(keys) => {
            let section = t.section(c.f, "filter");
            section.entries.extend(keys.entries);
        }
        Err(why) => t.leave(c.s, why),
    }
}

/// Debezium's `ExtractNewRecordState` as `debezium`, if its delete handling has an
/// equivalent given the sink's `behavior.on.null.values`.
fn extract_new_record_state(c: &mut Chain<'_, '_>, t: &Step<'_>) {
    let null_values =
        c.s.peek("behavior.on.null.values")
            .map(|v| v.trim().to_ascii_lowercase())
            .unwrap_or_else(|| "fail".into());
    let new_mode = t.opt("delete.tombstone.handling.mode").map(str::trim);
    let (mode_key, mode) = match new_mode {
        Some(m) => ("delete.tombstone.handling.mode", Some(m)),
        None => (
            "delete.handling.mode",
            t.opt("delete.handling.mode").map(str::trim),
        ),
    };
    let Some((handling, keep, as_tombstone)) = delete_mode(mode_key, mode) else {
        t.leave(
            c.s,
            format!(
                "{mode_key} = {} has no equivalent",
                mode.unwrap_or_default()
            ),
        );
        return;
    };
    let Some(handling) = delete_handling(handling, as_tombstone, &null_values) else {
        t.leave(c.s, "a delete becomes a tombstone, on which Kafka Connect's sink fails (behavior.on.null.values = fail): set behavior.on.null.values".into());
        return;
    };
    let section = t.section(c.f, "debezium");
    section.set("delete_handling", handling, &[&t.from(mode_key)]).because(
        "delete: the document is deleted; drop: nothing is written; rewrite: __deleted = \"true\"",
    );
    let drop_tombstones = if new_mode.is_some() {
        !keep
    } else {
        t.opt("drop.tombstones").is_none_or(|v| v.trim() != "false")
    };
    section.set(
        "drop_tombstones",
        drop_tombstones,
        &[&t.from("drop.tombstones")],
    );
    if let Some(v) = t.opt("add.fields") {
        if v.contains(':') {
            c.s.left_out.push((
                t.from("add.fields"),
                "renamed fields (name:alias) have no equivalent: the fields are added as __name"
                    .into(),
            ));
        }
        let names = v
            .split(',')
            .map(|f| f.split(':').next().unwrap_or_default().trim().to_string())
            .filter(|f| !f.is_empty())
            .map(toml::Value::String)
            .collect();
        section.set(
            "add_fields",
            toml::Value::Array(names),
            &[&t.from("add.fields")],
        );
    }
    if new_mode.is_none() && t.opt("delete.handling.mode").is_none() {
        c.notes.push(format!("transform {}: no delete mode is set: Debezium 2.x drops deletes (translated so), Debezium 3.x turns them into tombstones: set delete.tombstone.handling.mode to say which", t.name));
    }
    unknown_options(
        c.s,
        &t.prefix,
        &t.opts,
        &[
            "delete.handling.mode",
            "delete.tombstone.handling.mode",
            "drop.tombstones",
            "add.fields",
        ],
    );
}

/// What Debezium's delete mode (`mode_key` = `mode`) is: (lockgate's `delete_handling`,
/// whether tombstones are kept, whether the delete becomes a tombstone); none without an
/// equivalent.
///
/// Debezium 2.x: delete.handling.mode (drop, default | rewrite | none) and
/// drop.tombstones (default true); 3.x: delete.tombstone.handling.mode (tombstone,
/// default | drop | rewrite | rewrite-with-tombstone | delete-to-tombstone).
fn delete_mode(mode_key: &str, mode: Option<&str>) -> Option<(&'static str, bool, bool)> {
    match (mode_key, mode) {
        (_, Some("rewrite")) => Some(("rewrite", false, false)),
        (_, Some("rewrite-with-tombstone")) => Some(("rewrite", true, false)),
        (_, Some("drop")) => Some(("drop", false, false)),
        ("delete.handling.mode", None) => Some(("drop", false, false)),
        ("delete.handling.mode", Some("none")) => Some(("delete", false, true)),
        (_, Some("tombstone") | Some("delete-to-tombstone")) => Some(("delete", true, true)),
        _ => None,
    }
}

/// The `delete_handling` written: a delete become a tombstone is what the sink's
/// `behavior.on.null.values` (`null_values`) says, and deletes the document only where
/// the sink deletes on a tombstone; none where the sink fails on one.
fn delete_handling(
    handling: &'static str,
    as_tombstone: bool,
    null_values: &str,
) -> Option<&'static str> {
    match (as_tombstone, null_values) {
        (true, "delete") | (false, _) => Some(handling),
        (true, "ignore") => Some("drop"),
        (true, _) => None,
    }
}

/// `ExtractField$Key`: the key becomes one field of the key (Debezium's `{"id": 7}` ->
/// 7); the sink reads that field, from the value or from a JSON key.
fn key_field(c: &mut Chain<'_, '_>, t: &Step<'_>) {
    match t.opt("field") {
        Some(field) => {
            c.routing.key_field = Some((
                field.trim().to_string(),
                vec![t.type_key.clone(), t.from("field")],
            ));
        }
        None => t.leave(c.s, "ExtractField$Key without a field".into()),
    }
}

/// `RegexRouter` as the index names of the listed topics it renames.
fn regex_router(c: &mut Chain<'_, '_>, t: &Step<'_>) {
    let (Some(regex), Some(replacement)) = (t.opt("regex"), t.opt("replacement")) else {
        t.leave(c.s, "RegexRouter needs regex and replacement".into());
        return;
    };
    let Ok(re) = regex::Regex::new(&format!("^(?:{regex})$")) else {
        t.leave(c.s, format!("`{regex}` is not a regex lockgate reads"));
        return;
    };
    if c.topics.is_empty() {
        t.leave(c.s, "renames topics matched by topics.regex, which are not known in advance: give topic_to_index by hand".into());
        return;
    }
    // Java's `$1` is the regex crate's `${1}`.
    let rust = java_replacement(replacement);
    for topic in &c.topics {
        let renamed = re.replace(topic, rust.as_str()).to_string();
        if renamed != *topic {
            c.routing
                .renamed
                .insert(topic.clone(), renamed.to_lowercase());
        }
    }
    c.routing.renamed_from.push(t.type_key.clone());
    c.routing.renamed_from.push(t.from("regex"));
    c.routing.renamed_from.push(t.from("replacement"));
}

/// `TimestampRouter` as the index template, if lockgate's templates read its date format.
fn timestamp_router(c: &mut Chain<'_, '_>, t: &Step<'_>) {
    let format = t.opt("timestamp.format").unwrap_or("yyyyMMdd");
    let topic_format = t.opt("topic.format").unwrap_or("${topic}-${timestamp}");
    if !supported_date(format) {
        t.leave(c.s, format!("timestamp.format `{format}`: lockgate's index dates take yyyy, yy, MM, dd, HH, mm, ss and . - _"));
        return;
    }
    let index = topic_format
        .replace("${topic}", "{topic}")
        .replace("${timestamp}", &format!("{{{format}}}"));
    c.routing.template = Some((
        index,
        vec![
            t.type_key.clone(),
            t.from("topic.format"),
            t.from("timestamp.format"),
        ],
    ));
}

/// Reports the predicates no Filter named.
fn leave_unnamed_predicates(s: &mut Settings<'_>) {
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

    fn settings(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn problem(pairs: &[(&str, &str)], names: &[&str]) -> Option<&'static str> {
        let all = settings(pairs);
        let s = Settings {
            all: &all,
            used: Default::default(),
            left_out: Vec::new(),
        };
        router_problem(&s, names)
    }

    #[test]
    fn routers_translate_only_last_in_order_and_not_into_a_data_stream() {
        let regex = (
            "transforms.r.type",
            "org.apache.kafka.connect.transforms.RegexRouter",
        );
        let time = (
            "transforms.t.type",
            "org.apache.kafka.connect.transforms.TimestampRouter",
        );
        assert_eq!(problem(&[regex, time], &["r", "t"]), None);
        assert!(problem(&[regex, time], &["t", "r"])
            .is_some_and(|why| why.starts_with("routers in this order")));
        assert!(problem(&[regex, ("data.stream.type", "logs")], &["r"])
            .is_some_and(|why| why.contains("data stream")));
        assert_eq!(
            problem(&[regex, ("data.stream.type", "None")], &["r"]),
            None
        );
        let insert = ("transforms.i.type", "InsertField$Value");
        assert_eq!(problem(&[regex, insert], &["r", "i"]), None);
        assert!(problem(
            &[regex, insert, ("transforms.i.topic.field", "t")],
            &["r", "i"]
        )
        .is_some_and(|why| why.contains("reads the renamed topic")));
        assert_eq!(
            problem(
                &[regex, insert, ("transforms.i.topic.field", "t")],
                &["i", "r"]
            ),
            None
        );
    }

    #[test]
    fn debezium_delete_modes_and_the_sinks_null_values() {
        assert_eq!(
            delete_mode("delete.handling.mode", None),
            Some(("drop", false, false))
        );
        assert_eq!(
            delete_mode("delete.handling.mode", Some("none")),
            Some(("delete", false, true))
        );
        assert_eq!(delete_mode("delete.tombstone.handling.mode", None), None);
        assert_eq!(
            delete_mode("delete.tombstone.handling.mode", Some("none")),
            None
        );
        assert_eq!(
            delete_mode(
                "delete.tombstone.handling.mode",
                Some("delete-to-tombstone")
            ),
            Some(("delete", true, true))
        );
        assert_eq!(
            delete_mode("delete.handling.mode", Some("rewrite-with-tombstone")),
            Some(("rewrite", true, false))
        );
        assert_eq!(delete_handling("rewrite", false, "fail"), Some("rewrite"));
        assert_eq!(delete_handling("delete", true, "delete"), Some("delete"));
        assert_eq!(delete_handling("delete", true, "ignore"), Some("drop"));
        assert_eq!(delete_handling("delete", true, "fail"), None);
    }
}
