//! Identifiers whose meaning must not be confused with a plain integer.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The id of a checkpoint. Ids only grow: a new run continues after the highest id
/// present in the checkpoint directory, so a skipped (corrupt) checkpoint keeps its name.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
pub struct CheckpointId(pub u64);

impl CheckpointId {
    /// The id that follows this one.
    pub fn next(self) -> CheckpointId {
        CheckpointId(self.0 + 1)
    }
}

impl fmt::Display for CheckpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The position of a source split: always the NEXT offset to read, never the last one
/// read. Every connector that stored "last read" has shipped an off-by-one on restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NextOffset(pub i64);

impl NextOffset {
    /// The position after having emitted the record at `offset`.
    pub fn after(offset: i64) -> NextOffset {
        NextOffset(offset + 1)
    }
}

impl fmt::Display for NextOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
