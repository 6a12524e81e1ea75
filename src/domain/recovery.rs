//! The recovery table: what a later worker does with a row whose worker
//! died, and whether a call refused mid-session (a 401) may be sent again.
//! A pure function of the row's snapshot class and its watermark, so the
//! decision reads a fact rather than making an inference.

use crate::domain::IdempotencyClass;

/// What recovery does with an abandoned row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryDecision {
    /// Run it again: nothing was sent, or repeating is harmless.
    ReExecute,
    /// Run it again with the same idempotency key, which the remote
    /// deduplicates on.
    ReplayWithSameKey,
    /// The effect may have escaped and cannot be repeated: UNCERTAIN, to
    /// human review.
    Uncertain,
}

/// The design document's table, row for row.
pub fn decide(class: IdempotencyClass, effect_sent: bool) -> RecoveryDecision {
    match (class, effect_sent) {
        (IdempotencyClass::ReadOnly, _) | (IdempotencyClass::Idempotent, _) => {
            RecoveryDecision::ReExecute
        }
        (IdempotencyClass::ConditionallyIdempotent, false) => RecoveryDecision::ReExecute,
        (IdempotencyClass::ConditionallyIdempotent, true) => RecoveryDecision::ReplayWithSameKey,
        (IdempotencyClass::NonIdempotent, false) => RecoveryDecision::ReExecute,
        (IdempotencyClass::NonIdempotent, true) => RecoveryDecision::Uncertain,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table() {
        use IdempotencyClass::*;
        use RecoveryDecision::*;
        let table = [
            (ReadOnly, false, ReExecute),
            (ReadOnly, true, ReExecute),
            (Idempotent, false, ReExecute),
            (Idempotent, true, ReExecute),
            (ConditionallyIdempotent, false, ReExecute),
            (ConditionallyIdempotent, true, ReplayWithSameKey),
            (NonIdempotent, false, ReExecute),
            (NonIdempotent, true, Uncertain),
        ];
        for (class, sent, expected) in table {
            assert_eq!(decide(class, sent), expected, "{class} sent={sent}");
        }
    }
}
