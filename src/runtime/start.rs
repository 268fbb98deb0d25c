//! Where a run starts from: the member's checkpoint line opened and locked, and what
//! the run restores (the newest checkpoint that verifies, `--restore`, or a rescale's
//! share of every old member's final checkpoint), as I/O around the plain decisions of
//! [`crate::checkpoint::start`]; and where an in-process restart resumes.

use crate::checkpoint::line_plan::{first_free_id, line_plan, LinePlan};
use crate::checkpoint::lines;
use crate::checkpoint::start::{
    compatibility, in_doubt, restart_source, start_decision, Abandon, InDoubt, Source,
    StartDecision, StartFacts,
};
use crate::connector::splits::owns_split;
use crate::connector::{SinkRestore, SINK_UID, SOURCE_UID};
use crate::error::{JobError, Result};
use crate::job::JobGraph;
use crate::member::Member;
use crate::telemetry::Telemetry;
use lockgate_state::backend::KeyFilter;
use lockgate_state::snapshot_dir::{resolve_restore_path, Restored, SnapshotDir, Startup};
use lockgate_state::store::{CheckpointLocation, CheckpointStore, StoreLocation};
use lockgate_state::{CheckpointId, CheckpointMetadata};
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::watch;
use tracing::{info, warn};

/// How to start a run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Restore from this `chk-N` directory (or the newest valid checkpoint of this
    /// checkpoint directory) instead of the job's own checkpoint directory; a store URL
    /// (`s3://bucket/prefix[/chk-N]`) is downloaded into the local directory first.
    pub restore: Option<PathBuf>,
    /// Accept a checkpoint of a different job graph, restoring what matches by uid.
    pub allow_non_restored_state: bool,
    /// Becomes `true` to stop the job with a final checkpoint (SIGTERM).
    pub stop: Option<watch::Receiver<bool>>,
    /// Where the run reports its metrics and status (one is made if `None`); serve it
    /// with `telemetry::server` to watch the job.
    pub telemetry: Option<Telemetry>,
    /// `--rescale-from K`: the job ran as K members, each stopped with a final
    /// checkpoint; this member takes its share of all of them (see
    /// [`crate::checkpoint::line_plan`]). Ignored once this member's own line holds a newer
    /// checkpoint, so that a restarted member keeps its arguments.
    pub rescale_from: Option<u16>,
    /// Pause and resume requests and checkpoints asked for (the control API); its stop
    /// is given as [`RunOptions::stop`].
    pub control: Option<crate::control::JobControl>,
}

/// What an attempt restores: one checkpoint, or in a rescale every old member's final
/// checkpoint.
#[derive(Clone)]
pub(super) struct RestoreSet {
    pub(super) parts: Vec<Restored>,
    /// This member's share of the keyed state, when the parts may hold other members'.
    pub(super) keep: Option<KeyFilter>,
}

impl RestoreSet {
    pub(super) fn one(r: Restored) -> RestoreSet {
        RestoreSet {
            parts: vec![r],
            keep: None,
        }
    }

    /// The newest part: its id and time stand for the set.
    pub(super) fn newest(&self) -> &Restored {
        self.parts
            .iter()
            .max_by_key(|r| r.metadata.id)
            .expect("a restore set has a part")
    }

    /// The union of every part's source positions (each split is in one part: a
    /// member's source snapshots only the splits it reads).
    pub(super) fn positions(&self) -> Vec<lockgate_state::SourcePosition> {
        self.parts
            .iter()
            .flat_map(|r| r.metadata.positions.iter().cloned())
            .collect()
    }
}

