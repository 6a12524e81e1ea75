//! The `tool_invocations` aggregate: the pipeline's four commits, the
//! effect watermark, deduplication, recovery's take-overs, the breaker's
//! counts, suspension, and the artifacts and reviews recorded beside rows.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use super::{Claim, Fence, StoreError};
use crate::domain::invocation::{Phase, SuspensionKind};
use crate::domain::{
    ArgumentTrust, Durability, IdempotencyClass, InvocationStatus, Principal, ReasonCode,
    ReviewResolution, SideEffectClass, ToolEventKind, ToolOutcomeStatus, ToolSource, TrustLevel,
};
use crate::ports::tool::BoxFuture;

/// How a new row starts: its status, and what that status needs, together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// RUNNING under the inserting worker: step 8's intent, claimed.
    Running,
    /// WAITING_FOR_APPROVAL (step 7), with the approval asked in the same
    /// commit and why.
    Waiting {
        approval_id: Uuid,
        reason_code: ReasonCode,
    },
    /// DENIED by policy before anything ran.
    Denied(ReasonCode),
    /// Ended before anything ran, as its code's status says (a refusal
    /// after policy: a budget, the breaker, a withdrawn argument).
    Ended(ReasonCode),
}

impl Start {
    /// The row's status.
    pub fn status(self) -> InvocationStatus {
        match self {
            Start::Running => InvocationStatus::Running,
            Start::Waiting { .. } => InvocationStatus::WaitingForApproval,
            Start::Denied(_) => InvocationStatus::Denied,
            Start::Ended(code) => code.status().invocation_status(),
        }
    }

    /// Why it waits or ended.
    pub fn reason_code(self) -> Option<ReasonCode> {
        match self {
            Start::Running => None,
            Start::Waiting { reason_code, .. } => Some(reason_code),
            Start::Denied(code) | Start::Ended(code) => Some(code),
        }
    }

    /// The approval a waiting row asks.
    pub fn approval_id(self) -> Option<Uuid> {
        match self {
            Start::Waiting { approval_id, .. } => Some(approval_id),
            _ => None,
        }
    }
}

/// What a call is, the same from its intent to its record and its events:
/// the row, whose and where it was asked, the tool and arguments it names,
/// and the classification snapshot recovery reads (never the registry of a
/// possibly different build).
#[derive(Debug, Clone, PartialEq)]
pub struct CallIdentity {
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
    /// Where each argument came from, as the caller carried it: what policy
    /// read, and what recovery's re-check reads again.
    pub argument_trust: ArgumentTrust,
    /// Who the call acts for; re-checked before any re-execution.
    pub principal: Principal,
    /// Shared by one parallel batch.
    pub parallel_group: Option<Uuid>,
    /// The run's deadline for this call.
    pub deadline_at: Option<DateTime<Utc>>,
}

impl CallIdentity {
    /// An event of this call, before anything about its end is known.
    pub fn event(&self, kind: ToolEventKind) -> ToolEvent {
        ToolEvent {
            kind,
            invocation_id: self.id,
            run_id: self.run_id,
            step_number: self.step_number,
            call_id: self.call_id.clone(),
            tool_name: self.tool_name.clone(),
            tool_source: self.tool_source,
            tool_version: self.tool_version.clone(),
            outcome_status: None,
            reason_code: None,
            idempotency_class: self.idempotency_class,
            effect_sent: false,
            duration_ms: None,
            output_bytes: None,
            truncated: false,
            parallel_group: self.parallel_group,
        }
    }
}

/// A row to insert: the call's intent (step 8), a call waiting for approval
/// (step 7) or one ended before it ran.
#[derive(Debug, Clone, PartialEq)]
pub struct NewInvocation {
    /// What the call is.
    pub identity: CallIdentity,
    /// How it starts.
    pub start: Start,
    /// How durable the insert's commit must be.
    pub durability: Durability,
}

/// How a row ended, written at step 13 (or by recovery).
#[derive(Debug, Clone, PartialEq)]
pub struct TerminalRecord {
    /// The outcome status the model read; the row's status follows from it
    /// ([`TerminalRecord::status`]).
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
    /// The artifacts the tool made (images, blobs), recorded with the row
    /// so their owner can read them.
    pub produced: Vec<StoredArtifact>,
    /// How durable step 13's commit must be; every other settlement is
    /// flushed whatever this says.
    pub durability: Durability,
}

impl TerminalRecord {
    /// SUCCEEDED, FAILED, DENIED or UNCERTAIN, as the outcome says: never
    /// stored beside it unchecked.
    pub fn status(&self) -> InvocationStatus {
        self.outcome_status.invocation_status()
    }

