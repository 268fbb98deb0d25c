//! Operators: the functions between a source and a sink.
//!
//! Stateless operators (map, filter, flat_map) are chained into the task that feeds
//! them. A keyed operator runs after a `key_by` exchange, owns a RocksDB instance per
//! subtask, and snapshots it at each aligned barrier (its machinery is the keyed kit,
//! [`crate::kits::keyed`]).

pub mod rolling_sum;
pub mod window;

pub use crate::connector::{FnOperator, Operator, OperatorContext};
/// The keyed kit at the path it had before the kits left the operators.
pub use crate::kits::keyed;
