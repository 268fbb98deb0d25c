//! What every HTTP client of lockgate shares: the credentials of a request ([`Auth`]),
//! how the server's certificate is checked ([`TlsVerify`], [`CaCert`]), node URLs
//! ([`parse_node`], [`cloud_node`]), what a refused request means ([`auth_refusal`],
//! [`auth_refusal_message`]) and how an error is printed with its causes
//! ([`error_chain`]).
//!
//! Every section that names an HTTP service reads its address, credentials and TLS keys
//! through one function ([`endpoint`], into an [`Endpoint`]), so a job file says them
//! one way and a mistake gets the same key and message wherever it is made. Secrets
//! stay [`Secret`]s until they become a header value marked sensitive; `Debug` of this
//! module's types never shows them.

use crate::secret::{redact_url, Secret};
use base64::Engine;
use elasticsearch::cert::Certificate;
use elasticsearch::http::Url;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The credentials sent with every request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// HTTP basic authentication.
    Basic { username: String, password: Secret },
    /// An Elasticsearch API key: `ID:KEY`, or the base64 encoding of it as the cluster
    /// hands it out.
    ApiKey(Secret),
    /// A bearer token (an OAuth2 or service-account token).
    Bearer(Secret),
}

impl Auth {
    /// The `Authorization` header value: `Basic ...`, `ApiKey <base64 of ID:KEY>` or
    /// `Bearer ...`. An API key that holds a `:` is `ID:KEY` and gets encoded; one
    /// without is taken as already encoded.
    pub fn header_value(&self) -> Secret {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        Secret::new(match self {
            Auth::Basic { username, password } => {
                format!(
                    "Basic {}",
                    b64(&format!("{username}:{}", password.expose()))
                )
            }
            Auth::ApiKey(k) if k.expose().contains(':') => format!("ApiKey {}", b64(k.expose())),
            Auth::ApiKey(k) => format!("ApiKey {}", k.expose()),
            Auth::Bearer(t) => format!("Bearer {}", t.expose()),
        })
    }
}

/// How the server's certificate is checked (`tls_verify`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsVerify {
    /// The chain up to a trusted CA (`ca_cert`, or the system's) and the host name.
    Full,
    /// The chain up to `ca_cert`, not the host name (a cluster whose certificates name
    /// other hosts than the ones the job connects to).
    Certificate,
    /// Nothing: anyone on the path can read and change every document. Logged as a
    /// warning at every start.
    None,
}

impl TlsVerify {
    /// Parses `full`, `certificate` or `none`.
    pub fn parse(s: &str) -> Result<TlsVerify, String> {
        match s {
            "full" => Ok(TlsVerify::Full),
            "certificate" => Ok(TlsVerify::Certificate),
            "none" => Ok(TlsVerify::None),
            other => Err(format!("`{other}` is not one of full, certificate, none")),
        }
    }
}

/// A CA certificate (PEM) read when the job file was loaded.
#[derive(Clone, PartialEq, Eq)]
pub struct CaCert {
    /// Where it was read from (for messages).
    pub path: PathBuf,
    /// The PEM text: one or more certificates.
    pub pem: Vec<u8>,
}

impl std::fmt::Debug for CaCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CaCert({}, {} bytes)",
            self.path.display(),
            self.pem.len()
        )
    }
}

impl CaCert {
    /// Reads and checks a PEM file: it must hold at least one certificate that the TLS
    /// library accepts.
    pub fn read(path: PathBuf) -> Result<CaCert, String> {
        let pem =
            std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
            return Err(format!("{} holds no PEM certificate", path.display()));
        }
        Certificate::from_pem(&pem)
            .map_err(|e| format!("{} is not a usable PEM certificate: {e}", path.display()))?;
        Ok(CaCert { path, pem })
    }
}

