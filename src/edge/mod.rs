//! The HTTP plumbing every listener shares (the turns' sockets, the control
//! API, the MCP front door, the operations listener): replies in the one
//! error shape, strictly parsed bodies of bounded size, connection caps and
//! deadlines, bearer tokens compared in constant time, and the tracker that
//! lets a drain wait for every request in flight on any edge.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, LengthLimitError, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// A response of any edge.
pub type Reply = Response<UnsyncBoxBody<Bytes, Infallible>>;

/// A JSON reply.
pub fn reply(status: StatusCode, body: &Value) -> Reply {
    reply_text(status, body.to_string())
}

/// A reply whose JSON text is already written.
pub fn reply_text(status: StatusCode, body: String) -> Reply {
    let mut response = Response::new(Full::new(Bytes::from(body)).boxed_unsync());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// An artifact's bytes as a streamed reply, with its media type, size and
/// trust label. A read that fails midway ends the body short of its
/// declared length, which the client sees as an error.
pub fn artifact_reply(open: crate::pipeline::artifacts::OpenArtifact) -> Reply {
    use tokio::io::AsyncReadExt as _;
    let crate::pipeline::artifacts::OpenArtifact { artifact, reader } = open;
    let chunks = futures::stream::unfold(Some(reader), |reader| async move {
        let mut reader = reader?;
        let mut buffer = vec![0u8; 64 << 10];
        match reader.read(&mut buffer).await {
            Ok(0) | Err(_) => None,
            Ok(read) => {
                buffer.truncate(read);
                Some((
                    Ok::<_, Infallible>(hyper::body::Frame::data(Bytes::from(buffer))),
                    Some(reader),
                ))
            }
        }
    });
    let mut response = Response::new(http_body_util::StreamBody::new(chunks).boxed_unsync());
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&artifact.media_type) {
        headers.insert(CONTENT_TYPE, value);
    }
    headers.insert(
        hyper::header::CONTENT_LENGTH,
        HeaderValue::from(artifact.bytes),
    );
    headers.insert(
        "Toolgate-Trust",
        HeaderValue::from_static(artifact.trust.as_str()),
    );
    response
}

/// The one error shape: `{"error": {"code", "message"}}`.
pub fn error_body(code: &str, message: &str) -> Value {
    json!({"error": {"code": code, "message": message}})
}

/// An error reply in the one shape.
pub fn error(status: StatusCode, code: &str, message: &str) -> Reply {
    reply(status, &error_body(code, message))
}

/// The deadlines and caps of one edge's connections.
#[derive(Debug, Clone, Copy)]
pub struct EdgeLimits {
    /// Largest request body accepted.
    pub body_limit: usize,
    /// A request head must arrive within this, counted from when the
    /// connection waits for one: it also ends an idle kept-alive connection.
    pub header_timeout: Duration,
    /// A request body must arrive within this once its head has.
    pub body_timeout: Duration,
}

impl Default for EdgeLimits {
    fn default() -> Self {
        EdgeLimits {
            body_limit: 1 << 20,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
        }
    }
}

/// Connections an edge holds at once; one more is closed as soon as it is
/// accepted, so half-sent requests cannot exhaust the process's descriptors.
#[derive(Debug, Clone)]
pub struct ConnectionCap(Arc<Semaphore>);

impl ConnectionCap {
    /// At most `maximum` at once.
    pub fn new(maximum: usize) -> Self {
        ConnectionCap(Arc::new(Semaphore::new(maximum.max(1))))
    }

    /// A place for one more connection, if there is one.
    pub fn admit(&self) -> Option<OwnedSemaphorePermit> {
        self.0.clone().try_acquire_owned().ok()
    }
}

/// A reply's body holding `guard` until the body is written and dropped
/// (what a connection counts as its request in progress). Its size is the
/// body's, so a reply keeps its `Content-Length`.
pub struct GuardedBody<G> {
    body: UnsyncBoxBody<Bytes, Infallible>,
    _guard: G,
}

impl<G: Send + Unpin + 'static> GuardedBody<G> {
    /// `reply` with its body holding `guard`.
    pub fn around(reply: Reply, guard: G) -> Reply {
        reply.map(|body| {
            GuardedBody {
                body,
                _guard: guard,
            }
            .boxed_unsync()
        })
    }
}

