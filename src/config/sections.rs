//! The file's sections but `[mcp]` and `[front]`: each with its defaults as
//! named constants, one `Default`, and the rules on its own fields, checked
//! at their paths.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::values::{Seconds, SocketMode, count};
use super::{Problems, resolve_group, valid_log_filter};
use crate::domain::egress::{AllowEntry, AllowedCidrs};
use crate::domain::policy::ReplayDivergence;
use crate::domain::secret::CredentialRef;
use crate::domain::{RateLimit, valid_tenant_id};

/// Default ceiling on an MCP server's tools' `timeout_seconds` (ten minutes).
pub const DEFAULT_MAXIMUM_TIMEOUT_SECONDS: u32 = 600;
/// Default global ceiling on any tool's `maximum_output_bytes` (1 MiB).
pub const DEFAULT_MAXIMUM_OUTPUT_BYTES_CEILING: u64 = 1024 * 1024;
/// Shipped inline admission ceiling.
pub const DEFAULT_INLINE_MAXIMUM_BYTES: u64 = 4096;
/// The least an operator may set the inline ceiling to.
pub const MINIMUM_INLINE_MAXIMUM_BYTES: u64 = 1024;
/// Default per-batch concurrency cap.
pub const DEFAULT_BATCH_CONCURRENCY: usize = 8;
/// Default bridge approval hold.
pub const DEFAULT_APPROVAL_HOLD_SECONDS: u32 = 300;
/// Deadline for an outbound TCP connection.
pub const DEFAULT_EGRESS_CONNECT_TIMEOUT_SECONDS: u32 = 10;
/// Deadline for an outbound TLS handshake.
pub const DEFAULT_EGRESS_TLS_TIMEOUT_SECONDS: u32 = 10;
/// A request head must arrive within this (it also ends idle connections).
pub const DEFAULT_REQUEST_HEADER_TIMEOUT_SECONDS: u32 = 10;
/// A request body must arrive within this once its head has.
pub const DEFAULT_REQUEST_BODY_TIMEOUT_SECONDS: u32 = 30;
/// The largest request body either edge reads.
pub const DEFAULT_REQUEST_BODY_BYTES: usize = 1024 * 1024;
/// Connections one turn's socket holds at once.
pub const DEFAULT_TURN_CONNECTIONS: usize = 4;
/// Connections all turns' sockets hold at once.
pub const DEFAULT_BRIDGE_CONNECTIONS: usize = 512;
/// Connections the control API holds at once, both listeners together.
pub const DEFAULT_CONTROL_CONNECTIONS: usize = 256;
/// Default per-turn call cap.
pub const DEFAULT_TURN_CALL_CAP: u32 = 64;
/// Where turns' sockets live, under the file's folder.
const DEFAULT_BRIDGE_DIRECTORY: &str = "var/turns";
/// Where the node's identity and lock live, under the file's folder.
const DEFAULT_NODE_DIRECTORY: &str = "var/node";
/// The worker's lease past each renewal.
const DEFAULT_LEASE_SECONDS: u32 = 30;
/// How often the lease is renewed.
const DEFAULT_HEARTBEAT_SECONDS: u32 = 10;
/// How often the recovery sweep runs.
const DEFAULT_SWEEP_SECONDS: u32 = 30;
/// How far the host's clock may be from the store's.
const DEFAULT_MAXIMUM_CLOCK_SKEW_SECONDS: u32 = 5;
/// The most threads the async runtime may be given.
const MAXIMUM_WORKER_THREADS: usize = 64;
/// How long a drain waits for calls in flight.
const DEFAULT_DRAIN_TIMEOUT_SECONDS: u32 = 30;
/// The log filter.
const DEFAULT_LOG_LEVEL: &str = "info";
/// The share of traces kept.
const DEFAULT_SAMPLING_RATIO: f64 = 1.0;
/// The spans' `service.name`.
const DEFAULT_SERVICE_NAME: &str = "toolgate";

