//! The aggregates a window keeps: `count`, `sum:/ptr`, `min:/ptr`, `max:/ptr`,
//! `avg:/ptr`. Each is incremental (a record is added in constant space) and
//! mergeable (sessions merge). Like SQL's, they skip a field that is absent or null;
//! any other value that is not a number is an error.

use crate::operators::rolling_sum::Sum;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::cmp::Ordering;

/// One aggregate as written in the job file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AggSpec {
    Count,
    Sum(String),
    Min(String),
    Max(String),
    Avg(String),
}

impl AggSpec {
    /// `count`, or `<fn>:<JSON pointer>`.
    pub fn parse(s: &str) -> Result<AggSpec, String> {
        if s == "count" {
            return Ok(AggSpec::Count);
        }
        let Some((f, p)) = s.split_once(':') else {
            return Err(format!(
                "`{s}` is not count, sum:/field, min:/field, max:/field or avg:/field"
            ));
        };
        if !p.starts_with('/') {
            return Err(format!("`{p}` is not a JSON pointer (it starts with /)"));
        }
        let p = p.to_string();
        Ok(match f {
            "sum" => AggSpec::Sum(p),
            "min" => AggSpec::Min(p),
            "max" => AggSpec::Max(p),
            "avg" => AggSpec::Avg(p),
            _ => {
                return Err(format!(
                    "`{f}` is not an aggregate (count, sum, min, max, avg)"
                ))
            }
        })
    }

    /// The field it reads, if any.
    pub fn field(&self) -> Option<&str> {
        match self {
            AggSpec::Count => None,
            AggSpec::Sum(p) | AggSpec::Min(p) | AggSpec::Max(p) | AggSpec::Avg(p) => Some(p),
        }
    }

    /// The empty accumulator.
    pub fn empty(&self) -> Acc {
        match self {
            AggSpec::Count => Acc::Count(0),
            AggSpec::Sum(_) => Acc::Sum(Sum::Int(0)),
            AggSpec::Min(_) => Acc::Min(None),
            AggSpec::Max(_) => Acc::Max(None),
            AggSpec::Avg(_) => Acc::Avg { sum: 0.0, n: 0 },
        }
    }
}

impl std::fmt::Display for AggSpec {
    /// As the job file writes it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AggSpec::Count => write!(f, "count"),
            AggSpec::Sum(p) => write!(f, "sum:{p}"),
            AggSpec::Min(p) => write!(f, "min:{p}"),
            AggSpec::Max(p) => write!(f, "max:{p}"),
            AggSpec::Avg(p) => write!(f, "avg:{p}"),
        }
    }
}

/// A number as JSON wrote it: an integer as `i64`, any other number as its text, so
/// that `min` and `max` give back the very number a record carried (`1.50`, a 38-digit
/// decimal), compared exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Num {
    Int(i64),
    /// Kept by an earlier build (the variants keep their order in state); never
    /// written now.
    Float(f64),
    /// The number's text.
    Text(String),
}

impl Num {
    fn of(n: &serde_json::Number) -> Option<Num> {
        match n.as_i64() {
            Some(i) => Some(Num::Int(i)),
            None => n.as_f64().map(|_| Num::Text(n.as_str().to_string())),
        }
    }

    fn cmp(&self, other: &Num) -> Ordering {
        match (self, other) {
            (Num::Int(a), Num::Int(b)) => a.cmp(b),
            // Rounding to a double keeps order, so differing doubles decide; equal
            // ones are compared exactly.
            (a, b) => a
                .f64()
                .total_cmp(&b.f64())
                .then_with(|| match (a.decimal(), b.decimal()) {
                    (Some(x), Some(y)) => x.cmp(&y),
                    _ => Ordering::Equal,
                }),
        }
    }

    fn f64(&self) -> f64 {
        match self {
            Num::Int(i) => *i as f64,
            Num::Float(f) => *f,
            Num::Text(t) => t.parse().unwrap_or(f64::NAN),
        }
    }

    fn decimal(&self) -> Option<bigdecimal::BigDecimal> {
        match self {
            Num::Int(i) => Some((*i).into()),
            Num::Float(f) => Value::from(*f).to_string().parse().ok(),
            Num::Text(t) => t.parse().ok(),
        }
    }

    fn json(&self) -> Value {
        match self {
            Num::Int(i) => Value::from(*i),
            Num::Float(f) => Value::from(*f),
            Num::Text(t) => t.parse().map(Value::Number).unwrap_or(Value::Null),
        }
    }
}

/// An aggregate's running value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Acc {
    Count(u64),
    Sum(Sum),
    Min(Option<Num>),
    Max(Option<Num>),
    Avg { sum: f64, n: u64 },
}

