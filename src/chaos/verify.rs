//! Verifies an Elasticsearch index against the Kafka topics a job read: every input
//! record present exactly once with the right content (`id = "coordinates"`), or every
//! key's document carrying the sum of its inputs (ids by key or field, rolling_sum).
//!
//! With `on_item_error = "dead-letter:<topic>"`, the inputs Elasticsearch refused are
//! those the dead-letter topic names (deduplicated on their origin: the topic is
//! at-least-once). A refused input must be in no document, every other input must be
//! written, a document by key or field must carry the total of its last input that was
//! not refused, and every letter must name an input: a write lost between the two
//! (say, one dropped because a refused one replaced it) shows as wrong.

use super::es_http::EsHttp;
use super::target::{EsTarget, Output, Target};
use crate::connectors::elasticsearch::IdStrategy;
use crate::record::set_pointer;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use reqwest::Method;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One input record.
#[derive(Debug, Clone)]
pub struct Input {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Value,
    /// The record's headers (the last value of each name), as text.
    pub headers: BTreeMap<String, String>,
    /// The payload as read, until [`read_inputs`] decodes it into `value`; then the
    /// value's JSON text as the job's transforms read it, until it transforms it.
    raw: Option<Vec<u8>>,
    /// The record's timestamp, in milliseconds since the epoch.
    pub timestamp: Option<i64>,
    /// The record has no value (a Kafka tombstone).
    pub tombstone: bool,
    /// What the record asks of the sink, after the job's transforms.
    pub op: crate::record::Op,
    /// Which output of its record this is, when the job's transforms make several
    /// (see [`crate::record::Record::output`]).
    pub output: u32,
}

/// What verification found: the verdict every exactly-once check of lockgate gives.
pub use crate::testkit::verdict::Verdict;
use crate::testkit::verdict::{compare, Expect};

/// A record's origin: topic, partition, offset.
pub type Coordinates = (String, i32, i64);

/// What the sink is expected to have received.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// The records after the job's transforms.
    pub records: Vec<Input>,
    /// The origins of the records the transforms dead-letter (`on_error`): expected
    /// nowhere but in a dead-letter topic.
    pub lettered: std::collections::BTreeSet<Coordinates>,
}

/// Reads every record of the selected topics, from the beginning to the current end.
pub fn read_inputs(t: &Target) -> Result<Inputs, String> {
    let mut inputs = read_topics(t, &|name| t.selects(name))?;
    decode(t, &mut inputs)?;
    transform(&t.transforms, inputs)
}

/// Applies the job's transforms to the decoded inputs, as the job does (the job's own
/// chain, [`crate::transforms::run_chain`], on the value's text as the job reads it):
/// what the sink received is what is compared. An input the transforms drop (a
/// filter, a jq program without output, a record `on_error` skips or dead-letters) is
/// expected nowhere; one they make several of is expected as each, numbered as the job
/// numbers them.
fn transform(chain: &crate::transforms::Chain, mut inputs: Vec<Input>) -> Result<Inputs, String> {
    use crate::dead_letter::OnError;
    use crate::transforms::{run_chain, Values};
    if chain.is_empty() {
        for input in &mut inputs {
            input.raw = None;
        }
        return Ok(Inputs {
            records: inputs,
            ..Inputs::default()
        });
    }
    let mut lettered = std::collections::BTreeSet::new();
    let mut expanded = Vec::with_capacity(inputs.len());
    let mut outs = Vec::with_capacity(1);
    for mut input in inputs {
        let headers: crate::record::Headers = input
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), Some(bytes::Bytes::from(v.clone().into_bytes()))))
            .collect();
        let text = match input.raw.take() {
            Some(text) => text,
            None => serde_json::to_vec(&input.value).map_err(|e| e.to_string())?,
        };
        let record = crate::record::Record {
            key: input.key.take().map(bytes::Bytes::from),
            tombstone: input.tombstone,
            origin: Some(crate::record::Origin {
                stream: input.topic.as_str().into(),
                partition: input.partition,
                offset: input.offset,
            }),
            timestamp: input.timestamp,
            headers: Some(std::sync::Arc::new(headers)),
            ..crate::record::Record::from_value(if input.tombstone { Vec::new() } else { text })
        };
        outs.clear();
        // Unchecked: the values parsed in full, not split as the job splits them.
        if let Err(failed) = run_chain(chain, Values::Unchecked, record, &mut outs) {
            let (e, _) = *failed;
            match chain[e.step].1.on_error() {
                OnError::Fail => {
                    return Err(format!(
                        "input {}/{}@{}: {} (the job would have failed on it)",
                        input.topic, input.partition, input.offset, e.message
                    ))
                }
                OnError::Skip => continue,
                OnError::DeadLetter(_) => {
                    lettered.insert((input.topic.clone(), input.partition, input.offset));
                    continue;
                }
            }
        }
        for out in outs.drain(..) {
            let value = if out.tombstone {
                Value::Null
            } else {
                serde_json::from_slice(&out.value).map_err(|e| {
                    format!(
                        "input {}/{}@{}: the transforms wrote a value that is not JSON: {e}",
                        input.topic, input.partition, input.offset
                    )
                })?
            };
            expanded.push(Input {
                value,
                key: out.key.map(|k| k.to_vec()),
                tombstone: out.tombstone,
                op: out.op,
                output: out.output,
                ..input.clone()
            });
        }
    }
    Ok(Inputs {
        records: expanded,
        lettered,
    })
}