/// The most a bounded number of seconds may be (an hour).
const HOUR: u32 = 3600;

/// The control API's listeners.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ControlConfig {
    /// Unix socket (mode 0600); relative paths are under the config's folder.
    pub socket: PathBuf,
    /// Optional loopback TCP address; requires `token_ref`.
    #[serde(default)]
    pub tcp: Option<SocketAddr>,
    /// Credential reference of the bearer token TCP clients present.
    #[serde(default)]
    pub token_ref: Option<CredentialRef>,
    /// The socket's mode, in octal: owner read and write at least, never
    /// anything for others (`0660` lets a runtime in `socket_group` in).
    #[serde(default)]
    pub socket_mode: SocketMode,
    /// The group the socket is given (a name or a gid), with `socket_mode`;
    /// looked up when checked and when bound, as the system has it then.
    #[serde(default)]
    pub socket_group: Option<String>,
}

impl ControlConfig {
    fn validate(&self, problems: &mut Problems) {
        if let Some(tcp) = self.tcp {
            if !tcp.ip().is_loopback() {
                problems.push("control.tcp", "must be a loopback address");
            }
            if self.token_ref.is_none() {
                problems.push("control.token_ref", "required when control.tcp is set");
            }
        }
        if let Some(problem) = self.socket_mode.problem() {
            problems.push("control.socket_mode", problem);
        }
        if let Some(group) = &self.socket_group
            && resolve_group(group).is_none()
        {
            problems.push("control.socket_group", "names no group of this system");
        }
    }
}

/// The orchestration bridge.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct BridgeConfig {
    /// Folder holding per-turn socket folders.
    pub directory: PathBuf,
    /// How long a script blocks on an approval before its turn suspends.
    pub approval_hold_seconds: Seconds,
    /// Underlying calls per turn, denied calls included.
    pub turn_call_cap: u32,
    /// `approval_hold_seconds` for particular tenants, by tenant id.
    pub tenant_approval_hold_seconds: BTreeMap<String, Seconds>,
    /// What a replayed turn's call gets when it differs from the call
    /// recorded at its ordinal and may act: `approve` (held for a human,
    /// both calls shown) or `refuse`.
    pub replay_divergence: ReplayDivergence,
}

impl Default for BridgeConfig {
    fn default() -> Self {
        BridgeConfig {
            directory: PathBuf::from(DEFAULT_BRIDGE_DIRECTORY),
            approval_hold_seconds: Seconds::new(DEFAULT_APPROVAL_HOLD_SECONDS),
            turn_call_cap: DEFAULT_TURN_CALL_CAP,
            tenant_approval_hold_seconds: BTreeMap::new(),
            replay_divergence: ReplayDivergence::default(),
        }
    }
}

impl BridgeConfig {
    fn validate(&self, problems: &mut Problems) {
        problems.at_least_one("bridge.turn_call_cap", self.turn_call_cap);
        problems.at_least_one(
            "bridge.approval_hold_seconds",
            self.approval_hold_seconds.get(),
        );
        // One problem for the table: its keys may be tenants' ids.
        if self
            .tenant_approval_hold_seconds
            .iter()
            .any(|(tenant, seconds)| !valid_tenant_id(tenant) || seconds.get() == 0)
        {
            problems.push(
                "bridge.tenant_approval_hold_seconds",
                "keys must be tenant ids and values at least 1",
            );
        }
    }
}

/// PostgreSQL connections a node holds by default.
pub const DEFAULT_STORE_CONNECTIONS: u32 = 8;

/// The durable store.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `sqlite://path` (one node) or `postgres://…` (shared by nodes).
    pub url: String,
    /// On PostgreSQL, the connections this node holds at most: one renews
    /// its lease, half the rest carry the pipeline's commits, the others
    /// everything else. Calls beyond them queue in arrival order, a tenant
    /// within three quarters of each set.
    #[serde(default = "default_store_connections")]
    pub connections: u32,
    /// On PostgreSQL, whether the server is reached through a pooler that
    /// shares connections per transaction (PgBouncer's `pool_mode =
    /// transaction`): statements are then prepared unnamed, each within a
    /// transaction.
    #[serde(default)]
    pub transaction_pooling: bool,
}

