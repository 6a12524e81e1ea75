//! Secrets and the references that name them.
//!
//! A [`SecretValue`] redacts itself in `Debug` and `Display`; its value is
//! revealed only where the design document says (building a header, building
//! a child environment). A [`CredentialRef`] says where a secret lives and is
//! safe to store, log and show.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A resolved secret. Cloning is allowed (a transport keeps its own copy);
/// printing is not.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(String);

impl SecretValue {
    /// Wraps a resolved value.
    pub fn new(value: impl Into<String>) -> Self {
        SecretValue(value.into())
    }

    /// The value itself. Call sites are the audit surface: keep them few.
    pub fn reveal(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue(<redacted>)")
    }
}

impl fmt::Display for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Where a credential lives: `env:NAME` (a variable of toolgate's own
/// environment, read by the resolver only), `file:/absolute/path`, or
/// `secret:TENANT/NAME` (a secret of one tenant, kept in the folder the
/// operator sets aside for that tenant's secrets). Tenant servers may name
/// only their own tenant's `secret:` references; the other two reach
/// toolgate's own environment and files and are the operator's.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum CredentialRef {
    /// A variable in toolgate's environment.
    Env(String),
    /// An absolute path to a file holding the value.
    File(String),
    /// A tenant's secret: its tenant and its name within the tenant.
    Secret {
        /// The tenant whose secret it is.
        tenant: String,
        /// The secret's name: 1 to 128 letters, digits, `.`, `-` or `_`,
        /// not starting with `.`.
        name: String,
    },
}

/// Why a string is not a credential reference. Never echoes the string: an
/// operator who pasted a secret where a reference belongs must not see it
/// printed back into a log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialRefError {
    /// Neither `env:`, `file:` nor `secret:`.
    #[error("credential reference must start with env:, file: or secret:")]
    Scheme,
    /// `secret:` not of the form `TENANT/NAME`.
    #[error("secret: reference must be secret:TENANT/NAME (NAME: letters, digits, '.', '-', '_')")]
    SecretName,
    /// `env:` with a name outside `^[A-Za-z_][A-Za-z0-9_]*$`.
    #[error("env: reference must name a variable ([A-Za-z_][A-Za-z0-9_]*)")]
    EnvName,
    /// `file:` with a relative path.
    #[error("file: reference must be an absolute path")]
    FilePath,
}

impl CredentialRef {
    /// Parses `env:NAME` or `file:/path`.
    pub fn parse(text: &str) -> Result<Self, CredentialRefError> {
        if let Some(name) = text.strip_prefix("env:") {
            let mut bytes = name.bytes();
            let valid = matches!(bytes.next(), Some(b'A'..=b'Z' | b'a'..=b'z' | b'_'))
                && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_');
            return if valid {
                Ok(CredentialRef::Env(name.to_owned()))
            } else {
                Err(CredentialRefError::EnvName)
            };
        }
        if let Some(rest) = text.strip_prefix("secret:") {
            let name_ok = |name: &str| {
                (1..=128).contains(&name.len())
                    && !name.starts_with('.')
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
            };
            return match rest.split_once('/') {
                Some((tenant, name)) if super::valid_tenant_id(tenant) && name_ok(name) => {
                    Ok(CredentialRef::Secret {
                        tenant: tenant.to_owned(),
                        name: name.to_owned(),
                    })
                }
                _ => Err(CredentialRefError::SecretName),
            };
        }
        if let Some(path) = text.strip_prefix("file:") {
            return if path.starts_with('/') && !path.contains('\0') {
                Ok(CredentialRef::File(path.to_owned()))
            } else {
                Err(CredentialRefError::FilePath)
            };
        }
        Err(CredentialRefError::Scheme)
    }
}

impl TryFrom<String> for CredentialRef {
    type Error = CredentialRefError;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        CredentialRef::parse(&text)
    }
}

impl From<CredentialRef> for String {
    fn from(reference: CredentialRef) -> String {
        reference.to_string()
    }
}

impl fmt::Display for CredentialRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CredentialRef::Env(name) => write!(f, "env:{name}"),
            CredentialRef::File(path) => write!(f, "file:{path}"),
            CredentialRef::Secret { tenant, name } => write!(f, "secret:{tenant}/{name}"),
        }
    }
}

/// What a scrubbed secret is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Replaces every occurrence of each secret's value in `text`. Values under
/// four bytes are left alone: they would redact ordinary words.
pub fn scrub(text: &str, secrets: &[SecretValue]) -> String {
    let mut out = text.to_owned();
    for secret in secrets {
        let value = secret.reveal();
        if value.len() >= 4 && out.contains(value) {
            out = out.replace(value, REDACTED);
        }
    }
    out
}

/// A text cut at a cap (a log line, an oversized answer's head) may end in
/// the beginning of a secret that the whole-value scrub cannot match; that
/// beginning is redacted too.
pub fn scrub_cut_prefix(mut text: String, secrets: &[SecretValue]) -> String {
    for secret in secrets {
        let value = secret.reveal();
        let longest = (1..value.len())
            .rev()
            .filter(|end| value.is_char_boundary(*end))
            .find(|end| text.ends_with(&value[..*end]));
        if let Some(end) = longest {
            text.truncate(text.len() - end);
            text.push_str(REDACTED);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let secret = SecretValue::new("hunter2");
        assert!(!format!("{secret:?}").contains("hunter2"));
        assert!(!format!("{secret}").contains("hunter2"));
        assert_eq!(secret.reveal(), "hunter2");
    }

    #[test]
    fn references_parse_and_errors_do_not_echo() {
        assert_eq!(
            CredentialRef::parse("env:API_TOKEN"),
            Ok(CredentialRef::Env("API_TOKEN".into()))
        );
        assert_eq!(
            CredentialRef::parse("file:/run/secrets/x"),
            Ok(CredentialRef::File("/run/secrets/x".into()))
        );
        for bad in ["sk-live-abcdef", "env:1X", "env:A-B", "file:relative"] {
            let error = CredentialRef::parse(bad).unwrap_err();
            assert!(!error.to_string().contains(bad), "{bad}");
        }
        assert_eq!(
            CredentialRef::parse("env:"),
            Err(CredentialRefError::EnvName)
        );
        assert_eq!(
            CredentialRef::parse("secret:acme/crm.token"),
            Ok(CredentialRef::Secret {
                tenant: "acme".into(),
                name: "crm.token".into()
            })
        );
        for bad in [
            "secret:acme",
            "secret:acme/",
            "secret:acme/../etc",
            "secret:acme/a/b",
            "secret:../x/y",
            "secret:/abs",
        ] {
            assert_eq!(
                CredentialRef::parse(bad),
                Err(CredentialRefError::SecretName),
                "{bad}"
            );
        }
    }
}
