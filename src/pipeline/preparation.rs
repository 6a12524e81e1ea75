//! Session preparation for MCP servers: discovery results are registered,
//! and the server rows, catalog generations and events of one preparation
//! are written in one transaction, in configured-server order, so a failure
//! commits none of them and pins and event order stay deterministic.

use std::collections::{HashMap, HashSet};

use crate::domain::names::bounded_name;
use crate::domain::{ReasonCode, SkillMetadata, ToolSource, ToolSpec};
use crate::ports::{
    CatalogEntry, CatalogGeneration, CatalogStore, Clock, DiscoveryOutcome, McpServers,
    PlatformEvent, PreparationRecord, ServerDiscovery, StoreError,
};

use super::registry::{RejectionReason, ToolRegistry};
use super::validation::SchemaError;

/// What a preparation registered and recorded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PreparedCatalog {
    /// Registry names now registered, in configured-server order.
    pub registered: Vec<String>,
    /// Skills the servers' prompts became.
    pub skills: Vec<SkillMetadata>,
    /// The events written, in order.
    pub events: Vec<PlatformEvent>,
}

/// Discovers every configured server for a session of `principal_id`,
/// registers what it found and records the preparation.
pub async fn prepare_mcp(
    registry: &ToolRegistry,
    store: &dyn CatalogStore,
    clock: &dyn Clock,
    tenant_id: &str,
    principal_id: Option<&str>,
    servers: &dyn McpServers,
) -> Result<PreparedCatalog, StoreError> {
    let discovered = servers.discover(tenant_id, principal_id).await;
    let (prepared, record) = register_discoveries(registry, tenant_id, discovered);
    store
        .record_preparation(tenant_id, &record, clock.now())
        .await?;
    Ok(prepared)
}

/// Registers discoveries in order and builds what a preparation records:
/// the server rows, one catalog generation per discovered server (the tools
/// that registered) and the events.
///
/// A session is offered only the MCP tools of servers that gave a catalog
/// now: an operator server that failed is withdrawn for everyone until it
/// answers again, and `tenant_id`'s own servers are exactly those that
/// answered (one removed or failing since is withdrawn).
pub fn register_discoveries(
    registry: &ToolRegistry,
    tenant_id: &str,
    discoveries: Vec<ServerDiscovery>,
) -> (PreparedCatalog, PreparationRecord) {
    let mut prepared = PreparedCatalog::default();
    let mut record = PreparationRecord::default();
    // Per scope and server: the names it registered now, or `None` when it
    // gave no catalog.
    let mut offered: HashMap<(Option<String>, String), Option<HashSet<String>>> = HashMap::new();
    for discovery in discoveries {
        let key = (
            discovery.tenant_id.clone(),
            discovery.server.server_id.clone(),
        );
        offered.insert(key.clone(), None);
        let server_id = discovery.server.server_id.clone();
        let transport = discovery.server.transport;
        // A tenant's own server row is the tenant's to write; a preparation
        // records only the operator's, whose configuration is the file's.
        if discovery.tenant_id.is_none() {
            record.servers.push(discovery.server);
        }
        let tools = discovery.tools.len();
        let catalog_hash = match (discovery.outcome, discovery.catalog_hash) {
            (DiscoveryOutcome::Connected { duration_ms }, Some(hash)) => {
                record.events.push(PlatformEvent::ServerConnected {
                    server_id: server_id.clone(),
                    transport,
                    tools,
                    duration_ms,
                });
                hash
            }
            (DiscoveryOutcome::Pinned, Some(hash)) => {
                record.events.push(PlatformEvent::ServerPinned {
                    server_id: server_id.clone(),
                    transport,
                    tools,
                });
                hash
            }
            (outcome, _) => {
                // A server without a catalog is left out; the session goes on.
                let reason_code = match outcome {
                    DiscoveryOutcome::Failed { reason_code } => reason_code,
                    _ => ReasonCode::ToolServerUnreachable,
                };
                record.events.push(PlatformEvent::ServerDisconnected {
                    server_id,
                    reason_code,
                });
                continue;
            }
        };
        // Remote names are a server's text: events carry them bounded.
        for remote_names in discovery.conflicts {
            record.events.push(PlatformEvent::CatalogConflict {
                server_id: server_id.clone(),
                remote_names: remote_names
                    .iter()
                    .map(|name| bounded_name(name).into_owned())
                    .collect(),
            });
        }
        let remote_names: HashMap<String, String> = discovery
            .tools
            .iter()
            .map(|found| (found.tool.spec().name.clone(), found.remote_name.clone()))
            .collect();
        let tools = discovery
            .tools
            .iter()
            .map(|found| found.tool.clone())
            .collect();
        let report = match &discovery.tenant_id {
            Some(tenant) => registry.register_for_tenant(tenant, tools, ToolSource::Mcp),
            None => registry.register_dynamic(tools, ToolSource::Mcp),
        };
        for rejection in &report.rejected {
            record.events.push(PlatformEvent::ToolRejected {
                server_id: server_id.clone(),
                remote_name: bounded_name(
                    remote_names.get(&rejection.name).unwrap_or(&rejection.name),
                )
                .into_owned(),
                reason: slug(&rejection.cause).to_owned(),
            });
        }
        let mut entries = Vec::with_capacity(report.registered.len());
        for name in &report.registered {
            if let Ok(registered) =
                registry.get_for(discovery.tenant_id.as_deref(), name, Some(&catalog_hash))
            {
                entries.push(CatalogEntry {
                    remote_name: remote_names.get(name).cloned().unwrap_or_default(),
                    registry_name: name.clone(),
                    input_schema: registered.spec.input_schema.clone(),
                });
            }
        }
        record.generations.push(CatalogGeneration {
            server_id,
            catalog_hash,
            entries,
        });
        offered.insert(key, Some(report.registered.iter().cloned().collect()));
        prepared.registered.extend(report.registered);
        prepared.skills.extend(discovery.skills);
    }
    let keep = |scope: Option<String>, spec: &ToolSpec| {
        let server_id = spec.server_id.clone().unwrap_or_default();
        match offered.get(&(scope.clone(), server_id)) {
            Some(Some(names)) => names.contains(&spec.name),
            Some(None) => false,
            // An operator server this preparation did not name (disabled)
            // is left as it is; a tenant's server it did not name is gone.
            None => scope.is_none(),
        }
    };
    registry.withdraw_mcp(None, |spec| keep(None, spec));
    if !tenant_id.is_empty() {
        registry.withdraw_mcp(Some(tenant_id), |spec| {
            keep(Some(tenant_id.to_owned()), spec)
        });
    }
    prepared.events = record.events.clone();
    (prepared, record)
}

