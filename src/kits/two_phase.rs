//! The two-phase-commit kit (Flink's `SinkWriter` + `SupportsCommitter`): a sink that
//! stages its output at each barrier and makes it visible only once the checkpoint
//! that names it is complete, so that what becomes visible is exactly once.
//!
//! A connector implements [`TwoPhaseWriter`] (write, stage at the barrier, commit,
//! abort what was abandoned) and wraps it in [`TwoPhaseSink`], which does the rest:
//!
//! - **At barrier `N`** the writer's [`TwoPhaseWriter::prepare_commit`] makes what it
//!   wrote since the last barrier durable but invisible and returns a *committable*
//!   naming it. The kit keeps every committable not yet known to be committed in the
//!   checkpoint's state.
//! - **When checkpoint `N` completes** the kit commits, in checkpoint order, every
//!   committable of checkpoints up to `N` (a lost notification is made up by the next).
//!   A writer that can commit off its task ([`TwoPhaseWriter::committer`]) has them
//!   committed in the background while it takes the next records: they stay in the
//!   state of every later checkpoint until their commit returned, so a crash before
//!   that commits them again on restore; a failed background commit fails the next
//!   `invoke` or `snapshot` that finds it ended, or the next notification or close,
//!   which wait for it.
//! - **On restore from checkpoint `K`** the kit commits every committable `K` names
//!   (the notification may have been lost in a crash; committing again must be a
//!   success, see [`TwoPhaseWriter::commit`]), then asks the writer to abort what it
//!   staged or committed after `K` ([`TwoPhaseWriter::abort_abandoned`]): those
//!   records are about to be written again.
//! - **Rescale.** The committables of old subtask `j` are committed by subtask
//!   `j % parallelism`, so a restore at another parallelism leaves nothing behind.
//!
//! The kit counts `lockgate_records_out_total` for the sink and hits the failpoints
//! `after-stage` when a barrier staged output (before the checkpoint can complete),
//! `before-part-commit` and `after-part-commit` around each commit of a completed
//! checkpoint.
//!
//! The state kept in a checkpoint is `{ pending: [committable, ...] }` in bincode 2
//! (standard configuration, serde): a committable's serde form is part of the
//! checkpoint format and must stay readable by later versions.

use crate::clients::kafka::KafkaCluster;
use crate::connector::{Sink, SinkRestore, SubtaskInfo};
use crate::dead_letter::{Letters, LettersOf, OnError, Reason};
use crate::error::{JobError, Result};
use crate::record::{Batch, Record};
use async_trait::async_trait;
use lockgate_state::CheckpointId;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fmt::Debug;
use std::sync::Arc;

