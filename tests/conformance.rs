//! The connector conformance suite (`lockgate::testkit::conformance`) run over every
//! built-in connector: each module is one connector's context, and
//! `source_conformance!` / `sink_conformance!` expand into one test per case.

mod common;

use lockgate::builtin::registry as builtin;
use lockgate::connector::{SinkSpec, SourceSpec};
use lockgate::testkit::conformance::sink::{run_case, SinkFixture, SinkTestContext};
use lockgate::testkit::conformance::source::{SourceFixture, SourceTestContext};
use lockgate::testkit::conformance::visibility::CommitAtBarrier;
use lockgate::testkit::conformance::{sink_from_section, source_from_section};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

/// A fresh name per fixture (topics, indices, directories).
fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!("{prefix}-{}", N.fetch_add(1, Ordering::SeqCst))
}

/// An embedded Kafka (a `lockgate testkit kafka` process) that makes topics.
pub struct Kafka {
    process: Mutex<common::kafka::KafkaProcess>,
    bootstrap: String,
}

impl Kafka {
    fn start() -> Kafka {
        let process = common::kafka::KafkaProcess::start(&[]);
        Kafka {
            bootstrap: process.bootstrap.clone(),
            process: Mutex::new(process),
        }
    }

    /// A new topic of `partitions` partitions, named after `prefix`.
    fn topic(&self, prefix: &str, partitions: u32) -> String {
        let topic = unique(prefix);
        self.process
            .lock()
            .unwrap()
            .control(&format!("topic {topic}:{partitions}"));
        topic
    }
}

/// The source `(name, body)` of a job file, as the job file's loader reads it.
fn source_spec(section: (String, String), base: &Path) -> Result<SourceSpec, String> {
    source_from_section(&builtin(), &section.0, &section.1, base)
}

/// The sink `(name, body)` of a job file, as the job file's loader reads it.
fn sink_spec(section: (String, String)) -> Result<SinkSpec, String> {
    sink_from_section(&builtin(), &section.0, &section.1, Path::new("/"))
}

mod sequence_source {
    use super::*;
    use lockgate::connectors::sequence::record_json;

    /// The sequence source is a generator: "writing" `n` records to each split raises
    /// `to`, and its splits grow together. With as many keys as the fixture has
    /// splits, the records of fixture split `j` are the `i` with `i % splits == j`
    /// (from 0), all in one of the source's splits, in order.
    pub struct Context;

    struct Fixture {
        splits: u32,
        per_split: Vec<usize>,
    }

    impl SourceTestContext for Context {
        fn program(&self) -> Option<PathBuf> {
            Some(common::bin())
        }

        fn create(&self, splits: u32) -> Result<Box<dyn SourceFixture>, String> {
            Ok(Box::new(Fixture {
                splits,
                per_split: vec![0; splits as usize],
            }))
        }
    }

    impl Fixture {
        /// `[source.sequence]` of the records written, `rate_per_sec` of them a second.
        fn at_rate(&self, rate_per_sec: u64) -> Result<(String, String), String> {
            Ok((
                "sequence".into(),
                format!(
                    "from = 0\nto = {}\nkeys = {}\nrate_per_sec = {rate_per_sec}",
                    self.to()?,
                    self.splits
                ),
            ))
        }

        /// The last record.
        fn to(&self) -> Result<i64, String> {
            let n = self.per_split[0];
            if self.per_split.iter().any(|c| *c != n) {
                return Err("the sequence's splits grow together: write as many to each".into());
            }
            Ok((n * self.splits as usize) as i64 - 1)
        }
    }

    impl SourceFixture for Fixture {
        fn write(&mut self, split: u32, n: usize) -> Result<Vec<Vec<u8>>, String> {
            let s = self.splits as i64;
            let have = self.per_split[split as usize];
            self.per_split[split as usize] += n;
            Ok((have..have + n)
                .map(|m| record_json(split as i64 + s * m as i64, self.splits))
                .collect())
        }

        /// Paced in process-level runs (3,000 records a second), so that a run lasts
        /// long enough to be killed mid-stream.
        fn section(&self, _bounded: bool) -> Result<(String, String), String> {
            self.at_rate(3000)
        }

