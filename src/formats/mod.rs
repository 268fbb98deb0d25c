//! Record formats: how the bytes of a record's value (or key) become what the job sees.
//!
//! A format is an entry of the format list ([`catalog::Formats`], held by the
//! connector registry, `Registry::with_format`): a name a job file gives
//! (`format = "avro"`, `key_format = ...`) and a constructor that reads the format's
//! keys of the source section at load time. The result is a [`Format`], shared by the
//! source's subtasks; each subtask decodes through its own [`Decoder`], driven by a
//! [`Reader`] that fetches writer schemas from the Schema Registry when the decoder
//! asks for one.
//!
//! - [`columnar`]: records as Arrow columns and Parquet files (the file and Iceberg
//!   sinks').
//! - [`json`]: the JSON check (`json`), and [`plain`]: `json`, `text`, `bytes`.
//! - [`confluent`]: the Schema Registry wire frame (magic byte, schema id, Protobuf
//!   message indexes).
//! - [`avro`]: Avro values decoded to JSON by documented rules; [`avro_format`]: the
//!   `avro` format (a registry or a fixed `schema_file`, reader schemas).
//! - [`registry`]: writer schemas fetched by id from a Schema Registry, once;
//!   [`registry_section`]: `[source.kafka.schema_registry]`.
//! - [`schemas`]: the per-subtask cache of compiled writer schemas that every
//!   schema-driven format shares.

pub mod avro;
pub mod avro_format;
pub mod catalog;
pub mod columnar;
pub mod confluent;
pub mod connect_json;
pub mod debezium_types;
pub mod json;
pub mod json_out;
pub mod json_schema;
pub mod plain;
pub mod protobuf;
pub mod registry;
pub mod registry_section;
pub mod schemas;

pub use catalog::{FormatOptions, Formats};

use registry::{FetchError, RegistryClient};
use std::fmt;
use std::sync::Arc;

/// What a format's decoded values are, for sinks that need one kind (the Elasticsearch
/// sink needs JSON).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Json,
    Text,
    Bytes,
}

impl Output {
    /// `json`, `text` or `bytes`.
    pub fn name(self) -> &'static str {
        match self {
            Output::Json => "json",
            Output::Text => "text",
            Output::Bytes => "bytes",
        }
    }
}

/// A decoded payload.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// The payload is the value as it is (it passed the format's check): no copy.
    Unchanged,
    /// The value is this text (JSON, for the schema-driven formats).
    Replaced(Vec<u8>),
}

/// Why a payload was not decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The record's own fault (a bad frame, an unknown schema id, a body that does not
    /// match its schema): `on_decode_error` decides what happens to it. The message
    /// names the schema id when there is one.
    Record { why: String, schema_id: Option<u32> },
    /// The decoder needs the writer schema of this id first ([`Decoder::learn`]).
    NeedSchema(u32),
}

impl DecodeError {
    /// A record error without a schema id.
    pub fn record(why: impl Into<String>) -> DecodeError {
        DecodeError::Record {
            why: why.into(),
            schema_id: None,
        }
    }
}

/// A format as a job file configured it: shared by the subtasks of a source.
pub trait Format: Send + Sync + fmt::Debug {
    /// The name a job file gives it (`avro`).
    fn name(&self) -> &'static str;
    /// What its decoded values are.
    fn output(&self) -> Output;
    /// A decoder for one subtask.
    fn decoder(&self) -> Box<dyn Decoder>;
    /// The Schema Registry its decoders ask for writer schemas, if it reads framed
    /// values.
    fn registry(&self) -> Option<&Arc<RegistryClient>> {
        None
    }
}

/// A configured format, shared; what a source's configuration holds.
#[derive(Clone, Debug)]
pub struct FormatRef(pub Arc<dyn Format>);

impl FormatRef {
    /// Shares `format`.
    pub fn new(format: impl Format + 'static) -> FormatRef {
        FormatRef(Arc::new(format))
    }
}

