//! An object store as a job file names it: a location (`s3://bucket/prefix`) and the
//! S3 client settings a section may give, each winning over its `AWS_*` environment
//! variable. The checkpoint directory and the file sink take the same keys.

use crate::secret::{read_secret_file, Secret};
use lockgate_state::store::StoreLocation;
use std::path::{Path, PathBuf};

/// The S3 client settings of a section (`endpoint`, `region`, `allow_http`,
/// `access_key_id`, `secret_access_key` or `secret_access_key_file`).
#[derive(Debug, Clone, Default)]
pub struct S3Settings {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub allow_http: Option<bool>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<Secret>,
    pub secret_access_key_file: Option<PathBuf>,
}

impl S3Settings {
    /// The first key that is set, in the order above (a local directory takes none).
    pub fn first_set(&self) -> Option<&'static str> {
        [
            ("endpoint", self.endpoint.is_some()),
            ("region", self.region.is_some()),
            ("allow_http", self.allow_http.is_some()),
            ("access_key_id", self.access_key_id.is_some()),
            ("secret_access_key", self.secret_access_key.is_some()),
            (
                "secret_access_key_file",
                self.secret_access_key_file.is_some(),
            ),
        ]
        .into_iter()
        .find(|(_, set)| *set)
        .map(|(k, _)| k)
    }

    /// `store` with these settings applied, its client built once so that a bad
    /// setting is reported here. `resolve` resolves `secret_access_key_file`. An error
    /// is `(key, message)`, the key as the section names it (`dir` for the location).
    pub fn apply(
        &self,
        store: StoreLocation,
        resolve: &dyn Fn(&Path) -> PathBuf,
    ) -> Result<StoreLocation, (String, String)> {
        let err = |k: &str, m: String| (k.to_string(), m);
        if !matches!(store.scheme(), "s3" | "s3a") {
            if let Some(k) = self.first_set() {
                return Err(err(
                    k,
                    format!(
                        "is an S3 setting; a {}:// store takes its settings from its environment variables",
                        store.scheme()
                    ),
                ));
            }
        }
        let secret = match (&self.secret_access_key, &self.secret_access_key_file) {
            (Some(_), Some(_)) => {
                return Err(err(
                    "secret_access_key",
                    "set secret_access_key or secret_access_key_file, not both".into(),
                ))
            }
            (Some(s), None) => Some(s.clone()),
            (None, Some(f)) => {
                Some(read_secret_file(&resolve(f)).map_err(|m| err("secret_access_key_file", m))?)
            }
            (None, None) => None,
        };
        if secret.is_some() != self.access_key_id.is_some() {
            return Err(err(
                if secret.is_some() {
                    "access_key_id"
                } else {
                    "secret_access_key"
                },
                "access_key_id and secret_access_key (or secret_access_key_file) go together"
                    .into(),
            ));
        }
        let mut store = store;
        let options: [(&str, Option<String>); 5] = [
            ("aws_endpoint", self.endpoint.clone()),
            ("aws_region", self.region.clone()),
            ("aws_allow_http", self.allow_http.map(|b| b.to_string())),
            ("aws_access_key_id", self.access_key_id.clone()),
            (
                "aws_secret_access_key",
                secret.map(|s| s.expose().to_string()),
            ),
        ];
        for (k, v) in options {
            if let Some(v) = v {
                store = store.with_option(k, v);
            }
        }
        store.open().map_err(|m| err("dir", m))?;
        Ok(store)
    }
}
