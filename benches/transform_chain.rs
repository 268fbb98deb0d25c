//! The cost of a chain of three transforms per record (see `support::transforms`).
//! Printed as JSON. `cargo bench --bench transform_chain` (a few seconds).

mod support;

fn main() {
    println!("{}", support::transforms::measure());
}
