//! The MCP methods: `initialize` opens a toolgate session, `tools/list` is
//! its pinned set, `tools/call` is a pipeline call (held while it waits for
//! an approval, or given as a task or the console's page), `prompts/*` are
//! its skills loaded through `skill.load`, `tasks/*` its held calls.
//! Sampling, roots and form elicitation are never asked of the client;
//! nothing is sent but answers and progress. Each answers JSON as the
//! protocol spells it; the protocol's side (`adapters::mcp`) parses and
//! writes the messages.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tracing::Instrument as _;
use uuid::Uuid;

use super::reissue::{Attached, Reissue, reissue_key};
use super::render::{self, CallIdentity};
use super::shares::ShareSpent;
use super::{Busy, Front, FrontRequest, request_key};
use crate::domain::names::SKILL_LOAD;
use crate::domain::{IdempotencyClass, canonicalize};
use crate::pipeline::approvals::{Held, Hold, HoldObserver};
use crate::pipeline::sessions::{CallPlace, Session, SessionError};
use crate::pipeline::{CallOutcome, CallRequest, CallerTerms};
use crate::ports::PlatformEvent;
use crate::ports::front::{FrontContext, FrontError, FrontMethods, ProgressSink};
use crate::ports::tool::BoxFuture;

/// How often a call held for approval tells a client that asked for
/// progress that it still waits.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// How often a client is asked to poll a held call's task.
const TASK_POLL_MS: u64 = 5_000;

/// Stable JSON-RPC codes of the front door's own refusals.
const TOO_MANY_SESSIONS: i32 = -32003;
const TOO_MANY_CALLS: i32 = -32004;
const SERVERS_UNAVAILABLE: i32 = -32002;
const REQUEST_CANCELLED: i32 = -32800;

/// The front door's methods, as the protocol's side calls them.
pub(super) struct Methods {
    front: Arc<Front>,
}

impl Methods {
    pub(super) fn new(front: Arc<Front>) -> Self {
        Methods { front }
    }
}

/// What the listener resolved for the request.
fn front_request(context: &FrontContext) -> Result<FrontRequest, FrontError> {
    context
        .http
        .as_ref()
        .and_then(|parts| parts.extensions.get::<FrontRequest>())
        .cloned()
        .ok_or_else(|| FrontError::internal("the request was not authenticated"))
}

fn error(code: i32, message: &str) -> FrontError {
    FrontError {
        code,
        message: message.to_owned(),
        data: None,
    }
}

/// The task a held call is to a client of the tasks extension: its row's
/// id, `status` as given, with how often to ask.
fn task_of(
    invocation_id: &str,
    status: &str,
    message: Option<String>,
    created_at: chrono::DateTime<chrono::Utc>,
    now: chrono::DateTime<chrono::Utc>,
) -> Value {
    let mut task = json!({
        "taskId": invocation_id,
        "status": status,
        "createdAt": created_at.to_rfc3339(),
        "lastUpdatedAt": now.to_rfc3339(),
        "ttlMs": null,
        "pollIntervalMs": TASK_POLL_MS,
    });
    if let Some(message) = message {
        task["statusMessage"] = json!(message);
    }
    task
}

/// What a held call's task says while it works.
fn working_message(result: &Value) -> String {
    result
        .pointer("/structuredContent/approval_id")
        .and_then(Value::as_str)
        .map_or_else(
            || "the call is running".to_owned(),
            |approval| format!("waiting for approval {approval}"),
        )
}

fn session_of(request: &FrontRequest) -> Result<Arc<Session>, FrontError> {
    request
        .session
        .clone()
        .ok_or_else(|| FrontError::invalid_request("initialize a session first"))
}

/// One call as the client asked it.
struct Asked {
    identity: CallIdentity,
    request_id: Value,
    origin_trust: crate::domain::TrustLevel,
    name: String,
    arguments: Value,
    /// Whether a call that waits for an approval holds its request, or
    /// answers pending at once (a task's client polls instead).
    holds: bool,
}

/// What a held call ends as.
enum Answer {
    Result(Value),
    /// Answered as a JSON-RPC error (a rate-limited call).
    Refused(FrontError),
    Withdrawn,
}