        /// Unpaced in process: the suite's collecting sink paces where a case needs it.
        fn spec(&self, _bounded: bool) -> Result<SourceSpec, String> {
            source_spec(self.at_rate(0)?, Path::new("/"))
        }

        fn unbounded(&self) -> bool {
            false
        }
    }

    lockgate::source_conformance!(Context);
}

mod kafka_source {
    use super::*;
    use common::kafka::produce_raw;

    /// Each fixture is a topic of its own in an embedded Kafka, read through the job
    /// file's `[source.kafka]` section.
    pub struct Context(Kafka);

    struct Fixture {
        topic: String,
        bootstrap: String,
    }

    impl SourceTestContext for Context {
        fn program(&self) -> Option<PathBuf> {
            Some(common::bin())
        }

        fn create(&self, splits: u32) -> Result<Box<dyn SourceFixture>, String> {
            Ok(Box::new(Fixture {
                topic: self.0.topic("conformance", splits),
                bootstrap: self.0.bootstrap.clone(),
            }))
        }
    }

    impl SourceFixture for Fixture {
        fn write(&mut self, split: u32, n: usize) -> Result<Vec<Vec<u8>>, String> {
            static WRITTEN: AtomicU32 = AtomicU32::new(0);
            let values: Vec<Vec<u8>> = (0..n)
                .map(|_| {
                    let i = WRITTEN.fetch_add(1, Ordering::SeqCst);
                    format!(
                        "{{\"topic\":\"{}\",\"split\":{split},\"i\":{i}}}",
                        self.topic
                    )
                    .into_bytes()
                })
                .collect();
            let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
            produce_raw(&self.bootstrap, &self.topic, split as i32, &refs);
            Ok(values)
        }

        fn section(&self, bounded: bool) -> Result<(String, String), String> {
            let bound = if bounded {
                "bounded = \"latest\"\n"
            } else {
                ""
            };
            Ok((
                "kafka".into(),
                format!(
                    "bootstrap_servers = \"{}\"\ntopics = [\"{}\"]\nstartup = \"earliest\"\n{bound}",
                    self.bootstrap, self.topic
                ),
            ))
        }

        fn spec(&self, bounded: bool) -> Result<SourceSpec, String> {
            source_spec(self.section(bounded)?, Path::new("/"))
        }
    }

    lockgate::source_conformance!(Context(Kafka::start()));
}

/// What a sink fixture holds, read from JSON lines.
fn json_lines(text: &str) -> Result<Vec<Value>, String> {
    text.lines()
        .map(|l| serde_json::from_str(l).map_err(|e| format!("{l:?}: {e}")))
        .collect()
}

mod file_sink {
    use super::*;

    /// Each fixture is a directory of its own; reading it reads the committed part
    /// files (`part-*`), as a reader of the output would.
    pub struct Context(tempfile::TempDir);

    struct Fixture(PathBuf);

    impl SinkTestContext for Context {
        fn program(&self) -> Option<PathBuf> {
            Some(common::bin())
        }

        fn create(&self) -> Result<Box<dyn SinkFixture>, String> {
            Ok(Box::new(Fixture(self.0.path().join(unique("out")))))
        }
    }

    impl SinkFixture for Fixture {
        fn section(&self) -> Result<(String, String), String> {
            Ok((
                "file".into(),
                format!("dir = {:?}", self.0.display().to_string()),
            ))
        }

        fn spec(&self) -> Result<SinkSpec, String> {
            sink_spec(self.section()?)
        }

        fn read(&self) -> Result<Vec<Value>, String> {
            let mut all = Vec::new();
            let Ok(rd) = std::fs::read_dir(&self.0) else {
                return Ok(all);
            };
            for e in rd {
                let e = e.map_err(|e| e.to_string())?;
                if e.file_name().to_string_lossy().starts_with("part-") {
                    let text = std::fs::read_to_string(e.path()).map_err(|e| e.to_string())?;
                    all.extend(json_lines(&text)?);
                }
            }
            Ok(all)
        }
    }

