//! `rolling_sum`: a keyed running sum kept in RocksDB (Flink's rolling addition).
//!
//! For each record, the number at `field` is added to the key's sum and the new sum is
//! written into the record at `output`. Sums are exact ([`Sum`]): integers as `i64`
//! (overflow is an error), and from the first number that is not an integer on, a
//! decimal. A key is its text ([`json_key`]).

use crate::connector::{KeyError, PreparedTransform, SectionContext, Step, TransformSection};
use crate::error::{JobError, Result};
use crate::kits::keyed::{KeyedFunction, KeyedState};
/// The key helpers, where the rolling sum's users have always found them.
pub use crate::record::{canonical_key, describe, json_key, key_text, set_pointer};
use crate::record::{Batch, Record};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A running sum: exact in both of its forms. Integers add as `i64` (an overflow is an
/// error, never a wrap or a rounding); the first number that is not an integer turns
/// the sum into a decimal, added exactly digit by digit (`1.50 + 2.25` is `3.75`, and
/// `0.1 + 0.2` is `0.3`), whose scale is the largest scale added. A number whose
/// exponent is beyond ±[`MAX_EXPONENT`] is refused: its digits written out would be
/// megabytes in state for every record.
///
/// The variants keep their order in state: `Float` is a sum an earlier build kept as a
/// double, read back and continued as a decimal of its shortest text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Sum {
    Int(i64),
    /// Kept by an earlier build; never written now.
    Float(f64),
    /// The decimal's text.
    Decimal(String),
}

/// The largest exponent (either sign) of a number a sum adds.
pub const MAX_EXPONENT: i64 = 1000;

impl Sum {
    /// The sum with `v` added; `None` when an integer sum overflows or `v`'s exponent
    /// is beyond ±[`MAX_EXPONENT`].
    pub fn plus(&self, v: &serde_json::Number) -> Option<Sum> {
        match (self, v.as_i64()) {
            (Sum::Int(a), Some(b)) => a.checked_add(b).map(Sum::Int),
            (a, _) => Some(Sum::Decimal(
                (a.decimal()? + decimal(v.as_str())?).to_plain_string(),
            )),
        }
    }

    /// Two sums added; `None` when an integer sum overflows.
    pub fn merge(&self, other: &Sum) -> Option<Sum> {
        match (self, other) {
            (Sum::Int(a), Sum::Int(b)) => a.checked_add(*b).map(Sum::Int),
            (a, b) => Some(Sum::Decimal(
                (a.decimal()? + b.decimal()?).to_plain_string(),
            )),
        }
    }

    fn decimal(&self) -> Option<bigdecimal::BigDecimal> {
        match self {
            Sum::Int(i) => Some((*i).into()),
            Sum::Float(f) => decimal(&Value::from(*f).to_string()),
            Sum::Decimal(d) => decimal(d),
        }
    }

    /// The sum as a JSON number.
    pub fn to_json(&self) -> Value {
        match self {
            Sum::Int(i) => Value::from(*i),
            Sum::Float(f) => Value::from(*f),
            Sum::Decimal(d) => d.parse().map(Value::Number).unwrap_or(Value::Null),
        }
    }
}

/// `text` as a decimal, unless its exponent is beyond ±[`MAX_EXPONENT`].
fn decimal(text: &str) -> Option<bigdecimal::BigDecimal> {
    let d: bigdecimal::BigDecimal = text.parse().ok()?;
    let (digits, scale) = d.as_bigint_and_exponent();
    let exponent = digits.to_string().trim_start_matches('-').len() as i64 - scale;
    (exponent.abs() <= MAX_EXPONENT && scale.abs() <= MAX_EXPONENT).then_some(d)
}

/// The rolling sum keyed function.
#[derive(Debug, Clone)]
pub struct RollingSum {
    pub field: String,
    pub output: String,
}

/// A `[[transform]]` of `type = "rolling_sum"` as written in a job file.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RollingSumSection {
    key: String,
    field: String,
    output: Option<String>,
}

impl RollingSumSection {
    /// `(key, field, output)` JSON pointers (`output` defaults to `/total`).
    pub fn pointers(&self) -> (String, String, String) {
        let output = self.output.clone().unwrap_or_else(|| "/total".into());
        (self.key.clone(), self.field.clone(), output)
    }

    /// `key_by(key)` and the rolling sum (uid `rolling_sum-<i>`). An error is
    /// `(key, message)`.
    pub fn steps(&self, i: usize) -> Result<Vec<Step>, (String, String)> {
        let (key, field, output) = self.pointers();
        for (k, v) in [("key", &key), ("field", &field), ("output", &output)] {
            if !v.starts_with('/') {
                return Err((
                    k.to_string(),
                    format!("`{v}` is not a JSON pointer (it starts with /)"),
                ));
            }
        }
        Ok(vec![
            Step::KeyBy(std::sync::Arc::new(move |r| json_key(r, &key))),
            crate::kits::keyed::step(KIND, &format!("{KIND}-{i}"), false, move |_| RollingSum {
                field: field.clone(),
                output: output.clone(),
            }),
        ])
    }
}

