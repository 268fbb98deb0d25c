//! The Kafka source against plain rdkafka consumer loops (see `support/source.rs`);
//! prints one line of JSON. `KAFKA_SOURCE_BENCH_ONLY=raw` or `=lockgate` runs one side
//! alone, for a profile.
//! `cargo bench --bench kafka_source`.

mod support;

fn main() {
    let only = std::env::var("KAFKA_SOURCE_BENCH_ONLY").ok();
    if let Some(report) = support::source::measure(only.as_deref()) {
        println!("{report}");
    }
}
