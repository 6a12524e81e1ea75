//! toolgate's own framing of a stdio server's JSON-RPC lines, under the MCP
//! library: a line is read only up to the ceiling of what is in flight, so
//! what a server writes never decides how much memory a call takes or how
//! long it waits. A line past its ceiling ends the transport at once (the
//! rest of the line is garbage to the protocol) and is remembered, so the
//! call in flight ends as output too large rather than as a lost server.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use rmcp::RoleClient;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncWrite, AsyncWriteExt as _, BufReader};
use tokio::sync::Mutex;
/// What a listing (tools, prompts, resources) or a handshake may send: a
/// page of a catalog, whose schemas are capped one by one at mapping.
pub const DISCOVERY_CEILING: usize = 8 << 20;
/// JSON-RPC framing, escaping and structure on top of a result's content.
const ENVELOPE_ALLOWANCE: usize = 64 << 10;

/// The ceilings of one connection, and what crossing one left behind.
#[derive(Debug)]
pub struct Ceilings {
    /// The longest answer to a call: the server's hard output ceiling (four
    /// times its `maximum_output_bytes`) plus the envelope allowance.
    call: usize,
    /// Listings in flight; while there is one, the discovery ceiling holds.
    listing: AtomicUsize,
    /// Calls (and reads) in flight: only while there is one may a line be
    /// as long as a call's answer, so a row's large output limit never
    /// lifts what a listing may send.
    calling: AtomicUsize,
    /// A line crossed its ceiling and the transport was ended.
    oversized: AtomicBool,
    /// What that line held up to the ceiling: the runaway's head, which is
    /// what an operator most wants of it.
    head: std::sync::Mutex<Option<Vec<u8>>>,
}

impl Ceilings {
    /// Ceilings for a server whose calls may produce at most
    /// `hard_ceiling` bytes.
    pub fn new(hard_ceiling: usize) -> Arc<Self> {
        Arc::new(Ceilings {
            call: hard_ceiling.saturating_add(ENVELOPE_ALLOWANCE),
            listing: AtomicUsize::new(0),
            calling: AtomicUsize::new(0),
            oversized: AtomicBool::new(false),
            head: std::sync::Mutex::new(None),
        })
    }

    /// While the guard lives, lines may be as long as a listing's.
    pub fn listing(self: &Arc<Self>) -> InFlight {
        self.listing.fetch_add(1, Ordering::SeqCst);
        InFlight(self.clone(), Kind::Listing)
    }

    /// While the guard lives, lines may be as long as a call's answer.
    pub fn calling(self: &Arc<Self>) -> InFlight {
        self.calling.fetch_add(1, Ordering::SeqCst);
        InFlight(self.clone(), Kind::Calling)
    }

    /// Whether a line crossed its ceiling and ended the transport.
    pub fn oversized(&self) -> bool {
        self.oversized.load(Ordering::SeqCst)
    }

    /// Remembers that a message crossed its ceiling.
    pub fn mark_oversized(&self) {
        self.oversized.store(true, Ordering::SeqCst);
    }

    /// Remembers that a message crossed its ceiling, and what it held up to
    /// it.
    pub fn mark_oversized_with(&self, head: Vec<u8>) {
        *self
            .head
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(head);
        self.mark_oversized();
    }

