//! Approvals: the states of a human decision.

closed_enum! {
    /// The state of an approval.
    pub enum ApprovalStatus {
        /// Waiting for a human.
        Pending => "pending",
        /// Approved; the call resumes at step 6.
        Approved => "approved",
        /// Denied; the call ends denied.
        Denied => "denied",
        /// Not decided within its hold.
        Expired => "expired",
    }
}

closed_enum! {
    /// A human's verdict on an UNCERTAIN invocation, recorded beside it.
    pub enum ReviewResolution {
        /// The effect happened (found in the remote system).
        EffectApplied => "effect_applied",
        /// The effect did not happen.
        EffectNotApplied => "effect_not_applied",
    }
}

closed_enum! {
    /// Where an orchestration turn is: what an operator reads of it after
    /// its socket is gone.
    pub enum TurnState {
        /// Its socket is bound and its token live.
        Open => "open",
        /// Closed by its caller (`DELETE /v1/turns/{id}`) or at shutdown.
        Closed => "closed",
        /// Closed because its lifetime ran out.
        Expired => "expired",
        /// Closed because an approval inside it outlasted the hold.
        Suspended => "suspended",
    }
}

closed_enum! {
    /// The span a tool's health is counted over.
    pub enum HealthWindow {
        /// The last hour.
        Hour => "hour",
        /// The last day.
        Day => "day",
    }
}

impl HealthWindow {
    /// How far back the window reaches, in seconds.
    pub fn seconds(self) -> i64 {
        match self {
            HealthWindow::Hour => 3_600,
            HealthWindow::Day => 86_400,
        }
    }
}
