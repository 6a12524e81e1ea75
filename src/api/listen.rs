//! The control API's listeners: the unix socket, and loopback TCP where every
//! request carries the control token; both under one connection cap and the
//! header deadline. The route table, with the query keys each route takes;
//! and the one rescue point, where any handler's error becomes the one error
//! shape.

use std::collections::HashMap;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde_json::json;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

use super::{ApiError, ControlApi, wire};
use crate::domain::{SecretValue, sha256_hex};
use crate::edge::constant_time_eq;
use crate::edge::{Reply, accept_until, bearer_token, error, reply, serve_connection};

/// A request's query: percent-decoded, each key at most once, and only the
/// keys its route takes.
pub(super) struct Query(HashMap<String, String>);

impl Query {
    /// A value, if given.
    pub(super) fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// The tenant a read or decision names, held to the one rule every
    /// tenant id follows (where its records begin, a session or a tenant
    /// server, and wherever it is named after).
    pub(super) fn tenant(&self) -> Result<String, ApiError> {
        self.optional_tenant()?
            .ok_or_else(|| ApiError::Invalid("tenant_id is required".into()))
    }

    /// The tenant a read may be narrowed to, if named, held to the rule.
    pub(super) fn optional_tenant(&self) -> Result<Option<String>, ApiError> {
        match self.get("tenant_id") {
            Some(tenant) if crate::domain::valid_tenant_id(tenant) => Ok(Some(tenant.to_owned())),
            Some(_) => Err(ApiError::Invalid(TENANT_RULE.into())),
            None => Ok(None),
        }
    }

    /// The tenant, and the id in a tenant-scoped route's path; `None` when
    /// the id is not one.
    pub(super) fn tenant_and_id(&self, id: &str) -> Result<Option<(String, uuid::Uuid)>, ApiError> {
        let tenant = self.tenant()?;
        Ok(id.parse::<uuid::Uuid>().ok().map(|id| (tenant, id)))
    }
}

/// What every tenant id is, in the words an error names it with.
pub(super) const TENANT_RULE: &str = "tenant_id must be 1 to 128 letters, digits, '-' or '_'";

/// A request as the handlers see it: its query and the request.
pub(super) struct Routed {
    pub(super) query: Query,
    pub(super) request: Request<Incoming>,
}

/// The query keys a route takes; any other is refused.
fn allowed_keys(method: &Method, segments: &[&str]) -> &'static [&'static str] {
    match (method, segments) {
        (&Method::GET, ["v1", "sessions"]) => &[
            "tenant_id",
            "since",
            "until",
            "limit",
            "cursor",
            "session_id",
        ],
        (&Method::GET, ["v1", "turns"]) => &[
            "tenant_id",
            "since",
            "until",
            "limit",
            "cursor",
            "status",
            "session_id",
        ],
        (&Method::GET, ["v1", "invocations"])
        | (&Method::GET, ["v1", "approvals"])
        | (&Method::GET, ["v1", "review"]) => &[
            "tenant_id",
            "since",
            "until",
            "limit",
            "cursor",
            "status",
            "tool_name",
            "session_id",
        ],
        (&Method::GET, ["v1", "mcp-servers"]) | (&Method::GET, ["v1", "catalog-generations"]) => &[
            "tenant_id",
            "since",
            "until",
            "limit",
            "cursor",
            "server_id",
        ],
        (&Method::GET, ["v1", "tool-health"]) => &["tenant_id", "tool_name", "window"],
        (&Method::GET, ["v1", "grants"]) => &["tenant_id"],
        (&Method::DELETE, ["v1", "grants", _]) => &["tenant_id", "principal_id"],
        (&Method::GET, ["v1", "events"]) => &["tenant_id", "after", "limit", "follow"],
        (&Method::POST, ["v1", "approvals", _])
        | (&Method::GET, ["v1", "invocations", _])
        | (&Method::POST, ["v1", "invocations", _, "complete"])
        | (&Method::GET, ["v1", "runs", _, "invocations"])
        | (&Method::GET, ["v1", "runs", _, "working_state"])
        | (&Method::GET, ["v1", "artifacts", _])
        | (&Method::POST, ["v1", "review", _]) => &["tenant_id"],
        _ => &[],
    }
}

impl ControlApi {
    /// Serves the control API on `listener` until `shutdown` fires.
    pub async fn serve_control(
        self: Arc<Self>,
        listener: UnixListener,
        shutdown: CancellationToken,
    ) {
        accept_until(listener, "control", shutdown, |stream| {
            // Past the cap the connection is closed as soon as accepted.
            if let Some(permit) = self.parts.connections.admit() {
                tokio::spawn(self.clone().connection(stream, None, permit));
            }
        })
        .await;
    }

    /// Serves the control API on a loopback TCP listener, where every
    /// request must carry `token` as a bearer token.
    pub async fn serve_control_tcp(
        self: Arc<Self>,
        listener: tokio::net::TcpListener,
        token: SecretValue,
        shutdown: CancellationToken,
    ) {
        let token = Arc::new(sha256_hex(token.reveal().as_bytes()));
        accept_until(listener, "control tcp", shutdown, |stream| {
            if let Some(permit) = self.parts.connections.admit() {
                tokio::spawn(self.clone().connection(stream, Some(token.clone()), permit));
            }
        })
        .await;
    }

