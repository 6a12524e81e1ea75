//! The sidecar's TOML configuration: its schema, defaults, environment
//! overrides and whole-file validation.
//!
//! Every error names its field path (`mcp.servers[2].auth.name`) and no error
//! echoes a value, since an operator may have pasted a secret where a
//! reference belongs. Uses domain rules only, so a tenant row written through
//! the control API later is checked by the same code.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

mod front;
mod mcp;
pub use front::{
    ApiKeyConfig, DEFAULT_FRONT_APPROVAL_HOLD_SECONDS, FrontConfig, JwtConfig, read_api_keys_file,
};
pub use mcp::{AuthConfig, HttpServerConfig, McpConfig, StdioServerConfig};

use crate::domain::egress::{AllowEntry, AllowedCidrs, EgressAllowlist};
use crate::domain::environment::is_tier0;
use crate::domain::mcp_server::{AuthFields, Transport, validate_auth, validate_classification};
use crate::domain::secret::CredentialRef;

/// Default ceiling on an MCP server's tools' `timeout_seconds` (ten minutes).
pub const DEFAULT_MAXIMUM_TIMEOUT_SECONDS: u32 = 600;
/// Default global ceiling on any tool's `maximum_output_bytes` (1 MiB).
pub const DEFAULT_MAXIMUM_OUTPUT_BYTES_CEILING: u64 = 1024 * 1024;
/// Shipped inline admission ceiling.
pub const DEFAULT_INLINE_MAXIMUM_BYTES: u64 = 4096;
/// The least an operator may set the inline ceiling to.
pub const MINIMUM_INLINE_MAXIMUM_BYTES: u64 = 1024;
/// Default per-batch concurrency cap.
pub const DEFAULT_BATCH_CONCURRENCY: u32 = 8;
/// Default bridge approval hold.
pub const DEFAULT_APPROVAL_HOLD_SECONDS: u32 = 300;
/// Deadline for an outbound TCP connection.
pub const DEFAULT_EGRESS_CONNECT_TIMEOUT_SECONDS: u32 = 10;
/// Deadline for an outbound TLS handshake.
pub const DEFAULT_EGRESS_TLS_TIMEOUT_SECONDS: u32 = 10;
/// How long a tenant HTTP server's discovery is reused without connecting.
pub const DEFAULT_DISCOVERY_REUSE_SECONDS: u32 = 300;
/// A request head must arrive within this (it also ends idle connections).
pub const DEFAULT_REQUEST_HEADER_TIMEOUT_SECONDS: u32 = 10;
/// A request body must arrive within this once its head has.
pub const DEFAULT_REQUEST_BODY_TIMEOUT_SECONDS: u32 = 30;
/// The largest request body either edge reads.
pub const DEFAULT_REQUEST_BODY_BYTES: u64 = 1024 * 1024;
/// Connections one turn's socket holds at once.
pub const DEFAULT_TURN_CONNECTIONS: u32 = 4;
/// Connections all turns' sockets hold at once.
pub const DEFAULT_BRIDGE_CONNECTIONS: u32 = 512;
/// Connections the control API holds at once, both listeners together.
pub const DEFAULT_CONTROL_CONNECTIONS: u32 = 256;
/// Default per-turn call cap.
pub const DEFAULT_TURN_CALL_CAP: u32 = 64;
/// MCP handshake deadline.
pub const DEFAULT_CONNECT_TIMEOUT_SECONDS: u32 = 10;
/// MCP per-request deadline, before the tool's and the run's caps.
pub const DEFAULT_REQUEST_TIMEOUT_SECONDS: u32 = 30;
/// MCP idle close.
pub const DEFAULT_IDLE_TIMEOUT_SECONDS: u32 = 900;
/// Per-server tool timeout when the operator declares none.
pub const DEFAULT_TOOL_TIMEOUT_SECONDS: u32 = 30;
/// Per-server output limit when the operator declares none (64 KiB).
pub const DEFAULT_SERVER_MAXIMUM_OUTPUT_BYTES: u64 = 64 * 1024;

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// # Control API
    /// Where agent runtimes and operators reach toolgate.
    pub control: ControlConfig,
    /// # Orchestration bridge
    #[serde(default)]
    pub bridge: BridgeConfig,
    /// # Durable store
    pub store: StoreConfig,
    /// # Limits
    #[serde(default)]
    pub limits: LimitsConfig,
    /// # Artifacts
    pub artifacts: ArtifactsConfig,
    /// # Policy
    #[serde(default)]
    pub policy: PolicyConfig,
    /// # Egress allowlist
    #[serde(default)]
    pub egress: EgressConfig,
    /// # MCP servers
    #[serde(default)]
    pub mcp: McpConfig,
    /// # This node
    #[serde(default)]
    pub node: NodeConfig,
    /// # Credentials
    #[serde(default)]
    pub credentials: CredentialsConfig,
    /// # The process
    #[serde(default)]
    pub runtime: RuntimeConfig,
    /// # Logging
    #[serde(default)]
    pub log: LogConfig,
    /// # Operations listener
    #[serde(default)]
    pub ops: OpsConfig,
    /// # Traces
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// The MCP front door.
    #[serde(default)]
    pub front: FrontConfig,
}

