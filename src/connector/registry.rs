//! The registry: every connector a job file can name, by the name it is written with
//! (`[source.<name>]`, `[sink.<name>]`, `[[transform]] type = "<name>"`).
//!
//! `lockgate run` reads job files with `crate::builtin::registry()`; a
//! program of its own adds its connectors to that list and hands the result to
//! [`crate::config::load`]:
//!
//! ```ignore
//! let registry = lockgate::builtin::registry().with_sink::<MySinkSection>("my_sink");
//! let job = lockgate::config::load(path, &registry)?;
//! ```

use super::section::{
    KeyError, PreparedSink, PreparedSource, PreparedTransform, SectionContext, SinkContext,
    SinkSection, SourceSection, TransformSection,
};
use std::sync::Arc;

/// A source section read from its table, not yet validated.
pub type ParsedSource = Box<dyn FnOnce(&SectionContext) -> Result<PreparedSource, KeyError>>;
/// A sink section read from its table, not yet validated.
pub type ParsedSink = Box<dyn for<'a> FnOnce(&SinkContext<'a>) -> Result<PreparedSink, KeyError>>;
/// A transform section read from its table, not yet validated.
pub type ParsedTransform =
    Box<dyn FnOnce(&SectionContext, usize) -> Result<PreparedTransform, KeyError>>;

type ParseSource = Arc<dyn Fn(toml::Value) -> Result<ParsedSource, KeyError> + Send + Sync>;
type ParseSink = Arc<dyn Fn(toml::Value) -> Result<ParsedSink, KeyError> + Send + Sync>;
type ParseTransform = Arc<dyn Fn(toml::Value) -> Result<ParsedTransform, KeyError> + Send + Sync>;

/// The connectors a job file can name, in the order they are listed in messages.
#[derive(Clone, Default)]
pub struct Registry {
    sources: Vec<(&'static str, ParseSource)>,
    sinks: Vec<(&'static str, ParseSink)>,
    transforms: Vec<(&'static str, ParseTransform)>,
    formats: crate::formats::Formats,
}

/// Deserializes a section's table; an error names the key relative to the section.
pub fn deserialize<T: serde::de::DeserializeOwned>(value: toml::Value) -> Result<T, KeyError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let key = if path == "." { String::new() } else { path };
        KeyError::new(key, e.into_inner().message().to_string())
    })
}

impl Registry {
    /// A registry without connectors (and with the built-in formats).
    pub fn empty() -> Registry {
        Registry::default()
    }

    /// Adds (or replaces) the source `name`, read from `[source.<name>]` as `S`.
    pub fn with_source<S: SourceSection>(mut self, name: &'static str) -> Registry {
        self.sources.retain(|(n, _)| *n != name);
        self.sources.push((
            name,
            Arc::new(|v| {
                let section = deserialize::<S>(v)?;
                Ok(Box::new(move |cx: &SectionContext| section.prepare(cx)) as ParsedSource)
            }),
        ));
        self
    }

    /// Adds (or replaces) the sink `name`, read from `[sink.<name>]` as `S`.
    pub fn with_sink<S: SinkSection>(mut self, name: &'static str) -> Registry {
        self.sinks.retain(|(n, _)| *n != name);
        self.sinks.push((
            name,
            Arc::new(|v| {
                let section = deserialize::<S>(v)?;
                Ok(Box::new(move |cx: &SinkContext<'_>| section.prepare(cx)) as ParsedSink)
            }),
        ));
        self
    }

    /// Adds (or replaces) the transform `name`, read from a `[[transform]]` of
    /// `type = "<name>"` as `T` (without its `type` key).
    pub fn with_transform<T: TransformSection>(mut self, name: &'static str) -> Registry {
        self.transforms.retain(|(n, _)| *n != name);
        self.transforms.push((
            name,
            Arc::new(|v| {
                let section = deserialize::<T>(v)?;
                Ok(
                    Box::new(move |cx: &SectionContext, i| section.prepare(cx, i))
                        as ParsedTransform,
                )
            }),
        ));
        self
    }

    /// Adds (or replaces) the record format `name` (`format = "<name>"`,
    /// `key_format = "<name>"` in a source section that reads formats).
    pub fn with_format(
        mut self,
        name: &'static str,
        build: crate::formats::catalog::Build,
    ) -> Registry {
        self.formats = self.formats.with(name, build);
        self
    }

    /// The record formats a source section can name.
    pub fn formats(&self) -> &crate::formats::Formats {
        &self.formats
    }

    /// The names of the sources, in order.
    pub fn source_names(&self) -> Vec<&'static str> {
        self.sources.iter().map(|(n, _)| *n).collect()
    }

    /// The names of the sinks, in order.
    pub fn sink_names(&self) -> Vec<&'static str> {
        self.sinks.iter().map(|(n, _)| *n).collect()
    }