impl<G: Unpin> hyper::body::Body for GuardedBody<G> {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        std::pin::Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// The pause after a failed accept.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// A listener connections are accepted from: TCP or a unix socket.
pub trait Listener: Send + 'static {
    /// A connection.
    type Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static;
    /// The next connection.
    fn next(&self) -> impl Future<Output = std::io::Result<Self::Stream>> + Send;
}

impl Listener for tokio::net::TcpListener {
    type Stream = tokio::net::TcpStream;
    async fn next(&self) -> std::io::Result<Self::Stream> {
        let (stream, _) = self.accept().await?;
        // Answers are small and written whole: no waiting to coalesce them.
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }
}

impl Listener for tokio::net::UnixListener {
    type Stream = tokio::net::UnixStream;
    async fn next(&self) -> std::io::Result<Self::Stream> {
        Ok(self.accept().await?.0)
    }
}

/// Every listener's accept loop: takes connections from `listener` until
/// `shutdown` fires and hands each to `serve` (which admits it under its
/// caps, or drops it, closing it). A failed accept (out of descriptors,
/// most likely) is logged as `name`'s and backed off from rather than spun
/// on.
pub async fn accept_until<L: Listener>(
    listener: L,
    name: &'static str,
    shutdown: CancellationToken,
    mut serve: impl FnMut(L::Stream),
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.next() => match accepted {
                Ok(stream) => serve(stream),
                Err(error) => {
                    tracing::warn!(listener = name, error = %error, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
        }
    }
}

/// Serves one connection under the header deadline (which also closes it
/// when idle), holding `permits` until it ends.
pub async fn serve_connection<S, F, R>(
    stream: S,
    header_timeout: Duration,
    permits: Vec<OwnedSemaphorePermit>,
    handler: F,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    F: Fn(Request<Incoming>) -> R + Send + Sync + 'static,
    R: Future<Output = Reply> + Send + 'static,
{
    serve_connection_until(
        stream,
        header_timeout,
        permits,
        CancellationToken::new(),
        handler,
    )
    .await;
}

/// As [`serve_connection`], and when `close` fires the connection ends: at
/// once when it has not yet been given a whole request head (an idle or
/// half-sent first request: hyper's graceful close would wait for its head
/// until the deadline), else once the response in progress, if any, is
/// written.
pub async fn serve_connection_until<S, F, R>(
    stream: S,
    header_timeout: Duration,
    permits: Vec<OwnedSemaphorePermit>,
    close: CancellationToken,
    handler: F,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    F: Fn(Request<Incoming>) -> R + Send + Sync + 'static,
    R: Future<Output = Reply> + Send + 'static,
{
    let handler = Arc::new(handler);
    let dispatched = Arc::new(AtomicBool::new(false));
    let service = {
        let dispatched = dispatched.clone();
        hyper::service::service_fn(move |request| {
            dispatched.store(true, Ordering::Release);
            let handler = handler.clone();
            async move { Ok::<_, Infallible>(handler(request).await) }
        })
    };
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        _ = close.cancelled() => {
            if dispatched.load(Ordering::Acquire) {
                connection.as_mut().graceful_shutdown();
                let _ = connection.await;
            }
        }
    }
    drop(permits);
}

/// Compares two byte strings in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The bearer token of a request: the scheme matched case-insensitively
/// (RFC 6750), the token after it.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim_start_matches(' ');
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Why a body was refused.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// Longer than the limit.
    #[error("the body is over the limit")]
    TooLarge,
    /// Not all of it arrived within the body deadline.
    #[error("the body did not arrive in time")]
    TimedOut,
    /// The connection broke or the framing was malformed.
    #[error("the body could not be read")]
    Broken,
    /// Not the expected JSON; the message names where, never a value.
    #[error("{0}")]
    Invalid(String),
}

impl BodyError {
    /// The error reply for it.
    pub fn reply(&self) -> Reply {
        match self {
            BodyError::TooLarge => error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                "the body is over the limit",
            ),
            BodyError::TimedOut => error(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                "the body did not arrive in time",
            ),
            BodyError::Broken => error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "the body could not be read",
            ),
            BodyError::Invalid(message) => {
                error(StatusCode::BAD_REQUEST, "invalid_request", message)
            }
        }
    }
}

