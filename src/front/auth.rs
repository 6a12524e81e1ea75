//! Who is calling. Every front-door request presents a bearer credential:
//! an API key (found by its sha256, every configured hash compared in
//! constant time) or a JWT from the operator's identity provider (signature
//! by a key of its JWK set, issuer, audience, expiry within a bounded
//! skew). Either fixes the tenant, the principal and its scopes, the
//! agent's tool patterns and the most trust a call is given; nothing of
//! that is ever taken from a request's body.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use http_body_util::{BodyExt as _, Empty, Limited};
use hyper::body::Bytes;
use hyper::header::HeaderMap;
use hyper_util::rt::TokioIo;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::domain::{
    AgentSpec, MAXIMUM_LIST_ENTRIES, Principal, TrustLevel, sha256_hex, valid_identifier,
    valid_tenant_id,
};
use crate::edge::{bearer_token, constant_time_eq};
use crate::pipeline::sessions::SessionRequest;
use crate::ports::EgressDialer;

/// The largest JWK set read.
const MAXIMUM_JWKS_BYTES: usize = 1 << 20;
/// How long fetching the JWK set may take.
const JWKS_FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// A token naming a key the set does not hold fetches the set again at
/// most this often (a rotated key), so unknown kids cannot drive fetches.
const JWKS_REFETCH_SPACING: Duration = Duration::from_secs(30);
/// The longest bearer credential read.
const MAXIMUM_CREDENTIAL_BYTES: usize = 16 * 1024;

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Names the credential in logs and limits: `key:<id>` or
    /// `jwt:<tenant>:<principal>`, never the credential.
    pub credential: String,
    /// Whose records its calls write.
    pub tenant_id: String,
    /// Who its calls act for.
    pub principal: Principal,
    /// What the agent may use.
    pub agent: AgentSpec,
    /// The most trust a call of this caller is given.
    pub origin_trust: TrustLevel,
}

impl Caller {
    /// What opens a session `session_id` of this caller.
    pub fn session_request(&self, session_id: uuid::Uuid) -> SessionRequest {
        SessionRequest {
            session_id,
            tenant_id: self.tenant_id.clone(),
            principal: self.principal.clone(),
            agent: self.agent.clone(),
        }
    }
}

/// One API key, as the operator configured it.
#[derive(Debug, Clone)]
pub struct ApiKey {
    /// Names the key.
    pub id: String,
    /// Lowercase hex sha256 of the key.
    pub sha256: String,
    /// Its tenant.
    pub tenant_id: String,
    /// Its principal.
    pub principal: Principal,
    /// Its agent's tool patterns.
    pub tools: Vec<String>,
    /// The most trust its calls are given.
    pub origin_trust: TrustLevel,
}

/// Where a token's tenant comes from.
#[derive(Debug, Clone)]
pub enum TenantSource {
    /// Every token's.
    Fixed(String),
    /// This claim's.
    Claim(String),
}

/// Where the JWK set comes from.
#[derive(Debug, Clone)]
pub enum KeySource {
    /// A file, read at start and on SIGHUP.
    File(PathBuf),
    /// A URL fetched through egress, again every `refresh`.
    Url {
        /// The set's URL.
        url: String,
        /// How often it is fetched again.
        refresh: Duration,
    },
}

/// JWT bearer tokens, as the operator configured them.
#[derive(Debug, Clone)]
pub struct JwtSettings {
    /// The `iss` every token carries.
    pub issuer: String,
    /// The `aud` values accepted.
    pub audiences: Vec<String>,
    /// The signature algorithms accepted.
    pub algorithms: Vec<Algorithm>,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway: Duration,
    /// The tenant.
    pub tenant: TenantSource,
    /// The claim naming the principal.
    pub principal_claim: String,
    /// The claim holding the scopes.
    pub scopes_claim: String,
    /// The agent's tool patterns.
    pub tools: Vec<String>,
    /// The trust a call is given when its token does not state one.
    pub origin_trust: TrustLevel,
    /// The claim a token states its origin trust in, and the most it may
    /// state.
    pub origin_trust_claim: Option<(String, TrustLevel)>,
    /// The JWK set.
    pub keys: KeySource,
}

