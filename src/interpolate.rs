//! Environment variables in job files: any string value may hold `${NAME}` (the
//! variable must be set) or `${NAME:-default}` (the default when it is unset or empty).
//! `$${` writes a literal `${`. Keys are never expanded.

/// Expands the variables of `s`, reading them with `var`. The error says which
/// variable is missing or which reference is malformed.
pub fn expand(s: &str, var: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(lit) = after.strip_prefix("${") {
            out.push_str("${");
            rest = lit;
            continue;
        }
        let Some(body) = after.strip_prefix('{') else {
            out.push('$');
            rest = after;
            continue;
        };
        let end = body
            .find('}')
            .ok_or_else(|| format!("`${{{body}`: an unclosed variable reference"))?;
        let (name, default) = match body[..end].split_once(":-") {
            Some((n, d)) => (n, Some(d)),
            None => (&body[..end], None),
        };
        let valid = !name.is_empty()
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with(|c: char| c.is_ascii_digit());
        if !valid {
            return Err(format!("`${{{}}}`: not a variable name", &body[..end]));
        }
        match (var(name).filter(|v| !v.is_empty()), default) {
            (Some(v), _) => out.push_str(&v),
            (None, Some(d)) => out.push_str(d),
            (None, None) => {
                return Err(format!(
                "environment variable {name} is not set (write ${{{name}:-default}} for a default)"
            ))
            }
        }
        rest = &body[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Expands every string of a TOML value in place; the error names the key (`a.b[2].c`).
pub fn expand_toml(
    v: &mut toml::Value,
    path: &str,
    var: &impl Fn(&str) -> Option<String>,
) -> Result<(), (String, String)> {
    match v {
        toml::Value::String(s) if s.contains('$') => {
            *s = expand(s, var).map_err(|e| (path.to_string(), e))?;
        }
        toml::Value::Array(a) => {
            for (i, x) in a.iter_mut().enumerate() {
                expand_toml(x, &format!("{path}[{i}]"), var)?;
            }
        }
        toml::Value::Table(t) => {
            for (k, x) in t.iter_mut() {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                expand_toml(x, &p, var)?;
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "HOST" => Some("es-1".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn expansion_table() {
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("plain", Ok("plain")),
            ("http://${HOST}:9200", Ok("http://es-1:9200")),
            ("${HOST:-x}", Ok("es-1")),
            ("${UNSET:-127.0.0.1:9092}", Ok("127.0.0.1:9092")),
            ("${EMPTY:-fallback}", Ok("fallback")),
            ("${UNSET:-}", Ok("")),
            ("cost $5 and $${HOST}", Ok("cost $5 and ${HOST}")),
            ("${HOST}${HOST}", Ok("es-1es-1")),
            ("${UNSET}", Err("UNSET is not set")),
            ("${HOST", Err("unclosed")),
            ("${1A}", Err("not a variable name")),
            ("${}", Err("not a variable name")),
        ];
        for (input, want) in cases {
            match (expand(input, env), want) {
                (Ok(got), Ok(w)) => assert_eq!(&got, w, "{input}"),
                (Err(e), Err(w)) => assert!(e.contains(w), "{input}: {e}"),
                (got, want) => panic!("{input}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn every_string_of_a_document_is_expanded_and_errors_name_the_key() {
        let mut v: toml::Value = toml::from_str(
            "[sink.elasticsearch]\nurl = \"http://${HOST}:9200\"\n[source.kafka]\ntopics = [\"a\", \"${HOST}\"]\n",
        )
        .unwrap();
        expand_toml(&mut v, "", &env).unwrap();
        assert_eq!(
            v["sink"]["elasticsearch"]["url"].as_str(),
            Some("http://es-1:9200")
        );
        assert_eq!(v["source"]["kafka"]["topics"][1].as_str(), Some("es-1"));
        let mut bad: toml::Value = toml::from_str("[checkpoint]\ndir = \"${NOPE}\"\n").unwrap();
        let (key, msg) = expand_toml(&mut bad, "", &env).unwrap_err();
        assert_eq!(key, "checkpoint.dir");
        assert!(msg.contains("NOPE"), "{msg}");
    }
}
