//! `set_key` (Kafka Connect's `ValueToKey` followed by `ExtractField$Key`): the record's
//! key becomes a field of its value.

use super::fields::field_of;
use super::{Meta, Parts, Smt, SmtConfig};
use crate::connector::{KeyError, SectionContext};
use crate::record::json_kind;
use serde_json::{Map, Value};
use std::sync::Arc;

/// `field = "/id"`: the key is that field's value (a string's text, any other value's
/// JSON); or `fields = ["/a", "/b"]`: the key is the JSON object of those fields, each
/// under the last segment of its pointer, names sorted (`{"a":...,"b":...}`), as
/// `ValueToKey` makes a struct of them. A field that is absent fails the record.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetKey {
    pub field: Option<String>,
    pub fields: Option<Vec<String>>,
}

#[derive(Debug)]
enum Key {
    One(String),
    Several(Vec<(String, String)>),
}

impl SmtConfig for SetKey {
    const KIND: &'static str = "set_key";
    fn build(self, _: &SectionContext) -> Result<Arc<dyn Smt>, KeyError> {
        match (self.field, self.fields) {
            (Some(f), None) if !f.is_empty() => Ok(Arc::new(Key::One(f))),
            (None, Some(fs)) if !fs.is_empty() => {
                let named = fs
                    .into_iter()
                    .map(|f| {
                        let name = f.rsplit('/').next().unwrap_or(&f).to_string();
                        (f, name)
                    })
                    .collect();
                Ok(Arc::new(Key::Several(named)))
            }
            _ => Err(KeyError::new(
                "field",
                "give field (one field) or fields (several), not both",
            )),
        }
    }
}

impl Smt for Key {
    /// A record without a value (a tombstone, a delete of its key) takes its key from
    /// the fields of its key when that is a JSON object (Debezium's `{"id": 7}`), so
    /// that it names the document its writes went to; with any other key it fails, as
    /// Kafka Connect's `ValueToKey` fails on a tombstone (passed on unchanged, it would
    /// delete under its old key).
    fn expand(&self, mut parts: Parts, meta: &Meta, out: &mut Vec<Parts>) -> Result<(), String> {
        if parts.tombstone {
            let key = parts
                .key
                .as_deref()
                .and_then(|k| serde_json::from_slice::<Value>(k).ok())
                .filter(Value::is_object)
                .ok_or(
                    "a record without a value whose key is not a JSON object has nothing to take the key from: drop tombstones before set_key (filter with is_tombstone = true)",
                )?;
            let mut from_key = Parts::of_value(key);
            self.apply(&mut from_key, meta)?;
            parts.key = from_key.key;
        } else {
            self.apply(&mut parts, meta)?;
        }
        out.push(parts);
        Ok(())
    }

    fn apply(&self, parts: &mut Parts, _: &Meta) -> Result<(), String> {
        if !parts.value.is_object() {
            return Err(format!(
                "set_key needs a JSON object, the value is {}",
                json_kind(&parts.value)
            ));
        }
        let get = |f: &str| field_of(&parts.value, f).ok_or_else(|| format!("no field {f}"));
        parts.key = Some(match self {
            Key::One(f) => match get(f)? {
                Value::String(s) => s.clone().into_bytes(),
                other => other.to_string().into_bytes(),
            },
            Key::Several(fs) => {
                let mut o = Map::new();
                for (f, name) in fs {
                    o.insert(name.clone(), get(f)?.clone());
                }
                Value::Object(o).to_string().into_bytes()
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(toml_text: &str, value: Value) -> Result<Option<String>, String> {
        let c: SetKey = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        let cx = crate::testkit::conformance::section_context(std::path::Path::new("."));
        let smt = c
            .build(&cx)
            .map_err(|e| format!("{}: {}", e.key, e.message))?;
        let mut parts = Parts {
            key: Some(b"old".to_vec()),
            ..Parts::of_value(value)
        };
        smt.apply(&mut parts, &Meta::default())?;
        Ok(parts.key.map(|k| String::from_utf8(k).unwrap()))
    }

    /// Kafka Connect's ValueToKey example (`fields=userId,city,state`) and
    /// ExtractField$Key (`field=userId`).
    #[test]
    fn the_key_becomes_a_field_or_an_object_of_several() {
        let v = json!({"userId": 5, "city": "Lyon", "state": null, "name": "ann", "tenant": {"id": "t1"}});
        assert_eq!(key("field = \"userId\"", v.clone()), Ok(Some("5".into())));
        assert_eq!(key("field = \"city\"", v.clone()), Ok(Some("Lyon".into())));
        assert_eq!(
            key("field = \"/tenant/id\"", v.clone()),
            Ok(Some("t1".into()))
        );
        assert_eq!(
            key("fields = [\"userId\", \"city\", \"state\"]", v.clone()),
            Ok(Some(r#"{"city":"Lyon","state":null,"userId":5}"#.into()))
        );
        assert_eq!(
            key("fields = [\"/tenant/id\"]", v.clone()),
            Ok(Some(r#"{"id":"t1"}"#.into()))
        );
        assert!(key("field = \"nope\"", v.clone())
            .unwrap_err()
            .contains("no field nope"));
        assert!(key("field = \"a\"\nfields = [\"b\"]", v.clone()).is_err());
        assert!(key("", v).is_err());
        assert!(key("field = \"a\"", json!("x")).is_err());
    }

    #[test]
    fn a_record_without_a_value_is_keyed_from_its_json_key() {
        let c: SetKey = toml::from_str("field = \"/id\"").unwrap();
        let smt = c
            .build(&crate::testkit::conformance::section_context(
                std::path::Path::new("."),
            ))
            .unwrap();
        let tomb = Parts {
            key: Some(b"old".to_vec()),
            tombstone: true,
            ..Parts::of_value(Value::Null)
        };
        let e = smt
            .expand(tomb.clone(), &Meta::default(), &mut Vec::new())
            .unwrap_err();
        assert!(e.contains("not a JSON object"), "{e}");
        // A JSON key (Debezium's) gives the fields instead.
        let keyed = Parts {
            key: Some(br#"{"id":7}"#.to_vec()),
            ..tomb
        };
        let mut out = Vec::new();
        smt.expand(keyed, &Meta::default(), &mut out).unwrap();
        assert_eq!(out[0].key.as_deref(), Some(&b"7"[..]));
        assert!(out[0].tombstone);
    }
}
