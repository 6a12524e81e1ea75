//! The events outbox: a monotonically increasing id, tool events written
//! with their commits, and the platform events beside them.

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use uuid::Uuid;

use super::StoreError;
use crate::domain::mcp_server::{AuthScheme, Transport};
use crate::domain::{ApprovalStatus, ReasonCode, ReviewResolution};
use crate::ports::tool::BoxFuture;

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
    /// A connection toolgate closed itself: unused for its idle timeout
    /// (`mcp.closed.idle`) or at shutdown (`mcp.closed.shutdown`). The same
    /// event type as a failure, with a reason no failure carries.
    ServerClosed {
        /// The server.
        server_id: String,
        /// `mcp.closed.idle` or `mcp.closed.shutdown`.
        reason: &'static str,
    },
    /// Ladder step 2: a mid-session 401 led to one re-authentication.
    ServerReauthenticated {
        /// The server.
        server_id: String,
        /// How it authenticates.
        scheme: AuthScheme,
        /// `renewed` (a new value, the call may be retried), `identical`
        /// (the same value again: the ladder stops) or `failed` (no value).
        outcome: &'static str,
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
    /// A replayed turn's call differs from the one recorded at its ordinal
    /// (another tool or other arguments) and may act: held for approval or
    /// refused, as `bridge.replay_divergence` says.
    BridgeReplayDiverged {
        /// The run.
        run_id: Uuid,
        /// The step.
        step_number: i64,
        /// The call id both share.
        call_id: String,
        /// The call recorded at the ordinal.
        recorded_invocation_id: Uuid,
        /// Its tool.
        recorded_tool: String,
        /// The call asked for now (its row, when it has one).
        invocation_id: Option<Uuid>,
        /// Its tool.
        tool: String,
        /// `held` for approval or `refused`.
        outcome: &'static str,
    },
    /// A skill was loaded naming tools its session did not pin; it loaded
    /// anyway, and the model was told which.
    SkillToolMissing {
        /// The session.
        session_id: Uuid,
        /// The skill's registry-style name.
        skill: String,
        /// Its required tools the session does not hold (registry names).
        missing_tools: Vec<String>,
    },
    /// A human decided an approval: written in the decision's commit.
    ApprovalDecided {
        /// The approval.
        approval_id: Uuid,
        /// The held invocation.
        invocation_id: Uuid,
        /// `approved` or `denied`.
        status: ApprovalStatus,
        /// Who decided.
        approver: String,
    },
    /// A human resolved an UNCERTAIN invocation: written in the
    /// resolution's commit.
    ReviewResolved {
        /// The invocation.
        invocation_id: Uuid,
        /// The verdict.
        resolution: ReviewResolution,
        /// Who gave it.
        resolver: String,
    },
    /// A front-door call past its intent ran on after its request's stream
    /// closed: its answer was never delivered (a re-issue reads it).
    FrontAnswerUndelivered {
        /// The call's row.
        invocation_id: Uuid,
        /// The session whose stream closed.
        session_id: Uuid,
    },
    /// A front-door call asked again after its answer went undelivered was
    /// placed on that call by the re-issue rule.
    FrontCallReissued {
        /// The call's row.
        invocation_id: Uuid,
        /// The session that asked again.
        session_id: Uuid,
        /// `same_call` within the window, `past_window` after it.
        reissue: &'static str,
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
            PlatformEvent::ServerDisconnected { .. } | PlatformEvent::ServerClosed { .. } => {
                "mcp.server.disconnected"
            }
            PlatformEvent::ServerReauthenticated { .. } => "mcp.server.reauthenticated",
            PlatformEvent::CatalogChanged { .. } => "mcp.catalog.changed",
            PlatformEvent::CatalogConflict { .. } => "mcp.catalog.conflict",
            PlatformEvent::ToolRejected { .. } => "mcp.tool.rejected",
            PlatformEvent::SkillToolMissing { .. } => "skill.tool.missing",
            PlatformEvent::BridgeSessionOpened { .. } => "bridge.session.opened",
            PlatformEvent::BridgeSessionClosed { .. } => "bridge.session.closed",
            PlatformEvent::BridgeReplayDiverged { .. } => "bridge.replay.diverged",
            PlatformEvent::ApprovalDecided { .. } => "approval.decided",
            PlatformEvent::ReviewResolved { .. } => "review.resolved",
            PlatformEvent::FrontAnswerUndelivered { .. } => "tool.call.answer_undelivered",
            PlatformEvent::FrontCallReissued { .. } => "tool.call.reissued",
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
            PlatformEvent::ServerClosed { server_id, reason } => {
                json!({"server": server_id, "reason_code": reason})
            }
            PlatformEvent::ServerReauthenticated {
                server_id,
                scheme,
                outcome,
            } => json!({"server": server_id, "scheme": scheme, "outcome": outcome}),
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
            PlatformEvent::SkillToolMissing {
                session_id,
                skill,
                missing_tools,
            } => json!({"session_id": session_id, "skill": skill, "missing_tools": missing_tools}),
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
            PlatformEvent::BridgeReplayDiverged {
                run_id,
                step_number,
                call_id,
                recorded_invocation_id,
                recorded_tool,
                invocation_id,
                tool,
                outcome,
            } => json!({"run_id": run_id, "step_number": step_number, "call_id": call_id,
                        "recorded_invocation_id": recorded_invocation_id,
                        "recorded_tool": recorded_tool, "invocation_id": invocation_id,
                        "tool": tool, "outcome": outcome}),
            PlatformEvent::ApprovalDecided {
                approval_id,
                invocation_id,
                status,
                approver,
            } => json!({"approval_id": approval_id, "invocation_id": invocation_id,
                        "status": status, "approver": approver}),
            PlatformEvent::ReviewResolved {
                invocation_id,
                resolution,
                resolver,
            } => json!({"invocation_id": invocation_id, "resolution": resolution,
                        "resolver": resolver}),
            PlatformEvent::FrontAnswerUndelivered {
                invocation_id,
                session_id,
            } => json!({"invocation_id": invocation_id, "session_id": session_id}),
            PlatformEvent::FrontCallReissued {
                invocation_id,
                session_id,
                reissue,
            } => json!({"invocation_id": invocation_id, "session_id": session_id,
                        "reissue": reissue}),
        }
    }
}

/// The outbox.
pub trait EventStore: Send + Sync {
    /// Appends one event outside a preparation (a catalog change seen
    /// mid-session, a disconnection, a bridge session); `tenant_id` is
    /// `None` for a server that belongs to no one tenant.
    fn record_event<'a>(
        &'a self,
        tenant_id: Option<&'a str>,
        event: &'a PlatformEvent,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Events after the cursor, in id order, of one tenant when `tenant_id`
    /// is given; only ids no running transaction can still fill in below,
    /// so a reader never skips one.
    fn events_after<'a>(
        &'a self,
        after: i64,
        limit: i64,
        tenant_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<EventRecord>, StoreError>>;
}
