//! The `[mcp]` section: the operator's stdio and HTTP servers, their
//! classification and their authentication.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{
    DEFAULT_CONNECT_TIMEOUT_SECONDS, DEFAULT_DISCOVERY_REUSE_SECONDS, DEFAULT_IDLE_TIMEOUT_SECONDS,
    DEFAULT_REQUEST_TIMEOUT_SECONDS, DEFAULT_SERVER_MAXIMUM_OUTPUT_BYTES,
    DEFAULT_TOOL_TIMEOUT_SECONDS,
};
use crate::domain::{IdempotencyClass, RiskLevel, SideEffectClass};

/// Operator-configured MCP servers.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct McpConfig {
    /// One 0700 folder per stdio server under here: its HOME and TMPDIR.
    #[serde(default = "McpConfig::default_state_directory")]
    pub state_directory: PathBuf,
    /// The user every stdio server runs as unless it names its own:
    /// `name`, `uid` or `uid:gid`. Unset, servers run as toolgate's own
    /// user and could reach what it can (its socket, its database); set it
    /// to a user of their own (toolgate then needs CAP_SETUID and
    /// CAP_SETGID, or root).
    #[serde(default)]
    pub run_as: Option<String>,
    /// stdio servers, spawned with a constructed environment.
    #[serde(default)]
    pub servers: Vec<StdioServerConfig>,
    /// HTTP servers the operator configures for every tenant, dialled
    /// through egress.
    #[serde(default)]
    pub http_servers: Vec<HttpServerConfig>,
    /// How long a tenant HTTP server's discovery is reused before a session
    /// connects again.
    #[serde(default = "McpConfig::default_reuse")]
    pub discovery_reuse_seconds: u32,
    /// At start, the operator's servers are discovered in the background,
    /// one at a time, so the first session pins them without waiting; each
    /// handshake may take this long (longer than a session waits: services
    /// restart together on a small host). The node is ready once this first
    /// round is done, or this long after it began.
    #[serde(default = "McpConfig::default_warmup_connect_timeout")]
    pub warmup_connect_timeout_seconds: u32,
    /// Servers the warm-up could not reach are tried again this often.
    #[serde(default = "McpConfig::default_warmup_retry")]
    pub warmup_retry_seconds: u32,
    /// Rounds of warm-up at most (the first included); 0 turns it off.
    #[serde(default = "McpConfig::default_warmup_attempts")]
    pub warmup_attempts: u32,
}

impl McpConfig {
    fn default_state_directory() -> PathBuf {
        PathBuf::from("var/mcp")
    }
    fn default_reuse() -> u32 {
        DEFAULT_DISCOVERY_REUSE_SECONDS
    }
    fn default_warmup_connect_timeout() -> u32 {
        60
    }
    fn default_warmup_retry() -> u32 {
        30
    }
    fn default_warmup_attempts() -> u32 {
        3
    }
}

impl Default for McpConfig {
    fn default() -> Self {
        McpConfig {
            state_directory: McpConfig::default_state_directory(),
            run_as: None,
            servers: Vec::new(),
            http_servers: Vec::new(),
            discovery_reuse_seconds: DEFAULT_DISCOVERY_REUSE_SECONDS,
            warmup_connect_timeout_seconds: McpConfig::default_warmup_connect_timeout(),
            warmup_retry_seconds: McpConfig::default_warmup_retry(),
            warmup_attempts: McpConfig::default_warmup_attempts(),
        }
    }
}

/// One operator-configured stdio server.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StdioServerConfig {
    /// The name in `mcp.{server_id}.` tool names.
    pub server_id: String,
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
    pub run_as: Option<String>,
    /// The server's `PATH` (absolute folders, `:`-separated); the system's
    /// program folders when unset.
    #[serde(default)]
    pub path: Option<String>,
    /// How the server authenticates us.
    #[serde(default)]
    pub auth: AuthConfig,
    /// The operator's classification; the defaults are the most restrictive.
    #[serde(default = "StdioServerConfig::default_side_effect")]
    pub side_effect: SideEffectClass,
    /// See `side_effect`.
    #[serde(default = "StdioServerConfig::default_risk")]
    pub risk: RiskLevel,
    /// See `side_effect`.
    #[serde(default = "StdioServerConfig::default_idempotency")]
    pub idempotency: IdempotencyClass,
    /// Scopes every tool of the server requires, all under `mcp.{server_id}.`.
    #[serde(default)]
    pub required_scopes: Vec<String>,
    /// Handshake deadline.
    #[serde(default = "StdioServerConfig::default_connect")]
    pub connect_timeout_seconds: u32,
    /// Per-request deadline.
    #[serde(default = "StdioServerConfig::default_request")]
    pub request_timeout_seconds: u32,
    /// Idle close.
    #[serde(default = "StdioServerConfig::default_idle")]
    pub idle_timeout_seconds: u32,
    /// Every tool's `timeout_seconds`.
    #[serde(default = "StdioServerConfig::default_tool_timeout")]
    pub timeout_seconds: u32,
    /// Every tool's `maximum_output_bytes`.
    #[serde(default = "StdioServerConfig::default_output")]
    pub maximum_output_bytes: u64,
    /// A disabled server is not spawned.
    #[serde(default = "StdioServerConfig::default_enabled")]
    pub enabled: bool,
}

