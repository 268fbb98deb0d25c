//! The file sink writing Parquet into an object store against a plain loop that writes
//! the same rows into the same store, in the same run; printed as JSON.
//!
//! The store is moto's S3 server, one bucket. Both sides write `ROWS` records of the
//! sequence source (`{"seq":i,"key":i % 1000,"value":i}`, `i` from 1) as Parquet of
//! three `long` columns, snappy-compressed, each run under a prefix of its own:
//!
//! - `lockgate`: a real job run in process, `sequence -> file`, parallelism 1,
//!   unpaced, a checkpoint every second, the sink made from its job-file section
//!   (`dir = "s3://..."`, `format = "parquet"`, an Avro `schema_file`, `compression`,
//!   the S3 client settings) as `lockgate run` makes it. Timed from the start of the
//!   run to its end: the final checkpoint's commit makes every record visible. A part
//!   is put under `_staging/` at each barrier, then copied to its final name and the
//!   staged object deleted when the checkpoint completes.
//! - `plain`: a loop that makes the same JSON values, decodes them with Arrow's JSON
//!   decoder (the same Arrow schema, strict as the sink's) into batches of `BATCH`
//!   rows, writes them with Parquet's `ArrowWriter` (snappy) into memory, and puts the
//!   file into the store with one PUT after each batch that ends a second of work
//!   (and after the last one): what the sink does per checkpoint, without staging.
//!
//! Both sides start from the store's location: the plain loop makes its store client
//! on the clock, as the sink makes its own when the job opens it.
//!
//! A second case, `partitioned`, does the same with `partition_by = "key={/key}"` over
//! [`FOLDERS`] keys: the sink finds each record's folder in its value and writes a part
//! per folder at each barrier; the plain loop routes each value to its folder's decoder
//! and writer by the key it made it with (no parsing) and puts a file per folder after
//! each second of work: the same rows into the same number of files.
//!
//! After each run the committed objects are read back with Parquet's reader (what
//! is under `_staging/` and `_rolled-back/` skipped) and must hold `ROWS` rows with
//! every `seq` of `1..=ROWS` among them (so each once), so that a fast wrong run is
//! never reported.
//!
//! Medians of `ROUNDS` rounds whose order alternates; `ratio` = lockgate / plain. The
//! unpartitioned case's figures are the report's top level, the partitioned case's
//! under `partitioned`.
//! Beside them: `cpu_secs`, the CPU time this process spent on each side (median;
//! the store's server not counted: above the wall time, threads ran at once; below,
//! the machine was busy with others); `lockgate_checkpoint_ms`, each checkpoint's
//! duration (trigger to publish) in the job's median round; `plain_stage_secs`, the
//! plain loop's median round split into making the store client, making the values,
//! decoding them, encoding Parquet and the PUTs: what the same work costs by hand.
//!
//! `cargo bench --bench file_sink` (about 40 seconds on 2 cores at the default size);
//! `LOCKGATE_BENCH_ROWS` and `LOCKGATE_BENCH_ROUNDS` size it. It needs a `moto_server`
//! (`LOCKGATE_MOTO_BIN`, or one installed by [`lockgate::testkit::moto::moto_binary`]).

use super::{median, round3};
use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use lockgate::connectors::file_sink::avro_arrow::arrow_schema_of_text;
use lockgate::connectors::file_sink::{FileSection, FileSink};
use lockgate::connectors::sequence::{record_json, SequenceConfig, SequenceSource};
use lockgate::job::{CheckpointSettings, Job, RestartPolicy};
use lockgate::runtime::{run, RunOptions};
use lockgate::state::store::StoreLocation;
use lockgate::testkit::moto::MotoServer;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, PutPayload};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Records each side writes per round, unless `LOCKGATE_BENCH_ROWS` says otherwise.
pub const ROWS: usize = 1_000_000;
/// Rounds of both sides, unless `LOCKGATE_BENCH_ROUNDS` says otherwise.
pub const ROUNDS: usize = 3;
/// Rows per Arrow batch of the plain loop.
const BATCH: usize = 10_000;
/// The sequence's keys (its job-file default).
const KEYS: u32 = 1000;
/// The partitioned case's keys, each a folder.
pub const FOLDERS: u32 = 8;
/// The checkpoint interval of the job, and the plain loop's interval between PUTs.
const INTERVAL: Duration = Duration::from_secs(1);
const BUCKET: &str = "bench";
const SCHEMA: &str = r#"{"type":"record","name":"sequence","fields":[{"name":"seq","type":"long"},{"name":"key","type":"long"},{"name":"value","type":"long"}]}"#;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// CPU seconds this process has used so far (every thread; the store's server, a
/// process of its own, not counted).
fn cpu_secs() -> f64 {
    // SAFETY: zeroed rusage is a valid out-parameter of getrusage(2).
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

/// One case of the bench: every record in one part per checkpoint, or partitioned by
/// key into [`FOLDERS`] folders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Unpartitioned,
    Partitioned,
}

