//! The decisions the executor acts on, as synchronous functions of the row
//! and the attempt: deduplication's cases, the recovery table applied to a
//! held row, "may have escaped, so uncertain", step 11's checks. The async
//! layer only performs the commits and the tool call they ask for.

use super::super::output;
use crate::domain::policy::PolicyDecision;
use crate::domain::recovery::{self, RecoveryDecision};
use crate::domain::{
    IdempotencyClass, InvocationStatus, ReasonCode, SecretValue, ToolFailure, ToolFailureKind,
    ToolResult,
};
use crate::ports::{Fence, InvocationRecord, InvocationState, Suspension};
use uuid::Uuid;

/// What deduplication does with the row a call's key already has: the
/// design document's five cases, and the conflict beside them, each with
/// what acting on it needs from the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Deduplication<'a> {
    /// The key is another principal's (or, impossibly but checked, holds
    /// other canonical arguments): a conflict, recorded as such.
    Conflict,
    /// A suspended control tool waits for its answer, not for a worker.
    Suspended(&'a Suspension),
    /// 2. Terminal: the recorded outcome, without executing.
    Recorded,
    /// 5. Waiting: resume its approval.
    ResumeApproval(Uuid),
    /// Recovery took this row over for this very call, under this fence.
    Recover(Fence),
    /// 3 and 4: in flight under a live lease, or take it over.
    TakeOver,
}

/// Deduplication's case for `row`, met by a call of `principal_id` with
/// `arguments_hash`, recovering under `recovering` if it is.
pub(super) fn deduplication<'a>(
    row: &'a InvocationRecord,
    principal_id: &str,
    arguments_hash: &str,
    recovering: Option<Fence>,
) -> Deduplication<'a> {
    if row.identity.principal.id != principal_id || row.identity.arguments_hash != arguments_hash {
        return Deduplication::Conflict;
    }
    match &row.state {
        InvocationState::Suspended(suspension) => Deduplication::Suspended(suspension),
        InvocationState::Ended(_) => Deduplication::Recorded,
        InvocationState::Waiting { approval_id } => Deduplication::ResumeApproval(*approval_id),
        InvocationState::Authorized { .. } | InvocationState::Running { .. } => {
            match (recovering, row.fence()) {
                (Some(recovering), Some(fence)) if recovering == fence => {
                    Deduplication::Recover(fence)
                }
                _ => Deduplication::TakeOver,
            }
        }
    }
}

/// What recovery does with a row this worker holds, authority re-checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Recovery {
    /// Standing authority gone and no approval on record: back to
    /// interactive approval; nothing runs until a human decides.
    ReopenApproval(ReasonCode),
    /// Ended with this code, without the tool.
    End(ReasonCode),
    /// Authorized, never claimed: claim it, then run it.
    Claim,
    /// Running under this worker: run it again.
    Run,
}

/// The recovery table applied to a held `row`: `decision` is step 6's
/// verdict now, `expired` whether its deadline passed, and `approved`
/// whether an approval on record allows it (asked only when the decision
/// requires one).
pub(super) fn recovery(
    row: &InvocationRecord,
    decision: PolicyDecision,
    expired: bool,
    approved: Option<bool>,
) -> Recovery {
    let table = if row.status() == InvocationStatus::Running {
        recovery::decide(row.identity.idempotency_class, row.effect_sent_at.is_some())
    } else {
        RecoveryDecision::ReExecute
    };
    if let (PolicyDecision::RequireApproval(code), false, Some(false)) =
        (decision, expired, approved)
        && table != RecoveryDecision::Uncertain
    {
        return Recovery::ReopenApproval(code);
    }
    match (table, decision) {
        (RecoveryDecision::Uncertain, _) => Recovery::End(ReasonCode::ToolOutcomeUnknown),
        (_, PolicyDecision::Deny(code)) => Recovery::End(code),
        _ if expired => Recovery::End(ReasonCode::ToolDeadlineExceeded),
        _ if row.status() == InvocationStatus::Authorized => Recovery::Claim,
        _ => Recovery::Run,
    }
}

/// Whether recovery must know if an approval on record allows `row`: only
/// when the decision requires one, the deadline has not passed, and the
/// table does not end the row uncertain whatever approval says.
pub(super) fn asks_for_approval(
    row: &InvocationRecord,
    decision: PolicyDecision,
    expired: bool,
) -> bool {
    matches!(decision, PolicyDecision::RequireApproval(_))
        && !expired
        && !settled_without_the_tool(row)
}

