//! The design's 401 ladder, climbed once per server per session.

use std::collections::HashMap;
use std::sync::Arc;

use uuid::Uuid;

use super::{Endpoint, McpServer, lock};
use crate::adapters::mcp::auth::AuthError;
use crate::adapters::mcp::client::Connection;
use crate::adapters::mcp::render::unauthorized;
use crate::domain::recovery::{RecoveryDecision, decide};
use crate::domain::{ReasonCode, ToolResult, ToolSpec};
use crate::ports::{PlatformEvent, ToolExecutionContext};

/// Sessions whose ladder state one server remembers; the oldest go first.
const LADDER_SESSIONS: usize = 65_536;

/// Where one session stands on one server's 401 ladder; no entry is the
/// foot of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ladder {
    /// The one re-authentication has run.
    Reauthenticated,
    /// Step 5: every call answers `tool.server_unauthorized` undialled.
    Unauthorized,
}

/// The ladder states of one server's sessions, the oldest forgotten first.
#[derive(Default)]
pub(super) struct Ladders {
    states: HashMap<Uuid, Ladder>,
    order: std::collections::VecDeque<Uuid>,
}

impl Ladders {
    pub(super) fn get(&self, session: Uuid) -> Option<Ladder> {
        self.states.get(&session).copied()
    }

    /// Puts the session back at the foot of the ladder.
    pub(super) fn clear(&mut self, session: Uuid) {
        if self.states.remove(&session).is_some() {
            self.order.retain(|kept| *kept != session);
        }
    }

    pub(super) fn set(&mut self, session: Uuid, state: Ladder) {
        if self.states.insert(session, state).is_none() {
            self.order.push_back(session);
            while self.order.len() > LADDER_SESSIONS {
                if let Some(oldest) = self.order.pop_front() {
                    self.states.remove(&oldest);
                }
            }
        }
    }
}

/// Where a climb leaves the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Climb {
    /// Send it once more.
    Retry,
    /// The ladder ends it (`tool.server_unauthorized`).
    Refused,
    /// The principal's own grant is gone (its authorization server refused
    /// it): the call answers `tool.consent_required`, and the session's
    /// calls after a new consent are dialled again.
    ConsentRequired,
}

impl McpServer {
    /// Ladder steps 2 to 4 for a call that met a 401: whether it may be
    /// sent once more. One re-authentication per server per session; a
    /// value identical to the refused one, or none, ends the ladder; the
    /// retry happens only where the recovery table would re-send the call.
    pub(super) async fn climb(&self, spec: &ToolSpec, context: &ToolExecutionContext) -> Climb {
        let Endpoint::Http { authenticator, .. } = &self.endpoint else {
            return Climb::Refused;
        };
        {
            let mut ladders = lock(&self.ladders);
            match ladders.get(context.session_id) {
                // A 401 after the one re-authentication is a failing
                // server, not an expired credential.
                Some(_) => {
                    ladders.set(context.session_id, Ladder::Unauthorized);
                    return Climb::Refused;
                }
                None => ladders.set(context.session_id, Ladder::Reauthenticated),
            }
        }
        let renewed = authenticator.renew().await;
        let outcome = match &renewed {
            Ok(true) => "renewed",
            Ok(false) => "identical",
            Err(_) => "failed",
        };
        self.record(
            Some(&context.tenant_id),
            PlatformEvent::ServerReauthenticated {
                server_id: self.server_id().to_owned(),
                scheme: authenticator.scheme(),
                outcome,
            },
        )
        .await;
        if matches!(renewed, Err(AuthError::ConsentRequired)) {
            lock(&self.ladders).clear(context.session_id);
            return Climb::ConsentRequired;
        }
        if !matches!(renewed, Ok(true)) {
            lock(&self.ladders).set(context.session_id, Ladder::Unauthorized);
            return Climb::Refused;
        }
        // The watermark is committed before any call whose spec needs one,
        // so whether it is set is the spec's to say.
        if decide(spec.idempotency, spec.needs_effect_watermark()) == RecoveryDecision::Uncertain {
            Climb::Refused
        } else {
            Climb::Retry
        }
    }

    /// A call the ladder ends: `tool.server_unauthorized` (the executor makes
    /// it UNCERTAIN where the effect may have been sent). A session whose
    /// ladder is spent also drops the connection, which closes once no
    /// other call holds it.
    pub(super) async fn refused(
        &self,
        connection: &Arc<Connection>,
        context: &ToolExecutionContext,
    ) -> ToolResult {
        if lock(&self.ladders).get(context.session_id) == Some(Ladder::Unauthorized) {
            self.forget(
                &context.tenant_id,
                connection,
                ReasonCode::ToolServerUnauthorized,
            )
            .await;
        }
        unauthorized(false)
    }
}
