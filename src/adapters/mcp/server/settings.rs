//! The two kinds of server as the operator configures them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::adapters::mcp::auth::AuthSettings;
use crate::adapters::mcp::child::RunAs;
use crate::domain::mcp_server::{AuthScheme, ServerClassification, Transport};
use crate::domain::secret::CredentialRef;
use crate::ports::McpServerRow;

/// One stdio server as the operator configured it.
#[derive(Debug, Clone)]
pub struct StdioServerSettings {
    /// The name in `mcp.{server_id}.`.
    pub server_id: String,
    /// The program.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Declared non-secret variables.
    pub env: BTreeMap<String, String>,
    /// `none` or `env` on stdio.
    pub auth_scheme: AuthScheme,
    /// The variable the credential goes in, for `env`.
    pub auth_name: Option<String>,
    /// Where the credential lives, for `env`.
    pub credential_ref: Option<CredentialRef>,
    /// The operator's classification of every tool.
    pub classification: ServerClassification,
    /// Handshake deadline.
    pub connect_timeout: Duration,
    /// Per-request deadline (the tool's and the run's cap it further).
    pub request_timeout: Duration,
    /// Close a connection unused this long.
    pub idle_timeout: Duration,
    /// Spawned at all.
    pub enabled: bool,
    /// This server's state folder (its HOME).
    pub state_dir: PathBuf,
    /// The user it runs as; toolgate's own when `None`.
    pub run_as: Option<RunAs>,
    /// Its `PATH`; the system's program folders when `None`.
    pub path: Option<String>,
}

impl StdioServerSettings {
    pub(super) fn row(&self) -> McpServerRow {
        let mut endpoint = self.program.clone();
        for arg in &self.args {
            endpoint.push(' ');
            endpoint.push_str(arg);
        }
        McpServerRow {
            server_id: self.server_id.clone(),
            transport: Transport::Stdio,
            endpoint,
            auth_scheme: self.auth_scheme,
            auth_name: self.auth_name.clone(),
            credential_ref: self.credential_ref.as_ref().map(ToString::to_string),
            token_endpoint: None,
            token_scopes: None,
            side_effect: self.classification.side_effect,
            risk: self.classification.risk,
            idempotency: self.classification.idempotency,
            required_scopes: self
                .classification
                .required_scopes
                .iter()
                .cloned()
                .collect(),
            timeout_seconds: self.classification.timeout_seconds,
            maximum_output_bytes: self.classification.maximum_output_bytes,
            enabled: self.enabled,
        }
    }
}

/// One streamable-HTTP server, the operator's or a tenant's.
#[derive(Debug, Clone)]
pub struct HttpServerSettings {
    /// The name in `mcp.{server_id}.`.
    pub server_id: String,
    /// The endpoint, dialled only through egress.
    pub url: String,
    /// How toolgate authenticates to it.
    pub auth: AuthSettings,
    /// The classification of every tool.
    pub classification: ServerClassification,
    /// Handshake deadline.
    pub connect_timeout: Duration,
    /// Per-request deadline (the tool's and the run's cap it further); also
    /// how long an answer's head may take.
    pub request_timeout: Duration,
    /// Close a connection unused this long.
    pub idle_timeout: Duration,
    /// Dialled at all.
    pub enabled: bool,
}

impl HttpServerSettings {
    pub(super) fn row(&self) -> McpServerRow {
        McpServerRow {
            server_id: self.server_id.clone(),
            transport: Transport::Http,
            endpoint: self.url.clone(),
            auth_scheme: self.auth.scheme,
            auth_name: self.auth.name.clone(),
            credential_ref: self.auth.credential_ref.as_ref().map(ToString::to_string),
            token_endpoint: self.auth.token_endpoint.clone(),
            token_scopes: (!self.auth.token_scopes.is_empty())
                .then(|| self.auth.token_scopes.clone()),
            side_effect: self.classification.side_effect,
            risk: self.classification.risk,
            idempotency: self.classification.idempotency,
            required_scopes: self
                .classification
                .required_scopes
                .iter()
                .cloned()
                .collect(),
            timeout_seconds: self.classification.timeout_seconds,
            maximum_output_bytes: self.classification.maximum_output_bytes,
            enabled: self.enabled,
        }
    }
}
