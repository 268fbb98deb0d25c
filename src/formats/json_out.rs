//! Writing JSON text straight into a buffer, by the rules every schema-driven format
//! shares (numbers, strings, bytes, decimals).

use base64::Engine as _;
use std::io::Write as _;

/// An integer.
pub(crate) fn number(out: &mut Vec<u8>, n: i64) {
    let _ = write!(out, "{n}");
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
    let _ = serde_json::to_writer(&mut *out, s);
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
    Ok(())
}
