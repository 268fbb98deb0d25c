//! A batch placed into the part files it goes to: each record's folder
//! (`partition_by`) and, for Parquet, its rows, computed when the kit checks the batch
//! and kept for the `write` that follows.

use super::folders::Folders;
use super::parquet::Rows;
use super::partition::PartitionTemplate;
use super::section::{FileFormat, FileSinkConfig};
use crate::record::{Batch, Record};
use arrow_array::RecordBatch;
use std::collections::HashMap;

/// The records of one folder, in batch order.
#[derive(Debug)]
pub struct Group {
    /// The folder, relative to the sink's directory (empty: the directory itself).
    pub folder: String,
    /// The records' positions in the batch the kit hands `write` (the accepted ones).
    pub records: Vec<usize>,
    /// Their rows (Parquet).
    pub rows: Option<RecordBatch>,
}

/// A batch placed: its groups, in the order their folders first appear.
#[derive(Debug, Default)]
pub struct Placed {
    pub groups: Vec<Group>,
}

impl Placed {
    /// Places `batch`: returns the placement of the records that fit and the others,
    /// by index in `batch`, with why (no folder, or a value the format cannot hold).
    pub fn of(
        format: &FileFormat,
        partition: Option<&PartitionTemplate>,
        folders: &mut Folders,
        batch: &Batch,
    ) -> (Placed, Vec<(usize, String)>) {
        let Some(template) = partition else {
            let decoded = format.decode(batch);
            let accepted = batch.len() - decoded.refused.len();
            let group = Group {
                folder: String::new(),
                records: (0..accepted).collect(),
                rows: decoded.rows,
            };
            return (
                Placed {
                    groups: vec![group],
                },
                decoded.refused,
            );
        };
        let mut refused = Vec::new();
        // Each folder's records, with their rows decoded as they come (Parquet): a
        // record's text is read once for its folder's fields and once into its row.
        let mut order: Vec<(String, Vec<usize>, Option<Rows>)> = Vec::new();
        let mut at: HashMap<String, usize> = HashMap::new();
        for (i, r) in batch.iter().enumerate() {
            match folders.folder(template, r) {
                Ok(folder) => {
                    let g = match at.get(folder) {
                        Some(&g) => g,
                        None => {
                            at.insert(folder.to_string(), order.len());
                            order.push((folder.to_string(), Vec::new(), format.rows(0)));
                            order.len() - 1
                        }
                    };
                    let (_, members, rows) = &mut order[g];
                    members.push(i);
                    if let Some(rows) = rows {
                        rows.push(i, r);
                    }
                }
                Err(why) => refused.push((i, why)),
            }
        }
        let mut kept: Vec<(String, Vec<usize>, Option<RecordBatch>)> = Vec::new();
        for (folder, members, rows) in order {
            let decoded = rows.map(Rows::finish).unwrap_or_default();
            let mut out = decoded.refused.iter().map(|(i, _)| *i).peekable();
            let fit: Vec<usize> = members
                .into_iter()
                .filter(|i| out.next_if_eq(i).is_none())
                .collect();
            refused.extend(decoded.refused);
            if !fit.is_empty() {
                kept.push((folder, fit, decoded.rows));
            }
        }
        refused.sort_by_key(|(i, _)| *i);
        // Positions in the batch `write` gets: the refused ones taken out.
        let gone: Vec<usize> = refused.iter().map(|(i, _)| *i).collect();
        let position = |i: usize| i - gone.partition_point(|&g| g < i);
        let groups = kept
            .into_iter()
            .map(|(folder, fit, rows)| Group {
                folder,
                records: fit.into_iter().map(position).collect(),
                rows,
            })
            .collect();
        (Placed { groups }, refused)
    }
}

/// The placement [`crate::kits::TwoPhaseWriter::check_batch`] made of a batch, kept
/// for the `write` of its accepted records that follows, and the folders made so far.
#[derive(Debug, Default)]
pub struct Checked(Option<Placed>, Folders);

impl Checked {
    /// Places `batch` as `cfg` says ([`Placed::of`]) and keeps the placement; returns
    /// the records refused, by index in `batch`, with why.
    pub fn check(&mut self, cfg: &FileSinkConfig, batch: &Batch) -> Vec<(usize, String)> {
        let (placed, refused) = Placed::of(&cfg.format, cfg.partition.as_ref(), &mut self.1, batch);
        self.0 = Some(placed);
        refused
    }