/// Decodes the inputs' values and keys as the job does (`format`, `key_format`): a
/// value that does not decode is `null`, as one that is not JSON. The job's own decode
/// policy decides what becomes of those; the verifier compares what was indexed.
fn decode(t: &Target, inputs: &mut [Input]) -> Result<(), String> {
    use crate::formats::{key_text, Decoded, Failure, Output, Reader};
    // Its own thread and runtime: the decoders may ask the Schema Registry, and the
    // caller may run on a runtime already.
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                let mut values = Reader::new(t.format.clone());
                let mut keys = t.key_format.clone().map(Reader::new);
                for input in inputs.iter_mut() {
                    // A registry that does not answer makes the verdict unknown, not
                    // a record that cannot be decoded.
                    let away = |why: String| format!("decoding the inputs: {why}");
                    if let Some(raw) = input.raw.take() {
                        // The text the job's transforms read: the payload, or what
                        // its format decoded it into.
                        let text = match rt.block_on(values.decode(&raw)) {
                            Ok(Decoded::Unchanged) => Some(raw),
                            Ok(Decoded::Replaced(v)) => Some(v),
                            Err(Failure::Registry(why)) => return Err(away(why)),
                            Err(Failure::Record { .. }) => None,
                        };
                        let value = text.as_deref().and_then(|t| serde_json::from_slice(t).ok());
                        match value {
                            Some(v) => {
                                input.value = v;
                                input.raw = text;
                            }
                            None => input.value = Value::Null,
                        }
                    }
                    if let (Some(keys), Some(k)) = (keys.as_mut(), input.key.as_ref()) {
                        let json = t
                            .key_format
                            .as_ref()
                            .is_some_and(|f| f.output() == Output::Json);
                        match rt.block_on(keys.decode(k)) {
                            Ok(Decoded::Replaced(v)) => input.key = Some(key_text(v)),
                            Ok(Decoded::Unchanged) if json => input.key = Some(key_text(k.clone())),
                            Err(Failure::Registry(why)) => return Err(away(why)),
                            _ => {}
                        }
                    }
                }
                Ok(())
            })
            .join()
            .map_err(|_| "the input decoder panicked".to_string())?
    })
}

/// The origins (topic, partition, offset) of the dead letters in `topic`, each once.
pub fn dead_lettered(
    t: &Target,
    topic: &str,
) -> Result<std::collections::BTreeSet<(String, i32, i64)>, String> {
    let mut out = std::collections::BTreeSet::new();
    for l in read_topics(t, &|name| name == topic)? {
        let origin = (
            l.headers.get("lockgate.topic").cloned(),
            l.headers
                .get("lockgate.partition")
                .and_then(|p| p.parse().ok()),
            l.headers
                .get("lockgate.offset")
                .and_then(|o| o.parse().ok()),
        );
        match origin {
            (Some(t), Some(p), Some(o)) => {
                out.insert((t, p, o));
            }
            _ => {
                return Err(format!(
                    "a dead letter in {topic} ({}/{}) carries no origin headers",
                    l.partition, l.offset
                ))
            }
        }
    }
    Ok(out)
}