/// Trace export over OTLP.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// An OTLP/HTTP traces endpoint (`http://collector:4318/v1/traces`);
    /// no export when unset.
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
    /// The share of traces kept, 0 to 1 (a caller's sampled flag wins).
    #[serde(default = "TelemetryConfig::default_ratio")]
    pub sampling_ratio: f64,
    /// The `service.name` of the spans.
    #[serde(default = "TelemetryConfig::default_service")]
    pub service_name: String,
}

impl TelemetryConfig {
    fn default_ratio() -> f64 {
        1.0
    }
    fn default_service() -> String {
        "toolgate".to_owned()
    }
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: None,
            sampling_ratio: TelemetryConfig::default_ratio(),
            service_name: TelemetryConfig::default_service(),
        }
    }
}

/// The operations listener: metrics and probes on TCP, nothing else.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OpsConfig {
    /// Where `/metrics`, `/healthz` and `/readyz` answer (`127.0.0.1:9464`,
    /// or a pod's address); off when unset.
    #[serde(default)]
    pub listen: Option<String>,
    /// Tenant servers (by server id) whose tools get series of their own;
    /// every other tenant server's tools are counted together, and their
    /// ids are one `server` label value, so tenants never decide how many
    /// series there are.
    #[serde(default)]
    pub metrics_tenant_servers: Vec<String>,
}

/// The node's identity.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// Holds the node's identity (`node.id`) and the lock (`node.lock`) one
    /// process at a time holds while it runs; a restarted process is the
    /// same node, and recovers its predecessor's calls at once.
    #[serde(default = "NodeConfig::default_directory")]
    pub directory: PathBuf,
    /// How long the worker's lease lasts past each renewal, on the store's
    /// clock: a node that dies holds its calls this long at most (one that
    /// restarts releases them at once).
    #[serde(default = "NodeConfig::default_lease")]
    pub lease_seconds: u32,
    /// How often the lease is renewed; the node stops claiming and is not
    /// ready one heartbeat before an unrenewed lease could end.
    #[serde(default = "NodeConfig::default_heartbeat")]
    pub heartbeat_seconds: u32,
    /// How often the recovery sweep looks for calls dead workers left.
    #[serde(default = "NodeConfig::default_sweep")]
    pub sweep_seconds: u32,
    /// How far this host's clock may be from the store's at start-up;
    /// beyond it `serve` refuses to start.
    #[serde(default = "NodeConfig::default_clock_skew")]
    pub maximum_clock_skew_seconds: u32,
}

impl NodeConfig {
    fn default_directory() -> PathBuf {
        PathBuf::from("var/node")
    }
    fn default_lease() -> u32 {
        30
    }
    fn default_heartbeat() -> u32 {
        10
    }
    fn default_sweep() -> u32 {
        30
    }
    fn default_clock_skew() -> u32 {
        5
    }
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            directory: NodeConfig::default_directory(),
            lease_seconds: NodeConfig::default_lease(),
            heartbeat_seconds: NodeConfig::default_heartbeat(),
            sweep_seconds: NodeConfig::default_sweep(),
            maximum_clock_skew_seconds: NodeConfig::default_clock_skew(),
        }
    }
}

/// The control API's listeners.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ControlConfig {
    /// Unix socket (mode 0600); relative paths are under the config's folder.
    pub socket: PathBuf,
    /// Optional loopback TCP address; requires `token_ref`.
    #[serde(default)]
    pub tcp: Option<String>,
    /// Credential reference of the bearer token TCP clients present.
    #[serde(default)]
    pub token_ref: Option<String>,
    /// The socket's mode, in octal: owner read and write at least, never
    /// anything for others (`0660` lets a runtime in `socket_group` in).
    #[serde(default = "ControlConfig::default_socket_mode")]
    pub socket_mode: String,
    /// The group the socket is given (a name or a gid), with `socket_mode`.
    #[serde(default)]
    pub socket_group: Option<String>,
}

impl ControlConfig {
    fn default_socket_mode() -> String {
        "0600".to_owned()
    }

    /// The socket's mode bits; the file is validated, so this parses.
    pub fn socket_mode_bits(&self) -> u32 {
        u32::from_str_radix(&self.socket_mode, 8).unwrap_or(0o600)
    }
}

/// The process.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    /// Threads of the async runtime.
    #[serde(default = "RuntimeConfig::default_worker_threads")]
    pub worker_threads: u32,
    /// How long a drain (SIGTERM) waits for calls in flight.
    #[serde(default = "RuntimeConfig::default_drain_timeout")]
    pub drain_timeout_seconds: u32,
}