/// Whether the recovery table settles a taken row as UNCERTAIN whatever the
/// tool and the current authority: a running call that may have sent its
/// effect and cannot be repeated.
pub(super) fn settled_without_the_tool(row: &InvocationRecord) -> bool {
    row.status() == InvocationStatus::Running
        && recovery::decide(row.identity.idempotency_class, row.effect_sent_at.is_some())
            == RecoveryDecision::Uncertain
}

/// The code a held row ends with when it is not run again: uncertain if its
/// effect may have escaped, `otherwise` if not.
pub(super) fn ending_code(row: &InvocationRecord, otherwise: ReasonCode) -> ReasonCode {
    if settled_without_the_tool(row) {
        ReasonCode::ToolOutcomeUnknown
    } else {
        otherwise
    }
}

/// An effect that may have escaped cannot be reported as an ordinary
/// failure for any class that is neither read-only nor idempotent
/// (Decision 26): without the tool's proof it did not apply, it is
/// uncertain.
pub(super) fn may_have_escaped(class: IdempotencyClass, effect_sent: bool) -> bool {
    effect_sent
        && !matches!(
            class,
            IdempotencyClass::ReadOnly | IdempotencyClass::Idempotent
        )
}

/// How step 10 ended.
pub(super) enum Execution {
    Returned(Box<ToolResult>),
    TimedOut,
    Panicked,
}

/// What a call concluded, before step 11 checks it.
pub(super) enum Conclusion {
    Succeeded {
        result: ToolResult,
        secrets: Vec<SecretValue>,
    },
    Failed {
        failure: ToolFailure,
        uncertain: bool,
    },
}

impl Conclusion {
    pub(super) fn failure(failure: ToolFailure, uncertain: bool) -> Conclusion {
        let uncertain = uncertain || failure.kind == ToolFailureKind::OutcomeUnknown;
        Conclusion::Failed { failure, uncertain }
    }

    /// What step 10's end concludes, `secrets` being what the tool
    /// resolved.
    pub(super) fn of(
        execution: Execution,
        secrets: Vec<SecretValue>,
        may_have_escaped: bool,
    ) -> Conclusion {
        let (kind, detail) = match execution {
            Execution::Returned(result) => {
                return Conclusion::from_result(*result, secrets, may_have_escaped);
            }
            Execution::TimedOut if may_have_escaped => (
                ToolFailureKind::OutcomeUnknown,
                "timed out after the effect watermark",
            ),
            Execution::TimedOut => (ToolFailureKind::Timeout, "timed out"),
            Execution::Panicked if may_have_escaped => (
                ToolFailureKind::OutcomeUnknown,
                "the tool panicked after the effect watermark",
            ),
            Execution::Panicked => (ToolFailureKind::Internal, "the tool panicked"),
        };
        Conclusion::failure(ToolFailure::new(kind, detail), may_have_escaped)
    }

    fn from_result(
        result: ToolResult,
        secrets: Vec<SecretValue>,
        may_have_escaped: bool,
    ) -> Conclusion {
        let result = result.recordable();
        match result.failure {
            None => Conclusion::Succeeded { result, secrets },
            Some(mut failure) => {
                // Scrub what the tool says about itself, too.
                failure.detail = output::scrub(&failure.detail, &secrets);
                failure.external_text = failure
                    .external_text
                    .map(|text| output::scrub(&text, &secrets));
                failure.partial_output = failure
                    .partial_output
                    .map(|text| output::scrub(&text, &secrets));
                // A failure after the watermark of a non-idempotent effect is
                // uncertain unless the tool reports it definitively.
                let definitive = failure.effect_not_applied
                    || matches!(
                        failure.kind,
                        ToolFailureKind::InvalidArguments
                            | ToolFailureKind::NotFound
                            | ToolFailureKind::Permission
                    );
                let uncertain = may_have_escaped && !definitive;
                Conclusion::failure(failure, uncertain)
            }
        }
    }

    /// The secrets a success's text is scrubbed of.
    pub(super) fn secrets(&self) -> &[SecretValue] {
        match self {
            Conclusion::Succeeded { secrets, .. } => secrets,
            Conclusion::Failed { .. } => &[],
        }
    }
}

