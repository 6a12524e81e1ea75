//! The front door's credentials from the configuration and its files.

use std::sync::Arc;

use jsonwebtoken::Algorithm;

use super::{AppError, egress_dialer};
use crate::config::{Config, ConfigErrors, JwtAlgorithm};
use crate::front::{ApiKey, Credentials, JwtSettings, KeySource, TenantSource};

/// The front door's API keys as the front door holds them.
pub(super) fn front_keys(keys: &[crate::config::ApiKeyConfig]) -> Vec<ApiKey> {
    keys.iter()
        .map(|key| ApiKey {
            id: key.id.clone(),
            sha256: key.sha256.clone(),
            tenant_id: key.tenant_id.clone(),
            principal: key.principal.clone(),
            tools: key.tools.clone(),
            origin_trust: key.origin_trust,
        })
        .collect()
}

/// Every API key entry the configuration names: its own and its file's.
pub(super) fn key_entries(
    front: &crate::config::FrontConfig,
) -> Result<Vec<crate::config::ApiKeyConfig>, ConfigErrors> {
    let mut entries = front.api_keys.clone();
    if let Some(file) = &front.api_keys_file {
        entries.extend(crate::config::read_api_keys_file(file)?);
    }
    Ok(entries)
}

/// Every API key the configuration names, as the front door holds them.
pub(super) fn all_front_keys(
    front: &crate::config::FrontConfig,
) -> Result<Vec<ApiKey>, ConfigErrors> {
    Ok(front_keys(&key_entries(front)?))
}

/// The front door's credentials, from `[front]`.
pub(super) fn front_credentials(config: &Config) -> Result<Arc<Credentials>, AppError> {
    let front = &config.front;
    let keys = all_front_keys(front).map_err(AppError::Config)?;
    let jwt = match &front.jwt {
        Some(jwt) => Some(JwtSettings {
            issuer: jwt.issuer.clone(),
            audiences: jwt.audiences.clone(),
            algorithms: jwt.algorithms.iter().copied().map(algorithm).collect(),
            leeway: jwt.leeway_seconds.duration(),
            tenant: match &jwt.tenant_id {
                Some(tenant) => TenantSource::Fixed(tenant.clone()),
                None => TenantSource::Claim(jwt.tenant_claim.clone()),
            },
            principal_claim: jwt.principal_claim.clone(),
            scopes_claim: jwt.scopes_claim.clone(),
            tools: jwt.tools.clone(),
            origin_trust: jwt.origin_trust,
            origin_trust_claim: jwt
                .origin_trust_claim
                .clone()
                .map(|claim| (claim, jwt.maximum_origin_trust)),
            keys: match (&jwt.jwks_file, &jwt.jwks_url) {
                (Some(file), _) => KeySource::File(file.clone()),
                (None, Some(url)) => KeySource::Url {
                    url: url.clone(),
                    refresh: jwt.jwks_refresh_seconds.duration(),
                },
                (None, None) => return Err(AppError::NoKeySet),
            },
        }),
        None => None,
    };
    let dialer: Arc<dyn crate::ports::EgressDialer> = Arc::new(egress_dialer(config)?);
    Ok(Arc::new(Credentials::new(keys, jwt, dialer)?))
}

/// The library's name for an algorithm the file names.
fn algorithm(algorithm: JwtAlgorithm) -> Algorithm {
    match algorithm {
        JwtAlgorithm::Rs256 => Algorithm::RS256,
        JwtAlgorithm::Rs384 => Algorithm::RS384,
        JwtAlgorithm::Rs512 => Algorithm::RS512,
        JwtAlgorithm::Ps256 => Algorithm::PS256,
        JwtAlgorithm::Ps384 => Algorithm::PS384,
        JwtAlgorithm::Ps512 => Algorithm::PS512,
        JwtAlgorithm::Es256 => Algorithm::ES256,
        JwtAlgorithm::Es384 => Algorithm::ES384,
        JwtAlgorithm::EdDsa => Algorithm::EdDSA,
    }
}
