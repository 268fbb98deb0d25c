//! The rules of a start, as plain functions over what the executor found on disk: what
//! is restored, which newer checkpoints are abandoned, which id comes next, and when
//! the run refuses to start. They decide what data is replayed, so they are tested here
//! on their own; [`crate::runtime::executor`] gathers the facts and does the I/O.

use lockgate_state::CheckpointId;

/// What a start knows before it decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartFacts {
    /// The newest checkpoint of the job's own directory that verified.
    pub newest_valid: Option<CheckpointId>,
    /// Complete checkpoints of the own directory that failed verification (their names
    /// and why), newest first.
    pub skipped: Vec<(String, String)>,
    /// `--restore`: the checkpoint it resolved to, and whether that checkpoint lies in
    /// the job's own directory.
    pub explicit: Option<(CheckpointId, bool)>,
    /// The id after every id present in the own directory (corrupt, unfinished and
    /// abandoned ones included): no name is ever reused.
    pub next_id_on_disk: CheckpointId,
}

/// Where the state comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Nothing: the job starts empty (its sources' startup modes apply).
    Empty,
    /// The newest valid checkpoint of the own directory.
    Newest(CheckpointId),
    /// The checkpoint `--restore` named.
    Explicit(CheckpointId),
}

/// Which complete checkpoints stop being part of the job's line (renamed
/// `chk-N.abandoned`): a later restart must never resume a line the job left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abandon {
    Nothing,
    /// Every sound checkpoint newer than this one (a restore from the own directory).
    NewerThan(CheckpointId),
    /// Every sound checkpoint (a restore from another directory).
    All,
}

/// What the start does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartDecision {
    /// Start, from `source`, after abandoning `abandon`; new checkpoints from `next_id`.
    Start {
        source: Source,
        abandon: Abandon,
        next_id: CheckpointId,
    },
    /// Refuse to start, with the reason.
    Refuse(String),
}

