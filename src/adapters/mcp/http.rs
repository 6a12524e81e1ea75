//! Streamable HTTP to an MCP server, under rmcp's client worker: every
//! connection dialled through egress (never a connector of its own), the
//! credential written into each request from the authenticator at the
//! moment it is sent, no redirect followed, and every answer bounded (a
//! JSON body by the ceiling in flight, an SSE event by the same ceiling).
//!
//! rmcp decides what to send and when; this file decides how bytes leave
//! and come back. Keep-alive connections are reused while idle; a request
//! on a reused connection that the server had already closed is sent again
//! on a new one only when hyper proves it was never written.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt as _;
use futures::stream::BoxStream;
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Body as _, Bytes, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, HOST, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rmcp::model::{ClientJsonRpcMessage, RequestId, ServerJsonRpcMessage};
use rmcp::transport::common::http_header::{
    EVENT_STREAM_MIME_TYPE, HEADER_SESSION_ID, JSON_MIME_TYPE,
};
use rmcp::transport::streamable_http_client::{
    AuthRequiredError, SseError, StreamableHttpClient, StreamableHttpError,
    StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use sse_stream::{Sse, SseStream};

use super::auth::{AuthError, Authenticator, host_of, path_of};
use super::framing::Ceilings;
use crate::domain::egress::EgressUrl;
use crate::ports::{DialError, EgressDialer};

/// Idle keep-alive connections kept per server.
const IDLE_CONNECTIONS: usize = 8;
/// How long a kept connection may take to become ready before a new one is
/// dialled instead.
const IDLE_READY: Duration = Duration::from_millis(100);
/// rmcp's `Last-Event-Id`, in the lowercase a static header name needs.
const LAST_EVENT_ID: &str = "last-event-id";
/// rmcp's `Mcp-Session-Id`, likewise.
const SESSION_ID: &str = "mcp-session-id";
/// The largest error body read (and then dropped) from a non-success answer,
/// and the most of a stream read after its reader let go.
const MAXIMUM_ERROR_BODY: usize = 64 << 10;
/// How long the rest of a stream its reader let go is read for, so its
/// connection can be kept.
const STREAM_DRAIN: Duration = Duration::from_secs(1);

/// Why a request did not produce an answer. Nothing a server said is in a
/// message.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Egress refused the URL or could not connect.
    #[error(transparent)]
    Dial(#[from] DialError),
    /// No credential could be had.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// The server answered with a redirect; egress never follows one.
    #[error("the server answered with a redirect, which egress does not follow")]
    Redirect,
    /// The answer's head did not arrive within the request deadline.
    #[error("the server did not answer within the request deadline")]
    Timeout,
    /// The connection failed mid-request.
    #[error("the connection failed mid-request")]
    Connection,
    /// An answer crossed the ceiling of what was in flight.
    #[error("an answer crossed the output ceiling")]
    TooLarge,
    /// The request could not be built.
    #[error("the request could not be built")]
    Request,
}

type Failure = StreamableHttpError<HttpError>;

/// A keep-alive connection and the `Host` it was dialled for.
struct Idle {
    sender: SendRequest<Full<Bytes>>,
    host: HeaderValue,
}

struct Inner {
    server_id: String,
    dialer: Arc<dyn EgressDialer>,
    authenticator: Arc<Authenticator>,
    /// How long an answer's head may take.
    header_timeout: Duration,
    ceilings: Arc<Ceilings>,
    idle: Mutex<Vec<Idle>>,
}

/// The HTTP client rmcp's streamable-HTTP worker speaks through.
#[derive(Clone)]
pub struct EgressClient {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for EgressClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressClient")
            .field("server_id", &self.inner.server_id)
            .finish_non_exhaustive()
    }
}

/// What a body read whole is: a server's answer (output) or anything else.
#[derive(Clone, Copy)]
enum Body {
    Answer,
    Other,
}

