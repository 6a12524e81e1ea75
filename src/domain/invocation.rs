//! The invocation's state machine: the phases a row is in, and every
//! transition a stored row may make, each named once with the phases it may
//! leave, the phase it enters and what a write must hold besides. Both store
//! adapters render their conditional writes' phase guards from this table,
//! and one contract test holds each adapter (PostgreSQL's functions
//! included) to it, row by row. Several nodes share one database, so every
//! transition stays a conditional write: a writer whose guard no longer
//! holds changes nothing.

use super::InvocationStatus;

closed_enum! {
    /// Why a control tool's row is suspended, and what answers it.
    pub enum SuspensionKind {
        /// `conversation.ask_user`: the user's reply.
        UserInput => "user_input",
        /// `delegate.run`: the child run's result.
        ChildRun => "child_run",
    }
}

/// Where a row is. RUNNING is two phases: a call a worker runs, and a
/// control tool suspended until it is answered (its lease let go, which no
/// sweep takes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// WAITING_FOR_APPROVAL: nothing runs until a human decides.
    Waiting,
    /// AUTHORIZED: its intent recorded, not yet claimed to run.
    Authorized,
    /// RUNNING under a worker (or let go by one, for recovery to take).
    Running,
    /// RUNNING and suspended: a control tool waits for its answer.
    Suspended,
    /// SUCCEEDED, FAILED, DENIED or UNCERTAIN: never changes again.
    Ended,
}

impl Phase {
    /// Every phase.
    pub const ALL: [Phase; 5] = [
        Phase::Waiting,
        Phase::Authorized,
        Phase::Running,
        Phase::Suspended,
        Phase::Ended,
    ];

    /// The phase of a row with `status`, suspended or not; `None` for
    /// PROPOSED, which is never stored.
    pub fn of(status: InvocationStatus, suspended: bool) -> Option<Phase> {
        match status {
            InvocationStatus::Proposed => None,
            InvocationStatus::WaitingForApproval => Some(Phase::Waiting),
            InvocationStatus::Authorized => Some(Phase::Authorized),
            InvocationStatus::Running if suspended => Some(Phase::Suspended),
            InvocationStatus::Running => Some(Phase::Running),
            InvocationStatus::Succeeded
            | InvocationStatus::Failed
            | InvocationStatus::Denied
            | InvocationStatus::Uncertain => Some(Phase::Ended),
        }
    }

    /// The statuses a row in this phase may have.
    pub fn statuses(self) -> &'static [InvocationStatus] {
        match self {
            Phase::Waiting => &[InvocationStatus::WaitingForApproval],
            Phase::Authorized => &[InvocationStatus::Authorized],
            Phase::Running | Phase::Suspended => &[InvocationStatus::Running],
            Phase::Ended => &[
                InvocationStatus::Succeeded,
                InvocationStatus::Failed,
                InvocationStatus::Denied,
                InvocationStatus::Uncertain,
            ],
        }
    }

    /// Whether a row in this phase is suspended; `None` where a suspension
    /// does not tell phases apart.
    pub fn suspended(self) -> Option<bool> {
        match self {
            Phase::Running => Some(false),
            Phase::Suspended => Some(true),
            _ => None,
        }
    }
}

/// What a write must hold besides the row's phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// Nothing more: a decision from outside any attempt (an approval
    /// decided, a suspended call answered).
    Phase,
    /// The writer's fence: the row's worker and its lease epoch now.
    Fence,
    /// The fence, and that worker's lease live on the store's clock: the
    /// effect watermark, after which a tool may start.
    FenceAndLiveLease,
    /// The row's worker is gone: its lease expired on the store's clock or
    /// was released, or it let the row go. What recovery takes.
    OwnerGone,
}

/// What a transition does to the row's holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// The same worker keeps it under the same epoch.
    Keeps,
    /// A new claim: the claiming worker holds it under the next epoch.
    Claims,
    /// No worker holds it any more.
    LetsGo,
}

/// One transition of a stored row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// Its name, as the store port's method.
    pub name: &'static str,
    /// The phases it may leave.
    pub leaves: &'static [Phase],
    /// The phase it enters; `None`: the one it left.
    pub enters: Option<Phase>,
    /// What the write must hold besides the phase.
    pub guard: Guard,
    /// What becomes of the holder.
    pub holder: Holder,
}

impl Transition {
    /// Whether a row in `phase` moves, the guard holding or not.
    pub fn allows(&self, phase: Phase, guard_holds: bool) -> bool {
        self.leaves.contains(&phase) && (self.guard == Guard::Phase || guard_holds)
    }

    /// The phase a row in `phase` is in after the transition.
    pub fn entered_from(&self, phase: Phase) -> Phase {
        self.enters.unwrap_or(phase)
    }
}

const HELD: &[Phase] = &[Phase::Authorized, Phase::Running];

/// An approved call's row, authorized under the resuming worker's claim.
pub const AUTHORIZE_WAITING: Transition = Transition {
    name: "authorize_waiting",
    leaves: &[Phase::Waiting],
    enters: Some(Phase::Authorized),
    guard: Guard::Phase,
    holder: Holder::Claims,
};