/// Step 11's verdict on a returned success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ResultCheck {
    /// Within its schema and the hard ceiling.
    Valid,
    /// The structured result fails the declared output schema.
    OutputInvalid,
    /// Text and blobs together past the hard ceiling.
    TooLarge,
}

/// Step 11: schema first, then size (images, audio and blobs count toward
/// the output as text does).
pub(super) fn result_check(
    schema_valid: bool,
    text_bytes: u64,
    blob_bytes: u64,
    ceiling: u64,
) -> ResultCheck {
    if !schema_valid {
        ResultCheck::OutputInvalid
    } else if text_bytes.saturating_add(blob_bytes) > ceiling {
        ResultCheck::TooLarge
    } else {
        ResultCheck::Valid
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use serde_json::json;
    use uuid::Uuid;

    use crate::domain::SuspensionKind;

    use super::*;
    use crate::domain::{Principal, SideEffectClass, ToolSource, TrustLevel};
    use crate::ports::CallIdentity;

    const HASH: &str = "arguments-hash";

    fn row(status: InvocationStatus, class: IdempotencyClass) -> InvocationRecord {
        let state = match status {
            InvocationStatus::WaitingForApproval => InvocationState::Waiting {
                approval_id: Uuid::new_v4(),
            },
            InvocationStatus::Authorized => InvocationState::Authorized {
                worker: Some(Uuid::new_v4()),
            },
            InvocationStatus::Running => InvocationState::Running {
                worker: Some(Uuid::new_v4()),
            },
            status => {
                let outcome_status = status
                    .outcome_status(None)
                    .expect("a terminal status in these tests");
                InvocationState::Ended(Box::new(crate::ports::Ended {
                    status,
                    outcome_status,
                    completed_at: Utc::now(),
                    result: None,
                    error: None,
                    output_bytes: None,
                    truncated: false,
                    artifact_id: None,
                    suspension: None,
                    worker: None,
                }))
            }
        };
        InvocationRecord {
            identity: CallIdentity {
                id: Uuid::new_v4(),
                tenant_id: "t".into(),
                session_id: Uuid::new_v4(),
                run_id: Uuid::new_v4(),
                step_number: 1,
                call_id: "c".into(),
                tool_name: "mcp.a.b".into(),
                tool_version: "v".into(),
                tool_source: ToolSource::Mcp,
                server_id: Some("a".into()),
                arguments: json!({}),
                arguments_hash: HASH.into(),
                idempotency_key: "k".into(),
                idempotency_class: class,
                side_effect: SideEffectClass::ExternalWrite,
                principal: Principal {
                    id: "p".into(),
                    scopes: Default::default(),
                },
                origin_trust: TrustLevel::User,
                argument_trust: Default::default(),
                parallel_group: None,
                deadline_at: None,
            },
            approval_id: None,
            effect_sent_at: None,
            attempt_number: 1,
            lease_epoch: 1,
            reason_code: None,
            created_at: Utc::now(),
            started_at: None,
            state,
        }
    }

    fn sent(mut row: InvocationRecord) -> InvocationRecord {
        row.effect_sent_at = Some(Utc::now());
        row
    }

    #[test]
    fn deduplication_meets_each_row_as_the_design_says() {
        use IdempotencyClass::NonIdempotent as N;
        use InvocationStatus::*;
        let running = row(Running, N);
        let waiting = row(WaitingForApproval, N);
        let InvocationState::Waiting { approval_id } = waiting.state else {
            unreachable!("a waiting row")
        };
        let suspension = Suspension {
            kind: SuspensionKind::UserInput,
            reference: "r".into(),
        };
        let mut suspended = row(Running, N);
        suspended.state = InvocationState::Suspended(suspension.clone());
        let fence = running.fence().expect("held");
        let cases = [
            (row(Succeeded, N), None, Deduplication::Recorded),
            (row(Failed, N), None, Deduplication::Recorded),
            (row(Denied, N), None, Deduplication::Recorded),
            (row(Uncertain, N), None, Deduplication::Recorded),
            (
                waiting.clone(),
                None,
                Deduplication::ResumeApproval(approval_id),
            ),
            (row(Authorized, N), None, Deduplication::TakeOver),
            (running.clone(), None, Deduplication::TakeOver),
            (running.clone(), Some(fence), Deduplication::Recover(fence)),
            (
                running.clone(),
                Some(Fence {
                    worker_id: Uuid::new_v4(),
                    lease_epoch: 9,
                }),
                Deduplication::TakeOver,
            ),
            (
                suspended.clone(),
                None,
                Deduplication::Suspended(&suspension),
            ),
            (
                suspended.clone(),
                Some(fence),
                Deduplication::Suspended(&suspension),
            ),
        ];
        for (row, recovering, expected) in &cases {
            assert_eq!(
                deduplication(row, "p", HASH, *recovering),
                *expected,
                "{:?} recovering {recovering:?}",
                row.state
            );
        }
        // Another principal, or other arguments, whatever the row's state.
        for row in [row(Succeeded, N), running, waiting, suspended] {
            assert_eq!(
                deduplication(&row, "q", HASH, None),
                Deduplication::Conflict
            );
            assert_eq!(
                deduplication(&row, "p", "other", None),
                Deduplication::Conflict
            );
        }
    }

    #[test]
    fn recovery_applies_the_table_then_authority_then_the_deadline() {
        use IdempotencyClass::*;
        use InvocationStatus::*;
        let allow = PolicyDecision::Allow;
        let deny = PolicyDecision::Deny(ReasonCode::PolicyScopeMissing);
        let approve = PolicyDecision::RequireApproval(ReasonCode::PolicyRuleApprovalRequired);
        let unknown = Recovery::End(ReasonCode::ToolOutcomeUnknown);
        let cases = [
            // The table first: a sent non-idempotent effect is uncertain
            // whatever authority and the deadline say now.
            (
                sent(row(Running, NonIdempotent)),
                allow,
                false,
                None,
                unknown,
            ),
            (sent(row(Running, NonIdempotent)), deny, true, None, unknown),
            (
                sent(row(Running, NonIdempotent)),
                approve,
                false,
                Some(false),
                unknown,
            ),
            // Authority re-checked.
            (
                row(Running, NonIdempotent),
                deny,
                false,
                None,
                Recovery::End(ReasonCode::PolicyScopeMissing),
            ),
            (
                sent(row(Running, ConditionallyIdempotent)),
                deny,
                false,
                None,
                Recovery::End(ReasonCode::PolicyScopeMissing),
            ),
            (
                row(Running, ReadOnly),
                approve,
                false,
                Some(false),
                Recovery::ReopenApproval(ReasonCode::PolicyRuleApprovalRequired),
            ),
            (
                row(Authorized, NonIdempotent),
                approve,
                false,
                Some(false),
                Recovery::ReopenApproval(ReasonCode::PolicyRuleApprovalRequired),
            ),
            (
                row(Running, ReadOnly),
                approve,
                false,
                Some(true),
                Recovery::Run,
            ),
            // The deadline.
            (
                row(Running, ReadOnly),
                allow,
                true,
                None,
                Recovery::End(ReasonCode::ToolDeadlineExceeded),
            ),
            (
                row(Running, ReadOnly),
                approve,
                true,
                None,
                Recovery::End(ReasonCode::ToolDeadlineExceeded),
            ),
            // Run again.
            (
                row(Running, NonIdempotent),
                allow,
                false,
                None,
                Recovery::Run,
            ),
            (
                sent(row(Running, Idempotent)),
                allow,
                false,
                None,
                Recovery::Run,
            ),
            (
                sent(row(Running, ConditionallyIdempotent)),
                allow,
                false,
                None,
                Recovery::Run,
            ),
            (
                row(Authorized, NonIdempotent),
                allow,
                false,
                None,
                Recovery::Claim,
            ),
            // An authorized row never sent anything, whatever its watermark says.
            (
                sent(row(Authorized, NonIdempotent)),
                allow,
                false,
                None,
                Recovery::Claim,
            ),
        ];
        for (row, decision, expired, approved, expected) in cases {
            assert_eq!(
                recovery(&row, decision, expired, approved),
                expected,
                "{:?} {:?} sent {} {decision:?} expired {expired} approved {approved:?}",
                row.status(),
                row.identity.idempotency_class,
                row.effect_sent_at.is_some()
            );
        }
        let unsent = row(Running, NonIdempotent);
        assert!(asks_for_approval(&unsent, approve, false));
        assert!(!asks_for_approval(&unsent, approve, true));
        assert!(!asks_for_approval(&unsent, allow, false));
        assert!(!asks_for_approval(&unsent, deny, false));
        // Uncertain whatever approval says: nothing to read.
        assert!(!asks_for_approval(
            &sent(row(Running, NonIdempotent)),
            approve,
            false
        ));
    }

    #[test]
    fn only_a_sent_effect_that_cannot_be_repeated_is_settled_without_the_tool() {
        use IdempotencyClass::*;
        for class in [ReadOnly, Idempotent, ConditionallyIdempotent, NonIdempotent] {
            for status in [InvocationStatus::Authorized, InvocationStatus::Running] {
                for effect_sent in [false, true] {
                    let mut row = row(status, class);
                    if effect_sent {
                        row = sent(row);
                    }
                    let expected = status == InvocationStatus::Running
                        && class == NonIdempotent
                        && effect_sent;
                    assert_eq!(
                        settled_without_the_tool(&row),
                        expected,
                        "{status:?} {class:?} {effect_sent}"
                    );
                    let code = ending_code(&row, ReasonCode::ToolWithdrawn);
                    assert_eq!(
                        code == ReasonCode::ToolOutcomeUnknown,
                        expected,
                        "{status:?} {class:?} {effect_sent}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_failure_after_the_watermark_is_uncertain_unless_the_tool_proves_otherwise() {
        use IdempotencyClass::*;
        assert!(!may_have_escaped(NonIdempotent, false));
        assert!(may_have_escaped(NonIdempotent, true));
        assert!(may_have_escaped(ConditionallyIdempotent, true));
        assert!(!may_have_escaped(Idempotent, true));
        assert!(!may_have_escaped(ReadOnly, true));
        let uncertain = |conclusion: Conclusion| match conclusion {
            Conclusion::Failed { uncertain, .. } => Some(uncertain),
            Conclusion::Succeeded { .. } => None,
        };
        let failed =
            |kind| Execution::Returned(Box::new(ToolResult::failed(ToolFailure::new(kind, "x"))));
        let cases = [
            (Execution::TimedOut, true, Some(true)),
            (Execution::TimedOut, false, Some(false)),
            (Execution::Panicked, true, Some(true)),
            (Execution::Panicked, false, Some(false)),
            (failed(ToolFailureKind::UpstreamError), true, Some(true)),
            (failed(ToolFailureKind::UpstreamError), false, Some(false)),
            (failed(ToolFailureKind::NotFound), true, Some(false)),
            (failed(ToolFailureKind::Permission), true, Some(false)),
            (failed(ToolFailureKind::InvalidArguments), true, Some(false)),
            // The tool's own "outcome unknown" is uncertain even before the watermark.
            (failed(ToolFailureKind::OutcomeUnknown), false, Some(true)),
            (
                Execution::Returned(Box::new(ToolResult::text("ok"))),
                true,
                None,
            ),
        ];
        for (index, (execution, escaped, expected)) in cases.into_iter().enumerate() {
            assert_eq!(
                uncertain(Conclusion::of(execution, Vec::new(), escaped)),
                expected,
                "case {index}"
            );
        }
        let mut proven = ToolFailure::new(ToolFailureKind::UpstreamError, "refused");
        proven.effect_not_applied = true;
        let proven = Conclusion::of(
            Execution::Returned(Box::new(ToolResult::failed(proven))),
            Vec::new(),
            true,
        );
        assert_eq!(uncertain(proven), Some(false));
    }

    #[test]
    fn step_11_checks_the_schema_then_the_size() {
        assert_eq!(result_check(true, 10, 0, 10), ResultCheck::Valid);
        assert_eq!(result_check(true, 6, 5, 10), ResultCheck::TooLarge);
        assert_eq!(result_check(true, 0, 11, 10), ResultCheck::TooLarge);
        assert_eq!(result_check(false, 0, 0, 10), ResultCheck::OutputInvalid);
        assert_eq!(result_check(false, 99, 0, 10), ResultCheck::OutputInvalid);
        assert_eq!(
            result_check(true, u64::MAX, u64::MAX, u64::MAX),
            ResultCheck::Valid
        );
    }
}
