//! The composition root: the only place that wires adapters to ports.
//!
//! Reads nothing from the process on its own; `main` hands it the
//! configuration path and the environment.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::adapters::artifacts::FsArtifactStore;
use crate::adapters::credentials::EnvFileResolver;
use crate::adapters::mcp::stdio::{StdioServerSettings, StdioServers};
use crate::adapters::policy::RuleFilePolicy;
use crate::adapters::store;
use crate::api::{ApiParts, ApiSettings, ControlApi};
use crate::bridge::Turns;
use crate::config::{Config, ConfigErrors};
use crate::domain::mcp_server::{AuthScheme, ServerClassification};
use crate::domain::secret::CredentialRef;
use crate::pipeline::{
    MeteredStore, Pipeline, PipelineParts, PipelineSettings, RegistryLimits, ToolRegistry,
    Unobserved, Worker, WorkerSettings, register_discoveries,
};
use crate::ports::metrics::Metrics;
use crate::ports::{
    Clock, CredentialResolver, McpServers, PlatformEvent, PolicyEngine, StoreError, SystemClock,
};

/// Why a command could not run.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The configuration is invalid.
    #[error("{0}")]
    Config(#[from] ConfigErrors),
    /// The store failed.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// A part could not be started.
    #[error("{0}")]
    Startup(String),
}

/// What `toolgate check-config` reports about a valid file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigSummary {
    /// `sqlite` or `postgres`.
    pub store_backend: &'static str,
    /// Operator stdio servers configured (enabled or not).
    pub stdio_servers: usize,
    /// Egress allowlist entries.
    pub egress_entries: usize,
}

/// Loads and validates the configuration at `path` as `serve` would,
/// including the policy rule file it names.
pub fn check_config(
    path: &Path,
    environment: &BTreeMap<String, String>,
) -> Result<ConfigSummary, ConfigErrors> {
    let config = Config::load(path, environment)?;
    if let Some(file) = &config.policy.file
        && let Err(error) = crate::adapters::policy::RuleFilePolicy::load(file)
    {
        return Err(ConfigErrors(vec![crate::config::ConfigError {
            path: "policy.file".into(),
            message: format!("the rule file is invalid: {error}"),
        }]));
    }
    Ok(ConfigSummary {
        store_backend: if config.store.url.starts_with("sqlite:") {
            "sqlite"
        } else {
            "postgres"
        },
        stdio_servers: config.mcp.servers.len(),
        egress_entries: config.egress.allow.len(),
    })
}

/// The control socket the configuration at `path` names, for the operator
/// commands that talk to a running sidecar.
pub fn control_socket(
    path: &Path,
    environment: &BTreeMap<String, String>,
) -> Result<PathBuf, ConfigErrors> {
    Ok(Config::load(path, environment)?.control.socket)
}

/// `toolgate migrate`: applies the store's pending migrations and returns
/// the versions applied (empty when already current).
pub async fn migrate(
    path: &Path,
    environment: &BTreeMap<String, String>,
) -> Result<Vec<i64>, AppError> {
    let config = Config::load(path, environment)?;
    let store = store::connect(&config.store.url).await?;
    Ok(store.migrate().await?)
}

/// The operator's stdio servers as the MCP adapter takes them. The file is
/// already validated, so a scheme or reference that does not parse here
/// cannot occur; were it to, the server is left without a credential and
/// fails to connect rather than starting with a guessed one.
pub fn stdio_settings(config: &Config) -> Vec<StdioServerSettings> {
    config
        .mcp
        .servers
        .iter()
        .map(|server| StdioServerSettings {
            server_id: server.server_id.clone(),
            program: server.command.clone(),
            args: server.args.clone(),
            env: server.env.clone(),
            auth_scheme: server.auth.scheme.parse().unwrap_or(AuthScheme::None),
            auth_name: server.auth.name.clone(),
            credential_ref: server
                .auth
                .credential_ref
                .as_deref()
                .and_then(|text| CredentialRef::parse(text).ok()),
            classification: ServerClassification {
                side_effect: server.side_effect,
                risk: server.risk,
                idempotency: server.idempotency,
                required_scopes: server.required_scopes.iter().cloned().collect(),
                timeout_seconds: server.timeout_seconds,
                maximum_output_bytes: server.maximum_output_bytes,
            },
            connect_timeout: Duration::from_secs(u64::from(server.connect_timeout_seconds)),
            request_timeout: Duration::from_secs(u64::from(server.request_timeout_seconds)),
            idle_timeout: Duration::from_secs(u64::from(server.idle_timeout_seconds)),
            enabled: server.enabled,
            state_dir: config.mcp.state_directory.join(&server.server_id),
        })
        .collect()
}