/// A denied or expired approval ends its waiting row.
pub const SETTLE_WAITING: Transition = Transition {
    name: "settle_waiting",
    leaves: &[Phase::Waiting],
    enters: Some(Phase::Ended),
    guard: Guard::Phase,
    holder: Holder::Keeps,
};

/// Step 9: the claim that runs an authorized row.
pub const CLAIM: Transition = Transition {
    name: "claim_invocation",
    leaves: &[Phase::Authorized],
    enters: Some(Phase::Running),
    guard: Guard::Fence,
    holder: Holder::Claims,
};

/// The effect watermark, set once.
pub const MARK_EFFECT_SENT: Transition = Transition {
    name: "mark_effect_sent",
    leaves: &[Phase::Running],
    enters: None,
    guard: Guard::FenceAndLiveLease,
    holder: Holder::Keeps,
};

/// Step 13: the terminal write.
pub const COMPLETE: Transition = Transition {
    name: "complete_invocation",
    leaves: HELD,
    enters: Some(Phase::Ended),
    guard: Guard::Fence,
    holder: Holder::Keeps,
};

/// A worker lets go of a row it could not settle, for recovery at once.
pub const RELEASE: Transition = Transition {
    name: "release_invocation",
    leaves: HELD,
    enters: None,
    guard: Guard::Fence,
    holder: Holder::LetsGo,
};

/// A control tool suspends until it is answered.
pub const SUSPEND: Transition = Transition {
    name: "suspend_invocation",
    leaves: &[Phase::Running],
    enters: Some(Phase::Suspended),
    guard: Guard::Fence,
    holder: Holder::LetsGo,
};

/// A suspended control tool answered (or its run cancelled).
pub const COMPLETE_SUSPENDED: Transition = Transition {
    name: "complete_suspended",
    leaves: &[Phase::Suspended],
    enters: Some(Phase::Ended),
    guard: Guard::Phase,
    holder: Holder::Keeps,
};

/// Recovery's sweep takes the rows of dead workers.
pub const CLAIM_EXPIRED: Transition = Transition {
    name: "claim_expired",
    leaves: HELD,
    enters: None,
    guard: Guard::OwnerGone,
    holder: Holder::Claims,
};

/// Deduplication's case 4: one row of a dead worker, taken over.
pub const TAKE_OVER: Transition = Transition {
    name: "take_over",
    leaves: HELD,
    enters: None,
    guard: Guard::OwnerGone,
    holder: Holder::Claims,
};

/// Recovery found standing authority gone: back to a human.
pub const REOPEN_APPROVAL: Transition = Transition {
    name: "reopen_approval",
    leaves: HELD,
    enters: Some(Phase::Waiting),
    guard: Guard::Fence,
    holder: Holder::LetsGo,
};

/// Every transition of a stored row (the insert, which makes one, aside).
pub const TRANSITIONS: [Transition; 11] = [
    AUTHORIZE_WAITING,
    SETTLE_WAITING,
    CLAIM,
    MARK_EFFECT_SENT,
    COMPLETE,
    RELEASE,
    SUSPEND,
    COMPLETE_SUSPENDED,
    CLAIM_EXPIRED,
    TAKE_OVER,
    REOPEN_APPROVAL,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_but_proposed_has_one_phase_and_back() {
        for status in InvocationStatus::ALL {
            for suspended in [false, true] {
                match Phase::of(*status, suspended) {
                    None => assert_eq!(*status, InvocationStatus::Proposed),
                    Some(phase) => assert!(phase.statuses().contains(status), "{status:?}"),
                }
            }
        }
    }

    #[test]
    fn nothing_leaves_an_ended_row() {
        for transition in TRANSITIONS {
            assert!(
                !transition.allows(Phase::Ended, true),
                "{}",
                transition.name
            );
        }
    }

    #[test]
    fn only_decisions_from_outside_an_attempt_are_unfenced() {
        let unfenced: Vec<&str> = TRANSITIONS
            .iter()
            .filter(|transition| transition.guard == Guard::Phase)
            .map(|transition| transition.name)
            .collect();
        assert_eq!(
            unfenced,
            ["authorize_waiting", "settle_waiting", "complete_suspended"]
        );
        // A stale writer moves nothing a fence guards.
        for transition in TRANSITIONS
            .iter()
            .filter(|transition| transition.guard != Guard::Phase)
        {
            for phase in Phase::ALL {
                assert!(!transition.allows(phase, false), "{}", transition.name);
            }
        }
    }

    #[test]
    fn what_recovery_takes_is_what_a_worker_held() {
        for transition in [CLAIM_EXPIRED, TAKE_OVER] {
            let taken: Vec<Phase> = Phase::ALL
                .into_iter()
                .filter(|phase| transition.allows(*phase, true))
                .collect();
            assert_eq!(taken, [Phase::Authorized, Phase::Running]);
            assert_eq!(transition.holder, Holder::Claims);
        }
        assert!(
            !TAKE_OVER.allows(Phase::Suspended, true),
            "a suspended call is nobody's to take"
        );
    }
}
