//! The file sink's decoding as it was before [`super::columns`]: each record parsed
//! into a tree of values and checked ([`prepared`]), written out again, then read by
//! Arrow's JSON decoder. Kept to check the columns against (the differential tests
//! below): what it took, they take as the same values.

use super::parquet::Decoded;
use crate::record::Batch;
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use serde_json::Value;

use super::values::ENUM_SYMBOLS;

/// Base64 as lockgate's formats write it (the standard alphabet), padded or not.
const BASE64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// `value` (one record's JSON text) as Arrow's decoder is to read it, every column's
/// value checked and binary values turned from base64 into the hex the decoder reads.
fn prepared(schema: &Schema, value: &[u8]) -> Result<Vec<u8>, String> {
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
fn decimal_places(text: &str) -> Option<i64> {
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

/// The rows of `batch` as the previous decoding made them (tombstones aside: the
/// records here are values).
pub fn decode(schema: &arrow_schema::SchemaRef, batch: &Batch) -> Decoded {
    let mut refused = Vec::new();
    let mut rows: Vec<usize> = Vec::with_capacity(batch.len());
    let mut values: Vec<Vec<u8>> = Vec::with_capacity(batch.len());
    for (i, r) in batch.iter().enumerate() {
        match prepared(schema, &r.value) {
            Ok(v) => {
                rows.push(i);
                values.push(v);
            }
            Err(why) => {
                refused.push((i, why));
                values.push(Vec::new());
            }
        }
    }
    match decode_rows(schema, &values, &rows) {
        Ok(decoded) => Decoded {
            rows: decoded,
            refused,
        },
        Err(_) => {
            let mut fitting = Vec::with_capacity(rows.len());
            for i in rows {
                match decode_rows(schema, &values, &[i]) {
                    Ok(_) => fitting.push(i),
                    Err(why) => refused.push((i, why)),
                }
            }
            refused.sort_by_key(|(i, _)| *i);
            let rows = decode_rows(schema, &values, &fitting)
                .expect("records that decode alone decode together");
            Decoded { rows, refused }
        }
    }
}

fn decode_rows(
    schema: &arrow_schema::SchemaRef,
    batch: &[Vec<u8>],
    which: &[usize],
) -> Result<Option<arrow_array::RecordBatch>, String> {
    if which.is_empty() {
        return Ok(None);
    }
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        decode_rows_unguarded(schema, batch, which)
    }))
    .unwrap_or_else(|_| Err("the Parquet decoder could not read the value".into()))
}

