//! PostgresStore: The review queue and its resolutions.

use super::*;

impl ReviewStore for PostgresStore {
    fn queue_depths(&self) -> BoxFuture<'_, Result<QueueDepths, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::System).await?;
            let row = sqlx::query(
                "SELECT (SELECT count(*) FROM tool_invocations i WHERE i.outcome_status = 'uncertain' \
                 AND NOT EXISTS (SELECT 1 FROM review_resolutions r WHERE r.tenant_id = i.tenant_id \
                 AND r.invocation_id = i.id)) AS uncertain, \
                 (SELECT count(*) FROM approvals WHERE status = 'pending') AS pending",
            )
            .fetch_one(tx.statements())
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            Ok(QueueDepths {
                unresolved_uncertain: get(&row, "uncertain")?,
                pending_approvals: get(&row, "pending")?,
            })
        })
    }

    fn resolve_review<'a>(
        &'a self,
        tenant_id: &'a str,
        review: &'a ReviewRecord,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let written = sqlx::query(
                "INSERT INTO review_resolutions (id, tenant_id, invocation_id, resolution, resolver, note, resolved_at) \
                 SELECT $1, $2, $3, $4, $5, $6, $7 WHERE EXISTS (SELECT 1 FROM tool_invocations \
                 WHERE tenant_id = $2 AND id = $3 AND outcome_status = 'uncertain') \
                 ON CONFLICT (invocation_id) DO NOTHING",
            )
            .bind(Uuid::new_v4())
            .bind(tenant_id)
            .bind(review.invocation_id)
            .bind(review.resolution.as_str())
            .bind(&review.resolver)
            .bind(&review.note)
            .bind(review.resolved_at)
            .execute(tx.statements())
            .await
            .map_err(database_error)?
            .rows_affected();
            if written == 1 {
                let event = PlatformEvent::ReviewResolved {
                    invocation_id: review.invocation_id,
                    resolution: review.resolution,
                    resolver: review.resolver.clone(),
                };
                insert_platform_event(&mut tx, Some(tenant_id), &event, review.resolved_at).await?;
            }
            tx.commit().await.map_err(database_error)?;
            Ok(written == 1)
        })
    }
}