    /// The end of a call that produced no result: a refusal, an expiry, an
    /// uncertain recovery. Its status follows from the code.
    pub fn without_result(code: ReasonCode) -> TerminalRecord {
        let status = code.status();
        TerminalRecord {
            outcome_status: status,
            reason_code: Some(code),
            result: None,
            error: None,
            output_bytes: None,
            truncated: false,
            artifact: None,
            produced: Vec::new(),
            durability: Durability::Flushed,
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

/// An `artifacts` row as read back: where the bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactRecord {
    /// The artifact.
    pub artifact: StoredArtifact,
    /// The run whose call produced it.
    pub run_id: Uuid,
    /// Whose that run is (none for a run recorded before runs had owners).
    pub run_principal_id: Option<String>,
}

/// A `tool_invocations` row: the call's identity and classification
/// snapshot (valid in every state), the facts of its attempts that outlive
/// a state (the watermark, the approval on record), and its state, which
/// carries what is valid only in it.
#[derive(Debug, Clone, PartialEq)]
pub struct InvocationRecord {
    /// What the call is.
    pub identity: CallIdentity,
    /// The approval on record, while and after waiting: recovery asks
    /// whether it still allows a held row.
    pub approval_id: Option<Uuid>,
    /// The effect watermark: set once, kept whatever the row does after.
    pub effect_sent_at: Option<DateTime<Utc>>,
    /// Claims made of the row.
    pub attempt_number: i32,
    /// Incremented by every claim; what a [`Fence`] names.
    pub lease_epoch: i64,
    /// Why it waits (the approval's code) or how it ended (absent on
    /// success); carried by the row's later events.
    pub reason_code: Option<ReasonCode>,
    /// Row creation.
    pub created_at: DateTime<Utc>,
    /// Last claim.
    pub started_at: Option<DateTime<Utc>>,
    /// Where the row is, with what is valid only there.
    pub state: InvocationState,
}

/// Where a row is, with what is valid only there.
#[derive(Debug, Clone, PartialEq)]
pub enum InvocationState {
    /// WAITING_FOR_APPROVAL on its approval.
    Waiting {
        /// The pending approval.
        approval_id: Uuid,
    },
    /// AUTHORIZED, not yet running: held by `worker` under the row's
    /// epoch, or let go (`None`), for recovery to take.
    Authorized {
        /// The holding worker.
        worker: Option<Uuid>,
    },
    /// RUNNING under `worker` (or let go by it).
    Running {
        /// The holding worker.
        worker: Option<Uuid>,
    },
    /// RUNNING with its lease let go: a control tool waiting for its
    /// answer, which no sweep takes.
    Suspended(Suspension),
    /// Terminal.
    Ended(Box<Ended>),
}

/// What a suspended control tool waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suspension {
    /// What answers it.
    pub kind: SuspensionKind,
    /// The question or child run.
    pub reference: String,
}

/// How a row ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Ended {
    /// SUCCEEDED, FAILED, DENIED or UNCERTAIN.
    pub status: InvocationStatus,
    /// The outcome status the model read.
    pub outcome_status: ToolOutcomeStatus,
    /// The terminal write.
    pub completed_at: DateTime<Utc>,
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
    /// What it waited for, when it ended a suspended control tool.
    pub suspension: Option<Suspension>,
    /// The worker that held it last, for operators: the one that ended it,
    /// or the inserting one's for a row that ended before it ran.
    pub worker: Option<Uuid>,
}

impl InvocationState {
    /// The stored status.
    pub fn status(&self) -> InvocationStatus {
        match self {
            InvocationState::Waiting { .. } => InvocationStatus::WaitingForApproval,
            InvocationState::Authorized { .. } => InvocationStatus::Authorized,
            InvocationState::Running { .. } | InvocationState::Suspended(_) => {
                InvocationStatus::Running
            }
            InvocationState::Ended(ended) => ended.status,
        }
    }

    /// The state machine's phase.
    pub fn phase(&self) -> Phase {
        match self {
            InvocationState::Waiting { .. } => Phase::Waiting,
            InvocationState::Authorized { .. } => Phase::Authorized,
            InvocationState::Running { .. } => Phase::Running,
            InvocationState::Suspended(_) => Phase::Suspended,
            InvocationState::Ended(_) => Phase::Ended,
        }
    }

    /// The holding worker of an authorized or running row.
    pub fn worker(&self) -> Option<Uuid> {
        match self {
            InvocationState::Authorized { worker } | InvocationState::Running { worker } => *worker,
            _ => None,
        }
    }
}

impl InvocationRecord {
    /// The stored status.
    pub fn status(&self) -> InvocationStatus {
        self.state.status()
    }

    /// The fence of the row's current claim, if a worker holds it.
    pub fn fence(&self) -> Option<Fence> {
        self.state.worker().map(|worker_id| Fence {
            worker_id,
            lease_epoch: self.lease_epoch,
        })
    }

