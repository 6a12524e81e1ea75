//! The approvals, the events outbox, the review queue, the recorded
//! sessions, the console's sign-ins and the skills agents wrote, written
//! once for both backends as plans a [`Driver`] runs.

use chrono::{DateTime, Utc};
use std::sync::LazyLock;
use uuid::Uuid;

use super::invocations::{Driver, Events, Moved, Plan, Rendered, Run, Value};
use super::operator::Dialect;
use super::rows::{Columns, approval, authored_skill, console_sign_in, event_record, session_row};
use crate::domain::ApprovalStatus;
use crate::ports::{
    ApprovalRecord, ApprovalStore, AuthoredSkill, BoxFuture, ConsoleSignIn, ConsoleSignInStore,
    EventRecord, EventStore, PlatformEvent, QueueDepths, ReviewRecord, ReviewStore, SessionRecord,
    SessionStore, SkillStore, SkillWrite, SkillWritten, StoreError,
};

const APPROVAL: &str = concat!(
    "SELECT ",
    approval_columns!(),
    " FROM approvals WHERE id = $1 AND tenant_id = $2"
);

// A pending approval is decided once.
const DECIDE_APPROVAL: &str = concat!(
    "UPDATE approvals SET status = $3, approver = $4, decided_at = $5 \
     WHERE id = $1 AND tenant_id = $2 AND status = 'pending' RETURNING ",
    approval_columns!()
);

const RECORD_APPROVAL_HOLD: &str = "UPDATE approvals SET hold_ends_at = $3, \
     turn_id = coalesce($4, turn_id) WHERE id = $1 AND tenant_id = $2 AND status = 'pending'";

/// The event a decided approval records.
fn decided(row: &dyn Columns) -> Result<Events, StoreError> {
    let decided = approval(row)?;
    Ok(Events::platform(&PlatformEvent::ApprovalDecided {
        approval_id: decided.id,
        invocation_id: decided.invocation_id,
        status: decided.status,
        approver: decided.approver.unwrap_or_default(),
    }))
}

impl<D: Driver> ApprovalStore for D {
    fn approval<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
    ) -> BoxFuture<'a, Result<Option<ApprovalRecord>, StoreError>> {
        Box::pin(async move {
            let plan = Plan::read(tenant_id, APPROVAL, vec![id.into(), tenant_id.into()]);
            self.run(plan).await?.rows.first().map(approval).transpose()
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
            let values = vec![
                id.into(),
                tenant_id.into(),
                status.as_str().into(),
                approver.into(),
                now.into(),
            ];
            let mut plan = Plan::new(
                Some(tenant_id),
                Run::Flushed,
                Moved::Rows,
                DECIDE_APPROVAL,
                values,
            );
            plan.row_events = Some(decided);
            plan.now = Some(now);
            self.run(plan).await?.rows.first().map(approval).transpose()
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
            let values = vec![
                approval_id.into(),
                tenant_id.into(),
                hold_ends_at.into(),
                turn_id.into(),
            ];
            let sql = RECORD_APPROVAL_HOLD;
            let plan = Plan::new(Some(tenant_id), Run::Relaxed, Moved::Count, sql, values);
            Ok(self.run(plan).await?.count == 1)
        })
    }
}

const RECORD_EVENT: &str =
    "INSERT INTO events (tenant_id, event_type, payload, created_at) VALUES ($1, $2, $3, $4)";

// PostgreSQL assigns event ids before commit: a reader sees only the ids of
// transactions older than every one still open, so none is skipped by a
// later, lower id committing after it was read past.
static EVENTS_AFTER: LazyLock<Rendered> = LazyLock::new(|| {
    Rendered::of(|dialect| {
        let committed = match dialect {
            Dialect::Postgres => " AND txid < pg_snapshot_xmin(pg_current_snapshot())",
            Dialect::Sqlite => "",
        };
        let tenant = match dialect {
            Dialect::Postgres => "$3::text",
            Dialect::Sqlite => "$3",
        };
        format!(
            "SELECT id, tenant_id, event_type, payload, created_at FROM events \
             WHERE id > $1 AND ({tenant} IS NULL OR tenant_id = $3){committed} ORDER BY id LIMIT $2"
        )
    })
});

const QUEUE_DEPTHS: &str = "SELECT (SELECT count(*) FROM tool_invocations i \
     WHERE i.outcome_status = 'uncertain' AND NOT EXISTS (SELECT 1 FROM review_resolutions r \
     WHERE r.tenant_id = i.tenant_id AND r.invocation_id = i.id)) AS uncertain, \
     (SELECT count(*) FROM approvals WHERE status = 'pending') AS pending";

