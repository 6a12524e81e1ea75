//! `[front]`: the MCP front door's listeners, limits and credentials.
//!
//! API keys are configured as the sha256 of the key, never the key; the
//! same entries may live in a file of their own (`front.api_keys_file`),
//! which `serve` reads again on SIGHUP with the same validation.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{ConfigError, ConfigErrors, resolve_group};
use crate::domain::{
    MAXIMUM_LIST_ENTRIES, Principal, TrustLevel, valid_identifier, valid_tenant_id,
};

/// How long a call waiting for approval is held before the client gets the
/// pending result: below the 60 s a common client waits for an answer.
pub const DEFAULT_FRONT_APPROVAL_HOLD_SECONDS: u32 = 30;
/// Calls one MCP session may have in flight at once.
pub const DEFAULT_FRONT_SESSION_IN_FLIGHT: u32 = 8;
/// MCP sessions one credential may hold open on a node.
pub const DEFAULT_FRONT_SESSIONS_PER_CREDENTIAL: u32 = 64;
/// Connections the front door holds at once, both listeners together.
pub const DEFAULT_FRONT_CONNECTIONS: u32 = 256;
/// How often an SSE response with nothing to say sends a comment.
pub const DEFAULT_FRONT_KEEP_ALIVE_SECONDS: u32 = 15;
/// Clock skew a token's `exp` and `nbf` are given by default.
pub const DEFAULT_JWT_LEEWAY_SECONDS: u32 = 60;
/// The most skew an operator may allow.
pub const MAXIMUM_JWT_LEEWAY_SECONDS: u32 = 300;
/// How often a fetched key set is fetched again.
pub const DEFAULT_JWKS_REFRESH_SECONDS: u32 = 300;

/// The MCP front door. Off unless `listen` or `socket` is set.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FrontConfig {
    /// TCP address (`127.0.0.1:8766`, or a pod's address behind a TLS
    /// proxy); off when unset.
    #[serde(default)]
    pub listen: Option<String>,
    /// Unix socket; relative paths are under the config's folder.
    #[serde(default)]
    pub socket: Option<PathBuf>,
    /// The socket's mode, in octal, as `control.socket_mode`.
    #[serde(default = "FrontConfig::default_socket_mode")]
    pub socket_mode: String,
    /// The group the socket is given.
    #[serde(default)]
    pub socket_group: Option<String>,
    /// `Host` values TCP requests may carry (DNS rebinding); the loopback
    /// names when unset, and required when `listen` is not loopback.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Browser origins allowed to send requests (`https://app.example:443`)
    /// besides the endpoint's own hosts; a TCP request naming any other
    /// origin is refused.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// The endpoint's public URL, as clients reach it
    /// (`https://tools.example.com/mcp`): the protected resource RFC 9728
    /// names. When unset it is taken from the request's allowed `Host`.
    #[serde(default)]
    pub resource: Option<String>,
    /// The authorization servers a client may get a token from, advertised
    /// in the protected-resource metadata.
    #[serde(default)]
    pub authorization_servers: Vec<String>,
    /// Scopes advertised in the metadata (what a token should ask for).
    #[serde(default)]
    pub scopes_supported: Vec<String>,
    /// How long a call waiting for approval holds its request.
    #[serde(default = "FrontConfig::default_approval_hold")]
    pub approval_hold_seconds: u32,
    /// Calls one session may have in flight.
    #[serde(default = "FrontConfig::default_session_in_flight")]
    pub session_in_flight: u32,
    /// Sessions one credential may hold open on this node.
    #[serde(default = "FrontConfig::default_sessions_per_credential")]
    pub sessions_per_credential: u32,
    /// Connections held at once.
    #[serde(default = "FrontConfig::default_connections")]
    pub connections: u32,
    /// SSE keep-alive interval.
    #[serde(default = "FrontConfig::default_keep_alive")]
    pub keep_alive_seconds: u32,
    /// API keys, by the sha256 of each key.
    #[serde(default)]
    pub api_keys: Vec<ApiKeyConfig>,
    /// A TOML file of `[[api_keys]]` entries, read at start and on SIGHUP.
    #[serde(default)]
    pub api_keys_file: Option<PathBuf>,
    /// Bearer tokens from the operator's identity provider.
    #[serde(default)]
    pub jwt: Option<JwtConfig>,
}

