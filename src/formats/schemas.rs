//! What every schema-driven format (Avro, Protobuf, JSON Schema) shares: a value is
//! either Confluent-framed, its writer schema named by id and fetched from the registry
//! once per subtask, or unframed and decoded with one fixed schema (`schema_file`).
//!
//! A [`Codec`] says how one kind of schema is compiled and how a body is decoded with
//! it; [`SchemaDecoder`] does the framing and keeps the compiled schemas by id.

use super::confluent;
use super::registry::{ResolvedSchema, SchemaType};
use super::{DecodeError, Decoded, Decoder};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One kind of schema: how it compiles, and how a body decodes to JSON with it.
pub trait Codec: Send + Sync + 'static {
    /// A schema ready to decode with.
    type Compiled: Send + Sync + 'static;
    /// The registry's schema type this codec reads.
    const SCHEMA_TYPE: SchemaType;
    /// The format's name, for messages.
    const NAME: &'static str;
    /// Compiles a writer schema (with its references) fetched from the registry.
    fn compile(&self, schema: &ResolvedSchema) -> Result<Self::Compiled, String>;
    /// The JSON text of `body`. `framed` says whether it came after a Confluent frame
    /// (Protobuf bodies then start with their message indexes).
    fn decode(&self, schema: &Self::Compiled, body: &[u8], framed: bool)
        -> Result<Vec<u8>, String>;
}

/// Decodes the values of one subtask with a [`Codec`]: framed ones by their writer
/// schema's id, or every one with a fixed schema.
pub struct SchemaDecoder<C: Codec> {
    codec: Arc<C>,
    /// The fixed schema (`schema_file`): values are not framed.
    fixed: Option<Arc<C::Compiled>>,
    /// Writer schemas by id, compiled; or why the schema of that id cannot be used
    /// (it does not compile, or is of another type): the same for every record.
    by_id: HashMap<u32, Result<Arc<C::Compiled>, String>>,
    /// Ids the registry said it does not know, with why and when: asked again only
    /// after [`UNKNOWN_TTL`], so that a run of such records does not cost a request
    /// each, while a schema registered later is still found.
    unknown: HashMap<u32, (String, Instant)>,
    unknown_ttl: Duration,
}

/// How long an id the registry does not know is taken as unknown before it is asked
/// again.
pub const UNKNOWN_TTL: Duration = Duration::from_secs(30);

impl<C: Codec> SchemaDecoder<C> {
    /// A decoder of framed values, whose schemas come from the registry.
    pub fn framed(codec: Arc<C>) -> SchemaDecoder<C> {
        SchemaDecoder {
            codec,
            fixed: None,
            by_id: HashMap::new(),
            unknown: HashMap::new(),
            unknown_ttl: UNKNOWN_TTL,
        }
    }

    /// A decoder of unframed values, all written with `schema`.
    pub fn fixed(codec: Arc<C>, schema: Arc<C::Compiled>) -> SchemaDecoder<C> {
        SchemaDecoder {
            fixed: Some(schema),
            ..SchemaDecoder::framed(codec)
        }
    }
}

impl<C: Codec> Decoder for SchemaDecoder<C> {
    fn decode(&mut self, payload: &[u8]) -> Result<Decoded, DecodeError> {
        if let Some(schema) = &self.fixed {
            return self
                .codec
                .decode(schema, payload, false)
                .map(Decoded::Replaced)
                .map_err(|why| DecodeError::record(format!("not {}: {why}", C::NAME)));
        }
        let framed = confluent::unframe(payload).map_err(DecodeError::record)?;
        let id = framed.schema_id;
        let record = |why: String| DecodeError::Record {
            why: format!("schema id {id}: {why}"),
            schema_id: Some(id),
        };
        match self.by_id.get(&id) {
            Some(Ok(schema)) => self
                .codec
                .decode(schema, framed.body, true)
                .map(Decoded::Replaced)
                .map_err(record),
            Some(Err(why)) => Err(record(why.clone())),
            None => match self.unknown.get(&id) {
                Some((why, at)) if at.elapsed() < self.unknown_ttl => Err(DecodeError::Record {
                    why: why.clone(),
                    schema_id: Some(id),
                }),
                _ => Err(DecodeError::NeedSchema(id)),
            },
        }
    }

