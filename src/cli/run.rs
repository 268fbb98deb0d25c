//! `lockgate run`.

use super::{runtime, EXIT_FAILURE, EXIT_USAGE};
use crate::member::Member;
use crate::runtime::{run as run_job, RunOptions};
use crate::telemetry::Telemetry;
use std::path::{Path, PathBuf};
use tracing::{error, info, warn};

/// The options of `lockgate run` besides the job file.
pub struct RunArgs {
    pub restore: Option<PathBuf>,
    pub allow_non_restored_state: bool,
    pub member: Member,
    pub rescale_from: Option<u16>,
    /// Run a job file that lists steps it does not do (`[job] left_out`).
    pub allow_left_out: bool,
}

/// The member this process is, from `--member I --members N` or
/// `--member-from-hostname --members N` (none of them: the job as one process).
pub fn member(
    index: Option<u16>,
    count: Option<u16>,
    from_hostname: bool,
) -> Result<Member, String> {
    match (index, count, from_hostname) {
        (None, None, false) => Ok(Member::SOLO),
        (Some(i), Some(n), false) => Member::new(i, n),
        (None, Some(n), true) => Member::from_hostname(&hostname()?, n),
        (None, Some(_), false) => {
            Err("--members needs --member I or --member-from-hostname".into())
        }
        _ => Err("--member and --member-from-hostname need --members N".into()),
    }
}

fn hostname() -> Result<String, String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that many
    // bytes, and the result is read up to its first NUL (or the whole buffer).
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return Err(format!(
            "--member-from-hostname: cannot read the host name: {}",
            std::io::Error::last_os_error()
        ));
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// Whether a job file that lists `left_out` steps may run: only with the opt-in
/// (`--allow-left-out`), as its records differ from those of what it was translated
/// from. The error says which steps and what to do.
pub fn refuse_left_out(left_out: &[String], allowed: bool) -> Result<(), String> {
    if left_out.is_empty() || allowed {
        return Ok(());
    }
    Err(format!(
        "the file does not do {} of the configuration it was translated from ({}; each marked `# LEFT OUT:` in the file), so its records differ: do them another way and delete job.left_out, or run with --allow-left-out",
        if left_out.len() == 1 { "a step".to_string() } else { format!("{} steps", left_out.len()) },
        left_out.join(", ")
    ))
}

/// Runs the job of `config` to its end; SIGTERM or Ctrl-C stop it with a final
/// checkpoint and exit 0.
pub fn run(registry: &crate::connector::Registry, config: &Path, args: RunArgs) -> i32 {
    let mut job = match crate::config::load(config, registry) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_USAGE;
        }
    };
    if let Err(e) = refuse_left_out(&job.left_out, args.allow_left_out) {
        eprintln!("error: {}: job.left_out: {e}", config.display());
        return EXIT_USAGE;
    }
    job.member = args.member;
    if let Err((key, e)) = job.check_members() {
        eprintln!("error: {}: {key}: {e}", config.display());
        return EXIT_USAGE;
    }
    if args.rescale_from == Some(0) {
        eprintln!("error: --rescale-from must be at least 1");
        return EXIT_USAGE;
    }
    super::heap_trim::start();
    let rt = runtime();
    rt.block_on(async move {
        let telemetry = Telemetry::new(
            &job.name,
            &job.describe(),
            job.parallelism,
            job.max_parallelism,
        );
        let control = crate::control::JobControl::new();
        if let Some(addr) = job.metrics_listen {
            if job.control.as_ref().is_some_and(|c| c.token.is_none()) && !addr.ip().is_loopback() {
                warn!(job = %job.name, listen = %addr, "the control API has no token_file and listens beyond loopback: anyone who reaches it can stop or pause the job");
            }
            let api = job.control.as_ref().map(|s| (control.clone(), s));
            match crate::telemetry::server::serve(addr, telemetry.clone(), api).await {
                Ok(bound) => {
                    info!(job = %job.name, url = %format!("http://{bound}/"), control_api = job.control.is_some(), token = job.control.as_ref().is_some_and(|c| c.token.is_some()), "serving metrics, probes, the REST API and the status page")
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
        let signalled = control.clone();
        tokio::spawn(async move {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("SIGTERM handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            signalled.stop();
        });
        let opts = RunOptions {
            restore: args.restore,
            allow_non_restored_state: args.allow_non_restored_state,
            stop: Some(control.stop_signal()),
            telemetry: Some(telemetry),
            rescale_from: args.rescale_from,
            control: job.control.is_some().then_some(control),
        };
        info!(job = %job.name, graph = %job.describe(), parallelism = job.parallelism, member = %job.member, "job starting");
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
