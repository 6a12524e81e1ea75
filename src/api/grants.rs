//! `/v1/grants`: each principal's `oauth2_user` grants, for operators: who,
//! which server, from which issuer, when granted and last used; never a
//! token. Ending one makes its principal consent again at the next call.

use hyper::StatusCode;
use serde_json::json;

use super::listen::Routed;
use super::{ApiError, ControlApi};
use crate::edge::{Reply, reply};
use crate::ports::{Revoked, StoreError};

/// The most grants one list answers.
const MAXIMUM_LISTED: usize = 1_000;

impl ControlApi {
    /// `GET /v1/grants?tenant_id=T`: the tenant's grants by principal and
    /// server, the first thousand.
    pub(super) async fn list_grants(&self, routed: Routed) -> Result<Reply, ApiError> {
        let tenant = routed.query.tenant()?;
        let grants = self.parts.grants.grants(&tenant).await?;
        let truncated = grants.len() > MAXIMUM_LISTED;
        let items: Vec<_> = grants
            .iter()
            .take(MAXIMUM_LISTED)
            .map(|grant| {
                json!({
                    "principal_id": grant.principal_id,
                    "server_id": grant.server_id,
                    "issuer": grant.issuer,
                    "scopes": grant.scopes,
                    "granted_at": grant.granted_at,
                    "last_used_at": grant.last_used_at,
                })
            })
            .collect();
        Ok(reply(
            StatusCode::OK,
            &json!({"tenant_id": tenant, "grants": items, "truncated": truncated}),
        ))
    }

    /// `DELETE /v1/grants/{server_id}?tenant_id=T&principal_id=P`: ends
    /// that principal's grant at that server.
    pub(super) async fn revoke_grant(
        &self,
        server_id: &str,
        routed: Routed,
    ) -> Result<Reply, ApiError> {
        let tenant = routed.query.tenant()?;
        let principal = routed
            .query
            .get("principal_id")
            .filter(|principal| !principal.is_empty())
            .ok_or_else(|| ApiError::Invalid("principal_id is required".into()))?;
        let upstream = match self
            .parts
            .revocation
            .end_grant(&tenant, principal, server_id)
            .await
        {
            Ok(Revoked::Ended { upstream }) => upstream,
            Ok(Revoked::NotHeld) => return Err(ApiError::NotFound),
            Err(error) => return Err(StoreError::Unavailable(error.to_string()).into()),
        };
        tracing::info!(tenant = %tenant, principal = %principal, server = %server_id, "grant revoked by an operator");
        Ok(reply(
            StatusCode::OK,
            &json!({"tenant_id": tenant, "principal_id": principal, "server_id": server_id,
                    "revoked": true, "revoked_upstream": upstream}),
        ))
    }
}
