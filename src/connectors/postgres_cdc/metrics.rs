//! The replication lag a DBA watches: how far the source's position is behind the
//! server's WAL, in bytes and in seconds.

use crate::telemetry::Telemetry;
use prometheus::{Gauge, GaugeVec, IntGauge, IntGaugeVec, Opts};
use std::sync::Arc;

/// The families, registered once per job.
struct Families {
    bytes: IntGaugeVec,
    seconds: GaugeVec,
}

/// `lockgate_cdc_lag_bytes` and `lockgate_cdc_lag_seconds` of one slot.
#[derive(Clone)]
pub struct Lag {
    bytes: IntGauge,
    seconds: Gauge,
}

impl Lag {
    /// The gauges of slot `slot` of job `job`.
    pub fn new(telemetry: &Telemetry, job: &str, slot: &str) -> Lag {
        let f: Arc<Families> = telemetry.metrics().extension(|m| Families {
            bytes: m.register(
                IntGaugeVec::new(
                    Opts::new("lockgate_cdc_lag_bytes", "How far the change data capture source's position is behind the server's current WAL position, in bytes (measured every heartbeat_ms, or every 10 s without heartbeats)."),
                    &["job", "slot"],
                )
                .expect("valid metric"),
            ),
            seconds: m.register(
                GaugeVec::new(
                    Opts::new("lockgate_cdc_lag_seconds", "How long ago the last transaction the change data capture source passed on committed (0 once the server reports nothing newer)."),
                    &["job", "slot"],
                )
                .expect("valid metric"),
            ),
        });
        Lag {
            bytes: f.bytes.with_label_values(&[job, slot]),
            seconds: f.seconds.with_label_values(&[job, slot]),
        }
    }

    /// A transaction that committed at `commit_ms` was passed on at `now_ms`.
    pub fn committed(&self, commit_ms: i64, now_ms: i64) {
        self.seconds
            .set(((now_ms - commit_ms).max(0) as f64) / 1000.0);
    }

    /// The server reported nothing newer than the position.
    pub fn caught_up(&self) {
        self.seconds.set(0.0);
    }

    /// The position is `bytes` behind the server's WAL.
    pub fn behind(&self, bytes: u64) {
        self.bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }
}
