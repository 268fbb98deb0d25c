//! Members: one job run as N processes (`lockgate run --member I --members N`), each
//! the whole job graph over its share of the input, with its own coordinator and its
//! own line of checkpoints. Members share nothing while running, so each is
//! exactly-once on its own and one member's crash never stops another.
//!
//! This module holds the plain rules: which share a member reads, where its line is,
//! and what a member's start does given every line of the checkpoint directory
//! ([`line_plan`]). [`crate::runtime::executor`] gathers the facts and does the I/O.

use lockgate_state::CheckpointId;
use std::fmt;

/// Member `index` of `count`. The default, [`Member::SOLO`], is a job run as one
/// process: its line is the checkpoint directory itself, as before members existed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Member {
    pub index: u16,
    pub count: u16,
}

impl Default for Member {
    fn default() -> Member {
        Member::SOLO
    }
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "member {} of {}", self.index, self.count)
    }
}

/// The largest number of members (and of members × parallelism): subtask indices are
/// `u16`, and key groups stop at 32768.
pub const MAX_GLOBAL_SUBTASKS: u32 = 32768;

impl Member {
    /// The job as one process.
    pub const SOLO: Member = Member { index: 0, count: 1 };

    /// Member `index` of `count`; an index outside `0..count` is refused.
    pub fn new(index: u16, count: u16) -> Result<Member, String> {
        if count == 0 {
            return Err("--members must be at least 1".into());
        }
        if index >= count {
            return Err(format!(
                "--member {index} is not below --members {count} (members count from 0)"
            ));
        }
        Ok(Member { index, count })
    }

    /// The member of a StatefulSet pod: the index is the number after the last `-` of
    /// `hostname` (`orders-to-es-2` is member 2).
    pub fn from_hostname(hostname: &str, count: u16) -> Result<Member, String> {
        let digits = hostname.rsplit_once('-').map(|(_, d)| d).unwrap_or("");
        let index: u16 = match digits.parse() {
            Ok(i) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => i,
            _ => {
                return Err(format!(
                    "--member-from-hostname: host name {hostname:?} does not end in -INDEX (a StatefulSet pod is NAME-0, NAME-1, ...)"
                ))
            }
        };
        Member::new(index, count)
    }

    /// Refuses a member count whose subtasks do not fit the indices: `count ×
    /// parallelism` source subtasks are numbered globally.
    pub fn check_fits(&self, parallelism: u16) -> Result<(), String> {
        let total = u32::from(self.count) * u32::from(parallelism);
        if total > MAX_GLOBAL_SUBTASKS {
            return Err(format!(
                "{} members × parallelism {parallelism} = {total} subtasks, more than {MAX_GLOBAL_SUBTASKS}",
                self.count
            ));
        }
        Ok(())
    }

    /// The global index of this member's local subtask `local` (of `parallelism` per
    /// member): `index × parallelism + local`, of [`Member::global_parallelism`].
    pub fn global_index(&self, local: u16, parallelism: u16) -> u16 {
        self.index * parallelism + local
    }

    /// The number of subtasks of a vertex over all members.
    pub fn global_parallelism(&self, parallelism: u16) -> u16 {
        self.count * parallelism
    }

    /// Whether global subtask `global` (of `count × parallelism`) runs in this member.
    pub fn runs(&self, global: u16, parallelism: u16) -> bool {
        global / parallelism == self.index
    }

    /// The directory of this member's line below the checkpoint directory
    /// (`member-I-of-N`), or `None` for a single member, whose line is the checkpoint
    /// directory itself (so that a job that was never split keeps its layout).
    pub fn line(&self) -> Option<String> {
        (self.count > 1).then(|| format!("member-{}-of-{}", self.index, self.count))
    }

    /// The member whose line is the directory `name` (the inverse of [`Member::line`]).
    pub fn parse_line(name: &str) -> Option<Member> {
        let rest = name.strip_prefix("member-")?;
        let (i, n) = rest.split_once("-of-")?;
        let plain = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !plain(i) || !plain(n) {
            return None;
        }
        let m = Member::new(i.parse().ok()?, n.parse().ok()?).ok()?;
        (m.count > 1 && m.line().as_deref() == Some(name)).then_some(m)
    }

    /// Every member of a job run as `count` members.
    pub fn all(count: u16) -> impl Iterator<Item = Member> {
        (0..count).map(move |index| Member { index, count })
    }

