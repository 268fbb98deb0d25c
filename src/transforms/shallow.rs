//! A record's value as its top-level fields, each field's value kept as its JSON text:
//! what the transforms of top-level fields (`insert_field`, `replace_field`, `cast`)
//! change without building the whole value. Parsing checks the whole text (a value
//! that is not JSON is refused, as a full parse refuses it), and writing copies each
//! untouched field's text as it came, so a number keeps its digits by construction.

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use std::borrow::Cow;

/// The top-level fields of a JSON object, in their order, each with its value's text.
#[derive(Debug, Clone, PartialEq)]
pub struct Fields<'a> {
    entries: Vec<(Cow<'a, str>, Cow<'a, str>)>,
}

/// A field name as written (borrowed when it has no escapes).
struct Key<'a>(Cow<'a, str>);

impl<'de> de::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a field name")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s)))
            }
        }
        d.deserialize_str(V)
    }
}

/// The visitor of a top-level object.
struct Top;

impl<'de> Visitor<'de> for Top {
    type Value = Option<Fields<'de>>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut entries: Vec<(Cow<'de, str>, Cow<'de, str>)> =
            Vec::with_capacity(map.size_hint().unwrap_or(16));
        while let Some(Key(k)) = map.next_key::<Key<'de>>()? {
            let v: &'de RawValue = map.next_value()?;
            entries.push((k, Cow::Borrowed(v.get())));
        }
        dedupe(&mut entries);
        Ok(Some(Fields { entries }))
    }
}

/// Objects with at most this many fields are checked for repeated names field by
/// field; larger ones through a set, so that the check stays linear.
const SMALL: usize = 32;

/// Leaves one field of each name: a name that repeats keeps its last value, as a
/// parsed object does, in the place of its first.
fn dedupe<K: std::ops::Deref<Target = str>, V>(entries: &mut Vec<(K, V)>) {
    // Pairs (first, later) of fields of one name, in the order of the later.
    let mut repeats = Vec::new();
    if entries.len() <= SMALL {
        // A name is compared with the others only when one before it has the same
        // length and ends (nearly never, in an object without repeats).
        let mut seen = 0u64;
        for i in 0..entries.len() {
            let n = entries[i].0.as_bytes();
            let (first, last) = (n.first().copied(), n.last().copied());
            let bit = 1u64
                << ((n.len()
                    + 7 * usize::from(first.unwrap_or(0))
                    + 13 * usize::from(last.unwrap_or(0)))
                    % 64);
            if seen & bit != 0 {
                if let Some(first) = entries[..i].iter().position(|(m, _)| **m == *entries[i].0) {
                    repeats.push((first, i));
                }
            }
            seen |= bit;
        }
    } else {
        let mut first: std::collections::HashMap<&str, usize> =
            std::collections::HashMap::with_capacity(entries.len());
        for (i, (n, _)) in entries.iter().enumerate() {
            if let Some(&f) = first.get(&**n) {
                repeats.push((f, i));
            } else {
                first.insert(n, i);
            }
        }
    }
    if repeats.is_empty() {
        return;
    }
    let mut dropped = vec![false; entries.len()];
    for (first, i) in repeats {
        let (head, tail) = entries.split_at_mut(i);
        std::mem::swap(&mut head[first].1, &mut tail[0].1);
        dropped[i] = true;
    }
    let mut i = 0;
    entries.retain(|_| {
        i += 1;
        !dropped[i - 1]
    });
}