impl RuntimeConfig {
    fn default_worker_threads() -> u32 {
        2
    }
    fn default_drain_timeout() -> u32 {
        30
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            worker_threads: RuntimeConfig::default_worker_threads(),
            drain_timeout_seconds: RuntimeConfig::default_drain_timeout(),
        }
    }
}

/// Logging.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// A level (`info`) or per-target levels (`info,toolgate::pipeline=debug`);
    /// `RUST_LOG` in the environment wins.
    #[serde(default = "LogConfig::default_level")]
    pub level: String,
}

impl LogConfig {
    fn default_level() -> String {
        "info".to_owned()
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: LogConfig::default_level(),
        }
    }
}

/// The orchestration bridge.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeConfig {
    /// Folder holding per-turn socket folders.
    #[serde(default = "BridgeConfig::default_directory")]
    pub directory: PathBuf,
    /// How long a script blocks on an approval before its turn suspends.
    #[serde(default = "BridgeConfig::default_approval_hold_seconds")]
    pub approval_hold_seconds: u32,
    /// Underlying calls per turn, denied calls included.
    #[serde(default = "BridgeConfig::default_turn_call_cap")]
    pub turn_call_cap: u32,
    /// `approval_hold_seconds` for particular tenants, by tenant id.
    #[serde(default)]
    pub tenant_approval_hold_seconds: BTreeMap<String, u32>,
    /// What a replayed turn's call gets when it differs from the call
    /// recorded at its ordinal and may act: `approve` (held for a human,
    /// both calls shown) or `refuse`.
    #[serde(default)]
    pub replay_divergence: crate::domain::policy::ReplayDivergence,
}

impl BridgeConfig {
    fn default_directory() -> PathBuf {
        PathBuf::from("var/turns")
    }
    fn default_approval_hold_seconds() -> u32 {
        DEFAULT_APPROVAL_HOLD_SECONDS
    }
    fn default_turn_call_cap() -> u32 {
        DEFAULT_TURN_CALL_CAP
    }
}

impl Default for BridgeConfig {
    fn default() -> Self {
        BridgeConfig {
            directory: BridgeConfig::default_directory(),
            approval_hold_seconds: DEFAULT_APPROVAL_HOLD_SECONDS,
            turn_call_cap: DEFAULT_TURN_CALL_CAP,
            tenant_approval_hold_seconds: BTreeMap::new(),
            replay_divergence: crate::domain::policy::ReplayDivergence::default(),
        }
    }
}

/// The durable store.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `sqlite://path` (one node) or `postgres://…` (shared by nodes).
    pub url: String,
}

/// Output and concurrency limits.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// No tool may declare a larger `maximum_output_bytes`; one that does is
    /// refused at registration rather than silently clamped.
    #[serde(default = "LimitsConfig::default_ceiling")]
    pub maximum_output_bytes_ceiling: u64,
    /// No MCP server's tools (the operator's, or a tenant's row) may take
    /// longer than this per call.
    #[serde(default = "LimitsConfig::default_timeout_ceiling")]
    pub maximum_timeout_seconds: u32,
    /// The model-visible admission ceiling (at least 1,024).
    #[serde(default = "LimitsConfig::default_inline")]
    pub inline_maximum_bytes: u64,
    /// Parallel calls per batch; more queue.
    #[serde(default = "LimitsConfig::default_concurrency")]
    pub batch_concurrency: u32,
    /// A request head (on either edge) must arrive within this many
    /// seconds, counted from when the connection waits for one: slow or
    /// idle connections are closed, not held.
    #[serde(default = "LimitsConfig::default_header_timeout")]
    pub request_header_timeout_seconds: u32,
    /// A request body must arrive within this many seconds of its head.
    #[serde(default = "LimitsConfig::default_body_timeout")]
    pub request_body_timeout_seconds: u32,
    /// The largest request body either edge reads.
    #[serde(default = "LimitsConfig::default_body_bytes")]
    pub request_body_bytes: u64,
    /// Connections one turn's socket holds at once; more are closed as
    /// they arrive.
    #[serde(default = "LimitsConfig::default_turn_connections")]
    pub turn_connections: u32,
    /// Connections all turns' sockets hold at once.
    #[serde(default = "LimitsConfig::default_bridge_connections")]
    pub bridge_connections: u32,
    /// Connections the control API holds at once (socket and TCP).
    #[serde(default = "LimitsConfig::default_control_connections")]
    pub control_connections: u32,
}

