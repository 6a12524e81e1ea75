//! The MCP client: the one place an rmcp session is opened (over a child's
//! pipes or over streamable HTTP), spoken to and closed. Everything it hands
//! out is protocol-neutral (`RemoteTool`, `RemoteCall`, JSON values), so no
//! rmcp type leaves `adapters::mcp`.
//!
//! The client advertises no sampling, no roots and no elicitation. A server
//! that asks anyway is answered "method not found", and the request is
//! remembered: a server that then gives up on us has required a declined
//! capability, which the operator sees as `tool.capability_unsupported`
//! rather than as an unreachable server.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

// Sampling and roots are deprecated upstream; we name them only to decline them.
use rmcp::ClientHandler;
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, CreateMessageRequestMethod,
    ElicitRequestParams, ElicitResult, ElicitationCreateRequestMethod, ErrorData,
    GetPromptRequestParams, Implementation, ListRootsRequestMethod, MetaObject,
    PaginatedRequestParams, ProtocolVersion, ReadResourceRequestParams, RequestMetaObject,
};
#[allow(deprecated)]
use rmcp::model::{CreateMessageRequestParams, CreateMessageResult, ListRootsResult};
use rmcp::service::{
    ClientInitializeError, ClientLifecycleMode, ClientServiceExt as _, NotificationContext,
    RequestContext, RoleClient, RunningService, ServiceError,
};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::common::client_side_sse::ExponentialBackoff;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransportConfig, StreamableHttpError,
};
use serde_json::{Map, Value};
use tokio::process::Child;
use tokio::sync::watch;

use super::catalog::RemoteTool;
use super::child::{self, ChildError, ChildSpec};
use super::framing::{Ceilings, Framed};
use super::http::{EgressClient, HttpError};
use crate::domain::ReasonCode;
use crate::ports::Metrics;

/// Most pages of one list a server may return: a server that keeps handing
/// out cursors is a loop, not a catalog.
pub const MAXIMUM_PAGES: usize = 64;
/// Most entries of one list (tools, resources or prompts) kept from a server.
pub const MAXIMUM_ENTRIES: usize = 4096;
/// The `_meta` key a `tools/call` carries its idempotency key under.
pub const IDEMPOTENCY_KEY_META: &str = "toolgate/idempotency-key";
/// Reconnections of one SSE stream before its request fails.
const SSE_RECONNECTS: usize = 3;
/// The longest wait between SSE reconnections.
const SSE_RECONNECT_CEILING: Duration = Duration::from_secs(5);

/// What the server said it offers beyond tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServerFeatures {
    /// It has resources: it gets the one synthetic read tool.
    pub resources: bool,
    /// It has prompts: they become skills.
    pub prompts: bool,
}

/// A resource as a server listed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteResource {
    /// Its URI: the only thing a read may name.
    pub uri: String,
    /// Its name, untrusted.
    pub name: String,
    /// Its media type, when given.
    pub mime_type: Option<String>,
}

/// One argument of a prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptArgument {
    /// Its name.
    pub name: String,
    /// Its description, untrusted.
    pub description: Option<String>,
    /// Whether the prompt needs it.
    pub required: bool,
}

/// A prompt as a server listed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemotePrompt {
    /// Its name.
    pub name: String,
    /// Its description, untrusted.
    pub description: Option<String>,
    /// Its arguments.
    pub arguments: Vec<PromptArgument>,
    /// The server's tools it needs, from `_meta["toolgate/required_tools"]`
    /// (strings only, each bounded, at most [`MAXIMUM_REQUIRED_TOOLS`]).
    pub required_tools: Vec<String>,
}

/// Where a prompt names the tools it needs.
const REQUIRED_TOOLS_META: &str = "toolgate/required_tools";
/// The most required tools a prompt may name; the rest are not read.
const MAXIMUM_REQUIRED_TOOLS: usize = 32;
/// The longest name of a required tool; a longer one is left out.
const MAXIMUM_REQUIRED_TOOL_BYTES: usize = 256;

