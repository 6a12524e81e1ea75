//! The HTTP plumbing of toolgate's two edges (the turns' sockets here, and
//! the control API, which shares it): replies in the one error shape,
//! strictly parsed bodies of bounded size, and the tracker that lets a drain
//! wait for every request in flight on either edge.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Request, Response, StatusCode};
use serde_json::{Value, json};

/// A response of either edge.
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

/// The one error shape: `{"error": {"code", "message"}}`.
pub fn error_body(code: &str, message: &str) -> Value {
    json!({"error": {"code": code, "message": message}})
}

/// An error reply in the one shape.
pub fn error(status: StatusCode, code: &str, message: &str) -> Reply {
    reply(status, &error_body(code, message))
}

/// Why a body was refused.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// Longer than the limit.
    #[error("the body is over the limit")]
    TooLarge,
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
            BodyError::Invalid(message) => {
                error(StatusCode::BAD_REQUEST, "invalid_request", message)
            }
        }
    }
}

/// Reads a body of at most `limit` bytes and parses it strictly.
pub async fn json_body<T: serde::de::DeserializeOwned>(
    request: Request<Incoming>,
    limit: usize,
) -> Result<T, BodyError> {
    let collected = Limited::new(request.into_body(), limit)
        .collect()
        .await
        .map_err(|_| BodyError::TooLarge)?;
    parse(&collected.to_bytes()).map_err(BodyError::Invalid)
}

/// Parses a body strictly. The message names where parsing failed and what
/// kind of failure it was, never a value from the body.
pub fn parse<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let parsed: Result<T, _> = serde_path_to_error::deserialize(&mut deserializer);
    let value = parsed.map_err(|error| {
        let path = error.path().to_string();
        // An unknown key is the caller's text: the message names where it
        // was, not what it was.
        let segments: Vec<String> = error.path().iter().map(ToString::to_string).collect();
        let parent = match segments.split_last() {
            Some((_, parents)) if !parents.is_empty() => parents.join("."),
            _ => ".".to_owned(),
        };
        let inner = error.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data => {
                let text = inner.to_string();
                if text.starts_with("unknown field") {
                    format!("unknown field in {parent}")
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

/// The requests in flight on both edges, and whether toolgate is draining.
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
        struct Guard(Arc<InFlight>);
        impl Drop for Guard {
            fn drop(&mut self) {
                if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
                    self.0.idle.notify_waiters();
                }
            }
        }
        self.count.fetch_add(1, Ordering::SeqCst);
        let guard = Guard(self.clone());
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
