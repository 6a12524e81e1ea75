//! `[front]`: the MCP front door's listeners, limits and credentials.
//!
//! API keys are configured as the sha256 of the key, never the key; the
//! same entries may live in a file of their own (`front.api_keys_file`),
//! which `serve` reads again on SIGHUP with the same validation.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::values::{Seconds, SocketMode, count};
use super::{ConfigErrors, Problems, resolve_group};
use crate::domain::{
    MAXIMUM_LIST_ENTRIES, Principal, TrustLevel, valid_identifier, valid_tenant_id,
};

/// How long a call waiting for approval is held before the client gets the
/// pending result: below the 60 s a common client waits for an answer.
pub const DEFAULT_FRONT_APPROVAL_HOLD_SECONDS: u32 = 30;
/// Calls one MCP session may have in flight at once.
pub const DEFAULT_FRONT_SESSION_IN_FLIGHT: usize = 8;
/// MCP sessions one credential may hold open on a node.
pub const DEFAULT_FRONT_SESSIONS_PER_CREDENTIAL: usize = 64;
/// Connections the front door holds at once, both listeners together.
pub const DEFAULT_FRONT_CONNECTIONS: usize = 256;
/// How long a new connection may take to send its first whole request head.
pub const DEFAULT_FRONT_FIRST_REQUEST_SECONDS: u32 = 5;
/// How often an SSE response with nothing to say sends a comment.
pub const DEFAULT_FRONT_KEEP_ALIVE_SECONDS: u32 = 15;
/// How long a call whose answer was never delivered is the same call when
/// its caller asks again: a client's reconnect and retry, with room.
pub const DEFAULT_FRONT_REISSUE_WINDOW_SECONDS: u32 = 600;
/// Clock skew a token's `exp` and `nbf` are given by default.
pub const DEFAULT_JWT_LEEWAY_SECONDS: u32 = 60;
/// The most skew an operator may allow.
pub const MAXIMUM_JWT_LEEWAY_SECONDS: u32 = 300;
/// How often a fetched key set is fetched again.
pub const DEFAULT_JWKS_REFRESH_SECONDS: u32 = 300;

/// The MCP front door. Off unless `listen` or `socket` is set.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct FrontConfig {
    /// TCP address (`127.0.0.1:8766`, or a pod's address behind a TLS
    /// proxy); off when unset.
    pub listen: Option<SocketAddr>,
    /// Unix socket; relative paths are under the config's folder.
    pub socket: Option<PathBuf>,
    /// The socket's mode, in octal, as `control.socket_mode`.
    pub socket_mode: SocketMode,
    /// The group the socket is given.
    pub socket_group: Option<String>,
    /// `Host` values TCP requests may carry (DNS rebinding); the loopback
    /// names when unset, and required when `listen` is not loopback.
    pub allowed_hosts: Vec<String>,
    /// Browser origins allowed to send requests (`https://app.example:443`)
    /// besides the endpoint's own hosts; a TCP request naming any other
    /// origin is refused.
    pub allowed_origins: Vec<String>,
    /// The endpoint's public URL, as clients reach it
    /// (`https://tools.example.com/mcp`): the protected resource RFC 9728
    /// names. When unset it is taken from the request's allowed `Host`.
    pub resource: Option<String>,
    /// The authorization servers a client may get a token from, advertised
    /// in the protected-resource metadata.
    pub authorization_servers: Vec<String>,
    /// Scopes advertised in the metadata (what a token should ask for).
    pub scopes_supported: Vec<String>,
    /// How long a call waiting for approval holds its request.
    pub approval_hold_seconds: Seconds,
    /// Calls one session may have in flight.
    #[serde(deserialize_with = "count")]
    pub session_in_flight: usize,
    /// Calls one credential may have in flight across its sessions; an
    /// eighth of `connections` (at most the tenant's) when unset.
    pub credential_in_flight: Option<usize>,
    /// Calls one tenant may have in flight across its credentials; a
    /// quarter of `connections` when unset.
    pub tenant_in_flight: Option<usize>,
    /// Sessions one credential may hold open on this node.
    #[serde(deserialize_with = "count")]
    pub sessions_per_credential: usize,
    /// Connections held at once.
    #[serde(deserialize_with = "count")]
    pub connections: usize,
    /// SSE keep-alive interval.
    pub keep_alive_seconds: Seconds,
    /// A new connection that has not sent a whole request head within this
    /// is closed: an unauthenticated peer holds a place this long at most.
    pub first_request_seconds: Seconds,
    /// How long a call whose answer was never delivered is the same call
    /// when the same principal asks for it again.
    pub reissue_window_seconds: Seconds,
    /// API keys, by the sha256 of each key.
    pub api_keys: Vec<ApiKeyConfig>,
    /// A TOML file of `[[api_keys]]` entries, read at start and on SIGHUP.
    pub api_keys_file: Option<PathBuf>,
    /// Bearer tokens from the operator's identity provider.
    pub jwt: Option<JwtConfig>,
}

