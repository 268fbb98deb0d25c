//! Event time: where a record's time comes from, the watermarks that say how far it
//! has come, and the rules by which they combine.

pub mod timestamp;
pub mod watermark;

pub use timestamp::{EventTime, TimestampFrom, WatermarkSection};
pub use watermark::{Emitter, InputWatermarks, SplitWatermarks, Watermark, END_OF_TIME};