fn decode_rows_unguarded(
    schema: &arrow_schema::SchemaRef,
    batch: &[Vec<u8>],
    which: &[usize],
) -> Result<Option<arrow_array::RecordBatch>, String> {
    let mut decoder = arrow_json::ReaderBuilder::new(schema.clone())
        .with_strict_mode(true)
        .with_batch_size(which.len())
        .build_decoder()
        .map_err(|e| e.to_string())?;
    for (k, &i) in which.iter().enumerate() {
        let value = &batch[i];
        let read = decoder.decode(value).map_err(|e| e.to_string())?;
        if read != value.len() || decoder.has_partial_record() || decoder.len() != k + 1 {
            return Err("the value is not exactly one JSON object".into());
        }
    }
    let rows = decoder.flush().map_err(|e| e.to_string())?;
    if let Some(rows) = &rows {
        arrow_array::Array::to_data(&arrow_array::StructArray::from(rows.clone()))
            .validate_full()
            .map_err(|e| e.to_string())?;
    }
    let n = rows.as_ref().map_or(0, |b| b.num_rows());
    if n != which.len() {
        return Err(format!(
            "{} values gave {n} rows: a value is not exactly one JSON object",
            which.len()
        ));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    //! The columns against the previous decoding, record by record: generated records
    //! over a schema of every type the Avro mapping makes, valid and not, and text
    //! that is not JSON.

    use super::super::avro_arrow::arrow_schema_of_text;
    use super::super::parquet::ParquetFormat;
    use super::*;
    use crate::record::Record;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    use std::sync::Arc;

    const SCHEMA: &str = r#"{"type":"record","name":"every","fields":[
        {"name":"id","type":"long"},
        {"name":"n","type":["null","int"]},
        {"name":"ok","type":["null","boolean"]},
        {"name":"f","type":["null","float"]},
        {"name":"d","type":["null","double"]},
        {"name":"s","type":["null","string"]},
        {"name":"b","type":["null","bytes"]},
        {"name":"amount","type":["null",{"type":"bytes","logicalType":"decimal","precision":12,"scale":2}]},
        {"name":"huge","type":["null",{"type":"bytes","logicalType":"decimal","precision":50,"scale":10}]},
        {"name":"whole","type":["null",{"type":"bytes","logicalType":"decimal","precision":5,"scale":0}]},
        {"name":"day","type":["null",{"type":"int","logicalType":"date"}]},
        {"name":"at","type":["null",{"type":"long","logicalType":"timestamp-millis"}]},
        {"name":"at_us","type":["null",{"type":"long","logicalType":"timestamp-micros"}]},
        {"name":"at_ns","type":["null",{"type":"long","logicalType":"timestamp-nanos"}]},
        {"name":"local","type":["null",{"type":"long","logicalType":"local-timestamp-millis"}]},
        {"name":"local_us","type":["null",{"type":"long","logicalType":"local-timestamp-micros"}]},
        {"name":"local_ns","type":["null",{"type":"long","logicalType":"local-timestamp-nanos"}]},
        {"name":"tm","type":["null",{"type":"int","logicalType":"time-millis"}]},
        {"name":"tmu","type":["null",{"type":"long","logicalType":"time-micros"}]},
        {"name":"uid","type":["null",{"type":"string","logicalType":"uuid"}]},
        {"name":"kind","type":["null",{"type":"enum","name":"kind","symbols":["retail","wholesale","x_y"]}]},
        {"name":"hash","type":["null",{"type":"fixed","name":"h4","size":4}]},
        {"name":"price","type":["null",{"type":"fixed","name":"money","size":8,"logicalType":"decimal","precision":18,"scale":4}]},
        {"name":"tags","type":["null",{"type":"array","items":"string"}]},
        {"name":"nums","type":["null",{"type":"array","items":["null","long"]}]},
        {"name":"grid","type":["null",{"type":"array","items":{"type":"array","items":"int"}}]},
        {"name":"kinds","type":["null",{"type":"array","items":"kind"}]},
        {"name":"attrs","type":["null",{"type":"map","values":"long"}]},
        {"name":"weights","type":["null",{"type":"map","values":["null","double"]}]},
        {"name":"lists","type":["null",{"type":"map","values":{"type":"array","items":"int"}}]},
        {"name":"addr","type":["null",{"type":"record","name":"addr","fields":[
            {"name":"city","type":"string"},
            {"name":"zip","type":["null","int"]},
            {"name":"geo","type":{"type":"record","name":"geo","fields":[{"name":"lat","type":"double"}]}}]}]},
        {"name":"billing","type":["null","addr"]},
        {"name":"lines","type":["null",{"type":"array","items":{"type":"record","name":"line","fields":[
            {"name":"sku","type":"string"},
            {"name":"qty","type":"int"},
            {"name":"unit","type":["null","money"]},
            {"name":"kind","type":["null","kind"]}]}}]},
        {"name":"nothing","type":"null"},
        {"name":"must","type":{"type":"record","name":"must","fields":[{"name":"x","type":"long"}]}}
    ]}"#;

    fn schema() -> arrow_schema::SchemaRef {
        Arc::new(arrow_schema_of_text(SCHEMA).unwrap())
    }

    /// The generator: its numbers, and how often a value is wild (of any shape, near
    /// the edges or past them) rather than one that fits.
    struct Gen {
        rng: SmallRng,
        wild: f64,
    }

    impl std::ops::Deref for Gen {
        type Target = SmallRng;
        fn deref(&self) -> &SmallRng {
            &self.rng
        }
    }

    impl std::ops::DerefMut for Gen {
        fn deref_mut(&mut self) -> &mut SmallRng {
            &mut self.rng
        }
    }

    /// A value of `kind` that fits.
    fn fitting(g: &mut Gen, kind: &str, depth: usize) -> String {
        let small = |g: &mut Gen, n: u32| {
            let d = digits_in(g, 1..n as usize + 1);
            let d = d.trim_start_matches('0');
            if d.is_empty() {
                "0".to_string()
            } else {
                d.to_string()
            }
        };
        let dec = |g: &mut Gen, int: u32, frac: u32| {
            let sign = if g.gen_bool(0.3) { "-" } else { "" };
            let n = g.gen_range(1..=int);
            let i = small(g, n);
            match g.gen_range(0..4) {
                0 => format!("{sign}{i}"),
                1 => format!("\"{sign}{i}.{}\"", digits_in(g, 1..frac as usize + 1)),
                _ => format!("{sign}{i}.{}", digits_in(g, 1..frac as usize + 1)),
            }
        };
        match kind {
            "long" => format!("{}", g.gen_range(-1_000_000_000_000i64..1_000_000_000_000)),
            "int" => format!("{}", g.gen_range(i32::MIN..=i32::MAX)),
            "boolean" => pick(g, &["true", "false"]).to_string(),
            "float" | "double" => format!("{}.{}", g.gen_range(-1000..1000), digits_in(g, 1..8)),
            "string" => string(g),
            "bytes" => quoted(base64_in(g, 0..9)),
            "fixed4" => quoted(base64(g, 4)),
            "dec12_2" => dec(g, 10, 2),
            "dec50_10" => dec(g, 40, 10),
            "dec5_0" => format!("{}", g.gen_range(-99_999..100_000)),
            "money" => dec(g, 14, 4),
            "date" => format!(
                "\"{}-{:02}-{:02}\"",
                g.gen_range(1900..2100),
                g.gen_range(1..13),
                g.gen_range(1..29)
            ),
            "time_ms" | "time_us" => {
                let frac = if kind == "time_ms" { 1..4 } else { 1..7 };
                format!(
                    "\"{:02}:{:02}:{:02}.{}\"",
                    g.gen_range(0..24),
                    g.gen_range(0..60),
                    g.gen_range(0..60),
                    digits_in(g, frac)
                )
            }
            "timestamp" | "local" => {
                let zone = if kind == "local" {
                    ""
                } else {
                    pick(g, &["Z", "+02:00", "-05:30"])
                };
                format!(
                    "\"{}-{:02}-{:02}T{:02}:{:02}:{:02}.{}{zone}\"",
                    g.gen_range(1900..2100),
                    g.gen_range(1..13),
                    g.gen_range(1..29),
                    g.gen_range(0..24),
                    g.gen_range(0..60),
                    g.gen_range(0..60),
                    digits_in(g, 1..4)
                )
            }
            _ => value(g, kind, depth),
        }
    }

    fn pick<'x>(g: &mut Gen, options: &[&'x str]) -> &'x str {
        options[g.gen_range(0..options.len())]
    }

    fn digits(g: &mut Gen, n: usize) -> String {
        (0..n)
            .map(|_| char::from(b'0' + g.gen_range(0..10u8)))
            .collect()
    }

    fn digits_in(g: &mut Gen, n: std::ops::Range<usize>) -> String {
        let n = g.gen_range(n);
        digits(g, n)
    }

    fn base64_in(g: &mut Gen, n: std::ops::Range<usize>) -> String {
        let n = g.gen_range(n);
        base64(g, n)
    }

    /// A JSON number of some shape: an integer, a fraction, an exponent.
    fn number(g: &mut Gen) -> String {
        let sign = if g.gen_bool(0.3) { "-" } else { "" };
        let int = match g.gen_range(0..6) {
            0 => "0".to_string(),
            1 => digits(g, 1).trim_start_matches('0').to_string() + "1",
            2 => format!("{}", g.gen_range(1..10)) + &digits_in(g, 0..12),
            3 => format!("{}", g.gen_range(1..10)) + &digits_in(g, 15..30),
            4 => format!("{}", i64::MAX - g.gen_range(-2..3)),
            _ => format!("{}", g.gen_range(1..100_000)),
        };
        let frac = match g.gen_range(0..4) {
            0 => format!(".{}", digits_in(g, 1..12)),
            1 => format!(".{}0", digits_in(g, 0..3)),
            _ => String::new(),
        };
        let exp = match g.gen_range(0..6) {
            0 => format!("e{}", g.gen_range(-12..12)),
            1 => format!("E+{}", g.gen_range(0..5)),
            2 => format!("e{}", g.gen_range(-400..400)),
            _ => String::new(),
        };
        format!("{sign}{int}{frac}{exp}")
    }

    fn date(g: &mut Gen) -> String {
        let y = match g.gen_range(0..5) {
            0 => g.gen_range(0..10_000),
            1 => g.gen_range(1677..1679),
            2 => g.gen_range(2261..2263),
            _ => g.gen_range(1900..2100),
        };
        format!("{y:04}-{:02}-{:02}", g.gen_range(0..14), g.gen_range(0..32))
    }

    fn time(g: &mut Gen) -> String {
        let frac = match g.gen_range(0..5) {
            0 => String::new(),
            1 => format!(".{}", digits_in(g, 1..4)),
            2 => format!(".{}", digits_in(g, 4..11)),
            3 => format!(".{}000", digits(g, 3)),
            _ => ".".to_string(),
        };
        format!(
            "{:02}:{:02}:{:02}{frac}",
            g.gen_range(0..25),
            g.gen_range(0..61),
            if g.gen_bool(0.05) {
                60
            } else {
                g.gen_range(0..60)
            }
        )
    }

    fn timestamp(g: &mut Gen) -> String {
        let sep = pick(g, &["T", "T", "T", " ", "t", "_"]);
        let zone = match g.gen_range(0..9) {
            0 | 1 => "Z".to_string(),
            2 => String::new(),
            3 => "z".to_string(),
            4 => format!(
                "{}{:02}:{:02}",
                pick(g, &["+", "-"]),
                g.gen_range(0..25),
                g.gen_range(0..61)
            ),
            5 => format!("+{:02}{:02}", g.gen_range(0..24), g.gen_range(0..60)),
            6 => "-00:00".to_string(),
            7 => "+02".to_string(),
            _ => "+01:00".to_string(),
        };
        format!("{}{sep}{}{zone}", date(g), time(g))
    }

    fn base64(g: &mut Gen, n: usize) -> String {
        use base64::Engine;
        let bytes: Vec<u8> = (0..n).map(|_| g.gen()).collect();
        let text = base64::engine::general_purpose::STANDARD.encode(bytes);
        match g.gen_range(0..6) {
            0 => text.trim_end_matches('=').to_string(),
            1 => text.replace('A', "\\u0041"),
            _ => text,
        }
    }

    fn string(g: &mut Gen) -> String {
        let parts = [
            "a",
            "retail",
            "wholesale",
            "é",
            "\\u00e9",
            "\\ud83d\\ude00",
            "😀",
            "\\n",
            "\\\"",
            "\\\\",
            "\\/",
            "\\t",
            "x y",
            "\\u0000",
            "\\ud800",
            "\\udc00",
            "\\ud800\\u0041",
            "\\q",
            "\t",
            "\u{1}",
            "\u{7f}",
        ];
        let n = g.gen_range(0..4);
        let weights: Vec<&str> = (0..n)
            .map(|_| {
                if g.gen_bool(0.85) {
                    parts[g.gen_range(0..13)]
                } else {
                    parts[g.gen_range(0..parts.len())]
                }
            })
            .collect();
        format!("\"{}\"", weights.concat())
    }

    /// A value of some other kind than `like`.
    fn other(g: &mut Gen) -> String {
        pick(
            g,
            &[
                "true",
                "false",
                "{}",
                "[]",
                "\"\"",
                "\"x\"",
                "1",
                "-1.5",
                "[1]",
                "{\"a\":1}",
            ],
        )
        .to_string()
    }

    fn quoted(s: String) -> String {
        format!("\"{s}\"")
    }

    /// A value for a field of `kind`: usually one that fits, sometimes one near the
    /// edge, sometimes of another kind.
    fn value(g: &mut Gen, kind: &str, depth: usize) -> String {
        let wild = g.wild;
        if !g.gen_bool(wild) {
            if !matches!(
                kind,
                "tags"
                    | "nums"
                    | "nullable long"
                    | "nullable double"
                    | "grid"
                    | "int list"
                    | "kinds"
                    | "attrs"
                    | "weights"
                    | "lists"
                    | "addr"
                    | "geo"
                    | "lines"
                    | "line"
                    | "must"
                    | "nothing"
                    | "kind"
            ) {
                return fitting(g, kind, depth);
            }
        } else {
            if g.gen_bool(0.1) {
                return other(g);
            }
            if g.gen_bool(0.1) {
                return "null".to_string();
            }
        }
        match kind {
            "long" | "int" => match g.gen_range(0..8) {
                0 => number(g),
                1 => {
                    quoted(pick(g, &["42", "+5", "-0", "007", "x", "", "1.5", "3000000000"]).into())
                }
                2 => format!(
                    "{}",
                    g.gen_range(i64::from(i32::MIN) - 2..i64::from(i32::MIN) + 2)
                ),
                3 => format!(
                    "{}",
                    g.gen_range(i64::from(i32::MAX) - 2..i64::from(i32::MAX) + 2)
                ),
                _ => format!("{}", g.gen_range(-1000..1000)),
            },
            "boolean" => pick(g, &["true", "false", "\"true\"", "1"]).to_string(),
            "float" | "double" => match g.gen_range(0..4) {
                0 => pick(
                    g,
                    &[
                        "3.4028235e38",
                        "3.4028236e38",
                        "1e39",
                        "1e308",
                        "1.8e308",
                        "5e-324",
                        "1e-46",
                        "-0",
                    ],
                )
                .to_string(),
                1 => quoted(number(g)),
                _ => number(g),
            },
            "string" => string(g),
            "bytes" => match g.gen_range(0..6) {
                0 => quoted(pick(g, &["not base64!", "q81=", "q80", "AA==", "", "A"]).into()),
                _ => quoted(base64_in(g, 0..6)),
            },
            "fixed4" => match g.gen_range(0..5) {
                0 => quoted(base64_in(g, 0..8)),
                1 => number(g),
                _ => quoted(base64(g, 4)),
            },
            "dec12_2" | "dec50_10" | "dec5_0" | "money" => match g.gen_range(0..7) {
                0 => quoted(
                    pick(
                        g,
                        &[
                            "+5",
                            "5.",
                            ".5",
                            "-.5",
                            "+.",
                            ".",
                            "1.e2",
                            "e5",
                            "1e",
                            " 5",
                            "1_0",
                            "0x1",
                            "--1",
                            "12.3400",
                            "1e+02",
                            "9999999999.99",
                            "10000000000",
                        ],
                    )
                    .into(),
                ),
                1 => quoted(number(g)),
                2 => pick(
                    g,
                    &[
                        "0e200",
                        "0.001e1",
                        "1.2345e2",
                        "1.23456e2",
                        "-0",
                        "0.00",
                        "99999999999999.9999",
                    ],
                )
                .to_string(),
                _ => number(g),
            },
            "date" => match g.gen_range(0..6) {
                0 => number(g),
                1 => quoted(timestamp(g)),
                2 => quoted(
                    pick(
                        g,
                        &[
                            "+999-01-01",
                            "2024-5-01",
                            "2024-05-1 ",
                            "20240501",
                            "-001-01-01",
                        ],
                    )
                    .into(),
                ),
                _ => quoted(date(g)),
            },
            "time_ms" | "time_us" => match g.gen_range(0..6) {
                0 => number(g),
                1 => format!("{}", g.gen_range(-2..86_400_002_i64)),
                2 => quoted(
                    pick(
                        g,
                        &[
                            "1:2:3",
                            "12:00",
                            "12:00:00Z",
                            "120000",
                            "24:00:00",
                            "12:00:00.1234567890",
                        ],
                    )
                    .into(),
                ),
                _ => quoted(time(g)),
            },
            "timestamp" | "local" => match g.gen_range(0..5) {
                0 => number(g),
                1 => quoted(
                    pick(
                        g,
                        &[
                            "2024-05-01",
                            "2024-05-01T12:00:00.123Z",
                            "2024-05-01T12:00:00.1234567891Z",
                            "+2024-05-01T12:00:00Z",
                            "2024-05-01T12:00:00 +01:00",
                            "2024-05-01T12:00:00+01:00:00",
                            "2024-05-01T12:00:00.Z",
                        ],
                    )
                    .into(),
                ),
                _ => quoted(timestamp(g)),
            },
            "kind" if !g.gen_bool(wild) => quoted(pick(g, &["retail", "wholesale", "x_y"]).into()),
            "kind" => quoted(
                pick(
                    g,
                    &[
                        "retail",
                        "wholesale",
                        "x_y",
                        "x\\u005fy",
                        "zzz",
                        "",
                        "retail,wholesale",
                    ],
                )
                .into(),
            ),
            "tags" => list(g, "string", depth),
            "nums" => list(g, "nullable long", depth),
            "nullable long" => {
                if g.gen_bool(0.2) {
                    "null".into()
                } else {
                    value(g, "long", depth)
                }
            }
            "nullable double" => {
                if g.gen_bool(0.2) {
                    "null".into()
                } else {
                    value(g, "double", depth)
                }
            }
            "grid" => list(g, "int list", depth),
            "int list" => list(g, "int", depth),
            "kinds" => list(g, "kind", depth),
            "attrs" => map(g, "long", depth),
            "weights" => map(g, "nullable double", depth),
            "lists" => map(g, "int list", depth),
            "addr" => object(
                g,
                &[
                    ("city", "string", true),
                    ("zip", "int", false),
                    ("geo", "geo", true),
                ],
                depth,
            ),
            "geo" => object(g, &[("lat", "double", true)], depth),
            "lines" => list(g, "line", depth),
            "line" => object(
                g,
                &[
                    ("sku", "string", true),
                    ("qty", "int", true),
                    ("unit", "money", false),
                    ("kind", "kind", false),
                ],
                depth,
            ),
            "must" => object(g, &[("x", "long", true)], depth),
            "nothing" => "null".into(),
            _ => unreachable!("{kind}"),
        }
    }

    fn list(g: &mut Gen, item: &str, depth: usize) -> String {
        let n = if depth > 3 { 0 } else { g.gen_range(0..4) };
        let items: Vec<String> = (0..n).map(|_| value(g, item, depth + 1)).collect();
        format!("[{}]", items.join(","))
    }

    fn map(g: &mut Gen, values: &str, depth: usize) -> String {
        let n = if depth > 3 { 0 } else { g.gen_range(0..5) };
        let entries: Vec<String> = (0..n)
            .map(|_| {
                let key = pick(g, &["a", "b", "c", "é", "\\u0062", "A", "", "aa"]);
                format!("\"{key}\":{}", value(g, values, depth + 1))
            })
            .collect();
        format!("{{{}}}", entries.join(","))
    }

    /// An object of `fields` (name, kind, whether it is required): some left out, some
    /// given twice, sometimes a field the schema does not have, in some order.
    fn object(g: &mut Gen, fields: &[(&str, &str, bool)], depth: usize) -> String {
        let mut entries: Vec<String> = Vec::new();
        for (name, kind, required) in fields {
            let leave_out = if *required { g.wild / 4.0 } else { 0.3 };
            if g.gen_bool(leave_out) {
                continue;
            }
            if g.rng.gen_bool(g.wild / 2.0) {
                entries.push(format!("\"{name}\":{}", value(g, kind, depth + 1)));
            }
            entries.push(format!("\"{name}\":{}", value(g, kind, depth + 1)));
        }
        if g.rng.gen_bool(g.wild / 4.0) {
            entries.push("\"extra\":1".into());
        }
        if g.gen_bool(0.2) {
            let k = entries.len();
            for i in (1..k).rev() {
                let j = g.gen_range(0..=i);
                entries.swap(i, j);
            }
        }
        let sep = if g.gen_bool(0.1) { " ,\n " } else { "," };
        format!("{{{}}}", entries.join(sep))
    }

    const FIELDS: &[(&str, &str, bool)] = &[
        ("id", "long", true),
        ("n", "int", false),
        ("ok", "boolean", false),
        ("f", "float", false),
        ("d", "double", false),
        ("s", "string", false),
        ("b", "bytes", false),
        ("amount", "dec12_2", false),
        ("huge", "dec50_10", false),
        ("whole", "dec5_0", false),
        ("day", "date", false),
        ("at", "timestamp", false),
        ("at_us", "timestamp", false),
        ("at_ns", "timestamp", false),
        ("local", "local", false),
        ("local_us", "local", false),
        ("local_ns", "local", false),
        ("tm", "time_ms", false),
        ("tmu", "time_us", false),
        ("uid", "string", false),
        ("kind", "kind", false),
        ("hash", "fixed4", false),
        ("price", "money", false),
        ("tags", "tags", false),
        ("nums", "nums", false),
        ("grid", "grid", false),
        ("kinds", "kinds", false),
        ("attrs", "attrs", false),
        ("weights", "weights", false),
        ("lists", "lists", false),
        ("addr", "addr", false),
        ("billing", "addr", false),
        ("lines", "lines", false),
        ("nothing", "nothing", false),
        ("must", "must", true),
    ];

    /// A record's text: an object of the schema's fields, sometimes broken.
    fn record(g: &mut Gen) -> Vec<u8> {
        let text = object(g, FIELDS, 0);
        let text = if g.gen_bool(0.1) {
            format!(" \t\n{text}\r\n")
        } else {
            text
        };
        let broken = if g.wild > 0.0 { 40 } else { 1_000_000 };
        match g.gen_range(0..broken) {
            // Cut anywhere, inside a character too.
            0 => return text.as_bytes()[..g.gen_range(0..text.len())].to_vec(),
            1 => format!("{text}{}", pick(g, &["x", "{}", "1", ",", "]"])),
            2 => {
                let at = g.gen_range(0..text.len());
                if text.is_char_boundary(at) {
                    format!(
                        "{}{}{}",
                        &text[..at],
                        pick(g, &["\u{1}", "\"", "\\", ",", "{", "\u{7f}"]),
                        &text[at..]
                    )
                } else {
                    text
                }
            }
            3 => pick(g, &["", "7", "[]", "null", "\"x\"", "{", "}", "{}{}"]).to_string(),
            _ => text,
        }
        .into_bytes()
    }

    /// Both decodings of `texts`, compared: the same records refused, the same rows.
    fn compare(texts: &[Vec<u8>]) {
        let schema = schema();
        let batch: Batch = texts
            .iter()
            .map(|t| Record::from_value(t.clone()))
            .collect();
        let format = ParquetFormat {
            schema: schema.clone(),
            compression: parquet::basic::Compression::SNAPPY,
        };
        let new = format.decode(&batch);
        let old = decode(&schema, &batch);
        let refused = |d: &Decoded| d.refused.iter().map(|(i, _)| *i).collect::<Vec<_>>();
        if refused(&new) != refused(&old) {
            let (n, o) = (refused(&new), refused(&old));
            for (i, text) in texts.iter().enumerate() {
                if n.contains(&i) != o.contains(&i) {
                    let why =
                        |d: &Decoded| d.refused.iter().find(|(j, _)| *j == i).map(|x| x.1.clone());
                    panic!(
                        "record {i} {}\n  now: {:?}\n  before: {:?}",
                        String::from_utf8_lossy(text),
                        why(&new),
                        why(&old)
                    );
                }
            }
        }
        for (_, why) in &new.refused {
            assert!(!why.is_empty());
        }
        match (&new.rows, &old.rows) {
            (Some(n), Some(o)) => {
                for (k, (a, b)) in n.columns().iter().zip(o.columns()).enumerate() {
                    if a != b {
                        let kept: Vec<usize> = (0..texts.len())
                            .filter(|i| !refused(&new).contains(i))
                            .collect();
                        for (row, i) in kept.iter().enumerate() {
                            if a.slice(row, 1) != b.slice(row, 1) {
                                panic!(
                                    "column {} of record {}: {}\n  now: {:?}\n  before: {:?}",
                                    schema.field(k).name(),
                                    i,
                                    String::from_utf8_lossy(&texts[*i]),
                                    a.slice(row, 1),
                                    b.slice(row, 1)
                                );
                            }
                        }
                        panic!("column {} differs", schema.field(k).name());
                    }
                }
                assert_eq!(n, o);
            }
            (None, None) => {}
            (n, o) => panic!("rows {:?} before {:?}", n.is_some(), o.is_some()),
        }
    }

    #[test]
    fn generated_records_decode_as_they_did() {
        let mut g = Gen {
            rng: SmallRng::seed_from_u64(20_261_207),
            wild: 0.0,
        };
        let mut accepted = 0;
        for round in 0..600 {
            g.wild = [0.0, 0.01, 0.03, 0.1, 0.3][round % 5];
            let texts: Vec<Vec<u8>> = (0..25).map(|_| record(&mut g)).collect();
            compare(&texts);
            let batch: Batch = texts
                .iter()
                .map(|t| Record::from_value(t.clone()))
                .collect();
            accepted += decode(&schema(), &batch).rows.map_or(0, |r| r.num_rows());
        }
        // The records are meant to be taken often enough to compare values.
        assert!(accepted > 1000, "{accepted} records taken");
    }

    #[test]
    fn text_that_is_not_one_json_object_is_refused_alike() {
        let base = r#"{"id":1,"must":{"x":2},"s":"a"}"#;
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        let texts: Vec<String> = vec![
            base.to_string(),
            base[..base.len() - 1].to_string(),
            format!("{base} x"),
            format!("{base}\n\n"),
            format!("{base}{base}"),
            r#"{"id":1,"must":{"x":2},"s":"a\u0000b"}"#.into(),
            r#"{"id":1,"must":{"x":2},"s":"\ud83d\ude00"}"#.into(),
            r#"{"id":1,"must":{"x":2},"s":"\ud83d"}"#.into(),
            r#"{"id":1,"must":{"x":2},"s":"\ude00\ud83d"}"#.into(),
            "{\"id\":1,\"must\":{\"x\":2},\"s\":\"a\u{1f}b\"}".into(),
            r#"{"id":1,"must":{"x":2},"id":2}"#.into(),
            r#"{"id":"no","must":{"x":2},"id":3}"#.into(),
            r#"{"id":3,"must":{"x":2},"id":"no"}"#.into(),
            format!(r#"{{"id":{},"must":{{"x":2}},"id":4}}"#, deep(126)),
            format!(r#"{{"id":{},"must":{{"x":2}},"id":4}}"#, deep(127)),
            format!(
                r#"{{"id":1,"must":{{"x":2}},"attrs":{{"a":{},"a":5}}}}"#,
                deep(125)
            ),
            format!(
                r#"{{"id":1,"must":{{"x":2}},"attrs":{{"a":{},"a":5}}}}"#,
                deep(126)
            ),
            format!(r#"{{"id":1,"must":{{"x":2}},"n":1{}}}"#, "0".repeat(400)),
            format!(r#"{{"id":1,"must":{{"x":2}},"d":1{}}}"#, "0".repeat(400)),
            format!(r#"{{"id":1,"must":{{"x":2}},"huge":1{}}}"#, "0".repeat(100)),
            format!(
                r#"{{"id":1,"must":{{"x":2}},"amount":"0.{}1"}}"#,
                "0".repeat(300)
            ),
            format!(
                r#"{{"id":1,"must":{{"x":2}},"amount":"0.{}"}}"#,
                "0".repeat(300)
            ),
            r#"{"id":1,"must":{"x":2},"d":1e-400}"#.into(),
            r#"{"id":1,"must":{"x":2},"d":-0.0}"#.into(),
            r#"{"id":1,"must":{"x":2},"billing":null,"addr":{"city":"x","geo":{"lat":1}}}"#.into(),
            r#"{"id":1,"must":{"x":2},"addr":{"city":"x","geo":null}}"#.into(),
            r#"{"id":1,"must":null}"#.into(),
            r#"{"id":1}"#.into(),
            r#"{"id":1,"must":{"x":2},"lines":[{"sku":"a","qty":1},null]}"#.into(),
            r#"{"id":1,"must":{"x":2},"nums":[1,null,3]}"#.into(),
            r#"{"id":1,"must":{"x":2},"tags":["a",null]}"#.into(),
            r#"{"id":1,"must":{"x":2},"weights":{"b":null,"a":1.5}}"#.into(),
            r#"{"id":1,"must":{"x":2},"nothing":1}"#.into(),
            r#"{"id":1,"must":{"x":2},"kind":"x\u005fy"}"#.into(),
            "{\"id\":1,\"must\":{\"x\":2},\"\\u0069d\":7}".into(),
            r#"{"id":1,"must":{"x":2},"nothing":null}"#.into(),
        ];
        let mut bytes: Vec<Vec<u8>> = texts.into_iter().map(String::into_bytes).collect();
        bytes.push(b"{\"id\":1,\"must\":{\"x\":2},\"s\":\"\xff\"}".to_vec());
        bytes.push(b"{\"id\":1,\"must\":{\"x\":2}}\xff".to_vec());
        for text in &bytes {
            compare(std::slice::from_ref(text));
        }
        compare(&bytes);
    }

    /// Where the two differ, on purpose: decimals Arrow's reading wrapped into
    /// another number (it counts digits in 8 bits and accumulates them unchecked).
    #[test]
    fn decimals_that_were_wrapped_are_now_exact_or_refused() {
        let schema = Arc::new(
            arrow_schema_of_text(
                r#"{"type":"record","name":"r","fields":[
                    {"name":"a","type":{"type":"bytes","logicalType":"decimal","precision":12,"scale":2}},
                    {"name":"w","type":{"type":"bytes","logicalType":"decimal","precision":38,"scale":0}}]}"#,
            )
            .unwrap(),
        );
        let format = ParquetFormat {
            schema: schema.clone(),
            compression: parquet::basic::Compression::SNAPPY,
        };
        let one = |text: String| -> Batch { vec![Record::from_value(text.into_bytes())] };
        // 10^254: before, 0; now refused, out of the column's range.
        let huge = one(format!(r#"{{"a":1{},"w":1}}"#, "0".repeat(254)));
        let before = decode(&schema, &huge);
        assert!(before.refused.is_empty());
        let now = format.decode(&huge);
        assert!(
            now.refused[0].1.contains("out of the column's range"),
            "{:?}",
            now.refused
        );
        // 38 ones then 4 zeros, e-4: 38 ones; before, the 42 digits wrapped first.
        let ones = "1".repeat(38);
        let wide = one(format!(r#"{{"a":1,"w":{ones}0000e-4}}"#));
        let before = decode(&schema, &wide).rows.unwrap();
        let now = format.decode(&wide).rows.unwrap();
        let value = |rows: &arrow_array::RecordBatch| {
            use arrow_array::cast::AsArray;
            rows.column(1)
                .as_primitive::<arrow_array::types::Decimal128Type>()
                .value(0)
        };
        assert_eq!(value(&now).to_string(), ones);
        assert_ne!(value(&before).to_string(), ones);
    }
}
