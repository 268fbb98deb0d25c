//! An Elasticsearch-compatible test server, in memory, with fault injection.
//!
//! It implements the part of the REST API a connector needs — index creation, `_bulk`
//! (index, create, update with `doc` / `upsert` / `doc_as_upsert`, delete; the index in
//! the path or per item; the trailing-newline rule), `_refresh`, `_count`, GET by id,
//! `_search` with `match_all` and `size` / `from`, `_mget`, internal and external
//! versioning — with the response shapes Elasticsearch returns (`_version`, `_seq_no`,
//! `result`, `status`, `errors`), and `filter_path` on bulk responses
//! ([`filter_path`]); routing (the same id under another routing is another document),
//! ingest pipelines (`set` and `fail` processors), aliases and `require_alias`,
//! composable index templates (with the data-stream templates of a fresh
//! Elasticsearch 8 cluster) and data streams (create only, `@timestamp` required).
//!
//! Faults are set through `POST /_lockgate/faults` (or [`EsServer::set_faults`]):
//! per-item 429 `es_rejected_execution_exception` rejections (chosen ids or a
//! fraction), whole-request failures (429 / 503 / 500), latency, a stall, a connection
//! dropped after the bulk was applied and before the response was read, and 413 above a
//! body size. `GET /_lockgate/stats` counts requests and items.
//!
//! Secured ([`ServerOptions`], [`secure`]): HTTPS with a certificate generated at start,
//! and basic-auth or API-key credentials required on every request (401
//! `security_exception` otherwise, counted as `unauthorized_requests`). Gzip request
//! bodies are decoded (counted as `gzip_requests`).

mod bulk;
pub mod filter_path;
mod resources;
pub mod secure;
mod server;
mod store;

pub use secure::TestCert;
pub use server::{EsServer, Faults, ServerOptions, Stats};
