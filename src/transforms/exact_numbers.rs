//! Every transform keeps a number's text: a 38-digit decimal, `1.50` and
//! `-0.000000000000000000001` leave each transform (and a chain of all of them) with
//! exactly the digits they came with, unless the transform computes a new value (jq
//! arithmetic, `cast` to a number type), which is a double.

use super::debezium::DebeziumConfig;
use super::fields::{Cast, ExtractField, Flatten, InsertField, MaskField, ReplaceField};
use super::filter::FilterConfig;
use super::jq::JqConfig;
use super::set_key::SetKey;
use super::time::TimestampConverter;
use super::{transform_all, Smt};
use crate::record::{Origin, Record};
use std::sync::Arc;

const BIG: &str = "12345678901234567890123456789012345678";
const SCALED: &str = "1.50";
const TINY: &str = "-0.000000000000000000001";

/// A row holding the three numbers at the top level and nested.
fn row() -> String {
    format!(
        r#"{{"id":"o-1","big":{BIG},"price":{SCALED},"tiny":{TINY},"nested":{{"big":{BIG},"price":{SCALED},"tiny":{TINY}}},"ts":1700000000000,"secret":"s"}}"#
    )
}

use super::built as smt;

/// Each transform with a configuration that leaves the three numbers in the value
/// (at the top level or flattened), and the value it is given.
fn transforms() -> Vec<(&'static str, Arc<dyn Smt>, String)> {
    let debezium_event = format!(r#"{{"before":null,"after":{},"op":"c","ts_ms":1}}"#, row());
    vec![
        (
            "insert_field",
            smt::<InsertField>("static = { source = \"k\" }\noffset_field = \"offset\""),
            row(),
        ),
        (
            "replace_field",
            smt::<ReplaceField>("rename = { secret = \"hidden\" }"),
            row(),
        ),
        (
            "extract_field",
            smt::<ExtractField>("field = \"nested\""),
            row(),
        ),
        ("flatten", smt::<Flatten>(""), row()),
        (
            "mask_field",
            smt::<MaskField>("fields = [\"secret\"]"),
            row(),
        ),
        ("cast", smt::<Cast>("spec = { id = \"string\" }"), row()),
        (
            "timestamp_converter",
            smt::<TimestampConverter>("field = \"ts\"\nto = \"%Y\""),
            row(),
        ),
        ("set_key", smt::<SetKey>("field = \"/id\""), row()),
        // A filter drops what its condition matches: this one keeps the record.
        (
            "filter",
            smt::<FilterConfig>("condition = \".price > 100\""),
            row(),
        ),
        ("jq identity", smt::<JqConfig>("filter = \".\""), row()),
        (
            "jq construction",
            smt::<JqConfig>("filter = \"{big, price, tiny, nested: .nested}\""),
            row(),
        ),
        ("debezium", smt::<DebeziumConfig>(""), debezium_event),
    ]
}

fn record(value: &str) -> Record {
    let mut r = Record::from_value(value.as_bytes().to_vec());
    r.origin = Some(Origin {
        stream: "orders".into(),
        partition: 0,
        offset: 7,
    });
    r.timestamp = Some(1_700_000_000_000);
    r
}

/// The text of each number in `out`, wherever it stands.
fn assert_exact(what: &str, out: &str) {
    for n in [BIG, SCALED, TINY] {
        let at = out.match_indices(n).map(|(i, _)| i).find(|&i| {
            let before = out[..i].chars().last();
            let after = out[i + n.len()..].chars().next();
            before == Some(':') && matches!(after, Some(',') | Some('}'))
        });
        assert!(at.is_some(), "{what}: {n} did not keep its text in {out}");
    }
}

#[test]
fn each_transform_keeps_the_text_of_numbers() {
    for (kind, smt, value) in transforms() {
        let mut out = Vec::new();
        transform_all(&[(kind.to_string(), smt)], record(&value), &mut out)
            .unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert_eq!(out.len(), 1, "{kind}");
        assert_exact(kind, std::str::from_utf8(&out[0].value).unwrap());
    }
}

#[test]
fn a_chain_of_every_transform_keeps_the_text_of_numbers() {
    // The debezium transform first (it unwraps the event), the extracting ones last.
    let mut all = transforms();
    let debezium = all.pop().expect("debezium is last");
    let (extract, rest): (Vec<_>, Vec<_>) = all
        .into_iter()
        .partition(|(k, _, _)| *k == "extract_field" || *k == "flatten");
    let chain: Vec<(String, Arc<dyn Smt>)> = std::iter::once(debezium)
        .chain(rest)
        .chain(
            extract
                .into_iter()
                .filter(|(k, _, _)| *k == "extract_field"),
        )
        .map(|(k, s, _)| (k.to_string(), s))
        .collect();
    let mut out = Vec::new();
    let event = format!(r#"{{"before":null,"after":{},"op":"c","ts_ms":1}}"#, row());
    transform_all(&chain, record(&event), &mut out).unwrap();
    assert_eq!(out.len(), 1);
    assert_exact("the chain", std::str::from_utf8(&out[0].value).unwrap());
}

#[test]
fn a_key_made_of_a_number_keeps_its_text() {
    let s = smt::<SetKey>("field = \"/big\"");
    let mut out = Vec::new();
    transform_all(&[("set_key".into(), s)], record(&row()), &mut out).unwrap();
    assert_eq!(out[0].key.as_deref(), Some(BIG.as_bytes()));
    let s = smt::<SetKey>("field = \"/tiny\"");
    let mut out = Vec::new();
    transform_all(&[("set_key".into(), s)], record(&row()), &mut out).unwrap();
    assert_eq!(out[0].key.as_deref(), Some(TINY.as_bytes()));
}
