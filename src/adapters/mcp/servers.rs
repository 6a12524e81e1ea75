//! Every MCP server a runtime knows: the operator's (stdio and HTTP, from
//! the configuration file, for every tenant) and each tenant's own HTTP
//! servers (from the store, for that tenant's sessions only), prepared
//! under shared slots and closed when idle.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::sync::Semaphore;

use super::auth::AuthSettings;
use super::grant::Custody;
use super::server::{
    CLOSE_GRACE, HttpServerSettings, McpServer, Shared, StdioServerSettings, lock,
};
use super::slots::PreparationSlots;
use crate::domain::egress::EgressError;
use crate::domain::mcp_server::{AuthScheme, ServerClassification, TenantCeilings, Transport};
use crate::domain::secret::CredentialRef;
use crate::domain::{ToolFailure, ToolFailureKind};
use crate::ports::metrics::Metrics;
use crate::ports::{
    BoxFuture, Clock, CredentialResolver, DialError, Dialed, EgressDialer, LoadedSkill,
    McpServerRow, McpServers, ServerDiscovery, Store,
};

/// Preparation slots shared by every server of one runtime.
pub const GENERAL_SLOTS: usize = 8;
/// Process-startup slots: simultaneous interpreter start-ups must not eat
/// each other's handshake deadline.
pub const STARTUP_SLOTS: usize = 2;
/// The general slots one tenant's own servers may hold at once: the rest
/// stay for every other tenant's sessions.
pub const TENANT_SHARE: usize = 2;
/// The general slots a tenant's second server never takes: kept for
/// tenants (and operator servers) holding none.
pub const TENANT_RESERVE: usize = 2;
/// The idle sweep runs at least this often.
pub const MAXIMUM_SWEEP: Duration = Duration::from_secs(30);
/// A tenant server's handshake deadline (the design's default).
pub const TENANT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A tenant server's per-request deadline.
pub const TENANT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// A tenant server's idle close.
pub const TENANT_IDLE_TIMEOUT: Duration = Duration::from_secs(900);
/// How long an HTTP server's discovery is pinned without connecting, unless
/// configured.
pub const DEFAULT_DISCOVERY_REUSE: Duration = Duration::from_secs(300);

/// How the warm-up is paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarmUp {
    /// Each handshake's bound.
    pub connect_timeout: Duration,
    /// How often servers not reached are tried again.
    pub retry: Duration,
    /// Rounds in all, the first included.
    pub attempts: u32,
}

/// The dialer of a runtime with no egress: every URL is refused.
struct NoEgress;

impl EgressDialer for NoEgress {
    fn dial<'a>(&'a self, _url: &'a str) -> BoxFuture<'a, Result<Dialed, DialError>> {
        Box::pin(async { Err(DialError::Url(EgressError::NotAllowed)) })
    }
}

/// A tenant's server as the HTTP adapter takes it; `None` for a row that is
/// not an HTTP server (which the write-time rules never let a tenant write).
fn tenant_settings(row: &McpServerRow, ceilings: TenantCeilings) -> Option<HttpServerSettings> {
    if row.transport != Transport::Http {
        return None;
    }
    let credential_ref = match row.credential_ref.as_deref() {
        Some(text) => Some(CredentialRef::parse(text).ok()?),
        None => None,
    };
    Some(HttpServerSettings {
        server_id: row.server_id.clone(),
        url: row.endpoint.clone(),
        auth: AuthSettings {
            scheme: row.auth_scheme,
            name: row.auth_name.clone(),
            credential_ref,
            token_endpoint: row.token_endpoint.clone(),
            token_scopes: row.token_scopes.clone().unwrap_or_default(),
        },
        classification: ceilings.bound(ServerClassification {
            side_effect: row.side_effect,
            risk: row.risk,
            idempotency: row.idempotency,
            required_scopes: row.required_scopes.iter().cloned().collect(),
            timeout_seconds: row.timeout_seconds,
            maximum_output_bytes: row.maximum_output_bytes,
        }),
        connect_timeout: TENANT_CONNECT_TIMEOUT,
        request_timeout: TENANT_REQUEST_TIMEOUT,
        idle_timeout: TENANT_IDLE_TIMEOUT,
        enabled: row.enabled,
    })
}