/// The filter that keeps this member's share of keyed state taken from checkpoints of
/// other layouts: a co-partitioned job's state is scoped by source partition, and the
/// member keeps the partitions its sources read.
fn member_share(job: &JobGraph, rescale: bool) -> Option<KeyFilter> {
    if !job.co_partitioned || !(rescale || job.member.count > 1) {
        return None;
    }
    let (member, assignment) = (job.member, job.source.assignment.clone());
    Some(Arc::new(move |user_key: &[u8]| {
        crate::kits::keyed::scope_of(user_key).is_some_and(|(stream, partition)| {
            owns_split(member, assignment.assigner(), stream, partition)
        })
    }))
}

/// What a finished run did.
#[derive(Debug, Clone, Default)]
pub struct RunSummary {
    /// The checkpoint the run started from, if any.
    pub restored_from: Option<PathBuf>,
    /// Checkpoints skipped at start because they failed verification.
    pub skipped: Vec<(PathBuf, String)>,
    /// Checkpoints published by this run (over all attempts).
    pub checkpoints: u64,
    /// The final checkpoint.
    pub last_checkpoint: Option<CheckpointId>,
    /// In-process restarts.
    pub restarts: u32,
    /// Every checkpoint's duration (trigger to publish), in milliseconds.
    pub checkpoint_durations_ms: Vec<u64>,
}

/// What a start decided: the member's checkpoint line, what to restore, and the ids.
pub(super) struct Prepared {
    pub(super) dir: Arc<SnapshotDir>,
    /// The member's line: where the local copies live.
    pub(super) root: PathBuf,
    pub(super) store: Option<Arc<CheckpointStore>>,
    pub(super) restored: Option<RestoreSet>,
    pub(super) next_id: CheckpointId,
    pub(super) summary: RunSummary,
    pub(super) source: Source,
}

/// Whether a failure before the first attempt is worth another start: the store did
/// not answer or a transfer was cut short, or a local file went missing midway. Not a
/// refusal (another job's checkpoint, a held lock), a store that is misconfigured or
/// refuses the credentials, nor a local permission error: a restart cannot cure those.
pub(super) fn start_failure_is_retried(e: &JobError) -> bool {
    use lockgate_state::StateError;
    use std::io::ErrorKind;
    match e {
        JobError::State(StateError::Store { op, message, .. }) => {
            // object_store's words for permission and authentication failures.
            *op != "configure" && !message.contains("lacked")
        }
        JobError::State(StateError::Io { source, .. }) => matches!(
            source.kind(),
            ErrorKind::NotFound
                | ErrorKind::Interrupted
                | ErrorKind::TimedOut
                | ErrorKind::UnexpectedEof
                | ErrorKind::ConnectionReset
                | ErrorKind::ConnectionAborted
                | ErrorKind::BrokenPipe
        ),
        _ => false,
    }
}

