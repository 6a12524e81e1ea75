//! The rules every MCP server row obeys, wherever it comes from: the
//! operator's file now, the control API for tenant HTTP servers later.
//!
//! Authentication is a declared scheme from a closed set of six, validated
//! when the row is written and never by dereferencing a secret.

use super::egress::{EgressAllowlist, EgressError};
use super::environment::is_tier0;
use super::names::is_identifier;
use super::secret::{CredentialRef, CredentialRefError};

closed_enum! {
    /// How toolgate reaches a server.
    pub enum Transport {
        /// A child process, operator-configured only.
        Stdio => "stdio",
        /// Streamable HTTP through the egress allowlist.
        Http => "http",
    }
}

closed_enum! {
    /// What the credential reference resolves to and how it is applied.
    pub enum AuthScheme {
        /// No credential; the reference is absent.
        None => "none",
        /// `Authorization: Bearer` with the resolved token (HTTP).
        Bearer => "bearer",
        /// The header `auth_name` names, with the resolved token (HTTP).
        Header => "header",
        /// A client-credentials exchange at `token_endpoint`, then bearer (HTTP).
        Oauth2Client => "oauth2_client",
        /// Each principal's own grant: given by consent through the
        /// authorization-code flow with the client the reference names (its
        /// endpoints discovered from the server), or, with `token_endpoint`,
        /// minted there from the principal's own front-door token by an
        /// RFC 8693 exchange (HTTP).
        Oauth2User => "oauth2_user",
        /// The variable `auth_name` names in the child's environment (stdio).
        Env => "env",
    }
}

/// The authentication fields of a row, as written (the scheme as text so an
/// unknown one is a rule violation rather than a parse failure).
#[derive(Debug, Clone, Copy)]
pub struct AuthFields<'a> {
    /// The row's transport.
    pub transport: Transport,
    /// `auth_scheme`.
    pub scheme: &'a str,
    /// `auth_name`.
    pub auth_name: Option<&'a str>,
    /// `credential_ref`.
    pub credential_ref: Option<&'a str>,
    /// `token_endpoint`.
    pub token_endpoint: Option<&'a str>,
}

/// One broken rule. `field()` names the field it is about; the message
/// never echoes a field's value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RowViolation {
    /// Rule 0: the scheme is not one of the six.
    #[error("must be one of none, bearer, header, oauth2_client, oauth2_user, env")]
    UnknownScheme,
    /// Rule 1: `none` with a reference.
    #[error("must be absent when auth_scheme is none")]
    ReferenceWithNone,
    /// Rule 1: another scheme without a reference.
    #[error("required when auth_scheme is {0}")]
    ReferenceMissing(AuthScheme),
    /// A reference that does not parse.
    #[error("{0}")]
    ReferenceMalformed(CredentialRefError),
    /// Rule 2: header or env without a name.
    #[error("required when auth_scheme is {0}")]
    NameMissing(AuthScheme),
    /// Rule 2: a name outside `^[A-Za-z0-9_-]{{1,64}}$`.
    #[error("must match ^[A-Za-z0-9_-]{{1,64}}$")]
    NameMalformed,
    /// A name on a scheme that applies none.
    #[error("must be absent when auth_scheme is {0}")]
    NameUnused(AuthScheme),
    /// Rule 2: a header scheme naming Authorization.
    #[error("a header scheme may not name Authorization; use bearer")]
    HeaderIsAuthorization,
    /// Rule 3: an env scheme naming a tier-0 variable.
    #[error("an env scheme may not name a tier-0 variable")]
    EnvNameIsTier0,
    /// Rule 4: oauth2_client without a token endpoint.
    #[error("required when auth_scheme is oauth2_client")]
    TokenEndpointMissing,
    /// Rule 4: a token endpoint the allowlist refuses.
    #[error("{0}")]
    TokenEndpointRefused(EgressError),
    /// A token endpoint on a scheme that exchanges nothing.
    #[error("must be absent when auth_scheme is {0}")]
    TokenEndpointUnused(AuthScheme),
    /// Rule 5: the scheme cannot be applied on this transport.
    #[error("{scheme} cannot be used on the {transport} transport")]
    WrongTransport {
        /// The scheme.
        scheme: AuthScheme,
        /// The transport.
        transport: Transport,
    },
}

