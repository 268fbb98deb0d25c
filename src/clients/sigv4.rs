//! AWS Signature Version 4 for Amazon OpenSearch Service (`es`) and OpenSearch
//! Serverless (`aoss`): every request the sink (and `lockgate chaos`) sends is signed
//! with AWS's own signer (`aws-sigv4`), with credentials from AWS's standard chain
//! (`aws-config`: environment, shared profile files with `credential_process` and
//! assume-role, web identity token for EKS, ECS, IMDS).
//!
//! A signature covers the exact bytes sent, so a signed request's body is compressed
//! here (not by the HTTP client, which would compress after signing) and its query is
//! part of the path signed. Credentials are cached and fetched again before they expire
//! (half their remaining life, at most five minutes, ahead), one fetch at a time; a
//! failed fetch keeps the old credentials while they are valid. `Credentials` print
//! their secret as redacted, and the signed headers that carry secrets are marked
//! sensitive, so neither reaches a log.

use super::http::error_chain;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    sign, PayloadChecksumKind, SignableBody, SignableRequest, SigningSettings,
};
use aws_sigv4::sign::v4;
use std::sync::RwLock;
use std::time::{Duration, SystemTime};

/// Credentials are never fetched again sooner than this after a fetch (a source that
/// answers credentials about to expire is not asked in a loop).
const MIN_REFRESH_INTERVAL: Duration = Duration::from_secs(1);
/// At most this long before they expire are credentials fetched again.
const MAX_REFRESH_AHEAD: Duration = Duration::from_secs(5 * 60);
/// Credentials without an expiry (environment, a static profile) are asked for again
/// this often (the chain reads the profile files once: a key rotated in them needs a
/// restart).
const NO_EXPIRY_TTL: Duration = Duration::from_secs(15 * 60);
/// After a failed fetch, the previous credentials sign for this long before the next
/// fetch is tried (a source that is down is not asked at every request).
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(5);
/// Credentials closer than this to their expiry (at most a quarter of their life) are
/// not used: a request signed with them could arrive after it.
const EXPIRY_MARGIN: Duration = Duration::from_secs(10);
/// How long one fetch (STS, IMDS, `credential_process`) may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);

/// `aws_sigv4 = { region, service }`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AwsSigV4 {
    /// The domain's or collection's region (`eu-west-1`).
    pub region: String,
    /// `es` (Amazon OpenSearch Service) or `aoss` (OpenSearch Serverless).
    #[serde(default = "default_service")]
    pub service: String,
}

fn default_service() -> String {
    "es".into()
}

impl AwsSigV4 {
    /// Checks the region and the service; the error is `(key, message)` below
    /// `aws_sigv4`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if !matches!(self.service.as_str(), "es" | "aoss") {
            return Err((
                "service".into(),
                format!(
                    "`{}` is not one of es (Amazon OpenSearch Service), aoss (OpenSearch Serverless)",
                    self.service
                ),
            ));
        }
        let valid = !self.region.is_empty()
            && self
                .region
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !valid {
            return Err((
                "region".into(),
                format!("`{}` is not an AWS region (such as eu-west-1)", self.region),
            ));
        }
        Ok(())
    }
}

/// The headers that sign a request: `authorization`, `x-amz-date`,
/// `x-amz-content-sha256` and, with temporary credentials, `x-amz-security-token`;
/// `sensitive` marks those that carry a secret (`Debug` does not print them).
#[derive(Clone, PartialEq, Eq)]
pub struct SignedHeader {
    pub name: &'static str,
    pub value: String,
    pub sensitive: bool,
}

impl std::fmt::Debug for SignedHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let value = if self.sensitive {
            "** redacted **"
        } else {
            &self.value
        };
        f.debug_struct("SignedHeader")
            .field("name", &self.name)
            .field("value", &value)
            .finish()
    }
}