fn default_store_connections() -> u32 {
    DEFAULT_STORE_CONNECTIONS
}

impl StoreConfig {
    /// Whether the store is the embedded SQLite file.
    pub fn is_sqlite(&self) -> bool {
        self.url.starts_with("sqlite:")
    }

    fn validate(&self, problems: &mut Problems) {
        let url = self.url.as_str();
        if !(self.is_sqlite() || url.starts_with("postgres://") || url.starts_with("postgresql://"))
        {
            problems.push(
                "store.url",
                "must start with sqlite:, postgres:// or postgresql://",
            );
        }
        if self.connections < 3 {
            problems.push(
                "store.connections",
                "must be at least 3 (the lease's own, one for calls, one for the rest)",
            );
        }
    }
}

/// Tool versions one tenant's own servers may hold registered at once:
/// ten live versions of a 1,000-tool catalog.
pub const DEFAULT_TENANT_CATALOG_TOOLS: usize = 10_000;

/// Output and concurrency limits.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// No tool may declare a larger `maximum_output_bytes`; one that does is
    /// refused at registration rather than silently clamped.
    pub maximum_output_bytes_ceiling: u64,
    /// No MCP server's tools (the operator's, or a tenant's row) may take
    /// longer than this per call.
    pub maximum_timeout_seconds: Seconds,
    /// The model-visible admission ceiling (at least 1,024).
    pub inline_maximum_bytes: u64,
    /// Parallel calls per batch; more queue.
    #[serde(deserialize_with = "count")]
    pub batch_concurrency: usize,
    /// A request head (on either edge) must arrive within this many
    /// seconds, counted from when the connection waits for one: slow or
    /// idle connections are closed, not held.
    pub request_header_timeout_seconds: Seconds,
    /// A request body must arrive within this many seconds of its head.
    pub request_body_timeout_seconds: Seconds,
    /// The largest request body either edge reads.
    pub request_body_bytes: usize,
    /// Connections one turn's socket holds at once; more are closed as
    /// they arrive.
    #[serde(deserialize_with = "count")]
    pub turn_connections: usize,
    /// Connections all turns' sockets hold at once.
    #[serde(deserialize_with = "count")]
    pub bridge_connections: usize,
    /// Connections the control API holds at once (socket and TCP).
    #[serde(deserialize_with = "count")]
    pub control_connections: usize,
    /// The tool versions one tenant's own servers may hold registered at
    /// once (each catalog version its live sessions pin counts its tools).
    #[serde(deserialize_with = "count")]
    pub tenant_catalog_tools: usize,
    /// Rate limits on tool calls, kept per node; each is off unless set.
    pub rate: RateConfig,
}

/// Token-bucket limits on tool calls from every door (control API, bridge,
/// front door), kept by each node.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateConfig {
    /// Per tenant and principal (on the front door, a credential's).
    pub principal: Option<RateLimit>,
    /// Per tenant.
    pub tenant: Option<RateLimit>,
    /// Per tenant and MCP server (the operator's or the tenant's own).
    pub server: Option<RateLimit>,
    /// Per tenant and tool: the first entry whose `tools` globs match.
    pub tools: Vec<ToolRateConfig>,
}

/// A limit on the tools whose registry names match `tools`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ToolRateConfig {
    /// Globs over registry names (`mcp.acme.*`).
    pub tools: Vec<String>,
    /// Calls per second on average.
    pub per_second: f64,
    /// Calls at once from a full bucket.
    pub burst: u32,
}