/// Reads a body within the edge's size limit and body deadline, and parses
/// it strictly.
pub async fn json_body<T: serde::de::DeserializeOwned>(
    request: Request<Incoming>,
    limits: &EdgeLimits,
) -> Result<T, BodyError> {
    let bytes = body_bytes(request.into_body(), limits).await?;
    parse(&bytes).map_err(BodyError::Invalid)
}

/// Reads a body within the edge's size limit and body deadline.
pub async fn body_bytes(body: Incoming, limits: &EdgeLimits) -> Result<Bytes, BodyError> {
    let collecting = Limited::new(body, limits.body_limit).collect();
    let collected = tokio::time::timeout(limits.body_timeout, collecting)
        .await
        .map_err(|_| BodyError::TimedOut)?
        .map_err(|failure| {
            if failure.downcast_ref::<LengthLimitError>().is_some() {
                BodyError::TooLarge
            } else {
                BodyError::Broken
            }
        })?;
    Ok(collected.to_bytes())
}

/// Finds an integer literal outside what JSON numbers carry exactly here
/// (i64 and u64): serde_json would silently make it a float. Returns the
/// byte offset of the first one.
fn inexact_integer(bytes: &[u8]) -> Option<usize> {
    let mut index = 0;
    let mut in_string = false;
    while let Some(&byte) = bytes.get(index) {
        if in_string {
            match byte {
                b'\\' => index += 1,
                b'"' => in_string = false,
                _ => {}
            }
            index += 1;
            continue;
        }
        match byte {
            b'"' => {
                in_string = true;
                index += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = index;
                index += 1;
                while bytes.get(index).is_some_and(|b| {
                    b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-')
                }) {
                    index += 1;
                }
                let token = &bytes[start..index];
                let integer = !token.iter().any(|b| matches!(b, b'.' | b'e' | b'E'));
                if integer {
                    let text = std::str::from_utf8(token).unwrap_or_default();
                    if text.parse::<i64>().is_err() && text.parse::<u64>().is_err() {
                        return Some(start);
                    }
                }
            }
            _ => index += 1,
        }
    }
    None
}

/// Parses a body strictly. The message names where parsing failed and what
/// kind of failure it was, never a value from the body.
pub fn parse<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    if inexact_integer(bytes).is_some() {
        // Only refused once the text is known to be JSON at all, so the
        // message for a broken body stays the same.
        if serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok() {
            return Err("an integer is beyond what a JSON number carries exactly".to_owned());
        }
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let parsed: Result<T, _> = serde_path_to_error::deserialize(&mut deserializer);
    let value = parsed.map_err(|error| {
        let path = error.path().to_string();
        // An unknown key is the caller's text: the message names where it
        // was, not what it was.
        let segments: Vec<String> = error.path().iter().map(ToString::to_string).collect();
        let parent = match segments.split_last() {
            Some((_, parents)) if !parents.is_empty() => parents.join("."),
            _ => "the body".to_owned(),
        };
        let inner = error.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data => {
                let text = inner.to_string();
                if text.starts_with("unknown field") {
                    unknown_field(&text, &parent)
                } else if text.starts_with("missing field") {
                    let field = text.split('`').nth(1).unwrap_or("?");
                    format!("missing field {field} at {path}")
                } else {
                    format!("wrong type or value at {path}")
                }
            }
            _ => "the body is not valid JSON".to_owned(),
        }
    })?;
    deserializer
        .end()
        .map_err(|_| "trailing bytes after the JSON body".to_owned())?;
    Ok(value)
}

/// serde's `unknown field `key`, expected one of `a`, `b`` as the caller
/// reads it: the key is named only when it reads as a field name (lower
/// case letters and underscores: never a token or a secret pasted in the
/// wrong place), with where it was and the fields that are taken there.
fn unknown_field(serde_message: &str, parent: &str) -> String {
    // serde_json ends its messages with the position.
    let serde_message = serde_message
        .rsplit_once(" at line ")
        .map_or(serde_message, |(message, _)| message);
    let key = serde_message.split('`').nth(1).filter(|key| {
        (1..=64).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
    });
    let expected = serde_message
        .split_once(", expected ")
        .map(|(_, expected)| expected)
        .filter(|expected| {
            // The schema's own names, each in backquotes.
            expected
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"`_, ".contains(&b))
        });
    let named = match key {
        Some(key) => format!("unknown field `{key}` in {parent}"),
        None => format!("unknown field in {parent}"),
    };
    match expected {
        Some(expected) => format!("{named}; expected {expected}"),
        None => named,
    }
}

