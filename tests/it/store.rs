//! One store suite, run against embedded SQLite always and against
//! PostgreSQL when `DATABASE_URL` is set (CI always sets it). Each PostgreSQL
//! run gets a schema of its own, dropped afterwards.

use std::collections::BTreeSet;
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use serde_json::json;
use sqlx::Connection;
use toolgate::adapters::store::{PostgresStore, SqliteStore};
use toolgate::domain::{
    ApprovalStatus, ArgumentTrust, Durability, IdempotencyClass, InvocationStatus, Principal,
    ReasonCode, SideEffectClass, SuspensionKind, ToolEventKind, ToolOutcomeStatus, ToolSource,
    TrustLevel,
};
use toolgate::ports::{
    CallIdentity, Claim, Fence, InsertOutcome, InvocationRecord, NewInvocation, Renewal, Schema,
    SessionRecord, Start, Store, TerminalRecord, ToolEvent, WorkerRegistration,
};
use uuid::Uuid;

/// A PostgreSQL schema that exists for one test, migrated by its owner (the
/// database's administrator) and used by a role of its own that is not a
/// superuser, does not bypass row-level security and owns nothing: what a
/// production deployment runs `serve` as.
pub struct PgSchema {
    admin_url: String,
    pub name: String,
    /// The role the store connects as.
    pub role: String,
    /// The schema as its owner sees it (migrations, inspection).
    pub owner_url: String,
    /// The schema as the store's role sees it.
    pub url: String,
}

/// Whether a test that needs PostgreSQL must fail rather than skip when
/// `DATABASE_URL` is unset (`CI=true`, or `TOOLGATE_REQUIRE_POSTGRES=1`).
fn postgres_required() -> bool {
    std::env::var("CI").is_ok_and(|value| value == "true")
        || std::env::var("TOOLGATE_REQUIRE_POSTGRES").is_ok_and(|value| value == "1")
}

/// `url` with its user replaced by `user` (trust authentication, no
/// password).
fn as_user(url: &str, user: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let host = rest.split_once('@').map_or(rest, |(_, host)| host);
    format!("{scheme}://{user}@{host}")
}

fn with_search_path(url: &str, schema: &str, extra: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}options=-c%20search_path%3D{schema}{extra}")
}

impl PgSchema {
    /// A fresh, migrated schema; `None` when `DATABASE_URL` is unset (and
    /// that is allowed).
    pub async fn create() -> Option<PgSchema> {
        PgSchema::create_with("").await
    }

    /// As [`PgSchema::create`], the store's sessions also given `options`
    /// (URL-encoded `-c` settings, each starting with `%20`).
    pub async fn create_with(options: &str) -> Option<PgSchema> {
        let Ok(admin_url) = std::env::var("DATABASE_URL") else {
            assert!(
                !postgres_required(),
                "DATABASE_URL is unset and this run requires PostgreSQL"
            );
            return None;
        };
        Some(PgSchema::create_on(admin_url, options).await)
    }

    /// As [`PgSchema::create_with`], on the server `admin_url` names.
    pub async fn create_on(admin_url: String, options: &str) -> PgSchema {
        let id = Uuid::new_v4().simple().to_string();
        let (name, role) = (format!("t_{id}"), format!("r_{id}"));
        let mut admin = sqlx::PgConnection::connect(&admin_url)
            .await
            .expect("DATABASE_URL connects");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE SCHEMA {name}; \
             CREATE ROLE {role} LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE; \
             GRANT USAGE ON SCHEMA {name} TO {role};"
        )))
        .execute(&mut admin)
        .await
        .expect("creates a schema and a role");
        let owner_url = with_search_path(&admin_url, &name, "");
        let owner = PostgresStore::connect(&owner_url)
            .await
            .expect("the owner connects");
        owner.migrate().await.expect("postgres migrates");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {name} TO {role}; \
             GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {name} TO {role}; \
             GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {name} TO {role};"
        )))
        .execute(&mut admin)
        .await
        .expect("grants the store's role its rows");
        let url = with_search_path(&as_user(&admin_url, &role), &name, options);
        PgSchema {
            admin_url,
            name,
            role,
            owner_url,
            url,
        }
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let (url, name, role) = (self.admin_url.clone(), self.name.clone(), self.role.clone());
        // Drop runs outside any async context; a thread with its own runtime
        // removes the schema even when the test failed.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                let mut admin = sqlx::PgConnection::connect(&url).await.ok()?;
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'; \
                     DROP SCHEMA IF EXISTS {name} CASCADE; DROP OWNED BY {role}; DROP ROLE IF EXISTS {role}"
                )))
                .execute(&mut admin)
                .await
                .ok()
            })
        })
        .join();
    }
}

