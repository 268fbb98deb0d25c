//! `lockgate-dir`: the `lockgate` command line with the directory source added, so
//! that a job file can name `[source.dir]`.

fn main() {
    let registry = lockgate::builtin::registry()
        .with_source::<lockgate_connector_dir_source::DirSection>(
            lockgate_connector_dir_source::KIND,
        );
    std::process::exit(lockgate::cli::main_with(registry));
}