impl Default for FrontConfig {
    fn default() -> Self {
        FrontConfig {
            listen: None,
            socket: None,
            socket_mode: FrontConfig::default_socket_mode(),
            socket_group: None,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            resource: None,
            authorization_servers: Vec::new(),
            scopes_supported: Vec::new(),
            approval_hold_seconds: DEFAULT_FRONT_APPROVAL_HOLD_SECONDS,
            session_in_flight: DEFAULT_FRONT_SESSION_IN_FLIGHT,
            sessions_per_credential: DEFAULT_FRONT_SESSIONS_PER_CREDENTIAL,
            connections: DEFAULT_FRONT_CONNECTIONS,
            keep_alive_seconds: DEFAULT_FRONT_KEEP_ALIVE_SECONDS,
            api_keys: Vec::new(),
            api_keys_file: None,
            jwt: None,
        }
    }
}

impl FrontConfig {
    fn default_socket_mode() -> String {
        "0600".to_owned()
    }
    fn default_approval_hold() -> u32 {
        DEFAULT_FRONT_APPROVAL_HOLD_SECONDS
    }
    fn default_session_in_flight() -> u32 {
        DEFAULT_FRONT_SESSION_IN_FLIGHT
    }
    fn default_sessions_per_credential() -> u32 {
        DEFAULT_FRONT_SESSIONS_PER_CREDENTIAL
    }
    fn default_connections() -> u32 {
        DEFAULT_FRONT_CONNECTIONS
    }
    fn default_keep_alive() -> u32 {
        DEFAULT_FRONT_KEEP_ALIVE_SECONDS
    }

    /// Whether any listener is configured.
    pub fn enabled(&self) -> bool {
        self.listen.is_some() || self.socket.is_some()
    }

    /// The socket's mode bits; the file is validated, so this parses.
    pub fn socket_mode_bits(&self) -> u32 {
        u32::from_str_radix(&self.socket_mode, 8).unwrap_or(0o600)
    }

    /// The `Host` values TCP requests may carry.
    pub fn hosts(&self) -> Vec<String> {
        if self.allowed_hosts.is_empty() {
            ["localhost", "127.0.0.1", "::1"]
                .map(str::to_owned)
                .to_vec()
        } else {
            self.allowed_hosts.clone()
        }
    }

    pub(super) fn resolve_paths(&mut self, resolve: &dyn Fn(&mut PathBuf)) {
        if let Some(socket) = self.socket.as_mut() {
            resolve(socket);
        }
        if let Some(file) = self.api_keys_file.as_mut() {
            resolve(file);
        }
        if let Some(jwks) = self.jwt.as_mut().and_then(|jwt| jwt.jwks_file.as_mut()) {
            resolve(jwks);
        }
    }

