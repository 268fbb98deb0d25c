//! Where a job's checkpoints live: a local directory (the default) or a prefix in an
//! object store (`s3://bucket/prefix`, `gs://`, `az://`, `https://`), and how a store
//! location becomes a client.

use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreScheme};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A checkpoint location as a user writes it (`checkpoint.dir`, `--restore`,
/// `lockgate checkpoints list`): a local path, or an object-store URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointLocation {
    /// A local snapshot directory.
    Local(PathBuf),
    /// A prefix in an object store.
    Store(StoreLocation),
}

impl CheckpointLocation {
    /// Reads `text` as a store URL when it has a scheme (`s3://...`), else as a local
    /// path. An unknown scheme or a store URL without a bucket is an error saying so.
    pub fn parse(text: &str) -> Result<CheckpointLocation, String> {
        if text.contains("://") {
            Ok(CheckpointLocation::Store(StoreLocation::parse(text)?))
        } else {
            Ok(CheckpointLocation::Local(PathBuf::from(text)))
        }
    }

    /// The location one path segment further down: `dir/segment` or
    /// `s3://bucket/prefix/segment`. `segment` must be one plain path component.
    pub fn join(&self, segment: &str) -> CheckpointLocation {
        match self {
            CheckpointLocation::Local(p) => CheckpointLocation::Local(p.join(segment)),
            CheckpointLocation::Store(s) => CheckpointLocation::Store(s.join(segment)),
        }
    }
}

impl fmt::Display for CheckpointLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckpointLocation::Local(p) => write!(f, "{}", p.display()),
            CheckpointLocation::Store(s) => write!(f, "{s}"),
        }
    }
}

/// A prefix in an object store and the client settings to reach it.
///
/// The client reads the standard environment of its store (for S3: `AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL` / `AWS_ENDPOINT`,
/// `AWS_ALLOW_HTTP`); [`StoreLocation::with_option`] settings win over it. `Debug` and
/// `Display` never show an option's value, so a secret in one is never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreLocation {
    scheme: String,
    /// The bucket (or container, or `host[:port]` of an HTTP store).
    bucket: String,
    /// Path segments under the bucket, without empty ones.
    prefix: Vec<String>,
    /// Client settings (`object_store` config keys such as `aws_endpoint`), in order.
    options: Vec<(String, String)>,
}

/// URL schemes accepted as object-store locations.
pub const STORE_SCHEMES: &[&str] = &[
    "s3", "s3a", "gs", "az", "abfs", "abfss", "azure", "http", "https",
];

