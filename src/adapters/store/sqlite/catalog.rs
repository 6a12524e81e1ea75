//! SqliteStore: MCP server rows and the catalog history.

use super::*;

impl CatalogStore for SqliteStore {
    fn record_preparation<'a>(
        &'a self,
        tenant_id: &'a str,
        record: &'a PreparationRecord,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        let (tenant_id, record) = (tenant_id.to_owned(), record.clone());
        Box::pin(async move {
            self.flushed(move |connection| {
                for server in &record.servers {
                    upsert_server(connection, &tenant_id, server, false, now)?;
                }
                let mut written = Vec::with_capacity(record.generations.len());
                for generation in &record.generations {
                    written.push(write_generation(connection, &tenant_id, generation, now)?);
                }
                let events = Events::platforms(&record.events);
                append_events(connection, Some(&tenant_id), &events, now)?;
                Ok(written)
            })
            .await
        })
    }

    fn catalog_history<'a>(
        &'a self,
        tenant_id: &'a str,
        server_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<CatalogRow>, StoreError>> {
        Box::pin(async move {
            let rows = self.read(|connection| {
                query(
                    "SELECT catalog_hash, remote_name, registry_name, input_schema, discovered_at, withdrawn_at \
                     FROM mcp_tool_catalog WHERE tenant_id = $1 AND server_id = $2 ORDER BY discovered_at, remote_name",
                )
                .bind(tenant_id)
                .bind(server_id)
                .fetch_all(connection)
            })?;
            rows.iter().map(catalog_row).collect()
        })
    }

    fn put_mcp_server<'a>(
        &'a self,
        tenant_id: &'a str,
        server: &'a McpServerRow,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let (tenant_id, server) = (tenant_id.to_owned(), server.clone());
        Box::pin(async move {
            self.flushed(move |connection| {
                upsert_server(connection, &tenant_id, &server, true, now)
            })
            .await
        })
    }

    fn mcp_server<'a>(
        &'a self,
        tenant_id: &'a str,
        server_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<McpServerRow>, StoreError>> {
        Box::pin(async move {
            self.read(|connection| {
                query(
                    "SELECT server_id, transport, endpoint, auth_scheme, auth_name, credential_ref, token_endpoint, \
                     token_scopes, side_effect, risk, idempotency, required_scopes, timeout_seconds, \
                     maximum_output_bytes, enabled FROM mcp_servers WHERE tenant_id = $1 AND server_id = $2 \
                     AND tenant_configured",
                )
                .bind(tenant_id)
                .bind(server_id)
                .fetch_optional(connection)?
                .map(|row| server_row(&row))
                .transpose()
            })
        })
    }

    fn tenant_mcp_servers<'a>(
        &'a self,
        tenant_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<McpServerRow>, StoreError>> {
        Box::pin(async move {
            self.read(|connection| {
                query(
                    "SELECT server_id, transport, endpoint, auth_scheme, auth_name, credential_ref, token_endpoint, \
                     token_scopes, side_effect, risk, idempotency, required_scopes, timeout_seconds, \
                     maximum_output_bytes, enabled FROM mcp_servers WHERE tenant_id = $1 AND tenant_configured \
                     ORDER BY server_id",
                )
                .bind(tenant_id)
                .fetch_all(connection)?
                .iter()
                .map(server_row)
                .collect()
            })
        })
    }

    fn delete_mcp_server<'a>(
        &'a self,
        tenant_id: &'a str,
        server_id: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let (tenant_id, server_id) = (tenant_id.to_owned(), server_id.to_owned());
        Box::pin(async move {
            self.flushed(move |connection| {
                let deleted = query(
                    "DELETE FROM mcp_servers WHERE tenant_id = $1 AND server_id = $2 AND tenant_configured",
                )
                .bind(tenant_id)
                .bind(server_id)
                .execute(connection)?;
                Ok(deleted == 1)
            })
            .await
        })
    }
}

