//! `lockgate checkpoints list|inspect`.

use super::{EXIT_FAILURE, EXIT_USAGE};
use lockgate_state::restore::EntryStatus;
use lockgate_state::snapshot_dir;
use lockgate_state::store::{CheckpointLocation, CheckpointStore, StoreLocation};
use lockgate_state::verify::{verify_files, FileProblem};
use lockgate_state::CheckpointMetadata;
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

fn time(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// Prints one line per checkpoint of `dir` (a directory or a store URL), newest last.
pub fn list(dir: &Path) -> i32 {
    match CheckpointLocation::parse(&dir.to_string_lossy()) {
        Ok(CheckpointLocation::Store(s)) => return list_store(&s),
        Ok(CheckpointLocation::Local(_)) => {}
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_USAGE;
        }
    }
    let entries = match snapshot_dir::list(dir) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_USAGE;
        }
    };
    if !dir.is_dir() {
        eprintln!("error: {} is not a directory", dir.display());
        return EXIT_USAGE;
    }
    println!(
        "{:<28} {:>10} {:<12} {:<25} {:>6} {:>10}",
        "CHECKPOINT", "ID", "STATUS", "CREATED", "FINAL", "BYTES"
    );
    for e in entries {
        let path = dir.join(&e.name);
        let (status, created, is_final, bytes) = match e.status {
            EntryStatus::InProgress => (
                "in-progress".to_string(),
                String::new(),
                String::new(),
                String::new(),
            ),
            EntryStatus::MissingMetadata => (
                "incomplete".to_string(),
                String::new(),
                String::new(),
                String::new(),
            ),
            _ => match CheckpointMetadata::read(&path) {
                Ok(m) => {
                    let bytes: u64 = m
                        .subtasks
                        .iter()
                        .flat_map(|s| &s.files)
                        .map(|f| f.size)
                        .sum();
                    (
                        "complete".to_string(),
                        time(m.created_ms),
                        m.is_final.to_string(),
                        bytes.to_string(),
                    )
                }
                Err(_) => (
                    "CORRUPT".to_string(),
                    String::new(),
                    String::new(),
                    String::new(),
                ),
            },
        };
        println!(
            "{:<28} {:>10} {:<12} {:<25} {:>6} {:>10}",
            e.name, e.id.0, status, created, is_final, bytes
        );
    }
    print_member_lines(dir)
}

/// Below the table of a checkpoint directory that members share, one line per
/// member's line with its newest checkpoint (list a line itself for all of its
/// checkpoints).
fn print_member_lines(dir: &Path) -> i32 {
    match crate::checkpoint::lines::scan(dir) {
        Ok(l) => print_lines(&l),
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_FAILURE
        }
    }
}

fn print_lines(lines: &[crate::checkpoint::line_plan::LineState]) -> i32 {
    let members: Vec<_> = lines.iter().filter(|l| l.member.count > 1).collect();
    if members.is_empty() {
        return 0;
    }
    println!();
    println!("{:<28} {:>10} {:>6}", "MEMBER LINE", "NEWEST", "FINAL");
    for l in members {
        let (newest, is_final) = match l.newest_valid {
            Some((id, f)) => (id.0.to_string(), f.to_string()),
            None => ("-".to_string(), "-".to_string()),
        };
        println!(
            "{:<28} {:>10} {:>6}",
            l.member.line().unwrap_or_default(),
            newest,
            is_final
        );
    }
    0
}

/// [`list`] of an object-store prefix: the same columns, from each `_metadata` in the
/// store (state files are verified when a run restores, not here).
fn list_store(location: &StoreLocation) -> i32 {
    let store = match CheckpointStore::new(location) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_USAGE;
        }
    };
    let entries = match super::runtime().block_on(store.list()) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_FAILURE;
        }
    };
    println!(
        "{:<28} {:>10} {:<12} {:<25} {:>6} {:>10}",
        "CHECKPOINT", "ID", "STATUS", "CREATED", "FINAL", "BYTES"
    );
    for (e, meta) in entries {
        let (status, created, is_final, bytes) = match (&e.status, meta) {
            (_, Some(Ok(m))) => (
                if e.status == EntryStatus::Abandoned {
                    "abandoned"
                } else {
                    "complete"
                },
                time(m.created_ms),
                m.is_final.to_string(),
                m.subtasks
                    .iter()
                    .flat_map(|s| &s.files)
                    .map(|f| f.size)
                    .sum::<u64>()
                    .to_string(),
            ),
            (_, Some(Err(_))) => ("CORRUPT", String::new(), String::new(), String::new()),
            (_, None) => ("incomplete", String::new(), String::new(), String::new()),
        };
        println!(
            "{:<28} {:>10} {:<12} {:<25} {:>6} {:>10}",
            e.name, e.id.0, status, created, is_final, bytes
        );
    }
    match super::runtime().block_on(crate::checkpoint::lines::scan_store(location)) {
        Ok(l) => print_lines(&l),
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_FAILURE
        }
    }
}

