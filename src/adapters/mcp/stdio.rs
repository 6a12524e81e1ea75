//! Operator-configured stdio servers: discovery remembered for the life of
//! the process, connections owned here and nowhere else, and the `Tool`s
//! the pipeline calls.
//!
//! The pin never moves. A `notifications/tools/list_changed` is listed,
//! recorded as `mcp.catalog.changed` and not applied; a tool whose
//! declaration has since disappeared or changed answers `tool.withdrawn`
//! without dialling; a dead server answers `tool.server_unreachable` and is
//! redialled by the next call, whose discovery is compared with the pin.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use tokio::sync::Semaphore;
use tracing::Instrument as _;

use super::catalog::{MAXIMUM_DESCRIPTION_BYTES, RemoteTool, catalog_hash, cut, map_catalog};
use super::child::{ChildSpec, RunAs};
use super::client::{ClientError, Connection, RemoteCall, RemotePrompt, RemoteResource};
use crate::domain::mcp_server::{AuthScheme, ServerClassification, Transport};
use crate::domain::names::mcp_registry_name;
use crate::domain::secret::{CredentialRef, scrub};
use crate::domain::{
    ContentPart, IdempotencyClass, ReasonCode, RiskLevel, SecretValue, SideEffectClass,
    SkillMetadata, TargetKind, ToolFailure, ToolFailureKind, ToolKind, ToolResult, ToolSource,
    ToolSpec, TrustLevel, canonicalize, sha256_hex,
};
use crate::ports::metrics::Metrics;
use crate::ports::{
    BoxFuture, Clock, CredentialResolver, DiscoveredTool, DiscoveryOutcome, LoadedSkill,
    McpServerRow, McpServers, PlatformEvent, ServerDiscovery, Store, Tool, ToolExecutionContext,
};

/// Preparation slots shared by every server of one runtime.
pub const GENERAL_SLOTS: usize = 8;
/// Process-startup slots: simultaneous interpreter start-ups must not eat
/// each other's handshake deadline.
pub const STARTUP_SLOTS: usize = 2;
/// The idle sweep runs at least this often.
pub const MAXIMUM_SWEEP: Duration = Duration::from_secs(30);
/// How long a burst of list-changed notifications is gathered into one look.
pub const LIST_CHANGED_COALESCE: Duration = Duration::from_millis(250);
/// How long a closing child gets between SIGTERM and SIGKILL.
pub const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// The synthetic resource tool's remote name.
pub const READ_RESOURCE: &str = "read_resource";

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

/// A discovery this process remembers: the pin every later session reuses.
struct Remembered {
    catalog_hash: String,
    resources: Vec<RemoteResource>,
    prompts: Vec<(SkillMetadata, RemotePrompt)>,
    discovery: ServerDiscovery,
}

