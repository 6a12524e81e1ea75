//! PostgresStore: Approvals.

use super::*;

impl ApprovalStore for PostgresStore {
    fn approval<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
    ) -> BoxFuture<'a, Result<Option<ApprovalRecord>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let row = sqlx::query(concat!(
                "SELECT ",
                approval_columns!(),
                " FROM approvals WHERE id = $1 AND tenant_id = $2"
            ))
            .bind(id)
            .bind(tenant_id)
            .fetch_optional(tx.statements())
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            row.as_ref().map(approval).transpose()
        })
    }

    fn decide_approval<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        status: ApprovalStatus,
        approver: &'a str,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Option<ApprovalRecord>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let row = sqlx::query(concat!(
                "UPDATE approvals SET status = $3, approver = $4, decided_at = $5 \
                 WHERE id = $1 AND tenant_id = $2 AND status = 'pending' RETURNING ",
                approval_columns!()
            ))
            .bind(id)
            .bind(tenant_id)
            .bind(status.as_str())
            .bind(approver)
            .bind(now)
            .fetch_optional(tx.statements())
            .await
            .map_err(database_error)?;
            let decided = row.as_ref().map(approval).transpose()?;
            if let Some(decided) = &decided {
                let event = PlatformEvent::ApprovalDecided {
                    approval_id: decided.id,
                    invocation_id: decided.invocation_id,
                    status,
                    approver: approver.to_owned(),
                };
                insert_platform_event(&mut tx, Some(tenant_id), &event, now).await?;
            }
            tx.commit().await.map_err(database_error)?;
            Ok(decided)
        })
    }

    fn record_approval_hold<'a>(
        &'a self,
        tenant_id: &'a str,
        approval_id: Uuid,
        turn_id: Option<Uuid>,
        hold_ends_at: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let written = sqlx::query(
                "UPDATE approvals SET hold_ends_at = $3, turn_id = coalesce($4, turn_id) \
                 WHERE id = $1 AND tenant_id = $2 AND status = 'pending'",
            )
            .bind(approval_id)
            .bind(tenant_id)
            .bind(hold_ends_at)
            .bind(turn_id)
            .execute(tx.statements())
            .await
            .map_err(database_error)?
            .rows_affected();
            tx.commit().await.map_err(database_error)?;
            Ok(written == 1)
        })
    }
}
