//! SqliteStore as the store's driver: a plan runs on a reader,
//! the group writer or the relaxed connection, as it says; the
//! breaker's evidence is read and written in one transaction.

use super::*;
use crate::adapters::store::invocations::{Driver, Moved, Plan, Ran, Run, Value};
use crate::adapters::store::operator::Dialect;

/// Runs `plan` on `connection`, inside the transaction it is given.
fn execute(connection: &Connection, mut plan: Plan) -> Result<Ran<Row>, StoreError> {
    let guarded = match plan.unless.take() {
        Some(unless) => !bound(unless.values, unless.sql)
            .fetch_all(connection)?
            .is_empty(),
        None => false,
    };
    let (count, rows) = if guarded {
        (0, Vec::new())
    } else {
        first(connection, &mut plan)?
    };
    let mut then = Vec::new();
    if count > 0 || plan.always {
        for statement in std::mem::take(&mut plan.then) {
            then.push(bound(statement.values, statement.sql).fetch_all(connection)?);
        }
    }
    if count > 0
        && let Some((events, now)) = plan.take_events(&rows)?
    {
        append_events(connection, plan.tenant_id.as_deref(), &events, now)?;
    }
    Ok(Ran { count, rows, then })
}

/// Runs `plan`'s first statement: how many rows it moved, and its rows.
fn first(connection: &Connection, plan: &mut Plan) -> Result<(u64, Vec<Row>), StoreError> {
    let key: Vec<Value> = match plan.moved {
        Moved::Reread(_) => plan.first.values.iter().take(2).cloned().collect(),
        _ => Vec::new(),
    };
    let first = bound(std::mem::take(&mut plan.first.values), plan.first.sql);
    Ok(match plan.moved {
        Moved::Count => (first.execute(connection)? as u64, Vec::new()),
        Moved::Reread(reread) => {
            let count = first.execute(connection)? as u64;
            let rows = if count > 0 {
                bound(key, reread).fetch_all(connection)?
            } else {
                Vec::new()
            };
            (count, rows)
        }
        Moved::Rows => {
            let rows = first.fetch_all(connection)?;
            (rows.len() as u64, rows)
        }
        Moved::Flag => (
            u64::from(get::<bool>(&first.fetch_one(connection)?, "moved")?),
            Vec::new(),
        ),
    })
}

/// `sql` with `values` bound, moved rather than copied: the plan is the
/// driver's.
fn bound(values: Vec<Value>, sql: &'static str) -> db::Query<'static> {
    values
        .into_iter()
        .fold(query(sql), |query, value| query.bind(value))
}

impl Driver for SqliteStore {
    const DIALECT: Dialect = Dialect::Sqlite;
    type Row = Row;

    fn run(&self, plan: Plan) -> BoxFuture<'_, Result<Ran<Row>, StoreError>> {
        Box::pin(async move {
            match plan.run {
                Run::Read | Run::HotRead => self.read(|connection| execute(connection, plan)),
                Run::Flushed => {
                    self.flushed(move |connection| execute(connection, plan))
                        .await
                }
                Run::Relaxed => self.relaxed(|connection| execute(connection, plan)),
                Run::Hot(durability) => {
                    self.write(durability, move |connection| execute(connection, plan))
                        .await
                }
            }
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
        let (tenant_id, run_id, tool_name, arguments_hash, evidence_key) = (
            tenant_id.to_owned(),
            run_id.to_string(),
            tool_name.to_owned(),
            arguments_hash.to_owned(),
            evidence_key.to_owned(),
        );
        Box::pin(async move {
            self.flushed(move |connection| {
                let successes: i64 = get(
                    &query(
                        "SELECT count(*) AS n FROM tool_invocations WHERE tenant_id = $1 AND run_id = $2 \
                         AND tool_name = $3 AND arguments_hash = $4 AND outcome_status = 'succeeded'",
                    )
                    .bind(&tenant_id)
                    .bind(&run_id)
                    .bind(&tool_name)
                    .bind(&arguments_hash)
                    .fetch_one(connection)?,
                    "n",
                )?;
                let last = query(
                    "SELECT evidence_key, base FROM breaker_evidence WHERE tenant_id = $1 AND run_id = $2 \
                     AND tool_name = $3 AND arguments_hash = $4",
                )
                .bind(&tenant_id)
                .bind(&run_id)
                .bind(&tool_name)
                .bind(&arguments_hash)
                .fetch_optional(connection)?
                .map(|row| Ok((get::<String>(&row, "evidence_key")?, get::<i64>(&row, "base")?)))
                .transpose()?;
                let restarted = match last {
                    None => {
                        query(
                            "INSERT INTO breaker_evidence (tenant_id, run_id, tool_name, arguments_hash, evidence_key, base) \
                             VALUES ($1, $2, $3, $4, $5, 0)",
                        )
                        .bind(&tenant_id)
                        .bind(&run_id)
                        .bind(&tool_name)
                        .bind(&arguments_hash)
                        .bind(&evidence_key)
                        .execute(connection)?;
                        false
                    }
                    Some((key, _)) if key == evidence_key => false,
                    Some((_, base)) => {
                        // A restart must lower the count, and the run must
                        // have one left.
                        let lowers = successes - base > 1;
                        let granted = lowers
                            && query(
                                "INSERT INTO breaker_runs (tenant_id, run_id, restarts) VALUES ($1, $2, 1) \
                                 ON CONFLICT (run_id, tenant_id) DO UPDATE SET restarts = breaker_runs.restarts + 1 \
                                 WHERE breaker_runs.restarts < $3",
                            )
                            .bind(&tenant_id)
                            .bind(&run_id)
                            .bind(maximum_restarts)
                            .execute(connection)?
                                == 1;
                        let new_base = if granted { successes - 1 } else { base };
                        query(
                            "UPDATE breaker_evidence SET evidence_key = $5, base = $6 WHERE tenant_id = $1 \
                             AND run_id = $2 AND tool_name = $3 AND arguments_hash = $4",
                        )
                        .bind(&tenant_id)
                        .bind(&run_id)
                        .bind(&tool_name)
                        .bind(&arguments_hash)
                        .bind(&evidence_key)
                        .bind(new_base)
                        .execute(connection)?;
                        granted
                    }
                };
                Ok(restarted)
            })
            .await
        })
    }
}
