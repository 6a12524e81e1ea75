//! One MCP server, over stdio or streamable HTTP: its remembered discovery
//! (the pin), its one live connection, the `Tool`s the pipeline calls, and
//! for HTTP the per-session 401 ladder.
//!
//! The pin never moves. A `notifications/tools/list_changed` is listed,
//! recorded as `mcp.catalog.changed` and not applied; a tool whose
//! declaration has since disappeared or changed answers `tool.withdrawn`
//! without dialling; a dead server answers `tool.server_unreachable` and is
//! redialled by the next call, whose discovery is compared with the pin.
//!
//! A 401 on a call climbs the design's ladder once per server per session:
//! the call is held, the credential obtained again, a byte-identical value
//! (or none) stops the ladder, and the call is retried once only where the
//! recovery table allows it; after that the session's calls to the server
//! answer `tool.server_unauthorized` without dialling.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use tokio::sync::Semaphore;
use tracing::Instrument as _;
use uuid::Uuid;

use super::auth::{AuthSettings, Authenticator};
use super::catalog::{RemoteTool, catalog_hash, map_catalog};
use super::child::{ChildSpec, RunAs};
use super::client::{ClientError, Connection, RemoteCall, RemotePrompt, RemoteResource};
use super::framing::Ceilings;
use super::http::EgressClient;
use super::render::{
    READ_RESOURCE, by_name, read_resource_spec, render_blocks, render_call, skill_metadata,
    unauthorized, unreachable, withdrawn,
};
use crate::domain::mcp_server::{AuthScheme, ServerClassification, Transport};
use crate::domain::names::mcp_registry_name;
use crate::domain::recovery::{RecoveryDecision, decide};
use crate::domain::secret::{CredentialRef, scrub};
use crate::domain::{
    ContentPart, ReasonCode, SecretValue, SkillMetadata, ToolFailure, ToolFailureKind, ToolResult,
    ToolSpec,
};
use crate::ports::metrics::Metrics;
use crate::ports::{
    BoxFuture, Clock, CredentialResolver, DiscoveredTool, DiscoveryOutcome, EgressDialer,
    LoadedSkill, McpServerRow, PlatformEvent, ServerDiscovery, Store, Tool, ToolExecutionContext,
};

/// How long a closing child gets between SIGTERM and SIGKILL.
pub const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// How long a burst of list-changed notifications is gathered into one look.
pub const LIST_CHANGED_COALESCE: Duration = Duration::from_millis(250);
/// Sessions whose ladder state one server remembers; the oldest go first.
const LADDER_SESSIONS: usize = 65_536;

/// One stdio server as the operator configured it.
#[derive(Debug, Clone)]
pub struct StdioServerSettings {
    /// The name in `mcp.{server_id}.`.
    pub server_id: String,
    /// The program.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Declared non-secret variables.
    pub env: BTreeMap<String, String>,
    /// `none` or `env` on stdio.
    pub auth_scheme: AuthScheme,
    /// The variable the credential goes in, for `env`.
    pub auth_name: Option<String>,
    /// Where the credential lives, for `env`.
    pub credential_ref: Option<CredentialRef>,
    /// The operator's classification of every tool.
    pub classification: ServerClassification,
    /// Handshake deadline.
    pub connect_timeout: Duration,
    /// Per-request deadline (the tool's and the run's cap it further).
    pub request_timeout: Duration,
    /// Close a connection unused this long.
    pub idle_timeout: Duration,
    /// Spawned at all.
    pub enabled: bool,
    /// This server's state folder (its HOME).
    pub state_dir: PathBuf,
    /// The user it runs as; toolgate's own when `None`.
    pub run_as: Option<RunAs>,
    /// Its `PATH`; the system's program folders when `None`.
    pub path: Option<String>,
}

impl StdioServerSettings {
    fn row(&self) -> McpServerRow {
        let mut endpoint = self.program.clone();
        for arg in &self.args {
            endpoint.push(' ');
            endpoint.push_str(arg);
        }
        McpServerRow {
            server_id: self.server_id.clone(),
            transport: Transport::Stdio,
            endpoint,
            auth_scheme: self.auth_scheme,
            auth_name: self.auth_name.clone(),
            credential_ref: self.credential_ref.as_ref().map(ToString::to_string),
            token_endpoint: None,
            token_scopes: None,
            side_effect: self.classification.side_effect,
            risk: self.classification.risk,
            idempotency: self.classification.idempotency,
            required_scopes: self
                .classification
                .required_scopes
                .iter()
                .cloned()
                .collect(),
            timeout_seconds: self.classification.timeout_seconds,
            maximum_output_bytes: self.classification.maximum_output_bytes,
            enabled: self.enabled,
        }
    }
}

/// One streamable-HTTP server, the operator's or a tenant's.
#[derive(Debug, Clone)]
pub struct HttpServerSettings {
    /// The name in `mcp.{server_id}.`.
    pub server_id: String,
    /// The endpoint, dialled only through egress.
    pub url: String,
    /// How toolgate authenticates to it.
    pub auth: AuthSettings,
    /// The classification of every tool.
    pub classification: ServerClassification,
    /// Handshake deadline.
    pub connect_timeout: Duration,
    /// Per-request deadline (the tool's and the run's cap it further); also
    /// how long an answer's head may take.
    pub request_timeout: Duration,
    /// Close a connection unused this long.
    pub idle_timeout: Duration,
    /// Dialled at all.
    pub enabled: bool,
}

