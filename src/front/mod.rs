//! The MCP front door: toolgate as an MCP server any MCP client connects
//! to over streamable HTTP, every `tools/call` a pipeline call.
//!
//! The protocol's server side (`adapters::mcp::front`, through
//! `ports::front`) parses and answers the protocol, run statelessly per
//! request; the sessions are toolgate's own. `initialize` opens a toolgate
//! session (discovery, the pinned set, the recorded row) whose id is the
//! `Mcp-Session-Id`, so a session continues on any node sharing the store.
//! Before the protocol's side sees a request this module has authenticated
//! it, read its body within the edge's limits, refused batches, resolved
//! its session for its credential (a 2026-07-28 request's, the
//! credential's own) and handled what a stateless server would drop
//! (`DELETE`, `notifications/cancelled`); after, it knows whether the
//! answer was delivered (the re-issue rule).

pub mod auth;
mod handler;
mod listen;
mod live;

mod reissue;
pub mod relay;
mod render;
mod resources;
mod shares;

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::StatusCode;
use hyper::body::Bytes;
use hyper::header::HeaderValue;
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub use auth::{ApiKey, AuthError, Caller, Credentials, JwtSettings, KeySource, TenantSource};
pub use render::{META_CALL_ID, META_ORIGIN_TRUST, META_REISSUE, META_RUN_ID, META_STEP};

use crate::edge::{ConnectionCap, EdgeLimits, InFlight, Reply};
use crate::pipeline::Pipeline;
use crate::pipeline::approvals::Approvals;
use crate::pipeline::sessions::{SESSION_IDLE, Session, SessionError, Sessions};
use crate::ports::{Clock, EventStore, InvocationStore, PlatformEvent};
use reissue::{Delivery, Reissues, Undelivery};

/// The path the MCP endpoint answers on.
pub const MCP_PATH: &str = "/mcp";
/// RFC 9728's metadata document, at the root and for the endpoint's path.
pub const RESOURCE_METADATA_PATH: &str = "/.well-known/oauth-protected-resource";
/// The session header.
const SESSION_HEADER: &str = "mcp-session-id";
/// The header every request names its protocol revision in.
const VERSION_HEADER: &str = "mcp-protocol-version";
/// The first revision without sessions: each request stands alone.
pub const STATELESS_REVISION: &str = "2026-07-28";
/// Sessions a credential's stateless requests may move through as its
/// tools change, looked for in order from the one this node last used.
const STATELESS_GENERATIONS: u32 = 16;
/// Credentials whose stateless sessions a node keeps derived.
const STATELESS_CREDENTIALS: usize = 4096;

/// The front door's limits and advertised metadata.
#[derive(Debug, Clone)]
pub struct FrontSettings {
    /// Body size and deadlines, as every edge's.
    pub limits: EdgeLimits,
    /// `Host` values TCP requests may carry.
    pub allowed_hosts: Vec<String>,
    /// The TCP port the endpoint listens on: a `Host` entry without a port
    /// matches a `Host` without one, or with this one.
    pub listen_port: Option<u16>,
    /// Browser origins allowed to send requests.
    pub allowed_origins: Vec<String>,
    /// The endpoint's public URL, when the operator states it.
    pub resource: Option<String>,
    /// Where clients get tokens.
    pub authorization_servers: Vec<String>,
    /// Scopes advertised.
    pub scopes_supported: Vec<String>,
    /// How long a call waiting for approval holds its request.
    pub approval_hold: Duration,
    /// Calls one session may have in flight.
    pub session_in_flight: usize,
    /// Calls one credential may have in flight, across its sessions.
    pub credential_in_flight: usize,
    /// Calls one tenant may have in flight, across its credentials.
    pub tenant_in_flight: usize,
    /// Sessions one credential may hold open on this node.
    pub sessions_per_credential: usize,
    /// SSE keep-alive interval.
    pub keep_alive: Duration,
    /// How long a new connection may take to send its first request head.
    pub first_request: Duration,
    /// How long a call whose answer was never delivered is the same call
    /// when its caller asks for it again.
    pub reissue_window: Duration,
    /// The console's approval pages (`…/approvals/`), where a 2026-07-28
    /// client that opens URLs sends its user for a held call; none without
    /// a console.
    pub approval_pages: Option<String>,
}