    /// How it ended, once it has.
    pub fn ended(&self) -> Option<&Ended> {
        match &self.state {
            InvocationState::Ended(ended) => Some(ended),
            _ => None,
        }
    }

    /// The outcome status, once terminal.
    pub fn outcome_status(&self) -> Option<ToolOutcomeStatus> {
        self.ended().map(|ended| ended.outcome_status)
    }

    /// What it waits for, or waited for before it ended.
    pub fn suspension(&self) -> Option<&Suspension> {
        match &self.state {
            InvocationState::Suspended(suspension) => Some(suspension),
            InvocationState::Ended(ended) => ended.suspension.as_ref(),
            _ => None,
        }
    }

    /// This row as held under its current claim; the row itself when no
    /// worker holds it.
    pub fn held(self) -> Result<Held, Box<InvocationRecord>> {
        match self.fence() {
            Some(fence) => Ok(Held { row: self, fence }),
            None => Err(Box::new(self)),
        }
    }
}

/// A row a worker holds: authorized or running, under `fence`. What the
/// store's claims return, and what only the holder may move on.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    /// The row.
    pub row: InvocationRecord,
    /// The claim it is held under.
    pub fence: Fence,
}

impl std::ops::Deref for Held {
    type Target = InvocationRecord;

    fn deref(&self) -> &InvocationRecord {
        &self.row
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

/// The breaker's counter for one identical call (name and arguments) in a
/// run: calls by outcome status and reason code, derived from the rows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BreakerTally {
    /// Rows by outcome status and reason code (absent on success).
    pub counts: Vec<(ToolOutcomeStatus, Option<ReasonCode>, i64)>,
    /// Successful calls before the count last restarted on new evidence.
    pub evidence_base: i64,
    /// The run's synthesis-only mark: the earliest step that left an
    /// identical-call count one below its threshold. Every later step of
    /// the run only answers.
    pub synthesis_after_step: Option<i64>,
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

/// A `runs` row: whose a run is, within its tenant (another tenant's run of
/// the same id is another run). Recorded by the run's first call or turn;
/// never changed after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOwner {
    pub run_id: Uuid,
    pub tenant_id: String,
    pub principal_id: String,
    /// The session whose call or turn opened the run.
    pub session_id: Uuid,
    pub opened_at: DateTime<Utc>,
}

/// The invocation rows. Each write is one short transaction (with the
/// events of its commit); none is held across tool I/O, and every write made
/// for an attempt is conditional on its [`Fence`].
pub trait InvocationStore: Send + Sync {
    /// Step 8 (or 7 with its approval, or a denial): inserts the row and its
    /// events in one commit under the inserting worker's fence (epoch 0), or
    /// returns the row already holding the key and writes nothing. A call
    /// with no approval pending is inserted RUNNING, its intent and claim
    /// one commit (started now, under the same epoch-0 fence). The commit is
    /// as durable as the row's `durability` says.
    fn insert_invocation<'a>(
        &'a self,
        new: &'a NewInvocation,
        claim: Claim,
        events: &'a [ToolEvent],
    ) -> BoxFuture<'a, Result<InsertOutcome, StoreError>>;

