//! A strict reader of one record's JSON text, token by token, for the Parquet columns
//! to be built straight from it (no tree of values in between).
//!
//! It takes what `serde_json` takes and nothing else (RFC 8259): whitespace is space,
//! tab, line feed and carriage return; a number is `-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?`;
//! a string holds no raw control character, only the escapes `\" \\ \/ \b \f \n \r \t
//! \uXXXX`, and a `\u` surrogate only as a pair; containers nest at most
//! [`MAX_DEPTH`] deep. A value it does not take is an error, never a guess.

use super::refusal::Refusal;

/// How deep containers may nest (the record's object counts): serde_json's limit.
pub const MAX_DEPTH: u32 = 127;

/// The kind of JSON value that starts at a byte, for messages.
pub fn kind_at(b: Option<u8>) -> &'static str {
    match b {
        Some(b'"') => "a string",
        Some(b'{') => "an object",
        Some(b'[') => "an array",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        Some(b'-' | b'0'..=b'9') => "a number",
        Some(_) => "a character that starts no JSON value",
        None => "the end of the text",
    }
}

/// A number's text, split: where its digits are (in the text it was read from).
#[derive(Debug, Clone, Copy)]
pub struct Number {
    /// The whole numeral.
    pub start: usize,
    pub end: usize,
    /// Whether it has a fraction or an exponent (it is not an integer numeral).
    pub whole: bool,
}

/// The reader: a position in the record's bytes (valid UTF-8, checked once).
pub struct Reader<'a> {
    b: &'a [u8],
    /// The position: the next byte to read.
    pub i: usize,
    depth: u32,
    /// A string with escapes, decoded.
    scratch: Vec<u8>,
}

#[inline(always)]
fn is_ws(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\r')
}

impl<'a> Reader<'a> {
    /// A reader of `text`; an error when it is not UTF-8 (serde_json refuses such a
    /// string, and bytes outside a string are not JSON anyway).
    pub fn new(text: &'a [u8]) -> Result<Reader<'a>, Refusal> {
        std::str::from_utf8(text).map_err(|e| Refusal::syntax(format!("not UTF-8 text ({e})")))?;
        Ok(Reader {
            b: text,
            i: 0,
            depth: 0,
            scratch: Vec::new(),
        })
    }

    /// The bytes of `start..end` of the text.
    #[inline(always)]
    pub fn slice(&self, start: usize, end: usize) -> &'a [u8] {
        &self.b[start..end]
    }