/// The requests in flight on every edge, and whether toolgate is draining.
#[derive(Default)]
pub struct InFlight {
    count: AtomicU64,
    idle: tokio::sync::Notify,
    draining: AtomicBool,
}

impl InFlight {
    /// Whether a drain has begun: no new work is taken.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Requests being served.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// Runs one request's work to its end on a task of its own: a client
    /// that goes away must not cancel a call halfway through the pipeline
    /// (its row would stay RUNNING under a live lease). The count is kept by
    /// a guard, so it drops however the work ends.
    pub async fn track(
        self: &Arc<Self>,
        work: impl Future<Output = Reply> + Send + 'static,
    ) -> Reply {
        let guard = self.enter();
        let task = tokio::spawn(async move {
            let reply = work.await;
            drop(guard);
            reply
        });
        task.await.unwrap_or_else(|_| {
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the request did not complete",
            )
        })
    }

    /// Counts one piece of work in flight until the guard drops.
    pub fn enter(self: &Arc<Self>) -> InFlightGuard {
        self.count.fetch_add(1, Ordering::SeqCst);
        InFlightGuard(self.clone())
    }

    /// Stops taking new work and waits, up to `timeout`, for the requests
    /// in flight.
    pub async fn drain(&self, timeout: Duration) {
        self.draining.store(true, Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Registered before the count is read, so the last request's
            // notification cannot fall between the two.
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.count() == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                return;
            }
        }
    }
}

/// One piece of work in flight; dropping it ends it.
pub struct InFlightGuard(Arc<InFlight>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_beyond_i64_and_u64_are_found_outside_strings() {
        for exact in [
            r#"{"n": 18446744073709551615}"#,
            r#"{"n": -9223372036854775808}"#,
            r#"{"n": 1e300, "f": 1.5, "s": "18446744073709551616"}"#,
            r#"{"escaped": "\\" , "n": 3}"#,
        ] {
            assert_eq!(inexact_integer(exact.as_bytes()), None, "{exact}");
        }
        for inexact in [
            r#"{"n": 18446744073709551616}"#,
            r#"{"n": -9223372036854775809}"#,
            r#"[1, 2, 99999999999999999999999]"#,
            r#"{"s": "a\"b", "n": 100000000000000000000}"#,
        ] {
            assert!(inexact_integer(inexact.as_bytes()).is_some(), "{inexact}");
            assert!(parse::<Value>(inexact.as_bytes()).is_err(), "{inexact}");
        }
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Turn {
        session_id: String,
        step_number: i64,
        principal: Option<Principal>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Principal {
        id: String,
    }

    #[test]
    fn an_unknown_field_is_named_with_where_it_was_and_what_is_taken_there() {
        let refused = |body: &str| parse::<Turn>(body.as_bytes()).unwrap_err();
        assert_eq!(
            refused(r#"{"session_id": "s", "step_number": 1, "step": 2}"#),
            "unknown field `step` in the body; expected one of `session_id`, `step_number`, \
             `principal`"
        );
        assert_eq!(
            refused(
                r#"{"session_id": "s", "step_number": 1, "principal": {"id": "p", "scope": 1}}"#
            ),
            "unknown field `scope` in principal; expected `id`"
        );
        // What does not read as a field name is the caller's text, not named.
        for key in ["sk-live-4242", "Bearer", "a1", "x y", "é"] {
            let message = refused(&format!(
                r#"{{"session_id": "s", "step_number": 1, "{key}": 1}}"#
            ));
            assert!(
                message.starts_with("unknown field in the body; expected"),
                "{message}"
            );
            assert!(!message.contains(key), "{message}");
        }
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        let mut headers = HeaderMap::new();
        for (value, expected) in [
            ("Bearer abc", Some("abc")),
            ("bearer abc", Some("abc")),
            ("BEARER   abc", Some("abc")),
            ("Basic abc", None),
            ("Bearer", None),
            ("Bearer ", None),
            ("Bearerabc", None),
        ] {
            headers.insert(AUTHORIZATION, HeaderValue::from_static(value));
            assert_eq!(bearer_token(&headers), expected, "{value}");
        }
    }
}
