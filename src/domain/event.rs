//! The seven tool events (Section 6): names only. What an event may carry is
//! the port's `ToolEvent`, which has no field for arguments, results, error
//! detail or external text.

closed_enum! {
    /// Which tool event.
    pub enum ToolEventKind {
        /// The model proposed a call.
        Proposed => "tool.call.proposed",
        /// Intent persisted (step 8).
        Authorized => "tool.call.authorized",
        /// Policy or scope refused.
        Denied => "tool.call.denied",
        /// Claimed for execution (step 9).
        Started => "tool.call.started",
        /// Ended succeeded.
        Completed => "tool.call.completed",
        /// Ended failed or unavailable.
        Failed => "tool.call.failed",
        /// Ended uncertain.
        Uncertain => "tool.call.uncertain",
    }
}