/// Parses a node URL: `http` or `https` with a host. Returns the URL without user info,
/// and the user info (user, password) if it had any. Errors never contain a password.
pub fn parse_node(s: &str) -> Result<(Url, Option<(String, Secret)>), String> {
    let shown = redact_url(s);
    let mut url = Url::parse(s).map_err(|e| format!("`{shown}` is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("`{shown}`: the scheme must be http or https"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("`{shown}` names no host"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!("`{shown}`: a node URL takes no query or fragment"));
    }
    let userinfo = if !url.username().is_empty() || url.password().is_some() {
        let user = percent_decode(url.username());
        let password = Secret::new(percent_decode(url.password().unwrap_or_default()));
        let _ = url.set_username("");
        let _ = url.set_password(None);
        Some((user, password))
    } else {
        None
    };
    Ok((url, userinfo))
}

/// `%XX` decoding of URL user info (invalid escapes are kept as written).
pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The node URL of a `cloud_id` (`<name>:<base64 of host$es-uuid$kibana-uuid>`).
pub fn cloud_node(cloud_id: &str) -> Result<String, String> {
    elasticsearch::http::transport::CloudId::parse(cloud_id)
        .map(|c| c.url.to_string())
        .map_err(|e| format!("not a cloud id: {e}"))
}

/// Whether a whole-request status is a refusal of the credentials: `Some("authentication
/// failed")` for 401, `Some("authorization failed")` for 403, `None` otherwise. Neither
/// is retried: the same credentials get the same answer, so the job fails at once
/// instead of sending request after request.
pub fn auth_refusal(status: Option<u16>) -> Option<&'static str> {
    match status {
        Some(401) => Some("authentication failed"),
        Some(403) => Some("authorization failed"),
        _ => None,
    }
}

/// The first paragraph of AWS's message: a refused signature's message goes on with
/// the canonical request AWS expected, whose signed headers include the session token,
/// which must never reach a log.
pub fn aws_message(m: &str) -> String {
    let first = m
        .split("\n\n")
        .next()
        .unwrap_or_default()
        .split("The Canonical String")
        .next()
        .unwrap_or_default();
    let mut out: String = first
        .lines()
        .filter(|l| !l.to_ascii_lowercase().contains("x-amz-security-token"))
        .collect::<Vec<_>>()
        .join(" ");
    if out.len() > 300 {
        let mut end = 300;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
    }
    out.trim().to_string()
}

/// What of a refused request's body is kept for its message: Elasticsearch's error
/// type and reason, or AWS's first paragraph (as JSON that
/// [`auth_refusal_message`] reads), else the first 500 bytes; read before anything is
/// cut, so that a long answer still names its error.
pub fn refusal_body(body: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let ty = v.pointer("/error/type");
    let reason = v.pointer("/error/reason");
    if ty.is_some() || reason.is_some() {
        return serde_json::json!({"error": {"type": ty, "reason": reason}}).to_string();
    }
    if let Some(m) = v.pointer("/message").and_then(|m| m.as_str()) {
        return serde_json::json!({ "message": aws_message(m) }).to_string();
    }
    String::from_utf8_lossy(&body[..body.len().min(500)]).into_owned()
}

/// The message of a refused request: what failed, at which node, and Elasticsearch's
/// own error type and reason (from its JSON body, if it has one).
pub fn auth_refusal_message(what: &str, node: &str, status: u16, body: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let ty = v.pointer("/error/type").and_then(|t| t.as_str());
    let reason = v.pointer("/error/reason").and_then(|t| t.as_str());
    // AWS answers a refused signature with `{"message": ...}`.
    let aws = v
        .pointer("/message")
        .and_then(|m| m.as_str())
        .map(aws_message);
    let detail = match (ty, reason, aws) {
        (Some(t), Some(r), _) => format!("{status} {t}: {r}"),
        (Some(t), None, _) => format!("{status} {t}"),
        (None, _, Some(m)) => format!("{status}: {m}"),
        _ => status.to_string(),
    };
    format!(
        "Elasticsearch {what} at node {} ({detail}); check the credentials of [sink.elasticsearch]",
        redact_url(node)
    )
}

