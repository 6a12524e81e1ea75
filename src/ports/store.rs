//! The durable record: what the pipeline's four commits, the effect
//! watermark, deduplication and recovery read and write.
//!
//! Every write made for an attempt carries its [`Fence`] and changes nothing
//! when the fence is stale. Every tenant-owned read and write names its
//! tenant; adapters enforce it in the query and, on PostgreSQL, with
//! row-level security as well.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::domain::mcp_server::{AuthScheme, Transport};
use crate::domain::{
    AgentSpec, ApprovalStatus, IdempotencyClass, InvocationStatus, Principal, ReasonCode,
    ReviewResolution, RiskLevel, SideEffectClass, ToolEventKind, ToolOutcomeStatus, ToolSource,
    TrustLevel,
};

use super::tool::BoxFuture;

/// Why the store failed. Messages carry no argument, result or secret.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be reached or the connection broke.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A query failed.
    #[error("store query failed: {0}")]
    Query(String),
    /// A stored value could not be read back.
    #[error("stored value unreadable: {0}")]
    Decode(String),
    /// The schema is behind this build.
    #[error("{0} migration(s) pending; run `toolgate migrate`")]
    MigrationsPending(usize),
    /// A migration failed or an applied one differs from this build's.
    #[error("migration {version}: {reason}")]
    Migration {
        /// The migration's version.
        version: i64,
        /// What went wrong.
        reason: String,
    },
    /// The idempotency key is held by another tenant's row.
    #[error("idempotency key conflict")]
    KeyConflict,
}

impl StoreError {
    /// Whether retrying the same operation may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

/// The attempt a write is made for: the worker that claimed the row and the
/// row's lease epoch at that claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    /// The claiming worker.
    pub worker_id: Uuid,
    /// Incremented by every claim of the row.
    pub lease_epoch: i64,
}

/// A worker process and its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerLease {
    /// The worker.
    pub worker_id: Uuid,
    /// Where it runs (host name), for operators.
    pub node: String,
    /// Start of the process.
    pub started_at: DateTime<Utc>,
    /// Its rows are in flight until this moment; recovery takes them after.
    pub lease_expires_at: DateTime<Utc>,
}

/// A claim being made: by whom, and until when the lease holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// The claiming worker.
    pub worker_id: Uuid,
    /// The moment of the claim.
    pub now: DateTime<Utc>,
}

/// A row to insert at step 8 (AUTHORIZED), step 7 (WAITING_FOR_APPROVAL,
/// with its approval) or on a denial (DENIED, terminal).
#[derive(Debug, Clone, PartialEq)]
pub struct NewInvocation {
    /// The row id.
    pub id: Uuid,
    /// The tenant.
    pub tenant_id: String,
    /// The session.
    pub session_id: Uuid,
    /// The run.
    pub run_id: Uuid,
    /// The step; every call of a batch shares it.
    pub step_number: i64,
    /// Provider call id or the bridge's synthesized one.
    pub call_id: String,
    /// The registry name (the deferred tool's, for `tool.call`).
    pub tool_name: String,
    /// The pinned version.
    pub tool_version: String,
    /// Builtin, MCP, device or sandbox.
    pub tool_source: ToolSource,
    /// Set for MCP tools.
    pub server_id: Option<String>,
    /// The canonical arguments.
    pub arguments: Value,
    /// `normalized_arguments_hash`.
    pub arguments_hash: String,
    /// The UNIQUE key.
    pub idempotency_key: String,
    /// Snapshot of the class at authorization: recovery reads this, never
    /// the registry of a possibly different build.
    pub idempotency_class: IdempotencyClass,
    /// Snapshot of the side effect, for the same reason.
    pub side_effect: SideEffectClass,
    /// Minimum trust over the request's context items.
    pub origin_trust: TrustLevel,
    /// Who the call acts for; re-checked before any re-execution.
    pub principal: Principal,
    /// Shared by one parallel batch.
    pub parallel_group: Option<Uuid>,
    /// The run's deadline for this call.
    pub deadline_at: Option<DateTime<Utc>>,
    /// AUTHORIZED, WAITING_FOR_APPROVAL or DENIED.
    pub status: InvocationStatus,
    /// For a DENIED row, why.
    pub reason_code: Option<ReasonCode>,
    /// For a WAITING_FOR_APPROVAL row, the approval opened with it.
    pub approval_id: Option<Uuid>,
}