// Only an UNCERTAIN row of the tenant is resolved, once.
const RESOLVE_REVIEW: &str = "INSERT INTO review_resolutions (id, tenant_id, invocation_id, \
     resolution, resolver, note, resolved_at) SELECT $1, $2, $3, $4, $5, $6, $7 \
     WHERE EXISTS (SELECT 1 FROM tool_invocations WHERE tenant_id = $2 AND id = $3 \
     AND outcome_status = 'uncertain') ON CONFLICT (invocation_id) DO NOTHING";

impl<D: Driver> EventStore for D {
    fn record_event<'a>(
        &'a self,
        tenant_id: Option<&'a str>,
        event: &'a PlatformEvent,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let values = vec![
                tenant_id.into(),
                event.event_type().into(),
                Some(event.payload()).into(),
                now.into(),
            ];
            let plan = Plan::new(tenant_id, Run::Flushed, Moved::Count, RECORD_EVENT, values);
            self.run(plan).await.map(|_| ())
        })
    }

    fn events_after<'a>(
        &'a self,
        after: i64,
        limit: i64,
        tenant_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<EventRecord>, StoreError>> {
        Box::pin(async move {
            // A tenant's reader is scoped to its tenant (by row-level
            // security too, on PostgreSQL).
            let values = vec![after.into(), limit.into(), tenant_id.into()];
            let sql = EVENTS_AFTER.sql(D::DIALECT);
            let plan = Plan::new(tenant_id, Run::Read, Moved::Rows, sql, values);
            self.run(plan)
                .await?
                .rows
                .iter()
                .map(event_record)
                .collect()
        })
    }
}

impl<D: Driver> ReviewStore for D {
    fn queue_depths(&self) -> BoxFuture<'_, Result<QueueDepths, StoreError>> {
        Box::pin(async move {
            let plan = Plan::new(None, Run::Read, Moved::Rows, QUEUE_DEPTHS, Vec::new());
            let ran = self.run(plan).await?;
            let row = ran
                .rows
                .first()
                .ok_or_else(|| StoreError::Query("the queue depths returned no row".into()))?;
            Ok(QueueDepths {
                unresolved_uncertain: row.integer("uncertain")?,
                pending_approvals: row.integer("pending")?,
            })
        })
    }

    fn resolve_review<'a>(
        &'a self,
        tenant_id: &'a str,
        review: &'a ReviewRecord,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let values = vec![
                Uuid::new_v4().into(),
                tenant_id.into(),
                review.invocation_id.into(),
                review.resolution.as_str().into(),
                review.resolver.as_str().into(),
                review.note.as_deref().into(),
                review.resolved_at.into(),
            ];
            let event = PlatformEvent::ReviewResolved {
                invocation_id: review.invocation_id,
                resolution: review.resolution,
                resolver: review.resolver.clone(),
            };
            let plan = Plan::new(
                Some(tenant_id),
                Run::Flushed,
                Moved::Count,
                RESOLVE_REVIEW,
                values,
            )
            .with_events(Events::platform(&event), review.resolved_at);
            Ok(self.run(plan).await?.count == 1)
        })
    }
}

const OPEN_SESSION: &str = "INSERT INTO sessions (session_id, tenant_id, principal, agent, \
     tool_schema_sha256, tool_contract_sha256, opened_at, last_used_at, tool_names) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (session_id) DO NOTHING";

const SESSION_BY_ID: &str = concat!(
    "SELECT ",
    session_columns!(),
    " FROM sessions WHERE session_id = $1"
);

const TOUCH_SESSION: &str =
    "UPDATE sessions SET last_used_at = $2 WHERE session_id = $1 AND last_used_at < $2";

const END_SESSION: &str = "DELETE FROM sessions WHERE session_id = $1 AND tenant_id = $2";

const FORGET_SESSIONS: &str = "DELETE FROM sessions WHERE last_used_at < $1";

// The expired sign-ins go, and the oldest live ones past the newest
// `$2`, before one more is kept.
static PRUNE_SIGN_INS: LazyLock<Rendered> = LazyLock::new(|| {
    Rendered::of(|dialect| {
        let all = match dialect {
            Dialect::Postgres => "",
            Dialect::Sqlite => " LIMIT -1",
        };
        format!(
            "DELETE FROM console_sign_ins WHERE expires_at <= $1 OR cookie_sha256 IN (\
             SELECT cookie_sha256 FROM console_sign_ins WHERE expires_at > $1 \
             ORDER BY expires_at DESC{all} OFFSET $2)"
        )
    })
});

