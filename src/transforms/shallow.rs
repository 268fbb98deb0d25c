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
            // A name that repeats keeps its last value, as a parsed object does.
            match entries.iter_mut().find(|(n, _)| *n == k) {
                Some(e) => e.1 = Cow::Borrowed(v.get()),
                None => entries.push((k, Cow::Borrowed(v.get()))),
            }
        }
        Ok(Some(Fields { entries }))
    }
}

impl<'a> Fields<'a> {
    /// The fields of `text`: `Ok(None)` when it is JSON but not an object, an error
    /// when it is not JSON.
    pub fn parse(text: &'a [u8]) -> Result<Option<Fields<'a>>, serde_json::Error> {
        let mut d = serde_json::Deserializer::from_slice(text);
        let object = text
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .is_some_and(|&b| b == b'{');
        let fields = if object {
            d.deserialize_map(Top)?
        } else {
            de::Deserialize::deserialize(&mut d).map(|de::IgnoredAny| None)?
        };
        d.end()?;
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
                Some(i) => match origins.iter_mut().find(|(at, _)| *at == i) {
                    Some((_, o)) => {
                        if name > *o {
                            self.entries[i].1 = value;
                            *o = name;
                        }
                    }
                    // Not reached (only checked names collide); kept as the rule says.
                    None => {
                        if name > self.entries[i].0 {
                            self.entries[i].1 = value;
                            origins.push((i, name));
                        }
                    }
                },
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
            out.extend_from_slice(value.as_bytes());
        }
        out.push(b'}');
    }

    /// The object as a parsed value.
    pub fn to_value(&self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        for (name, value) in &self.entries {
            m.insert(
                name.to_string(),
                serde_json::from_str(value).expect("the text of a JSON value"),
            );
        }
        serde_json::Value::Object(m)
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
    fn untouched_fields_keep_their_text_and_order() {
        let src =
            br#"{"z":1.50,"a":{"n":12345678901234567890123456789, "b" : [1, 2]},"s":"\u00e9\n"}"#;
        let f = Fields::parse(src).unwrap().unwrap();
        assert_eq!(
            text(&f),
            r#"{"z":1.50,"a":{"n":12345678901234567890123456789, "b" : [1, 2]},"s":"\u00e9\n"}"#
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
    fn a_repeated_name_keeps_its_last_value() {
        let f = Fields::parse(br#"{"a":1,"b":2,"a":3}"#).unwrap().unwrap();
        assert_eq!(text(&f), r#"{"a":3,"b":2}"#);
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
            assert_eq!(f.to_value(), serde_json::Value::Object(m), "{src}");
        }
    }
}
