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
        for i in 1..entries.len() {
            if let Some(first) = entries[..i].iter().position(|(n, _)| **n == *entries[i].0) {
                repeats.push((first, i));
            }
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

    /// The text of the value of field `name`, if it has one.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| &**v)
    }

    /// Sets field `name` to the JSON text `value`: in its place when it exists, else
    /// last. `value` must be one JSON value.
    pub fn set(&mut self, name: &str, value: String) {
        match self.entries.iter_mut().find(|(n, _)| n == name) {
            Some(e) => e.1 = Cow::Owned(value),
            None => self
                .entries
                .push((Cow::Owned(name.to_owned()), Cow::Owned(value))),
        }
    }

    /// Keeps the fields `keep` says to keep, each under the name `rename` gives it (the
    /// same name when `None`); `target` says whether a name is one that `rename` gives.
    /// When two fields end with one name, the one whose original name sorts last wins,
    /// as when the fields are rebuilt in their names' order.
    pub fn retain_renamed(
        &mut self,
        keep: impl Fn(&str) -> bool,
        rename: impl Fn(&str) -> Option<String>,
        target: impl Fn(&str) -> bool,
    ) {
        let n = self.entries.len();
        let old = std::mem::replace(&mut self.entries, Vec::with_capacity(n));
        // The position and original name of each kept field that may collide.
        let mut origins: Vec<(usize, Cow<'a, str>)> = Vec::new();
        for (name, value) in old {
            if !keep(&name) {
                continue;
            }
            // A name neither renamed nor a rename's target is unique as it is.
            let new = match rename(&name) {
                Some(r) => Cow::Owned(r),
                None if target(&name) => name.clone(),
                None => {
                    self.entries.push((name, value));
                    continue;
                }
            };
            match self.entries.iter().position(|(n, _)| *n == new) {
                Some(i) => {
                    // `new` is renamed or a rename's target, so the field it meets was
                    // one too, and has its origin.
                    if let Some((_, o)) = origins.iter_mut().find(|(at, _)| *at == i) {
                        if name > *o {
                            self.entries[i].1 = value;
                            *o = name;
                        }
                    }
                }
                None => {
                    origins.push((self.entries.len(), name));
                    self.entries.push((new, value));
                }
            }
        }
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
            match name {
                // A name borrowed from the text had no escapes there, and needs none.
                Cow::Borrowed(n) => {
                    out.push(b'"');
                    out.extend_from_slice(n.as_bytes());
                    out.push(b'"');
                }
                Cow::Owned(n) => serde_json::to_writer(&mut *out, n).expect("a string serializes"),
            }
            out.push(b':');
            match value {
                // From the text: written compact, as a parsed value is.
                Cow::Borrowed(v) => write_compact(v, out),
                // Written by a transform: compact already.
                Cow::Owned(v) => out.extend_from_slice(v.as_bytes()),
            }
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

/// Writes the JSON text `v` (one valid value) compact, as `serde_json` writes its
/// value: no whitespace outside strings, each string with only the escapes it needs.
/// A number's text is copied as it is.
fn write_compact(v: &str, out: &mut Vec<u8>) {
    let b = v.as_bytes();
    if !b
        .iter()
        .any(|&c| matches!(c, b' ' | b'\n' | b'\r' | b'\t' | b'\\'))
    {
        out.extend_from_slice(b);
        return;
    }
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b' ' | b'\n' | b'\r' | b'\t' => i += 1,
            b'"' => {
                // The closing quote: the first not escaped by a backslash.
                let mut j = i + 1;
                let mut escaped = false;
                while j < b.len() && (escaped || b[j] != b'"') {
                    escaped = !escaped && b[j] == b'\\';
                    j += 1;
                }
                let string = &v[i..(j + 1).min(b.len())];
                match string.contains('\\') {
                    true => match serde_json::from_str::<String>(string) {
                        Ok(s) => serde_json::to_writer(&mut *out, &s).expect("a string serializes"),
                        Err(_) => out.extend_from_slice(string.as_bytes()),
                    },
                    false => out.extend_from_slice(string.as_bytes()),
                }
                i = j + 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
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
        f.set("new\n", "2".into());
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
                        .map(|(_, to)| to.to_string())
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
