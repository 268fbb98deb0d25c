//! Formats and transforms against the JSON path, as Kafka -> files jobs (see
//! `support::format_speed`). Printed as JSON. `cargo bench --bench format_speed`
//! (about two minutes).

mod support;

fn main() {
    println!("{}", support::format_speed::measure());
}
