//! A record's JSON value read as columns: the raw JSON of each column's field, the
//! object parsed once per record, every value in its own text (a number keeps its
//! digits: `1.10` stays `1.10`, `12345678901234567890` is not rounded through a
//! float). What a sink into a table (a database, a columnar file) starts from.
//!
//! ```
//! use lockgate::columns::{Columns, Json};
//! let columns = Columns::new(["/id", "/price", "/customer/name"]).unwrap();
//! let row = columns.read(br#"{"id":7,"price":1.10,"customer":{"name":"Ada"}}"#).unwrap();
//! assert_eq!(Json::of(row[1].unwrap()).unwrap(), Json::Number("1.10"));
//! assert_eq!(Json::of(row[2].unwrap()).unwrap(), Json::String("Ada".into()));
//! ```

use serde_json::value::RawValue;
use std::borrow::Cow;
use std::collections::HashMap;

/// The value at JSON pointer `pointer` of `root` (`""`: the root), as raw JSON; `None`
/// when absent. Only the objects and arrays on the way are parsed.
pub fn raw_pointer<'a>(root: &'a RawValue, pointer: &str) -> Option<&'a RawValue> {
    if pointer.is_empty() {
        return Some(root);
    }
    let mut at = root;
    for token in pointer.strip_prefix('/')?.split('/') {
        let token = token.replace("~1", "/").replace("~0", "~");
        at = match at.get().as_bytes().first() {
            Some(b'{') => {
                let m: HashMap<String, &RawValue> = serde_json::from_str(at.get()).ok()?;
                m.get(&token).copied()?
            }
            Some(b'[') => {
                let v: Vec<&RawValue> = serde_json::from_str(at.get()).ok()?;
                v.get(token.parse::<usize>().ok()?).copied()?
            }
            _ => return None,
        };
    }
    Some(at)
}

/// A JSON value parsed once, with its top-level fields when it is an object:
/// pointers of one token (the usual case) are answered from them, deeper ones by
/// [`raw_pointer`].
pub struct Fields<'a> {
    root: &'a RawValue,
    top: Top<'a>,
}

/// The top-level fields: borrowed names (no allocation per field), or owned ones when
/// a name has escapes.
enum Top<'a> {
    Borrowed(HashMap<&'a str, &'a RawValue>),
    Owned(HashMap<String, &'a RawValue>),
    /// Not an object.
    None,
}

impl<'a> Fields<'a> {
    /// The JSON text `bytes`; `None` when it is not JSON.
    pub fn of(bytes: &'a [u8]) -> Option<Fields<'a>> {
        let text = std::str::from_utf8(bytes).ok()?;
        let root: &RawValue = serde_json::from_str(text).ok()?;
        let top = if !root.get().starts_with('{') {
            Top::None
        } else {
            match serde_json::from_str(root.get()) {
                Ok(m) => Top::Borrowed(m),
                Err(_) => Top::Owned(serde_json::from_str(root.get()).ok()?),
            }
        };
        Some(Fields { root, top })
    }

    /// The whole value.
    pub fn root(&self) -> &'a RawValue {
        self.root
    }

    /// Whether the value is a JSON object.
    pub fn is_object(&self) -> bool {
        !matches!(self.top, Top::None)
    }

    /// The value at JSON pointer `pointer` (`""`: the whole value); `None` when absent.
    pub fn get(&self, pointer: &str) -> Option<&'a RawValue> {
        match (pointer.strip_prefix('/'), &self.top) {
            (Some(t), Top::Borrowed(m)) if !t.contains('/') && !t.contains('~') => {
                m.get(t).copied()
            }
            (Some(t), Top::Owned(m)) if !t.contains('/') && !t.contains('~') => m.get(t).copied(),
            _ => raw_pointer(self.root, pointer),
        }
    }
}

/// Which field each column of a table takes: one JSON pointer per column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Columns {
    pointers: Vec<String>,
}

impl Columns {
    /// Columns taking the fields at `pointers` (`/id`, `/customer/name`, `""` for the
    /// whole value). An error names a pointer that is not one.
    pub fn new<S: Into<String>>(pointers: impl IntoIterator<Item = S>) -> Result<Columns, String> {
        let pointers: Vec<String> = pointers.into_iter().map(Into::into).collect();
        for p in &pointers {
            if !p.is_empty() && !p.starts_with('/') {
                return Err(format!(
                    "`{p}` is not a JSON pointer: it starts with / (`/{p}` for the field {p})"
                ));
            }
        }
        Ok(Columns { pointers })
    }

    /// Columns named as the top-level fields they take (`id` takes `/id`; `/` and
    /// `~` in a name are escaped).
    pub fn by_name<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> Columns {
        Columns {
            pointers: names
                .into_iter()
                .map(|n| format!("/{}", n.as_ref().replace('~', "~0").replace('/', "~1")))
                .collect(),
        }
    }

