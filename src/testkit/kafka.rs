//! An embedded Kafka: librdkafka's mock cluster, owned by a dedicated thread (it is not
//! `Send`), serving other processes on loopback until dropped.
//!
//! Limits (librdkafka 2.12): about 100k messages or 5 MiB kept per partition, in memory
//! only; a topic cannot grow; topics are created by the owning process (the admin API
//! hangs); no transactions; no timestamp index (`offsets_for_times` answers the end).

use rdkafka::mocking::MockCluster;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use std::sync::mpsc;
use std::thread::JoinHandle;

enum Cmd {
    CreateTopic(String, i32),
    /// Fail the next N requests of an API with a retriable error.
    RequestErrors(RDKafkaApiKey, usize),
    /// Report a topic with LEADER_NOT_AVAILABLE in metadata (false: clear it).
    TopicError(String, bool),
    BrokerDown(i32),
    BrokerUp(i32),
    Stop,
}

type Reply = mpsc::Sender<Result<(), String>>;

/// A running mock cluster.
pub struct EmbeddedKafka {
    bootstrap: String,
    tx: mpsc::Sender<(Cmd, Reply)>,
    thread: Option<JoinHandle<()>>,
}

impl EmbeddedKafka {
    /// Starts `brokers` brokers and creates `topics` (name, partitions).
    pub fn start(brokers: i32, topics: &[(String, i32)]) -> Result<EmbeddedKafka, String> {
        let (tx, rx) = mpsc::channel::<(Cmd, Reply)>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<String, String>>();
        let topics = topics.to_vec();
        let thread = std::thread::Builder::new()
            .name("embedded-kafka".into())
            .spawn(move || {
                let cluster = match MockCluster::new(brokers) {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("mock cluster: {e}")));
                        return;
                    }
                };
                let replication = brokers.min(3);
                for (name, parts) in &topics {
                    if let Err(e) = cluster.create_topic(name, *parts, replication) {
                        let _ = ready_tx.send(Err(format!("create topic {name}: {e}")));
                        return;
                    }
                }
                let _ = ready_tx.send(Ok(cluster.bootstrap_servers()));
                while let Ok((cmd, reply)) = rx.recv() {
                    let r = match cmd {
                        Cmd::CreateTopic(name, parts) => cluster
                            .create_topic(&name, parts, replication)
                            .map_err(|e| e.to_string()),
                        Cmd::RequestErrors(api, n) => {
                            let errors =
                                vec![RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION; n];
                            cluster.request_errors(api, &errors);
                            Ok(())
                        }
                        Cmd::TopicError(topic, on) => {
                            let e = if on {
                                RDKafkaRespErr::RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE
                            } else {
                                RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR
                            };
                            cluster.topic_error(&topic, e).map_err(|e| e.to_string())
                        }
                        Cmd::BrokerDown(id) => cluster.broker_down(id).map_err(|e| e.to_string()),
                        Cmd::BrokerUp(id) => cluster.broker_up(id).map_err(|e| e.to_string()),
                        Cmd::Stop => {
                            let _ = reply.send(Ok(()));
                            return;
                        }
                    };
                    let _ = reply.send(r);
                }
            })
            .map_err(|e| e.to_string())?;
        let bootstrap = ready_rx
            .recv()
            .map_err(|_| "mock cluster thread died".to_string())??;
        Ok(EmbeddedKafka {
            bootstrap,
            tx,
            thread: Some(thread),
        })
    }

    /// The `bootstrap.servers` list of the cluster.
    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap
    }

    fn call(&self, cmd: Cmd) -> Result<(), String> {
        let (rtx, rrx) = mpsc::channel();
        self.tx
            .send((cmd, rtx))
            .map_err(|_| "mock cluster stopped".to_string())?;
        rrx.recv().map_err(|_| "mock cluster stopped".to_string())?
    }

    /// Creates a topic (the only way to add partitions: existing topics cannot grow).
    pub fn create_topic(&self, name: &str, partitions: i32) -> Result<(), String> {
        self.call(Cmd::CreateTopic(name.to_string(), partitions))
    }

    /// Makes broker `id` (1-based) refuse connections.
    pub fn broker_down(&self, id: i32) -> Result<(), String> {
        self.call(Cmd::BrokerDown(id))
    }

    /// Makes broker `id` accept connections again.
    pub fn broker_up(&self, id: i32) -> Result<(), String> {
        self.call(Cmd::BrokerUp(id))
    }

    /// Fails the next `n` requests of `api` with NOT_LEADER_FOR_PARTITION, an error
    /// clients retry after refreshing metadata.
    pub fn request_errors(&self, api: RDKafkaApiKey, n: usize) -> Result<(), String> {
        self.call(Cmd::RequestErrors(api, n))
    }

    /// Makes metadata report `topic` with LEADER_NOT_AVAILABLE (`on`), or clears it.
    pub fn topic_error(&self, topic: &str, on: bool) -> Result<(), String> {
        self.call(Cmd::TopicError(topic.to_string(), on))
    }

    /// Executes one control line of `lockgate testkit kafka`'s stdin protocol:
    /// `topic NAME:PARTITIONS`, `down ID`, `up ID`, `errors fetch|list-offsets|metadata N`,
    /// `topic-error TOPIC [clear]`.
    pub fn control(&self, line: &str) -> Result<(), String> {
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("topic"), Some(spec)) => {
                let (name, parts) = parse_topic(spec)?;
                self.create_topic(&name, parts)
            }
            (Some("down"), Some(id)) => {
                self.broker_down(id.parse().map_err(|_| format!("bad broker id {id}"))?)
            }
            (Some("up"), Some(id)) => {
                self.broker_up(id.parse().map_err(|_| format!("bad broker id {id}"))?)
            }
            (Some("topic-error"), Some(topic)) => {
                let on = words.next() != Some("clear");
                self.topic_error(topic, on)
            }
            (Some("errors"), Some(api)) => {
                let api = match api {
                    "fetch" => RDKafkaApiKey::Fetch,
                    "list-offsets" => RDKafkaApiKey::ListOffsets,
                    "metadata" => RDKafkaApiKey::Metadata,
                    "offset-commit" => RDKafkaApiKey::OffsetCommit,
                    other => {
                        return Err(format!(
                            "unknown api {other} (fetch, list-offsets, metadata, offset-commit)"
                        ))
                    }
                };
                let n = words
                    .next()
                    .and_then(|n| n.parse().ok())
                    .ok_or("errors API N")?;
                self.request_errors(api, n)
            }
            _ => Err(format!(
                "unknown command {line:?} (topic NAME:PARTITIONS | down ID | up ID | errors API N)"
            )),
        }
    }
}