impl LimitsConfig {
    fn default_ceiling() -> u64 {
        DEFAULT_MAXIMUM_OUTPUT_BYTES_CEILING
    }
    fn default_timeout_ceiling() -> u32 {
        DEFAULT_MAXIMUM_TIMEOUT_SECONDS
    }
    fn default_inline() -> u64 {
        DEFAULT_INLINE_MAXIMUM_BYTES
    }
    fn default_concurrency() -> u32 {
        DEFAULT_BATCH_CONCURRENCY
    }
    fn default_header_timeout() -> u32 {
        DEFAULT_REQUEST_HEADER_TIMEOUT_SECONDS
    }
    fn default_body_timeout() -> u32 {
        DEFAULT_REQUEST_BODY_TIMEOUT_SECONDS
    }
    fn default_body_bytes() -> u64 {
        DEFAULT_REQUEST_BODY_BYTES
    }
    fn default_turn_connections() -> u32 {
        DEFAULT_TURN_CONNECTIONS
    }
    fn default_bridge_connections() -> u32 {
        DEFAULT_BRIDGE_CONNECTIONS
    }
    fn default_control_connections() -> u32 {
        DEFAULT_CONTROL_CONNECTIONS
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            maximum_output_bytes_ceiling: DEFAULT_MAXIMUM_OUTPUT_BYTES_CEILING,
            maximum_timeout_seconds: DEFAULT_MAXIMUM_TIMEOUT_SECONDS,
            inline_maximum_bytes: DEFAULT_INLINE_MAXIMUM_BYTES,
            batch_concurrency: DEFAULT_BATCH_CONCURRENCY,
            request_header_timeout_seconds: DEFAULT_REQUEST_HEADER_TIMEOUT_SECONDS,
            request_body_timeout_seconds: DEFAULT_REQUEST_BODY_TIMEOUT_SECONDS,
            request_body_bytes: DEFAULT_REQUEST_BODY_BYTES,
            turn_connections: DEFAULT_TURN_CONNECTIONS,
            bridge_connections: DEFAULT_BRIDGE_CONNECTIONS,
            control_connections: DEFAULT_CONTROL_CONNECTIONS,
        }
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
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// The rule file; without one, the built-in default matrix applies.
    #[serde(default)]
    pub file: Option<PathBuf>,
}

/// Where toolgate may dial.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EgressConfig {
    /// Entries: `host`, `*.domain`, optional `:port`, optional `http://`.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Address ranges dialled even though the address rules refuse them
    /// (loopback, private, ...): `127.0.0.1/32`, `10.20.0.0/16`. Empty by
    /// default; the only way such an address is ever dialled.
    #[serde(default)]
    pub allow_cidrs: Vec<String>,
    /// PEM certificates of private CAs trusted beside the public roots.
    #[serde(default)]
    pub extra_ca_file: Option<PathBuf>,
    /// Deadline for a TCP connection.
    #[serde(default = "EgressConfig::default_connect")]
    pub connect_timeout_seconds: u32,
    /// Deadline for a TLS handshake.
    #[serde(default = "EgressConfig::default_tls")]
    pub tls_timeout_seconds: u32,
}

impl EgressConfig {
    fn default_connect() -> u32 {
        DEFAULT_EGRESS_CONNECT_TIMEOUT_SECONDS
    }
    fn default_tls() -> u32 {
        DEFAULT_EGRESS_TLS_TIMEOUT_SECONDS
    }
}

impl Default for EgressConfig {
    fn default() -> Self {
        EgressConfig {
            allow: Vec::new(),
            allow_cidrs: Vec::new(),
            extra_ca_file: None,
            connect_timeout_seconds: DEFAULT_EGRESS_CONNECT_TIMEOUT_SECONDS,
            tls_timeout_seconds: DEFAULT_EGRESS_TLS_TIMEOUT_SECONDS,
        }
    }
}

/// Where credentials are resolved from.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialsConfig {
    /// One folder per tenant holding that tenant's secrets, one file each:
    /// what `secret:TENANT/NAME` references resolve to. Unset, they resolve
    /// to nothing.
    #[serde(default)]
    pub tenant_secrets_directory: Option<PathBuf>,
}

/// One problem, at one field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted path with indices, e.g. `mcp.servers[0].auth.name`.
    pub path: String,
    /// What is wrong; never the value.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Every problem found in a file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, error) in self.0.iter().enumerate() {
            if index > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

const RUN_AS_RULE: &str = "must be a user name, a uid, or uid:gid";

/// `name` (a POSIX user name), `uid`, or `uid:gid`.
fn valid_run_as(text: &str) -> bool {
    let numeric = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
    match text.split_once(':') {
        Some((uid, gid)) => numeric(uid) && numeric(gid),
        None => {
            numeric(text)
                || (text.len() <= 32
                    && text
                        .bytes()
                        .next()
                        .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
                    && text.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-')
                    }))
        }
    }
}

/// Environment variables that override the file, applied before validation.
pub const ENVIRONMENT_OVERRIDES: &[&str] = &["TOOLGATE_STORE_URL", "TOOLGATE_CONTROL_SOCKET"];

