//! The `avro` format: Avro values decoded to JSON by the rules of [`super::avro`].
//!
//! With a Schema Registry, values are Confluent-framed and decoded with their writer
//! schema (named types of its references included). Without one, `schema_file` is the
//! schema of every (unframed) value. Either way, `reader_schema_file` resolves each
//! value to the reader schema by Avro's rules (fields added with defaults, removed,
//! promoted, reordered), so that documents keep one shape while writers evolve; a
//! value the reader schema cannot read is the record's error, which says why.

use super::avro::{AvroDecoder, Temporal};
use super::registry::{RegistryClient, ResolvedSchema, SchemaType};
use super::schemas::{Codec, SchemaDecoder};
use super::{Decoder, Format, Output};
use std::sync::Arc;

/// How Avro schemas compile and values decode.
#[derive(Debug)]
pub struct AvroCodec {
    temporal: Temporal,
    /// The reader schema every value is resolved to, if any.
    reader: Option<AvroDecoder>,
}

/// A writer schema ready to decode with.
#[derive(Debug)]
pub struct AvroWriter {
    decoder: AvroDecoder,
}

impl AvroCodec {
    /// A codec writing times by `temporal`, resolving to `reader` when given (the
    /// text of an `.avsc` file).
    pub fn new(temporal: Temporal, reader: Option<&str>) -> Result<AvroCodec, String> {
        let reader = reader
            .map(|r| AvroDecoder::parse(r, temporal))
            .transpose()?;
        Ok(AvroCodec { temporal, reader })
    }

    /// Compiles a schema's text with the texts of its references.
    pub fn compile_text(&self, schema: &str, references: &[&str]) -> Result<AvroWriter, String> {
        // Whether the reader schema can read this writer's values shows per value:
        // the library's up-front compatibility check refuses decimals it resolves well.
        let decoder = AvroDecoder::parse_with(schema, references, self.temporal)?;
        Ok(AvroWriter { decoder })
    }
}

impl Codec for AvroCodec {
    type Compiled = AvroWriter;
    const SCHEMA_TYPE: SchemaType = SchemaType::Avro;
    const NAME: &'static str = "avro";

    fn compile(&self, s: &ResolvedSchema) -> Result<AvroWriter, String> {
        let references: Vec<&str> = s
            .references
            .iter()
            .map(|(_, r)| r.schema.as_str())
            .collect();
        self.compile_text(&s.schema.schema, &references)
    }

    fn decode(&self, writer: &AvroWriter, body: &[u8], _framed: bool) -> Result<Vec<u8>, String> {
        let Some(reader) = &self.reader else {
            return writer.decoder.to_json(body);
        };
        // First the writer's own decoding: it bounds the nesting and every count, which
        // the library's decoder below does not.
        writer.decoder.to_json(body)?;
        // Resolution goes through Avro values: decode with the writer schema, resolve,
        // encode with the reader schema, then write JSON by the same rules as without.
        let mut rest = body;
        let value = apache_avro::from_avro_datum_schemata(
            writer.decoder.schema(),
            writer.decoder.roots().collect(),
            &mut rest,
            Some(reader.schema()),
        )
        .map_err(|e| format!("does not decode to the reader schema: {e}"))?;
        if !rest.is_empty() {
            return Err(format!("{} bytes left after the value", rest.len()));
        }
        let datum = apache_avro::to_avro_datum(reader.schema(), value)
            .map_err(|e| format!("does not resolve to the reader schema: {e}"))?;
        reader.to_json(&datum)
    }
}

/// The `avro` format as a job file configured it.
#[derive(Debug)]
pub struct AvroFormat {
    codec: Arc<AvroCodec>,
    /// The registry of framed values; or
    registry: Option<Arc<RegistryClient>>,
    /// the fixed schema of unframed values (`schema_file`).
    fixed: Option<Arc<AvroWriter>>,
}

