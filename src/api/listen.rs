//! The control API's listeners: the unix socket, and loopback TCP where every
//! request carries the control token; the route table; and the one rescue
//! point, where any handler's error becomes the one error shape.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::AUTHORIZATION;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

use super::{ApiError, ControlApi, wire};
use crate::bridge::constant_time_eq;
use crate::bridge::http::{Reply, error, reply};
use crate::domain::{SecretValue, sha256_hex};

/// The pause after a failed accept.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// A request as the handlers see it: its decoded path and query.
pub(super) struct Routed {
    pub(super) query: HashMap<String, String>,
    pub(super) request: Request<Incoming>,
}

impl ControlApi {
    /// Serves the control API on `listener` until `shutdown` fires.
    pub async fn serve_control(
        self: Arc<Self>,
        listener: UnixListener,
        shutdown: CancellationToken,
    ) {
        loop {
            let stream = tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(error) => {
                        // Out of descriptors, most likely: back off rather
                        // than spin.
                        tracing::warn!(error = %error, "control accept failed");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                },
            };
            tokio::spawn(self.clone().connection(stream, None));
        }
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
        loop {
            let stream = tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(error) => {
                        tracing::warn!(error = %error, "control accept failed");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                },
            };
            tokio::spawn(self.clone().connection(stream, Some(token.clone())));
        }
    }

    /// One control connection. With `token_sha256`, a request without the
    /// matching bearer token is refused before it is routed.
    async fn connection<S>(self: Arc<Self>, stream: S, token_sha256: Option<Arc<String>>)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let (api, token_sha256) = (self.clone(), token_sha256.clone());
            async move {
                if let Some(expected) = token_sha256 {
                    let presented = request
                        .headers()
                        .get(AUTHORIZATION)
                        .and_then(|value| value.to_str().ok())
                        .and_then(|value| value.strip_prefix("Bearer "))
                        .map(|token| sha256_hex(token.as_bytes()))
                        .unwrap_or_default();
                    if !constant_time_eq(presented.as_bytes(), expected.as_bytes()) {
                        return Ok::<_, Infallible>(error(
                            StatusCode::UNAUTHORIZED,
                            "unauthorized",
                            "missing or wrong control token",
                        ));
                    }
                }
                let in_flight = api.parts.in_flight.clone();
                let work = async move { api.route(request).await };
                Ok::<_, Infallible>(in_flight.track(work).await)
            }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), service)
            .await;
    }

    /// The route table, and the rescue point.
    async fn route(self: &Arc<Self>, request: Request<Incoming>) -> Reply {
        let path: Option<Vec<String>> = request
            .uri()
            .path()
            .trim_matches('/')
            .split('/')
            .map(wire::decode)
            .collect();
        let (Some(path), Some(query)) = (path, wire::query(request.uri().query())) else {
            return ApiError::Invalid("the path or query is not valid percent-encoding".into())
                .reply();
        };
        let segments: Vec<&str> = path.iter().map(String::as_str).collect();
        let method = request.method().clone();
        let draining = self.parts.in_flight.draining();
        if method != Method::GET && draining {
            return ApiError::Draining.reply();
        }
        let routed = Routed { query, request };
        let result = match (method, segments.as_slice()) {
            (Method::GET, ["healthz"]) => Ok(reply(StatusCode::OK, &json!({"status": "ok"}))),
            (Method::GET, ["readyz"]) if draining => Err(ApiError::Draining),
            (Method::GET, ["readyz"]) => Ok(reply(StatusCode::OK, &json!({"status": "ready"}))),
            (Method::GET, ["metrics"]) => Ok(self.metrics()),
            (Method::POST, ["v1", "sessions"]) => self.open_session(routed).await,
            (Method::POST, ["v1", "calls"]) => self.calls(routed).await,
            (Method::POST, ["v1", "turns"]) => self.open_turn(routed).await,
            (Method::DELETE, ["v1", "turns", id]) => self.close_turn(id).await,
            (Method::GET, ["v1", "approvals"]) => self.approvals(routed).await,
            (Method::POST, ["v1", "approvals", id]) => self.decide(id, routed).await,
            (Method::GET, ["v1", "invocations", id]) => self.invocation(id, routed).await,
            (Method::POST, ["v1", "invocations", id, "complete"]) => {
                self.complete(id, routed).await
            }
            (Method::GET, ["v1", "runs", id, "invocations"]) => self.run(id, routed).await,
            (Method::GET, ["v1", "events"]) => self.events(routed).await,
            (Method::GET, ["v1", "review"]) => self.review_queue(routed).await,
            (Method::POST, ["v1", "review", id]) => self.resolve(id, routed).await,
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

    /// A strictly parsed body of at most the configured size.
    pub(super) async fn body<T: serde::de::DeserializeOwned>(
        &self,
        request: Request<Incoming>,
    ) -> Result<T, ApiError> {
        Ok(crate::bridge::http::json_body(request, self.parts.settings.body_limit).await?)
    }
}

/// The tenant a read or decision names. Only where a tenant's records begin
/// (a session, a tenant server) is its id held to the rule; here it is only
/// a bound parameter, and records made before the rule must stay reachable.
pub(super) fn tenant(query: &HashMap<String, String>) -> Result<String, ApiError> {
    query
        .get("tenant_id")
        .cloned()
        .ok_or_else(|| ApiError::Invalid("tenant_id is required".into()))
}

/// The tenant a tenant-scoped route names, and the id in its path; `None`
/// when the id is not one.
pub(super) fn tenant_and_id(
    query: &HashMap<String, String>,
    id: &str,
) -> Result<Option<(String, uuid::Uuid)>, ApiError> {
    let tenant = tenant(query)?;
    Ok(id.parse::<uuid::Uuid>().ok().map(|id| (tenant, id)))
}
