//! PostgresStore: Recorded sessions.

use super::*;

impl SessionStore for PostgresStore {
    fn open_session<'a>(
        &'a self,
        session: &'a SessionRecord,
    ) -> BoxFuture<'a, Result<SessionRecord, StoreError>> {
        Box::pin(async move {
            let principal = serde_json::to_value(&session.principal)
                .map_err(|e| StoreError::Decode(e.to_string()))?;
            let agent = serde_json::to_value(&session.agent)
                .map_err(|e| StoreError::Decode(e.to_string()))?;
            let tool_names = serde_json::to_value(&session.tool_names)
                .map_err(|e| StoreError::Decode(e.to_string()))?;
            // The system scope: an id another tenant holds must be seen to be
            // refused, not inserted beside it.
            let mut tx = self.begin(Scope::System).await?;
            sqlx::query(
                "INSERT INTO sessions (session_id, tenant_id, principal, agent, tool_schema_sha256, \
                 tool_contract_sha256, opened_at, last_used_at, tool_names) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
                 ON CONFLICT (session_id) DO NOTHING",
            )
            .bind(session.session_id)
            .bind(&session.tenant_id)
            .bind(principal)
            .bind(agent)
            .bind(&session.tool_schema_sha256)
            .bind(&session.tool_contract_sha256)
            .bind(session.opened_at)
            .bind(session.last_used_at)
            .bind(tool_names)
            .execute(&mut *tx)
            .await
            .map_err(database_error)?;
            let row = sqlx::query(concat!(
                "SELECT ",
                session_columns!(),
                " FROM sessions WHERE session_id = $1"
            ))
            .bind(session.session_id)
            .fetch_one(&mut *tx)
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            session_row(&row)
        })
    }

    fn session(
        &self,
        session_id: Uuid,
    ) -> BoxFuture<'_, Result<Option<SessionRecord>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::System).await?;
            let row = sqlx::query(concat!(
                "SELECT ",
                session_columns!(),
                " FROM sessions WHERE session_id = $1"
            ))
            .bind(session_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            row.map(|row| session_row(&row)).transpose()
        })
    }

    fn touch_session(
        &self,
        session_id: Uuid,
        now: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::System).await?;
            sqlx::query(
                "UPDATE sessions SET last_used_at = $2 WHERE session_id = $1 AND last_used_at < $2",
            )
            .bind(session_id)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)
        })
    }

    fn end_session<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: Uuid,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let deleted =
                sqlx::query("DELETE FROM sessions WHERE session_id = $1 AND tenant_id = $2")
                    .bind(session_id)
                    .bind(tenant_id)
                    .execute(&mut *tx)
                    .await
                    .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            Ok(deleted.rows_affected() == 1)
        })
    }

    fn forget_sessions(&self, before: DateTime<Utc>) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::System).await?;
            let deleted = sqlx::query("DELETE FROM sessions WHERE last_used_at < $1")
                .bind(before)
                .execute(&mut *tx)
                .await
                .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            Ok(deleted.rows_affected())
        })
    }
}
