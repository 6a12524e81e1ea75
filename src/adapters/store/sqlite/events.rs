//! SqliteStore: The events outbox.

use super::*;

impl EventStore for SqliteStore {
    fn record_event<'a>(
        &'a self,
        tenant_id: Option<&'a str>,
        event: &'a PlatformEvent,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let (tenant_id, event) = (tenant_id.map(str::to_owned), event.clone());
        Box::pin(async move {
            self.flushed(move |connection| {
                insert_platform_event(connection, tenant_id.as_deref(), &event, now)
            })
            .await
        })
    }

    fn events_after<'a>(
        &'a self,
        after: i64,
        limit: i64,
        tenant_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<EventRecord>, StoreError>> {
        Box::pin(async move {
            self.read(|connection| {
                query(
                    "SELECT id, tenant_id, event_type, payload, created_at FROM events \
                     WHERE id > $1 AND ($3 IS NULL OR tenant_id = $3) ORDER BY id LIMIT $2",
                )
                .bind(after)
                .bind(limit)
                .bind(tenant_id)
                .fetch_all(connection)?
                .iter()
                .map(event_record)
                .collect()
            })
        })
    }
}