/// Opens the member's checkpoint line (taking its lock) and decides what the run
/// restores: the newest valid checkpoint, `--restore`, or a rescale's share.
pub(super) async fn prepare(
    job: &JobGraph,
    opts: &RunOptions,
    telemetry: &Telemetry,
) -> Result<Prepared> {
    let base = job.checkpoint.dir.clone();
    let base_store = job.checkpoint.store.clone();
    // The member's line, and whether this start is a rescale: a plain decision over
    // every line of the checkpoint directory, or of the store when there is one
    // (checkpoint::line_plan).
    let line_states = match &base_store {
        None => tokio::task::block_in_place(|| lines::scan(&base))?,
        Some(s) => lines::scan_store(s).await?,
    };
    let plan = line_plan(job.member, opts.rescale_from, &line_states)
        .map_err(|e| JobError::Restore(format!("{}: {e}", job.checkpoint.location())))?;
    let root = lines::line_dir(&base, job.member);
    let line_store = base_store.as_ref().map(|s| match job.member.line() {
        Some(l) => s.join(&l),
        None => s.clone(),
    });
    let store = match &line_store {
        Some(loc) => Some(Arc::new(CheckpointStore::new(loc)?)),
        None => None,
    };
    let (dir, startup) = match &store {
        None => tokio::task::block_in_place(|| SnapshotDir::open(&root))?,
        // The local directory is only the staging layer: the store decides what is
        // restored, and ids continue after every id of either.
        Some(s) => {
            let (dir, local_next) =
                tokio::task::block_in_place(|| SnapshotDir::open_staging(&root))?;
            let found = s.start(&root).await?;
            let startup = Startup {
                restored: found.restored,
                skipped: found
                    .skipped
                    .into_iter()
                    .map(|(url, why)| (PathBuf::from(url), why))
                    .collect(),
                next_id: found.next_id.max(local_next),
            };
            (dir, startup)
        }
    };
    let dir = Arc::new(dir);
    let mut summary = RunSummary::default();
    for (path, why) in &startup.skipped {
        warn!(checkpoint = %path.display(), reason = %why, "skipping checkpoint that does not verify; falling back to an older one");
    }
    summary.skipped = startup.skipped.clone();
    let (explicit, explicit_own) = match (&opts.restore, &plan) {
        (Some(_), LinePlan::Rescale { .. }) => {
            return Err(JobError::Restore(
                "--restore and --rescale-from exclude each other".into(),
            ))
        }
        (Some(p), LinePlan::Own) => {
            let (r, skipped, own) = resolve_explicit(p, line_store.as_ref(), &root).await?;
            for (path, why) in &skipped {
                warn!(checkpoint = %path.display(), reason = %why, "skipping checkpoint that does not verify");
            }
            summary.skipped.extend(skipped);
            (
                Some(RestoreSet {
                    parts: vec![r],
                    keep: member_share(job, false),
                }),
                own,
            )
        }
        (None, LinePlan::Rescale { from, newest }) => {
            let set = rescale_set(job, &base, &root, base_store.as_ref(), from).await?;
            info!(job = %job.name, member = %job.member, from = from.len(), newest = %newest, "rescaling: taking this member's share of every old member's final checkpoint");
            (Some(set), None)
        }
        (None, LinePlan::Own) => (None, None),
    };
    // The rules are plain functions (checkpoint::start); this is the I/O around them.
    let own_root = root.canonicalize().ok();
    let facts = StartFacts {
        newest_valid: startup.restored.as_ref().map(|r| r.metadata.id),
        skipped: startup
            .skipped
            .iter()
            .map(|(p, why)| (p.display().to_string(), why.clone()))
            .collect(),
        explicit: explicit.as_ref().map(|set| {
            let r = set.newest();
            let own = set.parts.len() == 1
                && explicit_own.unwrap_or_else(|| {
                    r.path.parent().and_then(|p| p.canonicalize().ok()) == own_root
                });
            (r.metadata.id, own)
        }),
        next_id_on_disk: startup.next_id,
    };
    let (source, abandon, next_id) = match start_decision(&facts) {
        StartDecision::Refuse(why) => {
            return Err(JobError::Restore(format!("{} {why}", root.display())))
        }
        StartDecision::Start {
            source,
            abandon,
            next_id,
        } => (source, abandon, next_id.max(first_free_id(&line_states))),
    };
    let restored = match source {
        Source::Empty => None,
        Source::Newest(_) => startup.restored.map(RestoreSet::one),
        Source::Explicit(_) => explicit,
    };
    if let Some(set) = &restored {
        for part in &set.parts {
            check_compatible(job, &part.metadata, opts.allow_non_restored_state)?;
        }
        let r = set.newest();
        let newer_than = match abandon {
            Abandon::Nothing => None,
            Abandon::NewerThan(id) => Some(Some(id)),
            Abandon::All => Some(None),
        };
        let mut abandoned = Vec::new();
        if let Some(k) = newer_than {
            abandoned = tokio::task::block_in_place(|| dir.abandon_newer(k))?;
            if let Some(s) = &store {
                abandoned.extend(s.abandon_newer(k).await?.iter().map(|n| s.url_of(n)));
            }
        }
        for name in abandoned {
            warn!(checkpoint = %name, restored = %r.path.display(), "newer checkpoint abandoned: the job continues from an older one");
        }
    }
    summary.restored_from = restored.as_ref().map(|set| set.newest().path.clone());
    telemetry.restored(summary.restored_from.as_deref());
    if let Some(set) = &restored {
        let r = set.newest();
        telemetry.restored_checkpoint(r.metadata.id.0, r.metadata.created_ms);
    }
    Ok(Prepared {
        dir,
        root,
        store,
        restored,
        next_id,
        summary,
        source,
    })
}