/// What the front door drives.
pub struct FrontParts {
    /// Sessions: opening, reloading, ending.
    pub sessions: Arc<Sessions>,
    /// The one pipeline.
    pub pipeline: Arc<Pipeline>,
    /// Approval waits.
    pub approvals: Arc<Approvals>,
    /// Who may call.
    pub credentials: Arc<Credentials>,
    /// Calls in flight on every edge (the drain waits for them).
    pub in_flight: Arc<InFlight>,
    /// Connections held at once.
    pub connections: ConnectionCap,
    /// Where an undelivered answer is recorded.
    pub events: Arc<dyn EventStore>,
    /// Artifacts, read through the links results carry.
    pub artifacts: Arc<crate::pipeline::artifacts::Artifacts>,
    /// The rows a held call's task is read from.
    pub invocations: Arc<dyn InvocationStore>,
    /// The one clock.
    pub clock: Arc<dyn Clock>,
    /// Continues a caller's trace from the `traceparent` in a request's
    /// `_meta` (or its headers).
    pub continue_trace: crate::ports::metrics::TraceContinuation,
    /// Its limits.
    pub settings: FrontSettings,
}

/// The front door.
pub struct Front {
    parts: FrontParts,
    open: OpenSessions,
    calls: Arc<CallsInFlight>,
    reissues: Arc<Reissues>,
    /// The calls each credential and each tenant have in flight.
    shares: Arc<shares::Shares>,
    /// The connections of both listeners, to make room in a full door.
    live: Arc<live::LiveConnections>,
    /// Each credential's stateless session as this node last used it.
    stateless: StatelessSessions,
}

/// Each credential's stateless session as this node last used it, with
/// what its id was derived from: a request whose caller matches takes the
/// id as it is, with no derivation per request; one whose tenant,
/// principal or tools differ (the credential was reconfigured) derives
/// its own, the id every other node derives for it.
#[derive(Default)]
struct StatelessSessions(Mutex<HashMap<String, StatelessSession>>);

struct StatelessSession {
    tenant_id: String,
    principal: crate::domain::Principal,
    tools: Vec<String>,
    base: Arc<str>,
    generation: u32,
    session_id: Uuid,
}

impl StatelessSessions {
    /// Where `caller`'s stateless sessions start: what their ids derive
    /// from, the generation this node last used and that generation's
    /// session id.
    fn start(&self, caller: &Caller) -> (Arc<str>, u32, Uuid) {
        let mut known = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(last) = known.get(&caller.credential)
            && last.tenant_id == caller.tenant_id
            && last.principal == caller.principal
            && last.tools == caller.agent.tools
        {
            return (last.base.clone(), last.generation, last.session_id);
        }
        let base: Arc<str> = stateless_base(caller).into();
        let session_id = stateless_session_id(&base, 0);
        // Bounded: past it the node derives again, costing a lookup per
        // generation the credential has moved through, never a wrong id.
        if known.len() >= STATELESS_CREDENTIALS && !known.contains_key(&caller.credential) {
            known.clear();
        }
        known.insert(
            caller.credential.clone(),
            StatelessSession::of(caller, base.clone(), 0, session_id),
        );
        (base, 0, session_id)
    }

    /// `caller` moved to `generation` of `base`, whose session is
    /// `session_id`.
    fn moved(&self, caller: &Caller, base: Arc<str>, generation: u32, session_id: Uuid) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                caller.credential.clone(),
                StatelessSession::of(caller, base, generation, session_id),
            );
    }
}

impl StatelessSession {
    fn of(caller: &Caller, base: Arc<str>, generation: u32, session_id: Uuid) -> Self {
        StatelessSession {
            tenant_id: caller.tenant_id.clone(),
            principal: caller.principal.clone(),
            tools: caller.agent.tools.clone(),
            base,
            generation,
            session_id,
        }
    }
}

