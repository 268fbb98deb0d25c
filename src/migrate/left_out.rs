//! What a setting left out of a translation means for the records: one that changes
//! them (a transform, a converter, a setting of what is written, the Kafka cluster)
//! makes the job file not runnable as it is ([`changes_records`]); the file then marks
//! the place of each such step ([`mark`]) and lists them under `[job] left_out`, which
//! `lockgate run` refuses without `--allow-left-out`.

use super::job_file::{Entry, JobFile};

/// The pseudo-setting of the Kafka cluster: a worker's `bootstrap.servers`, which no
/// connector configuration holds.
pub const CLUSTER: &str = "bootstrap.servers";

/// Whether leaving `setting` out may change what the job reads or writes (which
/// records, their shape, their ids, or the cluster): everything but the settings
/// known to be about connections, credentials, batching, retries, logging and the
/// index mapping. A setting unknown to the translation counts as changing records:
/// what it does is not known.
pub fn changes_records(setting: &str) -> bool {
    const HARMLESS_PREFIXES: &[&str] = &[
        "connection.",
        "proxy.",
        "elastic.",
        "consumer.override.",
        "errors.retry.",
        "errors.log.",
        "errors.deadletterqueue.topic.replication.factor",
        "errors.deadletterqueue.context.headers.enable",
    ];
    const HARMLESS: &[&str] = &[
        "name",
        "tasks.max",
        // The index mapping, not the documents.
        "schema.ignore",
        "topic.schema.ignore",
        // Predicates that no Filter names select nothing (a Filter whose predicate
        // is left out is reported under its transform).
        "predicates",
        "batch.size",
        "bulk.size.bytes",
        "max.in.flight.requests",
        "max.buffered.records",
        "linger.ms",
        "flush.timeout.ms",
        "flush.synchronously",
        "max.retries",
        "retry.backoff.ms",
        "read.timeout.ms",
        "type.name",
    ];
    if HARMLESS.contains(&setting) {
        return false;
    }
    if setting.starts_with("predicates.") {
        return false;
    }
    !HARMLESS_PREFIXES.iter().any(|p| setting.starts_with(p))
}

