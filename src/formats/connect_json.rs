//! Kafka Connect's JSON envelope (`JsonConverter` with `schemas.enable = true`):
//! `{"schema": ..., "payload": ...}`, the payload written with the schema's logical
//! types. `format = "json"` with `connect_envelope = true` unwraps it; so does the
//! `debezium` transform when a change event comes in one.
//!
//! | Connect logical type | payload | JSON written |
//! |---|---|---|
//! | `Decimal` (scale in `parameters.scale`) | base64 of the unscaled big-endian two's complement | a number with its digits and scale |
//! | `Timestamp` | epoch milliseconds | as `temporal` says: the number, or RFC 3339 (`Z`) |
//! | `Date` | days since the epoch (Connect writes epoch milliseconds of midnight in some versions: both are read) | `"YYYY-MM-DD"` |
//! | `Time` | milliseconds after midnight | as `temporal` says: the number, or `"HH:MM:SS.fff"` |
//!
//! Debezium's semantic types (`io.debezium.time.Date`, `MicroTimestamp`,
//! `io.debezium.data.VariableScaleDecimal`, ...) are written as
//! [`super::debezium_types`] says, whatever `temporal` is: ISO 8601 text with the
//! unit's full precision, and a decimal's exact digits.
//!
//! Structs, arrays and maps are followed into; anything else is the payload as it is.

use super::avro::Temporal;
use super::debezium_types::{self, Semantic};
use super::{DecodeError, Decoded, Decoder, Format, Output};
use serde_json::Value;

const DECIMAL: &str = "org.apache.kafka.connect.data.Decimal";
const TIMESTAMP: &str = "org.apache.kafka.connect.data.Timestamp";
const DATE: &str = "org.apache.kafka.connect.data.Date";
const TIME: &str = "org.apache.kafka.connect.data.Time";

/// Whether `v` is an envelope: an object of exactly `schema` and `payload`.
pub fn is_envelope(v: &Value) -> bool {
    v.as_object()
        .is_some_and(|o| o.len() == 2 && o.contains_key("schema") && o.contains_key("payload"))
}

/// The payload of envelope `v` with its logical types decoded; an error if `v` is not
/// an envelope or the payload does not fit its schema.
pub fn unwrap(v: Value, temporal: Temporal) -> Result<Value, String> {
    if !is_envelope(&v) {
        return Err("not a Kafka Connect envelope (an object of schema and payload)".into());
    }
    let Value::Object(mut o) = v else {
        unreachable!("an envelope is an object")
    };
    let payload = o.remove("payload").unwrap_or(Value::Null);
    let schema = o.remove("schema").unwrap_or(Value::Null);
    convert(&schema, payload, temporal, "")
}