/// The writer of a two-phase sink: what a connector implements.
///
/// Calls come from one task, in the order of [`Sink`]'s lifecycle: `open` once (after
/// the kit decoded the restored state, before it commits anything), `write` and
/// `prepare_commit` interleaved, `commit` for restored committables right after `open`
/// and for staged ones when their checkpoint completes (unless a
/// [`TwoPhaseWriter::committer`] commits those off the task), `abort_abandoned` once
/// after the restored committables are committed, `close` on a clean finish.
#[async_trait]
pub trait TwoPhaseWriter: Send + 'static {
    /// What one `prepare_commit` staged: small (names, ids), kept in checkpoints.
    type Committable: Serialize + DeserializeOwned + Clone + Debug + Send + Sync + 'static;

    /// What the sink is called in errors about its state (`file sink`).
    fn kind(&self) -> &'static str {
        "two-phase sink"
    }

    /// The subtask whose output `c` is, when the committable says: the restored
    /// committables of subtask `s` are committed by subtask `s % parallelism`. `None`
    /// (the default): by the old subtask whose state held it.
    fn subtask_of(&self, _c: &Self::Committable) -> Option<u16> {
        None
    }

    /// Opens the subtask. `restored` is the checkpoint restored (None on a fresh
    /// start) and `to_commit` the committables this subtask is about to commit from
    /// it. Refuse here a restore that cannot be honoured (the output location never
    /// held this job's output), before anything is committed.
    async fn open(
        &mut self,
        info: &SubtaskInfo,
        restored: Option<CheckpointId>,
        to_commit: &[Self::Committable],
    ) -> Result<()>;

    /// Whether the destination can take `record`; `Err(why)`: it cannot (a value its
    /// column refuses, a row too large). The sink's item error policy then decides
    /// ([`TwoPhaseSink::on_item_error`]): the job fails naming the record, or the
    /// record is skipped or written to a dead-letter topic, and the rest of the batch
    /// is written. A record that `write` fails on instead fails the attempt, and the
    /// restart meets it again until the restart policy gives up. Default: every record
    /// can be written.
    fn check(&self, _record: &Record) -> std::result::Result<(), String> {
        Ok(())
    }

    /// The records of `batch` the destination cannot take, by index, with why: the
    /// kit calls it with each batch, then [`TwoPhaseWriter::write`] with the records
    /// it did not name, in order. A writer that converts a whole batch at once (into
    /// columns, say) overrides it to convert here and keep the result for the `write`
    /// that follows. Default: [`TwoPhaseWriter::check`] of each record.
    fn check_batch(&mut self, batch: &Batch) -> Vec<(usize, String)> {
        batch
            .iter()
            .enumerate()
            .filter_map(|(i, r)| self.check(r).err().map(|why| (i, why)))
            .collect()
    }

    /// Writes a batch into the current, invisible stage (or holds it in memory, see
    /// [`TwoPhaseWriter::buffered_bytes`]). The batch holds only records
    /// [`TwoPhaseWriter::check`] accepted.
    async fn write(&mut self, batch: &Batch) -> Result<()>;

    /// The bytes `write` holds in memory and has not put into the stage yet (rows
    /// waiting to go as one statement, say). The kit counts them in
    /// `lockgate_buffered_bytes{stage="sink"}` and calls [`TwoPhaseWriter::flush`]
    /// when they pass the sink's bound ([`TwoPhaseSink::with_buffer_bound`]), so that
    /// memory does not grow with the records between two barriers. Default 0: `write`
    /// puts everything into the stage before it returns.
    fn buffered_bytes(&self) -> usize {
        0
    }

    /// Puts what `write` holds in memory into the stage, still invisible. Default:
    /// nothing is held.
    async fn flush(&mut self) -> Result<()> {
        Ok(())
    }

    /// Barrier `id`: makes everything written since the last barrier durable, still
    /// invisible, and returns what names it (None: nothing was written). After this
    /// returns, a crash must not lose what it names.
    async fn prepare_commit(&mut self, id: CheckpointId) -> Result<Option<Self::Committable>>;

    /// Makes `c` visible. Idempotent: a committable that is already committed (the
    /// crash came after the commit, before the checkpoint knew) is a success. A
    /// committable that is neither staged nor committed is an error: a checkpoint
    /// named it as durable, so its absence is lost data.
    async fn commit(&mut self, c: &Self::Committable) -> Result<()>;

    /// What commits this writer's committables off its task, when it can (called once
    /// the writer is open): the kit then commits a completed checkpoint's committables
    /// with it in the background, in order, one notification's committables (every
    /// pending one up to the checkpoint completed) at a time, while `write` and
    /// `prepare_commit` go on. Its commit has the contract of
    /// [`TwoPhaseWriter::commit`], and must not need what the writer does meanwhile
    /// (it commits what earlier barriers staged). Default None: the sink's task
    /// commits, and waits.
    fn committer(&self) -> Option<Arc<dyn Commit<Self::Committable>>> {
        None
    }

    /// After a restore from `restored` (None: a fresh start), once this subtask
    /// committed its share: aborts whatever this subtask staged that the restored
    /// checkpoint does not name (work of a newer checkpoint that never completed) and
    /// takes back what it committed after `restored` (its records are written again).
    /// `named` is everything the restored checkpoint names, every subtask's share
    /// included (others may not have committed theirs yet): none of it may be touched.
    async fn abort_abandoned(
        &mut self,
        restored: Option<CheckpointId>,
        named: &[Self::Committable],
    ) -> Result<()>;

    /// No checkpoint older than `oldest` can be restored any more (see
    /// [`Sink::notify_restorable_from`]): what the writer keeps only to commit again or
    /// take back the output of older checkpoints (commit records in the destination,
    /// say) may go. By default nothing is kept, nothing done.
    async fn restorable_from(&mut self, _oldest: CheckpointId) -> Result<()> {
        Ok(())
    }

    /// The state of a checkpoint: `pending` in checkpoint order. Default: the kit's
    /// [`encode_state`]. A writer whose committable changed form writes its own
    /// ([`encode_versioned`]) and reads the old one in
    /// [`TwoPhaseWriter::decode_committables`].
    fn encode_committables(
        &self,
        pending: Vec<Self::Committable>,
    ) -> std::result::Result<Vec<u8>, String> {
        encode_state(pending)
    }

    /// Reads one subtask's state of a restored checkpoint, called before `open`: what
    /// [`TwoPhaseWriter::encode_committables`] wrote, now or in an earlier version.
    /// Default: the kit's [`decode_state`].
    fn decode_committables(
        &self,
        bytes: &[u8],
    ) -> std::result::Result<Vec<Self::Committable>, String> {
        decode_state(bytes)
    }

    /// Releases resources on a clean finish (after the final checkpoint completed):
    /// anything written after the final barrier cannot exist, an empty stage can.
    async fn close(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Commits committables off the writer's task ([`TwoPhaseWriter::committer`]).
#[async_trait]
pub trait Commit<C>: Send + Sync + 'static {
    /// Makes `c` visible, as [`TwoPhaseWriter::commit`] does (idempotent; a committable
    /// neither staged nor committed is an error).
    async fn commit(&self, c: &C) -> Result<()>;
}

/// A background commit: the committables of checkpoints up to `upto`, in order.
struct InFlight {
    upto: CheckpointId,
    handle: tokio::task::JoinHandle<Result<()>>,
}