impl RowViolation {
    /// The row field the violation is about.
    pub fn field(&self) -> &'static str {
        match self {
            RowViolation::UnknownScheme | RowViolation::WrongTransport { .. } => "auth_scheme",
            RowViolation::ReferenceWithNone
            | RowViolation::ReferenceMissing(_)
            | RowViolation::ReferenceMalformed(_) => "credential_ref",
            RowViolation::NameMissing(_)
            | RowViolation::NameMalformed
            | RowViolation::NameUnused(_)
            | RowViolation::HeaderIsAuthorization
            | RowViolation::EnvNameIsTier0 => "auth_name",
            RowViolation::TokenEndpointMissing
            | RowViolation::TokenEndpointRefused(_)
            | RowViolation::TokenEndpointUnused(_) => "token_endpoint",
        }
    }
}

/// The five rules of the design document over one row's authentication
/// (`oauth2_user` keeps them as `oauth2_client` does, its token endpoint
/// optional: written, it is where the exchange happens; absent, the
/// endpoints are discovered from the server at consent),
/// every violation reported. `allowlist` is the egress allowlist the dialer
/// uses, so a token endpoint it refuses is refused now.
pub fn validate_auth(fields: AuthFields<'_>, allowlist: &EgressAllowlist) -> Vec<RowViolation> {
    let mut violations = Vec::new();
    let Ok(scheme) = fields.scheme.parse::<AuthScheme>() else {
        violations.push(RowViolation::UnknownScheme);
        return violations;
    };

    // Rule 1: none has no reference; every other scheme has one, but
    // oauth2_user's consent, which may be asked as toolgate's own Client ID
    // Metadata Document instead of a registered client.
    match (scheme, fields.credential_ref) {
        (AuthScheme::None, Some(_)) => violations.push(RowViolation::ReferenceWithNone),
        (AuthScheme::None, None) => {}
        (AuthScheme::Oauth2User, None) if fields.token_endpoint.is_none() => {}
        (_, None) => violations.push(RowViolation::ReferenceMissing(scheme)),
        (_, Some(reference)) => {
            if let Err(error) = CredentialRef::parse(reference) {
                violations.push(RowViolation::ReferenceMalformed(error));
            }
        }
    }

    // Rules 2 and 3: names for header and env, and what they may name.
    match (scheme, fields.auth_name) {
        (AuthScheme::Header | AuthScheme::Env, None) => {
            violations.push(RowViolation::NameMissing(scheme));
        }
        (AuthScheme::Header | AuthScheme::Env, Some(name)) => {
            if !is_auth_name(name) {
                violations.push(RowViolation::NameMalformed);
            } else if scheme == AuthScheme::Header && name.eq_ignore_ascii_case("authorization") {
                violations.push(RowViolation::HeaderIsAuthorization);
            } else if scheme == AuthScheme::Env && is_tier0(name) {
                violations.push(RowViolation::EnvNameIsTier0);
            }
        }
        (_, Some(_)) => violations.push(RowViolation::NameUnused(scheme)),
        (_, None) => {}
    }

    // Rule 4: oauth2_client exchanges at an endpoint egress permits, as
    // oauth2_user does when it names one.
    match (scheme, fields.token_endpoint) {
        (AuthScheme::Oauth2Client, None) => violations.push(RowViolation::TokenEndpointMissing),
        (AuthScheme::Oauth2Client | AuthScheme::Oauth2User, Some(endpoint)) => {
            if let Err(error) = allowlist.check(endpoint) {
                violations.push(RowViolation::TokenEndpointRefused(error));
            }
        }
        (_, Some(_)) => violations.push(RowViolation::TokenEndpointUnused(scheme)),
        (_, None) => {}
    }

    // Rule 5: no header on a pipe, no child environment on a socket.
    let fits = match scheme {
        AuthScheme::None => true,
        AuthScheme::Env => fields.transport == Transport::Stdio,
        AuthScheme::Bearer
        | AuthScheme::Header
        | AuthScheme::Oauth2Client
        | AuthScheme::Oauth2User => fields.transport == Transport::Http,
    };
    if !fits {
        violations.push(RowViolation::WrongTransport {
            scheme,
            transport: fields.transport,
        });
    }
    violations
}