/// Where an in-process restart resumes: the newest checkpoint this run published;
/// before the first one, from where the run started (`None`: keep that).
pub(super) fn own_restart(
    dir: &SnapshotDir,
    last_published: Option<CheckpointId>,
    started: Source,
) -> Result<Option<Restored>> {
    if let Source::Newest(id) = restart_source(last_published, started) {
        if last_published == Some(id) {
            let (r, _) =
                resolve_restore_path(&dir.completed_path(id)).map_err(JobError::Restore)?;
            return Ok(Some(r));
        }
    }
    Ok(None)
}

/// Reads the store after publishing checkpoint `unknown` ended without knowing whether
/// its `_metadata` landed: lists it and downloads its newest checkpoint that verifies,
/// as a start does, and decides with [`in_doubt`]. `Some`: resume from it (it is
/// `unknown`, which landed); `None`: `unknown` is not in the store, its local copy is
/// abandoned, and the restart resumes as any other. Another writer's checkpoint there
/// fails the job; an error of the store (it still cannot be reached) is a failed
/// attempt, and the restart policy decides whether to ask again.
pub(super) async fn decide_from_store(
    s: &CheckpointStore,
    dir: &SnapshotDir,
    root: &std::path::Path,
    unknown: CheckpointId,
    summary: &mut RunSummary,
) -> Result<Option<Restored>> {
    let local = dir.completed_path(unknown);
    let ours_path = local.join(lockgate_state::metadata::METADATA_FILE);
    // An unreadable local copy is an error of its own, not a sign of another writer.
    let ours = match std::fs::read(&ours_path) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(lockgate_state::StateError::io("read", &ours_path)(e).into()),
    };
    let found = s.start(root).await?;
    for (url, why) in &found.skipped {
        warn!(checkpoint = %url, reason = %why, "skipping checkpoint that does not verify; falling back to an older one");
    }
    let newest = match &found.restored {
        Some(r) => {
            let theirs = std::fs::read(r.path.join(lockgate_state::metadata::METADATA_FILE))
                .map_err(lockgate_state::StateError::io("read", &r.path))?;
            Some((r.metadata.id, ours.as_deref() == Some(&theirs[..])))
        }
        None => None,
    };
    let url = s.url_of(&lockgate_state::snapshot_dir::chk_name(unknown));
    match in_doubt(unknown, newest) {
        InDoubt::Landed => {
            let r = found.restored.expect("the store's newest checkpoint");
            info!(checkpoint = %url, "the store holds the checkpoint whose publish was in doubt: resuming from it");
            summary.last_checkpoint = Some(unknown);
            Ok(Some(r))
        }
        InDoubt::OtherWriter => Err(JobError::Unrecoverable {
            task: format!("checkpoint {unknown}"),
            message: format!(
                "{}: the store's newest checkpoint ({}) is not the one this process wrote; another writer owns this checkpoint line (is the job running elsewhere? stop it, or give each job its own prefix)",
                url,
                newest.map(|(id, _)| id.to_string()).unwrap_or_default()
            ),
        }),
        InDoubt::Absent => {
            warn!(checkpoint = %url, "the checkpoint whose publish was in doubt is not in the store: abandoned");
            if local.exists() {
                if let Err(a) = tokio::task::block_in_place(|| dir.abandon(unknown)) {
                    warn!(checkpoint = %unknown, error = %a, "cannot abandon the local copy of a checkpoint the store does not hold");
                }
            }
            Ok(None)
        }
    }
}

