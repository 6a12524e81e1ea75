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
//! An `oauth2_user` server is each principal's own: calls are routed to a
//! server of the principal's (its connection carrying its grant), whose
//! discoveries give the catalog every principal's session pins. A
//! principal without a grant pins that catalog and is asked for consent
//! when it calls.
//!
//! A 401 on a call climbs the design's ladder once per server per session:
//! the call is held, the credential obtained again, a byte-identical value
//! (or none) stops the ladder, and the call is retried once only where the
//! recovery table allows it; after that the session's calls to the server
//! answer `tool.server_unauthorized` without dialling.

mod calls;
mod connection;
mod discovery;
mod ladder;
mod settings;
mod tools;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::auth::Authenticator;
use super::catalog::RemoteTool;
use super::client::Connection;
use super::grant::{Custody, Delegate, Exchange, GrantSource, SubjectTokens};
use crate::domain::mcp_server::{AuthScheme, ServerClassification, Transport};
use crate::domain::{ReasonCode, SecretValue};
use crate::ports::metrics::Metrics;
use crate::ports::{
    CatalogStore, Clock, CredentialResolver, DiscoveryOutcome, EgressDialer, EventStore,
    McpServerRow, PlatformEvent, ServerDiscovery,
};

pub(in crate::adapters::mcp) use connection::close_when_unused;
use discovery::Remembered;
use ladder::Ladders;
pub use settings::{HttpServerSettings, StdioServerSettings};

/// How long a closing child gets between SIGTERM and SIGKILL.
pub const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// How long a burst of list-changed notifications is gathered into one look.
pub const LIST_CHANGED_COALESCE: Duration = Duration::from_millis(250);

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
    /// Where its events go.
    pub(super) events: Arc<dyn EventStore>,
    /// Where the tenants' own servers are kept.
    pub(super) catalog: Arc<dyn CatalogStore>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) metrics: Arc<dyn Metrics>,
    /// Where `oauth2_user` grants are kept, once consent is configured.
    pub(super) custody: Arc<OnceLock<Custody>>,
    /// The principals' identity-provider tokens an exchange trades.
    pub(super) subjects: Arc<SubjectTokens>,
}