impl Front {
    /// One call: the pipeline, and while it waits for an approval, the hold
    /// (with progress when the client asked for it).
    async fn run_call(
        &self,
        call: CallRequest,
        holds: bool,
        progress: Option<Arc<dyn ProgressSink>>,
    ) -> Answer {
        let pipeline = &self.parts.pipeline;
        let outcome = if holds {
            let hold = Hold {
                until: tokio::time::Instant::now() + self.parts.settings.approval_hold,
                turn_id: None,
                every: PROGRESS_EVERY,
                withdrawn: call.caller.withdrawn.clone(),
                observer: &Progressing(progress),
            };
            match self
                .parts
                .approvals
                .call_held(pipeline, call.clone(), hold)
                .await
            {
                Held::Outcome(outcome) => outcome,
                Held::Undecided {
                    invocation_id,
                    approval_id,
                } => return Answer::Result(render::pending(invocation_id, approval_id)),
                Held::Withdrawn => return Answer::Withdrawn,
            }
        } else {
            pipeline.call(call.clone()).await
        };
        match outcome {
            CallOutcome::Finished(finished) if finished.retry_after_seconds.is_some() => {
                Answer::Refused(render::rate_limited(&finished))
            }
            CallOutcome::Finished(finished) => {
                let mut result = render::finished(&finished, call.run_id);
                if let Some(consent) = &finished.consent {
                    render::ask_consent(&mut result, consent);
                }
                // The call's own output limit bounds what comes inline.
                let budget = call
                    .pinned
                    .resolve(&call.name)
                    .map_or(0, |tool| tool.tool.spec.maximum_output_bytes);
                self.inline_artifacts(&mut result, &call.tenant_id, budget)
                    .await;
                Answer::Result(result)
            }
            CallOutcome::Suspended {
                invocation_id,
                kind,
                reference,
            } => Answer::Result(render::suspended(invocation_id, kind.as_str(), &reference)),
            CallOutcome::Withdrawn => Answer::Withdrawn,
            CallOutcome::Pending {
                invocation_id,
                approval_id,
            } => Answer::Result(render::pending(invocation_id, approval_id)),
        }
    }

    /// The call an unnamed request is, by the re-issue rule: its
    /// undelivered twin's when it has one, else a new one under `fresh`.
    fn place_unnamed(
        &self,
        session: &Session,
        fresh: CallIdentity,
        name: &str,
        arguments: &Value,
    ) -> Option<Attached> {
        // A name or arguments the pipeline will refuse anyway have no twin.
        let tool = session.pinned.resolve(name)?;
        let hash = canonicalize(arguments.clone()).ok()?.sha256;
        let spec = &tool.tool.spec;
        let acts = !matches!(
            spec.idempotency,
            IdempotencyClass::ReadOnly | IdempotencyClass::Idempotent
        );
        let key = reissue_key(&session.tenant_id, &session.principal.id, &spec.name, &hash);
        Some(self.reissues.attach(key, fresh, acts))
    }