fn read_topics(t: &Target, selects: &dyn Fn(&str) -> bool) -> Result<Vec<Input>, String> {
    let mut config = ClientConfig::new();
    // The job's properties first (security, connection), the verifier's own after.
    crate::clients::kafka::apply(
        &mut config,
        &t.kafka_properties,
        crate::clients::kafka::ClientRole::Consumer,
    );
    let c: BaseConsumer = config
        .set("bootstrap.servers", &t.bootstrap_servers)
        .set("group.id", "lockgate-chaos-verifier")
        .set("enable.auto.commit", "false")
        .set("fetch.queue.backoff.ms", "10")
        .create()
        .map_err(|e| e.to_string())?;
    let md = c
        .fetch_metadata(None, Duration::from_secs(10))
        .map_err(|e| format!("metadata: {e}"))?;
    let mut tpl = TopicPartitionList::new();
    let mut ends: HashMap<(String, i32), i64> = HashMap::new();
    for topic in md.topics().iter().filter(|x| selects(x.name())) {
        for p in topic.partitions() {
            let (low, high) = c
                .fetch_watermarks(topic.name(), p.id(), Duration::from_secs(10))
                .map_err(|e| format!("watermarks {}/{}: {e}", topic.name(), p.id()))?;
            if high > low {
                tpl.add_partition_offset(topic.name(), p.id(), Offset::Offset(low))
                    .map_err(|e| e.to_string())?;
                ends.insert((topic.name().to_string(), p.id()), high);
            }
        }
    }
    c.assign(&tpl).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut done: HashMap<(String, i32), bool> = ends.keys().map(|k| (k.clone(), false)).collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    while done.values().any(|d| !d) {
        if Instant::now() > deadline {
            return Err("timed out reading the input topics".into());
        }
        let Some(m) = c.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = m.map_err(|e| format!("reading inputs: {e}"))?;
        let k = (m.topic().to_string(), m.partition());
        let end = ends[&k];
        if m.offset() >= end {
            continue;
        }
        let value = Value::Null;
        let mut headers = BTreeMap::new();
        if let Some(h) = m.headers() {
            use rdkafka::message::Headers;
            for h in h.iter() {
                headers.insert(
                    h.key.to_string(),
                    String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                );
            }
        }
        out.push(Input {
            topic: k.0.clone(),
            partition: k.1,
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            value,
            headers,
            raw: m.payload().map(<[u8]>::to_vec),
            timestamp: m.timestamp().to_millis(),
            tombstone: m.payload().is_none(),
            op: crate::record::Op::Upsert,
            output: 0,
        });
        if m.offset() + 1 >= end {
            done.insert(k, true);
        }
    }
    Ok(out)
}

/// A client with the job's own connection settings.
fn http(t: &EsTarget) -> Result<EsHttp, String> {
    EsHttp::new(&t.es, Duration::from_secs(60))
}

/// `_count` of the index after a refresh.
fn count(t: &EsTarget) -> Result<u64, String> {
    let c = http(t)?;
    let r = c
        .request(Method::POST, &format!("/{}/_refresh", t.index))
        .send()
        .map_err(|e| format!("refresh: {e}"))?;
    if !r.status().is_success() {
        return Err(format!("refresh of {} answered {}", t.index, r.status()));
    }
    let v: Value = c
        .request(Method::GET, &format!("/{}/_count", t.index))
        .send()
        .and_then(|r| r.json().map_err(|e| e.to_string()))
        .map_err(|e| format!("count: {e}"))?;
    v["count"].as_u64().ok_or_else(|| format!("count: {v}"))
}

/// Documents by id (those found): id -> source.
fn mget(t: &EsTarget, ids: &[String]) -> Result<HashMap<String, Value>, String> {
    let c = http(t)?;
    let mut out = HashMap::new();
    if t.data_stream.is_some() {
        // A data stream answers no get by id: its documents are searched for, after a
        // refresh (a search, unlike a get, sees only refreshed documents).
        let r = c
            .request(Method::POST, &format!("/{}/_refresh", t.index))
            .send()
            .map_err(|e| format!("refresh: {e}"))?;
        if !r.status().is_success() {
            return Err(format!("refresh of {} answered {}", t.index, r.status()));
        }
        for chunk in ids.chunks(2000) {
            let v: Value = c
                .request(Method::POST, &format!("/{}/_search", t.index))
                .json(&json!({"size": chunk.len(), "query": {"ids": {"values": chunk}}}))
                .send()
                .and_then(|r| r.json().map_err(|e| e.to_string()))
                .map_err(|e| format!("search: {e}"))?;
            let hits = v
                .pointer("/hits/hits")
                .and_then(Value::as_array)
                .ok_or_else(|| format!("search: {v}"))?;
            for h in hits {
                out.insert(
                    h["_id"].as_str().unwrap_or_default().to_string(),
                    h["_source"].clone(),
                );
            }
        }
        return Ok(out);
    }
    for chunk in ids.chunks(2000) {
        let v: Value = c
            .request(Method::POST, &format!("/{}/_mget", t.index))
            .json(&json!({ "ids": chunk }))
            .send()
            .and_then(|r| r.json().map_err(|e| e.to_string()))
            .map_err(|e| format!("mget: {e}"))?;
        for d in v["docs"].as_array().ok_or_else(|| format!("mget: {v}"))? {
            if d["found"] == json!(true) {
                out.insert(
                    d["_id"].as_str().unwrap_or_default().to_string(),
                    d["_source"].clone(),
                );
            }
        }
    }
    Ok(out)
}