/// `payload` as `schema` says, at `path` (for messages).
fn convert(
    schema: &Value,
    payload: Value,
    temporal: Temporal,
    path: &str,
) -> Result<Value, String> {
    if payload.is_null() || schema.is_null() {
        return Ok(payload);
    }
    let at = |what: String| {
        if path.is_empty() {
            what
        } else {
            format!("{path}: {what}")
        }
    };
    let name = schema.get("name").and_then(Value::as_str);
    if let Some(semantic) = name.and_then(Semantic::named) {
        return debezium(semantic, payload).map_err(at);
    }
    match name {
        Some(DECIMAL) => {
            let scale = match &schema["parameters"]["scale"] {
                Value::String(s) => s.parse::<usize>().ok(),
                Value::Number(n) => n.as_u64().map(|n| n as usize),
                _ => None,
            }
            .ok_or_else(|| at("a Decimal without parameters.scale".into()))?;
            let b64 = match &payload {
                Value::String(b64) => b64,
                // `decimal.format = NUMERIC`: already the number.
                Value::Number(_) => return Ok(payload),
                _ => {
                    return Err(at(format!(
                        "a Decimal is base64 text or a number, not {payload}"
                    )))
                }
            };
            use base64::Engine;
            let unscaled = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| at(format!("a Decimal's base64: {e}")))?;
            let mut text = Vec::new();
            super::json_out::decimal(&mut text, &unscaled, scale).map_err(at)?;
            serde_json::from_slice(&text).map_err(|e| at(e.to_string()))
        }
        Some(TIMESTAMP) => {
            let ms = payload
                .as_i64()
                .ok_or_else(|| at(format!("a Timestamp is epoch milliseconds, not {payload}")))?;
            Ok(match temporal {
                Temporal::EpochMillis => Value::from(ms),
                Temporal::Iso8601 => Value::from(
                    chrono::DateTime::from_timestamp_millis(ms)
                        .ok_or_else(|| at(format!("timestamp {ms} out of range")))?
                        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                ),
            })
        }
        Some(DATE) => {
            let n = payload
                .as_i64()
                .ok_or_else(|| at(format!("a Date is a number of days, not {payload}")))?;
            // Days since the epoch; a value beyond any plausible day count is the
            // milliseconds of that day's midnight.
            let days = if n.abs() > 3_000_000 {
                n.div_euclid(86_400_000)
            } else {
                n
            };
            let date = chrono::NaiveDate::from_ymd_opt(1970, 1, 1)
                .and_then(|e| e.checked_add_signed(chrono::TimeDelta::try_days(days)?))
                .ok_or_else(|| at(format!("date {days} days from the epoch")))?;
            Ok(Value::from(date.format("%Y-%m-%d").to_string()))
        }
        Some(TIME) => {
            let ms = payload.as_i64().ok_or_else(|| {
                at(format!(
                    "a Time is milliseconds after midnight, not {payload}"
                ))
            })?;
            Ok(match temporal {
                Temporal::EpochMillis => Value::from(ms),
                Temporal::Iso8601 => {
                    let t = u32::try_from(ms.div_euclid(1000))
                        .ok()
                        .and_then(|s| {
                            chrono::NaiveTime::from_num_seconds_from_midnight_opt(
                                s,
                                (ms.rem_euclid(1000) * 1_000_000) as u32,
                            )
                        })
                        .ok_or_else(|| at(format!("time of day {ms} ms")))?;
                    Value::from(t.format("%H:%M:%S%.3f").to_string())
                }
            })
        }
        _ => match (schema.get("type").and_then(Value::as_str), payload) {
            (Some("struct"), Value::Object(mut fields)) => {
                for f in schema["fields"].as_array().into_iter().flatten() {
                    let Some(name) = f.get("field").and_then(Value::as_str) else {
                        continue;
                    };
                    if let Some(v) = fields.remove(name) {
                        let inner = if path.is_empty() {
                            name.to_string()
                        } else {
                            format!("{path}.{name}")
                        };
                        fields.insert(name.to_string(), convert(f, v, temporal, &inner)?);
                    }
                }
                Ok(Value::Object(fields))
            }
            (Some("array"), Value::Array(items)) => items
                .into_iter()
                .map(|v| convert(&schema["items"], v, temporal, path))
                .collect::<Result<Vec<_>, _>>()
                .map(Value::Array),
            (Some("map"), Value::Object(entries)) => entries
                .into_iter()
                .map(|(k, v)| Ok((k, convert(&schema["values"], v, temporal, path)?)))
                .collect::<Result<serde_json::Map<_, _>, String>>()
                .map(Value::Object),
            (_, payload) => Ok(payload),
        },
    }
}

/// A payload of Debezium's semantic type `semantic` as lockgate writes it.
fn debezium(semantic: Semantic, payload: Value) -> Result<Value, String> {
    if semantic == Semantic::VariableScaleDecimal {
        let scale = payload.get("scale").and_then(Value::as_i64);
        let value = payload.get("value").and_then(Value::as_str);
        let (Some(scale), Some(b64)) = (scale, value) else {
            return Err(format!(
                "a {} is an object of an integer `scale` and a base64 `value`, not {payload}",
                semantic.name()
            ));
        };
        use base64::Engine;
        let unscaled = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| format!("a {}'s base64: {e}", semantic.name()))?;
        let text = debezium_types::variable_scale_decimal(scale, &unscaled)?;
        // The number keeps its text (`12.30`): serde_json holds numbers as text.
        return serde_json::from_str(&text).map_err(|e| e.to_string());
    }
    let n = payload
        .as_i64()
        .ok_or_else(|| format!("a {} is an integer, not {payload}", semantic.name()))?;
    Ok(Value::String(semantic.integer(n)?))
}

/// `format = "json"` with `connect_envelope = true`: each value is an envelope,
/// written out as its decoded payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectJson {
    pub temporal: Temporal,
}

