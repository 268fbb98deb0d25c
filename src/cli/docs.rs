//! `lockgate completions SHELL` and `lockgate manpages DIR`: the command line itself,
//! for shells and for `man`, generated from the same definitions that parse it.

use super::{Cli, EXIT_FAILURE, EXIT_USAGE};
use clap::CommandFactory;
use std::path::Path;

/// Prints the completion script of `shell` to stdout.
pub fn completions(shell: clap_complete::Shell) -> i32 {
    let mut cmd = Cli::command();
    clap_complete::generate(shell, &mut cmd, "lockgate", &mut std::io::stdout());
    0
}

/// Writes `lockgate.1` and one page per command (`lockgate-run.1`,
/// `lockgate-checkpoints-inspect.1`, ...) into `dir`, creating it if needed.
pub fn manpages(dir: &Path) -> i32 {
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("error: cannot create {}: {e}", dir.display());
        return EXIT_USAGE;
    }
    let mut written = 0usize;
    for (name, cmd) in pages() {
        let path = dir.join(format!("{name}.1"));
        let mut page = Vec::new();
        if let Err(e) = clap_mangen::Man::new(cmd).render(&mut page) {
            eprintln!("error: rendering {name}: {e}");
            return EXIT_FAILURE;
        }
        if let Err(e) = std::fs::write(&path, page) {
            eprintln!("error: cannot write {}: {e}", path.display());
            return EXIT_FAILURE;
        }
        written += 1;
    }
    eprintln!("wrote {written} man pages into {}", dir.display());
    0
}

/// Every page: `lockgate` and each command below it, named as `man` looks them up
/// (`lockgate-checkpoints-inspect`). Each command is renamed to its page name so that
/// its synopsis reads `lockgate-run [OPTIONS] --config <CONFIG>`, the way git's pages do.
fn pages() -> Vec<(String, clap::Command)> {
    let mut root = Cli::command();
    root.build();
    let mut out = Vec::new();
    fn walk(cmd: &clap::Command, name: String, out: &mut Vec<(String, clap::Command)>) {
        // clap's own `help` subcommands are not commands of lockgate.
        let subs = cmd
            .get_subcommands()
            .filter(|s| !s.is_hide_set() && s.get_name() != "help");
        for sub in subs {
            let page = format!("{name}-{}", sub.get_name());
            walk(sub, page.clone(), out);
            out.push((page.clone(), sub.clone().name(page.clone()).bin_name(page)));
        }
    }
    walk(&root, "lockgate".into(), &mut out);
    out.push(("lockgate".into(), root));
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_command_has_a_page_that_names_it() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(super::manpages(dir.path()), 0);
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!names.iter().any(|n| n.contains("-help")), "{names:?}");
        for name in [
            "lockgate",
            "lockgate-run",
            "lockgate-checkpoints",
            "lockgate-checkpoints-inspect",
            "lockgate-checkpoints-alter",
            "lockgate-testkit-kafka",
            "lockgate-completions",
        ] {
            let page = std::fs::read_to_string(dir.path().join(format!("{name}.1")))
                .unwrap_or_else(|e| panic!("{name}.1: {e}"));
            assert!(
                page.starts_with(".ie") || page.contains(".TH"),
                "{name}: {page}"
            );
            assert!(
                page.contains(&name.replace('-', "\\-")),
                "{name}.1 names it"
            );
        }
        let run = std::fs::read_to_string(dir.path().join("lockgate-run.1")).unwrap();
        assert!(run.contains("\\-\\-restore"), "options are documented");
    }
}