    /// One control connection. With `token_sha256`, a request without the
    /// matching bearer token is refused before it is routed.
    async fn connection<S>(
        self: Arc<Self>,
        stream: S,
        token_sha256: Option<Arc<String>>,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let header_timeout = self.parts.settings.limits.header_timeout;
        serve_connection(stream, header_timeout, vec![permit], move |request| {
            let (api, token_sha256) = (self.clone(), token_sha256.clone());
            async move {
                if let Some(expected) = token_sha256 {
                    let presented = bearer_token(request.headers())
                        .map(|token| sha256_hex(token.as_bytes()))
                        .unwrap_or_default();
                    if !constant_time_eq(presented.as_bytes(), expected.as_bytes()) {
                        return error(
                            StatusCode::UNAUTHORIZED,
                            "unauthorized",
                            "missing or wrong control token",
                        );
                    }
                }
                let in_flight = api.parts.in_flight.clone();
                let work = async move { api.route(request).await };
                in_flight.track(work).await
            }
        })
        .await;
    }

    /// One request in its span: a child of the caller's trace when it sent
    /// a W3C `traceparent`.
    async fn route(self: &Arc<Self>, request: Request<Incoming>) -> Reply {
        use tracing::Instrument as _;
        let span = tracing::info_span!(
            "control.request",
            http.method = %request.method(),
        );
        if let Some(traceparent) = request
            .headers()
            .get("traceparent")
            .and_then(|value| value.to_str().ok())
        {
            let tracestate = request
                .headers()
                .get("tracestate")
                .and_then(|value| value.to_str().ok());
            (self.parts.continue_trace)(&span, traceparent, tracestate);
        }
        self.routed(request).instrument(span).await
    }

    /// The route table, and the rescue point.
    async fn routed(self: &Arc<Self>, request: Request<Incoming>) -> Reply {
        let path: Option<Vec<String>> = request
            .uri()
            .path()
            .trim_matches('/')
            .split('/')
            .map(wire::decode)
            .collect();
        let Some(path) = path else {
            return ApiError::Invalid("the path is not valid percent-encoding".into()).reply();
        };
        let query = match wire::query(request.uri().query()) {
            Ok(query) => Query(query),
            Err(message) => return ApiError::Invalid(message.into()).reply(),
        };
        let segments: Vec<&str> = path.iter().map(String::as_str).collect();
        let method = request.method().clone();
        let allowed = allowed_keys(&method, &segments);
        if query.0.keys().any(|key| !allowed.contains(&key.as_str())) {
            return ApiError::Invalid("a query key this route does not take".into()).reply();
        }
        let draining = self.parts.in_flight.draining();
        if method != Method::GET && draining {
            return ApiError::Draining.reply();
        }
        let routed = Routed { query, request };
        let result = match (method, segments.as_slice()) {
            (Method::POST, ["v1", "reload"]) => Ok(reply(
                StatusCode::OK,
                &json!(self.parts.reload.reload().await),
            )),
            (Method::GET, ["healthz"]) => Ok(reply(StatusCode::OK, &json!({"status": "ok"}))),
            (Method::GET, ["readyz"]) => Ok(self.parts.readiness.readiness().await),
            (Method::GET, ["metrics"]) => Ok(self.metrics().await),
            (Method::POST, ["v1", "sessions"]) => self.open_session(routed).await,
            (Method::POST, ["v1", "calls"]) => self.calls(routed).await,
            (Method::POST, ["v1", "turns"]) => self.open_turn(routed).await,
            (Method::DELETE, ["v1", "turns", id]) => self.close_turn(id).await,
            (Method::GET, ["v1", "sessions"]) => self.list_sessions(routed).await,
            (Method::GET, ["v1", "turns"]) => self.list_turns(routed).await,
            (Method::GET, ["v1", "invocations"]) => self.list_invocations(routed).await,
            (Method::GET, ["v1", "mcp-servers"]) => self.list_servers(routed).await,
            (Method::GET, ["v1", "catalog-generations"]) => self.list_generations(routed).await,
            (Method::GET, ["v1", "tool-health"]) => self.tool_health(routed).await,
            (Method::GET, ["v1", "approvals"]) => self.list_approvals(routed).await,
            (Method::POST, ["v1", "approvals", id]) => self.decide(id, routed).await,
            (Method::GET, ["v1", "invocations", id]) => self.invocation(id, routed).await,
            (Method::POST, ["v1", "invocations", id, "complete"]) => {
                self.complete(id, routed).await
            }
            (Method::GET, ["v1", "runs", id, "invocations"]) => self.run(id, routed).await,
            (Method::GET, ["v1", "runs", id, "working_state"]) => {
                self.working_state(id, routed).await
            }
            (Method::GET, ["v1", "events"]) => self.events(routed).await,
            (Method::GET, ["v1", "artifacts", id]) => self.artifact(id, routed).await,
            (Method::GET, ["v1", "review"]) => self.list_review(routed).await,
            (Method::POST, ["v1", "review", id]) => self.resolve(id, routed).await,
            (Method::GET, ["v1", "grants"]) => self.list_grants(routed).await,
            (Method::DELETE, ["v1", "grants", server]) => self.revoke_grant(server, routed).await,
            (Method::PUT, ["v1", "tenants", tenant, "mcp-servers", server]) => {
                self.put_server(tenant, server, routed).await
            }
            (Method::GET, ["v1", "tenants", tenant, "mcp-servers", server]) => {
                self.get_server(tenant, server).await
            }
            (Method::DELETE, ["v1", "tenants", tenant, "mcp-servers", server]) => {
                self.delete_server(tenant, server).await
            }
            _ => Err(ApiError::NotFound),
        };
        result.unwrap_or_else(ApiError::reply)
    }

    /// A strictly parsed body within the configured size and deadline.
    pub(super) async fn body<T: serde::de::DeserializeOwned>(
        &self,
        request: Request<Incoming>,
    ) -> Result<T, ApiError> {
        Ok(crate::edge::json_body(request, &self.parts.settings.limits).await?)
    }
}
