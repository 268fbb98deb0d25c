//! `lockgate testkit`: the embedded servers tests and demos run against.

use super::{EXIT_FAILURE, EXIT_USAGE};
use crate::testkit::kafka::{parse_topic, EmbeddedKafka};
use std::io::BufRead;
use std::path::Path;

/// Runs the mock cluster in the foreground until killed. Prints the bootstrap list on
/// stdout (and writes it to `bootstrap_file`, atomically), then executes control lines
/// read from stdin (`topic NAME:PARTITIONS`, `down ID`, `up ID`), answering `ok` or
/// `error: ...` on stdout (`errors fetch|list-offsets|metadata|offset-commit N` fails the next N
/// requests of that API with a retriable error). Closing stdin does not stop the cluster.
pub fn kafka(brokers: i32, topics: &[String], bootstrap_file: Option<&Path>) -> i32 {
    let mut parsed = Vec::new();
    for t in topics {
        match parse_topic(t) {
            Ok(p) => parsed.push(p),
            Err(e) => {
                eprintln!("error: --topic {e}");
                return EXIT_USAGE;
            }
        }
    }
    let cluster = match EmbeddedKafka::start(brokers, &parsed) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_FAILURE;
        }
    };
    if let Some(f) = bootstrap_file {
        let tmp = f.with_extension("tmp");
        if let Err(e) =
            std::fs::write(&tmp, cluster.bootstrap_servers()).and_then(|_| std::fs::rename(&tmp, f))
        {
            eprintln!("error: cannot write {}: {e}", f.display());
            return EXIT_FAILURE;
        }
    }
    println!("{}", cluster.bootstrap_servers());
    eprintln!(
        "embedded Kafka: {brokers} brokers at {} (topics: {}); control on stdin: topic NAME:PARTITIONS | down ID | up ID | errors API N | topic-error TOPIC [clear]",
        cluster.bootstrap_servers(),
        topics.join(", ")
    );
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        match cluster.control(&line) {
            Ok(()) => println!("ok"),
            Err(e) => println!("error: {e}"),
        }
    }
    loop {
        std::thread::park();
    }
}

/// Serves the Elasticsearch-compatible test server until killed; prints its URL.
pub fn es(listen: std::net::SocketAddr) -> i32 {
    super::runtime().block_on(async move {
        match crate::testkit::es::EsServer::start(listen).await {
            Ok(server) => {
                println!("{}", server.url());
                eprintln!(
                    "Elasticsearch test server at {} (faults: POST {}/_lockgate/faults, stats: GET {}/_lockgate/stats)",
                    server.url(),
                    server.url(),
                    server.url()
                );
                std::future::pending::<()>().await;
                0
            }
            Err(e) => {
                eprintln!("error: cannot listen on {listen}: {e}");
                EXIT_FAILURE
            }
        }
    })
}