/// What `toolgate discover` found for one server.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerReport {
    /// The server.
    pub server_id: String,
    /// `connected`, `pinned` or `disconnected`, with the event's body.
    pub events: Vec<PlatformEvent>,
    /// Registry names that registered.
    pub registered: Vec<String>,
    /// Skills its prompts became.
    pub skills: Vec<String>,
}

/// `toolgate discover`: connects to every configured stdio server, lists and
/// maps its catalog and registers it into a scratch registry, exactly as a
/// session's preparation would, and reports per server; records nothing.
pub async fn discover(
    path: &Path,
    environment: &BTreeMap<String, String>,
) -> Result<Vec<ServerReport>, AppError> {
    let config = Config::load(path, environment)?;
    let store = store::connect(&config.store.url).await?;
    let servers = StdioServers::new(
        stdio_settings(&config),
        Arc::new(EnvFileResolver::new(environment.clone())),
        store,
        Arc::new(SystemClock),
        Arc::default(),
    );
    let registry = ToolRegistry::with_builtins(
        RegistryLimits {
            maximum_output_bytes_ceiling: config.limits.maximum_output_bytes_ceiling,
        },
        Vec::new(),
    )
    .map_err(|error| AppError::Startup(error.to_string()))?;
    let (prepared, _) = register_discoveries(&registry, servers.discover().await);
    servers.shutdown().await;
    Ok(config
        .mcp
        .servers
        .iter()
        .filter(|server| server.enabled)
        .map(|server| {
            let prefix = format!("mcp.{}.", server.server_id);
            ServerReport {
                server_id: server.server_id.clone(),
                events: prepared
                    .events
                    .iter()
                    .filter(|event| event.payload()["server"] == server.server_id.as_str())
                    .cloned()
                    .collect(),
                registered: prepared
                    .registered
                    .iter()
                    .filter(|name| name.starts_with(&prefix))
                    .cloned()
                    .collect(),
                skills: prepared
                    .skills
                    .iter()
                    .filter(|skill| skill.name.starts_with(&prefix))
                    .map(|skill| skill.name.clone())
                    .collect(),
            }
        })
        .collect())
}

/// How `toolgate serve` runs.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// Apply pending migrations instead of refusing to start.
    pub migrate: bool,
}

