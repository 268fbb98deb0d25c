//! Rows of `COPY ... TO STDOUT` in the text format: columns separated by tabs, rows
//! ended by newlines, `\N` for NULL and backslash escapes for the rest. The initial
//! snapshot reads its chunks this way, the server's fastest way out.

/// Splits the bytes of a `COPY` into rows, whatever the chunks they arrive in.
#[derive(Debug, Default)]
pub struct Rows {
    pending: Vec<u8>,
}

impl Rows {
    /// Takes `chunk` and appends every row it completes to `out`.
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<Vec<Option<String>>>) -> Result<(), String> {
        let mut start = 0;
        for (i, b) in chunk.iter().enumerate() {
            if *b == b'\n' {
                if self.pending.is_empty() {
                    out.push(row(&chunk[start..i])?);
                } else {
                    self.pending.extend_from_slice(&chunk[start..i]);
                    out.push(row(&self.pending)?);
                    self.pending.clear();
                }
                start = i + 1;
            }
        }
        self.pending.extend_from_slice(&chunk[start..]);
        Ok(())
    }

    /// The end of the data: an unfinished row is an error.
    pub fn finish(&self) -> Result<(), String> {
        if self.pending.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "COPY ended inside a row ({} bytes without a newline)",
                self.pending.len()
            ))
        }
    }
}

/// One row's columns (`None`: NULL).
pub fn row(line: &[u8]) -> Result<Vec<Option<String>>, String> {
    line.split(|b| *b == b'\t').map(column).collect()
}

fn column(raw: &[u8]) -> Result<Option<String>, String> {
    if raw == b"\\N" {
        return Ok(None);
    }
    let text =
        |b: Vec<u8>| String::from_utf8(b).map_err(|e| format!("a COPY column is not UTF-8: {e}"));
    if !raw.contains(&b'\\') {
        return text(raw.to_vec()).map(Some);
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        i += 1;
        if b != b'\\' {
            out.push(b);
            continue;
        }
        let Some(&e) = raw.get(i) else {
            return Err("a COPY column ends with a lone backslash".into());
        };
        i += 1;
        match e {
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'0'..=b'7' => {
                let mut v = u32::from(e - b'0');
                for _ in 0..2 {
                    match raw.get(i) {
                        Some(d @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push(v as u8);
            }
            b'x' if raw.get(i).is_some_and(u8::is_ascii_hexdigit) => {
                let mut v = 0u32;
                for _ in 0..2 {
                    match raw.get(i).and_then(|d| (*d as char).to_digit(16)) {
                        Some(d) => {
                            v = v * 16 + d;
                            i += 1;
                        }
                        None => break,
                    }
                }
                out.push(v as u8);
            }
            other => out.push(other),
        }
    }
    text(out).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nulls_escapes_and_rows_across_chunks() {
        let data = b"1\t\\N\ta\\tb\\\\c\\nd\n2\t\t\\101\\x41z\n";
        let mut all = Vec::new();
        for split in 0..data.len() {
            let mut r = Rows::default();
            let mut out = Vec::new();
            r.feed(&data[..split], &mut out).unwrap();
            r.feed(&data[split..], &mut out).unwrap();
            r.finish().unwrap();
            all.push(out);
        }
        let want = vec![
            vec![Some("1".into()), None, Some("a\tb\\c\nd".into())],
            vec![Some("2".into()), Some(String::new()), Some("AAz".into())],
        ];
        assert!(all.iter().all(|o| *o == want), "{:?}", all[0]);
    }

    #[test]
    fn a_row_cut_short_is_an_error() {
        let mut r = Rows::default();
        r.feed(b"1\t2", &mut Vec::new()).unwrap();
        assert!(r.finish().unwrap_err().contains("inside a row"));
        assert!(row(b"a\\").is_err());
        assert!(row(&[0xff]).unwrap_err().contains("UTF-8"));
    }
}