/// How a row ended, written at step 13 (or by recovery).
#[derive(Debug, Clone, PartialEq)]
pub struct TerminalRecord {
    /// SUCCEEDED, FAILED, DENIED or UNCERTAIN.
    pub status: InvocationStatus,
    /// The outcome status the model read.
    pub outcome_status: ToolOutcomeStatus,
    /// Absent on success.
    pub reason_code: Option<ReasonCode>,
    /// The rendered result (content and structure), for replay on dedup.
    pub result: Option<Value>,
    /// The tool's failure (detail and external text), for operators only.
    pub error: Option<Value>,
    /// UTF-8 bytes of the tool's content.
    pub output_bytes: Option<i64>,
    /// Whether the model saw an excerpt.
    pub truncated: bool,
    /// The whole result's artifact, when excerpted: recorded with the row.
    pub artifact: Option<StoredArtifact>,
}

impl TerminalRecord {
    /// The end of a call that produced no result: a refusal, an expiry, an
    /// uncertain recovery. Its status follows from the code.
    pub fn without_result(code: ReasonCode) -> TerminalRecord {
        let status = code.status();
        TerminalRecord {
            status: status.invocation_status(),
            outcome_status: status,
            reason_code: Some(code),
            result: None,
            error: None,
            output_bytes: None,
            truncated: false,
            artifact: None,
        }
    }
}

/// An `artifacts` row: what the artifact store holds for an invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredArtifact {
    /// The artifact.
    pub id: Uuid,
    /// Its media type.
    pub media_type: String,
    /// Its size.
    pub bytes: i64,
    /// The trust label it inherits from the result.
    pub trust: TrustLevel,
}

/// A `tool_invocations` row.
#[derive(Debug, Clone, PartialEq)]
pub struct InvocationRecord {
    /// The row id.
    pub id: Uuid,
    /// The tenant.
    pub tenant_id: String,
    /// The session.
    pub session_id: Uuid,
    /// The run.
    pub run_id: Uuid,
    /// The step.
    pub step_number: i64,
    /// The call id.
    pub call_id: String,
    /// The registry name.
    pub tool_name: String,
    /// The pinned version.
    pub tool_version: String,
    /// Where the tool comes from.
    pub tool_source: ToolSource,
    /// Set for MCP tools.
    pub server_id: Option<String>,
    /// The canonical arguments.
    pub arguments: Value,
    /// `normalized_arguments_hash`.
    pub arguments_hash: String,
    /// The UNIQUE key.
    pub idempotency_key: String,
    /// The row's state.
    pub status: InvocationStatus,
    /// Snapshot of the class.
    pub idempotency_class: IdempotencyClass,
    /// Snapshot of the side effect.
    pub side_effect: SideEffectClass,
    /// Who the call acts for.
    pub principal: Principal,
    /// Request trust.
    pub origin_trust: TrustLevel,
    /// The batch.
    pub parallel_group: Option<Uuid>,
    /// The call's deadline.
    pub deadline_at: Option<DateTime<Utc>>,
    /// The approval, while or after waiting.
    pub approval_id: Option<Uuid>,
    /// The effect watermark.
    pub effect_sent_at: Option<DateTime<Utc>>,
    /// Claims made of the row.
    pub attempt_number: i32,
    /// The current claim's worker.
    pub worker_id: Option<Uuid>,
    /// The current claim's epoch.
    pub lease_epoch: i64,
    /// `user_input` or `child_run` while a control tool is suspended.
    pub suspended_kind: Option<String>,
    /// The question or child run it waits for.
    pub suspended_ref: Option<String>,
    /// The outcome status, once terminal.
    pub outcome_status: Option<ToolOutcomeStatus>,
    /// The reason code, once terminal (absent on success).
    pub reason_code: Option<ReasonCode>,
    /// The rendered result.
    pub result: Option<Value>,
    /// The tool's failure, for operators.
    pub error: Option<Value>,
    /// Output size.
    pub output_bytes: Option<i64>,
    /// Excerpted or not.
    pub truncated: bool,
    /// The whole result's artifact.
    pub artifact_id: Option<Uuid>,
    /// Row creation.
    pub created_at: DateTime<Utc>,
    /// Last claim.
    pub started_at: Option<DateTime<Utc>>,
    /// Terminal write.
    pub completed_at: Option<DateTime<Utc>>,
}