/// A response and, for a body read to its end, the connection to reuse.
struct Answer {
    response: Response<Incoming>,
    reusable: Option<Idle>,
}

impl EgressClient {
    /// A client for one server's endpoint.
    pub fn new(
        server_id: &str,
        dialer: Arc<dyn EgressDialer>,
        authenticator: Arc<Authenticator>,
        header_timeout: Duration,
        ceilings: Arc<Ceilings>,
    ) -> Self {
        EgressClient {
            inner: Arc::new(Inner {
                server_id: server_id.to_owned(),
                dialer,
                authenticator,
                header_timeout,
                ceilings,
                idle: Mutex::new(Vec::new()),
            }),
        }
    }

    /// A kept connection that is still open and ready for a request.
    async fn take_idle(&self) -> Option<Idle> {
        loop {
            let mut connection = self
                .inner
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop()?;
            if connection.sender.is_closed() {
                continue;
            }
            // A connection whose answer has just ended may not yet have
            // said it is ready for the next request.
            if let Ok(Ok(())) = tokio::time::timeout(IDLE_READY, connection.sender.ready()).await {
                return Some(connection);
            }
        }
    }

    fn put_idle(&self, connection: Idle) {
        let mut idle = self
            .inner
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if idle.len() < IDLE_CONNECTIONS {
            idle.push(connection);
        }
    }

    async fn dial(&self, url: &str) -> Result<Idle, HttpError> {
        let dialed = self.inner.dialer.dial(url).await?;
        let host = host_header(&dialed.url)?;
        let handshake = hyper::client::conn::http1::handshake(TokioIo::new(dialed.stream));
        let (sender, connection) = tokio::time::timeout(self.inner.header_timeout, handshake)
            .await
            .map_err(|_| HttpError::Timeout)?
            .map_err(|_| HttpError::Connection)?;
        tokio::spawn(connection);
        Ok(Idle { sender, host })
    }

    /// Sends one request to `url` with the credential of this moment, on a
    /// kept connection or a new one, and waits for its head within the
    /// header deadline.
    async fn send(
        &self,
        url: &str,
        method: Method,
        headers: Vec<(HeaderName, HeaderValue)>,
        body: Bytes,
    ) -> Result<Answer, HttpError> {
        let credential = self.inner.authenticator.header().await?;
        let build = |host: &HeaderValue| {
            let mut request = Request::builder()
                .method(method.clone())
                .uri(path_of(url))
                .header(HOST, host.clone());
            for (name, value) in &headers {
                request = request.header(name, value);
            }
            if let Some((name, value)) = &credential {
                request = request.header(name, value);
            }
            request
                .body(Full::new(body.clone()))
                .map_err(|_| HttpError::Request)
        };
        let mut kept = self.take_idle().await;
        loop {
            let reused = kept.is_some();
            let mut connection = match kept.take() {
                Some(connection) => connection,
                None => self.dial(url).await?,
            };
            let request = build(&connection.host)?;
            let sent = tokio::time::timeout(
                self.inner.header_timeout,
                connection.sender.send_request(request),
            )
            .await
            .map_err(|_| HttpError::Timeout)?;
            match sent {
                Ok(response) => {
                    return Ok(Answer {
                        response,
                        reusable: Some(connection),
                    });
                }
                // A kept connection the server closed while it idled: the
                // request was never written, so a new connection may carry it.
                Err(error) if reused && error.is_canceled() => continue,
                Err(_) => return Err(HttpError::Connection),
            }
        }
    }

