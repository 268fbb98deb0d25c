//! What a JSON value must be to become a column's value exactly, checked before Arrow's
//! JSON decoder reads it: the decoder reads some values as other values without a word
//! (the digits of a decimal past its scale, a fraction in an integer column, the
//! sub-second digits a timestamp's unit has no room for, a local time with a zone), and
//! reads bytes as hex where lockgate's formats write base64.
//!
//! Every check names the field (`ship.weight`, `tags[]`, `attrs{}`) and says why; the
//! file sink's item error policy then decides what becomes of the record.

use arrow_schema::{DataType, Field, Schema, TimeUnit};
use serde_json::Value;

/// The metadata key of a string column that holds an Avro enum: its symbols, joined
/// by commas (an Avro symbol has none).
pub const ENUM_SYMBOLS: &str = "avro.enum.symbols";

/// Base64 as lockgate's formats write it (the standard alphabet), padded or not.
const BASE64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// `value` (one record's JSON text) as Arrow's decoder is to read it, every column's
/// value checked and binary values turned from base64 into the hex the decoder reads.
pub fn prepared(schema: &Schema, value: &[u8]) -> Result<Vec<u8>, String> {
    let mut v: Value = serde_json::from_slice(value)
        .map_err(|e| format!("the value is not one JSON object: {e}"))?;
    let Some(obj) = v.as_object_mut() else {
        return Err("the value is not a JSON object".into());
    };
    for f in schema.fields() {
        if let Some(x) = obj.get_mut(f.name()) {
            prepare(f, x, f.name())?;
        }
    }
    Ok(serde_json::to_vec(&v).expect("a JSON value serializes"))
}

fn prepare(field: &Field, v: &mut Value, path: &str) -> Result<(), String> {
    use base64::Engine;
    let t = field.data_type();
    match (t, &mut *v) {
        (_, Value::Null) => Ok(()),
        (DataType::Decimal128(p, scale), _) => decimal_fits(v, i64::from(*p), *scale, path),
        (DataType::Decimal256(p, scale), _) => decimal_fits(v, i64::from(*p), *scale, path),
        (DataType::Int32 | DataType::Int64, Value::Number(n)) => {
            let text = n.to_string();
            let fits = match t {
                DataType::Int32 => text.parse::<i32>().is_ok(),
                _ => text.parse::<i64>().is_ok(),
            };
            if fits {
                Ok(())
            } else {
                Err(format!(
                    "{path}: {text} is not an integer of the column's size"
                ))
            }
        }
        (DataType::Float32 | DataType::Float64, Value::Number(n)) => {
            let text = n.to_string();
            let finite = match t {
                DataType::Float32 => text.parse::<f32>().is_ok_and(f32::is_finite),
                _ => text.parse::<f64>().is_ok_and(f64::is_finite),
            };
            if finite {
                Ok(())
            } else {
                Err(format!("{path}: {text} is out of the column's range"))
            }
        }
        (DataType::Float32 | DataType::Float64, Value::String(text)) => Err(format!(
            "{path}: {text:?} is text; a float column takes a JSON number"
        )),
        (DataType::Timestamp(unit, zone), _) => timestamp_fits(v, *unit, zone.is_some(), path),
        (DataType::Date32, _) => date_fits(v, path),
        (DataType::Time32(unit) | DataType::Time64(unit), _) => time_fits(v, *unit, path),
        (DataType::Utf8, Value::String(s)) => match field.metadata().get(ENUM_SYMBOLS) {
            Some(symbols) if !symbols.split(',').any(|x| x == s) => Err(format!(
                "{path}: {s:?} is not one of the enum's symbols ({symbols})"
            )),
            _ => Ok(()),
        },
        (DataType::Binary | DataType::FixedSizeBinary(_), Value::String(text)) => {
            let bytes = BASE64
                .decode(text.as_bytes())
                .map_err(|e| format!("{path}: not base64 ({e})"))?;
            if let DataType::FixedSizeBinary(n) = t {
                if bytes.len() != *n as usize {
                    return Err(format!(
                        "{path}: {} bytes for a fixed size of {n}",
                        bytes.len()
                    ));
                }
            }
            *v = Value::String(bytes.iter().map(|b| format!("{b:02x}")).collect());
            Ok(())
        }
        (DataType::Binary | DataType::FixedSizeBinary(_), _) => {
            Err(format!("{path}: bytes are a base64 string"))
        }
        (DataType::Struct(fields), Value::Object(o)) => {
            fields.iter().try_for_each(|f| match o.get_mut(f.name()) {
                Some(x) => prepare(f, x, &format!("{path}.{}", f.name())),
                None => Ok(()),
            })
        }
        (DataType::List(f), Value::Array(items)) => items
            .iter_mut()
            .try_for_each(|x| prepare(f, x, &format!("{path}[]"))),
        (DataType::Map(entries, _), Value::Object(o)) => match entries.data_type() {
            DataType::Struct(kv) if kv.len() == 2 => o
                .values_mut()
                .try_for_each(|x| prepare(&kv[1], x, &format!("{path}{{}}"))),
            _ => Ok(()),
        },
        // Arrow's decoder refuses the other mismatches itself, naming the field.
        _ => Ok(()),
    }
}

