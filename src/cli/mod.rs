//! The command line (stable: scripts and tests depend on it).
//!
//! Exit codes: 0 done, 1 job failure, 2 usage or configuration error.

mod about;
mod chaos;
mod checkpoints;
mod demo;
mod docs;
mod heap_trim;
mod migrate;
mod run;
mod testkit;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::path::PathBuf;

/// Exit code of a usage or configuration error.
pub const EXIT_USAGE: i32 = 2;
/// Exit code of a job failure.
pub const EXIT_FAILURE: i32 = 1;

#[derive(Debug, Parser)]
#[command(
    name = "lockgate",
    version,
    about = "Exactly-once connector jobs with barrier checkpoints in RocksDB"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a job; restarting after a crash is running the same command again.
    ///
    /// The job resumes from the newest checkpoint of its checkpoint directory that
    /// verifies (a corrupt one is named and skipped; if checkpoints exist but none
    /// verifies, the run refuses to start empty). SIGTERM or Ctrl-C completes a final
    /// checkpoint and exits 0. Exit codes: 0 done, 1 job failure, 2 configuration error
    /// (the message names the file and the key).
    Run {
        /// The TOML job file.
        #[arg(long)]
        config: PathBuf,
        /// Restore from this chk-N directory (or the newest valid checkpoint of a checkpoint directory); also a store URL (s3://bucket/prefix/chk-N, or s3://bucket/prefix for its newest).
        #[arg(long)]
        restore: Option<PathBuf>,
        /// Accept a checkpoint of another job graph, restoring the state that matches.
        #[arg(long)]
        allow_non_restored_state: bool,
        /// Run a job file that lists steps it does not do (`[job] left_out`, written
        /// by `lockgate migrate ... --allow-left-out`); without it such a file is
        /// refused (exit 2).
        #[arg(long)]
        allow_left_out: bool,
        /// Run as member I (from 0) of --members N: this process reads its share of the
        /// partitions and keeps its own checkpoint line, `member-I-of-N/` below the
        /// checkpoint directory.
        #[arg(long, requires = "members", conflicts_with = "member_from_hostname")]
        member: Option<u16>,
        /// How many members run the job (each a `lockgate run` with the same job file).
        #[arg(long)]
        members: Option<u16>,
        /// Take I of --member from the host name (a StatefulSet pod is NAME-I).
        #[arg(long, requires = "members")]
        member_from_hostname: bool,
        /// The job ran as K members, each stopped with SIGTERM (a final checkpoint):
        /// take this member's share of the partitions and state of all of them.
        #[arg(long, value_name = "K")]
        rescale_from: Option<u16>,
    },
    /// List a checkpoint directory, or inspect and verify one checkpoint.
    ///
    /// Reading only: nothing is changed, and a checkpoint that fails verification is
    /// reported with the reason, as `lockgate run` would skip it.
    #[command(subcommand)]
    Checkpoints(CheckpointsCommand),
    /// Translate another tool's configuration into a job file.
    #[command(subcommand)]
    Migrate(MigrateCommand),
    /// Run a job under SIGKILLs and failpoints, then verify its output exactly.
    ///
    /// The job (Kafka -> Elasticsearch, bounded) runs as a child process, is killed at
    /// seeded moments (the same seed replays the same schedule) and restarted with the
    /// same command until it finishes; then every input record is checked against the
    /// index. Exits 0 only when nothing is missing, duplicated or wrong.
    Chaos {
        /// The job file (a Kafka -> Elasticsearch job).
        #[arg(long, required_unless_present = "list_failpoints")]
        config: Option<PathBuf>,
        /// How many SIGKILLs.
        #[arg(long, default_value_t = 10)]
        kills: u32,
        /// Seed of the kill schedule (the same seed replays the same schedule).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// LOCKGATE_FAILPOINTS for every run, e.g. "before-metadata=10%exit".
        #[arg(long)]
        failpoints: Option<String>,
        /// Apply --failpoints to the first N runs only.
        #[arg(long)]
        failpoint_runs: Option<u32>,
        /// Write the report as JSON here.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Corrupt the newest checkpoint once two exist (and check the next run reports it
        /// and restores the one before).
        #[arg(long)]
        corrupt_latest: bool,
        /// Cycle Elasticsearch faults (429 storms, 5xx, latency, dropped responses) on the
        /// lockgate test server while the job runs.
        #[arg(long)]
        es_faults: bool,
        /// Kill each run between MIN and MAX milliseconds after its start.
        #[arg(long, default_value = "300..1500")]
        kill_after_ms: String,
        /// List the failpoints and exit.
        #[arg(long)]
        list_failpoints: bool,
        /// Run the job as N members (`lockgate run --member I --members N`), each killed
        /// --kills times on its own seeded schedule; verified together at the end.
        #[arg(long, default_value_t = 1)]
        members: u16,
        /// A repartition stage (a job file with [sink.kafka]) that writes the topic the
        /// job reads: it runs first, killed the same way, until it finishes; the job's
        /// output is then verified against the repartition stage's input.
        #[arg(long)]
        upstream: Option<PathBuf>,
    },
    /// Print the completion script of a shell (bash, zsh, fish, elvish, powershell).
    ///
    /// bash: `lockgate completions bash > /etc/bash_completion.d/lockgate`; zsh: into a
    /// directory of `$fpath` as `_lockgate`; fish: `~/.config/fish/completions/lockgate.fish`.
    /// The Debian package installs all three.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Write a man page per command into a directory (lockgate.1, lockgate-run.1, ...).
    Manpages {
        /// The directory (created if missing).
        dir: PathBuf,
    },
    /// Embedded Kafka and Elasticsearch test servers for tests, demos and examples.
    #[command(subcommand)]
    Testkit(TestkitCommand),
    /// Run the demonstration job on embedded servers: crash it, resume it, verify it.
    ///
    /// Starts an embedded Kafka and the Elasticsearch test server, runs
    /// Kafka -> rolling_sum -> Elasticsearch, kills it twice with SIGKILL, restarts it,
    /// and checks every user's total. Needs nothing installed; exits 0 only when the
    /// result is exact.
    Demo {
        /// Where to keep the demo's files (default: a new directory under the system temp dir).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum MigrateCommand {
    /// Translate a Kafka Connect Elasticsearch sink's configuration into a job file.
    ///
    /// Reads the REST API's `{"name", "config"}` (`GET /connectors/NAME`), a bare config
    /// object, or a `.properties` file; writes the job file (stdout, or --out) with a
    /// comment above each key naming the setting it came from. Every setting without an
    /// equivalent is listed on stderr with the reason. When a left-out setting changes
    /// what the job reads or writes (a transform, a converter, a setting of what is
    /// written, the Kafka cluster), no job file is written unless --allow-left-out is
    /// given; then the file marks each such step `# LEFT OUT:` where it belongs and
    /// lists them as `[job] left_out`, which `lockgate run` refuses without its own
    /// --allow-left-out. Exit codes: 0 everything translated, 3 something left out
    /// (with or without a file), 2 an unreadable or foreign configuration (or a
    /// --check that fails).
    KafkaConnect {
        /// The connector configuration (JSON or .properties).
        #[arg(required_unless_present = "table")]
        file: Option<PathBuf>,
        /// Write the job file here instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Load the job file through lockgate's loader (unset ${VARS} take placeholders).
        #[arg(long)]
        check: bool,
        /// The Kafka cluster (a Connect worker setting, absent from the connector's);
        /// without it the cluster is reported as left out.
        #[arg(long)]
        bootstrap_servers: Option<String>,
        /// Write the job file even when steps that change records are left out (each
        /// is marked in the file, which `lockgate run` then refuses without its own
        /// --allow-left-out).
        #[arg(long)]
        allow_left_out: bool,
        /// The job's checkpoint directory (default /var/lib/lockgate/NAME).
        #[arg(long)]
        checkpoint_dir: Option<String>,
        /// Print the mapping table (Markdown) and exit.
        #[arg(long)]
        table: bool,
    },
}