/// What a request carries from this module to its methods, in the
/// HTTP request's extensions.
#[derive(Clone)]
struct FrontRequest {
    caller: Arc<Caller>,
    /// The request's session, resolved for its caller.
    session: Option<Arc<Session>>,
    /// Filled by `initialize` with the session it opened.
    opened: Arc<OnceLock<Uuid>>,
    /// Whether the answer reaches the client.
    delivery: Arc<Delivery>,
    /// A 2026-07-28 request: no session of the client's, its request id
    /// no call's identity.
    stateless: bool,
}

impl Front {
    /// The front door over its parts.
    pub fn new(parts: FrontParts) -> Arc<Self> {
        let reissues = Arc::new(Reissues::new(parts.settings.reissue_window));
        let shares = shares::Shares::new(
            parts.settings.credential_in_flight,
            parts.settings.tenant_in_flight,
        );
        Arc::new(Front {
            parts,
            open: OpenSessions::default(),
            calls: Arc::new(CallsInFlight::default()),
            shares,
            live: Arc::default(),
            reissues,
            stateless: StatelessSessions::default(),
        })
    }

    /// Who may call.
    pub fn credentials(&self) -> &Arc<Credentials> {
        &self.parts.credentials
    }

    /// Its limits and advertised metadata.
    pub fn settings(&self) -> &FrontSettings {
        &self.parts.settings
    }

