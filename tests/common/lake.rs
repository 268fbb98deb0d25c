//! The independent readers of Parquet output: pyarrow (`tests/lake/read_parquet.py`)
//! in a virtual environment with `tests/lake/requirements.txt`.

use lockgate::testkit::moto::MotoServer;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The Python of the environment with pyarrow: `LOCKGATE_LAKE_PYTHON`, or a virtual
/// environment created once under the target directory from the pinned requirements.
pub fn python() -> PathBuf {
    super::venv_python(
        "LOCKGATE_LAKE_PYTHON",
        "lake-venv",
        "tests/lake/requirements.txt",
        "pyarrow",
    )
}

fn reader(dir: &Path, flag: Option<&str>, env: &[(&str, String)]) -> Result<Vec<Value>, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/lake/read_parquet.py");
    let mut cmd = Command::new(python());
    cmd.arg(script).arg(dir);
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    cmd.args(flag);
    let out = cmd.output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "pyarrow could not read {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).map_err(|e| format!("{l:?}: {e}")))
        .collect()
}

/// Every row of the committed Parquet part files under `dir`, read by pyarrow, as
/// `{"file": name, "row": {...}}` (decimals as exact text, times in ISO 8601).
pub fn rows(dir: &Path) -> Result<Vec<Value>, String> {
    reader(dir, None, &[])
}

/// [`rows`] of the prefix `url` (`s3://bucket/prefix`) of an object store, which the
/// environment `env` reaches (`AWS_ENDPOINT_URL`, credentials, region).
pub fn store_rows(url: &str, env: &[(&str, String)]) -> Result<Vec<Value>, String> {
    reader(Path::new(url), None, env)
}

/// The rows of `dir` (a directory, or `s3://bucket/prefix` that `env` reaches) read
/// by pyarrow as one dataset with Hive partitioning: `{"row": {...}}`, each with its
/// partition columns from the folders' names.
pub fn hive_rows(dir: &str, env: &[(&str, String)]) -> Result<Vec<Value>, String> {
    reader(Path::new(dir), Some("--hive"), env)
}

/// The Arrow schema and compression of each committed Parquet part file under `dir`,
/// as pyarrow reads them: `{"file": name, "schema": [...], "compression": codec}`.
pub fn schemas(dir: &Path) -> Result<Vec<Value>, String> {
    reader(dir, Some("--schema"), &[])
}

/// The Avro schema of the sequence source's records (`seq`, `key`, `value`: longs).
pub const SEQUENCE_SCHEMA: &str = r#"{"type":"record","name":"s","fields":[{"name":"seq","type":"long"},{"name":"key","type":"long"},{"name":"value","type":"long"}]}"#;

/// The `(source, sink)` sections of a `sequence -> [sink.file]` job writing Parquet
/// into `url` on `moto`.
pub fn store_job_sections(
    moto: &MotoServer,
    url: &str,
    schema: &std::path::Path,
    to: i64,
    rate: u64,
) -> ((String, String), (String, String)) {
    (
        (
            "sequence".into(),
            format!("from = 1\nto = {to}\nkeys = 10\nrate_per_sec = {rate}"),
        ),
        (
            "file".into(),
            format!(
                "dir = {url:?}\nformat = \"parquet\"\nschema_file = {:?}\nendpoint = {:?}\nallow_http = true\nregion = \"us-east-1\"\naccess_key_id = \"testing\"\nsecret_access_key = \"testing\"",
                schema.display().to_string(),
                moto.endpoint()
            ),
        ),
    )
}

/// Each `seq` read back from `url` by pyarrow, with how many times.
pub fn store_counts(moto: &MotoServer, url: &str) -> BTreeMap<i64, u32> {
    let mut seen = BTreeMap::new();
    for r in store_rows(url, &moto.env()).unwrap() {
        *seen.entry(r["row"]["seq"].as_i64().unwrap()).or_insert(0) += 1;
    }
    seen
}

