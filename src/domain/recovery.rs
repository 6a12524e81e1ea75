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

/// What a call whose tool ran answers when the store fails under its
/// terminal write. The answer must be what the row will hold whichever way
/// it ends: written later by the same worker, or taken by recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnwrittenEnd {
    /// Recovery would end the row uncertain, so it is recorded uncertain
    /// either way and the answer says so.
    Uncertain,
    /// Recovery would run it again (or replay it with its key), so what the
    /// row ends with is not known yet: the caller asks again with the same
    /// call and reads it.
    AskAgain,
}

/// The rule for [`UnwrittenEnd`]: the recovery table's answer for the row.
pub fn unwritten_end(class: IdempotencyClass, effect_sent: bool) -> UnwrittenEnd {
    match decide(class, effect_sent) {
        RecoveryDecision::Uncertain => UnwrittenEnd::Uncertain,
        RecoveryDecision::ReExecute | RecoveryDecision::ReplayWithSameKey => UnwrittenEnd::AskAgain,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unwritten_end_follows_the_table() {
        use IdempotencyClass::*;
        use UnwrittenEnd::*;
        let table = [
            (ReadOnly, false, AskAgain),
            (ReadOnly, true, AskAgain),
            (Idempotent, false, AskAgain),
            (Idempotent, true, AskAgain),
            (ConditionallyIdempotent, false, AskAgain),
            (ConditionallyIdempotent, true, AskAgain),
            (NonIdempotent, false, AskAgain),
            (NonIdempotent, true, Uncertain),
        ];
        for (class, sent, expected) in table {
            assert_eq!(unwritten_end(class, sent), expected, "{class} sent={sent}");
        }
    }

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
