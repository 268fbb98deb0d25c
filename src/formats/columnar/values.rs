//! What a JSON value must be to become a column's value exactly, and the value it
//! becomes: a fraction in an integer column, a float out of its column's range, the
//! digits of a decimal past its scale, the sub-second digits a timestamp's unit has no
//! room for, a local time with a zone, a leap second, an enum value not among its
//! symbols are refused, never read as another value; bytes are base64 (lockgate's
//! formats write them so).
//!
//! A value in a form other than the common one (a timestamp with a lowercase `t` or
//! with seven digits of a second, a date with a signed year, an integer as text) is
//! read by the same functions the file sink has always read it with (chrono's, then
//! Arrow's), so that what was taken is taken alike; the common forms are read here,
//! to the same values, without them.

use super::refusal::Refusal;
use arrow_array::types::{
    Date32Type, DecimalType, Int32Type, Int64Type, Time32MillisecondType, Time32SecondType,
    Time64MicrosecondType, Time64NanosecondType,
};
use arrow_array::{timezone::Tz, ArrowNativeTypeOp};
use arrow_buffer::ArrowNativeType;
use arrow_cast::parse::Parser;
use arrow_schema::TimeUnit;

/// The metadata key of a string column that holds an Avro enum: its symbols, joined
/// by commas (an Avro symbol has none).
pub const ENUM_SYMBOLS: &str = "avro.enum.symbols";

/// Base64 as lockgate's formats write it (the standard alphabet), padded or not.
const BASE64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// The bytes of the base64 `text`, appended to `out`.
pub fn base64_into(text: &[u8], out: &mut Vec<u8>) -> Result<(), Refusal> {
    use base64::Engine;
    BASE64
        .decode_vec(text, out)
        .map_err(|e| Refusal::value(format!("not base64 ({e})")))
}

/// The integer of a JSON number's text (`whole`: it has no fraction or exponent).
#[inline(always)]
pub fn integer(text: &[u8], whole: bool) -> Option<i64> {
    if !whole {
        return None;
    }
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    if digits.len() <= 18 {
        // At most 18 digits: no overflow possible.
        let mut v: i64 = 0;
        for &d in digits {
            v = v * 10 + i64::from(d - b'0');
        }
        return Some(if negative { -v } else { v });
    }
    let mut v: i64 = 0;
    for &d in digits {
        let d = i64::from(d - b'0');
        v = v.checked_mul(10)?;
        v = if negative {
            v.checked_sub(d)?
        } else {
            v.checked_add(d)?
        };
    }
    Some(v)
}

/// An integer column's value of a JSON number.
#[inline(always)]
pub fn integer_of_number<T: TryFrom<i64>>(text: &[u8], whole: bool) -> Result<T, Refusal> {
    integer(text, whole)
        .and_then(|v| T::try_from(v).ok())
        .ok_or_else(|| {
            Refusal::value(format!(
                "{} is not an integer of the column's size",
                String::from_utf8_lossy(text)
            ))
        })
}

/// An integer column's value of a JSON string (`"42"`), as Arrow reads one.
pub fn int64_of_text(text: &str) -> Result<i64, Refusal> {
    Int64Type::parse(text)
        .ok_or_else(|| Refusal::value(format!("{text:?} is not an integer of the column's size")))
}

/// An `int` column's value of a JSON string (`"42"`), as Arrow reads one.
pub fn int32_of_text(text: &str) -> Result<i32, Refusal> {
    Int32Type::parse(text)
        .ok_or_else(|| Refusal::value(format!("{text:?} is not an integer of the column's size")))
}

/// A `double` column's value of a JSON number: finite.
#[inline(always)]
pub fn float64(text: &str) -> Result<f64, Refusal> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(Refusal::value(format!(
            "{text} is out of the column's range"
        ))),
    }
}

/// A `float` column's value of a JSON number: finite as a 32-bit float.
#[inline(always)]
pub fn float32(text: &str) -> Result<f32, Refusal> {
    match text.parse::<f32>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(Refusal::value(format!(
            "{text} is out of the column's range"
        ))),
    }
}

/// The refusal of text in a float column.
pub fn float_as_text(text: &str) -> Refusal {
    Refusal::value(format!(
        "{text:?} is text; a float column takes a JSON number"
    ))
}