    /// One request to the MCP endpoint, authenticated as `caller`; the protocol's side
    /// answers it once its session is resolved.
    async fn mcp(
        self: &Arc<Self>,
        request: hyper::Request<hyper::body::Incoming>,
        caller: Caller,
        protocol: &listen::Protocol,
    ) -> Reply {
        let method = request.method().clone();
        let session_header = session_header(request.headers()).map(str::to_owned);
        let session_header = session_header.as_deref();
        let stateless = request
            .headers()
            .get(VERSION_HEADER)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|version| version.trim() >= STATELESS_REVISION);
        if method == hyper::Method::DELETE && !stateless {
            return self.end_session(&caller, session_header).await;
        }
        if method != hyper::Method::POST {
            // Nothing is ever sent but answers: there is no stream to open,
            // and without sessions nothing to end.
            let mut reply = crate::edge::error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                if stateless {
                    "POST requests only"
                } else {
                    "POST requests and DELETE of a session only"
                },
            );
            reply.headers_mut().insert(
                hyper::header::ALLOW,
                HeaderValue::from_static(if stateless { "POST" } else { "POST, DELETE" }),
            );
            return reply;
        }
        let (mut parts, body) = request.into_parts();
        let bytes = match crate::edge::body_bytes(body, &self.parts.settings.limits).await {
            Ok(bytes) => bytes,
            Err(error) => return error.reply(),
        };
        let message: Value = match serde_json::from_slice(&bytes) {
            Ok(message) => message,
            Err(_) => {
                return rpc_error(
                    StatusCode::BAD_REQUEST,
                    Value::Null,
                    -32700,
                    "Parse error: the body is not JSON",
                );
            }
        };
        let Value::Object(fields) = &message else {
            return rpc_error(
                StatusCode::BAD_REQUEST,
                Value::Null,
                -32600,
                "Invalid Request: one JSON-RPC message per request (batches are not accepted)",
            );
        };
        let id = fields.get("id").cloned().unwrap_or(Value::Null);
        let rpc_method = fields.get("method").and_then(Value::as_str);
        let is_request = fields.contains_key("id") && rpc_method.is_some();
        let caller = Arc::new(caller);
        let session = if stateless {
            match (rpc_method, is_request) {
                // Closing a request's stream cancels it; a request id names
                // no one call across a credential's clients, so a
                // notification withdraws nothing.
                (Some(_), false) => return accepted(),
                (Some(method), true) if STATELESS_SESSION_METHODS.contains(&method) => {
                    match self.stateless_session(&caller).await {
                        Ok(session) => Some(session),
                        Err(unserved) => return unserved.reply(id),
                    }
                }
                // `server/discover`, and what the protocol's side answers without toolgate
                // (an unknown method is its 404).
                _ => None,
            }
        } else {
            match (rpc_method, is_request) {
                (Some("initialize"), true) => None,
                (Some(notification), false) => {
                    // Only the session's own caller withdraws its calls; a
                    // notification answers nothing, so another's is just
                    // dropped.
                    if notification == "notifications/cancelled"
                        && let Ok(session) = self.session_for(&caller, session_header).await
                    {
                        let request_id = message
                            .pointer("/params/requestId")
                            .cloned()
                            .unwrap_or(Value::Null);
                        self.calls
                            .withdraw(session.session_id, &request_key(&request_id));
                    }
                    // Nothing else a client notifies changes what toolgate does.
                    return accepted();
                }
                (Some("ping") | Some("server/discover"), true) if session_header.is_none() => None,
                // A client's answer to a request toolgate never sends: the protocol's side
                // refuses it without a session.
                (None, _) => None,
                _ => match self.session_for(&caller, session_header).await {
                    Ok(session) => Some(session),
                    Err(unserved) => return unserved.reply(id),
                },
            }
        };
        // An artifact is streamed from here: the protocol's side would
        // hold the whole of it as one value.
        if is_request && rpc_method == Some("resources/read") {
            return self
                .read_resource(&caller, id, fields.get("params"), stateless)
                .await;
        }
        let opened = Arc::new(OnceLock::new());
        // Held until the answer is written: dropped first (the connection
        // closed under the request or its body), the call's answer was
        // never delivered.
        let delivery = Delivering {
            front: self.clone(),
            delivery: Arc::new(Delivery::default()),
            tenant_id: caller.tenant_id.clone(),
        };
        parts.extensions.insert(FrontRequest {
            caller,
            session,
            opened: opened.clone(),
            delivery: delivery.delivery.clone(),
            stateless,
        });
        let request = hyper::Request::from_parts(parts, http_body_util::Full::new(bytes));
        let response = protocol.mcp.handle(request).await;
        let mut reply = response.map(|body| {
            http_body_util::BodyExt::boxed_unsync(DeliveredBody {
                inner: body,
                delivering: Some(delivery),
            })
        });
        if let Some(session_id) = opened.get()
            && let Ok(value) = HeaderValue::from_str(&session_id.to_string())
        {
            reply.headers_mut().insert(SESSION_HEADER, value);
        }
        reply
    }

    /// Records that a call past its intent ran on with no one to take its
    /// answer: the stream closed, so the call's caller reads it on a
    /// re-issue or in the record.
    fn report_undelivered(&self, tenant_id: &str, undelivery: Undelivery) {
        let events = self.parts.events.clone();
        let now = self.parts.clock.now();
        let tenant_id = tenant_id.to_owned();
        tokio::spawn(async move {
            let event = PlatformEvent::FrontAnswerUndelivered {
                invocation_id: undelivery.invocation_id,
                session_id: undelivery.session_id,
            };
            if let Err(error) = events.record_event(Some(&tenant_id), &event, now).await {
                tracing::warn!(error = %error, "an undelivered answer's event was not recorded");
            }
        });
    }

    /// The request's session, if `caller` opened it.
    async fn session_for(
        &self,
        caller: &Caller,
        header: Option<&str>,
    ) -> Result<Arc<Session>, Unserved> {
        let header = header.ok_or(Unserved::SessionRequired)?;
        let session_id = header.parse::<Uuid>().map_err(|_| Unserved::NotFound)?;
        let session = match self.parts.sessions.get(session_id).await {
            Ok(session) => session,
            Err(SessionError::Unknown | SessionError::ToolsChanged) => {
                return Err(Unserved::NotFound);
            }
            Err(SessionError::ServersUnavailable) => return Err(Unserved::ServersUnavailable),
            Err(error) => {
                tracing::warn!(error = %error, "a front door session could not be read");
                return Err(Unserved::StoreUnavailable);
            }
        };
        if !owns(caller, &session) {
            return Err(Unserved::NotFound);
        }
        self.open.touch(&caller.credential, session_id);
        Ok(session)
    }

    /// The session a credential's stateless requests share: its id derived
    /// from the credential, so every node finds the same one, and its
    /// pinned set held as a session's. When that set can no longer be
    /// served as pinned (the tools changed), the credential moves to its
    /// next generation, a new session with the new set and hash.
    async fn stateless_session(&self, caller: &Caller) -> Result<Arc<Session>, Unserved> {
        let (base, first, first_id) = self.stateless.start(caller);
        for generation in first..first.saturating_add(STATELESS_GENERATIONS) {
            let session_id = if generation == first {
                first_id
            } else {
                stateless_session_id(&base, generation)
            };
            let session = match self.parts.sessions.get(session_id).await {
                Err(SessionError::Unknown) => {
                    self.parts
                        .sessions
                        .open(caller.session_request(session_id))
                        .await
                }
                got => got,
            };
            match session {
                Ok(session) if owns(caller, &session) => {
                    if generation != first {
                        self.stateless.moved(caller, base, generation, session_id);
                    }
                    return Ok(session);
                }
                Ok(_) | Err(SessionError::ToolsChanged | SessionError::Conflict) => {}
                Err(SessionError::ServersUnavailable) => return Err(Unserved::ServersUnavailable),
                Err(error) => {
                    tracing::warn!(error = %error, "a stateless front door session could not be opened");
                    return Err(Unserved::StoreUnavailable);
                }
            }
        }
        Err(Unserved::ServersUnavailable)
    }

    /// `DELETE`: ends the caller's session everywhere.
    async fn end_session(&self, caller: &Caller, header: Option<&str>) -> Reply {
        let Some(session_id) = header.and_then(|id| id.parse::<Uuid>().ok()) else {
            return crate::edge::error(
                StatusCode::BAD_REQUEST,
                "session_required",
                "the Mcp-Session-Id header names the session to end",
            );
        };
        match self
            .parts
            .sessions
            .end(
                session_id,
                &caller.tenant_id,
                &caller.principal,
                &caller.agent,
            )
            .await
        {
            Ok(true) => {
                self.open.forget(&caller.credential, session_id);
                let mut reply = hyper::Response::new(http_body_util::BodyExt::boxed_unsync(
                    http_body_util::Empty::<Bytes>::new(),
                ));
                *reply.status_mut() = StatusCode::NO_CONTENT;
                reply
            }
            Ok(false) => crate::edge::error(StatusCode::NOT_FOUND, "not_found", "no such session"),
            Err(error) => {
                tracing::warn!(error = %error, "a front door session could not be ended");
                crate::edge::error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "the session could not be ended; retry",
                )
            }
        }
    }
}