    /// Admits a call of `session` and runs it on a task of its own: a
    /// client that goes away mid-call never leaves it half-recorded, the
    /// same request asked again meanwhile waits for it, and an unnamed call
    /// whose answer was never delivered is the same call asked again.
    async fn admitted_call(
        self: &Arc<Self>,
        session: &Arc<Session>,
        front_request: &FrontRequest,
        asked: Asked,
        context: &FrontContext,
    ) -> Result<Answer, FrontError> {
        let Asked {
            mut identity,
            request_id,
            origin_trust,
            name,
            arguments,
            holds,
        } = asked;
        let delivery = front_request.delivery.clone();
        let key = request_key(&request_id);
        // The credential's and the tenant's shares of the door come first:
        // a session's own cap alone lets one key hold every connection.
        let share = self
            .shares
            .enter(&front_request.caller.credential, &session.tenant_id)
            .map_err(|spent| {
                error(
                    TOO_MANY_CALLS,
                    match spent {
                        ShareSpent::Credential => {
                            "this credential has its most calls in flight on this node; wait for one to end"
                        }
                        ShareSpent::Tenant => {
                            "this tenant has its most calls in flight on this node; wait for one to end"
                        }
                    },
                )
            })?;
        let slot = loop {
            match self.calls.admit(
                session.session_id,
                key.clone(),
                self.parts.settings.session_in_flight,
                &delivery.closed,
            ) {
                Ok(slot) => break slot,
                Err(Busy::Full) => {
                    return Err(error(
                        TOO_MANY_CALLS,
                        "this session has its most calls in flight; wait for one to end",
                    ));
                }
                Err(Busy::Running(mut done)) => {
                    let _ = done.wait_for(|done| *done).await;
                }
            }
        };
        // Placed once admitted: a request refused before it runs anything
        // says nothing of its twin's answer.
        let attached = if identity.named {
            None
        } else {
            self.place_unnamed(session, identity.clone(), &name, &arguments)
        };
        if let Some(attached) = &attached {
            delivery.attach(self.reissues.clone(), attached);
            identity = attached.identity.clone();
        }
        let place = CallPlace {
            run_id: identity.run_id,
            step_number: identity.step_number,
            origin_trust,
            deadline_at: None,
            parallel_group: None,
        };
        let mut call = session.call_request(place, identity.call_id, name, arguments);
        call.caller = CallerTerms {
            withdrawn: Some(slot.withdrawn.clone()),
            resumes_waiting: !identity.named,
            replay: None,
            rate_admitted: false,
        };
        let progress = context.progress.clone();
        let front = self.clone();
        let counted = self.parts.in_flight.enter();
        let tenant_id = session.tenant_id.clone();
        let session_id = session.session_id;
        let run_id = identity.run_id;
        let span = self.call_span(context);
        // Boxed: the call's state machine is kilobytes, and a task holds
        // its future and then its answer in one slot, which tokio copies
        // whole when the task is made, when it ends and when its answer is
        // read.
        tokio::spawn(Box::pin(
            async move {
                // One run of a call on this node at a time: a re-issue waits
                // for its twin's and then reads what it recorded.
                let turn = match &attached {
                    Some(attached) => Some(front.reissues.take_turn(attached).await),
                    None => None,
                };
                let mut answer = front.run_call(call, holds, progress).await;
                drop(turn);
                drop(slot);
                drop(share);
                drop(counted);
                if let Answer::Result(result) = &mut answer
                    && let Some(invocation_id) = render::invocation_of(result)
                {
                    render::mark_run(result, session_id, run_id);
                    if render::is_pending(result) {
                        delivery.pending();
                    }
                    let reissue = attached.as_ref().map_or(Reissue::New, |a| a.reissue);
                    if reissue != Reissue::New {
                        render::mark_reissue(result, reissue, front.reissues.window());
                        front
                            .record_reissue(&tenant_id, invocation_id, session_id, reissue)
                            .await;
                    }
                    if let Some(undelivery) = delivery.recorded(invocation_id, session_id) {
                        front.report_undelivered(&tenant_id, undelivery);
                    }
                }
                answer
            }
            .instrument(span),
        ))
        .await
        .map_err(|_| FrontError::internal("the call did not complete"))
    }

    /// A call's span: the child of the caller's trace when the request
    /// named one, in its `_meta` (2026-07-28) or its headers.
    fn call_span(&self, context: &FrontContext) -> tracing::Span {
        let span = tracing::info_span!("front.call");
        let headers = context.http.as_ref().map(|parts| &parts.headers);
        let header = |name: &str| {
            headers
                .and_then(|headers| headers.get(name))
                .and_then(|value| value.to_str().ok())
        };
        let meta = |name: &str| context.meta.get(name).and_then(Value::as_str);
        let (traceparent, tracestate) = match meta("traceparent") {
            Some(traceparent) => (Some(traceparent), meta("tracestate")),
            None => (header("traceparent"), header("tracestate")),
        };
        if let Some(traceparent) = traceparent {
            (self.parts.continue_trace)(&span, traceparent, tracestate);
        }
        span
    }

