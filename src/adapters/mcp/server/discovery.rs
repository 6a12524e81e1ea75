//! Connecting and discovery: the pin a server's sessions reuse.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::tools::{McpTool, ReadResourceTool};
use super::{CLOSE_GRACE, Endpoint, McpServer, lock};
use crate::adapters::mcp::catalog::{RemoteTool, map_catalog};
use crate::adapters::mcp::child::ChildSpec;
use crate::adapters::mcp::client::{ClientError, Connection, RemotePrompt, RemoteResource};
use crate::adapters::mcp::framing::Ceilings;
use crate::adapters::mcp::http::EgressClient;
use crate::adapters::mcp::render::{READ_RESOURCE, by_name, read_resource_spec, skill_metadata};
use crate::adapters::mcp::slots::PreparationSlots;
use crate::domain::mcp_server::AuthScheme;
use crate::domain::names::mcp_registry_name;
use crate::domain::{ReasonCode, SkillMetadata};
use crate::ports::{DiscoveredTool, DiscoveryOutcome, ServerDiscovery};

/// A discovery this process remembers: the pin every later session reuses.
pub(super) struct Remembered {
    pub(super) catalog_hash: String,
    pub(super) resources: Vec<RemoteResource>,
    pub(super) prompts: Vec<(SkillMetadata, RemotePrompt)>,
    pub(super) discovery: ServerDiscovery,
    pub(super) at: Instant,
}

impl McpServer {
    pub(super) async fn open(&self) -> Result<Connection, ReasonCode> {
        self.open_within(self.connect_timeout()).await
    }

