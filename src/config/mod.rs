//! The sidecar's TOML configuration: its schema, defaults, environment
//! overrides and whole-file validation.
//!
//! Every error names its field path (`mcp.servers[2].auth.name`) and no error
//! echoes a value, since an operator may have pasted a secret where a
//! reference belongs. Values are typed as they are read (`values` says what
//! the parse refuses and what validation does); each section checks its own
//! fields, and `Config::validate` adds the rules between sections. Uses
//! domain rules only, so a tenant row written through the control API later
//! is checked by the same code.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

mod console;
mod front;
mod mcp;
mod sections;
mod values;
pub use console::{
    ConsoleConfig, DEFAULT_CONSOLE_CONNECTIONS, DEFAULT_CONSOLE_SESSION_MINUTES, OperatorConfig,
};
pub use front::{
    ApiKeyConfig, DEFAULT_FRONT_APPROVAL_HOLD_SECONDS, FrontConfig, JwtAlgorithm, JwtConfig,
    read_api_keys_file,
};
pub use mcp::{
    AuthConfig, CommonServerConfig, DEFAULT_CONNECT_TIMEOUT_SECONDS,
    DEFAULT_DISCOVERY_REUSE_SECONDS, DEFAULT_IDLE_TIMEOUT_SECONDS, DEFAULT_REQUEST_TIMEOUT_SECONDS,
    DEFAULT_SERVER_MAXIMUM_OUTPUT_BYTES, DEFAULT_TOOL_TIMEOUT_SECONDS, HttpServerConfig, McpConfig,
    StdioServerConfig,
};
pub use sections::{
    ArtifactsConfig, BridgeConfig, ControlConfig, CredentialsConfig, DEFAULT_APPROVAL_HOLD_SECONDS,
    DEFAULT_BATCH_CONCURRENCY, DEFAULT_BRIDGE_CONNECTIONS, DEFAULT_CONTROL_CONNECTIONS,
    DEFAULT_EGRESS_CONNECT_TIMEOUT_SECONDS, DEFAULT_EGRESS_TLS_TIMEOUT_SECONDS,
    DEFAULT_INLINE_MAXIMUM_BYTES, DEFAULT_MAXIMUM_OUTPUT_BYTES_CEILING,
    DEFAULT_MAXIMUM_TIMEOUT_SECONDS, DEFAULT_REQUEST_BODY_BYTES,
    DEFAULT_REQUEST_BODY_TIMEOUT_SECONDS, DEFAULT_REQUEST_HEADER_TIMEOUT_SECONDS,
    DEFAULT_TURN_CALL_CAP, DEFAULT_TURN_CONNECTIONS, EgressConfig, LimitsConfig, LogConfig,
    MINIMUM_INLINE_MAXIMUM_BYTES, NodeConfig, OpsConfig, PolicyConfig, RateConfig, RuntimeConfig,
    StoreConfig, TelemetryConfig,
};
pub use values::{DEFAULT_SOCKET_MODE, RunAsUser, Seconds, SocketMode};

use crate::domain::egress::EgressAllowlist;
use crate::domain::mcp_server::AuthScheme;

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
    /// The operators' web console.
    #[serde(default)]
    pub console: ConsoleConfig,
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

/// Every problem found so far, each at its field's path.
#[derive(Debug, Default)]
struct Problems(Vec<ConfigError>);

impl Problems {
    fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(ConfigError {
            path: path.into(),
            message: message.into(),
        });
    }

    /// `value` at `path` where zero makes no sense.
    fn at_least_one<T: PartialEq + Default>(&mut self, path: &str, value: T) {
        if value == T::default() {
            self.push(path, "must be at least 1");
        }
    }

    /// `value` at `path`, which must lie between `low` and `high`.
    fn between<T: PartialOrd + fmt::Display>(&mut self, path: &str, value: T, low: T, high: T) {
        if value < low || value > high {
            self.push(path, format!("must be between {low} and {high}"));
        }
    }

    fn into_result(self) -> Result<(), ConfigErrors> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors(self.0))
        }
    }
}

/// Environment variables that override the file, applied before validation.
pub const ENVIRONMENT_OVERRIDES: &[&str] = &["TOOLGATE_STORE_URL", "TOOLGATE_CONTROL_SOCKET"];

/// The folder a configuration's relative paths are under: the file's own,
/// absolute, so a path handed to a child (its HOME, its TMPDIR) means the
/// same in the child's own working folder.
fn folder_of(path: &Path) -> PathBuf {
    let base = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    base.canonicalize()
        .or_else(|_| std::path::absolute(base))
        .unwrap_or_else(|_| base.to_path_buf())
}

