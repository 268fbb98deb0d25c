//! The Elasticsearch sink against a plain bulk loop (see `support/sink.rs`); prints one
//! line of JSON. `LOCKGATE_BENCH_DOCS` and `LOCKGATE_BENCH_ROUNDS` size it;
//! `LOCKGATE_BENCH_ONLY=raw` or `=sink` runs one side alone, for a profile.
//! `cargo bench --bench es_sink`.

mod support;

fn main() {
    let only = std::env::var("LOCKGATE_BENCH_ONLY").ok();
    let report = match only.as_deref() {
        None => Some(support::sink::measure()),
        Some(side) => support::sink::measure_with(
            support::env_or("LOCKGATE_BENCH_DOCS", support::sink::DOCS),
            support::env_or("LOCKGATE_BENCH_ROUNDS", support::sink::ROUNDS),
            Some(side),
        ),
    };
    if let Some(report) = report {
        println!("{report}");
    }
}