#[derive(Debug, Subcommand)]
enum TestkitCommand {
    /// An in-memory Elasticsearch-compatible server with fault injection.
    ///
    /// Bulk (index, create, update, delete, external versions), get, mget, count,
    /// search; faults through POST /_lockgate/faults, counters at GET /_lockgate/stats.
    /// Keeps nothing across restarts.
    Es {
        /// The address to listen on (port 0: any free port, printed at start).
        #[arg(long, default_value = "127.0.0.1:9200")]
        listen: std::net::SocketAddr,
        /// Serve HTTPS with a certificate generated at start (for localhost and
        /// 127.0.0.1); its CA is written to --cert-out (or a temporary file), whose path
        /// is printed on the second line of stdout. Give it to a job as `ca_cert`.
        #[arg(long)]
        tls: bool,
        /// Where --tls writes the CA certificate (PEM).
        #[arg(long, requires = "tls")]
        cert_out: Option<PathBuf>,
        /// Require HTTP basic authentication with USER:PASS on every request (401 otherwise).
        #[arg(long, value_name = "USER:PASS")]
        basic_auth: Vec<String>,
        /// Require the API key ID:KEY (`Authorization: ApiKey base64(ID:KEY)`) on every
        /// request (401 otherwise). With --basic-auth, either is accepted.
        #[arg(long, value_name = "ID:KEY")]
        api_key: Vec<String>,
    },
    /// An in-memory Schema Registry (the Confluent REST subset serializers use).
    ///
    /// Registers and serves Avro, Protobuf and JSON Schema schemas by subject and id;
    /// prints its URL. Keeps nothing across restarts.
    SchemaRegistry {
        /// The address to listen on (port 0: any free port, printed at start).
        #[arg(long, default_value = "127.0.0.1:8081")]
        listen: std::net::SocketAddr,
        /// A file the registrations are kept in (as a registry keeps them in its
        /// `_schemas` topic): a restart on the same file serves the same schemas under
        /// the same ids. Without it nothing is kept across restarts.
        #[arg(long)]
        state: Option<std::path::PathBuf>,
    },
    /// A PostgreSQL server for trying the Postgres sink, serving until killed.
    ///
    /// Runs Debian's `postgresql` binaries (initdb, postgres) in a temporary directory:
    /// superuser `lockgate` without a password, listening on 127.0.0.1 only, with
    /// prepared transactions and logical decoding (`wal_level = logical`) enabled.
    /// Prints its URL; keeps nothing once stopped.
    Postgres {
        /// The port to listen on (0: any free port).
        #[arg(long, default_value_t = 5432)]
        port: u16,
        /// The database to create, named in the printed URL.
        #[arg(long, default_value = "app")]
        database: String,
        /// SQL to run in the database at start (CREATE TABLE ...), repeatable.
        #[arg(long)]
        sql: Vec<String>,
    },
    /// An embedded Kafka (librdkafka's mock cluster) serving until killed.
    ///
    /// Prints its bootstrap servers; takes control lines on stdin (topic, down, up,
    /// errors, topic-error). In memory only: about 100k messages or 5 MiB per partition.
    Kafka {
        /// How many brokers.
        #[arg(long, default_value_t = 3)]
        brokers: i32,
        /// NAME:PARTITIONS, repeatable.
        #[arg(long = "topic")]
        topics: Vec<String>,
        /// Where to write the bootstrap servers list.
        #[arg(long)]
        bootstrap_file: Option<PathBuf>,
        /// Also serve the cluster at 127.0.0.1:PORT (a fixed bootstrap address for job
        /// files; 0 picks a free port).
        #[arg(long)]
        port: Option<u16>,
        /// TOPIC:COUNT, repeatable: produce COUNT sample orders
        /// ({"order","user","amount"}, keyed by user) into TOPIC at start.
        #[arg(long = "orders")]
        orders: Vec<String>,
        /// Key the sample orders by their order number instead of their user, so that
        /// a user's orders are in every partition (for a repartition stage).
        #[arg(long)]
        orders_keyed_by_order: bool,
        /// Write the sample orders as Confluent-framed Avro (key a string, value an
        /// Order record with a decimal amount), their schemas registered at this
        /// Schema Registry (`lockgate testkit schema-registry`).
        #[arg(long, value_name = "URL")]
        orders_avro_registry: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum CheckpointsCommand {
    /// One line per checkpoint of a checkpoint directory or object-store prefix, newest last.
    List {
        /// The job's checkpoint directory (`checkpoint.dir`), or its store URL
        /// (`s3://bucket/prefix`; endpoint and credentials from the store's environment
        /// variables).
        dir: PathBuf,
    },
    /// Id, time, job, positions, files, and whether every CRC verifies.
    Inspect {
        /// A `chk-N` directory, or a checkpoint in a store (`s3://bucket/prefix/chk-N`).
        chk: PathBuf,
    },
    /// Write a copy of a checkpoint with other source offsets: skip a record, or replay.
    ///
    /// The copy is `OUT/chk-N` (N as the original's), written with the same state
    /// (hard links to its files, copies across file systems), published and verified as
    /// a checkpoint the job takes itself; start the job from it with `lockgate run
    /// --restore OUT/chk-N`. The original is never modified. Each offset is checked
    /// against the partition on the cluster of the job file's source: from its earliest
    /// kept offset to its end (the next offset to be written). A partition continues
    /// at exactly the offset given: the records between the checkpoint's offset and a
    /// higher one are skipped (the command says how many), those between a lower one
    /// and the checkpoint's are read again. Exit codes: 0 written, 1 the checkpoint does
    /// not verify or the cluster cannot be asked, 2 a refused change.
    Alter {
        /// A local `chk-N` directory.
        chk: PathBuf,
        /// TOPIC:PARTITION=OFFSET: the partition continues at OFFSET (repeatable).
        #[arg(
            long = "set-offset",
            value_name = "TOPIC:PARTITION=OFFSET",
            required = true
        )]
        set_offset: Vec<String>,
        /// The checkpoint directory to write the copy into (created if missing; it may
        /// not hold a checkpoint of the same id).
        #[arg(long)]
        out: PathBuf,
        /// The job file: its source's cluster and settings, and its job name, which
        /// the checkpoint must carry.
        #[arg(long)]
        config: PathBuf,
    },
}

