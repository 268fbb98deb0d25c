//! `lockgate testkit`: the embedded servers tests and demos run against.

use super::{EXIT_FAILURE, EXIT_USAGE};
use crate::testkit::kafka::{
    bootstrap_proxy, parse_topic, produce_orders_avro, produce_orders_keyed, EmbeddedKafka,
    OrderKey,
};
use std::io::BufRead;
use std::path::Path;

/// Runs the mock cluster in the foreground until killed. Prints the bootstrap list on
/// stdout (and writes it to `bootstrap_file`, atomically), then executes control lines
/// read from stdin (`topic NAME:PARTITIONS`, `down ID`, `up ID`), answering `ok` or
/// `error: ...` on stdout (`errors fetch|list-offsets|metadata|offset-commit N` fails the next N
/// requests of that API with a retriable error). Closing stdin does not stop the cluster.
///
/// With `port`, the cluster is also reachable at `127.0.0.1:PORT` (a bootstrap proxy),
/// and the printed bootstrap list is that address. `orders` (`TOPIC:COUNT`) produces
/// sample orders, keyed as `key` says, before the cluster is announced: JSON, or with
/// `avro_registry` Confluent-framed Avro whose schemas are registered there.
pub fn kafka(
    brokers: i32,
    topics: &[String],
    bootstrap_file: Option<&Path>,
    port: Option<u16>,
    (orders, key, avro_registry): (&[String], OrderKey, Option<&str>),
) -> i32 {
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
    let mut samples = Vec::new();
    for o in orders {
        match parse_topic(o) {
            Ok((t, n)) if parsed.iter().any(|(p, _)| *p == t) => samples.push((t, n as u64)),
            Ok((t, _)) => {
                eprintln!("error: --orders {o}: no --topic {t}");
                return EXIT_USAGE;
            }
            Err(e) => {
                eprintln!("error: --orders {}", e.replace("PARTITIONS", "COUNT"));
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
    for (topic, n) in &samples {
        let produced = match avro_registry {
            None => produce_orders_keyed(cluster.bootstrap_servers(), topic, 0, *n, 1000, key),
            Some(r) => {
                produce_orders_avro(cluster.bootstrap_servers(), topic, (0, *n, 1000), key, r)
            }
        };
        if let Err(e) = produced {
            eprintln!("error: producing sample orders to {topic}: {e}");
            return EXIT_FAILURE;
        }
    }
    let bootstrap = match port {
        None => cluster.bootstrap_servers().to_string(),
        Some(p) => {
            let first = cluster
                .bootstrap_servers()
                .split(',')
                .next()
                .unwrap_or_default();
            match bootstrap_proxy(p, first.to_string()) {
                Ok(port) => format!("127.0.0.1:{port}"),
                Err(e) => {
                    eprintln!("error: cannot listen on 127.0.0.1:{p}: {e}");
                    return EXIT_FAILURE;
                }
            }
        }
    };
    if let Some(f) = bootstrap_file {
        let tmp = f.with_extension("tmp");
        if let Err(e) = std::fs::write(&tmp, &bootstrap).and_then(|_| std::fs::rename(&tmp, f)) {
            eprintln!("error: cannot write {}: {e}", f.display());
            return EXIT_FAILURE;
        }
    }
    println!("{bootstrap}");
    eprintln!(
        "embedded Kafka: {brokers} brokers at {bootstrap} (topics: {}); control on stdin: topic NAME:PARTITIONS | down ID | up ID | errors API N | topic-error TOPIC [clear]",
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

/// Serves the Elasticsearch-compatible test server until killed; prints its URL (and,
/// with `tls`, the path of the CA certificate on a second line). The credentials are
/// never printed.
pub fn es(
    listen: std::net::SocketAddr,
    tls: bool,
    cert_out: Option<std::path::PathBuf>,
    basic_auth: Vec<String>,
    api_keys: Vec<String>,
) -> i32 {
    for (flag, values) in [
        ("--basic-auth USER:PASS", &basic_auth),
        ("--api-key ID:KEY", &api_keys),
    ] {
        if values.iter().any(|v| !v.contains(':')) {
            eprintln!("error: {flag}: the value needs a `:`");
            return EXIT_USAGE;
        }
    }
    let cert = if tls {
        match crate::testkit::es::TestCert::generate() {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("error: {e}");
                return EXIT_FAILURE;
            }
        }
    } else {
        None
    };
    let options = crate::testkit::es::ServerOptions {
        tls: cert.clone(),
        basic_auth,
        api_keys,
    };
    let secured = !options.basic_auth.is_empty() || !options.api_keys.is_empty();
    super::runtime().block_on(async move {
        match crate::testkit::es::EsServer::start_with(listen, options).await {
            Ok(server) => {
                println!("{}", server.url());
                if let Some(cert) = &cert {
                    let path = cert_out.unwrap_or_else(|| {
                        std::env::temp_dir()
                            .join(format!("lockgate-testkit-es-{}-ca.pem", server.addr().port()))
                    });
                    let tmp = path.with_extension("tmp");
                    if let Err(e) = std::fs::write(&tmp, &cert.ca_pem)
                        .and_then(|_| std::fs::rename(&tmp, &path))
                    {
                        eprintln!("error: cannot write {}: {e}", path.display());
                        return EXIT_FAILURE;
                    }
                    println!("{}", path.display());
                }
                eprintln!(
                    "Elasticsearch test server at {} (faults: POST {}/_lockgate/faults, stats: GET {}/_lockgate/stats){}",
                    server.url(),
                    server.url(),
                    server.url(),
                    if secured { "; credentials required" } else { "" }
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

/// Serves the in-memory Schema Registry until killed; prints its URL.
pub fn schema_registry(listen: std::net::SocketAddr, state: Option<std::path::PathBuf>) -> i32 {
    super::runtime().block_on(async move {
        match crate::testkit::schema_registry::SchemaRegistry::start_kept(listen, state).await {
            Ok(registry) => {
                println!("{}", registry.url());
                eprintln!(
                    "Schema Registry test server at {} (stats: GET {}/_lockgate/stats)",
                    registry.url(),
                    registry.url()
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

/// `lockgate testkit postgres`: a PostgreSQL server until killed; prints its URL.
pub fn postgres(port: u16, database: &str, sql: &[String]) -> i32 {
    use crate::testkit::postgres::{PgOptions, PgServer};
    // Logical decoding on, so that change data capture jobs can read it too.
    let server = match PgServer::start(PgOptions {
        port: (port != 0).then_some(port),
        ..PgOptions::logical()
    }) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_FAILURE;
        }
    };
    if let Err(e) = server.create_database(database) {
        eprintln!("error: creating database {database}: {e}");
        return EXIT_FAILURE;
    }
    for s in sql {
        if let Err(e) = server.query(database, s) {
            eprintln!("error: --sql {s}: {e}");
            return EXIT_FAILURE;
        }
    }
    println!("{}", server.url(database));
    eprintln!("PostgreSQL serving until killed (data in a temporary directory)");
    loop {
        std::thread::park();
    }
}
