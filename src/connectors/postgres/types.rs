//! A JSON value as the text of a column's type: what the sink checks itself before
//! the database sees a row, so that a value that cannot fit is the record's error
//! (with the column named) and not a failed statement.
//!
//! Values travel as text and the database casts them with the type's own input
//! function, exactly as `COPY` does; the checks here refuse what that function would
//! refuse for the common types, and leave the rest (an enum label, a `CHECK`) to the
//! database, whose refusal is then found row by row.

use chrono::{DateTime, NaiveDate, NaiveDateTime, SecondsFormat, Utc};
use serde_json::value::RawValue;

/// What the sink knows about a column's type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// `smallint`, `integer`, `bigint`: the bounds.
    Int {
        min: i64,
        max: i64,
    },
    /// `real`, `double precision`.
    Float,
    /// `numeric`: the JSON number's own digits, never rounded through a float.
    Numeric,
    Bool,
    /// `json`, `jsonb`: the value's JSON text.
    Json,
    /// `timestamp with time zone`: RFC 3339 with an offset. A bare number is refused:
    /// nothing says whether it counts days, milliseconds or microseconds.
    Timestamptz,
    /// `timestamp without time zone`: RFC 3339 (converted to UTC) or a local
    /// `YYYY-MM-DDTHH:MM:SS[.f]`; a bare number is refused.
    Timestamp,
    /// `date`: `YYYY-MM-DD` or RFC 3339 (its UTC date); a bare number is refused.
    Date,
    /// Text types; `max_chars` for `varchar(n)` and `char(n)`; `padded` for `char(n)`,
    /// whose trailing spaces do not count.
    Text {
        max_chars: Option<usize>,
        padded: bool,
    },
    /// An array type: a JSON array becomes an array literal.
    Array,
    /// `uuid`: a string, which the database checks; as a key, compared in lower case
    /// without hyphens.
    Uuid,
    /// Anything else (`inet`, an enum): a string as it is, other values as their JSON
    /// text; the database checks it.
    Other,
}

impl Kind {
    /// The kind of a column whose (base) type is `typname` (`int4`, `_text`), of type
    /// category `category` (`pg_type.typcategory`), with `typmod` (`atttypmod`).
    pub fn of(typname: &str, category: &str, typmod: i32) -> Kind {
        match typname {
            "int2" => Kind::Int {
                min: i16::MIN.into(),
                max: i16::MAX.into(),
            },
            "int4" => Kind::Int {
                min: i32::MIN.into(),
                max: i32::MAX.into(),
            },
            "int8" => Kind::Int {
                min: i64::MIN,
                max: i64::MAX,
            },
            "float4" | "float8" => Kind::Float,
            "numeric" => Kind::Numeric,
            "bool" => Kind::Bool,
            "json" | "jsonb" => Kind::Json,
            "timestamptz" => Kind::Timestamptz,
            "timestamp" => Kind::Timestamp,
            "date" => Kind::Date,
            "varchar" | "bpchar" => Kind::Text {
                // A varchar's typmod is its length plus the 4 bytes of a header.
                max_chars: (typmod > 4).then(|| (typmod - 4) as usize),
                padded: typname == "bpchar",
            },
            "text" | "name" | "citext" => Kind::Text {
                max_chars: None,
                padded: false,
            },
            "uuid" => Kind::Uuid,
            _ if category == "A" => Kind::Array,
            _ => Kind::Other,
        }
    }
}

