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
use crate::adapters::egress::{Dialer, EgressSettings};
use crate::adapters::mcp::child::RunAs;
use crate::adapters::mcp::{
    AuthSettings, HttpServerSettings, McpServerSet, StdioServerSettings, WarmUp,
};
use crate::adapters::policy::{ReloadablePolicy, RuleFilePolicy};
use crate::adapters::store;
use crate::adapters::telemetry::{
    LabelBounds, MeteredInvocations, MetricsRegistry, Sample, Sampler,
};
use crate::api::ops::{Operations, OpsConnections};
use crate::api::{ApiParts, ApiSettings, ControlApi};
use crate::bridge::{Bridge, BridgeParts, BridgeSettings, Turns};
use crate::config::{Config, ConfigErrors};
use crate::domain::egress::AllowedCidrs;
use crate::domain::mcp_server::{AuthScheme, ServerClassification};
use crate::domain::secret::CredentialRef;
use crate::edge::{ConnectionCap, EdgeLimits, InFlight};
use crate::front::{
    ApiKey, Credentials, Front, FrontParts, FrontSettings, JwtSettings, KeySource, TenantSource,
};
use crate::pipeline::admission::Admission;
use crate::pipeline::approvals::Approvals;
use crate::pipeline::artifacts::Artifacts;
use crate::pipeline::sessions::{SessionParts, Sessions};
use crate::pipeline::tenant_servers::{TenantCeilings, TenantServers};
use crate::pipeline::{
    NodePlace, Pipeline, PipelineParts, PipelineSettings, RegistryLimits, ToolRegistry, Unobserved,
    Worker, WorkerSettings, register_discoveries,
};
use crate::ports::{
    Clock, CredentialResolver, McpServers, Metrics, PlatformEvent, PolicyEngine, StoreError,
    SystemClock,
};

/// How often expired turns are closed and idle sessions forgotten.
const SWEEP_INTERVAL: Duration = Duration::from_secs(30);

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
    /// The worker could not be registered.
    #[error("{0}")]
    Worker(#[from] crate::pipeline::WorkerError),
    /// The worker's lease was lost while serving: the process drained and
    /// stopped, so another worker may take its calls; start it again.
    #[error("the worker lease was lost; toolgate drained and stopped (start it again)")]
    LeaseLost,
}

