//! The one live connection: installed, watched, restarted, forgotten.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::{CLOSE_GRACE, LIST_CHANGED_COALESCE, McpServer, lock};
use crate::adapters::mcp::catalog::catalog_hash;
use crate::adapters::mcp::client::Connection;
use crate::adapters::mcp::render::by_name;
use crate::domain::ReasonCode;
use crate::ports::PlatformEvent;

/// The least time between two background restarts of one stdio server.
const RESTART_SPACING: Duration = Duration::from_secs(5);

impl McpServer {
    /// Makes `connection` the live one and starts its list-changed watcher.
    pub(super) async fn install(self: &Arc<Self>, connection: Connection) -> Arc<Connection> {
        let connection = self.start(connection);
        let previous = self.live.lock().await.replace(connection.clone());
        if let Some(previous) = previous {
            close_when_unused(previous);
        }
        connection
    }

    /// Shares a new connection and starts its list-changed watcher; the
    /// caller puts it in the live slot.
    pub(super) fn start(self: &Arc<Self>, connection: Connection) -> Arc<Connection> {
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

    /// The live connection, redialled when dead. A redial's listing is
    /// compared with the pin and recorded as the newest listing.
    pub(super) async fn connection(
        self: &Arc<Self>,
        tenant_id: &str,
    ) -> Result<Arc<Connection>, ReasonCode> {
        self.connection_for(Some(tenant_id)).await
    }

    /// [`Self::connection`], its events recorded for `tenant_id` (the
    /// server's owner when `None`).
    pub(super) async fn connection_for(
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
    pub(super) async fn forget(
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
    pub(super) async fn forget_ended(&self, ended: &Weak<Connection>) -> bool {
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
    pub(super) fn restart_soon(self: &Arc<Self>) {
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

    /// Closes the live connection when it has been unused for the idle
    /// timeout and no call holds it. Whether it closed one.
    pub(in crate::adapters::mcp) async fn close_if_idle(&self) -> bool {
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

    /// Takes the live connection out, for shutdown; the closing is recorded.
    pub(in crate::adapters::mcp) async fn take_live(&self) -> Option<Arc<Connection>> {
        let mut live = self.live.lock().await;
        let taken = live.take();
        if taken.is_some() {
            self.record(None, self.closed("mcp.closed.shutdown")).await;
        }
        taken
    }

    /// Takes the live connection out without an event: the server was
    /// replaced or removed, and its successor speaks for it.
    pub(in crate::adapters::mcp) async fn take_live_quietly(&self) -> Option<Arc<Connection>> {
        self.live.lock().await.take()
    }

    /// Whether a live connection is open.
    pub(in crate::adapters::mcp) async fn is_connected(&self) -> bool {
        self.live
            .lock()
            .await
            .as_ref()
            .is_some_and(|connection| !connection.is_closed())
    }
}

/// Closes a replaced connection once no call holds it.
pub(in crate::adapters::mcp) fn close_when_unused(connection: Arc<Connection>) {
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
pub(super) async fn watch_end(
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
pub(super) async fn watch_list_changes(
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