/// Resolves `--restore`: a local `chk-N` or checkpoint directory, or a store URL
/// (`s3://bucket/prefix/chk-N`, or `s3://bucket/prefix` for its newest checkpoint that
/// verifies), downloaded into `<root>/.restore/`. Returns the checkpoint, the ones
/// skipped, and for a store URL whether it is the job's own store prefix (for a local
/// path the caller compares directories).
async fn resolve_explicit(
    p: &std::path::Path,
    own: Option<&StoreLocation>,
    root: &std::path::Path,
) -> Result<(Restored, Vec<(PathBuf, String)>, Option<bool>)> {
    let text = p.to_string_lossy();
    let location = match CheckpointLocation::parse(&text) {
        Ok(CheckpointLocation::Store(s)) => s,
        Ok(CheckpointLocation::Local(_)) => {
            let (r, skipped) = resolve_restore_path(p).map_err(JobError::Restore)?;
            return Ok((r, skipped, None));
        }
        Err(e) => return Err(JobError::Restore(format!("--restore {text}: {e}"))),
    };
    // The job's own store settings (endpoint, credentials) apply to its own bucket.
    let location = match own {
        Some(o) if o.scheme() == location.scheme() && o.bucket() == location.bucket() => {
            location.with_options_of(o)
        }
        _ => location,
    };
    let into = root.join(".restore");
    let fresh = into.clone();
    tokio::task::block_in_place(|| -> std::io::Result<()> {
        if fresh.exists() {
            std::fs::remove_dir_all(&fresh)?;
        }
        std::fs::create_dir_all(&fresh)
    })
    .map_err(lockgate_state::StateError::io("create", &into))?;
    let named = location
        .last_segment()
        .and_then(lockgate_state::snapshot_dir::parse_name)
        .filter(|(_, kind)| *kind == lockgate_state::snapshot_dir::NameKind::Checkpoint);
    let (prefix, restored, skipped) = match named {
        Some(_) => {
            let name = location.last_segment().unwrap_or_default().to_string();
            let parent = location.parent();
            let s = CheckpointStore::new(&parent)?;
            let r = s
                .download(&name, &into)
                .await?
                .map_err(|why| JobError::Restore(format!("--restore {text}: {why}")))?;
            (parent, r, Vec::new())
        }
        None => {
            let (restored, skipped) = newest_in_store(&location, &into).await?;
            let r = restored.ok_or_else(|| {
                JobError::Restore(format!(
                    "--restore {text}: no checkpoint there verifies{}",
                    skipped
                        .iter()
                        .map(|(p, why)| format!("; {}: {why}", p.display()))
                        .collect::<String>()
                ))
            })?;
            (location, r, skipped)
        }
    };
    let is_own = own.is_some_and(|o| o.to_string() == prefix.to_string());
    Ok((restored, skipped, Some(is_own)))
}

