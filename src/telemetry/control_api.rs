//! The control API on the metrics listener (`[control] enabled = true`): JSON over
//! POST, each request carrying `Authorization: Bearer <token>` when the job file
//! names a `token_file`.
//!
//! | request | answer |
//! |---|---|
//! | `POST /api/v1/job/stop` | 202 `{"state":"stopping"}`: a final checkpoint, then the process exits 0 (as SIGTERM) |
//! | `POST /api/v1/job/pause` | 200 `{"paused":true,"changed":…}`: the sources read nothing; records in flight drain; checkpoints go on |
//! | `POST /api/v1/job/resume` | 200 `{"paused":false,"changed":…}` |
//! | `POST /api/v1/checkpoints` | 200 `{"id":N,"path":…}` once the checkpoint completes; 503 when it was aborted, 409 when the job ended first |
//!
//! A missing or wrong token is 401 (nothing done). With the API off, the same
//! requests are 404 with a body that says how to turn it on.

use super::Telemetry;
use crate::control::{ControlSettings, JobControl, NotTaken};
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::json;

/// The paths of the control API.
const PATHS: [&str; 4] = [
    "/api/v1/job/stop",
    "/api/v1/job/pause",
    "/api/v1/job/resume",
    "/api/v1/checkpoints",
];

#[derive(Clone)]
struct Api {
    control: JobControl,
    telemetry: Telemetry,
}

/// The control routes over `control`, behind the token of `settings`.
pub fn router(control: JobControl, settings: &ControlSettings, telemetry: Telemetry) -> Router {
    let token = settings.token.clone();
    Router::new()
        .route("/api/v1/job/stop", post(stop))
        .route("/api/v1/job/pause", post(|s| set_paused(s, true)))
        .route("/api/v1/job/resume", post(|s| set_paused(s, false)))
        .route("/api/v1/checkpoints", post(checkpoint))
        .route_layer(middleware::from_fn(move |req: Request, next: Next| {
            let token = token.clone();
            async move {
                if let Some(why) = cross_site(&req) {
                    return error(StatusCode::FORBIDDEN, &why);
                }
                if token.is_none() && !addressed_by_ip(&req) {
                    return error(
                        StatusCode::FORBIDDEN,
                        "without a token_file the control API answers only requests addressed to an IP address or localhost (a page served under another host name could reach it by DNS rebinding)",
                    );
                }
                match &token {
                    Some(t) if !bearer_matches(&req, t.expose()) => unauthorized(&req),
                    _ => next.run(req).await,
                }
            }
        }))
        .with_state(Api { control, telemetry })
}

/// The same paths when the API is off: 404, saying how to turn it on.
pub fn off() -> Router {
    PATHS.iter().fold(Router::new(), |r, p| {
        r.route(
            p,
            post(|| async {
                error(
                    StatusCode::NOT_FOUND,
                    "the control API is off; set [control] enabled = true in the job file",
                )
            }),
        )
    })
}

pub(crate) fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

pub(crate) fn unauthorized(req: &Request) -> Response {
    let message = if req.headers().contains_key(header::AUTHORIZATION) {
        "the bearer token is wrong"
    } else {
        "a bearer token is required (Authorization: Bearer <the token of [control] token_file>)"
    };
    let mut r = error(StatusCode::UNAUTHORIZED, message);
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer realm=\"lockgate\""),
    );
    r
}

/// Whether `req` carries `Authorization: Bearer <token>`, compared in time that does
/// not depend on where the two first differ.
pub(crate) fn bearer_matches(req: &Request, token: &str) -> bool {
    let Some(given) = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim())
    else {
        return false;
    };
    // Compared in full whatever the lengths, so that neither where they differ nor by
    // how much shows in the time taken.
    let (a, b) = (given.as_bytes(), token.as_bytes());
    let n = a.len().max(b.len());
    let differ = (0..n).fold(u8::from(a.len() != b.len()), |d, i| {
        d | (a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0))
    });
    differ == 0
}

/// Whether the request names the listener by an IP address or `localhost` (its `Host`
/// header), as clients that are not browsers do: a web page under another name that
/// was made to resolve to the listener (DNS rebinding) is not.
pub(crate) fn addressed_by_ip(req: &Request) -> bool {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok()
}

/// Why a request comes from a page of another site, if it does: a browser names the
/// page's origin in `Origin` (and `Sec-Fetch-Site`), which a page cannot forge, so a
/// control request with no token cannot be sent from any web page an operator has
/// open. Clients that are not browsers (curl, scripts) send neither.
fn cross_site(req: &Request) -> Option<String> {
    let h = req.headers();
    if let Some(site) = h.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        if site != "same-origin" && site != "none" {
            return Some(format!(
                "refused: a request from another site (Sec-Fetch-Site: {site})"
            ));
        }
    }
    let origin = h.get(header::ORIGIN)?.to_str().unwrap_or("");
    let host = h
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let authority = origin.split_once("://").map_or("", |(_, a)| a);
    (authority != host).then(|| format!("refused: a request from another origin ({origin})"))
}

