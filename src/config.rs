//! The TOML job file: the contract of `lockgate run --config`.
//!
//! Unknown keys are errors; every error names the file and the key. Relative paths are
//! resolved against the directory of the job file, so a job runs the same from anywhere.

use crate::connectors::file_sink::FileSink;
use crate::connectors::sequence::SequenceSource;
use crate::job::{CheckpointSettings, ExponentialDelay, Job, JobGraph, RestartPolicy};
use crate::secret::{read_secret_file, Secret};
use lockgate_state::store::{CheckpointLocation, StoreLocation};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// A configuration error: the file, the key, and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {key}: {message}")]
pub struct ConfigError {
    pub file: PathBuf,
    pub key: String,
    pub message: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JobFile {
    job: JobSection,
    checkpoint: CheckpointSection,
    #[serde(default)]
    restart: RestartSection,
    source: SourceSection,
    #[serde(default)]
    transform: Vec<TransformSection>,
    sink: SinkSection,
    #[serde(default)]
    metrics: Option<MetricsSection>,
    #[serde(default)]
    state: StateSection,
}

/// `[state]`: memory of each keyed subtask's RocksDB instance.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateSection {
    write_buffer_bytes: Option<u64>,
    block_cache_bytes: Option<u64>,
}

impl StateSection {
    fn options(&self) -> Result<lockgate_state::BackendOptions, (String, String)> {
        let d = lockgate_state::BackendOptions::default();
        let write_buffer_bytes = match self.write_buffer_bytes {
            None => d.write_buffer_bytes,
            Some(n) if (64 << 10..=1 << 30).contains(&n) => n as usize,
            Some(_) => {
                return Err((
                    "state.write_buffer_bytes".into(),
                    "must be between 65536 (64 KiB) and 1073741824 (1 GiB)".into(),
                ))
            }
        };
        let block_cache_bytes = match self.block_cache_bytes {
            None => d.block_cache_bytes,
            Some(n) if n <= 1 << 36 => n as usize,
            Some(_) => {
                return Err((
                    "state.block_cache_bytes".into(),
                    "must be at most 68719476736 (64 GiB); 0 disables the cache".into(),
                ))
            }
        };
        Ok(lockgate_state::BackendOptions {
            write_buffer_bytes,
            block_cache_bytes,
        })
    }
}

/// `[metrics]`: the HTTP listener of metrics, probes, the REST API and the status page.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MetricsSection {
    /// `host:port` with a literal IP (`127.0.0.1:9464`, `0.0.0.0:9464`).
    listen: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JobSection {
    name: String,
    #[serde(default = "one")]
    parallelism: u16,
    #[serde(default = "default_max_parallelism")]
    max_parallelism: u16,
    /// The source's topics are partitioned by the key of the `key_by`: keyed state is
    /// kept per source partition, so that the job can run as several members.
    #[serde(default)]
    co_partitioned: bool,
}

fn one() -> u16 {
    1
}
fn default_max_parallelism() -> u16 {
    128
}

/// `[checkpoint]`: absent keys take [`CheckpointSettings::new`]'s defaults.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckpointSection {
    /// A local directory, or an object-store URL (`s3://bucket/prefix`).
    dir: String,
    interval_ms: Option<u64>,
    timeout_ms: Option<u64>,
    min_pause_ms: Option<u64>,
    retain: Option<usize>,
    tolerable_failures: Option<u32>,
    /// With a store `dir`: the local staging directory (default
    /// [`default_staging_base`]`/<scheme>/<bucket>/<prefix>`).
    local_dir: Option<PathBuf>,
    /// S3 client settings; each wins over its `AWS_*` environment variable.
    endpoint: Option<String>,
    region: Option<String>,
    allow_http: Option<bool>,
    access_key_id: Option<String>,
    secret_access_key: Option<Secret>,
    secret_access_key_file: Option<PathBuf>,
}

/// Where the local staging directories of object-store checkpoints go when
/// `checkpoint.local_dir` is not set: `lockgate-checkpoints` in the system's temporary
/// directory (`$TMPDIR`, else `/tmp`). A new machine starts with it empty and restores
/// from the store.
pub fn default_staging_base() -> PathBuf {
    std::env::temp_dir().join("lockgate-checkpoints")
}

impl CheckpointSection {
    /// The settings, with `dir` as given (resolved by the caller).
    fn settings(&self, dir: PathBuf) -> CheckpointSettings {
        let d = CheckpointSettings::new(dir);
        CheckpointSettings {
            interval_ms: self.interval_ms.unwrap_or(d.interval_ms),
            timeout_ms: self.timeout_ms.unwrap_or(d.timeout_ms),
            min_pause_ms: self.min_pause_ms.unwrap_or(d.min_pause_ms),
            retain: self.retain.unwrap_or(d.retain),
            tolerable_failures: self.tolerable_failures.unwrap_or(d.tolerable_failures),
            dir: d.dir,
            store: None,
        }
    }

