//! Steps 1 to 9: resolution, authority, validation, policy, and the intent
//! persisted (claimed in the same commit when nothing waits).

use std::sync::Arc;

use uuid::Uuid;

use super::super::breaker;
use super::super::call::{CallOutcome, CallRequest, Point, Replay, ReplayDivergence};
use super::super::output::RenderedPart;
use super::super::records::{denied_event, recorded};
use super::super::registry::RegisteredTool;
use super::Pipeline;
use super::intent::{Intent, RecordedAs};
use super::refusals::Unwrap;
use crate::domain::policy::{PolicyDecision, ProposedAction};
use crate::domain::{
    CanonicalArguments, Durability, IdempotencyClass, ReasonCode, ToolEventKind, TrustLevel,
};
use crate::ports::{
    BreakerTally, Claim, InsertOutcome, InvocationState, PlatformEvent, Start, StoreError,
};

/// What steps 1 to 5 made of a call.
enum Admission {
    /// The resolved tool, and the arguments in canonical form.
    Admitted(Arc<RegisteredTool>, CanonicalArguments),
    /// Refused before policy; the recorded outcome.
    Refused(CallOutcome),
}

impl Pipeline {
    pub(super) async fn steps(&self, request: &CallRequest) -> Result<CallOutcome, StoreError> {
        // tool.call never executes: it is unwrapped into the deferred tool
        // it names before step 1, and the call goes on as that tool.
        let unwrapped = match self.unwrap_tool_call(request).await? {
            Unwrap::Plain => None,
            Unwrap::Into(inner) => Some(inner),
            Unwrap::Refused(outcome) => return Ok(outcome),
        };
        let request: &CallRequest = unwrapped.as_deref().unwrap_or(request);
        if request.withdrawn() {
            return Ok(CallOutcome::Withdrawn);
        }
        let (tool, canonical) = match self.admit(request, unwrapped.is_some()).await? {
            Admission::Admitted(tool, canonical) => (tool, canonical),
            Admission::Refused(outcome) => return Ok(outcome),
        };
        let intent = Intent::new(
            request,
            RecordedAs::of(&tool.spec),
            canonical.value,
            canonical.sha256,
            self.clock.now(),
        );
        if request.recovering.is_none()
            && request
                .deadline_at
                .is_some_and(|deadline| deadline <= self.clock.now())
        {
            // A call that cannot finish is refused before it starts.
            return self
                .refuse(
                    request,
                    &tool,
                    ReasonCode::ToolDeadlineExceeded,
                    None,
                    Some((&intent.identity.arguments, &intent.identity.arguments_hash)),
                )
                .await;
        }
        let ruled = self.rules(&tool, &intent).await;
        let ruled = match diverged(request, &tool, &intent) {
            None => ruled,
            Some(replay) if replay.divergence == ReplayDivergence::Refuse => {
                let outcome = self
                    .refuse(
                        request,
                        &tool,
                        ReasonCode::BridgeReplayDiverged,
                        None,
                        Some((&intent.identity.arguments, &intent.identity.arguments_hash)),
                    )
                    .await?;
                let invocation_id = match &outcome {
                    CallOutcome::Finished(finished) => finished.invocation_id,
                    _ => None,
                };
                self.tell_divergence(request, &tool, replay, invocation_id, "refused")
                    .await;
                return Ok(outcome);
            }
            // Held for a human, who sees both calls; a denial stands.
            Some(_) => match ruled {
                PolicyDecision::Deny(code) => PolicyDecision::Deny(code),
                _ => PolicyDecision::RequireApproval(ReasonCode::BridgeReplayDiverged),
            },
        };
        self.persist_intent(&tool, &intent, ruled).await
    }

    /// Records that a replayed turn's call diverged from its record. The
    /// call's own row is the record of what happened to it; an event that
    /// could not be written is logged, never the call's failure.
    async fn tell_divergence(
        &self,
        request: &CallRequest,
        tool: &RegisteredTool,
        replay: &Replay,
        invocation_id: Option<Uuid>,
        outcome: &'static str,
    ) {
        let event = PlatformEvent::BridgeReplayDiverged {
            run_id: request.run_id,
            step_number: request.step_number,
            call_id: request.call_id.clone(),
            recorded_invocation_id: replay.invocation_id,
            recorded_tool: replay.tool_name.clone(),
            invocation_id,
            tool: tool.spec.name.clone(),
            outcome,
        };
        if let Err(error) = self
            .events
            .record_event(Some(&request.tenant_id), &event, self.clock.now())
            .await
        {
            tracing::warn!(error = %error, "a replay's divergence was not recorded as an event");
        }
    }