impl Case {
    /// The sequence's keys.
    fn keys(self) -> u32 {
        match self {
            Case::Unpartitioned => KEYS,
            Case::Partitioned => FOLDERS,
        }
    }

    /// The folders a checkpoint's parts go to.
    fn folders(self) -> usize {
        match self {
            Case::Unpartitioned => 1,
            Case::Partitioned => FOLDERS as usize,
        }
    }

    /// The folder of record `i`'s part, by the key the sequence gives it.
    fn folder(self, i: i64) -> usize {
        i.rem_euclid(i64::from(self.keys())) as usize % self.folders()
    }

    /// The key of a part under the prefix: in its folder when partitioned.
    fn part_key(self, prefix: &StorePath, folder: usize, name: &str) -> StorePath {
        match self {
            Case::Unpartitioned => prefix.child(name),
            Case::Partitioned => prefix.child(format!("key={folder}")).child(name),
        }
    }
}

/// The job `sequence -> file` writing `rows` records under `prefix`: its run's
/// duration, the CPU seconds it took, and each checkpoint's duration (trigger to
/// publish, in milliseconds).
fn lockgate_side(
    moto: &MotoServer,
    work: &Path,
    schema_file: &Path,
    prefix: &str,
    rows: usize,
    case: Case,
) -> (Duration, f64, Vec<u64>) {
    let partition = match case {
        Case::Unpartitioned => "",
        Case::Partitioned => "partition_by = \"key={/key}\"\n",
    };
    let section: FileSection = toml::from_str(&format!(
        "dir = \"s3://{BUCKET}/{prefix}\"\nformat = \"parquet\"\nschema_file = {:?}\n\
         compression = \"snappy\"\nendpoint = {:?}\nallow_http = true\n\
         region = \"us-east-1\"\naccess_key_id = \"testing\"\nsecret_access_key = \"testing\"\n\
         {partition}",
        schema_file.display().to_string(),
        moto.endpoint()
    ))
    .expect("the sink's section");
    let cfg = section
        .config(&|p: &Path| work.join(p))
        .expect("the sink's configuration");
    let seq = SequenceConfig {
        from: 1,
        to: rows as i64,
        keys: case.keys(),
        rate_per_sec: 0,
        splits: 128,
    };
    let mut chk = CheckpointSettings::new(work.join(format!("checkpoints-{prefix}")));
    chk.interval_ms = INTERVAL.as_millis() as u64;
    let job = Job::builder("file-sink-bench")
        .parallelism(1)
        .restart(RestartPolicy::None)
        .checkpointing(chk)
        .source_spec(SequenceSource::spec(seq))
        .sink_spec(FileSink::spec(cfg))
        .build()
        .expect("a valid job");
    let rt = runtime();
    let cpu = cpu_secs();
    let start = Instant::now();
    let summary = rt
        .block_on(run(&job, RunOptions::default()))
        .expect("the job runs to its end");
    let took = start.elapsed();
    (took, cpu_secs() - cpu, summary.checkpoint_durations_ms)
}

/// Where the plain loop's time went, in seconds.
#[derive(Default, Clone, Copy)]
struct Stages {
    open: f64,
    make: f64,
    decode: f64,
    encode: f64,
    put: f64,
}

fn parquet_writer(schema: &SchemaRef) -> ArrowWriter<Vec<u8>> {
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .build();
    ArrowWriter::try_new(Vec::new(), schema.clone(), Some(props)).expect("a Parquet writer")
}