impl AvroFormat {
    /// Framed values, their schemas from `registry`.
    pub fn framed(codec: AvroCodec, registry: Arc<RegistryClient>) -> AvroFormat {
        AvroFormat {
            codec: Arc::new(codec),
            registry: Some(registry),
            fixed: None,
        }
    }

    /// Unframed values, all written with `schema` (an `.avsc` file's text).
    pub fn fixed(codec: AvroCodec, schema: &str) -> Result<AvroFormat, String> {
        let writer = codec.compile_text(schema, &[])?;
        Ok(AvroFormat {
            codec: Arc::new(codec),
            registry: None,
            fixed: Some(Arc::new(writer)),
        })
    }
}

impl Format for AvroFormat {
    fn name(&self) -> &'static str {
        "avro"
    }

    fn output(&self) -> Output {
        Output::Json
    }

    fn decoder(&self) -> Box<dyn Decoder> {
        match &self.fixed {
            Some(w) => Box::new(SchemaDecoder::fixed(self.codec.clone(), w.clone())),
            None => Box::new(SchemaDecoder::framed(self.codec.clone())),
        }
    }

    fn registry(&self) -> Option<&Arc<RegistryClient>> {
        self.registry.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::registry::RegisteredSchema;
    use crate::formats::{DecodeError, Decoded};
    use apache_avro::schema::Schema;

    const V1: &str = r#"{"type":"record","name":"Order","fields":[
        {"name":"id","type":"long"},
        {"name":"status","type":{"type":"enum","name":"Status","symbols":["NEW","PAID"]}},
        {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}}]}"#;
    const V2: &str = r#"{"type":"record","name":"Order","fields":[
        {"name":"id","type":"long"},
        {"name":"status","type":{"type":"enum","name":"Status","symbols":["NEW","PAID"]}},
        {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}},
        {"name":"note","type":["null","string"],"default":null}]}"#;

    fn encode(schema: &str, value: apache_avro::types::Value) -> Vec<u8> {
        let s = Schema::parse_str(schema).unwrap();
        apache_avro::to_avro_datum(&s, value).unwrap()
    }

    fn order(id: i64, cents: i64, note: Option<&str>) -> apache_avro::types::Value {
        use apache_avro::types::Value;
        let mut fields = vec![
            ("id".to_string(), Value::Long(id)),
            ("status".to_string(), Value::Enum(1, "PAID".into())),
            (
                "amount".to_string(),
                Value::Decimal(apache_avro::Decimal::from(cents.to_be_bytes().to_vec())),
            ),
        ];
        if let Some(n) = note {
            fields.push((
                "note".to_string(),
                Value::Union(1, Box::new(Value::String(n.into()))),
            ));
        }
        Value::Record(fields)
    }

    fn resolved(schema: &str) -> ResolvedSchema {
        ResolvedSchema {
            schema: Arc::new(RegisteredSchema {
                id: 1,
                schema: schema.into(),
                schema_type: SchemaType::Avro,
                references: vec![],
            }),
            references: vec![],
        }
    }

    #[test]
    fn a_fixed_schema_decodes_unframed_values() {
        let f =
            AvroFormat::fixed(AvroCodec::new(Temporal::EpochMillis, None).unwrap(), V1).unwrap();
        let mut d = f.decoder();
        assert_eq!(
            d.decode(&encode(V1, order(7, 509461, None))),
            Ok(Decoded::Replaced(
                br#"{"id":7,"status":"PAID","amount":5094.61}"#.to_vec()
            ))
        );
    }

    /// Values written with v1 and with v2 both come out in the reader schema's shape.
    #[test]
    fn a_reader_schema_gives_every_writer_version_one_shape() {
        let codec = AvroCodec::new(Temporal::EpochMillis, Some(V2)).unwrap();
        let (w1, w2) = (
            codec.compile(&resolved(V1)).unwrap(),
            codec.compile(&resolved(V2)).unwrap(),
        );
        assert_eq!(
            codec
                .decode(&w1, &encode(V1, order(1, 150, None)), true)
                .unwrap(),
            br#"{"id":1,"status":"PAID","amount":1.50,"note":null}"#
        );
        assert_eq!(
            codec
                .decode(&w2, &encode(V2, order(2, 5, Some("gift"))), true)
                .unwrap(),
            br#"{"id":2,"status":"PAID","amount":0.05,"note":"gift"}"#
        );
        // A reader that needs a field the writer lacks, without a default: refused.
        let strict = AvroCodec::new(
            Temporal::EpochMillis,
            Some(&V2.replace(r#","default":null"#, "")),
        )
        .unwrap();
        let w1 = strict.compile(&resolved(V1)).unwrap();
        let e = strict
            .decode(&w1, &encode(V1, order(1, 150, None)), true)
            .unwrap_err();
        assert!(e.contains("reader schema"), "{e}");
    }

    /// A named type defined in a reference (another subject's schema), as Confluent's
    /// serializers register schemas that share types.
    #[test]
    fn a_writer_schema_may_use_the_named_types_of_its_references() {
        let address = r#"{"type":"record","name":"Address","namespace":"shop","fields":[{"name":"city","type":"string"}]}"#;
        let order = r#"{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"long"},{"name":"to","type":"shop.Address"}]}"#;
        let mut s = resolved(order);
        s.references = vec![(
            "shop.Address".into(),
            Arc::new(RegisteredSchema {
                id: 2,
                schema: address.into(),
                schema_type: SchemaType::Avro,
                references: vec![],
            }),
        )];
        let codec = AvroCodec::new(Temporal::EpochMillis, None).unwrap();
        let w = codec.compile(&s).unwrap();
        // id 3 (zigzag 6), city "Lyon".
        let body = [6, 8, b'L', b'y', b'o', b'n'];
        assert_eq!(
            codec.decode(&w, &body, true).unwrap(),
            br#"{"id":3,"to":{"city":"Lyon"}}"#
        );
        // Without the reference, the name is undefined: the schema does not compile.
        assert!(codec.compile(&resolved(order)).is_err());
        // Resolved to a reader schema that defines the type itself and adds a field.
        let reader = r#"{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"long"},{"name":"to","type":{"type":"record","name":"Address","fields":[{"name":"city","type":"string"}]}},{"name":"n","type":"int","default":4}]}"#;
        let codec = AvroCodec::new(Temporal::EpochMillis, Some(reader)).unwrap();
        let w = codec.compile(&s).unwrap();
        assert_eq!(
            codec.decode(&w, &body, true).unwrap(),
            br#"{"id":3,"to":{"city":"Lyon"},"n":4}"#
        );
        // A forged body is refused before the library's decoder sees it.
        let e = codec
            .decode(&w, &[6, 0x80, 0x80, 0x80, 0x80, 0x10], true)
            .unwrap_err();
        assert!(e.contains("bytes wanted"), "{e}");
    }

    #[test]
    fn framed_values_ask_for_their_schema() {
        let reg = Arc::new(RegistryClient::new(
            reqwest::Client::new(),
            vec!["http://127.0.0.1:9".into()],
            Default::default(),
        ));
        let f = AvroFormat::framed(AvroCodec::new(Temporal::EpochMillis, None).unwrap(), reg);
        let mut d = f.decoder();
        let mut framed = vec![0, 0, 0, 0, 5];
        framed.extend(encode(V1, order(7, 1, None)));
        assert_eq!(d.decode(&framed), Err(DecodeError::NeedSchema(5)));
        d.learn(5, Ok(&resolved(V1)));
        assert_eq!(
            d.decode(&framed),
            Ok(Decoded::Replaced(
                br#"{"id":7,"status":"PAID","amount":0.01}"#.to_vec()
            ))
        );
    }
}