    /// Steps 1 to 5: resolved against the pinned set, enabled for the
    /// agent, within the principal's scopes, valid, and normalized.
    async fn admit(&self, request: &CallRequest, unwrapped: bool) -> Result<Admission, StoreError> {
        // 1. Resolve against the pinned set: unknown is denied before policy.
        self.reached(Point::Resolve, request);
        let Some(pinned) = request.pinned.resolve(&request.name) else {
            return self
                .refuse_unresolved(request)
                .await
                .map(Admission::Refused);
        };
        let tool = pinned.tool.clone();
        let spec = &tool.spec;
        let span = tracing::Span::current();
        span.record("tool.name", spec.name.as_str());
        span.record("tool.source", spec.source.as_str());
        span.record("tool.version", spec.version.as_str());
        span.record("tool.idempotency_class", spec.idempotency.as_str());

        // 2. Enabled for this agent.
        self.reached(Point::Enabled, request);
        let refusal = if !request.agent.enables(&spec.name) {
            Some(ReasonCode::PolicyAgentToolDisabled)
        } else {
            // 3. Scopes.
            self.reached(Point::Scopes, request);
            (!request.principal.missing_scopes(spec).is_empty())
                .then_some(ReasonCode::PolicyScopeMissing)
        };
        if let Some(code) = refusal {
            return self
                .refuse(request, &tool, code, None, None)
                .await
                .map(Admission::Refused);
        }

        // 4. Validate.
        self.reached(Point::Validate, request);
        let validated = tracing::info_span!("tool.validate")
            .in_scope(|| tool.input.validate(request.arguments.clone()));
        let canonical = match validated {
            Ok(canonical) => canonical,
            Err(error) => {
                let mut text = error.to_string();
                if unwrapped {
                    // The deferred tool's definition never reached the
                    // provider; its schema is what the model needs.
                    text.push_str("\ninput_schema: ");
                    text.push_str(&spec.input_schema.to_string());
                }
                let detail = vec![RenderedPart::Text {
                    text,
                    trust: TrustLevel::Platform,
                }];
                return self
                    .refuse(
                        request,
                        &tool,
                        ReasonCode::ToolArgumentsInvalid,
                        Some(detail),
                        None,
                    )
                    .await
                    .map(Admission::Refused);
            }
        };

        // 5. Normalize: the canonical form's hash keys everything after.
        self.reached(Point::Normalize, request);
        Ok(Admission::Admitted(tool, canonical))
    }

    /// Step 6's rules. They read nothing from the store, so taking them
    /// before the breaker changes no decision, and it lets an allowed call
    /// the breaker has nothing to count for (the first with its arguments
    /// in the run, as most calls are) show that and persist its intent in
    /// one commit: the breaker's verdict on an empty tally is to proceed.
    async fn rules(&self, tool: &RegisteredTool, intent: &Intent<'_>) -> PolicyDecision {
        use tracing::Instrument as _;
        let request = intent.request;
        self.reached(Point::Policy, request);
        let spec = &tool.spec;
        let action = ProposedAction {
            tenant_id: &request.tenant_id,
            principal: &request.principal,
            tool: &spec.name,
            kind: spec.kind,
            source: spec.source,
            side_effect: spec.side_effect,
            risk: spec.risk,
            idempotency: spec.idempotency,
            origin_trust: request.origin_trust,
            argument_trust: &request.argument_trust,
            arguments: &intent.identity.arguments,
        };
        self.policy
            .evaluate(&action)
            .instrument(tracing::info_span!("policy.evaluate"))
            .await
    }