    /// A body read whole (within the header deadline), its connection kept
    /// afterwards. A server's answer is bounded by the ceiling in flight,
    /// and crossing it is output too large; anything else (an error page,
    /// a body where none belongs) by [`MAXIMUM_ERROR_BODY`], and crossing
    /// that is a broken server, not output.
    async fn read_body(&self, answer: Answer, body: Body) -> Result<Bytes, HttpError> {
        let Answer { response, reusable } = answer;
        let limit = match body {
            Body::Answer => self.inner.ceilings.current(),
            Body::Other => MAXIMUM_ERROR_BODY,
        };
        let read = read_within(response.into_body(), limit);
        let bytes = match tokio::time::timeout(self.inner.header_timeout, read).await {
            Err(_) => return Err(HttpError::Timeout),
            Ok(Err(Bounded::Over(head))) => {
                return Err(match body {
                    Body::Answer => {
                        // The answer's head up to the ceiling is kept for
                        // the call it answered; the rest is never read.
                        self.inner.ceilings.mark_oversized_with(head);
                        HttpError::TooLarge
                    }
                    Body::Other => HttpError::Connection,
                });
            }
            Ok(Err(Bounded::Failed)) => return Err(HttpError::Connection),
            Ok(Ok(bytes)) => bytes,
        };
        if let Some(connection) = reusable {
            self.put_idle(connection);
        }
        Ok(bytes)
    }

    /// An SSE body, each event bounded by the ceiling in flight, its
    /// connection kept once the body has ended (see [`StreamBody`]).
    fn events(&self, answer: Answer) -> BoxStream<'static, Result<Sse, SseError>> {
        let ceilings = self.inner.ceilings.clone();
        let bytes = StreamBody {
            body: Some(answer.response.into_body()),
            connection: answer.reusable,
            client: self.clone(),
        };
        SseStream::from_bytes_stream(bounded_events(bytes, ceilings)).boxed()
    }

    /// What every non-success status means, whatever the method.
    fn refusal(&self, response: &Response<Incoming>) -> Option<Failure> {
        let status = response.status();
        if status.is_redirection() {
            return Some(StreamableHttpError::Client(HttpError::Redirect));
        }
        if status == StatusCode::UNAUTHORIZED {
            // The challenge is the server's text: kept only for the
            // client's look for a resource-metadata (user-delegated) flow.
            let challenge = response
                .headers()
                .get(hyper::header::WWW_AUTHENTICATE)
                .and_then(|value| value.to_str().ok())
                .unwrap_or_default()
                .chars()
                .take(1024)
                .collect();
            return Some(StreamableHttpError::AuthRequired(AuthRequiredError::new(
                challenge,
            )));
        }
        None
    }
}

/// An event stream's body, and the connection it came on. Read to its end,
/// the connection is kept for the next request, as after a body read whole.
/// Dropped before its end (rmcp stops reading a call's stream once its
/// answer is in), the rest is read in the background, within
/// [`STREAM_DRAIN`] and [`MAXIMUM_ERROR_BODY`], and the connection kept if
/// it ends: otherwise a server that answers every call with a stream would
/// be dialled again for each. A body that fails is never kept.
struct StreamBody {
    body: Option<Incoming>,
    connection: Option<Idle>,
    client: EgressClient,
}

impl futures::Stream for StreamBody {
    type Item = Result<Bytes, HttpError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let this = &mut *self;
        let Some(body) = this.body.as_mut() else {
            return Poll::Ready(None);
        };
        loop {
            match std::task::ready!(std::pin::Pin::new(&mut *body).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        return Poll::Ready(Some(Ok(data)));
                    }
                }
                Some(Err(_)) => {
                    this.body = None;
                    this.connection = None;
                    return Poll::Ready(Some(Err(HttpError::Connection)));
                }
                None => {
                    this.body = None;
                    if let Some(connection) = this.connection.take() {
                        this.client.put_idle(connection);
                    }
                    return Poll::Ready(None);
                }
            }
        }
    }
}

impl Drop for StreamBody {
    fn drop(&mut self) {
        let (Some(body), Some(connection)) = (self.body.take(), self.connection.take()) else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let client = self.client.clone();
        runtime.spawn(async move {
            let rest = read_within(body, MAXIMUM_ERROR_BODY);
            if let Ok(Ok(_)) = tokio::time::timeout(STREAM_DRAIN, rest).await {
                client.put_idle(connection);
            }
        });
    }
}