/// A JSON value as the text `kind` takes (`None`: SQL NULL), or why it cannot be.
pub fn to_text(kind: &Kind, raw: &RawValue) -> Result<Option<String>, String> {
    let text = raw.get();
    let first = text.as_bytes().first().copied().unwrap_or(b'n');
    if text == "null" {
        return Ok(None);
    }
    let string = || -> Result<String, String> {
        serde_json::from_str::<String>(text).map_err(|e| format!("bad JSON string: {e}"))
    };
    let is_number = first == b'-' || first.is_ascii_digit();
    let is_string = first == b'"';
    let what = || match first {
        b'"' => "a string",
        b't' | b'f' => "a boolean",
        b'{' => "an object",
        b'[' => "an array",
        _ => "a number",
    };
    let out = match kind {
        Kind::Int { min, max } => {
            // The common case, a plain JSON integer, costs one parse and one copy.
            if let Some(n) = is_number.then(|| text.parse::<i64>().ok()).flatten() {
                if n < *min || n > *max {
                    return Err(format!("{n} is out of the column's range ({min} to {max})"));
                }
                // `-0` is 0: one spelling per value, as keys compare them.
                return Ok(Some(n.to_string()));
            }
            let s = if is_number {
                text.to_string()
            } else if is_string {
                string()?.trim().to_string()
            } else {
                return Err(format!("{} is not an integer", what()));
            };
            let n = integer(&s).ok_or_else(|| format!("`{s}` is not an integer"))?;
            if n < *min || n > *max {
                return Err(format!("{n} is out of the column's range ({min} to {max})"));
            }
            n.to_string()
        }
        Kind::Float | Kind::Numeric => {
            let s = if is_number {
                text.to_string()
            } else if is_string {
                string()?.trim().to_string()
            } else {
                return Err(format!("{} is not a number", what()));
            };
            let special = matches!(
                s.to_ascii_lowercase().as_str(),
                "nan" | "infinity" | "-infinity" | "+infinity" | "inf" | "-inf"
            );
            if !special && s.parse::<f64>().is_err() {
                return Err(format!("`{s}` is not a number"));
            }
            s
        }
        Kind::Bool => match text {
            "true" | "false" => text.to_string(),
            _ if is_string => {
                let s = string()?;
                match s.trim().to_ascii_lowercase().as_str() {
                    "true" | "t" | "yes" | "y" | "on" | "1" => "true".into(),
                    "false" | "f" | "no" | "n" | "off" | "0" => "false".into(),
                    _ => return Err(format!("`{s}` is not a boolean")),
                }
            }
            _ => return Err(format!("{} is not a boolean", what())),
        },
        Kind::Json => text.to_string(),
        Kind::Timestamptz | Kind::Timestamp | Kind::Date => time(kind, text, is_number, || {
            if is_string {
                string()
            } else {
                Err(format!("{} is not a time", what()))
            }
        })?,
        Kind::Text { max_chars, .. } => {
            let s = if is_string {
                string()?
            } else {
                text.to_string()
            };
            if let Some(max) = max_chars {
                let n = s.chars().count();
                if n > *max {
                    return Err(format!("{n} characters do not fit the column's {max}"));
                }
            }
            s
        }
        Kind::Array => {
            if is_string {
                string()?
            } else if first == b'[' {
                let v: serde_json::Value =
                    serde_json::from_str(text).map_err(|e| format!("bad JSON array: {e}"))?;
                array_literal(&v)
            } else {
                return Err(format!("{} is not an array", what()));
            }
        }
        Kind::Other | Kind::Uuid => {
            if is_string {
                string()?
            } else {
                text.to_string()
            }
        }
    };
    if out.contains('\0') {
        return Err("PostgreSQL text cannot hold the NUL character (\\u0000)".into());
    }
    Ok(Some(out))
}

/// An integer from its JSON or string form: digits, or a number with a zero
/// fraction (`3.0`, `3e2`).
fn integer(s: &str) -> Option<i64> {
    if let Ok(n) = s.parse::<i64>() {
        return Some(n);
    }
    // Decided on the digits, never through a float (2.9999999999999999 is no integer).
    canonical_decimal(s)?.parse().ok()
}