    /// The local directory (resolved with `resolve`) and the store location, if `dir`
    /// is a URL. Errors name the key.
    fn location(
        &self,
        resolve: &dyn Fn(&Path) -> PathBuf,
    ) -> Result<(PathBuf, Option<StoreLocation>), (String, String)> {
        let key = |k: &str| format!("checkpoint.{k}");
        let s3_keys = [
            ("endpoint", self.endpoint.is_some()),
            ("region", self.region.is_some()),
            ("allow_http", self.allow_http.is_some()),
            ("access_key_id", self.access_key_id.is_some()),
            ("secret_access_key", self.secret_access_key.is_some()),
            (
                "secret_access_key_file",
                self.secret_access_key_file.is_some(),
            ),
        ];
        let location = CheckpointLocation::parse(&self.dir).map_err(|m| (key("dir"), m))?;
        let store = match location {
            CheckpointLocation::Local(p) => {
                let only_store = s3_keys
                    .iter()
                    .find(|(_, set)| *set)
                    .map(|(k, _)| *k)
                    .or(self.local_dir.as_ref().map(|_| "local_dir"));
                if let Some(k) = only_store {
                    return Err((
                        key(k),
                        "applies only to an object-store checkpoint.dir (s3://bucket/prefix)"
                            .into(),
                    ));
                }
                return Ok((resolve(&p), None));
            }
            CheckpointLocation::Store(s) => s,
        };
        if !matches!(store.scheme(), "s3" | "s3a") {
            if let Some((k, _)) = s3_keys.iter().find(|(_, set)| *set) {
                return Err((
                    key(k),
                    format!(
                        "is an S3 setting; a {}:// store takes its settings from its environment variables",
                        store.scheme()
                    ),
                ));
            }
        }
        let secret = match (&self.secret_access_key, &self.secret_access_key_file) {
            (Some(_), Some(_)) => {
                return Err((
                    key("secret_access_key"),
                    "set secret_access_key or secret_access_key_file, not both".into(),
                ))
            }
            (Some(s), None) => Some(s.clone()),
            (None, Some(f)) => Some(
                read_secret_file(&resolve(f)).map_err(|m| (key("secret_access_key_file"), m))?,
            ),
            (None, None) => None,
        };
        if secret.is_some() != self.access_key_id.is_some() {
            return Err((
                key(if secret.is_some() {
                    "access_key_id"
                } else {
                    "secret_access_key"
                }),
                "access_key_id and secret_access_key (or secret_access_key_file) go together"
                    .into(),
            ));
        }
        let mut store = store;
        let options: [(&str, Option<String>); 5] = [
            ("aws_endpoint", self.endpoint.clone()),
            ("aws_region", self.region.clone()),
            ("aws_allow_http", self.allow_http.map(|b| b.to_string())),
            ("aws_access_key_id", self.access_key_id.clone()),
            (
                "aws_secret_access_key",
                secret.map(|s| s.expose().to_string()),
            ),
        ];
        for (k, v) in options {
            if let Some(v) = v {
                store = store.with_option(k, v);
            }
        }
        // Builds the client once, so that a bad setting is a configuration error.
        store.open().map_err(|m| (key("dir"), m))?;
        let local = match &self.local_dir {
            Some(p) => resolve(p),
            None => store.staging_dir(&default_staging_base()),
        };
        Ok((local, Some(store)))
    }
}

/// `[restart]`: absent keys take the defaults of [`RestartPolicy::default`] /
/// [`ExponentialDelay::default`] and, for the other strategies, Flink's (failure-rate:
/// 1 failure per 60 s, 1 s delay) or lockgate's earlier ones (fixed-delay: 3 attempts,
/// 1 s). A key of another strategy is an error naming it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RestartSection {
    strategy: Option<String>,
    attempts: Option<u32>,
    delay_ms: Option<u64>,
    initial_delay_ms: Option<u64>,
    max_delay_ms: Option<u64>,
    multiplier: Option<f64>,
    jitter: Option<f64>,
    reset_after_ms: Option<u64>,
    max_failures: Option<u32>,
    interval_ms: Option<u64>,
}

impl RestartSection {
    /// The keys present, by name.
    fn present(&self) -> Vec<&'static str> {
        let keys = [
            ("attempts", self.attempts.is_some()),
            ("delay_ms", self.delay_ms.is_some()),
            ("initial_delay_ms", self.initial_delay_ms.is_some()),
            ("max_delay_ms", self.max_delay_ms.is_some()),
            ("multiplier", self.multiplier.is_some()),
            ("jitter", self.jitter.is_some()),
            ("reset_after_ms", self.reset_after_ms.is_some()),
            ("max_failures", self.max_failures.is_some()),
            ("interval_ms", self.interval_ms.is_some()),
        ];
        keys.iter().filter(|k| k.1).map(|k| k.0).collect()
    }

    fn policy(&self) -> Result<RestartPolicy, (String, String)> {
        let strategy = self.strategy.as_deref().unwrap_or("exponential-delay");
        let allowed: &[&str] = match strategy {
            "none" => &[],
            "fixed-delay" => &["attempts", "delay_ms"],
            "failure-rate" => &["max_failures", "interval_ms", "delay_ms"],
            "exponential-delay" => &[
                "initial_delay_ms",
                "max_delay_ms",
                "multiplier",
                "jitter",
                "reset_after_ms",
                "attempts",
            ],
            other => {
                return Err((
                    "restart.strategy".into(),
                    format!(
                        "`{other}` is not one of exponential-delay, failure-rate, fixed-delay, none"
                    ),
                ))
            }
        };
        if let Some(k) = self.present().into_iter().find(|k| !allowed.contains(k)) {
            return Err((
                format!("restart.{k}"),
                format!("is not a key of strategy = \"{strategy}\""),
            ));
        }
        let policy = match strategy {
            "none" => RestartPolicy::None,
            "fixed-delay" => RestartPolicy::FixedDelay {
                attempts: self.attempts.unwrap_or(3),
                delay_ms: self.delay_ms.unwrap_or(1000),
            },
            "failure-rate" => RestartPolicy::FailureRate {
                max_failures: self.max_failures.unwrap_or(1),
                interval_ms: self.interval_ms.unwrap_or(60_000),
                delay_ms: self.delay_ms.unwrap_or(1000),
            },
            _ => {
                let d = ExponentialDelay::default();
                RestartPolicy::ExponentialDelay(ExponentialDelay {
                    initial_delay_ms: self.initial_delay_ms.unwrap_or(d.initial_delay_ms),
                    max_delay_ms: self.max_delay_ms.unwrap_or(d.max_delay_ms),
                    multiplier: self.multiplier.unwrap_or(d.multiplier),
                    jitter: self.jitter.unwrap_or(d.jitter),
                    reset_after_ms: self.reset_after_ms.unwrap_or(d.reset_after_ms),
                    attempts: self.attempts.unwrap_or(d.attempts),
                })
            }
        };
        policy
            .validate()
            .map_err(|(k, why)| (format!("restart.{k}"), why))?;
        Ok(policy)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SourceSection {
    sequence: Option<crate::connectors::sequence::SequenceSection>,
    kafka: Option<crate::connectors::kafka::config::KafkaSection>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, tag = "type", rename_all = "snake_case")]