/// Sets the `@timestamp` the sink gives a data stream document (see
/// [`crate::connectors::elasticsearch::with_timestamp`]).
fn set_timestamp(
    doc: &mut Value,
    ts: &crate::connectors::elasticsearch::TimestampSource,
    record_timestamp: Option<i64>,
) {
    let bytes = serde_json::to_vec(doc).expect("JSON");
    if let Ok(with) = crate::connectors::elasticsearch::with_timestamp(&bytes, ts, record_timestamp)
    {
        *doc = serde_json::from_slice(&with).expect("JSON");
    }
}

fn as_i64(v: Option<&Value>) -> Option<i64> {
    v.and_then(Value::as_i64)
}

/// Verifies what the job wrote into an index, files or a topic against the inputs;
/// a Postgres table is verified by [`super::pg_verify`].
pub fn verify(t: &Target, inputs: &Inputs) -> Result<Verdict, String> {
    match &t.output {
        Output::Elasticsearch(e) => verify_index(t, e, inputs),
        Output::Files(dir) => verify_files(t, dir, &inputs.records),
        Output::Topic(topic) => Err(format!(
            "a repartition stage's topic `{topic}` is verified through the job that reads it (lockgate chaos --config <that job> --upstream <this job>)"
        )),
        Output::Postgres(_) => Err("a Postgres table is verified by pg_verify".into()),
    }
}

/// Running sums in partition order, per input (`None` for a key read from several
/// partitions: only its final sum is deterministic), and every key's final sum.
fn expected_totals(t: &Target, inputs: &[Input]) -> (Vec<Option<i64>>, BTreeMap<String, i64>) {
    let mut expected_total: Vec<Option<i64>> = vec![None; inputs.len()];
    let mut final_totals: BTreeMap<String, i64> = BTreeMap::new();
    if let Some((key_ptr, field_ptr, _)) = &t.rolling_sum {
        let mut order: Vec<usize> = (0..inputs.len()).collect();
        order.sort_by(|&a, &b| {
            let (x, y) = (&inputs[a], &inputs[b]);
            (&x.topic, x.partition, x.offset).cmp(&(&y.topic, y.partition, y.offset))
        });
        let mut partitions_of: HashMap<String, std::collections::HashSet<(String, i32)>> =
            HashMap::new();
        let mut running: HashMap<String, i64> = HashMap::new();
        for &i in &order {
            let r = &inputs[i];
            let key = key_of(&r.value, key_ptr);
            let n = as_i64(r.value.pointer(field_ptr)).unwrap_or(0);
            let sum = running.entry(key.clone()).or_insert(0);
            *sum += n;
            expected_total[i] = Some(*sum);
            partitions_of
                .entry(key)
                .or_default()
                .insert((r.topic.clone(), r.partition));
        }
        for (i, r) in inputs.iter().enumerate() {
            let key = key_of(&r.value, key_ptr);
            if partitions_of[&key].len() > 1 {
                expected_total[i] = None;
            }
        }
        final_totals = running.into_iter().collect();
    }
    (expected_total, final_totals)
}

/// Keys read from several partitions have no fixed per-record totals, but the largest
/// total written for each must be the sum of all its inputs.
fn check_largest(
    largest: BTreeMap<String, i64>,
    final_totals: &BTreeMap<String, i64>,
    verdict: &mut Verdict,
) {
    for (key, got) in largest {
        if final_totals.get(&key) != Some(&got) {
            verdict.wrong += 1;
            verdict.note(format!(
                "key {key}: largest total {got}, expected {:?}",
                final_totals.get(&key)
            ));
        }
    }
}

/// The id a record writes or deletes under `id`: a key's text, or a field of the value
/// (of a JSON key, for a delete without a value), as the sink reads it.
fn document_id_of(id: &IdStrategy, r: &Input) -> Option<String> {
    let text = |v: &Value| {
        v.as_str()
            .map(String::from)
            .unwrap_or_else(|| v.to_string())
    };
    match id {
        IdStrategy::Key => r
            .key
            .as_ref()
            .map(|k| String::from_utf8_lossy(k).into_owned()),
        IdStrategy::Field(p) if r.tombstone => r
            .key
            .as_ref()
            .and_then(|k| serde_json::from_slice::<Value>(k).ok())
            .and_then(|k| k.pointer(p).map(text)),
        IdStrategy::Field(p) => r.value.pointer(p).map(text),
        IdStrategy::Coordinates => None,
    }
}

