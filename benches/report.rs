//! Every performance figure of lockgate in one JSON report, from one run on one machine:
//! each ratio is measured side by side in the same run (alternating rounds, medians).
//! `cargo bench --bench report` (about 15 minutes on 2 cores; progress on stderr).
//!
//! | figure | target |
//! |---|---|
//! | `source.source_ratio` (parallelism 1), `source.source_ratio_p2` | >= 0.90 of plain rdkafka loops |
//! | `sink.sink_ratio` | >= 0.90 of a plain bulk loop |
//! | `end_to_end.ratio_on_over_off` | >= 0.95 (1 s checkpoints against none) |
//! | `checkpoint_by_keys[keys = 10^6].p99_ms` | < 100 ms |
//! | `recovery.recovery_ms_median` (10^6 keys) | < 1000 ms |
//! | `demo_memory.peak_rss_mib_max` (10^6 orders) | <= 80 MiB |
//! | `demo_memory.ratio_large_over_small` (10^6 against 10^5 orders) | <= 1.25 |
//! | `format_speed.ratio_avro_over_json` (Kafka -> files, Avro values against JSON) | >= 0.75 |
//! | `format_speed.ratio_chain_over_none` (`insert_field`, `replace_field`, `cast`) | >= 0.80 |
//! | `format_speed.ratio_jq_over_none` (`. + {x: .a}`) | >= 0.50 |
//! | `avro.avro_to_json_ns_per_record`, `avro.source_ratio_avro_over_json` | reported (no target) |
//! | `transforms.chain_ns_per_record` (`insert_field`, `replace_field`, `cast`) | reported (no target) |
//! | `transforms.cdc_chain_ns_per_record` (`debezium`, `replace_field`, `insert_field`), `transforms.jq_ns_per_record` | reported (no target) |
//! | `transforms.end_to_end.ratio_chain_over_none` (the CDC chain against no transform) | reported (no target) |
//! | `postgres.sink_ratio` (two-phase, 1 s checkpoints, against a plain `COPY` loop) | >= 0.80 |

mod support;

use serde_json::{json, Value};

fn main() {
    let machine = support::machine();
    eprintln!("machine: {machine}");
    let step = |name: &str| eprintln!("== {name}");
    // First, while this process is small: Linux counts the RSS a child had before its
    // exec (a copy of ours) in its peak, and the later parts grow this process.
    step("the demo job's peak memory");
    let memory = support::end_to_end::demo_memory(100_000, 1_000_000, 3);
    step("Kafka source against plain rdkafka loops");
    let source = support::source::measure(None).expect("both sides ran");
    step("Elasticsearch sink against a plain bulk loop");
    let sink = support::sink::measure();
    step("the demo's job end to end, checkpoints every second against none");
    let end_to_end = support::end_to_end::checkpoint_overhead(800_000, 16, 3);
    step("checkpoint latency by state size");
    let by_keys = support::checkpoints::checkpoint_by_keys(
        &[10_000, 100_000, 1_000_000, 10_000_000],
        4_000_000,
        250,
    );
    step("recovery after SIGKILL with 10^6 keys");
    let recovery = support::recovery::measure(std::path::Path::new(support::bin()), 1_000_000, 5);
    step("Avro against JSON, per record and through the Kafka source");
    let avro = support::avro::measure();
    step("Kafka -> files with Avro values, a chain of transforms and jq, against JSON");
    let format_speed = support::format_speed::measure();
    step("transforms against the JSON check, and the CDC chain end to end");
    let transforms = support::transforms::measure();
    step("Postgres sink against a plain COPY loop");
    let postgres = support::postgres::measure();
    step("a tumbling count by 10^5 keys against rolling_sum");
    let windows = support::windows::measure(2_000_000, 100_000, 3);

    let p99_1m = by_keys
        .as_array()
        .and_then(|v| v.iter().find(|c| c["keys"] == 1_000_000))
        .map_or(Value::Null, |c| c["p99_ms"].clone());
    let target = |value: &Value, ok: fn(f64) -> bool, goal: &str| json!({ "value": value, "target": goal, "met": value.as_f64().is_some_and(ok) });
    let targets = json!({
        "source_ratio": target(&source["source_ratio"], |v| v >= 0.90, ">= 0.90"),
        "source_ratio_p2": target(&source["source_ratio_p2"], |v| v >= 0.90, ">= 0.90"),
        "sink_ratio": target(&sink["sink_ratio"], |v| v >= 0.90, ">= 0.90"),
        "end_to_end_checkpoints_on_over_off": target(&end_to_end["ratio_on_over_off"], |v| v >= 0.95, ">= 0.95"),
        "checkpoint_p99_ms_1m_keys": target(&p99_1m, |v| v < 100.0, "< 100"),
        "recovery_ms_1m_keys": target(&recovery["recovery_ms_median"], |v| v < 1000.0, "< 1000"),
        "demo_peak_rss_mib": target(&memory["peak_rss_mib_max"], |v| v <= 80.0, "<= 80"),
        "demo_memory_ratio": target(&memory["ratio_large_over_small"], |v| v <= 1.25, "<= 1.25"),
        "postgres_sink_ratio": target(&postgres["sink_ratio"], |v| v >= 0.80, ">= 0.80"),
        "avro_job_over_json": target(&format_speed["ratio_avro_over_json"], |v| v >= 0.75, ">= 0.75"),
        "transform_chain_job_over_none": target(&format_speed["ratio_chain_over_none"], |v| v >= 0.80, ">= 0.80"),
        "jq_job_over_none": target(&format_speed["ratio_jq_over_none"], |v| v >= 0.50, ">= 0.50"),
    });
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({
            "machine": machine,
            "targets": targets,
            "source": source,
            "sink": sink,
            "end_to_end": end_to_end,
            "checkpoint_by_keys": by_keys,
            "recovery": recovery,
            "demo_memory": memory,
            "avro": avro,
            "format_speed": format_speed,
            "transforms": transforms,
            "postgres": postgres,
            "windows": windows,
        }))
        .expect("JSON")
    );
}
