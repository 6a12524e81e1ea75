//! Tenant-configured MCP servers, validated when written (Decision 21): the
//! transport is HTTP, the endpoint and any token endpoint pass the egress
//! allowlist, the authentication obeys the five rules, scopes stay under
//! `mcp.{server_id}.`, and an operator server's id is never taken. Every
//! problem is reported with its field; no value is echoed.

use std::sync::Arc;

use crate::domain::egress::EgressAllowlist;
use crate::domain::mcp_server::{
    AuthFields, AuthScheme, Transport, validate_auth, validate_classification,
};
use crate::domain::secret::CredentialRef;
use crate::domain::{IdempotencyClass, RiskLevel, SideEffectClass, valid_tenant_id};
use crate::ports::{CatalogStore, Clock, McpServerRow, StoreError};

/// Why a tenant server was not written, read or removed.
#[derive(Debug, thiserror::Error)]
pub enum TenantServerError {
    /// The tenant id breaks the rule where a tenant's records begin.
    #[error("tenant_id must be 1 to 128 letters, digits, '-' or '_'")]
    InvalidTenant,
    /// An operator server has this id.
    #[error("an operator server has this server_id")]
    Taken,
    /// The server breaks the write-time rules; each problem names its field.
    #[error("{}", .0.join("; "))]
    Invalid(Vec<String>),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The authentication of a tenant server, as written.
#[derive(Debug, Clone, Default)]
pub struct ServerAuthSpec {
    /// One of the six schemes (text, so an unknown one is a rule violation).
    pub scheme: String,
    /// Header or variable name.
    pub name: Option<String>,
    /// A broker reference, never a secret.
    pub credential_ref: Option<String>,
    /// oauth2_client only (a tenant's oauth2_user asks for consent).
    pub token_endpoint: Option<String>,
    /// oauth2_client and oauth2_user.
    pub token_scopes: Option<Vec<String>>,
}

/// A tenant server as written.
#[derive(Debug, Clone)]
pub struct TenantServerSpec {
    /// The URL.
    pub endpoint: String,
    /// How it authenticates; `none` when absent.
    pub auth: Option<ServerAuthSpec>,
    /// The operator-style classification of all its tools.
    pub side_effect: SideEffectClass,
    /// See `side_effect`.
    pub risk: RiskLevel,
    /// See `side_effect`.
    pub idempotency: IdempotencyClass,
    /// Scopes every tool requires.
    pub required_scopes: Vec<String>,
    /// Every tool's timeout.
    pub timeout_seconds: u32,
    /// Every tool's output limit.
    pub maximum_output_bytes: u64,
    /// Whether it is dialled at all.
    pub enabled: bool,
}

pub use crate::domain::mcp_server::TenantCeilings;

/// The tenant servers of every tenant.
pub struct TenantServers {
    store: Arc<dyn CatalogStore>,
    clock: Arc<dyn Clock>,
    egress: EgressAllowlist,
    /// Operator servers' ids, which a tenant server may not take.
    operator_servers: Vec<String>,
    ceilings: TenantCeilings,
    /// Whether consent is served, without which `oauth2_user` cannot be.
    consent: bool,
    /// Whether authorization servers can fetch toolgate's Client ID
    /// Metadata Document, without which an `oauth2_user` row names its
    /// registered client.
    client_documents: bool,
}

impl TenantServers {
    /// Tenant servers over their store, checked against `egress`.
    pub fn new(
        store: Arc<dyn CatalogStore>,
        clock: Arc<dyn Clock>,
        egress: EgressAllowlist,
        operator_servers: Vec<String>,
        ceilings: TenantCeilings,
    ) -> Self {
        TenantServers {
            store,
            clock,
            egress,
            operator_servers,
            ceilings,
            consent: false,
            client_documents: false,
        }
    }

    /// The same, taking `oauth2_user` rows: consent is served, and rows
    /// without a registered client too when `client_documents`.
    pub fn with_consent(mut self, client_documents: bool) -> Self {
        self.consent = true;
        self.client_documents = client_documents;
        self
    }

    fn taken(&self, server_id: &str) -> bool {
        self.operator_servers.iter().any(|id| id == server_id)
    }