    /// The identity of the held call a retry's `requestState` names: its
    /// row, when it is this caller's call of this tool with these
    /// arguments (the state comes back from the client, so it is checked,
    /// never trusted).
    async fn held_identity(
        &self,
        session: &Session,
        state: &str,
        name: &str,
        arguments: &Value,
    ) -> Result<CallIdentity, FrontError> {
        let refused = || {
            FrontError::invalid_params(
                "requestState does not name a held call of this caller with these arguments",
            )
        };
        let invocation_id = state.parse::<Uuid>().map_err(|_| refused())?;
        let tool = session.pinned.resolve(name).ok_or_else(refused)?;
        let hash = canonicalize(arguments.clone())
            .map_err(|_| refused())?
            .sha256;
        let row = self
            .parts
            .invocations
            .invocation(&session.tenant_id, invocation_id)
            .await
            .map_err(|_| FrontError::internal("the held call could not be read; retry"))?
            .filter(|row| {
                row.identity.principal.id == session.principal.id
                    && row.identity.tool_name == tool.tool.spec.name
                    && row.identity.arguments_hash == hash
            })
            .ok_or_else(refused)?;
        Ok(CallIdentity {
            run_id: row.identity.run_id,
            step_number: row.identity.step_number,
            call_id: row.identity.call_id,
            named: true,
            origin_trust: Some(row.identity.origin_trust),
        })
    }

    /// Records that a call was asked again after its answer went
    /// undelivered, and how the rule placed it.
    async fn record_reissue(
        &self,
        tenant_id: &str,
        invocation_id: Uuid,
        session_id: Uuid,
        reissue: Reissue,
    ) {
        let event = PlatformEvent::FrontCallReissued {
            invocation_id,
            session_id,
            reissue: reissue.as_str(),
        };
        let now = self.parts.clock.now();
        if let Err(error) = self
            .parts
            .events
            .record_event(Some(tenant_id), &event, now)
            .await
        {
            tracing::warn!(error = %error, "a re-issued call's event was not recorded");
        }
    }
}

/// A call's identity and the key of its request among its session's
/// calls. A stateless request's id is unique to no one (every client of a
/// credential counts from 1), so it stands for nothing: an unnamed call
/// there is a new call unless the re-issue rule makes it its twin.
fn identity_of(
    context: &FrontContext,
    session: &Session,
    stateless: bool,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(CallIdentity, Value), FrontError> {
    let meta = &context.meta;
    if let Some(listed) = meta.get(render::META_TOOL_SCHEMA).and_then(Value::as_str)
        && listed != session.pinned.tool_schema_sha256()
    {
        return Err(FrontError::invalid_params(
            "the tools changed since they were listed (toolgate/tool_schema_sha256); list them again",
        ));
    }
    let request_id = if stateless {
        json!(format!("r:{}", Uuid::new_v4().simple()))
    } else {
        context.request_id.clone()
    };
    let mut identity = render::identity(meta, &request_id, session.session_id)
        .map_err(FrontError::invalid_params)?;
    if !identity.named {
        identity.run_id = render::unnamed_run(session.session_id, now);
    }
    Ok((identity, request_id))
}

/// The server's description, as `initialize` and `server/discover` give it.
fn info() -> Value {
    json!({
        "protocolVersion": "2025-11-25",
        "capabilities": {"tools": {"listChanged": false}, "prompts": {"listChanged": false},
                         "resources": {"listChanged": false, "subscribe": false},
                         "extensions": {"io.modelcontextprotocol/tasks": {}}},
        "serverInfo": {"name": "toolgate", "version": env!("CARGO_PKG_VERSION")},
        "instructions": "Every call through toolgate is recorded before it runs. A result marked uncertain means the effect may have happened: do not repeat that call.",
    })
}

/// A client that sent a progress token is told, while its call is held,
/// what it waits for.
struct Progressing(Option<Arc<dyn ProgressSink>>);

impl HoldObserver for Progressing {
    fn waiting(&self, approval_id: Uuid, waited: Duration) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Some(progress) = &self.0 {
                progress
                    .progress(
                        waited.as_secs_f64(),
                        format!("waiting for approval {approval_id}"),
                    )
                    .await;
            }
        })
    }
}

/// What a call's answer is for a client that was not held: a task to a
/// client of the tasks extension, the console's page to one that opens
/// URLs, else the hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HeldAs {
    Hold,
    Task,
    Page,
}

