//! The formats a job file can name, each one entry: a name and how it is built from the
//! format keys of its source section. The connector registry holds this list
//! (`Registry::with_format` adds one), so a program with a format of its own adds it
//! the way it adds a connector.

use super::avro::Temporal;
use super::avro_format::{AvroCodec, AvroFormat};
use super::json_schema::JsonSchemaFormat;
use super::plain::Plain;
use super::protobuf::ProtobufFormat;
use super::registry::RegistryClient;
use super::{FormatRef, Output};
use std::path::PathBuf;
use std::sync::Arc;

/// The format keys of a source section, for one side (the value, or the key), checked
/// and with paths resolved. An error a format returns is `(key, message)`, the key
/// named through [`FormatOptions::key`].
#[derive(Debug, Clone)]
pub struct FormatOptions {
    /// Prepended to the option keys in errors: `""` for the value, `"key_"` for the
    /// key (`key_schema_file`).
    pub prefix: &'static str,
    /// The Schema Registry of the section, if it has one.
    pub registry: Option<Arc<RegistryClient>>,
    /// `schema_file` / `key_schema_file`: the fixed schema of unframed values.
    pub schema_file: Option<PathBuf>,
    /// `reader_schema_file` / `key_reader_schema_file` (Avro).
    pub reader_schema_file: Option<PathBuf>,
    /// `message` / `key_message` (Protobuf with a fixed `.proto`).
    pub message: Option<String>,
    /// `temporal`: how times are written.
    pub temporal: Temporal,
    /// `connect_envelope` / `key_connect_envelope` (`json`): values are Kafka
    /// Connect's `{"schema", "payload"}` envelopes, unwrapped.
    pub connect_envelope: bool,
}

impl FormatOptions {
    /// The key `name` as the job file spells it for this side.
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// Reads the file of option `name`; the error names the key.
    pub fn read(&self, name: &str, path: &std::path::Path) -> Result<String, (String, String)> {
        std::fs::read_to_string(path).map_err(|e| {
            (
                self.key(name),
                format!("cannot read {}: {e}", path.display()),
            )
        })
    }

    /// An error naming option `name`.
    pub fn err(&self, name: &str, message: impl Into<String>) -> (String, String) {
        (self.key(name), message.into())
    }

    /// Refuses the options a schema-less format does not take.
    fn none_of(&self, format: &str, names: &[&str]) -> Result<(), (String, String)> {
        let given = |n: &str| match n {
            "schema_file" => self.schema_file.is_some(),
            "reader_schema_file" => self.reader_schema_file.is_some(),
            "message" => self.message.is_some(),
            _ => false,
        };
        match names.iter().copied().find(|n| given(n)) {
            Some(n) => Err(self.err(n, format!("the {format} format takes no {n}"))),
            None => Ok(()),
        }
    }
}

/// How a format is built from its options.
pub type Build = Arc<dyn Fn(&FormatOptions) -> Result<FormatRef, (String, String)> + Send + Sync>;

/// The formats a job file can name, in the order messages list them.
#[derive(Clone)]
pub struct Formats {
    entries: Vec<(&'static str, Build)>,
}

impl std::fmt::Debug for Formats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

impl Default for Formats {
    fn default() -> Formats {
        Formats::builtin()
    }
}

impl Formats {
    /// The formats lockgate ships: `json`, `text`, `bytes`, `avro`, `protobuf`,
    /// `json-schema`.
    pub fn builtin() -> Formats {
        Formats { entries: vec![] }
            .with("json", plain(Output::Json))
            .with("text", plain(Output::Text))
            .with("bytes", plain(Output::Bytes))
            .with("avro", Arc::new(avro))
            .with("protobuf", Arc::new(protobuf))
            .with("json-schema", Arc::new(json_schema))
    }

    /// Adds (or replaces) the format `name`.
    pub fn with(mut self, name: &'static str, build: Build) -> Formats {
        self.entries.retain(|(n, _)| *n != name);
        self.entries.push((name, build));
        self
    }