/// Why a request's session cannot serve it.
#[derive(Debug, Clone, Copy)]
enum Unserved {
    /// No `Mcp-Session-Id` after `initialize`.
    SessionRequired,
    /// Unknown, ended, malformed or someone else's: one answer, since a
    /// session id says nothing about a session its caller did not open.
    NotFound,
    /// A server the session pinned did not answer on reload.
    ServersUnavailable,
    /// The store did not answer.
    StoreUnavailable,
}

impl Unserved {
    fn reply(self, id: Value) -> Reply {
        let (status, code, message) = match self {
            Unserved::SessionRequired => (
                StatusCode::BAD_REQUEST,
                -32600,
                "Bad Request: the Mcp-Session-Id header is required after initialize",
            ),
            Unserved::NotFound => (
                StatusCode::NOT_FOUND,
                -32001,
                "Session not found: initialize a new session",
            ),
            Unserved::ServersUnavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                -32002,
                "a tool server this session pinned did not answer; retry",
            ),
            Unserved::StoreUnavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                -32603,
                "the session could not be read; retry",
            ),
        };
        rpc_error(status, id, code, message)
    }
}

/// Whether `caller` is who opened `session`.
fn owns(caller: &Caller, session: &Session) -> bool {
    caller.tenant_id == session.tenant_id
        && caller.principal == session.principal
        && caller.agent == session.agent
}

/// The methods a stateless request needs its credential's session for.
const STATELESS_SESSION_METHODS: [&str; 6] = [
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "tasks/get",
    "tasks/cancel",
];

/// What a credential's stateless sessions are derived from: who calls and
/// what they may use, never the secret.
fn stateless_base(caller: &Caller) -> String {
    let mut text = format!(
        "toolgate/stateless\0{}\0{}\0{}",
        caller.credential, caller.tenant_id, caller.principal.id
    );
    for scope in &caller.principal.scopes {
        text.push('\0');
        text.push_str(scope);
    }
    text.push('\u{1}');
    for pattern in &caller.agent.tools {
        text.push('\0');
        text.push_str(pattern);
    }
    crate::domain::sha256_hex(text.as_bytes())
}