/// The backends under test: SQLite in a temp folder, and PostgreSQL when
/// available. The guards keep the file and the schema alive.
pub struct Backends {
    pub stores: Vec<(&'static str, Arc<dyn Store>)>,
    _folder: tempfile::TempDir,
    pub postgres: Option<PgSchema>,
}

pub async fn backends() -> Backends {
    let folder = tempfile::tempdir().expect("temp folder");
    let url = format!("sqlite://{}", folder.path().join("toolgate.db").display());
    // Its leases are kept by the node's clock, which a test may advance.
    let clock = Arc::new(crate::support::TokioClock::new());
    let sqlite: Arc<dyn Store> = Arc::new(
        SqliteStore::connect_on(&url, clock)
            .await
            .expect("sqlite opens"),
    );
    sqlite.migrate().await.expect("sqlite migrates");
    let mut stores = vec![("sqlite", sqlite)];
    let postgres = PgSchema::create().await;
    if let Some(schema) = &postgres {
        let store: Arc<dyn Store> = Arc::new(
            PostgresStore::connect(&schema.url)
                .await
                .expect("postgres connects"),
        );
        stores.push(("postgres", store));
    } else {
        eprintln!("DATABASE_URL unset: PostgreSQL half of the store suite skipped");
    }
    Backends {
        stores,
        _folder: folder,
        postgres,
    }
}

pub fn now() -> DateTime<Utc> {
    // Whole microseconds, as both backends store them.
    DateTime::from_timestamp_micros(Utc::now().timestamp_micros()).expect("in range")
}

/// A worker of a node of its own, with a lease `lease` long on the store's
/// clock (a negative one is over already).
pub async fn worker(store: &dyn Store, lease: Duration) -> Uuid {
    let worker_id = Uuid::new_v4();
    store
        .register_worker(&WorkerRegistration {
            worker_id,
            node: worker_id.to_string(),
            host: "test".into(),
            lease: lease.to_std().unwrap_or_default(),
        })
        .await
        .expect("registers");
    worker_id
}

pub fn new_invocation(tenant: &str, run_id: Uuid, call_id: &str, start: Start) -> NewInvocation {
    NewInvocation {
        identity: CallIdentity {
            id: Uuid::new_v4(),
            tenant_id: tenant.into(),
            session_id: Uuid::new_v4(),
            run_id,
            step_number: 1,
            call_id: call_id.into(),
            tool_name: "demo.external_write".into(),
            tool_version: "1".into(),
            tool_source: ToolSource::Builtin,
            server_id: None,
            arguments: json!({"line": "secret customer text"}),
            arguments_hash: "ab".repeat(32),
            idempotency_key: format!("{tenant}:{run_id}:{call_id}"),
            idempotency_class: IdempotencyClass::NonIdempotent,
            side_effect: SideEffectClass::ExternalWrite,
            origin_trust: TrustLevel::User,
            argument_trust: ArgumentTrust::from_pointers([(
                "/line",
                TrustLevel::ExternalUntrusted,
            )])
            .expect("one label by pointer"),
            principal: Principal {
                id: "p1".into(),
                scopes: ["demo.use".to_owned()].into(),
            },
            parallel_group: None,
            deadline_at: Some(now() + Duration::seconds(60)),
        },
        start,
        durability: Durability::Flushed,
    }
}

pub fn event(kind: ToolEventKind, record: &NewInvocation) -> ToolEvent {
    record.identity.event(kind)
}

/// A row that waits for an approval asked with it.
pub fn waiting() -> Start {
    Start::Waiting {
        approval_id: Uuid::new_v4(),
        reason_code: ReasonCode::PolicyMatrixExternalWrite,
    }
}

/// `new` (waiting) inserted, then approved: AUTHORIZED under `owner`.
pub async fn authorized(store: &dyn Store, new: &NewInvocation, owner: Uuid) -> InvocationRecord {
    insert(store, new, owner).await;
    let claim = Claim {
        worker_id: owner,
        now: now(),
    };
    store
        .authorize_waiting(&new.identity.tenant_id, new.identity.id, claim, &[])
        .await
        .unwrap()
        .expect("authorized")
        .row
}

pub fn succeeded() -> TerminalRecord {
    TerminalRecord {
        outcome_status: ToolOutcomeStatus::Succeeded,
        reason_code: None,
        result: Some(json!({"content": [{"type": "text", "text": "ok"}]})),
        error: None,
        output_bytes: Some(2),
        truncated: false,
        artifact: None,
        produced: Vec::new(),
        // A read's result commit: the relaxed path of both stores.
        durability: Durability::Relaxed,
    }
}

/// A tenant's pending approvals, as the operator lists them.
pub async fn pending_of(store: &dyn Store, tenant: &str) -> Vec<toolgate::ports::ApprovalItem> {
    let filter = toolgate::ports::OperatorFilter {
        tenant_id: Some(tenant.into()),
        status: Some("pending".into()),
        ..Default::default()
    };
    store
        .list_approvals(&filter, toolgate::ports::PageRequest::default())
        .await
        .unwrap()
        .items
}

/// A tenant's review queue, as the operator lists it.
async fn queue_of(store: &dyn Store, tenant: &str) -> Vec<InvocationRecord> {
    let filter = toolgate::ports::OperatorFilter {
        tenant_id: Some(tenant.into()),
        status: Some("pending".into()),
        ..Default::default()
    };
    store
        .list_review_items(&filter, toolgate::ports::PageRequest::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|item| item.invocation)
        .collect()
}

pub async fn insert(store: &dyn Store, new: &NewInvocation, worker_id: Uuid) -> InvocationRecord {
    let events = [event(ToolEventKind::Authorized, new)];
    match store
        .insert_invocation(
            new,
            Claim {
                worker_id,
                now: now(),
            },
            &events,
        )
        .await
        .expect("inserts")
    {
        InsertOutcome::Inserted(record) => record,
        InsertOutcome::Existing(_) => panic!("a fresh key found an existing row"),
    }
}

#[tokio::test]
async fn migrations_apply_once() {
    let backends = backends().await;
    for (name, store) in &backends.stores {
        assert!(
            store.pending_migrations().await.unwrap().is_empty(),
            "{name}"
        );
        assert!(
            store.migrate().await.unwrap().is_empty(),
            "{name}: a second migrate applies nothing"
        );
    }
}

/// The record an intent returns is the row as it reads back, whichever
/// way it starts and on either store, its times to the microsecond as
/// both keep them (the claim's clock and the deadline here are finer).
#[tokio::test]
async fn an_intent_returns_its_row_as_it_reads_back() {
    let backends = backends().await;
    for (name, store) in &backends.stores {
        let worker_id = worker(store.as_ref(), Duration::seconds(30)).await;
        let starts = [
            Start::Running,
            waiting(),
            Start::Denied(ReasonCode::PolicyScopeMissing),
            Start::Ended(ReasonCode::ToolOutcomeUnknown),
        ];
        for (step, start) in starts.into_iter().enumerate() {
            let mut new =
                new_invocation("tenant-a", Uuid::new_v4(), &format!("call-{step}"), start);
            new.identity.arguments =
                json!({"line": "é\u{1F600}", "ratio": 0.1 + 0.2, "n": [1, -2, 3.5e-7]});
            new.identity.deadline_at = Some(Utc::now() + Duration::nanoseconds(60_000_000_123));
            new.identity.parallel_group = Some(Uuid::new_v4());
            let claim = Claim {
                worker_id,
                now: Utc::now() + Duration::nanoseconds(789),
            };
            let events = [event(ToolEventKind::Proposed, &new)];
            let returned = match store.insert_invocation(&new, claim, &events).await.unwrap() {
                InsertOutcome::Inserted(record) => record,
                InsertOutcome::Existing(_) => panic!("{name}: a fresh key found a row"),
            };
            let read = store
                .invocation("tenant-a", new.identity.id)
                .await
                .unwrap()
                .expect("the row reads back");
            assert_eq!(returned, read, "{name}: {start:?}");
        }
        let new = new_invocation("tenant-a", Uuid::new_v4(), "uncounted", Start::Running);
        let claim = Claim {
            worker_id,
            now: Utc::now() + Duration::nanoseconds(789),
        };
        let held = store
            .insert_uncounted(&new, claim, &[])
            .await
            .unwrap()
            .expect("nothing to count");
        let read = store
            .invocation("tenant-a", new.identity.id)
            .await
            .unwrap()
            .expect("the row reads back");
        assert_eq!(held.row, read, "{name}: uncounted");
    }
}

#[tokio::test]
async fn insert_deduplicates_on_the_key() {
    let backends = backends().await;
    for (name, store) in &backends.stores {
        let worker_id = worker(store.as_ref(), Duration::seconds(30)).await;
        let new = new_invocation("tenant-a", Uuid::new_v4(), "call-1", Start::Running);
        let record = insert(store.as_ref(), &new, worker_id).await;
        assert_eq!(record.status(), InvocationStatus::Running, "{name}");
        assert_eq!(record.attempt_number, 1);
        assert_eq!(
            record.fence(),
            Some(Fence {
                worker_id,
                lease_epoch: 0
            })
        );
        assert_eq!(record.identity.arguments, new.identity.arguments);
        assert_eq!(record.identity.principal, new.identity.principal);
        assert_eq!(
            record.identity.argument_trust, new.identity.argument_trust,
            "{name}"
        );

        let mut again = new.clone();
        again.identity.id = Uuid::new_v4();
        let events = [event(ToolEventKind::Authorized, &again)];
        let outcome = store
            .insert_invocation(
                &again,
                Claim {
                    worker_id,
                    now: now(),
                },
                &events,
            )
            .await
            .unwrap();
        assert_eq!(outcome, InsertOutcome::Existing(record.clone()), "{name}");

        // The same key in another tenant is that tenant's own call: a row of
        // its own, and the first tenant's row is neither shown nor touched.
        let mut foreign = new.clone();
        foreign.identity.id = Uuid::new_v4();
        foreign.identity.tenant_id = "tenant-b".into();
        let outcome = store
            .insert_invocation(
                &foreign,
                Claim {
                    worker_id,
                    now: now(),
                },
                &events,
            )
            .await
            .unwrap();
        let InsertOutcome::Inserted(theirs) = outcome else {
            panic!("{name}: another tenant's key is its own: {outcome:?}");
        };
        assert_eq!(theirs.identity.id, foreign.identity.id, "{name}");
        assert_eq!(theirs.identity.tenant_id, "tenant-b", "{name}");
        assert_eq!(
            store.invocation("tenant-a", new.identity.id).await.unwrap(),
            Some(record.clone()),
            "{name}"
        );

        // One authorized event per tenant's row, neither with the arguments.
        let events = events_settled(store.as_ref(), 2).await;
        let mine: Vec<_> = events
            .iter()
            .filter(|e| e.payload["invocation_id"] == json!(new.identity.id))
            .collect();
        assert_eq!(mine.len(), 1, "{name}");
        assert_eq!(mine[0].event_type, "tool.call.authorized");
        assert!(
            !mine[0].payload.to_string().contains("secret customer text"),
            "{name}"
        );
    }
}

/// A commit's events each keep their whole body, in their order: a running
/// intent's three, which say the same but for their kind, and three whose
/// first says something else.
#[tokio::test]
async fn a_commits_events_each_keep_their_body_in_order() {
    let backends = backends().await;
    for (name, store) in &backends.stores {
        let worker_id = worker(store.as_ref(), Duration::seconds(30)).await;
        let kinds = [
            ToolEventKind::Proposed,
            ToolEventKind::Authorized,
            ToolEventKind::Started,
        ];
        let same = new_invocation("tenant-a", Uuid::new_v4(), "c-same", Start::Running);
        let mixed = new_invocation("tenant-a", Uuid::new_v4(), "c-mixed", Start::Running);
        let mut mixed_events = kinds.map(|kind| event(kind, &mixed));
        mixed_events[0].effect_sent = true;
        let mut recorded = 0;
        for (new, events) in [
            (&same, kinds.map(|kind| event(kind, &same))),
            (&mixed, mixed_events),
        ] {
            let claim = Claim {
                worker_id,
                now: now(),
            };
            store.insert_invocation(new, claim, &events).await.unwrap();
            recorded += events.len();
            let written: Vec<_> = events_settled(store.as_ref(), recorded)
                .await
                .into_iter()
                .filter(|written| written.payload["invocation_id"] == json!(new.identity.id))
                .map(|written| (written.event_type, written.payload))
                .collect();
            let expected: Vec<_> = events
                .iter()
                .map(|event| {
                    (
                        event.kind.as_str().to_owned(),
                        serde_json::to_value(event).unwrap(),
                    )
                })
                .collect();
            assert_eq!(written, expected, "{name}");
        }
    }
}

#[tokio::test]
async fn claim_watermark_and_completion_are_fenced() {
    let backends = backends().await;
    for (name, store) in &backends.stores {
        let worker_id = worker(store.as_ref(), Duration::seconds(30)).await;
        let new = new_invocation("tenant-a", Uuid::new_v4(), "call-1", waiting());
        let record = authorized(store.as_ref(), &new, worker_id).await;
        let inserted_fence = record.fence().unwrap();
        let started = [event(ToolEventKind::Started, &new)];

        let running = store
            .claim_invocation(
                "tenant-a",
                new.identity.id,
                inserted_fence,
                now(),
                &started,
                Durability::Relaxed,
            )
            .await
            .unwrap()
            .expect("claims");
        assert_eq!(running.status(), InvocationStatus::Running, "{name}");
        assert_eq!(running.attempt_number, 1);
        let fence = running.fence().unwrap();
        assert_eq!(fence.lease_epoch, inserted_fence.lease_epoch + 1);
        // A second claim, or one under the old fence, changes nothing.
        assert!(
            store
                .claim_invocation(
                    "tenant-a",
                    new.identity.id,
                    inserted_fence,
                    now(),
                    &started,
                    Durability::Flushed
                )
                .await
                .unwrap()
                .is_none()
        );
        assert!(
            store
                .claim_invocation(
                    "tenant-a",
                    new.identity.id,
                    fence,
                    now(),
                    &started,
                    Durability::Flushed
                )
                .await
                .unwrap()
                .is_none()
        );

        // The watermark is set once and keeps its first value.
        let first = now();
        assert!(
            store
                .mark_effect_sent(
                    "tenant-a",
                    new.identity.id,
                    fence,
                    first,
                    Durability::Flushed
                )
                .await
                .unwrap(),
            "{name}"
        );
        assert!(
            store
                .mark_effect_sent(
                    "tenant-a",
                    new.identity.id,
                    fence,
                    first + Duration::seconds(5),
                    Durability::Relaxed
                )
                .await
                .unwrap()
        );
        let row = store
            .invocation("tenant-a", new.identity.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(row.effect_sent_at, Some(first), "{name}");
        // Under a stale fence the watermark is refused: the tool must not start.
        assert!(
            !store
                .mark_effect_sent(
                    "tenant-a",
                    new.identity.id,
                    inserted_fence,
                    now(),
                    Durability::Flushed
                )
                .await
                .unwrap()
        );
        // Another tenant cannot touch the row.
        assert!(
            !store
                .mark_effect_sent(
                    "tenant-b",
                    new.identity.id,
                    fence,
                    now(),
                    Durability::Relaxed
                )
                .await
                .unwrap()
        );

        let completed = [event(ToolEventKind::Completed, &new)];
        assert!(
            !store
                .complete_invocation(
                    "tenant-a",
                    new.identity.id,
                    inserted_fence,
                    &succeeded(),
                    &completed,
                    now()
                )
                .await
                .unwrap()
        );
        assert!(
            !store
                .complete_invocation(
                    "tenant-b",
                    new.identity.id,
                    fence,
                    &succeeded(),
                    &completed,
                    now()
                )
                .await
                .unwrap()
        );
        assert!(
            store
                .complete_invocation(
                    "tenant-a",
                    new.identity.id,
                    fence,
                    &succeeded(),
                    &completed,
                    now()
                )
                .await
                .unwrap()
        );
        assert!(
            !store
                .complete_invocation(
                    "tenant-a",
                    new.identity.id,
                    fence,
                    &succeeded(),
                    &completed,
                    now()
                )
                .await
                .unwrap(),
            "{name}: terminal is final"
        );
        let row = store
            .invocation("tenant-a", new.identity.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(row.status(), InvocationStatus::Succeeded);
        assert_eq!(row.outcome_status(), Some(ToolOutcomeStatus::Succeeded));
        assert_eq!(row.ended().unwrap().result, succeeded().result);
        assert_eq!(row.ended().unwrap().output_bytes, Some(2));
        assert!(row.ended().is_some());
    }
}

/// A read's intent and claim in one relaxed commit: the row is RUNNING from
/// its insert, started, under the inserter's epoch-0 fence; it completes
/// under that fence, and a dead inserter's row is recovered like any
/// claimed one.
#[tokio::test]
async fn a_read_is_inserted_claimed_in_one_commit() {
    let backends = backends().await;
    for (name, store) in &backends.stores {
        let dead = worker(store.as_ref(), Duration::milliseconds(-1)).await;
        let live = worker(store.as_ref(), Duration::seconds(60)).await;
        let run_id = Uuid::new_v4();
        let read = |call: &str| {
            let mut new = new_invocation("tenant-a", run_id, call, Start::Running);
            new.identity.tool_name = "demo.echo".into();
            new.identity.idempotency_class = IdempotencyClass::ReadOnly;
            new.identity.side_effect = SideEffectClass::None;
            new.durability = Durability::Relaxed;
            new
        };
        let new = read("r1");
        let row = insert(store.as_ref(), &new, live).await;
        assert_eq!(row.status(), InvocationStatus::Running, "{name}");
        assert!(row.started_at.is_some(), "{name}: started with its insert");
        assert_eq!((row.attempt_number, row.lease_epoch), (1, 0), "{name}");
        let fence = row.fence().unwrap();
        assert!(
            store
                .complete_invocation("tenant-a", new.identity.id, fence, &succeeded(), &[], now())
                .await
                .unwrap(),
            "{name}: completes under the insert's fence"
        );
        // A dead inserter's read is taken over, its attempt counted again.
        let orphan = read("r2");
        insert(store.as_ref(), &orphan, dead).await;
        let taken = store
            .claim_expired(
                Claim {
                    worker_id: live,
                    now: now(),
                },
                10,
            )
            .await
            .unwrap();
        let taken: Vec<&InvocationRecord> = taken
            .iter()
            .map(|held| &held.row)
            .filter(|r| r.identity.id == orphan.identity.id)
            .collect();
        assert_eq!(taken.len(), 1, "{name}");
        assert_eq!(taken[0].attempt_number, 2, "{name}");
    }
}

/// The run's last succeeded call of one tool, read alone: a later failure,
/// another tool, another run and another tenant's row are not it.
#[tokio::test]
async fn the_latest_succeeded_call_of_a_tool_is_read_alone() {
    let backends = backends().await;
    for (name, store) in &backends.stores {
        let live = worker(store.as_ref(), Duration::seconds(60)).await;
        let run_id = Uuid::new_v4();
        let ended = |tenant: &str, run_id: Uuid, call: &str, step: i64, tool: &str| {
            let mut new = new_invocation(tenant, run_id, call, Start::Running);
            new.identity.tool_name = tool.into();
            new.identity.step_number = step;
            new
        };
        let mut ids = Vec::new();
        for (tenant, run, call, step, tool, outcome) in [
            (
                "tenant-a",
                run_id,
                "c1",
                1,
                "demo.state",
                InvocationStatus::Succeeded,
            ),
            (
                "tenant-a",
                run_id,
                "c2",
                2,
                "demo.state",
                InvocationStatus::Succeeded,
            ),
            (
                "tenant-a",
                run_id,
                "c3",
                3,
                "demo.state",
                InvocationStatus::Failed,
            ),
            (
                "tenant-a",
                run_id,
                "c4",
                4,
                "demo.other",
                InvocationStatus::Succeeded,
            ),
            (
                "tenant-a",
                Uuid::new_v4(),
                "c5",
                5,
                "demo.state",
                InvocationStatus::Succeeded,
            ),
            (
                "tenant-b",
                run_id,
                "c6",
                6,
                "demo.state",
                InvocationStatus::Succeeded,
            ),
        ] {
            let new = ended(tenant, run, call, step, tool);
            let row = insert(store.as_ref(), &new, live).await;
            let terminal = match outcome {
                InvocationStatus::Succeeded => succeeded(),
                _ => TerminalRecord {
                    outcome_status: ToolOutcomeStatus::Failed,
                    reason_code: Some(ReasonCode::ToolUpstreamError),
                    result: None,
                    ..succeeded()
                },
            };
            assert!(
                store
                    .complete_invocation(
                        tenant,
                        new.identity.id,
                        row.fence().unwrap(),
                        &terminal,
                        &[],
                        now()
                    )
                    .await
                    .unwrap(),
                "{name}"
            );
            ids.push(new.identity.id);
        }
        let latest = store
            .latest_succeeded("tenant-a", run_id, "demo.state")
            .await
            .unwrap();
        assert_eq!(latest.map(|row| row.identity.id), Some(ids[1]), "{name}");
        let none = store
            .latest_succeeded("tenant-b", Uuid::new_v4(), "demo.state")
            .await
            .unwrap();
        assert!(none.is_none(), "{name}");
        let own = store
            .latest_succeeded("tenant-b", run_id, "demo.state")
            .await
            .unwrap();
        assert_eq!(
            own.map(|row| row.identity.id),
            Some(ids[5]),
            "{name}: only its own"
        );
    }
}

/// The breaker's evidence and restarts are kept per tenant: two tenants
/// with the same run id, tool and arguments each record their own evidence
/// key, restart on their own budget, and read their own evidence base; one
/// tenant's rows neither collide with nor count for the other's.
#[tokio::test]
async fn the_breakers_evidence_and_restarts_are_kept_per_tenant() {
    let backends = backends().await;
    for (name, store) in &backends.stores {
        let live = worker(store.as_ref(), Duration::seconds(60)).await;
        let run_id = Uuid::new_v4();
        let hash = "ab".repeat(32);
        let tool = "demo.external_write";
        // Three successful identical calls of the same run id in each tenant.
        for tenant in ["tenant-a", "tenant-b"] {
            for step in 1..=3 {
                let mut new = new_invocation(tenant, run_id, &format!("c{step}"), Start::Running);
                new.identity.step_number = step;
                let row = insert(store.as_ref(), &new, live).await;
                assert!(
                    store
                        .complete_invocation(
                            tenant,
                            new.identity.id,
                            row.fence().unwrap(),
                            &succeeded(),
                            &[],
                            now()
                        )
                        .await
                        .unwrap(),
                    "{name}"
                );
            }
        }
        let base = |tenant: &'static str| {
            let store = store.clone();
            let hash = hash.clone();
            async move {
                store
                    .breaker_tally(tenant, run_id, tool, &hash)
                    .await
                    .unwrap()
                    .evidence_base
            }
        };
        // The first key of each tenant is its own row, not a collision.
        for tenant in ["tenant-a", "tenant-b"] {
            let restarted = store
                .record_evidence(tenant, run_id, tool, &hash, "k1", 1)
                .await
                .unwrap_or_else(|failure| panic!("{name}: {tenant}'s first key: {failure}"));
            assert!(!restarted, "{name}: {tenant}");
        }
        // Tenant A's new evidence restarts its count and uses its one restart.
        assert!(
            store
                .record_evidence("tenant-a", run_id, tool, &hash, "k2", 1)
                .await
                .unwrap(),
            "{name}: tenant-a restarts"
        );
        assert_eq!(base("tenant-a").await, 2, "{name}: tenant-a's base");
        assert_eq!(
            base("tenant-b").await,
            0,
            "{name}: tenant-a's evidence counts for tenant-b"
        );
        // Tenant B's restart budget is its own: A's restart does not use it.
        let restarted = store
            .record_evidence("tenant-b", run_id, tool, &hash, "k2", 1)
            .await
            .unwrap_or_else(|failure| panic!("{name}: tenant-b's restart: {failure}"));
        assert!(
            restarted,
            "{name}: tenant-b restarts on a budget of its own"
        );
        assert_eq!(base("tenant-b").await, 2, "{name}: tenant-b's base");
        assert_eq!(base("tenant-a").await, 2, "{name}: tenant-a's base");
        // Tenant A's budget is spent: two more successes and new evidence do
        // not restart it again, nor does tenant B's restart give it one.
        for step in 4..=5 {
            let mut new = new_invocation("tenant-a", run_id, &format!("c{step}"), Start::Running);
            new.identity.step_number = step;
            let row = insert(store.as_ref(), &new, live).await;
            store
                .complete_invocation(
                    "tenant-a",
                    new.identity.id,
                    row.fence().unwrap(),
                    &succeeded(),
                    &[],
                    now(),
                )
                .await
                .unwrap();
        }
        assert!(
            !store
                .record_evidence("tenant-a", run_id, tool, &hash, "k3", 1)
                .await
                .unwrap(),
            "{name}: tenant-a has no restart left"
        );
        assert_eq!(base("tenant-a").await, 2, "{name}: tenant-a's base");
        assert_eq!(base("tenant-b").await, 2, "{name}: tenant-b's base");
    }
}

/// An uncounted insert goes in only while the breaker has nothing to count:
/// no identical call of the run (same tenant, run, tool and arguments hash)
/// with an outcome. A running identical call is not counted; another run,
/// another tool, other arguments or another tenant are not identical. When
/// it does not go in, nothing of it is written (row, events), and a held key
/// is never answered from.
#[tokio::test]
async fn an_uncounted_insert_goes_in_only_while_the_breaker_has_nothing_to_count() {
    let backends = backends().await;
    for (name, store) in &backends.stores {
        let live = worker(store.as_ref(), Duration::seconds(60)).await;
        let run_id = Uuid::new_v4();
        let uncounted = |new: NewInvocation| {
            let store = store.clone();
            async move {
                let events = [event(ToolEventKind::Started, &new)];
                let claim = Claim {
                    worker_id: live,
                    now: now(),
                };
                let row = store.insert_uncounted(&new, claim, &events).await.unwrap();
                (new, row)
            }
        };
        let call = |tenant: &str, run_id: Uuid, call: &str| {
            new_invocation(tenant, run_id, call, Start::Running)
        };

        let (first, row) = uncounted(call("tenant-a", run_id, "c1")).await;
        let row = row.unwrap_or_else(|| panic!("{name}: the first call goes in"));
        assert_eq!(row.identity.id, first.identity.id, "{name}");
        assert_eq!(row.status(), InvocationStatus::Running, "{name}");
        assert_eq!(
            row.fence(),
            Some(Fence {
                worker_id: live,
                lease_epoch: 0
            }),
            "{name}: inserted claimed"
        );
        // Still running: nothing the breaker counts.
        let (second, row) = uncounted(call("tenant-a", run_id, "c2")).await;
        assert!(
            row.is_some(),
            "{name}: a running identical call is not counted"
        );
        // Its key is held, and a held key is never answered from (nor its
        // row started again): nothing comes back, and the caller inserts as
        // usual.
        let mut again = second.clone();
        again.identity.id = Uuid::new_v4();
        let (held, row) = uncounted(again).await;
        assert!(row.is_none(), "{name}: a held key");
        assert!(
            store
                .invocation("tenant-a", held.identity.id)
                .await
                .unwrap()
                .is_none(),
            "{name}"
        );

        assert!(
            store
                .complete_invocation(
                    "tenant-a",
                    first.identity.id,
                    Fence {
                        worker_id: live,
                        lease_epoch: 0
                    },
                    &succeeded(),
                    &[],
                    now()
                )
                .await
                .unwrap(),
            "{name}"
        );
        let (refused, row) = uncounted(call("tenant-a", run_id, "c3")).await;
        assert!(row.is_none(), "{name}: an identical call has an outcome");
        assert!(
            store
                .invocation("tenant-a", refused.identity.id)
                .await
                .unwrap()
                .is_none(),
            "{name}: no row written"
        );
        let mut other_arguments = call("tenant-a", run_id, "c4");
        other_arguments.identity.arguments_hash = "cd".repeat(32);
        let mut other_tool = call("tenant-a", run_id, "c5");
        other_tool.identity.tool_name = "demo.other".into();
        for (what, new) in [
            ("other arguments", other_arguments),
            ("another tool", other_tool),
            ("another run", call("tenant-a", Uuid::new_v4(), "c6")),
            ("another tenant", call("tenant-b", run_id, "c7")),
        ] {
            let (new, row) = uncounted(new).await;
            assert_eq!(
                row.map(|row| row.identity.id),
                Some(new.identity.id),
                "{name}: {what}"
            );
        }
        // Six rows went in (c1, c2 and the four above), each with its one
        // event; the two that did not go in wrote none.
        let events = events_settled(store.as_ref(), 6).await;
        assert_eq!(events.len(), 6, "{name}");
        assert!(
            events.iter().all(|event| {
                let id = event.payload["invocation_id"].as_str().unwrap_or_default();
                id != refused.identity.id.to_string() && id != held.identity.id.to_string()
            }),
            "{name}: no event of a call that did not go in"
        );
    }
}

#[tokio::test]
async fn denials_are_terminal_rows() {
    let backends = backends().await;
    for (name, store) in &backends.stores {
        let worker_id = worker(store.as_ref(), Duration::seconds(30)).await;
        let new = new_invocation(
            "tenant-a",
            Uuid::new_v4(),
            "call-1",
            Start::Denied(ReasonCode::PolicyScopeMissing),
        );
        let record = insert(store.as_ref(), &new, worker_id).await;
        assert_eq!(record.status(), InvocationStatus::Denied, "{name}");
        assert_eq!(record.outcome_status(), Some(ToolOutcomeStatus::Denied));
        assert_eq!(record.reason_code, Some(ReasonCode::PolicyScopeMissing));
        assert!(record.ended().is_some());
        let fence = Fence {
            worker_id,
            lease_epoch: record.lease_epoch,
        };
        assert!(
            store
                .claim_invocation(
                    "tenant-a",
                    new.identity.id,
                    fence,
                    now(),
                    &[],
                    Durability::Flushed
                )
                .await
                .unwrap()
                .is_none()
        );
    }
}

#[tokio::test]
async fn approvals_wait_resume_and_settle() {
    let backends = backends().await;
    for (name, store) in &backends.stores {
        let worker_id = worker(store.as_ref(), Duration::seconds(30)).await;
        let run_id = Uuid::new_v4();
        let approved = new_invocation("tenant-a", run_id, "call-1", waiting());
        let denied = new_invocation("tenant-a", run_id, "call-2", waiting());
        insert(store.as_ref(), &approved, worker_id).await;
        insert(store.as_ref(), &denied, worker_id).await;

        let pending = pending_of(store.as_ref(), "tenant-a").await;
        assert_eq!(pending.len(), 2, "{name}");
        assert!(
            pending_of(store.as_ref(), "tenant-b").await.is_empty(),
            "{name}"
        );
        assert_eq!(pending[0].status, ApprovalStatus::Pending);

        let approval_id = approved.start.approval_id().unwrap();
        let decision = store
            .decide_approval(
                "tenant-a",
                approval_id,
                ApprovalStatus::Approved,
                "ops@example.com",
                now(),
            )
            .await
            .unwrap()
            .expect("decided");
        assert_eq!(decision.approver.as_deref(), Some("ops@example.com"));
        assert!(
            store
                .decide_approval(
                    "tenant-a",
                    approval_id,
                    ApprovalStatus::Denied,
                    "late",
                    now()
                )
                .await
                .unwrap()
                .is_none(),
            "{name}: decided once"
        );
        assert!(
            store
                .approval("tenant-b", approval_id)
                .await
                .unwrap()
                .is_none(),
            "{name}"
        );

        // Another worker resumes the approved call.
        let resumer = worker(store.as_ref(), Duration::seconds(30)).await;
        let events = [event(ToolEventKind::Authorized, &approved)];
        let resumed = store
            .authorize_waiting(
                "tenant-a",
                approved.identity.id,
                Claim {
                    worker_id: resumer,
                    now: now(),
                },
                &events,
            )
            .await
            .unwrap()
            .expect("resumes");
        assert_eq!(resumed.status(), InvocationStatus::Authorized);
        assert_eq!(
            resumed.fence(),
            Some(Fence {
                worker_id: resumer,
                lease_epoch: 1
            })
        );
        assert!(
            store
                .authorize_waiting(
                    "tenant-a",
                    approved.identity.id,
                    Claim {
                        worker_id: resumer,
                        now: now()
                    },
                    &events
                )
                .await
                .unwrap()
                .is_none()
        );

        store
            .decide_approval(
                "tenant-a",
                denied.start.approval_id().unwrap(),
                ApprovalStatus::Denied,
                "ops",
                now(),
            )
            .await
            .unwrap();
        let terminal = TerminalRecord {
            outcome_status: ToolOutcomeStatus::Denied,
            reason_code: Some(ReasonCode::PolicyApprovalDenied),
            result: None,
            error: None,
            output_bytes: None,
            truncated: false,
            artifact: None,
            produced: Vec::new(),
            durability: Durability::Flushed,
        };
        assert!(
            store
                .settle_waiting("tenant-a", denied.identity.id, &terminal, &[], now())
                .await
                .unwrap(),
            "{name}"
        );
        assert!(
            !store
                .settle_waiting("tenant-a", denied.identity.id, &terminal, &[], now())
                .await
                .unwrap()
        );
        let rows = store.run_invocations("tenant-a", run_id).await.unwrap();
        let statuses: Vec<InvocationStatus> = rows.iter().map(|r| r.status()).collect();
        assert_eq!(
            statuses,
            vec![InvocationStatus::Authorized, InvocationStatus::Denied],
            "{name}"
        );
    }
}

#[tokio::test]
async fn recovery_takes_only_rows_of_dead_workers() {
    let backends = backends().await;
    for (name, store) in &backends.stores {
        let dead = worker(store.as_ref(), Duration::milliseconds(-1)).await;
        let live = worker(store.as_ref(), Duration::seconds(60)).await;
        let released = worker(store.as_ref(), Duration::seconds(60)).await;
        let run_id = Uuid::new_v4();
        let mut running_dead = None;
        let mut expected = BTreeSet::new();
        for (call, owner, claim) in [
            ("a", dead, true),
            ("b", dead, false),
            ("c", live, true),
            ("d", released, true),
        ] {
            // A claimed row is inserted running, as a call's intent is; the
            // other stays authorized.
            let start = if claim { Start::Running } else { waiting() };
            let new = new_invocation("tenant-a", run_id, call, start);
            if claim {
                insert(store.as_ref(), &new, owner).await;
            } else {
                authorized(store.as_ref(), &new, owner).await;
            }
            if owner != live {
                expected.insert(new.identity.id);
            }
            if call == "a" {
                running_dead = Some(new.identity.id);
            }
        }
        store.release_worker(released).await.unwrap();
        let minute = std::time::Duration::from_secs(60);
        assert_eq!(
            store.heartbeat(released, minute).await.unwrap(),
            Renewal::Lost,
            "{name}: released stays released"
        );
        assert!(matches!(
            store.heartbeat(live, minute).await.unwrap(),
            Renewal::Renewed { .. }
        ));
        assert_eq!(
            store.heartbeat(dead, minute).await.unwrap(),
            Renewal::Lost,
            "{name}: a lease that ran out is not revived"
        );

        let sweeper = worker(store.as_ref(), Duration::seconds(60)).await;
        let taken = store
            .claim_expired(
                Claim {
                    worker_id: sweeper,
                    now: now(),
                },
                100,
            )
            .await
            .unwrap();
        let ids: BTreeSet<Uuid> = taken
            .iter()
            .filter(|r| r.identity.run_id == run_id)
            .map(|r| r.identity.id)
            .collect();
        assert_eq!(ids, expected, "{name}");
        let a = taken
            .iter()
            .find(|r| Some(r.identity.id) == running_dead)
            .unwrap();
        assert_eq!(a.status(), InvocationStatus::Running);
        assert_eq!(
            a.fence(),
            Some(Fence {
                worker_id: sweeper,
                lease_epoch: 1
            })
        );
        assert_eq!(
            a.attempt_number, 2,
            "{name}: a recovered execution is a new attempt"
        );
        // The dead worker's late completion changes nothing.
        let stale = Fence {
            worker_id: dead,
            lease_epoch: 0,
        };
        assert!(
            !store
                .complete_invocation("tenant-a", a.identity.id, stale, &succeeded(), &[], now())
                .await
                .unwrap()
        );
        // Taken rows belong to a live lease now: a second sweep finds nothing of them.
        let again = store
            .claim_expired(
                Claim {
                    worker_id: Uuid::new_v4(),
                    now: now(),
                },
                100,
            )
            .await
            .unwrap();
        assert!(again.iter().all(|r| r.identity.run_id != run_id), "{name}");
    }
}

#[tokio::test]
async fn tenants_cannot_read_each_other() {
    let backends = backends().await;
    for (name, store) in &backends.stores {
        let worker_id = worker(store.as_ref(), Duration::seconds(30)).await;
        let run_id = Uuid::new_v4();
        let new = new_invocation("tenant-a", run_id, "call-1", Start::Running);
        insert(store.as_ref(), &new, worker_id).await;
        assert!(
            store
                .invocation("tenant-a", new.identity.id)
                .await
                .unwrap()
                .is_some(),
            "{name}"
        );
        assert!(
            store
                .invocation("tenant-b", new.identity.id)
                .await
                .unwrap()
                .is_none(),
            "{name}"
        );
        assert!(
            store
                .run_invocations("tenant-b", run_id)
                .await
                .unwrap()
                .is_empty(),
            "{name}"
        );
    }
}

/// Row-level security on its own: a role that is not a superuser, with the
/// tenant setting and no WHERE clause, sees only its tenant's rows.
#[tokio::test]
async fn postgres_row_level_security_isolates_tenants() {
    let backends = backends().await;
    let Some(schema) = &backends.postgres else {
        eprintln!("DATABASE_URL unset: row-level security test skipped");
        return;
    };
    let store = &backends
        .stores
        .iter()
        .find(|(name, _)| *name == "postgres")
        .unwrap()
        .1;
    let worker_id = worker(store.as_ref(), Duration::seconds(30)).await;
    for tenant in ["tenant-a", "tenant-b"] {
        insert(
            store.as_ref(),
            &new_invocation(tenant, Uuid::new_v4(), "call", Start::Running),
            worker_id,
        )
        .await;
    }
    let mut connection = sqlx::PgConnection::connect(&schema.owner_url)
        .await
        .unwrap();
    let role = format!("{}_reader", schema.name);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE {role} NOLOGIN; GRANT USAGE ON SCHEMA {s} TO {role}; \
         GRANT SELECT ON ALL TABLES IN SCHEMA {s} TO {role};",
        s = schema.name
    )))
    .execute(&mut connection)
    .await
    .unwrap();
    let mut tx = connection.begin().await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("SET LOCAL ROLE {role}")))
        .execute(&mut *tx)
        .await
        .unwrap();
    let mut seen = Vec::new();
    for tenant in ["tenant-a", "tenant-b", "nobody"] {
        sqlx::query("SELECT set_config('toolgate.tenant_id', $1, true)")
            .bind(tenant)
            .execute(&mut *tx)
            .await
            .unwrap();
        let tenants: Vec<(String,)> =
            sqlx::query_as("SELECT DISTINCT tenant_id FROM tool_invocations")
                .fetch_all(&mut *tx)
                .await
                .unwrap();
        seen.push(tenants.into_iter().map(|(t,)| t).collect::<Vec<_>>());
    }
    assert_eq!(
        seen,
        vec![
            vec!["tenant-a".to_owned()],
            vec!["tenant-b".to_owned()],
            vec![]
        ]
    );
    tx.rollback().await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP OWNED BY {role}; DROP ROLE {role};"
    )))
    .execute(&mut connection)
    .await
    .unwrap();
}

