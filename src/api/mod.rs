//! The control API (ARCHITECTURE.md §2.1): the agent runtime's and the
//! operator's edge. Each resource's module translates a request into a call
//! on a pipeline service (sessions, batch admission, approvals, tenant
//! servers) or on the bridge (to open and close turns), and the answer back
//! into bytes; `listen` serves the sockets, checks the TCP token and is the
//! one rescue point that turns any handler error into the one error shape.
//!
//! Requests are size-limited and strictly parsed (unknown fields refused);
//! no message echoes a value from the request or text from a remote.

mod calls;
pub mod client;
mod events;
mod grants;
mod listen;
mod lists;
mod operator;
pub mod ops;
mod sessions;
mod tenants;
mod wire;

use std::sync::Arc;

use hyper::StatusCode;

use crate::bridge::{Bridge, TurnError};
use crate::edge::{BodyError, Reply, error};
use crate::edge::{ConnectionCap, EdgeLimits, InFlight};
use crate::pipeline::Pipeline;
use crate::pipeline::admission::{Admission, AdmissionError};
use crate::pipeline::approvals::Approvals;
use crate::pipeline::artifacts::{ArtifactReadError, Artifacts};
use crate::pipeline::sessions::{SessionError, Sessions};
use crate::pipeline::tenant_servers::{TenantServerError, TenantServers};
use crate::ports::{
    Clock, EventStore, InvocationStore, Metrics, OperatorStore, ReviewStore, StoreError,
};

/// What the API is configured with.
#[derive(Debug, Clone, Default)]
pub struct ApiSettings {
    /// Body size, header and body deadlines.
    pub limits: EdgeLimits,
}

/// The parts a control API is built from.
pub struct ApiParts {
    /// Sessions: open, and the one a call names.
    pub sessions: Arc<Sessions>,
    /// Runs a step's batch.
    pub admission: Admission,
    /// Completes suspended control tools.
    pub pipeline: Arc<Pipeline>,
    /// Lists and decides approvals.
    pub approvals: Arc<Approvals>,
    /// Tenant HTTP servers.
    pub tenant_servers: TenantServers,
    /// Artifacts, read by their owner.
    pub artifacts: Arc<Artifacts>,
    /// Continues a caller's trace from its `traceparent`.
    pub continue_trace: crate::ports::metrics::TraceContinuation,
    /// Opens and closes turns.
    pub bridge: Arc<Bridge>,
    /// The recorded rows, for reads.
    pub invocations: Arc<dyn InvocationStore>,
    /// The review queue.
    pub reviews: Arc<dyn ReviewStore>,
    /// The events outbox.
    pub events: Arc<dyn EventStore>,
    /// The operator's lists, across tenants.
    pub operator: Arc<dyn OperatorStore>,
    /// Each principal's `oauth2_user` grants, listed.
    pub grants: Arc<dyn crate::ports::GrantStore>,
    /// Ends them, and revokes them upstream.
    pub revocation: Arc<dyn crate::ports::Revocation>,
    /// What `/metrics` renders.
    pub metrics: Arc<dyn Metrics>,
    /// Requests in flight on both edges, for the drain.
    pub in_flight: Arc<InFlight>,
    /// Control connections held at once, on both listeners.
    pub connections: ConnectionCap,
    /// What `/readyz` answers, as the operations listener does.
    pub readiness: Arc<ops::Operations>,
    /// Reloads the node from its configuration (`POST /v1/reload`).
    pub reload: Arc<dyn crate::ports::Reload>,
    /// Now.
    pub clock: Arc<dyn Clock>,
    /// Limits.
    pub settings: ApiSettings,
}

/// The control API.
pub struct ControlApi {
    parts: ApiParts,
}

impl ControlApi {
    /// The API over its parts.
    pub fn new(parts: ApiParts) -> Arc<Self> {
        Arc::new(ControlApi { parts })
    }
}

