//! What `lockgate --version` says: the release, the commit it was built from, the
//! features compiled in, and the versions of the C libraries linked into the binary
//! (librdkafka and RocksDB), as a bug report needs them.

/// The lines after `lockgate X.Y.Z` in `lockgate --version`.
pub fn long_version() -> String {
    let mut features = Vec::new();
    if cfg!(feature = "failpoints") {
        features.push("failpoints");
    }
    if cfg!(feature = "harness") {
        features.push("harness");
    }
    let (_, librdkafka) = rdkafka::util::get_rdkafka_version();
    format!(
        "{}\ncommit:     {}\ntarget:     {}\nfeatures:   {}\nlibrdkafka: {librdkafka} ({})\nRocksDB:    {}",
        env!("CARGO_PKG_VERSION"),
        env!("LOCKGATE_COMMIT"),
        env!("LOCKGATE_TARGET"),
        if features.is_empty() {
            "none".to_string()
        } else {
            features.join(", ")
        },
        librdkafka_features(),
        env!("LOCKGATE_ROCKSDB_VERSION"),
    )
}

/// librdkafka's own list of what it was built with (`builtin.features`: ssl, sasl
/// mechanisms, compression codecs, ...).
fn librdkafka_features() -> String {
    rdkafka::ClientConfig::new()
        .create_native_config()
        .and_then(|c| c.get("builtin.features"))
        .unwrap_or_else(|e| format!("unknown: {e}"))
        .replace(',', ", ")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_long_version_names_the_commit_and_both_libraries() {
        let v = super::long_version();
        assert!(v.starts_with(env!("CARGO_PKG_VERSION")), "{v}");
        // The librdkafka line lists what the linked library itself reports.
        let line = v.lines().find(|l| l.starts_with("librdkafka:")).unwrap();
        assert!(
            line.contains("ssl") && line.contains("sasl_scram"),
            "{line}"
        );
        let rocks = v.lines().find(|l| l.starts_with("RocksDB:")).unwrap();
        let rocks = rocks.trim_start_matches("RocksDB:").trim();
        assert!(
            rocks.split('.').count() == 3 && rocks.split('.').all(|p| p.parse::<u32>().is_ok()),
            "{rocks}"
        );
        assert!(v.contains("features:   failpoints, harness"), "{v}");
    }
}