/// Two sweepers on one PostgreSQL database never take the same row.
#[tokio::test]
async fn postgres_sweepers_skip_each_others_rows() {
    let backends = backends().await;
    let Some(schema) = &backends.postgres else {
        eprintln!("DATABASE_URL unset: concurrent sweep test skipped");
        return;
    };
    let store = &backends
        .stores
        .iter()
        .find(|(name, _)| *name == "postgres")
        .unwrap()
        .1;
    let dead = worker(store.as_ref(), Duration::milliseconds(-1)).await;
    let run_id = Uuid::new_v4();
    let mut all = BTreeSet::new();
    for call in 0..40 {
        let new = new_invocation("tenant-a", run_id, &format!("call-{call}"), Start::Running);
        insert(store.as_ref(), &new, dead).await;
        all.insert(new.identity.id);
    }
    // A second store object is a second node: its own pool.
    let other: Arc<dyn Store> = Arc::new(PostgresStore::connect(&schema.url).await.unwrap());
    let (one, two) = (
        worker(store.as_ref(), Duration::seconds(60)).await,
        worker(store.as_ref(), Duration::seconds(60)).await,
    );
    let mut taken_one = BTreeSet::new();
    let mut taken_two = BTreeSet::new();
    loop {
        let (a, b) = tokio::join!(
            store.claim_expired(
                Claim {
                    worker_id: one,
                    now: now()
                },
                3
            ),
            other.claim_expired(
                Claim {
                    worker_id: two,
                    now: now()
                },
                3
            )
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        if a.is_empty() && b.is_empty() {
            break;
        }
        for record in a {
            assert!(taken_one.insert(record.identity.id));
        }
        for record in b {
            assert!(taken_two.insert(record.identity.id));
        }
    }
    let both: Vec<&Uuid> = taken_one.intersection(&taken_two).collect();
    assert!(both.is_empty(), "taken by both sweepers: {both:?}");
    let union: BTreeSet<Uuid> = taken_one.union(&taken_two).copied().collect();
    assert_eq!(union, all);
}

/// The outbox as a reader sees it once every transaction older than the
/// reader's has ended (tests share one cluster, so others' open
/// transactions briefly hold back the visible cursor): polled until at least
/// `at_least` events are visible.
pub async fn events_settled(
    store: &dyn Store,
    at_least: usize,
) -> Vec<toolgate::ports::EventRecord> {
    let mut events = Vec::new();
    for _ in 0..50 {
        events = store.events_after(0, 10_000, None).await.unwrap();
        if events.len() >= at_least {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    events
}

/// A server whose catalog churns keeps a bounded history: its newest
/// generations, and one an UNCERTAIN call ran (its review needs the tool as
/// it was), however many generations came and went.
#[tokio::test]
async fn a_churning_catalog_keeps_a_bounded_history() {
    use toolgate::ports::CatalogEntry;
    let backends = backends().await;
    for (name, store) in &backends.stores {
        let worker_id = worker(store.as_ref(), Duration::seconds(30)).await;
        let mut reviewed = new_invocation(
            "tenant-a",
            Uuid::new_v4(),
            "r",
            Start::Ended(ReasonCode::ToolOutcomeUnknown),
        );
        reviewed.identity.tool_source = ToolSource::Mcp;
        reviewed.identity.server_id = Some("churn".into());
        reviewed.identity.tool_name = "mcp.churn.tool".into();
        reviewed.identity.tool_version = "gen-0".into();
        store
            .insert_invocation(
                &reviewed,
                Claim {
                    worker_id,
                    now: now(),
                },
                &[],
            )
            .await
            .unwrap();
        // A call still running on gen-1 (its generation stays), and one
        // that succeeded on gen-2 (nothing keeps its generation).
        for (call, version, done) in [("running", "gen-1", false), ("done", "gen-2", true)] {
            let mut row = new_invocation("tenant-a", Uuid::new_v4(), call, Start::Running);
            row.identity.tool_source = ToolSource::Mcp;
            row.identity.server_id = Some("churn".into());
            row.identity.tool_name = "mcp.churn.tool".into();
            row.identity.tool_version = version.into();
            let inserted = insert(store.as_ref(), &row, worker_id).await;
            if done {
                let fence = inserted.fence().unwrap();
                let terminal = succeeded();
                assert!(
                    store
                        .complete_invocation(
                            "tenant-a",
                            row.identity.id,
                            fence,
                            &terminal,
                            &[],
                            now()
                        )
                        .await
                        .unwrap()
                );
            }
        }
        let first = now();
        for generation in 0..60 {
            let entry = CatalogEntry {
                remote_name: format!("tool{generation}"),
                registry_name: format!("mcp.churn.tool{generation}"),
                input_schema: json!({"type": "object"}),
            };
            assert!(
                store
                    .record_catalog(
                        "tenant-a",
                        "churn",
                        &format!("gen-{generation}"),
                        &[entry],
                        first + Duration::seconds(generation),
                    )
                    .await
                    .unwrap(),
                "{name}"
            );
        }
        let history = store.catalog_history("tenant-a", "churn").await.unwrap();
        let generations: std::collections::BTreeSet<&str> = history
            .iter()
            .map(|row| row.catalog_hash.as_str())
            .collect();
        assert_eq!(generations.len(), 34, "{name}: {generations:?}");
        assert!(
            generations.contains("gen-0"),
            "{name}: the reviewed one stays"
        );
        assert!(
            generations.contains("gen-1"),
            "{name}: a running call's stays"
        );
        assert!(
            !generations.contains("gen-2"),
            "{name}: an ended one's goes"
        );
        assert!(
            generations.contains("gen-59") && generations.contains("gen-28"),
            "{name}"
        );
        assert!(!generations.contains("gen-27"), "{name}");
    }
}

/// The catalog is a history: a generation per hash, written once;
/// withdrawn names stamped; nothing else changed.
#[tokio::test]
async fn the_catalog_is_a_history() {
    use toolgate::ports::CatalogEntry;
    let backends = backends().await;
    for (name, store) in &backends.stores {
        let entry = |remote: &str| CatalogEntry {
            remote_name: remote.into(),
            registry_name: format!("mcp.acme.{remote}"),
            input_schema: json!({"type": "object"}),
        };
        let first = now();
        assert!(
            store
                .record_catalog(
                    "tenant-a",
                    "acme",
                    "h1",
                    &[entry("read"), entry("write")],
                    first
                )
                .await
                .unwrap(),
            "{name}"
        );
        // The same generation again writes nothing.
        assert!(
            !store
                .record_catalog(
                    "tenant-a",
                    "acme",
                    "h1",
                    &[entry("read"), entry("write")],
                    first + Duration::seconds(1)
                )
                .await
                .unwrap()
        );
        // The server drops `write` and adds `list`.
        let second = first + Duration::seconds(2);
        assert!(
            store
                .record_catalog(
                    "tenant-a",
                    "acme",
                    "h2",
                    &[entry("read"), entry("list")],
                    second
                )
                .await
                .unwrap()
        );
        let history = store.catalog_history("tenant-a", "acme").await.unwrap();
        let rows: Vec<(&str, &str, bool)> = history
            .iter()
            .map(|row| {
                (
                    row.catalog_hash.as_str(),
                    row.entry.remote_name.as_str(),
                    row.withdrawn_at.is_some(),
                )
            })
            .collect();
        assert_eq!(
            rows,
            vec![
                ("h1", "read", false),
                ("h1", "write", true),
                ("h2", "list", false),
                ("h2", "read", false)
            ],
            "{name}"
        );
        assert_eq!(history[1].withdrawn_at, Some(second));
        assert_eq!(
            history[0].discovered_at, first,
            "{name}: the first generation keeps its time"
        );
        assert!(
            store
                .catalog_history("tenant-b", "acme")
                .await
                .unwrap()
                .is_empty(),
            "{name}"
        );
    }
}

/// The review queue lists a tenant's unresolved UNCERTAIN invocations; a
/// resolution is recorded beside the row, once, and the row itself stays as
/// it was recorded.
#[tokio::test]
async fn the_review_queue_records_resolutions_beside_the_row() {
    use toolgate::domain::{ReasonCode, ReviewResolution};
    use toolgate::ports::ReviewRecord;
    let backends = backends().await;
    for (name, store) in &backends.stores {
        let worker_id = worker(store.as_ref(), Duration::seconds(30)).await;
        let mut ended = Vec::new();
        for (call, outcome) in [("uncertain", true), ("succeeded", false)] {
            let new = new_invocation("tenant-a", Uuid::new_v4(), call, waiting());
            let fence = authorized(store.as_ref(), &new, worker_id)
                .await
                .fence()
                .unwrap();
            let running = store
                .claim_invocation(
                    "tenant-a",
                    new.identity.id,
                    fence,
                    now(),
                    &[],
                    Durability::Flushed,
                )
                .await
                .unwrap()
                .expect("claims");
            let terminal = if outcome {
                TerminalRecord::without_result(ReasonCode::ToolOutcomeUnknown)
            } else {
                succeeded()
            };
            assert!(
                store
                    .complete_invocation(
                        "tenant-a",
                        new.identity.id,
                        running.fence().unwrap(),
                        &terminal,
                        &[],
                        now()
                    )
                    .await
                    .unwrap()
            );
            ended.push(new.identity.id);
        }
        let (uncertain, succeeded_id) = (ended[0], ended[1]);
        let queue = queue_of(store.as_ref(), "tenant-a").await;
        assert_eq!(
            queue.iter().map(|row| row.identity.id).collect::<Vec<_>>(),
            vec![uncertain],
            "{name}"
        );
        assert!(queue_of(store.as_ref(), "tenant-b").await.is_empty());
        let before = store
            .invocation("tenant-a", uncertain)
            .await
            .unwrap()
            .unwrap();

        let review = |invocation_id| ReviewRecord {
            invocation_id,
            resolution: ReviewResolution::EffectApplied,
            resolver: "ops@example.com".into(),
            note: Some("found the line in the remote log".into()),
            resolved_at: now(),
        };
        assert!(
            !store
                .resolve_review("tenant-b", &review(uncertain))
                .await
                .unwrap(),
            "{name}"
        );
        assert!(
            !store
                .resolve_review("tenant-a", &review(succeeded_id))
                .await
                .unwrap(),
            "{name}"
        );
        assert!(
            store
                .resolve_review("tenant-a", &review(uncertain))
                .await
                .unwrap(),
            "{name}"
        );
        assert!(
            !store
                .resolve_review("tenant-a", &review(uncertain))
                .await
                .unwrap(),
            "a second resolution"
        );
        assert!(
            queue_of(store.as_ref(), "tenant-a").await.is_empty(),
            "{name}"
        );
        let after = store
            .invocation("tenant-a", uncertain)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(after, before, "{name}: the row is what was recorded");
    }
}

/// A suspended invocation keeps RUNNING with its marker and no lease, and no
/// recovery sweep takes it, however long it waits.
#[tokio::test]
async fn suspended_invocations_are_not_recovered() {
    let backends = backends().await;
    for (name, store) in &backends.stores {
        // A worker whose lease is already over.
        let worker_id = worker(store.as_ref(), Duration::seconds(-5)).await;
        let new = new_invocation("tenant-a", Uuid::new_v4(), "ask", waiting());
        let fence = authorized(store.as_ref(), &new, worker_id)
            .await
            .fence()
            .unwrap();
        let running = store
            .claim_invocation(
                "tenant-a",
                new.identity.id,
                fence,
                now(),
                &[],
                Durability::Flushed,
            )
            .await
            .unwrap()
            .expect("claims");
        let fence = running.fence().unwrap();
        assert!(
            store
                .suspend_invocation(
                    "tenant-a",
                    new.identity.id,
                    fence,
                    SuspensionKind::UserInput,
                    "q-1"
                )
                .await
                .unwrap(),
            "{name}"
        );
        assert!(
            !store
                .suspend_invocation(
                    "tenant-a",
                    new.identity.id,
                    fence,
                    SuspensionKind::UserInput,
                    "q-2"
                )
                .await
                .unwrap(),
            "{name}: suspended once"
        );
        let row = store
            .invocation("tenant-a", new.identity.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(row.status(), InvocationStatus::Running);
        assert_eq!(
            row.suspension()
                .map(|suspension| suspension.reference.as_str()),
            Some("q-1")
        );
        assert_eq!(row.state.worker(), None, "{name}: the lease is released");
        let sweeper = worker(store.as_ref(), Duration::seconds(30)).await;
        let taken = store
            .claim_expired(
                Claim {
                    worker_id: sweeper,
                    now: now(),
                },
                100,
            )
            .await
            .unwrap();
        assert!(
            taken.iter().all(|row| row.identity.id != new.identity.id),
            "{name}"
        );
        assert!(
            store
                .complete_suspended("tenant-a", new.identity.id, &succeeded(), &[], now())
                .await
                .unwrap()
        );
        assert!(
            !store
                .complete_suspended("tenant-a", new.identity.id, &succeeded(), &[], now())
                .await
                .unwrap()
        );
    }
}

/// A schema of its own, migrated by the store, and a connection as its
/// owner (inspection, plans); none when PostgreSQL is not required and
/// `DATABASE_URL` is unset.
async fn migrated_with_owner() -> Option<(PgSchema, PostgresStore, sqlx::PgConnection)> {
    let Some(schema) = PgSchema::create().await else {
        eprintln!("DATABASE_URL unset: the PostgreSQL plan test is skipped");
        return None;
    };
    let store = PostgresStore::connect(&schema.url)
        .await
        .expect("postgres connects");
    store.migrate().await.expect("postgres migrates");
    let owner = sqlx::PgConnection::connect(&schema.owner_url)
        .await
        .unwrap();
    Some((schema, store, owner))
}

/// The plans PostgreSQL chooses for `statement`, as `EXPLAIN` prints them:
/// planned for its values (as a first call is) and generically (as
/// PL/pgSQL's cached plans become), each with its `plan_cache_mode`.
async fn plans_of(connection: &mut sqlx::PgConnection, statement: &str) -> Vec<(String, String)> {
    let mut plans = Vec::new();
    for mode in ["force_custom_plan", "force_generic_plan"] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("SET plan_cache_mode = {mode}")))
            .execute(&mut *connection)
            .await
            .unwrap();
        let lines: Vec<(String,)> =
            sqlx::query_as(sqlx::AssertSqlSafe(format!("EXPLAIN {statement}")))
                .fetch_all(&mut *connection)
                .await
                .unwrap();
        let plan = lines
            .into_iter()
            .map(|(line,)| line)
            .collect::<Vec<_>>()
            .join("\n");
        plans.push((mode.to_owned(), plan));
    }
    plans
}

/// The hot path's writes find their row by primary key before the database
/// has any statistics (a new deployment, or one tenant holding every row):
/// no index led by the tenant tempts the planner into scanning the tenant's
/// rows for each claim, watermark and completion.
#[tokio::test]
async fn postgres_hot_path_writes_use_the_primary_key_without_statistics() {
    let Some((_schema, _store, mut connection)) = migrated_with_owner().await else {
        return;
    };
    let literals = "'3f0c2a7e-52b1-4d3a-9a43-0d8f2d3c1b7e', 'solo', \
                    '0f3a9c2b-7d1e-4f5a-8b6c-9d0e1f2a3b4c', 0";
    let row = "id = $1 AND tenant_id = $2 AND worker_id = $3 AND lease_epoch = $4";
    // The WHERE clauses of toolgate_claim, toolgate_mark_effect_sent and
    // toolgate_complete_invocation, in both planning modes.
    for (index, (write, status)) in [
        ("status = 'running'", "status = 'authorized'"),
        ("effect_sent_at = now()", "status = 'running'"),
        (
            "status = 'succeeded'",
            "status IN ('authorized', 'running')",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "PREPARE write_{index} (uuid, text, uuid, bigint) AS \
             UPDATE tool_invocations SET {write} WHERE {row} AND {status}"
        )))
        .execute(&mut connection)
        .await
        .unwrap();
        let statement = format!("EXECUTE write_{index}({literals})");
        for (mode, plan) in plans_of(&mut connection, &statement).await {
            assert!(
                plan.contains("using tool_invocations_pkey"),
                "{write} ({mode}): the row is not found by its primary key:\n{plan}"
            );
        }
    }
}