/// Whether the decimal `v` fits a column of `precision` and `scale` exactly: Arrow's
/// decoder drops digits past the scale and mishandles huge exponents.
fn decimal_fits(v: &Value, precision: i64, scale: i8, path: &str) -> Result<(), String> {
    let text = match v {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        // Arrow's decoder refuses other kinds, naming the field.
        _ => return Ok(()),
    };
    let Some(places) = decimal_places(&text) else {
        return Err(format!("{path}: {text} is not a decimal number"));
    };
    if places > i64::from(scale) {
        return Err(format!(
            "{path}: {text} has {places} decimal places, more than the column's scale {scale}"
        ));
    }
    if exponent(&text).is_some_and(|e| e.abs() > precision + i64::from(scale) + 1) {
        return Err(format!("{path}: {text} is out of the column's range"));
    }
    Ok(())
}

fn exponent(text: &str) -> Option<i64> {
    text.find(['e', 'E'])
        .map(|i| text[i + 1..].parse::<i64>().unwrap_or(i64::MAX))
}

/// The decimal places `text` (a decimal numeral, maybe with an exponent) needs: its
/// trailing zeros need none. None when it is not a numeral.
pub fn decimal_places(text: &str) -> Option<i64> {
    let (mantissa, exp) = match text.find(['e', 'E']) {
        Some(i) => (&text[..i], text[i + 1..].parse::<i64>().ok()?),
        None => (text, 0),
    };
    let mantissa = mantissa.strip_prefix(['-', '+']).unwrap_or(mantissa);
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int.is_empty() && frac.is_empty()
        || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
    {
        return None;
    }
    // value = digits x 10^(exp - frac.len()); trailing zeros of the digits need no place.
    let digits = format!("{int}{frac}");
    let zeros = (digits.len() - digits.trim_end_matches('0').len()) as i64;
    let places = (frac.len() as i64).checked_sub(exp)?.checked_sub(zeros)?;
    Some(places.max(0))
}

/// The digits of a second's fraction `unit` holds.
fn unit_digits(unit: TimeUnit) -> usize {
    match unit {
        TimeUnit::Second => 0,
        TimeUnit::Millisecond => 3,
        TimeUnit::Microsecond => 6,
        TimeUnit::Nanosecond => 9,
    }
}

