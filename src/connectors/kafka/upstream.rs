//! A repartition stage through Kafka, without Kafka transactions.
//!
//! The upstream job writes each record to an internal topic with a lockgate Kafka sink
//! (`[sink.kafka]`), keyed by the new key and carrying where it was read in three
//! headers ([`TOPIC`], [`PARTITION`], [`OFFSET`]: the same names as a dead letter's).
//! After a crash the upstream job replays from its last checkpoint and writes some
//! records again. The downstream job reads the internal topic with
//! `origin_headers = true`: for each split (internal partition) it keeps the highest
//! upstream offset it has applied from each upstream split ([`Marks`]), in its
//! checkpoint with the split's position, and drops a record at or below that mark.
//!
//! This is exact because of what the upstream side guarantees, in this order:
//! - one producer writes all the records of an upstream split (the sink is chained to
//!   the source subtask that reads the split: no keyed exchange comes before it), in
//!   the order they were read, and the producer is idempotent, so within one run each
//!   internal partition receives, from each upstream split, an increasing run of
//!   offsets without gaps other than records keyed elsewhere;
//! - a checkpoint of the upstream job completes only once every record before its
//!   barrier is acknowledged, so a replay starts at or before the first record whose
//!   write may have been lost: everything above the mark that a crash cut off is
//!   written again, and everything at or below it is a duplicate.

use lockgate_state::UpstreamMark;
use std::collections::BTreeMap;

/// The header that names the upstream topic (the same as a dead letter's).
pub const TOPIC: &str = "lockgate.topic";
/// The header with the upstream partition, in decimal.
pub const PARTITION: &str = "lockgate.partition";
/// The header with the upstream offset, in decimal.
pub const OFFSET: &str = "lockgate.offset";

/// Where a record of an internal topic was read upstream, as its headers say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coordinates<'a> {
    pub stream: &'a str,
    pub partition: i32,
    pub offset: i64,
}

/// Parses the three headers (each the last of its name). An error names the header
/// that is missing or malformed: such a record is a decode error of the source.
pub fn parse<'a>(
    topic: Option<&'a [u8]>,
    partition: Option<&'a [u8]>,
    offset: Option<&'a [u8]>,
) -> Result<Coordinates<'a>, String> {
    let text = |name: &str, v: Option<&'a [u8]>| -> Result<&'a str, String> {
        let v = v.ok_or_else(|| {
            format!("no {name} header (origin_headers reads a topic written by [sink.kafka])")
        })?;
        std::str::from_utf8(v).map_err(|_| format!("the {name} header is not UTF-8"))
    };
    let stream = text(TOPIC, topic)?;
    if stream.is_empty() {
        return Err(format!("the {TOPIC} header is empty"));
    }
    let partition = text(PARTITION, partition)?;
    let partition: i32 = partition
        .parse()
        .ok()
        .filter(|p| *p >= 0)
        .ok_or_else(|| format!("the {PARTITION} header `{partition}` is not a partition"))?;
    let offset = text(OFFSET, offset)?;
    let offset: i64 = offset
        .parse()
        .ok()
        .filter(|o| *o >= 0)
        .ok_or_else(|| format!("the {OFFSET} header `{offset}` is not an offset"))?;
    Ok(Coordinates {
        stream,
        partition,
        offset,
    })
}

/// The highest upstream offset applied from each upstream split, for one downstream
/// split.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Marks(BTreeMap<String, BTreeMap<i32, i64>>);

impl Marks {
    /// The marks a checkpoint kept for a split.
    pub fn from_applied(applied: &[UpstreamMark]) -> Marks {
        let mut m = Marks::default();
        for a in applied {
            let e =
                m.0.entry(a.stream.clone())
                    .or_default()
                    .entry(a.partition)
                    .or_insert(a.offset);
            *e = (*e).max(a.offset);
        }
        m
    }

    /// The marks to keep in a checkpoint, sorted by stream and partition.
    pub fn applied(&self) -> Vec<UpstreamMark> {
        self.0
            .iter()
            .flat_map(|(stream, parts)| {
                parts.iter().map(|(p, o)| UpstreamMark {
                    stream: stream.clone(),
                    partition: *p,
                    offset: *o,
                })
            })
            .collect()
    }

