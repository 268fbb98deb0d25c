//! The job file a translation writes: sections of keys, each key with a comment naming
//! the Kafka Connect settings it came from.

/// The comment that marks the place of a step the file does not do.
pub const LEFT_OUT_MARK: &str = "LEFT OUT:";

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
    /// A step of the connector's that the file does not do (`setting: why`): written
    /// as a `# LEFT OUT:` comment in the key's place, and no key.
    pub left_out: Option<String>,
}

/// A `[section]` (or `[[section]]` with `array`; with an empty header, comments only).
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

    /// A comment-only place after the sections so far (between two `[[transform]]`s),
    /// saying that a step of the connector is missing there.
    pub fn left_out_step(&mut self, at: usize, setting: &str, why: &str) {
        self.sections.insert(
            at,
            Section {
                header: String::new(),
                array: false,
                entries: vec![Entry::left_out(setting, why)],
            },
        );
    }

    /// The value of `key` in section `header`, if set.
    pub fn get(&self, header: &str, key: &str) -> Option<&toml::Value> {
        self.sections
            .iter()
            .filter(|s| s.header == header && !s.array)
            .flat_map(|s| &s.entries)
            .find(|e| e.key == key && e.left_out.is_none())
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
            if s.header.is_empty() {
                // Comments only: a missing step between two sections.
            } else if s.array {
                out.push_str(&format!("[[{}]]\n", s.header));
            } else {
                out.push_str(&format!("[{}]\n", s.header));
            }
            for e in &s.entries {
                if let Some(what) = &e.left_out {
                    out.push_str(&format!("# {LEFT_OUT_MARK} {what}\n"));
                    continue;
                }
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
            left_out: None,
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
    /// The place of a missing step: `setting` and why it is missing.
    pub fn left_out(setting: &str, why: &str) -> Entry {
        Entry {
            key: String::new(),
            value: toml::Value::Boolean(false),
            from: Vec::new(),
            why: None,
            left_out: Some(format!("{setting}: {why}")),
        }
    }

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
