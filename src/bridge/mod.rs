//! The orchestration bridge: a turn end to end. Opening one binds its socket
//! and mints its token; its server loop takes scripts' requests on that
//! socket; each call gets its ordinal and call id here, counts against the
//! cap, enters the one pipeline at step 1 and, when it needs an approval,
//! is held until the decision wakes it or the hold runs out.
//!
//! The control API opens and closes turns through [`Bridge`]; the bridge
//! never uses the API.

mod call;
mod refusal;
mod server;
mod turn;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::domain::TrustLevel;
use crate::edge::{ConnectionCap, EdgeLimits, InFlight};
use crate::pipeline::approvals::Approvals;
use crate::pipeline::sessions::{SessionError, Sessions};
use crate::pipeline::{Pipeline, ReplayDivergence};
use crate::ports::{Clock, EventStore, Metrics, PlatformEvent, TurnRecord, TurnStore};

pub use turn::{
    AccessDenied, Admission, BridgeError, CallInFlight, SOCKET_NAME, TOKEN_BYTES, Turn,
    TurnBinding, Turns, call_id,
};

/// How long past its expiry a turn still open is left to its own node's
/// sweep before any node records it as expired: ten of the bridge's sweeps,
/// and far more than the default clock skew between nodes (5 s).
const ABANDONED_TURN_GRACE: chrono::TimeDelta = chrono::TimeDelta::minutes(5);

/// How turns behave.
#[derive(Debug, Clone)]
pub struct BridgeSettings {
    /// Body size, header and body deadlines of the turns' sockets.
    pub limits: EdgeLimits,
    /// Connections one turn's socket holds at once.
    pub turn_connections: usize,
    /// How long a script's call waits for an approval.
    pub approval_hold: Duration,
    /// The hold for particular tenants, over `approval_hold`.
    pub tenant_approval_holds: std::collections::HashMap<String, Duration>,
    /// Calls per turn, denied calls included.
    pub turn_call_cap: u32,
    /// How long a turn's token lives.
    pub turn_lifetime: Duration,
    /// What a replay's call that diverges from its record gets.
    pub replay_divergence: ReplayDivergence,
}

impl Default for BridgeSettings {
    fn default() -> Self {
        BridgeSettings {
            limits: EdgeLimits::default(),
            turn_connections: 4,
            approval_hold: Duration::from_secs(300),
            tenant_approval_holds: std::collections::HashMap::new(),
            turn_call_cap: 64,
            turn_lifetime: Duration::from_secs(3600),
            replay_divergence: ReplayDivergence::default(),
        }
    }
}

/// The parts a bridge is built from.
pub struct BridgeParts {
    /// The one pipeline.
    pub pipeline: Arc<Pipeline>,
    /// The sessions turns belong to.
    pub sessions: Arc<Sessions>,
    /// What a held call waits on.
    pub approvals: Arc<Approvals>,
    /// Artifacts, read by the turn's tenant.
    pub artifacts: Arc<crate::pipeline::artifacts::Artifacts>,
    /// Where `bridge.session.*` events go.
    pub events: Arc<dyn EventStore>,
    /// Where turns are recorded as they open and close, for the operator.
    pub turn_records: Arc<dyn TurnStore>,
    /// Now.
    pub clock: Arc<dyn Clock>,
    /// Refusals are counted.
    pub metrics: Arc<dyn Metrics>,
    /// Requests in flight on both edges, for the drain.
    pub in_flight: Arc<InFlight>,
    /// Connections all turns' sockets hold at once.
    pub connections: ConnectionCap,
    /// The turns' folders.
    pub turns: Turns,
    /// Limits.
    pub settings: BridgeSettings,
}

/// A turn to open.
#[derive(Debug, Clone)]
pub struct TurnRequest {
    /// The session whose tools the script may call.
    pub session_id: Uuid,
    /// The run.
    pub run_id: Uuid,
    /// The step every call of the turn shares.
    pub step_number: i64,
    /// The script's hash, 64 lowercase hex digits.
    pub script_sha256: String,
    /// The sandbox user, when the socket is to be handed over.
    pub sandbox_uid: Option<u32>,
    /// The trust of what produced the script.
    pub origin_trust: TrustLevel,
    /// The run's deadline: every call of the turn carries it, and the turn
    /// ends with it.
    pub deadline_at: Option<DateTime<Utc>>,
}