impl HttpServerSettings {
    fn row(&self) -> McpServerRow {
        McpServerRow {
            server_id: self.server_id.clone(),
            transport: Transport::Http,
            endpoint: self.url.clone(),
            auth_scheme: self.auth.scheme,
            auth_name: self.auth.name.clone(),
            credential_ref: self.auth.credential_ref.as_ref().map(ToString::to_string),
            token_endpoint: self.auth.token_endpoint.clone(),
            token_scopes: (!self.auth.token_scopes.is_empty())
                .then(|| self.auth.token_scopes.clone()),
            side_effect: self.classification.side_effect,
            risk: self.classification.risk,
            idempotency: self.classification.idempotency,
            required_scopes: self
                .classification
                .required_scopes
                .iter()
                .cloned()
                .collect(),
            timeout_seconds: self.classification.timeout_seconds,
            maximum_output_bytes: self.classification.maximum_output_bytes,
            enabled: self.enabled,
        }
    }
}

/// How a server is reached.
enum Endpoint {
    Stdio(StdioServerSettings),
    Http {
        settings: HttpServerSettings,
        dialer: Arc<dyn EgressDialer>,
        authenticator: Arc<Authenticator>,
    },
}

/// What every server shares with its set.
#[derive(Clone)]
pub(super) struct Shared {
    pub(super) credentials: Arc<dyn CredentialResolver>,
    pub(super) store: Arc<dyn Store>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) metrics: Arc<dyn Metrics>,
}

/// A discovery this process remembers: the pin every later session reuses.
struct Remembered {
    catalog_hash: String,
    resources: Vec<RemoteResource>,
    prompts: Vec<(SkillMetadata, RemotePrompt)>,
    discovery: ServerDiscovery,
    at: Instant,
}

/// Where one session stands on one server's 401 ladder; no entry is the
/// foot of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ladder {
    /// The one re-authentication has run.
    Reauthenticated,
    /// Step 5: every call answers `tool.server_unauthorized` undialled.
    Unauthorized,
}

/// The ladder states of one server's sessions, the oldest forgotten first.
#[derive(Default)]
struct Ladders {
    states: HashMap<Uuid, Ladder>,
    order: std::collections::VecDeque<Uuid>,
}

impl Ladders {
    fn get(&self, session: Uuid) -> Option<Ladder> {
        self.states.get(&session).copied()
    }

    fn set(&mut self, session: Uuid, state: Ladder) {
        if self.states.insert(session, state).is_none() {
            self.order.push_back(session);
            while self.order.len() > LADDER_SESSIONS {
                if let Some(oldest) = self.order.pop_front() {
                    self.states.remove(&oldest);
                }
            }
        }
    }
}

/// The least time between two background restarts of one stdio server.
const RESTART_SPACING: Duration = Duration::from_secs(5);