    lockgate::sink_conformance!(Context(tempfile::tempdir().unwrap()));

    /// The suite catches a file sink that commits at the barrier, before its
    /// checkpoint is durable (every case that reads only the final output passes it).
    #[test]
    fn the_suite_fails_a_file_sink_that_commits_at_the_barrier() {
        let tmp = tempfile::tempdir().unwrap();
        let cx = CommitAtBarrier(Context(tempfile::tempdir().unwrap()));
        let e = run_case("visibility_at_checkpoints", &cx, tmp.path()).unwrap_err();
        assert!(e.contains("visible before the checkpoint completed"), "{e}");
        let tmp = tempfile::tempdir().unwrap();
        run_case("single_subtask", &cx, tmp.path()).expect("the final output alone is right");
    }
}

/// The file sink writing Parquet: each fixture a directory of its own, read by pyarrow
/// (an independent reader), every committed part file's rows.
mod parquet_file_sink {
    use super::*;

    /// The conformance records' columns (`seq`, `key` and `value`, all longs).
    const SCHEMA: &str = r#"{"type":"record","name":"sequence","fields":[{"name":"seq","type":"long"},{"name":"key","type":"long"},{"name":"value","type":"long"}]}"#;

    /// A temporary directory, and more keys of the section.
    pub struct Context(tempfile::TempDir, &'static str);

    struct Fixture {
        dir: PathBuf,
        schema: PathBuf,
        keys: &'static str,
    }

    impl SinkTestContext for Context {
        fn program(&self) -> Option<PathBuf> {
            Some(common::bin())
        }

        fn create(&self) -> Result<Box<dyn SinkFixture>, String> {
            let schema = self.0.path().join("sequence.avsc");
            std::fs::write(&schema, SCHEMA).map_err(|e| e.to_string())?;
            Ok(Box::new(Fixture {
                dir: self.0.path().join(unique("out")),
                schema,
                keys: self.1,
            }))
        }
    }

    impl SinkFixture for Fixture {
        fn section(&self) -> Result<(String, String), String> {
            Ok((
                "file".into(),
                format!(
                    "dir = {:?}\nformat = \"parquet\"\nschema_file = {:?}\ncompression = \"zstd\"\n{}",
                    self.dir.display().to_string(),
                    self.schema.display().to_string(),
                    self.keys
                ),
            ))
        }

        fn spec(&self) -> Result<SinkSpec, String> {
            sink_spec(self.section()?)
        }

        fn read(&self) -> Result<Vec<Value>, String> {
            Ok(common::lake::rows(&self.dir)?
                .into_iter()
                .map(|mut r| r["row"].take())
                .collect())
        }
    }

    lockgate::sink_conformance!(Context(tempfile::tempdir().unwrap(), ""));

    /// A folder per key, parts rolled at 1 KiB: several files per checkpoint.
    mod partitioned {
        use super::*;
        lockgate::sink_conformance!(Context(
            tempfile::tempdir().unwrap(),
            "partition_by = \"bucket={/key}\"\nroll_bytes = 1024"
        ));
    }
}

/// The Iceberg sink: each fixture a table of its own in one SQL catalog (SQLite) with
/// a local warehouse, read by pyiceberg through the same catalog.
mod iceberg_sink {
    use super::*;

    const SCHEMA: &str = r#"{"type":"record","name":"sequence","fields":[{"name":"seq","type":"long"},{"name":"key","type":"long"},{"name":"value","type":"long"}]}"#;