/// An opened turn, as its opener hears of it (the token only this once).
#[derive(Debug, Clone)]
pub struct OpenedTurn {
    /// The turn.
    pub turn_id: Uuid,
    /// Where the script connects.
    pub socket_path: PathBuf,
    /// The bearer token.
    pub token: String,
    /// When the token dies.
    pub expires_at: DateTime<Utc>,
}

/// Why a turn could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    /// The script hash is not 64 lowercase hex digits.
    #[error("script_sha256 must be 64 lowercase hex digits")]
    InvalidScriptHash,
    /// Steps count from zero.
    #[error("step_number must not be negative")]
    NegativeStep,
    /// The run was opened by another principal (or tenant).
    #[error("this run belongs to another caller; start a run of your own")]
    RunNotOwned,
    /// The session could not be used.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The socket or its folder could not be made.
    #[error(transparent)]
    Socket(#[from] BridgeError),
    /// The step's recorded calls could not be read.
    #[error(transparent)]
    Store(#[from] crate::ports::StoreError),
}

/// The bridge of this node: its open turns and their servers.
pub struct Bridge {
    parts: BridgeParts,
    /// Each open turn's server, stopped by cancelling its token.
    servers: Mutex<HashMap<Uuid, CancellationToken>>,
}

impl Bridge {
    /// A bridge over its parts.
    pub fn new(parts: BridgeParts) -> Arc<Self> {
        Arc::new(Bridge {
            parts,
            servers: Mutex::new(HashMap::new()),
        })
    }

    fn servers(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, CancellationToken>> {
        self.servers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens a turn: its socket, token and server, and its event.
    pub async fn open_turn(
        self: &Arc<Self>,
        request: TurnRequest,
    ) -> Result<OpenedTurn, TurnError> {
        if request.step_number < 0 {
            return Err(TurnError::NegativeStep);
        }
        let session = self.parts.sessions.get(request.session_id).await?;
        let script_ok = request.script_sha256.len() == 64
            && request
                .script_sha256
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !script_ok {
            return Err(TurnError::InvalidScriptHash);
        }
        // Before the run's recorded step is read: another principal's run
        // tells this turn nothing.
        let owned = self
            .parts
            .pipeline
            .owns_run(
                &session.tenant_id,
                &session.principal.id,
                session.session_id,
                request.run_id,
            )
            .await?;
        if !owned {
            return Err(TurnError::RunNotOwned);
        }
        let lifetime = chrono::Duration::from_std(self.parts.settings.turn_lifetime)
            .unwrap_or(chrono::Duration::hours(1));
        let expires_at = (self.parts.clock.now() + lifetime).min(
            request
                .deadline_at
                .unwrap_or(chrono::DateTime::<Utc>::MAX_UTC),
        );
        // A replay of an earlier turn: what it recorded, to compare each
        // call with the one recorded at its ordinal. One read per turn.
        let recorded = self
            .parts
            .pipeline
            .step_calls(&session.tenant_id, request.run_id, request.step_number)
            .await?
            .into_iter()
            .filter(|row| row.identity.call_id.starts_with(turn::CALL_ID_PREFIX))
            .map(|row| {
                (
                    row.identity.call_id,
                    turn::RecordedCall {
                        invocation_id: row.identity.id,
                        tool_name: row.identity.tool_name,
                        arguments_hash: row.identity.arguments_hash,
                    },
                )
            })
            .collect();
        let binding = TurnBinding {
            session_id: request.session_id,
            tenant_id: session.tenant_id.clone(),
            run_id: request.run_id,
            step_number: request.step_number,
            script_sha256: request.script_sha256,
            sandbox_uid: request.sandbox_uid,
            origin_trust: request.origin_trust,
            deadline_at: request.deadline_at,
            recorded,
        };
        let (turn, token, listener) = self.parts.turns.open(binding, expires_at)?;
        let stop = CancellationToken::new();
        self.servers().insert(turn.id, stop.clone());
        tokio::spawn(server::serve_turn(
            self.clone(),
            turn.clone(),
            listener,
            stop,
        ));
        let record = TurnRecord {
            turn_id: turn.id,
            tenant_id: turn.binding.tenant_id.clone(),
            session_id: turn.binding.session_id,
            run_id: turn.binding.run_id,
            step_number: turn.binding.step_number,
            script_sha256: turn.binding.script_sha256.clone(),
            state: crate::domain::TurnState::Open,
            calls: 0,
            opened_at: self.parts.clock.now(),
            expires_at: turn.expires_at,
            closed_at: None,
        };
        if let Err(failure) = self.parts.turn_records.record_turn(&record).await {
            tracing::warn!(error = %failure, "a turn's opening was not recorded");
        }
        self.record(
            &turn,
            PlatformEvent::BridgeSessionOpened {
                run_id: turn.binding.run_id,
                step_number: turn.binding.step_number,
                script_hash: turn.binding.script_sha256.clone(),
            },
        )
        .await;
        Ok(OpenedTurn {
            turn_id: turn.id,
            socket_path: turn.socket_path(),
            token,
            expires_at: turn.expires_at,
        })
    }

    /// Tears a turn down: token dead, socket gone, server stopped, event
    /// recorded, and its record closed as `state` says why. Returns the
    /// calls it made, if it was open.
    pub async fn close_turn(&self, id: Uuid, state: crate::domain::TurnState) -> Option<u32> {
        let turn = self.parts.turns.close(id)?;
        if let Some(stop) = self.servers().remove(&id) {
            stop.cancel();
        }
        let closed = self
            .parts
            .turn_records
            .close_turn(
                &turn.binding.tenant_id,
                id,
                state,
                i64::from(turn.calls()),
                self.parts.clock.now(),
            )
            .await;
        if let Err(failure) = closed {
            tracing::warn!(error = %failure, "a turn's close was not recorded");
        }
        self.record(
            &turn,
            PlatformEvent::BridgeSessionClosed {
                run_id: turn.binding.run_id,
                step_number: turn.binding.step_number,
                calls: turn.calls(),
            },
        )
        .await;
        Some(turn.calls())
    }

    /// Closes turns past their expiry: their tokens are already dead, and
    /// their sockets go now.
    pub async fn close_expired(&self) {
        let now = self.parts.clock.now();
        let expired: Vec<Uuid> = self
            .servers()
            .keys()
            .copied()
            .filter(|id| {
                self.parts
                    .turns
                    .get(*id)
                    .is_some_and(|turn| now >= turn.expires_at)
            })
            .collect();
        for id in expired {
            self.close_turn(id, crate::domain::TurnState::Expired).await;
        }
        // Any node's sweep records what a stopped node left open. The grace
        // leaves each live node's own turns to its own sweep, which records
        // their calls.
        let before = now - ABANDONED_TURN_GRACE;
        match self.parts.turn_records.expire_abandoned_turns(before).await {
            Ok(0) => {}
            Ok(expired) => tracing::info!(turns = expired, "abandoned turns recorded as expired"),
            Err(failure) => tracing::warn!(error = %failure, "abandoned turns not expired"),
        }
    }

    /// Closes every turn (the drain's last step).
    pub async fn close_all(&self) {
        let open: Vec<Uuid> = self.servers().keys().copied().collect();
        for id in open {
            self.close_turn(id, crate::domain::TurnState::Closed).await;
        }
    }

    /// Turns open now.
    pub fn open_turns(&self) -> usize {
        self.servers().len()
    }

    /// The sessions open turns belong to: they stay in memory while a turn
    /// may still call.
    pub fn sessions_in_use(&self) -> HashSet<Uuid> {
        self.servers()
            .keys()
            .filter_map(|id| self.parts.turns.get(*id))
            .map(|turn| turn.binding.session_id)
            .collect()
    }

    async fn record(&self, turn: &Turn, event: PlatformEvent) {
        if let Err(failure) = self
            .parts
            .events
            .record_event(
                Some(&turn.binding.tenant_id),
                &event,
                self.parts.clock.now(),
            )
            .await
        {
            tracing::warn!(error = %failure, "bridge event not recorded");
        }
    }
}