impl InvocationRecord {
    /// The fence of the row's current claim, if claimed.
    pub fn fence(&self) -> Option<Fence> {
        self.worker_id.map(|worker_id| Fence {
            worker_id,
            lease_epoch: self.lease_epoch,
        })
    }
}

/// What step 8's insert found.
#[derive(Debug, Clone, PartialEq)]
pub enum InsertOutcome {
    /// The row is new.
    Inserted(InvocationRecord),
    /// A row with this key already exists: the deduplication path.
    Existing(InvocationRecord),
}

/// An `approvals` row.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalRecord {
    /// The approval.
    pub id: Uuid,
    /// The tenant.
    pub tenant_id: String,
    /// The waiting invocation.
    pub invocation_id: Uuid,
    /// The tool asked about.
    pub tool_name: String,
    /// Why approval was required.
    pub reason_code: ReasonCode,
    /// Its state.
    pub status: ApprovalStatus,
    /// Who decided.
    pub approver: Option<String>,
    /// When it was opened.
    pub requested_at: DateTime<Utc>,
    /// When it was decided.
    pub decided_at: Option<DateTime<Utc>>,
}

/// One of the seven tool events: identity and classification only. No
/// arguments, no result, no error detail, no external text: those live in
/// the tenant-scoped row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolEvent {
    /// Which of the seven; the event's type, not part of its body.
    #[serde(skip)]
    pub kind: ToolEventKind,
    /// The row.
    pub invocation_id: Uuid,
    /// The run.
    pub run_id: Uuid,
    /// The step.
    pub step_number: i64,
    /// The call id.
    pub call_id: String,
    /// The registry name.
    pub tool_name: String,
    /// Builtin, MCP, device or sandbox.
    pub tool_source: ToolSource,
    /// The pinned version.
    pub tool_version: String,
    /// Set once the outcome is known.
    pub outcome_status: Option<ToolOutcomeStatus>,
    /// Set on non-success.
    pub reason_code: Option<ReasonCode>,
    /// The snapshot class.
    pub idempotency_class: IdempotencyClass,
    /// Whether the watermark was set: what an operator scans for.
    pub effect_sent: bool,
    /// Execution time, on terminal events.
    pub duration_ms: Option<i64>,
    /// Output size, on terminal events.
    pub output_bytes: Option<i64>,
    /// Excerpted or not.
    pub truncated: bool,
    /// The batch.
    pub parallel_group: Option<Uuid>,
}

/// A row of the events outbox.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRecord {
    /// Monotonic cursor.
    pub id: i64,
    /// The tenant, for tenant events.
    pub tenant_id: Option<String>,
    /// e.g. `tool.call.started`.
    pub event_type: String,
    /// The event body.
    pub payload: Value,
    /// When it was recorded.
    pub created_at: DateTime<Utc>,
}

/// The breaker's counter for one identical call (name and arguments) in a
/// run: calls by outcome status and reason code, derived from the rows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BreakerTally {
    /// Rows by outcome status and reason code (absent on success).
    pub counts: Vec<(ToolOutcomeStatus, Option<ReasonCode>, i64)>,
    /// Successful calls before the count last restarted on new evidence.
    pub evidence_base: i64,
}

impl BreakerTally {
    /// Rows with this status and code.
    pub fn count(&self, status: ToolOutcomeStatus, code: Option<ReasonCode>) -> i64 {
        self.counts
            .iter()
            .filter(|(s, c, _)| *s == status && *c == code)
            .map(|(_, _, n)| *n)
            .sum()
    }

    /// Rows with this status, whatever their code.
    pub fn count_status(&self, status: ToolOutcomeStatus) -> i64 {
        self.counts
            .iter()
            .filter(|(s, _, _)| *s == status)
            .map(|(_, _, n)| *n)
            .sum()
    }
}

/// One tool of a catalog generation.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogEntry {
    /// The server's name for it.
    pub remote_name: String,
    /// `mcp.{server_id}.{normalized}`.
    pub registry_name: String,
    /// The schema the tool was registered (and its calls validated) with.
    pub input_schema: Value,
}