/// A decimal numeral split: `[+-]int[.frac][(e|E)exp]`, the parts as
/// [`decimal_places`] reads them.
struct Decimal<'t> {
    negative: bool,
    int: &'t [u8],
    frac: &'t [u8],
    exponent: Option<i64>,
}

fn split_decimal(text: &str) -> Option<Decimal<'_>> {
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(i) => (&text[..i], Some(text[i + 1..].parse::<i64>().ok()?)),
        None => (text, None),
    };
    let negative = mantissa.starts_with('-');
    let mantissa = mantissa.strip_prefix(['-', '+']).unwrap_or(mantissa);
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int.is_empty() && frac.is_empty()
        || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
    {
        return None;
    }
    Some(Decimal {
        negative,
        int: int.as_bytes(),
        frac: frac.as_bytes(),
        exponent,
    })
}

impl Decimal<'_> {
    fn digits(&self) -> impl DoubleEndedIterator<Item = u8> + Clone + '_ {
        self.int.iter().chain(self.frac.iter()).copied()
    }

    /// Trailing zeros of the digits.
    fn trailing_zeros(&self) -> usize {
        self.digits().rev().take_while(|d| *d == b'0').count()
    }

    fn places(&self) -> Option<i64> {
        let exp = self.exponent.unwrap_or(0);
        let zeros = self.trailing_zeros() as i64;
        let places = (self.frac.len() as i64)
            .checked_sub(exp)?
            .checked_sub(zeros)?;
        Some(places.max(0))
    }
}

/// The decimal places `text` (a decimal numeral, maybe with an exponent) needs: its
/// trailing zeros need none. None when it is not a numeral.
pub fn decimal_places(text: &str) -> Option<i64> {
    split_decimal(text)?.places()
}

/// A decimal column's value (unscaled) of `text`, a JSON number's or a string's: exact,
/// refused when it has more places than `scale` or more digits than `precision`.
pub fn decimal<D: DecimalType>(text: &str, precision: u8, scale: i8) -> Result<D::Native, Refusal> {
    let Some(d) = split_decimal(text) else {
        return Err(Refusal::value(format!("{text} is not a decimal number")));
    };
    let Some(places) = d.places() else {
        return Err(Refusal::value(format!("{text} is not a decimal number")));
    };
    if places > i64::from(scale) {
        return Err(Refusal::value(format!(
            "{text} has {places} decimal places, more than the column's scale {scale}"
        )));
    }
    let out_of_range = || Refusal::value(format!("{text} is out of the column's range"));
    if let Some(exp) = d.exponent {
        if exp.abs() > i64::from(precision) + i64::from(scale) + 1 {
            return Err(out_of_range());
        }
        // Arrow's reading of an exponent refuses a few values that fit (and nothing
        // that does not): its refusals stay, its value is not taken (it can wrap).
        arrow_cast::parse::parse_decimal::<D>(text, precision, scale)
            .map_err(|e| Refusal::value(format!("{text}: {e}")))?;
    }
    // value = digits x 10^(exp - frac); its significant digits, then the power of ten
    // that scales them to the column's unscaled integer.
    let all = d.digits();
    let leading = all.clone().take_while(|c| *c == b'0').count();
    let total = d.int.len() + d.frac.len();
    if leading == total {
        return Ok(D::Native::usize_as(0));
    }
    let zeros = d.trailing_zeros();
    let significant = total - leading - zeros;
    // places <= scale makes this at least 0.
    let shift = d.exponent.unwrap_or(0) - d.frac.len() as i64 + zeros as i64 + i64::from(scale);
    if shift < 0 || significant as i64 + shift > i64::from(precision) {
        return Err(out_of_range());
    }
    let ten = D::Native::usize_as(10);
    let mut v = D::Native::usize_as(0);
    for c in all.skip(leading).take(significant) {
        v = v
            .mul_wrapping(ten)
            .add_wrapping(D::Native::usize_as(usize::from(c - b'0')));
    }
    for _ in 0..shift {
        v = v.mul_wrapping(ten);
    }
    Ok(if d.negative { v.neg_wrapping() } else { v })
}