/// Prints a checkpoint's id, time, job, positions and files, verifying every CRC.
/// Exits 1 when anything fails verification, naming the file.
pub fn inspect(chk: &Path) -> i32 {
    match CheckpointLocation::parse(&chk.to_string_lossy()) {
        Ok(CheckpointLocation::Store(s)) => inspect_store(&s),
        Ok(CheckpointLocation::Local(_)) => inspect_dir(chk, &chk.display().to_string()),
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_USAGE
        }
    }
}

/// [`inspect`] of `s3://bucket/prefix/chk-N`: downloads it into a temporary directory
/// (as a restore would) and inspects that copy.
fn inspect_store(location: &StoreLocation) -> i32 {
    let url = location.to_string();
    let Some(name) = location
        .last_segment()
        .filter(|n| {
            snapshot_dir::parse_name(n)
                .is_some_and(|(_, k)| k == snapshot_dir::NameKind::Checkpoint)
        })
        .map(str::to_string)
    else {
        eprintln!(
            "error: {url} names no checkpoint (write .../chk-N; `checkpoints list` shows them)"
        );
        return EXIT_USAGE;
    };
    let store = match CheckpointStore::new(&location.parent()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_USAGE;
        }
    };
    let tmp = std::env::temp_dir().join(format!("lockgate-inspect-{}", std::process::id()));
    let downloaded = super::runtime().block_on(store.download(&name, &tmp));
    let code = match downloaded {
        Ok(Ok(r)) => inspect_dir(&r.path, &url),
        Ok(Err(why)) => {
            println!("checkpoint:  {url}");
            println!("status:      CORRUPT: {why}");
            EXIT_FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_FAILURE
        }
    };
    let _ = std::fs::remove_dir_all(&tmp);
    code
}

fn inspect_dir(chk: &Path, shown: &str) -> i32 {
    let meta = match CheckpointMetadata::read(chk) {
        Ok(m) => m,
        Err(e) => {
            println!("checkpoint:  {shown}");
            println!("status:      CORRUPT: {e}");
            return EXIT_FAILURE;
        }
    };
    let problems = verify_files(chk, &meta);
    println!("checkpoint:  {shown}");
    println!("id:          {}", meta.id);
    println!("created:     {}", time(meta.created_ms));
    println!(
        "job:         {} (fingerprint {:016x})",
        meta.job_name, meta.fingerprint
    );
    println!(
        "parallelism: {} (max {})",
        meta.parallelism, meta.max_parallelism
    );
    println!("final:       {}", meta.is_final);
    println!();
    println!("source positions (next offset to read):");
    println!(
        "  {:<24} {:>9} {:>14} {:>14}  TOPIC ID",
        "STREAM", "PARTITION", "NEXT", "END"
    );
    for p in &meta.positions {
        // Kafka's spelling of a topic id (as `kafka-topics.sh --describe` shows it).
        let id = p
            .stream_id
            .and_then(crate::connectors::kafka::TopicId::from_bytes)
            .map_or("-".to_string(), |id| id.to_string());
        println!(
            "  {:<24} {:>9} {:>14} {:>14}  {}",
            p.stream,
            p.partition,
            next_shown(p),
            p.end.map_or("-".to_string(), |e| e.0.to_string()),
            id
        );
        // A split read with origin_headers: what it applied of each upstream split.
        for a in &p.applied {
            println!(
                "    applied from {}/{} up to offset {}",
                a.stream, a.partition, a.offset
            );
        }
    }
    println!();
    println!("subtasks:");
    for s in &meta.subtasks {
        let groups = s.key_groups.map_or(String::new(), |g| {
            format!(" key groups {}..={}", g.start, g.end)
        });
        let bytes: u64 = s.files.iter().map(|f| f.size).sum();
        println!(
            "  {}-{}{}: {} files, {} bytes{}",
            s.operator,
            s.subtask,
            groups,
            s.files.len(),
            bytes,
            if s.inline_state.is_empty() {
                String::new()
            } else {
                format!(", {} bytes inline state", s.inline_state.len())
            }
        );
        for f in &s.files {
            let dir = s.state_dir.as_deref().unwrap_or("");
            let rel = format!("{dir}/{}", f.name);
            let bad: Vec<&FileProblem> = problems.iter().filter(|p| p.file == rel).collect();
            println!(
                "    {:<28} {:>12} crc {:08x} {}",
                f.name,
                f.size,
                f.crc32,
                if bad.is_empty() {
                    "ok".to_string()
                } else {
                    format!("CORRUPT: {}", bad[0].problem)
                }
            );
        }
    }
    println!();
    if problems.is_empty() {
        println!("status:      verified");
        0
    } else {
        for p in &problems {
            println!("status:      CORRUPT: {p}");
        }
        EXIT_FAILURE
    }
}

