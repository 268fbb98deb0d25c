//! Debezium's semantic types: the schema names Debezium gives integers, strings and
//! structs whose meaning the plain type does not carry. Every format that sees the
//! name (Kafka Connect JSON with schemas, Avro's `connect.name`) writes each type the
//! one way below, so that a sink receives text it can place and never a bare number it
//! would have to guess the unit of.
//!
//! | Name (`io.debezium.…`) | Debezium writes | lockgate writes |
//! |---|---|---|
//! | `time.Date` | days since 1970-01-01 | `"YYYY-MM-DD"` |
//! | `time.Time` | milliseconds after midnight | `"HH:MM:SS.fff"` |
//! | `time.MicroTime` | microseconds after midnight | `"HH:MM:SS.ffffff"` |
//! | `time.NanoTime` | nanoseconds after midnight | `"HH:MM:SS.fffffffff"` |
//! | `time.Timestamp` | epoch milliseconds of a time without zone | `"YYYY-MM-DDTHH:MM:SS.fff"` (no offset) |
//! | `time.MicroTimestamp` | epoch microseconds, no zone | `"YYYY-MM-DDTHH:MM:SS.ffffff"` |
//! | `time.NanoTimestamp` | epoch nanoseconds, no zone | `"YYYY-MM-DDTHH:MM:SS.fffffffff"` |
//! | `time.ZonedTimestamp`, `time.ZonedTime` | ISO 8601 text with an offset | the text as it is |
//! | `time.Year` | the year | the number as it is |
//! | `data.VariableScaleDecimal` | a struct of `scale` and `value` (big-endian two's complement) | a number with exactly its digits (`12.30`) |
//!
//! Times of day are 00:00 to 24:00 (PostgreSQL's `24:00:00` is the end of a day); a
//! value outside that, or a date or timestamp outside the calendar, is the record's
//! error. Values before 1970 count back from the epoch (`-1` day is `1969-12-31`).

use chrono::{NaiveDate, NaiveDateTime, TimeDelta};

/// A Debezium semantic type whose value lockgate writes differently from its plain type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Semantic {
    Date,
    Time,
    MicroTime,
    NanoTime,
    Timestamp,
    MicroTimestamp,
    NanoTimestamp,
    VariableScaleDecimal,
}

/// The schema name of `VariableScaleDecimal`.
pub const VARIABLE_SCALE_DECIMAL: &str = "io.debezium.data.VariableScaleDecimal";

impl Semantic {
    /// The type a schema `name` names; None for every other name (`ZonedTimestamp`,
    /// `ZonedTime` and `Year` among them: their values are already written as wanted).
    pub fn named(name: &str) -> Option<Semantic> {
        Some(match name {
            "io.debezium.time.Date" => Semantic::Date,
            "io.debezium.time.Time" => Semantic::Time,
            "io.debezium.time.MicroTime" => Semantic::MicroTime,
            "io.debezium.time.NanoTime" => Semantic::NanoTime,
            "io.debezium.time.Timestamp" => Semantic::Timestamp,
            "io.debezium.time.MicroTimestamp" => Semantic::MicroTimestamp,
            "io.debezium.time.NanoTimestamp" => Semantic::NanoTimestamp,
            VARIABLE_SCALE_DECIMAL => Semantic::VariableScaleDecimal,
            _ => return None,
        })
    }

    /// Debezium's name of the type, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Semantic::Date => "io.debezium.time.Date",
            Semantic::Time => "io.debezium.time.Time",
            Semantic::MicroTime => "io.debezium.time.MicroTime",
            Semantic::NanoTime => "io.debezium.time.NanoTime",
            Semantic::Timestamp => "io.debezium.time.Timestamp",
            Semantic::MicroTimestamp => "io.debezium.time.MicroTimestamp",
            Semantic::NanoTimestamp => "io.debezium.time.NanoTimestamp",
            Semantic::VariableScaleDecimal => VARIABLE_SCALE_DECIMAL,
        }
    }

    /// The text (not JSON: no quotes) of integer `n` of this temporal type; an error
    /// for a value out of range or for `VariableScaleDecimal`, which is no integer.
    pub fn integer(self, n: i64) -> Result<String, String> {
        let out = match self {
            Semantic::Date => date(n),
            Semantic::Time => time_of_day(i128::from(n) * 1_000_000, 3),
            Semantic::MicroTime => time_of_day(i128::from(n) * 1_000, 6),
            Semantic::NanoTime => time_of_day(i128::from(n), 9),
            Semantic::Timestamp => timestamp(i128::from(n) * 1_000_000, 3),
            Semantic::MicroTimestamp => timestamp(i128::from(n) * 1_000, 6),
            Semantic::NanoTimestamp => timestamp(i128::from(n), 9),
            Semantic::VariableScaleDecimal => None,
        };
        out.ok_or_else(|| format!("{n} is not a value of {}", self.name()))
    }
}

/// The date `days` after 1970-01-01.
fn date(days: i64) -> Option<String> {
    let d = NaiveDate::from_ymd_opt(1970, 1, 1)?.checked_add_signed(TimeDelta::try_days(days)?)?;
    Some(d.format("%Y-%m-%d").to_string())
}

const NANOS_PER_DAY: i128 = 86_400 * 1_000_000_000;