/// The digits of the fraction of a second in `text` (`12:00:00.123` has 3), its
/// trailing zeros not counted.
fn fraction_digits(text: &str) -> usize {
    let Some(dot) = text.find('.') else {
        return 0;
    };
    let digits: String = text[dot + 1..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.trim_end_matches('0').len()
}

fn integer_number(v: &Value, path: &str, what: &str) -> Result<Option<i64>, String> {
    match v {
        Value::Number(n) => n
            .to_string()
            .parse::<i64>()
            .map(Some)
            .map_err(|_| format!("{path}: {n} is not a whole number of {what}")),
        _ => Ok(None),
    }
}

/// A timestamp: a whole number of the column's unit, or RFC 3339 text whose fraction
/// the unit holds; with a zone (`timestamp-*`) the text must say its offset, without one
/// (`local-timestamp-*`) it must say none.
fn timestamp_fits(v: &Value, unit: TimeUnit, zoned: bool, path: &str) -> Result<(), String> {
    let units = match unit {
        TimeUnit::Second => "seconds",
        TimeUnit::Millisecond => "milliseconds",
        TimeUnit::Microsecond => "microseconds",
        TimeUnit::Nanosecond => "nanoseconds",
    };
    if integer_number(v, path, units)?.is_some() {
        return Ok(());
    }
    let Value::String(s) = v else {
        return Ok(());
    };
    let text = s.replacen(' ', "T", 1);
    let nanos = if zoned {
        chrono::DateTime::parse_from_rfc3339(&text)
            .map_err(|e| format!("{path}: {s:?} is not a time with its offset ({e})"))?
            .timestamp_subsec_nanos()
    } else {
        chrono::NaiveDateTime::parse_from_str(&text, "%Y-%m-%dT%H:%M:%S%.f")
            .map_err(|e| {
                format!("{path}: {s:?} is not a local date and time without an offset ({e})")
            })?
            .and_utc()
            .timestamp_subsec_nanos()
    };
    if nanos >= 1_000_000_000 {
        // Arrow would write a leap second as the next second.
        return Err(format!(
            "{path}: {s:?} is a leap second, which the column has no place for"
        ));
    }
    if fraction_digits(&text) > unit_digits(unit) {
        return Err(format!(
            "{path}: {s:?} has more digits of a second than the column's {units} hold"
        ));
    }
    Ok(())
}

/// A date: a whole number of days since 1970-01-01, or `YYYY-MM-DD` alone.
fn date_fits(v: &Value, path: &str) -> Result<(), String> {
    if integer_number(v, path, "days")?.is_some() {
        return Ok(());
    }
    if let Value::String(s) = v {
        chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d")
            .ok()
            .filter(|_| s.len() == 10)
            .ok_or_else(|| format!("{path}: {s:?} is not a date (YYYY-MM-DD)"))?;
    }
    Ok(())
}

/// A time of day: a whole number of the unit since midnight, below a day, or
/// `HH:MM:SS[.fraction]` whose fraction the unit holds.
fn time_fits(v: &Value, unit: TimeUnit, path: &str) -> Result<(), String> {
    let per_day: i64 = match unit {
        TimeUnit::Second => 86_400,
        TimeUnit::Millisecond => 86_400_000,
        TimeUnit::Microsecond => 86_400_000_000,
        TimeUnit::Nanosecond => 86_400_000_000_000,
    };
    if let Some(n) = integer_number(v, path, "the column's unit")? {
        if !(0..per_day).contains(&n) {
            return Err(format!("{path}: {n} is not a time of day"));
        }
        return Ok(());
    }
    if let Value::String(s) = v {
        let t = chrono::NaiveTime::parse_from_str(s, "%H:%M:%S%.f")
            .map_err(|e| format!("{path}: {s:?} is not a time of day ({e})"))?;
        if chrono::Timelike::nanosecond(&t) >= 1_000_000_000 {
            // Arrow would write a leap second past the end of the day.
            return Err(format!(
                "{path}: {s:?} is a leap second, which the column has no place for"
            ));
        }
        if fraction_digits(s) > unit_digits(unit) {
            return Err(format!(
                "{path}: {s:?} has more digits of a second than the column holds"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Arc;

    fn one(t: DataType, value: &str) -> Result<String, String> {
        one_field(Field::new("x", t, true), value)
    }

    fn one_field(f: Field, value: &str) -> Result<String, String> {
        let schema = Schema::new(vec![f]);
        prepared(&schema, format!(r#"{{"x":{value}}}"#).as_bytes())
            .map(|b| String::from_utf8(b).unwrap())
    }

    #[test]
    fn integers_are_whole_and_of_their_size() {
        assert!(one(DataType::Int64, "9007199254740993").is_ok());
        assert!(one(DataType::Int64, "1.9")
            .unwrap_err()
            .contains("not an integer"));
        assert!(one(DataType::Int64, "1e3").is_err());
        assert!(one(DataType::Int32, "3000000000").is_err());
        assert!(one(DataType::Int32, "-7").is_ok());
        assert!(one(DataType::Float32, "1e39")
            .unwrap_err()
            .contains("range"));
        assert!(one(DataType::Float64, "1e39").is_ok());
        assert!(one(DataType::Float32, r#""1e39""#).is_err());
        assert!(one(DataType::Float64, r#""NaN""#).is_err());
    }

    #[test]
    fn times_keep_their_digits_and_zones() {
        let utc = |u| DataType::Timestamp(u, Some("+00:00".into()));
        let local = |u| DataType::Timestamp(u, None);
        assert!(one(utc(TimeUnit::Millisecond), r#""2024-05-01T12:00:00.123Z""#).is_ok());
        assert!(one(
            utc(TimeUnit::Millisecond),
            r#""2024-05-01T12:00:00.123000+02:00""#
        )
        .is_ok());
        let e = one(
            utc(TimeUnit::Millisecond),
            r#""2024-05-01T12:00:00.123456Z""#,
        )
        .unwrap_err();
        assert!(e.contains("more digits of a second"), "{e}");
        assert!(one(
            utc(TimeUnit::Microsecond),
            r#""2024-05-01T12:00:00.123456Z""#
        )
        .is_ok());
        assert!(one(utc(TimeUnit::Millisecond), r#""2024-05-01T12:00:00""#).is_err());
        assert!(one(utc(TimeUnit::Millisecond), "1714564800123").is_ok());
        assert!(one(utc(TimeUnit::Millisecond), "1.7").is_err());
        assert!(one(local(TimeUnit::Millisecond), r#""2024-05-01T10:00:00""#).is_ok());
        let e = one(
            local(TimeUnit::Millisecond),
            r#""2024-05-01T10:00:00+02:00""#,
        )
        .unwrap_err();
        assert!(e.contains("without an offset"), "{e}");
        assert!(one(DataType::Date32, r#""2024-05-01""#).is_ok());
        assert!(one(DataType::Date32, r#""2024-05-01T23:30:00-05:00""#).is_err());
        assert!(one(DataType::Date32, "1.5").is_err());
        assert!(one(DataType::Date32, "19844").is_ok());
        let ms = DataType::Time32(TimeUnit::Millisecond);
        assert!(one(ms.clone(), r#""12:00:00.123""#).is_ok());
        assert!(one(ms.clone(), r#""12:00:00.123456""#).is_err());
        assert!(one(ms.clone(), "100000000").is_err());
        assert!(one(ms.clone(), "-5").is_err());
        assert!(one(ms.clone(), "43200000").is_ok());
        assert!(one(ms, r#""23:59:60""#)
            .unwrap_err()
            .contains("leap second"));
        assert!(one(utc(TimeUnit::Second), r#""2016-12-31T23:59:60Z""#).is_err());
    }

    #[test]
    fn an_enum_takes_its_symbols_only() {
        let f = Field::new("x", DataType::Utf8, false).with_metadata(HashMap::from([(
            ENUM_SYMBOLS.to_string(),
            "retail,wholesale".to_string(),
        )]));
        assert!(one_field(f.clone(), r#""retail""#).is_ok());
        let e = one_field(f, r#""zzz""#).unwrap_err();
        assert!(e.contains("not one of the enum's symbols"), "{e}");
        assert!(one(DataType::Utf8, r#""zzz""#).is_ok(), "a plain string");
    }

    #[test]
    fn nested_values_are_checked_where_they_are() {
        let t = DataType::Struct(
            vec![Field::new(
                "lines",
                DataType::List(Arc::new(Field::new("item", DataType::Int64, false))),
                false,
            )]
            .into(),
        );
        let e = one(t, r#"{"lines":[1,2.5]}"#).unwrap_err();
        assert!(e.starts_with("x.lines[]: 2.5"), "{e}");
    }

    #[test]
    fn decimal_places_count_what_the_value_needs() {
        assert_eq!(decimal_places("12"), Some(0));
        assert_eq!(decimal_places("12.30"), Some(1));
        assert_eq!(decimal_places("-0.001"), Some(3));
        assert_eq!(decimal_places("1.5e3"), Some(0));
        assert_eq!(decimal_places("15E-3"), Some(3));
        assert_eq!(decimal_places("1200e-3"), Some(1), "1.2");
        assert_eq!(decimal_places("1e-9223372036854775808"), None);
        assert_eq!(decimal_places("1.2.3"), None);
        assert_eq!(decimal_places("abc"), None);
        assert_eq!(decimal_places(""), None);
    }
}
