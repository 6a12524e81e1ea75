//! `[console]`: the operators' web console — its listener, who may sign
//! in, and how its cookie is sent.
//!
//! Operator tokens are configured as the sha256 of the token, never the
//! token, inline or in a file of their own (`console.operators_file`, read
//! at start), so a leaked configuration signs nobody in.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::values::count;
use super::{ConfigErrors, Problems};
use crate::domain::secret::CredentialRef;
use crate::domain::valid_identifier;

/// How long a console sign-in lasts: a working day.
pub const DEFAULT_CONSOLE_SESSION_MINUTES: u32 = 480;
/// The longest sign-in an operator may configure: a week.
pub const MAXIMUM_CONSOLE_SESSION_MINUTES: u32 = 10_080;
/// Connections the console holds at once: a few operators' browsers.
pub const DEFAULT_CONSOLE_CONNECTIONS: usize = 64;
/// How long a consent flow waits for the person to come back.
pub const DEFAULT_CONSENT_MINUTES: u32 = 10;
/// The longest a consent flow may be configured to wait.
pub const MAXIMUM_CONSENT_MINUTES: u32 = 60;

/// The console. Off unless `listen` is set.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsoleConfig {
    /// TCP address (`127.0.0.1:8767`); off when unset. Any address other
    /// than loopback needs `behind_tls`, since the sign-in form carries a
    /// token.
    pub listen: Option<SocketAddr>,
    /// Operators who may sign in, by the sha256 of each one's token.
    pub operators: Vec<OperatorConfig>,
    /// A TOML file of `[[operators]]` entries, read at start.
    pub operators_file: Option<PathBuf>,
    /// The console is reached through a proxy that terminates TLS: its
    /// cookie is sent with `Secure`, so a browser never sends it in clear.
    pub behind_tls: bool,
    /// How long a sign-in lasts, in minutes.
    pub session_minutes: u32,
    /// Connections held at once.
    #[serde(deserialize_with = "count")]
    pub connections: usize,
    /// The console's URL as people's browsers reach it
    /// (`https://console.example.com`), where a held front-door call sends
    /// its client's user to approve it; `http://` and `listen` when unset.
    pub url: Option<String>,
    /// The key each principal's `oauth2_user` grants are sealed with: a
    /// credential reference resolving to 64 hex digits (32 bytes). When
    /// set, the console also serves the consent pages (`/consent`), and
    /// `oauth2_user` servers may be configured.
    pub consent_key_ref: Option<String>,
    /// How long a consent flow waits for the person to come back, in
    /// minutes.
    pub consent_minutes: u32,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            listen: None,
            operators: Vec::new(),
            operators_file: None,
            behind_tls: false,
            session_minutes: DEFAULT_CONSOLE_SESSION_MINUTES,
            connections: DEFAULT_CONSOLE_CONNECTIONS,
            url: None,
            consent_key_ref: None,
            consent_minutes: DEFAULT_CONSENT_MINUTES,
        }
    }
}

/// One operator who may sign in to the console.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorConfig {
    /// Who decides: recorded as the approver or resolver of what they
    /// decide.
    pub name: String,
    /// Lowercase hex sha256 of the operator's token (`toolgate key` prints
    /// a token and its hash).
    pub sha256: String,
}

/// The file `console.operators_file` names.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OperatorsFile {
    #[serde(default)]
    operators: Vec<OperatorConfig>,
}

impl ConsoleConfig {
    /// Whether the console is served.
    pub fn enabled(&self) -> bool {
        self.listen.is_some()
    }

    /// The URL of one approval's page, less the tenant and id: the
    /// console's URL with `/approvals/`; none while the console is off.
    pub fn approval_pages(&self) -> Option<String> {
        Some(format!("{}/approvals/", self.base_url()?))
    }

    /// Where an authorization server sends a person back to after their
    /// consent; none while the console is off.
    pub fn consent_redirect_uri(&self) -> Option<String> {
        Some(format!("{}/consent/callback", self.base_url()?))
    }

    /// Toolgate's Client ID Metadata Document's URL: its client id at an
    /// authorization server where a server names no registered client.
    pub fn consent_client_document(&self) -> Option<String> {
        Some(format!("{}/consent/client.json", self.base_url()?))
    }

    /// Whether an authorization server may fetch that document: its URL is
    /// https, or http on this machine's loopback (where one under test
    /// runs).
    pub fn client_document_fetchable(&self) -> bool {
        self.consent_client_document()
            .is_some_and(|url| crate::domain::egress::secure_or_loopback(&url))
    }

    /// A server's consent page, less the server's id; none while consent
    /// is not served.
    pub fn consent_pages(&self) -> Option<String> {
        self.consent_key_ref.as_ref()?;
        Some(format!("{}/consent?server=", self.base_url()?))
    }

    /// The console's URL without a trailing `/`; none while it is off.
    fn base_url(&self) -> Option<String> {
        let listen = self.listen?;
        let base = self
            .url
            .clone()
            .unwrap_or_else(|| format!("http://{listen}"));
        Some(base.trim_end_matches('/').to_owned())
    }

    pub(super) fn resolve_paths(&mut self, resolve: &dyn Fn(&mut PathBuf)) {
        if let Some(file) = self.operators_file.as_mut() {
            resolve(file);
        }
    }

    /// Every operator, inline and from the file.
    pub fn all_operators(&self) -> Result<Vec<OperatorConfig>, ConfigErrors> {
        let mut operators = self.operators.clone();
        if let Some(file) = &self.operators_file {
            operators.extend(read_operators_file(file)?);
        }
        Ok(operators)
    }

