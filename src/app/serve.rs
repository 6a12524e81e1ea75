//! `toolgate serve`'s node: built, spawned, drained.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::front_keys::front_credentials;
use super::identity::NodeIdentity;
use super::reload::Reloader;
use super::sockets::{bind_control, bind_socket};
use super::{
    AppError, SWEEP_INTERVAL, children_reach_state, credential_resolver, mcp_servers,
    traversable_folder,
};
use crate::adapters::artifacts::FsArtifactStore;
use crate::adapters::credentials::{EnvFileResolver, KeySealer};
use crate::adapters::mcp::grant::Custody;
use crate::adapters::mcp::{ConsentSettings, Delegations, McpServerSet, StoredGrants, WarmUp};
use crate::adapters::policy::{ReloadablePolicy, RuleFilePolicy};
use crate::adapters::telemetry::{
    LabelBounds, MeteredInvocations, MetricsRegistry, Sample, Sampler,
};
use crate::api::ops::{Operations, OpsConnections};
use crate::api::{ApiParts, ApiSettings, ControlApi};
use crate::bridge::{Bridge, BridgeParts, BridgeSettings, Turns};
use crate::config::Config;
use crate::console::{ConsentParts, Console, ConsoleParts, ConsoleSettings, Operator};
use crate::domain::secret::CredentialRef;
use crate::edge::{ConnectionCap, EdgeLimits, InFlight};
use crate::front::{Front, FrontParts, FrontSettings};
use crate::pipeline::admission::Admission;
use crate::pipeline::approvals::Approvals;
use crate::pipeline::artifacts::Artifacts;
use crate::pipeline::sessions::{SessionParts, Sessions};
use crate::pipeline::tenant_servers::{TenantCeilings, TenantServers};
use crate::pipeline::{
    Pipeline, PipelineParts, PipelineSettings, RegistryLimits, ToolRegistry, Unobserved, Worker,
    WorkerSettings,
};
use crate::ports::{Clock, CredentialResolver, Metrics, PolicyEngine, Reload as _, Revocation};

/// How `toolgate serve` runs.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// Apply pending migrations instead of refusing to start.
    pub migrate: bool,
    /// Where the configuration was read from: a reload reads it again.
    /// Without it a reload reads only the files the configuration names
    /// (the policy rules, the front door's keys).
    pub config_path: Option<std::path::PathBuf>,
}

/// A node built from its validated configuration: its identity held, its
/// store open (migrated when told to), its worker registered, every part
/// wired; nothing bound or served yet. [`App::spawn`] serves it on the
/// listeners its caller gives ([`App::bind`] binds those the
/// configuration names); [`Running::drain`] ends it.
pub struct App {
    node: Node,
    sessions: Arc<Sessions>,
    api: Arc<ControlApi>,
    console: Option<Arc<Console>>,
    operations: Arc<Operations>,
    warm_up: WarmUp,
    warmed: CancellationToken,
    environment: BTreeMap<String, String>,
}

/// What a node holds from its build to the end of its drain.
pub(super) struct Node {
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
    reloader: Arc<Reloader>,
}

/// Every listener a node serves, bound once the node is built (its
/// sockets appear when it can serve them) and given to [`App::spawn`] by
/// its caller.
pub struct Listeners {
    control: tokio::net::UnixListener,
    tcp: Option<(tokio::net::TcpListener, crate::domain::SecretValue)>,
    ops: Option<tokio::net::TcpListener>,
    front_tcp: Option<tokio::net::TcpListener>,
    front_unix: Option<tokio::net::UnixListener>,
    console: Option<tokio::net::TcpListener>,
}

