//! The harness's HTTP client for the job's Elasticsearch cluster, built from the job's
//! own connection settings ([`EsConnection`]): the same headers (credentials included,
//! from [`EsConnection::node_headers`]) and the same TLS settings ([`EsConnection::tls`])
//! as the sink, so a job whose sink needs TLS or credentials is verified as it wrote.

use crate::clients::http::{CaCert, TlsVerify};
use crate::clients::sigv4::SignedNode;
use crate::connectors::elasticsearch::EsConnection;
use std::time::Duration;

/// A blocking client for one node of the job's cluster (the first one).
#[derive(Clone)]
pub struct EsHttp {
    /// The node's base URL, without a trailing slash (and without user info).
    pub url: String,
    client: reqwest::blocking::Client,
    /// With `aws_sigv4`: how requests are signed, and a runtime to fetch credentials.
    signing: Option<std::sync::Arc<(SignedNode, tokio::runtime::Runtime)>>,
}

/// A request being built: its body is known before it is signed.
pub struct EsRequest<'a> {
    http: &'a EsHttp,
    method: reqwest::Method,
    path: String,
    body: Option<Vec<u8>>,
}

impl EsRequest<'_> {
    /// `value` as the JSON body.
    pub fn json(mut self, value: &impl serde::Serialize) -> Self {
        self.body = Some(serde_json::to_vec(value).expect("a JSON value serializes"));
        self
    }

    /// Sends the request (signed with `aws_sigv4`).
    pub fn send(self) -> Result<reqwest::blocking::Response, String> {
        let http = self.http;
        let request = match &http.signing {
            None => {
                let mut r = http
                    .client
                    .request(self.method, format!("{}{}", http.url, self.path))
                    .header("content-type", "application/json");
                if let Some(b) = self.body {
                    r = r.body(b);
                }
                r
            }
            Some(signing) => {
                let (node, rt) = &**signing;
                let signed = rt.block_on(node.sign(
                    self.method.as_str(),
                    &self.path,
                    &[],
                    self.body.as_deref(),
                ))?;
                let mut r = http
                    .client
                    .request(self.method, signed.url)
                    .headers(signed.headers);
                if let Some(b) = signed.body {
                    r = r.body(b);
                }
                r
            }
        };
        request.send().map_err(|e| e.to_string())
    }
}

impl EsHttp {
    /// A client with the connection's headers and TLS settings, and `timeout` per
    /// request.
    pub fn new(conn: &EsConnection, timeout: Duration) -> Result<EsHttp, String> {
        let mut b = reqwest::blocking::Client::builder()
            .timeout(timeout)
            .no_proxy()
            .default_headers(conn.node_headers(0)?);
        let certs = |ca: &CaCert| {
            reqwest::Certificate::from_pem_bundle(&ca.pem)
                .map_err(|e| format!("{}: {e}", ca.path.display()))
        };
        let add = |mut b: reqwest::blocking::ClientBuilder, ca: &CaCert| {
            for c in certs(ca)? {
                b = b.add_root_certificate(c);
            }
            Ok::<_, String>(b)
        };
        b = match conn.tls() {
            (_, TlsVerify::None) => b.danger_accept_invalid_certs(true),
            (Some(ca), TlsVerify::Full) => add(b, ca)?,
            (Some(ca), TlsVerify::Certificate) => add(b, ca)?.danger_accept_invalid_hostnames(true),
            (None, TlsVerify::Full) => b,
            (None, TlsVerify::Certificate) => {
                return Err("tls_verify = \"certificate\" needs ca_cert".into())
            }
        };
        let client = b.build().map_err(|e| format!("HTTP client: {e}"))?;
        let signing = match conn.signing()? {
            Some(mut nodes) => {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("a runtime for AWS credentials: {e}"))?;
                Some(std::sync::Arc::new((nodes.swap_remove(0), rt)))
            }
            None => None,
        };
        Ok(EsHttp {
            url: conn.first_node().trim_end_matches('/').to_string(),
            client,
            signing,
        })
    }

    /// A request to `path` (which starts with `/`) on the node.
    pub fn request(&self, method: reqwest::Method, path: &str) -> EsRequest<'_> {
        EsRequest {
            http: self,
            method,
            path: path.to_string(),
            body: None,
        }
    }
}
