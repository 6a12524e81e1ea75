//! The `[mcp]` section: the operator's stdio and HTTP servers, their
//! classification and their authentication.
//!
//! The fields both kinds of server have are declared once
//! ([`CommonServerConfig`]) and checked once; each kind adds its own.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::values::{RunAsUser, Seconds};
use super::{LimitsConfig, Problems};
use crate::domain::egress::EgressAllowlist;
use crate::domain::environment::is_tier0;
use crate::domain::mcp_server::{
    AuthFields, AuthScheme, ServerClassification, Transport, validate_auth, validate_classification,
};
use crate::domain::secret::CredentialRef;
use crate::domain::{IdempotencyClass, RiskLevel, SideEffectClass};

/// How long a tenant HTTP server's discovery is reused without connecting.
pub const DEFAULT_DISCOVERY_REUSE_SECONDS: u32 = 300;
/// How long a warm-up handshake may take.
const DEFAULT_WARMUP_CONNECT_TIMEOUT_SECONDS: u32 = 60;
/// How often the warm-up tries a server again.
const DEFAULT_WARMUP_RETRY_SECONDS: u32 = 30;
/// Warm-up rounds at most.
const DEFAULT_WARMUP_ATTEMPTS: u32 = 3;
/// Where stdio servers' folders live, under the file's folder.
const DEFAULT_STATE_DIRECTORY: &str = "var/mcp";
/// MCP handshake deadline.
pub const DEFAULT_CONNECT_TIMEOUT_SECONDS: u32 = 10;
/// MCP per-request deadline, before the tool's and the run's caps.
pub const DEFAULT_REQUEST_TIMEOUT_SECONDS: u32 = 30;
/// MCP idle close.
pub const DEFAULT_IDLE_TIMEOUT_SECONDS: u32 = 900;
/// Per-server tool timeout when the operator declares none.
pub const DEFAULT_TOOL_TIMEOUT_SECONDS: u32 = 30;
/// Per-server output limit when the operator declares none (64 KiB).
pub const DEFAULT_SERVER_MAXIMUM_OUTPUT_BYTES: u64 = 64 * 1024;

/// Operator-configured MCP servers.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpConfig {
    /// One 0700 folder per stdio server under here: its HOME and TMPDIR.
    pub state_directory: PathBuf,
    /// The user every stdio server runs as unless it names its own:
    /// `name`, `uid` or `uid:gid`. Unset, servers run as toolgate's own
    /// user and could reach what it can (its socket, its database); set it
    /// to a user of their own (toolgate then needs CAP_SETUID and
    /// CAP_SETGID, or root).
    pub run_as: Option<RunAsUser>,
    /// stdio servers, spawned with a constructed environment.
    pub servers: Vec<StdioServerConfig>,
    /// HTTP servers the operator configures for every tenant, dialled
    /// through egress.
    pub http_servers: Vec<HttpServerConfig>,
    /// How long a tenant HTTP server's discovery is reused before a session
    /// connects again.
    pub discovery_reuse_seconds: Seconds,
    /// At start, the operator's servers are discovered in the background,
    /// one at a time, so the first session pins them without waiting; each
    /// handshake may take this long (longer than a session waits: services
    /// restart together on a small host). The node is ready once this first
    /// round is done, or this long after it began.
    pub warmup_connect_timeout_seconds: Seconds,
    /// Servers the warm-up could not reach are tried again this often.
    pub warmup_retry_seconds: Seconds,
    /// Rounds of warm-up at most (the first included); 0 turns it off.
    pub warmup_attempts: u32,
}

impl Default for McpConfig {
    fn default() -> Self {
        McpConfig {
            state_directory: PathBuf::from(DEFAULT_STATE_DIRECTORY),
            run_as: None,
            servers: Vec::new(),
            http_servers: Vec::new(),
            discovery_reuse_seconds: Seconds::new(DEFAULT_DISCOVERY_REUSE_SECONDS),
            warmup_connect_timeout_seconds: Seconds::new(DEFAULT_WARMUP_CONNECT_TIMEOUT_SECONDS),
            warmup_retry_seconds: Seconds::new(DEFAULT_WARMUP_RETRY_SECONDS),
            warmup_attempts: DEFAULT_WARMUP_ATTEMPTS,
        }
    }
}