enum TransformSection {
    RollingSum(crate::operators::rolling_sum::RollingSumSection),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SinkSection {
    file: Option<crate::connectors::file_sink::FileSection>,
    elasticsearch: Option<crate::connectors::elasticsearch::config::EsSection>,
    kafka: Option<crate::connectors::kafka::sink_config::KafkaSinkSection>,
}

impl SinkSection {
    /// The names of the sink tables present.
    fn present(&self) -> Vec<&'static str> {
        [
            ("file", self.file.is_some()),
            ("elasticsearch", self.elasticsearch.is_some()),
            ("kafka", self.kafka.is_some()),
        ]
        .into_iter()
        .filter_map(|(n, p)| p.then_some(n))
        .collect()
    }
}

/// Reads and validates a job file.
pub fn load(path: &Path) -> Result<JobGraph, ConfigError> {
    parse(&read_text(path)?, path)
}

fn read_text(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: path.to_path_buf(),
        key: "(file)".into(),
        message: format!("cannot read: {e}"),
    })
}

/// Parses job-file text into a TOML table with every `${NAME}` / `${NAME:-default}`
/// expanded from the environment ([`crate::interpolate`]).
pub fn expanded_table(text: &str, path: &Path) -> Result<toml::Table, ConfigError> {
    let err = |key: &str, message: String| ConfigError {
        file: path.to_path_buf(),
        key: key.to_string(),
        message,
    };
    let table: toml::Table = toml::from_str(text).map_err(|e| {
        err(
            "(syntax)",
            e.to_string().lines().collect::<Vec<_>>().join(" "),
        )
    })?;
    let mut value = toml::Value::Table(table);
    crate::interpolate::expand_toml(&mut value, "", &|name| std::env::var(name).ok())
        .map_err(|(key, message)| err(&key, message))?;
    match value {
        toml::Value::Table(t) => Ok(t),
        _ => unreachable!("a table stays a table"),
    }
}

fn read_file(text: &str, path: &Path) -> Result<JobFile, ConfigError> {
    let table = expanded_table(text, path)?;
    serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
        let key = e.path().to_string();
        let inner = e.into_inner();
        ConfigError {
            file: path.to_path_buf(),
            key,
            message: inner.message().to_string(),
        }
    })
}

/// The typed settings of a job file, for tools that reason about a job (the chaos
/// harness verifies against them): the same parse, defaults and validation as [`load`].
#[derive(Debug, Clone)]
pub struct JobDescription {
    pub name: String,
    /// The checkpoint directory, resolved against the job file's directory (the local
    /// staging directory of a store).
    pub checkpoint_dir: PathBuf,
    /// The object store that keeps the checkpoints, as written (`s3://bucket/prefix`).
    pub checkpoint_store: Option<String>,
    pub kafka: Option<crate::connectors::kafka::KafkaSourceConfig>,
    pub elasticsearch: Option<crate::connectors::elasticsearch::EsSinkConfig>,
    /// The file sink's directory, resolved against the job file's directory.
    pub file_sink: Option<PathBuf>,
    /// `(key, field, output)` JSON pointers of each `rolling_sum`, in order.
    pub rolling_sums: Vec<(String, String, String)>,
    /// The Kafka sink, for a repartition stage.
    pub kafka_sink: Option<crate::connectors::kafka::sink_config::KafkaSinkConfig>,
}

