//! A source's own position type and the checkpoint's form of it.
//!
//! A checkpoint holds one [`SourcePosition`] per split. A source whose positions are
//! offsets keeps them in `next`; any other source keeps its position as an
//! [`OpaquePosition`], bytes that only it reads. [`SplitPosition`] converts between a
//! source's type and that form, so that a source reads its restored positions typed
//! ([`split_start_as`]) and never parses bytes itself.

use super::splits::{split_start, SplitStart};
use lockgate_state::{NextOffset, OpaquePosition, SourcePosition};

/// A source's own position type, to and from the checkpoint's form.
///
/// `from_position(&p.to_position(stream, split))` gives back `p` for every value.
pub trait SplitPosition: Clone + Send + Sync + 'static {
    /// The checkpoint form of `self` for split `split` of `stream`.
    fn to_position(&self, stream: &str, split: i32) -> SourcePosition;
    /// `p` as this type; an error names the split and what the checkpoint holds
    /// instead (a checkpoint of another source).
    fn from_position(p: &SourcePosition) -> Result<Self, String>;
}

/// An offset: kept in `next`, as every offset-based source keeps it.
impl SplitPosition for NextOffset {
    fn to_position(&self, stream: &str, split: i32) -> SourcePosition {
        SourcePosition::new(stream, split, *self)
    }

    fn from_position(p: &SourcePosition) -> Result<Self, String> {
        match &p.opaque {
            None => Ok(p.next),
            Some(o) => Err(format!(
                "split {} {}: the checkpoint holds an opaque position of {} bytes, not an offset",
                p.stream,
                p.partition,
                o.as_bytes().len()
            )),
        }
    }
}

/// A 64-bit position whose order is the position's (a PostgreSQL LSN `X/Y` as
/// `(X << 32) | Y`, a stream offset): stored as 8 bytes big endian, so that the
/// stored bytes sort as the numbers do.
impl SplitPosition for u64 {
    fn to_position(&self, stream: &str, split: i32) -> SourcePosition {
        SourcePosition::opaque(stream, split, opaque(self.to_be_bytes().to_vec()))
    }

    fn from_position(p: &SourcePosition) -> Result<Self, String> {
        let bytes = opaque_of(p, "a 64-bit position")?;
        let bytes: [u8; 8] = bytes.try_into().map_err(|_| {
            format!(
                "split {} {}: a 64-bit position is 8 bytes, the checkpoint holds {}",
                p.stream,
                p.partition,
                bytes.len()
            )
        })?;
        Ok(u64::from_be_bytes(bytes))
    }
}

/// A 128-bit position (a Kinesis sequence number): stored as its decimal digits, so
/// that `checkpoints inspect` shows it as the service spells it.
impl SplitPosition for u128 {
    fn to_position(&self, stream: &str, split: i32) -> SourcePosition {
        SourcePosition::opaque(stream, split, opaque(self.to_string().into_bytes()))
    }

    fn from_position(p: &SourcePosition) -> Result<Self, String> {
        let bytes = opaque_of(p, "a 128-bit position")?;
        let bad = |why: &str| {
            format!(
                "split {} {}: a 128-bit position is decimal digits, the checkpoint holds {:?} ({why})",
                p.stream,
                p.partition,
                String::from_utf8_lossy(bytes)
            )
        };
        // `parse` alone would take a leading `+`.
        if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
            return Err(bad("not digits"));
        }
        std::str::from_utf8(bytes)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("more than 2^128 - 1"))
    }
}

/// `bytes` as a position; every caller holds at most 39 bytes.
fn opaque(bytes: Vec<u8>) -> OpaquePosition {
    OpaquePosition::new(bytes).expect("at most 39 bytes, within OpaquePosition::MAX_LEN")
}

/// The opaque bytes of `p`, or an error saying it holds an offset instead of `what`.
fn opaque_of<'a>(p: &'a SourcePosition, what: &str) -> Result<&'a [u8], String> {
    p.opaque
        .as_ref()
        .map(OpaquePosition::as_bytes)
        .ok_or_else(|| {
            format!(
                "split {} {}: the checkpoint holds offset {}, not {what}",
                p.stream, p.partition, p.next.0
            )
        })
}

/// Where one split starts, typed: [`SplitStart`] with the restored position parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SplitStartAs<P> {
    /// The job starts without a checkpoint: the source's startup setting applies.
    Fresh,
    /// The restored checkpoint holds the split: continue exactly at this position.
    Restored(P),
    /// A checkpoint was restored but does not hold the split: see
    /// [`SplitStart::NotInCheckpoint`].
    NotInCheckpoint,
}