    /// The section's rules; none while the console is off, but a consent
    /// key, which needs the console's pages.
    pub(super) fn validate(&self, problems: &mut Problems) {
        if let Some(reference) = &self.consent_key_ref {
            if let Err(error) = CredentialRef::parse(reference) {
                problems.push("console.consent_key_ref", error.to_string());
            }
            problems.between(
                "console.consent_minutes",
                self.consent_minutes,
                1,
                MAXIMUM_CONSENT_MINUTES,
            );
        }
        let Some(listen) = self.listen else {
            if self.consent_key_ref.is_some() {
                problems.push(
                    "console.consent_key_ref",
                    "needs console.listen: consent is asked on the console's pages",
                );
            }
            return;
        };
        if !listen.ip().is_loopback() && !self.behind_tls {
            problems.push(
                "console.behind_tls",
                "must be true when console.listen is not a loopback address: the sign-in \
                 form carries a token, which only TLS keeps off the wire",
            );
        }
        problems.between(
            "console.session_minutes",
            self.session_minutes,
            1,
            MAXIMUM_CONSOLE_SESSION_MINUTES,
        );
        problems.at_least_one("console.connections", self.connections);
        if let Some(url) = &self.url {
            let plain = url
                .strip_prefix("https://")
                .or_else(|| url.strip_prefix("http://"))
                .is_some_and(|rest| {
                    !rest.is_empty()
                        && !rest.starts_with('/')
                        && rest.bytes().all(|b| b.is_ascii_graphic())
                        && !rest.contains(['?', '#', '"', '<', '>', '\\'])
                });
            if !plain {
                problems.push(
                    "console.url",
                    "must be an http:// or https:// URL with a host, without query or fragment",
                );
            }
        }
        validate_operators(&self.operators, "console.operators", problems);
        match self.all_operators() {
            Ok(all) => {
                if all.is_empty() {
                    problems.push(
                        "console.operators",
                        "the console needs at least one operator (here or in operators_file)",
                    );
                }
                let mut names = BTreeSet::new();
                let mut hashes = BTreeSet::new();
                for operator in &all {
                    if !names.insert(operator.name.as_str()) {
                        problems.push("console.operators_file", "repeats an operator's name");
                    }
                    if !hashes.insert(operator.sha256.as_str()) {
                        problems.push("console.operators_file", "repeats an operator's hash");
                    }
                }
            }
            Err(errors) => {
                for error in errors.0 {
                    problems.push(
                        format!("console.operators_file: {}", error.path),
                        error.message,
                    );
                }
            }
        }
    }
}

/// Reads and validates an operators file: the entries, or every problem.
fn read_operators_file(path: &Path) -> Result<Vec<OperatorConfig>, ConfigErrors> {
    let file: OperatorsFile = super::read_entries_file(path)?;
    let mut problems = Problems::default();
    validate_operators(&file.operators, "operators", &mut problems);
    problems.into_result().map(|()| file.operators)
}

fn validate_operators(operators: &[OperatorConfig], at: &str, problems: &mut Problems) {
    for (index, operator) in operators.iter().enumerate() {
        let path = |field: &str| format!("{at}[{index}].{field}");
        if !valid_identifier(&operator.name) {
            problems.push(
                path("name"),
                "must be 1 to 256 bytes without control characters",
            );
        }
        let hash_ok = operator.sha256.len() == 64
            && operator
                .sha256
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !hash_ok {
            problems.push(
                path("sha256"),
                "must be 64 lowercase hex digits (the token's sha256, never the token)",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(console: &ConsoleConfig) -> Vec<String> {
        let mut problems = Problems::default();
        console.validate(&mut problems);
        problems.0.into_iter().map(|p| p.to_string()).collect()
    }

    fn operator(name: &str) -> OperatorConfig {
        OperatorConfig {
            name: name.into(),
            sha256: crate::domain::sha256_hex(name.as_bytes()),
        }
    }

    #[test]
    fn an_unset_listen_checks_nothing() {
        assert!(problems(&ConsoleConfig::default()).is_empty());
    }

    #[test]
    fn a_console_needs_an_operator_and_tls_off_loopback() {
        let console = ConsoleConfig {
            listen: Some("0.0.0.0:8767".parse().unwrap()),
            ..ConsoleConfig::default()
        };
        let found = problems(&console);
        assert!(
            found.iter().any(|p| p.starts_with("console.behind_tls")),
            "{found:?}"
        );
        assert!(
            found.iter().any(|p| p.starts_with("console.operators:")),
            "{found:?}"
        );
    }

    #[test]
    fn a_token_pasted_where_its_hash_belongs_is_named_not_echoed() {
        let console = ConsoleConfig {
            listen: Some("127.0.0.1:8767".parse().unwrap()),
            operators: vec![
                OperatorConfig {
                    name: "ana".into(),
                    sha256: "tgk_secret_token".into(),
                },
                operator("bo"),
            ],
            ..ConsoleConfig::default()
        };
        let found = problems(&console);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("console.operators[0].sha256"));
        assert!(!found[0].contains("tgk_secret_token"));
    }

    #[test]
    fn operators_are_read_from_their_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("operators.toml");
        let hash = crate::domain::sha256_hex(b"x");
        std::fs::write(
            &file,
            format!("[[operators]]\nname = \"cy\"\nsha256 = \"{hash}\"\n"),
        )
        .unwrap();
        let console = ConsoleConfig {
            listen: Some("127.0.0.1:8767".parse().unwrap()),
            operators_file: Some(file),
            ..ConsoleConfig::default()
        };
        assert!(problems(&console).is_empty());
        assert_eq!(console.all_operators().unwrap()[0].name, "cy");
    }
}
