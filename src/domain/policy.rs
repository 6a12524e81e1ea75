//! What step 6 asks and what it answers.

use super::reason_codes::ReasonCode;
use super::session::Principal;
use super::tool::{IdempotencyClass, RiskLevel, SideEffectClass, ToolKind, ToolSource};
use super::trust::TrustLevel;

/// The action a call proposes, as policy sees it: the declared
/// classification and where the request's trust came from. Never the
/// arguments' values.
#[derive(Debug, Clone, Copy)]
pub struct ProposedAction<'a> {
    /// The tenant.
    pub tenant_id: &'a str,
    /// Who the call acts for.
    pub principal: &'a Principal,
    /// The registry name.
    pub tool: &'a str,
    /// Capability or control.
    pub kind: ToolKind,
    /// Where the tool comes from.
    pub source: ToolSource,
    /// Its side effect.
    pub side_effect: SideEffectClass,
    /// Its risk.
    pub risk: RiskLevel,
    /// Its idempotency.
    pub idempotency: IdempotencyClass,
    /// Minimum trust over the request's context items.
    pub origin_trust: TrustLevel,
    /// Where each argument came from (an argument nobody labelled is the
    /// model's, `ExternalUntrusted`).
    pub argument_trust: &'a super::ArgumentTrust,
    /// The call's arguments, in canonical form.
    pub arguments: &'a serde_json::Value,
}

/// Policy's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyDecision {
    /// Proceed.
    Allow,
    /// Refuse, for this reason.
    Deny(ReasonCode),
    /// Proceed only after a human approves; the code says why approval is
    /// required.
    RequireApproval(ReasonCode),
}

/// What a replayed turn's call gets when it differs from the call recorded
/// at its ordinal and may act (`bridge.replay_divergence`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplayDivergence {
    /// Held for approval, both calls shown.
    #[default]
    Approve,
    /// Refused, `bridge.replay.diverged`.
    Refuse,
}