async fn stop(State(api): State<Api>) -> Response {
    tracing::info!(job = %api.telemetry.job().name, "stop requested through the control API");
    api.control.stop();
    (StatusCode::ACCEPTED, Json(json!({ "state": "stopping" }))).into_response()
}

async fn set_paused(State(api): State<Api>, paused: bool) -> Response {
    if api.control.is_stopping() {
        return error(
            StatusCode::CONFLICT,
            "the job is stopping; it takes its final checkpoint and exits",
        );
    }
    let changed = api.control.set_paused(paused);
    (
        StatusCode::OK,
        Json(json!({ "paused": paused, "changed": changed })),
    )
        .into_response()
}

async fn checkpoint(State(api): State<Api>) -> Response {
    match api.control.checkpoint().await {
        Ok(t) => (StatusCode::OK, Json(json!({ "id": t.id, "path": t.path }))).into_response(),
        Err(e @ NotTaken::Aborted(_)) => error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
        Err(e @ NotTaken::Ended(_)) => error(StatusCode::CONFLICT, &e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::Secret;

    async fn serve(router: Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        format!("http://{addr}")
    }

    async fn post(base: &str, path: &str, token: Option<&str>) -> (u16, serde_json::Value) {
        let mut r = reqwest::Client::new().post(format!("{base}{path}"));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        let r = r.send().await.unwrap();
        (r.status().as_u16(), r.json().await.unwrap())
    }

    #[tokio::test]
    async fn every_request_needs_the_token_and_a_refused_one_changes_nothing() {
        let control = JobControl::new();
        let t = Telemetry::new("c", "c: source:sequence > sink:file", 1, 128);
        let settings = ControlSettings {
            token: Some(Secret::new("s3cret")),
        };
        let base = serve(router(control.clone(), &settings, t)).await;
        for path in PATHS {
            for token in [None, Some("wrong"), Some("s3cret2"), Some("")] {
                let (status, body) = post(&base, path, token).await;
                assert_eq!(status, 401, "{path} {token:?}: {body}");
            }
        }
        assert!(!control.is_paused() && !control.is_stopping());
        // A page of another site cannot send one, token or not.
        let client = reqwest::Client::new();
        for (name, value) in [
            ("origin", "http://evil.example"),
            ("sec-fetch-site", "cross-site"),
        ] {
            let r = client
                .post(format!("{base}/api/v1/job/stop"))
                .bearer_auth("s3cret")
                .header(name, value)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 403, "{name}: {value}");
        }
        assert!(!control.is_stopping());
        // The scheme is case-insensitive (RFC 7235).
        let r = client
            .post(format!("{base}/api/v1/job/pause"))
            .header("authorization", "bearer s3cret")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        control.set_paused(false);
        assert_eq!(
            post(&base, "/api/v1/job/pause", Some("s3cret")).await.0,
            200
        );
        assert!(control.is_paused());
        let (status, body) = post(&base, "/api/v1/job/resume", Some("s3cret")).await;
        assert_eq!((status, body["changed"].as_bool()), (200, Some(true)));
        assert_eq!(post(&base, "/api/v1/job/stop", Some("s3cret")).await.0, 202);
        assert!(control.is_stopping());
        let (status, body) = post(&base, "/api/v1/job/pause", Some("s3cret")).await;
        assert_eq!(status, 409, "{body}");
    }

    #[tokio::test]
    async fn without_a_token_only_requests_to_an_ip_address_or_localhost_are_answered() {
        let control = JobControl::new();
        let t = Telemetry::new("c", "c: source:sequence > sink:file", 1, 128);
        let base = serve(router(control.clone(), &ControlSettings::default(), t)).await;
        let client = reqwest::Client::new();
        let status = |host: &'static str| {
            let r = client
                .post(format!("{base}/api/v1/job/pause"))
                .header("host", host)
                .send();
            async move { r.await.unwrap().status().as_u16() }
        };
        assert_eq!(status("rebound.example:9464").await, 403);
        assert!(!control.is_paused());
        for host in ["127.0.0.1:9464", "localhost:9464", "[::1]:9464", "10.0.0.7"] {
            assert_eq!(status(host).await, 200, "{host}");
        }
        assert!(control.is_paused());
    }

    #[tokio::test]
    async fn off_answers_404_and_says_how_to_turn_it_on() {
        let base = serve(off()).await;
        for path in PATHS {
            let (status, body) = post(&base, path, None).await;
            assert_eq!(status, 404);
            assert!(body["error"]
                .as_str()
                .unwrap()
                .contains("[control] enabled = true"));
        }
    }
}
