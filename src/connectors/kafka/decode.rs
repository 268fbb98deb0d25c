//! Checking payloads against the configured format.
//!
//! The JSON check is a validating scan, not a parse: it builds nothing and allocates
//! nothing, and accepts exactly what `serde_json` parses into a `serde_json::Value`
//! (RFC 8259 JSON text, UTF-8, at most [`MAX_DEPTH`] nested arrays and objects), up to
//! one difference: a number too large for an `f64` (`1e400`) passes, as it did under
//! the previous check (`serde_json` skipping the value), because its syntax is valid.
//! So an operator that parses a record that passed does not fail on its syntax, its
//! encoding or its depth.

use super::config::Format;

/// Checks that `payload` is a valid record of `format`; the error says why not.
pub fn check(format: Format, payload: Option<&[u8]>) -> Result<(), String> {
    match (format, payload) {
        (Format::Bytes, _) => Ok(()),
        (_, None) => Err("null payload (tombstone)".into()),
        (Format::Text, Some(p)) => std::str::from_utf8(p)
            .map(|_| ())
            .map_err(|e| format!("not UTF-8: {e}")),
        (Format::Json, Some(p)) => {
            validate_json(p).map_err(|(what, at)| format!("not valid JSON: {what} at byte {at}"))
        }
    }
}

/// The deepest nesting of arrays and objects accepted: `serde_json`'s recursion limit
/// (it refuses the 128th level).
pub const MAX_DEPTH: u32 = 127;

/// Why a JSON text is invalid, and the byte offset where that was found.
type Invalid = (&'static str, usize);

/// Checks that `b` is one JSON text (RFC 8259) in UTF-8, nested at most [`MAX_DEPTH`]
/// deep. One pass over the bytes, eight at a time inside strings (plus a UTF-8 check
/// from the first non-ASCII byte on, if any); allocates nothing.
pub fn validate_json(b: &[u8]) -> Result<(), Invalid> {
    let mut s = Scanner {
        b,
        i: 0,
        utf8_checked: false,
    };
    // Bit k set: the container at depth k + 1 is an object.
    let mut objects: u128 = 0;
    let mut depth: u32 = 0;
    s.skip_ws();
    loop {
        // A value starts here.
        match s.peek() {
            Some(open @ (b'{' | b'[')) => {
                s.i += 1;
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(("nested too deep", s.i - 1));
                }
                objects = (objects << 1) | u128::from(open == b'{');
                s.skip_ws();
                let close = if open == b'{' { b'}' } else { b']' };
                if s.peek() == Some(close) {
                    s.i += 1;
                    depth -= 1;
                    objects >>= 1;
                } else {
                    if open == b'{' {
                        s.member_name()?;
                    }
                    continue;
                }
            }
            Some(b'"') => s.string()?,
            Some(b't') => s.literal(b"true")?,
            Some(b'f') => s.literal(b"false")?,
            Some(b'n') => s.literal(b"null")?,
            Some(b'-' | b'0'..=b'9') => s.number()?,
            _ => return Err(("expected a value", s.i)),
        }
        // A value ended: what may follow it.
        loop {
            s.skip_ws();
            if depth == 0 {
                return if s.i == b.len() {
                    Ok(())
                } else {
                    Err(("trailing characters", s.i))
                };
            }
            let in_object = objects & 1 == 1;
            match s.peek() {
                Some(b',') => {
                    s.i += 1;
                    s.skip_ws();
                    if in_object {
                        s.member_name()?;
                    }
                    break;
                }
                Some(b'}') if in_object => {}
                Some(b']') if !in_object => {}
                _ => return Err(("expected `,` or the end of the container", s.i)),
            }
            s.i += 1;
            depth -= 1;
            objects >>= 1;
        }
    }
}