fn is_auth_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Why a server's classification cannot stand.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClassificationViolation {
    /// `server_id` outside `^[a-z][a-z0-9_]*$`.
    #[error("must match ^[a-z][a-z0-9_]*$")]
    ServerId,
    /// A scope outside `mcp.{server_id}.`: an operator may not make a remote
    /// tool require a platform scope, which would grant rather than restrict.
    #[error("must start with mcp.{server_id}.")]
    ScopeOutsideServer {
        /// Position in the list.
        index: usize,
        /// The server the scope must belong to.
        server_id: String,
    },
}

impl ClassificationViolation {
    /// The row field the violation is about.
    pub fn field(&self) -> String {
        match self {
            ClassificationViolation::ServerId => "server_id".to_owned(),
            ClassificationViolation::ScopeOutsideServer { index, .. } => {
                format!("required_scopes[{index}]")
            }
        }
    }
}

/// Checks the server id grammar and that every required scope is under
/// `mcp.{server_id}.`.
pub fn validate_classification(
    server_id: &str,
    required_scopes: &[String],
) -> Vec<ClassificationViolation> {
    if !is_identifier(server_id) {
        return vec![ClassificationViolation::ServerId];
    }
    let prefix = format!("mcp.{server_id}.");
    required_scopes
        .iter()
        .enumerate()
        .filter(|(_, scope)| {
            !scope
                .strip_prefix(&prefix)
                .is_some_and(|rest| !rest.is_empty() && rest.split('.').all(is_identifier))
        })
        .map(|(index, _)| ClassificationViolation::ScopeOutsideServer {
            index,
            server_id: server_id.to_owned(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::egress::AllowEntry;

    fn fields(transport: Transport, scheme: &'static str) -> AuthFields<'static> {
        AuthFields {
            transport,
            scheme,
            auth_name: None,
            credential_ref: None,
            token_endpoint: None,
        }
    }

    #[test]
    fn valid_rows_pass() {
        let allowlist = EgressAllowlist::new(vec![AllowEntry::parse("auth.example.com").unwrap()]);
        let rows = [
            fields(Transport::Stdio, "none"),
            fields(Transport::Http, "none"),
            AuthFields {
                credential_ref: Some("env:TOKEN"),
                ..fields(Transport::Http, "bearer")
            },
            AuthFields {
                credential_ref: Some("env:TOKEN"),
                auth_name: Some("X-Api-Key"),
                ..fields(Transport::Http, "header")
            },
            AuthFields {
                credential_ref: Some("file:/run/s"),
                token_endpoint: Some("https://auth.example.com/token"),
                ..fields(Transport::Http, "oauth2_client")
            },
            AuthFields {
                credential_ref: Some("env:TOKEN"),
                auth_name: Some("API_TOKEN"),
                ..fields(Transport::Stdio, "env")
            },
            AuthFields {
                credential_ref: Some("env:CLIENT"),
                ..fields(Transport::Http, "oauth2_user")
            },
        ];
        for row in rows {
            assert_eq!(validate_auth(row, &allowlist), vec![], "{row:?}");
        }
    }

    /// `oauth2_user` names its client, an exchange's endpoint only where
    /// egress permits it, and has no pipe to ask a person's consent over.
    #[test]
    fn a_delegated_row_names_its_client_and_no_endpoint() {
        let allowlist = EgressAllowlist::new(vec![AllowEntry::parse("auth.example.com").unwrap()]);
        let user = |fields: AuthFields<'static>| validate_auth(fields, &allowlist);
        // Consent without a registered client: toolgate's client document.
        assert_eq!(user(fields(Transport::Http, "oauth2_user")), vec![]);
        // An exchange is always a registered client's.
        assert_eq!(
            user(AuthFields {
                token_endpoint: Some("https://auth.example.com/token"),
                ..fields(Transport::Http, "oauth2_user")
            }),
            vec![RowViolation::ReferenceMissing(AuthScheme::Oauth2User)]
        );
        assert_eq!(
            user(AuthFields {
                credential_ref: Some("env:CLIENT"),
                token_endpoint: Some("https://auth.example.com/token"),
                ..fields(Transport::Http, "oauth2_user")
            }),
            vec![]
        );
        assert!(matches!(
            user(AuthFields {
                credential_ref: Some("env:CLIENT"),
                token_endpoint: Some("https://elsewhere.example.net/token"),
                ..fields(Transport::Http, "oauth2_user")
            })[..],
            [RowViolation::TokenEndpointRefused(_)]
        ));
        assert_eq!(
            user(AuthFields {
                credential_ref: Some("env:CLIENT"),
                ..fields(Transport::Stdio, "oauth2_user")
            }),
            vec![RowViolation::WrongTransport {
                scheme: AuthScheme::Oauth2User,
                transport: Transport::Stdio
            }]
        );
    }

    #[test]
    fn scopes_stay_under_the_server() {
        assert!(validate_classification("acme", &["mcp.acme.use".into()]).is_empty());
        assert_eq!(
            validate_classification(
                "acme",
                &[
                    "mcp.acme.use".into(),
                    "session.write".into(),
                    "mcp.other.use".into(),
                    "mcp.acme.".into()
                ]
            )
            .len(),
            3
        );
        assert_eq!(
            validate_classification("Acme", &[]),
            vec![ClassificationViolation::ServerId]
        );
    }
}

/// What the operator declares about a server, applied to every tool it
/// offers: a server does not classify itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerClassification {
    /// Every tool's side effect.
    pub side_effect: super::tool::SideEffectClass,
    /// Every tool's risk.
    pub risk: super::tool::RiskLevel,
    /// Every tool's idempotency.
    pub idempotency: super::tool::IdempotencyClass,
    /// Scopes every tool requires (all under `mcp.{server_id}.`).
    pub required_scopes: std::collections::BTreeSet<String>,
    /// Every tool's `timeout_seconds`.
    pub timeout_seconds: u32,
    /// Every tool's `maximum_output_bytes`.
    pub maximum_output_bytes: u64,
}

/// The operator's ceilings a tenant's server is held to, as the operator's
/// own servers are at load: when its row is written, and again whenever a
/// stored row is used (a row written before the operator lowered them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantCeilings {
    /// `limits.maximum_output_bytes_ceiling`.
    pub maximum_output_bytes: u64,
    /// `limits.maximum_timeout_seconds`.
    pub timeout_seconds: u32,
}

impl TenantCeilings {
    /// `classification` with its limits no higher than these.
    pub fn bound(&self, mut classification: ServerClassification) -> ServerClassification {
        classification.maximum_output_bytes = classification
            .maximum_output_bytes
            .min(self.maximum_output_bytes);
        classification.timeout_seconds = classification.timeout_seconds.min(self.timeout_seconds);
        classification
    }
}

impl ServerClassification {
    /// The most restrictive classification the type system permits: what an
    /// unclassified server gets.
    pub fn most_restrictive(timeout_seconds: u32, maximum_output_bytes: u64) -> Self {
        ServerClassification {
            side_effect: super::tool::SideEffectClass::ExternalWrite,
            risk: super::tool::RiskLevel::High,
            idempotency: super::tool::IdempotencyClass::NonIdempotent,
            required_scopes: std::collections::BTreeSet::new(),
            timeout_seconds,
            maximum_output_bytes,
        }
    }
}
