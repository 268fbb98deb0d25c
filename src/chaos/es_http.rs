//! The harness's HTTP client for the job's Elasticsearch cluster, built from the job's
//! own connection settings ([`EsConnection`]): the same headers (credentials included,
//! from [`EsConnection::node_headers`]) and the same TLS settings ([`EsConnection::tls`])
//! as the sink, so a job whose sink needs TLS or credentials is verified as it wrote.

use crate::connectors::elasticsearch::connection::CaCert;
use crate::connectors::elasticsearch::{EsConnection, TlsVerify};
use std::time::Duration;

/// A blocking client for one node of the job's cluster (the first one).
#[derive(Clone)]
pub struct EsHttp {
    /// The node's base URL, without a trailing slash (and without user info).
    pub url: String,
    client: reqwest::blocking::Client,
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
        Ok(EsHttp {
            url: conn.first_node().trim_end_matches('/').to_string(),
            client,
        })
    }

    /// A request to `path` (which starts with `/`) on the node.
    pub fn request(
        &self,
        method: reqwest::Method,
        path: &str,
    ) -> reqwest::blocking::RequestBuilder {
        self.client.request(method, format!("{}{path}", self.url))
    }
}
