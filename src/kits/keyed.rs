//! Keyed state and keyed operators.
//!
//! A keyed function sees one record at a time with its key and a [`KeyedState`] scoped
//! to that key. Updates of a batch are buffered in memory (reads see them) and written
//! to RocksDB in one atomic write at the end of the batch.
//!
//! In a `co_partitioned` job, the state of a key is kept under its source partition
//! ([`partition_scope`] before the key): a member that takes over a partition takes
//! exactly the state of the keys that partition carries ([`scope_of`]).

use crate::connector::{Operator, OperatorContext};
use crate::error::{JobError, Result};
use crate::record::{Batch, Record};
use lockgate_state::backend::{state_key, StateBatch};
use lockgate_state::keygroup::key_group_of;
use lockgate_state::{CheckpointId, KeyGroup, KeyedStateBackend, SubtaskSnapshot};
use serde::{de::DeserializeOwned, Serialize};
use std::collections::HashMap;
use std::path::Path;

fn codec() -> impl bincode::config::Config {
    bincode::config::standard()
}

/// A keyed step of `kind` whose state is named `uid` in checkpoints, running the
/// function `factory` makes per subtask (see [`crate::connector::Step::Keyed`]).
pub fn step<K, F>(
    kind: &str,
    uid: &str,
    across_partitions: bool,
    factory: F,
) -> crate::connector::Step
where
    K: KeyedFunction + 'static,
    F: Fn(u16) -> K + Send + Sync + 'static,
{
    crate::connector::Step::Keyed {
        kind: kind.to_string(),
        uid: uid.to_string(),
        factory: std::sync::Arc::new(move |i| Box::new(KeyedOperator::new(factory(i)))),
        across_partitions,
    }
}

/// The bytes before a key in a partition-scoped state key: the stream's length (u16,
/// big-endian), the stream, the partition (i32, big-endian).
pub fn partition_scope(out: &mut Vec<u8>, stream: &str, partition: i32) {
    let len = u16::try_from(stream.len()).expect("a stream name shorter than 64 KiB");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(stream.as_bytes());
    out.extend_from_slice(&partition.to_be_bytes());
}

/// The source partition of a partition-scoped state key written by
/// [`partition_scope`], or `None` when the bytes are not one.
pub fn scope_of(user_key: &[u8]) -> Option<(&str, i32)> {
    let len = usize::from(u16::from_be_bytes(user_key.get(..2)?.try_into().ok()?));
    let stream = std::str::from_utf8(user_key.get(2..2 + len)?).ok()?;
    let p = user_key.get(2 + len..2 + len + 4)?;
    Some((stream, i32::from_be_bytes(p.try_into().ok()?)))
}

/// The state of the current key, for a [`KeyedFunction`].
pub struct KeyedState<'a> {
    backend: &'a KeyedStateBackend,
    overlay: &'a mut HashMap<Vec<u8>, Vec<u8>>,
    group: KeyGroup,
    key: &'a [u8],
}

impl KeyedState<'_> {
    /// The value of state `name` for the current key.
    pub fn get<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>> {
        let k = state_key(self.group, name, self.key);
        let raw = match self.overlay.get(&k) {
            Some(v) => Some(v.clone()),
            None => self.backend.get_raw(&k)?,
        };
        raw.map(|bytes| {
            bincode::serde::decode_from_slice(&bytes, codec())
                .map(|(v, _)| v)
                .map_err(|e| JobError::Other(format!("decoding state {name}: {e}")))
        })
        .transpose()
    }

    /// Sets state `name` for the current key.
    pub fn put<T: Serialize>(&mut self, name: &str, value: &T) -> Result<()> {
        let bytes = bincode::serde::encode_to_vec(value, codec())
            .map_err(|e| JobError::Other(format!("encoding state {name}: {e}")))?;
        self.overlay
            .insert(state_key(self.group, name, self.key), bytes);
        Ok(())
    }
}

/// A function over keyed records with keyed state (Flink's KeyedProcessFunction).
pub trait KeyedFunction: Send {
    /// Processes one record of `key`.
    fn process(
        &mut self,
        key: &[u8],
        record: Record,
        state: &mut KeyedState<'_>,
        out: &mut Batch,
    ) -> Result<()>;
}

