//! The TOML job file: the contract of `lockgate run --config`.
//!
//! Unknown keys are errors; every error names the file and the key. Relative paths are
//! resolved against the directory of the job file, so a job runs the same from anywhere.

use crate::clients::store::S3Settings;
use crate::connector::registry::one_of;
use crate::connector::{AnyConfig, KeyError, Registry, SectionContext, SinkContext, SourceWiring};
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
    /// One table per source: `[source.<name>]`, read through the registry.
    #[serde(default)]
    source: toml::Table,
    /// Each `[[transform]]`, read through the registry by its `type`.
    #[serde(default)]
    transform: Vec<toml::Table>,
    /// One table per sink: `[sink.<name>]`, read through the registry.
    #[serde(default)]
    sink: toml::Table,
    #[serde(default)]
    metrics: Option<MetricsSection>,
    #[serde(default)]
    control: Option<ControlSection>,
    #[serde(default)]
    state: StateSection,
}

/// `[control]`: the control API on the metrics listener (off unless enabled).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ControlSection {
    #[serde(default)]
    enabled: bool,
    /// A file holding the bearer token every control request must carry.
    token_file: Option<String>,
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
    /// Steps of the configuration this file was translated from that it does not do
    /// (`lockgate migrate`): `lockgate run` refuses the file while any is listed,
    /// unless given `--allow-left-out`.
    #[serde(default)]
    left_out: Vec<String>,
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
        let settings = S3Settings {
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            allow_http: self.allow_http,
            access_key_id: self.access_key_id.clone(),
            secret_access_key: self.secret_access_key.clone(),
            secret_access_key_file: self.secret_access_key_file.clone(),
        };
        let location = CheckpointLocation::parse(&self.dir).map_err(|m| (key("dir"), m))?;
        let store = match location {
            CheckpointLocation::Local(p) => {
                let only_store = settings
                    .first_set()
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
        let store = settings
            .apply(store, resolve)
            .map_err(|(k, m)| (key(&k), m))?;
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

/// Reads and validates a job file whose sources, transforms and sinks are looked up in
/// `registry`: [`crate::builtin::registry`], with a program's own connectors added to it.
pub fn load(path: &Path, registry: &Registry) -> Result<JobGraph, ConfigError> {
    parse(&read_text(path)?, path, registry)
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
#[derive(Clone)]
pub struct JobDescription {
    pub name: String,
    /// The checkpoint directory, resolved against the job file's directory (the local
    /// staging directory of a store).
    pub checkpoint_dir: PathBuf,
    /// The object store that keeps the checkpoints, as written (`s3://bucket/prefix`).
    pub checkpoint_store: Option<String>,
    /// The source's table name (`[source.<name>]`) and its resolved configuration.
    pub source: (String, AnyConfig),
    /// Each transform's type and resolved configuration, in order.
    pub transforms: Vec<(String, AnyConfig)>,
    /// The sink's table name (`[sink.<name>]`) and its resolved configuration.
    pub sink: (String, AnyConfig),
}

impl JobDescription {
    /// The source's configuration, if it is a `T` (the connector's config type).
    pub fn source_config<T: 'static>(&self) -> Option<&T> {
        self.source.1.downcast_ref()
    }

    /// The sink's configuration, if it is a `T` (the connector's config type).
    pub fn sink_config<T: 'static>(&self) -> Option<&T> {
        self.sink.1.downcast_ref()
    }

    /// The configurations of the transforms that are a `T`, in order.
    pub fn transform_configs<T: 'static>(&self) -> Vec<&T> {
        self.transforms
            .iter()
            .filter_map(|(_, c)| c.downcast_ref())
            .collect()
    }
}

impl std::fmt::Debug for JobDescription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobDescription")
            .field("name", &self.name)
            .field("checkpoint_dir", &self.checkpoint_dir)
            .field("checkpoint_store", &self.checkpoint_store)
            .field("source", &self.source.0)
            .field(
                "transforms",
                &self.transforms.iter().map(|t| &t.0).collect::<Vec<_>>(),
            )
            .field("sink", &self.sink.0)
            .finish()
    }
}

/// Reads a job file's typed settings, validating the whole file as [`load`] does.
pub fn describe(path: &Path, registry: &Registry) -> Result<JobDescription, ConfigError> {
    Ok(build(&read_text(path)?, path, registry)?.1)
}

/// Parses job-file text with the connectors of `registry`; `path` names errors and
/// anchors relative paths.
pub fn parse(text: &str, path: &Path, registry: &Registry) -> Result<JobGraph, ConfigError> {
    Ok(build(text, path, registry)?.0)
}

