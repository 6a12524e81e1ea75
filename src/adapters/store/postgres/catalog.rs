//! PostgresStore: MCP server rows and the catalog history.

use super::*;

impl CatalogStore for PostgresStore {
    fn record_preparation<'a>(
        &'a self,
        tenant_id: &'a str,
        record: &'a PreparationRecord,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            for server in &record.servers {
                upsert_server(&mut tx, tenant_id, server, false, now).await?;
            }
            let mut written = Vec::with_capacity(record.generations.len());
            for generation in &record.generations {
                written.push(write_generation(&mut tx, tenant_id, generation, now).await?);
            }
            let events = Events::platforms(&record.events);
            append_events(&mut tx, Some(tenant_id), &events, now).await?;
            tx.commit().await.map_err(database_error)?;
            Ok(written)
        })
    }

    fn catalog_history<'a>(
        &'a self,
        tenant_id: &'a str,
        server_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<CatalogRow>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let rows = sqlx::query(
                "SELECT catalog_hash, remote_name, registry_name, input_schema, discovered_at, withdrawn_at \
                 FROM mcp_tool_catalog WHERE tenant_id = $1 AND server_id = $2 ORDER BY discovered_at, remote_name",
            )
            .bind(tenant_id)
            .bind(server_id)
            .fetch_all(tx.statements())
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            rows.iter().map(catalog_row).collect()
        })
    }

    fn put_mcp_server<'a>(
        &'a self,
        tenant_id: &'a str,
        server: &'a McpServerRow,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            upsert_server(&mut tx, tenant_id, server, true, now).await?;
            tx.commit().await.map_err(database_error)
        })
    }

    fn mcp_server<'a>(
        &'a self,
        tenant_id: &'a str,
        server_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<McpServerRow>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let row = sqlx::query(
                "SELECT server_id, transport, endpoint, auth_scheme, auth_name, credential_ref, token_endpoint, \
                 token_scopes, side_effect, risk, idempotency, required_scopes, timeout_seconds, \
                 maximum_output_bytes, enabled FROM mcp_servers WHERE tenant_id = $1 AND server_id = $2 \
                 AND tenant_configured",
            )
            .bind(tenant_id)
            .bind(server_id)
            .fetch_optional(tx.statements())
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            row.map(|row| server_row(&row)).transpose()
        })
    }

    fn tenant_mcp_servers<'a>(
        &'a self,
        tenant_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<McpServerRow>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let rows = sqlx::query(
                "SELECT server_id, transport, endpoint, auth_scheme, auth_name, credential_ref, token_endpoint, \
                 token_scopes, side_effect, risk, idempotency, required_scopes, timeout_seconds, \
                 maximum_output_bytes, enabled FROM mcp_servers WHERE tenant_id = $1 AND tenant_configured \
                 ORDER BY server_id",
            )
            .bind(tenant_id)
            .fetch_all(tx.statements())
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            rows.iter().map(server_row).collect()
        })
    }

    fn delete_mcp_server<'a>(
        &'a self,
        tenant_id: &'a str,
        server_id: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let deleted =
                sqlx::query("DELETE FROM mcp_servers WHERE tenant_id = $1 AND server_id = $2 AND tenant_configured")
                    .bind(tenant_id)
                    .bind(server_id)
                    .execute(tx.statements())
                    .await
                    .map_err(database_error)?
                    .rows_affected();
            tx.commit().await.map_err(database_error)?;
            Ok(deleted == 1)
        })
    }
}