/// The index of the first `"`, `\\` or control character at or after `i` in `b` (and
/// of the first byte >= 0x80 when `high` is all ones), or `b.len()`: eight bytes at a
/// time (the lowest flagged byte of a word is exact; borrows only flag bytes above it).
#[inline]
fn find_special(b: &[u8], mut i: usize, high: u64) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    while let Some(word) = b.get(i..i + 8) {
        let w = u64::from_le_bytes(word.try_into().expect("eight bytes"));
        let quote = w ^ (ONES * u64::from(b'"'));
        let backslash = w ^ (ONES * u64::from(b'\\'));
        let flagged = (quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash)
            | (w.wrapping_sub(ONES * 0x20) & !w);
        let flagged = (flagged | (w & high)) & HIGHS;
        if flagged != 0 {
            return i + (flagged.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while let Some(&c) = b.get(i) {
        if c == b'"' || c == b'\\' || c < 0x20 || (c >= 0x80 && high != 0) {
            return i;
        }
        i += 1;
    }
    i
}

struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
    /// Whether the text from the first non-ASCII byte on is known to be UTF-8. Bytes
    /// >= 0x80 are valid only inside strings: elsewhere no token starts with one.
    utf8_checked: bool,
}

impl Scanner<'_> {
    #[inline]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    #[inline]
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    /// `"name"` `:` and the whitespace after it.
    #[inline]
    fn member_name(&mut self) -> Result<(), Invalid> {
        if self.peek() != Some(b'"') {
            return Err(("expected a member name", self.i));
        }
        self.string()?;
        self.skip_ws();
        if self.peek() != Some(b':') {
            return Err(("expected `:`", self.i));
        }
        self.i += 1;
        self.skip_ws();
        Ok(())
    }

    /// A string, from its opening quote.
    #[inline]
    fn string(&mut self) -> Result<(), Invalid> {
        self.i += 1;
        loop {
            let high = if self.utf8_checked { 0 } else { u64::MAX };
            self.i = find_special(self.b, self.i, high);
            match self.peek() {
                None => return Err(("unterminated string", self.b.len())),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(());
                }
                Some(b'\\') => {
                    self.i += 1;
                    match self.peek() {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => self.i += 1,
                        Some(b'u') => {
                            let hex = self.b.get(self.i + 1..self.i + 5);
                            if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                                return Err(("invalid \\u escape", self.i));
                            }
                            self.i += 5;
                        }
                        _ => return Err(("invalid escape", self.i)),
                    }
                }
                Some(c) if c >= 0x80 => {
                    // The first non-ASCII byte: the rest of the text is checked once
                    // (what precedes it is ASCII).
                    if let Err(e) = std::str::from_utf8(&self.b[self.i..]) {
                        return Err(("invalid UTF-8", self.i + e.valid_up_to()));
                    }
                    self.utf8_checked = true;
                }
                Some(_) => return Err(("control character in a string", self.i)),
            }
        }
    }

    #[inline]
    fn literal(&mut self, word: &'static [u8]) -> Result<(), Invalid> {
        if self.b[self.i..].starts_with(word) {
            self.i += word.len();
            Ok(())
        } else {
            Err(("expected a value", self.i))
        }
    }

    #[inline]
    fn digits(&mut self) -> usize {
        let start = self.i;
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
        self.i - start
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`
    #[inline]
    fn number(&mut self) -> Result<(), Invalid> {
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek() {
            Some(b'0') => {
                self.i += 1;
                if let Some(b'0'..=b'9') = self.peek() {
                    return Err(("leading zero in a number", self.i));
                }
            }
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(("invalid number", self.i)),
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if self.digits() == 0 {
                return Err(("invalid number", self.i));
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            if self.digits() == 0 {
                return Err(("invalid number", self.i));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn formats() {
        assert!(check(Format::Json, Some(b"{\"a\":1}")).is_ok());
        assert!(check(Format::Json, Some(b"{\"a\":")).is_err());
        assert!(check(Format::Json, None).is_err());
        assert!(check(Format::Text, Some(&[0xff, 0xfe])).is_err());
        assert!(check(Format::Bytes, Some(&[0xff])).is_ok());
        assert!(check(Format::Bytes, None).is_ok());
    }

    /// What the check must accept: what `serde_json` parses as a `Value` (UTF-8, the
    /// recursion limit), numbers judged by syntax alone.
    fn serde_accepts(b: &[u8]) -> bool {
        std::str::from_utf8(b).is_ok()
            && serde_json::from_slice::<serde::de::IgnoredAny>(b).is_ok()
            && !matches!(
                serde_json::from_slice::<serde_json::Value>(b),
                Err(e) if e.to_string().starts_with("recursion limit exceeded")
            )
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
        ];
        for c in cases {
            agrees(c);
        }
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
