//! The floors of the code (README, "Layout"), checked over its imports.
//!
//! Every `crate::` and `super::` path in `src/` (comments and `#[cfg(test)]` items left
//! out) is an arrow from the file that names it to the module it names. The rules:
//!
//! 1. no file imports from a floor above its own;
//! 2. on the floor of connectors and steps, no area imports another (connectors never
//!    import one another, and steps and connectors meet only through the contract);
//! 3. the runtime imports no connector, operator or transform;
//! 4. no import circle spans more than one folder;
//! 5. outside a connector's folder (`src/connectors/<name>/`), a path into it names only
//!    its face, the folder's `mod.rs` (`connectors::<name>::<Item>`), never one of its
//!    submodules (`connectors::<name>::<submodule>::...`). The submodules stay `pub`:
//!    integration tests, benches and programs built on the library reach into them, and
//!    closing them would break those; inside `src/` the face is the one way in.
//!
//! `KNOWN` lists the arrows that still break a rule while the floors are being put in
//! order; the test fails on any arrow not listed, and on a listed one that is gone (so
//! the list only shrinks).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The floors, bottom up: the top-level modules of each.
const FLOORS: &[(&str, &[&str])] = &[
    (
        "core",
        &[
            "record",
            "columns",
            "error",
            "member",
            "fault",
            "secret",
            "interpolate",
            "control",
            "event_time",
        ],
    ),
    ("services", &["checkpoint", "telemetry"]),
    ("plumbing", &["dead_letter", "clients"]),
    ("formats", &["formats"]),
    ("contract", &["connector"]),
    ("kits", &["kits"]),
    (
        "connectors and steps",
        &["connectors", "operators", "transforms"],
    ),
    ("model and runtime", &["config", "job", "runtime"]),
    (
        "command line and harness",
        &["cli", "builtin", "migrate", "chaos", "testkit"],
    ),
];

/// Arrows that break a rule today, as `rule: from-file -> to-area`. Each step of the
/// restructuring removes its own.
const KNOWN: &[&str] = &[];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a file under `src/` (`connectors/kafka/mod.rs` -> `connectors::kafka`).
fn module_of(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src()).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    parts
}