    pub(super) fn validate(&self, push: &mut dyn FnMut(String, String)) {
        if !self.enabled() {
            return;
        }
        if let Some(listen) = &self.listen {
            match listen.parse::<SocketAddr>() {
                Ok(address) if !address.ip().is_loopback() && self.allowed_hosts.is_empty() => {
                    push(
                        "front.allowed_hosts".into(),
                        "required when front.listen is not a loopback address (the names clients reach it by)".into(),
                    )
                }
                Ok(_) => {}
                Err(_) => push(
                    "front.listen".into(),
                    "must be an address like 127.0.0.1:8766".into(),
                ),
            }
        }
        match u32::from_str_radix(&self.socket_mode, 8) {
            Ok(mode) if mode & !0o770 == 0 && mode & 0o600 == 0o600 => {}
            _ => push(
                "front.socket_mode".into(),
                "must be octal (0600, 0660), owner read and write, nothing for others".into(),
            ),
        }
        if let Some(group) = &self.socket_group
            && resolve_group(group).is_none()
        {
            push(
                "front.socket_group".into(),
                "names no group of this system".into(),
            );
        }
        for (index, host) in self.allowed_hosts.iter().enumerate() {
            if host.is_empty()
                || host.len() > 255
                || host
                    .bytes()
                    .any(|b| b.is_ascii_whitespace() || b.is_ascii_control() || b == b'/')
            {
                push(
                    format!("front.allowed_hosts[{index}]"),
                    "must be a host name or host:port".into(),
                );
            }
        }
        for (index, origin) in self.allowed_origins.iter().enumerate() {
            if !(origin.starts_with("https://") || origin.starts_with("http://"))
                || origin.len() > 255
            {
                push(
                    format!("front.allowed_origins[{index}]"),
                    "must be an origin like https://app.example.com:443".into(),
                );
            }
        }
        if let Some(resource) = &self.resource
            && !plain_url(resource)
        {
            push(
                "front.resource".into(),
                "must be the endpoint's https:// (or loopback http://) URL, without query or fragment".into(),
            );
        }
        for (index, server) in self.authorization_servers.iter().enumerate() {
            if !plain_url(server) {
                push(
                    format!("front.authorization_servers[{index}]"),
                    "must be an https:// URL without query or fragment".into(),
                );
            }
        }
        if self
            .scopes_supported
            .iter()
            .any(|scope| !valid_identifier(scope))
        {
            push(
                "front.scopes_supported".into(),
                "entries must be 1 to 256 bytes without control characters".into(),
            );
        }
        for (field, value, range) in [
            (
                "front.approval_hold_seconds",
                self.approval_hold_seconds,
                1..=3600,
            ),
            ("front.session_in_flight", self.session_in_flight, 1..=256),
            (
                "front.sessions_per_credential",
                self.sessions_per_credential,
                1..=100_000,
            ),
            ("front.connections", self.connections, 1..=65_536),
            ("front.keep_alive_seconds", self.keep_alive_seconds, 1..=300),
        ] {
            if !range.contains(&value) {
                push(
                    field.into(),
                    format!("must be between {} and {}", range.start(), range.end()),
                );
            }
        }
        validate_api_keys(&self.api_keys, "front.api_keys", push);
        if let Some(file) = &self.api_keys_file {
            match read_api_keys_file(file) {
                Ok(keys) => {
                    let mut hashes: BTreeSet<&str> = self
                        .api_keys
                        .iter()
                        .map(|key| key.sha256.as_str())
                        .collect();
                    let mut ids: BTreeSet<&str> =
                        self.api_keys.iter().map(|key| key.id.as_str()).collect();
                    if keys
                        .iter()
                        .any(|key| !hashes.insert(&key.sha256) || !ids.insert(&key.id))
                    {
                        push(
                            "front.api_keys_file".into(),
                            "repeats an id or a key of front.api_keys".into(),
                        );
                    }
                }
                Err(errors) => {
                    for error in errors.0 {
                        push(
                            format!("front.api_keys_file: {}", error.path),
                            error.message,
                        );
                    }
                }
            }
        }
        if let Some(jwt) = &self.jwt {
            jwt.validate(push);
        }
        if self.api_keys.is_empty() && self.api_keys_file.is_none() && self.jwt.is_none() {
            push(
                "front".into(),
                "nothing is anonymous: configure front.api_keys, front.api_keys_file or front.jwt"
                    .into(),
            );
        }
    }
}

/// An `https://` URL, or `http://` to a loopback host, with no query,
/// fragment, credentials or whitespace.
fn plain_url(text: &str) -> bool {
    let rest = if let Some(rest) = text.strip_prefix("https://") {
        rest
    } else if let Some(rest) = text.strip_prefix("http://") {
        let host = rest.split(['/', ':']).next().unwrap_or_default();
        if !(rest.starts_with("[::1]") || matches!(host, "localhost" | "127.0.0.1")) {
            return false;
        }
        rest
    } else {
        return false;
    };
    !rest.is_empty()
        && text.len() <= 2048
        && !rest.starts_with('/')
        && !rest.bytes().any(|b| {
            b.is_ascii_whitespace() || b.is_ascii_control() || matches!(b, b'?' | b'#' | b'@')
        })
}

/// One API key: who a request presenting it is.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// Names the key in logs and limits (never the key itself).
    pub id: String,
    /// Lowercase hex sha256 of the key (`toolgate key` prints both).
    pub sha256: String,
    /// The tenant whose records its calls write.
    pub tenant_id: String,
    /// Who its calls act for.
    pub principal: Principal,
    /// The agent's tool patterns (globs over registry names).
    pub tools: Vec<String>,
    /// The most trust a call through this key is given: `user` unless the
    /// operator says the model behind it reads untrusted content
    /// (`external_untrusted`).
    #[serde(default = "default_origin_trust")]
    pub origin_trust: TrustLevel,
}

fn default_origin_trust() -> TrustLevel {
    TrustLevel::User
}

/// The file `front.api_keys_file` names.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApiKeysFile {
    #[serde(default)]
    api_keys: Vec<ApiKeyConfig>,
}