/// The required tools a prompt's `_meta` names, bounded.
fn required_tools(meta: Option<&rmcp::model::MetaObject>) -> Vec<String> {
    meta.and_then(|meta| meta.0.get(REQUIRED_TOOLS_META))
        .and_then(Value::as_array)
        .map(|names| {
            names
                .iter()
                .filter_map(Value::as_str)
                .filter(|name| !name.is_empty() && name.len() <= MAXIMUM_REQUIRED_TOOL_BYTES)
                .take(MAXIMUM_REQUIRED_TOOLS)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// A `tools/call` answer, in protocol-neutral form.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteCall {
    /// The content blocks, each as the JSON the server sent.
    pub content: Vec<Value>,
    /// The structured result, when any.
    pub structured: Option<Value>,
    /// The server's own error flag.
    pub is_error: bool,
}

/// Why a request to a server did not produce an answer. Nothing the server
/// said is in the message: remote text is external.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The child did not start.
    #[error(transparent)]
    Child(#[from] ChildError),
    /// The handshake did not finish in time.
    #[error("{server_id}: handshake did not finish within the connect timeout")]
    ConnectTimeout {
        /// The server.
        server_id: String,
    },
    /// The handshake failed.
    #[error("{server_id}: handshake failed")]
    Handshake {
        /// The server.
        server_id: String,
    },
    /// The server asked for sampling, roots or elicitation, was refused, and
    /// gave up.
    #[error("{server_id} requires a capability toolgate declines (sampling, roots or elicitation)")]
    CapabilityRequired {
        /// The server.
        server_id: String,
    },
    /// The request did not finish in time.
    #[error("{server_id}: request timed out")]
    RequestTimeout {
        /// The server.
        server_id: String,
    },
    /// A message crossed its output ceiling; the connection was ended.
    #[error("{server_id}: a message crossed the output ceiling")]
    OutputTooLarge {
        /// The server.
        server_id: String,
    },
    /// The connection is gone.
    #[error("{server_id}: connection closed")]
    Closed {
        /// The server.
        server_id: String,
    },
    /// The server answered with a JSON-RPC error.
    #[error("{server_id}: answered with error code {code}")]
    Remote {
        /// The server.
        server_id: String,
        /// The JSON-RPC code.
        code: i32,
        /// What it said: external text, for the envelope only.
        external_text: String,
    },
    /// The server answered with something that is not the answer.
    #[error("{server_id}: answered out of protocol")]
    Protocol {
        /// The server.
        server_id: String,
    },
    /// A list went past [`MAXIMUM_PAGES`] or [`MAXIMUM_ENTRIES`].
    #[error("{server_id}: {what} list longer than toolgate accepts")]
    TooLong {
        /// The server.
        server_id: String,
        /// Which list.
        what: &'static str,
    },
    /// The server answered 401. `delegated` when its challenge points to
    /// OAuth resource metadata: a user-delegated flow toolgate declines.
    #[error("{server_id}: the server refused our credential")]
    Unauthorized {
        /// The server.
        server_id: String,
        /// The challenge asked for a user-delegated flow.
        delegated: bool,
    },
    /// No credential could be had (the reference did not resolve, or the
    /// token endpoint refused or could not be reached); nothing was sent.
    #[error("{server_id}: no credential: {source}")]
    Credential {
        /// The server.
        server_id: String,
        /// Why.
        source: super::auth::AuthError,
    },
    /// Egress refused or could not open the connection; nothing was sent.
    #[error("{server_id}: {source}")]
    Egress {
        /// The server.
        server_id: String,
        /// Why.
        source: crate::ports::DialError,
    },
    /// The server answered with a redirect, which is never followed.
    #[error("{server_id}: the server answered with a redirect, which egress does not follow")]
    Redirected {
        /// The server.
        server_id: String,
    },
}

impl ClientError {
    /// The stable code an outcome or a `mcp.server.disconnected` event
    /// carries for this error.
    pub fn reason_code(&self) -> ReasonCode {
        match self {
            ClientError::Child(_)
            | ClientError::ConnectTimeout { .. }
            | ClientError::Handshake { .. }
            | ClientError::Closed { .. } => ReasonCode::ToolServerUnreachable,
            ClientError::CapabilityRequired { .. } => ReasonCode::ToolCapabilityUnsupported,
            ClientError::OutputTooLarge { .. } => ReasonCode::ToolOutputTooLarge,
            ClientError::RequestTimeout { .. } => ReasonCode::ToolTimeout,
            ClientError::Remote { .. }
            | ClientError::Protocol { .. }
            | ClientError::TooLong { .. } => ReasonCode::ToolUpstreamError,
            ClientError::Unauthorized {
                delegated: true, ..
            } => ReasonCode::ToolAuthUnsupported,
            ClientError::Unauthorized { .. } => ReasonCode::ToolAuthFailed,
            ClientError::Credential { source, .. } => source.reason_code(),
            ClientError::Egress { source, .. } => source.reason_code(),
            ClientError::Redirected { .. } => ReasonCode::ToolRedirectRefused,
        }
    }

    /// Whether the connection is unusable after this error. One malformed
    /// answer (a result of the wrong shape, a listing too long) is that
    /// request's failure: the stream is still framed, and the next call is
    /// served on it rather than paying a reconnection.
    pub fn is_fatal(&self) -> bool {
        !matches!(
            self,
            ClientError::Remote { .. }
                | ClientError::RequestTimeout { .. }
                | ClientError::Unauthorized { .. }
                | ClientError::Credential { .. }
                | ClientError::Protocol { .. }
                | ClientError::TooLong { .. }
        )
    }

    /// Whether the request provably never left: a failure that proves no
    /// effect.
    pub fn never_sent(&self) -> bool {
        matches!(
            self,
            ClientError::Credential { .. } | ClientError::Egress { .. }
        )
    }

    /// The HTTP failure under a session's error, in protocol-neutral form.
    fn from_http(server_id: &str, error: &(dyn std::error::Error + 'static)) -> Option<Self> {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
        while let Some(current) = cause {
            if let Some(http) = current.downcast_ref::<StreamableHttpError<HttpError>>() {
                let server_id = server_id.to_owned();
                return Some(match http {
                    StreamableHttpError::AuthRequired(challenge) => ClientError::Unauthorized {
                        server_id,
                        delegated: challenge
                            .www_authenticate_header
                            .to_ascii_lowercase()
                            .contains("resource_metadata"),
                    },
                    StreamableHttpError::Client(HttpError::Redirect) => {
                        ClientError::Redirected { server_id }
                    }
                    StreamableHttpError::Client(HttpError::Dial(source)) => ClientError::Egress {
                        server_id,
                        source: source.clone(),
                    },
                    StreamableHttpError::Client(HttpError::Auth(source)) => {
                        ClientError::Credential {
                            server_id,
                            source: source.clone(),
                        }
                    }
                    StreamableHttpError::Client(HttpError::TooLarge)
                    | StreamableHttpError::ResponseBodyTooLarge { .. } => {
                        ClientError::OutputTooLarge { server_id }
                    }
                    StreamableHttpError::Client(HttpError::Timeout) => {
                        ClientError::RequestTimeout { server_id }
                    }
                    _ => ClientError::Closed { server_id },
                });
            }
            cause = current.source();
        }
        None
    }
}

/// What the handler saw, shared with the connection.
#[derive(Debug)]
struct Signals {
    declined: AtomicBool,
    list_changed: watch::Sender<u64>,
    /// The server closed its output (it exited, or broke the pipe).
    ended: watch::Sender<bool>,
}

impl Signals {
    fn new() -> Arc<Self> {
        Arc::new(Signals {
            declined: AtomicBool::new(false),
            list_changed: watch::channel(0).0,
            ended: watch::channel(false).0,
        })
    }
}

/// The client side of the session: declines, remembers and counts.
#[derive(Clone)]
struct Client {
    signals: Arc<Signals>,
}

#[allow(deprecated)] // sampling and roots are deprecated upstream; we decline them
impl ClientHandler for Client {
    async fn create_message(
        &self,
        _params: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        self.signals.declined.store(true, Ordering::Relaxed);
        Err(ErrorData::method_not_found::<CreateMessageRequestMethod>())
    }

    async fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        self.signals.declined.store(true, Ordering::Relaxed);
        Err(ErrorData::method_not_found::<ListRootsRequestMethod>())
    }

    async fn create_elicitation(
        &self,
        _request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        self.signals.declined.store(true, Ordering::Relaxed);
        Err(ErrorData::method_not_found::<ElicitationCreateRequestMethod>())
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        // A counter, not a queue: a flood of notifications costs one add each.
        self.signals
            .list_changed
            .send_modify(|count| *count = count.wrapping_add(1));
    }

    fn get_info(&self) -> ClientConfig {
        let mut config = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("toolgate", env!("CARGO_PKG_VERSION")),
        );
        // The newest version negotiated with `initialize`, on both
        // transports: later ones replace the handshake toolgate speaks.
        config.protocol_version = ProtocolVersion::V_2025_11_25;
        config
    }
}

/// A handshake that failed, and whether the server answered `initialize`
/// with a JSON-RPC error, as a server of 2026-07-28 alone does.
struct Unopened {
    error: ClientError,
    initialize_refused: bool,
}

impl From<ClientError> for Unopened {
    fn from(error: ClientError) -> Self {
        Unopened {
            error,
            initialize_refused: false,
        }
    }
}

fn refused_initialize(error: &ClientInitializeError) -> bool {
    matches!(error, ClientInitializeError::JsonRpcError(_))
}

/// The handshake with a server of 2026-07-28 alone: `server/discover`, then
/// every request carries its revision and toolgate's capabilities.
fn discover() -> ClientLifecycleMode {
    ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    }
}

