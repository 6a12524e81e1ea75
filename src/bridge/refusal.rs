//! What a script's request on its turn's socket is refused with: one type,
//! each variant with its status and its stable wire code in one place, and
//! one `reply()` that counts the refusals by code.

use hyper::StatusCode;

use crate::edge::{BodyError, Reply, error};
use crate::ports::Metrics;

/// Why a script's request was not served.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The connecting process is not the turn's sandbox user; its
    /// connection is closed before a byte is read.
    #[error("the peer is not the turn's sandbox user")]
    ForbiddenPeer,
    /// The bearer token is missing or not the turn's.
    #[error("missing or wrong turn token")]
    Unauthorized,
    /// The turn was closed or expired.
    #[error("the turn is closed")]
    TurnClosed,
    /// The turn's session ended.
    #[error("the turn's session is closed")]
    SessionClosed,
    /// No artifact of the turn's run has this id.
    #[error("no such artifact")]
    ArtifactNotFound,
    /// The artifact's record or bytes could not be read.
    #[error("the artifact could not be read")]
    ArtifactUnavailable,
    /// No route has this method and path.
    #[error("no such resource")]
    NotFound,
    /// The node drains.
    #[error("toolgate is shutting down")]
    Draining,
    /// Another call of the turn is in flight.
    #[error("another call of this turn is in flight; calls are made one at a time")]
    CallInFlight,
    /// The request's body was refused (too large, too slow, not the JSON
    /// asked for).
    #[error(transparent)]
    Body(#[from] BodyError),
    /// The approval outlived its hold: the turn is suspended and closed.
    #[error("the approval was not decided within the hold; the turn is closed")]
    TurnSuspended,
    /// A control tool suspended the run.
    #[error("the call suspended the run; it completes through the control API")]
    CallSuspended,
    /// The pipeline left a call neither ended nor held.
    #[error("the call is still pending")]
    StillPending,
}

impl Refusal {
    /// The stable code a script's client reads (`error.code`).
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::ForbiddenPeer => "forbidden_peer",
            Refusal::Unauthorized => "unauthorized",
            Refusal::TurnClosed | Refusal::SessionClosed => "turn_closed",
            Refusal::ArtifactNotFound | Refusal::NotFound => "not_found",
            Refusal::ArtifactUnavailable => "artifact_unavailable",
            Refusal::Draining => "draining",
            Refusal::CallInFlight => "call_in_flight",
            Refusal::Body(_) => "invalid_request",
            Refusal::TurnSuspended => "turn_suspended",
            Refusal::CallSuspended => "call_suspended",
            Refusal::StillPending => "internal",
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            Refusal::ForbiddenPeer => StatusCode::FORBIDDEN,
            Refusal::Unauthorized => StatusCode::UNAUTHORIZED,
            Refusal::TurnClosed | Refusal::SessionClosed => StatusCode::GONE,
            Refusal::ArtifactNotFound | Refusal::NotFound => StatusCode::NOT_FOUND,
            Refusal::ArtifactUnavailable | Refusal::Draining => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::CallInFlight | Refusal::TurnSuspended | Refusal::CallSuspended => {
                StatusCode::CONFLICT
            }
            Refusal::Body(_) => StatusCode::BAD_REQUEST,
            Refusal::StillPending => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Whether it refuses the script's request, rather than ending a call
    /// the script made: what `bridge_refusals_total` counts.
    fn counted(&self) -> bool {
        !matches!(
            self,
            Refusal::TurnSuspended | Refusal::CallSuspended | Refusal::StillPending
        )
    }

    /// Counts it (by code) when it is a refusal.
    pub(super) fn count(&self, metrics: &dyn Metrics) {
        if self.counted() {
            metrics.increment(
                "bridge_refusals_total",
                vec![("code", self.code().to_owned())],
            );
        }
    }

    /// The answer: `{"error": {"code", "message"}}` with its status (a
    /// refused body answers as the edge words it), counted.
    pub(super) fn reply(&self, metrics: &dyn Metrics) -> Reply {
        self.count(metrics);
        match self {
            Refusal::Body(body) => body.reply(),
            refusal => error(refusal.status(), refusal.code(), &refusal.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_has_its_code_and_status() {
        for (refusal, code, status) in [
            (Refusal::Unauthorized, "unauthorized", 401),
            (Refusal::TurnClosed, "turn_closed", 410),
            (Refusal::SessionClosed, "turn_closed", 410),
            (Refusal::ArtifactNotFound, "not_found", 404),
            (Refusal::ArtifactUnavailable, "artifact_unavailable", 503),
            (Refusal::Draining, "draining", 503),
            (Refusal::CallInFlight, "call_in_flight", 409),
            (Refusal::TurnSuspended, "turn_suspended", 409),
            (Refusal::CallSuspended, "call_suspended", 409),
            (Refusal::StillPending, "internal", 500),
        ] {
            assert_eq!(refusal.code(), code);
            assert_eq!(refusal.status().as_u16(), status, "{code}");
        }
        assert!(!Refusal::TurnSuspended.counted());
        assert!(Refusal::CallInFlight.counted());
    }
}