    /// Connects, the handshake bounded by `connect_timeout`.
    pub(super) async fn open_within(
        &self,
        connect_timeout: Duration,
    ) -> Result<Connection, ReasonCode> {
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
    pub(super) async fn discover_live(
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
    pub(super) async fn discover_live_within(
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
    pub(super) fn remember(
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
                    server: self.tool_server(),
                }),
            });
        }
        if has_resources {
            found.push(DiscoveredTool {
                remote_name: READ_RESOURCE.to_owned(),
                tool: Arc::new(ReadResourceTool {
                    spec: read_resource_spec(server_id, &catalog.catalog_hash, classification),
                    server: self.tool_server(),
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

    /// A discovery without a catalog.
    fn failed_discovery(&self, reason_code: ReasonCode) -> ServerDiscovery {
        ServerDiscovery {
            server: self.row.clone(),
            tenant_id: self.owner.clone(),
            outcome: DiscoveryOutcome::Failed { reason_code },
            catalog_hash: None,
            tools: Vec::new(),
            conflicts: Vec::new(),
            skills: Vec::new(),
        }
    }

    /// Discovery for one preparation of `principal_id`'s session: an
    /// `oauth2_user` server is discovered through the principal's own
    /// server, with its grant; a principal without one (or whose
    /// credential the server refused, or no principal) pins the catalog the
    /// server last gave any principal, and is answered when it calls. Every
    /// other server, as [`Self::discover`].
    pub(in crate::adapters::mcp) async fn discover_for(
        self: &Arc<Self>,
        tenant_id: &str,
        principal_id: Option<&str>,
        general: &PreparationSlots,
        startup: &Semaphore,
    ) -> ServerDiscovery {
        if !self.delegates() {
            return self.discover(general, startup).await;
        }
        let remembered_or = |reason_code| match self.kept_catalog(tenant_id) {
            Some(catalog) => catalog,
            None => self.failed_discovery(reason_code),
        };
        let Some(principal_id) = principal_id else {
            return remembered_or(ReasonCode::ToolConsentRequired);
        };
        let Some(instance) = self.instance(tenant_id, principal_id) else {
            return self.failed_discovery(ReasonCode::ToolAuthUnsupported);
        };
        let found = instance.discover(general, startup).await;
        // What one principal lacks (consent, or a token to exchange) does
        // not withdraw the server from every other principal's sessions.
        match found.outcome {
            DiscoveryOutcome::Failed {
                reason_code:
                    reason_code @ (ReasonCode::ToolConsentRequired | ReasonCode::ToolAuthFailed),
            } => remembered_or(reason_code),
            DiscoveryOutcome::Failed { .. } => found,
            _ => {
                self.keep_catalog(tenant_id, &found);
                found
            }
        }
    }

    /// The remembered discovery while it may still be pinned.
    pub(super) fn reusable(&self) -> Option<Arc<Remembered>> {
        lock(&self.remembered).clone().filter(|remembered| {
            self.reuse
                .is_none_or(|reuse| remembered.at.elapsed() < reuse)
        })
    }

    /// Discovery for one preparation: the remembered pin, or a live one.
    pub(in crate::adapters::mcp) async fn discover(
        self: &Arc<Self>,
        general: &PreparationSlots,
        startup: &Semaphore,
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
        let failed = |reason_code| self.failed_discovery(reason_code);
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
        // tenant's share and reserve, so tenants whose servers never answer
        // cannot hold every slot another tenant's session waits for.
        let _general = general.acquire(self.owner.as_deref()).await;
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
    pub(in crate::adapters::mcp) async fn warm_up(
        self: &Arc<Self>,
        general: &PreparationSlots,
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
        let _general = general.acquire(self.owner.as_deref()).await;
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
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use chrono::{DateTime, Utc};

    use super::super::{HttpServerSettings, Shared};
    use super::*;
    use crate::adapters::mcp::auth::AuthSettings;
    use crate::adapters::mcp::servers::{
        DEFAULT_DISCOVERY_REUSE, GENERAL_SLOTS, STARTUP_SLOTS, TENANT_RESERVE, TENANT_SHARE,
    };
    use crate::domain::SecretValue;
    use crate::domain::mcp_server::ServerClassification;
    use crate::domain::secret::CredentialRef;
    use crate::ports::{
        BoxFuture, CatalogRow, CatalogStore, CredentialError, CredentialResolver, DialError,
        Dialed, EgressDialer, EventRecord, EventStore, Labels, McpServerRow, Metrics,
        PlatformEvent, PreparationRecord, StoreError, SystemClock,
    };

    /// What a discovery that neither succeeds nor records anything must
    /// never touch: each use panics.
    struct Untouched;

    impl CredentialResolver for Untouched {
        fn resolve<'a>(
            &'a self,
            _: &'a CredentialRef,
        ) -> BoxFuture<'a, Result<SecretValue, CredentialError>> {
            panic!("no credential is resolved for a server without authentication")
        }
    }

    impl EventStore for Untouched {
        fn record_event<'a>(
            &'a self,
            _: Option<&'a str>,
            _: &'a PlatformEvent,
            _: DateTime<Utc>,
        ) -> BoxFuture<'a, Result<(), StoreError>> {
            panic!("a discovery records nothing itself")
        }

        fn events_after<'a>(
            &'a self,
            _: i64,
            _: i64,
            _: Option<&'a str>,
        ) -> BoxFuture<'a, Result<Vec<EventRecord>, StoreError>> {
            panic!("a discovery reads no events")
        }
    }

    impl CatalogStore for Untouched {
        fn record_preparation<'a>(
            &'a self,
            _: &'a str,
            _: &'a PreparationRecord,
            _: DateTime<Utc>,
        ) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
            panic!("a discovery records nothing itself")
        }

        fn catalog_history<'a>(
            &'a self,
            _: &'a str,
            _: &'a str,
        ) -> BoxFuture<'a, Result<Vec<CatalogRow>, StoreError>> {
            panic!("a discovery reads no history")
        }

        fn put_mcp_server<'a>(
            &'a self,
            _: &'a str,
            _: &'a McpServerRow,
            _: DateTime<Utc>,
        ) -> BoxFuture<'a, Result<(), StoreError>> {
            panic!("a discovery writes no server")
        }

        fn mcp_server<'a>(
            &'a self,
            _: &'a str,
            _: &'a str,
        ) -> BoxFuture<'a, Result<Option<McpServerRow>, StoreError>> {
            panic!("a discovery reads no server row")
        }

        fn tenant_mcp_servers<'a>(
            &'a self,
            _: &'a str,
        ) -> BoxFuture<'a, Result<Vec<McpServerRow>, StoreError>> {
            panic!("a discovery reads no server rows")
        }

        fn delete_mcp_server<'a>(
            &'a self,
            _: &'a str,
            _: &'a str,
        ) -> BoxFuture<'a, Result<bool, StoreError>> {
            panic!("a discovery removes no server")
        }
    }

    impl Metrics for Untouched {
        // A failed connection is counted; what is counted is not this
        // test's business.
        fn add(&self, _: &'static str, _: Labels, _: u64) {}

        fn observe(&self, _: &'static str, _: Labels, _: f64) {}

        fn render(&self) -> BoxFuture<'_, String> {
            panic!("nothing is rendered")
        }
    }

    /// Counts the dials and refuses each: a server that is not there.
    struct Counting(Arc<AtomicUsize>);

    impl EgressDialer for Counting {
        fn dial<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Dialed, DialError>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Err(DialError::Connect) })
        }
    }

    fn server(dials: Arc<AtomicUsize>) -> Arc<McpServer> {
        let untouched = Arc::new(Untouched);
        let shared = Shared {
            credentials: untouched.clone(),
            events: untouched.clone(),
            catalog: untouched.clone(),
            clock: Arc::new(SystemClock),
            metrics: untouched,
            custody: Arc::default(),
            subjects: Arc::default(),
        };
        let settings = HttpServerSettings {
            server_id: "remote".into(),
            url: "https://mcp.example.com/mcp".into(),
            auth: AuthSettings {
                scheme: AuthScheme::None,
                name: None,
                credential_ref: None,
                token_endpoint: None,
                token_scopes: Vec::new(),
            },
            classification: ServerClassification::most_restrictive(10, 65536),
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(900),
            enabled: true,
        };
        Arc::new(McpServer::http(
            settings,
            None,
            DEFAULT_DISCOVERY_REUSE,
            Arc::new(Counting(dials)),
            shared,
        ))
    }

    /// An HTTP server's discovery is pinned without connecting for the
    /// reuse window (five minutes unless configured), and not a moment
    /// longer: after it, a preparation connects again.
    #[tokio::test(start_paused = true)]
    async fn an_http_discovery_is_reused_until_its_window_ends() {
        let dials = Arc::new(AtomicUsize::new(0));
        let server = server(dials.clone());
        let general = PreparationSlots::new(GENERAL_SLOTS, TENANT_SHARE, TENANT_RESERVE);
        let startup = Semaphore::new(STARTUP_SLOTS);
        // What a live discovery leaves behind.
        server.remember(Vec::new(), Vec::new(), Vec::new(), false);
        let window = Duration::from_secs(300);

        tokio::time::advance(window - Duration::from_millis(1)).await;
        let reused = server.discover(&general, &startup).await;
        assert_eq!(reused.outcome, DiscoveryOutcome::Pinned);
        assert_eq!(dials.load(Ordering::SeqCst), 0, "reused without dialling");

        tokio::time::advance(Duration::from_millis(1)).await;
        let again = server.discover(&general, &startup).await;
        assert_eq!(
            dials.load(Ordering::SeqCst),
            1,
            "dialled once the window ended"
        );
        assert!(
            matches!(again.outcome, DiscoveryOutcome::Failed { .. }),
            "{:?}",
            again.outcome
        );
        assert!(
            server.reusable().is_none(),
            "a failed handshake forgets the pin"
        );
    }
}
