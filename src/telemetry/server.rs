//! The HTTP listener of `[metrics] listen`: Prometheus metrics, health probes, the
//! read-only REST API and the status page, all from the one binary.
//!
//! | path | what |
//! |---|---|
//! | `/metrics` | every metric, Prometheus text format 0.0.4 |
//! | `/healthz` | 200 while the process serves |
//! | `/readyz` | 200 when restored, running and a checkpoint completed since the start; 503 with the reason as text otherwise |
//! | `/api/v1/job` | name, state, uptime, parallelism, restored-from, restarts |
//! | `/api/v1/checkpoints` | counts and the history, newest first |
//! | `/api/v1/partitions` | position, end and lag per Kafka partition |
//! | `/api/v1/sink` | pending, in flight and outcomes per sink subtask |
//! | `/api/v1/operators` | records in and out per operator subtask |
//! | `/` | the status page (one static file, same-origin requests only) |
//!
//! With `[control] enabled = true`, the same listener answers the control API
//! ([`super::control_api`]: stop, pause, resume, checkpoint now).
//!
//! Who may read what ([`access`]): `/metrics` answers anyone (scrapers carry no token
//! and often name the host by a DNS name; it holds counts and names, never error text
//! or record values); the status page's file answers anyone (it holds no job data).
//! With a `[control] token_file`, every other path asks for the token except the
//! probes; without one, every other path (probes included) answers only requests that
//! name the listener by an IP address or `localhost`, so that a web page under another
//! name made to resolve to the listener (DNS rebinding) reads no job state, no error
//! text and no record value quoted in one.

use super::Telemetry;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use std::net::SocketAddr;

/// The status page: one file, no external resources.
const PAGE: &str = include_str!("page.html");

/// The routes of the listener, over `telemetry`; the control API's over `control`
/// when it is on.
pub fn router(
    telemetry: Telemetry,
    control: Option<(crate::control::JobControl, &crate::control::ControlSettings)>,
) -> Router {
    let token = control.as_ref().and_then(|(_, s)| s.token.clone());
    let api = match control {
        Some((c, settings)) => super::control_api::router(c, settings, telemetry.clone()),
        None => super::control_api::off(),
    };
    Router::new()
        .route("/", get(page))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route(
            "/api/v1/job",
            get(|State(t): State<Telemetry>| async move { Json(t.job()) }),
        )
        .route(
            "/api/v1/checkpoints",
            get(|State(t): State<Telemetry>| async move { Json(t.checkpoints()) }),
        )
        .route(
            "/api/v1/partitions",
            get(|State(t): State<Telemetry>| async move { Json(t.partitions()) }),
        )
        .route(
            "/api/v1/operators",
            get(|State(t): State<Telemetry>| async move { Json(t.operators()) }),
        )
        .route(
            "/api/v1/sink",
            get(|State(t): State<Telemetry>| async move { Json(t.sinks()) }),
        )
        .with_state(telemetry)
        .merge(api)
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let token = token.clone();
                async move {
                    let class = PathClass::of(req.uri().path());
                    let token_ok = token
                        .as_ref()
                        .is_some_and(|t| super::control_api::bearer_matches(&req, t.expose()));
                    match access(
                        class,
                        token.is_some(),
                        token_ok,
                        super::control_api::addressed_by_ip(&req),
                    ) {
                        Access::Answer => next.run(req).await,
                        Access::NeedsToken => super::control_api::unauthorized(&req),
                        Access::WrongHost => super::control_api::error(
                            StatusCode::FORBIDDEN,
                            "this path answers a request without the token only when it names the listener by an IP address or localhost (a page served under another host name could reach it by DNS rebinding): address it so, or set a [control] token_file and send its token",
                        ),
                    }
                }
            },
        ))
}