/// One server: its settings, its one live connection, its pin.
pub struct StdioServer {
    settings: StdioServerSettings,
    credentials: Arc<dyn CredentialResolver>,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    live: tokio::sync::Mutex<Option<Arc<Connection>>>,
    remembered: Mutex<Option<Arc<Remembered>>>,
    /// The newest listing seen after the pin, by remote name.
    current: Mutex<Option<HashMap<String, RemoteTool>>>,
    last_used: Mutex<Instant>,
    /// The credential the live child was given: scrubbed from everything
    /// the server returns, since a server can echo its own environment.
    credential: Mutex<Option<SecretValue>>,
    metrics: Arc<dyn Metrics>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere leaves plain data behind; it is still usable.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl StdioServer {
    /// The server's id.
    pub fn server_id(&self) -> &str {
        &self.settings.server_id
    }

    async fn open(&self) -> Result<Connection, ReasonCode> {
        let credential = match (self.settings.auth_scheme, &self.settings.auth_name) {
            (AuthScheme::Env, Some(name)) => {
                let reference = self
                    .settings
                    .credential_ref
                    .as_ref()
                    .ok_or(ReasonCode::ToolAuthFailed)?;
                let value = self
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
            server_id: self.settings.server_id.clone(),
            program: self.settings.program.clone(),
            args: self.settings.args.clone(),
            declared: self.settings.env.clone(),
            credential,
            state_dir: self.settings.state_dir.clone(),
            run_as: self.settings.run_as,
        };
        let hard_ceiling = usize::try_from(
            self.settings
                .classification
                .maximum_output_bytes
                .saturating_mul(4),
        )
        .unwrap_or(usize::MAX);
        Connection::open(
            &spec,
            self.settings.connect_timeout,
            hard_ceiling,
            self.metrics.clone(),
        )
        .await
        .map_err(|error| {
            tracing::warn!(server = %self.settings.server_id, error = %error, "mcp connect failed");
            self.metrics.increment(
                "mcp_connect_failures_total",
                vec![
                    ("server", self.settings.server_id.clone()),
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
        let connection = self.open().await?;
        let timeout = self.settings.request_timeout;
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
                tracing::warn!(server = %self.settings.server_id, error = %error, "mcp discovery failed");
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
        let server_id = &self.settings.server_id;
        let classification = &self.settings.classification;
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
            server: self.settings.row(),
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
        });
        *lock(&self.remembered) = Some(remembered.clone());
        remembered
    }

    /// Discovery for one preparation: the remembered pin, or a live one.
    async fn discover(
        self: &Arc<Self>,
        general: &Semaphore,
        startup: &Semaphore,
    ) -> ServerDiscovery {
        if let Some(remembered) = lock(&self.remembered).clone() {
            return remembered.discovery.clone();
        }
        let failed = |reason_code| ServerDiscovery {
            server: self.settings.row(),
            outcome: DiscoveryOutcome::Failed { reason_code },
            catalog_hash: None,
            tools: Vec::new(),
            conflicts: Vec::new(),
            skills: Vec::new(),
        };
        // The process slot first, so queued start-ups do not hold general
        // slots other discovery could use.
        let (Ok(_process), Ok(_general)) = (startup.acquire().await, general.acquire().await)
        else {
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
            Err(reason_code) => failed(reason_code),
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
        let mut live = self.live.lock().await;
        if let Some(connection) = live.as_ref()
            && !connection.is_closed()
        {
            return Ok(connection.clone());
        }
        live.take();
        let started = Instant::now();
        let connection = self.open().await?;
        let tools = match connection.list_tools(self.settings.request_timeout).await {
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
            Some(tenant_id),
            PlatformEvent::ServerConnected {
                server_id: self.settings.server_id.clone(),
                transport: Transport::Stdio,
                tools: tools.len(),
                duration_ms: i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX),
            },
        )
        .await;
        // Installed under the same lock that saw the slot empty, so a second
        // caller cannot start a second child.
        let connection = self.start(connection);
        *live = Some(connection.clone());
        Ok(connection)
    }

    /// Forgets a connection that failed, so the next call redials.
    async fn forget(&self, tenant_id: &str, failed: &Arc<Connection>, reason_code: ReasonCode) {
        let mut live = self.live.lock().await;
        if live
            .as_ref()
            .is_some_and(|connection| Arc::ptr_eq(connection, failed))
        {
            live.take();
        }
        drop(live);
        self.record(
            Some(tenant_id),
            PlatformEvent::ServerDisconnected {
                server_id: self.settings.server_id.clone(),
                reason_code,
            },
        )
        .await;
    }

    async fn record(&self, tenant_id: Option<&str>, event: PlatformEvent) {
        if let Err(error) = self
            .store
            .record_event(tenant_id, &event, self.clock.now())
            .await
        {
            tracing::warn!(server = %self.settings.server_id, error = %error, "mcp event not recorded");
        }
    }

    /// The effective request timeout: the server's, capped by the call's.
    fn request_timeout(&self, context: &ToolExecutionContext) -> Duration {
        let call = Duration::from_secs_f64(context.timeout_seconds.max(0.0));
        let remaining = context
            .deadline_at
            .duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO);
        self.settings.request_timeout.min(call).min(remaining)
    }

    async fn call(
        self: &Arc<Self>,
        remote_name: &str,
        pinned: Option<&RemoteTool>,
        arguments: Value,
        context: &ToolExecutionContext,
    ) -> ToolResult {
        if self.withdrawn(remote_name, pinned) {
            return withdrawn();
        }
        let connection = match self.connection(&context.tenant_id).await {
            Ok(connection) => connection,
            Err(reason_code) => return unreachable(reason_code),
        };
        // A redial may have just shown the declaration gone.
        if self.withdrawn(remote_name, pinned) {
            return withdrawn();
        }
        let arguments = match arguments {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        let answer = connection
            .call_tool(
                remote_name,
                arguments,
                &context.idempotency_key,
                self.request_timeout(context),
            )
            .instrument(tracing::info_span!(
                "mcp.request",
                mcp.server = %self.settings.server_id,
                mcp.method = "tools/call"
            ))
            .await;
        *lock(&self.last_used) = Instant::now();
        let outcome = match &answer {
            Ok(call) if call.is_error => "error_result",
            Ok(_) => "ok",
            Err(error) => error.reason_code().as_str(),
        };
        self.metrics.increment(
            "mcp_requests_total",
            vec![
                ("server", self.settings.server_id.clone()),
                ("method", "tools/call".to_owned()),
                ("outcome", outcome.to_owned()),
            ],
        );
        let result = match answer {
            Ok(call) => render_call(self.scrub_call(call), context).await,
            Err(error) => self.failed(&connection, error, context).await,
        };
        self.scrubbed(result)
    }

    /// A block with the transport's own credential redacted wherever it
    /// appears (a URI, a blob, a field), before any of it is rendered or
    /// stored as an artifact.
    fn scrub_value(&self, value: Value) -> Value {
        let Some(secret) = lock(&self.credential).clone() else {
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
        let Some(secret) = lock(&self.credential).clone() else {
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
        &self,
        connection: &Arc<Connection>,
        error: ClientError,
        context: &ToolExecutionContext,
    ) -> ToolResult {
        let reason_code = error.reason_code();
        if error.is_fatal() {
            self.forget(&context.tenant_id, connection, reason_code)
                .await;
        }
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
        ToolResult::failed(failure)
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
        let connection = match self.connection(&context.tenant_id).await {
            Ok(connection) => connection,
            Err(reason_code) => return unreachable(reason_code),
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

    async fn load_prompt(
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
            .get_prompt(&prompt.name, arguments, self.settings.request_timeout)
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
        let secrets: Vec<SecretValue> = lock(&self.credential).iter().cloned().collect();
        Ok(LoadedSkill {
            metadata,
            text: scrub(&text, &secrets),
        })
    }
}

fn by_name(tools: Vec<RemoteTool>) -> HashMap<String, RemoteTool> {
    tools
        .into_iter()
        .map(|tool| (tool.name.clone(), tool))
        .collect()
}

fn withdrawn() -> ToolResult {
    ToolResult::failed(
        ToolFailure::new(
            ToolFailureKind::NotFound,
            "the pinned declaration was withdrawn",
        )
        .with_reason_code(ReasonCode::ToolWithdrawn)
        .not_applied(),
    )
}

/// Nothing was dispatched: the failure is proven not to have had an effect.
fn unreachable(reason_code: ReasonCode) -> ToolResult {
    ToolResult::failed(
        ToolFailure::new(
            ToolFailureKind::Transport,
            "the server could not be reached",
        )
        .with_reason_code(reason_code)
        .not_applied(),
    )
}

/// Decision 26's proof: a structured result of exactly
/// `{"effect_status": "not_applied"}` and nothing else.
fn proves_not_applied(structured: Option<&Value>) -> bool {
    structured.and_then(Value::as_object).is_some_and(|object| {
        object.len() == 1 && object.get("effect_status") == Some(&json!("not_applied"))
    })
}

async fn render_call(call: RemoteCall, context: &ToolExecutionContext) -> ToolResult {
    if call.is_error {
        let text: Vec<&str> = call
            .content
            .iter()
            .filter_map(|block| block.get("text").and_then(Value::as_str))
            .collect();
        let mut failure = ToolFailure::new(
            ToolFailureKind::UpstreamError,
            "the server reported a failed call",
        );
        if !text.is_empty() {
            failure = failure.with_external_text(text.join("\n"));
        }
        if proves_not_applied(call.structured.as_ref()) {
            failure = failure.not_applied();
        }
        return ToolResult::failed(failure);
    }
    let mut blocks = call.content;
    if blocks.is_empty()
        && let Some(structured) = call.structured
    {
        blocks.push(json!({"type": "text", "text": structured.to_string()}));
    }
    render_blocks(blocks, context).await
}

/// Text blocks become text; anything else (images, audio, blobs) becomes an
/// artifact of the run, never inline bytes.
///
/// Every block counts toward the call's output: past the hard ceiling (four
/// times `maximum_output_bytes`) the call is output too large and nothing is
/// written.
async fn render_blocks(blocks: Vec<Value>, context: &ToolExecutionContext) -> ToolResult {
    let ceiling = context.maximum_output_bytes.saturating_mul(4);
    let total: u64 = blocks
        .iter()
        .map(|block| {
            let size = block
                .get("text")
                .or_else(|| block.pointer("/resource/text"))
                .and_then(Value::as_str)
                .map_or_else(|| block.to_string().len(), str::len);
            u64::try_from(size).unwrap_or(u64::MAX)
        })
        .sum();
    if total > ceiling {
        return ToolResult::failed(ToolFailure::new(
            ToolFailureKind::OutputTooLarge,
            "the server's content crossed the hard output ceiling",
        ));
    }
    let mut content = Vec::with_capacity(blocks.len());
    for block in blocks {
        let text = block
            .get("text")
            .or_else(|| block.pointer("/resource/text"))
            .and_then(Value::as_str);
        match text {
            Some(text) => content.push(ContentPart::Text {
                text: text.to_owned(),
            }),
            None => {
                let bytes = block.to_string().into_bytes();
                match context
                    .artifacts
                    .write("application/json", TrustLevel::ExternalUntrusted, bytes)
                    .await
                {
                    Ok(reference) => content.push(ContentPart::Artifact(reference)),
                    Err(error) => {
                        return ToolResult::failed(ToolFailure::new(
                            ToolFailureKind::Internal,
                            error.to_string(),
                        ));
                    }
                }
            }
        }
    }
    ToolResult::ok(content)
}

/// Closes a replaced connection once no call holds it.
fn close_when_unused(connection: Arc<Connection>) {
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

/// Lists again after a burst of `list_changed` and records a change against
/// the pin, once per new catalog hash. The pin itself is never touched.
async fn watch_list_changes(
    server: Weak<StdioServer>,
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
        let listed = live.list_tools(server.settings.request_timeout).await;
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
                        server_id: server.settings.server_id.clone(),
                        old_hash,
                        new_hash: new_hash.clone(),
                    },
                )
                .await;
            last_recorded = Some(new_hash);
        }
    }
}

fn read_resource_spec(
    server_id: &str,
    catalog_hash: &str,
    classification: &ServerClassification,
) -> ToolSpec {
    ToolSpec {
        name: mcp_registry_name(server_id, READ_RESOURCE),
        version: catalog_hash.to_owned(),
        description:
            "Reads one of this server's advertised resources by URI; an empty URI lists them."
                .to_owned(),
        input_schema: json!({
            "type": "object",
            "properties": {"uri": {"type": "string"}},
            "required": ["uri"],
            "additionalProperties": false
        }),
        output_schema: None,
        side_effect: SideEffectClass::ExternalRead,
        risk: RiskLevel::Low,
        idempotency: IdempotencyClass::ReadOnly,
        required_scopes: classification.required_scopes.clone(),
        timeout_seconds: classification.timeout_seconds,
        maximum_output_bytes: classification.maximum_output_bytes,
        allow_parallel: false,
        kind: ToolKind::Capability,
        target_kind: TargetKind::McpServer,
        output_trust: TrustLevel::ExternalUntrusted,
        source: ToolSource::Mcp,
        server_id: Some(server_id.to_owned()),
        device_id: None,
        deprecated: false,
        model_visible: true,
    }
}

fn skill_metadata(server_id: &str, prompt: &RemotePrompt) -> SkillMetadata {
    let declaration = json!({
        "name": prompt.name,
        "description": prompt.description,
        "arguments": prompt.arguments.iter().map(|argument| json!({
            "name": argument.name, "description": argument.description,
            "required": argument.required})).collect::<Vec<_>>(),
    });
    let version = match canonicalize(declaration.clone()) {
        Ok(canonical) => canonical.sha256,
        Err(_) => sha256_hex(declaration.to_string().as_bytes()),
    };
    SkillMetadata {
        name: mcp_registry_name(server_id, &prompt.name),
        version,
        description: cut(
            prompt.description.as_deref().unwrap_or_default(),
            MAXIMUM_DESCRIPTION_BYTES,
        )
        .to_owned(),
        required_tools: Vec::new(),
        source: ToolSource::Mcp,
        trust: TrustLevel::ExternalUntrusted,
        read_only: true,
    }
}

/// A remote tool, as the pipeline calls it.
struct McpTool {
    spec: ToolSpec,
    remote_name: String,
    /// The declaration pinned at discovery.
    declaration: Option<RemoteTool>,
    server: Weak<StdioServer>,
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
    server: Weak<StdioServer>,
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

/// Every configured stdio server of this process.
pub struct StdioServers {
    servers: Vec<Arc<StdioServer>>,
    general: Semaphore,
    startup: Semaphore,
}

impl StdioServers {
    /// The servers, in configured order. Nothing is spawned until the first
    /// discovery.
    pub fn new(
        settings: Vec<StdioServerSettings>,
        credentials: Arc<dyn CredentialResolver>,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        metrics: Arc<dyn Metrics>,
    ) -> Self {
        let servers = settings
            .into_iter()
            .map(|settings| {
                Arc::new(StdioServer {
                    settings,
                    credentials: credentials.clone(),
                    store: store.clone(),
                    clock: clock.clone(),
                    live: tokio::sync::Mutex::new(None),
                    remembered: Mutex::new(None),
                    current: Mutex::new(None),
                    last_used: Mutex::new(Instant::now()),
                    credential: Mutex::new(None),
                    metrics: metrics.clone(),
                })
            })
            .collect();
        StdioServers {
            servers,
            general: Semaphore::new(GENERAL_SLOTS),
            startup: Semaphore::new(STARTUP_SLOTS),
        }
    }

    /// Closes connections unused for their idle timeout. A connection a call
    /// holds is not idle. Returns how many it closed.
    pub async fn close_idle(&self) -> usize {
        let mut closed = 0;
        for server in &self.servers {
            let idle = lock(&server.last_used).elapsed() >= server.settings.idle_timeout;
            let mut live = server.live.lock().await;
            let unused = live
                .as_ref()
                .is_some_and(|connection| Arc::strong_count(connection) == 1);
            if idle
                && unused
                && let Some(connection) = live.take()
            {
                close_when_unused(connection);
                closed += 1;
            }
        }
        closed
    }

    /// Runs [`StdioServers::close_idle`] every [`StdioServers::sweep_period`]
    /// until the servers are dropped.
    pub fn spawn_idle_sweeper(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let servers = Arc::downgrade(self);
        let period = self.sweep_period();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                let Some(servers) = servers.upgrade() else {
                    return;
                };
                servers.close_idle().await;
            }
        })
    }

    /// How often [`StdioServers::close_idle`] should run: every 30 s, or the
    /// shortest idle timeout if that is shorter.
    pub fn sweep_period(&self) -> Duration {
        self.servers
            .iter()
            .map(|server| server.settings.idle_timeout)
            .fold(MAXIMUM_SWEEP, Duration::min)
    }

    /// Closes every connection: pipes first, then each process group.
    pub async fn shutdown(&self) {
        let mut closing = Vec::new();
        for server in &self.servers {
            if let Some(connection) = server.live.lock().await.take() {
                closing.push(tokio::spawn(async move {
                    let mut connection = connection;
                    for _ in 0..50 {
                        match Arc::try_unwrap(connection) {
                            Ok(owned) => return owned.close(CLOSE_GRACE).await,
                            Err(shared) => connection = shared,
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    // Still held after five seconds: dropping the last
                    // reference kills the group.
                }));
            }
        }
        for task in closing {
            let _ = task.await;
        }
    }

    /// Whether `server_id` has a live connection (for tests and health).
    pub async fn is_connected(&self, server_id: &str) -> bool {
        for server in &self.servers {
            if server.server_id() == server_id {
                return server
                    .live
                    .lock()
                    .await
                    .as_ref()
                    .is_some_and(|connection| !connection.is_closed());
            }
        }
        false
    }
}

impl McpServers for StdioServers {
    fn discover(&self) -> BoxFuture<'_, Vec<ServerDiscovery>> {
        Box::pin(async move {
            let enabled: Vec<&Arc<StdioServer>> = self
                .servers
                .iter()
                .filter(|server| server.settings.enabled)
                .collect();
            // Concurrent within the slots; joined in configured order.
            let tasks = enabled
                .iter()
                .map(|server| server.discover(&self.general, &self.startup));
            join_all(tasks).await
        })
    }

    fn load_skill<'a>(
        &'a self,
        tenant_id: &'a str,
        name: &'a str,
        arguments: Map<String, Value>,
    ) -> BoxFuture<'a, Result<LoadedSkill, ToolFailure>> {
        Box::pin(async move {
            for server in &self.servers {
                let found = lock(&server.remembered).as_ref().and_then(|remembered| {
                    remembered
                        .prompts
                        .iter()
                        .find(|(metadata, _)| metadata.name == name)
                        .cloned()
                });
                if let Some((metadata, prompt)) = found {
                    return server
                        .load_prompt(tenant_id, &prompt, metadata, arguments)
                        .await;
                }
            }
            Err(ToolFailure::new(ToolFailureKind::NotFound, "no such skill").not_applied())
        })
    }
}

/// Awaits futures concurrently, results in input order.
async fn join_all<F: Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut set = Vec::new();
    for future in futures {
        set.push(Box::pin(future));
    }
    let mut results: Vec<Option<F::Output>> = set.iter().map(|_| None).collect();
    let mut pending: Vec<usize> = (0..set.len()).collect();
    std::future::poll_fn(|cx| {
        pending.retain(|&index| match set[index].as_mut().poll(cx) {
            std::task::Poll::Ready(output) => {
                results[index] = Some(output);
                false
            }
            std::task::Poll::Pending => true,
        });
        if pending.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    results.into_iter().flatten().collect()
}
