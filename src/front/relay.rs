//! `toolgate stdio`: the front door for clients that only spawn stdio
//! servers. Each JSON-RPC line read on standard input is POSTed to a
//! running toolgate's front door; each message it answers (a JSON body, or
//! the events of an SSE one) is one line on standard output. Requests run
//! concurrently, so a long call never holds up a ping or a cancellation.
//! The credential is read from a file, never from the command line.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;

/// The longest line read from the client.
const MAXIMUM_LINE_BYTES: usize = 4 << 20;
/// The longest answer read from toolgate.
const MAXIMUM_ANSWER_BYTES: usize = 64 << 20;
/// How long connecting to toolgate may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the front door is.
#[derive(Debug, Clone)]
pub enum Endpoint {
    /// `http://host:port/path`.
    Tcp {
        /// `host:port`, as dialled and sent as `Host`.
        authority: String,
        /// The endpoint's path.
        path: String,
    },
    /// `unix:/path/to/front.sock`.
    Unix(PathBuf),
}

/// Why the relay could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The URL is neither `http://host:port/path` nor `unix:/path`.
    #[error("--url must be http://host:port/mcp or unix:/path/to/front.sock")]
    Url,
    /// The token file could not be read or is empty.
    #[error("--token-file could not be read, or holds no token")]
    Token,
    /// Standard input or output failed.
    #[error("standard input or output failed: {0}")]
    Io(std::io::ErrorKind),
}

impl Endpoint {
    /// Parses `--url`.
    pub fn parse(url: &str) -> Result<Endpoint, RelayError> {
        if let Some(path) = url.strip_prefix("unix:") {
            return if path.is_empty() {
                Err(RelayError::Url)
            } else {
                Ok(Endpoint::Unix(PathBuf::from(path)))
            };
        }
        let rest = url.strip_prefix("http://").ok_or(RelayError::Url)?;
        let (authority, path) = rest
            .find('/')
            .map_or((rest, "/mcp"), |at| rest.split_at(at));
        if authority.is_empty() || authority.parse::<hyper::http::uri::Authority>().is_err() {
            return Err(RelayError::Url);
        }
        Ok(Endpoint::Tcp {
            authority: authority.to_owned(),
            path: path.to_owned(),
        })
    }
}

/// What every request carries once the session is open.
#[derive(Default)]
struct Session {
    id: Option<String>,
    protocol_version: Option<String>,
    /// The client's `initialize`, replayed when toolgate no longer knows
    /// the session (it ended, or idled out).
    initialize: Option<Value>,
}

struct Relay {
    endpoint: Endpoint,
    token: String,
    session: Mutex<Session>,
    out: mpsc::UnboundedSender<String>,
}

/// Reads the token file: its first line, trimmed.
pub fn read_token(path: &std::path::Path) -> Result<String, RelayError> {
    let text = std::fs::read_to_string(path).map_err(|_| RelayError::Token)?;
    let token = text.lines().next().unwrap_or_default().trim().to_owned();
    if token.is_empty() {
        return Err(RelayError::Token);
    }
    Ok(token)
}

/// Relays standard input to the front door and its answers to standard
/// output until standard input ends; the session is then ended.
pub async fn run(endpoint: Endpoint, token: String) -> Result<(), RelayError> {
    let (out, mut lines) = mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(line) = lines.recv().await {
            let written = async {
                stdout.write_all(line.as_bytes()).await?;
                stdout.write_all(b"\n").await?;
                stdout.flush().await
            };
            if let Err(error) = written.await {
                return Err(RelayError::Io(error.kind()));
            }
        }
        Ok(())
    });
    let relay = Arc::new(Relay {
        endpoint,
        token,
        session: Mutex::new(Session::default()),
        out,
    });
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
    let mut line = Vec::new();
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        line.clear();
        let read = (&mut stdin)
            .take(u64::try_from(MAXIMUM_LINE_BYTES).unwrap_or(u64::MAX) + 1)
            .read_until(b'\n', &mut line)
            .await
            .map_err(|error| RelayError::Io(error.kind()))?;
        if read == 0 {
            break;
        }
        if line.len() > MAXIMUM_LINE_BYTES {
            relay.send(error_line(Value::Null, -32600, "the message is too long"));
            // The rest of the overlong line is skipped.
            let mut rest = Vec::new();
            let _ = stdin.read_until(b'\n', &mut rest).await;
            continue;
        }
        let text = String::from_utf8_lossy(&line).trim().to_owned();
        if text.is_empty() {
            continue;
        }
        let message: Value = match serde_json::from_str(&text) {
            Ok(message) => message,
            Err(_) => {
                relay.send(error_line(Value::Null, -32700, "Parse error"));
                continue;
            }
        };
        let is_initialize = message.get("method").and_then(Value::as_str) == Some("initialize");
        if is_initialize {
            // The session starts with it: later messages wait for its id.
            relay.clone().forward(message).await;
        } else {
            tasks.spawn(relay.clone().forward(message));
        }
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    relay.end().await;
    drop(relay);
    writer.await.unwrap_or(Ok(()))
}