impl Config {
    /// Reads, overrides and validates `path`. `environment` is the process
    /// environment as the composition root passes it in.
    pub fn load(
        path: &Path,
        environment: &BTreeMap<String, String>,
    ) -> Result<Config, ConfigErrors> {
        let text = std::fs::read_to_string(path).map_err(|error| {
            ConfigErrors(vec![ConfigError {
                path: "(file)".into(),
                message: format!("cannot read {}: {}", path.display(), error.kind()),
            }])
        })?;
        let mut config = Config::parse(&text)?;
        config.apply_environment(environment);
        let base = path.parent().unwrap_or_else(|| Path::new("."));
        config.resolve_paths(base);
        config.validate()?;
        Ok(config)
    }

    /// Parses TOML into the schema; the first structural error, with its path.
    pub fn parse(text: &str) -> Result<Config, ConfigErrors> {
        let deserializer = toml::Deserializer::parse(text).map_err(|error| {
            ConfigErrors(vec![ConfigError {
                path: locate(text, error.span()),
                message: error.message().to_owned(),
            }])
        })?;
        serde_path_to_error::deserialize(deserializer).map_err(|error| {
            let path = error.path().to_string();
            let inner = error.into_inner();
            ConfigErrors(vec![ConfigError {
                path: if path == "." {
                    locate(text, inner.span())
                } else {
                    path
                },
                message: without_values(inner.message()),
            }])
        })
    }

    fn apply_environment(&mut self, environment: &BTreeMap<String, String>) {
        if let Some(url) = environment.get("TOOLGATE_STORE_URL") {
            self.store.url = url.clone();
        }
        if let Some(socket) = environment.get("TOOLGATE_CONTROL_SOCKET") {
            self.control.socket = PathBuf::from(socket);
        }
    }

    fn resolve_paths(&mut self, base: &Path) {
        let resolve = |path: &mut PathBuf| {
            if path.is_relative() {
                *path = base.join(&*path);
            }
        };
        resolve(&mut self.control.socket);
        resolve(&mut self.bridge.directory);
        resolve(&mut self.artifacts.directory);
        resolve(&mut self.mcp.state_directory);
        resolve(&mut self.node.directory);
        if let Some(file) = self.egress.extra_ca_file.as_mut() {
            resolve(file);
        }
        if let Some(directory) = self.credentials.tenant_secrets_directory.as_mut() {
            resolve(directory);
        }
        if let Some(file) = self.policy.file.as_mut() {
            resolve(file);
        }
        self.front.resolve_paths(&resolve);
        if let Some(rest) = self.store.url.strip_prefix("sqlite://")
            && !rest.starts_with('/')
            && !rest.starts_with(":memory:")
        {
            self.store.url = format!("sqlite://{}", base.join(rest).display());
        }
    }

    /// Every operator server's id, stdio and HTTP: ids a tenant may not
    /// take.
    pub fn operator_server_ids(&self) -> Vec<String> {
        self.mcp
            .servers
            .iter()
            .map(|server| server.server_id.clone())
            .chain(
                self.mcp
                    .http_servers
                    .iter()
                    .map(|server| server.server_id.clone()),
            )
            .collect()
    }

    /// The egress allowlist, with entries that failed validation left out.
    pub fn egress_allowlist(&self) -> EgressAllowlist {
        EgressAllowlist::new(
            self.egress
                .allow
                .iter()
                .filter_map(|e| AllowEntry::parse(e).ok())
                .collect(),
        )
    }