/// Ids by key or field without a rolling sum: each document is the last write of its
/// id in partition order (absent when that is a delete, or when every write of it was
/// dead-lettered), as a table's change stream leaves its rows. An id written from
/// several partitions has no order between them: its document must be the last write
/// of one of them.
fn verify_latest(
    e: &EsTarget,
    inputs: &[Input],
    refused: &[bool],
    verdict: &mut Verdict,
) -> Result<(), String> {
    let mut order: Vec<usize> = (0..inputs.len()).collect();
    order.sort_by_key(|&i| {
        let r = &inputs[i];
        (&r.topic, r.partition, r.offset, r.output)
    });
    // Each id's last write per partition that was not refused (`None`: every write of
    // it there was).
    let mut last_of_id: BTreeMap<String, BTreeMap<(String, i32), Option<usize>>> = BTreeMap::new();
    for &i in &order {
        let r = &inputs[i];
        let split = (r.topic.clone(), r.partition);
        // A record the sink refused (no id, say) is in the dead letters, and no write.
        if refused[i] {
            if let Some(id) = document_id_of(&e.id, r) {
                last_of_id
                    .entry(id)
                    .or_default()
                    .entry(split)
                    .or_insert(None);
            }
            continue;
        }
        // A tombstone the sink does not delete with writes nothing.
        if r.tombstone && r.op != crate::record::Op::Delete && !e.tombstones_delete {
            continue;
        }
        let id = document_id_of(&e.id, r).ok_or_else(|| {
            format!(
                "input {}/{}@{} has no document id: the job would not have written it",
                r.topic, r.partition, r.offset
            )
        })?;
        last_of_id.entry(id).or_default().insert(split, Some(i));
    }
    let ids: Vec<String> = last_of_id.keys().cloned().collect();
    let docs = mget(e, &ids)?;
    for (id, splits) in &last_of_id {
        // What each partition's last write leaves: a document, or none.
        let candidates: Vec<Option<&Value>> = splits
            .values()
            .map(|last| {
                last.filter(|&i| inputs[i].op != crate::record::Op::Delete && !inputs[i].tombstone)
                    .map(|i| &inputs[i].value)
            })
            .collect();
        let got = docs.get(id);
        if candidates.iter().any(Option::is_some) {
            verdict.expected_documents += 1;
        }
        if candidates.contains(&got) {
            continue;
        }
        match got {
            None => {
                verdict.missing += 1;
                verdict.note(format!("missing document {id}"));
            }
            Some(doc) => {
                verdict.wrong += 1;
                let want: Vec<String> = candidates
                    .iter()
                    .map(|c| c.map_or("no document".to_string(), |v| v.to_string()))
                    .collect();
                verdict.note(format!(
                    "{id}: indexed {doc}, expected {}",
                    want.join(" or ")
                ));
            }
        }
    }
    Ok(())
}

/// The key of an input under the rolling sum's key pointer.
fn key_of(value: &Value, key_ptr: &str) -> String {
    value
        .pointer(key_ptr)
        .map(crate::record::key_text)
        .unwrap_or_default()
}