impl RateConfig {
    fn validate(&self, problems: &mut Problems) {
        for (path, limit) in [
            ("limits.rate.principal", self.principal),
            ("limits.rate.tenant", self.tenant),
            ("limits.rate.server", self.server),
        ] {
            if let Some(problem) = limit.as_ref().and_then(RateLimit::problem) {
                problems.push(path, problem);
            }
        }
        for (index, entry) in self.tools.iter().enumerate() {
            let path = format!("limits.rate.tools[{index}]");
            if entry.tools.is_empty() || entry.tools.iter().any(|glob| glob.is_empty()) {
                problems.push(
                    format!("{path}.tools"),
                    "must name at least one glob, none empty",
                );
            }
            if let Some(problem) = entry.limit().problem() {
                problems.push(path, problem);
            }
        }
    }
}

impl ToolRateConfig {
    /// The limit this entry sets.
    pub fn limit(&self) -> RateLimit {
        RateLimit {
            per_second: self.per_second,
            burst: self.burst,
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            maximum_output_bytes_ceiling: DEFAULT_MAXIMUM_OUTPUT_BYTES_CEILING,
            maximum_timeout_seconds: Seconds::new(DEFAULT_MAXIMUM_TIMEOUT_SECONDS),
            inline_maximum_bytes: DEFAULT_INLINE_MAXIMUM_BYTES,
            batch_concurrency: DEFAULT_BATCH_CONCURRENCY,
            request_header_timeout_seconds: Seconds::new(DEFAULT_REQUEST_HEADER_TIMEOUT_SECONDS),
            request_body_timeout_seconds: Seconds::new(DEFAULT_REQUEST_BODY_TIMEOUT_SECONDS),
            request_body_bytes: DEFAULT_REQUEST_BODY_BYTES,
            turn_connections: DEFAULT_TURN_CONNECTIONS,
            bridge_connections: DEFAULT_BRIDGE_CONNECTIONS,
            control_connections: DEFAULT_CONTROL_CONNECTIONS,
            tenant_catalog_tools: DEFAULT_TENANT_CATALOG_TOOLS,
            rate: RateConfig::default(),
        }
    }
}

impl LimitsConfig {
    fn validate(&self, problems: &mut Problems) {
        if self.inline_maximum_bytes < MINIMUM_INLINE_MAXIMUM_BYTES {
            problems.push(
                "limits.inline_maximum_bytes",
                format!("must be at least {MINIMUM_INLINE_MAXIMUM_BYTES}"),
            );
        }
        if self.inline_maximum_bytes > self.maximum_output_bytes_ceiling {
            problems.push(
                "limits.inline_maximum_bytes",
                "must not exceed limits.maximum_output_bytes_ceiling",
            );
        }
        for (path, seconds) in [
            (
                "limits.request_header_timeout_seconds",
                self.request_header_timeout_seconds,
            ),
            (
                "limits.request_body_timeout_seconds",
                self.request_body_timeout_seconds,
            ),
        ] {
            problems.at_least_one(path, seconds.get());
        }
        for (path, count) in [
            ("limits.batch_concurrency", self.batch_concurrency),
            ("limits.request_body_bytes", self.request_body_bytes),
            ("limits.turn_connections", self.turn_connections),
            ("limits.bridge_connections", self.bridge_connections),
            ("limits.control_connections", self.control_connections),
            ("limits.tenant_catalog_tools", self.tenant_catalog_tools),
        ] {
            problems.at_least_one(path, count);
        }
        self.rate.validate(problems);
    }
}

/// The filesystem artifact store.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ArtifactsConfig {
    /// Root folder; artifacts live under `{tenant}/{run}/`.
    pub directory: PathBuf,
}

/// The rule-file policy engine.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// The rule file; without one, the built-in default matrix applies.
    pub file: Option<PathBuf>,
}

impl PolicyConfig {
    fn validate(&self, problems: &mut Problems) {
        if let Some(file) = &self.file
            && !file.is_file()
        {
            problems.push("policy.file", "does not name a readable file");
        }
    }
}