    /// A temporary directory (the catalog, the warehouse, the schema), and more keys
    /// of the section.
    pub struct Context(tempfile::TempDir, &'static str);

    struct Fixture {
        root: PathBuf,
        table: String,
        keys: &'static str,
        reader: std::sync::Mutex<Option<common::lake::IcebergReader>>,
    }

    impl SinkTestContext for Context {
        fn program(&self) -> Option<PathBuf> {
            Some(common::bin())
        }

        fn create(&self) -> Result<Box<dyn SinkFixture>, String> {
            std::fs::write(self.0.path().join("sequence.avsc"), SCHEMA)
                .map_err(|e| e.to_string())?;
            Ok(Box::new(Fixture {
                root: self.0.path().to_path_buf(),
                table: format!("conformance.{}", unique("t").replace('-', "_")),
                keys: self.1,
                reader: std::sync::Mutex::new(None),
            }))
        }
    }

    impl Fixture {
        fn uri(&self) -> String {
            format!("sqlite:///{}", self.root.join("catalog.db").display())
        }

        fn warehouse(&self) -> String {
            format!("file://{}", self.root.join("warehouse").display())
        }
    }

    impl SinkFixture for Fixture {
        fn section(&self) -> Result<(String, String), String> {
            Ok((
                "iceberg".into(),
                format!(
                    "catalog = {{ type = \"sql\", name = \"lake\", uri = {:?}, warehouse = {:?} }}\ntable = {:?}\nschema_file = {:?}\n{}",
                    self.uri(),
                    self.warehouse(),
                    self.table,
                    self.root.join("sequence.avsc").display().to_string(),
                    self.keys
                ),
            ))
        }

        fn spec(&self) -> Result<SinkSpec, String> {
            sink_spec(self.section()?)
        }

        fn read(&self) -> Result<Vec<Value>, String> {
            let mut reader = self.reader.lock().map_err(|e| e.to_string())?;
            if reader.is_none() {
                *reader = Some(common::lake::IcebergReader::start(&[])?);
            }
            let t = reader.as_mut().expect("started").read(
                &self.uri(),
                &self.warehouse(),
                "lake",
                &self.table,
            )?;
            common::lake::one_snapshot_per_checkpoint(&t)?;
            Ok(t.rows)
        }
    }

    lockgate::sink_conformance!(Context(tempfile::tempdir().unwrap(), ""));

    /// A partition per key, data files rolled at 1 KiB: several files per checkpoint.
    mod partitioned {
        use super::*;
        lockgate::sink_conformance!(Context(
            tempfile::tempdir().unwrap(),
            "partition_by = \"key={/key}\"\nroll_bytes = 1024"
        ));
    }
}

/// The file sink writing into an object store (moto's S3 server, started once): each
/// fixture a prefix of its own, read by pyarrow through its own S3 client, in both
/// formats.
mod store_file_sink {
    use super::*;
    use lockgate::testkit::moto::MotoServer;
    use std::sync::OnceLock;

    const SCHEMA: &str = r#"{"type":"record","name":"sequence","fields":[{"name":"seq","type":"long"},{"name":"key","type":"long"},{"name":"value","type":"long"}]}"#;

    fn moto() -> &'static MotoServer {
        static MOTO: OnceLock<MotoServer> = OnceLock::new();
        MOTO.get_or_init(|| {
            let m = MotoServer::start().expect("moto");
            m.create_bucket("lake").expect("bucket");
            m
        })
    }

    pub struct Context {
        tmp: tempfile::TempDir,
        parquet: bool,
        /// More keys of the section.
        keys: &'static str,
    }

    struct Fixture {
        url: String,
        settings: String,
    }

    impl SinkTestContext for Context {
        fn program(&self) -> Option<PathBuf> {
            Some(common::bin())
        }

        fn create(&self) -> Result<Box<dyn SinkFixture>, String> {
            let m = moto();
            let mut settings = format!(
                "endpoint = {:?}\nallow_http = true\nregion = \"us-east-1\"\naccess_key_id = \"testing\"\nsecret_access_key = \"testing\"",
                m.endpoint()
            );
            if self.parquet {
                let schema = self.tmp.path().join("sequence.avsc");
                std::fs::write(&schema, SCHEMA).map_err(|e| e.to_string())?;
                settings.push_str(&format!(
                    "\nformat = \"parquet\"\nschema_file = {:?}",
                    schema.display().to_string()
                ));
            }
            settings.push('\n');
            settings.push_str(self.keys);
            Ok(Box::new(Fixture {
                url: format!("s3://lake/{}", unique("out")),
                settings,
            }))
        }
    }

