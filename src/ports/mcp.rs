//! What the pipeline needs from MCP servers to prepare a session, in
//! protocol-neutral terms: the adapter discovers, the pipeline registers and
//! records.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::store::McpServerRow;
use super::tool::{BoxFuture, Tool};
use crate::domain::{ReasonCode, SkillMetadata, ToolFailure};

/// One tool a discovery produced, with the server's name for it.
#[derive(Clone)]
pub struct DiscoveredTool {
    /// The server's name for the tool.
    pub remote_name: String,
    /// The implementation; its spec is already mapped by the document's table.
    pub tool: Arc<dyn Tool>,
}

impl std::fmt::Debug for DiscoveredTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscoveredTool")
            .field("remote_name", &self.remote_name)
            .field("name", &self.tool.spec().name)
            .finish()
    }
}

/// How a server's catalog was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscoveryOutcome {
    /// A live handshake and listing.
    Connected {
        /// Handshake and discovery time.
        duration_ms: i64,
    },
    /// The process's remembered discovery, pinned without connecting.
    Pinned,
    /// No catalog: the server is left out of the session.
    Failed {
        /// Why, as a stable code.
        reason_code: ReasonCode,
    },
}

/// One server's discovery, mapped but not yet registered.
#[derive(Debug, Clone)]
pub struct ServerDiscovery {
    /// The server as configured.
    pub server: McpServerRow,
    /// The tenant whose own server it is; `None` for the operator's, which
    /// every tenant's sessions may use.
    pub tenant_id: Option<String>,
    /// Live, remembered or failed.
    pub outcome: DiscoveryOutcome,
    /// The catalog hash (every tool's version), absent when failed.
    pub catalog_hash: Option<String>,
    /// The mapped tools, conflicts already dropped.
    pub tools: Vec<DiscoveredTool>,
    /// Remote names that collided, each group dropped whole.
    pub conflicts: Vec<Vec<String>>,
    /// The server's prompts, as skills.
    pub skills: Vec<SkillMetadata>,
}

/// A loaded skill's content, labelled with the trust it carries.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedSkill {
    /// The skill's metadata.
    pub metadata: SkillMetadata,
    /// Its text, rendered from the source's messages.
    pub text: String,
}

/// The configured MCP servers.
pub trait McpServers: Send + Sync {
    /// Discovers every enabled server a session of `tenant_id` may use, in
    /// configured order: the operator's, then the tenant's own. A server
    /// that acts with each principal's own grant is dialled with
    /// `principal_id`'s (none: recovery and the operator's `discover`).
    fn discover<'a>(
        &'a self,
        tenant_id: &'a str,
        principal_id: Option<&'a str>,
    ) -> BoxFuture<'a, Vec<ServerDiscovery>>;

    /// Loads a skill a discovery advertised, with `arguments`, for a
    /// session of `tenant_id`.
    fn load_skill<'a>(
        &'a self,
        tenant_id: &'a str,
        name: &'a str,
        arguments: Map<String, Value>,
    ) -> BoxFuture<'a, Result<LoadedSkill, ToolFailure>>;

    /// Whether `server_id` (the operator's, or `tenant_id`'s own) has a
    /// live connection on this node now; `None` when this node holds no
    /// such server (a tenant's server no session of it has used here).
    fn connected_now<'a>(
        &'a self,
        tenant_id: &'a str,
        server_id: &'a str,
    ) -> BoxFuture<'a, Option<bool>>;
}