/// A stable, content-free reason for `mcp.tool.rejected`: a rejection's
/// message can quote a server's property names, which are external text.
pub fn slug(reason: &RejectionReason) -> &'static str {
    match reason {
        RejectionReason::Name(_) => "name",
        RejectionReason::UnknownDomain(_) => "unknown_domain",
        RejectionReason::ReservedDomain(_) => "reserved_domain",
        RejectionReason::ControlOnlyDomain(_) => "control_only_domain",
        RejectionReason::ControlSetClosed => "control_set_closed",
        RejectionReason::ControlConstraint => "control_constraint",
        RejectionReason::McpNamespace => "mcp_namespace",
        RejectionReason::DeviceNamespace => "device_namespace",
        RejectionReason::TargetSource { .. } => "target_source",
        RejectionReason::TargetPin(_) => "target_pin",
        RejectionReason::InputSchema(error) => match error {
            SchemaError::NotObjectSchema => "input_schema.not_object",
            SchemaError::Dialect { .. } => "input_schema.dialect",
            SchemaError::RemoteReference { .. } => "input_schema.remote_reference",
            SchemaError::TooDeep { .. } => "input_schema.too_deep",
            SchemaError::TooLarge { .. } => "input_schema.too_large",
            SchemaError::NoCanonicalForm(_) => "input_schema.no_canonical_form",
            SchemaError::Invalid { .. } => "input_schema.invalid",
        },
        RejectionReason::OutputSchema(_) => "output_schema",
        RejectionReason::OutputCeiling { .. } => "output_ceiling",
        RejectionReason::ZeroLimit => "zero_limit",
        RejectionReason::TenantCatalogBudget { .. } => "tenant_catalog_budget",
        RejectionReason::SourceNotDynamic(_) => "source_not_dynamic",
        RejectionReason::SourceMismatch { .. } => "source_mismatch",
        RejectionReason::Duplicate => "duplicate",
    }
}
