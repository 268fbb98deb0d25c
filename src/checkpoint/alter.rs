//! `lockgate checkpoints alter`: which source positions a checkpoint gets instead of
//! its own, decided over data (the positions, the requested changes, and each
//! partition's offsets on the cluster) before anything is written.

use lockgate_state::{NextOffset, SourcePosition};
use std::collections::BTreeMap;

/// One `--set-offset TOPIC:PARTITION=OFFSET`: split `partition` of `topic` continues
/// at `offset` (the next record read is the one at `offset`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetOffset {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

impl std::str::FromStr for SetOffset {
    type Err = String;

    /// Parses `TOPIC:PARTITION=OFFSET`. A Kafka topic name has no `:` or `=`, so the
    /// last `:` before the `=` separates the partition.
    fn from_str(s: &str) -> Result<SetOffset, String> {
        let bad = || format!("`{s}` is not TOPIC:PARTITION=OFFSET (orders:3=1200)");
        let (split, offset) = s.split_once('=').ok_or_else(bad)?;
        let (topic, partition) = split.rsplit_once(':').ok_or_else(bad)?;
        if topic.is_empty() {
            return Err(bad());
        }
        let partition: i32 = partition.trim().parse().map_err(|_| bad())?;
        let offset: i64 = offset.trim().parse().map_err(|_| bad())?;
        if partition < 0 || offset < 0 {
            return Err(format!("`{s}`: partitions and offsets are not negative"));
        }
        Ok(SetOffset {
            topic: topic.to_string(),
            partition,
            offset,
        })
    }
}

/// The offsets a partition holds now: `earliest` is the first one still kept, `end`
/// the next one to be written (Kafka's low and high watermarks), and the id of its
/// topic when the cluster tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionRange {
    pub earliest: i64,
    pub end: i64,
    pub topic_id: Option<[u8; 16]>,
}

/// One position that changes, for the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    pub topic: String,
    pub partition: i32,
    pub from: i64,
    pub to: i64,
}

impl std::fmt::Display for Moved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = (self.to - self.from).unsigned_abs();
        let s = if n == 1 { "" } else { "s" };
        write!(
            f,
            "{}:{} {} -> {}: ",
            self.topic, self.partition, self.from, self.to
        )?;
        match self.to.cmp(&self.from) {
            std::cmp::Ordering::Greater => write!(
                f,
                "skips {n} record{s} (offsets {}..={})",
                self.from,
                self.to - 1
            ),
            std::cmp::Ordering::Less => write!(
                f,
                "reads {n} record{s} again (offsets {}..={})",
                self.to,
                self.from - 1
            ),
            std::cmp::Ordering::Equal => write!(f, "unchanged"),
        }
    }
}

/// Refuses a change of a split whose position is opaque (not an offset), naming it.
pub fn refuse_opaque(positions: &[SourcePosition], changes: &[SetOffset]) -> Result<(), String> {
    match changes.iter().find(|c| {
        positions
            .iter()
            .any(|p| p.stream == c.topic && p.partition == c.partition && p.opaque.is_some())
    }) {
        Some(c) => Err(format!(
            "alter sets offsets; split {}:{} has an opaque position",
            c.topic, c.partition
        )),
        None => Ok(()),
    }
}