impl<'a> Fields<'a> {
    /// The fields of `text`: `Ok(None)` when it is JSON but not an object, an error
    /// when it is not JSON. What is JSON is what the `json` format accepts
    /// ([`crate::formats::json::validate_json`]): what parses into a value.
    pub fn parse(text: &'a [u8]) -> Result<Option<Fields<'a>>, String> {
        let mut d = serde_json::Deserializer::from_slice(text);
        let object = text
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .is_some_and(|&b| b == b'{');
        let fields = if object {
            d.deserialize_map(Top)
        } else {
            de::Deserialize::deserialize(&mut d).map(|de::IgnoredAny| None)
        };
        let fields = fields
            .and_then(|f| d.end().map(|()| f))
            .map_err(|e| e.to_string())?;
        // The fields' values were skipped over, which checks their syntax alone.
        crate::formats::json::validate_skipped_json(text)?;
        Ok(fields)
    }

    /// The fields of `text`, a JSON text known to parse (the source checked it, or
    /// lockgate wrote it), found by its structure alone: one pass, none of the checks
    /// of [`Fields::parse`], with the same result for such a text. `None` when the text
    /// is not an object, or not laid out as a text that parses would be: the caller
    /// then parses it, which says why.
    pub fn split(text: &'a [u8]) -> Option<Fields<'a>> {
        let s = std::str::from_utf8(text).ok()?;
        let b = s.as_bytes();
        let mut i = skip_ws(b, 0);
        if b.get(i) != Some(&b'{') {
            return None;
        }
        i = skip_ws(b, i + 1);
        let mut entries = Vec::with_capacity(16);
        if b.get(i) == Some(&b'}') {
            i += 1;
        } else {
            loop {
                if b.get(i) != Some(&b'"') {
                    return None;
                }
                let (end, escaped) = string_end(b, i)?;
                let name = if escaped {
                    Cow::Owned(serde_json::from_str::<String>(&s[i..=end]).ok()?)
                } else {
                    Cow::Borrowed(&s[i + 1..end])
                };
                i = skip_ws(b, end + 1);
                if b.get(i) != Some(&b':') {
                    return None;
                }
                let start = skip_ws(b, i + 1);
                let stop = value_end(b, start)?;
                entries.push((name, Cow::Borrowed(&s[start..stop])));
                i = skip_ws(b, stop);
                match b.get(i) {
                    Some(b',') => i = skip_ws(b, i + 1),
                    Some(b'}') => {
                        i += 1;
                        break;
                    }
                    _ => return None,
                }
            }
        }
        if skip_ws(b, i) != b.len() {
            return None;
        }
        dedupe(&mut entries);
        Some(Fields { entries })
    }

    /// The text of the value of field `name`, if it has one, as the fields hold it (a
    /// copy of the reference when it is the record's own text).
    pub fn get_cow(&self, name: &str) -> Option<Cow<'a, str>> {
        self.entries
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    }

    /// The text of each field's value, in order.
    pub fn values(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(_, v)| &**v)
    }

    /// Drops every field.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// The text of the value of field `name`, if it has one.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| &**v)
    }

    /// Sets field `name` to the JSON text `value`: in its place when it exists, else
    /// last. `value` must be one JSON value.
    pub fn set(&mut self, name: &'a str, value: impl Into<Cow<'a, str>>) {
        let value = value.into();
        match self.entries.iter_mut().find(|(n, _)| n == name) {
            Some(e) => e.1 = value,
            None => self.entries.push((Cow::Borrowed(name), value)),
        }
    }

    /// Keeps the fields `keep` says to keep, each under the name `rename` gives it (the
    /// same name when `None`); `target` says whether a name is one that `rename` gives.
    /// When two fields end with one name, the one whose original name sorts last wins,
    /// as when the fields are rebuilt in their names' order.
    pub fn retain_renamed(
        &mut self,
        keep: impl Fn(&str) -> bool,
        rename: impl Fn(&str) -> Option<&'a str>,
        target: impl Fn(&str) -> bool,
    ) {
        // In place: the fields kept so far are `entries[..kept]`, each moved there
        // from where it was; what is left beyond is dropped at the end.
        let mut kept = 0;
        // The position and original name of each kept field that may collide.
        let mut origins: smallvec::SmallVec<[(usize, Cow<'a, str>); 4]> = smallvec::SmallVec::new();
        for at in 0..self.entries.len() {
            let name = &self.entries[at].0;
            if !keep(name) {
                continue;
            }
            // A name neither renamed nor a rename's target is unique as it is.
            let new = match rename(name) {
                Some(r) => Cow::Borrowed(r),
                None if target(name) => name.clone(),
                None => {
                    self.entries.swap(kept, at);
                    kept += 1;
                    continue;
                }
            };
            match self.entries[..kept].iter().position(|(n, _)| *n == new) {
                Some(i) => {
                    // `new` is renamed or a rename's target, so the field it meets was
                    // one too, and has its origin.
                    if let Some((_, o)) = origins.iter_mut().find(|(p, _)| *p == i) {
                        if self.entries[at].0 > *o {
                            let (value, name) = {
                                let e = &mut self.entries[at];
                                (std::mem::take(&mut e.1), std::mem::take(&mut e.0))
                            };
                            self.entries[i].1 = value;
                            *o = name;
                        }
                    }
                }
                None => {
                    let old = std::mem::replace(&mut self.entries[at].0, new);
                    origins.push((kept, old));
                    self.entries.swap(kept, at);
                    kept += 1;
                }
            }
        }
        self.entries.truncate(kept);
    }

    /// The object's JSON text.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.reserve(
            2 + self
                .entries
                .iter()
                .map(|(n, v)| n.len() + v.len() + 4)
                .sum::<usize>(),
        );
        out.push(b'{');
        for (i, (name, value)) in self.entries.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            if name.bytes().any(|c| c == b'"' || c == b'\\' || c < 0x20) {
                serde_json::to_writer(&mut *out, name).expect("a string serializes");
            } else {
                out.push(b'"');
                out.extend_from_slice(name.as_bytes());
                out.push(b'"');
            }
            out.push(b':');
            // Written compact, as a parsed value is (a transform's own text is
            // compact already, and passes through as it is).
            write_compact(value, out);
        }
        out.push(b'}');
    }

    /// The object as a parsed value, or why a field's text does not parse (not
    /// reached for fields [`Fields::parse`] accepted and values [`Fields::set`] was
    /// given as JSON).
    pub fn to_value(&self) -> Result<serde_json::Value, String> {
        let mut m = serde_json::Map::new();
        for (name, value) in &self.entries {
            let v = serde_json::from_str(value).map_err(|e| e.to_string())?;
            m.insert(name.to_string(), v);
        }
        Ok(serde_json::Value::Object(m))
    }
}

