//! Durability in proportion to what a lost commit costs.
//!
//! A call makes up to four commits: the intent (step 8), the claim (9), the
//! effect watermark, and the result (13). Each either waits for the disk
//! (`Flushed`: PostgreSQL `synchronous_commit` on, SQLite `synchronous =
//! FULL`) or is written to the log and flushed a moment later (`Relaxed`:
//! `synchronous_commit = off` for that transaction, SQLite `synchronous =
//! NORMAL` in WAL mode). A relaxed commit survives the process dying; only
//! the operating system or the database server failing within the flush
//! window (PostgreSQL's `wal_writer_delay`, SQLite's next checkpoint or
//! flushed commit) can lose it. Both logs are sequential, so a later
//! flushed commit makes every earlier relaxed one durable too: a lost
//! commit is always the newest, never a hole behind a kept one.
//!
//! | class | side effect | intent | claim | watermark | result | a lost commit costs |
//! |---|---|---|---|---|---|---|
//! | read only | none, workspace, network or external read | relaxed | relaxed | none | relaxed | one re-execution of a read: the row is gone (resubmission runs it again) or stays AUTHORIZED/RUNNING (recovery runs it again); nothing is answered from a record that does not exist, and no effect exists to duplicate |
//! | read only, denied or waiting for approval | any | flushed | — | — | — | a denial the breaker counts, or a human's pending decision, would vanish |
//! | idempotent, conditionally idempotent, non-idempotent | any write | flushed | flushed | flushed | flushed | a lost intent or watermark could hide that an effect was sent, and a lost result could re-send it: every commit waits for the disk |
//!
//! Rows settled without the tool (denials, recovery's uncertain rows) and
//! every write outside the four commits stay flushed.

use super::outcome::InvocationStatus;
use super::tool::{IdempotencyClass, SideEffectClass};

/// How durable one commit must be before the call proceeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// On disk before the commit returns.
    Flushed,
    /// In the log at once, on disk a moment later.
    Relaxed,
}

impl Durability {
    /// The table above, for a call of `class` and `side_effect`.
    pub fn of(class: IdempotencyClass, side_effect: SideEffectClass) -> Durability {
        if class == IdempotencyClass::ReadOnly && side_effect.is_read_only() {
            Durability::Relaxed
        } else {
            Durability::Flushed
        }
    }

    /// The intent's durability: only a read inserted AUTHORIZED is
    /// relaxed; a denial or a row waiting for approval is flushed.
    pub fn of_intent(
        class: IdempotencyClass,
        side_effect: SideEffectClass,
        status: InvocationStatus,
    ) -> Durability {
        if status == InvocationStatus::Authorized {
            Durability::of(class, side_effect)
        } else {
            Durability::Flushed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_reads_are_relaxed() {
        for class in [
            IdempotencyClass::ReadOnly,
            IdempotencyClass::Idempotent,
            IdempotencyClass::ConditionallyIdempotent,
            IdempotencyClass::NonIdempotent,
        ] {
            for side_effect in [
                SideEffectClass::None,
                SideEffectClass::WorkspaceRead,
                SideEffectClass::WorkspaceWrite,
                SideEffectClass::NetworkRead,
                SideEffectClass::ExternalRead,
                SideEffectClass::ExternalWrite,
            ] {
                let relaxed = class == IdempotencyClass::ReadOnly && side_effect.is_read_only();
                assert_eq!(
                    Durability::of(class, side_effect) == Durability::Relaxed,
                    relaxed,
                    "{class:?} {side_effect:?}"
                );
                for status in [
                    InvocationStatus::WaitingForApproval,
                    InvocationStatus::Denied,
                ] {
                    assert_eq!(
                        Durability::of_intent(class, side_effect, status),
                        Durability::Flushed
                    );
                }
                assert_eq!(
                    Durability::of_intent(class, side_effect, InvocationStatus::Authorized),
                    Durability::of(class, side_effect)
                );
            }
        }
    }
}