/// The objects under `prefix` of bucket `lake`, by key below it.
pub fn store_objects(moto: &MotoServer, prefix: &str) -> Vec<String> {
    store_objects_with_etags(moto, prefix)
        .into_iter()
        .map(|(k, _)| k)
        .collect()
}

/// [`store_objects`] with each object's ETag (for an object put whole, the MD5 of its
/// bytes; a copy keeps it).
pub fn store_objects_with_etags(moto: &MotoServer, prefix: &str) -> Vec<(String, String)> {
    let (store, root) = moto.location("lake", prefix).open().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use futures::TryStreamExt;
        let all: Vec<_> = store.list(Some(&root)).try_collect().await.unwrap();
        let mut keys: Vec<(String, String)> = all
            .into_iter()
            .map(|m| {
                (
                    m.location.as_ref()[root.as_ref().len() + 1..].to_string(),
                    m.e_tag.unwrap_or_default(),
                )
            })
            .collect();
        keys.sort();
        keys
    })
}

/// The multipart uploads begun and neither completed nor aborted in `bucket` on `moto`,
/// by key: ListMultipartUploads (`GET /<bucket>?uploads`), unsigned, which moto
/// answers like any request. An upload left there holds stored parts that no object
/// shows, billed until someone aborts it.
pub fn multipart_uploads(moto: &MotoServer, bucket: &str) -> Vec<String> {
    let r = reqwest::blocking::get(format!("{}/{bucket}?uploads", moto.endpoint())).unwrap();
    assert!(
        r.status().is_success(),
        "ListMultipartUploads: {}",
        r.status()
    );
    let xml = r.text().unwrap();
    assert!(
        xml.contains("<ListMultipartUploadsResult") && xml.contains("<IsTruncated>false<"),
        "a whole ListMultipartUploads answer: {xml}"
    );
    xml.split("<Upload>")
        .skip(1)
        .map(|upload| {
            let key = upload.split_once("<Key>").map_or("", |(_, rest)| rest);
            key.split_once("</Key>").map_or(key, |(k, _)| k).to_string()
        })
        .collect()
}

/// Begins a multipart upload of `key` in `bucket` on `moto` and leaves it open
/// (CreateMultipartUpload, unsigned): what a writer killed mid-upload leaves.
pub fn begin_multipart_upload(moto: &MotoServer, bucket: &str, key: &str) {
    let r = reqwest::blocking::Client::new()
        .post(format!("{}/{bucket}/{key}?uploads", moto.endpoint()))
        .send()
        .unwrap();
    assert!(
        r.status().is_success(),
        "CreateMultipartUpload: {}",
        r.status()
    );
}

/// What pyiceberg reads of an Iceberg table through its SQL catalog
/// (`tests/lake/read_iceberg.py`): the table's snapshots, oldest first, and the rows
/// of its current snapshot. A table that does not exist reads as none of either.
pub struct IcebergTable {
    /// `{"id", "parent", "operation", "summary", "added": [paths]}` per snapshot.
    pub snapshots: Vec<Value>,
    /// The current snapshot's id.
    pub current: Option<i64>,
    pub rows: Vec<Value>,
}

/// Reads `table` (`namespace.table`) of the SQL catalog `name` at `uri` (SQLAlchemy's
/// form) with `warehouse`, in the environment `env` (an object store's settings).
pub fn iceberg_table(
    uri: &str,
    warehouse: &str,
    name: &str,
    table: &str,
    env: &[(&str, String)],
) -> Result<IcebergTable, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/lake/read_iceberg.py");
    let out = Command::new(python())
        .arg(script)
        .args([uri, warehouse, name, table])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "pyiceberg could not read {table}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    parse_iceberg(String::from_utf8_lossy(&out.stdout).lines())
}

