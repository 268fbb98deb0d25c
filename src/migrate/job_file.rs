//! The job file a translation writes: sections of keys, each key with a comment naming
//! the Kafka Connect settings it came from.

/// One `key = value` line and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub key: String,
    pub value: toml::Value,
    /// The Kafka Connect settings it translates (empty: lockgate's own choice, with
    /// `why` saying so).
    pub from: Vec<String>,
    /// A note written above the key.
    pub why: Option<String>,
}

/// A `[section]` (or `[[section]]` with `array`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Section {
    pub header: String,
    pub array: bool,
    pub entries: Vec<Entry>,
}

/// A job file being written.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JobFile {
    pub sections: Vec<Section>,
}

impl JobFile {
    /// The section `header` (the first of that name; made at the end if absent).
    pub fn section(&mut self, header: &str) -> &mut Section {
        match self
            .sections
            .iter()
            .position(|s| s.header == header && !s.array)
        {
            Some(i) => &mut self.sections[i],
            None => {
                self.sections.push(Section {
                    header: header.into(),
                    ..Default::default()
                });
                self.sections.last_mut().expect("pushed")
            }
        }
    }

    /// A new `[[header]]` section.
    pub fn array_section(&mut self, header: &str) -> &mut Section {
        self.sections.push(Section {
            header: header.into(),
            array: true,
            ..Default::default()
        });
        self.sections.last_mut().expect("pushed")
    }

    /// The value of `key` in section `header`, if set.
    pub fn get(&self, header: &str, key: &str) -> Option<&toml::Value> {
        self.sections
            .iter()
            .filter(|s| s.header == header && !s.array)
            .flat_map(|s| &s.entries)
            .find(|e| e.key == key)
            .map(|e| &e.value)
    }

    /// The file's text.
    pub fn render(&self, preamble: &str) -> String {
        let mut out = String::new();
        for line in preamble.lines() {
            out.push_str(&format!("# {line}\n").replace("# \n", "#\n"));
        }
        for s in &self.sections {
            if s.entries.is_empty() && !s.array {
                continue;
            }
            out.push('\n');
            if s.array {
                out.push_str(&format!("[[{}]]\n", s.header));
            } else {
                out.push_str(&format!("[{}]\n", s.header));
            }
            for e in &s.entries {
                if let Some(why) = &e.why {
                    for line in why.lines() {
                        out.push_str(&format!("# {line}\n"));
                    }
                }
                if !e.from.is_empty() {
                    out.push_str(&format!("# from {}\n", e.from.join(", ")));
                }
                out.push_str(&format!("{} = {}\n", key(&e.key), value(&e.value)));
            }
        }
        out
    }
}

impl Section {
    /// Sets `key` (replacing an earlier value of it).
    pub fn set(&mut self, key: &str, value: impl Into<toml::Value>, from: &[&str]) -> &mut Entry {
        let entry = Entry {
            key: key.into(),
            value: value.into(),
            from: from.iter().map(|s| s.to_string()).collect(),
            why: None,
        };
        match self.entries.iter().position(|e| e.key == key) {
            Some(i) => {
                self.entries[i] = entry;
                &mut self.entries[i]
            }
            None => {
                self.entries.push(entry);
                self.entries.last_mut().expect("pushed")
            }
        }
    }
}

impl Entry {
    /// Adds a note above the key.
    pub fn because(&mut self, why: impl Into<String>) -> &mut Entry {
        self.why = Some(why.into());
        self
    }
}

/// A key as TOML writes it: bare when it can be, else quoted.
fn key(k: &str) -> String {
    if !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        k.to_string()
    } else {
        toml::Value::String(k.into()).to_string()
    }
}

/// A value as TOML writes it inline (tables as inline tables).
fn value(v: &toml::Value) -> String {
    match v {
        toml::Value::Table(t) => {
            let parts: Vec<String> = t
                .iter()
                .map(|(k, v)| format!("{} = {}", key(k), value(v)))
                .collect();
            format!("{{ {} }}", parts.join(", "))
        }
        toml::Value::Array(a) => {
            let parts: Vec<String> = a.iter().map(value).collect();
            format!("[{}]", parts.join(", "))
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_renders_with_the_origin_of_each_key_and_parses_back() {
        let mut f = JobFile::default();
        f.section("job").set("name", "orders", &["name"]);
        let mut props = toml::map::Map::new();
        props.insert("a b".into(), toml::Value::String("x\"y".into()));
        f.section("sink.elasticsearch")
            .set(
                "topic_to_index",
                toml::Value::Table(props),
                &["topic.to.external.resource.mapping"],
            )
            .because("a note");
        f.section("source.kafka.properties").set(
            "fetch.wait.max.ms",
            "500",
            &["consumer.override.fetch.max.wait.ms"],
        );
        f.array_section("transform")
            .set("type", "flatten", &["transforms.f.type"]);
        let text = f.render("made by a test");
        assert!(text.starts_with("# made by a test\n"), "{text}");
        assert!(text.contains("# from topic.to.external.resource.mapping\ntopic_to_index = { \"a b\" = 'x\"y' }\n"), "{text}");
        assert!(text.contains("\"fetch.wait.max.ms\" = \"500\""), "{text}");
        let back: toml::Value = toml::from_str(&text).unwrap();
        assert_eq!(back["job"]["name"].as_str(), Some("orders"));
        assert_eq!(back["transform"][0]["type"].as_str(), Some("flatten"));
        assert_eq!(
            back["sink"]["elasticsearch"]["topic_to_index"]["a b"].as_str(),
            Some("x\"y")
        );
        assert_eq!(
            f.get("job", "name").and_then(|v| v.as_str()),
            Some("orders")
        );
    }
}
