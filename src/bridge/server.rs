//! A turn's socket server: closes a connection whose peer is not the turn's
//! sandbox user as soon as it is accepted, accepts the rest under the
//! turn's and the bridge's connection caps, refuses a request whose token
//! or turn is wrong before anything else, and routes the rest. Every request runs to
//! its end under the in-flight tracker.

use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde_json::{Value, json};
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

use super::turn::{AccessDenied, Turn};
use super::{Bridge, call};
use crate::edge::{
    ConnectionCap, Reply, artifact_reply, bearer_token, error, json_body, reply, serve_connection,
};

/// The pause after a failed accept.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves one turn's socket until the turn is closed.
pub(super) async fn serve_turn(
    bridge: Arc<Bridge>,
    turn: Arc<Turn>,
    listener: UnixListener,
    stop: CancellationToken,
) {
    let own = ConnectionCap::new(bridge.parts.settings.turn_connections);
    loop {
        let stream = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => {
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        // Another uid's connection is closed before a byte is read and
        // before it takes a place under either cap.
        let peer_uid = stream.peer_cred().ok().map(|credentials| credentials.uid());
        if !turn.admits_peer(peer_uid) {
            bridge.parts.metrics.increment(
                "bridge_refusals_total",
                vec![("code", "forbidden_peer".to_owned())],
            );
            tracing::debug!(turn_id = %turn.id, peer_uid, "a peer that is not the turn's sandbox user was refused");
            continue;
        }
        // Past either cap the connection is closed as soon as accepted.
        let Some(turn_permit) = own.admit() else {
            continue;
        };
        let Some(bridge_permit) = bridge.parts.connections.admit() else {
            continue;
        };
        let (bridge, turn) = (bridge.clone(), turn.clone());
        let header_timeout = bridge.parts.settings.limits.header_timeout;
        tokio::spawn(serve_connection(
            stream,
            header_timeout,
            vec![turn_permit, bridge_permit],
            move |request| {
                let (bridge, turn) = (bridge.clone(), turn.clone());
                async move {
                    let in_flight = bridge.parts.in_flight.clone();
                    let work = async move { handle(&bridge, &turn, request).await };
                    in_flight.track(work).await
                }
            },
        ));
    }
}

/// A refusal, counted by its code.
pub(super) fn refuse(bridge: &Bridge, status: StatusCode, code: &str, message: &str) -> Reply {
    bridge
        .parts
        .metrics
        .increment("bridge_refusals_total", vec![("code", code.to_owned())]);
    error(status, code, message)
}

async fn handle(bridge: &Arc<Bridge>, turn: &Arc<Turn>, request: Request<Incoming>) -> Reply {
    let token = bearer_token(request.headers());
    match turn.authorize(token, bridge.parts.clock.now()) {
        Ok(()) => {}
        Err(AccessDenied::Token) => {
            return refuse(
                bridge,
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "missing or wrong turn token",
            );
        }
        Err(AccessDenied::Closed) => {
            return refuse(
                bridge,
                StatusCode::GONE,
                "turn_closed",
                "the turn is closed",
            );
        }
    }
    let Ok(session) = bridge.parts.sessions.get(turn.binding.session_id).await else {
        return refuse(
            bridge,
            StatusCode::GONE,
            "turn_closed",
            "the turn's session is closed",
        );
    };
    match (request.method().clone(), request.uri().path()) {
        (Method::GET, "/v1/tools") => {
            let tools: Vec<Value> = session
                .pinned
                .advertised()
                .map(|pinned| {
                    json!({
                        "name": pinned.tool.spec.name,
                        "description": pinned.tool.spec.description,
                        "input_schema": pinned.tool.spec.input_schema,
                        "output_schema": pinned.tool.spec.output_schema,
                    })
                })
                .collect();
            reply(StatusCode::OK, &json!({"tools": tools}))
        }
        (Method::GET, "/v1/waiting") => {
            // Asked on a second connection while a call blocks: what it
            // waits for, so the script's reader is told.
            let now = bridge.parts.clock.now();
            let waiting = turn.waiting().map(|waiting| {
                json!({
                    "approval_id": waiting.approval_id,
                    "call": waiting.call,
                    "held_until": waiting.held_until,
                    "seconds_left": (waiting.held_until - now).num_seconds().max(0),
                })
            });
            reply(StatusCode::OK, &json!({"waiting": waiting}))
        }
        (Method::GET, path) if path.starts_with("/v1/artifacts/") => {
            // The turn's run's artifacts only; another run's or another
            // tenant's id is not found.
            let found = match path["/v1/artifacts/".len()..].parse::<uuid::Uuid>() {
                Ok(id) => {
                    bridge
                        .parts
                        .artifacts
                        .open_in_run(&session.tenant_id, turn.binding.run_id, id)
                        .await
                }
                Err(_) => Ok(None),
            };
            match found {
                Ok(Some(open)) => artifact_reply(open),
                Ok(None) => refuse(
                    bridge,
                    StatusCode::NOT_FOUND,
                    "not_found",
                    "no such artifact",
                ),
                Err(failure) => {
                    tracing::error!(error = %failure, "an artifact could not be read");
                    refuse(
                        bridge,
                        StatusCode::SERVICE_UNAVAILABLE,
                        "artifact_unavailable",
                        "the artifact could not be read",
                    )
                }
            }
        }
        (Method::POST, "/v1/call") => {
            if bridge.parts.in_flight.draining() {
                return refuse(
                    bridge,
                    StatusCode::SERVICE_UNAVAILABLE,
                    "draining",
                    "toolgate is shutting down",
                );
            }
            // One call at a time per turn, taken before the body is read so
            // that a second request cannot slip in while the first arrives.
            let Some(in_flight) = turn.begin_call() else {
                return refuse(
                    bridge,
                    StatusCode::CONFLICT,
                    "call_in_flight",
                    "another call of this turn is in flight; calls are made one at a time",
                );
            };
            let answer = match json_body(request, &bridge.parts.settings.limits).await {
                Ok(script_call) => call::run(bridge, turn, &in_flight, &session, script_call).await,
                Err(refused) => {
                    bridge.parts.metrics.increment(
                        "bridge_refusals_total",
                        vec![("code", "invalid_request".to_owned())],
                    );
                    refused.reply()
                }
            };
            drop(in_flight);
            answer
        }
        _ => refuse(
            bridge,
            StatusCode::NOT_FOUND,
            "not_found",
            "no such resource",
        ),
    }
}