/// `text` with every comment, string and character literal blanked (their characters
/// but line ends become spaces), so that neither a path nor a brace inside one counts.
fn blank_literals(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    blank(&mut out, c[i]);
                    i += 1;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    blank(&mut out, c[i]);
                    i += 1;
                    if depth == 0 {
                        blank(&mut out, c[i]);
                        i += 1;
                        break;
                    }
                }
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == 'r'
            && (i == 0 || !ident(c[i - 1]) || c[i - 1] == 'b')
            && matches!(next, Some('"') | Some('#'))
            && c[i + 1..].iter().find(|&&h| h != '#') == Some(&'"')
        {
            // A raw string: r"..." or r#"..."#, closed by a quote and as many hashes.
            let hashes = c[i + 1..].iter().take_while(|&&h| h == '#').count();
            out.push('r');
            i += 1 + hashes + 1;
            (0..hashes + 1).for_each(|_| out.push(' '));
            while i < c.len() {
                if c[i] == '"'
                    && c[i + 1..]
                        .iter()
                        .take(hashes)
                        .filter(|&&h| h == '#')
                        .count()
                        == hashes
                {
                    (0..hashes + 1).for_each(|_| out.push(' '));
                    i += hashes + 1;
                    break;
                }
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == '"' {
            blank(&mut out, c[i]);
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    blank(&mut out, c[i]);
                    i += 1;
                }
                if i < c.len() {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            if i < c.len() {
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == '\'' {
            // A character literal ('x', '\n', '\'', '{'), not a lifetime ('a).
            let len = match next {
                Some('\\') => c[i + 2..].iter().position(|&q| q == '\'').map(|p| p + 3),
                Some(_) if c.get(i + 2) == Some(&'\'') => Some(3),
                _ => None,
            };
            match len {
                Some(n) => {
                    (0..n).for_each(|k| blank(&mut out, c[i + k]));
                    i += n;
                }
                None => {
                    out.push(c[i]);
                    i += 1;
                }
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// The code of a file without comments, literals and the items marked `#[cfg(test)]`.
fn product_code(text: &str) -> String {
    let text = blank_literals(text);
    let mut out = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]" {
            // Skip the item that follows: one line ending in `;`, or up to its
            // closing brace.
            let mut depth = 0i64;
            let mut opened = false;
            for l in lines.by_ref() {
                depth += l.matches('{').count() as i64 - l.matches('}').count() as i64;
                opened |= l.contains('{');
                if (opened && depth <= 0) || (!opened && l.trim_end().ends_with(';')) {
                    break;
                }
            }
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The module paths a file's code names: `crate::a::b` and `super::c` (resolved against
/// `module`), each as far as its path goes; a `{...}` group yields each of its members.
fn named_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let parent = {
        // `super` of module a::b::c (`a/b/c.rs`) is a::b, of a::b (`a/b/mod.rs`) a.
        let mut m = module.to_vec();
        m.pop();
        m
    };
    // `use child::x` names a child module (or an outside crate, which resolves to the
    // file itself): relative to the module, as `self::` is.
    let uses = [
        "\nuse ",
        "\npub use ",
        "\npub(crate) use ",
        "\npub(super) use ",
    ];
    for (at, u) in uses.iter().flat_map(|u| code.match_indices(u)) {
        let rest = &code[at + u.len()..];
        if !["crate::", "super::", "self::", "::"]
            .iter()
            .any(|r| rest.starts_with(r))
        {
            collect_tree(rest, module.to_vec(), &mut out);
        }
    }
    let roots = [
        ("crate::", Vec::new()),
        ("super::", parent),
        ("self::", module.to_vec()),
    ];
    for (root, base) in roots {
        let mut from = 0;
        while let Some(at) = code[from..].find(root) {
            let i = from + at;
            from = i + root.len();
            let before = if i == 0 { b' ' } else { bytes[i - 1] };
            if before.is_ascii_alphanumeric() || before == b'_' || before == b'$' || before == b':'
            {
                continue;
            }
            let mut base = base.clone();
            let mut rest = &code[from..];
            // `super::super::`
            while let Some(r) = rest.strip_prefix("super::") {
                base.pop();
                rest = r;
            }
            collect_tree(rest, base, &mut out);
        }
    }
    out
}

/// The paths of a use tree at the start of `text` (`a::b`, `a::{b, c::d}`).
fn collect_tree(text: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut path = prefix;
    let mut rest = text;
    loop {
        let ident: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !ident.is_empty() {
            if ident != "self" {
                path.push(ident.clone());
            }
            rest = &rest[ident.len()..];
            match rest.strip_prefix("::") {
                Some(r) => {
                    rest = r;
                    continue;
                }
                None => break,
            }
        }
        if let Some(r) = rest.strip_prefix('{') {
            // Members split at top-level commas.
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in r.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        collect_tree(r[start..i].trim_start(), path.clone(), out);
                        return;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        collect_tree(r[start..i].trim_start(), path.clone(), out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
        }
        break;
    }
    if !path.is_empty() {
        out.push(path);
    }
}

/// Where a module path lives: the file that defines its longest prefix.
fn file_of(path: &[String], files: &BTreeSet<PathBuf>) -> Option<PathBuf> {
    for n in (1..=path.len()).rev() {
        let base = path[..n].iter().fold(src(), |p, s| p.join(s));
        for candidate in [base.with_extension("rs"), base.join("mod.rs")] {
            if files.contains(&candidate) {
                return Some(candidate);
            }
        }
    }
    None
}

/// The area of a module path: its top-level module, or `connectors::<name>` for a
/// connector (`connectors` alone for the folder's face).
fn area(module: &[String], connectors: &BTreeSet<String>) -> Option<String> {
    let top = module.first()?;
    if top == "connectors" {
        if let Some(c) = module.get(1).filter(|c| connectors.contains(*c)) {
            return Some(format!("connectors::{c}"));
        }
    }
    Some(top.clone())
}

/// The submodule of a connector's folder that an import from `from_area` names past the
/// folder's face (`connectors::kafka::sink_config` for `target` = that file's module), or
/// `None` when the import goes through the face or comes from inside the folder.
fn past_the_face(
    from_area: &str,
    target: &[String],
    connectors: &BTreeSet<String>,
) -> Option<String> {
    let [top, name, sub, ..] = target else {
        return None;
    };
    let inside = from_area == format!("connectors::{name}");
    (top == "connectors" && connectors.contains(name) && !inside)
        .then(|| format!("connectors::{name}::{sub}"))
}

fn floor(area: &str) -> Option<usize> {
    let top = area.split("::").next()?;
    FLOORS.iter().position(|(_, mods)| mods.contains(&top))
}

fn rel(file: &Path) -> String {
    file.strip_prefix(src()).unwrap().display().to_string()
}

/// Strongly connected components of more than one file (Tarjan, iterative enough for
/// a few hundred files).
fn circles(edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct T<'a> {
        edges: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on: BTreeSet<&'a PathBuf>,
        out: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a PathBuf) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        if let Some(next) = t.edges.get(v) {
            for w in next {
                let Some((w, _)) = t.edges.get_key_value(w) else {
                    continue;
                };
                if !t.index.contains_key(w) {
                    visit(t, w);
                    let l = t.low[w].min(t.low[v]);
                    t.low.insert(v, l);
                } else if t.on.contains(w) {
                    let l = t.index[w].min(t.low[v]);
                    t.low.insert(v, l);
                }
            }
        }
        if t.low[v] == t.index[v] {
            let mut c = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                c.push(w.clone());
                if w == v {
                    break;
                }
            }
            if c.len() > 1 {
                c.sort();
                t.out.push(c);
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out
}

/// Every arrow that breaks a rule, as the `KNOWN` list spells it.
fn violations() -> BTreeSet<String> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let files: BTreeSet<PathBuf> = files
        .into_iter()
        .filter(|f| !matches!(rel(f).as_str(), "lib.rs" | "main.rs"))
        .collect();
    let connectors: BTreeSet<String> = files
        .iter()
        .map(|f| module_of(f))
        .filter(|m| m.len() >= 2 && m[0] == "connectors")
        .map(|m| m[1].clone())
        .collect();
    let mut found = BTreeSet::new();
    let mut edges: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for file in &files {
        let module = module_of(file);
        let from_area = area(&module, &connectors).unwrap();
        let code = product_code(&std::fs::read_to_string(file).unwrap());
        let targets = edges.entry(file.clone()).or_default();
        for path in named_paths(&code, &module) {
            let Some(target) = file_of(&path, &files) else {
                continue;
            };
            if &target != file {
                targets.insert(target.clone());
            }
            if let Some(sub) = past_the_face(&from_area, &module_of(&target), &connectors) {
                found.insert(format!("face: {} -> {sub}", rel(file)));
            }
            let Some(to_area) = area(&module_of(&target), &connectors) else {
                continue;
            };
            if to_area == from_area {
                continue;
            }
            let (Some(f), Some(t)) = (floor(&from_area), floor(&to_area)) else {
                found.insert(format!("no floor: {} -> {to_area}", rel(file)));
                continue;
            };
            if t > f {
                found.insert(format!("upward: {} -> {to_area}", rel(file)));
            } else if t == f && FLOORS[f].0 == "connectors and steps" {
                found.insert(format!("sideways: {} -> {to_area}", rel(file)));
            }
            if from_area == "runtime"
                && ["connectors", "operators", "transforms"]
                    .contains(&to_area.split("::").next().unwrap())
            {
                found.insert(format!("runtime: {} -> {to_area}", rel(file)));
            }
        }
    }
    for c in circles(&edges) {
        let folders: BTreeSet<_> = c
            .iter()
            .map(|f| f.parent().unwrap().to_path_buf())
            .collect();
        if folders.len() > 1 {
            let names: Vec<String> = c.iter().map(|f| rel(f)).collect();
            found.insert(format!("circle: {}", names.join(" ")));
        }
    }
    found
}

#[test]
fn no_import_breaks_the_floors() {
    let found = violations();
    let known: BTreeSet<String> = KNOWN.iter().map(|s| s.to_string()).collect();
    let new: Vec<_> = found.difference(&known).collect();
    let gone: Vec<_> = known.difference(&found).collect();
    assert!(
        new.is_empty() && gone.is_empty(),
        "imports that break the floors (README, \"Layout\"):\n{}\n\nlisted as known but gone (remove them from KNOWN):\n{}",
        new.iter().map(|s| format!("  {s:?},")).collect::<Vec<_>>().join("\n"),
        gone.iter().map(|s| format!("  {s:?},")).collect::<Vec<_>>().join("\n"),
    );
}

#[test]
fn the_reader_finds_what_the_rules_are_about() {
    // The parser itself: grouped, nested and relative paths; comments and test items
    // are not code.
    let code = product_code(
        "use crate::{a::b, c::{d, e::f}};\n// use crate::x;\nfn g() { crate::h::i(); }\n#[cfg(test)]\nmod tests {\n    use crate::y;\n}\nuse super::super::k;\n#[cfg(test)]\nconst S: &str = \"{\";\nconst C: char = '{';\nfn l<'a>(x: &'a str) -> &'a str { \"crate::no\"; x }\nconst R: &str = r#\"crate::raw\"#;\n/* crate::block */ use crate::after::p;\nuse self::q::r;\n",
    );
    let module: Vec<String> = ["m", "n", "o"].iter().map(|s| s.to_string()).collect();
    let mut got: Vec<String> = named_paths(&code, &module)
        .into_iter()
        .map(|p| p.join("::"))
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            "a::b",
            "after::p",
            "c::d",
            "c::e::f",
            "h::i",
            "m::k",
            "m::n::o::q::r"
        ]
    );

    // Past a connector's face: a submodule named from outside the folder is found, in
    // a plain, a grouped or a `super::super::` path; the face's own items and a path
    // from inside the folder are not.
    let files: BTreeSet<PathBuf> = [
        "connectors/kafka/mod.rs",
        "connectors/kafka/offsets.rs",
        "connectors/kafka/sink_config.rs",
        "connectors/file_sink.rs",
        "chaos/target.rs",
    ]
    .iter()
    .map(|f| src().join(f))
    .collect();
    let connectors = BTreeSet::from(["kafka".to_string()]);
    let breaches = |file: &str, text: &str| -> Vec<String> {
        let module = module_of(&src().join(file));
        let from_area = area(&module, &connectors).unwrap();
        named_paths(&product_code(text), &module)
            .iter()
            .filter_map(|p| file_of(p, &files))
            .filter_map(|t| past_the_face(&from_area, &module_of(&t), &connectors))
            .collect()
    };
    assert_eq!(
        breaches(
            "chaos/target.rs",
            "use crate::connectors::kafka::sink_config::KafkaSinkConfig;\nuse crate::connectors::kafka::{KafkaSinkConfig, offsets::ranges};\nfn f() { super::super::connectors::kafka::offsets::ranges(); crate::connectors::kafka::TopicId::from_bytes(); }\nuse crate::connectors::file_sink::FileSinkConfig;\n",
        ),
        [
            "connectors::kafka::sink_config",
            "connectors::kafka::offsets",
            "connectors::kafka::offsets"
        ]
    );
    assert!(breaches(
        "connectors/kafka/sink_config.rs",
        "use super::offsets::ranges;\nuse crate::connectors::kafka::offsets;\n"
    )
    .is_empty());

    // A circle of two folders is found; one inside a folder is not a violation.
    let p = |s: &str| PathBuf::from(s);
    let mut edges = BTreeMap::new();
    edges.insert(p("a/x.rs"), BTreeSet::from([p("b/y.rs")]));
    edges.insert(p("b/y.rs"), BTreeSet::from([p("a/x.rs")]));
    edges.insert(p("c/z.rs"), BTreeSet::new());
    assert_eq!(circles(&edges), vec![vec![p("a/x.rs"), p("b/y.rs")]]);
}
