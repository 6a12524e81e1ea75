//! The reason-code table: every code an outcome can carry, with its status,
//! retryability, remediation and the one fixed message the model reads.
//!
//! This file is the checked-in table the design document asks for and is
//! reviewed like code. A code is a Rust variant, so naming one that is not in
//! the table fails the build; nothing composes a message at runtime. A message
//! never contains a rule, a pattern, a profile, a hostname, a stack trace,
//! remote text, or anyone's data.

use super::outcome::{Remediation, ToolOutcomeStatus};

macro_rules! reason_codes {
    ($(
        $(#[$meta:meta])*
        $variant:ident => $code:literal, $status:ident, retryable: $retryable:literal,
            $remediation:ident, $message:literal;
    )+) => {
        /// A stable reason code. Serialized as its dotted string.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum ReasonCode {
            $( $(#[$meta])* $variant, )+
        }

        impl ReasonCode {
            /// Every code in the table, in table order.
            pub const ALL: &'static [ReasonCode] = &[$(ReasonCode::$variant),+];

            /// The dotted code, e.g. `tool.timeout`.
            pub fn as_str(self) -> &'static str {
                match self { $(ReasonCode::$variant => $code,)+ }
            }

            /// The outcome status this code belongs to.
            pub fn status(self) -> ToolOutcomeStatus {
                match self { $(ReasonCode::$variant => ToolOutcomeStatus::$status,)+ }
            }

            /// Whether the same call may succeed if tried again.
            pub fn retryable(self) -> bool {
                match self { $(ReasonCode::$variant => $retryable,)+ }
            }

            /// What the model can do about it.
            pub fn remediation(self) -> Remediation {
                match self { $(ReasonCode::$variant => Remediation::$remediation,)+ }
            }

            /// The fixed message the model reads.
            pub fn message(self) -> &'static str {
                match self { $(ReasonCode::$variant => $message,)+ }
            }
        }

        impl std::str::FromStr for ReasonCode {
            type Err = crate::domain::UnknownMember;

            fn from_str(text: &str) -> Result<Self, Self::Err> {
                match text {
                    $($code => Ok(ReasonCode::$variant),)+
                    _ => Err(crate::domain::UnknownMember {
                        set: "ReasonCode",
                        expected: &[$($code),+],
                    }),
                }
            }
        }
    };
}

