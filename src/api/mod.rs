//! The control API (ARCHITECTURE.md §2.1) and the HTTP side of the bridge
//! (§2.2), on unix sockets (and the control API optionally on loopback TCP
//! with a bearer token). Every call either surface takes re-enters the
//! one pipeline at step 1; nothing here judges a call.
//!
//! Requests are size-limited and strictly parsed (unknown fields refused);
//! every error is `{"error": {"code", "message"}}` and no message echoes a
//! value from the request or text from a remote.

pub mod client;
mod wire;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::Utc;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::bridge::{Refusal, Turn, TurnBinding, Turns, call_id, constant_time_eq};
use crate::domain::egress::EgressAllowlist;
use crate::domain::mcp_server::{
    AuthFields, AuthScheme, Transport, validate_auth, validate_classification,
};
use crate::domain::{
    AgentSpec, ApprovalStatus, ArgumentTrust, IdempotencyClass, PolicyProfile, Principal,
    ReasonCode, RuntimeEnvironment, SecretValue, SideEffectClass, TargetKind, ToolOutcome,
    sha256_hex, valid_tenant_id,
};
use crate::pipeline::executor::{Completion, TOOL_CALL};
use crate::pipeline::{
    CallOutcome, CallRequest, Finished, PinnedToolSet, Pipeline, ToolRegistry, prepare_mcp,
};
use crate::ports::metrics::Metrics;
use crate::ports::{
    Clock, InvocationRecord, McpServerRow, McpServers, PlatformEvent, ReviewRecord, SessionRecord,
    Store, StoreError,
};

use wire::{
    ApprovalDecision, BridgeCall, CallsRequest, CompleteSuspended, OpenSession, OpenTurn,
    PutMcpServer, ReviewDecision, ServerAuth, error_body, invocation_view, rendered_content,
    server_view,
};

/// What the API is configured with.
#[derive(Debug, Clone)]
pub struct ApiSettings {
    /// Largest request body accepted.
    pub body_limit: usize,
    /// How long a script's call waits for an approval.
    pub approval_hold: Duration,
    /// Calls per turn, denied calls included.
    pub turn_call_cap: u32,
    /// How long a turn's token lives.
    pub turn_lifetime: Duration,
    /// Calls of one parallel batch run at once.
    pub batch_concurrency: usize,
    /// How long a drain waits for in-flight requests.
    pub drain_timeout: Duration,
    /// Where tenant HTTP servers (and their token endpoints) may be dialled.
    pub egress: EgressAllowlist,
    /// Operator servers' ids, which a tenant server may not take.
    pub operator_servers: Vec<String>,
}

impl Default for ApiSettings {
    fn default() -> Self {
        ApiSettings {
            body_limit: 1 << 20,
            approval_hold: Duration::from_secs(300),
            turn_call_cap: 64,
            turn_lifetime: Duration::from_secs(3600),
            batch_concurrency: 8,
            drain_timeout: Duration::from_secs(30),
            egress: EgressAllowlist::default(),
            operator_servers: Vec::new(),
        }
    }
}

/// A session: what its calls resolve against and act as.
struct Session {
    /// When a call, turn or tool listing last used it.
    last_used: Mutex<std::time::Instant>,
    /// When this node last refreshed the store's `last_used_at`.
    touched: Mutex<std::time::Instant>,
    tenant_id: String,
    principal: crate::domain::Principal,
    agent: crate::domain::AgentSpec,
    pinned: Arc<PinnedToolSet>,
}

/// What `/metrics` exposes beside the registry: requests being served.
#[derive(Default)]
struct Gauges {
    requests_in_flight: AtomicU64,
}

/// The control API's state: the parts it drives and the sessions and turns
/// it opened.
pub struct ControlApi {
    pipeline: Arc<Pipeline>,
    registry: Arc<ToolRegistry>,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    mcp: Arc<dyn McpServers>,
    turns: Turns,
    turn_servers: Mutex<HashMap<Uuid, CancellationToken>>,
    sessions: Mutex<HashMap<Uuid, Arc<Session>>>,
    settings: ApiSettings,
    draining: AtomicBool,
    idle: tokio::sync::Notify,
    gauges: Gauges,
    metrics: Arc<Metrics>,
}

/// The parts a control API is built from.
pub struct ApiParts {
    /// The one pipeline.
    pub pipeline: Arc<Pipeline>,
    /// The registry sessions pin from.
    pub registry: Arc<ToolRegistry>,
    /// The durable record.
    pub store: Arc<dyn Store>,
    /// The clock.
    pub clock: Arc<dyn Clock>,
    /// The configured MCP servers.
    pub mcp: Arc<dyn McpServers>,
    /// The turns' folder manager.
    pub turns: Turns,
    /// Limits.
    pub settings: ApiSettings,
    /// The registry `/metrics` renders (the pipeline's store and the MCP
    /// adapter count into it).
    pub metrics: Arc<Metrics>,
}

type Reply = Response<UnsyncBoxBody<Bytes, Infallible>>;

/// A response body fed, frame by frame, from a channel: the followed event
/// stream. It ends when the sender is dropped.
struct Channel(tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for Channel {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|bytes| Ok(hyper::body::Frame::data(bytes))))
    }
}

/// Whether a pinned set is the one a session recorded: both hashes, neither
/// empty (a hash that could not be taken matches nothing).
fn same_tools(recorded: &SessionRecord, pinned: &PinnedToolSet) -> bool {
    !pinned.tool_schema_sha256().is_empty()
        && !pinned.tool_contract_sha256().is_empty()
        && recorded.tool_schema_sha256 == pinned.tool_schema_sha256()
        && recorded.tool_contract_sha256 == pinned.tool_contract_sha256()
}

/// The pause after a failed accept.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// A session unused this long has ended: it leaves memory and the store.
const SESSION_IDLE: Duration = Duration::from_secs(24 * 3600);
/// How often a session in use refreshes its `last_used_at` in the store.
const SESSION_TOUCH: Duration = Duration::from_secs(3600);

/// How often a followed event stream looks for new events.
const FOLLOW_POLL: Duration = Duration::from_millis(250);

/// How often expired turns are swept.
const TURN_SWEEP: Duration = Duration::from_secs(30);

fn reply(status: StatusCode, body: &Value) -> Reply {
    reply_text(status, body.to_string())
}

