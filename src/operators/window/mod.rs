//! `[[transform]] type = "window"`: tumbling, hopping and session windows over event
//! time, with incremental aggregates, fired by the watermark.
//!
//! - A record belongs to the windows of its event time ([`assign::WindowKind`]); a
//!   session merges with every session it overlaps or touches.
//! - Each key's windows live in RocksDB keyed state (checkpointed, restored, and
//!   split by key groups on a rescale); timers are kept in memory and rebuilt from the
//!   state at open.
//! - When and how often a window is emitted, and what a late record does, is
//!   [`assign::Timing`] with [`WindowSpec::late`]; each result is one record
//!   `{key, window_start, window_end, window_id, <aggregates>}` timed at the window's
//!   end, so that `window_id` as the document id makes a replay rewrite the same
//!   document.
//! - Whether a record is late must not change across a restore: the operator
//!   checkpoints, per key group, the watermark it had reached, and decides lateness
//!   against the higher of that and the watermark it receives.

pub mod aggregate;
pub mod assign;
pub mod operator;
pub mod section;

pub use section::{WindowSection, WindowSpec};

/// The operator kind in a job graph, and the transform's `type`.
pub const KIND: &str = "window";
