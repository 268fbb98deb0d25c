//! Reading a running job's telemetry listener: its address from the job's log, its
//! endpoints over HTTP, and `/metrics` through an independent parser of the
//! Prometheus text format (`prometheus-parse`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// The listener's base URL (`http://127.0.0.1:PORT`), read from the `url=` field of
/// the job's "serving metrics" log line (the job file says `listen = "127.0.0.1:0"`, so
/// the port is free by construction). Waits for the line.
pub fn url_from_log(log: &Path) -> String {
    let mut found = None;
    super::wait::until(
        &format!("the metrics listener's address in {}", log.display()),
        super::wait::DEADLINE,
        || {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            found = text
                .lines()
                .rev()
                .filter(|l| l.contains("serving metrics"))
                .filter_map(|l| l.split("url=").nth(1))
                .map(|u| {
                    u.split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .trim_matches('"')
                        .trim_end_matches('/')
                        .to_string()
                })
                .next();
            found.is_some()
        },
    );
    found.unwrap()
}

/// `GET base + path`: (status, body); `None` while nothing listens.
pub fn get(base: &str, path: &str) -> Option<(u16, String)> {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let r = client.get(format!("{base}{path}")).send().ok()?;
    let status = r.status().as_u16();
    Some((status, r.text().unwrap_or_default()))
}

/// `GET base + path` as JSON, which must answer 200.
pub fn get_json(base: &str, path: &str) -> serde_json::Value {
    let (status, body) = get(base, path).unwrap_or_else(|| panic!("GET {path}: no answer"));
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

/// One scrape of `/metrics`, parsed.
pub struct Scrape {
    pub samples: Vec<prometheus_parse::Sample>,
    pub text: String,
}

impl Scrape {
    /// Scrapes and parses `/metrics`; the parse must succeed.
    pub fn take(base: &str) -> Scrape {
        let (status, text) = get(base, "/metrics").expect("GET /metrics");
        assert_eq!(status, 200, "{text}");
        let lines = text.lines().map(|l| Ok(l.to_string()));
        let parsed = prometheus_parse::Scrape::parse(lines).expect("/metrics parses");
        Scrape {
            samples: parsed.samples,
            text,
        }
    }

    /// The value of every sample of `metric` whose labels include `labels`, by the
    /// rest of its labels (sorted `k=v` pairs).
    pub fn series(&self, metric: &str, labels: &[(&str, &str)]) -> BTreeMap<String, f64> {
        self.samples
            .iter()
            .filter(|s| s.metric == metric)
            .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| {
                let mut ls: Vec<String> = s
                    .labels
                    .iter()
                    .filter(|(k, _)| !labels.iter().any(|l| l.0 == k.as_str()))
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                ls.sort();
                let v = match s.value {
                    prometheus_parse::Value::Counter(v)
                    | prometheus_parse::Value::Gauge(v)
                    | prometheus_parse::Value::Untyped(v) => v,
                    _ => f64::NAN,
                };
                (ls.join(","), v)
            })
            .collect()
    }

    /// The sum of [`Scrape::series`].
    pub fn sum(&self, metric: &str, labels: &[(&str, &str)]) -> f64 {
        self.series(metric, labels).values().sum()
    }

    /// The single value of `metric` with `labels`; panics if there is none or several.
    pub fn one(&self, metric: &str, labels: &[(&str, &str)]) -> f64 {
        let s = self.series(metric, labels);
        assert_eq!(s.len(), 1, "{metric} {labels:?}: {s:?}");
        *s.values().next().unwrap()
    }
}