/// Every server of this runtime.
pub struct McpServerSet {
    /// The operator's, in configured order.
    operator: Vec<Arc<McpServer>>,
    /// Each tenant's own, by tenant, in the store's order.
    tenants: Mutex<HashMap<String, Vec<Arc<McpServer>>>>,
    /// Tenant servers found with an operator server's id, told once each.
    shadowed: Mutex<std::collections::HashSet<(String, String)>>,
    dialer: Arc<dyn EgressDialer>,
    reuse: Duration,
    /// What a tenant's stored row may ask for, whenever it was written.
    ceilings: TenantCeilings,
    shared: Shared,
    general: PreparationSlots,
    startup: Semaphore,
}

impl McpServerSet {
    /// The operator's stdio servers, in configured order, and no egress: no
    /// HTTP server is dialled. Nothing is spawned until the first discovery.
    pub fn new(
        settings: Vec<StdioServerSettings>,
        credentials: Arc<dyn CredentialResolver>,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        metrics: Arc<dyn Metrics>,
    ) -> Self {
        // Of the store, only what servers use: events, and the tenants' rows.
        let shared = Shared {
            credentials,
            events: store.clone(),
            catalog: store,
            clock,
            metrics,
            custody: Arc::default(),
            subjects: Arc::default(),
        };
        McpServerSet {
            operator: settings
                .into_iter()
                .map(|settings| Arc::new(McpServer::stdio(settings, shared.clone())))
                .collect(),
            tenants: Mutex::new(HashMap::new()),
            shadowed: Mutex::new(std::collections::HashSet::new()),
            dialer: Arc::new(NoEgress),
            reuse: DEFAULT_DISCOVERY_REUSE,
            ceilings: TenantCeilings {
                maximum_output_bytes: 0,
                timeout_seconds: 0,
            },
            shared,
            general: PreparationSlots::new(GENERAL_SLOTS, TENANT_SHARE, TENANT_RESERVE),
            startup: Semaphore::new(STARTUP_SLOTS),
        }
    }

    /// The same set dialling HTTP servers through `dialer`: the operator's
    /// `http` (after the stdio ones) and every tenant's own (held to
    /// `ceilings`), each discovery pinned for at most `reuse`.
    pub fn with_http(
        mut self,
        http: Vec<HttpServerSettings>,
        dialer: Arc<dyn EgressDialer>,
        reuse: Duration,
        ceilings: TenantCeilings,
    ) -> Self {
        self.dialer = dialer;
        self.reuse = reuse;
        self.ceilings = ceilings;
        for settings in http {
            self.operator.push(Arc::new(McpServer::http(
                settings,
                None,
                reuse,
                self.dialer.clone(),
                self.shared.clone(),
            )));
        }
        self
    }

    fn operator_has(&self, server_id: &str) -> bool {
        self.operator
            .iter()
            .any(|server| server.server_id() == server_id)
    }

    /// The tenant's own servers as the store has them now: kept objects
    /// whose row is unchanged, new ones for new or changed rows; a server
    /// the tenant removed is dropped (its connection closes once unused).
    async fn tenant_servers(&self, tenant_id: &str) -> Vec<Arc<McpServer>> {
        let rows = match self.shared.catalog.tenant_mcp_servers(tenant_id).await {
            Ok(rows) => rows,
            Err(error) => {
                tracing::warn!(error = %error, "tenant servers not read; the session has the operator's only");
                return Vec::new();
            }
        };
        let mut tenants = lock(&self.tenants);
        let kept = tenants.remove(tenant_id).unwrap_or_default();
        let mut servers = Vec::with_capacity(rows.len());
        for row in rows {
            // An operator server of the same id wins: the tenant's was
            // written before the operator's existed. Its row is kept as the
            // tenant wrote it, and the operator is told once.
            if self.operator_has(&row.server_id) {
                let first =
                    lock(&self.shadowed).insert((tenant_id.to_owned(), row.server_id.clone()));
                if first {
                    tracing::warn!(
                        tenant = %tenant_id,
                        server = %row.server_id,
                        "a tenant server has an operator server's id: sessions use the operator's, \
                         the tenant's row is kept unchanged; rename one of them"
                    );
                }
                continue;
            }
            if let Some(server) = kept.iter().find(|server| server.row() == &row) {
                servers.push(server.clone());
                continue;
            }
            let Some(settings) = tenant_settings(&row, self.ceilings) else {
                continue;
            };
            servers.push(Arc::new(McpServer::http(
                settings,
                Some(tenant_id.to_owned()),
                self.reuse,
                self.dialer.clone(),
                self.shared.clone(),
            )));
        }
        for server in kept {
            if !servers.iter().any(|kept| Arc::ptr_eq(kept, &server)) {
                tokio::spawn(async move {
                    if let Some(connection) = server.take_live_quietly().await {
                        super::server::close_when_unused(connection);
                    }
                });
            }
        }
        if !servers.is_empty() {
            tenants.insert(tenant_id.to_owned(), servers.clone());
        }
        servers
    }

