//! `lockgate-journal`: the `lockgate` command line with the journal sink added, so
//! that a job file can name `[sink.journal]`.

fn main() {
    let registry = lockgate::builtin::registry()
        .with_sink::<lockgate_connector_journal_sink::JournalSection>(
            lockgate_connector_journal_sink::KIND,
        );
    std::process::exit(lockgate::cli::main_with(registry));
}
