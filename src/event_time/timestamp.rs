//! `[source.kafka.watermark]`: where each record's event time is read from, and the
//! watermark strategy (Flink's `forBoundedOutOfOrderness` with `withIdleness`).

use serde_json::Value;

/// Where a record's event time is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimestampFrom {
    /// The Kafka record's timestamp (CreateTime or LogAppendTime).
    Kafka,
    /// A JSON pointer into the decoded value: epoch milliseconds (an integer) or an
    /// RFC 3339 string.
    Field(String),
}

/// A source's event-time settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventTime {
    pub from: TimestampFrom,
    /// How far behind its highest timestamp a split's watermark trails.
    pub max_out_of_orderness_ms: u64,
    /// A split without records for this long stops holding the watermark back
    /// (`None`: it always holds it).
    pub idle_timeout_ms: Option<u64>,
}

/// `[source.kafka.watermark]` as written in a job file.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatermarkSection {
    timestamp: Option<String>,
    max_out_of_orderness_ms: Option<u64>,
    idle_timeout_ms: Option<u64>,
}

impl WatermarkSection {
    /// The settings, or the key (relative to the section) that is wrong and why.
    pub fn config(&self) -> Result<EventTime, (String, String)> {
        let from = match self.timestamp.as_deref() {
            None | Some("kafka") => TimestampFrom::Kafka,
            Some(p) if p.starts_with('/') => TimestampFrom::Field(p.to_string()),
            Some(other) => {
                return Err((
                    "timestamp".into(),
                    format!("`{other}` is neither kafka nor a JSON pointer (which starts with /)"),
                ))
            }
        };
        if self.idle_timeout_ms == Some(0) {
            return Err((
                "idle_timeout_ms".into(),
                "must be positive (leave it out for partitions that never turn idle)".into(),
            ));
        }
        Ok(EventTime {
            from,
            max_out_of_orderness_ms: self.max_out_of_orderness_ms.unwrap_or(0),
            idle_timeout_ms: self.idle_timeout_ms,
        })
    }
}

impl EventTime {
    /// The event time of a record with Kafka timestamp `kafka` and JSON value
    /// `value`, or why there is none.
    pub fn read(&self, kafka: Option<i64>, value: &[u8]) -> Result<i64, String> {
        match &self.from {
            TimestampFrom::Kafka => kafka.ok_or_else(|| "the record has no timestamp".into()),
            TimestampFrom::Field(p) => {
                let v: Value = serde_json::from_slice(value)
                    .map_err(|e| format!("event time at {p}: the value is not JSON: {e}"))?;
                time_of(v.pointer(p)).map_err(|why| format!("event time at {p}: {why}"))
            }
        }
    }
}

/// Epoch milliseconds from an integer (or a float with no fraction) or an RFC 3339
/// string.
pub fn time_of(v: Option<&Value>) -> Result<i64, String> {
    match v {
        None => Err("missing".into()),
        Some(Value::Number(n)) => n
            .as_i64()
            .or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                    .map(|f| f as i64)
            })
            .ok_or_else(|| format!("{n} is not a whole number of milliseconds")),
        Some(Value::String(s)) => chrono::DateTime::parse_from_rfc3339(s)
            .map(|t| t.timestamp_millis())
            .map_err(|e| format!("`{s}` is not an RFC 3339 time: {e}")),
        Some(other) => Err(format!(
            "{} is neither epoch milliseconds nor an RFC 3339 string",
            crate::record::json_kind(other)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn times_are_read_from_epoch_milliseconds_or_rfc3339() {
        assert_eq!(
            time_of(Some(&json!(1_700_000_000_123i64))),
            Ok(1_700_000_000_123)
        );
        assert_eq!(time_of(Some(&json!(60000.0))), Ok(60_000));
        assert_eq!(
            time_of(Some(&json!("1970-01-01T00:01:00.250+00:00"))),
            Ok(60_250)
        );
        assert!(time_of(Some(&json!(1.5))).unwrap_err().contains("whole"));
        assert!(time_of(Some(&json!("yesterday")))
            .unwrap_err()
            .contains("RFC 3339"));
        assert!(time_of(Some(&json!(true)))
            .unwrap_err()
            .contains("a boolean"));
        assert_eq!(time_of(None), Err("missing".into()));
    }

    #[test]
    fn the_section_names_the_wrong_key() {
        let s: WatermarkSection = toml::from_str("timestamp = \"ts\"").unwrap();
        assert_eq!(s.config().unwrap_err().0, "timestamp");
        let s: WatermarkSection = toml::from_str("idle_timeout_ms = 0").unwrap();
        assert_eq!(s.config().unwrap_err().0, "idle_timeout_ms");
        let s: WatermarkSection =
            toml::from_str("timestamp = \"/ts\"\nmax_out_of_orderness_ms = 5000").unwrap();
        let c = s.config().unwrap();
        assert_eq!(c.from, TimestampFrom::Field("/ts".into()));
        assert_eq!(c.max_out_of_orderness_ms, 5000);
        assert_eq!(
            c.read(None, br#"{"ts": 7}"#),
            Ok(7),
            "the Kafka timestamp is not used"
        );
        let k = WatermarkSection {
            timestamp: None,
            max_out_of_orderness_ms: None,
            idle_timeout_ms: None,
        }
        .config()
        .unwrap();
        assert_eq!(k.read(Some(9), b"not json"), Ok(9));
        assert!(k.read(None, b"{}").is_err());
    }
}