/// Verifies the file sink's committed output: every input record (with its running
/// total) in exactly one committed line, and nothing else. Lines are matched to inputs
/// by their content without the total, so inputs must differ in content.
fn verify_files(t: &Target, dir: &Path, inputs: &[Input]) -> Result<Verdict, String> {
    let (expected_total, final_totals) = expected_totals(t, inputs);
    let out_ptr = t.rolling_sum.as_ref().map(|(_, _, o)| o.as_str());
    let identity = |v: &Value| -> String {
        let mut v = v.clone();
        if let Some(p) = out_ptr {
            if let Some((parent, last)) = p.rsplit_once('/') {
                if let Some(Value::Object(m)) = v.pointer_mut(parent) {
                    m.remove(&last.replace("~1", "/").replace("~0", "~"));
                }
            }
        }
        v.to_string()
    };
    let mut wanted: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, r) in inputs.iter().enumerate() {
        wanted.entry(identity(&r.value)).or_default().push(i);
    }
    let mut lines: HashMap<String, Vec<Value>> = HashMap::new();
    let mut unreadable = Vec::new();
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("part-"))
        })
        .collect();
    names.sort();
    for path in names {
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        for line in text.lines() {
            match serde_json::from_str::<Value>(line) {
                Ok(v) => lines.entry(identity(&v)).or_default().push(v),
                Err(e) => unreadable.push(format!("{}: not JSON ({e}): {line}", path.display())),
            }
        }
    }
    let found = lines
        .iter()
        .flat_map(|(id, got)| got.iter().map(move |_| (id.clone(), None)));
    let mut verdict = compare(
        inputs.iter().map(|r| identity(&r.value)),
        found,
        Expect::Exact,
    );
    for what in unreadable {
        verdict.documents += 1;
        verdict.wrong += 1;
        verdict.note(what);
    }
    let mut largest: BTreeMap<String, i64> = BTreeMap::new();
    for (id, want) in &wanted {
        let got = lines.remove(id).unwrap_or_default();
        let (Some((key_ptr, _, out)), Some(line)) = (&t.rolling_sum, got.first()) else {
            continue;
        };
        let total = as_i64(line.pointer(out));
        match expected_total[want[0]] {
            Some(e) if total != Some(e) => {
                verdict.wrong += 1;
                verdict.note(format!("{id}: total {total:?}, expected {e}"));
            }
            Some(_) => {}
            None => {
                let e = largest
                    .entry(key_of(&inputs[want[0]].value, key_ptr))
                    .or_insert(i64::MIN);
                *e = (*e).max(total.unwrap_or(i64::MIN));
            }
        }
    }
    check_largest(largest, &final_totals, &mut verdict);
    Ok(verdict)
}

/// Verifies the index against the inputs.
fn verify_index(t: &Target, e: &EsTarget, all: &Inputs) -> Result<Verdict, String> {
    let inputs = &all.records[..];
    let mut verdict = Verdict {
        inputs: inputs.len() as u64,
        ..Default::default()
    };
    let (expected_total, final_totals) = expected_totals(t, inputs);
    let refused = refused_inputs(t, e, all, &mut verdict)?;
    let totals = (&expected_total[..], &final_totals);
    match &e.id {
        IdStrategy::Coordinates => {
            verify_by_coordinates(t, e, inputs, &refused, totals, &mut verdict)?;
        }
        IdStrategy::Key | IdStrategy::Field(_) if t.rolling_sum.is_none() => {
            verify_latest(e, inputs, &refused, &mut verdict)?;
        }
        IdStrategy::Key | IdStrategy::Field(_) => {
            verify_totals_by_id(t, e, inputs, &refused, totals, &mut verdict)?;
        }
    }
    verdict.documents = count(e)?;
    verdict.duplicated = verdict
        .documents
        .saturating_sub(verdict.expected_documents - verdict.missing);
    Ok(verdict)
}

/// Which inputs the sink refused (dead-lettered), in input order; a dead letter that
/// names no input is wrong.
fn refused_inputs(
    t: &Target,
    e: &EsTarget,
    all: &Inputs,
    verdict: &mut Verdict,
) -> Result<Vec<bool>, String> {
    let inputs = &all.records[..];
    let letters = match &e.dead_letters {
        Some(topic) => dead_lettered(t, topic)?,
        None => Default::default(),
    };
    let coordinates = |r: &Input| (r.topic.clone(), r.partition, r.offset);
    {
        let read: std::collections::HashSet<_> = inputs.iter().map(coordinates).collect();
        // A transform's letter may share the sink's topic.
        let foreign = |l: &&Coordinates| !read.contains(*l) && !all.lettered.contains(*l);
        for l in letters.iter().filter(foreign) {
            verdict.wrong += 1;
            verdict.note(format!(
                "a dead letter names {}/{}@{}, not an input",
                l.0, l.1, l.2
            ));
        }
    }
    let refused: Vec<bool> = inputs
        .iter()
        .map(|r| letters.contains(&coordinates(r)))
        .collect();
    verdict.dead_lettered = refused.iter().filter(|r| **r).count() as u64;
    Ok(refused)
}