/// Every statement of a call's way through PostgreSQL, at the top level or
/// inside a function, is planned a few times on each connection and then
/// runs its kept plan; none is planned again on every call, as 0032's
/// counted intent was (its condition folded away for its values, so
/// PostgreSQL never kept the generic plan). Counted by
/// `pg_stat_statements` on a server of the test's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_calls_statements_are_planned_once_per_connection() {
    let Some(postgres) = crate::nodes::OwnPostgres::start_with(&[
        "shared_preload_libraries=pg_stat_statements",
        "pg_stat_statements.track=all",
        "pg_stat_statements.track_planning=on",
    ]) else {
        return;
    };
    let mut admin = sqlx::PgConnection::connect(&postgres.url()).await.unwrap();
    sqlx::raw_sql("CREATE EXTENSION pg_stat_statements")
        .execute(&mut admin)
        .await
        .unwrap();
    let schema = PgSchema::create_on(postgres.url(), "").await;
    let postgres_store = PostgresStore::connect(&schema.url).await.unwrap();
    let store: &dyn Store = &postgres_store;
    let owner = worker(store, Duration::seconds(600)).await;
    sqlx::raw_sql("SELECT pg_stat_statements_reset()")
        .execute(&mut admin)
        .await
        .unwrap();
    const CALLS: i64 = 60;
    // Writes first: a connection's first five runs of a statement decide
    // whether PostgreSQL keeps its generic plan, and a counted intent's
    // values were the ones that made 0032's INSERT plan anew each time.
    for call in 0..CALLS {
        let run_id = Uuid::new_v4();
        // A write its policy held: counted, approved, claimed, its
        // watermark, its end.
        let write = new_invocation("tenant-a", run_id, &format!("write-{call}"), waiting());
        let approved = authorized(store, &write, owner).await;
        let started = [event(ToolEventKind::Started, &write)];
        let running = store
            .claim_invocation(
                "tenant-a",
                write.identity.id,
                approved.fence().unwrap(),
                now(),
                &started,
                Durability::Flushed,
            )
            .await
            .unwrap()
            .expect("claims");
        let fence = running.row.fence().unwrap();
        let id = write.identity.id;
        assert!(
            store
                .mark_effect_sent("tenant-a", id, fence, now(), Durability::Flushed)
                .await
                .unwrap()
        );
        let ended = [event(ToolEventKind::Completed, &write)];
        assert!(
            store
                .complete_invocation("tenant-a", id, fence, &succeeded(), &ended, now())
                .await
                .unwrap()
        );
    }
    for call in 0..CALLS {
        let run_id = Uuid::new_v4();
        // An allowed read: its intent uncounted and inserted running, then
        // its end.
        let mut read = new_invocation("tenant-a", run_id, &format!("read-{call}"), Start::Running);
        read.identity.idempotency_class = IdempotencyClass::ReadOnly;
        read.identity.side_effect = SideEffectClass::None;
        read.durability = Durability::Relaxed;
        let intent = [
            ToolEventKind::Proposed,
            ToolEventKind::Authorized,
            ToolEventKind::Started,
        ]
        .map(|kind| event(kind, &read));
        let claim = Claim {
            worker_id: owner,
            now: now(),
        };
        let held = store
            .insert_uncounted(&read, claim, &intent)
            .await
            .unwrap()
            .expect("the breaker has nothing to count");
        let ended = [event(ToolEventKind::Completed, &read)];
        let fence = held.row.fence().unwrap();
        assert!(
            store
                .complete_invocation(
                    "tenant-a",
                    read.identity.id,
                    fence,
                    &succeeded(),
                    &ended,
                    now()
                )
                .await
                .unwrap()
        );
    }
    let statements: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT s.query, s.calls, s.plans FROM pg_stat_statements s \
         JOIN pg_roles r ON r.oid = s.userid WHERE r.rolname = $1 AND s.calls >= $2",
    )
    .bind(&schema.role)
    .bind(CALLS)
    .fetch_all(&mut admin)
    .await
    .unwrap();
    let (connections,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM pg_stat_activity WHERE usename = $1")
            .bind(&schema.role)
            .fetch_one(&mut admin)
            .await
            .unwrap();
    // Five plans for a statement's values, then the generic one, kept.
    let most = 6 * connections.max(1);
    assert!(most < CALLS, "{connections} connections for one caller");
    for (query, calls, plans) in &statements {
        assert!(
            *plans <= most,
            "planned {plans} times in {calls} runs on {connections} connections: {query}"
        );
    }
    let intents = statements
        .iter()
        .filter(|(query, _, _)| query.contains("INSERT INTO tool_invocations"))
        .count();
    assert!(intents >= 1, "the intents' INSERTs ran: {statements:#?}");
}

