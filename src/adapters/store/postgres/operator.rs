//! PostgresStore: The operator's lists (system scope: they span tenants)
//! and the turns the bridge records.

use super::*;
use crate::adapters::store::operator::{
    Dialect, approval_item, approvals_sql, connection_outcome, failures_sql, generation_item,
    generations_sql, health_sql, invocation_events_sql, invocation_sql, invocations_sql,
    review_item, review_items_sql, servers_sql, sessions_sql, turn_record, turns_sql,
};
use crate::domain::TurnState;
use crate::ports::{
    ApprovalItem, CatalogGenerationItem, Cursor, InvocationStory, OperatorFilter, OperatorStore,
    Page, PageRequest, ReviewItem, ServerItem, ToolHealth, TurnRecord, TurnStore,
};

use std::sync::LazyLock;

// Rendered once: the texts are fixed for the process.
static INVOCATIONS_SQL: LazyLock<String> =
    LazyLock::new(|| invocations_sql(Dialect::Postgres, invocation_columns!()));
static INVOCATION_SQL: LazyLock<String> =
    LazyLock::new(|| invocation_sql(Dialect::Postgres, invocation_columns!()));
static INVOCATION_EVENTS_SQL: LazyLock<String> =
    LazyLock::new(|| invocation_events_sql(Dialect::Postgres));
static APPROVALS_SQL: LazyLock<String> = LazyLock::new(|| approvals_sql(Dialect::Postgres));
static REVIEW_ITEMS_SQL: LazyLock<String> =
    LazyLock::new(|| review_items_sql(Dialect::Postgres, invocation_columns!()));
static SESSIONS_SQL: LazyLock<String> =
    LazyLock::new(|| sessions_sql(Dialect::Postgres, session_columns!()));
static TURNS_SQL: LazyLock<String> = LazyLock::new(|| turns_sql(Dialect::Postgres));
static SERVERS_SQL: LazyLock<String> = LazyLock::new(|| servers_sql(Dialect::Postgres));
static GENERATIONS_SQL: LazyLock<String> = LazyLock::new(|| generations_sql(Dialect::Postgres));
static HEALTH_SQL: LazyLock<String> = LazyLock::new(|| health_sql(Dialect::Postgres));
static FAILURES_SQL: LazyLock<String> = LazyLock::new(|| failures_sql(Dialect::Postgres));

impl PostgresStore {
    /// One page of a list: `sql` bound with the filter and the page in the
    /// order every list takes them, each row decoded by `decode`.
    async fn page<T>(
        &self,
        sql: &'static str,
        filter: &OperatorFilter,
        page: PageRequest,
        decode: impl Fn(&PgRow) -> Result<T, StoreError>,
        key: impl Fn(&T) -> Cursor,
    ) -> Result<Page<T>, StoreError> {
        let mut tx = self.begin(Scope::System).await?;
        let rows = sqlx::query(sql)
            .bind(filter.tenant_id.as_deref())
            .bind(filter.tool_name.as_deref())
            .bind(filter.status.as_deref())
            .bind(filter.since)
            .bind(filter.until)
            .bind(page.after.map(|cursor| cursor.at))
            .bind(page.after.map(|cursor| cursor.key))
            .bind(page.fetch())
            .bind(filter.session_id)
            .fetch_all(tx.statements())
            .await
            .map_err(database_error)?;
        tx.commit().await.map_err(database_error)?;
        let items = rows.iter().map(decode).collect::<Result<Vec<T>, _>>()?;
        Ok(page.page(items, key))
    }
}