/// One server: how it is reached, its one live connection, its pin.
pub struct McpServer {
    endpoint: Endpoint,
    row: McpServerRow,
    /// The tenant whose server it is; `None` for the operator's.
    owner: Option<String>,
    /// How long a discovery is pinned without connecting; `None` for the
    /// life of the process.
    reuse: Option<Duration>,
    shared: Shared,
    live: tokio::sync::Mutex<Option<Arc<Connection>>>,
    /// Held across a live discovery: a preparation arriving while the
    /// warm-up (or another preparation) discovers waits for its pin rather
    /// than making a second handshake.
    discovering: tokio::sync::Mutex<()>,
    remembered: Mutex<Option<Arc<Remembered>>>,
    /// The newest listing seen after the pin, by remote name.
    current: Mutex<Option<HashMap<String, RemoteTool>>>,
    last_used: Mutex<Instant>,
    /// The credential a stdio child was given: scrubbed from everything
    /// the server returns, since a server can echo its own environment.
    credential: Mutex<Option<SecretValue>>,
    /// When the server was last started again after a failure.
    last_restart: Mutex<Option<Instant>>,
    ladders: Mutex<Ladders>,
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere leaves plain data behind; it is still usable.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl McpServer {
    fn new(
        endpoint: Endpoint,
        owner: Option<String>,
        reuse: Option<Duration>,
        shared: Shared,
    ) -> Self {
        let row = match &endpoint {
            Endpoint::Stdio(settings) => settings.row(),
            Endpoint::Http { settings, .. } => settings.row(),
        };
        McpServer {
            endpoint,
            row,
            owner,
            reuse,
            shared,
            live: tokio::sync::Mutex::new(None),
            discovering: tokio::sync::Mutex::new(()),
            remembered: Mutex::new(None),
            current: Mutex::new(None),
            last_used: Mutex::new(Instant::now()),
            credential: Mutex::new(None),
            last_restart: Mutex::new(None),
            ladders: Mutex::new(Ladders::default()),
        }
    }

    /// An operator's stdio server; its discovery is pinned for the life of
    /// the process.
    pub(super) fn stdio(settings: StdioServerSettings, shared: Shared) -> Self {
        McpServer::new(Endpoint::Stdio(settings), None, None, shared)
    }

    /// An HTTP server, the operator's (`owner` `None`) or a tenant's; its
    /// discovery is pinned for at most `reuse`.
    pub(super) fn http(
        settings: HttpServerSettings,
        owner: Option<String>,
        reuse: Duration,
        dialer: Arc<dyn EgressDialer>,
        shared: Shared,
    ) -> Self {
        let authenticator = Arc::new(Authenticator::new(
            settings.auth.clone(),
            shared.credentials.clone(),
            dialer.clone(),
            shared.clock.clone(),
        ));
        McpServer::new(
            Endpoint::Http {
                settings,
                dialer,
                authenticator,
            },
            owner,
            Some(reuse),
            shared,
        )
    }

    /// The server's id.
    pub fn server_id(&self) -> &str {
        &self.row.server_id
    }

    /// The server as configured.
    pub(super) fn row(&self) -> &McpServerRow {
        &self.row
    }

    /// Whether it is spawned or dialled at all.
    pub(super) fn enabled(&self) -> bool {
        self.row.enabled
    }

    fn transport(&self) -> Transport {
        self.row.transport
    }

    fn classification(&self) -> &ServerClassification {
        match &self.endpoint {
            Endpoint::Stdio(settings) => &settings.classification,
            Endpoint::Http { settings, .. } => &settings.classification,
        }
    }

    fn server_request_timeout(&self) -> Duration {
        match &self.endpoint {
            Endpoint::Stdio(settings) => settings.request_timeout,
            Endpoint::Http { settings, .. } => settings.request_timeout,
        }
    }

    pub(super) fn idle_timeout(&self) -> Duration {
        match &self.endpoint {
            Endpoint::Stdio(settings) => settings.idle_timeout,
            Endpoint::Http { settings, .. } => settings.idle_timeout,
        }
    }

    /// Whether it starts a process (and so takes a process-startup slot).
    pub(super) fn spawns(&self) -> bool {
        matches!(self.endpoint, Endpoint::Stdio(_))
    }

    /// The credential in use: redacted from whatever the server returns.
    fn secret(&self) -> Option<SecretValue> {
        match &self.endpoint {
            Endpoint::Stdio(_) => lock(&self.credential).clone(),
            Endpoint::Http { authenticator, .. } => authenticator.current(),
        }
    }

    fn connect_timeout(&self) -> Duration {
        match &self.endpoint {
            Endpoint::Stdio(settings) => settings.connect_timeout,
            Endpoint::Http { settings, .. } => settings.connect_timeout,
        }
    }

    async fn open(&self) -> Result<Connection, ReasonCode> {
        self.open_within(self.connect_timeout()).await
    }

    /// Connects, the handshake bounded by `connect_timeout`.
    async fn open_within(&self, connect_timeout: Duration) -> Result<Connection, ReasonCode> {
        let hard_ceiling =
            usize::try_from(self.classification().maximum_output_bytes.saturating_mul(4))
                .unwrap_or(usize::MAX);
        let opened = match &self.endpoint {
            Endpoint::Stdio(settings) => {
                let credential = match (settings.auth_scheme, &settings.auth_name) {
                    (AuthScheme::Env, Some(name)) => {
                        let reference = settings
                            .credential_ref
                            .as_ref()
                            .ok_or(ReasonCode::ToolAuthFailed)?;
                        let value = self
                            .shared
                            .credentials
                            .resolve(reference)
                            .await
                            .map_err(|_| ReasonCode::ToolAuthFailed)?;
                        *lock(&self.credential) = Some(value.clone());
                        Some((name.clone(), value))
                    }
                    _ => None,
                };
                let spec = ChildSpec {
                    server_id: settings.server_id.clone(),
                    program: settings.program.clone(),
                    args: settings.args.clone(),
                    declared: settings.env.clone(),
                    credential,
                    state_dir: settings.state_dir.clone(),
                    run_as: settings.run_as,
                    path: settings.path.clone(),
                };
                Connection::open(
                    &spec,
                    connect_timeout,
                    hard_ceiling,
                    self.shared.metrics.clone(),
                )
                .await
            }
            Endpoint::Http {
                settings,
                dialer,
                authenticator,
            } => {
                let ceilings = Ceilings::new(hard_ceiling);
                let client = EgressClient::new(
                    &settings.server_id,
                    dialer.clone(),
                    authenticator.clone(),
                    settings.request_timeout,
                    ceilings.clone(),
                );
                let opened = Connection::open_http(
                    &settings.server_id,
                    client,
                    &settings.url,
                    connect_timeout,
                    ceilings,
                )
                .await;
                if matches!(opened, Err(ClientError::Unauthorized { .. })) {
                    authenticator.forget();
                }
                opened
            }
        };
        opened.map_err(|error| {
            tracing::warn!(server = %self.server_id(), error = %error, "mcp connect failed");
            self.shared.metrics.increment(
                "mcp_connect_failures_total",
                vec![
                    ("server", self.server_id().to_owned()),
                    ("reason_code", error.reason_code().as_str().to_owned()),
                ],
            );
            error.reason_code()
        })
    }

    /// Connects and lists everything: the live half of discovery.
    async fn discover_live(
        self: &Arc<Self>,
    ) -> Result<
        (
            Connection,
            Vec<RemoteTool>,
            Vec<RemoteResource>,
            Vec<RemotePrompt>,
        ),
        ReasonCode,
    > {
        self.discover_live_within(self.connect_timeout()).await
    }

    /// [`Self::discover_live`] with the handshake bounded by `connect_timeout`.
    async fn discover_live_within(
        self: &Arc<Self>,
        connect_timeout: Duration,
    ) -> Result<
        (
            Connection,
            Vec<RemoteTool>,
            Vec<RemoteResource>,
            Vec<RemotePrompt>,
        ),
        ReasonCode,
    > {
        let connection = self.open_within(connect_timeout).await?;
        let timeout = self.server_request_timeout();
        let listed = async {
            let tools = connection.list_tools(timeout).await?;
            let features = connection.features();
            let resources = if features.resources {
                connection.list_resources(timeout).await?
            } else {
                Vec::new()
            };
            let prompts = if features.prompts {
                connection.list_prompts(timeout).await?
            } else {
                Vec::new()
            };
            Ok::<_, ClientError>((tools, resources, prompts))
        }
        .await;
        match listed {
            Ok((tools, resources, prompts)) => Ok((connection, tools, resources, prompts)),
            Err(error) => {
                tracing::warn!(server = %self.server_id(), error = %error, "mcp discovery failed");
                connection.close(CLOSE_GRACE).await;
                Err(error.reason_code())
            }
        }
    }

    /// Maps a live discovery into the pin and remembers it.
    fn remember(
        self: &Arc<Self>,
        tools: Vec<RemoteTool>,
        resources: Vec<RemoteResource>,
        prompts: Vec<RemotePrompt>,
        has_resources: bool,
    ) -> Arc<Remembered> {
        let server_id = self.server_id();
        let classification = self.classification();
        let catalog = map_catalog(server_id, classification, &tools);
        let declarations = by_name(tools.clone());
        let resource_name = mcp_registry_name(server_id, READ_RESOURCE);
        let mut conflicts: Vec<Vec<String>> = catalog
            .conflicts
            .iter()
            .map(|conflict| conflict.remote_names.clone())
            .collect();
        let mut found = Vec::new();
        for (remote_name, spec) in catalog.specs {
            if has_resources && spec.name == resource_name {
                // The synthetic read tool owns this name on a server with
                // resources; a remote tool that normalizes to it collides.
                conflicts.push(vec![remote_name, READ_RESOURCE.to_owned()]);
                continue;
            }
            let declaration = declarations.get(&remote_name).cloned();
            found.push(DiscoveredTool {
                remote_name: remote_name.clone(),
                tool: Arc::new(McpTool {
                    spec,
                    remote_name,
                    declaration,
                    server: Arc::downgrade(self),
                }),
            });
        }
        if has_resources {
            found.push(DiscoveredTool {
                remote_name: READ_RESOURCE.to_owned(),
                tool: Arc::new(ReadResourceTool {
                    spec: read_resource_spec(server_id, &catalog.catalog_hash, classification),
                    server: Arc::downgrade(self),
                }),
            });
        }
        let prompts: Vec<(SkillMetadata, RemotePrompt)> = prompts
            .into_iter()
            .map(|prompt| (skill_metadata(server_id, &prompt), prompt))
            .collect();
        let discovery = ServerDiscovery {
            server: self.row.clone(),
            tenant_id: self.owner.clone(),
            outcome: DiscoveryOutcome::Pinned,
            catalog_hash: Some(catalog.catalog_hash.clone()),
            tools: found,
            conflicts,
            skills: prompts.iter().map(|(skill, _)| skill.clone()).collect(),
        };
        let remembered = Arc::new(Remembered {
            catalog_hash: catalog.catalog_hash,
            resources,
            prompts,
            discovery,
            at: Instant::now(),
        });
        *lock(&self.remembered) = Some(remembered.clone());
        remembered
    }

    /// The remembered discovery while it may still be pinned.
    fn reusable(&self) -> Option<Arc<Remembered>> {
        lock(&self.remembered).clone().filter(|remembered| {
            self.reuse
                .is_none_or(|reuse| remembered.at.elapsed() < reuse)
        })
    }

    /// Discovery for one preparation: the remembered pin, or a live one.
    pub(super) async fn discover(
        self: &Arc<Self>,
        general: &Semaphore,
        startup: &Semaphore,
        share: Option<&Semaphore>,
    ) -> ServerDiscovery {
        if let Some(remembered) = self.reusable() {
            return remembered.discovery.clone();
        }
        // Waiting for a discovery under way is bounded as a handshake is:
        // a warm-up given longer than a session waits is not waited out.
        let _one = tokio::time::timeout(self.connect_timeout(), self.discovering.lock())
            .await
            .ok();
        if let Some(remembered) = self.reusable() {
            return remembered.discovery.clone();
        }
        let failed = |reason_code| ServerDiscovery {
            server: self.row.clone(),
            tenant_id: self.owner.clone(),
            outcome: DiscoveryOutcome::Failed { reason_code },
            catalog_hash: None,
            tools: Vec::new(),
            conflicts: Vec::new(),
            skills: Vec::new(),
        };
        // A process slot first, so queued start-ups do not hold general
        // slots HTTP discovery could use.
        let _process = if self.spawns() {
            match startup.acquire().await {
                Ok(permit) => Some(permit),
                Err(_) => return failed(ReasonCode::ToolServerUnreachable),
            }
        } else {
            None
        };
        // A tenant's own servers take a general slot only within the
        // tenant's share of them, so one tenant's silent servers cannot hold
        // every slot another tenant's session waits for.
        let _share = match share {
            Some(share) => match share.acquire().await {
                Ok(permit) => Some(permit),
                Err(_) => return failed(ReasonCode::ToolServerUnreachable),
            },
            None => None,
        };
        let Ok(_general) = general.acquire().await else {
            return failed(ReasonCode::ToolServerUnreachable);
        };
        let started = Instant::now();
        match self.discover_live().await {
            Ok((connection, tools, resources, prompts)) => {
                let has_resources = connection.features().resources;
                let remembered = self.remember(tools, resources, prompts, has_resources);
                self.install(connection).await;
                let mut discovery = remembered.discovery.clone();
                discovery.outcome = DiscoveryOutcome::Connected {
                    duration_ms: i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX),
                };
                discovery
            }
            Err(reason_code) => {
                // A failed handshake forgets the earlier discovery.
                lock(&self.remembered).take();
                failed(reason_code)
            }
        }
    }

