//! The `lockgate` command.

fn main() {
    std::process::exit(lockgate::cli::main());
}