/// Reads the final checkpoints of the old members `from` for a rescale: none may be
/// running (each line's lock is free), each must verify and be final, all must come
/// from one job graph, and no split may be in two of them. With a store, each old
/// member's newest checkpoint that verifies is downloaded into `.rescale/` of this
/// member's own line, `own_root` (whose lock this process holds, so that members
/// started together on one machine never share a download); the lock is then checked
/// only for old members whose local directory is on this machine (a store has no
/// lock).
async fn rescale_set(
    job: &JobGraph,
    base: &std::path::Path,
    own_root: &std::path::Path,
    store: Option<&StoreLocation>,
    from: &[Member],
) -> Result<RestoreSet> {
    let mut parts: Vec<Restored> = Vec::new();
    // Held while the checkpoints are read: an old member started meanwhile waits.
    let mut held = Vec::new();
    let mut splits = HashSet::new();
    for m in from {
        let dir = lines::line_dir(base, *m);
        if store.is_none() || dir.is_dir() {
            match tokio::task::block_in_place(|| lockgate_state::lock::ReadLock::acquire(&dir)) {
                Ok(lock) => held.push(lock),
                Err(e) => {
                    return Err(JobError::Restore(format!(
                        "--rescale-from {}: {m} still runs or cannot be checked: {e}",
                        from.len()
                    )))
                }
            }
        }
        let (r, skipped, shown) = match store {
            None => {
                let (r, skipped) = tokio::task::block_in_place(|| resolve_restore_path(&dir))
                    .map_err(JobError::Restore)?;
                (r, skipped, dir.display().to_string())
            }
            Some(s) => {
                let line = match m.line() {
                    Some(l) => s.join(&l),
                    None => s.clone(),
                };
                let into = own_root
                    .join(".rescale")
                    .join(m.line().unwrap_or_else(|| "solo".into()));
                let (restored, skipped) = newest_in_store(&line, &into).await?;
                let r = restored.ok_or_else(|| {
                    JobError::Restore(format!(
                        "--rescale-from {}: {line} holds no checkpoint that verifies{}",
                        from.len(),
                        skipped
                            .iter()
                            .map(|(p, why)| format!("; {}: {why}", p.display()))
                            .collect::<String>()
                    ))
                })?;
                (r, skipped, line.to_string())
            }
        };
        for (path, why) in &skipped {
            warn!(checkpoint = %path.display(), reason = %why, "skipping checkpoint that does not verify");
        }
        if !r.metadata.is_final {
            return Err(JobError::Restore(format!(
                "--rescale-from {}: the newest checkpoint of {} that verifies ({}) is not a final one; start the old members again and stop each with SIGTERM",
                from.len(),
                shown,
                r.path.display()
            )));
        }
        if let Some(first) = parts.first() {
            let (a, b) = (&first.metadata, &r.metadata);
            if (a.fingerprint, a.max_parallelism) != (b.fingerprint, b.max_parallelism) {
                return Err(JobError::Restore(format!(
                    "--rescale-from {}: {} and {} come from different job graphs",
                    from.len(),
                    first.path.display(),
                    r.path.display()
                )));
            }
        }
        for p in &r.metadata.positions {
            if !splits.insert((p.stream.clone(), p.partition)) {
                return Err(JobError::Restore(format!(
                    "--rescale-from {}: {}/{} is in two old members' checkpoints (the last: {}); they are not one run",
                    from.len(),
                    p.stream,
                    p.partition,
                    r.path.display()
                )));
            }
        }
        parts.push(r);
    }
    drop(held);
    Ok(RestoreSet {
        parts,
        keep: member_share(job, true),
    })
}

/// The newest checkpoint of the store at `location` that verifies (downloaded into
/// `into`), and the ones skipped with why.
async fn newest_in_store(
    location: &lockgate_state::store::StoreLocation,
    into: &std::path::Path,
) -> Result<(Option<Restored>, Vec<(PathBuf, String)>)> {
    let found = CheckpointStore::new(location)?.newest(into).await?;
    let skipped = found
        .skipped
        .into_iter()
        .map(|(u, why)| (PathBuf::from(u), why))
        .collect();
    Ok((found.restored, skipped))
}

/// Refuses a checkpoint of another job unless non-restored state is allowed
/// ([`compatibility`]).
pub(super) fn check_compatible(
    job: &JobGraph,
    meta: &CheckpointMetadata,
    allow: bool,
) -> Result<()> {
    match compatibility(
        (&meta.job_name, meta.fingerprint, meta.max_parallelism),
        (&job.name, job.fingerprint(), job.max_parallelism),
        allow,
    ) {
        Ok(None) => Ok(()),
        Ok(Some(warning)) => {
            warn!("checkpoint {} {warning}", meta.id);
            Ok(())
        }
        Err(why) => Err(JobError::Restore(format!(
            "checkpoint {} {why} (this job: {})",
            meta.id,
            job.describe()
        ))),
    }
}

