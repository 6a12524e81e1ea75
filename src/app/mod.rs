//! The composition root: the only place that wires adapters to ports.
//!
//! Reads nothing from the process on its own; `main` hands it the
//! configuration path and the environment.

mod front_keys;
mod identity;
mod reload;
mod serve;
mod sockets;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::adapters::credentials::EnvFileResolver;
use crate::adapters::egress::{Dialer, EgressSettings};
use crate::adapters::mcp::child::RunAs;
use crate::adapters::mcp::{AuthSettings, HttpServerSettings, McpServerSet, StdioServerSettings};
use crate::adapters::store;
use crate::adapters::telemetry::MetricsRegistry;
use crate::config::{Config, ConfigErrors, RunAsUser};
use crate::pipeline::{RegistryLimits, ToolRegistry, register_discoveries};
use crate::ports::{Clock, McpServers, Metrics, PlatformEvent, StoreError, SystemClock};

use front_keys::front_credentials;
pub use serve::{App, Listeners, Running, ServeOptions, build};

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
    /// The build's tools do not register.
    #[error("{0}")]
    Registry(#[from] crate::pipeline::registry::StartupError),
    /// A credential the configuration names could not be resolved.
    #[error("{what}: {source}")]
    Credential {
        /// The setting that names it.
        what: &'static str,
        #[source]
        source: crate::ports::CredentialError,
    },
    /// The egress dialer could not be built (its TLS roots).
    #[error("{0}")]
    Egress(#[from] crate::adapters::egress::EgressSetupError),
    /// The front door's credentials could not be built.
    #[error("{0}")]
    FrontCredentials(#[from] crate::front::auth::AuthError),
    /// `front.jwt` names neither a key set file nor a URL.
    #[error("front.jwt names no key set")]
    NoKeySet,
    /// Another live process holds this node's folder.
    #[error("{folder}: another toolgate runs as this node")]
    NodeHeld {
        /// The node folder.
        folder: String,
    },
    /// A socket's path is served by a running process.
    #[error("{path} is in use by a running toolgate")]
    SocketInUse {
        /// The socket's path.
        path: String,
    },
    /// A socket's group does not exist.
    #[error("{field}.socket_group names no group")]
    NoSuchGroup {
        /// The section naming it.
        field: String,
    },
    /// A listener, socket or folder could not be made or used; `what`
    /// names its setting or its path.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The store has migrations this binary would apply.
    #[error(
        "the store has {count} pending migration(s); run `toolgate migrate` or `toolgate serve --migrate`"
    )]
    PendingMigrations { count: usize },
    /// The policy file could not be loaded.
    #[error("{0}")]
    Policy(#[from] crate::adapters::policy::PolicyFileError),
    /// The bridge's folder could not be made.
    #[error("{0}")]
    Bridge(#[from] crate::bridge::BridgeError),
    /// The process could not give up what it must not hold.
    #[error("{what}: {source}")]
    Harden {
        what: &'static str,
        #[source]
        source: nix::Error,
    },
    /// A signal could not be listened for.
    #[error("signal: {0}")]
    Signal(#[source] std::io::Error),
    /// The worker could not be registered.
    #[error("{0}")]
    Worker(#[from] crate::pipeline::WorkerError),
    /// The node's identity is held from another place (a copy of its node
    /// folder registered while this process's lease had ended): this
    /// process drained and stopped, and the other keeps the node.
    #[error(
        "this node's identity is now held by a worker registered from another host or folder (a \
         copy of this node folder?); toolgate drained and stopped: give each process a node \
         folder of its own"
    )]
    LeaseLost,
}

/// The store the configuration names, connected as it says.
async fn connect_store(
    config: &Config,
    clock: std::sync::Arc<dyn crate::ports::Clock>,
) -> Result<std::sync::Arc<dyn crate::ports::Store>, crate::ports::StoreError> {
    store::connect_with(
        &config.store.url,
        store::PostgresSettings {
            connections: config.store.connections,
            transaction_pooling: config.store.transaction_pooling,
        },
        clock,
    )
    .await
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
        store_backend: if config.store.is_sqlite() {
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
/// commands that talk to a running sidecar: its `[control]` is enough.
pub fn control_socket(
    path: &Path,
    environment: &BTreeMap<String, String>,
) -> Result<PathBuf, ConfigErrors> {
    Config::control_socket_of(path, environment)
}

/// `toolgate migrate`: applies the store's pending migrations and returns
/// the versions applied (empty when already current).
pub async fn migrate(
    path: &Path,
    environment: &BTreeMap<String, String>,
) -> Result<Vec<i64>, AppError> {
    let config = Config::load(path, environment)?;
    let store = connect_store(&config, std::sync::Arc::new(crate::ports::SystemClock)).await?;
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
        worker_threads: config.runtime.worker_threads,
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

/// The operator's stdio servers as the MCP adapter takes them; a user a
/// server runs as that this system does not have is a problem at its field.
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
            let common = &server.common;
            let (field, run_as) = match (&server.run_as, &config.mcp.run_as) {
                (Some(own), _) => (format!("mcp.servers[{index}].run_as"), Some(own)),
                (None, Some(default)) => ("mcp.run_as".to_owned(), Some(default)),
                (None, None) => (String::new(), None),
            };
            let run_as = match run_as {
                Some(user) => match resolve_run_as(user) {
                    Ok(run_as) => Some(run_as),
                    Err(message) => {
                        problems.push(crate::config::ConfigError {
                            path: field.clone(),
                            message: message.to_owned(),
                        });
                        None
                    }
                },
                None if as_root => Some(unprivileged_user()),
                None => None,
            };
            if as_root && run_as.is_some_and(|user| user.uid == 0) {
                tracing::warn!(
                    server = %common.server_id,
                    field = %field,
                    "a stdio server runs as root, as its run_as says; it holds no capability"
                );
            }
            StdioServerSettings {
                server_id: common.server_id.clone(),
                program: server.command.clone(),
                args: server.args.clone(),
                env: server.env.clone(),
                auth_scheme: common.auth.scheme,
                auth_name: common.auth.name.clone(),
                credential_ref: common.auth.credential_ref.clone(),
                classification: common.classification(),
                connect_timeout: common.connect_timeout_seconds.duration(),
                request_timeout: common.request_timeout_seconds.duration(),
                idle_timeout: common.idle_timeout_seconds.duration(),
                enabled: common.enabled,
                state_dir: config.mcp.state_directory.join(&common.server_id),
                run_as,
                path: server.path.clone(),
            }
        })
        .collect();
    if problems.is_empty() {
        Ok(settings)
    } else {
        Err(ConfigErrors(problems))
    }
}

/// The operator's HTTP servers as the MCP adapter takes them.
pub fn http_settings(config: &Config) -> Vec<HttpServerSettings> {
    config
        .mcp
        .http_servers
        .iter()
        .map(|server| {
            let common = &server.common;
            HttpServerSettings {
                server_id: common.server_id.clone(),
                url: server.url.clone(),
                auth: AuthSettings {
                    scheme: common.auth.scheme,
                    name: common.auth.name.clone(),
                    credential_ref: common.auth.credential_ref.clone(),
                    token_endpoint: common.auth.token_endpoint.clone(),
                    token_scopes: common.auth.token_scopes.clone(),
                },
                classification: common.classification(),
                connect_timeout: common.connect_timeout_seconds.duration(),
                request_timeout: common.request_timeout_seconds.duration(),
                idle_timeout: common.idle_timeout_seconds.duration(),
                enabled: common.enabled,
            }
        })
        .collect()
}

/// The egress dialer the configuration describes.
pub fn egress_dialer(config: &Config) -> Result<Dialer, AppError> {
    Dialer::new(
        EgressSettings {
            allowlist: config.egress_allowlist(),
            allowed_cidrs: config.egress.allow_cidrs.clone(),
            connect_timeout: config.egress.connect_timeout_seconds.duration(),
            tls_timeout: config.egress.tls_timeout_seconds.duration(),
        },
        config.egress.extra_ca_file.as_deref(),
    )
    .map_err(AppError::from)
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
        config.mcp.discovery_reuse_seconds.duration(),
        crate::domain::mcp_server::TenantCeilings {
            maximum_output_bytes: config.limits.maximum_output_bytes_ceiling,
            timeout_seconds: config.limits.maximum_timeout_seconds.get(),
        },
    ))
}

