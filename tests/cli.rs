//! The command line: configuration errors, `checkpoints list` and `inspect`.

mod common;

use common::wait::{self, DEADLINE};
use common::*;
use std::process::Command;

#[test]
fn config_errors_exit_2_and_name_the_file_and_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let j = JobDir::new(tmp.path(), Spec::new(10));
    let text = std::fs::read_to_string(j.config()).unwrap();
    std::fs::write(j.config(), text.replace("interval_ms", "intervall_ms")).unwrap();
    let cfg = j.config().display().to_string();
    let (code, _, err) = lockgate(&["run", "--config", &cfg]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&cfg) && err.contains("checkpoint.intervall_ms"),
        "{err}"
    );

    std::fs::write(
        j.config(),
        text.replace("parallelism = 2", "parallelism = 0"),
    )
    .unwrap();
    let (code, _, err) = lockgate(&["run", "--config", &cfg]);
    assert_eq!(code, Some(2));
    assert!(err.contains("job.parallelism"), "{err}");

    // [restart]: an unknown strategy, and a key of another strategy, name the key.
    for (section, key) in [
        ("strategy = \"sometimes\"", "restart.strategy"),
        (
            "strategy = \"failure-rate\"\nmultiplier = 3.0",
            "restart.multiplier",
        ),
    ] {
        std::fs::write(j.config(), text.replace("strategy = \"none\"", section)).unwrap();
        let (code, _, err) = lockgate(&["run", "--config", &cfg]);
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains(&cfg) && err.contains(key), "{key}: {err}");
    }

    let (code, _, err) = lockgate(&["run", "--config", "/nonexistent/job.toml"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("/nonexistent/job.toml"), "{err}");

    let (code, _, _) = lockgate(&["run"]);
    assert_eq!(code, Some(2), "a usage error exits 2");
}

#[test]
fn librdkafka_properties_are_checked_at_load_exit_2_naming_file_and_key() {
    let tmp = tempfile::tempdir().unwrap();
    // Never contacted: the job file is refused before any client exists.
    let unused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let bootstrap = unused.local_addr().unwrap().to_string();
    let job = tmp.path().join("job.toml");
    let cfg = job.display().to_string();
    for (key, value, says) in [
        ("fetch.max.bytes", "\"lots\"", "lots"),
        ("fetch.max.byte", "\"1048576\"", "not a librdkafka property"),
        ("enable.partition.eof", "\"maybe\"", "maybe"),
        ("acks", "\"1\"", "acks = all"),
    ] {
        std::fs::write(
            &job,
            format!(
                "[job]\nname = \"props\"\n\n[checkpoint]\ndir = \"checkpoints\"\n\n\
                 [source.kafka]\nbootstrap_servers = \"{bootstrap}\"\ntopics = [\"orders\"]\n\n\
                 [source.kafka.properties]\n\"security.protocol\" = \"plaintext\"\n\"{key}\" = {value}\n\n\
                 [sink.file]\ndir = \"out\"\n"
            ),
        )
        .unwrap();
        let (code, _, err) = lockgate(&["run", "--config", &cfg]);
        assert_eq!(code, Some(2), "{key}: {err}");
        let full_key = format!("source.kafka.properties.\"{key}\"");
        assert!(
            err.contains(&cfg) && err.contains(&full_key) && err.contains(says),
            "{key}: {err}"
        );
        assert!(!tmp.path().join("checkpoints").exists(), "the job started");
    }
}