    /// Checks the whole file and returns every problem.
    pub fn validate(&self) -> Result<(), ConfigErrors> {
        let mut errors = Vec::new();
        let mut push = |path: String, message: String| errors.push(ConfigError { path, message });

        if let Some(endpoint) = &self.telemetry.otlp_endpoint
            && endpoint.strip_prefix("http://").is_none_or(str::is_empty)
        {
            push(
                "telemetry.otlp_endpoint".into(),
                "must be an http:// URL (a collector beside toolgate)".into(),
            );
        }
        if !(0.0..=1.0).contains(&self.telemetry.sampling_ratio) {
            push(
                "telemetry.sampling_ratio".into(),
                "must be between 0 and 1".into(),
            );
        }
        self.front.validate(&mut push);
        if let Some(listen) = &self.ops.listen
            && listen.parse::<SocketAddr>().is_err()
        {
            push(
                "ops.listen".into(),
                "must be an address like 127.0.0.1:9464".into(),
            );
        }
        match u32::from_str_radix(&self.control.socket_mode, 8) {
            Ok(mode) if mode & !0o770 == 0 && mode & 0o600 == 0o600 => {}
            _ => push(
                "control.socket_mode".into(),
                "must be octal (0600, 0660), owner read and write, nothing for others".into(),
            ),
        }
        if let Some(group) = &self.control.socket_group
            && resolve_group(group).is_none()
        {
            push(
                "control.socket_group".into(),
                "names no group of this system".into(),
            );
        }
        if !(1..=3600).contains(&self.mcp.warmup_connect_timeout_seconds) {
            push(
                "mcp.warmup_connect_timeout_seconds".into(),
                "must be between 1 and 3600".into(),
            );
        }
        if !(1..=3600).contains(&self.mcp.warmup_retry_seconds) {
            push(
                "mcp.warmup_retry_seconds".into(),
                "must be between 1 and 3600".into(),
            );
        }
        if self.mcp.warmup_attempts > 100 {
            push("mcp.warmup_attempts".into(), "must be at most 100".into());
        }
        if !(1..=600).contains(&self.node.heartbeat_seconds) {
            push(
                "node.heartbeat_seconds".into(),
                "must be between 1 and 600".into(),
            );
        }
        if self.node.lease_seconds < self.node.heartbeat_seconds.saturating_mul(3)
            || self.node.lease_seconds > 3600
        {
            push(
                "node.lease_seconds".into(),
                "must be at least three heartbeats (node.heartbeat_seconds) and at most 3600"
                    .into(),
            );
        }
        if !(1..=3600).contains(&self.node.sweep_seconds) {
            push(
                "node.sweep_seconds".into(),
                "must be between 1 and 3600".into(),
            );
        }
        if !(1..=3600).contains(&self.node.maximum_clock_skew_seconds) {
            push(
                "node.maximum_clock_skew_seconds".into(),
                "must be between 1 and 3600".into(),
            );
        }
        if !(1..=64).contains(&self.runtime.worker_threads) {
            push(
                "runtime.worker_threads".into(),
                "must be between 1 and 64".into(),
            );
        }
        if !(1..=3600).contains(&self.runtime.drain_timeout_seconds) {
            push(
                "runtime.drain_timeout_seconds".into(),
                "must be between 1 and 3600".into(),
            );
        }
        if !valid_log_filter(&self.log.level) {
            push(
                "log.level".into(),
                "must be a level (info) or target=level pairs (info,toolgate=debug)".into(),
            );
        }
        for (tenant, seconds) in &self.bridge.tenant_approval_hold_seconds {
            if !crate::domain::valid_tenant_id(tenant) || *seconds == 0 {
                push(
                    "bridge.tenant_approval_hold_seconds".into(),
                    "keys must be tenant ids and values at least 1".into(),
                );
                break;
            }
        }

        if let Some(tcp) = &self.control.tcp {
            match tcp.parse::<SocketAddr>() {
                Ok(address) if address.ip().is_loopback() => {}
                Ok(_) => push("control.tcp".into(), "must be a loopback address".into()),
                Err(_) => push(
                    "control.tcp".into(),
                    "must be an address like 127.0.0.1:7420".into(),
                ),
            }
            if self.control.token_ref.is_none() {
                push(
                    "control.token_ref".into(),
                    "required when control.tcp is set".into(),
                );
            }
        }
        if let Some(reference) = &self.control.token_ref
            && let Err(error) = CredentialRef::parse(reference)
        {
            push("control.token_ref".into(), error.to_string());
        }

        if self.bridge.turn_call_cap == 0 {
            push("bridge.turn_call_cap".into(), "must be at least 1".into());
        }
        if self.bridge.approval_hold_seconds == 0 {
            push(
                "bridge.approval_hold_seconds".into(),
                "must be at least 1".into(),
            );
        }

        let url = self.store.url.as_str();
        if !(url.starts_with("sqlite:")
            || url.starts_with("postgres://")
            || url.starts_with("postgresql://"))
        {
            push(
                "store.url".into(),
                "must start with sqlite:, postgres:// or postgresql://".into(),
            );
        }

        if self.limits.inline_maximum_bytes < MINIMUM_INLINE_MAXIMUM_BYTES {
            push(
                "limits.inline_maximum_bytes".into(),
                format!("must be at least {MINIMUM_INLINE_MAXIMUM_BYTES}"),
            );
        }
        if self.limits.inline_maximum_bytes > self.limits.maximum_output_bytes_ceiling {
            push(
                "limits.inline_maximum_bytes".into(),
                "must not exceed limits.maximum_output_bytes_ceiling".into(),
            );
        }
        for (field, value) in [
            (
                "limits.batch_concurrency",
                u64::from(self.limits.batch_concurrency),
            ),
            (
                "limits.request_header_timeout_seconds",
                u64::from(self.limits.request_header_timeout_seconds),
            ),
            (
                "limits.request_body_timeout_seconds",
                u64::from(self.limits.request_body_timeout_seconds),
            ),
            ("limits.request_body_bytes", self.limits.request_body_bytes),
            (
                "limits.turn_connections",
                u64::from(self.limits.turn_connections),
            ),
            (
                "limits.bridge_connections",
                u64::from(self.limits.bridge_connections),
            ),
            (
                "limits.control_connections",
                u64::from(self.limits.control_connections),
            ),
        ] {
            if value == 0 {
                push(field.into(), "must be at least 1".into());
            }
        }

        if let Some(file) = &self.policy.file
            && !file.is_file()
        {
            push("policy.file".into(), "does not name a readable file".into());
        }

        for (index, entry) in self.egress.allow.iter().enumerate() {
            if let Err(error) = AllowEntry::parse(entry) {
                push(format!("egress.allow[{index}]"), error.to_string());
            }
        }
        for (index, entry) in self.egress.allow_cidrs.iter().enumerate() {
            if AllowedCidrs::parse(&[entry.as_str()]).is_err() {
                push(
                    format!("egress.allow_cidrs[{index}]"),
                    "must be an address or a CIDR range (10.0.0.0/8, ::1/128)".into(),
                );
            }
        }
        if let Some(file) = &self.egress.extra_ca_file
            && !file.is_file()
        {
            push(
                "egress.extra_ca_file".into(),
                "does not name a readable file".into(),
            );
        }
        for (field, value) in [
            (
                "egress.connect_timeout_seconds",
                self.egress.connect_timeout_seconds,
            ),
            (
                "egress.tls_timeout_seconds",
                self.egress.tls_timeout_seconds,
            ),
        ] {
            if value == 0 {
                push(field.into(), "must be at least 1".into());
            }
        }

        if let Some(run_as) = &self.mcp.run_as
            && !valid_run_as(run_as)
        {
            push("mcp.run_as".into(), RUN_AS_RULE.into());
        }
        let allowlist = self.egress_allowlist();
        let mut seen = BTreeMap::new();
        for (index, server) in self.mcp.servers.iter().enumerate() {
            if let Some(path) = &server.path
                && (path.is_empty()
                    || path
                        .split(':')
                        .any(|folder| !folder.starts_with('/') || folder.contains('\0')))
            {
                push(
                    format!("mcp.servers[{index}].path"),
                    "must be absolute folders separated by ':'".into(),
                );
            }
            let at = format!("mcp.servers[{index}]");
            if let Some(first) = seen.insert(server.server_id.clone(), index) {
                push(
                    format!("{at}.server_id"),
                    format!("duplicates mcp.servers[{first}].server_id"),
                );
            }
            for violation in validate_classification(&server.server_id, &server.required_scopes) {
                push(format!("{at}.{}", violation.field()), violation.to_string());
            }
            if server.command.trim().is_empty() {
                push(format!("{at}.command"), "must name a program".into());
            }
            if let Some(run_as) = &server.run_as
                && !valid_run_as(run_as)
            {
                push(format!("{at}.run_as"), RUN_AS_RULE.into());
            }
            for name in server.env.keys() {
                if !is_variable_name(name) {
                    push(
                        format!("{at}.env"),
                        "variable names must match [A-Za-z_][A-Za-z0-9_]*".into(),
                    );
                } else if is_tier0(name) {
                    push(
                        format!("{at}.env.{name}"),
                        "names a tier-0 variable toolgate synthesizes or forbids".into(),
                    );
                } else if server.auth.name.as_deref() == Some(name.as_str()) {
                    push(
                        format!("{at}.env.{name}"),
                        "is the credential variable auth.name already supplies".into(),
                    );
                }
            }
            let auth = AuthFields {
                transport: Transport::Stdio,
                scheme: &server.auth.scheme,
                auth_name: server.auth.name.as_deref(),
                credential_ref: server.auth.credential_ref.as_deref(),
                token_endpoint: server.auth.token_endpoint.as_deref(),
            };
            for violation in validate_auth(auth, &allowlist) {
                let field = match violation.field() {
                    "auth_scheme" => "scheme",
                    "auth_name" => "name",
                    other => other,
                };
                push(format!("{at}.auth.{field}"), violation.to_string());
            }
            for (field, value) in [
                ("connect_timeout_seconds", server.connect_timeout_seconds),
                ("request_timeout_seconds", server.request_timeout_seconds),
                ("idle_timeout_seconds", server.idle_timeout_seconds),
                ("timeout_seconds", server.timeout_seconds),
            ] {
                if value == 0 {
                    push(format!("{at}.{field}"), "must be at least 1".into());
                }
            }
            if server.timeout_seconds > self.limits.maximum_timeout_seconds {
                push(
                    format!("{at}.timeout_seconds"),
                    "must not exceed limits.maximum_timeout_seconds".into(),
                );
            }
            if server.maximum_output_bytes == 0
                || server.maximum_output_bytes > self.limits.maximum_output_bytes_ceiling
            {
                push(
                    format!("{at}.maximum_output_bytes"),
                    "must be between 1 and limits.maximum_output_bytes_ceiling".into(),
                );
            }
        }
        for (index, server) in self.mcp.http_servers.iter().enumerate() {
            let at = format!("mcp.http_servers[{index}]");
            if seen.contains_key(&server.server_id) {
                push(
                    format!("{at}.server_id"),
                    "duplicates another server's server_id".into(),
                );
            }
            seen.insert(server.server_id.clone(), index);
            for violation in validate_classification(&server.server_id, &server.required_scopes) {
                push(format!("{at}.{}", violation.field()), violation.to_string());
            }
            if let Err(error) = allowlist.check(&server.url) {
                push(format!("{at}.url"), error.to_string());
            }
            let auth = AuthFields {
                transport: Transport::Http,
                scheme: &server.auth.scheme,
                auth_name: server.auth.name.as_deref(),
                credential_ref: server.auth.credential_ref.as_deref(),
                token_endpoint: server.auth.token_endpoint.as_deref(),
            };
            for violation in validate_auth(auth, &allowlist) {
                let field = match violation.field() {
                    "auth_scheme" => "scheme",
                    "auth_name" => "name",
                    other => other,
                };
                push(format!("{at}.auth.{field}"), violation.to_string());
            }
            for (field, value) in [
                ("connect_timeout_seconds", server.connect_timeout_seconds),
                ("request_timeout_seconds", server.request_timeout_seconds),
                ("idle_timeout_seconds", server.idle_timeout_seconds),
                ("timeout_seconds", server.timeout_seconds),
            ] {
                if value == 0 {
                    push(format!("{at}.{field}"), "must be at least 1".into());
                }
            }
            if server.timeout_seconds > self.limits.maximum_timeout_seconds {
                push(
                    format!("{at}.timeout_seconds"),
                    "must not exceed limits.maximum_timeout_seconds".into(),
                );
            }
            if server.maximum_output_bytes == 0
                || server.maximum_output_bytes > self.limits.maximum_output_bytes_ceiling
            {
                push(
                    format!("{at}.maximum_output_bytes"),
                    "must be between 1 and limits.maximum_output_bytes_ceiling".into(),
                );
            }
        }
        if self.mcp.discovery_reuse_seconds == 0 {
            push(
                "mcp.discovery_reuse_seconds".into(),
                "must be at least 1".into(),
            );
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors(errors))
        }
    }
}

