//! A chain ([`super::transform_all`]) against the value parsed whole: what a parse
//! refuses fails the record at whichever step reads it first, whatever follows; what
//! it writes is compact, one record per line.

use super::fields::{Flatten, InsertField};
use super::{transform_all, Smt};
use crate::record::{Origin, Record};
use std::sync::Arc;

use super::built as smt;

fn record(value: &[u8]) -> Record {
    let mut r = Record::from_value(value.to_vec());
    r.origin = Some(Origin {
        stream: "orders".into(),
        partition: 3,
        offset: 7,
    });
    r.timestamp = Some(1_700_000_000_123);
    r
}

type Chain = Vec<(String, Arc<dyn Smt>)>;

fn insert() -> (String, Arc<dyn Smt>) {
    (
        "insert_field".into(),
        smt::<InsertField>("static = { x = 1 }"),
    )
}

fn flatten() -> (String, Arc<dyn Smt>) {
    ("flatten".into(), smt::<Flatten>(""))
}

/// The chain's outputs as text, or its error; a panic fails the test.
fn run(chain: &Chain, value: &[u8]) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    transform_all(chain, record(value), &mut out).map_err(|e| e.to_string())?;
    Ok(out
        .iter()
        .map(|r| String::from_utf8(r.value.to_vec()).unwrap())
        .collect())
}

#[test]
fn what_a_parse_refuses_fails_the_record_at_the_first_step_whatever_follows() {
    let deep = format!(r#"{{"a":{}{}}}"#, "[".repeat(200), "]".repeat(200));
    // Each passes a parser that skips nested values, and none parses into a value.
    let refused: &[(&[u8], &str)] = &[
        (
            br#"{"a":{"$serde_json::private::Number":"x"}}"#,
            "invalid number",
        ),
        (br#"{"a":"\ud800"}"#, "hex escape"),
        (br#"{"a":["\udc00"],"b":1}"#, "lone leading surrogate"),
        (deep.as_bytes(), "recursion limit exceeded"),
    ];
    let chains: Vec<Chain> = vec![vec![insert()], vec![insert(), flatten()]];
    for (value, why) in refused {
        assert!(serde_json::from_slice::<serde_json::Value>(value).is_err());
        for chain in &chains {
            let got = run(chain, value);
            let e = got.expect_err("refused");
            assert!(
                e.contains("insert_field: not valid JSON: ") && e.contains(why),
                "{}: {e}",
                String::from_utf8_lossy(value)
            );
        }
    }
}

#[test]
fn a_kept_value_is_written_compact_with_its_strings_as_a_parse_writes_them() {
    // (value, what insert_field then writes): whitespace outside strings goes, a
    // string's escapes become what serde_json writes, a number keeps its text.
    let cases: &[(&str, &str)] = &[
        (
            "{\"a\": {\n  \"b\": 1\n},\"s\":\"\\u00e9\"}",
            r#"{"a":{"b":1},"s":"é","x":1}"#,
        ),
        (
            "{\"a\" : [ 1.50 , \"x y\" ,\t{ \"k\\u0041\" : \"a\\/b\\\"c\\\\\" } ]\r\n}",
            r#"{"a":[1.50,"x y",{"kA":"a/b\"c\\"}],"x":1}"#,
        ),
        (
            r#"{"a":"\u0001\n\ud83d\ude00 \u2028","b":{"c":-0,"d":1E+2}}"#,
            "{\"a\":\"\\u0001\\n\u{1f600} \u{2028}\",\"b\":{\"c\":-0,\"d\":1E+2},\"x\":1}",
        ),
    ];
    for (value, want) in cases {
        let got = run(&vec![insert()], value.as_bytes()).unwrap();
        assert_eq!(got, vec![want.to_string()], "{value}");
        // As the value parsed whole and written says, up to the order of its fields.
        let whole: serde_json::Value = serde_json::from_str(value).unwrap();
        let mut whole = serde_json::to_string(&whole).unwrap();
        whole.insert_str(whole.len() - 1, ",\"x\":1");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&whole).unwrap(),
            serde_json::from_str::<serde_json::Value>(want).unwrap()
        );
    }
}

#[test]
fn many_top_level_fields_and_repeated_names_take_linear_time() {
    let n = 100_000;
    let mut value = String::from("{");
    for i in 0..n {
        value.push_str(&format!("\"k{i:06}\":{i},"));
    }
    // Repeated names keep their last value, in the place of their first.
    value.push_str("\"k000001\":\"last\",\"k000001\":\"later\"}");
    let started = std::time::Instant::now();
    let got = run(&vec![insert()], value.as_bytes()).unwrap();
    // A parse of the whole value takes about 0.1 s; a check of each name against all
    // before it, 20 s.
    assert!(started.elapsed() < std::time::Duration::from_secs(3));
    assert!(got[0].starts_with(r#"{"k000000":0,"k000001":"later","k000002":2,"#));
    let got: serde_json::Value = serde_json::from_str(&got[0]).unwrap();
    let o = got.as_object().unwrap();
    assert_eq!(o.len(), n + 1);
    assert_eq!(o["k000001"], "later");
    assert_eq!(o["k099999"], 99_999);
}

#[test]
fn checked_values_split_by_structure_give_what_a_checking_parse_gives() {
    use super::fields::{Cast, ReplaceField};
    use super::{run_chain, Values};
    let chain: Chain = vec![
        insert(),
        (
            "replace_field".into(),
            smt::<ReplaceField>(
                "exclude = [\"drop\"]\nrename = { a = \"b\", b = \"a\", \"x y\" = \"z\" }",
            ),
        ),
        (
            "cast".into(),
            smt::<Cast>(
                "spec = { b = \"string\", t = \"int8\", f = \"boolean\", n = \"float64\" }",
            ),
        ),
        flatten(),
    ];
    let inputs = [
        r#"{"a":1,"b":"two","t":true,"f":false,"n":3}"#,
        "{ \"a\" : [ 1.50 , {\"k\":1,\"k\":2} ] ,\n\"x y\": \"\\u00e9\\/\", \"drop\": null, \"a\": -0 }",
        r#"{"\u0061":1E+2,"b":{"c":{"d":12345678901234567890123}},"t":"7","f":"TRUE"}"#,
        r#"{}"#,
        r#"[1,2]"#,
        r#""text""#,
        r#"null"#,
    ];
    for prefix in 1..=chain.len() {
        for input in inputs {
            let run = |values| {
                let mut out = Vec::new();
                run_chain(&chain[..prefix], values, record(input.as_bytes()), &mut out)
                    .map(|()| {
                        out.iter()
                            .map(|r| String::from_utf8(r.value.to_vec()).unwrap())
                            .collect::<Vec<_>>()
                    })
                    .map_err(|e| (e.0, e.1.value))
            };
            let (checked, unchecked) = (run(Values::Checked), run(Values::Unchecked));
            assert_eq!(checked, unchecked, "{prefix} steps on {input}");
            // A record the chain fails on is handed back as it came.
            if let Err((_, value)) = checked {
                assert_eq!(&value[..], input.as_bytes());
            }
        }
    }
}
