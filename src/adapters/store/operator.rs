//! The operator's lists for both backends: one SQL text per list, written
//! for PostgreSQL and rendered for SQLite (casts dropped, JSON fields read
//! with `json_extract`), and one decoder per item over [`Columns`].
//!
//! Every list binds the same parameters in the same order, so a filter is
//! bound once, here, for both drivers: `$1` tenant, `$2` tool (or server id), `$3` status,
//! `$4` since, `$5` until, `$6` the cursor's time, `$7` its key, `$8` the
//! rows to fetch, `$9` the session. A `NULL` parameter filters nothing.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::invocations::{Driver, Moved, Plan, Rendered, Run, Value};
use super::parse;
use super::rows::{Columns, event_record, invocation, server_row, session_row, tool_health};
use crate::domain::TurnState;
use crate::ports::{
    ApprovalItem, BoxFuture, CatalogGenerationItem, ConnectionOutcome, Cursor, InvocationRecord,
    InvocationStory, OperatorFilter, OperatorStore, Page, PageRequest, ReviewItem, ReviewRecord,
    ServerItem, SessionRecord, StoreError, ToolHealth, TurnRecord, TurnStore,
};

/// Which SQL a text is rendered for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dialect {
    Postgres,
    Sqlite,
}

impl Dialect {
    /// `column->>'key'`, as the dialect reads a JSON field as text (the
    /// SQLite spelling is the one its expression indexes name).
    fn field(self, column: &str, key: &str) -> String {
        match self {
            Dialect::Postgres => format!("{column}->>'{key}'"),
            Dialect::Sqlite => format!("json_extract({column}, '$.{key}')"),
        }
    }

    /// The text as the dialect runs it: SQLite has no casts to drop types
    /// by, and its ids are text already.
    fn render(self, sql: &str) -> String {
        match self {
            Dialect::Postgres => sql.to_owned(),
            Dialect::Sqlite => sql
                .replace("::timestamptz", "")
                .replace("::text", "")
                .replace("::uuid", ""),
        }
    }
}

/// The columns a list's filters are over: its tenant, tool, status and
/// session (`None` where the list has none: the parameter is still
/// referenced, so every list binds the same nine), its time column and its
/// (time, id) cursor's key.
struct Filtered<'a> {
    tenant: &'a str,
    tool: Option<&'a str>,
    status: Option<&'a str>,
    session: Option<&'a str>,
    time: &'a str,
    id: &'a str,
}

/// The shared conditions over a list's [`Filtered`] columns.
fn conditions(columns: Filtered<'_>) -> String {
    let Filtered {
        tenant,
        tool,
        status,
        session,
        time,
        id,
    } = columns;
    let optional = |parameter: &str, column: Option<&str>, kind: &str| match column {
        Some(column) => format!("({parameter}::{kind} IS NULL OR {column} = {parameter}::{kind})"),
        None => format!("({parameter}::{kind} IS NULL OR TRUE)"),
    };
    format!(
        "($1::text IS NULL OR {tenant} = $1) AND {} AND {} AND {} \
         AND ($4::timestamptz IS NULL OR {time} >= $4) AND ($5::timestamptz IS NULL OR {time} < $5) \
         AND ($6::timestamptz IS NULL OR ({time}, {id}) < ($6, $7::uuid))",
        optional("$2", tool, "text"),
        optional("$3", status, "text"),
        optional("$9", session, "uuid"),
    )
}