/// Whether an object inside the JSON text `v` (one valid value) may repeat a name:
/// true when one does, and when a name has an escape (which may spell another name).
/// A parse keeps only the last value of a repeated name; a copy of the text keeps
/// both.
pub fn nested_names_repeat(v: &str) -> bool {
    let b = v.as_bytes();
    if !b.contains(&b'{') {
        return false;
    }
    /// The names of an object so far, `None` for an array.
    type Names<'t> = Option<smallvec::SmallVec<[&'t [u8]; 8]>>;
    // Per open bracket.
    let mut open: smallvec::SmallVec<[Names; 4]> = smallvec::SmallVec::new();
    let mut expect_name = false;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'{' => {
                open.push(Some(smallvec::SmallVec::new()));
                expect_name = true;
            }
            b'[' => {
                open.push(None);
                expect_name = false;
            }
            b'}' | b']' => {
                open.pop();
                expect_name = false;
            }
            b',' => expect_name = matches!(open.last(), Some(Some(_))),
            b'"' => {
                let Some((end, escaped)) = string_end(b, i) else {
                    return true;
                };
                if expect_name {
                    let name = &b[i + 1..end];
                    match open.last_mut() {
                        Some(Some(names)) if !escaped && !names.contains(&name) => names.push(name),
                        _ => return true,
                    }
                    expect_name = false;
                }
                i = end;
            }
            _ => {}
        }
        i += 1;
    }
    false
}

/// The first position at or after `i` that is not JSON whitespace.
fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\n' | b'\r' | b'\t') {
        i += 1;
    }
    i
}

/// The position of the quote that closes the string opening at `i`, and whether the
/// string has escapes; `None` when it does not close.
fn string_end(b: &[u8], i: usize) -> Option<(usize, bool)> {
    let mut j = i + 1;
    let mut escaped = false;
    loop {
        j += memchr::memchr2(b'"', b'\\', b.get(j..)?)?;
        if b[j] == b'"' {
            return Some((j, escaped));
        }
        escaped = true;
        j += 2;
    }
}

/// The position just after the value that starts at `i`; `None` when there is none.
fn value_end(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => string_end(b, i).map(|(end, _)| end + 1),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match b[j] {
                    b'"' => j = string_end(b, j)?.0,
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        // A number, `true`, `false` or `null`: up to what ends it.
        _ => {
            let end = b[i..]
                .iter()
                .position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t'))
                .map_or(b.len(), |n| i + n);
            (end > i).then_some(end)
        }
    }
}

