//! The protocol's server side of the front door: rmcp's streamable-HTTP
//! service, run without its sessions (toolgate's are its own), answering
//! both eras on one endpoint through [`FrontMethods`]. rmcp checks what
//! the protocol requires of a request (a 2026-07-28 request's headers
//! against its body, its revision, its `_meta`) and shapes every answer;
//! the methods decide what each does.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, CreateTaskResult,
    ErrorCode, GetPromptRequestParams, GetPromptResponse, GetPromptResult, GetTaskParams,
    GetTaskResult, InitializeRequestParams, InitializeResult, InputRequiredResult,
    ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ProgressToken, ProtocolVersion,
    ServerConfig,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::tower::StreamableHttpService;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::ports::front::{
    FrontContext, FrontError, FrontMethods, McpProtocol, ProgressSink, ProtocolReply,
};
use crate::ports::tool::BoxFuture;

/// What the protocol's side is configured with.
#[derive(Debug, Clone, Copy)]
pub struct ProtocolSettings {
    /// The most a request's body may hold.
    pub body_limit: usize,
    /// How often an SSE answer with nothing to say sends a comment.
    pub keep_alive: Duration,
}

/// The front door's protocol over `methods`, until `shutdown` fires.
pub fn front_protocol(
    methods: Arc<dyn FrontMethods>,
    settings: ProtocolSettings,
    shutdown: &CancellationToken,
) -> Arc<dyn McpProtocol> {
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(Some(settings.keep_alive))
        .with_sse_retry(None)
        .with_max_request_body_bytes(settings.body_limit)
        .with_cancellation_token(shutdown.child_token())
        // The front door checks these before authentication, for every path.
        .disable_allowed_hosts()
        .disable_allowed_origins();
    // Read once: rmcp asks a request's handler for it several times.
    let info: Arc<ServerConfig> = Arc::new(
        serde_json::from_value(methods.info())
            .unwrap_or_else(|_| InitializeResult::new(Default::default())),
    );
    Arc::new(Protocol {
        service: StreamableHttpService::new(
            move || {
                Ok(Handler {
                    methods: methods.clone(),
                    info: info.clone(),
                })
            },
            Arc::new(NeverSessionManager::default()),
            config,
        ),
    })
}

struct Protocol {
    service: StreamableHttpService<Handler, NeverSessionManager>,
}

impl McpProtocol for Protocol {
    fn handle(&self, request: hyper::Request<Full<Bytes>>) -> BoxFuture<'_, ProtocolReply> {
        Box::pin(async move {
            let response = self.service.handle(request).await;
            response.map(|body| body.boxed_unsync())
        })
    }
}

/// One request's handler (rmcp makes one per request).
struct Handler {
    methods: Arc<dyn FrontMethods>,
    /// The methods' [`FrontMethods::info`], as rmcp's type.
    info: Arc<ServerConfig>,
}

/// Progress to a client that sent a progress token.
struct Progress {
    peer: Peer<RoleServer>,
    token: ProgressToken,
}

impl ProgressSink for Progress {
    fn progress(&self, elapsed_seconds: f64, message: String) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let note = ProgressNotificationParam::new(self.token.clone(), elapsed_seconds)
                .with_message(message);
            // A client that went away is not waited for.
            let _ = self.peer.notify_progress(note).await;
        })
    }
}

fn context_of(context: &RequestContext<RoleServer>) -> FrontContext {
    let progress = context.meta.get_progress_token().map(|token| {
        Arc::new(Progress {
            peer: context.peer.clone(),
            token,
        }) as Arc<dyn ProgressSink>
    });
    FrontContext {
        request_id: serde_json::to_value(&context.id).unwrap_or(Value::Null),
        meta: serde_json::to_value(&context.meta).unwrap_or(Value::Null),
        stateless: context
            .protocol_version()
            .is_some_and(|version| !version.has_initialize()),
        client_capabilities: context
            .client_capabilities()
            .and_then(|capabilities| serde_json::to_value(capabilities).ok()),
        http: context
            .extensions
            .get::<hyper::http::request::Parts>()
            .cloned(),
        progress,
    }
}

fn error(error: FrontError) -> McpError {
    McpError::new(ErrorCode(error.code), error.message, error.data)
}

fn from_json<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, McpError> {
    serde_json::from_value(value)
        .map_err(|_| McpError::internal_error("the answer could not be written", None))
}

fn to_json<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::clone(&self.info)
    }

    // Every revision: those with sessions through `initialize` (offered
    // `get_info`'s at most), 2026-07-28 request by request.
    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2026_07_28))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        self.methods
            .initialize(context_of(&context))
            .await
            .map_err(error)?;
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let listed = self.methods.list_tools(context_of(&context)).await;
        from_json(listed.map_err(error)?)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let answer = self
            .methods
            .call_tool(to_json(&request), context_of(&context))
            .await
            .map_err(error)?;
        Ok(match answer.get("resultType").and_then(Value::as_str) {
            Some("task") => from_json::<CreateTaskResult>(answer)?.into(),
            Some("input_required") => from_json::<InputRequiredResult>(answer)?.into(),
            _ => from_json::<CallToolResult>(answer)?.into(),
        })
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        let listed = self.methods.list_prompts(context_of(&context)).await;
        from_json(listed.map_err(error)?)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        from_json(self.methods.list_resources(false, context_of(&context)))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        from_json(self.methods.list_resources(true, context_of(&context)))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let prompt = self
            .methods
            .get_prompt(to_json(&request), context_of(&context))
            .await
            .map_err(error)?;
        Ok(GetPromptResponse::Complete(from_json::<GetPromptResult>(
            prompt,
        )?))
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let task = self
            .methods
            .get_task(request.task_id, context_of(&context))
            .await
            .map_err(error)?;
        from_json(task)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.methods
            .cancel_task(request.task_id, context_of(&context))
            .await
            .map_err(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_answers_of_a_call_parse_as_their_results() {
        let complete = serde_json::json!({"content": [{"type": "text", "text": "x"}],
            "isError": true, "resultType": "complete"});
        let parsed: CallToolResult = from_json(complete).unwrap();
        assert_eq!(parsed.is_error, Some(true));
        let task = serde_json::json!({"resultType": "task", "taskId": "t", "status": "working",
            "createdAt": "2026-01-01T00:00:00Z", "lastUpdatedAt": "2026-01-01T00:00:00Z",
            "ttlMs": null, "pollIntervalMs": 5000});
        assert!(from_json::<CreateTaskResult>(task).is_ok());
        let input = serde_json::json!({"resultType": "input_required", "requestState": "s",
            "inputRequests": {"approval": {"method": "elicitation/create", "params": {
                "mode": "url", "message": "m", "url": "http://x/approvals/t/a", "elicitationId": ""}}}});
        assert!(from_json::<InputRequiredResult>(input).is_ok());
        let got = serde_json::json!({"resultType": "complete", "taskId": "t", "status": "completed",
            "createdAt": "2026-01-01T00:00:00Z", "lastUpdatedAt": "2026-01-01T00:00:00Z",
            "ttlMs": null, "result": {"content": [], "isError": false}});
        assert!(from_json::<GetTaskResult>(got).is_ok());
    }
}
