//! The control API's own client: how the operator commands (`toolgate
//! invocations`, `approvals`, `review`) reach a running sidecar, over its
//! unix socket. One request per connection; the answer is JSON.

use std::path::Path;

use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Bytes;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::UnixStream;

/// An answer larger than this is refused rather than buffered.
const MAXIMUM_ANSWER_BYTES: usize = 64 << 20;
/// A sidecar that accepts and then says nothing does not hold a command.
const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing listens on the socket (or it may not be opened).
    #[error("cannot reach the control API at {socket}: {reason}")]
    Unreachable { socket: String, reason: String },
    /// The connection broke, or the answer was not HTTP.
    #[error("the control API broke off: {0}")]
    Exchange(String),
    /// The answer was not a JSON document.
    #[error("the control API's answer is not JSON")]
    NotJson,
    /// No whole answer within the time allowed.
    #[error("the control API did not answer within {} s", ANSWER_TIMEOUT.as_secs())]
    TimedOut,
}

/// The status and JSON body of one answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

impl Answer {
    /// The `{"error": {"code", "message"}}` of a refusal, as one line.
    pub fn refusal(&self) -> String {
        let error = &self.body["error"];
        match (error["code"].as_str(), error["message"].as_str()) {
            (Some(code), Some(message)) => format!("{} {code}: {message}", self.status),
            _ => format!("{} without an error body", self.status),
        }
    }
}

/// Sends one request to the control API at `socket`. `target` is the path
/// and query, already encoded (see [`encode`]).
pub async fn send(
    socket: &Path,
    method: Method,
    target: &str,
    body: Option<&Value>,
) -> Result<Answer, ClientError> {
    tokio::time::timeout(ANSWER_TIMEOUT, exchange(socket, method, target, body))
        .await
        .map_err(|_| ClientError::TimedOut)?
}

async fn exchange(
    socket: &Path,
    method: Method,
    target: &str,
    body: Option<&Value>,
) -> Result<Answer, ClientError> {
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|error| ClientError::Unreachable {
            socket: socket.display().to_string(),
            reason: error.kind().to_string(),
        })?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|error| ClientError::Exchange(error.to_string()))?;
    let driver = tokio::spawn(connection);
    let bytes = body.map(Value::to_string).unwrap_or_default();
    let mut request = Request::builder()
        .method(method)
        .uri(target)
        .header(HOST, "toolgate");
    if body.is_some() {
        request = request.header(CONTENT_TYPE, "application/json");
    }
    let request = request
        .body(Full::new(Bytes::from(bytes)))
        .map_err(|error| ClientError::Exchange(error.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|error| ClientError::Exchange(error.to_string()))?;
    let status = response.status().as_u16();
    let collected = Limited::new(response.into_body(), MAXIMUM_ANSWER_BYTES)
        .collect()
        .await
        .map_err(|error| ClientError::Exchange(error.to_string()))?;
    driver.abort();
    let body = serde_json::from_slice(&collected.to_bytes()).map_err(|_| ClientError::NotJson)?;
    Ok(Answer { status, body })
}

/// Percent-encodes a path segment or query value: everything but the
/// unreserved characters of RFC 3986.
pub fn encode(component: &str) -> String {
    let mut encoded = String::with_capacity(component.len());
    for byte in component.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_leaves_only_unreserved_characters() {
        assert_eq!(encode("acme-1.x_y~z"), "acme-1.x_y~z");
        assert_eq!(encode("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
    }

    #[test]
    fn a_refusal_reads_as_one_line() {
        let answer = Answer {
            status: 409,
            body: serde_json::json!({"error": {"code": "not_pending", "message": "no pending approval has this id"}}),
        };
        assert_eq!(
            answer.refusal(),
            "409 not_pending: no pending approval has this id"
        );
    }
}