/// The positions with `changes` applied, and what moved. Refuses (naming the change):
/// a partition the checkpoint does not hold (its job never read it, or another member
/// does); two changes of one partition; an offset before the partition's earliest
/// kept offset or after its end; an offset after a bounded split's end; a partition
/// whose range is unknown; a topic that is not the checkpoint's any more (another
/// topic id: deleted and created again, its offsets start over) or whose id the
/// cluster did not tell when the checkpoint knows it; and a move back on a
/// split with upstream marks (`origin_headers`), whose records at or below the marks
/// would be taken for the upstream stage's duplicates and dropped, not read again;
/// and a split whose position is opaque ([`refuse_opaque`]).
pub fn apply(
    positions: &[SourcePosition],
    changes: &[SetOffset],
    ranges: &BTreeMap<(String, i32), PartitionRange>,
) -> Result<(Vec<SourcePosition>, Vec<Moved>), String> {
    refuse_opaque(positions, changes)?;
    let mut out = positions.to_vec();
    let mut moved = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for c in changes {
        let name = format!("{}:{}", c.topic, c.partition);
        if !seen.insert((c.topic.as_str(), c.partition)) {
            return Err(format!("{name} is set twice"));
        }
        let Some(p) = out
            .iter_mut()
            .find(|p| p.stream == c.topic && p.partition == c.partition)
        else {
            let held: Vec<String> = positions
                .iter()
                .map(|p| format!("{}:{}", p.stream, p.partition))
                .collect();
            return Err(format!(
                "the checkpoint holds no position of {name} (it holds {})",
                if held.is_empty() {
                    "none".into()
                } else {
                    held.join(", ")
                }
            ));
        };
        let range = ranges
            .get(&(c.topic.clone(), c.partition))
            .ok_or_else(|| format!("{name}: the cluster did not report its offsets"))?;
        // The topic first: another topic's offsets say nothing about this one's.
        match (p.stream_id, range.topic_id) {
            (Some(was), Some(now)) if was != now => {
                return Err(format!(
                    "{name}: the cluster's topic `{}` is not the checkpoint's (another topic id: it was deleted and created again, and its offsets start over)",
                    c.topic
                ))
            }
            (Some(_), None) => {
                return Err(format!(
                    "{name}: the cluster did not tell the id of topic `{}`, so whether it is still the checkpoint's topic cannot be checked",
                    c.topic
                ))
            }
            _ => {}
        }
        if c.offset > range.end {
            return Err(format!(
                "{name}={}: beyond the partition's end ({}, the next offset to be written)",
                c.offset, range.end
            ));
        }
        if c.offset < range.earliest {
            return Err(format!(
                "{name}={}: before the partition's earliest kept offset ({}); those records were deleted",
                c.offset, range.earliest
            ));
        }
        if c.offset < p.next.0 && !p.applied.is_empty() {
            return Err(format!(
                "{name}={}: moving back a partition read with origin_headers reads nothing again: its records up to the checkpoint's upstream marks count as applied",
                c.offset
            ));
        }
        if let Some(end) = p.end.filter(|e| c.offset > e.0) {
            return Err(format!(
                "{name}={}: beyond the bounded run's end of this partition ({})",
                c.offset, end.0
            ));
        }
        moved.push(Moved {
            topic: c.topic.clone(),
            partition: c.partition,
            from: p.next.0,
            to: c.offset,
        });
        p.next = NextOffset(c.offset);
    }
    Ok((out, moved))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn positions() -> Vec<SourcePosition> {
        let mut known = SourcePosition::new("orders", 0, NextOffset(120));
        known.stream_id = Some([7; 16]);
        vec![
            known,
            SourcePosition::new("orders", 1, NextOffset(40)).with_end(Some(NextOffset(90))),
        ]
    }

    fn ranges() -> BTreeMap<(String, i32), PartitionRange> {
        [
            (
                ("orders".to_string(), 0),
                PartitionRange {
                    earliest: 10,
                    end: 500,
                    topic_id: Some([7; 16]),
                },
            ),
            (
                ("orders".to_string(), 1),
                PartitionRange {
                    earliest: 0,
                    end: 100,
                    topic_id: None,
                },
            ),
        ]
        .into()
    }

    fn set(s: &str) -> SetOffset {
        s.parse().unwrap()
    }

    #[test]
    fn specs_parse_by_the_last_colon_before_the_equals_sign() {
        assert_eq!(
            set("orders.v2-eu:3=1200"),
            SetOffset {
                topic: "orders.v2-eu".into(),
                partition: 3,
                offset: 1200
            }
        );
        for bad in [
            "orders=3",
            "orders:x=1",
            ":1=2",
            "orders:1=",
            "orders:-1=5",
            "orders:1=-5",
        ] {
            assert!(bad.parse::<SetOffset>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_split_with_an_opaque_position_is_refused_by_name() {
        let mut held = positions();
        held.push(SourcePosition::opaque(
            "shards",
            0,
            lockgate_state::OpaquePosition::new(*b"12").unwrap(),
        ));
        let err = apply(&held, &[set("orders:0=121"), set("shards:0=5")], &ranges()).unwrap_err();
        assert_eq!(
            err,
            "alter sets offsets; split shards:0 has an opaque position"
        );
        assert!(apply(&held, &[set("orders:0=121")], &ranges()).is_ok());
    }

    #[test]
    fn a_change_moves_only_its_partition_and_says_what_it_skips() {
        let (out, moved) = apply(&positions(), &[set("orders:0=121")], &ranges()).unwrap();
        assert_eq!(out[0].next, NextOffset(121));
        assert_eq!(
            out[1],
            positions()[1],
            "the other partition keeps everything"
        );
        assert_eq!(
            moved[0].to_string(),
            "orders:0 120 -> 121: skips 1 record (offsets 120..=120)"
        );
        let (_, back) = apply(&positions(), &[set("orders:0=100")], &ranges()).unwrap();
        assert_eq!(
            back[0].to_string(),
            "orders:0 120 -> 100: reads 20 records again (offsets 100..=119)"
        );
    }

    #[test]
    fn offsets_outside_the_partition_or_unknown_partitions_are_refused() {
        let refuse = |c: &str| apply(&positions(), &[set(c)], &ranges()).unwrap_err();
        assert!(refuse("orders:0=501").contains("beyond the partition's end (500"));
        // The end itself is allowed: the split waits for the next record.
        assert!(apply(&positions(), &[set("orders:0=500")], &ranges()).is_ok());
        assert!(refuse("orders:0=9").contains("before the partition's earliest kept offset (10)"));
        assert!(refuse("orders:1=95").contains("bounded run's end of this partition (90)"));
        assert!(refuse("orders:7=1").contains("holds no position of orders:7"));
        assert!(refuse("payments:0=1").contains("it holds orders:0, orders:1"));
        let twice = apply(
            &positions(),
            &[set("orders:0=130"), set("orders:0=131")],
            &ranges(),
        );
        assert!(twice.unwrap_err().contains("set twice"));
        let unknown = apply(&positions(), &[set("orders:0=130")], &BTreeMap::new());
        assert!(unknown.unwrap_err().contains("did not report its offsets"));
    }

    #[test]
    fn a_recreated_topic_and_a_move_back_under_upstream_marks_are_refused() {
        let mut other = ranges();
        other.get_mut(&("orders".to_string(), 0)).unwrap().topic_id = Some([8; 16]);
        let e = apply(&positions(), &[set("orders:0=9999")], &other).unwrap_err();
        assert!(
            e.contains("not the checkpoint's"),
            "the topic before the range: {e}"
        );
        other.get_mut(&("orders".to_string(), 0)).unwrap().topic_id = None;
        let e = apply(&positions(), &[set("orders:0=130")], &other).unwrap_err();
        assert!(e.contains("did not tell the id"), "{e}");
        let mut marked = positions();
        marked[0].applied = vec![lockgate_state::UpstreamMark {
            stream: "raw".into(),
            partition: 0,
            offset: 9,
        }];
        let e = apply(&marked, &[set("orders:0=100")], &ranges()).unwrap_err();
        assert!(e.contains("origin_headers"), "{e}");
        assert!(
            apply(&marked, &[set("orders:0=121")], &ranges()).is_ok(),
            "forward is fine"
        );
    }
}