#[derive(Serialize, Deserialize)]
#[serde(bound = "C: Serialize + DeserializeOwned")]
struct KitState<C> {
    pending: Vec<C>,
}

fn bincode_config() -> impl bincode::config::Config {
    bincode::config::standard()
}

/// Encodes the kit's state for a checkpoint: `pending` in order.
pub fn encode_state<C: Serialize + DeserializeOwned>(
    pending: Vec<C>,
) -> std::result::Result<Vec<u8>, String> {
    bincode::serde::encode_to_vec(KitState { pending }, bincode_config()).map_err(|e| e.to_string())
}

/// Decodes one subtask's state from a checkpoint.
pub fn decode_state<C: Serialize + DeserializeOwned>(
    bytes: &[u8],
) -> std::result::Result<Vec<C>, String> {
    let (state, _): (KitState<C>, _) =
        bincode::serde::decode_from_slice(bytes, bincode_config()).map_err(|e| e.to_string())?;
    Ok(state.pending)
}

/// The first byte of a versioned state ([`encode_versioned`]): bincode's varints never
/// begin with it, so a state written before versions, which begins with the varint
/// length of `pending`, is told apart.
pub const VERSIONED: u8 = 0xFF;

/// [`encode_state`] after [`VERSIONED`] and `version`.
pub fn encode_versioned<C: Serialize + DeserializeOwned>(
    version: u8,
    pending: Vec<C>,
) -> std::result::Result<Vec<u8>, String> {
    let mut out = vec![VERSIONED, version];
    out.extend(encode_state(pending)?);
    Ok(out)
}

/// The version and the rest of a state [`encode_versioned`] wrote; None for a state
/// written before versions (read it with [`decode_state`]).
pub fn versioned(bytes: &[u8]) -> Option<(u8, &[u8])> {
    match bytes {
        [VERSIONED, version, rest @ ..] => Some((*version, rest)),
        _ => None,
    }
}

/// Which committables of a restored checkpoint subtask `index` (of `parallelism`)
/// commits: those whose subtask `s` (`owner`, else the old subtask whose state held
/// them) has `s % parallelism == index`, in the order of the old subtasks and of
/// their checkpoints.
pub fn restored_share<C: Clone>(
    states: &[(u16, Vec<C>)],
    index: u16,
    parallelism: u16,
    owner: impl Fn(&C) -> Option<u16>,
) -> Vec<C> {
    let mut sorted: Vec<&(u16, Vec<C>)> = states.iter().collect();
    sorted.sort_by_key(|(j, _)| *j);
    sorted
        .into_iter()
        .flat_map(|(j, c)| c.iter().map(move |c| (*j, c)))
        .filter(|(j, c)| owner(c).unwrap_or(*j) % parallelism.max(1) == index)
        .map(|(_, c)| c.clone())
        .collect()
}

/// What a writer may hold in memory between two flushes by default: 64 MiB.
pub const DEFAULT_BUFFER_BOUND: usize = 64 << 20;

/// A [`Sink`] made of a [`TwoPhaseWriter`]: exactly-once output, see the module docs.
pub struct TwoPhaseSink<W: TwoPhaseWriter> {
    writer: W,
    /// Staged and not yet known to be committed, in checkpoint order.
    pending: Vec<(CheckpointId, W::Committable)>,
    records_out: Option<prometheus::IntCounter>,
    /// The subtask's name, for errors.
    name: String,
    /// The writer's buffer is flushed once it holds more than this.
    bound: usize,
    /// The writer's buffered bytes, as last seen, for the buffered-bytes gauge.
    buffered: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// What becomes of a record the writer's `check` refuses, and where dead letters go.
    on_item_error: OnError,
    letters_cluster: Option<KafkaCluster>,
    letters: Letters,
    /// The writer's background committer, once open.
    committer: Option<Arc<dyn Commit<W::Committable>>>,
    /// The background commit running, if any.
    in_flight: Option<InFlight>,
}

/// The reason of the dead letters of a two-phase sink: a record the destination
/// cannot take.
pub const LETTERS: &[Reason] = &[Reason::InvalidDocument];

impl<W: TwoPhaseWriter> TwoPhaseSink<W> {
    /// The sink of `writer`, whose buffer is flushed past [`DEFAULT_BUFFER_BOUND`].
    pub fn new(writer: W) -> TwoPhaseSink<W> {
        TwoPhaseSink {
            writer,
            pending: Vec::new(),
            records_out: None,
            name: String::new(),
            bound: DEFAULT_BUFFER_BOUND,
            buffered: Default::default(),
            on_item_error: OnError::Fail,
            letters_cluster: None,
            letters: Letters::default(),
            committer: None,
            in_flight: None,
        }
    }

    /// Takes in the background commit once it has returned (or waits for it, with
    /// `wait`): its committables leave `pending`, or its error is this call's.
    async fn reap(&mut self, wait: bool) -> Result<()> {
        let Some(f) = self.in_flight.take_if(|f| wait || f.handle.is_finished()) else {
            return Ok(());
        };
        let done = f
            .handle
            .await
            .map_err(|e| JobError::task(&self.name, format!("commit: {e}")))?;
        done?;
        self.pending.retain(|(p, _)| *p > f.upto);
        Ok(())
    }