    fn learn(&mut self, id: u32, schema: Result<&ResolvedSchema, String>) {
        match schema {
            Ok(s) if s.schema.schema_type != C::SCHEMA_TYPE => {
                let why = format!(
                    "a {:?} schema where the format is {}",
                    s.schema.schema_type,
                    C::NAME
                );
                self.by_id.insert(id, Err(why));
            }
            Ok(s) => {
                self.unknown.remove(&id);
                let compiled = self
                    .codec
                    .compile(s)
                    .map(Arc::new)
                    .map_err(|e| format!("the writer schema does not compile: {e}"));
                if let Err(e) = &compiled {
                    tracing::warn!(schema_id = id, error = %e, "a writer schema lockgate cannot use");
                }
                self.by_id.insert(id, compiled);
            }
            Err(why) => {
                // Forged ids must not make the map grow for good.
                let ttl = self.unknown_ttl;
                self.unknown.retain(|_, (_, at)| at.elapsed() < ttl);
                self.unknown.insert(id, (why, Instant::now()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::registry::RegisteredSchema;

    /// A codec whose schema is a prefix every body must start with.
    struct Prefix;

    impl Codec for Prefix {
        type Compiled = String;
        const SCHEMA_TYPE: SchemaType = SchemaType::Avro;
        const NAME: &'static str = "prefix";
        fn compile(&self, s: &ResolvedSchema) -> Result<String, String> {
            match s.schema.schema.as_str() {
                "bad" => Err("bad schema".into()),
                p => Ok(p.to_string()),
            }
        }
        fn decode(&self, p: &String, body: &[u8], _: bool) -> Result<Vec<u8>, String> {
            body.strip_prefix(p.as_bytes())
                .map(<[u8]>::to_vec)
                .ok_or_else(|| "wrong prefix".into())
        }
    }

    fn resolved(id: u32, schema: &str, t: SchemaType) -> ResolvedSchema {
        ResolvedSchema {
            schema: Arc::new(RegisteredSchema {
                id,
                schema: schema.into(),
                schema_type: t,
                references: vec![],
            }),
            references: vec![],
        }
    }

    fn frame(id: u32, body: &[u8]) -> Vec<u8> {
        let mut v = vec![0];
        v.extend_from_slice(&id.to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn a_schema_is_asked_for_once_then_decodes_every_record_written_with_it() {
        let mut d = SchemaDecoder::framed(Arc::new(Prefix));
        assert_eq!(d.decode(&frame(7, b"ab1")), Err(DecodeError::NeedSchema(7)));
        d.learn(7, Ok(&resolved(7, "ab", SchemaType::Avro)));
        assert_eq!(
            d.decode(&frame(7, b"ab1")),
            Ok(Decoded::Replaced(b"1".to_vec()))
        );
        assert_eq!(
            d.decode(&frame(7, b"ab2")),
            Ok(Decoded::Replaced(b"2".to_vec()))
        );
        match d.decode(&frame(7, b"x")) {
            Err(DecodeError::Record { why, schema_id }) => {
                assert_eq!(schema_id, Some(7));
                assert!(
                    why.contains("schema id 7") && why.contains("wrong prefix"),
                    "{why}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(d.decode(&frame(8, b"ab")), Err(DecodeError::NeedSchema(8)));
    }

    #[test]
    fn bad_frames_unknown_ids_and_unusable_schemas_are_the_records_fault() {
        let mut d = SchemaDecoder::framed(Arc::new(Prefix));
        for bad in [&b""[..], b"\x01\0\0\0\x07ab", b"\0\0\0"] {
            assert!(
                matches!(
                    d.decode(bad),
                    Err(DecodeError::Record {
                        schema_id: None,
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
        // Unknown to the registry: the records' error for a while, then asked again.
        assert_eq!(d.decode(&frame(9, b"ab")), Err(DecodeError::NeedSchema(9)));
        d.learn(9, Err("schema id 9 is unknown to the registry".into()));
        for _ in 0..3 {
            assert!(matches!(
                d.decode(&frame(9, b"ab")),
                Err(DecodeError::Record {
                    schema_id: Some(9),
                    ..
                })
            ));
        }
        d.unknown_ttl = Duration::ZERO;
        assert_eq!(d.decode(&frame(9, b"ab")), Err(DecodeError::NeedSchema(9)));
        d.learn(9, Ok(&resolved(9, "a", SchemaType::Avro)));
        assert_eq!(
            d.decode(&frame(9, b"ab")),
            Ok(Decoded::Replaced(b"b".to_vec()))
        );
        // A schema that does not compile, or of another type: kept, never refetched.
        d.learn(10, Ok(&resolved(10, "bad", SchemaType::Avro)));
        d.learn(11, Ok(&resolved(11, "ab", SchemaType::Protobuf)));
        for (id, what) in [(10, "does not compile"), (11, "Protobuf schema")] {
            for _ in 0..2 {
                match d.decode(&frame(id, b"ab")) {
                    Err(DecodeError::Record { why, schema_id }) => {
                        assert_eq!(schema_id, Some(id));
                        assert!(why.contains(what), "{why}");
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
    }

    #[test]
    fn a_fixed_schema_decodes_unframed_values() {
        let mut d = SchemaDecoder::fixed(Arc::new(Prefix), Arc::new("ab".to_string()));
        assert_eq!(d.decode(b"abc"), Ok(Decoded::Replaced(b"c".to_vec())));
        assert!(matches!(
            d.decode(&frame(1, b"abc")),
            Err(DecodeError::Record {
                schema_id: None,
                ..
            })
        ));
    }
}
