//! The test server as a secured cluster: HTTPS with a certificate generated at start
//! (a throwaway CA and a server certificate for `localhost` and `127.0.0.1`), and
//! credentials that every request must carry (basic auth, API keys), answered like
//! Elasticsearch when missing or wrong (401 `security_exception` with a
//! `WWW-Authenticate` header). Also the decoding of gzip request bodies.

use super::server::SharedState;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use std::io::Read;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_native_tls::{native_tls, TlsAcceptor, TlsStream};

/// A generated certificate: the CA a client must trust, and the server's certificate
/// and key (PEM).
#[derive(Clone)]
pub struct TestCert {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestCert {
    /// A new CA and a server certificate it signed, valid for `localhost` and
    /// `127.0.0.1`.
    pub fn generate() -> Result<TestCert, String> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let e = |e: rcgen::Error| format!("generating a test certificate: {e}");
        let ca_key = KeyPair::generate().map_err(e)?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(e)?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "lockgate testkit CA");
        let ca = ca_params.self_signed(&ca_key).map_err(e)?;
        let key = KeyPair::generate().map_err(e)?;
        let mut params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .map_err(e)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "lockgate testkit Elasticsearch");
        let cert = params.signed_by(&key, &ca, &ca_key).map_err(e)?;
        Ok(TestCert {
            ca_pem: ca.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    fn acceptor(&self) -> Result<TlsAcceptor, String> {
        let id =
            native_tls::Identity::from_pkcs8(self.cert_pem.as_bytes(), self.key_pem.as_bytes())
                .map_err(|e| format!("test certificate: {e}"))?;
        let a = native_tls::TlsAcceptor::new(id).map_err(|e| format!("TLS acceptor: {e}"))?;
        Ok(TlsAcceptor::from(a))
    }
}

/// A listener that hands axum connections whose TLS handshake completed. Handshakes run
/// concurrently, so one slow or failing client never holds up the others.
pub struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: SocketAddr,
}

impl TlsListener {
    /// Serves TLS on `tcp` with `cert`.
    pub fn new(tcp: TcpListener, cert: &TestCert) -> Result<TlsListener, String> {
        let acceptor = cert.acceptor()?;
        let addr = tcp.local_addr().map_err(|e| e.to_string())?;
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let Ok((stream, peer)) = tcp.accept().await else {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                };
                if tx.is_closed() {
                    return;
                }
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    // A client that gives up on the certificate just goes away.
                    if let Ok(tls) = acceptor.accept(stream).await {
                        let _ = tx.send((tls, peer)).await;
                    }
                });
            }
        });
        Ok(TlsListener { rx, addr })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(c) => c,
            // The acceptor task ended: nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}

/// The `Authorization` header value of `USER:PASS` (basic) and of `ID:KEY` (API key).
pub fn basic_header(user_pass: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(user_pass)
    )
}

/// See [`basic_header`].
pub fn api_key_header(id_key: &str) -> String {
    format!(
        "ApiKey {}",
        base64::engine::general_purpose::STANDARD.encode(id_key)
    )
}

/// Refuses a request without an accepted `Authorization` header, as Elasticsearch does.
/// With no credentials configured every request passes.
pub(crate) async fn require_auth(
    State(s): State<Arc<SharedState>>,
    req: Request,
    next: Next,
) -> Response {
    if s.accepted_auth.is_empty() {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if given.is_some_and(|g| s.accepted_auth.iter().any(|a| a == g)) {
        return next.run(req).await;
    }
    s.stats.lock().expect("lock").unauthorized_requests += 1;
    let reason = match given {
        None => format!(
            "missing authentication credentials for REST request [{}]",
            req.uri().path()
        ),
        Some(_) => "unable to authenticate user for REST request".to_string(),
    };
    let body = serde_json::json!({
        "error": {
            "root_cause": [{"type": "security_exception", "reason": reason}],
            "type": "security_exception",
            "reason": reason,
        },
        "status": 401
    });
    let mut r = (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response();
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"security\", charset=\"UTF-8\", ApiKey"),
    );
    r
}

/// Decodes a `Content-Encoding: gzip` request body (the client's `compression = "gzip"`),
/// counting such requests.
pub(crate) async fn gunzip(
    State(s): State<Arc<SharedState>>,
    req: Request,
    next: Next,
) -> Response {
    let gz = req
        .headers()
        .get(header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
    if !gz {
        return next.run(req).await;
    }
    let (mut parts, body) = req.into_parts();
    let bytes: Bytes = match axum::body::to_bytes(body, 512 * 1024 * 1024).await {
        Ok(b) => b,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let mut plain = Vec::new();
    if let Err(e) = flate2::read::GzDecoder::new(&bytes[..]).read_to_end(&mut plain) {
        return (StatusCode::BAD_REQUEST, format!("bad gzip body: {e}")).into_response();
    }
    s.stats.lock().expect("lock").gzip_requests += 1;
    parts.headers.remove(header::CONTENT_ENCODING);
    parts.headers.remove(header::CONTENT_LENGTH);
    next.run(Request::from_parts(parts, Body::from(plain)))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_match_what_clients_send() {
        // The client's encoding of the same credentials (clients/http.rs).
        use crate::connectors::elasticsearch::Auth;
        use crate::secret::Secret;
        let basic = Auth::Basic {
            username: "u".into(),
            password: Secret::new("p:w"),
        };
        assert_eq!(basic.header_value().expose(), basic_header("u:p:w"));
        let key = Auth::ApiKey(Secret::new("id:key"));
        assert_eq!(key.header_value().expose(), api_key_header("id:key"));
    }

    #[test]
    fn a_certificate_is_generated() {
        let c = TestCert::generate().unwrap();
        assert!(c.ca_pem.contains("BEGIN CERTIFICATE"));
        assert!(c.key_pem.contains("PRIVATE KEY"));
        c.acceptor().unwrap();
    }
}