    /// Records [`TwoPhaseWriter::check`] refuses follow `policy` (the section's
    /// `on_item_error`, parsed by `SectionContext::error_policy` within
    /// `Allowed::ITEM`); its dead letters go to `cluster` (the source's Kafka cluster,
    /// `SectionContext::dead_letter_cluster`). Without this, or under `fail`, a refused
    /// record fails the attempt with a message naming it (and the restart meets it
    /// again); under `skip` (not a spelling of a section's `on_item_error`) it is
    /// dropped and counted.
    pub fn on_item_error(
        mut self,
        policy: OnError,
        cluster: Option<KafkaCluster>,
    ) -> TwoPhaseSink<W> {
        self.on_item_error = policy;
        self.letters_cluster = cluster;
        self
    }

    /// The records of `batch` the writer can take; the others follow the item error
    /// policy (an error when it fails the job).
    fn accepted(&mut self, batch: Batch) -> Result<Batch> {
        let refused = self.writer.check_batch(&batch);
        if refused.is_empty() {
            return Ok(batch);
        }
        let kind = self.writer.kind();
        for (i, why) in &refused {
            let record = &batch[*i];
            let message = format!(
                "{} cannot be written by the {kind}: {why}",
                crate::record::describe(record)
            );
            self.letters
                .refuse(
                    &self.on_item_error,
                    record,
                    message,
                    Reason::InvalidDocument,
                    "skipping a record the sink cannot write",
                )
                .map_err(|e| JobError::task(&self.name, e))?;
        }
        let mut refused = refused.into_iter().map(|(i, _)| i).peekable();
        Ok(batch
            .into_iter()
            .enumerate()
            .filter(|(i, _)| refused.next_if_eq(i).is_none())
            .map(|(_, r)| r)
            .collect())
    }

    /// Flushes the writer's buffer once it holds more than `bytes`
    /// ([`TwoPhaseWriter::buffered_bytes`]).
    pub fn with_buffer_bound(mut self, bytes: usize) -> TwoPhaseSink<W> {
        self.bound = bytes;
        self
    }