impl StoreLocation {
    /// Parses `scheme://bucket/prefix`. The scheme must be one of [`STORE_SCHEMES`] and
    /// the bucket must not be empty.
    pub fn parse(text: &str) -> Result<StoreLocation, String> {
        let url = url::Url::parse(text).map_err(|e| format!("`{text}` is not a URL: {e}"))?;
        let scheme = url.scheme().to_string();
        if !STORE_SCHEMES.contains(&scheme.as_str()) {
            return Err(format!(
                "`{scheme}://` is not a supported checkpoint store (use a local path, or one of {})",
                STORE_SCHEMES
                    .iter()
                    .map(|s| format!("{s}://"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(
                "credentials do not belong in the URL: use the store's environment variables or the [checkpoint] keys"
                    .into(),
            );
        }
        let bucket = match url.port() {
            Some(p) => format!("{}:{p}", url.host_str().unwrap_or_default()),
            None => url.host_str().unwrap_or_default().to_string(),
        };
        if bucket.is_empty() {
            return Err(format!(
                "`{text}` names no bucket (write {scheme}://BUCKET/PREFIX)"
            ));
        }
        let mut prefix = Vec::new();
        for seg in url.path().split('/').filter(|s| !s.is_empty()) {
            let seg = percent_decode(seg);
            crate::names::check_component(&seg)
                .map_err(|e| format!("`{text}`: path segment {seg:?} {e}"))?;
            prefix.push(seg);
        }
        Ok(StoreLocation {
            scheme,
            bucket,
            prefix,
            options: Vec::new(),
        })
    }

    /// Adds a client setting (an `object_store` config key of the scheme's builder,
    /// such as `aws_endpoint`, `aws_region`, `aws_allow_http`, `aws_access_key_id`,
    /// `aws_secret_access_key`); it wins over the environment.
    pub fn with_option(mut self, key: &str, value: impl Into<String>) -> StoreLocation {
        self.options.retain(|(k, _)| k != key);
        self.options.push((key.to_string(), value.into()));
        self
    }

    /// This location with the client settings of `other` (the same bucket reached
    /// with the same endpoint and credentials).
    pub fn with_options_of(mut self, other: &StoreLocation) -> StoreLocation {
        self.options = other.options.clone();
        self
    }

    /// The client settings' keys (values are not exposed: they may be secrets).
    pub fn option_keys(&self) -> impl Iterator<Item = &str> {
        self.options.iter().map(|(k, _)| k.as_str())
    }

    /// The location one segment further down, with the same settings.
    pub fn join(&self, segment: &str) -> StoreLocation {
        let mut s = self.clone();
        s.prefix.extend(
            segment
                .split('/')
                .filter(|s| !s.is_empty())
                .map(String::from),
        );
        s
    }

    /// The URL scheme (`s3`, `gs`, ...).
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// The bucket (or container).
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The path segments under the bucket.
    pub fn prefix(&self) -> &[String] {
        &self.prefix
    }

    /// The last path segment, if any (`chk-0000000042` in `s3://b/p/chk-0000000042`).
    pub fn last_segment(&self) -> Option<&str> {
        self.prefix.last().map(String::as_str)
    }

    /// The location without its last segment.
    pub fn parent(&self) -> StoreLocation {
        let mut s = self.clone();
        s.prefix.pop();
        s
    }

    /// The default local staging directory of this location under `base`:
    /// `base/<scheme>/<bucket>/<prefix...>`, so that two locations never share one
    /// (and the staging directory's lock keeps two processes on one machine from
    /// working on the same store prefix).
    pub fn staging_dir(&self, base: &Path) -> PathBuf {
        let mut p = base.join(&self.scheme).join(self.bucket.replace(':', "_"));
        for s in &self.prefix {
            p.push(s);
        }
        p
    }

    /// Builds the client and the prefix path inside the store. The client takes the
    /// scheme's environment variables, then this location's options. Building makes
    /// no request; a bad setting is reported here, naming it.
    pub fn open(&self) -> Result<(Arc<dyn ObjectStore>, StorePath), String> {
        let text = self.url_text();
        let url = url::Url::parse(&text).map_err(|e| format!("{self}: {e}"))?;
        // The path inside the store as the client sees it: for `https://` URLs of a
        // cloud (`https://s3.REGION.amazonaws.com/BUCKET/prefix`) the bucket is part of
        // the URL path, not of the prefix.
        let (scheme, prefix) =
            ObjectStoreScheme::parse(&url).map_err(|e| format!("{self}: {e}"))?;
        let err = |e: object_store::Error| format!("{self}: {e}");
        let store: Arc<dyn ObjectStore> = match scheme {
            ObjectStoreScheme::AmazonS3 => {
                let mut b = object_store::aws::AmazonS3Builder::from_env().with_url(text.clone());
                for (k, v) in &self.options {
                    b = b.with_config(k.parse().map_err(err)?, v);
                }
                Arc::new(b.build().map_err(err)?)
            }
            ObjectStoreScheme::GoogleCloudStorage => {
                let mut b =
                    object_store::gcp::GoogleCloudStorageBuilder::from_env().with_url(text.clone());
                for (k, v) in &self.options {
                    b = b.with_config(k.parse().map_err(err)?, v);
                }
                Arc::new(b.build().map_err(err)?)
            }
            ObjectStoreScheme::MicrosoftAzure => {
                let mut b =
                    object_store::azure::MicrosoftAzureBuilder::from_env().with_url(text.clone());
                for (k, v) in &self.options {
                    b = b.with_config(k.parse().map_err(err)?, v);
                }
                Arc::new(b.build().map_err(err)?)
            }
            ObjectStoreScheme::Http => {
                let mut b = object_store::http::HttpBuilder::new()
                    .with_url(format!("{}://{}", self.scheme, self.bucket));
                for (k, v) in &self.options {
                    b = b.with_config(k.parse().map_err(err)?, v);
                }
                Arc::new(b.build().map_err(err)?)
            }
            other => return Err(format!("{self}: {other:?} is not a checkpoint store")),
        };
        Ok((store, prefix))
    }

    fn url_text(&self) -> String {
        let mut t = format!("{}://{}", self.scheme, self.bucket);
        for s in &self.prefix {
            t.push('/');
            t.push_str(s);
        }
        t
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl fmt::Display for StoreLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.url_text())
    }
}

impl fmt::Debug for StoreLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreLocation")
            .field("url", &self.url_text())
            .field("options", &self.option_keys().collect::<Vec<_>>())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_into_bucket_and_prefix_and_local_paths_stay_paths() {
        let l = CheckpointLocation::parse("s3://orders/jobs/a").unwrap();
        let CheckpointLocation::Store(s) = &l else {
            panic!("{l:?}")
        };
        assert_eq!((s.scheme(), s.bucket()), ("s3", "orders"));
        assert_eq!(s.prefix(), ["jobs", "a"]);
        assert_eq!(s.to_string(), "s3://orders/jobs/a");
        assert_eq!(
            CheckpointLocation::parse("state/orders").unwrap(),
            CheckpointLocation::Local("state/orders".into())
        );
        let s = StoreLocation::parse("s3://b").unwrap();
        assert!(s.prefix().is_empty());
        assert_eq!(s.open().unwrap().1.as_ref(), "");
    }

    #[test]
    fn the_prefix_inside_the_store_leaves_out_a_bucket_named_in_the_url_path() {
        let s = StoreLocation::parse("s3://b/jobs/a").unwrap();
        assert_eq!(s.open().unwrap().1.as_ref(), "jobs/a");
        let s = StoreLocation::parse("https://s3.eu-west-1.amazonaws.com/b/jobs/a")
            .unwrap()
            .with_option("aws_region", "eu-west-1");
        assert_eq!(s.open().unwrap().1.as_ref(), "jobs/a");
    }

    #[test]
    fn join_appends_one_segment_to_either_kind() {
        let s = CheckpointLocation::parse("s3://b/p").unwrap();
        assert_eq!(
            s.join("member-1-of-3").to_string(),
            "s3://b/p/member-1-of-3"
        );
        let l = CheckpointLocation::parse("state").unwrap();
        assert_eq!(
            l.join("member-1-of-3"),
            CheckpointLocation::Local(PathBuf::from("state/member-1-of-3"))
        );
        let s = StoreLocation::parse("s3://b/p/chk-0000000004").unwrap();
        assert_eq!(s.last_segment(), Some("chk-0000000004"));
        assert_eq!(s.parent().to_string(), "s3://b/p");
    }

    #[test]
    fn unknown_schemes_missing_buckets_and_credentials_in_urls_are_refused() {
        let e = StoreLocation::parse("ftp://b/p").unwrap_err();
        assert!(
            e.contains("`ftp://` is not a supported checkpoint store"),
            "{e}"
        );
        let e = StoreLocation::parse("s3:///p").unwrap_err();
        assert!(e.contains("names no bucket"), "{e}");
        let e = StoreLocation::parse("s3://key:secret@b/p").unwrap_err();
        assert!(!e.contains("secret"), "{e}");
        let e = StoreLocation::parse("s3://b/a/../x").map(|s| s.to_string());
        // The URL parser resolves `..`; what is left is plain segments only.
        assert_eq!(e.unwrap(), "s3://b/x");
    }

    #[test]
    fn options_are_never_printed() {
        let s = StoreLocation::parse("s3://b/p")
            .unwrap()
            .with_option("aws_secret_access_key", "hunter2");
        assert!(!format!("{s:?} {s}").contains("hunter2"));
        assert_eq!(
            s.option_keys().collect::<Vec<_>>(),
            ["aws_secret_access_key"]
        );
    }

    #[test]
    fn staging_dirs_differ_per_location() {
        let a = StoreLocation::parse("s3://b/p").unwrap();
        assert_eq!(
            a.staging_dir(Path::new("/tmp/x")),
            PathBuf::from("/tmp/x/s3/b/p")
        );
        let h = StoreLocation::parse("http://127.0.0.1:9000/p").unwrap();
        assert_eq!(
            h.staging_dir(Path::new("/t")),
            PathBuf::from("/t/http/127.0.0.1_9000/p")
        );
    }

    #[test]
    fn a_bad_option_key_is_reported_when_building() {
        let s = StoreLocation::parse("s3://b/p")
            .unwrap()
            .with_option("no_such_key", "x");
        assert!(s.open().is_err());
        let s = StoreLocation::parse("s3://b/p")
            .unwrap()
            .with_option("aws_region", "eu-west-1");
        s.open().unwrap();
    }
}