/// What `unit` is called in messages.
fn unit_name(unit: TimeUnit) -> &'static str {
    match unit {
        TimeUnit::Second => "seconds",
        TimeUnit::Millisecond => "milliseconds",
        TimeUnit::Microsecond => "microseconds",
        TimeUnit::Nanosecond => "nanoseconds",
    }
}

/// The digits of a second's fraction `unit` holds.
fn unit_digits(unit: TimeUnit) -> u32 {
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

/// A whole number of `what` of a JSON number (a timestamp's, a date's, a time's).
#[inline(always)]
pub fn whole_number(text: &str, whole: bool, what: &str) -> Result<i64, Refusal> {
    integer(text.as_bytes(), whole)
        .ok_or_else(|| Refusal::value(format!("{text} is not a whole number of {what}")))
}

/// A timestamp column's value of a JSON number: a whole number of its unit.
#[inline(always)]
pub fn timestamp_of_number(text: &str, whole: bool, unit: TimeUnit) -> Result<i64, Refusal> {
    whole_number(text, whole, unit_name(unit))
}

/// `n` digits at `at` of `s` as a number.
#[inline(always)]
fn digits_at(s: &[u8], at: usize, n: usize) -> Option<u32> {
    let mut v = 0u32;
    for k in 0..n {
        let c = *s.get(at + k)?;
        if !c.is_ascii_digit() {
            return None;
        }
        v = v * 10 + u32::from(c - b'0');
    }
    Some(v)
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `YYYY-MM-DD` at the start of `s`, a valid date: its days from 1970-01-01.
#[inline(always)]
fn common_date(s: &[u8]) -> Option<i64> {
    if s.len() < 10 || s[4] != b'-' || s[7] != b'-' {
        return None;
    }
    let y = digits_at(s, 0, 4)?;
    let m = digits_at(s, 5, 2)?;
    let d = digits_at(s, 8, 2)?;
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days_in_month = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return None,
    };
    if d == 0 || d > days_in_month {
        return None;
    }
    Some(days_from_civil(i64::from(y), m, d))
}

/// `HH:MM:SS[.fraction]` at `at` of `s` (hours below 24, no leap second, 1 to 9
/// digits of fraction): seconds since midnight, nanoseconds, and where it ends.
#[inline(always)]
fn common_time(s: &[u8], at: usize) -> Option<(i64, u32, usize)> {
    if s.get(at + 2) != Some(&b':') || s.get(at + 5) != Some(&b':') {
        return None;
    }
    let h = digits_at(s, at, 2)?;
    let m = digits_at(s, at + 3, 2)?;
    let sec = digits_at(s, at + 6, 2)?;
    if h > 23 || m > 59 || sec > 59 {
        return None;
    }
    let mut i = at + 8;
    let mut nanos = 0u32;
    if s.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while let Some(c) = s.get(i).filter(|c| c.is_ascii_digit()) {
            if i - start == 9 {
                return None;
            }
            nanos = nanos * 10 + u32::from(c - b'0');
            i += 1;
        }
        let n = i - start;
        if n == 0 {
            return None;
        }
        nanos *= 10u32.pow(9 - n as u32);
    }
    Some((i64::from(h * 3600 + m * 60 + sec), nanos, i))
}

/// `secs` and `nanos` in `unit`; refused when the fraction has digits the unit has no
/// room for, or when the value has no 64-bit place.
fn in_unit(secs: i64, nanos: u32, unit: TimeUnit, shown: &str) -> Result<i64, Refusal> {
    let digits = unit_digits(unit);
    let per = 10u32.pow(9 - digits);
    if !nanos.is_multiple_of(per) {
        return Err(Refusal::value(format!(
            "{shown:?} has more digits of a second than the column's {} hold",
            unit_name(unit)
        )));
    }
    let sub = i64::from(nanos / per);
    let overflow = || {
        Refusal::value(format!(
            "{shown:?} is out of the range of the column's {}",
            unit_name(unit)
        ))
    };
    match unit {
        TimeUnit::Second => Ok(secs),
        TimeUnit::Millisecond => Ok(secs * 1_000 + sub),
        TimeUnit::Microsecond => Ok(secs * 1_000_000 + sub),
        TimeUnit::Nanosecond => {
            // As chrono computes it, so that the range's ends are the same.
            let (mut secs, mut sub) = (secs, sub);
            if secs < 0 {
                sub -= 1_000_000_000;
                secs += 1;
            }
            secs.checked_mul(1_000_000_000)
                .and_then(|v| v.checked_add(sub))
                .ok_or_else(overflow)
        }
    }
}