/// Why a request was not authenticated; the 401's `error` parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No bearer credential was presented.
    Missing,
    /// One was, and it is not valid (unknown, malformed, expired, wrongly
    /// signed, or without a usable tenant, principal or scopes).
    Invalid,
}

/// Why credentials could not be set up or a key set loaded.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The JWK set file could not be read.
    #[error("front.jwt.jwks_file could not be read: {0}")]
    JwksFile(std::io::ErrorKind),
    /// The JWK set is not one, or holds no usable key.
    #[error("the JWK set is not valid JSON of a key set with a usable key")]
    JwksInvalid,
    /// The JWK set could not be fetched.
    #[error("the JWK set could not be fetched: {0}")]
    JwksFetch(String),
}

/// The front door's credentials.
pub struct Credentials {
    keys: RwLock<Arc<Vec<ApiKey>>>,
    jwt: Option<Jwt>,
    /// Where a verified identity-provider token is left for the servers
    /// that exchange it (RFC 8693); unset, none is kept.
    subjects: std::sync::OnceLock<Arc<dyn crate::ports::Subjects>>,
}

struct Jwt {
    settings: JwtSettings,
    keys: RwLock<Arc<Vec<(Jwk, DecodingKey)>>>,
    dialer: Arc<dyn EgressDialer>,
    /// When a fetch last started, to space the ones unknown kids cause.
    fetched: tokio::sync::Mutex<Option<tokio::time::Instant>>,
}

impl Credentials {
    /// Credentials over configured keys and, optionally, a JWT issuer; a key
    /// set from a file is read now.
    pub fn new(
        keys: Vec<ApiKey>,
        jwt: Option<JwtSettings>,
        dialer: Arc<dyn EgressDialer>,
    ) -> Result<Self, AuthError> {
        let jwt = match jwt {
            Some(settings) => {
                let loaded = match &settings.keys {
                    KeySource::File(path) => {
                        let text =
                            std::fs::read(path).map_err(|e| AuthError::JwksFile(e.kind()))?;
                        usable_keys(&text, &settings.algorithms)?
                    }
                    // Fetched by `refresh`, which `serve` starts.
                    KeySource::Url { .. } => Vec::new(),
                };
                Some(Jwt {
                    settings,
                    keys: RwLock::new(Arc::new(loaded)),
                    dialer,
                    fetched: tokio::sync::Mutex::new(None),
                })
            }
            None => None,
        };
        Ok(Credentials {
            keys: RwLock::new(Arc::new(keys)),
            jwt,
            subjects: std::sync::OnceLock::new(),
        })
    }

    /// Replaces the API keys (SIGHUP): requests after it see the new set.
    pub fn replace_keys(&self, keys: Vec<ApiKey>) {
        *self
            .keys
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(keys);
    }

    /// Reads the JWK set file again (SIGHUP); the set in force stays when
    /// the file is not a usable set.
    pub fn reload_key_file(&self) -> Result<(), AuthError> {
        let Some(jwt) = &self.jwt else {
            return Ok(());
        };
        let KeySource::File(path) = &jwt.settings.keys else {
            return Ok(());
        };
        let text = std::fs::read(path).map_err(|e| AuthError::JwksFile(e.kind()))?;
        let loaded = usable_keys(&text, &jwt.settings.algorithms)?;
        *jwt.keys
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(loaded);
        Ok(())
    }

