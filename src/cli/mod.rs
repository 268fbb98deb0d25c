//! The command line (stable: scripts and tests depend on it).
//!
//! Exit codes: 0 done, 1 job failure, 2 usage or configuration error.

mod chaos;
mod checkpoints;
mod demo;
mod run;
mod testkit;

use clap::{Parser, Subcommand};
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
    Run {
        /// The TOML job file.
        #[arg(long)]
        config: PathBuf,
        /// Restore from this chk-N directory (or the newest valid checkpoint of a checkpoint directory).
        #[arg(long)]
        restore: Option<PathBuf>,
        /// Accept a checkpoint of another job graph, restoring the state that matches.
        #[arg(long)]
        allow_non_restored_state: bool,
    },
    /// List or inspect checkpoints.
    #[command(subcommand)]
    Checkpoints(CheckpointsCommand),
    /// Run the demonstration job: crash it, resume it, verify it.
    /// Run a job under SIGKILLs and failpoints, then verify its output exactly.
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
        /// Corrupt the newest checkpoint after the first kill (and check it is reported).
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
    },
    /// Embedded servers for tests and demos.
    #[command(subcommand)]
    Testkit(TestkitCommand),
    Demo {
        /// Where to keep the demo's files (default: a new directory under the system temp dir).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum TestkitCommand {
    /// An in-memory Elasticsearch-compatible server with fault injection.
    Es {
        #[arg(long, default_value = "127.0.0.1:9200")]
        listen: std::net::SocketAddr,
    },
    /// An embedded Kafka (librdkafka's mock cluster) serving until killed.
    Kafka {
        #[arg(long, default_value_t = 3)]
        brokers: i32,
        /// NAME:PARTITIONS, repeatable.
        #[arg(long = "topic")]
        topics: Vec<String>,
        /// Where to write the bootstrap servers list.
        #[arg(long)]
        bootstrap_file: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum CheckpointsCommand {
    /// One line per checkpoint of a checkpoint directory.
    List { dir: PathBuf },
    /// Id, time, job, positions, files, and whether every CRC verifies.
    Inspect { chk: PathBuf },
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("LOCKGATE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

/// Runs the command line and returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    init_logging();
    if let Err(e) = crate::fault::setup_from_env() {
        eprintln!("error: {e}");
        return EXIT_USAGE;
    }
    match cli.command {
        Command::Run {
            config,
            restore,
            allow_non_restored_state,
        } => run::run(&config, restore, allow_non_restored_state),
        Command::Checkpoints(CheckpointsCommand::List { dir }) => checkpoints::list(&dir),
        Command::Checkpoints(CheckpointsCommand::Inspect { chk }) => checkpoints::inspect(&chk),
        Command::Demo { dir } => demo::demo(dir),
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
        } => {
            if list_failpoints {
                chaos::list_failpoints()
            } else {
                chaos::chaos(
                    config.expect("required by clap"),
                    kills,
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
        }) => testkit::kafka(brokers, &topics, bootstrap_file.as_deref()),
        Command::Testkit(TestkitCommand::Es { listen }) => testkit::es(listen),
    }
}

/// A multi-threaded tokio runtime for one command.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}
