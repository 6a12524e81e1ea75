//! The MCP methods: `initialize` opens a toolgate session, `tools/list` is
//! its pinned set, `tools/call` is a pipeline call (held while it waits for
//! an approval), `prompts/*` are its skills loaded through `skill.load`.
//! Sampling, roots and elicitation are never asked of the client; nothing
//! is sent but answers and progress.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, CreateTaskResult,
    DetailedTask, ErrorCode, GetPromptRequestParams, GetPromptResponse, GetPromptResult,
    GetTaskParams, GetTaskResult, InitializeRequestParams, InitializeResult, InputRequiredResult,
    ListPromptsResult, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ProgressToken, ProtocolVersion, ServerConfig, Task, TaskPayload, TaskStatus,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Value, json};
use tracing::Instrument as _;
use uuid::Uuid;

use super::reissue::{Attached, Reissue, reissue_key};
use super::render::{self, CallIdentity};
use super::{Busy, Front, FrontRequest, request_key};
use crate::domain::names::SKILL_LOAD;
use crate::domain::{IdempotencyClass, canonicalize};
use crate::pipeline::sessions::{CallPlace, Session, SessionError, SessionRequest};
use crate::pipeline::{CallOutcome, CallRequest, CallerTerms};
use crate::ports::PlatformEvent;

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

/// One request's handler (rmcp makes one per request).
pub(crate) struct FrontHandler {
    front: Arc<Front>,
}

impl FrontHandler {
    pub(super) fn new(front: Arc<Front>) -> Self {
        FrontHandler { front }
    }
}

/// What the listener resolved for the request.
fn front_request(context: &RequestContext<RoleServer>) -> Result<FrontRequest, McpError> {
    context
        .extensions
        .get::<hyper::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<FrontRequest>())
        .cloned()
        .ok_or_else(|| McpError::internal_error("the request was not authenticated", None))
}

/// Whether the request is of a revision without sessions (2026-07-28 on),
/// whose results carry what such a client reads.
fn stateless_request(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|version| !version.has_initialize())
}

/// The task a held call is to a client of the tasks extension: its row's
/// id, working, with how often to ask.
fn held_task(
    result: &Value,
    created_at: chrono::DateTime<chrono::Utc>,
    now: chrono::DateTime<chrono::Utc>,
) -> Task {
    let invocation_id = render::invocation_of(result)
        .map(|id| id.to_string())
        .unwrap_or_default();
    let message = result
        .pointer("/structuredContent/approval_id")
        .and_then(Value::as_str)
        .map_or_else(
            || "the call is running".to_owned(),
            |approval| format!("waiting for approval {approval}"),
        );
    Task::new(
        invocation_id,
        TaskStatus::Working,
        created_at.to_rfc3339(),
        now.to_rfc3339(),
    )
    .with_status_message(message)
    .with_poll_interval_ms(TASK_POLL_MS)
}

fn session_of(request: &FrontRequest) -> Result<Arc<Session>, McpError> {
    request
        .session
        .clone()
        .ok_or_else(|| McpError::invalid_request("initialize a session first", None))
}

fn from_json<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, McpError> {
    serde_json::from_value(value)
        .map_err(|_| McpError::internal_error("the answer could not be written", None))
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
    Withdrawn,
}

