//! Every performance figure of lockgate in one JSON report (one run, one machine).
//! `cargo bench --bench report`.

mod support;

fn main() {
    let machine = support::machine();
    eprintln!("machine: {machine}");
    let end_to_end = support::end_to_end::checkpoint_overhead(800_000, 16, 3);
    let memory = support::end_to_end::demo_memory(200_000, 3);
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({
            "machine": machine,
            "end_to_end": end_to_end,
            "demo_memory": memory,
        }))
        .expect("JSON")
    );
}
