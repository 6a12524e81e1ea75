//! PostgresStore as the store's driver: a plan runs in a
//! transaction of the pool, or as one statement on a hot connection; the
//! breaker's evidence is read and written in one transaction.

use sqlx::postgres::PgArguments;
use sqlx::query::Query;

use super::connections::Statements;
use super::*;
use crate::adapters::store::invocations::{Driver, Moved, Plan, Ran, Run, Statement, Value};
use crate::adapters::store::operator::Dialect;

/// `statement` with its values bound.
fn bound(statement: &Statement) -> Query<'_, Postgres, PgArguments> {
    statement
        .values
        .iter()
        .fold(sqlx::query(statement.sql), |query, value| match value {
            Value::Text(text) => query.bind(text.as_deref()),
            Value::Integer(number) => query.bind(*number),
            Value::Flag(flag) => query.bind(*flag),
            Value::Uuid(id) => query.bind(*id),
            Value::Time(at) => query.bind(*at),
            Value::Json(json) => query.bind(json.as_ref()),
            Value::Kinds(kinds) => query.bind(kinds.as_slice()),
            Value::Bodies(bodies) => query.bind(bodies.as_slice()),
        })
}

/// Runs a plan's first statement: how many rows it moved, and its rows.
async fn first(statements: Statements<'_>, plan: &Plan) -> Result<(u64, Vec<PgRow>), sqlx::Error> {
    let query = bound(&plan.first);
    Ok(match plan.moved {
        Moved::Count => (query.execute(statements).await?.rows_affected(), Vec::new()),
        Moved::Rows => {
            let rows = query.fetch_all(statements).await?;
            (rows.len() as u64, rows)
        }
        Moved::Flag => (
            u64::from(
                query
                    .fetch_one(statements)
                    .await?
                    .try_get::<bool, _>("moved")?,
            ),
            Vec::new(),
        ),
        Moved::Reread(_) => {
            return Err(sqlx::Error::Protocol(
                "a PostgreSQL write returns its row".into(),
            ));
        }
    })
}

impl Driver for PostgresStore {
    const DIALECT: Dialect = Dialect::Postgres;
    type Row = PgRow;

    fn run(&self, mut plan: Plan) -> BoxFuture<'_, Result<Ran<PgRow>, StoreError>> {
        Box::pin(async move {
            // A PostgreSQL write asks what guards it in its own statement.
            if plan.unless.is_some() {
                return Err(StoreError::Query(
                    "a PostgreSQL plan's write holds its own guard".into(),
                ));
            }
            if let Run::Hot(_) | Run::HotRead = plan.run {
                // One statement on a hot connection, its events in its values.
                if !plan.then.is_empty() || !plan.events.is_empty() || plan.row_events.is_some() {
                    return Err(StoreError::Query("a hot-path plan is one statement".into()));
                }
                let tenant_id = plan.tenant_id.as_deref().unwrap_or_default();
                let mut lease = self.hot.lease_for(tenant_id).await?;
                let result = first(lease.statements()?, &plan).await;
                let (count, rows) = lease.settle(result)?;
                return Ok(Ran {
                    count,
                    rows,
                    then: Vec::new(),
                });
            }
            let scope = match plan.tenant_id.as_deref() {
                Some(tenant_id) => Scope::Tenant(tenant_id),
                None => Scope::System,
            };
            let mut tx = self.begin(scope).await?;
            let (count, rows) = first(tx.statements(), &plan)
                .await
                .map_err(database_error)?;
            let mut then = Vec::new();
            if count > 0 || plan.always {
                for statement in &plan.then {
                    then.push(
                        bound(statement)
                            .fetch_all(tx.statements())
                            .await
                            .map_err(database_error)?,
                    );
                }
            }
            if count > 0
                && let Some((events, now)) = plan.take_events(&rows)?
            {
                append_events(&mut tx, plan.tenant_id.as_deref(), &events, now).await?;
            }
            tx.commit().await.map_err(database_error)?;
            Ok(Ran { count, rows, then })
        })
    }

    fn evidence<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
        tool_name: &'a str,
        arguments_hash: &'a str,
        evidence_key: &'a str,
        maximum_restarts: i32,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut tx = self.begin(Scope::Tenant(tenant_id)).await?;
            let successes: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM tool_invocations WHERE tenant_id = $1 AND run_id = $2 AND tool_name = $3 \
                 AND arguments_hash = $4 AND outcome_status = 'succeeded'",
            )
            .bind(tenant_id)
            .bind(run_id)
            .bind(tool_name)
            .bind(arguments_hash)
            .fetch_one(tx.statements())
            .await
            .map_err(database_error)?;
            let last: Option<(String, i64)> = sqlx::query_as(
                "SELECT evidence_key, base FROM breaker_evidence WHERE tenant_id = $1 AND run_id = $2 \
                 AND tool_name = $3 AND arguments_hash = $4 FOR UPDATE",
            )
            .bind(tenant_id)
            .bind(run_id)
            .bind(tool_name)
            .bind(arguments_hash)
            .fetch_optional(tx.statements())
            .await
            .map_err(database_error)?;
            let restarted = match last {
                None => {
                    sqlx::query(
                        "INSERT INTO breaker_evidence (tenant_id, run_id, tool_name, arguments_hash, evidence_key, base) \
                         VALUES ($1, $2, $3, $4, $5, 0)",
                    )
                    .bind(tenant_id)
                    .bind(run_id)
                    .bind(tool_name)
                    .bind(arguments_hash)
                    .bind(evidence_key)
                    .execute(tx.statements())
                    .await
                    .map_err(database_error)?;
                    false
                }
                Some((key, _)) if key == evidence_key => false,
                Some((_, base)) => {
                    // A restart must lower the count, and the run must have one left.
                    let lowers = successes - base > 1;
                    let granted = lowers
                        && sqlx::query(
                            "INSERT INTO breaker_runs (tenant_id, run_id, restarts) VALUES ($1, $2, 1) \
                             ON CONFLICT (run_id, tenant_id) DO UPDATE SET restarts = breaker_runs.restarts + 1 \
                             WHERE breaker_runs.restarts < $3",
                        )
                        .bind(tenant_id)
                        .bind(run_id)
                        .bind(maximum_restarts)
                        .execute(tx.statements())
                        .await
                        .map_err(database_error)?
                        .rows_affected()
                            == 1;
                    let new_base = if granted { successes - 1 } else { base };
                    sqlx::query(
                        "UPDATE breaker_evidence SET evidence_key = $5, base = $6 WHERE tenant_id = $1 AND run_id = $2 \
                         AND tool_name = $3 AND arguments_hash = $4",
                    )
                    .bind(tenant_id)
                    .bind(run_id)
                    .bind(tool_name)
                    .bind(arguments_hash)
                    .bind(evidence_key)
                    .bind(new_base)
                    .execute(tx.statements())
                    .await
                    .map_err(database_error)?;
                    granted
                }
            };
            tx.commit().await.map_err(database_error)?;
            Ok(restarted)
        })
    }
}
