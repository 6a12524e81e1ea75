//! Step 8's row: what one call's intent records. Built here once for every
//! row a call can leave (running, waiting, denied, refused, a recorded
//! conflict), so each carries the same identity.

use serde_json::Value;
use uuid::Uuid;

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
    /// tool, version and arguments hash.
    pub(super) fn new(
        request: &'a CallRequest,
        call: RecordedAs<'a>,
        arguments: Value,
        arguments_hash: String,
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
            id: Uuid::new_v4(),
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
