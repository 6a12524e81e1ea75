//! A principal's grant at use. A consented grant is opened from the store,
//! its access token used while fresh, otherwise refreshed under a lease
//! that holds across nodes (two nodes never redeem one refresh token), the
//! rotated tokens saved before the new access token is used (a refresh
//! whose tokens cannot be saved is not used, and one the store cannot
//! lease is not attempted). An exchanged one is minted from the
//! principal's own identity-provider token (RFC 8693) and held in memory
//! until it nears its expiry.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use hyper::Method;
use hyper::header::AUTHORIZATION;
use serde_json::Value;

use super::auth::{AuthError, Held, basic, form_encode, send, token_answer};
use crate::domain::SecretValue;
use crate::ports::{Clock, GrantStore, Sealer, UpstreamGrant};

/// The largest token answer read.
const MAXIMUM_TOKEN_ANSWER: usize = 64 << 10;
/// A token within this many seconds of its expiry is refreshed.
const EXPIRY_SKEW_SECONDS: i64 = 60;
/// How long a node holds a grant's refresh lease: past it, another node
/// may refresh (the holder died mid-refresh). Longer than a refresh can
/// take: a dial (10 s to connect, 10 s of TLS), then 10 s for the
/// handshake and 10 s for the answer; nodes' clocks agree within 5 s.
const REFRESH_LEASE: Duration = Duration::from_secs(90);
/// How long a node waits for another's refresh before giving up the call.
const REFRESH_WAIT: Duration = Duration::from_secs(15);
/// How often it looks while it waits.
const REFRESH_POLL: Duration = Duration::from_millis(100);

/// Where grants are kept and what seals them.
#[derive(Clone)]
pub struct Custody {
    pub grants: Arc<dyn GrantStore>,
    pub sealer: Arc<dyn Sealer>,
}

impl std::fmt::Debug for Custody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Custody").finish_non_exhaustive()
    }
}

/// What a grant's sealed tokens hold: the tokens, and where and for what
/// they are refreshed.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct Tokens {
    pub(super) access_token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) refresh_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) expires_at: Option<DateTime<Utc>>,
    pub(super) token_endpoint: String,
    pub(super) resource: String,
    /// The client it was granted to, when it is toolgate's Client ID
    /// Metadata Document (a public client); none: the server's registered
    /// client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) client_document: Option<String>,
    /// Where its authorization server revokes it (RFC 7009).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) revocation_endpoint: Option<String>,
}

/// What a grant's tokens are sealed for: a row moved to another tenant,
/// principal, server or issuer does not open.
fn context(grant: &UpstreamGrant) -> Vec<u8> {
    format!(
        "toolgate grant\0{}\0{}\0{}\0{}",
        grant.tenant_id, grant.principal_id, grant.server_id, grant.issuer
    )
    .into_bytes()
}

impl Custody {
    /// `tokens`, sealed for `grant`.
    pub(super) fn seal(&self, grant: &UpstreamGrant, tokens: &Tokens) -> Result<String, AuthError> {
        let plain = serde_json::to_string(tokens)
            .map(SecretValue::new)
            .map_err(|_| AuthError::Malformed)?;
        self.sealer
            .seal(&context(grant), &plain)
            .map_err(|_| AuthError::Malformed)
    }

    pub(super) fn open(&self, grant: &UpstreamGrant) -> Result<Tokens, AuthError> {
        let plain = self
            .sealer
            .open(&context(grant), &grant.sealed_tokens)
            .map_err(|_| {
                tracing::warn!(
                    tenant = %grant.tenant_id,
                    principal = %grant.principal_id,
                    server = %grant.server_id,
                    "a grant does not open under the configured key: the principal consents again"
                );
                AuthError::ConsentRequired
            })?;
        serde_json::from_str(plain.reveal()).map_err(|_| AuthError::ConsentRequired)
    }
}

/// The principals' own tokens from the operator's identity provider, as
/// the front door verified them, each until it expires: what an exchange
/// trades. Bounded: past [`SubjectTokens::MAXIMUM`] the expired go, then
/// the soonest to expire.
/// Each principal's token (tenant, principal) and when it expires.
type Subjects = std::collections::HashMap<(String, String), (SecretValue, DateTime<Utc>)>;

#[derive(Default)]
pub struct SubjectTokens {
    held: std::sync::Mutex<Subjects>,
}

impl std::fmt::Debug for SubjectTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubjectTokens").finish_non_exhaustive()
    }
}

impl SubjectTokens {
    /// Principals held at once.
    pub const MAXIMUM: usize = 10_000;