/// Parses `NAME:PARTITIONS`.
pub fn parse_topic(spec: &str) -> Result<(String, i32), String> {
    let (name, parts) = spec
        .rsplit_once(':')
        .ok_or_else(|| format!("`{spec}` is not NAME:PARTITIONS"))?;
    let parts: i32 = parts
        .parse()
        .map_err(|_| format!("`{spec}`: partitions must be a number"))?;
    if name.is_empty() || parts < 1 {
        return Err(format!("`{spec}`: a name and at least one partition"));
    }
    Ok((name.to_string(), parts))
}

/// Sample orders for demos and examples: order `i` is
/// `{"order":i,"user":"user-NNNN","amount":A}`, keyed by its user (so a user's orders
/// stay in one partition), `users` users. Returns once the broker acknowledged all.
pub fn produce_orders(
    bootstrap: &str,
    topic: &str,
    from: u64,
    count: u64,
    users: u64,
) -> Result<(), String> {
    produce_orders_keyed(bootstrap, topic, from, count, users, OrderKey::User)
}

/// What the Kafka key of a sample order is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderKey {
    /// Its user: a user's orders stay in one partition.
    User,
    /// Its order number: a user's orders spread over every partition (a rolling sum by
    /// user across members then needs a repartition stage).
    Order,
}

/// [`produce_orders`], keyed as `key` says.
pub fn produce_orders_keyed(
    bootstrap: &str,
    topic: &str,
    from: u64,
    count: u64,
    users: u64,
    key: OrderKey,
) -> Result<(), String> {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use std::time::Duration;
    let p: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "20")
        .set("compression.type", "lz4")
        .create()
        .map_err(|e| e.to_string())?;
    for i in from..from + count {
        let user = format!("user-{:04}", (i * 7919) % users.max(1));
        let body = format!(
            "{{\"order\":{i},\"user\":\"{user}\",\"amount\":{}}}",
            1 + (i * 31) % 500
        );
        let order = format!("order-{i}");
        let k = match key {
            OrderKey::User => &user,
            OrderKey::Order => &order,
        };
        while p.send(BaseRecord::to(topic).key(k).payload(&body)).is_err() {
            p.poll(Duration::from_millis(5));
        }
    }
    p.flush(Duration::from_secs(60)).map_err(|e| e.to_string())
}

/// The Avro schema of the sample orders of [`produce_orders_avro`].
pub const ORDER_AVRO_SCHEMA: &str = r#"{"type":"record","name":"Order","namespace":"lockgate.sample","fields":[{"name":"order","type":"long"},{"name":"user","type":"string"},{"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}},{"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}}]}"#;

