//! `lockgate migrate kafka-connect`.

use super::EXIT_USAGE;
use crate::migrate::{parse, translate, Options};
use std::path::{Path, PathBuf};

/// Exit code when something was left out of the translation.
pub const EXIT_LEFT_OUT: i32 = 3;

pub struct Args {
    pub file: Option<PathBuf>,
    pub out: Option<PathBuf>,
    pub check: bool,
    pub bootstrap_servers: String,
    pub checkpoint_dir: Option<String>,
    pub table: bool,
}

pub fn kafka_connect(a: Args) -> i32 {
    if a.table {
        print!("{}", crate::migrate::table::markdown());
        return 0;
    }
    let Some(file) = a.file else {
        eprintln!("error: give the connector configuration's file");
        return EXIT_USAGE;
    };
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {}: {e}", file.display());
            return EXIT_USAGE;
        }
    };
    let cfg = match parse(&text) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {}: {e}", file.display());
            return EXIT_USAGE;
        }
    };
    let opts = Options {
        bootstrap_servers: a.bootstrap_servers,
        checkpoint_dir: a.checkpoint_dir,
    };
    let t = match translate(&cfg, &opts) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {}: {e}", file.display());
            return EXIT_USAGE;
        }
    };
    let preamble = format!(
        "Translated by `lockgate migrate kafka-connect` from {}.\nEach key names the Kafka Connect setting it came from.",
        file.file_name().map_or(String::new(), |n| n.to_string_lossy().into_owned())
    );
    let job = t.job.render(&preamble);
    let written = match &a.out {
        Some(out) => match std::fs::write(out, &job) {
            Ok(()) => out.clone(),
            Err(e) => {
                eprintln!("error: {}: {e}", out.display());
                return EXIT_USAGE;
            }
        },
        None => {
            print!("{job}");
            PathBuf::new()
        }
    };
    for (key, why) in &t.left_out {
        eprintln!("left out: {key}: {why}");
    }
    for n in &t.notes {
        eprintln!("note: {n}");
    }
    if a.check {
        if let Err(e) = check(&job, &written) {
            eprintln!("error: the job file does not load: {e}");
            return EXIT_USAGE;
        }
        eprintln!("checked: the job file loads");
    }
    if t.left_out.is_empty() {
        0
    } else {
        EXIT_LEFT_OUT
    }
}

/// Loads `job` (written at `path`, or a temporary file beside the current directory)
/// with placeholders for the `${VARS}` it references that are not set.
fn check(job: &str, path: &Path) -> Result<(), String> {
    let mut rest = job;
    while let Some(i) = rest.find("${") {
        let after = &rest[i + 2..];
        let name: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let variable = !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && after[name.len()..].starts_with('}');
        if variable && std::env::var_os(&name).is_none() {
            // Only the check's own process sees it; nothing is started.
            std::env::set_var(&name, "placeholder-of-migrate-check");
        }
        rest = after;
    }
    let tmp;
    let path = if path.as_os_str().is_empty() {
        tmp = tempfile::Builder::new()
            .prefix(".lockgate-migrate-")
            .suffix(".toml")
            .tempfile_in(".")
            .map_err(|e| e.to_string())?;
        std::fs::write(tmp.path(), job).map_err(|e| e.to_string())?;
        tmp.path().to_path_buf()
    } else {
        path.to_path_buf()
    };
    crate::config::load(&path)
        .map(drop)
        .map_err(|e| e.to_string())
}