/// Reads a job file's typed settings (after validating the whole file with [`load`]).
pub fn describe(path: &Path) -> Result<JobDescription, ConfigError> {
    let text = read_text(path)?;
    // The whole file validates as `load` would, from the same text.
    parse(&text, path)?;
    let err = |key: &str, message: String| ConfigError {
        file: path.to_path_buf(),
        key: key.to_string(),
        message,
    };
    let file = read_file(&text, path)?;
    let base = path.parent().unwrap_or(Path::new("."));
    let kafka = match &file.source.kafka {
        Some(k) => Some(kafka_config(k, &file.job.name, &err)?),
        None => None,
    };
    let elasticsearch = match &file.sink.elasticsearch {
        Some(e) => {
            let ctx = crate::connectors::elasticsearch::config::SinkContext {
                dead_letter_kafka: kafka
                    .as_ref()
                    .map(|k| (k.bootstrap_servers.clone(), k.properties.clone())),
                checkpoint_timeout_ms: file.checkpoint.settings(PathBuf::new()).timeout_ms,
                offsets_per_partition: kafka.is_some(),
                base_dir: base.to_path_buf(),
            };
            Some(
                e.config(&ctx)
                    .map_err(|(k, m)| err(&qualify("sink.elasticsearch", &k), m))?,
            )
        }
        None => None,
    };
    let kafka_sink = match &file.sink.kafka {
        Some(k) => Some(
            k.config(
                kafka.as_ref(),
                file.checkpoint.settings(PathBuf::new()).timeout_ms,
            )
            .map_err(|(key, m)| err(&format!("sink.kafka.{key}"), m))?,
        ),
        None => None,
    };
    let (checkpoint_dir, store) = file
        .checkpoint
        .location(&|p: &Path| base.join(p))
        .map_err(|(k, m)| err(&k, m))?;
    Ok(JobDescription {
        kafka_sink,
        name: file.job.name.clone(),
        checkpoint_dir,
        checkpoint_store: store.map(|_| file.checkpoint.dir.clone()),
        kafka,
        elasticsearch,
        file_sink: match &file.sink.file {
            Some(f) => Some(
                f.config(&|p: &Path| base.join(p))
                    .map_err(|(k, m)| err(&format!("sink.file.{k}"), m))?
                    .dir,
            ),
            None => None,
        },
        rolling_sums: file
            .transform
            .iter()
            .map(|t| match t {
                TransformSection::RollingSum(r) => r.pointers(),
            })
            .collect(),
    })
}