/// Writes one catalog generation unless its hash is already written for the
/// server; earlier names it lacks get `withdrawn_at`. Nothing is updated in
/// place otherwise.
async fn write_generation(
    tx: &mut super::Scoped,
    tenant_id: &str,
    generation: &CatalogGeneration,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let written: Option<i64> = sqlx::query_scalar(
        "SELECT 1::bigint FROM mcp_tool_catalog WHERE tenant_id = $1 AND server_id = $2 AND catalog_hash = $3 LIMIT 1",
    )
    .bind(tenant_id)
    .bind(&generation.server_id)
    .bind(&generation.catalog_hash)
    .fetch_optional(tx.statements())
    .await
    .map_err(database_error)?;
    if written.is_some() {
        return Ok(false);
    }
    for entry in &generation.entries {
        sqlx::query(
            "INSERT INTO mcp_tool_catalog (id, tenant_id, server_id, catalog_hash, remote_name, registry_name, \
             input_schema, discovered_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(Uuid::new_v4())
        .bind(tenant_id)
        .bind(&generation.server_id)
        .bind(&generation.catalog_hash)
        .bind(&entry.remote_name)
        .bind(&entry.registry_name)
        .bind(&entry.input_schema)
        .bind(now)
        .execute(tx.statements())
        .await
        .map_err(database_error)?;
    }
    // Names an earlier generation had and this one lacks are withdrawn.
    let current: Vec<&str> = generation
        .entries
        .iter()
        .map(|entry| entry.remote_name.as_str())
        .collect();
    let earlier: Vec<(String, String)> = sqlx::query_as(
        "SELECT CAST(id AS TEXT), remote_name FROM mcp_tool_catalog \
         WHERE tenant_id = $1 AND server_id = $2 AND catalog_hash <> $3 AND withdrawn_at IS NULL",
    )
    .bind(tenant_id)
    .bind(&generation.server_id)
    .bind(&generation.catalog_hash)
    .fetch_all(tx.statements())
    .await
    .map_err(database_error)?;
    for (id, remote_name) in earlier {
        if !current.contains(&remote_name.as_str()) {
            sqlx::query(
                "UPDATE mcp_tool_catalog SET withdrawn_at = $1 WHERE CAST(id AS TEXT) = $2",
            )
            .bind(now)
            .bind(id)
            .execute(tx.statements())
            .await
            .map_err(database_error)?;
        }
    }
    prune_history(tx, tenant_id, &generation.server_id).await?;
    Ok(true)
}

/// The generations of a server's history kept: the newest ones, and any
/// an UNCERTAIN call (whose review needs the tool as it was) or a call not
/// yet ended (waiting, authorized or running) ran.
pub const KEPT_GENERATIONS: i64 = 32;

/// Drops the generations of a server older than the newest
/// [`KEPT_GENERATIONS`] that no UNCERTAIN or unended call ran: a catalog
/// that churns keeps a bounded history.
async fn prune_history(
    tx: &mut super::Scoped,
    tenant_id: &str,
    server_id: &str,
) -> Result<(), StoreError> {
    sqlx::query(
        "DELETE FROM mcp_tool_catalog WHERE tenant_id = $1 AND server_id = $2 \
         AND catalog_hash NOT IN (SELECT catalog_hash FROM mcp_tool_catalog \
             WHERE tenant_id = $1 AND server_id = $2 GROUP BY catalog_hash \
             ORDER BY max(discovered_at) DESC LIMIT $3) \
         AND catalog_hash NOT IN (SELECT tool_version FROM tool_invocations \
             WHERE tenant_id = $1 AND server_id = $2 AND (outcome_status = 'uncertain' \
                 OR status IN ('waiting_for_approval', 'authorized', 'running')))",
    )
    .bind(tenant_id)
    .bind(server_id)
    .bind(KEPT_GENERATIONS)
    .execute(tx.statements())
    .await
    .map_err(database_error)?;
    Ok(())
}

/// Inserts or replaces a server row, by (tenant, server id). A row the
/// tenant wrote is never replaced by an operator server's (one the operator
/// later gave the same id): the tenant's stays as it wrote it.
async fn upsert_server(
    tx: &mut super::Scoped,
    tenant_id: &str,
    server: &McpServerRow,
    tenant_configured: bool,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO mcp_servers (id, tenant_id, server_id, transport, endpoint, auth_scheme, auth_name, \
         credential_ref, token_endpoint, token_scopes, side_effect, risk, idempotency, required_scopes, \
         timeout_seconds, maximum_output_bytes, enabled, created_at, tenant_configured) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19) \
         ON CONFLICT (tenant_id, server_id) DO UPDATE SET transport = EXCLUDED.transport, \
         endpoint = EXCLUDED.endpoint, auth_scheme = EXCLUDED.auth_scheme, auth_name = EXCLUDED.auth_name, \
         credential_ref = EXCLUDED.credential_ref, token_endpoint = EXCLUDED.token_endpoint, \
         token_scopes = EXCLUDED.token_scopes, side_effect = EXCLUDED.side_effect, risk = EXCLUDED.risk, \
         idempotency = EXCLUDED.idempotency, required_scopes = EXCLUDED.required_scopes, \
         timeout_seconds = EXCLUDED.timeout_seconds, maximum_output_bytes = EXCLUDED.maximum_output_bytes, \
         enabled = EXCLUDED.enabled, tenant_configured = EXCLUDED.tenant_configured \
         WHERE NOT mcp_servers.tenant_configured OR EXCLUDED.tenant_configured",
    )
    .bind(Uuid::new_v4())
    .bind(tenant_id)
    .bind(&server.server_id)
    .bind(server.transport.as_str())
    .bind(&server.endpoint)
    .bind(server.auth_scheme.as_str())
    .bind(&server.auth_name)
    .bind(&server.credential_ref)
    .bind(&server.token_endpoint)
    .bind(server.token_scopes.as_ref().map(|scopes| serde_json::json!(scopes)))
    .bind(server.side_effect.as_str())
    .bind(server.risk.as_str())
    .bind(server.idempotency.as_str())
    .bind(serde_json::json!(server.required_scopes))
    .bind(i32::try_from(server.timeout_seconds).unwrap_or(i32::MAX))
    .bind(i64::try_from(server.maximum_output_bytes).unwrap_or(i64::MAX))
    .bind(server.enabled)
    .bind(now)
    .bind(tenant_configured)
    .execute(tx.statements())
    .await
    .map_err(database_error)?;
    Ok(())
}