impl Acc {
    /// Adds a record whose field is `v` (`None`: absent).
    pub fn add(&mut self, v: Option<&Value>) -> Result<(), String> {
        if let Acc::Count(c) = self {
            *c += 1;
            return Ok(());
        }
        let n = match v {
            None | Some(Value::Null) => return Ok(()),
            Some(Value::Number(n)) => n,
            Some(other) => {
                return Err(format!(
                    "{} is not a number",
                    crate::record::json_kind(other)
                ))
            }
        };
        let num = Num::of(n).ok_or_else(|| format!("{n} is not a number"))?;
        match self {
            Acc::Count(_) => unreachable!("counted above"),
            Acc::Sum(s) => {
                *s = s.plus(n).ok_or(
                    "the sum overflows a 64-bit integer, or a number's exponent is beyond ±1000",
                )?
            }
            Acc::Min(m) => *m = Some(pick(m.take(), Some(num), min).expect("one given")),
            Acc::Max(m) => *m = Some(pick(m.take(), Some(num), max).expect("one given")),
            Acc::Avg { sum, n } => {
                *sum += num.f64();
                *n += 1;
            }
        }
        Ok(())
    }

    /// Merges `other` (the same aggregate) into this one.
    pub fn merge(&mut self, other: &Acc) -> Result<(), String> {
        match (self, other) {
            (Acc::Count(a), Acc::Count(b)) => *a += b,
            (Acc::Sum(a), Acc::Sum(b)) => {
                *a = a.merge(b).ok_or("the sum overflows a 64-bit integer")?
            }
            (Acc::Min(a), Acc::Min(b)) => *a = pick(a.take(), b.clone(), min),
            (Acc::Max(a), Acc::Max(b)) => *a = pick(a.take(), b.clone(), max),
            (Acc::Avg { sum, n }, Acc::Avg { sum: s2, n: n2 }) => {
                *sum += s2;
                *n += n2;
            }
            (a, b) => return Err(format!("cannot merge {a:?} with {b:?}")),
        }
        Ok(())
    }

    /// The value in the result.
    pub fn json(&self) -> Value {
        match self {
            Acc::Count(c) => Value::from(*c),
            Acc::Sum(s) => s.to_json(),
            Acc::Min(m) | Acc::Max(m) => m.as_ref().map_or(Value::Null, Num::json),
            Acc::Avg { n: 0, .. } => Value::Null,
            Acc::Avg { sum, n } => Value::from(sum / *n as f64),
        }
    }
}

fn min(a: Num, b: Num) -> Num {
    if b.cmp(&a) == Ordering::Less {
        b
    } else {
        a
    }
}

fn max(a: Num, b: Num) -> Num {
    if b.cmp(&a) == Ordering::Greater {
        b
    } else {
        a
    }
}