/// Where an HTTP service is and how to reach it: what `[sink.elasticsearch]` and
/// `[source.kafka.schema_registry]` share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Base URLs of the nodes, without user info (credentials are in `auth`) and
    /// without a trailing `/`.
    pub nodes: Vec<String>,
    pub auth: Option<Auth>,
    pub ca_cert: Option<CaCert>,
    pub tls_verify: TlsVerify,
}

/// A secret's two keys: its value, or a file that holds it (`password`,
/// `password_file`).
pub type SecretKeys<'a> = (&'a Option<Secret>, &'a Option<PathBuf>);

/// The keys of a section that describe an endpoint, borrowed from its own serde struct
/// (each section keeps `deny_unknown_fields`, which `#[serde(flatten)]` would turn off).
#[derive(Debug, Clone, Copy)]
pub struct EndpointKeys<'a> {
    /// The node URLs as written (at least one), and the key that gave them: `urls`
    /// (a node's errors then name `urls[i]`), or the one key of a single node (`url`).
    pub nodes: &'a [&'a str],
    pub key: &'a str,
    pub username: Option<&'a str>,
    pub password: SecretKeys<'a>,
    /// `None`: the service takes no API key (the section has no such keys).
    pub api_key: Option<SecretKeys<'a>>,
    pub bearer_token: SecretKeys<'a>,
    pub ca_cert: Option<&'a Path>,
    pub tls_verify: Option<&'a str>,
}

/// The words in which the errors of two sections differ, kept as each section says
/// them.
#[derive(Debug, Clone, Copy)]
pub struct Wording {
    /// What the node URLs are called in "the {urls} carry different credentials".
    pub urls: &'static str,
    /// The error of `tls_verify = "certificate"` without `ca_cert`; `None`: the section
    /// checks it itself, after keys of its own.
    pub certificate_without_ca: Option<&'static str>,
}

/// Checks an endpoint's keys and reads every file they name now (`*_file` secrets and
/// `ca_cert`, resolved by `resolve`): a mistake is an error naming its key, not a
/// failure at the first request. User info in the node URLs becomes basic credentials
/// (all of them must carry the same, and no key may give others). The error is
/// `(key, message)`, the key relative to the section; no message holds a secret.
pub fn endpoint(
    keys: EndpointKeys<'_>,
    resolve: impl Fn(&Path) -> PathBuf,
    wording: Wording,
) -> Result<Endpoint, (String, String)> {
    let mut nodes = Vec::with_capacity(keys.nodes.len());
    let mut from_urls: Option<(String, Secret)> = None;
    for (i, n) in keys.nodes.iter().enumerate() {
        let name = if keys.key == "urls" {
            format!("urls[{i}]")
        } else {
            keys.key.to_string()
        };
        let (url, info) = parse_node(n).map_err(|m| (name.clone(), m))?;
        if let Some(info) = info {
            if from_urls.as_ref().is_some_and(|prev| *prev != info) {
                return Err((
                    name,
                    format!("the {} carry different credentials", wording.urls),
                ));
            }
            from_urls = Some(info);
        }
        nodes.push(url.as_str().trim_end_matches('/').to_string());
    }
    let secret = |(value, file): SecretKeys<'_>, key: &str| {
        crate::secret::secret_or_file(value, file, key, &resolve)
    };
    let password = secret(keys.password, "password")?;
    let api_key = match keys.api_key {
        Some(k) => secret(k, "api_key")?,
        None => None,
    };
    let bearer = secret(keys.bearer_token, "bearer_token")?;
    let mut auth = match (keys.username, password, api_key, bearer) {
        (None, None, None, None) => None,
        (Some(u), Some(p), None, None) => Some(Auth::Basic {
            username: u.to_string(),
            password: p,
        }),
        (Some(_), None, None, None) => {
            return Err((
                "password".into(),
                "username needs a password (or password_file)".into(),
            ))
        }
        (None, Some(_), None, None) => {
            return Err(("username".into(), "password needs a username".into()))
        }
        (None, None, Some(k), None) => Some(Auth::ApiKey(k)),
        (None, None, None, Some(t)) => Some(Auth::Bearer(t)),
        _ if keys.api_key.is_some() => {
            return Err((
                "username, api_key and bearer_token".into(),
                "give one way to authenticate: username + password, api_key or bearer_token".into(),
            ))
        }
        _ => {
            return Err((
                "username and bearer_token".into(),
                "give one way to authenticate: username + password, or bearer_token".into(),
            ))
        }
    };
    if let Some((username, password)) = from_urls {
        if auth.is_some() {
            return Err((
                keys.key.into(),
                "credentials in a URL and in the section's keys: keep one".into(),
            ));
        }
        auth = Some(Auth::Basic { username, password });
    }
    let tls_verify = match keys.tls_verify {
        Some(v) => TlsVerify::parse(v).map_err(|m| ("tls_verify".to_string(), m))?,
        None => TlsVerify::Full,
    };
    let ca_cert = match keys.ca_cert {
        Some(p) => Some(CaCert::read(resolve(p)).map_err(|m| ("ca_cert".to_string(), m))?),
        None => None,
    };
    if let Some(m) = wording.certificate_without_ca {
        if tls_verify == TlsVerify::Certificate && ca_cert.is_none() {
            return Err(("tls_verify".into(), m.into()));
        }
    }
    Ok(Endpoint {
        nodes,
        auth,
        ca_cert,
        tls_verify,
    })
}

