//! `/v1/sessions` and `/v1/turns`: opening a session (onto the sessions
//! service), and opening and closing a session's orchestration turns (onto
//! the bridge).

use std::sync::Arc;

use hyper::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use super::listen::Routed;
use super::wire::{OpenSession, OpenTurn};
use super::{ApiError, ControlApi};
use crate::bridge::TurnRequest;
use crate::edge::{Reply, reply};
use crate::pipeline::sessions::SessionRequest;

impl ControlApi {
    pub(super) async fn open_session(&self, routed: Routed) -> Result<Reply, ApiError> {
        let open: OpenSession = self.body(routed.request).await?;
        let session = self
            .parts
            .sessions
            .open(SessionRequest {
                session_id: open.session_id,
                tenant_id: open.tenant_id,
                principal: open.principal,
                agent: open.agent,
            })
            .await?;
        let tools: Vec<Value> = session
            .pinned
            .advertised()
            .map(|pinned| {
                let spec = &pinned.tool.spec;
                json!({
                    "name": spec.name,
                    "wire_name": pinned.wire_name,
                    "description": spec.description,
                    "input_schema": spec.input_schema,
                    "kind": spec.kind,
                    "source": spec.source,
                    "side_effect": spec.side_effect,
                    "risk": spec.risk,
                })
            })
            .collect();
        // Metadata only: a skill's content enters a turn through skill.load.
        let skills: Vec<Value> = session
            .pinned
            .skills()
            .iter()
            .map(|skill| {
                let metadata = &skill.metadata;
                json!({
                    "name": metadata.name,
                    "version": metadata.version,
                    "description": metadata.description,
                    "required_tools": metadata.required_tools,
                    "source": metadata.source,
                    "server_id": metadata.server_id,
                })
            })
            .collect();
        Ok(reply(
            StatusCode::OK,
            &json!({
                "session_id": session.session_id,
                "tool_schema_sha256": session.pinned.tool_schema_sha256(),
                "tools": tools,
                "skills": skills,
            }),
        ))
    }

    pub(super) async fn open_turn(self: &Arc<Self>, routed: Routed) -> Result<Reply, ApiError> {
        let open: OpenTurn = self.body(routed.request).await?;
        let turn = self
            .parts
            .bridge
            .open_turn(TurnRequest {
                session_id: open.session_id,
                run_id: open.run_id,
                step_number: open.step_number,
                script_sha256: open.script_sha256,
                sandbox_uid: open.sandbox_uid,
                origin_trust: open.origin_trust,
                deadline_at: open.deadline_at,
            })
            .await?;
        Ok(reply(
            StatusCode::OK,
            &json!({
                "turn_id": turn.turn_id,
                "socket_path": turn.socket_path,
                "token": turn.token,
                "expires_at": turn.expires_at,
            }),
        ))
    }

    pub(super) async fn close_turn(&self, id: &str) -> Result<Reply, ApiError> {
        let id = id.parse::<Uuid>().map_err(|_| ApiError::NotFound)?;
        let calls = self
            .parts
            .bridge
            .close_turn(id, crate::domain::TurnState::Closed)
            .await
            .ok_or(ApiError::NotFound)?;
        Ok(reply(
            StatusCode::OK,
            &json!({"turn_id": id, "calls": calls}),
        ))
    }
}