    /// The placement kept from the last check, to refine (refuse more of its records).
    pub fn placed_mut(&mut self) -> Option<&mut Placed> {
        self.0.as_mut()
    }

    /// The placement of `batch`, the accepted records of the batch last checked: the
    /// one kept, or one made now when no batch was checked (all of `batch` placed).
    pub fn take(&mut self, cfg: &FileSinkConfig, batch: &Batch) -> Placed {
        match self.0.take() {
            Some(p) => p,
            None => Placed::of(&cfg.format, cfg.partition.as_ref(), &mut self.1, batch).0,
        }
    }
}

/// The records of `group` in `batch` (the accepted batch `write` got).
pub fn records<'a>(batch: &'a Batch, group: &'a Group) -> impl Iterator<Item = &'a Record> + 'a {
    group.records.iter().map(move |&i| &batch[i])
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn batch(values: &[&str]) -> Batch {
        values
            .iter()
            .map(|v| Record {
                value: Bytes::from(v.to_string()),
                ..Record::default()
            })
            .collect()
    }

    #[test]
    fn records_are_grouped_by_folder_in_order_and_positions_skip_the_refused() {
        let t = PartitionTemplate::parse("c={/c}", None).unwrap();
        let b = batch(&[
            r#"{"c":"a","n":0}"#,
            r#"{"c":{}}"#,
            r#"{"c":"b","n":2}"#,
            r#"{"c":"a","n":3}"#,
        ]);
        let (placed, refused) =
            Placed::of(&FileFormat::Json, Some(&t), &mut Folders::default(), &b);
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].0, 1);
        let accepted: Batch = b
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 1)
            .map(|(_, r)| r.clone())
            .collect();
        let seen: Vec<(String, Vec<String>)> = placed
            .groups
            .iter()
            .map(|g| {
                (
                    g.folder.clone(),
                    records(&accepted, g)
                        .map(|r| String::from_utf8_lossy(&r.value).into_owned())
                        .collect(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            vec![
                (
                    "c=a".to_string(),
                    vec![
                        r#"{"c":"a","n":0}"#.to_string(),
                        r#"{"c":"a","n":3}"#.to_string()
                    ]
                ),
                ("c=b".to_string(), vec![r#"{"c":"b","n":2}"#.to_string()]),
            ]
        );
    }

    #[test]
    fn rows_refused_by_the_format_are_refused_by_their_index_in_the_batch() {
        let schema = r#"{"type":"record","name":"r","fields":[{"name":"c","type":"string"},{"name":"n","type":"long"}]}"#;
        let format = FileFormat::Parquet(crate::formats::columnar::parquet::ParquetFormat {
            schema: std::sync::Arc::new(
                crate::formats::columnar::avro_arrow::arrow_schema_of_text(schema).unwrap(),
            ),
            compression: parquet::basic::Compression::UNCOMPRESSED,
        });
        let t = PartitionTemplate::parse("c={/c}", None).unwrap();
        let b = batch(&[
            r#"{"c":"a","n":0}"#,
            r#"{"c":"b","n":"x"}"#,
            r#"{"c":"b","n":2}"#,
            r#"{"c":"a","n":1.5}"#,
            r#"{"c":"a","n":4}"#,
        ]);
        let (placed, refused) = Placed::of(&format, Some(&t), &mut Folders::default(), &b);
        let idx: Vec<usize> = refused.iter().map(|(i, _)| *i).collect();
        assert_eq!(idx, vec![1, 3]);
        let shape: Vec<(&str, &[usize], usize)> = placed
            .groups
            .iter()
            .map(|g| {
                (
                    g.folder.as_str(),
                    g.records.as_slice(),
                    g.rows.as_ref().map_or(0, |r| r.num_rows()),
                )
            })
            .collect();
        // Accepted batch: [a0, b2, a4] at positions 0, 1, 2.
        assert_eq!(shape, vec![("c=a", &[0, 2][..], 2), ("c=b", &[1][..], 1)]);
    }
}