    /// The enabled server `server_id` a session of `tenant_id` would use
    /// (the operator's first, as discovery has it), when it takes each
    /// principal's own grant.
    pub(super) async fn delegated(
        &self,
        tenant_id: &str,
        server_id: &str,
    ) -> Option<HttpServerSettings> {
        let mut servers = self.operator.clone();
        if !self.operator_has(server_id) {
            servers.extend(self.tenant_servers(tenant_id).await);
        }
        servers
            .iter()
            .filter(|server| server.enabled() && server.server_id() == server_id)
            .find_map(|server| server.http_settings())
            .filter(|settings| {
                settings.auth.scheme == AuthScheme::Oauth2User
                    && settings.auth.token_endpoint.is_none()
            })
            .cloned()
    }

    /// Where the front door leaves the principals' identity-provider
    /// tokens, for the servers that exchange them.
    pub fn subjects(&self) -> Arc<dyn crate::ports::Subjects> {
        self.shared.subjects.clone()
    }

    /// Where `oauth2_user` grants are kept: set once, when consent is
    /// configured; before it (or without it) such a server's principals
    /// have no server of their own and its calls are refused.
    pub fn set_custody(&self, custody: Custody) {
        if self.shared.custody.set(custody).is_err() {
            tracing::warn!("the grants' custody was set twice; the first is kept");
        }
    }

    /// The dialer every HTTP server is reached through.
    pub(super) fn dialer(&self) -> Arc<dyn EgressDialer> {
        self.dialer.clone()
    }

    /// Every server with a connection of its own: the operator's, the
    /// tenants', and their principals' own.
    fn every_server(&self) -> Vec<Arc<McpServer>> {
        let mut servers = self.operator.clone();
        servers.extend(lock(&self.tenants).values().flatten().cloned());
        let principals: Vec<Arc<McpServer>> = servers
            .iter()
            .flat_map(|server| server.instances())
            .collect();
        servers.extend(principals);
        servers
    }

    /// The warm-up: discovers each enabled operator server, one at a
    /// time, each handshake bounded by `settings.connect_timeout`, and
    /// remembers what it finds, recording nothing; servers that did not
    /// answer are tried again every `settings.retry`, for at most
    /// `settings.attempts` rounds in all. `first_round` fires once the first
    /// round is done.
    pub async fn warm_up(
        &self,
        settings: WarmUp,
        first_round: tokio_util::sync::CancellationToken,
    ) {
        // An `oauth2_user` server is dialled only with a principal's grant.
        let mut waiting: Vec<Arc<McpServer>> = self
            .operator
            .iter()
            .filter(|server| server.enabled() && !server.delegates())
            .cloned()
            .collect();
        for round in 0..settings.attempts {
            if round > 0 {
                tokio::time::sleep(settings.retry).await;
            }
            let mut failed = Vec::new();
            for server in waiting {
                if !server
                    .warm_up(&self.general, &self.startup, settings.connect_timeout)
                    .await
                {
                    failed.push(server);
                }
            }
            first_round.cancel();
            if failed.is_empty() {
                return;
            }
            tracing::info!(
                servers = failed.len(),
                round = round + 1,
                "warm-up: servers not reached yet"
            );
            waiting = failed;
        }
        first_round.cancel();
    }

    /// Closes connections unused for their idle timeout. A connection a call
    /// holds is not idle. Returns how many it closed.
    pub async fn close_idle(&self) -> usize {
        let mut closed = 0;
        for server in self.every_server() {
            if server.close_if_idle().await {
                closed += 1;
            }
            server.forget_idle_instances().await;
        }
        closed
    }

    /// Runs [`McpServerSet::close_idle`] every [`McpServerSet::sweep_period`]
    /// until the set is dropped.
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

    /// How often [`McpServerSet::close_idle`] should run: every 30 s, or the
    /// shortest idle timeout if that is shorter.
    pub fn sweep_period(&self) -> Duration {
        self.operator
            .iter()
            .map(|server| server.idle_timeout())
            .fold(MAXIMUM_SWEEP.min(TENANT_IDLE_TIMEOUT), Duration::min)
    }