    fn held(&self) -> std::sync::MutexGuard<'_, Subjects> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `principal_id`'s token, if one is held and unexpired at `now`.
    fn get(&self, tenant_id: &str, principal_id: &str, now: DateTime<Utc>) -> Option<SecretValue> {
        self.held()
            .get(&(tenant_id.to_owned(), principal_id.to_owned()))
            .filter(|(_, expires_at)| *expires_at > now)
            .map(|(token, _)| token.clone())
    }
}

impl crate::ports::Subjects for SubjectTokens {
    fn remember(
        &self,
        tenant_id: &str,
        principal_id: &str,
        token: SecretValue,
        expires_at: DateTime<Utc>,
    ) {
        let mut held = self.held();
        if held.len() >= Self::MAXIMUM {
            let now = Utc::now();
            held.retain(|_, (_, expires)| *expires > now);
        }
        if held.len() >= Self::MAXIMUM
            && let Some(soonest) = held
                .iter()
                .min_by_key(|(_, (_, expires))| *expires)
                .map(|(key, _)| key.clone())
        {
            held.remove(&soonest);
        }
        held.insert(
            (tenant_id.to_owned(), principal_id.to_owned()),
            (token, expires_at),
        );
    }
}

/// Where a principal's grant comes from.
#[derive(Debug, Clone)]
pub enum GrantSource {
    /// Consent, kept in the store.
    Kept(Custody),
    /// An RFC 8693 exchange of the principal's identity-provider token.
    Exchanged(Arc<Exchange>),
}

/// An exchange's endpoint and what it asks for; the token it last minted.
#[derive(Debug)]
pub struct Exchange {
    pub(super) subjects: Arc<SubjectTokens>,
    pub(super) token_endpoint: String,
    /// The server's URL: the resource the token is for.
    pub(super) resource: String,
    pub(super) scopes: Vec<String>,
    pub(super) minted: std::sync::Mutex<Option<Held>>,
}

/// One principal's grant at one server, as a connection takes it.
#[derive(Debug, Clone)]
pub struct Delegate {
    pub source: GrantSource,
    pub tenant_id: String,
    pub principal_id: String,
    pub server_id: String,
    /// The server's URL as configured now: a grant given for another (the
    /// row was pointed elsewhere since) is never sent to it.
    pub resource: String,
}

/// The server's registered client, as this request found it.
pub(super) enum RegisteredClient {
    /// Named and resolved: `id:secret`.
    Resolved(SecretValue),
    /// Named, but its reference did not resolve now.
    Unresolved,
    /// Named by none: toolgate's client document is the server's client.
    Unnamed,
}

/// Whether a grant given for `given` may be sent to the server at `now`.
pub(super) fn same_resource(given: &str, now: &str) -> bool {
    given.trim_end_matches('/') == now.trim_end_matches('/')
}

impl Custody {
    /// Whether `grant` opens and was given for the server at `resource`.
    pub(super) fn usable_for(&self, grant: &UpstreamGrant, resource: &str) -> bool {
        self.open(grant)
            .is_ok_and(|tokens| same_resource(&tokens.resource, resource))
    }
}