/// Writes one catalog generation unless its hash is already written for the
/// server; earlier names it lacks get `withdrawn_at`. Nothing is updated in
/// place otherwise.
fn write_generation(
    connection: &Connection,
    tenant_id: &str,
    generation: &CatalogGeneration,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let written = query(
        "SELECT 1 FROM mcp_tool_catalog WHERE tenant_id = $1 AND server_id = $2 AND catalog_hash = $3 LIMIT 1",
    )
    .bind(tenant_id)
    .bind(&generation.server_id)
    .bind(&generation.catalog_hash)
    .fetch_optional(connection)?;
    if written.is_some() {
        return Ok(false);
    }
    for entry in &generation.entries {
        query(
            "INSERT INTO mcp_tool_catalog (id, tenant_id, server_id, catalog_hash, remote_name, registry_name, \
             input_schema, discovered_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(Uuid::new_v4().to_string())
        .bind(tenant_id)
        .bind(&generation.server_id)
        .bind(&generation.catalog_hash)
        .bind(&entry.remote_name)
        .bind(&entry.registry_name)
        .bind(text(&entry.input_schema))
        .bind(micros(now))
        .execute(connection)?;
    }
    // Names an earlier generation had and this one lacks are withdrawn.
    let current: Vec<&str> = generation
        .entries
        .iter()
        .map(|entry| entry.remote_name.as_str())
        .collect();
    let earlier = query(
        "SELECT id, remote_name FROM mcp_tool_catalog \
         WHERE tenant_id = $1 AND server_id = $2 AND catalog_hash <> $3 AND withdrawn_at IS NULL",
    )
    .bind(tenant_id)
    .bind(&generation.server_id)
    .bind(&generation.catalog_hash)
    .fetch_all(connection)?;
    for row in earlier {
        let remote_name: String = get(&row, "remote_name")?;
        if !current.contains(&remote_name.as_str()) {
            query("UPDATE mcp_tool_catalog SET withdrawn_at = $1 WHERE id = $2")
                .bind(micros(now))
                .bind(get::<String>(&row, "id")?)
                .execute(connection)?;
        }
    }
    prune_history(connection, tenant_id, &generation.server_id)?;
    Ok(true)
}

/// The generations of a server's history kept: the newest ones, and any
/// an UNCERTAIN call (whose review needs the tool as it was) or a call not
/// yet ended (waiting, authorized or running) ran.
pub const KEPT_GENERATIONS: i64 = 32;

/// Drops the generations of a server older than the newest
/// [`KEPT_GENERATIONS`] that no UNCERTAIN or unended call ran: a catalog
/// that churns keeps a bounded history.
fn prune_history(
    connection: &Connection,
    tenant_id: &str,
    server_id: &str,
) -> Result<(), StoreError> {
    query(
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
    .execute(connection)?;
    Ok(())
}

/// Inserts or replaces a server row, by (tenant, server id). A row the
/// tenant wrote is never replaced by an operator server's (one the operator
/// later gave the same id): the tenant's stays as it wrote it.
fn upsert_server(
    connection: &Connection,
    tenant_id: &str,
    server: &McpServerRow,
    tenant_configured: bool,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    query(
        "INSERT INTO mcp_servers (id, tenant_id, server_id, transport, endpoint, auth_scheme, auth_name, \
         credential_ref, token_endpoint, token_scopes, side_effect, risk, idempotency, required_scopes, \
         timeout_seconds, maximum_output_bytes, enabled, created_at, tenant_configured) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19) \
         ON CONFLICT (tenant_id, server_id) DO UPDATE SET transport = excluded.transport, \
         endpoint = excluded.endpoint, auth_scheme = excluded.auth_scheme, auth_name = excluded.auth_name, \
         credential_ref = excluded.credential_ref, token_endpoint = excluded.token_endpoint, \
         token_scopes = excluded.token_scopes, side_effect = excluded.side_effect, risk = excluded.risk, \
         idempotency = excluded.idempotency, required_scopes = excluded.required_scopes, \
         timeout_seconds = excluded.timeout_seconds, maximum_output_bytes = excluded.maximum_output_bytes, \
         enabled = excluded.enabled, tenant_configured = excluded.tenant_configured \
         WHERE NOT mcp_servers.tenant_configured OR excluded.tenant_configured",
    )
    .bind(Uuid::new_v4().to_string())
    .bind(tenant_id)
    .bind(&server.server_id)
    .bind(server.transport.as_str())
    .bind(&server.endpoint)
    .bind(server.auth_scheme.as_str())
    .bind(&server.auth_name)
    .bind(&server.credential_ref)
    .bind(&server.token_endpoint)
    .bind(
        server
            .token_scopes
            .as_ref()
            .map(|scopes| text(&serde_json::json!(scopes))),
    )
    .bind(server.side_effect.as_str())
    .bind(server.risk.as_str())
    .bind(server.idempotency.as_str())
    .bind(text(&serde_json::json!(server.required_scopes)))
    .bind(i64::from(server.timeout_seconds))
    .bind(i64::try_from(server.maximum_output_bytes).unwrap_or(i64::MAX))
    .bind(server.enabled)
    .bind(micros(now))
    .bind(tenant_configured)
    .execute(connection)?;
    Ok(())
}
