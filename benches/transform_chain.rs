//! The cost of transforms per record and of the CDC chain end to end (see
//! `support::transforms`). Printed as JSON. `cargo bench --bench transform_chain`
//! (about a minute).

mod support;

fn main() {
    println!("{}", support::transforms::measure());
}