/// A timestamp column's value of a JSON string: RFC 3339 text whose fraction the unit
/// holds; with a zone (`tz`, a `timestamp-*`) the text must say its offset, without one
/// (`local-timestamp-*`) it must say none.
#[inline]
pub fn timestamp_of_text(text: &str, unit: TimeUnit, tz: Option<&Tz>) -> Result<i64, Refusal> {
    let s = text.as_bytes();
    if let Some(days) = common_date(s) {
        if matches!(s.get(10), Some(b'T' | b' ')) {
            if let Some((secs, nanos, end)) = common_time(s, 11) {
                let offset = match (tz, &s[end..]) {
                    (None, []) => Some(0),
                    (Some(_), [b'Z']) => Some(0),
                    (Some(_), [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2]) => {
                        digits_at(&[*h1, *h2, *m1, *m2], 0, 4).and_then(|hm| {
                            let (h, m) = (hm / 100, hm % 100);
                            (h <= 23 && m <= 59).then(|| {
                                let secs = i64::from(h * 3600 + m * 60);
                                if *sign == b'-' {
                                    -secs
                                } else {
                                    secs
                                }
                            })
                        })
                    }
                    _ => None,
                };
                if let Some(offset) = offset {
                    return in_unit(days * 86_400 + secs - offset, nanos, unit, text);
                }
            }
        }
    }
    timestamp_of_other_text(text, unit, tz)
}

/// [`timestamp_of_text`] for text in a form other than the common one.
#[cold]
fn timestamp_of_other_text(s: &str, unit: TimeUnit, tz: Option<&Tz>) -> Result<i64, Refusal> {
    let text = s.replacen(' ', "T", 1);
    let nanos = if tz.is_some() {
        chrono::DateTime::parse_from_rfc3339(&text)
            .map_err(|e| Refusal::value(format!("{s:?} is not a time with its offset ({e})")))?
            .timestamp_subsec_nanos()
    } else {
        chrono::NaiveDateTime::parse_from_str(&text, "%Y-%m-%dT%H:%M:%S%.f")
            .map_err(|e| {
                Refusal::value(format!(
                    "{s:?} is not a local date and time without an offset ({e})"
                ))
            })?
            .and_utc()
            .timestamp_subsec_nanos()
    };
    if nanos >= 1_000_000_000 {
        // Arrow would write a leap second as the next second.
        return Err(Refusal::value(format!(
            "{s:?} is a leap second, which the column has no place for"
        )));
    }
    if fraction_digits(&text) > unit_digits(unit) as usize {
        return Err(Refusal::value(format!(
            "{s:?} has more digits of a second than the column's {} hold",
            unit_name(unit)
        )));
    }
    let unread = |e: arrow_schema::ArrowError| Refusal::value(format!("{s:?}: {e}"));
    let at = match tz {
        Some(tz) => arrow_cast::parse::string_to_datetime(tz, s)
            .map_err(unread)?
            .naive_utc(),
        None => arrow_cast::parse::string_to_datetime(&chrono::Utc, s)
            .map_err(unread)?
            .naive_utc(),
    }
    .and_utc();
    match unit {
        TimeUnit::Second => Ok(at.timestamp()),
        TimeUnit::Millisecond => Ok(at.timestamp_millis()),
        TimeUnit::Microsecond => Ok(at.timestamp_micros()),
        TimeUnit::Nanosecond => at.timestamp_nanos_opt().ok_or_else(|| {
            Refusal::value(format!(
                "{s:?} is out of the range of the column's nanoseconds"
            ))
        }),
    }
}

/// A date column's value of a JSON number: a whole number of days since 1970-01-01.
#[inline(always)]
pub fn date_of_number(text: &str, whole: bool) -> Result<i32, Refusal> {
    let days = whole_number(text, whole, "days")?;
    i32::try_from(days)
        .map_err(|_| Refusal::value(format!("{text} is out of the range of a date column")))
}

