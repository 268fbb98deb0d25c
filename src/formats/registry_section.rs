//! `[source.kafka.schema_registry]`: where the writer schemas of framed values come
//! from, with the same credential and TLS keys as `[sink.elasticsearch]`:
//!
//! ```toml
//! [source.kafka.schema_registry]
//! url = "https://registry:8081"      # or urls = [...], tried in turn
//! username = "lockgate"              # basic auth; password or password_file
//! password = "${REGISTRY_PASSWORD}"
//! # bearer_token = "..." or bearer_token_file = "..."
//! # ca_cert = "ca.pem", tls_verify = "full" | "certificate" | "none"
//! # request_timeout_ms = 10000      # one request
//! # retry_timeout_ms = 15000        # retrying a registry that does not answer, then the job fails
//!                                   # (default: 30 s or a quarter of checkpoint.timeout_ms; less than half of it)
//! ```
//!
//! Everything is checked, and every file read, when the job file is loaded: a mistake
//! is an error that names its key. Secrets never reach a log line or an error.

use super::registry::{RegistryClient, Retry, TIMEOUT};
use crate::clients::http::{endpoint, reqwest_client, Endpoint, EndpointKeys, TlsVerify, Wording};
use crate::secret::{Secret, UrlText};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The section as written in a job file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistrySection {
    url: Option<UrlText>,
    urls: Option<Vec<UrlText>>,
    username: Option<String>,
    password: Option<Secret>,
    password_file: Option<PathBuf>,
    bearer_token: Option<Secret>,
    bearer_token_file: Option<PathBuf>,
    ca_cert: Option<PathBuf>,
    tls_verify: Option<String>,
    request_timeout_ms: Option<u64>,
    retry_timeout_ms: Option<u64>,
}

/// How the section words the errors it shares with the other HTTP sections.
const WORDING: Wording = Wording {
    urls: "URLs",
    certificate_without_ca: Some("\"certificate\" checks the chain up to ca_cert: give ca_cert"),
};

/// The checked settings: URLs without user info, credentials, TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistrySettings {
    pub endpoint: Endpoint,
    /// One request's timeout.
    pub timeout: Duration,
    pub retry: Retry,
}

impl RegistrySection {
    /// The checked settings; relative paths are resolved by `resolve`. A lookup retries
    /// for less than `checkpoint_timeout` (the subtask waits for it, and a checkpoint
    /// with it). An error is `(key, message)`, the key relative to the section.
    pub fn settings(
        &self,
        resolve: impl Fn(&Path) -> PathBuf,
        checkpoint_timeout: Duration,
    ) -> Result<RegistrySettings, (String, String)> {
        let (given, key): (Vec<&UrlText>, &str) = match (&self.url, &self.urls) {
            (Some(u), None) => (vec![u], "url"),
            (None, Some(u)) if !u.is_empty() => (u.iter().collect(), "urls"),
            (None, Some(_)) => return Err(("urls".into(), "at least one URL is needed".into())),
            (None, None) => {
                return Err((
                    "url".into(),
                    "the registry's address is required: url or urls".into(),
                ))
            }
            (Some(_), Some(_)) => {
                return Err(("url and urls".into(), "give url or urls, not both".into()))
            }
        };
        let given: Vec<&str> = given.iter().map(|u| u.0.as_str()).collect();
        let keys = EndpointKeys {
            nodes: &given,
            key,
            username: self.username.as_deref(),
            password: (&self.password, &self.password_file),
            api_key: None,
            bearer_token: (&self.bearer_token, &self.bearer_token_file),
            ca_cert: self.ca_cert.as_deref(),
            tls_verify: self.tls_verify.as_deref(),
        };
        let endpoint = endpoint(keys, resolve, WORDING)?;
        let timeout = match self.request_timeout_ms {
            Some(0) => return Err(("request_timeout_ms".into(), "must be positive".into())),
            Some(ms) => Duration::from_millis(ms),
            None => TIMEOUT,
        };
        // A record may wait for its key's schema and then its value's: both lookups
        // together must end before a checkpoint that waits for them is declined.
        let most = checkpoint_timeout / 2;
        let retry_timeout = match self.retry_timeout_ms {
            Some(0) => return Err(("retry_timeout_ms".into(), "must be positive".into())),
            Some(ms) if Duration::from_millis(ms) >= most => {
                return Err((
                    "retry_timeout_ms".into(),
                    format!(
                        "{ms} ms is not less than half of checkpoint.timeout_ms ({} ms): a record waits for its key's schema and its value's, and a checkpoint waits with it",
                        checkpoint_timeout.as_millis()
                    ),
                ))
            }
            Some(ms) => Duration::from_millis(ms),
            None => Retry::default().timeout.min(checkpoint_timeout / 4),
        };
        Ok(RegistrySettings {
            endpoint,
            timeout: timeout.min(retry_timeout),
            retry: Retry {
                timeout: retry_timeout,
                ..Retry::default()
            },
        })
    }
}

