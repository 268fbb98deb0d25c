//! Record formats beyond JSON, text and bytes: what Schema Registry serializers write.
//!
//! - [`confluent`]: the wire frame (magic byte, schema id, Protobuf message indexes).
//! - [`avro`]: Avro values decoded to JSON by documented rules.
//! - [`registry`]: writer schemas fetched by id from a Schema Registry, once.

pub mod avro;
pub mod confluent;
pub mod registry;