/// A date column's value of a JSON string: `YYYY-MM-DD` alone.
#[inline]
pub fn date_of_text(s: &str) -> Result<i32, Refusal> {
    if s.len() == 10 {
        if let Some(days) = common_date(s.as_bytes()) {
            // Four digits of year: always a 32-bit number of days.
            return Ok(days as i32);
        }
    }
    date_of_other_text(s)
}

#[cold]
fn date_of_other_text(s: &str) -> Result<i32, Refusal> {
    chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .ok()
        .filter(|_| s.len() == 10)
        .ok_or_else(|| Refusal::value(format!("{s:?} is not a date (YYYY-MM-DD)")))?;
    Date32Type::parse(s).ok_or_else(|| Refusal::value(format!("{s:?} is not a date (YYYY-MM-DD)")))
}

/// The units of `unit` in a day.
fn per_day(unit: TimeUnit) -> i64 {
    match unit {
        TimeUnit::Second => 86_400,
        TimeUnit::Millisecond => 86_400_000,
        TimeUnit::Microsecond => 86_400_000_000,
        TimeUnit::Nanosecond => 86_400_000_000_000,
    }
}

/// A time column's value of a JSON number: a whole number of its unit since
/// midnight, below a day.
#[inline(always)]
pub fn time_of_number(text: &str, whole: bool, unit: TimeUnit) -> Result<i64, Refusal> {
    let n = whole_number(text, whole, "the column's unit")?;
    if !(0..per_day(unit)).contains(&n) {
        return Err(Refusal::value(format!("{n} is not a time of day")));
    }
    Ok(n)
}

/// A time column's value of a JSON string: `HH:MM:SS[.fraction]` whose fraction the
/// unit holds.
#[inline]
pub fn time_of_text(s: &str, unit: TimeUnit) -> Result<i64, Refusal> {
    if let Some((secs, nanos, end)) = common_time(s.as_bytes(), 0) {
        if end == s.len() {
            return in_unit(secs, nanos, unit, s).map_err(|_| {
                Refusal::value(format!(
                    "{s:?} has more digits of a second than the column holds"
                ))
            });
        }
    }
    time_of_other_text(s, unit)
}

#[cold]
fn time_of_other_text(s: &str, unit: TimeUnit) -> Result<i64, Refusal> {
    let t = chrono::NaiveTime::parse_from_str(s, "%H:%M:%S%.f")
        .map_err(|e| Refusal::value(format!("{s:?} is not a time of day ({e})")))?;
    if chrono::Timelike::nanosecond(&t) >= 1_000_000_000 {
        // Arrow would write a leap second past the end of the day.
        return Err(Refusal::value(format!(
            "{s:?} is a leap second, which the column has no place for"
        )));
    }
    if fraction_digits(s) > unit_digits(unit) as usize {
        return Err(Refusal::value(format!(
            "{s:?} has more digits of a second than the column holds"
        )));
    }
    let v = match unit {
        TimeUnit::Second => Time32SecondType::parse(s).map(i64::from),
        TimeUnit::Millisecond => Time32MillisecondType::parse(s).map(i64::from),
        TimeUnit::Microsecond => Time64MicrosecondType::parse(s),
        TimeUnit::Nanosecond => Time64NanosecondType::parse(s),
    };
    v.ok_or_else(|| Refusal::value(format!("{s:?} is not a time of day")))
}

/// An enum's symbols, from its field's metadata.
pub fn enum_symbols(
    metadata: &std::collections::HashMap<String, String>,
) -> Option<Vec<Box<[u8]>>> {
    metadata.get(ENUM_SYMBOLS).map(|symbols| {
        symbols
            .split(',')
            .map(|s| s.as_bytes().to_vec().into_boxed_slice())
            .collect()
    })
}

/// The refusal of `value`, not among `symbols`.
#[cold]
pub fn not_a_symbol(value: &[u8], symbols: &[Box<[u8]>]) -> Refusal {
    let symbols: Vec<&str> = symbols
        .iter()
        .map(|s| std::str::from_utf8(s).unwrap_or_default())
        .collect();
    Refusal::value(format!(
        "{:?} is not one of the enum's symbols ({})",
        String::from_utf8_lossy(value),
        symbols.join(",")
    ))
}

#[cfg(test)]
mod tests {
    use super::super::columns::Columns;
    use super::*;
    use arrow_schema::{DataType, Field, Schema};
    use std::collections::HashMap;
    use std::sync::Arc;