/// Where toolgate may dial.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct EgressConfig {
    /// Entries: `host`, `*.domain`, optional `:port`, optional `http://`.
    pub allow: Vec<AllowEntry>,
    /// Address ranges dialled even though the address rules refuse them
    /// (loopback, private, ...): `127.0.0.1/32`, `10.20.0.0/16`. Empty by
    /// default; the only way such an address is ever dialled.
    pub allow_cidrs: AllowedCidrs,
    /// PEM certificates of private CAs trusted beside the public roots.
    pub extra_ca_file: Option<PathBuf>,
    /// Deadline for a TCP connection.
    pub connect_timeout_seconds: Seconds,
    /// Deadline for a TLS handshake.
    pub tls_timeout_seconds: Seconds,
}

impl Default for EgressConfig {
    fn default() -> Self {
        EgressConfig {
            allow: Vec::new(),
            allow_cidrs: AllowedCidrs::default(),
            extra_ca_file: None,
            connect_timeout_seconds: Seconds::new(DEFAULT_EGRESS_CONNECT_TIMEOUT_SECONDS),
            tls_timeout_seconds: Seconds::new(DEFAULT_EGRESS_TLS_TIMEOUT_SECONDS),
        }
    }
}

impl EgressConfig {
    fn validate(&self, problems: &mut Problems) {
        if let Some(file) = &self.extra_ca_file
            && !file.is_file()
        {
            problems.push("egress.extra_ca_file", "does not name a readable file");
        }
        problems.at_least_one(
            "egress.connect_timeout_seconds",
            self.connect_timeout_seconds.get(),
        );
        problems.at_least_one("egress.tls_timeout_seconds", self.tls_timeout_seconds.get());
    }
}

/// The node's identity.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// Holds the node's identity (`node.id`) and the lock (`node.lock`) one
    /// process at a time holds while it runs; a restarted process is the
    /// same node, and recovers its predecessor's calls at once.
    pub directory: PathBuf,
    /// How long the worker's lease lasts past each renewal, on the store's
    /// clock: a node that dies holds its calls this long at most (one that
    /// restarts releases them at once).
    pub lease_seconds: Seconds,
    /// How often the lease is renewed; the node stops claiming and is not
    /// ready one heartbeat before an unrenewed lease could end.
    pub heartbeat_seconds: Seconds,
    /// How often the recovery sweep looks for calls dead workers left.
    pub sweep_seconds: Seconds,
    /// How far this host's clock may be from the store's at start-up;
    /// beyond it `serve` refuses to start.
    pub maximum_clock_skew_seconds: Seconds,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            directory: PathBuf::from(DEFAULT_NODE_DIRECTORY),
            lease_seconds: Seconds::new(DEFAULT_LEASE_SECONDS),
            heartbeat_seconds: Seconds::new(DEFAULT_HEARTBEAT_SECONDS),
            sweep_seconds: Seconds::new(DEFAULT_SWEEP_SECONDS),
            maximum_clock_skew_seconds: Seconds::new(DEFAULT_MAXIMUM_CLOCK_SKEW_SECONDS),
        }
    }
}

impl NodeConfig {
    fn validate(&self, problems: &mut Problems) {
        let heartbeat = self.heartbeat_seconds.get();
        problems.between("node.heartbeat_seconds", heartbeat, 1, 600);
        // Three heartbeats: a lease survives two missed renewals.
        let lease = self.lease_seconds.get();
        if lease < heartbeat.saturating_mul(3) || lease > HOUR {
            problems.push(
                "node.lease_seconds",
                "must be at least three heartbeats (node.heartbeat_seconds) and at most 3600",
            );
        }
        problems.between("node.sweep_seconds", self.sweep_seconds.get(), 1, HOUR);
        problems.between(
            "node.maximum_clock_skew_seconds",
            self.maximum_clock_skew_seconds.get(),
            1,
            HOUR,
        );
    }
}

/// Where credentials are resolved from.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct CredentialsConfig {
    /// One folder per tenant holding that tenant's secrets, one file each:
    /// what `secret:TENANT/NAME` references resolve to. Unset, they resolve
    /// to nothing.
    pub tenant_secrets_directory: Option<PathBuf>,
}