/// The session id of a credential's `generation`.
fn stateless_session_id(base: &str, generation: u32) -> Uuid {
    render::derived_uuid(&format!("{base}\0{generation}"))
}

fn session_header(headers: &hyper::HeaderMap) -> Option<&str> {
    headers
        .get(SESSION_HEADER)
        .and_then(|value| value.to_str().ok())
}

/// A JSON-RPC error as the whole reply.
fn rpc_error(status: StatusCode, id: Value, code: i64, message: &str) -> Reply {
    let mut reply = crate::edge::reply(
        status,
        &json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}),
    );
    if status == StatusCode::SERVICE_UNAVAILABLE {
        reply
            .headers_mut()
            .insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    reply
}

fn accepted() -> Reply {
    let mut reply = hyper::Response::new(http_body_util::BodyExt::boxed_unsync(
        http_body_util::Empty::<Bytes>::new(),
    ));
    *reply.status_mut() = StatusCode::ACCEPTED;
    reply
}

/// The key a JSON-RPC request id has among its session's calls.
fn request_key(id: &Value) -> String {
    id.to_string()
}

/// A session unused this long is taken as abandoned (a client that never
/// sent `DELETE`) when its credential needs room for a new one.
const ABANDONED: Duration = Duration::from_secs(600);

/// The sessions each credential holds open on this node, so no credential
/// can make the node hold sessions without bound.
#[derive(Default)]
struct OpenSessions(Mutex<HashMap<String, CredentialSessions>>);

#[derive(Default)]
struct CredentialSessions {
    sessions: HashMap<Uuid, Instant>,
    opening: usize,
}

/// A place for one more session of a credential, held while it opens.
struct Opening<'a> {
    open: &'a OpenSessions,
    credential: String,
    filled: bool,
}

impl OpenSessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, CredentialSessions>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for a session of `credential`, unless it holds `maximum`
    /// and none of them has been left unused for [`ABANDONED`]; when one
    /// has, the least recently used makes room and is named, to be ended.
    fn admit(&self, credential: &str, maximum: usize) -> Option<(Opening<'_>, Option<Uuid>)> {
        let mut all = self.lock();
        let held = all.entry(credential.to_owned()).or_default();
        held.sessions
            .retain(|_, used| used.elapsed() < SESSION_IDLE);
        let mut evicted = None;
        if held.sessions.len() + held.opening >= maximum {
            let (oldest, used) = held
                .sessions
                .iter()
                .min_by_key(|(_, used)| **used)
                .map(|(id, used)| (*id, *used))?;
            if used.elapsed() < ABANDONED {
                return None;
            }
            held.sessions.remove(&oldest);
            evicted = Some(oldest);
        }
        held.opening += 1;
        Some((
            Opening {
                open: self,
                credential: credential.to_owned(),
                filled: false,
            },
            evicted,
        ))
    }

    fn touch(&self, credential: &str, session: Uuid) {
        if let Some(held) = self.lock().get_mut(credential)
            && let Some(used) = held.sessions.get_mut(&session)
        {
            *used = Instant::now();
        }
    }

    fn forget(&self, credential: &str, session: Uuid) {
        let mut all = self.lock();
        if let Some(held) = all.get_mut(credential) {
            held.sessions.remove(&session);
            if held.sessions.is_empty() && held.opening == 0 {
                all.remove(credential);
            }
        }
    }
}

impl Opening<'_> {
    fn fill(mut self, session: Uuid) {
        let mut all = self.open.lock();
        let held = all.entry(self.credential.clone()).or_default();
        held.opening = held.opening.saturating_sub(1);
        held.sessions.insert(session, Instant::now());
        self.filled = true;
    }
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        if self.filled {
            return;
        }
        let mut all = self.open.lock();
        if let Some(held) = all.get_mut(&self.credential) {
            held.opening = held.opening.saturating_sub(1);
            if held.sessions.is_empty() && held.opening == 0 {
                all.remove(&self.credential);
            }
        }
    }
}