fn parse_iceberg<'a>(lines: impl Iterator<Item = &'a str>) -> Result<IcebergTable, String> {
    let mut t = IcebergTable {
        snapshots: Vec::new(),
        current: None,
        rows: Vec::new(),
    };
    for line in lines {
        let mut v: Value = serde_json::from_str(line).map_err(|e| format!("{line:?}: {e}"))?;
        if let Some(s) = v.get_mut("snapshot") {
            t.snapshots.push(s.take());
        } else if let Some(c) = v.get("current") {
            t.current = c.as_i64();
        } else if let Some(r) = v.get_mut("row") {
            t.rows.push(r.take());
        } else if let Some(e) = v.get("error") {
            return Err(format!("pyiceberg: {e}"));
        }
    }
    Ok(t)
}

/// One pyiceberg process that reads a table as often as asked (`--serve`): for the
/// reads made while a job runs, each of which would otherwise wait a second for
/// pyiceberg's import.
pub struct IcebergReader {
    child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
}

impl IcebergReader {
    pub fn start(env: &[(&str, String)]) -> Result<IcebergReader, String> {
        use std::process::Stdio;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/lake/read_iceberg.py");
        let mut child = Command::new(python())
            .arg(script)
            .arg("--serve")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let out = std::io::BufReader::new(child.stdout.take().expect("piped"));
        Ok(IcebergReader { child, out })
    }

    /// [`iceberg_table`] through this process.
    pub fn read(
        &mut self,
        uri: &str,
        warehouse: &str,
        name: &str,
        table: &str,
    ) -> Result<IcebergTable, String> {
        use std::io::{BufRead, Write};
        let stdin = self.child.stdin.as_mut().expect("piped");
        writeln!(stdin, "{uri} {warehouse} {name} {table}").map_err(|e| e.to_string())?;
        stdin.flush().map_err(|e| e.to_string())?;
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            if self.out.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
                return Err("the pyiceberg reader ended".into());
            }
            if line.trim() == r#"{"end": true}"# {
                break;
            }
            lines.push(line);
        }
        parse_iceberg(lines.iter().map(|l| l.trim_end()))
    }
}

impl Drop for IcebergReader {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl IcebergTable {
    /// The snapshots on the current snapshot's line of ancestors, newest first (those
    /// a rollback took off the line are not).
    pub fn line(&self) -> Vec<&Value> {
        let by_id: BTreeMap<i64, &Value> = self
            .snapshots
            .iter()
            .filter_map(|s| s["id"].as_i64().map(|id| (id, s)))
            .collect();
        let mut out = Vec::new();
        let mut at = self.current;
        while let Some(s) = at.and_then(|id| by_id.get(&id)) {
            out.push(*s);
            at = s["parent"].as_i64();
        }
        out
    }
}

/// On the table's current line: no checkpoint of a job in two snapshots, and no data
/// file added by two.
pub fn one_snapshot_per_checkpoint(t: &IcebergTable) -> Result<(), String> {
    let mut checkpoints = std::collections::BTreeSet::new();
    let mut files = std::collections::BTreeSet::new();
    for s in t.line() {
        let key = (
            s["summary"]["lockgate.job"].to_string(),
            s["summary"]["lockgate.checkpoint"].to_string(),
        );
        if !checkpoints.insert(key.clone()) {
            return Err(format!("two snapshots for one checkpoint {key:?}"));
        }
        for f in s["added"].as_array().into_iter().flatten() {
            if !files.insert(f.to_string()) {
                return Err(format!("{f} is added by two snapshots"));
            }
        }
    }
    Ok(())
}

/// Appends `row` (a JSON object) to `table` through pyiceberg, as another writer of
/// the table would: a snapshot of its own.
pub fn iceberg_append(
    uri: &str,
    warehouse: &str,
    name: &str,
    table: &str,
    row: &Value,
) -> Result<(), String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/lake/read_iceberg.py");
    let out = Command::new(python())
        .arg(script)
        .arg("--append")
        .args([uri, warehouse, name, table, &row.to_string()])
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "pyiceberg could not append to {table}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}