/// [`produce_orders_keyed`] as Confluent's Avro serializer writes them: the schemas
/// registered at the Schema Registry at `registry` (subjects `<topic>-key`, a string,
/// and `<topic>-value`, [`ORDER_AVRO_SCHEMA`]), each key and value framed with its
/// schema's id. Order `i`: `{"order": i, "user": "user-NNNN", "amount": <decimal with 2
/// digits>, "ts": <ms>}`.
pub fn produce_orders_avro(
    bootstrap: &str,
    topic: &str,
    (from, count, users): (u64, u64, u64),
    key: OrderKey,
    registry: &str,
) -> Result<(), String> {
    use apache_avro::types::Value;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use std::time::Duration;
    let http = reqwest::blocking::Client::new();
    let register = |subject: String, schema: &str| -> Result<u32, String> {
        let url = format!(
            "{}/subjects/{subject}/versions",
            registry.trim_end_matches('/')
        );
        let answer: serde_json::Value = http
            .post(&url)
            .json(&serde_json::json!({ "schema": schema }))
            .send()
            .and_then(|r| r.error_for_status())
            .and_then(|r| r.json())
            .map_err(|e| format!("registering {subject}: {e}"))?;
        answer["id"]
            .as_u64()
            .map(|id| id as u32)
            .ok_or_else(|| format!("registering {subject}: the answer {answer} has no id"))
    };
    let key_id = register(format!("{topic}-key"), r#""string""#)?;
    let value_id = register(format!("{topic}-value"), ORDER_AVRO_SCHEMA)?;
    let schema = apache_avro::Schema::parse_str(ORDER_AVRO_SCHEMA).map_err(|e| e.to_string())?;
    let framed = |id: u32, datum: Vec<u8>| {
        let mut v = vec![0];
        v.extend_from_slice(&id.to_be_bytes());
        v.extend(datum);
        v
    };
    let p: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "20")
        .set("compression.type", "lz4")
        .create()
        .map_err(|e| e.to_string())?;
    for i in from..from + count {
        let user = format!("user-{:04}", (i * 7919) % users.max(1));
        let cents = (1 + (i * 31) % 500) as i64 * 100 + (i % 100) as i64;
        let value = Value::Record(vec![
            ("order".into(), Value::Long(i as i64)),
            ("user".into(), Value::String(user.clone())),
            (
                "amount".into(),
                Value::Decimal(apache_avro::Decimal::from(cents.to_be_bytes().to_vec())),
            ),
            (
                "ts".into(),
                Value::TimestampMillis(1_700_000_000_000 + i as i64 * 1000),
            ),
        ]);
        let body = framed(
            value_id,
            apache_avro::to_avro_datum(&schema, value).map_err(|e| e.to_string())?,
        );
        let k = match key {
            OrderKey::User => user,
            OrderKey::Order => format!("order-{i}"),
        };
        // An Avro string: its zigzag length, then its bytes.
        let mut datum = Vec::with_capacity(k.len() + 2);
        let mut n = (k.len() as u64) << 1;
        while n >= 0x80 {
            datum.push((n as u8) | 0x80);
            n >>= 7;
        }
        datum.push(n as u8);
        datum.extend_from_slice(k.as_bytes());
        let k = framed(key_id, datum);
        while p
            .send(BaseRecord::to(topic).key(&k).payload(&body))
            .is_err()
        {
            p.poll(Duration::from_millis(5));
        }
    }
    p.flush(Duration::from_secs(60)).map_err(|e| e.to_string())
}

/// Listens on a fixed loopback port and forwards every connection to `target` (a mock
/// broker), so that a job file can name a fixed bootstrap address: Kafka clients only
/// bootstrap through it, then connect to the brokers the metadata names.
pub fn bootstrap_proxy(port: u16, target: String) -> std::io::Result<u16> {
    use std::net::{TcpListener, TcpStream};
    let listener = TcpListener::bind(("127.0.0.1", port))?;
    let port = listener.local_addr()?.port();
    std::thread::Builder::new()
        .name("kafka-bootstrap-proxy".into())
        .spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                let Ok(broker) = TcpStream::connect(&target) else {
                    continue;
                };
                let pipe = |mut from: TcpStream, mut to: TcpStream| {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                };
                if let (Ok(c2), Ok(b2)) = (client.try_clone(), broker.try_clone()) {
                    pipe(client, b2);
                    pipe(broker, c2);
                }
            }
        })?;
    Ok(port)
}

impl Drop for EmbeddedKafka {
    fn drop(&mut self) {
        let _ = self.call(Cmd::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