/// Each session's calls in flight, by JSON-RPC request id: the
/// per-session cap, `notifications/cancelled`, and a retry of a request
/// still running waiting for it rather than racing it.
#[derive(Default)]
struct CallsInFlight(Mutex<HashMap<Uuid, HashMap<String, InFlightCall>>>);

struct InFlightCall {
    withdrawn: CancellationToken,
    done: tokio::sync::watch::Receiver<bool>,
}

/// Why a call was not admitted.
enum Busy {
    /// The session has its cap of calls in flight.
    Full,
    /// The same request is in flight; this resolves when it ends.
    Running(tokio::sync::watch::Receiver<bool>),
}

/// One admitted call; its end frees its place.
struct CallSlot {
    calls: Arc<CallsInFlight>,
    session: Uuid,
    key: String,
    withdrawn: CancellationToken,
    done: tokio::sync::watch::Sender<bool>,
}

impl CallsInFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, HashMap<String, InFlightCall>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for request `key` of `session`, withdrawn when `closed`
    /// fires (its stream closed) or the client cancels it.
    fn admit(
        self: &Arc<Self>,
        session: Uuid,
        key: String,
        maximum: usize,
        closed: &CancellationToken,
    ) -> Result<CallSlot, Busy> {
        let mut all = self.lock();
        let calls = all.entry(session).or_default();
        if let Some(running) = calls.get(&key) {
            return Err(Busy::Running(running.done.clone()));
        }
        if calls.len() >= maximum {
            return Err(Busy::Full);
        }
        let withdrawn = closed.child_token();
        let (done, watching) = tokio::sync::watch::channel(false);
        calls.insert(
            key.clone(),
            InFlightCall {
                withdrawn: withdrawn.clone(),
                done: watching,
            },
        );
        Ok(CallSlot {
            calls: self.clone(),
            session,
            key,
            withdrawn,
            done,
        })
    }

    fn withdraw(&self, session: Uuid, key: &str) {
        if let Some(call) = self.lock().get(&session).and_then(|calls| calls.get(key)) {
            call.withdrawn.cancel();
        }
    }
}

impl Drop for CallSlot {
    fn drop(&mut self) {
        let mut all = self.calls.lock();
        if let Some(calls) = all.get_mut(&self.session) {
            calls.remove(&self.key);
            if calls.is_empty() {
                all.remove(&self.session);
            }
        }
        let _ = self.done.send(true);
    }
}

/// A request's delivery, held by the listener until its answer is written.
struct Delivering {
    front: Arc<Front>,
    delivery: Arc<Delivery>,
    tenant_id: String,
}

impl Drop for Delivering {
    fn drop(&mut self) {
        // After `delivered` this does nothing.
        if let Some(undelivery) = self.delivery.abandoned() {
            self.front.report_undelivered(&self.tenant_id, undelivery);
        }
    }
}

/// An answer's body: written to its end, the answer was delivered.
struct DeliveredBody {
    inner: http_body_util::combinators::UnsyncBoxBody<Bytes, std::convert::Infallible>,
    delivering: Option<Delivering>,
}

