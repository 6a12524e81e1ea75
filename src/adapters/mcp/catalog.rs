//! Mapping a server's tool declarations into `ToolSpec`s: the design
//! document's table, where every field is derived or forced and nothing the
//! server claims about itself is believed.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::domain::mcp_server::ServerClassification;
use crate::domain::names::mcp_registry_name;
use crate::domain::{
    TargetKind, ToolKind, ToolSource, ToolSpec, TrustLevel, canonicalize, sha256_hex,
};

/// Longest description kept, in bytes.
pub const MAXIMUM_DESCRIPTION_BYTES: usize = 1024;
/// The metadata key that marks an application-only tool.
pub const APPLICATION_ONLY: &str = "veetbot/application-only";

/// A tool as a server declared it, in protocol-neutral form.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteTool {
    /// The server's name for it.
    pub name: String,
    /// Its description, untrusted.
    pub description: Option<String>,
    /// Its input schema, unvalidated.
    pub input_schema: Value,
    /// Its output schema, unvalidated, when it declares one.
    pub output_schema: Option<Value>,
    /// Its `_meta`.
    pub meta: Option<Map<String, Value>>,
}

/// Two declarations that normalize to one registry name: neither is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogConflict {
    /// The registry name they share.
    pub registry_name: String,
    /// Both remote names.
    pub remote_names: Vec<String>,
}

/// A server's catalog, mapped.
#[derive(Debug, Clone, PartialEq)]
pub struct MappedCatalog {
    /// sha256 over the sorted declarations: every tool's `version`.
    pub catalog_hash: String,
    /// The specs, in registry-name order, with the remote name each came from.
    pub specs: Vec<(String, ToolSpec)>,
    /// Same-server name conflicts (`mcp.catalog.conflict`).
    pub conflicts: Vec<CatalogConflict>,
}

/// The catalog hash: sha256 of the canonical form of the declarations
/// sorted by remote name, so it changes exactly when a declaration does.
pub fn catalog_hash(tools: &[RemoteTool]) -> String {
    let mut sorted: Vec<&RemoteTool> = tools.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let declarations: Vec<Value> = sorted
        .iter()
        .map(|tool| {
            let mut declaration = serde_json::json!({
                "name": tool.name,
                "description": tool.description,
                "input_schema": tool.input_schema,
                "meta": tool.meta,
            });
            // Absent rather than null, so a catalog without output schemas
            // hashes as it always has.
            if let Some(output_schema) = &tool.output_schema {
                declaration["output_schema"] = output_schema.clone();
            }
            declaration
        })
        .collect();
    match canonicalize(Value::Array(declarations.clone())) {
        Ok(canonical) => canonical.sha256,
        // A declaration with no canonical form (say, -0.0 in a schema) still
        // gets a stable hash; the tool itself is rejected at registration.
        Err(_) => sha256_hex(Value::Array(declarations).to_string().as_bytes()),
    }
}

