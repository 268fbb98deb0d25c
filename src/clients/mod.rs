//! The clients every floor above may use: what lockgate says to an HTTP service
//! ([`http`]: credentials, TLS, node URLs, refusals; [`sigv4`]: AWS signatures), to a
//! Kafka cluster ([`kafka`]: the client properties and which client takes which), to a
//! PostgreSQL server ([`postgres`]: its endpoint, TLS and errors), to an
//! object store ([`store`]: a location and its S3 settings), and how it waits before trying again ([`backoff`]).
//!
//! They name no connector, no format and no kit: a connector, the schema registry and
//! the dead letters all build on them, none of them on another.

pub mod backoff;
pub mod http;
pub mod kafka;
pub mod postgres;
pub mod sigv4;
pub mod store;