reason_codes! {
    // --- denied: policy or scope; no tool ran ---
    /// The name resolves to no registered tool (Section 9.2, row sixteen).
    PolicyMatrixUnknownTool => "policy.matrix.unknown_tool", Denied, retryable: false, None,
        "Not performed. No tool by this name is available.";
    /// The tool is registered but not enabled for this agent.
    PolicyAgentToolDisabled => "policy.agent.tool_disabled", Denied, retryable: false, None,
        "Not performed. This tool is not enabled for this agent.";
    /// The principal lacks a scope the tool requires.
    PolicyScopeMissing => "policy.scope.missing", Denied, retryable: false, None,
        "Not performed. The caller lacks a permission this tool requires.";
    /// The policy matrix denies this combination outright.
    PolicyMatrixDenied => "policy.matrix.denied", Denied, retryable: false, None,
        "Not performed. Policy does not permit this action.";
    /// An external write needed approval, and the approver refused.
    PolicyMatrixExternalWrite => "policy.matrix.external_write", Denied, retryable: false, None,
        "Not performed. Approval was required and was denied.";
    /// The policy matrix requires approval for this combination.
    PolicyMatrixApprovalRequired => "policy.matrix.approval_required", Denied, retryable: false, None,
        "Not performed. Approval was required and was not given.";
    /// A per-name rule denies the tool.
    PolicyRuleDenied => "policy.rule.denied", Denied, retryable: false, None,
        "Not performed. Policy does not permit this action.";
    /// A per-name rule requires approval, and none was given.
    PolicyRuleApprovalRequired => "policy.rule.approval_required", Denied, retryable: false, None,
        "Not performed. Approval was required and was not given.";
    /// Approval was required and the approver refused.
    PolicyApprovalDenied => "policy.approval.denied", Denied, retryable: false, None,
        "Not performed. Approval was required and was denied.";
    /// Approval was required and did not arrive within the hold.
    PolicyApprovalExpired => "policy.approval.expired", Denied, retryable: false, None,
        "Not performed. Approval was required and was not given in time.";
    /// The third identical denied proposal in a run: the run fails.
    PolicyBreakerRepeatedDenial => "policy.breaker.repeated_denial", Denied, retryable: false, None,
        "Not performed. This call was denied repeatedly, so the run is stopping.";
    /// An identical call already ended uncertain in this run.
    PolicyBreakerUncertainRepeat => "policy.breaker.uncertain_repeat", Denied, retryable: false, None,
        "Not performed. An identical call has an unknown outcome and will not be repeated.";
    /// The call names a run another principal (or tenant) opened: nothing
    /// is recorded in that run, and nothing about it is told.
    PolicyRunNotOwned => "policy.run.not_owned", Denied, retryable: false, None,
        "Not performed. This run belongs to another caller. Start a run of your own.";
    /// The identical call repeated without new evidence (ToolLoopDetected).
    ToolLoopDetected => "tool.loop_detected", Denied, retryable: false, None,
        "Not performed. This identical call keeps returning the same result. Answer from what you have.";
    /// `tool.call` named a tool the run does not offer.
    ToolNotFoundNotOffered => "tool.not_found.not_offered", Denied, retryable: false, ModifyArguments,
        "Not performed. The named tool is not offered in this run.";
    /// An orchestration turn reached its per-turn call cap.
    BridgeCallLimit => "bridge.call_limit", Denied, retryable: false, None,
        "Not performed. This orchestration turn has used all of its tool calls.";
    /// A replayed script asked, at this point, for another call than its
    /// recorded run made (another tool or other arguments).
    BridgeReplayDiverged => "bridge.replay.diverged", Denied, retryable: false, None,
        "Not performed. Replayed, this script asks for a different call here than it first made.";

    // --- failed: the tool failed, or the pipeline failed the call ---
    /// The arguments fail the tool's input schema or the canonical form.
    ToolArgumentsInvalid => "tool.arguments_invalid", Failed, retryable: true, ModifyArguments,
        "The arguments do not match the tool's input schema.";
    /// The target of the call, not the tool, does not exist.
    ToolNotFound => "tool.not_found", Failed, retryable: false, ModifyArguments,
        "The tool could not find what it was asked to act on.";
    /// The remote system refused the request.
    ToolPermissionDenied => "tool.permission_denied", Failed, retryable: false, None,
        "The system behind this tool refused the request.";
    /// The call did not finish within its effective timeout.
    ToolTimeout => "tool.timeout", Failed, retryable: true, None,
        "The tool did not finish in time.";
    /// The run's remaining budget cannot fit the call, so it never started.
    ToolDeadlineExceeded => "tool.deadline_exceeded", Failed, retryable: false, None,
        "Not performed. Not enough time remains in this run for the call.";
    /// The tool produced more than its hard output ceiling.
    ToolOutputTooLarge => "tool.output_too_large", Failed, retryable: false, ModifyArguments,
        "The tool produced more output than it may return.";
    /// The tool ran, but its result failed validation.
    ToolOutputInvalid => "tool.output_invalid", Failed, retryable: false, None,
        "The tool ran, but its result could not be read.";
    /// The tool reported an error of its own.
    ToolUpstreamError => "tool.upstream_error", Failed, retryable: true, ModifyArguments,
        "The tool reported an error. Details follow as data.";
    /// The connection to the tool failed before a result arrived.
    ToolTransportError => "tool.transport_error", Failed, retryable: true, None,
        "The connection to the tool failed.";
    /// toolgate or the tool failed internally.
    ToolInternalError => "tool.internal_error", Failed, retryable: false, None,
        "The tool failed internally.";
    /// The same call is already running under a live lease.
    ToolConcurrencyConflict => "tool.concurrency_conflict", Failed, retryable: true, None,
        "This call is already in progress.";
    /// The call's record could not be written or read (the store failed,
    /// or this node's worker lease is not live): it has no settled outcome
    /// here yet, and the same call asked again learns the one it gets.
    ToolRecordUnavailable => "tool.record_unavailable", Failed, retryable: true, None,
        "The call could not be recorded. Ask again with the same call to learn its outcome.";
    /// The idempotency key was reused with different canonical arguments.
    ToolIdempotencyConflict => "tool.idempotency_conflict", Failed, retryable: false, None,
        "Not performed. A different call was already recorded under this call's identity.";
    /// A suspended call's run was cancelled.
    ToolRunCancelled => "tool.run_cancelled", Failed, retryable: false, None,
        "The run was cancelled before this call completed.";

    // --- unavailable: no route to the tool right now ---
    /// The MCP server is disconnected or unreachable.
    ToolServerUnreachable => "tool.server_unreachable", Unavailable, retryable: true, None,
        "This capability is not reachable right now.";
    /// The MCP server rejected our credential mid-session.
    ToolServerUnauthorized => "tool.server_unauthorized", Unavailable, retryable: false, None,
        "This capability is not available: its server refused access.";
    /// The MCP server rejected our credential at connect.
    ToolAuthFailed => "tool.auth_failed", Unavailable, retryable: false, None,
        "This capability is not available: authentication failed.";
    /// The MCP server requires an authorization flow toolgate does not run.
    ToolAuthUnsupported => "tool.auth_unsupported", Unavailable, retryable: false, None,
        "This capability is not available: its server needs an unsupported authorization flow.";
    /// The server acts with each person's own account there, and the
    /// principal has not consented (or its grant ended): the person
    /// consents on toolgate's consent page, then the same call proceeds.
    ToolConsentRequired => "tool.consent_required", Unavailable, retryable: false, None,
        "This capability needs the user's consent at its server first.";
    /// The server's address is one egress never dials (a private, loopback,
    /// link-local or other refused address), or its name is not allowed.
    ToolEgressRefused => "tool.egress_refused", Unavailable, retryable: false, None,
        "This capability is not available: its server's address is not permitted.";
    /// The server answered with a redirect, which egress never follows.
    ToolRedirectRefused => "tool.redirect_refused", Unavailable, retryable: false, None,
        "This capability is not available: its server redirected the request.";
    /// The server requires a client capability toolgate declines.
    ToolCapabilityUnsupported => "tool.capability_unsupported", Unavailable, retryable: false, None,
        "This capability is not available: its server needs a feature that is turned off.";
    /// The tool left its server's catalog after the session was pinned.
    ToolWithdrawn => "tool.withdrawn", Unavailable, retryable: false, None,
        "This capability was withdrawn by its provider.";
    /// A rate limit the operator set (per credential, tenant, tool or
    /// tenant server) has no call left right now: nothing was recorded, and
    /// the answer says when to try again.
    ToolRateLimited => "tool.rate_limited", Unavailable, retryable: true, None,
        "Not performed. Too many calls right now. Try again after the time given.";
    /// The device that hosts the tool is not connected.
    ToolDeviceOffline => "tool.device_offline", Unavailable, retryable: true, None,
        "This capability's device is not connected.";

    // --- uncertain: nobody knows whether the effect happened ---
    /// A non-idempotent effect may have been sent and its result is unknown.
    ToolOutcomeUnknown => "tool.outcome_unknown", Uncertain, retryable: false, None,
        "The outcome of this call is unknown. Do not repeat it.";
}