const SIGN_IN: &str = "INSERT INTO console_sign_ins (cookie_sha256, operator, signed_in_at, \
     expires_at) VALUES ($1, $2, $3, $4)";

const SIGNED_IN: &str = "SELECT cookie_sha256, operator, signed_in_at, expires_at \
     FROM console_sign_ins WHERE cookie_sha256 = $1 AND expires_at > $2";

const SIGN_OUT: &str = "DELETE FROM console_sign_ins WHERE cookie_sha256 = $1";

fn json<T: serde::Serialize>(value: &T) -> Result<Value, StoreError> {
    serde_json::to_value(value)
        .map(|json| Some(json).into())
        .map_err(|error| StoreError::Decode(error.to_string()))
}

impl<D: Driver> SessionStore for D {
    fn open_session<'a>(
        &'a self,
        session: &'a SessionRecord,
    ) -> BoxFuture<'a, Result<SessionRecord, StoreError>> {
        Box::pin(async move {
            let values = vec![
                session.session_id.into(),
                session.tenant_id.as_str().into(),
                json(&session.principal)?,
                json(&session.agent)?,
                session.tool_schema_sha256.as_str().into(),
                session.tool_contract_sha256.as_str().into(),
                session.opened_at.into(),
                session.last_used_at.into(),
                json(&session.tool_names)?,
            ];
            // Every tenant's rows: an id another tenant holds must be seen
            // to be refused, not inserted beside it. The row read back is
            // what was recorded first.
            let mut plan = Plan::new(None, Run::Flushed, Moved::Count, OPEN_SESSION, values)
                .then(SESSION_BY_ID, vec![session.session_id.into()]);
            plan.always = true;
            let ran = self.run(plan).await?;
            match ran.then.first().and_then(|rows| rows.first()) {
                Some(row) => session_row(row),
                None => Err(StoreError::Query("the session's row is gone".into())),
            }
        })
    }

    fn session(
        &self,
        session_id: Uuid,
    ) -> BoxFuture<'_, Result<Option<SessionRecord>, StoreError>> {
        Box::pin(async move {
            let plan = Plan::new(
                None,
                Run::Read,
                Moved::Rows,
                SESSION_BY_ID,
                vec![session_id.into()],
            );
            self.run(plan)
                .await?
                .rows
                .first()
                .map(session_row)
                .transpose()
        })
    }

    fn touch_session(
        &self,
        session_id: Uuid,
        now: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            // A use's time, refreshed at most hourly: nothing recovery reads.
            let values = vec![session_id.into(), now.into()];
            let plan = Plan::new(None, Run::Relaxed, Moved::Count, TOUCH_SESSION, values);
            self.run(plan).await.map(|_| ())
        })
    }

    fn end_session<'a>(
        &'a self,
        tenant_id: &'a str,
        session_id: Uuid,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let values = vec![session_id.into(), tenant_id.into()];
            let plan = Plan::new(
                Some(tenant_id),
                Run::Flushed,
                Moved::Count,
                END_SESSION,
                values,
            );
            Ok(self.run(plan).await?.count == 1)
        })
    }

    fn forget_sessions(&self, before: DateTime<Utc>) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            let plan = Plan::new(
                None,
                Run::Flushed,
                Moved::Count,
                FORGET_SESSIONS,
                vec![before.into()],
            );
            Ok(self.run(plan).await?.count)
        })
    }
}