    /// Step 6's breaker, whose counts are the run's own record (a
    /// recovering call was counted when it was first proposed), then step
    /// 7's approval or steps 8 and 9 in one commit: with no approval
    /// pending, the intent is inserted already claimed (RUNNING under this
    /// worker's fence). Losing it loses both or neither, and the tool
    /// starts only once it is committed.
    async fn persist_intent(
        &self,
        tool: &Arc<RegisteredTool>,
        intent: &Intent<'_>,
        ruled: PolicyDecision,
    ) -> Result<CallOutcome, StoreError> {
        let request = intent.request;
        let claim = Claim {
            worker_id: self.lease.worker_id(),
            now: self.clock.now(),
        };
        // Only a running intent's commit is the tool's; a denial or a row
        // waiting for approval is flushed.
        let running = intent.row(Start::Running, Durability::of_tool(&tool.spec));
        // A call allowed and started in one commit writes one event, not
        // three: its proposal, authorization and start are that commit's
        // one instant, and `tool.call.started` carries every field the
        // other two would (an event row is a heap row and two index
        // entries a call pays for). Proposed and authorized are written
        // where they stand apart: a call waiting for its approval, and
        // its approval given.
        let running_events = [intent.event(ToolEventKind::Started)];
        // Taken back before anything was written: nothing is.
        if request.withdrawn() {
            return Ok(CallOutcome::Withdrawn);
        }
        let uncounted = request.recovering.is_none() && ruled == PolicyDecision::Allow;
        if uncounted {
            self.reached(Point::PersistIntent, request);
            if let Some(row) = self
                .invocations
                .insert_uncounted(&running, claim, &running_events)
                .await?
            {
                return self
                    .start(
                        request,
                        tool,
                        row,
                        &intent.identity.arguments_hash,
                        BreakerTally::default(),
                    )
                    .await;
            }
        }
        let tally = match request.recovering {
            Some(_) => BreakerTally::default(),
            None => {
                self.invocations
                    .breaker_tally(
                        &request.tenant_id,
                        request.run_id,
                        &tool.spec.name,
                        &intent.identity.arguments_hash,
                    )
                    .await?
            }
        };
        if let breaker::Verdict::Refuse(code) =
            breaker::before_dispatch(&tally, request.step_number)
        {
            return self
                .refuse(
                    request,
                    tool,
                    code,
                    None,
                    Some((&intent.identity.arguments, &intent.identity.arguments_hash)),
                )
                .await;
        }
        let decision = match ruled {
            PolicyDecision::Deny(code) => PolicyDecision::Deny(breaker::denial(&tally, code)),
            other => other,
        };
        let inserted = match decision {
            PolicyDecision::Deny(code) => {
                let events = [denied_event(&intent.identity, code)];
                let denied = intent.row(Start::Denied(code), Durability::Flushed);
                self.invocations
                    .insert_invocation(&denied, claim, &events)
                    .await?
            }
            PolicyDecision::RequireApproval(code) => {
                if let Some(outcome) = self.the_waiting_call(tool, intent, decision).await? {
                    return Ok(outcome);
                }
                // 7. Approval: persisted with a waiting row in one commit.
                self.reached(Point::Approval, request);
                let events = [intent.event(ToolEventKind::Proposed)];
                let waiting = intent.row(
                    Start::Waiting {
                        approval_id: Uuid::new_v4(),
                        reason_code: code,
                    },
                    Durability::Flushed,
                );
                self.invocations
                    .insert_invocation(&waiting, claim, &events)
                    .await?
            }
            PolicyDecision::Allow => {
                if !uncounted {
                    self.reached(Point::PersistIntent, request);
                }
                self.invocations
                    .insert_invocation(&running, claim, &running_events)
                    .await?
            }
        };
        self.inserted(tool, intent, inserted, tally, decision).await
    }

    /// What step 8's insert found: a row inserted already claimed runs; a
    /// waiting one is pending; a row the key already had is deduplicated.
    async fn inserted(
        &self,
        tool: &Arc<RegisteredTool>,
        intent: &Intent<'_>,
        inserted: InsertOutcome,
        tally: BreakerTally,
        decision: PolicyDecision,
    ) -> Result<CallOutcome, StoreError> {
        let request = intent.request;
        if let (InsertOutcome::Inserted(row), Some(replay)) =
            (&inserted, diverged(request, tool, intent))
        {
            self.tell_divergence(request, tool, replay, Some(row.identity.id), "held")
                .await;
        }
        match inserted {
            InsertOutcome::Inserted(row) => match row.state {
                InvocationState::Waiting { approval_id } => Ok(CallOutcome::Pending {
                    invocation_id: row.identity.id,
                    approval_id,
                }),
                // Inserted already claimed, or ended (denied).
                _ => match row.held() {
                    Ok(held) => {
                        self.start(request, tool, held, &intent.identity.arguments_hash, tally)
                            .await
                    }
                    Err(row) => Ok(recorded(&row)),
                },
            },
            InsertOutcome::Existing(row) => {
                self.deduplicate(
                    request,
                    tool,
                    row,
                    &intent.identity.arguments_hash,
                    decision,
                )
                .await
            }
        }
    }

    /// A caller that cannot name its calls asking again is the call that
    /// already waits: one approval, one execution. The outcome of that
    /// call, when there is one to resume.
    async fn the_waiting_call(
        &self,
        tool: &Arc<RegisteredTool>,
        intent: &Intent<'_>,
        decision: PolicyDecision,
    ) -> Result<Option<CallOutcome>, StoreError> {
        let request = intent.request;
        if !request.caller.resumes_waiting || request.recovering.is_some() {
            return Ok(None);
        }
        let Some(row) = self
            .invocations
            .waiting_call(
                &request.tenant_id,
                request.run_id,
                &tool.spec.name,
                &intent.identity.arguments_hash,
            )
            .await?
        else {
            return Ok(None);
        };
        let same = CallRequest {
            step_number: row.identity.step_number,
            call_id: row.identity.call_id.clone(),
            ..request.clone()
        };
        self.deduplicate(&same, tool, row, &intent.identity.arguments_hash, decision)
            .await
            .map(Some)
    }
}

/// The record a replayed turn's call diverges from: the call recorded at
/// its ordinal was another tool or had other arguments, and this one may
/// act (a read is let through: it changes nothing a replay could repeat).
fn diverged<'a>(
    request: &'a CallRequest,
    tool: &RegisteredTool,
    intent: &Intent<'_>,
) -> Option<&'a Replay> {
    let replay = request.caller.replay.as_ref()?;
    let same = replay.tool_name == tool.spec.name
        && replay.arguments_hash == intent.identity.arguments_hash;
    (!same && tool.spec.idempotency != IdempotencyClass::ReadOnly).then_some(replay)
}