    fn count_buffered(&self) {
        self.buffered.store(
            self.writer.buffered_bytes(),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// The writer, for tests.
    pub fn writer(&self) -> &W {
        &self.writer
    }
}

#[async_trait]
impl<W: TwoPhaseWriter> Sink for TwoPhaseSink<W> {
    async fn open(&mut self, info: &SubtaskInfo, restored: &SinkRestore) -> Result<()> {
        let m = info.telemetry.metrics();
        self.records_out =
            Some(m.task_counter(&m.records_out, crate::connector::SINK_UID, info.index));
        let part: std::sync::Arc<dyn crate::telemetry::metrics::Buffered> = self.buffered.clone();
        m.count_buffered(crate::telemetry::metrics::Stage::Sink, &part);
        self.letters.open(
            LettersOf {
                task: info.name.clone(),
                what: "the sink",
                metrics: m,
                operator: crate::connector::SINK_UID,
                subtask: info.index,
                reasons: LETTERS,
            },
            &[&self.on_item_error],
            self.letters_cluster
                .as_ref()
                .map(|k| (k.bootstrap_servers.as_str(), &k.properties)),
        )?;
        self.name = info.name.clone();
        let kind = self.writer.kind();
        let states = restored
            .states
            .iter()
            .map(|(j, bytes)| {
                let c = self
                    .writer
                    .decode_committables(bytes)
                    .map_err(|e| JobError::Restore(format!("{kind} state: {e}")))?;
                Ok((*j, c))
            })
            .collect::<Result<Vec<_>>>()?;
        let writer = &self.writer;
        let mine = restored_share(&states, info.index, info.parallelism, |c| {
            writer.subtask_of(c)
        });
        self.writer.open(info, restored.checkpoint, &mine).await?;
        // Commit first: what the checkpoint names is durable output.
        for c in &mine {
            self.writer.commit(c).await?;
        }
        let named: Vec<W::Committable> = states.into_iter().flat_map(|(_, c)| c).collect();
        self.writer
            .abort_abandoned(restored.checkpoint, &named)
            .await?;
        self.pending.clear();
        self.committer = self.writer.committer();
        tracing::info!(subtask = %info.name, committed_on_restore = mine.len(), "two-phase sink opened");
        Ok(())
    }

    async fn invoke(&mut self, batch: Batch) -> Result<()> {
        self.reap(false).await?;
        let batch = self.accepted(batch)?;
        if batch.is_empty() {
            // Every record refused: nothing to stage (no empty part file).
            return Ok(());
        }
        self.writer.write(&batch).await?;
        if self.writer.buffered_bytes() > self.bound {
            self.writer.flush().await?;
        }
        self.count_buffered();
        if let Some(c) = &self.records_out {
            c.inc_by(batch.len() as u64);
        }
        Ok(())
    }

    async fn snapshot(&mut self, id: CheckpointId) -> Result<Vec<u8>> {
        // A commit still running leaves its committables in this state: a restore
        // from it commits them again, which a commit allows.
        self.reap(false).await?;
        let staged = self.writer.prepare_commit(id).await;
        self.count_buffered();
        if let Some(c) = staged? {
            crate::fault::hit("after-stage");
            if let Some((last, _)) = self.pending.last().filter(|(p, _)| *p >= id) {
                // A second stage under one id would overwrite the first.
                return Err(JobError::task(
                    &self.name,
                    format!("checkpoint {id} staged after checkpoint {last}: ids must grow"),
                ));
            }
            self.pending.push((id, c));
        }
        self.writer
            .encode_committables(self.pending.iter().map(|(_, c)| c.clone()).collect())
            .map_err(|e| JobError::task(&self.name, format!("encode state: {e}")))
    }

    async fn notify_checkpoint_complete(&mut self, id: CheckpointId) -> Result<()> {
        // Checkpoints commit in order: the one before first.
        self.reap(true).await?;
        if let Some(committer) = &self.committer {
            let due: Vec<W::Committable> = self
                .pending
                .iter()
                .take_while(|(p, _)| *p <= id)
                .map(|(_, c)| c.clone())
                .collect();
            if due.is_empty() {
                return Ok(());
            }
            let committer = committer.clone();
            let handle = tokio::spawn(async move {
                for c in &due {
                    crate::fault::hit("before-part-commit");
                    committer.commit(c).await?;
                    crate::fault::hit("after-part-commit");
                }
                Ok(())
            });
            self.in_flight = Some(InFlight { upto: id, handle });
            return Ok(());
        }
        // Committed one at a time, each removed once done: a failure leaves the rest
        // pending, and the next checkpoint or restore commits them.
        while let Some((p, _)) = self.pending.first() {
            if *p > id {
                break;
            }
            let c = self.pending[0].1.clone();
            crate::fault::hit("before-part-commit");
            self.writer.commit(&c).await?;
            self.pending.remove(0);
            crate::fault::hit("after-part-commit");
        }
        Ok(())
    }

    async fn notify_restorable_from(&mut self, oldest: CheckpointId) -> Result<()> {
        // What the writer may forget must not be what a commit still running needs.
        self.reap(true).await?;
        self.writer.restorable_from(oldest).await
    }

    async fn close(&mut self) -> Result<()> {
        // The final checkpoint's output is visible before the sink says it is done.
        self.reap(true).await?;
        self.writer.close().await
    }
}

impl<W: TwoPhaseWriter> Drop for TwoPhaseSink<W> {
    /// An attempt that ends without a close (failed, cancelled) stops its background
    /// commit, as it stops a commit on its task: the next attempt's restore commits
    /// what it names again and takes back what it does not.
    fn drop(&mut self) {
        if let Some(f) = &self.in_flight {
            f.handle.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Part {
        subtask: u16,
        id: CheckpointId,
    }

    #[test]
    fn a_committable_struct_encodes_as_the_tuple_of_its_fields() {
        // The file sink's checkpoints hold `(u16, CheckpointId)` pairs: a struct of the
        // same fields in the same order reads them.
        let old = bincode::serde::encode_to_vec(
            KitState {
                pending: vec![(3u16, CheckpointId(9))],
            },
            bincode_config(),
        )
        .unwrap();
        assert_eq!(
            decode_state::<Part>(&old).unwrap(),
            vec![Part {
                subtask: 3,
                id: CheckpointId(9)
            }]
        );
    }

    #[test]
    fn a_versioned_state_is_told_apart_from_one_before_versions() {
        for n in [0usize, 1, 250, 251, 70_000] {
            let old = encode_state(vec![0u8; n]).unwrap();
            assert_eq!(versioned(&old), None, "{n} committables");
        }
        let new = encode_versioned(3, vec![7u32]).unwrap();
        let (v, rest) = versioned(&new).unwrap();
        assert_eq!(v, 3);
        assert_eq!(decode_state::<u32>(rest).unwrap(), vec![7]);
    }

    #[test]
    fn each_old_subtask_is_committed_by_exactly_one_new_one() {
        let states: Vec<(u16, Vec<u32>)> = (0..5).map(|j| (j, vec![u32::from(j) * 10])).collect();
        for p in 1..7u16 {
            let mut all: Vec<u32> = (0..p)
                .flat_map(|i| restored_share(&states, i, p, |_| None))
                .collect();
            all.sort();
            assert_eq!(all, vec![0, 10, 20, 30, 40], "parallelism {p}");
        }
        assert_eq!(restored_share(&states, 1, 2, |_| None), vec![10, 30]);
        // A committable that names its subtask goes by it, whichever state held it.
        let odd = |c: &u32| Some((c / 10) as u16 + 1);
        assert_eq!(restored_share(&states, 1, 2, odd), vec![0, 20, 40]);
    }

    /// A writer into memory: what it did, in order.
    #[derive(Default, Clone)]
    struct Log(Arc<Mutex<Vec<String>>>);

    struct MemWriter {
        log: Log,
        stage: Vec<String>,
        fail_commit: bool,
        background: Option<Arc<Gated>>,
    }

    /// A background committer that commits once the test lets it (a permit per
    /// committable), or refuses.
    struct Gated {
        log: Log,
        gate: tokio::sync::Semaphore,
        fail: bool,
    }

    #[async_trait]
    impl Commit<(u64, Vec<String>)> for Gated {
        async fn commit(&self, c: &(u64, Vec<String>)) -> Result<()> {
            self.gate.acquire().await.unwrap().forget();
            if self.fail {
                return Err(JobError::task("sink-0", "commit refused"));
            }
            let line = format!("background commit {} {}", c.0, c.1.join(","));
            self.log.0.lock().unwrap().push(line);
            Ok(())
        }
    }

    #[async_trait]
    impl TwoPhaseWriter for MemWriter {
        type Committable = (u64, Vec<String>);
        async fn open(
            &mut self,
            _: &SubtaskInfo,
            restored: Option<CheckpointId>,
            to_commit: &[Self::Committable],
        ) -> Result<()> {
            self.log.0.lock().unwrap().push(format!(
                "open {:?} {}",
                restored.map(|c| c.0),
                to_commit.len()
            ));
            Ok(())
        }
        fn check(&self, record: &crate::record::Record) -> std::result::Result<(), String> {
            match record.value.starts_with(b"bad") {
                true => Err("a bad value".into()),
                false => Ok(()),
            }
        }

        async fn write(&mut self, batch: &Batch) -> Result<()> {
            assert!(
                batch.iter().all(|r| !r.value.starts_with(b"bad")),
                "the kit hands write only records check accepts"
            );
            self.stage.extend(
                batch
                    .iter()
                    .map(|r| String::from_utf8_lossy(&r.value).into_owned()),
            );
            Ok(())
        }
        async fn prepare_commit(&mut self, id: CheckpointId) -> Result<Option<Self::Committable>> {
            Ok((!self.stage.is_empty()).then(|| (id.0, std::mem::take(&mut self.stage))))
        }
        fn committer(&self) -> Option<Arc<dyn Commit<Self::Committable>>> {
            self.background
                .clone()
                .map(|g| g as Arc<dyn Commit<Self::Committable>>)
        }
        async fn commit(&mut self, c: &Self::Committable) -> Result<()> {
            if self.fail_commit {
                return Err(JobError::task("sink-0", "commit refused"));
            }
            self.log
                .0
                .lock()
                .unwrap()
                .push(format!("commit {} {}", c.0, c.1.join(",")));
            Ok(())
        }
        async fn abort_abandoned(
            &mut self,
            restored: Option<CheckpointId>,
            named: &[Self::Committable],
        ) -> Result<()> {
            self.log.0.lock().unwrap().push(format!(
                "abort after {:?} keeping {}",
                restored.map(|c| c.0),
                named.len()
            ));
            Ok(())
        }
    }

    fn batch(values: &[&str]) -> Batch {
        values
            .iter()
            .map(|v| crate::record::Record::from_value(v.as_bytes().to_vec()))
            .collect()
    }

    fn sink(log: &Log) -> TwoPhaseSink<MemWriter> {
        TwoPhaseSink::new(MemWriter {
            log: log.clone(),
            stage: Vec::new(),
            fail_commit: false,
            background: None,
        })
    }

    /// A sink whose writer commits in the background through `gated`.
    fn background_sink(log: &Log, gated: &Arc<Gated>) -> TwoPhaseSink<MemWriter> {
        let mut s = sink(log);
        s.writer.background = Some(gated.clone());
        s
    }

    fn gated(log: &Log, fail: bool) -> Arc<Gated> {
        Arc::new(Gated {
            log: log.clone(),
            gate: tokio::sync::Semaphore::new(0),
            fail,
        })
    }

    fn pending_of(state: &[u8]) -> Vec<u64> {
        decode_state::<(u64, Vec<String>)>(state)
            .unwrap()
            .into_iter()
            .map(|(id, _)| id)
            .collect()
    }

    /// Waits until the sink's background commit returned.
    async fn settled(s: &TwoPhaseSink<MemWriter>) {
        while s
            .in_flight
            .as_ref()
            .is_some_and(|f| !f.handle.is_finished())
        {
            tokio::task::yield_now().await;
        }
    }

    /// A sink committing through a gate (refusing with `fail`) that staged `a` at
    /// checkpoint 1 and was told 1 completed: the notification returned at once, the
    /// commit waits for the gate.
    async fn notified_in_the_background(fail: bool) -> (Log, Arc<Gated>, TwoPhaseSink<MemWriter>) {
        let log = Log::default();
        let g = gated(&log, fail);
        let mut s = background_sink(&log, &g);
        s.open(&info(), &SinkRestore::default()).await.unwrap();
        s.invoke(batch(&["a"])).await.unwrap();
        s.snapshot(CheckpointId(1)).await.unwrap();
        s.notify_checkpoint_complete(CheckpointId(1)).await.unwrap();
        (log, g, s)
    }

    #[tokio::test]
    async fn a_background_commit_keeps_its_committables_in_each_state_until_it_returned() {
        let (log, g, mut s) = notified_in_the_background(false).await;
        s.invoke(batch(&["b"])).await.unwrap();
        let state = s.snapshot(CheckpointId(2)).await.unwrap();
        assert_eq!(pending_of(&state), vec![1, 2], "1 is not committed yet");
        g.gate.add_permits(1);
        settled(&s).await;
        s.invoke(batch(&["c"])).await.unwrap();
        let state = s.snapshot(CheckpointId(3)).await.unwrap();
        assert_eq!(
            pending_of(&state),
            vec![2, 3],
            "1 left once its commit returned"
        );
        // 3's notification (2's was lost) commits both, after 1, and a close waits.
        s.notify_checkpoint_complete(CheckpointId(3)).await.unwrap();
        g.gate.add_permits(2);
        s.close().await.unwrap();
        assert_eq!(
            *log.0.lock().unwrap(),
            vec![
                "open None 0",
                "abort after None keeping 0",
                "background commit 1 a",
                "background commit 2 b",
                "background commit 3 c"
            ]
        );
    }

    #[tokio::test]
    async fn a_failed_background_commit_fails_the_next_call_and_stays_pending() {
        let (_log, g, mut s) = notified_in_the_background(true).await;
        g.gate.add_permits(1);
        settled(&s).await;
        let failed = s.invoke(batch(&["b"])).await.unwrap_err();
        assert!(failed.to_string().contains("commit refused"), "{failed}");
        let state = s.snapshot(CheckpointId(2)).await.unwrap();
        assert_eq!(pending_of(&state), vec![1], "still pending");
    }

    #[tokio::test]
    async fn a_close_waits_for_the_background_commit_and_reports_its_failure() {
        let (_log, g, mut s) = notified_in_the_background(true).await;
        g.gate.add_permits(1);
        assert!(s.close().await.is_err(), "the final commit failed");
    }

    fn info() -> SubtaskInfo {
        SubtaskInfo::new("j", "sink-0", 0, 1)
    }

    #[tokio::test]
    async fn staged_at_the_barrier_committed_when_complete_in_order() {
        let log = Log::default();
        let mut s = sink(&log);
        s.open(&info(), &SinkRestore::default()).await.unwrap();
        s.invoke(batch(&["a", "b"])).await.unwrap();
        s.snapshot(CheckpointId(1)).await.unwrap();
        // Nothing written: nothing staged.
        s.snapshot(CheckpointId(2)).await.unwrap();
        s.invoke(batch(&["c"])).await.unwrap();
        let state = s.snapshot(CheckpointId(3)).await.unwrap();
        assert_eq!(
            decode_state::<(u64, Vec<String>)>(&state).unwrap(),
            vec![(1, vec!["a".into(), "b".into()]), (3, vec!["c".into()])]
        );
        assert_eq!(
            log.0.lock().unwrap().len(),
            2,
            "nothing committed before completion"
        );
        // The notification of 1 was lost: 3 commits both, in order.
        s.notify_checkpoint_complete(CheckpointId(3)).await.unwrap();
        assert_eq!(
            *log.0.lock().unwrap(),
            vec![
                "open None 0",
                "abort after None keeping 0",
                "commit 1 a,b",
                "commit 3 c"
            ]
        );
        let state = s.snapshot(CheckpointId(4)).await.unwrap();
        assert!(decode_state::<(u64, Vec<String>)>(&state)
            .unwrap()
            .is_empty());
    }

    #[tokio::test]
    async fn a_restore_commits_what_the_checkpoint_names_then_aborts_the_rest() {
        let log = Log::default();
        let restored = SinkRestore {
            checkpoint: Some(CheckpointId(7)),
            states: vec![
                (
                    0,
                    encode_state(vec![(6u64, vec!["x".to_string()])]).unwrap(),
                ),
                (
                    1,
                    encode_state(vec![(7u64, vec!["y".to_string()])]).unwrap(),
                ),
            ],
            parallelism: 2,
        };
        sink(&log).open(&info(), &restored).await.unwrap();
        assert_eq!(
            *log.0.lock().unwrap(),
            vec![
                "open Some(7) 2",
                "commit 6 x",
                "commit 7 y",
                "abort after Some(7) keeping 2"
            ]
        );
    }

    #[tokio::test]
    async fn a_failed_commit_keeps_the_committable_pending() {
        let log = Log::default();
        let mut s = sink(&log);
        s.open(&info(), &SinkRestore::default()).await.unwrap();
        s.invoke(batch(&["a"])).await.unwrap();
        s.snapshot(CheckpointId(1)).await.unwrap();
        s.writer.fail_commit = true;
        assert!(s.notify_checkpoint_complete(CheckpointId(1)).await.is_err());
        s.writer.fail_commit = false;
        let state = s.snapshot(CheckpointId(2)).await.unwrap();
        assert_eq!(
            decode_state::<(u64, Vec<String>)>(&state).unwrap(),
            vec![(1, vec!["a".to_string()])],
            "still pending in the next checkpoint"
        );
        // And a restore from checkpoint 1 commits it.
        let restored = SinkRestore {
            checkpoint: Some(CheckpointId(1)),
            states: vec![(
                0,
                encode_state(vec![(1u64, vec!["a".to_string()])]).unwrap(),
            )],
            parallelism: 1,
        };
        sink(&log).open(&info(), &restored).await.unwrap();
        assert!(log.0.lock().unwrap().contains(&"commit 1 a".to_string()));
    }

    /// A writer that holds records in memory until `flush` (or the barrier) puts
    /// them into its stage: what it was told, in order.
    #[derive(Default)]
    struct Buffering {
        held: Vec<Vec<u8>>,
        stage: usize,
        calls: Vec<String>,
        restorable_from: Option<CheckpointId>,
    }

    #[async_trait]
    impl TwoPhaseWriter for Buffering {
        type Committable = usize;

        async fn open(
            &mut self,
            _: &SubtaskInfo,
            _: Option<CheckpointId>,
            _: &[usize],
        ) -> Result<()> {
            Ok(())
        }
        async fn write(&mut self, batch: &Batch) -> Result<()> {
            self.held.extend(batch.iter().map(|r| r.value.to_vec()));
            Ok(())
        }
        fn buffered_bytes(&self) -> usize {
            self.held.iter().map(Vec::len).sum()
        }
        async fn flush(&mut self) -> Result<()> {
            self.calls.push(format!("flush {}", self.buffered_bytes()));
            self.stage += self.held.len();
            self.held.clear();
            Ok(())
        }
        async fn prepare_commit(&mut self, _: CheckpointId) -> Result<Option<usize>> {
            self.stage += self.held.len();
            self.held.clear();
            Ok(Some(std::mem::take(&mut self.stage)))
        }
        async fn commit(&mut self, c: &usize) -> Result<()> {
            self.calls.push(format!("commit {c}"));
            Ok(())
        }
        async fn abort_abandoned(&mut self, _: Option<CheckpointId>, _: &[usize]) -> Result<()> {
            Ok(())
        }
        async fn restorable_from(&mut self, oldest: CheckpointId) -> Result<()> {
            self.restorable_from = Some(oldest);
            Ok(())
        }
    }

    #[tokio::test]
    async fn what_a_writer_holds_in_memory_is_flushed_past_the_bound_and_counted() {
        let telemetry = crate::telemetry::Telemetry::default();
        let info = info().with_telemetry(telemetry.clone());
        let mut s = TwoPhaseSink::new(Buffering::default()).with_buffer_bound(10);
        s.open(&info, &SinkRestore::default()).await.unwrap();
        s.invoke(batch(&["aaaa", "bbbb"])).await.unwrap();
        assert!(s.writer.calls.is_empty(), "8 bytes: under the bound");
        assert_eq!(
            telemetry.metrics().refresh_buffered()[2],
            8,
            "counted as the sink's"
        );
        s.invoke(batch(&["cccc"])).await.unwrap();
        assert_eq!(s.writer.calls, vec!["flush 12"], "12 bytes: flushed");
        assert_eq!(telemetry.metrics().refresh_buffered()[2], 0);
        s.invoke(batch(&["dd"])).await.unwrap();
        s.snapshot(CheckpointId(1)).await.unwrap();
        assert_eq!(
            telemetry.metrics().refresh_buffered()[2],
            0,
            "the barrier staged it"
        );
        s.notify_checkpoint_complete(CheckpointId(1)).await.unwrap();
        assert_eq!(
            s.writer.calls,
            vec!["flush 12", "commit 4"],
            "one epoch of 4 records"
        );
        s.notify_restorable_from(CheckpointId(1)).await.unwrap();
        assert_eq!(
            s.writer.restorable_from,
            Some(CheckpointId(1)),
            "passed on to the writer"
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_record_the_writer_refuses_follows_the_item_error_policy() {
        // fail (the default): the job fails naming the record, nothing of it staged.
        let log = Log::default();
        let mut s = sink(&log);
        s.open(&info(), &SinkRestore::default()).await.unwrap();
        let e = s
            .invoke(batch(&["a", "bad1"]))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cannot be written by the two-phase sink: a bad value"),
            "{e}"
        );
        // skip: the rest of the batch is written, in order.
        let mut s = sink(&log).on_item_error(OnError::Skip, None);
        s.open(&info(), &SinkRestore::default()).await.unwrap();
        s.invoke(batch(&["a", "bad1", "b", "bad2", "c"]))
            .await
            .unwrap();
        s.snapshot(CheckpointId(1)).await.unwrap();
        s.notify_checkpoint_complete(CheckpointId(1)).await.unwrap();
        assert!(log
            .0
            .lock()
            .unwrap()
            .contains(&"commit 1 a,b,c".to_string()));
        // dead letters without a cluster: refused at open, naming the sink.
        let mut s = sink(&log).on_item_error(OnError::DeadLetter("dlq".into()), None);
        let e = s
            .open(&info(), &SinkRestore::default())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the sink dead-letters, and the job has no Kafka cluster"),
            "{e}"
        );
    }
}
