//! MCP servers as configured and their catalog history (a history, never
//! updated in place).

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{PlatformEvent, StoreError};
use crate::domain::mcp_server::{AuthScheme, Transport};
use crate::domain::{IdempotencyClass, RiskLevel, SideEffectClass};
use crate::ports::tool::BoxFuture;

/// A `mcp_servers` row: a server as configured, never a secret.
#[derive(Debug, Clone, PartialEq)]
pub struct McpServerRow {
    /// The name in `mcp.{server_id}.` tool names.
    pub server_id: String,
    /// stdio or http.
    pub transport: Transport,
    /// The command line (program and arguments) or the URL.
    pub endpoint: String,
    /// One of the six schemes.
    pub auth_scheme: AuthScheme,
    /// Header or variable name.
    pub auth_name: Option<String>,
    /// A broker reference, never the secret.
    pub credential_ref: Option<String>,
    /// oauth2_client; oauth2_user's exchange.
    pub token_endpoint: Option<String>,
    /// oauth2_client and oauth2_user.
    pub token_scopes: Option<Vec<String>>,
    /// The operator's classification of every tool of the server.
    pub side_effect: SideEffectClass,
    /// See `side_effect`.
    pub risk: RiskLevel,
    /// See `side_effect`.
    pub idempotency: IdempotencyClass,
    /// Scopes every tool requires.
    pub required_scopes: Vec<String>,
    /// Every tool's timeout.
    pub timeout_seconds: u32,
    /// Every tool's output limit.
    pub maximum_output_bytes: u64,
    /// Whether it is spawned or dialled at all.
    pub enabled: bool,
}

/// One tool of a catalog generation.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogEntry {
    /// The server's name for it.
    pub remote_name: String,
    /// `mcp.{server_id}.{normalized}`.
    pub registry_name: String,
    /// The schema the tool was registered (and its calls validated) with.
    pub input_schema: Value,
}

/// A `mcp_tool_catalog` row.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogRow {
    /// The generation.
    pub catalog_hash: String,
    /// The tool.
    pub entry: CatalogEntry,
    /// When the generation was first written.
    pub discovered_at: DateTime<Utc>,
    /// When a later generation no longer had the name.
    pub withdrawn_at: Option<DateTime<Utc>>,
}

/// One catalog generation of one server.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogGeneration {
    /// The server.
    pub server_id: String,
    /// The generation: sha256 over the sorted declarations.
    pub catalog_hash: String,
    /// The tools it registered.
    pub entries: Vec<CatalogEntry>,
}

/// What one catalog preparation writes, all in one transaction: the server
/// rows, the catalog generations and the events, in configured-server order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PreparationRecord {
    /// The servers prepared.
    pub servers: Vec<McpServerRow>,
    /// Their catalogs.
    pub generations: Vec<CatalogGeneration>,
    /// Their events.
    pub events: Vec<PlatformEvent>,
}

/// `mcp_servers` and `mcp_tool_catalog`.
pub trait CatalogStore: Send + Sync {
    /// Writes one preparation in one transaction: upserts the server rows,
    /// writes each catalog generation unless its hash is already written for
    /// the server (stamping `withdrawn_at` on earlier names it lacks), and
    /// appends the events in order. Returns, per generation, whether it was
    /// written.
    fn record_preparation<'a>(
        &'a self,
        tenant_id: &'a str,
        record: &'a PreparationRecord,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>>;

    /// One catalog generation alone: [`Store::record_preparation`] with no
    /// server rows and no events.
    fn record_catalog<'a>(
        &'a self,
        tenant_id: &'a str,
        server_id: &'a str,
        catalog_hash: &'a str,
        entries: &'a [CatalogEntry],
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let record = PreparationRecord {
                generations: vec![CatalogGeneration {
                    server_id: server_id.to_owned(),
                    catalog_hash: catalog_hash.to_owned(),
                    entries: entries.to_vec(),
                }],
                ..PreparationRecord::default()
            };
            let written = self.record_preparation(tenant_id, &record, now).await?;
            Ok(written.first().copied().unwrap_or(false))
        })
    }

    /// A server's catalog history, oldest generation first.
    fn catalog_history<'a>(
        &'a self,
        tenant_id: &'a str,
        server_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<CatalogRow>, StoreError>>;

    /// Writes a tenant's server row (insert or replace by server id).
    fn put_mcp_server<'a>(
        &'a self,
        tenant_id: &'a str,
        server: &'a McpServerRow,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// A tenant's server row.
    fn mcp_server<'a>(
        &'a self,
        tenant_id: &'a str,
        server_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<McpServerRow>, StoreError>>;

    /// The servers the tenant wrote itself (never the operator's rows a
    /// preparation recorded), by server id.
    fn tenant_mcp_servers<'a>(
        &'a self,
        tenant_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<McpServerRow>, StoreError>>;

    /// Removes a tenant's server row; false when there was none.
    fn delete_mcp_server<'a>(
        &'a self,
        tenant_id: &'a str,
        server_id: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
}