impl Methods {
    async fn initialize(&self, context: FrontContext) -> Result<(), FrontError> {
        let front_request = front_request(&context)?;
        let caller = &front_request.caller;
        let Some((opening, abandoned)) = self.front.open.admit(
            &caller.credential,
            self.front.parts.settings.sessions_per_credential,
        ) else {
            return Err(error(
                TOO_MANY_SESSIONS,
                "this credential holds its most open sessions on this node, all in recent use; end one (DELETE) first",
            ));
        };
        if let Some(abandoned) = abandoned {
            let ended = self
                .front
                .parts
                .sessions
                .end(
                    abandoned,
                    &caller.tenant_id,
                    &caller.principal,
                    &caller.agent,
                )
                .await;
            if let Err(error) = ended {
                tracing::warn!(error = %error, "an abandoned front door session was not ended in the store");
            }
            tracing::info!(session_id = %abandoned, credential = %caller.credential, "an abandoned front door session made room");
        }
        let session_id = Uuid::new_v4();
        self.front
            .parts
            .sessions
            .open(caller.session_request(session_id))
            .await
            .map_err(|failure| match failure {
                SessionError::ServersUnavailable => error(
                    SERVERS_UNAVAILABLE,
                    "a tool server did not answer; initialize again",
                ),
                other => {
                    tracing::warn!(error = %other, "a front door session could not be opened");
                    FrontError::internal("the session could not be opened; initialize again")
                }
            })?;
        opening.fill(session_id);
        let _ = front_request.opened.set(session_id);
        tracing::info!(%session_id, credential = %caller.credential, "front door session opened");
        Ok(())
    }

    async fn list_tools(&self, context: FrontContext) -> Result<Value, FrontError> {
        let session = session_of(&front_request(&context)?)?;
        let mut tools: Vec<&crate::pipeline::PinnedTool> = session.pinned.advertised().collect();
        tools.sort_by(|a, b| a.wire_name.cmp(&b.wire_name));
        let tools: Vec<Value> = tools.into_iter().map(render::tool).collect();
        let mut result = json!({"tools": tools, "_meta": {
            render::META_TOOL_SCHEMA: session.pinned.tool_schema_sha256()}});
        render::listed(&mut result, context.stateless);
        Ok(result)
    }

    /// How a held call is given to this request's client.
    fn held_as(&self, context: &FrontContext) -> HeldAs {
        if !context.stateless {
            return HeldAs::Hold;
        }
        let declared = |pointer: &str| {
            context
                .client_capabilities
                .as_ref()
                .and_then(|capabilities| capabilities.pointer(pointer))
                .is_some_and(|declared| !declared.is_null())
        };
        if declared("/extensions/io.modelcontextprotocol~1tasks") {
            HeldAs::Task
        } else if declared("/elicitation/url") && self.front.parts.settings.approval_pages.is_some()
        {
            HeldAs::Page
        } else {
            HeldAs::Hold
        }
    }

