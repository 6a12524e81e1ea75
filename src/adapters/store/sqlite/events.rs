//! SqliteStore: The events outbox.

use super::*;

impl EventStore for SqliteStore {
    fn record_event<'a>(
        &'a self,
        tenant_id: Option<&'a str>,
        event: &'a PlatformEvent,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin().await?;
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
            let rows = sqlx::query(
                "SELECT id, tenant_id, event_type, payload, created_at FROM events \
                 WHERE id > $1 AND ($3 IS NULL OR tenant_id = $3) ORDER BY id LIMIT $2",
            )
            .bind(after)
            .bind(limit)
            .bind(tenant_id)
            .fetch_all(&mut *self.reader().await?)
            .await
            .map_err(database_error)?;
            rows.iter()
                .map(|row| {
                    Ok(EventRecord {
                        id: get(row, "id")?,
                        tenant_id: get(row, "tenant_id")?,
                        event_type: get(row, "event_type")?,
                        payload: get(row, "payload")?,
                        created_at: time(row, "created_at")?,
                    })
                })
                .collect()
        })
    }
}