/// Builds the node `config` describes (`environment` resolves its
/// references) on the `clock` its caller gives: takes the node's lock,
/// refuses pending migrations unless `options` says to apply them,
/// registers a worker and wires every part. Nothing is bound or served
/// until [`App::spawn`].
pub async fn build(
    config: Config,
    environment: &BTreeMap<String, String>,
    options: ServeOptions,
    clock: Arc<dyn Clock>,
) -> Result<App, AppError> {
    // Held until the node ends: one process at a time is this node.
    let node = NodeIdentity::acquire(&config.node.directory)?;
    let store = open_store(&config, &options, &clock).await?;
    let reloadable = match &config.policy.file {
        Some(file) => Some(Arc::new(ReloadablePolicy::load(file)?)),
        None => None,
    };
    let policy: Arc<dyn PolicyEngine> = match &reloadable {
        Some(reloadable) => reloadable.clone(),
        None => Arc::new(RuleFilePolicy::built_in()),
    };
    let registry_of_metrics = metrics_registry(&config);
    let metrics: Arc<dyn Metrics> = registry_of_metrics.clone();
    children_reach_state(&config)?;
    let servers = Arc::new(mcp_servers(
        &config,
        environment,
        store.clone(),
        clock.clone(),
        metrics.clone(),
    )?);
    let registry = tool_registry(&config, &servers, &store, &clock)?;
    let worker = Arc::new(
        Worker::register(
            store.clone(),
            clock.clone(),
            &node.place,
            worker_settings(&config.node),
        )
        .await?,
    );
    let lease = worker.lease();
    let artifact_files: Arc<dyn crate::ports::ArtifactStore> =
        Arc::new(FsArtifactStore::new(config.artifacts.directory.clone()));
    let mut pipeline = Pipeline::new(PipelineParts {
        registry: registry.clone(),
        // The pipeline's writes are counted as they commit.
        invocations: Arc::new(MeteredInvocations::new(store.clone(), metrics.clone())),
        approvals: store.clone(),
        events: store.clone(),
        policy,
        artifacts: artifact_files.clone(),
        credentials: credential_resolver(&config, environment),
        clock: clock.clone(),
        observer: Arc::new(Unobserved),
        mcp: Some(servers.clone()),
        lease: lease.clone(),
        settings: PipelineSettings {
            inline_maximum_bytes: config.limits.inline_maximum_bytes,
        },
    })
    .with_rate_limits(rate_limits(&config.limits.rate), metrics.clone());
    if let Some(pages) = config.console.consent_pages() {
        pipeline = pipeline.with_consent_pages(pages);
    }
    let pipeline = Arc::new(pipeline);
    let sessions = Arc::new(Sessions::new(SessionParts {
        registry,
        sessions: store.clone(),
        catalog: store.clone(),
        authored: store.clone(),
        mcp: servers.clone(),
        metrics: metrics.clone(),
        clock: clock.clone(),
    }));
    let shared = Shared {
        approvals: Arc::new(Approvals::new(store.clone(), clock.clone())),
        artifacts: Arc::new(Artifacts::new(store.clone(), artifact_files)),
        in_flight: Arc::new(InFlight::default()),
        limits: edge_limits(&config.limits),
        store,
        clock,
        metrics,
        pipeline,
        sessions,
    };
    let bridge = bridge(&config, &shared)?;
    // The operator's servers are discovered in the background: the node
    // is ready once the first round is done, or its bound has passed.
    let warmed = CancellationToken::new();
    let warm_up = warm_up(&config.mcp);
    let operations = operations(&shared, &lease, &warmed, &warm_up);
    let front = if config.front.enabled() {
        Some(front(&config, &shared)?)
    } else {
        None
    };
    // A principal's identity-provider token is kept only where a server
    // exchanges it.
    let exchanges = config.mcp.http_servers.iter().any(|server| {
        server.common.auth.scheme == crate::domain::mcp_server::AuthScheme::Oauth2User
            && server.common.auth.token_endpoint.is_some()
    });
    if let (true, Some(front)) = (exchanges, &front) {
        front.credentials().keep_subjects_in(servers.subjects());
    }
    let reloader = Arc::new(Reloader::new(
        &config,
        options.config_path.clone(),
        environment,
        reloadable,
        front.clone(),
    ));
    let consent = if config.console.enabled() {
        consent(&config, environment, &shared, &servers, front.as_ref()).await?
    } else {
        None
    };
    // Grants are revoked upstream where they can be opened; elsewhere (a
    // key since removed) they are only deleted.
    let revocation: Arc<dyn Revocation> = match &consent {
        Some(parts) => parts.consent.clone(),
        None => Arc::new(StoredGrants(shared.store.clone())),
    };
    let api = control_api(
        &config,
        &shared,
        &bridge,
        operations.clone(),
        reloader.clone(),
        revocation.clone(),
    );
    let console = if config.console.enabled() {
        Some(console(
            &config,
            &shared,
            servers.clone(),
            consent,
            revocation,
        )?)
    } else {
        None
    };
    registry_of_metrics.add_sampler(Arc::new(ServeSampler {
        in_flight: shared.in_flight.clone(),
        bridge: bridge.clone(),
        servers: servers.clone(),
        store: shared.store.clone(),
    }));
    Ok(App {
        node: Node {
            config,
            _identity: node,
            worker,
            lease,
            pipeline: shared.pipeline,
            servers,
            bridge,
            front,
            in_flight: shared.in_flight,
            reloader,
        },
        sessions: shared.sessions,
        api,
        console,
        operations,
        warm_up,
        warmed,
        environment: environment.clone(),
    })
}

