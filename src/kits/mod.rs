//! Kits a connector is built from, so that it gets lockgate's guarantees without
//! copying another connector's machinery.
//!
//! - [`fetcher`]: a source's reading thread and bounded hand-over, so that no source
//!   blocks in `poll`, with the positions of what the job has taken.

pub mod fetcher;