/// The process.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeConfig {
    /// Threads of the async runtime.
    #[serde(deserialize_with = "count")]
    pub worker_threads: usize,
    /// How long a drain (SIGTERM) waits for calls in flight.
    pub drain_timeout_seconds: Seconds,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            worker_threads: default_worker_threads(),
            drain_timeout_seconds: Seconds::new(DEFAULT_DRAIN_TIMEOUT_SECONDS),
        }
    }
}

/// Threads of the async runtime when none are configured: one fewer than
/// the cores the process may use, at least one and at most the most
/// allowed. The core left over runs
/// the stdio servers toolgate spawns and the SQLite store's writer thread;
/// beside them a second worker on two cores mostly wakes, finds nothing to
/// steal and sleeps again (a fifth of a front-door call's CPU).
fn default_worker_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |cores| {
        cores
            .get()
            .saturating_sub(1)
            .clamp(1, MAXIMUM_WORKER_THREADS)
    })
}

impl RuntimeConfig {
    fn validate(&self, problems: &mut Problems) {
        problems.between(
            "runtime.worker_threads",
            self.worker_threads,
            1,
            MAXIMUM_WORKER_THREADS,
        );
        problems.between(
            "runtime.drain_timeout_seconds",
            self.drain_timeout_seconds.get(),
            1,
            HOUR,
        );
    }
}

/// Logging.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// A level (`info`) or per-target levels (`info,toolgate::pipeline=debug`);
    /// `RUST_LOG` in the environment wins.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: DEFAULT_LOG_LEVEL.to_owned(),
        }
    }
}

impl LogConfig {
    fn validate(&self, problems: &mut Problems) {
        if !valid_log_filter(&self.level) {
            problems.push(
                "log.level",
                "must be a level (info) or target=level pairs (info,toolgate=debug)",
            );
        }
    }
}

/// The operations listener: metrics and probes on TCP, nothing else.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct OpsConfig {
    /// Where `/metrics`, `/healthz` and `/readyz` answer (`127.0.0.1:9464`,
    /// or a pod's address); off when unset.
    pub listen: Option<SocketAddr>,
    /// Tenant servers (by server id) whose tools get series of their own;
    /// every other tenant server's tools are counted together, and their
    /// ids are one `server` label value, so tenants never decide how many
    /// series there are.
    pub metrics_tenant_servers: Vec<String>,
}

/// Trace export over OTLP.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// An OTLP/HTTP traces endpoint (`http://collector:4318/v1/traces`);
    /// no export when unset.
    pub otlp_endpoint: Option<String>,
    /// The share of traces kept, 0 to 1 (a caller's sampled flag wins).
    pub sampling_ratio: f64,
    /// The `service.name` of the spans.
    pub service_name: String,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: None,
            sampling_ratio: DEFAULT_SAMPLING_RATIO,
            service_name: DEFAULT_SERVICE_NAME.to_owned(),
        }
    }
}

impl TelemetryConfig {
    fn validate(&self, problems: &mut Problems) {
        if let Some(endpoint) = &self.otlp_endpoint
            && endpoint.strip_prefix("http://").is_none_or(str::is_empty)
        {
            problems.push(
                "telemetry.otlp_endpoint",
                "must be an http:// URL (a collector beside toolgate)",
            );
        }
        if !(0.0..=1.0).contains(&self.sampling_ratio) {
            problems.push("telemetry.sampling_ratio", "must be between 0 and 1");
        }
    }
}

/// Every section's own rules, at their paths; `[mcp]` and `[front]` have
/// theirs beside them.
pub(super) fn validate_sections(config: &super::Config, problems: &mut Problems) {
    config.control.validate(problems);
    config.bridge.validate(problems);
    config.store.validate(problems);
    config.limits.validate(problems);
    config.policy.validate(problems);
    config.egress.validate(problems);
    config.node.validate(problems);
    config.runtime.validate(problems);
    config.log.validate(problems);
    config.telemetry.validate(problems);
}