/// Every way a control request can fail, each with one wire answer
/// ([`ApiError::reply`], the one rescue point).
#[derive(Debug, thiserror::Error)]
enum ApiError {
    /// The request is malformed; the message names where, never a value.
    #[error("{0}")]
    Invalid(String),
    /// The body was refused.
    #[error(transparent)]
    Body(#[from] BodyError),
    /// No such route or resource.
    #[error("no such resource")]
    NotFound,
    /// The resource is not in the state the request needs.
    #[error("{message}")]
    Conflict {
        code: &'static str,
        message: &'static str,
    },
    /// toolgate is draining.
    #[error("toolgate is shutting down")]
    Draining,
    /// A session could not be opened or used.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// A turn could not be opened.
    #[error(transparent)]
    Turn(#[from] TurnError),
    /// A tenant server was refused.
    #[error(transparent)]
    TenantServer(#[from] TenantServerError),
    /// A batch did not run to its end.
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An artifact could not be read.
    #[error(transparent)]
    Artifact(#[from] ArtifactReadError),
}

impl ApiError {
    /// The one error shape for every failure. A store failure is logged for
    /// the operator; the client hears only that the store did not answer.
    fn reply(self) -> Reply {
        let store_failed = |failure: &StoreError| {
            tracing::error!(error = %failure, "the store failed a control API request");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                "the store did not answer",
            )
        };
        let session = |failure: &SessionError| match failure {
            SessionError::InvalidTenant => error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                &failure.to_string(),
            ),
            SessionError::InvalidIdentity => error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                &failure.to_string(),
            ),
            SessionError::Unknown => error(
                StatusCode::NOT_FOUND,
                "unknown_session",
                &failure.to_string(),
            ),
            SessionError::Conflict => error(
                StatusCode::CONFLICT,
                "session_conflict",
                &failure.to_string(),
            ),
            SessionError::ToolsChanged => error(
                StatusCode::CONFLICT,
                "session_tools_changed",
                &failure.to_string(),
            ),
            SessionError::ServersUnavailable => error(
                StatusCode::SERVICE_UNAVAILABLE,
                "tool_servers_unavailable",
                &failure.to_string(),
            ),
            SessionError::Store(store) => store_failed(store),
        };
        match &self {
            ApiError::Invalid(message) => {
                error(StatusCode::BAD_REQUEST, "invalid_request", message)
            }
            ApiError::Body(refused) => refused.reply(),
            ApiError::NotFound => error(StatusCode::NOT_FOUND, "not_found", "no such resource"),
            ApiError::Conflict { code, message } => error(StatusCode::CONFLICT, code, message),
            ApiError::Draining => error(
                StatusCode::SERVICE_UNAVAILABLE,
                "draining",
                "toolgate is shutting down",
            ),
            ApiError::Session(failure) => session(failure),
            ApiError::Turn(TurnError::InvalidScriptHash) => error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "script_sha256 must be 64 lowercase hex digits",
            ),
            ApiError::Turn(TurnError::NegativeStep) => error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "step_number must not be negative",
            ),
            ApiError::Turn(failure @ TurnError::RunNotOwned) => {
                error(StatusCode::FORBIDDEN, "run_not_owned", &failure.to_string())
            }
            ApiError::Turn(TurnError::Session(failure)) => session(failure),
            ApiError::Turn(TurnError::Store(store)) => store_failed(store),
            ApiError::Turn(TurnError::Socket(failure)) => {
                tracing::warn!(error = %failure, "turn not opened");
                error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "turn_unavailable",
                    "the turn's socket could not be created",
                )
            }
            ApiError::TenantServer(TenantServerError::InvalidTenant) => error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                listen::TENANT_RULE,
            ),
            ApiError::TenantServer(TenantServerError::Taken) => error(
                StatusCode::CONFLICT,
                "server_id_taken",
                "an operator server has this server_id",
            ),
            ApiError::TenantServer(failure @ TenantServerError::Invalid(_)) => error(
                StatusCode::BAD_REQUEST,
                "invalid_server",
                &failure.to_string(),
            ),
            ApiError::TenantServer(TenantServerError::Store(store)) => store_failed(store),
            ApiError::Admission(AdmissionError::NegativeStep) => error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "step_number must not be negative",
            ),
            ApiError::Admission(failure @ AdmissionError::InvalidCallId) => error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                &failure.to_string(),
            ),
            ApiError::Admission(failure @ AdmissionError::CallLost) => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                &failure.to_string(),
            ),
            ApiError::Store(store) => store_failed(store),
            ApiError::Artifact(ArtifactReadError::Store(store)) => store_failed(store),
            ApiError::Artifact(ArtifactReadError::Unreadable) => {
                tracing::error!("a recorded artifact's bytes could not be read");
                error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "artifact_unavailable",
                    "the artifact's bytes could not be read",
                )
            }
        }
    }
}
