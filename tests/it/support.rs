//! Shared test parts: a real `Tool` whose spec a test chooses.

use std::sync::Arc;

use serde_json::{Value, json};
use toolgate::domain::{IdempotencyClass, RiskLevel, SideEffectClass, ToolResult, ToolSpec};
use toolgate::ports::{BoxFuture, Tool, ToolExecutionContext};

/// A tool that returns its arguments as text; enough for registration tests,
/// which never execute.
pub struct SpecTool(pub ToolSpec);

impl Tool for SpecTool {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }

    fn execute<'a>(
        &'a self,
        arguments: Value,
        _context: ToolExecutionContext,
    ) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move { ToolResult::text(arguments.to_string()) })
    }
}

/// A valid builtin spec, for tests to bend.
pub fn builtin_spec(name: &str) -> ToolSpec {
    serde_json::from_value(json!({
        "name": name,
        "version": "1",
        "description": "A test tool.",
        "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
        "output_schema": null,
        "side_effect": "none",
        "risk": "low",
        "idempotency": "read_only",
        "required_scopes": [],
        "timeout_seconds": 5,
        "maximum_output_bytes": 4096,
        "allow_parallel": true,
        "output_trust": "internal_tool"
    }))
    .expect("the base spec parses")
}

/// A valid MCP spec for `server_id`.
pub fn mcp_spec(server_id: &str, remote_name: &str) -> ToolSpec {
    let mut spec = builtin_spec(&toolgate::domain::names::mcp_registry_name(
        server_id,
        remote_name,
    ));
    spec.source = toolgate::domain::ToolSource::Mcp;
    spec.server_id = Some(server_id.to_owned());
    spec.target_kind = toolgate::domain::TargetKind::McpServer;
    spec.side_effect = SideEffectClass::ExternalWrite;
    spec.risk = RiskLevel::High;
    spec.idempotency = IdempotencyClass::NonIdempotent;
    spec.allow_parallel = false;
    spec
}

/// Wraps specs as tools.
pub fn tools(specs: impl IntoIterator<Item = ToolSpec>) -> Vec<Arc<dyn Tool>> {
    specs
        .into_iter()
        .map(|spec| Arc::new(SpecTool(spec)) as Arc<dyn Tool>)
        .collect()
}

/// The wall clock as tokio's time moves: the system clock's reading when
/// made, plus what tokio's clock has moved since. It reads as the system
/// clock does, and a test that advances paused time moves it too: the
/// leases a SQLite store keeps by the node's clock end when the test says.
pub struct TokioClock {
    wall: chrono::DateTime<chrono::Utc>,
    start: tokio::time::Instant,
}

impl TokioClock {
    pub fn new() -> TokioClock {
        TokioClock {
            wall: toolgate::ports::Clock::now(&toolgate::ports::SystemClock),
            start: tokio::time::Instant::now(),
        }
    }
}

impl toolgate::ports::Clock for TokioClock {
    /// To the microsecond, as the port says (what both stores keep). Read
    /// on a runtime's thread: elsewhere tokio's clock is the system's.
    fn now(&self) -> chrono::DateTime<chrono::Utc> {
        let moved = chrono::Duration::from_std(self.start.elapsed()).unwrap_or_default();
        let now = self.wall + moved;
        chrono::DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now)
    }
}

/// Lets `duration` pass for the leases of store `backend`. SQLite's are
/// kept by the node's clock ([`TokioClock`] in the tests), so tokio's time
/// is paused, advanced and resumed, with nothing in flight meanwhile;
/// PostgreSQL keeps them by its own `now()`, one clock for every node,
/// which no test can move, so there it passes for real.
pub async fn let_leases_pass(backend: &str, duration: std::time::Duration) {
    if backend == "sqlite" {
        tokio::time::pause();
        tokio::time::advance(duration).await;
        tokio::time::resume();
    } else {
        tokio::time::sleep(duration).await;
    }
}

/// A loopback port for a listener that a node, or a child process, binds
/// later. It is taken outside the kernel's ephemeral range: `bind(0)` and
/// every outgoing connection draw from that range, so a port picked there
/// and let go can be taken by any of them before the node binds it. Outside
/// it, only an explicit bind can take it: within this process each port is
/// handed out once, and the bind here checks that nothing else holds it now.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    static CANDIDATES: std::sync::LazyLock<Vec<u16>> =
        std::sync::LazyLock::new(outside_the_ephemeral_range);
    let candidates = &*CANDIDATES;
    if candidates.is_empty() {
        // The whole range is ephemeral: the kernel's choice is all there is.
        return std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map(|address| address.port())
            .expect("a free port");
    }
    // Two test runs on one machine start at different places.
    let start = std::process::id() as usize * 7_919;
    loop {
        let taken = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(
            taken < candidates.len(),
            "every port outside the ephemeral range was handed out"
        );
        let port = candidates[(start + taken) % candidates.len()];
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// The ports from 10,000 up that are outside
/// `net.ipv4.ip_local_port_range` (those below 10,000 are well-known
/// services').
fn outside_the_ephemeral_range() -> Vec<u16> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .expect("the ephemeral port range is readable");
    let bounds: Vec<u32> = range
        .split_whitespace()
        .map(|bound| bound.parse().expect("a port number"))
        .collect();
    let (low, high) = (bounds[0], bounds[1]);
    (10_000u32..=65_535)
        .filter(|port| *port < low || *port > high)
        .map(|port| port as u16)
        .collect()
}
