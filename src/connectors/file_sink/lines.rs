//! The JSON-lines format: one record's value per line, a delete as a line naming it.

use crate::record::Record;

/// The line a delete (or a tombstone) is written as:
/// `{"lockgate.delete":{"key":K,"before":V}}`, where `K` is the record's key as text
/// (base64 in `{"base64": ...}` when it is not UTF-8) or null, and `V` the image before
/// the delete or null.
pub fn delete_line(r: &Record) -> Vec<u8> {
    use base64::Engine;
    use serde_json::{json, Value};
    let key = match r.key.as_deref().map(std::str::from_utf8) {
        None => Value::Null,
        Some(Ok(k)) => Value::String(k.to_string()),
        Some(Err(_)) => json!({
            "base64": base64::engine::general_purpose::STANDARD.encode(r.key.as_deref().unwrap_or_default())
        }),
    };
    let before = if r.tombstone {
        Value::Null
    } else {
        serde_json::from_slice(&r.value)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&r.value).into_owned()))
    };
    serde_json::to_vec(&json!({ "lockgate.delete": { "key": key, "before": before } }))
        .expect("a JSON value serializes")
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Record;
    #[test]
    fn a_delete_is_a_line_naming_its_key_and_image() {
        use crate::record::Op;
        let line = |r: Record| String::from_utf8(delete_line(&r)).unwrap();
        let delete = Record {
            key: Some(b"u-1".to_vec().into()),
            value: br#"{"id":1}"#.to_vec().into(),
            op: Op::Delete,
            ..Record::default()
        };
        assert_eq!(
            line(delete.clone()),
            r#"{"lockgate.delete":{"before":{"id":1},"key":"u-1"}}"#
        );
        let tombstone = Record {
            key: Some(vec![0xff, 0x00].into()),
            value: Default::default(),
            tombstone: true,
            ..Record::default()
        };
        assert_eq!(
            line(tombstone),
            r#"{"lockgate.delete":{"before":null,"key":{"base64":"/wA="}}}"#
        );
    }
}
