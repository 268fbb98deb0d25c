//! Connections to the server: the URL, the password, TLS as `sslmode` asks, and
//! retries while the server is unreachable (a restart) but not when it refuses.

use super::config::{PgConfig, SslMode};
use std::time::{Duration, Instant};
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

/// A database error as a person reads it: the server's message, its detail and hint,
/// and the SQLSTATE; any other error with its causes.
pub fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut s = format!("{} (SQLSTATE {})", db.message(), db.code().code());
        if let Some(d) = db.detail() {
            s.push_str(&format!("; {d}"));
        }
        if let Some(h) = db.hint() {
            s.push_str(&format!("; hint: {h}"));
        }
        return s;
    }
    let mut s = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        s.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    s
}

/// Whether `e` is the server refusing the login (a wrong password, no such role or
/// database): no retry cures it.
pub fn is_refusal(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| {
        c.code().starts_with("28")
            || *c == SqlState::INVALID_CATALOG_NAME
            || *c == SqlState::INSUFFICIENT_PRIVILEGE
    })
}

fn tls(cfg: &PgConfig) -> Result<postgres_native_tls::MakeTlsConnector, String> {
    let mut b = native_tls::TlsConnector::builder();
    if let Some(ca) = &cfg.ca_cert {
        let pem = std::fs::read(ca).map_err(|e| format!("ca_cert {}: {e}", ca.display()))?;
        let cert = native_tls::Certificate::from_pem(&pem)
            .map_err(|e| format!("ca_cert {}: {e}", ca.display()))?;
        b.add_root_certificate(cert);
    }
    match cfg.sslmode {
        SslMode::Disable | SslMode::VerifyFull => {}
        SslMode::Prefer | SslMode::Require if cfg.ca_cert.is_none() => {
            // libpq's require: encrypted, the certificate unchecked unless a root
            // certificate is given.
            b.danger_accept_invalid_certs(true);
            b.danger_accept_invalid_hostnames(true);
        }
        SslMode::Prefer | SslMode::Require | SslMode::VerifyCa => {
            b.danger_accept_invalid_hostnames(true);
        }
    }
    let c = b.build().map_err(|e| format!("TLS: {e}"))?;
    Ok(postgres_native_tls::MakeTlsConnector::new(c))
}

/// Connects once, naming the session `application_name` (what `pg_stat_activity`
/// shows a DBA); `tls` is None for `sslmode = "disable"`.
async fn connect_once(
    cfg: &PgConfig,
    application_name: &str,
    tls: Option<postgres_native_tls::MakeTlsConnector>,
) -> Result<Client, tokio_postgres::Error> {
    let mut c: tokio_postgres::Config = cfg
        .url
        .0
        .parse()
        .expect("the URL was checked when the job file was loaded");
    if c.get_password().is_none() {
        if let Some(p) = &cfg.password {
            c.password(p.expose());
        }
    }
    c.application_name(application_name);
    c.connect_timeout(Duration::from_millis(
        cfg.connect_timeout_ms.clamp(1000, 30_000),
    ));
    c.ssl_mode(match cfg.sslmode {
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        _ => tokio_postgres::config::SslMode::Require,
    });
    let client = match tls {
        None => {
            let (client, conn) = c.connect(tokio_postgres::NoTls).await?;
            tokio::spawn(conn);
            client
        }
        Some(tls) => {
            let (client, conn) = c.connect(tls).await?;
            tokio::spawn(conn);
            client
        }
    };
    Ok(client)
}

/// Connects, trying again with backoff while the server cannot be reached, for up to
/// `connect_timeout_ms`; a refusal (credentials, database) is returned at once.
pub async fn connect(cfg: &PgConfig, application_name: &str) -> Result<Client, String> {
    let deadline = Instant::now() + Duration::from_millis(cfg.connect_timeout_ms);
    let mut wait = Duration::from_millis(100);
    let tls = match cfg.sslmode {
        SslMode::Disable => None,
        _ => Some(tls(cfg)?),
    };
    loop {
        match connect_once(cfg, application_name, tls.clone()).await {
            Ok(c) => return Ok(c),
            Err(e) if is_refusal(&e) || Instant::now() + wait > deadline => {
                return Err(format!(
                    "cannot connect to {}: {}",
                    crate::secret::redact_url(&cfg.url.0),
                    describe(&e)
                ))
            }
            Err(e) => {
                tracing::warn!(error = %describe(&e), retry_in_ms = wait.as_millis() as u64, "Postgres server unreachable");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(2));
            }
        }
    }
}
