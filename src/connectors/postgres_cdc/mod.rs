//! PostgreSQL change data capture by logical replication (`[source.postgres_cdc]`):
//! the parts built so far, each a plain function over data.
//!
//! - [`pgoutput`]: the messages of the `pgoutput` plugin, decoded from the stream;
//! - [`visibility`]: which transactions a snapshot query saw, so that an initial
//!   snapshot read in pieces meets the change stream with no gap and no overlap;
//! - [`lsn`]: log sequence numbers in PostgreSQL's text form;
//! - [`values`]: column values as Debezium's PostgreSQL connector writes them.

pub mod lsn;
pub mod pgoutput;
pub mod values;
pub mod visibility;
