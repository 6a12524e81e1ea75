//! Calls, resource reads and prompt loads through the live connection,
//! their failures told and their text scrubbed of the server's secret.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::time::Instant;
use tracing::Instrument as _;

use super::ladder::{Climb, Ladder};
use super::{McpServer, lock};
use crate::adapters::mcp::catalog::RemoteTool;
use crate::adapters::mcp::client::{ClientError, Connection, RemoteCall, RemotePrompt};
use crate::adapters::mcp::render::{
    render_blocks, render_call, unauthorized, unreachable, withdrawn,
};
use crate::domain::secret::scrub;
use crate::domain::{
    ContentPart, ReasonCode, SecretValue, SkillMetadata, ToolFailure, ToolFailureKind, ToolResult,
    ToolSpec,
};
use crate::ports::{LoadedSkill, ToolExecutionContext};

impl McpServer {
    /// The effective request timeout: the server's, capped by the call's.
    pub(super) fn request_timeout(&self, context: &ToolExecutionContext) -> Duration {
        let call = Duration::from_secs_f64(context.timeout_seconds.max(0.0));
        let remaining = context
            .deadline_at
            .duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO);
        self.server_request_timeout().min(call).min(remaining)
    }

    pub(super) async fn call(
        self: &Arc<Self>,
        spec: &ToolSpec,
        remote_name: &str,
        pinned: Option<&RemoteTool>,
        arguments: Value,
        context: &ToolExecutionContext,
    ) -> ToolResult {
        if self.delegates() {
            // Each principal's call goes out over its own connection, with
            // its own grant, and never another's.
            return match self.instance(&context.tenant_id, &context.principal.id) {
                Some(instance) => {
                    Box::pin(instance.call(spec, remote_name, pinned, arguments, context)).await
                }
                None => unreachable(ReasonCode::ToolAuthUnsupported),
            };
        }
        if self.withdrawn(remote_name, pinned) {
            return withdrawn();
        }
        if lock(&self.ladders).get(context.session_id) == Some(Ladder::Unauthorized) {
            return unauthorized(true);
        }
        let connection = match self.connection(&context.tenant_id).await {
            Ok(connection) => connection,
            Err(reason_code) => return self.unconnected(reason_code, context),
        };
        // A redial may have just shown the declaration gone.
        if self.withdrawn(remote_name, pinned) {
            return withdrawn();
        }
        let arguments = match arguments {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        let mut answer = self
            .send_call(&connection, remote_name, arguments.clone(), context)
            .await;
        if matches!(answer, Err(ClientError::Unauthorized { .. })) {
            // Ladder step 1: the call is held while the ladder runs.
            match self.climb(spec, context).await {
                Climb::Retry => {}
                Climb::Refused => return self.refused(&connection, context).await,
                Climb::ConsentRequired => return unreachable(ReasonCode::ToolConsentRequired),
            }
            answer = self
                .send_call(&connection, remote_name, arguments, context)
                .await;
            if matches!(answer, Err(ClientError::Unauthorized { .. })) {
                lock(&self.ladders).set(context.session_id, Ladder::Unauthorized);
                return self.refused(&connection, context).await;
            }
        }
        let result = match answer {
            Ok(call) => render_call(self.scrub_call(call), context).await,
            Err(error) => self.failed(&connection, error, context).await,
        };
        self.scrubbed(result)
    }

    /// A call whose (re)connection failed. A credential refused at connect
    /// is terminal for the session: its later calls are not dialled.
    pub(super) fn unconnected(
        &self,
        reason_code: ReasonCode,
        context: &ToolExecutionContext,
    ) -> ToolResult {
        if matches!(
            reason_code,
            ReasonCode::ToolAuthFailed | ReasonCode::ToolAuthUnsupported
        ) {
            lock(&self.ladders).set(context.session_id, Ladder::Unauthorized);
        }
        unreachable(reason_code)
    }

    pub(super) async fn send_call(
        &self,
        connection: &Connection,
        remote_name: &str,
        arguments: Map<String, Value>,
        context: &ToolExecutionContext,
    ) -> Result<RemoteCall, ClientError> {
        let answer = connection
            .call_tool(
                remote_name,
                arguments,
                &context.idempotency_key,
                self.request_timeout(context),
            )
            .instrument(tracing::info_span!(
                "mcp.request",
                mcp.server = %self.server_id(),
                mcp.method = "tools/call"
            ))
            .await;
        *lock(&self.last_used) = Instant::now();
        let outcome = match &answer {
            Ok(call) if call.is_error => "error_result",
            Ok(_) => "ok",
            Err(error) => error.reason_code().as_str(),
        };
        self.shared.metrics.increment(
            "mcp_requests_total",
            vec![
                ("server", self.server_id().to_owned()),
                ("method", "tools/call".to_owned()),
                ("outcome", outcome.to_owned()),
            ],
        );
        answer
    }

    pub(super) async fn failed(
        self: &Arc<Self>,
        connection: &Arc<Connection>,
        error: ClientError,
        context: &ToolExecutionContext,
    ) -> ToolResult {
        let reason_code = error.reason_code();
        if error.is_fatal()
            && self
                .forget(&context.tenant_id, connection, reason_code)
                .await
        {
            self.restart_soon();
        }
        let never_sent = error.never_sent();
        let failure = match error {
            ClientError::Remote { external_text, .. } => ToolFailure::new(
                ToolFailureKind::UpstreamError,
                "the server answered with an error",
            )
            .with_external_text(external_text),
            ClientError::RequestTimeout { .. } => ToolFailure::new(
                ToolFailureKind::Timeout,
                "the server did not answer in time",
            ),
            ClientError::OutputTooLarge { .. } => {
                let failure = ToolFailure::new(
                    ToolFailureKind::OutputTooLarge,
                    "the server's answer crossed the hard output ceiling; the connection was closed",
                );
                // The answer's head up to the ceiling, as the server sent it
                // (the protocol's framing around it): kept as an artifact.
                match connection.runaway_head() {
                    Some(head) => {
                        failure.with_partial_output(String::from_utf8_lossy(&head).into_owned())
                    }
                    None => failure,
                }
            }
            other => ToolFailure::new(ToolFailureKind::Transport, other.to_string())
                .with_reason_code(reason_code),
        };
        ToolResult::failed(if never_sent {
            failure.not_applied()
        } else {
            failure
        })
    }

    pub(super) async fn read_resource(
        self: &Arc<Self>,
        uri: &str,
        context: &ToolExecutionContext,
    ) -> ToolResult {
        if self.delegates() {
            return match self.instance(&context.tenant_id, &context.principal.id) {
                Some(instance) => Box::pin(instance.read_resource(uri, context)).await,
                None => unreachable(ReasonCode::ToolAuthUnsupported),
            };
        }
        let advertised = lock(&self.remembered)
            .as_ref()
            .map(|remembered| remembered.resources.clone())
            .unwrap_or_default();
        if uri.is_empty() {
            let listing: Vec<Value> = advertised
                .iter()
                .map(|resource| {
                    json!({"uri": resource.uri, "name": resource.name,
                                       "mime_type": resource.mime_type})
                })
                .collect();
            return ToolResult::text(Value::Array(listing).to_string());
        }
        if !advertised.iter().any(|resource| resource.uri == uri) {
            return ToolResult::failed(
                ToolFailure::new(
                    ToolFailureKind::InvalidArguments,
                    "the URI is not in the server's advertised resource list",
                )
                .not_applied(),
            );
        }
        if lock(&self.ladders).get(context.session_id) == Some(Ladder::Unauthorized) {
            return unauthorized(true);
        }
        let connection = match self.connection(&context.tenant_id).await {
            Ok(connection) => connection,
            Err(reason_code) => return self.unconnected(reason_code, context),
        };
        let answer = connection
            .read_resource(uri, self.request_timeout(context))
            .await;
        *lock(&self.last_used) = Instant::now();
        let result = match answer {
            Ok(contents) => {
                let contents = contents
                    .into_iter()
                    .map(|block| self.scrub_value(block))
                    .collect();
                render_blocks(contents, context).await
            }
            Err(error) => self.failed(&connection, error, context).await,
        };
        self.scrubbed(result)
    }

    /// The skill behind `name`, when this server's pin advertised it.
    pub(in crate::adapters::mcp) fn prompt(
        &self,
        name: &str,
    ) -> Option<(SkillMetadata, RemotePrompt)> {
        lock(&self.remembered).as_ref().and_then(|remembered| {
            remembered
                .prompts
                .iter()
                .find(|(metadata, _)| metadata.name == name)
                .cloned()
        })
    }

    pub(in crate::adapters::mcp) async fn load_prompt(
        self: &Arc<Self>,
        tenant_id: &str,
        prompt: &RemotePrompt,
        metadata: SkillMetadata,
        arguments: Map<String, Value>,
    ) -> Result<LoadedSkill, ToolFailure> {
        let connection = self.connection(tenant_id).await.map_err(|code| {
            ToolFailure::new(ToolFailureKind::Transport, "server unreachable")
                .with_reason_code(code)
        })?;
        let messages = connection
            .get_prompt(&prompt.name, arguments, self.server_request_timeout())
            .await
            .map_err(|error| {
                ToolFailure::new(ToolFailureKind::UpstreamError, error.to_string())
                    .with_reason_code(error.reason_code())
            })?;
        let text = messages
            .iter()
            .filter_map(|message| message.pointer("/content/text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n\n");
        let secrets: Vec<SecretValue> = self.secret().into_iter().collect();
        Ok(LoadedSkill {
            metadata,
            text: scrub(&text, &secrets),
        })
    }

    /// Whether the pinned declaration of `remote_name` is gone or changed in
    /// the newest listing.
    pub(super) fn withdrawn(&self, remote_name: &str, pinned: Option<&RemoteTool>) -> bool {
        match lock(&self.current).as_ref() {
            Some(current) => current.get(remote_name) != pinned,
            None => pinned.is_none(),
        }
    }

    /// A block with the transport's own credential redacted wherever it
    /// appears (a URI, a blob, a field), before any of it is rendered or
    /// stored as an artifact.
    pub(super) fn scrub_value(&self, value: Value) -> Value {
        let Some(secret) = self.secret() else {
            return value;
        };
        let text = value.to_string();
        let scrubbed = scrub(&text, &[secret]);
        if scrubbed == text {
            return value;
        }
        serde_json::from_str(&scrubbed).unwrap_or(Value::Null)
    }

    pub(super) fn scrub_call(&self, call: RemoteCall) -> RemoteCall {
        RemoteCall {
            content: call
                .content
                .into_iter()
                .map(|block| self.scrub_value(block))
                .collect(),
            structured: call.structured.map(|value| self.scrub_value(value)),
            is_error: call.is_error,
        }
    }

    /// The result with the transport's own credential redacted.
    pub(super) fn scrubbed(&self, mut result: ToolResult) -> ToolResult {
        let Some(secret) = self.secret() else {
            return result;
        };
        let secrets = [secret];
        for part in &mut result.content {
            if let ContentPart::Text { text } = part {
                *text = scrub(text, &secrets);
            }
        }
        if let Some(failure) = &mut result.failure {
            failure.external_text = failure
                .external_text
                .as_deref()
                .map(|text| scrub(text, &secrets));
            failure.detail = scrub(&failure.detail, &secrets);
            // The head of an oversized answer is kept as an artifact: cut at
            // the ceiling, it may end in the credential's beginning.
            failure.partial_output = failure.partial_output.take().map(|head| {
                crate::domain::secret::scrub_cut_prefix(scrub(&head, &secrets), &secrets)
            });
        }
        result
    }
}
