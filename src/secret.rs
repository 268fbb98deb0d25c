//! Secrets in job files: a [`Secret`] whose `Debug` and `Display` never show the value,
//! the reading of `*_file` secrets, and the redaction of URLs with user info.
//!
//! A secret's value leaves this type only through [`Secret::expose`], called where it
//! goes on the wire (an `Authorization` header); nothing that formats a configuration,
//! an error or a log line can print it by accident.

use std::fmt;
use std::path::Path;

/// A string that is never printed: `Debug` shows `Secret(***)`, `Display` shows `***`.
/// It deserializes from a plain string, so a job-file section that holds one has a safe
/// `Debug` too.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// A URL as written in a job file: `Debug` prints it through [`redact_url`], so a
/// password in its user info is never shown.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct UrlText(pub String);

impl fmt::Debug for UrlText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", redact_url(&self.0))
    }
}

/// A secret given inline (`key`) or in a file (`key_file`, resolved by `resolve`), or
/// none; both at once is an error. An error is `(key, message)`, naming the key given.
pub fn secret_or_file(
    value: &Option<Secret>,
    file: &Option<std::path::PathBuf>,
    key: &str,
    resolve: impl Fn(&Path) -> std::path::PathBuf,
) -> Result<Option<Secret>, (String, String)> {
    match (value, file) {
        (Some(_), Some(_)) => Err((
            format!("{key} and {key}_file"),
            format!("give {key} or {key}_file, not both"),
        )),
        (Some(v), None) => Ok(Some(v.clone())),
        (None, Some(f)) => read_secret_file(&resolve(f))
            .map(Some)
            .map_err(|m| (format!("{key}_file"), m)),
        (None, None) => Ok(None),
    }
}

/// Reads a secret from a file (a mounted Kubernetes secret, for example): the whole
/// content, without its trailing newline (`\n` or `\r\n`). An empty secret is an error,
/// as is an unreadable file; the error names the file, never its content.
pub fn read_secret_file(path: &Path) -> Result<Secret, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let value = text
        .strip_suffix('\n')
        .map(|t| t.strip_suffix('\r').unwrap_or(t))
        .unwrap_or(&text);
    if value.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(Secret::new(value))
}

/// A URL as it may be printed: a password in its user info becomes `***`
/// (`https://user:***@host`); a URL without one is returned unchanged. Text that does
/// not parse as a URL is returned with anything between `://` and `@` redacted, so a
/// malformed URL in an error message cannot leak a password either.
pub fn redact_url(url: &str) -> String {
    match elasticsearch::http::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        Ok(_) => url.to_string(),
        Err(_) => match (url.find("://"), url.rfind('@')) {
            (Some(s), Some(at)) if at > s + 3 => {
                let userinfo = &url[s + 3..at];
                let user = userinfo.split(':').next().unwrap_or_default();
                if userinfo.contains(':') {
                    format!("{}{user}:***{}", &url[..s + 3], &url[at..])
                } else {
                    url.to_string()
                }
            }
            _ => url.to_string(),
        },
    }
}

/// Whether a librdkafka property holds a secret (`sasl.password`,
/// `ssl.key.password`, `sasl.oauthbearer.client.secret`, ...): its value is never
/// printed.
pub fn is_secret_property(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "sasl.jaas.config",
        "sasl.oauthbearer.config",
        "ssl.key.pem",
    ]
    .iter()
    .any(|s| k.contains(s))
}

/// Client properties (librdkafka's) whose `Debug` hides the values of secret keys
/// ([`is_secret_property`]).
/// Reads and writes as the map it is, through `Deref`.
#[derive(Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct Properties(pub std::collections::BTreeMap<String, String>);

impl std::ops::Deref for Properties {
    type Target = std::collections::BTreeMap<String, String>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl<'a> IntoIterator for &'a Properties {
    type Item = (&'a String, &'a String);
    type IntoIter = std::collections::btree_map::Iter<'a, String, String>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl std::ops::DerefMut for Properties {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl fmt::Debug for Properties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, v)| {
                let shown = if is_secret_property(k) {
                    "***"
                } else {
                    v.as_str()
                };
                (k, shown)
            }))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_properties_are_hidden_in_debug() {
        let p = Properties(
            [
                ("sasl.password".to_string(), "kafka-pw".to_string()),
                ("sasl.username".to_string(), "writer".to_string()),
                ("ssl.key.password".to_string(), "key-pw".to_string()),
            ]
            .into(),
        );
        let d = format!("{p:?}");
        assert!(d.contains("writer") && d.contains("sasl.password"), "{d}");
        assert!(!d.contains("kafka-pw") && !d.contains("key-pw"), "{d}");
    }

    #[test]
    fn debug_and_display_never_show_the_value() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s:?}"), "Secret(***)");
        assert_eq!(format!("{s}"), "***");
        assert_eq!(format!("{:?}", Some(s.clone())), "Some(Secret(***))");
        assert_eq!(s.expose(), "hunter2");
    }

    #[test]
    fn urls_with_user_info_are_redacted() {
        let cases = [
            ("https://user:pw@host:9200", "https://user:***@host:9200/"),
            (
                "https://user:pw@host:9200/path",
                "https://user:***@host:9200/path",
            ),
            ("http://127.0.0.1:9200", "http://127.0.0.1:9200"),
            ("https://user@host", "https://user@host"),
            // Not a URL (a bad port): still no password.
            ("https://user:pw@host:99999", "https://user:***@host:99999"),
            ("not a url", "not a url"),
        ];
        for (url, want) in cases {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }

    #[test]
    fn secret_files_lose_one_trailing_newline() {
        let dir = tempfile::tempdir().unwrap();
        let cases: [(&str, Result<&str, ()>); 5] = [
            ("pw\n", Ok("pw")),
            ("pw\r\n", Ok("pw")),
            ("pw", Ok("pw")),
            ("pw\n\n", Ok("pw\n")),
            ("\n", Err(())),
        ];
        for (i, (content, want)) in cases.iter().enumerate() {
            let p = dir.path().join(format!("s{i}"));
            std::fs::write(&p, content).unwrap();
            let got = read_secret_file(&p);
            match want {
                Ok(w) => assert_eq!(got.unwrap().expose(), *w, "{content:?}"),
                Err(()) => assert!(got.is_err(), "{content:?}"),
            }
        }
        let missing = read_secret_file(&dir.path().join("absent")).unwrap_err();
        assert!(missing.contains("absent"), "{missing}");
    }
}