/// Logs to stderr: human-readable by default, one JSON object per line with
/// `LOCKGATE_LOG_FORMAT=json` (for log shippers: the event's fields at the top level,
/// the task's span fields, job and task, under `span`).
fn init_logging() -> Result<(), String> {
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env("LOCKGATE_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
    };
    let format = std::env::var("LOCKGATE_LOG_FORMAT").unwrap_or_default();
    match format.as_str() {
        "" | "text" => {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter())
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_target(false)
                .try_init();
        }
        "json" => {
            let _ = tracing_subscriber::fmt()
                .json()
                .flatten_event(true)
                .with_current_span(true)
                .with_span_list(false)
                .with_env_filter(filter())
                .with_writer(std::io::stderr)
                .with_target(false)
                .try_init();
        }
        other => {
            return Err(format!(
                "LOCKGATE_LOG_FORMAT: `{other}` is not one of text, json"
            ))
        }
    }
    Ok(())
}

/// Runs the command line and returns the process exit code.
pub fn main() -> i32 {
    main_with(crate::builtin::registry())
}

/// Runs the command line of a program that adds connectors of its own: `lockgate run`
/// looks the job file's sections up in `registry` (start from
/// `lockgate::builtin::registry()` and add to it).
pub fn main_with(registry: crate::connector::Registry) -> i32 {
    // `--version` says more than `-V`: the commit, the features, the C libraries.
    let matches = Cli::command()
        .long_version(about::long_version())
        .get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if cli.command.prints() {
        quiet_on_closed_pipe();
    }
    if let Err(e) = init_logging() {
        eprintln!("error: {e}");
        return EXIT_USAGE;
    }
    if let Err(e) = crate::fault::setup_from_env() {
        eprintln!("error: {e}");
        return EXIT_USAGE;
    }
    match cli.command {
        Command::Run {
            config,
            restore,
            allow_non_restored_state,
            allow_left_out,
            member,
            members,
            member_from_hostname,
            rescale_from,
        } => {
            let member = match run::member(member, members, member_from_hostname) {
                Ok(m) => m,
                Err(e) => {
                    eprintln!("error: {e}");
                    return EXIT_USAGE;
                }
            };
            run::run(
                &registry,
                &config,
                run::RunArgs {
                    restore,
                    allow_non_restored_state,
                    member,
                    rescale_from,
                    allow_left_out,
                },
            )
        }
        Command::Checkpoints(CheckpointsCommand::List { dir }) => checkpoints::list(&dir),
        Command::Checkpoints(CheckpointsCommand::Inspect { chk }) => checkpoints::inspect(&chk),
        Command::Checkpoints(CheckpointsCommand::Alter {
            chk,
            set_offset,
            out,
            config,
        }) => checkpoints::alter(&registry, &chk, &set_offset, &out, &config),
        Command::Completions { shell } => docs::completions(shell),
        Command::Manpages { dir } => docs::manpages(&dir),
        Command::Demo { dir } => demo::demo(dir),
        Command::Migrate(MigrateCommand::KafkaConnect {
            file,
            out,
            check,
            bootstrap_servers,
            allow_left_out,
            checkpoint_dir,
            table,
        }) => migrate::kafka_connect(migrate::Args {
            file,
            out,
            check,
            bootstrap_servers,
            allow_left_out,
            checkpoint_dir,
            table,
        }),
        Command::Chaos {
            config,
            kills,
            seed,
            failpoints,
            failpoint_runs,
            report,
            corrupt_latest,
            es_faults,
            kill_after_ms,
            list_failpoints,
            members,
            upstream,
        } => {
            if list_failpoints {
                chaos::list_failpoints()
            } else {
                chaos::chaos(
                    (config.expect("required by clap"), upstream),
                    (kills, members),
                    seed,
                    (failpoints, failpoint_runs),
                    report,
                    (corrupt_latest, es_faults),
                    &kill_after_ms,
                )
            }
        }
        Command::Testkit(TestkitCommand::Kafka {
            brokers,
            topics,
            bootstrap_file,
            port,
            orders,
            orders_keyed_by_order,
            orders_avro_registry,
        }) => {
            let key = if orders_keyed_by_order {
                crate::testkit::kafka::OrderKey::Order
            } else {
                crate::testkit::kafka::OrderKey::User
            };
            testkit::kafka(
                brokers,
                &topics,
                bootstrap_file.as_deref(),
                port,
                (&orders, key, orders_avro_registry.as_deref()),
            )
        }
        Command::Testkit(TestkitCommand::Es {
            listen,
            tls,
            cert_out,
            basic_auth,
            api_key,
        }) => testkit::es(listen, tls, cert_out, basic_auth, api_key),
        Command::Testkit(TestkitCommand::SchemaRegistry { listen, state }) => {
            testkit::schema_registry(listen, state)
        }
        Command::Testkit(TestkitCommand::Postgres {
            port,
            database,
            sql,
        }) => testkit::postgres(port, &database, &sql),
    }
}