/// `relative` from `base`, its leading `..` climbing `base` itself: the
/// configuration's folder, resolved, so no link makes that climb mean
/// something else.
fn beneath(base: &Path, relative: &Path) -> PathBuf {
    use std::path::Component;
    let mut joined = base.to_path_buf();
    let mut rest = relative.components().peekable();
    while let Some(step @ (Component::ParentDir | Component::CurDir)) = rest.peek().copied() {
        if step == Component::ParentDir {
            joined.pop();
        }
        rest.next();
    }
    joined.extend(rest);
    joined
}

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
        config.resolve_paths(&folder_of(path));
        config.validate()?;
        Ok(config)
    }

    /// The control socket the file at `path` names, read from its
    /// `[control]` alone: an operator command still reaches the node when
    /// another section of the file does not validate (a reload then says
    /// what). The whole file's errors when even that cannot be read.
    pub fn control_socket_of(
        path: &Path,
        environment: &BTreeMap<String, String>,
    ) -> Result<PathBuf, ConfigErrors> {
        let whole = match Config::load(path, environment) {
            Ok(config) => return Ok(config.control.socket),
            Err(errors) => errors,
        };
        let named = environment
            .get("TOOLGATE_CONTROL_SOCKET")
            .map(PathBuf::from)
            .or_else(|| {
                let text = std::fs::read_to_string(path).ok()?;
                let table: toml::Table = toml::from_str(&text).ok()?;
                let control: ControlConfig = table.get("control")?.clone().try_into().ok()?;
                Some(control.socket)
            });
        match named {
            Some(socket) if socket.is_relative() => Ok(beneath(&folder_of(path), &socket)),
            Some(socket) => Ok(socket),
            None => Err(whole),
        }
    }

    /// Parses TOML into the typed schema: the configuration, or the first
    /// value it cannot read (wrong type or form, unknown key), at its path.
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
                *path = beneath(base, path);
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
        self.console.resolve_paths(&resolve);
        if let Some(rest) = self.store.url.strip_prefix("sqlite://")
            && !rest.starts_with('/')
            && !rest.starts_with(":memory:")
        {
            self.store.url = format!("sqlite://{}", beneath(base, Path::new(rest)).display());
        }
    }

    /// Every operator server's id, stdio and HTTP: ids a tenant may not
    /// take.
    pub fn operator_server_ids(&self) -> Vec<String> {
        self.mcp
            .common()
            .map(|(_, server)| server.server_id.clone())
            .collect()
    }

    /// The egress allowlist.
    pub fn egress_allowlist(&self) -> EgressAllowlist {
        EgressAllowlist::new(self.egress.allow.clone())
    }

    /// Checks the whole file and returns every problem: each section's
    /// rules on its own fields, then the rules between sections (the
    /// operator's servers against the limits and the egress allowlist).
    pub fn validate(&self) -> Result<(), ConfigErrors> {
        let mut problems = Problems::default();
        sections::validate_sections(self, &mut problems);
        self.front.validate(&mut problems);
        self.console.validate(&mut problems);
        self.validate_consent(&mut problems);
        self.mcp
            .validate(&self.limits, &self.egress_allowlist(), &mut problems);
        problems.into_result()
    }
}

impl Config {
    /// `oauth2_user` asks a person's consent on the console's pages, and
    /// the person proves which principal they are with a front-door
    /// credential: both must be there.
    fn validate_consent(&self, problems: &mut Problems) {
        for (index, server) in self.mcp.http_servers.iter().enumerate() {
            let auth = &server.common.auth;
            if auth.scheme != AuthScheme::Oauth2User {
                continue;
            }
            let at = format!("mcp.http_servers[{index}].auth.scheme");
            if auth.token_endpoint.is_some() {
                if self.front.jwt.is_none() {
                    problems.push(
                        at,
                        "oauth2_user with a token_endpoint exchanges the caller's own token \
                         from the identity provider: it needs front.jwt",
                    );
                }
            } else if self.console.consent_key_ref.is_none() {
                problems.push(
                    at,
                    "oauth2_user needs console.consent_key_ref: grants are sealed with it and \
                     consent is asked on the console's pages",
                );
            } else if auth.credential_ref.is_none() && !self.console.client_document_fetchable() {
                problems.push(
                    format!("mcp.http_servers[{index}].auth.credential_ref"),
                    "without a registered client, toolgate is the client its Client ID Metadata \
                     Document at console.url describes, which authorization servers fetch only \
                     over https: set an https console.url, or name a registered client",
                );
            }
        }
        if self.console.consent_key_ref.is_some() && !self.front.enabled() {
            problems.push(
                "console.consent_key_ref",
                "needs the front door (front.listen or front.socket): a person proves which \
                 principal they are with its front-door credential",
            );
        }
    }