    /// As [`insert_invocation`](Self::insert_invocation) for a new row, in
    /// the same commit that shows the breaker has nothing to say: no
    /// identical call of the run (same tool, same arguments hash) has an
    /// outcome, and the run is not synthesis-only for the call's step.
    /// Returns the new row, or `None` with nothing written when the breaker
    /// has something to say or the key is already held; the caller then
    /// reads the tally and inserts as usual.
    fn insert_uncounted<'a>(
        &'a self,
        new: &'a NewInvocation,
        claim: Claim,
        events: &'a [ToolEvent],
    ) -> BoxFuture<'a, Result<Option<Held>, StoreError>>;

    /// An approved call's row moves from WAITING_FOR_APPROVAL to AUTHORIZED
    /// under the resuming worker's new fence. `None` when it is not waiting.
    fn authorize_waiting<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        claim: Claim,
        events: &'a [ToolEvent],
    ) -> BoxFuture<'a, Result<Option<Held>, StoreError>>;

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

    /// Step 9: AUTHORIZED to RUNNING under a new fence, with its events,
    /// committed as durably as `durability` says. `None` when the row is
    /// not AUTHORIZED under `fence`.
    fn claim_invocation<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        fence: Fence,
        now: DateTime<Utc>,
        events: &'a [ToolEvent],
        durability: Durability,
    ) -> BoxFuture<'a, Result<Option<Held>, StoreError>>;

    /// The effect watermark: sets `effect_sent_at` once (later calls keep the
    /// first value), committed as durably as `durability` says. `false` when
    /// the fence is stale, or the fence's worker no longer holds a live
    /// lease on the store's clock: the tool must not start.
    fn mark_effect_sent<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        fence: Fence,
        now: DateTime<Utc>,
        durability: Durability,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Step 13: the terminal write and its events, only under the current
    /// fence of an AUTHORIZED or RUNNING row, committed as durably as the
    /// record's `durability` says. `false` when the fence is stale and
    /// nothing changed.
    fn complete_invocation<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        fence: Fence,
        terminal: &'a TerminalRecord,
        events: &'a [ToolEvent],
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Lets go of a claimed AUTHORIZED or RUNNING row (not suspended) under
    /// its current fence without ending it, so recovery takes it at once:
    /// what a worker does with a row it could not settle. `false` when the
    /// fence is stale.
    fn release_invocation<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        fence: Fence,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Suspends a claimed invocation (a control tool waiting on a user or a
    /// child run): it stays RUNNING with `suspended_kind` and
    /// `suspended_ref` set and its lease released, so no recovery sweep
    /// takes it. False under a stale fence.
    fn suspend_invocation<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        fence: Fence,
        kind: SuspensionKind,
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

    /// Records `run` as its run's owner, unless the tenant's run of that id
    /// is recorded already; returns the recorded owner either way.
    fn open_run<'a>(&'a self, run: &'a RunOwner) -> BoxFuture<'a, Result<RunOwner, StoreError>>;

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

    /// One step of a run's rows, in creation order: what a replayed turn
    /// compares its calls with.
    fn step_invocations<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
        step_number: i64,
    ) -> BoxFuture<'a, Result<Vec<InvocationRecord>, StoreError>>;

    /// The oldest of a run's calls of `tool_name` with these canonical
    /// arguments that waits for an approval: the call a caller that cannot
    /// name its calls (an MCP client without `toolgate/call_id`) asks again.
    fn waiting_call<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
        tool_name: &'a str,
        arguments_hash: &'a str,
    ) -> BoxFuture<'a, Result<Option<InvocationRecord>, StoreError>>;

    /// The last of a run's succeeded calls of `tool_name` in that order,
    /// read without the rest of the run.
    fn latest_succeeded<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
        tool_name: &'a str,
    ) -> BoxFuture<'a, Result<Option<InvocationRecord>, StoreError>>;

    /// Recovery: takes over up to `limit` AUTHORIZED or RUNNING rows, not
    /// suspended, whose worker's lease has expired (on the store's clock)
    /// or was released, or that their worker let go, each under a new
    /// fence. Concurrent sweepers never take the same row.
    fn claim_expired(
        &self,
        claim: Claim,
        limit: i64,
    ) -> BoxFuture<'_, Result<Vec<Held>, StoreError>>;

    /// Deduplication's case 4 for one row: takes over an AUTHORIZED or
    /// RUNNING row, not suspended, whose worker's lease has expired (on the
    /// store's clock) or was released, or that its worker let go, under a
    /// new fence. `None` when its owner is alive (or it has moved on).
    fn take_over<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        claim: Claim,
    ) -> BoxFuture<'a, Result<Option<Held>, StoreError>>;

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

    /// Marks the run synthesis-only after `step`: the earliest such step
    /// is kept.
    fn mark_synthesis_only<'a>(
        &'a self,
        tenant_id: &'a str,
        run_id: Uuid,
        step: i64,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// An artifact's record, within its tenant (for the owner-scoped
    /// artifact routes; no tool reads artifacts back).
    fn artifact<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
    ) -> BoxFuture<'a, Result<Option<ArtifactRecord>, StoreError>>;

    /// Recovery found a held row's standing authority gone: the row goes
    /// back to WAITING_FOR_APPROVAL with a new pending approval, in one
    /// commit, under the current fence. The lease is released with it (a
    /// waiting row is no worker's). False under a stale fence.
    fn reopen_approval<'a>(
        &'a self,
        tenant_id: &'a str,
        id: Uuid,
        fence: Fence,
        approval_id: Uuid,
        reason_code: ReasonCode,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
}

/// What waits on a human, across every tenant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueDepths {
    /// UNCERTAIN invocations not yet resolved.
    pub unresolved_uncertain: i64,
    /// Approvals pending.
    pub pending_approvals: i64,
}

/// The review queue: UNCERTAIN rows and the resolutions recorded beside
/// them (listed by [`super::OperatorStore::list_review_items`]).
pub trait ReviewStore: Send + Sync {
    /// Across every tenant: UNCERTAIN invocations not yet resolved, and
    /// approvals waiting for a decision (for the operator's gauges).
    fn queue_depths(&self) -> BoxFuture<'_, Result<QueueDepths, StoreError>>;

    /// Records a resolution beside an UNCERTAIN invocation; the invocation's
    /// own row is not touched. Returns false when the invocation is not
    /// UNCERTAIN, is not the tenant's, or was already resolved.
    fn resolve_review<'a>(
        &'a self,
        tenant_id: &'a str,
        review: &'a ReviewRecord,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
}
