//! How the sink reaches Elasticsearch: its nodes (`url`, `urls` or `cloud_id`), the
//! credentials, TLS settings, compression and extra headers of every request. The
//! pieces every HTTP client shares (credentials, TLS, node URLs, what a refused request
//! means) are in [`crate::clients::http`]; the AWS signature in [`crate::clients::sigv4`].
//!
//! One description ([`EsConnection`]) builds every client that talks to the cluster: the
//! sink's per-node transports ([`EsConnection::transport`]) and, in the chaos harness,
//! the verifier's HTTP client, both from [`EsConnection::node_headers`] and
//! [`EsConnection::tls`]. Secrets stay [`Secret`]s until they become a header value
//! marked sensitive; `Debug` of this module's types never shows them.

use crate::clients::http::{parse_node, Auth, CaCert, TlsVerify};
use crate::clients::sigv4::{AwsSigV4, SignedNode, Signer};
use crate::secret::{redact_url, Secret};
use elasticsearch::cert::{Certificate, CertificateValidation};
use elasticsearch::http::headers::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION};
use elasticsearch::http::transport::{SingleNodeConnectionPool, Transport, TransportBuilder};
use std::collections::BTreeMap;
use std::time::Duration;

/// Everything needed to reach the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EsConnection {
    /// Base URLs of the nodes, without user info (credentials are in `auth`). Requests
    /// go round robin; a node that refused a connection is skipped for a while
    /// ([`crate::kits::bulk::nodes::NodeSelector`]).
    pub nodes: Vec<String>,
    pub auth: Option<Auth>,
    pub ca_cert: Option<CaCert>,
    pub tls_verify: TlsVerify,
    /// Gzip request bodies (`compression = "gzip"`).
    pub gzip: bool,
    /// Extra headers of every request; values are secrets (they may carry tokens).
    pub headers: BTreeMap<String, Secret>,
    /// Sign every request with AWS Signature Version 4 (Amazon OpenSearch Service or
    /// Serverless), credentials from the standard AWS chain.
    pub aws_sigv4: Option<AwsSigV4>,
}

impl EsConnection {
    /// One node, no credentials, full TLS verification against the system's CAs.
    pub fn single(url: impl Into<String>) -> EsConnection {
        EsConnection {
            nodes: vec![url.into()],
            auth: None,
            ca_cert: None,
            tls_verify: TlsVerify::Full,
            gzip: false,
            headers: BTreeMap::new(),
            aws_sigv4: None,
        }
    }

    /// The first node's URL (the one tools that read the index back use first).
    pub fn first_node(&self) -> &str {
        self.nodes.first().map(String::as_str).unwrap_or_default()
    }