impl OperatorStore for PostgresStore {
    fn list_invocations<'a>(
        &'a self,
        filter: &'a OperatorFilter,
        page: PageRequest,
    ) -> BoxFuture<'a, Result<Page<InvocationRecord>, StoreError>> {
        Box::pin(async move {
            let sql = &*INVOCATIONS_SQL;
            self.page(sql, filter, page, invocation, |row| Cursor {
                at: row.created_at,
                key: row.identity.id,
            })
            .await
        })
    }

    fn invocation_with_events(
        &self,
        id: Uuid,
    ) -> BoxFuture<'_, Result<Option<InvocationStory>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::System).await?;
            let row = sqlx::query(INVOCATION_SQL.as_str())
                .bind(id)
                .fetch_optional(tx.statements())
                .await
                .map_err(database_error)?;
            let Some(row) = row else {
                tx.commit().await.map_err(database_error)?;
                return Ok(None);
            };
            let events = sqlx::query(INVOCATION_EVENTS_SQL.as_str())
                .bind(id.to_string())
                .fetch_all(tx.statements())
                .await
                .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            let events = events
                .iter()
                .map(event_record)
                .collect::<Result<Vec<_>, StoreError>>()?;
            Ok(Some(InvocationStory {
                invocation: invocation(&row)?,
                events,
            }))
        })
    }

    fn list_approvals<'a>(
        &'a self,
        filter: &'a OperatorFilter,
        page: PageRequest,
    ) -> BoxFuture<'a, Result<Page<ApprovalItem>, StoreError>> {
        Box::pin(async move {
            let sql = &*APPROVALS_SQL;
            self.page(sql, filter, page, approval_item, |item| Cursor {
                at: item.requested_at,
                key: item.approval_id,
            })
            .await
        })
    }

    fn list_review_items<'a>(
        &'a self,
        filter: &'a OperatorFilter,
        page: PageRequest,
    ) -> BoxFuture<'a, Result<Page<ReviewItem>, StoreError>> {
        Box::pin(async move {
            let sql = &*REVIEW_ITEMS_SQL;
            self.page(sql, filter, page, review_item, |item| Cursor {
                // An UNCERTAIN row has ended: its completion is its key.
                at: item
                    .invocation
                    .ended()
                    .map_or(item.invocation.created_at, |ended| ended.completed_at),
                key: item.invocation.identity.id,
            })
            .await
        })
    }

    fn list_sessions<'a>(
        &'a self,
        filter: &'a OperatorFilter,
        page: PageRequest,
    ) -> BoxFuture<'a, Result<Page<SessionRecord>, StoreError>> {
        Box::pin(async move {
            let sql = &*SESSIONS_SQL;
            self.page(sql, filter, page, session_row, |session| Cursor {
                at: session.opened_at,
                key: session.session_id,
            })
            .await
        })
    }

    fn list_turns<'a>(
        &'a self,
        filter: &'a OperatorFilter,
        page: PageRequest,
    ) -> BoxFuture<'a, Result<Page<TurnRecord>, StoreError>> {
        Box::pin(async move {
            let sql = &*TURNS_SQL;
            self.page(sql, filter, page, turn_record, |turn| Cursor {
                at: turn.opened_at,
                key: turn.turn_id,
            })
            .await
        })
    }

    fn list_servers<'a>(
        &'a self,
        filter: &'a OperatorFilter,
        page: PageRequest,
    ) -> BoxFuture<'a, Result<Page<ServerItem>, StoreError>> {
        Box::pin(async move {
            let sql = &*SERVERS_SQL;
            let decode = |row: &PgRow| {
                Ok(ServerItem {
                    id: get(row, "id")?,
                    tenant_id: get(row, "tenant_id")?,
                    tenant_configured: get(row, "tenant_configured")?,
                    server: catalog::server_row(row)?,
                    created_at: get(row, "created_at")?,
                    last_connection: connection_outcome(row)?,
                })
            };
            self.page(sql, filter, page, decode, |server| Cursor {
                at: server.created_at,
                key: server.id,
            })
            .await
        })
    }

    fn list_catalog_generations<'a>(
        &'a self,
        filter: &'a OperatorFilter,
        page: PageRequest,
    ) -> BoxFuture<'a, Result<Page<CatalogGenerationItem>, StoreError>> {
        Box::pin(async move {
            let sql = &*GENERATIONS_SQL;
            self.page(sql, filter, page, generation_item, |generation| Cursor {
                at: generation.discovered_at,
                key: generation.id,
            })
            .await
        })
    }

    fn tool_health<'a>(
        &'a self,
        filter: &'a OperatorFilter,
        since: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Vec<ToolHealth>, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::System).await?;
            let bind = |sql: &'static str| {
                sqlx::query(sql)
                    .bind(filter.tenant_id.clone())
                    .bind(filter.tool_name.clone())
                    .bind(since)
            };
            let rows = bind(&HEALTH_SQL)
                .fetch_all(tx.statements())
                .await
                .map_err(database_error)?;
            let failed = bind(&FAILURES_SQL)
                .fetch_all(tx.statements())
                .await
                .map_err(database_error)?;
            tx.commit().await.map_err(database_error)?;
            tool_health(&rows, &failed)
        })
    }
}

impl TurnStore for PostgresStore {
    fn record_turn<'a>(&'a self, turn: &'a TurnRecord) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(&turn.tenant_id)).await?;
            sqlx::query(
                "INSERT INTO turns (turn_id, tenant_id, session_id, run_id, step_number, script_sha256, \
                 state, calls, opened_at, expires_at, closed_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            )
            .bind(turn.turn_id)
            .bind(&turn.tenant_id)
            .bind(turn.session_id)
            .bind(turn.run_id)
            .bind(turn.step_number)
            .bind(&turn.script_sha256)
            .bind(turn.state.as_str())
            .bind(turn.calls)
            .bind(turn.opened_at)
            .bind(turn.expires_at)
            .bind(turn.closed_at)
            .execute(tx.statements())
            .await
            .map_err(database_error)?;
            tx.commit().await.map_err(database_error)
        })
    }

    fn close_turn<'a>(
        &'a self,
        tenant_id: &'a str,
        turn_id: Uuid,
        state: TurnState,
        calls: i64,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let closed = sqlx::query(
                "UPDATE turns SET state = $3, calls = $4, closed_at = $5 \
                 WHERE turn_id = $1 AND tenant_id = $2 AND state = 'open'",
            )
            .bind(turn_id)
            .bind(tenant_id)
            .bind(state.as_str())
            .bind(calls)
            .bind(now)
            .execute(tx.statements())
            .await
            .map_err(database_error)?
            .rows_affected();
            tx.commit().await.map_err(database_error)?;
            Ok(closed == 1)
        })
    }

    fn expire_abandoned_turns(
        &self,
        before: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::System).await?;
            let expired = sqlx::query(
                "UPDATE turns SET state = 'expired', closed_at = expires_at \
                 WHERE state = 'open' AND expires_at < $1",
            )
            .bind(before)
            .execute(tx.statements())
            .await
            .map_err(database_error)?
            .rows_affected();
            tx.commit().await.map_err(database_error)?;
            Ok(expired)
        })
    }
}
