//! Shared test parts: a real `Tool` whose spec a test chooses.

use std::sync::Arc;

use serde_json::{Value, json};
use toolgate::domain::{IdempotencyClass, RiskLevel, SideEffectClass, ToolResult, ToolSpec};
use toolgate::ports::{BoxFuture, Tool, ToolExecutionContext};

/// A tool that returns its arguments as text; enough for registration tests,
/// which never execute.
pub struct SpecTool(pub ToolSpec);

impl Tool for SpecTool {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }

    fn execute<'a>(
        &'a self,
        arguments: Value,
        _context: ToolExecutionContext,
    ) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move { ToolResult::text(arguments.to_string()) })
    }
}

/// A valid builtin spec, for tests to bend.
pub fn builtin_spec(name: &str) -> ToolSpec {
    serde_json::from_value(json!({
        "name": name,
        "version": "1",
        "description": "A test tool.",
        "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
        "output_schema": null,
        "side_effect": "none",
        "risk": "low",
        "idempotency": "read_only",
        "required_scopes": [],
        "timeout_seconds": 5,
        "maximum_output_bytes": 4096,
        "allow_parallel": true,
        "output_trust": "internal_tool"
    }))
    .expect("the base spec parses")
}

/// A valid MCP spec for `server_id`.
pub fn mcp_spec(server_id: &str, remote_name: &str) -> ToolSpec {
    let mut spec = builtin_spec(&toolgate::domain::names::mcp_registry_name(
        server_id,
        remote_name,
    ));
    spec.source = toolgate::domain::ToolSource::Mcp;
    spec.server_id = Some(server_id.to_owned());
    spec.target_kind = toolgate::domain::TargetKind::McpServer;
    spec.side_effect = SideEffectClass::ExternalWrite;
    spec.risk = RiskLevel::High;
    spec.idempotency = IdempotencyClass::NonIdempotent;
    spec.allow_parallel = false;
    spec
}

/// Wraps specs as tools.
pub fn tools(specs: impl IntoIterator<Item = ToolSpec>) -> Vec<Arc<dyn Tool>> {
    specs
        .into_iter()
        .map(|spec| Arc::new(SpecTool(spec)) as Arc<dyn Tool>)
        .collect()
}
