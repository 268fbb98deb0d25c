//! The replication session: the slot created (with the snapshot it exports), and the
//! stream of changes started at a position, through the `pgwire-replication` client.

use super::catalog::{Refusal, SESSION_SETTINGS};
use super::config::CdcConfig;
use crate::clients::postgres::SslMode;
use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, TlsConfig};
use std::time::{Duration, Instant};
use tokio_postgres::config::Host;

/// The replication client's configuration for `cfg`'s server, slot and publication,
/// starting at `start` and telling the server `ack` until the source tells it more.
pub fn config(cfg: &CdcConfig, start: u64, ack: u64) -> Result<ReplicationConfig, Refusal> {
    let pg = cfg.endpoint.config();
    let host = match pg.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        Some(Host::Unix(p)) => p.to_string_lossy().into_owned(),
        None => "localhost".into(),
    };
    let port = pg.get_ports().first().copied().unwrap_or(5432);
    let user = pg
        .get_user()
        .map(str::to_string)
        .or_else(|| std::env::var("USER").ok())
        .ok_or_else(|| Refusal::fatal("the URL names no user (key url)"))?;
    let password = pg
        .get_password()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .unwrap_or_default();
    let db = pg.get_dbname().unwrap_or(&user).to_string();
    let tls = TlsConfig {
        mode: match cfg.endpoint.sslmode {
            SslMode::Disable => pgwire_replication::SslMode::Disable,
            SslMode::Prefer => pgwire_replication::SslMode::Prefer,
            SslMode::Require if cfg.endpoint.ca_cert.is_some() => {
                pgwire_replication::SslMode::VerifyCa
            }
            SslMode::Require => pgwire_replication::SslMode::Require,
            SslMode::VerifyCa => pgwire_replication::SslMode::VerifyCa,
            SslMode::VerifyFull => pgwire_replication::SslMode::VerifyFull,
        },
        ca_pem_path: cfg.endpoint.ca_cert.clone(),
        ..TlsConfig::default()
    };
    let options: Vec<String> = SESSION_SETTINGS
        .iter()
        .map(|(k, v)| format!("-c {k}={}", v.replace(' ', "\\ ")))
        .collect();
    Ok(ReplicationConfig::new(
        host,
        user,
        password,
        db,
        cfg.slot.clone(),
        cfg.publication.as_str(),
    )
    .with_port(port)
    .with_tls(tls)
    .with_start_lsn(Lsn::from_u64(start))
    .with_ack_lsn(Lsn::from_u64(ack))
    .with_status_interval(Duration::from_secs(1))
    .with_wakeup_interval(Duration::from_secs(1))
    .with_buffer_size(4096)
    .with_options(options.join(" "))
    .with_application_name(format!("lockgate {} cdc", cfg.job)))
}

/// Creates the slot on a replication session, exporting its snapshot when `export`:
/// returns the slot's consistent point and, with the export, the session (which must
/// stay open until the snapshot is imported) and the snapshot's name.
pub async fn create_slot(
    cfg: &CdcConfig,
    export: bool,
) -> Result<(u64, Option<(ReplicationClient, String)>), Refusal> {
    let mut client = ReplicationClient::connect_gated(config(cfg, 0, 0)?)
        .await
        .map_err(|e| failed("connecting for replication", &e))?;
    let sql = format!(
        "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput {}",
        cfg.slot,
        if export {
            "EXPORT_SNAPSHOT"
        } else {
            "NOEXPORT_SNAPSHOT"
        }
    );
    let rows = client
        .simple_query(&sql)
        .await
        .map_err(|e| failed(&format!("creating replication slot {}", cfg.slot), &e))?;
    let text = |i: usize| {
        rows.first()
            .and_then(|r| r.get(i).cloned().flatten())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    };
    let point = text(1)
        .ok_or_else(|| Refusal::fatal("CREATE_REPLICATION_SLOT answered without a position"))
        .and_then(|t| super::lsn::parse(&t).map_err(Refusal::fatal))?;
    tracing::info!(slot = %cfg.slot, consistent_point = %super::lsn::format(point), "created the replication slot");
    if !export {
        client.abort();
        return Ok((point, None));
    }
    let name = text(2).ok_or_else(|| Refusal::fatal("the slot was created without a snapshot"))?;
    Ok((point, Some((client, name))))
}

/// Starts the stream at `start`, telling the server `ack`. A slot still held by
/// another session (the walsender of a process that just died lets go within
/// seconds) is waited for up to `patience`; then the error names the process.
pub async fn start(
    cfg: &CdcConfig,
    start: u64,
    ack: u64,
    patience: Duration,
) -> Result<ReplicationClient, Refusal> {
    let deadline = Instant::now() + patience;
    let mut wait = Duration::from_millis(100);
    loop {
        let mut client = ReplicationClient::connect(config(cfg, start, ack)?)
            .await
            .map_err(|e| failed("connecting for replication", &e))?;
        match client.wait_started().await {
            Ok(()) => return Ok(client),
            Err(e) => {
                let text = e.to_string();
                let held = text.contains("is active for PID");
                if held && Instant::now() + wait < deadline {
                    tracing::info!(slot = %cfg.slot, error = %text, "the slot is still held; waiting");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(2));
                    continue;
                }
                if held {
                    return Err(Refusal::fatal(format!(
                        "replication slot {} (key slot) is held by another session: {text}. Stop the other consumer, or give this job a slot of its own",
                        cfg.slot
                    )));
                }
                return Err(failed("starting replication", &e));
            }
        }
    }
}

fn failed(what: &str, e: &pgwire_replication::PgWireError) -> Refusal {
    let text = e.to_string();
    // A refused login or a missing privilege: no restart cures it.
    let fatal = text.contains("password authentication failed")
        || text.contains("no pg_hba.conf entry")
        || text.contains("must be superuser or replication role")
        || text.contains("permission denied");
    Refusal {
        fatal,
        message: format!("{what}: {text}"),
    }
}