/// A stdio server's process: what a connection over its pipes owns.
struct Process {
    child: Child,
    /// The child's process group while it may still have members; cleared
    /// once `close` has ended it.
    group: Option<i32>,
}

impl Drop for Process {
    fn drop(&mut self) {
        // A connection dropped without `close` (a dead server forgotten, a
        // cancelled preparation) still ends everything its child started.
        // The unreaped leader keeps the group id from being reused.
        if let Some(group) = self.group.take() {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(group),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// One live session with one server. Over stdio it owns the child:
/// dropping it kills the process group, `close` ends it gracefully first.
/// Over HTTP, `close` ends the session (rmcp sends its DELETE).
pub struct Connection {
    server_id: String,
    service: RunningService<RoleClient, Client>,
    process: Option<Process>,
    features: ServerFeatures,
    signals: Arc<Signals>,
    /// How long a message may be, and whether one was longer.
    ceilings: Arc<Ceilings>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("server_id", &self.server_id)
            .field("features", &self.features)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Spawns the child from `spec` and runs the handshake within
    /// `connect_timeout`: `initialize`, and when the server refuses it, a
    /// new child asked `server/discover` (a server of 2026-07-28 alone).
    pub async fn open(
        spec: &ChildSpec,
        connect_timeout: Duration,
        hard_ceiling: usize,
        metrics: Arc<dyn Metrics>,
    ) -> Result<Self, ClientError> {
        let opened = Self::open_as(
            spec,
            connect_timeout,
            hard_ceiling,
            metrics.clone(),
            ClientLifecycleMode::Initialize,
        )
        .await;
        match opened {
            Err(unopened) if unopened.initialize_refused => {
                Self::open_as(spec, connect_timeout, hard_ceiling, metrics, discover())
                    .await
                    .map_err(|unopened| unopened.error)
            }
            opened => opened.map_err(|unopened| unopened.error),
        }
    }

    /// One child and its handshake. The stderr drain starts before the
    /// handshake so a chatty child cannot block on a full pipe.
    async fn open_as(
        spec: &ChildSpec,
        connect_timeout: Duration,
        hard_ceiling: usize,
        metrics: Arc<dyn Metrics>,
        lifecycle: ClientLifecycleMode,
    ) -> Result<Self, Unopened> {
        let server_id = spec.server_id.clone();
        let mut child = child::spawn(spec).map_err(ClientError::from)?;
        let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
            child::terminate(&mut child, Duration::ZERO).await;
            return Err(ClientError::Handshake { server_id }.into());
        };
        if let Some(stderr) = child.stderr.take() {
            let secrets = spec
                .credential
                .iter()
                .map(|(_, value)| value.clone())
                .collect();
            tokio::spawn(child::drain_stderr(
                server_id.clone(),
                stderr,
                secrets,
                metrics,
            ));
        }
        let signals = Signals::new();
        let client = Client {
            signals: signals.clone(),
        };
        // toolgate frames the server's output itself, so no line it writes
        // is read past the ceiling of what is in flight.
        let ceilings = Ceilings::new(hard_ceiling);
        let ended = signals.clone();
        let transport = Framed::new(stdout, stdin, ceilings.clone(), move || {
            ended.ended.send_replace(true);
        });
        let handshake = {
            let _listing = ceilings.listing();
            tokio::time::timeout(
                connect_timeout,
                client.serve_with_lifecycle(transport, lifecycle),
            )
            .await
        };
        let service = match handshake {
            Ok(Ok(service)) => service,
            Ok(Err(error)) => {
                child::terminate(&mut child, Duration::from_millis(200)).await;
                return Err(Unopened {
                    initialize_refused: refused_initialize(&error),
                    error: if signals.declined.load(Ordering::Relaxed) {
                        ClientError::CapabilityRequired { server_id }
                    } else {
                        ClientError::Handshake { server_id }
                    },
                });
            }
            Err(_) => {
                child::terminate(&mut child, Duration::from_millis(200)).await;
                return Err(ClientError::ConnectTimeout { server_id }.into());
            }
        };
        let features = service
            .peer()
            .peer_info()
            .map(|info| ServerFeatures {
                resources: info.capabilities.resources.is_some(),
                prompts: info.capabilities.prompts.is_some(),
            })
            .unwrap_or_default();
        let group = child.id().and_then(|id| i32::try_from(id).ok());
        Ok(Connection {
            server_id,
            service,
            process: Some(Process { child, group }),
            features,
            signals,
            ceilings,
        })
    }

    /// Opens a streamable-HTTP session to `url` through `client` and runs
    /// the handshake within `connect_timeout`: `initialize`, and when the
    /// server refuses it, `server/discover` (a server of 2026-07-28 alone,
    /// then asked request by request). A 404 on a session is never
    /// answered by re-initializing and re-sending: a call is sent once.
    pub async fn open_http(
        server_id: &str,
        client: EgressClient,
        url: &str,
        connect_timeout: Duration,
        ceilings: Arc<Ceilings>,
    ) -> Result<Self, ClientError> {
        let opened = Self::open_http_as(
            server_id,
            client.clone(),
            url,
            connect_timeout,
            ceilings.clone(),
            ClientLifecycleMode::Initialize,
        )
        .await;
        match opened {
            Err(unopened) if unopened.initialize_refused => Self::open_http_as(
                server_id,
                client,
                url,
                connect_timeout,
                ceilings,
                discover(),
            )
            .await
            .map_err(|unopened| unopened.error),
            opened => opened.map_err(|unopened| unopened.error),
        }
    }

    async fn open_http_as(
        server_id: &str,
        client: EgressClient,
        url: &str,
        connect_timeout: Duration,
        ceilings: Arc<Ceilings>,
        lifecycle: ClientLifecycleMode,
    ) -> Result<Self, Unopened> {
        let mut config = StreamableHttpClientTransportConfig::with_uri(url);
        config.reinit_on_expired_session = false;
        let mut backoff = ExponentialBackoff::default();
        backoff.max_times = Some(SSE_RECONNECTS);
        backoff.max_delay = Some(SSE_RECONNECT_CEILING);
        config.retry_config = Arc::new(backoff);
        let transport = StreamableHttpClientTransport::with_client(client, config);
        let signals = Signals::new();
        let handler = Client {
            signals: signals.clone(),
        };
        let handshake = {
            let _listing = ceilings.listing();
            tokio::time::timeout(
                connect_timeout,
                handler.serve_with_lifecycle(transport, lifecycle),
            )
            .await
        };
        let server_id = server_id.to_owned();
        let service = match handshake {
            Ok(Ok(service)) => service,
            Ok(Err(error)) => {
                return Err(Unopened {
                    initialize_refused: refused_initialize(&error),
                    error: initialize_error(server_id, &error, &signals),
                });
            }
            Err(_) => return Err(ClientError::ConnectTimeout { server_id }.into()),
        };
        let features = service
            .peer()
            .peer_info()
            .map(|info| ServerFeatures {
                resources: info.capabilities.resources.is_some(),
                prompts: info.capabilities.prompts.is_some(),
            })
            .unwrap_or_default();
        Ok(Connection {
            server_id,
            service,
            process: None,
            features,
            signals,
            ceilings,
        })
    }

    /// What the server offers beyond tools.
    pub fn features(&self) -> ServerFeatures {
        self.features
    }

    /// The head of the answer that crossed the output ceiling (up to it),
    /// once: kept so the call it answered can keep it as an artifact.
    pub fn runaway_head(&self) -> Option<Vec<u8>> {
        self.ceilings.take_head()
    }

    /// Whether the session has ended (the server exited or the pipe broke).
    pub fn is_closed(&self) -> bool {
        self.service.is_closed()
            || self.service.peer().is_transport_closed()
            || *self.signals.ended.borrow()
    }

    /// Becomes true when the server closes its output; only a stdio
    /// server's does.
    pub fn ended(&self) -> watch::Receiver<bool> {
        self.signals.ended.subscribe()
    }

    /// Ticks once per `notifications/tools/list_changed`.
    pub fn list_changes(&self) -> watch::Receiver<u64> {
        self.signals.list_changed.subscribe()
    }

    /// Every page of `tools/list`, within `timeout` per page.
    pub async fn list_tools(&self, timeout: Duration) -> Result<Vec<RemoteTool>, ClientError> {
        self.every_page(
            "tool",
            timeout,
            |cursor| self.service.peer().list_tools(cursor),
            |page| {
                let tools = page.tools.into_iter().map(|tool| RemoteTool {
                    name: tool.name.into_owned(),
                    description: tool.description.map(|text| text.into_owned()),
                    input_schema: Value::Object((*tool.input_schema).clone()),
                    output_schema: tool
                        .output_schema
                        .map(|schema| Value::Object((*schema).clone())),
                    meta: tool
                        .meta
                        .and_then(|meta| serde_json::to_value(meta).ok())
                        .and_then(|meta| match meta {
                            Value::Object(map) => Some(map),
                            _ => None,
                        }),
                });
                Ok((tools.collect(), page.next_cursor))
            },
        )
        .await
    }

    /// Every page of `resources/list`.
    pub async fn list_resources(
        &self,
        timeout: Duration,
    ) -> Result<Vec<RemoteResource>, ClientError> {
        self.every_page(
            "resource",
            timeout,
            |cursor| self.service.peer().list_resources(cursor),
            |page| {
                let resources = page.resources.iter().map(|resource| {
                    let value = serde_json::to_value(resource).map_err(|_| self.protocol())?;
                    let text =
                        |key: &str| value.get(key).and_then(Value::as_str).map(str::to_owned);
                    Ok::<_, ClientError>(RemoteResource {
                        uri: text("uri").ok_or_else(|| self.protocol())?,
                        name: text("name").unwrap_or_default(),
                        mime_type: text("mimeType"),
                    })
                });
                Ok((resources.collect::<Result<_, _>>()?, page.next_cursor))
            },
        )
        .await
    }

    /// `resources/read`: the contents, each as the JSON the server sent.
    pub async fn read_resource(
        &self,
        uri: &str,
        timeout: Duration,
    ) -> Result<Vec<Value>, ClientError> {
        let _calling = self.ceilings.calling();
        let result = self
            .request(
                timeout,
                self.service
                    .peer()
                    .read_resource(ReadResourceRequestParams::new(uri)),
            )
            .await?;
        result
            .contents
            .iter()
            .map(|content| serde_json::to_value(content).map_err(|_| self.protocol()))
            .collect()
    }

    /// Every page of `prompts/list`.
    pub async fn list_prompts(&self, timeout: Duration) -> Result<Vec<RemotePrompt>, ClientError> {
        self.every_page(
            "prompt",
            timeout,
            |cursor| self.service.peer().list_prompts(cursor),
            |page| {
                let prompts = page.prompts.into_iter().map(|prompt| RemotePrompt {
                    required_tools: required_tools(prompt.meta.as_ref()),
                    name: prompt.name,
                    description: prompt.description,
                    arguments: prompt
                        .arguments
                        .unwrap_or_default()
                        .into_iter()
                        .map(|argument| PromptArgument {
                            name: argument.name,
                            description: argument.description,
                            required: argument.required.unwrap_or(false),
                        })
                        .collect(),
                });
                Ok((prompts.collect(), page.next_cursor))
            },
        )
        .await
    }

    /// Every page of one list, within `timeout` a page, under the listing
    /// ceiling: `fetch` asks for the page after a cursor, `entries` makes a
    /// page its entries and the next cursor. At most [`MAXIMUM_PAGES`]
    /// pages and [`MAXIMUM_ENTRIES`] entries of `kind`.
    async fn every_page<Page, Entry, Asked>(
        &self,
        kind: &'static str,
        timeout: Duration,
        fetch: impl Fn(Option<PaginatedRequestParams>) -> Asked,
        entries: impl Fn(Page) -> Result<(Vec<Entry>, Option<String>), ClientError>,
    ) -> Result<Vec<Entry>, ClientError>
    where
        Asked: Future<Output = Result<Page, ServiceError>>,
    {
        let _listing = self.ceilings.listing();
        let mut all = Vec::new();
        let mut cursor = None;
        for _ in 0..MAXIMUM_PAGES {
            let page = self.request(timeout, fetch(page(cursor))).await?;
            let (mut got, next) = entries(page)?;
            all.append(&mut got);
            if all.len() > MAXIMUM_ENTRIES {
                return Err(self.too_long(kind));
            }
            match next {
                Some(next) => cursor = Some(next),
                None => return Ok(all),
            }
        }
        Err(self.too_long(kind))
    }

    /// `prompts/get`: the messages, each as the JSON the server sent.
    pub async fn get_prompt(
        &self,
        name: &str,
        arguments: Map<String, Value>,
        timeout: Duration,
    ) -> Result<Vec<Value>, ClientError> {
        let _calling = self.ceilings.calling();
        let result = self
            .request(
                timeout,
                self.service.peer().get_prompt(
                    GetPromptRequestParams::new(name.to_owned()).with_arguments(arguments),
                ),
            )
            .await?;
        result
            .messages
            .iter()
            .map(|message| serde_json::to_value(message).map_err(|_| self.protocol()))
            .collect()
    }

    /// `tools/call` within `timeout`, carrying the call's idempotency key
    /// verbatim in `_meta` under [`IDEMPOTENCY_KEY_META`], so a server that
    /// honours keys can deduplicate a recovery's re-send.
    pub async fn call_tool(
        &self,
        name: &str,
        arguments: Map<String, Value>,
        idempotency_key: &str,
        timeout: Duration,
    ) -> Result<RemoteCall, ClientError> {
        let mut meta = Map::new();
        meta.insert(
            IDEMPOTENCY_KEY_META.to_owned(),
            Value::String(idempotency_key.to_owned()),
        );
        let mut params = CallToolRequestParams::new(name.to_owned()).with_arguments(arguments);
        params.meta = Some(RequestMetaObject(MetaObject(meta)));
        let _calling = self.ceilings.calling();
        let result = self
            .request(timeout, self.service.peer().call_tool(params))
            .await?;
        let content = result
            .content
            .iter()
            .map(|block| serde_json::to_value(block).map_err(|_| self.protocol()))
            .collect::<Result<Vec<Value>, ClientError>>()?;
        Ok(RemoteCall {
            content,
            structured: result.structured_content,
            is_error: result.is_error.unwrap_or(false),
        })
    }

    /// Ends the session: the pipe closes, then the whole process group gets
    /// SIGTERM and, after `grace`, SIGKILL; over HTTP the session is ended.
    pub async fn close(mut self, grace: Duration) {
        let _ = self.service.close_with_timeout(grace).await;
        if let Some(mut process) = self.process.take() {
            child::terminate(&mut process.child, grace).await;
            process.group = None;
        }
    }

    async fn request<T>(
        &self,
        timeout: Duration,
        request: impl Future<Output = Result<T, ServiceError>>,
    ) -> Result<T, ClientError> {
        match tokio::time::timeout(timeout, request).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(error)) => Err(self.service_error(error)),
            Err(_) => Err(ClientError::RequestTimeout {
                server_id: self.server_id.clone(),
            }),
        }
    }

