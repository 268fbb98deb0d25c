//! The jq programs that only make an object of the record's top-level fields:
//! `. + {x: .a, ...}` (the record with fields added or replaced) and
//! `{order, user, price: .amount, ...}` (an object of some of them), each value a
//! top-level field (`.a`, `."a b"`, `.["a"]`), a literal (a string without
//! interpolation, a number, `true`, `false`, `null`) or `$meta.topic`, `.partition`,
//! `.offset`, `.timestamp`. A program of these shapes runs on the record's top-level
//! fields ([`Fields`]) at the cost of the other transforms of top-level fields, and
//! writes what jaq writes: the fields in jaq's order, each value's text as jaq writes
//! it. What it cannot write as jaq would (a value that is not an object, an integer
//! `-0`, which jaq writes `0`, an object inside a value that repeats a name, of which
//! jaq keeps the last) runs through jaq.

use super::shallow::Fields;
use super::Meta;
use jaq_core::load::lex::StrPart;
use jaq_core::load::parse::{BinaryOp, Term};
use jaq_core::path::Part;
use std::borrow::Cow;

/// A program of one of the two shapes.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// `. + {...}`: the record's fields with these; else `{...}`: these alone.
    merge: bool,
    /// Each name and where its value comes from, in the program's order.
    pairs: Vec<(String, Src)>,
}

/// Where a value of the object comes from.
#[derive(Debug, Clone, PartialEq)]
enum Src {
    /// A top-level field of the record (`null` when it has none).
    Field(String),
    /// A literal, as its JSON text.
    Json(String),
    /// A field of `$meta`.
    Meta(MetaField),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum MetaField {
    Topic,
    Partition,
    Offset,
    Timestamp,
}

impl Shape {
    /// The shape of the jq program `code`, if it has one of the two.
    pub fn of(code: &str) -> Option<Shape> {
        let term = jaq_core::load::parse(code, |p| p.term())?;
        match &term {
            Term::BinOp(l, BinaryOp::Math(jaq_core::ops::Math::Add), r)
                if matches!(**l, Term::Id) =>
            {
                Some(Shape {
                    merge: true,
                    pairs: pairs(r)?,
                })
            }
            Term::Obj(_) => Some(Shape {
                merge: false,
                pairs: pairs(&term)?,
            }),
            _ => None,
        }
    }