    /// Keeps a fetched JWK set fresh until `shutdown`; a no-op otherwise.
    pub async fn refresh(self: Arc<Self>, shutdown: CancellationToken) {
        let Some(jwt) = &self.jwt else {
            return;
        };
        let KeySource::Url { refresh, .. } = &jwt.settings.keys else {
            return;
        };
        let mut retry = Duration::from_secs(1);
        loop {
            let wait = match jwt.fetch().await {
                Ok(count) => {
                    tracing::debug!(keys = count, "front door key set fetched");
                    retry = Duration::from_secs(1);
                    *refresh
                }
                Err(error) => {
                    tracing::warn!(error = %error, "front door key set not fetched; the set in force stays");
                    retry = (retry * 2).min(*refresh);
                    retry
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Leaves each verified identity-provider token in `subjects`, for the
    /// `oauth2_user` servers that exchange it.
    pub fn keep_subjects_in(&self, subjects: Arc<dyn crate::ports::Subjects>) {
        let _ = self.subjects.set(subjects);
    }

    /// Who presented `headers`' bearer credential.
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<Caller, Refusal> {
        let Some(presented) = bearer_token(headers) else {
            return Err(Refusal::Missing);
        };
        if presented.len() > MAXIMUM_CREDENTIAL_BYTES {
            return Err(Refusal::Invalid);
        }
        if let Some(jwt) = &self.jwt
            && looks_like_jwt(presented)
        {
            let (caller, expires_at) = jwt.verify(presented).await?;
            if let (Some(subjects), Some(expires_at)) = (self.subjects.get(), expires_at) {
                subjects.remember(
                    &caller.tenant_id,
                    &caller.principal.id,
                    crate::domain::SecretValue::new(presented),
                    expires_at,
                );
            }
            return Ok(caller);
        }
        self.api_key(presented).ok_or(Refusal::Invalid)
    }

    fn api_key(&self, presented: &str) -> Option<Caller> {
        let digest = sha256_hex(presented.as_bytes());
        let keys = self
            .keys
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        // Every hash is compared, so the time taken says nothing of which
        // (or whether one) matched.
        let mut found = None;
        for key in keys.iter() {
            if constant_time_eq(digest.as_bytes(), key.sha256.as_bytes()) {
                found = Some(key);
            }
        }
        found.map(|key| Caller {
            credential: format!("key:{}", key.id),
            tenant_id: key.tenant_id.clone(),
            principal: key.principal.clone(),
            agent: AgentSpec {
                tools: key.tools.clone(),
            },
            origin_trust: key.origin_trust,
        })
    }
}

/// The consent pages ask who a person is by the credential they hold here:
/// the same keys and the same identity provider, checked the same way.
impl crate::ports::Principals for Credentials {
    fn principal<'a>(
        &'a self,
        credential: &'a crate::domain::SecretValue,
    ) -> crate::ports::BoxFuture<'a, Option<crate::ports::Delegator>> {
        Box::pin(async move {
            let mut headers = HeaderMap::new();
            let mut value =
                hyper::header::HeaderValue::from_str(&format!("Bearer {}", credential.reveal()))
                    .ok()?;
            value.set_sensitive(true);
            headers.insert(hyper::header::AUTHORIZATION, value);
            let caller = self.authenticate(&headers).await.ok()?;
            Some(crate::ports::Delegator {
                tenant_id: caller.tenant_id,
                principal_id: caller.principal.id,
            })
        })
    }
}

/// A new API key and the sha256 the operator configures for it: 32 bytes
/// from the system's randomness, hex, after a prefix that says what it is.
pub fn new_api_key() -> std::io::Result<(String, String)> {
    use std::io::Read as _;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    let key = format!("tgk_{}", crate::domain::canonical::hex(&bytes));
    let sha256 = sha256_hex(key.as_bytes());
    Ok((key, sha256))
}

/// Three base64url segments, the first a JSON object's: a JWT, not a key.
fn looks_like_jwt(text: &str) -> bool {
    text.starts_with("eyJ") && text.bytes().filter(|b| *b == b'.').count() == 2
}

/// The keys of a JWK set toolgate can verify with: signing keys whose
/// algorithm, when named, is one accepted.
fn usable_keys(
    text: &[u8],
    algorithms: &[Algorithm],
) -> Result<Vec<(Jwk, DecodingKey)>, AuthError> {
    let set: JwkSet = serde_json::from_slice(text).map_err(|_| AuthError::JwksInvalid)?;
    let keys: Vec<(Jwk, DecodingKey)> = set
        .keys
        .into_iter()
        .filter(|jwk| {
            !matches!(
                jwk.common.public_key_use,
                Some(jsonwebtoken::jwk::PublicKeyUse::Encryption)
            )
        })
        .filter(|jwk| {
            jwk.common
                .key_algorithm
                .and_then(|alg| alg.to_string().parse::<Algorithm>().ok())
                .is_none_or(|alg| algorithms.contains(&alg))
        })
        .filter_map(|jwk| DecodingKey::from_jwk(&jwk).ok().map(|key| (jwk, key)))
        .collect();
    if keys.is_empty() {
        return Err(AuthError::JwksInvalid);
    }
    Ok(keys)
}

/// Whether a token's protected header has `crit`: it names extensions the
/// recipient must understand, and toolgate understands none (RFC 7515
/// §4.1.11), so such a token is refused whatever its signature. A header
/// that cannot be read is reported as critical too.
fn names_critical_extensions(token: &str) -> bool {
    let Some(header) = token
        .split('.')
        .next()
        .and_then(crate::domain::canonical::base64url_decode)
    else {
        return true;
    };
    match serde_json::from_slice::<Value>(&header) {
        Ok(Value::Object(fields)) => fields.contains_key("crit"),
        _ => true,
    }
}

impl Jwt {
    /// The caller a token names, and when the token expires.
    async fn verify(
        &self,
        token: &str,
    ) -> Result<(Caller, Option<chrono::DateTime<chrono::Utc>>), Refusal> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| Refusal::Invalid)?;
        if !self.settings.algorithms.contains(&header.alg) || names_critical_extensions(token) {
            return Err(Refusal::Invalid);
        }
        let mut candidates = self.candidates(&header);
        if candidates.is_empty() && header.kid.is_some() && self.refetch_allowed().await {
            // A key the set did not hold: perhaps rotated in since.
            if let Err(error) = self.fetch().await {
                tracing::warn!(error = %error, "front door key set not fetched again");
            }
            candidates = self.candidates(&header);
        }
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.settings.issuer]);
        validation.set_audience(&self.settings.audiences);
        validation.leeway = self.settings.leeway.as_secs();
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        let claims = candidates
            .iter()
            .find_map(|key| jsonwebtoken::decode::<Value>(token, key, &validation).ok())
            .ok_or(Refusal::Invalid)?
            .claims;
        let expires_at = claims
            .get("exp")
            .and_then(Value::as_i64)
            .and_then(|exp| chrono::DateTime::from_timestamp(exp, 0));
        let caller = self.caller(&claims).ok_or(Refusal::Invalid)?;
        Ok((caller, expires_at))
    }

    /// The keys a token may be signed with: the one its `kid` names, or,
    /// without a `kid`, every key.
    fn candidates(&self, header: &jsonwebtoken::Header) -> Vec<DecodingKey> {
        let keys = self
            .keys
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        keys.iter()
            .filter(|(jwk, _)| match &header.kid {
                Some(kid) => jwk.common.key_id.as_deref() == Some(kid.as_str()),
                None => true,
            })
            .map(|(_, key)| key.clone())
            .collect()
    }

    async fn refetch_allowed(&self) -> bool {
        if !matches!(self.settings.keys, KeySource::Url { .. }) {
            return false;
        }
        let last = self.fetched.lock().await;
        last.is_none_or(|at| at.elapsed() >= JWKS_REFETCH_SPACING)
    }

    /// The caller a token's verified claims name.
    fn caller(&self, claims: &Value) -> Option<Caller> {
        let tenant_id = match &self.settings.tenant {
            TenantSource::Fixed(tenant) => tenant.clone(),
            TenantSource::Claim(claim) => claims.get(claim)?.as_str()?.to_owned(),
        };
        if !valid_tenant_id(&tenant_id) {
            return None;
        }
        let principal_id = claims
            .get(&self.settings.principal_claim)?
            .as_str()?
            .to_owned();
        if !valid_identifier(&principal_id) {
            return None;
        }
        let scopes: BTreeSet<String> = match claims.get(&self.settings.scopes_claim) {
            None | Some(Value::Null) => BTreeSet::new(),
            Some(Value::String(text)) => text.split_whitespace().map(str::to_owned).collect(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| item.as_str().map(str::to_owned))
                .collect::<Option<_>>()?,
            Some(_) => return None,
        };
        if scopes.len() > MAXIMUM_LIST_ENTRIES || !scopes.iter().all(|s| valid_identifier(s)) {
            return None;
        }
        Some(Caller {
            credential: format!("jwt:{tenant_id}:{principal_id}"),
            tenant_id,
            principal: Principal {
                id: principal_id,
                scopes,
            },
            agent: AgentSpec {
                tools: self.settings.tools.clone(),
            },
            origin_trust: self.origin_trust(claims)?,
        })
    }

    /// The token's origin trust: the one its trust claim states, up to the
    /// operator's maximum, else the configured one. A claim that is not a
    /// trust label refuses the token.
    fn origin_trust(&self, claims: &Value) -> Option<TrustLevel> {
        let Some((claim, maximum)) = &self.settings.origin_trust_claim else {
            return Some(self.settings.origin_trust);
        };
        match claims.get(claim) {
            None => Some(self.settings.origin_trust),
            Some(Value::String(label)) => label
                .parse::<TrustLevel>()
                .ok()
                .map(|stated| stated.min(*maximum)),
            Some(_) => None,
        }
    }

    /// Fetches the set through egress and keeps it when usable; how many
    /// keys it holds.
    async fn fetch(&self) -> Result<usize, AuthError> {
        let KeySource::Url { url, .. } = &self.settings.keys else {
            return Ok(0);
        };
        *self.fetched.lock().await = Some(tokio::time::Instant::now());
        let body = tokio::time::timeout(JWKS_FETCH_TIMEOUT, get(self.dialer.as_ref(), url))
            .await
            .map_err(|_| AuthError::JwksFetch("timed out".into()))??;
        let loaded = usable_keys(&body, &self.settings.algorithms)?;
        let count = loaded.len();
        *self
            .keys
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(loaded);
        Ok(count)
    }
}