/// The time of day `nanos` after midnight with `digits` fractional digits; the end of
/// the day (`24:00:00`) included.
fn time_of_day(nanos: i128, digits: usize) -> Option<String> {
    if !(0..=NANOS_PER_DAY).contains(&nanos) {
        return None;
    }
    let secs = nanos / 1_000_000_000;
    let frac = nanos % 1_000_000_000;
    let frac = frac / 10i128.pow(9 - digits as u32);
    Some(format!(
        "{:02}:{:02}:{:02}.{frac:0digits$}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    ))
}

/// The time without zone `nanos` after 1970-01-01T00:00 with `digits` fractional
/// digits.
fn timestamp(nanos: i128, digits: usize) -> Option<String> {
    let secs = i64::try_from(nanos.div_euclid(1_000_000_000)).ok()?;
    let sub = nanos.rem_euclid(1_000_000_000) as u32;
    let t: NaiveDateTime = chrono::DateTime::from_timestamp(secs, sub)?.naive_utc();
    let format = match digits {
        3 => "%Y-%m-%dT%H:%M:%S%.3f",
        6 => "%Y-%m-%dT%H:%M:%S%.6f",
        _ => "%Y-%m-%dT%H:%M:%S%.9f",
    };
    Some(t.format(format).to_string())
}

/// The JSON number text of a `VariableScaleDecimal` of `scale` and the big-endian
/// two's-complement `unscaled` bytes: exactly its digits (scale 2 of 1230 is `12.30`;
/// a negative scale appends zeros).
pub fn variable_scale_decimal(scale: i64, unscaled: &[u8]) -> Result<String, String> {
    use super::json_out::{decimal, MAX_DECIMAL_SCALE};
    let mut out = Vec::new();
    if scale >= 0 {
        let scale = usize::try_from(scale).map_err(|_| format!("scale {scale}"))?;
        decimal(&mut out, unscaled, scale)?;
    } else {
        let zeros = usize::try_from(scale.unsigned_abs())
            .ok()
            .filter(|&z| z <= MAX_DECIMAL_SCALE)
            .ok_or_else(|| format!("a VariableScaleDecimal of scale {scale}"))?;
        decimal(&mut out, unscaled, 0)?;
        if out != b"0" {
            out.extend(std::iter::repeat_n(b'0', zeros));
        }
    }
    Ok(String::from_utf8(out).expect("digits are ASCII"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_temporal_type_is_its_iso_text() {
        use Semantic::*;
        let cases: &[(Semantic, i64, &str)] = &[
            (Date, 19_844, "2024-05-01"),
            (Date, 0, "1970-01-01"),
            (Date, -1, "1969-12-31"),
            (Date, -719_162, "0001-01-01"),
            (Time, 0, "00:00:00.000"),
            (Time, 45_296_789, "12:34:56.789"),
            (Time, 86_400_000, "24:00:00.000"),
            (MicroTime, 45_296_789_012, "12:34:56.789012"),
            (MicroTime, 1, "00:00:00.000001"),
            (NanoTime, 45_296_789_012_345, "12:34:56.789012345"),
            (Timestamp, 1_714_566_896_789, "2024-05-01T12:34:56.789"),
            (Timestamp, -1, "1969-12-31T23:59:59.999"),
            (
                MicroTimestamp,
                1_714_566_896_789_012,
                "2024-05-01T12:34:56.789012",
            ),
            (MicroTimestamp, -1, "1969-12-31T23:59:59.999999"),
            (
                MicroTimestamp,
                -86_400_000_001,
                "1969-12-30T23:59:59.999999",
            ),
            (
                MicroTimestamp,
                253_402_300_799_999_999,
                "9999-12-31T23:59:59.999999",
            ),
            (
                NanoTimestamp,
                1_714_566_896_789_012_345,
                "2024-05-01T12:34:56.789012345",
            ),
            (NanoTimestamp, -1, "1969-12-31T23:59:59.999999999"),
        ];
        for (t, n, want) in cases {
            assert_eq!(t.integer(*n).as_deref(), Ok(*want), "{t:?} {n}");
        }
    }

    #[test]
    fn values_outside_the_day_or_the_calendar_are_errors() {
        use Semantic::*;
        for (t, n) in [
            (Time, -1),
            (Time, 86_400_001),
            (MicroTime, 86_400_000_001),
            (NanoTime, -5),
            (Date, i64::MAX),
            (Timestamp, i64::MAX),
            (MicroTimestamp, i64::MIN),
            (VariableScaleDecimal, 1),
        ] {
            let e = t.integer(n).unwrap_err();
            assert!(e.contains(t.name()), "{e}");
        }
    }

    #[test]
    fn names_are_debeziums() {
        assert_eq!(
            Semantic::named("io.debezium.time.MicroTimestamp"),
            Some(Semantic::MicroTimestamp)
        );
        for t in [
            Semantic::Date,
            Semantic::NanoTime,
            Semantic::VariableScaleDecimal,
        ] {
            assert_eq!(Semantic::named(t.name()), Some(t));
        }
        for kept in [
            "io.debezium.time.ZonedTimestamp",
            "io.debezium.time.ZonedTime",
            "io.debezium.time.Year",
            "org.apache.kafka.connect.data.Date",
        ] {
            assert_eq!(Semantic::named(kept), None, "{kept}");
        }
    }

    #[test]
    fn a_variable_scale_decimal_is_exactly_its_digits() {
        let cases: &[(i64, &[u8], &str)] = &[
            (2, &[0x04, 0xce], "12.30"),
            (2, &[0xfb, 0x32], "-12.30"),
            (0, &[0x01], "1"),
            (21, &[0xff], "-0.000000000000000000001"),
            (-2, &[0x05], "500"),
            (-3, &[], "0"),
            (0, &[], "0"),
        ];
        for (scale, bytes, want) in cases {
            assert_eq!(
                variable_scale_decimal(*scale, bytes).as_deref(),
                Ok(*want),
                "{scale} {bytes:?}"
            );
        }
        assert!(variable_scale_decimal(-5000, &[1]).is_err());
        assert!(variable_scale_decimal(5000, &[1]).is_err());
    }
}
