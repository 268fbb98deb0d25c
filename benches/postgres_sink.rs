//! The Postgres sink against a plain `COPY` loop (see `support/postgres.rs`); prints one
//! line of JSON. `LOCKGATE_BENCH_ROWS` and `LOCKGATE_BENCH_ROUNDS` size it.
//! `cargo bench --bench postgres_sink`.

mod support;

fn main() {
    println!("{}", support::postgres::measure());
}
