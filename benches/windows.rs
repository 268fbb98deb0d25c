//! Records per second through a tumbling count by 10^5 keys against the same job with
//! `rolling_sum`, measured in one run, alternating, medians of 3 rounds, printed as
//! JSON. `cargo bench --bench windows`; `LOCKGATE_BENCH_RECORDS` (2,000,000),
//! `LOCKGATE_BENCH_KEYS` (100,000).

mod support;

fn main() {
    let records: i64 = support::env_or("LOCKGATE_BENCH_RECORDS", 2_000_000);
    let keys: u32 = support::env_or("LOCKGATE_BENCH_KEYS", 100_000);
    println!("{}", support::windows::measure(records, keys, 3));
}
