//! `PolicyEngine`: step 6.

use crate::domain::policy::{PolicyDecision, ProposedAction};

use super::tool::BoxFuture;

/// Evaluates a proposed action. An engine never sees argument values and
/// never explains itself to the model: its answer is a decision and a code.
pub trait PolicyEngine: Send + Sync {
    /// Step 6.
    fn evaluate<'a>(&'a self, action: &'a ProposedAction<'a>) -> BoxFuture<'a, PolicyDecision>;
}