impl Format for ConnectJson {
    fn name(&self) -> &'static str {
        "json"
    }

    fn output(&self) -> Output {
        Output::Json
    }

    fn decoder(&self) -> Box<dyn Decoder> {
        Box::new(*self)
    }
}

impl Decoder for ConnectJson {
    fn decode(&mut self, payload: &[u8]) -> Result<Decoded, DecodeError> {
        let v: Value = serde_json::from_slice(payload)
            .map_err(|e| DecodeError::record(format!("not valid JSON: {e}")))?;
        let v = unwrap(v, self.temporal).map_err(DecodeError::record)?;
        Ok(Decoded::Replaced(
            serde_json::to_vec(&v).expect("a JSON value serializes"),
        ))
    }

    fn learn(&mut self, _: u32, _: Result<&super::registry::ResolvedSchema, String>) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decimal_schema(scale: &str) -> Value {
        json!({"type": "bytes", "optional": false, "name": DECIMAL, "version": 1,
               "parameters": {"scale": scale, "connect.decimal.precision": "10"}})
    }

    #[test]
    fn logical_types_become_json_values() {
        // Debezium's order row with a DECIMAL(10,2) of 5094.61 (unscaled 509461 =
        // 0x07C615: "B8YV"), a DATE, a TIMESTAMP and a TIME, as JsonConverter writes them.
        let envelope = json!({
            "schema": {"type": "struct", "name": "orders.Value", "optional": false, "fields": [
                {"field": "id", "type": "int32"},
                {"field": "total", "type": "bytes", "name": DECIMAL, "parameters": {"scale": "2"}},
                {"field": "refund", "type": "bytes", "optional": true, "name": DECIMAL, "parameters": {"scale": "2"}},
                {"field": "day", "type": "int32", "name": DATE},
                {"field": "at", "type": "int64", "name": TIMESTAMP},
                {"field": "time", "type": "int32", "name": TIME},
                {"field": "tags", "type": "array", "items": {"type": "string"}}
            ]},
            "payload": {"id": 7, "total": "B8YV", "refund": null, "day": 19723,
                        "at": 1_704_067_200_123i64, "time": 3_723_004, "tags": ["a"]}
        });
        assert_eq!(
            unwrap(envelope.clone(), Temporal::EpochMillis).unwrap(),
            json!({"id": 7, "total": 5094.61, "refund": null, "day": "2024-01-01",
                   "at": 1_704_067_200_123i64, "time": 3_723_004, "tags": ["a"]})
        );
        let iso = unwrap(envelope, Temporal::Iso8601).unwrap();
        assert_eq!(iso["at"], "2024-01-01T00:00:00.123Z");
        assert_eq!(iso["time"], "01:02:03.004");
    }

    #[test]
    fn decimals_keep_their_sign_and_scale() {
        for (b64, scale, want) in [
            // The scale's digits stay: 150 at scale 2 is 1.50, not 1.5.
            ("AJY=", "2", Value::Number("1.50".parse().unwrap())),
            ("/2o=", "2", Value::Number("-1.50".parse().unwrap())),
            ("AQ==", "0", json!(1)),
            ("", "0", json!(0)),
        ] {
            let v = convert(
                &decimal_schema(scale),
                json!(b64),
                Temporal::EpochMillis,
                "",
            );
            assert_eq!(v.unwrap(), want, "{b64}");
        }
        // decimal.format = NUMERIC writes the number itself.
        assert_eq!(
            convert(&decimal_schema("2"), json!(12.5), Temporal::EpochMillis, "").unwrap(),
            json!(12.5)
        );
        let e = convert(
            &decimal_schema("2"),
            json!(true),
            Temporal::EpochMillis,
            "total",
        )
        .unwrap_err();
        assert!(e.starts_with("total: ") && e.contains("base64"), "{e}");
    }