/// `toolgate serve`: loads and validates the configuration, refuses pending
/// migrations unless told to apply them, registers a worker and runs
/// recovery, then serves the control API and the bridge until SIGTERM or
/// SIGINT. The first signal drains (no new calls; in-flight calls finish or
/// reach their deadline; turns, transports and sockets close; the lease is
/// released); a second one forces the exit.
pub async fn serve(
    path: &Path,
    environment: &BTreeMap<String, String>,
    options: ServeOptions,
) -> Result<(), AppError> {
    use tokio::signal::unix::{SignalKind, signal};

    check_config(path, environment)?;
    let config = Config::load(path, environment)?;
    let store = store::connect(&config.store.url).await?;
    let pending = store.pending_migrations().await?;
    if !pending.is_empty() {
        if !options.migrate {
            return Err(AppError::Startup(format!(
                "the store has {} pending migration(s); run `toolgate migrate` or `toolgate serve --migrate`",
                pending.len()
            )));
        }
        store.migrate().await?;
    }
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let state = config
        .artifacts
        .directory
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| config.artifacts.directory.clone());
    let policy: Arc<dyn PolicyEngine> = match &config.policy.file {
        Some(file) => Arc::new(
            RuleFilePolicy::load(file).map_err(|error| AppError::Startup(error.to_string()))?,
        ),
        None => Arc::new(RuleFilePolicy::built_in()),
    };
    let credentials = Arc::new(EnvFileResolver::new(environment.clone()));
    let metrics = Arc::new(Metrics::default());
    let servers = Arc::new(StdioServers::new(
        stdio_settings(&config),
        credentials.clone(),
        store.clone(),
        clock.clone(),
        metrics.clone(),
    ));
    let mut builtins = crate::builtin::demo::tools(&state.join("demo"));
    builtins.extend(crate::builtin::control::tools(servers.clone()));
    let registry = Arc::new(
        ToolRegistry::with_builtins(
            RegistryLimits {
                maximum_output_bytes_ceiling: config.limits.maximum_output_bytes_ceiling,
            },
            builtins,
        )
        .map_err(|error| AppError::Startup(error.to_string()))?,
    );
    let worker = Arc::new(
        Worker::register(
            store.clone(),
            clock.clone(),
            &node_name(environment),
            WorkerSettings::default(),
        )
        .await?,
    );
    let pipeline = Arc::new(Pipeline::new(PipelineParts {
        registry: registry.clone(),
        // The pipeline's writes are counted as they commit.
        store: Arc::new(MeteredStore::new(store.clone(), metrics.clone())),
        policy,
        artifacts: Arc::new(FsArtifactStore::new(config.artifacts.directory.clone())),
        credentials,
        clock: clock.clone(),
        observer: Arc::new(Unobserved),
        worker_id: worker.id(),
        settings: PipelineSettings {
            inline_maximum_bytes: config.limits.inline_maximum_bytes,
        },
    }));
    let sweeper = servers.spawn_idle_sweeper();
    let turns = Turns::new(&config.bridge.directory)
        .map_err(|error| AppError::Startup(error.to_string()))?;
    let api = ControlApi::new(ApiParts {
        pipeline: pipeline.clone(),
        registry,
        store: store.clone(),
        clock,
        mcp: servers.clone(),
        turns,
        settings: ApiSettings {
            approval_hold: Duration::from_secs(u64::from(config.bridge.approval_hold_seconds)),
            turn_call_cap: config.bridge.turn_call_cap,
            batch_concurrency: usize::try_from(config.limits.batch_concurrency).unwrap_or(8),
            egress: config.egress_allowlist(),
            operator_servers: config
                .mcp
                .servers
                .iter()
                .map(|server| server.server_id.clone())
                .collect(),
            ..ApiSettings::default()
        },
        metrics,
    });
    // Both listeners are bound before anything is served; if either cannot
    // be, nothing was, and the lease ends with the attempt.
    let listeners = async {
        let tcp = match (&config.control.tcp, &config.control.token_ref) {
            (Some(address), Some(reference)) => {
                let reference = CredentialRef::parse(reference)
                    .map_err(|error| AppError::Startup(error.to_string()))?;
                let token = EnvFileResolver::new(environment.clone())
                    .resolve(&reference)
                    .await
                    .map_err(|error| AppError::Startup(error.to_string()))?;
                let tcp = tokio::net::TcpListener::bind(address.as_str())
                    .await
                    .map_err(|error| AppError::Startup(format!("control.tcp: {error}")))?;
                tracing::info!(address = %address, "toolgate serving on loopback TCP");
                Some((tcp, token))
            }
            _ => None,
        };
        Ok::<_, AppError>((bind_control(&config.control.socket)?, tcp))
    }
    .await;
    let (listener, tcp) = match listeners {
        Ok(listeners) => listeners,
        Err(error) => {
            worker.release().await?;
            return Err(error);
        }
    };
    let shutdown = CancellationToken::new();
    // Recovery runs first, then heartbeats and periodic sweeps.
    let maintenance = worker.clone().spawn(pipeline, shutdown.clone());
    let serving = tokio::spawn(api.clone().serve_control(listener, shutdown.clone()));
    let serving_tcp = tcp.map(|(tcp, token)| {
        tokio::spawn(api.clone().serve_control_tcp(tcp, token, shutdown.clone()))
    });
    tracing::info!(socket = %config.control.socket.display(), "toolgate serving");

    let mut terminate =
        signal(SignalKind::terminate()).map_err(|error| AppError::Startup(error.to_string()))?;
    let mut interrupt =
        signal(SignalKind::interrupt()).map_err(|error| AppError::Startup(error.to_string()))?;
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    tracing::info!("toolgate draining");
    let drain = async {
        api.drain().await;
        shutdown.cancel();
        let _ = serving.await;
        if let Some(serving_tcp) = serving_tcp {
            let _ = serving_tcp.await;
        }
        let _ = maintenance.await;
        sweeper.abort();
        servers.shutdown().await;
    };
    tokio::select! {
        _ = drain => {}
        _ = terminate.recv() => tracing::warn!("toolgate forced to stop"),
        _ = interrupt.recv() => tracing::warn!("toolgate forced to stop"),
    }
    let _ = std::fs::remove_file(&config.control.socket);
    worker.release().await?;
    tracing::info!("toolgate stopped");
    Ok(())
}

