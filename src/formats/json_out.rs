//! Writing JSON text straight into a buffer, by the rules every schema-driven format
//! shares (numbers, strings, bytes, decimals).

use base64::Engine as _;

/// An integer.
pub(crate) fn number(out: &mut Vec<u8>, n: i64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// A float; NaN and the infinities as the strings `"NaN"`, `"Infinity"`,
/// `"-Infinity"` (JSON has no such numbers; Protobuf's JSON mapping writes these).
pub(crate) fn float(out: &mut Vec<u8>, f: f64) {
    if f.is_nan() {
        out.extend_from_slice(b"\"NaN\"");
    } else if f.is_infinite() {
        out.extend_from_slice(if f > 0.0 {
            b"\"Infinity\""
        } else {
            b"\"-Infinity\""
        });
    } else {
        let _ = serde_json::to_writer(&mut *out, &f);
    }
}

/// A 32-bit float, written with the shortest digits that read back as it (`0.1`, not
/// the `0.10000000149011612` of its widening to 64 bits).
pub(crate) fn float32(out: &mut Vec<u8>, f: f32) {
    if f.is_finite() {
        let _ = serde_json::to_writer(&mut *out, &f);
    } else {
        float(out, f64::from(f));
    }
}

/// A JSON string.
pub(crate) fn string(out: &mut Vec<u8>, s: &str) {
    // Most strings need no escape: copied as they are.
    if s.bytes().any(|c| c == b'"' || c == b'\\' || c < 0x20) {
        let _ = serde_json::to_writer(&mut *out, s);
    } else {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    }
}

/// Bytes as a base64 string (standard alphabet, padded).
pub(crate) fn base64(out: &mut Vec<u8>, b: &[u8]) {
    out.push(b'"');
    out.extend_from_slice(
        base64::engine::general_purpose::STANDARD
            .encode(b)
            .as_bytes(),
    );
    out.push(b'"');
}

/// The longest unscaled value of a decimal, in bytes (about 154 digits), and its
/// largest scale: a record cannot make the conversion (quadratic in the length) or the
/// leading zeros (linear in the scale) cost more.
pub(crate) const MAX_DECIMAL_BYTES: usize = 64;
pub(crate) const MAX_DECIMAL_SCALE: usize = 1000;

/// A decimal of a big-endian two's-complement unscaled value and `scale`: its exact
/// digits, the point `scale` digits from the right.
pub(crate) fn decimal(out: &mut Vec<u8>, unscaled: &[u8], scale: usize) -> Result<(), String> {
    if unscaled.len() > MAX_DECIMAL_BYTES || scale > MAX_DECIMAL_SCALE {
        return Err(format!(
            "a decimal of {} bytes with scale {scale} (at most {MAX_DECIMAL_BYTES} bytes and scale {MAX_DECIMAL_SCALE})",
            unscaled.len()
        ));
    }
    if unscaled.len() <= 16 {
        decimal_short(out, unscaled, scale);
    } else {
        decimal_long(out, unscaled, scale);
    }
    Ok(())
}

/// [`decimal`] of at most 16 bytes, through a 128-bit integer.
fn decimal_short(out: &mut Vec<u8>, unscaled: &[u8], scale: usize) {
    let negative = unscaled.first().is_some_and(|b| b & 0x80 != 0);
    // Sign-extended from the first byte.
    let mut v: i128 = if negative { -1 } else { 0 };
    for &b in unscaled {
        v = (v << 8) | i128::from(b);
    }
    let mut buf = itoa::Buffer::new();
    let digits = buf.format(v.unsigned_abs()).as_bytes();
    if v < 0 {
        out.push(b'-');
    }
    if digits.len() > scale {
        let point = digits.len() - scale;
        out.extend_from_slice(&digits[..point]);
        if scale > 0 {
            out.push(b'.');
            out.extend_from_slice(&digits[point..]);
        }
    } else {
        out.extend_from_slice(b"0.");
        out.resize(out.len() + scale - digits.len(), b'0');
        out.extend_from_slice(digits);
    }
}

/// [`decimal`] of any length, by repeated division.
fn decimal_long(out: &mut Vec<u8>, unscaled: &[u8], scale: usize) {
    let negative = unscaled.first().is_some_and(|b| b & 0x80 != 0);
    // The magnitude, big-endian.
    let mut mag: Vec<u8> = if negative {
        // Two's complement: invert and add one.
        let mut m: Vec<u8> = unscaled.iter().map(|b| !b).collect();
        for byte in m.iter_mut().rev() {
            let (v, carry) = byte.overflowing_add(1);
            *byte = v;
            if !carry {
                break;
            }
        }
        m
    } else {
        unscaled.to_vec()
    };
    // Base 10 by repeated division: decimals are a few bytes long.
    let mut digits = Vec::new();
    while mag.iter().any(|&b| b != 0) {
        let mut rem = 0u32;
        for byte in mag.iter_mut() {
            let cur = (rem << 8) | u32::from(*byte);
            *byte = (cur / 10) as u8;
            rem = cur % 10;
        }
        digits.push(b'0' + rem as u8);
    }
    // Leading digits: at least one before the point.
    while digits.len() <= scale {
        digits.push(b'0');
    }
    digits.reverse();
    if negative && digits.iter().any(|&d| d != b'0') {
        out.push(b'-');
    }
    let point = digits.len() - scale;
    out.extend_from_slice(&digits[..point]);
    if scale > 0 {
        out.push(b'.');
        out.extend_from_slice(&digits[point..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn a_short_decimal_is_written_as_by_division(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..=16), scale in 0usize..40) {
            let (mut short, mut long) = (Vec::new(), Vec::new());
            decimal_short(&mut short, &bytes, scale);
            decimal_long(&mut long, &bytes, scale);
            proptest::prop_assert_eq!(String::from_utf8(short).unwrap(), String::from_utf8(long).unwrap());
        }

        #[test]
        fn a_string_is_written_as_serde_json_writes_it(s in "[a-z\"\\\\\u{0}-\u{1f}é ]{0,12}") {
            let mut out = Vec::new();
            string(&mut out, &s);
            proptest::prop_assert_eq!(out, serde_json::to_vec(&s).unwrap());
        }
    }

    #[test]
    fn edge_decimals() {
        let cases: &[(&[u8], usize, &str)] = &[
            (&[], 0, "0"),
            (&[], 2, "0.00"),
            (&[0xff], 0, "-1"),
            (&[0xff], 3, "-0.001"),
            (&[0x80; 1], 1, "-12.8"),
            (&[0x07, 0xc6, 0xb5], 2, "5096.21"),
        ];
        for (bytes, scale, want) in cases {
            let mut out = Vec::new();
            decimal(&mut out, bytes, *scale).unwrap();
            assert_eq!(String::from_utf8(out).unwrap(), *want, "{bytes:?} {scale}");
        }
        let min = [0x80u8; 1]
            .iter()
            .chain([0u8; 15].iter())
            .copied()
            .collect::<Vec<_>>();
        let mut out = Vec::new();
        decimal(&mut out, &min, 0).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), i128::MIN.to_string());
    }
}
