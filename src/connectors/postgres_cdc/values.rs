//! Column values in the text form pgoutput sends them, as Debezium's PostgreSQL
//! connector writes them into a change event's `before` and `after` (its defaults:
//! `time.precision.mode = adaptive`, `binary.handling.mode = bytes` as base64 in
//! JSON), except that a `numeric` is a JSON number with exactly the digits the
//! server sent, where Debezium's default is an encoded decimal: a number keeps its
//! text.
//!
//! | PostgreSQL | value |
//! |---|---|
//! | `boolean` | `true` / `false` |
//! | `smallint`, `integer`, `bigint`, `oid`, `real`, `double precision`, `numeric` | a number, its text as sent (`NaN` and the infinities: a string) |
//! | `date` | days since 1970-01-01 |
//! | `time` | microseconds since midnight |
//! | `timestamp` | microseconds since the epoch (milliseconds for `timestamp(0..3)`) |
//! | `timestamptz` | ISO 8601 in UTC with the column's precision of digits (6 unless set), `2024-05-01T12:00:00.123456Z` |
//! | `timetz` | ISO 8601 in UTC, `12:00:00.5Z` |
//! | `json`, `jsonb` | the JSON text, as a string |
//! | `bytea` | base64 |
//! | arrays of these | a JSON array, elements as above |
//! | anything else (`text`, `uuid`, enums, `interval`, ...) | the text |
//!
//! A value of `-infinity`/`infinity` for a date or time is its text.

use base64::Engine;
use chrono::{DateTime, NaiveDate, NaiveDateTime, NaiveTime, Timelike};
use serde_json::Value;

/// Type ids of the built-in types this module converts (`pg_type.oid`).
pub mod oid {
    pub const BOOL: u32 = 16;
    pub const BYTEA: u32 = 17;
    pub const INT8: u32 = 20;
    pub const INT2: u32 = 21;
    pub const INT4: u32 = 23;
    pub const OID: u32 = 26;
    pub const JSON: u32 = 114;
    pub const FLOAT4: u32 = 700;
    pub const FLOAT8: u32 = 701;
    pub const DATE: u32 = 1082;
    pub const TIME: u32 = 1083;
    pub const TIMESTAMP: u32 = 1114;
    pub const TIMESTAMPTZ: u32 = 1184;
    pub const TIMETZ: u32 = 1266;
    pub const NUMERIC: u32 = 1700;
    pub const JSONB: u32 = 3802;
}

/// The element type of the array type `array` (`pg_type.typelem`), for the arrays of
/// the types above and of text; None for a type that is not one of these arrays.
pub fn element_of(array: u32) -> Option<u32> {
    Some(match array {
        1000 => oid::BOOL,
        1001 => oid::BYTEA,
        1005 => oid::INT2,
        1007 => oid::INT4,
        1016 => oid::INT8,
        1028 => oid::OID,
        199 => oid::JSON,
        1021 => oid::FLOAT4,
        1022 => oid::FLOAT8,
        1182 => oid::DATE,
        1183 => oid::TIME,
        1115 => oid::TIMESTAMP,
        1185 => oid::TIMESTAMPTZ,
        1270 => oid::TIMETZ,
        1231 => oid::NUMERIC,
        3807 => oid::JSONB,
        1009 => 25,   // text
        1015 => 1043, // varchar
        1014 => 1042, // bpchar
        2951 => 2950, // uuid
        _ => return None,
    })
}