/// What a path is, for who may read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathClass {
    /// `/metrics`: counts and names, for scrapers.
    Metrics,
    /// `/healthz`, `/readyz`: for the orchestrator's probes.
    Probe,
    /// `/`: the status page's static file.
    Page,
    /// Everything else: the REST and control API (job state, error text).
    Api,
}

impl PathClass {
    pub fn of(path: &str) -> PathClass {
        match path {
            "/metrics" => PathClass::Metrics,
            "/healthz" | "/readyz" => PathClass::Probe,
            "/" => PathClass::Page,
            _ => PathClass::Api,
        }
    }
}

/// The answer to a request before its route sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Answer,
    /// 401: a token is configured and the request does not carry it.
    NeedsToken,
    /// 403: no token is configured and the request names the listener by a host
    /// name (DNS rebinding).
    WrongHost,
}

/// Who may read `class`: with a token configured (`token_set`), the API only with it
/// (`token_ok`); without one, everything but `/metrics` and the page only when the
/// request is addressed to an IP address or localhost (`by_ip`). A request carrying
/// the right token is answered whatever its host.
pub fn access(class: PathClass, token_set: bool, token_ok: bool, by_ip: bool) -> Access {
    match class {
        PathClass::Metrics | PathClass::Page => Access::Answer,
        _ if token_ok => Access::Answer,
        PathClass::Api if token_set => Access::NeedsToken,
        // The probes under a token: a rebinding page cannot name the listener by IP.
        _ if by_ip => Access::Answer,
        _ => Access::WrongHost,
    }
}

/// Binds `addr` and serves [`router`] on the current runtime until the process ends.
/// Returns the bound address (port 0 picks a free one).
pub async fn serve(
    addr: SocketAddr,
    telemetry: Telemetry,
    control: Option<(crate::control::JobControl, &crate::control::ControlSettings)>,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = router(telemetry, control);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "the metrics listener stopped");
        }
    });
    Ok(bound)
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // The page fetches its own origin only.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:",
            ),
        ],
        PAGE,
    )
        .into_response()
}

async fn metrics(State(t): State<Telemetry>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        t.scrape(),
    )
        .into_response()
}