#[test]
fn schema_registry_settings_are_checked_at_load_exit_2_naming_file_and_key() {
    let tmp = tempfile::tempdir().unwrap();
    let job = tmp.path().join("job.toml");
    let cfg = job.display().to_string();
    for (source, key, says) in [
        ("format = \"avro\"", "source.kafka.format", "schema_registry"),
        (
            "format = \"avro\"\n[source.kafka.schema_registry]\nurl = \"registry:8081\"",
            "source.kafka.schema_registry.url",
            "the scheme must be http or https",
        ),
        (
            "format = \"avro\"\n[source.kafka.schema_registry]\nurl = \"http://r\"\npassword_file = \"missing\"\nusername = \"u\"",
            "source.kafka.schema_registry.password_file",
            "missing",
        ),
        (
            "format = \"avro\"\nschema_file = \"order.avsc\"",
            "source.kafka.schema_file",
            "order.avsc",
        ),
        (
            "format = \"parquet\"",
            "source.kafka.format",
            "json, text, bytes, avro, protobuf, json-schema",
        ),
    ] {
        std::fs::write(
            &job,
            format!(
                "[job]\nname = \"formats\"\n\n[checkpoint]\ndir = \"checkpoints\"\n\n\
                 [sink.file]\ndir = \"out\"\n\n\
                 [source.kafka]\nbootstrap_servers = \"127.0.0.1:9\"\ntopics = [\"orders\"]\n{source}\n"
            ),
        )
        .unwrap();
        let (code, _, err) = lockgate(&["run", "--config", &cfg]);
        assert_eq!(code, Some(2), "{key}: {err}");
        assert!(
            err.contains(&cfg) && err.contains(key) && err.contains(says),
            "{key}: {err}"
        );
    }
}

/// The TOML block of the README between `<!-- name -->` and `<!-- /name -->`.
fn readme_block(name: &str) -> String {
    let readme =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
            .unwrap();
    readme
        .split(&format!("<!-- {name} -->"))
        .nth(1)
        .and_then(|b| b.split(&format!("<!-- /{name} -->")).next())
        .and_then(|b| b.trim().strip_prefix("```toml"))
        .and_then(|b| b.strip_suffix("```"))
        .unwrap_or_else(|| panic!("the README's {name} block"))
        .to_string()
}

#[test]
fn the_readmes_schema_registry_and_transforms_examples_load() {
    let tmp = tempfile::tempdir().unwrap();
    let job = tmp.path().join("job.toml");
    std::fs::write(
        &job,
        format!(
            "[job]\nname = \"readme\"\n\n[checkpoint]\ndir = \"checkpoints\"\n\n{}\n",
            // The one thing a reader supplies: the password's variable.
            readme_block("registry-example").replace("${REGISTRY_PASSWORD}", "s3cret")
        ),
    )
    .unwrap();
    lockgate::config::load(&job, &lockgate::builtin::registry())
        .unwrap_or_else(|e| panic!("the registry example: {e}"));
    std::fs::write(
        &job,
        format!(
            "[job]\nname = \"readme\"\n\n[checkpoint]\ndir = \"checkpoints\"\n\n\
             [source.kafka]\nbootstrap_servers = \"127.0.0.1:9\"\ntopics = [\"orders\"]\n\n{}\n\
             [sink.file]\ndir = \"out\"\n",
            [
                readme_block("transforms-example"),
                readme_block("filter-example"),
                readme_block("jq-example"),
                readme_block("debezium-example")
            ]
            .join("\n")
        ),
    )
    .unwrap();
    let graph = lockgate::config::load(&job, &lockgate::builtin::registry())
        .unwrap_or_else(|e| panic!("the transforms example: {e}"));
    drop(graph);
}

#[test]
fn the_readmes_data_stream_and_amazon_opensearch_examples_load() {
    let tmp = tempfile::tempdir().unwrap();
    let job = tmp.path().join("job.toml");
    for name in ["data-stream-example", "aws-opensearch-example"] {
        std::fs::write(
            &job,
            format!(
                "[job]\nname = \"readme\"\n\n[checkpoint]\ndir = \"checkpoints\"\n\n\
                 [source.kafka]\nbootstrap_servers = \"127.0.0.1:9\"\ntopics = [\"orders\"]\n\n{}\n",
                readme_block(name)
            ),
        )
        .unwrap();
        lockgate::config::load(&job, &lockgate::builtin::registry())
            .unwrap_or_else(|e| panic!("the {name}: {e}"));
    }
}