/// A `reqwest` client for `e`: requests time out after `timeout` (connecting
/// included), carry `headers` and `e`'s credentials (`Authorization`, marked sensitive
/// so that the client never prints it), and trust `e`'s CA besides the system's; the
/// host name is not checked with `tls_verify = "certificate"`, nothing is with
/// `"none"` (the caller warns). Building it contacts no one. The error is
/// `(key, message)`: the key whose value a header cannot carry, `ca_cert`, or empty.
pub fn reqwest_client(
    e: &Endpoint,
    timeout: Duration,
    mut headers: reqwest::header::HeaderMap,
) -> Result<reqwest::Client, (String, String)> {
    if let Some(auth) = &e.auth {
        let key = match auth {
            Auth::Basic { .. } => "password",
            Auth::ApiKey(_) => "api_key",
            Auth::Bearer(_) => "bearer_token",
        };
        let mut v =
            reqwest::header::HeaderValue::from_str(auth.header_value().expose()).map_err(|_| {
                (
                    key.to_string(),
                    "holds characters an HTTP header cannot carry".to_string(),
                )
            })?;
        v.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, v);
    }
    let mut b = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .default_headers(headers);
    let certs = |ca: &CaCert| {
        reqwest::Certificate::from_pem_bundle(&ca.pem).map_err(|err| {
            (
                "ca_cert".to_string(),
                format!("{}: {err}", ca.path.display()),
            )
        })
    };
    match (&e.ca_cert, e.tls_verify) {
        (_, TlsVerify::None) => b = b.danger_accept_invalid_certs(true),
        (Some(ca), verify) => {
            for c in certs(ca)? {
                b = b.add_root_certificate(c);
            }
            if verify == TlsVerify::Certificate {
                b = b.danger_accept_invalid_hostnames(true);
            }
        }
        (None, _) => {}
    }
    b.build()
        .map_err(|err| (String::new(), format!("HTTP client: {err}")))
}