    /// Debezium's semantic types, as its JsonConverter writes them: each the one way
    /// `debezium_types` says, under either `temporal`.
    #[test]
    fn debezium_semantic_types_are_decoded() {
        let num = |text: &str| serde_json::from_str::<Value>(text).unwrap();
        let cases: &[(&str, &str, Value, Value)] = &[
            (
                "int32",
                "io.debezium.time.Date",
                json!(19_844),
                json!("2024-05-01"),
            ),
            (
                "int32",
                "io.debezium.time.Date",
                json!(-1),
                json!("1969-12-31"),
            ),
            (
                "int32",
                "io.debezium.time.Time",
                json!(45_296_789),
                json!("12:34:56.789"),
            ),
            (
                "int64",
                "io.debezium.time.MicroTime",
                json!(45_296_789_012i64),
                json!("12:34:56.789012"),
            ),
            (
                "int64",
                "io.debezium.time.NanoTime",
                json!(45_296_789_012_345i64),
                json!("12:34:56.789012345"),
            ),
            (
                "int64",
                "io.debezium.time.Timestamp",
                json!(-1),
                json!("1969-12-31T23:59:59.999"),
            ),
            (
                "int64",
                "io.debezium.time.MicroTimestamp",
                json!(1_714_566_896_789_012i64),
                json!("2024-05-01T12:34:56.789012"),
            ),
            (
                "int64",
                "io.debezium.time.MicroTimestamp",
                json!(-1_000_001),
                json!("1969-12-31T23:59:58.999999"),
            ),
            (
                "int64",
                "io.debezium.time.NanoTimestamp",
                json!(1_714_566_896_789_012_345i64),
                json!("2024-05-01T12:34:56.789012345"),
            ),
            (
                "string",
                "io.debezium.time.ZonedTimestamp",
                json!("2024-05-01T12:34:56.789012Z"),
                json!("2024-05-01T12:34:56.789012Z"),
            ),
            (
                "string",
                "io.debezium.time.ZonedTime",
                json!("12:34:56Z"),
                json!("12:34:56Z"),
            ),
            ("int32", "io.debezium.time.Year", json!(2024), json!(2024)),
            // 1230 = 0x04CE, -1230 = 0xFB32.
            (
                "struct",
                "io.debezium.data.VariableScaleDecimal",
                json!({"scale": 2, "value": "BM4="}),
                num("12.30"),
            ),
            (
                "struct",
                "io.debezium.data.VariableScaleDecimal",
                json!({"scale": 2, "value": "+zI="}),
                num("-12.30"),
            ),
        ];
        for (ty, name, payload, want) in cases {
            let schema = json!({"type": ty, "name": name, "version": 1});
            for temporal in [Temporal::EpochMillis, Temporal::Iso8601] {
                let got = convert(&schema, payload.clone(), temporal, "at").unwrap();
                assert_eq!(&got, want, "{name} {payload}");
                // Numbers keep their text: `12.30`, not `12.3`.
                assert_eq!(got.to_string(), want.to_string(), "{name} {payload}");
            }
        }
        let decimal = convert(
            &json!({"type": "struct", "name": "io.debezium.data.VariableScaleDecimal"}),
            json!({"scale": 2, "value": "BM4="}),
            Temporal::EpochMillis,
            "",
        )
        .unwrap();
        assert_eq!(decimal.to_string(), "12.30");
        for (name, payload) in [
            ("io.debezium.time.Date", json!("2024-05-01")),
            ("io.debezium.time.MicroTime", json!(-1)),
            ("io.debezium.time.Time", json!(86_400_001)),
            ("io.debezium.data.VariableScaleDecimal", json!({"scale": 2})),
        ] {
            let e = convert(
                &json!({"type": "int64", "name": name}),
                payload,
                Temporal::Iso8601,
                "day",
            )
            .unwrap_err();
            assert!(e.starts_with("day: ") && e.contains(name), "{e}");
        }
    }

    #[test]
    fn only_an_envelope_is_unwrapped() {
        assert!(unwrap(json!({"payload": 1}), Temporal::EpochMillis).is_err());
        assert!(unwrap(
            json!({"schema": null, "payload": 1, "x": 2}),
            Temporal::EpochMillis
        )
        .is_err());
        assert_eq!(
            unwrap(
                json!({"schema": null, "payload": {"a": 1}}),
                Temporal::EpochMillis
            )
            .unwrap(),
            json!({"a": 1})
        );
        let mut d = ConnectJson {
            temporal: Temporal::EpochMillis,
        };
        assert!(d.decode(br#"{"a":1}"#).is_err());
        assert_eq!(
            d.decode(br#"{"schema":{"type":"int32"},"payload":5}"#),
            Ok(Decoded::Replaced(b"5".to_vec()))
        );
    }
}