fn node_name(environment: &BTreeMap<String, String>) -> String {
    environment
        .get("HOSTNAME")
        .cloned()
        .unwrap_or_else(|| "toolgate".to_owned())
}

/// Binds the control socket (0600), replacing a stale one a crashed process
/// left behind.
fn bind_control(socket: &Path) -> Result<tokio::net::UnixListener, AppError> {
    use std::os::unix::fs::PermissionsExt as _;
    if let Some(parent) = socket.parent() {
        std::fs::create_dir_all(parent).map_err(|error| AppError::Startup(error.to_string()))?;
    }
    if socket.exists() {
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Err(AppError::Startup(format!(
                "{} is in use by a running toolgate",
                socket.display()
            )));
        }
        let _ = std::fs::remove_file(socket);
    }
    let listener = tokio::net::UnixListener::bind(socket)
        .map_err(|error| AppError::Startup(format!("{}: {error}", socket.display())))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
        .map_err(|error| AppError::Startup(error.to_string()))?;
    Ok(listener)
}

/// One call (or one recovery sweep) in a process of its own, for the crash
/// tests: `toolgate __harness` reads this from standard input. With a
/// failpoint, the process aborts the moment the pipeline reaches it, exactly
/// as a crash would leave the database.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HarnessJob {
    /// The store.
    pub store_url: String,
    /// Where the demo tools write their effects.
    pub effects: std::path::PathBuf,
    /// The artifact store's root.
    pub artifacts: std::path::PathBuf,
    /// `call` or `recover`.
    pub mode: String,
    /// A point name at which to abort.
    #[serde(default)]
    pub failpoint: Option<String>,
    /// The worker's lease, in milliseconds.
    pub lease_ms: i64,
    /// `allow` (every call allowed) or `built_in` (external writes need
    /// approval).
    pub policy: String,
    /// The call, for `call`.
    #[serde(default)]
    pub request: Option<HarnessRequest>,
}

/// The call a harness job makes.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HarnessRequest {
    /// The tenant.
    pub tenant_id: String,
    /// The session.
    pub session_id: uuid::Uuid,
    /// The run.
    pub run_id: uuid::Uuid,
    /// The call id.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// Its arguments.
    pub arguments: serde_json::Value,
}

/// Aborts the process at one point.
struct Failpoint(crate::pipeline::Point);

impl crate::pipeline::StepObserver for Failpoint {
    fn reached(&self, point: crate::pipeline::Point, _: &str) {
        if point == self.0 {
            std::process::abort();
        }
    }
}

