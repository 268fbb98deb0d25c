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
