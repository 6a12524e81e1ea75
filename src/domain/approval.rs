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
