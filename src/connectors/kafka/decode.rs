//! Checking payloads against the configured format.

use super::config::Format;

/// Checks that `payload` is a valid record of `format`; the error says why not.
pub fn check(format: Format, payload: Option<&[u8]>) -> Result<(), String> {
    match (format, payload) {
        (Format::Bytes, _) => Ok(()),
        (_, None) => Err("null payload (tombstone)".into()),
        (Format::Text, Some(p)) => std::str::from_utf8(p)
            .map(|_| ())
            .map_err(|e| format!("not UTF-8: {e}")),
        (Format::Json, Some(p)) => serde_json::from_slice::<serde::de::IgnoredAny>(p)
            .map(|_| ())
            .map_err(|e| format!("not valid JSON: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert!(check(Format::Json, Some(b"{\"a\":1}")).is_ok());
        assert!(check(Format::Json, Some(b"{\"a\":")).is_err());
        assert!(check(Format::Json, None).is_err());
        assert!(check(Format::Text, Some(&[0xff, 0xfe])).is_err());
        assert!(check(Format::Bytes, Some(&[0xff])).is_ok());
        assert!(check(Format::Bytes, None).is_ok());
    }
}