/// Writes the JSON text `v` (one valid value) compact, as `serde_json` writes its
/// value: no whitespace outside strings, each string with only the escapes it needs.
/// A number's text is copied as it is.
fn write_compact(v: &str, out: &mut Vec<u8>) {
    let b = v.as_bytes();
    let mut i = 0;
    while i < b.len() {
        // Up to the next string or whitespace, the text is copied as it is.
        let run = b[i..]
            .iter()
            .position(|&c| matches!(c, b'"' | b' ' | b'\n' | b'\r' | b'\t'))
            .map_or(b.len(), |n| i + n);
        out.extend_from_slice(&b[i..run]);
        i = run;
        match b.get(i) {
            None => break,
            Some(b'"') => {
                let Some((end, escaped)) = string_end(b, i) else {
                    // Not reached for a valid value: what is left, as it is.
                    out.extend_from_slice(&b[i..]);
                    break;
                };
                let string = &v[i..=end];
                // A string without escapes is written as it is (its whitespace is
                // its content); one with escapes as a parse would write it.
                match escaped
                    .then(|| serde_json::from_str::<String>(string).ok())
                    .flatten()
                {
                    Some(s) => serde_json::to_writer(&mut *out, &s).expect("a string serializes"),
                    None => out.extend_from_slice(string.as_bytes()),
                }
                i = end + 1;
            }
            // Whitespace between tokens.
            Some(_) => i += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(f: &Fields) -> String {
        let mut out = Vec::new();
        f.write(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn untouched_fields_keep_their_numbers_text_and_order() {
        let src =
            br#"{"z":1.50,"a":{"n":12345678901234567890123456789, "b" : [1, 2]},"s":"\u00e9\n"}"#;
        let f = Fields::parse(src).unwrap().unwrap();
        // Compact, each string with the escapes a parsed value is written with.
        assert_eq!(
            text(&f),
            r#"{"z":1.50,"a":{"n":12345678901234567890123456789,"b":[1,2]},"s":"é\n"}"#
        );
        assert_eq!(f.get("z"), Some("1.50"));
    }

    #[test]
    fn splitting_a_checked_text_finds_what_parsing_finds() {
        let texts = [
            r#"{}"#,
            r#"  { }  "#,
            r#"{"a":1}"#,
            "{ \"a\" :\n\t1.50e+3 , \"b\":[ 1, {\"c\": \"}]\\\"\"} ] ,\"d\":null}\n",
            r#"{"a\"b":"x\\","\u0061":true,"a":false,"e":{"f":{"g":[[],{}]}},"h":-0}"#,
            r#"{"s":"é\u00e9","t":"\\\\","u":""}"#,
            r#"[1,2]"#,
            r#""{}""#,
            r#"12"#,
        ];
        for t in texts {
            let parsed = Fields::parse(t.as_bytes()).unwrap();
            assert_eq!(Fields::split(t.as_bytes()), parsed, "{t}");
        }
    }

    #[test]
    fn repeated_names_inside_values_are_found() {
        for (v, yes) in [
            (r#"1"#, false),
            (r#""{\"k\":1,\"k\":2}""#, false),
            (r#"{"k":1,"j":{"k":2}}"#, false),
            (r#"[{"k":1},{"k":2}]"#, false),
            (r#"{"a":["k","k"],"b":"k"}"#, false),
            (r#"{"k":1,"k":2}"#, true),
            (r#"[1,{"m":{"k":1,"k":2}}]"#, true),
            (r#"{"k":1,"\u006b":2}"#, true),
            (r#"{ "k" : [ ] , "k" : 2 }"#, true),
        ] {
            assert_eq!(nested_names_repeat(v), yes, "{v}");
        }
    }

    #[test]
    fn a_text_that_does_not_close_is_left_to_the_parse() {
        for t in [
            r#"{"a":1"#,
            r#"{"a":"#,
            r#"{"a":[1,2}"#,
            r#"{"a":"x}"#,
            r#"{"a" 1}"#,
            r#"{"a":1} x"#,
            r#"{"a":}"#,
            r#"{"a":1,}"#,
        ] {
            assert_eq!(Fields::split(t.as_bytes()), None, "{t}");
        }
    }

    proptest::proptest! {
        #[test]
        fn split_and_parse_agree_on_any_object(v in json_object(), pretty in proptest::bool::ANY) {
            let written = if pretty { serde_json::to_vec_pretty(&v) } else { serde_json::to_vec(&v) }.unwrap();
            let parsed = Fields::parse(&written).unwrap();
            proptest::prop_assert!(parsed.is_some());
            proptest::prop_assert_eq!(Fields::split(&written), parsed.clone());
            // Written back compact, as the parsed value is written (strings with
            // spaces, escapes and nested values among them).
            proptest::prop_assert_eq!(text(&parsed.unwrap()), serde_json::to_string(&v).unwrap());
        }

        #[test]
        fn split_and_parse_agree_on_repeated_and_escaped_names(
            fields in proptest::collection::vec((0usize..5, json_object(), 0usize..4), 0..8),
        ) {
            // Names as written: some spell one name two ways, some repeat.
            const NAMES: [&str; 5] = ["a", "\\u0061", "b", "c\\\"d", "1E+2"];
            const SPACES: [&str; 4] = ["", " ", "\n\t", "\r\n "];
            let body: Vec<String> = fields
                .iter()
                .map(|(n, v, w)| format!("{w}\"{}\"{w}:{w}{}{w}", NAMES[*n], v, w = SPACES[*w]))
                .collect();
            let text = format!("{{{}}}", body.join(","));
            let parsed = Fields::parse(text.as_bytes()).unwrap();
            proptest::prop_assert!(parsed.is_some());
            proptest::prop_assert_eq!(Fields::split(text.as_bytes()), parsed);
        }
    }

    /// Objects of any JSON values, names with escapes among them.
    fn json_object() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(serde_json::Value::from),
            "[a-z\"\\\\{}\\[\\],: é\n]{0,8}".prop_map(serde_json::Value::from),
        ];
        let value = leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                proptest::collection::btree_map("[a-c\"\\\\]{0,3}", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        });
        proptest::collection::btree_map("[a-d\"\\\\ ]{0,3}", value, 0..6)
            .prop_map(|m| serde_json::Value::Object(m.into_iter().collect()))
    }

    #[test]
    fn what_is_not_an_object_or_not_json() {
        for v in ["[1,{\"a\":2}]", "1.0", "\"s\"", "null", "true"] {
            assert_eq!(Fields::parse(v.as_bytes()).unwrap(), None, "{v}");
        }
        for v in ["{\"a\":}", "{\"a\":1} x", "{\"a\":1", "", "{\"a\":[1,}"] {
            assert!(Fields::parse(v.as_bytes()).is_err(), "{v}");
        }
    }

    #[test]
    fn a_repeated_name_keeps_its_last_value_in_the_place_of_its_first() {
        let f = Fields::parse(br#"{"a":1,"b":2,"a":3}"#).unwrap().unwrap();
        assert_eq!(text(&f), r#"{"a":3,"b":2}"#);
        let f = Fields::parse(br#"{"a":1,"\u0061":2,"b":3,"a":4}"#)
            .unwrap()
            .unwrap();
        assert_eq!(text(&f), r#"{"a":4,"b":3}"#);
        // Above the size checked field by field: the same, through a set.
        for n in [SMALL - 1, SMALL, SMALL + 1, 3 * SMALL] {
            let names: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
            let mut src: Vec<String> = names.iter().map(|k| format!("\"{k}\":0")).collect();
            src.push(r#""k1":1"#.into());
            src.push(r#""k0":2"#.into());
            src.push(r#""k1":3"#.into());
            let src = format!("{{{}}}", src.join(","));
            let f = Fields::parse(src.as_bytes()).unwrap().unwrap();
            let mut want: Vec<String> = names.iter().map(|k| format!("\"{k}\":0")).collect();
            want[0] = r#""k0":2"#.into();
            want[1] = r#""k1":3"#.into();
            assert_eq!(text(&f), format!("{{{}}}", want.join(",")), "{n} fields");
        }
    }

    #[test]
    fn escaped_names_are_written_escaped() {
        let mut f = Fields::parse(br#"{"a\"b":1}"#).unwrap().unwrap();
        f.set("new\n", "2");
        assert_eq!(text(&f), r#"{"a\"b":1,"new\n":2}"#);
        assert_eq!(f.get("a\"b"), Some("1"));
    }

    #[test]
    fn renames_that_collide_keep_the_field_named_last() {
        // Table: (fields, renames, result), as rebuilding a map in name order gives.
        type Renames<'r> = &'r [(&'r str, &'r str)];
        let cases: &[(&str, Renames, &str)] = &[
            (r#"{"a":1,"b":2}"#, &[("a", "b")], r#"{"b":2}"#),
            (r#"{"b":2,"a":1}"#, &[("a", "b")], r#"{"b":2}"#),
            (r#"{"a":1,"b":2}"#, &[("b", "a")], r#"{"a":2}"#),
            (r#"{"b":2,"a":1}"#, &[("b", "a")], r#"{"a":2}"#),
            (
                r#"{"a":1,"b":2}"#,
                &[("a", "b"), ("b", "a")],
                r#"{"b":1,"a":2}"#,
            ),
        ];
        for (src, renames, want) in cases {
            let mut f = Fields::parse(src.as_bytes()).unwrap().unwrap();
            f.retain_renamed(
                |_| true,
                |n| {
                    renames
                        .iter()
                        .find(|(from, _)| *from == n)
                        .map(|(_, to)| *to)
                },
                |n| renames.iter().any(|(_, to)| *to == n),
            );
            assert_eq!(text(&f), *want, "{src} {renames:?}");
            // The same object as the map the fields would be rebuilt into.
            let mut m = serde_json::Map::new();
            let v: serde_json::Value = serde_json::from_str(src).unwrap();
            for (k, v) in v.as_object().unwrap() {
                let n = renames
                    .iter()
                    .find(|(from, _)| from == k)
                    .map_or(k.as_str(), |(_, to)| to);
                m.insert(n.to_string(), v.clone());
            }
            assert_eq!(f.to_value(), Ok(serde_json::Value::Object(m)), "{src}");
        }
    }
}