/// Parses job-file text; `path` names errors and anchors relative paths.
pub fn parse(text: &str, path: &Path) -> Result<JobGraph, ConfigError> {
    let err = |key: &str, message: String| ConfigError {
        file: path.to_path_buf(),
        key: key.to_string(),
        message,
    };
    let file = read_file(text, path)?;
    let base = path.parent().unwrap_or(Path::new("."));
    let resolve = |p: &Path| {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            base.join(p)
        }
    };

    let j = &file.job;
    if j.max_parallelism == 0 || j.max_parallelism > 32768 {
        return Err(err(
            "job.max_parallelism",
            "must be between 1 and 32768".into(),
        ));
    }
    if j.parallelism == 0 || j.parallelism > j.max_parallelism {
        return Err(err(
            "job.parallelism",
            format!(
                "must be between 1 and max_parallelism ({})",
                j.max_parallelism
            ),
        ));
    }
    let (local, store) = file
        .checkpoint
        .location(&resolve)
        .map_err(|(k, m)| err(&k, m))?;
    let mut c = file.checkpoint.settings(local);
    c.store = store;
    if c.retain < 2 {
        return Err(err(
            "checkpoint.retain",
            "must be at least 2 (the previous checkpoint is the fallback of the newest)".into(),
        ));
    }
    if c.timeout_ms == 0 {
        return Err(err("checkpoint.timeout_ms", "must be positive".into()));
    }
    let restart = file.restart.policy().map_err(|(k, m)| err(&k, m))?;
    let timeout_ms = c.timeout_ms;
    let mut b = Job::builder(&j.name)
        .parallelism(j.parallelism)
        .max_parallelism(j.max_parallelism)
        .co_partitioned(j.co_partitioned)
        .restart(restart)
        .state_options(file.state.options().map_err(|(k, m)| err(&k, m))?)
        .checkpointing(c);
    if let Some(m) = &file.metrics {
        let addr: std::net::SocketAddr = m.listen.parse().map_err(|_| {
            err(
                "metrics.listen",
                format!(
                    "`{}` is not an IP address and port such as 127.0.0.1:9464 or 0.0.0.0:9464",
                    m.listen
                ),
            )
        })?;
        b = b.metrics_listen(addr);
    }

    b = match (&file.source.sequence, &file.source.kafka) {
        (Some(s), None) => {
            let cfg = s
                .config(j.max_parallelism)
                .map_err(|(k, m)| err(&format!("source.sequence.{k}"), m))?;
            b.source(crate::connectors::sequence::KIND, move |_| {
                Box::new(SequenceSource::new(cfg.clone()))
            })
        }
        (None, Some(k)) => {
            // Tombstones travel as records only to a sink that says what they mean, and
            // only straight from the source: a transform would have to say it too.
            let tombstones = match &file.sink.elasticsearch {
                Some(e) if e.reads_tombstones() => {
                    if !file.transform.is_empty() {
                        return Err(err(
                            "sink.elasticsearch.on_null_value",
                            "tombstones reach the sink only from the source directly: remove on_null_value, or the [[transform]] sections".into(),
                        ));
                    }
                    true
                }
                _ => false,
            };
            kafka_source(b, k, &j.name, tombstones, &err)?
        }
        (Some(_), Some(_)) => {
            return Err(err(
                "source",
                "exactly one source table: sequence or kafka".into(),
            ))
        }
        (None, None) => {
            return Err(err(
                "source",
                "a source table is required: [source.sequence] or [source.kafka]".into(),
            ))
        }
    };

    for (i, t) in file.transform.iter().enumerate() {
        match t {
            TransformSection::RollingSum(r) => {
                b = r
                    .build(b, i)
                    .map_err(|(k, m)| err(&format!("transform[{i}].{k}"), m))?;
            }
        }
    }

    let sinks = file.sink.present();
    if sinks.len() != 1 {
        return Err(err(
            "sink",
            format!(
                "exactly one sink table: [sink.file], [sink.elasticsearch] or [sink.kafka]{}",
                if sinks.is_empty() {
                    String::new()
                } else {
                    format!(" (found {})", sinks.join(", "))
                }
            ),
        ));
    }
    if let Some(k) = &file.sink.kafka {
        // The records of a source partition must reach the topic through one producer,
        // in the order they were read: the downstream stage's deduplication relies on
        // it. A keyed stage in between would spread them over several.
        if !file.transform.is_empty() {
            return Err(err(
                "sink.kafka",
                "a repartition stage writes records as it reads them: remove the [[transform]] sections and put them into the job that reads the topic (with origin_headers = true)".into(),
            ));
        }
        let source = match &file.source.kafka {
            Some(s) => Some(kafka_config(s, &j.name, &err)?),
            None => None,
        };
        let cfg = std::sync::Arc::new(
            k.config(source.as_ref(), timeout_ms)
                .map_err(|(key, m)| err(&format!("sink.kafka.{key}"), m))?,
        );
        if cfg.partitions.is_none() {
            b = b.refuse_members(
                "sink.kafka.partitions",
                "a repartition stage run as several members needs partitions = N (how many of the topic's partitions it spreads keys over): each member would otherwise take the topic's count at its own first start, and a key would land in two partitions if they differ".into(),
            );
        }
        let first = std::sync::Arc::new(std::sync::OnceLock::new());
        b = b.sink(crate::connectors::kafka::sink::KIND, move |_| {
            Box::new(crate::connectors::kafka::sink::KafkaSink::sharing(
                cfg.clone(),
                first.clone(),
            ))
        });
        return b.build().map_err(|e| err("job", e.to_string()));
    }
    b = match (&file.sink.file, &file.sink.elasticsearch) {
        (Some(f), None) => {
            let cfg = f
                .config(&resolve)
                .map_err(|(k, m)| err(&format!("sink.file.{k}"), m))?;
            b.sink("file", move |_| Box::new(FileSink::new(cfg.clone())))
        }
        (None, Some(e)) => {
            // Elasticsearch takes JSON objects: a text or bytes record would reach it as
            // is, and no transform of the job file makes JSON of it.
            if let Some(k) = &file.source.kafka {
                let format = kafka_config(k, &j.name, &err)?.format;
                if format != crate::connectors::kafka::Format::Json {
                    return Err(err(
                        "source.kafka.format and sink.elasticsearch",
                        format!(
                            "format = {:?} cannot feed the Elasticsearch sink, which writes JSON objects; use format = \"json\"",
                            format!("{format:?}").to_lowercase()
                        ),
                    ));
                }
            }
            // Dead letters go to the source's Kafka cluster, reached the way the source
            // reaches it.
            let kafka = file
                .source
                .kafka
                .as_ref()
                .map(|k| (k.bootstrap_servers.clone(), k.properties.clone()));
            let ctx = crate::connectors::elasticsearch::config::SinkContext {
                offsets_per_partition: kafka.is_some(),
                dead_letter_kafka: kafka,
                checkpoint_timeout_ms: timeout_ms,
                base_dir: base.to_path_buf(),
            };
            e.build(b, &ctx)
                .map_err(|(k, m)| err(&qualify("sink.elasticsearch", &k), m))?
        }
        _ => unreachable!("exactly one sink table, checked above"),
    };
    let graph = b.build().map_err(|e| err("job", e.to_string()))?;
    // Without keyed state, co_partitioned keeps nothing per partition.
    if graph.co_partitioned && graph.has_keyed_state() {
        co_partitioned_source(&file.source, &err)?;
    }
    Ok(graph)
}

/// A section's key in full: `operation and versioning` names both keys, each in full
/// (`sink.elasticsearch.operation and sink.elasticsearch.versioning`); so do lists
/// written `a, b and c`.
fn qualify(section: &str, key: &str) -> String {
    let full = |k: &str| format!("{section}.{k}");
    key.split(" and ")
        .map(|part| part.split(", ").map(full).collect::<Vec<_>>().join(", "))
        .collect::<Vec<_>>()
        .join(" and ")
}