    /// The text of `start..end` (the text is UTF-8 and tokens end at ASCII bytes).
    #[inline(always)]
    pub fn text(&self, start: usize, end: usize) -> &'a str {
        // The whole text was checked to be UTF-8, and every token boundary is an ASCII
        // byte, so this slice is too.
        std::str::from_utf8(&self.b[start..end]).unwrap_or_default()
    }

    #[inline(always)]
    fn skip_ws(&mut self) {
        while let Some(&c) = self.b.get(self.i) {
            if !is_ws(c) {
                break;
            }
            self.i += 1;
        }
    }

    /// The next byte that is not whitespace (not consumed).
    #[inline(always)]
    pub fn peek(&mut self) -> Result<u8, Refusal> {
        self.skip_ws();
        match self.b.get(self.i) {
            Some(&c) => Ok(c),
            None => Err(self.syntax("the text ends inside the value")),
        }
    }

    /// The kind of the value at the position, for messages.
    pub fn kind_here(&mut self) -> &'static str {
        self.skip_ws();
        kind_at(self.b.get(self.i).copied())
    }

    /// Whether only whitespace is left.
    pub fn at_end(&mut self) -> bool {
        self.skip_ws();
        self.i == self.b.len()
    }

    /// A syntax error at the position.
    #[cold]
    pub fn syntax(&self, what: &str) -> Refusal {
        Refusal::syntax(format!("{what} at byte {}", self.i))
    }

    /// Consumes `c` (after whitespace), or fails saying what was expected.
    #[inline(always)]
    pub fn expect(&mut self, c: u8, what: &str) -> Result<(), Refusal> {
        if self.peek()? == c {
            self.i += 1;
            Ok(())
        } else {
            Err(self.syntax(what))
        }
    }

    /// One level deeper (an object or array opened).
    #[inline(always)]
    pub fn enter(&mut self) -> Result<(), Refusal> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.syntax(&format!("containers nested deeper than {MAX_DEPTH}")));
        }
        Ok(())
    }

    /// One level up (an object or array closed).
    #[inline(always)]
    pub fn leave(&mut self) {
        self.depth -= 1;
    }

    /// Consumes the literal `word` (the first byte was peeked).
    #[inline(always)]
    fn literal(&mut self, word: &[u8]) -> Result<(), Refusal> {
        if self.b[self.i..].starts_with(word) {
            self.i += word.len();
            Ok(())
        } else {
            Err(self.syntax("not a JSON value"))
        }
    }

    /// Consumes `null` when it is next.
    #[inline(always)]
    pub fn null(&mut self) -> Result<bool, Refusal> {
        if self.peek()? == b'n' {
            self.literal(b"null")?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// A boolean when one is next (None, nothing consumed, when another kind is).
    #[inline(always)]
    pub fn boolean(&mut self) -> Result<Option<bool>, Refusal> {
        match self.peek()? {
            b't' => self.literal(b"true").map(|_| Some(true)),
            b'f' => self.literal(b"false").map(|_| Some(false)),
            _ => Ok(None),
        }
    }

    /// A string's content (escapes decoded) appended to `out`; the opening quote
    /// was peeked.
    #[inline(always)]
    pub fn string_into(&mut self, out: &mut Vec<u8>) -> Result<(), Refusal> {
        self.i += 1;
        let b = self.b;
        let start = self.i;
        let mut j = start;
        while let Some(&c) = b.get(j) {
            if c == b'"' {
                out.extend_from_slice(&b[start..j]);
                self.i = j + 1;
                return Ok(());
            }
            if c == b'\\' || c < 0x20 {
                break;
            }
            j += 1;
        }
        out.extend_from_slice(&b[start..j]);
        self.i = j;
        self.string_rest(out)
    }

    /// A string's content: its bytes in the text when it has no escape, else decoded
    /// (into the reader's scratch); the opening quote was peeked.
    #[inline(always)]
    pub fn string(&mut self) -> Result<&[u8], Refusal> {
        self.i += 1;
        let b = self.b;
        let start = self.i;
        let mut j = start;
        while let Some(&c) = b.get(j) {
            if c == b'"' {
                self.i = j + 1;
                return Ok(&b[start..j]);
            }
            if c == b'\\' || c < 0x20 {
                break;
            }
            j += 1;
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        scratch.extend_from_slice(&b[start..j]);
        self.i = j;
        let read = self.string_rest(&mut scratch);
        self.scratch = scratch;
        read?;
        Ok(&self.scratch[..])
    }

    /// The rest of a string from an escape or a control character on.
    #[cold]
    fn string_rest(&mut self, out: &mut Vec<u8>) -> Result<(), Refusal> {
        let b = self.b;
        loop {
            let Some(&c) = b.get(self.i) else {
                return Err(self.syntax("a string is not closed"));
            };
            match c {
                b'"' => {
                    self.i += 1;
                    return Ok(());
                }
                0..=0x1f => return Err(self.syntax("a control character in a string")),
                b'\\' => {
                    let e = b.get(self.i + 1).copied();
                    self.i += 2;
                    let ch = match e {
                        Some(b'"') => b'"',
                        Some(b'\\') => b'\\',
                        Some(b'/') => b'/',
                        Some(b'b') => 8,
                        Some(b'f') => 12,
                        Some(b'n') => b'\n',
                        Some(b'r') => b'\r',
                        Some(b't') => b'\t',
                        Some(b'u') => {
                            let ch = self.unicode_escape()?;
                            let mut buf = [0u8; 4];
                            out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                            continue;
                        }
                        _ => {
                            self.i -= 1;
                            return Err(self.syntax("an invalid escape in a string"));
                        }
                    };
                    out.push(ch);
                }
                _ => {
                    // Copy up to the next quote, escape or control character at once.
                    let start = self.i;
                    let mut j = start + 1;
                    while let Some(&c) = b.get(j) {
                        if c == b'"' || c == b'\\' || c < 0x20 {
                            break;
                        }
                        j += 1;
                    }
                    out.extend_from_slice(&b[start..j]);
                    self.i = j;
                }
            }
        }
    }

    /// The character of a `\u` escape whose `\u` was consumed: a surrogate only as a
    /// pair (a high one, then `\u` and a low one), as serde_json takes them.
    fn unicode_escape(&mut self) -> Result<char, Refusal> {
        let first = self.hex4()?;
        let cp = match first {
            0xD800..=0xDBFF => {
                if self.b.get(self.i) != Some(&b'\\') || self.b.get(self.i + 1) != Some(&b'u') {
                    return Err(self.syntax("a lone surrogate in a \\u escape"));
                }
                self.i += 2;
                let low = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&low) {
                    return Err(self.syntax("a high surrogate not followed by a low one"));
                }
                0x10000 + ((first - 0xD800) << 10) + (low - 0xDC00)
            }
            0xDC00..=0xDFFF => return Err(self.syntax("a lone surrogate in a \\u escape")),
            cp => cp,
        };
        char::from_u32(cp).ok_or_else(|| self.syntax("an invalid \\u escape"))
    }

    fn hex4(&mut self) -> Result<u32, Refusal> {
        let mut v = 0u32;
        for _ in 0..4 {
            let d = match self.b.get(self.i) {
                Some(c @ b'0'..=b'9') => c - b'0',
                Some(c @ b'a'..=b'f') => c - b'a' + 10,
                Some(c @ b'A'..=b'F') => c - b'A' + 10,
                _ => return Err(self.syntax("an invalid \\u escape")),
            };
            v = v * 16 + u32::from(d);
            self.i += 1;
        }
        Ok(v)
    }

    /// A number (RFC 8259's grammar); its first byte was peeked and is `-` or a digit.
    #[inline(always)]
    pub fn number(&mut self) -> Result<Number, Refusal> {
        let b = self.b;
        let start = self.i;
        let mut i = start;
        if b.get(i) == Some(&b'-') {
            i += 1;
        }
        match b.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                i += 1;
                while matches!(b.get(i), Some(b'0'..=b'9')) {
                    i += 1;
                }
            }
            _ => {
                self.i = i;
                return Err(self.syntax("an invalid number"));
            }
        }
        let mut whole = true;
        if b.get(i) == Some(&b'.') {
            i += 1;
            let digits = i;
            while matches!(b.get(i), Some(b'0'..=b'9')) {
                i += 1;
            }
            if i == digits {
                self.i = i;
                return Err(self.syntax("a number with no digit after its point"));
            }
            whole = false;
        }
        if matches!(b.get(i), Some(b'e' | b'E')) {
            i += 1;
            if matches!(b.get(i), Some(b'+' | b'-')) {
                i += 1;
            }
            let digits = i;
            while matches!(b.get(i), Some(b'0'..=b'9')) {
                i += 1;
            }
            if i == digits {
                self.i = i;
                return Err(self.syntax("a number with no digit in its exponent"));
            }
            whole = false;
        }
        if matches!(b.get(i), Some(b'0'..=b'9')) {
            // "01": a leading zero.
            self.i = i;
            return Err(self.syntax("a number with a leading zero"));
        }
        self.i = i;
        Ok(Number {
            start,
            end: i,
            whole,
        })
    }

    /// Passes over one value, checking its syntax (and its depth) only.
    pub fn skip_value(&mut self) -> Result<(), Refusal> {
        match self.peek()? {
            b'{' => {
                self.i += 1;
                self.enter()?;
                if self.peek()? == b'}' {
                    self.i += 1;
                } else {
                    loop {
                        if self.peek()? != b'"' {
                            return Err(self.syntax("an object's key is not a string"));
                        }
                        self.string()?;
                        self.expect(b':', "expected ':' after an object's key")?;
                        self.skip_value()?;
                        match self.peek()? {
                            b',' => self.i += 1,
                            b'}' => {
                                self.i += 1;
                                break;
                            }
                            _ => return Err(self.syntax("expected ',' or '}' in an object")),
                        }
                    }
                }
                self.leave();
            }
            b'[' => {
                self.i += 1;
                self.enter()?;
                if self.peek()? == b']' {
                    self.i += 1;
                } else {
                    loop {
                        self.skip_value()?;
                        match self.peek()? {
                            b',' => self.i += 1,
                            b']' => {
                                self.i += 1;
                                break;
                            }
                            _ => return Err(self.syntax("expected ',' or ']' in an array")),
                        }
                    }
                }
                self.leave();
            }
            b'"' => {
                self.string()?;
            }
            b't' => self.literal(b"true")?,
            b'f' => self.literal(b"false")?,
            b'n' => self.literal(b"null")?,
            b'-' | b'0'..=b'9' => {
                self.number()?;
            }
            _ => return Err(self.syntax("not a JSON value")),
        }
        Ok(())
    }

    /// The depth now (to restore after a value given up half-way).
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Back to `i` at `depth` (a value is read again, or passed over).
    pub fn rewind(&mut self, i: usize, depth: u32) {
        self.i = i;
        self.depth = depth;
    }
}

