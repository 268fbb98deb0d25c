//! Record formats beyond JSON, text and bytes: what Schema Registry serializers write.
//!
//! - [`confluent`]: the wire frame (magic byte, schema id, Protobuf message indexes).
//! - [`avro`]: Avro values decoded to JSON by documented rules.

pub mod avro;
pub mod confluent;
