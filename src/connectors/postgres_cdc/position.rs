//! Where the change stream resumes, and which position the slot may be told is done.

use crate::connector::SplitPosition;
use lockgate_state::{CheckpointId, OpaquePosition, SourcePosition};
use std::collections::BTreeMap;

/// A resumable point of the change stream: replication restarts at `lsn` (the end of
/// the last transaction passed on whole, or a later point the server reported with
/// nothing open), and the first `skip` changes the stream then gives are dropped: the
/// part of a transaction larger than the buffer that was passed on before the barrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Resume {
    pub lsn: u64,
    pub skip: u64,
}

/// Stored as 16 bytes, the LSN and then the count, both big endian: the bytes sort as
/// the positions do.
impl SplitPosition for Resume {
    fn to_position(&self, stream: &str, split: i32) -> SourcePosition {
        let mut b = self.lsn.to_be_bytes().to_vec();
        b.extend_from_slice(&self.skip.to_be_bytes());
        SourcePosition::opaque(
            stream,
            split,
            OpaquePosition::new(b).expect("16 bytes fit a position"),
        )
    }

    fn from_position(p: &SourcePosition) -> Result<Self, String> {
        let bytes = p
            .opaque
            .as_ref()
            .map(OpaquePosition::as_bytes)
            .ok_or_else(|| {
                format!(
                    "split {} {}: the checkpoint holds offset {}, not a PostgreSQL stream position",
                    p.stream, p.partition, p.next.0
                )
            })?;
        let bytes: [u8; 16] = bytes.try_into().map_err(|_| {
            format!(
                "split {} {}: a PostgreSQL stream position is 16 bytes, the checkpoint holds {}",
                p.stream,
                p.partition,
                bytes.len()
            )
        })?;
        let (lsn, skip) = bytes.split_at(8);
        Ok(Resume {
            lsn: u64::from_be_bytes(lsn.try_into().expect("8 bytes")),
            skip: u64::from_be_bytes(skip.try_into().expect("8 bytes")),
        })
    }
}

/// The LSN each checkpoint resumes at, and what the slot may be told once one
/// completes.
///
/// The slot is told the position of the checkpoint *before* the newest completed one,
/// not the newest's: the server then keeps the changes both need, so that a restore
/// of the one before (the newest found damaged) still finds them. Everything is told
/// only after the checkpoint that holds it completed.
#[derive(Debug, Default)]
pub struct Confirmations {
    /// Snapshotted and not yet completed or aborted, with their LSN.
    taken: BTreeMap<CheckpointId, u64>,
    /// The LSN of the newest completed checkpoint.
    newest: Option<u64>,
}

impl Confirmations {
    /// Checkpoint `id` resumes at `lsn`.
    pub fn taken(&mut self, id: CheckpointId, lsn: u64) {
        self.taken.insert(id, lsn);
    }

    /// The checkpoint the job restored resumes at `lsn`: it counts as the newest
    /// completed one.
    pub fn restored(&mut self, lsn: u64) {
        self.newest = Some(lsn);
    }

    /// Checkpoint `id` completed: the LSN to confirm now (never lower than one told
    /// before), if any. Older checkpoints still pending are forgotten: they will never
    /// complete after a newer one.
    pub fn completed(&mut self, id: CheckpointId) -> Option<u64> {
        let lsn = self.taken.remove(&id)?;
        self.taken.retain(|k, _| *k > id);
        let confirm = self.newest.replace(lsn);
        confirm.map(|c| c.min(lsn))
    }

    /// Checkpoint `id` was aborted.
    pub fn aborted(&mut self, id: CheckpointId) {
        self.taken.remove(&id);
    }
}

/// Why a restore cannot resume at `restored` on a slot the server has confirmed up
/// to `confirmed`, or `None` when it can. A slot's confirmed position is where the
/// server begins (the changes before it are released), so a checkpoint behind it would
/// miss the changes in between.
pub fn behind_slot(restored: u64, confirmed: u64) -> Option<String> {
    (restored < confirmed).then(|| {
        format!(
            "the checkpoint resumes at {} and the slot has released the changes before {}: this checkpoint cannot be resumed exactly (was an older one restored, or did another client consume the slot?). Restore the newest checkpoint, or start the job without one (a new snapshot)",
            super::lsn::format(restored),
            super::lsn::format(confirmed)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_position_round_trips_and_sorts(a in any::<u64>(), b in any::<u64>(), c in any::<u64>(), d in any::<u64>()) {
            let (x, y) = (Resume { lsn: a, skip: b }, Resume { lsn: c, skip: d });
            let (px, py) = (x.to_position("slot", 0), y.to_position("slot", 0));
            prop_assert_eq!(Resume::from_position(&px).unwrap(), x);
            prop_assert_eq!(px.opaque.cmp(&py.opaque), x.cmp(&y));
        }
    }

    #[test]
    fn another_position_is_an_error() {
        let off = SourcePosition::new("s", 0, lockgate_state::NextOffset(3));
        assert!(Resume::from_position(&off)
            .unwrap_err()
            .contains("offset 3"));
        let short = 7u64.to_position("s", 0);
        assert!(Resume::from_position(&short)
            .unwrap_err()
            .contains("16 bytes, the checkpoint holds 8"));
    }

    #[test]
    fn the_slot_is_told_the_checkpoint_before_the_newest() {
        let mut c = Confirmations::default();
        let id = CheckpointId;
        c.taken(id(1), 100);
        assert_eq!(
            c.completed(id(1)),
            None,
            "the first completed: nothing before it"
        );
        c.taken(id(2), 200);
        c.taken(id(3), 300);
        c.aborted(id(2));
        assert_eq!(c.completed(id(2)), None, "aborted: never completes");
        assert_eq!(c.completed(id(3)), Some(100));
        c.taken(id(4), 400);
        c.taken(id(5), 500);
        assert_eq!(c.completed(id(5)), Some(300), "4 pending is skipped");
        assert_eq!(c.completed(id(4)), None, "forgotten once 5 completed");
        let mut r = Confirmations::default();
        r.restored(250);
        r.taken(id(9), 260);
        assert_eq!(r.completed(id(9)), Some(250));
    }

    #[test]
    fn a_checkpoint_behind_the_slot_is_refused() {
        assert_eq!(behind_slot(100, 100), None);
        assert_eq!(behind_slot(200, 100), None);
        let e = behind_slot(0x1_0000_0010, 0x1_0000_0020).unwrap();
        assert!(
            e.contains("resumes at 1/10") && e.contains("before 1/20"),
            "{e}"
        );
    }
}