fn pick(a: Option<Num>, b: Option<Num>, f: fn(Num, Num) -> Num) -> Option<Num> {
    match (a, b) {
        (Some(a), Some(b)) => Some(f(a, b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(spec: &str, values: &[Value]) -> Value {
        let spec = AggSpec::parse(spec).unwrap();
        let mut acc = spec.empty();
        for v in values {
            acc.add(Some(v)).unwrap();
        }
        acc.json()
    }

    #[test]
    fn aggregates_skip_nulls_and_keep_integers_exact() {
        let vals = [
            json!(3),
            json!(null),
            json!(9_007_199_254_740_993i64),
            json!(-2),
        ];
        assert_eq!(run("count", &vals), json!(4));
        assert_eq!(run("sum:/x", &vals), json!(9_007_199_254_740_994i64));
        assert_eq!(run("min:/x", &vals), json!(-2));
        assert_eq!(run("max:/x", &vals), json!(9_007_199_254_740_993i64));
        assert_eq!(run("avg:/x", &[json!(1), json!(2)]), json!(1.5));
        assert_eq!(run("avg:/x", &[json!(null)]), json!(null));
        assert_eq!(run("min:/x", &[]), json!(null));
        assert_eq!(run("max:/x", &[json!(1), json!(1.5)]), json!(1.5));
    }

    #[test]
    fn min_and_max_give_back_the_number_as_written_and_sums_are_exact() {
        let n = |t: &str| Value::Number(t.parse().unwrap());
        let big = "12345678901234567890123456789012345678";
        let vals = [n("1.50"), n("-0.000000000000000000001"), n(big), n("2")];
        assert_eq!(run("max:/x", &vals).to_string(), big);
        assert_eq!(run("min:/x", &vals).to_string(), "-0.000000000000000000001");
        assert_eq!(run("min:/x", &[n("1.50"), n("2")]).to_string(), "1.50");
        // Two decimals one double apart from neither: compared exactly.
        let (a, b) = ("0.10000000000000000001", "0.10000000000000000002");
        assert_eq!(run("max:/x", &[n(b), n(a)]).to_string(), b);
        assert_eq!(run("min:/x", &[n(b), n(a)]).to_string(), a);
        assert_eq!(run("sum:/x", &[n("0.1"), n("0.2")]).to_string(), "0.3");
        // Written out, never in exponent form.
        let tiny = "-0.000000000000000000001";
        assert_eq!(
            run("sum:/x", &[n(tiny), n(tiny)]).to_string(),
            "-0.000000000000000000002"
        );
        assert_eq!(
            run("sum:/x", &[n("1.50"), n("2.25"), n("1")]).to_string(),
            "4.75"
        );
        assert_eq!(
            run("sum:/x", &[n(big), n("1")]).to_string(),
            "12345678901234567890123456789012345679"
        );
    }

    /// State written by an earlier build, whose sums, minima and maxima were doubles,
    /// reads back as what it said and goes on exactly.
    #[test]
    fn accumulators_kept_as_doubles_by_an_earlier_build_read_back() {
        #[derive(Serialize)]
        enum OldSum {
            #[allow(dead_code)]
            Int(i64),
            Float(f64),
        }
        #[derive(Serialize)]
        enum OldNum {
            #[allow(dead_code)]
            Int(i64),
            Float(f64),
        }
        #[derive(Serialize)]
        enum OldAcc {
            #[allow(dead_code)]
            Count(u64),
            Sum(OldSum),
            #[allow(dead_code)]
            Min(Option<OldNum>),
            Max(Option<OldNum>),
        }
        let config = bincode::config::standard();
        let old = vec![
            OldAcc::Sum(OldSum::Float(1.5)),
            OldAcc::Max(Some(OldNum::Float(0.1))),
        ];
        let bytes = bincode::serde::encode_to_vec(&old, config).unwrap();
        let (mut accs, _): (Vec<Acc>, usize) =
            bincode::serde::decode_from_slice(&bytes, config).unwrap();
        assert_eq!(accs[0].json().to_string(), "1.5");
        assert_eq!(accs[1].json().to_string(), "0.1");
        accs[0]
            .add(Some(&Value::Number("0.25".parse().unwrap())))
            .unwrap();
        assert_eq!(accs[0].json().to_string(), "1.75");
        accs[1]
            .add(Some(&Value::Number("0.2".parse().unwrap())))
            .unwrap();
        assert_eq!(accs[1].json().to_string(), "0.2");
    }

    #[test]
    fn a_number_beyond_the_exponent_bound_is_refused_by_a_sum() {
        let spec = AggSpec::parse("sum:/x").unwrap();
        let mut acc = spec.empty();
        acc.add(Some(&Value::Number("1.5".parse().unwrap())))
            .unwrap();
        assert!(acc
            .add(Some(&Value::Number("1e2000000".parse().unwrap())))
            .is_err());
        assert_eq!(acc.json().to_string(), "1.5");
    }

    #[test]
    fn merged_accumulators_equal_one_over_all_records() {
        for spec in ["count", "sum:/x", "min:/x", "max:/x", "avg:/x"] {
            let spec = AggSpec::parse(spec).unwrap();
            let all: Vec<Value> = (0..10).map(|i| json!((i * 7) % 5 - 2)).collect();
            let mut one = spec.empty();
            let (mut a, mut b) = (spec.empty(), spec.empty());
            for (i, v) in all.iter().enumerate() {
                one.add(Some(v)).unwrap();
                if i % 3 == 0 {
                    a.add(Some(v)).unwrap()
                } else {
                    b.add(Some(v)).unwrap()
                }
            }
            a.merge(&b).unwrap();
            assert_eq!(a.json(), one.json(), "{spec:?}");
        }
    }

    #[test]
    fn what_is_not_an_aggregate_or_a_number_is_refused() {
        assert!(AggSpec::parse("median:/x").unwrap_err().contains("median"));
        assert!(AggSpec::parse("sum:x")
            .unwrap_err()
            .contains("JSON pointer"));
        assert!(AggSpec::parse("total").is_err());
        let mut a = AggSpec::parse("sum:/x").unwrap().empty();
        assert!(a.add(Some(&json!("12"))).unwrap_err().contains("a string"));
        let mut a = Acc::Sum(Sum::Int(i64::MAX));
        assert!(a.add(Some(&json!(1))).is_err());
    }
}