impl Command {
    /// Whether the command's output is meant for a terminal or a pipe (and nothing
    /// else happens once its reader is gone).
    fn prints(&self) -> bool {
        matches!(
            self,
            Command::Checkpoints(_) | Command::Migrate(_) | Command::Completions { .. }
        )
    }
}

/// Output into a closed pipe (`lockgate checkpoints inspect chk-9 | head`) ends the
/// process quietly by SIGPIPE, as it does `cat`, instead of a panic. Only for commands
/// that print (`checkpoints alter` prints after its copy is complete): a job's sockets
/// and child processes keep Rust's default (the signal ignored, the write failing).
fn quiet_on_closed_pipe() {
    // SAFETY: restoring the default disposition of SIGPIPE before any other thread
    // exists; no handler is installed.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// A multi-threaded tokio runtime for one command.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every command and subcommand, as `lockgate a b`.
    fn commands(c: &clap::Command, path: String, out: &mut Vec<(String, clap::Command)>) {
        for sub in c.get_subcommands() {
            let p = format!("{path} {}", sub.get_name());
            out.push((p.clone(), sub.clone()));
            commands(sub, p, out);
        }
    }

    #[test]
    fn every_command_has_its_own_help() {
        let cli = Cli::command();
        cli.clone().debug_assert();
        let mut all = Vec::new();
        commands(&cli, "lockgate".into(), &mut all);
        assert!(all.len() >= 9, "{all:?}");
        let mut seen = std::collections::HashMap::new();
        for (path, c) in &all {
            let about = c
                .get_about()
                .unwrap_or_else(|| panic!("`{path}` has no description"))
                .to_string();
            assert!(
                !about.contains('\n') && about.len() > 20,
                "`{path}`: one line that says what it does: {about:?}"
            );
            if let Some(other) = seen.insert(about.clone(), path.clone()) {
                panic!("`{path}` and `{other}` share the description {about:?}");
            }
        }
        // The top-level commands also say what they guarantee.
        for name in ["run", "chaos", "demo", "checkpoints"] {
            let c = cli.find_subcommand(name).unwrap();
            assert!(
                c.get_long_about().is_some(),
                "`lockgate {name}` has a long help"
            );
        }
    }
}