    /// Whether `oauth2_user` servers may be written (tenants' rows too).
    pub fn consent_enabled(&self) -> bool {
        self.console.consent_key_ref.is_some()
    }
}

/// Reads a file of entries (API keys, operators) into its typed form, or
/// the first problem: unreadable, not TOML, or a value at its path.
fn read_entries_file<F: serde::de::DeserializeOwned>(path: &Path) -> Result<F, ConfigErrors> {
    let one = |at: &str, message: String| {
        ConfigErrors(vec![ConfigError {
            path: at.to_owned(),
            message,
        }])
    };
    let text = std::fs::read_to_string(path).map_err(|error| {
        one(
            "(file)",
            format!("cannot read {}: {}", path.display(), error.kind()),
        )
    })?;
    let deserializer = toml::Deserializer::parse(&text)
        .map_err(|error| one("(file)", error.message().to_owned()))?;
    serde_path_to_error::deserialize(deserializer).map_err(|error| {
        let at = error.path().to_string();
        one(&at, without_values(error.into_inner().message()))
    })
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

    const BASE: &str = "[control]\nsocket = \"s\"\n[store]\nurl = \"sqlite://x\"\n\
                        [artifacts]\ndirectory = \"a\"\n";

    /// The example configuration named by a relative path, as README's
    /// quickstart names it: every path it resolves (a child's HOME and
    /// TMPDIR come from `mcp.state_directory`) is absolute, without a `..`.
    #[test]
    fn paths_from_a_relative_configuration_are_absolute_and_plain() {
        let config = Config::load(Path::new("config/toolgate.toml"), &BTreeMap::new()).unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .canonicalize()
            .unwrap();
        for path in [
            &config.mcp.state_directory,
            &config.bridge.directory,
            &config.artifacts.directory,
            &config.node.directory,
            &config.control.socket,
        ] {
            assert!(path.is_absolute(), "{}", path.display());
            assert!(
                !path
                    .components()
                    .any(|c| c == std::path::Component::ParentDir),
                "{}",
                path.display()
            );
            assert!(path.starts_with(&root), "{}", path.display());
        }
        assert_eq!(config.mcp.state_directory, root.join("var/mcp"));
        assert_eq!(
            config.store.url,
            format!("sqlite://{}", root.join("var/toolgate.db").display())
        );
        assert_eq!(
            beneath(Path::new("/a/b"), Path::new("./../../c/d")),
            PathBuf::from("/c/d")
        );
    }

    /// Every problem in `BASE` followed by `text`, as `check-config` prints them.
    fn problems(text: &str) -> Vec<String> {
        problems_in(&format!("{BASE}{text}"))
    }

    fn problems_in(text: &str) -> Vec<String> {
        let errors = match Config::parse(text) {
            Ok(config) => config.validate().err(),
            Err(errors) => Some(errors),
        };
        errors.map_or_else(Vec::new, |errors| {
            errors.0.iter().map(ToString::to_string).collect()
        })
    }

    #[test]
    fn a_client_document_is_served_over_https_or_on_loopback() {
        let about = |console_url: &str| {
            problems(&format!(
                "[front]\nlisten = \"127.0.0.1:8766\"\n\
                 [console]\nlisten = \"127.0.0.1:8767\"\nurl = \"{console_url}\"\n\
                 consent_key_ref = \"env:KEY\"\n\
                 [[mcp.http_servers]]\nserver_id = \"crm\"\nurl = \"https://crm.example/mcp\"\n\
                 auth = {{ scheme = \"oauth2_user\" }}\n"
            ))
            .into_iter()
            .filter(|problem| problem.contains("credential_ref"))
            .collect::<Vec<_>>()
        };
        assert_eq!(about("https://toolgate.example.com"), Vec::<String>::new());
        assert_eq!(about("http://127.0.0.1:8767"), Vec::<String>::new());
        let [refused] = &about("http://toolgate.example.com")[..] else {
            panic!("one problem");
        };
        assert!(
            refused.starts_with("mcp.http_servers[0].auth.credential_ref: without a registered"),
            "{refused}"
        );
    }

    #[test]
    fn both_server_kinds_read_their_shared_fields_flat() {
        let config = Config::parse(&format!(
            "{BASE}[[mcp.servers]]\nserver_id = \"files\"\ncommand = \"files-mcp\"\n\
             timeout_seconds = 20\n\
             [[mcp.http_servers]]\nserver_id = \"crm\"\nurl = \"https://crm.example/mcp\"\n\
             risk = \"low\"\n"
        ))
        .unwrap();
        let stdio = &config.mcp.servers[0];
        assert_eq!(stdio.common.timeout_seconds, Seconds::new(20));
        assert_eq!(stdio.command, "files-mcp");
        let http = &config.mcp.http_servers[0];
        assert_eq!(http.common.risk, crate::domain::RiskLevel::Low);
        assert_eq!(
            http.common.connect_timeout_seconds.duration(),
            std::time::Duration::from_secs(10)
        );
        assert_eq!(config.operator_server_ids(), ["files", "crm"]);
    }

    #[test]
    fn a_server_refuses_another_kinds_keys_and_names_each_field() {
        let http = "[[mcp.http_servers]]\nserver_id = \"crm\"\nurl = \"https://crm.example/mcp\"\n";
        let [refused] = &problems(&format!("{http}command = \"x\"\n"))[..] else {
            panic!("one problem");
        };
        assert!(refused.starts_with("mcp.http_servers[0].command: unknown field `command`"));
        let [typed] = &problems(&format!("{http}idle_timeout_seconds = \"soon\"\n"))[..] else {
            panic!("one problem");
        };
        assert!(typed.starts_with("mcp.http_servers[0].idle_timeout_seconds: invalid type"));
    }

    #[test]
    fn the_shared_rules_hold_for_both_kinds_and_ids_are_unique_across_them() {
        let found = problems(
            "[limits]\nmaximum_timeout_seconds = 60\n\
             [[mcp.servers]]\nserver_id = \"acme\"\ncommand = \"x\"\ntimeout_seconds = 61\n\
             [[mcp.http_servers]]\nserver_id = \"acme\"\nurl = \"https://a.example/mcp\"\n\
             timeout_seconds = 61\nconnect_timeout_seconds = 0\n",
        );
        for expected in [
            "mcp.servers[0].timeout_seconds: must not exceed limits.maximum_timeout_seconds",
            "mcp.http_servers[0].server_id: duplicates mcp.servers[0].server_id",
            "mcp.http_servers[0].timeout_seconds: must not exceed limits.maximum_timeout_seconds",
            "mcp.http_servers[0].connect_timeout_seconds: must be at least 1",
            "mcp.http_servers[0].url: URL is not permitted by the egress allowlist",
        ] {
            assert!(
                found.iter().any(|problem| problem == expected),
                "{expected} in {found:?}"
            );
        }
    }

    #[test]
    fn the_runtime_leaves_one_core_to_the_servers_and_the_writer_unless_told() {
        let cores = std::thread::available_parallelism().unwrap().get();
        let default = RuntimeConfig::default().worker_threads;
        assert_eq!(default, cores.saturating_sub(1).clamp(1, 64));
        let told = Config::parse(&format!("{BASE}[runtime]\nworker_threads = 3\n")).unwrap();
        assert_eq!(told.runtime.worker_threads, 3);
        assert_eq!(Config::parse(BASE).unwrap().runtime.worker_threads, default);
    }

    #[test]
    fn a_value_that_does_not_parse_stops_at_its_field_and_rules_are_reported_together() {
        assert_eq!(
            problems("[ops]\nlisten = \"localhost\"\n"),
            ["ops.listen: invalid socket address syntax"]
        );
        assert_eq!(
            problems("[egress]\nallow_cidrs = [\"10.0.0.0/8\", \"10.1.2.3/8\"]\n"),
            ["egress.allow_cidrs[1]: must be an address or a CIDR range (10.0.0.0/8, ::1/128)"]
        );
        let mode =
            |mode: &str| BASE.replace("\"s\"\n", &format!("\"s\"\nsocket_mode = \"{mode}\"\n"));
        let rule = "must be octal (0600, 0660), owner read and write, nothing for others";
        assert_eq!(
            problems_in(&format!("{}[runtime]\nworker_threads = 0\n", mode("rw"))),
            [format!("control.socket_mode: {rule}")]
        );
        assert_eq!(
            problems_in(&format!(
                "{}[runtime]\nworker_threads = 0\n[limits]\nturn_connections = 0\n",
                mode("0666")
            )),
            [
                format!("control.socket_mode: {rule}"),
                "limits.turn_connections: must be at least 1".to_owned(),
                "runtime.worker_threads: must be between 1 and 64".to_owned(),
            ]
        );
    }

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