/// A `mcp_tool_catalog` row.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogRow {
    /// The generation.
    pub catalog_hash: String,
    /// The tool.
    pub entry: CatalogEntry,
    /// When the generation was first written.
    pub discovered_at: DateTime<Utc>,
    /// When a later generation no longer had the name.
    pub withdrawn_at: Option<DateTime<Utc>>,
}

/// A `sessions` row: what a session was opened with, so that any node (or
/// this one after a restart) can pin its tool set again.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRecord {
    pub session_id: Uuid,
    pub tenant_id: String,
    pub principal: Principal,
    pub agent: AgentSpec,
    /// The pinned set's hashes when the session opened (what the model was
    /// shown, and what calls execute under): a node that takes the session
    /// over must reproduce both.
    pub tool_schema_sha256: String,
    pub tool_contract_sha256: String,
    pub opened_at: DateTime<Utc>,
    /// Refreshed at most hourly while the session is used.
    pub last_used_at: DateTime<Utc>,
}

/// A `mcp_servers` row: a server as configured, never a secret.
#[derive(Debug, Clone, PartialEq)]
pub struct McpServerRow {
    /// The name in `mcp.{server_id}.` tool names.
    pub server_id: String,
    /// stdio or http.
    pub transport: Transport,
    /// The command line (program and arguments) or the URL.
    pub endpoint: String,
    /// One of the five schemes.
    pub auth_scheme: AuthScheme,
    /// Header or variable name.
    pub auth_name: Option<String>,
    /// A broker reference, never the secret.
    pub credential_ref: Option<String>,
    /// oauth2_client only.
    pub token_endpoint: Option<String>,
    /// oauth2_client only.
    pub token_scopes: Option<Vec<String>>,
    /// The operator's classification of every tool of the server.
    pub side_effect: SideEffectClass,
    /// See `side_effect`.
    pub risk: RiskLevel,
    /// See `side_effect`.
    pub idempotency: IdempotencyClass,
    /// Scopes every tool requires.
    pub required_scopes: Vec<String>,
    /// Every tool's timeout.
    pub timeout_seconds: u32,
    /// Every tool's output limit.
    pub maximum_output_bytes: u64,
    /// Whether it is spawned or dialled at all.
    pub enabled: bool,
}

/// One catalog generation of one server.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogGeneration {
    /// The server.
    pub server_id: String,
    /// The generation: sha256 over the sorted declarations.
    pub catalog_hash: String,
    /// The tools it registered.
    pub entries: Vec<CatalogEntry>,
}

/// The events beside the seven tool events: MCP servers and catalogs, and
/// bridge sessions. Identity, classification and reason codes only; nothing
/// a server said (an error string, a description) is ever in one.
#[derive(Debug, Clone, PartialEq)]
pub enum PlatformEvent {
    /// A handshake finished.
    ServerConnected {
        /// The server.
        server_id: String,
        /// Its transport.
        transport: Transport,
        /// Tools it listed.
        tools: usize,
        /// Handshake and discovery time.
        duration_ms: i64,
    },
    /// A remembered discovery was pinned instead of connecting.
    ServerPinned {
        /// The server.
        server_id: String,
        /// Its transport.
        transport: Transport,
        /// Tools it listed.
        tools: usize,
    },
    /// A connection closed or failed.
    ServerDisconnected {
        /// The server.
        server_id: String,
        /// Why, as a stable code.
        reason_code: ReasonCode,
    },
    /// The server's list differs from the pin: recorded, not applied.
    CatalogChanged {
        /// The server.
        server_id: String,
        /// The pinned generation.
        old_hash: String,
        /// What the server lists now.
        new_hash: String,
    },
    /// Two remote names normalized to one registry name; neither is kept.
    CatalogConflict {
        /// The server.
        server_id: String,
        /// Both remote names.
        remote_names: Vec<String>,
    },
    /// A bridge turn's socket was bound.
    BridgeSessionOpened {
        /// The run.
        run_id: Uuid,
        /// The step.
        step_number: i64,
        /// The script's hash.
        script_hash: String,
    },
    /// A bridge turn was torn down.
    BridgeSessionClosed {
        /// The run.
        run_id: Uuid,
        /// The step.
        step_number: i64,
        /// Calls the turn made, denied ones included.
        calls: u32,
    },
    /// A declaration failed registration.
    ToolRejected {
        /// The server.
        server_id: String,
        /// The server's name for the tool.
        remote_name: String,
        /// A stable slug, e.g. `input_schema.too_deep`.
        reason: String,
    },
}