/// The text of the values of the top-level keys `keys` in `text`, one JSON object,
/// each at its key's place (None: the object does not have it; a key given twice: its
/// last value), the whole text checked as [`Reader`] checks it. None when `text` is
/// not one JSON object (not JSON at all, or another kind of value).
pub fn top_level_values<'t>(text: &'t [u8], keys: &[String]) -> Option<Vec<Option<&'t [u8]>>> {
    let mut r = Reader::new(text).ok()?;
    r.expect(b'{', "").ok()?;
    r.enter().ok()?;
    let mut found = vec![None; keys.len()];
    if r.peek().ok()? == b'}' {
        r.i += 1;
    } else {
        loop {
            if r.peek().ok()? != b'"' {
                return None;
            }
            let key = r.string().ok()?;
            let at = keys.iter().position(|k| k.as_bytes() == key);
            r.expect(b':', "").ok()?;
            r.peek().ok()?;
            let start = r.i;
            r.skip_value().ok()?;
            if let Some(k) = at {
                found[k] = Some(&text[start..r.i]);
            }
            match r.peek().ok()? {
                b',' => r.i += 1,
                b'}' => {
                    r.i += 1;
                    break;
                }
                _ => return None,
            }
        }
    }
    r.leave();
    r.at_end().then_some(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_level_values_are_the_text_of_the_keys_asked_for() {
        let keys = ["a".to_string(), "b/c".to_string(), "z".to_string()];
        let got = top_level_values(
            br#" {"a": {"x":[1, 2]} ,"b\/c":"t","a":  7, "n":null} "#,
            &keys,
        );
        assert_eq!(
            got,
            Some(vec![Some(&b"7"[..]), Some(&br#""t""#[..]), None]),
            "the last value of a key given twice; an escaped key matched decoded"
        );
        for not_one_object in ["[1]", "\"x\"", "{\"a\":1} 2", "{\"a\":01}", "", "{\"a\":1"] {
            assert_eq!(
                top_level_values(not_one_object.as_bytes(), &keys),
                None,
                "{not_one_object}"
            );
        }
    }

    fn skip(text: &str) -> Result<usize, String> {
        let mut r = Reader::new(text.as_bytes()).map_err(|e| e.to_string())?;
        r.skip_value().map_err(|e| e.to_string())?;
        Ok(r.i)
    }

    #[test]
    fn strict_json_only() {
        for ok in [
            r#"{"a":[1,-0,0.5,1e5,1E-5,-1.5e+3,true,false,null,"x\u00e9\ud83d\ude00\n"]}"#,
            "  [ ]  ",
            "\"\u{7f}\"",
        ] {
            assert!(skip(ok).is_ok(), "{ok}");
        }
        for bad in [
            "01",
            "-",
            "1.",
            ".5",
            "1e",
            "+1",
            "NaN",
            "tru",
            "nul",
            "\"\\x\"",
            "\"\\ud800\"",
            "\"\\udc00\"",
            "\"\\ud800\\u0041\"",
            "\"a\tb\"",
            "\"open",
            "[1,]",
            "{\"a\"}",
            "{\"a\":1,}",
            "{a:1}",
            "[1 2]",
            "",
        ] {
            assert!(skip(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn nesting_is_limited_as_serde_json_limits_it() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(skip(&deep(MAX_DEPTH as usize)).is_ok());
        let e = skip(&deep(MAX_DEPTH as usize + 1)).unwrap_err();
        assert!(e.contains("nested deeper"), "{e}");
        assert!(serde_json::from_str::<serde_json::Value>(&deep(MAX_DEPTH as usize)).is_ok());
        assert!(serde_json::from_str::<serde_json::Value>(&deep(MAX_DEPTH as usize + 1)).is_err());
    }

    #[test]
    fn strings_decode_their_escapes() {
        let mut r = Reader::new(br#""a\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00z""#).unwrap();
        let mut out = Vec::new();
        r.peek().unwrap();
        r.string_into(&mut out).unwrap();
        assert_eq!(out, "a\"\\/\u{8}\u{c}\n\r\té😀z".as_bytes());
        assert!(r.at_end());
    }
}