/// A call's status is checked through a type since 0032: every status the
/// node knows is written, and any other value is refused whether a row is
/// inserted or updated.
#[tokio::test]
async fn postgres_status_check_holds_the_eight_statuses_and_refuses_others() {
    let Some((_schema, _store, mut connection)) = migrated_with_owner().await else {
        return;
    };
    let insert = |status: &str| {
        format!(
            "SET toolgate.scope = 'system'; \
             INSERT INTO tool_invocations (id, tenant_id, session_id, run_id, step_number, call_id, \
                 tool_name, tool_version, tool_source, arguments, arguments_hash, idempotency_key, \
                 status, idempotency_class, side_effect, principal, origin_trust, lease_epoch, created_at) \
             VALUES (gen_random_uuid(), 'solo', gen_random_uuid(), gen_random_uuid(), 1, 'c', 'demo.echo', \
                 '1', 'builtin', '{{}}', 'h', gen_random_uuid()::text, '{status}', 'read_only', 'none', \
                 '{{}}', 'user', 0, now())"
        )
    };
    for status in InvocationStatus::ALL.iter().map(|status| status.as_str()) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(insert(status)))
            .execute(&mut connection)
            .await
            .unwrap_or_else(|error| panic!("{status}: {error}"));
    }
    for (statement, what) in [
        (insert("Running"), "an insert"),
        (insert(""), "an empty insert"),
        (
            "SET toolgate.scope = 'system'; \
             UPDATE tool_invocations SET status = 'bogus' WHERE status = 'running'"
                .to_owned(),
            "an update",
        ),
    ] {
        let refused = sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut connection)
            .await
            .expect_err(what);
        let code = refused
            .as_database_error()
            .and_then(|error| error.code())
            .map(|code| code.into_owned());
        assert_eq!(code.as_deref(), Some("22P02"), "{what}: {refused}");
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM tool_invocations")
        .fetch_one(&mut connection)
        .await
        .unwrap();
    assert_eq!(rows, InvocationStatus::ALL.len() as i64);
}

/// A long run of one tenant, every call of it ended, as a fresh
/// deployment's first agent makes: 300 rows and no statistics.
async fn a_long_ended_run(connection: &mut sqlx::PgConnection) {
    sqlx::raw_sql(
        "SET toolgate.scope = 'system'; \
         INSERT INTO tool_invocations (id, tenant_id, session_id, run_id, step_number, call_id, \
             tool_name, tool_version, tool_source, arguments, arguments_hash, idempotency_key, status, \
             idempotency_class, side_effect, principal, origin_trust, lease_epoch, created_at, \
             outcome_status, completed_at) \
         SELECT gen_random_uuid(), 'solo', '0f3a9c2b-7d1e-4f5a-8b6c-9d0e1f2a3b4c', \
             '3f0c2a7e-52b1-4d3a-9a43-0d8f2d3c1b7e', g, 'c', 'demo.echo', '1', 'builtin', '{}', \
             md5(g::text), md5(g::text) || 'k', 'succeeded', 'read_only', 'none', '{}', 'user', 0, \
             now(), 'succeeded', now() \
         FROM generate_series(1, 300) g",
    )
    .execute(connection)
    .await
    .unwrap();
}

/// Every allowed call first asks whether an identical call of its run has
/// ended. Before the database has statistics, that question is answered
/// from the index of identical calls, never by reading the run's every row:
/// no other index leads with the run.
#[tokio::test]
async fn postgres_identical_call_check_uses_its_index_without_statistics() {
    let Some((_schema, _store, mut connection)) = migrated_with_owner().await else {
        return;
    };
    a_long_ended_run(&mut connection).await;
    sqlx::raw_sql(
        "PREPARE identical (text, uuid, text, text) AS SELECT EXISTS (SELECT 1 FROM tool_invocations i \
             WHERE i.tenant_id = $1 AND i.run_id = $2 AND i.tool_name = $3 AND i.arguments_hash = $4 \
             AND i.outcome_status IS NOT NULL)",
    )
    .execute(&mut connection)
    .await
    .unwrap();
    let statement =
        "EXECUTE identical('solo', '3f0c2a7e-52b1-4d3a-9a43-0d8f2d3c1b7e', 'demo.echo', 'absent')";
    for (mode, plan) in plans_of(&mut connection, statement).await {
        assert!(
            plan.contains("using tool_invocations_identical"),
            "({mode}) the identical-call check reads another index:\n{plan}"
        );
    }
}

/// Recovery's sweep looks for held rows whose worker is gone, oldest
/// first. Before the database has statistics it reads them through the
/// index of held rows, never the whole table: a sweep over a million
/// ended calls that found nothing read them all.
#[tokio::test]
async fn postgres_recoverys_sweep_reads_the_held_rows_alone() {
    let Some((_schema, _store, mut connection)) = migrated_with_owner().await else {
        return;
    };
    a_long_ended_run(&mut connection).await;
    sqlx::raw_sql(
        "PREPARE sweep (bigint) AS SELECT i.id FROM tool_invocations i \
             WHERE i.status IN ('authorized', 'running') \
             AND (i.status <> 'running' OR i.suspended_kind IS NULL) \
             AND (i.worker_id IS NULL OR i.worker_id IN (SELECT w.worker_id FROM workers w \
             WHERE w.released_at IS NOT NULL OR w.lease_expires_at < now())) \
             ORDER BY i.created_at LIMIT $1 FOR UPDATE SKIP LOCKED",
    )
    .execute(&mut connection)
    .await
    .unwrap();
    for (mode, plan) in plans_of(&mut connection, "EXECUTE sweep(64)").await {
        assert!(
            plan.contains("tool_invocations_held")
                && !plan.contains("Seq Scan on tool_invocations")
                && !plan.contains("tool_invocations_by_creation"),
            "({mode}) the sweep reads more than the held rows:\n{plan}"
        );
    }
}

/// An invocation's story is read through the index of the events that name
/// a call. PostgreSQL's index is partial, and the planner takes it only for
/// a query that names its predicate; one that does not reads every event of
/// every call, which at a million calls is seconds an operator waits.
#[tokio::test]
async fn postgres_an_invocations_story_is_read_through_its_index() {
    use toolgate::ports::OperatorStore as _;
    let Some((schema, store, mut owner)) = migrated_with_owner().await else {
        return;
    };
    let id = Uuid::new_v4();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SET toolgate.scope = 'system'; \
         INSERT INTO tool_invocations (id, tenant_id, session_id, run_id, step_number, call_id, \
             tool_name, tool_version, tool_source, arguments, arguments_hash, idempotency_key, status, \
             idempotency_class, side_effect, principal, origin_trust, lease_epoch, created_at, \
             outcome_status, completed_at) \
         VALUES ('{id}', 'solo', gen_random_uuid(), gen_random_uuid(), 1, 'c', 'demo.echo', '1', \
             'builtin', '{{}}', 'h', 'k', 'succeeded', 'read_only', 'none', \
             '{{\"id\": \"p\", \"scopes\": []}}', 'user', 0, now(), 'succeeded', now()); \
         INSERT INTO events (tenant_id, event_type, payload, created_at) \
         SELECT 'solo', 'tool.call.started', \
             jsonb_build_object('invocation_id', CASE WHEN g = 1 THEN '{id}' \
                                                 ELSE gen_random_uuid()::text END), now() \
         FROM generate_series(1, 20000) g; \
         ANALYZE events"
    )))
    .execute(&mut owner)
    .await
    .unwrap();
    let scans = || {
        sqlx::query_scalar::<_, i64>(
            "SELECT idx_scan FROM pg_stat_user_indexes \
             WHERE schemaname = $1 AND indexrelname = 'events_by_invocation'",
        )
        .bind(schema.name.clone())
    };
    let before = scans().fetch_one(&mut owner).await.unwrap();
    let story = store
        .invocation_with_events(id)
        .await
        .unwrap()
        .expect("the row");
    assert_eq!(story.events.len(), 1);
    // The store's connection reports its scans once idle, within ten
    // seconds; the deadline bounds the wait, it is not the wait.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while scans().fetch_one(&mut owner).await.unwrap() == before {
        assert!(
            std::time::Instant::now() < deadline,
            "the story was read without its index"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// A session is recorded once; opening its id again writes nothing and
/// returns what was recorded, and any node reads it by id alone.
#[tokio::test]
async fn sessions_are_recorded_once_and_read_by_id() {
    let backends = backends().await;
    let opened_at = DateTime::from_timestamp_micros(Utc::now().timestamp_micros()).unwrap();
    for (name, store) in &backends.stores {
        let session = SessionRecord {
            session_id: Uuid::new_v4(),
            tenant_id: "tenant-a".into(),
            principal: Principal {
                id: "user-1".into(),
                scopes: ["demo.use".to_owned()].into(),
            },
            agent: toolgate::domain::AgentSpec {
                tools: vec!["demo.*".into()],
            },
            tool_schema_sha256: "a".repeat(64),
            tool_contract_sha256: "c".repeat(64),
            tool_names: vec!["demo.echo".into(), "demo.time".into()],
            // Whole microseconds: what both backends keep.
            opened_at,
            last_used_at: opened_at,
        };
        assert_eq!(
            store.open_session(&session).await.unwrap(),
            session,
            "{name}"
        );
        let other = SessionRecord {
            tenant_id: "tenant-b".into(),
            tool_schema_sha256: "b".repeat(64),
            ..session.clone()
        };
        assert_eq!(
            store.open_session(&other).await.unwrap(),
            session,
            "{name}: the first record stands"
        );
        assert_eq!(
            store.session(session.session_id).await.unwrap(),
            Some(session.clone()),
            "{name}"
        );
        assert_eq!(store.session(Uuid::new_v4()).await.unwrap(), None, "{name}");

        // Use moves `last_used_at` forward only; a session idle past the
        // cutoff is forgotten, one used since is kept.
        let later = opened_at + Duration::hours(2);
        store
            .touch_session(session.session_id, later)
            .await
            .unwrap();
        store
            .touch_session(session.session_id, opened_at)
            .await
            .unwrap();
        let touched = store.session(session.session_id).await.unwrap().unwrap();
        assert_eq!(touched.last_used_at, later, "{name}");
        assert_eq!(
            store.forget_sessions(later).await.unwrap(),
            0,
            "{name}: used at the cutoff"
        );
        assert!(
            store
                .forget_sessions(later + Duration::seconds(1))
                .await
                .unwrap()
                >= 1
        );
        assert_eq!(
            store.session(session.session_id).await.unwrap(),
            None,
            "{name}"
        );
    }
}

/// With `standard_conforming_strings` off, a backslash escapes a quote
/// inside a literal: a tenant id spliced into SQL text would end its literal
/// and run what follows. Bound as a parameter it is only a value, whatever
/// the session's settings.
#[tokio::test]
async fn postgres_tenant_ids_are_bound_never_spliced() {
    let Some(schema) = PgSchema::create_with("%20-c%20standard_conforming_strings%3Doff").await
    else {
        eprintln!("DATABASE_URL unset: the tenant-binding test runs on PostgreSQL only");
        return;
    };
    let store: Arc<dyn Store> = Arc::new(PostgresStore::connect(&schema.url).await.unwrap());
    let worker_id = worker(store.as_ref(), Duration::seconds(30)).await;
    let victim = insert(
        store.as_ref(),
        &new_invocation("victim", Uuid::new_v4(), "call", Start::Running),
        worker_id,
    )
    .await;
    for hostile in [
        r"x\'; CREATE TABLE pwned (id int); --",
        r"x\'), set_config('toolgate.scope', 'system', true) --",
        "x'; CREATE TABLE pwned (id int); --",
    ] {
        // Each of these opens a tenant-scoped transaction.
        let runs = store.run_invocations(hostile, victim.identity.run_id).await;
        assert!(runs.is_ok_and(|rows| rows.is_empty()), "{hostile}");
        assert!(
            store
                .invocation(hostile, victim.identity.id)
                .await
                .unwrap()
                .is_none()
        );
        assert!(pending_of(store.as_ref(), hostile).await.is_empty());
        assert!(queue_of(store.as_ref(), hostile).await.is_empty());
    }
    let mut owner = sqlx::PgConnection::connect(&schema.owner_url)
        .await
        .unwrap();
    let pwned: bool = sqlx::query_scalar("SELECT to_regclass('pwned') IS NOT NULL")
        .fetch_one(&mut owner)
        .await
        .unwrap();
    assert!(!pwned, "a tenant id ran as SQL");
}

/// No SQL text in the source is built from values at run time: every query
/// is a literal (or `concat!` of literals and constants), so no tenant id,
/// name or argument can become SQL. sqlx only takes run-time text through
/// `AssertSqlSafe`, which may therefore appear nowhere in `src/`.
#[test]
fn no_sql_is_built_by_formatting_values() {
    fn walk(folder: &std::path::Path, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(folder).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for (number, line) in text.lines().enumerate() {
                    let code = line.split("//").next().unwrap_or_default();
                    if code.contains("AssertSqlSafe") || code.contains("sqlx::raw_sql(format!") {
                        found.push(format!("{}:{}", path.display(), number + 1));
                    }
                }
            }
        }
    }
    let mut found = Vec::new();
    walk(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut found,
    );
    assert!(
        found.is_empty(),
        "SQL built at run time:\n{}",
        found.join("\n")
    );
}