/// What `toolgate check-config` reports about a valid file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigSummary {
    /// `sqlite` or `postgres`.
    pub store_backend: &'static str,
    /// Operator stdio servers configured (enabled or not).
    pub stdio_servers: usize,
    /// Operator HTTP servers configured (enabled or not).
    pub http_servers: usize,
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
    stdio_settings(&config)?;
    // The trust roots load as serve would load them.
    if let Err(error) = egress_dialer(&config) {
        return Err(ConfigErrors(vec![crate::config::ConfigError {
            path: "egress".into(),
            message: error.to_string(),
        }]));
    }
    // So does the front door's key set.
    if config.front.enabled()
        && let Err(error) = front_credentials(&config)
    {
        return Err(ConfigErrors(vec![crate::config::ConfigError {
            path: "front".into(),
            message: error.to_string(),
        }]));
    }
    Ok(ConfigSummary {
        store_backend: if config.store.url.starts_with("sqlite:") {
            "sqlite"
        } else {
            "postgres"
        },
        stdio_servers: config.mcp.servers.len(),
        http_servers: config.mcp.http_servers.len(),
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

/// What `serve` needs before its runtime exists: the log filter and the
/// runtime's threads.
#[derive(Debug, Clone)]
pub struct ProcessSettings {
    /// `log.level`.
    pub log_level: String,
    /// `runtime.worker_threads`.
    pub worker_threads: usize,
    /// `[telemetry]`, when traces are exported.
    pub otlp: Option<crate::adapters::telemetry::otlp::OtlpSettings>,
}

/// The process settings of the configuration at `path`.
pub fn process_settings_of(config: &Config) -> ProcessSettings {
    ProcessSettings {
        log_level: config.log.level.clone(),
        worker_threads: usize::try_from(config.runtime.worker_threads).unwrap_or(2),
        otlp: config.telemetry.otlp_endpoint.as_ref().map(|endpoint| {
            crate::adapters::telemetry::otlp::OtlpSettings {
                endpoint: endpoint.clone(),
                sampling_ratio: config.telemetry.sampling_ratio,
                service_name: config.telemetry.service_name.clone(),
            }
        }),
    }
}

/// The process settings of the configuration at `path`.
pub fn process_settings(
    path: &Path,
    environment: &BTreeMap<String, String>,
) -> Result<ProcessSettings, ConfigErrors> {
    Ok(process_settings_of(&Config::load(path, environment)?))
}

/// The operator's stdio servers as the MCP adapter takes them. The file is
/// already validated, so a scheme or reference that does not parse here
/// cannot occur; were it to, the server is left without a credential and
/// fails to connect rather than starting with a guessed one.
pub fn stdio_settings(config: &Config) -> Result<Vec<StdioServerSettings>, ConfigErrors> {
    let mut problems = Vec::new();
    // Root is never a child's default: toolgate run as root starts a server
    // that names no user as `nobody`.
    let as_root = nix::unistd::geteuid().is_root();
    let settings = config
        .mcp
        .servers
        .iter()
        .enumerate()
        .map(|(index, server)| {
            let (field, run_as) = match (&server.run_as, &config.mcp.run_as) {
                (Some(own), _) => (format!("mcp.servers[{index}].run_as"), Some(own)),
                (None, Some(default)) => ("mcp.run_as".to_owned(), Some(default)),
                (None, None) => (String::new(), None),
            };
            let run_as = match run_as {
                Some(text) => match resolve_run_as(text) {
                    Ok(run_as) => Some(run_as),
                    Err(message) => {
                        problems.push(crate::config::ConfigError {
                            path: field.clone(),
                            message,
                        });
                        None
                    }
                },
                None if as_root => Some(unprivileged_user()),
                None => None,
            };
            if as_root && run_as.is_some_and(|user| user.uid == 0) {
                tracing::warn!(
                    server = %server.server_id,
                    field = %field,
                    "a stdio server runs as root, as its run_as says; it holds no capability"
                );
            }
            (server, run_as)
        })
        .map(|(server, run_as)| StdioServerSettings {
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
            run_as,
            path: server.path.clone(),
        })
        .collect();
    if problems.is_empty() {
        Ok(settings)
    } else {
        Err(ConfigErrors(problems))
    }
}

/// The operator's HTTP servers as the MCP adapter takes them. The file is
/// already validated, so a scheme or reference that does not parse cannot
/// occur; were it to, the server is left without a credential and fails to
/// connect rather than sending a guessed one.
pub fn http_settings(config: &Config) -> Vec<HttpServerSettings> {
    config
        .mcp
        .http_servers
        .iter()
        .map(|server| HttpServerSettings {
            server_id: server.server_id.clone(),
            url: server.url.clone(),
            auth: AuthSettings {
                scheme: server.auth.scheme.parse().unwrap_or(AuthScheme::None),
                name: server.auth.name.clone(),
                credential_ref: server
                    .auth
                    .credential_ref
                    .as_deref()
                    .and_then(|text| CredentialRef::parse(text).ok()),
                token_endpoint: server.auth.token_endpoint.clone(),
                token_scopes: server.auth.token_scopes.clone(),
            },
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
        })
        .collect()
}

/// The egress dialer the configuration describes.
pub fn egress_dialer(config: &Config) -> Result<Dialer, AppError> {
    let cidrs: Vec<&str> = config
        .egress
        .allow_cidrs
        .iter()
        .map(String::as_str)
        .collect();
    let allowed_cidrs = AllowedCidrs::parse(&cidrs).map_err(AppError::Startup)?;
    Dialer::new(
        EgressSettings {
            allowlist: config.egress_allowlist(),
            allowed_cidrs,
            connect_timeout: Duration::from_secs(u64::from(config.egress.connect_timeout_seconds)),
            tls_timeout: Duration::from_secs(u64::from(config.egress.tls_timeout_seconds)),
        },
        config.egress.extra_ca_file.as_deref(),
    )
    .map_err(|error| AppError::Startup(error.to_string()))
}

/// Where credential references resolve: toolgate's environment and files,
/// and each tenant's own secrets folder when one is configured.
fn credential_resolver(
    config: &Config,
    environment: &BTreeMap<String, String>,
) -> Arc<EnvFileResolver> {
    let resolver = EnvFileResolver::new(environment.clone());
    Arc::new(match &config.credentials.tenant_secrets_directory {
        Some(directory) => resolver.with_tenant_secrets(directory.clone()),
        None => resolver,
    })
}

/// Every MCP server the configuration names, and each tenant's own through
/// the store, dialled through egress.
fn mcp_servers(
    config: &Config,
    environment: &BTreeMap<String, String>,
    store: Arc<dyn crate::ports::Store>,
    clock: Arc<dyn Clock>,
    metrics: Arc<dyn Metrics>,
) -> Result<McpServerSet, AppError> {
    Ok(McpServerSet::new(
        stdio_settings(config)?,
        credential_resolver(config, environment),
        store,
        clock,
        metrics,
    )
    .with_http(
        http_settings(config),
        Arc::new(egress_dialer(config)?),
        Duration::from_secs(u64::from(config.mcp.discovery_reuse_seconds)),
    ))
}

/// The user a stdio server runs as when toolgate is root and nothing names
/// one: `nobody`, or its customary ids where the system has no such user.
fn unprivileged_user() -> RunAs {
    resolve_run_as("nobody").unwrap_or(RunAs {
        uid: 65534,
        gid: 65534,
    })
}

/// A `run_as` value as a user: `uid:gid`, a uid (its passwd group, or the
/// same number), or a user name from the system's user database.
fn resolve_run_as(text: &str) -> Result<RunAs, String> {
    use nix::unistd::{Uid, User};
    if let Some((uid, gid)) = text.split_once(':') {
        return match (uid.parse(), gid.parse()) {
            (Ok(uid), Ok(gid)) => Ok(RunAs { uid, gid }),
            _ => Err("must be a user name, a uid, or uid:gid".into()),
        };
    }
    let user = match text.parse::<u32>() {
        Ok(uid) => {
            return Ok(match User::from_uid(Uid::from_raw(uid)) {
                Ok(Some(user)) => RunAs {
                    uid,
                    gid: user.gid.as_raw(),
                },
                _ => RunAs { uid, gid: uid },
            });
        }
        Err(_) => User::from_name(text),
    };
    match user {
        Ok(Some(user)) => Ok(RunAs {
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
        }),
        _ => Err("names no user of this system".into()),
    }
}

/// Creates `folder` if missing and makes it traversable but not listable
/// by others (0711), and so each folder above it that toolgate's user owns
/// and others cannot traverse (made under toolgate's umask, 077): a stdio
/// server run as another user reaches its own state folder below, and
/// lists nothing on the way.
fn traversable_folder(folder: &Path) -> Result<(), AppError> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let failed = |path: &Path, error: std::io::Error| {
        AppError::Startup(format!("{}: {error}", path.display()))
    };
    std::fs::create_dir_all(folder).map_err(|error| failed(folder, error))?;
    std::fs::set_permissions(folder, std::fs::Permissions::from_mode(0o711))
        .map_err(|error| failed(folder, error))?;
    let folder = folder
        .canonicalize()
        .map_err(|error| failed(folder, error))?;
    let me = nix::unistd::geteuid().as_raw();
    for above in folder.ancestors().skip(1) {
        let metadata = std::fs::metadata(above).map_err(|error| failed(above, error))?;
        let mode = metadata.permissions().mode();
        if metadata.uid() != me || mode & 0o001 != 0 {
            break;
        }
        std::fs::set_permissions(above, std::fs::Permissions::from_mode(mode | 0o011))
            .map_err(|error| failed(above, error))?;
    }
    Ok(())
}

/// Makes `mcp.state_directory` reachable by the users stdio servers run as
/// when any runs as another user than toolgate's: one named by `run_as`,
/// or `nobody` under a toolgate run as root.
fn children_reach_state(config: &Config) -> Result<(), AppError> {
    if config.mcp.run_as.is_some()
        || nix::unistd::geteuid().is_root()
        || config
            .mcp
            .servers
            .iter()
            .any(|server| server.run_as.is_some())
    {
        traversable_folder(&config.mcp.state_directory)?;
    }
    Ok(())
}

/// Hardens the process before it opens anything: files and folders it
/// creates are its own only (umask 077), same-uid processes (a stdio server
/// run as toolgate's user among them) cannot read its memory or
/// environment (not dumpable), and nothing it starts can gain privileges
/// through a set-uid program or file capabilities (no_new_privs, inherited).
pub fn harden_process() -> Result<(), AppError> {
    use nix::sys::stat::{Mode, umask};
    umask(Mode::from_bits_truncate(0o077));
    nix::sys::prctl::set_dumpable(false)
        .map_err(|error| AppError::Startup(format!("not dumpable: {error}")))?;
    nix::sys::prctl::set_no_new_privs()
        .map_err(|error| AppError::Startup(format!("no_new_privs: {error}")))?;
    Ok(())
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

/// `toolgate discover`: connects to every configured server (stdio and HTTP), lists and
/// maps its catalog and registers it into a scratch registry, exactly as a
/// session's preparation would, and reports per server; records nothing.
pub async fn discover(
    path: &Path,
    environment: &BTreeMap<String, String>,
) -> Result<Vec<ServerReport>, AppError> {
    let config = Config::load(path, environment)?;
    let store = store::connect(&config.store.url).await?;
    children_reach_state(&config)?;
    let servers = mcp_servers(
        &config,
        environment,
        store,
        Arc::new(SystemClock),
        Arc::new(MetricsRegistry::default()),
    )?;
    let registry = ToolRegistry::with_builtins(
        RegistryLimits {
            maximum_output_bytes_ceiling: config.limits.maximum_output_bytes_ceiling,
        },
        Vec::new(),
    )
    .map_err(|error| AppError::Startup(error.to_string()))?;
    // No tenant: the operator's servers only.
    let (prepared, _) = register_discoveries(&registry, "", servers.discover("").await);
    servers.shutdown().await;
    let enabled = config
        .mcp
        .servers
        .iter()
        .filter(|server| server.enabled)
        .map(|server| server.server_id.clone())
        .chain(
            config
                .mcp
                .http_servers
                .iter()
                .filter(|server| server.enabled)
                .map(|server| server.server_id.clone()),
        );
    Ok(enabled
        .map(|server_id| {
            let prefix = format!("mcp.{server_id}.");
            ServerReport {
                events: prepared
                    .events
                    .iter()
                    .filter(|event| event.payload()["server"] == server_id.as_str())
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
                server_id,
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

/// A node built from its validated configuration: its identity held, its
/// store open (migrated when told to), its worker registered, every part
/// wired and every listener bound; nothing served yet. [`App::spawn`]
/// serves it; [`Running::drain`] ends it.
pub struct App {
    node: Node,
    sessions: Arc<Sessions>,
    api: Arc<ControlApi>,
    operations: Arc<Operations>,
    warm_up: WarmUp,
    warmed: CancellationToken,
    listeners: Listeners,
}

/// What a node holds from its build to the end of its drain.
struct Node {
    config: Config,
    /// Held until the node ends: one process at a time is this node.
    _identity: NodeIdentity,
    worker: Arc<Worker>,
    lease: Arc<crate::pipeline::Lease>,
    pipeline: Arc<Pipeline>,
    servers: Arc<McpServerSet>,
    bridge: Arc<Bridge>,
    front: Option<Arc<Front>>,
    in_flight: Arc<InFlight>,
    reloadable: Option<Arc<ReloadablePolicy>>,
}

/// Every listener a node serves, bound before any is served.
struct Listeners {
    control: tokio::net::UnixListener,
    tcp: Option<(tokio::net::TcpListener, crate::domain::SecretValue)>,
    ops: Option<tokio::net::TcpListener>,
    front_tcp: Option<tokio::net::TcpListener>,
    front_unix: Option<tokio::net::UnixListener>,
}

/// Builds the node `config` describes (`environment` resolves its
/// references): refuses pending migrations unless `options` says to apply
/// them, registers a worker, wires every part and binds every listener. If
/// one cannot be bound, nothing is served and the lease ends at once.
pub async fn build(
    config: Config,
    environment: &BTreeMap<String, String>,
    options: ServeOptions,
) -> Result<App, AppError> {
    // Held until the process ends: one process at a time is this node.
    let node = NodeIdentity::acquire(&config.node.directory)?;
    let store = open_store(&config, &options).await?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let state = config
        .artifacts
        .directory
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| config.artifacts.directory.clone());
    let reloadable = match &config.policy.file {
        Some(file) => Some(Arc::new(
            ReloadablePolicy::load(file).map_err(|error| AppError::Startup(error.to_string()))?,
        )),
        None => None,
    };
    let policy: Arc<dyn PolicyEngine> = match &reloadable {
        Some(reloadable) => reloadable.clone(),
        None => Arc::new(RuleFilePolicy::built_in()),
    };
    let credentials = credential_resolver(&config, environment);
    let registry_of_metrics = Arc::new(
        MetricsRegistry::default().with_bounds(LabelBounds {
            named_servers: config
                .operator_server_ids()
                .into_iter()
                .chain(config.ops.metrics_tenant_servers.iter().cloned())
                .collect(),
        }),
    );
    let metrics: Arc<dyn Metrics> = registry_of_metrics.clone();
    children_reach_state(&config)?;
    let servers = Arc::new(mcp_servers(
        &config,
        environment,
        store.clone(),
        clock.clone(),
        metrics.clone(),
    )?);
    let builtins = crate::builtin::tools(
        &state.join("demo"),
        servers.clone(),
        store.clone(),
        clock.clone(),
    );
    let registry = Arc::new(
        ToolRegistry::with_builtins(
            RegistryLimits {
                maximum_output_bytes_ceiling: config.limits.maximum_output_bytes_ceiling,
            },
            builtins,
        )
        .map_err(|error| AppError::Startup(error.to_string()))?,
    );
    let seconds = |value: u32| Duration::from_secs(u64::from(value));
    let worker = Arc::new(
        Worker::register(
            store.clone(),
            clock.clone(),
            &node.place,
            WorkerSettings {
                lease: seconds(config.node.lease_seconds),
                heartbeat: seconds(config.node.heartbeat_seconds),
                sweep: seconds(config.node.sweep_seconds),
                maximum_clock_skew: seconds(config.node.maximum_clock_skew_seconds),
                ..WorkerSettings::default()
            },
        )
        .await?,
    );
    let lease = worker.lease();
    let artifact_files: Arc<dyn crate::ports::ArtifactStore> =
        Arc::new(FsArtifactStore::new(config.artifacts.directory.clone()));
    let artifacts = Arc::new(Artifacts::new(store.clone(), artifact_files.clone()));
    let pipeline = Arc::new(Pipeline::new(PipelineParts {
        registry: registry.clone(),
        // The pipeline's writes are counted as they commit.
        invocations: Arc::new(MeteredInvocations::new(store.clone(), metrics.clone())),
        approvals: store.clone(),
        policy,
        artifacts: artifact_files.clone(),
        credentials,
        clock: clock.clone(),
        observer: Arc::new(Unobserved),
        mcp: Some(servers.clone()),
        worker_id: worker.id(),
        lease: lease.clone(),
        settings: PipelineSettings {
            inline_maximum_bytes: config.limits.inline_maximum_bytes,
        },
    }));
    let sessions = Arc::new(Sessions::new(SessionParts {
        registry,
        sessions: store.clone(),
        catalog: store.clone(),
        mcp: servers.clone(),
        clock: clock.clone(),
    }));
    let approvals = Arc::new(Approvals::new(store.clone(), clock.clone()));
    let in_flight = Arc::new(InFlight::default());
    let edge_limits = EdgeLimits {
        body_limit: usize::try_from(config.limits.request_body_bytes).unwrap_or(usize::MAX),
        header_timeout: Duration::from_secs(u64::from(
            config.limits.request_header_timeout_seconds,
        )),
        body_timeout: Duration::from_secs(u64::from(config.limits.request_body_timeout_seconds)),
    };
    let connections = |maximum: u32| ConnectionCap::new(usize::try_from(maximum).unwrap_or(1));
    let turns = Turns::new(&config.bridge.directory)
        .map_err(|error| AppError::Startup(error.to_string()))?;
    let bridge = Bridge::new(BridgeParts {
        pipeline: pipeline.clone(),
        sessions: sessions.clone(),
        approvals: approvals.clone(),
        artifacts: artifacts.clone(),
        events: store.clone(),
        clock: clock.clone(),
        metrics: metrics.clone(),
        in_flight: in_flight.clone(),
        connections: connections(config.limits.bridge_connections),
        turns,
        settings: BridgeSettings {
            limits: edge_limits,
            turn_connections: usize::try_from(config.limits.turn_connections).unwrap_or(1),
            approval_hold: Duration::from_secs(u64::from(config.bridge.approval_hold_seconds)),
            tenant_approval_holds: config
                .bridge
                .tenant_approval_hold_seconds
                .iter()
                .map(|(tenant, seconds)| (tenant.clone(), Duration::from_secs(u64::from(*seconds))))
                .collect(),
            turn_call_cap: config.bridge.turn_call_cap,
            ..BridgeSettings::default()
        },
    });
    // The operator's servers are discovered in the background: the node
    // is ready once the first round is done, or its bound has passed.
    let warmed = CancellationToken::new();
    let warm_up = WarmUp {
        connect_timeout: Duration::from_secs(u64::from(config.mcp.warmup_connect_timeout_seconds)),
        retry: Duration::from_secs(u64::from(config.mcp.warmup_retry_seconds)),
        attempts: config.mcp.warmup_attempts,
    };
    let operations = Arc::new(Operations {
        metrics: metrics.clone(),
        schema: store.clone(),
        in_flight: in_flight.clone(),
        lease: lease.clone(),
        warmed: warmed.clone(),
        warm_up_bound: tokio::time::Instant::now() + warm_up.connect_timeout,
        connections: OpsConnections::new(OPS_CONNECTIONS),
    });
    let api = ControlApi::new(ApiParts {
        sessions: sessions.clone(),
        admission: Admission::new(
            pipeline.clone(),
            clock.clone(),
            usize::try_from(config.limits.batch_concurrency).unwrap_or(8),
        ),
        pipeline: pipeline.clone(),
        approvals: approvals.clone(),
        artifacts,
        continue_trace: crate::adapters::telemetry::otlp::continue_trace,
        tenant_servers: TenantServers::new(
            store.clone(),
            clock.clone(),
            config.egress_allowlist(),
            config.operator_server_ids(),
            TenantCeilings {
                maximum_output_bytes: config.limits.maximum_output_bytes_ceiling,
                timeout_seconds: config.limits.maximum_timeout_seconds,
            },
        ),
        bridge: bridge.clone(),
        invocations: store.clone(),
        reviews: store.clone(),
        events: store.clone(),
        metrics: metrics.clone(),
        in_flight: in_flight.clone(),
        connections: connections(config.limits.control_connections),
        readiness: operations.clone(),
        clock: clock.clone(),
        settings: ApiSettings {
            limits: edge_limits,
        },
    });
    let front = if config.front.enabled() {
        let credentials = front_credentials(&config)?;
        let settings = &config.front;
        Some(Front::new(FrontParts {
            sessions: sessions.clone(),
            pipeline: pipeline.clone(),
            approvals: approvals.clone(),
            credentials,
            in_flight: in_flight.clone(),
            connections: connections(settings.connections),
            settings: FrontSettings {
                limits: edge_limits,
                allowed_hosts: settings.hosts(),
                allowed_origins: settings.allowed_origins.clone(),
                resource: settings.resource.clone(),
                authorization_servers: settings.authorization_servers.clone(),
                scopes_supported: settings.scopes_supported.clone(),
                approval_hold: seconds(settings.approval_hold_seconds),
                session_in_flight: usize::try_from(settings.session_in_flight).unwrap_or(1),
                sessions_per_credential: usize::try_from(settings.sessions_per_credential)
                    .unwrap_or(1),
                keep_alive: seconds(settings.keep_alive_seconds),
            },
        }))
    } else {
        None
    };
    registry_of_metrics.add_sampler(Arc::new(ServeSampler {
        in_flight: in_flight.clone(),
        bridge: bridge.clone(),
        servers: servers.clone(),
        store: store.clone(),
    }));
    // Every listener is bound before anything is served; if one cannot be,
    // nothing was, and the lease ends with the attempt.
    let listeners = match bind_listeners(&config, environment, front.is_some()).await {
        Ok(listeners) => listeners,
        Err(error) => {
            worker.release().await?;
            return Err(error);
        }
    };
    Ok(App {
        node: Node {
            config,
            _identity: node,
            worker,
            lease,
            pipeline,
            servers,
            bridge,
            front,
            in_flight,
            reloadable,
        },
        sessions,
        api,
        operations,
        warm_up,
        warmed,
        listeners,
    })
}

/// The store the configuration names, its migrations applied when
/// `options` says so (refused as pending otherwise).
async fn open_store(
    config: &Config,
    options: &ServeOptions,
) -> Result<Arc<dyn crate::ports::Store>, AppError> {
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
    if store.row_security_bypassed().await? {
        tracing::warn!(
            "the store's PostgreSQL role is a superuser or has BYPASSRLS: row-level security \
             does not isolate tenants; run serve as a role that owns nothing and may only use \
             the tables (see docs/operations.md)"
        );
    }
    Ok(store)
}

/// Every listener the configuration names (`front` whether the front
/// door serves), bound.
async fn bind_listeners(
    config: &Config,
    environment: &BTreeMap<String, String>,
    front: bool,
) -> Result<Listeners, AppError> {
    let tcp = match (&config.control.tcp, &config.control.token_ref) {
        (Some(address), Some(reference)) => {
            let reference = CredentialRef::parse(reference)
                .map_err(|error| AppError::Startup(error.to_string()))?;
            let token = EnvFileResolver::new(environment.clone())
                .resolve(&reference)
                .await
                .map_err(|error| AppError::Startup(error.to_string()))?;
            Some((bind_tcp(address, "control.tcp").await?, token))
        }
        _ => None,
    };
    let ops = match &config.ops.listen {
        Some(address) => Some(bind_tcp(address, "ops.listen").await?),
        None => None,
    };
    let front_tcp = match (front, &config.front.listen) {
        (true, Some(address)) => Some(bind_tcp(address, "front.listen").await?),
        _ => None,
    };
    let front_unix = match (front, &config.front.socket) {
        (true, Some(socket)) => {
            let bound = bind_socket(
                socket,
                config.front.socket_mode_bits(),
                config.front.socket_group.as_deref(),
                "front",
            )?;
            tracing::info!(socket = %socket.display(), "MCP front door serving on a unix socket");
            Some(bound)
        }
        _ => None,
    };
    Ok(Listeners {
        control: bind_control(&config.control)?,
        tcp,
        ops,
        front_tcp,
        front_unix,
    })
}

/// A TCP listener on `address`, the configuration's `field`; its failure
/// names the field.
async fn bind_tcp(address: &str, field: &str) -> Result<tokio::net::TcpListener, AppError> {
    let bound = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|error| AppError::Startup(format!("{field}: {error}")))?;
    tracing::info!(address = %address, listener = field, "listening");
    Ok(bound)
}

impl App {
    /// Serves the node: recovery first, then heartbeats and sweeps; the
    /// listeners; the warm-up of the operator's servers in the background.
    pub fn spawn(self) -> Running {
        let App {
            node,
            sessions,
            api,
            operations,
            warm_up,
            warmed,
            listeners,
        } = self;
        let Node {
            config,
            worker,
            pipeline,
            servers,
            bridge,
            front,
            ..
        } = &node;
        let Listeners {
            control: listener,
            tcp,
            ops,
            front_tcp,
            front_unix,
        } = listeners;
        let sweeper = servers.spawn_idle_sweeper();
        // The operator's servers are discovered in the background: the node
        // is ready once the first round is done, or its bound has passed.
        let warming = {
            let servers = servers.clone();
            tokio::spawn(async move { servers.warm_up(warm_up, warmed).await })
        };
        let shutdown = CancellationToken::new();
        // Recovery runs first, then heartbeats and periodic sweeps.
        let maintenance = worker.clone().spawn(pipeline.clone(), shutdown.clone());
        let serving = tokio::spawn(api.clone().serve_control(listener, shutdown.clone()));
        let sweeping = tokio::spawn(sweep(bridge.clone(), sessions, shutdown.clone()));
        let serving_tcp = tcp.map(|(tcp, token)| {
            tokio::spawn(api.clone().serve_control_tcp(tcp, token, shutdown.clone()))
        });
        let mut serving_front = Vec::new();
        if let Some(front) = &front {
            serving_front.push(tokio::spawn(
                front.credentials().clone().refresh(shutdown.clone()),
            ));
            if let Some(tcp) = front_tcp {
                serving_front.push(tokio::spawn(front.clone().serve_tcp(tcp, shutdown.clone())));
            }
            if let Some(unix) = front_unix {
                serving_front.push(tokio::spawn(
                    front.clone().serve_unix(unix, shutdown.clone()),
                ));
            }
        }
        // The operations listener answers until the process ends: a draining
        // process is not ready, and says so.
        let stop_ops = CancellationToken::new();
        let serving_ops = ops.map(|ops| tokio::spawn(operations.serve(ops, stop_ops.clone())));
        tracing::info!(socket = %config.control.socket.display(), "toolgate serving");
        Running {
            node,
            shutdown,
            stop_ops,
            tasks: Tasks {
                maintenance,
                serving,
                sweeping,
                serving_tcp,
                serving_front,
                serving_ops,
                warming,
                sweeper,
            },
        }
    }
}

/// A node being served.
pub struct Running {
    node: Node,
    shutdown: CancellationToken,
    stop_ops: CancellationToken,
    tasks: Tasks,
}

/// What a running node has spawned, each ended in its turn by the drain.
struct Tasks {
    maintenance: tokio::task::JoinHandle<()>,
    serving: tokio::task::JoinHandle<()>,
    sweeping: tokio::task::JoinHandle<()>,
    serving_tcp: Option<tokio::task::JoinHandle<()>>,
    serving_front: Vec<tokio::task::JoinHandle<()>>,
    serving_ops: Option<tokio::task::JoinHandle<()>>,
    warming: tokio::task::JoinHandle<()>,
    sweeper: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Cancelled when this node's lease is lost: another worker may take
    /// its calls, so it must serve no more, drain, and stop.
    pub fn lease_lost(&self) -> CancellationToken {
        self.node.lease.lost()
    }

    /// What SIGHUP asks for: the policy file and the front door's
    /// credentials read again; what does not validate leaves what is in
    /// force.
    pub fn reload(&self) {
        match &self.node.reloadable {
            // The file is the operator's: its error names a line, never a
            // secret.
            Some(reloadable) => match reloadable.reload() {
                Ok(()) => tracing::info!("policy reloaded"),
                Err(error) => {
                    tracing::warn!(error = %error, "policy not reloaded; the rules in force stay")
                }
            },
            None => tracing::info!("no policy file to reload"),
        }
        if let Some(front) = &self.node.front {
            reload_front_credentials(front, &self.node.config.front);
        }
    }

    /// Drains: no new calls; calls in flight finish or reach their
    /// deadline within `runtime.drain_timeout_seconds`; turns, transports
    /// and sockets close; the lease is released. `force` ending first cuts
    /// the wait short. `lease_lost` says why it drains.
    pub async fn drain(
        self,
        force: impl Future<Output = ()>,
        lease_lost: bool,
    ) -> Result<(), AppError> {
        let Running {
            node,
            shutdown,
            stop_ops,
            tasks,
        } = self;
        let Node {
            config,
            _identity,
            worker,
            pipeline,
            servers,
            bridge,
            front,
            in_flight,
            ..
        } = node;
        let Tasks {
            maintenance,
            serving,
            sweeping,
            serving_tcp,
            serving_front,
            serving_ops,
            warming,
            sweeper,
        } = tasks;
        tracing::info!("toolgate draining");
        let drain = async {
            let drain_timeout =
                Duration::from_secs(u64::from(config.runtime.drain_timeout_seconds));
            in_flight.drain(drain_timeout).await;
            // Results the store failed under are written if it answers within
            // the grace; what is left the table recovers.
            pipeline.drain_settlements(drain_timeout).await;
            bridge.close_all().await;
            warming.abort();
            shutdown.cancel();
            let _ = sweeping.await;
            let _ = serving.await;
            if let Some(serving_tcp) = serving_tcp {
                let _ = serving_tcp.await;
            }
            for serving in serving_front {
                let _ = serving.await;
            }
            let _ = maintenance.await;
            sweeper.abort();
            servers.shutdown().await;
        };
        tokio::select! {
            _ = drain => {}
            _ = force => tracing::warn!("toolgate forced to stop"),
        }
        stop_ops.cancel();
        if let Some(serving_ops) = serving_ops {
            let _ = serving_ops.await;
        }
        let _ = std::fs::remove_file(&config.control.socket);
        if let (Some(_), Some(socket)) = (&front, &config.front.socket) {
            let _ = std::fs::remove_file(socket);
        }
        worker.release().await?;
        tracing::info!("toolgate stopped");
        if lease_lost {
            return Err(AppError::LeaseLost);
        }
        Ok(())
    }
}

/// SIGHUP: the front door's API keys file and JWK set file are read again;
/// what does not validate leaves the credentials in force as they were.
fn reload_front_credentials(front: &Front, config: &crate::config::FrontConfig) {
    if config.api_keys_file.is_some() {
        match all_front_keys(config) {
            Ok(keys) => {
                let count = keys.len();
                front.credentials().replace_keys(keys);
                tracing::info!(keys = count, "front door API keys reloaded");
            }
            Err(errors) => {
                tracing::warn!(error = %errors, "front door API keys not reloaded; the keys in force stay")
            }
        }
    }
    if let Err(error) = front.credentials().reload_key_file() {
        tracing::warn!(error = %error, "front door key set not reloaded; the set in force stays");
    }
}

/// Connections the operations listener holds at once; past it, a new one
/// replaces the oldest that sent no request.
const OPS_CONNECTIONS: usize = 64;

/// The gauges read when metrics are scraped.
struct ServeSampler {
    in_flight: Arc<InFlight>,
    bridge: Arc<Bridge>,
    servers: Arc<McpServerSet>,
    store: Arc<dyn crate::ports::Store>,
}

impl Sampler for ServeSampler {
    fn sample(&self) -> crate::ports::BoxFuture<'_, Vec<Sample>> {
        Box::pin(async move {
            let count = |value: usize| i64::try_from(value).unwrap_or(i64::MAX);
            let mut samples: Vec<Sample> = vec![
                (
                    "requests_in_flight",
                    Vec::new(),
                    count(usize::try_from(self.in_flight.count()).unwrap_or(usize::MAX)),
                ),
                ("turns_open", Vec::new(), count(self.bridge.open_turns())),
            ];
            for (server, connected) in self.servers.connection_counts().await {
                samples.push((
                    "mcp_connections",
                    vec![("server", server)],
                    count(connected),
                ));
            }
            match self.store.queue_depths().await {
                Ok(depths) => {
                    samples.push((
                        "review_queue_depth",
                        Vec::new(),
                        depths.unresolved_uncertain,
                    ));
                    samples.push(("approvals_pending", Vec::new(), depths.pending_approvals));
                }
                Err(error) => tracing::warn!(error = %error, "queue depths not read"),
            }
            samples
        })
    }
}

/// Closes expired turns and forgets idle sessions, until `shutdown`.
async fn sweep(bridge: Arc<Bridge>, sessions: Arc<Sessions>, shutdown: CancellationToken) {
    let mut interval = tokio::time::interval(SWEEP_INTERVAL);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = interval.tick() => {
                bridge.close_expired().await;
                sessions.forget_idle(&bridge.sessions_in_use()).await;
            }
        }
    }
}

/// This node's identity: the id kept in its state folder with where that
/// folder is, and the lock on it, held for as long as the process runs.
struct NodeIdentity {
    place: NodePlace,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

/// Where a node folder is: the host's boot and the folder's own device and
/// inode, hashed. A copy of the folder (elsewhere on this host, or on
/// another) has another; the same folder after a restart has the same.
fn node_host(directory: &Path) -> Result<String, std::io::Error> {
    use std::os::unix::fs::MetadataExt as _;
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let metadata = std::fs::metadata(directory)?;
    let place = format!("{}\0{}\0{}", boot.trim(), metadata.dev(), metadata.ino());
    Ok(crate::domain::sha256_hex(place.as_bytes())[..32].to_owned())
}

impl NodeIdentity {
    /// Takes the node's lock (refusing when another process holds it) and
    /// reads its id, making one on first start.
    fn acquire(directory: &Path) -> Result<NodeIdentity, AppError> {
        use std::io::Write as _;
        use std::os::unix::fs::DirBuilderExt as _;
        let failed = |what: &str, error: &dyn std::fmt::Display| {
            AppError::Startup(format!("{} ({what}): {error}", directory.display()))
        };
        // The folder is toolgate's alone; the folders above it, made as any
        // would be, stay reachable by the users its children run as.
        if let Some(parent) = directory.parent() {
            std::fs::create_dir_all(parent).map_err(|error| failed("node folder", &error))?;
        }
        match std::fs::DirBuilder::new().mode(0o700).create(directory) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(error) => return Err(failed("node folder", &error)),
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(directory.join("node.lock"))
            .map_err(|error| failed("node lock", &error))?;
        let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|_| {
                AppError::Startup(format!(
                    "{}: another toolgate runs as this node",
                    directory.display()
                ))
            })?;
        let path = directory.join("node.id");
        let id = match std::fs::read_to_string(&path) {
            Ok(text) if uuid::Uuid::parse_str(text.trim()).is_ok() => text.trim().to_owned(),
            Ok(_) => return Err(failed("node.id", &"not a node id")),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                let id = uuid::Uuid::new_v4().to_string();
                let mut file =
                    std::fs::File::create(&path).map_err(|error| failed("node.id", &error))?;
                file.write_all(id.as_bytes())
                    .and_then(|()| file.sync_all())
                    .map_err(|error| failed("node.id", &error))?;
                id
            }
            Err(error) => return Err(failed("node.id", &error)),
        };
        let host = node_host(directory).map_err(|error| failed("node folder", &error))?;
        Ok(NodeIdentity {
            place: NodePlace { node: id, host },
            _lock: lock,
        })
    }
}

/// Binds the control socket (0600), replacing a stale one a crashed process
/// left behind.
fn bind_control(
    control: &crate::config::ControlConfig,
) -> Result<tokio::net::UnixListener, AppError> {
    bind_socket(
        &control.socket,
        control.socket_mode_bits(),
        control.socket_group.as_deref(),
        "control",
    )
}

/// Binds a unix socket with its mode and group, replacing a stale one a
/// crashed process left behind; `field` names its section in errors.
fn bind_socket(
    socket: &Path,
    mode: u32,
    group: Option<&str>,
    field: &str,
) -> Result<tokio::net::UnixListener, AppError> {
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
    // The group first, then the mode: never a moment in which the socket
    // is open to a group it was not meant for.
    if let Some(group) = group {
        let gid = crate::config::resolve_group(group)
            .ok_or_else(|| AppError::Startup(format!("{field}.socket_group names no group")))?;
        std::os::unix::fs::chown(socket, None, Some(gid))
            .map_err(|error| AppError::Startup(format!("{field}.socket_group: {error}")))?;
    }
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(mode))
        .map_err(|error| AppError::Startup(error.to_string()))?;
    Ok(listener)
}

