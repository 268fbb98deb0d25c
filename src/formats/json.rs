//! The `json` format's check.
//!
//! The JSON check accepts exactly what `serde_json` parses into a `serde_json::Value`
//! (RFC 8259 JSON text, UTF-8, escapes that name characters, at most [`MAX_DEPTH`]
//! nested arrays and objects), up to one difference: a number too large for an `f64`
//! (`1e400`) passes, because its syntax is valid. So an operator that parses a record
//! that passed does not fail on its syntax, its encoding or its depth. Most payloads
//! cost no value: one pass over the bytes (opening brackets, backslashes, bytes above
//! 0x7f), a UTF-8 check only if a byte is above 0x7f, then `serde_json` skipping over
//! the text. Skipping checks neither the depth nor what a `\u` escape names (a lone
//! surrogate), so a payload with a `\u` escape or more than [`MAX_DEPTH`] opening
//! brackets is parsed in full.

/// The deepest nesting of arrays and objects accepted: `serde_json`'s recursion limit
/// (it refuses the 128th level).
pub const MAX_DEPTH: u32 = 127;

/// Checks that `b` is one JSON text (RFC 8259) in UTF-8, nested at most [`MAX_DEPTH`]
/// deep, that parses into a `serde_json::Value`; the error says why not, and where.
pub fn validate_json(b: &[u8]) -> Result<(), String> {
    let scan = Scan::of(b);
    // JSON text is UTF-8 as a whole; skipping a string does not check its encoding.
    if scan.non_ascii {
        std::str::from_utf8(b).map_err(|e| format!("not UTF-8: {e}"))?;
    }
    serde_json::from_slice::<serde::de::IgnoredAny>(b).map_err(|e| e.to_string())?;
    scan.parse_if_needed(b)
}

/// The checks of [`validate_json`] that skipping over a text does not make (its
/// encoding, its depth, what its `\u` escapes name, names `serde_json` reserves), for
/// a text whose syntax a parser that skips nested values has accepted: the two accept
/// what [`validate_json`] accepts.
pub fn validate_skipped_json(b: &[u8]) -> Result<(), String> {
    let scan = Scan::of(b);
    if scan.non_ascii {
        std::str::from_utf8(b).map_err(|e| format!("not UTF-8: {e}"))?;
    }
    scan.parse_if_needed(b)
}

/// The prefix of the names `serde_json` reserves for itself (an object whose first
/// name is `$serde_json::private::Number` is read as a number, and refused when it is
/// not one): skipping takes them for names, parsing does not.
const RESERVED: &[u8] = b"$serde_json::private::";

impl Scan {
    /// Parses `b` in full when skipping may have accepted what parsing refuses.
    fn parse_if_needed(&self, b: &[u8]) -> Result<(), String> {
        // Skipping has no depth limit, does not decode escapes and reads every name as
        // a name; parsing does all three. A text can nest deeper than the limit only
        // if it has more opening brackets than that.
        let escape = self.backslash && b.windows(2).any(|w| w == b"\\u");
        let reserved = self.dollar && b.windows(RESERVED.len()).any(|w| w == RESERVED);
        if self.opening > MAX_DEPTH as usize || escape || reserved {
            if let Err(e) = serde_json::from_slice::<serde_json::Value>(b) {
                if !e.to_string().starts_with("number out of range") {
                    return Err(e.to_string());
                }
            }
        }
        Ok(())
    }
}

/// What one pass over a payload finds, for the JSON check: it costs a few nanoseconds
/// per 100 bytes where searching for each thing alone cost as much as the parse.
#[derive(Debug, Default, PartialEq)]
struct Scan {
    /// `[` and `{` bytes, inside strings or not: at least the deepest nesting.
    opening: usize,
    /// Whether a `\` occurs (only then can a `\u` escape).
    backslash: bool,
    /// Whether a byte above 0x7f occurs (only then can the text be invalid UTF-8).
    non_ascii: bool,
    /// Whether a `$` occurs (only then can a name `serde_json` reserves).
    dollar: bool,
}