impl PlatformEvent {
    /// The event's type, e.g. `mcp.server.connected`.
    pub fn event_type(&self) -> &'static str {
        match self {
            PlatformEvent::ServerConnected { .. } => "mcp.server.connected",
            PlatformEvent::ServerPinned { .. } => "mcp.server.pinned",
            PlatformEvent::ServerDisconnected { .. } => "mcp.server.disconnected",
            PlatformEvent::CatalogChanged { .. } => "mcp.catalog.changed",
            PlatformEvent::CatalogConflict { .. } => "mcp.catalog.conflict",
            PlatformEvent::ToolRejected { .. } => "mcp.tool.rejected",
            PlatformEvent::BridgeSessionOpened { .. } => "bridge.session.opened",
            PlatformEvent::BridgeSessionClosed { .. } => "bridge.session.closed",
        }
    }

    /// The event's body.
    pub fn payload(&self) -> Value {
        match self {
            PlatformEvent::ServerConnected {
                server_id,
                transport,
                tools,
                duration_ms,
            } => json!({"server": server_id, "transport": transport, "tools": tools,
                        "duration_ms": duration_ms}),
            PlatformEvent::ServerPinned {
                server_id,
                transport,
                tools,
            } => json!({"server": server_id, "transport": transport, "tools": tools}),
            PlatformEvent::ServerDisconnected {
                server_id,
                reason_code,
            } => json!({"server": server_id, "reason_code": reason_code}),
            PlatformEvent::CatalogChanged {
                server_id,
                old_hash,
                new_hash,
            } => json!({"server": server_id, "old_hash": old_hash, "new_hash": new_hash}),
            PlatformEvent::CatalogConflict {
                server_id,
                remote_names,
            } => json!({"server": server_id, "remote_names": remote_names}),
            PlatformEvent::ToolRejected {
                server_id,
                remote_name,
                reason,
            } => json!({"server": server_id, "remote_name": remote_name, "reason": reason}),
            PlatformEvent::BridgeSessionOpened {
                run_id,
                step_number,
                script_hash,
            } => json!({"run_id": run_id, "step_number": step_number, "script_hash": script_hash}),
            PlatformEvent::BridgeSessionClosed {
                run_id,
                step_number,
                calls,
            } => json!({"run_id": run_id, "step_number": step_number, "calls": calls}),
        }
    }
}

/// What one catalog preparation writes, all in one transaction: the server
/// rows, the catalog generations and the events, in configured-server order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PreparationRecord {
    /// The servers prepared.
    pub servers: Vec<McpServerRow>,
    /// Their catalogs.
    pub generations: Vec<CatalogGeneration>,
    /// Their events.
    pub events: Vec<PlatformEvent>,
}

/// A human's resolution of an UNCERTAIN invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewRecord {
    /// The invocation reviewed.
    pub invocation_id: Uuid,
    /// The verdict.
    pub resolution: ReviewResolution,
    /// Who gave it.
    pub resolver: String,
    /// Why, in the reviewer's words.
    pub note: Option<String>,
    /// When.
    pub resolved_at: DateTime<Utc>,
}

/// The durable record. Each method is one short transaction; none is held
/// across tool I/O.
pub trait Store: Send + Sync {
    /// Versions of this build's migrations not yet applied.
    fn pending_migrations(&self) -> BoxFuture<'_, Result<Vec<i64>, StoreError>>;

    /// Applies pending migrations; returns the versions applied.
    fn migrate(&self) -> BoxFuture<'_, Result<Vec<i64>, StoreError>>;

    /// Registers a worker and its first lease.
    fn register_worker<'a>(
        &'a self,
        lease: &'a WorkerLease,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Extends a worker's lease; `false` when the worker is unknown or
    /// released, and the worker must stop claiming.
    fn heartbeat(
        &self,
        worker_id: Uuid,
        lease_expires_at: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<bool, StoreError>>;

    /// Ends a worker's lease now, so its unfinished rows become recoverable.
    fn release_worker(
        &self,
        worker_id: Uuid,
        now: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<(), StoreError>>;

    /// The lease of a worker, if registered.
    fn worker(&self, worker_id: Uuid) -> BoxFuture<'_, Result<Option<WorkerLease>, StoreError>>;

    /// Step 8 (or 7 with its approval, or a denial): inserts the row and its
    /// events in one commit under the inserting worker's fence (epoch 0), or
    /// returns the row already holding the key and writes nothing.
    fn insert_invocation<'a>(
        &'a self,
        new: &'a NewInvocation,
        claim: Claim,
        events: &'a [ToolEvent],
    ) -> BoxFuture<'a, Result<InsertOutcome, StoreError>>;

    /// An approved call's row moves from WAITING_FOR_APPROVAL to AUTHORIZED
    /// under the resuming worker's new fence. `None` when it is not waiting.
    fn authorize_waiting<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        claim: Claim,
        events: &'a [ToolEvent],
    ) -> BoxFuture<'a, Result<Option<InvocationRecord>, StoreError>>;

