//! The folders of a subtask's records, made once per distinct field text: a record
//! whose fields read as one before goes to that record's folder without its fields
//! being parsed, rendered and escaped again.
//!
//! A folder is a function of the text of the top-level fields its template reads
//! ([`PartitionTemplate::tops`]) when the value is one JSON object, the record is not a
//! delete and the template does not read the record's timestamp: only such records
//! are looked up, keyed by those texts (a number by its text, as the folder takes
//! it), when together they are short ([`MAX_KEY`]). Every other record, and every record whose folder is an error, is placed by
//! [`PartitionTemplate::folder`] itself.

use super::partition::PartitionTemplate;
use crate::formats::columnar::json_text::top_level_values;
use crate::record::{Op, Record};
use hashbrown::hash_map::EntryRef;
use hashbrown::HashMap;

/// Distinct field texts kept at most; past it the kept folders are forgotten (a
/// template over a field of many values, such as a time to the second, gains little).
const KEPT: usize = 4096;

/// The longest field text looked up, in bytes: a template pointing into a large
/// top-level value (`{/payload/date}`) would otherwise keep copies of it, so such
/// records are placed by the template alone. What the kept folders hold is bounded
/// by `KEPT` times this.
const MAX_KEY: usize = 512;

/// Folders made, by the text of the fields they were made from.
#[derive(Debug, Default)]
pub struct Folders {
    made: HashMap<Box<[u8]>, String>,
    /// The key being looked up (reused, so that a hit allocates nothing).
    key: Vec<u8>,
    /// The folder of the last record not looked up.
    scratch: String,
}

impl Folders {
    /// The folder of `record` under `template`, as [`PartitionTemplate::folder`] gives it.
    pub fn folder(
        &mut self,
        template: &PartitionTemplate,
        record: &Record,
    ) -> Result<&str, String> {
        if !self.key_of(template, record) {
            self.scratch = template.folder(record)?;
            return Ok(&self.scratch);
        }
        if self.made.len() >= KEPT && !self.made.contains_key(self.key.as_slice()) {
            self.made.clear();
        }
        match self.made.entry_ref(self.key.as_slice()) {
            EntryRef::Occupied(e) => Ok(e.into_mut().as_str()),
            EntryRef::Vacant(e) => Ok(e.insert(template.folder(record)?).as_str()),
        }
    }

    /// Makes `self.key` the text of `record`'s fields; false when its folder is not a
    /// function of them alone.
    fn key_of(&mut self, template: &PartitionTemplate, record: &Record) -> bool {
        if !template.reads_fields()
            || template.reads_timestamp()
            || record.tombstone
            || record.op == Op::Delete
        {
            return false;
        }
        let Some(found) = top_level_values(&record.value, template.tops()) else {
            return false;
        };
        let long: usize = found.iter().map(|t| t.map_or(1, |t| 9 + t.len())).sum();
        if long > MAX_KEY {
            return false;
        }
        self.key.clear();
        for text in found {
            match text {
                // Lengths first: no two lists of texts make one key.
                Some(t) => {
                    self.key.push(1);
                    self.key.extend_from_slice(&(t.len() as u64).to_le_bytes());
                    self.key.extend_from_slice(t);
                }
                None => self.key.push(0),
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(value: &str) -> Record {
        Record::from_value(value.as_bytes().to_vec())
    }

    #[test]
    fn a_kept_folder_is_the_one_the_template_makes() {
        let t = PartitionTemplate::parse("c={/c}/n={/n}/d={/t:%Y}", None).unwrap();
        let mut folders = Folders::default();
        let values = [
            r#"{"c":"a","n":1,"t":0}"#,
            r#"{"n":1,"c":"a","t":0,"x":[1,2]}"#,
            r#"{"c":"a","n":1.0,"t":0}"#,
            r#"{"c":"a/b","n":1,"t":0}"#,
            r#"{"c":"a","t":0}"#,
            r#"{"c":null,"n":1,"t":0}"#,
            r#"{"c":"a","n":1,"t":31536000000}"#,
            r#"{"c":"a","n":1,"t":"1971-01-01"}"#,
            r#"{"c":"a","n":1,"t":0}"#,
        ];
        for _ in 0..2 {
            for v in values {
                let r = record(v);
                assert_eq!(
                    folders.folder(&t, &r).map(str::to_string),
                    t.folder(&r),
                    "{v}"
                );
            }
        }
        assert_eq!(
            folders.made.len(),
            values.len() - 2,
            "one per distinct text"
        );
    }

    #[test]
    fn records_whose_folder_is_not_their_fields_alone_are_placed_by_the_template() {
        let t = PartitionTemplate::parse("c={/c}", None).unwrap();
        let mut folders = Folders::default();
        let mut delete = record(r#"{"c":"old"}"#);
        delete.op = Op::Delete;
        let refused = record(r#"{"c":{"nested":1}}"#);
        assert_eq!(folders.folder(&t, &delete).unwrap(), "c=old");
        assert!(folders.folder(&t, &refused).is_err());
        // Not an object: its folder is the template's (the default partition).
        let array = record("[1]");
        assert_eq!(
            folders.folder(&t, &array).map(str::to_string),
            t.folder(&array)
        );
        assert!(folders.made.is_empty(), "nothing kept");
        let timed = PartitionTemplate::parse("h={timestamp:%H}/c={/c}", None).unwrap();
        let mut r = record(r#"{"c":"x"}"#);
        for (ms, hour) in [(0, "00"), (3_600_000, "01")] {
            r.timestamp = Some(ms);
            assert_eq!(folders.folder(&timed, &r).unwrap(), format!("h={hour}/c=x"));
        }
        assert!(folders.made.is_empty(), "a timestamp is not a field");
    }

    #[test]
    fn past_the_bound_the_kept_folders_are_forgotten() {
        let t = PartitionTemplate::parse("c={/c}", None).unwrap();
        let mut folders = Folders::default();
        for i in 0..KEPT + 10 {
            let r = record(&format!(r#"{{"c":{i}}}"#));
            assert_eq!(folders.folder(&t, &r).unwrap(), format!("c={i}"));
        }
        assert!(folders.made.len() <= KEPT);
    }

    #[test]
    fn a_large_field_is_placed_by_the_template_and_not_kept() {
        let t = PartitionTemplate::parse("d={/payload/day}", None).unwrap();
        let mut folders = Folders::default();
        let big = format!(
            r#"{{"payload":{{"pad":"{}","day":"x"}}}}"#,
            "p".repeat(MAX_KEY)
        );
        assert_eq!(folders.folder(&t, &record(&big)).unwrap(), "d=x");
        assert!(folders.made.is_empty());
        let small = record(r#"{"payload":{"day":"x"}}"#);
        assert_eq!(folders.folder(&t, &small).unwrap(), "d=x");
        assert_eq!(folders.made.len(), 1);
    }
}
