//! Which committed transactions a snapshot query saw: the decision that lets an
//! initial snapshot read in pieces, across restarts, meet the change stream with no
//! gap and no overlap.
//!
//! A piece of the snapshot reads its rows in a transaction whose MVCC snapshot
//! (`pg_current_snapshot()`, `xmin:xmax:xip,...`) is kept beside them. The stream then
//! replays every transaction committed since the replication slot's position; a
//! change of transaction `X` to a row that piece read is already in the piece's rows
//! exactly when the snapshot saw `X` committed ([`Snapshot::sees`]), so it is skipped
//! then and emitted otherwise. This is PostgreSQL's own visibility rule, not a
//! comparison of LSNs: a transaction whose commit record precedes the snapshot may
//! still be invisible to it (it had not yet left the list of running transactions).

/// An MVCC snapshot: transactions below `xmin` had ended, those from `xmax` on had
/// not started, and those in `xip` were running; every other one had ended.
/// Transaction ids are PostgreSQL's 64-bit ones (`xid8`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    pub xmin: u64,
    pub xmax: u64,
    /// Sorted.
    pub xip: Vec<u64>,
}

impl Snapshot {
    /// Parses `pg_current_snapshot()`'s text form, `xmin:xmax:xip1,xip2,...`.
    pub fn parse(text: &str) -> Result<Snapshot, String> {
        let bad = |why: &str| format!("a snapshot {text:?}: {why}");
        let mut parts = text.trim().split(':');
        let (Some(xmin), Some(xmax), Some(xip), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad("not xmin:xmax:xip"));
        };
        let id = |s: &str| {
            s.parse::<u64>()
                .map_err(|_| bad("a transaction id is not a number"))
        };
        let (xmin, xmax) = (id(xmin)?, id(xmax)?);
        let mut xip = match xip {
            "" => Vec::new(),
            list => list.split(',').map(id).collect::<Result<Vec<_>, _>>()?,
        };
        xip.sort_unstable();
        if xmin > xmax || xip.iter().any(|x| *x < xmin || *x >= xmax) {
            return Err(bad("its ids are out of order"));
        }
        Ok(Snapshot { xmin, xmax, xip })
    }

    /// The 64-bit id of the 32-bit `xid` a replication stream names (pgoutput's
    /// `Begin`), taken as the one nearest this snapshot's `xmax`: transactions of one
    /// snapshot and its stream are far less than 2^31 apart.
    pub fn widen(&self, xid: u32) -> u64 {
        let low = self.xmax as u32;
        let delta = i64::from(xid.wrapping_sub(low) as i32);
        self.xmax.wrapping_add_signed(delta)
    }

    /// Whether the snapshot saw transaction `xid` (a committed one, as the stream only
    /// replays those) as committed: its changes are in what a query under the
    /// snapshot read.
    pub fn sees(&self, xid: u32) -> bool {
        let full = self.widen(xid);
        if full < self.xmin {
            return true;
        }
        full < self.xmax && self.xip.binary_search(&full).is_err()
    }
}

/// What the stream does with a change of transaction `xid` to a table whose rows
/// were read by the snapshot pieces `pieces`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// Every piece saw the transaction: its changes are in the rows read.
    Skip,
    /// No piece saw it: its changes come after the rows read.
    Emit,
    /// Some pieces saw it and some did not: the piece that read the changed row's key
    /// decides ([`Snapshot::sees`] of that piece).
    ByPiece,
}

/// [`Replay`] of a change of `xid` to a table read by `pieces` (none: the table was
/// not read by a snapshot, and every change is emitted).
pub fn replay(pieces: &[&Snapshot], xid: u32) -> Replay {
    let seen = pieces.iter().filter(|s| s.sees(xid)).count();
    match seen {
        0 => Replay::Emit,
        n if n == pieces.len() => Replay::Skip,
        _ => Replay::ByPiece,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_sees_ended_transactions_and_not_running_or_later_ones() {
        let s = Snapshot::parse("100:110:104,102").unwrap();
        assert_eq!(s.xip, vec![102, 104], "sorted");
        for (xid, seen) in [
            (50, true),
            (99, true),
            (100, true),
            (101, true),
            (102, false),
            (103, true),
            (104, false),
            (109, true),
            (110, false),
            (500, false),
        ] {
            assert_eq!(s.sees(xid), seen, "{xid}");
        }
        let empty = Snapshot::parse("7:7:").unwrap();
        assert!(empty.sees(6) && !empty.sees(7));
    }

    #[test]
    fn a_32_bit_id_is_read_in_the_snapshot_s_epoch_across_a_wraparound() {
        // xmax just past an epoch boundary: ids just below 2^32 are of the epoch before.
        let epoch = 1u64 << 32;
        let s = Snapshot {
            xmin: epoch - 10,
            xmax: epoch + 5,
            xip: vec![epoch - 3, epoch + 2],
        };
        assert_eq!(s.widen(u32::MAX - 2), epoch - 3);
        assert_eq!(s.widen(2), epoch + 2);
        assert!(!s.sees(u32::MAX - 2), "running");
        assert!(s.sees(u32::MAX), "ended before the boundary");
        assert!(s.sees(1), "ended after it");
        assert!(!s.sees(2), "running");
        assert!(!s.sees(5), "at xmax");
        assert!(s.sees(u32::MAX - 20), "below xmin");
    }

    #[test]
    fn a_snapshot_text_that_is_not_one_is_refused() {
        for bad in ["", "1:2", "1:2:3:4", "a:2:", "5:2:", "1:5:7", "1:5:0"] {
            assert!(Snapshot::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn pieces_that_agree_decide_alone_and_others_go_by_the_row_s_piece() {
        let early = Snapshot::parse("100:101:").unwrap();
        let late = Snapshot::parse("120:121:").unwrap();
        let both = [&early, &late];
        assert_eq!(replay(&both, 90), Replay::Skip);
        assert_eq!(replay(&both, 110), Replay::ByPiece);
        assert_eq!(replay(&both, 130), Replay::Emit);
        assert_eq!(replay(&[], 90), Replay::Emit, "a table no piece read");
    }
}