/// The metrics registry: every operator server, and each tenant server the
/// operator names, has series of its own.
fn metrics_registry(config: &Config) -> Arc<MetricsRegistry> {
    Arc::new(
        MetricsRegistry::default().with_bounds(LabelBounds {
            named_servers: config
                .operator_server_ids()
                .into_iter()
                .chain(config.ops.metrics_tenant_servers.iter().cloned())
                .collect(),
        }),
    )
}

/// The operations listener's handler: metrics, liveness, and readiness
/// (the lease held, the warm-up's first round done or its bound passed).
fn operations(
    shared: &Shared,
    lease: &Arc<crate::pipeline::Lease>,
    warmed: &CancellationToken,
    warm_up: &WarmUp,
) -> Arc<Operations> {
    Arc::new(Operations {
        metrics: shared.metrics.clone(),
        schema: shared.store.clone(),
        in_flight: shared.in_flight.clone(),
        lease: lease.clone(),
        warmed: warmed.clone(),
        warm_up_bound: tokio::time::Instant::now() + warm_up.connect_timeout,
        connections: OpsConnections::new(OPS_CONNECTIONS),
    })
}

/// What every edge of a node is built on.
struct Shared {
    store: Arc<dyn crate::ports::Store>,
    clock: Arc<dyn Clock>,
    metrics: Arc<dyn Metrics>,
    pipeline: Arc<Pipeline>,
    sessions: Arc<Sessions>,
    approvals: Arc<Approvals>,
    artifacts: Arc<Artifacts>,
    in_flight: Arc<InFlight>,
    /// `[limits]`' body cap and deadlines, the same on every edge.
    limits: EdgeLimits,
}

/// The tools a node serves: the built-ins (their demo state beside the
/// artifacts) and, through `servers`, the MCP servers'.
fn tool_registry(
    config: &Config,
    servers: &Arc<McpServerSet>,
    store: &Arc<dyn crate::ports::Store>,
    clock: &Arc<dyn Clock>,
) -> Result<Arc<ToolRegistry>, AppError> {
    let artifacts = &config.artifacts.directory;
    let state = artifacts.parent().unwrap_or(artifacts);
    let builtins = crate::builtin::tools(
        &state.join("demo"),
        servers.clone(),
        store.clone(),
        store.clone(),
        clock.clone(),
    );
    Ok(Arc::new(ToolRegistry::with_builtins(
        RegistryLimits {
            maximum_output_bytes_ceiling: config.limits.maximum_output_bytes_ceiling,
            tenant_catalog_tools: config.limits.tenant_catalog_tools,
        },
        builtins,
    )?))
}

/// A request's body cap and deadlines from `[limits]`, the same on every
/// edge.
fn edge_limits(limits: &crate::config::LimitsConfig) -> EdgeLimits {
    EdgeLimits {
        body_limit: limits.request_body_bytes,
        header_timeout: limits.request_header_timeout_seconds.duration(),
        body_timeout: limits.request_body_timeout_seconds.duration(),
    }
}