    /// Closes every connection: pipes first, then each process group.
    pub async fn shutdown(&self) {
        let mut closing = Vec::new();
        for server in self.every_server() {
            if let Some(connection) = server.take_live().await {
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
                    // reference ends it (and kills a child's group).
                }));
            }
        }
        for task in closing {
            let _ = task.await;
        }
    }

    /// Live connections: each operator server's (by id), and the tenants'
    /// servers' together (never a label per tenant).
    pub async fn connection_counts(&self) -> Vec<(String, usize)> {
        let mut counts = Vec::with_capacity(self.operator.len() + 1);
        for server in &self.operator {
            counts.push((
                server.server_id().to_owned(),
                usize::from(server.is_connected().await),
            ));
        }
        let tenants: Vec<Arc<McpServer>> =
            lock(&self.tenants).values().flatten().cloned().collect();
        let mut connected = 0;
        for server in tenants {
            connected += usize::from(server.is_connected().await);
        }
        counts.push(("tenant_servers".to_owned(), connected));
        counts
    }

    /// Whether an operator server `server_id` has a live connection (for
    /// tests and health).
    pub async fn is_connected(&self, server_id: &str) -> bool {
        for server in &self.operator {
            if server.server_id() == server_id {
                return server.is_connected().await;
            }
        }
        false
    }
}

impl McpServers for McpServerSet {
    fn connected_now<'a>(
        &'a self,
        tenant_id: &'a str,
        server_id: &'a str,
    ) -> BoxFuture<'a, Option<bool>> {
        Box::pin(async move {
            if let Some(server) = self.operator.iter().find(|s| s.server_id() == server_id) {
                return Some(server.is_connected().await);
            }
            let server = lock(&self.tenants)
                .get(tenant_id)
                .and_then(|servers| servers.iter().find(|s| s.server_id() == server_id).cloned())?;
            Some(server.is_connected().await)
        })
    }

    fn discover<'a>(
        &'a self,
        tenant_id: &'a str,
        principal_id: Option<&'a str>,
    ) -> BoxFuture<'a, Vec<ServerDiscovery>> {
        Box::pin(async move {
            let operator = self.operator.iter().filter(|server| server.enabled());
            let own = self.tenant_servers(tenant_id).await;
            let own = own.iter().filter(|server| server.enabled());
            // Concurrent within the slots; joined in configured order.
            let tasks = operator.chain(own).map(|server| {
                server.discover_for(tenant_id, principal_id, &self.general, &self.startup)
            });
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
            let own = lock(&self.tenants)
                .get(tenant_id)
                .cloned()
                .unwrap_or_default();
            for server in self.operator.iter().chain(own.iter()) {
                if let Some((metadata, prompt)) = server.prompt(name) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::mcp_server::AuthScheme;
    use crate::domain::{IdempotencyClass, RiskLevel, SideEffectClass};

    /// A row stored before the operator lowered the ceilings (or written
    /// past the API) is held to them when it is used.
    #[test]
    fn a_stored_tenant_row_is_held_to_the_ceilings_in_force() {
        let row = McpServerRow {
            server_id: "own".into(),
            transport: Transport::Http,
            endpoint: "https://mcp.example.com/mcp".into(),
            auth_scheme: AuthScheme::None,
            auth_name: None,
            credential_ref: None,
            token_endpoint: None,
            token_scopes: None,
            side_effect: SideEffectClass::None,
            risk: RiskLevel::Low,
            idempotency: IdempotencyClass::ReadOnly,
            required_scopes: vec!["mcp.own.use".into()],
            timeout_seconds: 86_400,
            maximum_output_bytes: 1_000_000_000_000,
            enabled: true,
        };
        let ceilings = TenantCeilings {
            maximum_output_bytes: 1 << 20,
            timeout_seconds: 600,
        };
        let settings = tenant_settings(&row, ceilings).expect("an HTTP row");
        assert_eq!(settings.classification.maximum_output_bytes, 1 << 20);
        assert_eq!(settings.classification.timeout_seconds, 600);
        let modest = McpServerRow {
            timeout_seconds: 30,
            maximum_output_bytes: 4096,
            ..row
        };
        let settings = tenant_settings(&modest, ceilings).expect("an HTTP row");
        assert_eq!(
            (
                settings.classification.maximum_output_bytes,
                settings.classification.timeout_seconds
            ),
            (4096, 30),
            "a row within them is as written"
        );
    }
}