    async fn call_tool(&self, params: Value, context: FrontContext) -> Result<Value, FrontError> {
        let front_request = front_request(&context)?;
        let session = session_of(&front_request)?;
        let (mut identity, request_id) = identity_of(
            &context,
            &session,
            front_request.stateless,
            self.front.parts.clock.now(),
        )?;
        let caller = &front_request.caller;
        let origin_trust = identity.origin_trust.map_or(caller.origin_trust, |stated| {
            stated.min(caller.origin_trust)
        });
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| FrontError::invalid_params("a call names its tool"))?
            .to_owned();
        let arguments = match params.get("arguments") {
            None | Some(Value::Null) => json!({}),
            Some(arguments) => arguments.clone(),
        };
        // A held call is given to a client of the tasks extension as a
        // task, to one that opens URLs as the console's page for its
        // approval; either way the request is not held.
        let held_as = self.held_as(&context);
        // The retry of a call whose user was sent to approve it: its state
        // names the held row, which must be this caller's same call.
        let mut holds = held_as == HeldAs::Hold;
        let mut declined = false;
        // Back from a consent page: nothing was recorded, so the call is
        // asked as any other.
        if held_as == HeldAs::Page
            && let Some(state) = params.get("requestState").and_then(Value::as_str)
            && state != render::CONSENT_STATE
        {
            identity = self
                .front
                .held_identity(&session, state, &name, &arguments)
                .await?;
            let action = params
                .pointer("/inputResponses/approval/action")
                .and_then(Value::as_str);
            // Back from the page: the decision is most likely in, so the
            // call waits for it as a held request would.
            holds = action == Some("accept");
            declined = !holds;
        }
        let answer = self
            .front
            .admitted_call(
                &session,
                &front_request,
                Asked {
                    identity,
                    request_id,
                    origin_trust,
                    name,
                    arguments,
                    holds,
                },
                &context,
            )
            .await?;
        match answer {
            Answer::Result(result) if held_as == HeldAs::Task && render::is_pending(&result) => {
                let now = self.front.parts.clock.now();
                let invocation = render::invocation_of(&result)
                    .map(|id| id.to_string())
                    .unwrap_or_default();
                let mut task = task_of(
                    &invocation,
                    "working",
                    Some(working_message(&result)),
                    now,
                    now,
                );
                task["resultType"] = json!("task");
                Ok(task)
            }
            Answer::Result(result)
                if held_as == HeldAs::Page && !declined && render::is_pending(&result) =>
            {
                let pages = self
                    .front
                    .parts
                    .settings
                    .approval_pages
                    .as_deref()
                    .unwrap_or_default();
                Ok(render::approval_elicitation(
                    &result,
                    &session.tenant_id,
                    pages,
                ))
            }
            Answer::Result(result)
                if held_as == HeldAs::Page && render::consent_of(&result).is_some() =>
            {
                Ok(render::consent_elicitation(&result))
            }
            Answer::Result(mut result) => {
                render::completed(&mut result, context.stateless);
                Ok(result)
            }
            Answer::Refused(refused) => Err(refused),
            Answer::Withdrawn => Err(error(REQUEST_CANCELLED, "the request was cancelled")),
        }
    }

    /// A held call's task, by its row's id: the call asked again under its
    /// own identity (the pipeline answers its state or, once approved, runs
    /// it, once), so any node answers it. Only its own principal's.
    async fn get_task(&self, task_id: String, context: FrontContext) -> Result<Value, FrontError> {
        let front_request = front_request(&context)?;
        let session = session_of(&front_request)?;
        let unknown = || FrontError::invalid_params("no task has this id");
        let invocation_id = task_id.parse::<Uuid>().map_err(|_| unknown())?;
        let row = self
            .front
            .parts
            .invocations
            .invocation(&session.tenant_id, invocation_id)
            .await
            .map_err(|_| FrontError::internal("the task could not be read; retry"))?
            .filter(|row| row.identity.principal.id == session.principal.id)
            .ok_or_else(unknown)?;
        let answer = self
            .front
            .admitted_call(
                &session,
                &front_request,
                Asked {
                    identity: CallIdentity {
                        run_id: row.identity.run_id,
                        step_number: row.identity.step_number,
                        call_id: row.identity.call_id.clone(),
                        named: true,
                        origin_trust: Some(row.identity.origin_trust),
                    },
                    request_id: json!(format!("task:{invocation_id}")),
                    origin_trust: row.identity.origin_trust,
                    name: row.identity.tool_name.clone(),
                    arguments: row.identity.arguments.clone(),
                    holds: false,
                },
                &context,
            )
            .await?;
        let now = self.front.parts.clock.now();
        let id = invocation_id.to_string();
        let mut task = match answer {
            Answer::Result(result)
                if render::is_pending(&result) || render::is_in_progress(&result) =>
            {
                task_of(
                    &id,
                    "working",
                    Some(working_message(&result)),
                    row.created_at,
                    now,
                )
            }
            Answer::Result(mut result) => {
                render::completed(&mut result, true);
                let mut task = task_of(&id, "completed", None, row.created_at, now);
                task["result"] = result;
                task
            }
            Answer::Refused(refused) => return Err(refused),
            Answer::Withdrawn => {
                return Err(error(REQUEST_CANCELLED, "the request was cancelled"));
            }
        };
        task["resultType"] = json!("complete");
        Ok(task)
    }

    async fn list_prompts(&self, context: FrontContext) -> Result<Value, FrontError> {
        let session = session_of(&front_request(&context)?)?;
        let prompts: Vec<Value> = session
            .pinned
            .skills()
            .iter()
            .map(|skill| {
                json!({
                    "name": skill.metadata.name,
                    "description": skill.metadata.description,
                    "_meta": {"toolgate/version": skill.metadata.version,
                              "toolgate/server_id": skill.metadata.server_id},
                })
            })
            .collect();
        let mut result = json!({"prompts": prompts});
        render::listed(&mut result, context.stateless);
        Ok(result)
    }

    /// A skill's content, loaded through `skill.load` like any call: the
    /// load is recorded and its text reaches the client as the pipeline
    /// renders it.
    async fn get_prompt(&self, params: Value, context: FrontContext) -> Result<Value, FrontError> {
        let front_request = front_request(&context)?;
        let session = session_of(&front_request)?;
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let Some(skill) = session
            .pinned
            .skills()
            .iter()
            .find(|skill| skill.metadata.name == name)
        else {
            return Err(FrontError::invalid_params("no prompt has this name"));
        };
        let description = skill.metadata.description.clone();
        let (identity, request_id) = identity_of(
            &context,
            &session,
            front_request.stateless,
            self.front.parts.clock.now(),
        )?;
        let mut arguments = json!({"name": name});
        if let Some(given) = params.get("arguments").filter(|given| given.is_object()) {
            arguments["arguments"] = given.clone();
        }
        let answer = self
            .front
            .admitted_call(
                &session,
                &front_request,
                Asked {
                    identity,
                    request_id,
                    origin_trust: front_request.caller.origin_trust,
                    name: SKILL_LOAD.to_owned(),
                    arguments,
                    holds: true,
                },
                &context,
            )
            .await?;
        let result = match answer {
            Answer::Result(result) => result,
            Answer::Refused(refused) => return Err(refused),
            Answer::Withdrawn => {
                return Err(error(REQUEST_CANCELLED, "the request was cancelled"));
            }
        };
        if result["isError"] == true {
            let message = result
                .pointer("/content/0/text")
                .and_then(Value::as_str)
                .unwrap_or("the skill could not be loaded")
                .to_owned();
            return Err(FrontError::invalid_params(message));
        }
        let text: Vec<&str> = result["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|block| block["text"].as_str())
            .collect();
        let mut prompt = json!({
            "description": description,
            "messages": [{"role": "user", "content": {"type": "text", "text": text.join("\n")}}],
        });
        render::completed(&mut prompt, context.stateless);
        Ok(prompt)
    }
}