/// The headers a message of a revision without sessions carries over
/// HTTP: its version, its method and, for a call or a read, its name
/// (base64 in the sentinel form when it is not plain visible ASCII).
/// `None` for a message of a revision with sessions.
fn stateless_headers(message: &Value) -> Option<Vec<(&'static str, String)>> {
    let version = message
        .pointer("/params/_meta/io.modelcontextprotocol~1protocolVersion")
        .and_then(Value::as_str)
        .filter(|version| *version >= super::STATELESS_REVISION)?;
    let mut headers = vec![("mcp-protocol-version", version.to_owned())];
    if let Some(method) = message.get("method").and_then(Value::as_str) {
        headers.push(("mcp-method", method.to_owned()));
        let name = ["/params/name", "/params/uri", "/params/taskId"]
            .iter()
            .find_map(|pointer| message.pointer(pointer).and_then(Value::as_str));
        if let Some(name) = name {
            headers.push(("mcp-name", header_value(name)));
        }
    }
    Some(headers)
}

/// A value as a header carries it: as it is when plain visible ASCII
/// without surrounding spaces, else `=?base64?…?=`.
fn header_value(value: &str) -> String {
    let plain = !value.is_empty()
        && value.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
        && value.trim() == value
        && !(value.starts_with("=?") && value.ends_with("?="));
    if plain {
        value.to_owned()
    } else {
        sentinel(value)
    }
}

/// `=?base64?…?=`: the value's UTF-8 in standard base64 with padding.
fn sentinel(value: &str) -> String {
    format!("=?base64?{}?=", crate::domain::base64(value.as_bytes()))
}

fn error_line(id: Value, code: i64, message: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}).to_string()
}

/// What toolgate answered a POST; the body still to be read.
struct Answered {
    status: StatusCode,
    content_type: String,
    session: Option<String>,
    body: hyper::body::Incoming,
}