/// The background discovery of the operator's servers, from `[mcp]`.
fn warm_up(mcp: &crate::config::McpConfig) -> WarmUp {
    WarmUp {
        connect_timeout: mcp.warmup_connect_timeout_seconds.duration(),
        retry: mcp.warmup_retry_seconds.duration(),
        attempts: mcp.warmup_attempts,
    }
}

/// The worker's lease and sweeps from `[node]`.
fn worker_settings(node: &crate::config::NodeConfig) -> WorkerSettings {
    WorkerSettings {
        lease: node.lease_seconds.duration(),
        heartbeat: node.heartbeat_seconds.duration(),
        sweep: node.sweep_seconds.duration(),
        maximum_clock_skew: node.maximum_clock_skew_seconds.duration(),
        ..WorkerSettings::default()
    }
}

/// The orchestration bridge, its turns' folder made for sandboxes of other
/// uids to reach.
fn bridge(config: &Config, shared: &Shared) -> Result<Arc<Bridge>, AppError> {
    traversable_folder(&config.bridge.directory)?;
    Ok(Bridge::new(BridgeParts {
        pipeline: shared.pipeline.clone(),
        sessions: shared.sessions.clone(),
        approvals: shared.approvals.clone(),
        artifacts: shared.artifacts.clone(),
        events: shared.store.clone(),
        turn_records: shared.store.clone(),
        clock: shared.clock.clone(),
        metrics: shared.metrics.clone(),
        in_flight: shared.in_flight.clone(),
        connections: ConnectionCap::new(config.limits.bridge_connections),
        turns: Turns::new(&config.bridge.directory)?,
        settings: bridge_settings(config, shared.limits),
    }))
}

/// The control API.
fn control_api(
    config: &Config,
    shared: &Shared,
    bridge: &Arc<Bridge>,
    readiness: Arc<Operations>,
    reload: Arc<dyn crate::ports::Reload>,
    revocation: Arc<dyn Revocation>,
) -> Arc<ControlApi> {
    let (store, clock) = (&shared.store, &shared.clock);
    ControlApi::new(ApiParts {
        sessions: shared.sessions.clone(),
        admission: Admission::new(
            shared.pipeline.clone(),
            clock.clone(),
            config.limits.batch_concurrency,
        ),
        pipeline: shared.pipeline.clone(),
        approvals: shared.approvals.clone(),
        artifacts: shared.artifacts.clone(),
        continue_trace: crate::adapters::telemetry::otlp::continue_trace,
        tenant_servers: {
            let servers = TenantServers::new(
                store.clone(),
                clock.clone(),
                config.egress_allowlist(),
                config.operator_server_ids(),
                TenantCeilings {
                    maximum_output_bytes: config.limits.maximum_output_bytes_ceiling,
                    timeout_seconds: config.limits.maximum_timeout_seconds.get(),
                },
            );
            if config.consent_enabled() {
                servers.with_consent(config.console.client_document_fetchable())
            } else {
                servers
            }
        },
        bridge: bridge.clone(),
        invocations: store.clone(),
        reviews: store.clone(),
        events: store.clone(),
        operator: store.clone(),
        grants: store.clone(),
        revocation,
        metrics: shared.metrics.clone(),
        in_flight: shared.in_flight.clone(),
        connections: ConnectionCap::new(config.limits.control_connections),
        readiness,
        reload,
        clock: clock.clone(),
        settings: ApiSettings {
            limits: shared.limits,
        },
    })
}

/// The MCP front door, with its credentials.
fn front(config: &Config, shared: &Shared) -> Result<Arc<Front>, AppError> {
    Ok(Front::new(FrontParts {
        sessions: shared.sessions.clone(),
        pipeline: shared.pipeline.clone(),
        approvals: shared.approvals.clone(),
        credentials: front_credentials(config)?,
        in_flight: shared.in_flight.clone(),
        connections: ConnectionCap::new(config.front.connections),
        events: shared.store.clone(),
        artifacts: shared.artifacts.clone(),
        invocations: shared.store.clone(),
        clock: shared.clock.clone(),
        continue_trace: crate::adapters::telemetry::otlp::continue_trace,
        settings: front_settings(config, shared.limits),
    }))
}