/// `host[:port]` as a `Host` header (IPv6 bracketed).
fn host_header(url: &EgressUrl) -> Result<HeaderValue, HttpError> {
    HeaderValue::from_str(&host_of(url)).map_err(|_| HttpError::Request)
}

/// Ends an SSE byte stream with [`HttpError::TooLarge`] as soon as one event
/// (the bytes since the last blank line) passes the ceiling in flight, so a
/// server cannot make the parser buffer without bound.
fn bounded_events<S>(
    bytes: S,
    ceilings: Arc<Ceilings>,
) -> impl futures::Stream<Item = Result<Bytes, HttpError>> + Send + 'static
where
    S: futures::Stream<Item = Result<Bytes, HttpError>> + Send + 'static,
{
    struct Scan {
        in_event: usize,
        line_empty: bool,
        ended: bool,
        /// The event's bytes so far, as the chunks they came in (shared,
        /// not copied): an event that crosses the ceiling keeps its head.
        event: Vec<Bytes>,
    }
    let state = Scan {
        in_event: 0,
        line_empty: true,
        ended: false,
        event: Vec::new(),
    };
    bytes.scan(state, move |state, chunk| {
        if state.ended {
            return futures::future::ready(None);
        }
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(error) => {
                state.ended = true;
                return futures::future::ready(Some(Err(error)));
            }
        };
        let ceiling = ceilings.current();
        // Where the event in progress starts within this chunk.
        let mut event_start = 0;
        for (at, byte) in chunk.iter().enumerate() {
            match byte {
                b'\n' => {
                    if state.line_empty {
                        state.in_event = 0;
                        state.event.clear();
                        event_start = at + 1;
                    }
                    state.line_empty = true;
                }
                b'\r' => {}
                _ => state.line_empty = false,
            }
            state.in_event += 1;
            if state.in_event > ceiling {
                state.ended = true;
                let mut head: Vec<u8> = state.event.iter().flatten().copied().collect();
                head.extend_from_slice(&chunk[event_start..at]);
                ceilings.mark_oversized_with(head);
                return futures::future::ready(Some(Err(HttpError::TooLarge)));
            }
        }
        state.event.push(chunk.slice(event_start..));
        futures::future::ready(Some(Ok(chunk)))
    })
}

/// Why a body was not read whole.
enum Bounded {
    /// It crossed the limit: what it held up to it.
    Over(Vec<u8>),
    /// The connection failed under it.
    Failed,
}

/// A body read whole, never holding more than `limit` bytes.
async fn read_within(mut body: Incoming, limit: usize) -> Result<Bytes, Bounded> {
    let mut read: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|_| Bounded::Failed)?.into_data() else {
            continue;
        };
        if read.len() + data.len() > limit {
            let room = limit.saturating_sub(read.len());
            read.extend_from_slice(&data[..room.min(data.len())]);
            return Err(Bounded::Over(read));
        }
        read.extend_from_slice(&data);
    }
    Ok(Bytes::from(read))
}

fn protocol_headers(
    session_id: Option<&str>,
    custom_headers: HashMap<HeaderName, HeaderValue>,
) -> Result<Vec<(HeaderName, HeaderValue)>, Failure> {
    let mut headers: Vec<(HeaderName, HeaderValue)> = custom_headers.into_iter().collect();
    if let Some(session_id) = session_id {
        headers.push((
            HeaderName::from_static(SESSION_ID),
            HeaderValue::from_str(session_id)
                .map_err(|_| StreamableHttpError::Client(HttpError::Request))?,
        ));
    }
    Ok(headers)
}

fn content_type(response: &Response<Incoming>) -> String {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase()
}

fn session_of(response: &Response<Incoming>) -> Option<String> {
    response
        .headers()
        .get(HEADER_SESSION_ID)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
}