    /// The pointers, in column order.
    pub fn pointers(&self) -> &[String] {
        &self.pointers
    }

    /// The raw JSON of each column's field in `value`, in column order (`None`: the
    /// record has no such field). An error when `value` is not a JSON object.
    pub fn read<'a>(&self, value: &'a [u8]) -> Result<Vec<Option<&'a RawValue>>, String> {
        let fields = Fields::of(value).ok_or("the value is not JSON")?;
        if !fields.is_object() {
            return Err("the value is not a JSON object".into());
        }
        Ok(self.pointers.iter().map(|p| fields.get(p)).collect())
    }
}

/// One raw JSON value by its kind, each in its own text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Json<'a> {
    Null,
    Bool(bool),
    /// The number's text as written: never rounded through a float.
    Number(&'a str),
    /// The string, unescaped.
    String(Cow<'a, str>),
    /// An object or an array, as its JSON text.
    Object(&'a str),
    Array(&'a str),
}

impl<'a> Json<'a> {
    /// The kind and text of `raw`; an error only for a string with a bad escape.
    pub fn of(raw: &'a RawValue) -> Result<Json<'a>, String> {
        let text = raw.get();
        Ok(match text.as_bytes().first() {
            Some(b'n') => Json::Null,
            Some(b't') => Json::Bool(true),
            Some(b'f') => Json::Bool(false),
            Some(b'"') => Json::String(
                serde_json::from_str::<Cow<'a, str>>(text)
                    .map_err(|e| format!("bad JSON string: {e}"))?,
            ),
            Some(b'{') => Json::Object(text),
            Some(b'[') => Json::Array(text),
            _ => Json::Number(text),
        })
    }

    /// The value as a column's text: `None` for null; a string unescaped; anything
    /// else in its JSON text (a number as written, `true`, an object or array whole).
    pub fn text(&self) -> Option<Cow<'a, str>> {
        match self {
            Json::Null => None,
            Json::Bool(b) => Some(Cow::Borrowed(if *b { "true" } else { "false" })),
            Json::Number(t) | Json::Object(t) | Json::Array(t) => Some(Cow::Borrowed(t)),
            Json::String(s) => Some(s.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointers_reach_nested_fields_and_array_items() {
        let v: &RawValue = serde_json::from_str(r#"{"a":{"b/c":[10,{"d":"x"}]}}"#).unwrap();
        assert_eq!(raw_pointer(v, "/a/b~1c/1/d").unwrap().get(), "\"x\"");
        assert_eq!(raw_pointer(v, "/a/b~1c/0").unwrap().get(), "10");
        assert!(raw_pointer(v, "/a/b~1c/2").is_none());
        assert!(raw_pointer(v, "/a/x").is_none());
        assert!(raw_pointer(v, "a").is_none(), "not a pointer");
        assert_eq!(raw_pointer(v, "").unwrap().get(), v.get());
    }

    #[test]
    fn fields_with_escaped_names_are_found_too() {
        let f = Fields::of(br#"{"\u0061":1,"b":2}"#).unwrap();
        assert_eq!(f.get("/a").unwrap().get(), "1");
        assert_eq!(f.get("/b").unwrap().get(), "2");
        let not_object = Fields::of(b"[1,2]").unwrap();
        assert!(!not_object.is_object());
        assert_eq!(not_object.get("/1").unwrap().get(), "2");
        assert!(Fields::of(b"{nope").is_none());
    }

    #[test]
    fn columns_read_each_field_in_its_own_text() {
        let c = Columns::by_name(["id", "price", "big", "a/b", "missing", "tags", "ok"]);
        assert_eq!(c.pointers()[3], "/a~1b");
        let row = c
            .read(br#"{"id":"x\"y","price":1.10,"big":12345678901234567890,"a/b":null,"tags":[1, 2],"ok":true}"#)
            .unwrap();
        let text: Vec<Option<String>> = row
            .iter()
            .map(|r| r.and_then(|r| Json::of(r).unwrap().text().map(Cow::into_owned)))
            .collect();
        assert_eq!(
            text,
            vec![
                Some("x\"y".into()),
                Some("1.10".into()),
                Some("12345678901234567890".into()),
                None,
                None,
                Some("[1, 2]".into()),
                Some("true".into()),
            ]
        );
        assert!(row[4].is_none(), "absent, not null");
        assert!(row[3].is_some(), "null, not absent");
    }

    #[test]
    fn what_is_not_a_json_object_or_a_pointer_is_refused() {
        let c = Columns::by_name(["id"]);
        assert_eq!(
            c.read(b"[1]").unwrap_err(),
            "the value is not a JSON object"
        );
        assert_eq!(c.read(b"{").unwrap_err(), "the value is not JSON");
        assert!(Columns::new(["id"])
            .unwrap_err()
            .contains("`/id` for the field id"));
        assert!(Columns::new(["", "/a/0"]).is_ok());
    }
}