/// Reads and validates an API keys file: the entries, or every problem.
pub fn read_api_keys_file(path: &Path) -> Result<Vec<ApiKeyConfig>, ConfigErrors> {
    let one = |path: String, message: String| ConfigErrors(vec![ConfigError { path, message }]);
    let text = std::fs::read_to_string(path).map_err(|error| {
        one(
            "(file)".into(),
            format!("cannot read {}: {}", path.display(), error.kind()),
        )
    })?;
    let deserializer = toml::Deserializer::parse(&text)
        .map_err(|error| one("(file)".into(), error.message().to_owned()))?;
    let file: ApiKeysFile = serde_path_to_error::deserialize(deserializer).map_err(|error| {
        let path = error.path().to_string();
        one(path, super::without_values(error.into_inner().message()))
    })?;
    let mut errors = Vec::new();
    validate_api_keys(&file.api_keys, "api_keys", &mut |path, message| {
        errors.push(ConfigError { path, message })
    });
    if errors.is_empty() {
        Ok(file.api_keys)
    } else {
        Err(ConfigErrors(errors))
    }
}

fn validate_api_keys(keys: &[ApiKeyConfig], at: &str, push: &mut dyn FnMut(String, String)) {
    let mut ids = BTreeSet::new();
    let mut hashes = BTreeSet::new();
    for (index, key) in keys.iter().enumerate() {
        let path = |field: &str| format!("{at}[{index}].{field}");
        let id_ok = (1..=64).contains(&key.id.len())
            && key
                .id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !id_ok {
            push(
                path("id"),
                "must be 1 to 64 letters, digits, '-', '_' or '.'".into(),
            );
        } else if !ids.insert(key.id.as_str()) {
            push(path("id"), "repeats another key's id".into());
        }
        let hash_ok = key.sha256.len() == 64
            && key
                .sha256
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !hash_ok {
            push(
                path("sha256"),
                "must be 64 lowercase hex digits (the key's sha256, never the key)".into(),
            );
        } else if !hashes.insert(key.sha256.as_str()) {
            push(path("sha256"), "repeats another key's hash".into());
        }
        if !valid_tenant_id(&key.tenant_id) {
            push(
                path("tenant_id"),
                "must be 1 to 128 letters, digits, '-' or '_'".into(),
            );
        }
        if !valid_identifier(&key.principal.id)
            || key.principal.scopes.len() > MAXIMUM_LIST_ENTRIES
            || !key
                .principal
                .scopes
                .iter()
                .all(|scope| valid_identifier(scope))
        {
            push(
                path("principal"),
                "id and scopes must be 1 to 256 bytes without control characters, at most 1,024 scopes".into(),
            );
        }
        if key.tools.is_empty()
            || key.tools.len() > MAXIMUM_LIST_ENTRIES
            || !key.tools.iter().all(|pattern| valid_identifier(pattern))
        {
            push(path("tools"), "must list 1 to 1,024 tool patterns".into());
        }
    }
}

/// JWT bearer tokens: whose keys, which issuer and audience, and where in
/// the claims the tenant, the principal and its scopes are.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    /// The `iss` every token must carry.
    pub issuer: String,
    /// `aud` values accepted (a token must name one).
    pub audiences: Vec<String>,
    /// A JWK set on disk.
    #[serde(default)]
    pub jwks_file: Option<PathBuf>,
    /// A JWK set fetched through egress (its host must be allowed there).
    #[serde(default)]
    pub jwks_url: Option<String>,
    /// How often the fetched set is fetched again.
    #[serde(default = "JwtConfig::default_refresh")]
    pub jwks_refresh_seconds: u32,
    /// Signature algorithms accepted.
    #[serde(default = "JwtConfig::default_algorithms")]
    pub algorithms: Vec<String>,
    /// Clock skew allowed on `exp` and `nbf`.
    #[serde(default = "JwtConfig::default_leeway")]
    pub leeway_seconds: u32,
    /// Every token's tenant, when the provider serves one tenant.
    #[serde(default)]
    pub tenant_id: Option<String>,
    /// The claim naming the tenant (when `tenant_id` is unset).
    #[serde(default = "JwtConfig::default_tenant_claim")]
    pub tenant_claim: String,
    /// The claim naming the principal.
    #[serde(default = "JwtConfig::default_principal_claim")]
    pub principal_claim: String,
    /// The claim holding the scopes: a space-separated string or an array.
    #[serde(default = "JwtConfig::default_scopes_claim")]
    pub scopes_claim: String,
    /// The agent's tool patterns for every token.
    pub tools: Vec<String>,
    /// The most trust a call through a token is given.
    #[serde(default = "default_origin_trust")]
    pub origin_trust: TrustLevel,
}