impl McpConfig {
    /// Every server's common fields, stdio then HTTP, each with its path
    /// (`mcp.servers[0]`).
    pub fn common(&self) -> impl Iterator<Item = (String, &CommonServerConfig)> {
        let stdio = self
            .servers
            .iter()
            .enumerate()
            .map(|(index, server)| (format!("mcp.servers[{index}]"), &server.common));
        let http = self
            .http_servers
            .iter()
            .enumerate()
            .map(|(index, server)| (format!("mcp.http_servers[{index}]"), &server.common));
        stdio.chain(http)
    }

    /// The section's rules; a server's limits and what it dials are held to
    /// `limits` and `allowlist`.
    pub(super) fn validate(
        &self,
        limits: &LimitsConfig,
        allowlist: &EgressAllowlist,
        problems: &mut Problems,
    ) {
        problems.between(
            "mcp.warmup_connect_timeout_seconds",
            self.warmup_connect_timeout_seconds.get(),
            1,
            3600,
        );
        problems.between(
            "mcp.warmup_retry_seconds",
            self.warmup_retry_seconds.get(),
            1,
            3600,
        );
        if self.warmup_attempts > 100 {
            problems.push("mcp.warmup_attempts", "must be at most 100");
        }
        problems.at_least_one(
            "mcp.discovery_reuse_seconds",
            self.discovery_reuse_seconds.get(),
        );
        let mut first = BTreeMap::new();
        for (at, server) in self.common() {
            if let Some(earlier) = first.get(&server.server_id) {
                problems.push(
                    format!("{at}.server_id"),
                    format!("duplicates {earlier}.server_id"),
                );
            } else {
                first.insert(&server.server_id, at.clone());
            }
        }
        for (index, server) in self.servers.iter().enumerate() {
            let at = format!("mcp.servers[{index}]");
            (server.common).validate(&at, Transport::Stdio, limits, allowlist, problems);
            server.validate(&at, problems);
        }
        for (index, server) in self.http_servers.iter().enumerate() {
            let at = format!("mcp.http_servers[{index}]");
            (server.common).validate(&at, Transport::Http, limits, allowlist, problems);
            if let Err(error) = allowlist.check(&server.url) {
                problems.push(format!("{at}.url"), error.to_string());
            }
        }
    }
}