/// The value of a column of type `type_oid` (modifier `typmod`, -1 when none) whose
/// text form is `text`; an error names what the text is not.
pub fn convert(type_oid: u32, typmod: i32, text: &str) -> Result<Value, String> {
    if let Some(element) = element_of(type_oid) {
        return array(text)?
            .into_iter()
            .map(|e| match e {
                None => Ok(Value::Null),
                Some(t) => convert(element, typmod, &t),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array);
    }
    let bad = |what: &str| format!("{text:?} is not {what}");
    Ok(match type_oid {
        oid::BOOL => match text {
            "t" => Value::Bool(true),
            "f" => Value::Bool(false),
            _ => return Err(bad("a boolean")),
        },
        oid::INT2 | oid::INT4 | oid::INT8 | oid::OID | oid::FLOAT4 | oid::FLOAT8 | oid::NUMERIC => {
            number(text).ok_or_else(|| bad("a number"))?
        }
        oid::DATE => match infinite(text) {
            Some(v) => v,
            None => {
                let d = NaiveDate::parse_from_str(text, "%Y-%m-%d").map_err(|_| bad("a date"))?;
                Value::from(d.signed_duration_since(epoch_day()).num_days())
            }
        },
        oid::TIME => {
            let t = NaiveTime::parse_from_str(text, "%H:%M:%S%.f").map_err(|_| bad("a time"))?;
            Value::from(micros_of_day(&t))
        }
        oid::TIMESTAMP => match infinite(text) {
            Some(v) => v,
            None => {
                let t = NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f")
                    .map_err(|_| bad("a timestamp"))?;
                let micros = t.and_utc().timestamp_micros();
                // timestamp(0) to timestamp(3): milliseconds, as Debezium's adaptive mode.
                if (0..=3).contains(&typmod) {
                    Value::from(micros.div_euclid(1000))
                } else {
                    Value::from(micros)
                }
            }
        },
        oid::TIMESTAMPTZ => match infinite(text) {
            Some(v) => v,
            None => {
                let t = DateTime::parse_from_str(&offset_minutes(text), "%Y-%m-%d %H:%M:%S%.f%:z")
                    .map_err(|_| bad("a timestamp with time zone"))?
                    .to_utc();
                Value::from(zoned(&t, typmod))
            }
        },
        oid::TIMETZ => {
            let full = offset_minutes(text);
            let (time, offset) = split_offset(&full).ok_or_else(|| bad("a time with time zone"))?;
            let t = NaiveTime::parse_from_str(time, "%H:%M:%S%.f")
                .map_err(|_| bad("a time with time zone"))?;
            let utc = t - chrono::Duration::seconds(i64::from(offset));
            Value::from(utc.format("%H:%M:%S%.fZ").to_string())
        }
        oid::BYTEA => {
            let hex = text
                .strip_prefix("\\x")
                .ok_or_else(|| bad("bytea in hex"))?;
            let bytes = decode_hex(hex).ok_or_else(|| bad("bytea in hex"))?;
            Value::from(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
        _ => Value::from(text),
    })
}

/// A time with time zone as Debezium's `ZonedTimestamp` writes one of PostgreSQL: in
/// UTC, with exactly the column's precision of fractional digits (`timestamptz(p)`;
/// 6 when unset), none for precision 0.
fn zoned(t: &DateTime<chrono::Utc>, typmod: i32) -> String {
    let width = if (0..=6).contains(&typmod) { typmod } else { 6 };
    let base = t.format("%Y-%m-%dT%H:%M:%S");
    if width == 0 {
        return format!("{base}Z");
    }
    let fraction = t.nanosecond() / 10u32.pow(9 - width as u32);
    format!("{base}.{fraction:0w$}Z", w = width as usize)
}

fn epoch_day() -> NaiveDate {
    NaiveDate::from_ymd_opt(1970, 1, 1).expect("a date")
}

fn micros_of_day(t: &NaiveTime) -> i64 {
    i64::from(t.num_seconds_from_midnight()) * 1_000_000 + i64::from(t.nanosecond() / 1000)
}

/// `infinity` and `-infinity`, kept as their text.
fn infinite(text: &str) -> Option<Value> {
    matches!(text, "infinity" | "-infinity").then(|| Value::from(text))
}

/// A number's text as a JSON number with exactly those digits; `NaN` and the
/// infinities as strings; None when `text` is not a number.
fn number(text: &str) -> Option<Value> {
    match text {
        "NaN" | "Infinity" | "-Infinity" => return Some(Value::from(text)),
        _ => {}
    }
    // serde_json keeps a number's text (arbitrary precision).
    match serde_json::from_str::<Value>(text) {
        Ok(v @ Value::Number(_)) => Some(v),
        _ => None,
    }
}

/// PostgreSQL writes an offset as `+02`, `+05:30` or `+05:30:15`: as `+HH:MM` for
/// chrono (seconds of an offset are historical and dropped by no one; kept here as
/// an error).
fn offset_minutes(text: &str) -> String {
    match split_offset_text(text) {
        Some((body, sign, digits)) if digits.len() == 2 => format!("{body}{sign}{digits}:00"),
        _ => text.to_string(),
    }
}

/// `(before the offset, its sign, its digits)` of a text ending in an offset.
fn split_offset_text(text: &str) -> Option<(&str, char, &str)> {
    let at = text.rfind(['+', '-'])?;
    let (body, offset) = text.split_at(at);
    // A date's own dashes come before the time; an offset follows a time's digits.
    if !body.contains(':') {
        return None;
    }
    let sign = offset.chars().next()?;
    Some((body, sign, &offset[1..]))
}

/// A time and its offset east of UTC in seconds, from `HH:MM:SS[.f]+HH:MM`.
fn split_offset(text: &str) -> Option<(&str, i32)> {
    let (body, sign, digits) = split_offset_text(text)?;
    let (h, m) = digits.split_once(':')?;
    let seconds = h.parse::<i32>().ok()? * 3600 + m.parse::<i32>().ok()? * 60;
    Some((body, if sign == '-' { -seconds } else { seconds }))
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The elements of a one-dimensional array literal (`{1,2,NULL}`,
/// `{"a b","c\"d",NULL,"NULL"}`): None for an unquoted `NULL`.
pub fn array(text: &str) -> Result<Vec<Option<String>>, String> {
    let bad = |why: &str| format!("{text:?} is not an array literal: {why}");
    let inner = text
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .ok_or_else(|| bad("no braces"))?;
    if inner.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    let mut chars = inner.chars().peekable();
    loop {
        let element = if chars.peek() == Some(&'"') {
            chars.next();
            let mut s = String::new();
            loop {
                match chars.next() {
                    Some('\\') => s.push(chars.next().ok_or_else(|| bad("an escape at the end"))?),
                    Some('"') => break,
                    Some(c) => s.push(c),
                    None => return Err(bad("an unterminated quote")),
                }
            }
            Some(s)
        } else {
            let mut s = String::new();
            while let Some(c) = chars.peek().copied().filter(|c| *c != ',') {
                if c == '{' {
                    return Err(bad("more than one dimension"));
                }
                s.push(c);
                chars.next();
            }
            (s != "NULL").then_some(s)
        };
        out.push(element);
        match chars.next() {
            Some(',') => continue,
            None => break,
            Some(_) => return Err(bad("text after a quoted element")),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn c(type_oid: u32, text: &str) -> Value {
        convert(type_oid, -1, text).unwrap()
    }

    #[test]
    fn numbers_keep_their_digits() {
        assert_eq!(
            c(oid::INT8, "-9223372036854775808").to_string(),
            "-9223372036854775808"
        );
        assert_eq!(
            c(oid::NUMERIC, "12345678901234567890.000100").to_string(),
            "12345678901234567890.000100"
        );
        assert_eq!(c(oid::FLOAT8, "1.5e+300").to_string(), "1.5e+300");
        assert_eq!(c(oid::NUMERIC, "NaN"), json!("NaN"));
        assert_eq!(c(oid::FLOAT4, "-Infinity"), json!("-Infinity"));
        assert!(convert(oid::INT4, -1, "12a").is_err());
        assert_eq!(c(oid::BOOL, "t"), json!(true));
    }

    #[test]
    fn times_are_debezium_s() {
        assert_eq!(c(oid::DATE, "1970-01-02"), json!(1));
        assert_eq!(c(oid::DATE, "1969-12-31"), json!(-1));
        assert_eq!(c(oid::DATE, "infinity"), json!("infinity"));
        assert_eq!(c(oid::TIME, "01:00:00.5"), json!(3_600_500_000i64));
        assert_eq!(
            c(oid::TIMESTAMP, "2024-05-01 12:00:00.123456"),
            json!(1_714_564_800_123_456i64)
        );
        assert_eq!(
            convert(oid::TIMESTAMP, 3, "2024-05-01 12:00:00.123").unwrap(),
            json!(1_714_564_800_123i64)
        );
        assert_eq!(
            c(oid::TIMESTAMPTZ, "2024-05-01 14:00:00.5+02"),
            json!("2024-05-01T12:00:00.500000Z")
        );
        assert_eq!(
            c(oid::TIMESTAMPTZ, "2024-05-01 06:30:00+05:30"),
            json!("2024-05-01T01:00:00.000000Z")
        );
        // timestamptz(3) and (0): the column's precision.
        assert_eq!(
            convert(oid::TIMESTAMPTZ, 3, "2024-05-01 14:00:00.5+02").unwrap(),
            json!("2024-05-01T12:00:00.500Z")
        );
        assert_eq!(
            convert(oid::TIMESTAMPTZ, 0, "2024-05-01 14:00:00+02").unwrap(),
            json!("2024-05-01T12:00:00Z")
        );
        assert_eq!(c(oid::TIMETZ, "12:00:00-01"), json!("13:00:00Z"));
    }

    #[test]
    fn bytes_json_and_arrays() {
        assert_eq!(c(oid::BYTEA, "\\x00ff"), json!("AP8="));
        assert!(convert(oid::BYTEA, -1, "\\x0").is_err());
        assert_eq!(c(oid::JSONB, r#"{"a": 1}"#), json!(r#"{"a": 1}"#));
        assert_eq!(c(1007, "{1,NULL,3}"), json!([1, null, 3]));
        assert_eq!(
            c(1009, r#"{"a b","c\"d",NULL,"NULL",e}"#),
            json!(["a b", "c\"d", null, "NULL", "e"])
        );
        assert_eq!(c(1009, "{}"), json!([]));
        assert!(convert(1007, -1, "{{1},{2}}").is_err(), "two dimensions");
        assert_eq!(
            c(2950, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
            json!("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
        );
    }
}