impl ReasonCode {
    /// Whether an answer with this code leaves the call without a settled
    /// outcome: it is in flight elsewhere, its record could not be written,
    /// a rate limit held it back, or it waits for the person's consent at
    /// its server (nothing recorded). The same call identity asked again is
    /// the same call and learns its outcome; every other code is the call's
    /// settled answer.
    pub fn is_unsettled(self) -> bool {
        matches!(
            self,
            ReasonCode::ToolConcurrencyConflict
                | ReasonCode::ToolRecordUnavailable
                | ReasonCode::ToolRateLimited
                | ReasonCode::ToolConsentRequired
        )
    }

    /// Whether this code is a tool failure kind's default or otherwise a
    /// failure a tool (not the pipeline) may report in `ToolFailure`.
    pub fn is_tool_reportable(self) -> bool {
        self.as_str().starts_with("tool.") && self.status() != ToolOutcomeStatus::Denied
    }
}

impl std::fmt::Display for ReasonCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for ReasonCode {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for ReasonCode {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn codes_are_unique_and_dotted() {
        let mut seen = BTreeSet::new();
        for code in ReasonCode::ALL {
            let text = code.as_str();
            assert!(seen.insert(text), "duplicate code {text}");
            let segments: Vec<&str> = text.split('.').collect();
            assert!(segments.len() >= 2, "{text} needs a family");
            for segment in segments {
                assert!(
                    !segment.is_empty()
                        && segment.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                    "{text} is not lowercase dotted"
                );
            }
            assert_eq!(text.parse::<ReasonCode>().unwrap(), *code);
        }
    }

    #[test]
    fn messages_are_fixed_plain_sentences() {
        for code in ReasonCode::ALL {
            let message = code.message();
            assert!(message.ends_with('.'), "{code}: {message}");
            assert!(message.len() <= 120, "{code}: message too long");
            assert!(
                message
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || " .,:'".contains(c)),
                "{code}: message may carry only fixed narration: {message}"
            );
        }
    }

    #[test]
    fn uncertain_is_never_retryable() {
        for code in ReasonCode::ALL {
            if code.status() == ToolOutcomeStatus::Uncertain
                || code.status() == ToolOutcomeStatus::Denied
            {
                assert!(!code.retryable(), "{code}");
            }
        }
    }

    #[test]
    fn unknown_codes_do_not_parse() {
        let error = "tool.made_up".parse::<ReasonCode>().unwrap_err();
        assert_eq!(error.set, "ReasonCode");
        assert!(serde_json::from_str::<ReasonCode>("\"tool.made_up\"").is_err());
        assert_eq!(
            serde_json::from_str::<ReasonCode>("\"tool.timeout\"").unwrap(),
            ReasonCode::ToolTimeout
        );
    }
}