/// Declares the fields every operator server has once, as
/// `CommonServerConfig`, and each kind of server with them and its own.
///
/// In the file a server's fields are one flat table. serde's `flatten`
/// would read the shared ones into their own struct, but it cannot refuse
/// unknown keys (`deny_unknown_fields`) and loses the field's path in its
/// errors; so each kind is read through a flat struct of its own, built
/// here from the same field list, and split.
macro_rules! server_kinds {
    (
        $(#[$common_meta:meta])*
        pub struct $common:ident $common_fields:tt
        $(
            $(#[$kind_meta:meta])*
            pub struct $kind:ident $kind_fields:tt
        )+
    ) => {
        server_kinds!(@common [$(#[$common_meta])*] $common $common_fields);
        $(
            server_kinds!(@kind $common $common_fields [$(#[$kind_meta])*] $kind $kind_fields);
        )+
    };
    (@common [$($meta:tt)*] $common:ident {
        $( $(#[$field_meta:meta])* pub $field:ident: $type:ty, )*
    }) => {
        $($meta)*
        #[derive(Debug, Clone, Serialize)]
        pub struct $common {
            $( $(#[$field_meta])* pub $field: $type, )*
        }
    };
    (@kind $common:ident {
        $( $(#[$common_meta:meta])* pub $common_field:ident: $common_type:ty, )*
    } [$($meta:tt)*] $kind:ident {
        $( $(#[$field_meta:meta])* pub $field:ident: $type:ty, )*
    }) => {
        $($meta)*
        #[derive(Debug, Clone, Serialize)]
        pub struct $kind {
            /// What every server has, stdio or HTTP.
            #[serde(flatten)]
            pub common: $common,
            $( $(#[$field_meta])* pub $field: $type, )*
        }

        impl<'de> Deserialize<'de> for $kind {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                // The table as written, every field at its own path; named
                // as the kind (shadowing it here) so serde's messages say
                // what they said.
                #[derive(Deserialize)]
                #[serde(deny_unknown_fields)]
                struct $kind {
                    $( $(#[$common_meta])* $common_field: $common_type, )*
                    $( $(#[$field_meta])* $field: $type, )*
                }
                let flat = $kind::deserialize(deserializer)?;
                Ok(Self {
                    common: $common {
                        $( $common_field: flat.$common_field, )*
                    },
                    $( $field: flat.$field, )*
                })
            }
        }
    };
}

server_kinds! {
    /// What every operator server has, stdio or HTTP: its id, its
    /// authentication, the operator's classification of its tools, its
    /// deadlines and its limits.
    pub struct CommonServerConfig {
        /// The name in `mcp.{server_id}.` tool names.
        pub server_id: String,
        /// How toolgate authenticates to it (stdio: none or env; HTTP:
        /// none, bearer, header or oauth2_client).
        #[serde(default)]
        pub auth: AuthConfig,
        /// The operator's classification; the defaults are the most
        /// restrictive.
        #[serde(default = "CommonServerConfig::default_side_effect")]
        pub side_effect: SideEffectClass,
        /// See `side_effect`.
        #[serde(default = "CommonServerConfig::default_risk")]
        pub risk: RiskLevel,
        /// See `side_effect`.
        #[serde(default = "CommonServerConfig::default_idempotency")]
        pub idempotency: IdempotencyClass,
        /// Scopes every tool of the server requires, all under
        /// `mcp.{server_id}.`.
        #[serde(default)]
        pub required_scopes: Vec<String>,
        /// Handshake deadline.
        #[serde(default = "CommonServerConfig::default_connect")]
        pub connect_timeout_seconds: Seconds,
        /// Per-request deadline.
        #[serde(default = "CommonServerConfig::default_request")]
        pub request_timeout_seconds: Seconds,
        /// Idle close.
        #[serde(default = "CommonServerConfig::default_idle")]
        pub idle_timeout_seconds: Seconds,
        /// Every tool's `timeout_seconds`.
        #[serde(default = "CommonServerConfig::default_tool_timeout")]
        pub timeout_seconds: Seconds,
        /// Every tool's `maximum_output_bytes`.
        #[serde(default = "CommonServerConfig::default_output")]
        pub maximum_output_bytes: u64,
        /// A disabled server is neither spawned nor dialled.
        #[serde(default = "CommonServerConfig::default_enabled")]
        pub enabled: bool,
    }

    /// One operator-configured stdio server.
    pub struct StdioServerConfig {
        /// The program; never a tenant's choice.
        pub command: String,
        /// Its arguments; never a credential.
        #[serde(default)]
        pub args: Vec<String>,
        /// Declared non-secret variables, added to the synthesized tier.
        #[serde(default)]
        pub env: BTreeMap<String, String>,
        /// The user this server runs as (`name`, `uid` or `uid:gid`), over
        /// `mcp.run_as`.
        #[serde(default)]
        pub run_as: Option<RunAsUser>,
        /// The server's `PATH` (absolute folders, `:`-separated); the
        /// system's program folders when unset.
        #[serde(default)]
        pub path: Option<String>,
    }

    /// One operator-configured HTTP server.
    pub struct HttpServerConfig {
        /// The streamable-HTTP endpoint; the egress allowlist must permit it.
        pub url: String,
    }
}

/// A server's fields' defaults, each a named constant. A server has fields
/// without one (`server_id`), so it has no `Default` of its own.
impl CommonServerConfig {
    fn default_side_effect() -> SideEffectClass {
        SideEffectClass::ExternalWrite
    }
    fn default_risk() -> RiskLevel {
        RiskLevel::High
    }
    fn default_idempotency() -> IdempotencyClass {
        IdempotencyClass::NonIdempotent
    }
    fn default_connect() -> Seconds {
        Seconds::new(DEFAULT_CONNECT_TIMEOUT_SECONDS)
    }
    fn default_request() -> Seconds {
        Seconds::new(DEFAULT_REQUEST_TIMEOUT_SECONDS)
    }
    fn default_idle() -> Seconds {
        Seconds::new(DEFAULT_IDLE_TIMEOUT_SECONDS)
    }
    fn default_tool_timeout() -> Seconds {
        Seconds::new(DEFAULT_TOOL_TIMEOUT_SECONDS)
    }
    fn default_output() -> u64 {
        DEFAULT_SERVER_MAXIMUM_OUTPUT_BYTES
    }
    fn default_enabled() -> bool {
        true
    }

    /// The classification every tool of the server takes.
    pub fn classification(&self) -> ServerClassification {
        ServerClassification {
            side_effect: self.side_effect,
            risk: self.risk,
            idempotency: self.idempotency,
            required_scopes: self.required_scopes.iter().cloned().collect(),
            timeout_seconds: self.timeout_seconds.get(),
            maximum_output_bytes: self.maximum_output_bytes,
        }
    }

    /// The rules on the shared fields of the server at `at`, reached over
    /// `transport`: the same for both kinds, as for a tenant's row.
    fn validate(
        &self,
        at: &str,
        transport: Transport,
        limits: &LimitsConfig,
        allowlist: &EgressAllowlist,
        problems: &mut Problems,
    ) {
        for violation in validate_classification(&self.server_id, &self.required_scopes) {
            problems.push(format!("{at}.{}", violation.field()), violation.to_string());
        }
        let reference = self.auth.credential_ref.as_ref().map(ToString::to_string);
        let auth = AuthFields {
            transport,
            scheme: self.auth.scheme.as_str(),
            auth_name: self.auth.name.as_deref(),
            credential_ref: reference.as_deref(),
            token_endpoint: self.auth.token_endpoint.as_deref(),
        };
        for violation in validate_auth(auth, allowlist) {
            // The row's column names, as the file spells them.
            let field = match violation.field() {
                "auth_scheme" => "scheme",
                "auth_name" => "name",
                other => other,
            };
            problems.push(format!("{at}.auth.{field}"), violation.to_string());
        }
        for (field, seconds) in [
            ("connect_timeout_seconds", self.connect_timeout_seconds),
            ("request_timeout_seconds", self.request_timeout_seconds),
            ("idle_timeout_seconds", self.idle_timeout_seconds),
            ("timeout_seconds", self.timeout_seconds),
        ] {
            problems.at_least_one(&format!("{at}.{field}"), seconds.get());
        }
        if self.timeout_seconds > limits.maximum_timeout_seconds {
            problems.push(
                format!("{at}.timeout_seconds"),
                "must not exceed limits.maximum_timeout_seconds",
            );
        }
        if self.maximum_output_bytes == 0
            || self.maximum_output_bytes > limits.maximum_output_bytes_ceiling
        {
            problems.push(
                format!("{at}.maximum_output_bytes"),
                "must be between 1 and limits.maximum_output_bytes_ceiling",
            );
        }
    }
}

impl StdioServerConfig {
    /// The rules on a stdio server's own fields, at `at`.
    fn validate(&self, at: &str, problems: &mut Problems) {
        if self.command.trim().is_empty() {
            problems.push(format!("{at}.command"), "must name a program");
        }
        if let Some(path) = &self.path
            && (path.is_empty()
                || path
                    .split(':')
                    .any(|folder| !folder.starts_with('/') || folder.contains('\0')))
        {
            problems.push(
                format!("{at}.path"),
                "must be absolute folders separated by ':'",
            );
        }
        for name in self.env.keys() {
            if !is_variable_name(name) {
                problems.push(
                    format!("{at}.env"),
                    "variable names must match [A-Za-z_][A-Za-z0-9_]*",
                );
            } else if is_tier0(name) {
                problems.push(
                    format!("{at}.env.{name}"),
                    "names a tier-0 variable toolgate synthesizes or forbids",
                );
            } else if self.common.auth.name.as_deref() == Some(name.as_str()) {
                problems.push(
                    format!("{at}.env.{name}"),
                    "is the credential variable auth.name already supplies",
                );
            }
        }
    }
}

/// A server's authentication, as the row's `auth_*` columns.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// One of none, bearer, header, oauth2_client, oauth2_user, env.
    pub scheme: AuthScheme,
    /// Header or variable name, for header and env.
    pub name: Option<String>,
    /// Where the secret lives; never the secret.
    pub credential_ref: Option<CredentialRef>,
    /// oauth2_client; oauth2_user's exchange (operator's servers only).
    pub token_endpoint: Option<String>,
    /// oauth2_client and oauth2_user: the scopes asked for.
    pub token_scopes: Vec<String>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            scheme: AuthScheme::None,
            name: None,
            credential_ref: None,
            token_endpoint: None,
            token_scopes: Vec::new(),
        }
    }
}

fn is_variable_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b'A'..=b'Z' | b'a'..=b'z' | b'_'))
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}