/// [`split_start`], typed: where split `split` of `stream` starts, with a restored
/// position read as `P`. An error (the checkpoint holds another kind of position)
/// names the split.
pub fn split_start_as<P: SplitPosition>(
    restored: Option<&[SourcePosition]>,
    stream: &str,
    split: i32,
) -> Result<SplitStartAs<P>, String> {
    Ok(match split_start(restored, stream, split) {
        SplitStart::Fresh => SplitStartAs::Fresh,
        SplitStart::Restored(p) => SplitStartAs::Restored(P::from_position(p)?),
        SplitStart::NotInCheckpoint => SplitStartAs::NotInCheckpoint,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip<P: SplitPosition + PartialEq + std::fmt::Debug>(p: P) {
        let stored = p.to_position("s", 3);
        assert_eq!((stored.stream.as_str(), stored.partition), ("s", 3));
        assert_eq!(P::from_position(&stored).unwrap(), p);
    }

    proptest! {
        #[test]
        fn every_position_round_trips(o in any::<i64>(), a in any::<u64>(), b in any::<u128>()) {
            round_trip(NextOffset(o));
            round_trip(a);
            round_trip(b);
        }

        /// The stored bytes of 64-bit positions sort as the positions do (an LSN
        /// compared in a checkpoint compares as the server does).
        #[test]
        fn u64_bytes_sort_as_the_numbers(a in any::<u64>(), b in any::<u64>()) {
            let (x, y) = (a.to_position("s", 0), b.to_position("s", 0));
            prop_assert_eq!(x.opaque.cmp(&y.opaque), a.cmp(&b));
        }
    }

    #[test]
    fn an_offset_stays_an_offset_and_others_are_opaque() {
        let p = NextOffset(17).to_position("orders", 2);
        assert_eq!(p, SourcePosition::new("orders", 2, NextOffset(17)));
        // An LSN 16/B374D848.
        let lsn = (0x16u64 << 32) | 0xB374_D848;
        let p = lsn.to_position("slot", 0);
        assert_eq!(p.next, NextOffset(0));
        assert_eq!(
            p.opaque.unwrap().as_bytes(),
            &[0, 0, 0, 0x16, 0xB3, 0x74, 0xD8, 0x48]
        );
        let p = u128::MAX.to_position("shard", 0);
        assert_eq!(
            p.opaque.as_ref().unwrap().as_bytes(),
            b"340282366920938463463374607431768211455"
        );
        assert_eq!(u128::from_position(&p).unwrap(), u128::MAX);
        assert_eq!(
            u128::from_position(&0u128.to_position("shard", 0)).unwrap(),
            0
        );
    }

    #[test]
    fn another_kind_of_position_is_an_error_naming_the_split() {
        let held = |b: &[u8]| SourcePosition::opaque("shard", 1, OpaquePosition::new(b).unwrap());
        let err = |r: Result<u128, String>| r.unwrap_err();
        assert_eq!(
            err(u128::from_position(&held(b"340282366920938463463374607431768211456"))),
            "split shard 1: a 128-bit position is decimal digits, the checkpoint holds \"340282366920938463463374607431768211456\" (more than 2^128 - 1)"
        );
        for bad in [&b"+1"[..], b"12a", b"", b"-3", b" 1"] {
            assert!(
                err(u128::from_position(&held(bad))).contains("(not digits)"),
                "{bad:?}"
            );
        }
        assert_eq!(
            u64::from_position(&held(b"1234567")).unwrap_err(),
            "split shard 1: a 64-bit position is 8 bytes, the checkpoint holds 7"
        );
        assert_eq!(
            NextOffset::from_position(&held(b"12")).unwrap_err(),
            "split shard 1: the checkpoint holds an opaque position of 2 bytes, not an offset"
        );
        let offset = SourcePosition::new("orders", 4, NextOffset(9));
        assert_eq!(
            u64::from_position(&offset).unwrap_err(),
            "split orders 4: the checkpoint holds offset 9, not a 64-bit position"
        );
    }

    #[test]
    fn a_split_starts_typed_as_split_start_says() {
        let restored = [7u64.to_position("a", 0), NextOffset(3).to_position("b", 0)];
        assert_eq!(split_start_as::<u64>(None, "a", 0), Ok(SplitStartAs::Fresh));
        assert_eq!(
            split_start_as::<u64>(Some(&restored), "a", 0),
            Ok(SplitStartAs::Restored(7))
        );
        assert_eq!(
            split_start_as::<u64>(Some(&restored), "a", 1),
            Ok(SplitStartAs::NotInCheckpoint)
        );
        assert!(split_start_as::<u64>(Some(&restored), "b", 0).is_err());
        assert_eq!(
            split_start_as::<NextOffset>(Some(&restored), "b", 0),
            Ok(SplitStartAs::Restored(NextOffset(3)))
        );
    }
}