/// The plain loop writing `rows` records into `location`, a file per folder of `case`
/// after each second of work; its duration and stages.
async fn plain_side(
    location: &StoreLocation,
    schema: &SchemaRef,
    rows: usize,
    case: Case,
) -> (Duration, Stages) {
    let mut stages = Stages::default();
    let start = Instant::now();
    // Its store client is made on the clock, as the sink makes its own when it opens.
    let (store, prefix) = location.open().expect("the store");
    stages.open = start.elapsed().as_secs_f64();
    let folders = case.folders();
    let mut decoders: Vec<_> = (0..folders)
        .map(|_| {
            arrow_json::ReaderBuilder::new(schema.clone())
                .with_strict_mode(true)
                .with_batch_size(BATCH)
                .build_decoder()
                .expect("a JSON decoder")
        })
        .collect();
    let mut writers: Vec<ArrowWriter<Vec<u8>>> =
        (0..folders).map(|_| parquet_writer(schema)).collect();
    let mut written = vec![false; folders];
    let mut since_put = Instant::now();
    let mut parts = 0u64;
    let mut values: Vec<(usize, Vec<u8>)> = Vec::with_capacity(BATCH);
    let mut batches: Vec<(usize, RecordBatch)> = Vec::with_capacity(folders);
    let mut next = 1i64;
    let last = rows as i64;
    while next <= last {
        let t = Instant::now();
        values.clear();
        while values.len() < BATCH && next <= last {
            values.push((case.folder(next), record_json(next, case.keys())));
            next += 1;
        }
        stages.make += t.elapsed().as_secs_f64();
        let t = Instant::now();
        for (folder, v) in &values {
            let read = decoders[*folder].decode(v).expect("a JSON value");
            assert_eq!(read, v.len(), "one whole value");
        }
        batches.clear();
        for (folder, decoder) in decoders.iter_mut().enumerate() {
            if let Some(batch) = decoder.flush().expect("the batch's rows") {
                batches.push((folder, batch));
            }
        }
        stages.decode += t.elapsed().as_secs_f64();
        let t = Instant::now();
        for (folder, batch) in &batches {
            writers[*folder].write(batch).expect("Parquet write");
            written[*folder] = true;
        }
        stages.encode += t.elapsed().as_secs_f64();
        // A PUT per folder and second of work, checked at the end of a batch, as the
        // sink puts a part per folder and checkpoint; and one for the rows after the last.
        if since_put.elapsed() >= INTERVAL || next > last {
            parts += 1;
            for folder in 0..folders {
                if !written[folder] {
                    continue;
                }
                let t = Instant::now();
                let done = std::mem::replace(&mut writers[folder], parquet_writer(schema));
                let bytes = done.into_inner().expect("the Parquet footer");
                written[folder] = false;
                stages.encode += t.elapsed().as_secs_f64();
                let t = Instant::now();
                let key = case.part_key(&prefix, folder, &format!("part-0-{parts}.parquet"));
                store
                    .put(&key, PutPayload::from(bytes))
                    .await
                    .expect("PUT a part");
                stages.put += t.elapsed().as_secs_f64();
            }
            since_put = Instant::now();
        }
    }
    (start.elapsed(), stages)
}

/// The rows of the committed Parquet objects under `prefix` (those under folders whose
/// names begin with `_`, staged and rolled back, left out), and how many distinct `seq`
/// of `1..=rows` they hold.
async fn committed_rows(
    store: &Arc<dyn ObjectStore>,
    prefix: &StorePath,
    rows: usize,
) -> (usize, usize) {
    use futures::TryStreamExt;
    let objects: Vec<_> = store
        .list(Some(prefix))
        .try_collect()
        .await
        .expect("list the output");
    let mut seen = vec![false; rows + 1];
    let (mut count, mut distinct) = (0usize, 0usize);
    for o in objects {
        let below: Vec<String> = o
            .location
            .prefix_match(prefix)
            .expect("under the prefix")
            .map(|p| p.as_ref().to_string())
            .collect();
        let skipped = below.iter().any(|p| p.starts_with('_'));
        if skipped || !below.last().is_some_and(|n| n.ends_with(".parquet")) {
            continue;
        }
        let bytes = store
            .get(&o.location)
            .await
            .expect("get a part")
            .bytes()
            .await
            .expect("read a part");
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .expect("a Parquet file")
            .build()
            .expect("a Parquet reader");
        for batch in reader {
            let batch = batch.expect("a row group");
            count += batch.num_rows();
            let seq = batch
                .column_by_name("seq")
                .expect("a seq column")
                .as_any()
                .downcast_ref::<arrow_array::Int64Array>()
                .expect("longs");
            for v in seq.iter().flatten() {
                let Ok(i) = usize::try_from(v) else { continue };
                if (1..=rows).contains(&i) && !seen[i] {
                    seen[i] = true;
                    distinct += 1;
                }
            }
        }
    }
    (count, distinct)
}

/// What [`measure_with`] needs for every case: the store, the work directory, the
/// schema (file and Arrow), and a runtime for the plain loop.
struct Bench {
    moto: MotoServer,
    work: tempfile::TempDir,
    schema_file: std::path::PathBuf,
    schema: SchemaRef,
    rt: tokio::runtime::Runtime,
}