    /// Whether the record at `c` is new: above the mark of its upstream split (which
    /// it then raises). False for a duplicate of the upstream stage's replay.
    pub fn admit(&mut self, c: Coordinates<'_>) -> bool {
        // The upstream topics are few: a lookup by `&str` finds the stream without
        // allocating; only a stream's first record allocates its name.
        let parts = match self.0.get_mut(c.stream) {
            Some(p) => p,
            None => self.0.entry(c.stream.to_string()).or_default(),
        };
        match parts.get_mut(&c.partition) {
            Some(mark) if c.offset <= *mark => false,
            Some(mark) => {
                *mark = c.offset;
                true
            }
            None => {
                parts.insert(c.partition, c.offset);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(stream: &str, partition: i32, offset: i64) -> Coordinates<'_> {
        Coordinates {
            stream,
            partition,
            offset,
        }
    }

    #[test]
    fn parses_the_three_headers_and_names_what_is_wrong() {
        assert_eq!(
            parse(Some(b"orders"), Some(b"3"), Some(b"17")),
            Ok(at("orders", 3, 17))
        );
        type Headers<'a> = (Option<&'a [u8]>, Option<&'a [u8]>, Option<&'a [u8]>);
        let cases: [(Headers, &str); 6] = [
            ((None, Some(b"3"), Some(b"1")), "no lockgate.topic header"),
            (
                (Some(b""), Some(b"3"), Some(b"1")),
                "lockgate.topic header is empty",
            ),
            (
                (Some(b"o"), None, Some(b"1")),
                "no lockgate.partition header",
            ),
            (
                (Some(b"o"), Some(b"-1"), Some(b"1")),
                "lockgate.partition header `-1`",
            ),
            (
                (Some(b"o"), Some(b"3"), Some(b"x")),
                "lockgate.offset header `x`",
            ),
            (
                (Some(&[0xff]), Some(b"3"), Some(b"1")),
                "lockgate.topic header is not UTF-8",
            ),
        ];
        for ((t, p, o), want) in cases {
            let e = parse(t, p, o).unwrap_err();
            assert!(e.contains(want), "{e} should say {want}");
        }
    }

    #[test]
    fn a_replay_is_dropped_up_to_the_mark_and_new_records_pass() {
        let mut m = Marks::default();
        assert!(m.admit(at("a", 0, 5)));
        assert!(m.admit(at("a", 0, 9)));
        assert!(
            m.admit(at("a", 1, 2)),
            "another upstream split has its own mark"
        );
        assert!(m.admit(at("b", 0, 1)), "another upstream topic too");
        // The upstream stage crashed and replays from 4.
        assert!(!m.admit(at("a", 0, 4)));
        assert!(!m.admit(at("a", 0, 9)), "the mark itself was applied");
        assert!(m.admit(at("a", 0, 10)));
        assert_eq!(
            m.applied(),
            vec![
                UpstreamMark {
                    stream: "a".into(),
                    partition: 0,
                    offset: 10
                },
                UpstreamMark {
                    stream: "a".into(),
                    partition: 1,
                    offset: 2
                },
                UpstreamMark {
                    stream: "b".into(),
                    partition: 0,
                    offset: 1
                },
            ]
        );
        assert_eq!(Marks::from_applied(&m.applied()), m);
    }

    proptest! {
        /// Any sequence of upstream runs, each replaying from any point at or before
        /// where the previous one's acknowledged writes end (the upstream checkpoint),
        /// and each cut off anywhere (a crash), is admitted as each offset exactly once,
        /// in order. Also across a checkpoint of the marks taken at any record.
        #[test]
        fn replays_are_admitted_exactly_once(
            cuts in prop::collection::vec((0usize..40, 0usize..40), 1..6),
            snapshot_at in 0usize..200,
        ) {
            // One upstream split with offsets 0..40; the downstream split sees, per run,
            // offsets start..stop; the next run starts at or before stop.
            let mut seen = Vec::new();
            let mut m = Marks::default();
            let mut start = 0usize;
            let mut delivered = 0usize;
            let mut count = 0usize;
            for (i, (back, len)) in cuts.iter().enumerate() {
                let last = i + 1 == cuts.len();
                let stop = if last { 40 } else { (start + len).min(40) };
                for o in start..stop {
                    count += 1;
                    if count == snapshot_at {
                        m = Marks::from_applied(&m.applied());
                    }
                    if m.admit(at("t", 0, o as i64)) {
                        seen.push(o);
                    }
                }
                delivered = delivered.max(stop);
                // The next run replays from a checkpoint at or before what was written.
                start = delivered.saturating_sub(*back);
            }
            prop_assert_eq!(seen, (0..40).collect::<Vec<_>>());
        }
    }
}