/// Runs a harness job and returns what the call (or sweep) produced.
pub async fn harness(job: HarnessJob) -> Result<serde_json::Value, AppError> {
    use std::sync::Arc;

    use crate::adapters::{
        artifacts::FsArtifactStore, credentials::EnvFileResolver, policy::RuleFilePolicy,
    };
    use crate::domain::{
        AgentSpec, ArgumentTrust, PolicyProfile, Principal, RuntimeEnvironment, TargetKind,
        TrustLevel,
    };
    use crate::pipeline::{
        CallRequest, Pipeline, PipelineParts, PipelineSettings, RegistryLimits, ToolRegistry,
    };
    use crate::ports::{Clock, SystemClock, WorkerLease};

    let invalid = |message: &str| {
        AppError::Config(ConfigErrors(vec![crate::config::ConfigError {
            path: "(job)".into(),
            message: message.into(),
        }]))
    };
    let store = store::connect(&job.store_url).await?;
    store.migrate().await?;
    let registry = Arc::new(
        ToolRegistry::with_builtins(
            RegistryLimits {
                maximum_output_bytes_ceiling: crate::config::DEFAULT_MAXIMUM_OUTPUT_BYTES_CEILING,
            },
            crate::builtin::demo::tools(&job.effects),
        )
        .map_err(|error| invalid(&error.to_string()))?,
    );
    let policy = match job.policy.as_str() {
        "allow" => RuleFilePolicy::parse("[[rules]]\ntools = [\"*\"]\ndecision = \"allow\"\n")
            .map_err(|e| invalid(&e.to_string()))?,
        _ => RuleFilePolicy::built_in(),
    };
    let failpoint = match &job.failpoint {
        Some(name) => {
            Some(crate::pipeline::Point::parse(name).ok_or_else(|| invalid("unknown failpoint"))?)
        }
        None => None,
    };
    let observer: Arc<dyn crate::pipeline::StepObserver> = match failpoint {
        Some(point) => Arc::new(Failpoint(point)),
        None => Arc::new(crate::pipeline::Unobserved),
    };
    let clock = Arc::new(SystemClock);
    let worker_id = uuid::Uuid::new_v4();
    let now = clock.now();
    store
        .register_worker(&WorkerLease {
            worker_id,
            node: "harness".into(),
            started_at: now,
            lease_expires_at: now + chrono::Duration::milliseconds(job.lease_ms),
        })
        .await?;
    let pipeline = Pipeline::new(PipelineParts {
        registry: registry.clone(),
        store: store.clone(),
        policy: Arc::new(policy),
        artifacts: Arc::new(FsArtifactStore::new(&job.artifacts)),
        credentials: Arc::new(EnvFileResolver::new(BTreeMap::new())),
        clock,
        observer,
        worker_id,
        settings: PipelineSettings {
            inline_maximum_bytes: crate::config::DEFAULT_INLINE_MAXIMUM_BYTES,
        },
    });
    let result = match (job.mode.as_str(), job.request) {
        ("recover", _) => {
            let report = pipeline.recover(100).await?;
            serde_json::json!({"taken": report.taken, "uncertain": report.uncertain})
        }
        ("call", Some(request)) => {
            let agent = AgentSpec {
                tools: vec!["demo.*".into()],
            };
            let principal = Principal {
                id: "harness".into(),
                scopes: ["demo.use".to_owned()].into(),
            };
            let environment = RuntimeEnvironment {
                targets: [TargetKind::InProcess].into(),
            };
            let pinned = registry.specs_for_session(
                &agent,
                &principal,
                &PolicyProfile::default(),
                &environment,
            );
            let outcome = pipeline
                .call(CallRequest {
                    tenant_id: request.tenant_id,
                    session_id: request.session_id,
                    run_id: request.run_id,
                    step_number: 1,
                    call_id: request.call_id,
                    name: request.tool,
                    arguments: request.arguments,
                    principal,
                    agent,
                    pinned,
                    origin_trust: TrustLevel::User,
                    argument_trust: ArgumentTrust::default(),
                    deadline_at: Some(now + chrono::Duration::seconds(60)),
                    parallel_group: None,
                    recovering: None,
                })
                .await;
            match outcome {
                crate::pipeline::CallOutcome::Finished(finished) => serde_json::json!({
                    "invocation_id": finished.invocation_id,
                    "outcome": finished.outcome,
                }),
                crate::pipeline::CallOutcome::Pending {
                    invocation_id,
                    approval_id,
                } => {
                    serde_json::json!({"invocation_id": invocation_id, "pending": {"approval_id": approval_id}})
                }
                crate::pipeline::CallOutcome::Suspended {
                    invocation_id,
                    kind,
                    reference,
                } => serde_json::json!({
                    "invocation_id": invocation_id,
                    "suspended": {"kind": kind, "reference": reference},
                }),
            }
        }
        _ => return Err(invalid("mode must be call (with a request) or recover")),
    };
    store.release_worker(worker_id, SystemClock.now()).await?;
    Ok(result)
}