    /// The head of the message that crossed its ceiling, once.
    pub fn take_head(&self) -> Option<Vec<u8>> {
        self.head
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    /// The ceiling of the next message: a listing's while one is in flight
    /// (the larger of it and a call's while a call is too), a call's
    /// otherwise.
    pub fn current(&self) -> usize {
        match (
            self.listing.load(Ordering::SeqCst) > 0,
            self.calling.load(Ordering::SeqCst) > 0,
        ) {
            (true, false) => DISCOVERY_CEILING,
            (true, true) => DISCOVERY_CEILING.max(self.call),
            (false, _) => self.call,
        }
    }
}

enum Kind {
    Listing,
    Calling,
}

/// A listing or a call in flight, counted until dropped.
pub struct InFlight(Arc<Ceilings>, Kind);

impl Drop for InFlight {
    fn drop(&mut self) {
        match self.1 {
            Kind::Listing => self.0.listing.fetch_sub(1, Ordering::SeqCst),
            Kind::Calling => self.0.calling.fetch_sub(1, Ordering::SeqCst),
        };
    }
}

/// The transport the MCP library speaks over: outgoing messages written as
/// lines to the child's input, incoming ones read from its output under
/// `ceilings`, both on the library's own task (a task and a channel per
/// direction would add two wake-ups to every call). The stream ends when the
/// server closes its output or a line crosses its ceiling; `ended` runs then.
pub struct Framed<R, W> {
    reader: BufReader<R>,
    /// The line being read: kept across a cancelled `receive` (the library
    /// polls it in a `select!`), cleared once a whole line is taken.
    line: Vec<u8>,
    writer: Arc<Mutex<W>>,
    ceilings: Arc<Ceilings>,
    ended: Option<Box<dyn FnOnce() + Send>>,
}

impl<R: AsyncRead, W> Framed<R, W> {
    /// Frames `reader` and `writer` under `ceilings`.
    pub fn new(
        reader: R,
        writer: W,
        ceilings: Arc<Ceilings>,
        ended: impl FnOnce() + Send + 'static,
    ) -> Self {
        Framed {
            reader: BufReader::new(reader),
            line: Vec::new(),
            writer: Arc::new(Mutex::new(writer)),
            ceilings,
            ended: Some(Box::new(ended)),
        }
    }

    fn end(&mut self) {
        if let Some(ended) = self.ended.take() {
            ended();
        }
    }
}

impl<R, W> Transport<RoleClient> for Framed<R, W>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let writer = self.writer.clone();
        async move {
            let mut line = serde_json::to_vec(&item).map_err(std::io::Error::other)?;
            line.push(b'\n');
            let mut writer = writer.lock().await;
            writer.write_all(&line).await?;
            writer.flush().await
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            match read_line(&mut self.reader, &mut self.line, &self.ceilings).await {
                Line::Complete => {}
                Line::Closed => {
                    self.end();
                    return None;
                }
                Line::Oversized => {
                    self.ceilings
                        .mark_oversized_with(std::mem::take(&mut self.line));
                    tracing::warn!(
                        "an mcp server's message crossed its output ceiling; the connection is closed"
                    );
                    self.end();
                    return None;
                }
            }
            // A line that is not a JSON-RPC message is the server's noise,
            // not the protocol: it is skipped, as the library does; so is a
            // notification toolgate does not act on, after one shallow read.
            let line = self.line.trim_ascii();
            let message = heeded(line)
                .then(|| serde_json::from_slice::<RxJsonRpcMessage<RoleClient>>(line).ok())
                .flatten();
            self.line.clear();
            if let Some(message) = message {
                return Some(message);
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.writer.lock().await.shutdown().await
    }
}

/// The notifications toolgate acts on (a server's catalog changing, a
/// request it cancels). Every other one a server sends (progress, logging,
/// resource updates) is dropped as it is read, before the library parses
/// it: a flood of them costs one shallow read each, and none reaches a
/// call's answer late.
const HEEDED_NOTIFICATIONS: &[&str] = &[
    "notifications/tools/list_changed",
    "notifications/prompts/list_changed",
    "notifications/resources/list_changed",
    "notifications/cancelled",
];

/// What a line is at a glance: its method, and whether it has an id.
#[derive(serde::Deserialize)]
struct Shape<'a> {
    #[serde(borrow, default)]
    method: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    id: Option<serde::de::IgnoredAny>,
}