fn reply_text(status: StatusCode, body: String) -> Reply {
    let mut response = Response::new(Full::new(Bytes::from(body)).boxed_unsync());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn error(status: StatusCode, code: &str, message: &str) -> Reply {
    reply(status, &error_body(code, message))
}

fn not_found() -> Reply {
    error(StatusCode::NOT_FOUND, "not_found", "no such resource")
}

/// A request the API refuses before doing anything.
struct Refused(Box<Reply>);

impl Refused {
    fn new(reply: Reply) -> Self {
        Refused(Box::new(reply))
    }
}

/// Where a call sits: its session, run, step and batch, and the trust of
/// what proposed it.
struct Place {
    session_id: Uuid,
    run_id: Uuid,
    step_number: i64,
    origin_trust: crate::domain::TrustLevel,
    deadline_at: Option<chrono::DateTime<Utc>>,
    parallel_group: Option<Uuid>,
}

impl ControlApi {
    /// The API over its parts.
    pub fn new(parts: ApiParts) -> Arc<Self> {
        Arc::new(ControlApi {
            pipeline: parts.pipeline,
            registry: parts.registry,
            store: parts.store,
            clock: parts.clock,
            mcp: parts.mcp,
            turns: parts.turns,
            turn_servers: Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashMap::new()),
            settings: parts.settings,
            draining: AtomicBool::new(false),
            idle: tokio::sync::Notify::new(),
            gauges: Gauges::default(),
            metrics: parts.metrics,
        })
    }

    /// Serves the control API on `listener` until `shutdown` fires.
    pub async fn serve_control(
        self: Arc<Self>,
        listener: UnixListener,
        shutdown: CancellationToken,
    ) {
        let mut expiry = tokio::time::interval(TURN_SWEEP);
        loop {
            let stream = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = expiry.tick() => {
                    self.close_expired_turns().await;
                    self.forget_idle_sessions().await;
                    continue;
                }
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(error) => {
                        // Out of descriptors, most likely: back off rather
                        // than spin.
                        tracing::warn!(error = %error, "control accept failed");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                },
            };
            tokio::spawn(self.clone().connection(stream, None));
        }
    }

    /// Serves the control API on a loopback TCP listener, where every
    /// request must carry `token` as a bearer token.
    pub async fn serve_control_tcp(
        self: Arc<Self>,
        listener: tokio::net::TcpListener,
        token: SecretValue,
        shutdown: CancellationToken,
    ) {
        let token = Arc::new(sha256_hex(token.reveal().as_bytes()));
        loop {
            let stream = tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(error) => {
                        // Out of descriptors, most likely: back off rather
                        // than spin.
                        tracing::warn!(error = %error, "control accept failed");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                },
            };
            tokio::spawn(self.clone().connection(stream, Some(token.clone())));
        }
    }

    /// One control connection. With `token_sha256`, a request without the
    /// matching bearer token is refused before it is routed.
    async fn connection<S>(self: Arc<Self>, stream: S, token_sha256: Option<Arc<String>>)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let (api, token_sha256) = (self.clone(), token_sha256.clone());
            async move {
                if let Some(expected) = token_sha256 {
                    let presented = request
                        .headers()
                        .get(AUTHORIZATION)
                        .and_then(|value| value.to_str().ok())
                        .and_then(|value| value.strip_prefix("Bearer "))
                        .map(|token| sha256_hex(token.as_bytes()))
                        .unwrap_or_default();
                    if !constant_time_eq(presented.as_bytes(), expected.as_bytes()) {
                        return Ok::<_, Infallible>(error(
                            StatusCode::UNAUTHORIZED,
                            "unauthorized",
                            "missing or wrong control token",
                        ));
                    }
                }
                let work = {
                    let api = api.clone();
                    async move { api.control(request).await }
                };
                Ok::<_, Infallible>(api.tracked(work).await)
            }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), service)
            .await;
    }

    /// Closes turns past their expiry: their tokens are already dead, and
    /// their sockets go now.
    pub async fn close_expired_turns(&self) {
        let now = self.clock.now();
        let expired: Vec<Uuid> = self
            .turn_servers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .copied()
            .filter(|id| {
                self.turns
                    .get(*id)
                    .is_some_and(|turn| now >= turn.expires_at)
            })
            .collect();
        for id in expired {
            self.end_turn(id).await;
        }
    }

    /// Stops taking new work and waits (up to the drain timeout) for
    /// in-flight requests; then closes every turn.
    pub async fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + self.settings.drain_timeout;
        loop {
            // Registered before the count is read, so the last request's
            // notification cannot fall between the two.
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.gauges.requests_in_flight.load(Ordering::SeqCst) == 0 {
                break;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                break;
            }
        }
        let open: Vec<Uuid> = self
            .turn_servers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .copied()
            .collect();
        for id in open {
            self.end_turn(id).await;
        }
    }

    /// Runs one request's work to its end on a task of its own: a client
    /// that goes away must not cancel a call halfway through the pipeline
    /// (its row would stay RUNNING under a live lease). The in-flight count
    /// is kept by a guard, so it drops however the work ends.
    async fn tracked(self: Arc<Self>, work: impl Future<Output = Reply> + Send + 'static) -> Reply {
        struct InFlight(Arc<ControlApi>);
        impl Drop for InFlight {
            fn drop(&mut self) {
                if self
                    .0
                    .gauges
                    .requests_in_flight
                    .fetch_sub(1, Ordering::SeqCst)
                    == 1
                {
                    self.0.idle.notify_waiters();
                }
            }
        }
        self.gauges
            .requests_in_flight
            .fetch_add(1, Ordering::SeqCst);
        let guard = InFlight(self);
        let task = tokio::spawn(async move {
            let reply = work.await;
            drop(guard);
            reply
        });
        task.await.unwrap_or_else(|_| {
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the request did not complete",
            )
        })
    }

    async fn body<T: serde::de::DeserializeOwned>(
        &self,
        request: Request<Incoming>,
    ) -> Result<T, Refused> {
        let collected = Limited::new(request.into_body(), self.settings.body_limit)
            .collect()
            .await
            .map_err(|_| {
                Refused::new(error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    "the body is over the limit",
                ))
            })?;
        wire::parse(&collected.to_bytes()).map_err(|message| {
            Refused::new(error(StatusCode::BAD_REQUEST, "invalid_request", &message))
        })
    }

    async fn control(self: &Arc<Self>, request: Request<Incoming>) -> Reply {
        let path: Option<Vec<String>> = request
            .uri()
            .path()
            .trim_matches('/')
            .split('/')
            .map(wire::decode)
            .collect();
        let (Some(path), Some(query)) = (path, wire::query(request.uri().query())) else {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "the path or query is not valid percent-encoding",
            );
        };
        let segments: Vec<&str> = path.iter().map(String::as_str).collect();
        let method = request.method().clone();
        let headers = request.headers().clone();
        let mutating = method != Method::GET;
        if mutating && self.draining.load(Ordering::SeqCst) {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "draining",
                "toolgate is shutting down",
            );
        }
        let result = match (method, segments.as_slice()) {
            (Method::GET, ["healthz"]) => Ok(reply(StatusCode::OK, &json!({"status": "ok"}))),
            (Method::GET, ["readyz"]) => Ok(if self.draining.load(Ordering::SeqCst) {
                error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "draining",
                    "toolgate is shutting down",
                )
            } else {
                reply(StatusCode::OK, &json!({"status": "ready"}))
            }),
            (Method::GET, ["metrics"]) => Ok(self.metrics()),
            (Method::POST, ["v1", "sessions"]) => self.open_session(request).await,
            (Method::POST, ["v1", "calls"]) => self.calls(request).await,
            (Method::POST, ["v1", "turns"]) => self.open_turn(request).await,
            (Method::DELETE, ["v1", "turns", id]) => Ok(self.close_turn(id).await),
            (Method::GET, ["v1", "approvals"]) => self.approvals(&query).await,
            (Method::POST, ["v1", "approvals", id]) => self.decide(id, &query, request).await,
            (Method::GET, ["v1", "invocations", id]) => self.invocation(id, &query).await,
            (Method::POST, ["v1", "invocations", id, "complete"]) => {
                self.complete(id, &query, request).await
            }
            (Method::GET, ["v1", "runs", id, "invocations"]) => self.run(id, &query).await,
            (Method::GET, ["v1", "events"]) => self.events(&query, &headers).await,
            (Method::GET, ["v1", "review"]) => self.review_queue(&query).await,
            (Method::PUT, ["v1", "tenants", tenant, "mcp-servers", server]) => {
                self.put_server(tenant, server, request).await
            }
            (Method::GET, ["v1", "tenants", tenant, "mcp-servers", server]) => {
                self.get_server(tenant, server).await
            }
            (Method::DELETE, ["v1", "tenants", tenant, "mcp-servers", server]) => {
                self.delete_server(tenant, server).await
            }
            (Method::POST, ["v1", "review", id]) => self.resolve(id, &query, request).await,
            _ => Ok(not_found()),
        };
        result.unwrap_or_else(|Refused(reply)| *reply)
    }

    fn invalid_tenant() -> Refused {
        Refused::new(error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "tenant_id must be 1 to 128 letters, digits, '-' or '_'",
        ))
    }

    /// The tenant a read or decision names. Only where a tenant's records
    /// begin (a session, a tenant server) is its id held to the rule; here
    /// it is only a bound parameter, and records made before the rule must
    /// stay reachable.
    fn tenant(query: &HashMap<String, String>) -> Result<String, Refused> {
        query.get("tenant_id").cloned().ok_or_else(|| {
            Refused::new(error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "tenant_id is required",
            ))
        })
    }

    /// The tenant a tenant-scoped route names, and the id in its path;
    /// `None` when the id is not one.
    fn tenant_and_id(
        query: &HashMap<String, String>,
        id: &str,
    ) -> Result<Option<(String, Uuid)>, Refused> {
        let tenant = Self::tenant(query)?;
        Ok(id.parse::<Uuid>().ok().map(|id| (tenant, id)))
    }

    /// The client hears only that the store did not answer; the operator's
    /// log says why, as the pipeline's own store failures are logged.
    fn store_failed(failure: StoreError) -> Refused {
        tracing::error!(error = %failure, "the store failed a control API request");
        Refused::new(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            "the store did not answer",
        ))
    }

    /// A session, from memory or else from the store: one opened by another
    /// node on this database, or by this one before a restart, is pinned
    /// again here, and served only if its tool set comes out the same.
    async fn session(&self, id: Uuid) -> Result<Arc<Session>, Refused> {
        let cached = self
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
            .cloned();
        let session = match cached {
            Some(session) => session,
            None => self.reload_session(id).await?,
        };
        *session
            .last_used
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = std::time::Instant::now();
        let stale = {
            let mut touched = session
                .touched
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let stale = touched.elapsed() >= SESSION_TOUCH;
            if stale {
                *touched = std::time::Instant::now();
            }
            stale
        };
        if stale && let Err(failure) = self.store.touch_session(id, self.clock.now()).await {
            tracing::warn!(error = %failure, "a session's last use was not recorded");
        }
        Ok(session)
    }

    /// A session this node does not hold: opened by another node on this
    /// database, or by this one before a restart or before it went idle here.
    /// It is pinned again and served only if its tool set comes out the same.
    async fn reload_session(&self, id: Uuid) -> Result<Arc<Session>, Refused> {
        let unknown = || {
            Refused::new(error(
                StatusCode::NOT_FOUND,
                "unknown_session",
                "no open session has this id",
            ))
        };
        let record = self
            .store
            .session(id)
            .await
            .map_err(Self::store_failed)?
            .ok_or_else(unknown)?;
        let idle = chrono::Duration::from_std(SESSION_IDLE).unwrap_or(chrono::Duration::MAX);
        if record.last_used_at + idle < self.clock.now() {
            return Err(unknown());
        }
        let (pinned, complete) = self
            .pin(&record.tenant_id, &record.principal, &record.agent)
            .await?;
        if !same_tools(&record, &pinned) {
            return Err(Self::unreproduced(complete));
        }
        let session = Arc::new(Session {
            last_used: Mutex::new(std::time::Instant::now()),
            touched: Mutex::new(std::time::Instant::now()),
            tenant_id: record.tenant_id,
            principal: record.principal,
            agent: record.agent,
            pinned,
        });
        // Two requests may reload at once: the first one kept is everyone's.
        Ok(self
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(id)
            .or_insert(session)
            .clone())
    }

    /// Prepares the tenant's MCP servers and pins what the agent may use.
    async fn pin(
        &self,
        tenant_id: &str,
        principal: &Principal,
        agent: &AgentSpec,
    ) -> Result<(Arc<PinnedToolSet>, bool), Refused> {
        let prepared = prepare_mcp(
            &self.registry,
            self.store.as_ref(),
            self.clock.as_ref(),
            tenant_id,
            self.mcp.as_ref(),
        )
        .await
        .map_err(Self::store_failed)?;
        let complete = !prepared
            .events
            .iter()
            .any(|event| matches!(event, PlatformEvent::ServerDisconnected { .. }));
        let environment = RuntimeEnvironment {
            targets: [TargetKind::InProcess, TargetKind::McpServer].into(),
        };
        let pinned = self.registry.specs_for_session(
            agent,
            principal,
            &PolicyProfile::default(),
            &environment,
        );
        Ok((pinned, complete))
    }

    /// A recorded session whose tool set did not come out the same: changed
    /// for good when every server answered, else perhaps only for now.
    fn unreproduced(complete: bool) -> Refused {
        if complete {
            Refused::new(error(
                StatusCode::CONFLICT,
                "session_tools_changed",
                "the tools this session pinned are no longer all offered as they were; open a new session",
            ))
        } else {
            Refused::new(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "tool_servers_unavailable",
                "a tool server this session pinned did not answer; retry",
            ))
        }
    }

    /// Ends the sessions unused for [`SESSION_IDLE`]: from the store, and
    /// from memory unless an open turn names them.
    async fn forget_idle_sessions(&self) {
        let idle = chrono::Duration::from_std(SESSION_IDLE).unwrap_or(chrono::Duration::MAX);
        if let Err(failure) = self.store.forget_sessions(self.clock.now() - idle).await {
            tracing::warn!(error = %failure, "ended sessions were not removed from the store");
        }
        let open: std::collections::HashSet<Uuid> = self
            .turn_servers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .filter_map(|id| self.turns.get(*id))
            .map(|turn| turn.binding.session_id)
            .collect();
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|id, session| {
                open.contains(id)
                    || session
                        .last_used
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .elapsed()
                        < SESSION_IDLE
            });
    }

    async fn open_session(&self, request: Request<Incoming>) -> Result<Reply, Refused> {
        let open: OpenSession = self.body(request).await?;
        if !valid_tenant_id(&open.tenant_id) {
            return Err(Self::invalid_tenant());
        }
        let (pinned, complete) = self
            .pin(&open.tenant_id, &open.principal, &open.agent)
            .await?;
        let now = self.clock.now();
        let record = SessionRecord {
            session_id: open.session_id,
            tenant_id: open.tenant_id.clone(),
            principal: open.principal.clone(),
            agent: open.agent.clone(),
            tool_schema_sha256: pinned.tool_schema_sha256().to_owned(),
            tool_contract_sha256: pinned.tool_contract_sha256().to_owned(),
            opened_at: now,
            last_used_at: now,
        };
        let recorded = self
            .store
            .open_session(&record)
            .await
            .map_err(Self::store_failed)?;
        // Opening a session again is idempotent only as the same session.
        if (&recorded.tenant_id, &recorded.principal, &recorded.agent)
            != (&record.tenant_id, &record.principal, &record.agent)
        {
            return Err(Refused::new(error(
                StatusCode::CONFLICT,
                "session_conflict",
                "this session id is already open for another tenant, principal or agent",
            )));
        }
        if !same_tools(&recorded, &pinned) {
            return Err(Self::unreproduced(complete));
        }
        let tools: Vec<Value> = pinned
            .advertised()
            .map(|pinned| {
                let spec = &pinned.tool.spec;
                json!({
                    "name": spec.name,
                    "wire_name": pinned.wire_name,
                    "description": spec.description,
                    "input_schema": spec.input_schema,
                    "kind": spec.kind,
                    "source": spec.source,
                    "side_effect": spec.side_effect,
                    "risk": spec.risk,
                })
            })
            .collect();
        let body = json!({
            "session_id": open.session_id,
            "tool_schema_sha256": pinned.tool_schema_sha256(),
            "tools": tools,
        });
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                open.session_id,
                Arc::new(Session {
                    last_used: Mutex::new(std::time::Instant::now()),
                    touched: Mutex::new(std::time::Instant::now()),
                    tenant_id: open.tenant_id,
                    principal: open.principal,
                    agent: open.agent,
                    pinned,
                }),
            );
        Ok(reply(StatusCode::OK, &body))
    }

    fn request_for(session: &Session, place: &Place, call: (String, String, Value)) -> CallRequest {
        let (call_id, name, arguments) = call;
        CallRequest {
            tenant_id: session.tenant_id.clone(),
            session_id: place.session_id,
            run_id: place.run_id,
            step_number: place.step_number,
            call_id,
            name,
            arguments,
            principal: session.principal.clone(),
            agent: session.agent.clone(),
            pinned: session.pinned.clone(),
            origin_trust: place.origin_trust,
            argument_trust: ArgumentTrust::default(),
            deadline_at: place.deadline_at,
            parallel_group: place.parallel_group,
            recovering: None,
        }
    }

    /// The document's admission check: a batch runs in parallel only when
    /// every call is a read-only, parallel-safe tool of the pinned set whose
    /// timeout fits the run's remaining budget.
    fn parallel(
        session: &Session,
        calls: &[&wire::CallItem],
        remaining_seconds: Option<f64>,
    ) -> bool {
        calls.len() > 1
            && calls.iter().all(|call| {
                // tool.call is judged as the tool it names.
                let name = if call.name == TOOL_CALL {
                    call.arguments
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                } else {
                    call.name.as_str()
                };
                session.pinned.resolve(name).is_some_and(|pinned| {
                    let spec = &pinned.tool.spec;
                    let fits = remaining_seconds
                        .is_none_or(|remaining| f64::from(spec.timeout_seconds) <= remaining);
                    fits && spec.allow_parallel
                        && spec.idempotency == IdempotencyClass::ReadOnly
                        && matches!(
                            spec.side_effect,
                            SideEffectClass::None
                                | SideEffectClass::WorkspaceRead
                                | SideEffectClass::NetworkRead
                                | SideEffectClass::ExternalRead
                        )
                })
            })
    }

    async fn calls(self: &Arc<Self>, request: Request<Incoming>) -> Result<Reply, Refused> {
        let batch: CallsRequest = self.body(request).await?;
        let session = self.session(batch.session_id).await?;
        let calls: Vec<&wire::CallItem> = batch.calls.iter().collect();
        let remaining = batch
            .deadline_at
            .map(|deadline| (deadline - self.clock.now()).num_milliseconds() as f64 / 1000.0);
        let parallel_group = Self::parallel(&session, &calls, remaining).then(Uuid::new_v4);
        let place = Place {
            session_id: batch.session_id,
            run_id: batch.run_id,
            step_number: batch.step_number,
            origin_trust: batch.origin_trust,
            deadline_at: batch.deadline_at,
            parallel_group,
        };
        let requests: Vec<CallRequest> = batch
            .calls
            .iter()
            .map(|call| {
                Self::request_for(
                    &session,
                    &place,
                    (
                        call.call_id.clone(),
                        call.name.clone(),
                        call.arguments.clone(),
                    ),
                )
            })
            .collect();
        let outcomes = if parallel_group.is_some() {
            let slots = Arc::new(tokio::sync::Semaphore::new(
                self.settings.batch_concurrency.max(1),
            ));
            let tasks: Vec<_> = requests
                .into_iter()
                .map(|request| {
                    let (pipeline, slots) = (self.pipeline.clone(), slots.clone());
                    tokio::spawn(async move {
                        let _slot = slots.acquire_owned().await;
                        pipeline.call(request).await
                    })
                })
                .collect();
            let mut outcomes = Vec::with_capacity(tasks.len());
            for task in tasks {
                match task.await {
                    Ok(outcome) => outcomes.push(outcome),
                    Err(_) => {
                        return Err(Refused::new(error(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "internal",
                            "a call of the batch did not finish",
                        )));
                    }
                }
            }
            outcomes
        } else {
            // A mixed batch runs sequentially, in the order given.
            let mut outcomes = Vec::with_capacity(requests.len());
            for request in requests {
                outcomes.push(self.pipeline.call(request).await);
            }
            outcomes
        };
        let results: Vec<Value> = batch
            .calls
            .iter()
            .zip(&outcomes)
            .map(|(call, outcome)| match outcome {
                CallOutcome::Finished(finished) => json!({
                    "call_id": call.call_id,
                    "invocation_id": finished.invocation_id,
                    "outcome": finished.outcome,
                    "content": rendered_content(&finished.content),
                }),
                CallOutcome::Pending {
                    invocation_id,
                    approval_id,
                } => json!({
                    "call_id": call.call_id,
                    "invocation_id": invocation_id,
                    "pending": {"approval_id": approval_id},
                }),
                CallOutcome::Suspended {
                    invocation_id,
                    kind,
                    reference,
                } => json!({
                    "call_id": call.call_id,
                    "invocation_id": invocation_id,
                    "suspended": {"kind": kind, "reference": reference},
                }),
            })
            .collect();
        Ok(reply(
            StatusCode::OK,
            &json!({"parallel_group": parallel_group, "results": results}),
        ))
    }

    fn metrics(&self) -> Reply {
        let mut text = self.metrics.render();
        text.push_str(&format!(
            "# HELP toolgate_requests_in_flight Control and bridge requests being served.\n# TYPE toolgate_requests_in_flight gauge\ntoolgate_requests_in_flight {}\n",
            self.gauges.requests_in_flight.load(Ordering::SeqCst)
        ));
        let mut response = Response::new(Full::new(Bytes::from(text)).boxed_unsync());
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        );
        response
    }

    async fn approvals(&self, query: &HashMap<String, String>) -> Result<Reply, Refused> {
        let tenant = Self::tenant(query)?;
        let approvals = self
            .store
            .pending_approvals(&tenant)
            .await
            .map_err(Self::store_failed)?;
        let views: Vec<Value> = approvals
            .iter()
            .map(|approval| {
                json!({
                    "approval_id": approval.id,
                    "invocation_id": approval.invocation_id,
                    "tool_name": approval.tool_name,
                    "reason_code": approval.reason_code,
                    "status": approval.status,
                    "requested_at": approval.requested_at,
                })
            })
            .collect();
        Ok(reply(StatusCode::OK, &json!({"approvals": views})))
    }

    async fn decide(
        &self,
        id: &str,
        query: &HashMap<String, String>,
        request: Request<Incoming>,
    ) -> Result<Reply, Refused> {
        let Some((tenant, id)) = Self::tenant_and_id(query, id)? else {
            return Ok(not_found());
        };
        let decision: ApprovalDecision = self.body(request).await?;
        let status = match decision.decision.as_str() {
            "approve" => ApprovalStatus::Approved,
            "deny" => ApprovalStatus::Denied,
            _ => {
                return Ok(error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    "decision must be approve or deny",
                ));
            }
        };
        let decided = self
            .store
            .decide_approval(&tenant, id, status, &decision.approver, self.clock.now())
            .await
            .map_err(Self::store_failed)?;
        Ok(match decided {
            Some(approval) => reply(
                StatusCode::OK,
                &json!({"approval_id": approval.id, "status": approval.status}),
            ),
            None => error(
                StatusCode::CONFLICT,
                "not_pending",
                "no pending approval has this id",
            ),
        })
    }

    async fn invocation(
        &self,
        id: &str,
        query: &HashMap<String, String>,
    ) -> Result<Reply, Refused> {
        let Some((tenant, id)) = Self::tenant_and_id(query, id)? else {
            return Ok(not_found());
        };
        let row = self
            .store
            .invocation(&tenant, id)
            .await
            .map_err(Self::store_failed)?;
        Ok(match row {
            Some(row) => reply(StatusCode::OK, &invocation_view(&row)),
            None => not_found(),
        })
    }

    async fn complete(
        &self,
        id: &str,
        query: &HashMap<String, String>,
        request: Request<Incoming>,
    ) -> Result<Reply, Refused> {
        let Some((tenant, id)) = Self::tenant_and_id(query, id)? else {
            return Ok(not_found());
        };
        let body: CompleteSuspended = self.body(request).await?;
        let completion = match (body.outcome.as_str(), body.text) {
            ("answered", Some(text)) => Completion::Answered { text },
            ("run_cancelled", None) => Completion::RunCancelled,
            _ => {
                return Ok(error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    "outcome must be answered (with text) or run_cancelled (without)",
                ));
            }
        };
        let finished = self
            .pipeline
            .complete_suspended(&tenant, id, completion)
            .await
            .map_err(Self::store_failed)?;
        Ok(match finished {
            Some(finished) => reply(
                StatusCode::OK,
                &json!({
                    "invocation_id": id,
                    "outcome": finished.outcome,
                    "content": rendered_content(&finished.content),
                }),
            ),
            None => error(
                StatusCode::CONFLICT,
                "not_suspended",
                "no suspended invocation has this id",
            ),
        })
    }

    async fn run(&self, id: &str, query: &HashMap<String, String>) -> Result<Reply, Refused> {
        let Some((tenant, id)) = Self::tenant_and_id(query, id)? else {
            return Ok(not_found());
        };
        let rows: Vec<InvocationRecord> = self
            .store
            .run_invocations(&tenant, id)
            .await
            .map_err(Self::store_failed)?;
        let views: Vec<Value> = rows.iter().map(invocation_view).collect();
        Ok(reply(StatusCode::OK, &json!({"invocations": views})))
    }

    /// A tenant HTTP server, validated when written: the transport is HTTP,
    /// the endpoint and any token endpoint pass the egress allowlist, the
    /// authentication obeys the five rules, and scopes stay under
    /// `mcp.{server_id}.`. Every problem is reported with its field; no
    /// value is echoed.
    async fn put_server(
        &self,
        tenant: &str,
        server_id: &str,
        request: Request<Incoming>,
    ) -> Result<Reply, Refused> {
        if !valid_tenant_id(tenant) {
            return Err(Self::invalid_tenant());
        }
        let body: PutMcpServer = self.body(request).await?;
        if let Some(taken) = self.operator_server(server_id) {
            return Ok(taken);
        }
        let mut problems: Vec<String> = validate_classification(server_id, &body.required_scopes)
            .iter()
            .map(|violation| format!("{}: {violation}", violation.field()))
            .collect();
        if let Err(failure) = self.settings.egress.check(&body.endpoint) {
            problems.push(format!("endpoint: {failure}"));
        }
        let auth = body.auth.unwrap_or(ServerAuth {
            scheme: "none".into(),
            name: None,
            credential_ref: None,
            token_endpoint: None,
            token_scopes: None,
        });
        let fields = AuthFields {
            transport: Transport::Http,
            scheme: &auth.scheme,
            auth_name: auth.name.as_deref(),
            credential_ref: auth.credential_ref.as_deref(),
            token_endpoint: auth.token_endpoint.as_deref(),
        };
        problems.extend(
            validate_auth(fields, &self.settings.egress)
                .iter()
                .map(|violation| format!("auth.{}: {violation}", violation.field())),
        );
        if body.timeout_seconds == 0 || body.maximum_output_bytes == 0 {
            problems.push("timeout_seconds, maximum_output_bytes: must be positive".into());
        }
        let Ok(auth_scheme) = auth.scheme.parse::<AuthScheme>() else {
            return Ok(error(
                StatusCode::BAD_REQUEST,
                "invalid_server",
                &problems.join("; "),
            ));
        };
        if !problems.is_empty() {
            return Ok(error(
                StatusCode::BAD_REQUEST,
                "invalid_server",
                &problems.join("; "),
            ));
        }
        let row = McpServerRow {
            server_id: server_id.to_owned(),
            transport: Transport::Http,
            endpoint: body.endpoint,
            auth_scheme,
            auth_name: auth.name,
            credential_ref: auth.credential_ref,
            token_endpoint: auth.token_endpoint,
            token_scopes: auth.token_scopes,
            side_effect: body.side_effect,
            risk: body.risk,
            idempotency: body.idempotency,
            required_scopes: body.required_scopes,
            timeout_seconds: body.timeout_seconds,
            maximum_output_bytes: body.maximum_output_bytes,
            enabled: body.enabled,
        };
        self.store
            .put_mcp_server(tenant, &row, self.clock.now())
            .await
            .map_err(Self::store_failed)?;
        Ok(reply(StatusCode::OK, &server_view(&row)))
    }

    /// The refusal for a tenant server that would take an operator
    /// server's id.
    fn operator_server(&self, server_id: &str) -> Option<Reply> {
        self.settings
            .operator_servers
            .iter()
            .any(|id| id == server_id)
            .then(|| {
                error(
                    StatusCode::CONFLICT,
                    "server_id_taken",
                    "an operator server has this server_id",
                )
            })
    }

    async fn get_server(&self, tenant: &str, server_id: &str) -> Result<Reply, Refused> {
        let row = self
            .store
            .mcp_server(tenant, server_id)
            .await
            .map_err(Self::store_failed)?;
        Ok(match row {
            Some(row) => reply(StatusCode::OK, &server_view(&row)),
            None => not_found(),
        })
    }

    async fn delete_server(&self, tenant: &str, server_id: &str) -> Result<Reply, Refused> {
        if let Some(taken) = self.operator_server(server_id) {
            return Ok(taken);
        }
        let deleted = self
            .store
            .delete_mcp_server(tenant, server_id)
            .await
            .map_err(Self::store_failed)?;
        Ok(if deleted {
            reply(
                StatusCode::OK,
                &json!({"server_id": server_id, "deleted": true}),
            )
        } else {
            not_found()
        })
    }

    async fn review_queue(&self, query: &HashMap<String, String>) -> Result<Reply, Refused> {
        let tenant = Self::tenant(query)?;
        let rows = self
            .store
            .review_queue(&tenant, 1000)
            .await
            .map_err(Self::store_failed)?;
        let views: Vec<Value> = rows.iter().map(invocation_view).collect();
        Ok(reply(StatusCode::OK, &json!({"uncertain": views})))
    }

    async fn resolve(
        &self,
        id: &str,
        query: &HashMap<String, String>,
        request: Request<Incoming>,
    ) -> Result<Reply, Refused> {
        let Some((tenant, invocation_id)) = Self::tenant_and_id(query, id)? else {
            return Ok(not_found());
        };
        let decision: ReviewDecision = self.body(request).await?;
        let review = ReviewRecord {
            invocation_id,
            resolution: decision.resolution,
            resolver: decision.resolver,
            note: decision.note,
            resolved_at: self.clock.now(),
        };
        let recorded = self
            .store
            .resolve_review(&tenant, &review)
            .await
            .map_err(Self::store_failed)?;
        Ok(if recorded {
            reply(
                StatusCode::OK,
                &json!({"invocation_id": invocation_id, "resolution": review.resolution}),
            )
        } else {
            error(
                StatusCode::CONFLICT,
                "not_in_review",
                "no unresolved uncertain invocation has this id",
            )
        })
    }

    /// The outbox from a cursor, as JSON lines or (with `Accept:
    /// text/event-stream`) server-sent events whose ids are the cursor. With
    /// `follow=true` the response stays open and new events are sent as
    /// they commit, until the reader goes or toolgate drains.
    async fn events(
        self: &Arc<Self>,
        query: &HashMap<String, String>,
        headers: &hyper::HeaderMap,
    ) -> Result<Reply, Refused> {
        let sse = headers
            .get(hyper::header::ACCEPT)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|accept| accept.contains("text/event-stream"));
        let follow = query.get("follow").is_some_and(|value| value == "true");
        let mut after: i64 = query
            .get("after")
            .and_then(|after| after.parse().ok())
            .unwrap_or(0);
        let limit = query
            .get("limit")
            .and_then(|limit| limit.parse().ok())
            .unwrap_or(1000_i64)
            .clamp(1, 10_000);
        let media = if sse {
            "text/event-stream"
        } else {
            "application/x-ndjson"
        };
        let (lines, last) = self.event_lines(after, limit, sse).await?;
        let body = if follow {
            after = last.unwrap_or(after);
            let (sender, receiver) = tokio::sync::mpsc::channel(16);
            let api = self.clone();
            tokio::spawn(async move {
                if sender.send(Bytes::from(lines)).await.is_err() {
                    return;
                }
                while !api.draining.load(Ordering::SeqCst) {
                    // A reader that went away ends the poll at once, not at
                    // the next event.
                    tokio::select! {
                        _ = sender.closed() => return,
                        _ = tokio::time::sleep(FOLLOW_POLL) => {}
                    }
                    let Ok((lines, last)) = api.event_lines(after, limit, sse).await else {
                        return;
                    };
                    after = last.unwrap_or(after);
                    if !lines.is_empty() && sender.send(Bytes::from(lines)).await.is_err() {
                        return;
                    }
                }
            });
            Channel(receiver).boxed_unsync()
        } else {
            Full::new(Bytes::from(lines)).boxed_unsync()
        };
        let mut response = Response::new(body);
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(media));
        Ok(response)
    }

    /// Events after `after`, rendered, and the last id among them.
    async fn event_lines(
        &self,
        after: i64,
        limit: i64,
        sse: bool,
    ) -> Result<(String, Option<i64>), Refused> {
        let events = self
            .store
            .events_after(after, limit)
            .await
            .map_err(Self::store_failed)?;
        let last = events.last().map(|event| event.id);
        let mut lines = String::new();
        for event in events {
            let body = json!({
                "id": event.id,
                "event_type": event.event_type,
                "tenant_id": event.tenant_id,
                "payload": event.payload,
                "created_at": event.created_at,
            });
            if sse {
                // The id is the cursor a reconnecting reader sends back.
                lines.push_str(&format!(
                    "id: {}\nevent: {}\ndata: {body}\n\n",
                    event.id, event.event_type
                ));
            } else {
                lines.push_str(&body.to_string());
                lines.push('\n');
            }
        }
        Ok((lines, last))
    }

    async fn open_turn(self: &Arc<Self>, request: Request<Incoming>) -> Result<Reply, Refused> {
        let open: OpenTurn = self.body(request).await?;
        self.session(open.session_id).await?;
        let script_ok = open.script_sha256.len() == 64
            && open
                .script_sha256
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !script_ok {
            return Ok(error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "script_sha256 must be 64 lowercase hex digits",
            ));
        }
        let lifetime = chrono::Duration::from_std(self.settings.turn_lifetime)
            .unwrap_or(chrono::Duration::hours(1));
        let expires_at = self.clock.now() + lifetime;
        let binding = TurnBinding {
            session_id: open.session_id,
            run_id: open.run_id,
            step_number: open.step_number,
            script_sha256: open.script_sha256,
            sandbox_uid: open.sandbox_uid,
        };
        let (turn, token, listener) = self.turns.open(binding, expires_at).map_err(|failure| {
            tracing::warn!(error = %failure, "turn not opened");
            Refused::new(error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "turn_unavailable",
                "the turn's socket could not be created",
            ))
        })?;
        let stop = CancellationToken::new();
        self.turn_servers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(turn.id, stop.clone());
        tokio::spawn(
            self.clone()
                .serve_turn(turn.clone(), listener, stop, open.origin_trust),
        );
        self.record(
            &turn,
            PlatformEvent::BridgeSessionOpened {
                run_id: turn.binding.run_id,
                step_number: turn.binding.step_number,
                script_hash: turn.binding.script_sha256.clone(),
            },
        )
        .await;
        Ok(reply(
            StatusCode::OK,
            &json!({
                "turn_id": turn.id,
                "socket_path": turn.socket_path(),
                "token": token,
                "expires_at": turn.expires_at,
            }),
        ))
    }

    async fn record(&self, turn: &Turn, event: PlatformEvent) {
        let tenant = self
            .session(turn.binding.session_id)
            .await
            .ok()
            .map(|session| session.tenant_id.clone());
        if let Err(failure) = self
            .store
            .record_event(tenant.as_deref(), &event, self.clock.now())
            .await
        {
            tracing::warn!(error = %failure, "bridge event not recorded");
        }
    }

    /// Tears a turn down: token dead, socket gone, server stopped, event
    /// recorded. Returns the turn if it was open.
    async fn end_turn(&self, id: Uuid) -> Option<Arc<Turn>> {
        let turn = self.turns.close(id)?;
        self.stop_turn_server(id);
        self.record(
            &turn,
            PlatformEvent::BridgeSessionClosed {
                run_id: turn.binding.run_id,
                step_number: turn.binding.step_number,
                calls: turn.calls(),
            },
        )
        .await;
        Some(turn)
    }

    fn stop_turn_server(&self, id: Uuid) {
        if let Some(stop) = self
            .turn_servers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id)
        {
            stop.cancel();
        }
    }

    async fn close_turn(&self, id: &str) -> Reply {
        let Ok(id) = id.parse::<Uuid>() else {
            return not_found();
        };
        match self.end_turn(id).await {
            Some(turn) => reply(
                StatusCode::OK,
                &json!({"turn_id": id, "calls": turn.calls()}),
            ),
            None => not_found(),
        }
    }

    async fn serve_turn(
        self: Arc<Self>,
        turn: Arc<Turn>,
        listener: UnixListener,
        stop: CancellationToken,
        origin_trust: crate::domain::TrustLevel,
    ) {
        loop {
            let stream = tokio::select! {
                _ = stop.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(_) => {
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                },
            };
            let peer_uid = stream.peer_cred().ok().map(|credentials| credentials.uid());
            let (api, turn) = (self.clone(), turn.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let (api, turn) = (api.clone(), turn.clone());
                    async move {
                        let work = {
                            let api = api.clone();
                            async move { api.bridge(&turn, peer_uid, origin_trust, request).await }
                        };
                        Ok::<_, Infallible>(api.tracked(work).await)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .keep_alive(false)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    }

    fn refuse(&self, status: StatusCode, code: &str, message: &str) -> Reply {
        self.metrics
            .increment("bridge_refusals_total", vec![("code", code.to_owned())]);
        error(status, code, message)
    }

    async fn bridge(
        self: &Arc<Self>,
        turn: &Arc<Turn>,
        peer_uid: Option<u32>,
        origin_trust: crate::domain::TrustLevel,
        request: Request<Incoming>,
    ) -> Reply {
        let token = request
            .headers()
            .get(AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "));
        match turn.authorize(token, peer_uid, self.clock.now()) {
            Ok(()) => {}
            Err(Refusal::Token) => {
                return self.refuse(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "missing or wrong turn token",
                );
            }
            Err(Refusal::Peer) => {
                return self.refuse(
                    StatusCode::FORBIDDEN,
                    "forbidden_peer",
                    "the peer is not the turn's sandbox user",
                );
            }
            Err(Refusal::Closed) => {
                return self.refuse(StatusCode::GONE, "turn_closed", "the turn is closed");
            }
        }
        let Ok(session) = self.session(turn.binding.session_id).await else {
            return self.refuse(
                StatusCode::GONE,
                "turn_closed",
                "the turn's session is closed",
            );
        };
        match (request.method().clone(), request.uri().path()) {
            (Method::GET, "/v1/tools") => {
                let tools: Vec<Value> = session
                    .pinned
                    .advertised()
                    .map(|pinned| {
                        json!({
                            "name": pinned.tool.spec.name,
                            "description": pinned.tool.spec.description,
                            "input_schema": pinned.tool.spec.input_schema,
                        })
                    })
                    .collect();
                reply(StatusCode::OK, &json!({"tools": tools}))
            }
            (Method::POST, "/v1/call") => {
                if self.draining.load(Ordering::SeqCst) {
                    return self.refuse(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "draining",
                        "toolgate is shutting down",
                    );
                }
                let call: BridgeCall = match self.body(request).await {
                    Ok(call) => call,
                    Err(Refused(reply)) => {
                        self.metrics.increment(
                            "bridge_refusals_total",
                            vec![("code", "invalid_request".to_owned())],
                        );
                        return *reply;
                    }
                };
                self.bridge_call(turn, &session, origin_trust, call).await
            }
            _ => self.refuse(StatusCode::NOT_FOUND, "not_found", "no such resource"),
        }
    }

    async fn bridge_call(
        self: &Arc<Self>,
        turn: &Arc<Turn>,
        session: &Session,
        origin_trust: crate::domain::TrustLevel,
        call: BridgeCall,
    ) -> Reply {
        let Some(ordinal) = turn.next_ordinal(self.settings.turn_call_cap) else {
            let outcome = ToolOutcome::not_succeeded(call.call, ReasonCode::BridgeCallLimit);
            return reply_text(StatusCode::OK, wire::outcome_text(&outcome, &[]));
        };
        let place = Place {
            session_id: turn.binding.session_id,
            run_id: turn.binding.run_id,
            step_number: turn.binding.step_number,
            origin_trust,
            deadline_at: None,
            parallel_group: None,
        };
        let request = Self::request_for(
            session,
            &place,
            (
                call_id(&turn.binding.script_sha256, ordinal),
                call.call,
                call.arguments,
            ),
        );
        let mut outcome = self.pipeline.call(request.clone()).await;
        let held_until = tokio::time::Instant::now() + self.settings.approval_hold;
        while let CallOutcome::Pending { approval_id, .. } = outcome {
            // Held, not failed: the script blocks while a human decides.
            let decided = loop {
                if tokio::time::Instant::now() >= held_until {
                    break false;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                match self.store.approval(&session.tenant_id, approval_id).await {
                    Ok(Some(approval)) if approval.status != ApprovalStatus::Pending => break true,
                    _ => {}
                }
            };
            if !decided {
                // Past the hold the turn is suspended and closed; the same
                // script in a new turn resumes through deduplication.
                self.end_turn(turn.id).await;
                return error(
                    StatusCode::CONFLICT,
                    "turn_suspended",
                    "the approval was not decided within the hold; the turn is closed",
                );
            }
            outcome = self.pipeline.call(request.clone()).await;
        }
        match outcome {
            CallOutcome::Finished(Finished {
                outcome, content, ..
            }) => {
                let mut response =
                    reply_text(StatusCode::OK, wire::outcome_text(&outcome, &content));
                if let Ok(value) = HeaderValue::from_str(&ordinal.to_string()) {
                    response.headers_mut().insert("Toolgate-Ordinal", value);
                }
                response
            }
            CallOutcome::Pending { .. } => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the call is still pending",
            ),
            // A script cannot wait hours for a user or a child run.
            CallOutcome::Suspended { .. } => error(
                StatusCode::CONFLICT,
                "call_suspended",
                "the call suspended the run; it completes through the control API",
            ),
        }
    }
}