    /// The headers of every request: `Authorization` (marked sensitive, so the HTTP
    /// library never prints it) and the extra headers.
    pub fn header_map(&self) -> Result<HeaderMap, String> {
        let mut map = HeaderMap::new();
        for (name, value) in &self.headers {
            let n = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("`{name}` is not a valid header name"))?;
            let mut v = HeaderValue::from_str(value.expose())
                .map_err(|_| format!("the value of header `{name}` is not a valid header value"))?;
            v.set_sensitive(true);
            map.insert(n, v);
        }
        if let Some(auth) = &self.auth {
            let mut v = HeaderValue::from_str(auth.header_value().expose())
                .map_err(|_| "the credentials hold characters a header cannot carry".to_string())?;
            v.set_sensitive(true);
            map.insert(AUTHORIZATION, v);
        }
        Ok(map)
    }

    /// The TLS settings: the CA to trust (if any) and how much to check.
    pub fn tls(&self) -> (Option<&CaCert>, TlsVerify) {
        (self.ca_cert.as_ref(), self.tls_verify)
    }

    /// Checks what can be checked without a network: every node URL, the headers, and
    /// that `tls_verify = "certificate"` has a CA to verify against. The error is
    /// `(key, message)`; a node's key is `urls[i]`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.nodes.is_empty() {
            return Err(("urls".into(), "at least one node URL is needed".into()));
        }
        for (i, n) in self.nodes.iter().enumerate() {
            parse_node(n).map_err(|m| (format!("urls[{i}]"), m))?;
        }
        self.header_map().map_err(|m| ("headers".into(), m))?;
        if self.tls_verify == TlsVerify::Certificate && self.ca_cert.is_none() {
            return Err((
                "tls_verify".into(),
                "tls_verify = \"certificate\" checks the chain up to ca_cert: set ca_cert".into(),
            ));
        }
        Ok(())
    }

    /// The headers of requests to node `i`: [`EsConnection::header_map`], with the
    /// node URL's user info as basic credentials if it has any. A job file's URLs lose
    /// their user info at load; a URL given through the Rust API may still carry it, and
    /// it is never sent in the URL.
    pub fn node_headers(&self, i: usize) -> Result<HeaderMap, String> {
        let node = &self.nodes[i];
        match (parse_node(node)?.1, &self.auth) {
            (None, _) => self.header_map(),
            (Some((username, password)), None) => EsConnection {
                auth: Some(Auth::Basic { username, password }),
                ..self.clone()
            }
            .header_map(),
            (Some(_), Some(_)) => Err(format!(
                "{}: credentials in the URL and in the connection: keep one",
                redact_url(node)
            )),
        }
    }

    /// How requests to each node are signed (`aws_sigv4`): one signer, whose
    /// credentials all nodes share; `None` without `aws_sigv4`.
    pub fn signing(&self) -> Result<Option<Vec<SignedNode>>, String> {
        let Some(cfg) = &self.aws_sigv4 else {
            return Ok(None);
        };
        let signer = Signer::shared(cfg);
        self.nodes
            .iter()
            .map(|n| SignedNode::new(signer.clone(), n, self.gzip))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// The sink's HTTP transport to node `i`: its headers, TLS, compression and the
    /// request timeout. Building it contacts no one.
    pub fn transport(&self, i: usize, timeout: Duration) -> Result<Transport, String> {
        let node = &self.nodes[i];
        let (url, _) = parse_node(node)?;
        let headers = self.node_headers(i)?;
        let mut b = TransportBuilder::new(SingleNodeConnectionPool::new(url))
            .timeout(timeout)
            .disable_proxy()
            // A signed request's body is compressed before it is signed (see
            // `sigv4::SignedNode`), not by the client after.
            .request_body_compression(self.gzip && self.aws_sigv4.is_none())
            .headers(headers);
        let certs = |ca: &CaCert| {
            Certificate::from_pem(&ca.pem).map_err(|e| format!("{}: {e}", ca.path.display()))
        };
        b = match self.tls() {
            (_, TlsVerify::None) => b.cert_validation(CertificateValidation::None),
            (Some(ca), TlsVerify::Full) => {
                b.cert_validation(CertificateValidation::Full(certs(ca)?))
            }
            (Some(ca), TlsVerify::Certificate) => {
                b.cert_validation(CertificateValidation::Certificate(certs(ca)?))
            }
            (None, TlsVerify::Full) => b,
            (None, TlsVerify::Certificate) => {
                return Err("tls_verify = \"certificate\" needs ca_cert".into())
            }
        };
        b.build()
            .map_err(|e| format!("Elasticsearch client for {}: {e}", redact_url(node)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_map_marks_credentials_sensitive() {
        let mut c = EsConnection::single("https://es:9200");
        c.auth = Some(Auth::Bearer(Secret::new("t0k")));
        c.headers.insert("x-tenant".into(), Secret::new("blue"));
        let m = c.header_map().unwrap();
        assert!(m[AUTHORIZATION].is_sensitive());
        assert_eq!(m["x-tenant"], "blue");
        let printed = format!("{m:?} {c:?}");
        assert!(
            !printed.contains("t0k") && !printed.contains("blue"),
            "{printed}"
        );
    }

    #[test]
    fn user_info_in_a_rust_api_url_is_its_credentials_unless_others_are_given() {
        let c = EsConnection::single("https://u:pw@es:9200");
        // base64("u:pw")
        assert_eq!(c.node_headers(0).unwrap()[AUTHORIZATION], "Basic dTpwdw==");
        assert!(c.transport(0, Duration::from_secs(1)).is_ok());
        let mut both = c.clone();
        both.auth = Some(Auth::Bearer(Secret::new("t")));
        let e = both.node_headers(0).unwrap_err();
        assert!(
            e.contains("https://u:***@es:9200/") && !e.contains("pw@"),
            "{e}"
        );
    }

    #[test]
    fn validation_names_the_key() {
        let mut c = EsConnection::single("http://es:9200");
        c.nodes.push("es-2:9200".into());
        assert_eq!(c.validate().unwrap_err().0, "urls[1]");
        let mut c = EsConnection::single("http://es:9200");
        c.tls_verify = TlsVerify::Certificate;
        assert_eq!(c.validate().unwrap_err().0, "tls_verify");
        let mut c = EsConnection::single("http://es:9200");
        c.headers.insert("bad header".into(), Secret::new("v"));
        assert_eq!(c.validate().unwrap_err().0, "headers");
    }
}