/// An `oauth2_user` server's principals, each with a server of its own, and
/// per tenant the catalog its principals' discoveries last gave (its tools'
/// declarations, without prompts): what a principal of the tenant without
/// a grant pins.
#[derive(Default)]
struct Delegation {
    instances: Mutex<HashMap<(String, String), Arc<McpServer>>>,
    catalogs: Mutex<HashMap<String, ServerDiscovery>>,
}

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
    /// For a principal's own server: the `oauth2_user` server it is of,
    /// whose tools its discovery gives (so a call is routed by principal).
    parent: Weak<McpServer>,
    /// For an `oauth2_user` server: its principals' servers.
    delegation: Option<Delegation>,
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
            parent: Weak::new(),
            delegation: None,
        }
    }

    /// An operator's stdio server; its discovery is pinned for the life of
    /// the process.
    pub(in crate::adapters::mcp) fn stdio(settings: StdioServerSettings, shared: Shared) -> Self {
        McpServer::new(Endpoint::Stdio(settings), None, None, shared)
    }

    /// An HTTP server, the operator's (`owner` `None`) or a tenant's; its
    /// discovery is pinned for at most `reuse`.
    pub(in crate::adapters::mcp) fn http(
        settings: HttpServerSettings,
        owner: Option<String>,
        reuse: Duration,
        dialer: Arc<dyn EgressDialer>,
        shared: Shared,
    ) -> Self {
        let delegates = settings.auth.scheme == AuthScheme::Oauth2User;
        let authenticator = Arc::new(Authenticator::new(
            settings.auth.clone(),
            shared.credentials.clone(),
            dialer.clone(),
            shared.clock.clone(),
        ));
        let mut server = McpServer::new(
            Endpoint::Http {
                settings,
                dialer,
                authenticator,
            },
            owner,
            Some(reuse),
            shared,
        );
        if delegates {
            server.delegation = Some(Delegation::default());
        }
        server
    }

    /// Whether it is an `oauth2_user` server, whose principals each have
    /// a server of their own.
    pub(in crate::adapters::mcp) fn delegates(&self) -> bool {
        self.delegation.is_some()
    }

    /// `principal_id`'s own server (of `tenant_id`), made at its first use;
    /// `None` when this is not an `oauth2_user` server, or its grants are
    /// consented and consent is not configured.
    pub(super) fn instance(
        self: &Arc<Self>,
        tenant_id: &str,
        principal_id: &str,
    ) -> Option<Arc<McpServer>> {
        let delegation = self.delegation.as_ref()?;
        let Endpoint::Http {
            settings, dialer, ..
        } = &self.endpoint
        else {
            return None;
        };
        let source = match &settings.auth.token_endpoint {
            Some(token_endpoint) => GrantSource::Exchanged(Arc::new(Exchange {
                subjects: self.shared.subjects.clone(),
                token_endpoint: token_endpoint.clone(),
                resource: settings.url.clone(),
                scopes: settings.auth.token_scopes.clone(),
                minted: Mutex::new(None),
            })),
            None => GrantSource::Kept(self.shared.custody.get()?.clone()),
        };
        let key = (tenant_id.to_owned(), principal_id.to_owned());
        let mut instances = lock(&delegation.instances);
        if let Some(instance) = instances.get(&key) {
            return Some(instance.clone());
        }
        let authenticator = Authenticator::new(
            settings.auth.clone(),
            self.shared.credentials.clone(),
            dialer.clone(),
            self.shared.clock.clone(),
        )
        .delegated(Delegate {
            source,
            tenant_id: tenant_id.to_owned(),
            principal_id: principal_id.to_owned(),
            server_id: settings.server_id.clone(),
            resource: settings.url.clone(),
        });
        let mut instance = McpServer::new(
            Endpoint::Http {
                settings: settings.clone(),
                dialer: dialer.clone(),
                authenticator: Arc::new(authenticator),
            },
            self.owner.clone(),
            self.reuse,
            self.shared.clone(),
        );
        instance.parent = Arc::downgrade(self);
        let instance = Arc::new(instance);
        instances.insert(key, instance.clone());
        Some(instance)
    }

    /// This server's id, when it acts with each principal's own grant and
    /// `principal_id` of `tenant_id` holds none. A store that cannot say
    /// lets the call go on, to fail as its connection does.
    pub(super) async fn consent_needed(
        &self,
        tenant_id: &str,
        principal_id: &str,
    ) -> Option<String> {
        // An exchange asks nobody.
        if !self.delegates() || self.http_settings()?.auth.token_endpoint.is_some() {
            return None;
        }
        let custody = self.shared.custody.get()?;
        let resource = &self.http_settings()?.url;
        match custody
            .grants
            .grant(tenant_id, principal_id, self.server_id())
            .await
        {
            Ok(None) => Some(self.server_id().to_owned()),
            // Given for the server's earlier URL (or under another key):
            // consent is asked again.
            Ok(Some(grant)) if !custody.usable_for(&grant, resource) => {
                Some(self.server_id().to_owned())
            }
            Ok(Some(_)) | Err(_) => None,
        }
    }

    /// Keeps `found` as the catalog `tenant_id`'s principals without a
    /// grant pin: its tools only, as pinned.
    pub(super) fn keep_catalog(&self, tenant_id: &str, found: &ServerDiscovery) {
        if let Some(delegation) = &self.delegation {
            let mut catalog = found.clone();
            catalog.outcome = DiscoveryOutcome::Pinned;
            catalog.skills.clear();
            lock(&delegation.catalogs).insert(tenant_id.to_owned(), catalog);
        }
    }

    /// The catalog `tenant_id`'s principals without a grant pin, if one of
    /// its principals' discoveries gave one.
    pub(super) fn kept_catalog(&self, tenant_id: &str) -> Option<ServerDiscovery> {
        let delegation = self.delegation.as_ref()?;
        lock(&delegation.catalogs).get(tenant_id).cloned()
    }

    /// Its principals' servers now.
    pub(in crate::adapters::mcp) fn instances(&self) -> Vec<Arc<McpServer>> {
        self.delegation
            .as_ref()
            .map(|delegation| lock(&delegation.instances).values().cloned().collect())
            .unwrap_or_default()
    }

    /// Forgets the principals' servers that hold no connection, so the
    /// map does not grow with every principal that ever called.
    pub(in crate::adapters::mcp) async fn forget_idle_instances(&self) {
        let Some(delegation) = &self.delegation else {
            return;
        };
        let instances: Vec<((String, String), Arc<McpServer>)> = lock(&delegation.instances)
            .iter()
            .map(|(key, instance)| (key.clone(), instance.clone()))
            .collect();
        for (key, instance) in instances {
            if instance.is_connected().await {
                continue;
            }
            // Held by the map and here only: no call has it. Its
            // connection, if one was made since, closes with it.
            let removed = {
                let mut held = lock(&delegation.instances);
                (Arc::strong_count(&instance) <= 2)
                    .then(|| held.remove(&key))
                    .flatten()
            };
            if let Some(removed) = removed
                && let Some(connection) = removed.take_live_quietly().await
            {
                close_when_unused(connection);
            }
        }
    }

    /// Whose tools a discovery gives: the `oauth2_user` server a
    /// principal's server is of, else this one.
    fn tool_server(self: &Arc<Self>) -> Weak<McpServer> {
        if self.parent.strong_count() > 0 {
            self.parent.clone()
        } else {
            Arc::downgrade(self)
        }
    }

    /// The server's id.
    pub fn server_id(&self) -> &str {
        &self.row.server_id
    }

    /// The server as configured.
    pub(in crate::adapters::mcp) fn row(&self) -> &McpServerRow {
        &self.row
    }

    /// Whether it is spawned or dialled at all.
    pub(in crate::adapters::mcp) fn enabled(&self) -> bool {
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

    pub(in crate::adapters::mcp) fn idle_timeout(&self) -> Duration {
        match &self.endpoint {
            Endpoint::Stdio(settings) => settings.idle_timeout,
            Endpoint::Http { settings, .. } => settings.idle_timeout,
        }
    }

    /// How it is dialled, for an HTTP server.
    pub(in crate::adapters::mcp) fn http_settings(&self) -> Option<&HttpServerSettings> {
        match &self.endpoint {
            Endpoint::Stdio(_) => None,
            Endpoint::Http { settings, .. } => Some(settings),
        }
    }

    /// Whether it starts a process (and so takes a process-startup slot).
    pub(in crate::adapters::mcp) fn spawns(&self) -> bool {
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

    async fn record(&self, tenant_id: Option<&str>, event: PlatformEvent) {
        let tenant_id = tenant_id.or(self.owner.as_deref());
        if let Err(error) = self
            .shared
            .events
            .record_event(tenant_id, &event, self.shared.clock.now())
            .await
        {
            tracing::warn!(server = %self.server_id(), error = %error, "mcp event not recorded");
        }
    }

    fn disconnected(&self, reason_code: ReasonCode) -> PlatformEvent {
        PlatformEvent::ServerDisconnected {
            server_id: self.server_id().to_owned(),
            reason_code,
        }
    }

    fn closed(&self, reason: &'static str) -> PlatformEvent {
        PlatformEvent::ServerClosed {
            server_id: self.server_id().to_owned(),
            reason,
        }
    }
}