impl Default for FrontConfig {
    fn default() -> Self {
        FrontConfig {
            listen: None,
            socket: None,
            socket_mode: SocketMode::default(),
            socket_group: None,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            resource: None,
            authorization_servers: Vec::new(),
            scopes_supported: Vec::new(),
            approval_hold_seconds: Seconds::new(DEFAULT_FRONT_APPROVAL_HOLD_SECONDS),
            session_in_flight: DEFAULT_FRONT_SESSION_IN_FLIGHT,
            credential_in_flight: None,
            tenant_in_flight: None,
            sessions_per_credential: DEFAULT_FRONT_SESSIONS_PER_CREDENTIAL,
            connections: DEFAULT_FRONT_CONNECTIONS,
            keep_alive_seconds: Seconds::new(DEFAULT_FRONT_KEEP_ALIVE_SECONDS),
            first_request_seconds: Seconds::new(DEFAULT_FRONT_FIRST_REQUEST_SECONDS),
            reissue_window_seconds: Seconds::new(DEFAULT_FRONT_REISSUE_WINDOW_SECONDS),
            api_keys: Vec::new(),
            api_keys_file: None,
            jwt: None,
        }
    }
}

impl FrontConfig {
    /// Whether any listener is configured.
    pub fn enabled(&self) -> bool {
        self.listen.is_some() || self.socket.is_some()
    }

    /// Calls one tenant may have in flight: as set, else a quarter of the
    /// door's connections, so the rest stay for other tenants and for new
    /// connections.
    pub fn tenant_in_flight(&self) -> usize {
        self.tenant_in_flight
            .unwrap_or((self.connections / 4).max(1))
    }