/// Marks each of `missing` (`(setting, why)`, settings that change records) at its
/// place in `f`: a transform's between the `[[transform]]`s of the steps around it in
/// `chain` (the connector's transform names, in order), the cluster above
/// `bootstrap_servers`, a converter's or a source setting's in `[source.kafka]`,
/// anything else in `[sink.elasticsearch]`; then lists them as `[job] left_out`.
pub fn mark(f: &mut JobFile, chain: &[&str], missing: &[(String, String)]) {
    if missing.is_empty() {
        return;
    }
    // The chain position of a [[transform]] section: the step its `type` came from.
    let step_of = |entries: &[Entry]| -> Option<usize> {
        let from = entries.iter().find(|e| e.key == "type")?.from.first()?;
        let name = from.strip_prefix("transforms.")?.strip_suffix(".type")?;
        chain.iter().position(|n| *n == name)
    };
    for (setting, why) in missing {
        if let Some(rest) = setting.strip_prefix("transforms.") {
            let name = rest.split('.').next().unwrap_or_default();
            let at_step = chain.iter().position(|n| *n == name).unwrap_or(chain.len());
            let transforms: Vec<(usize, Option<usize>)> = f
                .sections
                .iter()
                .enumerate()
                .filter(|(_, s)| s.array && s.header == "transform")
                .map(|(i, s)| (i, step_of(&s.entries)))
                .collect();
            let at = transforms
                .iter()
                .find(|(_, step)| step.is_some_and(|s| s > at_step))
                .map(|(i, _)| *i)
                .or_else(|| transforms.last().map(|(i, _)| i + 1))
                .or_else(|| {
                    f.sections
                        .iter()
                        .position(|s| s.header == "sink.elasticsearch")
                })
                .unwrap_or(f.sections.len());
            // After the marks already at that place, in the chain's order.
            let at = (at..f.sections.len())
                .take_while(|&i| f.sections[i].header.is_empty())
                .last()
                .map_or(at, |i| i + 1);
            f.left_out_step(at, setting, why);
            continue;
        }
        let source_side = setting == CLUSTER
            || setting.starts_with("value.converter")
            || setting.starts_with("key.converter")
            || setting.starts_with("topics")
            || setting.starts_with("errors.")
            || setting == "drop.invalid.message";
        let section = f.section(if source_side {
            "source.kafka"
        } else {
            "sink.elasticsearch"
        });
        let at = if setting == CLUSTER {
            section
                .entries
                .iter()
                .position(|e| e.key == "bootstrap_servers")
        } else {
            section
                .entries
                .iter()
                .rposition(|e| e.from.iter().any(|k| k == setting))
                .map(|i| i + 1)
        };
        let at = at.unwrap_or(section.entries.len());
        section.entries.insert(at, Entry::left_out(setting, why));
    }
    let list: Vec<toml::Value> = missing
        .iter()
        .map(|(k, _)| toml::Value::String(k.clone()))
        .collect();
    f.section("job")
        .set("left_out", toml::Value::Array(list), &[])
        .because(
            "steps of the connector this file does not do (each marked LEFT OUT where it belongs): the job's records differ from the connector's. `lockgate run` refuses the file while this key is here, unless given --allow-left-out; do them another way, then delete this key",
        );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_changes_records() {
        let table = [
            ("transforms.mask.type", true),
            ("transforms.unwrap.field.syntax.version", true),
            ("transforms", true),
            ("value.converter", true),
            ("key.converter", true),
            ("value.converter.enhanced.avro.schema.support", true),
            ("behavior.on.null.values", true),
            ("behavior.on.malformed.documents", true),
            ("drop.invalid.message", true),
            ("key.ignore", true),
            ("data.stream.type", true),
            ("data.stream.timestamp.field", true),
            ("external.version.header", true),
            ("compact.map.entries", true),
            ("use.autogenerated.ids", true),
            ("topic.key.ignore", true),
            ("external.resource.usage", true),
            ("made.up", true),
            (CLUSTER, true),
            ("schema.ignore", false),
            ("topic.schema.ignore", false),
            ("connection.username", false),
            ("proxy.host", false),
            ("elastic.https.ssl.truststore.location", false),
            ("consumer.override.max.poll.records", false),
            ("errors.retry.timeout", false),
            ("errors.log.include.messages", false),
            ("errors.deadletterqueue.topic.replication.factor", false),
            ("predicates", false),
            ("predicates.p.type", false),
            ("max.retries", false),
        ];
        for (setting, changes) in table {
            assert_eq!(changes_records(setting), changes, "{setting}");
        }
    }

    #[test]
    fn a_missing_transform_is_marked_between_its_neighbours() {
        let mut f = JobFile::default();
        f.section("job").set("name", "j", &["name"]);
        f.section("source.kafka")
            .set("bootstrap_servers", "localhost:9092", &[]);
        f.array_section("transform")
            .set("type", "flatten", &["transforms.a.type"]);
        f.array_section("transform")
            .set("type", "mask_field", &["transforms.c.type"]);
        f.section("sink.elasticsearch").set("index", "x", &[]);
        mark(
            &mut f,
            &["a", "b", "c", "d"],
            &[
                ("transforms.b.type".into(), "no transform for B".into()),
                ("transforms.d.type".into(), "no transform for D".into()),
                (CLUSTER.into(), "not given".into()),
            ],
        );
        let text = f.render("");
        let flatten = text.find("\"flatten\"").unwrap();
        let b = text
            .find("# LEFT OUT: transforms.b.type: no transform for B")
            .unwrap();
        let mask = text.find("\"mask_field\"").unwrap();
        let d = text
            .find("# LEFT OUT: transforms.d.type: no transform for D")
            .unwrap();
        let sink = text.find("[sink.elasticsearch]").unwrap();
        assert!(flatten < b && b < mask && mask < d && d < sink, "{text}");
        assert!(
            text.contains("# LEFT OUT: bootstrap.servers: not given\nbootstrap_servers ="),
            "{text}"
        );
        let back: toml::Value = toml::from_str(&text).unwrap();
        assert_eq!(back["transform"].as_array().unwrap().len(), 2, "{text}");
        assert_eq!(
            back["job"]["left_out"],
            toml::Value::Array(vec![
                "transforms.b.type".into(),
                "transforms.d.type".into(),
                "bootstrap.servers".into()
            ])
        );
    }
}