    /// A name for the line, in messages.
    pub fn line_display(&self) -> String {
        self.line()
            .unwrap_or_else(|| "the checkpoint directory".into())
    }
}

fn layout(count: u16) -> String {
    if count == 1 {
        "one process".into()
    } else {
        format!("{count} members")
    }
}

/// What a start found in one member's line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineState {
    pub member: Member,
    /// The newest checkpoint that verified, and whether it is a final one (the member
    /// was stopped with SIGTERM or finished, not killed).
    pub newest_valid: Option<(CheckpointId, bool)>,
}

/// What a member's start does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinePlan {
    /// Start from the member's own line, as a single process does.
    Own,
    /// A rescale: take this member's share of every old member's final checkpoint,
    /// the newest of which is `newest`. The start then treats them as a checkpoint
    /// from another directory ([`crate::checkpoint::start`]): checkpoints already in
    /// the own line (older, left from an earlier layout) are abandoned, and new ids
    /// continue after every id seen.
    Rescale {
        from: Vec<Member>,
        newest: CheckpointId,
    },
}

/// Decides a member's start from every line of the checkpoint directory.
///
/// Ids of a rescaled line continue after the old members' final checkpoints, so ids
/// order the layouts: the layout with the newest valid checkpoint is the current one.
///
/// - With `--rescale-from K`: the K old lines must each end in a final checkpoint (a
///   killed member's positions and state after its last checkpoint are not there; it
///   must be started again and stopped with SIGTERM) and K must differ from the
///   current count. If the own line already holds a checkpoint newer than all of them,
///   the rescale happened before (a restarted pod keeps its arguments): resume it.
/// - Without: refuse when another layout's line holds a newer checkpoint than the own
///   line (starting a stale or empty line would replay or skip records).
pub fn line_plan(
    me: Member,
    rescale_from: Option<u16>,
    lines: &[LineState],
) -> Result<LinePlan, String> {
    let own = lines.iter().find(|l| l.member == me);
    let own_newest = own.and_then(|l| l.newest_valid).map(|(id, _)| id);
    let Some(k) = rescale_from else {
        let newer = lines
            .iter()
            .filter(|l| l.member.count != me.count)
            .filter_map(|l| l.newest_valid.map(|(id, _)| (id, l.member)))
            .filter(|(id, _)| Some(*id) > own_newest)
            .max();
        return match newer {
            None => Ok(LinePlan::Own),
            Some((id, m)) => Err(format!(
                "{} holds {} (of the job run as {}), newer than anything in this member's line ({}): start with --rescale-from {}",
                m.line_display(),
                lockgate_state::snapshot_dir::chk_name(id),
                layout(m.count),
                own_newest.map_or("empty".to_string(), lockgate_state::snapshot_dir::chk_name),
                m.count
            )),
        };
    };
    if k == me.count {
        return Err(format!(
            "--rescale-from {k} is the current number of members: a rescale changes it"
        ));
    }
    let mut base = CheckpointId(0);
    let mut from = Vec::new();
    for old in Member::all(k) {
        let line = lines.iter().find(|l| l.member == old);
        match line.and_then(|l| l.newest_valid) {
            None => {
                return Err(format!(
                    "--rescale-from {k}: {} holds no checkpoint that verifies",
                    old.line_display()
                ))
            }
            Some((id, false)) => {
                return Err(format!(
                    "--rescale-from {k}: the newest checkpoint of {} ({}) is not a final one: {old} was killed, not stopped; start the {k} members again and stop each with SIGTERM, which completes a final checkpoint",
                    old.line_display(),
                    lockgate_state::snapshot_dir::chk_name(id)
                ))
            }
            Some((id, true)) => base = base.max(id),
        }
        from.push(old);
    }
    if own_newest.is_some_and(|id| id > base) {
        return Ok(LinePlan::Own);
    }
    Ok(LinePlan::Rescale { from, newest: base })
}

/// The global subtask (of `global_parallelism`) that reads split `partition` of
/// `stream`, as the job's source assigns them: the sequence source reads split `j` in
/// subtask `j % n`; every other source is assigned like Kafka partitions.
pub fn split_owner(
    source_kind: &str,
    stream: &str,
    partition: i32,
    global_parallelism: u16,
) -> u16 {
    if source_kind == crate::connectors::sequence::KIND {
        partition.rem_euclid(i32::from(global_parallelism)) as u16
    } else {
        crate::connectors::kafka::assign::owner(stream, partition, global_parallelism)
    }
}