/// `co_partitioned = true` keeps keyed state per source partition, which is each key's
/// whole state only when one partition holds every record of the key: a Kafka source
/// of one topic partitioned by the key. Two topics keyed alike put a key in partition p
/// of each, and the key would get two states (two partial totals); the sequence
/// source's keys span its splits.
fn co_partitioned_source(
    source: &SourceSection,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<(), ConfigError> {
    const FIX: &str = "co_partitioned needs a Kafka source that reads one topic partitioned by the key; to combine several topics, write them into one topic with a repartition stage ([sink.kafka]) and read that";
    match (&source.sequence, &source.kafka) {
        (Some(_), _) => Err(err(
            "job.co_partitioned",
            format!("the sequence source's keys span its splits: {FIX}"),
        )),
        (_, Some(k)) => match k.not_one_topic() {
            None => Ok(()),
            Some((key, what)) => Err(err(
                "job.co_partitioned",
                format!("source.kafka.{key} {what}, and keyed state kept per partition would give a key of two topics two states: {FIX}"),
            )),
        },
        (None, None) => Ok(()),
    }
}

fn kafka_source(
    b: crate::job::JobBuilder,
    k: &crate::connectors::kafka::config::KafkaSection,
    job_name: &str,
    tombstones: bool,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<crate::job::JobBuilder, ConfigError> {
    let mut kc = kafka_config(k, job_name, err)?;
    kc.tombstones = tombstones;
    let kc = std::sync::Arc::new(kc);
    Ok(b.source(crate::connectors::kafka::KIND, move |_| {
        Box::new(crate::connectors::kafka::KafkaSource::new(kc.clone()))
    }))
}

fn kafka_config(
    k: &crate::connectors::kafka::config::KafkaSection,
    job_name: &str,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<crate::connectors::kafka::KafkaSourceConfig, ConfigError> {
    k.config(job_name)
        .map_err(|(key, m)| err(&format!("source.kafka.{key}"), m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_file_defaults_are_the_rust_api_defaults() {
        let c: CheckpointSection = toml::from_str("dir = \"d\"").unwrap();
        assert_eq!(c.settings("d".into()), CheckpointSettings::new("d"));
        let r: RestartSection = toml::from_str("").unwrap();
        assert_eq!(r.policy().unwrap(), RestartPolicy::default());
        assert_eq!(
            RestartSection::default().policy().unwrap(),
            RestartPolicy::default(),
            "a job file without [restart]"
        );
    }

    fn restart(text: &str) -> Result<RestartPolicy, (String, String)> {
        toml::from_str::<RestartSection>(text).unwrap().policy()
    }

    #[test]
    fn restart_sections() {
        assert_eq!(
            restart("strategy = \"fixed-delay\"\nattempts = 5\ndelay_ms = 10"),
            Ok(RestartPolicy::FixedDelay {
                attempts: 5,
                delay_ms: 10
            })
        );
        assert_eq!(
            restart("strategy = \"fixed-delay\""),
            Ok(RestartPolicy::FixedDelay {
                attempts: 3,
                delay_ms: 1000
            }),
            "the keys of the earlier releases keep their defaults"
        );
        assert_eq!(
            restart("strategy = \"failure-rate\"\nmax_failures = 3\ninterval_ms = 600000"),
            Ok(RestartPolicy::FailureRate {
                max_failures: 3,
                interval_ms: 600_000,
                delay_ms: 1000
            })
        );
        assert_eq!(
            restart("initial_delay_ms = 10\nmax_delay_ms = 100\nmultiplier = 3.0\njitter = 0.0\nreset_after_ms = 1000\nattempts = 4"),
            Ok(RestartPolicy::ExponentialDelay(ExponentialDelay {
                initial_delay_ms: 10,
                max_delay_ms: 100,
                multiplier: 3.0,
                jitter: 0.0,
                reset_after_ms: 1000,
                attempts: 4
            })),
            "exponential-delay is the strategy when none is named"
        );
        assert_eq!(restart("strategy = \"none\""), Ok(RestartPolicy::None));
        // Errors name the key.
        for (text, key) in [
            ("strategy = \"sometimes\"", "restart.strategy"),
            (
                "strategy = \"fixed-delay\"\nmultiplier = 2.0",
                "restart.multiplier",
            ),
            ("strategy = \"none\"\nattempts = 2", "restart.attempts"),
            (
                "strategy = \"failure-rate\"\nattempts = 2",
                "restart.attempts",
            ),
            (
                "strategy = \"exponential-delay\"\ndelay_ms = 2",
                "restart.delay_ms",
            ),
            ("max_failures = 2", "restart.max_failures"),
            ("jitter = 1.5", "restart.jitter"),
            ("multiplier = 0.5", "restart.multiplier"),
            ("attempts = 0", "restart.attempts"),
            (
                "initial_delay_ms = 5000\nmax_delay_ms = 1000",
                "restart.initial_delay_ms",
            ),
            (
                "max_delay_ms = 10000\nreset_after_ms = 10000",
                "restart.reset_after_ms",
            ),
            (
                "strategy = \"failure-rate\"\ninterval_ms = 1000\ndelay_ms = 1000",
                "restart.interval_ms",
            ),
            (
                "strategy = \"failure-rate\"\nmax_failures = 0",
                "restart.max_failures",
            ),
        ] {
            let got = restart(text);
            assert_eq!(
                got.as_ref().map_err(|e| e.0.as_str()),
                Err(key),
                "{text}: {got:?}"
            );
        }
    }

    const GOOD: &str = r#"
[job]
name = "t"
parallelism = 2

[checkpoint]
dir = "state"
interval_ms = 200

[source.sequence]
from = 1
to = 100
keys = 10

[[transform]]
type = "rolling_sum"
key = "/key"
field = "/value"

[sink.file]
dir = "out"
"#;

    fn parse_err(text: &str) -> ConfigError {
        match parse(text, Path::new("/jobs/job.toml")) {
            Ok(_) => panic!("expected an error"),
            Err(e) => e,
        }
    }

    fn with_checkpoint(keys: &str) -> String {
        GOOD.replace("dir = \"state\"\ninterval_ms = 200", keys)
    }

    #[test]
    fn co_partitioned_keyed_state_needs_one_kafka_topic() {
        let co = GOOD.replace("parallelism = 2", "parallelism = 2\nco_partitioned = true");
        let e = parse_err(&co);
        assert_eq!(e.key, "job.co_partitioned", "{e}");
        assert!(
            e.message.contains("sequence source's keys span its splits"),
            "{e}"
        );
        let kafka = |topics: &str, transform: bool| {
            let t = co.replace(
                "[source.sequence]\nfrom = 1\nto = 100\nkeys = 10",
                &format!("[source.kafka]\nbootstrap_servers = \"k:9092\"\n{topics}"),
            );
            if transform {
                t
            } else {
                t.replace(
                    "[[transform]]\ntype = \"rolling_sum\"\nkey = \"/key\"\nfield = \"/value\"\n",
                    "",
                )
            }
        };
        assert!(parse(&kafka("topics = [\"orders\"]", true), Path::new("/j.toml")).is_ok());
        for topics in ["topics = [\"a\", \"b\"]", "topic_pattern = \"orders-.*\""] {
            let e = parse_err(&kafka(topics, true));
            assert_eq!(e.key, "job.co_partitioned", "{e}");
            assert!(e.message.contains("repartition stage"), "{e}");
            // Without keyed state, nothing is kept per partition: accepted.
            assert!(
                parse(&kafka(topics, false), Path::new("/j.toml")).is_ok(),
                "{topics}"
            );
        }
    }

    #[test]
    fn a_store_checkpoint_dir_keeps_a_local_staging_directory_and_client_settings() {
        let g = parse(
            &with_checkpoint(
                "dir = \"s3://orders/jobs/a\"\nlocal_dir = \"staging\"\nendpoint = \"http://127.0.0.1:9000\"\nallow_http = true\nregion = \"eu-west-1\"",
            ),
            Path::new("/jobs/job.toml"),
        )
        .unwrap();
        assert_eq!(g.checkpoint.dir, PathBuf::from("/jobs/staging"));
        let s = g.checkpoint.store.as_ref().unwrap();
        assert_eq!(s.to_string(), "s3://orders/jobs/a");
        assert_eq!(
            s.option_keys().collect::<Vec<_>>(),
            ["aws_endpoint", "aws_region", "aws_allow_http"]
        );
        // The default staging directory is per location, under the temporary directory.
        let g = parse(
            &with_checkpoint("dir = \"s3://orders/jobs/a\""),
            Path::new("/jobs/job.toml"),
        )
        .unwrap();
        assert_eq!(
            g.checkpoint.dir,
            default_staging_base().join("s3/orders/jobs/a")
        );
        // A member's line is one call, in both places.
        let m = g.checkpoint.join("member-1-of-3");
        assert_eq!(
            m.store.unwrap().to_string(),
            "s3://orders/jobs/a/member-1-of-3"
        );
        assert!(m.dir.ends_with("s3/orders/jobs/a/member-1-of-3"));
    }

    #[test]
    fn store_settings_errors_name_the_key_and_the_file() {
        for (keys, key, says) in [
            ("dir = \"ftp://b/p\"", "checkpoint.dir", "not a supported checkpoint store"),
            ("dir = \"s3:///p\"", "checkpoint.dir", "names no bucket"),
            (
                "dir = \"state\"\nendpoint = \"http://x\"",
                "checkpoint.endpoint",
                "only to an object-store",
            ),
            (
                "dir = \"state\"\nlocal_dir = \"x\"",
                "checkpoint.local_dir",
                "only to an object-store",
            ),
            (
                "dir = \"gs://b/p\"\nregion = \"x\"",
                "checkpoint.region",
                "is an S3 setting",
            ),
            (
                "dir = \"s3://b/p\"\naccess_key_id = \"a\"\nsecret_access_key = \"s\"\nsecret_access_key_file = \"f\"",
                "checkpoint.secret_access_key",
                "not both",
            ),
            (
                "dir = \"s3://b/p\"\naccess_key_id = \"a\"",
                "checkpoint.secret_access_key",
                "go together",
            ),
            (
                "dir = \"s3://b/p\"\naccess_key_id = \"a\"\nsecret_access_key_file = \"/nonexistent/secret\"",
                "checkpoint.secret_access_key_file",
                "cannot read",
            ),
        ] {
            let e = parse_err(&with_checkpoint(keys));
            assert_eq!(e.key, key, "{keys}: {e}");
            assert!(e.message.contains(says), "{keys}: {e}");
            assert!(e.to_string().starts_with("/jobs/job.toml: "), "{e}");
        }
        // A secret never appears in the settings' debug output.
        let g = parse(
            &with_checkpoint(
                "dir = \"s3://b/p\"\naccess_key_id = \"a\"\nsecret_access_key = \"hunter2\"",
            ),
            Path::new("/jobs/job.toml"),
        )
        .unwrap();
        assert!(!format!("{:?}", g.checkpoint).contains("hunter2"));
    }

    #[test]
    fn good_file_builds_and_resolves_paths_against_the_file() {
        let g = parse(GOOD, Path::new("/jobs/job.toml")).unwrap();
        assert_eq!(g.parallelism, 2);
        assert_eq!(g.checkpoint.dir, PathBuf::from("/jobs/state"));
        assert_eq!(g.checkpoint.retain, 3);
        assert!(
            g.describe().contains("rolling_sum[rolling_sum-0]"),
            "{}",
            g.describe()
        );
    }

    #[test]
    fn state_memory_settings_have_defaults_bounds_and_named_errors() {
        let g = parse(GOOD, Path::new("/jobs/job.toml")).unwrap();
        assert_eq!(g.state, lockgate_state::BackendOptions::default());
        let set = format!("{GOOD}\n[state]\nwrite_buffer_bytes = 1048576\nblock_cache_bytes = 0\n");
        let g = parse(&set, Path::new("/jobs/job.toml")).unwrap();
        assert_eq!(g.state.write_buffer_bytes, 1 << 20);
        assert_eq!(g.state.block_cache_bytes, 0);
        let e = parse_err(&set.replace("1048576", "1000"));
        assert_eq!(e.key, "state.write_buffer_bytes");
        let e = parse_err(&set.replace("block_cache_bytes = 0", "block_cache_bytes = 1e30"));
        assert!(e.key.starts_with("state"), "{e}");
        let e = parse_err(&set.replace("block_cache_bytes = 0", "block_cache_bytes = 70000000000"));
        assert_eq!(e.key, "state.block_cache_bytes");
        let e = parse_err(&set.replace("block_cache_bytes", "cache"));
        assert!(e.key.starts_with("state"), "{e}");
    }

    #[test]
    fn metrics_listen_is_an_address_or_an_error_naming_the_key() {
        let g = parse(GOOD, Path::new("/jobs/job.toml")).unwrap();
        assert_eq!(g.metrics_listen, None, "off by default");
        let on = format!("{GOOD}\n[metrics]\nlisten = \"127.0.0.1:9464\"\n");
        let g = parse(&on, Path::new("/jobs/job.toml")).unwrap();
        assert_eq!(g.metrics_listen, Some("127.0.0.1:9464".parse().unwrap()));
        let e = parse_err(&on.replace("127.0.0.1:9464", "localhost"));
        assert_eq!(e.key, "metrics.listen");
        assert!(e.message.contains("`localhost`"), "{e}");
        let e = parse_err(&on.replace("listen =", "port ="));
        assert!(e.key.starts_with("metrics"), "{e}");
    }

    #[test]
    fn unknown_key_is_named_with_its_table_and_file() {
        let e = parse_err(&GOOD.replace("interval_ms = 200", "interval = 200"));
        assert_eq!(e.key, "checkpoint.interval");
        assert!(
            e.to_string()
                .starts_with("/jobs/job.toml: checkpoint.interval:"),
            "{e}"
        );
    }

    #[test]
    fn an_unknown_key_in_a_transform_is_refused() {
        let e = parse_err(&GOOD.replace("key = \"/key\"", "key = \"/key\"\nkeys = 3"));
        assert!(e.key.starts_with("transform"), "{e}");
        assert!(e.message.contains("keys"), "{e}");
    }

    /// A job file's head up to its `[source.kafka]` table, which reads `topics`.
    fn kafka_job_head(topics: &str) -> String {
        format!(
            "[job]\nname = \"t\"\n[checkpoint]\ndir = \"c\"\n[source.kafka]\nbootstrap_servers = \"k:9092\"\ntopics = [{topics}]\n"
        )
    }

    #[test]
    fn a_kafka_sink_job_is_a_repartition_stage_without_transforms() {
        let text = &(kafka_job_head("\"orders\"")
            + "[sink.kafka]\ntopic = \"orders-by-user\"\nkey = \"/user\"\n");
        let job = parse(text, Path::new("/jobs/job.toml")).unwrap();
        assert_eq!(job.describe(), "t: source:kafka > sink:kafka");
        let with_sum = text.to_string()
            + "[[transform]]\ntype = \"rolling_sum\"\nkey = \"/user\"\nfield = \"/amount\"\n";
        let e = parse_err(&with_sum);
        assert_eq!(e.key, "sink.kafka", "{e}");
        let e = parse_err(&text.replace("key = \"/user\"", "key = \"user\""));
        assert_eq!(e.key, "sink.kafka.key", "{e}");
        let two = text.to_string() + "[sink.file]\ndir = \"out\"\n";
        let e = parse_err(&two);
        assert_eq!(e.key, "sink", "{e}");
        assert!(e.message.contains("found file, kafka"), "{e}");
    }

    #[test]
    fn text_records_cannot_feed_the_elasticsearch_sink() {
        let text = &(kafka_job_head("\"t\"")
            + "format = \"text\"\n[sink.elasticsearch]\nurl = \"http://es:9200\"\nindex = \"i\"\n");
        let e = parse_err(text);
        assert_eq!(e.key, "source.kafka.format and sink.elasticsearch", "{e}");
        assert!(parse(
            &text.replace("\"text\"", "\"json\""),
            Path::new("/jobs/job.toml")
        )
        .is_ok());
    }

    #[test]
    fn wrong_type_names_the_key() {
        let e = parse_err(&GOOD.replace("parallelism = 2", "parallelism = \"two\""));
        assert_eq!(e.key, "job.parallelism");
    }

    #[test]
    fn invalid_values_name_the_key() {
        assert_eq!(
            parse_err(&GOOD.replace("interval_ms = 200", "retain = 1")).key,
            "checkpoint.retain"
        );
        assert_eq!(
            parse_err(&GOOD.replace("parallelism = 2", "parallelism = 0")).key,
            "job.parallelism"
        );
        assert_eq!(
            parse_err(&GOOD.replace("to = 100", "to = 0")).key,
            "source.sequence.to"
        );
        assert_eq!(
            parse_err(&GOOD.replace("key = \"/key\"", "key = \"key\"")).key,
            "transform[0].key"
        );
    }
}
