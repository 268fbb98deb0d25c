//! A connector's settings as the translation reads them: each one used is marked, so
//! that every other one can be reported.

use std::collections::{BTreeMap, BTreeSet};

/// The settings and which of them were used.
pub struct Settings<'a> {
    pub all: &'a BTreeMap<String, String>,
    pub used: BTreeSet<String>,
    pub left_out: Vec<(String, String)>,
}

impl<'a> Settings<'a> {
    pub fn get(&mut self, key: &str) -> Option<&'a str> {
        let v = self.all.get(key)?;
        self.used.insert(key.to_string());
        Some(v.as_str())
    }

    pub fn peek(&self, key: &str) -> Option<&'a str> {
        self.all.get(key).map(String::as_str)
    }

    pub fn flag(&mut self, key: &str, default: bool) -> bool {
        match self.get(key).map(|v| v.trim().to_ascii_lowercase()) {
            Some(v) if v == "true" => true,
            Some(v) if v == "false" => false,
            _ => default,
        }
    }

    /// Reports `key` (if set) as left out, for `why`.
    pub fn leave(&mut self, key: &str, why: impl Into<String>) {
        if self.all.contains_key(key) && self.used.insert(key.to_string()) {
            self.left_out.push((key.to_string(), why.into()));
        }
    }

    /// Every setting under `prefix`, marked used.
    pub fn family(&mut self, prefix: &str) -> Vec<(&'a str, &'a str)> {
        let keys: Vec<(&'a str, &'a str)> = self
            .all
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        for (k, _) in &keys {
            self.used.insert(k.to_string());
        }
        keys
    }
}