/// The operator kind of the rolling sum in a job graph.
pub const KIND: &str = "rolling_sum";

impl TransformSection for RollingSumSection {
    fn prepare(self, _cx: &SectionContext, index: usize) -> Result<PreparedTransform, KeyError> {
        Ok(PreparedTransform {
            steps: self.steps(index)?,
            config: std::sync::Arc::new(self.pointers()),
            facts: Default::default(),
        })
    }
}

const STATE: &str = "sum";

impl KeyedFunction for RollingSum {
    fn process(
        &mut self,
        _key: &[u8],
        mut record: Record,
        state: &mut KeyedState<'_>,
        out: &mut Batch,
    ) -> Result<()> {
        if record.tombstone || record.op == crate::record::Op::Delete {
            return Err(JobError::Other(format!(
                "{}: rolling_sum sums values written, and this record is a {}",
                describe(&record),
                if record.op == crate::record::Op::Delete {
                    "delete (drop deletes before it)"
                } else {
                    "tombstone"
                }
            )));
        }
        let mut doc: Value = serde_json::from_slice(&record.value).map_err(|e| {
            JobError::Other(format!("{} is not valid JSON: {e}", describe(&record)))
        })?;
        let n = match doc.pointer(&self.field) {
            Some(Value::Number(n)) => n.clone(),
            other => {
                return Err(JobError::Other(format!(
                    "{}: rolling_sum field {} is {}, not a number",
                    describe(&record),
                    self.field,
                    other.map_or("missing".to_string(), |v| v.to_string())
                )))
            }
        };
        let prev = state.get::<Sum>(STATE)?.unwrap_or(Sum::Int(0));
        let sum = prev.plus(&n).ok_or_else(|| {
            JobError::Other(format!(
                "{}: rolling_sum overflows i64, or the number's exponent is beyond ±1000",
                describe(&record)
            ))
        })?;
        state.put(STATE, &sum)?;
        if !set_pointer(&mut doc, &self.output, sum.to_json()) {
            return Err(JobError::Other(format!(
                "{}: cannot write rolling_sum output at {}",
                describe(&record),
                self.output
            )));
        }
        record.value = serde_json::to_vec(&doc)
            .expect("a JSON value serializes")
            .into();
        out.push(record);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_key_is_its_text_whatever_its_json_type() {
        let key = |v: &str| json_key(&Record::from_value(v.as_bytes().to_vec()), "/k").unwrap();
        assert_eq!(key(r#"{"k":"1"}"#), key(r#"{"k":1}"#));
        assert_eq!(key(r#"{"k":"true"}"#), key(r#"{"k":true}"#));
        assert_eq!(key(r#"{"k":"1.50"}"#), key(r#"{"k":1.50}"#));
        assert_ne!(key(r#"{"k":1.5}"#), key(r#"{"k":1.50}"#));
        assert_eq!(key(r#"{"k":"u-1"}"#), br#""u-1""#.to_vec());
        // The same text as the result's id (the window's `key`, an id by field).
        let k = key(r#"{"k":12345678901234567890123456789012345678}"#);
        assert_eq!(
            serde_json::from_slice::<Value>(&k).unwrap(),
            json!("12345678901234567890123456789012345678")
        );
    }

    #[test]
    fn a_number_beyond_the_exponent_bound_is_refused_and_old_double_sums_go_on() {
        let n = |t: &str| t.parse::<serde_json::Number>().unwrap();
        assert_eq!(Sum::Int(1).plus(&n("1e2000000")), None);
        assert_eq!(Sum::Int(1).plus(&n("1e-2000")), None);
        // An exponent form is not an integer literal: added as a decimal, written out.
        assert_eq!(
            Sum::Int(1).plus(&n("1e3")),
            Some(Sum::Decimal("1001".into()))
        );
        assert_eq!(
            Sum::Int(1).plus(&n("1.5e2")),
            Some(Sum::Decimal("151".into()))
        );
        assert_eq!(
            Sum::Float(1.5).plus(&n("0.25")),
            Some(Sum::Decimal("1.75".into()))
        );
    }

    #[test]
    fn set_pointer_creates_last_member_only() {
        let mut d = json!({"a": {"b": 1}});
        assert!(set_pointer(&mut d, "/total", json!(5)));
        assert!(set_pointer(&mut d, "/a/b", json!(2)));
        assert!(!set_pointer(&mut d, "/x/y", json!(3)));
        assert_eq!(d, json!({"a": {"b": 2}, "total": 5}));
    }

    #[test]
    fn sums_stay_integer_until_a_float_arrives() {
        let s = Sum::Int(1).plus(&serde_json::Number::from(2)).unwrap();
        assert_eq!(s, Sum::Int(3));
        let f = s.plus(&serde_json::Number::from_f64(0.5).unwrap()).unwrap();
        assert_eq!(f, Sum::Decimal("3.5".into()));
        assert!(Sum::Int(i64::MAX)
            .plus(&serde_json::Number::from(1))
            .is_none());
    }
}