impl RegistrySettings {
    /// A client of the registry with these settings. An error is `(key, message)`.
    pub fn client(&self) -> Result<RegistryClient, (String, String)> {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::ACCEPT,
            reqwest::header::HeaderValue::from_static(
                "application/vnd.schemaregistry.v1+json, application/json",
            ),
        );
        let http = reqwest_client(&self.endpoint, self.timeout, headers)?;
        if self.endpoint.tls_verify == TlsVerify::None {
            tracing::warn!(
                "the Schema Registry's certificate is not checked (tls_verify = \"none\")"
            );
        }
        Ok(
            RegistryClient::new(http, self.endpoint.nodes.clone(), self.retry)
                .with_request_timeout(self.timeout),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clients::http::Auth;

    fn settings(toml_text: &str) -> Result<RegistrySettings, (String, String)> {
        let s: RegistrySection =
            toml::from_str(toml_text).map_err(|e| ("".into(), e.to_string()))?;
        s.settings(|p| p.to_path_buf(), Duration::from_secs(60))
    }

    #[test]
    fn every_mistake_names_its_key() {
        let cases = [
            ("", "url"),
            ("urls = []", "urls"),
            ("url = \"a\"\nurls = [\"b\"]", "url and urls"),
            ("url = \"ftp://r\"", "url"),
            ("urls = [\"http://r\", \"nope\"]", "urls[1]"),
            ("url = \"http://r\"\nusername = \"u\"", "password"),
            ("url = \"http://r\"\npassword = \"p\"", "username"),
            (
                "url = \"http://r\"\npassword = \"p\"\npassword_file = \"f\"\nusername = \"u\"",
                "password and password_file",
            ),
            (
                "url = \"http://r\"\nbearer_token_file = \"/nonexistent/t\"",
                "bearer_token_file",
            ),
            (
                "url = \"http://r\"\nusername = \"u\"\npassword = \"p\"\nbearer_token = \"t\"",
                "username and bearer_token",
            ),
            ("url = \"http://u:p@r\"\nbearer_token = \"t\"", "url"),
            ("url = \"http://r\"\ntls_verify = \"maybe\"", "tls_verify"),
            (
                "url = \"http://r\"\ntls_verify = \"certificate\"",
                "tls_verify",
            ),
            (
                "url = \"http://r\"\nca_cert = \"/nonexistent/ca.pem\"",
                "ca_cert",
            ),
            (
                "url = \"http://r\"\nrequest_timeout_ms = 0",
                "request_timeout_ms",
            ),
        ];
        for (text, key) in cases {
            match settings(text) {
                Err((k, _)) => assert_eq!(k, key, "{text}"),
                Ok(s) => panic!("{text}: accepted as {s:?}"),
            }
        }
    }

    #[test]
    fn credential_and_tls_errors_keep_their_texts() {
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join("absent");
        let cases: &[(String, &str, String)] = &[
            (
                "url = \"http://u:p@r\"\nusername = \"x\"".into(),
                "password",
                "username needs a password (or password_file)".into(),
            ),
            (
                "url = \"http://u:p@r\"\nusername = \"x\"\npassword = \"y\"".into(),
                "url",
                "credentials in a URL and in the section's keys: keep one".into(),
            ),
            (
                "urls = [\"http://u:p@r-1\", \"http://u:q@r-2\"]".into(),
                "urls[1]",
                "the URLs carry different credentials".into(),
            ),
            (
                "url = \"http://r\"\nusername = \"u\"\npassword = \"p\"\nbearer_token = \"t\""
                    .into(),
                "username and bearer_token",
                "give one way to authenticate: username + password, or bearer_token".into(),
            ),
            (
                "url = \"http://r\"\ntls_verify = \"certificate\"".into(),
                "tls_verify",
                "\"certificate\" checks the chain up to ca_cert: give ca_cert".into(),
            ),
            (
                format!(
                    "url = \"http://r\"\nusername = \"u\"\npassword_file = {:?}",
                    absent.display().to_string()
                ),
                "password_file",
                format!(
                    "cannot read {}: No such file or directory (os error 2)",
                    absent.display()
                ),
            ),
        ];
        for (text, key, message) in cases {
            assert_eq!(
                settings(text).unwrap_err(),
                (key.to_string(), message.clone()),
                "{text}"
            );
        }
    }

    #[test]
    fn the_retry_time_fits_in_a_checkpoint() {
        let s = settings("url = \"http://r\"").unwrap();
        assert_eq!(
            s.retry.timeout,
            Duration::from_secs(15),
            "a quarter of 60 s"
        );
        let s =
            settings("url = \"http://r\"\nretry_timeout_ms = 29999\nrequest_timeout_ms = 40000")
                .unwrap();
        assert_eq!(s.retry.timeout, Duration::from_millis(29_999));
        assert_eq!(
            s.timeout,
            Duration::from_millis(29_999),
            "a request within the retry time"
        );
        let long: RegistrySection = toml::from_str("url = \"http://r\"").unwrap();
        let s = long
            .settings(|p| p.to_path_buf(), Duration::from_secs(600))
            .unwrap();
        assert_eq!(
            s.retry.timeout,
            Duration::from_secs(30),
            "at most 30 s by default"
        );
    }

    #[test]
    fn credentials_come_from_keys_or_the_url_and_never_show() {
        let s = settings("url = \"http://reader:s3cret@r:8081/\"").unwrap();
        assert_eq!(s.endpoint.nodes, vec!["http://r:8081".to_string()]);
        assert!(
            matches!(&s.endpoint.auth, Some(Auth::Basic { username, .. }) if username == "reader")
        );
        let s = settings("urls = [\"http://a\", \"http://b\"]\nbearer_token = \"tok3n\"").unwrap();
        assert_eq!(s.endpoint.nodes.len(), 2);
        let section: RegistrySection =
            toml::from_str("url = \"http://u:s3cret@r\"\npassword = \"pw-9\"").unwrap();
        for shown in [format!("{section:?}"), format!("{s:?}")] {
            assert!(
                !shown.contains("s3cret") && !shown.contains("pw-9") && !shown.contains("tok3n"),
                "{shown}"
            );
        }
    }
}
