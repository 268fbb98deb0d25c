//! Verifies what a `sequence -> [rolling_sum] -> file` job committed: every input record
//! exactly once, nothing extra, and (with rolling_sum) every running total right.
//!
//! Running totals are deterministic because the sequence source emits all records of a
//! key from one split, in order: the expected total of record `i` is the sum of the
//! values of its key's records up to `i`.

use crate::connectors::file_sink::{parse_part_name, PartName};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

/// What [`verify`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verification {
    pub expected: u64,
    pub committed: u64,
    /// Sequence numbers never committed (the first few).
    pub missing: Vec<i64>,
    pub missing_count: u64,
    /// Sequence numbers committed more than once (the first few).
    pub duplicated: Vec<i64>,
    pub duplicated_count: u64,
    /// Records whose content or running total is wrong (the first few, described).
    pub wrong: Vec<String>,
    pub wrong_count: u64,
    pub part_files: u64,
}

impl Verification {
    /// Nothing missing, duplicated or wrong.
    pub fn is_exact(&self) -> bool {
        self.missing_count == 0 && self.duplicated_count == 0 && self.wrong_count == 0
    }
}

const SAMPLE: usize = 10;

/// Reads every committed part file of `dir` and checks it against the sequence
/// `from..=to` with `keys` keys. `total` is the rolling_sum output pointer, if any.
pub fn verify(
    dir: &Path,
    from: i64,
    to: i64,
    keys: u32,
    total: Option<&str>,
) -> std::io::Result<Verification> {
    let mut records = Vec::new();
    let mut part_files = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !matches!(parse_part_name(&name), Some(PartName::Committed { .. })) {
            continue;
        }
        part_files += 1;
        let text = std::fs::read_to_string(entry.path())?;
        records.extend(text.lines().map(|l| (name.clone(), l.to_string())));
    }
    let mut v = verify_records(records, from, to, keys, total);
    v.part_files = part_files;
    Ok(v)
}

/// Checks records (where each was found, its JSON text) against the sequence
/// `from..=to` with `keys` keys: every record exactly once, with its content and (when
/// `total` names the rolling_sum output) its running total.
pub fn verify_records(
    records: impl IntoIterator<Item = (String, String)>,
    from: i64,
    to: i64,
    keys: u32,
    total: Option<&str>,
) -> Verification {
    let n = (to - from + 1) as usize;
    let mut seen = vec![0u32; n];
    let mut v = Verification {
        expected: n as u64,
        ..Default::default()
    };
    let wrong = |v: &mut Verification, what: String| {
        v.wrong_count += 1;
        if v.wrong.len() < SAMPLE {
            v.wrong.push(what);
        }
    };
    // Expected running totals: sum over i' <= i with i' = i (mod keys), i' >= from.
    let k = i64::from(keys);
    let mut acc: HashMap<i64, i64> = HashMap::new();
    let mut expected_total = vec![0i64; n];
    for i in from..=to {
        let e = acc.entry(i.rem_euclid(k)).or_insert(0);
        *e += i;
        expected_total[(i - from) as usize] = *e;
    }
    for (name, line) in records {
        let line = line.as_str();
        {
            v.committed += 1;
            let doc: Value = match serde_json::from_str(line) {
                Ok(d) => d,
                Err(e) => {
                    wrong(&mut v, format!("{name}: unparsable line {line:?}: {e}"));
                    continue;
                }
            };
            let Some(seq) = doc
                .get("seq")
                .and_then(Value::as_i64)
                .filter(|s| (from..=to).contains(s))
            else {
                wrong(
                    &mut v,
                    format!("{name}: record outside the sequence: {line}"),
                );
                continue;
            };
            let idx = (seq - from) as usize;
            seen[idx] += 1;
            if doc.get("key").and_then(Value::as_i64) != Some(seq.rem_euclid(k))
                || doc.get("value").and_then(Value::as_i64) != Some(seq)
            {
                wrong(
                    &mut v,
                    format!("{name}: wrong content for seq {seq}: {line}"),
                );
            }
            if let Some(ptr) = total {
                let got = doc.pointer(ptr).and_then(Value::as_i64);
                if got != Some(expected_total[idx]) {
                    wrong(
                        &mut v,
                        format!(
                            "{name}: seq {seq}: total {got:?}, expected {}",
                            expected_total[idx]
                        ),
                    );
                }
            }
        }
    }
    for (idx, &count) in seen.iter().enumerate() {
        let seq = from + idx as i64;
        if count == 0 {
            v.missing_count += 1;
            if v.missing.len() < SAMPLE {
                v.missing.push(seq);
            }
        } else if count > 1 {
            v.duplicated_count += u64::from(count - 1);
            if v.duplicated.len() < SAMPLE {
                v.duplicated.push(seq);
            }
        }
    }
    v
}
