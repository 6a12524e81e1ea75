//! The invocation rows, written once for both backends. Every method of the
//! port is a [`Plan`]: its statement, rendered for the backend's
//! [`Dialect`] (a transition's whole conditional write from the transition
//! table: the phases it may leave, its fence or its owner gone, the columns
//! the phase it enters needs, what becomes of the holder), what follows it
//! in the same transaction, and its events. A backend is only a [`Driver`]:
//! it binds a plan's values and runs it in one transaction of its kind.
//! PostgreSQL's hot path (the intent, the claim, the watermark, the
//! terminal write) calls its functions, one round trip each; the transition
//! contract test holds them to the same table.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::operator::Dialect;
use super::rows::{
    ARTIFACT_WITH_OWNER, Columns, artifact, breaker_tally, held, inserted, invocation, run_owner,
};
use super::{event_body, leaves};
use crate::domain::invocation::{
    AUTHORIZE_WAITING, CLAIM, CLAIM_EXPIRED, COMPLETE, COMPLETE_SUSPENDED, Guard, Holder,
    MARK_EFFECT_SENT, Phase, RELEASE, REOPEN_APPROVAL, SETTLE_WAITING, SUSPEND, SuspensionKind,
    TAKE_OVER, Transition,
};
use crate::domain::{Durability, InvocationStatus, ReasonCode};
use crate::ports::{
    ArtifactRecord, BoxFuture, BreakerTally, Claim, Fence, Held, InsertOutcome, InvocationRecord,
    InvocationStore, NewInvocation, PlatformEvent, RunOwner, Start, StoreError, TerminalRecord,
    ToolEvent,
};

/// One parameter's value, as both drivers bind it (PostgreSQL natively;
/// SQLite keeps ids and JSON as text and times as microseconds).
#[derive(Debug, Clone)]
pub(super) enum Value {
    Text(Option<String>),
    Integer(Option<i64>),
    Flag(bool),
    Uuid(Option<Uuid>),
    Time(Option<DateTime<Utc>>),
    Json(Option<serde_json::Value>),
    /// A commit's event kinds, as PostgreSQL's functions take them.
    Kinds(Vec<&'static str>),
    /// A commit's event bodies, likewise.
    Bodies(Vec<serde_json::Value>),
}

/// `From` a Rust value (and its `Option`) for the variant that binds it.
macro_rules! value_from {
    ($($type:ty => $variant:ident),+ $(,)?) => {$(
        impl From<$type> for Value {
            fn from(value: $type) -> Value {
                Value::$variant(Some(value.into()))
            }
        }

        impl From<Option<$type>> for Value {
            fn from(value: Option<$type>) -> Value {
                Value::$variant(value.map(Into::into))
            }
        }
    )+};
}

value_from! {
    &str => Text,
    i64 => Integer,
    Uuid => Uuid,
    DateTime<Utc> => Time,
    serde_json::Value => Json,
}

impl From<bool> for Value {
    fn from(flag: bool) -> Value {
        Value::Flag(flag)
    }
}

/// One statement and its `$N` values, in order. A statement need not use
/// every number: each driver binds by number, with each value's type.
#[derive(Debug, Clone)]
pub(super) struct Statement {
    pub(super) sql: &'static str,
    pub(super) values: Vec<Value>,
}

/// How a plan runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Run {
    /// A read of committed rows.
    Read,
    /// A read on every call's path (PostgreSQL's hot connections).
    HotRead,
    /// A flushed commit in a transaction of its own.
    Flushed,
    /// A commit of the operator's view (turns), which no call's outcome
    /// rests on: SQLite's relaxed connection, a transaction of the pool on
    /// PostgreSQL.
    Relaxed,
    /// A hot-path commit as durable as it says: SQLite's group writer or
    /// relaxed connection; on PostgreSQL one statement on a hot connection
    /// (a function that writes the commit's events itself) under its
    /// `synchronous_commit`.
    Hot(Durability),
}

/// How a plan's first statement says that it moved a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Moved {
    /// It changed rows.
    Count,
    /// It returned rows (each is the plan's).
    Rows,
    /// It returned one row whose `moved` column says.
    Flag,
    /// It changed at most one row, which this statement reads back, in the
    /// same transaction, given the first statement's first two values (the
    /// row's id and tenant, in the order the statement names them). What
    /// SQLite's writes use in place of `RETURNING`, which holds the rows
    /// it returns in a temporary b-tree built each time the statement runs.
    Reread(&'static str),
}

/// A commit's events: their kinds and bodies, in order, one body a kind.
#[derive(Debug, Clone, Default)]
pub(super) struct Events {
    pub(super) kinds: Vec<&'static str>,
    pub(super) bodies: Vec<serde_json::Value>,
}

impl Events {
    /// One platform event.
    pub(super) fn platform(event: &PlatformEvent) -> Events {
        Events::platforms(std::slice::from_ref(event))
    }

    /// Platform events, in order.
    pub(super) fn platforms(events: &[PlatformEvent]) -> Events {
        Events {
            kinds: events.iter().map(PlatformEvent::event_type).collect(),
            bodies: events.iter().map(PlatformEvent::payload).collect(),
        }
    }

    fn of(events: &[ToolEvent]) -> Result<Events, StoreError> {
        Ok(Events {
            kinds: events.iter().map(|event| event.kind.as_str()).collect(),
            bodies: events
                .iter()
                .map(event_body)
                .collect::<Result<Vec<_>, _>>()?,
        })
    }

    pub(super) fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// These events, then `more`.
    pub(super) fn extend(&mut self, more: Events) {
        self.kinds.extend(more.kinds);
        self.bodies.extend(more.bodies);
    }
}

/// What one port method does to the store, in one transaction.
#[derive(Debug, Clone)]
pub(super) struct Plan {
    /// Whose rows; `None`: every tenant's (recovery's sweep).
    pub(super) tenant_id: Option<String>,
    pub(super) run: Run,
    /// Asked first, in the same transaction: when it returns a row, the
    /// first statement is not run and moves nothing (SQLite's; PostgreSQL
    /// asks in the write's own statement).
    pub(super) unless: Option<Statement>,
    /// The guarded write, or the read.
    pub(super) first: Statement,
    pub(super) moved: Moved,
    /// Run after it, in the same transaction, once it moved a row (or
    /// always, with `always`); the rows they return are the plan's too.
    pub(super) then: Vec<Statement>,
    pub(super) always: bool,
    /// Appended once the first statement moved a row.
    pub(super) events: Events,
    /// The events each row the first statement returned records, where
    /// they are known only from the row (an approval's decision).
    pub(super) row_events: Option<RowEvents>,
    /// The events' time, given with them.
    pub(super) now: Option<DateTime<Utc>>,
}