/// Whether a line is worth the library's parse: a response, a request, or a
/// notification toolgate acts on. Not JSON at all is noise.
fn heeded(line: &[u8]) -> bool {
    match serde_json::from_slice::<Shape<'_>>(line) {
        Ok(Shape {
            method: Some(method),
            id: None,
        }) => HEEDED_NOTIFICATIONS.contains(&method.as_ref()),
        Ok(_) => true,
        Err(_) => false,
    }
}

enum Line {
    Complete,
    Closed,
    Oversized,
}

/// Reads the rest of one line into `line`, never holding more than the
/// current ceiling. Cancel-safe: what was consumed is in `line`.
async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
    ceilings: &Ceilings,
) -> Line {
    loop {
        let available = match reader.fill_buf().await {
            Ok([]) | Err(_) => return Line::Closed,
            Ok(available) => available,
        };
        let (chunk, done) = match available.iter().position(|b| *b == b'\n') {
            Some(end) => (&available[..end], true),
            None => (available, false),
        };
        if line.len() + chunk.len() > ceilings.current() {
            return Line::Oversized;
        }
        line.extend_from_slice(chunk);
        let used = chunk.len() + usize::from(done);
        reader.consume(used);
        if done {
            return Line::Complete;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_line_past_its_ceiling_ends_the_stream_without_reading_it() {
        let ceilings = Ceilings::new(1024);
        let mut input =
            b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 10 << 20));
        input.push(b'\n');
        let ended = Arc::new(AtomicBool::new(false));
        let told = ended.clone();
        let mut framed = Framed::new(
            std::io::Cursor::new(input),
            tokio::io::sink(),
            ceilings.clone(),
            move || told.store(true, Ordering::SeqCst),
        );
        assert!(
            framed.receive().await.is_some(),
            "the small message arrives"
        );
        assert!(!ended.load(Ordering::SeqCst));
        assert!(framed.receive().await.is_none(), "the stream ends");
        assert!(ceilings.oversized());
        assert!(ended.load(Ordering::SeqCst), "the end is told");
    }

    #[test]
    fn only_notifications_toolgate_acts_on_are_parsed() {
        assert!(heeded(
            br#"{"jsonrpc":"2.0","id":3,"result":{"content":[]}}"#
        ));
        assert!(heeded(
            br#"{"jsonrpc":"2.0","id":"a","method":"roots/list"}"#
        ));
        assert!(heeded(
            br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#
        ));
        assert!(heeded(
            br#"{"jsonrpc":"2.0","method":"notifications\/tools\/list_changed"}"#
        ));
        assert!(!heeded(
            br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":2}}"#
        ));
        assert!(!heeded(
            br#"{"jsonrpc":"2.0","method":"notifications/message","params":{}}"#
        ));
        assert!(!heeded(b"}{ not json"));
    }

    #[test]
    fn a_large_call_ceiling_never_lifts_a_listing() {
        let ceilings = Ceilings::new(1 << 40);
        let listing = ceilings.listing();
        assert_eq!(ceilings.current(), DISCOVERY_CEILING);
        let calling = ceilings.calling();
        assert!(
            ceilings.current() > DISCOVERY_CEILING,
            "a call's answer may come"
        );
        drop(calling);
        assert_eq!(ceilings.current(), DISCOVERY_CEILING);
        drop(listing);
        assert!(ceilings.current() > DISCOVERY_CEILING);
    }

    #[tokio::test]
    async fn a_listing_may_be_longer_than_a_call() {
        let ceilings = Ceilings::new(1024);
        let guard = ceilings.listing();
        let mut reader = BufReader::new(std::io::Cursor::new(vec![b'y'; 200_000]));
        let mut line = Vec::new();
        assert!(matches!(
            read_line(&mut reader, &mut line, &ceilings).await,
            Line::Closed
        ));
        assert_eq!(line.len(), 200_000);
        drop(guard);
        let mut reader = BufReader::new(std::io::Cursor::new(vec![b'y'; 200_000]));
        line.clear();
        assert!(matches!(
            read_line(&mut reader, &mut line, &ceilings).await,
            Line::Oversized
        ));
    }
}
