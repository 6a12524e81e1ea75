//! The unified circuit breaker: one counter per run, keyed on (name,
//! arguments hash, outcome status, reason code), serving both the
//! repeated-denial rule and loop detection at their thresholds. The counts
//! come from the store (derived from the rows), so a restarted process
//! obeys them; this module decides from them.

use crate::domain::{ReasonCode, ToolOutcomeStatus};
use crate::ports::BreakerTally;

/// Identical denied proposals that fail the run.
pub const DENIAL_THRESHOLD: i64 = 3;
/// Identical calls without new evidence that are a loop.
pub const LOOP_THRESHOLD: i64 = 5;
/// Identical proposals after an uncertain outcome that are refused.
pub const UNCERTAIN_THRESHOLD: i64 = 1;
/// Evidence restarts a run may spend, across all its calls.
pub const MAXIMUM_RESTARTS: i32 = 32;

/// The breaker's word on a call about to be dispatched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Go on.
    Proceed,
    /// Refuse with this code, recording a denied row.
    Refuse(ReasonCode),
}

/// The identical-call count the loop rule reads: the largest count among
/// outcomes that ran (each status and code separately), with successes
/// counted only since their last evidence restart.
pub fn identical_calls(tally: &BreakerTally) -> i64 {
    tally
        .counts
        .iter()
        .filter(|(status, _, _)| {
            !matches!(
                status,
                ToolOutcomeStatus::Denied | ToolOutcomeStatus::Uncertain
            )
        })
        .map(|(status, _, count)| {
            if *status == ToolOutcomeStatus::Succeeded {
                (count - tally.evidence_base).max(0)
            } else {
                *count
            }
        })
        .max()
        .unwrap_or(0)
}

/// Before dispatch of a call of step `step`: a run that an earlier step
/// left synthesis-only answers instead of calling (ADR-0136), an identical
/// call that ended uncertain is never proposed again, a run whose denial
/// breaker tripped stays tripped, and the call that would reach the loop
/// threshold is refused.
pub fn before_dispatch(tally: &BreakerTally, step: i64) -> Verdict {
    if synthesis_only_at(tally, step) {
        return Verdict::Refuse(ReasonCode::ToolLoopDetected);
    }
    if tally.count_status(ToolOutcomeStatus::Uncertain) >= UNCERTAIN_THRESHOLD {
        return Verdict::Refuse(ReasonCode::PolicyBreakerUncertainRepeat);
    }
    if tally.count(
        ToolOutcomeStatus::Denied,
        Some(ReasonCode::PolicyBreakerRepeatedDenial),
    ) > 0
    {
        return Verdict::Refuse(ReasonCode::PolicyBreakerRepeatedDenial);
    }
    if identical_calls(tally) + 1 >= LOOP_THRESHOLD {
        return Verdict::Refuse(ReasonCode::ToolLoopDetected);
    }
    Verdict::Proceed
}

/// The code a denial is recorded under: its own, or the breaker's when it is
/// the third identical one (ToolPolicyDenied: the run fails).
pub fn denial(tally: &BreakerTally, code: ReasonCode) -> ReasonCode {
    if tally.count(ToolOutcomeStatus::Denied, Some(code)) + 1 >= DENIAL_THRESHOLD {
        ReasonCode::PolicyBreakerRepeatedDenial
    } else {
        code
    }
}

/// After a call: whether the next model turn must be synthesis-only, because
/// an identical-call count sits one below its threshold.
pub fn synthesis_only(tally_after: &BreakerTally) -> bool {
    identical_calls(tally_after) >= LOOP_THRESHOLD - 1
}