/// Decides a start. Without `--restore`: the newest valid checkpoint, or nothing when
/// the directory holds no complete checkpoint; but never nothing when checkpoints
/// exist and none verifies (that would silently replay everything, or lose it, with a
/// `latest` startup). With `--restore`: that checkpoint, abandoning the newer line.
pub fn start_decision(f: &StartFacts) -> StartDecision {
    let (source, abandon) = match (f.explicit, f.newest_valid) {
        (Some((id, true)), _) => (Source::Explicit(id), Abandon::NewerThan(id)),
        (Some((id, false)), _) => (Source::Explicit(id), Abandon::All),
        (None, Some(id)) => (Source::Newest(id), Abandon::NewerThan(id)),
        (None, None) if !f.skipped.is_empty() => {
            return StartDecision::Refuse(format!(
                "holds checkpoints but none verifies ({}); refusing to start empty",
                f.skipped
                    .iter()
                    .map(|(name, why)| format!("{name}: {why}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            ))
        }
        (None, None) => (Source::Empty, Abandon::Nothing),
    };
    let restored = match source {
        Source::Newest(id) | Source::Explicit(id) => Some(id),
        Source::Empty => None,
    };
    let next_id = f
        .next_id_on_disk
        .max(restored.map_or(CheckpointId(1), CheckpointId::next));
    StartDecision::Start {
        source,
        abandon,
        next_id,
    }
}

/// What an in-process restart resumes from: the newest checkpoint this run published,
/// or, before the first, what the run started from.
pub fn restart_source(last_published: Option<CheckpointId>, started: Source) -> Source {
    match last_published {
        Some(id) => Source::Newest(id),
        None => started,
    }
}

/// What the store says, once read again, about checkpoint `unknown`, whose publish
/// failed without the store saying whether its `_metadata` landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InDoubt {
    /// It landed: the restart resumes from it.
    Landed,
    /// It is not there: it is abandoned, and the restart resumes as any other
    /// ([`restart_source`]).
    Absent,
    /// The store's newest checkpoint is not ours: another writer works on the line.
    OtherWriter,
}

/// Decides [`InDoubt`] from the newest checkpoint of the store that verifies
/// (`store_newest`: its id, and whether its `_metadata` is byte for byte the one this
/// process wrote under that id). This run published nothing after `unknown`, and ids
/// continue after every id of the store at a start, so a newer one is someone else's.
pub fn in_doubt(unknown: CheckpointId, store_newest: Option<(CheckpointId, bool)>) -> InDoubt {
    match store_newest {
        Some((id, true)) if id == unknown => InDoubt::Landed,
        Some((id, _)) if id >= unknown => InDoubt::OtherWriter,
        _ => InDoubt::Absent,
    }
}

/// Whether a checkpoint may be restored into this job: the key-group count must match
/// (key groups cannot be remapped), and a different graph or job name needs
/// `allow_non_restored`. `Ok(Some(warning))` restores what matches.
pub fn compatibility(
    checkpoint: (&str, u64, u16),
    job: (&str, u64, u16),
    allow_non_restored: bool,
) -> Result<Option<String>, String> {
    let ((c_name, c_fp, c_max), (j_name, j_fp, j_max)) = (checkpoint, job);
    if c_max != j_max {
        return Err(format!(
            "was taken with max_parallelism {c_max}, the job has {j_max}; key groups cannot be remapped"
        ));
    }
    if c_fp == j_fp && c_name == j_name {
        return Ok(None);
    }
    let msg = format!(
        "belongs to job {c_name:?} with another graph (fingerprint {c_fp:016x}, this job {j_name:?} {j_fp:016x})"
    );
    if allow_non_restored {
        Ok(Some(format!(
            "{msg}; restoring matching state only (--allow-non-restored-state)"
        )))
    } else {
        Err(format!(
            "{msg}; pass --allow-non-restored-state to restore what matches"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn id(n: u64) -> CheckpointId {
        CheckpointId(n)
    }

    fn facts(
        newest_valid: Option<u64>,
        skipped: &[&str],
        explicit: Option<(u64, bool)>,
        next_on_disk: u64,
    ) -> StartFacts {
        StartFacts {
            newest_valid: newest_valid.map(id),
            skipped: skipped
                .iter()
                .map(|s| (s.to_string(), "crc mismatch".to_string()))
                .collect(),
            explicit: explicit.map(|(n, own)| (id(n), own)),
            next_id_on_disk: id(next_on_disk),
        }
    }

    fn start(source: Source, abandon: Abandon, next: u64) -> StartDecision {
        StartDecision::Start {
            source,
            abandon,
            next_id: id(next),
        }
    }

    #[test]
    fn start_table() {
        let cases = [
            // An empty directory: nothing to restore, ids from 1.
            (
                facts(None, &[], None, 1),
                start(Source::Empty, Abandon::Nothing, 1),
            ),
            // The newest valid checkpoint; ids after everything present.
            (
                facts(Some(7), &[], None, 8),
                start(Source::Newest(id(7)), Abandon::NewerThan(id(7)), 8),
            ),
            // A corrupt newest one is skipped but keeps its id: the next is after it.
            (
                facts(Some(6), &["chk-0000000007"], None, 8),
                start(Source::Newest(id(6)), Abandon::NewerThan(id(6)), 8),
            ),
            // --restore of an older own checkpoint abandons the newer line.
            (
                facts(Some(9), &[], Some((4, true)), 10),
                start(Source::Explicit(id(4)), Abandon::NewerThan(id(4)), 10),
            ),
            // --restore from another directory abandons the own line entirely, and
            // ids continue after the restored one when that is higher.
            (
                facts(Some(3), &[], Some((40, false)), 4),
                start(Source::Explicit(id(40)), Abandon::All, 41),
            ),
            // --restore wins even where every own checkpoint is corrupt.
            (
                facts(None, &["chk-0000000002"], Some((5, false)), 3),
                start(Source::Explicit(id(5)), Abandon::All, 6),
            ),
        ];
        for (f, want) in cases {
            assert_eq!(start_decision(&f), want, "{f:?}");
        }
    }

    #[test]
    fn checkpoints_that_all_fail_verification_refuse_the_start_and_are_named() {
        let f = facts(None, &["chk-0000000003", "chk-0000000002"], None, 4);
        match start_decision(&f) {
            StartDecision::Refuse(why) => {
                assert!(why.contains("chk-0000000003") && why.contains("chk-0000000002"));
                assert!(why.contains("none verifies"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn restarts_resume_from_the_newest_published_checkpoint() {
        assert_eq!(
            restart_source(None, Source::Explicit(id(4))),
            Source::Explicit(id(4))
        );
        assert_eq!(
            restart_source(Some(id(12)), Source::Explicit(id(4))),
            Source::Newest(id(12))
        );
        assert_eq!(restart_source(None, Source::Empty), Source::Empty);
    }

    #[test]
    fn after_a_publish_of_unknown_fate_the_store_decides_where_the_restart_resumes() {
        use InDoubt::*;
        // (checkpoint in doubt, the store's newest verifying checkpoint and whether it
        // holds our bytes, decision)
        let cases = [
            (7, Some((7, true)), Landed),
            (7, Some((7, false)), OtherWriter),
            (7, Some((9, false)), OtherWriter),
            (7, Some((6, true)), Absent),
            (7, Some((6, false)), Absent),
            (7, None, Absent),
            (1, None, Absent),
        ];
        for (unknown, newest, want) in cases {
            let newest = newest.map(|(n, ours)| (id(n), ours));
            assert_eq!(in_doubt(id(unknown), newest), want, "{unknown} {newest:?}");
        }
    }

    #[test]
    fn compatibility_table() {
        let job = ("orders", 0xabc, 128);
        assert_eq!(compatibility(("orders", 0xabc, 128), job, false), Ok(None));
        assert!(compatibility(("orders", 0xabc, 64), job, true)
            .unwrap_err()
            .contains("max_parallelism 64"));
        assert!(compatibility(("orders", 0xdef, 128), job, false)
            .unwrap_err()
            .contains("--allow-non-restored-state"));
        assert!(compatibility(("other", 0xabc, 128), job, false).is_err());
        assert!(compatibility(("orders", 0xdef, 128), job, true)
            .unwrap()
            .is_some());
    }

    proptest! {
        /// Whatever the directory holds: a start never reuses an id, never restores
        /// nothing while checkpoints exist that it did not restore, and always abandons
        /// the line newer than what it restores.
        #[test]
        fn start_invariants(
            newest_valid in proptest::option::of(1u64..50),
            skipped in 0usize..3,
            explicit in proptest::option::of((1u64..60, any::<bool>())),
            extra in 0u64..5,
        ) {
            let names: Vec<String> = (0..skipped).map(|i| format!("chk-{i}")).collect();
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let highest = newest_valid.unwrap_or(0) + skipped as u64 + extra;
            let f = facts(newest_valid, &refs, explicit, highest + 1);
            match start_decision(&f) {
                StartDecision::Refuse(_) => {
                    prop_assert!(explicit.is_none() && newest_valid.is_none() && skipped > 0);
                }
                StartDecision::Start { source, abandon, next_id } => {
                    prop_assert!(next_id.0 > highest);
                    match source {
                        Source::Empty => {
                            prop_assert!(newest_valid.is_none() && skipped == 0 && explicit.is_none());
                            prop_assert_eq!(abandon, Abandon::Nothing);
                        }
                        Source::Newest(r) => {
                            prop_assert_eq!(Some(r.0), newest_valid);
                            prop_assert_eq!(abandon, Abandon::NewerThan(r));
                            prop_assert!(next_id > r);
                        }
                        Source::Explicit(r) => {
                            let (n, own) = explicit.unwrap();
                            prop_assert_eq!(r.0, n);
                            prop_assert!(next_id > r);
                            prop_assert_eq!(abandon, if own { Abandon::NewerThan(r) } else { Abandon::All });
                        }
                    }
                }
            }
        }
    }
}
