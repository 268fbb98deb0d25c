//! Recovery time after a SIGKILL with 10^6 keys of state, on the real `lockgate`
//! binary, printed as JSON (what it measures: `benches/support/recovery.rs`).
//!
//! ```sh
//! cargo build --release && cargo run --release --example recovery_bench [-- KEYS [ROUNDS]]
//! ```
//! KEYS defaults to 1,000,000 and ROUNDS to 5.

#[path = "../benches/support/recovery.rs"]
mod recovery;

fn main() {
    let keys: i64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let rounds: usize = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let lockgate = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent()?.parent().map(|p| p.join("lockgate")))
        .filter(|p| p.exists())
        .expect("build the lockgate binary first (cargo build --release)");
    println!("{}", recovery::measure(&lockgate, keys, rounds));
}