#[test]
fn the_readmes_postgres_example_loads_as_an_exactly_once_upsert() {
    let tmp = tempfile::tempdir().unwrap();
    let secret = tmp.path().join("pg-password");
    std::fs::write(&secret, "s3cret\n").unwrap();
    let job = tmp.path().join("job.toml");
    std::fs::write(
        &job,
        format!(
            "[job]\nname = \"readme\"\n\n[checkpoint]\ndir = \"checkpoints\"\n\n\
             [source.kafka]\nbootstrap_servers = \"127.0.0.1:9\"\ntopics = [\"orders\"]\n\n{}\n",
            readme_block("postgres-example")
                .replace("/run/secrets/pg-password", secret.to_str().unwrap())
        ),
    )
    .unwrap();
    let d = lockgate::config::describe(&job, &lockgate::builtin::registry())
        .unwrap_or_else(|e| panic!("the example: {e}"));
    let pg = d
        .sink_config::<lockgate::connectors::postgres::PgConfig>()
        .expect("a Postgres sink");
    assert_eq!(pg.mode, lockgate::connectors::postgres::Mode::Upsert);
    assert_eq!(
        pg.delivery,
        lockgate::connectors::postgres::Delivery::TwoPhase
    );
    assert_eq!(
        pg.endpoint.password.as_ref().map(|p| p.expose()),
        Some("s3cret")
    );
    assert!(
        !format!("{pg:?}").contains("s3cret"),
        "the password is never printed"
    );
}

#[test]
fn inspect_prints_positions_and_verified_and_names_a_corrupt_file() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = Spec::new(20_000);
    // A run would last 20 s: killed long before its end.
    spec.rate_per_sec = 1_000;
    let j = JobDir::new(tmp.path(), spec);
    let mut child = j.spawn(&[]);
    // Two checkpoints, the newest with keyed state in a file: an SST file, or the copy
    // of the WAL that holds what is not flushed yet (a small state lives there only).
    let holds_state = |f: &lockgate::state::metadata::FileEntry| {
        (f.name.ends_with(".sst") || f.name.ends_with(".log")) && f.size > 0
    };
    wait::while_running(
        &mut child,
        &j.log(),
        "2 checkpoints, the newest with keyed state in a file",
        DEADLINE,
        || {
            let chks = j.checkpoints().exists().then(|| j.complete_checkpoints());
            chks.is_some_and(|c| {
                c.len() >= 2
                    && lockgate::state::CheckpointMetadata::read(c.last().unwrap()).is_ok_and(|m| {
                        m.subtasks
                            .iter()
                            .find(|s| s.state_dir.is_some())
                            .is_some_and(|s| s.files.iter().any(holds_state))
                    })
            })
        },
    );
    assert!(sigkill(&mut child), "the job ended before its kill");
    let chk = j.complete_checkpoints().pop().unwrap();
    let chk_s = chk.display().to_string();

    let (code, out, _) = lockgate(&["checkpoints", "inspect", &chk_s]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("status:      verified"), "{out}");
    assert!(out.contains("source positions"), "{out}");
    let meta = lockgate::state::CheckpointMetadata::read(&chk).unwrap();
    let p = &meta.positions[0];
    let row = out
        .lines()
        .find(|l| {
            l.trim_start().starts_with("sequence")
                && l.split_whitespace().nth(1) == Some(&p.partition.to_string())
        })
        .unwrap();
    assert!(row.contains(&p.next.0.to_string()), "{row}");
    assert!(out.contains("rolling_sum-0-0"), "{out}");

    let (code, out, _) = lockgate(&[
        "checkpoints",
        "list",
        &j.checkpoints().display().to_string(),
    ]);
    assert_eq!(code, Some(0));
    assert!(
        out.contains(chk.file_name().unwrap().to_str().unwrap()) && out.contains("complete"),
        "{out}"
    );

    // Damage one state file: inspect names it and exits 1.
    let state_dir = chk.join(
        meta.subtasks
            .iter()
            .find_map(|s| s.state_dir.clone())
            .unwrap(),
    );
    let file = meta
        .subtasks
        .iter()
        .find(|s| s.state_dir.is_some())
        .unwrap()
        .files
        .iter()
        .find(|f| holds_state(f))
        .unwrap()
        .name
        .clone();
    let path = state_dir.join(&file);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[0] ^= 1;
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, bytes).unwrap();
    let (code, out, _) = lockgate(&["checkpoints", "inspect", &chk_s]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.lines()
            .any(|l| l.contains("CORRUPT") && l.contains(&file)),
        "{out}"
    );
}

