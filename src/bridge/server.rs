//! A turn's socket server: closes a connection whose peer is not the turn's
//! sandbox user as soon as it is accepted, accepts the rest under the
//! turn's and the bridge's connection caps, refuses a request whose token
//! or turn is wrong before anything else, and routes the rest. Every request runs to
//! its end under the in-flight tracker.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde_json::{Value, json};
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

use super::refusal::Refusal;
use super::turn::{AccessDenied, Turn};
use super::{Bridge, call};
use crate::edge::{
    ConnectionCap, Reply, accept_until, artifact_reply, bearer_token, json_body, reply,
    serve_connection,
};

/// Serves one turn's socket until the turn is closed.
pub(super) async fn serve_turn(
    bridge: Arc<Bridge>,
    turn: Arc<Turn>,
    listener: UnixListener,
    stop: CancellationToken,
) {
    let own = ConnectionCap::new(bridge.parts.settings.turn_connections);
    accept_until(listener, "bridge turn", stop, |stream| {
        // Another uid's connection is closed before a byte is read and
        // before it takes a place under either cap.
        let peer_uid = stream.peer_cred().ok().map(|credentials| credentials.uid());
        if !turn.admits_peer(peer_uid) {
            Refusal::ForbiddenPeer.count(bridge.parts.metrics.as_ref());
            tracing::debug!(turn_id = %turn.id, peer_uid, "a peer that is not the turn's sandbox user was refused");
            return;
        }
        // Past either cap the connection is closed as soon as accepted.
        let Some(turn_permit) = own.admit() else {
            return;
        };
        let Some(bridge_permit) = bridge.parts.connections.admit() else {
            return;
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
    })
    .await;
}

async fn handle(bridge: &Arc<Bridge>, turn: &Arc<Turn>, request: Request<Incoming>) -> Reply {
    match route(bridge, turn, request).await {
        Ok(reply) => reply,
        Err(refusal) => refusal.reply(bridge.parts.metrics.as_ref()),
    }
}

async fn route(
    bridge: &Arc<Bridge>,
    turn: &Arc<Turn>,
    request: Request<Incoming>,
) -> Result<Reply, Refusal> {
    let token = bearer_token(request.headers());
    match turn.authorize(token, bridge.parts.clock.now()) {
        Ok(()) => {}
        Err(AccessDenied::Token) => return Err(Refusal::Unauthorized),
        Err(AccessDenied::Closed) => return Err(Refusal::TurnClosed),
    }
    let Ok(session) = bridge.parts.sessions.get(turn.binding.session_id).await else {
        return Err(Refusal::SessionClosed);
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
            Ok(reply(StatusCode::OK, &json!({"tools": tools})))
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
            Ok(reply(StatusCode::OK, &json!({"waiting": waiting})))
        }
        (Method::GET, path) if path.starts_with("/v1/artifacts/") => {
            // The turn's run's artifacts only; another run's or another
            // tenant's id is not found.
            let id = path["/v1/artifacts/".len()..]
                .parse::<uuid::Uuid>()
                .map_err(|_| Refusal::ArtifactNotFound)?;
            match bridge
                .parts
                .artifacts
                .open_in_run(&session.tenant_id, turn.binding.run_id, id)
                .await
            {
                Ok(Some(open)) => Ok(artifact_reply(open)),
                Ok(None) => Err(Refusal::ArtifactNotFound),
                Err(failure) => {
                    tracing::error!(error = %failure, "an artifact could not be read");
                    Err(Refusal::ArtifactUnavailable)
                }
            }
        }
        (Method::POST, "/v1/call") => {
            if bridge.parts.in_flight.draining() {
                return Err(Refusal::Draining);
            }
            // One call at a time per turn, taken before the body is read so
            // that a second request cannot slip in while the first arrives.
            let in_flight = turn.begin_call().ok_or(Refusal::CallInFlight)?;
            let script_call = json_body(request, &bridge.parts.settings.limits).await?;
            call::run(bridge, turn, &in_flight, &session, script_call).await
        }
        _ => Err(Refusal::NotFound),
    }
}