/// Cuts `text` to at most `bytes` bytes at a character boundary.
pub fn cut(text: &str, bytes: usize) -> &str {
    if text.len() <= bytes {
        return text;
    }
    let mut end = bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Maps a server's declarations by the document's table.
pub fn map_catalog(
    server_id: &str,
    classification: &ServerClassification,
    tools: &[RemoteTool],
) -> MappedCatalog {
    let catalog_hash = catalog_hash(tools);
    let mut by_name: BTreeMap<String, Vec<&RemoteTool>> = BTreeMap::new();
    for tool in tools {
        by_name
            .entry(mcp_registry_name(server_id, &tool.name))
            .or_default()
            .push(tool);
    }
    let mut specs = Vec::new();
    let mut conflicts = Vec::new();
    for (registry_name, declared) in by_name {
        if let [tool] = declared.as_slice() {
            specs.push((
                tool.name.clone(),
                spec(
                    server_id,
                    &registry_name,
                    &catalog_hash,
                    classification,
                    tool,
                ),
            ));
        } else {
            // Dropping both keeps the result independent of listing order.
            let mut remote_names: Vec<String> =
                declared.iter().map(|tool| tool.name.clone()).collect();
            remote_names.sort();
            conflicts.push(CatalogConflict {
                registry_name,
                remote_names,
            });
        }
    }
    MappedCatalog {
        catalog_hash,
        specs,
        conflicts,
    }
}

fn spec(
    server_id: &str,
    registry_name: &str,
    catalog_hash: &str,
    classification: &ServerClassification,
    tool: &RemoteTool,
) -> ToolSpec {
    let application_only = tool
        .meta
        .as_ref()
        .and_then(|meta| meta.get(APPLICATION_ONLY))
        .is_some_and(|value| value == &Value::Bool(true));
    ToolSpec {
        name: registry_name.to_owned(),
        version: catalog_hash.to_owned(),
        description: cut(
            tool.description.as_deref().unwrap_or_default(),
            MAXIMUM_DESCRIPTION_BYTES,
        )
        .to_owned(),
        input_schema: tool.input_schema.clone(),
        output_schema: tool.output_schema.clone(),
        side_effect: classification.side_effect,
        risk: classification.risk,
        idempotency: classification.idempotency,
        required_scopes: classification.required_scopes.clone(),
        timeout_seconds: classification.timeout_seconds,
        maximum_output_bytes: classification.maximum_output_bytes,
        allow_parallel: false,
        kind: ToolKind::Capability,
        target_kind: TargetKind::McpServer,
        output_trust: TrustLevel::ExternalUntrusted,
        source: ToolSource::Mcp,
        server_id: Some(server_id.to_owned()),
        device_id: None,
        deprecated: false,
        model_visible: !application_only,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{IdempotencyClass, RiskLevel, SideEffectClass};
    use serde_json::json;

    fn tool(name: &str) -> RemoteTool {
        RemoteTool {
            name: name.into(),
            description: Some("Does a thing.".into()),
            input_schema: json!({"type": "object"}),
            output_schema: None,
            meta: None,
        }
    }

    fn classification() -> ServerClassification {
        ServerClassification::most_restrictive(30, 65536)
    }

    #[test]
    fn every_field_is_derived_or_forced() {
        let mut declared = tool("Create Ticket");
        declared.description = Some("é".repeat(600));
        let catalog = map_catalog("acme", &classification(), &[declared]);
        let (remote, spec) = &catalog.specs[0];
        assert_eq!(remote, "Create Ticket");
        assert_eq!(spec.name, "mcp.acme.create_ticket");
        assert_eq!(spec.version, catalog.catalog_hash);
        assert!(spec.description.len() <= MAXIMUM_DESCRIPTION_BYTES);
        assert_eq!(spec.description.len(), 1024);
        assert_eq!(spec.output_schema, None);
        assert_eq!(
            (spec.side_effect, spec.risk, spec.idempotency),
            (
                SideEffectClass::ExternalWrite,
                RiskLevel::High,
                IdempotencyClass::NonIdempotent
            )
        );
        assert!(!spec.allow_parallel);
        assert_eq!(spec.output_trust, TrustLevel::ExternalUntrusted);
        assert_eq!(
            (spec.source, spec.target_kind),
            (ToolSource::Mcp, TargetKind::McpServer)
        );
        assert!(spec.model_visible);
    }

    #[test]
    fn same_server_conflicts_drop_both_and_keep_the_rest() {
        let catalog = map_catalog(
            "acme",
            &classification(),
            &[tool("Get Item"), tool("get-item"), tool("list")],
        );
        let names: Vec<&str> = catalog
            .specs
            .iter()
            .map(|(_, spec)| spec.name.as_str())
            .collect();
        assert_eq!(names, vec!["mcp.acme.list"]);
        assert_eq!(
            catalog.conflicts,
            vec![CatalogConflict {
                registry_name: "mcp.acme.get_item".into(),
                remote_names: vec!["Get Item".into(), "get-item".into()]
            }]
        );
        // Listing order changes nothing.
        let reversed = map_catalog(
            "acme",
            &classification(),
            &[tool("list"), tool("get-item"), tool("Get Item")],
        );
        assert_eq!(reversed, catalog);
    }

    #[test]
    fn the_catalog_hash_follows_declarations_not_order_or_claims() {
        let a = catalog_hash(&[tool("a"), tool("b")]);
        assert_eq!(a, catalog_hash(&[tool("b"), tool("a")]));
        let mut changed = tool("b");
        changed.input_schema = json!({"type": "object", "properties": {"x": {"type": "string"}}});
        assert_ne!(a, catalog_hash(&[tool("a"), changed]));
    }

    #[test]
    fn application_only_tools_are_not_model_visible() {
        let mut hidden = tool("sync");
        hidden.meta = Some(
            json!({APPLICATION_ONLY: true})
                .as_object()
                .cloned()
                .unwrap(),
        );
        let mut claimed = tool("other");
        claimed.meta = Some(
            json!({APPLICATION_ONLY: "yes"})
                .as_object()
                .cloned()
                .unwrap(),
        );
        let catalog = map_catalog("gmail", &classification(), &[hidden, claimed]);
        let visible: BTreeMap<&str, bool> = catalog
            .specs
            .iter()
            .map(|(remote, spec)| (remote.as_str(), spec.model_visible))
            .collect();
        assert_eq!(visible, [("other", true), ("sync", false)].into());
    }
}