impl Bench {
    /// Runs both sides of `case` `rounds` times over `rows` records; the case's report.
    fn case(&self, case: Case, rows: usize, rounds: usize) -> serde_json::Value {
        let mut lockgate_secs = Vec::new();
        let mut plain_secs = Vec::new();
        let mut plain_stages: Vec<(f64, Stages)> = Vec::new();
        let mut checkpoints: Vec<(f64, Vec<u64>)> = Vec::new();
        let mut lockgate_cpu = Vec::new();
        let mut plain_cpu = Vec::new();
        let tag = match case {
            Case::Unpartitioned => "",
            Case::Partitioned => "partitioned-",
        };
        for round in 0..rounds {
            for k in 0..2 {
                let lockgate_turn = (round + k) % 2 == 0;
                let prefix = if lockgate_turn {
                    format!("{tag}run-{round}")
                } else {
                    format!("{tag}plain-{round}")
                };
                let location = self.moto.location(BUCKET, &prefix);
                let took = if lockgate_turn {
                    let (took, cpu, ms) = lockgate_side(
                        &self.moto,
                        self.work.path(),
                        &self.schema_file,
                        &prefix,
                        rows,
                        case,
                    );
                    lockgate_cpu.push(cpu);
                    checkpoints.push((took.as_secs_f64(), ms));
                    lockgate_secs.push(took.as_secs_f64());
                    took
                } else {
                    let cpu = cpu_secs();
                    let (took, stages) =
                        self.rt
                            .block_on(plain_side(&location, &self.schema, rows, case));
                    plain_cpu.push(cpu_secs() - cpu);
                    plain_secs.push(took.as_secs_f64());
                    plain_stages.push((took.as_secs_f64(), stages));
                    took
                };
                let (store, root) = location.open().expect("the store");
                let (count, distinct) = self.rt.block_on(committed_rows(&store, &root, rows));
                assert_eq!((count, distinct), (rows, rows), "{prefix}: every seq once");
                eprintln!(
                    "round {round} {tag}{}: {:.0} rows/s",
                    if lockgate_turn { "lockgate" } else { "plain" },
                    rows as f64 / took.as_secs_f64()
                );
            }
        }
        let lockgate_median = median(lockgate_secs);
        let lockgate = rows as f64 / lockgate_median;
        let checkpoint_ms = checkpoints
            .into_iter()
            .find(|(s, _)| *s == lockgate_median)
            .map(|(_, ms)| ms)
            .unwrap_or_default();
        let plain_median = median(plain_secs);
        let plain = rows as f64 / plain_median;
        let stages = plain_stages
            .iter()
            .find(|(s, _)| *s == plain_median)
            .map(|(_, st)| *st)
            .unwrap_or_default();
        let r2 = |x: f64| (x * 100.0).round() / 100.0;
        json!({
            "rows": rows,
            "rounds": rounds,
            "rows_per_sec": {
                "lockgate": lockgate.round(),
                "plain": plain.round(),
            },
            "ratio": round3(lockgate / plain),
            "cpu_secs": {
                "lockgate": r2(median(lockgate_cpu)),
                "plain": r2(median(plain_cpu)),
            },
            "lockgate_checkpoint_ms": checkpoint_ms,
            "plain_stage_secs": {
                "open": r2(stages.open),
                "make": r2(stages.make),
                "decode": r2(stages.decode),
                "encode": r2(stages.encode),
                "put": r2(stages.put),
            },
        })
    }
}

/// Runs both sides of both cases `rounds` times over `rows` records; the JSON report:
/// the unpartitioned case's figures, the partitioned case's under `partitioned`.
pub fn measure_with(rows: usize, rounds: usize) -> serde_json::Value {
    let started = Instant::now();
    let moto = MotoServer::start().expect("a moto server");
    moto.create_bucket(BUCKET).expect("the bucket");
    let work = tempfile::tempdir().expect("tempdir");
    let schema_file = work.path().join("sequence.avsc");
    std::fs::write(&schema_file, SCHEMA).expect("the schema file");
    let bench = Bench {
        moto,
        work,
        schema_file,
        schema: Arc::new(arrow_schema_of_text(SCHEMA).expect("the Arrow schema")),
        rt: runtime(),
    };
    let mut report = bench.case(Case::Unpartitioned, rows, rounds);
    let mut partitioned = bench.case(Case::Partitioned, rows, rounds);
    partitioned["folders"] = json!(FOLDERS);
    report["partitioned"] = partitioned;
    report["bench_seconds"] = json!(started.elapsed().as_secs());
    report
}

/// [`measure_with`] at the default size, or as `LOCKGATE_BENCH_ROWS` and
/// `LOCKGATE_BENCH_ROUNDS` say.
pub fn measure() -> String {
    measure_with(
        super::env_or("LOCKGATE_BENCH_ROWS", ROWS),
        super::env_or("LOCKGATE_BENCH_ROUNDS", ROUNDS),
    )
    .to_string()
}