impl hyper::body::Body for DeliveredBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(context);
        // hyper stops polling a body of known length at its last byte, so
        // the end is the end of the stream or a last frame.
        let ended = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(_)) => self.inner.is_end_stream(),
            Poll::Pending => false,
        };
        if ended && let Some(delivering) = self.delivering.take() {
            delivering.delivery.delivered();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(tools: &[&str]) -> Caller {
        Caller {
            credential: "key:agent".into(),
            tenant_id: "tenant-a".into(),
            principal: crate::domain::Principal {
                id: "user-1".into(),
                scopes: ["demo.use".to_owned()].into(),
            },
            agent: crate::domain::AgentSpec {
                tools: tools.iter().map(|tool| (*tool).to_owned()).collect(),
            },
            origin_trust: crate::domain::TrustLevel::User,
        }
    }

    /// Every id a node keeps is the one any node derives: a credential's
    /// first, the generation it moved to, and a reconfigured credential's
    /// own, never the id it had before.
    #[test]
    fn a_kept_stateless_session_is_the_one_every_node_derives() {
        let derived = |caller: &Caller, generation| {
            let base = stateless_base(caller);
            (stateless_session_id(&base, generation), base)
        };
        let kept = StatelessSessions::default();
        let wide = caller(&["demo.*"]);
        let (id, base) = derived(&wide, 0);
        assert_eq!(kept.start(&wide), (base.as_str().into(), 0, id));
        assert_eq!(kept.start(&wide), (base.as_str().into(), 0, id));
        let (moved, _) = derived(&wide, 3);
        kept.moved(&wide, base.as_str().into(), 3, moved);
        assert_eq!(kept.start(&wide), (base.as_str().into(), 3, moved));
        // The same key, its tools narrowed: its own session from its first
        // generation, as a node that never saw it before derives.
        let narrow = caller(&["demo.echo"]);
        let (own, own_base) = derived(&narrow, 0);
        assert_ne!(own_base, base);
        assert_eq!(kept.start(&narrow), (own_base.as_str().into(), 0, own));
        let mut rescoped = caller(&["demo.echo"]);
        rescoped
            .principal
            .scopes
            .insert("mcp.everything.use".into());
        let (rescoped_id, _) = derived(&rescoped, 0);
        assert_eq!(kept.start(&rescoped).2, rescoped_id);
        assert_ne!(rescoped_id, own);
    }

    #[tokio::test(start_paused = true)]
    async fn a_credential_holds_its_bound_of_sessions_and_abandoned_ones_make_room() {
        let open = OpenSessions::default();
        for _ in 0..2 {
            let (opening, evicted) = open.admit("key:a", 2).unwrap();
            assert_eq!(evicted, None);
            opening.fill(Uuid::new_v4());
        }
        assert!(open.admit("key:a", 2).is_none(), "both in recent use");
        assert!(
            open.admit("key:b", 2).is_some(),
            "another credential is not held back"
        );
        // A place being opened counts until it is filled or given up.
        let held = open.admit("key:c", 1).unwrap();
        assert!(open.admit("key:c", 1).is_none());
        drop(held);
        assert!(open.admit("key:c", 1).is_some());
        // One left unused past the bound, the other used meanwhile: the
        // abandoned one makes room.
        let (abandoned, used) = {
            let all = open.lock();
            let mut ids = all["key:a"].sessions.keys().copied();
            (ids.next().unwrap(), ids.next().unwrap())
        };
        tokio::time::advance(ABANDONED - Duration::from_secs(1)).await;
        open.touch("key:a", used);
        assert!(open.admit("key:a", 2).is_none(), "not abandoned yet");
        tokio::time::advance(Duration::from_secs(2)).await;
        let (opening, evicted) = open.admit("key:a", 2).unwrap();
        assert_eq!(evicted, Some(abandoned));
        opening.fill(Uuid::new_v4());
        assert!(open.admit("key:a", 2).is_none());
        // A day unused, a session has ended and holds no place.
        tokio::time::advance(SESSION_IDLE).await;
        let (_, evicted) = open.admit("key:a", 2).unwrap();
        assert_eq!(evicted, None);
    }

    #[test]
    fn a_sessions_calls_are_capped_withdrawn_and_freed() {
        let calls = Arc::new(CallsInFlight::default());
        let session = Uuid::new_v4();
        let open = CancellationToken::new();
        let first = calls.admit(session, "1".into(), 2, &open).ok().unwrap();
        let Err(Busy::Running(mut done)) = calls.admit(session, "1".into(), 2, &open) else {
            panic!("the same request is running");
        };
        let closing = CancellationToken::new();
        let second = calls.admit(session, "2".into(), 2, &closing).ok().unwrap();
        assert!(matches!(
            calls.admit(session, "3".into(), 2, &open),
            Err(Busy::Full)
        ));
        assert!(
            calls.admit(Uuid::new_v4(), "3".into(), 2, &open).is_ok(),
            "per session"
        );
        calls.withdraw(session, "1");
        assert!(first.withdrawn.is_cancelled());
        assert!(!open.is_cancelled(), "one request's withdrawal only");
        closing.cancel();
        assert!(second.withdrawn.is_cancelled(), "its stream closed");
        drop(first);
        assert!(*done.borrow_and_update());
        assert!(calls.admit(session, "1".into(), 2, &open).is_ok());
    }
}