/// `(subtask, inline state)` of every subtask of `uid` in `set`, old members' subtasks
/// numbered one after the other (old member `k`'s subtask `j` follows the subtasks of
/// members `0..k`).
fn inline_states(set: &RestoreSet, uid: &str) -> Vec<(u16, Vec<u8>)> {
    set.parts
        .iter()
        .scan(0u16, |next, r| {
            let offset = *next;
            *next += r.metadata.parallelism;
            Some((offset, r))
        })
        .flat_map(|(offset, r)| {
            r.metadata
                .subtasks
                .iter()
                .filter(move |s| s.operator == uid)
                .map(move |s| (offset + s.subtask, s.inline_state.clone()))
        })
        .collect()
}

/// The sources' own states of the restored checkpoint, numbered as
/// [`sink_restore`] numbers the sinks' (`None`: a fresh start, where
/// `Source::restore_state` is not called).
pub(super) fn source_restore(restored: Option<&RestoreSet>) -> Option<Vec<(u16, Vec<u8>)>> {
    restored.map(|set| inline_states(set, SOURCE_UID))
}

/// The sinks' states of the restored checkpoint. In a rescale, the old members' sink
/// subtasks are numbered one after the other (old member `k`'s subtask `j` follows the
/// subtasks of members `0..k`), and the checkpoint id is the newest of them.
pub(super) fn sink_restore(restored: Option<&RestoreSet>) -> SinkRestore {
    match restored {
        None => SinkRestore::default(),
        Some(set) => SinkRestore {
            checkpoint: Some(set.newest().metadata.id),
            states: inline_states(set, SINK_UID),
            parallelism: set.parts.iter().map(|r| r.metadata.parallelism).sum(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockgate_state::StateError;

    /// A checkpoint of `parallelism` subtasks with a sink state per subtask (`[id, i]`)
    /// and the positions of `splits`.
    fn part(id: u64, parallelism: u16, splits: &[i32]) -> Restored {
        let sink = |i: u16| lockgate_state::SubtaskSnapshot {
            operator: SINK_UID.into(),
            subtask: i,
            key_groups: None,
            state_dir: None,
            files: Vec::new(),
            inline_state: vec![id as u8, i as u8],
        };
        let mut keyed = sink(0);
        keyed.operator = "rolling_sum-0".into();
        Restored {
            path: PathBuf::from(format!("chk-{id}")),
            metadata: CheckpointMetadata {
                id: CheckpointId(id),
                job_name: "j".into(),
                fingerprint: 7,
                created_ms: id,
                parallelism,
                max_parallelism: 128,
                is_final: true,
                subtasks: std::iter::once(keyed)
                    .chain((0..parallelism).map(sink))
                    .collect(),
                positions: splits
                    .iter()
                    .map(|&p| {
                        lockgate_state::SourcePosition::new(
                            "orders",
                            p,
                            lockgate_state::NextOffset(10 * i64::from(p)),
                        )
                    })
                    .collect(),
            },
        }
    }

    #[test]
    fn sink_states_of_a_rescale_are_numbered_member_after_member() {
        let fresh = sink_restore(None);
        assert!(fresh.checkpoint.is_none() && fresh.states.is_empty() && fresh.parallelism == 0);
        // Old member 0 ran 2 subtasks, old member 1 ran 3: member 1's subtask j is 2 + j.
        let set = RestoreSet {
            parts: vec![part(5, 2, &[0, 1]), part(7, 3, &[2])],
            keep: None,
        };
        let r = sink_restore(Some(&set));
        assert_eq!(r.checkpoint, Some(CheckpointId(7)), "the newest part's id");
        assert_eq!(r.parallelism, 5);
        assert_eq!(
            r.states,
            vec![
                (0, vec![5, 0]),
                (1, vec![5, 1]),
                (2, vec![7, 0]),
                (3, vec![7, 1]),
                (4, vec![7, 2]),
            ],
            "only the sink's subtasks, each once"
        );
    }

    #[test]
    fn source_states_are_every_old_subtask_s_numbered_member_after_member_and_none_fresh() {
        assert_eq!(
            source_restore(None),
            None,
            "a fresh start restores no state"
        );
        // Old member 0 ran 2 subtasks, old member 1 ran 3; only some kept a state.
        let with_source = |mut r: Restored, subtasks: &[u16]| {
            r.metadata
                .subtasks
                .extend(subtasks.iter().map(|&i| lockgate_state::SubtaskSnapshot {
                    operator: SOURCE_UID.into(),
                    subtask: i,
                    key_groups: None,
                    state_dir: None,
                    files: Vec::new(),
                    inline_state: vec![b's', r.metadata.id.0 as u8, i as u8],
                }));
            r
        };
        let set = RestoreSet {
            parts: vec![
                with_source(part(5, 2, &[0, 1]), &[0, 1]),
                with_source(part(7, 3, &[2]), &[1]),
            ],
            keep: None,
        };
        assert_eq!(
            source_restore(Some(&set)),
            Some(vec![
                (0, vec![b's', 5, 0]),
                (1, vec![b's', 5, 1]),
                (3, vec![b's', 7, 1])
            ]),
            "the sources' states only, each once"
        );
        assert_eq!(sink_restore(Some(&set)).states.len(), 5, "the sinks' apart");
        // A restore whose checkpoint holds no source state still restores (an empty list).
        let set = RestoreSet::one(part(3, 2, &[0]));
        assert_eq!(source_restore(Some(&set)), Some(Vec::new()));
    }

    #[test]
    fn a_restore_set_holds_every_part_s_positions_and_stands_for_its_newest() {
        let set = RestoreSet {
            parts: vec![part(9, 1, &[0, 1]), part(4, 1, &[2])],
            keep: None,
        };
        let mut splits: Vec<(String, i32, i64)> = set
            .positions()
            .into_iter()
            .map(|p| (p.stream, p.partition, p.next.0))
            .collect();
        splits.sort();
        assert_eq!(
            splits,
            [
                ("orders".into(), 0, 0),
                ("orders".into(), 1, 10),
                ("orders".into(), 2, 20)
            ]
        );
        assert_eq!(set.newest().metadata.id, CheckpointId(9));
        assert_eq!(RestoreSet::one(part(3, 1, &[])).parts.len(), 1);
    }

    #[test]
    fn only_transient_start_failures_are_retried() {
        let io = |kind| {
            JobError::State(StateError::Io {
                op: "create",
                path: "d".into(),
                source: std::io::Error::from(kind),
            })
        };
        let store = |op, message: &str| {
            JobError::State(StateError::Store {
                op,
                key: "s3://b/p".into(),
                message: message.into(),
            })
        };
        // A download removed midway, a store that did not answer: retried.
        assert!(start_failure_is_retried(&io(std::io::ErrorKind::NotFound)));
        assert!(start_failure_is_retried(&store(
            "read",
            "error sending request"
        )));
        // A permission problem, a misconfigured or unauthorized store, a refusal: not.
        assert!(!start_failure_is_retried(&io(
            std::io::ErrorKind::PermissionDenied
        )));
        assert!(!start_failure_is_retried(&io(
            std::io::ErrorKind::InvalidData
        )));
        assert!(!start_failure_is_retried(&store("configure", "bad url")));
        assert!(!start_failure_is_retried(&store(
            "list",
            "The operation lacked valid authentication credentials for path p"
        )));
        assert!(!start_failure_is_retried(&JobError::State(
            StateError::Locked {
                path: "d".into(),
                holder: "pid 7".into()
            }
        )));
        assert!(!start_failure_is_retried(&JobError::Restore(
            "another job".into()
        )));
    }
}