    impl SinkFixture for Fixture {
        fn section(&self) -> Result<(String, String), String> {
            Ok((
                "file".into(),
                format!("dir = {:?}\n{}", self.url, self.settings),
            ))
        }

        fn spec(&self) -> Result<SinkSpec, String> {
            sink_spec(self.section()?)
        }

        fn read(&self) -> Result<Vec<Value>, String> {
            Ok(common::lake::store_rows(&self.url, &moto().env())?
                .into_iter()
                .map(|mut r| r["row"].take())
                .collect())
        }
    }

    mod parquet {
        use super::*;
        lockgate::sink_conformance!(Context {
            tmp: tempfile::tempdir().unwrap(),
            parquet: true,
            keys: ""
        });
    }

    /// JSON lines in a folder per key, parts rolled at 1 KiB.
    mod json_partitioned {
        use super::*;
        lockgate::sink_conformance!(Context {
            tmp: tempfile::tempdir().unwrap(),
            parquet: false,
            keys: "partition_by = \"bucket={/key}\"\nroll_bytes = 1024"
        });
    }

    mod json {
        use super::*;
        lockgate::sink_conformance!(Context {
            tmp: tempfile::tempdir().unwrap(),
            parquet: false,
            keys: ""
        });
    }
}

/// The Elasticsearch sink's context over any Elasticsearch-API server: each fixture is
/// an index of its own, documents by `id = "field:/seq"`.
mod elasticsearch {
    use super::*;
    use common::es::Es;

    pub struct Context(pub Es);

    struct Fixture {
        url: String,
        index: String,
        http: reqwest::blocking::Client,
    }

    impl SinkTestContext for Context {
        fn program(&self) -> Option<PathBuf> {
            Some(common::bin())
        }

        fn create(&self) -> Result<Box<dyn SinkFixture>, String> {
            Ok(Box::new(Fixture {
                url: self.0.url(),
                index: unique("conformance"),
                http: reqwest::blocking::Client::new(),
            }))
        }
    }

    impl Fixture {
        fn call(
            &self,
            method: &str,
            path: &str,
            body: Option<Value>,
        ) -> Result<(u16, Value), String> {
            let mut req = self
                .http
                .request(method.parse().unwrap(), format!("{}{path}", self.url));
            if let Some(b) = body {
                req = req.json(&b);
            }
            let r = req.send().map_err(|e| e.to_string())?;
            Ok((
                r.status().as_u16(),
                r.json::<Value>().unwrap_or(Value::Null),
            ))
        }
    }

    impl SinkFixture for Fixture {
        fn section(&self) -> Result<(String, String), String> {
            Ok((
                "elasticsearch".into(),
                format!(
                    "url = \"{}\"\nindex = \"{}\"\nid = \"field:/seq\"\nbulk_flush_interval_ms = 50",
                    self.url, self.index
                ),
            ))
        }

        fn spec(&self) -> Result<SinkSpec, String> {
            sink_spec(self.section()?)
        }