/// `columns` with each name qualified by `alias`.
fn qualified(columns: &str, alias: &str) -> String {
    columns
        .split(',')
        .map(|column| format!("{alias}.{}", column.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Invocation rows, newest first.
pub(super) fn invocations_sql(dialect: Dialect, columns: &str) -> String {
    dialect.render(&format!(
        "SELECT {columns} FROM tool_invocations WHERE {} \
         ORDER BY created_at DESC, id DESC LIMIT $8",
        conditions(Filtered {
            tenant: "tenant_id",
            tool: Some("tool_name"),
            status: Some("status"),
            session: Some("session_id"),
            time: "created_at",
            id: "id",
        })
    ))
}

/// One invocation row, whichever tenant's.
pub(super) fn invocation_sql(dialect: Dialect, columns: &str) -> String {
    dialect.render(&format!(
        "SELECT {columns} FROM tool_invocations WHERE id = $1"
    ))
}

/// The events that name an invocation, in id order (`$1` its id as text).
pub(super) fn invocation_events_sql(dialect: Dialect) -> String {
    // PostgreSQL's index of them is partial, and the planner takes it only
    // for a query that names its predicate: without it, every event is read.
    let indexed = match dialect {
        Dialect::Postgres => " AND payload ? 'invocation_id'",
        Dialect::Sqlite => "",
    };
    format!(
        "SELECT id, tenant_id, event_type, payload, created_at FROM events WHERE {} = $1{indexed} \
         ORDER BY id",
        dialect.field("payload", "invocation_id")
    )
}

/// Approvals with their held calls, newest first.
pub(super) fn approvals_sql(dialect: Dialect) -> String {
    dialect.render(&format!(
        "SELECT a.id AS approval_id, a.tenant_id, a.invocation_id, a.tool_name, a.reason_code, \
         a.status, a.approver, a.requested_at, a.decided_at, a.hold_ends_at, a.turn_id, \
         i.arguments, i.side_effect, i.idempotency_class, i.origin_trust, i.principal, \
         i.session_id, i.run_id, i.step_number, i.call_id \
         FROM approvals a JOIN tool_invocations i ON i.id = a.invocation_id AND i.tenant_id = a.tenant_id \
         WHERE {} ORDER BY a.requested_at DESC, a.id DESC LIMIT $8",
        conditions(Filtered {
            tenant: "a.tenant_id",
            tool: Some("a.tool_name"),
            status: Some("a.status"),
            session: Some("i.session_id"),
            time: "a.requested_at",
            id: "a.id",
        })
    ))
}

/// UNCERTAIN invocations with their resolutions, newest first; `$3` is
/// `pending` or `resolved`.
pub(super) fn review_items_sql(dialect: Dialect, columns: &str) -> String {
    dialect.render(&format!(
        "SELECT {}, r.resolution, r.resolver, r.note, r.resolved_at \
         FROM tool_invocations i LEFT JOIN review_resolutions r \
         ON r.tenant_id = i.tenant_id AND r.invocation_id = i.id \
         WHERE i.outcome_status = 'uncertain' AND {} \
         AND ($3 IS NULL OR ($3 = 'pending' AND r.invocation_id IS NULL) \
              OR ($3 = 'resolved' AND r.invocation_id IS NOT NULL)) \
         ORDER BY i.completed_at DESC, i.id DESC LIMIT $8",
        qualified(columns, "i"),
        conditions(Filtered {
            tenant: "i.tenant_id",
            tool: Some("i.tool_name"),
            status: None,
            session: Some("i.session_id"),
            time: "i.completed_at",
            id: "i.id",
        })
    ))
}

/// Sessions, newest first; no tool or status applies.
pub(super) fn sessions_sql(dialect: Dialect, columns: &str) -> String {
    dialect.render(&format!(
        "SELECT {columns} FROM sessions WHERE {} ORDER BY opened_at DESC, session_id DESC LIMIT $8",
        conditions(Filtered {
            tenant: "tenant_id",
            tool: None,
            status: None,
            session: Some("session_id"),
            time: "opened_at",
            id: "session_id",
        })
    ))
}

/// Turns, newest first; status is the state.
pub(super) fn turns_sql(dialect: Dialect) -> String {
    dialect.render(&format!(
        "SELECT turn_id, tenant_id, session_id, run_id, step_number, script_sha256, state, calls, \
         opened_at, expires_at, closed_at FROM turns WHERE {} \
         ORDER BY opened_at DESC, turn_id DESC LIMIT $8",
        conditions(Filtered {
            tenant: "tenant_id",
            tool: None,
            status: Some("state"),
            session: Some("session_id"),
            time: "opened_at",
            id: "turn_id",
        })
    ))
}

/// Server rows with their latest connection event, newest first; the tool
/// filter is the server id, and no status applies.
pub(super) fn servers_sql(dialect: Dialect) -> String {
    let server = dialect.field("e.payload", "server");
    // SQLite's planner would rather walk the whole table back from its
    // newest row for `max(e.id)`; it is told the index, whose condition
    // the query states in the same words (its 0030 says why they differ).
    let connection_events = match dialect {
        Dialect::Postgres => {
            "events e WHERE e.event_type IN ('mcp.server.connected', 'mcp.server.pinned', \
             'mcp.server.disconnected')"
        }
        Dialect::Sqlite => {
            "events e INDEXED BY events_by_server WHERE (e.event_type = 'mcp.server.connected' \
             OR e.event_type = 'mcp.server.pinned' OR e.event_type = 'mcp.server.disconnected')"
        }
    };
    dialect.render(&format!(
        "SELECT s.*, last.event_type AS last_event_type, \
         {} AS last_reason_code, last.created_at AS last_event_at FROM \
         (SELECT id, tenant_id, tenant_configured, created_at, server_id, transport, endpoint, \
          auth_scheme, auth_name, credential_ref, token_endpoint, token_scopes, side_effect, risk, \
          idempotency, required_scopes, timeout_seconds, maximum_output_bytes, enabled, \
          (SELECT max(e.id) FROM {connection_events} \
           AND {server} = mcp_servers.server_id \
           AND (e.tenant_id = mcp_servers.tenant_id OR e.tenant_id IS NULL)) AS last_event_id \
          FROM mcp_servers WHERE {} ORDER BY created_at DESC, id DESC LIMIT $8) s \
         LEFT JOIN events last ON last.id = s.last_event_id \
         ORDER BY s.created_at DESC, s.id DESC",
        dialect.field("last.payload", "reason_code"),
        conditions(Filtered {
            tenant: "tenant_id",
            tool: Some("server_id"),
            status: None,
            session: None,
            time: "created_at",
            id: "id",
        })
    ))
}

/// Catalog generations, newest first, each keyed by its first row's id;
/// the tool filter is the server id, and no status applies.
pub(super) fn generations_sql(dialect: Dialect) -> String {
    let aggregate = match dialect {
        Dialect::Postgres => "json_agg",
        Dialect::Sqlite => "json_group_array",
    };
    dialect.render(&format!(
        "SELECT min(id::text)::uuid AS id, tenant_id, server_id, catalog_hash, \
         min(discovered_at) AS discovered_at, {aggregate}(registry_name) AS tools, \
         coalesce({aggregate}(registry_name) FILTER (WHERE withdrawn_at IS NOT NULL), '[]') AS withdrawn \
         FROM mcp_tool_catalog WHERE ($1::text IS NULL OR tenant_id = $1) \
         AND ($2::text IS NULL OR server_id = $2) AND ($3::text IS NULL OR TRUE) \
         AND ($9::uuid IS NULL OR TRUE) \
         GROUP BY tenant_id, server_id, catalog_hash \
         HAVING ($4::timestamptz IS NULL OR min(discovered_at) >= $4) \
         AND ($5::timestamptz IS NULL OR min(discovered_at) < $5) \
         AND ($6::timestamptz IS NULL OR (min(discovered_at), min(id::text)::uuid) < ($6, $7::uuid)) \
         ORDER BY min(discovered_at) DESC, min(id::text) DESC LIMIT $8"
    ))
}

/// Per tool, the failed calls that ended at or after `$3`, by reason code
/// (`$1` tenant, `$2` tool).
pub(super) fn failures_sql(dialect: Dialect) -> String {
    dialect.render(
        "SELECT tool_name, coalesce(reason_code, outcome_status) AS reason_code, count(*) AS failures \
         FROM tool_invocations WHERE completed_at >= $3 AND outcome_status <> 'succeeded' \
         AND ($1::text IS NULL OR tenant_id = $1) AND ($2::text IS NULL OR tool_name = $2) \
         GROUP BY tool_name, coalesce(reason_code, outcome_status) ORDER BY tool_name, reason_code",
    )
}

/// Per tool, calls that ended at or after `$3`, the UNCERTAIN ones, and
/// the discrete p50 and p99 of start-to-end milliseconds: the smallest
/// latency whose share of calls at or below it reaches the fraction.
pub(super) fn health_sql(dialect: Dialect) -> String {
    match dialect {
        Dialect::Postgres => "SELECT tool_name, count(*) AS calls, \
             count(*) FILTER (WHERE outcome_status = 'uncertain') AS uncertain, \
             percentile_disc(0.5) WITHIN GROUP \
               (ORDER BY (extract(epoch FROM completed_at - started_at) * 1000)::float8) AS p50_ms, \
             percentile_disc(0.99) WITHIN GROUP \
               (ORDER BY (extract(epoch FROM completed_at - started_at) * 1000)::float8) AS p99_ms \
             FROM tool_invocations WHERE completed_at >= $3 \
             AND ($1::text IS NULL OR tenant_id = $1) AND ($2::text IS NULL OR tool_name = $2) \
             GROUP BY tool_name ORDER BY tool_name"
            .to_owned(),
        // SQLite has no percentile_disc: the same value is the one ranked
        // ceil(fraction × n) among the tool's n latencies (nulls skipped,
        // as percentile_disc skips them).
        Dialect::Sqlite => "WITH ended AS (SELECT tool_name, outcome_status, \
               (completed_at - started_at) / 1000.0 AS latency_ms FROM tool_invocations \
               WHERE completed_at >= $3 AND ($1 IS NULL OR tenant_id = $1) \
               AND ($2 IS NULL OR tool_name = $2)), \
             ranked AS (SELECT tool_name, latency_ms, \
               row_number() OVER (PARTITION BY tool_name ORDER BY latency_ms) AS n, \
               count(*) OVER (PARTITION BY tool_name) AS total \
               FROM ended WHERE latency_ms IS NOT NULL) \
             SELECT e.tool_name, count(*) AS calls, \
             sum(e.outcome_status = 'uncertain') AS uncertain, \
             (SELECT r.latency_ms FROM ranked r WHERE r.tool_name = e.tool_name \
               AND r.n = (r.total * 50 + 99) / 100) AS p50_ms, \
             (SELECT r.latency_ms FROM ranked r WHERE r.tool_name = e.tool_name \
               AND r.n = (r.total * 99 + 99) / 100) AS p99_ms \
             FROM ended e GROUP BY e.tool_name ORDER BY e.tool_name"
            .to_owned(),
    }
}

fn decode<T: serde::de::DeserializeOwned>(
    value: serde_json::Value,
    column: &str,
) -> Result<T, StoreError> {
    serde_json::from_value(value).map_err(|e| StoreError::Decode(format!("{column}: {e}")))
}

/// A row of [`approvals_sql`].
pub(super) fn approval_item(row: &impl Columns) -> Result<ApprovalItem, StoreError> {
    Ok(ApprovalItem {
        approval_id: row.uuid("approval_id")?,
        tenant_id: row.text("tenant_id")?,
        invocation_id: row.uuid("invocation_id")?,
        tool_name: row.text("tool_name")?,
        arguments: row.json("arguments")?,
        side_effect: parse(&row.text("side_effect")?, "side_effect")?,
        idempotency_class: parse(&row.text("idempotency_class")?, "idempotency_class")?,
        origin_trust: parse(&row.text("origin_trust")?, "origin_trust")?,
        reason_code: parse(&row.text("reason_code")?, "reason_code")?,
        principal: decode(row.json("principal")?, "principal")?,
        session_id: row.uuid("session_id")?,
        run_id: row.uuid("run_id")?,
        step_number: row.integer("step_number")?,
        call_id: row.text("call_id")?,
        turn_id: row.optional_uuid("turn_id")?,
        status: parse(&row.text("status")?, "status")?,
        requested_at: row.time("requested_at")?,
        hold_ends_at: row.optional_time("hold_ends_at")?,
        approver: row.optional_text("approver")?,
        decided_at: row.optional_time("decided_at")?,
    })
}

/// A row of [`review_items_sql`].
pub(super) fn review_item(row: &impl Columns) -> Result<ReviewItem, StoreError> {
    let invocation = invocation(row)?;
    let resolution = match row.optional_text("resolution")? {
        None => None,
        Some(resolution) => Some(ReviewRecord {
            invocation_id: invocation.identity.id,
            resolution: parse(&resolution, "resolution")?,
            resolver: row.text("resolver")?,
            note: row.optional_text("note")?,
            resolved_at: row.time("resolved_at")?,
        }),
    };
    Ok(ReviewItem {
        invocation,
        resolution,
    })
}

/// A row of [`turns_sql`].
pub(super) fn turn_record(row: &impl Columns) -> Result<TurnRecord, StoreError> {
    Ok(TurnRecord {
        turn_id: row.uuid("turn_id")?,
        tenant_id: row.text("tenant_id")?,
        session_id: row.uuid("session_id")?,
        run_id: row.uuid("run_id")?,
        step_number: row.integer("step_number")?,
        script_sha256: row.text("script_sha256")?,
        state: parse(&row.text("state")?, "state")?,
        calls: row.integer("calls")?,
        opened_at: row.time("opened_at")?,
        expires_at: row.time("expires_at")?,
        closed_at: row.optional_time("closed_at")?,
    })
}

/// The last connection columns of a row of [`servers_sql`].
pub(super) fn connection_outcome(
    row: &impl Columns,
) -> Result<Option<ConnectionOutcome>, StoreError> {
    let Some(event_type) = row.optional_text("last_event_type")? else {
        return Ok(None);
    };
    let at = row
        .optional_time("last_event_at")?
        .ok_or_else(|| StoreError::Decode("last_event_at: missing".into()))?;
    Ok(Some(ConnectionOutcome {
        event_type,
        reason_code: row.optional_text("last_reason_code")?,
        at,
    }))
}

/// A row of [`generations_sql`].
pub(super) fn generation_item(row: &impl Columns) -> Result<CatalogGenerationItem, StoreError> {
    let mut tools: Vec<String> = decode(row.json("tools")?, "tools")?;
    tools.sort();
    let mut withdrawn: Vec<String> = decode(row.json("withdrawn")?, "withdrawn")?;
    withdrawn.sort();
    Ok(CatalogGenerationItem {
        id: row.uuid("id")?,
        tenant_id: row.text("tenant_id")?,
        server_id: row.text("server_id")?,
        catalog_hash: row.text("catalog_hash")?,
        discovered_at: row.time("discovered_at")?,
        tools,
        withdrawn,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_texts_keep_no_cast() {
        for sql in [
            invocations_sql(Dialect::Sqlite, "id"),
            approvals_sql(Dialect::Sqlite),
            review_items_sql(Dialect::Sqlite, "id, tenant_id"),
            generations_sql(Dialect::Sqlite),
            servers_sql(Dialect::Sqlite),
        ] {
            assert!(!sql.contains("::"), "{sql}");
            assert!(!sql.contains("->>"), "{sql}");
        }
        assert!(review_items_sql(Dialect::Postgres, "id, tenant_id").contains("i.id, i.tenant_id"));
    }
}

/// A list's text, rendered once per dialect.
macro_rules! list_sql {
    ($name:ident = $render:expr) => {
        static $name: LazyLock<Rendered> = LazyLock::new(|| Rendered::of($render));
    };
}

list_sql!(INVOCATIONS_SQL = |dialect| invocations_sql(dialect, invocation_columns!()));
list_sql!(INVOCATION_SQL = |dialect| invocation_sql(dialect, invocation_columns!()));
list_sql!(INVOCATION_EVENTS_SQL = invocation_events_sql);
list_sql!(APPROVALS_SQL = approvals_sql);
list_sql!(REVIEW_ITEMS_SQL = |dialect| review_items_sql(dialect, invocation_columns!()));
list_sql!(SESSIONS_SQL = |dialect| sessions_sql(dialect, session_columns!()));
list_sql!(TURNS_SQL = turns_sql);
list_sql!(SERVERS_SQL = servers_sql);
list_sql!(GENERATIONS_SQL = generations_sql);
list_sql!(HEALTH_SQL = health_sql);
list_sql!(FAILURES_SQL = failures_sql);

/// One page of a list: `sql` bound with the filter and the page in the
/// order every list takes them, each row decoded by `decode`.
async fn page<D: Driver, T>(
    store: &D,
    sql: &'static LazyLock<Rendered>,
    filter: &OperatorFilter,
    page: PageRequest,
    decode: impl Fn(&D::Row) -> Result<T, StoreError>,
    key: impl Fn(&T) -> Cursor,
) -> Result<Page<T>, StoreError> {
    let values = vec![
        filter.tenant_id.as_deref().into(),
        filter.tool_name.as_deref().into(),
        filter.status.as_deref().into(),
        filter.since.into(),
        filter.until.into(),
        page.after.map(|cursor| cursor.at).into(),
        page.after.map(|cursor| cursor.key).into(),
        page.fetch().into(),
        filter.session_id.into(),
    ];
    let plan = Plan::new(None, Run::Read, Moved::Rows, sql.sql(D::DIALECT), values);
    let rows = store.run(plan).await?.rows;
    let items = rows.iter().map(decode).collect::<Result<Vec<T>, _>>()?;
    Ok(page.page(items, key))
}

fn server_item(row: &impl Columns) -> Result<ServerItem, StoreError> {
    Ok(ServerItem {
        id: row.uuid("id")?,
        tenant_id: row.text("tenant_id")?,
        tenant_configured: row.flag("tenant_configured")?,
        server: server_row(row)?,
        created_at: row.time("created_at")?,
        last_connection: connection_outcome(row)?,
    })
}

impl<D: Driver> OperatorStore for D {
    fn list_invocations<'a>(
        &'a self,
        filter: &'a OperatorFilter,
        request: PageRequest,
    ) -> BoxFuture<'a, Result<Page<InvocationRecord>, StoreError>> {
        Box::pin(page(
            self,
            &INVOCATIONS_SQL,
            filter,
            request,
            invocation,
            |row| Cursor {
                at: row.created_at,
                key: row.identity.id,
            },
        ))
    }

    fn invocation_with_events(
        &self,
        id: Uuid,
    ) -> BoxFuture<'_, Result<Option<InvocationStory>, StoreError>> {
        Box::pin(async move {
            let sql = INVOCATION_SQL.sql(D::DIALECT);
            let plan = Plan::new(None, Run::Read, Moved::Rows, sql, vec![id.into()])
                // The events name it as text.
                .then(
                    INVOCATION_EVENTS_SQL.sql(D::DIALECT),
                    vec![id.to_string().as_str().into()],
                );
            let ran = self.run(plan).await?;
            let Some(row) = ran.rows.first() else {
                return Ok(None);
            };
            let events = ran
                .then
                .iter()
                .flatten()
                .map(event_record)
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Some(InvocationStory {
                invocation: invocation(row)?,
                events,
            }))
        })
    }

    fn list_approvals<'a>(
        &'a self,
        filter: &'a OperatorFilter,
        request: PageRequest,
    ) -> BoxFuture<'a, Result<Page<ApprovalItem>, StoreError>> {
        Box::pin(page(
            self,
            &APPROVALS_SQL,
            filter,
            request,
            approval_item,
            |item| Cursor {
                at: item.requested_at,
                key: item.approval_id,
            },
        ))
    }

    fn list_review_items<'a>(
        &'a self,
        filter: &'a OperatorFilter,
        request: PageRequest,
    ) -> BoxFuture<'a, Result<Page<ReviewItem>, StoreError>> {
        Box::pin(page(
            self,
            &REVIEW_ITEMS_SQL,
            filter,
            request,
            review_item,
            |item| Cursor {
                // An UNCERTAIN row has ended: its completion is its key.
                at: item
                    .invocation
                    .ended()
                    .map_or(item.invocation.created_at, |ended| ended.completed_at),
                key: item.invocation.identity.id,
            },
        ))
    }

    fn list_sessions<'a>(
        &'a self,
        filter: &'a OperatorFilter,
        request: PageRequest,
    ) -> BoxFuture<'a, Result<Page<SessionRecord>, StoreError>> {
        Box::pin(page(
            self,
            &SESSIONS_SQL,
            filter,
            request,
            session_row,
            |session| Cursor {
                at: session.opened_at,
                key: session.session_id,
            },
        ))
    }

    fn list_turns<'a>(
        &'a self,
        filter: &'a OperatorFilter,
        request: PageRequest,
    ) -> BoxFuture<'a, Result<Page<TurnRecord>, StoreError>> {
        Box::pin(page(
            self,
            &TURNS_SQL,
            filter,
            request,
            turn_record,
            |turn| Cursor {
                at: turn.opened_at,
                key: turn.turn_id,
            },
        ))
    }

    fn list_servers<'a>(
        &'a self,
        filter: &'a OperatorFilter,
        request: PageRequest,
    ) -> BoxFuture<'a, Result<Page<ServerItem>, StoreError>> {
        Box::pin(page(
            self,
            &SERVERS_SQL,
            filter,
            request,
            server_item,
            |server| Cursor {
                at: server.created_at,
                key: server.id,
            },
        ))
    }

    fn list_catalog_generations<'a>(
        &'a self,
        filter: &'a OperatorFilter,
        request: PageRequest,
    ) -> BoxFuture<'a, Result<Page<CatalogGenerationItem>, StoreError>> {
        Box::pin(page(
            self,
            &GENERATIONS_SQL,
            filter,
            request,
            generation_item,
            |generation| Cursor {
                at: generation.discovered_at,
                key: generation.id,
            },
        ))
    }

    fn tool_health<'a>(
        &'a self,
        filter: &'a OperatorFilter,
        since: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Vec<ToolHealth>, StoreError>> {
        Box::pin(async move {
            let values = || -> Vec<Value> {
                vec![
                    filter.tenant_id.as_deref().into(),
                    filter.tool_name.as_deref().into(),
                    since.into(),
                ]
            };
            // One snapshot: the counts and the failures beside them.
            let mut plan = Plan::new(
                None,
                Run::Read,
                Moved::Rows,
                HEALTH_SQL.sql(D::DIALECT),
                values(),
            )
            .then(FAILURES_SQL.sql(D::DIALECT), values());
            plan.always = true;
            let ran = self.run(plan).await?;
            let failed = ran.then.into_iter().next().unwrap_or_default();
            tool_health(&ran.rows, &failed)
        })
    }
}