    fn one(t: DataType, value: &str) -> Result<(), String> {
        one_field(Field::new("x", t, true), value)
    }

    /// The record `{"x": value}` appended to the columns of the one field `f`.
    fn one_field(f: Field, value: &str) -> Result<(), String> {
        let schema = Arc::new(Schema::new(vec![f]));
        let mut columns = Columns::new(schema, 1).unwrap();
        columns
            .append(format!(r#"{{"x":{value}}}"#).as_bytes())
            .map_err(|e| e.to_string())
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

    #[test]
    fn decimals_are_exact() {
        use arrow_array::types::{Decimal128Type, Decimal256Type};
        let d = |t: &str| decimal::<Decimal128Type>(t, 12, 2).map_err(|e| e.to_string());
        assert_eq!(d("12.34"), Ok(1234));
        assert_eq!(d("-0.5"), Ok(-50));
        assert_eq!(d("+7"), Ok(700));
        assert_eq!(d("1.2345e2"), Ok(12345));
        assert_eq!(d("12.3400"), Ok(1234));
        assert_eq!(d("0.0e0"), Ok(0));
        assert!(d("0e0").is_err(), "refused by Arrow's reading, as it was");
        assert_eq!(d("9999999999.99"), Ok(999_999_999_999));
        assert!(d("10000000000").unwrap_err().contains("range"));
        assert!(d("12.345").unwrap_err().contains("3 decimal places"));
        assert!(d("1e40").unwrap_err().contains("range"));
        // A mantissa of more digits than the column's, and an exponent taking them
        // back: Arrow's reading wrapped it; the value is exact here.
        let wide = format!("{}0000e-4", "1".repeat(38));
        let v = decimal::<Decimal128Type>(&wide, 38, 0).unwrap();
        assert_eq!(v.to_string(), "1".repeat(38));
        let v = decimal::<Decimal256Type>(&format!("-{}.5", "9".repeat(60)), 76, 1).unwrap();
        assert_eq!(v.to_string(), format!("-{}5", "9".repeat(60)));
    }

    #[test]
    fn common_forms_read_as_the_other_forms_do() {
        let utc: Tz = "+00:00".parse().unwrap();
        for s in [
            "2024-05-01T12:00:00Z",
            "2024-05-01 12:00:00.5+02:00",
            "1969-12-31T23:59:59.999999999-23:59",
            "0001-01-01T00:00:00Z",
            "9999-12-31T23:59:59.123+00:00",
            "1677-09-21T00:12:43.145224192Z",
            "1677-09-21T00:12:43.145224191Z",
            "2262-04-11T23:47:16.854775807Z",
            "2262-04-11T23:47:16.854775808Z",
            "2000-02-29T00:00:00Z",
            "2024-05-01T10:00:00-00:00",
        ] {
            for unit in [
                TimeUnit::Second,
                TimeUnit::Millisecond,
                TimeUnit::Microsecond,
                TimeUnit::Nanosecond,
            ] {
                let common = timestamp_of_text(s, unit, Some(&utc)).map_err(|e| e.to_string());
                let other = timestamp_of_other_text(s, unit, Some(&utc)).map_err(|e| e.to_string());
                assert_eq!(
                    common.is_ok(),
                    other.is_ok(),
                    "{s} {unit:?} {common:?} {other:?}"
                );
                assert_eq!(common.ok(), other.ok(), "{s} {unit:?}");
                let local = &s[..s.len().min(19)];
                assert_eq!(
                    timestamp_of_text(local, unit, None).ok(),
                    timestamp_of_other_text(local, unit, None).ok(),
                    "{local} {unit:?}"
                );
            }
        }
        for s in [
            "2024-05-01",
            "0000-01-01",
            "1970-01-01",
            "1900-03-01",
            "9999-12-31",
        ] {
            assert_eq!(date_of_text(s).ok(), date_of_other_text(s).ok(), "{s}");
        }
        for s in ["00:00:00", "23:59:59.999", "12:00:00.5", "12:00:00.123456"] {
            for unit in [TimeUnit::Millisecond, TimeUnit::Microsecond] {
                assert_eq!(
                    time_of_text(s, unit).ok(),
                    time_of_other_text(s, unit).ok(),
                    "{s}"
                );
            }
        }
    }
}
