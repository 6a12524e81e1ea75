//! What `oauth2_user` keeps: each principal's grant at an upstream server,
//! and the consent flows under way. Tokens and PKCE verifiers are sealed
//! before they reach a store ([`crate::ports::Sealer`]); a row holds
//! nothing a server or a browser would take.

use chrono::{DateTime, Utc};

use super::StoreError;
use crate::ports::tool::BoxFuture;

/// One principal's grant at one server of its tenant (the operator's or the
/// tenant's own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamGrant {
    pub tenant_id: String,
    pub principal_id: String,
    pub server_id: String,
    /// The authorization server that issued it.
    pub issuer: String,
    /// The scopes granted, as the token endpoint said (or as asked).
    pub scopes: Vec<String>,
    /// The access token, its expiry and the refresh token, sealed with the
    /// row's tenant, principal, server and issuer as associated data.
    pub sealed_tokens: String,
    pub granted_at: DateTime<Utc>,
    /// When a call last used it.
    pub last_used_at: Option<DateTime<Utc>>,
}

/// A consent under way: the `state` an authorization request carried,
/// kept by its sha256, single use, bound to the principal that began it
/// and to the browser it began in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsentFlow {
    /// Lowercase hex sha256 of the `state` sent.
    pub state_sha256: String,
    pub tenant_id: String,
    pub principal_id: String,
    pub server_id: String,
    /// Lowercase hex sha256 of the cookie the browser was given.
    pub browser_sha256: String,
    /// The PKCE code verifier, sealed.
    pub sealed_verifier: String,
    /// The authorization server's issuer, which the answer's `iss` must be.
    pub issuer: String,
    /// Whether the answer must carry `iss` (RFC 9207): its metadata says
    /// it sends one, so an answer without it is not its own.
    pub iss_required: bool,
    /// Where the code is redeemed.
    pub token_endpoint: String,
    /// The resource indicator: the server's URL as its metadata names it.
    pub resource: String,
    /// The scopes asked for.
    pub scopes: Vec<String>,
    pub started_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// The client that asked, when it is toolgate's Client ID Metadata
    /// Document (its URL, a public client); none: the server's registered
    /// client (`credential_ref`).
    pub client_document: Option<String>,
    /// Where the authorization server revokes tokens (RFC 7009), when its
    /// metadata names it.
    pub revocation_endpoint: Option<String>,
}

/// The `upstream_grants` and `consent_flows` tables.
pub trait GrantStore: Send + Sync {
    /// Records a flow begun. Flows expired by its start are deleted, and
    /// the principal's oldest past `maximum` outstanding, so beginning in a
    /// loop cannot grow the table.
    fn begin_consent<'a>(
        &'a self,
        flow: &'a ConsentFlow,
        maximum: usize,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Takes the flow of that state, if it has not expired by `now`: it is
    /// deleted in the same statement, so a state is redeemed once on every
    /// node.
    fn take_consent<'a>(
        &'a self,
        state_sha256: &'a str,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Option<ConsentFlow>, StoreError>>;

    /// The flow of that state, if it has not expired by `now`, left in
    /// place: what the person is asked to confirm.
    fn consent_flow<'a>(
        &'a self,
        state_sha256: &'a str,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<Option<ConsentFlow>, StoreError>>;

    /// Keeps a grant, replacing the principal's earlier one at that server.
    fn save_grant<'a>(&'a self, grant: &'a UpstreamGrant) -> BoxFuture<'a, Result<(), StoreError>>;

    /// The principal's grant at that server.
    fn grant<'a>(
        &'a self,
        tenant_id: &'a str,
        principal_id: &'a str,
        server_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<UpstreamGrant>, StoreError>>;

    /// The tenant's grants by principal and server: the first 1,001, so a
    /// list of a thousand can say whether there are more.
    fn grants<'a>(
        &'a self,
        tenant_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<UpstreamGrant>, StoreError>>;

    /// Takes the grant's refresh lease until `until`, if the grant still
    /// holds `sealed_tokens` and no other node holds an unexpired lease at
    /// `now`: whether it was taken. Taking it is a write, so a store that
    /// cannot save a refreshed token refuses the lease first.
    fn lease_refresh<'a>(
        &'a self,
        grant: &'a UpstreamGrant,
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Replaces the grant's tokens, if it still holds those `grant` read,
    /// and lets its refresh lease go: whether it did.
    fn replace_tokens<'a>(
        &'a self,
        grant: &'a UpstreamGrant,
        sealed_tokens: &'a str,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Lets the grant's refresh lease go without replacing its tokens (the
    /// refresh failed), if it still holds those `grant` read.
    fn release_refresh<'a>(
        &'a self,
        grant: &'a UpstreamGrant,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Deletes the grant its authorization server no longer honours, if it
    /// still holds the tokens `grant` read (a consent given meanwhile is
    /// kept): whether it did.
    fn end_grant<'a>(&'a self, grant: &'a UpstreamGrant)
    -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Records that a connection took the grant at `now`.
    fn touch_grant<'a>(
        &'a self,
        grant: &'a UpstreamGrant,
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Deletes the principal's grant at that server: the grant deleted, if
    /// there was one.
    fn revoke_grant<'a>(
        &'a self,
        tenant_id: &'a str,
        principal_id: &'a str,
        server_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<UpstreamGrant>, StoreError>>;
}
