//! The MCP front door as the protocol's server side sees it: the methods
//! toolgate answers, over JSON, so that only `adapters::mcp` names the
//! protocol library (design gate 13). The adapter parses and answers the
//! protocol (both eras, the headers, the result types); `front` decides
//! what each method does.

use std::convert::Infallible;
use std::sync::Arc;

use http_body_util::Full;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Bytes;
use serde_json::Value;

use super::tool::BoxFuture;

/// A JSON-RPC error the front door answers with: a stable code and a
/// message that names no secret and no remote text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} ({code})")]
pub struct FrontError {
    /// The JSON-RPC code.
    pub code: i32,
    /// What the client is told.
    pub message: String,
    /// The error's `data`, when it has any (a rate limit's
    /// `retryAfterSeconds`).
    pub data: Option<serde_json::Value>,
}

impl FrontError {
    /// `-32602`: the request's parameters cannot be served.
    pub fn invalid_params(message: impl Into<String>) -> Self {
        FrontError {
            code: -32602,
            message: message.into(),
            data: None,
        }
    }

    /// `-32600`: the request cannot be served as sent.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        FrontError {
            code: -32600,
            message: message.into(),
            data: None,
        }
    }

    /// `-32603`: toolgate could not answer; the client may retry.
    pub fn internal(message: impl Into<String>) -> Self {
        FrontError {
            code: -32603,
            message: message.into(),
            data: None,
        }
    }
}

/// Progress a held request reports to a client that asked for it.
pub trait ProgressSink: Send + Sync {
    /// One notification: seconds since the call began, and what it waits
    /// for.
    fn progress(&self, elapsed_seconds: f64, message: String) -> BoxFuture<'_, ()>;
}

/// One request as the front door's methods see it.
pub struct FrontContext {
    /// The JSON-RPC id.
    pub request_id: Value,
    /// The request's `_meta`.
    pub meta: Value,
    /// Whether the request's revision has no `initialize` (2026-07-28 on):
    /// it stands alone.
    pub stateless: bool,
    /// The capabilities the client declared (on the request, or at its
    /// session's `initialize`), as the protocol spells them.
    pub client_capabilities: Option<Value>,
    /// The HTTP request's head, with what the listener attached to it.
    pub http: Option<hyper::http::request::Parts>,
    /// Where progress goes, when the request carried a progress token.
    pub progress: Option<Arc<dyn ProgressSink>>,
}

/// The methods toolgate serves as an MCP server; each answers the result's
/// JSON as the protocol spells it.
pub trait FrontMethods: Send + Sync {
    /// The server's description: revision, capabilities, server info and
    /// instructions, as `initialize` and `server/discover` give them.
    fn info(&self) -> Value;

    /// `initialize` (the 2025 era): opens the caller's session.
    fn initialize(&self, context: FrontContext) -> BoxFuture<'_, Result<(), FrontError>>;

    /// `tools/list`.
    fn list_tools(&self, context: FrontContext) -> BoxFuture<'_, Result<Value, FrontError>>;

    /// `tools/call`: a `CallToolResult`, or (2026-07-28) a task or an
    /// input-required result, told apart by `resultType`.
    fn call_tool(
        &self,
        params: Value,
        context: FrontContext,
    ) -> BoxFuture<'_, Result<Value, FrontError>>;

    /// `prompts/list`.
    fn list_prompts(&self, context: FrontContext) -> BoxFuture<'_, Result<Value, FrontError>>;

    /// `resources/list` (`templates`: `resources/templates/list`): what a
    /// client may enumerate, which is nothing; artifacts are reached by
    /// the links results carry.
    fn list_resources(&self, templates: bool, context: FrontContext) -> Value;

    /// `prompts/get`.
    fn get_prompt(
        &self,
        params: Value,
        context: FrontContext,
    ) -> BoxFuture<'_, Result<Value, FrontError>>;

    /// `tasks/get` of the tasks extension.
    fn get_task(
        &self,
        task_id: String,
        context: FrontContext,
    ) -> BoxFuture<'_, Result<Value, FrontError>>;

    /// `tasks/cancel` of the tasks extension.
    fn cancel_task(
        &self,
        task_id: String,
        context: FrontContext,
    ) -> BoxFuture<'_, Result<(), FrontError>>;
}

/// A response of the protocol's server side.
pub type ProtocolReply = hyper::Response<UnsyncBoxBody<Bytes, Infallible>>;

/// The protocol's server side: answers one request the front door has
/// authenticated and read, through [`FrontMethods`].
pub trait McpProtocol: Send + Sync {
    /// The answer to `request`.
    fn handle(&self, request: hyper::Request<Full<Bytes>>) -> BoxFuture<'_, ProtocolReply>;
}
