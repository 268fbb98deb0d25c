//! An HTTP/1.1 proxy in front of a test server (moto's S3) that injects faults by
//! request: answer an error without forwarding, forward and then answer an error or
//! drop the connection (a request that landed and whose response was lost), or hold
//! a request (the policy may block). Each request gets its own upstream connection,
//! and every response is sent with `Connection: close`.
//!
//! Bodies are read by `Content-Length` (the object-store client sends no chunked
//! bodies); the proxy is for tests, not for production traffic.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// One request as the policy sees it.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    /// The request target (path and query).
    pub target: String,
}

impl Request {
    /// The path without the query.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or_default()
    }
}

/// What the proxy does with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Forward,
    /// Answers this status without forwarding.
    Reply(u16),
    /// Forwards, waits for the upstream answer, then answers this status instead.
    ForwardThenReply(u16),
    /// Forwards, waits for the upstream answer, then closes the connection unanswered.
    ForwardThenDrop,
}

type Policy = dyn Fn(&Request) -> Action + Send + Sync;

/// A running proxy; it stops accepting when dropped.
pub struct FaultProxy {
    endpoint: String,
    stop: Arc<AtomicBool>,
    port: u16,
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port in front of `upstream` (`host:port`).
    pub fn start(
        upstream: &str,
        policy: impl Fn(&Request) -> Action + Send + Sync + 'static,
    ) -> std::io::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let policy: Arc<Policy> = Arc::new(policy);
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let s = stop.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (policy, upstream) = (policy.clone(), upstream.clone());
                std::thread::spawn(move || {
                    let _ = serve(conn, &upstream, &*policy);
                });
            }
        });
        Ok(FaultProxy {
            endpoint: format!("http://127.0.0.1:{port}"),
            stop,
            port,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop so that it sees the stop.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn serve(conn: TcpStream, upstream: &str, policy: &Policy) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut head = Vec::new();
    let mut content_length = 0usize;
    let mut request_line = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        if request_line.is_empty() {
            request_line = line.trim_end().to_string();
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            content_length = v.trim().parse().unwrap_or(0);
        }
        if line == "\r\n" {
            head.extend_from_slice(b"Connection: close\r\n\r\n");
            break;
        }
        if !lower.starts_with("connection:") {
            head.extend_from_slice(line.as_bytes());
        }
    }
    let mut body = vec![0; content_length];
    reader.read_exact(&mut body)?;
    let mut parts = request_line.split_whitespace();
    let req = Request {
        method: parts.next().unwrap_or_default().to_string(),
        target: parts.next().unwrap_or_default().to_string(),
    };
    let mut conn = conn;
    let action = policy(&req);
    if let Action::Reply(status) = action {
        return reply(&mut conn, status);
    }
    let mut up = TcpStream::connect(upstream)?;
    up.write_all(&head)?;
    up.write_all(&body)?;
    let mut answer = Vec::new();
    up.read_to_end(&mut answer)?;
    match action {
        Action::ForwardThenReply(status) => reply(&mut conn, status),
        Action::ForwardThenDrop => conn.shutdown(Shutdown::Both),
        _ => {
            conn.write_all(&with_connection_close(&answer))?;
            conn.shutdown(Shutdown::Both)
        }
    }
}

fn reply(conn: &mut TcpStream, status: u16) -> std::io::Result<()> {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>InternalError</Code><Message>injected HTTP {status}</Message></Error>"
    );
    write!(
        conn,
        "HTTP/1.1 {status} Injected\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    conn.shutdown(Shutdown::Both)
}

/// The upstream response with its `Connection` header replaced by `close`.
fn with_connection_close(answer: &[u8]) -> Vec<u8> {
    let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return answer.to_vec();
    };
    let head = String::from_utf8_lossy(&answer[..end]);
    let mut out = String::new();
    for line in head.split("\r\n") {
        if !line.to_ascii_lowercase().starts_with("connection:") {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    let mut v = out.into_bytes();
    v.extend_from_slice(&answer[end + 4..]);
    v
}