/// Signs `method url` (the URL as sent: the path byte for byte, the query in any
/// encoding that decodes to the same pairs) with `headers` (those sent that the
/// signature should cover; `host` comes from the URL) and the exact body bytes sent,
/// at `time`.
#[allow(clippy::too_many_arguments)]
pub fn sign_request(
    credentials: &Credentials,
    region: &str,
    service: &str,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    time: SystemTime,
) -> Result<Vec<SignedHeader>, String> {
    let identity = credentials.clone().into();
    let mut settings = SigningSettings::default();
    // OpenSearch Serverless requires the payload's hash as a header; it is signed.
    settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service)
        .time(time)
        .settings(settings)
        .build()
        .map_err(|e| format!("AWS signing parameters: {e}"))?
        .into();
    let request = SignableRequest::new(
        method,
        url,
        headers.iter().copied(),
        SignableBody::Bytes(body),
    )
    .map_err(|e| {
        format!(
            "AWS signature of {method} {}: {e}",
            crate::secret::redact_url(url)
        )
    })?;
    let (instructions, _signature) = sign(request, &params)
        .map_err(|e| {
            format!(
                "AWS signature of {method} {}: {e}",
                crate::secret::redact_url(url)
            )
        })?
        .into_parts();
    let (signed, _query) = instructions.into_parts();
    Ok(signed
        .into_iter()
        .map(|h| SignedHeader {
            name: h.name(),
            value: h.value().to_owned(),
            // The signature is no key, but it authorizes its request for minutes.
            sensitive: h.sensitive() || h.name() == "authorization",
        })
        .collect())
}

/// Whether credentials expiring at `expiry` may still sign at `now`: not within the
/// margin of their expiry (a quarter of `life`, at most [`EXPIRY_MARGIN`]).
pub fn usable(now: SystemTime, expiry: Option<SystemTime>, life: Duration) -> bool {
    match expiry {
        None => true,
        Some(exp) => now + (life / 4).min(EXPIRY_MARGIN) < exp,
    }
}

/// When credentials fetched at `now` that expire at `expiry` are fetched again.
pub fn refresh_at(now: SystemTime, expiry: Option<SystemTime>) -> SystemTime {
    let Some(expiry) = expiry else {
        return now + NO_EXPIRY_TTL;
    };
    let life = expiry.duration_since(now).unwrap_or_default();
    let ahead = (life / 2).min(MAX_REFRESH_AHEAD);
    (expiry - ahead).max(now + MIN_REFRESH_INTERVAL.min(life))
}

/// Signs requests for one `aws_sigv4` setting.
#[derive(Debug)]
pub struct Signer {
    region: String,
    service: String,
    provider: tokio::sync::OnceCell<SharedCredentialsProvider>,
    /// Overrides the chain (tests, and the Rust API).
    fixed: Option<SharedCredentialsProvider>,
    /// The credentials, when they are fetched again, and their life when fetched.
    current: RwLock<Option<(Credentials, SystemTime, Duration)>>,
    fetching: tokio::sync::Mutex<()>,
}

impl Signer {
    /// A signer with credentials from AWS's standard chain (built at the first request).
    pub fn new(cfg: &AwsSigV4) -> Signer {
        Signer {
            region: cfg.region.clone(),
            service: cfg.service.clone(),
            provider: tokio::sync::OnceCell::new(),
            fixed: None,
            current: RwLock::new(None),
            fetching: tokio::sync::Mutex::new(()),
        }
    }

    /// The process's signer of `cfg`: one per setting, so that the sink subtasks of a
    /// job share its credentials (one fetch per refresh, not one per subtask).
    pub fn shared(cfg: &AwsSigV4) -> std::sync::Arc<Signer> {
        use std::collections::HashMap;
        use std::sync::{Arc, Mutex, OnceLock, Weak};
        type Signers = Mutex<HashMap<(String, String), Weak<Signer>>>;
        static SIGNERS: OnceLock<Signers> = OnceLock::new();
        let mut signers = SIGNERS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let key = (cfg.region.clone(), cfg.service.clone());
        if let Some(s) = signers.get(&key).and_then(Weak::upgrade) {
            return s;
        }
        let s = Arc::new(Signer::new(cfg));
        signers.retain(|_, w| w.strong_count() > 0);
        signers.insert(key, Arc::downgrade(&s));
        s
    }

    /// A signer with credentials from `provider` instead of the standard chain.
    pub fn with_provider(cfg: &AwsSigV4, provider: SharedCredentialsProvider) -> Signer {
        Signer {
            fixed: Some(provider),
            ..Signer::new(cfg)
        }
    }

    async fn provider(&self) -> &SharedCredentialsProvider {
        if let Some(p) = &self.fixed {
            return p;
        }
        self.provider
            .get_or_init(|| standard_chain(&self.region))
            .await
    }