fn is_variable_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b'A'..=b'Z' | b'a'..=b'z' | b'_'))
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// serde's messages quote the offending input (`unknown variant `x``,
/// `invalid type: string "x"`); the quoted value is cut, the rest kept.
fn without_values(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    loop {
        let variant = rest
            .find("variant `")
            .map(|at| (at + "variant ".len(), '`'));
        let string = rest.find("string \"").map(|at| (at + "string ".len(), '"'));
        let next = match (variant, string) {
            (Some(a), Some(b)) => Some(if a.0 < b.0 { a } else { b }),
            (a, b) => a.or(b),
        };
        let Some((open, quote)) = next else {
            out.push_str(rest);
            return out;
        };
        out.push_str(rest[..open].trim_end());
        match rest[open + 1..].find(quote) {
            Some(close) => rest = &rest[open + 1 + close + 1..],
            None => return out,
        }
    }
}

/// `line N` for a parse error without a field path.
fn locate(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    match span {
        Some(span) => {
            let end = span.start.min(text.len());
            let line = text.as_bytes()[..end]
                .iter()
                .filter(|b| **b == b'\n')
                .count()
                + 1;
            format!("(line {line})")
        }
        None => "(file)".to_owned(),
    }
}

/// A group by name or number, as the system knows it.
pub fn resolve_group(text: &str) -> Option<u32> {
    use nix::unistd::Group;
    match text.parse::<u32>() {
        // A number is a gid whether or not this system names it (a
        // container's groups often have no entry).
        Ok(gid) => Some(gid),
        Err(_) => Group::from_name(text)
            .ok()
            .flatten()
            .map(|group| group.gid.as_raw()),
    }
}

/// A level (`info`) or comma-separated `target=level` pairs, a level among
/// them: what `log.level` and `RUST_LOG` take.
pub fn valid_log_filter(text: &str) -> bool {
    use tracing_subscriber::filter::LevelFilter;
    let level = |text: &str| text.trim().parse::<LevelFilter>().is_ok();
    !text.trim().is_empty()
        && text
            .split(',')
            .all(|directive| match directive.split_once('=') {
                Some((target, value)) => !target.trim().is_empty() && level(value),
                None => level(directive),
            })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_messages_lose_their_quoted_values() {
        assert_eq!(
            without_values("unknown variant `sk-live-1`, expected one of `none`, `low`"),
            "unknown variant, expected one of `none`, `low`"
        );
        assert_eq!(
            without_values("invalid type: string \"sk-live-1\", expected u32"),
            "invalid type: string, expected u32"
        );
        assert_eq!(
            without_values("unknown field `bogus`"),
            "unknown field `bogus`"
        );
    }
}