/// The user a stdio server runs as when toolgate is root and nothing names
/// one: `nobody`, or its customary ids where the system has no such user.
fn unprivileged_user() -> RunAs {
    resolve_run_as(&RunAsUser::Name("nobody".to_owned())).unwrap_or(RunAs {
        uid: 65534,
        gid: 65534,
    })
}

/// A `run_as` user as ids: `uid:gid` as written, a uid with its passwd
/// group (or the same number), or a name from the system's user database.
fn resolve_run_as(user: &RunAsUser) -> Result<RunAs, &'static str> {
    use nix::unistd::{Uid, User};
    match user {
        &RunAsUser::Ids { uid, gid } => Ok(RunAs { uid, gid }),
        &RunAsUser::Uid(uid) => Ok(match User::from_uid(Uid::from_raw(uid)) {
            Ok(Some(user)) => RunAs {
                uid,
                gid: user.gid.as_raw(),
            },
            _ => RunAs { uid, gid: uid },
        }),
        RunAsUser::Name(name) => match User::from_name(name) {
            Ok(Some(user)) => Ok(RunAs {
                uid: user.uid.as_raw(),
                gid: user.gid.as_raw(),
            }),
            _ => Err("names no user of this system"),
        },
    }
}

/// Creates `folder` if missing and makes it traversable but not listable
/// by others (0711), and so each folder above it that toolgate's user owns
/// and others cannot traverse (made under toolgate's umask, 077): a stdio
/// server run as another user reaches its own state folder below, a
/// sandbox its turn's socket, and neither lists anything on the way.
fn traversable_folder(folder: &Path) -> Result<(), AppError> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let failed = |path: &Path, error: std::io::Error| AppError::Io {
        what: path.display().to_string(),
        source: error,
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
    nix::sys::prctl::set_dumpable(false).map_err(|source| AppError::Harden {
        what: "not dumpable",
        source,
    })?;
    nix::sys::prctl::set_no_new_privs().map_err(|source| AppError::Harden {
        what: "no_new_privs",
        source,
    })?;
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

/// A scratch SQLite file in the system's temporary folder, removed (with
/// its journal) when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        Scratch(std::env::temp_dir().join(format!(
            "toolgate-discover-{}.db",
            uuid::Uuid::new_v4().simple()
        )))
    }

    fn url(&self) -> String {
        format!("sqlite://{}", self.0.display())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut path = self.0.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

/// How often a discovery still under way says so.
const DISCOVERY_NOTICE: std::time::Duration = std::time::Duration::from_secs(5);

/// `toolgate discover`: connects to every configured server (stdio and HTTP), lists and
/// maps its catalog and registers it into a scratch registry, exactly as a
/// session's preparation would, and reports per server; records nothing.
/// What it is doing goes to `progress` as it goes.
pub async fn discover(
    path: &Path,
    environment: &BTreeMap<String, String>,
    progress: &(dyn Fn(String) + Sync),
) -> Result<Vec<ServerReport>, AppError> {
    let config = Config::load(path, environment)?;
    // What a discovery writes (its catalog rows, its events) goes to a
    // scratch store of its own, removed after: the configured store is
    // neither opened nor created.
    let scratch = Scratch::new();
    let store = store::connect(&scratch.url()).await?;
    store.migrate().await?;
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
            tenant_catalog_tools: config.limits.tenant_catalog_tools,
        },
        Vec::new(),
    )?;
    let stdio = config
        .mcp
        .servers
        .iter()
        .filter(|s| s.common.enabled)
        .count();
    let http = config
        .mcp
        .http_servers
        .iter()
        .filter(|s| s.common.enabled)
        .count();
    progress(format!(
        "starting {stdio} stdio server(s) and dialling {http} HTTP server(s); a server fetched on first use (as npx and uvx do) can take a while"
    ));
    // No tenant: the operator's servers only. Long work says it is still
    // going, so a first fetch is not mistaken for a hang.
    let started = tokio::time::Instant::now();
    let discovery = servers.discover("", None);
    tokio::pin!(discovery);
    let mut ticks = tokio::time::interval_at(started + DISCOVERY_NOTICE, DISCOVERY_NOTICE);
    let discovered = loop {
        tokio::select! {
            discovered = &mut discovery => break discovered,
            _ = ticks.tick() => progress(format!(
                "still waiting for the servers' catalogs ({} s)",
                started.elapsed().as_secs()
            )),
        }
    };
    let (prepared, _) = register_discoveries(&registry, "", discovered);
    servers.shutdown().await;
    let enabled = config
        .mcp
        .common()
        .filter(|(_, server)| server.enabled)
        .map(|(_, server)| server.server_id.clone());
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