/// The consent pages of `oauth2_user` servers, when a key is configured:
/// the key resolved once, at start, and the front door's credentials for
/// who a person is.
async fn consent(
    config: &Config,
    environment: &BTreeMap<String, String>,
    shared: &Shared,
    servers: &Arc<McpServerSet>,
    front: Option<&Arc<Front>>,
) -> Result<Option<ConsentParts>, AppError> {
    let (Some(reference), Some(front), Some(redirect_uri), Some(client_document)) = (
        config.console.consent_key_ref.as_deref(),
        front,
        config.console.consent_redirect_uri(),
        config.console.consent_client_document(),
    ) else {
        return Ok(None);
    };
    let invalid = |message: String| {
        AppError::Config(crate::config::ConfigErrors(vec![
            crate::config::ConfigError {
                path: "console.consent_key_ref".to_owned(),
                message,
            },
        ]))
    };
    let reference = CredentialRef::parse(reference).map_err(|error| invalid(error.to_string()))?;
    let resolver = credential_resolver(config, environment);
    let key = resolver
        .resolve(&reference)
        .await
        .map_err(|_| invalid("did not resolve".to_owned()))?;
    let sealer = KeySealer::new(&key).map_err(|error| invalid(error.to_string()))?;
    let flow_lifetime =
        std::time::Duration::from_secs(u64::from(config.console.consent_minutes) * 60);
    let custody = Custody {
        grants: shared.store.clone(),
        sealer: Arc::new(sealer),
    };
    servers.set_custody(custody.clone());
    let delegations = Delegations::new(
        servers.clone(),
        custody,
        resolver,
        shared.clock.clone(),
        ConsentSettings {
            redirect_uri,
            flow_lifetime,
            client_document,
        },
    );
    Ok(Some(ConsentParts {
        consent: Arc::new(delegations),
        principals: front.credentials().clone(),
        flow_lifetime,
    }))
}

/// The operators' console, with who may sign in.
fn console(
    config: &Config,
    shared: &Shared,
    servers: Arc<McpServerSet>,
    consent: Option<ConsentParts>,
    revocation: Arc<dyn Revocation>,
) -> Result<Arc<Console>, AppError> {
    let operators = config
        .console
        .all_operators()?
        .into_iter()
        .map(|operator| Operator {
            name: operator.name,
            sha256: operator.sha256,
        })
        .collect();
    Ok(Console::new(ConsoleParts {
        approvals: shared.approvals.clone(),
        reviews: shared.store.clone(),
        operator: shared.store.clone(),
        operators,
        sign_ins: shared.store.clone(),
        servers,
        grants: shared.store.clone(),
        revocation,
        in_flight: shared.in_flight.clone(),
        connections: ConnectionCap::new(config.console.connections),
        clock: shared.clock.clone(),
        settings: ConsoleSettings {
            limits: shared.limits,
            secure_cookie: config.console.behind_tls,
            session_lifetime: std::time::Duration::from_secs(
                u64::from(config.console.session_minutes) * 60,
            ),
        },
        consent,
    }))
}

/// The bridge's settings from `[bridge]` and `[limits]`.
fn bridge_settings(config: &Config, limits: EdgeLimits) -> BridgeSettings {
    BridgeSettings {
        limits,
        turn_connections: config.limits.turn_connections,
        approval_hold: config.bridge.approval_hold_seconds.duration(),
        tenant_approval_holds: config
            .bridge
            .tenant_approval_hold_seconds
            .iter()
            .map(|(tenant, hold)| (tenant.clone(), hold.duration()))
            .collect(),
        turn_call_cap: config.bridge.turn_call_cap,
        replay_divergence: config.bridge.replay_divergence,
        ..BridgeSettings::default()
    }
}

