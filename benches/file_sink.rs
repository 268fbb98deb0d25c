//! The file sink writing Parquet into an object store against a plain loop, without
//! partitions and with `partition_by` (see `support/file_sink.rs`); prints one line of
//! JSON. `LOCKGATE_BENCH_ROWS` and
//! `LOCKGATE_BENCH_ROUNDS` size it. `cargo bench --bench file_sink`.

mod support;

fn main() {
    println!("{}", support::file_sink::measure());
}