    /// Validates and writes a tenant's server (insert or replace by id).
    pub async fn put(
        &self,
        tenant_id: &str,
        server_id: &str,
        spec: TenantServerSpec,
    ) -> Result<McpServerRow, TenantServerError> {
        if !valid_tenant_id(tenant_id) {
            return Err(TenantServerError::InvalidTenant);
        }
        if self.taken(server_id) {
            return Err(TenantServerError::Taken);
        }
        let mut problems: Vec<String> = validate_classification(server_id, &spec.required_scopes)
            .iter()
            .map(|violation| format!("{}: {violation}", violation.field()))
            .collect();
        if let Err(failure) = self.egress.check(&spec.endpoint) {
            problems.push(format!("endpoint: {failure}"));
        }
        let auth = spec.auth.unwrap_or(ServerAuthSpec {
            scheme: "none".into(),
            ..ServerAuthSpec::default()
        });
        let fields = AuthFields {
            transport: Transport::Http,
            scheme: &auth.scheme,
            auth_name: auth.name.as_deref(),
            credential_ref: auth.credential_ref.as_deref(),
            token_endpoint: auth.token_endpoint.as_deref(),
        };
        problems.extend(
            validate_auth(fields, &self.egress)
                .iter()
                .map(|violation| format!("auth.{}: {violation}", violation.field())),
        );
        // The exchange hands the caller's own front-door token to its
        // endpoint: only the operator names one.
        if auth.scheme == AuthScheme::Oauth2User.as_str() && auth.token_endpoint.is_some() {
            problems.push(
                "auth.token_endpoint: a tenant's oauth2_user server asks for consent; a token \
                 exchange is the operator's to configure"
                    .into(),
            );
        } else if !self.consent && auth.scheme == AuthScheme::Oauth2User.as_str() {
            problems.push(
                "auth.scheme: oauth2_user needs consent, which this toolgate does not serve \
                 (console.consent_key_ref)"
                    .into(),
            );
        } else if auth.scheme == AuthScheme::Oauth2User.as_str()
            && auth.credential_ref.is_none()
            && !self.client_documents
        {
            problems.push(
                "auth.credential_ref: this toolgate's client metadata document is not served \
                 over https, so an oauth2_user server names its registered client"
                    .into(),
            );
        }
        // A tenant's server may be handed only that tenant's own secrets:
        // never one of toolgate's variables or files, never another
        // tenant's.
        if let Some(reference) = auth.credential_ref.as_deref()
            && !matches!(
                CredentialRef::parse(reference),
                Ok(CredentialRef::Secret { tenant, .. }) if tenant == tenant_id
            )
        {
            problems.push(
                "auth.credential_ref: a tenant server may name only its own tenant's secrets (secret:TENANT/NAME)"
                    .into(),
            );
        }
        // Within the operator's ceilings, as its own servers are: a row
        // never decides what a call or a discovery may hold.
        if spec.timeout_seconds == 0 || spec.timeout_seconds > self.ceilings.timeout_seconds {
            problems.push(format!(
                "timeout_seconds: must be between 1 and {}",
                self.ceilings.timeout_seconds
            ));
        }
        if spec.maximum_output_bytes == 0
            || spec.maximum_output_bytes > self.ceilings.maximum_output_bytes
        {
            problems.push(format!(
                "maximum_output_bytes: must be between 1 and {}",
                self.ceilings.maximum_output_bytes
            ));
        }
        let auth_scheme = match auth.scheme.parse::<AuthScheme>() {
            Ok(scheme) if problems.is_empty() => scheme,
            _ => return Err(TenantServerError::Invalid(problems)),
        };
        let row = McpServerRow {
            server_id: server_id.to_owned(),
            transport: Transport::Http,
            endpoint: spec.endpoint,
            auth_scheme,
            auth_name: auth.name,
            credential_ref: auth.credential_ref,
            token_endpoint: auth.token_endpoint,
            token_scopes: auth.token_scopes,
            side_effect: spec.side_effect,
            risk: spec.risk,
            idempotency: spec.idempotency,
            required_scopes: spec.required_scopes,
            timeout_seconds: spec.timeout_seconds,
            maximum_output_bytes: spec.maximum_output_bytes,
            enabled: spec.enabled,
        };
        self.store
            .put_mcp_server(tenant_id, &row, self.clock.now())
            .await?;
        Ok(row)
    }

    /// A tenant's server.
    pub async fn get(
        &self,
        tenant_id: &str,
        server_id: &str,
    ) -> Result<Option<McpServerRow>, TenantServerError> {
        if !valid_tenant_id(tenant_id) {
            return Err(TenantServerError::InvalidTenant);
        }
        Ok(self.store.mcp_server(tenant_id, server_id).await?)
    }

    /// Removes a tenant's server; false when there was none.
    pub async fn delete(
        &self,
        tenant_id: &str,
        server_id: &str,
    ) -> Result<bool, TenantServerError> {
        if !valid_tenant_id(tenant_id) {
            return Err(TenantServerError::InvalidTenant);
        }
        if self.taken(server_id) {
            return Err(TenantServerError::Taken);
        }
        Ok(self.store.delete_mcp_server(tenant_id, server_id).await?)
    }
}