async fn readyz(State(t): State<Telemetry>) -> Response {
    match t.readiness() {
        Ok(()) if t.job().state == crate::telemetry::status::JobState::Paused => (
            StatusCode::OK,
            "ready, paused through the control API: the sources read nothing until POST /api/v1/job/resume\n"
                .to_string(),
        )
            .into_response(),
        Ok(()) => (StatusCode::OK, "ready\n".to_string()).into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn who_may_read_what() {
        use Access::*;
        use PathClass::*;
        // (class, token set, token sent and right, addressed by IP) -> access
        let table = [
            (Metrics, false, false, false, Answer),
            (Metrics, true, false, false, Answer),
            (Page, false, false, false, Answer),
            (Page, true, false, false, Answer),
            (Probe, false, false, true, Answer),
            (Probe, false, false, false, WrongHost),
            (Probe, true, false, true, Answer),
            (Probe, true, false, false, WrongHost),
            (Probe, true, true, false, Answer),
            (Api, false, false, true, Answer),
            (Api, false, false, false, WrongHost),
            (Api, true, false, true, NeedsToken),
            (Api, true, false, false, NeedsToken),
            (Api, true, true, true, Answer),
            (Api, true, true, false, Answer),
        ];
        for (class, set, ok, by_ip, want) in table {
            assert_eq!(
                access(class, set, ok, by_ip),
                want,
                "{class:?} {set} {ok} {by_ip}"
            );
        }
        assert_eq!(PathClass::of("/api/v1/job"), Api);
        assert_eq!(PathClass::of("/api/v1/job/stop"), Api);
        assert_eq!(PathClass::of("/readyz"), Probe);
        assert_eq!(PathClass::of("/metrics"), Metrics);
        assert_eq!(PathClass::of("/"), Page);
        assert_eq!(PathClass::of("/index.html"), Api);
    }

    use super::*;
    use crate::telemetry::status::JobState;

    async fn get(base: &str, path: &str) -> (u16, String, String) {
        let r = reqwest::get(format!("{base}{path}")).await.unwrap();
        let status = r.status().as_u16();
        let ct = r
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        (status, ct, r.text().await.unwrap())
    }

    #[tokio::test]
    async fn every_route_answers_with_its_format() {
        let t = Telemetry::new("served", "served: source:sequence > sink:file", 2, 128);
        let addr = serve("127.0.0.1:0".parse().unwrap(), t.clone(), None)
            .await
            .unwrap();
        let base = format!("http://{addr}");

        assert_eq!(get(&base, "/healthz").await.0, 200);
        let (status, _, body) = get(&base, "/readyz").await;
        assert_eq!(
            (status, body.as_str()),
            (503, "not ready: starting: restoring state\n")
        );
        t.set_state(JobState::Running);
        t.checkpoint_triggered(1, false);
        t.checkpoint_completed(1, 5, 10, "/c/chk-1");
        assert_eq!(get(&base, "/readyz").await.0, 200);

        let (status, ct, text) = get(&base, "/metrics").await;
        assert_eq!(status, 200);
        assert_eq!(ct, "text/plain; version=0.0.4; charset=utf-8");
        assert!(text.contains("lockgate_checkpoints_total{job=\"served\",status=\"completed\"} 1"));

        for (path, key) in [("/api/v1/job", "name"), ("/api/v1/checkpoints", "history")] {
            let (status, ct, body) = get(&base, path).await;
            assert_eq!((status, ct.as_str()), (200, "application/json"), "{path}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert!(!v[key].is_null(), "{path}: {body}");
        }
        for path in ["/api/v1/partitions", "/api/v1/sink", "/api/v1/operators"] {
            let (status, _, body) = get(&base, path).await;
            assert_eq!(status, 200, "{path}");
            assert!(
                serde_json::from_str::<serde_json::Value>(&body)
                    .unwrap()
                    .is_array(),
                "{path}"
            );
        }

        let r = reqwest::get(format!("{base}/")).await.unwrap();
        assert_eq!(r.status(), 200);
        let csp = r.headers()[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap()
            .to_string();
        assert!(csp.contains("connect-src 'self'"), "{csp}");
        assert!(r.text().await.unwrap().contains("<html"));
        assert_eq!(get(&base, "/nothing-here").await.0, 404);
    }

    #[test]
    fn the_page_loads_nothing_from_another_origin_and_fetches_only_the_api() {
        // The one absolute URL is the SVG namespace, an identifier that is never fetched.
        let outside: Vec<&str> = PAGE
            .match_indices("http")
            .map(|(i, _)| &PAGE[i..(i + 40).min(PAGE.len())])
            .filter(|s| !s.starts_with("http://www.w3.org/2000/svg\""))
            .collect();
        assert!(outside.is_empty(), "{outside:?}");
        for attr in [" src=", " href=", "@import", "url("] {
            assert!(!PAGE.contains(attr), "the page loads nothing: {attr}");
        }
        let fetched: Vec<&str> = ["get(\"", "getText(\""]
            .iter()
            .flat_map(|call| PAGE.split(call).skip(1))
            .filter_map(|s| s.split('"').next())
            .collect();
        assert!(fetched.len() >= 5, "{fetched:?}");
        for path in fetched {
            assert!(
                path.starts_with("/api/v1/") || path == "/readyz",
                "same origin, relative: {path}"
            );
        }
    }

    #[test]
    fn the_page_has_no_inline_event_handlers() {
        // The content security policy may drop 'unsafe-inline' for handlers one day;
        // listeners are attached from the script.
        let handler = PAGE.split(" on").skip(1).find(|rest| {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase())
                .collect();
            !name.is_empty() && rest[name.len()..].starts_with('=')
        });
        assert_eq!(handler.map(|r| &r[..20.min(r.len())]), None);
    }
}