impl FrontMethods for Methods {
    fn info(&self) -> Value {
        info()
    }

    fn initialize(&self, context: FrontContext) -> BoxFuture<'_, Result<(), FrontError>> {
        Box::pin(Methods::initialize(self, context))
    }

    fn list_tools(&self, context: FrontContext) -> BoxFuture<'_, Result<Value, FrontError>> {
        Box::pin(Methods::list_tools(self, context))
    }

    fn call_tool(
        &self,
        params: Value,
        context: FrontContext,
    ) -> BoxFuture<'_, Result<Value, FrontError>> {
        Box::pin(Methods::call_tool(self, params, context))
    }

    fn list_prompts(&self, context: FrontContext) -> BoxFuture<'_, Result<Value, FrontError>> {
        Box::pin(Methods::list_prompts(self, context))
    }

    fn list_resources(&self, templates: bool, context: FrontContext) -> Value {
        let key = if templates {
            "resourceTemplates"
        } else {
            "resources"
        };
        let mut result = json!({ key: [] });
        render::listed(&mut result, context.stateless);
        result
    }

    fn get_prompt(
        &self,
        params: Value,
        context: FrontContext,
    ) -> BoxFuture<'_, Result<Value, FrontError>> {
        Box::pin(Methods::get_prompt(self, params, context))
    }

    fn get_task(
        &self,
        task_id: String,
        context: FrontContext,
    ) -> BoxFuture<'_, Result<Value, FrontError>> {
        Box::pin(Methods::get_task(self, task_id, context))
    }

    /// A held call ends by its approval's decision, never by its caller's
    /// word: the approval stays for an approver.
    fn cancel_task(
        &self,
        _task_id: String,
        _context: FrontContext,
    ) -> BoxFuture<'_, Result<(), FrontError>> {
        Box::pin(std::future::ready(Err(FrontError::invalid_request(
            "a call waiting for approval ends by the approver's decision; toolgate does not cancel it for its caller",
        ))))
    }
}
