//! SqliteStore: Approvals.

use super::*;

impl ApprovalStore for SqliteStore {
    fn approval<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
    ) -> BoxFuture<'a, Result<Option<ApprovalRecord>, StoreError>> {
        Box::pin(async move {
            self.read(|connection| {
                query(concat!(
                    "SELECT ",
                    approval_columns!(),
                    " FROM approvals WHERE id = $1 AND tenant_id = $2"
                ))
                .bind(id.to_string())
                .bind(tenant_id)
                .fetch_optional(connection)?
                .as_ref()
                .map(approval)
                .transpose()
            })
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
        let (tenant_id, approver) = (tenant_id.to_owned(), approver.to_owned());
        Box::pin(async move {
            self.flushed(move |connection| {
                let decided = query(concat!(
                    "UPDATE approvals SET status = $3, approver = $4, decided_at = $5 \
                     WHERE id = $1 AND tenant_id = $2 AND status = 'pending' RETURNING ",
                    approval_columns!()
                ))
                .bind(id.to_string())
                .bind(&tenant_id)
                .bind(status.as_str())
                .bind(&approver)
                .bind(micros(now))
                .fetch_optional(connection)?
                .as_ref()
                .map(approval)
                .transpose()?;
                if let Some(decided) = &decided {
                    let event = PlatformEvent::ApprovalDecided {
                        approval_id: decided.id,
                        invocation_id: decided.invocation_id,
                        status,
                        approver,
                    };
                    insert_platform_event(connection, Some(&tenant_id), &event, now)?;
                }
                Ok(decided)
            })
            .await
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
            self.relaxed(|connection| {
                let written = query(
                    "UPDATE approvals SET hold_ends_at = $3, turn_id = coalesce($4, turn_id) \
                     WHERE id = $1 AND tenant_id = $2 AND status = 'pending'",
                )
                .bind(approval_id.to_string())
                .bind(tenant_id)
                .bind(micros(hold_ends_at))
                .bind(turn_id.map(|turn| turn.to_string()))
                .execute(connection)?;
                Ok(written == 1)
            })
        })
    }
}