/// Whether split `partition` of `stream` is read by member `me`, each member running
/// `parallelism` subtasks of the source.
pub fn owns_split(
    me: Member,
    parallelism: u16,
    source_kind: &str,
    stream: &str,
    partition: i32,
) -> bool {
    let global = split_owner(
        source_kind,
        stream,
        partition,
        me.global_parallelism(parallelism),
    );
    me.runs(global, parallelism)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn m(index: u16, count: u16) -> Member {
        Member::new(index, count).unwrap()
    }

    fn line(member: Member, newest: Option<(u64, bool)>) -> LineState {
        LineState {
            member,
            newest_valid: newest.map(|(id, f)| (CheckpointId(id), f)),
        }
    }

    #[test]
    fn members_and_their_lines() {
        assert!(Member::new(3, 3).is_err());
        assert!(Member::new(0, 0).is_err());
        assert_eq!(m(2, 3).line().as_deref(), Some("member-2-of-3"));
        assert_eq!(Member::SOLO.line(), None);
        assert_eq!(m(0, 1).line(), None);
        assert_eq!(Member::parse_line("member-2-of-3"), Some(m(2, 3)));
        for bad in [
            "member-3-of-3",
            "member-0-of-1",
            "member-02-of-3",
            "member--1-of-3",
            "member-1-of-3x",
            "chk-1",
            "member-+1-of-3",
        ] {
            assert_eq!(Member::parse_line(bad), None, "{bad}");
        }
        assert_eq!(m(1, 3).global_index(2, 4), 6);
        assert_eq!(m(1, 3).global_parallelism(4), 12);
        assert!(m(1, 3).runs(7, 4) && !m(1, 3).runs(8, 4) && !m(1, 3).runs(3, 4));
        assert!(m(0, 2).check_fits(16384).is_ok());
        assert!(m(0, 3).check_fits(16384).is_err());
    }

    #[test]
    fn a_statefulset_pod_name_gives_the_index() {
        assert_eq!(Member::from_hostname("orders-to-es-2", 3), Ok(m(2, 3)));
        assert_eq!(Member::from_hostname("a-0", 1), Ok(Member::SOLO));
        let e = Member::from_hostname("orders-to-es-3", 3).unwrap_err();
        assert!(e.contains("not below --members 3"), "{e}");
        for bad in ["orders", "orders-", "orders-x1", "orders-+1", "7"] {
            let e = Member::from_hostname(bad, 3).unwrap_err();
            assert!(e.contains("does not end in -INDEX"), "{bad}: {e}");
        }
    }

    proptest! {
        /// Every partition is read by exactly one member, and members split a topic's
        /// partitions evenly.
        #[test]
        fn each_partition_has_exactly_one_member(topic in "[a-z]{1,10}", parts in 1i32..100, count in 1u16..6, p in 1u16..5) {
            let mut per_member = vec![0i32; usize::from(count)];
            for part in 0..parts {
                let owners: Vec<Member> = Member::all(count).filter(|me| owns_split(*me, p, "kafka", &topic, part)).collect();
                prop_assert_eq!(owners.len(), 1);
                per_member[usize::from(owners[0].index)] += 1;
            }
            let (lo, hi) = (per_member.iter().min().unwrap(), per_member.iter().max().unwrap());
            prop_assert!(hi - lo <= i32::from(p), "{:?}", per_member);
        }
    }

    #[test]
    fn sequence_splits_go_round_robin_over_every_members_subtasks() {
        // Member 1 of 2 at parallelism 2 runs global subtasks 2 and 3 of 4.
        let owned: Vec<i32> = (0..8)
            .filter(|j| owns_split(m(1, 2), 2, "sequence", "sequence", *j))
            .collect();
        assert_eq!(owned, vec![2, 3, 6, 7]);
    }

    #[test]
    fn a_single_process_without_other_layouts_starts_its_own_line() {
        assert_eq!(line_plan(Member::SOLO, None, &[]), Ok(LinePlan::Own));
        let lines = [line(Member::SOLO, Some((4, false)))];
        assert_eq!(line_plan(Member::SOLO, None, &lines), Ok(LinePlan::Own));
        // Peers of the same layout are not another layout.
        let lines = [
            line(m(1, 3), Some((9, false))),
            line(m(0, 3), Some((4, false))),
        ];
        assert_eq!(line_plan(m(0, 3), None, &lines), Ok(LinePlan::Own));
        assert_eq!(line_plan(m(2, 3), None, &lines), Ok(LinePlan::Own));
    }

    #[test]
    fn a_newer_layout_elsewhere_refuses_a_start_without_rescale() {
        // Three members ran after the single process: starting it again would replay.
        let lines = [
            line(Member::SOLO, Some((4, true))),
            line(m(0, 3), Some((7, false))),
        ];
        let e = line_plan(Member::SOLO, None, &lines).unwrap_err();
        assert!(
            e.contains("member-0-of-3 holds chk-0000000007 (of the job run as 3 members)"),
            "{e}"
        );
        assert!(e.contains("--rescale-from 3"), "{e}");
        // An empty line of a new layout, with the old layout's checkpoints present.
        let e = line_plan(m(1, 2), None, &lines).unwrap_err();
        assert!(e.contains("--rescale-from 3"), "{e}");
        // An older layout elsewhere does not matter.
        assert_eq!(line_plan(m(0, 3), None, &lines), Ok(LinePlan::Own));
    }

    #[test]
    fn a_rescale_takes_every_old_final_checkpoint_and_continues_the_ids() {
        let lines = [
            line(m(0, 3), Some((7, true))),
            line(m(1, 3), Some((9, true))),
            line(m(2, 3), Some((5, true))),
        ];
        assert_eq!(
            line_plan(m(1, 2), Some(3), &lines),
            Ok(LinePlan::Rescale {
                from: vec![m(0, 3), m(1, 3), m(2, 3)],
                newest: CheckpointId(9),
            })
        );
        // Restarted after its first checkpoint with the same arguments: resume.
        let mut again = lines.to_vec();
        again.push(line(m(1, 2), Some((10, false))));
        assert_eq!(line_plan(m(1, 2), Some(3), &again), Ok(LinePlan::Own));
        // Killed before its first checkpoint: the rescale is done again.
        let mut unfinished = lines.to_vec();
        unfinished.push(line(m(1, 2), None));
        assert_eq!(
            line_plan(m(1, 2), Some(3), &unfinished),
            Ok(LinePlan::Rescale {
                from: vec![m(0, 3), m(1, 3), m(2, 3)],
                newest: CheckpointId(9),
            })
        );
    }

    #[test]
    fn a_stale_own_line_from_an_earlier_layout_is_abandoned_by_a_rescale() {
        // 2 members ran long ago (ids up to 4), then 3 (ids 5..9); now back to 2.
        let lines = [
            line(m(0, 2), Some((4, true))),
            line(m(1, 2), Some((3, true))),
            line(m(0, 3), Some((9, true))),
            line(m(1, 3), Some((8, true))),
            line(m(2, 3), Some((9, true))),
        ];
        assert_eq!(
            line_plan(m(0, 2), Some(3), &lines),
            Ok(LinePlan::Rescale {
                from: vec![m(0, 3), m(1, 3), m(2, 3)],
                newest: CheckpointId(9),
            })
        );
        // And without --rescale-from, the stale line is refused, not resumed.
        let e = line_plan(m(0, 2), None, &lines).unwrap_err();
        assert!(e.contains("--rescale-from 3"), "{e}");
    }

    #[test]
    fn a_rescale_is_refused_unless_every_old_member_stopped_with_a_final_checkpoint() {
        let lines = [
            line(m(0, 3), Some((7, true))),
            line(m(1, 3), Some((9, false))),
            line(m(2, 3), Some((5, true))),
        ];
        let e = line_plan(m(0, 2), Some(3), &lines).unwrap_err();
        assert!(
            e.contains("member-1-of-3 (chk-0000000009) is not a final one")
                && e.contains("SIGTERM"),
            "{e}"
        );
        let e = line_plan(m(0, 2), Some(3), &lines[..1]).unwrap_err();
        assert!(e.contains("member-1-of-3 holds no checkpoint"), "{e}");
        let e = line_plan(m(0, 3), Some(3), &lines).unwrap_err();
        assert!(e.contains("is the current number"), "{e}");
        // From one process (its line is the checkpoint directory itself).
        let solo = [line(Member::SOLO, Some((12, true)))];
        assert_eq!(
            line_plan(m(2, 3), Some(1), &solo),
            Ok(LinePlan::Rescale {
                from: vec![Member::SOLO],
                newest: CheckpointId(12),
            })
        );
    }
}
