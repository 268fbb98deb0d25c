//! What lockgate says to a PostgreSQL server: where it is and how to log in (an
//! [`Endpoint`], from the keys `url`, `password_file`, `sslmode`, `ca_cert` and
//! `connect_timeout_ms` that every PostgreSQL section shares), TLS as `sslmode` asks,
//! retries while the server is unreachable (a restart) but not when it refuses, and
//! its errors as a person reads them.

use crate::secret::{Secret, UrlText};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

/// How the connection is encrypted (libpq's `sslmode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS when the server offers it, else plain (libpq's default).
    Prefer,
    /// TLS; the certificate is checked against `ca_cert` when one is given (libpq's
    /// `require` with a root certificate), else not at all.
    Require,
    /// TLS; the certificate must chain to `ca_cert` (or the system's roots), the
    /// host name is not checked.
    VerifyCa,
    /// TLS; the certificate must chain to `ca_cert` (or the system's roots) and name
    /// the host.
    VerifyFull,
}

impl SslMode {
    fn parse(s: &str) -> Result<SslMode, String> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(format!(
                    "`{other}` is not one of disable, prefer, require, verify-ca, verify-full"
                ))
            }
        })
    }
}

/// A server and how to log in to it.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The libpq URL, without `sslmode` (kept in [`Endpoint::sslmode`]).
    pub url: UrlText,
    /// The password, when not in the URL: `password_file`, else `PGPASSWORD`.
    pub password: Option<Secret>,
    pub sslmode: SslMode,
    pub ca_cert: Option<PathBuf>,
    /// How long a connection attempt may take, and how long a connector keeps trying
    /// to reach the server when it opens.
    pub connect_timeout_ms: u64,
}

/// The keys of a section that make its [`Endpoint`], as written.
#[derive(Debug, Clone, Copy)]
pub struct EndpointKeys<'a> {
    pub url: &'a str,
    pub password_file: Option<&'a Path>,
    pub sslmode: Option<&'a str>,
    pub ca_cert: Option<&'a Path>,
    pub connect_timeout_ms: Option<u64>,
}

impl Endpoint {
    /// The endpoint the keys name, paths made absolute by `resolve` (against the job
    /// file's directory); an error is `(key, message)`. `sslmode` may be a key or in
    /// the URL (the key wins); libpq's default is `prefer`.
    pub fn from_keys(
        keys: EndpointKeys<'_>,
        resolve: impl Fn(&Path) -> PathBuf,
    ) -> Result<Endpoint, (String, String)> {
        let err = |key: &str, message: String| (key.to_string(), message);
        let (url, url_mode) = split_sslmode(keys.url);
        let sslmode = match (keys.sslmode, url_mode) {
            (Some(m), _) => SslMode::parse(m).map_err(|e| err("sslmode", e))?,
            (None, Some(m)) => {
                SslMode::parse(&m).map_err(|e| err("url", format!("sslmode in the URL: {e}")))?
            }
            (None, None) => SslMode::Prefer,
        };
        url.parse::<tokio_postgres::Config>()
            .map_err(|e| err("url", format!("not a PostgreSQL URL: {e}")))?;
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(err(
                "url",
                "give a URL: postgresql://user@host:5432/database".into(),
            ));
        }
        let password = match keys.password_file {
            Some(f) => Some(
                crate::secret::read_secret_file(&resolve(f))
                    .map_err(|e| err("password_file", e))?,
            ),
            None => std::env::var("PGPASSWORD").ok().map(Secret::new),
        };
        Ok(Endpoint {
            url: UrlText(url),
            password,
            sslmode,
            ca_cert: keys.ca_cert.map(&resolve),
            connect_timeout_ms: keys.connect_timeout_ms.unwrap_or(30_000),
        })
    }

    /// The URL parsed (it was checked when the job file was loaded), with the
    /// password of `password_file` or `PGPASSWORD` when the URL has none.
    pub fn config(&self) -> tokio_postgres::Config {
        let mut c: tokio_postgres::Config = self
            .url
            .0
            .parse()
            .expect("the URL was checked when the job file was loaded");
        if c.get_password().is_none() {
            if let Some(p) = &self.password {
                c.password(p.expose());
            }
        }
        c
    }

    /// The URL without its password, for messages.
    pub fn redacted(&self) -> String {
        crate::secret::redact_url(&self.url.0)
    }
}

/// `url` without its `sslmode` parameter, and that parameter's value: tokio-postgres
/// reads only three of libpq's five modes, so lockgate reads it itself.
pub fn split_sslmode(url: &str) -> (String, Option<String>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_string(), None);
    };
    let mut mode = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|p| match p.strip_prefix("sslmode=") {
            Some(m) => {
                mode = Some(m.to_string());
                false
            }
            None => !p.is_empty(),
        })
        .collect();
    if kept.is_empty() {
        (base.to_string(), mode)
    } else {
        (format!("{base}?{}", kept.join("&")), mode)
    }
}

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

fn tls(cfg: &Endpoint) -> Result<postgres_native_tls::MakeTlsConnector, String> {
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
    cfg: &Endpoint,
    application_name: &str,
    tls: Option<postgres_native_tls::MakeTlsConnector>,
) -> Result<Client, tokio_postgres::Error> {
    let mut c = cfg.config();
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
pub async fn connect(cfg: &Endpoint, application_name: &str) -> Result<Client, String> {
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
                    cfg.redacted(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_leaves_the_url_and_the_rest_of_the_query_stays() {
        assert_eq!(
            split_sslmode("postgresql://u@h/db?sslmode=verify-full&application_name=x"),
            (
                "postgresql://u@h/db?application_name=x".to_string(),
                Some("verify-full".to_string())
            )
        );
        assert_eq!(
            split_sslmode("postgresql://u@h/db?sslmode=disable"),
            (
                "postgresql://u@h/db".to_string(),
                Some("disable".to_string())
            )
        );
        assert_eq!(
            split_sslmode("postgresql://u@h/db"),
            ("postgresql://u@h/db".to_string(), None)
        );
    }
}