impl Delegate {
    /// The access token to send, after the server refused `failed` if it
    /// did. Kept: the stored one while fresh (and not the refused one),
    /// else a refreshed one; no grant, or one that cannot be refreshed,
    /// asks for consent. Exchanged: the one last minted while fresh, else
    /// a new one for the principal's current identity-provider token.
    pub(super) async fn token(
        &self,
        client: &RegisteredClient,
        dialer: &dyn crate::ports::EgressDialer,
        clock: &dyn Clock,
        failed: Option<&SecretValue>,
    ) -> Result<Held, AuthError> {
        let custody = match &self.source {
            GrantSource::Kept(custody) => custody,
            GrantSource::Exchanged(exchange) => {
                let RegisteredClient::Resolved(client) = client else {
                    return Err(AuthError::Unresolved);
                };
                return self.exchange(exchange, client, dialer, clock, failed).await;
            }
        };
        let grants = &custody.grants;
        let unavailable = |_| AuthError::Unreachable;
        let mut grant = grants
            .grant(&self.tenant_id, &self.principal_id, &self.server_id)
            .await
            .map_err(unavailable)?
            .ok_or(AuthError::ConsentRequired)?;
        let started = tokio::time::Instant::now();
        loop {
            let tokens = custody.open(&grant)?;
            if !same_resource(&tokens.resource, &self.resource) {
                tracing::warn!(
                    tenant = %grant.tenant_id,
                    principal = %grant.principal_id,
                    server = %grant.server_id,
                    "a grant was given for the server's earlier URL; it is not sent, the principal consents again"
                );
                return Err(AuthError::ConsentRequired);
            }
            let now = clock.now();
            let fresh = tokens.expires_at.is_none_or(|expires_at| {
                expires_at - chrono::Duration::seconds(EXPIRY_SKEW_SECONDS) > now
            });
            let refused = failed.is_some_and(|failed| failed.reveal() == tokens.access_token);
            if fresh && !refused {
                // Best effort: the list's "last used" is not worth a call,
                // and a write a minute is enough for it (the row read says
                // whether one is due, so a request writes nothing else).
                if grant
                    .last_used_at
                    .is_none_or(|used| used < now - chrono::Duration::minutes(1))
                {
                    let _ = grants.touch_grant(&grant, now).await;
                }
                return Ok(Held {
                    value: SecretValue::new(tokens.access_token),
                    expires_at: tokens.expires_at,
                });
            }
            let lease_until = now
                + chrono::Duration::from_std(REFRESH_LEASE)
                    .unwrap_or(chrono::Duration::seconds(30));
            if grants
                .lease_refresh(&grant, lease_until, now)
                .await
                .map_err(unavailable)?
            {
                return self
                    .refresh(custody, &grant, tokens, client, dialer, clock)
                    .await;
            }
            // Another node refreshes: its tokens are used once saved.
            if started.elapsed() >= REFRESH_WAIT {
                return Err(AuthError::Unreachable);
            }
            tokio::time::sleep(REFRESH_POLL).await;
            grant = grants
                .grant(&self.tenant_id, &self.principal_id, &self.server_id)
                .await
                .map_err(unavailable)?
                .ok_or(AuthError::ConsentRequired)?;
        }
    }

    /// The token last minted while fresh (and not the one refused), else
    /// the principal's identity-provider token exchanged for a new one at
    /// the operator's token endpoint, the server named as the resource.
    async fn exchange(
        &self,
        exchange: &Exchange,
        client: &SecretValue,
        dialer: &dyn crate::ports::EgressDialer,
        clock: &dyn Clock,
        failed: Option<&SecretValue>,
    ) -> Result<Held, AuthError> {
        let now = clock.now();
        // The person's own token must still be held: the one minted from
        // it is not used past it.
        let subject = exchange
            .subjects
            .get(&self.tenant_id, &self.principal_id, now)
            .ok_or(AuthError::NoSubject)?;
        let minted = exchange
            .minted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .filter(|held| {
                held.expires_at.is_none_or(|expires_at| {
                    expires_at - chrono::Duration::seconds(EXPIRY_SKEW_SECONDS) > now
                }) && failed.is_none_or(|failed| *failed != held.value)
            });
        if let Some(held) = minted {
            return Ok(held);
        }
        let (id, secret) = client
            .reveal()
            .split_once(':')
            .ok_or(AuthError::Unresolved)?;
        let mut body = format!(
            "grant_type={}&subject_token={}&subject_token_type={}&resource={}",
            form_encode("urn:ietf:params:oauth:grant-type:token-exchange"),
            form_encode(subject.reveal()),
            form_encode("urn:ietf:params:oauth:token-type:jwt"),
            form_encode(&exchange.resource),
        );
        if !exchange.scopes.is_empty() {
            body.push_str("&scope=");
            body.push_str(&form_encode(&exchange.scopes.join(" ")));
        }
        let mut headers = Vec::new();
        if secret.is_empty() {
            body.push_str("&client_id=");
            body.push_str(&form_encode(id));
        } else {
            headers.push((AUTHORIZATION, basic(id, secret)?));
        }
        let (status, bytes) = send(
            dialer,
            Method::POST,
            &exchange.token_endpoint,
            headers,
            Some(body),
            MAXIMUM_TOKEN_ANSWER,
        )
        .await?;
        if status.as_u16() == 400 || status.as_u16() == 401 {
            return Err(AuthError::Refused);
        }
        if !status.is_success() {
            return Err(AuthError::Unreachable);
        }
        let held = token_answer(&bytes, clock.now())?;
        *exchange
            .minted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(held.clone());
        Ok(held)
    }