        /// Every document of the index, after a refresh: in one search where the server
        /// allows it (the test server), else in pages of 5,000 sorted by `seq`
        /// (`search_after`), as Elasticsearch and OpenSearch return at most 10,000 hits.
        fn read(&self) -> Result<Vec<Value>, String> {
            self.call("POST", &format!("/{}/_refresh", self.index), None)?;
            let search = |q: Value| -> Result<Option<(u16, Vec<Value>)>, String> {
                let (status, v) =
                    self.call("POST", &format!("/{}/_search", self.index), Some(q))?;
                if status == 404 {
                    return Ok(None);
                }
                Ok(Some((
                    status,
                    v["hits"]["hits"].as_array().cloned().unwrap_or_default(),
                )))
            };
            let all = serde_json::json!({"query": {"match_all": {}}, "size": 100_000});
            match search(all)? {
                None => return Ok(Vec::new()),
                Some((200, hits)) => {
                    return Ok(hits.iter().map(|h| h["_source"].clone()).collect())
                }
                Some(_) => {}
            }
            let mut docs = Vec::new();
            let mut after: Option<Value> = None;
            loop {
                let mut q = serde_json::json!({"query": {"match_all": {}}, "size": 5000, "sort": [{"seq": "asc"}]});
                if let Some(a) = &after {
                    q["search_after"] = a.clone();
                }
                let Some((status, hits)) = search(q)? else {
                    return Ok(docs);
                };
                if status != 200 {
                    return Err(format!("a page of the index answered {status}"));
                }
                docs.extend(hits.iter().map(|h| h["_source"].clone()));
                match hits.last() {
                    Some(last) if hits.len() == 5000 => {
                        if after.as_ref() == Some(&last["sort"]) {
                            return Err("the server ignores search_after".into());
                        }
                        after = Some(last["sort"].clone());
                    }
                    _ => return Ok(docs),
                }
            }
        }
    }
}

/// The Elasticsearch sink against the project's Elasticsearch-API test server.
mod elasticsearch_sink {
    use super::elasticsearch::Context;
    lockgate::sink_conformance!(Context(crate::common::es::Es::testkit()));
}

/// The Elasticsearch sink against osmem-server, an independent OpenSearch-API server.
mod elasticsearch_sink_osmem {
    use super::elasticsearch::Context;
    lockgate::sink_conformance!(Context(crate::common::es::Es::osmem()));
}

mod kafka_sink {
    use super::*;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{ClientConfig, Message, TopicPartitionList};

    /// Each fixture is a topic of 3 partitions in an embedded Kafka, read back with a
    /// plain consumer from the start to the end of every partition.
    pub struct Context(Kafka);

    struct Fixture {
        topic: String,
        bootstrap: String,
    }

    impl SinkTestContext for Context {
        fn program(&self) -> Option<PathBuf> {
            Some(common::bin())
        }

        fn create(&self) -> Result<Box<dyn SinkFixture>, String> {
            Ok(Box::new(Fixture {
                topic: self.0.topic("conformance-out", 3),
                bootstrap: self.0.bootstrap.clone(),
            }))
        }
    }

    impl SinkFixture for Fixture {
        fn section(&self) -> Result<(String, String), String> {
            Ok((
                "kafka".into(),
                format!(
                    "bootstrap_servers = \"{}\"\ntopic = \"{}\"\nkey = \"/key\"",
                    self.bootstrap, self.topic
                ),
            ))
        }

        fn spec(&self) -> Result<SinkSpec, String> {
            sink_spec(self.section()?)
        }

        fn read(&self) -> Result<Vec<Value>, String> {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &self.bootstrap)
                .set("group.id", "conformance-reader")
                .set("enable.auto.commit", "false")
                .create()
                .map_err(|e| e.to_string())?;
            let mut tpl = TopicPartitionList::new();
            let mut total = 0;
            for p in 0..3 {
                let (low, high) = consumer
                    .fetch_watermarks(&self.topic, p, std::time::Duration::from_secs(10))
                    .map_err(|e| e.to_string())?;
                total += high - low;
                tpl.add_partition_offset(&self.topic, p, rdkafka::Offset::Offset(low))
                    .map_err(|e| e.to_string())?;
            }
            consumer.assign(&tpl).map_err(|e| e.to_string())?;
            let mut out = Vec::new();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while (out.len() as i64) < total {
                if std::time::Instant::now() > deadline {
                    return Err(format!("read {} of {total} records", out.len()));
                }
                if let Some(m) = consumer.poll(std::time::Duration::from_millis(100)) {
                    let m = m.map_err(|e| e.to_string())?;
                    let v = serde_json::from_slice(m.payload().unwrap_or_default())
                        .map_err(|e| e.to_string())?;
                    out.push(v);
                }
            }
            Ok(out)
        }
    }

    lockgate::sink_conformance!(Context(Kafka::start()));
}

mod postgres {
    use super::*;
    use lockgate::testkit::postgres::{PgOptions, PgServer};
    use std::sync::Arc;

    /// A PostgreSQL server of the test's own (Debian's binaries, a temporary
    /// directory, a free port); each fixture is a new table in one database, read back
    /// as one JSON object per row. `insert` tables have no unique key, so that a row
    /// written twice shows as two.
    pub struct Context {
        server: Arc<PgServer>,
        /// The sink's settings after `url` and `table`.
        settings: &'static str,
        /// The table's columns.
        columns: &'static str,
    }