    /// Calls one credential may have in flight: as set, else an eighth of
    /// the door's connections, never more than its tenant's.
    pub fn credential_in_flight(&self) -> usize {
        self.credential_in_flight
            .unwrap_or((self.connections / 8).max(1).min(self.tenant_in_flight()))
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

    /// The section's rules; none while the front door is off.
    pub(super) fn validate(&self, problems: &mut Problems) {
        if !self.enabled() {
            return;
        }
        self.validate_listeners(problems);
        self.validate_web(problems);
        problems.between(
            "front.approval_hold_seconds",
            self.approval_hold_seconds.get(),
            1,
            3600,
        );
        problems.between("front.session_in_flight", self.session_in_flight, 1, 256);
        problems.between(
            "front.sessions_per_credential",
            self.sessions_per_credential,
            1,
            100_000,
        );
        problems.between("front.connections", self.connections, 1, 65_536);
        // Limits that add up: no credential's calls exceed its tenant's,
        // and no tenant holds more than half the door's connections.
        if self.credential_in_flight == Some(0) {
            problems.push("front.credential_in_flight", "must be at least 1");
        }
        if self.tenant_in_flight == Some(0) {
            problems.push("front.tenant_in_flight", "must be at least 1");
        }
        if self.credential_in_flight() > self.tenant_in_flight() {
            problems.push(
                "front.credential_in_flight",
                "must not exceed front.tenant_in_flight",
            );
        }
        if self.tenant_in_flight() > (self.connections / 2).max(1) {
            problems.push(
                "front.tenant_in_flight",
                "must be at most half of front.connections: the rest are other tenants' and new connections'",
            );
        }
        problems.between(
            "front.first_request_seconds",
            self.first_request_seconds.get(),
            1,
            60,
        );
        problems.between(
            "front.keep_alive_seconds",
            self.keep_alive_seconds.get(),
            1,
            300,
        );
        // Within what a non-idempotent twin is remembered for.
        problems.between(
            "front.reissue_window_seconds",
            self.reissue_window_seconds.get(),
            1,
            86_400,
        );
        self.validate_credentials(problems);
    }

    fn validate_listeners(&self, problems: &mut Problems) {
        if let Some(listen) = self.listen
            && !listen.ip().is_loopback()
            && self.allowed_hosts.is_empty()
        {
            problems.push(
                "front.allowed_hosts",
                "required when front.listen is not a loopback address (the names clients reach it by)",
            );
        }
        if let Some(problem) = self.socket_mode.problem() {
            problems.push("front.socket_mode", problem);
        }
        if let Some(group) = &self.socket_group
            && resolve_group(group).is_none()
        {
            problems.push("front.socket_group", "names no group of this system");
        }
    }

    /// What a browser and an MCP client's discovery see: hosts, origins and
    /// the protected-resource metadata.
    fn validate_web(&self, problems: &mut Problems) {
        for (index, host) in self.allowed_hosts.iter().enumerate() {
            if host.is_empty()
                || host.len() > 255
                || host.bytes().any(|b| {
                    b.is_ascii_whitespace() || b.is_ascii_control() || matches!(b, b'/' | b'@')
                })
            {
                problems.push(
                    format!("front.allowed_hosts[{index}]"),
                    "must be a host name or host:port",
                );
            }
        }
        for (index, origin) in self.allowed_origins.iter().enumerate() {
            if !(origin.starts_with("https://") || origin.starts_with("http://"))
                || origin.len() > 255
            {
                problems.push(
                    format!("front.allowed_origins[{index}]"),
                    "must be an origin like https://app.example.com:443",
                );
            }
        }
        if let Some(resource) = &self.resource
            && !plain_url(resource)
        {
            problems.push(
                "front.resource",
                "must be the endpoint's https:// (or loopback http://) URL, without query or fragment",
            );
        }
        for (index, server) in self.authorization_servers.iter().enumerate() {
            if !plain_url(server) {
                problems.push(
                    format!("front.authorization_servers[{index}]"),
                    "must be an https:// URL without query or fragment",
                );
            }
        }
        if self
            .scopes_supported
            .iter()
            .any(|scope| !valid_identifier(scope))
        {
            problems.push(
                "front.scopes_supported",
                "entries must be 1 to 256 bytes without control characters",
            );
        }
    }

    /// API keys, their file, and JWTs: at least one of them, none repeated.
    fn validate_credentials(&self, problems: &mut Problems) {
        validate_api_keys(&self.api_keys, "front.api_keys", problems);
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
                        problems.push(
                            "front.api_keys_file",
                            "repeats an id or a key of front.api_keys",
                        );
                    }
                }
                Err(errors) => {
                    for error in errors.0 {
                        problems.push(
                            format!("front.api_keys_file: {}", error.path),
                            error.message,
                        );
                    }
                }
            }
        }
        if let Some(jwt) = &self.jwt {
            jwt.validate(problems);
        }
        if self.api_keys.is_empty() && self.api_keys_file.is_none() && self.jwt.is_none() {
            problems.push(
                "front",
                "nothing is anonymous: configure front.api_keys, front.api_keys_file or front.jwt",
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
    /// The most trust a call through this key is given. An MCP client's
    /// context is not known to be the user's, so the design's most
    /// restrictive reading, `external_untrusted`, unless the operator
    /// declares more (`user`: the model behind the key reads only what its
    /// user wrote).
    #[serde(default = "default_origin_trust")]
    pub origin_trust: TrustLevel,
}

fn default_origin_trust() -> TrustLevel {
    TrustLevel::ExternalUntrusted
}

fn default_maximum_origin_trust() -> TrustLevel {
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
    let file: ApiKeysFile = super::read_entries_file(path)?;
    let mut problems = Problems::default();
    validate_api_keys(&file.api_keys, "api_keys", &mut problems);
    problems.into_result().map(|()| file.api_keys)
}

fn validate_api_keys(keys: &[ApiKeyConfig], at: &str, problems: &mut Problems) {
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
            problems.push(
                path("id"),
                "must be 1 to 64 letters, digits, '-', '_' or '.'",
            );
        } else if !ids.insert(key.id.as_str()) {
            problems.push(path("id"), "repeats another key's id");
        }
        let hash_ok = key.sha256.len() == 64
            && key
                .sha256
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !hash_ok {
            problems.push(
                path("sha256"),
                "must be 64 lowercase hex digits (the key's sha256, never the key)",
            );
        } else if !hashes.insert(key.sha256.as_str()) {
            problems.push(path("sha256"), "repeats another key's hash");
        }
        if !valid_tenant_id(&key.tenant_id) {
            problems.push(
                path("tenant_id"),
                "must be 1 to 128 letters, digits, '-' or '_'",
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
            problems.push(
                path("principal"),
                "id and scopes must be 1 to 256 bytes without control characters, at most 1,024 scopes",
            );
        }
        if key.tools.is_empty()
            || key.tools.len() > MAXIMUM_LIST_ENTRIES
            || !key.tools.iter().all(|pattern| valid_identifier(pattern))
        {
            problems.push(path("tools"), "must list 1 to 1,024 tool patterns");
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
    pub jwks_refresh_seconds: Seconds,
    /// Signature algorithms accepted.
    #[serde(default = "JwtConfig::default_algorithms")]
    pub algorithms: Vec<JwtAlgorithm>,
    /// Clock skew allowed on `exp` and `nbf`.
    #[serde(default = "JwtConfig::default_leeway")]
    pub leeway_seconds: Seconds,
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
    /// The trust a call through a token is given when the token does not
    /// say (as `api_keys[].origin_trust`).
    #[serde(default = "default_origin_trust")]
    pub origin_trust: TrustLevel,
    /// A claim that states a token's origin trust (a trust label), when
    /// the identity provider knows whose context the client runs in.
    #[serde(default)]
    pub origin_trust_claim: Option<String>,
    /// The most that claim may raise a token's trust to.
    #[serde(default = "default_maximum_origin_trust")]
    pub maximum_origin_trust: TrustLevel,
}

/// The signature algorithms `jwt.algorithms` may name: asymmetric ones
/// only, so toolgate never holds a key that could sign a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum JwtAlgorithm {
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    #[serde(rename = "RS256")]
    Rs256,
    /// RSASSA-PKCS1-v1_5 with SHA-384.
    #[serde(rename = "RS384")]
    Rs384,
    /// RSASSA-PKCS1-v1_5 with SHA-512.
    #[serde(rename = "RS512")]
    Rs512,
    /// RSASSA-PSS with SHA-256.
    #[serde(rename = "PS256")]
    Ps256,
    /// RSASSA-PSS with SHA-384.
    #[serde(rename = "PS384")]
    Ps384,
    /// RSASSA-PSS with SHA-512.
    #[serde(rename = "PS512")]
    Ps512,
    /// ECDSA on P-256 with SHA-256.
    #[serde(rename = "ES256")]
    Es256,
    /// ECDSA on P-384 with SHA-384.
    #[serde(rename = "ES384")]
    Es384,
    /// Ed25519.
    #[serde(rename = "EdDSA")]
    EdDsa,
}

impl JwtConfig {
    fn default_refresh() -> Seconds {
        Seconds::new(DEFAULT_JWKS_REFRESH_SECONDS)
    }
    fn default_algorithms() -> Vec<JwtAlgorithm> {
        vec![JwtAlgorithm::Rs256, JwtAlgorithm::Es256]
    }
    fn default_leeway() -> Seconds {
        Seconds::new(DEFAULT_JWT_LEEWAY_SECONDS)
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

    fn validate(&self, problems: &mut Problems) {
        if self.issuer.is_empty() || self.issuer.len() > 2048 {
            problems.push("front.jwt.issuer", "must name the token issuer");
        }
        if self.audiences.is_empty()
            || self
                .audiences
                .iter()
                .any(|aud| aud.is_empty() || aud.len() > 2048)
        {
            problems.push(
                "front.jwt.audiences",
                "must list the audiences a token may name",
            );
        }
        match (&self.jwks_file, &self.jwks_url) {
            (Some(_), Some(_)) | (None, None) => {
                problems.push("front.jwt", "set exactly one of jwks_file and jwks_url")
            }
            (Some(file), None) if !file.is_file() => {
                problems.push("front.jwt.jwks_file", "does not name a readable file")
            }
            (None, Some(url)) if !url.starts_with("https://") && !url.starts_with("http://") => {
                problems.push(
                    "front.jwt.jwks_url",
                    "must be an http(s):// URL egress allows",
                )
            }
            // Keys fetched in the clear let anyone on the path mint tokens
            // for every tenant.
            (None, Some(url)) if !plain_url(url) => problems.push(
                "front.jwt.jwks_url",
                "must be https:// (http:// only for a loopback address), without credentials, query or fragment",
            ),
            _ => {}
        }
        problems.between(
            "front.jwt.jwks_refresh_seconds",
            self.jwks_refresh_seconds.get(),
            10,
            86_400,
        );
        if self.origin_trust > self.maximum_origin_trust {
            problems.push(
                "front.jwt.origin_trust",
                "must not exceed front.jwt.maximum_origin_trust",
            );
        }
        if self.maximum_origin_trust > TrustLevel::User {
            problems.push(
                "front.jwt.maximum_origin_trust",
                "must be at most user: a token's caller is never the platform or its configuration",
            );
        }
        if self
            .origin_trust_claim
            .as_ref()
            .is_some_and(|claim| claim.is_empty() || claim.len() > 256)
        {
            problems.push("front.jwt.origin_trust_claim", "must be 1 to 256 bytes");
        }
        if self.algorithms.is_empty() {
            problems.push("front.jwt.algorithms", "must list the algorithms accepted");
        }
        if self.leeway_seconds.get() > MAXIMUM_JWT_LEEWAY_SECONDS {
            problems.push(
                "front.jwt.leeway_seconds",
                format!("must be at most {MAXIMUM_JWT_LEEWAY_SECONDS}"),
            );
        }
        if let Some(tenant) = &self.tenant_id
            && !valid_tenant_id(tenant)
        {
            problems.push(
                "front.jwt.tenant_id",
                "must be 1 to 128 letters, digits, '-' or '_'",
            );
        }
        for (field, claim) in [
            ("front.jwt.tenant_claim", &self.tenant_claim),
            ("front.jwt.principal_claim", &self.principal_claim),
            ("front.jwt.scopes_claim", &self.scopes_claim),
        ] {
            if claim.is_empty() || claim.len() > 128 {
                problems.push(field, "must name a claim");
            }
        }
        if self.tools.is_empty()
            || self.tools.len() > MAXIMUM_LIST_ENTRIES
            || !self.tools.iter().all(|pattern| valid_identifier(pattern))
        {
            problems.push("front.jwt.tools", "must list 1 to 1,024 tool patterns");
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

    #[test]
    fn a_key_set_in_the_clear_and_a_host_with_credentials_are_refused() {
        let problems = |front: &str| {
            let text = format!(
                "[control]\nsocket = \"c.sock\"\n[store]\nurl = \"sqlite://t.db\"\n\
                 [artifacts]\ndirectory = \"a\"\n{front}"
            );
            match crate::config::Config::parse(&text).and_then(|config| config.validate()) {
                Ok(()) => Vec::new(),
                Err(errors) => errors.0.iter().map(|error| error.path.clone()).collect(),
            }
        };
        let jwt = |url: &str| {
            format!(
                "[front]\nlisten = \"127.0.0.1:8766\"\n[front.jwt]\nissuer = \"https://id.example.com\"\n\
                 audiences = [\"toolgate\"]\njwks_url = \"{url}\"\ntenant_id = \"t\"\n\
                 tools = [\"demo.*\"]\nalgorithms = [\"ES256\"]\n"
            )
        };
        for refused in [
            "http://id.example.com/jwks.json",
            "http://10.0.0.1/jwks.json",
            "https://user:pw@id.example.com/jwks.json",
        ] {
            assert!(
                problems(&jwt(refused)).contains(&"front.jwt.jwks_url".to_owned()),
                "{refused}"
            );
        }
        for accepted in [
            "https://id.example.com/jwks.json",
            "http://127.0.0.1:9/jwks.json",
        ] {
            assert!(
                !problems(&jwt(accepted)).contains(&"front.jwt.jwks_url".to_owned()),
                "{accepted}"
            );
        }
        assert!(
            problems(
                "[front]\nlisten = \"127.0.0.1:8766\"\nallowed_hosts = [\"user@localhost\"]\n"
            )
            .contains(&"front.allowed_hosts[0]".to_owned())
        );
    }
}