    fn fresh(&self, now: SystemTime) -> Option<Credentials> {
        match &*self.current.read().unwrap_or_else(|e| e.into_inner()) {
            Some((c, at, life)) if now < *at && usable(now, c.expiry(), *life) => Some(c.clone()),
            _ => None,
        }
    }

    /// Forgets the cached credentials (AWS answered that they expired): the next
    /// request fetches new ones.
    pub fn invalidate(&self) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// The credentials to sign with now: the cached ones until their refresh time.
    pub async fn credentials(&self) -> Result<Credentials, String> {
        if let Some(c) = self.fresh(SystemTime::now()) {
            return Ok(c);
        }
        let _one = self.fetching.lock().await;
        let now = SystemTime::now();
        if let Some(c) = self.fresh(now) {
            return Ok(c);
        }
        let provider = self.provider().await;
        let fetched =
            match tokio::time::timeout(FETCH_TIMEOUT, provider.provide_credentials()).await {
                Ok(r) => r,
                Err(_) => Err(CredentialsError::provider_timed_out(FETCH_TIMEOUT)),
            };
        // A fetch may take long: what is usable is decided after it.
        let now = SystemTime::now();
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        match fetched {
            Ok(c) => {
                let life = c
                    .expiry()
                    .and_then(|e| e.duration_since(now).ok())
                    .unwrap_or(Duration::MAX);
                let at = refresh_at(now, c.expiry());
                tracing::debug!(expires = ?c.expiry(), refresh = ?at, "AWS credentials fetched");
                *current = Some((c.clone(), at, life));
                Ok(c)
            }
            Err(e) => match current.take() {
                Some((c, _, life)) if usable(now, c.expiry(), life) => {
                    tracing::warn!(error = %error_chain(&e), "fetching AWS credentials failed; signing with the previous ones until they expire");
                    let retry = now + RETRY_AFTER_FAILURE;
                    *current = Some((c.clone(), retry, life));
                    Ok(c)
                }
                _ => Err(format!(
                    "no AWS credentials for aws_sigv4 (from the environment, the shared profile, a web identity token or the instance): {}",
                    error_chain(&e)
                )),
            },
        }
    }

