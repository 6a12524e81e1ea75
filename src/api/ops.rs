//! The operations listener: `/metrics`, `/healthz` and `/readyz` on TCP for
//! Prometheus and orchestrator probes, and nothing else: no tenant data, no
//! control. Ready means the process is not draining, holds a live worker
//! lease, has warmed its servers' discovery (or waited its bound for it),
//! and the store answers and is migrated.

use std::sync::Arc;
use std::time::Duration;

use hyper::{Method, StatusCode};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::edge::{InFlight, Reply, accept_until, error, reply, serve_connection};
use crate::pipeline::Lease;
use crate::ports::{Metrics, Schema};

/// A request head must arrive within this.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long readiness waits for the store.
const STORE_TIMEOUT: Duration = Duration::from_secs(2);

/// What the operations listener reads.
pub struct Operations {
    /// What `/metrics` renders.
    pub metrics: Arc<dyn Metrics>,
    /// The store, asked whether it is reachable and migrated.
    pub schema: Arc<dyn Schema>,
    /// Whether the process is draining.
    pub in_flight: Arc<InFlight>,
    /// The worker's lease: a process that may not claim is not ready.
    pub lease: Arc<Lease>,
    /// Fires once the warm-up's first round is done.
    pub warmed: CancellationToken,
    /// When readiness stops waiting for the warm-up.
    pub warm_up_bound: tokio::time::Instant,
    /// The connections held now.
    pub connections: OpsConnections,
}

/// The operations listener's connections, at most `maximum` at once. When
/// full, a new one takes the place of the oldest that has not sent a
/// request (half-open, or idle between requests): whoever opens connections
/// and sends nothing cannot keep a probe out.
pub struct OpsConnections {
    maximum: usize,
    held: std::sync::Mutex<std::collections::VecDeque<Held>>,
    next: std::sync::atomic::AtomicU64,
}

/// One connection the listener holds.
struct Held {
    id: u64,
    /// Set while a request is being answered.
    busy: Arc<std::sync::atomic::AtomicBool>,
    /// Ends the connection when it is evicted.
    evict: CancellationToken,
}

/// A place among the held connections.
struct Place {
    id: u64,
    busy: Arc<std::sync::atomic::AtomicBool>,
    evict: CancellationToken,
}

impl OpsConnections {
    /// At most `maximum` at once.
    pub fn new(maximum: usize) -> Self {
        OpsConnections {
            maximum: maximum.max(1),
            held: std::sync::Mutex::new(std::collections::VecDeque::new()),
            next: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, std::collections::VecDeque<Held>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A place for a new connection, evicting the oldest idle one when
    /// full; `None` when every held one is answering a request.
    fn admit(&self) -> Option<Place> {
        use std::sync::atomic::Ordering;
        let mut held = self.held();
        if held.len() >= self.maximum {
            let idle = held
                .iter()
                .position(|connection| !connection.busy.load(Ordering::SeqCst))?;
            if let Some(evicted) = held.remove(idle) {
                evicted.evict.cancel();
            }
        }
        let place = Place {
            id: self.next.fetch_add(1, Ordering::Relaxed),
            busy: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            evict: CancellationToken::new(),
        };
        held.push_back(Held {
            id: place.id,
            busy: place.busy.clone(),
            evict: place.evict.clone(),
        });
        Some(place)
    }

    fn leave(&self, id: u64) {
        self.held().retain(|connection| connection.id != id);
    }
}

impl Operations {
    /// Serves `listener` until `shutdown` fires.
    pub async fn serve(
        self: Arc<Self>,
        listener: tokio::net::TcpListener,
        shutdown: CancellationToken,
    ) {
        accept_until(listener, "operations", shutdown, |stream| {
            let Some(place) = self.connections.admit() else {
                return;
            };
            let operations = self.clone();
            tokio::spawn(async move {
                let (busy, evict, id) = (place.busy.clone(), place.evict.clone(), place.id);
                let handler = {
                    let operations = operations.clone();
                    move |request: hyper::Request<hyper::body::Incoming>| {
                        let (operations, busy) = (operations.clone(), busy.clone());
                        async move {
                            busy.store(true, std::sync::atomic::Ordering::SeqCst);
                            let reply = operations
                                .answer(request.method(), request.uri().path())
                                .await;
                            busy.store(false, std::sync::atomic::Ordering::SeqCst);
                            reply
                        }
                    }
                };
                tokio::select! {
                    () = serve_connection(stream, HEADER_TIMEOUT, Vec::new(), handler) => {}
                    () = evict.cancelled() => {}
                }
                operations.connections.leave(id);
            });
        })
        .await;
    }

    async fn answer(&self, method: &Method, path: &str) -> Reply {
        if method != Method::GET {
            return error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "the operations listener only answers GET",
            );
        }
        match path {
            "/healthz" => reply(StatusCode::OK, &json!({"status": "ok"})),
            "/readyz" => self.readiness().await,
            "/metrics" => {
                use http_body_util::BodyExt as _;
                let text = self.metrics.render().await;
                let mut response = hyper::Response::new(
                    http_body_util::Full::new(hyper::body::Bytes::from(text)).boxed_unsync(),
                );
                response.headers_mut().insert(
                    hyper::header::CONTENT_TYPE,
                    hyper::header::HeaderValue::from_static(crate::ports::metrics::CONTENT_TYPE),
                );
                response
            }
            _ => error(StatusCode::NOT_FOUND, "not_found", "no such resource"),
        }
    }

    /// `/readyz`, as both listeners answer it.
    pub async fn readiness(&self) -> Reply {
        if self.in_flight.draining() {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "draining",
                "toolgate is shutting down",
            );
        }
        if !self.lease.is_live() {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "lease_not_live",
                "toolgate holds no live worker lease (its store has not answered a renewal in \
                 time) and takes no calls; it serves again once the store answers",
            );
        }
        if !self.warmed.is_cancelled() && tokio::time::Instant::now() < self.warm_up_bound {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "warming_up",
                "toolgate is discovering its servers",
            );
        }
        match tokio::time::timeout(STORE_TIMEOUT, self.schema.pending_migrations()).await {
            Ok(Ok(pending)) if pending.is_empty() => {
                reply(StatusCode::OK, &json!({"status": "ready"}))
            }
            Ok(Ok(_)) => error(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_not_migrated",
                "the store has pending migrations",
            ),
            Ok(Err(failure)) => {
                tracing::warn!(error = %failure, "readiness: the store did not answer");
                error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    "the store did not answer",
                )
            }
            Err(_) => error(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                "the store did not answer in time",
            ),
        }
    }
}