impl Relay {
    fn send(&self, line: String) {
        let _ = self.out.send(line);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Session> {
        self.session.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One client message to toolgate, and its answers back.
    async fn forward(self: Arc<Self>, message: Value) {
        let id = message.get("id").cloned();
        let is_initialize = message.get("method").and_then(Value::as_str) == Some("initialize");
        if is_initialize {
            self.lock().initialize = Some(message.clone());
        }
        let mut answered = self.post(&message).await;
        // toolgate no longer knows the session: open another as the client
        // opened the first, and ask again once.
        if !is_initialize
            && matches!(&answered, Ok(a) if a.status == StatusCode::NOT_FOUND)
            && self.reopen().await
        {
            answered = self.post(&message).await;
        }
        match answered {
            Ok(answered) => self.deliver(answered, id, is_initialize).await,
            Err(reason) => {
                if let Some(id) = id {
                    self.send(error_line(id, -32603, reason));
                }
            }
        }
    }

    /// Replays the client's `initialize` for a new session.
    async fn reopen(&self) -> bool {
        let initialize = {
            let mut session = self.lock();
            session.id = None;
            session.initialize.clone()
        };
        let Some(initialize) = initialize else {
            return false;
        };
        match self.post(&initialize).await {
            Ok(answered) if answered.status.is_success() && answered.session.is_some() => {
                self.lock().id = answered.session;
                let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
                let _ = self.post(&initialized).await;
                eprintln!("toolgate stdio: the session had ended; a new one was opened");
                true
            }
            _ => false,
        }
    }

    async fn deliver(&self, answered: Answered, id: Option<Value>, is_initialize: bool) {
        if is_initialize && let Some(session) = &answered.session {
            self.lock().id = Some(session.clone());
        }
        if answered.content_type.starts_with("text/event-stream") {
            // Each event as it arrives: progress reaches the client while
            // the call still runs.
            let mut events = SseEvents::default();
            let mut body = answered.body;
            let mut read = 0usize;
            while let Some(Ok(frame)) = body.frame().await {
                let Ok(chunk) = frame.into_data() else {
                    continue;
                };
                read += chunk.len();
                if read > MAXIMUM_ANSWER_BYTES {
                    break;
                }
                for message in events.push(&chunk) {
                    self.deliver_one(message, is_initialize);
                }
            }
            return;
        }
        let Ok(collected) = http_body_util::Limited::new(answered.body, MAXIMUM_ANSWER_BYTES)
            .collect()
            .await
        else {
            if let Some(id) = id {
                self.send(error_line(
                    id,
                    -32603,
                    "the answer was too long or broken off",
                ));
            }
            return;
        };
        let body = collected.to_bytes();
        if body.is_empty() {
            return;
        }
        match serde_json::from_slice::<Value>(&body) {
            Ok(value) if value.get("jsonrpc").is_some() => self.deliver_one(value, is_initialize),
            // toolgate's own error shape (401, 413, …): the request gets a
            // JSON-RPC error saying what it says.
            Ok(value) => {
                if let Some(id) = id {
                    let message = value
                        .pointer("/error/message")
                        .and_then(Value::as_str)
                        .unwrap_or("the front door refused the request");
                    self.send(error_line(id, -32600, message));
                }
            }
            Err(_) => {
                if let Some(id) = id {
                    self.send(error_line(
                        id,
                        -32603,
                        "the front door's answer is not JSON",
                    ));
                }
            }
        }
    }

    fn deliver_one(&self, message: Value, is_initialize: bool) {
        if is_initialize
            && let Some(version) = message
                .pointer("/result/protocolVersion")
                .and_then(Value::as_str)
        {
            self.lock().protocol_version = Some(version.to_owned());
        }
        self.send(message.to_string());
    }

    async fn post(&self, message: &Value) -> Result<Answered, &'static str> {
        let (session, version) = {
            let session = self.lock();
            (session.id.clone(), session.protocol_version.clone())
        };
        let (host, path) = match &self.endpoint {
            Endpoint::Tcp { authority, path } => (authority.clone(), path.clone()),
            Endpoint::Unix(_) => ("localhost".to_owned(), "/mcp".to_owned()),
        };
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(path)
            .header(hyper::header::HOST, host)
            .header(
                hyper::header::AUTHORIZATION,
                format!("Bearer {}", self.token),
            )
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(hyper::header::ACCEPT, "application/json, text/event-stream");
        match stateless_headers(message) {
            // A 2026-07-28 message stands alone: its headers come from it.
            Some(headers) => {
                for (name, value) in headers {
                    request = request.header(name, value);
                }
            }
            None => {
                if let Some(session) = session {
                    request = request.header("mcp-session-id", session);
                }
                if let Some(version) = version {
                    request = request.header("mcp-protocol-version", version);
                }
            }
        }
        let request = request
            .body(Full::new(Bytes::from(message.to_string())))
            .map_err(|_| "the request could not be written")?;
        let response = self.send_request(request).await?;
        let status = response.status();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        };
        let content_type = header("content-type").unwrap_or_default();
        let session = header("mcp-session-id");
        Ok(Answered {
            status,
            content_type,
            session,
            body: response.into_body(),
        })
    }