/// An error with its causes, on one line (`error sending request: ...: certificate
/// verify failed`): an HTTP client's own message names only the URL, the cause is what
/// a person needs. A cause whose text the message already holds is not repeated.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cause = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_refusals_table() {
        let cases = [
            (Some(401), Some("authentication failed")),
            (Some(403), Some("authorization failed")),
            (Some(400), None),
            (Some(429), None),
            (Some(503), None),
            (Some(200), None),
            (None, None),
        ];
        for (status, want) in cases {
            assert_eq!(auth_refusal(status), want, "{status:?}");
        }
    }

    #[test]
    fn a_refusal_message_names_the_node_and_the_failure() {
        let body = br#"{"error":{"type":"security_exception","reason":"unable to authenticate user [u]"},"status":401}"#;
        let m = auth_refusal_message("authentication failed", "https://es-2:9200", 401, body);
        assert!(m.contains("authentication failed"), "{m}");
        assert!(m.contains("https://es-2:9200"), "{m}");
        assert!(m.contains("security_exception"), "{m}");
        let aws = serde_json::json!({"message": "The request signature we calculated does not match the signature you provided. Check your AWS Secret Access Key.\n\nThe Canonical String for this request should have been\n'POST\n/_bulk\n\nhost:x\nx-amz-security-token:FQoTOKEN-never-printed\n'\n"});
        let kept = refusal_body(aws.to_string().as_bytes());
        let m = auth_refusal_message("authorization failed", "http://x:1", 403, kept.as_bytes());
        assert!(
            m.contains("403: The request signature we calculated does not match"),
            "{m}"
        );
        assert!(!m.contains("FQoTOKEN") && !m.contains("Canonical"), "{m}");
        let long = serde_json::json!({"error": {"type": "security_exception", "reason": "x".repeat(600)}, "pad": "y".repeat(2000)});
        let kept = refusal_body(long.to_string().as_bytes());
        assert!(
            kept.contains("security_exception"),
            "parsed before it is cut"
        );
        let m = auth_refusal_message("authorization failed", "http://x:1", 403, b"not json");
        assert!(
            m.contains("authorization failed at node http://x:1 (403)"),
            "{m}"
        );
    }

    #[test]
    fn authorization_headers() {
        let basic = Auth::Basic {
            username: "elastic".into(),
            password: Secret::new("changeme"),
        };
        // base64("elastic:changeme")
        assert_eq!(
            basic.header_value().expose(),
            "Basic ZWxhc3RpYzpjaGFuZ2VtZQ=="
        );
        // base64("id:key"); an encoded key is sent as given.
        assert_eq!(
            Auth::ApiKey(Secret::new("id:key")).header_value().expose(),
            "ApiKey aWQ6a2V5"
        );
        assert_eq!(
            Auth::ApiKey(Secret::new("aWQ6a2V5"))
                .header_value()
                .expose(),
            "ApiKey aWQ6a2V5"
        );
        assert_eq!(
            Auth::Bearer(Secret::new("t0k")).header_value().expose(),
            "Bearer t0k"
        );
        assert!(!format!("{basic:?}").contains("changeme"));
    }

    #[test]
    fn node_urls() {
        let (u, info) = parse_node("https://user:p%40ss@es-1:9200").unwrap();
        assert_eq!(u.as_str(), "https://es-1:9200/");
        let (user, pw) = info.unwrap();
        assert_eq!((user.as_str(), pw.expose()), ("user", "p@ss"));
        assert!(parse_node("http://127.0.0.1:9200").unwrap().1.is_none());
        for bad in [
            "es-1:9200",
            "ftp://es-1",
            "https://:pw@:9200",
            "http://es:9200/?x=1",
            "https://user:secretpw@es:99999",
        ] {
            let e = parse_node(bad).unwrap_err();
            assert!(!e.contains("secretpw"), "{e}");
        }
    }

    #[derive(Debug)]
    struct E(&'static str, Option<Box<E>>);
    impl std::fmt::Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for E {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn an_error_names_its_causes_once() {
        let e = E(
            "error sending request",
            Some(Box::new(E(
                "client error (Connect)",
                Some(Box::new(E("certificate verify failed", None))),
            ))),
        );
        assert_eq!(
            error_chain(&e),
            "error sending request: client error (Connect): certificate verify failed"
        );
        // A cause its parent already repeats is not repeated.
        let e = E(
            "timed out: operation timed out",
            Some(Box::new(E("operation timed out", None))),
        );
        assert_eq!(error_chain(&e), "timed out: operation timed out");
    }
}