/// A decimal number's one spelling: no sign on zero, no leading or trailing zeros, no
/// exponent (`1.50`, `+1.5e0` and `15E-1` are all `1.5`; `3e2` is `300`); None for
/// anything else, or an exponent beyond a thousand digits.
pub fn canonical_decimal(s: &str) -> Option<String> {
    let s = s.trim();
    let (negative, rest) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(i) => (&rest[..i], rest[i + 1..].parse::<i64>().ok()?),
        None => (rest, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if whole.is_empty() && fraction.is_empty()
        || !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let digits = format!("{whole}{fraction}");
    let mut exp = exponent.checked_sub(fraction.len() as i64)?;
    let digits = digits.trim_start_matches('0');
    let trimmed = digits.trim_end_matches('0');
    exp = exp.checked_add((digits.len() - trimmed.len()) as i64)?;
    if trimmed.is_empty() {
        return Some("0".into());
    }
    if !(-1000..=1000).contains(&exp) {
        return None;
    }
    let mut out = String::from(if negative { "-" } else { "" });
    if exp >= 0 {
        out.push_str(trimmed);
        out.extend(std::iter::repeat_n('0', exp as usize));
    } else {
        let point = trimmed.len() as i64 + exp;
        if point > 0 {
            out.push_str(&trimmed[..point as usize]);
            out.push('.');
            out.push_str(&trimmed[point as usize..]);
        } else {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-point) as usize));
            out.push_str(trimmed);
        }
    }
    Some(out)
}

/// The one spelling of a key column's value of kind `kind` (`value` as [`to_text`]
/// made it): what two records must share to name the same row. Numbers compare by
/// value (`1.0` is `1`), UUIDs in lower case; other kinds are already made canonical
/// by [`to_text`], or compare as the text itself.
pub fn canonical_key(kind: &Kind, value: &str) -> String {
    match kind {
        Kind::Numeric => canonical_decimal(value).unwrap_or_else(|| value.to_string()),
        Kind::Float => value
            .parse::<f64>()
            .map_or_else(|_| value.to_string(), |f| f.to_string()),
        Kind::Uuid => value.to_ascii_lowercase().replace(['-', '{', '}'], ""),
        Kind::Text { padded: true, .. } => value.trim_end_matches(' ').to_string(),
        _ => value.to_string(),
    }
}

/// The text of a time column's value: a string the sink reads as a date or time. A
/// bare number is refused whatever its size: Debezium alone counts days (`Date`),
/// milliseconds, microseconds or nanoseconds (`MicroTimestamp`, ...) in plain
/// integers, and only the schema that names the type can tell which.
fn time(
    kind: &Kind,
    text: &str,
    is_number: bool,
    string: impl FnOnce() -> Result<String, String>,
) -> Result<String, String> {
    if is_number {
        return Err(format!(
            "{text} is a bare number, and the sink does not guess whether it counts days, \
             milliseconds or microseconds: send ISO 8601 text (a format decodes Debezium's \
             types from their schema; `temporal = \"iso8601\"` writes Kafka Connect's, Avro's \
             and Protobuf's timestamps as text)"
        ));
    }
    let s = string()?;
    let parsed = DateTime::parse_from_rfc3339(s.trim())
        .ok()
        .map(|d| d.with_timezone(&Utc));
    Ok(match (kind, parsed) {
        (Kind::Timestamptz, Some(t)) => t.to_rfc3339_opts(SecondsFormat::AutoSi, true),
        (Kind::Timestamp, Some(t)) => t.naive_utc().format("%Y-%m-%dT%H:%M:%S%.f").to_string(),
        (Kind::Date, Some(t)) => t.date_naive().to_string(),
        (Kind::Timestamp, None) => {
            // One spelling per instant (`T` or a space, fractions), as keys compare them.
            match ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f"]
                .iter()
                .find_map(|f| NaiveDateTime::parse_from_str(s.trim(), f).ok())
            {
                Some(t) => t.format("%Y-%m-%dT%H:%M:%S%.f").to_string(),
                None => return Err(format!("`{s}` is not a date or time the sink reads")),
            }
        }
        (Kind::Date, None) => match NaiveDate::parse_from_str(s.trim(), "%Y-%m-%d") {
            Ok(d) => d.to_string(),
            Err(_) => return Err(format!("`{s}` is not a date or time the sink reads")),
        },
        (Kind::Timestamptz, None) => {
            return Err(format!(
                "`{s}` is not an RFC 3339 time with an offset (2024-05-01T12:00:00Z)"
            ))
        }
        _ => unreachable!("time() is called for time kinds only"),
    })
}