/// A checkpoint of a source whose positions are not offsets: `inspect` shows each
/// position (digits as text, other bytes in hex) and `alter` refuses to set an offset
/// of such a split, naming it, before it asks any cluster.
#[test]
fn inspect_shows_opaque_positions_and_alter_refuses_their_splits() {
    use lockgate::state::{
        CheckpointId, CheckpointMetadata, NextOffset, OpaquePosition, SourcePosition,
    };
    let tmp = tempfile::tempdir().unwrap();
    let chk = tmp.path().join("checkpoints").join("chk-0000000003");
    std::fs::create_dir_all(&chk).unwrap();
    let sequence_number = "49590338271490256608559692538361571095921575989136588898";
    let meta = CheckpointMetadata {
        id: CheckpointId(3),
        job_name: "opaque".into(),
        fingerprint: 1,
        created_ms: 1_700_000_000_000,
        parallelism: 1,
        max_parallelism: 128,
        is_final: false,
        subtasks: Vec::new(),
        positions: vec![
            SourcePosition::new("orders", 0, NextOffset(5)),
            SourcePosition::opaque("shards", 0, OpaquePosition::new(sequence_number).unwrap()),
            SourcePosition::opaque(
                "slot",
                1,
                OpaquePosition::new(vec![0, 0, 0, 0x16, 0xb3, 0x74, 0xd8, 0x48]).unwrap(),
            ),
        ],
    };
    std::fs::write(chk.join("_metadata"), meta.encode().unwrap()).unwrap();
    let chk_s = chk.display().to_string();

    let (code, out, err) = lockgate(&["checkpoints", "inspect", &chk_s]);
    assert_eq!(code, Some(0), "{out}{err}");
    let next = |stream: &str| {
        let row = out
            .lines()
            .find(|l| l.trim_start().starts_with(stream))
            .unwrap_or_else(|| panic!("no row of {stream}: {out}"));
        row.split_whitespace().nth(2).unwrap().to_string()
    };
    assert_eq!(next("orders"), "5");
    assert_eq!(next("shards"), sequence_number);
    assert_eq!(next("slot"), "0x00000016b374d848");

    let cfg = tmp.path().join("opaque.toml");
    std::fs::write(
        &cfg,
        format!(
            "[job]\nname = \"opaque\"\n\n[checkpoint]\ndir = {:?}\n\n[source.sequence]\nfrom = 1\nto = 10\n\n[sink.file]\ndir = {:?}\n",
            tmp.path().join("checkpoints"),
            tmp.path().join("out"),
        ),
    )
    .unwrap();
    let altered = tmp.path().join("altered");
    for (set, says) in [
        (
            "shards:0=5",
            "alter sets offsets; split shards:0 has an opaque position",
        ),
        (
            "slot:1=5",
            "alter sets offsets; split slot:1 has an opaque position",
        ),
        // An offset split gets as far as the cluster, which this job has none of.
        ("orders:0=6", "reads no Kafka cluster"),
    ] {
        let (code, out, err) = lockgate(&[
            "checkpoints",
            "alter",
            &chk_s,
            "--set-offset",
            set,
            "--out",
            &altered.display().to_string(),
            "--config",
            &cfg.display().to_string(),
        ]);
        assert_eq!(code, Some(2), "{set}: {out}{err}");
        assert!(err.contains(says), "{set}: {err}");
        assert!(!altered.join("chk-0000000003").exists());
    }
}

#[test]
fn every_example_job_file_is_valid() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/jobs");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            lockgate::config::load(&p, &lockgate::builtin::registry())
                .unwrap_or_else(|e| panic!("{e}"));
            n += 1;
        }
    }
    assert!(n >= 3);
}