    /// A denied or expired approval ends its waiting row. `false` when the
    /// row is no longer waiting (another decision won).
    fn settle_waiting<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        terminal: &'a TerminalRecord,
        events: &'a [ToolEvent],
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Step 9: AUTHORIZED to RUNNING under a new fence, with its events.
    /// `None` when the row is not AUTHORIZED under `fence`.
    fn claim_invocation<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        fence: Fence,
        now: DateTime<Utc>,
        events: &'a [ToolEvent],
    ) -> BoxFuture<'a, Result<Option<InvocationRecord>, StoreError>>;

    /// The effect watermark: sets `effect_sent_at` once (later calls keep the
    /// first value). `false` when the fence is stale: the tool must not start.
    fn mark_effect_sent<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        fence: Fence,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Step 13: the terminal write and its events, only under the current
    /// fence of an AUTHORIZED or RUNNING row. `false` when the fence is
    /// stale and nothing changed.
    fn complete_invocation<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        fence: Fence,
        terminal: &'a TerminalRecord,
        events: &'a [ToolEvent],
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// A row by id, within its tenant.
    fn invocation<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
    ) -> BoxFuture<'a, Result<Option<InvocationRecord>, StoreError>>;

    /// A run's rows in step and creation order.
    fn run_invocations<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
    ) -> BoxFuture<'a, Result<Vec<InvocationRecord>, StoreError>>;

    /// Recovery: takes over up to `limit` AUTHORIZED or RUNNING rows, not
    /// suspended, whose worker's lease has expired or was released, each
    /// under a new fence. Concurrent sweepers never take the same row.
    fn claim_expired(
        &self,
        claim: Claim,
        limit: i64,
    ) -> BoxFuture<'_, Result<Vec<InvocationRecord>, StoreError>>;

    /// Deduplication's case 4 for one row: takes over an AUTHORIZED or
    /// RUNNING row, not suspended, whose worker's lease has expired or was
    /// released, under a new fence. `None` when its owner is alive (or it
    /// has moved on).
    fn take_over<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        claim: Claim,
    ) -> BoxFuture<'a, Result<Option<InvocationRecord>, StoreError>>;

    /// An approval, within its tenant.
    fn approval<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
    ) -> BoxFuture<'a, Result<Option<ApprovalRecord>, StoreError>>;

    /// Pending approvals of a tenant, oldest first.
    fn pending_approvals<'a>(
        &'a self,
        tenant_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ApprovalRecord>, StoreError>>;

    /// Records a decision on a pending approval; `None` when it is not
    /// pending (decided already, or unknown).
    fn decide_approval<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        status: ApprovalStatus,
        approver: &'a str,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Option<ApprovalRecord>, StoreError>>;

    /// The breaker's counter for `tool_name` with `arguments_hash` in a run.
    fn breaker_tally<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
        tool_name: &'a str,
        arguments_hash: &'a str,
    ) -> BoxFuture<'a, Result<BreakerTally, StoreError>>;

    /// Records the evidence key a successful identical call returned (its
    /// row already terminal). A key different from the last restarts the
    /// count at one, when that lowers it and the run has restarts left (at
    /// most `maximum_restarts`); returns whether it restarted.
    fn record_evidence<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
        tool_name: &'a str,
        arguments_hash: &'a str,
        evidence_key: &'a str,
        maximum_restarts: i32,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// An artifact's record, within its tenant (for the owner-scoped
    /// artifact routes; no tool reads artifacts back).
    fn artifact<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
    ) -> BoxFuture<'a, Result<Option<StoredArtifact>, StoreError>>;

    /// Writes one preparation in one transaction: upserts the server rows,
    /// writes each catalog generation unless its hash is already written for
    /// the server (stamping `withdrawn_at` on earlier names it lacks), and
    /// appends the events in order. Returns, per generation, whether it was
    /// written.
    fn record_preparation<'a>(
        &'a self,
        tenant_id: &'a str,
        record: &'a PreparationRecord,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>>;

    /// One catalog generation alone: [`Store::record_preparation`] with no
    /// server rows and no events.
    fn record_catalog<'a>(
        &'a self,
        tenant_id: &'a str,
        server_id: &'a str,
        catalog_hash: &'a str,
        entries: &'a [CatalogEntry],
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let record = PreparationRecord {
                generations: vec![CatalogGeneration {
                    server_id: server_id.to_owned(),
                    catalog_hash: catalog_hash.to_owned(),
                    entries: entries.to_vec(),
                }],
                ..PreparationRecord::default()
            };
            let written = self.record_preparation(tenant_id, &record, now).await?;
            Ok(written.first().copied().unwrap_or(false))
        })
    }

    /// Appends one event outside a preparation (a catalog change seen
    /// mid-session, a disconnection, a bridge session); `tenant_id` is
    /// `None` for a server that belongs to no one tenant.
    fn record_event<'a>(
        &'a self,
        tenant_id: Option<&'a str>,
        event: &'a PlatformEvent,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// A server's catalog history, oldest generation first.
    fn catalog_history<'a>(
        &'a self,
        tenant_id: &'a str,
        server_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<CatalogRow>, StoreError>>;

    /// Suspends a claimed invocation (a control tool waiting on a user or a
    /// child run): it stays RUNNING with `suspended_kind` and
    /// `suspended_ref` set and its lease released, so no recovery sweep
    /// takes it. False under a stale fence.
    fn suspend_invocation<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        fence: Fence,
        kind: &'a str,
        reference: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Completes a suspended invocation with its terminal record and
    /// events; false unless it is RUNNING and suspended.
    fn complete_suspended<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        terminal: &'a TerminalRecord,
        events: &'a [ToolEvent],
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Records a session. When its id is already recorded, nothing is
    /// written and the recorded row is returned instead, to be compared.
    fn open_session<'a>(
        &'a self,
        session: &'a SessionRecord,
    ) -> BoxFuture<'a, Result<SessionRecord, StoreError>>;

    /// A session by its id, whichever tenant holds it: the id is what a
    /// caller presents, and the row says whose it is.
    fn session(&self, session_id: Uuid)
    -> BoxFuture<'_, Result<Option<SessionRecord>, StoreError>>;

    /// Marks a session used at `now`.
    fn touch_session(
        &self,
        session_id: Uuid,
        now: DateTime<Utc>,
    ) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Deletes the sessions last used before `before`; how many.
    fn forget_sessions(&self, before: DateTime<Utc>) -> BoxFuture<'_, Result<u64, StoreError>>;

    /// Writes a tenant's server row (insert or replace by server id).
    fn put_mcp_server<'a>(
        &'a self,
        tenant_id: &'a str,
        server: &'a McpServerRow,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// A tenant's server row.
    fn mcp_server<'a>(
        &'a self,
        tenant_id: &'a str,
        server_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<McpServerRow>, StoreError>>;

    /// Removes a tenant's server row; false when there was none.
    fn delete_mcp_server<'a>(
        &'a self,
        tenant_id: &'a str,
        server_id: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// The review queue: the tenant's UNCERTAIN invocations no human has
    /// resolved yet, oldest first, at most `limit`.
    fn review_queue<'a>(
        &'a self,
        tenant_id: &'a str,
        limit: i64,
    ) -> BoxFuture<'a, Result<Vec<InvocationRecord>, StoreError>>;

    /// Records a resolution beside an UNCERTAIN invocation; the invocation's
    /// own row is not touched. Returns false when the invocation is not
    /// UNCERTAIN, is not the tenant's, or was already resolved.
    fn resolve_review<'a>(
        &'a self,
        tenant_id: &'a str,
        review: &'a ReviewRecord,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Events after the cursor, in id order; only ids no running transaction
    /// can still fill in below, so a reader never skips one.
    fn events_after(
        &self,
        after: i64,
        limit: i64,
    ) -> BoxFuture<'_, Result<Vec<EventRecord>, StoreError>>;
}