/// A time as the sink reads one (RFC 3339; a local `YYYY-MM-DD[T ]HH:MM:SS[.f]` or a
/// date, both taken as UTC) in epoch milliseconds; None for any other text.
pub fn epoch_millis(s: &str) -> Option<i64> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Some(t.timestamp_millis());
    }
    ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(s, f).ok())
        .or_else(|| {
            NaiveDate::parse_from_str(s, "%Y-%m-%d")
                .ok()
                .and_then(|d| d.and_hms_opt(0, 0, 0))
        })
        .map(|t| t.and_utc().timestamp_millis())
}

/// A JSON array as a PostgreSQL array literal (`{1,"a b",NULL,{2,3}}`).
fn array_literal(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(array_literal).collect();
            format!("{{{}}}", inner.join(","))
        }
        Value::Null => "NULL".into(),
        Value::String(s) => quote_element(s),
        Value::Object(_) => quote_element(&v.to_string()),
        other => other.to_string(),
    }
}

fn quote_element(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv(kind: &Kind, json: &str) -> Result<Option<String>, String> {
        let raw: Box<RawValue> = serde_json::from_str(json).unwrap();
        to_text(kind, &raw)
    }

    fn int4() -> Kind {
        Kind::of("int4", "N", -1)
    }

    #[test]
    fn integers_fit_their_column_or_name_why_not() {
        assert_eq!(conv(&int4(), "42").unwrap().as_deref(), Some("42"));
        assert_eq!(conv(&int4(), "\" 7 \"").unwrap().as_deref(), Some("7"));
        assert_eq!(conv(&int4(), "3.0").unwrap().as_deref(), Some("3"));
        assert_eq!(conv(&int4(), "null").unwrap(), None);
        assert!(conv(&int4(), "2147483648").unwrap_err().contains("out of"));
        assert!(conv(&int4(), "1.5").unwrap_err().contains("not an integer"));
        assert!(conv(&int4(), "2.9999999999999999").is_err(), "no rounding");
        assert_eq!(conv(&int4(), "3e2").unwrap().as_deref(), Some("300"));
        assert_eq!(conv(&int4(), "-0").unwrap().as_deref(), Some("0"));
        assert!(conv(&int4(), "true").unwrap_err().contains("a boolean"));
        assert!(conv(&Kind::of("int2", "N", -1), "40000").is_err());
        assert_eq!(
            conv(&Kind::of("int8", "N", -1), "9223372036854775807")
                .unwrap()
                .as_deref(),
            Some("9223372036854775807")
        );
    }

    #[test]
    fn a_decimal_has_one_canonical_spelling() {
        for (a, b) in [
            ("1.50", "1.5"),
            ("+1.5e0", "1.5"),
            ("15E-1", "1.5"),
            ("3e2", "300"),
            ("-0.000", "0"),
            ("0.0012", "0.0012"),
            ("12e-5", "0.00012"),
            ("007", "7"),
            ("-10", "-10"),
        ] {
            assert_eq!(canonical_decimal(a).as_deref(), Some(b), "{a}");
        }
        for bad in ["", ".", "1.2.3", "1e", "abc", "1e99999", "--1"] {
            assert_eq!(canonical_decimal(bad), None, "{bad}");
        }
        let n = Kind::of("numeric", "N", -1);
        assert_eq!(canonical_key(&n, "1.0"), canonical_key(&n, "1"));
        let u = Kind::of("uuid", "U", -1);
        assert_eq!(
            canonical_key(&u, "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11"),
            canonical_key(&u, "a0eebc999c0b4ef8bb6d6bb9bd380a11")
        );
        let ts = Kind::of("timestamp", "D", -1);
        assert_eq!(
            conv(&ts, "\"2024-05-01 12:00:00\"").unwrap(),
            conv(&ts, "\"2024-05-01T12:00:00.000\"").unwrap()
        );
    }

    #[test]
    fn numeric_keeps_the_digits_as_written() {
        let n = Kind::of("numeric", "N", -1);
        assert_eq!(
            conv(&n, "12345678901234567890.123456789")
                .unwrap()
                .as_deref(),
            Some("12345678901234567890.123456789")
        );
        assert!(conv(&n, "\"abc\"").is_err());
        assert!(conv(&n, "{}").is_err());
    }

    #[test]
    fn times_from_rfc3339_text() {
        let tz = Kind::of("timestamptz", "D", -1);
        assert_eq!(
            conv(&tz, "\"2024-05-01T12:00:00+02:00\"")
                .unwrap()
                .as_deref(),
            Some("2024-05-01T10:00:00Z")
        );
        assert!(conv(&tz, "\"yesterday\"").is_err());
        assert!(conv(&tz, "\"2024-05-01 12:00:00\"").is_err(), "no offset");
        let ts = Kind::of("timestamp", "D", -1);
        assert_eq!(
            conv(&ts, "\"2024-05-01 12:00:00\"").unwrap().as_deref(),
            Some("2024-05-01T12:00:00")
        );
        let d = Kind::of("date", "D", -1);
        assert_eq!(
            conv(&d, "\"2024-05-01\"").unwrap().as_deref(),
            Some("2024-05-01")
        );
        assert_eq!(
            conv(&d, "\"1969-12-31\"").unwrap().as_deref(),
            Some("1969-12-31")
        );
        let micros = Kind::of("timestamp", "D", -1);
        assert_eq!(
            conv(&micros, "\"2024-05-01T12:34:56.789012\"")
                .unwrap()
                .as_deref(),
            Some("2024-05-01T12:34:56.789012")
        );
    }

    /// A bare number for a time column is refused, never read in a unit guessed for
    /// it: Debezium's 19844 (days: 2024-05-01) was once written as 1970-01-01.
    #[test]
    fn a_bare_number_for_a_time_column_is_refused() {
        for typname in ["date", "timestamp", "timestamptz"] {
            let kind = Kind::of(typname, "D", -1);
            for n in ["19844", "86400000", "1714566896789012", "-1", "0", "1.5e3"] {
                let e = conv(&kind, n).unwrap_err();
                assert!(
                    e.contains("bare number") && e.contains(n),
                    "{typname} {n}: {e}"
                );
            }
            // A string of digits is no date either.
            assert!(conv(&kind, "\"19844\"").is_err(), "{typname}");
        }
    }

    #[test]
    fn text_takes_any_value_within_its_length() {
        let v = Kind::of("varchar", "S", 8);
        assert_eq!(conv(&v, "\"abcd\"").unwrap().as_deref(), Some("abcd"));
        assert!(conv(&v, "\"abcde\"").unwrap_err().contains("5 characters"));
        let t = Kind::of("text", "S", -1);
        assert_eq!(conv(&t, "12").unwrap().as_deref(), Some("12"));
        assert_eq!(
            conv(&t, "{\"a\": 1}").unwrap().as_deref(),
            Some("{\"a\": 1}")
        );
        assert!(conv(&t, "\"a\\u0000b\"").unwrap_err().contains("NUL"));
    }

    #[test]
    fn json_keeps_its_text_and_arrays_become_literals() {
        let j = Kind::of("jsonb", "U", -1);
        assert_eq!(
            conv(&j, "{\"big\": 123456789012345678901234567890}")
                .unwrap()
                .as_deref(),
            Some("{\"big\": 123456789012345678901234567890}")
        );
        assert_eq!(conv(&j, "\"s\"").unwrap().as_deref(), Some("\"s\""));
        let a = Kind::of("_text", "A", -1);
        assert_eq!(
            conv(&a, r#"["a b", null, "q\"", [1, 2]]"#)
                .unwrap()
                .as_deref(),
            Some(r#"{"a b",NULL,"q\"",{1,2}}"#)
        );
        assert!(conv(&a, "5").is_err());
    }

    #[test]
    fn booleans_from_booleans_and_their_words() {
        let b = Kind::of("bool", "B", -1);
        assert_eq!(conv(&b, "true").unwrap().as_deref(), Some("true"));
        assert_eq!(conv(&b, "\"off\"").unwrap().as_deref(), Some("false"));
        assert!(conv(&b, "1").is_err());
    }
}
