//! Secrets in configuration. A job file references them instead of holding them: `"${NAME}"`
//! takes the environment variable NAME when the configuration is read (an unset variable is an
//! error naming it), and connectors offer a `*_file` sibling for files mounted the way Kubernetes
//! mounts Secrets. A [`Secret`] never prints its value: `Debug` shows `***`, and serializing
//! writes back the reference it was read from (or `***`).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A password, token or key passphrase.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    value: String,
    /// What the configuration said (`${NAME}`), when it referenced the environment.
    reference: Option<String>,
}

impl Secret {
    /// A secret with this value (from code, not from configuration).
    pub fn new(value: impl Into<String>) -> Self {
        Secret {
            value: value.into(),
            reference: None,
        }
    }

    /// Reads `text` as configuration does: `${NAME}` parts are replaced by environment variables.
    pub fn from_config(text: &str) -> Result<Self, String> {
        let value = expand_env(text)?;
        let reference = (value != text).then(|| text.to_owned());
        Ok(Secret { value, reference })
    }

    /// Reads a secret from a file (trailing newline removed), naming the file on error.
    pub fn from_file(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("reading secret file {}: {e}", path.display()))?;
        Ok(Secret {
            value: text.trim_end_matches(['\n', '\r']).to_owned(),
            reference: Some(format!("file {}", path.display())),
        })
    }

    /// The value, for handing to a client library. Never log it.
    pub fn expose(&self) -> &str {
        &self.value
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reference {
            Some(r) => write!(f, "Secret({r})"),
            None => f.write_str("Secret(***)"),
        }
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Secret::from_config(&text).map_err(serde::de::Error::custom)
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.reference.as_deref().unwrap_or("***"))
    }
}

/// `url` with its password replaced by `***` (user, host, path and parameters kept), for logs
/// and `Debug` output of connector configurations.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            let hidden = if userinfo.contains(':') { ":***" } else { "" };
            format!("{scheme}://{user}{hidden}@{host}{tail}")
        }
        None => url.to_owned(),
    }
}

/// Replaces every `${NAME}` in `text` by the environment variable NAME; `$${` is a literal `${`.
/// An unset variable is an error naming it.
pub fn expand_env(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i..];
        if let Some(literal) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = literal;
        } else if let Some(body) = after.strip_prefix("${") {
            let end = body
                .find('}')
                .ok_or_else(|| "unterminated ${ in a value (write $${ for a literal ${)".to_string())?;
            let name = &body[..end];
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("${{{name}}} is not an environment variable name"));
            }
            let value = std::env::var(name)
                .map_err(|_| format!("environment variable {name} (referenced as ${{{name}}}) is not set"))?;
            out.push_str(&value);
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_expand_and_never_print() {
        // Set once for this test binary: a name no other test uses.
        std::env::set_var("EXACTLY_SECRET_TEST_PW", "hunter2");
        let s = Secret::from_config("${EXACTLY_SECRET_TEST_PW}").unwrap();
        assert_eq!(s.expose(), "hunter2");
        assert_eq!(format!("{s:?}"), "Secret(${EXACTLY_SECRET_TEST_PW})");
        assert!(!format!("{s:?}").contains("hunter2"));
        let literal = Secret::new("hunter2");
        assert_eq!(format!("{literal:?}"), "Secret(***)");
        assert_eq!(
            expand_env("mysql://u:${EXACTLY_SECRET_TEST_PW}@h/db").unwrap(),
            "mysql://u:hunter2@h/db"
        );
        assert_eq!(expand_env("a$b $${x}").unwrap(), "a$b ${x}");
        let e = expand_env("${EXACTLY_SECRET_TEST_UNSET}").unwrap_err();
        assert!(e.contains("EXACTLY_SECRET_TEST_UNSET") && e.contains("not set"), "{e}");
        assert!(expand_env("${oops").is_err());
    }
}
