//! A soak run of `lockgate chaos` on the embedded servers: 200,000 orders through
//! `Kafka -> rolling_sum by user -> Elasticsearch`, killed N times with SIGKILL.
//!
//! ```sh
//! cargo build --release && cargo run --release --example chaos_soak -- 100 [SEED]
//! ```
//! Prints the harness's report table; the JSON report lands next to the job file.

use lockgate::testkit::{es::EsServer, kafka::EmbeddedKafka};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let kills: u32 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let seed: u64 = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let lockgate = std::env::current_exe()?
        .parent()
        .and_then(|p| p.parent())
        .map(|p| p.join("lockgate"))
        .filter(|p| p.exists())
        .ok_or("build the lockgate binary first (cargo build --release)")?;
    let kafka = EmbeddedKafka::start(3, &[("orders".into(), 8)])?;
    let rt = tokio::runtime::Runtime::new()?;
    let es = rt.block_on(EsServer::start("127.0.0.1:0".parse()?))?;
    let p: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka.bootstrap_servers())
        .set("linger.ms", "20")
        .set("compression.type", "lz4")
        .create()?;
    for i in 0..200_000u64 {
        let user = format!("user-{:04}", (i * 7919) % 1000);
        let body = format!(
            "{{\"order\":{i},\"user\":\"{user}\",\"amount\":{}}}",
            1 + (i * 31) % 500
        );
        while p
            .send(BaseRecord::to("orders").key(&user).payload(&body))
            .is_err()
        {
            p.poll(Duration::from_millis(5));
        }
    }
    p.flush(Duration::from_secs(60))?;
    let dir = std::env::temp_dir().join(format!("lockgate-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let job = dir.join("job.toml");
    std::fs::write(
        &job,
        format!(
            "[job]\nname = \"soak\"\nparallelism = 2\n\n[checkpoint]\ndir = \"checkpoints\"\ninterval_ms = 200\n\n\
             [restart]\nstrategy = \"none\"\n\n\
             [source.kafka]\nbootstrap_servers = \"{}\"\ntopics = [\"orders\"]\nbounded = \"latest\"\n\n\
             [[transform]]\ntype = \"rolling_sum\"\nkey = \"/user\"\nfield = \"/amount\"\noutput = \"/total\"\n\n\
             [sink.elasticsearch]\nurl = \"{}\"\nindex = \"orders\"\nid = \"field:/user\"\noperation = \"upsert\"\nbulk_flush_interval_ms = 100\nretry_max_attempts = 1000\n",
            kafka.bootstrap_servers(),
            es.url()
        ),
    )?;
    // Each batch is slowed down so that the job outlives the kills.
    let throttle = format!("source-batch=sleep({})", 5 * kills.max(20));
    let status = std::process::Command::new(lockgate)
        .args(["chaos", "--config"])
        .arg(&job)
        .args([
            "--kills",
            &kills.to_string(),
            "--seed",
            &seed.to_string(),
            "--failpoints",
            &throttle,
        ])
        .args(["--kill-after-ms", "300..900", "--report"])
        .arg(dir.join("report.json"))
        .status()?;
    println!("report: {}", dir.join("report.json").display());
    std::process::exit(status.code().unwrap_or(1));
}
