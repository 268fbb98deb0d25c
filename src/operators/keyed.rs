//! Keyed state and keyed operators.
//!
//! A keyed function sees one record at a time with its key and a [`KeyedState`] scoped
//! to that key. Updates of a batch are buffered in memory (reads see them) and written
//! to RocksDB in one atomic write at the end of the batch.

use super::{Operator, OperatorContext};
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
            let mut state = KeyedState {
                backend,
                overlay: &mut self.overlay,
                group,
                key: &key,
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
        let dir_name = format!("{}-{}", self.uid, self.subtask);
        let files = backend.checkpoint_with(&pending_dir.join(&dir_name), || {
            crate::fault::hit("before-state-listing")
        })?;
        crate::fault::hit("rocksdb-checkpoint");
        Ok(Some(SubtaskSnapshot {
            operator: self.uid.clone(),
            subtask: self.subtask,
            key_groups: Some(backend.key_groups()),
            state_dir: Some(dir_name),
            files,
            inline_state: Vec::new(),
        }))
    }
}
