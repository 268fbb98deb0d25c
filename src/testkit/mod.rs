//! Helpers shared by the integration tests, the demo and the fault harness.

pub mod checkpoint;
pub mod conformance;
pub mod es;
pub mod fault_proxy;
pub mod file_output;
pub mod kafka;
pub mod moto;
pub mod postgres;
pub mod queue;
pub mod schema_registry;
pub mod verdict;