/// Whether a call of step `step` falls in the run's synthesis-only steps:
/// any after the step that left a count one below its threshold.
pub fn synthesis_only_at(tally: &BreakerTally, step: i64) -> bool {
    tally.synthesis_after_step.is_some_and(|after| after < step)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(counts: &[(ToolOutcomeStatus, Option<ReasonCode>, i64)], base: i64) -> BreakerTally {
        BreakerTally {
            counts: counts.to_vec(),
            evidence_base: base,
            synthesis_after_step: None,
        }
    }

    #[test]
    fn steps_after_the_synthesis_mark_only_answer() {
        let mut marked = tally(&[], 0);
        marked.synthesis_after_step = Some(3);
        assert_eq!(
            before_dispatch(&marked, 3),
            Verdict::Proceed,
            "the step itself runs"
        );
        assert_eq!(
            before_dispatch(&marked, 4),
            Verdict::Refuse(ReasonCode::ToolLoopDetected)
        );
        assert_eq!(
            before_dispatch(&marked, 40),
            Verdict::Refuse(ReasonCode::ToolLoopDetected)
        );
        assert_eq!(before_dispatch(&tally(&[], 0), 40), Verdict::Proceed);
    }

    #[test]
    fn uncertain_is_never_proposed_again() {
        let t = tally(
            &[(
                ToolOutcomeStatus::Uncertain,
                Some(ReasonCode::ToolOutcomeUnknown),
                1,
            )],
            0,
        );
        assert_eq!(
            before_dispatch(&t, 1),
            Verdict::Refuse(ReasonCode::PolicyBreakerUncertainRepeat)
        );
    }

    #[test]
    fn the_third_identical_denial_trips() {
        let code = ReasonCode::PolicyScopeMissing;
        assert_eq!(denial(&tally(&[], 0), code), code);
        assert_eq!(
            denial(
                &tally(&[(ToolOutcomeStatus::Denied, Some(code), 1)], 0),
                code
            ),
            code
        );
        assert_eq!(
            denial(
                &tally(&[(ToolOutcomeStatus::Denied, Some(code), 2)], 0),
                code
            ),
            ReasonCode::PolicyBreakerRepeatedDenial
        );
        // Different codes count apart.
        let mixed = tally(
            &[
                (ToolOutcomeStatus::Denied, Some(code), 1),
                (
                    ToolOutcomeStatus::Denied,
                    Some(ReasonCode::PolicyRuleDenied),
                    1,
                ),
            ],
            0,
        );
        assert_eq!(denial(&mixed, code), code);
        let tripped = tally(
            &[(
                ToolOutcomeStatus::Denied,
                Some(ReasonCode::PolicyBreakerRepeatedDenial),
                1,
            )],
            0,
        );
        assert_eq!(
            before_dispatch(&tripped, 1),
            Verdict::Refuse(ReasonCode::PolicyBreakerRepeatedDenial)
        );
    }

    #[test]
    fn the_fifth_identical_call_is_a_loop_and_the_fourth_warns() {
        let ok = |n| tally(&[(ToolOutcomeStatus::Succeeded, None, n)], 0);
        assert_eq!(before_dispatch(&ok(3), 1), Verdict::Proceed);
        assert!(!synthesis_only(&ok(3)));
        assert!(synthesis_only(&ok(4)));
        assert_eq!(
            before_dispatch(&ok(4), 1),
            Verdict::Refuse(ReasonCode::ToolLoopDetected)
        );
        // Identical failures loop too.
        let failing = tally(
            &[(
                ToolOutcomeStatus::Failed,
                Some(ReasonCode::ToolUpstreamError),
                4,
            )],
            0,
        );
        assert_eq!(
            before_dispatch(&failing, 1),
            Verdict::Refuse(ReasonCode::ToolLoopDetected)
        );
    }

    #[test]
    fn new_evidence_restarts_the_count() {
        // Seven successes, the last restart after the sixth: counts as one.
        let restarted = tally(&[(ToolOutcomeStatus::Succeeded, None, 7)], 6);
        assert_eq!(identical_calls(&restarted), 1);
        assert_eq!(before_dispatch(&restarted, 1), Verdict::Proceed);
    }
}
