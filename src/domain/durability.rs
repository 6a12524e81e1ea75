//! Durability in proportion to what a lost commit costs.
//!
//! A call makes up to four commits: the intent (step 8), the claim (9), the
//! effect watermark, and the result (13). With no approval pending the
//! intent is inserted already claimed (`RUNNING` under the inserting
//! worker's fence), so steps 8 and 9 are one commit: losing it loses both,
//! and the tool starts only once it is committed. A call resumed from an
//! approval is claimed in a commit of its own. Each commit either waits for
//! the disk (`Flushed`: PostgreSQL `synchronous_commit` on, SQLite
//! `synchronous = FULL`) or is written to the log and flushed a moment later
//! (`Relaxed`: `synchronous_commit = off` for that transaction, SQLite
//! `synchronous = NORMAL` in WAL mode). A relaxed commit survives the
//! process dying; only the operating system or the database server failing
//! within the flush window (PostgreSQL's `wal_writer_delay`, SQLite's next
//! checkpoint or flushed commit) can lose it. Both logs are sequential, so a
//! later flushed commit makes every earlier relaxed one durable too: a lost
//! commit is always the newest, never a hole behind a kept one.
//!
//! | tool | intent | claim | watermark | result | a lost commit costs |
//! |---|---|---|---|---|---|
//! | a capability of read-only class whose side effect is none or a read | relaxed | (folded) | relaxed, for a read of another system only | relaxed | one re-execution of a read: the row is gone (resubmission runs it again) or stays RUNNING (recovery runs it again); nothing is answered from a record that does not exist, and no effect exists to duplicate |
//! | a control tool | flushed | (folded) | — | flushed | its row is the run's record (the working state, a question asked, a child started) and the runtime does not ask again once answered |
//! | idempotent | flushed | (folded) | relaxed | flushed | a lost intent could hide that an effect was sent, and a lost result could re-send it; the watermark decides nothing for this class (recovery re-executes whether it is set or not), so losing it costs nothing |
//! | conditionally idempotent, non-idempotent | flushed | (folded) | flushed | flushed | a lost intent or watermark could hide that an effect was sent (recovery would re-execute where it must replay or ask a human), and a lost result could re-send it |
//!
//! The watermark's column follows the recovery table: it is flushed exactly
//! for the classes whose recovery decision reads it.
//!
//! A denial, a row waiting for approval, recovery's settlements and every
//! write outside the four commits are flushed whatever the tool.

use super::tool::{IdempotencyClass, ToolKind, ToolSpec};

/// How durable one commit must be before the call proceeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// On disk before the commit returns.
    Flushed,
    /// In the log at once, on disk a moment later.
    Relaxed,
}

impl Durability {
    /// The table above, for the commits of a call of `spec` that runs.
    pub fn of_tool(spec: &ToolSpec) -> Durability {
        if spec.kind == ToolKind::Capability
            && spec.idempotency == IdempotencyClass::ReadOnly
            && spec.side_effect.is_read_only()
        {
            Durability::Relaxed
        } else {
            Durability::Flushed
        }
    }
}

impl Durability {
    /// The table above, for the effect watermark of a call of `spec`:
    /// relaxed where the recovery decision does not read it (read-only and
    /// idempotent classes re-execute either way).
    pub fn of_watermark(spec: &ToolSpec) -> Durability {
        match spec.idempotency {
            IdempotencyClass::ReadOnly | IdempotencyClass::Idempotent => Durability::Relaxed,
            IdempotencyClass::ConditionallyIdempotent | IdempotencyClass::NonIdempotent => {
                Durability::Flushed
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{RiskLevel, SideEffectClass, TargetKind, ToolSource, TrustLevel};

    fn spec(
        kind: ToolKind,
        idempotency: IdempotencyClass,
        side_effect: SideEffectClass,
    ) -> ToolSpec {
        ToolSpec {
            name: "demo.tool".into(),
            version: "1".into(),
            description: "A tool.".into(),
            input_schema: serde_json::json!({"type": "object"}),
            output_schema: None,
            side_effect,
            risk: RiskLevel::Low,
            idempotency,
            required_scopes: Default::default(),
            timeout_seconds: 10,
            maximum_output_bytes: 1024,
            allow_parallel: false,
            kind,
            target_kind: TargetKind::InProcess,
            output_trust: TrustLevel::ExternalUntrusted,
            source: ToolSource::Builtin,
            server_id: None,
            device_id: None,
            deprecated: false,
            model_visible: true,
        }
    }

    #[test]
    fn only_reads_are_relaxed() {
        for kind in [ToolKind::Capability, ToolKind::Control] {
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
                    let relaxed = kind == ToolKind::Capability
                        && class == IdempotencyClass::ReadOnly
                        && side_effect.is_read_only();
                    assert_eq!(
                        Durability::of_tool(&spec(kind, class, side_effect)) == Durability::Relaxed,
                        relaxed,
                        "{kind:?} {class:?} {side_effect:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_watermark_is_flushed_exactly_where_recovery_reads_it() {
        use crate::domain::recovery::decide;
        for class in [
            IdempotencyClass::ReadOnly,
            IdempotencyClass::Idempotent,
            IdempotencyClass::ConditionallyIdempotent,
            IdempotencyClass::NonIdempotent,
        ] {
            let read = decide(class, true) != decide(class, false);
            let spec = spec(ToolKind::Capability, class, SideEffectClass::ExternalWrite);
            assert_eq!(
                Durability::of_watermark(&spec) == Durability::Flushed,
                read,
                "{class:?}"
            );
        }
    }
}