impl<D: Driver> TurnStore for D {
    // Relaxed: a turn's record is the operator's view, not what a call's
    // outcome rests on, and it is written on the turn's open path.
    fn record_turn<'a>(&'a self, turn: &'a TurnRecord) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let values = vec![
                turn.turn_id.into(),
                turn.tenant_id.as_str().into(),
                turn.session_id.into(),
                turn.run_id.into(),
                turn.step_number.into(),
                turn.script_sha256.as_str().into(),
                turn.state.as_str().into(),
                turn.calls.into(),
                turn.opened_at.into(),
                turn.expires_at.into(),
                turn.closed_at.into(),
            ];
            let plan = Plan::new(
                Some(&turn.tenant_id),
                Run::Relaxed,
                Moved::Count,
                RECORD_TURN,
                values,
            );
            self.run(plan).await.map(|_| ())
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
            let values = vec![
                turn_id.into(),
                tenant_id.into(),
                state.as_str().into(),
                calls.into(),
                now.into(),
            ];
            let plan = Plan::new(
                Some(tenant_id),
                Run::Relaxed,
                Moved::Count,
                CLOSE_TURN,
                values,
            );
            Ok(self.run(plan).await?.count == 1)
        })
    }

    fn expire_abandoned_turns(
        &self,
        before: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            let plan = Plan::new(
                None,
                Run::Relaxed,
                Moved::Count,
                EXPIRE_TURNS,
                vec![before.into()],
            );
            Ok(self.run(plan).await?.count)
        })
    }
}

const RECORD_TURN: &str = "INSERT INTO turns (turn_id, tenant_id, session_id, run_id, step_number, \
     script_sha256, state, calls, opened_at, expires_at, closed_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)";

const CLOSE_TURN: &str = "UPDATE turns SET state = $3, calls = $4, closed_at = $5 \
     WHERE turn_id = $1 AND tenant_id = $2 AND state = 'open'";

const EXPIRE_TURNS: &str = "UPDATE turns SET state = 'expired', closed_at = expires_at \
     WHERE state = 'open' AND expires_at < $1";
