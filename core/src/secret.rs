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
        d.deserialize_any(SecretVisitor)
    }
}

/// Takes a string; any other value is refused *without* echoing it (serde's own message would
/// print an unquoted numeric password in the error).
struct SecretVisitor;

impl SecretVisitor {
    fn not_a_string<E: serde::de::Error>(what: &str) -> E {
        E::custom(format!(
            "a secret must be a string, not {what} (its value is not shown): quote it, or better reference it as \"${{NAME}}\" from the environment"
        ))
    }
}

impl<'de> serde::de::Visitor<'de> for SecretVisitor {
    type Value = Secret;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string (a secret, or a \"${NAME}\" reference)")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Secret, E> {
        Secret::from_config(v).map_err(E::custom)
    }

    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Secret, E> {
        Err(Self::not_a_string("a number"))
    }

    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Secret, E> {
        Err(Self::not_a_string("a number"))
    }

    fn visit_i128<E: serde::de::Error>(self, _: i128) -> Result<Secret, E> {
        Err(Self::not_a_string("a number"))
    }

    fn visit_u128<E: serde::de::Error>(self, _: u128) -> Result<Secret, E> {
        Err(Self::not_a_string("a number"))
    }

    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Secret, E> {
        Err(Self::not_a_string("a number"))
    }

    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Secret, E> {
        Err(Self::not_a_string("a boolean"))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, _: A) -> Result<Secret, A::Error> {
        Err(Self::not_a_string("a table"))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, _: A) -> Result<Secret, A::Error> {
        Err(Self::not_a_string("an array"))
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.reference.as_deref().unwrap_or("***"))
    }
}

/// `url` with its password replaced by `***` (user, host, path and parameters kept), for logs
/// and `Debug` output of connector configurations: the userinfo's password, and the value of
/// every query parameter whose name says password, secret or token (`?password=…`, as
/// PostgreSQL's URLs allow).
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let tail = redact_query(tail);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            let hidden = if userinfo.contains(':') { ":***" } else { "" };
            format!("{scheme}://{user}{hidden}@{host}{tail}")
        }
        None => format!("{scheme}://{authority}{tail}"),
    }
}

/// `text` (a URL's path and query, or a line holding one) with the value of every query
/// parameter whose name says password, secret or token replaced by `***` (a `${NAME}` reference
/// is kept: it holds no secret).
pub fn redact_query(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(['?', '&']) {
        out.push_str(&rest[..=i]);
        rest = &rest[i + 1..];
        let end = rest.find(['&', '#', '"', '\'', ' ', '\n']).unwrap_or(rest.len());
        let param = &rest[..end];
        match param.split_once('=') {
            Some((name, value))
                if ["password", "secret", "token"]
                    .iter()
                    .any(|w| name.to_ascii_lowercase().contains(w))
                    && !value.starts_with("${") =>
            {
                out.push_str(name);
                out.push_str("=***");
            }
            _ => out.push_str(param),
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
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

    #[test]
    fn passwords_in_url_parameters_are_hidden() {
        assert_eq!(
            redact_url("postgres://app@db:5432/shop?sslmode=verify-full&password=hunter2&application_name=x"),
            "postgres://app@db:5432/shop?sslmode=verify-full&password=***&application_name=x"
        );
        assert_eq!(
            redact_url("postgres://db/shop?sslpassword=k3y&user=app"),
            "postgres://db/shop?sslpassword=***&user=app"
        );
        assert_eq!(
            redact_url("mysql://app:pw@db/shop?ssl-mode=required"),
            "mysql://app:***@db/shop?ssl-mode=required"
        );
        assert_eq!(
            redact_url("postgres://db/shop?password=${PG_PASSWORD}"),
            "postgres://db/shop?password=${PG_PASSWORD}"
        );
    }

    #[derive(Debug, Deserialize)]
    struct WithSecret {
        #[allow(dead_code)]
        password: Secret,
    }

    #[test]
    fn a_secret_that_is_not_a_string_is_refused_without_its_value() {
        for text in [
            r#"{"password": 8675309}"#,
            r#"{"password": 86753.09}"#,
            r#"{"password": true}"#,
            r#"{"password": [8675309]}"#,
        ] {
            let err = serde_json::from_str::<WithSecret>(text).unwrap_err().to_string();
            assert!(err.contains("a secret must be a string"), "{text}: {err}");
            assert!(
                !err.contains("8675309") && !err.contains("86753"),
                "{text} echoed: {err}"
            );
        }
        let ok: WithSecret = serde_json::from_str(r#"{"password": "8675309"}"#).unwrap();
        assert_eq!(ok.password.expose(), "8675309");
    }
}
