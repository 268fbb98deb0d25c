//! Throughput of one job run as 1, 2 and 3 members, printed as JSON
//! (`support::end_to_end::members_throughput`).
//!
//! `cargo bench --bench members`. Environment: `LOCKGATE_BENCH_RECORDS` (orders,
//! 600,000), `LOCKGATE_BENCH_ROUNDS` (3), `LOCKGATE_BENCH_MEMBERS` (`1,2,3`).
//! The members share the machine's cores with each other, the embedded Kafka and the
//! Elasticsearch test server: on a small machine more members add no cores, only
//! processes; the figure shows what splitting costs, not what more machines give.

mod support;

fn main() {
    let orders: u64 = support::env_or("LOCKGATE_BENCH_RECORDS", 600_000);
    let rounds: usize = support::env_or("LOCKGATE_BENCH_ROUNDS", 3);
    let counts: Vec<u16> = std::env::var("LOCKGATE_BENCH_MEMBERS")
        .unwrap_or_else(|_| "1,2,3".into())
        .split(',')
        .map(|c| {
            c.trim()
                .parse()
                .expect("LOCKGATE_BENCH_MEMBERS: numbers separated by commas")
        })
        .collect();
    let mut report = support::end_to_end::members_throughput(orders, 24, rounds, &counts);
    report["machine"] = support::machine();
    println!("{report}");
}