/// One HTTP/1.1 GET through egress: the body of a 200, at most
/// [`MAXIMUM_JWKS_BYTES`].
async fn get(dialer: &dyn EgressDialer, url: &str) -> Result<Vec<u8>, AuthError> {
    let failed = |what: &str| AuthError::JwksFetch(what.to_owned());
    let dialed = dialer
        .dial(url)
        .await
        .map_err(|error| AuthError::JwksFetch(error.to_string()))?;
    let after_scheme = url.split_once("://").map_or(url, |(_, rest)| rest);
    let path = after_scheme.find('/').map_or("/", |at| &after_scheme[at..]);
    let host = if dialed.url.host.contains(':') {
        format!("[{}]:{}", dialed.url.host, dialed.url.port)
    } else {
        format!("{}:{}", dialed.url.host, dialed.url.port)
    };
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(dialed.stream))
            .await
            .map_err(|_| failed("the HTTP handshake failed"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, host)
        .header(hyper::header::ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())
        .map_err(|_| failed("the request could not be written"))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|_| failed("the request failed"))?;
    if response.status() != hyper::StatusCode::OK {
        return Err(AuthError::JwksFetch(format!(
            "answered {}",
            response.status().as_u16()
        )));
    }
    let body = Limited::new(response.into_body(), MAXIMUM_JWKS_BYTES)
        .collect()
        .await
        .map_err(|_| failed("the body was too long or broken"))?;
    Ok(body.to_bytes().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwts_and_keys_are_told_apart() {
        assert!(looks_like_jwt("eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"));
        assert!(!looks_like_jwt("tgk_0123456789abcdef"));
        assert!(!looks_like_jwt("eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ4In0"));
    }

    #[test]
    fn a_key_set_without_a_usable_key_is_refused() {
        assert!(usable_keys(b"{\"keys\":[]}", &[Algorithm::ES256]).is_err());
        assert!(usable_keys(b"not json", &[Algorithm::ES256]).is_err());
        // An RSA key named for an algorithm not accepted is left out.
        let rsa = br#"{"keys":[{"kty":"RSA","alg":"RS256","kid":"a","n":"sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw","e":"AQAB"}]}"#;
        assert!(usable_keys(rsa, &[Algorithm::ES256]).is_err());
        assert_eq!(
            usable_keys(rsa, &[Algorithm::RS256]).map(|k| k.len()).ok(),
            Some(1)
        );
    }
}
