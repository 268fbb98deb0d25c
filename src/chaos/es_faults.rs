//! Elasticsearch faults cycled on the lockgate test server while the job runs
//! (`lockgate chaos --es-faults`). A phase ends only after its fault has fired (the
//! server's counter for it rose) and it lasted its minimum time, so a run on a slow
//! machine exercises every fault instead of cycling them while no request is sent.

use super::es_http::EsHttp;
use reqwest::Method;
use serde::Serialize;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The shortest time a phase stays on.
const MIN_PHASE: Duration = Duration::from_millis(700);

/// One fault phase: what the server is told, and the counter of `/_lockgate/stats` that
/// proves it fired.
pub struct Phase {
    pub name: &'static str,
    pub faults: Value,
    pub counter: &'static str,
}

/// A phase that fired, and how often (the rise of its counter while it was on).
#[derive(Debug, Clone, Serialize)]
pub struct Fired {
    pub phase: String,
    pub count: u64,
}

/// The phases, in order.
pub fn phases() -> Vec<Phase> {
    let p = |name, faults, counter| Phase {
        name,
        faults,
        counter,
    };
    vec![
        p(
            "30% of items rejected with 429",
            json!({"reject_item_fraction": 0.3, "seed": 1}),
            "rejected_items",
        ),
        p(
            "5 requests failed with 503",
            json!({"fail_requests_status": 503, "fail_requests": 5}),
            "failed_requests",
        ),
        p(
            "5 requests failed with 429",
            json!({"fail_requests_status": 429, "fail_requests": 5}),
            "failed_requests",
        ),
        p(
            "3 requests failed with 500",
            json!({"fail_requests_status": 500, "fail_requests": 3}),
            "failed_requests",
        ),
        p(
            "150 ms latency",
            json!({"latency_ms": 150}),
            "bulk_requests",
        ),
        p(
            "3 responses dropped after the bulk was applied",
            json!({"drop_responses": 3}),
            "dropped_responses",
        ),
        p("no fault", json!({}), "bulk_requests"),
    ]
}

/// Sets the test server's faults (`{}` clears them).
pub fn set(es: &EsHttp, faults: &Value) -> Result<(), String> {
    let url = &es.url;
    let r = es
        .request(Method::POST, "/_lockgate/faults")
        .json(faults)
        .send()
        .map_err(|e| format!("{url}/_lockgate/faults: {e}"))?;
    if r.status().is_success() {
        Ok(())
    } else {
        Err(format!(
            "{url}/_lockgate/faults answered {}: Elasticsearch faults need the lockgate test server",
            r.status()
        ))
    }
}

/// The test server's counters.
pub fn stats(es: &EsHttp) -> Option<Value> {
    es.request(Method::GET, "/_lockgate/stats")
        .send()
        .and_then(|r| r.json().map_err(|e| e.to_string()))
        .ok()
}

fn counter(es: &EsHttp, name: &str) -> Option<u64> {
    stats(es)?.get(name)?.as_u64()
}

/// Cycles the phases on the node of `url` until `stop` is set, then clears the faults; the handle
/// returns the phases that fired, in order.
pub fn cycle(url: EsHttp, stop: Arc<AtomicBool>) -> JoinHandle<Vec<Fired>> {
    std::thread::spawn(move || {
        let mut fired = Vec::new();
        let phases = phases();
        'cycle: for phase in phases.iter().cycle() {
            let Some(before) = counter(&url, phase.counter) else {
                break;
            };
            if set(&url, &phase.faults).is_err() {
                break;
            }
            let on = Instant::now();
            loop {
                if stop.load(Ordering::Relaxed) {
                    let rose = counter(&url, phase.counter)
                        .unwrap_or(before)
                        .saturating_sub(before);
                    if rose > 0 {
                        fired.push(Fired {
                            phase: phase.name.into(),
                            count: rose,
                        });
                    }
                    break 'cycle;
                }
                let rose = counter(&url, phase.counter)
                    .unwrap_or(before)
                    .saturating_sub(before);
                if rose > 0 && on.elapsed() >= MIN_PHASE {
                    fired.push(Fired {
                        phase: phase.name.into(),
                        count: rose,
                    });
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = set(&url, &json!({}));
        fired
    })
}