/// The request a JSON-RPC answer answers, if it is an answer.
fn answer_id(answer: &ServerJsonRpcMessage) -> Option<&RequestId> {
    match answer {
        ServerJsonRpcMessage::Response(response) => Some(&response.id),
        ServerJsonRpcMessage::Error(error) => error.id.as_ref(),
        _ => None,
    }
}

impl StreamableHttpClient for EgressClient {
    type Error = HttpError;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, Failure> {
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            StreamableHttpResponseLimits::default(),
        )
        .await
    }

    // rmcp's own limits are replaced by the ceiling in flight; its auth
    // header is never set (the authenticator writes the credential).
    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        _limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, Failure> {
        let body = serde_json::to_vec(&message)?;
        let request_id = match &message {
            ClientJsonRpcMessage::Request(request) => Some(request.id.clone()),
            _ => None,
        };
        let mut headers = protocol_headers(session_id.as_deref(), custom_headers)?;
        headers.push((CONTENT_TYPE, HeaderValue::from_static(JSON_MIME_TYPE)));
        headers.push((
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        ));
        let answer = self
            .send(&uri, Method::POST, headers, Bytes::from(body))
            .await
            .map_err(StreamableHttpError::Client)?;
        if let Some(refusal) = self.refusal(&answer.response) {
            return Err(refusal);
        }
        let status = answer.response.status();
        let session = session_of(&answer.response);
        if status == StatusCode::NOT_FOUND && session_id.is_some() {
            return Err(StreamableHttpError::SessionExpired);
        }
        if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
            self.read_body(answer, Body::Other)
                .await
                .map_err(StreamableHttpError::Client)?;
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        let kind = content_type(&answer.response);
        if status.is_success() && kind.starts_with(EVENT_STREAM_MIME_TYPE) {
            return Ok(StreamableHttpPostResponse::Sse(
                self.events(answer),
                session,
            ));
        }
        let empty = answer
            .response
            .headers()
            .get(CONTENT_LENGTH)
            .is_some_and(|length| length == "0");
        if status.is_success() && empty {
            self.read_body(answer, Body::Other)
                .await
                .map_err(StreamableHttpError::Client)?;
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        let json = kind.starts_with(JSON_MIME_TYPE);
        let body = if status.is_success() {
            Body::Answer
        } else {
            Body::Other
        };
        let bytes = self
            .read_body(answer, body)
            .await
            .map_err(StreamableHttpError::Client)?;
        if !json {
            return Err(StreamableHttpError::UnexpectedContentType(None));
        }
        match serde_json::from_slice::<ServerJsonRpcMessage>(&bytes) {
            // A body that answers another request (or none) would leave this
            // one waiting out its timeout: it fails now, as what it is.
            Ok(answer) if request_id.is_some() && answer_id(&answer) != request_id.as_ref() => Err(
                StreamableHttpError::UnexpectedServerResponse(if status.is_success() {
                    "an answer to another request".into()
                } else {
                    format!("HTTP {}", status.as_u16()).into()
                }),
            ),
            Ok(message) => Ok(StreamableHttpPostResponse::Json(message, session)),
            // A failure status whose body is no JSON-RPC message says only
            // its status; the body is the server's text.
            Err(_) if !status.is_success() => Err(StreamableHttpError::UnexpectedServerResponse(
                format!("HTTP {}", status.as_u16()).into(),
            )),
            Err(error) => Err(StreamableHttpError::Deserialize(error)),
        }
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Failure> {
        let headers = protocol_headers(Some(&session_id), custom_headers)?;
        let answer = self
            .send(&uri, Method::DELETE, headers, Bytes::new())
            .await
            .map_err(StreamableHttpError::Client)?;
        if let Some(refusal) = self.refusal(&answer.response) {
            return Err(refusal);
        }
        let status = answer.response.status();
        self.read_body(answer, Body::Other)
            .await
            .map_err(StreamableHttpError::Client)?;
        if status.is_success() || status == StatusCode::METHOD_NOT_ALLOWED {
            Ok(())
        } else {
            Err(StreamableHttpError::UnexpectedServerResponse(
                format!("HTTP {}", status.as_u16()).into(),
            ))
        }
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, Failure> {
        // A stream ended by an event past the ceiling is not resumed: the
        // server would send the same event again. rmcp stops reconnecting
        // on this error at once, and the call ends as output too large
        // instead of waiting out its deadline.
        if self.inner.ceilings.oversized() {
            return Err(StreamableHttpError::ServerDoesNotSupportSse);
        }
        let mut headers = protocol_headers(session_id.as_deref(), custom_headers)?;
        headers.push((ACCEPT, HeaderValue::from_static(EVENT_STREAM_MIME_TYPE)));
        if let Some(last_event_id) = last_event_id {
            headers.push((
                HeaderName::from_static(LAST_EVENT_ID),
                HeaderValue::from_str(&last_event_id)
                    .map_err(|_| StreamableHttpError::Client(HttpError::Request))?,
            ));
        }
        let answer = self
            .send(&uri, Method::GET, headers, Bytes::new())
            .await
            .map_err(StreamableHttpError::Client)?;
        if let Some(refusal) = self.refusal(&answer.response) {
            return Err(refusal);
        }
        let status = answer.response.status();
        if status == StatusCode::METHOD_NOT_ALLOWED {
            return Err(StreamableHttpError::ServerDoesNotSupportSse);
        }
        if status == StatusCode::NOT_FOUND && session_id.is_some() {
            return Err(StreamableHttpError::SessionExpired);
        }
        if !status.is_success()
            || !content_type(&answer.response).starts_with(EVENT_STREAM_MIME_TYPE)
        {
            return Err(StreamableHttpError::UnexpectedServerResponse(
                format!("HTTP {}", status.as_u16()).into(),
            ));
        }
        Ok(self.events(answer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn collect(chunks: Vec<Bytes>) -> Vec<Result<usize, String>> {
        // A zero hard ceiling leaves the envelope allowance, 64 KiB.
        let stream = futures::stream::iter(chunks.into_iter().map(Ok::<_, HttpError>));
        bounded_events(stream, Ceilings::new(0))
            .map(|item| item.map(|bytes| bytes.len()).map_err(|e| e.to_string()))
            .collect::<Vec<_>>()
            .await
    }

    #[tokio::test]
    async fn an_sse_event_past_the_ceiling_ends_the_stream_and_a_blank_line_resets_the_count() {
        let big = Bytes::from(vec![b'x'; (64 << 10) - 16]);
        let data = || Bytes::from_static(b"data: ");
        // Two events each under the ceiling, separated by a blank line.
        let fine = collect(vec![
            data(),
            big.clone(),
            Bytes::from_static(b"\n\n"),
            data(),
            big.clone(),
            Bytes::from_static(b"\r\n\r\n"),
        ])
        .await;
        assert!(fine.iter().all(Result::is_ok), "{fine:?}");
        // One event whose data continues past the ceiling, across chunks.
        let over = collect(vec![
            data(),
            big.clone(),
            Bytes::from_static(b"\n"),
            data(),
            big,
            Bytes::from_static(b"\n\n"),
        ])
        .await;
        assert!(over.last().is_some_and(Result::is_err), "{over:?}");
        assert_eq!(over.iter().filter(|item| item.is_err()).count(), 1);
    }

    #[test]
    fn host_headers_bracket_ipv6_and_omit_default_ports() {
        let header = |url: &str| {
            host_header(&EgressUrl::parse(url).expect("url"))
                .expect("header")
                .to_str()
                .expect("ascii")
                .to_owned()
        };
        assert_eq!(header("https://mcp.example.com/x"), "mcp.example.com");
        assert_eq!(header("http://127.0.0.1:8080/mcp"), "127.0.0.1:8080");
        assert_eq!(header("https://[::1]:9443/"), "[::1]:9443");
        assert_eq!(header("http://example.com:80/"), "example.com");
    }
}
