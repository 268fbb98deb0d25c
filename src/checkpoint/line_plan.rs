//! What a member's start does, given every checkpoint line of the checkpoint
//! directory: a plain function over what [`super::lines`] read. The executor gathers
//! the facts and does the I/O.

use crate::member::Member;
use lockgate_state::CheckpointId;

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
    /// The first id after every id present in the line (corrupt, unfinished and
    /// abandoned ones included).
    pub next_id: CheckpointId,
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
/// A layout is a member count. New ids always continue after every id of every line
/// ([`first_free_id`]), so ids order the layouts: the layout holding the newest
/// checkpoint is the one that ran last.
///
/// - Without `--rescale-from`: refuse when another layout's line holds a newer
///   checkpoint than the own line (starting a stale or empty line would replay or skip
///   records); otherwise start from the own line.
/// - With `--rescale-from K`: if the own line holds a checkpoint and no other layout's
///   line is newer, the rescale happened before (a restarted pod keeps its arguments):
///   resume it, whether or not the old lines are still there. Otherwise rescale, which
///   needs every one of the K old lines to end in a final checkpoint (a killed member's
///   positions and state after its last checkpoint are not there; it must be started
///   again and stopped with SIGTERM), K to differ from the current count, and no third
///   layout to hold a checkpoint newer than the K members' finals (then the K-member
///   run is not the latest one).
pub fn line_plan(
    me: Member,
    rescale_from: Option<u16>,
    lines: &[LineState],
) -> Result<LinePlan, String> {
    let own = lines.iter().find(|l| l.member == me);
    let own_newest = own.and_then(|l| l.newest_valid).map(|(id, _)| id);
    let newest_of = |l: &LineState| l.newest_valid.map(|(id, _)| (id, l.member));
    let newer_elsewhere = lines
        .iter()
        .filter(|l| l.member.count != me.count)
        .filter_map(newest_of)
        .filter(|(id, _)| Some(*id) > own_newest)
        .max();
    let chk = lockgate_state::snapshot_dir::chk_name;
    let Some(k) = rescale_from else {
        return match newer_elsewhere {
            None => Ok(LinePlan::Own),
            Some((id, m)) => Err(format!(
                "{} holds {} (of the job run as {}), newer than anything in this member's line ({}): start with --rescale-from {}",
                m.line_display(),
                chk(id),
                layout(m.count),
                own_newest.map_or("empty".to_string(), chk),
                m.count
            )),
        };
    };
    if k == me.count {
        return Err(format!(
            "--rescale-from {k} is the current number of members: a rescale changes it"
        ));
    }
    if own_newest.is_some() && newer_elsewhere.is_none() {
        return Ok(LinePlan::Own);
    }
    let (mut oldest, mut newest) = (CheckpointId(u64::MAX), CheckpointId(0));
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
                    chk(id)
                ))
            }
            Some((id, true)) => {
                oldest = oldest.min(id);
                newest = newest.max(id);
            }
        }
        from.push(old);
    }
    let later = lines
        .iter()
        .filter(|l| l.member.count != k && l.member.count != me.count)
        .filter_map(newest_of)
        .filter(|(id, _)| *id > oldest)
        .max();
    if let Some((id, m)) = later {
        return Err(format!(
            "--rescale-from {k}: {} holds {} (of the job run as {}), newer than a final checkpoint of the {k} members: the job ran as {} after them; rescale from {}",
            m.line_display(),
            chk(id),
            layout(m.count),
            layout(m.count),
            m.count
        ));
    }
    Ok(LinePlan::Rescale { from, newest })
}

/// The first id no line has used: a start continues after every id of every line, so
/// that ids order the layouts (and a rescaled line never reuses an old member's ids).
pub fn first_free_id(lines: &[LineState]) -> CheckpointId {
    lines
        .iter()
        .map(|l| l.next_id)
        .max()
        .unwrap_or(CheckpointId(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(index: u16, count: u16) -> Member {
        Member::new(index, count).unwrap()
    }

    fn line(member: Member, newest: Option<(u64, bool)>) -> LineState {
        LineState {
            member,
            newest_valid: newest.map(|(id, f)| (CheckpointId(id), f)),
            next_id: CheckpointId(newest.map_or(1, |(id, _)| id + 1)),
        }
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

    /// 3 members (ids up to 9), then 2 (10..50), then 4 (51..70).
    fn three_two_four() -> Vec<LineState> {
        vec![
            line(m(0, 3), Some((9, true))),
            line(m(1, 3), Some((8, true))),
            line(m(2, 3), Some((9, true))),
            line(m(0, 2), Some((50, true))),
            line(m(1, 2), Some((49, true))),
            line(m(0, 4), Some((70, false))),
            line(m(1, 4), Some((69, false))),
            line(m(2, 4), Some((70, false))),
            line(m(3, 4), Some((68, false))),
        ]
    }

    #[test]
    fn an_old_member_restarted_with_its_rescale_arguments_is_refused_once_a_newer_layout_ran() {
        // Member 1 of 2 still has `--rescale-from 3`; its own line (49) is newer than
        // the 3 members' finals, but the 4 members ran after it.
        let e = line_plan(m(1, 2), Some(3), &three_two_four()).unwrap_err();
        assert!(
            e.contains("-of-4 holds chk-0000000070") && e.contains("rescale from 4"),
            "{e}"
        );
        // The 4 members themselves resume their lines, with or without the argument.
        assert_eq!(
            line_plan(m(3, 4), Some(2), &three_two_four()),
            Ok(LinePlan::Own)
        );
        assert_eq!(
            line_plan(m(3, 4), None, &three_two_four()),
            Ok(LinePlan::Own)
        );
    }

    #[test]
    fn a_rescale_from_a_layout_that_a_later_one_replaced_is_refused() {
        // Going to 5 members, but naming the 3 members of the first period.
        let e = line_plan(m(0, 5), Some(3), &three_two_four()).unwrap_err();
        assert!(
            e.contains("newer than a final checkpoint of the 3 members"),
            "{e}"
        );
        // 3 -> 2 -> 3 where member 2 of 3 never ran in the last period: its final is
        // the first period's, older than the 2 members' checkpoints.
        let lines = vec![
            line(m(0, 3), Some((60, true))),
            line(m(1, 3), Some((61, true))),
            line(m(2, 3), Some((9, true))),
            line(m(0, 2), Some((50, true))),
            line(m(1, 2), Some((49, true))),
        ];
        let e = line_plan(m(0, 4), Some(3), &lines).unwrap_err();
        assert!(e.contains("member-0-of-2 holds chk-0000000050"), "{e}");
    }

    #[test]
    fn a_member_resumes_its_line_after_the_old_lines_were_deleted() {
        let lines = [line(m(0, 2), Some((12, false))), line(m(1, 2), None)];
        assert_eq!(line_plan(m(0, 2), Some(3), &lines), Ok(LinePlan::Own));
        // A peer that never checkpointed needs them, and says so.
        let e = line_plan(m(1, 2), Some(3), &lines).unwrap_err();
        assert!(e.contains("member-0-of-3 holds no checkpoint"), "{e}");
    }

    #[test]
    fn new_ids_continue_after_every_id_of_every_line() {
        assert_eq!(first_free_id(&[]), CheckpointId(1));
        let mut lines = three_two_four();
        assert_eq!(first_free_id(&lines), CheckpointId(71));
        // An unfinished or corrupt checkpoint's id counts too.
        lines.push(LineState {
            member: m(1, 3),
            newest_valid: None,
            next_id: CheckpointId(90),
        });
        assert_eq!(first_free_id(&lines), CheckpointId(90));
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