    async fn send_request(
        &self,
        request: Request<Full<Bytes>>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, &'static str> {
        let unreachable = "toolgate's front door could not be reached";
        match &self.endpoint {
            Endpoint::Tcp { authority, .. } => {
                let stream = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    tokio::net::TcpStream::connect(authority.as_str()),
                )
                .await
                .map_err(|_| unreachable)?
                .map_err(|_| unreachable)?;
                exchange(stream, request).await
            }
            Endpoint::Unix(path) => {
                let stream =
                    tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::UnixStream::connect(path))
                        .await
                        .map_err(|_| unreachable)?
                        .map_err(|_| unreachable)?;
                exchange(stream, request).await
            }
        }
    }

    /// Ends the session, so toolgate holds nothing for a client that left.
    async fn end(&self) {
        let (session, version) = {
            let session = self.lock();
            (session.id.clone(), session.protocol_version.clone())
        };
        let Some(session) = session else {
            return;
        };
        let (host, path) = match &self.endpoint {
            Endpoint::Tcp { authority, path } => (authority.clone(), path.clone()),
            Endpoint::Unix(_) => ("localhost".to_owned(), "/mcp".to_owned()),
        };
        let mut request = Request::builder()
            .method(Method::DELETE)
            .uri(path)
            .header(hyper::header::HOST, host)
            .header(
                hyper::header::AUTHORIZATION,
                format!("Bearer {}", self.token),
            )
            .header("mcp-session-id", session);
        if let Some(version) = version {
            request = request.header("mcp-protocol-version", version);
        }
        if let Ok(request) = request.body(Full::new(Bytes::new())) {
            let _ = self.send_request(request).await;
        }
    }
}

async fn exchange<S>(
    stream: S,
    request: Request<Full<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, &'static str>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|_| "toolgate's front door could not be reached")?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    sender
        .send_request(request)
        .await
        .map_err(|_| "the front door did not answer")
}

/// An SSE body read as it arrives: each event's `data` lines joined into
/// one JSON-RPC message; comments (keep-alives) and other fields skipped.
#[derive(Default)]
struct SseEvents {
    pending: Vec<u8>,
    data: String,
}

impl SseEvents {
    fn push(&mut self, chunk: &[u8]) -> Vec<Value> {
        self.pending.extend_from_slice(chunk);
        let mut messages = Vec::new();
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if !self.data.is_empty() {
                    if let Ok(message) = serde_json::from_str::<Value>(&self.data) {
                        messages.push(message);
                    }
                    self.data.clear();
                }
            } else if let Some(rest) = line.strip_prefix("data:") {
                if !self.data.is_empty() {
                    self.data.push('\n');
                }
                self.data.push_str(rest.strip_prefix(' ').unwrap_or(rest));
            }
        }
        messages
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stateless_message_names_its_headers_and_a_session_message_none() {
        let call = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "demo-echo", "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}});
        assert_eq!(
            stateless_headers(&call).unwrap(),
            vec![
                ("mcp-protocol-version", "2026-07-28".to_owned()),
                ("mcp-method", "tools/call".to_owned()),
                ("mcp-name", "demo-echo".to_owned()),
            ]
        );
        let legacy =
            serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}});
        assert!(stateless_headers(&legacy).is_none());
        // RFC 4648 vectors, and what needs the sentinel form.
        assert_eq!(header_value("foo"), "foo");
        assert_eq!(sentinel("fo"), "=?base64?Zm8=?=");
        assert_eq!(sentinel("f"), "=?base64?Zg==?=");
        assert_eq!(sentinel("foobar"), "=?base64?Zm9vYmFy?=");
        assert_eq!(header_value(" foobar"), "=?base64?IGZvb2Jhcg==?=");
        assert_eq!(header_value("héllo"), "=?base64?aMOpbGxv?=");
        assert_eq!(header_value("=?base64?x?="), "=?base64?PT9iYXNlNjQ/eD89?=");
    }

    #[test]
    fn endpoints_parse() {
        assert!(matches!(
            Endpoint::parse("http://127.0.0.1:8766/mcp"),
            Ok(Endpoint::Tcp { authority, path }) if authority == "127.0.0.1:8766" && path == "/mcp"
        ));
        assert!(matches!(
            Endpoint::parse("unix:/run/front.sock"),
            Ok(Endpoint::Unix(_))
        ));
        assert!(Endpoint::parse("https://x/mcp").is_err());
        assert!(Endpoint::parse("unix:").is_err());
        assert!(Endpoint::parse("http:///mcp").is_err());
    }

    #[test]
    fn sse_events_become_messages() {
        let body = b": keep-alive\n\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\ndata: \"id\":1,\"result\":{}}\n\n";
        let mut events = SseEvents::default();
        let (first, second) = body.split_at(30);
        let mut messages = events.push(first);
        messages.extend(events.push(second));
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[1]["id"], 1);
    }
}
