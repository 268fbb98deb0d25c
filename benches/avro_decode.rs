//! The cost of Avro against the JSON path, per record and through the Kafka source
//! (see `support::avro`). Printed as JSON. `cargo bench --bench avro_decode` (about a
//! minute).

mod support;

fn main() {
    println!("{}", support::avro::measure());
}