impl<D: Driver> ConsoleSignInStore for D {
    fn sign_in<'a>(
        &'a self,
        sign_in: &'a ConsoleSignIn,
        maximum: usize,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let keep = i64::try_from(maximum.saturating_sub(1)).unwrap_or(i64::MAX);
            let pruned = vec![sign_in.signed_in_at.into(), keep.into()];
            let values = vec![
                sign_in.cookie_sha256.as_str().into(),
                sign_in.operator.as_str().into(),
                sign_in.signed_in_at.into(),
                sign_in.expires_at.into(),
            ];
            let prune = PRUNE_SIGN_INS.sql(D::DIALECT);
            let mut plan =
                Plan::new(None, Run::Flushed, Moved::Count, prune, pruned).then(SIGN_IN, values);
            plan.always = true;
            self.run(plan).await.map(|_| ())
        })
    }

    fn signed_in<'a>(
        &'a self,
        cookie_sha256: &'a str,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Option<ConsoleSignIn>, StoreError>> {
        Box::pin(async move {
            let values = vec![cookie_sha256.into(), now.into()];
            let plan = Plan::new(None, Run::Read, Moved::Rows, SIGNED_IN, values);
            self.run(plan)
                .await?
                .rows
                .first()
                .map(console_sign_in)
                .transpose()
        })
    }

    fn sign_out<'a>(&'a self, cookie_sha256: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let plan = Plan::new(
                None,
                Run::Flushed,
                Moved::Count,
                SIGN_OUT,
                vec![cookie_sha256.into()],
            );
            self.run(plan).await.map(|_| ())
        })
    }
}

// A new skill is inserted only where its name is free; a new version only
// over the same author's skill, and not again for the same key. What was
// there (read after, in the same transaction) tells why nothing was.
const CREATE_SKILL: &str = "INSERT INTO skills (tenant_id, name, description, body, \
     required_tools, version, author, written_by_key, created_at, updated_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9) ON CONFLICT (tenant_id, name) DO NOTHING";

const UPDATE_SKILL: &str = "UPDATE skills SET description = $3, body = $4, required_tools = $5, \
     version = $6, written_by_key = $8, updated_at = $9 \
     WHERE tenant_id = $1 AND name = $2 AND author = $7 AND written_by_key <> $8";

const SKILL_WRITER: &str =
    "SELECT written_by_key, author FROM skills WHERE tenant_id = $1 AND name = $2";

const DELETE_SKILL: &str = "DELETE FROM skills WHERE tenant_id = $1 AND name = $2 AND author = $3";

const SKILLS: &str = "SELECT name, description, body, required_tools, version, author, \
     written_by_key, created_at, updated_at FROM skills WHERE tenant_id = $1 ORDER BY name";

impl<D: Driver> SkillStore for D {
    fn put_skill<'a>(
        &'a self,
        tenant_id: &'a str,
        skill: &'a AuthoredSkill,
        mode: SkillWrite,
    ) -> BoxFuture<'a, Result<SkillWritten, StoreError>> {
        Box::pin(async move {
            let values = vec![
                tenant_id.into(),
                skill.name.as_str().into(),
                skill.description.as_str().into(),
                skill.body.as_str().into(),
                json(&skill.required_tools)?,
                skill.version.as_str().into(),
                skill.author.as_str().into(),
                skill.written_by_key.as_str().into(),
                skill.updated_at.into(),
            ];
            let sql = match mode {
                SkillWrite::Create => CREATE_SKILL,
                SkillWrite::Update => UPDATE_SKILL,
            };
            let name = vec![tenant_id.into(), skill.name.as_str().into()];
            let mut plan = Plan::new(Some(tenant_id), Run::Flushed, Moved::Count, sql, values)
                .then(SKILL_WRITER, name);
            plan.always = true;
            let ran = self.run(plan).await?;
            if ran.moved() {
                return Ok(SkillWritten::Written);
            }
            let current = match ran.then.first().and_then(|rows| rows.first()) {
                Some(row) => Some((row.text("written_by_key")?, row.text("author")?)),
                None => None,
            };
            Ok(match (current, mode) {
                (Some((key, _)), _) if key == skill.written_by_key => SkillWritten::Repeated,
                (Some(_), SkillWrite::Create) => SkillWritten::Exists,
                (Some(_), SkillWrite::Update) => SkillWritten::OtherAuthor,
                (None, _) => SkillWritten::Missing,
            })
        })
    }

    fn delete_skill<'a>(
        &'a self,
        tenant_id: &'a str,
        name: &'a str,
        author: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let values = vec![tenant_id.into(), name.into(), author.into()];
            let plan = Plan::new(
                Some(tenant_id),
                Run::Flushed,
                Moved::Count,
                DELETE_SKILL,
                values,
            );
            Ok(self.run(plan).await?.count == 1)
        })
    }

    fn skills<'a>(
        &'a self,
        tenant_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<AuthoredSkill>, StoreError>> {
        Box::pin(async move {
            let plan = Plan::read(tenant_id, SKILLS, vec![tenant_id.into()]);
            self.run(plan)
                .await?
                .rows
                .iter()
                .map(authored_skill)
                .collect()
        })
    }
}