    /// The warm-up's discovery: remembers the catalog (and keeps the
    /// connection for the first call) so a session pins it without
    /// connecting; records nothing. Waits for the same slots a preparation
    /// does, and up to `connect_timeout` for the handshake. Whether the
    /// server's discovery is remembered now.
    pub(super) async fn warm_up(
        self: &Arc<Self>,
        general: &Semaphore,
        startup: &Semaphore,
        connect_timeout: Duration,
    ) -> bool {
        let _one = self.discovering.lock().await;
        if self.reusable().is_some() {
            return true;
        }
        let _process = if self.spawns() {
            match startup.acquire().await {
                Ok(permit) => Some(permit),
                Err(_) => return false,
            }
        } else {
            None
        };
        let Ok(_general) = general.acquire().await else {
            return false;
        };
        match self.discover_live_within(connect_timeout).await {
            Ok((connection, tools, resources, prompts)) => {
                let has_resources = connection.features().resources;
                self.remember(tools, resources, prompts, has_resources);
                self.install(connection).await;
                true
            }
            Err(_) => false,
        }
    }

    /// Makes `connection` the live one and starts its list-changed watcher.
    async fn install(self: &Arc<Self>, connection: Connection) -> Arc<Connection> {
        let connection = self.start(connection);
        let previous = self.live.lock().await.replace(connection.clone());
        if let Some(previous) = previous {
            close_when_unused(previous);
        }
        connection
    }

