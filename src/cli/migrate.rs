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
    pub bootstrap_servers: Option<String>,
    /// Write the file although steps that change records are left out.
    pub allow_left_out: bool,
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
    if !t.changes_records.is_empty() && !a.allow_left_out {
        // A file that runs would write other records than the connector: none is
        // written, whatever the caller does with the exit code.
        report(&t);
        eprintln!(
            "error: no job file written: the translation leaves out {} that change what the job reads or writes ({}): do them another way, or give --allow-left-out to write the file with their places marked (lockgate run then refuses it without --allow-left-out)",
            if t.changes_records.len() == 1 { "a setting".to_string() } else { format!("{} settings", t.changes_records.len()) },
            t.changes_records.join(", ")
        );
        return EXIT_LEFT_OUT;
    }
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
    report(&t);
    if a.check {
        if let Err(e) = check(&job, &written, a.allow_left_out) {
            eprintln!("error: the job file does not load: {e}");
            return EXIT_USAGE;
        }
        if t.changes_records.is_empty() {
            eprintln!("checked: the job file loads");
        } else {
            eprintln!("checked: the job file loads with --allow-left-out (lockgate run refuses it without: job.left_out)");
        }
    }
    if t.left_out.is_empty() {
        0
    } else {
        EXIT_LEFT_OUT
    }
}

/// Prints what was left out and the notes, on stderr.
fn report(t: &crate::migrate::Translation) {
    for (key, why) in &t.left_out {
        eprintln!("left out: {key}: {why}");
    }
    for n in &t.notes {
        eprintln!("note: {n}");
    }
}

/// Loads `job` (written at `path`, or a temporary file beside the current directory)
/// with placeholders for the `${VARS}` it references that are not set, and refuses
/// it as `lockgate run` would: a file listing left-out steps only with the opt-in.
fn check(job: &str, path: &Path, allow_left_out: bool) -> Result<(), String> {
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
    let graph =
        crate::config::load(&path, &crate::builtin::registry()).map_err(|e| e.to_string())?;
    super::run::refuse_left_out(&graph.left_out, allow_left_out)
        .map_err(|e| format!("{}: job.left_out: {e}", path.display()))
}