    fn service_error(&self, error: ServiceError) -> ClientError {
        let server_id = self.server_id.clone();
        if let ServiceError::TransportSend(transport) = &error
            && let Some(http) = ClientError::from_http(&server_id, transport)
        {
            return http;
        }
        match error {
            // rmcp's word that an HTTP response stream ended before its
            // answer: the connection, not the server, failed.
            ServiceError::McpError(error) if closed_stream(&error) => {
                if self.ceilings.oversized() {
                    ClientError::OutputTooLarge { server_id }
                } else {
                    ClientError::Closed { server_id }
                }
            }
            ServiceError::McpError(error) => ClientError::Remote {
                server_id,
                code: error.code.0,
                external_text: error.message.into_owned(),
            },
            ServiceError::Timeout { .. } => ClientError::RequestTimeout { server_id },
            ServiceError::UnexpectedResponse | ServiceError::InputRequiredRoundsExceeded { .. } => {
                ClientError::Protocol { server_id }
            }
            _ if self.signals.declined.load(Ordering::Relaxed) => {
                ClientError::CapabilityRequired { server_id }
            }
            _ if self.ceilings.oversized() => ClientError::OutputTooLarge { server_id },
            _ => ClientError::Closed { server_id },
        }
    }

    fn protocol(&self) -> ClientError {
        ClientError::Protocol {
            server_id: self.server_id.clone(),
        }
    }