impl Front {
    /// One call: the pipeline, and while it waits for an approval, the hold
    /// (with progress when the client asked for it).
    async fn run_call(
        &self,
        call: CallRequest,
        holds: bool,
        progress: Option<ProgressToken>,
        peer: Peer<RoleServer>,
    ) -> Answer {
        let pipeline = &self.parts.pipeline;
        let withdrawn = call.caller.withdrawn.clone().unwrap_or_default();
        let mut outcome = pipeline.call(call.clone()).await;
        let started = tokio::time::Instant::now();
        let hold = if holds {
            self.parts.settings.approval_hold
        } else {
            std::time::Duration::ZERO
        };
        let held_until = started + hold;
        while let CallOutcome::Pending {
            invocation_id,
            approval_id,
        } = outcome
        {
            if !holds {
                return Answer::Result(render::pending(invocation_id, approval_id));
            }
            let hold = held_until.saturating_duration_since(tokio::time::Instant::now());
            self.parts
                .approvals
                .record_hold(&call.tenant_id, approval_id, None, hold)
                .await;
            let decided = loop {
                if let Some(token) = &progress {
                    let note = ProgressNotificationParam::new(
                        token.clone(),
                        started.elapsed().as_secs_f64(),
                    )
                    .with_message(format!("waiting for approval {approval_id}"));
                    let _ = peer.notify_progress(note).await;
                }
                let until = held_until.min(tokio::time::Instant::now() + PROGRESS_EVERY);
                tokio::select! {
                    decided = self.parts.approvals.wait_decided(&call.tenant_id, approval_id, until) => {
                        if decided {
                            break true;
                        }
                        if tokio::time::Instant::now() >= held_until {
                            break false;
                        }
                    }
                    // The hold ends; the approval and its row stay, and the
                    // same call asked again resumes them.
                    _ = withdrawn.cancelled() => return Answer::Withdrawn,
                }
            };
            if !decided {
                return Answer::Result(render::pending(invocation_id, approval_id));
            }
            outcome = pipeline.call(call.clone()).await;
        }
        match outcome {
            CallOutcome::Finished(finished) => Answer::Result(render::finished(&finished)),
            CallOutcome::Suspended {
                invocation_id,
                kind,
                reference,
            } => Answer::Result(render::suspended(invocation_id, &kind, &reference)),
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
        context: &RequestContext<RoleServer>,
    ) -> Result<Answer, McpError> {
        let Asked {
            mut identity,
            request_id,
            origin_trust,
            name,
            arguments,
            holds,
        } = asked;
        let delivery = front_request.delivery.clone();
        let attached = if identity.named {
            None
        } else {
            self.place_unnamed(session, identity.clone(), &name, &arguments)
        };
        if let Some(attached) = &attached {
            delivery.attach(self.reissues.clone(), attached);
            identity = attached.identity.clone();
        }
        let key = request_key(&request_id);
        let slot = loop {
            match self.calls.admit(
                session.session_id,
                key.clone(),
                self.parts.settings.session_in_flight,
                &delivery.closed,
            ) {
                Ok(slot) => break slot,
                Err(Busy::Full) => {
                    return Err(McpError::new(
                        ErrorCode(TOO_MANY_CALLS),
                        "this session has its most calls in flight; wait for one to end",
                        None,
                    ));
                }
                Err(Busy::Running(mut done)) => {
                    let _ = done.wait_for(|done| *done).await;
                }
            }
        };
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
        };
        let progress = context.meta.get_progress_token();
        let peer = context.peer.clone();
        let front = self.clone();
        let counted = self.parts.in_flight.enter();
        let tenant_id = session.tenant_id.clone();
        let session_id = session.session_id;
        let run_id = identity.run_id;
        let span = self.call_span(context);
        tokio::spawn(
            async move {
                // One run of a call on this node at a time: a re-issue waits
                // for its twin's and then reads what it recorded.
                let turn = match &attached {
                    Some(attached) => Some(front.reissues.take_turn(attached).await),
                    None => None,
                };
                let mut answer = front.run_call(call, holds, progress, peer).await;
                drop(turn);
                drop(slot);
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
        )
        .await
        .map_err(|_| McpError::internal_error("the call did not complete", None))
    }

    /// A call's span: the child of the caller's trace when the request
    /// named one, in its `_meta` (2026-07-28) or its headers.
    fn call_span(&self, context: &RequestContext<RoleServer>) -> tracing::Span {
        let span = tracing::info_span!("front.call");
        let headers = context
            .extensions
            .get::<hyper::http::request::Parts>()
            .map(|parts| &parts.headers);
        let header = |name: &str| {
            headers
                .and_then(|headers| headers.get(name))
                .and_then(|value| value.to_str().ok())
        };
        let (traceparent, tracestate) = match context.meta.get_traceparent() {
            Some(traceparent) => (Some(traceparent), context.meta.get_tracestate()),
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
    ) -> Result<CallIdentity, McpError> {
        let refused = || {
            McpError::invalid_params(
                "requestState does not name a held call of this caller with these arguments",
                None,
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
            .map_err(|_| McpError::internal_error("the held call could not be read; retry", None))?
            .filter(|row| {
                row.principal.id == session.principal.id
                    && row.tool_name == tool.tool.spec.name
                    && row.arguments_hash == hash
            })
            .ok_or_else(refused)?;
        Ok(CallIdentity {
            run_id: row.run_id,
            step_number: row.step_number,
            call_id: row.call_id,
            named: true,
            origin_trust: Some(row.origin_trust),
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
    context: &RequestContext<RoleServer>,
    session: &Session,
    stateless: bool,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(CallIdentity, Value), McpError> {
    let meta = serde_json::to_value(&context.meta).unwrap_or(Value::Null);
    if let Some(listed) = meta.get(render::META_TOOL_SCHEMA).and_then(Value::as_str)
        && listed != session.pinned.tool_schema_sha256()
    {
        return Err(McpError::invalid_params(
            "the tools changed since they were listed (toolgate/tool_schema_sha256); list them again",
            None,
        ));
    }
    let request_id = if stateless {
        json!(format!("r:{}", Uuid::new_v4().simple()))
    } else {
        serde_json::to_value(&context.id).unwrap_or(Value::Null)
    };
    let mut identity = render::identity(&meta, &request_id, session.session_id)
        .map_err(|message| McpError::invalid_params(message, None))?;
    if !identity.named {
        identity.run_id = render::unnamed_run(session.session_id, now);
    }
    Ok((identity, request_id))
}

impl ServerHandler for FrontHandler {
    fn get_info(&self) -> ServerConfig {
        serde_json::from_value(json!({
            "protocolVersion": ProtocolVersion::V_2025_11_25,
            "capabilities": {"tools": {"listChanged": false}, "prompts": {"listChanged": false},
                             "extensions": {"io.modelcontextprotocol/tasks": {}}},
            "serverInfo": {"name": "toolgate", "version": env!("CARGO_PKG_VERSION")},
            "instructions": "Every call through toolgate is recorded before it runs. A result marked uncertain means the effect may have happened: do not repeat that call.",
        }))
        .unwrap_or_else(|_| InitializeResult::new(Default::default()))
    }

    // Every revision: those with sessions through `initialize` (offered
    // 2025-11-25 at most, `get_info`'s), 2026-07-28 per request.
    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2026_07_28))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        let front_request = front_request(&context)?;
        let caller = &front_request.caller;
        let Some((opening, abandoned)) = self.front.open.admit(
            &caller.credential,
            self.front.parts.settings.sessions_per_credential,
        ) else {
            return Err(McpError::new(
                ErrorCode(TOO_MANY_SESSIONS),
                "this credential holds its most open sessions on this node, all in recent use; end one (DELETE) first",
                None,
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
            .open(SessionRequest {
                session_id,
                tenant_id: caller.tenant_id.clone(),
                principal: caller.principal.clone(),
                agent: caller.agent.clone(),
            })
            .await
            .map_err(|error| match error {
                SessionError::ServersUnavailable => McpError::new(
                    ErrorCode(SERVERS_UNAVAILABLE),
                    "a tool server did not answer; initialize again",
                    None,
                ),
                other => {
                    tracing::warn!(error = %other, "a front door session could not be opened");
                    McpError::internal_error(
                        "the session could not be opened; initialize again",
                        None,
                    )
                }
            })?;
        opening.fill(session_id);
        let _ = front_request.opened.set(session_id);
        tracing::info!(%session_id, credential = %caller.credential, "front door session opened");
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let session = session_of(&front_request(&context)?)?;
        let mut tools: Vec<&crate::pipeline::PinnedTool> = session.pinned.advertised().collect();
        tools.sort_by(|a, b| a.wire_name.cmp(&b.wire_name));
        let tools: Vec<Value> = tools.into_iter().map(render::tool).collect();
        let mut result = json!({"tools": tools, "_meta": {
            render::META_TOOL_SCHEMA: session.pinned.tool_schema_sha256()}});
        render::listed(&mut result, stateless_request(&context));
        from_json(result)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
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
        let name = request.name.into_owned();
        let arguments = request
            .arguments
            .map(Value::Object)
            .unwrap_or_else(|| json!({}));
        // A held call is given to a client of the tasks extension as a
        // task, to one that opens URLs as the console's page for its
        // approval; either way the request is not held.
        let stateless = stateless_request(&context);
        let capabilities = context.client_capabilities();
        let as_task = stateless
            && capabilities
                .as_ref()
                .is_some_and(|capabilities| capabilities.supports_tasks());
        let pages = self.front.parts.settings.approval_pages.as_deref();
        let elicits = stateless
            && !as_task
            && pages.is_some()
            && capabilities
                .as_ref()
                .and_then(|capabilities| capabilities.elicitation.as_ref())
                .is_some_and(|elicitation| elicitation.url.is_some());
        // The retry of a call whose user was sent to approve it: its state
        // names the held row, which must be this caller's same call.
        let mut holds = !(as_task || elicits);
        let mut declined = false;
        if elicits && let Some(state) = &request.request_state {
            identity = self
                .front
                .held_identity(&session, state, &name, &arguments)
                .await?;
            let action = request
                .input_responses
                .as_ref()
                .and_then(|responses| serde_json::to_value(responses).ok())
                .and_then(|responses| {
                    responses
                        .pointer("/approval/action")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                });
            // Back from the page: the decision is most likely in, so the
            // call waits for it as a held request would.
            holds = action.as_deref() == Some("accept");
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
            Answer::Result(result) if as_task && render::is_pending(&result) => {
                let now = self.front.parts.clock.now();
                Ok(CreateTaskResult::new(held_task(&result, now, now)).into())
            }
            Answer::Result(result) if elicits && !declined && render::is_pending(&result) => {
                let page = pages.unwrap_or_default();
                Ok(
                    from_json::<InputRequiredResult>(render::approval_elicitation(
                        &result,
                        &session.tenant_id,
                        page,
                    ))?
                    .into(),
                )
            }
            Answer::Result(mut result) => {
                render::completed(&mut result, stateless);
                Ok(from_json::<CallToolResult>(result)?.into())
            }
            Answer::Withdrawn => Err(McpError::new(
                ErrorCode(REQUEST_CANCELLED),
                "the request was cancelled",
                None,
            )),
        }
    }

    /// A held call's task, by its row's id: the call asked again under its
    /// own identity (the pipeline answers its state or, once approved, runs
    /// it, once), so any node answers it. Only its own principal's.
    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let front_request = front_request(&context)?;
        let session = session_of(&front_request)?;
        let unknown = || McpError::invalid_params("no task has this id", None);
        let invocation_id = request.task_id.parse::<Uuid>().map_err(|_| unknown())?;
        let row = self
            .front
            .parts
            .invocations
            .invocation(&session.tenant_id, invocation_id)
            .await
            .map_err(|_| McpError::internal_error("the task could not be read; retry", None))?
            .filter(|row| row.principal.id == session.principal.id)
            .ok_or_else(unknown)?;
        let answer = self
            .front
            .admitted_call(
                &session,
                &front_request,
                Asked {
                    identity: CallIdentity {
                        run_id: row.run_id,
                        step_number: row.step_number,
                        call_id: row.call_id.clone(),
                        named: true,
                        origin_trust: Some(row.origin_trust),
                    },
                    request_id: json!(format!("task:{invocation_id}")),
                    origin_trust: row.origin_trust,
                    name: row.tool_name.clone(),
                    arguments: row.arguments.clone(),
                    holds: false,
                },
                &context,
            )
            .await?;
        let now = self.front.parts.clock.now();
        let task = match answer {
            Answer::Result(result)
                if render::is_pending(&result) || render::is_in_progress(&result) =>
            {
                let mut working = held_task(&result, row.created_at, now);
                working.task_id = invocation_id.to_string();
                DetailedTask::new(working, TaskPayload::Working)
            }
            Answer::Result(mut result) => {
                render::completed(&mut result, true);
                let Value::Object(result) = result else {
                    return Err(McpError::internal_error(
                        "the answer could not be written",
                        None,
                    ));
                };
                DetailedTask::new(
                    Task::new(
                        invocation_id.to_string(),
                        TaskStatus::Completed,
                        row.created_at.to_rfc3339(),
                        now.to_rfc3339(),
                    ),
                    TaskPayload::Completed { result },
                )
            }
            Answer::Withdrawn => {
                return Err(McpError::new(
                    ErrorCode(REQUEST_CANCELLED),
                    "the request was cancelled",
                    None,
                ));
            }
        };
        Ok(GetTaskResult::new(task))
    }

    /// A held call ends by its approval's decision, never by its caller's
    /// word: the approval stays for an approver.
    async fn cancel_task(
        &self,
        _request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        Err(McpError::invalid_request(
            "a call waiting for approval ends by the approver's decision; toolgate does not cancel it for its caller",
            None,
        ))
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
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
        render::listed(&mut result, stateless_request(&context));
        from_json(result)
    }

    /// A skill's content, loaded through `skill.load` like any call: the
    /// load is recorded and its text reaches the client as the pipeline
    /// renders it.
    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let front_request = front_request(&context)?;
        let session = session_of(&front_request)?;
        let Some(skill) = session
            .pinned
            .skills()
            .iter()
            .find(|skill| skill.metadata.name == request.name)
        else {
            return Err(McpError::invalid_params("no prompt has this name", None));
        };
        let description = skill.metadata.description.clone();
        let (identity, request_id) = identity_of(
            &context,
            &session,
            front_request.stateless,
            self.front.parts.clock.now(),
        )?;
        let mut arguments = json!({"name": request.name});
        if let Some(given) = request.arguments {
            arguments["arguments"] = Value::Object(given);
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
        let Answer::Result(result) = answer else {
            return Err(McpError::new(
                ErrorCode(REQUEST_CANCELLED),
                "the request was cancelled",
                None,
            ));
        };
        if result["isError"] == true {
            let message = result
                .pointer("/content/0/text")
                .and_then(Value::as_str)
                .unwrap_or("the skill could not be loaded")
                .to_owned();
            return Err(McpError::invalid_params(message, None));
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
        render::completed(&mut prompt, stateless_request(&context));
        let prompt: GetPromptResult = from_json(prompt)?;
        Ok(GetPromptResponse::Complete(prompt))
    }
}
