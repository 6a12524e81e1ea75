//! SqliteStore: Recorded sessions.

use super::*;

impl SessionStore for SqliteStore {
    fn open_session<'a>(
        &'a self,
        session: &'a SessionRecord,
    ) -> BoxFuture<'a, Result<SessionRecord, StoreError>> {
        let session = session.clone();
        Box::pin(async move {
            let principal = serde_json::to_string(&session.principal)
                .map_err(|e| StoreError::Decode(e.to_string()))?;
            let agent = serde_json::to_string(&session.agent)
                .map_err(|e| StoreError::Decode(e.to_string()))?;
            let tool_names = serde_json::to_string(&session.tool_names)
                .map_err(|e| StoreError::Decode(e.to_string()))?;
            self.flushed(move |connection| {
                query(
                    "INSERT INTO sessions (session_id, tenant_id, principal, agent, tool_schema_sha256, \
                     tool_contract_sha256, opened_at, last_used_at, tool_names) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
                     ON CONFLICT (session_id) DO NOTHING",
                )
                .bind(session.session_id.to_string())
                .bind(&session.tenant_id)
                .bind(principal)
                .bind(agent)
                .bind(&session.tool_schema_sha256)
                .bind(&session.tool_contract_sha256)
                .bind(micros(session.opened_at))
                .bind(micros(session.last_used_at))
                .bind(tool_names)
                .execute(connection)?;
                session_row(
                    &query(SESSION_BY_ID)
                        .bind(session.session_id.to_string())
                        .fetch_one(connection)?,
                )
            })
            .await
        })
    }

    fn session(
        &self,
        session_id: Uuid,
    ) -> BoxFuture<'_, Result<Option<SessionRecord>, StoreError>> {
        Box::pin(async move {
            self.read(|connection| {
                query(SESSION_BY_ID)
                    .bind(session_id.to_string())
                    .fetch_optional(connection)?
                    .map(|row| session_row(&row))
                    .transpose()
            })
        })
    }

    fn touch_session(
        &self,
        session_id: Uuid,
        now: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            // A use's time, refreshed at most hourly: nothing recovery reads.
            self.relaxed(|connection| {
                query(
                    "UPDATE sessions SET last_used_at = $2 WHERE session_id = $1 AND last_used_at < $2",
                )
                .bind(session_id.to_string())
                .bind(micros(now))
                .execute(connection)
                .map(|_| ())
            })
        })
    }

    fn end_session<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: Uuid,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let tenant_id = tenant_id.to_owned();
        Box::pin(async move {
            self.flushed(move |connection| {
                let deleted =
                    query("DELETE FROM sessions WHERE session_id = $1 AND tenant_id = $2")
                        .bind(session_id.to_string())
                        .bind(tenant_id)
                        .execute(connection)?;
                Ok(deleted == 1)
            })
            .await
        })
    }

    fn forget_sessions(&self, before: DateTime<Utc>) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            self.flushed(move |connection| {
                let deleted = query("DELETE FROM sessions WHERE last_used_at < $1")
                    .bind(micros(before))
                    .execute(connection)?;
                Ok(u64::try_from(deleted).unwrap_or(u64::MAX))
            })
            .await
        })
    }
}

impl ConsoleSignInStore for SqliteStore {
    fn sign_in<'a>(
        &'a self,
        sign_in: &'a ConsoleSignIn,
        maximum: usize,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let sign_in = sign_in.clone();
        let keep = i64::try_from(maximum.saturating_sub(1)).unwrap_or(i64::MAX);
        Box::pin(async move {
            self.flushed(move |connection| {
                query(
                    "DELETE FROM console_sign_ins WHERE expires_at <= $1 OR cookie_sha256 IN (\
                     SELECT cookie_sha256 FROM console_sign_ins WHERE expires_at > $1 \
                     ORDER BY expires_at DESC LIMIT -1 OFFSET $2)",
                )
                .bind(micros(sign_in.signed_in_at))
                .bind(keep)
                .execute(connection)?;
                query(
                    "INSERT INTO console_sign_ins (cookie_sha256, operator, signed_in_at, expires_at) \
                     VALUES ($1, $2, $3, $4)",
                )
                .bind(&sign_in.cookie_sha256)
                .bind(&sign_in.operator)
                .bind(micros(sign_in.signed_in_at))
                .bind(micros(sign_in.expires_at))
                .execute(connection)?;
                Ok(())
            })
            .await
        })
    }

    fn signed_in<'a>(
        &'a self,
        cookie_sha256: &'a str,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Option<ConsoleSignIn>, StoreError>> {
        Box::pin(async move {
            self.read(|connection| {
                query(
                    "SELECT cookie_sha256, operator, signed_in_at, expires_at FROM console_sign_ins \
                     WHERE cookie_sha256 = $1 AND expires_at > $2",
                )
                .bind(cookie_sha256)
                .bind(micros(now))
                .fetch_optional(connection)?
                .map(|row| console_sign_in(&row))
                .transpose()
            })
        })
    }

    fn sign_out<'a>(&'a self, cookie_sha256: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        let cookie_sha256 = cookie_sha256.to_owned();
        Box::pin(async move {
            self.flushed(move |connection| {
                query("DELETE FROM console_sign_ins WHERE cookie_sha256 = $1")
                    .bind(cookie_sha256)
                    .execute(connection)?;
                Ok(())
            })
            .await
        })
    }
}
