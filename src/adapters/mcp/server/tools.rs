//! The `Tool`s the pipeline calls: a server's tools and its resource read.

use std::sync::Weak;

use serde_json::Value;

use super::McpServer;
use crate::adapters::mcp::catalog::RemoteTool;
use crate::adapters::mcp::render::unreachable;
use crate::domain::{ReasonCode, ToolResult, ToolSpec};
use crate::ports::{BoxFuture, Tool, ToolExecutionContext};

/// A remote tool, as the pipeline calls it.
pub(super) struct McpTool {
    pub(super) spec: ToolSpec,
    pub(super) remote_name: String,
    /// The declaration pinned at discovery.
    pub(super) declaration: Option<RemoteTool>,
    pub(super) server: Weak<McpServer>,
}

impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn execute<'a>(
        &'a self,
        arguments: Value,
        context: ToolExecutionContext,
    ) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            match self.server.upgrade() {
                Some(server) => {
                    server
                        .call(
                            &self.spec,
                            &self.remote_name,
                            self.declaration.as_ref(),
                            arguments,
                            &context,
                        )
                        .await
                }
                None => unreachable(ReasonCode::ToolServerUnreachable),
            }
        })
    }

    fn consent_needed<'a>(
        &'a self,
        tenant_id: &'a str,
        principal_id: &'a str,
    ) -> BoxFuture<'a, Option<String>> {
        consent_needed(&self.server, tenant_id, principal_id)
    }
}

/// `mcp.{server_id}.read_resource`.
pub(super) struct ReadResourceTool {
    pub(super) spec: ToolSpec,
    pub(super) server: Weak<McpServer>,
}

impl Tool for ReadResourceTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn execute<'a>(
        &'a self,
        arguments: Value,
        context: ToolExecutionContext,
    ) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            let uri = arguments
                .get("uri")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            match self.server.upgrade() {
                Some(server) => server.read_resource(&uri, &context).await,
                None => unreachable(ReasonCode::ToolServerUnreachable),
            }
        })
    }

    fn consent_needed<'a>(
        &'a self,
        tenant_id: &'a str,
        principal_id: &'a str,
    ) -> BoxFuture<'a, Option<String>> {
        consent_needed(&self.server, tenant_id, principal_id)
    }
}

/// Whether the tool's server asks `principal_id` of `tenant_id` for consent
/// first (see [`McpServer::consent_needed`]).
fn consent_needed<'a>(
    server: &'a Weak<McpServer>,
    tenant_id: &'a str,
    principal_id: &'a str,
) -> BoxFuture<'a, Option<String>> {
    Box::pin(async move {
        let server = server.upgrade()?;
        server.consent_needed(tenant_id, principal_id).await
    })
}
