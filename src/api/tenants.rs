//! `/v1/tenants/{tenant}/mcp-servers/{server_id}`: tenant HTTP servers, onto
//! the tenant-servers service (validated when written).

use hyper::StatusCode;
use serde_json::json;

use super::listen::Routed;
use super::wire::{PutMcpServer, server_view};
use super::{ApiError, ControlApi};
use crate::edge::{Reply, reply};
use crate::pipeline::tenant_servers::{ServerAuthSpec, TenantServerSpec};

impl ControlApi {
    pub(super) async fn put_server(
        &self,
        tenant: &str,
        server_id: &str,
        routed: Routed,
    ) -> Result<Reply, ApiError> {
        let body: PutMcpServer = self.body(routed.request).await?;
        let spec = TenantServerSpec {
            endpoint: body.endpoint,
            auth: body.auth.map(|auth| ServerAuthSpec {
                scheme: auth.scheme,
                name: auth.name,
                credential_ref: auth.credential_ref,
                token_endpoint: auth.token_endpoint,
                token_scopes: auth.token_scopes,
            }),
            side_effect: body.side_effect,
            risk: body.risk,
            idempotency: body.idempotency,
            required_scopes: body.required_scopes,
            timeout_seconds: body.timeout_seconds,
            maximum_output_bytes: body.maximum_output_bytes,
            enabled: body.enabled,
        };
        let row = self
            .parts
            .tenant_servers
            .put(tenant, server_id, spec)
            .await?;
        Ok(reply(StatusCode::OK, &server_view(&row)))
    }

    pub(super) async fn get_server(
        &self,
        tenant: &str,
        server_id: &str,
    ) -> Result<Reply, ApiError> {
        let row = self
            .parts
            .tenant_servers
            .get(tenant, server_id)
            .await?
            .ok_or(ApiError::NotFound)?;
        Ok(reply(StatusCode::OK, &server_view(&row)))
    }

    pub(super) async fn delete_server(
        &self,
        tenant: &str,
        server_id: &str,
    ) -> Result<Reply, ApiError> {
        if !self.parts.tenant_servers.delete(tenant, server_id).await? {
            return Err(ApiError::NotFound);
        }
        Ok(reply(
            StatusCode::OK,
            &json!({"server_id": server_id, "deleted": true}),
        ))
    }
}
