//! The documentation runs as written: every example job file's documented commands,
//! and the README's "your first job" walk-through, executed by a shell with `lockgate`
//! on the PATH, from a copy of the repository's `examples/jobs` (so that `data/` lands
//! in a temporary directory). The only change to a command is the port of a test server
//! (9092 / 9200 / 8081 / 5432 become free ports, and the job reads them from
//! LOCKGATE_KAFKA / LOCKGATE_ES / LOCKGATE_REGISTRY / LOCKGATE_POSTGRES, as the job files
//! document).

mod common;

use common::es::free_port;
use common::{bin, tail, wait_timeout};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A directory shaped like the repository root: `examples/jobs/*.toml`.
fn workdir() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let jobs = tmp.path().join("examples/jobs");
    std::fs::create_dir_all(&jobs).unwrap();
    for e in std::fs::read_dir(repo().join("examples/jobs")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, jobs.join(p.file_name().unwrap())).unwrap();
    }
    tmp
}

/// `sh -c line` in `dir` with the binary's directory first on the PATH.
fn shell(dir: &Path, line: &str, env: &[(&str, String)]) -> Command {
    let bin_dir = bin().parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut c = Command::new("bash");
    c.args(["-c", line])
        .current_dir(dir)
        .env("PATH", path)
        .env_remove("LOCKGATE_FAILPOINTS")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    c
}

/// The commands in a job file's comment: `#   lockgate ...` lines, without trailing
/// comments.
fn documented_commands(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(str::trim)
        .filter(|l| l.starts_with("lockgate "))
        .map(|l| l.split(" #").next().unwrap().trim().to_string())
        .collect()
}

struct Background(Vec<Child>);

impl Drop for Background {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn every_example_job_file_runs_as_its_comment_says() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("examples/jobs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    for file in files {
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        let commands = documented_commands(&std::fs::read_to_string(&file).unwrap());
        assert!(
            commands
                .iter()
                .any(|c| c.contains(&format!("run --config examples/jobs/{name}"))),
            "{name} documents the command that runs it: {commands:?}"
        );
        let dir = workdir();
        let (kafka, es, registry, pg) = (free_port(), free_port(), free_port(), free_port());
        let env = [
            ("LOCKGATE_KAFKA", format!("127.0.0.1:{kafka}")),
            ("LOCKGATE_ES", format!("http://127.0.0.1:{es}")),
            ("LOCKGATE_REGISTRY", format!("http://127.0.0.1:{registry}")),
            (
                "LOCKGATE_POSTGRES",
                format!("postgresql://lockgate@127.0.0.1:{pg}/app"),
            ),
        ];
        let mut servers = Background(Vec::new());
        for cmd in &commands {
            let line = cmd
                .replace("--port 9092", &format!("--port {kafka}"))
                .replace("--port 5432", &format!("--port {pg}"))
                .replace("127.0.0.1:9200", &format!("127.0.0.1:{es}"))
                .replace("127.0.0.1:8081", &format!("127.0.0.1:{registry}"));
            if let Some(line) = line.strip_suffix('&') {
                // A server: ready once it printed its address.
                let mut child = shell(dir.path(), line.trim(), &env)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap();
                let mut first = String::new();
                BufReader::new(child.stdout.take().unwrap())
                    .read_line(&mut first)
                    .unwrap();
                assert!(
                    !first.trim().is_empty(),
                    "{name}: `{cmd}` printed its address"
                );
                servers.0.push(child);
            } else {
                let log = dir.path().join("command.log");
                let mut child = shell(dir.path(), &line, &env)
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(&log).unwrap())
                    .spawn()
                    .unwrap();
                let status = wait_timeout(&mut child, Duration::from_secs(300));
                assert!(
                    status.success(),
                    "{name}: `{cmd}` exited {status}:\n{}",
                    tail(&std::fs::read_to_string(&log).unwrap(), 30)
                );
            }
        }
        assert!(
            dir.path().join("data").is_dir(),
            "{name}: its checkpoints went to data/"
        );
    }
}

#[test]
fn the_readme_first_job_walk_through_runs_as_written() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let block = readme
        .split("<!-- first-job -->")
        .nth(1)
        .and_then(|b| b.split("<!-- /first-job -->").next())
        .expect("the walk-through block");
    let script: Vec<&str> = block
        .lines()
        .filter(|l| !l.starts_with("```"))
        // Building is the caller's business: the binary under test is already built.
        .filter(|l| !l.starts_with("cargo "))
        .collect();
    assert!(script.iter().any(|l| l.contains("kill -9")), "{block}");
    let dir = workdir();
    // `${CARGO_TARGET_DIR:-$PWD/target}/release` must name the binary's directory.
    let target = bin().parent().unwrap().parent().unwrap().to_path_buf();
    let out = shell(
        dir.path(),
        &format!("set -euo pipefail\n{}", script.join("\n")),
        &[("CARGO_TARGET_DIR", target.display().to_string())],
    )
    .output()
    .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "the walk-through failed:\n{stdout}\n{}",
        tail(&stderr, 30)
    );
    assert!(
        stdout.lines().any(|l| l.trim() == "200000"),
        "every record exactly once:\n{stdout}"
    );
    assert!(
        stdout.contains("verified"),
        "inspect verified the checkpoint:\n{stdout}"
    );
    assert!(
        stderr.contains("restoring"),
        "the second run resumed from a checkpoint:\n{}",
        tail(&stderr, 30)
    );
}
