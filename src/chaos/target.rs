//! What the harness needs to know of a job file to verify it: the Kafka topics it
//! reads, the index it writes, how ids are derived, and its rolling sum.

use crate::connectors::elasticsearch::IdStrategy;
use std::path::Path;

/// The verifiable shape of a `kafka -> [rolling_sum] -> elasticsearch` job.
#[derive(Debug, Clone)]
pub struct Target {
    pub bootstrap_servers: String,
    pub topics: Vec<String>,
    pub topic_pattern: Option<regex::Regex>,
    pub es_url: String,
    pub index: String,
    pub id: IdStrategy,
    /// `(key pointer, field pointer, output pointer)` of a rolling_sum transform.
    pub rolling_sum: Option<(String, String, String)>,
    pub checkpoint_dir: std::path::PathBuf,
}

impl Target {
    /// Reads the parts of the job file the harness verifies. The job file is also
    /// validated in full by `config::load` before the harness starts.
    pub fn from_job_file(path: &Path) -> Result<Target, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let v = crate::config::expanded_table(&text, path).map_err(|e| e.to_string())?;
        let get = |p: &[&str]| -> Option<toml::Value> {
            let mut cur = toml::Value::Table(v.clone());
            for k in p {
                cur = cur.get(k)?.clone();
            }
            Some(cur)
        };
        let s = |p: &[&str]| get(p).and_then(|x| x.as_str().map(String::from));
        get(&["source", "kafka"]).ok_or("the chaos harness verifies [source.kafka] jobs")?;
        get(&["sink", "elasticsearch"])
            .ok_or("the chaos harness verifies [sink.elasticsearch] jobs")?;
        let topics = get(&["source", "kafka", "topics"])
            .and_then(|t| {
                t.as_array().map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(String::from))
                        .collect()
                })
            })
            .unwrap_or_default();
        let topic_pattern = s(&["source", "kafka", "topic_pattern"])
            .map(|p| regex::Regex::new(&p).map_err(|e| e.to_string()))
            .transpose()?;
        let rolling_sum = get(&["transform"]).and_then(|t| {
            t.as_array()?.iter().find_map(|x| {
                (x.get("type")?.as_str()? == "rolling_sum").then(|| {
                    (
                        x.get("key")
                            .and_then(|v| v.as_str())
                            .unwrap_or("/key")
                            .to_string(),
                        x.get("field")
                            .and_then(|v| v.as_str())
                            .unwrap_or("/value")
                            .to_string(),
                        x.get("output")
                            .and_then(|v| v.as_str())
                            .unwrap_or("/total")
                            .to_string(),
                    )
                })
            })
        });
        let base = path.parent().unwrap_or(Path::new("."));
        let dir = s(&["checkpoint", "dir"]).ok_or("checkpoint.dir is required")?;
        let dir = Path::new(&dir);
        Ok(Target {
            bootstrap_servers: s(&["source", "kafka", "bootstrap_servers"])
                .ok_or("source.kafka.bootstrap_servers")?,
            topics,
            topic_pattern,
            es_url: s(&["sink", "elasticsearch", "url"]).ok_or("sink.elasticsearch.url")?,
            index: s(&["sink", "elasticsearch", "index"]).ok_or("sink.elasticsearch.index")?,
            id: IdStrategy::parse(
                &s(&["sink", "elasticsearch", "id"]).unwrap_or_else(|| "coordinates".into()),
            )?,
            rolling_sum,
            checkpoint_dir: if dir.is_absolute() {
                dir.to_path_buf()
            } else {
                base.join(dir)
            },
        })
    }

    /// Whether the job reads `topic`.
    pub fn selects(&self, topic: &str) -> bool {
        match &self.topic_pattern {
            Some(r) => r
                .find(topic)
                .is_some_and(|m| m.start() == 0 && m.end() == topic.len()),
            None => self.topics.iter().any(|t| t == topic),
        }
    }
}