/// Runs `lockgate args` with its stdout a pipe whose reading end is closed before the
/// process starts: every write fails as it would after `| head` exited.
fn into_closed_pipe(args: &[&str]) -> (std::process::ExitStatus, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(bin())
        .args(args)
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn output_into_a_closed_pipe_ends_quietly_by_sigpipe() {
    use std::os::unix::process::ExitStatusExt;
    let tmp = tempfile::tempdir().unwrap();
    let j = JobDir::new(tmp.path(), Spec::new(2_000));
    assert!(j.run_to_end(&[]).success(), "{}", j.log_text());
    let chk = j
        .complete_checkpoints()
        .pop()
        .unwrap()
        .display()
        .to_string();
    let dir = j.checkpoints().display().to_string();
    for args in [
        vec!["checkpoints", "inspect", chk.as_str()],
        vec!["checkpoints", "list", dir.as_str()],
        vec!["completions", "bash"],
        vec!["migrate", "kafka-connect", "--table"],
    ] {
        let (status, stderr) = into_closed_pipe(&args);
        // What `cat` does: killed by SIGPIPE (a shell shows 141), nothing on stderr.
        assert_eq!(
            status.signal(),
            Some(libc::SIGPIPE),
            "{args:?}: {status} {stderr}"
        );
        assert!(
            !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn version_names_the_commit_the_features_and_both_c_libraries() {
    let (code, out, _) = lockgate(&["--version"]);
    assert_eq!(code, Some(0));
    let first = out.lines().next().unwrap();
    assert_eq!(first, format!("lockgate {}", env!("CARGO_PKG_VERSION")));
    // Outside a git checkout (a crate download) the commit is unknown, and says so.
    let checkout = std::path::Path::new(".git").is_dir();
    for field in ["commit:", "target:", "features:", "librdkafka:", "RocksDB:"] {
        let line = out
            .lines()
            .find(|l| l.starts_with(field))
            .unwrap_or_else(|| panic!("{field}: {out}"));
        let value = line[field.len()..].trim();
        assert!(!value.is_empty(), "{line}");
        assert!(
            value != "unknown" || (field == "commit:" && !checkout),
            "{line}"
        );
    }
    // The commit is the one this tree was built from, when it is a git checkout.
    let git_head = Command::new("git").args(["rev-parse", "HEAD"]).output();
    if let Some(head) = git_head.ok().filter(|_| checkout) {
        let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
        if head.len() == 40 {
            let commit = out.lines().find(|l| l.starts_with("commit:")).unwrap();
            assert!(
                head.starts_with(commit["commit:".len()..].trim()),
                "{commit} vs {head}"
            );
        }
    }
    // -V stays one line.
    let (_, short, _) = lockgate(&["-V"]);
    assert_eq!(short.trim(), first);
}

#[test]
fn completions_are_printed_for_each_shell_and_name_the_commands() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef lockgate"),
        ("fish", "complete -c lockgate"),
    ] {
        let (code, out, err) = lockgate(&["completions", shell]);
        assert_eq!(code, Some(0), "{shell}: {err}");
        assert!(
            out.contains(marker),
            "{shell}: {}",
            &out[..200.min(out.len())]
        );
        // Options as each shell spells them (`-l set-offset` in fish).
        for sub in ["run", "checkpoints", "alter", "set-offset", "restore"] {
            assert!(out.contains(sub), "{shell} completes {sub}");
        }
    }
    let (code, _, err) = lockgate(&["completions", "tcsh"]);
    assert_eq!(code, Some(2), "{err}");
}

#[test]
fn the_readmes_change_data_capture_example_loads_and_ids_of_coordinates_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let job = tmp.path().join("job.toml");
    let write = |body: &str| {
        std::fs::write(
            &job,
            format!("[job]\nname = \"readme\"\n\n[checkpoint]\ndir = \"checkpoints\"\n\n{body}\n"),
        )
        .unwrap();
    };
    let block = readme_block("postgres-cdc-example");
    write(&block);
    let d = lockgate::config::describe(&job, &lockgate::builtin::registry())
        .unwrap_or_else(|e| panic!("the example: {e}"));
    let cdc = d
        .source_config::<lockgate::connectors::postgres_cdc::CdcConfig>()
        .expect("a change data capture source");
    assert_eq!(cdc.slot, "lockgate_shop");
    assert_eq!(cdc.tables.len(), 2);
    assert!(!cdc.bounded);
    // A snapshot read again is not the same records: documents by coordinates are
    // refused, naming the key.
    write(&block.replace("id = \"field:/id\"", ""));
    let e = lockgate::config::describe(&job, &lockgate::builtin::registry()).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("sink.elasticsearch.id") && text.contains("change events of PostgreSQL"),
        "{text}"
    );
}