    impl Context {
        fn start(settings: &'static str, columns: &'static str) -> Context {
            let server = PgServer::start(PgOptions::default()).expect("a PostgreSQL server");
            server.create_database("conformance").unwrap();
            Context {
                server: Arc::new(server),
                settings,
                columns,
            }
        }

        /// `mode = "insert"`, exactly once by two-phase commit.
        pub fn two_phase() -> Context {
            Context::start(
                "mode = \"insert\"\nexactly_once = \"two-phase\"",
                "seq bigint NOT NULL, key integer NOT NULL, value bigint",
            )
        }

        /// `mode = "upsert"` by `seq`, committed at each barrier.
        pub fn idempotent() -> Context {
            Context::start(
                "mode = \"upsert\"\nkey = [\"seq\"]\nexactly_once = \"idempotent\"",
                "seq bigint PRIMARY KEY, key integer NOT NULL, value bigint",
            )
        }
    }

    struct Fixture {
        server: Arc<PgServer>,
        table: String,
        settings: &'static str,
    }

    impl SinkTestContext for Context {
        fn program(&self) -> Option<PathBuf> {
            Some(common::bin())
        }

        fn create(&self) -> Result<Box<dyn SinkFixture>, String> {
            let table = unique("out").replace('-', "_");
            self.server.query(
                "conformance",
                &format!("CREATE TABLE {table} ({})", self.columns),
            )?;
            Ok(Box::new(Fixture {
                server: self.server.clone(),
                table,
                settings: self.settings,
            }))
        }
    }

    impl SinkFixture for Fixture {
        fn section(&self) -> Result<(String, String), String> {
            Ok((
                "postgres".into(),
                format!(
                    "url = \"{}\"\ntable = \"{}\"\nsslmode = \"disable\"\n{}",
                    self.server.url("conformance"),
                    self.table,
                    self.settings
                ),
            ))
        }

        fn spec(&self) -> Result<SinkSpec, String> {
            sink_spec(self.section()?)
        }

        /// Every committed row; and nothing may be left prepared by a finished run
        /// (a run that ends cleanly commits everything it prepared).
        fn settled(&self) -> Result<(), String> {
            let left = self.server.query(
                "conformance",
                "SELECT gid FROM pg_prepared_xacts ORDER BY gid",
            )?;
            if !left.is_empty() {
                return Err(format!(
                    "a finished run left prepared transactions: {:?}",
                    left.iter().map(|r| &r[0]).collect::<Vec<_>>()
                ));
            }
            Ok(())
        }

        fn read(&self) -> Result<Vec<Value>, String> {
            let rows = self.server.query(
                "conformance",
                &format!(
                    "SELECT json_build_object('seq', seq, 'key', key, 'value', value)::text FROM {}",
                    self.table
                ),
            )?;
            rows.iter()
                .map(|r| serde_json::from_str(&r[0]).map_err(|e| e.to_string()))
                .collect()
        }
    }
}

/// The Postgres sink, exactly once by two-phase commit, inserting.
mod postgres_sink_two_phase {
    use super::postgres::Context;
    use super::{run_case, CommitAtBarrier};
    lockgate::sink_conformance!(Context::two_phase());

    /// The suite catches a two-phase sink that commits its prepared transaction at the
    /// barrier.
    #[test]
    fn the_suite_fails_a_two_phase_sink_that_commits_at_the_barrier() {
        let tmp = tempfile::tempdir().unwrap();
        let e = run_case(
            "visibility_at_checkpoints",
            &CommitAtBarrier(Context::two_phase()),
            tmp.path(),
        )
        .unwrap_err();
        assert!(e.contains("visible before the checkpoint completed"), "{e}");
    }
}

/// The Postgres sink, idempotent upserts committed at each barrier.
mod postgres_sink_idempotent {
    use super::postgres::Context;
    lockgate::sink_conformance!(Context::idempotent());
}