    /// Runs the program on `o`, the fields of an object value; false when it cannot
    /// write what jaq would (`o` is then unchanged, and the caller runs jaq).
    pub fn apply<'a>(&'a self, o: &mut Fields<'a>, meta: &Meta) -> bool {
        // The object's values are read before any is set, as jq reads them from `.`.
        let mut values: smallvec::SmallVec<[Cow<'a, str>; 4]> =
            smallvec::SmallVec::with_capacity(self.pairs.len());
        for (_, src) in &self.pairs {
            values.push(match src {
                Src::Field(f) => o.get_cow(f).unwrap_or(Cow::Borrowed("null")),
                Src::Json(t) => Cow::Borrowed(t.as_str()),
                Src::Meta(m) => Cow::Owned(m.json(meta)),
            });
        }
        // What is written as it is: the record's fields (which hold every value a
        // field gives) for `. + {...}`, else the object's values. Literals and `$meta`
        // have neither a `-0` nor an object.
        let written = |v: &str| !negative_zero(v) && !super::shallow::nested_names_repeat(v);
        let writable = match self.merge {
            true => o.values().all(written),
            false => values.iter().all(|v| written(v)),
        };
        if !writable {
            return false;
        }
        if !self.merge {
            o.clear();
        }
        for ((name, _), value) in self.pairs.iter().zip(values) {
            o.set(name, value);
        }
        true
    }
}

impl MetaField {
    /// Its JSON text for a record of `meta`, as `$meta` has it.
    fn json(self, meta: &Meta) -> String {
        let int = |n: Option<i64>| n.map_or_else(|| "null".to_string(), |n| n.to_string());
        match self {
            MetaField::Topic => meta.topic.map_or_else(
                || "null".to_string(),
                |t| serde_json::to_string(t).expect("a string serializes"),
            ),
            MetaField::Partition => int(meta.partition.map(i64::from)),
            MetaField::Offset => int(meta.offset),
            MetaField::Timestamp => int(meta.timestamp),
        }
    }
}

/// The names and values of the object term `t` (`None`: not an object of the shape).
fn pairs(t: &Term<&str>) -> Option<Vec<(String, Src)>> {
    let Term::Obj(kvs) = t else { return None };
    kvs.iter()
        .map(|(k, v)| {
            let name = literal(k)?;
            let src = match v {
                // `{order}` is `{order: .order}`.
                None => Src::Field(name.clone()),
                Some(v) => src(v)?,
            };
            Some((name, src))
        })
        .collect()
}

/// Where the value term `t` comes from, if it is one the shapes allow.
fn src(t: &Term<&str>) -> Option<Src> {
    match t {
        Term::Str(..) => Some(Src::Json(
            serde_json::to_string(&literal(t)?).expect("a string serializes"),
        )),
        Term::Num(n) if crate::transforms::jq::json_number(n.as_bytes()) && !negative_zero(n) => {
            Some(Src::Json(n.to_string()))
        }
        Term::Call(name, args) if args.is_empty() => match *name {
            "null" | "true" | "false" => Some(Src::Json(name.to_string())),
            _ => None,
        },
        Term::Path(base, path) => {
            let [(Part::Index(index), _)] = path.0.as_slice() else {
                return None;
            };
            let name = literal(index)?;
            match &**base {
                Term::Id => Some(Src::Field(name)),
                Term::Var("$meta") => Some(Src::Meta(match name.as_str() {
                    "topic" => MetaField::Topic,
                    "partition" => MetaField::Partition,
                    "offset" => MetaField::Offset,
                    "timestamp" => MetaField::Timestamp,
                    _ => return None,
                })),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The text of a string literal without interpolation or format.
fn literal(t: &Term<&str>) -> Option<String> {
    let Term::Str(None, parts) = t else {
        return None;
    };
    let mut s = String::new();
    for p in parts {
        match p {
            StrPart::Str(text) => s.push_str(text),
            StrPart::Char(c) => s.push(*c),
            StrPart::Term(_) => return None,
        }
    }
    Some(s)
}

/// Whether the JSON text `v` may hold the integer `-0` (which jaq writes `0`): any
/// `-0` that no digit, `.` or exponent follows (in a string too, which costs a run
/// through jaq and nothing else).
fn negative_zero(v: &str) -> bool {
    let b = v.as_bytes();
    memchr::memmem::find_iter(b, b"-0")
        .any(|at| !matches!(b.get(at + 2), Some(b'0'..=b'9' | b'.' | b'e' | b'E')))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Origin, Record};
    use crate::transforms::jq::Jq;
    use crate::transforms::{run_chain, Smt, Values};
    use std::sync::Arc;

    const PROGRAMS: &[&str] = &[
        ". + {x: .a}",
        ".+{a: .b, b: .a, c: .c}",
        r#". + {x: 1.50, y: "s\n\u00e9", z: null, t: true, f: false, n: 12}"#,
        "{order, user}",
        r#"{k: ."a b", q: .["q"], m: $meta.topic, p: $meta.partition, o: $meta.offset, ts: $meta.timestamp}"#,
        "{x: 1, y: .a, x: 2}",
        ". + {}",
        "{}",
        ". + {a: .missing}",
        r#"{"é\"": .a, a: .a?}"#,
    ];

    const INPUTS: &[&str] = &[
        r#"{"a":1.50,"b":1E+2,"c":12345678901234567890123,"order":7,"user":"u"}"#,
        "{ \"a\" : [ 1.0 , {\"h\" : 2e-3} ] ,\n\"q\": \"x\\/y\\u00e9\", \"a b\": 1e400 }",
        r#"{"a":1,"a":2,"b":3,"\u0061":4}"#,
        r#"{"a":-0,"b":1}"#,
        r#"{"a":[-0.5,-0e1],"b":"-0"}"#,
        r#"{"a":{"b":-0}}"#,
        r#"{"a":1,"m":{"k":1,"k":2}}"#,
        r#"{"a":{"k":1,"\u006b":2},"b":[{"k":1},{"k":2}]}"#,
        r#"{}"#,
        r#"[1,2]"#,
        r#"null"#,
        r#""text""#,
        r#"12"#,
    ];

    fn record(value: &str) -> Record {
        let mut r = Record::from_value(value.as_bytes().to_vec());
        r.origin = Some(Origin {
            stream: "orders".into(),
            partition: 3,
            offset: 7,
        });
        r.timestamp = Some(1_700_000_000_123);
        r
    }

    /// What jaq makes of `input`: each output's text, or the error.
    fn jaq(code: &str, input: &str) -> Result<Vec<String>, String> {
        let r = record(input);
        let meta = crate::transforms::jq::meta_value(
            &crate::transforms::Parts::of_value(serde_json::Value::Null),
            &crate::transforms::Meta::of(&r),
        );
        let meta = jaq_json::read::parse_single(&serde_json::to_vec(&meta).unwrap()).unwrap();
        crate::transforms::jq::text_outputs(code, input.as_bytes(), meta)
    }

    #[test]
    fn a_program_of_the_shapes_writes_what_jaq_writes() {
        for code in PROGRAMS {
            assert!(Shape::of(code).is_some(), "{code}");
            let smt: Arc<dyn Smt> = Arc::new(Jq::new(code).unwrap());
            let chain = vec![("jq".to_string(), smt)];
            let shape = Shape::of(code).unwrap();
            for input in INPUTS {
                let want = jaq(code, input);
                // The shape's own path runs on every object without a `-0`.
                if let Some(mut fields) = Fields::split(input.as_bytes()) {
                    let r = record(input);
                    let applied = shape.apply(&mut fields, &crate::transforms::Meta::of(&r));
                    let declines = input.contains("-0") || input.contains(r#""k":1,"#);
                    assert!(applied || declines, "{code} on {input}");
                }
                for values in [Values::Checked, Values::Unchecked] {
                    let mut out = Vec::new();
                    let got = run_chain(&chain, values, record(input), &mut out)
                        .map(|()| {
                            out.iter()
                                .map(|r| String::from_utf8(r.value.to_vec()).unwrap())
                                .collect::<Vec<_>>()
                        })
                        .map_err(|e| e.0.message);
                    match (&want, &got) {
                        (Ok(w), Ok(g)) => assert_eq!(w, g, "{code} on {input} ({values:?})"),
                        (Err(w), Err(g)) => {
                            assert!(g.contains(w.as_str()), "{code} on {input}: {g} / {w}")
                        }
                        _ => panic!("{code} on {input} ({values:?}): jaq {want:?}, chain {got:?}"),
                    }
                }
            }
        }
    }

    #[test]
    fn other_programs_have_no_shape() {
        for code in [
            ".",
            ".a",
            ". + {x: (.a + 1)}",
            ". + {x: .a.b}",
            r#". + {x: "\(.a)"}"#,
            ". + {x: .[0]}",
            ". + {(.k): 1}",
            "{x: $meta.key}",
            "{x: -0}",
            "{x: -1}",
            "def f: .; {x: f}",
            "{x: empty}",
            ". * {x: 1}",
            ".a + {x: 1}",
            "{x: .a} + .",
            "{x: 1} | . + {y: 2}",
        ] {
            assert_eq!(Shape::of(code), None, "{code}");
        }
    }

    #[test]
    fn negative_zero_is_found_where_jaq_would_rewrite_it() {
        for (text, yes) in [
            ("-0", true),
            ("[-0]", true),
            ("{\"a\":-0}", true),
            ("-0.0", false),
            ("-0e1", false),
            ("-0E1", false),
            ("-01", false),
            ("-10", false),
            ("0", false),
        ] {
            assert_eq!(negative_zero(text), yes, "{text}");
        }
    }
}