impl Plan {
    /// The events to append once the first statement moved a row, with
    /// their time: those given, then those its returned rows name.
    pub(super) fn take_events<R: Columns>(
        &mut self,
        rows: &[R],
    ) -> Result<Option<(Events, DateTime<Utc>)>, StoreError> {
        let mut events = std::mem::take(&mut self.events);
        if let Some(of_row) = self.row_events {
            for row in rows {
                events.extend(of_row(row)?);
            }
        }
        if events.is_empty() {
            return Ok(None);
        }
        let now = self
            .now
            .ok_or_else(|| StoreError::Query("a plan's events without their time".into()))?;
        Ok(Some((events, now)))
    }
}

impl Plan {
    pub(super) fn new(
        tenant_id: Option<&str>,
        run: Run,
        moved: Moved,
        sql: &'static str,
        values: Vec<Value>,
    ) -> Plan {
        Plan {
            tenant_id: tenant_id.map(str::to_owned),
            run,
            unless: None,
            first: Statement { sql, values },
            moved,
            then: Vec::new(),
            always: false,
            events: Events::default(),
            row_events: None,
            now: None,
        }
    }

    pub(super) fn read(tenant_id: &str, sql: &'static str, values: Vec<Value>) -> Plan {
        Plan::new(Some(tenant_id), Run::Read, Moved::Rows, sql, values)
    }

    pub(super) fn then(mut self, sql: &'static str, values: Vec<Value>) -> Plan {
        self.then.push(Statement { sql, values });
        self
    }

    pub(super) fn with_events(mut self, events: Events, now: DateTime<Utc>) -> Plan {
        self.events = events;
        self.now = Some(now);
        self
    }
}

/// The events a returned row records.
pub(super) type RowEvents = fn(&dyn Columns) -> Result<Events, StoreError>;

/// What a plan did: how many rows its first statement changed (or
/// returned, or its `moved` flag), the rows it returned, and those each of
/// the statements after it returned.
pub(super) struct Ran<R> {
    pub(super) count: u64,
    pub(super) rows: Vec<R>,
    pub(super) then: Vec<Vec<R>>,
}

impl<R> Ran<R> {
    /// Whether the first statement moved a row.
    pub(super) fn moved(&self) -> bool {
        self.count > 0
    }
}

/// A backend: what runs a plan. The aggregates are written once over it:
/// the invocations below, the operator's lists and turns (`operator.rs`),
/// and the approvals, events, reviews, sessions, sign-ins and skills
/// (`records.rs`).
pub(super) trait Driver: Send + Sync {
    const DIALECT: Dialect;
    type Row: Columns + Send + 'static;

    /// Runs `plan` in one transaction as its `run` says.
    fn run(&self, plan: Plan) -> BoxFuture<'_, Result<Ran<Self::Row>, StoreError>>;

    /// The breaker's evidence ([`InvocationStore::record_evidence`]): reads,
    /// then writes what they decide, in one transaction.
    fn evidence<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
        tool_name: &'a str,
        arguments_hash: &'a str,
        evidence_key: &'a str,
        maximum_restarts: i32,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
}

/// A text rendered once for each dialect.
pub(super) struct Rendered {
    postgres: String,
    sqlite: String,
}

impl Rendered {
    pub(super) fn of(render: impl Fn(Dialect) -> String) -> Rendered {
        Rendered {
            postgres: render(Dialect::Postgres),
            sqlite: render(Dialect::Sqlite),
        }
    }

    pub(super) fn sql(&'static self, dialect: Dialect) -> &'static str {
        match dialect {
            Dialect::Postgres => &self.postgres,
            Dialect::Sqlite => &self.sqlite,
        }
    }
}

// Every transition's write takes the same first five parameters: $1 the
// row's id, $2 its tenant, $3 the worker (the fence's, or the claimant),
// $4 the fence's lease epoch, $5 the node's clock where SQLite judges a
// lease by it (PostgreSQL judges by its own). What the entered phase sets
// starts at $6.

/// The terminal columns, `$6` to `$14`.
const ENDS: &str = "status = $6, outcome_status = $7, reason_code = $8, result = $9, error = $10, \
                    output_bytes = $11, truncated = $12, artifact_id = $13, completed_at = $14";

/// A claim to run counts an attempt when the row had started before.
const NEXT_ATTEMPT: &str =
    "attempt_number = CASE WHEN started_at IS NULL THEN attempt_number ELSE attempt_number + 1 END";

/// What a row entering `transition`'s phase must have set.
fn entered(transition: &Transition) -> &'static str {
    match transition.enters {
        None => "",
        Some(Phase::Waiting) => {
            "status = 'waiting_for_approval', approval_id = $6, reason_code = $7"
        }
        Some(Phase::Authorized) => "status = 'authorized'",
        Some(Phase::Running) => "status = 'running', started_at = $6",
        Some(Phase::Suspended) => "suspended_kind = $6, suspended_ref = $7",
        Some(Phase::Ended) => ENDS,
    }
}

/// What the holder becomes.
fn holder(transition: &Transition) -> &'static str {
    match transition.holder {
        Holder::Keeps => "",
        Holder::Claims => "worker_id = $3, lease_epoch = lease_epoch + 1",
        Holder::LetsGo => "worker_id = NULL",
    }
}

/// What a transition sets besides its phase and its holder.
fn besides(transition: &Transition) -> &'static str {
    if *transition == MARK_EFFECT_SENT {
        // The watermark is set once.
        "effect_sent_at = COALESCE(effect_sent_at, $6)"
    } else if *transition == RELEASE {
        "lease_epoch = lease_epoch + 1"
    } else if [CLAIM, CLAIM_EXPIRED, TAKE_OVER].contains(transition) {
        NEXT_ATTEMPT
    } else {
        ""
    }
}