impl std::ops::Deref for FormatRef {
    type Target = dyn Format;
    fn deref(&self) -> &(dyn Format + 'static) {
        &*self.0
    }
}

/// Equal when they print the same: the name and every option (secrets hidden), which
/// is what comparing two configurations needs.
impl PartialEq for FormatRef {
    fn eq(&self, other: &FormatRef) -> bool {
        format!("{:?}", self.0) == format!("{:?}", other.0)
    }
}

/// Decodes the payloads of one subtask. It never blocks or waits: a schema it does not
/// have yet is asked for ([`DecodeError::NeedSchema`]) and handed in by the
/// [`Reader`].
pub trait Decoder: Send {
    /// Decodes one payload (a record's value or key, never absent).
    fn decode(&mut self, payload: &[u8]) -> Result<Decoded, DecodeError>;
    /// The writer schema of `id`, as the registry gave it with its references, or why
    /// it could not be had (then records written with it are the records' fault).
    fn learn(&mut self, id: u32, schema: Result<&registry::ResolvedSchema, String>);
}

/// Why a [`Reader`] did not decode a payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The record's fault: `on_decode_error` applies.
    Record { why: String, schema_id: Option<u32> },
    /// The Schema Registry could not be asked after every retry: the job fails (and
    /// its restart strategy applies); no record is skipped for it.
    Registry(String),
}

/// A subtask's decoding of one format: the decoder, and the registry it asks when the
/// decoder needs a schema.
pub struct Reader {
    format: FormatRef,
    decoder: Box<dyn Decoder>,
}

impl Reader {
    /// A reader of `format` with a decoder of its own.
    pub fn new(format: FormatRef) -> Reader {
        let decoder = format.decoder();
        Reader { format, decoder }
    }

    /// Decodes `payload`; fetches (then caches) the writer schema first if the decoder
    /// does not have it.
    pub async fn decode(&mut self, payload: &[u8]) -> Result<Decoded, Failure> {
        match self.decoder.decode(payload) {
            Err(DecodeError::NeedSchema(id)) => {
                let Some(registry) = self.format.registry() else {
                    return Err(Failure::Record {
                        why: format!("schema id {id}: no Schema Registry is configured"),
                        schema_id: Some(id),
                    });
                };
                match registry.resolved(id).await {
                    Ok(s) => self.decoder.learn(id, Ok(&s)),
                    Err(FetchError::Unknown(why)) => self.decoder.learn(id, Err(why)),
                    Err(FetchError::Unavailable(why)) => return Err(Failure::Registry(why)),
                }
                self.decoder.decode(payload).map_err(|e| match e {
                    DecodeError::Record { why, schema_id } => Failure::Record { why, schema_id },
                    DecodeError::NeedSchema(id) => Failure::Record {
                        why: format!("schema id {id}: the decoder did not take its schema"),
                        schema_id: Some(id),
                    },
                })
            }
            Err(DecodeError::Record { why, schema_id }) => Err(Failure::Record { why, schema_id }),
            Ok(d) => Ok(d),
        }
    }
}

/// The key a decoded JSON key stands for: a JSON string is its text (a document id of
/// `user-1`, not `"user-1"`); any other value is its JSON text.
pub fn key_text(json: Vec<u8>) -> Vec<u8> {
    if json.first() == Some(&b'"') {
        if let Ok(serde_json::Value::String(s)) = serde_json::from_slice(&json) {
            return s.into_bytes();
        }
    }
    json
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decoded_key_that_is_a_string_is_its_text() {
        assert_eq!(key_text(br#""user-1""#.to_vec()), b"user-1");
        assert_eq!(key_text(br#""a\"b""#.to_vec()), b"a\"b");
        assert_eq!(key_text(br#"{"id":5}"#.to_vec()), br#"{"id":5}"#);
        assert_eq!(key_text(b"5".to_vec()), b"5");
        assert_eq!(key_text(b"null".to_vec()), b"null");
    }
}