    /// Shares a new connection and starts its list-changed watcher; the
    /// caller puts it in the live slot.
    fn start(self: &Arc<Self>, connection: Connection) -> Arc<Connection> {
        let connection = Arc::new(connection);
        let changes = connection.list_changes();
        tokio::spawn(watch_list_changes(
            Arc::downgrade(self),
            Arc::downgrade(&connection),
            changes,
        ));
        tokio::spawn(watch_end(
            Arc::downgrade(self),
            Arc::downgrade(&connection),
            connection.ended(),
        ));
        *lock(&self.last_used) = Instant::now();
        connection
    }

    /// Whether the pinned declaration of `remote_name` is gone or changed in
    /// the newest listing.
    fn withdrawn(&self, remote_name: &str, pinned: Option<&RemoteTool>) -> bool {
        match lock(&self.current).as_ref() {
            Some(current) => current.get(remote_name) != pinned,
            None => pinned.is_none(),
        }
    }

    /// The live connection, redialled when dead. A redial's listing is
    /// compared with the pin and recorded as the newest listing.
    async fn connection(self: &Arc<Self>, tenant_id: &str) -> Result<Arc<Connection>, ReasonCode> {
        self.connection_for(Some(tenant_id)).await
    }

    /// [`Self::connection`], its events recorded for `tenant_id` (the
    /// server's owner when `None`).
    async fn connection_for(
        self: &Arc<Self>,
        tenant_id: Option<&str>,
    ) -> Result<Arc<Connection>, ReasonCode> {
        let mut live = self.live.lock().await;
        if let Some(connection) = live.as_ref()
            && !connection.is_closed()
        {
            return Ok(connection.clone());
        }
        if let Some(ended) = live.take() {
            // Ended between calls, before its watcher told it.
            self.record(
                tenant_id,
                self.disconnected(ReasonCode::ToolServerUnreachable),
            )
            .await;
            close_when_unused(ended);
        }
        let started = Instant::now();
        let connection = self.open().await?;
        let tools = match connection.list_tools(self.server_request_timeout()).await {
            Ok(tools) => tools,
            Err(error) => {
                connection.close(CLOSE_GRACE).await;
                return Err(error.reason_code());
            }
        };
        let pinned = lock(&self.remembered)
            .as_ref()
            .map(|r| r.catalog_hash.clone());
        let hash = catalog_hash(&tools);
        if pinned.as_deref() != Some(hash.as_str()) {
            *lock(&self.current) = Some(by_name(tools.clone()));
        }
        self.record(
            tenant_id,
            PlatformEvent::ServerConnected {
                server_id: self.server_id().to_owned(),
                transport: self.transport(),
                tools: tools.len(),
                duration_ms: i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX),
            },
        )
        .await;
        // Installed under the same lock that saw the slot empty, so a second
        // caller cannot open a second connection.
        let connection = self.start(connection);
        *live = Some(connection.clone());
        Ok(connection)
    }

    /// Forgets a connection that failed, so the next call redials; it
    /// closes once no call holds it. Whoever takes a connection out tells
    /// its end, so one end is one event.
    async fn forget(
        &self,
        tenant_id: &str,
        failed: &Arc<Connection>,
        reason_code: ReasonCode,
    ) -> bool {
        let mut live = self.live.lock().await;
        if live
            .as_ref()
            .is_some_and(|connection| Arc::ptr_eq(connection, failed))
            && let Some(connection) = live.take()
        {
            self.record(Some(tenant_id), self.disconnected(reason_code))
                .await;
            drop(live);
            close_when_unused(connection);
            return true;
        }
        false
    }

    /// Forgets a connection whose server ended it while no call held it;
    /// a call that holds it tells the failure itself, with its tenant.
    /// Whether it was the live one.
    async fn forget_ended(&self, ended: &Weak<Connection>) -> bool {
        let mut live = self.live.lock().await;
        let idle = live.as_ref().is_some_and(|connection| {
            std::ptr::eq(Arc::as_ptr(connection), ended.as_ptr())
                && Arc::strong_count(connection) == 1
        });
        if idle && let Some(connection) = live.take() {
            self.record(None, self.disconnected(ReasonCode::ToolServerUnreachable))
                .await;
            drop(live);
            close_when_unused(connection);
            return true;
        }
        false
    }

    /// Starts a stdio server whose live connection failed (it crashed, or
    /// broke its stream) again, in the background: the next call finds it
    /// ready instead of paying its start-up out of its own timeout, however
    /// slowly the machine starts it. At most once per [`RESTART_SPACING`],
    /// so a server that dies as it starts is not started in a loop.
    fn restart_soon(self: &Arc<Self>) {
        if !self.spawns() || !self.enabled() {
            return;
        }
        {
            let mut last = lock(&self.last_restart);
            if last.is_some_and(|at| at.elapsed() < RESTART_SPACING) {
                return;
            }
            *last = Some(Instant::now());
        }
        let server = Arc::downgrade(self);
        tokio::spawn(async move {
            if let Some(server) = server.upgrade() {
                let _ = server.connection_for(None).await;
            }
        });
    }

    fn disconnected(&self, reason_code: ReasonCode) -> PlatformEvent {
        PlatformEvent::ServerDisconnected {
            server_id: self.server_id().to_owned(),
            reason_code,
        }
    }

    async fn record(&self, tenant_id: Option<&str>, event: PlatformEvent) {
        let tenant_id = tenant_id.or(self.owner.as_deref());
        if let Err(error) = self
            .shared
            .store
            .record_event(tenant_id, &event, self.shared.clock.now())
            .await
        {
            tracing::warn!(server = %self.server_id(), error = %error, "mcp event not recorded");
        }
    }

    /// The effective request timeout: the server's, capped by the call's.
    fn request_timeout(&self, context: &ToolExecutionContext) -> Duration {
        let call = Duration::from_secs_f64(context.timeout_seconds.max(0.0));
        let remaining = context
            .deadline_at
            .duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO);
        self.server_request_timeout().min(call).min(remaining)
    }

    async fn call(
        self: &Arc<Self>,
        spec: &ToolSpec,
        remote_name: &str,
        pinned: Option<&RemoteTool>,
        arguments: Value,
        context: &ToolExecutionContext,
    ) -> ToolResult {
        if self.withdrawn(remote_name, pinned) {
            return withdrawn();
        }
        if lock(&self.ladders).get(context.session_id) == Some(Ladder::Unauthorized) {
            return unauthorized(true);
        }
        let connection = match self.connection(&context.tenant_id).await {
            Ok(connection) => connection,
            Err(reason_code) => return self.unconnected(reason_code, context),
        };
        // A redial may have just shown the declaration gone.
        if self.withdrawn(remote_name, pinned) {
            return withdrawn();
        }
        let arguments = match arguments {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        let mut answer = self
            .send_call(&connection, remote_name, arguments.clone(), context)
            .await;
        if matches!(answer, Err(ClientError::Unauthorized { .. })) {
            // Ladder step 1: the call is held while the ladder runs.
            if !self.climb(spec, context).await {
                return self.refused(&connection, context).await;
            }
            answer = self
                .send_call(&connection, remote_name, arguments, context)
                .await;
            if matches!(answer, Err(ClientError::Unauthorized { .. })) {
                lock(&self.ladders).set(context.session_id, Ladder::Unauthorized);
                return self.refused(&connection, context).await;
            }
        }
        let result = match answer {
            Ok(call) => render_call(self.scrub_call(call), context).await,
            Err(error) => self.failed(&connection, error, context).await,
        };
        self.scrubbed(result)
    }

    /// A call whose (re)connection failed. A credential refused at connect
    /// is terminal for the session: its later calls are not dialled.
    fn unconnected(&self, reason_code: ReasonCode, context: &ToolExecutionContext) -> ToolResult {
        if matches!(
            reason_code,
            ReasonCode::ToolAuthFailed | ReasonCode::ToolAuthUnsupported
        ) {
            lock(&self.ladders).set(context.session_id, Ladder::Unauthorized);
        }
        unreachable(reason_code)
    }

    async fn send_call(
        &self,
        connection: &Connection,
        remote_name: &str,
        arguments: Map<String, Value>,
        context: &ToolExecutionContext,
    ) -> Result<RemoteCall, ClientError> {
        let answer = connection
            .call_tool(
                remote_name,
                arguments,
                &context.idempotency_key,
                self.request_timeout(context),
            )
            .instrument(tracing::info_span!(
                "mcp.request",
                mcp.server = %self.server_id(),
                mcp.method = "tools/call"
            ))
            .await;
        *lock(&self.last_used) = Instant::now();
        let outcome = match &answer {
            Ok(call) if call.is_error => "error_result",
            Ok(_) => "ok",
            Err(error) => error.reason_code().as_str(),
        };
        self.shared.metrics.increment(
            "mcp_requests_total",
            vec![
                ("server", self.server_id().to_owned()),
                ("method", "tools/call".to_owned()),
                ("outcome", outcome.to_owned()),
            ],
        );
        answer
    }

    /// Ladder steps 2 to 4 for a call that met a 401: whether it may be
    /// sent once more. One re-authentication per server per session; a
    /// value identical to the refused one, or none, ends the ladder; the
    /// retry happens only where the recovery table would re-send the call.
    async fn climb(&self, spec: &ToolSpec, context: &ToolExecutionContext) -> bool {
        let Endpoint::Http { authenticator, .. } = &self.endpoint else {
            return false;
        };
        {
            let mut ladders = lock(&self.ladders);
            match ladders.get(context.session_id) {
                // A 401 after the one re-authentication is a failing
                // server, not an expired credential.
                Some(_) => {
                    ladders.set(context.session_id, Ladder::Unauthorized);
                    return false;
                }
                None => ladders.set(context.session_id, Ladder::Reauthenticated),
            }
        }
        let renewed = authenticator.renew().await;
        let outcome = match &renewed {
            Ok(true) => "renewed",
            Ok(false) => "identical",
            Err(_) => "failed",
        };
        self.record(
            Some(&context.tenant_id),
            PlatformEvent::ServerReauthenticated {
                server_id: self.server_id().to_owned(),
                scheme: authenticator.scheme(),
                outcome,
            },
        )
        .await;
        if !matches!(renewed, Ok(true)) {
            lock(&self.ladders).set(context.session_id, Ladder::Unauthorized);
            return false;
        }
        // The watermark is committed before any call whose spec needs one,
        // so whether it is set is the spec's to say.
        decide(spec.idempotency, spec.needs_effect_watermark()) != RecoveryDecision::Uncertain
    }

    /// A call the ladder ends: `tool.server_unauthorized` (the executor makes
    /// it UNCERTAIN where the effect may have been sent). A session whose
    /// ladder is spent also drops the connection, which closes once no
    /// other call holds it.
    async fn refused(
        &self,
        connection: &Arc<Connection>,
        context: &ToolExecutionContext,
    ) -> ToolResult {
        if lock(&self.ladders).get(context.session_id) == Some(Ladder::Unauthorized) {
            self.forget(
                &context.tenant_id,
                connection,
                ReasonCode::ToolServerUnauthorized,
            )
            .await;
        }
        unauthorized(false)
    }

    /// A block with the transport's own credential redacted wherever it
    /// appears (a URI, a blob, a field), before any of it is rendered or
    /// stored as an artifact.
    fn scrub_value(&self, value: Value) -> Value {
        let Some(secret) = self.secret() else {
            return value;
        };
        let text = value.to_string();
        let scrubbed = scrub(&text, &[secret]);
        if scrubbed == text {
            return value;
        }
        serde_json::from_str(&scrubbed).unwrap_or(Value::Null)
    }

    fn scrub_call(&self, call: RemoteCall) -> RemoteCall {
        RemoteCall {
            content: call
                .content
                .into_iter()
                .map(|block| self.scrub_value(block))
                .collect(),
            structured: call.structured.map(|value| self.scrub_value(value)),
            is_error: call.is_error,
        }
    }

    /// The result with the transport's own credential redacted.
    fn scrubbed(&self, mut result: ToolResult) -> ToolResult {
        let Some(secret) = self.secret() else {
            return result;
        };
        let secrets = [secret];
        for part in &mut result.content {
            if let ContentPart::Text { text } = part {
                *text = scrub(text, &secrets);
            }
        }
        if let Some(failure) = &mut result.failure {
            failure.external_text = failure
                .external_text
                .as_deref()
                .map(|text| scrub(text, &secrets));
        }
        result
    }

    async fn failed(
        self: &Arc<Self>,
        connection: &Arc<Connection>,
        error: ClientError,
        context: &ToolExecutionContext,
    ) -> ToolResult {
        let reason_code = error.reason_code();
        if error.is_fatal()
            && self
                .forget(&context.tenant_id, connection, reason_code)
                .await
        {
            self.restart_soon();
        }
        let never_sent = error.never_sent();
        let failure = match error {
            ClientError::Remote { external_text, .. } => ToolFailure::new(
                ToolFailureKind::UpstreamError,
                "the server answered with an error",
            )
            .with_external_text(external_text),
            ClientError::RequestTimeout { .. } => ToolFailure::new(
                ToolFailureKind::Timeout,
                "the server did not answer in time",
            ),
            ClientError::OutputTooLarge { .. } => ToolFailure::new(
                ToolFailureKind::OutputTooLarge,
                "the server's answer crossed the hard output ceiling; the connection was closed",
            ),
            other => ToolFailure::new(ToolFailureKind::Transport, other.to_string())
                .with_reason_code(reason_code),
        };
        ToolResult::failed(if never_sent {
            failure.not_applied()
        } else {
            failure
        })
    }

    async fn read_resource(
        self: &Arc<Self>,
        uri: &str,
        context: &ToolExecutionContext,
    ) -> ToolResult {
        let advertised = lock(&self.remembered)
            .as_ref()
            .map(|remembered| remembered.resources.clone())
            .unwrap_or_default();
        if uri.is_empty() {
            let listing: Vec<Value> = advertised
                .iter()
                .map(|resource| {
                    json!({"uri": resource.uri, "name": resource.name,
                                       "mime_type": resource.mime_type})
                })
                .collect();
            return ToolResult::text(Value::Array(listing).to_string());
        }
        if !advertised.iter().any(|resource| resource.uri == uri) {
            return ToolResult::failed(
                ToolFailure::new(
                    ToolFailureKind::InvalidArguments,
                    "the URI is not in the server's advertised resource list",
                )
                .not_applied(),
            );
        }
        if lock(&self.ladders).get(context.session_id) == Some(Ladder::Unauthorized) {
            return unauthorized(true);
        }
        let connection = match self.connection(&context.tenant_id).await {
            Ok(connection) => connection,
            Err(reason_code) => return self.unconnected(reason_code, context),
        };
        let answer = connection
            .read_resource(uri, self.request_timeout(context))
            .await;
        *lock(&self.last_used) = Instant::now();
        let result = match answer {
            Ok(contents) => {
                let contents = contents
                    .into_iter()
                    .map(|block| self.scrub_value(block))
                    .collect();
                render_blocks(contents, context).await
            }
            Err(error) => self.failed(&connection, error, context).await,
        };
        self.scrubbed(result)
    }

    /// The skill behind `name`, when this server's pin advertised it.
    pub(super) fn prompt(&self, name: &str) -> Option<(SkillMetadata, RemotePrompt)> {
        lock(&self.remembered).as_ref().and_then(|remembered| {
            remembered
                .prompts
                .iter()
                .find(|(metadata, _)| metadata.name == name)
                .cloned()
        })
    }

    pub(super) async fn load_prompt(
        self: &Arc<Self>,
        tenant_id: &str,
        prompt: &RemotePrompt,
        metadata: SkillMetadata,
        arguments: Map<String, Value>,
    ) -> Result<LoadedSkill, ToolFailure> {
        let connection = self.connection(tenant_id).await.map_err(|code| {
            ToolFailure::new(ToolFailureKind::Transport, "server unreachable")
                .with_reason_code(code)
        })?;
        let messages = connection
            .get_prompt(&prompt.name, arguments, self.server_request_timeout())
            .await
            .map_err(|error| {
                ToolFailure::new(ToolFailureKind::UpstreamError, error.to_string())
                    .with_reason_code(error.reason_code())
            })?;
        let text = messages
            .iter()
            .filter_map(|message| message.pointer("/content/text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n\n");
        let secrets: Vec<SecretValue> = self.secret().into_iter().collect();
        Ok(LoadedSkill {
            metadata,
            text: scrub(&text, &secrets),
        })
    }

    /// Closes the live connection when it has been unused for the idle
    /// timeout and no call holds it. Whether it closed one.
    pub(super) async fn close_if_idle(&self) -> bool {
        let idle = lock(&self.last_used).elapsed() >= self.idle_timeout();
        let mut live = self.live.lock().await;
        let unused = live
            .as_ref()
            .is_some_and(|connection| Arc::strong_count(connection) == 1);
        if idle
            && unused
            && let Some(connection) = live.take()
        {
            // Told before the lock is let go: whoever sees it gone sees why.
            self.record(None, self.closed("mcp.closed.idle")).await;
            drop(live);
            close_when_unused(connection);
            return true;
        }
        false
    }

    fn closed(&self, reason: &'static str) -> PlatformEvent {
        PlatformEvent::ServerClosed {
            server_id: self.server_id().to_owned(),
            reason,
        }
    }

    /// Takes the live connection out, for shutdown; the closing is recorded.
    pub(super) async fn take_live(&self) -> Option<Arc<Connection>> {
        let mut live = self.live.lock().await;
        let taken = live.take();
        if taken.is_some() {
            self.record(None, self.closed("mcp.closed.shutdown")).await;
        }
        taken
    }

    /// Takes the live connection out without an event: the server was
    /// replaced or removed, and its successor speaks for it.
    pub(super) async fn take_live_quietly(&self) -> Option<Arc<Connection>> {
        self.live.lock().await.take()
    }

    /// Whether a live connection is open.
    pub(super) async fn is_connected(&self) -> bool {
        self.live
            .lock()
            .await
            .as_ref()
            .is_some_and(|connection| !connection.is_closed())
    }
}

/// Closes a replaced connection once no call holds it.
pub(super) fn close_when_unused(connection: Arc<Connection>) {
    tokio::spawn(async move {
        let mut connection = connection;
        loop {
            match Arc::try_unwrap(connection) {
                Ok(owned) => return owned.close(CLOSE_GRACE).await,
                Err(shared) => {
                    connection = shared;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
}

/// Waits for the server to end the connection and forgets it when idle,
/// so its end is told when it happens, not at the next call.
async fn watch_end(
    server: Weak<McpServer>,
    connection: Weak<Connection>,
    mut ended: tokio::sync::watch::Receiver<bool>,
) {
    if ended.wait_for(|ended| *ended).await.is_err() {
        return;
    }
    let Some(server) = server.upgrade() else {
        return;
    };
    if server.forget_ended(&connection).await {
        server.restart_soon();
    }
}

/// Lists again after a burst of `list_changed` and records a change against
/// the pin, once per new catalog hash. The pin itself is never touched.
async fn watch_list_changes(
    server: Weak<McpServer>,
    connection: Weak<Connection>,
    mut changes: tokio::sync::watch::Receiver<u64>,
) {
    let mut last_recorded: Option<String> = None;
    while changes.changed().await.is_ok() {
        tokio::time::sleep(LIST_CHANGED_COALESCE).await;
        changes.borrow_and_update();
        let (Some(server), Some(live)) = (server.upgrade(), connection.upgrade()) else {
            return;
        };
        let listed = live.list_tools(server.server_request_timeout()).await;
        let closed = live.is_closed();
        drop(live);
        let tools = match listed {
            Ok(tools) => tools,
            // A slow or refused listing is tried at the next notification;
            // only a closed connection ends the watch.
            Err(_) if !closed => continue,
            Err(_) => return,
        };
        let new_hash = catalog_hash(&tools);
        let Some(old_hash) = lock(&server.remembered)
            .as_ref()
            .map(|remembered| remembered.catalog_hash.clone())
        else {
            continue;
        };
        *lock(&server.current) = Some(by_name(tools));
        if new_hash != old_hash && last_recorded.as_deref() != Some(new_hash.as_str()) {
            server
                .record(
                    None,
                    PlatformEvent::CatalogChanged {
                        server_id: server.server_id().to_owned(),
                        old_hash,
                        new_hash: new_hash.clone(),
                    },
                )
                .await;
            last_recorded = Some(new_hash);
        }
    }
}

/// A remote tool, as the pipeline calls it.
struct McpTool {
    spec: ToolSpec,
    remote_name: String,
    /// The declaration pinned at discovery.
    declaration: Option<RemoteTool>,
    server: Weak<McpServer>,
}

impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn execute<'a>(
        &'a self,
        arguments: Value,
        context: ToolExecutionContext,
    ) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            match self.server.upgrade() {
                Some(server) => {
                    server
                        .call(
                            &self.spec,
                            &self.remote_name,
                            self.declaration.as_ref(),
                            arguments,
                            &context,
                        )
                        .await
                }
                None => unreachable(ReasonCode::ToolServerUnreachable),
            }
        })
    }
}

/// `mcp.{server_id}.read_resource`.
struct ReadResourceTool {
    spec: ToolSpec,
    server: Weak<McpServer>,
}

impl Tool for ReadResourceTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn execute<'a>(
        &'a self,
        arguments: Value,
        context: ToolExecutionContext,
    ) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            let uri = arguments
                .get("uri")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            match self.server.upgrade() {
                Some(server) => server.read_resource(&uri, &context).await,
                None => unreachable(ReasonCode::ToolServerUnreachable),
            }
        })
    }
}
