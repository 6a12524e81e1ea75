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
            .execute(tx.statements())
            .await
            .map_err(database_error)?;
            let row = sqlx::query(concat!(
                "SELECT ",
                session_columns!(),
                " FROM sessions WHERE session_id = $1"
            ))
            .bind(session.session_id)
            .fetch_one(tx.statements())
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
            .fetch_optional(tx.statements())
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
            .execute(tx.statements())
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
                    .execute(tx.statements())
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
                .execute(tx.statements())
                .await
                .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            Ok(deleted.rows_affected())
        })
    }
}

impl ConsoleSignInStore for PostgresStore {
    fn sign_in<'a>(
        &'a self,
        sign_in: &'a ConsoleSignIn,
        maximum: usize,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let keep = i64::try_from(maximum.saturating_sub(1)).unwrap_or(i64::MAX);
            let mut tx = self.begin(Scope::System).await?;
            sqlx::query(
                "DELETE FROM console_sign_ins WHERE expires_at <= $1 OR cookie_sha256 IN (\
                 SELECT cookie_sha256 FROM console_sign_ins WHERE expires_at > $1 \
                 ORDER BY expires_at DESC OFFSET $2)",
            )
            .bind(sign_in.signed_in_at)
            .bind(keep)
            .execute(tx.statements())
            .await
            .map_err(database_error)?;
            sqlx::query(
                "INSERT INTO console_sign_ins (cookie_sha256, operator, signed_in_at, expires_at) \
                 VALUES ($1, $2, $3, $4)",
            )
            .bind(&sign_in.cookie_sha256)
            .bind(&sign_in.operator)
            .bind(sign_in.signed_in_at)
            .bind(sign_in.expires_at)
            .execute(tx.statements())
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)
        })
    }

    fn signed_in<'a>(
        &'a self,
        cookie_sha256: &'a str,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Option<ConsoleSignIn>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::System).await?;
            let row = sqlx::query(
                "SELECT cookie_sha256, operator, signed_in_at, expires_at FROM console_sign_ins \
                 WHERE cookie_sha256 = $1 AND expires_at > $2",
            )
            .bind(cookie_sha256)
            .bind(now)
            .fetch_optional(tx.statements())
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            row.as_ref().map(console_sign_in).transpose()
        })
    }

    fn sign_out<'a>(&'a self, cookie_sha256: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::System).await?;
            sqlx::query("DELETE FROM console_sign_ins WHERE cookie_sha256 = $1")
                .bind(cookie_sha256)
                .execute(tx.statements())
                .await
                .map_err(database_error)?;
            tx.commit().await.map_err(database_error)
        })
    }
}
