//! The `json-schema` format: JSON values framed by a Schema Registry serializer (magic
//! byte, schema id, then the JSON text). The value is the JSON text as written, checked
//! as the `json` format checks it; the frame's schema must be a JSON Schema the
//! registry knows. (Values are not validated against the schema: the serializer did,
//! as Confluent's deserializers assume by default.) Unframed JSON is `format = "json"`.

use super::registry::{RegistryClient, ResolvedSchema, SchemaType};
use super::schemas::{Codec, SchemaDecoder};
use super::{Decoder, Format, Output};
use std::sync::Arc;

/// How JSON Schema values decode: the text after the frame, checked.
#[derive(Debug)]
pub struct JsonSchemaCodec;

impl Codec for JsonSchemaCodec {
    type Compiled = ();
    const SCHEMA_TYPE: SchemaType = SchemaType::Json;
    const NAME: &'static str = "json-schema";

    fn compile(&self, s: &ResolvedSchema) -> Result<(), String> {
        serde_json::from_str::<serde::de::IgnoredAny>(&s.schema.schema)
            .map(|_| ())
            .map_err(|e| format!("not a JSON Schema document: {e}"))
    }

    fn decode(&self, _: &(), body: &[u8], _framed: bool) -> Result<Vec<u8>, String> {
        super::json::validate_json(body).map_err(|e| format!("not valid JSON: {e}"))?;
        Ok(body.to_vec())
    }
}

/// The `json-schema` format: framed values, their schemas from `registry`.
#[derive(Debug)]
pub struct JsonSchemaFormat {
    registry: Arc<RegistryClient>,
}

impl JsonSchemaFormat {
    /// Framed values, their schemas from `registry`.
    pub fn new(registry: Arc<RegistryClient>) -> JsonSchemaFormat {
        JsonSchemaFormat { registry }
    }
}

impl Format for JsonSchemaFormat {
    fn name(&self) -> &'static str {
        "json-schema"
    }

    fn output(&self) -> Output {
        Output::Json
    }

    fn decoder(&self) -> Box<dyn Decoder> {
        Box::new(SchemaDecoder::framed(Arc::new(JsonSchemaCodec)))
    }

    fn registry(&self) -> Option<&Arc<RegistryClient>> {
        Some(&self.registry)
    }
}