/// Reads every table below `[source]` or `[sink]` (`role`) through the registry's
/// parse (`parse`: serde, unknown keys and types): an unknown table is an error naming
/// it. Returns the tables present, in the registry's order.
fn parse_tables<'t, P>(
    tables: &'t toml::Table,
    role: &str,
    names: &[&'static str],
    parse: impl Fn(&str, toml::Value) -> Option<Result<P, KeyError>>,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<Vec<(&'static str, P)>, ConfigError> {
    if let Some(unknown) = tables.keys().find(|k| !names.contains(&k.as_str())) {
        return Err(err(
            &format!("{role}.{unknown}"),
            format!(
                "unknown {role} `{unknown}`: lockgate's {role}s are {}",
                tables_listed(role, names)
            ),
        ));
    }
    let mut present = Vec::new();
    for name in names {
        if let Some(v) = tables.get(*name) {
            let parsed = parse(name, v.clone())
                .expect("a registered name")
                .map_err(|e| err(&e.full_key(&format!("{role}.{name}")), e.message))?;
            present.push((*name, parsed));
        }
    }
    Ok(present)
}

fn tables_listed(role: &str, names: &[&'static str]) -> String {
    one_of(
        &names
            .iter()
            .map(|n| format!("[{role}.{n}]"))
            .collect::<Vec<_>>(),
    )
}

/// The one table of `present` (below `[source]` or `[sink]`, `role`): none and several
/// are errors naming the key.
fn exactly_one<P>(
    mut present: Vec<(&'static str, P)>,
    role: &str,
    names: &[&'static str],
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<(&'static str, P), ConfigError> {
    let listed = || tables_listed(role, names);
    match present.len() {
        1 => Ok(present.remove(0)),
        0 if role == "source" => Err(err(
            role,
            format!("a source table is required: {}", listed()),
        )),
        0 => Err(err(role, format!("exactly one sink table: {}", listed()))),
        _ if role == "source" => Err(err(
            role,
            format!(
                "exactly one source table: {}",
                one_of(&names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            ),
        )),
        _ => Err(err(
            role,
            format!(
                "exactly one sink table: {} (found {})",
                listed(),
                present.iter().map(|p| p.0).collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}

/// Builds the job graph and its description from job-file text.
fn build(
    text: &str,
    path: &Path,
    registry: &Registry,
) -> Result<(JobGraph, JobDescription), ConfigError> {
    let err = |key: &str, message: String| ConfigError {
        file: path.to_path_buf(),
        key: key.to_string(),
        message,
    };
    let at = |section: &str| {
        let section = section.to_string();
        move |e: KeyError| err(&e.full_key(&section), e.message)
    };
    let file = read_file(text, path)?;
    // Every connector section is read before any value is checked, so that an unknown
    // key or a wrong type anywhere in the file is the error it shows first.
    let source_names = registry.source_names();
    let sources = parse_tables(
        &file.source,
        "source",
        &source_names,
        |n, v| registry.parse_source(n, v),
        &err,
    )?;
    let parsed_transforms = parse_transforms(&file.transform, registry, &err)?;
    let sink_names = registry.sink_names();
    let sinks = parse_tables(
        &file.sink,
        "sink",
        &sink_names,
        |n, v| registry.parse_sink(n, v),
        &err,
    )?;
    let base = path.parent().unwrap_or(Path::new("."));
    let resolve = |p: &Path| {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            base.join(p)
        }
    };

    let JobSettings {
        mut b,
        cx,
        checkpoint_dir,
        checkpoint_store,
    } = job_settings(&file, base, &resolve, registry, &err)?;

    // The source first (the sink checks its facts), then the transforms, then the sink;
    // the source is built last, once it knows what the sink reads.
    let (source_name, source) = exactly_one(sources, "source", &source_names, &err)?;
    let source = source(&cx).map_err(at(&format!("source.{source_name}")))?;
    b = b.source_cluster(source.facts.kafka.clone());
    // The transforms dead-letter to the source's cluster.
    let cx = SectionContext {
        source_kafka: source.facts.kafka.clone(),
        event_time: source.facts.event_time,
        ..cx
    };
    let transform_count = parsed_transforms.len();
    let chained = chain_transforms(parsed_transforms, &cx, &source.facts, &err)?;
    let (sink_name, sink) = exactly_one(sinks, "sink", &sink_names, &err)?;
    let sink_cx = SinkContext {
        section: &cx,
        source: &source.facts,
        transforms: transform_count,
        stateful_transforms: chained.stateful,
        several_outputs: chained.several.is_some(),
        records_without_coordinates: chained.made_records,
        deletes: chained.deletes,
    };
    let sink = sink(&sink_cx).map_err(at(&format!("sink.{sink_name}")))?;
    let not_split_keyed = source.facts.not_split_keyed.clone();
    let source_spec = (source.build)(SourceWiring {
        tombstones: sink.reads_tombstones || chained.reads_tombstones,
        headers: chained.reads_headers,
    });
    let graph = b
        .source_spec(source_spec)
        .steps(chained.steps)
        .sink_spec(sink.spec)
        .build()
        .map_err(|e| err("job", e.to_string()))?;
    // Without keyed state, co_partitioned keeps nothing per partition.
    if graph.co_partitioned && graph.has_keyed_state() {
        if let Some(why) = not_split_keyed {
            return Err(err("job.co_partitioned", why));
        }
    }
    let description = JobDescription {
        name: graph.name.clone(),
        checkpoint_dir,
        checkpoint_store,
        source: (source_name.to_string(), source.config),
        transforms: chained.transforms,
        sink: (sink_name.to_string(), sink.config),
    };
    Ok((graph, description))
}

/// The job-wide sections, checked: the job builder (without its connectors), what
/// every connector section is read with, and where the checkpoints go.
struct JobSettings {
    /// The job, without its connectors yet.
    b: crate::job::JobBuilder,
    cx: SectionContext,
    /// The checkpoint directory (a store's local staging directory).
    checkpoint_dir: PathBuf,
    /// The object store's `dir` as written, if the checkpoints go to one.
    checkpoint_store: Option<String>,
}

/// Reads `[job]`, `[checkpoint]`, `[restart]`, `[state]`, `[metrics]` and `[control]`.
fn job_settings(
    file: &JobFile,
    base: &Path,
    resolve: &dyn Fn(&Path) -> PathBuf,
    registry: &Registry,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<JobSettings, ConfigError> {
    let j = &file.job;
    check_parallelism(j, err)?;
    let (c, checkpoint_store) = checkpointing(&file.checkpoint, resolve, err)?;
    let restart = file.restart.policy().map_err(|(k, m)| err(&k, m))?;
    let cx = SectionContext {
        job_name: j.name.clone(),
        base_dir: base.to_path_buf(),
        parallelism: j.parallelism,
        max_parallelism: j.max_parallelism,
        checkpoint_timeout_ms: c.timeout_ms,
        formats: registry.formats().clone(),
        source_kafka: None,
        event_time: false,
    };
    let checkpoint_dir = c.dir.clone();
    let mut b = Job::builder(&j.name)
        .parallelism(j.parallelism)
        .max_parallelism(j.max_parallelism)
        .co_partitioned(j.co_partitioned)
        .left_out(j.left_out.clone())
        .restart(restart)
        .state_options(file.state.options().map_err(|(k, m)| err(&k, m))?)
        .checkpointing(c);
    if let Some(m) = &file.metrics {
        b = b.metrics_listen(metrics_listen(m, err)?);
    }
    if let Some(c) = file.control.as_ref().filter(|c| c.enabled) {
        if file.metrics.is_none() {
            return Err(err(
                "control.enabled",
                "the control API is served on the metrics listener: set [metrics] listen too"
                    .into(),
            ));
        }
        let token = control_token(c, resolve, err)?;
        b = b.control(crate::control::ControlSettings { token });
    }
    Ok(JobSettings {
        b,
        cx,
        checkpoint_dir,
        checkpoint_store,
    })
}

/// Each `[[transform]]` read through the registry by its `type`: its key
/// (`transform[i]`), its type and what builds it.
fn parse_transforms(
    tables: &[toml::Table],
    registry: &Registry,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<Vec<(String, String, crate::connector::registry::ParsedTransform)>, ConfigError> {
    let mut parsed_transforms = Vec::new();
    for (i, t) in tables.iter().enumerate() {
        let key = format!("transform[{i}]");
        let mut t = t.clone();
        let kind = match t.remove("type") {
            Some(toml::Value::String(kind)) => kind,
            _ => {
                return Err(err(
                    &format!("{key}.type"),
                    format!(
                        "a transform needs type = one of {}",
                        registry.transform_names().join(", ")
                    ),
                ))
            }
        };
        let parsed = registry
            .parse_transform(&kind, toml::Value::Table(t))
            .ok_or_else(|| {
                err(
                    &format!("{key}.type"),
                    format!(
                        "`{kind}` is not a transform lockgate knows ({})",
                        registry.transform_names().join(", ")
                    ),
                )
            })?
            .map_err(|e| err(&e.full_key(&key), e.message))?;
        parsed_transforms.push((key, kind, parsed));
    }
    Ok(parsed_transforms)
}

/// Checks `parallelism` and `max_parallelism` (at most 32768 key groups).
fn check_parallelism(
    j: &JobSection,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<(), ConfigError> {
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
    Ok(())
}

/// The checkpoint settings (checked) and, for a store, its `dir` as given.
fn checkpointing(
    section: &CheckpointSection,
    resolve: &dyn Fn(&Path) -> PathBuf,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<(CheckpointSettings, Option<String>), ConfigError> {
    let (local, store) = section.location(resolve).map_err(|(k, m)| err(&k, m))?;
    let checkpoint_store = store.as_ref().map(|_| section.dir.clone());
    let mut c = section.settings(local);
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
    Ok((c, checkpoint_store))
}

/// `metrics.listen` as an address.
fn metrics_listen(
    m: &MetricsSection,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<std::net::SocketAddr, ConfigError> {
    m.listen.parse().map_err(|_| {
        err(
            "metrics.listen",
            format!(
                "`{}` is not an IP address and port such as 127.0.0.1:9464 or 0.0.0.0:9464",
                m.listen
            ),
        )
    })
}

/// The control API's bearer token, read from `token_file` (if given): one word of
/// visible ASCII.
fn control_token(
    c: &ControlSection,
    resolve: &dyn Fn(&Path) -> PathBuf,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<Option<Secret>, ConfigError> {
    let Some(f) = &c.token_file else {
        return Ok(None);
    };
    let t = read_secret_file(&resolve(Path::new(f))).map_err(|m| err("control.token_file", m))?;
    if t.expose().trim().is_empty() {
        return Err(err("control.token_file", format!("{f} is empty")));
    }
    // What a client can send in `Authorization: Bearer <token>`.
    if !t.expose().bytes().all(|b| b.is_ascii_graphic()) {
        return Err(err(
            "control.token_file",
            format!("{f}: a token is one word of visible ASCII characters (no spaces or other characters)"),
        ));
    }
    Ok(Some(t))
}

/// The transforms as the job's steps, and what they tell the sink's section.
struct ChainedTransforms {
    /// Each transform's type and configuration, in order.
    transforms: Vec<(String, AnyConfig)>,
    steps: Vec<crate::connector::Step>,
    /// The types of the transforms that run as steps of their own, in order.
    stateful: Vec<String>,
    reads_headers: bool,
    reads_tombstones: bool,
    /// The first transform that makes several records of one.
    several: Option<String>,
    /// The first step that may send the sink deletes.
    deletes: Option<String>,
    /// Records without coordinates: the source's own, or the first step's that makes some.
    made_records: Option<String>,
}

/// Prepares each transform and makes the job's steps of them: consecutive record
/// transforms run as one step that parses each record once.
fn chain_transforms(
    parsed_transforms: Vec<(String, String, crate::connector::registry::ParsedTransform)>,
    cx: &SectionContext,
    source: &crate::connector::SourceFacts,
    err: &dyn Fn(&str, String) -> ConfigError,
) -> Result<ChainedTransforms, ConfigError> {
    let mut transforms = Vec::new();
    let mut steps = Vec::new();
    let mut stateful = Vec::new();
    let mut reads_headers = false;
    let mut reads_tombstones = false;
    // The first transform that makes several records of one, and whether one came in an
    // earlier step: output numbers restart in each step, so only one step may number.
    let mut several: Option<String> = None;
    let mut several_before = false;
    let mut deletes: Option<String> = None;
    let mut made_records: Option<String> = source.without_coordinates.clone();
    // A `json` source's values parse (checked, or written by lockgate), and so do the
    // values every operator and transform writes.
    let values = match source.format.as_str() {
        "json" => crate::transforms::Values::Checked,
        _ => crate::transforms::Values::Unchecked,
    };
    let mut chain: Vec<(String, std::sync::Arc<dyn crate::transforms::Smt>)> = Vec::new();
    for (i, (key, kind, parsed)) in parsed_transforms.into_iter().enumerate() {
        let prepared = parsed(cx, i).map_err(|e| err(&e.full_key(&key), e.message))?;
        match prepared.config.downcast_ref::<crate::transforms::Applied>() {
            Some(a) => {
                reads_headers |= a.0.reads_headers();
                reads_tombstones |= a.0.reads_tombstones();
                if a.0.may_delete() && deletes.is_none() {
                    deletes = Some(format!("{key} ({kind}, which makes deletes)"));
                }
                if a.0.several() {
                    if several_before {
                        return Err(err(
                            &key,
                            format!(
                                "a second transform that makes several records of one, after {} and a {} between them: put them next to each other",
                                several.as_deref().unwrap_or("one"),
                                stateful.last().map_or("step", String::as_str)
                            ),
                        ));
                    }
                    several.get_or_insert_with(|| key.clone());
                }
                chain.push((kind.clone(), a.0.clone()))
            }
            None => {
                several_before |= several.is_some();
                if let (Some(why), None) = (&prepared.facts.deletes, &deletes) {
                    deletes = Some(format!("{key} ({why})"));
                }
                if made_records.is_none() {
                    made_records = prepared.facts.makes_records.clone();
                }
                stateful.push(kind.clone());
                if !chain.is_empty() {
                    steps.push(crate::transforms::chain_step(
                        std::mem::take(&mut chain),
                        values,
                        cx.source_kafka.clone(),
                    ));
                }
                steps.extend(prepared.steps);
            }
        }
        transforms.push((kind, prepared.config));
    }
    if !chain.is_empty() {
        steps.push(crate::transforms::chain_step(
            chain,
            values,
            cx.source_kafka.clone(),
        ));
    }
    Ok(ChainedTransforms {
        transforms,
        steps,
        stateful,
        reads_headers,
        reads_tombstones,
        several,
        deletes,
        made_records,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job file's text read with the built-in connectors.
    fn parse(text: &str, path: &Path) -> Result<JobGraph, ConfigError> {
        super::parse(text, path, &crate::builtin::registry())
    }

    #[test]
    fn a_parquet_file_sink_takes_its_columns_from_an_avro_source_with_one_schema() {
        use crate::connectors::file_sink::{section::FileFormat, FileSinkConfig};
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("order.avsc"),
            r#"{"type":"record","name":"o","fields":[{"name":"id","type":"long"},{"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}}]}"#,
        )
        .unwrap();
        let job = |source_keys: &str, between: &str| {
            let path = tmp.path().join("job.toml");
            std::fs::write(
                &path,
                format!(
                    "[job]\nname = \"t\"\n[checkpoint]\ndir = \"c\"\n[source.kafka]\nbootstrap_servers = \"k:9092\"\ntopics = [\"t\"]\n{source_keys}\n{between}[sink.file]\ndir = \"out\"\nformat = \"parquet\"\n"
                ),
            )
            .unwrap();
            describe(&path, &crate::builtin::registry())
        };
        let columns = |d: &JobDescription| -> Vec<String> {
            let c = d.sink_config::<FileSinkConfig>().unwrap();
            let FileFormat::Parquet(p) = &c.format else {
                panic!("{c:?}")
            };
            p.schema.fields().iter().map(|f| f.name().clone()).collect()
        };
        for keys in [
            "format = \"avro\"\nschema_file = \"order.avsc\"",
            "format = \"avro\"\nschema_file = \"order.avsc\"\nreader_schema_file = \"order.avsc\"",
        ] {
            let d = job(keys, "").unwrap();
            assert_eq!(columns(&d), vec!["id", "at"], "{keys}");
        }
        // Text records have no fields for columns or folders.
        for sink_keys in [
            "format = \"parquet\"\nschema_file = \"order.avsc\"",
            "partition_by = \"d={/id}\"",
        ] {
            let path = tmp.path().join("text.toml");
            std::fs::write(
                &path,
                format!("[job]\nname = \"t\"\n[checkpoint]\ndir = \"c\"\n[source.kafka]\nbootstrap_servers = \"k:9092\"\ntopics = [\"t\"]\nformat = \"text\"\n[sink.file]\ndir = \"out\"\n{sink_keys}\n"),
            )
            .unwrap();
            let e = describe(&path, &crate::builtin::registry())
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("source.kafka.format and sink.file"),
                "{sink_keys}: {e}"
            );
            let text_into_time_folders = "partition_by = \"h={timestamp:%H}\"";
            std::fs::write(
                &path,
                format!("[job]\nname = \"t\"\n[checkpoint]\ndir = \"c\"\n[source.kafka]\nbootstrap_servers = \"k:9092\"\ntopics = [\"t\"]\nformat = \"text\"\n[sink.file]\ndir = \"out\"\n{text_into_time_folders}\n"),
            )
            .unwrap();
            assert!(describe(&path, &crate::builtin::registry()).is_ok());
        }
        // A transform may change the records' shape; JSON has no schema to give.
        for (keys, between) in [
            (
                "format = \"avro\"\nschema_file = \"order.avsc\"",
                "[[transform]]\ntype = \"jq\"\nfilter = \".\"\n",
            ),
            ("format = \"json\"", ""),
        ] {
            let e = job(keys, between).unwrap_err().to_string();
            assert!(e.contains("sink.file.schema_file"), "{keys}: {e}");
        }
    }

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
    fn a_kafka_sink_job_is_a_repartition_stage_without_reordering_transforms() {
        let text = &(kafka_job_head("\"orders\"")
            + "[sink.kafka]\ntopic = \"orders-by-user\"\nkey = \"/user\"\n");
        let job = parse(text, Path::new("/jobs/job.toml")).unwrap();
        assert_eq!(job.describe(), "t: source:kafka > sink:kafka");
        let with_sum = text.to_string()
            + "[[transform]]\ntype = \"rolling_sum\"\nkey = \"/user\"\nfield = \"/amount\"\n";
        let e = parse_err(&with_sum);
        assert_eq!(e.key, "sink.kafka", "{e}");
        // Record transforms keep the order; several records of one input would share
        // its coordinates.
        let with_smt = text.to_string() + "[[transform]]\ntype = \"debezium\"\n";
        parse(&with_smt, Path::new("/jobs/job.toml")).unwrap();
        let with_jq = text.to_string() + "[[transform]]\ntype = \"jq\"\nfilter = \".[]\"\n";
        let e = parse_err(&with_jq);
        assert_eq!(e.key, "sink.kafka", "{e}");
        parse(
            &with_jq.replace(".[]\"\n", ".[]\"\nmax_outputs = 1\n"),
            Path::new("/jobs/job.toml"),
        )
        .unwrap();
        let e = parse_err(&text.replace("key = \"/user\"", "key = \"user\""));
        assert_eq!(e.key, "sink.kafka.key", "{e}");
        let two = text.to_string() + "[sink.file]\ndir = \"out\"\n";
        let e = parse_err(&two);
        assert_eq!(e.key, "sink", "{e}");
        assert!(e.message.contains("found file, kafka"), "{e}");
    }

    #[test]
    fn tombstones_pass_record_transforms_but_not_a_rolling_sum() {
        let text = kafka_job_head("\"t\"")
            + "[sink.elasticsearch]\nurl = \"http://es:9200\"\nindex = \"i\"\nid = \"key\"\non_null_value = \"delete\"\n";
        let smt = text.clone() + "[[transform]]\ntype = \"replace_field\"\nexclude = [\"x\"]\n";
        parse(&smt, Path::new("/jobs/job.toml")).unwrap();
        let sum =
            text + "[[transform]]\ntype = \"rolling_sum\"\nkey = \"/user\"\nfield = \"/amount\"\n";
        let e = parse_err(&sum);
        assert_eq!(e.key, "sink.elasticsearch.on_null_value", "{e}");
        assert!(e.message.contains("rolling_sum"), "{e}");
    }

    #[test]
    fn a_jq_dead_letter_needs_a_kafka_source() {
        let jq = "[[transform]]\ntype = \"jq\"\nfilter = \".\"\non_error = \"dead-letter:dlq\"\n";
        let kafka = kafka_job_head("\"t\"") + jq + "[sink.file]\ndir = \"out\"\n";
        parse(&kafka, Path::new("/jobs/job.toml")).unwrap();
        let sequence = GOOD.replace(
            "[[transform]]\ntype = \"rolling_sum\"",
            &format!("{jq}\n[[transform]]\ntype = \"rolling_sum\""),
        );
        let e = parse_err(&sequence);
        assert_eq!(e.key, "transform[0].on_error", "{e}");
    }

    #[test]
    fn records_numbered_twice_or_versioned_by_a_shared_offset_are_refused() {
        let head = kafka_job_head("\"t\"");
        let jq = "[[transform]]\ntype = \"jq\"\nfilter = \".[]\"\n";
        let sum = "[[transform]]\ntype = \"rolling_sum\"\nkey = \"/user\"\nfield = \"/amount\"\n";
        let es = "[sink.elasticsearch]\nurl = \"http://es:9200\"\nindex = \"i\"\n";
        // Two programs side by side number their outputs together.
        parse(&format!("{head}{jq}{jq}{es}"), Path::new("/jobs/job.toml")).unwrap();
        let e = parse_err(&format!("{head}{jq}{sum}{jq}{es}"));
        assert_eq!(e.key, "transform[2]", "{e}");
        let versioned = format!("{head}{jq}{es}versioning = \"external\"\nid = \"key\"\n");
        let e = parse_err(&versioned);
        assert_eq!(e.key, "sink.elasticsearch.versioning", "{e}");
        let one = versioned.replace(".[]\"\n", ".[]\"\nmax_outputs = 1\n");
        parse(&one, Path::new("/jobs/job.toml")).unwrap();
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

    /// A sink of a program's own: counts nothing, keeps nothing.
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct DiscardSection {
        #[allow(dead_code)]
        label: String,
    }

    struct Discard;

    #[async_trait::async_trait]
    impl crate::connector::Sink for Discard {
        async fn open(
            &mut self,
            _: &crate::connector::SubtaskInfo,
            _: &crate::connector::SinkRestore,
        ) -> crate::error::Result<()> {
            Ok(())
        }
        async fn invoke(&mut self, _: crate::record::Batch) -> crate::error::Result<()> {
            Ok(())
        }
        async fn snapshot(
            &mut self,
            _: lockgate_state::CheckpointId,
        ) -> crate::error::Result<Vec<u8>> {
            Ok(Vec::new())
        }
        async fn notify_checkpoint_complete(
            &mut self,
            _: lockgate_state::CheckpointId,
        ) -> crate::error::Result<()> {
            Ok(())
        }
    }

    impl crate::connector::SinkSection for DiscardSection {
        fn prepare(self, cx: &SinkContext<'_>) -> Result<crate::connector::PreparedSink, KeyError> {
            if self.label.is_empty() {
                return Err(KeyError::new("label", "must not be empty"));
            }
            Ok(crate::connector::PreparedSink {
                spec: crate::connector::SinkSpec::new("discard", |_| Box::new(Discard)),
                config: std::sync::Arc::new(cx.source.format.clone()),
                reads_tombstones: false,
            })
        }
    }

    #[test]
    fn a_registered_connector_of_ones_own_is_named_in_a_job_file() {
        let text = GOOD.replace(
            "[sink.file]\ndir = \"out\"",
            "[sink.discard]\nlabel = \"x\"",
        );
        let path = Path::new("/jobs/job.toml");
        // Unknown to the built-in registry: named by its table.
        let e = parse_err(&text);
        assert_eq!(e.key, "sink.discard", "{e}");
        assert!(e.message.contains("[sink.elasticsearch]"), "{e}");
        let registry = crate::builtin::registry().with_sink::<DiscardSection>("discard");
        let g = super::parse(&text, path, &registry).unwrap();
        assert_eq!(
            g.describe(),
            "t: source:sequence > key_by > rolling_sum[rolling_sum-0] > sink:discard"
        );
        // Its errors name its keys, in full, with the file.
        let e = super::parse(&text.replace("\"x\"", "\"\""), path, &registry)
            .err()
            .unwrap();
        assert_eq!(
            e.to_string(),
            "/jobs/job.toml: sink.discard.label: must not be empty"
        );
        let e = super::parse(&text.replace("label", "lable"), path, &registry)
            .err()
            .unwrap();
        assert_eq!(e.key, "sink.discard.lable", "{e}");
    }

    #[test]
    fn unknown_sections_and_transform_types_name_the_key() {
        let e = parse_err(&GOOD.replace("[source.sequence]", "[source.files]"));
        assert_eq!(e.key, "source.files", "{e}");
        assert!(
            e.message
                .contains("[source.sequence], [source.kafka] or [source.postgres_cdc]"),
            "{e}"
        );
        let e = parse_err(&GOOD.replace("type = \"rolling_sum\"", "type = \"rolling_max\""));
        assert_eq!(e.key, "transform[0].type", "{e}");
        assert!(e.message.contains("rolling_sum"), "{e}");
        let e = parse_err(&GOOD.replace("type = \"rolling_sum\"\n", ""));
        assert_eq!(e.key, "transform[0].type", "{e}");
        let e = parse_err(&GOOD.replace("[sink.file]\ndir = \"out\"", ""));
        assert_eq!(e.key, "sink", "{e}");
        let e = parse_err(&GOOD.replace("[source.sequence]\nfrom = 1\nto = 100\nkeys = 10", ""));
        assert_eq!(e.key, "source", "{e}");
        assert!(e.message.contains("a source table is required"), "{e}");
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

/// Every job-file key that says what becomes of a record a step cannot take (the
/// `on_*` keys and the window's `late`), with every spelling, in every section that
/// has it and with a source that has a Kafka cluster for dead letters or none: what
/// each spelling means, or the exact error a user reads.
#[cfg(test)]
mod dead_letter_policies {
    use super::*;
    use crate::connector::{KeyError, PreparedSource, SourceFacts, SourceSection};
    use crate::connectors::sequence::{SequenceConfig, SequenceSource};

    /// A source with event time and no Kafka cluster: the windows' dead letters have
    /// nowhere to go.
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct ClockSection {}

    impl SourceSection for ClockSection {
        fn prepare(self, _: &SectionContext) -> Result<PreparedSource, KeyError> {
            Ok(PreparedSource {
                facts: SourceFacts {
                    event_time: true,
                    ..SourceFacts::json("clock")
                },
                config: std::sync::Arc::new(()),
                build: Box::new(|_| ten_records()),
            })
        }
    }

    /// What the test sections build: a bounded source of ten records.
    fn ten_records() -> crate::connector::SourceSpec {
        SequenceSource::spec(SequenceConfig {
            from: 1,
            to: 10,
            keys: 1,
            rate_per_sec: 0,
            splits: 1,
        })
    }

    /// A source whose records have no coordinates (an acknowledging source's).
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct QueueSection {}

    impl SourceSection for QueueSection {
        fn prepare(self, _: &SectionContext) -> Result<PreparedSource, KeyError> {
            Ok(PreparedSource {
                facts: SourceFacts {
                    without_coordinates: Some("messages of a queue".into()),
                    ..SourceFacts::json("queue")
                },
                config: std::sync::Arc::new(()),
                build: Box::new(|_| ten_records()),
            })
        }
    }

    #[test]
    fn records_without_coordinates_from_the_source_are_refused_where_coordinates_are_needed() {
        let registry = crate::builtin::registry().with_source::<QueueSection>("queue");
        let load = |body: &str| {
            build(
                &format!("{HEAD}[source.queue]\n{body}"),
                Path::new("/jobs/job.toml"),
                &registry,
            )
            .map(|_| ())
            .map_err(|e| format!("{}: {}", e.key, e.message))
        };
        let e = load(ES).unwrap_err();
        assert!(
            e.starts_with("sink.elasticsearch.id: messages of a queue have no source coordinates to make ids of"),
            "{e}"
        );
        load(&format!("{ES}id = \"field:/n\"\n")).unwrap();
        let e = load(&format!("{KAFKA_SINK}bootstrap_servers = \"k:9092\"\n")).unwrap_err();
        assert!(e.starts_with("sink.kafka: a repartition stage marks each record by its source coordinates, and messages of a queue have none"), "{e}");
        load(FILES).unwrap();
    }

    const HEAD: &str = "[job]\nname = \"t\"\n[checkpoint]\ndir = \"c\"\n";
    const KAFKA: &str = "[source.kafka]\nbootstrap_servers = \"k:9092\"\ntopics = [\"t\"]\n";
    const EVENT_TIME: &str = "[source.kafka.watermark]\nmax_out_of_orderness_ms = 0\n";
    const SEQUENCE: &str = "[source.sequence]\nfrom = 1\nto = 100\nkeys = 10\n";
    const CLOCK: &str = "[source.clock]\n";
    const FILES: &str = "[sink.file]\ndir = \"out\"\n";
    const JQ: &str = "[[transform]]\ntype = \"jq\"\nfilter = \".\"\n";
    const DEBEZIUM: &str = "[[transform]]\ntype = \"debezium\"\ndelete_handling = \"rewrite\"\n";
    const WINDOW: &str =
        "[[transform]]\ntype = \"window\"\nkind = \"tumbling\"\nsize_ms = 60000\nkey = \"/user\"\n";
    const LATENESS: &str = "allowed_lateness_ms = 1000\n";
    const ES: &str = "[sink.elasticsearch]\nurl = \"http://es:9200\"\nindex = \"i\"\n";
    const PG: &str = "[sink.postgres]\nurl = \"postgresql://u@db:5432/d\"\ntable = \"t\"\n";
    const KAFKA_SINK: &str = "[sink.kafka]\ntopic = \"out\"\nkey = \"/user\"\n";

    /// What the job files write as the key's value (`None`: the key is absent).
    const SPELLINGS: [Option<&str>; 12] = [
        None,
        Some("fail"),
        Some("skip"),
        Some("drop"),
        Some("update"),
        Some("dead-letter:dlq"),
        Some("dead-letter:"),
        Some("dead-letter"),
        Some("Fail"),
        Some(""),
        Some("dead_letter:dlq"),
        Some("skip "),
    ];

    /// The refusals of a spelling a key does not take (`{s}`: the spelling).
    const DECODE: &str = "`{s}` is not one of fail, skip, dead-letter:<topic>";
    const ITEM: &str = "`{s}` is not one of fail, dead-letter:<topic>";
    const LATE: &str = "`{s}` is not one of drop, dead-letter:<topic>, update";

    /// What the spellings a key takes mean there (a policy as the job file spells
    /// it, or `! key: error`); every other spelling is refused.
    type Takes = &'static [(Option<&'static str>, &'static str)];
    const FAIL_SKIP_DLQ: Takes = &[
        (None, "fail"),
        (Some("fail"), "fail"),
        (Some("skip"), "skip"),
        (Some("dead-letter:dlq"), "dead-letter:dlq"),
    ];
    const FAIL_SKIP_NO_CLUSTER: Takes = &[
        (None, "fail"),
        (Some("fail"), "fail"),
        (Some("skip"), "skip"),
        (
            Some("dead-letter:dlq"),
            "! transform[0].on_error: dead letters go to the source's Kafka cluster, and this source has none: use fail or skip",
        ),
    ];
    const FAIL_DLQ: Takes = &[
        (None, "fail"),
        (Some("fail"), "fail"),
        (Some("dead-letter:dlq"), "dead-letter:dlq"),
    ];

    /// One section's key: the job file with `line` (`key = "spelling"`, or nothing) at
    /// its place, and what the parsed job says the key is.
    struct Place {
        /// The key in full.
        key: &'static str,
        /// The job around it.
        source: &'static str,
        job: fn(&str) -> String,
        read: fn(&JobDescription) -> String,
        refused: &'static str,
        takes: Takes,
    }

    /// A policy as the job file spells it, from its `Debug` form.
    fn word(policy: &dyn std::fmt::Debug) -> String {
        let d = format!("{policy:?}");
        match d.strip_prefix("DeadLetter(\"") {
            Some(t) => format!("dead-letter:{}", t.trim_end_matches("\")")),
            None => d.to_lowercase(),
        }
    }

    fn transform(d: &JobDescription) -> String {
        let t = d.transform_configs::<crate::transforms::Applied>();
        word(t[0].0.on_error())
    }

    fn window(d: &JobDescription) -> &crate::operators::window::WindowSpec {
        d.transform_configs::<crate::operators::window::WindowSpec>()[0]
    }

    /// The window's `late`: `drop` is [`OnError::Skip`], `update` is that with late
    /// updates.
    fn late(d: &JobDescription) -> String {
        let w = window(d);
        match (&w.late, w.timing.late_updates) {
            (crate::dead_letter::OnError::Skip, false) => "drop".into(),
            (crate::dead_letter::OnError::Skip, true) => "update".into(),
            (other, updates) => format!("{}{}", word(other), if updates { "+update" } else { "" }),
        }
    }

    fn es(d: &JobDescription) -> String {
        let c = d.sink_config::<crate::connectors::elasticsearch::EsSinkConfig>();
        word(&c.unwrap().on_item_error)
    }

    fn pg(d: &JobDescription) -> String {
        let c = d.sink_config::<crate::connectors::postgres::PgConfig>();
        word(&c.unwrap().on_item_error)
    }

    fn kafka_sink(d: &JobDescription) -> String {
        let c = d.sink_config::<crate::connectors::kafka::KafkaSinkConfig>();
        word(&c.unwrap().on_invalid)
    }

    fn places() -> Vec<Place> {
        vec![
            Place {
                key: "source.kafka.on_decode_error",
                source: "kafka",
                job: |l| format!("{HEAD}{KAFKA}{l}{FILES}"),
                read: |d| {
                    let c = d.source_config::<crate::connectors::kafka::KafkaSourceConfig>();
                    word(&c.unwrap().on_decode_error)
                },
                refused: DECODE,
                takes: FAIL_SKIP_DLQ,
            },
            Place {
                key: "transform[0].on_error",
                source: "kafka, jq",
                job: |l| format!("{HEAD}{KAFKA}{JQ}{l}{FILES}"),
                read: transform,
                refused: DECODE,
                takes: FAIL_SKIP_DLQ,
            },
            Place {
                key: "transform[0].on_error",
                source: "sequence, jq",
                job: |l| format!("{HEAD}{SEQUENCE}{JQ}{l}{FILES}"),
                read: transform,
                refused: DECODE,
                takes: FAIL_SKIP_NO_CLUSTER,
            },
            Place {
                key: "transform[0].on_error",
                source: "kafka, debezium",
                job: |l| format!("{HEAD}{KAFKA}{DEBEZIUM}{l}{FILES}"),
                read: transform,
                refused: DECODE,
                takes: FAIL_SKIP_DLQ,
            },
            Place {
                key: "transform[0].on_error",
                source: "sequence, debezium",
                job: |l| format!("{HEAD}{SEQUENCE}{DEBEZIUM}{l}{FILES}"),
                read: transform,
                refused: DECODE,
                takes: FAIL_SKIP_NO_CLUSTER,
            },
            Place {
                key: "transform[0].on_error",
                source: "kafka, window",
                job: |l| format!("{HEAD}{KAFKA}{EVENT_TIME}{WINDOW}{l}{FILES}"),
                read: |d| word(&window(d).on_error),
                refused: DECODE,
                takes: FAIL_SKIP_DLQ,
            },
            Place {
                key: "transform[0].on_error",
                source: "event time without kafka, window",
                job: |l| format!("{HEAD}{CLOCK}{WINDOW}{l}{FILES}"),
                read: |d| word(&window(d).on_error),
                refused: DECODE,
                takes: FAIL_SKIP_NO_CLUSTER,
            },
            Place {
                key: "transform[0].late",
                source: "kafka, window without lateness",
                job: |l| format!("{HEAD}{KAFKA}{EVENT_TIME}{WINDOW}{l}{FILES}"),
                read: late,
                refused: LATE,
                takes: &[
                    (None, "drop"),
                    (Some("drop"), "drop"),
                    (
                        Some("update"),
                        "! transform[0].late: update keeps windows for allowed_lateness_ms after their end, and it is 0: set allowed_lateness_ms",
                    ),
                    (Some("dead-letter:dlq"), "dead-letter:dlq"),
                ],
            },
            Place {
                key: "transform[0].late",
                source: "kafka, window with lateness",
                job: |l| format!("{HEAD}{KAFKA}{EVENT_TIME}{WINDOW}{LATENESS}{l}{FILES}"),
                read: late,
                refused: LATE,
                takes: &[
                    (None, "drop"),
                    (Some("drop"), "drop"),
                    (Some("update"), "update"),
                    (Some("dead-letter:dlq"), "dead-letter:dlq"),
                ],
            },
            Place {
                key: "transform[0].late",
                source: "event time without kafka, window with lateness",
                job: |l| format!("{HEAD}{CLOCK}{WINDOW}{LATENESS}{l}{FILES}"),
                read: late,
                refused: LATE,
                takes: &[
                    (None, "drop"),
                    (Some("drop"), "drop"),
                    (Some("update"), "update"),
                    (
                        Some("dead-letter:dlq"),
                        "! transform[0].late: dead letters go to the source's Kafka cluster, and this source has none: use drop",
                    ),
                ],
            },
            Place {
                key: "sink.elasticsearch.on_item_error",
                source: "kafka",
                job: |l| format!("{HEAD}{KAFKA}{ES}{l}"),
                read: es,
                refused: ITEM,
                takes: FAIL_DLQ,
            },
            Place {
                key: "sink.elasticsearch.on_item_error",
                source: "sequence",
                job: |l| format!("{HEAD}{SEQUENCE}{ES}{l}"),
                read: es,
                refused: ITEM,
                takes: &[
                    (None, "fail"),
                    (Some("fail"), "fail"),
                    (
                        Some("dead-letter:dlq"),
                        "! sink.elasticsearch.on_item_error: dead-letter needs Kafka bootstrap servers (the job's Kafka source provides them)",
                    ),
                ],
            },
            Place {
                key: "sink.postgres.on_item_error",
                source: "kafka",
                job: |l| format!("{HEAD}{KAFKA}{PG}{l}"),
                read: pg,
                refused: ITEM,
                takes: FAIL_DLQ,
            },
            Place {
                key: "sink.postgres.on_item_error",
                source: "sequence",
                job: |l| format!("{HEAD}{SEQUENCE}{PG}{l}"),
                read: pg,
                refused: ITEM,
                takes: &[
                    (None, "fail"),
                    (Some("fail"), "fail"),
                    (
                        Some("dead-letter:dlq"),
                        "! sink.postgres.on_item_error: dead letters go to the source's Kafka cluster, and this job's source is not Kafka",
                    ),
                ],
            },
            Place {
                key: "sink.kafka.on_invalid",
                source: "kafka",
                job: |l| format!("{HEAD}{KAFKA}{KAFKA_SINK}{l}"),
                read: kafka_sink,
                refused: ITEM,
                takes: FAIL_DLQ,
            },
            Place {
                // The sink's own cluster takes its dead letters.
                key: "sink.kafka.on_invalid",
                source: "sequence",
                job: |l| format!("{HEAD}{SEQUENCE}{KAFKA_SINK}bootstrap_servers = \"k:9092\"\n{l}"),
                read: kafka_sink,
                refused: ITEM,
                takes: FAIL_DLQ,
            },
        ]
    }

    /// What the job file of `place` with `spelling` gives.
    fn outcome(place: &Place, spelling: Option<&str>) -> String {
        let name = place.key.rsplit('.').next().unwrap();
        let line = spelling.map_or(String::new(), |s| format!("{name} = \"{s}\"\n"));
        let registry = crate::builtin::registry().with_source::<ClockSection>("clock");
        match build(&(place.job)(&line), Path::new("/jobs/job.toml"), &registry) {
            Ok((_, d)) => (place.read)(&d),
            Err(e) => format!("! {}: {}", e.key, e.message),
        }
    }

    #[test]
    fn every_key_and_spelling_means_what_it_meant() {
        for place in places() {
            for spelling in SPELLINGS {
                let want = match place.takes.iter().find(|(s, _)| *s == spelling) {
                    Some((_, means)) => means.to_string(),
                    None => format!(
                        "! {}: {}",
                        place.key,
                        place
                            .refused
                            .replace("{s}", spelling.expect("absent keys are taken"))
                    ),
                };
                assert_eq!(
                    outcome(&place, spelling),
                    want,
                    "{} ({}) = {spelling:?}",
                    place.key,
                    place.source
                );
            }
        }
    }
}