/// The NEXT column of `inspect`: the offset, or an opaque position as its text when
/// every byte is printable ASCII other than a space (a sequence number's digits), else
/// as `0x` and its bytes in hex.
fn next_shown(p: &lockgate_state::SourcePosition) -> String {
    match &p.opaque {
        None => p.next.0.to_string(),
        Some(o) if !o.as_bytes().is_empty() && o.as_bytes().iter().all(u8::is_ascii_graphic) => {
            String::from_utf8_lossy(o.as_bytes()).into_owned()
        }
        Some(o) => std::iter::once("0x".to_string())
            .chain(o.as_bytes().iter().map(|b| format!("{b:02x}")))
            .collect(),
    }
}

/// `checkpoints alter`: writes a copy of `chk` into `out` with the offsets of
/// `set_offset`, each checked against its partition on the cluster of `config`'s
/// source, and prints what each change skips or replays.
pub fn alter(
    registry: &crate::connector::Registry,
    chk: &Path,
    set_offset: &[String],
    out: &Path,
    config: &Path,
) -> i32 {
    use crate::checkpoint::alter::{apply, SetOffset};
    if matches!(
        CheckpointLocation::parse(&chk.to_string_lossy()),
        Ok(CheckpointLocation::Store(_))
    ) {
        eprintln!(
            "error: {}: alter reads a local chk-N directory (copy the checkpoint from the store first)",
            chk.display()
        );
        return EXIT_USAGE;
    }
    let changes: Vec<SetOffset> = match set_offset.iter().map(|s| s.parse()).collect() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: --set-offset {e}");
            return EXIT_USAGE;
        }
    };
    let job = match crate::config::load(config, registry) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_USAGE;
        }
    };
    let mut meta = match lockgate_state::verify::verify_checkpoint(chk) {
        Ok(m) => m,
        Err(why) => {
            eprintln!("error: {}: does not verify: {why}", chk.display());
            return EXIT_FAILURE;
        }
    };
    if meta.job_name != job.name {
        eprintln!(
            "error: {} is a checkpoint of job `{}`, not of `{}` ({})",
            chk.display(),
            meta.job_name,
            job.name,
            config.display()
        );
        return EXIT_USAGE;
    }
    // Before the cluster is asked: an opaque split has no offsets to set.
    if let Err(e) = crate::checkpoint::alter::refuse_opaque(&meta.positions, &changes) {
        eprintln!("error: --set-offset {e}");
        return EXIT_USAGE;
    }
    let Some(cluster) = &job.source_cluster else {
        eprintln!(
            "error: {}: the job's source reads no Kafka cluster; alter sets Kafka offsets",
            config.display()
        );
        return EXIT_USAGE;
    };
    // Only partitions the checkpoint holds are asked for; `apply` names any other.
    let wanted: Vec<(String, i32)> = changes
        .iter()
        .filter(|c| {
            meta.positions
                .iter()
                .any(|p| p.stream == c.topic && p.partition == c.partition)
        })
        .map(|c| (c.topic.clone(), c.partition))
        .collect();
    let ranges = match crate::connectors::kafka::ranges(cluster, &wanted) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_FAILURE;
        }
    };
    let (positions, moved) = match apply(&meta.positions, &changes, &ranges) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: --set-offset {e}");
            return EXIT_USAGE;
        }
    };
    meta.positions = positions;
    meta.created_ms = std::time::SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    match lockgate_state::rewrite::write_copy(chk, &meta, out) {
        Ok(done) => {
            for m in &moved {
                println!("{m}");
            }
            println!("written and verified: {}", done.display());
            println!(
                "start from it: lockgate run --config {} --restore {}",
                config.display(),
                done.display()
            );
            0
        }
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_FAILURE
        }
    }
}