    /// The names of the transforms, in order.
    pub fn transform_names(&self) -> Vec<&'static str> {
        self.transforms.iter().map(|(n, _)| *n).collect()
    }

    /// Reads the source section `name` from its table (serde: unknown keys, types);
    /// `None` if no source has that name.
    pub fn parse_source(
        &self,
        name: &str,
        table: toml::Value,
    ) -> Option<Result<ParsedSource, KeyError>> {
        let (_, parse) = self.sources.iter().find(|(n, _)| *n == name)?;
        Some(parse(table))
    }

    /// Reads the sink section `name` from its table; `None` if no sink has that name.
    pub fn parse_sink(
        &self,
        name: &str,
        table: toml::Value,
    ) -> Option<Result<ParsedSink, KeyError>> {
        let (_, parse) = self.sinks.iter().find(|(n, _)| *n == name)?;
        Some(parse(table))
    }

    /// Reads a transform section of type `name` from its table (without its `type`);
    /// `None` if no transform has that name.
    pub fn parse_transform(
        &self,
        name: &str,
        table: toml::Value,
    ) -> Option<Result<ParsedTransform, KeyError>> {
        let (_, parse) = self.transforms.iter().find(|(n, _)| *n == name)?;
        Some(parse(table))
    }

    /// Reads and prepares the source section `name`; `None` if no source has that name.
    pub fn prepare_source(
        &self,
        name: &str,
        table: toml::Value,
        cx: &SectionContext,
    ) -> Option<Result<PreparedSource, KeyError>> {
        Some(self.parse_source(name, table)?.and_then(|p| p(cx)))
    }

    /// Reads and prepares the sink section `name`; `None` if no sink has that name.
    pub fn prepare_sink(
        &self,
        name: &str,
        table: toml::Value,
        cx: &SinkContext<'_>,
    ) -> Option<Result<PreparedSink, KeyError>> {
        Some(self.parse_sink(name, table)?.and_then(|p| p(cx)))
    }
}

/// Names in a message: `a`, `a or b`, `a, b or c`.
pub fn one_of(names: &[String]) -> String {
    match names {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_in_messages() {
        let n = |v: &[&str]| one_of(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(n(&[]), "");
        assert_eq!(n(&["a"]), "a");
        assert_eq!(n(&["a", "b"]), "a or b");
        assert_eq!(n(&["a", "b", "c"]), "a, b or c");
    }

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Section {
        n: u32,
        inner: Option<Inner>,
    }

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        m: u32,
    }

    #[test]
    fn deserialize_errors_name_the_key_relative_to_the_section() {
        let v = |t: &str| toml::Value::Table(toml::from_str(t).unwrap());
        let e = deserialize::<Section>(v("n = \"x\"")).err().unwrap();
        assert_eq!(e.key, "n");
        let e = deserialize::<Section>(v("n = 1\n[inner]\nm = 1\nk = 2"))
            .err()
            .unwrap();
        assert_eq!(e.key, "inner.k", "{e:?}");
        assert!(e.message.contains("unknown field `k`"), "{e:?}");
        let e = deserialize::<Section>(v("")).err().unwrap();
        assert_eq!(e.key, "", "{e:?}");
        assert!(e.message.contains("missing field `n`"), "{e:?}");
    }
}