/// The front door's API keys as the front door holds them.
fn front_keys(keys: &[crate::config::ApiKeyConfig]) -> Vec<ApiKey> {
    keys.iter()
        .map(|key| ApiKey {
            id: key.id.clone(),
            sha256: key.sha256.clone(),
            tenant_id: key.tenant_id.clone(),
            principal: key.principal.clone(),
            tools: key.tools.clone(),
            origin_trust: key.origin_trust,
        })
        .collect()
}

/// Every API key the configuration names: its own and its file's.
fn all_front_keys(front: &crate::config::FrontConfig) -> Result<Vec<ApiKey>, ConfigErrors> {
    let mut keys = front_keys(&front.api_keys);
    if let Some(file) = &front.api_keys_file {
        keys.extend(front_keys(&crate::config::read_api_keys_file(file)?));
    }
    Ok(keys)
}

/// The front door's credentials, from `[front]`.
fn front_credentials(config: &Config) -> Result<Arc<Credentials>, AppError> {
    let front = &config.front;
    let keys = all_front_keys(front).map_err(AppError::Config)?;
    let jwt = match &front.jwt {
        Some(jwt) => Some(JwtSettings {
            issuer: jwt.issuer.clone(),
            audiences: jwt.audiences.clone(),
            algorithms: jwt
                .algorithms
                .iter()
                .filter_map(|alg| alg.parse().ok())
                .collect(),
            leeway: Duration::from_secs(u64::from(jwt.leeway_seconds)),
            tenant: match &jwt.tenant_id {
                Some(tenant) => TenantSource::Fixed(tenant.clone()),
                None => TenantSource::Claim(jwt.tenant_claim.clone()),
            },
            principal_claim: jwt.principal_claim.clone(),
            scopes_claim: jwt.scopes_claim.clone(),
            tools: jwt.tools.clone(),
            origin_trust: jwt.origin_trust,
            keys: match (&jwt.jwks_file, &jwt.jwks_url) {
                (Some(file), _) => KeySource::File(file.clone()),
                (None, Some(url)) => KeySource::Url {
                    url: url.clone(),
                    refresh: Duration::from_secs(u64::from(jwt.jwks_refresh_seconds)),
                },
                (None, None) => return Err(AppError::Startup("front.jwt names no key set".into())),
            },
        }),
        None => None,
    };
    let dialer: Arc<dyn crate::ports::EgressDialer> = Arc::new(egress_dialer(config)?);
    Ok(Arc::new(
        Credentials::new(keys, jwt, dialer)
            .map_err(|error| AppError::Startup(error.to_string()))?,
    ))
}