impl Scan {
    fn of(b: &[u8]) -> Scan {
        let mut scan = Scan::default();
        // Branch-free over chunks with a small counter, so that the loop vectorizes.
        for chunk in b.chunks(128) {
            let (mut opening, mut backslash, mut high, mut dollar) = (0u8, 0u8, 0u8, 0u8);
            for &c in chunk {
                // `[` is 0x5b and `{` is 0x7b: they alone become 0x7b with bit 5 set.
                opening += u8::from(c | 0x20 == b'{');
                backslash |= u8::from(c == b'\\');
                high |= c;
                dollar |= u8::from(c == b'$');
            }
            scan.opening += usize::from(opening);
            scan.backslash |= backslash != 0;
            scan.non_ascii |= high >= 0x80;
            scan.dollar |= dollar != 0;
        }
        scan
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What the check must accept: what `serde_json` parses as a `Value` (UTF-8, the
    /// recursion limit), numbers judged by syntax alone.
    fn serde_accepts(b: &[u8]) -> bool {
        std::str::from_utf8(b).is_ok()
            && match serde_json::from_slice::<serde_json::Value>(b) {
                Ok(_) => true,
                // Judged by syntax alone: skipping accepts it too.
                Err(e) if e.to_string().starts_with("number out of range") => {
                    serde_json::from_slice::<serde::de::IgnoredAny>(b).is_ok()
                }
                Err(_) => false,
            }
    }

    fn agrees(b: &[u8]) {
        assert_eq!(
            validate_json(b).is_ok(),
            serde_accepts(b),
            "{:?}: {:?}",
            String::from_utf8_lossy(b),
            validate_json(b)
        );
    }

    #[test]
    fn json_check_agrees_with_serde_json_on_the_edge_cases() {
        let cases: &[&[u8]] = &[
            b"",
            b" ",
            b"0",
            b"-0",
            b"-",
            b"01",
            b"1.",
            b"1.5",
            b".5",
            b"1e",
            b"1e+",
            b"1E-7",
            b"1e400",
            b"-0.0e0",
            b"+1",
            b"true",
            b"tru",
            b"truex",
            b"null ",
            b" null",
            b"nul",
            b"\"\"",
            b"\"",
            b"\"\\\"",
            b"\"\\u00e9\"",
            b"\"\\u00g9\"",
            b"\"\\ud800\"",
            b"{\"user\":\"\\ud800\",\"amount\":1}",
            b"[\"\\ud83d\\ude00\"]",
            b"[\"\\udc00\\ud800\"]",
            b"[1e400, \"\\u00e9\"]",
            b"\"\\x\"",
            b"\"a\tb\"",
            b"\"\x7f\"",
            "\"é\"".as_bytes(),
            b"\"\xff\"",
            b"\xef\xbb\xbf{}",
            b"{}",
            b"[]",
            b"{ }",
            b"[ ]",
            b"[1,]",
            b"[,1]",
            b"[1 2]",
            b"{\"a\"}",
            b"{\"a\":}",
            b"{\"a\":1,}",
            b"{,}",
            b"{1:2}",
            b"{\"a\":1 \"b\":2}",
            b"[1]]",
            b"[[1]",
            b"{}}",
            b"[1] [2]",
            b"{\"a\":[1,{\"b\":null}],\"c\":\"d\"}",
            b"\t[\n1\r]\n",
            b"\x0c1",
            b"[\"a\\/b\"]",
            b"[\"\\b\\f\\n\\r\\t\"]",
            b"{\"a\":1}x",
            b"[-]",
            b"[--1]",
            b"[1e5.]",
            b"\xc3\xa9",
            b"[1]\xc3\xa9",
            b"[\"\xc3\xa9\"]\xc3\xa9",
            b"[\"\xc3\xa9\", \"\xff\"]",
            b"[\"\xc3\xa9\", \"\xc3\"]",
            b"[\"abcdefghijklmnop\\\"qrstuvwxyz0123456\x01\"]",
            b"[\"abcdefghijklmnopqrstuvwxyz0123456789\"]",
            b"[\"abcdefghijklmnopqrstuvwxyz0123456789",
            b"{\"a\":{\"$serde_json::private::Number\":\"x\"}}",
            b"{\"$serde_json::private::Number\":\"1.5\"}",
            b"{\"a\":{\"$serde_json::private::RawValue\":\"x\"}}",
            b"{\"b\":1,\"$serde_json::private::Number\":\"x\"}",
            b"[\"$serde_json::private::Number\"]",
        ];
        for c in cases {
            agrees(c);
        }
    }

    #[test]
    fn the_scan_counts_opening_brackets_and_notes_backslashes_and_non_ascii_bytes() {
        assert_eq!(Scan::of(b""), Scan::default());
        let s = Scan::of(b"{\"a\":[1,{\"b\":\"[{\"}]}");
        assert_eq!((s.opening, s.backslash, s.non_ascii), (5, false, false));
        // Brackets past the first chunk are counted too, and 128 of them in one
        // chunk do not overflow its counter.
        let s = Scan::of(&[b'['; 300]);
        assert_eq!(s.opening, 300);
        let s = Scan::of(&[b'{'; 128]);
        assert_eq!(s.opening, 128);
        // Bytes one bit away from a bracket are not brackets.
        assert_eq!(Scan::of(b"{[;k\xfb]}").opening, 2);
        let mut late = vec![b' '; 200];
        late[199] = b'\\';
        assert!(Scan::of(&late).backslash);
        late[150] = 0xc3;
        assert!(Scan::of(&late).non_ascii);
        assert!(!Scan::of(&late[..150]).non_ascii);
    }

    #[test]
    fn json_check_refuses_what_serde_json_cannot_nest() {
        for depth in [1, 126, 127, 128, 129, 500] {
            for (open, close) in [("[", "]"), ("{\"k\":", "}")] {
                let inner = if open == "[" { "" } else { "1" };
                let text = format!("{}{inner}{}", open.repeat(depth), close.repeat(depth));
                agrees(text.as_bytes());
                assert_eq!(validate_json(text.as_bytes()).is_ok(), depth <= 127);
            }
        }
    }

    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            "\\PC{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map("\\PC{0,6}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Every text serde_json writes passes, pretty or compact.
        #[test]
        fn json_check_accepts_what_serde_json_writes(v in json_value()) {
            prop_assert!(validate_json(&serde_json::to_vec(&v).unwrap()).is_ok());
            prop_assert!(validate_json(&serde_json::to_vec_pretty(&v).unwrap()).is_ok());
        }

        /// A text damaged anywhere (a byte replaced, removed or inserted, from the
        /// characters that matter to JSON and some that must not appear) is judged as
        /// serde_json judges it.
        #[test]
        fn json_check_agrees_with_serde_json_on_damaged_texts(
            v in json_value(),
            edits in prop::collection::vec(
                (any::<prop::sample::Index>(), 0u8..3, prop::sample::select(
                    b"{}[]\":,\\ \t\n0123456789.eE+-tfnrulsau\x00\x1f\x7f\xc3\xa9\xff".to_vec(),
                )),
                1..4,
            ),
        ) {
            let mut b = serde_json::to_vec(&v).unwrap();
            for (at, kind, byte) in edits {
                let i = at.index(b.len() + 1);
                match kind {
                    0 if i < b.len() => b[i] = byte,
                    1 if i < b.len() => { b.remove(i); }
                    _ => b.insert(i, byte),
                }
            }
            agrees(&b);
        }

        /// Arbitrary short byte strings of JSON's own characters.
        #[test]
        fn json_check_agrees_with_serde_json_on_json_alphabet_soup(
            b in prop::collection::vec(prop::sample::select(
                b"{}[]\":, 01-.e+tfnrulsa\\u".to_vec(),
            ), 0..12),
        ) {
            agrees(&b);
        }
    }
}
