//! Step 8's row: what one call's intent records. Built here once for every
//! row a call can leave (running, waiting, denied, refused, a recorded
//! conflict), so each carries the same identity.

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::{NoContext, Timestamp, Uuid};

use super::super::call::CallRequest;
use crate::domain::{
    Durability, IdempotencyClass, SideEffectClass, ToolEventKind, ToolSource, ToolSpec,
    idempotency_key,
};
use crate::ports::{CallIdentity, NewInvocation, Start, ToolEvent};

/// The classification a call is recorded under.
#[derive(Clone)]
pub(super) struct RecordedAs<'a> {
    pub(super) tool_name: &'a str,
    pub(super) tool_version: &'a str,
    pub(super) tool_source: ToolSource,
    pub(super) server_id: Option<String>,
    pub(super) class: IdempotencyClass,
    pub(super) side_effect: SideEffectClass,
}

impl<'a> RecordedAs<'a> {
    /// A resolved tool's classification.
    pub(super) fn of(spec: &'a ToolSpec) -> Self {
        RecordedAs {
            tool_name: &spec.name,
            tool_version: &spec.version,
            tool_source: spec.source,
            server_id: spec.server_id.clone(),
            class: spec.idempotency,
            side_effect: spec.side_effect,
        }
    }

    /// A name that resolved to nothing: the most restrictive classification
    /// stands in.
    pub(super) fn unresolved(name: &'a str) -> Self {
        RecordedAs {
            tool_name: name,
            tool_version: "",
            tool_source: ToolSource::Builtin,
            server_id: None,
            class: IdempotencyClass::NonIdempotent,
            side_effect: SideEffectClass::ExternalWrite,
        }
    }
}

/// A new row's id: a UUIDv7 of the node's clock, so rows made together
/// sit together in the indexes keyed by it (the row's own, its events'):
/// an intent extends their right edge instead of splitting a page anywhere
/// in them, and writes the pages the last call wrote. Its 74 random bits
/// keep it unguessable.
fn invocation_id(now: DateTime<Utc>) -> Uuid {
    let seconds = u64::try_from(now.timestamp()).unwrap_or_default();
    Uuid::new_v7(Timestamp::from_unix(
        NoContext,
        seconds,
        now.timestamp_subsec_nanos(),
    ))
}

/// One call's intent: who asked, what it is recorded as, and its arguments
/// in the form step 5 keyed them by.
pub(super) struct Intent<'a> {
    pub(super) request: &'a CallRequest,
    pub(super) call: RecordedAs<'a>,
    /// What the call is, as its row and its events record it.
    pub(super) identity: CallIdentity,
}

impl<'a> Intent<'a> {
    /// The intent of `request` as `call`, keyed by the run, step, call id,
    /// tool, version and arguments hash, its row made at `now`.
    pub(super) fn new(
        request: &'a CallRequest,
        call: RecordedAs<'a>,
        arguments: Value,
        arguments_hash: String,
        now: DateTime<Utc>,
    ) -> Self {
        let idempotency_key = idempotency_key(
            &request.run_id.to_string(),
            u64::try_from(request.step_number).unwrap_or_default(),
            &request.call_id,
            call.tool_name,
            call.tool_version,
            &arguments_hash,
        );
        let identity = CallIdentity {
            id: invocation_id(now),
            tenant_id: request.tenant_id.clone(),
            session_id: request.session_id,
            run_id: request.run_id,
            step_number: request.step_number,
            call_id: request.call_id.clone(),
            tool_name: call.tool_name.to_owned(),
            tool_version: call.tool_version.to_owned(),
            tool_source: call.tool_source,
            server_id: call.server_id.clone(),
            arguments,
            arguments_hash,
            idempotency_key,
            idempotency_class: call.class,
            side_effect: call.side_effect,
            origin_trust: request.origin_trust,
            argument_trust: request.argument_trust.clone(),
            principal: request.principal.clone(),
            parallel_group: request.parallel_group,
            deadline_at: request.deadline_at,
        };
        Intent {
            request,
            call,
            identity,
        }
    }

    pub(super) fn event(&self, kind: ToolEventKind) -> ToolEvent {
        self.identity.event(kind)
    }

    /// The row this intent inserts, starting as `start` says.
    pub(super) fn row(&self, start: Start, durability: Durability) -> NewInvocation {
        NewInvocation {
            identity: self.identity.clone(),
            start,
            durability,
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone as _;

    use super::*;

    #[test]
    fn rows_made_later_have_greater_ids_and_none_repeats() {
        let at = |micros: i64| {
            Utc.timestamp_micros(1_780_000_000_000_000 + micros)
                .unwrap()
        };
        let ids: Vec<Uuid> = [0, 1_000, 1_000, 2_000_000]
            .into_iter()
            .map(|micros| invocation_id(at(micros)))
            .collect();
        assert!(ids.iter().all(|id| id.get_version_num() == 7));
        assert!(ids[0] < ids[1] && ids[1].max(ids[2]) < ids[3]);
        assert_ne!(ids[1], ids[2], "the same millisecond still gives two ids");
        // The text the stores key by sorts as the ids do.
        let text: Vec<String> = ids.iter().map(Uuid::to_string).collect();
        assert!(text[0] < text[1] && text[2] < text[3]);
        // A clock before 1970 still gives an id.
        assert_eq!(
            invocation_id(Utc.timestamp_opt(-5, 0).unwrap()).get_version_num(),
            7
        );
    }
}
