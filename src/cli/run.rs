//! `lockgate run`.

use super::{runtime, EXIT_FAILURE, EXIT_USAGE};
use crate::runtime::{run as run_job, RunOptions};
use crate::telemetry::Telemetry;
use std::path::{Path, PathBuf};
use tokio::sync::watch;
use tracing::{error, info};

/// Runs the job of `config` to its end; SIGTERM or Ctrl-C stop it with a final
/// checkpoint and exit 0.
pub fn run(config: &Path, restore: Option<PathBuf>, allow_non_restored_state: bool) -> i32 {
    let job = match crate::config::load(config) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_USAGE;
        }
    };
    let rt = runtime();
    rt.block_on(async move {
        let telemetry = Telemetry::new(
            &job.name,
            &job.describe(),
            job.parallelism,
            job.max_parallelism,
        );
        if let Some(addr) = job.metrics_listen {
            match crate::telemetry::server::serve(addr, telemetry.clone()).await {
                Ok(bound) => {
                    info!(job = %job.name, url = %format!("http://{bound}/"), "serving metrics, probes, the REST API and the status page")
                }
                Err(e) => {
                    eprintln!(
                        "error: {}: metrics.listen: cannot listen on {addr}: {e}",
                        config.display()
                    );
                    return EXIT_USAGE;
                }
            }
        }
        let (stop_tx, stop_rx) = watch::channel(false);
        tokio::spawn(async move {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("SIGTERM handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            let _ = stop_tx.send(true);
        });
        let opts = RunOptions {
            restore,
            allow_non_restored_state,
            stop: Some(stop_rx),
            telemetry: Some(telemetry),
        };
        info!(job = %job.name, graph = %job.describe(), parallelism = job.parallelism, "job starting");
        match run_job(&job, opts).await {
            Ok(s) => {
                info!(
                    job = %job.name,
                    checkpoints = s.checkpoints,
                    last_checkpoint = ?s.last_checkpoint.map(|c| c.0),
                    restarts = s.restarts,
                    "job finished"
                );
                0
            }
            Err(e) => {
                error!(job = %job.name, "job failed: {e}");
                eprintln!("error: {e}");
                EXIT_FAILURE
            }
        }
    })
}
