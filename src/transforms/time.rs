//! `timestamp_converter` (Kafka Connect's `TimestampConverter$Value`): a time field
//! from one representation to another.

use super::{object, Meta, Parts, Smt, SmtConfig};
use crate::connector::{KeyError, SectionContext};
use chrono::{DateTime, NaiveDateTime, Utc};
use serde_json::Value;
use std::sync::Arc;

/// A representation of a point in time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimeFormat {
    /// Milliseconds since the epoch (a number).
    UnixMs,
    /// Seconds since the epoch (a number).
    UnixS,
    /// RFC 3339 in UTC with milliseconds (`2023-11-14T22:13:20.123Z`); read with any
    /// offset.
    Iso8601,
    /// A `strftime` format, read and written in UTC (`%Y-%m-%d %H:%M:%S`).
    Pattern(String),
}

impl TimeFormat {
    fn parse(s: &str) -> Result<TimeFormat, String> {
        Ok(match s {
            "unix_ms" => TimeFormat::UnixMs,
            "unix_s" => TimeFormat::UnixS,
            "iso8601" => TimeFormat::Iso8601,
            p if p.contains('%') => {
                // A format chrono cannot render is refused now, not per record.
                use std::fmt::Write as _;
                let mut probe = String::new();
                write!(probe, "{}", DateTime::<Utc>::UNIX_EPOCH.format(p))
                    .map_err(|_| format!("`{p}` is not a strftime format chrono understands"))?;
                TimeFormat::Pattern(p.to_string())
            }
            other => {
                return Err(format!(
                "`{other}` is not one of unix_ms, unix_s, iso8601, or a strftime format (with %)"
            ))
            }
        })
    }

    /// The time `v` stands for in this representation.
    pub fn read(&self, v: &Value) -> Result<DateTime<Utc>, String> {
        let number = |v: &Value| -> Result<f64, String> {
            v.as_f64()
                .ok_or_else(|| format!("{v} is not a number of the epoch"))
        };
        let text = |v: &Value| -> Result<String, String> {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("{v} is not a string"))
        };
        let out_of_range = || format!("{v} is out of range");
        match self {
            TimeFormat::UnixMs => {
                DateTime::from_timestamp_millis(number(v)? as i64).ok_or_else(out_of_range)
            }
            TimeFormat::UnixS => {
                let s = number(v)?;
                DateTime::from_timestamp_millis((s * 1000.0).round() as i64)
                    .ok_or_else(out_of_range)
            }
            TimeFormat::Iso8601 => DateTime::parse_from_rfc3339(&text(v)?)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|e| format!("{v} is not RFC 3339: {e}")),
            TimeFormat::Pattern(p) => NaiveDateTime::parse_from_str(&text(v)?, p)
                .map(|t| t.and_utc())
                .map_err(|e| format!("{v} does not match `{p}`: {e}")),
        }
    }

    /// `t` in this representation.
    pub fn write(&self, t: DateTime<Utc>) -> Value {
        match self {
            TimeFormat::UnixMs => Value::from(t.timestamp_millis()),
            TimeFormat::UnixS => Value::from(t.timestamp()),
            TimeFormat::Iso8601 => {
                Value::from(t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
            }
            TimeFormat::Pattern(p) => Value::from(t.format(p).to_string()),
        }
    }
}

/// `timestamp_converter`: `field` (top-level), `to` (`unix_ms | unix_s | iso8601 |
/// "<strftime format>"`) and `from` (the same; default: a number is `unix_ms`, a string
/// `iso8601`). A field that is absent or `null` stays so.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimestampConverter {
    pub field: String,
    pub from: Option<String>,
    pub to: String,
}

#[derive(Debug)]
struct Convert {
    field: String,
    from: Option<TimeFormat>,
    to: TimeFormat,
}

impl SmtConfig for TimestampConverter {
    const KIND: &'static str = "timestamp_converter";
    fn build(self, _: &SectionContext) -> Result<Arc<dyn Smt>, KeyError> {
        if self.field.is_empty() {
            return Err(KeyError::new("field", "names no field"));
        }
        Ok(Arc::new(Convert {
            field: self.field,
            from: self
                .from
                .map(|f| TimeFormat::parse(&f).map_err(|m| KeyError::new("from", m)))
                .transpose()?,
            to: TimeFormat::parse(&self.to).map_err(|m| KeyError::new("to", m))?,
        }))
    }
}

impl Smt for Convert {
    fn apply(&self, parts: &mut Parts, _: &Meta) -> Result<(), String> {
        let o = object(&mut parts.value, "timestamp_converter")?;
        let Some(v) = o.get_mut(&self.field).filter(|v| !v.is_null()) else {
            return Ok(());
        };
        let from = match (&self.from, &*v) {
            (Some(f), _) => f,
            (None, Value::String(_)) => &TimeFormat::Iso8601,
            (None, _) => &TimeFormat::UnixMs,
        };
        let t = from
            .read(v)
            .map_err(|e| format!("field {}: {e}", self.field))?;
        *v = self.to.write(t);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn convert(from: Option<&str>, to: &str, v: Value) -> Result<Value, String> {
        let smt = Convert {
            field: "t".into(),
            from: from.map(|f| TimeFormat::parse(f).unwrap()),
            to: TimeFormat::parse(to).unwrap(),
        };
        let mut parts = Parts::of_value(json!({ "t": v }));
        smt.apply(&mut parts, &Meta::default())?;
        Ok(parts.value["t"].clone())
    }

    /// Kafka Connect's TimestampConverter examples: unix to a string of
    /// `yyyy-MM-dd` (here `%Y-%m-%d`), and a string back to unix.
    #[test]
    fn a_time_field_changes_representation() {
        let ms = json!(1_700_000_000_123i64);
        assert_eq!(
            convert(None, "iso8601", ms.clone()),
            Ok(json!("2023-11-14T22:13:20.123Z"))
        );
        assert_eq!(
            convert(None, "%Y-%m-%d", ms.clone()),
            Ok(json!("2023-11-14"))
        );
        assert_eq!(
            convert(None, "unix_s", ms.clone()),
            Ok(json!(1_700_000_000))
        );
        assert_eq!(
            convert(Some("unix_s"), "unix_ms", json!(1_700_000_000)),
            Ok(json!(1_700_000_000_000i64))
        );
        assert_eq!(
            convert(None, "unix_ms", json!("2023-11-14T23:13:20.123+01:00")),
            Ok(ms.clone())
        );
        assert_eq!(
            convert(
                Some("%Y-%m-%d %H:%M:%S"),
                "unix_ms",
                json!("2023-11-14 22:13:20")
            ),
            Ok(json!(1_700_000_000_000i64))
        );
        assert_eq!(convert(None, "unix_ms", Value::Null), Ok(Value::Null));
        assert!(convert(None, "unix_ms", json!("yesterday")).is_err());
        assert!(convert(Some("unix_ms"), "iso8601", json!("x")).is_err());
        assert!(TimeFormat::parse("rfc").is_err());
    }
}
