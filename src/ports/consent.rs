//! `oauth2_user`'s consent surface, as the console serves it: who a person
//! is (the front door's credential they hold), the flow that asks their
//! upstream account for a grant, and the grant's end. The adapter behind
//! it discovers, redeems and seals; the console only renders.

use crate::domain::SecretValue;
use crate::ports::tool::BoxFuture;

/// The principal a person proved to be, by a credential of the front door.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delegator {
    pub tenant_id: String,
    pub principal_id: String,
}

/// Who a front-door credential names.
pub trait Principals: Send + Sync {
    /// The tenant and principal `credential` (an API key or a token of the
    /// operator's identity provider) authenticates, if it does.
    fn principal<'a>(&'a self, credential: &'a SecretValue) -> BoxFuture<'a, Option<Delegator>>;
}

/// Where the front door leaves each principal's own token from the
/// operator's identity provider, as it verified it: what an `oauth2_user`
/// server with a token endpoint exchanges (RFC 8693) for the principal's
/// upstream token. It is never sent anywhere else.
pub trait Subjects: Send + Sync {
    /// Keeps `token` as `principal_id`'s (of `tenant_id`) until
    /// `expires_at`, replacing the one kept before.
    fn remember(
        &self,
        tenant_id: &str,
        principal_id: &str,
        token: SecretValue,
        expires_at: chrono::DateTime<chrono::Utc>,
    );
}

/// A flow begun: where the person goes, and what their browser keeps so
/// that only it can finish the flow.
#[derive(Clone)]
pub struct ConsentStart {
    /// The authorization server's page, with the request in its query.
    pub authorization_url: String,
    /// The authorization server's origin, to show the person where they go.
    pub authorization_origin: String,
    /// The browser's cookie value; only its sha256 is stored.
    pub browser: String,
    /// The cookie's name ([`consent_cookie_name`] of the flow's state).
    pub cookie_name: String,
    /// The scopes asked for.
    pub scopes: Vec<String>,
}

impl std::fmt::Debug for ConsentStart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL carries the state; the cookie binds the browser.
        f.debug_struct("ConsentStart")
            .field("authorization_origin", &self.authorization_origin)
            .field("scopes", &self.scopes)
            .finish_non_exhaustive()
    }
}

/// The cookie that binds a flow's browser: named by the flow, so flows in
/// two tabs do not replace each other's.
pub fn consent_cookie_name(state: &str) -> String {
    let digest = crate::domain::sha256_hex(format!("toolgate consent cookie\n{state}").as_bytes());
    format!("toolgate_consent_{}", &digest[..16])
}

/// What the authorization server sent the person back with.
#[derive(Clone, Default)]
pub struct ConsentAnswer {
    pub state: Option<String>,
    pub code: Option<String>,
    pub iss: Option<String>,
    pub error: Option<String>,
}

impl std::fmt::Debug for ConsentAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The code and the state are the flow's secrets.
        f.debug_struct("ConsentAnswer")
            .field("iss", &self.iss)
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

/// A grant kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Granted {
    pub tenant_id: String,
    pub principal_id: String,
    pub server_id: String,
}

/// Why consent could not go on. Messages name no token, code, state or
/// remote text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConsentError {
    /// No server of that id takes each principal's own grant for the
    /// principal's tenant.
    #[error("no server of that name asks for your consent")]
    NoSuchServer,
    /// The server's or its authorization server's metadata could not be
    /// read, or does not allow what toolgate requires (PKCE with S256, an
    /// issuer that names itself, a resource that names the server).
    #[error("the server's authorization metadata cannot be used: {0}")]
    Metadata(&'static str),
    /// The state is unknown, used, expired, or the flow began in another
    /// browser.
    #[error("this consent link is not one this browser began, or it has been used or has expired")]
    UnknownFlow,
    /// The answer came from another issuer than the one asked.
    #[error("the answer did not come from the authorization server asked")]
    WrongIssuer,
    /// The person, or the authorization server, refused.
    #[error("the authorization server did not grant access")]
    Refused,
    /// The code could not be redeemed.
    #[error("the authorization server did not redeem the code")]
    NotRedeemed,
    /// The authorization server, or the store, could not be reached.
    #[error("{0} could not be reached; try again")]
    Unavailable(&'static str),
}

/// A grant ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revoked {
    /// The principal held none there.
    NotHeld,
    /// Deleted here. `upstream`: whether its authorization server took the
    /// revocation of its tokens (RFC 7009); false where it offers none, or
    /// did not answer 200 (the grant is ended here either way).
    Ended { upstream: bool },
}

/// Ends grants, for the principal that holds one and for operators.
pub trait Revocation: Send + Sync {
    /// Ends `principal_id`'s grant (of `tenant_id`) at `server_id`: the
    /// grant is deleted, so the next call asks for consent again, then its
    /// tokens are revoked at the authorization server that issued them.
    fn end_grant<'a>(
        &'a self,
        tenant_id: &'a str,
        principal_id: &'a str,
        server_id: &'a str,
    ) -> BoxFuture<'a, Result<Revoked, ConsentError>>;
}

/// The consent flows and grants of `oauth2_user` servers.
pub trait Consent: Revocation {
    /// Begins a flow for `who` at `server_id`: discovers the server's
    /// authorization server, and keeps the flow's state, verifier and
    /// browser binding.
    fn begin<'a>(
        &'a self,
        who: &'a Delegator,
        server_id: &'a str,
    ) -> BoxFuture<'a, Result<ConsentStart, ConsentError>>;

    /// What the answer's flow grants, to whom, when it is this browser's
    /// (`None` otherwise: its finish refuses it); nothing is taken.
    fn pending<'a>(
        &'a self,
        browser: Option<&'a str>,
        answer: &'a ConsentAnswer,
    ) -> BoxFuture<'a, Result<Option<Granted>, ConsentError>>;

    /// Finishes the flow the answer's state names, in the browser that
    /// holds `browser`: checks the issuer, redeems the code, seals and
    /// keeps the grant.
    fn finish<'a>(
        &'a self,
        browser: Option<&'a str>,
        answer: &'a ConsentAnswer,
    ) -> BoxFuture<'a, Result<Granted, ConsentError>>;

    /// Toolgate's Client ID Metadata Document, as served at its URL.
    fn client_document(&self) -> serde_json::Value;
}