impl<F> KeyedFunction for F
where
    F: FnMut(&[u8], Record, &mut KeyedState<'_>, &mut Batch) -> Result<()> + Send,
{
    fn process(
        &mut self,
        key: &[u8],
        record: Record,
        state: &mut KeyedState<'_>,
        out: &mut Batch,
    ) -> Result<()> {
        self(key, record, state, out)
    }
}

/// Runs a [`KeyedFunction`] over a RocksDB state backend.
pub struct KeyedOperator<F> {
    function: F,
    backend: Option<KeyedStateBackend>,
    overlay: HashMap<Vec<u8>, Vec<u8>>,
    uid: String,
    subtask: u16,
    max_parallelism: u16,
    task: String,
    /// Keys are kept under their record's source partition.
    scoped: bool,
    /// The scoped key of the current record (reused: no allocation per record).
    scoped_key: Vec<u8>,
    /// The one source stream a scoped subtask reads (the first it saw).
    stream: Option<std::sync::Arc<str>>,
}

impl<F: KeyedFunction> KeyedOperator<F> {
    /// Wraps `function`.
    pub fn new(function: F) -> KeyedOperator<F> {
        KeyedOperator {
            function,
            backend: None,
            overlay: HashMap::new(),
            uid: String::new(),
            subtask: 0,
            max_parallelism: 1,
            task: String::new(),
            scoped: false,
            scoped_key: Vec::new(),
            stream: None,
        }
    }
}

impl<F: KeyedFunction> Operator for KeyedOperator<F> {
    fn open(&mut self, ctx: &OperatorContext) -> Result<()> {
        let range = lockgate_state::keygroup::range_for_subtask(
            ctx.info.max_parallelism,
            ctx.info.parallelism,
            ctx.info.index,
        );
        self.backend = Some(KeyedStateBackend::open_with(
            &ctx.work_dir,
            range,
            &ctx.restore,
            &ctx.state_options,
        )?);
        self.uid = ctx.uid.clone();
        self.subtask = ctx.info.index;
        self.max_parallelism = ctx.info.max_parallelism;
        self.task = ctx.info.name.clone();
        self.scoped = ctx.partition_scoped;
        Ok(())
    }

    fn process(&mut self, batch: Batch, out: &mut Batch) -> Result<()> {
        let backend = self.backend.as_ref().expect("opened");
        for mut record in batch {
            let key = record.route_key.take().ok_or_else(|| {
                JobError::task(&self.task, "keyed operator received a record without a key")
            })?;
            let group = key_group_of(&key, self.max_parallelism);
            debug_assert!(
                backend.key_groups().contains(group),
                "record routed to the wrong subtask"
            );
            let state_key = if self.scoped {
                // A restart cannot cure this: the same records come again.
                let o = record.origin.as_ref().ok_or_else(|| JobError::Unrecoverable {
                    task: self.task.clone(),
                    message: "a co_partitioned job's keyed operator received a record without a source partition (co_partitioned needs a source whose records carry their partition)".into(),
                })?;
                // Per-partition state is a key's whole state only within one stream:
                // the same key from two topics would get two states (the exchange
                // brings both to this subtask, so this is where it shows).
                match &self.stream {
                    Some(s) if std::sync::Arc::ptr_eq(s, &o.stream) || **s == *o.stream => {}
                    Some(s) => {
                        return Err(JobError::Unrecoverable {
                            task: self.task.clone(),
                            message: format!(
                                "a co_partitioned job's keyed operator received records of two topics ({s} and {}): keyed state kept per partition would give one key two states; co_partitioned needs a source that reads one topic",
                                o.stream
                            ),
                        })
                    }
                    None => self.stream = Some(o.stream.clone()),
                }
                self.scoped_key.clear();
                partition_scope(&mut self.scoped_key, &o.stream, o.partition);
                self.scoped_key.extend_from_slice(&key);
                &self.scoped_key[..]
            } else {
                &key[..]
            };
            let mut state = KeyedState {
                backend,
                overlay: &mut self.overlay,
                group,
                key: state_key,
            };
            self.function.process(&key, record, &mut state, out)?;
        }
        if !self.overlay.is_empty() {
            let mut wb = StateBatch::default();
            for (k, v) in self.overlay.drain() {
                wb.put_raw(&k, &v);
            }
            backend.write(wb)?;
        }
        Ok(())
    }

    fn snapshot(
        &mut self,
        _id: CheckpointId,
        pending_dir: &Path,
    ) -> Result<Option<SubtaskSnapshot>> {
        let backend = self.backend.as_mut().expect("opened");
        snapshot_backend(backend, &self.uid, self.subtask, pending_dir)
    }
}

/// Checkpoints the RocksDB instance of subtask `subtask` of keyed operator `uid` into
/// `pending_dir` (the unfinished checkpoint directory), as its snapshot.
pub fn snapshot_backend(
    backend: &mut KeyedStateBackend,
    uid: &str,
    subtask: u16,
    pending_dir: &Path,
) -> Result<Option<SubtaskSnapshot>> {
    let dir_name = format!("{uid}-{subtask}");
    let files = backend.checkpoint_with(&pending_dir.join(&dir_name), || {
        crate::fault::hit("before-state-listing")
    })?;
    crate::fault::hit("rocksdb-checkpoint");
    Ok(Some(SubtaskSnapshot {
        operator: uid.to_string(),
        subtask,
        key_groups: Some(backend.key_groups()),
        state_dir: Some(dir_name),
        files,
        inline_state: Vec::new(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The partition of a scoped key is read back whatever the key holds.
        #[test]
        fn a_scoped_key_names_its_partition(stream in ".{0,40}", partition in any::<i32>(), key in proptest::collection::vec(any::<u8>(), 0..40)) {
            let mut k = Vec::new();
            partition_scope(&mut k, &stream, partition);
            k.extend_from_slice(&key);
            prop_assert_eq!(scope_of(&k), Some((stream.as_str(), partition)));
        }
    }

    fn scoped_operator(dir: &Path) -> impl Operator {
        let mut op = KeyedOperator::new(
            |_: &[u8], r: Record, st: &mut KeyedState<'_>, out: &mut Batch| {
                let n: u64 = st.get("n")?.unwrap_or(0);
                st.put("n", &(n + 1))?;
                out.push(r);
                Ok(())
            },
        );
        let ctx = OperatorContext {
            info: crate::connector::SubtaskInfo::new("j", "keyed-0", 0, 1)
                .with_max_parallelism(8)
                .with_telemetry(crate::telemetry::Telemetry::new("j", "g", 1, 8)),
            uid: "sum".into(),
            work_dir: dir.to_path_buf(),
            restore: Vec::new(),
            state_options: lockgate_state::BackendOptions::default(),
            partition_scoped: true,
        };
        op.open(&ctx).unwrap();
        op
    }

    fn from(stream: &str, partition: i32) -> Record {
        let mut r = Record::from_value(b"{}".to_vec());
        r.route_key = Some(b"user-1".to_vec());
        r.origin = Some(crate::record::Origin {
            stream: stream.into(),
            partition,
            offset: 0,
        });
        r
    }

    #[test]
    fn a_partition_scoped_subtask_refuses_records_of_a_second_topic() {
        let tmp = tempfile::tempdir().unwrap();
        let mut op = scoped_operator(tmp.path());
        let mut out = Vec::new();
        // Several partitions of one topic are what co-partitioning means.
        op.process(vec![from("orders", 0), from("orders", 1)], &mut out)
            .unwrap();
        assert_eq!(out.len(), 2);
        let e = op.process(vec![from("returns", 0)], &mut out).unwrap_err();
        assert!(
            matches!(&e, JobError::Unrecoverable { message, .. } if message.contains("two topics (orders and returns)")),
            "{e}"
        );
    }

    #[test]
    fn bytes_that_are_not_a_scope_are_refused() {
        assert_eq!(scope_of(b""), None);
        assert_eq!(scope_of(&[0]), None);
        // A stream length beyond the bytes, or a partition cut short.
        assert_eq!(scope_of(&[0, 9, b'a']), None);
        assert_eq!(scope_of(&[0, 1, b'a', 0, 0, 1]), None);
        // Not UTF-8.
        assert_eq!(scope_of(&[0, 1, 0xff, 0, 0, 0, 1]), None);
        assert_eq!(scope_of(&[0, 1, b'a', 0, 0, 0, 7]), Some(("a", 7)));
    }
}