/// Every column `transition` sets.
fn sets(transition: &Transition) -> String {
    [entered(transition), holder(transition), besides(transition)]
        .into_iter()
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A row whose worker is gone: none, released, or its lease run out.
/// SQLite judges the lease by the node's clock (`$5`); PostgreSQL by its
/// own, and names the dead workers positively: a row another sweeper just
/// took, rechecked against its new version under `SKIP LOCKED`, has a live
/// owner and is not among them (a `NOT EXISTS` over live workers would pass
/// that recheck vacuously and steal the row).
fn owner_gone(dialect: Dialect, alias: &str) -> String {
    match dialect {
        Dialect::Postgres => format!(
            "({alias}worker_id IS NULL OR {alias}worker_id IN (SELECT w.worker_id FROM workers w \
             WHERE w.released_at IS NOT NULL OR w.lease_expires_at < now()))"
        ),
        Dialect::Sqlite => format!(
            "NOT EXISTS (SELECT 1 FROM workers w WHERE w.worker_id = {alias}worker_id \
             AND w.released_at IS NULL AND w.lease_expires_at >= $5)"
        ),
    }
}

/// What a write must hold besides the row's phase.
fn guard(dialect: Dialect, transition: &Transition, alias: &str) -> String {
    let fence = format!("{alias}worker_id = $3 AND {alias}lease_epoch = $4");
    match transition.guard {
        Guard::Phase => String::new(),
        Guard::Fence => format!(" AND {fence}"),
        Guard::FenceAndLiveLease => {
            let now = match dialect {
                Dialect::Postgres => "now()",
                Dialect::Sqlite => "$5",
            };
            format!(
                " AND {fence} AND EXISTS (SELECT 1 FROM workers w WHERE w.worker_id = $3 \
                 AND w.released_at IS NULL AND w.lease_expires_at > {now})"
            )
        }
        Guard::OwnerGone => format!(" AND {}", owner_gone(dialect, alias)),
    }
}

/// `transition`'s whole conditional write of one row, returning the row
/// when `returning`: on PostgreSQL with the write, on SQLite read back
/// after it ([`Moved::Reread`]).
fn write(dialect: Dialect, transition: &Transition, returning: bool) -> String {
    format!(
        "UPDATE tool_invocations SET {} WHERE id = $1 AND tenant_id = $2 AND {}{}{}",
        sets(transition),
        leaves(transition, ""),
        guard(dialect, transition, "tool_invocations."),
        if returning && dialect == Dialect::Postgres {
            concat!(" RETURNING ", invocation_columns!())
        } else {
            ""
        }
    )
}

/// A transition's write, rendered once per dialect.
macro_rules! transition_write {
    ($name:ident = $transition:expr, returning: $returning:expr) => {
        static $name: LazyLock<Rendered> =
            LazyLock::new(|| Rendered::of(|dialect| write(dialect, &$transition, $returning)));
    };
}

transition_write!(AUTHORIZE_WAITING_SQL = AUTHORIZE_WAITING, returning: true);
transition_write!(SETTLE_WAITING_SQL = SETTLE_WAITING, returning: false);
transition_write!(CLAIM_SQL = CLAIM, returning: true);
transition_write!(MARK_EFFECT_SENT_SQL = MARK_EFFECT_SENT, returning: false);
transition_write!(COMPLETE_SQL = COMPLETE, returning: false);
transition_write!(RELEASE_SQL = RELEASE, returning: false);
transition_write!(SUSPEND_SQL = SUSPEND, returning: false);
transition_write!(COMPLETE_SUSPENDED_SQL = COMPLETE_SUSPENDED, returning: false);
transition_write!(TAKE_OVER_SQL = TAKE_OVER, returning: true);
transition_write!(REOPEN_APPROVAL_SQL = REOPEN_APPROVAL, returning: false);

// Recovery's sweep: the oldest `$6` rows whose owner is gone. PostgreSQL
// chooses its candidates once (a materialized CTE) and locks them with SKIP
// LOCKED, so two sweepers never wait on, or take, one row.
static CLAIM_EXPIRED_SQL: LazyLock<Rendered> = LazyLock::new(|| {
    Rendered::of(|dialect| {
        let candidates = format!(
            "SELECT i.id FROM tool_invocations i WHERE {}{} ORDER BY i.created_at LIMIT $6",
            leaves(&CLAIM_EXPIRED, "i."),
            guard(dialect, &CLAIM_EXPIRED, "i."),
        );
        let sets = sets(&CLAIM_EXPIRED);
        match dialect {
            Dialect::Postgres => format!(
                "WITH candidates AS MATERIALIZED ({candidates} FOR UPDATE SKIP LOCKED) \
                 UPDATE tool_invocations SET {sets} FROM candidates c \
                 WHERE tool_invocations.id = c.id RETURNING {}",
                qualified_columns("tool_invocations.")
            ),
            Dialect::Sqlite => format!(
                "UPDATE tool_invocations SET {sets} WHERE id IN ({candidates}) RETURNING {}",
                invocation_columns!()
            ),
        }
    })
});

/// The row's columns, each named with `alias`.
fn qualified_columns(alias: &str) -> String {
    invocation_columns!()
        .split(", ")
        .map(|column| format!("{alias}{}", column.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}

// SQLite's intent; PostgreSQL's `toolgate_write_intent` takes the same
// values ($1 to $29, and `$31`) and commits as `$30` says. Uncounted (`$31`), a
// row is inserted only while no identical call of the run has an outcome
// and the breaker has nothing to count: PostgreSQL's function asks that
// itself, SQLite asks `SQLITE_BREAKER_COUNTS` first in the same
// transaction. One INSERT … SELECT that asked it would read the table it
// writes, which SQLite does through a temporary b-tree every run.
const SQLITE_INTENT: &str = "INSERT INTO tool_invocations (id, tenant_id, session_id, run_id, \
     step_number, call_id, tool_name, tool_version, tool_source, server_id, arguments, arguments_hash, \
     idempotency_key, status, idempotency_class, side_effect, principal, origin_trust, parallel_group, \
     deadline_at, approval_id, reason_code, outcome_status, worker_id, lease_epoch, created_at, \
     completed_at, started_at, argument_trust) \
     VALUES ($2, $1, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, \
     $21, $22, $23, $24, 0, $25, $26, $32, $29) \
     ON CONFLICT (idempotency_key, tenant_id) DO NOTHING";

/// Whether the breaker has something to count for a call (tenant `$1`,
/// run `$2`, tool `$3`, arguments' hash `$4`, step `$5`): an identical
/// call of the run with an outcome, or the run's synthesis-only step
/// before it. A row when it has.
const SQLITE_BREAKER_COUNTS: &str = "SELECT 1 AS counts FROM tool_invocations WHERE tenant_id = $1 \
     AND run_id = $2 AND tool_name = $3 AND arguments_hash = $4 AND outcome_status IS NOT NULL \
     UNION ALL SELECT 1 FROM breaker_synthesis WHERE tenant_id = $1 AND run_id = $2 \
     AND after_step < $5 LIMIT 1";

const POSTGRES_INTENT: &str = "SELECT toolgate_write_intent($1, $2, $3, $4, $5, $6, $7, $8, $9, \
     $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, \
     $29, $31, $30) AS moved";

const INSERT_APPROVAL: &str = "INSERT INTO approvals (id, tenant_id, invocation_id, tool_name, \
     reason_code, status, requested_at) VALUES ($1, $2, $3, $4, $5, 'pending', $6)";

// A reopened approval names the row's own tool.
const REOPENED_APPROVAL: &str = "INSERT INTO approvals (id, tenant_id, invocation_id, tool_name, \
     reason_code, status, requested_at) SELECT $1, tenant_id, id, tool_name, $2, 'pending', $3 \
     FROM tool_invocations WHERE id = $4 AND tenant_id = $5";

const INSERT_ARTIFACT: &str = "INSERT INTO artifacts (id, tenant_id, run_id, invocation_id, \
     media_type, bytes, trust, created_at) \
     SELECT $1, tenant_id, run_id, id, $3, $4, $5, $6 FROM tool_invocations WHERE id = $2";

// PostgreSQL's hot-path functions take the values of the transition's
// write (the row, its tenant, the fence, the entered phase's columns), then
// the commit's events, and commit as the last value says.
const POSTGRES_CLAIM: &str = "SELECT * FROM toolgate_claim($2, $1, $3, $4, $6, $7, $8), \
     set_config('synchronous_commit', COALESCE($9, current_setting('synchronous_commit')), true)";

const POSTGRES_MARK_EFFECT_SENT: &str = "SELECT toolgate_mark_effect_sent($2, $1, $3, $4, $6) AS moved, \
     set_config('synchronous_commit', COALESCE($7, current_setting('synchronous_commit')), true)";

const POSTGRES_COMPLETE: &str = "SELECT toolgate_write_end($2, $1, $3, $4, $6, $7, $8, $9, $10, $11, \
     $12, $13, $15, $16, $17, $14, $18, $19, $20, $21) AS moved";

const OPEN_RUN: &str = "INSERT INTO runs (run_id, tenant_id, principal_id, session_id, opened_at) \
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant_id, run_id) DO NOTHING";

// A statement of its own: it sees a row another transaction committed
// while the insert waited on it.
const RUN_OWNER: &str = "SELECT * FROM runs WHERE tenant_id = $2 AND run_id = $1";

const BY_ID: &str = concat!(
    "SELECT ",
    invocation_columns!(),
    " FROM tool_invocations WHERE id = $1 AND tenant_id = $2"
);

const BY_KEY: &str = concat!(
    "SELECT ",
    invocation_columns!(),
    " FROM tool_invocations WHERE idempotency_key = $1 AND tenant_id = $2"
);

const OF_RUN: &str = concat!(
    "SELECT ",
    invocation_columns!(),
    " FROM tool_invocations WHERE tenant_id = $1 AND run_id = $2 ORDER BY step_number, created_at, id"
);

const OF_STEP: &str = concat!(
    "SELECT ",
    invocation_columns!(),
    " FROM tool_invocations WHERE tenant_id = $1 AND run_id = $2 AND step_number = $3 \
     ORDER BY created_at, id"
);

const WAITING_CALL: &str = concat!(
    "SELECT ",
    invocation_columns!(),
    " FROM tool_invocations WHERE tenant_id = $1 AND run_id = $2 AND tool_name = $3 \
     AND arguments_hash = $4 AND status = 'waiting_for_approval' ORDER BY created_at, id LIMIT 1"
);

const LATEST_SUCCEEDED: &str = concat!(
    "SELECT ",
    invocation_columns!(),
    " FROM tool_invocations WHERE tenant_id = $1 AND run_id = $2 AND tool_name = $3 \
     AND outcome_status = 'succeeded' ORDER BY step_number DESC, created_at DESC, id DESC LIMIT 1"
);

// One statement, so one snapshot: the counts, then the evidence base as a
// row of its own (`t_count` NULL), then the run's synthesis-only step.
// PostgreSQL's `toolgate_tally` is the same query, one round trip.
const SQLITE_TALLY: &str = "SELECT outcome_status AS t_status, reason_code AS t_code, \
     count(*) AS t_count, NULL AS t_base, NULL AS t_synthesis FROM tool_invocations \
     WHERE tenant_id = $1 AND run_id = $2 AND tool_name = $3 AND arguments_hash = $4 \
       AND outcome_status IS NOT NULL GROUP BY outcome_status, reason_code \
     UNION ALL SELECT NULL, NULL, NULL, base, NULL FROM breaker_evidence \
     WHERE tenant_id = $1 AND run_id = $2 AND tool_name = $3 AND arguments_hash = $4 \
     UNION ALL SELECT NULL, NULL, NULL, NULL, after_step FROM breaker_synthesis \
     WHERE tenant_id = $1 AND run_id = $2";

const POSTGRES_TALLY: &str =
    "SELECT t_status, t_code, t_count, t_base, t_synthesis FROM toolgate_tally($1, $2, $3, $4)";

static MARK_SYNTHESIS_ONLY_SQL: LazyLock<Rendered> = LazyLock::new(|| {
    Rendered::of(|dialect| {
        let least = match dialect {
            Dialect::Postgres => "LEAST",
            Dialect::Sqlite => "MIN",
        };
        format!(
            "INSERT INTO breaker_synthesis (tenant_id, run_id, after_step) VALUES ($1, $2, $3) \
             ON CONFLICT (run_id, tenant_id) DO UPDATE \
             SET after_step = {least}(breaker_synthesis.after_step, excluded.after_step)"
        )
    })
});

/// A transition's first five values: the row, its tenant, the worker, the
/// fence's epoch and the node's clock.
fn row_values(
    id: Uuid,
    tenant_id: &str,
    worker_id: Option<Uuid>,
    lease_epoch: Option<i64>,
    clock: Option<DateTime<Utc>>,
) -> Vec<Value> {
    vec![
        id.into(),
        tenant_id.into(),
        worker_id.into(),
        lease_epoch.into(),
        clock.into(),
    ]
}

/// The first five values of a write under `fence`.
fn fenced(id: Uuid, tenant_id: &str, fence: Fence) -> Vec<Value> {
    row_values(
        id,
        tenant_id,
        Some(fence.worker_id),
        Some(fence.lease_epoch),
        None,
    )
}

/// The terminal columns' values, `$6` to `$14`.
fn ends(terminal: &TerminalRecord, now: DateTime<Utc>) -> [Value; 9] {
    [
        terminal.status().as_str().into(),
        terminal.outcome_status.as_str().into(),
        terminal.reason_code.map(ReasonCode::as_str).into(),
        terminal.result.clone().into(),
        terminal.error.clone().into(),
        terminal.output_bytes.into(),
        terminal.truncated.into(),
        terminal.artifact.as_ref().map(|made| made.id).into(),
        now.into(),
    ]
}

/// The `synchronous_commit` a hot-path commit runs under on PostgreSQL:
/// off for a relaxed one (that transaction only), the session's own
/// setting otherwise (never weaker than the operator's, e.g.
/// `remote_apply` on a replicated primary).
fn synchronous_commit(durability: Durability) -> Value {
    match durability {
        Durability::Relaxed => "off".into(),
        Durability::Flushed => Value::Text(None),
    }
}

/// A hot-path commit's events: in its statement's values on PostgreSQL
/// (`$kinds`, `$bodies`), appended by the driver on SQLite.
fn carried<D: Driver>(events: Events) -> ([Value; 2], Events) {
    match D::DIALECT {
        Dialect::Postgres => (
            [Value::Kinds(events.kinds), Value::Bodies(events.bodies)],
            Events::default(),
        ),
        Dialect::Sqlite => (
            [Value::Kinds(Vec::new()), Value::Bodies(Vec::new())],
            events,
        ),
    }
}

fn json<T: serde::Serialize>(value: &T) -> Result<serde_json::Value, StoreError> {
    serde_json::to_value(value).map_err(|error| StoreError::Decode(error.to_string()))
}

/// The intent's plan for `new`: whether it inserted the row (each store
/// answers that alone; the row holding the key is read apart).
fn intent<D: Driver>(
    new: &NewInvocation,
    claim: Claim,
    events: &[ToolEvent],
    uncounted: bool,
) -> Result<Plan, StoreError> {
    // No labels at all is NULL: every argument the model's.
    let argument_trust = (!new.identity.argument_trust.labels().is_empty())
        .then(|| json(&new.identity.argument_trust))
        .transpose()?;
    let sql = match D::DIALECT {
        Dialect::Sqlite => SQLITE_INTENT,
        Dialect::Postgres => POSTGRES_INTENT,
    };
    let status = new.start.status();
    let outcome_status = status.outcome_status(new.start.reason_code());
    let ([kinds, bodies], events) = carried::<D>(Events::of(events)?);
    let values = vec![
        new.identity.tenant_id.as_str().into(),
        new.identity.id.into(),
        new.identity.session_id.into(),
        new.identity.run_id.into(),
        new.identity.step_number.into(),
        new.identity.call_id.as_str().into(),
        new.identity.tool_name.as_str().into(),
        new.identity.tool_version.as_str().into(),
        new.identity.tool_source.as_str().into(),
        new.identity.server_id.as_deref().into(),
        Some(new.identity.arguments.clone()).into(),
        new.identity.arguments_hash.as_str().into(),
        new.identity.idempotency_key.as_str().into(),
        new.start.status().as_str().into(),
        new.identity.idempotency_class.as_str().into(),
        new.identity.side_effect.as_str().into(),
        Some(json(&new.identity.principal)?).into(),
        new.identity.origin_trust.as_str().into(),
        new.identity.parallel_group.into(),
        new.identity.deadline_at.into(),
        new.start.approval_id().into(),
        new.start.reason_code().map(ReasonCode::as_str).into(),
        outcome_status.map(|status| status.as_str()).into(),
        claim.worker_id.into(),
        claim.now.into(),
        status.is_terminal().then_some(claim.now).into(),
        kinds,
        bodies,
        argument_trust.into(),
        synchronous_commit(new.durability),
        uncounted.into(),
        (status == InvocationStatus::Running)
            .then_some(claim.now)
            .into(),
    ];
    let hot = Run::Hot(new.durability);
    let moved = match D::DIALECT {
        Dialect::Postgres => Moved::Flag,
        Dialect::Sqlite => Moved::Count,
    };
    let mut plan = Plan::new(Some(&new.identity.tenant_id), hot, moved, sql, values)
        .with_events(events, claim.now);
    if uncounted && D::DIALECT == Dialect::Sqlite {
        plan.unless = Some(Statement {
            sql: SQLITE_BREAKER_COUNTS,
            values: vec![
                new.identity.tenant_id.as_str().into(),
                new.identity.run_id.into(),
                new.identity.tool_name.as_str().into(),
                new.identity.arguments_hash.as_str().into(),
                new.identity.step_number.into(),
            ],
        });
    }
    // PostgreSQL's function records the approval itself.
    if let (
        Dialect::Sqlite,
        Start::Waiting {
            approval_id,
            reason_code,
        },
    ) = (D::DIALECT, new.start)
    {
        plan = plan.then(
            INSERT_APPROVAL,
            vec![
                approval_id.into(),
                new.identity.tenant_id.as_str().into(),
                new.identity.id.into(),
                new.identity.tool_name.as_str().into(),
                reason_code.as_str().into(),
                claim.now.into(),
            ],
        );
    }
    Ok(plan)
}

/// A terminal write of a row no worker holds (a waiting or suspended
/// call), with its events.
fn end_unfenced<D: Driver>(
    rendered: &'static LazyLock<Rendered>,
    tenant_id: &str,
    id: Uuid,
    terminal: &TerminalRecord,
    events: &[ToolEvent],
    now: DateTime<Utc>,
) -> Result<Plan, StoreError> {
    let mut values = row_values(id, tenant_id, None, None, None);
    values.extend(ends(terminal, now));
    let sql = rendered.sql(D::DIALECT);
    Ok(
        Plan::new(Some(tenant_id), Run::Flushed, Moved::Count, sql, values)
            .with_events(Events::of(events)?, now),
    )
}

/// A flushed write of one row by `sql`: whether it moved.
async fn flushed<D: Driver>(
    store: &D,
    tenant_id: &str,
    sql: &'static str,
    values: Vec<Value>,
) -> Result<bool, StoreError> {
    let plan = Plan::new(Some(tenant_id), Run::Flushed, Moved::Count, sql, values);
    Ok(store.run(plan).await?.moved())
}

/// The rows a read returns, as invocation records.
async fn read<D: Driver>(
    store: &D,
    tenant_id: &str,
    sql: &'static str,
    values: Vec<Value>,
) -> Result<Vec<InvocationRecord>, StoreError> {
    let rows = store.run(Plan::read(tenant_id, sql, values)).await?.rows;
    rows.iter().map(invocation).collect()
}

/// The row an intent's plan inserted: `new` as given, when it moved one.
fn intent_record<R>(
    ran: &Ran<R>,
    new: &NewInvocation,
    claim: Claim,
) -> Result<Option<InvocationRecord>, StoreError> {
    if ran.moved() {
        inserted(new, claim).map(Some)
    } else {
        Ok(None)
    }
}

fn first_record<R: Columns>(rows: &[R]) -> Result<Option<InvocationRecord>, StoreError> {
    rows.first().map(invocation).transpose()
}

fn first_held<R: Columns>(rows: &[R]) -> Result<Option<Held>, StoreError> {
    first_record(rows)?.map(held).transpose()
}

/// How a write of one row gives the row back on `D`: PostgreSQL returns
/// it; SQLite reads it back with `reread`.
fn returned_row<D: Driver>(reread: &'static str) -> Moved {
    match D::DIALECT {
        Dialect::Postgres => Moved::Rows,
        Dialect::Sqlite => Moved::Reread(reread),
    }
}

impl<D: Driver> InvocationStore for D {
    fn insert_invocation<'a>(
        &'a self,
        new: &'a NewInvocation,
        claim: Claim,
        events: &'a [ToolEvent],
    ) -> BoxFuture<'a, Result<InsertOutcome, StoreError>> {
        Box::pin(async move {
            let ran = self.run(intent::<D>(new, claim, events, false)?).await?;
            if let Some(record) = intent_record(&ran, new, claim)? {
                return Ok(InsertOutcome::Inserted(record));
            }
            // The key is held within the tenant: that row is the call's.
            let key = vec![
                new.identity.idempotency_key.as_str().into(),
                new.identity.tenant_id.as_str().into(),
            ];
            match read(self, &new.identity.tenant_id, BY_KEY, key)
                .await?
                .pop()
            {
                Some(record) => Ok(InsertOutcome::Existing(record)),
                None => Err(StoreError::Query("the row holding the key is gone".into())),
            }
        })
    }

    fn insert_uncounted<'a>(
        &'a self,
        new: &'a NewInvocation,
        claim: Claim,
        events: &'a [ToolEvent],
    ) -> BoxFuture<'a, Result<Option<Held>, StoreError>> {
        Box::pin(async move {
            let ran = self.run(intent::<D>(new, claim, events, true)?).await?;
            intent_record(&ran, new, claim)?.map(held).transpose()
        })
    }

    fn authorize_waiting<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        claim: Claim,
        events: &'a [ToolEvent],
    ) -> BoxFuture<'a, Result<Option<Held>, StoreError>> {
        Box::pin(async move {
            let values = row_values(id, tenant_id, Some(claim.worker_id), None, None);
            let sql = AUTHORIZE_WAITING_SQL.sql(D::DIALECT);
            let moved = returned_row::<D>(BY_ID);
            let plan = Plan::new(Some(tenant_id), Run::Flushed, moved, sql, values)
                .with_events(Events::of(events)?, claim.now);
            first_held(&self.run(plan).await?.rows)
        })
    }

    fn settle_waiting<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        terminal: &'a TerminalRecord,
        events: &'a [ToolEvent],
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let plan =
                end_unfenced::<D>(&SETTLE_WAITING_SQL, tenant_id, id, terminal, events, now)?;
            Ok(self.run(plan).await?.moved())
        })
    }

    fn claim_invocation<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        fence: Fence,
        now: DateTime<Utc>,
        events: &'a [ToolEvent],
        durability: Durability,
    ) -> BoxFuture<'a, Result<Option<Held>, StoreError>> {
        Box::pin(async move {
            let ([kinds, bodies], events) = carried::<D>(Events::of(events)?);
            let mut values = fenced(id, tenant_id, fence);
            values.extend([now.into(), kinds, bodies, synchronous_commit(durability)]);
            let sql = match D::DIALECT {
                Dialect::Postgres => POSTGRES_CLAIM,
                Dialect::Sqlite => CLAIM_SQL.sql(D::DIALECT),
            };
            let plan = Plan::new(
                Some(tenant_id),
                Run::Hot(durability),
                returned_row::<D>(BY_ID),
                sql,
                values,
            )
            .with_events(events, now);
            first_held(&self.run(plan).await?.rows)
        })
    }

    fn mark_effect_sent<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        fence: Fence,
        now: DateTime<Utc>,
        durability: Durability,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            // SQLite judges the lease by the node's clock, which renews it.
            let mut values = row_values(
                id,
                tenant_id,
                Some(fence.worker_id),
                Some(fence.lease_epoch),
                Some(now),
            );
            values.extend([now.into(), synchronous_commit(durability)]);
            let (sql, moved) = match D::DIALECT {
                Dialect::Postgres => (POSTGRES_MARK_EFFECT_SENT, Moved::Flag),
                Dialect::Sqlite => (MARK_EFFECT_SENT_SQL.sql(D::DIALECT), Moved::Count),
            };
            let plan = Plan::new(Some(tenant_id), Run::Hot(durability), moved, sql, values);
            Ok(self.run(plan).await?.moved())
        })
    }

    fn complete_invocation<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        fence: Fence,
        terminal: &'a TerminalRecord,
        events: &'a [ToolEvent],
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let ([kinds, bodies], events) = carried::<D>(Events::of(events)?);
            let artifact = terminal.artifact.as_ref();
            let produced: Vec<serde_json::Value> = terminal
                .produced
                .iter()
                .map(|made| {
                    serde_json::json!({"id": made.id, "media_type": made.media_type,
                                       "bytes": made.bytes, "trust": made.trust.as_str()})
                })
                .collect();
            let mut values = fenced(id, tenant_id, fence);
            values.extend(ends(terminal, now));
            values.extend([
                artifact.map(|made| made.media_type.as_str()).into(),
                artifact.map(|made| made.bytes).into(),
                artifact.map(|made| made.trust.as_str()).into(),
                kinds,
                bodies,
                Some(serde_json::Value::Array(produced)).into(),
                synchronous_commit(terminal.durability),
            ]);
            let (sql, moved) = match D::DIALECT {
                Dialect::Postgres => (POSTGRES_COMPLETE, Moved::Flag),
                Dialect::Sqlite => (COMPLETE_SQL.sql(D::DIALECT), Moved::Count),
            };
            let hot = Run::Hot(terminal.durability);
            let mut plan =
                Plan::new(Some(tenant_id), hot, moved, sql, values).with_events(events, now);
            // PostgreSQL's function records the artifacts itself.
            if D::DIALECT == Dialect::Sqlite {
                for made in artifact.into_iter().chain(terminal.produced.iter()) {
                    let values = vec![
                        made.id.into(),
                        id.into(),
                        made.media_type.as_str().into(),
                        made.bytes.into(),
                        made.trust.as_str().into(),
                        now.into(),
                    ];
                    plan = plan.then(INSERT_ARTIFACT, values);
                }
            }
            Ok(self.run(plan).await?.moved())
        })
    }

    fn release_invocation<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        fence: Fence,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let values = fenced(id, tenant_id, fence);
        Box::pin(flushed(
            self,
            tenant_id,
            RELEASE_SQL.sql(D::DIALECT),
            values,
        ))
    }

    fn suspend_invocation<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        fence: Fence,
        kind: SuspensionKind,
        reference: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        // The lease is let go with the row: a suspended call is not a dead
        // worker's, and no sweep may take it.
        let mut values = fenced(id, tenant_id, fence);
        values.extend([kind.as_str().into(), reference.into()]);
        Box::pin(flushed(
            self,
            tenant_id,
            SUSPEND_SQL.sql(D::DIALECT),
            values,
        ))
    }

    fn complete_suspended<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        terminal: &'a TerminalRecord,
        events: &'a [ToolEvent],
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let plan = end_unfenced::<D>(
                &COMPLETE_SUSPENDED_SQL,
                tenant_id,
                id,
                terminal,
                events,
                now,
            )?;
            Ok(self.run(plan).await?.moved())
        })
    }

    fn open_run<'a>(&'a self, run: &'a RunOwner) -> BoxFuture<'a, Result<RunOwner, StoreError>> {
        Box::pin(async move {
            let values = vec![
                run.run_id.into(),
                run.tenant_id.as_str().into(),
                run.principal_id.as_str().into(),
                run.session_id.into(),
                run.opened_at.into(),
            ];
            let key = vec![run.run_id.into(), run.tenant_id.as_str().into()];
            let mut plan = Plan::new(
                Some(&run.tenant_id),
                Run::Flushed,
                Moved::Count,
                OPEN_RUN,
                values,
            )
            .then(RUN_OWNER, key);
            plan.always = true;
            let ran = self.run(plan).await?;
            match ran.then.first().and_then(|rows| rows.first()) {
                Some(row) => run_owner(row),
                None => Err(StoreError::Query("the run's row is gone".into())),
            }
        })
    }

    fn invocation<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
    ) -> BoxFuture<'a, Result<Option<InvocationRecord>, StoreError>> {
        Box::pin(async move {
            let values = vec![id.into(), tenant_id.into()];
            Ok(read(self, tenant_id, BY_ID, values).await?.pop())
        })
    }

    fn run_invocations<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
    ) -> BoxFuture<'a, Result<Vec<InvocationRecord>, StoreError>> {
        let values = vec![tenant_id.into(), run_id.into()];
        Box::pin(read(self, tenant_id, OF_RUN, values))
    }

    fn step_invocations<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
        step_number: i64,
    ) -> BoxFuture<'a, Result<Vec<InvocationRecord>, StoreError>> {
        let values = vec![tenant_id.into(), run_id.into(), step_number.into()];
        Box::pin(read(self, tenant_id, OF_STEP, values))
    }

    fn waiting_call<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
        tool_name: &'a str,
        arguments_hash: &'a str,
    ) -> BoxFuture<'a, Result<Option<InvocationRecord>, StoreError>> {
        Box::pin(async move {
            let values = vec![
                tenant_id.into(),
                run_id.into(),
                tool_name.into(),
                arguments_hash.into(),
            ];
            Ok(read(self, tenant_id, WAITING_CALL, values).await?.pop())
        })
    }

    fn latest_succeeded<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
        tool_name: &'a str,
    ) -> BoxFuture<'a, Result<Option<InvocationRecord>, StoreError>> {
        Box::pin(async move {
            let values = vec![tenant_id.into(), run_id.into(), tool_name.into()];
            Ok(read(self, tenant_id, LATEST_SUCCEEDED, values).await?.pop())
        })
    }

    fn claim_expired(
        &self,
        claim: Claim,
        limit: i64,
    ) -> BoxFuture<'_, Result<Vec<Held>, StoreError>> {
        Box::pin(async move {
            let mut values = vec![Value::Uuid(None), Value::Text(None)];
            values.extend([
                claim.worker_id.into(),
                Value::Integer(None),
                claim.now.into(),
                limit.into(),
            ]);
            let sql = CLAIM_EXPIRED_SQL.sql(D::DIALECT);
            let plan = Plan::new(None, Run::Flushed, Moved::Rows, sql, values);
            let rows = self.run(plan).await?.rows;
            rows.iter().map(|row| held(invocation(row)?)).collect()
        })
    }

    fn take_over<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        claim: Claim,
    ) -> BoxFuture<'a, Result<Option<Held>, StoreError>> {
        Box::pin(async move {
            let values = row_values(id, tenant_id, Some(claim.worker_id), None, Some(claim.now));
            let sql = TAKE_OVER_SQL.sql(D::DIALECT);
            let moved = returned_row::<D>(BY_ID);
            let plan = Plan::new(Some(tenant_id), Run::Flushed, moved, sql, values);
            first_held(&self.run(plan).await?.rows)
        })
    }

    fn breaker_tally<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
        tool_name: &'a str,
        arguments_hash: &'a str,
    ) -> BoxFuture<'a, Result<BreakerTally, StoreError>> {
        Box::pin(async move {
            let sql = match D::DIALECT {
                Dialect::Postgres => POSTGRES_TALLY,
                Dialect::Sqlite => SQLITE_TALLY,
            };
            let values = vec![
                tenant_id.into(),
                run_id.into(),
                tool_name.into(),
                arguments_hash.into(),
            ];
            let plan = Plan::new(Some(tenant_id), Run::HotRead, Moved::Rows, sql, values);
            breaker_tally(&self.run(plan).await?.rows)
        })
    }

    fn record_evidence<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
        tool_name: &'a str,
        arguments_hash: &'a str,
        evidence_key: &'a str,
        maximum_restarts: i32,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.evidence(
            tenant_id,
            run_id,
            tool_name,
            arguments_hash,
            evidence_key,
            maximum_restarts,
        )
    }

    fn mark_synthesis_only<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
        step: i64,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let values = vec![tenant_id.into(), run_id.into(), step.into()];
        let sql = MARK_SYNTHESIS_ONLY_SQL.sql(D::DIALECT);
        Box::pin(async move { flushed(self, tenant_id, sql, values).await.map(|_| ()) })
    }

    fn artifact<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
    ) -> BoxFuture<'a, Result<Option<ArtifactRecord>, StoreError>> {
        Box::pin(async move {
            let values = vec![id.into(), tenant_id.into()];
            let plan = Plan::read(tenant_id, ARTIFACT_WITH_OWNER, values);
            self.run(plan).await?.rows.first().map(artifact).transpose()
        })
    }

    fn reopen_approval<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        fence: Fence,
        approval_id: Uuid,
        reason_code: ReasonCode,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut values = fenced(id, tenant_id, fence);
            values.extend([approval_id.into(), reason_code.as_str().into()]);
            let approval = vec![
                approval_id.into(),
                reason_code.as_str().into(),
                now.into(),
                id.into(),
                tenant_id.into(),
            ];
            let sql = REOPEN_APPROVAL_SQL.sql(D::DIALECT);
            let plan = Plan::new(Some(tenant_id), Run::Flushed, Moved::Count, sql, values)
                .then(REOPENED_APPROVAL, approval);
            Ok(self.run(plan).await?.moved())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SQLite reads what each of these statements asks through `index`,
    /// before the database has statistics: the sweep the held rows alone,
    /// not the table (a million rows on the writer each sweep); the
    /// questions about a run's identical calls the index keyed by run,
    /// tool and arguments. That index's key holds nothing a call's end
    /// writes, so an end commit never rewrites its pages.
    #[tokio::test]
    async fn sqlite_reads_through_the_indexes_the_statements_are_written_for() {
        let (_folder, connection) = super::super::sqlite::migrated().await;
        let key: Vec<String> = connection
            .prepare(
                "SELECT name FROM pragma_index_info('tool_invocations_identical') ORDER BY seqno",
            )
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(key, ["run_id", "tool_name", "arguments_hash"]);
        for (statement, index) in [
            (
                CLAIM_EXPIRED_SQL.sql(Dialect::Sqlite),
                "tool_invocations_held",
            ),
            (SQLITE_BREAKER_COUNTS, "tool_invocations_identical"),
            (SQLITE_TALLY, "tool_invocations_identical"),
            (OF_RUN, "tool_invocations_identical"),
            (LATEST_SUCCEEDED, "tool_invocations_identical"),
            (
                &super::super::operator::servers_sql(Dialect::Sqlite),
                "events_by_server",
            ),
        ] {
            // Unbound: the plan is the one any values get.
            let plan =
                super::super::sqlite::explained(&connection, "EXPLAIN QUERY PLAN", statement, 3);
            assert!(
                plan.iter().any(|step| step.contains("INDEX")
                    && step.split_whitespace().any(|word| word == index)),
                "{statement}\n{plan:#?}"
            );
        }
    }

    /// No statement a call runs on SQLite builds a temporary b-tree, which
    /// SQLite builds each time such a statement runs (a page cache, a pager
    /// and a b-tree opened, filled and closed): to test a constant list of
    /// more than two values (a table's CHECK, a partial index's condition,
    /// a WHERE's `IN`), to hold what `RETURNING` returns, and to hold what
    /// an INSERT … SELECT reads from the table it writes.
    #[tokio::test]
    async fn sqlite_runs_a_call_without_a_temporary_btree() {
        let (_folder, connection) = super::super::sqlite::migrated().await;
        let transitions: [&'static LazyLock<Rendered>; 10] = [
            &AUTHORIZE_WAITING_SQL,
            &SETTLE_WAITING_SQL,
            &CLAIM_SQL,
            &MARK_EFFECT_SENT_SQL,
            &COMPLETE_SQL,
            &RELEASE_SQL,
            &SUSPEND_SQL,
            &COMPLETE_SUSPENDED_SQL,
            &TAKE_OVER_SQL,
            &REOPEN_APPROVAL_SQL,
        ];
        let statements = transitions
            .into_iter()
            .map(|rendered| rendered.sql(Dialect::Sqlite))
            .chain([
                SQLITE_INTENT,
                super::super::sqlite::INSERT_EVENT,
                SQLITE_BREAKER_COUNTS,
                SQLITE_TALLY,
                OPEN_RUN,
                RUN_OWNER,
                BY_ID,
                BY_KEY,
                INSERT_APPROVAL,
                INSERT_ARTIFACT,
                MARK_SYNTHESIS_ONLY_SQL.sql(Dialect::Sqlite),
            ]);
        let building: Vec<&str> = statements
            .filter(|statement| {
                super::super::sqlite::explained(&connection, "EXPLAIN", statement, 1)
                    .iter()
                    .any(|opcode| opcode == "OpenEphemeral")
            })
            .collect();
        assert!(building.is_empty(), "{building:#?}");
    }

    #[test]
    fn each_write_is_rendered_whole_from_the_table() {
        assert_eq!(
            write(Dialect::Sqlite, &CLAIM, true)
                .split(" RETURNING ")
                .next(),
            Some(
                "UPDATE tool_invocations SET status = 'running', started_at = $6, worker_id = $3, \
                 lease_epoch = lease_epoch + 1, attempt_number = CASE WHEN started_at IS NULL \
                 THEN attempt_number ELSE attempt_number + 1 END WHERE id = $1 AND tenant_id = $2 \
                 AND status = 'authorized' AND tool_invocations.worker_id = $3 \
                 AND tool_invocations.lease_epoch = $4"
            )
        );
        assert_eq!(
            write(Dialect::Postgres, &SUSPEND, false),
            "UPDATE tool_invocations SET suspended_kind = $6, suspended_ref = $7, worker_id = NULL \
             WHERE id = $1 AND tenant_id = $2 AND status = 'running' AND suspended_kind IS NULL \
             AND tool_invocations.worker_id = $3 AND tool_invocations.lease_epoch = $4"
        );
        assert!(
            write(Dialect::Postgres, &TAKE_OVER, true).contains("lease_expires_at < now()"),
            "PostgreSQL judges a lease by its own clock"
        );
        assert!(write(Dialect::Sqlite, &TAKE_OVER, true).contains("lease_expires_at >= $5"));
    }

    #[test]
    fn every_transition_sets_its_holder_and_guards_its_fence() {
        for transition in crate::domain::invocation::TRANSITIONS {
            for dialect in [Dialect::Postgres, Dialect::Sqlite] {
                let sql = write(dialect, &transition, false);
                let fenced = sql.contains("worker_id = $3 AND tool_invocations.lease_epoch = $4");
                assert_eq!(
                    fenced,
                    matches!(transition.guard, Guard::Fence | Guard::FenceAndLiveLease),
                    "{}",
                    transition.name
                );
                let claims = sql.contains("SET") && sql.contains("worker_id = $3, lease_epoch");
                assert_eq!(
                    claims,
                    transition.holder == Holder::Claims,
                    "{}",
                    transition.name
                );
                assert_eq!(
                    sql.contains("worker_id = NULL"),
                    transition.holder == Holder::LetsGo,
                    "{}",
                    transition.name
                );
            }
        }
    }
}
