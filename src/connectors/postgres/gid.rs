//! Prepared transactions' names (`lockgate:<job>:<subtask>:<checkpoint>`) and the
//! decision which of them a restore rolls back: plain functions, tested on their own.

use lockgate_state::CheckpointId;
use serde::{Deserialize, Serialize};

/// One checkpoint's rows of one subtask, prepared and not yet known to be committed:
/// the committable the two-phase kit keeps in checkpoints. Its serde form is part of
/// the checkpoint format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Staged {
    pub subtask: u16,
    pub checkpoint: CheckpointId,
    /// The transaction's id (`txid_current()`), by which the server tells, once the
    /// prepared transaction is gone, whether it was committed or rolled back.
    pub xid: i64,
}

/// The prefix of every transaction name of job `job`.
pub fn prefix(job: &str) -> String {
    format!("lockgate:{job}:")
}

/// The name of the transaction that holds `subtask`'s rows of `checkpoint`.
pub fn name(job: &str, subtask: u16, checkpoint: CheckpointId) -> String {
    format!("{}{subtask}:{}", prefix(job), checkpoint.0)
}

/// The subtask and checkpoint of a transaction name of job `job`; None for any other
/// name (another job's, or not lockgate's).
pub fn parse(job: &str, gid: &str) -> Option<(u16, CheckpointId)> {
    let rest = gid.strip_prefix(&prefix(job))?;
    let (subtask, checkpoint) = rest.split_once(':')?;
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(subtask) || !all_digits(checkpoint) {
        return None;
    }
    Some((
        subtask.parse().ok()?,
        CheckpointId(checkpoint.parse().ok()?),
    ))
}

/// The prepared transactions (`gids`, as `pg_prepared_xacts` lists them) that subtask
/// `index` of `parallelism` rolls back after a restore: those of job `job` whose
/// subtask `s` has `s % parallelism == index` and that the restored checkpoint does
/// not name (`named`, every subtask's). Those hold rows of a checkpoint that never
/// completed, which the job is about to write again.
pub fn abandoned(
    job: &str,
    gids: &[String],
    index: u16,
    parallelism: u16,
    named: &[Staged],
) -> Vec<String> {
    gids.iter()
        .filter(|g| match parse(job, g) {
            Some((s, c)) => {
                s % parallelism.max(1) == index
                    && !named.iter().any(|n| n.subtask == s && n.checkpoint == c)
            }
            None => false,
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staged(subtask: u16, checkpoint: u64) -> Staged {
        Staged {
            subtask,
            checkpoint: CheckpointId(checkpoint),
            xid: 0,
        }
    }

    #[test]
    fn names_round_trip_and_other_jobs_names_are_not_ours() {
        let g = name("orders:eu", 3, CheckpointId(17));
        assert_eq!(g, "lockgate:orders:eu:3:17");
        assert_eq!(parse("orders:eu", &g), Some((3, CheckpointId(17))));
        assert_eq!(parse("orders", &g), None, "a job whose name is a prefix");
        assert_eq!(parse("orders:eu", "lockgate:orders:eu:3"), None);
        assert_eq!(parse("orders:eu", "lockgate:orders:eu:x:1"), None);
        assert_eq!(parse("orders:eu", "lockgate:orders:eu:-1:1"), None);
        assert_eq!(parse("orders:eu", "unrelated"), None);
    }

    #[test]
    fn a_restore_rolls_back_its_share_of_what_the_checkpoint_does_not_name() {
        let gids: Vec<String> = [(0, 5), (0, 6), (1, 6), (2, 7), (3, 6)]
            .iter()
            .map(|(s, c)| name("j", *s, CheckpointId(*c)))
            .chain(["lockgate:other:0:9".to_string(), "manual".to_string()])
            .collect();
        let named = [staged(0, 5), staged(1, 6)];
        // Parallelism 2: subtask 0 takes old subtasks 0 and 2, subtask 1 takes 1 and 3.
        assert_eq!(
            abandoned("j", &gids, 0, 2, &named),
            vec!["lockgate:j:0:6", "lockgate:j:2:7"]
        );
        assert_eq!(abandoned("j", &gids, 1, 2, &named), vec!["lockgate:j:3:6"]);
    }
}