/// SQLite's schema as the database itself records it, every object but
/// SQLite's own.
fn sqlite_schema(path: &std::path::Path) -> Vec<(String, String, Option<String>)> {
    let connection = rusqlite::Connection::open(path).unwrap();
    let mut statement = connection
        .prepare(
            "SELECT type, name, sql FROM sqlite_master \
             WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name",
        )
        .unwrap();
    statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Applies SQLite's migrations below version `below` to the database at
/// `path`, each on its own, by whatever build was current then, recorded
/// as the runner records it.
fn migrate_release_by_release(path: &std::path::Path, below: i64) {
    use toolgate::adapters::store::SQLITE_MIGRATIONS;
    let connection = rusqlite::Connection::open(path).unwrap();
    connection
        .execute_batch(
            "PRAGMA journal_mode = WAL; \
             CREATE TABLE toolgate_migrations (version BIGINT PRIMARY KEY, description TEXT NOT NULL, \
             checksum TEXT NOT NULL, applied_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)",
        )
        .unwrap();
    for migration in SQLITE_MIGRATIONS.iter().filter(|m| m.version < below) {
        connection
            .execute_batch("PRAGMA foreign_keys = OFF; BEGIN")
            .unwrap();
        connection.execute_batch(migration.sql).unwrap();
        connection
            .execute(
                "INSERT INTO toolgate_migrations (version, description, checksum) VALUES (?1, ?2, ?3)",
                rusqlite::params![migration.version, migration.description, migration.checksum()],
            )
            .unwrap();
        connection
            .execute_batch("COMMIT; PRAGMA foreign_keys = ON")
            .unwrap();
    }
}

/// A database upgraded one release at a time (each migration applied on its
/// own, by whatever build was current then, recorded as the runner records
/// it) has the schema a fresh one migrated at once has, and this build
/// finds it current and serves it.
#[tokio::test]
async fn a_sqlite_database_migrated_release_by_release_has_the_fresh_schema() {
    use toolgate::adapters::store::SQLITE_MIGRATIONS;
    let folder = tempfile::tempdir().unwrap();
    let fresh = folder.path().join("fresh.db");
    let store = SqliteStore::connect(&format!("sqlite://{}", fresh.display()))
        .await
        .unwrap();
    let applied = store.migrate().await.unwrap();
    assert_eq!(applied.len(), SQLITE_MIGRATIONS.len());
    store.close().await;

    let upgraded = folder.path().join("upgraded.db");
    migrate_release_by_release(&upgraded, i64::MAX);
    assert_eq!(sqlite_schema(&upgraded), sqlite_schema(&fresh));
    let store = SqliteStore::connect(&format!("sqlite://{}", upgraded.display()))
        .await
        .unwrap();
    assert!(store.pending_migrations().await.unwrap().is_empty());
    assert!(store.migrate().await.unwrap().is_empty());
    let worker_id = worker(&store, Duration::seconds(30)).await;
    let new = new_invocation("tenant-a", Uuid::new_v4(), "c", Start::Running);
    let row = insert(&store, &new, worker_id).await;
    assert_eq!(row.status(), InvocationStatus::Running);
    store.close().await;
}

/// Where each of the three tables whose status 0031 checks, and each of
/// their indexes, is rooted in the file: a copied table is rooted anew.
fn roots(connection: &rusqlite::Connection) -> Vec<(String, i64)> {
    connection
        .prepare(
            "SELECT name, rootpage FROM sqlite_master \
             WHERE tbl_name IN ('tool_invocations', 'approvals', 'turns') ORDER BY name",
        )
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The rows each of the three tables whose status 0031 checks holds, by
/// status.
fn rows_by_status(connection: &rusqlite::Connection) -> Vec<(String, String, i64)> {
    connection
        .prepare(
            "SELECT 'tool_invocations', status, count(*) FROM tool_invocations GROUP BY status \
             UNION ALL SELECT 'approvals', status, count(*) FROM approvals GROUP BY status \
             UNION ALL SELECT 'turns', state, count(*) FROM turns GROUP BY state ORDER BY 1, 2",
        )
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// 0031 edits the statuses' CHECKs in the tables' recorded definitions, not
/// by copying the tables: a database of every status keeps its rows where
/// they were, a status outside the set is still refused, and the store writes a
/// call over it.
#[tokio::test]
async fn sqlite_status_checks_are_edited_in_place_keeping_every_row() {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("toolgate.db");
    migrate_release_by_release(&path, 31);
    let statuses = [
        "proposed",
        "authorized",
        "waiting_for_approval",
        "running",
        "succeeded",
        "failed",
        "denied",
        "uncertain",
    ];
    let (before, rooted) = {
        let connection = rusqlite::Connection::open(&path).unwrap();
        for (n, status) in statuses.iter().enumerate() {
            connection
                .execute(
                    "INSERT INTO tool_invocations (id, tenant_id, session_id, run_id, step_number, \
                     call_id, tool_name, tool_version, arguments, arguments_hash, idempotency_key, \
                     status, principal, created_at, side_effect, idempotency_class, origin_trust) \
                     VALUES (?1, 'tenant-a', 's', 'r', ?2, 'c', 'demo.echo', 'v1', '{}', 'h', ?1, ?3, \
                     '{}', 0, 'read_only', 'idempotent', 'model')",
                    rusqlite::params![format!("i-{n}"), n as i64, status],
                )
                .unwrap();
        }
        for (n, status) in ["pending", "approved", "denied", "expired"]
            .iter()
            .enumerate()
        {
            connection
                .execute(
                    "INSERT INTO approvals (id, tenant_id, invocation_id, tool_name, reason_code, \
                     status, requested_at) VALUES (?1, 'tenant-a', 'i-2', 'demo.echo', 'x', ?2, 0)",
                    rusqlite::params![format!("a-{n}"), status],
                )
                .unwrap();
        }
        for (n, state) in ["open", "closed", "expired", "suspended"]
            .iter()
            .enumerate()
        {
            connection
                .execute(
                    "INSERT INTO turns (turn_id, tenant_id, session_id, run_id, step_number, \
                     script_sha256, state, opened_at, expires_at) \
                     VALUES (?1, 'tenant-a', 's', 'r', 1, 'h', ?2, 0, 1)",
                    rusqlite::params![format!("t-{n}"), state],
                )
                .unwrap();
        }
        (rows_by_status(&connection), roots(&connection))
    };
    assert_eq!(before.len(), 16);

    let store = SqliteStore::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let applied = store.migrate().await.unwrap();
    assert_eq!(applied.first(), Some(&31), "{applied:?}");
    let worker_id = worker(&store, Duration::seconds(30)).await;
    let new = new_invocation("tenant-a", Uuid::new_v4(), "c", Start::Running);
    let row = insert(&store, &new, worker_id).await;
    assert_eq!(row.status(), InvocationStatus::Running);
    store.close().await;

    let connection = rusqlite::Connection::open(&path).unwrap();
    let mut after = rows_by_status(&connection);
    if let Some(running) = after
        .iter_mut()
        .find(|(table, status, _)| table == "tool_invocations" && status == "running")
    {
        running.2 -= 1;
    }
    assert_eq!(after, before);
    assert_eq!(roots(&connection), rooted, "the tables were copied");
    for (table, column, key) in [
        ("tool_invocations", "status", "id = 'i-0'"),
        ("approvals", "status", "id = 'a-0'"),
        ("turns", "state", "turn_id = 't-0'"),
    ] {
        let refused = connection
            .execute(
                &format!("UPDATE {table} SET {column} = 'bogus' WHERE {key}"),
                [],
            )
            .unwrap_err();
        assert!(
            refused.to_string().contains("CHECK constraint failed"),
            "{table}: {refused}"
        );
    }
    let definitions: Vec<String> = connection
        .prepare(
            "SELECT sql FROM sqlite_master WHERE type = 'table' \
             AND name IN ('tool_invocations', 'approvals', 'turns')",
        )
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(definitions.len(), 3);
    for definition in definitions {
        assert!(!definition.contains(" IN ("), "{definition}");
    }
}

/// A database whose definitions 0031 does not find as it wrote them (an
/// operator's hand edit) is not migrated: the migration fails and leaves
/// every definition and the recorded version as they were.
#[tokio::test]
async fn sqlite_status_checks_not_found_as_written_fail_the_migration_whole() {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("toolgate.db");
    migrate_release_by_release(&path, 31);
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(
            "PRAGMA writable_schema = ON; \
             UPDATE sqlite_master SET sql = replace(sql, '''open'', ''closed''', '''open'',''closed''') \
             WHERE name = 'turns'; \
             PRAGMA writable_schema = RESET",
        )
        .unwrap();
    let before = sqlite_schema(&path);
    let store = SqliteStore::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let refused = store.migrate().await.unwrap_err();
    assert!(
        matches!(
            refused,
            toolgate::ports::StoreError::Migration { version: 31, .. }
        ),
        "{refused}"
    );
    store.close().await;
    assert_eq!(sqlite_schema(&path), before);
    let version: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("SELECT max(version) FROM toolgate_migrations", [], |row| {
            row.get(0)
        })
        .unwrap();
    assert_eq!(version, 30);
}

/// Events rebuilt without AUTOINCREMENT (0026) keep their ids, payloads and
/// order, and the next event's id is the one AUTOINCREMENT would have given:
/// one above the highest held, with no sequence row left to rewrite.
#[tokio::test]
async fn sqlite_events_keep_their_ids_through_their_rebuild() {
    use toolgate::ports::{EventStore, PlatformEvent};
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("toolgate.db");
    let sequence = |connection: &rusqlite::Connection| -> Vec<i64> {
        connection
            .prepare("SELECT seq FROM sqlite_sequence WHERE name = 'events'")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    migrate_release_by_release(&path, 26);
    {
        let connection = rusqlite::Connection::open(&path).unwrap();
        for n in 1..=3 {
            connection
                .execute(
                    "INSERT INTO events (tenant_id, event_type, payload, created_at) \
                     VALUES ('tenant-a', 'tool.call.started', ?1, 0)",
                    [json!({"invocation_id": format!("i-{n}")}).to_string()],
                )
                .unwrap();
        }
        assert_eq!(
            sequence(&connection),
            [3],
            "AUTOINCREMENT kept its sequence"
        );
    }
    let store = SqliteStore::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    assert_eq!(store.migrate().await.unwrap().first(), Some(&26));
    let event = PlatformEvent::ServerDisconnected {
        server_id: "acme".into(),
        reason_code: ReasonCode::ToolServerUnauthorized,
    };
    store
        .record_event(Some("tenant-a"), &event, now())
        .await
        .unwrap();
    let events = store.events_after(0, 100, None).await.unwrap();
    let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
    assert_eq!(ids, [1, 2, 3, 4]);
    let kept: Vec<&serde_json::Value> = events[..3]
        .iter()
        .map(|e| &e.payload["invocation_id"])
        .collect();
    assert_eq!(kept, [&json!("i-1"), &json!("i-2"), &json!("i-3")]);
    assert_eq!(events[3].event_type, "mcp.server.disconnected");
    store.close().await;
    let connection = rusqlite::Connection::open(&path).unwrap();
    assert!(
        sequence(&connection).is_empty(),
        "no sequence row is rewritten"
    );
}

/// The tenant's skills: a create, the same call again (its key) changing
/// nothing, a create over a taken name refused, an update of a missing one
/// refused, a delete; another tenant sees none of them.
#[tokio::test]
async fn authored_skills_are_written_once_per_call_and_kept_per_tenant() {
    use toolgate::ports::{AuthoredSkill, SkillWrite, SkillWritten};
    let backends = backends().await;
    for (name, store) in &backends.stores {
        let skill = |key: &str, body: &str| AuthoredSkill {
            name: "triage".into(),
            description: "d".into(),
            body: body.into(),
            required_tools: vec!["demo.echo".into()],
            version: format!("v-{body}"),
            author: "user-1".into(),
            written_by_key: key.into(),
            created_at: now(),
            updated_at: now(),
        };
        let put = |skill: AuthoredSkill, mode| {
            let store = store.clone();
            async move { store.put_skill("tenant-a", &skill, mode).await.unwrap() }
        };
        assert_eq!(
            put(skill("k1", "one"), SkillWrite::Update).await,
            SkillWritten::Missing,
            "{name}"
        );
        assert_eq!(
            put(skill("k1", "one"), SkillWrite::Create).await,
            SkillWritten::Written
        );
        assert_eq!(
            put(skill("k1", "one"), SkillWrite::Create).await,
            SkillWritten::Repeated,
            "{name}: the same call again"
        );
        assert_eq!(
            put(skill("k2", "two"), SkillWrite::Create).await,
            SkillWritten::Exists,
            "{name}"
        );
        assert_eq!(
            put(skill("k3", "three"), SkillWrite::Update).await,
            SkillWritten::Written
        );
        let skills = store.skills("tenant-a").await.unwrap();
        assert_eq!(skills.len(), 1, "{name}");
        assert_eq!(skills[0].body, "three");
        assert_eq!(skills[0].required_tools, vec!["demo.echo".to_owned()]);
        // Another principal of the tenant neither updates nor deletes it.
        let theirs = AuthoredSkill {
            author: "user-2".into(),
            ..skill("k4", "four")
        };
        assert_eq!(
            put(theirs, SkillWrite::Update).await,
            SkillWritten::OtherAuthor,
            "{name}"
        );
        assert!(
            !store
                .delete_skill("tenant-a", "triage", "user-2")
                .await
                .unwrap()
        );
        assert_eq!(store.skills("tenant-a").await.unwrap()[0].body, "three");
        assert!(store.skills("tenant-b").await.unwrap().is_empty(), "{name}");
        assert!(
            !store
                .delete_skill("tenant-b", "triage", "user-1")
                .await
                .unwrap()
        );
        assert!(
            store
                .delete_skill("tenant-a", "triage", "user-1")
                .await
                .unwrap()
        );
        assert!(
            !store
                .delete_skill("tenant-a", "triage", "user-1")
                .await
                .unwrap()
        );
        assert!(store.skills("tenant-a").await.unwrap().is_empty(), "{name}");
    }
}

/// Ends `new` (inserted, claimed at `started`) at `started + latency_ms`
/// with `terminal`.
async fn ended_at(
    store: &dyn Store,
    new: &NewInvocation,
    worker_id: Uuid,
    started: DateTime<Utc>,
    latency_ms: i64,
    terminal: &TerminalRecord,
) {
    let fence = authorized(store, new, worker_id).await.fence().unwrap();
    let running = store
        .claim_invocation(
            &new.identity.tenant_id,
            new.identity.id,
            fence,
            started,
            &[],
            Durability::Flushed,
        )
        .await
        .unwrap()
        .expect("claims");
    assert!(
        store
            .complete_invocation(
                &new.identity.tenant_id,
                new.identity.id,
                running.fence().unwrap(),
                terminal,
                &[],
                started + Duration::milliseconds(latency_ms),
            )
            .await
            .unwrap()
    );
}

/// The operator's invocation list spans tenants, filters by tenant, tool,
/// status, session and time, and pages newest first with a cursor that neither
/// skips nor repeats a row when rows are inserted between pages.
#[tokio::test]
async fn operator_invocation_lists_span_tenants_filter_and_page_stably() {
    use toolgate::ports::{OperatorFilter, PageRequest};
    let backends = backends().await;
    for (name, store) in &backends.stores {
        let worker_id = worker(store.as_ref(), Duration::seconds(30)).await;
        let mut ids = Vec::new();
        let session = Uuid::new_v4();
        for (n, tenant) in ["tenant-a", "tenant-b", "tenant-a", "tenant-b", "tenant-a"]
            .into_iter()
            .enumerate()
        {
            let mut new =
                new_invocation(tenant, Uuid::new_v4(), &format!("call-{n}"), Start::Running);
            if n == 0 {
                new.identity.tool_name = "demo.echo".into();
            }
            if n >= 3 {
                new.identity.session_id = session;
            }
            insert(store.as_ref(), &new, worker_id).await;
            ids.push(new.identity.id);
        }
        let all = store
            .list_invocations(&OperatorFilter::default(), PageRequest::default())
            .await
            .unwrap();
        assert_eq!(all.items.len(), 5, "{name}: both tenants");
        assert_eq!(all.next_cursor, None, "{name}");
        let mut newest_first = ids.clone();
        newest_first.reverse();
        assert_eq!(
            all.items
                .iter()
                .map(|row| row.identity.id)
                .collect::<Vec<_>>(),
            newest_first,
            "{name}: newest first"
        );

        let only = |filter: OperatorFilter| {
            let store = store.clone();
            async move {
                store
                    .list_invocations(&filter, PageRequest::default())
                    .await
                    .unwrap()
                    .items
                    .iter()
                    .map(|row| row.identity.id)
                    .collect::<BTreeSet<_>>()
            }
        };
        let tenant_b = only(OperatorFilter {
            tenant_id: Some("tenant-b".into()),
            ..OperatorFilter::default()
        })
        .await;
        assert_eq!(tenant_b, BTreeSet::from([ids[1], ids[3]]), "{name}");
        let echo = only(OperatorFilter {
            tool_name: Some("demo.echo".into()),
            ..OperatorFilter::default()
        })
        .await;
        assert_eq!(echo, BTreeSet::from([ids[0]]), "{name}");
        let of_session = only(OperatorFilter {
            session_id: Some(session),
            ..OperatorFilter::default()
        })
        .await;
        assert_eq!(of_session, BTreeSet::from([ids[3], ids[4]]), "{name}");
        let running = only(OperatorFilter {
            status: Some(all.items[0].status().as_str().into()),
            ..OperatorFilter::default()
        })
        .await;
        assert_eq!(running.len(), 5, "{name}");
        assert!(
            only(OperatorFilter {
                status: Some("uncertain".into()),
                ..OperatorFilter::default()
            })
            .await
            .is_empty(),
            "{name}"
        );
        let future = only(OperatorFilter {
            since: Some(now() + Duration::hours(1)),
            ..OperatorFilter::default()
        })
        .await;
        assert!(future.is_empty(), "{name}: since");
        let past = only(OperatorFilter {
            until: Some(now() - Duration::hours(1)),
            ..OperatorFilter::default()
        })
        .await;
        assert!(past.is_empty(), "{name}: until");

        // Pages of two, with a row inserted between pages: it lands before
        // the first page, so the pages still hold each earlier row once.
        let mut seen = Vec::new();
        let mut request = PageRequest {
            limit: 2,
            after: None,
        };
        loop {
            let page = store
                .list_invocations(&OperatorFilter::default(), request)
                .await
                .unwrap();
            assert!(page.items.len() <= 2, "{name}");
            seen.extend(page.items.iter().map(|row| row.identity.id));
            if seen.len() == 2 {
                let late = new_invocation("tenant-c", Uuid::new_v4(), "late", Start::Running);
                insert(store.as_ref(), &late, worker_id).await;
            }
            match page.next_cursor {
                Some(cursor) => request.after = Some(cursor),
                None => break,
            }
        }
        assert_eq!(seen, newest_first, "{name}: no row skipped or repeated");
    }
}

/// Decided approvals stay listable with the call they allowed, who
/// decided and when, and the hold's end; resolved review items stay
/// listable with their resolution; both decisions are events of the row.
#[tokio::test]
async fn operator_lists_keep_decisions_and_their_events() {
    use toolgate::domain::{ReviewResolution, TurnState};
    use toolgate::ports::{OperatorFilter, PageRequest, ReviewRecord, TurnRecord};
    let backends = backends().await;
    for (name, store) in &backends.stores {
        let worker_id = worker(store.as_ref(), Duration::seconds(30)).await;
        let held = new_invocation("tenant-a", Uuid::new_v4(), "held", waiting());
        insert(store.as_ref(), &held, worker_id).await;
        let approval_id = held.start.approval_id().unwrap();
        let turn_id = Uuid::new_v4();
        let hold_ends_at = now() + Duration::seconds(300);
        assert!(
            store
                .record_approval_hold("tenant-a", approval_id, Some(turn_id), hold_ends_at)
                .await
                .unwrap(),
            "{name}"
        );
        let status = |status: &str| OperatorFilter {
            status: Some(status.into()),
            ..OperatorFilter::default()
        };
        let pending = store
            .list_approvals(&status("pending"), PageRequest::default())
            .await
            .unwrap()
            .items;
        assert_eq!(pending.len(), 1, "{name}");
        assert_eq!(
            pending[0].arguments, held.identity.arguments,
            "{name}: the arguments"
        );
        assert_eq!(pending[0].side_effect, SideEffectClass::ExternalWrite);
        assert_eq!(pending[0].origin_trust, TrustLevel::User);
        assert_eq!(pending[0].principal, held.identity.principal);
        assert_eq!(
            (pending[0].run_id, pending[0].step_number),
            (held.identity.run_id, 1)
        );
        assert_eq!(pending[0].turn_id, Some(turn_id), "{name}");
        assert_eq!(pending[0].hold_ends_at, Some(hold_ends_at), "{name}");
        let decided_at = now();
        store
            .decide_approval(
                "tenant-a",
                approval_id,
                ApprovalStatus::Approved,
                "ops@example.com",
                decided_at,
            )
            .await
            .unwrap()
            .expect("decided");
        assert!(
            !store
                .record_approval_hold("tenant-a", approval_id, None, hold_ends_at)
                .await
                .unwrap(),
            "{name}: a decided approval has no hold"
        );
        assert!(
            store
                .list_approvals(&status("pending"), PageRequest::default())
                .await
                .unwrap()
                .items
                .is_empty(),
            "{name}"
        );
        let approved = store
            .list_approvals(&status("approved"), PageRequest::default())
            .await
            .unwrap()
            .items;
        assert_eq!(approved.len(), 1, "{name}: listable once decided");
        assert_eq!(approved[0].approver.as_deref(), Some("ops@example.com"));
        assert_eq!(approved[0].decided_at, Some(decided_at), "{name}");
        let events = store
            .invocation_with_events(held.identity.id)
            .await
            .unwrap()
            .expect("the row")
            .events;
        let decided = events
            .iter()
            .find(|event| event.event_type == "approval.decided")
            .expect("the decision is an event");
        assert_eq!(decided.payload["approver"], "ops@example.com", "{name}");
        assert_eq!(decided.payload["status"], "approved", "{name}");
        assert!(
            events
                .iter()
                .any(|event| event.event_type == "tool.call.authorized"),
            "{name}: the row's own events"
        );

        // A review item leaves the queue and stays listable, resolved.
        let uncertain = new_invocation("tenant-b", Uuid::new_v4(), "uncertain", waiting());
        ended_at(
            store.as_ref(),
            &uncertain,
            worker_id,
            now(),
            5,
            &TerminalRecord::without_result(ReasonCode::ToolOutcomeUnknown),
        )
        .await;
        let review_ids = |filter| {
            let store = store.clone();
            async move {
                store
                    .list_review_items(&filter, PageRequest::default())
                    .await
                    .unwrap()
                    .items
            }
        };
        let queued = review_ids(status("pending")).await;
        assert_eq!(queued.len(), 1, "{name}");
        assert_eq!(queued[0].invocation.identity.id, uncertain.identity.id);
        assert_eq!(queued[0].resolution, None);
        let review = ReviewRecord {
            invocation_id: uncertain.identity.id,
            resolution: ReviewResolution::EffectNotApplied,
            resolver: "oncall".into(),
            note: Some("no row in the remote table".into()),
            resolved_at: now(),
        };
        assert!(store.resolve_review("tenant-b", &review).await.unwrap());
        assert!(review_ids(status("pending")).await.is_empty(), "{name}");
        let resolved = review_ids(status("resolved")).await;
        assert_eq!(resolved.len(), 1, "{name}");
        assert_eq!(resolved[0].resolution, Some(review.clone()), "{name}");
        assert_eq!(review_ids(OperatorFilter::default()).await.len(), 1);
        let events = store
            .invocation_with_events(uncertain.identity.id)
            .await
            .unwrap()
            .unwrap()
            .events;
        let resolved_event = events
            .iter()
            .find(|event| event.event_type == "review.resolved")
            .expect("the resolution is an event");
        assert_eq!(resolved_event.payload["resolver"], "oncall", "{name}");
        assert_eq!(resolved_event.tenant_id.as_deref(), Some("tenant-b"));

        // Turns stay listable after they close.
        let turn = TurnRecord {
            turn_id,
            tenant_id: "tenant-a".into(),
            session_id: held.identity.session_id,
            run_id: held.identity.run_id,
            step_number: 1,
            script_sha256: "e".repeat(64),
            state: TurnState::Open,
            calls: 0,
            opened_at: now(),
            expires_at: now() + Duration::minutes(5),
            closed_at: None,
        };
        store.record_turn(&turn).await.unwrap();
        let turns = |state: &str| {
            let (store, filter) = (store.clone(), status(state));
            async move {
                store
                    .list_turns(&filter, PageRequest::default())
                    .await
                    .unwrap()
                    .items
            }
        };
        assert_eq!(turns("open").await, vec![turn.clone()], "{name}");
        let closed_at = now();
        assert!(
            store
                .close_turn("tenant-a", turn_id, TurnState::Suspended, 3, closed_at)
                .await
                .unwrap()
        );
        assert!(
            !store
                .close_turn("tenant-a", turn_id, TurnState::Closed, 4, closed_at)
                .await
                .unwrap(),
            "{name}: closed once"
        );
        assert!(turns("open").await.is_empty(), "{name}");
        let suspended = turns("suspended").await;
        assert_eq!(suspended.len(), 1, "{name}");
        assert_eq!(
            (suspended[0].calls, suspended[0].closed_at),
            (3, Some(closed_at))
        );

        // A stopped node's turns: the one past the grace is recorded as
        // expired at its expiry, its calls kept; the one within it is left
        // to its own node.
        let abandoned = TurnRecord {
            turn_id: Uuid::new_v4(),
            calls: 2,
            opened_at: now() - Duration::minutes(20),
            expires_at: now() - Duration::minutes(10),
            ..turn.clone()
        };
        let recent = TurnRecord {
            turn_id: Uuid::new_v4(),
            opened_at: now() - Duration::minutes(2),
            expires_at: now() - Duration::minutes(1),
            ..turn.clone()
        };
        store.record_turn(&abandoned).await.unwrap();
        store.record_turn(&recent).await.unwrap();
        let grace = now() - Duration::minutes(5);
        assert_eq!(
            store.expire_abandoned_turns(grace).await.unwrap(),
            1,
            "{name}"
        );
        assert_eq!(
            store.expire_abandoned_turns(grace).await.unwrap(),
            0,
            "{name}: once"
        );
        assert_eq!(turns("open").await, vec![recent.clone()], "{name}");
        assert_eq!(
            turns("expired").await,
            vec![TurnRecord {
                state: TurnState::Expired,
                closed_at: Some(abandoned.expires_at),
                ..abandoned.clone()
            }],
            "{name}"
        );
    }
}

/// Tool health is read from the rows: calls that ended in the window,
/// failures by reason code, UNCERTAIN counts and discrete p50/p99 latency,
/// the same on both backends.
#[tokio::test]
async fn tool_health_counts_the_window_from_the_rows() {
    use toolgate::ports::OperatorFilter;
    let backends = backends().await;
    for (name, store) in &backends.stores {
        let worker_id = worker(store.as_ref(), Duration::seconds(30)).await;
        let started = now() - Duration::minutes(1);
        for (n, latency) in [40, 10, 30, 20].into_iter().enumerate() {
            let new = new_invocation("tenant-a", Uuid::new_v4(), &format!("ok-{n}"), waiting());
            ended_at(
                store.as_ref(),
                &new,
                worker_id,
                started,
                latency,
                &succeeded(),
            )
            .await;
        }
        let uncertain = new_invocation("tenant-b", Uuid::new_v4(), "uncertain", waiting());
        ended_at(
            store.as_ref(),
            &uncertain,
            worker_id,
            started,
            1000,
            &TerminalRecord::without_result(ReasonCode::ToolOutcomeUnknown),
        )
        .await;
        // Ended before the window: not counted.
        let old = new_invocation("tenant-a", Uuid::new_v4(), "old", waiting());
        ended_at(
            store.as_ref(),
            &old,
            worker_id,
            now() - Duration::hours(2),
            5,
            &succeeded(),
        )
        .await;

        let since = now() - Duration::hours(1);
        let health = store
            .tool_health(&OperatorFilter::default(), since)
            .await
            .unwrap();
        assert_eq!(health.len(), 1, "{name}");
        let tool = &health[0];
        assert_eq!(tool.tool_name, "demo.external_write");
        assert_eq!(tool.calls, 5, "{name}");
        assert_eq!(tool.uncertain, 1, "{name}");
        assert_eq!(
            tool.failures,
            vec![(ReasonCode::ToolOutcomeUnknown.as_str().to_owned(), 1)],
            "{name}"
        );
        // Latencies 10, 20, 30, 40, 1000: the 3rd and the 5th.
        assert_eq!(tool.p50_ms, Some(30.0), "{name}");
        assert_eq!(tool.p99_ms, Some(1000.0), "{name}");

        let tenant_a = store
            .tool_health(
                &OperatorFilter {
                    tenant_id: Some("tenant-a".into()),
                    ..OperatorFilter::default()
                },
                since,
            )
            .await
            .unwrap();
        assert_eq!(tenant_a[0].calls, 4, "{name}");
        assert_eq!(tenant_a[0].uncertain, 0);
        assert!(tenant_a[0].failures.is_empty());
        assert_eq!(tenant_a[0].p50_ms, Some(20.0), "{name}: the 2nd of four");
        assert_eq!(tenant_a[0].p99_ms, Some(40.0), "{name}");
    }
}

/// Servers are listed with whose they are and their last connection's
/// outcome and reason code, catalog generations with their tools and what
/// a later one withdrew, open sessions with their pinned tools.
#[tokio::test]
async fn operator_lists_show_servers_generations_and_sessions() {
    use toolgate::domain::RiskLevel;
    use toolgate::domain::mcp_server::{AuthScheme, Transport};
    use toolgate::ports::{CatalogEntry, McpServerRow, OperatorFilter, PageRequest, PlatformEvent};
    let backends = backends().await;
    for (name, store) in &backends.stores {
        let row = McpServerRow {
            server_id: "acme".into(),
            transport: Transport::Http,
            endpoint: "https://acme.example/mcp".into(),
            auth_scheme: AuthScheme::None,
            auth_name: None,
            credential_ref: None,
            token_endpoint: None,
            token_scopes: None,
            side_effect: SideEffectClass::ExternalRead,
            risk: RiskLevel::Low,
            idempotency: IdempotencyClass::ReadOnly,
            required_scopes: vec![],
            timeout_seconds: 10,
            maximum_output_bytes: 65536,
            enabled: true,
        };
        let first = now();
        store.put_mcp_server("tenant-a", &row, first).await.unwrap();
        store
            .put_mcp_server("tenant-b", &row, first + Duration::seconds(1))
            .await
            .unwrap();
        for event in [
            PlatformEvent::ServerConnected {
                server_id: "acme".into(),
                transport: Transport::Http,
                tools: 2,
                duration_ms: 3,
            },
            PlatformEvent::ServerDisconnected {
                server_id: "acme".into(),
                reason_code: ReasonCode::ToolServerUnauthorized,
            },
        ] {
            store
                .record_event(Some("tenant-a"), &event, now())
                .await
                .unwrap();
        }
        let servers = store
            .list_servers(&OperatorFilter::default(), PageRequest::default())
            .await
            .unwrap()
            .items;
        let tenants: Vec<&str> = servers.iter().map(|s| s.tenant_id.as_str()).collect();
        assert_eq!(tenants, ["tenant-b", "tenant-a"], "{name}: newest first");
        assert!(
            servers
                .iter()
                .all(|s| s.tenant_configured && s.server == row)
        );
        let last = servers[1].last_connection.as_ref().expect("connected once");
        assert_eq!(last.event_type, "mcp.server.disconnected", "{name}");
        assert_eq!(
            last.reason_code.as_deref(),
            Some(ReasonCode::ToolServerUnauthorized.as_str()),
            "{name}"
        );
        assert_eq!(
            servers[0].last_connection, None,
            "{name}: tenant-b's never ran"
        );

        let entry = |remote: &str| CatalogEntry {
            remote_name: remote.into(),
            registry_name: format!("mcp.acme.{remote}"),
            input_schema: json!({"type": "object"}),
        };
        store
            .record_catalog(
                "tenant-a",
                "acme",
                "h1",
                &[entry("read"), entry("write")],
                first,
            )
            .await
            .unwrap();
        store
            .record_catalog(
                "tenant-a",
                "acme",
                "h2",
                &[entry("read")],
                first + Duration::seconds(1),
            )
            .await
            .unwrap();
        let generations = store
            .list_catalog_generations(
                &OperatorFilter {
                    tool_name: Some("acme".into()),
                    ..OperatorFilter::default()
                },
                PageRequest {
                    limit: 1,
                    after: None,
                },
            )
            .await
            .unwrap();
        assert_eq!(generations.items[0].catalog_hash, "h2", "{name}");
        assert_eq!(generations.items[0].tools, ["mcp.acme.read"]);
        let older = store
            .list_catalog_generations(
                &OperatorFilter::default(),
                PageRequest {
                    limit: 1,
                    after: generations.next_cursor,
                },
            )
            .await
            .unwrap();
        assert_eq!(older.items[0].catalog_hash, "h1", "{name}");
        assert_eq!(older.items[0].tools, ["mcp.acme.read", "mcp.acme.write"]);
        assert_eq!(older.items[0].withdrawn, ["mcp.acme.write"], "{name}");
        assert_eq!(older.next_cursor, None);

        let session = SessionRecord {
            session_id: Uuid::new_v4(),
            tenant_id: "tenant-b".into(),
            principal: Principal {
                id: "user-1".into(),
                scopes: ["demo.use".to_owned()].into(),
            },
            agent: toolgate::domain::AgentSpec {
                tools: vec!["demo.*".into()],
            },
            tool_schema_sha256: "a".repeat(64),
            tool_contract_sha256: "c".repeat(64),
            tool_names: vec!["demo.echo".into()],
            opened_at: now(),
            last_used_at: now(),
        };
        store.open_session(&session).await.unwrap();
        let sessions = store
            .list_sessions(
                &OperatorFilter {
                    tenant_id: Some("tenant-b".into()),
                    ..OperatorFilter::default()
                },
                PageRequest::default(),
            )
            .await
            .unwrap()
            .items;
        assert_eq!(sessions, vec![session], "{name}");
    }
}

/// A console sign-in is the store's: found by its cookie's hash until it
/// expires, ended by signing out, and bounded in number (the ones ending
/// soonest go first). On both stores.
#[tokio::test]
async fn console_sign_ins_are_kept_until_they_expire_and_bounded() {
    use toolgate::ports::ConsoleSignIn;
    let backends = backends().await;
    for (name, store) in &backends.stores {
        // Whole milliseconds: what both stores keep exactly.
        let now = DateTime::from_timestamp_millis(Utc::now().timestamp_millis()).unwrap();
        let sign_in = |key: &str, minutes: i64| ConsoleSignIn {
            cookie_sha256: key.to_owned(),
            operator: "ana".into(),
            signed_in_at: now,
            expires_at: now + chrono::Duration::minutes(minutes),
        };
        store.sign_in(&sign_in("one", 60), 3).await.unwrap();
        let found = store.signed_in("one", now).await.unwrap();
        assert_eq!(found, Some(sign_in("one", 60)), "{name}");
        assert_eq!(store.signed_in("other", now).await.unwrap(), None, "{name}");
        // Past its expiry it is not found.
        let later = now + chrono::Duration::minutes(61);
        assert_eq!(store.signed_in("one", later).await.unwrap(), None, "{name}");
        // Three at most: a fourth signs out the one ending soonest.
        store.sign_in(&sign_in("two", 30), 3).await.unwrap();
        store.sign_in(&sign_in("three", 90), 3).await.unwrap();
        store.sign_in(&sign_in("four", 120), 3).await.unwrap();
        assert_eq!(store.signed_in("two", now).await.unwrap(), None, "{name}");
        for kept in ["one", "three", "four"] {
            assert!(
                store.signed_in(kept, now).await.unwrap().is_some(),
                "{name}: {kept}"
            );
        }
        store.sign_out("three").await.unwrap();
        assert_eq!(store.signed_in("three", now).await.unwrap(), None, "{name}");
        store.sign_out("never").await.unwrap();
    }
}

/// `oauth2_user`'s custody on both stores: a consent flow is taken once,
/// never past its expiry, and a principal's outstanding flows are bounded;
/// a grant is its tenant's, principal's and server's, replaced by a new
/// consent, listed per tenant and ended by revocation.
#[tokio::test]
async fn upstream_grants_are_each_principals_and_consent_flows_are_taken_once() {
    use toolgate::ports::{ConsentFlow, UpstreamGrant};
    let backends = backends().await;
    for (name, store) in &backends.stores {
        let now = DateTime::from_timestamp_millis(Utc::now().timestamp_millis()).unwrap();
        let flow = |state: &str, principal: &str, minutes: i64| ConsentFlow {
            state_sha256: state.to_owned(),
            tenant_id: "acme".into(),
            principal_id: principal.into(),
            server_id: "crm".into(),
            browser_sha256: "b".repeat(64),
            sealed_verifier: "v1.k.sealed".into(),
            issuer: "https://as.example.com".into(),
            iss_required: true,
            token_endpoint: "https://as.example.com/token".into(),
            resource: "https://crm.example.com/mcp".into(),
            scopes: vec!["crm.read".into()],
            started_at: now + chrono::Duration::seconds(minutes),
            expires_at: now + chrono::Duration::minutes(minutes),
            client_document: (principal == "bob")
                .then(|| "https://toolgate.example.com/consent/client.json".into()),
            revocation_endpoint: Some("https://as.example.com/revoke".into()),
        };
        store
            .begin_consent(&flow("s1", "alice", 10), 2)
            .await
            .unwrap();
        assert_eq!(
            store.take_consent("s1", now).await.unwrap(),
            Some(flow("s1", "alice", 10)),
            "{name}"
        );
        assert_eq!(
            store.take_consent("s1", now).await.unwrap(),
            None,
            "{name}: taken twice"
        );
        // Past its expiry a flow is not taken.
        store
            .begin_consent(&flow("s2", "alice", 10), 2)
            .await
            .unwrap();
        let later = now + chrono::Duration::minutes(11);
        assert_eq!(
            store.take_consent("s2", later).await.unwrap(),
            None,
            "{name}"
        );
        // Two outstanding per principal: a third drops the oldest; another
        // principal's are not touched.
        store
            .begin_consent(&flow("b1", "bob", 20), 2)
            .await
            .unwrap();
        store
            .begin_consent(&flow("s3", "alice", 21), 2)
            .await
            .unwrap();
        store
            .begin_consent(&flow("s4", "alice", 22), 2)
            .await
            .unwrap();
        assert_eq!(
            store.take_consent("s2", now).await.unwrap(),
            None,
            "{name}: s2 dropped"
        );
        for kept in ["s3", "s4", "b1"] {
            assert!(
                store.take_consent(kept, now).await.unwrap().is_some(),
                "{name}: {kept}"
            );
        }

        let grant = |tenant: &str, principal: &str, sealed: &str| UpstreamGrant {
            tenant_id: tenant.into(),
            principal_id: principal.into(),
            server_id: "crm".into(),
            issuer: "https://as.example.com".into(),
            scopes: vec!["crm.read".into()],
            sealed_tokens: sealed.into(),
            granted_at: now,
            last_used_at: None,
        };
        store
            .save_grant(&grant("acme", "alice", "v1.k.first"))
            .await
            .unwrap();
        store
            .save_grant(&grant("acme", "bob", "v1.k.bob"))
            .await
            .unwrap();
        store
            .save_grant(&grant("other", "alice", "v1.k.other"))
            .await
            .unwrap();
        assert_eq!(
            store.grant("acme", "alice", "crm").await.unwrap(),
            Some(grant("acme", "alice", "v1.k.first")),
            "{name}"
        );
        // A new consent replaces the grant.
        store
            .save_grant(&grant("acme", "alice", "v1.k.second"))
            .await
            .unwrap();
        assert_eq!(
            store
                .grant("acme", "alice", "crm")
                .await
                .unwrap()
                .map(|g| g.sealed_tokens),
            Some("v1.k.second".to_owned()),
            "{name}"
        );
        assert_eq!(
            store.grant("acme", "alice", "mail").await.unwrap(),
            None,
            "{name}"
        );
        assert_eq!(
            store.grant("acme", "carol", "crm").await.unwrap(),
            None,
            "{name}"
        );
        let listed: Vec<String> = store
            .grants("acme")
            .await
            .unwrap()
            .into_iter()
            .map(|g| format!("{}/{}", g.principal_id, g.sealed_tokens))
            .collect();
        assert_eq!(listed, ["alice/v1.k.second", "bob/v1.k.bob"], "{name}");
        // Revocation ends one principal's grant, not another tenant's.
        // The grant deleted comes back, its tokens to revoke upstream.
        let revoked = store.revoke_grant("acme", "alice", "crm").await.unwrap();
        assert_eq!(
            revoked.map(|grant| grant.sealed_tokens).as_deref(),
            Some("v1.k.second"),
            "{name}"
        );
        assert_eq!(
            store.revoke_grant("acme", "alice", "crm").await.unwrap(),
            None,
            "{name}"
        );
        assert_eq!(
            store.grant("acme", "alice", "crm").await.unwrap(),
            None,
            "{name}"
        );
        assert!(
            store
                .grant("other", "alice", "crm")
                .await
                .unwrap()
                .is_some(),
            "{name}"
        );
    }
}