/// The algorithms `jwt.algorithms` may name.
pub const JWT_ALGORITHMS: &[&str] = &[
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA",
];

impl JwtConfig {
    fn default_refresh() -> u32 {
        DEFAULT_JWKS_REFRESH_SECONDS
    }
    fn default_algorithms() -> Vec<String> {
        vec!["RS256".into(), "ES256".into()]
    }
    fn default_leeway() -> u32 {
        DEFAULT_JWT_LEEWAY_SECONDS
    }
    fn default_tenant_claim() -> String {
        "tenant_id".into()
    }
    fn default_principal_claim() -> String {
        "sub".into()
    }
    fn default_scopes_claim() -> String {
        "scope".into()
    }

    fn validate(&self, push: &mut dyn FnMut(String, String)) {
        if self.issuer.is_empty() || self.issuer.len() > 2048 {
            push(
                "front.jwt.issuer".into(),
                "must name the token issuer".into(),
            );
        }
        if self.audiences.is_empty()
            || self
                .audiences
                .iter()
                .any(|aud| aud.is_empty() || aud.len() > 2048)
        {
            push(
                "front.jwt.audiences".into(),
                "must list the audiences a token may name".into(),
            );
        }
        match (&self.jwks_file, &self.jwks_url) {
            (Some(_), Some(_)) | (None, None) => push(
                "front.jwt".into(),
                "set exactly one of jwks_file and jwks_url".into(),
            ),
            (Some(file), None) if !file.is_file() => push(
                "front.jwt.jwks_file".into(),
                "does not name a readable file".into(),
            ),
            (None, Some(url)) if !url.starts_with("https://") && !url.starts_with("http://") => {
                push(
                    "front.jwt.jwks_url".into(),
                    "must be an http(s):// URL egress allows".into(),
                )
            }
            _ => {}
        }
        if !(10..=86_400).contains(&self.jwks_refresh_seconds) {
            push(
                "front.jwt.jwks_refresh_seconds".into(),
                "must be between 10 and 86400".into(),
            );
        }
        if self.algorithms.is_empty()
            || self
                .algorithms
                .iter()
                .any(|alg| !JWT_ALGORITHMS.contains(&alg.as_str()))
        {
            push(
                "front.jwt.algorithms".into(),
                format!("must list algorithms among {}", JWT_ALGORITHMS.join(", ")),
            );
        }
        if self.leeway_seconds > MAXIMUM_JWT_LEEWAY_SECONDS {
            push(
                "front.jwt.leeway_seconds".into(),
                format!("must be at most {MAXIMUM_JWT_LEEWAY_SECONDS}"),
            );
        }
        if let Some(tenant) = &self.tenant_id
            && !valid_tenant_id(tenant)
        {
            push(
                "front.jwt.tenant_id".into(),
                "must be 1 to 128 letters, digits, '-' or '_'".into(),
            );
        }
        for (field, claim) in [
            ("front.jwt.tenant_claim", &self.tenant_claim),
            ("front.jwt.principal_claim", &self.principal_claim),
            ("front.jwt.scopes_claim", &self.scopes_claim),
        ] {
            if claim.is_empty() || claim.len() > 128 {
                push(field.into(), "must name a claim".into());
            }
        }
        if self.tools.is_empty()
            || self.tools.len() > MAXIMUM_LIST_ENTRIES
            || !self.tools.iter().all(|pattern| valid_identifier(pattern))
        {
            push(
                "front.jwt.tools".into(),
                "must list 1 to 1,024 tool patterns".into(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_urls_are_plain() {
        assert!(plain_url("https://tools.example.com/mcp"));
        assert!(plain_url("http://127.0.0.1:8766/mcp"));
        assert!(plain_url("http://localhost:8766/mcp"));
        assert!(plain_url("http://[::1]:8766/mcp"));
        assert!(!plain_url("http://tools.example.com/mcp"));
        assert!(!plain_url("https://tools.example.com/mcp?x=1"));
        assert!(!plain_url("https://user@tools.example.com/mcp"));
        assert!(!plain_url("https:///mcp"));
        assert!(!plain_url("ftp://tools.example.com"));
        assert!(!plain_url("http://[fe80::1]:8766/mcp"));
    }
}