/// The front door's settings from `[front]` (and the console's URL), with
/// the edges' limits.
fn front_settings(config: &Config, limits: EdgeLimits) -> FrontSettings {
    let front = &config.front;
    FrontSettings {
        limits,
        allowed_hosts: front.hosts(),
        listen_port: front.listen.map(|address| address.port()),
        allowed_origins: front.allowed_origins.clone(),
        resource: front.resource.clone(),
        authorization_servers: front.authorization_servers.clone(),
        scopes_supported: front.scopes_supported.clone(),
        approval_hold: front.approval_hold_seconds.duration(),
        session_in_flight: front.session_in_flight,
        credential_in_flight: front.credential_in_flight(),
        tenant_in_flight: front.tenant_in_flight(),
        sessions_per_credential: front.sessions_per_credential,
        keep_alive: front.keep_alive_seconds.duration(),
        first_request: front.first_request_seconds.duration(),
        reissue_window: front.reissue_window_seconds.duration(),
        approval_pages: config.console.approval_pages(),
    }
}

/// The store the configuration names, its migrations applied when
/// `options` says so (refused as pending otherwise).
pub(super) async fn open_store(
    config: &Config,
    options: &ServeOptions,
    clock: &Arc<dyn Clock>,
) -> Result<Arc<dyn crate::ports::Store>, AppError> {
    let store = super::connect_store(config, clock.clone()).await?;
    let pending = store.pending_migrations().await?;
    if !pending.is_empty() {
        if !options.migrate {
            return Err(AppError::PendingMigrations {
                count: pending.len(),
            });
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

impl Listeners {
    /// Every listener `config` names, bound (`environment` resolves the
    /// control token); if one cannot be, none is kept.
    pub async fn bind(
        config: &Config,
        environment: &BTreeMap<String, String>,
    ) -> Result<Listeners, AppError> {
        let front = config.front.enabled();
        let tcp = match (config.control.tcp, &config.control.token_ref) {
            (Some(address), Some(reference)) => {
                let token = EnvFileResolver::new(environment.clone())
                    .resolve(reference)
                    .await
                    .map_err(|source| AppError::Credential {
                        what: "control.token_ref",
                        source,
                    })?;
                Some((bind_tcp(address, "control.tcp").await?, token))
            }
            _ => None,
        };
        let ops = match config.ops.listen {
            Some(address) => Some(bind_tcp(address, "ops.listen").await?),
            None => None,
        };
        let front_tcp = match (front, config.front.listen) {
            (true, Some(address)) => Some(bind_tcp(address, "front.listen").await?),
            _ => None,
        };
        let front_unix = match (front, &config.front.socket) {
            (true, Some(socket)) => {
                let bound = bind_socket(
                    socket,
                    config.front.socket_mode.bits(),
                    config.front.socket_group.as_deref(),
                    "front",
                )?;
                tracing::info!(socket = %socket.display(), "MCP front door serving on a unix socket");
                Some(bound)
            }
            _ => None,
        };
        let console = match config.console.listen {
            Some(address) => Some(bind_tcp(address, "console.listen").await?),
            None => None,
        };
        Ok(Listeners {
            control: bind_control(&config.control)?,
            tcp,
            ops,
            front_tcp,
            front_unix,
            console,
        })
    }
}

/// A TCP listener on `address`, the configuration's `field`; its failure
/// names the field.
pub(super) async fn bind_tcp(
    address: SocketAddr,
    field: &str,
) -> Result<tokio::net::TcpListener, AppError> {
    let bound = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|source| AppError::Io {
            what: field.to_owned(),
            source,
        })?;
    tracing::info!(address = %address, listener = field, "listening");
    Ok(bound)
}

impl App {
    /// Binds every listener the node's configuration names. If one cannot
    /// be bound, nothing is served and the lease ends at once.
    pub async fn bind(&self) -> Result<Listeners, AppError> {
        match Listeners::bind(&self.node.config, &self.environment).await {
            Ok(listeners) => Ok(listeners),
            Err(error) => {
                self.node.worker.release().await?;
                Err(error)
            }
        }
    }

    /// Serves the node on `listeners`: recovery first, then heartbeats and
    /// sweeps; the listeners; the warm-up of the operator's servers in the
    /// background.
    pub fn spawn(self, listeners: Listeners) -> Running {
        let App {
            node,
            sessions,
            api,
            console,
            operations,
            warm_up,
            warmed,
            environment: _,
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
            console: console_tcp,
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
            let protocol = crate::adapters::mcp::front::front_protocol(
                front.methods(),
                crate::adapters::mcp::front::ProtocolSettings {
                    body_limit: front.settings().limits.body_limit,
                    keep_alive: front.settings().keep_alive,
                },
                &shutdown,
            );
            if let Some(tcp) = front_tcp {
                serving_front.push(tokio::spawn(front.clone().serve_tcp(
                    tcp,
                    protocol.clone(),
                    shutdown.clone(),
                )));
            }
            if let Some(unix) = front_unix {
                serving_front.push(tokio::spawn(front.clone().serve_unix(
                    unix,
                    protocol,
                    shutdown.clone(),
                )));
            }
        }
        // Like the front door, the console stops taking connections when
        // the drain begins; decisions in flight finish with it.
        let serving_console = console
            .zip(console_tcp)
            .map(|(console, tcp)| tokio::spawn(console.serve_tcp(tcp, shutdown.clone())));
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
                serving_console,
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
pub(super) struct Tasks {
    maintenance: tokio::task::JoinHandle<()>,
    serving: tokio::task::JoinHandle<()>,
    sweeping: tokio::task::JoinHandle<()>,
    serving_tcp: Option<tokio::task::JoinHandle<()>>,
    serving_front: Vec<tokio::task::JoinHandle<()>>,
    serving_console: Option<tokio::task::JoinHandle<()>>,
    serving_ops: Option<tokio::task::JoinHandle<()>>,
    warming: tokio::task::JoinHandle<()>,
    sweeper: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Cancelled when this node's lease is lost for good (its identity is
    /// held from another place): it must serve no more, drain, and stop. A
    /// lease that merely ended (a store outage, a pause) is taken again by
    /// a new incarnation and never fires this.
    pub fn lease_lost(&self) -> CancellationToken {
        self.node.lease.lost()
    }

    /// What SIGHUP asks for, as `toolgate reload` does: the configuration
    /// and the files it names read again, what may change while the node
    /// runs put in force, the rest reported; what does not validate leaves
    /// what is in force. Each line of the report is logged.
    pub async fn reload(&self) {
        let report = self.node.reloader.reload().await;
        for line in &report.reloaded {
            tracing::info!(what = %line, "reloaded");
        }
        for line in &report.restart_required {
            tracing::warn!(section = %line, "changed in the configuration file; in force only after a restart");
        }
        for line in &report.refused {
            tracing::warn!(problem = %line, "not reloaded; what is in force stays");
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
            serving_console,
            serving_ops,
            warming,
            sweeper,
        } = tasks;
        tracing::info!("toolgate draining");
        let drain = async {
            let drain_timeout = config.runtime.drain_timeout_seconds.duration();
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
            if let Some(serving_console) = serving_console {
                let _ = serving_console.await;
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

/// Connections the operations listener holds at once; past it, a new one
/// replaces the oldest that sent no request.
pub(super) const OPS_CONNECTIONS: usize = 64;

/// The gauges read when metrics are scraped.
pub(super) struct ServeSampler {
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
pub(super) async fn sweep(
    bridge: Arc<Bridge>,
    sessions: Arc<Sessions>,
    shutdown: CancellationToken,
) {
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

/// The operator's rate limits, as the pipeline keeps them.
fn rate_limits(rate: &crate::config::RateConfig) -> crate::pipeline::limits::RateLimitSettings {
    crate::pipeline::limits::RateLimitSettings {
        principal: rate.principal,
        tenant: rate.tenant,
        server: rate.server,
        tools: rate
            .tools
            .iter()
            .map(|entry| crate::pipeline::limits::ToolRateLimit {
                tools: entry.tools.clone(),
                limit: entry.limit(),
            })
            .collect(),
    }
}