/// Documents with an id of coordinates: one per input not refused, equal to it (its
/// running total as expected, where a rolling sum has one).
fn verify_by_coordinates(
    t: &Target,
    e: &EsTarget,
    inputs: &[Input],
    refused: &[bool],
    (expected_total, final_totals): (&[Option<i64>], &BTreeMap<String, i64>),
    verdict: &mut Verdict,
) -> Result<(), String> {
    let ids: Vec<String> = inputs
        .iter()
        .map(|r| match r.output {
            0 => format!("{}-{}-{}", r.topic, r.partition, r.offset),
            n => format!("{}-{}-{}-{n}", r.topic, r.partition, r.offset),
        })
        .collect();
    let docs = mget(e, &ids)?;
    verdict.expected_documents = ids.len() as u64 - verdict.dead_lettered;
    for (i, (id, r)) in ids.iter().zip(inputs).enumerate() {
        if refused[i] {
            if docs.contains_key(id) {
                verdict.wrong += 1;
                verdict.note(format!("{id}: dead-lettered, and indexed too"));
            }
            continue;
        }
        let Some(doc) = docs.get(id) else {
            verdict.missing += 1;
            verdict.note(format!("missing {id}"));
            continue;
        };
        let mut want = r.value.clone();
        if let Some(ts) = &e.data_stream {
            set_timestamp(&mut want, ts, r.timestamp);
        }
        if let Some((_, _, out)) = &t.rolling_sum {
            match expected_total[i] {
                Some(total) => {
                    set_pointer(&mut want, out, json!(total));
                }
                None => {
                    if let Some(got) = doc.pointer(out) {
                        set_pointer(&mut want, out, got.clone());
                    }
                }
            }
        }
        if *doc != want {
            verdict.wrong += 1;
            verdict.note(format!("{id}: indexed {doc}, expected {want}"));
        }
    }
    // Keys read from several partitions have no fixed per-record totals, but their
    // largest total must be the sum of all their inputs.
    if let Some((key_ptr, _, out)) = &t.rolling_sum {
        let mut largest: BTreeMap<String, i64> = BTreeMap::new();
        for (i, (id, r)) in ids.iter().zip(inputs).enumerate() {
            if expected_total[i].is_some() {
                continue;
            }
            let key = key_of(&r.value, key_ptr);
            if let Some(total) = docs.get(id).and_then(|d| as_i64(d.pointer(out))) {
                let e = largest.entry(key).or_insert(i64::MIN);
                *e = (*e).max(total);
            }
        }
        check_largest(largest, final_totals, verdict);
    }
    Ok(())
}

/// Documents with an id of the key or a field, written by a rolling sum: one per id
/// with an input not refused, showing the total of its last such input.
fn verify_totals_by_id(
    t: &Target,
    e: &EsTarget,
    inputs: &[Input],
    refused: &[bool],
    (expected_total, final_totals): (&[Option<i64>], &BTreeMap<String, i64>),
    verdict: &mut Verdict,
) -> Result<(), String> {
    let Some((key_ptr, _, out)) = &t.rolling_sum else {
        unreachable!("without a rolling_sum: verify_latest");
    };
    let (last_of_id, some_refused) = last_input_of_each_id(&e.id, inputs, refused);
    let ids: Vec<String> = last_of_id.keys().cloned().collect();
    let docs = mget(e, &ids)?;
    for (id, last) in &last_of_id {
        let Some(i) = *last else {
            if docs.contains_key(id) {
                verdict.wrong += 1;
                verdict.note(format!(
                    "document {id}: every input was dead-lettered, yet it exists"
                ));
            }
            continue;
        };
        verdict.expected_documents += 1;
        let Some(doc) = docs.get(id) else {
            verdict.missing += 1;
            verdict.note(format!("missing document {id}"));
            continue;
        };
        // A key read from several partitions has no order between them: its final sum
        // is what stays deterministic, and with refused inputs not even that (the last
        // one processed may be refused): presence only.
        if expected_total[i].is_none() && some_refused.contains(id) {
            continue;
        }
        let want = expected_total[i].or_else(|| {
            final_totals
                .get(&key_of(&inputs[i].value, key_ptr))
                .copied()
        });
        let got = as_i64(doc.pointer(out));
        if got != want {
            verdict.wrong += 1;
            verdict.note(format!("{id}: total {got:?}, expected {want:?}"));
        }
    }
    Ok(())
}