    fn too_long(&self, what: &'static str) -> ClientError {
        ClientError::TooLong {
            server_id: self.server_id.clone(),
            what,
        }
    }
}

/// rmcp's marker on the error it answers a request with when the HTTP
/// stream carrying it closed first.
fn closed_stream(error: &ErrorData) -> bool {
    error
        .data
        .as_ref()
        .and_then(|data| data.get("io.modelcontextprotocol/transportClosed"))
        .is_some()
}

/// A failed HTTP handshake as a protocol-neutral error.
fn initialize_error(
    server_id: String,
    error: &ClientInitializeError,
    signals: &Signals,
) -> ClientError {
    // rmcp keeps the transport's error beside, not under, its own.
    if let ClientInitializeError::TransportError { error, .. } = error
        && let Some(http) = ClientError::from_http(&server_id, error)
    {
        return http;
    }
    if signals.declined.load(Ordering::Relaxed) {
        ClientError::CapabilityRequired { server_id }
    } else {
        ClientError::Handshake { server_id }
    }
}

fn page(cursor: Option<String>) -> Option<PaginatedRequestParams> {
    Some(PaginatedRequestParams::default().with_cursor(cursor))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(required: Value) -> rmcp::model::MetaObject {
        let mut map = serde_json::Map::new();
        map.insert(REQUIRED_TOOLS_META.to_owned(), required);
        rmcp::model::MetaObject(map)
    }

    #[test]
    fn required_tools_are_strings_bounded_in_length_and_count() {
        assert!(required_tools(None).is_empty());
        for hostile in [
            Value::Null,
            serde_json::json!("echo"),
            serde_json::json!({"echo": true}),
            serde_json::json!(7),
        ] {
            assert!(required_tools(Some(&meta(hostile))).is_empty());
        }
        let mixed = serde_json::json!(["echo", 5, null, "", "x".repeat(257), {"a": 1}, "search"]);
        assert_eq!(required_tools(Some(&meta(mixed))), ["echo", "search"]);
        let many: Vec<String> = (0..1000).map(|i| format!("tool_{i}")).collect();
        let kept = required_tools(Some(&meta(serde_json::json!(many))));
        assert_eq!(kept.len(), MAXIMUM_REQUIRED_TOOLS);
        assert_eq!(kept[0], "tool_0");
    }
}