    /// Redeems the refresh token, holding the lease; saves what comes back
    /// before it is used.
    async fn refresh(
        &self,
        custody: &Custody,
        grant: &UpstreamGrant,
        tokens: Tokens,
        client: &RegisteredClient,
        dialer: &dyn crate::ports::EgressDialer,
        clock: &dyn Clock,
    ) -> Result<Held, AuthError> {
        let Some(refresh_token) = tokens.refresh_token.clone() else {
            // Nothing to refresh with: the grant is spent.
            self.end(custody, grant).await;
            return Err(AuthError::ConsentRequired);
        };
        // As the client it was granted to: toolgate's document (public),
        // else the registered one.
        let (id, secret) = match (&tokens.client_document, client) {
            (Some(document), _) => (document.as_str(), ""),
            (None, RegisteredClient::Resolved(client)) => client
                .reveal()
                .split_once(':')
                .ok_or(AuthError::Unresolved)?,
            (None, RegisteredClient::Unresolved) => return Err(AuthError::Unresolved),
            (None, RegisteredClient::Unnamed) => {
                // Granted to a registered client the server no longer
                // names: no refresh can be had as it; the person consents
                // again, as toolgate's own client.
                self.end(custody, grant).await;
                return Err(AuthError::ConsentRequired);
            }
        };
        let mut body = format!(
            "grant_type=refresh_token&refresh_token={}&resource={}",
            form_encode(&refresh_token),
            form_encode(&tokens.resource)
        );
        let mut headers = Vec::new();
        if secret.is_empty() {
            body.push_str("&client_id=");
            body.push_str(&form_encode(id));
        } else {
            headers.push((AUTHORIZATION, basic(id, secret)?));
        }
        let answered = send(
            dialer,
            Method::POST,
            &tokens.token_endpoint,
            headers,
            Some(body),
            MAXIMUM_TOKEN_ANSWER,
        )
        .await;
        let failed = |error: AuthError| async move {
            // Another node may try at once rather than when the lease ends.
            let _ = custody.grants.release_refresh(grant).await;
            error
        };
        let (status, bytes) = match answered {
            Ok(answered) => answered,
            Err(error) => return Err(failed(error).await),
        };
        let error_code = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|answer| answer.get("error")?.as_str().map(str::to_owned));
        if status.as_u16() == 400 && error_code.as_deref() == Some("invalid_grant") {
            // Revoked, expired or already used: the person consents again.
            self.end(custody, grant).await;
            return Err(AuthError::ConsentRequired);
        }
        if status.as_u16() == 400 || status.as_u16() == 401 {
            // The client (a secret rotated on one side only) or the request
            // is refused, not the person's grant: it is kept.
            tracing::warn!(
                tenant = %grant.tenant_id,
                server = %grant.server_id,
                status = status.as_u16(),
                "the authorization server refused a refresh for another reason than the grant"
            );
            return Err(failed(AuthError::Refused).await);
        }
        if !status.is_success() {
            return Err(failed(AuthError::Unreachable).await);
        }
        let now = clock.now();
        let held = match token_answer(&bytes, now) {
            Ok(held) => held,
            Err(error) => return Err(failed(error).await),
        };
        let answer: Value = serde_json::from_slice(&bytes).map_err(|_| AuthError::Malformed)?;
        let rotated = answer
            .get("refresh_token")
            .and_then(Value::as_str)
            .filter(|token| !token.is_empty())
            .map(str::to_owned);
        let renewed = Tokens {
            access_token: held.value.reveal().to_owned(),
            refresh_token: rotated.or(tokens.refresh_token),
            expires_at: held.expires_at,
            token_endpoint: tokens.token_endpoint,
            resource: tokens.resource,
            client_document: tokens.client_document,
            revocation_endpoint: tokens.revocation_endpoint,
        };
        let sealed = custody.seal(grant, &renewed)?;
        // Saved before it is used: a token the store did not take is not
        // sent, since the next refresh would need the refresh token it holds.
        let saved = custody
            .grants
            .replace_tokens(grant, &sealed, now)
            .await
            .unwrap_or(false);
        if !saved {
            tracing::warn!(
                tenant = %grant.tenant_id,
                principal = %grant.principal_id,
                server = %grant.server_id,
                "a refreshed grant could not be saved; it is not used"
            );
            return Err(AuthError::Unreachable);
        }
        tracing::info!(
            tenant = %grant.tenant_id,
            principal = %grant.principal_id,
            server = %grant.server_id,
            "grant refreshed"
        );
        Ok(held)
    }

    /// Deletes a grant its authorization server no longer honours, unless
    /// a consent replaced it meanwhile.
    async fn end(&self, custody: &Custody, grant: &UpstreamGrant) {
        if custody.grants.end_grant(grant).await.unwrap_or(false) {
            tracing::info!(
                tenant = %grant.tenant_id,
                principal = %grant.principal_id,
                server = %grant.server_id,
                "grant no longer honoured by its authorization server; consent is asked again"
            );
        }
    }
}