/// Each document id's last input in partition order that was not refused: the write
/// it must show (none: all refused, no document); and the ids with a refused input.
#[allow(clippy::type_complexity)]
fn last_input_of_each_id(
    id: &IdStrategy,
    inputs: &[Input],
    refused: &[bool],
) -> (
    BTreeMap<String, Option<usize>>,
    std::collections::HashSet<String>,
) {
    let id_of = |r: &Input| -> Option<String> {
        match id {
            IdStrategy::Key => r
                .key
                .as_ref()
                .map(|k| String::from_utf8_lossy(k).into_owned()),
            IdStrategy::Field(p) => r.value.pointer(p).map(|v| {
                v.as_str()
                    .map(String::from)
                    .unwrap_or_else(|| v.to_string())
            }),
            IdStrategy::Coordinates => None,
        }
    };
    let mut order: Vec<usize> = (0..inputs.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&inputs[a], &inputs[b]);
        (&x.topic, x.partition, x.offset).cmp(&(&y.topic, y.partition, y.offset))
    });
    let mut last_of_id: BTreeMap<String, Option<usize>> = BTreeMap::new();
    let mut some_refused: std::collections::HashSet<String> = Default::default();
    for &i in &order {
        if let Some(id) = id_of(&inputs[i]) {
            if refused[i] {
                some_refused.insert(id.clone());
            }
            let last = last_of_id.entry(id).or_insert(None);
            if !refused[i] {
                *last = Some(i);
            }
        }
    }
    (last_of_id, some_refused)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transforms::{transform_all, Smt};
    use std::sync::Arc;

    use crate::transforms::built as smt;

    fn input(text: &str) -> Input {
        Input {
            topic: "orders".into(),
            partition: 1,
            offset: 5,
            key: Some(b"k".to_vec()),
            value: serde_json::from_str(text).unwrap(),
            headers: BTreeMap::from([("h".to_string(), "v".to_string())]),
            raw: Some(text.as_bytes().to_vec()),
            timestamp: Some(1_700_000_000_000),
            tombstone: false,
            op: crate::record::Op::Upsert,
            output: 0,
        }
    }

    #[test]
    fn each_ids_last_input_not_refused_is_what_its_document_shows() {
        let at = |partition: i32, offset: i64, key: &str| Input {
            partition,
            offset,
            key: Some(key.as_bytes().to_vec()),
            ..input(r#"{"n":1}"#)
        };
        // Out of partition order on purpose.
        let inputs = [at(1, 7, "a"), at(1, 3, "a"), at(0, 9, "b"), at(2, 1, "c")];
        let refused = [true, false, false, true];
        let (last, some_refused) = last_input_of_each_id(&IdStrategy::Key, &inputs, &refused);
        assert_eq!(
            last,
            BTreeMap::from([
                ("a".to_string(), Some(1)),
                ("b".to_string(), Some(2)),
                ("c".to_string(), None),
            ])
        );
        assert_eq!(
            some_refused,
            ["a".to_string(), "c".to_string()].into_iter().collect()
        );
    }

    /// The verifier expects of each input exactly what the job's chain writes for it:
    /// jq sees an object's fields in the order the record has them, and a cast to a
    /// string keeps a number's text.
    #[test]
    fn the_verifier_expects_what_the_jobs_chain_writes() {
        use crate::transforms::fields::{Cast, InsertField};
        use crate::transforms::jq::JqConfig;
        type Case<'c> = (Vec<(String, Arc<dyn Smt>)>, &'c str, Vec<Value>);
        let cases: Vec<Case> = vec![
            (
                vec![("jq".into(), smt::<JqConfig>("filter = \"first(.[])\""))],
                r#"{"b":{"z":1},"a":2}"#,
                vec![json!({"z": 1})],
            ),
            (
                vec![(
                    "jq".into(),
                    smt::<JqConfig>("filter = \".[]\"\nmax_outputs = 10"),
                )],
                r#"{"b":"first","a":"second"}"#,
                vec![json!("first"), json!("second")],
            ),
            (
                vec![
                    (
                        "insert_field".into(),
                        smt::<InsertField>("static = { c = 3 }"),
                    ),
                    (
                        "jq".into(),
                        smt::<JqConfig>("filter = \"[keys_unsorted[]]\""),
                    ),
                ],
                r#"{"b":1,"a":2}"#,
                vec![json!(["b", "a", "c"])],
            ),
            (
                vec![("cast".into(), smt::<Cast>("spec = { a = \"string\" }"))],
                r#"{"a":1E+2}"#,
                vec![json!({"a": "1E+2"})],
            ),
        ];
        for (chain, text, want) in cases {
            let got = transform(&chain, vec![input(text)]).unwrap();
            let values: Vec<Value> = got.records.iter().map(|r| r.value.clone()).collect();
            assert_eq!(values, want, "{text}");
            // Numbered as the job numbers them, each value as the job writes it.
            let mut job = Vec::new();
            let mut record = crate::record::Record::from_value(text.as_bytes().to_vec());
            record.origin = Some(crate::record::Origin {
                stream: "orders".into(),
                partition: 1,
                offset: 5,
            });
            transform_all(&chain, record, &mut job).unwrap();
            assert_eq!(got.records.len(), job.len());
            for (r, j) in got.records.iter().zip(&job) {
                assert_eq!(r.output, j.output);
                assert_eq!(r.value, serde_json::from_slice::<Value>(&j.value).unwrap());
                assert_eq!(r.key.as_deref(), Some(&b"k"[..]));
            }
        }
    }
}