impl StdioServerConfig {
    fn default_side_effect() -> SideEffectClass {
        SideEffectClass::ExternalWrite
    }
    fn default_risk() -> RiskLevel {
        RiskLevel::High
    }
    fn default_idempotency() -> IdempotencyClass {
        IdempotencyClass::NonIdempotent
    }
    fn default_connect() -> u32 {
        DEFAULT_CONNECT_TIMEOUT_SECONDS
    }
    fn default_request() -> u32 {
        DEFAULT_REQUEST_TIMEOUT_SECONDS
    }
    fn default_idle() -> u32 {
        DEFAULT_IDLE_TIMEOUT_SECONDS
    }
    fn default_tool_timeout() -> u32 {
        DEFAULT_TOOL_TIMEOUT_SECONDS
    }
    fn default_output() -> u64 {
        DEFAULT_SERVER_MAXIMUM_OUTPUT_BYTES
    }
    fn default_enabled() -> bool {
        true
    }
}

/// One operator-configured HTTP server.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpServerConfig {
    /// The name in `mcp.{server_id}.` tool names.
    pub server_id: String,
    /// The streamable-HTTP endpoint; the egress allowlist must permit it.
    pub url: String,
    /// How toolgate authenticates to it: none, bearer, header or
    /// oauth2_client.
    #[serde(default)]
    pub auth: AuthConfig,
    /// The operator's classification; the defaults are the most restrictive.
    #[serde(default = "StdioServerConfig::default_side_effect")]
    pub side_effect: SideEffectClass,
    /// See `side_effect`.
    #[serde(default = "StdioServerConfig::default_risk")]
    pub risk: RiskLevel,
    /// See `side_effect`.
    #[serde(default = "StdioServerConfig::default_idempotency")]
    pub idempotency: IdempotencyClass,
    /// Scopes every tool of the server requires, all under `mcp.{server_id}.`.
    #[serde(default)]
    pub required_scopes: Vec<String>,
    /// Handshake deadline.
    #[serde(default = "StdioServerConfig::default_connect")]
    pub connect_timeout_seconds: u32,
    /// Per-request deadline.
    #[serde(default = "StdioServerConfig::default_request")]
    pub request_timeout_seconds: u32,
    /// Idle close.
    #[serde(default = "StdioServerConfig::default_idle")]
    pub idle_timeout_seconds: u32,
    /// Every tool's `timeout_seconds`.
    #[serde(default = "StdioServerConfig::default_tool_timeout")]
    pub timeout_seconds: u32,
    /// Every tool's `maximum_output_bytes`.
    #[serde(default = "StdioServerConfig::default_output")]
    pub maximum_output_bytes: u64,
    /// Dialled at all.
    #[serde(default = "StdioServerConfig::default_enabled")]
    pub enabled: bool,
}

/// A server's authentication, as the row's `auth_*` columns.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// One of none, bearer, header, oauth2_client, env (text here, so an
    /// unknown scheme is reported by the same rules as every other mistake).
    #[serde(default = "AuthConfig::default_scheme")]
    pub scheme: String,
    /// Header or variable name, for header and env.
    #[serde(default)]
    pub name: Option<String>,
    /// Where the secret lives; never the secret.
    #[serde(default)]
    pub credential_ref: Option<String>,
    /// oauth2_client only.
    #[serde(default)]
    pub token_endpoint: Option<String>,
    /// oauth2_client only.
    #[serde(default)]
    pub token_scopes: Vec<String>,
}

impl AuthConfig {
    fn default_scheme() -> String {
        "none".to_owned()
    }
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            scheme: AuthConfig::default_scheme(),
            name: None,
            credential_ref: None,
            token_endpoint: None,
            token_scopes: Vec::new(),
        }
    }
}