    /// The headers that sign `method url` with `headers` and `body`, now.
    pub async fn sign(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Vec<SignedHeader>, String> {
        let credentials = self.credentials().await?;
        sign_request(
            &credentials,
            &self.region,
            &self.service,
            method,
            url,
            headers,
            body,
            SystemTime::now(),
        )
    }

    /// [`Signer::sign`] as a header map for the HTTP client, secrets marked sensitive.
    pub async fn header_map(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<reqwest::header::HeaderMap, String> {
        to_header_map(self.sign(method, url, headers, body).await?)
    }
}

/// Signed headers as a header map, secrets marked sensitive.
pub fn to_header_map(signed: Vec<SignedHeader>) -> Result<reqwest::header::HeaderMap, String> {
    let mut map = reqwest::header::HeaderMap::new();
    for h in signed {
        let mut v = reqwest::header::HeaderValue::from_str(&h.value)
            .map_err(|_| format!("signed header {} is not a header value", h.name))?;
        v.set_sensitive(h.sensitive);
        map.insert(reqwest::header::HeaderName::from_static(h.name), v);
    }
    Ok(map)
}

/// How requests to one node are signed: its signer, the node's URL (requests go to
/// paths below it, as the HTTP client joins them) and whether bodies are gzipped.
#[derive(Debug, Clone)]
pub struct SignedNode {
    pub signer: std::sync::Arc<Signer>,
    pub base: reqwest::Url,
    pub gzip: bool,
}

/// A request ready to be sent signed: the path with its query (given to the client as
/// the path, so that what is sent is what was signed), the headers, the body as sent.
#[derive(Debug)]
pub struct SignedRequest {
    /// The path and query to give the Elasticsearch client (which joins it below the
    /// node's URL).
    pub path: String,
    /// The whole URL signed (for a client given whole URLs).
    pub url: String,
    pub headers: reqwest::header::HeaderMap,
    pub body: Option<Vec<u8>>,
}

impl SignedNode {
    /// The signing of requests to `node` by `signer` (gzip: `compression = "gzip"`).
    pub fn new(
        signer: std::sync::Arc<Signer>,
        node: &str,
        gzip: bool,
    ) -> Result<SignedNode, String> {
        let (mut base, _) = super::http::parse_node(node)?;
        // As the client's connection keeps it: paths are joined below the node's path.
        if !base.path().ends_with('/') {
            base.set_path(&format!("{}/", base.path()));
        }
        Ok(SignedNode { signer, base, gzip })
    }

    /// Signs `method path?query` with `body` (compressed first when the node's bodies
    /// are).
    pub async fn sign(
        &self,
        method: &str,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Result<SignedRequest, String> {
        // As the client makes the URL: the path joined to the node's URL.
        let mut url = self
            .base
            .join(path.trim_start_matches('/'))
            .map_err(|e| format!("{path}: {e}"))?;
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        let bare = path.split('?').next().unwrap_or_default();
        let path_and_query = match url.query() {
            Some(q) => format!("{bare}?{q}"),
            None => bare.to_string(),
        };
        let body = body.map(|b| body_as_sent(b, self.gzip)).transpose()?;
        let mut signed: Vec<(&str, &str)> = vec![("content-type", "application/json")];
        if self.gzip && body.is_some() {
            signed.push(("content-encoding", "gzip"));
        }
        let mut headers = self
            .signer
            .header_map(
                method,
                url.as_str(),
                &signed,
                body.as_deref().unwrap_or_default(),
            )
            .await?;
        for (name, value) in signed {
            headers.insert(
                reqwest::header::HeaderName::from_static(name),
                reqwest::header::HeaderValue::from_static(value),
            );
        }
        Ok(SignedRequest {
            path: path_and_query,
            url: url.to_string(),
            headers,
            body,
        })
    }
}

/// AWS's standard credential chain, its STS and IMDS requests through rustls.
async fn standard_chain(region: &str) -> SharedCredentialsProvider {
    use aws_config::default_provider::credentials::DefaultCredentialsChain;
    use aws_config::provider_config::ProviderConfig;
    use aws_config::Region;
    use aws_smithy_http_client::tls;
    let http_client = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https();
    let conf = ProviderConfig::default()
        .with_http_client(http_client)
        .with_region(Some(Region::new(region.to_owned())));
    let chain = DefaultCredentialsChain::builder()
        .configure(conf)
        .region(Region::new(region.to_owned()))
        .build()
        .await;
    SharedCredentialsProvider::new(chain)
}

/// The body a signed request sends: `body`, gzip-compressed when `gzip`.
pub fn body_as_sent(body: &[u8], gzip: bool) -> Result<Vec<u8>, String> {
    if !gzip {
        return Ok(body.to_vec());
    }
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(body)
        .and_then(|_| e.finish())
        .map_err(|e| format!("gzip: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(s)
    }

    /// AWS's published Signature Version 4 test suite, `get-vanilla`: the signature
    /// of `GET /` to example.amazonaws.com at 2015-08-30T12:36:00Z.
    #[test]
    fn the_signature_of_aws_test_vector_get_vanilla() {
        let creds = Credentials::new(
            "AKIDEXAMPLE",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            None,
            None,
            "test",
        );
        let identity = creds.into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region("us-east-1")
            .name("service")
            .time(at(1_440_938_160))
            .settings(SigningSettings::default())
            .build()
            .unwrap()
            .into();
        let request = SignableRequest::new(
            "GET",
            "https://example.amazonaws.com/",
            std::iter::empty(),
            SignableBody::Bytes(b""),
        )
        .unwrap();
        let (_, signature) = sign(request, &params).unwrap().into_parts();
        assert_eq!(
            signature,
            "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        );
    }

    #[test]
    fn signed_headers_cover_the_body_and_mark_secrets() {
        let creds = Credentials::new(
            "AKID",
            "s3cr3t-value",
            Some("t0ken-value".into()),
            None,
            "test",
        );
        let h = sign_request(
            &creds,
            "eu-west-1",
            "aoss",
            "POST",
            "https://c.eu-west-1.aoss.amazonaws.com/_bulk?filter_path=errors",
            &[("content-type", "application/json")],
            b"{}\n",
            at(1_772_874_302),
        )
        .unwrap();
        let get = |n: &str| h.iter().find(|x| x.name == n).unwrap();
        assert!(get("authorization").sensitive);
        assert!(get("authorization")
            .value
            .contains("Credential=AKID/20260307/eu-west-1/aoss/aws4_request"));
        assert!(get("authorization").value.contains(
            "SignedHeaders=content-type;host;x-amz-content-sha256;x-amz-date;x-amz-security-token"
        ));
        assert!(get("x-amz-security-token").sensitive);
        assert_eq!(get("x-amz-date").value, "20260307T090502Z");
        // SHA-256 of "{}\n".
        assert_eq!(
            get("x-amz-content-sha256").value,
            "ca3d163bab055381827226140568f3bef7eaac187cebd76878e0b63e9e442356"
        );
        let shown = format!("{creds:?}");
        assert!(
            !shown.contains("s3cr3t-value") && !shown.contains("t0ken-value"),
            "the secret and the token never print: {shown}"
        );
    }

    #[test]
    fn credentials_are_fetched_again_before_they_expire() {
        let now = at(1_000_000);
        assert_eq!(refresh_at(now, None), now + NO_EXPIRY_TTL);
        // An hour left: five minutes ahead.
        assert_eq!(
            refresh_at(now, Some(now + Duration::from_secs(3600))),
            now + Duration::from_secs(3300)
        );
        // Thirty seconds left: half of it.
        assert_eq!(
            refresh_at(now, Some(now + Duration::from_secs(30))),
            now + Duration::from_secs(15)
        );
        // Already expired or about to: no sooner than a second from now (or expiry).
        assert_eq!(refresh_at(now, Some(now)), now);
        assert_eq!(
            refresh_at(now, Some(now + Duration::from_millis(1500))),
            now + Duration::from_secs(1)
        );
    }

    #[tokio::test]
    async fn a_request_is_signed_for_the_url_the_client_makes() {
        use aws_credential_types::provider::SharedCredentialsProvider;
        let cfg = AwsSigV4 {
            region: "eu-west-1".into(),
            service: "es".into(),
        };
        let creds = Credentials::new("AKID", "secret", None, None, "test");
        let signer = std::sync::Arc::new(Signer::with_provider(
            &cfg,
            SharedCredentialsProvider::new(creds),
        ));
        let node = SignedNode::new(
            signer,
            "https://search-x.eu-west-1.es.amazonaws.com/prefix",
            true,
        )
        .unwrap();
        let r = node
            .sign(
                "POST",
                "/_bulk",
                &[("filter_path", "errors,items.*.status")],
                Some(b"{}\n"),
            )
            .await
            .unwrap();
        assert_eq!(r.path, "/_bulk?filter_path=errors%2Citems.*.status");
        assert_eq!(
            r.url,
            "https://search-x.eu-west-1.es.amazonaws.com/prefix/_bulk?filter_path=errors%2Citems.*.status"
        );
        assert_eq!(r.headers["content-encoding"], "gzip");
        assert!(r.headers["authorization"].is_sensitive());
        assert!(r.headers["authorization"].to_str().unwrap().contains(
            "SignedHeaders=content-encoding;content-type;host;x-amz-content-sha256;x-amz-date"
        ));
        let body = r.body.unwrap();
        assert_eq!(
            &body[..2],
            b"\x1f\x8b",
            "gzip: the compressed bytes are signed and sent"
        );
    }

    #[test]
    fn credentials_near_their_expiry_do_not_sign() {
        let now = at(1_000_000);
        let life = Duration::from_secs(3600);
        assert!(usable(now, None, life));
        assert!(usable(now, Some(now + Duration::from_secs(11)), life));
        assert!(!usable(now, Some(now + Duration::from_secs(10)), life));
        assert!(!usable(now, Some(now), life));
        // Short-lived credentials: a quarter of their life.
        let short = Duration::from_secs(8);
        assert!(usable(now, Some(now + Duration::from_secs(3)), short));
        assert!(!usable(now, Some(now + Duration::from_secs(2)), short));
        let h = SignedHeader {
            name: "x-amz-security-token",
            value: "t0ken-value".into(),
            sensitive: true,
        };
        assert!(!format!("{h:?}").contains("t0ken-value"));
    }

    #[test]
    fn a_gzip_body_is_what_is_signed_and_sent() {
        let sent = body_as_sent(b"{\"a\":1}\n", true).unwrap();
        let mut d = flate2::read::GzDecoder::new(&sent[..]);
        let mut back = String::new();
        std::io::Read::read_to_string(&mut d, &mut back).unwrap();
        assert_eq!(back, "{\"a\":1}\n");
        assert_eq!(body_as_sent(b"x", false).unwrap(), b"x");
    }
}
