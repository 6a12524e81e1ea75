//! PostgresStore: The events outbox.

use super::*;

impl EventStore for PostgresStore {
    fn record_event<'a>(
        &'a self,
        tenant_id: Option<&'a str>,
        event: &'a PlatformEvent,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let scope = match tenant_id {
                Some(tenant) => Scope::Tenant(tenant),
                None => Scope::System,
            };
            let mut tx = self.begin(scope).await?;
            insert_platform_event(&mut tx, tenant_id, event, now).await?;
            tx.commit().await.map_err(database_error)
        })
    }

    fn events_after<'a>(
        &'a self,
        after: i64,
        limit: i64,
        tenant_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<EventRecord>, StoreError>> {
        Box::pin(async move {
            // A tenant's reader is scoped by row-level security as well.
            let scope = tenant_id.map_or(Scope::System, Scope::Tenant);
            let mut tx = self.begin(scope).await?;
            let rows = sqlx::query(
                "SELECT id, tenant_id, event_type, payload, created_at FROM events \
                 WHERE id > $1 AND ($3::text IS NULL OR tenant_id = $3) \
                 AND txid < pg_snapshot_xmin(pg_current_snapshot()) ORDER BY id LIMIT $2",
            )
            .bind(after)
            .bind(limit)
            .bind(tenant_id)
            .fetch_all(tx.statements())
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            rows.iter().map(event_record).collect()
        })
    }
}