    /// The names, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.entries.iter().map(|(n, _)| *n).collect()
    }

    /// Builds the format `name` (given under the key `key`) with `options`.
    pub fn build(
        &self,
        key: &str,
        name: &str,
        options: &FormatOptions,
    ) -> Result<FormatRef, (String, String)> {
        if options.connect_envelope && name != "json" {
            return Err(options.err(
                "connect_envelope",
                format!("applies to format = \"json\", not {name:?}"),
            ));
        }
        match self.entries.iter().find(|(n, _)| *n == name) {
            Some((_, build)) => build(options),
            None => Err((
                key.to_string(),
                format!("`{name}` is not one of {}", self.names().join(", ")),
            )),
        }
    }
}

fn plain(output: Output) -> Build {
    Arc::new(move |o: &FormatOptions| {
        o.none_of(
            output.name(),
            &["schema_file", "reader_schema_file", "message"],
        )?;
        if o.connect_envelope && output == Output::Json {
            return Ok(FormatRef::new(super::connect_json::ConnectJson {
                temporal: o.temporal,
            }));
        }
        Ok(FormatRef::new(Plain(output)))
    })
}

fn avro(o: &FormatOptions) -> Result<FormatRef, (String, String)> {
    o.none_of("avro", &["message"])?;
    let reader = match &o.reader_schema_file {
        Some(p) => Some(o.read("reader_schema_file", p)?),
        None => None,
    };
    let codec = AvroCodec::new(o.temporal, reader.as_deref())
        .map_err(|e| o.err("reader_schema_file", e))?;
    let format = match (&o.registry, &o.schema_file) {
        (Some(_), Some(_)) => {
            return Err(o.err(
                "schema_file",
                "values read through a schema_registry carry their schema id: give schema_registry or schema_file, not both",
            ))
        }
        (Some(r), None) => AvroFormat::framed(codec, r.clone()),
        (None, Some(p)) => {
            let text = o.read("schema_file", p)?;
            AvroFormat::fixed(codec, &text).map_err(|e| o.err("schema_file", e))?
        }
        (None, None) => {
            return Err(o.err(
                "format",
                "the avro format needs a [schema_registry] (framed values) or a schema_file (unframed values)",
            ))
        }
    };
    Ok(FormatRef::new(format))
}

fn protobuf(o: &FormatOptions) -> Result<FormatRef, (String, String)> {
    o.none_of("protobuf", &["reader_schema_file"])?;
    let format = match (&o.registry, &o.schema_file) {
        (Some(_), Some(_)) => {
            return Err(o.err(
                "schema_file",
                "values read through a schema_registry carry their schema id: give schema_registry or schema_file, not both",
            ))
        }
        (Some(r), None) => {
            if o.message.is_some() {
                return Err(o.err("message", "framed values name their message: message goes with schema_file"));
            }
            ProtobufFormat::framed(o.temporal, r.clone())
        }
        (None, Some(p)) => {
            let message = o
                .message
                .as_deref()
                .ok_or_else(|| o.err("message", "a schema_file needs the message its values are (`package.Message`)"))?;
            ProtobufFormat::fixed(o.temporal, p, message).map_err(|(k, m)| o.err(k, m))?
        }
        (None, None) => {
            return Err(o.err(
                "format",
                "the protobuf format needs a [schema_registry] (framed values) or a schema_file and message (unframed values)",
            ))
        }
    };
    Ok(FormatRef::new(format))
}

fn json_schema(o: &FormatOptions) -> Result<FormatRef, (String, String)> {
    o.none_of(
        "json-schema",
        &["schema_file", "reader_schema_file", "message"],
    )?;
    match &o.registry {
        Some(r) => Ok(FormatRef::new(JsonSchemaFormat::new(r.clone()))),
        None => Err(o.err(
            "format",
            "the json-schema format reads values framed by a Schema Registry serializer: give a [schema_registry] (unframed JSON is format = \"json\")",
        )),
    }
}
