//! The formats that need no schema: `json` (checked, passed on as it is), `text`
//! (UTF-8) and `bytes` (anything).

use super::{DecodeError, Decoded, Decoder, Format, Output};

/// `json`, `text` or `bytes`: the payload is the value, once it passes the check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plain(pub Output);

impl Plain {
    /// Checks that `payload` is a value of this format; the error says why not.
    pub fn check(self, payload: &[u8]) -> Result<(), String> {
        match self.0 {
            Output::Bytes => Ok(()),
            Output::Text => std::str::from_utf8(payload)
                .map(|_| ())
                .map_err(|e| format!("not UTF-8: {e}")),
            Output::Json => {
                super::json::validate_json(payload).map_err(|e| format!("not valid JSON: {e}"))
            }
        }
    }
}

impl Format for Plain {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn output(&self) -> Output {
        self.0
    }

    fn decoder(&self) -> Box<dyn Decoder> {
        Box::new(*self)
    }
}

impl Decoder for Plain {
    fn decode(&mut self, payload: &[u8]) -> Result<Decoded, DecodeError> {
        self.check(payload)
            .map(|()| Decoded::Unchanged)
            .map_err(DecodeError::record)
    }

    fn learn(&mut self, _: u32, _: Result<&super::registry::ResolvedSchema, String>) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_plain_format_checks_what_it_says() {
        let (json, text, bytes) = (
            Plain(Output::Json),
            Plain(Output::Text),
            Plain(Output::Bytes),
        );
        assert!(json.check(b"{\"a\":1}").is_ok());
        assert!(json.check(b"{\"a\":").is_err());
        assert!(text.check(&[0xff, 0xfe]).is_err());
        assert!(text.check("é".as_bytes()).is_ok());
        assert!(bytes.check(&[0xff]).is_ok());
        assert_eq!(
            json.clone().decode(b"[1]"),
            Ok(Decoded::Unchanged),
            "a checked JSON value is passed on without a copy"
        );
    }
}
